#!/usr/bin/env bash
# Summary: does lowprio-run's pacer (lib/iogov.sh) hold a real checkpoint writer to its write cap, and what does a service's fsync see beside it? (root, any cgroup v2 mount; no io controller needed)
# Usage: bench/h200/pace_check.sh CG2_ROOT DIR SECONDS RATE_MIB...   (RATE 0: the writer unpaced)
#
# For each rate: a cgroup CG2_ROOT/gg-pace-PID holds a writer of new
# 1000 MiB checkpoints (dd conv=fsync, two files in turn in DIR, a new dd
# per checkpoint, as torch.save in a subprocess does); the governor's own
# pacer functions (iogov_pace_begin, and iogov_pace_until: the loop of
# iogov_run while the cap is on) hold it to RATE MiB/s for SECONDS, while
# the service of bench/h200/lowprio_io.py (a 4 KiB write+fsync and a 4 KiB
# O_DIRECT read every 20 ms) runs beside it. The cap's on/off decision
# (iogov_step) is left out: the cap is on all the time. Prints one
# Markdown row per rate: the service's p99s, what the pacer counted, the
# pages dirtied on the whole host meanwhile (/proc/vmstat nr_dirtied: the
# writer's real rate, the service's 0.2 MiB/s aside) and how long the job
# was frozen.

pc_row() {
  local root=$1 dir=$2 s=$3 rate=$4 leaf job probe d0 d1 r
  leaf=$root/gg-pace-$$-$rate-$SECONDS
  mkdir "$leaf" || return 1
  # shellcheck disable=SC2016 # $$, $i belong to the writer's bash
  bash -c 'echo $$ >"$1/cgroup.procs"; i=0; while :; do i=$((i + 1)); dd if=/dev/zero of="$2/ckpt.$((i % 2))" bs=1M count=1000 conv=fsync status=none; done' _ "$leaf" "$dir" &
  job=$!
  sleep 1
  python3 "$PC_HERE/lowprio_io.py" io "$s" "$dir" >"$dir/probe.out" &
  probe=$!
  d0=$(awk '/^nr_dirtied /{print $2}' /proc/vmstat)
  r=$((rate << 20))
  ((rate > 0)) || r=100000000000
  iogov_init "$leaf" "$root" "" 0:0 "wbps=$r"
  # unpaced: a bucket too deep to run dry (counted, never frozen)
  ((rate > 0)) || IOGOV_BURST=$((1 << 40)) IOGOV_CREDIT=$((1 << 40))
  iogov_pace_begin || echo "pace_begin failed" >&2
  local nap
  exec {nap}<> <(:)
  # the governor's own loop of looks, half a second at a time
  while kill -0 "$probe" 2>/dev/null; do
    iogov_pace_until $((${EPOCHREALTIME/[.,]/} + 500000)) "$nap"
  done
  iogov_pace_end
  exec {nap}<&-
  d1=$(awk '/^nr_dirtied /{print $2}' /proc/vmstat)
  wait "$probe"
  echo 1 >"$leaf/cgroup.kill"
  wait "$job" 2>/dev/null
  # (a process killed is still in its cgroup until it is reaped)
  local tries
  for ((tries = 0; tries < 100; tries++)); do
    rmdir "$leaf" 2>/dev/null && break
    sleep 0.05
  done
  local p99w p99r
  read -r _ p99w _ p99r _ <"$dir/probe.out"
  printf '| %s | %s | %s | %s | %s | %s |\n' "$([[ $rate == 0 ]] && echo "unpaced" || echo "$rate MiB/s")" \
    "$p99w" "$p99r" "$((IOGOV_WRITTEN / 1048576 / s))" "$(((d1 - d0) * 4096 / 1048576 / s))" \
    "$(lowprio_usec_text "$IOGOV_PAUSED_USEC")"
  rm -f "$dir"/ckpt.* "$dir/probe.out"
}

main() {
  (($# >= 4)) || {
    sed -n 's/^# Usage: //p' "${BASH_SOURCE[0]}" >&2
    return 2
  }
  local root=$1 dir=$2 s=$3 rate
  shift 3
  PC_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  cd "$PC_HERE/../.." || return 1
  # shellcheck source=../../lib/common.sh
  source lib/common.sh
  # shellcheck source=../../lib/cgroup.sh
  source lib/cgroup.sh
  # shellcheck source=../../lib/iogov.sh
  source lib/iogov.sh
  # shellcheck source=../../lib/disk.sh
  source lib/disk.sh
  # shellcheck source=../../lib/lowprio.sh
  source lib/lowprio.sh
  printf '| writer | write+fsync p99 ms | O_DIRECT read p99 ms | pacer counted MiB/s | pages dirtied MiB/s | frozen |\n'
  printf '|---|---|---|---|---|---|\n'
  for rate in "$@"; do
    pc_row "$root" "$dir" "$s" "$rate"
  done
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  main "$@"
fi
