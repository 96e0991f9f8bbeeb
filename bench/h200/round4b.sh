#!/usr/bin/env bash
# Summary: round 4's second device call: the leak cost bench again with a CPU-speed yardstick, then which I/O knob brings a service's fsync within 2x (io_knobs.sh, two rounds)
# Usage: OUT=DIR bench/h200/round4b.sh

R4_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=all.sh
source "$R4_HERE/all.sh"

# Seconds of one fixed Python loop: the VM's speed at the time.
yardstick() {
  python3 -c 'import time; t = time.process_time(); sum(i * i for i in range(3000000)); print("yardstick %.3f s" % (time.process_time() - t))'
}

main() {
  local out=${OUT:?set OUT} work root
  root=$(cd "$R4_HERE/../.." && pwd)
  work=$(mktemp -d)
  WORK=$work
  export PYTHONUNBUFFERED=1
  mkdir -p "$work"/{cost,knobs}
  yardstick
  step cost 150 bash -c "cd '$root' && python3 bench/leak.py --full --only cost; python3 -c 'import time; t = time.process_time(); sum(i * i for i in range(3000000)); print(\"yardstick %.3f s\" % (time.process_time() - t))'"
  yardstick
  step knobs 330 env IO_S=8 ROUNDS=2 KNOBS="${KNOBS:-idle plain io-max io-max50 io-max20 iocost iocost-qos}" \
    bash "$R4_HERE/io_knobs.sh" "$work/knobs"
  local d
  for d in "$work"/*/; do
    d=$(basename "$d")
    tar -C "$work/$d" -czf "$out/$d.tgz" .
  done
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  main "$@" 2>&1 | tee "${OUT:?}/round4b.txt"
fi
