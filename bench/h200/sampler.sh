#!/usr/bin/env bash
# Summary: the watchdog daemon's resident nvidia-smi loops on the real GPU: CPU per cycle, loop uptime, kill -9, and a loop-mode recording with line timing
# Usage: OUT=DIR bench/h200/sampler.sh   (root, nvidia-smi, PyTorch; about 2.5 minutes)
#
# 1. Records nvidia-smi's loop mode as it prints (through lib/smi.sh's
#    smi_loop_record): the GPU and process queries with and without a
#    header, with and without a process, -lms 500 and -l 1, each line behind
#    its arrival time -> OUT/loop-recording.txt (a fixture for
#    tests/fixtures/h200/).
# 2. Runs yichuidingyin.sh at CHECK_INTERVAL=1 for about 75 s while a
#    PyTorch process holds 2 GiB idle (~30 s), runs bf16 matmuls (~20 s) and
#    exits (the GPU released): CPU per cycle from /proc of the daemon and
#    everything under it (reaped children included), the nvidia-smi loops'
#    own CPU apart, the cycles (gpu-history.tsv), whether the loops stayed
#    up (the same PIDs at the start and the end; the daemon's "nvidia-smi
#    loop:" log lines), the events -> OUT/sampler.txt, OUT/daemon.log,
#    OUT/gpu-history.tsv.
# 3. kill -9 of a second daemon: are its nvidia-smi loops gone 3 s later?
#    -> OUT/sampler.txt.

SS_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=../../lib/common.sh
source "$SS_ROOT/lib/common.sh"
# shellcheck source=../../lib/smi.sh
source "$SS_ROOT/lib/smi.sh"

# CPU seconds of a process tree: "ours loops" (bench/stream.py tree_cpu).
tree_cpu() {
  python3 -c 'import sys; sys.path.insert(0, sys.argv[2]); import stream; print("%.3f %.3f" % stream.tree_cpu(int(sys.argv[1])))' \
    "$1" "$SS_ROOT/bench"
}

# PIDs of nvidia-smi loops (not their sh wrappers), sorted, on one line.
loop_pids() {
  local d argv
  for d in /proc/[0-9]*; do
    argv=$(tr '\0' ' ' 2>/dev/null <"$d/cmdline") || continue
    [[ $argv == nvidia-smi\ *-lms* || $argv == */nvidia-smi\ *-lms* ]] && printf '%s ' "${d#/proc/}"
  done
  echo
}

record_loops() {
  local out=$1 holder flags
  flags=$(mktemp -d)
  {
    echo "# nvidia-smi loop mode as it prints: '<unix time of arrival> <line>'; '# exit' is timeout's (124)"
    nvidia_smi_version=$(smi_run --version | head -1)
    echo "# $nvidia_smi_version"
    echo "### --query-compute-apps, header, no process, -lms 500, 2.2 s"
    smi_loop_record 2.2 --query-compute-apps="timestamp,$SMI_APP_FIELDS" --format=csv -lms 500
  } >"$out"
  python3 "$SS_ROOT/bench/h200/workload.py" idle-then-busy "$flags" >/dev/null 2>&1 &
  holder=$!
  sleep 8
  {
    echo "### --query-gpu (the daemon's fields), noheader,nounits, -lms 500, 3.2 s, one process holding 2 GiB"
    smi_loop_record 3.2 --query-gpu="timestamp,$SMI_GPU_FIELDS" --format=csv,noheader,nounits -lms 500
    echo "### --query-gpu, header, -lms 500, 2.2 s"
    smi_loop_record 2.2 --query-gpu="timestamp,$SMI_GPU_FIELDS" --format=csv -lms 500
    echo "### --query-compute-apps (the daemon's fields), noheader,nounits, -lms 500, 3.2 s"
    smi_loop_record 3.2 --query-compute-apps="timestamp,$SMI_APP_FIELDS" --format=csv,noheader,nounits -lms 500
    echo "### --query-compute-apps, header, -lms 500, 2.2 s"
    smi_loop_record 2.2 --query-compute-apps="timestamp,$SMI_APP_FIELDS" --format=csv -lms 500
    echo "### --query-gpu=timestamp,index,utilization.gpu, noheader, -l 1, 3.5 s"
    smi_loop_record 3.5 --query-gpu=timestamp,index,utilization.gpu --format=csv,noheader -l 1
  } >>"$out"
  touch "$flags/stop" "$flags/busy"
  wait "$holder" 2>/dev/null
  rm -rf -- "$flags"
}

run_daemon() {
  local state=$1 flags daemon holder t0 t1 c0 c1 l0 l1 cycles loops_start loops_end
  flags=$(mktemp -d)
  python3 "$SS_ROOT/bench/h200/workload.py" idle-then-busy "$flags" >/dev/null 2>&1 &
  holder=$!
  GPUGUARD_STATE_DIR=$state GPUGUARD_CONFIG=/dev/null CHECK_INTERVAL=1 MAX_IDLE_CYCLES=10 \
    GPUGUARD_LOG=$state/daemon.log NOTIFY_URL='' ALERTMANAGER_URL='' "$SS_ROOT/bin/yichuidingyin.sh" &
  daemon=$!
  sleep 5
  read -r t0 l0 < <(tree_cpu "$daemon")
  c0=$(wc -l <"$state/gpu-history.tsv" 2>/dev/null || echo 0)
  loops_start=$(loop_pids)
  sleep 25
  touch "$flags/busy"
  sleep 20
  touch "$flags/stop"
  wait "$holder" 2>/dev/null
  sleep 15
  read -r t1 l1 < <(tree_cpu "$daemon")
  c1=$(wc -l <"$state/gpu-history.tsv" 2>/dev/null || echo 0)
  loops_end=$(loop_pids)
  kill -TERM "$daemon"
  wait "$daemon"
  echo "daemon exit status: $? (0 wanted)"
  cycles=$((c1 - c0))
  echo "cycles measured (1 GPU, gpu-history rows): $cycles over about 60 s"
  if ((cycles > 0)); then
    python3 -c 'import sys; t0, t1, l0, l1, n = map(float, sys.argv[1:]); print("CPU per cycle, daemon and everything under it but the nvidia-smi loops: %.2f ms (goal <= 15 ms at 1 GPU)\nCPU per cycle of the two nvidia-smi loops themselves: %.2f ms" % (1000 * (t1 - t0) / n, 1000 * (l1 - l0) / n))' \
      "$t0" "$t1" "$l0" "$l1" "$cycles"
  fi
  echo "nvidia-smi loop PIDs at the start: $loops_start"
  echo "nvidia-smi loop PIDs at the end:   $loops_end"
  [[ $loops_start == "$loops_end" && -n ${loops_start// /} ]] && echo "loops stayed up: yes" || echo "loops stayed up: NO"
  echo "daemon log lines about the loops (restarts, faults):"
  grep -c 'nvidia-smi loop' "$state/daemon.log" || true
  grep 'nvidia-smi loop' "$state/daemon.log" | head -5
  echo "events (want gpu_idle firing during the idle stretch, resolved when busy):"
  grep -o '"event":"[a-z_]*","state":"[a-z]*"' "$state/events.jsonl" 2>/dev/null || echo none
  rm -rf -- "$flags"
}

kill9_check() {
  local state=$1 daemon left
  GPUGUARD_STATE_DIR=$state GPUGUARD_CONFIG=/dev/null CHECK_INTERVAL=1 GPUGUARD_LOG=$state/kill9.log \
    "$SS_ROOT/bin/yichuidingyin.sh" &
  daemon=$!
  sleep 6
  echo "loops before kill -9: $(loop_pids)"
  kill -KILL "$daemon"
  wait "$daemon" 2>/dev/null
  sleep 3
  left=$(loop_pids)
  echo "loops 3 s after kill -9 of the daemon: ${left:-none} (none wanted)"
}

main() {
  local state
  : "${OUT:?set OUT to a folder}"
  state=$(mktemp -d)
  echo "== 1. loop-mode recording -> loop-recording.txt"
  record_loops "$OUT/loop-recording.txt"
  grep -c '^[0-9]' "$OUT/loop-recording.txt" | sed 's/^/lines recorded: /'
  echo "== 2. watchdog daemon, CHECK_INTERVAL=1, 75 s (idle 2 GiB, busy, released)"
  run_daemon "$state"
  cp -- "$state/daemon.log" "$OUT/daemon.log" 2>/dev/null
  cp -- "$state/gpu-history.tsv" "$OUT/gpu-history.tsv" 2>/dev/null
  echo "== 3. kill -9 of the daemon"
  kill9_check "$(mktemp -d)"
  rm -rf -- "$state"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  main "$@" 2>&1 | tee "${OUT:?}/sampler.txt"
fi
