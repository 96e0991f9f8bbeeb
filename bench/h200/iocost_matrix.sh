#!/usr/bin/env bash
# Summary: which iocost setting protects a service's disk latency beside a checkpoint writer and still leaves a job alone its disk speed? (H200 host: root, pure cgroup v2 with io; DRY_RUN=1 anywhere)
# Usage: bench/h200/iocost_matrix.sh [OUTDIR]   (default $OUT)
#
# Issue 23, after bench/RESULTS.md section 8 (the default iocost did not
# protect at all). Knobs are written straight to the cgroup files (no
# lowprio-run), one row per setting, fresh cgroups per row: the service in
# /gg-mx-svc-PID at the default io.weight, the job in its sibling
# /gg-mx-job-PID. Per row:
#   ckpt alone     the job writes a NEW 1000 MiB checkpoint file per pass
#                  (dd conv=fsync, like checkpoint-1000/, checkpoint-2000/)
#                  for ALONE_S seconds; MiB/s
#   ckpt beside    the same beside the service's probe (a 4 KiB write+fsync
#                  and a 4 KiB O_DIRECT read every 20 ms, IO_S seconds,
#                  bench/h200/lowprio_io.py), p99 of each; the job's io.stat
#                  wbytes against what it wrote (whose writeback it is)
#   8 writers      8 dd oflag=direct writers, alone and beside the probe
# Rows (hypotheses of the issue's notes):
#   idle, plain (iocost off) - the baselines; "of plain alone" is the job's
#     speed as a fraction of the plain job alone
#   A  today's --setup-disk: kernel model, QoS 5/5 ms p95, vrate 1-10000 %
#   B  H1: kernel model, vrate ceiling 100 %
#   C  H1: a linear model from the disk's measured speed (lowprio-run's
#      O_DIRECT bandwidths, the kernel's IOPS figures), ceiling 100 %
#   D  H1: measured model, ceiling 150 %
#   E  H2: as C, but the job rewrites one checkpoint file made outside it
#   F  H3: measured model, ceiling 100, QoS read 2 / write 3 ms at p90, min 10
#   G  H3: measured model, ceiling 100, QoS read 1 / write 2 ms at p95, min 25
#   H  H4: as C plus memory.high 512M on the job
#   I  as C with the job at io.weight 1 (the offline tier)
#   J  F plus memory.high 512M
#   K  as C, with 4 KiB IOPS measured too (16 threads of O_DIRECT I/O)
# The disk's io.cost.qos and io.cost.model are put back at the end (trap,
# also on failure). Rows left when TIME_BUDGET_S has passed are skipped.
# Writes under OUTDIR: iocost_matrix.md (the table), iocost_matrix.tsv (raw
# rows), iocost_matrix.log (everything). A real run takes about 6.5-7
# minutes: the setup ~15 s, idle 8 s, 11 rows of two job kinds at ~33 s
# (alone 3 s, beside 10 s, flushes), row E ~17 s; no row starts after
# TIME_BUDGET_S, so it ends by ~7.5 minutes (the last rows are skipped
# first: they are in order of importance). Environment: IO_S (8), WARM_S (2),
# ALONE_S (3), CKPT_MIB (1000), WEIGHT (10), IOPS_S (4), TIME_BUDGET_S
# (390: no row starts later), ROWS (row ids to run, e.g. "C E"), DRY_RUN=1 (no root: a fake
# cgroup tree, small sizes, the plumbing and the table only).

MX_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lowprio_io.sh
source "$MX_HERE/lowprio_io.sh"

# The matrix: id|hypothesis|label|cost model (auto, user or -: iocost off)|
# QoS parameters|job io.weight|job memory.high (- for none)|job kinds
mx_rows() {
  local w=${WEIGHT:-10} q5='rpct=95.00 rlat=5000 wpct=95.00 wlat=5000'
  cat <<ROWS
plain|-|iocost off|-|-|-|-|new direct8
A|H1|kernel model, QoS 5/5 ms p95, vrate 1-10000 % (today), w$w|auto|$q5 min=1.00 max=10000.00|$w|-|new direct8
C|H1|measured model, QoS 5/5 ms p95, vrate 1-100 %, w$w|user|$q5 min=1.00 max=100.00|$w|-|new direct8
E|H2|measured model, QoS 5/5 ms p95, vrate 1-100 %, w$w|user|$q5 min=1.00 max=100.00|$w|-|rewrite
B|H1|kernel model, QoS 5/5 ms p95, vrate 1-100 %, w$w|auto|$q5 min=1.00 max=100.00|$w|-|new direct8
F|H3|measured model, QoS 2/3 ms p90, vrate 10-100 %, w$w|user|rpct=90.00 rlat=2000 wpct=90.00 wlat=3000 min=10.00 max=100.00|$w|-|new direct8
H|H4|measured model, QoS 5/5 ms p95, vrate 1-100 %, w$w, memory.high 512M|user|$q5 min=1.00 max=100.00|$w|536870912|new direct8
I|-|measured model, QoS 5/5 ms p95, vrate 1-100 %, w1|user|$q5 min=1.00 max=100.00|1|-|new direct8
G|H3|measured model, QoS 1/2 ms p95, vrate 25-100 %, w$w|user|rpct=95.00 rlat=1000 wpct=95.00 wlat=2000 min=25.00 max=100.00|$w|-|new direct8
D|H1|measured model, QoS 5/5 ms p95, vrate 1-150 %, w$w|user|$q5 min=1.00 max=150.00|$w|-|new direct8
K|H1|measured model and 4 KiB IOPS, QoS 5/5 ms p95, vrate 1-100 %, w$w|iops|$q5 min=1.00 max=100.00|$w|-|new direct8
J|H3+H4|measured model, QoS 2/3 ms p90, vrate 10-100 %, w$w, memory.high 512M|user|rpct=90.00 rlat=2000 wpct=90.00 wlat=3000 min=10.00 max=100.00|$w|536870912|new direct8
ROWS
}

main() {
  local out=${1:-${OUT:?set OUT or give a folder}}
  ROOT_DIR=$(cd "$MX_HERE/../.." && pwd)
  mkdir -p "$out"
  exec > >(tee "$out/iocost_matrix.log") 2>&1
  MX_START=$SECONDS
  mx_params
  mx_check || return 1
  WORK=$(mktemp -d /var/tmp/gg-iocost-matrix.XXXXXX)
  SVC=$CG/gg-mx-svc-$$ JOB=$CG/gg-mx-job-$$
  HELPER=$ROOT_DIR/bench/h200/lowprio_io.py MX=$ROOT_DIR/bench/h200/iocost_matrix.py
  export GPUGUARD_STATE_DIR=$WORK/state
  DISK=$(bench_disk_of "$WORK")
  ((DRY)) && mx_fake_root
  cg_line QOS_BEFORE "$CG/io.cost.qos"
  cg_line MODEL_BEFORE "$CG/io.cost.model"
  trap mx_cleanup EXIT
  local c
  for c in cpu io memory; do
    grep -qw "$c" "$CG/cgroup.subtree_control" || echo "+$c" >>"$CG/cgroup.subtree_control"
  done
  echo "== kernel $(uname -r); $WORK on $(findmnt -no SOURCE,FSTYPE,OPTIONS --target "$WORK"); disk $DISK ($(bench_sched_of "$DISK")), write cache: $(cat "$(readlink -f "/sys/dev/block/$DISK")/queue/write_cache" 2>/dev/null)"
  echo "== before: io.cost.qos: ${QOS_BEFORE:-none}; io.cost.model: ${MODEL_BEFORE:-none}"
  echo "== dirty: ratio $(</proc/sys/vm/dirty_ratio) % background $(</proc/sys/vm/dirty_background_ratio) %; memory $(awk '/MemTotal/ {print $2 " kB"}' /proc/meminfo)"
  mx_job_script >"$WORK/job.sh"
  python3 "$HELPER" io 0.1 "$WORK" >/dev/null
  mx_measure
  OUT_TSV=$out/iocost_matrix.tsv
  : >"$OUT_TSV"
  mx_probe_row
  local id hyp label model qos weight memhigh kinds
  while IFS='|' read -r id hyp label model qos weight memhigh kinds; do
    [[ -n ${ROWS:-} && " $ROWS " != *" $id "* && $id != plain ]] && continue
    if ((SECONDS - MX_START > TIME_BUDGET_S)); then
      echo "== $id skipped: the time budget ($TIME_BUDGET_S s) has passed"
      continue
    fi
    mx_row "$id" "$hyp" "$label" "$model" "$qos" "$weight" "$memhigh" "$kinds"
  done < <(mx_rows)
  python3 "$MX" table "$OUT_TSV" | tee "$out/iocost_matrix.md"
  echo "== measured model: $USER_MODEL; with measured IOPS: $IOPS_MODEL"
  echo "== total $((SECONDS - MX_START)) s"
}

mx_params() {
  DRY=0
  [[ ${DRY_RUN:-0} == 1 ]] && DRY=1
  if ((DRY)); then
    # small and paced, so that a dry run on a shared machine stays light
    IO_S=${IO_S:-1} WARM_S=${WARM_S:-1} ALONE_S=${ALONE_S:-1} CKPT_MIB=${CKPT_MIB:-8} IOPS_S=${IOPS_S:-0.4}
    export MX_PAUSE=0.2
  else
    IO_S=${IO_S:-8} WARM_S=${WARM_S:-2} ALONE_S=${ALONE_S:-3} CKPT_MIB=${CKPT_MIB:-1000} IOPS_S=${IOPS_S:-4}
  fi
  TIME_BUDGET_S=${TIME_BUDGET_S:-390}
}

# Refuses to run anywhere but a root on cgroup v2 with io and iocost (the
# dry run makes its own fake tree instead).
mx_check() {
  ((DRY)) && return 0
  if ((EUID != 0)) || [[ $(stat -fc %T "$CG") != cgroup2fs && -z ${BENCH_CGROUP:-} ]] ||
    ! grep -qw io "$CG/cgroup.controllers" || [[ ! -f $CG/io.cost.qos ]]; then
    echo "needs root on a pure cgroup v2 host with the io controller and iocost (found uid $EUID, $(stat -fc %T "$CG" 2>/dev/null)); DRY_RUN=1 runs the plumbing anywhere"
    return 1
  fi
}

# The dry run's cgroup root: plain files where the kernel's would be.
mx_fake_root() {
  CG=$WORK/fakecg
  mkdir -p "$CG"
  echo "cpu io memory" >"$CG/cgroup.controllers"
  : >"$CG/cgroup.subtree_control"
  echo "$DISK enable=0 ctrl=auto rpct=0.00 rlat=250000 wpct=0.00 wlat=250000 min=1.00 max=10000.00" >"$CG/io.cost.qos"
  echo "$DISK ctrl=auto model=linear rbps=488636629 rseqiops=8932 rrandiops=8518 wbps=427891549 wseqiops=28755 wrandiops=21940" >"$CG/io.cost.model"
  SVC=$CG/gg-mx-svc-$$ JOB=$CG/gg-mx-job-$$
}

# Puts the disk's line of a root file ($2) into the variable named $1.
cg_line() {
  local -n line_ref=$1
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  line_ref=$(grep "^$DISK " "$2" 2>/dev/null)
}

# The disk's speed: lowprio-run's own measurement (O_DIRECT write and read
# bandwidth, cached in the state folder) and 4 KiB IOPS (16 threads).
# USER_MODEL, the io.cost.model line of the "measured" rows, is what
# `lowprio-run --setup-disk` writes: the measured bandwidths with the
# kernel's own IOPS figures; IOPS_MODEL (row K) takes the measured IOPS too.
mx_measure() {
  local w=0 r=0 rr=0 rs=0 wr=0 ws=0 auto kv
  "$ROOT_DIR/bin/lowprio-run" --measure-disk "$WORK"
  if [[ -r $GPUGUARD_STATE_DIR/disk-bandwidth ]]; then
    # "MAJ:MIN NAME SECTORS WRITE_B/S READ_B/S TIME" (lib/disk.sh's cache)
    read -r _ _ _ w r _ <"$GPUGUARD_STATE_DIR/disk-bandwidth"
  fi
  read -r rr rs wr ws < <(python3 "$MX" iops "$IOPS_S" "$WORK" 16)
  # the kernel's automatic model for this disk (its IOPS figures)
  mx_write "$CG/io.cost.model" "$DISK ctrl=auto"
  cg_line auto "$CG/io.cost.model"
  local -A k=([rbps]=488636629 [rseqiops]=8932 [rrandiops]=8518 [wbps]=427891549 [wseqiops]=28755 [wrandiops]=21940)
  for kv in ${auto#* }; do
    [[ $kv =~ ^[a-z]+=[0-9]+$ ]] && k[${kv%%=*}]=${kv#*=}
  done
  ((w > 0)) || w=${k[wbps]}
  ((r > 0)) || r=${k[rbps]}
  USER_MODEL="ctrl=user model=linear rbps=$r rseqiops=${k[rseqiops]} rrandiops=${k[rrandiops]} wbps=$w wseqiops=${k[wseqiops]} wrandiops=${k[wrandiops]}"
  ((rr > 0)) || rr=${k[rrandiops]}
  ((rs > 0)) || rs=${k[rseqiops]}
  ((wr > 0)) || wr=${k[wrandiops]}
  ((ws > 0)) || ws=${k[wseqiops]}
  IOPS_MODEL="ctrl=user model=linear rbps=$r rseqiops=$rs rrandiops=$rr wbps=$w wseqiops=$ws wrandiops=$wr"
  echo "== measured: writes $((w / 1048576)) MiB/s, reads $((r / 1048576)) MiB/s; 4 KiB IOPS read rand/seq $rr/$rs, write rand/seq $wr/$ws"
  echo "== the kernel's model: ${auto:-none}"
}

# The baseline row: the probe alone.
mx_probe_row() {
  local io
  rm -f "$WORK/probe.w"
  mkdir "$SVC"
  io=$(bench_in "$SVC" python3 "$HELPER" io "$IO_S" "$WORK")
  echo "   idle: p50/p99 write+fsync, p50/p99 read, n: $io"
  printf 'idle\t-\tno job\tidle\t%s\t-\t-\t-\t-\t-\n' "${io// /$'\t'}" >>"$OUT_TSV"
  mx_rm_cgroups
}

# One setting: fresh cgroups, the root's iocost files, the job's knobs,
# then each job kind alone and beside the probe.
mx_row() {
  local id=$1 hyp=$2 label=$3 model=$4 qos=$5 weight=$6 memhigh=$7 kinds=$8 kind
  echo "== $id ($hyp): $label"
  mx_rm_cgroups
  mkdir "$SVC" "$JOB"
  case $model in
    -) mx_write "$CG/io.cost.qos" "$DISK enable=0" ;;
    auto) mx_write "$CG/io.cost.model" "$DISK ctrl=auto" ;;
    user) mx_write "$CG/io.cost.model" "$DISK $USER_MODEL" ;;
    iops) mx_write "$CG/io.cost.model" "$DISK $IOPS_MODEL" ;;
  esac
  [[ $model != - ]] && mx_write "$CG/io.cost.qos" "$DISK enable=1 ctrl=user $qos"
  [[ $weight != - ]] && mx_write "$JOB/io.weight" "default $weight"
  [[ $memhigh != - ]] && mx_write "$JOB/memory.high" "$memhigh"
  echo "   io.cost.qos: $(grep "^$DISK " "$CG/io.cost.qos")"
  echo "   io.cost.model: $(grep "^$DISK " "$CG/io.cost.model")"
  for kind in $kinds; do
    mx_kind "$id" "$hyp" "$label" "$kind"
  done
}

# One job kind under the row's setting: alone, then beside the probe.
# Appends a TSV line.
mx_kind() {
  local id=$1 hyp=$2 label=$3 kind=$4 alone beside io moved w0 w1 wait0 wait1 job
  [[ $kind == rewrite ]] && mx_shared_ckpt
  alone=$(mx_job_once "$kind" "$ALONE_S")
  alone=${alone#* }
  mx_settle
  read -r w0 wait0 < <(mx_job_stat)
  rm -f "$WORK/job.out" "$WORK/probe.w"
  bench_in "$JOB" bash "$WORK/job.sh" $((WARM_S + IO_S)) "$WORK" "$kind" "$CKPT_MIB" "$WORK/job.out" &
  job=$!
  sleep "$WARM_S"
  io=$(bench_in "$SVC" python3 "$HELPER" io "$IO_S" "$WORK")
  wait "$job"
  read -r moved beside 2>/dev/null <"$WORK/job.out" || moved=- beside=-
  mx_settle
  read -r w1 wait1 < <(mx_job_stat)
  local charged=- waited=-
  [[ $w0 != - && $w1 != - ]] && charged=$(((w1 - w0) / 1048576))
  [[ $wait0 != - && $wait1 != - ]] && waited=$(((wait1 - wait0) / 1000))
  # the whole line: cost.vrate, cost.usage, cost.indebt show what iocost did
  echo "   job io.stat: $(grep "^$DISK " "$JOB/io.stat" 2>/dev/null)"
  echo "   $id / $kind: p50/p99 write+fsync, p50/p99 read, n: $io | job MiB/s alone $alone, beside $beside | beside: wrote $moved MiB, io.stat charged $charged MiB, iocost wait $waited ms"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$id" "$hyp" "$label" "$kind" "${io// /$'\t'}" \
    "$beside" "$alone" "$moved" "$charged" "$waited" >>"$OUT_TSV"
}

# The job alone for $2 seconds; prints "MiB MiB/s".
mx_job_once() {
  rm -f "$WORK/job.out"
  bench_in "$JOB" bash "$WORK/job.sh" "$2" "$WORK" "$1" "$CKPT_MIB" "$WORK/job.out"
  cat "$WORK/job.out" 2>/dev/null || echo '- -'
}

# The checkpoint the rewrite kind overwrites, made from this script's own
# cgroup (the way a file made by an earlier job, or by the launcher, is).
mx_shared_ckpt() {
  [[ -f $WORK/ckpt-shared ]] && return 0
  dd if=/dev/zero of="$WORK/ckpt-shared" bs=1M count="$CKPT_MIB" conv=fsync status=none
}

# "WBYTES WAIT_USEC" of the job's cgroup on the disk (io.stat: no line for
# the disk is nothing charged yet), or "- -" with no io.stat at all.
mx_job_stat() {
  local dev rest kv wb=- wait=-
  if [[ -r $JOB/io.stat ]]; then
    wb=0 wait=0
    while read -r dev rest; do
      [[ $dev == "$DISK" ]] || continue
      for kv in $rest; do
        case $kv in
          wbytes=*) wb=${kv#*=} ;;
          cost.wait=* | cost.indelay=*) wait=$((wait + ${kv#*=})) ;;
        esac
      done
    done <"$JOB/io.stat"
  fi
  echo "$wb $wait"
}

# Lets the job's dirty pages reach the disk before the next phase (bounded:
# a throttled flush must not eat the run).
mx_settle() {
  timeout 30 sync
}

mx_write() {
  if ! echo "$2" >"$1" 2>/dev/null; then
    echo "   (could not write '$2' to $1)"
  fi
}

mx_rm_cgroups() {
  if ((DRY)); then
    # plain folders: nothing runs "in" them
    rm -rf -- "$SVC" "$JOB"
  else
    bench_rm_cgroups "$SVC" "$JOB"
  fi
}

# The job: runs passes of its kind for SECS seconds (at least one; a pass
# still running 2 s after that is cut, what it wrote counts), then writes
# "MiB MiB/s" to OUTFILE.
#   new      a new MIB MiB file per pass (dd conv=fsync); the one before
#            the previous is removed, as a job keeping two checkpoints does
#   rewrite  dd conv=fsync over the same file each pass
#   direct8  8 dd oflag=direct writers, MIB/8 MiB each
mx_job_script() {
  cat <<'JOB'
secs=$1 dir=$2 kind=$3 mib=$4 outfile=$5 moved=0 n=0 i=0
start=$(date +%s.%N)
end=$((SECONDS + secs))
dd_() {
  local lim=$((end + 2 - SECONDS))
  timeout "$((lim > 1 ? lim : 1))" dd "$@" status=none
}
mib_of() { echo $(($(stat -c %s "$1" 2>/dev/null || echo 0) / 1048576)); }
pass() {
  case $kind in
    new)
      n=$((n + 1))
      dd_ if=/dev/zero of="$dir/ckpt-$$-$n" bs=1M count="$mib" conv=fsync
      moved=$((moved + $(mib_of "$dir/ckpt-$$-$n")))
      rm -f "$dir/ckpt-$$-$((n - 2))"
      ;;
    rewrite)
      dd_ if=/dev/zero of="$dir/ckpt-shared" bs=1M count="$mib" conv=fsync
      moved=$((moved + $(mib_of "$dir/ckpt-shared")))
      ;;
    direct8)
      for i in 1 2 3 4 5 6 7 8; do
        dd_ if=/dev/zero of="$dir/direct$i" bs=1M count=$((mib / 8)) oflag=direct &
      done
      wait
      for i in 1 2 3 4 5 6 7 8; do
        moved=$((moved + $(mib_of "$dir/direct$i")))
      done
      ;;
  esac
}
pass
while ((SECONDS < end)); do
  sleep "${MX_PAUSE:-0}"
  pass
done
rm -f "$dir"/ckpt-$$-*
awk -v m="$moved" -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%d %.0f\n", m, m / (e - s) }' >"$outfile"
JOB
}

# Puts the disk's io.cost.model and io.cost.qos back as they were (a line
# in automatic mode as automatic, one set by hand value for value), removes
# the cgroups and the work folder.
mx_cleanup() {
  if [[ -z ${DISK:-} ]]; then
    return 0
  fi
  if [[ -z ${MODEL_BEFORE:-} || " $MODEL_BEFORE " == *" ctrl=auto "* ]]; then
    [[ -f $CG/io.cost.model ]] && mx_write "$CG/io.cost.model" "$DISK ctrl=auto"
  else
    mx_write "$CG/io.cost.model" "$MODEL_BEFORE"
  fi
  if [[ -n ${QOS_BEFORE:-} && " $QOS_BEFORE " == *" ctrl=user "* ]]; then
    mx_write "$CG/io.cost.qos" "$QOS_BEFORE"
  else
    local enable=0
    [[ " ${QOS_BEFORE:-} " == *" enable=1 "* ]] && enable=1
    mx_write "$CG/io.cost.qos" "$DISK enable=$enable ctrl=auto"
  fi
  echo "== at the end: io.cost.qos: $(grep "^$DISK " "$CG/io.cost.qos" 2>/dev/null); io.cost.model: $(grep "^$DISK " "$CG/io.cost.model" 2>/dev/null)"
  mx_rm_cgroups
  rm -rf -- "$WORK"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  # no -e: a bench keeps going past one failed step and always cleans up
  set -uo pipefail
  main "$@"
fi
