#!/usr/bin/env bash
# Summary: on a real H200: which GPU patterns the watchdog calls stuck (spinning), idle or busy
# Usage: OUT=DIR [SPIN_PATTERNS="sleep:gpu_stuck matmul:none ..."] bench/h200/spin.sh   (or: bench/h200/spin.sh DIR)
#
# Runs the idle watchdog (bin/yichuidingyin.sh, defaults, CHECK_INTERVAL=2)
# against the real nvidia-smi while bench/h200/spin_workload.py runs, one
# after the other on GPU 0: a kernel spinning on the clock
# (torch.cuda._sleep), 132 and 32 blocks polling a flag (Triton; skipped
# without it), a bf16 training-like loop, a memory-bound copy, a loop
# starved by its data loader, tiny kernels launched from Python and
# replayed by a CUDA graph. With 2 GPUs (nvidia-smi -L), a two-rank NCCL
# job follows in which rank 0 sleeps while rank 1 waits in all_reduce.
# Events come from the state folder's events.jsonl. Expected: every spin
# raises gpu_stuck, the NCCL waiter within SPIN_CYCLES cycles, no busy
# pattern raises anything, the starved loop is idle (gpu_idle), never stuck.
# Writes under OUT (flat, 5 files): spin_table.md (the table),
# spin_events.jsonl, spin_samples.tsv (nvidia-smi every second, by phase),
# spin_watchdog.log, spin_workload.log. About 3 minutes; root, no network.

SPIN_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=../../lib/common.sh
source "$SPIN_ROOT/lib/common.sh"
# shellcheck source=../../lib/smi.sh
source "$SPIN_ROOT/lib/smi.sh"

# Seconds each pattern runs: a spin needs SPIN_CYCLES (5) x 2 s, a busy
# pattern shows it never trips in 6 cycles.
SPIN_SECONDS=${SPIN_SECONDS:-16}
BUSY_SECONDS=${BUSY_SECONDS:-12}
GAP_SECONDS=${GAP_SECONDS:-3}

main() {
  local out=${1:-${OUT:?set OUT or give a folder}}
  mkdir -p "$out"
  local w
  w=$(mktemp -d /tmp/gpuguard-spin.XXXXXX)
  local ngpus
  ngpus=$(smi_run -L | grep -c '^GPU ') || ngpus=0
  printf 'phase\tstart\tend\texpected\n' >"$w/phases.tsv"
  printf 'start\n' >"$w/phase"
  : >"$out/spin_workload.log"
  spin_sampler "$w" >"$out/spin_samples.tsv" &
  local sampler=$!
  env CHECK_INTERVAL=2 GPUGUARD_CONFIG=/dev/null GPUGUARD_STATE_DIR="$w/state" \
    "$SPIN_ROOT/bin/yichuidingyin.sh" 2>"$out/spin_watchdog.log" &
  local dog=$!
  sleep 3
  local pattern mode expected
  for pattern in ${SPIN_PATTERNS:-sleep:gpu_stuck matmul:none poll-132:gpu_stuck memcpy:none poll-32:gpu_stuck starved:gpu_idle launch:none graph:none}; do
    mode=${pattern%%:*} expected=${pattern#*:}
    if [[ $mode == poll-* ]] && ! python3 -c 'import triton' 2>/dev/null; then
      echo "no triton: $mode is skipped" >>"$out/spin_workload.log"
      continue
    fi
    if [[ $expected == gpu_stuck ]]; then
      spin_phase "$w" "$out" "${mode/-/ }" "$expected" "$SPIN_SECONDS"
    else
      spin_phase "$w" "$out" "${mode/-/ }" "$expected" "$BUSY_SECONDS"
    fi
  done
  if ((ngpus >= 2)); then
    spin_nccl "$w" "$out"
  else
    echo "$ngpus GPU(s): the two-rank NCCL check needs 2" >>"$out/spin_workload.log"
  fi
  sleep 3
  kill "$dog" "$sampler" 2>/dev/null || true
  wait "$dog" "$sampler" 2>/dev/null || true
  cp "$w/state/events.jsonl" "$out/spin_events.jsonl" 2>/dev/null || : >"$out/spin_events.jsonl"
  spin_table "$w/phases.tsv" "$out/spin_events.jsonl" "$out/spin_samples.tsv" | tee "$out/spin_table.md"
  rm -rf -- "$w"
}

# Runs one pattern on GPU 0 for SECONDS and records its phase.
# Arguments:
#   $1 work folder, $2 output folder, $3 mode (and its argument), $4 what
#   the watchdog should say (gpu_stuck, gpu_idle, none), $5 seconds
spin_phase() {
  local w=$1 out=$2 mode=$3 expected=$4 seconds=$5 pid start
  local -a args
  read -r -a args <<<"$mode"
  printf '%s\n' "$mode" >"$w/phase"
  start=$(date +%s)
  CUDA_VISIBLE_DEVICES=0 timeout -s KILL $((seconds + 12)) \
    python3 "$SPIN_ROOT/bench/h200/spin_workload.py" "${args[0]}" "$seconds" "${args[@]:1}" \
    >>"$out/spin_workload.log" 2>&1 &
  pid=$!
  wait "$pid" || echo "$mode: exited $?" >>"$out/spin_workload.log"
  printf '%s\t%s\t%s\t%s\n' "${mode// /-}" "$start" "$(date +%s)" "$expected" >>"$w/phases.tsv"
  printf 'gap\n' >"$w/phase"
  sleep "$GAP_SECONDS"
}

# The two-rank NCCL job: rank 0 sleeps on GPU 0, rank 1 waits in
# all_reduce on GPU 1. Records when rank 1 started waiting.
spin_nccl() {
  local w=$1 out=$2 r0 r1 start
  printf 'nccl\n' >"$w/phase"
  start=$(date +%s)
  rm -f "$w/nccl-init"
  timeout -s KILL 45 python3 "$SPIN_ROOT/bench/h200/spin_workload.py" nccl 20 0 2 "$w/nccl-init" \
    >>"$out/spin_workload.log" 2>&1 &
  r0=$!
  timeout -s KILL 45 python3 "$SPIN_ROOT/bench/h200/spin_workload.py" nccl 20 1 2 "$w/nccl-init" \
    >"$w/rank1.log" 2>&1 &
  r1=$!
  wait "$r0" || echo "nccl rank 0: exited $?" >>"$out/spin_workload.log"
  # rank 0 is gone: rank 1 would wait until NCCL's timeout
  kill -KILL "$r1" 2>/dev/null || true
  wait "$r1" 2>/dev/null || true
  cat "$w/rank1.log" >>"$out/spin_workload.log"
  local waiting
  waiting=$(awk '$1 == "waiting" {printf "%d", $2}' "$w/rank1.log")
  printf 'nccl-rank1-all_reduce\t%s\t%s\tgpu_stuck@1\n' "${waiting:-$start}" "$(date +%s)" >>"$w/phases.tsv"
  printf 'nccl-rank0-sleeps\t%s\t%s\tgpu_idle@0\n' "$start" "$(date +%s)" >>"$w/phases.tsv"
  printf 'gap\n' >"$w/phase"
  sleep "$GAP_SECONDS"
}

# Prints one tab-separated line a second: time, phase, then nvidia-smi's
# index, utilization, power draw and power limit of each GPU.
spin_sampler() {
  local w=$1 now line phase out
  printf 'ts\tphase\tgpu\tutil\tpower_w\tlimit_w\n'
  while :; do
    now=$(date +%s)
    phase=$(<"$w/phase") || phase='?'
    # in $(...): smi_run reads to EOF, which set -e must not see
    out=$(smi_run --query-gpu=index,utilization.gpu,power.draw,power.limit --format=csv,noheader,nounits) || true
    while IFS= read -r line; do
      [[ -n $line ]] && printf '%s\t%s\t%s\n' "$now" "$phase" "${line//, /$'\t'}"
    done <<<"$out"
    sleep 1
  done 2>/dev/null
}

# Prints the table: per phase the medians read, what fired, and whether it
# is what was expected.
spin_table() {
  python3 - "$@" <<'EOF'
import json, statistics, sys
phases_path, events_path, samples_path = sys.argv[1:4]
phases = [l.rstrip("\n").split("\t") for l in open(phases_path)][1:]
events = [json.loads(l) for l in open(events_path) if l.strip()]
samples = [l.rstrip("\n").split("\t") for l in open(samples_path)][1:]
print("| pattern | GPU | util % (median) | power W (median) | % of limit | events | expected | verdict |")
print("|---|---|---|---|---|---|---|---|")
bad = 0
for name, start, end, expected in phases:
    start, end = int(start), int(end)
    gpu = int(expected.split("@")[1]) if "@" in expected else 0
    expected = expected.split("@")[0]
    rows = [s for s in samples if len(s) == 6 and start <= int(s[0]) <= end and s[2] == str(gpu)
            and s[1] not in ("gap",)]
    def med(i):
        vals = [float(s[i]) for s in rows if s[i].replace(".", "", 1).isdigit()]
        return statistics.median(vals) if vals else None
    util, power, limit = med(3), med(4), med(5)
    pct = "%.0f" % (100 * power / limit) if power and limit else "?"
    fired = [e for e in events if e.get("state") == "firing" and e.get("gpu") == gpu
             and start <= e["ts"] <= end + 3]
    got = ", ".join("%s after %ds" % (e["event"], e["ts"] - start) for e in fired) or "none"
    kinds = {e["event"] for e in fired}
    ok = (kinds == {expected}) if expected != "none" else not kinds
    bad += not ok
    print("| %s | %d | %s | %s | %s | %s | %s | %s |" % (
        name, gpu, "?" if util is None else "%.0f" % util, "?" if power is None else "%.0f" % power,
        pct, got, expected, "ok" if ok else "WRONG"))
print()
print("%d of %d patterns as expected" % (len(phases) - bad, len(phases)))
EOF
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  main "$@"
fi
