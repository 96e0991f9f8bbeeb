# shellcheck shell=bash
# The one place that touches cgroups: detection (v2, hybrid, v1), one leaf
# cgroup per job, limits, moving processes, clean-up, and the systemd-run
# command line where systemd owns the tree. Settings are semantic
# (cpu_weight, cpu_max, mem_high, mem_max, io_max, pids_max) and mapped to
# each hierarchy's files here.
#
# Globals set: CG_MODE (v2|v1|none), CG_ROOT, CG_PARENT (v2 parent path),
# CG_WHY (why none), CG_LEAF (v2 leaf path), CG_V1 (assoc: controller ->
# leaf path), CG_APPLIED and CG_MISSING (arrays of "what" lines for the
# report), CG_NAME (leaf name).

CG_PREFIX=gpuguard-lowprio

# Detects the cgroup layout.
# Globals:
#   LOWPRIO_CGROUP_ROOT (default /sys/fs/cgroup), LOWPRIO_CGROUP_MODE
#   (auto|v2|v1|none), LOWPRIO_CGROUP_PARENT (v2 parent below the root)
cg_detect() {
  CG_ROOT=${LOWPRIO_CGROUP_ROOT:-/sys/fs/cgroup}
  CG_PARENT=$CG_ROOT${LOWPRIO_CGROUP_PARENT:+/${LOWPRIO_CGROUP_PARENT#/}}
  CG_MODE=${LOWPRIO_CGROUP_MODE:-auto}
  CG_WHY=''
  declare -gA CG_V1=()
  declare -ga CG_APPLIED=() CG_MISSING=()
  [[ $CG_MODE != auto ]] && return 0
  local fstype unified=''
  fstype=$(stat -fc %T "$CG_ROOT" 2>/dev/null || true)
  if [[ $fstype == cgroup2fs || ($fstype != tmpfs && -f $CG_ROOT/cgroup.controllers) ]]; then
    CG_MODE=v2
  else
    [[ -f $CG_ROOT/unified/cgroup.controllers ]] && unified=$(<"$CG_ROOT/unified/cgroup.controllers")
    if [[ " $unified " == *" cpu "* ]]; then
      CG_MODE=v2 CG_ROOT=$CG_ROOT/unified
      CG_PARENT=$CG_ROOT${LOWPRIO_CGROUP_PARENT:+/${LOWPRIO_CGROUP_PARENT#/}}
    elif [[ -f $CG_ROOT/cpu/cpu.shares ]]; then
      CG_MODE=v1 # hybrid: the v2 mount has no cpu controller (ENOENT on +cpu)
    else
      CG_MODE=none CG_WHY="no cgroup cpu controller under $CG_ROOT"
    fi
  fi
}

# Names the errno in a shell write error ("Device or resource busy" ->
# EBUSY) so fallbacks can say why.
cg_errno_name() {
  case $1 in
    *'Device or resource busy'*) printf 'EBUSY (the parent has processes of its own)' ;;
    *'Read-only file system'*) printf 'EROFS (cgroupfs mounted read-only, as in containers)' ;;
    *'No such file or directory'*) printf 'ENOENT (controller not available here)' ;;
    *'Permission denied'* | *'Operation not permitted'*) printf 'EACCES (needs root or a delegated cgroup)' ;;
    *'Invalid argument'*) printf 'EINVAL' ;;
    *) printf '%s' "${1##*: }" ;;
  esac
}

# Writes a value to a cgroup file; on failure records why and returns 1.
cg_write() {
  local file=$1 value=$2 err
  if err=$({ printf '%s\n' "$value" >"$file"; } 2>&1); then
    return 0
  fi
  CG_LAST_ERROR=$(cg_errno_name "$err")
  return 1
}

# Lists the controllers available to children of the v2 parent.
cg_v2_controllers() {
  local list=''
  [[ -r $CG_PARENT/cgroup.controllers ]] && list=$(<"$CG_PARENT/cgroup.controllers")
  printf '%s\n' "$list"
}

# Creates the job's leaf cgroup. Returns 1 with CG_LAST_ERROR set when it
# cannot (the caller falls back to a weaker mechanism).
# Arguments:
#   $1 leaf name
cg_create() {
  CG_NAME=$1
  CG_LAST_ERROR=''
  case $CG_MODE in
    v2) cg_create_v2 ;;
    v1) cg_create_v1 ;;
    *) CG_LAST_ERROR=$CG_WHY && return 1 ;;
  esac
}

cg_create_v2() {
  local have want='' c
  have=" $(cg_v2_controllers) "
  for c in cpu memory io pids; do
    [[ $have == *" $c "* ]] && want+=" +$c"
  done
  if [[ $want != *+cpu* ]]; then
    CG_LAST_ERROR="ENOENT (no cpu controller in $CG_PARENT/cgroup.controllers)"
    return 1
  fi
  local enabled=''
  [[ -r $CG_PARENT/cgroup.subtree_control ]] && enabled=" $(<"$CG_PARENT/cgroup.subtree_control") "
  local missing=''
  for c in $want; do
    [[ $enabled == *" ${c#+} "* ]] || missing+=" $c"
  done
  if [[ -n $missing ]] && ! cg_write "$CG_PARENT/cgroup.subtree_control" "${missing# }"; then
    return 1
  fi
  CG_LEAF=$CG_PARENT/$CG_NAME
  local err
  if ! err=$(mkdir -- "$CG_LEAF" 2>&1); then
    CG_LAST_ERROR=$(cg_errno_name "$err")
    return 1
  fi
}

cg_create_v1() {
  local c err made=0
  for c in cpu memory pids blkio; do
    [[ -d $CG_ROOT/$c && -w $CG_ROOT/$c ]] || continue
    if err=$(mkdir -- "$CG_ROOT/$c/$CG_NAME" 2>&1); then
      CG_V1[$c]=$CG_ROOT/$c/$CG_NAME
      made=1
    else
      CG_MISSING+=("v1 $c hierarchy: $(cg_errno_name "$err")")
    fi
  done
  if [[ -z ${CG_V1[cpu]:-} ]]; then
    CG_LAST_ERROR="cannot create $CG_ROOT/cpu/$CG_NAME"
    ((made)) && cg_remove
    return 1
  fi
}

# Applies one setting to the leaf; records what is and is not in force.
# Arguments:
#   $1 setting: cpu_weight (1-10000 or idle), cpu_max (millicores),
#      mem_high, mem_max (bytes), io_max ("MAJ:MIN rbps=N wbps=N"),
#      pids_max (N); $2 value
cg_set() {
  local what=$1 value=$2
  case $CG_MODE in
    v2) cg_set_v2 "$what" "$value" ;;
    v1) cg_set_v1 "$what" "$value" ;;
  esac
}

# Records a write's outcome for the report.
cg_record() {
  local label=$1 file=$2 value=$3
  if [[ -e $file || $CG_MODE == v2 ]] && cg_write "$file" "$value"; then
    CG_APPLIED+=("$label (${file##*/}=$value)")
  else
    CG_MISSING+=("$label: ${file##*/} ${CG_LAST_ERROR:-not available}")
  fi
}

cg_set_v2() {
  local what=$1 value=$2 leaf=$CG_LEAF
  case $what in
    cpu_weight)
      if [[ $value == idle ]]; then
        cg_record "CPU idle class" "$leaf/cpu.idle" 1
      else
        cg_record "CPU weight $value" "$leaf/cpu.weight" "$value"
      fi
      ;;
    cpu_max) cg_record "CPU cap $(cg_cores "$value") CPUs" "$leaf/cpu.max" "$((value * 100)) 100000" ;;
    mem_high) cg_record "memory high $value bytes" "$leaf/memory.high" "$value" ;;
    mem_max)
      cg_record "memory max $value bytes" "$leaf/memory.max" "$value"
      cg_record "no swap beyond it" "$leaf/memory.swap.max" 0
      cg_record "OOM kills the whole job" "$leaf/memory.oom.group" 1
      ;;
    io_max) cg_record "I/O limit $value" "$leaf/io.max" "$value" ;;
    pids_max) cg_record "at most $value tasks" "$leaf/pids.max" "$value" ;;
  esac
}

cg_set_v1() {
  local what=$1 value=$2
  local cpu=${CG_V1[cpu]:-} mem=${CG_V1[memory]:-} pids=${CG_V1[pids]:-} blk=${CG_V1[blkio]:-}
  case $what in
    cpu_weight)
      if [[ $value == idle ]]; then
        if [[ -e $cpu/cpu.idle ]]; then
          cg_record "CPU idle class" "$cpu/cpu.idle" 1
        else
          cg_record "CPU shares minimum" "$cpu/cpu.shares" 2
        fi
      else
        local shares=$((value * 1024 / 100))
        ((shares < 2)) && shares=2
        cg_record "CPU weight $value" "$cpu/cpu.shares" "$shares"
      fi
      ;;
    cpu_max)
      cg_record "CPU period" "$cpu/cpu.cfs_period_us" 100000
      cg_record "CPU cap $(cg_cores "$value") CPUs" "$cpu/cpu.cfs_quota_us" "$((value * 100))"
      ;;
    mem_high)
      if [[ -n $mem ]]; then
        cg_record "memory soft limit $value bytes (v1 has no memory.high)" "$mem/memory.soft_limit_in_bytes" "$value"
      else
        CG_MISSING+=("memory high: no v1 memory hierarchy")
      fi
      ;;
    mem_max)
      if [[ -n $mem ]]; then
        cg_record "memory max $value bytes" "$mem/memory.limit_in_bytes" "$value"
      else
        CG_MISSING+=("memory max: no v1 memory hierarchy")
      fi
      ;;
    io_max)
      if [[ -z $blk ]]; then
        CG_MISSING+=("I/O limit: no v1 blkio hierarchy")
        return 0
      fi
      local dev=${value%% *} kv
      for kv in ${value#* }; do
        case $kv in
          rbps=*) cg_record "read limit ${kv#*=} B/s" "$blk/blkio.throttle.read_bps_device" "$dev ${kv#*=}" ;;
          wbps=*) cg_record "write limit ${kv#*=} B/s (v1: direct I/O only, no writeback)" "$blk/blkio.throttle.write_bps_device" "$dev ${kv#*=}" ;;
        esac
      done
      ;;
    pids_max)
      if [[ -n $pids ]]; then
        cg_record "at most $value tasks" "$pids/pids.max" "$value"
      else
        CG_MISSING+=("task limit: no v1 pids hierarchy")
      fi
      ;;
  esac
}

# Prints millicores as CPUs ("1500" -> "1.5").
cg_cores() {
  printf '%d.%d' "$(($1 / 1000))" "$((($1 % 1000) / 100))"
}

# Moves a process (all its threads) into the leaf.
cg_enter() {
  local pid=$1 c
  case $CG_MODE in
    v2) cg_write "$CG_LEAF/cgroup.procs" "$pid" ;;
    v1)
      for c in "${!CG_V1[@]}"; do
        cg_write "${CG_V1[$c]}/cgroup.procs" "$pid" || return 1
      done
      ;;
  esac
}

# True while any live process remains in the leaf (cgroup.events when the
# kernel provides it, else the PIDs listed in cgroup.procs).
cg_populated() {
  local f pid
  local -a files=()
  case $CG_MODE in
    v2)
      if [[ -r $CG_LEAF/cgroup.events ]]; then
        grep -q '^populated 1' "$CG_LEAF/cgroup.events"
        return
      fi
      files=("$CG_LEAF/cgroup.procs")
      ;;
    v1) for f in "${CG_V1[@]}"; do files+=("$f/cgroup.procs"); done ;;
  esac
  for f in "${files[@]}"; do
    [[ -r $f ]] || continue
    while read -r pid; do
      [[ -n $pid && -d /proc/$pid ]] && return 0
    done <"$f"
  done
  return 1
}

# Kills what the job left behind in its cgroup, waits until it is empty and
# removes it. v2: cgroup.kill (race-free against forks) where the kernel has
# it; otherwise SIGKILL each listed process.
cg_remove() {
  local tries=0 pid leaf rc=0
  local -a leaves=()
  case $CG_MODE in
    v2) [[ -n ${CG_LEAF:-} && -d $CG_LEAF ]] && leaves=("$CG_LEAF") ;;
    v1) for leaf in "${CG_V1[@]}"; do [[ -d $leaf ]] && leaves+=("$leaf"); done ;;
  esac
  ((${#leaves[@]})) || return 0
  if cg_populated; then
    if [[ $CG_MODE == v2 && -e $CG_LEAF/cgroup.kill ]]; then
      cg_write "$CG_LEAF/cgroup.kill" 1 || true
    else
      for leaf in "${leaves[@]}"; do
        while read -r pid; do kill -KILL "$pid" 2>/dev/null; done <"$leaf/cgroup.procs"
      done
    fi
  fi
  while cg_populated && ((tries < 50)); do
    sleep 0.1
    tries=$((tries + 1))
  done
  for leaf in "${leaves[@]}"; do
    rmdir -- "$leaf" 2>/dev/null || rc=1
  done
  return "$rc"
}

# Removes leaves of earlier runs whose owner is gone and that are empty.
cg_clean_stale() {
  local dir owner
  local -a dirs=()
  case $CG_MODE in
    v2) dirs=("$CG_PARENT/$CG_PREFIX"-*) ;;
    v1) dirs=("$CG_ROOT"/*/"$CG_PREFIX"-*) ;;
  esac
  for dir in "${dirs[@]}"; do
    [[ -d $dir ]] || continue
    owner=${dir##*-}
    [[ $owner =~ ^[0-9]+$ ]] || continue
    [[ -d /proc/$owner ]] && continue
    [[ -s $dir/cgroup.procs ]] && continue
    rmdir -- "$dir" 2>/dev/null && gg_log info "removed stale cgroup $dir"
  done
  return 0
}

# True when systemd is PID 1 (it then owns the cgroup tree).
cg_systemd_running() {
  [[ ${LOWPRIO_SYSTEMD:-auto} == 1 ]] && return 0
  [[ ${LOWPRIO_SYSTEMD:-auto} == 0 ]] && return 1
  gg_systemd_is_init && command -v systemd-run >/dev/null
}

# Builds the systemd-run --scope prefix into the array named $1 from the
# settings in the associative array named $2.
cg_systemd_command_into() {
  local -n cmd_ref=$1
  local -n set_ref=$2
  cmd_ref=(systemd-run --scope --quiet --collect --unit "$CG_NAME")
  local w=${set_ref[cpu_weight]:-}
  [[ -n $w ]] && cmd_ref+=(-p "CPUWeight=$w")
  [[ -n ${set_ref[cpu_max]:-} ]] && cmd_ref+=(-p "CPUQuota=$((set_ref[cpu_max] / 10))%")
  [[ -n ${set_ref[mem_high]:-} ]] && cmd_ref+=(-p "MemoryHigh=${set_ref[mem_high]}")
  if [[ -n ${set_ref[mem_max]:-} ]]; then
    cmd_ref+=(-p "MemoryMax=${set_ref[mem_max]}" -p MemorySwapMax=0)
  fi
  [[ -n ${set_ref[pids_max]:-} ]] && cmd_ref+=(-p "TasksMax=${set_ref[pids_max]}")
  if [[ -n ${set_ref[io_max]:-} ]]; then
    local dev=/dev/block/${set_ref[io_max]%% *} kv
    for kv in ${set_ref[io_max]#* }; do
      case $kv in
        rbps=*) cmd_ref+=(-p "IOReadBandwidthMax=$dev ${kv#*=}") ;;
        wbps=*) cmd_ref+=(-p "IOWriteBandwidthMax=$dev ${kv#*=}") ;;
      esac
    done
  fi
  cmd_ref+=(--)
}

# Describes the cgroup setup of this host, one fact per line (--explain).
cg_describe() {
  printf 'cgroup root: %s (%s)\n' "$CG_ROOT" "$(stat -fc %T "$CG_ROOT" 2>/dev/null || echo '?')"
  printf 'cgroup mode: %s%s\n' "$CG_MODE" "${CG_WHY:+ ($CG_WHY)}"
  case $CG_MODE in
    v2)
      printf 'v2 parent: %s\n' "$CG_PARENT"
      printf 'controllers available: %s\n' "$(cg_v2_controllers)"
      printf 'controllers enabled for children: %s\n' "$(cat "$CG_PARENT/cgroup.subtree_control" 2>/dev/null)"
      printf 'parent writable: %s\n' "$([[ -w $CG_PARENT ]] && echo yes || echo no)"
      ;;
    v1)
      local c
      for c in cpu memory pids blkio; do
        printf 'v1 %s hierarchy: %s\n' "$c" "$([[ -w $CG_ROOT/$c ]] && echo writable || echo 'not writable or absent')"
      done
      ;;
  esac
  printf 'this process: %s\n' "$(tr '\n' ' ' </proc/self/cgroup)"
}
