#!/usr/bin/env bash
# Summary: gpu-leak-watch -- CMD on a real H200: exit statuses, signals to a CUDA job, several watchers per box
# Usage: OUT=DIR bench/h200/leakcmd.sh
# Run as root on a box with one H200, PyTorch and nvidia-smi (about 2.5
# minutes). Writes under $OUT (flat): leakcmd_summary.txt (one PASS/FAIL
# line per check, the figures), leakcmd.log (everything the wrappers and
# jobs printed), leakcmd_state.txt (the state folder afterwards),
# leakcmd_events.jsonl. Exit status: the number of failed checks.
#
# Checks: (1) two wrapped PyTorch training jobs at once beside an --all
# daemon, each keeping its exit status (0 and 3) and its own history with
# the job's GPU memory seen through its process tree; (2) a second --all
# refused; (3) SIGINT and SIGTERM to the wrapper reach a job blocked in
# CUDA work, the wrapper ends as the job did and the GPU memory is freed;
# (4) 127 and 137 from the real box; (5) no lock file left but the daemon's.

main() {
  local root out=${OUT:?set OUT to the results folder}
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  # shellcheck source=../../lib/common.sh
  source "$root/lib/common.sh"
  # shellcheck source=../../lib/smi.sh
  source "$root/lib/smi.sh"
  NVIDIA_SMI=nvidia-smi
  SMI_TIMEOUT=10
  mkdir -p "$out"
  local w=/tmp/h200-leakcmd
  rm -rf "$w" && mkdir -p "$w"
  export GPUGUARD_CONFIG=/dev/null GPUGUARD_STATE_DIR=$w/state
  FAILS=0
  SUMMARY=$out/leakcmd_summary.txt
  : >"$SUMMARY"
  run_checks "$root" "$w" >>"$out/leakcmd.log" 2>&1
  {
    ls -la "$w/state" "$w/state/history"
    head -n 3 "$w/state/history/"*.csv
  } >"$out/leakcmd_state.txt" 2>&1
  cp "$w/state/events.jsonl" "$out/leakcmd_events.jsonl" 2>/dev/null
  printf 'failed checks: %d\n' "$FAILS" >>"$SUMMARY"
  cat "$SUMMARY"
  return "$FAILS"
}

# Records one check: "PASS name: detail" or "FAIL name: detail".
check() {
  local ok=$1 name=$2 detail=$3
  if ((ok)); then
    printf 'PASS %s: %s\n' "$name" "$detail" >>"$SUMMARY"
  else
    printf 'FAIL %s: %s\n' "$name" "$detail" >>"$SUMMARY"
    FAILS=$((FAILS + 1))
  fi
}

# Waits up to $1 seconds for the command after it to succeed.
wait_until() {
  local limit=$1 waited=0
  shift
  until "$@"; do
    ((waited >= limit * 10)) && return 1
    sleep 0.1
    waited=$((waited + 1))
  done
}

# True when nvidia-smi lists PID $1 as a compute process.
gpu_has_pid() {
  smi_run --query-compute-apps=pid --format=csv,noheader,nounits | grep -qx "[[:space:]]*$1[[:space:]]*"
}

# True when nvidia-smi no longer lists PID $1.
gpu_lacks_pid() {
  ! gpu_has_pid "$1"
}

# The largest used_memory_mib in the history of PID $1 (0 when none).
history_peak() {
  local f peak=0 used
  for f in "$GPUGUARD_STATE_DIR/history/$1"-*.csv; do
    [[ -f $f ]] || continue
    while IFS=, read -r _ _ used _; do
      if [[ $used =~ ^[0-9]+$ ]] && ((used > peak)); then
        peak=$used
      fi
    done <"$f"
  done
  printf '%s\n' "$peak"
}

run_checks() {
  local root=$1 w=$2 watch=$1/bin/gpu-leak-watch workload=$1/bench/h200/workload.py
  local daemon a b rc_a rc_b rc pid_a pid_b started
  echo "== --all daemon, then two wrapped training jobs at once"
  "$watch" --all --interval 1 --bucket 2 2>"$w/daemon.log" &
  daemon=$!
  sleep 2
  "$watch" --interval 1 --bucket 2 -- python3 "$workload" train leak 70 2>"$w/a.log" &
  a=$!
  "$watch" --interval 1 --bucket 2 -- bash -c "python3 '$workload' train healthy 60; exit 3" 2>"$w/b.log" &
  b=$!
  sleep 20
  "$watch" --all --interval 1 2>"$w/second.log"
  rc=$?
  check "$((rc == 1))" second-all-refused "exit $rc: $(tail -n 1 "$w/second.log")"
  rc_a=0 rc_b=0
  wait "$a" || rc_a=$?
  wait "$b" || rc_b=$?
  pid_a=$(sed -n 's/.*started job PID \([0-9]*\).*/\1/p' "$w/a.log")
  pid_b=$(sed -n 's/.*started job PID \([0-9]*\).*/\1/p' "$w/b.log")
  check "$((rc_a == 0 && rc_b == 3))" two-jobs-status "exits $rc_a and $rc_b (want 0 and 3)"
  check "$(($(history_peak "$pid_a") > 0 && $(history_peak "$pid_b") > 0))" two-jobs-history \
    "peak GPU MiB in each job's own history: $(history_peak "$pid_a") (python job) and $(history_peak "$pid_b") (bash launcher, python child)"
  local alive=0
  if kill -0 "$daemon" 2>/dev/null; then
    alive=1
  fi
  check "$alive" daemon-beside-jobs "--all daemon still running after both jobs"
  cat "$w/a.log" "$w/b.log" "$w/second.log"

  echo "== signals to the wrapper reach a job in CUDA work"
  local sig want job_pid
  for sig in INT TERM; do
    rm -f "$w/ready"
    "$watch" --interval 1 -- python3 -c "
import time, torch
x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')
a = torch.randn(4096, 4096, device='cuda')
open('$w/ready', 'w').close()
while True:
    a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
" 2>"$w/sig.log" &
    started=$!
    wait_until 120 test -e "$w/ready"
    job_pid=$(sed -n 's/.*started job PID \([0-9]*\).*/\1/p' "$w/sig.log")
    wait_until 30 gpu_has_pid "$job_pid"
    kill -s "$sig" "$started"
    rc=0
    wait "$started" || rc=$?
    # bash reports a wrapper ended by SIGINT as 130 too
    want=143
    if [[ $sig == INT ]]; then
      want=130
    fi
    local freed=0
    if wait_until 20 gpu_lacks_pid "$job_pid"; then
      freed=1
    fi
    check "$((rc == want && freed))" "sig$sig-cuda-job" "wrapper status $rc (want $want), job's GPU memory freed: $freed"
    cat "$w/sig.log"
  done

  echo "== exit statuses from the real box"
  "$watch" -- no-such-command-h200 2>"$w/nf.log"
  rc=$?
  check "$((rc == 127))" not-found "exit $rc: $(cat "$w/nf.log")"
  "$watch" -- python3 -c "import os, signal, torch; torch.zeros(1, device='cuda'); os.kill(os.getpid(), signal.SIGKILL)" 2>>"$w/nf.log"
  rc=$?
  check "$((rc == 137))" killed-cuda-job "exit $rc (want 137)"

  echo "== locks"
  local locks='' lockfile
  for lockfile in "$GPUGUARD_STATE_DIR"/*.lock; do
    [[ -e $lockfile ]] && locks+="${lockfile##*/} "
  done
  local only_daemon=0
  if [[ $locks == 'leak-all.lock ' ]]; then
    only_daemon=1
  fi
  check "$only_daemon" locks "lock files while only the daemon runs: $locks"
  kill -TERM "$daemon"
  rc=0
  wait "$daemon" || rc=$?
  check "$((rc == 0))" daemon-stop "daemon exit $rc after SIGTERM"
  cat "$w/daemon.log"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  main "$@"
fi
