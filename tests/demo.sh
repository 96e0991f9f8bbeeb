#!/usr/bin/env bash
# Summary: run the idle watchdog against a recorded H200 scenario, alerting to a local webhook sink
# Usage: tests/demo.sh [RECORDING.txt]
#
# The project's nvidia-smi test double replays, verbatim, nvidia-smi output
# recorded on a real H200 (a PyTorch process holding 2 GiB while idle, then
# busy with matmuls, then gone); the watchdog checks every second, and a
# local receiver on 127.0.0.1 prints what it is sent: one firing alert after
# MAX_IDLE_CYCLES=3 idle cycles, then one resolved.

GPUGUARD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

main() {
  local recording=${1:-$GPUGUARD_ROOT/tests/fixtures/h200/recording-idle-then-busy.txt}
  local work port='' i sink_pid watchdog_pid
  work=$(mktemp -d "${TMPDIR:-/tmp}/gpuguard-demo.XXXXXX")
  # Globals: the EXIT trap runs after main has returned.
  DEMO_WORK=$work
  trap 'kill ${DEMO_PIDS:-} 2>/dev/null; rm -rf -- "${DEMO_WORK:?}"' EXIT

  python3 "$GPUGUARD_ROOT/tests/webhook_sink.py" --port-file "$work/port" \
    --record "$work/received.jsonl" --seconds 60 --quiet &
  sink_pid=$!
  DEMO_PIDS=$sink_pid
  for ((i = 0; i < 50; i++)); do
    [[ -s $work/port ]] && break
    sleep 0.1
  done
  port=$(<"$work/port")

  echo "== replaying: $recording"
  echo "== webhook sink: http://127.0.0.1:$port/generic"
  env PATH="$GPUGUARD_ROOT/tests/fakebin:$PATH" \
    FAKE_SMI_RECORDING="$recording" FAKE_SMI_STATE="$work/smi-step" \
    GPUGUARD_CONFIG=/dev/null GPUGUARD_STATE_DIR="$work/state" \
    CHECK_INTERVAL=1 MAX_IDLE_CYCLES=3 THRESHOLD=10 NOTIFY_LANG=en \
    NOTIFY_URL="http://127.0.0.1:$port/generic" \
    "$GPUGUARD_ROOT/bin/yichuidingyin.sh" &
  watchdog_pid=$!
  DEMO_PIDS+=" $watchdog_pid"

  for ((i = 0; i < 200; i++)); do
    if grep -q '"state": "resolved"' "$work/received.jsonl" 2>/dev/null; then
      break
    fi
    sleep 0.1
  done
  kill -TERM "$watchdog_pid" 2>/dev/null
  wait "$watchdog_pid" 2>/dev/null

  echo
  echo "== what the webhook received"
  python3 - "$work/received.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1], encoding="utf-8"):
    body = json.loads(line)["body"]
    for event in body["events"]:  # one digest per target per cycle
        print("--- %s %s (GPU %s, utilization %s%%, %s processes)" % (
            event["event"], event["state"], event["gpu"], event["utilization"], len(event["processes"])))
    print(body["message"])
PY
  local got
  got=$(grep -c '"state": "firing"\|"state": "resolved"' "$work/received.jsonl" || true)
  if [[ $got -ne 2 ]]; then
    echo "demo: expected one firing and one resolved alert, got $got messages" >&2
    return 1
  fi
  echo
  echo "demo: one firing and one resolved alert delivered to the local webhook in ${SECONDS}s"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  main "$@"
fi
