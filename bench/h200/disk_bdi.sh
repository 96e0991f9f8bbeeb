#!/usr/bin/env bash
# Summary: does a strict share of the disk's writeback cache (/sys/class/bdi/DISK strict_limit, max_bytes) beside lowprio-run's default tier keep a service's write+fsync near idle? (H200 host: root, cgroup v2 with io)
# Usage: bench/h200/disk_bdi.sh [OUTDIR]   (default $OUT)
#
# A short form of bench/h200/disk_adaptive.sh for one question (issue 23,
# bench/RESULTS.md §8e). The service (cgroup /gg-bdi-svc-PID) does a 4 KiB
# write+fsync and a 4 KiB O_DIRECT read every 20 ms for IO_S seconds
# (bench/h200/lowprio_io.py io); the job, from the sibling cgroup
# /gg-bdi-job-PID, runs `lowprio-run --report --` with no disk flag
# around a loop of 1000 MiB checkpoints (dd conv=fsync). Rows: idle; the
# default; the default with the disk's writeback cache limited to each of
# MIBS (strict: every cgroup held to its share, which follows its write
# rate). The bdi settings are put back at the end, also on failure.
# Environment: IO_S (8), MIBS (32 128). About 1 minute.
# Writes OUTDIR/disk_bdi.md.

BDI_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=disk_default.sh
source "$BDI_HERE/disk_default.sh"

main() {
  local out=${1:-${OUT:?set OUT or give a folder}} mib
  local root
  root=$(cd "$BDI_HERE/../.." && pwd)
  IO_S=${IO_S:-8} MIBS=${MIBS:-32 128}
  CG=/sys/fs/cgroup
  WORK=$(mktemp -d /var/tmp/gg-disk-bdi.XXXXXX)
  SVC=$CG/gg-bdi-svc-$$ JOB=$CG/gg-bdi-job-$$
  HELPER=$root/bench/h200/lowprio_io.py LP=$root/bin/lowprio-run
  export GPUGUARD_STATE_DIR=$WORK/state LOWPRIO_MECHANISM=cgroup-v2
  DISK=$(bench_disk_of "$WORK")
  BDI=/sys/class/bdi/$DISK
  BDI_BEFORE="$(cat "$BDI/max_ratio_fine") $(cat "$BDI/strict_limit")" || return 1
  trap bdi_cleanup EXIT
  mkdir -p "$out" "$SVC" "$JOB"
  echo "+io" >>"$CG/cgroup.subtree_control" 2>/dev/null
  "$LP" --measure-disk "$WORK" 2>&1 | tail -1
  python3 "$HELPER" io 0.1 "$WORK" >/dev/null
  {
    echo "| row | write+fsync p50 / p99 ms | O_DIRECT read p50 / p99 ms | job MiB written in the row |"
    echo "|---|---|---|---|"
    sync
    sleep 2
    bdi_row idle
    bdi_row default
    for mib in $MIBS; do
      if ! { echo 1 >"$BDI/strict_limit" && echo $((mib << 20)) >"$BDI/max_bytes"; }; then
        bdi_restore
        continue
      fi
      bdi_row "default, bdi $mib MiB strict"
      bdi_restore
    done
  } | tee "$out/disk_bdi.md"
}

# One row: the service's probe for IO_S seconds, beside the job unless idle.
bdi_row() {
  local label=$1 io job='' w0 w1
  if [[ $label != idle ]]; then
    bdi_written_into w0
    # shellcheck disable=SC2016 # the job script expands its own arguments
    bench_in "$JOB" "$LP" --report -- bash -c 'while :; do dd if=/dev/zero of="$1/ck" bs=1M count=1000 conv=fsync status=none; done' _ "$WORK" 2>"$WORK/job.err" &
    job=$!
    sleep 2
  fi
  io=$(bench_in "$SVC" python3 "$HELPER" io "$IO_S" "$WORK")
  if [[ -n $job ]]; then
    bdi_written_into w1
    kill -TERM "$job" 2>/dev/null
    wait "$job" 2>/dev/null
    rm -f "$WORK/ck"
    sync
    sleep 1
  fi
  local -a f
  read -ra f <<<"$io"
  printf '| %s | %s / %s | %s / %s | %s |\n' "$label" "${f[0]:-?}" "${f[1]:-?}" "${f[2]:-?}" "${f[3]:-?}" \
    "$([[ -n $job ]] && echo $(((w1 - w0) >> 20)) || echo -)"
}

# Puts the bytes the job's cgroup has written to disk into the variable $1.
bdi_written_into() {
  local -n w_ref=$1
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  w_ref=$(awk '{ for (i = 2; i <= NF; i++) if ($i ~ /^wbytes=/) { split($i, a, "="); s += a[2] } } END { print s + 0 }' "$JOB/io.stat" 2>/dev/null)
}

bdi_restore() {
  local ratio strict
  read -r ratio strict <<<"$BDI_BEFORE"
  echo "$ratio" >"$BDI/max_ratio_fine"
  echo "$strict" >"$BDI/strict_limit"
}

bdi_cleanup() {
  bdi_restore
  bench_rm_cgroups "$SVC" "$JOB"
  rm -rf -- "$WORK"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  main "$@"
fi
