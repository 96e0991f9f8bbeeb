# shellcheck shell=bash
# shellcheck disable=SC2034 # SMI_* are this module's output, read by idle.sh, leak.sh and textfile.sh
# The one place that runs nvidia-smi. Every call is bounded by
# `timeout -k` (a wedged driver hangs nvidia-smi in D state), output is
# checked by exit status first (nvidia-smi prints its errors on stdout) and
# then line by line; placeholders such as [N/A] become empty values.

# Fields of the per-GPU query, in order. power.draw and power.limit ride along
# in the same call as a second signal: a hung NCCL rank can spin at 100 %
# utilization while drawing idle power.
SMI_GPU_FIELDS=index,uuid,utilization.gpu,memory.used,memory.total,power.draw,power.limit
SMI_APP_FIELDS=pid,process_name,used_memory,gpu_uuid

# Runs nvidia-smi with the given arguments under the timeout.
# Globals:
#   NVIDIA_SMI (command line, may be "ssh node7 nvidia-smi"), SMI_TIMEOUT
# Outputs:
#   nvidia-smi's stdout and stderr, merged (it writes errors to stdout)
# Returns:
#   nvidia-smi's status; 124 when it timed out; 127 when it is missing
smi_run() {
  local -a cmd
  read -r -a cmd <<<"${NVIDIA_SMI:-nvidia-smi}"
  if ! command -v -- "${cmd[0]}" >/dev/null 2>&1; then
    printf '%s: command not found\n' "${cmd[0]}"
    return 127
  fi
  timeout -k 2 "${SMI_TIMEOUT:-10}" "${cmd[@]}" "$@" 2>&1
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

# Samples every GPU with at most two nvidia-smi calls, whatever the GPU count.
# Globals (set):
#   SMI_UUIDS (array, in index order); SMI_INDEX, SMI_UTIL, SMI_MEM_USED,
#   SMI_MEM_TOTAL, SMI_POWER, SMI_POWER_LIMIT (assoc, by UUID; "" = no value);
#   SMI_NPROCS (assoc, by
#   UUID); SMI_PROCS (assoc, by UUID: lines "pid<TAB>name<TAB>MiB");
#   SMI_PIDS_MEM (assoc, by PID: MiB summed over GPUs); SMI_PID_UUIDS;
#   SMI_BAD_LINES (lines skipped as unparseable); SMI_ERROR (why it failed)
# Returns:
#   0 when the GPU query succeeded and gave at least one valid GPU line
smi_sample() {
  declare -ga SMI_UUIDS=()
  declare -gA SMI_INDEX=() SMI_UTIL=() SMI_MEM_USED=() SMI_MEM_TOTAL=() \
    SMI_POWER=() SMI_POWER_LIMIT=() SMI_NPROCS=() SMI_PROCS=() SMI_PIDS_MEM=() \
    SMI_PID_UUIDS=()
  SMI_BAD_LINES=0
  SMI_ERROR=''
  local output rc=0
  output=$(smi_run --query-gpu="$SMI_GPU_FIELDS" --format=csv,noheader,nounits) || rc=$?
  if ((rc != 0)); then
    SMI_ERROR=$(smi_describe_failure "$rc" "$output")
    return 1
  fi
  smi_parse_gpus "$output"
  if ((${#SMI_UUIDS[@]} == 0)); then
    SMI_ERROR="nvidia-smi printed no valid GPU line (${SMI_BAD_LINES} unparseable)"
    return 1
  fi
  rc=0
  output=$(smi_run --query-compute-apps="$SMI_APP_FIELDS" --format=csv,noheader,nounits) || rc=$?
  # An unreadable process list leaves SMI_NPROCS at 0: the idle rule then
  # judges occupancy by memory.used, as for hidden (container) processes.
  if ((rc != 0)); then
    SMI_ERROR="process list: $(smi_describe_failure "$rc" "$output")"
  elif ! smi_parse_apps "$output"; then
    SMI_ERROR="process list: unparseable output"
  fi
  return 0
}

# Parses `--query-gpu` CSV (noheader, nounits) into the SMI_* arrays; lines
# that do not have the shape of a GPU line are counted in SMI_BAD_LINES.
# One regular expression a line and no forks: it runs every cycle for every
# GPU.
smi_parse_gpus() {
  local re='^ *([0-9]+), *((GPU|MIG)-[0-9A-Za-z/-]+), *([^,]*), *([^,]*), *([^,]*), *([^,]*), *([^,]*)$'
  local line uuid bad i
  local -a value
  while IFS= read -r line; do
    line=${line%$'\r'}
    [[ -z ${line//[[:space:]]/} ]] && continue
    if [[ ! $line =~ $re ]] || [[ -n ${SMI_INDEX[${BASH_REMATCH[2]}]+set} ]]; then
      SMI_BAD_LINES=$((SMI_BAD_LINES + 1))
      continue
    fi
    uuid=${BASH_REMATCH[2]}
    # utilization, memory used, memory total, power draw, power limit
    value=("${BASH_REMATCH[@]:4:5}")
    value[4]=${value[4]%"${value[4]##*[![:space:]]}"}
    bad=0
    # A placeholder ([N/A], [Not Supported], N/A) becomes an empty value;
    # anything else that is not a plain number makes the line garbage.
    for i in 0 1 2 3 4; do
      case ${value[i]} in '' | '['*']' | N/A) value[i]='' ;; *[!0-9.]* | .* | *. | *.*.*) bad=1 ;; esac
    done
    if ((bad)); then
      SMI_BAD_LINES=$((SMI_BAD_LINES + 1))
      continue
    fi
    SMI_UUIDS+=("$uuid")
    SMI_INDEX[$uuid]=${BASH_REMATCH[1]}
    SMI_UTIL[$uuid]=${value[0]}
    SMI_MEM_USED[$uuid]=${value[1]}
    SMI_MEM_TOTAL[$uuid]=${value[2]}
    SMI_POWER[$uuid]=${value[3]}
    SMI_POWER_LIMIT[$uuid]=${value[4]}
    SMI_NPROCS[$uuid]=0
    SMI_PROCS[$uuid]=''
  done <<<"$1"
}

# Parses `--query-compute-apps=pid,process_name,used_memory,gpu_uuid` CSV.
# The name is what lies between the first and the last two fields, since
# older drivers do not replace commas in process names.
# Returns:
#   1 when any non-empty line is not a process line (garbage)
smi_parse_apps() {
  local re='^ *([0-9]+), (.*), *([0-9]+|\[[^]]*\]|N/A|), *((GPU|MIG)-[0-9A-Za-z/-]+) *$'
  local line pid name mem uuid
  while IFS= read -r line; do
    line=${line%$'\r'}
    [[ -z ${line//[[:space:]]/} ]] && continue
    [[ $line =~ $re ]] || return 1
    pid=${BASH_REMATCH[1]} name=${BASH_REMATCH[2]} mem=${BASH_REMATCH[3]} uuid=${BASH_REMATCH[4]}
    [[ -n ${SMI_INDEX[$uuid]+set} ]] || continue
    [[ $mem == [0-9]* ]] || mem=''
    name=${name//$'\t'/ }
    SMI_NPROCS[$uuid]=$((SMI_NPROCS[$uuid] + 1))
    SMI_PROCS[$uuid]+="${pid}"$'\t'"${name}"$'\t'"${mem}"$'\n'
    SMI_PIDS_MEM[$pid]=$((${SMI_PIDS_MEM[$pid]:-0} + ${mem:-0}))
    SMI_PID_UUIDS[$pid]+="${SMI_PID_UUIDS[$pid]:+ }$uuid"
  done <<<"$1"
  return 0
}


# Asks for the facts doctor reports, one line per GPU:
# "index, name, driver_version, mig.mode.current, persistence_mode".
# Outputs:
#   the CSV lines; returns nvidia-smi's status
smi_query_info() {
  smi_run --query-gpu=index,name,driver_version,mig.mode.current,persistence_mode \
    --format=csv,noheader
}
