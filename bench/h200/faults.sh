#!/usr/bin/env bash
# Summary: issue 14 on a real H200: the idle watchdog under kill -9, a flaky
#          webhook receiver and a real GPU workload, for ~3.5 minutes.
# Usage: OUT=/path bash bench/h200/faults.sh   (as root; PyTorch for the workload)
#
# Runs yichuidingyin.sh as systemd would (restarted at once after each
# kill -9), CHECK_INTERVAL=2, against the real nvidia-smi wrapped by a
# recorder (call times; whether any configuration secret reached its
# environment), while bench/h200/workload.py holds GPU memory idle then goes
# busy, over and over (one idle incident every ~30 s). The receiver is
# tests/faults/flaky_receiver.py (70 % ok, 10 % late, 10 % 500, 10 % reset).
# Writes under $OUT: summary.txt (the counts), receiver.jsonl, events.jsonl,
# smi-calls.txt, daemon.log.
# Env: DURATION (seconds, default 210), GG_NO_WORKLOAD=1 (no PyTorch: uses
# whatever runs on the GPU; for trying the script with the test double).

set -euo pipefail
ROOT=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)
OUT=${OUT:?set OUT to a folder}
DURATION=${DURATION:-210}
work=$(mktemp -d)
mkdir -p "$OUT"

# nvidia-smi recorder: time per call, and a check of its environment
cat >"$work/smi" <<SMI
#!/bin/bash
start=\${EPOCHREALTIME/[.,]/}
if tr '\0' '\n' </proc/\$\$/environ | grep -q 'SECRETFAULTS'; then echo "SECRET SEEN" >>"$OUT/smi-calls.txt"; fi
${REAL_SMI:-nvidia-smi} "\$@"
rc=\$?
echo "\$(( (\${EPOCHREALTIME/[.,]/} - start) / 1000 )) ms rc=\$rc \$1" >>"$OUT/smi-calls.txt"
exit \$rc
SMI
chmod +x "$work/smi"

# the flaky receiver, recording what a chat group would show
cd "$ROOT"
python3 - "$work/port" "$OUT/receiver.jsonl" <<'PY' &
import json, sys, time
sys.path.insert(0, "tests/faults")
import flaky_receiver
server, rx, url = flaky_receiver.serve(mix={"ok": 7, "late": 1, "500": 1, "reset": 1}, late_s=7)
open(sys.argv[1], "w").write(str(server.server_address[1]))
seen = 0
while True:
    time.sleep(1)
    with rx.lock:
        new = rx.requests[seen:]
        seen = len(rx.requests)
    with open(sys.argv[2], "a") as f:
        for mode, body in new:
            f.write(json.dumps({"mode": mode, "body": body}) + "\n")
PY
receiver=$!
for _ in $(seq 50); do
  [[ -s $work/port ]] && break
  sleep 0.1
done
port=$(<"$work/port")

cat >"$work/gpuguard.conf" <<CONF
CHECK_INTERVAL=2
MAX_IDLE_CYCLES=3
REPEAT_INTERVAL=0
SMI_TIMEOUT=5
NOTIFY_TYPE=generic
NOTIFY_TIMEOUT=5
NOTIFY_RETRIES=1
CONF
printf 'NOTIFY_URL=http://127.0.0.1:%s/generic/SECRETFAULTS\nNOTIFY_SECRET=SECRETFAULTS2\n' "$port" >"$work/secrets.conf"
chmod 600 "$work/secrets.conf"
export GPUGUARD_CONFIG=$work/gpuguard.conf GPUGUARD_STATE_DIR=$work/state NVIDIA_SMI=$work/smi \
  GPUGUARD_LOG=$OUT/daemon.log

workload() {
  local n=0 flags
  while :; do
    n=$((n + 1))
    flags=$work/flags$n
    mkdir -p "$flags"
    python3 "$ROOT/bench/h200/workload.py" idle-then-busy "$flags" >/dev/null 2>&1 &
    sleep 20
    touch "$flags/busy"
    sleep 10
    touch "$flags/stop"
    wait || true
  done
}
if [[ ${GG_NO_WORKLOAD:-0} != 1 ]]; then
  workload &
  load=$!
fi

kills=0 restarts=0
end=$((SECONDS + DURATION))
while ((SECONDS < end)); do
  bin/yichuidingyin.sh 2>>"$OUT/daemon.log" &
  daemon=$!
  restarts=$((restarts + 1))
  sleep "$(awk -v r="$RANDOM" 'BEGIN { printf "%.2f", 1 + (r % 1200) / 100 }')"
  if ((SECONDS < end)); then
    kill -KILL "$daemon" 2>/dev/null && kills=$((kills + 1))
    wait "$daemon" 2>/dev/null || true
  fi
  # a snapshot a later call can count from while the run goes on
  printf '%s %s\n' "$kills" "$restarts" >"$OUT/counts"
  cp "$work/state/events.jsonl" "$OUT/events.jsonl" 2>/dev/null || true
done
kill -TERM "$daemon" 2>/dev/null || true
wait "$daemon" 2>/dev/null || true
# the workload loop and the PyTorch process it started: one still holding
# memory idle would be a real incident left open at the end
if [[ -n ${load:-} ]]; then
  kill "$load" 2>/dev/null
  pkill -f 'workload.py idle-then-busy' 2>/dev/null
  sleep 3
fi
# catch up with a sane receiver is not possible here (it stays flaky): one
# last unkilled run of 20 s lets the outbox drain
timeout 20 bin/yichuidingyin.sh 2>>"$OUT/daemon.log" || true
sleep 8
kill "$receiver" 2>/dev/null || true
cp "$work/state/events.jsonl" "$OUT/events.jsonl" 2>/dev/null || true

python3 "$ROOT/bench/h200/faults_summary.py" "$OUT" "$kills" "$restarts" >"$OUT/summary.txt"
cat "$OUT/summary.txt"
rm -rf "$work"
