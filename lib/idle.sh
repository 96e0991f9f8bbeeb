# shellcheck shell=bash
# The idle watchdog's rule and memory. A GPU is "idle but occupied" when its
# utilization is under THRESHOLD (or, with IDLE_POWER_PCT set, its power draw
# is under that share of its limit: a hung NCCL rank spins at 100 %) while
# it is held: compute processes on it, or, when the process list is hidden
# or empty (containers), memory.used above IDLE_MEM_MIB. MAX_IDLE_CYCLES such
# cycles in a row fire one alert; REPEAT_INTERVAL gives reminders; busy again
# or released gives one resolved. Counters are kept by GPU UUID, persisted
# after every cycle so --once (cron) and restarts keep counting.

# GPUs absent from this many successful samples in a row are forgotten, so
# the state stays bounded when GPUs are reset or MIG is reconfigured.
IDLE_FORGET_AFTER=60

# Declares the watchdog's state arrays (empty).
idle_init() {
  declare -gA IDLE_CYCLES=() IDLE_SINCE=() IDLE_FIRING=() IDLE_LAST_ALERT=() \
    IDLE_ABSENT=() IDLE_NA_LOGGED=() IDLE_HISTORY=()
  declare -g MON_FAILS=0 MON_FIRING=0 MON_SINCE=0 MON_LAST_OK=0 MON_LAST_ERROR=''
}

# Loads persisted state from $GPUGUARD_STATE_DIR/idle.state; a corrupt line
# is skipped with a warning (the counter starts again from 0).
idle_state_load() {
  local file=$GPUGUARD_STATE_DIR/idle.state kind uuid cycles since firing last absent na
  [[ -f $file ]] || return 0
  while read -r kind uuid cycles since firing last absent na; do
    case $kind in
      gpu)
        if gg_is_uint "$cycles" && gg_is_uint "$since" && gg_is_uint "$firing" &&
          gg_is_uint "$last" && gg_is_uint "$absent"; then
          IDLE_CYCLES[$uuid]=$cycles IDLE_SINCE[$uuid]=$since
          IDLE_FIRING[$uuid]=$firing IDLE_LAST_ALERT[$uuid]=$last
          IDLE_ABSENT[$uuid]=$absent
          [[ ${na:-0} == 1 ]] && IDLE_NA_LOGGED[$uuid]=1
          continue
        fi
        ;;
      history)
        # uuid column, then the last utilization samples, comma separated
        if [[ $cycles =~ ^[0-9,-]*$ ]]; then
          IDLE_HISTORY[$uuid]=$cycles
          continue
        fi
        ;;
      monitor)
        # columns: failure streak, firing flag, streak start, last success
        if gg_is_uint "$uuid" && gg_is_uint "$cycles" && gg_is_uint "$since" &&
          gg_is_uint "$firing"; then
          MON_FAILS=$uuid MON_FIRING=$cycles MON_SINCE=$since MON_LAST_OK=$firing
          continue
        fi
        ;;
    esac
    gg_log warn "ignoring corrupt line in $file"
  done <"$file"
}

# Writes the state atomically, and only when it changed since the last write.
idle_state_save() {
  local uuid state
  printf -v state 'monitor %s %s %s %s 0 0 0\n' "$MON_FAILS" "$MON_FIRING" "$MON_SINCE" "$MON_LAST_OK"
  for uuid in "${!IDLE_CYCLES[@]}"; do
    printf -v state '%sgpu %s %s %s %s %s %s %s\n' "$state" "$uuid" "${IDLE_CYCLES[$uuid]}" \
      "${IDLE_SINCE[$uuid]}" "${IDLE_FIRING[$uuid]}" \
      "${IDLE_LAST_ALERT[$uuid]}" "${IDLE_ABSENT[$uuid]:-0}" "${IDLE_NA_LOGGED[$uuid]:-0}"
  done
  for uuid in "${!IDLE_HISTORY[@]}"; do
    [[ -n ${IDLE_CYCLES[$uuid]+set} ]] && state+="history $uuid ${IDLE_HISTORY[$uuid]}"$'\n'
  done
  [[ $state == "${IDLE_SAVED_STATE:-}" ]] && return 0
  gg_write_atomic "$GPUGUARD_STATE_DIR/idle.state" "$state" || return
  IDLE_SAVED_STATE=$state
}

# Runs one watchdog cycle: sample, judge every GPU, emit events, save.
# Arguments:
#   $1 current time, unix seconds
idle_cycle() {
  local now=$1
  if ! smi_sample; then
    idle_monitor_failed "$now"
  else
    idle_monitor_ok "$now"
    idle_judge_all "$now"
  fi
  idle_state_save || gg_log error "could not save $GPUGUARD_STATE_DIR/idle.state"
  events_flush
  if [[ -n ${GPUGUARD_TEXTFILE_DIR:-} ]]; then
    textfile_write_idle "$now" || gg_log warn "could not write textfile metrics in $GPUGUARD_TEXTFILE_DIR"
  fi
  gpuhistory_append "$now" || gg_log warn "could not append to $GPUGUARD_STATE_DIR/gpu-history.tsv"
}

# Judges every GPU of a successful sample and forgets long-absent ones.
idle_judge_all() {
  local now=$1 uuid
  local -A seen=()
  for uuid in "${SMI_UUIDS[@]}"; do
    seen[$uuid]=1
    IDLE_ABSENT[$uuid]=0
    idle_judge_gpu "$now" "$uuid"
  done
  for uuid in "${!IDLE_CYCLES[@]}"; do
    [[ -n ${seen[$uuid]:-} ]] && continue
    # A GPU missing from one sample (a garbage line) keeps its state.
    IDLE_ABSENT[$uuid]=$((${IDLE_ABSENT[$uuid]:-0} + 1))
    if ((${IDLE_ABSENT[$uuid]} >= IDLE_FORGET_AFTER)); then
      if ((${IDLE_FIRING[$uuid]:-0})); then
        idle_emit "$now" "$uuid" resolved gone
      fi
      unset "IDLE_CYCLES[$uuid]" "IDLE_SINCE[$uuid]" "IDLE_FIRING[$uuid]" \
        "IDLE_LAST_ALERT[$uuid]" "IDLE_ABSENT[$uuid]" "IDLE_NA_LOGGED[$uuid]" "IDLE_HISTORY[$uuid]"
    fi
  done
}

# Prints why a GPU counts as idle-but-occupied ("" when it does not) into the
# variable named $2; returns 2 when it cannot be judged (no utilization).
idle_classify() {
  local uuid=$1
  local -n verdict_ref=$2
  verdict_ref=''
  local util=${SMI_UTIL[$uuid]} used=${SMI_MEM_USED[$uuid]:-0}
  local power=${SMI_POWER[$uuid]} limit=${SMI_POWER_LIMIT[$uuid]}
  [[ -n $util ]] || return 2
  local occupied=0
  if ((${SMI_NPROCS[$uuid]:-0} > 0)); then
    occupied=1
  elif ((${used%.*} > IDLE_MEM_MIB)); then
    # The process list is hidden (container PID namespace) or unavailable,
    # yet memory is held: count the GPU as occupied.
    occupied=1
  fi
  ((occupied)) || return 0
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  if ((${util%.*} < THRESHOLD)); then
    verdict_ref=utilization
  elif ((IDLE_POWER_PCT > 0)) && [[ -n $power && -n $limit ]] &&
    ((${power%.*} * 100 < IDLE_POWER_PCT * ${limit%.*})); then
    verdict_ref=power
  fi
  return 0
}

# Applies the rule to one GPU.
idle_judge_gpu() {
  local now=$1 uuid=$2 verdict rc=0
  idle_classify "$uuid" verdict || rc=$?
  if ((rc == 2)); then
    if [[ -z ${IDLE_NA_LOGGED[$uuid]:-} ]]; then
      gg_log warn "GPU ${SMI_INDEX[$uuid]} ($uuid): utilization not available ([N/A], MIG?); not judged"
      IDLE_NA_LOGGED[$uuid]=1
    fi
    : "${IDLE_CYCLES[$uuid]:=0}" "${IDLE_SINCE[$uuid]:=0}" "${IDLE_FIRING[$uuid]:=0}" "${IDLE_LAST_ALERT[$uuid]:=0}"
    return 0
  fi
  unset "IDLE_NA_LOGGED[$uuid]"
  idle_history_add "$uuid" "${SMI_UTIL[$uuid]%.*}"
  if [[ -n $verdict ]]; then
    local cycles=$((${IDLE_CYCLES[$uuid]:-0} + 1))
    IDLE_CYCLES[$uuid]=$cycles
    ((${IDLE_SINCE[$uuid]:-0} > 0)) || IDLE_SINCE[$uuid]=$now
    : "${IDLE_FIRING[$uuid]:=0}" "${IDLE_LAST_ALERT[$uuid]:=0}"
    if ((!${IDLE_FIRING[$uuid]} && cycles >= MAX_IDLE_CYCLES)); then
      IDLE_FIRING[$uuid]=1
      IDLE_LAST_ALERT[$uuid]=$now
      idle_emit "$now" "$uuid" firing "$verdict"
    elif ((${IDLE_FIRING[$uuid]} && REPEAT_INTERVAL > 0 &&
      now - ${IDLE_LAST_ALERT[$uuid]} >= REPEAT_INTERVAL)); then
      IDLE_LAST_ALERT[$uuid]=$now
      idle_emit "$now" "$uuid" reminder "$verdict"
    fi
    return 0
  fi
  if ((${IDLE_FIRING[$uuid]:-0})); then
    local reason=busy
    ((${SMI_NPROCS[$uuid]:-0} > 0 || ${SMI_MEM_USED[$uuid]:-0} > IDLE_MEM_MIB)) || reason=released
    idle_emit "$now" "$uuid" resolved "$reason"
  fi
  IDLE_CYCLES[$uuid]=0 IDLE_SINCE[$uuid]=0 IDLE_FIRING[$uuid]=0 IDLE_LAST_ALERT[$uuid]=0
}

# Keeps the last 24 utilization samples of a GPU (for gpuguard status).
idle_history_add() {
  local uuid=$1 value=$2 h
  h=${IDLE_HISTORY[$uuid]:-}
  h=${h:+$h,}$value
  while [[ $h == *,*,*,*,*,*,*,*,*,*,*,*,*,*,*,*,*,*,*,*,*,*,*,*,* ]]; do
    h=${h#*,}
  done
  IDLE_HISTORY[$uuid]=$h
}

# Builds and emits a gpu_idle event for one GPU.
# Arguments:
#   $1 now, $2 uuid, $3 state (firing|reminder|resolved), $4 reason
idle_emit() {
  local now=$1 uuid=$2 state=$3 reason=$4
  local since=${IDLE_SINCE[$uuid]:-0} procs='' pid name mem esc
  local idle_seconds=0
  ((since > 0)) && idle_seconds=$((now - since))
  while IFS=$'\t' read -r pid name mem; do
    [[ -n $pid ]] || continue
    gg_json_escape_into "$name" esc
    procs+="${procs:+,}{\"pid\":$pid,\"name\":\"$esc\",\"used_memory_mib\":${mem:-null}}"
  done <<<"${SMI_PROCS[$uuid]:-}"
  local host_esc
  gg_json_escape_into "$GPUGUARD_HOST" host_esc
  local event
  printf -v event '{"ts":%s,"host":"%s","event":"gpu_idle","state":"%s","reason":"%s","gpu":%s,"uuid":"%s","utilization":%s,"threshold":%s,"memory_used_mib":%s,"memory_total_mib":%s,"power_draw_w":%s,"idle_cycles":%s,"idle_seconds":%s,"processes":[%s]}' \
    "$now" "$host_esc" "$state" "$reason" "${SMI_INDEX[$uuid]:-null}" "$uuid" \
    "${SMI_UTIL[$uuid]:-null}" "$THRESHOLD" "${SMI_MEM_USED[$uuid]:-null}" \
    "${SMI_MEM_TOTAL[$uuid]:-null}" "${SMI_POWER[$uuid]:-null}" \
    "${IDLE_CYCLES[$uuid]:-0}" "$idle_seconds" "$procs"
  gg_log warn "gpu_idle $state: GPU ${SMI_INDEX[$uuid]:-?} util ${SMI_UTIL[$uuid]:-?}% for ${IDLE_CYCLES[$uuid]:-0} cycles, ${SMI_NPROCS[$uuid]:-0} processes ($reason)"
  events_emit "$event"
}

# Records a failed sample: logged once per streak, reported as a
# monitor_degraded event after SMI_FAIL_ALERT_CYCLES failures in a row.
# Idle counters are left untouched: a failure never counts as idle.
idle_monitor_failed() {
  local now=$1
  MON_FAILS=$((MON_FAILS + 1))
  if ((MON_FAILS == 1)); then
    MON_SINCE=$now
    gg_log error "$SMI_ERROR (logged once until nvidia-smi answers again)"
  fi
  MON_LAST_ERROR=$SMI_ERROR
  if ((!MON_FIRING && MON_FAILS >= SMI_FAIL_ALERT_CYCLES)); then
    MON_FIRING=1
    idle_emit_monitor "$now" firing
  fi
}

# Records a successful sample; resolves a degraded monitor.
idle_monitor_ok() {
  local now=$1
  if ((MON_FAILS > 0)); then
    gg_log info "nvidia-smi answers again after $MON_FAILS failed cycles"
  fi
  if ((MON_FIRING)); then
    idle_emit_monitor "$now" resolved
  fi
  if [[ -n $SMI_ERROR ]]; then
    gg_log debug "$SMI_ERROR"
  fi
  MON_FAILS=0 MON_FIRING=0 MON_SINCE=0 MON_LAST_OK=$now
}

# Emits a monitor_degraded event.
idle_emit_monitor() {
  local now=$1 state=$2 err host_esc event
  gg_json_escape_into "${MON_LAST_ERROR:-}" err
  gg_json_escape_into "$GPUGUARD_HOST" host_esc
  printf -v event '{"ts":%s,"host":"%s","event":"monitor_degraded","state":"%s","failures":%s,"since":%s,"error":"%s"}' \
    "$now" "$host_esc" "$state" "$MON_FAILS" "$MON_SINCE" "$err"
  gg_log warn "monitor_degraded $state after $MON_FAILS failed cycles"
  events_emit "$event"
}
