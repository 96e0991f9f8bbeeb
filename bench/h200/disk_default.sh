#!/usr/bin/env bash
# Summary: does lowprio-run's default tier, with no flag, protect a service's disk latency beside a checkpoint writer, and keep the job's own speed when it has the disk to itself? (H200 host: root, pure cgroup v2 with io)
# Usage: bench/h200/disk_default.sh [OUTDIR]   (default $OUT)
#
# Issue 23's goal table. The service (cgroup /gg-disk-svc-PID) does a 4 KiB
# write+fsync and a 4 KiB O_DIRECT read every 20 ms for IO_S seconds (the
# probe of bench/h200/lowprio_io.py). The job is started from the sibling
# cgroup /gg-disk-job-PID, plain or under lowprio-run with no disk flag:
#   ckpt     writes a NEW 1000 MiB checkpoint file per pass with dd
#            conv=fsync, keeping the last two, as a training job does
#            (checkpoint-1000/, checkpoint-2000/ ...)
#   rewrite  rewrites one 1000 MiB file made beforehand outside the job's
#            cgroup (plain and default iocost only): cgroup v2 charges a
#            file's writeback to the cgroup owning the inode, so this job's
#            writes may be charged elsewhere
#   direct8  8 dd writers with O_DIRECT
#   read     reads a 2 GiB dataset with O_DIRECT (the job's data loader)
# Each row beside the service says how many MiB the job's own cgroup was
# charged (io.stat wbytes) against the MiB its dd wrote: whose writeback it
# was, and so whose io.weight or io.max could slow it.
# Rows: idle; plain; the default tier after `lowprio-run --setup-disk`
# (iocost with its default cost model and QoS, lib/disk.sh's
# disk_iocost_settings; io.weight 10); the offline tier (io.weight 1); the default tier
# after `--setup-disk --undo` (the io.max fallback from the disk's measured
# bandwidth). For each job kind its throughput alone (one pass: a 1000 MiB
# checkpoint ALONE_N times, median; the other kinds once) and beside the service, as a fraction
# of the plain job alone. The state folder is a temporary one, so the
# host's own /var/lib/gpuguard is not touched; the disk's io.cost settings
# are put back at the end (also on failure).
# Writes under OUTDIR: disk_default.md (the tables), disk_default.tsv (raw
# rows), disk_default.log (everything, lowprio-run's own lines included).
# About 4-5 minutes. Environment: IO_S (8), WARM_S (2), ALONE_N (2),
# CKPT_MIB (1000: the checkpoint; the 8 writers and the reader move as
# much per pass), DATASET_MIB (2048); BENCH_CGROUP (a v2 tree to use
# instead of /sys/fs/cgroup, for a smoke run elsewhere).

DISK_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lowprio_io.sh
source "$DISK_HERE/lowprio_io.sh"

main() {
  local out=${1:-${OUT:?set OUT or give a folder}}
  ROOT_DIR=$(cd "$DISK_HERE/../.." && pwd)
  mkdir -p "$out"
  exec > >(tee "$out/disk_default.log") 2>&1
  IO_S=${IO_S:-8} WARM_S=${WARM_S:-2} ALONE_N=${ALONE_N:-2}
  CKPT_MIB=${CKPT_MIB:-1000} DATASET_MIB=${DATASET_MIB:-2048}
  if ((EUID != 0)) || [[ $(stat -fc %T "$CG") != cgroup2fs && -z ${BENCH_CGROUP:-} ]] || ! grep -qw io "$CG/cgroup.controllers"; then
    echo "needs root on a pure cgroup v2 host with the io controller (found uid $EUID, $(stat -fc %T "$CG"))"
    return 1
  fi
  WORK=$(mktemp -d /var/tmp/gg-disk-default.XXXXXX)
  SVC=$CG/gg-disk-svc-$$ JOB=$CG/gg-disk-job-$$
  HELPER=$ROOT_DIR/bench/h200/lowprio_io.py LP=$ROOT_DIR/bin/lowprio-run
  export GPUGUARD_STATE_DIR=$WORK/state
  DISK=$(bench_disk_of "$WORK")
  QOS_BEFORE=$(grep "^$DISK " "$CG/io.cost.qos" 2>/dev/null)
  MODEL_BEFORE=$(grep "^$DISK " "$CG/io.cost.model" 2>/dev/null)
  trap disk_cleanup EXIT
  local c
  for c in cpu io memory; do
    grep -qw "$c" "$CG/cgroup.subtree_control" || echo "+$c" >"$CG/cgroup.subtree_control"
  done
  mkdir "$SVC" "$JOB"
  echo "== kernel $(uname -r); $WORK on $(findmnt -no SOURCE,FSTYPE --target "$WORK"); disk $DISK ($(bench_sched_of "$DISK")), write cache: $(cat "$(readlink -f "/sys/dev/block/$DISK")/queue/write_cache" 2>/dev/null)"
  echo "== io.cost.qos before: ${QOS_BEFORE:-none}; io.cost.model: ${MODEL_BEFORE:-none}"
  disk_job_script >"$WORK/job.sh"
  python3 "$HELPER" io 0.1 "$WORK" >/dev/null
  dd if=/dev/urandom of="$WORK/dataset" bs=1M count="$DATASET_MIB" status=none
  sync
  "$LP" --measure-disk "$WORK"
  OUT_TSV=$out/disk_default.tsv
  : >"$OUT_TSV"
  disk_row idle ckpt
  disk_config plain
  "$LP" --setup-disk "$DISK"
  echo "== io.cost.qos now: $(grep "^$DISK " "$CG/io.cost.qos"); io.cost.model: $(grep "^$DISK " "$CG/io.cost.model")"
  "$LP" --explain | grep -A1 '^disk ' | sed 's/^/   /'
  disk_config "default (iocost)" "$LP" --
  disk_config "offline (iocost)" "$LP" --tier offline --
  "$LP" --setup-disk --undo
  disk_config "default (io.max fallback)" "$LP" --
  python3 - "$out/disk_default.tsv" <<'PY' | tee "$out/disk_default.md"
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
# name, kind, p50w, p99w, p50r, p99r, n, beside MiB/s, alone MiB/s, MiB written beside, MiB charged
idle = next(r for r in rows if r[0] == "idle")
w0, r0 = float(idle[3]), float(idle[5])
plain_alone = {r[1]: float(r[8]) for r in rows if r[0] == "plain" and r[8] != "-"}
def pct(v, kind):
    return "%.0f %%" % (100 * float(v) / plain_alone[kind]) if v != "-" and plain_alone.get(kind) else "-"
print("| beside the service | job | write+fsync p99 ms (x idle) | O_DIRECT read p99 ms (x idle) | job MiB/s beside (of plain alone) | job MiB/s alone (of plain alone) | MiB charged to the job / written, beside |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    r += ["-"] * (11 - len(r))
    print("| %s | %s | %s (%.1fx) | %s (%.1fx) | %s (%s) | %s (%s) | %s / %s |" % (
        r[0], r[1], r[3], float(r[3]) / w0, r[5], float(r[5]) / r0, r[7], pct(r[7], r[1]), r[8], pct(r[8], r[1]),
        r[10], r[9]))
print()
get = {(r[0], r[1]): r for r in rows}
floor = min(float(r[3]) for r in rows if r[0] != "idle")
print("Idle floor of this disk: write+fsync p99 %.2f ms, O_DIRECT read p99 %.2f ms; the lowest write+fsync p99 "
      "beside any job here: %.2f ms (%.1fx idle)." % (w0, r0, floor, floor / w0))
print()
print("| goal (default tier, no flags, beside a checkpoint writer) | goal | measured | met |")
print("|---|---|---|---|")
def goal(label, want, value, ok):
    print("| %s | %s | %s | %s |" % (label, want, value, "yes" if ok else "**no**"))
d = get.get(("default (iocost)", "ckpt"))
o = get.get(("offline (iocost)", "ckpt"))
if d:
    goal("service O_DIRECT read p99", "<= 3x idle", "%.1fx" % (float(d[5]) / r0), float(d[5]) <= 3 * r0)
    goal("service 4 KiB write+fsync p99", "<= 5x idle", "%.1fx" % (float(d[3]) / w0), float(d[3]) <= 5 * w0)
    base = plain_alone.get("ckpt") or 0
    a = float(d[8]) / base if d[8] != "-" and base else 0
    b = float(d[7]) / base if d[7] != "-" and base else 0
    goal("job's write throughput alone", ">= 90 %", "%.0f %%" % (100 * a), a >= 0.9)
    goal("job's write throughput beside the service", ">= 10 %", "%.0f %%" % (100 * b), b >= 0.1)
dr = get.get(("default (iocost)", "read"))
if dr:
    goal("service O_DIRECT read p99 beside the job's dataset reads", "<= 3x idle", "%.1fx" % (float(dr[5]) / r0),
         float(dr[5]) <= 3 * r0)
if o:
    goal("offline: service read p99", "<= 2x idle", "%.1fx" % (float(o[5]) / r0), float(o[5]) <= 2 * r0)
    goal("offline: service write+fsync p99", "<= 3x idle", "%.1fx" % (float(o[3]) / w0), float(o[3]) <= 3 * w0)
PY
}

# One configuration (plain, or a lowprio-run prefix): each job kind alone,
# then beside the service. Arguments: $1 label, $2... the prefix.
disk_config() {
  local label=$1 kind
  shift
  echo "== $label"
  for kind in ckpt rewrite direct8 read; do
    # the offline tier's reads and 8-writer runs add little: its goal is
    # the checkpoint writer's; rewriting one file is the attribution
    # question, asked of the plain job and the default tier's iocost
    [[ $label == offline* && $kind != ckpt ]] && continue
    [[ $kind == rewrite && $label != plain && $label != "default (iocost)" ]] && continue
    disk_row "$label" "$kind" "$@"
  done
}

# One row: the job kind alone ALONE_N times (median MiB/s; checkpoint
# kinds only), then beside the service's probe. Appends to the TSV.
disk_row() {
  local label=$1 kind=$2 i rate alone=- job='' io beside=- wrote=- charged=-
  shift 2
  # the file the rewrite kind overwrites, made from this script's cgroup
  if [[ $kind == rewrite && ! -f $WORK/ckpt-shared ]]; then
    dd if=/dev/zero of="$WORK/ckpt-shared" bs=1M count="$CKPT_MIB" conv=fsync status=none
  fi
  local -a rates=()
  if [[ $label != idle ]]; then
    # the goals are the checkpoint writer's: the other kinds run alone once
    local n=$ALONE_N
    [[ $kind == ckpt ]] || n=1
    for ((i = 0; i < n; i++)); do
      rm -f "$WORK/job.rate"
      bench_in "$JOB" "$@" bash "$WORK/job.sh" once "$WORK" "$kind" "$CKPT_MIB" "$DISK" "$CG" 2>>"$WORK/lp.err"
      [[ -r $WORK/job.rate ]] && rates+=("$(<"$WORK/job.rate")")
    done
    ((${#rates[@]})) && alone=$(printf '%s\n' "${rates[@]}" | sort -n | sed -n "$(((${#rates[@]} + 1) / 2))p")
    rm -f "$WORK/job.rate" "$WORK/job.wb"
    bench_in "$JOB" "$@" bash "$WORK/job.sh" $((WARM_S + IO_S + 1)) "$WORK" "$kind" "$CKPT_MIB" "$DISK" "$CG" 2>>"$WORK/lp.err" &
    job=$!
    sleep "$WARM_S"
  fi
  io=$(bench_in "$SVC" python3 "$HELPER" io "$IO_S" "$WORK")
  if [[ -n $job ]]; then
    wait "$job"
    [[ -r $WORK/job.rate ]] && beside=$(<"$WORK/job.rate")
    [[ -r $WORK/job.wb ]] && read -r wrote charged <"$WORK/job.wb"
  fi
  # lowprio-run's start line on the disk, once per row
  grep -m1 ' disk: ' "$WORK/lp.err" 2>/dev/null | sed 's/^/   /'
  grep -m1 'job ended' "$WORK/lp.err" 2>/dev/null | sed 's/^/   /'
  : >"$WORK/lp.err"
  echo "   $label / $kind: p50/p99 write+fsync, p50/p99 read, n: $io | job MiB/s alone $alone, beside $beside | beside: the job's cgroup was charged $charged MiB (io.stat wbytes) of the $wrote MiB it wrote"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$kind" "${io// /$'\t'}" "$beside" "$alone" "$wrote" "$charged" >>"$OUT_TSV"
}

# The job: "once" writes one 1000 MiB checkpoint (or runs one pass of the
# kind) and reports its MiB/s; SECONDS repeats it until they pass.
disk_job_script() {
  cat <<'JOB'
secs=$1 dir=$2 kind=$3 mib=$4 disk=$5 cgroot=$6 moved=0 lim=0 i=0 n=0
# the job's own cgroup (lowprio-run's leaf, or the bench's job cgroup) and
# the bytes its io.stat says it wrote on the disk
cg=$cgroot$(sed -n 's/^0:://p' /proc/self/cgroup)
wbytes() {
  [[ -r $cg/io.stat ]] || return 0
  awk -v d="$disk" '$1 == d { for (i = 2; i <= NF; i++) if ($i ~ /^wbytes=/) { sub(/^wbytes=/, "", $i); w = $i } }
    END { print w + 0 }' "$cg/io.stat"
}
wb0=$(wbytes)
start=$(date +%s.%N)
end=$((SECONDS + ${secs/once/0}))
# beside the service a pass ends at most 8 s after the probe (what it
# wrote until then counts); alone it runs to the end
dd_() {
  if [[ $secs == once ]]; then
    dd "$@" status=none
  else
    lim=$((end + 8 - SECONDS))
    timeout "$((lim > 1 ? lim : 1))" dd "$@" status=none
  fi
}
mib_of() { echo $(($(stat -c %s "$1" 2>/dev/null || echo 0) / 1048576)); }
pass() {
  case $kind in
    ckpt)
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
    read) dd_ if="$dir/dataset" of=/dev/null bs=1M count="$mib" iflag=direct && moved=$((moved + mib)) ;;
  esac
}
pass
while ((SECONDS < end)); do
  pass
done
awk -v m="$moved" -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.0f\n", m / (e - s) }' >"$dir/job.rate"
# a pass cut short left dirty pages: written back now, in the job's name
# where the inode is the job's
sync
wb1=$(wbytes)
if [[ -n $wb0 && -n $wb1 ]]; then
  echo "$moved $(((wb1 - wb0) / 1048576))" >"$dir/job.wb"
else
  echo "$moved -" >"$dir/job.wb"
fi
rm -f "$dir"/ckpt-$$-*
JOB
}

# Puts the disk's iocost back (lowprio-run's own undo, then the lines found
# at the start), removes the cgroups and the work folder.
disk_cleanup() {
  "$LP" --setup-disk --undo >/dev/null 2>&1
  if [[ -n $QOS_BEFORE ]] && [[ " $QOS_BEFORE " == *" ctrl=user "* ]]; then
    echo "$QOS_BEFORE" >"$CG/io.cost.qos" 2>/dev/null
  fi
  if [[ -n ${MODEL_BEFORE:-} ]] && [[ " $MODEL_BEFORE " == *" ctrl=user "* ]]; then
    echo "$MODEL_BEFORE" >"$CG/io.cost.model" 2>/dev/null
  fi
  echo "== io.cost.qos at the end: $(grep "^$DISK " "$CG/io.cost.qos" 2>/dev/null); io.cost.model: $(grep "^$DISK " "$CG/io.cost.model" 2>/dev/null)"
  bench_rm_cgroups "$SVC" "$JOB"
  rm -rf -- "$WORK"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  # no -e: a bench keeps going past one failed step and always cleans up
  set -uo pipefail
  main "$@"
fi
