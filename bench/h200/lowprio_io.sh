#!/usr/bin/env bash
# Summary: does a service in a sibling cgroup keep its CPU throughput and I/O latency next to a checkpoint-writing all-core job, plain vs lowprio-run? (H200 host: root, pure cgroup v2)
# Usage: bench/h200/lowprio_io.sh [OUTDIR]   (default $OUT)
#
# The service (its own cgroup /gg-bench-svc-PID under the root) runs, per
# scenario: N CPU-bound processes for CPU_S seconds (throughput), then a
# probe doing a 4 KiB write+fsync and a 4 KiB O_DIRECT read every 20 ms for
# IO_S seconds (latency p99). Beside it the job (started from the sibling
# cgroup /gg-bench-job-PID): N busy processes plus dd rewriting a checkpoint
# file with buffered writes at full disk speed (conv=fsync). Scenarios: no
# job (idle), the job plain, under lowprio-run --tier batch, --tier offline,
# and batch with --io-max on the disk. When the plain job does not even
# double the probe's p99 (the disk too fast to show contention), the I/O part
# is repeated on a slow device: a memory-backed null_blk disk limited to
# SLOW_MBPS MB/s (configfs "mbps"), else dm-delay (+SLOW_DELAY_MS per I/O) on
# a loop device; the report says which. Then the lowprio tests run
# (pytest when importable, else the commands directly).
# Writes under OUTDIR: lowprio_io.md (the table), lowprio_io.tsv (raw rows),
# lowprio_io.log (everything, with lowprio-run's own exit lines),
# lowprio_tests.txt. Finishes in about 3 minutes. Leaves nothing behind.
# Environment: CPU_S (4), IO_S (8), WARM_S (2), SLOW_MBPS (200),
# SLOW_DELAY_MS (5), IO_MAX_FAST (200M), IO_MAX_SLOW (40M), TESTS_S (60);
# LP_EXTRA (more batch-tier scenarios, ";"-separated flags, DISK = the disk,
# e.g. "--mem-high 1G;--mem-high 1G --io-max DISK:wbps=200M");
# BENCH_CGROUP (a v2 mount to use instead, for a smoke run elsewhere);
# LOOP_FS (xfs or ext4-writeback: the I/O phases again on such a file
# system made on a loop device over the disk, see bench_loop_fs).

CG=${BENCH_CGROUP:-/sys/fs/cgroup}

main() {
  local out=${1:-${OUT:?set OUT or give a folder}}
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  mkdir -p "$out"
  exec > >(tee "$out/lowprio_io.log") 2>&1
  BENCH_ROOT=$root BENCH_OUT=$out
  CPU_S=${CPU_S:-4} IO_S=${IO_S:-8} WARM_S=${WARM_S:-2} NCPU=$(nproc)
  if ((EUID != 0)) || [[ $(stat -fc %T "$CG") != cgroup2fs && -z ${BENCH_CGROUP:-} ]]; then
    echo "needs root on a pure cgroup v2 host (found uid $EUID, $(stat -fc %T "$CG"))"
    return 1
  fi
  WORK=$(mktemp -d /var/tmp/gg-lowprio-io.XXXXXX)
  SVC=$CG/gg-bench-svc-$$ JOB=$CG/gg-bench-job-$$ SLOW_MNT='' SLOW_KIND='' SLOW_NULLB='' SLOW_LOOP=''
  trap bench_cleanup EXIT
  local c
  for c in cpu io memory; do
    grep -qw "$c" "$CG/cgroup.subtree_control" || echo "+$c" >"$CG/cgroup.subtree_control"
  done
  mkdir "$SVC" "$JOB"
  : >"$out/lowprio_io.tsv"
  echo "== host: $NCPU CPUs, kernel $(uname -r), work folder $WORK on $(findmnt -no SOURCE --target "$WORK")"
  "$root/bin/lowprio-run" --tier batch --explain | sed 's/^/   /'
  local disk
  disk=$(bench_disk_of "$WORK")
  echo "== disk $disk ($(bench_sched_of "$disk")): CPU and I/O phases"
  bench_scenarios "disk $disk" "$WORK" "$disk" "${IO_MAX_FAST:-200M}" cpu
  if bench_contention_shown "disk $disk"; then
    echo "== the plain job doubles the probe's p99 on this disk: no slow device needed"
  elif bench_slow_device; then
    disk=$(bench_disk_of "$SLOW_MNT")
    echo "== slow device: $SLOW_KIND ($disk): I/O phases only"
    bench_scenarios "$SLOW_KIND" "$SLOW_MNT" "$disk" "${IO_MAX_SLOW:-40M}" ''
  else
    echo "== no slow device could be made (null_blk and dm-delay unavailable): disk figures only"
  fi
  if [[ -n ${LOOP_FS:-} && -z $SLOW_MNT ]]; then
    if bench_loop_fs "$LOOP_FS"; then
      disk=$(bench_disk_of "$SLOW_MNT")
      echo "== $SLOW_KIND ($disk): I/O phases only"
      bench_scenarios "$SLOW_KIND" "$SLOW_MNT" "$disk" "${IO_MAX_FAST:-200M}" ''
    else
      echo "== no $LOOP_FS file system on a loop device could be made"
    fi
  fi
  python3 "$root/bench/h200/lowprio_io.py" table "$out/lowprio_io.tsv" | tee "$out/lowprio_io.md"
  bench_tests "$root" "$out"
}

# The whole disk (MAJ:MIN) holding a folder; io.max wants the disk, not a
# partition.
bench_disk_of() {
  local majmin
  majmin=$(findmnt -no MAJ:MIN --target "$1" | head -1)
  if [[ ${majmin%%:*} == 0 || -z $majmin ]]; then
    majmin=$(lsblk -dno MAJ:MIN,TYPE | awk '$2 == "disk" { print $1; exit }')
  fi
  majmin=${majmin// /}
  if [[ -e /sys/dev/block/$majmin/partition ]]; then
    majmin=$(<"$(readlink -f "/sys/dev/block/$majmin")/../dev")
  fi
  printf '%s' "$majmin"
}

bench_sched_of() {
  local f
  f=$(readlink -f "/sys/dev/block/$1")/queue/scheduler
  [[ -r $f ]] && cat "$f" || echo 'scheduler ?'
}

# Runs a command inside a cgroup folder.
bench_in() {
  local cg=$1
  shift
  sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg" "$@"
}

# The job: NCPU busy processes and a checkpoint rewritten at full speed
# until SECONDS pass; writes its MiB/s to $2/job.rate.
bench_job_script() {
  cat <<'JOB'
secs=$1 dir=$2 ncpu=$3 helper=$4 mib=$5
python3 "$helper" hog "$secs" "$ncpu" &
hog=$!
start=$(date +%s.%N) written=0
end=$((SECONDS + ${secs%.*}))
while ((SECONDS < end)); do
  dd if=/dev/zero of="$dir/ckpt" bs=1M count="$mib" conv=fsync status=none || break
  written=$((written + mib))
done
wait "$hog"
awk -v w="$written" -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.0f\n", w / (e - s) }' >"$dir/job.rate"
JOB
}

# One device's scenarios; appends rows to lowprio_io.tsv.
# Arguments: $1 device label, $2 folder on it, $3 disk MAJ:MIN, $4 io.max
# write cap for the last scenario, $5 "cpu" to run the CPU phase too
bench_scenarios() {
  local label=$1 dir=$2 disk=$3 cap=$4 with_cpu=$5
  local helper=$BENCH_ROOT/bench/h200/lowprio_io.py lp=$BENCH_ROOT/bin/lowprio-run
  local secs=$((WARM_S + IO_S + 2)) mib=1024
  [[ -n $with_cpu ]] && secs=$((secs + CPU_S))
  [[ $label == disk* ]] || mib=256
  bench_job_script >"$WORK/job.sh"
  python3 "$helper" io 0.1 "$dir" >/dev/null # the probe's read file, before any job
  local name
  local -a prefix
  local -a names=("none (idle)" plain "lowprio-run --tier batch" "lowprio-run --tier offline"
    "lowprio-run --tier batch --io-max $disk:wbps=$cap")
  if [[ -n ${LP_EXTRA:-} ]]; then
    local extra
    while IFS= read -r extra; do
      [[ -n $extra ]] && names+=("lowprio-run --tier batch ${extra//DISK/$disk}")
    done <<<"${LP_EXTRA//;/$'\n'}"
  fi
  for name in "${names[@]}"; do
    [[ -z $with_cpu && $name == *offline ]] && continue
    case $name in
      none*) prefix=() ;;
      plain) prefix=(bash) ;;
      *)
        # shellcheck disable=SC2206 # the scenario's flags, split on purpose
        prefix=("$lp" ${name#lowprio-run } -- bash)
        ;;
    esac
    rm -f "$dir/job.rate"
    local job=''
    if ((${#prefix[@]})); then
      bench_in "$JOB" "${prefix[@]}" "$WORK/job.sh" "$secs" "$dir" "$NCPU" "$helper" "$mib" &
      job=$!
      sleep "$WARM_S"
    fi
    local cpu=- io
    if [[ -n $with_cpu ]]; then
      cpu=$(bench_in "$SVC" python3 "$helper" cpu "$CPU_S" "$NCPU")
    fi
    io=$(bench_in "$SVC" python3 "$helper" io "$IO_S" "$dir")
    [[ -n $job ]] && wait "$job"
    local rate=-
    [[ -r $dir/job.rate ]] && rate=$(<"$dir/job.rate")
    echo "   $label | $name | service CPU $cpu it/s | probe p50/p99 write, p50/p99 read, n: $io | job $rate MiB/s"
    printf '%s\t%s\t%s\t%s\t%s\n' "$label" "$name" "$cpu" "${io// /$'\t'}" "$rate" >>"$BENCH_OUT/lowprio_io.tsv"
  done
  rm -f "$dir/ckpt"
}

# True when the plain job at least doubled the probe's write or read p99.
bench_contention_shown() {
  awk -F'\t' -v d="$1" '$1 == d && $2 == "none (idle)" { w = $5; r = $7 }
    $1 == d && $2 == "plain" { pw = $5; pr = $7 }
    END { exit !(pw > 2 * w || pr > 2 * r) }' "$BENCH_OUT/lowprio_io.tsv"
}

# A slow disk with a file system, mounted at SLOW_MNT: null_blk (memory
# backed, bandwidth-limited), else dm-delay over a loop device.
bench_slow_device() {
  local nb=/sys/kernel/config/nullb dev='' mbps=${SLOW_MBPS:-200}
  command -v mkfs.ext4 >/dev/null || return 1
  modprobe null_blk nr_devices=0 2>/dev/null
  modprobe configfs 2>/dev/null
  mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config 2>/dev/null
  if [[ -d $nb ]] && mkdir "$nb/ggslow$$" 2>/dev/null; then
    SLOW_NULLB=$nb/ggslow$$
    if echo 1 >"$SLOW_NULLB/memory_backed" && echo 2048 >"$SLOW_NULLB/size" &&
      echo "$mbps" >"$SLOW_NULLB/mbps" && echo 1 >"$SLOW_NULLB/power"; then
      dev=/dev/nullb$(<"$SLOW_NULLB/index")
      SLOW_KIND="null_blk, memory-backed, limited to $mbps MB/s"
    fi
  fi
  if [[ -z $dev ]] && command -v dmsetup >/dev/null; then
    truncate -s 2G "$WORK/slow.img"
    SLOW_LOOP=$(losetup -f --show "$WORK/slow.img") || return 1
    local sectors
    sectors=$(blockdev --getsz "$SLOW_LOOP")
    if dmsetup create "ggslow$$" --table "0 $sectors delay $SLOW_LOOP 0 ${SLOW_DELAY_MS:-5}" 2>/dev/null; then
      dev=/dev/mapper/ggslow$$
      SLOW_KIND="dm-delay +${SLOW_DELAY_MS:-5} ms per I/O over a loop device"
    fi
  fi
  [[ -n $dev ]] || return 1
  udevadm settle 2>/dev/null
  mkfs.ext4 -q -F "$dev" || return 1
  SLOW_MNT=$WORK/slow
  mkdir -p "$SLOW_MNT"
  mount "$dev" "$SLOW_MNT" || {
    SLOW_MNT=''
    return 1
  }
}

# A file system of another kind on the same disk, mounted at SLOW_MNT: a
# loop device (direct I/O, so the disk sees its writes at once) over a
# file written in full on the disk's file system. xfs: no ordered-data
# journal, so a service's fsync does not wait for the job's data;
# ext4-writeback: ext4 mounted data=writeback (the same effect).
# Arguments: $1 xfs or ext4-writeback
bench_loop_fs() {
  local kind=$1 img=$WORK/fs.img
  case $kind in
    xfs) command -v mkfs.xfs >/dev/null || return 1 ;;
    ext4-writeback) command -v mkfs.ext4 >/dev/null || return 1 ;;
    *) return 1 ;;
  esac
  dd if=/dev/zero of="$img" bs=1M count="${LOOP_FS_MIB:-4096}" conv=fsync status=none || return 1
  SLOW_LOOP=$(losetup -f --show --direct-io=on "$img") || return 1
  SLOW_MNT=$WORK/loopfs
  mkdir -p "$SLOW_MNT"
  case $kind in
    xfs) mkfs.xfs -q -f "$SLOW_LOOP" && mount "$SLOW_LOOP" "$SLOW_MNT" ;;
    *) mkfs.ext4 -q -F "$SLOW_LOOP" && mount -o data=writeback "$SLOW_LOOP" "$SLOW_MNT" ;;
  esac || {
    SLOW_MNT=''
    return 1
  }
  SLOW_KIND="$kind on a loop device over the disk"
}

# The lowprio test suite, with pytest when it can be imported.
bench_tests() {
  local root=$1 out=$2 limit=${TESTS_S:-60}
  echo "== lowprio tests (at most $limit s)"
  if python3 -c 'import pytest' 2>/dev/null; then
    (cd "$root" && timeout "$limit" python3 -m pytest -q -p no:cacheprovider tests/test_lowprio.py) >"$out/lowprio_tests.txt" 2>&1
    echo "pytest exit status $?" >>"$out/lowprio_tests.txt"
  else
    {
      echo "pytest not importable: the lowprio commands directly"
      local lp=$root/bin/lowprio-run rc
      "$lp" --version
      "$lp" true
      echo "lowprio-run true: $?"
      "$lp" --tier batch sh -c 'exit 3'
      echo "lowprio-run --tier batch sh -c 'exit 3': $? (want 3)"
      "$lp" --tier batch --report -- python3 -c 'x = bytearray(64 << 20)'
      echo "lowprio-run --report: $?"
      sleep 60 &
      "$lp" --tier batch --dry-run --attach $!
      rc=$?
      echo "--dry-run --attach: $rc; nice now $(ps -o ni= -p $!)"
      kill $!
      "$lp" --attach 1
      echo "--attach 1: $? (want 2)"
    } >"$out/lowprio_tests.txt" 2>&1
  fi
  tail -3 "$out/lowprio_tests.txt"
}

bench_cleanup() {
  [[ -n $SLOW_MNT ]] && umount "$SLOW_MNT" 2>/dev/null
  [[ -n $SLOW_LOOP ]] && {
    dmsetup remove "ggslow$$" 2>/dev/null
    losetup -d "$SLOW_LOOP" 2>/dev/null
  }
  [[ -n $SLOW_MNT ]] && umount "$SLOW_MNT" 2>/dev/null
  [[ -n $SLOW_NULLB ]] && {
    echo 0 >"$SLOW_NULLB/power" 2>/dev/null
    rmdir "$SLOW_NULLB" 2>/dev/null
  }
  bench_rm_cgroups "$SVC" "$JOB"
  rm -rf -- "$WORK"
}

# Kills what runs in each cgroup folder given and removes it (with any
# leaves lowprio-run made below it).
bench_rm_cgroups() {
  local cg pid
  for cg in "$@"; do
    [[ -d $cg ]] || continue
    while read -r pid; do
      kill -KILL "$pid" 2>/dev/null
    done <"$cg/cgroup.procs"
    sleep 0.2
    find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
  done
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  # no -e: a bench keeps going past one failed step and always cleans up
  set -uo pipefail
  main "$@"
fi
