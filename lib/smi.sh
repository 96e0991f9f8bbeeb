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

# Runs nvidia-smi with the given arguments, bounded by SMI_TIMEOUT + 1 s
# whatever it does: `timeout` runs it in its own process group and kills the
# group (TERM, then KILL 1 s later), and its output is read with a deadline,
# so a child that escaped the group (setsid) and still holds the pipe cannot
# keep us waiting either. No temporary file: this works on a full disk.
# The output goes into a variable, not to stdout: a `$(...)` around the call
# would fork the whole shell once more per call (a live cycle makes two),
# so the process substitution that becomes `timeout` is the only fork here.
# Globals:
#   NVIDIA_SMI (command line, may be "ssh node7 nvidia-smi"), SMI_TIMEOUT
# Arguments:
#   $1 name of the variable to receive nvidia-smi's stdout and stderr,
#   merged (it writes errors to stdout), NUL bytes and trailing newlines
#   dropped; the rest: nvidia-smi's arguments
# Returns:
#   nvidia-smi's status; 124 when it timed out; 127 when it is missing
smi_run_into() {
  local -n _smi_run_out=$1
  shift
  local -a _sr_cmd
  read -r -a _sr_cmd <<<"${NVIDIA_SMI:-nvidia-smi}"
  _smi_run_out=''
  if ! smi_available; then
    _smi_run_out="${_sr_cmd[0]}: command not found"
    return 127
  fi
  local _sr_limit=${SMI_TIMEOUT:-10} _sr_fd _sr_pid _sr_chunk _sr_output='' _sr_rc=0 _sr_now _sr_left _sr_timed_out=0 _sr_deadline _sr_frac
  _sr_deadline=${EPOCHREALTIME/[.,]/}
  _sr_deadline=$((_sr_deadline + (_sr_limit + 1) * 1000000))
  local _sr_lock_fd=${GG_LOCK_FD:-1023}
  exec {_sr_fd}< <(exec timeout -k 1 "$_sr_limit" "${_sr_cmd[@]}" "$@" 2>&1 {_sr_lock_fd}>&-)
  _sr_pid=$!
  while :; do
    _sr_now=${EPOCHREALTIME/[.,]/}
    _sr_left=$((_sr_deadline - _sr_now))
    if ((_sr_left <= 0)); then
      _sr_timed_out=1
      break
    fi
    _sr_chunk=''
    printf -v _sr_frac '%06d' $((_sr_left % 1000000))
    # -N: up to 1 MiB at once, NUL bytes dropped (a -d '' read costs a
    # few system calls per byte: 10 ms of CPU for a 64-process list)
    _sr_rc=0
    IFS= read -r -N 1048576 -t "$((_sr_left / 1000000)).$_sr_frac" -u "$_sr_fd" _sr_chunk || _sr_rc=$?
    _sr_output+=$_sr_chunk
    # 0: a full 1 MiB, read on; 1: end of output; above 128: the deadline
    # or a signal (SIGHUP to the daemon), which the deadline check above
    # tells apart
    ((_sr_rc == 0 || _sr_rc > 128)) && continue
    break
  done
  exec {_sr_fd}<&-
  # as `$(...)` did for the callers: no trailing newlines
  while [[ $_sr_output == *$'\n' ]]; do
    _sr_output=${_sr_output%$'\n'}
  done
  _smi_run_out=$_sr_output
  if ((_sr_timed_out)); then
    # timeout(1) leads its group: take the whole group down, then reap it
    kill -KILL -- "-$_sr_pid" 2>/dev/null || kill -KILL "$_sr_pid" 2>/dev/null || true
    wait "$_sr_pid" 2>/dev/null || true
    return 124
  fi
  while :; do
    _sr_rc=0
    wait "$_sr_pid" || _sr_rc=$?
    # a trapped signal interrupts wait (status > 128) while timeout runs on
    ((_sr_rc > 128)) && kill -0 "$_sr_pid" 2>/dev/null && continue
    break
  done
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
  local output rc=0
  smi_run_into output --query-gpu="$SMI_GPU_FIELDS" --format=csv,noheader,nounits || rc=$?
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
  rc=0
  smi_run_into output --query-compute-apps="$SMI_APP_FIELDS" --format=csv,noheader,nounits || rc=$?
  # An unreadable process list leaves SMI_NPROCS at 0 and SMI_APPS_OK at 0:
  # consumers must not read it as "no processes".
  if ((rc != 0)); then
    SMI_ERROR="process list: $(smi_describe_failure "$rc" "$output")"
    smi_forget_apps
  elif ! smi_parse_apps "$output"; then
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

# Reads one value of a GPU line: a placeholder gives '', a device fault
# gives '' and is recorded for the GPU, a number is checked by gg_number_into.
# Arguments:
#   $1 variable for the value, $2 text, $3 int|dec, $4 MIN, $5 MAX,
#   $6 variable collecting the fault text
smi_value_into() {
  local -n _smi_out=$1 _smi_fault=$6
  local _smi_text=$2
  _smi_out=''
  case $_smi_text in
    '' | N/A) return 0 ;;
    '['*']')
      _smi_text=${_smi_text:1:-1}
      [[ $SMI_PLACEHOLDERS == *"|$_smi_text|"* ]] || _smi_fault=${_smi_fault:-$_smi_text}
      return 0
      ;;
  esac
  gg_number_into _smi_out "$_smi_text" "$3" "$4" "$5" || SMI_BAD_VALUES=$((SMI_BAD_VALUES + 1))
  return 0
}

# Parses `--query-gpu` CSV (noheader, nounits) into the SMI_* arrays.
# A GPU line (index, then a UUID or a bracketed fault) with the wrong number
# of fields is truncated (SMI_TRUNCATED); any other line that is not a GPU
# line (a warning, garbage) is skipped; both count in SMI_BAD_LINES. A value
# that is not a valid number in range is unknown (''), counted in
# SMI_BAD_VALUES. A second line for the same GPU is skipped.
# One regular expression a line and no forks: it runs every cycle for every
# GPU.
smi_parse_gpus() {
  local start='^ *([0-9]+), *((GPU|MIG)-[0-9A-Za-z/-]+|\[[^],]*\])'
  local re="$start"', *([^,]*), *([^,]*), *([^,]*), *([^,]*), *([^,]*)(, *(.*))?$'
  local text=${1#$'\xef\xbb\xbf'} line uuid index name fault
  local -a raw lines
  local util used total power limit
  # callers that declare the arrays themselves (tests) may predate these
  declare -gA SMI_NAME SMI_GPU_FAULT
  SMI_TRUNCATED=${SMI_TRUNCATED:-0} SMI_BAD_VALUES=${SMI_BAD_VALUES:-0}
  smi_lines_into lines "$text"
  for line in "${lines[@]}"; do
    line=${line%$'\r'}
    [[ -z ${line//[[:space:]]/} ]] && continue
    if [[ ! $line =~ $re ]]; then
      SMI_BAD_LINES=$((SMI_BAD_LINES + 1))
      [[ $line =~ $start ]] && SMI_TRUNCATED=$((SMI_TRUNCATED + 1))
      continue
    fi
    raw=("${BASH_REMATCH[@]}")
    # trailing spaces of each field
    local i
    for i in 4 5 6 7 8 10; do
      raw[i]=${raw[i]%"${raw[i]##*[![:space:]]}"}
    done
    fault=''
    gg_number_into index "${raw[1]}" int 0 65535 || {
      SMI_BAD_LINES=$((SMI_BAD_LINES + 1))
      continue
    }
    uuid=${raw[2]}
    if [[ $uuid == '['* ]]; then
      # no UUID to key it by: the index stands in, so the fault still shows
      fault=${uuid:1:-1}
      uuid=GPU-index-$index
    fi
    if [[ -n ${SMI_INDEX[$uuid]+set} ]]; then
      SMI_BAD_LINES=$((SMI_BAD_LINES + 1))
      continue
    fi
    smi_value_into total "${raw[6]}" int 1 "$SMI_MAX_MIB" fault
    smi_value_into util "${raw[4]}" dec 0 100 fault
    smi_value_into used "${raw[5]}" int 0 "${total:-$SMI_MAX_MIB}" fault
    smi_value_into power "${raw[7]}" dec 0 "$SMI_MAX_WATTS" fault
    smi_value_into limit "${raw[8]}" dec 0 "$SMI_MAX_WATTS" fault
    name=${raw[10]}
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
  # the line's shape as a pattern, fields by expansion: bash compiles a
  # regular expression at every use (~0.1 ms a line, most of a 64-process
  # sample's parsing), a pattern costs next to nothing
  local shape='*([ ])+([0-9]),\ *,*([^,]),*([ ])@(GPU|MIG)-+([0-9A-Za-z/-])*([ ])'
  local text=${1#$'\xef\xbb\xbf'} line rest pid name mem uuid fault
  local -a lines
  smi_lines_into lines "$text"
  for line in "${lines[@]}"; do
    line=${line%$'\r'}
    [[ -z ${line//[[:space:]]/} ]] && continue
    # shellcheck disable=SC2053 # $shape is a pattern on purpose
    [[ $line == $shape ]] || return 1
    # the last two fields hold no comma: PID, NAME (any text), MiB, UUID
    uuid=${line##*,} rest=${line%,*}
    mem=${rest##*,} rest=${rest%,*}
    pid=${rest%%,*} name=${rest#*, }
    uuid=${uuid#"${uuid%%[! ]*}"} mem=${mem#"${mem%%[! ]*}"} pid=${pid#"${pid%%[! ]*}"}
    uuid=${uuid%"${uuid##*[! ]}"}
    gg_number_into pid "$pid" int 1 "$SMI_MAX_PID" || return 1
    if [[ -z ${SMI_INDEX[$uuid]+set} ]]; then
      # a cut last line can end inside a UUID, which still reads as one
      smi_uuid_is_cut "$uuid" && return 1
      continue
    fi
    mem=${mem%"${mem##*[![:space:]]}"}
    fault=''
    # digits (nearly every line) go straight to the number check, the rest
    # (placeholders, faults) through smi_value_into
    if [[ $mem == +([0-9]) ]]; then
      gg_number_into mem "$mem" int 0 "${SMI_MEM_TOTAL[$uuid]:-$SMI_MAX_MIB}" || SMI_BAD_VALUES=$((SMI_BAD_VALUES + 1))
    else
      smi_value_into mem "$mem" int 0 "${SMI_MEM_TOTAL[$uuid]:-$SMI_MAX_MIB}" fault
    fi
    name=${name//$'\t'/ }
    SMI_NPROCS[$uuid]=$((SMI_NPROCS[$uuid] + 1))
    SMI_PROCS[$uuid]+="${pid}"$'\t'"${name}"$'\t'"${mem}"$'\n'
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
