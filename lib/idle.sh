# shellcheck shell=bash
# The idle watchdog's rules and memory. A GPU held by a job (compute
# processes on it, or, when the process list is hidden or empty, as in a
# container, memory.used above IDLE_MEM_MIB) is judged each cycle by two
# signals:
#
# - idle (event gpu_idle): utilization under THRESHOLD for MAX_IDLE_CYCLES
#   cycles in a row.
# - stuck, spinning (event gpu_stuck): utilization at or above SPIN_UTIL_MIN
#   while the power draw stays under IDLE_POWER_PCT % of the GPU's power
#   limit, for SPIN_CYCLES cycles in a row. A kernel that spin-waits (a
#   collective waiting for a dead peer, torch.cuda._sleep) keeps
#   utilization.gpu at 100 %, which only says a kernel was resident during
#   the sample window, while the SMs do next to nothing and the GPU draws
#   its idle floor.
#
# Default from measurements on an H200 (power limit 700 W; the raw samples
# are in tests/fixtures/h200/dmon-gpm.txt): spinning drew 121-135 W
# (17-19 % of the limit) at 100 %; the lightest real work at 100 %
# (latency-bound tiny kernels replayed by a CUDA graph) drew 183-192 W
# (26-27 %), batch-1 GEMV decode 545-640 W, a memory copy 409-476 W, a bf16
# matmul 692 W. IDLE_POWER_PCT=22 (154 W on 700 W) sits between, 19 W above
# the highest spin and 29 W below the lightest work. SPIN_UTIL_MIN=90 keeps
# launch-bound work out (tiny kernels launched from Python: 23-41 % at
# 125-139 W, spin-level power); every spin read 100 %. SPIN_CYCLES=5 is
# longer than MAX_IDLE_CYCLES because healthy ranks also spin for a while in
# a collective while one rank saves a checkpoint or evaluates, and shorter
# than PyTorch's default NCCL timeout (10 min) at the default 60 s cycle.
# A loop starved by its data loader (a burst of kernels, then hundreds of ms
# of CPU) reads 0-a few % at the idle floor: it is idle under the
# utilization rule, like any held GPU doing nothing most of the time, and
# never stuck (its utilization is far under SPIN_UTIL_MIN); a burst read
# over THRESHOLD restarts its count.
#
# One incident per GPU: cycles of either kind keep it open (a spinning job
# that then idles is still the same hung job), a busy cycle or the job
# leaving resolves it, with the event name it fired under. Per-job rules
# (IDLE_RULES, see idle_rules_load) exempt jobs or change THRESHOLD,
# MAX_IDLE_CYCLES, SPIN_CYCLES and IDLE_POWER_PCT for them.
#
# Faults: a cycle whose process list could not be read (SMI_APPS_OK=0) or
# whose GPU reads no utilization or memory changes no count and resolves
# nothing; failed cycles in a row raise one monitor_degraded event after
# SMI_FAIL_ALERT_CYCLES. A GPU reading [N/A] utilization (MIG) is not
# judged and logged once, and is no failure; a GPU reading values out of
# their range (SMI_BAD_VALUE) is not judged and fails the cycle. A GPU
# whose line carries a device fault (SMI_GPU_FAULT: "GPU requires reset",
# "Unknown Error") for SMI_FAIL_ALERT_CYCLES readings raises one critical
# gpu_degraded event, resolved when it reads fine again. One whose UUID
# reads "[GPU is lost]" is followed under the UUID last read at its index
# (smi_key_lost), so the incident resolves when that GPU reads fine, not
# when another one does.
#
# Exactly once across kill -9: events of a cycle are first saved with the
# state (one atomic write, "pending" lines), then enqueued (events_emit),
# then the state is saved without them, then events_flush delivers. A run
# that finds pending lines enqueues those its events.jsonl does not hold.

# GPUs absent from this many successful samples in a row are forgotten, so
# the state stays bounded when GPUs are reset or MIG is reconfigured.
IDLE_FORGET_AFTER=60

# Declares the watchdog's state arrays (empty).
idle_init() {
  declare -gA IDLE_CYCLES=() IDLE_SPIN=() IDLE_SINCE=() IDLE_FIRING=() IDLE_KIND=() \
  IDLE_LAST_ALERT=() IDLE_ABSENT=() IDLE_NA_LOGGED=() IDLE_HISTORY=() IDLE_JOB_PID=() \
  IDLE_JOB_JSON=() IDLE_FAULT=() IDLE_FAULT_FIRING=() IDLE_HOLDERS=()
  declare -ga IDLE_PENDING=() IDLE_PENDING_IDS=()
  declare -gA IDLE_RULE_TEXT=()
  declare -g IDLE_PENDING_RECOVERED=0
  # filled by smi_sample (ARCHITECTURE.md, rule 1); declared so an older smi.sh reads as "no fault"
  declare -p SMI_GPU_FAULT &>/dev/null || declare -gA SMI_GPU_FAULT=()
  declare -p SMI_BAD_VALUE &>/dev/null || declare -gA SMI_BAD_VALUE=()
  declare -p SMI_NAME &>/dev/null || declare -gA SMI_NAME=()
  # the UUID last read at each GPU index (smi_key_lost), kept in the state
  # so that cron mode knows a GPU whose UUID reads "[GPU is lost]" too
  declare -p SMI_UUID_AT &>/dev/null || declare -gA SMI_UUID_AT=()
  declare -g MON_FAILS=0 MON_FIRING=0 MON_SINCE=0 MON_LAST_OK=0 MON_LAST_ERROR='' IDLE_PREV_OK=0
  # whose tool failed (nvidia, or ascend: lib/npu.sh), for the event's words
  declare -g MON_VENDOR=nvidia
  # a tool that fails while the other answers (a mixed box, auto:
  # device_sample's SMI_TOOL_FAILED): its kind, streak, alert, and 1 when it
  # never found a device here (left out: one log line, no alert)
  declare -g MON_TOOL_VENDOR='' MON_TOOL_FAILS=0 MON_TOOL_FIRING=0 MON_TOOL_SINCE=0 MON_TOOL_LEFT_OUT=0
  # the rules are idle_rules_load's; kept when it ran first
  declare -p IDLE_RULE_KIND &>/dev/null ||
    declare -ga IDLE_RULE_KIND=() IDLE_RULE_PAT=() IDLE_RULE_SET=() IDLE_RULE_WHERE=()
}

# Loads persisted state from $GPUGUARD_STATE_DIR/idle.state; a corrupt line
# is skipped with a warning (the counter starts again from 0).
idle_state_load() {
  local file=$GPUGUARD_STATE_DIR/idle.state line kind uuid n
  [[ -f $file ]] || return 0
  local -a f
  while IFS= read -r line || [[ -n $line ]]; do
    kind=${line%% *}
    case $kind in
      gpu)
        # gpu UUID low since firing last absent na [spin kind jobpid fault
        # faultfiring holders]
        read -r -a f <<<"$line"
        uuid=${f[1]:-} n=${#f[@]}
        # (counted before the defaults below fill the older files' columns:
        # a line cut after its sixth field is corrupt, not an old format)
        : "${f[8]:=0}" "${f[9]:=-}" "${f[10]:=0}" "${f[11]:=0}" "${f[12]:=0}" "${f[13]:=-}"
        if ((n >= 8)) && [[ $uuid =~ ^(GPU|MIG|NPU)- ]] && idle_all_uint "${f[@]:2:5}" "${f[8]}" "${f[10]}" "${f[11]}" "${f[12]}" &&
          [[ ${f[9]} =~ ^(-|gpu_idle|gpu_stuck)$ && ${f[13]} =~ ^(-|(,[0-9]+)+,)$ ]]; then
          IDLE_CYCLES[$uuid]=${f[2]} IDLE_SINCE[$uuid]=${f[3]}
          IDLE_FIRING[$uuid]=${f[4]} IDLE_LAST_ALERT[$uuid]=${f[5]}
          IDLE_ABSENT[$uuid]=${f[6]} IDLE_SPIN[$uuid]=${f[8]} IDLE_KIND[$uuid]=${f[9]}
          IDLE_JOB_PID[$uuid]=${f[10]} IDLE_FAULT[$uuid]=${f[11]} IDLE_FAULT_FIRING[$uuid]=${f[12]}
          [[ ${f[7]:-0} == 1 ]] && IDLE_NA_LOGGED[$uuid]=1
          [[ ${f[13]} == - ]] || IDLE_HOLDERS[$uuid]=${f[13]}
          continue
        fi
        ;;
      index)
        # a GPU index and the UUID last read there
        read -r -a f <<<"$line"
        if ((${#f[@]} == 3)) && gg_is_uint "${f[1]}" && [[ ${f[2]} =~ ^(GPU|MIG)- ]]; then
          SMI_UUID_AT[${f[1]}]=${f[2]}
          continue
        fi
        ;;
      history)
        # uuid column, then the last utilization samples, comma separated
        read -r -a f <<<"$line"
        if [[ ${f[2]:-} =~ ^[0-9,-]*$ && ${#f[@]} == 3 ]]; then
          IDLE_HISTORY[${f[1]}]=${f[2]}
          continue
        fi
        ;;
      monitor)
        # columns: failure streak, firing flag, streak start, last success,
        # then 1 when the failing tool is npu-smi (older files: 0)
        read -r -a f <<<"$line"
        if idle_all_uint "${f[@]:1:4}" && ((${#f[@]} >= 5)); then
          MON_FAILS=${f[1]} MON_FIRING=${f[2]} MON_SINCE=${f[3]} MON_LAST_OK=${f[4]}
          [[ ${f[5]:-0} == 1 ]] && MON_VENDOR=ascend
          continue
        fi
        ;;
      tool)
        # the tool failing while the other answers: its kind, streak,
        # firing flag, streak start, left out (idle_tool_track)
        read -r -a f <<<"$line"
        if ((${#f[@]} == 6)) && [[ ${f[1]} =~ ^(nvidia|ascend)$ ]] && idle_all_uint "${f[@]:2:4}"; then
          MON_TOOL_VENDOR=${f[1]} MON_TOOL_FAILS=${f[2]} MON_TOOL_FIRING=${f[3]}
          MON_TOOL_SINCE=${f[4]} MON_TOOL_LEFT_OUT=${f[5]}
          continue
        fi
        ;;
      job)
        # job UUID JOB-JSON: the job the incident's alerts named, for its
        # resolved event once the job is gone
        read -r kind uuid f <<<"$line"
        if [[ $uuid =~ ^(GPU|MIG|NPU)- && ${line#job "$uuid" } == '{'*'}' ]]; then
          IDLE_JOB_JSON[$uuid]=${line#job "$uuid" }
          continue
        fi
        ;;
      pending)
        # pending ID EVENT-JSON: saved, maybe not enqueued (killed between)
        read -r kind uuid f <<<"$line"
        if [[ -n $uuid && ${line#pending "$uuid" } == '{'*'}' ]]; then
          IDLE_PENDING_IDS+=("$uuid")
          IDLE_PENDING+=("${line#pending "$uuid" }")
          IDLE_PENDING_RECOVERED=1
          continue
        fi
        ;;
    esac
    gg_log warn "ignoring corrupt line in $file"
  done <"$file"
}

# True when every argument is a whole number.
idle_all_uint() {
  local v
  for v in "$@"; do gg_is_uint "$v" || return 1; done
}

# Writes the state atomically, and only when it changed since the last write.
idle_state_save() {
  local uuid state i
  # The last good sample is kept to the minute: it changes every cycle,
  # and a write each second (a temporary file, fsync, rename: two forks)
  # would be the daemon's main cost on a quiet box. A restart reads it at
  # most a minute old, and the next good cycle sets it again.
  local mon_npu=0
  [[ $MON_VENDOR == ascend ]] && mon_npu=1
  printf -v state 'monitor %s %s %s %s %s 0 0\n' "$MON_FAILS" "$MON_FIRING" "$MON_SINCE" "$((MON_LAST_OK / 60 * 60))" "$mon_npu"
  if [[ -n $MON_TOOL_VENDOR ]]; then
    state+="tool $MON_TOOL_VENDOR $MON_TOOL_FAILS $MON_TOOL_FIRING $MON_TOOL_SINCE $MON_TOOL_LEFT_OUT"$'\n'
  fi
  for uuid in "${!IDLE_CYCLES[@]}"; do
    printf -v state '%sgpu %s %s %s %s %s %s %s %s %s %s %s %s %s\n' "$state" "$uuid" "${IDLE_CYCLES[$uuid]}" \
      "${IDLE_SINCE[$uuid]:-0}" "${IDLE_FIRING[$uuid]:-0}" \
      "${IDLE_LAST_ALERT[$uuid]:-0}" "${IDLE_ABSENT[$uuid]:-0}" "${IDLE_NA_LOGGED[$uuid]:-0}" \
      "${IDLE_SPIN[$uuid]:-0}" "${IDLE_KIND[$uuid]:--}" "${IDLE_JOB_PID[$uuid]:-0}" \
      "${IDLE_FAULT[$uuid]:-0}" "${IDLE_FAULT_FIRING[$uuid]:-0}" "${IDLE_HOLDERS[$uuid]:--}"
  done
  for uuid in "${!IDLE_HISTORY[@]}"; do
    [[ -n ${IDLE_CYCLES[$uuid]+set} ]] && state+="history $uuid ${IDLE_HISTORY[$uuid]}"$'\n'
  done
  for uuid in "${!IDLE_JOB_JSON[@]}"; do
    [[ -n ${IDLE_CYCLES[$uuid]+set} ]] && state+="job $uuid ${IDLE_JOB_JSON[$uuid]}"$'\n'
  done
  for i in "${!SMI_UUID_AT[@]}"; do
    state+="index $i ${SMI_UUID_AT[$i]}"$'\n'
  done
  for i in "${!IDLE_PENDING[@]}"; do
    state+="pending ${IDLE_PENDING_IDS[i]} ${IDLE_PENDING[i]}"$'\n'
  done
  [[ $state == "${IDLE_SAVED_STATE:-}" ]] && return 0
  gg_write_atomic "$GPUGUARD_STATE_DIR/idle.state" "$state" || return
  IDLE_SAVED_STATE=$state
}

# Runs one watchdog cycle: sample, judge every GPU, save the incidents with
# their events, enqueue the events, save, deliver.
# Arguments:
#   $1 current time, unix seconds
idle_cycle() {
  local now=$1
  # events saved by a run killed before it enqueued them
  ((${#IDLE_PENDING[@]} == 0)) || idle_pending_emit
  jobinfo_reset
  # the last good sample before this one (idle_continuity)
  IDLE_PREV_OK=$MON_LAST_OK
  if ! device_sample; then
    idle_monitor_failed "$now"
    # (a tool failing alone before: its streak neither grows nor ends
    # while no tool answers)
  elif idle_tool_track "$now" && ((${SMI_APPS_OK:-1} != 1)); then
    # The GPU lines are fine but the process list is not: nothing about
    # occupancy can be told this cycle; device faults still can.
    idle_monitor_failed "$now"
    idle_judge_all "$now" faults-only
  else
    # a GPU whose line reads values out of range (utilization 250 %, more
    # memory used than it has) is a failed reading of that GPU: it is not
    # judged and the cycle counts towards monitor_degraded; the others are
    # judged as usual
    local bad
    if smi_bad_values_into bad; then
      SMI_ERROR="$bad; not judged"
      idle_monitor_failed "$now"
    else
      idle_monitor_ok "$now"
    fi
    idle_judge_all "$now"
  fi
  if ((${#IDLE_PENDING[@]})); then
    # the incident and its events reach the disk together, before any send
    # (a failed save was logged by the writer, once for a whole outage)
    if idle_state_save; then
      idle_pending_emit
    fi
  fi
  idle_state_save || true
  # who held which GPU, idle or not, for the day's ledger (lib/ledger.sh)
  if declare -F ledger_cycle >/dev/null; then ledger_cycle "$now" || gg_log warn "ledger: cycle not accounted"; fi
  events_flush
  if [[ -n ${GPUGUARD_TEXTFILE_DIR:-} ]]; then
    textfile_write_idle "$now" || gg_write_outage || gg_log warn "could not write textfile metrics in $GPUGUARD_TEXTFILE_DIR"
  fi
  gpuhistory_append "$now" || gg_write_outage || gg_log warn "could not append to $GPUGUARD_STATE_DIR/gpu-history.tsv"
}

# Enqueues the pending events, in order, then forgets them. After a crash
# (pending lines loaded from the state), an event whose id events.jsonl
# already holds was enqueued before the kill and is not enqueued again.
idle_pending_emit() {
  local i id
  for i in "${!IDLE_PENDING[@]}"; do
    id=${IDLE_PENDING_IDS[i]}
    if ((IDLE_PENDING_RECOVERED)) &&
      grep -qE -- "\"id\": ?\"${id//[^A-Za-z0-9_:-]/.}\"" "$GPUGUARD_STATE_DIR/events.jsonl" 2>/dev/null; then
      continue
    fi
    events_emit "${IDLE_PENDING[i]}"
  done
  IDLE_PENDING=() IDLE_PENDING_IDS=()
  IDLE_PENDING_RECOVERED=0
}

# Queues an event of this cycle (see idle_cycle for the order of writes).
# Arguments:
#   $1 unique id (also in the JSON as "id"), $2 the event, one line of JSON
idle_queue_event() {
  IDLE_PENDING_IDS+=("$1")
  IDLE_PENDING+=("$2")
}

# Judges every GPU of a successful sample and forgets long-absent ones.
# Arguments:
#   $1 now, $2 "faults-only" to judge device faults only (no process list)
idle_judge_all() {
  local now=$1 mode=${2:-} uuid index kind
  local -A seen=()
  idle_settings_default
  for uuid in "${SMI_UUIDS[@]}"; do
    seen[$uuid]=1
    IDLE_ABSENT[$uuid]=0
    : "${IDLE_CYCLES[$uuid]:=0}"
    if idle_judge_fault "$now" "$uuid" && [[ $mode != faults-only && -z ${SMI_BAD_VALUE[$uuid]:-} ]]; then
      idle_judge_gpu "$now" "$uuid"
    fi
  done
  idle_settings_default
  for uuid in "${!IDLE_CYCLES[@]}"; do
    [[ -n ${seen[$uuid]:-} ]] && continue
    # a device of a tool that failed this cycle (the other answered) is not
    # judged: it is not absent, it was not asked
    if [[ -n ${SMI_TOOL_FAILED:-} ]]; then
      device_kind_into kind "$uuid"
      [[ $kind == "$SMI_TOOL_FAILED" ]] && continue
    fi
    # A GPU missing from one sample (a garbage line) keeps its state.
    IDLE_ABSENT[$uuid]=$((${IDLE_ABSENT[$uuid]:-0} + 1))
    if ((${IDLE_ABSENT[$uuid]} >= IDLE_FORGET_AFTER)); then
      ((${IDLE_FIRING[$uuid]:-0})) && idle_emit "$now" "$uuid" resolved gone
      ((${IDLE_FAULT_FIRING[$uuid]:-0})) && idle_emit_fault "$now" "$uuid" resolved gone
      unset "IDLE_CYCLES[$uuid]" "IDLE_SPIN[$uuid]" "IDLE_SINCE[$uuid]" "IDLE_FIRING[$uuid]" \
        "IDLE_KIND[$uuid]" "IDLE_LAST_ALERT[$uuid]" "IDLE_ABSENT[$uuid]" "IDLE_NA_LOGGED[$uuid]" \
        "IDLE_HISTORY[$uuid]" "IDLE_JOB_PID[$uuid]" "IDLE_JOB_JSON[$uuid]" "IDLE_FAULT[$uuid]" \
        "IDLE_FAULT_FIRING[$uuid]" "IDLE_HOLDERS[$uuid]"
      # a GPU gone this long is not the one a lost line at its index names
      for index in "${!SMI_UUID_AT[@]}"; do
        if [[ ${SMI_UUID_AT[$index]} == "$uuid" ]]; then
          unset "SMI_UUID_AT[$index]"
        fi
      done
    fi
  done
}

# Follows a GPU's device fault (SMI_GPU_FAULT, ARCHITECTURE.md, rule 1). Returns 1 while
# the GPU reads a fault: its values are unknown, so it is not judged idle.
idle_judge_fault() {
  local now=$1 uuid=$2
  local fault=${SMI_GPU_FAULT[$uuid]:-}
  if [[ -n $fault ]]; then
    IDLE_FAULT[$uuid]=$((${IDLE_FAULT[$uuid]:-0} + 1))
    if ((! ${IDLE_FAULT_FIRING[$uuid]:-0} && ${IDLE_FAULT[$uuid]} >= SMI_FAIL_ALERT_CYCLES)); then
      IDLE_FAULT_FIRING[$uuid]=1
      idle_emit_fault "$now" "$uuid" firing fault
    fi
    return 1
  fi
  if ((${IDLE_FAULT_FIRING[$uuid]:-0})); then
    idle_emit_fault "$now" "$uuid" resolved recovered
  fi
  IDLE_FAULT[$uuid]=0 IDLE_FAULT_FIRING[$uuid]=0
  return 0
}

# Sets the rule values in force for one GPU (IDLE_T_THRESHOLD, IDLE_T_MAX,
# IDLE_T_SPIN, IDLE_T_PCT, IDLE_T_EXEMPT, IDLE_T_RULE) from the defaults and
# the first per-job rule matching the job that holds most memory on it.
idle_settings_for() {
  local uuid=$1
  idle_settings_default
  ((${#IDLE_RULE_KIND[@]})) || return 0
  local pid name mem best='' best_mem=-1
  while IFS=$SMI_FS read -r pid name mem; do
    [[ -n $pid ]] || continue
    if ((${mem:-0} > best_mem)); then
      best=$pid best_mem=${mem:-0}
    fi
  done <<<"${SMI_PROCS[$uuid]:-}"
  [[ -n $best ]] || return 0
  local user cmd i setting
  idle_rule_text_into "$best" user cmd || return 0
  for i in "${!IDLE_RULE_KIND[@]}"; do
    idle_rule_matches "$i" "$user" "$cmd" || continue
    IDLE_T_RULE=${IDLE_RULE_WHERE[i]}
    for setting in ${IDLE_RULE_SET[i]}; do
      case $setting in
        exempt) IDLE_T_EXEMPT=1 ;;
        THRESHOLD=*) IDLE_T_THRESHOLD=${setting#*=} ;;
        MAX_IDLE_CYCLES=*) IDLE_T_MAX=${setting#*=} ;;
        SPIN_CYCLES=*) IDLE_T_SPIN=${setting#*=} ;;
        IDLE_POWER_PCT=*) IDLE_T_PCT=${setting#*=} ;;
      esac
    done
    return 0
  done
}

# Puts the user and command line a per-job rule is matched against for
# PID into the variables named $2 and $3; returns 1 when PID is another
# process in this namespace (it matches no rule). Kept per process (PID
# and start time) in IDLE_RULE_TEXT: the lookup runs every cycle for each
# held GPU, and telling whether a PID holds /dev/nvidia* costs a fork.
idle_rule_text_into() {
  local pid=$1 key
  local -n rt_user=$2 rt_cmd=$3
  local -a st
  gg_proc_stat_into "/proc/$pid/stat" st || return 1
  key="$pid:${st[21]:-}"
  if [[ -z ${IDLE_RULE_TEXT[$key]+set} ]]; then
    # a cache of processes still alive only: a few GPUs' holders
    ((${#IDLE_RULE_TEXT[@]} < 256)) || IDLE_RULE_TEXT=()
    if jobinfo_holds_gpu "$pid" || (($? == 2)); then
      jobinfo_match_text_into "$pid" rt_user rt_cmd
      IDLE_RULE_TEXT[$key]="1"$'\x1f'"$rt_user"$'\x1f'"$rt_cmd"
    else
      IDLE_RULE_TEXT[$key]=0
    fi
  fi
  local text=${IDLE_RULE_TEXT[$key]}
  [[ $text == 1* ]] || return 1
  text=${text#1$'\x1f'}
  # shellcheck disable=SC2034 # namerefs: assign the caller's variables
  rt_user=${text%%$'\x1f'*} rt_cmd=${text#*$'\x1f'}
}

# Sets the rule values in force to the configuration's (no per-job rule).
idle_settings_default() {
  IDLE_T_THRESHOLD=$THRESHOLD IDLE_T_MAX=$MAX_IDLE_CYCLES IDLE_T_SPIN=$SPIN_CYCLES
  IDLE_T_PCT=$IDLE_POWER_PCT IDLE_T_EXEMPT=0 IDLE_T_RULE=''
}

# True when rule $1 matches a job's user ($2) or command lines ($3).
idle_rule_matches() {
  local i=$1 user=$2 cmd=$3 rc=1
  case ${IDLE_RULE_KIND[i]} in
    user) [[ " $user " == *" ${IDLE_RULE_PAT[i]} "* ]] && rc=0 ;;
    cmd)
      shopt -s nocasematch
      [[ $cmd =~ ${IDLE_RULE_PAT[i]} ]] && rc=0
      shopt -u nocasematch
      ;;
  esac
  return "$rc"
}

# Reads the per-job idle rules from $IDLE_RULES (nothing when empty). One
# rule a line, "MATCH SETTING...": MATCH is cmd:REGEX (extended, case-
# insensitive, searched in the GPU process's and its job's command lines;
# may hold spaces) or user:NAME (name or uid); SETTINGs are `exempt` or
# KEY=VALUE for THRESHOLD, MAX_IDLE_CYCLES, SPIN_CYCLES, IDLE_POWER_PCT
# (checked like the configuration). # starts a comment line. Parsed as data.
# Returns:
#   2 with "FILE:LINE: why" for a line that is not a rule, or an unreadable file
idle_rules_load() {
  declare -ga IDLE_RULE_KIND=() IDLE_RULE_PAT=() IDLE_RULE_SET=() IDLE_RULE_WHERE=()
  local file=${IDLE_RULES:-}
  [[ -n $file ]] || return 0
  if [[ -d $file || ! -r $file ]]; then
    gg_usage_error "IDLE_RULES: cannot read rules file $file"
    return
  fi
  local line n=0 match settings last rest kind pat key value rc
  while IFS= read -r line || [[ -n $line ]]; do
    n=$((n + 1))
    ((n == 1)) && line=${line#$'\xef\xbb\xbf'}
    line=${line%$'\r'}
    [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
    match=${line#"${line%%[![:space:]]*}"} settings=''
    # settings are the trailing words that look like settings
    while [[ $match =~ ^(.*[^[:space:]])[[:space:]]+([^[:space:]]+)$ ]]; do
      last=${BASH_REMATCH[2]} rest=${BASH_REMATCH[1]}
      [[ $last == exempt || $last =~ ^[A-Z_]+=.*$ ]] || break
      match=$rest
      settings="$last${settings:+ $settings}"
    done
    if [[ -z $settings || ! $match =~ ^(cmd|user):(.+)$ ]]; then
      gg_usage_error "$file:$n: expected 'cmd:REGEX SETTING...' or 'user:NAME SETTING...' (SETTING: exempt or KEY=VALUE)"
      return
    fi
    kind=${BASH_REMATCH[1]} pat=${BASH_REMATCH[2]}
    if [[ $kind == cmd ]]; then
      # status 2: the expression does not compile (1: it does, no match)
      rc=0
      # shellcheck disable=SC2319 # $? is the status of the [[ =~ ]] test
      [[ '' =~ $pat ]] || rc=$?
      if ((rc == 2)); then
        gg_usage_error "$file:$n: bad regular expression '$pat'"
        return
      fi
    elif [[ $pat =~ [[:space:]] ]]; then
      gg_usage_error "$file:$n: a user name has no spaces"
      return
    fi
    local setting normalised=''
    for setting in $settings; do
      if [[ $setting == exempt ]]; then
        normalised+=" exempt"
        continue
      fi
      key=${setting%%=*} value=${setting#*=}
      case $key in
        THRESHOLD | MAX_IDLE_CYCLES | SPIN_CYCLES | IDLE_POWER_PCT) ;;
        *)
          gg_usage_error "$file:$n: unknown setting $key (THRESHOLD, MAX_IDLE_CYCLES, SPIN_CYCLES, IDLE_POWER_PCT or exempt)"
          return
          ;;
      esac
      local -A checked=()
      # the configuration's own check, its error prefixed with file:line
      GG_PROG="${GG_PROG:-gpuguard}: $file:$n" config_validate "$key" "$value" "${GG_CONFIG_KIND[$key]}" checked || return
      value=${checked[$key]:-$value}
      normalised+=" $key=$((10#$value))"
    done
    IDLE_RULE_KIND+=("$kind") IDLE_RULE_PAT+=("$pat") IDLE_RULE_SET+=("${normalised# }")
    IDLE_RULE_WHERE+=("$file:$n")
  done <"$file"
}

# Whether the device $1 is held this cycle: compute processes listed on
# it, or, when none are (a container hides them), memory in use over
# IDLE_MEM_MIB plus what the device shows with nothing on it (SMI_MEM_BASE:
# an Ascend NPU's firmware reserve, 3.4 GB of a 910B's 64 GB, lib/npu.sh;
# none on NVIDIA GPUs). The one test of "held": the idle and stuck rules,
# the ledger (lib/ledger.sh) and the gpuguard_gpu_held metric
# (lib/textfile.sh) all ask it, so a free chip is never booked or alerted.
# Returns:
#   0 held, 1 free, 2 cannot be told (no process listed, memory unknown)
idle_held() {
  local used=${SMI_MEM_USED[$1]:-}
  ((${SMI_NPROCS[$1]:-0} == 0)) || return 0
  [[ -n $used ]] || return 2
  ((${used%.*} > IDLE_MEM_MIB + ${SMI_MEM_BASE[$1]:-0})) || return 1
  return 0
}

# Decides, for one GPU, whether it is idle or spinning, into the variable
# named $2: utilization, spinning, busy, released (no longer held) or
# exempt (a per-job rule). Returns 2 when it cannot be told this cycle
# (utilization, or memory of a GPU without listed processes, unknown; power
# unknown while a spin is being counted).
# shellcheck disable=SC2034 # verdict_ref: nameref, assigns the caller's variable
idle_classify() {
  local uuid=$1
  local -n verdict_ref=$2
  verdict_ref=''
  local util=${SMI_UTIL[$uuid]:-}
  local power=${SMI_POWER[$uuid]:-} limit=${SMI_POWER_LIMIT[$uuid]:-}
  [[ -n $util ]] || return 2
  idle_settings_for "$uuid"
  # unknown memory of a GPU without listed processes is not "released"
  local held=0
  idle_held "$uuid" || held=$?
  ((held != 2)) || return 2
  if ((held == 1)); then
    verdict_ref=released
    return 0
  fi
  if ((IDLE_T_EXEMPT)); then
    verdict_ref=exempt
  elif ((${util%.*} < IDLE_T_THRESHOLD)); then
    verdict_ref=utilization
  elif ((IDLE_T_PCT > 0 && ${util%.*} >= SPIN_UTIL_MIN)); then
    if [[ -z $power || -z $limit ]] || ((${limit%.*} == 0)); then
      # cannot tell spinning from busy: hold a spin count, else busy
      if ((${IDLE_SPIN[$uuid]:-0} > 0)) || [[ ${IDLE_KIND[$uuid]:-} == gpu_stuck ]]; then
        return 2
      fi
      verdict_ref=busy
    elif ((${power%.*} * 100 < IDLE_T_PCT * ${limit%.*})); then
      verdict_ref=spinning
    else
      verdict_ref=busy
    fi
  else
    verdict_ref=busy
  fi
  return 0
}

# Puts the PIDs holding a GPU this cycle into the variable named $1, as
# ",PID,PID," in nvidia-smi's order (empty when none are listed: a
# container's hidden PIDs).
# Arguments:
#   $1 variable name, $2 uuid
idle_holders_into() {
  local -n holders_ref=$1
  local pid _rest
  holders_ref=''
  while IFS=$SMI_FS read -r pid _rest; do
    [[ -n $pid ]] || continue
    holders_ref=${holders_ref:-,}$pid,
  done <<<"${SMI_PROCS[$2]:-}"
}

# Puts into the variable named $1 the longest wait between two good
# samples that still counts as watching without a break: 5 cycles of
# CHECK_INTERVAL, at least 15 minutes. Past it (the watchdog or its cron
# line stopped, the host asleep) the idle counts start again
# (idle_continuity) and the ledger's idle stretches end (ledger_account),
# so both draw the line in the same place.
idle_pause_limit_into() {
  local -n pause_ref=$1
  pause_ref=$((5 * CHECK_INTERVAL))
  ((pause_ref >= 900)) || pause_ref=900
}

# An idle count belongs to one job watched without a break. It starts again
# when no process that held the GPU last cycle holds it now (another job
# took the GPU) or when no good sample came for a long while (the watchdog
# or its cron line was stopped, nvidia-smi failed): before, a job that
# took the GPU from an idle one fired on its own first idle sample, and
# after a day of downtime the alert charged that day to whoever held the
# GPU then. An open incident of a job that has left is resolved
# ("released": its job gave the GPU up); one whose job is still there
# goes on across a gap, without the gap in its idle time. Hidden PIDs
# (containers) compare as unknown.
# Arguments:
#   $1 now, $2 uuid
idle_continuity() {
  local now=$1 uuid=$2 holders pid other_job=0 gap=0 limit
  local was=${IDLE_HOLDERS[$uuid]:-}
  idle_pause_limit_into limit
  idle_holders_into holders "$uuid"
  IDLE_HOLDERS[$uuid]=$holders
  if [[ -n $was && -n $holders ]]; then
    other_job=1
    for pid in ${was//,/ }; do
      [[ $holders == *",$pid,"* ]] && other_job=0 && break
    done
  fi
  ((IDLE_PREV_OK > 0 && now - IDLE_PREV_OK > limit)) && gap=1
  ((other_job || gap)) || return 0
  if ((${IDLE_FIRING[$uuid]:-0})); then
    if ((! other_job)); then
      # the incident goes on; the time nobody watched is not counted as
      # idle (its reminders said "idle 23 h" and its cost after a night
      # with the cron line stopped, where the ledger counts what it saw)
      ((${IDLE_SINCE[$uuid]:-0} > 0)) &&
        IDLE_SINCE[$uuid]=$((IDLE_SINCE[$uuid] + now - IDLE_PREV_OK - CHECK_INTERVAL))
      return 0
    fi
    idle_emit "$now" "$uuid" resolved released
  elif ((gap && (${IDLE_CYCLES[$uuid]:-0} > 0 || ${IDLE_SPIN[$uuid]:-0} > 0))) && [[ ${IDLE_GAP_SAID:-} != "$now" ]]; then
    # once a cycle; from a cron line slower than CHECK_INTERVAL this comes
    # every run, and says what to change
    IDLE_GAP_SAID=$now
    gg_log info "no good sample for $(((now - IDLE_PREV_OK) / 60)) min (more than 5 cycles of CHECK_INTERVAL=${CHECK_INTERVAL}s): idle counts start again (from cron, set CHECK_INTERVAL to the cron line's period)"
  fi
  IDLE_CYCLES[$uuid]=0 IDLE_SPIN[$uuid]=0 IDLE_SINCE[$uuid]=0 IDLE_FIRING[$uuid]=0
  IDLE_LAST_ALERT[$uuid]=0 IDLE_KIND[$uuid]=- IDLE_JOB_PID[$uuid]=0
  unset "IDLE_JOB_JSON[$uuid]"
}

# Applies the rules to one GPU.
idle_judge_gpu() {
  local now=$1 uuid=$2 verdict rc=0
  idle_classify "$uuid" verdict || rc=$?
  if ((rc == 2)); then
    if [[ -z ${SMI_UTIL[$uuid]} && -z ${IDLE_NA_LOGGED[$uuid]:-} ]]; then
      local word
      device_word_into word "$uuid"
      gg_log warn "$word ${SMI_INDEX[$uuid]} ($uuid): utilization not available ([N/A], MIG?); not judged"
      IDLE_NA_LOGGED[$uuid]=1
    fi
    return 0
  fi
  unset "IDLE_NA_LOGGED[$uuid]"
  idle_history_add "$uuid" "${SMI_UTIL[$uuid]%.*}"
  if [[ $verdict == utilization || $verdict == spinning ]]; then
    idle_continuity "$now" "$uuid"
  else
    idle_holders_into "IDLE_HOLDERS[$uuid]" "$uuid"
  fi
  case $verdict in
    utilization) IDLE_CYCLES[$uuid]=$((${IDLE_CYCLES[$uuid]:-0} + 1)) ;;
    spinning) IDLE_SPIN[$uuid]=$((${IDLE_SPIN[$uuid]:-0} + 1)) ;;
    *)
      if ((${IDLE_FIRING[$uuid]:-0})); then
        idle_emit "$now" "$uuid" resolved "$verdict"
      fi
      IDLE_CYCLES[$uuid]=0 IDLE_SPIN[$uuid]=0 IDLE_SINCE[$uuid]=0 IDLE_FIRING[$uuid]=0
      IDLE_LAST_ALERT[$uuid]=0 IDLE_KIND[$uuid]=- IDLE_JOB_PID[$uuid]=0
      unset "IDLE_JOB_JSON[$uuid]"
      return 0
      ;;
  esac
  ((${IDLE_SINCE[$uuid]:-0} > 0)) || IDLE_SINCE[$uuid]=$now
  if ((! ${IDLE_FIRING[$uuid]:-0})); then
    local kind=''
    if ((${IDLE_CYCLES[$uuid]} >= IDLE_T_MAX)); then
      kind=gpu_idle
    elif ((${IDLE_SPIN[$uuid]:-0} >= IDLE_T_SPIN)); then
      kind=gpu_stuck
    fi
    if [[ -n $kind ]]; then
      IDLE_FIRING[$uuid]=1 IDLE_KIND[$uuid]=$kind IDLE_LAST_ALERT[$uuid]=$now
      idle_emit "$now" "$uuid" firing "$verdict"
    fi
  elif ((REPEAT_INTERVAL > 0 && now - ${IDLE_LAST_ALERT[$uuid]:-0} >= REPEAT_INTERVAL)); then
    IDLE_LAST_ALERT[$uuid]=$now
    idle_emit "$now" "$uuid" reminder "$verdict"
  fi
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

# Puts the JSON of the jobs holding a GPU into the variables named $2 (the
# job holding the most memory, or null) and $3 (all of them, a JSON list);
# each job object gets "used_memory_mib" (its memory on this GPU).
idle_jobs_json_into() {
  local ij_uuid=$1
  local -n main_ref=$2 all_ref=$3
  local ij_pid ij_mem ij_key
  local -A ij_group_mem=() ij_group_pid=()
  local -a ij_order=()
  while IFS=$SMI_FS read -r ij_pid _ ij_mem; do
    [[ -n $ij_pid ]] || continue
    ij_key=x$ij_pid
    # a PID this namespace cannot vouch for stays a job of its own
    if jobinfo_holds_gpu "$ij_pid" || (($? == 2)); then
      jobinfo_top_into "$ij_pid" ij_key
    fi
    if [[ -z ${ij_group_pid[$ij_key]:-} ]]; then
      ij_group_pid[$ij_key]=$ij_pid
      ij_order+=("$ij_key")
    fi
    ij_group_mem[$ij_key]=$((${ij_group_mem[$ij_key]:-0} + ${ij_mem:-0}))
  done <<<"${SMI_PROCS[$ij_uuid]:-}"
  local ij_job ij_best_mem=-1 ij_all=''
  main_ref=null
  for ij_key in "${ij_order[@]}"; do
    jobinfo_json_into "${ij_group_pid[$ij_key]}" ij_job
    ij_job="${ij_job%\}},\"used_memory_mib\":${ij_group_mem[$ij_key]}}"
    ij_all+="${ij_all:+,}$ij_job"
    if ((${ij_group_mem[$ij_key]} > ij_best_mem)); then
      # shellcheck disable=SC2034 # nameref: assigns the caller's variable
      ij_best_mem=${ij_group_mem[$ij_key]} main_ref=$ij_job
    fi
  done
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  all_ref="[$ij_all]"
}

# Puts the cost of SECONDS of one GPU at GPU_HOUR_PRICE a hour, with two
# decimals, into the variable named $2 ('' when no price is set).
idle_cost_into() {
  local seconds=$1
  local -n cost_ref=$2
  cost_ref=''
  local price=${GPU_HOUR_PRICE:-0} int frac
  int=${price%%.*} frac=''
  [[ $price == *.* ]] && frac=${price#*.}
  frac=${frac}000
  frac=${frac:0:3}
  local milli=$((10#$int * 1000 + 10#$frac))
  ((milli > 0)) || return 0
  # cents, rounded half up
  local cents=$(((milli * seconds + 18000) / 36000))
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  printf -v cost_ref '%d.%02d' "$((cents / 100))" "$((cents % 100))"
}

# Builds and queues a gpu_idle or gpu_stuck event for one GPU.
# Arguments:
#   $1 now, $2 uuid, $3 state (firing|reminder|resolved), $4 reason
#   (utilization|spinning; busy|released|exempt|gone when resolved)
idle_emit() {
  local now=$1 uuid=$2 state=$3 reason=$4
  local kind=${IDLE_KIND[$uuid]:-gpu_idle} since=${IDLE_SINCE[$uuid]:-0} procs='' pid name mem esc
  [[ $kind == - ]] && kind=gpu_idle
  local idle_seconds=0
  ((since > 0)) && idle_seconds=$((now - since))
  while IFS=$SMI_FS read -r pid name mem; do
    [[ -n $pid ]] || continue
    gg_json_escape_into "$name" esc
    procs+="${procs:+,}{\"pid\":$pid,\"name\":\"$esc\",\"used_memory_mib\":${mem:-null}}"
  done <<<"${SMI_PROCS[$uuid]:-}"
  local job=null jobs='[]' incident='' top
  [[ -n ${SMI_PROCS[$uuid]:-} ]] && idle_jobs_json_into "$uuid" job jobs
  if [[ $state == resolved ]]; then
    # The job the incident's alerts named: once it has ended and freed the
    # GPU the event lists no job, and only this says whose GPU was released.
    incident=",\"incident_job\":${IDLE_JOB_JSON[$uuid]:-null}"
  elif [[ $job != null ]]; then
    # kept for the resolved event (also across runs, in idle.state)
    IDLE_JOB_JSON[$uuid]=$job
    top=${job#*\"pid\":}
    IDLE_JOB_PID[$uuid]=${top%%,*}
  fi
  local host_esc gpu_name=null cost='' cost_json=''
  gg_json_escape_into "$GPUGUARD_HOST" host_esc
  jobinfo_json_str_into "${SMI_NAME[$uuid]:-}" gpu_name
  idle_cost_into "$idle_seconds" cost
  if [[ -n $cost ]]; then
    gg_json_escape_into "$GPU_PRICE_CURRENCY" esc
    cost_json=",\"gpu_hour_price\":$GPU_HOUR_PRICE,\"currency\":\"$esc\",\"cost\":$cost"
  fi
  local rule=null
  jobinfo_json_str_into "${IDLE_T_RULE:-}" rule
  local job_pid=${IDLE_JOB_PID[$uuid]:-0}
  ((job_pid > 0)) || job_pid=null
  local id="$now-$uuid-$kind-$state" event
  printf -v event '{"id":"%s","ts":%s,"host":"%s","event":"%s","state":"%s","reason":"%s","gpu":%s,"uuid":"%s","gpu_name":%s,"utilization":%s,"threshold":%s,"memory_used_mib":%s,"memory_total_mib":%s,"power_draw_w":%s,"power_limit_w":%s,"idle_power_pct":%s,"idle_cycles":%s,"spin_cycles":%s,"idle_seconds":%s,"since":%s,"rule":%s,"processes":[%s],"job":%s,"jobs":%s,"incident_job_pid":%s%s}' \
    "$id" "$now" "$host_esc" "$kind" "$state" "$reason" "${SMI_INDEX[$uuid]:-null}" "$uuid" "$gpu_name" \
    "${SMI_UTIL[$uuid]:-null}" "${IDLE_T_THRESHOLD:-$THRESHOLD}" "${SMI_MEM_USED[$uuid]:-null}" \
    "${SMI_MEM_TOTAL[$uuid]:-null}" "${SMI_POWER[$uuid]:-null}" "${SMI_POWER_LIMIT[$uuid]:-null}" \
    "${IDLE_T_PCT:-$IDLE_POWER_PCT}" "$((${IDLE_CYCLES[$uuid]:-0} + ${IDLE_SPIN[$uuid]:-0}))" \
    "${IDLE_SPIN[$uuid]:-0}" "$idle_seconds" "$since" "$rule" "$procs" "$job" "$jobs" "$job_pid" \
    "$cost_json$incident,\"vendor\":\"${SMI_VENDOR[$uuid]:-nvidia}\""
  local word
  device_word_into word "$uuid"
  gg_log warn "$kind $state: $word ${SMI_INDEX[$uuid]:-?} util ${SMI_UTIL[$uuid]:-?}% for $((${IDLE_CYCLES[$uuid]:-0} + ${IDLE_SPIN[$uuid]:-0})) cycles, ${SMI_NPROCS[$uuid]:-0} processes ($reason), power ${SMI_POWER[$uuid]:-?} W"
  idle_queue_event "$id" "$event"
}

# Builds and queues a gpu_degraded event (critical) for a GPU whose line
# carries a device fault.
# Arguments:
#   $1 now, $2 uuid, $3 state (firing|resolved), $4 reason (fault|recovered|gone)
idle_emit_fault() {
  local now=$1 uuid=$2 state=$3 reason=$4 host_esc gpu_name fault event
  gg_json_escape_into "$GPUGUARD_HOST" host_esc
  jobinfo_json_str_into "${SMI_NAME[$uuid]:-}" gpu_name
  jobinfo_json_str_into "${SMI_GPU_FAULT[$uuid]:-}" fault
  local id="$now-$uuid-gpu_degraded-$state"
  printf -v event '{"id":"%s","ts":%s,"host":"%s","event":"gpu_degraded","state":"%s","reason":"%s","severity":"critical","gpu":%s,"uuid":"%s","gpu_name":%s,"fault":%s,"faulted_cycles":%s,"vendor":"%s"}' \
    "$id" "$now" "$host_esc" "$state" "$reason" "${SMI_INDEX[$uuid]:-null}" "$uuid" "$gpu_name" "$fault" \
    "${IDLE_FAULT[$uuid]:-0}" "${SMI_VENDOR[$uuid]:-nvidia}"
  local word
  device_word_into word "$uuid"
  gg_log error "gpu_degraded $state: $word ${SMI_INDEX[$uuid]:-?} ($uuid): ${SMI_GPU_FAULT[$uuid]:-$reason}"
  idle_queue_event "$id" "$event"
}

# Records a failed sample: logged once per streak, reported as a
# monitor_degraded event after SMI_FAIL_ALERT_CYCLES failures in a row.
# Idle counters are left untouched: a failure never counts as idle.
idle_monitor_failed() {
  local now=$1 tool
  MON_FAILS=$((MON_FAILS + 1))
  # the tool that failed names the event (a firing one keeps its own)
  ((MON_FIRING)) || MON_VENDOR=${SMI_FAILED_VENDOR:-$MON_VENDOR}
  device_tool_into tool "$MON_VENDOR"
  if ((MON_FAILS == 1)); then
    MON_SINCE=$now
    gg_log error "$SMI_ERROR (logged once until $tool answers again)"
  fi
  MON_LAST_ERROR=$SMI_ERROR
  if ((! MON_FIRING && MON_FAILS >= SMI_FAIL_ALERT_CYCLES)); then
    MON_FIRING=1
    idle_emit_monitor "$now" firing
  fi
}

# Records a successful sample; resolves a degraded monitor.
idle_monitor_ok() {
  local now=$1 tool
  device_tool_into tool "$MON_VENDOR"
  if ((MON_FAILS > 0)); then
    gg_log info "$tool answers again after $MON_FAILS failed cycles"
  fi
  if ((MON_FIRING)); then
    idle_emit_monitor "$now" resolved
  fi
  if [[ -n $SMI_ERROR ]]; then
    gg_log debug "$SMI_ERROR"
  fi
  MON_FAILS=0 MON_FIRING=0 MON_SINCE=0 MON_LAST_OK=$now MON_VENDOR=nvidia
}

# True when the watchdog's state holds a device of kind $1 (nvidia or
# ascend): its tool found one here (and not for IDLE_FORGET_AFTER good
# samples since).
idle_kind_known() {
  local uuid kind
  for uuid in "${!IDLE_CYCLES[@]}"; do
    device_kind_into kind "$uuid"
    [[ $kind == "$1" ]] && return 0
  done
  return 1
}

# Follows a tool that fails while the other answers (device_sample's
# SMI_TOOL_FAILED on a mixed box, or a box with a leftover tool): its
# devices are not judged, and after SMI_FAIL_ALERT_CYCLES failures in a row
# it raises its own monitor_degraded (the event carries "tool"), resolved
# when it answers again. A tool that has never found a device here (none of
# its kind in the state: an NVIDIA box with npu-smi from a CANN image, an
# Ascend box with nvidia-smi but no NVIDIA driver) is left out of auto:
# one log line a streak, no alert. Always returns 0 (idle_cycle's chain).
idle_tool_track() {
  local now=$1 failed=${SMI_TOOL_FAILED:-} tool word=GPUs
  if [[ -n $MON_TOOL_VENDOR && $MON_TOOL_VENDOR != "$failed" ]]; then
    device_tool_into tool "$MON_TOOL_VENDOR"
    if ((! MON_TOOL_LEFT_OUT)); then
      gg_log info "$tool answers again after $MON_TOOL_FAILS failed cycles"
    fi
    ((MON_TOOL_FIRING)) && idle_emit_tool_monitor "$now" resolved
    MON_TOOL_VENDOR='' MON_TOOL_FAILS=0 MON_TOOL_FIRING=0 MON_TOOL_SINCE=0 MON_TOOL_LEFT_OUT=0
  fi
  [[ -n $failed ]] || return 0
  device_tool_into tool "$failed"
  [[ $failed == ascend ]] && word=NPUs
  MON_TOOL_VENDOR=$failed
  MON_TOOL_FAILS=$((MON_TOOL_FAILS + 1))
  if ((MON_TOOL_FAILS == 1)); then
    MON_TOOL_SINCE=$now MON_TOOL_LEFT_OUT=0
    if idle_kind_known "$failed"; then
      gg_log error "$SMI_TOOL_ERROR; its $word are not judged, the others are (logged once until $tool answers again)"
    else
      MON_TOOL_LEFT_OUT=1
      gg_log warn "$SMI_TOOL_ERROR; $tool has found no device here: left out until it answers (no alert; GPUGUARD_DEVICE names the tool to use)"
    fi
  fi
  if ((! MON_TOOL_LEFT_OUT && ! MON_TOOL_FIRING && MON_TOOL_FAILS >= SMI_FAIL_ALERT_CYCLES)); then
    MON_TOOL_FIRING=1
    idle_emit_tool_monitor "$now" firing
  fi
  return 0
}

# Queues the monitor_degraded event of a tool failing alone (idle_tool_track):
# its own id and "tool", so that it is an incident apart from a failed
# cycle's.
idle_emit_tool_monitor() {
  local now=$1 state=$2 err host_esc event tool
  device_tool_into tool "$MON_TOOL_VENDOR"
  gg_json_escape_into "${SMI_TOOL_ERROR:-$tool answers again}" err
  gg_json_escape_into "$GPUGUARD_HOST" host_esc
  local id="$now-monitor-$tool-$state"
  printf -v event '{"id":"%s","ts":%s,"host":"%s","event":"monitor_degraded","state":"%s","failures":%s,"since":%s,"error":"%s","vendor":"%s","tool":"%s"}' \
    "$id" "$now" "$host_esc" "$state" "$MON_TOOL_FAILS" "$MON_TOOL_SINCE" "$err" "$MON_TOOL_VENDOR" "$tool"
  gg_log warn "monitor_degraded $state: $tool after $MON_TOOL_FAILS failed cycles"
  idle_queue_event "$id" "$event"
}

# Queues a monitor_degraded event.
idle_emit_monitor() {
  local now=$1 state=$2 err host_esc event
  gg_json_escape_into "${MON_LAST_ERROR:-}" err
  gg_json_escape_into "$GPUGUARD_HOST" host_esc
  local id="$now-monitor-$state"
  # vendor: as on the device events, so that the alert says NPU and
  # npu-smi when npu-smi failed
  printf -v event '{"id":"%s","ts":%s,"host":"%s","event":"monitor_degraded","state":"%s","failures":%s,"since":%s,"error":"%s","vendor":"%s"}' \
    "$id" "$now" "$host_esc" "$state" "$MON_FAILS" "$MON_SINCE" "$err" "$MON_VENDOR"
  gg_log warn "monitor_degraded $state after $MON_FAILS failed cycles"
  idle_queue_event "$id" "$event"
}
