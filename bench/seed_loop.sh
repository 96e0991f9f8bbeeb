#!/usr/bin/env bash
# Summary: the source article's watchdog loop, re-implemented for comparison
# Usage: seed_loop.sh CYCLES
# One nvidia-smi call to list GPUs, then two per GPU (utilization, process
# count): 1 + 2N calls a cycle. Kept faithful, flaws included.

THRESHOLD=${THRESHOLD:-10}
MAX_IDLE_CYCLES=${MAX_IDLE_CYCLES:-3}
declare -A idle_count

get_gpu_util() {
  nvidia-smi --id="$1" --query-gpu=utilization.gpu --format=csv,noheader,nounits
}

seed_cycle() {
  local gpu util processes
  for gpu in $(nvidia-smi --list-gpus | awk '{print $2}' | tr -d ':'); do
    util=$(get_gpu_util "$gpu")
    processes=$(nvidia-smi --id="$gpu" --query-compute-apps=pid --format=csv,noheader | wc -l)
    if [ "$util" -lt "$THRESHOLD" ] && [ "$processes" -gt 0 ]; then
      idle_count[$gpu]=$((${idle_count[$gpu]:-0} + 1))
      if [ "${idle_count[$gpu]}" -ge "$MAX_IDLE_CYCLES" ]; then
        : send_alert "$gpu" "$util"
        unset "idle_count[$gpu]"
      fi
    else
      idle_count[$gpu]=0
    fi
  done
}

main() {
  local i
  for ((i = 0; i < $1; i++)); do
    BENCH_STEP=$i seed_cycle
  done
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  main "$@"
fi
