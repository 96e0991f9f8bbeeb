#!/usr/bin/env bash
# Summary: the real-H200 checks of round 4, one device call per mode (< 10 min each)
# Usage: OUT=DIR bench/h200/round4.sh lowprio|knobs
#
# Both modes first run the leak watcher's cost bench on the host's CPU,
# with a CPU-speed yardstick (one fixed Python loop) before and after: this
# VM's speed moves between calls. Then, on a quiet host (no soak beside it,
# so the CPU figures are the tiers' own):
# lowprio: lowprio_io.sh with longer probes, on the disk's ext4 and again on
# a file system made on a loop device over the same disk (LOOP_FS: xfs, or
# ext4-writeback when mkfs.xfs is missing), where a service's fsync does not
# wait for the job's data in the journal.
# knobs: io_knobs.sh, two rounds of the knobs that bound the job's writes
# (io.max at 200, 50 and 20 MB/s, iocost, iocost with latency targets).
# Each step's files are packed into OUT/STEP.tgz; OUT/round4.txt is the log.

R4_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# step (one step under a time limit, logged) comes from all.sh
# shellcheck source=all.sh
source "$R4_HERE/all.sh"
# shellcheck source=../../lib/common.sh
source "$R4_HERE/../../lib/common.sh"
# shellcheck source=../../lib/smi.sh
source "$R4_HERE/../../lib/smi.sh"

# Seconds of one fixed Python loop: the VM's speed at the time.
yardstick() {
  python3 -c 'import time; t = time.process_time(); sum(i * i for i in range(3000000)); print("yardstick %.3f s" % (time.process_time() - t))'
}

main() {
  local mode=${1:?lowprio or knobs} out=${OUT:?set OUT} work root
  root=$(cd "$R4_HERE/../.." && pwd)
  work=$(mktemp -d)
  WORK=$work
  export PYTHONUNBUFFERED=1
  smi_run --query-gpu=name,memory.total,memory.used,power.draw --format=csv,noheader
  echo
  lscpu | grep -E '^(Model name|CPU\(s\)):' || true
  mkdir -p "$work"/{cost,"$mode"}
  yardstick
  step cost 150 bash -c "cd '$root' && python3 bench/leak.py --full --only cost"
  yardstick
  case $mode in
    lowprio)
      step lowprio 420 env OUT="$work/lowprio" IO_S="${IO_S:-12}" TESTS_S="${TESTS_S:-60}" \
        LOOP_FS="${LOOP_FS:-xfs}" LP_EXTRA="${LP_EXTRA:---io-max DISK:wbps=100M}" \
        bash "$R4_HERE/lowprio_io.sh" "$work/lowprio"
      ;;
    knobs)
      step knobs 330 env IO_S=8 ROUNDS=2 KNOBS="${KNOBS:-idle plain io-max io-max50 io-max20 iocost iocost-qos}" \
        bash "$R4_HERE/io_knobs.sh" "$work/knobs"
      ;;
  esac
  pack_steps "$work" "$out"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  main "$@" 2>&1 | tee "${OUT:?}/round4.txt"
fi
