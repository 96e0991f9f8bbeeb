#!/usr/bin/env bash
# Summary: run gpuguard's watchdog cycle back to back and report its cost
# Usage: idle_bench.sh CYCLES [RSS_EVERY]
# Sources the real libraries and calls idle_cycle CYCLES times with no sleep;
# with RSS_EVERY, prints "rss CYCLE KIB" lines taken from /proc while PIDs
# come and go (bench/idle.py measures the CPU through rusage).

GPUGUARD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Every library, as sourcing one only defines functions: idle_cycle's helpers
# (job identity, per-GPU history...) need no list kept here.
for lib in "$GPUGUARD_ROOT"/lib/*.sh; do
  # shellcheck source=/dev/null
  source "$lib"
done

main() {
  local cycles=$1 rss_every=${2:-0} i
  config_load || return
  gg_state_dir_init || return
  idle_init
  for ((i = 0; i < cycles; i++)); do
    export BENCH_STEP=$i
    idle_cycle "$((1000000 + i * 60))"
    if ((rss_every > 0 && (i + 1) % rss_every == 0)); then
      printf 'rss %d %s\n' "$((i + 1))" "$(awk '/^VmRSS/ {print $2}' /proc/$$/status)"
    fi
  done
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  main "$@"
fi
