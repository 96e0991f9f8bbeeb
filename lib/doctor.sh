# shellcheck shell=bash
# gpuguard doctor and gpuguard status: the box explains itself.

# Reads doctor's options: --json (one JSON document instead of lines).
doctor_options() {
  declare -g DOCTOR_JSON=0
  while (($#)); do
    case $1 in
      --json) DOCTOR_JSON=1 ;;
      *) gg_usage_error "unknown option '$1' for 'doctor' (see --help)" || return ;;
    esac
    shift
  done
}

# Prints one check line: "OK    what: detail" (or WARN / FAIL / INFO); with
# --json the check is kept for doctor_print_json instead.
doctor_line() {
  local level=$1
  shift
  if ((${DOCTOR_JSON:-0})); then
    local esc
    gg_json_escape_into "$*" esc
    DOCTOR_CHECKS+=("{\"level\":\"$level\",\"message\":\"$esc\"}")
  else
    # a device tool's text among it (a U+FFFD for each of its bytes that
    # was not UTF-8) in ASCII on a console that is not UTF-8
    local text
    gg_term_text_into text "$*"
    printf '%-5s %s\n' "$level" "$text"
  fi
  if [[ $level == FAIL ]]; then
    DOCTOR_FAILS=$((DOCTOR_FAILS + 1))
  fi
  return 0
}

# Prints the checks kept under --json as one document.
doctor_print_json() {
  local host version ok=true
  gg_json_escape_into "$GPUGUARD_HOST" host
  gg_json_escape_into "$(<"$GPUGUARD_ROOT/VERSION")" version
  ((DOCTOR_FAILS == 0)) || ok=false
  local IFS=,
  printf '{"host":"%s","version":"%s","ok":%s,"failures":%s,"checks":[%s]}\n' \
    "$host" "$version" "$ok" "$DOCTOR_FAILS" "${DOCTOR_CHECKS[*]}"
}

# Runs every check; returns 1 when any check failed.
doctor_run() {
  DOCTOR_FAILS=0
  declare -ga DOCTOR_CHECKS=()
  local -a cmd
  read -r -a cmd <<<"${NVIDIA_SMI:-nvidia-smi}"
  ((${DOCTOR_JSON:-0})) || printf 'gpuguard %s on %s\n' "$(<"$GPUGUARD_ROOT/VERSION")" "$GPUGUARD_HOST"
  local kinds
  device_kinds_into kinds
  [[ $kinds == *ascend* ]] && doctor_npu
  if [[ $kinds != *nvidia* ]]; then
    : # an Ascend box without nvidia-smi: nothing more to check here
  elif ! command -v -- "${cmd[0]}" >/dev/null 2>&1; then
    doctor_line FAIL "nvidia-smi: '${cmd[0]}' not found (install the NVIDIA driver, or set NVIDIA_SMI; on Ascend NPUs set GPUGUARD_DEVICE=ascend)"
  else
    # the sample the watchdog and status take, read by their parser: an
    # answer with no valid GPU line (garbage, nothing, a cut line) fails
    # here as it fails every watchdog cycle
    local start=$EPOCHREALTIME
    if ! smi_sample_once; then
      doctor_line FAIL "nvidia-smi: $SMI_ERROR"
    else
      local ms=$(((${EPOCHREALTIME/[.,]/} - ${start/[.,]/}) / 1000))
      doctor_line OK "nvidia-smi answers in ${ms} ms (${#SMI_UUIDS[@]} GPUs)"
      doctor_gpu_rows
      doctor_processes
    fi
  fi
  doctor_host
  doctor_disk_iocost
  doctor_state
  doctor_textfile
  doctor_targets
  if command -v python3 >/dev/null; then
    doctor_line OK "python3: $(python3 -c 'import sys; print(sys.version.split()[0])')"
  else
    doctor_line FAIL "python3 not found: alerts and the leak detector need it"
  fi
  ((${DOCTOR_JSON:-0})) && doctor_print_json
  ((DOCTOR_FAILS == 0))
}

# One line per GPU of the sample just taken (smi_sample_once): its driver,
# MIG and persistence mode. A line of that query that names no GPU of the
# sample (garbage, a cut line) is not shown as a GPU.
doctor_gpu_rows() {
  local info rc=0 uuid bad=0
  local -A sampled=()
  for uuid in "${SMI_UUIDS[@]}"; do
    sampled[${SMI_INDEX[$uuid]}]=1
  done
  info=$(smi_query_info) || rc=$?
  if ((rc != 0)); then
    doctor_line WARN "driver, MIG and persistence not read: $(smi_describe_failure "$rc" "$info")"
    return 0
  fi
  local idx name driver mig persist
  while IFS=, read -r idx name driver mig persist; do
    [[ -n $idx$name ]] || continue
    idx=${idx// /}
    if [[ $idx != +([0-9]) || -z ${sampled[$idx]+set} || -z $persist ]]; then
      bad=$((bad + 1))
      continue
    fi
    doctor_line INFO "GPU ${idx}:${name}, driver${driver}, MIG${mig}, persistence${persist}"
    [[ $mig == *Enabled* ]] && doctor_line WARN "GPU $idx: MIG is on: utilization.gpu reads [N/A], so the idle rule cannot judge it (IDLE_POWER_PCT can)"
    [[ $persist == *Disabled* ]] && doctor_line WARN "GPU $idx: persistence mode off: nvidia-smi calls are slow (nvidia-smi -pm 1)"
  done <<<"$info"
  ((bad == 0)) || doctor_line WARN "driver, MIG and persistence: nvidia-smi printed $bad unreadable line(s)"
  return 0
}

# The Ascend NPUs (lib/npu.sh): does npu-smi answer, in a layout gpuguard
# reads, with a process table; one line per chip.
doctor_npu() {
  local start=$EPOCHREALTIME ms id
  smi_reset
  if ! npu_sample; then
    doctor_line FAIL "npu-smi: $SMI_ERROR"
    return 0
  fi
  ms=$(((${EPOCHREALTIME/[.,]/} - ${start/[.,]/}) / 1000))
  doctor_line OK "npu-smi answers in ${ms} ms (${#SMI_UUIDS[@]} NPU chips)"
  for id in "${SMI_UUIDS[@]}"; do
    doctor_line INFO "NPU ${SMI_INDEX[$id]} ($id): ${SMI_NAME[$id]}, ${SMI_GPU_FAULT[$id]:-Health OK}"
  done
  ((NPU_APPS_OK)) ||
    doctor_line WARN "npu-smi printed no process table: idle alerts wait for one (device faults still alert)"
}

# Whether the PIDs nvidia-smi reports exist here (container PID namespaces).
doctor_processes() {
  if ! device_sample; then
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

# Per disk: whether iocost is in force, with which cost model (a job alone
# writes at most the model's speed times the QoS max), which lets
# lowprio-run's default tier bound a job's disk use without slowing it on
# an idle disk; else lowprio-run falls back to io.max (a hard cap).
doctor_disk_iocost() {
  local disk _sched majmin qos
  if ! cg_iocost_root; then
    doctor_line INFO "iocost not available: $CG_LAST_ERROR; lowprio-run bounds a job's disk with io.max at a fraction of the disk's measured bandwidth, a hard cap even on an idle disk"
    return 0
  fi
  while read -r disk _sched; do
    [[ $disk == dm-* || $disk == md* || ! -r /sys/block/$disk/dev ]] && continue
    majmin=$(<"/sys/block/$disk/dev")
    cg_iocost_line_into "$CG_IOCOST_ROOT/io.cost.qos" "$majmin" qos
    if [[ " $qos " == *" enable=1 "* ]]; then
      doctor_line OK "disk $disk ($majmin): iocost in force (${qos#enable=1 }; $(cg_iocost_model_text "$majmin")): lowprio-run jobs get a low io.weight and keep the disk's speed while nobody else needs it"
    else
      doctor_line INFO "disk $disk ($majmin): iocost off: lowprio-run caps jobs there with io.max (not work-conserving); sudo lowprio-run --setup-disk $majmin turns iocost on (--undo puts it back)"
    fi
  done < <(gg_disk_schedulers)
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

# The textfile metrics' folder, when GPUGUARD_TEXTFILE_DIR is set: a typo
# there went unnoticed (the watchdog makes the folder, node_exporter never
# reads it). A running node_exporter's --collector.textfile.directory is
# compared with it.
doctor_textfile() {
  local dir=${GPUGUARD_TEXTFILE_DIR:-} proc comm arg reads next first=''
  [[ -n $dir ]] || return 0
  local -a args
  for proc in /proc/[0-9]*; do
    { read -r comm <"$proc/comm"; } 2>/dev/null || continue
    [[ $comm == node_exporter || $comm == prometheus-node* ]] || continue
    mapfile -d '' -t args <"$proc/cmdline" 2>/dev/null || continue
    reads='' next=''
    for arg in "${args[@]}"; do
      if [[ -n $next ]]; then
        reads=$arg next=''
      elif [[ $arg == --collector.textfile.directory=* ]]; then
        reads=${arg#*=}
      elif [[ $arg == --collector.textfile.directory ]]; then
        next=1
      fi
    done
    [[ -n $reads ]] || continue
    if [[ ${reads%/} == "${dir%/}" ]]; then
      doctor_line OK "textfile metrics in $dir, which node_exporter (PID ${proc#/proc/}) reads"
      return 0
    fi
    [[ -n $first ]] || first="node_exporter (PID ${proc#/proc/}) reads $reads: set GPUGUARD_TEXTFILE_DIR=$reads"
  done
  if [[ -n $first ]]; then
    doctor_line WARN "textfile metrics go to $dir, but $first"
  elif [[ -d $dir ]]; then
    doctor_line INFO "textfile metrics in $dir (no node_exporter runs here to read them; its --collector.textfile.directory must name this folder)"
  else
    doctor_line WARN "textfile folder $dir does not exist (the watchdog makes it): is it node_exporter's --collector.textfile.directory?"
  fi
}

# Checks each target without posting anything (URL shape, name resolution,
# a TCP connect with a short timeout); `gpuguard notify --test` posts.
doctor_targets() {
  if ! events_targets_configured; then
    local hint
    config_no_target_hint_into hint
    doctor_line WARN "no alert target: $hint (events still go to events.jsonl)"
    return 0
  fi
  local level label detail
  while IFS=$'\t' read -r level label detail; do
    case $level in
      OK | WARN | FAIL) doctor_line "$level" "target $label: $detail" ;;
      *) doctor_line FAIL "target check: $level${label:+ $label}${detail:+ $detail}" ;;
    esac
  done < <(events_helper check 2>&1)
}

# ---------------------------------------------------------------- status --

# Reads status's options into STATUS_MODE (table|json|watch) and
# STATUS_INTERVAL.
status_options() {
  declare -g STATUS_MODE=table STATUS_INTERVAL=2
  local json=0 watch=0 interval=0
  while (($#)); do
    case $1 in
      --json) json=1 ;;
      --watch) watch=1 ;;
      --interval)
        [[ $# -ge 2 ]] || gg_usage_error "--interval needs seconds" || return
        [[ $2 =~ ^[0-9]*([.][0-9]+)?$ && $2 =~ [1-9] ]] ||
          gg_usage_error "--interval needs a number of seconds above 0 (got '$2')" || return
        STATUS_INTERVAL=$2
        interval=1
        shift
        ;;
      *) gg_usage_error "unknown option '$1' for 'status' (see --help)" || return ;;
    esac
    shift
  done
  if ((json && watch)); then
    gg_usage_error "--json and --watch do not go together (--json prints once, for scripts)"
    return
  fi
  # (it was ignored: one table came, where the user waited for a refresh)
  ((watch || ! interval)) || gg_usage_error "--interval goes with --watch (status prints once without it)" || return
  ((json)) && STATUS_MODE=json
  ((watch)) && STATUS_MODE=watch
  return 0
}

# Runs status in the mode its options chose.
status_main() {
  case $STATUS_MODE in
    json) status_json ;;
    watch) status_watch ;;
    *)
      status_colours
      status_collect || {
        status_say "$SMI_ERROR"
        return 1
      }
      status_notes
      status_table
      status_rc
      ;;
  esac
}

# Sets the colour sequences: only on a terminal, and never with NO_COLOR.
status_colours() {
  declare -g C_RED='' C_YEL='' C_GRN='' C_DIM='' C_BOLD='' C_OFF=''
  if [[ -t 1 && -z ${NO_COLOR:-} ]]; then
    C_RED=$'\e[31m' C_YEL=$'\e[33m' C_GRN=$'\e[32m' C_DIM=$'\e[2m' C_BOLD=$'\e[1m' C_OFF=$'\e[0m'
  fi
}

# Samples the GPUs and gathers what status shows: the watchdog's counters,
# the leak watcher's verdicts (by the watched root PID: a GPU process is
# matched to the series of its nearest watched ancestor) and job names.
# Globals (set):
#   SMI_* (the sample), IDLE_* (watchdog state), STATUS_LEAK (by PID:
#   "slope firing verdict"), STATUS_SPARK (by PID: recent memory, comma
#   separated)
status_collect() {
  idle_init
  idle_state_load
  declare -gA STATUS_LEAK=() STATUS_SPARK=()
  declare -ga STATUS_ENDED=()
  jobinfo_reset
  device_sample || return 1
  status_caveats
  # GPU names come with a newer smi.sh; until then they are unknown
  declare -p SMI_NAME >/dev/null 2>&1 || declare -gA SMI_NAME=()
  local pid slope firing verdict values
  while IFS=$'\t' read -r pid slope firing verdict values; do
    [[ -n $pid ]] || continue
    if [[ $pid == ended ]]; then
      # a job that ended: "PID LAST_TS USER SHORT CMDLINE", tab-separated
      STATUS_ENDED+=("$slope"$'\t'"$firing"$'\t'"$verdict"$'\t'"$values")
      continue
    fi
    STATUS_LEAK[$pid]="$slope $firing $verdict"
    STATUS_SPARK[$pid]=$values
  done < <(gg_python gpuguard_report.py "LEAK_THRESHOLD_MIB_H GPUGUARD_NOW" leaks 2>/dev/null)
  gg_proc_scan
  return 0
}

# What the table cannot vouch for, in STATUS_NO_STATE, STATUS_APPS_ERROR
# and STATUS_TOOL_ERROR (empty when all is well): no watchdog has kept its
# counters in this state folder (they read 0: a user's own folder while the
# watchdog runs as root with /var/lib/gpuguard), a process list that could
# not be read (the GPUs then show no holder, which is not the same as none),
# and a device tool that failed while the other answered (its devices are
# missing from the table). STATUS_TOOL_LEFT_OUT is 1 when that tool has
# never found a device here (the watchdog leaves it out: idle_tool_track),
# which is no failure of status.
status_caveats() {
  declare -g STATUS_NO_STATE='' STATUS_APPS_ERROR='' STATUS_TOOL_ERROR='' STATUS_TOOL_LEFT_OUT=0
  if [[ -n ${SMI_TOOL_FAILED:-} ]]; then
    local word=GPUs
    [[ $SMI_TOOL_FAILED == ascend ]] && word=NPUs
    if idle_kind_known "$SMI_TOOL_FAILED"; then
      STATUS_TOOL_ERROR="$SMI_TOOL_ERROR: its $word are not shown"
    else
      STATUS_TOOL_LEFT_OUT=1
      STATUS_TOOL_ERROR="$SMI_TOOL_ERROR: it has found no device here, so it is left out (GPUGUARD_DEVICE names the tool to use)"
    fi
  fi
  gg_state_unwatched_into STATUS_NO_STATE idle.state counters "idle and stuck read 0" "gpuguard status"
  if ((${SMI_APPS_OK:-1} != 1)); then
    STATUS_APPS_ERROR="the process list could not be read (${SMI_ERROR:-no answer}): the holders below are unknown"
  fi
}

# Says STATUS_NO_STATE, STATUS_APPS_ERROR and STATUS_TOOL_ERROR on stderr,
# one line each.
status_notes() {
  [[ -z $STATUS_NO_STATE ]] || status_say "$STATUS_NO_STATE"
  [[ -z $STATUS_APPS_ERROR ]] || status_say "$STATUS_APPS_ERROR"
  [[ -z $STATUS_TOOL_ERROR ]] || status_say "$STATUS_TOOL_ERROR"
  return 0
}

# Says one line of status on stderr as the table is drawn: a device tool's
# text in it (a U+FFFD for each of its bytes that was not UTF-8,
# gg_printable_into) in ASCII on a console that is not UTF-8
# (gg_term_text_into); status --json keeps it UTF-8.
status_say() {
  local text
  gg_term_text_into text "$1"
  printf 'gpuguard status: %s\n' "$text" >&2
}

# The status of `gpuguard status` after a table or document: 1 when a
# device tool failed while the other answered (unless it never found a
# device here), else 0.
status_rc() {
  [[ -n $STATUS_TOOL_ERROR ]] && ((! STATUS_TOOL_LEFT_OUT)) && return 1
  return 0
}

# Prints the PID whose leak series covers a GPU process (itself or its
# nearest watched ancestor); nothing when none does.
status_leak_root() {
  local pid=$1 hops=0
  while [[ -n $pid ]] && ((hops < 64)); do
    if [[ -n ${STATUS_LEAK[$pid]:-} ]]; then
      printf '%s' "$pid"
      return 0
    fi
    pid=${GG_PROC_PPID[$pid]:-}
    hops=$((hops + 1))
  done
  return 0
}

# Names the job of a GPU process as the alerts do (lib/jobinfo.sh): its
# top process's command line with secrets masked, and its user. Fills
# STATUS_JOB_SHORT (the program and script without their folders, cut to
# 48 characters: "python3 train.py --run-name exp7 --api-key ***"),
# STATUS_JOB_CMD (the whole masked command line), STATUS_JOB_USER,
# STATUS_JOB_PID (the job's top process) and STATUS_JOB_VISIBLE (0 when
# this PID namespace cannot see the process: a container's or the host's
# PID; it is then named by its PID alone).
status_job() {
  local pid=$1 top rc=0 i
  # shellcheck disable=SC2034 # filled by jobinfo_stat_into; only its status is used
  local -a st
  local -a args
  STATUS_JOB_SHORT='' STATUS_JOB_CMD='' STATUS_JOB_USER='' STATUS_JOB_PID=$pid STATUS_JOB_VISIBLE=1
  jobinfo_holds_gpu "$pid" || rc=$?
  if ((rc == 1)) || ! jobinfo_stat_into "$pid" st; then
    STATUS_JOB_VISIBLE=0
    STATUS_JOB_SHORT="${2:-pid $pid} (not visible here)"
    return 0
  fi
  jobinfo_top_into "$pid" top
  STATUS_JOB_PID=$top
  jobinfo_args_into "$top" args
  ((${#args[@]})) || jobinfo_args_into "$pid" args
  ((${#args[@]})) || return 0
  jobinfo_mask_args_into STATUS_JOB_CMD "${args[@]}"
  # the folders of the program and of the script it runs say little
  for i in 0 1; do
    [[ ${args[i]:-} == */* && ${args[i]} != -* && ${args[i]} != *=* ]] && args[i]=${args[i]##*/}
  done
  jobinfo_mask_args_into STATUS_JOB_SHORT "${args[@]}"
  if ((${#STATUS_JOB_SHORT} > 48)); then
    gg_cut_into STATUS_JOB_SHORT "$STATUS_JOB_SHORT" 47
    STATUS_JOB_SHORT+="…"
  fi
  local uid
  jobinfo_user_into "$top" uid STATUS_JOB_USER
  [[ -n $STATUS_JOB_USER || -z $uid ]] || STATUS_JOB_USER="uid $uid"
}

# Puts the leak watcher's word on a GPU process into the variables named
# $2 (text: "LEAK +180 MiB/h", "healthy +2 MiB/h"; '' when unwatched) and
# $3 (1 when its alert fires), from STATUS_LEAK.
status_leak_into() {
  local lk_root=$1 lk_slope lk_fires lk_verdict
  local -n lk_text=$2 lk_firing=$3
  lk_text='' lk_firing=0
  [[ -n $lk_root && -n ${STATUS_LEAK[$lk_root]:-} ]] || return 0
  read -r lk_slope lk_fires lk_verdict <<<"${STATUS_LEAK[$lk_root]}"
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  lk_firing=$lk_fires
  [[ $lk_slope == -* ]] || lk_slope="+$lk_slope"
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  lk_text="${lk_verdict:-?} $lk_slope MiB/h"
}

# Puts a GPU's state into the variables named $2 (FAULT (a device fault in
# this sample), ok, idle?, IDLE, STUCK, bad (values out of range), or
# freed / busy / exempt) and $3 (its colour). The counters are the
# watchdog's, saved at its last cycle; the sample is this moment's. An
# alert still open on a GPU that this sample shows free, busy or exempt is
# about to be resolved by the watchdog's next cycle (or the watchdog has
# stopped): calling it IDLE would send someone to a job that has ended.
# (status --json sets no colours: they default to none.)
# shellcheck disable=SC2034 # st_state, st_colour: namerefs, assign the caller's variables
status_state_into() {
  local st_uuid=$1 st_verdict=''
  local -n st_state=$2 st_colour=$3
  idle_settings_for "$st_uuid"
  st_state=ok st_colour=${C_GRN:-}
  if [[ -n ${SMI_GPU_FAULT[$st_uuid]:-} ]]; then
    # a device fault ([GPU requires reset], Health Critical) first: the
    # most serious thing gpuguard knows, what its gpu_degraded alert pages
    # about; the device's readings mean nothing meanwhile
    st_state=FAULT st_colour=${C_RED:-}
  elif ((${IDLE_FIRING[$st_uuid]:-0})); then
    if idle_classify "$st_uuid" st_verdict && [[ $st_verdict != utilization && $st_verdict != spinning ]]; then
      st_state=${st_verdict/released/freed} st_colour=${C_YEL:-}
      return 0
    fi
    st_state=IDLE st_colour=${C_RED:-}
    [[ ${IDLE_KIND[$st_uuid]:-} == gpu_stuck ]] && st_state=STUCK
  elif [[ -n ${SMI_BAD_VALUE[$st_uuid]:-} ]]; then
    # values out of range: the watchdog does not judge it either
    st_state=bad st_colour=${C_YEL:-}
  elif ((${IDLE_CYCLES[$st_uuid]:-0} > 0 || ${IDLE_SPIN[$st_uuid]:-0} > 0)); then
    st_state='idle?' st_colour=${C_YEL:-}
  fi
  return 0
}

# Prints the table from the last status_collect: a line per GPU (its
# counters against their limits), then a line per process holding it
# (its job, the leak watcher's verdict and slope, recent memory).
status_table() {
  local uuid state colour power pid name mem root leak firing user label head=GPU npus=0 short open
  # the first column names what the box has: GPU, NPU (Ascend, lib/npu.sh)
  # or DEV on a box with both
  for uuid in "${SMI_UUIDS[@]}"; do
    [[ ${SMI_VENDOR[$uuid]:-} == ascend ]] && npus=$((npus + 1))
  done
  if ((npus > 0 && npus == ${#SMI_UUIDS[@]})); then
    head=NPU
  elif ((npus > 0)); then
    head=DEV
  fi
  printf '%s%-4s %5s %17s %6s %-9s %-9s %-6s %s%s\n' "$C_BOLD" "$head" UTIL MEMORY POWER IDLE STUCK STATE 'RECENT UTIL' "$C_OFF"
  for uuid in "${SMI_UUIDS[@]}"; do
    status_state_into "$uuid" state colour
    power=${SMI_POWER[$uuid]:-}
    power=${power:+${power%.*}W}
    # an Ascend NPU (lib/npu.sh) reads "npu2": a mixed box lists both kinds
    label=${SMI_INDEX[$uuid]}
    [[ ${SMI_VENDOR[$uuid]:-} == ascend ]] && label=npu$label
    printf '%-4s %4s%% %7s/%-6s MiB %6s %-9s %-9s %s%-6s%s %s\n' "$label" "${SMI_UTIL[$uuid]:-n/a}" \
      "${SMI_MEM_USED[$uuid]:-?}" "${SMI_MEM_TOTAL[$uuid]:-?}" "${power:-n/a}" \
      "idle ${IDLE_CYCLES[$uuid]:-0}/$IDLE_T_MAX" "stuck ${IDLE_SPIN[$uuid]:-0}/$IDLE_T_SPIN" \
      "$colour" "$state" "$C_OFF" "$(status_spark "${IDLE_HISTORY[$uuid]:-}" 100)"
    [[ -z ${SMI_BAD_VALUE[$uuid]:-} ]] || printf '       %snvidia-smi read %s%s\n' "$C_DIM" "${SMI_BAD_VALUE[$uuid]}" "$C_OFF"
    if [[ -n ${SMI_GPU_FAULT[$uuid]:-} ]]; then
      open=''
      ((${IDLE_FAULT_FIRING[$uuid]:-0})) && open=' (gpu_degraded alert open)'
      printf '       %sfault: %s%s%s\n' "$C_RED" "${SMI_GPU_FAULT[$uuid]}" "$open" "$C_OFF"
    fi
    while IFS=$SMI_FS read -r pid name mem; do
      [[ -n $pid ]] || continue
      status_job "$pid" "${name##*/}"
      root=$(status_leak_root "$pid")
      status_leak_into "$root" leak firing
      if ((firing)); then
        leak="$C_RED$leak$C_OFF"
      fi
      user=${STATUS_JOB_USER:+ ($STATUS_JOB_USER)}
      [[ -n $STATUS_JOB_SHORT ]] || STATUS_JOB_SHORT=${name##*/}
      gg_term_text_into short "$STATUS_JOB_SHORT"
      printf '       pid %-8s %7s MiB  %s%s  %s %s%s%s\n' "$pid" "${mem:-?}" "$short" "$user" \
        "$leak" "$C_DIM" "$(status_spark "${STATUS_SPARK[${root:-none}]:-}" 0)" "$C_OFF"
    done <<<"${SMI_PROCS[$uuid]}"
  done
  status_ended_table
}

# Prints the watched jobs that ended in the last hour (from the leak
# watcher's records), so a job that just freed a GPU is still named.
status_ended_table() {
  ((${#STATUS_ENDED[@]})) || return 0
  printf '%sended in the last hour%s\n' "$C_BOLD" "$C_OFF"
  local entry pid ts user short _cmd now
  now=$(gg_now)
  for entry in "${STATUS_ENDED[@]}"; do
    IFS=$'\t' read -r pid ts user short _cmd <<<"$entry"
    [[ $ts =~ ^[0-9]+$ ]] || continue
    [[ $user == - ]] && user=''
    [[ $short == - ]] && short=''
    gg_term_text_into short "$short"
    printf '       pid %-8s %s%s  %slast seen %s min ago%s\n' "$pid" "${short:-(not named)}" "${user:+ ($user)}" \
      "$C_DIM" "$(((now - ts) / 60))" "$C_OFF"
  done
}

# Prints the ended jobs of the last status_collect as a JSON list's items.
status_ended_json() {
  local entry pid ts user short cmd out='' j_user j_short j_cmd
  for entry in "${STATUS_ENDED[@]}"; do
    IFS=$'\t' read -r pid ts user short cmd <<<"$entry"
    [[ $pid =~ ^[0-9]+$ && $ts =~ ^[0-9]+$ ]] || continue
    [[ $user == - ]] && user=''
    [[ $short == - ]] && short=''
    [[ $cmd == - ]] && cmd=''
    jobinfo_json_str_into "$user" j_user
    jobinfo_json_str_into "$short" j_short
    jobinfo_json_str_into "$cmd" j_cmd
    out+="${out:+,}{\"pid\":$pid,\"last_seen_ts\":$ts,\"user\":$j_user,\"job\":$j_short,\"cmdline\":$j_cmd}"
  done
  printf '%s' "$out"
}

# Prints status as one JSON document (for scripts); on a failed sample the
# document holds the error and the status is 1.
status_json() {
  local host err
  gg_json_escape_into "$GPUGUARD_HOST" host
  if ! status_collect; then
    gg_json_escape_into "$SMI_ERROR" err
    printf '{"host":"%s","ts":%s,"error":"%s","gpus":[]}\n' "$host" "$(gg_now)" "$err"
    return 1
  fi
  local gpus='' uuid procs pid name mem root slope firing verdict leak name_esc job_esc cmd user state colour fault
  for uuid in "${SMI_UUIDS[@]}"; do
    status_state_into "$uuid" state colour
    procs=''
    while IFS=$SMI_FS read -r pid name mem; do
      [[ -n $pid ]] || continue
      status_job "$pid" "${name##*/}"
      root=$(status_leak_root "$pid")
      leak=null
      if [[ -n $root ]]; then
        read -r slope firing verdict <<<"${STATUS_LEAK[$root]}"
        leak="{\"slope_mib_per_hour\":$slope,\"firing\":$(status_json_bool "$firing"),\"verdict\":\"${verdict:-unknown}\",\"recent_memory_mib\":[$(status_json_numbers "${STATUS_SPARK[$root]:-}")]}"
      fi
      gg_json_escape_into "${name##*/}" name_esc
      gg_json_escape_into "${STATUS_JOB_SHORT:-${name##*/}}${STATUS_JOB_USER:+ ($STATUS_JOB_USER)}" job_esc
      jobinfo_json_str_into "$STATUS_JOB_CMD" cmd
      jobinfo_json_str_into "$STATUS_JOB_USER" user
      procs+="${procs:+,}{\"pid\":$pid,\"name\":\"$name_esc\",\"job\":\"$job_esc\",\"cmdline\":$cmd,\"user\":$user,\"job_pid\":$STATUS_JOB_PID,\"visible\":$(status_json_bool "$STATUS_JOB_VISIBLE"),\"used_memory_mib\":${mem:-null},\"leak_root_pid\":${root:-null},\"leak\":$leak}"
    done <<<"${SMI_PROCS[$uuid]}"
    gg_json_escape_into "${SMI_NAME[$uuid]:-}" name_esc
    jobinfo_json_str_into "${SMI_GPU_FAULT[$uuid]:-}" fault
    gpus+="${gpus:+,}{\"index\":${SMI_INDEX[$uuid]},\"uuid\":\"$uuid\",\"vendor\":\"${SMI_VENDOR[$uuid]:-nvidia}\",\"name\":\"$name_esc\",\"utilization\":${SMI_UTIL[$uuid]:-null},\"memory_used_mib\":${SMI_MEM_USED[$uuid]:-null},\"memory_total_mib\":${SMI_MEM_TOTAL[$uuid]:-null},\"power_w\":${SMI_POWER[$uuid]:-null},\"idle_cycles\":${IDLE_CYCLES[$uuid]:-0},\"idle_limit\":$IDLE_T_MAX,\"stuck_cycles\":${IDLE_SPIN[$uuid]:-0},\"stuck_limit\":$IDLE_T_SPIN,\"idle_firing\":$(status_json_bool "${IDLE_FIRING[$uuid]:-0}"),\"state\":\"$state\",\"fault\":$fault,\"degraded_firing\":$(status_json_bool "${IDLE_FAULT_FIRING[$uuid]:-0}"),\"recent_utilization\":[$(status_json_numbers "${IDLE_HISTORY[$uuid]:-}")],\"processes\":[$procs]}"
  done
  local no_state=null apps_error=null tool_error=null tool
  jobinfo_json_str_into "$STATUS_NO_STATE" no_state
  jobinfo_json_str_into "$STATUS_APPS_ERROR" apps_error
  if [[ -n $STATUS_TOOL_ERROR ]]; then
    device_tool_into tool "$SMI_TOOL_FAILED"
    jobinfo_json_str_into "$SMI_TOOL_ERROR" tool_error
    tool_error="{\"tool\":\"$tool\",\"vendor\":\"$SMI_TOOL_FAILED\",\"error\":$tool_error,\"left_out\":$(status_json_bool "$STATUS_TOOL_LEFT_OUT")}"
  fi
  printf '{"host":"%s","ts":%s,"error":null,"processes_error":%s,"tool_error":%s,"no_watchdog_state":%s,"gpus":[%s],"ended_jobs":[%s]}\n' \
    "$host" "$(gg_now)" "$apps_error" "$tool_error" "$no_state" "$gpus" "$(status_ended_json)"
  status_rc
}

# Prints the whole numbers of a comma-separated list, comma separated (a
# hand-edited state file never makes the JSON invalid).
status_json_numbers() {
  local v out=''
  local IFS=,
  for v in $1; do
    [[ $v =~ ^[0-9]+$ ]] && out+="${out:+,}$v"
  done
  printf '%s' "$out"
}

# Prints true for a non-zero number, false otherwise.
status_json_bool() {
  if (($1)); then
    printf true
  else
    printf false
  fi
}

# Redraws the table every STATUS_INTERVAL seconds until INT or TERM, then
# exits 0. On a terminal it draws on the alternate screen with the cursor
# hidden and puts both back on the way out; elsewhere it prints one frame
# after another.
status_watch() {
  status_colours
  local tty=0 stop=0 frame sleeper
  [[ -t 1 ]] && tty=1
  trap 'stop=1' INT TERM
  if ((tty)); then
    trap 'printf "\e[?25h\e[?1049l"' EXIT
    printf '\e[?1049h\e[?25l'
  fi
  while ((stop == 0)); do
    frame=$(status_watch_frame 2>&1) || true
    ((stop)) && break
    if ((tty)); then
      # home, each line cleared to its end, the rest of the screen cleared
      printf '\e[H%s\e[K\e[J' "${frame//$'\n'/$'\e[K\n'}"
    else
      printf '%s\n\n' "$frame"
    fi
    sleep "$STATUS_INTERVAL" &
    sleeper=$!
    wait "$sleeper" 2>/dev/null || true
  done
  # the last pause may be over already (or Ctrl-C ended it)
  if [[ -n ${sleeper:-} ]]; then
    kill "$sleeper" 2>/dev/null || true
  fi
  if ((tty)); then
    printf '\e[?25h\e[?1049l'
    trap - EXIT
  fi
  trap - INT TERM
  return 0
}

# One frame of --watch: a title line, then the table (or the error).
status_watch_frame() {
  printf '%sgpuguard status%s  %s  %(%Y-%m-%d %H:%M:%S)T  every %ss, Ctrl-C quits\n' \
    "$C_BOLD" "$C_OFF" "$GPUGUARD_HOST" -1 "$STATUS_INTERVAL"
  if status_collect; then
    status_notes 2>&1
    status_table
  else
    # SMI_ERROR names the tool that failed (nvidia-smi or npu-smi); its
    # text in ASCII on a console that is not UTF-8, as status_say's
    local text
    gg_term_text_into text "$SMI_ERROR"
    printf '%s%s%s\n' "$C_RED" "$text" "$C_OFF"
  fi
}

# Draws a sparkline of comma-separated numbers; $2 the scale's top (0: from
# the smallest to the largest value). Its eight levels are block characters,
# or ASCII ones where the locale is not UTF-8 (gg_utf8_locale).
status_spark() {
  local values=$1 top=$2 v out='' min='' max=0
  local -a bars=(▁ ▂ ▃ ▄ ▅ ▆ ▇ █)
  gg_utf8_locale || bars=(_ . : - '=' + '*' '#')
  [[ -n $values ]] || return 0
  local IFS=,
  for v in $values; do
    v=${v%.*}
    [[ $v =~ ^-?[0-9]+$ ]] || continue
    ((v > max)) && max=$v
    if [[ -z $min ]] || ((v < min)); then
      min=$v
    fi
  done
  [[ -n $min ]] || return 0
  if ((top > 0)); then
    max=$top min=0
  fi
  for v in $values; do
    v=${v%.*}
    [[ $v =~ ^-?[0-9]+$ ]] || continue
    ((v > max)) && v=$max
    if ((max > min)); then
      out+=${bars[$(((v - min) * 7 / (max - min)))]}
    else
      out+=${bars[0]}
    fi
  done
  printf '%s' "$out"
}
