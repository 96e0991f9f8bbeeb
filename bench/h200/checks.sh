#!/usr/bin/env bash
# Summary: the real-hardware checks on an H200 (idle watchdog, alerts, leak watch, lowprio-run)
# Usage: bench/h200/checks.sh OUTDIR [idle|leak|lowprio]...
# Runs against the real nvidia-smi and PyTorch; writes logs, events and
# figures under OUTDIR.

main() {
  local out=$1
  shift
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  mkdir -p "$out"
  local step
  local -a steps=("$@")
  ((${#steps[@]})) || steps=(idle leak lowprio)
  for step in "${steps[@]}"; do
    "check_$step" "$root" "$out" 2>&1 | tee "$out/$step.log"
  done
}

# The watchdog against an idle PyTorch holder, then busy, alerting to a sink;
# also records both nvidia-smi queries at 1 Hz (a scenario for the demo).
check_idle() {
  local root=$1 out=$2 w=/tmp/h200-idle i
  rm -rf "$w" && mkdir -p "$w/flags"
  python3 "$root/tests/webhook_sink.py" --port-file "$w/port" --record "$out/idle_sink.jsonl" --seconds 300 --quiet &
  local sink=$!
  python3 "$root/bench/h200/workload.py" idle-then-busy "$w/flags" &
  local job=$!
  (
    # shellcheck source=../../lib/common.sh
    source "$root/lib/common.sh"
    # shellcheck source=../../lib/smi.sh
    source "$root/lib/smi.sh"
    while :; do
      printf '### %s\n' "$(date +%s.%N)"
      smi_run --query-gpu="$SMI_GPU_FIELDS" --format=csv,noheader,nounits
      printf '### apps\n'
      smi_run --query-compute-apps="$SMI_APP_FIELDS" --format=csv,noheader,nounits
      sleep 1
    done
  ) >"$out/idle_recording.txt" 2>&1 &
  local rec=$!
  until [[ -s $w/port ]]; do sleep 0.1; done
  sleep 3
  env CHECK_INTERVAL=2 MAX_IDLE_CYCLES=3 GPUGUARD_CONFIG=/dev/null GPUGUARD_STATE_DIR="$w/state" \
    NOTIFY_URL="http://127.0.0.1:$(<"$w/port")/generic" GPUGUARD_TEXTFILE_DIR="$out" \
    "$root/bin/yichuidingyin.sh" 2>"$out/idle_watchdog.log" &
  local dog=$!
  echo "firing after $(wait_event "$w/state/events.jsonl" firing) s"
  touch "$w/flags/busy"
  echo "resolved $(wait_event "$w/state/events.jsonl" resolved) s after the job got busy"
  touch "$w/flags/stop"
  wait "$job"
  sleep 5
  kill "$dog" "$rec"
  wait "$dog"
  echo "watchdog exit status $?"
  cp "$w/state/events.jsonl" "$out/idle_events.jsonl"
  sleep 1
  kill "$sink"
  echo "== events"
  cat "$out/idle_events.jsonl"
  echo "== the sink received"
  python3 -c 'import json,sys; [print(json.loads(l)["body"]["state"], json.loads(l)["body"]["message"].splitlines()[0]) for l in open(sys.argv[1])]' "$out/idle_sink.jsonl"
  echo "== cost with the real nvidia-smi: 30 back-to-back watchdog cycles, then 30 bare call pairs"
  local TIMEFORMAT='%R s wall, %U s user, %S s sys'
  time env GPUGUARD_CONFIG=/dev/null GPUGUARD_STATE_DIR="$w/bench" NOTIFY_URL= \
    bash "$root/bench/idle_bench.sh" 30 >/dev/null
  time (
    source "$root/lib/common.sh"
    source "$root/lib/smi.sh"
    for ((i = 0; i < 30; i++)); do
      smi_run --query-gpu="$SMI_GPU_FIELDS" --format=csv,noheader,nounits >/dev/null
      smi_run --query-compute-apps="$SMI_APP_FIELDS" --format=csv,noheader,nounits >/dev/null
    done
  )
}

# Waits up to 30 s for an event of the given state in an events.jsonl;
# prints the seconds waited.
wait_event() {
  local file=$1 state=$2 i
  for ((i = 0; i < 150; i++)); do
    grep -q "\"state\":\"$state\"" "$file" 2>/dev/null && break
    sleep 0.2
  done
  echo "$((i / 5))"
}

# gpu-leak-watch on a leaking and a healthy training loop, each behind a
# launcher (timeout), as torchrun or swift would be.
check_leak() {
  local root=$1 out=$2 w=/tmp/h200-leak
  rm -rf "$w" && mkdir -p "$w"
  timeout 140 python3 "$root/bench/h200/workload.py" train leak 130 &
  local leak=$!
  timeout 140 python3 "$root/bench/h200/workload.py" train healthy 130 &
  local healthy=$!
  echo "launchers: leak=$leak healthy=$healthy"
  sleep 2
  env GPUGUARD_CONFIG=/dev/null GPUGUARD_STATE_DIR="$w/state" \
    "$root/bin/gpu-leak-watch" --pid "$leak" --pid "$healthy" --interval 1 --bucket 2 \
    2>"$out/leak_watch.log" &
  local watch=$!
  wait "$leak" "$healthy"
  sleep 2
  kill "$watch"
  wait "$watch"
  echo "== events"
  cat "$w/state/events.jsonl" 2>/dev/null
  GPUGUARD_CONFIG=/dev/null GPUGUARD_STATE_DIR="$w/state" LEAK_BUCKET_S=2 \
    "$root/bin/gpu-leak-watch" report --out "$out/leak_report.html"
  mkdir -p "$out/leak_history"
  cp "$w/state/history/"*.csv "$out/leak_history/"
  cp "$w/state/events.jsonl" "$out/leak_events.jsonl" 2>/dev/null
  echo "== replay of the recorded traces through the CLI"
  local f
  for f in "$out/leak_history/"*.csv; do
    echo "$f: $(LEAK_BUCKET_S=2 GPUGUARD_CONFIG=/dev/null GPUGUARD_STATE_DIR="$w/replay" "$root/bin/gpu-leak-watch" --replay "$f" --bucket 2 | head -c 300)"
  done
}

# lowprio-run on pure cgroup v2: the tests (real v2 path) and the bench.
check_lowprio() {
  local root=$1 out=$2
  "$root/bin/lowprio-run" --tier batch --explain
  (cd "$root" && python3 -m pytest -q -p no:cacheprovider tests/test_lowprio.py 2>&1 | tail -15)
  python3 "$root/bench/lowprio.py" | tee "$out/lowprio_bench.md"
}

# install.sh on the real box, then doctor and status while an idle PyTorch
# process holds the GPU; a textfile snapshot taken mid-idle; a signed
# DingTalk-style delivery to a local receiver.
check_ops() {
  local root=$1 out=$2 w=/tmp/h200-ops i
  rm -rf "$w" && mkdir -p "$w/flags"
  "$root/install.sh" --prefix /opt/gpuguard
  export PATH=/opt/gpuguard/bin:$PATH
  printf 'SECh200check0123456789\n' >"$w/secret"
  python3 "$root/tests/webhook_sink.py" --port-file "$w/port" --record "$out/ops_sink.jsonl" \
    --secret-file "$w/secret" --seconds 120 --quiet &
  local sink=$!
  python3 "$root/bench/h200/workload.py" idle-then-busy "$w/flags" >"$w/job.log" &
  local job=$!
  until [[ -s $w/port ]] && grep -q holding "$w/job.log"; do sleep 0.2; done
  cd / || return
  local env=(GPUGUARD_STATE_DIR="$w/state" GPUGUARD_TEXTFILE_DIR="$w/textfile" MAX_IDLE_CYCLES=3
    NOTIFY_URL="dingtalk+http://127.0.0.1:$(<"$w/port")/dingtalk/robot/send?access_token=tok123" NOTIFY_SECRET="$(<"$w/secret")")
  echo "== gpuguard doctor"
  env "${env[@]}" gpuguard doctor
  echo "doctor exit status $?"
  for i in 1 2 3; do
    env "${env[@]}" GPUGUARD_NOW=$((1796220000 + 60 * i)) yichuidingyin.sh --once
    sleep 1
  done
  cp "$w/textfile/gpuguard_idle.prom" "$out/idle_textfile_mid_idle.prom"
  echo "== gpuguard status"
  env "${env[@]}" gpuguard status
  echo "== events"
  cat "$w/state/events.jsonl"
  touch "$w/flags/busy" && sleep 2 && touch "$w/flags/stop"
  wait "$job"
  sleep 1
  kill "$sink"
  echo "== the DingTalk-style receiver got (signature checked there)"
  python3 -c 'import json,sys; [print(json.loads(l)["reply_status"], json.loads(l)["body"]["markdown"]["title"]) for l in open(sys.argv[1])]' "$out/ops_sink.jsonl"
  cd "$root" || return
  "$root/install.sh" --prefix /opt/gpuguard --uninstall
  echo "left after uninstall: $(find /opt/gpuguard /etc/gpuguard 2>/dev/null | wc -l) paths"
}

# More lowprio-run variants on v2, to see which setting buys the latency.
check_lowprio_variants() {
  local root=$1
  python3 - "$root" <<'PY'
import importlib.util, os, sys
root = sys.argv[1]
spec = importlib.util.spec_from_file_location("b", os.path.join(root, "bench/lowprio.py"))
b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)
lp = [os.path.join(root, "bin/lowprio-run")]
for name, prefix in (("offline (idle, nice 19, no cap)", lp + ["--tier", "offline", "--"]),
                     ("batch without the cap", lp + ["--tier", "batch", "--cpu-max", "16", "--"]),
                     ("nice 19 only", ["nice", "-n", "19"])):
    runs = [b.scenario(prefix) for _ in range(3)]
    med = [sorted(r[i] for r in runs)[1] for i in range(4)]
    print("| %s | %.2f | %.2f | %.0f | %.0f |" % ((name,) + tuple(med)))
PY
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  main "$@"
fi
