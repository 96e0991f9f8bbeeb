#!/usr/bin/env bash
# Summary: run the benches and print the figures as Markdown, with progress on stderr
# Usage: bench/run.sh [--full] [idle|leak|corpusc|lowprio|ledger|stream]...
# Speed and memory figures live here, never in timed tests. The default set
# (`make bench`) finishes in a few minutes on a 2-core machine: fewer cycles,
# the leak detector's --quick trace set, shorter lowprio phases. --full
# (`make bench-full`) gives the long figures of bench/RESULTS.md. Any BENCH_*
# variable set in the environment wins over both.

# Sets the BENCH_* knobs of the default set, leaving those the user set:
# enough cycles to show the shape (calls and CPU per cycle, flat RSS), one
# lowprio run per case; bench-full's medians and 10,000 cycles are the
# figures of bench/RESULTS.md.
bench_quick_defaults() {
  : "${BENCH_IDLE_CYCLES:=20}" "${BENCH_RSS_CYCLES:=300}"
  : "${BENCH_LEAK_SEEDS:=4}"
  : "${BENCH_LOWPRIO_SECONDS:=2}" "${BENCH_LOWPRIO_REPEAT:=1}" "${BENCH_STREAM_SECONDS:=15}"
  export BENCH_IDLE_CYCLES BENCH_RSS_CYCLES BENCH_LEAK_SEEDS BENCH_LOWPRIO_SECONDS BENCH_LOWPRIO_REPEAT
  export BENCH_STREAM_SECONDS
}

# Runs one bench; its Markdown goes to stdout, and a line every 15 s says
# it is still running.
# Arguments:
#   $1 label ("2/3 leak"), then the command
bench_run() {
  local label=$1 start=$SECONDS rc=0 ticker
  shift
  printf '[bench %s] started\n' "$label" >&2
  (
    while sleep 15 >/dev/null 2>&1; do
      printf '[bench %s] still running: %d s\n' "$label" "$((SECONDS - start))" >&2
    done
  ) &
  ticker=$!
  "$@" || rc=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  if ((rc == 0)); then
    printf '[bench %s] done in %d s\n' "$label" "$((SECONDS - start))" >&2
  else
    printf '[bench %s] FAILED (exit %d) after %d s\n' "$label" "$rc" "$((SECONDS - start))" >&2
  fi
  echo
  return "$rc"
}

main() {
  local root full=0 which=() b n=0 failed=0 start=$SECONDS
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  while (($#)); do
    case $1 in
      --full) full=1 ;;
      idle | leak | corpusc | lowprio | ledger | stream) which+=("$1") ;;
      -h | --help)
        sed -n 's/^# \{0,1\}\(Summary\|Usage\): //p' "${BASH_SOURCE[0]}"
        return 0
        ;;
      *)
        printf 'bench/run.sh: unknown bench %s (idle, leak, corpusc, lowprio, ledger, stream, --full)\n' "'$1'" >&2
        return 2
        ;;
    esac
    shift
  done
  ((${#which[@]})) || which=(idle leak lowprio ledger stream)
  local leak_args=()
  if ((full)); then
    printf '[bench] the full set: expect about 10 minutes or more on 2 cores\n' >&2
  else
    bench_quick_defaults
    leak_args=(--quick)
    printf '[bench] the default set (make bench-full for the long figures)\n' >&2
  fi
  for b in "${which[@]}"; do
    n=$((n + 1))
    case $b in
      leak) bench_run "$n/${#which[@]} $b" python3 "$root/bench/leak.py" "${leak_args[@]}" || failed=1 ;;
      # corpus C alone (the leak bench includes it)
      corpusc) bench_run "$n/${#which[@]} $b" python3 "$root/bench/leak.py" --only corpusc || failed=1 ;;
      *) bench_run "$n/${#which[@]} $b" python3 "$root/bench/$b.py" || failed=1 ;;
    esac
  done
  printf '[bench] all done in %d s\n' "$((SECONDS - start))" >&2
  return "$failed"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  main "$@"
fi
