#!/usr/bin/env bash
# Summary: a fast GPU memory leak watched live by gpu-leak-watch -- CMD on a real H200
# Usage: bench/h200/fill_live.sh OUTDIR
#
# Runs `gpu-leak-watch -- python3 leak_traces.py fill` (from 0.6 GB, +2 GiB
# a second until CUDA is out of memory, about 70 s on an H200) with
# LEAK_INTERVAL=1 and no alert target. Expected: a gpu_memory_leak event
# (critical, OOM projected in minutes) well before the OOM, and the
# wrapper's exit status is the job's (3 on OOM). Writes into OUTDIR:
# events.jsonl, watch.log, result.txt (exit status, seconds from the first
# alert to the OOM), history.tgz.

main() {
  local out=$1 here root state
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  root=$(cd "$here/../.." && pwd)
  state=$(mktemp -d)
  mkdir -p "$out"
  local start rc=0
  start=$(date +%s.%N)
  GPUGUARD_CONFIG=/dev/null GPUGUARD_STATE_DIR=$state LEAK_INTERVAL=1 FILL_MIB_PER_S=${FILL_MIB_PER_S:-2048} \
    "$root/bin/gpu-leak-watch" -- python3 "$here/leak_traces.py" fill 300 >"$out/watch.log" 2>&1 || rc=$?
  local end
  end=$(date +%s.%N)
  cp "$state/events.jsonl" "$out/events.jsonl" 2>/dev/null || : >"$out/events.jsonl"
  tar -C "$state" -czf "$out/history.tgz" .
  python3 - "$out/events.jsonl" "$start" "$end" "$rc" >"$out/result.txt" <<'PY'
import json, sys
path, start, end, rc = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
events = [json.loads(line) for line in open(path) if line.strip()]
firing = [e for e in events if e.get("event") == "gpu_memory_leak" and e.get("state") == "firing"]
print("wrapper exit status", rc, "(job: 3 on OOM)")
print("run seconds %.1f" % (end - start))
if firing:
    first = firing[0]
    print("first leak alert %.1f s after start, %.1f s before the job ended" % (first["ts"] - start, end - first["ts"]))
    print(json.dumps(first)[:1500])
else:
    print("NO leak alert")
PY
  cat "$out/result.txt"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  main "$@"
fi
