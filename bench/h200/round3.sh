#!/usr/bin/env bash
# Summary: the real-H200 checks of round 3 in two device calls (each < 10 min)
# Usage: OUT=DIR bench/h200/round3.sh explore|confirm
#
# explore: spin.sh for the patterns that must stay quiet or trip (the GPU to
# itself), then, beside a fault soak (faults.sh with its GPU workload, kill
# -9 and a flaky receiver), io_knobs.sh (which cgroup I/O knob protects a
# service's fsync) and lowprio_io.sh (lowprio-run's tiers, plus LP_EXTRA).
# confirm: a live leak fill at FILL_MIB_PER_S (alert before OOM) and
# lowprio_io.sh again, beside a second fault soak.
# Each step's files are packed into OUT/STEP.tgz; OUT/round3.txt is the log.

R3_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# step (one step under a time limit, logged) comes from all.sh
# shellcheck source=all.sh
source "$R3_HERE/all.sh"
# shellcheck source=../../lib/common.sh
source "$R3_HERE/../../lib/common.sh"
# shellcheck source=../../lib/smi.sh
source "$R3_HERE/../../lib/smi.sh"

main() {
  local mode=${1:?explore or confirm} out=${OUT:?set OUT} here work
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  work=$(mktemp -d)
  WORK=$work
  export PYTHONUNBUFFERED=1
  smi_run --query-gpu=name,memory.total,memory.used,power.draw --format=csv,noheader
  case $mode in
    explore)
      mkdir -p "$work"/{spin,faults,knobs,lowprio}
      step spin 150 env OUT="$work/spin" SPIN_PATTERNS="${SPIN_PATTERNS:-matmul:none sleep:gpu_stuck graph:none}" \
        bash "$here/spin.sh"
      OUT=$work/faults DURATION=${SOAK_S:-400} timeout $((${SOAK_S:-400} + 60)) bash "$here/faults.sh" \
        >"$work/faults/run.log" 2>&1 &
      local soak=$!
      step knobs 230 bash "$here/io_knobs.sh" "$work/knobs"
      step lowprio 250 env OUT="$work/lowprio" TESTS_S="${TESTS_S:-80}" \
        LP_EXTRA="${LP_EXTRA:---mem-high 1G;--mem-high 1G --io-max DISK:wbps=200M}" \
        bash "$here/lowprio_io.sh" "$work/lowprio"
      wait "$soak"
      printf 'soak exit %s\n' "$?"
      ;;
    confirm)
      mkdir -p "$work"/{faults,lowprio,fill}
      OUT=$work/faults DURATION=${SOAK_S:-380} timeout $((${SOAK_S:-380} + 60)) bash "$here/faults.sh" \
        >"$work/faults/run.log" 2>&1 &
      local soak=$!
      step fill 280 env FILL_MIB_PER_S="${FILL_MIB_PER_S:-600}" bash "$here/fill_live.sh" "$work/fill"
      step lowprio 250 env OUT="$work/lowprio" TESTS_S="${TESTS_S:-60}" \
        LP_EXTRA="${LP_EXTRA:---io-max DISK:wbps=100M;--io-max DISK:wbps=50M}" \
        bash "$here/lowprio_io.sh" "$work/lowprio"
      wait "$soak"
      printf 'soak exit %s\n' "$?"
      ;;
  esac
  pack_steps "$work" "$out"
  cat "$work/faults/summary.txt" 2>/dev/null
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  main "$@" 2>&1 | tee "${OUT:?}/round3.txt"
fi
