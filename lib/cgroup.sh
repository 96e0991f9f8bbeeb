# shellcheck shell=bash
# The one place that touches cgroups: detection (v2, hybrid, v1), one leaf
# cgroup per job, limits, moving processes, clean-up, and the systemd-run
# command line where systemd owns the tree. Settings are semantic
# (cpu_weight, cpu_max, mem_high, mem_max, io_max, pids_max) and mapped to
# each hierarchy's files here.
#
# Globals set: CG_MODE (v2|v1|none), CG_ROOT, CG_PARENT (v2 parent path:
# the caller's cgroup, or the highest one above it that leaves no limit),
# CG_CLIMB and CG_PLACEMENT (why there),
# CG_WHY (why none), CG_LEAF (v2 leaf path), CG_V1 (assoc: controller ->
# leaf path), CG_APPLIED and CG_MISSING (arrays of "what" lines for the
# report), CG_NAME (leaf name).

CG_PREFIX=gpuguard-lowprio
# Where the processes of a non-root v2 cgroup go so that the cgroup may have
# limited children (the "no internal processes" rule); they stay inside it.
CG_CALLER_LEAF=gpuguard-caller

# Detects the cgroup layout and the cgroup that the job's leaf belongs in:
# the caller's own (or, for --attach, the target's), so that the limits of a
# container or user slice around the caller still hold for the job.
# Globals:
#   LOWPRIO_CGROUP_ROOT (default /sys/fs/cgroup), LOWPRIO_CGROUP_MODE
#   (auto|v2|v1|none), LOWPRIO_CGROUP_PARENT (parent below the root, instead
#   of the caller's cgroup), LOWPRIO_PROC_CGROUP (the /proc/PID/cgroup to
#   read; default the home PID's)
# Arguments:
#   $1 home PID whose cgroup holds the leaf (default: this process)
cg_detect() {
  CG_ROOT=${LOWPRIO_CGROUP_ROOT:-/sys/fs/cgroup}
  CG_MODE=${LOWPRIO_CGROUP_MODE:-auto}
  CG_HOME_PID=${1:-$BASHPID}
  CG_WHY='' CG_PLACEMENT='' CG_LEAF='' CG_MOVED=0
  declare -gA CG_V1=()
  declare -ga CG_APPLIED=() CG_MISSING=()
  if [[ $CG_MODE == auto ]]; then
    local fstype unified=''
    fstype=$(stat -fc %T "$CG_ROOT" 2>/dev/null || true)
    if [[ $fstype == cgroup2fs || ($fstype != tmpfs && -f $CG_ROOT/cgroup.controllers) ]]; then
      CG_MODE=v2
    else
      [[ -f $CG_ROOT/unified/cgroup.controllers ]] && unified=$(<"$CG_ROOT/unified/cgroup.controllers")
      if [[ " $unified " == *" cpu "* ]]; then
        CG_MODE=v2 CG_ROOT=$CG_ROOT/unified
      elif [[ -f $CG_ROOT/cpu/cpu.shares ]]; then
        CG_MODE=v1 # hybrid: the v2 mount has no cpu controller (ENOENT on +cpu)
      else
        CG_MODE=none CG_WHY="no cgroup cpu controller under $CG_ROOT"
      fi
    fi
  fi
  cg_home_into CG_PARENT "" v2
}

# Puts into the variable named $1 the folder of the home PID's cgroup in a
# hierarchy: v2 (the "0::" line) or a v1 controller mounted at $2 (empty:
# the v2 root). LOWPRIO_CGROUP_PARENT, when set, replaces the path.
cg_home_into() {
  local -n home_ref=$1
  local _mount=$2 _want=$3 _line _id _list _path='' _file
  _file=${LOWPRIO_PROC_CGROUP:-/proc/$CG_HOME_PID/cgroup}
  if [[ -n ${LOWPRIO_CGROUP_PARENT:-} ]]; then
    _path=/${LOWPRIO_CGROUP_PARENT#/}
  elif [[ -r $_file ]]; then
    while IFS=: read -r _id _list _line; do
      if [[ $_want == v2 && $_id == 0 && -z $_list ]] ||
        [[ $_want != v2 && ,$_list, == *",$_want,"* ]]; then
        _path=$_line
        break
      fi
    done <"$_file"
  fi
  _path=${_path%/}
  # Processes this script moved aside earlier: their home is the parent.
  [[ ${_path##*/} == "$CG_CALLER_LEAF" ]] && _path=${_path%/*}
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  home_ref=${_mount:-$CG_ROOT}$_path
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
# cgroup.procs takes one PID per write and is appended to (the kernel
# ignores the offset; a test's fake tree keeps every PID written).
cg_write() {
  local file=$1 value=$2 err
  if [[ $file == */cgroup.procs ]]; then
    if err=$({ printf '%s\n' "$value" >>"$file"; } 2>&1); then
      return 0
    fi
  elif err=$({ printf '%s\n' "$value" >"$file"; } 2>&1); then
    return 0
  fi
  CG_LAST_ERROR=$(cg_errno_name "$err")
  # cgroupfs refuses to create a file it does not offer with EACCES, even
  # to root: say what is missing, not that rights are
  if [[ ! -e $file && -d ${file%/*} ]]; then
    CG_LAST_ERROR="not offered by this kernel (no ${file##*/} in ${file%/*})"
  fi
  return 1
}

# Writes one io.max line ("MAJ:MIN wbps=N rbps=N", or "=max" to lift it)
# to the v2 leaf $1 without a fork: lib/iogov.sh's governor calls it from
# its loop. Returns 1, silently, when the kernel refuses or the leaf is gone
# (the governor then sees the leaf gone and stops).
cg_io_max_write() {
  { printf '%s\n' "$2" >"$1/io.max"; } 2>/dev/null
}

# Freezes ($2 = 1) or thaws ($2 = 0) the cgroup $1: the adaptive cap's
# pacing of the job's writes (lib/iogov.sh), up to a hundred times a
# second, so without a fork. The kernel stops the cgroup's tasks where a
# signal would stop them (never inside a file system's lock), and a frozen
# task still dies of SIGKILL.
cg_freeze_write() {
  { printf '%s\n' "$2" >"$1/cgroup.freeze"; } 2>/dev/null
}

# Opens the thaw guard for the cgroup $1 and puts its fd into the variable
# named $2: a small sh beside the caller that waits for end of file on that
# fd and then thaws the cgroup. Only the caller holds the fd, so however
# the caller ends, SIGKILL included, the job it paces is never left frozen.
# The guard is sh, not a bash named after a gpuguard command, and the
# cgroup's path (gpuguard-lowprio-PID) reaches it in its environment, not
# its command line, so that a `pkill -f lowprio` takes the governor and
# leaves the guard to thaw; it ignores the terminal's keys, as the governor
# does.
cg_freeze_guard_open() {
  local -n _fg_fd=$2
  # shellcheck disable=SC2016 # $GG_THAW belongs to the guard's sh
  exec {_fg_fd}> >(GG_THAW=$1/cgroup.freeze exec sh -c \
    'trap "" INT QUIT HUP TSTP; read -r _; printf "0\n" >"$GG_THAW"' >/dev/null 2>&1)
}

# The same under systemd, which owns the job's scope there: one
# `systemctl set-property --runtime` (the user's manager for a non-root
# caller) on the scope $1 for disk $2 with the fields $3 ("wbps=N rbps=N";
# a field left out, or "max", lifts that limit). It forks: the governor
# calls it only when the cap goes on or off, not at every look.
cg_systemd_io_max_set() {
  local unit=$1 dev=/dev/block/$2 kv w=infinity r=infinity
  local -a mgr=()
  ((EUID == 0)) || mgr=(--user)
  for kv in $3; do
    case $kv in
      wbps=*) w=${kv#*=} ;;
      rbps=*) r=${kv#*=} ;;
    esac
  done
  timeout 10 systemctl "${mgr[@]}" set-property --runtime "$unit" \
    "IOWriteBandwidthMax=$dev $w" "IOReadBandwidthMax=$dev $r" >/dev/null 2>&1
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

# True when a v2 cgroup folder is the root of the whole hierarchy (only
# non-root cgroups have cgroup.type), which may hold processes and limited
# children at once. Inside a cgroup namespace "/" is usually not the root.
cg_v2_is_root() {
  [[ ! -e $1/cgroup.type ]]
}

# Prints the first limit a v2 cgroup folder sets on its subtree (memory,
# CPU cap, weight or idle class, pids, I/O, cpuset), or nothing. Interface
# files that are absent mean that controller is not enabled there.
cg_v2_limit_of() {
  local dir=$1 f v
  for f in memory.max memory.high memory.swap.max pids.max; do
    [[ -r $dir/$f ]] || continue
    v=$(<"$dir/$f")
    [[ $v == max ]] || {
      printf '%s=%s' "$f" "$v"
      return
    }
  done
  if [[ -r $dir/cpu.max ]]; then
    v=$(<"$dir/cpu.max")
    [[ $v == max* ]] || {
      printf 'cpu.max=%s' "${v%% *}"
      return
    }
  fi
  for f in cpu.weight:100 cpu.idle:0; do
    [[ -r $dir/${f%:*} ]] || continue
    v=$(<"$dir/${f%:*}")
    [[ $v == "${f#*:}" ]] || {
      printf '%s=%s' "${f%:*}" "$v"
      return
    }
  done
  for f in io.max cpuset.cpus cpuset.mems; do
    [[ -r $dir/$f ]] || continue
    v=$(<"$dir/$f")
    [[ -z $v ]] || {
      printf '%s=%s' "$f" "${v%%$'\n'*}"
      return
    }
  done
}

# Moves CG_PARENT from the caller's cgroup up to the highest ancestor the
# leaf can go under without leaving any cgroup that sets a limit: the job
# stays inside every limit around the caller, and its low priority counts
# against as many other cgroups (services) as possible (weights and the idle
# class only order siblings). Stops at the first cgroup with a limit, at a
# parent not writable, and at the root (of the namespace). Sets CG_CLIMB.
cg_v2_climb() {
  local dir=$CG_PARENT limit parent
  CG_CLIMB=''
  [[ -n ${LOWPRIO_CGROUP_PARENT:-} || ${LOWPRIO_CGROUP_CLIMB:-1} == 0 ]] && return 0
  while [[ $dir != "$CG_ROOT" ]]; do
    limit=$(cg_v2_limit_of "$dir")
    if [[ -n $limit ]]; then
      CG_CLIMB="${dir#"$CG_ROOT"} sets $limit"
      break
    fi
    parent=${dir%/*}
    if [[ ! -w $parent ]]; then
      CG_CLIMB="${parent#"$CG_ROOT"} is not writable"
      break
    fi
    dir=$parent
  done
  [[ $dir == "$CG_PARENT" ]] && return 0
  CG_CLIMB="${CG_CLIMB:-no cgroup above it sets a limit}; the caller's cgroup is ${CG_PARENT#"$CG_ROOT"}"
  CG_PARENT=$dir
}

# Lists the PIDs in a cgroup folder's cgroup.procs into the array named $2.
cg_procs_into() {
  local -n procs_ref=$2
  procs_ref=()
  [[ -r $1/cgroup.procs ]] || return 0
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  mapfile -t procs_ref <"$1/cgroup.procs"
}

# Moves every process of the non-root cgroup $CG_PARENT into its child
# $CG_CALLER_LEAF, so that the cgroup may enable controllers for children
# (the kernel refuses while it holds processes of its own: EBUSY). They stay
# inside it: its limits, accounting and kill still cover them. On a failure
# the ones moved go back. LOWPRIO_CGROUP_MOVE_CALLER=0 forbids this.
cg_v2_move_caller_aside() {
  local aside=$CG_PARENT/$CG_CALLER_LEAF pid err
  local -a procs moved=()
  cg_procs_into "$CG_PARENT" procs
  ((${#procs[@]})) || return 0
  if [[ ${LOWPRIO_CGROUP_MOVE_CALLER:-1} == 0 ]]; then
    CG_LAST_ERROR="EBUSY: $CG_PARENT holds ${#procs[@]} processes of its own and LOWPRIO_CGROUP_MOVE_CALLER=0 forbids moving them into $CG_CALLER_LEAF"
    return 1
  fi
  if [[ ! -d $aside ]] && ! err=$(mkdir -- "$aside" 2>&1); then
    CG_LAST_ERROR="cannot create $aside: $(cg_errno_name "$err")"
    return 1
  fi
  for pid in "${procs[@]}"; do
    if cg_write "$aside/cgroup.procs" "$pid"; then
      moved+=("$pid")
    elif [[ -d /proc/$pid ]]; then
      CG_LAST_ERROR="cannot move PID $pid of $CG_PARENT into $CG_CALLER_LEAF: $CG_LAST_ERROR"
      local back
      for back in "${moved[@]}"; do
        cg_write "$CG_PARENT/cgroup.procs" "$back" || true
      done
      rmdir -- "$aside" 2>/dev/null || true
      return 1
    fi
  done
  CG_MOVED=${#moved[@]}
}

cg_create_v2() {
  local have want='' c
  cg_v2_climb
  if [[ ! -d $CG_PARENT ]]; then
    CG_LAST_ERROR="the home cgroup $CG_PARENT is not visible here"
    return 1
  fi
  have=" $(cg_v2_controllers) "
  for c in cpu memory io pids; do
    [[ $have == *" $c "* ]] && want+=" +$c"
  done
  if [[ $want != *+cpu* ]]; then
    CG_LAST_ERROR="ENOENT (no cpu controller in $CG_PARENT/cgroup.controllers)"
    return 1
  fi
  if [[ ! -w $CG_PARENT ]]; then
    CG_LAST_ERROR="EACCES: the caller's cgroup ${CG_PARENT#"$CG_ROOT"} is not writable by $(id -un) (not delegated); a leaf elsewhere would escape its limits"
    return 1
  fi
  local enabled=''
  [[ -r $CG_PARENT/cgroup.subtree_control ]] && enabled=" $(<"$CG_PARENT/cgroup.subtree_control") "
  local missing=''
  for c in $want; do
    [[ $enabled == *" ${c#+} "* ]] || missing+=" $c"
  done
  if [[ -n $missing ]]; then
    if ! cg_v2_is_root "$CG_PARENT"; then
      cg_v2_move_caller_aside || return 1
    fi
    cg_write "$CG_PARENT/cgroup.subtree_control" "${missing# }" || return 1
  fi
  CG_LEAF=$CG_PARENT/$CG_NAME
  local err
  if ! err=$(mkdir -- "$CG_LEAF" 2>&1); then
    CG_LAST_ERROR=$(cg_errno_name "$err")
    return 1
  fi
  local where=${CG_PARENT#"$CG_ROOT"}
  if [[ -n $CG_CLIMB ]]; then
    CG_PLACEMENT="leaf ${where:-}/$CG_NAME under ${where:-/}, the highest cgroup around the caller's that leaves no limit ($CG_CLIMB)"
  else
    CG_PLACEMENT="leaf ${where:-}/$CG_NAME under the caller's cgroup ${where:-/}"
  fi
  if cg_v2_is_root "$CG_PARENT"; then
    CG_PLACEMENT+=" (the root)"
  fi
  if ((CG_MOVED)); then
    CG_PLACEMENT+="; moved its $CG_MOVED processes into ${where:-}/$CG_CALLER_LEAF (a cgroup with processes of its own cannot have limited children), so its limits hold for them and the job"
  fi
}

# Describes, changing nothing, where the job's leaf would go and why
# (--explain, --dry-run).
cg_placement_plan() {
  local where c parent climbed=''
  local -a procs
  case $CG_MODE in
    v2)
      cg_v2_climb
      where=${CG_PARENT#"$CG_ROOT"}
      [[ -n $CG_CLIMB ]] && climbed=" (up from the caller's: $CG_CLIMB)"
      if [[ ! -d $CG_PARENT ]]; then
        printf 'none: the home cgroup %s is not visible here\n' "${where:-/}"
      elif [[ ! -w $CG_PARENT ]]; then
        printf "none: the caller's cgroup %s is not writable by %s (not delegated); a leaf elsewhere would escape its limits\n" "${where:-/}" "$(id -un)"
      elif cg_v2_is_root "$CG_PARENT"; then
        printf "a leaf under the root%s\n" "$climbed"
      else
        cg_procs_into "$CG_PARENT" procs
        if ((${#procs[@]} == 0)) || [[ " $(cat "$CG_PARENT/cgroup.subtree_control" 2>/dev/null) " == *" cpu "* ]]; then
          printf "a leaf under the caller's cgroup %s%s\n" "$where" "$climbed"
        elif [[ ${LOWPRIO_CGROUP_MOVE_CALLER:-1} == 0 ]]; then
          printf 'none: %s holds %d processes of its own (no internal processes rule) and LOWPRIO_CGROUP_MOVE_CALLER=0\n' "$where" "${#procs[@]}"
        else
          printf "a leaf under the caller's cgroup %s, after moving its %d processes into %s/%s (a cgroup with processes of its own cannot have limited children); they stay inside it\n" \
            "$where" "${#procs[@]}" "$where" "$CG_CALLER_LEAF"
        fi
      fi
      ;;
    v1)
      printf "leaves under the caller's v1 cgroups:"
      for c in cpu memory pids blkio; do
        [[ -d $CG_ROOT/$c ]] || continue
        cg_home_into parent "$CG_ROOT/$c" "$c"
        local shown=${parent#"$CG_ROOT/$c"}
        printf ' %s:%s%s' "$c" "${shown:-/}" "$([[ -w $parent ]] || echo ' (not writable)')"
      done
      printf '\n'
      ;;
    *) printf 'none: %s\n' "${CG_WHY:-no cgroup}" ;;
  esac
}

# True when a run could create its leaf, foreseen without creating it
# (--explain, --dry-run): the caller's cgroup is writable (for v1 its cpu
# one, which cg_create_v1 cannot do without). Sets CG_LAST_ERROR when not.
cg_creatable() {
  local parent what where
  CG_LAST_ERROR=''
  case $CG_MODE in
    v2) parent=$CG_PARENT what=cgroup where=${CG_PARENT#"$CG_ROOT"} ;;
    v1)
      cg_home_into parent "$CG_ROOT/cpu" cpu
      what="v1 cpu cgroup" where=${parent#"$CG_ROOT/cpu"}
      ;;
    *)
      CG_LAST_ERROR=$CG_WHY
      return 1
      ;;
  esac
  [[ -d $parent && -w $parent ]] && return 0
  CG_LAST_ERROR="the caller's $what ${where:-/} is not writable by $(id -un)"
  return 1
}

cg_create_v1() {
  local c err made=0 parent
  for c in cpu memory pids blkio; do
    [[ -d $CG_ROOT/$c ]] || continue
    cg_home_into parent "$CG_ROOT/$c" "$c"
    if [[ ! -w $parent ]]; then
      CG_MISSING+=("v1 $c hierarchy: ${parent#"$CG_ROOT"} not writable")
      continue
    fi
    if err=$(mkdir -- "$parent/$CG_NAME" 2>&1); then
      CG_V1[$c]=$parent/$CG_NAME
      made=1
    else
      CG_MISSING+=("v1 $c hierarchy: $(cg_errno_name "$err")")
    fi
  done
  # Hybrid: a leaf in the controller-less v2 mount too, for CPU time and
  # pressure stall (creating one needs no controller, so no rule applies).
  if [[ -n ${CG_V1[cpu]:-} && -f $CG_ROOT/unified/cgroup.procs ]]; then
    cg_home_into parent "$CG_ROOT/unified" v2
    if [[ -w $parent ]] && mkdir -- "$parent/$CG_NAME" 2>/dev/null; then
      CG_V1[unified]=$parent/$CG_NAME
    fi
  fi
  if [[ -z ${CG_V1[cpu]:-} ]]; then
    CG_LAST_ERROR="cannot create a leaf in the caller's v1 cpu cgroup"
    ((made)) && cg_remove
    return 1
  fi
  CG_PLACEMENT="v1 leaves under the caller's cgroups:"
  for c in "${!CG_V1[@]}"; do
    CG_PLACEMENT+=" ${CG_V1[$c]#"$CG_ROOT/"}"
  done
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

# Records that the I/O class ($1) cannot reach the job's buffered writes,
# and why ($2), for the report.
cg_io_prio_missing() {
  CG_MISSING+=("I/O $1 class for buffered writes: $2 (ionice covers reads and direct writes only)")
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
    io_max)
      local line
      # one disk per line; the kernel takes one disk per write
      while read -r line; do
        [[ -n $line ]] && cg_record "I/O limit $line" "$leaf/io.max" "$line"
      done <<<"$value"
      ;;
    io_weight) cg_record "I/O weight $value (iocost)" "$leaf/io.weight" "default $value" ;;
    io_prio) cg_record "I/O $value class for its buffered writes too" "$leaf/io.prio.class" "$value" ;;
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
      local line dev kv
      while read -r line; do
        [[ -n $line ]] || continue
        dev=${line%% *}
        for kv in ${line#* }; do
          case $kv in
            rbps=*) cg_record "read limit ${kv#*=} B/s on $dev" "$blk/blkio.throttle.read_bps_device" "$dev ${kv#*=}" ;;
            wbps=*) cg_record "write limit ${kv#*=} B/s on $dev (v1: direct I/O only, no writeback)" "$blk/blkio.throttle.write_bps_device" "$dev ${kv#*=}" ;;
          esac
        done
      done <<<"$value"
      ;;
    io_weight) CG_MISSING+=("I/O weight $value: cgroup v1 has no iocost (io.weight is cgroup v2)") ;;
    io_prio) cg_io_prio_missing "$value" "cgroup v1 has no io.prio.class" ;;
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

# Removes leaves of earlier runs whose owner is gone and that are empty:
# beside this run's leaf, and where versions before 0.2 put them (the top).
cg_clean_stale() {
  local dir owner c parent
  local -a dirs=()
  case $CG_MODE in
    # --attach puts a leaf beside its target, anywhere in the tree: look two
    # levels down too (a leaf left by an attach to a container's process)
    v2) dirs=("$CG_PARENT/$CG_PREFIX"-* "$CG_ROOT/$CG_PREFIX"-* "$CG_ROOT"/*/"$CG_PREFIX"-* "$CG_ROOT"/*/*/"$CG_PREFIX"-*) ;;
    v1)
      for c in cpu memory pids blkio unified; do
        [[ -d $CG_ROOT/$c ]] || continue
        if [[ $c == unified ]]; then
          cg_home_into parent "$CG_ROOT/unified" v2
        else
          cg_home_into parent "$CG_ROOT/$c" "$c"
        fi
        dirs+=("$parent/$CG_PREFIX"-* "$CG_ROOT/$c/$CG_PREFIX"-*)
      done
      ;;
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

# Reads "KEY VALUE" lines of a cgroup stat file into CG_USE under a prefix.
cg_read_kv() {
  local file=$1 prefix=$2 key value
  [[ -r $file ]] || return 1
  while read -r key value _; do
    [[ $value =~ ^[0-9]+$ ]] && CG_USE[$prefix$key]=$value
  done <"$file"
}

# Reads a pressure (PSI) file: total stall microseconds, "some" and "full".
cg_read_psi() {
  local file=$1 what=$2 kind field
  [[ -r $file ]] || return 1
  while read -r kind _ _ _ field; do
    [[ $field =~ ^total=([0-9]+)$ ]] && CG_USE[psi_${what}_$kind]=${BASH_REMATCH[1]}
  done <"$file"
}

# Collects what the limits did to the job, from its leaf, into CG_USE:
# cpu_usec, throttled, throttled_usec, mem_peak, mem_reclaim (bytes),
# mem_high/mem_max/oom_kill (events), io_rbytes, io_wbytes and
# psi_{cpu,memory,io}_{some,full} (stall microseconds); CG_USE_MISSING
# names what this kernel or hierarchy does not provide.
cg_usage() {
  declare -gA CG_USE=()
  declare -ga CG_USE_MISSING=()
  case $CG_MODE in
    v2) cg_usage_v2 || return ;;
    v1) cg_usage_v1 ;;
    *) return 1 ;;
  esac
  cg_usage_missing
}

# cg_usage on cgroup v2: the job's leaf's cpu.stat, memory.peak,
# memory.stat, memory.events, io.stat and pressure files. Fails only when
# the leaf is gone; a file missing or garbled leaves its figures out.
cg_usage_v2() {
  local dir page=4096 line
  dir=$CG_LEAF
  [[ -n $dir && -d $dir ]] || return 1
  if cg_read_kv "$dir/cpu.stat" cpu_; then
    CG_USE[cpu_usec]=${CG_USE[cpu_usage_usec]:-}
    CG_USE[throttled]=${CG_USE[cpu_nr_throttled]:-}
    CG_USE[throttled_usec]=${CG_USE[cpu_throttled_usec]:-}
  fi
  [[ -r $dir/memory.peak ]] && CG_USE[mem_peak]=$(<"$dir/memory.peak")
  [[ ${CG_USE[mem_peak]:-} =~ ^[0-9]+$ ]] || unset 'CG_USE[mem_peak]'
  if cg_read_kv "$dir/memory.stat" mst_; then
    page=$(getconf PAGESIZE 2>/dev/null || echo 4096)
    local steal=${CG_USE[mst_pgsteal]:-$((${CG_USE[mst_pgsteal_kswapd]:-0} + ${CG_USE[mst_pgsteal_direct]:-0}))}
    CG_USE[mem_reclaim]=$((steal * page))
  fi
  if cg_read_kv "$dir/memory.events" mev_; then
    CG_USE[mem_high]=${CG_USE[mev_high]:-0}
    CG_USE[mem_max]=${CG_USE[mev_max]:-0}
    CG_USE[oom_kill]=${CG_USE[mev_oom_kill]:-0}
  fi
  if [[ -r $dir/io.stat ]]; then
    local r=0 w=0 kv
    while read -r -a line; do
      for kv in "${line[@]:1}"; do
        [[ $kv =~ ^(rbytes|wbytes)=([0-9]+)$ ]] || continue
        if [[ ${BASH_REMATCH[1]} == rbytes ]]; then
          r=$((r + BASH_REMATCH[2]))
        else
          w=$((w + BASH_REMATCH[2]))
        fi
      done
    done <"$dir/io.stat"
    CG_USE[io_rbytes]=$r CG_USE[io_wbytes]=$w
    cg_usage_io_disks "$dir/io.stat"
  fi
  cg_read_psi "$dir/cpu.pressure" cpu
  cg_read_psi "$dir/memory.pressure" memory
  cg_read_psi "$dir/io.pressure" io
  return 0
}

# cg_usage on cgroup v1: the cpu, memory and blkio controllers' files, and
# the hybrid layout's v2 mount for CPU time and pressure.
cg_usage_v1() {
  local dir
  dir=${CG_V1[cpu]:-}
  if [[ -n $dir ]] && cg_read_kv "$dir/cpu.stat" cpu_; then
    CG_USE[throttled]=${CG_USE[cpu_nr_throttled]:-}
    [[ -n ${CG_USE[cpu_throttled_time]:-} ]] && CG_USE[throttled_usec]=$((CG_USE[cpu_throttled_time] / 1000))
  fi
  dir=${CG_V1[memory]:-}
  if [[ -n $dir && -r $dir/memory.max_usage_in_bytes ]]; then
    CG_USE[mem_peak]=$(<"$dir/memory.max_usage_in_bytes")
    CG_USE[mem_max]=$(<"$dir/memory.failcnt")
    [[ ${CG_USE[mem_peak]} =~ ^[0-9]+$ ]] || unset 'CG_USE[mem_peak]'
    [[ ${CG_USE[mem_max]} =~ ^[0-9]+$ ]] || unset 'CG_USE[mem_max]'
  fi
  dir=${CG_V1[blkio]:-}
  if [[ -n $dir && -r $dir/blkio.throttle.io_service_bytes ]]; then
    local r=0 w=0 dev op n
    while read -r dev op n; do
      [[ $n =~ ^[0-9]+$ ]] || continue
      case $op in
        Read) r=$((r + n)) ;;
        Write)
          w=$((w + n))
          [[ $dev =~ ^[0-9]+:[0-9]+$ ]] && CG_USE[io_w_$dev]=$n
          ;;
      esac
    done <"$dir/blkio.throttle.io_service_bytes"
    CG_USE[io_rbytes]=$r CG_USE[io_wbytes]=$w
  fi
  # The hybrid layout's v2 mount has no controllers but keeps CPU time
  # and pressure stall per cgroup.
  dir=${CG_V1[unified]:-}
  if [[ -n $dir ]]; then
    cg_read_kv "$dir/cpu.stat" cpu_ && CG_USE[cpu_usec]=${CG_USE[cpu_usage_usec]:-}
    cg_read_psi "$dir/cpu.pressure" cpu
    cg_read_psi "$dir/memory.pressure" memory
    cg_read_psi "$dir/io.pressure" io
  fi
}

# Fills CG_USE_MISSING: what cg_usage found no figure for, in words.
cg_usage_missing() {
  [[ -n ${CG_USE[throttled]:-} ]] || CG_USE_MISSING+=("CPU throttling (cpu.stat)")
  [[ -n ${CG_USE[mem_peak]:-} ]] || CG_USE_MISSING+=("memory peak (memory.peak: kernel 5.19+)")
  [[ -n ${CG_USE[mem_reclaim]:-} ]] || CG_USE_MISSING+=("memory reclaim (memory.stat pgsteal: v2 only)")
  if [[ -z ${CG_USE[io_wbytes]:-} ]]; then
    CG_USE_MISSING+=("I/O bytes (io.stat)")
  elif [[ $CG_MODE == v1 ]]; then
    CG_USE_MISSING+=("buffered writes in the I/O bytes (v1 blkio counts direct I/O only)")
  fi
  [[ -n ${CG_USE[psi_cpu_some]:-} ]] || CG_USE_MISSING+=("pressure stall (PSI: v2 with CONFIG_PSI)")
  return 0
}

# True when systemd is PID 1 (it then owns the cgroup tree).
cg_systemd_running() {
  [[ ${LOWPRIO_SYSTEMD:-auto} == 1 ]] && return 0
  [[ ${LOWPRIO_SYSTEMD:-auto} == 0 ]] && return 1
  gg_systemd_is_init && command -v systemd-run >/dev/null
}

# Prints the systemd slice that holds the home PID (the last ".slice" in its
# cgroup path), so that a transient scope stays under the caller's slice and
# its limits; empty when there is none.
cg_systemd_slice() {
  local cg_path part slice=''
  cg_home_into cg_path / v2
  [[ $cg_path == / || $cg_path == // ]] && cg_home_into cg_path / name=systemd
  local IFS=/
  for part in $cg_path; do
    [[ $part == *.slice && $part != -.slice ]] && slice=$part
  done
  printf '%s' "$slice"
}

# The systemd-run options that pick the manager: the user's own (--user)
# for non-root callers, who may not start system units; for root, the
# caller's slice.
cg_systemd_manager_into() {
  local -n mgr_ref=$1
  if ((EUID != 0)); then
    mgr_ref=(--user)
  else
    local slice
    slice=$(cg_systemd_slice)
    mgr_ref=()
    if [[ -n $slice ]]; then
      # shellcheck disable=SC2034 # nameref: assigns the caller's variable
      mgr_ref=(--slice "$slice")
    fi
  fi
}

# True when systemd-run can start a scope here (a non-root user needs a
# running user manager); the reason goes to CG_LAST_ERROR otherwise.
cg_systemd_usable() {
  local -a mgr
  local err
  cg_systemd_manager_into mgr
  if err=$(timeout 15 systemd-run "${mgr[@]}" --scope --quiet --collect -- true 2>&1); then
    return 0
  fi
  CG_LAST_ERROR="systemd-run ${mgr[*]} --scope failed: ${err%%$'\n'*}"
  return 1
}

# Builds the systemd-run --scope prefix into the array named $1 from the
# settings in the associative array named $2.
cg_systemd_command_into() {
  local -n cmd_ref=$1
  local -n set_ref=$2
  local -a mgr
  cg_systemd_manager_into mgr
  cmd_ref=(systemd-run "${mgr[@]}" --scope --quiet --collect --unit "$CG_NAME")
  local w=${set_ref[cpu_weight]:-}
  [[ -n $w ]] && cmd_ref+=(-p "CPUWeight=$w")
  [[ -n ${set_ref[cpu_max]:-} ]] && cmd_ref+=(-p "CPUQuota=$((set_ref[cpu_max] / 10))%")
  [[ -n ${set_ref[mem_high]:-} ]] && cmd_ref+=(-p "MemoryHigh=${set_ref[mem_high]}")
  if [[ -n ${set_ref[mem_max]:-} ]]; then
    cmd_ref+=(-p "MemoryMax=${set_ref[mem_max]}" -p MemorySwapMax=0)
  fi
  [[ -n ${set_ref[pids_max]:-} ]] && cmd_ref+=(-p "TasksMax=${set_ref[pids_max]}")
  [[ -n ${set_ref[io_weight]:-} ]] && cmd_ref+=(-p "IOWeight=${set_ref[io_weight]}")
  # the adaptive io.max's governor reads the scope's io.stat
  [[ -n ${set_ref[io_accounting]:-} ]] && cmd_ref+=(-p IOAccounting=yes)
  if [[ -n ${set_ref[io_max]:-} ]]; then
    local line dev kv
    while read -r line; do
      [[ -n $line ]] || continue
      dev=/dev/block/${line%% *}
      for kv in ${line#* }; do
        case $kv in
          rbps=*) cmd_ref+=(-p "IOReadBandwidthMax=$dev ${kv#*=}") ;;
          wbps=*) cmd_ref+=(-p "IOWriteBandwidthMax=$dev ${kv#*=}") ;;
        esac
      done
    done <<<"${set_ref[io_max]}"
  fi
  if [[ -n ${set_ref[io_prio]:-} ]]; then
    cg_io_prio_missing "${set_ref[io_prio]}" "systemd has no property for io.prio.class"
  fi
  cmd_ref+=(--)
}

# Describes the cgroup setup of this host, one fact per line (--explain).
cg_describe() {
  printf 'cgroup root: %s (%s)\n' "$CG_ROOT" "$(stat -fc %T "$CG_ROOT" 2>/dev/null || echo '?')"
  printf 'cgroup mode: %s%s\n' "$CG_MODE" "${CG_WHY:+ ($CG_WHY)}"
  case $CG_MODE in
    v2)
      printf "v2 home (the caller's cgroup): %s%s\n" "${CG_PARENT#"$CG_ROOT"}" \
        "$(cg_v2_is_root "$CG_PARENT" && echo ' (the root: may hold processes and limited children)')"
      printf 'controllers available: %s\n' "$(cg_v2_controllers)"
      printf 'controllers enabled for children: %s\n' "$(cat "$CG_PARENT/cgroup.subtree_control" 2>/dev/null)"
      printf 'parent writable: %s\n' "$([[ -w $CG_PARENT ]] && echo yes || echo no)"
      ;;
    v1)
      local c
      for c in cpu memory pids blkio; do
        local parent
        cg_home_into parent "$CG_ROOT/$c" "$c"
        local shown=${parent#"$CG_ROOT/$c"}
        printf "v1 %s: the caller's cgroup %s is %s\n" "$c" "${shown:-/}" \
          "$([[ -w $parent ]] && echo writable || echo 'not writable or absent')"
      done
      ;;
  esac
  printf 'this process: %s\n' "$(tr '\n' ' ' </proc/self/cgroup)"
}

# ------------------------------------------------------------------ iocost --
# iocost (io.cost.qos, io.cost.model: files of the v2 root only) makes
# io.weight work: a job with a low weight gets the disk only while nobody
# else needs it, and all of it when nobody does. It is off by default and
# host-wide, so lowprio-run --setup-disk turns it on for a disk (root only)
# and saves what was there, and --setup-disk --undo puts that back.

# Sets CG_IOCOST_ROOT to the v2 root folder that has io.cost.qos (a hybrid
# host's unified mount when the io controller is there), or returns 1 with
# CG_LAST_ERROR saying why iocost cannot be had here.
cg_iocost_root() {
  local root=${LOWPRIO_CGROUP_ROOT:-/sys/fs/cgroup} dir
  CG_IOCOST_ROOT=''
  for dir in "$root" "$root/unified"; do
    if [[ -f $dir/io.cost.qos ]]; then
      CG_IOCOST_ROOT=$dir
      return 0
    fi
  done
  if [[ -f $root/cgroup.controllers || -f $root/unified/cgroup.controllers ]] &&
    ! grep -qw io "$root/cgroup.controllers" "$root/unified/cgroup.controllers" 2>/dev/null; then
    CG_LAST_ERROR="the io controller is not on cgroup v2 here (cgroup v1 blkio has no iocost)"
  else
    CG_LAST_ERROR="this kernel or cgroup view offers no io.cost.qos (no iocost, or a container without the root cgroup)"
  fi
  return 1
}

# Puts the line for disk $2 of the root's file $1 (io.cost.qos or
# io.cost.model) into the variable named $3, without the MAJ:MIN; empty
# when the disk has none (iocost never set up for it).
cg_iocost_line_into() {
  local file=$1 majmin=$2 key rest
  local -n line_ref=$3
  line_ref=''
  [[ -r $file ]] || return 0
  while read -r key rest; do
    if [[ $key == "$majmin" ]]; then
      # shellcheck disable=SC2034 # nameref: assigns the caller's variable
      line_ref=$rest
      return 0
    fi
  done <"$file"
}

# True when iocost is enabled on the disk (enable=1 in io.cost.qos).
cg_iocost_enabled() {
  local qos
  cg_iocost_root || return 1
  cg_iocost_line_into "$CG_IOCOST_ROOT/io.cost.qos" "$1" qos
  [[ " $qos " == *" enable=1 "* ]]
}

# Turns iocost on for a disk with the QoS $2 (the io.cost.qos fields after
# the MAJ:MIN). The cost model: the kernel's automatic one, or, with $3
# ("rbps=N wbps=N", any of io.cost.model's linear figures), a linear model
# set by hand with those figures and the kernel's own for the rest. Keeps
# the lines that were there in CG_IOCOST_WAS_QOS and CG_IOCOST_WAS_MODEL
# first. Returns 1 with CG_LAST_ERROR set when the kernel refuses.
# shellcheck disable=SC2034 # CG_IOCOST_WAS_* are read by disk_setup
cg_iocost_enable() {
  local majmin=$1 qos=$2 figures=${3:-} now auto
  CG_IOCOST_WAS_QOS='' CG_IOCOST_WAS_MODEL=''
  cg_iocost_root || return 1
  local root=$CG_IOCOST_ROOT
  cg_iocost_line_into "$root/io.cost.qos" "$majmin" CG_IOCOST_WAS_QOS
  cg_iocost_line_into "$root/io.cost.model" "$majmin" CG_IOCOST_WAS_MODEL
  if [[ -f $root/io.cost.model ]]; then
    # automatic first: the kernel then shows its own figures for this disk
    cg_write "$root/io.cost.model" "$majmin ctrl=auto" || return 1
    if [[ -n $figures ]]; then
      cg_iocost_line_into "$root/io.cost.model" "$majmin" auto
      cg_write "$root/io.cost.model" "$majmin $(cg_iocost_model_merge "$auto" "$figures")" || return 1
    fi
  fi
  cg_write "$root/io.cost.qos" "$majmin $qos" || return 1
  cg_iocost_line_into "$root/io.cost.qos" "$majmin" now
  if [[ " $now " != *" enable=1 "* ]]; then
    CG_LAST_ERROR="the kernel did not keep enable=1 (io.cost.qos reads '${now:-nothing}' for $majmin)"
    return 1
  fi
}

# Prints a linear io.cost.model line (without the MAJ:MIN) set by hand:
# the figures of $2 where it gives them, else the kernel's automatic ones
# of $1 (a figure neither gives is left out: the kernel keeps its own).
cg_iocost_model_merge() {
  local auto=$1 figures=$2 key kv out='ctrl=user model=linear'
  local -A value=()
  for kv in $auto $figures; do
    [[ $kv =~ ^[rw](bps|seqiops|randiops)=[0-9]+$ ]] && value[${kv%%=*}]=${kv#*=}
  done
  for key in rbps rseqiops rrandiops wbps wseqiops wrandiops; do
    [[ -n ${value[$key]:-} ]] && out+=" $key=${value[$key]}"
  done
  printf '%s' "$out"
}

# Prints, for doctor and --explain, the cost model iocost uses on a disk:
# the kernel's automatic one or one set by hand, with the write and read
# speeds it assumes where the kernel shows them.
cg_iocost_model_text() {
  local line kv w='' r='' text
  cg_iocost_root || return 1
  cg_iocost_line_into "$CG_IOCOST_ROOT/io.cost.model" "$1" line
  for kv in $line; do
    case $kv in
      wbps=*) w=${kv#*=} ;;
      rbps=*) r=${kv#*=} ;;
    esac
  done
  if [[ " $line " == *" ctrl=user "* ]]; then
    text="cost model set by hand"
  else
    text="the kernel's automatic cost model"
  fi
  local -a speeds=()
  [[ $w =~ ^[0-9]+$ ]] && speeds+=("writes $((w / 1048576)) MiB/s")
  [[ $r =~ ^[0-9]+$ ]] && speeds+=("reads $((r / 1048576)) MiB/s")
  ((${#speeds[@]})) && text+=": ${speeds[0]}${speeds[1]:+, ${speeds[1]}}"
  printf '%s' "$text"
}

# Puts into the variable named $2 the fastest a cgroup alone may write on
# the disk under iocost, in bytes/s: the cost model's write speed times the
# QoS ceiling (max, % of the model). Empty when the kernel does not show
# them (a model in automatic mode on an older kernel).
cg_iocost_ceiling_into() {
  local majmin=$1 qos model kv w='' max=''
  local -n ceiling_ref=$2
  ceiling_ref=''
  cg_iocost_root || return 1
  cg_iocost_line_into "$CG_IOCOST_ROOT/io.cost.qos" "$majmin" qos
  cg_iocost_line_into "$CG_IOCOST_ROOT/io.cost.model" "$majmin" model
  for kv in $qos $model; do
    case $kv in
      max=*) max=${kv#*=} ;;
      wbps=*) w=${kv#*=} ;;
    esac
  done
  max=${max%%.*}
  [[ $w =~ ^[0-9]+$ && $max =~ ^[0-9]+$ ]] || return 0
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  ceiling_ref=$((w * max / 100))
}

# Puts a disk's io.cost.qos and io.cost.model back as saved by
# cg_iocost_enable: a line in automatic mode is restored as automatic (the
# kernel recomputes its numbers), one set by hand number for number; a disk
# that had no line gets the kernel's defaults (off, automatic).
cg_iocost_restore() {
  local majmin=$1 qos=$2 model=$3
  cg_iocost_root || return 1
  local root=$CG_IOCOST_ROOT
  if [[ -f $root/io.cost.model ]]; then
    if [[ -z $model || " $model " == *" ctrl=auto "* ]]; then
      cg_write "$root/io.cost.model" "$majmin ctrl=auto" || return 1
    else
      cg_write "$root/io.cost.model" "$majmin $model" || return 1
    fi
  fi
  local enable=0
  [[ " $qos " == *" enable=1 "* ]] && enable=1
  if [[ -z $qos || " $qos " == *" ctrl=auto "* ]]; then
    cg_write "$root/io.cost.qos" "$majmin enable=$enable ctrl=auto"
  else
    cg_write "$root/io.cost.qos" "$majmin $qos"
  fi
}

# Reads the leaf's io.stat per disk into CG_USE: io_w_<MAJ:MIN> (bytes
# written) and io_wait_<MAJ:MIN> (microseconds iocost held the job back:
# cost.wait + cost.indelay, where iocost is on).
cg_usage_io_disks() {
  local file=$1 dev rest kv wait
  local -a kvs
  [[ -r $file ]] || return 1
  while read -r dev rest; do
    [[ $dev =~ ^[0-9]+:[0-9]+$ ]] || continue
    read -r -a kvs <<<"$rest"
    wait=''
    for kv in "${kvs[@]}"; do
      [[ ${kv#*=} =~ ^[0-9]{1,18}$ ]] || continue
      case $kv in
        wbytes=*) CG_USE[io_w_$dev]=${kv#*=} ;;
        cost.wait=* | cost.indelay=*) wait=$((${wait:-0} + ${kv#*=})) ;;
      esac
    done
    [[ -n $wait ]] && CG_USE[io_wait_$dev]=$wait
  done <"$file"
  return 0
}
