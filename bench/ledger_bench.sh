#!/usr/bin/env bash
# Summary: time the ledger's per-cycle work (ledger_cycle) at 8 GPUs
# Usage: ledger_bench.sh CYCLES
# Sources the real libraries and fills the sample as smi_sample would for 8
# GPUs held by 8 jobs (real processes holding a stand-in device file, so
# the job lookup is the real one), half of them idle; then calls
# ledger_cycle CYCLES times one minute apart and prints "cpu_ms_per_cycle
# N" (this shell and its children: the day file's atomic writes fork)
# and "day_file_bytes N".

# shellcheck disable=SC2034 # the arrays and globals are the libraries' (the sample, the verdicts)
GPUGUARD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
for lib in "$GPUGUARD_ROOT"/lib/*.sh; do
  # shellcheck source=/dev/null
  source "$lib"
done

# Prints this shell's and its children's CPU time in milliseconds.
cpu_ms() {
  local -a t
  read -r -a t </proc/$$/stat
  local ticks=$((t[13] + t[14] + t[15] + t[16]))
  printf '%s\n' "$((ticks * 1000 / $(getconf CLK_TCK)))"
}

main() {
  local cycles=$1 i uuid dev pids=() before after now
  config_load || return
  gg_state_dir_init || return
  dev=$GPUGUARD_STATE_DIR/nvidia0
  : >"$dev"
  JOBINFO_DEVICE_GLOB="$GPUGUARD_STATE_DIR/nvidia*"
  for i in 0 1 2 3 4 5 6 7; do
    # a job holding the GPU: the stand-in device file open, as /dev/nvidia*
    # shellcheck disable=SC2217 # the open file is the point, not the input
    sleep 3600 <"$dev" &
    pids+=("$!")
  done
  idle_init
  ledger_init
  jobinfo_reset
  declare -gA SMI_PROCS=() SMI_NPROCS=() SMI_INDEX=() SMI_MEM_USED=() SMI_VENDOR=() SMI_MEM_BASE=()
  declare -ga SMI_UUIDS=()
  MON_FAILS=0
  for i in 0 1 2 3 4 5 6 7; do
    uuid=GPU-0000000$i-3a23-ca8c-52da-f8eedc850d97
    SMI_UUIDS+=("$uuid")
    SMI_INDEX[$uuid]=$i SMI_MEM_USED[$uuid]=30000
    SMI_PROCS[$uuid]="${pids[i]}${SMI_FS}python3${SMI_FS}29800" SMI_NPROCS[$uuid]=1
    ((i % 2)) && IDLE_CYCLES["$uuid"]=1
  done
  # the first cycle looks the jobs up (once per PID); then the steady state
  ledger_cycle 1000000
  before=$(cpu_ms)
  for ((i = 1; i <= cycles; i++)); do
    now=$((1000000 + i * 60))
    ledger_cycle "$now"
  done
  after=$(cpu_ms)
  kill "${pids[@]}" 2>/dev/null || true
  awk -v ms="$((after - before))" -v n="$cycles" 'BEGIN { printf "cpu_ms_per_cycle %.3f\n", ms / n }'
  local f
  for f in "$LG_DIR"/*.tsv; do printf 'day_file_bytes %s\n' "$(stat -c %s "$f")"; done
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  main "$@"
fi
