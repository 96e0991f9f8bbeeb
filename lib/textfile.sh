# shellcheck shell=bash
# node_exporter textfile metrics. One file per writer under
# $GPUGUARD_TEXTFILE_DIR, written under another name and renamed so the
# collector never reads half a file; HELP and TYPE for every metric; no
# timestamps; base units (bytes, ratios, seconds). Processes that are gone
# simply are not written again, so series disappear with them.

# Escapes a Prometheus label value (backslash, quote, newline) into $2.
textfile_label_escape_into() {
  local s=$1
  local -n label_ref=$2
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  label_ref=$s
}

# Appends one metric family (HELP, TYPE, samples) to the variable named $1.
# Arguments:
#   $1 output variable, $2 name, $3 type, $4 help, $5 samples (lines
#   "labels value", may be empty: the family is then left out)
textfile_family() {
  local -n family_out=$1
  [[ -n $5 ]] || return 0
  family_out+="# HELP $2 $4"$'\n'"# TYPE $2 $3"$'\n'
  local labels value
  while read -r labels value; do
    [[ -n $labels ]] || continue
    if [[ $labels == '{}' ]]; then
      family_out+="$2 $value"$'\n'
    else
      family_out+="$2$labels $value"$'\n'
    fi
  done <<<"$5"
}

# Whether this process may write its metrics in GPUGUARD_TEXTFILE_DIR
# (made when missing). A fleet config names node_exporter's folder, owned
# by root, for every user: a user's wrapped job cannot write there. That is
# not a full disk and will not pass by itself, so it is said once, with its
# cause, and the metrics are then skipped quietly: once per process, and
# for cron's --once runs (TEXTFILE_ONCE_RUN=1, set by bin/) once per state
# folder, whose textfile-unwritable.said holds the folder last said, until
# the folder is writable again. A wrapped job's watcher says it at its
# start, since each job's log is read on its own.
# Arguments:
#   $1 what writes, for the line (watchdog, watcher)
# Returns:
#   0 writable; 1 not (said once)
textfile_dir_usable() {
  local dir=$GPUGUARD_TEXTFILE_DIR why='' said='' file='' err
  ((${TEXTFILE_ONCE_RUN:-0})) && [[ -n ${GPUGUARD_STATE_DIR:-} ]] && file=$GPUGUARD_STATE_DIR/textfile-unwritable.said
  if [[ ! -d $dir ]] && ! err=$(mkdir -p -- "$dir" 2>&1); then
    # mkdir's reason alone ("Permission denied", "Not a directory")
    why="cannot be made (${err##*: }, uid $EUID)"
  elif [[ ! -w $dir || ! -x $dir ]]; then
    why="is not writable by this user (uid $EUID)"
  fi
  if [[ -z $why ]]; then
    TEXTFILE_UNWRITABLE_SAID=''
    [[ -n $file && -f $file && ! -L $file ]] && rm -f -- "$file"
    return 0
  fi
  [[ ${TEXTFILE_UNWRITABLE_SAID:-} == "$dir" ]] && return 1
  TEXTFILE_UNWRITABLE_SAID=$dir
  [[ -n $file && -f $file && ! -L $file ]] && said=$(<"$file")
  [[ $said == "$dir" ]] && return 1
  gg_log warn "textfile folder $dir $why: no metrics from this $1 (give uid $EUID write access there, or set GPUGUARD_TEXTFILE_DIR= empty for this user's runs)"
  if [[ -n $file && -d $GPUGUARD_STATE_DIR ]]; then gg_write_atomic "$file" "$dir" || true; fi
  return 1
}

# Writes gpuguard_idle.prom from the last sample and the watchdog's state.
# Globals:
#   SMI_* (last sample), IDLE_* and MON_* (state), THRESHOLD; idle_held
#   (lib/idle.sh) decides gpuguard_gpu_held
# Returns:
#   0 written, or skipped: a folder this user cannot write (said once);
#   1 not written (the writer said why, once for an outage)
textfile_write_idle() {
  local now=$1 dir=$GPUGUARD_TEXTFILE_DIR
  textfile_dir_usable watchdog || return 0
  local util='' used='' total='' procs='' cycles='' idle='' power='' pmem='' uuid lbl
  local limit='' spin='' stuck='' fault='' degraded='' held='' rc
  if ((MON_FAILS == 0)); then
    for uuid in "${SMI_UUIDS[@]}"; do
      # vendor: nvidia, or ascend for an NPU chip (lib/npu.sh)
      lbl="{gpu=\"${SMI_INDEX[$uuid]}\",uuid=\"$uuid\",vendor=\"${SMI_VENDOR[$uuid]:-nvidia}\"}"
      [[ -n ${SMI_POWER_LIMIT[$uuid]} ]] && limit+="$lbl ${SMI_POWER_LIMIT[$uuid]}"$'\n'
      spin+="$lbl ${IDLE_SPIN[$uuid]:-0}"$'\n'
      # which alert fires for the GPU: the idle one or the stuck one
      local firing_idle=0 firing_stuck=0 faulted=0
      if ((${IDLE_FIRING[$uuid]:-0})); then
        if [[ ${IDLE_KIND[$uuid]:-} == gpu_stuck ]]; then firing_stuck=1; else firing_idle=1; fi
      fi
      [[ -n ${SMI_GPU_FAULT[$uuid]:-} ]] && faulted=1
      stuck+="$lbl $firing_stuck"$'\n'
      fault+="$lbl $faulted"$'\n'
      degraded+="$lbl ${IDLE_FAULT_FIRING[$uuid]:-0}"$'\n'
      if [[ -n ${SMI_UTIL[$uuid]} ]]; then
        local ratio
        printf -v ratio '%d.%02d' "$((${SMI_UTIL[$uuid]%.*} / 100))" "$((${SMI_UTIL[$uuid]%.*} % 100))"
        util+="$lbl $ratio"$'\n'
      fi
      [[ -n ${SMI_MEM_USED[$uuid]} ]] && used+="$lbl $((${SMI_MEM_USED[$uuid]%.*} * 1048576))"$'\n'
      [[ -n ${SMI_MEM_TOTAL[$uuid]} ]] && total+="$lbl $((${SMI_MEM_TOTAL[$uuid]%.*} * 1048576))"$'\n'
      [[ -n ${SMI_POWER[$uuid]} ]] && power+="$lbl ${SMI_POWER[$uuid]}"$'\n'
      procs+="$lbl ${SMI_NPROCS[$uuid]:-0}"$'\n'
      # the watchdog's own "held" (idle_held, lib/idle.sh), so that the
      # Prometheus rules need not guess it from memory: a free Ascend chip
      # shows 3.4 GB in use; no sample when it cannot be told
      rc=0
      idle_held "$uuid" || rc=$?
      ((rc == 2)) || held+="$lbl $((rc == 0 ? 1 : 0))"$'\n'
      cycles+="$lbl ${IDLE_CYCLES[$uuid]:-0}"$'\n'
      idle+="$lbl $firing_idle"$'\n'
      local pid name mem esc
      while IFS=$SMI_FS read -r pid name mem; do
        [[ -n $pid && -n $mem ]] || continue
        textfile_label_escape_into "${name##*/}" esc
        pmem+="{gpu=\"${SMI_INDEX[$uuid]}\",uuid=\"$uuid\",vendor=\"${SMI_VENDOR[$uuid]:-nvidia}\",pid=\"$pid\",name=\"$esc\"} $((${mem%.*} * 1048576))"$'\n'
      done <<<"${SMI_PROCS[$uuid]}"
    done
  fi
  local out='' threshold held_s='' idle_held_s=''
  # the ledger's all-time counters by user (lib/ledger.sh), when it runs
  declare -F ledger_samples_into >/dev/null && ledger_samples_into held_s idle_held_s
  # shellcheck disable=SC2153 # THRESHOLD is a config key set by config_load
  printf -v threshold '%d.%02d' "$((THRESHOLD / 100))" "$((THRESHOLD % 100))"
  textfile_family out gpuguard_gpu_utilization_ratio gauge 'GPU utilization (an Ascend NPU: its AICore), 0-1 (absent under MIG).' "$util"
  textfile_family out gpuguard_gpu_memory_used_bytes gauge 'GPU memory (an Ascend NPU: its HBM or DDR) in use.' "$used"
  textfile_family out gpuguard_gpu_memory_total_bytes gauge 'GPU memory (an Ascend NPU: its HBM or DDR) in all.' "$total"
  textfile_family out gpuguard_gpu_power_watts gauge 'GPU or NPU power draw.' "$power"
  textfile_family out gpuguard_gpu_processes gauge 'Compute processes on the GPU or NPU.' "$procs"
  textfile_family out gpuguard_gpu_held gauge \
    '1 while a job holds the GPU or NPU as the watchdog judges it: processes listed, or memory beyond IDLE_MEM_MIB (an NPU: plus its firmware reserve).' "$held"
  textfile_family out gpuguard_gpu_idle_cycles gauge 'Consecutive idle-but-occupied cycles.' "$cycles"
  textfile_family out gpuguard_gpu_idle gauge '1 while the idle-but-occupied alert fires.' "$idle"
  textfile_family out gpuguard_gpu_power_limit_watts gauge 'GPU power limit in force (none for an NPU: npu-smi info gives none).' "$limit"
  textfile_family out gpuguard_gpu_spin_cycles gauge \
    'Cycles of this idle streak at high utilization and idle-floor power (spinning).' "$spin"
  textfile_family out gpuguard_gpu_stuck gauge '1 while the stuck (spinning) alert fires.' "$stuck"
  textfile_family out gpuguard_gpu_fault gauge '1 when nvidia-smi prints a device fault for the GPU (reset needed, unknown error), or npu-smi a Health other than OK for the NPU.' "$fault"
  textfile_family out gpuguard_gpu_degraded gauge '1 while the GPU (or NPU) degraded alert fires.' "$degraded"
  textfile_family out gpuguard_process_gpu_memory_bytes gauge 'GPU (or NPU) memory held by a compute process.' "$pmem"
  textfile_family out gpuguard_gpu_held_seconds_total counter \
    'GPU-seconds held by jobs of the user (LEDGER_NAMES: name, hash or none).' "$held_s"
  textfile_family out gpuguard_gpu_idle_held_seconds_total counter \
    'GPU-seconds held by jobs of the user while idle or stuck (LEDGER_NAMES: name, hash or none).' "$idle_held_s"
  textfile_family out gpuguard_idle_threshold_ratio gauge 'Utilization under which a held GPU counts as idle.' \
    "{} $threshold"
  textfile_family out gpuguard_monitor_up gauge '1 when the last sample of the device tools (nvidia-smi, npu-smi) succeeded.' \
    "{} $((MON_FAILS == 0 ? 1 : 0))"
  textfile_family out gpuguard_monitor_consecutive_failures gauge 'Failed samples of the device tools (nvidia-smi, npu-smi) in a row.' "{} $MON_FAILS"
  textfile_family out gpuguard_monitor_last_success_timestamp_seconds gauge 'Time of the last good sample.' \
    "{} ${MON_LAST_OK:-0}"
  textfile_family out gpuguard_monitor_last_cycle_timestamp_seconds gauge 'Time of the last cycle.' "{} $now"
  gg_write_atomic "$dir/gpuguard_idle.prom" "$out"
}

# The leak metrics' file of this watcher instance (LEAK_INSTANCE, ARCHITECTURE.md,
# rule 6) into the variable named $1: gpuguard_leak-<instance>.prom.
# Several watchers share a box (wrapped jobs beside an --all daemon); one
# shared file held only the series of whichever wrote last, so every
# scrape saw one watcher at random and the leak alert flapped. Instance
# names are made of letters, digits, '-' and '_' already; anything else
# becomes '_', so the name stays one file in the folder.
# shellcheck disable=SC2034 # nameref: assigns the caller's variable
textfile_leak_path_into() {
  local -n path_ref=$1
  path_ref=$GPUGUARD_TEXTFILE_DIR/gpuguard_leak-${LEAK_INSTANCE//[!A-Za-z0-9_-]/_}.prom
}

# Removes this watcher's leak metrics file: a wrapped job's, once the job
# has ended (its name, the wrapper's PID, is used once; its series are gone).
textfile_remove_leak() {
  local path
  [[ -n ${GPUGUARD_TEXTFILE_DIR:-} && -n $LEAK_INSTANCE ]] || return 0
  textfile_leak_path_into path
  rm -f -- "$path"
}

# Writes this watcher's gpuguard_leak-<instance>.prom from its last cycle.
# Every series is labelled watcher="<instance>", so two watchers of one
# process never give node_exporter the same label set twice (its textfile
# collector fails the whole scrape on a duplicate across files); the rules
# take the worst verdict over watchers (max without (watcher)), so such a
# process is still one alert. gpuguard_leak_watcher_last_cycle_timestamp_seconds
# says when the watcher last wrote: a file left by a watcher killed with
# -9 is seen as stale, and gg_retention removes it (a wrapped job's at
# once, when its wrapper is gone; any other untouched for RETENTION_DAYS).
# Globals:
#   LEAK_INSTANCE, LEAK_STATUS (by root PID: "slope firing used_mib severity oom_s name",
#   tab-separated; severity none|info|warning|critical). A series with a
#   malformed or empty field is left out, as nvidia-smi garbage is: it
#   never stops the watcher nor puts a line node_exporter rejects (which
#   would drop the whole file).
# Returns:
#   0 written, or skipped: a folder this user cannot write (said once);
#   1 not written (the writer said why, once for an outage)
textfile_write_leak() {
  local mem='' slope='' firing='' sevs='' ooms='' pid s f used sev oom name esc lbl
  local watcher path now
  [[ -n $LEAK_INSTANCE ]] || return 1
  textfile_dir_usable watcher || return 0
  textfile_label_escape_into "$LEAK_INSTANCE" watcher
  # shellcheck disable=SC2034 # slope_abs is only checked: the slope may be negative
  local slope_abs used_mib
  local -A sev_level=([none]=0 [info]=1 [warning]=2 [critical]=3)
  for pid in "${!LEAK_STATUS[@]}"; do
    IFS=$'\t' read -r s f used sev oom name <<<"${LEAK_STATUS[$pid]}"
    gg_is_uint "$pid" || continue
    gg_number_into slope_abs "${s#-}" dec 0 || continue
    [[ $f == [01] ]] || continue
    # at most 10^12 MiB: times 2^20 it stays within bash arithmetic
    gg_number_into used_mib "$used" int 0 1000000000000 || continue
    case $sev in
      none | info | warning | critical) ;;
      *) continue ;;
    esac
    textfile_label_escape_into "$name" esc
    lbl="{pid=\"$pid\",name=\"$esc\",watcher=\"$watcher\"}"
    mem+="$lbl $((used_mib * 1048576))"$'\n'
    # the slope while it fires is the one the alert reports
    slope+="$lbl $s"$'\n'
    firing+="$lbl $f"$'\n'
    sevs+="$lbl ${sev_level[$sev]}"$'\n'
    if gg_is_uint "$oom"; then ooms+="$lbl $oom"$'\n'; fi
  done
  local out=''
  textfile_family out gpuguard_process_tree_gpu_memory_bytes gauge \
    'GPU memory held by a watched process and its descendants.' "$mem"
  textfile_family out gpuguard_process_leak_slope_mib_per_hour gauge \
    'GPU memory trend of a watched process tree (its worst process), MiB per hour.' "$slope"
  textfile_family out gpuguard_process_leak gauge "1 while gpu-leak-watch's leak alert fires for the process tree." "$firing"
  textfile_family out gpuguard_process_leak_severity gauge \
    "gpu-leak-watch's verdict: 0 no leak, 1 trend note (OOM over 7 days away), 2 warning, 3 critical (OOM within 6 h)." "$sevs"
  textfile_family out gpuguard_process_leak_projected_oom_seconds gauge \
    'Time until the GPU runs out of memory at the present trend (absent when not growing or unknown).' "$ooms"
  gg_now_into now
  textfile_family out gpuguard_leak_watcher_last_cycle_timestamp_seconds gauge \
    "Time of the leak watcher's last cycle (a file not written for several --interval is a stopped watcher's)." \
    "{watcher=\"$watcher\"} $now"
  textfile_leak_path_into path
  gg_write_atomic "$path" "$out"
}
