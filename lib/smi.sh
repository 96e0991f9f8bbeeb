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

# The separator of SMI_PROCS's lines "PID NAME MiB". Not a tab: tab is blank
# to `read`, so two in a row (an empty name, as npu-smi and some nvidia-smi
# print it) became one and the memory was read as the name. `IFS=$SMI_FS
# read -r pid name mem` keeps empty fields.
SMI_FS=$'\x1f'

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
  smi_reap "$SMI_RUN_PID"
}

# Waits for child PID to end. A trapped signal interrupts wait (status >
# 128) while the child runs on: wait again then.
smi_reap() {
  local rc
  while :; do
    rc=0
    wait "$1" 2>/dev/null || rc=$?
    ((rc > 128)) && kill -0 "$1" 2>/dev/null && continue
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
# "ssh node7 nvidia-smi") can be run; $1, when given, is another device
# tool's command line (lib/npu.sh: NPU_SMI).
smi_available() {
  local -a cmd
  read -r -a cmd <<<"${1:-${NVIDIA_SMI:-nvidia-smi}}"
  command -v -- "${cmd[0]}" >/dev/null 2>&1
}

# Describes a failed call in one line, for logs and monitor_degraded events.
# The tool's own text is made printable here, once: it reaches terminals,
# logs, events.jsonl, status --json and chat, and a failing tool (or
# NVIDIA_SMI="ssh node7 nvidia-smi") can print escape sequences or bytes
# that are not UTF-8.
# Arguments:
#   $1 exit status, $2 output, $3 the tool's name (nvidia-smi when empty)
smi_describe_failure() {
  local rc=$1 output=$2 tool=${3:-nvidia-smi} first
  first=${output%%$'\n'*}
  # cut before the cleaning (bounded work on a huge line) and after it (an
  # escape shown as \e is two characters)
  gg_cut_into first "$first" 160
  gg_printable_into first "$first"
  gg_cut_into first "$first" 160
  case $rc in
    124 | 137) printf '%s timed out after %ss (driver wedged?)' "$tool" "${SMI_TIMEOUT:-10}" ;;
    127) printf '%s not found (%s)' "$tool" "$first" ;;
    *) printf '%s exited %s: %s' "$tool" "$rc" "${first:-no output}" ;;
  esac
}

# Declares (empty) every SMI_* output of smi_sample.
smi_reset() {
  declare -ga SMI_UUIDS=()
  declare -gA SMI_INDEX=() SMI_UTIL=() SMI_MEM_USED=() SMI_MEM_TOTAL=() \
  SMI_POWER=() SMI_POWER_LIMIT=() SMI_NAME=() SMI_GPU_FAULT=() SMI_BAD_VALUE=() SMI_NPROCS=() \
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

# Samples every GPU: from the resident loop-mode streams when a daemon
# asked for them (smi_stream_begin) and they give a sound sample, else with
# the one-shot calls of smi_sample_once. Outputs as smi_sample_once;
# SMI_SOURCE says which ("stream" or "once").
smi_sample() {
  if ((${SMI_STREAM_WANTED:-0})); then
    smi_stream_sample && return 0
    SMI_SOURCE=once
    smi_sample_once || return
    smi_stream_after_once
    return 0
  fi
  SMI_SOURCE=once
  smi_sample_once
}

# Samples every GPU with at most two nvidia-smi calls, whatever the GPU count.
# Globals (set):
#   SMI_UUIDS (array, in index order); SMI_INDEX, SMI_UTIL, SMI_MEM_USED,
#   SMI_MEM_TOTAL, SMI_POWER, SMI_POWER_LIMIT, SMI_NAME (assoc, by UUID;
#   "" = unknown: a placeholder, a fault or a value out of range, never 0);
#   SMI_GPU_FAULT (assoc, by UUID: '' or the device fault nvidia-smi printed
#   in that GPU's line, e.g. "GPU requires reset"); SMI_BAD_VALUE (assoc,
#   by UUID: '' or the values of that GPU's line out of their range, e.g.
#   "utilization.gpu 250 (expected 0-100)"); SMI_NPROCS (assoc, by
#   UUID: distinct PIDs); SMI_PROCS (assoc, by UUID: lines
#   "pid<SMI_FS>name<SMI_FS>MiB", one per PID, name and MiB may be '');
#   SMI_PIDS_MEM (assoc, by PID: MiB summed over GPUs); SMI_PID_UUIDS;
#   SMI_APPS_OK (1 when this cycle's process list was read and parsed);
#   SMI_BAD_LINES (lines skipped as unparseable); SMI_ERROR (why it failed)
# Returns:
#   0 when the GPU query succeeded and gave at least one GPU line and no
#   truncated one (a GPU missing from a sample must not read as released)
smi_sample_once() {
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
  smi_take_apps "$apps_rc" "$apps_output"
  return 0
}

# Puts one line naming each GPU of the sample that read values out of
# their range, and those values, into the variable named $1.
# Returns:
#   1 when no GPU did
smi_bad_values_into() {
  local -n _smi_bv=$1
  local uuid
  _smi_bv=''
  for uuid in "${SMI_UUIDS[@]}"; do
    [[ -n ${SMI_BAD_VALUE[$uuid]:-} ]] || continue
    _smi_bv+="${_smi_bv:+; }GPU ${SMI_INDEX[$uuid]} ($uuid): ${SMI_BAD_VALUE[$uuid]}"
  done
  [[ -n $_smi_bv ]] || return 1
  _smi_bv="nvidia-smi read values out of range: $_smi_bv"
}

# Reads a process list answer into the sample. An unreadable one leaves
# SMI_NPROCS at 0 and SMI_APPS_OK at 0: consumers must not read it as "no
# processes".
# Arguments:
#   $1 the call's status, $2 its output
smi_take_apps() {
  if (($1 != 0)); then
    SMI_ERROR="process list: $(smi_describe_failure "$1" "$2")"
    smi_forget_apps
  elif ! smi_parse_apps "$2"; then
    SMI_ERROR="process list: unparseable output"
    smi_forget_apps
  else
    SMI_APPS_OK=1
  fi
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
#   $6 variable collecting the fault text; for a GPU's value also $7
#   variable collecting the values out of range, $8 the field's name
smi_value_into() {
  case $2 in
    '' | N/A | '['*']') smi_bracket_into "$1" "$2" "$6" ;;
    *) gg_number_into "$1" "$2" "$3" "$4" "$5" || smi_bad_value "$2" "$4" "$5" "${@:7}" ;;
  esac
  return 0
}

# Counts a value that is no number in its range (SMI_BAD_VALUES) and, given
# a variable and a field's name, adds what was read to that variable for
# the log ("utilization.gpu 250 (expected 0-100)").
# Arguments:
#   $1 text, $2 MIN, $3 MAX, [$4 variable, $5 field name]
smi_bad_value() {
  SMI_BAD_VALUES=$((SMI_BAD_VALUES + 1))
  [[ -n ${4:-} ]] || return 0
  local -n _smi_bad=$4
  local text=${1:0:40}
  _smi_bad+="${_smi_bad:+, }$5 ${text//[![:print:]]/?} (expected $2-$3)"
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
# SMI_BAD_VALUES. A second line for the same GPU is skipped. A line whose
# UUID reads as a fault ("[GPU is lost]") is keyed by the UUID last read at
# its index (SMI_UUID_AT), unless that GPU reads under another index in the
# same sample; else by GPU-index-N.
# Lines are split at commas by the shell in one step and each field is
# checked by a pattern (a regular expression a line cost three times as
# much); no forks: it runs every cycle for every GPU.
smi_parse_gpus() {
  local text=$1 line uuid index name fault bad nfields joined i
  # a byte order mark: looked for at the start alone; ${1#BOM} on the
  # whole answer tries every prefix (18 ms on 30 kB in a UTF-8 locale)
  [[ $text == $'\xef\xbb\xbf'* ]] && text=${text#$'\xef\xbb\xbf'}
  local -a raw lines lost=()
  local util used total power limit
  # callers that declare the arrays themselves (tests) may predate these;
  # SMI_UUID_AT outlives a sample (never reset)
  declare -gA SMI_NAME SMI_GPU_FAULT SMI_BAD_VALUE SMI_UUID_AT
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
      # (smi_key_lost gives it the UUID known at that index, if any)
      fault=${uuid:1:-1}
      uuid=GPU-index-$index
      lost+=("$index")
    else
      SMI_UUID_AT[$index]=$uuid
    fi
    if [[ -n ${SMI_INDEX[$uuid]+set} ]]; then
      SMI_BAD_LINES=$((SMI_BAD_LINES + 1))
      continue
    fi
    bad=''
    smi_value_into total "${raw[4]}" int 1 "$SMI_MAX_MIB" fault bad memory.total
    smi_value_into util "${raw[2]}" dec 0 100 fault bad utilization.gpu
    smi_value_into used "${raw[3]}" int 0 "${total:-$SMI_MAX_MIB}" fault bad memory.used
    smi_value_into power "${raw[5]}" dec 0 "$SMI_MAX_WATTS" fault bad power.draw
    smi_value_into limit "${raw[6]}" dec 0 "$SMI_MAX_WATTS" fault bad power.limit
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
    SMI_BAD_VALUE[$uuid]=$bad
    SMI_NPROCS[$uuid]=0
    SMI_PROCS[$uuid]=''
  done
  for index in "${lost[@]}"; do
    smi_key_lost "$index"
  done
  return 0
}

# Keys the GPU line of index $1, whose UUID read as a fault, by the UUID
# last read at that index (SMI_UUID_AT, which a watchdog keeps across runs),
# so that its incident is the GPU's own and resolves when that GPU reads
# fine again. Not when that GPU reads under another index in this sample:
# the indices moved, and a fault must not be put on a GPU that is fine.
smi_key_lost() {
  local old=GPU-index-$1 new=${SMI_UUID_AT[$1]:-} i
  [[ -n $new && -z ${SMI_INDEX[$new]+set} && -n ${SMI_INDEX[$old]+set} ]] || return 0
  local -n _kl
  for _kl in SMI_INDEX SMI_UTIL SMI_MEM_USED SMI_MEM_TOTAL SMI_POWER SMI_POWER_LIMIT SMI_NAME SMI_GPU_FAULT \
    SMI_BAD_VALUE SMI_NPROCS SMI_PROCS; do
    # shellcheck disable=SC2004 # _kl names associative arrays: the keys are UUIDs
    _kl[$new]=${_kl[$old]}
    unset "_kl[$old]"
  done
  for i in "${!SMI_UUIDS[@]}"; do
    [[ ${SMI_UUIDS[i]} == "$old" ]] && SMI_UUIDS[i]=$new
  done
  return 0
}

# Parses `--query-compute-apps=pid,process_name,used_memory,gpu_uuid` CSV.
# The name is what lies between the first and the last two fields, since
# older drivers do not replace commas in process names. Processes on GPUs
# not in the GPU sample are ignored; memory out of range is unknown ('').
# Returns:
#   1 when any non-empty line is not a process line (garbage, truncated,
#   also inside the UUID)
smi_parse_apps() {
  local text=$1 line rest head pid name mem uuid fault total
  # a byte order mark: looked for at the start alone; ${1#BOM} on the
  # whole answer tries every prefix (18 ms on 30 kB in a UTF-8 locale)
  [[ $text == $'\xef\xbb\xbf'* ]] && text=${text#$'\xef\xbb\xbf'}
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
    smi_proc_add "$uuid" "$pid" "$name" "$mem"
  done
  return 0
}

# Adds one line of a device's process list to the sample: the one writer
# of SMI_PROCS's lines, for nvidia-smi (smi_parse_apps) and npu-smi
# (npu_process_row). A PID already listed on the device is merged into its
# line (smi_proc_merge); else a new line "PID<SMI_FS>NAME<SMI_FS>MiB", a
# tab or the separator in the name a space (as in every text and file
# gpuguard writes of it), and the per-PID sums.
# Arguments:
#   $1 device key, $2 PID, $3 name ('' none), $4 MiB ('' unknown)
smi_proc_add() {
  local name=${3//$'\t'/ }
  if [[ -n ${SMI_PID_UUIDS[$2]:-} && " ${SMI_PID_UUIDS[$2]} " == *" $1 "* ]]; then
    smi_proc_merge "$1" "$2" "$4"
    return 0
  fi
  SMI_NPROCS[$1]=$((SMI_NPROCS[$1] + 1))
  SMI_PROCS[$1]+="$2$SMI_FS${name//$SMI_FS/ }$SMI_FS$4"$'\n'
  SMI_PIDS_MEM[$2]=$((${SMI_PIDS_MEM[$2]:-0} + ${4:-0}))
  SMI_PID_UUIDS[$2]+="${SMI_PID_UUIDS[$2]:+ }$1"
}

# Adds the memory of a second line for a PID already listed on a device
# (nvidia-smi lists a process once per context: two MIG instances of one
# GPU carry the GPU's UUID) to its line, so each PID is one holder, one
# status row and one metric series (node_exporter rejects a textfile with
# two series of the same labels). Memory unknown in both stays unknown.
# Arguments:
#   $1 device UUID, $2 PID, $3 its MiB on this line ('' unknown)
smi_proc_merge() {
  local uuid=$1 pid=$2 mem=$3 line merged='' old
  while IFS= read -r line; do
    [[ -n $line ]] || continue
    if [[ $line == "$pid$SMI_FS"* ]]; then
      old=${line##*"$SMI_FS"}
      [[ -z $old && -z $mem ]] || old=$((${old:-0} + ${mem:-0}))
      line=${line%"$SMI_FS"*}$SMI_FS$old
    fi
    merged+=$line$'\n'
  done <<<"${SMI_PROCS[$uuid]}"
  SMI_PROCS[$uuid]=$merged
  SMI_PIDS_MEM[$pid]=$((${SMI_PIDS_MEM[$pid]:-0} + ${mem:-0}))
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

# ---------------------------------------------------------------------------
# Resident streams. Starting nvidia-smi costs 20-27 ms of CPU on an H200; in
# its loop mode (-lms) one more sample costs about 1 ms. A daemon that
# watches every few seconds therefore keeps two loops running, one for
# --query-gpu and one for --query-compute-apps, each prefixed with the
# `timestamp` field, and reads their lines as they come. Loop mode prints no
# separator between samples (a header, when asked for, once at the start)
# and nothing at all for a sample of an empty process list, so:
#   - a GPU block ends when the next line's index does not grow, or when it
#     holds as many lines as the last one-shot sample had GPUs;
#   - process lines belong together when their timestamps lie within half
#     an interval; the block used is the one within SMI_STREAM_SKEW_MS of
#     the GPU block's timestamp (further apart is desynchronised);
#   - no process block for that moment reads as "no processes" only while
#     every GPU's memory.used is at most SMI_STREAM_EMPTY_MIB or unchanged
#     since a one-shot process list said so; otherwise the cycle asks the
#     one-shot way.
# A stream that stalls past SMI_TIMEOUT + 1 s, ends, prints garbage or
# desynchronises is killed with its process group and restarted after a
# back-off (2 s doubling to SMI_STREAM_BACKOFF_MAX); the cycle falls back to
# smi_sample_once meanwhile, so every fault the one-shot path handles keeps
# its handling. Each stream runs in its own session (setsid) under a small
# sh that ends the whole group when nvidia-smi exits or when the daemon is
# gone (tail --pid checks once a second), so a daemon killed with -9
# leaves no loop behind.

# Above this interval (seconds) the one-shot calls cost less than the
# samples a loop prints between two cycles, and a loop's last sample could
# be an interval old: daemons slower than this sample the one-shot way.
SMI_STREAM_MAX_INTERVAL=10
SMI_STREAM_SKEW_MS=250
# A process block is whole once no line of it came for this long (loop
# mode has no end-of-sample mark; a sample's lines come within a few ms).
SMI_STREAM_QUIET_MS=150
SMI_STREAM_EMPTY_MIB=16
SMI_STREAM_BACKOFF_MAX=300
# A loop's buffer past this many bytes (a flood of garbage) is a fault.
SMI_STREAM_MAX_BYTES=1048576
# nvidia-smi's timestamp field: "2026/12/02 10:15:08.487" (23 characters)
SMI_TS_GLOB='[0-9][0-9][0-9][0-9]/[0-9][0-9]/[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9].[0-9][0-9][0-9]'

# The wrapper of one stream, as `setsid sh -c SCRIPT sh DAEMON_PID CMD...`:
# a watcher ends the process group once the daemon is gone, and the group
# ends with nvidia-smi (kill 0: the group of this session leader). Each line
# comes framed: STX (byte 2, which no line holds: control bytes become '?'),
# six digits (its length with the newline), the line. A frame is built whole
# and printed with one printf of one string, so it leaves awk in one write
# of at most 4008 bytes, under PIPE_BUF, which a pipe hands over whole: once
# a frame's first byte can be read, all of it can (mawk -W interactive
# writes each piece of a printf format apart, three writes a frame). bash
# then reads exact byte counts without a timeout. (A read with -t or one
# of a line goes a byte per system call; a read -N with -t that times out
# can keep bytes in bash's input buffer that the next read of any other fd
# then returns.) NUL bytes are dropped (bash drops them and the count would
# be off), a line is cut at 4000 bytes. mawk reads a pipe in blocks unless
# told -W interactive (SMI_AWK, set by smi_stream_begin, travels in the
# environment of that sh only).
# shellcheck disable=SC2016 # expanded by that sh, not here
SMI_STREAM_SCRIPT='parent=$1; shift
{ tail -s 1 --pid="$parent" -f /dev/null; kill -KILL 0; } </dev/null >/dev/null 2>&1 &
"$@" </dev/null | LC_ALL=C $SMI_AWK "{ gsub(/\000/, \"\"); gsub(/[\001-\010\013\014\016-\037\177]/, \"?\")
  \$0 = substr(\$0, 1, 4000); printf \"%s\", sprintf(\"\\002%06d%s\\n\", length(\$0) + 1, \$0); fflush() }"
kill -KILL 0'

# Asks for resident streams, or for none. Called by a daemon before its
# first cycle and after each configuration reload: a changed NVIDIA_SMI or
# interval restarts the streams (at the next sample).
# Globals:
#   SMI_STREAM (config, 1 on), NVIDIA_SMI; SMI_STREAM_WANTED (set)
# Arguments:
#   $1 the daemon's interval between cycles, seconds
smi_stream_begin() {
  local interval=$1 want=${NVIDIA_SMI:-nvidia-smi}
  if [[ ${SMI_STREAM:-1} != 1 ]] || ((interval > SMI_STREAM_MAX_INTERVAL)) ||
    ! command -v setsid >/dev/null 2>&1 || ! command -v tail >/dev/null 2>&1 ||
    ! command -v awk >/dev/null 2>&1; then
    smi_stream_end
    return 0
  fi
  if ((${SMI_STREAM_WANTED:-0})) && [[ $SMI_STREAM_CMD == "$want" ]] && ((SMI_STREAM_MS == interval * 1000)); then
    return 0
  fi
  smi_stream_stop
  SMI_STREAM_AWK='awk'
  [[ $(awk -W version 2>&1 </dev/null) == mawk* ]] && SMI_STREAM_AWK='awk -W interactive'
  SMI_STREAM_WANTED=1 SMI_STREAM_CMD=$want SMI_STREAM_MS=$((interval * 1000))
  SMI_STREAM_RETRY_AT=0 SMI_STREAM_BACKOFF=0 SMI_STREAM_FAILS=0 SMI_STREAM_GOOD=0
  SMI_STREAM_NGPU=0 SMI_STREAM_ERROR='' SMI_STREAM_EMPTY_SIG=''
}

# Stops the streams for good (a daemon's exit).
smi_stream_end() {
  smi_stream_stop
  SMI_STREAM_WANTED=0
}

# After a one-shot sample in stream mode: keeps its GPU count for the
# stream's blocks and starts the streams when they are down and the back-off
# has passed.
smi_stream_after_once() {
  SMI_STREAM_NGPU=${#SMI_UUIDS[@]}
  [[ -z ${SMI_SG_PID:-} ]] || return 0
  ((${EPOCHREALTIME/[.,]/} >= SMI_STREAM_RETRY_AT)) || return 0
  smi_available || return 0
  smi_stream_start
}

# Starts both loops, each on a pipe of this shell. The lock of the daemon
# and the other stream's pipe are not passed on.
smi_stream_start() {
  local -a cmd
  local parent=$BASHPID lock_fd=${GG_LOCK_FD:-1023} ms=$SMI_STREAM_MS
  read -r -a cmd <<<"$SMI_STREAM_CMD"
  exec {SMI_SG_FD}< <(SMI_AWK=$SMI_STREAM_AWK exec setsid sh -c "$SMI_STREAM_SCRIPT" sh "$parent" "${cmd[@]}" \
    --query-gpu="timestamp,$SMI_GPU_FIELDS" --format=csv,noheader,nounits -lms "$ms" 2>/dev/null {lock_fd}>&-)
  SMI_SG_PID=$!
  exec {SMI_SA_FD}< <(SMI_AWK=$SMI_STREAM_AWK exec setsid sh -c "$SMI_STREAM_SCRIPT" sh "$parent" "${cmd[@]}" \
    --query-compute-apps="timestamp,$SMI_APP_FIELDS" --format=csv,noheader,nounits -lms "$ms" \
    2>/dev/null {lock_fd}>&- {SMI_SG_FD}<&-)
  SMI_SA_PID=$!
  SMI_SG_BUF='' SMI_SG_PEND='' SMI_SG_PEND_N=0 SMI_SG_PEND_LAST=-1 SMI_SG_PEND_TS=''
  SMI_SG_DONE='' SMI_SG_DONE_N=0 SMI_SG_DONE_TS=-1 SMI_SG_NEW=0 SMI_SG_JUNK='' SMI_SG_DONE_TSS='' SMI_SG_MORE=0
  SMI_SA_BUF='' SMI_SA_PEND='' SMI_SA_PEND_TS=-1 SMI_SA_DONE='' SMI_SA_DONE_TS=-1 SMI_SA_JUNK=''
  SMI_SA_PREV='' SMI_SA_PREV_TS=-1 SMI_SA_PEND_AT=0
  SMI_STREAM_STARTS=$((${SMI_STREAM_STARTS:-0} + 1))
}

# Kills both loops (their whole process groups) and reaps their wrappers.
smi_stream_stop() {
  local which pid fd
  for which in SG SA; do
    local -n _ss_pid=SMI_${which}_PID _ss_fd=SMI_${which}_FD
    pid=${_ss_pid:-} fd=${_ss_fd:-}
    _ss_pid='' _ss_fd=''
    [[ -n $fd ]] && exec {fd}<&-
    [[ -n $pid ]] || continue
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    smi_reap "$pid"
  done
}

# Gives up on the streams for now: kills them, logs the first of a streak,
# and waits a back-off (doubling) before the next start.
# Arguments:
#   $1 why, one line
smi_stream_fail() {
  local now=${EPOCHREALTIME/[.,]/}
  smi_stream_stop
  SMI_STREAM_BACKOFF=$((SMI_STREAM_BACKOFF ? SMI_STREAM_BACKOFF * 2 : 2))
  ((SMI_STREAM_BACKOFF <= SMI_STREAM_BACKOFF_MAX)) || SMI_STREAM_BACKOFF=$SMI_STREAM_BACKOFF_MAX
  SMI_STREAM_RETRY_AT=$((now + SMI_STREAM_BACKOFF * 1000000))
  SMI_STREAM_ERROR=$1 SMI_STREAM_GOOD=0
  SMI_STREAM_FAILS=$((SMI_STREAM_FAILS + 1))
  if ((SMI_STREAM_FAILS == 1)); then
    gg_log warn "nvidia-smi loop: $1; one-shot calls until it restarts (first try in ${SMI_STREAM_BACKOFF}s)"
  else
    gg_log debug "nvidia-smi loop: $1; next start in ${SMI_STREAM_BACKOFF}s"
  fi
}

# Appends the lines a stream's pipe holds now to the variable named $2:
# while the pipe is readable, a frame's STX and six-digit length, then the
# line (reads of exact byte counts, in large chunks; see SMI_STREAM_SCRIPT).
# These reads have no timeout, and need none: the wrapper writes a frame in
# one piece that a pipe hands over whole, so the rest of a frame whose first
# byte came is there already. A frame that does not start with STX means
# this reader is out of step (a byte lost): it is a broken frame at once,
# never a length read from the middle of a line and waited for (the loops
# are then restarted), and so is a length the wrapper never writes.
# Arguments:
#   $1 the pipe's fd, $2 variable, $3 (optional) the first byte of a frame,
#   already read
# Returns:
#   1 at end of file (the loop ended), 3 on a broken frame
smi_stream_drain() {
  local -n _sd_buf=$2
  local _sd_head=${3:-} _sd_line _sd_got=0 LC_ALL=C
  # a flood is taken a bounded bite at a time (the rest waits in the pipe)
  while ((_sd_got < SMI_STREAM_MAX_BYTES)) && { [[ -n $_sd_head ]] || read -r -t 0 -u "$1" 2>/dev/null; }; do
    # the first byte alone, then the rest: nothing is read past a byte that
    # is not STX (the pipe may hold less than a length's worth after it)
    if [[ -z $_sd_head ]]; then
      IFS= read -r -N 1 -u "$1" _sd_head 2>/dev/null || return 1
    fi
    [[ $_sd_head == $'\002' ]] || return 3
    _sd_line=''
    IFS= read -r -N 6 -u "$1" _sd_line 2>/dev/null || return 1
    # a length of 1 to 4001: a line of up to 4000 bytes and its newline
    [[ $_sd_line == +([0-9]) ]] && ((10#$_sd_line >= 1 && 10#$_sd_line <= 4001)) || return 3
    IFS= read -r -N $((10#$_sd_line)) -u "$1" _sd_line 2>/dev/null || return 1
    # the length counts the line's newline: a frame without it lied
    [[ $_sd_line == *$'\n' ]] || return 3
    _sd_buf+=$_sd_line
    _sd_got=$((_sd_got + ${#_sd_line})) _sd_head=''
  done
  return 0
}

# Waits up to the deadline for a stream to print, then drains it. The wait
# reads one byte the unbuffered way (-n with -d ''), which a timeout cannot
# cut in half; the rest of that frame is then read at once, whatever the
# clock says.
# Arguments:
#   $1 fd, $2 buffer variable, $3 deadline (µs since the epoch)
# Returns:
#   1 at end of file, 2 when the deadline passed with nothing, 3 on a
#   broken frame
smi_stream_wait() {
  local _sw_left _sw_frac _sw_byte='' _sw_rc LC_ALL=C
  _sw_left=${EPOCHREALTIME/[.,]/}
  _sw_left=$(($3 - _sw_left))
  ((_sw_left > 0)) || return 2
  printf -v _sw_frac '%06d' $((_sw_left % 1000000))
  _sw_rc=0
  IFS= read -r -d '' -n 1 -t "$((_sw_left / 1000000)).$_sw_frac" -u "$1" _sw_byte 2>/dev/null || _sw_rc=$?
  # above 128: the deadline, or a signal to the daemon (the caller looks at
  # the clock again). bash checks the clock after it stores a byte too, so a
  # byte that came as the deadline passed is in _sw_byte with that status:
  # it is a frame's first byte and is drained like any other.
  if ((_sw_rc > 128)) && [[ -z $_sw_byte ]]; then
    return 0
  fi
  [[ -n $_sw_byte ]] || return 1
  smi_stream_drain "$1" "$2" "$_sw_byte"
}

# Puts the milliseconds of the day of a timestamp into the variable named $1.
# Arguments:
#   $1 variable, $2 "YYYY/MM/DD HH:MM:SS.mmm"
smi_ts_ms_into() {
  local -n _ts_ms=$1
  local t=${2:11}
  _ts_ms=$(((((10#${t:0:2} * 60) + 10#${t:3:2}) * 60 + 10#${t:6:2}) * 1000 + 10#${t:9:3}))
}

# Milliseconds from $3 to $2 (times of day) into the variable named $1,
# across midnight: within half a day either way.
smi_ms_diff_into() {
  local -n _msd=$1
  _msd=$((($2 - $3) % 86400000))
  ((_msd > 43200000)) && _msd=$((_msd - 86400000))
  ((_msd <= -43200000)) && _msd=$((_msd + 86400000))
  return 0
}

# Cuts the complete lines of the GPU stream's buffer into blocks. The
# latest finished block is kept in SMI_SG_DONE (lines without their
# timestamp), its time of day in SMI_SG_DONE_TS (ms) and SMI_SG_NEW=1 until
# a cycle takes it. A line that is not a timestamped GPU line is kept in
# SMI_SG_JUNK (the header a format with one prints once is skipped).
smi_stream_split_gpus() {
  local text line rest idx
  local -a lines
  [[ $SMI_SG_BUF == *$'\n'* ]] || return 0
  text=${SMI_SG_BUF%$'\n'*}
  SMI_SG_BUF=${SMI_SG_BUF##*$'\n'}
  smi_lines_into lines "$text"
  for line in "${lines[@]}"; do
    line=${line%$'\r'}
    [[ $line == *[![:space:]]* ]] || continue
    rest=${line:25}
    idx=${rest%%,*}
    # a line cut short runs into the next sample's timestamp
    # shellcheck disable=SC2053 # the glob is the point
    if [[ ${line:0:25} != $SMI_TS_GLOB', ' || $idx != +([0-9]) || ${#idx} -gt 5 || $rest == *$SMI_TS_GLOB* ]]; then
      [[ $line == 'timestamp, '* ]] && continue
      smi_stream_junk SMI_SG_JUNK "$line"
      continue
    fi
    ((SMI_SG_PEND_N > 0 && 10#$idx <= SMI_SG_PEND_LAST)) && smi_stream_close_gpus
    # a line of the block just closed by its count: a GPU came back
    ((SMI_SG_PEND_N == 0)) && [[ ${line:0:23} == "$SMI_SG_DONE_TSS" ]] && SMI_SG_MORE=1
    ((SMI_SG_PEND_N > 0)) || SMI_SG_PEND_TS=${line:0:23}
    SMI_SG_PEND+=$rest$'\n'
    SMI_SG_PEND_N=$((SMI_SG_PEND_N + 1)) SMI_SG_PEND_LAST=$((10#$idx))
    ((SMI_SG_PEND_N >= SMI_STREAM_NGPU)) && smi_stream_close_gpus
  done
  return 0
}

# Keeps the first bad line of a stream in the variable named $1, cut to 160
# characters, anything unprintable as '?' (it goes to the log).
smi_stream_junk() {
  local -n _sj=$1
  local LC_ALL=C
  [[ -z $_sj ]] || return 0
  _sj=${2:0:160}
  _sj=${_sj//[![:print:]]/?}
}

# Ends the GPU block being read (see smi_stream_split_gpus).
smi_stream_close_gpus() {
  SMI_SG_DONE=$SMI_SG_PEND SMI_SG_DONE_N=$SMI_SG_PEND_N SMI_SG_NEW=1 SMI_SG_DONE_TSS=$SMI_SG_PEND_TS
  smi_ts_ms_into SMI_SG_DONE_TS "$SMI_SG_PEND_TS"
  SMI_SG_PEND='' SMI_SG_PEND_N=0 SMI_SG_PEND_LAST=-1
}

# Cuts the complete lines of the process stream's buffer into blocks of
# one moment (timestamps within half an interval); a line of the next
# moment ends a block, and so does quiet (smi_stream_apps_settle).
# SMI_SA_DONE holds the latest (lines without their timestamp),
# SMI_SA_DONE_TS its time of day (ms), SMI_SA_PREV and SMI_SA_PREV_TS the
# one before; SMI_SA_PEND_AT is when the block being read last grew;
# SMI_SA_JUNK holds the first bad line.
smi_stream_split_apps() {
  local text line ts diff now=${EPOCHREALTIME/[.,]/}
  local -a lines
  if [[ $SMI_SA_BUF == *$'\n'* ]]; then
    text=${SMI_SA_BUF%$'\n'*}
    SMI_SA_BUF=${SMI_SA_BUF##*$'\n'}
    smi_lines_into lines "$text"
    for line in "${lines[@]}"; do
      line=${line%$'\r'}
      [[ $line == *[![:space:]]* ]] || continue
      # shellcheck disable=SC2053 # the glob is the point
      if [[ ${line:0:25} != $SMI_TS_GLOB', ' || ${line:25} == *$SMI_TS_GLOB* ]]; then
        [[ $line == 'timestamp, '* ]] && continue
        smi_stream_junk SMI_SA_JUNK "$line"
        continue
      fi
      smi_ts_ms_into ts "${line:0:23}"
      smi_ms_diff_into diff "$ts" "$SMI_SA_PEND_TS"
      if ((SMI_SA_PEND_TS < 0 || diff > SMI_STREAM_MS / 2 || diff < -SMI_STREAM_MS / 2)); then
        ((SMI_SA_PEND_TS < 0)) || smi_stream_close_apps
        SMI_SA_PEND_TS=$ts
      fi
      SMI_SA_PEND+=${line:25}$'\n'
      SMI_SA_PEND_AT=$now
    done
  fi
  return 0
}

# Ends the process block being read once no line of it came for
# SMI_STREAM_QUIET_MS, waiting for that at most until the deadline.
# Arguments:
#   $1 deadline (µs since the epoch)
# Returns:
#   1 at the stream's end, 3 on a broken frame
smi_stream_apps_settle() {
  local now until rc
  while ((SMI_SA_PEND_TS >= 0)); do
    now=${EPOCHREALTIME/[.,]/}
    if ((now - SMI_SA_PEND_AT >= SMI_STREAM_QUIET_MS * 1000)); then
      smi_stream_close_apps
      return 0
    fi
    until=$((SMI_SA_PEND_AT + SMI_STREAM_QUIET_MS * 1000))
    ((until < $1)) || until=$1
    ((now < until)) || return 0
    rc=0
    smi_stream_wait "$SMI_SA_FD" SMI_SA_BUF "$until" || rc=$?
    ((rc == 1 || rc == 3)) && return "$rc"
    smi_stream_split_apps
  done
  return 0
}

# Ends the process block being read (see smi_stream_split_apps).
smi_stream_close_apps() {
  SMI_SA_PREV=$SMI_SA_DONE SMI_SA_PREV_TS=$SMI_SA_DONE_TS
  SMI_SA_DONE=$SMI_SA_PEND SMI_SA_DONE_TS=$SMI_SA_PEND_TS
  SMI_SA_PEND='' SMI_SA_PEND_TS=-1
}

# Takes the next GPU block of the stream, waiting for it until the
# deadline. On any fault the streams are given up (smi_stream_fail).
# Arguments:
#   $1 deadline (µs since the epoch)
# Returns:
#   1 when no block could be taken (the caller samples the one-shot way)
smi_stream_next_gpus() {
  local rc=0
  smi_stream_drain "$SMI_SG_FD" SMI_SG_BUF || rc=$?
  while :; do
    if ((rc == 3)); then
      smi_stream_fail "the GPU loop's output lost its framing"
      return 1
    fi
    smi_stream_split_gpus
    if [[ -n $SMI_SG_JUNK ]]; then
      smi_stream_fail "the GPU loop printed something else than a sample: $SMI_SG_JUNK"
      return 1
    fi
    ((SMI_SG_NEW)) && break
    if ((rc == 1)); then
      smi_stream_fail "the GPU loop ended"
      return 1
    fi
    if ((${#SMI_SG_BUF} > SMI_STREAM_MAX_BYTES)); then
      smi_stream_fail "the GPU loop printed over $SMI_STREAM_MAX_BYTES bytes without a line's end"
      return 1
    fi
    rc=0
    smi_stream_wait "$SMI_SG_FD" SMI_SG_BUF "$1" || rc=$?
    if ((rc == 2)); then
      smi_stream_fail "no GPU sample for $((${SMI_TIMEOUT:-10} + 1))s (stalled)"
      return 1
    fi
  done
  SMI_SG_NEW=0
  return 0
}

# Fills the process list of the sample from the process stream: the block
# of the GPU block's moment, or "no processes" where the GPUs' memory says
# so, or (neither) the one-shot process list.
# Arguments:
#   $1 deadline (µs since the epoch) for the stream's part
# Returns:
#   1 when the streams were given up and the sample must be taken again
smi_stream_apps() {
  local rc=0 diff wait_until
  # the process block of this moment may be a few ms behind the GPU block
  wait_until=$((${EPOCHREALTIME/[.,]/} + SMI_STREAM_SKEW_MS * 1000))
  ((wait_until < $1)) || wait_until=$1
  smi_stream_drain "$SMI_SA_FD" SMI_SA_BUF || rc=$?
  while :; do
    smi_stream_split_apps
    ((rc == 0)) && { smi_stream_apps_settle "$1" || rc=$?; }
    if [[ -n $SMI_SA_JUNK ]]; then
      smi_stream_fail "the process loop printed something else than a sample: $SMI_SA_JUNK"
      return 1
    fi
    if ((rc == 1 || rc == 3)); then
      smi_stream_fail "the process loop ended or lost its framing"
      return 1
    fi
    smi_ms_diff_into diff "$SMI_SA_DONE_TS" "$SMI_SG_DONE_TS"
    if ((SMI_SA_DONE_TS >= 0 && diff >= -SMI_STREAM_SKEW_MS && diff <= SMI_STREAM_SKEW_MS)); then
      smi_take_apps 0 "$SMI_SA_DONE"
      return 0
    fi
    if ((SMI_SA_DONE_TS >= 0 && diff > SMI_STREAM_SKEW_MS)); then
      # the process loop's newest block can be a sample ahead of the GPU
      # loop's: the one before it may be this moment's
      smi_ms_diff_into diff "$SMI_SA_PREV_TS" "$SMI_SG_DONE_TS"
      if ((SMI_SA_PREV_TS >= 0 && diff >= -SMI_STREAM_SKEW_MS && diff <= SMI_STREAM_SKEW_MS)); then
        smi_take_apps 0 "$SMI_SA_PREV"
        return 0
      fi
      smi_stream_fail "desynchronised: the process list is ${diff} ms away from the GPU sample"
      return 1
    fi
    smi_stream_apps_empty && return 0
    rc=0
    smi_stream_wait "$SMI_SA_FD" SMI_SA_BUF "$wait_until" || rc=$?
    ((rc == 2)) && break
  done
  smi_stream_apps_once
}

# True (and the sample has no processes) when the process stream's silence
# can only mean "no processes": every GPU's memory.used is at most
# SMI_STREAM_EMPTY_MIB, or the same as when a one-shot process list last
# came back empty (processes of other PID namespaces, a display server).
smi_stream_apps_empty() {
  local uuid sig='' low=1
  for uuid in "${SMI_UUIDS[@]}"; do
    sig+="${SMI_MEM_USED[$uuid]:-?} "
    if [[ ${SMI_MEM_USED[$uuid]:-} != +([0-9]) ]] || ((SMI_MEM_USED[$uuid] > SMI_STREAM_EMPTY_MIB)); then
      low=0
    fi
  done
  ((low)) || [[ $sig == "$SMI_STREAM_EMPTY_SIG" ]] || return 1
  smi_take_apps 0 ''
}

# The one-shot process list for a GPU block of the stream. Processes that
# the stream did not show for that moment mean it missed them: the streams
# are restarted (this sample stands). An empty answer is remembered with the
# GPUs' memory (smi_stream_apps_empty).
smi_stream_apps_once() {
  local out rc=0 uuid sig=''
  if smi_start 1 --query-compute-apps="$SMI_APP_FIELDS" --format=csv,noheader,nounits; then
    smi_answer_into out || rc=$?
    smi_end
  else
    rc=127
    smi_not_found_into out
  fi
  smi_take_apps "$rc" "$out"
  ((SMI_APPS_OK)) || return 0
  if ((${#SMI_PIDS_MEM[@]} > 0)); then
    SMI_STREAM_EMPTY_SIG=''
    smi_stream_fail "desynchronised: the process loop missed ${#SMI_PIDS_MEM[@]} process(es) of this moment"
    return 0
  fi
  for uuid in "${SMI_UUIDS[@]}"; do
    sig+="${SMI_MEM_USED[$uuid]:-?} "
  done
  SMI_STREAM_EMPTY_SIG=$sig
}

# Samples from the streams (smi_sample's outputs, SMI_SOURCE=stream).
# Returns:
#   1 when the streams are down or gave no sound sample: the caller takes
#   a one-shot sample instead
smi_stream_sample() {
  [[ -n ${SMI_SG_PID:-} ]] || return 1
  local deadline=$((${EPOCHREALTIME/[.,]/} + (${SMI_TIMEOUT:-10} + 1) * 1000000))
  smi_stream_next_gpus "$deadline" || return 1
  smi_reset
  smi_parse_gpus "$SMI_SG_DONE"
  if ((SMI_TRUNCATED > 0 || SMI_BAD_LINES > 0 || ${#SMI_UUIDS[@]} == 0)); then
    smi_stream_fail "the GPU loop printed ${SMI_BAD_LINES} unreadable line(s)"
    return 1
  fi
  if ((${#SMI_UUIDS[@]} != SMI_STREAM_NGPU || SMI_SG_MORE)); then
    SMI_SG_MORE=0
    # a GPU gone or back: the one-shot sample says which, and its count is
    # what the next blocks are read against
    gg_log debug "nvidia-smi loop: ${#SMI_UUIDS[@]} GPU(s) in a sample, ${SMI_STREAM_NGPU} expected; one-shot sample"
    return 1
  fi
  smi_stream_apps "$deadline" || return 1
  if [[ -z ${SMI_SG_PID:-} ]]; then
    # the one-shot process list stood in and the loops were given up
    SMI_SOURCE=once
    return 0
  fi
  SMI_SOURCE=stream
  SMI_STREAM_GOOD=$((SMI_STREAM_GOOD + 1))
  if ((SMI_STREAM_FAILS > 0)); then
    gg_log info "nvidia-smi loop: sampling from the loop again after ${SMI_STREAM_FAILS} fault(s)"
    SMI_STREAM_FAILS=0
  fi
  # a loop that ran a minute (of samples) earns a short back-off again
  ((SMI_STREAM_GOOD < 60)) || SMI_STREAM_BACKOFF=0
  return 0
}

# Records nvidia-smi's loop mode as it prints, for fixtures and checks
# (bench/h200/sampler.sh): runs it with the given arguments for a while and
# prints each line behind the time it arrived. A line read the slow way (a
# byte per system call): this is a diagnostic, not a daemon's path.
# Arguments:
#   $1 seconds to record, then nvidia-smi's arguments (with -lms or -l)
# Outputs:
#   "<unix time with µs> <line>" per line, then "# exit STATUS"
smi_loop_record() {
  local seconds=$1 line fd pid rc=0
  local -a cmd
  shift
  read -r -a cmd <<<"${NVIDIA_SMI:-nvidia-smi}"
  exec {fd}< <(exec timeout -k 1 "$seconds" "${cmd[@]}" "$@" 2>&1)
  pid=$!
  while IFS= read -r -u "$fd" line || [[ -n $line ]]; do
    printf '%s %s\n' "$EPOCHREALTIME" "$line"
  done
  exec {fd}<&-
  wait "$pid" || rc=$?
  printf '# exit %s\n' "$rc"
}
