# shellcheck shell=bash
# lowprio-run: a job that cannot starve the host. Tiers give nice, I/O class,
# CPU weight and cap; flags override. The strongest mechanism available is
# used and reported: systemd-run --scope where systemd is PID 1, else an own
# cgroup v2 leaf, else cgroup v1, else autogroup nice (setsid, then
# /proc/self/autogroup) - and always nice and ionice, set before exec so every
# thread and child inherits them. All cgroup work is in lib/cgroup.sh.

# Declares the plan (empty).
lowprio_init() {
  declare -gA LP_SET=() # cgroup settings: cpu_weight cpu_max mem_high mem_max io_max io_prio pids_max
  declare -g LP_TIER='' LP_NICE='' LP_IO_CLASS='' LP_IO_LEVEL='' LP_CPULIMIT='' LP_ATTACH=''
  declare -g LP_MECHANISM='' LP_CHILD='' LP_PENDING_SIGNAL='' LP_REPORT=0
  # the signal witnesses (PID, the pipe that keeps them alive), and until
  # when a second copy of a signal is taken for the first one's twin
  declare -g LP_WIT_GROUP_PID='' LP_WIT_GROUP_FD='' LP_WIT_SESSION_PID='' LP_WIT_SESSION_FD='' LP_SIGNAL_WHY=''
  declare -gA LP_ECHO_UNTIL=()
  declare -ga LP_NOTES=()
  # the disks: --io-max per disk (MAJ:MIN -> "rbps=N wbps=N"), the tier's
  # disk policy, and, once planned, the disks the job may write with why
  # and what bounds it there; --setup-disk/--measure-disk and their disks,
  # --setup-disk's cost model
  declare -gA LP_IO_MAX_USER=() LP_DISK_WHY=() LP_DISK_MECH=() LP_DISK_EFFECT=()
  declare -ga LP_DISKS=() LP_ACTION_DISKS=() LP_DISK_NONE=()
  declare -g LP_DISK_WEIGHT='' LP_DISK_WPCT='' LP_DISK_RPCT='' LP_ACTION='' LP_UNDO=0 LP_COST_MODEL=''
  # the adaptive io.max (lib/iogov.sh): the tier's choice and --io-adaptive's,
  # the cap per disk ("wbps=N rbps=N") and, while the job runs, each disk's
  # governor (PID, the pipe its summary comes through, the pipe that wakes
  # it, the summary)
  declare -g LP_DISK_ADAPTIVE='' LP_IO_ADAPTIVE_USER=''
  declare -gA LP_GOV_CAP=() LP_GOV_PID=() LP_GOV_FD=() LP_GOV_WAKE=() LP_GOV_SUM=()
  # (lowprio-run does not load lib/config.sh, which sets it for the others)
  [[ -n ${GPUGUARD_STATE_DIR:-} ]] || gg_state_dir_default
}

# The shipped tiers table, used when the tiers file cannot be read or has a
# bad line (a guard never stops a job from starting): same columns as
# etc/lowprio-tiers.conf.
LP_BUILTIN_TIERS='system -5 best-effort:0 200 - -
online 0 best-effort:4 100 - -
batch 15 idle idle 60 weight=10,wbps=12%,rbps=10%,adaptive=on
offline 19 idle idle - weight=1,wbps=2%,rbps=10%,adaptive=on'

# The largest size --io-max, --mem-high and --mem-max take: 1024T (2^50
# bytes). Far above any disk or memory, and far below 2^63, where bash's
# arithmetic would wrap a larger N times its unit around to a small or
# negative number.
LP_SIZE_MAX=1125899906842624

# Sets LP_WHY to "WHAT (got 'VALUE')", the value shown as an error line may
# show it (one line, no control characters).
lowprio_why_got() {
  # (gg_shown_into splits a list by IFS: a caller's IFS=, must not reach it)
  local shown IFS=$' \t\n'
  gg_shown_into shown "$2" 40
  LP_WHY="$1 (got $shown)"
}

# Puts a whole number within MIN..MAX into the variable named $1: decimal
# digits only, a leading '-' only where MIN is below 0, leading zeros read
# as decimal ("09" is 9, "010" is 10). The text goes through the one
# numeric check (gg_number_into) before any arithmetic: bash would read
# "09" as a bad octal number (a raw "value too great for base" line) and
# "010" as 8, and wrap a number past 2^63.
# Arguments:
#   $1 variable, $2 text, $3 MIN, $4 MAX
# Returns:
#   1 (the variable set to '') when the text is not such a number
lowprio_int_into() {
  local -n _int_ref=$1
  local _int_text=$2 _int_min=$3 _int_max=$4 _int_abs
  _int_ref=''
  if [[ $_int_text == -* ]]; then
    ((_int_min < 0)) || return 1
    gg_number_into _int_abs "${_int_text#-}" int 0 "$((-_int_min))" || return 1
    _int_ref=$((-_int_abs))
  else
    ((_int_max >= 0)) || return 1
    gg_number_into _int_abs "$_int_text" int "$((_int_min > 0 ? _int_min : 0))" "$_int_max" || return 1
    # shellcheck disable=SC2034 # nameref: assigns the caller's variable
    _int_ref=$_int_abs
  fi
}

# Checks a nice value (-20..19) into the variable named $1; LP_WHY says why
# not.
lowprio_nice_into() {
  lowprio_int_into "$1" "$2" -20 19 && return 0
  lowprio_why_got "takes -20..19" "$2"
  return 1
}

# Checks a CPU weight (1-10000, or idle: the cgroup idle class) into the
# variable named $1; LP_WHY says why not.
lowprio_weight_into() {
  local -n _weight_ref=$1
  if [[ $2 == idle ]]; then
    # shellcheck disable=SC2034 # nameref: assigns the caller's variable
    _weight_ref=idle
    return 0
  fi
  lowprio_int_into "$1" "$2" 1 10000 && return 0
  lowprio_why_got "takes 1-10000 or idle" "$2"
  return 1
}

# Loads a tier from the tiers table into the plan. Only --tier's name can
# be wrong here (the user's own typo: exit 2): the table was checked as a
# whole when read.
lowprio_load_tier() {
  local want=$1 tier nice io weight cap disk names='' table
  lowprio_tiers_into table
  while read -r tier nice io weight cap disk; do
    names+="${names:+, }$tier"
    [[ $tier == "$want" ]] || continue
    LP_TIER=$tier
    lowprio_nice_into LP_NICE "$nice"
    lowprio_parse_io "$io"
    lowprio_weight_into weight "$weight"
    LP_SET[cpu_weight]=$weight
    if [[ $cap != - ]]; then
      lowprio_int_into cap "$cap" 1 100
      LP_SET[cpu_max]=$((cap * $(nproc) * 10)) # millicores
    fi
    lowprio_parse_disk_policy "${disk:--}"
    return 0
  done <<<"$table"
  gg_usage_error "unknown tier '$want' (tiers: $names)"
}

# Puts the tiers table into the variable named $1, one tier a line with
# comments and blank lines left out: the tiers file (LOWPRIO_TIERS, default
# etc/lowprio-tiers.conf) read and checked as a whole, every column as
# --nice, --io-class, --cpu-weight and the disk policy check them. A file
# that cannot be read, or a bad line in it (one warning each,
# "FILE:LINE: why"), gives the built-in tiers: a typo there must neither
# stop every job nor reach a cgroup file. A UTF-8 BOM and CRLF line ends
# (a file edited on Windows) are read as plain text.
lowprio_tiers_into() {
  local -n tiers_ref=$1
  local file=${LOWPRIO_TIERS:-$GPUGUARD_ROOT/etc/lowprio-tiers.conf}
  local line n=0 bad=0 tier nice io weight cap disk extra v text='' why
  local -A seen=()
  tiers_ref=$LP_BUILTIN_TIERS
  if [[ ! -f $file || ! -r $file ]]; then
    gg_log warn "cannot read the tiers file $file: using the built-in tiers"
    return 0
  fi
  while IFS= read -r line || [[ -n $line ]]; do
    n=$((n + 1))
    ((n == 1)) && line=${line#$'\xef\xbb\xbf'}
    line=${line%$'\r'}
    read -r tier nice io weight cap disk extra <<<"$line"
    [[ -z $tier || $tier == \#* ]] && continue
    why=''
    if [[ -n $extra ]]; then
      why="more than 6 columns"
    elif [[ -z $cap ]]; then
      why="too few columns (tier nice io cpu_weight cpu_max_pct [disk])"
    elif [[ ! $tier =~ ^[A-Za-z0-9_.-]+$ ]]; then
      lowprio_why_got "a tier's name is letters, digits, '_', '.' or '-'" "$tier"
      why=$LP_WHY
    elif [[ -n ${seen[$tier]:-} ]]; then
      why="tier $tier is defined twice (first on line ${seen[$tier]})"
    elif ! lowprio_nice_into v "$nice"; then
      why="the nice column $LP_WHY"
    elif ! lowprio_parse_io "$io"; then
      why="the I/O class column $LP_WHY"
    elif ! lowprio_weight_into v "$weight"; then
      why="the cpu_weight column $LP_WHY"
    elif [[ $cap != - ]] && ! lowprio_int_into v "$cap" 1 100; then
      lowprio_why_got "the cpu_max_pct column takes - or 1-100" "$cap"
      why=$LP_WHY
    elif ! lowprio_parse_disk_policy "${disk:--}"; then
      why="the disk column $LP_WHY"
    fi
    if [[ -n $why ]]; then
      gg_log warn "$file:$n: $why; using the built-in tiers"
      bad=1
      continue
    fi
    seen[$tier]=$n
    text+="${text:+$'\n'}$tier $nice $io $weight $cap ${disk:--}"
  done <"$file"
  if ((bad)); then
    return 0
  fi
  if [[ -z $text ]]; then
    gg_log warn "$file: no tier in it: using the built-in tiers"
    return 0
  fi
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  tiers_ref=$text
}

# Parses a tier's disk column: "-" (the disk is not bounded) or
# weight=W,wbps=P%,rbps=P%[,adaptive=on|off]: io.weight W where iocost is
# on; io.max at those fractions of the disk's measured write and read
# bandwidth, only while another cgroup uses the disk (adaptive=on), or
# always where iocost is off (adaptive=off). Returns 1 with LP_WHY saying
# why when the column is not that.
lowprio_parse_disk_policy() {
  local kv v
  LP_DISK_WEIGHT='' LP_DISK_WPCT='' LP_DISK_RPCT='' LP_DISK_ADAPTIVE=off
  [[ $1 == - ]] && return 0
  local IFS=,
  for kv in $1; do
    case $kv in
      weight=*) lowprio_int_into v "${kv#*=}" 1 10000 && LP_DISK_WEIGHT=$v && continue ;;
      wbps=*%) lowprio_int_into v "${kv:5:-1}" 1 100 && LP_DISK_WPCT=$v && continue ;;
      rbps=*%) lowprio_int_into v "${kv:5:-1}" 1 100 && LP_DISK_RPCT=$v && continue ;;
      adaptive=on | adaptive=off) LP_DISK_ADAPTIVE=${kv#*=} && continue ;;
    esac
    lowprio_why_got "takes - or weight=1-10000,wbps=1-100%,rbps=1-100%,adaptive=on|off" "$kv"
    return 1
  done
  [[ -n $1 ]] && return 0
  lowprio_why_got "takes - or weight=1-10000,wbps=1-100%,rbps=1-100%,adaptive=on|off" "$1"
  return 1
}

# Parses an I/O class: idle | best-effort[:LEVEL] | LEVEL (best-effort).
# Returns 1 with LP_WHY saying why when it is not one.
lowprio_parse_io() {
  case $1 in
    idle) LP_IO_CLASS=3 LP_IO_LEVEL='' ;;
    best-effort) LP_IO_CLASS=2 LP_IO_LEVEL=4 ;;
    best-effort:[0-7]) LP_IO_CLASS=2 LP_IO_LEVEL=${1#*:} ;;
    [0-7]) LP_IO_CLASS=2 LP_IO_LEVEL=$1 ;;
    realtime* | 1:*)
      LP_WHY="takes idle, best-effort or 0-7: the realtime I/O class is not offered, it can starve the box"
      return 1
      ;;
    *)
      lowprio_why_got "takes idle, best-effort, best-effort:0-7 or 0-7" "$1"
      return 1
      ;;
  esac
}

# Converts a size (bytes, or with K/M/G/T, base 1024) to bytes in $2: the
# number in decimal digits, the bytes at most LP_SIZE_MAX.
# shellcheck disable=SC2034 # nameref: assigns the caller's variable
lowprio_size_into() {
  # private names: a caller's variable of the same name would be shadowed
  local -n size_ref=$2
  local _size_num=${1%[KkMmGgTt]} _size_unit=${1:${#1}-1} _size_mult=1
  case $_size_unit in
    [Kk]) _size_mult=1024 ;;
    [Mm]) _size_mult=$((1024 ** 2)) ;;
    [Gg]) _size_mult=$((1024 ** 3)) ;;
    [Tt]) _size_mult=$((1024 ** 4)) ;;
  esac
  lowprio_int_into _size_num "$_size_num" 0 "$((LP_SIZE_MAX / _size_mult))" || return 1
  size_ref=$((_size_num * _size_mult))
}

# Adds --io-max [DEV:]rbps=N,wbps=N to LP_IO_MAX_USER, keyed by the whole
# disk (limits on a partition are not honoured). DEV: a block device, a
# MAJ:MIN, or a file or folder on the disk; without DEV the disk holding
# the current folder, where a job's checkpoints usually go. One line and
# status 2 for a path on tmpfs or NFS, a device that is gone, or a size
# that is not N[K|M|G|T].
lowprio_io_max_add() {
  local spec=$1 dev kv out='' bytes majmin
  local usage="(--io-max takes [DEV:]rbps=N,wbps=N; DEV a disk, MAJ:MIN or path; without DEV, the current folder's disk)"
  if [[ $spec == rbps=* || $spec == wbps=* ]]; then
    dev=$PWD
  else
    dev=${spec%%:rbps=*}
    dev=${dev%%:wbps=*}
    [[ $dev != "$spec" && -n $dev ]] || {
      gg_usage_error "--io-max: no rbps= or wbps= in '$spec' $usage"
      return
    }
    spec=${spec#"$dev":}
  fi
  disk_resolve_into "$dev" majmin || {
    gg_usage_error "--io-max: $DISK_ERROR $usage"
    return
  }
  local IFS=,
  for kv in $spec; do
    if [[ ! $kv =~ ^(rbps|wbps)=([0-9]+[KkMmGgTt]?)$ ]] || ! lowprio_size_into "${kv#*=}" bytes || ((bytes == 0)); then
      gg_usage_error "--io-max: '$kv' is not rbps=N or wbps=N with N bytes per second and an optional K, M, G or T (base 1024), at most 1024T, e.g. wbps=200M"
      return
    fi
    out+="${out:+ }${kv%%=*}=$bytes"
  done
  LP_IO_MAX_USER[$majmin]=$out
}

# Puts --cpu-max's CPUs ("2", "0.5": one decimal at most) into the variable
# named $1 as millicores; LP_WHY says why not.
lowprio_cpu_max_into() {
  local -n _cpu_ref=$1
  local _cpu_whole _cpu_tenth=0
  if [[ $2 =~ ^([0-9]+)(\.([0-9]))?$ ]] && lowprio_int_into _cpu_whole "${BASH_REMATCH[1]}" 0 65536; then
    [[ -n ${BASH_REMATCH[3]} ]] && _cpu_tenth=${BASH_REMATCH[3]}
    _cpu_ref=$((_cpu_whole * 1000 + _cpu_tenth * 100))
    ((_cpu_ref > 0 && _cpu_ref <= 65536000)) && return 0
  fi
  lowprio_why_got "takes a number of CPUs such as 2 or 0.5" "$2"
  return 1
}

# lowprio-run's options that take one value, and those followed by any
# number of words (disks): what lowprio_parse_tier skips on its way to the
# command, and what `--opt=value` is split for.
LP_VALUE_OPTS="--tier --nice --io-class --cpu-weight --cpu-max --mem-high --mem-max --io-max --io-adaptive --pids-max --cpulimit --attach --cost-model"
LP_LIST_OPTS="--setup-disk --measure-disk --undo --cost-model"

# Parses the options into the plan; sets LP_ARGS to the command.
lowprio_parse() {
  declare -ga LP_ARGS=()
  declare -g LP_EXPLAIN=0 LP_DRY_RUN=0
  local -a argv=()
  # --nice=5 is --nice 5 (a job's own options, after its command, stay)
  gg_long_opts_split_into argv "$LP_VALUE_OPTS" "$LP_LIST_OPTS" "$@"
  lowprio_parse_tier ${argv[@]+"${argv[@]}"} || return
  lowprio_parse_options ${argv[@]+"${argv[@]}"} || return
  lowprio_parse_check
}

# Loads the tier named by --tier (batch when none) before the other
# options, which override its settings whatever their order. Only
# lowprio-run's own options are read: a job's `--tier gold`, after its
# command, is the job's (it was read as an unknown tier, and the job never
# started).
lowprio_parse_tier() {
  local tier=batch opt
  while (($#)); do
    opt=$1
    case $opt in
      -- | [!-]*) break ;;
      --tier) tier=${2:-} ;;
    esac
    shift
    if [[ " $LP_VALUE_OPTS " == *" $opt "* ]] && (($#)); then
      shift
    fi
    if [[ " $LP_LIST_OPTS " == *" $opt "* ]]; then
      while (($#)) && [[ $1 != -* ]]; do
        shift
      done
    fi
  done
  lowprio_load_tier "$tier" || return
}

# Reads each option into the plan (LP_SET, LP_NICE, LP_ACTION...); the
# first argument that is not an option, or all after --, is the command
# (LP_ARGS). A bad value is a usage error.
lowprio_parse_options() {
  local v opt
  while (($#)); do
    case $1 in
      --tier) shift ;;
      --nice)
        lowprio_nice_into LP_NICE "${2:-}" || gg_usage_error "--nice $LP_WHY" || return
        shift
        ;;
      --io-class)
        lowprio_parse_io "${2:-}" || gg_usage_error "--io-class $LP_WHY" || return
        shift
        ;;
      --cpu-weight)
        lowprio_weight_into v "${2:-}" || gg_usage_error "--cpu-weight $LP_WHY" || return
        LP_SET[cpu_weight]=$v
        shift
        ;;
      --cpu-max)
        lowprio_cpu_max_into v "${2:-}" || gg_usage_error "--cpu-max $LP_WHY" || return
        LP_SET[cpu_max]=$v
        shift
        ;;
      --mem-high | --mem-max)
        lowprio_size_into "${2:-}" v && ((v > 0)) ||
          gg_usage_error "$1 takes a size such as 8G or 512M (got '${2:-}')" || return
        LP_SET[mem_${1#--mem-}]=$v
        shift
        ;;
      --io-max)
        lowprio_io_max_add "${2:-}" || return
        shift
        ;;
      --io-adaptive)
        [[ ${2:-} == on || ${2:-} == off ]] ||
          gg_usage_error "--io-adaptive takes on or off (got '${2:-}')" || return
        LP_IO_ADAPTIVE_USER=$2
        shift
        ;;
      --setup-disk | --measure-disk | --undo | --cost-model)
        opt=$1
        case $1 in
          --undo) LP_UNDO=1 ;;
          --cost-model)
            [[ ${2:-} == measured || ${2:-} == kernel ]] ||
              gg_usage_error "--cost-model takes measured or kernel (got '${2:-}')" || return
            LP_COST_MODEL=$2
            shift
            ;;
          *) LP_ACTION=${1#--} ;;
        esac
        # the disks named after any of them
        while [[ -n ${2:-} && ${2:-} != -* ]]; do
          disk_resolve_into "$2" v || gg_usage_error "$opt: $DISK_ERROR" || return
          LP_ACTION_DISKS+=("$v")
          shift
        done
        ;;
      --pids-max)
        # the kernel's own ceiling on PIDs (PID_MAX_LIMIT)
        lowprio_int_into v "${2:-}" 1 4194304 || gg_usage_error "--pids-max takes 1-4194304 (got '${2:-}')" || return
        LP_SET[pids_max]=$v
        shift
        ;;
      --cpulimit)
        # cpulimit's own range: 100 % per CPU
        lowprio_int_into v "${2:-}" 1 "$(($(nproc) * 100))" ||
          gg_usage_error "--cpulimit takes a percentage, 1-$(($(nproc) * 100)) here (got '${2:-}')" || return
        LP_CPULIMIT=$v
        shift
        ;;
      --attach)
        [[ ${2:-} =~ ^[0-9]+$ && -d /proc/${2} ]] || gg_usage_error "--attach needs a running PID (got '${2:-}')" || return
        LP_ATTACH=$2
        shift
        ;;
      --report) LP_REPORT=1 ;;
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
}

# Checks the plan as a whole: options that go together, what needs root or
# a tool, and that there is something to do.
lowprio_parse_check() {
  # ionice reaches reads and direct writes only: buffered writes (a
  # checkpoint) go to the disk later from the kernel's flusher threads, in
  # the name of the job's cgroup, so the idle class goes on the cgroup too
  if [[ $LP_IO_CLASS == 3 ]]; then
    LP_SET[io_prio]=idle
  else
    unset 'LP_SET[io_prio]'
  fi
  disk_measure_mib_check || return
  if ((LP_UNDO)) && [[ $LP_ACTION != setup-disk ]]; then
    gg_usage_error "--undo goes with --setup-disk (lowprio-run --setup-disk --undo [DEV])" || return
  fi
  if [[ -n $LP_COST_MODEL ]] && { [[ $LP_ACTION != setup-disk ]] || ((LP_UNDO)); }; then
    gg_usage_error "--cost-model goes with --setup-disk (lowprio-run --setup-disk --cost-model measured|kernel [DEV])" || return
  fi
  if [[ $LP_ACTION == setup-disk ]] && ((EUID != 0)); then
    gg_usage_error "--setup-disk changes a host-wide disk setting (iocost): root only (sudo lowprio-run --setup-disk)" || return
  fi
  [[ -n $LP_ACTION ]] && return 0
  [[ ${#LP_ARGS[@]} -gt 0 || -n $LP_ATTACH || $LP_EXPLAIN == 1 ]] ||
    gg_usage_error "no command given (lowprio-run [options] -- CMD ARGS...)" || return
  if ((LP_NICE < 0 && EUID != 0)); then
    gg_usage_error "nice $LP_NICE raises priority: only root may, and only when asked" || return
  fi
  if [[ -n $LP_CPULIMIT ]] && ! command -v cpulimit >/dev/null; then
    gg_usage_error "--cpulimit needs cpulimit (Debian: apt-get install cpulimit); cpu.max via --cpu-max is better" || return
  fi
  if [[ -n $LP_ATTACH ]] && ((${#LP_ARGS[@]})); then
    # one of them would be dropped without a word: the command never run,
    # or run unlimited while a process the user did not mean is demoted
    gg_usage_error "--attach PID demotes a running job; -- CMD starts one: give one of them" || return
  fi
  if [[ -n $LP_ATTACH ]]; then
    lowprio_attach_check "$LP_ATTACH" || return
  fi
  return 0
}

# Refuses targets that --attach must never demote: PID 1, kernel threads,
# and (unless root) another user's processes. One line, status 2.
lowprio_attach_check() {
  local pid=$1 uid
  local -a f
  if ((pid == 1)); then
    gg_usage_error "--attach refuses PID 1 (init): demoting it slows every service on the box"
    return
  fi
  gg_proc_stat_into "/proc/$pid/stat" f || {
    gg_usage_error "--attach needs a running PID (got '$pid')"
    return
  }
  # field 9 (flags) has PF_KTHREAD (0x00200000) for kernel threads; their
  # parent (field 4) is kthreadd, PID 2
  if (((f[8] & 0x00200000) != 0 || pid == 2 || f[3] == 2)); then
    gg_usage_error "--attach refuses PID $pid: it is a kernel thread (${f[1]}), not a job"
    return
  fi
  uid=$(stat -c %u "/proc/$pid" 2>/dev/null) || uid=''
  if ((EUID != 0)) && [[ $uid != "$EUID" ]]; then
    gg_usage_error "--attach refuses PID $pid: it belongs to $(id -nu "$uid" 2>/dev/null || echo "uid $uid"); only root may demote another user's process"
    return
  fi
  return 0
}

# Chooses the mechanism and creates the cgroup under the caller's own (for
# --attach: the target's), so that a container's or user slice's limits
# still hold; falls back with a warning naming what is and is not in force.
lowprio_setup() {
  local name=${CG_PREFIX}-$$
  cg_detect "${LP_ATTACH:-$$}"
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
  if [[ $LP_MECHANISM == systemd ]] && ((! LP_DRY_RUN && ! LP_EXPLAIN)); then
    if [[ -n $LP_ATTACH ]]; then
      LP_NOTES+=("cgroup limits for --attach: systemd owns the tree here (single writer); nice and ionice only")
      LP_MECHANISM=nocgroup
    elif ! cg_systemd_usable; then
      # Not the cgroup tree: it is systemd's to write.
      LP_NOTES+=("$CG_LAST_ERROR")
      LP_MECHANISM=autogroup
    fi
  fi
  if [[ $LP_MECHANISM == cgroup-v2 || $LP_MECHANISM == cgroup-v1 ]]; then
    CG_MODE=${LP_MECHANISM#cgroup-}
    if ((LP_DRY_RUN || LP_EXPLAIN)); then
      # say what a run would get: a cgroup it could not create is not
      # the mechanism (a user without delegation gets nice and autogroup)
      if cg_creatable; then
        lowprio_disk_plan
        return 0
      fi
      LP_NOTES+=("cgroup $CG_MODE not used: $CG_LAST_ERROR")
      LP_MECHANISM=autogroup
    elif cg_clean_stale && ! cg_create "$name"; then
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
  fi
  lowprio_disk_plan
  if [[ $LP_MECHANISM == cgroup-* ]]; then
    local key
    for key in cpu_weight cpu_max mem_high mem_max io_max io_weight io_prio pids_max; do
      [[ -n ${LP_SET[$key]:-} ]] && cg_set "$key" "${LP_SET[$key]}"
    done
  fi
  if [[ $LP_MECHANISM == autogroup || $LP_MECHANISM == nocgroup ]]; then
    local key
    for key in "${!LP_SET[@]}"; do
      [[ $key == cpu_weight ]] && continue
      LP_NOTES+=("$key=${LP_SET[$key]//$'\n'/; } needs a cgroup")
    done
    if [[ $LP_MECHANISM == autogroup ]] && ! gg_autogroup_enabled; then
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
    systemd)
      local -a mgr
      cg_systemd_manager_into mgr
      what+="; systemd-run ${mgr[*]}${mgr[*]:+ }--scope: $(lowprio_settings_text)"
      ;;
    autogroup) what+="; own autogroup at nice $LP_NICE (no cgroup)" ;;
    nocgroup) what+="; no cgroup" ;;
  esac
  gg_log info "tier ${LP_TIER:-custom} via $LP_MECHANISM: $what"
  [[ $LP_MECHANISM == cgroup-* && -n $CG_PLACEMENT ]] && gg_log info "cgroup placement: $CG_PLACEMENT"
  lowprio_disk_line
  local note
  for note in "${LP_NOTES[@]}" "${CG_MISSING[@]}"; do
    gg_log warn "not in force: $note"
  done
  lowprio_io_scheduler_note
}

lowprio_settings_text() {
  local key out=''
  for key in "${!LP_SET[@]}"; do
    out+="${out:+, }$key=${LP_SET[$key]//$'\n'/; }"
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
# every thread and child), and cpulimit when asked. It ends with "--", so
# that a job whose name starts with '-' is run, not read as an option of
# the tool before it.
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
    wrap_ref+=(cpulimit -l "$LP_CPULIMIT" -m)
  fi
  wrap_ref+=(--)
}

# ------------------------------------------------- passing signals on --
# INT, TERM, HUP and QUIT that reach lowprio-run are passed on to the job,
# exactly once whichever way they came: a second SIGINT or SIGTERM breaks
# the job's clean-up (a KeyboardInterrupt in the middle of a checkpoint
# save). A signal sent to lowprio-run alone (kill PID, docker stop, a
# supervisor's or Python's terminate()) reached only lowprio-run and must be
# passed on. One sent to lowprio-run's process group (the terminal's ^C and
# ^\, a login shell passing its hang-up on to its jobs, timeout, kill --
# -PGID, a shell's kill %1, gpu-leak-watch passing one on) reached the job
# too when the job is in that group (every mechanism but autogroup, whose
# job has a session of its own). One sent to every process of a cgroup
# (systemd's KillMode=control-group, scancel) reached the job too when the
# job is in lowprio-run's cgroup or below it (every mechanism but
# systemd's, whose scope is a unit of its own).
#
# bash cannot see who sent a signal (no siginfo, no si_code), so two
# witnesses tell: processes (a cat reading a pipe that only lowprio-run
# writes) that keep these four signals blocked, so that one sent to them
# stays pending, readable in /proc/PID/status, without the witness having
# to run at all (no race, even when the job keeps every CPU busy). The
# group witness shares lowprio-run's process group and cgroup; the session
# witness has a session (and group) of its own in lowprio-run's cgroup. A
# signal pending at the session witness was sent to the whole cgroup; at
# the group witness alone, to the process group; at neither, to
# lowprio-run alone. It is passed on unless the job, as it stands then
# (its process group and cgroups are read), was among those it went to. A
# witness that has seen a signal is replaced by a fresh one.

# The bits of HUP (1), INT (2), QUIT (3) and TERM (15) in a signal mask.
LP_WIT_MASK=$(((1 << 0) | (1 << 1) | (1 << 2) | (1 << 14)))

# Prints the mask bit of signal $1 (HUP, INT, QUIT or TERM).
lowprio_signal_bit() {
  case $1 in
    HUP) printf 1 ;;
    INT) printf 2 ;;
    QUIT) printf 4 ;;
    TERM) printf '%d' $((1 << 14)) ;;
    *) printf 0 ;;
  esac
}

# Starts the witnesses named (group, session) in place of earlier ones and
# waits (1 s at most) until their signals are blocked, all of them at once
# (each costs an exec of env and cat: waiting for one after the other, in
# 50 ms naps, added 110 ms to every start). None where env has no
# --block-signal (coreutils before 8.31) or, for the session one, where
# setsid is missing: lowprio_job_got then cannot tell.
lowprio_witness_start() {
  local kind fd pid tries waiting
  for kind in "$@"; do
    lowprio_witness_stop "$kind"
    if [[ $kind == session ]]; then
      command -v setsid >/dev/null || continue
      # (setsid does not fork: a process substitution leads no process group)
      exec {fd}> >(exec setsid env --block-signal=INT,TERM,HUP,QUIT cat >/dev/null 2>&1)
      LP_WIT_SESSION_FD=$fd LP_WIT_SESSION_PID=$!
    else
      exec {fd}> >(exec env --block-signal=INT,TERM,HUP,QUIT cat >/dev/null 2>&1)
      LP_WIT_GROUP_FD=$fd LP_WIT_GROUP_PID=$!
    fi
  done
  for ((tries = 0; tries < 100; tries++)); do
    waiting=0
    for kind in "$@"; do
      lowprio_witness_pid_into "$kind" pid
      # (one whose env refused the option has exited: not waited for)
      [[ -n $pid ]] && ! lowprio_witness_read "$pid" && [[ -d /proc/$pid ]] && waiting=1
    done
    ((waiting)) || break
    sleep 0.01
  done
  for kind in "$@"; do
    lowprio_witness_pid_into "$kind" pid
    if [[ -z $pid ]] || lowprio_witness_read "$pid"; then
      continue
    fi
    gg_log debug "no $kind witness (env --block-signal?): every signal is passed on to the job"
    lowprio_witness_stop "$kind"
  done
}

# Puts the PID of the witness $1 (group or session) into the variable
# named $2 (empty when there is none).
lowprio_witness_pid_into() {
  local -n wpid_ref=$2
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  if [[ $1 == session ]]; then wpid_ref=$LP_WIT_SESSION_PID; else wpid_ref=$LP_WIT_GROUP_PID; fi
}

# Ends the witness $1 (group or session): its pipe closed, then SIGKILL
# (a governor started later holds the pipe too).
lowprio_witness_stop() {
  case $1 in
    group)
      [[ -n $LP_WIT_GROUP_FD ]] && exec {LP_WIT_GROUP_FD}>&-
      [[ -n $LP_WIT_GROUP_PID ]] && { kill -KILL "$LP_WIT_GROUP_PID" 2>/dev/null || true; }
      LP_WIT_GROUP_FD='' LP_WIT_GROUP_PID=''
      ;;
    session)
      [[ -n $LP_WIT_SESSION_FD ]] && exec {LP_WIT_SESSION_FD}>&-
      [[ -n $LP_WIT_SESSION_PID ]] && { kill -KILL "$LP_WIT_SESSION_PID" 2>/dev/null || true; }
      LP_WIT_SESSION_FD='' LP_WIT_SESSION_PID=''
      ;;
  esac
  return 0
}

# Puts the signals pending at witness PID $1 (a mask) into LP_WIT_PENDING.
# Returns 1 unless it is our armed witness: a cat, lowprio-run's child,
# with the four signals blocked (before its exec it is a bash, and a PID
# can be reused once it is gone).
lowprio_witness_read() {
  local pid=$1 key value name='' ppid='' blocked=0 pending=0
  LP_WIT_PENDING=0
  [[ -n $pid ]] || return 1
  {
    while read -r key value; do
      case $key in
        Name:) name=$value ;;
        PPid:) ppid=$value ;;
        SigPnd: | ShdPnd:) [[ $value =~ ^[0-9a-f]{16}$ ]] && pending=$((pending | 16#$value)) ;;
        SigBlk:) [[ $value =~ ^[0-9a-f]{16}$ ]] && blocked=$((16#$value)) ;;
      esac
    done <"/proc/$pid/status"
  } 2>/dev/null || return 1
  [[ $name == cat && $ppid == "$$" ]] && (((blocked & LP_WIT_MASK) == LP_WIT_MASK)) || return 1
  LP_WIT_PENDING=$pending
}

# True when the job's process group is lowprio-run's.
lowprio_job_in_our_group() {
  local -a m j
  gg_proc_stat_into "/proc/$$/stat" m && gg_proc_stat_into "/proc/$LP_CHILD/stat" j || return 1
  # field 5: the process group
  ((m[4] == j[4]))
}

# True when the job is in lowprio-run's cgroup or below it in every
# hierarchy (a systemd scope is not: it is a unit of its own).
lowprio_job_in_our_cgroup() {
  local id list path ours
  local -A mine=()
  {
    while IFS=: read -r id list path; do
      mine["$id:$list"]=$path
    done <"/proc/$$/cgroup"
    while IFS=: read -r id list path; do
      ours=${mine["$id:$list"]-/}
      [[ $ours == / || $path == "$ours" || $path == "$ours"/* ]] || return 1
    done <"/proc/$LP_CHILD/cgroup"
  } 2>/dev/null || return 1
}

# Says whether the job already got signal $1 as it reached lowprio-run:
# returns 0 (yes: not to be passed on), 1 (no), 2 (cannot tell: no armed
# group witness). When neither witness shows it, it looks again 0.1 s
# later: systemd and slurmstepd signal a cgroup's processes one at a time,
# and timeout signals lowprio-run and then its group, so the witnesses'
# copy can come a moment after lowprio-run's. The same signal again within
# a second of one that went to the job's group or cgroup, with no trace at
# the witnesses, is that delivery's twin (timeout's copy to lowprio-run,
# caught by a trap run of its own).
lowprio_job_got() {
  local sig=$1 bit group=0 session=-1 look now got=1
  bit=$(lowprio_signal_bit "$sig")
  for look in 1 2; do
    lowprio_witness_read "$LP_WIT_GROUP_PID" || return 2
    group=$((LP_WIT_PENDING & bit))
    session=-1
    if lowprio_witness_read "$LP_WIT_SESSION_PID"; then
      session=$((LP_WIT_PENDING & bit))
    fi
    ((group == 0 && session <= 0 && look == 1)) || break
    sleep 0.1
  done
  now=${EPOCHREALTIME/[.,]/}
  if ((session > 0)); then
    # sent to every process of lowprio-run's cgroup
    lowprio_job_in_our_cgroup && got=0
    LP_SIGNAL_WHY="sent to every process of its cgroup"
  elif ((group > 0 && session == 0)); then
    lowprio_job_in_our_group && got=0
    LP_SIGNAL_WHY="sent to its process group"
  elif ((group > 0)); then
    # no session witness: the group's or the cgroup's, whichever it was
    lowprio_job_in_our_group && lowprio_job_in_our_cgroup && got=0
    LP_SIGNAL_WHY="sent to its process group or cgroup"
  elif ((now < ${LP_ECHO_UNTIL[$sig]:-0})); then
    LP_SIGNAL_WHY="a second copy of one sent to its process group or cgroup just before"
    return 0
  else
    return 1
  fi
  # the witness that saw it is replaced, so that the next one shows too
  if ((group > 0)); then
    lowprio_witness_start group
  fi
  if ((session > 0)); then
    lowprio_witness_start session
  fi
  ((got == 0)) && LP_ECHO_UNTIL[$sig]=$((now + 1000000))
  return "$got"
}

# Trap handler: passes signal $1 on to the job, unless the job got it
# already (lowprio_job_got). Before the job exists it is kept, and sent
# once the job is started ($2 "kept"); the job cannot have had it then.
# Without witnesses, INT and QUIT are held back only when lowprio-run and
# the job are both in the terminal's foreground process group (typed at
# the terminal, they reached the job too).
lowprio_forward() {
  local sig=$1 kept=${2:-} got=1
  if [[ -z $LP_CHILD ]]; then
    LP_PENDING_SIGNAL=$sig
    return 0
  fi
  if [[ -z $kept ]]; then
    got=0
    lowprio_job_got "$sig" || got=$?
  else
    # what the witnesses saw before the job existed is spent
    if lowprio_witness_read "$LP_WIT_GROUP_PID" && ((LP_WIT_PENDING != 0)); then
      lowprio_witness_start group
    fi
    if lowprio_witness_read "$LP_WIT_SESSION_PID" && ((LP_WIT_PENDING != 0)); then
      lowprio_witness_start session
    fi
  fi
  if ((got == 0)); then
    gg_log debug "$sig reached the job too ($LP_SIGNAL_WHY): not sent again"
    return 0
  fi
  if ((got == 2)) && [[ $sig == INT || $sig == QUIT ]] && lowprio_keyboard_reached_job; then
    gg_log debug "$sig from the terminal reached the job too: not sent again"
    return 0
  fi
  lowprio_job_wait_exec
  gg_log debug "passing $sig on to the job (PID $LP_CHILD)"
  kill -s "$sig" "$LP_CHILD" 2>/dev/null || true
}

# Waits (5 s at most) until the job's process has left lowprio-run's own
# bash for nice, setsid or systemd-run: a forked bash still runs
# lowprio-run's trap handlers for a moment and then resets them, and a
# signal caught in between is lost (a HUP kept from the set-up reached a
# job that then ran on). It may be entering its cgroup meanwhile.
lowprio_job_wait_exec() {
  local tries=0
  while [[ /proc/$LP_CHILD/exe -ef /proc/$$/exe ]] && ((tries < 100)); do
    sleep 0.05
    tries=$((tries + 1))
  done
}

# True when lowprio-run and the job are both in the foreground process group
# of lowprio-run's terminal.
lowprio_keyboard_reached_job() {
  local -a m j
  gg_proc_stat_into "/proc/$$/stat" m && gg_proc_stat_into "/proc/$LP_CHILD/stat" j || return 1
  # field 5 is the process group, field 8 (tpgid) the terminal's foreground one
  ((m[7] > 0 && m[4] == m[7] && j[4] == m[7]))
}

# Before anything is set up for a job (not for --explain, --dry-run or
# --attach): its command must exist, else the shell's exit status (127 or
# 126) and nothing is created or measured. From here on INT, TERM, HUP and
# QUIT are kept for the job: one that comes during the set-up (the disk's
# first measurement takes seconds) stops what is under way, is passed on
# once the job has started, and lowprio-run then ends with the job's
# status. A guard never stops a job from starting, and lowprio-run never
# dies alone half-way, leaving a cgroup or a measurement file behind.
lowprio_run_prepare() {
  local sig
  ((LP_EXPLAIN || LP_DRY_RUN)) && return 0
  [[ -z $LP_ATTACH ]] || return 0
  # (checked before anything is set up: the error is lowprio-run's, not
  # nice's or ionice's, and nothing is measured or made for a job that
  # cannot start)
  gg_command_check "${LP_ARGS[0]}" || return
  for sig in INT TERM HUP QUIT; do
    # shellcheck disable=SC2064 # the signal name is fixed now
    trap "lowprio_forward $sig" "$sig"
  done
  lowprio_witness_start group session
}

# Runs the command under the plan; forwards INT, TERM, HUP and QUIT;
# reports what the limits did; cleans up; returns the command's exit
# status (128+N when a signal N ended it).
lowprio_run() {
  local -a wrap=() sd=()
  lowprio_wrapper_into wrap
  if [[ $LP_MECHANISM == systemd ]]; then
    cg_systemd_command_into sd LP_SET
  fi
  if ((LP_DRY_RUN)); then
    # the limits as well as the command line (nice and ionice are all the
    # command line shows: a cgroup's limits are set by lowprio-run itself)
    lowprio_plan
    printf 'would run:'
    printf ' %q' "${sd[@]}" "${wrap[@]}" "${LP_ARGS[@]}"
    printf '\n'
    return 0
  fi
  lowprio_report
  local started=$EPOCHREALTIME
  # (the traps are set since lowprio_run_prepare: a signal that comes while
  # the job is being started is kept and passed on, not lost or fatal to
  # lowprio-run alone)
  # stdin passed explicitly: bash gives background jobs /dev/null.
  (
    # In the child, before exec: bash makes a background job ignore QUIT
    # (and INT) when job control is off; give the job the dispositions
    # lowprio-run itself inherited. Then join the cgroup, or start an own
    # session and autogroup at the job's nice (nice alone does not cross
    # sessions).
    trap - INT QUIT
    # the witnesses' pipes are lowprio-run's alone
    [[ -z $LP_WIT_GROUP_FD ]] || exec {LP_WIT_GROUP_FD}>&-
    [[ -z $LP_WIT_SESSION_FD ]] || exec {LP_WIT_SESSION_FD}>&-
    if [[ $LP_MECHANISM == cgroup-* ]]; then
      cg_enter "$BASHPID" || gg_log error "could not enter the cgroup: $CG_LAST_ERROR"
    fi
    if [[ $LP_MECHANISM == autogroup ]]; then
      # shellcheck disable=SC2016 # $1 and $@ belong to the inner bash
      exec setsid bash -c 'echo "$1" >/proc/self/autogroup 2>/dev/null; shift; exec "$@"' \
        _ "$LP_NICE" "${wrap[@]}" "${LP_ARGS[@]}"
    fi
    exec "${sd[@]}" "${wrap[@]}" "${LP_ARGS[@]}"
  ) <&0 &
  LP_CHILD=$!
  if [[ -n $LP_PENDING_SIGNAL ]]; then
    lowprio_forward "$LP_PENDING_SIGNAL" kept
  fi
  lowprio_gov_start
  local rc reaped
  while :; do
    rc=0
    unset reaped
    # (bash says "line N: PID Killed ( the subshell's source )" when it
    # reaps a job a signal ended: the job's end is reported below instead)
    wait -p reaped "$LP_CHILD" 2>/dev/null || rc=$?
    # A trapped signal ends wait early, reporting no process: wait again.
    [[ -n ${reaped:-} || $rc == 127 ]] && break
  done
  trap - INT TERM HUP QUIT
  lowprio_witness_stop group
  lowprio_witness_stop session
  lowprio_gov_stop
  # In a subshell: whatever a kernel's stat files hold, the report never
  # costs the job's exit status or the clean-up.
  (lowprio_usage_report "$rc" "$started") || gg_log warn "could not report what the limits did"
  if [[ $LP_MECHANISM == cgroup-* ]]; then
    cg_remove || gg_log warn "could not remove cgroup $CG_NAME"
  fi
  return "$rc"
}

# Starts the adaptive io.max's governor (lib/iogov.sh) for each disk that
# has one, once the job is started (it never delays the start): a process
# substitution, so that its one summary line comes back through a pipe and
# no file is left. A governor that cannot start is one warning; the job
# runs on at full speed there.
lowprio_gov_start() {
  local majmin fd stat name wake
  local -a where
  case $LP_MECHANISM in
    # systemd: the governor finds the scope in the job's /proc/PID/cgroup
    systemd) where=("" "$CG_ROOT") ;;
    cgroup-v2) where=("${CG_LEAF:-}" "$CG_ROOT") ;;
    *) return 0 ;;
  esac
  [[ $LP_MECHANISM == systemd || -d ${where[0]} ]] || return 0
  for majmin in "${!LP_GOV_CAP[@]}"; do
    stat=''
    name=$(disk_name "$majmin") && [[ -r /sys/block/$name/stat ]] && stat=/sys/block/$name/stat
    # (opened after the job started: the job never holds these pipes)
    exec {wake}<> <(:)
    if exec {fd}< <(iogov_run "${where[@]}" "${LOWPRIO_GOV_DISKSTAT:-$stat}" "$majmin" "${LP_GOV_CAP[$majmin]}" \
      "$([[ $LP_MECHANISM == systemd ]] && printf '%s' "$CG_NAME")" "/proc/$LP_CHILD/cgroup" "$wake"); then
      LP_GOV_PID[$majmin]=$! LP_GOV_FD[$majmin]=$fd LP_GOV_WAKE[$majmin]=$wake
    else
      exec {wake}>&-
      gg_log warn "disk $majmin: the adaptive io.max could not start: the job runs uncapped there"
    fi
  done
}

# Stops each governor (it lifts a cap still on and says how long the job
# was capped) and keeps its summary for the report. A line on its wake pipe
# ends its nap at once (a line waits there even for a governor still
# starting); TERM goes too, and again every 0.2 s until the summary line
# (or end of file) comes back. After 5 s without an answer it is killed: it
# must never hold the caller's stderr (or lowprio-run's exit) for the
# minutes it would wait on its own.
lowprio_gov_stop() {
  local majmin line fd pid tries rc wake
  for majmin in "${!LP_GOV_PID[@]}"; do
    line='' fd=${LP_GOV_FD[$majmin]} pid=${LP_GOV_PID[$majmin]} rc=0 wake=${LP_GOV_WAKE[$majmin]:-}
    if [[ -n $wake ]]; then
      { printf 'stop\n' >&"$wake"; } 2>/dev/null || true
      exec {wake}>&-
    fi
    for ((tries = 0; tries < 25; tries++)); do
      # (gone already, once its nap was cut short: not an error under set -e)
      kill -TERM "$pid" 2>/dev/null || true
      rc=0
      read -r -t 0.2 -u "$fd" line || rc=$?
      # a line, or end of file (the governor is gone): no more TERMs
      ((rc > 128)) || break
    done
    ((rc > 128)) && { kill -KILL "$pid" 2>/dev/null || true; }
    [[ $line == 'GOV '* ]] && LP_GOV_SUM[$majmin]=${line#GOV }
    exec {fd}<&-
  done
  LP_GOV_PID=() LP_GOV_WAKE=()
}

# Bytes as text: "512 B", "1.5 KiB", "20.0 MiB", "3.2 GiB".
lowprio_bytes_text() {
  local n=$1 unit=B div=1 u
  for u in KiB MiB GiB TiB; do
    ((n >= div * 1024)) || break
    div=$((div * 1024))
    unit=$u
  done
  if ((div == 1)); then
    printf '%d B' "$n"
  else
    printf '%d.%d %s' "$((n / div))" "$(((n % div) * 10 / div))" "$unit"
  fi
}

# Microseconds as seconds with two decimals.
lowprio_usec_text() {
  printf '%d.%02d s' "$(($1 / 1000000))" "$((($1 % 1000000) / 10000))"
}

# The children's CPU time (user + system) in microseconds from `times`: the
# job's, for mechanisms without a cgroup of ours to read.
lowprio_children_cpu_usec() {
  local -a t
  local total=0 v m sec
  read -r _ _ <<<"$(times | head -1)"
  read -r -a t <<<"$(times | tail -1)"
  for v in "${t[@]}"; do
    [[ $v =~ ^([0-9]+)m([0-9]+)\.([0-9]+)s$ ]] || continue
    m=${BASH_REMATCH[1]}
    sec=${BASH_REMATCH[2]}
    local frac=${BASH_REMATCH[3]}000000
    total=$((total + (m * 60 + 10#$sec) * 1000000 + 10#${frac:0:6}))
  done
  printf '%d' "$total"
}

# One line at exit (and, with --report, a block) saying what the limits did
# to the job: CPU time and throttling, memory peak and reclaim, I/O bytes,
# pressure stall; and what this host cannot tell.
lowprio_usage_report() {
  local rc=$1 started=$2 wall line='' source
  local -a missing=() rows=()
  wall=$((${EPOCHREALTIME/./} - ${started/./}))
  if [[ $LP_MECHANISM == cgroup-* ]] && cg_usage; then
    source="cgroup $CG_MODE leaf $CG_NAME"
    missing=("${CG_USE_MISSING[@]}")
  else
    declare -gA CG_USE=()
    source="no cgroup of ours ($LP_MECHANISM)"
    missing=("throttling, memory, I/O and pressure stall (they need a cgroup of lowprio-run's own)")
  fi
  [[ -n ${CG_USE[cpu_usec]:-} ]] || CG_USE[cpu_usec]=$(lowprio_children_cpu_usec)
  rows+=("CPU time|$(lowprio_usec_text "${CG_USE[cpu_usec]}")")
  if [[ -n ${CG_USE[throttled]:-} ]]; then
    rows+=("CPU throttled|${CG_USE[throttled]} periods, $(lowprio_usec_text "${CG_USE[throttled_usec]:-0}")")
  fi
  if [[ -n ${CG_USE[mem_peak]:-} ]]; then
    rows+=("memory peak|$(lowprio_bytes_text "${CG_USE[mem_peak]}")")
  fi
  if [[ -n ${CG_USE[mem_reclaim]:-} ]]; then
    rows+=("memory reclaimed|$(lowprio_bytes_text "${CG_USE[mem_reclaim]}")${CG_USE[mem_high]:+ (memory.high hit ${CG_USE[mem_high]} times, max ${CG_USE[mem_max]:-0}, OOM kills ${CG_USE[oom_kill]:-0})}")
  elif [[ -n ${CG_USE[mem_max]:-} ]]; then
    rows+=("memory limit hit|${CG_USE[mem_max]} times")
  fi
  if [[ -n ${CG_USE[io_wbytes]:-} ]]; then
    rows+=("I/O|read $(lowprio_bytes_text "${CG_USE[io_rbytes]:-0}"), written $(lowprio_bytes_text "${CG_USE[io_wbytes]}")")
  fi
  if [[ -n ${CG_USE[psi_cpu_some]:-} ]]; then
    rows+=("pressure stall|cpu $(lowprio_usec_text "${CG_USE[psi_cpu_some]}"), memory $(lowprio_usec_text "${CG_USE[psi_memory_some]:-0}"), io $(lowprio_usec_text "${CG_USE[psi_io_some]:-0}") (some); memory $(lowprio_usec_text "${CG_USE[psi_memory_full]:-0}"), io $(lowprio_usec_text "${CG_USE[psi_io_full]:-0}") (full)")
  fi
  lowprio_disk_rows_into rows "$wall"
  local row
  for row in "${rows[@]}"; do
    line+="${line:+; }${row%%|*} ${row#*|}"
  done
  local unavailable=''
  for row in "${missing[@]}"; do
    unavailable+="${unavailable:+, }$row"
  done
  # a signal's end named, and the memory limit when it is the likely cause
  # (the kernel's OOM killer sends SIGKILL inside a cgroup at its limit)
  local how=''
  if ((rc > 128 && rc < 160)); then
    how=" (killed by SIG$(kill -l $((rc - 128)) 2>/dev/null || echo $((rc - 128)))"
    if ((rc == 137 && (${CG_USE[oom_kill]:-0} > 0 || ${CG_USE[mem_max]:-0} > 0))); then
      how+=": the memory limit was hit, the kernel's OOM killer likely"
    fi
    how+=")"
  fi
  gg_log info "job ended with status $rc$how after $(lowprio_usec_text "$wall"): $line${unavailable:+; not available: $unavailable}"
  ((LP_REPORT)) || return 0
  {
    printf 'lowprio-run report (%s):\n' "$source"
    printf '  %-18s %s\n' "exit status" "$rc" "wall time" "$(lowprio_usec_text "$wall")"
    for row in "${rows[@]}"; do
      printf '  %-18s %s\n' "${row%%|*}" "${row#*|}"
    done
    for row in "${missing[@]}"; do
      printf '  %-18s %s\n' "not available" "$row"
    done
  } >&2
}

# Demotes a running job: every thread of every process in its tree gets the
# nice value and I/O class, and the processes move into the cgroup. Each
# failure is one line; returns 1 when anything failed. --dry-run changes
# nothing and says what it would do.
lowprio_attach() {
  local root=$1 pid tid count=0 failed=0 err owner
  local -a pids io_opts
  lowprio_ionice_opts_into io_opts
  gg_proc_scan
  gg_proc_tree_into "$root" pids
  if ((LP_DRY_RUN)); then
    for pid in "${pids[@]}"; do
      for tid in /proc/"$pid"/task/*; do
        [[ -d $tid ]] && count=$((count + 1))
      done
    done
    printf 'would demote PID %s: %d processes (%s), %d threads to nice %s, ionice %s; cgroup: %s\n' \
      "$root" "${#pids[@]}" "${pids[*]}" "$count" "$LP_NICE" "${io_opts[*]}" \
      "$(if [[ $LP_MECHANISM == cgroup-* ]]; then cg_placement_plan; else echo "none ($LP_MECHANISM)"; fi)"
    return 0
  fi
  lowprio_report
  for pid in "${pids[@]}"; do
    owner=$(stat -c %u "/proc/$pid" 2>/dev/null) || continue
    if ((EUID != 0)) && [[ $owner != "$EUID" ]]; then
      gg_log error "PID $pid not demoted: it belongs to uid $owner"
      failed=$((failed + 1))
      continue
    fi
    if [[ $LP_MECHANISM == cgroup-* ]] && ! cg_enter "$pid"; then
      gg_log error "PID $pid not moved into the cgroup: $CG_LAST_ERROR"
      failed=$((failed + 1))
    fi
    for tid in /proc/"$pid"/task/*; do
      tid=${tid##*/}
      [[ -d /proc/$pid/task/$tid ]] || continue
      # the positional priority is absolute in every util-linux version
      if ! err=$(renice "$LP_NICE" -p "$tid" 2>&1 >/dev/null) || ! lowprio_nice_is "$pid" "$tid" "$LP_NICE"; then
        gg_log error "PID $pid thread $tid: nice $LP_NICE not set: ${err:-the kernel kept nice $(lowprio_nice_of "$pid" "$tid")}"
        failed=$((failed + 1))
      fi
      if ! err=$(ionice "${io_opts[@]}" -p "$tid" 2>&1); then
        gg_log error "PID $pid thread $tid: ionice ${io_opts[*]} not set: $err"
        failed=$((failed + 1))
      fi
      count=$((count + 1))
    done
  done
  if [[ $LP_MECHANISM == autogroup ]]; then
    if echo "$LP_NICE" 2>/dev/null >"/proc/$root/autogroup"; then
      gg_log warn "set the autogroup of PID $root to nice $LP_NICE: this covers its whole session"
    else
      gg_log error "PID $root: its autogroup's nice not set (a non-root user may only raise it)"
      failed=$((failed + 1))
    fi
  fi
  if ((failed)); then
    gg_log error "PID $root only partly demoted: $failed failures over ${#pids[@]} processes, $count threads"
    return 1
  fi
  gg_log info "demoted PID $root: ${#pids[@]} processes, $count threads"
  if [[ $LP_MECHANISM == cgroup-* ]]; then
    gg_log info "the cgroup $CG_NAME stays while the job runs; lowprio-run removes it on a later run once empty"
  fi
}

# Prints a thread's nice value (field 19 of its stat).
lowprio_nice_of() {
  local -a f
  gg_proc_stat_into "/proc/$1/task/$2/stat" f || return 1
  printf '%s' "${f[18]}"
}

# True when a thread has the nice value, or is gone.
lowprio_nice_is() {
  local now
  now=$(lowprio_nice_of "$1" "$2") || return 0
  [[ $now == "$3" ]]
}

# Prints the plan: the tier, what would be applied, by which mechanism
# (--explain's head, and --dry-run's before its command line).
lowprio_plan() {
  local io='idle'
  [[ $LP_IO_CLASS == 2 ]] && io="best-effort:$LP_IO_LEVEL"
  printf 'tier: %s\n' "${LP_TIER:-custom}"
  printf 'would apply: nice %s, ionice %s, %s\n' "$LP_NICE" "$io" "$(lowprio_settings_text)"
  printf 'mechanism: %s\n' "$LP_MECHANISM"
}

# Prints what would be applied and what is effective on this host.
lowprio_explain() {
  lowprio_plan
  case $LP_MECHANISM in
    cgroup-*) printf 'cgroup placement: %s\n' "$(cg_placement_plan)" ;;
    systemd)
      local -a mgr
      cg_systemd_manager_into mgr
      printf 'cgroup placement: a transient scope by systemd-run %s--scope (systemd is the one writer of its tree)\n' "${mgr[*]}${mgr[*]:+ }"
      ;;
    *) printf 'cgroup placement: none (%s)\n' "$LP_MECHANISM" ;;
  esac
  lowprio_disk_explain
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

# --------------------------------------------------------------- the disks --

# Adds the disk holding a path to the disks the job may write, with why.
# A path on no disk (tmpfs, NFS) is only mentioned by --explain.
lowprio_disk_add() {
  local path=$1 why=$2 majmin
  while [[ -n $path && ! -e $path ]]; do
    path=${path%/*}
  done
  if ! disk_resolve_into "${path:-/}" majmin 2>/dev/null; then
    LP_DISK_NONE+=("$why (${path:-/}): $DISK_ERROR")
    return 0
  fi
  lowprio_disk_add_majmin "$majmin" "$why"
}

lowprio_disk_add_majmin() {
  if [[ -z ${LP_DISK_WHY[$1]:-} ]]; then
    LP_DISKS+=("$1")
    LP_DISK_WHY[$1]=$2
  elif [[ ", ${LP_DISK_WHY[$1]}, " != *", $2, "* ]]; then
    LP_DISK_WHY[$1]+=", $2"
  fi
}

# Why the job's cgroup cannot take disk settings here (empty: it can).
lowprio_disk_blocker() {
  case $LP_MECHANISM in
    cgroup-v2)
      if [[ " $(cg_v2_controllers) " != *" io "* ]]; then
        echo "no io controller in ${CG_PARENT#"$CG_ROOT"}/cgroup.controllers"
      elif [[ -n ${CG_LEAF:-} && -d $CG_LEAF ]] &&
        [[ ! " $(cat "$CG_PARENT/cgroup.subtree_control" 2>/dev/null) " =~ \ \+?io\  ]]; then
        echo "the io controller is not enabled for the job's cgroup"
      fi
      ;;
    cgroup-v1)
      if [[ -n ${CG_LEAF:-}${CG_V1[cpu]:-} && -z ${CG_V1[blkio]:-} ]] || [[ ! -d $CG_ROOT/blkio ]]; then
        echo "no v1 blkio hierarchy for the job"
      fi
      ;;
    systemd) ;;
    *) echo "no cgroup of lowprio-run's own ($LP_MECHANISM)" ;;
  esac
}

# Chooses, for each disk the job may write (its folder's, the state
# folder's, each --io-max one), what bounds the job there, strongest first:
# the user's --io-max; the adaptive io.max (lib/iogov.sh: the tier's
# fraction of the disk's measured bandwidth, only while another cgroup uses
# the disk), on top of iocost's low io.weight where iocost is on; iocost
# alone (--io-adaptive off); a static io.max at the tier's fraction; else
# nothing, and why. The disk is measured on first use (never under
# --explain or --dry-run). Fills LP_DISKS, LP_DISK_MECH, LP_DISK_EFFECT,
# LP_GOV_CAP and LP_SET's io_max and io_weight.
lowprio_disk_plan() {
  local home=$PWD majmin blocker adaptive
  adaptive=$(lowprio_disk_adaptive)
  local -a lines=()
  declare -ga LP_DISK_NONE=()
  if [[ -n $LP_ATTACH ]]; then
    home=$(readlink "/proc/$LP_ATTACH/cwd" 2>/dev/null) || home=$PWD
  fi
  lowprio_disk_add "$home" "the job's folder"
  lowprio_disk_add "$GPUGUARD_STATE_DIR" "the state folder"
  for majmin in "${!LP_IO_MAX_USER[@]}"; do
    lowprio_disk_add_majmin "$majmin" "--io-max"
  done
  blocker=$(lowprio_disk_blocker)
  for majmin in "${LP_DISKS[@]}"; do
    if [[ -n ${LP_IO_MAX_USER[$majmin]:-} ]]; then
      LP_DISK_MECH[$majmin]="io.max as given (${LP_IO_MAX_USER[$majmin]})"
      LP_DISK_EFFECT[$majmin]="a hard cap, even when the disk is idle (io.max is not work-conserving)"
      lines+=("$majmin ${LP_IO_MAX_USER[$majmin]}")
    elif [[ -z $LP_DISK_WEIGHT$LP_DISK_WPCT ]]; then
      LP_DISK_MECH[$majmin]="none (tier ${LP_TIER:-custom} does not bound the disk)"
      LP_DISK_EFFECT[$majmin]="the job may saturate the disk; services beside it wait"
    elif [[ -n $blocker ]]; then
      LP_DISK_MECH[$majmin]="none: $blocker"
      LP_DISK_EFFECT[$majmin]="the job may saturate the disk; services beside it wait"
    elif [[ -n $LP_DISK_WEIGHT && $LP_MECHANISM != cgroup-v1 ]] && cg_iocost_enabled "$majmin"; then
      lowprio_disk_iocost "$majmin"
      if [[ $adaptive == on ]]; then
        lowprio_disk_fallback "$majmin" lines adaptive
      fi
    elif [[ $adaptive == on ]]; then
      lowprio_disk_fallback "$majmin" lines adaptive
    else
      lowprio_disk_fallback "$majmin" lines
    fi
  done
  local IFS=$'\n'
  if ((${#lines[@]})); then
    LP_SET[io_max]="${lines[*]}"
  else
    unset 'LP_SET[io_max]'
  fi
}

# iocost with the tier's io.weight on one disk.
lowprio_disk_iocost() {
  local majmin=$1 ceiling alone
  LP_SET[io_weight]=$LP_DISK_WEIGHT
  LP_DISK_MECH[$majmin]="iocost, io.weight $LP_DISK_WEIGHT; $(cg_iocost_model_text "$majmin")"
  alone="full speed"
  cg_iocost_ceiling_into "$majmin" ceiling
  # the ceiling (QoS max) bounds a job alone too: say by how much
  [[ -n $ceiling ]] && alone="up to $(disk_rate_text "$ceiling") (the cost model's write speed times the QoS ceiling)"
  LP_DISK_EFFECT[$majmin]="work-conserving: $alone while nobody else uses the disk; while another cgroup needs it and the disk misses its latency targets, the job gets about $LP_DISK_WEIGHT/$((LP_DISK_WEIGHT + 100)) of it"
}

# Prints "on" when the adaptive io.max can bound the job here: the tier or
# --io-adaptive asks for it, the tier gives a write fraction, and the job
# runs in a cgroup v2 leaf of lowprio-run's own or a systemd scope on
# cgroup v2, which the governor writes while lowprio-run waits for the job
# (not --attach: lowprio-run returns at once).
lowprio_disk_adaptive() {
  if [[ ${LP_IO_ADAPTIVE_USER:-$LP_DISK_ADAPTIVE} == on && -n $LP_DISK_WPCT && -z $LP_ATTACH ]] &&
    [[ $LP_MECHANISM == cgroup-v2 || ($LP_MECHANISM == systemd && $CG_MODE == v2) ]]; then
    echo on
  else
    echo off
  fi
}

# Why the static io.max is what bounds the job on a disk (the adaptive one
# needs a cgroup v2 leaf of lowprio-run's own, which it writes while the
# job runs; iocost needs --setup-disk).
lowprio_disk_static_why() {
  local adaptive=${LP_IO_ADAPTIVE_USER:-$LP_DISK_ADAPTIVE}
  if [[ $adaptive == on && -n $LP_ATTACH ]]; then
    printf 'static: --attach leaves no governor beside the job; '
  elif [[ $adaptive == on && $LP_MECHANISM == systemd ]]; then
    printf 'static: systemd on cgroup v1 here, so no adaptive cap; '
  elif [[ $adaptive == on && $LP_MECHANISM == cgroup-v1 ]]; then
    printf 'static: no adaptive cap on cgroup v1; '
  elif [[ $adaptive == off ]]; then
    printf 'static (adaptive off: --io-adaptive off, or the tier says so); '
  fi
  if [[ $LP_MECHANISM == cgroup-v1 ]]; then
    printf 'cgroup v1 has no iocost'
  elif ! cg_iocost_root; then
    printf '%s' "$CG_LAST_ERROR"
  else
    printf 'iocost is not set up on this disk (as root: lowprio-run --setup-disk)'
  fi
}

# The io.max for one disk: the tier's fractions of its measured write and
# read bandwidth (measured now when not cached, unless --explain/--dry-run).
# Static: appends the io.max line to the array named $2. With $3
# "adaptive": the cap goes to LP_GOV_CAP for the governor, and adds to what
# iocost already does there.
lowprio_disk_fallback() {
  local majmin=$1 mode=${3:-static} why bw w r t wcap rcap kv iocost iocost_effect
  iocost=${LP_DISK_MECH[$majmin]:-} iocost_effect=${LP_DISK_EFFECT[$majmin]:-}
  local -n fallback_lines=$2
  if [[ $mode == adaptive ]]; then
    why="only while another cgroup uses the disk (checked every ${LOWPRIO_GOV_PERIOD:-0.5} s, full speed otherwise)"
    [[ -n $iocost ]] && why+=", and $iocost"
  else
    why=$(lowprio_disk_static_why)
  fi
  if ! disk_cached_into "$majmin" bw; then
    if ((LP_DRY_RUN || LP_EXPLAIN)); then
      if [[ $mode == adaptive ]]; then
        LP_DISK_MECH[$majmin]="adaptive io.max at ${LP_DISK_WPCT:-100} % of the disk's write bandwidth, $why"
        LP_DISK_EFFECT[$majmin]="not measured yet: measured on the job's first run, or now with lowprio-run --measure-disk"
        [[ -n $iocost ]] && LP_DISK_EFFECT[$majmin]+="; beside it, iocost: $iocost_effect"
        return 0
      fi
      LP_DISK_MECH[$majmin]="io.max fallback at ${LP_DISK_WPCT:-100} % of the disk's write bandwidth ($why)"
      LP_DISK_EFFECT[$majmin]="not measured yet: measured on the job's first run, or now with lowprio-run --measure-disk"
      [[ $LP_MECHANISM == cgroup-v1 ]] && LP_DISK_EFFECT[$majmin]+="; cgroup v1 throttles direct I/O only, not buffered writeback"
      return 0
    fi
    gg_state_dir_init >/dev/null 2>&1 || true
    if [[ -n ${LP_PENDING_SIGNAL:-} ]]; then
      # the job gets a signal as soon as it starts: no measurement first
      DISK_ERROR="not measured: SIG$LP_PENDING_SIGNAL came before the job started"
    fi
    if [[ -n ${LP_PENDING_SIGNAL:-} ]] || ! disk_measure_into "$majmin" bw "$PWD"; then
      if [[ -n $iocost ]]; then
        LP_DISK_MECH[$majmin]+="; no adaptive io.max: the disk's bandwidth could not be measured: $DISK_ERROR"
        return 0
      fi
      LP_DISK_MECH[$majmin]="none: $why, and its bandwidth could not be measured: $DISK_ERROR"
      LP_DISK_EFFECT[$majmin]="the job may saturate the disk; services beside it wait"
      return 0
    fi
    read -r w r _ <<<"$bw"
    gg_log info "measured disk $(disk_name "$majmin") ($majmin): writes $(disk_rate_text "$w"), reads $(disk_rate_text "$r") with O_DIRECT; kept in $(disk_cache_file) (lowprio-run --measure-disk measures again)"
  fi
  read -r w r t <<<"$bw"
  wcap=$((w * ${LP_DISK_WPCT:-100} / 100))
  kv="wbps=$wcap"
  local text
  text="writes <= $(disk_rate_text "$wcap") (${LP_DISK_WPCT:-100} % of the measured $(disk_rate_text "$w"))"
  if [[ -n $LP_DISK_RPCT ]] && ((r > 0)); then
    rcap=$((r * LP_DISK_RPCT / 100))
    kv+=" rbps=$rcap"
    text+=", reads <= $(disk_rate_text "$rcap") ($LP_DISK_RPCT % of $(disk_rate_text "$r"))"
  fi
  if [[ $mode == adaptive ]]; then
    LP_GOV_CAP[$majmin]=$kv
    [[ $LP_MECHANISM == systemd ]] && LP_SET[io_accounting]=yes
    LP_DISK_MECH[$majmin]="adaptive io.max: $text, $why"
    LP_DISK_EFFECT[$majmin]="work-conserving: full speed while no other cgroup uses the disk; within about ${LOWPRIO_GOV_PERIOD:-0.5} s of another's first I/O (${LOWPRIO_GOV_FLOOR_IOPS:-20} I/Os or 1 MiB per second or more; other lowprio-run jobs do not count) the cap above, lifted ${LOWPRIO_GOV_QUIET:-3} s after its last; --report says how long it was capped"
    if [[ $LP_MECHANISM != systemd && ${LOWPRIO_GOV_PACE:-on} != off ]]; then
      LP_DISK_EFFECT[$majmin]+="; its writes are paced where they start (the job paused in ${LOWPRIO_GOV_TICK:-0.01} s slices while ahead of the cap), not throttled as they reach the disk, so a service's fsync does not wait behind them (io.max takes the write cap where the job's cgroup cannot be frozen)"
    fi
    [[ -n $iocost ]] && LP_DISK_EFFECT[$majmin]+="; beside it, iocost: ${iocost_effect:-}"
    return 0
  fi
  fallback_lines+=("$majmin $kv")
  LP_DISK_MECH[$majmin]="io.max fallback: $text; $why"
  LP_DISK_EFFECT[$majmin]="not work-conserving: the job never writes faster, even alone (100 GiB take $((107374182400 / wcap / 60)) min at least)"
  [[ $LP_MECHANISM == cgroup-v1 ]] && LP_DISK_EFFECT[$majmin]+="; cgroup v1 throttles direct I/O only, not buffered writeback"
  return 0
}

# The one start line naming what bounds the job on each disk.
lowprio_disk_line() {
  local majmin out=''
  for majmin in "${LP_DISKS[@]}"; do
    out+="${out:+; }$(disk_name "$majmin") $majmin: ${LP_DISK_MECH[$majmin]:-none}"
  done
  [[ -n $out ]] || out="none: the job's folder and the state folder are on no disk"
  gg_log info "disk: $out"
}

# --explain's lines for the disks.
lowprio_disk_explain() {
  local majmin none
  for majmin in "${LP_DISKS[@]}"; do
    printf 'disk %s (%s; %s): %s\n' "$(disk_name "$majmin")" "$majmin" "${LP_DISK_WHY[$majmin]}" "${LP_DISK_MECH[$majmin]:-none}"
    printf '  expected effect: %s\n' "${LP_DISK_EFFECT[$majmin]:-none}"
  done
  for none in "${LP_DISK_NONE[@]}"; do
    printf 'no disk for %s\n' "$none"
  done
}

# --report's rows for the disks, added to the array named $1: bytes the
# job wrote on each, its mean write rate over the run, and the time it was
# held back (iocost's cost.wait where iocost is on, else the cgroup's I/O
# pressure stall).
lowprio_disk_rows_into() {
  local -n disk_rows=$1
  local wall_usec=$2 majmin w wait held
  for majmin in "${LP_DISKS[@]}"; do
    w=${CG_USE[io_w_$majmin]:-}
    [[ -n $w ]] || continue
    wait=${CG_USE[io_wait_$majmin]:-}
    if [[ -n $wait ]]; then
      held="held back $(lowprio_usec_text "$wait") by iocost"
    elif [[ -n ${CG_USE[psi_io_some]:-} ]]; then
      held="stalled on I/O $(lowprio_usec_text "${CG_USE[psi_io_some]}") (io pressure)"
    else
      held="throttled time not available"
    fi
    disk_rows+=("disk $(disk_name "$majmin")|written $(lowprio_bytes_text "$w"), mean $(disk_rate_text "$((w * 1000000 / (wall_usec > 0 ? wall_usec : 1)))"); $held; ${LP_DISK_MECH[$majmin]%%;*}")
  done
  lowprio_gov_rows_into disk_rows "$wall_usec"
}

# --report's row for each disk with the adaptive io.max: how long the job
# was capped and how many times the cap went on.
lowprio_gov_rows_into() {
  local -n gov_rows=$1
  local wall_usec=$2 majmin capped switches pct kv cap paused paced how
  for majmin in "${!LP_GOV_CAP[@]}"; do
    cap=''
    for kv in ${LP_GOV_CAP[$majmin]}; do
      case $kv in
        wbps=*) cap+="${cap:+, }writes <= $(disk_rate_text "${kv#*=}")" ;;
        rbps=*) cap+="${cap:+, }reads <= $(disk_rate_text "${kv#*=}")" ;;
      esac
    done
    if [[ -z ${LP_GOV_SUM[$majmin]:-} ]]; then
      gov_rows+=("adaptive $(disk_name "$majmin")|no figures: the governor did not run or did not answer")
      continue
    fi
    read -r capped switches _ paused paced _ <<<"${LP_GOV_SUM[$majmin]}"
    pct=$((capped * 100 / (wall_usec > 0 ? wall_usec : 1)))
    how=''
    if [[ ${paced:-0} == 1 ]]; then
      how="; writes paced by pausing the job, paused $(lowprio_usec_text "${paused:-0}") in all"
    fi
    gov_rows+=("adaptive $(disk_name "$majmin")|capped $(lowprio_usec_text "$capped") of $(lowprio_usec_text "$wall_usec") ($pct %), the cap went on $switches times ($cap while another cgroup used the disk$how)")
  done
}

# --setup-disk [--undo] [DEV...] and --measure-disk [DEV...]: the disk
# actions, run instead of a job.
lowprio_disk_action() {
  local majmin bw w r
  case $LP_ACTION in
    setup-disk)
      if ((LP_UNDO)); then
        disk_undo "${LP_ACTION_DISKS[@]}"
      else
        disk_setup "$LP_COST_MODEL" "${LP_ACTION_DISKS[@]}"
      fi
      ;;
    measure-disk)
      ((${#LP_ACTION_DISKS[@]})) || lowprio_disk_add "$PWD" "the current folder"
      ((${#LP_ACTION_DISKS[@]})) || LP_ACTION_DISKS=("${LP_DISKS[@]}")
      ((${#LP_ACTION_DISKS[@]})) || gg_usage_error "--measure-disk: the current folder is on no disk (${LP_DISK_NONE[0]:-})" || return
      gg_state_dir_init >/dev/null 2>&1 || gg_log warn "the state folder $GPUGUARD_STATE_DIR is not usable: the figures are not kept"
      for majmin in "${LP_ACTION_DISKS[@]}"; do
        if disk_measure_into "$majmin" bw "$PWD"; then
          read -r w r _ <<<"$bw"
          printf 'disk %s (%s): writes %s, reads %s (O_DIRECT, %s MiB)\n' "$(disk_name "$majmin")" "$majmin" \
            "$(disk_rate_text "$w")" "$(disk_rate_text "$r")" "${DISK_MEASURE_MIB:-256}"
        else
          gg_log error "disk $majmin: not measured: $DISK_ERROR"
          return 1
        fi
      done
      ;;
  esac
}
