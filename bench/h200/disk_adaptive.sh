#!/usr/bin/env bash
# Summary: does lowprio-run's default tier (the adaptive io.max: the job is capped only while another cgroup uses the disk) protect a service beside a checkpoint writer and keep the job's speed when it is alone? (H200 host: root, pure cgroup v2 with io; DRY_RUN=1 anywhere)
# Usage: bench/h200/disk_adaptive.sh [OUTDIR]   (default $OUT)
#
# Issue 23's goal table for lib/iogov.sh. The service (cgroup
# /gg-ad-svc-PID) does a 4 KiB write+fsync and a 4 KiB O_DIRECT read every
# 20 ms for IO_S seconds (bench/h200/lowprio_io.py's probe); the job runs
# from the sibling cgroup /gg-ad-job-PID, plain or under lowprio-run with
# no disk flag (--report: how long the governor capped it). Job kinds (the
# job script of bench/h200/disk_default.sh):
#   ckpt     a NEW 1000 MiB checkpoint file per pass, dd conv=fsync
#   direct8  8 dd writers with O_DIRECT
#   read     reads a 2 GiB dataset with O_DIRECT (the data loader)
# Two orders beside the service:
#   service first  the service runs; LEAD_S (1) s later the job starts and,
#                  as a training job loads its model first, waits LOAD_S
#                  (1) s before its first checkpoint: the governor has seen
#                  the service by then (the usual case: checkpoints come
#                  minutes into a run)
#   onset          the job writes first and the service starts WARM_S (2) s
#                  into its checkpoint (disk_default.sh's order): the
#                  service's first probes wait until the governor's next
#                  look (0.5 s) and the disk drains what was queued
# Each job kind also runs alone (ALONE_N passes, median) as a fraction of
# the plain job alone: the adaptive cap must stay off then.
# Rows: idle; plain; default (batch tier: adaptive io.max, 12 % of the
# measured write bandwidth, 10 % of the read one, while others use the
# disk); default at each share of ALT_PCTS (a tiers file with another
# wbps: the cap's trade-off); offline (2 % / 10 %); with WITH_IOCOST=1,
# default after `lowprio-run --setup-disk` (iocost's io.weight 10 beside
# the adaptive cap; put back at the end, also on failure).
# Writes under OUTDIR: disk_adaptive.md (the tables), disk_adaptive.tsv
# (raw rows), disk_adaptive.log (everything, lowprio-run's lines too).
# About 4-5 minutes; no row starts after TIME_BUDGET_S (270) s.
# Environment: IO_S (10), WARM_S (2), LEAD_S (1), LOAD_S (1), ALONE_N (3),
# CKPT_MIB (1000), DATASET_MIB (2048), ALT_PCTS (8 16), WITH_IOCOST (0),
# TIME_BUDGET_S, DRY_RUN=1 (no root: a
# fake cgroup tree, small sizes, the plumbing and the tables only),
# FLUSH_PROBE (1; 0 in a dry run): beside the service's probe, a bare
# cache flush of the disk every 100 ms (lowprio_io.py flush: an fsync of
# a file unchanged since its last one): is the
# write+fsync floor beside a capped job the disk's own flush?
# MAX_SECTORS_KBS (none): the default row again with the disk's
# max_sectors_kb at each of these (the largest request the block layer
# sends: a commit may wait for one of the job's capped requests), put
# back at the end.
# BDI_MAX_MIBS (none): the default row again with the disk's writeback
# cache limited (/sys/class/bdi/DISK: max_bytes at each of these MiB,
# strict_limit 1: each cgroup's dirty pages held to its share of the
# limit, the share following its write rate, so the capped job is
# throttled as it dirties pages instead of piling them up for writeback
# bursts that a service's journal commit waits for), put back at the end.
# KINDS (ckpt direct8 read): the job kinds of the plain and default rows.
# IOMAX_ROW (1): the default row again with LOWPRIO_GOV_PACE=off (the
# write cap in io.max, as before the governor paced writes at the source).

AD_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=disk_default.sh
source "$AD_HERE/disk_default.sh"

main() {
  local out=${1:-${OUT:?set OUT or give a folder}}
  ROOT_DIR=$(cd "$AD_HERE/../.." && pwd)
  mkdir -p "$out"
  exec > >(tee "$out/disk_adaptive.log") 2>&1
  AD_START=$SECONDS
  ad_params
  ad_check || return 1
  WORK=$(mktemp -d /var/tmp/gg-disk-adaptive.XXXXXX)
  SVC=$CG/gg-ad-svc-$$ JOB=$CG/gg-ad-job-$$
  HELPER=$ROOT_DIR/bench/h200/lowprio_io.py LP=$ROOT_DIR/bin/lowprio-run
  export GPUGUARD_STATE_DIR=$WORK/state
  DISK=$(bench_disk_of "$WORK")
  ((DRY)) && ad_fake_root
  QOS_BEFORE=$(grep "^$DISK " "$CG/io.cost.qos" 2>/dev/null)
  MODEL_BEFORE=$(grep "^$DISK " "$CG/io.cost.model" 2>/dev/null)
  DISK_Q=$(readlink -f "/sys/dev/block/$DISK")/queue
  SECTORS_BEFORE=$(cat "$DISK_Q/max_sectors_kb" 2>/dev/null)
  BDI=/sys/class/bdi/$DISK
  BDI_BEFORE="$(cat "$BDI/max_ratio_fine" 2>/dev/null) $(cat "$BDI/strict_limit" 2>/dev/null)"
  trap ad_cleanup EXIT
  local c
  for c in cpu io memory; do
    grep -qw "$c" "$CG/cgroup.subtree_control" || echo "+$c" >>"$CG/cgroup.subtree_control"
  done
  mkdir "$SVC" "$JOB"
  echo "== kernel $(uname -r); $WORK on $(findmnt -no SOURCE,FSTYPE --target "$WORK"); disk $DISK ($(bench_sched_of "$DISK")), write cache: $(cat "$(readlink -f "/sys/dev/block/$DISK")/queue/write_cache" 2>/dev/null)"
  echo "== io.cost.qos before: ${QOS_BEFORE:-none}; io.cost.model: ${MODEL_BEFORE:-none}; mechanism: ${LOWPRIO_MECHANISM}"
  disk_job_script >"$WORK/job.sh"
  local pct
  for pct in $ALT_PCTS; do
    sed "s/^\(batch .*\)wbps=[0-9]*%/\1wbps=$pct%/" "$ROOT_DIR/etc/lowprio-tiers.conf" >"$WORK/tiers-${pct}pct.conf"
  done
  python3 "$HELPER" io 0.1 "$WORK" >/dev/null
  dd if=/dev/urandom of="$WORK/dataset" bs=1M count="$DATASET_MIB" status=none
  sync
  echo "== queue: max_sectors_kb $(cat "$DISK_Q/max_sectors_kb" 2>/dev/null) (hw $(cat "$DISK_Q/max_hw_sectors_kb" 2>/dev/null)), nr_requests $(cat "$DISK_Q/nr_requests" 2>/dev/null), wbt_lat_usec $(cat "$DISK_Q/wbt_lat_usec" 2>/dev/null), rotational $(cat "$DISK_Q/rotational" 2>/dev/null)"
  "$LP" --measure-disk "$WORK"
  "$LP" --explain | grep -A1 '^disk ' | sed 's/^/   /'
  OUT_TSV=$out/disk_adaptive.tsv
  : >"$OUT_TSV"
  # the dataset's and the measurement's writeback done before the idle floor
  sync
  ((DRY)) || sleep 3
  ad_row idle ckpt first
  ad_config plain "$KINDS"
  ad_config default "$KINDS" "$LP" --report --
  ad_row "default onset" ckpt onset "$LP" --report --
  ad_config "offline" ckpt "$LP" --tier offline --report --
  for pct in $ALT_PCTS; do
    LOWPRIO_TIERS=$WORK/tiers-${pct}pct.conf ad_config "default at $pct %" ckpt "$LP" --report --
  done
  if ((IOMAX_ROW)); then
    LOWPRIO_GOV_PACE=off ad_config "default, writes capped by io.max (no pacing)" ckpt "$LP" --report --
  fi
  local kb
  for kb in $MAX_SECTORS_KBS; do
    ((DRY)) && break
    echo "$kb" >"$DISK_Q/max_sectors_kb" || continue
    ad_config "default, max_sectors_kb $(<"$DISK_Q/max_sectors_kb")" ckpt "$LP" --report --
  done
  [[ -n $SECTORS_BEFORE ]] && ((! DRY)) && echo "$SECTORS_BEFORE" >"$DISK_Q/max_sectors_kb"
  local mib
  for mib in $BDI_MAX_MIBS; do
    ((DRY)) && break
    if ! { echo 1 >"$BDI/strict_limit" && echo $((mib << 20)) >"$BDI/max_bytes"; }; then
      ad_bdi_restore
      continue
    fi
    ad_config "default, bdi max $mib MiB strict" ckpt "$LP" --report --
    ad_bdi_restore
  done
  if ((! DRY)) && ((WITH_IOCOST)) && [[ -f $CG/io.cost.qos ]]; then
    "$LP" --setup-disk "$DISK"
    ad_config "default + iocost" ckpt "$LP" --report --
    "$LP" --setup-disk --undo "$DISK"
  fi
  ad_table "$OUT_TSV" | tee "$out/disk_adaptive.md"
  echo "== total $((SECONDS - AD_START)) s"
}

ad_params() {
  DRY=0
  [[ ${DRY_RUN:-0} == 1 ]] && DRY=1
  if ((DRY)); then
    IO_S=${IO_S:-2} WARM_S=${WARM_S:-1} LEAD_S=${LEAD_S:-0.5} LOAD_S=${LOAD_S:-0.5} ALONE_N=${ALONE_N:-1}
    CKPT_MIB=${CKPT_MIB:-8} DATASET_MIB=${DATASET_MIB:-16}
  else
    IO_S=${IO_S:-10} WARM_S=${WARM_S:-2} LEAD_S=${LEAD_S:-1} LOAD_S=${LOAD_S:-1} ALONE_N=${ALONE_N:-3}
    CKPT_MIB=${CKPT_MIB:-1000} DATASET_MIB=${DATASET_MIB:-2048}
  fi
  TIME_BUDGET_S=${TIME_BUDGET_S:-270}
  # the cap's trade-off: the batch tier's write cap at these other shares
  ALT_PCTS=${ALT_PCTS:-8 16}
  # 1: the default row again with the governor's writes capped by io.max
  # instead of paced at the source (LOWPRIO_GOV_PACE=off: before pacing)
  IOMAX_ROW=${IOMAX_ROW:-1}
  # 1: also the default beside --setup-disk's iocost (bench/RESULTS.md §8b
  # measured iocost itself: it slows the service's reads)
  WITH_IOCOST=${WITH_IOCOST:-0}
  FLUSH_PROBE=${FLUSH_PROBE:-$((1 - DRY))}
  MAX_SECTORS_KBS=${MAX_SECTORS_KBS:-}
  BDI_MAX_MIBS=${BDI_MAX_MIBS:-}
  KINDS=${KINDS:-ckpt direct8 read}
  # lowprio-run's own cgroup leaf: the governor needs one (systemd-run's
  # scope would be systemd's to write)
  export LOWPRIO_MECHANISM=${LOWPRIO_MECHANISM:-cgroup-v2}
}

ad_check() {
  ((DRY)) && return 0
  if ((EUID != 0)) || [[ $(stat -fc %T "$CG") != cgroup2fs && -z ${BENCH_CGROUP:-} ]] ||
    ! grep -qw io "$CG/cgroup.controllers"; then
    echo "needs root on a pure cgroup v2 host with the io controller (found uid $EUID, $(stat -fc %T "$CG" 2>/dev/null)); DRY_RUN=1 runs the plumbing anywhere"
    return 1
  fi
}

# The dry run's cgroup root: plain files where the kernel's would be, and
# lowprio-run pointed at it.
ad_fake_root() {
  CG=$WORK/fakecg
  mkdir -p "$CG"
  echo "cpu io memory" >"$CG/cgroup.controllers"
  : >"$CG/cgroup.subtree_control"
  : >"$CG/cgroup.procs"
  echo "0::/" >"$WORK/proc-cgroup"
  export LOWPRIO_CGROUP_ROOT=$CG LOWPRIO_CGROUP_MODE=v2 LOWPRIO_PROC_CGROUP=$WORK/proc-cgroup LOWPRIO_MEASURE_MIB=8
  SVC=$CG/gg-ad-svc-$$ JOB=$CG/gg-ad-job-$$
}

# One configuration: each job kind of $2 alone, then beside the service
# (service first). Arguments: $1 label, $2 kinds, $3... the prefix.
ad_config() {
  local label=$1 kinds=$2 kind
  shift 2
  echo "== $label"
  for kind in $kinds; do
    ad_row "$label" "$kind" first "$@"
  done
}

# Bytes the job's cgroup (lowprio-run's leaf below it included: io.stat
# counts descendants) wrote on the disk so far; empty where there is no
# io.stat (the dry run's fake tree).
ad_wbytes() {
  [[ -r $JOB/io.stat ]] || return 0
  awk -v d="$DISK" '$1 == d { for (i = 2; i <= NF; i++) if ($i ~ /^wbytes=/) { sub(/^wbytes=/, "", $i); w = $i } }
    END { if (w != "") print w }' "$JOB/io.stat"
}

# One row: the job kind alone ALONE_N times (median MiB/s; ckpt only, the
# others once), then beside the service in the order $3 (first | onset).
# Appends to the TSV the columns of disk_default.sh's rows.
ad_row() {
  local label=$1 kind=$2 order=$3 i alone=- beside=- wrote=- charged=- job='' probe io secs w0='' w1='' flush=-
  shift 3
  if ((SECONDS - AD_START > TIME_BUDGET_S)); then
    echo "== $label / $kind skipped: the time budget ($TIME_BUDGET_S s) has passed"
    return 0
  fi
  local -a rates=()
  if [[ $label != idle ]]; then
    local n=$ALONE_N
    [[ $order == onset ]] && n=0
    for ((i = 0; i < n; i++)); do
      rm -f "$WORK/job.rate"
      bench_in "$JOB" "$@" bash "$WORK/job.sh" once "$WORK" "$kind" "$CKPT_MIB" "$DISK" "$CG" 2>>"$WORK/lp.err"
      [[ -r $WORK/job.rate ]] && rates+=("$(<"$WORK/job.rate")")
    done
    ((${#rates[@]})) && alone=$(printf '%s\n' "${rates[@]}" | sort -n | sed -n "$(((${#rates[@]} + 1) / 2))p")
    ad_lines alone
  fi
  rm -f "$WORK/job.rate" "$WORK/job.wb" "$WORK/probe.out" "$WORK/flush.out"
  [[ $order == onset ]] || ad_flush_probe
  if [[ $label == idle ]]; then
    io=$(bench_in "$SVC" python3 "$HELPER" io "$IO_S" "$WORK")
  elif [[ $order == first ]]; then
    w0=$(ad_wbytes)
    bench_in "$SVC" python3 "$HELPER" io "$IO_S" "$WORK" >"$WORK/probe.out" &
    probe=$!
    sleep "$LEAD_S"
    # the job's seconds: to the probe's end (the job script's last pass may
    # run up to 8 s longer, and counts what it wrote until then)
    secs=$(awk -v a="$IO_S" -v b="$LEAD_S" -v c="$LOAD_S" 'BEGIN { s = a - b - c; print (s < 1 ? 1 : int(s + 0.5)) }')
    # shellcheck disable=SC2016 # $1 and $@ belong to the inner bash
    bench_in "$JOB" "$@" bash -c 'sleep "$1"; shift; exec bash "$@"' _ "$LOAD_S" \
      "$WORK/job.sh" "$secs" "$WORK" "$kind" "$CKPT_MIB" "$DISK" "$CG" 2>>"$WORK/lp.err" &
    job=$!
    wait "$probe"
    w1=$(ad_wbytes)
    io=$(<"$WORK/probe.out")
  else
    bench_in "$JOB" "$@" bash "$WORK/job.sh" $((WARM_S + IO_S + 1)) "$WORK" "$kind" "$CKPT_MIB" "$DISK" "$CG" 2>>"$WORK/lp.err" &
    job=$!
    sleep "$WARM_S"
    w0=$(ad_wbytes)
    io=$(bench_in "$SVC" python3 "$HELPER" io "$IO_S" "$WORK")
    w1=$(ad_wbytes)
  fi
  if [[ -n $job ]]; then
    wait "$job"
    [[ -r $WORK/job.rate ]] && beside=$(<"$WORK/job.rate")
    # what reached the disk in the job's name while the service ran (its
    # cgroup's io.stat, writeback included): a pass of a checkpoint that
    # outlasts the probe says nothing about the rate the cap left it
    if [[ -n $w0 && -n $w1 ]] && ((w1 > w0)); then
      beside=$(awk -v a="$w0" -v b="$w1" -v s="$IO_S" 'BEGIN { printf "%.0f\n", (b - a) / 1048576 / s }')
    fi
    [[ -r $WORK/job.wb ]] && read -r wrote charged <"$WORK/job.wb"
  fi
  ad_lines beside
  if [[ -n ${FLUSH_JOB:-} ]]; then
    wait "$FLUSH_JOB"
    FLUSH_JOB=''
    [[ -s $WORK/flush.out ]] && flush=$(tr ' ' / <"$WORK/flush.out")
  fi
  echo "   $label / $kind ($order): p50/p99 write+fsync, p50/p99 read, n: $io | job MiB/s alone $alone, beside $beside | beside: charged $charged MiB of the $wrote MiB written | bare flush p50/p99/n $flush"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$kind" "${io// /$'\t'}" "$beside" "$alone" "$wrote" "$charged" "$flush" >>"$OUT_TSV"
}

# With FLUSH_PROBE, starts the bare-flush probe in the service's cgroup
# for the probe's seconds (FLUSH_JOB: its PID), writing flush.out.
ad_flush_probe() {
  FLUSH_JOB=''
  ((FLUSH_PROBE)) || return 0
  bench_in "$SVC" python3 "$HELPER" flush "$IO_S" "$WORK" >"$WORK/flush.out" 2>/dev/null &
  FLUSH_JOB=$!
}

# lowprio-run's lines of the runs just done (the disk line once, how long
# the adaptive cap was on per run), then empties its error file.
ad_lines() {
  grep -m1 ' disk: ' "$WORK/lp.err" 2>/dev/null | sed 's/^/   /'
  grep -E '^  (adaptive|disk) ' "$WORK/lp.err" 2>/dev/null | sed "s/^/   $1: /"
  : >"$WORK/lp.err"
}

# The tables from the TSV.
ad_table() {
  python3 - "$1" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
for r in rows:
    r += ["-"] * (12 - len(r))
idle = next(r for r in rows if r[0] == "idle")
w0, r0 = float(idle[3]), float(idle[5])
base = {r[1]: float(r[8]) for r in rows if r[0] == "plain" and r[8] != "-"}
def pct(v, kind):
    return "%.0f %%" % (100 * float(v) / base[kind]) if v != "-" and base.get(kind) else "-"
def x(v, ref):
    return "%s (%.1fx)" % (v, float(v) / ref) if v != "-" else "-"
print("| beside the service | job | write+fsync p99 ms (x idle) | O_DIRECT read p99 ms (x idle) "
      "| job MiB/s beside (of plain alone) | job MiB/s alone (of plain alone) | MiB charged to the job / written |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    print("| %s | %s | %s | %s | %s (%s) | %s (%s) | %s / %s |" % (
        r[0], r[1], x(r[3], w0), x(r[5], r0), r[7], pct(r[7], r[1]), r[8], pct(r[8], r[1]), r[10], r[9]))
print()
floor = min((float(r[3]) for r in rows if r[0] != "idle" and r[3] != "-"), default=w0)
print("Idle floor of this disk: write+fsync p99 %.2f ms, O_DIRECT read p99 %.2f ms; the lowest write+fsync "
      "p99 beside any job here: %.2f ms (%.1fx idle)." % (w0, r0, floor, floor / w0))
print()
get = {(r[0], r[1]): r for r in rows}
if any(r[11] != "-" for r in rows):
    print("Is the floor the disk's own cache flush? A bare flush of the disk (an fsync of a file unchanged since its last) every 100 ms "
          "beside the service's probe:")
    print()
    print("| beside the service | job | bare flush p50 / p99 ms | service write+fsync p50 / p99 ms |")
    print("|---|---|---|---|")
    for r in rows:
        if r[11] != "-":
            f = r[11].split("/")
            print("| %s | %s | %s / %s | %s / %s |" % (r[0], r[1], f[0], f[1], r[2], r[3]))
    print()
print("| goal (issue 23) | row | goal | measured | met |")
print("|---|---|---|---|---|")
def goal(label, row, want, value, ok):
    print("| %s | %s | %s | %s | %s |" % (label, row, want, value, "yes" if ok else "**no**"))
def ratio(v, ref):
    return float(v) / ref if v != "-" else float("inf")
for name in ("default", "default onset", "default + iocost"):
    d = get.get((name, "ckpt"))
    if not d:
        continue
    goal("service O_DIRECT read p99 beside a checkpoint writer", name, "<= 3x idle", "%.1fx" % ratio(d[5], r0),
         ratio(d[5], r0) <= 3)
    goal("service 4 KiB write+fsync p99 beside it", name, "<= 5x idle", "%.1fx" % ratio(d[3], w0),
         ratio(d[3], w0) <= 5)
    b = base.get("ckpt") or 0
    if d[8] != "-" and b:
        goal("job's write throughput alone", name, ">= 90 %", "%.0f %%" % (100 * float(d[8]) / b),
             float(d[8]) >= 0.9 * b)
    if d[7] != "-" and b:
        goal("job's write throughput beside the service", name, ">= 10 %", "%.0f %%" % (100 * float(d[7]) / b),
             float(d[7]) >= 0.1 * b)
d = get.get(("default", "read"))
if d:
    goal("service O_DIRECT read p99 beside the job's dataset reads", "default", "<= 3x idle",
         "%.1fx" % ratio(d[5], r0), ratio(d[5], r0) <= 3)
for kind in ("read", "direct8"):
    d = get.get(("default", kind))
    if d and d[8] != "-" and base.get(kind):
        goal("job alone (%s)" % kind, "default", ">= 90 %", pct(d[8], kind), float(d[8]) >= 0.9 * base[kind])
o = get.get(("offline", "ckpt"))
if o:
    goal("service read p99", "offline", "<= 2x idle", "%.1fx" % ratio(o[5], r0), ratio(o[5], r0) <= 2)
    goal("service write+fsync p99", "offline", "<= 3x idle", "%.1fx" % ratio(o[3], w0), ratio(o[3], w0) <= 3)
PY
}

# Puts the disk's iocost back (lowprio-run's own undo, then the lines found
# at the start), removes the cgroups and the work folder.
# Puts the disk's writeback cache limits back as they were.
ad_bdi_restore() {
  local ratio strict
  read -r ratio strict <<<"$BDI_BEFORE"
  [[ -n $ratio ]] && echo "$ratio" >"$BDI/max_ratio_fine" 2>/dev/null
  [[ -n $strict ]] && echo "$strict" >"$BDI/strict_limit" 2>/dev/null
  echo "== bdi at the end: max_ratio_fine $(cat "$BDI/max_ratio_fine" 2>/dev/null), strict_limit $(cat "$BDI/strict_limit" 2>/dev/null)"
}

ad_cleanup() {
  if ((! DRY)); then
    "$LP" --setup-disk --undo >/dev/null 2>&1
    if [[ -n $QOS_BEFORE && " $QOS_BEFORE " == *" ctrl=user "* ]]; then
      echo "$QOS_BEFORE" >"$CG/io.cost.qos" 2>/dev/null
    fi
    if [[ -n ${MODEL_BEFORE:-} && " $MODEL_BEFORE " == *" ctrl=user "* ]]; then
      echo "$MODEL_BEFORE" >"$CG/io.cost.model" 2>/dev/null
    fi
    echo "== io.cost.qos at the end: $(grep "^$DISK " "$CG/io.cost.qos" 2>/dev/null)"
  fi
  if [[ -n ${SECTORS_BEFORE:-} ]] && ((! DRY)); then
    echo "$SECTORS_BEFORE" >"$DISK_Q/max_sectors_kb" 2>/dev/null
  fi
  [[ -n ${BDI_BEFORE// /} ]] && ((! DRY)) && ad_bdi_restore
  ((DRY)) || bench_rm_cgroups "$SVC" "$JOB"
  rm -rf -- "$WORK"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  # no -e: a bench keeps going past one failed step and always cleans up
  set -uo pipefail
  main "$@"
fi
