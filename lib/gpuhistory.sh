# shellcheck shell=bash
# Per-GPU history for `gpuguard report`: one tab-separated row per GPU per
# watchdog cycle in $GPUGUARD_STATE_DIR/gpu-history.tsv. Columns: unix
# time, index, uuid, utilization %, memory used MiB, memory total MiB, power
# W, idle (0 busy or free, 1 counted idle-but-occupied this cycle, 2 the
# idle alert fires), holders ("pid:MiB,pid:MiB", "-" for none, "?" when
# the process list could not be read). Unknown values are empty. Bounded:
# past GPU_HISTORY_MAX_BYTES (config, 8 MiB) the file becomes
# gpu-history.tsv.1 (the previous .1 is dropped), so at most twice that is
# kept: about a week of 8 GPUs at 60 s with the default.

GPUHISTORY_HEADER=$'# ts\tindex\tuuid\tutil_pct\tmem_used_mib\tmem_total_mib\tpower_w\tidle\tholders'

# Appends this cycle's rows (nothing when the sample failed: a failure is not
# a measurement).
# Globals:
#   SMI_* (the last sample), IDLE_CYCLES, IDLE_FIRING, GPUGUARD_STATE_DIR,
#   GPU_HISTORY_MAX_BYTES
# Arguments:
#   $1 now, unix seconds
gpuhistory_append() {
  local now=$1 file=$GPUGUARD_STATE_DIR/gpu-history.tsv
  ((${#SMI_UUIDS[@]})) || return 0
  # an unreadable process list: holders unknown ("?"), not "none"
  local apps_ok=1
  [[ -n ${SMI_ERROR:-} ]] && apps_ok=0
  apps_ok=${SMI_APPS_OK:-$apps_ok}
  local rows='' uuid idle holders pid mem
  for uuid in "${SMI_UUIDS[@]}"; do
    idle=0
    if ((${IDLE_FIRING[$uuid]:-0})); then
      idle=2
    elif ((${IDLE_CYCLES[$uuid]:-0} > 0)); then
      idle=1
    fi
    holders=''
    while IFS=$SMI_FS read -r pid _ mem; do
      [[ -n $pid ]] && holders+="${holders:+,}$pid:$mem"
    done <<<"${SMI_PROCS[$uuid]:-}"
    ((apps_ok)) || holders='?'
    rows+="$now"$'\t'"${SMI_INDEX[$uuid]}"$'\t'"$uuid"$'\t'"${SMI_UTIL[$uuid]:-}"$'\t'"${SMI_MEM_USED[$uuid]:-}"
    rows+=$'\t'"${SMI_MEM_TOTAL[$uuid]:-}"$'\t'"${SMI_POWER[$uuid]:-}"$'\t'"$idle"$'\t'"${holders:--}"$'\n'
  done
  # Never write through a link someone planted in the state folder.
  if [[ -L $file ]]; then
    gg_log warn "$file is a symbolic link; not writing GPU history"
    return 1
  fi
  # The size is asked for (a fork of stat) every 32nd row only: a cycle
  # adds one row per GPU, so the file overshoots its bound by 32 rows a
  # GPU at most.
  GPUHISTORY_ROWS=$((${GPUHISTORY_ROWS:-0} + 1))
  if [[ -f $file ]] && ((GPUHISTORY_ROWS % 32 == 1)); then
    local size
    size=$(stat -c %s -- "$file" 2>/dev/null) || size=0
    if ((size > ${GPU_HISTORY_MAX_BYTES:-8388608})); then
      mv -f -- "$file" "$file.1" || return 1
    fi
  fi
  if [[ ! -e $file ]]; then
    # a new file is made whole (header and rows) and renamed into place
    gg_write_atomic "$file" "$GPUHISTORY_HEADER"$'\n'"$rows"
    return
  fi
  # a full disk is one log line for the whole outage (gg_write_failed)
  { printf '%s' "$rows" >>"$file"; } 2>/dev/null || {
    gg_write_failed "$file"
    return 1
  }
}
