#!/usr/bin/env bash
# Summary: gpuguard status/doctor --json and gpuguard report against a real H200
# Usage: OUT=/some/folder bench/h200/report.sh
#
# As root on a box with one H200, PyTorch, nvidia-smi; about 3.5 minutes.
# Under the idle watchdog (2 s cycles): first a 2 GiB holder that sleeps (the
# idle alert fires), then it works briefly and exits (resolved) while a
# leaking and a healthy training loop start under the leak watch (1 s); then
# checks what a user sees. Writes at most 8 files, flat, under $OUT:
#   run.log          every step and a PASS/FAIL line per check
#   status.txt       gpuguard status, while the jobs run
#   status.json      gpuguard status --json, same moment
#   doctor.json      gpuguard doctor --json
#   status-watch.txt gpuguard status --watch --interval 1 (not a TTY) for 10 s
#   gpu-history.tsv  the watchdog's per-GPU rows (real nvidia-smi values)
#   report.html      gpuguard report
#   report.png       the report in headless Chromium, when chromium is installed

main() {
  local out=${OUT:?set OUT to an empty folder}
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  mkdir -p "$out"
  run_all "$root" "$out" >"$out/run.log" 2>&1
  grep -c '^PASS' "$out/run.log" | sed 's/^/passed: /'
  grep '^FAIL' "$out/run.log" || true
}

# Prints PASS or FAIL and the check's name.
check() {
  local name=$1
  shift
  if "$@"; then
    echo "PASS $name"
  else
    echo "FAIL $name"
  fi
}

# True when --watch exited 0 ($1) and drew at least two frames into $2.
watch_redrew() {
  (($1 == 0)) && (($(grep -c 'gpuguard status' "$2") >= 2))
}

run_all() {
  local root=$1 out=$2 w=/tmp/h200-report
  # H200_WORKLOAD: a stand-in for dry runs without a GPU
  local workload=${H200_WORKLOAD:-$root/bench/h200/workload.py}
  rm -rf "$w" && mkdir -p "$w/flags" "$w/state"
  export GPUGUARD_CONFIG=/dev/null GPUGUARD_STATE_DIR=$w/state
  # 0-30 s: only a 2 GiB holder that sleeps: the idle alert fires
  timeout 200 python3 "$workload" idle-then-busy "$w/flags" &
  local holder=$!
  CHECK_INTERVAL=2 MAX_IDLE_CYCLES=3 "$root/bin/yichuidingyin.sh" 2>"$w/watchdog.log" &
  local watchdog=$!
  sleep 30
  # then it works for 5 s and exits (resolved), and two training loops
  # start under the leak watch: one leaks, one is healthy
  touch "$w/flags/busy"
  timeout 170 python3 "$workload" train leak 140 &
  local leak=$!
  timeout 170 python3 "$workload" train healthy 140 &
  local healthy=$!
  echo "jobs: holder=$holder leak=$leak healthy=$healthy"
  sleep 5
  touch "$w/flags/stop"
  "$root/bin/gpu-leak-watch" --pid "$leak" --pid "$healthy" --interval 1 --bucket 2 2>"$w/leak.log" &
  local watch=$!
  sleep 60
  "$root/bin/gpuguard" status >"$out/status.txt" 2>&1
  echo "status: exit $?"
  "$root/bin/gpuguard" status --json >"$out/status.json" 2>>"$w/status.err"
  echo "status --json: exit $?"
  "$root/bin/gpuguard" doctor --json >"$out/doctor.json" 2>>"$w/status.err"
  echo "doctor --json: exit $?"
  local watch_rc=0
  timeout --preserve-status -k 5 -s TERM 10 "$root/bin/gpuguard" status --watch --interval 1 \
    >"$out/status-watch.txt" 2>&1 || watch_rc=$?
  echo "status --watch stopped by SIGTERM: exit $watch_rc"
  wait "$leak" "$healthy" "$holder"
  sleep 3
  kill "$watch" "$watchdog" 2>/dev/null
  wait "$watch" "$watchdog"
  cp "$w/state/gpu-history.tsv" "$out/gpu-history.tsv"
  LEAK_BUCKET_S=2 "$root/bin/gpuguard" report --out "$out/report.html"
  echo "report: exit $?"
  echo "== events"
  cat "$w/state/events.jsonl"
  echo "== status.txt"
  cat "$out/status.txt"
  check "status --json is one JSON document with the jobs' PIDs" python3 -c '
import json, sys
doc = json.load(open(sys.argv[1]))
pids = {p["pid"] for g in doc["gpus"] for p in g["processes"]}
assert doc["error"] is None and doc["gpus"][0]["memory_total_mib"] > 100000, doc
print("gpus", len(doc["gpus"]), "pids", sorted(pids))
assert pids, "no process listed"' "$out/status.json"
  check "doctor --json is one JSON document, ok" python3 -c '
import json, sys
doc = json.load(open(sys.argv[1]))
print([c["level"] + " " + c["message"] for c in doc["checks"]][:6])
assert doc["ok"] is True' "$out/doctor.json"
  check "status --watch exited 0 and redrew" watch_redrew "$watch_rc" "$out/status-watch.txt"
  check "gpu-history rows carry real utilization, memory, power and holders" python3 -c '
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if not l.startswith("#")]
print(len(rows), "rows; last", rows[-1])
assert len(rows) > 30 and all(len(r) == 9 for r in rows)
assert any(r[3] and int(r[3]) > 50 for r in rows) and any(r[7] != "0" for r in rows)
assert any(r[8] not in ("-", "?") for r in rows) and all(r[6] for r in rows)' "$out/gpu-history.tsv"
  check "report has the leak as LEAK and an idle incident" python3 -c '
import sys
t = open(sys.argv[1]).read()
print(len(t), "bytes")
assert "row-LEAK" in t and "rect class=\"idle" in t and "http" not in t' "$out/report.html"
  if command -v chromium >/dev/null; then
    local profile
    profile=$(mktemp -d)
    timeout 60 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
      --disable-background-networking --disable-component-update --disable-sync --user-data-dir="$profile" \
      --window-size=1040,1600 --hide-scrollbars --screenshot="$out/report.png" "file://$out/report.html" \
      >/dev/null 2>&1
    echo "screenshot: exit $?"
    rm -rf "$profile"
  fi
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  main "$@"
fi
