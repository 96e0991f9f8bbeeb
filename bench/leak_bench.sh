#!/usr/bin/env bash
# Summary: run gpu-leak-watch's cycle back to back and report nothing (the cost is measured outside)
# Usage: leak_bench.sh CYCLES
# Sources the real libraries and calls leak_cycle CYCLES times with no sleep,
# watching every GPU process (--all) of the bench double's answers
# (bench/leak.py renders them and measures the CPU through rusage).

GPUGUARD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
for lib in common config smi npu events textfile jobinfo leak; do
  # shellcheck source=/dev/null
  source "$GPUGUARD_ROOT/lib/$lib.sh"
done

main() {
  local cycles=$1 i
  config_load || return
  gg_state_dir_init || return
  leak_init
  # shellcheck disable=SC2034 # read by leak_select_roots
  LEAK_ALL=1
  leak_probe_system
  for ((i = 0; i < cycles; i++)); do
    export BENCH_STEP=$i
    leak_cycle "$((1796206508 + i * 60))"
  done
  # its exit is waited for, so the detector's CPU counts in the bench's
  leak_detector_stop
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  main "$@"
fi
