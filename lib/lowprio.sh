# shellcheck shell=bash
# lowprio-run: a job that cannot starve the host. Tiers give nice, I/O class,
# CPU weight and cap; flags override. The strongest mechanism available is
# used and reported: systemd-run --scope where systemd is PID 1, else an own
# cgroup v2 leaf, else cgroup v1, else autogroup nice (setsid, then
# /proc/self/autogroup) - and always nice and ionice, set before exec so every
# thread and child inherits them. All cgroup work is in lib/cgroup.sh.

# Declares the plan (empty).
lowprio_init() {
  declare -gA LP_SET=()   # cgroup settings: cpu_weight cpu_max mem_high mem_max io_max pids_max
  declare -g LP_TIER='' LP_NICE='' LP_IO_CLASS='' LP_IO_LEVEL='' LP_CPULIMIT='' LP_ATTACH=''
  declare -g LP_MECHANISM='' LP_CHILD=''
  declare -ga LP_NOTES=()
}

# Loads a tier from the tiers table into the plan.
# Globals:
#   LOWPRIO_TIERS (file; default etc/lowprio-tiers.conf)
lowprio_load_tier() {
  local want=$1 file=${LOWPRIO_TIERS:-$GPUGUARD_ROOT/etc/lowprio-tiers.conf}
  local tier nice io weight cap names=''
  [[ -r $file ]] || {
    gg_usage_error "cannot read tiers file $file"
    return
  }
  while read -r tier nice io weight cap; do
    [[ -z $tier || $tier == \#* ]] && continue
    names+="${names:+, }$tier"
    [[ $tier == "$want" ]] || continue
    LP_TIER=$tier
    LP_NICE=$nice
    lowprio_parse_io "$io" || return
    LP_SET[cpu_weight]=$weight
    if [[ $cap != - ]]; then
      LP_SET[cpu_max]=$((cap * $(nproc) * 10)) # millicores
    fi
    return 0
  done <"$file"
  gg_usage_error "unknown tier '$want' (tiers: $names)"
}

# Parses an I/O class: idle | best-effort[:LEVEL] | LEVEL (best-effort).
lowprio_parse_io() {
  case $1 in
    idle) LP_IO_CLASS=3 LP_IO_LEVEL='' ;;
    best-effort) LP_IO_CLASS=2 LP_IO_LEVEL=4 ;;
    best-effort:[0-7]) LP_IO_CLASS=2 LP_IO_LEVEL=${1#*:} ;;
    [0-7]) LP_IO_CLASS=2 LP_IO_LEVEL=$1 ;;
    realtime* | 1:*) gg_usage_error "the realtime I/O class is not offered: it can starve the box" ;;
    *) gg_usage_error "--io-class takes idle, best-effort or 0-7 (got '$1')" ;;
  esac
}

# Converts a size (bytes, or with K/M/G/T, base 1024) to bytes in $2.
# shellcheck disable=SC2034 # nameref: assigns the caller's variable
lowprio_size_into() {
  # private names: a caller's variable of the same name would be shadowed
  local -n size_ref=$2
  local _size_num=${1%[KkMmGgTt]} _size_unit=${1:${#1}-1}
  [[ $_size_num =~ ^[0-9]+$ ]] || return 1
  case $_size_unit in
    [Kk]) size_ref=$((_size_num * 1024)) ;;
    [Mm]) size_ref=$((_size_num * 1024 ** 2)) ;;
    [Gg]) size_ref=$((_size_num * 1024 ** 3)) ;;
    [Tt]) size_ref=$((_size_num * 1024 ** 4)) ;;
    *) size_ref=$_size_num ;;
  esac
}

# Resolves --io-max DEV:rbps=..,wbps=.. to "MAJ:MIN rbps=N wbps=N" on the
# whole disk (limits on a partition are not honoured).
# shellcheck disable=SC2034 # nameref: assigns the caller's variable
lowprio_io_max_into() {
  local spec=$1 dev kv out='' bytes name majmin
  local -n io_ref=$2
  dev=${spec%%:rbps=*}
  dev=${dev%%:wbps=*}
  [[ $dev != "$spec" ]] || return 1
  if [[ $dev =~ ^[0-9]+:[0-9]+$ ]]; then
    majmin=$dev
  else
    [[ -b $dev ]] || return 1
    name=$(basename "$(readlink -f "$dev")")
    [[ -e /sys/class/block/$name/partition ]] && name=$(basename "$(readlink -f "/sys/class/block/$name/..")")
    majmin=$(<"/sys/class/block/$name/dev")
  fi
  local IFS=,
  for kv in ${spec#"$dev":}; do
    [[ $kv =~ ^(rbps|wbps)=([0-9]+[KkMmGg]?)$ ]] || return 1
    local key=${BASH_REMATCH[1]}
    lowprio_size_into "${BASH_REMATCH[2]}" bytes || return 1
    out+=" $key=$bytes"
  done
  io_ref="$majmin$out"
}

# Parses the options into the plan; sets LP_ARGS to the command.
lowprio_parse() {
  local tier=batch v
  declare -ga LP_ARGS=()
  declare -g LP_EXPLAIN=0 LP_DRY_RUN=0
  local -a args=("$@")
  local i
  for ((i = 0; i < ${#args[@]}; i++)); do
    [[ ${args[i]} == --tier ]] && tier=${args[i + 1]:-}
    [[ ${args[i]} == --tier=* ]] && tier=${args[i]#*=}
    [[ ${args[i]} == -- ]] && break
  done
  lowprio_load_tier "$tier" || return
  while (($#)); do
    case $1 in
      --tier) shift ;;
      --tier=*) ;;
      --nice)
        [[ ${2:-} =~ ^-?[0-9]+$ ]] && ((${2} >= -20 && ${2} <= 19)) ||
          gg_usage_error "--nice takes -20..19 (got '${2:-}')" || return
        LP_NICE=$2
        shift
        ;;
      --io-class)
        lowprio_parse_io "${2:-}" || return
        shift
        ;;
      --cpu-weight)
        [[ ${2:-} == idle || (${2:-} =~ ^[0-9]+$ && $2 -ge 1 && $2 -le 10000) ]] ||
          gg_usage_error "--cpu-weight takes 1-10000 or idle (got '${2:-}')" || return
        LP_SET[cpu_weight]=$2
        shift
        ;;
      --cpu-max)
        [[ ${2:-} =~ ^([0-9]+)(\.([0-9]))?$ ]] && [[ ${2} != 0 && $2 != 0.0 ]] ||
          gg_usage_error "--cpu-max takes a number of CPUs such as 2 or 0.5 (got '${2:-}')" || return
        LP_SET[cpu_max]=$((BASH_REMATCH[1] * 1000 + ${BASH_REMATCH[3]:-0} * 100))
        shift
        ;;
      --mem-high | --mem-max)
        lowprio_size_into "${2:-}" v && ((v > 0)) ||
          gg_usage_error "$1 takes a size such as 8G or 512M (got '${2:-}')" || return
        LP_SET[mem_${1#--mem-}]=$v
        shift
        ;;
      --io-max)
        lowprio_io_max_into "${2:-}" v ||
          gg_usage_error "--io-max takes DEV:rbps=N,wbps=N with a block device or MAJ:MIN (got '${2:-}')" || return
        LP_SET[io_max]=$v
        shift
        ;;
      --pids-max)
        [[ ${2:-} =~ ^[0-9]+$ && $2 -ge 1 ]] || gg_usage_error "--pids-max takes a number (got '${2:-}')" || return
        LP_SET[pids_max]=$2
        shift
        ;;
      --cpulimit)
        [[ ${2:-} =~ ^[0-9]+$ && $2 -ge 1 ]] || gg_usage_error "--cpulimit takes a percentage (got '${2:-}')" || return
        LP_CPULIMIT=$2
        shift
        ;;
      --attach)
        [[ ${2:-} =~ ^[0-9]+$ && -d /proc/${2} ]] || gg_usage_error "--attach needs a running PID (got '${2:-}')" || return
        LP_ATTACH=$2
        shift
        ;;
      --explain) LP_EXPLAIN=1 ;;
      --dry-run) LP_DRY_RUN=1 ;;
      --)
        shift
        LP_ARGS=("$@")
        break
        ;;
      -*) gg_usage_error "unknown option '$1' (see --help)" || return ;;
      *)
        LP_ARGS=("$@")
        break
        ;;
    esac
    shift
  done
  [[ ${#LP_ARGS[@]} -gt 0 || -n $LP_ATTACH || $LP_EXPLAIN == 1 ]] ||
    gg_usage_error "no command given (lowprio-run [options] -- CMD ARGS...)" || return
  if ((LP_NICE < 0 && EUID != 0)); then
    gg_usage_error "nice $LP_NICE raises priority: only root may, and only when asked" || return
  fi
  if [[ -n $LP_CPULIMIT ]] && ! command -v cpulimit >/dev/null; then
    gg_usage_error "--cpulimit needs cpulimit (Debian: apt-get install cpulimit); cpu.max via --cpu-max is better" || return
  fi
  return 0
}

# Chooses the mechanism and creates the cgroup; falls back with a warning
# naming what is and is not in force.
lowprio_setup() {
  local name=${CG_PREFIX}-$$
  cg_detect
  if [[ ${LOWPRIO_MECHANISM:-auto} != auto ]]; then
    LP_MECHANISM=$LOWPRIO_MECHANISM
  elif cg_systemd_running; then
    LP_MECHANISM=systemd
  elif [[ $CG_MODE == v2 || $CG_MODE == v1 ]]; then
    LP_MECHANISM=cgroup-$CG_MODE
  else
    LP_MECHANISM=autogroup
  fi
  CG_NAME=$name
  if [[ $LP_MECHANISM == cgroup-v2 || $LP_MECHANISM == cgroup-v1 ]]; then
    CG_MODE=${LP_MECHANISM#cgroup-}
    ((LP_DRY_RUN || LP_EXPLAIN)) && return 0
    cg_clean_stale
    if ! cg_create "$name"; then
      LP_NOTES+=("cgroup $CG_MODE not used: $CG_LAST_ERROR")
      if [[ $CG_MODE == v2 && -f $CG_ROOT/cpu/cpu.shares ]]; then
        CG_MODE=v1
        LP_MECHANISM=cgroup-v1
        cg_create "$name" || {
          LP_NOTES+=("cgroup v1 not used: $CG_LAST_ERROR")
          LP_MECHANISM=autogroup
        }
      else
        LP_MECHANISM=autogroup
      fi
    fi
    if [[ $LP_MECHANISM == cgroup-* ]]; then
      local key
      for key in cpu_weight cpu_max mem_high mem_max io_max pids_max; do
        [[ -n ${LP_SET[$key]:-} ]] && cg_set "$key" "${LP_SET[$key]}"
      done
    fi
  fi
  if [[ $LP_MECHANISM == autogroup ]]; then
    local key
    for key in "${!LP_SET[@]}"; do
      [[ $key == cpu_weight ]] && continue
      LP_NOTES+=("$key=${LP_SET[$key]} needs a cgroup: not in force")
    done
    if ! gg_autogroup_enabled; then
      LP_NOTES+=("autogroup is off: nice alone orders the job against others")
    fi
  fi
  return 0
}

# Prints the one-line summary of what is in force, and the notes.
lowprio_report() {
  local io='idle'
  [[ $LP_IO_CLASS == 2 ]] && io="best-effort:$LP_IO_LEVEL"
  local what="nice $LP_NICE, ionice $io"
  case $LP_MECHANISM in
    cgroup-*)
      local applied='' item
      for item in "${CG_APPLIED[@]}"; do
        applied+="${applied:+, }$item"
      done
      what+="; cgroup $CG_MODE leaf $CG_NAME: ${applied:-nothing}"
      ;;
    systemd) what+="; systemd-run --scope: $(lowprio_settings_text)" ;;
    autogroup) what+="; own autogroup at nice $LP_NICE (no cgroup)" ;;
  esac
  gg_log info "tier ${LP_TIER:-custom} via $LP_MECHANISM: $what"
  local note
  for note in "${LP_NOTES[@]}" "${CG_MISSING[@]}"; do
    gg_log warn "not in force: $note"
  done
  lowprio_io_scheduler_note
}

lowprio_settings_text() {
  local key out=''
  for key in "${!LP_SET[@]}"; do
    out+="${out:+, }$key=${LP_SET[$key]}"
  done
  printf '%s' "${out:-none}"
}

# Warns when ionice cannot work: schedulers other than bfq/mq-deadline
# ignore I/O classes, and mq-deadline ignores best-effort levels.
lowprio_io_scheduler_note() {
  local disk sched names=''
  while read -r disk sched; do
    names+=" $disk=$sched"
  done < <(gg_disk_schedulers)
  if [[ $names == *=none* || $names == *=kyber* ]]; then
    gg_log warn "not in force: ionice on disks with scheduler none/kyber ($names ); use --io-max"
  fi
}

# Puts ionice's options for the plan's I/O class into the array named $1.
# shellcheck disable=SC2034 # nameref: assigns the caller's variable
lowprio_ionice_opts_into() {
  local -n opts_ref=$1
  if [[ $LP_IO_CLASS == 3 ]]; then
    opts_ref=(-c 3)
  else
    opts_ref=(-c 2 -n "$LP_IO_LEVEL")
  fi
}

# The command prefix that applies nice and ionice before exec (inherited by
# every thread and child), and cpulimit when asked.
lowprio_wrapper_into() {
  local -n wrap_ref=$1
  wrap_ref=(nice -n "$LP_NICE")
  if command -v ionice >/dev/null; then
    local -a io_opts
    lowprio_ionice_opts_into io_opts
    wrap_ref+=(ionice "${io_opts[@]}")
  else
    LP_NOTES+=("ionice not installed")
  fi
  if [[ -n $LP_CPULIMIT ]]; then
    # LimitCPU (Debian's cpulimit): -m follows forks. It works by SIGSTOP:
    # it can freeze NCCL collectives; cpu.max is the better cap.
    wrap_ref+=(cpulimit -l "$LP_CPULIMIT" -m --)
  fi
}

# Runs the command under the plan; forwards signals; cleans up; returns the
# command's exit status.
lowprio_run() {
  local -a wrap=() sd=()
  lowprio_wrapper_into wrap
  if [[ $LP_MECHANISM == systemd ]]; then
    cg_systemd_command_into sd LP_SET
  fi
  if ((LP_DRY_RUN)); then
    printf 'would run:'
    printf ' %q' "${sd[@]}" "${wrap[@]}" "${LP_ARGS[@]}"
    printf '\n'
    return 0
  fi
  lowprio_report
  (
    # In the child, before exec: join the cgroup, or start an own session
    # and autogroup at the job's nice (nice alone does not cross sessions).
    if [[ $LP_MECHANISM == cgroup-* ]]; then
      cg_enter "$BASHPID" || gg_log error "could not enter the cgroup: $CG_LAST_ERROR"
    fi
    if [[ $LP_MECHANISM == autogroup ]]; then
      # shellcheck disable=SC2016 # $1 and $@ belong to the inner bash
      exec setsid bash -c 'echo "$1" >/proc/self/autogroup 2>/dev/null; shift; exec "$@"' \
        _ "$LP_NICE" "${wrap[@]}" "${LP_ARGS[@]}"
    fi
    exec "${sd[@]}" "${wrap[@]}" "${LP_ARGS[@]}"
  ) &
  LP_CHILD=$!
  trap 'kill -TERM "$LP_CHILD" 2>/dev/null' TERM
  trap 'kill -INT "$LP_CHILD" 2>/dev/null' INT
  trap 'kill -HUP "$LP_CHILD" 2>/dev/null' HUP
  local rc=0
  while :; do
    rc=0
    wait "$LP_CHILD" || rc=$?
    # wait returns early (>128) when a trapped signal arrives; go on
    # waiting while the child lives.
    kill -0 "$LP_CHILD" 2>/dev/null || break
  done
  trap - TERM INT HUP
  if [[ $LP_MECHANISM == cgroup-* ]]; then
    cg_remove || gg_log warn "could not remove cgroup $CG_NAME"
  fi
  return "$rc"
}

# Demotes a running job: every thread of every process in its tree gets the
# nice value and I/O class, and the processes move into the cgroup.
lowprio_attach() {
  local root=$1 pid tid count=0
  local -a pids io_opts
  lowprio_ionice_opts_into io_opts
  gg_proc_scan
  gg_proc_tree_into "$root" pids
  lowprio_report
  for pid in "${pids[@]}"; do
    if [[ $LP_MECHANISM == cgroup-* ]]; then
      cg_enter "$pid" || gg_log warn "PID $pid not moved: $CG_LAST_ERROR"
    fi
    for tid in /proc/"$pid"/task/*; do
      tid=${tid##*/}
      renice -n "$LP_NICE" -p "$tid" >/dev/null 2>&1 || renice "$LP_NICE" -p "$tid" >/dev/null 2>&1 || true
      ionice "${io_opts[@]}" -p "$tid" 2>/dev/null || true
      count=$((count + 1))
    done
  done
  if [[ $LP_MECHANISM == autogroup ]]; then
    echo "$LP_NICE" >"/proc/$root/autogroup" 2>/dev/null &&
      gg_log warn "set the autogroup of PID $root to nice $LP_NICE: this covers its whole session"
  fi
  gg_log info "demoted PID $root: ${#pids[@]} processes, $count threads"
  if [[ $LP_MECHANISM == cgroup-* ]]; then
    gg_log info "the cgroup $CG_NAME stays while the job runs; lowprio-run removes it on a later run once empty"
  fi
}

# Prints what would be applied and what is effective on this host.
lowprio_explain() {
  local io='idle'
  [[ $LP_IO_CLASS == 2 ]] && io="best-effort:$LP_IO_LEVEL"
  printf 'tier: %s\n' "${LP_TIER:-custom}"
  printf 'would apply: nice %s, ionice %s, %s\n' "$LP_NICE" "$io" "$(lowprio_settings_text)"
  printf 'mechanism: %s\n' "$LP_MECHANISM"
  cg_describe
  printf 'systemd as PID 1: %s\n' "$(cg_systemd_running && echo yes || echo no)"
  # The kernel prints nothing for a task in the boot-time autogroup or in a
  # non-root cgroup: neither is a session group of its own.
  local own_autogroup
  own_autogroup=$(cat /proc/self/autogroup 2>/dev/null) || own_autogroup='?'
  printf 'autogroup: %s (this session: %s)\n' \
    "$(gg_autogroup_enabled && echo on || echo off)" \
    "${own_autogroup:-none of its own}"
  local disk sched
  while read -r disk sched; do
    printf 'disk %s scheduler: %s\n' "$disk" "$sched"
  done < <(gg_disk_schedulers)
  printf 'privileges: %s\n' "$( ((EUID == 0)) && echo root || echo "user $(id -un) (cgroups need delegation)")"
  printf 'cpulimit: %s\n' "$(command -v cpulimit || echo 'not installed')"
  local note
  for note in "${LP_NOTES[@]}" "${CG_MISSING[@]}"; do
    printf 'not in force: %s\n' "$note"
  done
}
