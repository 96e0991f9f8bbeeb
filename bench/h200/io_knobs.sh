#!/usr/bin/env bash
# Summary: which cgroup v2 I/O knob keeps a service's fsync and read latency within 2x of idle beside a checkpoint writer (H200 host: root, pure cgroup v2)
# Usage: bench/h200/io_knobs.sh [OUTDIR]   (default $OUT)
#
# The exploration behind lowprio-run's I/O defaults (issue 15). The service
# (cgroup /gg-knob-svc-PID) runs the probe of bench/h200/lowprio_io.py: a
# 4 KiB write+fsync and a 4 KiB O_DIRECT read every 20 ms for IO_S seconds.
# The job (cgroup /gg-knob-job-PID, a sibling) rewrites a 1 GiB checkpoint
# with buffered writes and conv=fsync at full disk speed. Each scenario
# sets knobs on the job's (or the service's) cgroup directly, then measures:
# none, plain, io.prio.class=idle, io.max, memory.high (a bound on the job's
# dirty page cache), their combinations, io.cost with io.weight 1, and
# io.latency on the service; then the BFQ scheduler with the I/O idle class;
# on request (KNOBS) io.max at 50 and 20 MB/s and iocost with latency
# targets (iocost-qos).
# Writes OUTDIR/io_knobs.tsv (raw rows) and io_knobs.md (the table), and
# logs to stdout. Restores the disk's scheduler and io.cost; about 3 min.
# Environment: IO_S (8), WARM_S (2), ROUNDS (1), KNOBS (scenario names).

KNOBS_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lowprio_io.sh
source "$KNOBS_HERE/lowprio_io.sh"

main() {
  local out=${1:-${OUT:?set OUT or give a folder}}
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  mkdir -p "$out"
  IO_S=${IO_S:-8} WARM_S=${WARM_S:-2}
  WORK=$(mktemp -d /var/tmp/gg-io-knobs.XXXXXX)
  SVC=$CG/gg-knob-svc-$$ JOB=$CG/gg-knob-job-$$
  DISK=$(bench_disk_of "$WORK")
  DISK_SYS=$(readlink -f "/sys/dev/block/$DISK")
  SCHED_BEFORE=$(sed 's/.*\[\(.*\)\].*/\1/' "$DISK_SYS/queue/scheduler")
  trap knobs_cleanup EXIT
  local c
  for c in cpu io memory; do
    grep -qw "$c" "$CG/cgroup.subtree_control" || echo "+$c" >"$CG/cgroup.subtree_control"
  done
  echo "== kernel $(uname -r); $WORK on $(findmnt -no SOURCE,FSTYPE,OPTIONS --target "$WORK")"
  echo "== disk $DISK: scheduler $(<"$DISK_SYS/queue/scheduler"); write cache: $(cat "$DISK_SYS/queue/write_cache" 2>/dev/null); io files at the root: $(echo "$CG"/io.*)"
  echo "== dirty: ratio $(</proc/sys/vm/dirty_ratio) % background $(</proc/sys/vm/dirty_background_ratio) % bytes $(</proc/sys/vm/dirty_bytes); memory $(awk '/MemTotal/ {print $2 " kB"}' /proc/meminfo)"
  bench_job_script >"$WORK/job.sh"
  local helper=$root/bench/h200/lowprio_io.py
  python3 "$helper" io 0.1 "$WORK" >/dev/null
  : >"$out/io_knobs.tsv"
  local round name
  for round in $(seq "${ROUNDS:-1}"); do
    for name in ${KNOBS:-idle plain prio-idle io-max mem-high prio-idle+mem-high io-max+mem-high iocost iocost+mem-high latency-svc latency-svc+mem-high bfq+prio-idle bfq+prio-idle+mem-high}; do
      knobs_scenario "$name" "$helper" "$out" "$round"
    done
  done
  python3 - "$out/io_knobs.tsv" <<'PY' | tee "$out/io_knobs.md"
import collections, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
by = collections.OrderedDict()
for name, rnd, w50, w99, r50, r99, n, rate in rows:
    by.setdefault(name, []).append((float(w99), float(r99), n, rate))
base = by.get("idle")
bw = sorted(x[0] for x in base)[len(base) // 2] if base else 0
br = sorted(x[1] for x in base)[len(base) // 2] if base else 0
print("| knobs on the job (or service) | write+fsync p99 ms (x idle) | O_DIRECT read p99 ms (x idle) | job MiB/s | rounds |")
print("|---|---|---|---|---|")
for name, v in by.items():
    w = sorted(x[0] for x in v)[len(v) // 2]
    r = sorted(x[1] for x in v)[len(v) // 2]
    print("| %s | %.2f (%.1fx) | %.2f (%.1fx) | %s | %d |" % (name, w, w / bw if bw else 0, r, r / br if br else 0,
                                                          "/".join(x[3] for x in v), len(v)))
PY
}

# One scenario: fresh cgroups, the knobs, the job, the probe, a row.
knobs_scenario() {
  local name=$1 helper=$2 out=$3 round=$4 job='' knob
  knobs_reset
  mkdir "$SVC" "$JOB"
  for knob in ${name//+/ }; do
    case $knob in
      idle | plain) ;;
      prio-idle) knobs_write "$JOB/io.prio.class" idle ;;
      io-max) knobs_write "$JOB/io.max" "$DISK wbps=$((200 * 1024 * 1024))" ;;
      io-max50) knobs_write "$JOB/io.max" "$DISK wbps=$((50 * 1024 * 1024))" ;;
      io-max20) knobs_write "$JOB/io.max" "$DISK wbps=$((20 * 1024 * 1024))" ;;
      iocost-qos)
        # latency targets: iocost slows every cgroup down, the job first
        # (weight 1), while the disk's p95 exceeds 5 ms
        knobs_write "$CG/io.cost.qos" "$DISK enable=1 ctrl=user rpct=95.00 rlat=5000 wpct=95.00 wlat=5000 min=1.00 max=100.00"
        knobs_write "$JOB/io.weight" "default 1"
        ;;
      mem-high) knobs_write "$JOB/memory.high" $((512 * 1024 * 1024)) ;;
      iocost)
        knobs_write "$CG/io.cost.qos" "$DISK enable=1"
        knobs_write "$JOB/io.weight" "default 1"
        ;;
      latency-svc) knobs_write "$SVC/io.latency" "$DISK target=2000" ;;
      bfq) knobs_write "$DISK_SYS/queue/scheduler" bfq ;;
    esac
  done
  rm -f "$WORK/job.rate"
  if [[ $name != idle ]]; then
    bench_in "$JOB" bash "$WORK/job.sh" $((WARM_S + IO_S + 2)) "$WORK" 0 "$helper" 1024 &
    job=$!
    sleep "$WARM_S"
  fi
  local io rate=-
  io=$(bench_in "$SVC" python3 "$helper" io "$IO_S" "$WORK")
  [[ -n $job ]] && wait "$job"
  [[ -r $WORK/job.rate ]] && rate=$(<"$WORK/job.rate")
  echo "   $name (round $round): p50/p99 write, p50/p99 read, n: $io | job $rate MiB/s"
  printf '%s\t%s\t%s\t%s\n' "$name" "$round" "${io// /$'\t'}" "$rate" >>"$out/io_knobs.tsv"
}

knobs_write() {
  if ! echo "$2" >"$1" 2>/dev/null; then
    echo "   (could not write '$2' to $1)"
  fi
}

# Puts the disk and the root back as they were and removes the cgroups.
knobs_reset() {
  bench_rm_cgroups "$SVC" "$JOB"
  [[ -w $CG/io.cost.qos ]] && echo "$DISK enable=0" >"$CG/io.cost.qos" 2>/dev/null
  echo "$SCHED_BEFORE" >"$DISK_SYS/queue/scheduler" 2>/dev/null
  rm -f "$WORK/ckpt"
  sync
}

knobs_cleanup() {
  knobs_reset
  rm -rf -- "$WORK"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  main "$@"
fi
