#!/usr/bin/env bash
# Summary: the idle watchdog on the real GPU when one job takes the GPU from another, when its state folder is removed under it, and with a job whose arguments hold a newline and bytes that are not UTF-8 (root or not; PyTorch on cuda:0)
# Usage: bench/h200/swap_check.sh [OUTDIR]   (default $OUT)
#
# Cron's pace with the clock given (GPUGUARD_NOW, a cycle a minute) and
# the real nvidia-smi:
#   1. job A holds 2 GiB idle for two cycles, then ends; job B (argv with
#      a newline, an escape sequence and GBK bytes) takes the GPU before
#      the next cycle: B's first idle cycle must not fire, its third must
#      (naming B, idle 120 s);
#   2. B ends: the incident resolves (released);
#   3. a daemon (CHECK_INTERVAL=2) beside job C: once it fires, its state
#      folder is removed; it must make it again and stop with "state saved".
# Writes OUTDIR/swap_check.log and the events; prints PASS/FAIL lines.
# About one minute.

main() {
  local out=${1:-${OUT:?set OUT or give a folder}} root w t0
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  w=$(mktemp -d /tmp/gg-swap.XXXXXX)
  mkdir -p "$out" "$w/flags"
  export GPUGUARD_STATE_DIR=$w/state GPUGUARD_CONFIG=/dev/null MAX_IDLE_CYCLES=3
  t0=$(date +%s)
  {
    swap_holder A "$w" plain
    swap_once "$t0" 0
    swap_once "$t0" 60
    swap_stop A
    swap_holder B "$w" $'--note=a\nFAKE ROW' $'\e[2J' $'\xc4\xa3\xd0\xcd\xff.yaml'
    swap_once "$t0" 120
    swap_check "B's first idle cycle does not fire" "$(swap_states "$w")" ""
    swap_once "$t0" 180
    swap_once "$t0" 240
    swap_check "B's third idle cycle fires" "$(swap_states "$w")" "firing"
    python3 - "$w/state/events.jsonl" "${SWAP_PID[B]}" <<'PY'
import json, sys
lines = open(sys.argv[1], "rb").read().decode("utf-8").splitlines()   # UTF-8, or this fails
ev = json.loads(lines[-1])
print("event:", ev["state"], "pids", [p["pid"] for p in ev["processes"]], "idle_seconds", ev["idle_seconds"])
print("cmdline:", ev["job"]["cmdline"])
ok = [p["pid"] for p in ev["processes"]] == [int(sys.argv[2])] and ev["idle_seconds"] == 120
ok = ok and "\\n" in ev["job"]["cmdline"] and "\ufffd" in ev["job"]["cmdline"] and "\x1b" not in ev["job"]["cmdline"]
print("PASS" if ok else "FAIL", "the event names B, idle 120 s, its argv as text")
PY
    swap_stop B
    sleep 1
    swap_once "$t0" 300
    swap_check "B gone: resolved" "$(swap_states "$w")" "firing resolved"
    swap_daemon "$root" "$w"
  } 2>&1 | tee "$out/swap_check.log"
  cp "$w/state/events.jsonl" "$out/swap_events.jsonl" 2>/dev/null
  swap_stop C
  rm -rf -- "$w"
}

declare -A SWAP_PID=()

# Starts a PyTorch process holding 2 GiB idle, in a session of its own as
# a job started from a terminal is (the alert names a job by its session's
# top process); waits until it holds the memory.
swap_holder() {
  local name=$1 w=$2
  shift 2
  setsid python3 -c 'import sys, time, torch
x = torch.empty(2 * 1024 ** 3 // 4, device="cuda")
torch.cuda.synchronize()
print("holding", flush=True)
time.sleep(600)' "$@" >"$w/$name.out" 2>&1 &
  SWAP_PID[$name]=$!
  local i
  for ((i = 0; i < 120; i++)); do
    grep -q holding "$w/$name.out" 2>/dev/null && break
    sleep 0.5
  done
  echo "job $name: PID ${SWAP_PID[$name]} holds the GPU"
}

swap_stop() {
  [[ -n ${SWAP_PID[$1]:-} ]] || return 0
  kill "${SWAP_PID[$1]}" 2>/dev/null
  wait "${SWAP_PID[$1]}" 2>/dev/null
  unset "SWAP_PID[$1]"
}

# One cron-style cycle at t0 + $2 seconds.
swap_once() {
  GPUGUARD_NOW=$(($1 + $2)) "$ROOT_DIR/bin/yichuidingyin.sh" --once 2>&1 | grep -v 'NO ALERT TARGET'
}

swap_states() {
  python3 -c 'import json, sys
print(" ".join(json.loads(l)["state"] for l in open(sys.argv[1]) if "gpu_idle" in l))' "$1/state/events.jsonl" 2>/dev/null
}

swap_check() {
  if [[ $2 == "$3" ]]; then
    echo "PASS $1 (events: ${2:-none})"
  else
    echo "FAIL $1 (events: ${2:-none}, expected: ${3:-none})"
  fi
}

# The daemon beside job C; its state folder removed once it has fired.
swap_daemon() {
  local root=$1 w=$2 i pid
  swap_holder C "$w" plain
  CHECK_INTERVAL=2 "$root/bin/yichuidingyin.sh" 2>"$w/daemon.err" &
  pid=$!
  for ((i = 0; i < 60; i++)); do
    grep -q 'gpu_idle firing' "$w/daemon.err" && break
    sleep 0.5
  done
  rm -rf -- "$w/state"
  sleep 5
  kill -TERM "$pid"
  wait "$pid"
  echo "daemon exit status $?"
  grep -E 'removed while running|stopped|disk full|No such file' "$w/daemon.err"
  if grep -q 'stopped; state saved' "$w/daemon.err" && [[ -f $w/state/idle.state ]] &&
    ! grep -qE 'disk full|No such file' "$w/daemon.err"; then
    echo "PASS the daemon made its state folder again and saved its state there"
  else
    echo "FAIL the state folder removed under the daemon"
  fi
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  ROOT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  main "$@"
fi
