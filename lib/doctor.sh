# shellcheck shell=bash
# gpuguard doctor and gpuguard status: the box explains itself.

# Prints one check line: "OK    what: detail" (or WARN / FAIL / INFO).
doctor_line() {
  local level=$1
  shift
  printf '%-5s %s\n' "$level" "$*"
  [[ $level == FAIL ]] && DOCTOR_FAILS=$((DOCTOR_FAILS + 1))
  return 0
}

# Runs every check; returns 1 when any check failed.
doctor_run() {
  DOCTOR_FAILS=0
  local -a cmd
  read -r -a cmd <<<"${NVIDIA_SMI:-nvidia-smi}"
  printf 'gpuguard %s on %s\n' "$(<"$GPUGUARD_ROOT/VERSION")" "$GPUGUARD_HOST"
  if ! command -v -- "${cmd[0]}" >/dev/null 2>&1; then
    doctor_line FAIL "nvidia-smi: '${cmd[0]}' not found (install the NVIDIA driver, or set NVIDIA_SMI)"
  else
    local info rc=0 start=$EPOCHREALTIME
    info=$(smi_query_info) || rc=$?
    local ms=$(((${EPOCHREALTIME/[.,]/} - ${start/[.,]/}) / 1000))
    if ((rc != 0)); then
      doctor_line FAIL "nvidia-smi: $(smi_describe_failure "$rc" "$info")"
    else
      doctor_line OK "nvidia-smi answers in ${ms} ms ($(grep -c . <<<"$info") GPUs)"
      local idx name driver mig persist
      while IFS=, read -r idx name driver mig persist; do
        doctor_line INFO "GPU ${idx}:${name}, driver${driver}, MIG${mig}, persistence${persist}"
        [[ $mig == *Enabled* ]] && doctor_line WARN "GPU $idx: MIG is on: utilization.gpu reads [N/A], so the idle rule cannot judge it (IDLE_POWER_PCT can)"
        [[ $persist == *Disabled* ]] && doctor_line WARN "GPU $idx: persistence mode off: nvidia-smi calls are slow (nvidia-smi -pm 1)"
      done <<<"$info"
      doctor_processes
    fi
  fi
  doctor_host
  doctor_state
  doctor_targets
  if command -v python3 >/dev/null; then
    doctor_line OK "python3: $(python3 -c 'import sys; print(sys.version.split()[0])')"
  else
    doctor_line FAIL "python3 not found: alerts and the leak detector need it"
  fi
  ((DOCTOR_FAILS == 0))
}

# Whether the PIDs nvidia-smi reports exist here (container PID namespaces).
doctor_processes() {
  if ! smi_sample; then
    doctor_line WARN "sample failed: $SMI_ERROR"
    return 0
  fi
  local pid seen=0 total=0
  for pid in "${!SMI_PIDS_MEM[@]}"; do
    total=$((total + 1))
    [[ -d /proc/$pid ]] && seen=$((seen + 1))
  done
  if ((total == 0)); then
    doctor_line INFO "no compute process now: cannot tell whether processes are visible from here"
  elif ((seen == total)); then
    doctor_line OK "compute processes visible here ($total)"
  else
    doctor_line WARN "$((total - seen)) of $total compute PIDs are not visible here: a container PID namespace (the driver reports host PIDs); idle checks fall back to memory (IDLE_MEM_MIB), leak watch needs --all or --pid=host"
  fi
}

# cgroups, autogroup, schedulers, systemd: what lowprio-run can use.
doctor_host() {
  cg_detect
  local controllers=''
  [[ $CG_MODE == v2 ]] && controllers=" ($(cg_v2_controllers))"
  doctor_line INFO "cgroup mode: $CG_MODE$controllers${CG_WHY:+: $CG_WHY}"
  if gg_autogroup_enabled; then
    doctor_line INFO "autogroup on: plain nice does not protect services in other sessions (lowprio-run uses cgroups)"
  fi
  local disk sched
  while read -r disk sched; do
    if [[ $sched == none || $sched == kyber ]]; then
      doctor_line WARN "disk $disk: scheduler $sched ignores ionice (lowprio-run --io-max works)"
    else
      doctor_line INFO "disk $disk: scheduler $sched"
    fi
  done < <(gg_disk_schedulers)
  if cg_systemd_running; then
    doctor_line INFO "systemd is PID 1: install.sh --systemd works here"
  else
    doctor_line INFO "systemd is not PID 1 ($(cat /proc/1/comm 2>/dev/null)): use cron (install.sh --cron) or nohup"
  fi
}

# The state folder: writable, private, and what waits in the outbox.
doctor_state() {
  local dir=$GPUGUARD_STATE_DIR mode
  if [[ -d $dir && -w $dir ]]; then
    mode=$(stat -c %a "$dir")
    doctor_line OK "state folder $dir (mode $mode)"
    local -a waiting=()
    [[ -d $dir/outbox ]] && mapfile -t waiting < <(compgen -G "$dir/outbox/*.json" || true)
    ((${#waiting[@]} == 0)) || doctor_line WARN "${#waiting[@]} undelivered events wait in $dir/outbox"
  elif [[ ! -e $dir ]]; then
    doctor_line INFO "state folder $dir does not exist yet (created on first run)"
  else
    doctor_line FAIL "state folder $dir is not writable"
  fi
}

# Sends a test message to each target.
doctor_targets() {
  if ! events_targets_configured; then
    doctor_line WARN "no alert target: set NOTIFY_URL or ALERTMANAGER_URL (events still go to events.jsonl)"
    return 0
  fi
  local line
  while IFS= read -r line; do
    case $line in
      sent*) doctor_line OK "target: $line" ;;
      *) doctor_line FAIL "target: $line" ;;
    esac
  done < <(events_test_alert 2>&1)
}

# Prints one row per GPU and its processes, with sparklines of recent
# utilization (watchdog state) and memory (leak watch history).
status_show() {
  idle_init
  idle_state_load
  if ! smi_sample; then
    printf 'gpuguard status: %s\n' "$SMI_ERROR" >&2
    return 1
  fi
  local -A slope=() leaking=()
  local pid s f
  while read -r pid s f; do
    [[ -n $pid ]] || continue
    slope[$pid]=$s
    leaking[$pid]=$f
  done < <(gg_python gpuguard_leak.py "LEAK_THRESHOLD_MIB_H LEAK_BUCKET_S" slopes 2>/dev/null)
  printf '%-4s %5s %17s %6s %-8s %s\n' GPU UTIL MEMORY IDLE STATE 'RECENT UTIL'
  local uuid state name mem
  for uuid in "${SMI_UUIDS[@]}"; do
    state=ok
    ((${IDLE_FIRING[$uuid]:-0})) && state=IDLE
    printf '%-4s %4s%% %7s/%-6s MiB %6s %-8s %s\n' "${SMI_INDEX[$uuid]}" "${SMI_UTIL[$uuid]:-n/a}" \
      "${SMI_MEM_USED[$uuid]:-?}" "${SMI_MEM_TOTAL[$uuid]:-?}" "${IDLE_CYCLES[$uuid]:-0}" "$state" \
      "$(status_spark "${IDLE_HISTORY[$uuid]:-}" 100)"
    while IFS=$'\t' read -r pid name mem; do
      [[ -n $pid ]] || continue
      local trend=''
      [[ -n ${slope[$pid]:-} ]] && trend=" leak slope ${slope[$pid]} MiB/h$( ((${leaking[$pid]:-0})) && echo ' LEAK')"
      printf '       pid %-8s %-20s %7s MiB%s %s\n' "$pid" "${name##*/}" "${mem:-?}" "$trend" \
        "$(status_spark "$(status_mem_history "$pid")" 0)"
    done <<<"${SMI_PROCS[$uuid]}"
  done
}

# The last memory samples of a process from the leak watcher's history.
status_mem_history() {
  local f
  for f in "$GPUGUARD_STATE_DIR"/history/"$1"-*.csv; do
    [[ -f $f ]] || continue
    tail -n 24 "$f" | cut -d, -f3 | grep -v used | paste -sd, -
    return 0
  done
}

# Draws a sparkline of comma-separated numbers; $2 the scale's top (0: the
# largest value).
status_spark() {
  local values=$1 top=$2 v out='' min='' max=0
  local -a bars=(▁ ▂ ▃ ▄ ▅ ▆ ▇ █)
  [[ -n $values ]] || return 0
  local IFS=,
  for v in $values; do
    v=${v%.*}
    ((v > max)) && max=$v
    [[ -z $min ]] || ((v < min)) && min=$v
  done
  ((top > 0)) && max=$top min=0
  for v in $values; do
    v=${v%.*}
    if ((max > min)); then
      out+=${bars[$(((v - min) * 7 / (max - min)))]}
    else
      out+=${bars[0]}
    fi
  done
  printf '%s' "$out"
}
