# shellcheck shell=bash
# shellcheck disable=SC2034 # SMI_* are this module's output, read by idle.sh, leak.sh and textfile.sh
# The one place that runs nvidia-smi. Every call is bounded by
# `timeout -k` (a wedged driver hangs nvidia-smi in D state), output is
# checked by exit status first (nvidia-smi prints its errors on stdout) and
# then line by line; placeholders such as [N/A] become empty values.

# Fields of the per-GPU query, in order. power.draw and power.limit ride along
# in the same call as a second signal: a hung NCCL rank can spin at 100 %
# utilization while drawing idle power. name comes last: the parser accepts
# lines without it (older recordings) and a name may hold commas.
SMI_GPU_FIELDS=index,uuid,utilization.gpu,memory.used,memory.total,power.draw,power.limit,name
SMI_APP_FIELDS=pid,process_name,used_memory,gpu_uuid

# Ranges of the values read, for gg_number_into (the one numeric check):
# anything outside becomes '' (unknown), never a number that could alert.
# 16 TiB of GPU memory, 5 kW of board power, PIDs within pid_t (int32).
SMI_MAX_MIB=16777216
SMI_MAX_WATTS=5000
SMI_MAX_PID=2147483647

# Placeholders nvidia-smi prints for a value it does not have. Any other
# bracketed text in a GPU's line ([GPU requires reset], [Unknown Error],
# [GPU is lost], ...) is a fault of that device, kept in SMI_GPU_FAULT.
SMI_PLACEHOLDERS='|N/A|Not Supported|Insufficient Permissions|Requested functionality has been deprecated|Not Available|'

# The script that runs nvidia-smi under `timeout`, as
#   sh -c SCRIPT sh 0 CMD [ARGS...]          CMD ARGS once, or
#   sh -c SCRIPT sh K QUERY1 [QUERY2] FORMAT CMD
# (K 1 or 2): CMD QUERY1 FORMAT, then CMD QUERY2 FORMAT when the first
# exited 0. It keeps each whole answer and writes it once that command has
# ended, after a header "STATUS BYTES". The commands' output goes to a pipe
# of the script's own, so a child that escaped the process group (setsid)
# and still holds it keeps nobody waiting. Bytes are counted in the C
# locale; the commands run in the caller's.
# shellcheck disable=SC2016 # expanded by that sh, not here
SMI_CAPTURE_SCRIPT='k=$1; shift
answer() {
  out=$("$@" 2>&1); rc=$?
  saved=${LC_ALL-}; was=${LC_ALL+set}; LC_ALL=C; n=${#out}
  if [ -n "$was" ]; then LC_ALL=$saved; else unset LC_ALL; fi
  printf "%d %d\n%s" "$rc" "$n" "$out"
}
if [ "$k" = 0 ]; then answer "$@"; exit 0; fi
q1=$1; q2=; [ "$k" = 2 ] && { q2=$2; shift; }
fmt=$2; shift 2
answer "$@" "$q1" "$fmt"
if [ "$rc" = 0 ] && [ "$k" = 2 ]; then answer "$@" "$q2" "$fmt"; fi
exit 0'

# Starts nvidia-smi through SMI_CAPTURE_SCRIPT under `timeout`, which runs
# it in its own process group and kills the group (TERM, then KILL 1 s
# later) past SMI_TIMEOUT a command. Answers are read with smi_answer_into
# and the run ended with smi_end. No temporary file: this works on a full
# disk; the process substitution that becomes `timeout` is the only fork
# of this shell (a `$(...)` would fork the whole shell once more).
# Globals:
#   NVIDIA_SMI (command line, may be "ssh node7 nvidia-smi"), SMI_TIMEOUT;
#   SMI_RUN_FD, SMI_RUN_PID, SMI_RUN_DEADLINE (set)
# Arguments:
#   0 and nvidia-smi's arguments, or K QUERY1 [QUERY2] FORMAT, as for
#   SMI_CAPTURE_SCRIPT
# Returns:
#   127 when nvidia-smi is missing (nothing started)
smi_start() {
  local -a cmd
  read -r -a cmd <<<"${NVIDIA_SMI:-nvidia-smi}"
  smi_available || return 127
  local limit=${SMI_TIMEOUT:-10} k=$1 lock_fd=${GG_LOCK_FD:-1023}
  local -a words
  if ((k == 0)); then
    words=(0 "${cmd[@]}" "${@:2}")
  else
    words=("$@" "${cmd[@]}")
  fi
  exec {SMI_RUN_FD}< <(exec timeout -k 1 $((limit * (k > 1 ? k : 1))) sh -c "$SMI_CAPTURE_SCRIPT" sh \
    "${words[@]}" 2>/dev/null {lock_fd}>&-)
  SMI_RUN_PID=$!
  SMI_RUN_DEADLINE=${EPOCHREALTIME/[.,]/}
}

# Reads the next answer of the run smi_start began into the variable named
# $1, waiting for its header at most SMI_TIMEOUT + 1 s from the last
# answer (or the start); the answer itself is then read in one call (a
# `read -t` reads a pipe a byte per system call and blocks signals around
# each byte: most of a 64-process sample's cost once).
# Returns:
#   the command's status; 124 when no answer came in time or it was cut
#   (nothing of it is kept; the run is killed)
smi_answer_into() {
  local -n _smi_answer=$1
  local _sa_rc _sa_status='' _sa_size='' _sa_left _sa_frac _sa_deadline
  _smi_answer=''
  _sa_deadline=$((SMI_RUN_DEADLINE + (${SMI_TIMEOUT:-10} + 1) * 1000000))
  while :; do
    _sa_left=${EPOCHREALTIME/[.,]/}
    _sa_left=$((_sa_deadline - _sa_left))
    _sa_rc=142
    ((_sa_left > 0)) || break
    printf -v _sa_frac '%06d' $((_sa_left % 1000000))
    _sa_rc=0
    read -r -t "$((_sa_left / 1000000)).$_sa_frac" -u "$SMI_RUN_FD" _sa_status _sa_size || _sa_rc=$?
    # above 128: the deadline or a signal (SIGHUP to the daemon), which
    # the deadline check above tells apart
    ((_sa_rc > 128)) && continue
    break
  done
  # no header (killed at the deadline, or no time left), or a cut answer
  if ((_sa_rc != 0)) || [[ ! $_sa_status =~ ^[0-9]+$ || ! $_sa_size =~ ^[0-9]+$ ]] ||
    ! gg_read_bytes_into _smi_answer "$SMI_RUN_FD" "$_sa_size"; then
    _smi_answer=''
    smi_end kill
    return 124
  fi
  SMI_RUN_DEADLINE=${EPOCHREALTIME/[.,]/}
  # sh says 127 for a command it cannot find or run
  return "$_sa_status"
}

# Ends the run smi_start began: closes its pipe and reaps `timeout`
# ($1 kill: kills its whole group first).
smi_end() {
  [[ -n ${SMI_RUN_FD:-} ]] || return 0
  exec {SMI_RUN_FD}<&-
  SMI_RUN_FD=''
  if [[ ${1:-} == kill ]]; then
    # timeout(1) leads its group: take the whole group down, then reap it
    kill -KILL -- "-$SMI_RUN_PID" 2>/dev/null || kill -KILL "$SMI_RUN_PID" 2>/dev/null || true
  fi
  local rc
  while :; do
    rc=0
    wait "$SMI_RUN_PID" 2>/dev/null || rc=$?
    # a trapped signal interrupts wait (status > 128) while timeout runs on
    ((rc > 128)) && kill -0 "$SMI_RUN_PID" 2>/dev/null && continue
    break
  done
  return 0
}

# Puts what a shell says of a missing nvidia-smi into the variable named $1.
smi_not_found_into() {
  local -n _smi_nf=$1
  local -a cmd
  read -r -a cmd <<<"${NVIDIA_SMI:-nvidia-smi}"
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  _smi_nf="${cmd[0]}: command not found"
}

# Runs nvidia-smi with the given arguments, bounded by SMI_TIMEOUT + 1 s
# whatever it does.
# Arguments:
#   $1 name of the variable to receive nvidia-smi's stdout and stderr,
#   merged (it writes errors to stdout), NUL bytes and trailing newlines
#   dropped; the rest: nvidia-smi's arguments
# Returns:
#   nvidia-smi's status; 124 when it timed out (nothing of its output is
#   kept then); 127 when it is missing
smi_run_into() {
  local -n _smi_run_out=$1
  shift
  local _sr_rc=0
  _smi_run_out=''
  if ! smi_start 0 "$@"; then
    smi_not_found_into _smi_run_out
    return 127
  fi
  smi_answer_into _smi_run_out || _sr_rc=$?
  smi_end
  return "$_sr_rc"
}

# smi_run_into for callers that want the output on stdout (doctor).
# Arguments:
#   nvidia-smi's arguments
smi_run() {
  local out rc=0
  smi_run_into out "$@" || rc=$?
  printf '%s' "$out"
  return "$rc"
}

# True when the command of NVIDIA_SMI (its first word: it may be
# "ssh node7 nvidia-smi") can be run.
smi_available() {
  local -a cmd
  read -r -a cmd <<<"${NVIDIA_SMI:-nvidia-smi}"
  command -v -- "${cmd[0]}" >/dev/null 2>&1
}

# Describes a failed call in one line, for logs and monitor_degraded events.
smi_describe_failure() {
  local rc=$1 output=$2 first
  first=${output%%$'\n'*}
  first=${first:0:160}
  case $rc in
    124 | 137) printf 'nvidia-smi timed out after %ss (driver wedged?)' "${SMI_TIMEOUT:-10}" ;;
    127) printf 'nvidia-smi not found (%s)' "$first" ;;
    *) printf 'nvidia-smi exited %s: %s' "$rc" "${first:-no output}" ;;
  esac
}

# Declares (empty) every SMI_* output of smi_sample.
smi_reset() {
  declare -ga SMI_UUIDS=()
  declare -gA SMI_INDEX=() SMI_UTIL=() SMI_MEM_USED=() SMI_MEM_TOTAL=() \
  SMI_POWER=() SMI_POWER_LIMIT=() SMI_NAME=() SMI_GPU_FAULT=() SMI_NPROCS=() \
  SMI_PROCS=() SMI_PIDS_MEM=() SMI_PID_UUIDS=()
  SMI_BAD_LINES=0
  SMI_TRUNCATED=0
  SMI_BAD_VALUES=0
  SMI_APPS_OK=0
  SMI_ERROR=''
}

# Forgets the process list of the last sample (unread or garbage): every GPU
# then has 0 processes and SMI_APPS_OK stays 0, so consumers know.
smi_forget_apps() {
  local uuid
  declare -gA SMI_PIDS_MEM=() SMI_PID_UUIDS=()
  for uuid in "${SMI_UUIDS[@]}"; do
    SMI_NPROCS[$uuid]=0
    SMI_PROCS[$uuid]=''
  done
}

# Samples every GPU with at most two nvidia-smi calls, whatever the GPU count.
# Globals (set):
#   SMI_UUIDS (array, in index order); SMI_INDEX, SMI_UTIL, SMI_MEM_USED,
#   SMI_MEM_TOTAL, SMI_POWER, SMI_POWER_LIMIT, SMI_NAME (assoc, by UUID;
#   "" = unknown: a placeholder, a fault or a value out of range, never 0);
#   SMI_GPU_FAULT (assoc, by UUID: '' or the device fault nvidia-smi printed
#   in that GPU's line, e.g. "GPU requires reset"); SMI_NPROCS (assoc, by
#   UUID); SMI_PROCS (assoc, by UUID: lines "pid<TAB>name<TAB>MiB");
#   SMI_PIDS_MEM (assoc, by PID: MiB summed over GPUs); SMI_PID_UUIDS;
#   SMI_APPS_OK (1 when this cycle's process list was read and parsed);
#   SMI_BAD_LINES (lines skipped as unparseable); SMI_ERROR (why it failed)
# Returns:
#   0 when the GPU query succeeded and gave at least one GPU line and no
#   truncated one (a GPU missing from a sample must not read as released)
smi_sample() {
  smi_reset
  local output apps_output rc=0 apps_rc=0
  # both queries in one run (one fork, one `timeout`, one sh): the process
  # list is asked for only when the GPU query exited 0, and each has its
  # own deadline
  if smi_start 2 --query-gpu="$SMI_GPU_FIELDS" --query-compute-apps="$SMI_APP_FIELDS" \
    --format=csv,noheader,nounits; then
    smi_answer_into output || rc=$?
    if ((rc == 0)); then
      smi_answer_into apps_output || apps_rc=$?
    fi
    smi_end
  else
    rc=127
    smi_not_found_into output
  fi
  if ((rc != 0)); then
    SMI_ERROR=$(smi_describe_failure "$rc" "$output")
    return 1
  fi
  smi_parse_gpus "$output"
  if ((SMI_TRUNCATED > 0)); then
    SMI_ERROR="nvidia-smi printed ${SMI_TRUNCATED} truncated GPU line(s)"
    return 1
  fi
  if ((${#SMI_UUIDS[@]} == 0)); then
    SMI_ERROR="nvidia-smi printed no valid GPU line (${SMI_BAD_LINES} unparseable)"
    return 1
  fi
  # An unreadable process list leaves SMI_NPROCS at 0 and SMI_APPS_OK at 0:
  # consumers must not read it as "no processes".
  if ((apps_rc != 0)); then
    SMI_ERROR="process list: $(smi_describe_failure "$apps_rc" "$apps_output")"
    smi_forget_apps
  elif ! smi_parse_apps "$apps_output"; then
    SMI_ERROR="process list: unparseable output"
    smi_forget_apps
  else
    SMI_APPS_OK=1
  fi
  return 0
}

# Splits text into its non-empty lines, into the array named $1. One word
# split instead of a `read` per line from a here-string: bash reads a pipe
# a byte per system call, which was most of the parsing's CPU.
# Arguments:
#   $1 array variable, $2 text
smi_lines_into() {
  local -n _smi_lines=$1
  # no globbing of the lines (local -: the option comes back on return)
  local - IFS=$'\n'
  set -f
  # shellcheck disable=SC2206 # splitting at newlines is the point
  _smi_lines=($2)
}

# Splits a line at its commas into the array named $1 (globs not expanded,
# empty fields kept).
smi_fields_into() {
  local -n _smi_fields=$1
  local - IFS=,
  set -f
  # shellcheck disable=SC2206 # splitting at commas is the point
  _smi_fields=($2)
}

# Reads one value of a GPU line: a placeholder gives '', a device fault
# gives '' and is recorded for the GPU, a number is checked by gg_number_into.
# Kept small (bash copies a function's body at every call) with the
# bracketed texts in smi_bracket_into.
# Arguments:
#   $1 variable for the value, $2 text, $3 int|dec, $4 MIN, $5 MAX,
#   $6 variable collecting the fault text
smi_value_into() {
  case $2 in
    '' | N/A | '['*']') smi_bracket_into "$1" "$2" "$6" ;;
    *) gg_number_into "$1" "$2" "$3" "$4" "$5" || SMI_BAD_VALUES=$((SMI_BAD_VALUES + 1)) ;;
  esac
  return 0
}

# smi_value_into for a text that is no number: empty, N/A or bracketed (a
# placeholder, or a device fault recorded in the variable named $3).
smi_bracket_into() {
  local -n _smi_out=$1 _smi_fault=$3
  local _smi_text=$2
  _smi_out=''
  if [[ $_smi_text == '['*']' ]]; then
    _smi_text=${_smi_text:1:-1}
    [[ $SMI_PLACEHOLDERS == *"|$_smi_text|"* ]] || _smi_fault=${_smi_fault:-$_smi_text}
  fi
}

# Parses `--query-gpu` CSV (noheader, nounits) into the SMI_* arrays.
# A GPU line (index, then a UUID or a bracketed fault) with the wrong number
# of fields is truncated (SMI_TRUNCATED); any other line that is not a GPU
# line (a warning, garbage) is skipped; both count in SMI_BAD_LINES. A value
# that is not a valid number in range is unknown (''), counted in
# SMI_BAD_VALUES. A second line for the same GPU is skipped.
# Lines are split at commas by the shell in one step and each field is
# checked by a pattern (a regular expression a line cost three times as
# much); no forks: it runs every cycle for every GPU.
smi_parse_gpus() {
  local text=${1#$'\xef\xbb\xbf'} line uuid index name fault nfields joined i
  local -a raw lines
  local util used total power limit
  # callers that declare the arrays themselves (tests) may predate these
  declare -gA SMI_NAME SMI_GPU_FAULT
  SMI_TRUNCATED=${SMI_TRUNCATED:-0} SMI_BAD_VALUES=${SMI_BAD_VALUES:-0}
  smi_lines_into lines "$text"
  for line in "${lines[@]}"; do
    line=${line%$'\r'}
    [[ $line == *[![:space:]]* ]] || continue
    # index, uuid, five values and the name (which may hold commas); the
    # index and uuid end at their comma, the other fields lose the blanks
    # around them
    smi_fields_into raw "$line"
    # the split drops an empty last field
    nfields=${#raw[@]}
    [[ $line == *, ]] && nfields=$((nfields + 1))
    if [[ ${raw[0]} != *( )+([0-9]) || ${raw[1]} != *( )@(@(GPU|MIG)-+([0-9A-Za-z/-])|\[*([!],])\]) ]]; then
      SMI_BAD_LINES=$((SMI_BAD_LINES + 1))
      continue
    fi
    if ((nfields < 7)); then
      SMI_BAD_LINES=$((SMI_BAD_LINES + 1)) SMI_TRUNCATED=$((SMI_TRUNCATED + 1))
      continue
    fi
    name=''
    if ((nfields > 7)); then
      # the name is all that follows the seventh comma
      printf -v name '%s,' "${raw[@]:0:7}"
      name=${line:${#name}}
    fi
    raw[7]=$name
    # nvidia-smi puts one blank after each comma; other blanks around the
    # fields (rare) are trimmed one field at a time
    raw=("${raw[@]:0:8}")
    raw=("${raw[@]# }")
    printf -v joined ',%s,' "${raw[@]}"
    if [[ $joined == *[[:space:]],* || $joined == *,[[:space:]]* ]]; then
      for ((i = 0; i < 8; i++)); do
        raw[i]=${raw[i]#"${raw[i]%%[! ]*}"}
        raw[i]=${raw[i]%"${raw[i]##*[![:space:]]}"}
      done
    fi
    fault=''
    gg_number_into index "${raw[0]}" int 0 65535 || {
      SMI_BAD_LINES=$((SMI_BAD_LINES + 1))
      continue
    }
    uuid=${raw[1]}
    if [[ $uuid == '['* ]]; then
      # no UUID to key it by: the index stands in, so the fault still shows
      fault=${uuid:1:-1}
      uuid=GPU-index-$index
    fi
    if [[ -n ${SMI_INDEX[$uuid]+set} ]]; then
      SMI_BAD_LINES=$((SMI_BAD_LINES + 1))
      continue
    fi
    smi_value_into total "${raw[4]}" int 1 "$SMI_MAX_MIB" fault
    smi_value_into util "${raw[2]}" dec 0 100 fault
    smi_value_into used "${raw[3]}" int 0 "${total:-$SMI_MAX_MIB}" fault
    smi_value_into power "${raw[5]}" dec 0 "$SMI_MAX_WATTS" fault
    smi_value_into limit "${raw[6]}" dec 0 "$SMI_MAX_WATTS" fault
    name=${raw[7]}
    case $name in
      '[N/A]' | N/A) name='' ;;
      '['*']')
        [[ $SMI_PLACEHOLDERS == *"|${name:1:-1}|"* ]] || fault=${fault:-${name:1:-1}}
        name=''
        ;;
    esac
    SMI_UUIDS+=("$uuid")
    SMI_INDEX[$uuid]=$index
    SMI_UTIL[$uuid]=$util
    SMI_MEM_USED[$uuid]=$used
    SMI_MEM_TOTAL[$uuid]=$total
    SMI_POWER[$uuid]=$power
    SMI_POWER_LIMIT[$uuid]=$limit
    SMI_NAME[$uuid]=${name//$'\t'/ }
    SMI_GPU_FAULT[$uuid]=$fault
    SMI_NPROCS[$uuid]=0
    SMI_PROCS[$uuid]=''
  done
}

# Parses `--query-compute-apps=pid,process_name,used_memory,gpu_uuid` CSV.
# The name is what lies between the first and the last two fields, since
# older drivers do not replace commas in process names. Processes on GPUs
# not in the GPU sample are ignored; memory out of range is unknown ('').
# Returns:
#   1 when any non-empty line is not a process line (garbage, truncated,
#   also inside the UUID)
smi_parse_apps() {
  local text=${1#$'\xef\xbb\xbf'} line rest head pid name mem uuid fault total
  local -a lines
  smi_lines_into lines "$text"
  # Each field is cut by expansion and checked on its own: a whole-line
  # pattern or a regular expression cost several times as much, and this
  # runs for every process every cycle.
  for line in "${lines[@]}"; do
    line=${line%$'\r'}
    [[ $line == *[![:space:]]* ]] || continue
    # the last two fields hold no comma: PID, NAME (any text), MiB, UUID.
    # Cut from the end by length (${line##*,} would try every prefix).
    head=${line%,*}
    uuid=${line:${#head}+1}
    rest=${head%,*}
    mem=${head:${#rest}+1}
    pid=${rest%%,*} name=${rest:${#pid}+1}
    # the PID's comma is followed by a blank
    [[ $name == ' '* ]] || return 1
    name=${name:1}
    # blanks around the fields: nvidia-smi puts one after each comma; the
    # full trim is for anything else
    uuid=${uuid# } mem=${mem# }
    if [[ $uuid == *[[:space:]]* || $mem == *[[:space:]]* || $pid == *[[:space:]]* ]]; then
      uuid=${uuid#"${uuid%%[! ]*}"} mem=${mem#"${mem%%[! ]*}"} pid=${pid#"${pid%%[! ]*}"}
      uuid=${uuid%"${uuid##*[! ]}"} mem=${mem%"${mem##*[![:space:]]}"} pid=${pid%"${pid##*[! ]}"}
    fi
    [[ $uuid == @(GPU|MIG)-+([0-9A-Za-z/-]) ]] || return 1
    # a PID of up to 9 digits is within pid_t; longer ones get the full check
    if [[ $pid != [1-9]*([0-9]) ]] || ((${#pid} > 9)); then
      gg_number_into pid "$pid" int 1 "$SMI_MAX_PID" || return 1
    fi
    if [[ -z ${SMI_INDEX[$uuid]+set} ]]; then
      # a cut last line can end inside a UUID, which still reads as one
      smi_uuid_is_cut "$uuid" && return 1
      continue
    fi
    total=${SMI_MEM_TOTAL[$uuid]:-$SMI_MAX_MIB}
    # plain MiB below the GPU's total (nearly every line) needs no call;
    # placeholders, faults and anything else go through smi_value_into
    if [[ $mem != [1-9]*([0-9]) ]] || ((${#mem} > 9 || mem > total)); then
      fault=''
      smi_value_into mem "$mem" int 0 "$total" fault
    fi
    SMI_NPROCS[$uuid]=$((SMI_NPROCS[$uuid] + 1))
    SMI_PROCS[$uuid]+="${pid}"$'\t'"${name//$'\t'/ }"$'\t'"${mem}"$'\n'
    SMI_PIDS_MEM[$pid]=$((${SMI_PIDS_MEM[$pid]:-0} + ${mem:-0}))
    SMI_PID_UUIDS[$pid]+="${SMI_PID_UUIDS[$pid]:+ }$uuid"
  done
  return 0
}

# True when a UUID is the start of, but not the whole, UUID of a GPU in
# the sample: the process list was cut short (a partial read).
# Arguments:
#   $1 the UUID as read
smi_uuid_is_cut() {
  local known
  for known in "${!SMI_INDEX[@]}"; do
    [[ $known != "$1" && $known == "$1"* ]] && return 0
  done
  return 1
}

# Asks for the facts doctor reports, one line per GPU:
# "index, name, driver_version, mig.mode.current, persistence_mode".
# Outputs:
#   the CSV lines; returns nvidia-smi's status
smi_query_info() {
  smi_run --query-gpu=index,name,driver_version,mig.mode.current,persistence_mode \
    --format=csv,noheader
}
