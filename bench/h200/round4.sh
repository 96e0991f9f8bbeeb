#!/usr/bin/env bash
# Summary: the real-H200 checks of round 4 in one device call (< 10 min)
# Usage: OUT=DIR bench/h200/round4.sh
#
# On a quiet host (no soak beside it this time, so the CPU figures are the
# tiers' own): the leak watcher's cost bench on the host's CPU, then
# lowprio_io.sh with longer probes, on the disk's ext4 and again on XFS on
# a loop device over the same disk (LOOP_FS), where a service's fsync does
# not wait for the job's data in the journal. Each step's files are packed
# into OUT/STEP.tgz; OUT/round4.txt is the log.

R4_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# step (one step under a time limit, logged) comes from all.sh
# shellcheck source=all.sh
source "$R4_HERE/all.sh"

main() {
  local out=${OUT:?set OUT} work root
  root=$(cd "$R4_HERE/../.." && pwd)
  work=$(mktemp -d)
  WORK=$work
  export PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,memory.total,memory.used,power.draw --format=csv,noheader
  lscpu | grep -E '^(Model name|CPU\(s\)):' || true
  mkdir -p "$work"/{cost,lowprio}
  step cost 150 bash -c "cd '$root' && python3 bench/leak.py --full --only cost >'$work/cost/cost.md' 2>&1 &&
    python3 bench/leak.py --full --only cost >>'$work/cost/cost.md' 2>&1; cat '$work/cost/cost.md'"
  step lowprio 420 env OUT="$work/lowprio" IO_S="${IO_S:-12}" TESTS_S="${TESTS_S:-60}" LOOP_FS="${LOOP_FS:-xfs}" \
    LP_EXTRA="${LP_EXTRA:---io-max DISK:wbps=100M}" bash "$R4_HERE/lowprio_io.sh" "$work/lowprio"
  local d
  for d in "$work"/*/; do
    d=$(basename "$d")
    tar -C "$work/$d" -czf "$out/$d.tgz" .
  done
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  main "$@" 2>&1 | tee "${OUT:?}/round4.txt"
fi
