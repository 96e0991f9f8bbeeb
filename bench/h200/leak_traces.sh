#!/usr/bin/env bash
# Summary: record real GPU memory curves of training-like jobs on an H200
# Usage: bench/h200/leak_traces.sh OUTDIR [PHASE1_SECONDS] [FILL_SECONDS]
#
# Phase 1 runs four jobs at once (train, leak, rl, kvcache: see
# leak_traces.py); phase 2 runs the fast fill alone until the GPU is out of
# memory. A sampler records both nvidia-smi queries at 1 Hz, and the leak
# watch (--all) runs beside them with its own history. Outputs in OUTDIR:
# apps.csv (unix_ts,pid,used_memory_mib), gpu.csv (unix_ts,memory.used,
# memory.total,utilization.gpu,power.draw), pids.txt (kind pid),
# watch.tar.gz (the watcher's state folder), log.txt.

main() {
  local out=$1 phase1=${2:-240} fillsecs=${3:-260}
  local root here
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  root=$(cd "$here/../.." && pwd)
  GG_ROOT=$root
  mkdir -p "$out"
  local state
  state=$(mktemp -d)
  sample_loop "$out" &
  local sampler=$!
  GPUGUARD_CONFIG=/dev/null GPUGUARD_STATE_DIR=$state LEAK_INTERVAL=2 \
    "$root/bin/gpu-leak-watch" --all >"$out/watch.log" 2>&1 &
  local watcher=$!
  local kind
  local -a jobs=()
  for kind in train leak rl kvcache; do
    python3 "$here/leak_traces.py" "$kind" "$phase1" >>"$out/log.txt" 2>&1 &
    jobs+=($!)
    printf '%s %s\n' "$kind" "$!" >>"$out/pids.txt"
  done
  wait "${jobs[@]}"
  sleep 5
  python3 "$here/leak_traces.py" fill "$fillsecs" >>"$out/log.txt" 2>&1 &
  printf 'fill %s\n' "$!" >>"$out/pids.txt"
  wait $! || printf 'fill exited %s\n' "$?" >>"$out/log.txt"
  sleep 5
  kill "$sampler" "$watcher" 2>/dev/null
  wait "$watcher" 2>/dev/null
  cat "$out/watch.log" >>"$out/log.txt"
  rm -f "$out/watch.log"
  tar -C "$state" -czf "$out/watch.tar.gz" .
}

# One row per process and one per GPU, every second, through the project's
# one nvidia-smi caller.
sample_loop() {
  local out=$1 ts
  # shellcheck source=../../lib/smi.sh
  source "$GG_ROOT/lib/smi.sh"
  while :; do
    ts=$(date +%s.%N)
    smi_run --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
      awk -v t="$ts" -F', ' 'NF == 2 {printf "%.3f,%s,%s\n", t, $1, $2}' >>"$out/apps.csv"
    smi_run --query-gpu=memory.used,memory.total,utilization.gpu,power.draw --format=csv,noheader,nounits |
      awk -v t="$ts" '{printf "%.3f,%s\n", t, $0}' >>"$out/gpu.csv"
    sleep 1
  done
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  main "$@"
fi
