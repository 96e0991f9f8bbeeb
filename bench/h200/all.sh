#!/usr/bin/env bash
# Summary: every real-H200 check of this round in one device call (~8 min)
# Usage: OUT=DIR bench/h200/all.sh
#
# GPU steps run one after the other (their patterns must not overlap):
# spin.sh (which GPU patterns the watchdog calls stuck, idle or busy), a
# live fast leak under gpu-leak-watch -- CMD (alert before OOM, the job's
# exit status), leakcmd.sh (wrapper statuses and signals with CUDA jobs).
# Beside them: faults.sh (the watchdog under kill -9 and a flaky receiver,
# its incidents coming from the spin patterns) and, during the second half,
# lowprio_io.sh (CPU and I/O isolation). Each step's files are packed into
# OUT/STEP.tgz (the device returns at most 8 files); OUT/all.txt is the log.

main() {
  local out=${OUT:?set OUT} here work
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  work=$(mktemp -d)
  WORK=$work
  mkdir -p "$work"/{spin,faults,fill,leakcmd,lowprio}
  export PYTHONUNBUFFERED=1
  OUT=$work/faults DURATION=${FAULTS_S:-380} GG_NO_WORKLOAD=1 \
    timeout 440 bash "$here/faults.sh" >"$work/faults/run.log" 2>&1 &
  local faults=$!
  step spin 220 env OUT="$work/spin" bash "$here/spin.sh"
  OUT=$work/lowprio timeout 260 bash "$here/lowprio_io.sh" "$work/lowprio" >"$work/lowprio/run.log" 2>&1 &
  local lowprio=$!
  step fill 100 bash "$here/fill_live.sh" "$work/fill"
  step leakcmd 150 env OUT="$work/leakcmd" bash "$here/leakcmd.sh"
  wait "$lowprio"
  printf 'lowprio exit %s\n' "$?"
  wait "$faults"
  printf 'faults exit %s\n' "$?"
  local d
  for d in spin faults fill leakcmd lowprio; do
    tar -C "$work/$d" -czf "$out/$d.tgz" .
  done
}

# Packs each folder under $1 into $2/FOLDER.tgz (what comes back from the
# device).
pack_steps() {
  local d
  for d in "$1"/*/; do
    d=$(basename "$d")
    tar -C "$1/$d" -czf "$2/$d.tgz" .
  done
}

# Runs one step under a time limit and logs its start, end and status.
step() {
  local name=$1 limit=$2 rc=0
  shift 2
  printf '== %s start %s\n' "$name" "$(date +%T)"
  timeout "$limit" "$@" >"$WORK/$name/step.log" 2>&1 || rc=$?
  printf '== %s exit %s at %s\n' "$name" "$rc" "$(date +%T)"
  tail -25 "$WORK/$name/step.log"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  main "$@" 2>&1 | tee "${OUT:?}/all.txt"
fi
