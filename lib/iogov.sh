# shellcheck shell=bash
# The adaptive io.max: "cap the job only while someone else uses the disk".
# A static io.max protects a service beside a checkpoint writer, but holds
# the job to the cap even when it has the disk to itself; iocost's weights
# did not protect reads on the H200 host's disk (bench/RESULTS.md section
# 8b). So lowprio-run starts this small governor beside the job: every
# LOWPRIO_GOV_PERIOD seconds (0.5) it looks at who else did I/O on the disk
# and writes the cap to the job's io.max while others are busy, and `max`
# back once they have been quiet for LOWPRIO_GOV_QUIET seconds (3).
#
# Who else: the cgroups beside the job's path (for each cgroup from the
# job's leaf up to the root, its siblings; io.stat counts a cgroup's
# descendants too), counted in the same units as the job's own io.stat, so
# the job's own I/O never looks like someone else's. Other lowprio-run jobs
# (gpuguard-lowprio-*) do not count: they are batch work, not services
# waiting. Busy means at least LOWPRIO_GOV_FLOOR_IOPS (20) I/Os or
# LOWPRIO_GOV_FLOOR_BPS (1 MiB) per second: the H200 probe service (a 4 KiB
# write+fsync and a 4 KiB read every 20 ms) does 100 I/Os per second, a log
# shipper's trickle or an atime update a few. The root cgroup's own I/O
# (the file system's journal, kernel threads) is not among them: the
# journal commits for the job's own files would otherwise keep the cap on.
# I/O no cgroup beside the job accounts for (the root cgroup's, cgroups a
# container does not show) is seen in the disk's totals
# (/sys/block/DEV/stat): disk - job - the cgroups beside it. Those totals
# count requests as they complete (after merging and splitting) and the
# job's io.stat counts them as they are issued, so the difference wobbles
# by the job's requests in flight: it counts only above
# LOWPRIO_GOV_HIDDEN_BPS (32 MiB/s) and half the job's own rate, and only
# while the job's own io.stat can be read (else its own I/O would count).
#
# Writes are paced at the source while the cap is on: io.max then caps
# only the job's reads, and the governor holds the job to the write cap by
# freezing its cgroup in short slices (every LOWPRIO_GOV_TICK, 0.01 s)
# while the bytes it has written (/proc/PID/io write_bytes, counted as a
# page is dirtied or an O_DIRECT write is issued) run ahead of a token
# bucket at the cap's rate with 4 MiB of burst. Why not io.max for writes:
# it throttles the job's writeback bios, and on ext4 (data=ordered) a
# service's fsync waits for the job's data in the same journal commit,
# throttled bios included: 6-10 ms p99 beside a capped checkpoint writer,
# 12-19x an idle floor, where pacing the writer at the same rate kept the
# service's fsync at its idle floor (bench/RESULTS.md sections 8d, 8e and
# 8h). Where the job's leaf has no cgroup.freeze (kernels before 5.2),
# under systemd (which owns the scope), with LOWPRIO_GOV_PACE=off, or when
# no /proc/PID/io of the job can be read, the cap's wbps goes to io.max as
# before. A guard process thaws the job if the governor dies
# (cg_freeze_guard_open, lib/cgroup.sh).
#
# The loop forks nothing (builtins only: read, printf, arithmetic, globs;
# the thaw guard is started once, the first time the cap goes on), and
# sleeps in `read -t` on a pipe nobody writes to. Its writes are
# cg_io_max_write and cg_freeze_write (lib/cgroup.sh); where systemd owns
# the job's scope, cg_systemd_io_max_set instead, which runs systemctl:
# only when the cap goes on or off. Under systemd it first finds the scope systemd-run made
# (UNIT.scope) in the job's /proc/PID/cgroup. It exits when the job's
# cgroup is gone or empty, or on TERM (lowprio-run sends it when the job
# ends), and then prints one line: "GOV CAPPED_USEC SWITCHES ELAPSED_USEC
# PAUSED_USEC PACED" (PACED: 1 when writes were paced, 0 when io.max
# capped them).

# Sums a disk's line of a cgroup's io.stat: bytes read and written into the
# variable named $3, I/Os into $4. Returns 1 when the file cannot be read
# (the cgroup is gone); a cgroup that did no I/O on the disk has no line: 0.
iogov_iostat_into() {
  local _is_file=$1 _is_dev=$2 _is_key _is_rest _is_kv _is_fd
  local -n _is_bytes=$3 _is_ios=$4
  _is_bytes=0 _is_ios=0
  { exec {_is_fd}<"$_is_file"; } 2>/dev/null || return 1
  while read -r -u "$_is_fd" _is_key _is_rest; do
    [[ $_is_key == "$_is_dev" ]] || continue
    for _is_kv in $_is_rest; do
      [[ ${_is_kv#*=} =~ ^[0-9]{1,18}$ ]] || continue
      case $_is_kv in
        rbytes=* | wbytes=*) _is_bytes=$((_is_bytes + ${_is_kv#*=})) ;;
        rios=* | wios=*) _is_ios=$((_is_ios + ${_is_kv#*=})) ;;
      esac
    done
  done
  exec {_is_fd}<&-
  return 0
}

# Reads a disk's totals from its /sys/block/DEV/stat (the fields of
# /proc/diskstats after the name): bytes read and written into the variable
# named $2 (sectors are 512 bytes whatever the disk's block size). Returns
# 1 when unreadable or garbled.
iogov_diskstat_into() {
  local -n _ds_bytes=$2
  local -a _ds_f
  { read -r -a _ds_f <"$1"; } 2>/dev/null || return 1
  [[ ${_ds_f[2]:-} =~ ^[0-9]{1,18}$ && ${_ds_f[6]:-} =~ ^[0-9]{1,18}$ ]] || return 1
  _ds_bytes=$(((_ds_f[2] + _ds_f[6]) * 512))
}

# Fills the array named $3 with the cgroups beside the job's leaf $1: the
# siblings of the leaf and of each cgroup above it, up to the root $2.
iogov_neighbours_into() {
  local _nb_dir=$1 _nb_root=$2 _nb_parent _nb_c
  local -n _nb_out=$3
  _nb_out=()
  while [[ $_nb_dir == "$_nb_root"/* ]]; do
    _nb_parent=${_nb_dir%/*}
    for _nb_c in "$_nb_parent"/*/; do
      _nb_c=${_nb_c%/}
      [[ $_nb_c == "$_nb_dir" ]] && continue
      _nb_out+=("$_nb_c")
    done
    _nb_dir=$_nb_parent
  done
}

# True while the leaf holds a live process (cgroup.events; where the kernel
# has none, a first line in cgroup.procs). Returns 2 when the leaf is gone.
iogov_populated() {
  local _po_key _po_val _po_pid
  [[ -d $1 ]] || return 2
  if [[ -e $1/cgroup.events ]]; then
    while read -r _po_key _po_val; do
      [[ $_po_key == populated ]] && {
        [[ $_po_val == 1 ]]
        return
      }
    done <"$1/cgroup.events" 2>/dev/null
    return 1
  fi
  { read -r _po_pid <"$1/cgroup.procs"; } 2>/dev/null && [[ -n $_po_pid ]]
}

# One sample and one decision. Reads the job's, the neighbours' and the
# disk's counters, compares them with the last sample (IOGOV_* globals) and
# writes the cap or `max` when the state changes. The first sample of a
# cgroup only sets its baseline: its past is not news.
# Globals: IOGOV_LEAF IOGOV_ROOT IOGOV_STAT IOGOV_DEV IOGOV_CAP (the io.max
#   fields while capped), IOGOV_PREV (assoc: cgroup -> "bytes ios"),
#   IOGOV_DISK_PREV (the disk's bytes), IOGOV_CAPPED (0/1), IOGOV_SWITCHES, IOGOV_CAPPED_USEC, IOGOV_LAST_T,
#   IOGOV_LAST_BUSY_T, IOGOV_QUIET_USEC
iogov_step() {
  local now=${EPOCHREALTIME/[.,]/} dt c b n ob=0 on=0 jb=0 lb=0 disk=0 prev busy='' known=0
  local -a nbs
  dt=$((now - IOGOV_LAST_T))
  ((dt > 0)) || dt=1
  if iogov_iostat_into "$IOGOV_LEAF/io.stat" "$IOGOV_DEV" b n; then
    prev=${IOGOV_PREV[$IOGOV_LEAF]:-}
    [[ -n $prev ]] && jb=$((b - ${prev% *})) known=1
    IOGOV_PREV[$IOGOV_LEAF]="$b $n"
  fi
  iogov_neighbours_into "$IOGOV_LEAF" "$IOGOV_ROOT" nbs
  for c in "${nbs[@]}"; do
    iogov_iostat_into "$c/io.stat" "$IOGOV_DEV" b n || continue
    prev=${IOGOV_PREV[$c]:-}
    IOGOV_PREV[$c]="$b $n"
    [[ -n $prev ]] || continue
    # a counter that went back (a cgroup removed and made again) is news
    # of nothing; another lowprio-run job's bytes only explain the disk's
    if [[ ${c##*/} == gpuguard-lowprio-* ]]; then
      ((b >= ${prev% *})) && lb=$((lb + b - ${prev% *}))
      continue
    fi
    ((b >= ${prev% *})) && ob=$((ob + b - ${prev% *}))
    ((n >= ${prev#* })) && on=$((on + n - ${prev#* }))
  done
  if [[ -n $IOGOV_STAT ]] && iogov_diskstat_into "$IOGOV_STAT" b; then
    [[ -n $IOGOV_DISK_PREV ]] && disk=$((b - IOGOV_DISK_PREV))
    IOGOV_DISK_PREV=$b
  fi
  if ((on * 1000000 >= IOGOV_FLOOR_IOPS * dt)); then
    busy="$((on * 1000000 / dt)) I/Os per second beside the job"
  elif ((ob * 1000000 >= IOGOV_FLOOR_BPS * dt)); then
    busy="$((ob * 1000000 / dt)) bytes per second beside the job"
  elif ((known && disk - jb - lb - ob > 0)) &&
    (((disk - jb - lb - ob) * 1000000 >= IOGOV_HIDDEN_BPS * dt && 2 * (disk - jb - lb - ob) >= jb + lb)); then
    busy="$(((disk - jb - lb - ob) * 1000000 / dt)) bytes per second on the disk from no cgroup beside the job"
  fi
  ((IOGOV_CAPPED)) && IOGOV_CAPPED_USEC=$((IOGOV_CAPPED_USEC + now - IOGOV_LAST_T))
  IOGOV_LAST_T=$now
  if [[ -n $busy ]]; then
    IOGOV_LAST_BUSY_T=$now
    if ((! IOGOV_CAPPED)); then
      iogov_cap_on
    elif ((! IOGOV_PACING && IOGOV_PACE_RATE > 0)); then
      # the job could not be read when the cap went on (a process
      # exiting as it was read): its writes are paced from now on
      iogov_pace_on
    fi
  elif ((IOGOV_CAPPED && now - IOGOV_LAST_BUSY_T >= IOGOV_QUIET_USEC)); then
    iogov_write "rbps=max wbps=max" && IOGOV_CAPPED=0 && iogov_pace_end
  fi
  return 0
}

# Puts the cap on: paced writes and io.max for reads where the job can be
# paced (iogov_pace_on), else the whole cap in io.max.
iogov_cap_on() {
  iogov_pace_on || iogov_write "$IOGOV_CAP" || return 0
  IOGOV_CAPPED=1 IOGOV_SWITCHES=$((IOGOV_SWITCHES + 1))
}

# Paces the job's writes and leaves io.max only the read cap. Returns 1,
# pacing nothing, where the job cannot be paced or io.max cannot be
# written.
iogov_pace_on() {
  iogov_pace_begin || return 1
  iogov_write "$IOGOV_CAP_READS" && return 0
  iogov_pace_end
  return 1
}

# Sums what the job's processes have written since the last call into the
# variable named $1 (their /proc/PID/io write_bytes, IOGOV_WPREV holding
# each one's last figure). $2 says which processes are read:
#   full      every process in the job's cgroup.procs; one first seen now
#             counts from 0 (a new process's counter starts at 0), one
#             gone is forgotten
#   baseline  the same, but every figure so far is a baseline (not news)
#   writers   only those that wrote in the last second (IOGOV_WRITER_T):
#             reading each /proc/PID/io costs the bash about 45 us, and a
#             training job has dozens of data loader processes that never
#             write, so the pacer reads them all only every tenth look
# A process that ends hands its figure to its parent when the parent reaps
# it (the kernel adds a reaped child's counters to the parent's): read
# again, the same bytes would count twice and the job would be held far
# below its cap (127 MiB/s counted where 3 MiB/s were written, on the
# development machine, a dd per checkpoint). So the last figure of a
# process gone is a debt that the next bytes pay off first, within two
# seconds (after that, its parent was not in the job).
# Returns 1 when no process of the job could be read.
iogov_written_into() {
  local -n _wr_sum=$1
  local _wr_mode=$2 _wr_pid _wr_io _wr_val _wr_fd _wr_read=0 _wr_now=${EPOCHREALTIME/[.,]/}
  local -a _wr_pids=()
  _wr_sum=0
  if [[ $_wr_mode == writers ]]; then
    _wr_pids=("${!IOGOV_WRITER_T[@]}")
  else
    { exec {_wr_fd}<"$IOGOV_LEAF/cgroup.procs"; } 2>/dev/null || return 1
    # (read -d '' stops at the end of the file with status 1: all is read)
    IFS=$'\n' read -r -d '' -u "$_wr_fd" -a _wr_pids || true
    exec {_wr_fd}<&-
    # a process no longer listed is gone: forgotten
    for _wr_pid in "${!IOGOV_WPREV[@]}"; do
      [[ " ${_wr_pids[*]} " == *" $_wr_pid "* ]] || iogov_forget "$_wr_pid" "$_wr_now"
    done
  fi
  for _wr_pid in "${_wr_pids[@]}"; do
    [[ $_wr_pid =~ ^[0-9]+$ ]] || continue
    _wr_io=''
    { read -r -d '' _wr_io <"$IOGOV_PROCFS/$_wr_pid/io"; } 2>/dev/null
    # (expansions, not =~: a regular expression is compiled at each use,
    # five times the cost here)
    _wr_val=${_wr_io#*write_bytes: }
    _wr_val=${_wr_val%%$'\n'*}
    if [[ $_wr_io != *'write_bytes: '* || -z $_wr_val || $_wr_val == *[!0-9]* || ${#_wr_val} -gt 18 ]]; then
      iogov_forget "$_wr_pid" "$_wr_now"
      continue
    fi
    _wr_read=1
    if [[ $_wr_mode != baseline ]] && ((_wr_val > ${IOGOV_WPREV[$_wr_pid]:-0})); then
      _wr_sum=$((_wr_sum + _wr_val - ${IOGOV_WPREV[$_wr_pid]:-0}))
      IOGOV_WRITER_T[$_wr_pid]=$_wr_now
    elif ((_wr_now - ${IOGOV_WRITER_T[$_wr_pid]:-0} > 1000000)); then
      unset "IOGOV_WRITER_T[$_wr_pid]"
    fi
    IOGOV_WPREV[$_wr_pid]=$_wr_val
  done
  ((_wr_now - IOGOV_DEBT_T <= 2000000)) || IOGOV_DEBT=0
  if ((IOGOV_DEBT > 0 && _wr_sum > 0)); then
    _wr_val=$((_wr_sum < IOGOV_DEBT ? _wr_sum : IOGOV_DEBT))
    _wr_sum=$((_wr_sum - _wr_val)) IOGOV_DEBT=$((IOGOV_DEBT - _wr_val))
  fi
  ((_wr_read))
}

# Forgets the process $1 (gone), its last figure owed (iogov_written_into)
# from the time $2.
iogov_forget() {
  [[ -n ${IOGOV_WPREV[$1]:-} ]] || return 0
  ((${2} - IOGOV_DEBT_T <= 2000000)) || IOGOV_DEBT=0
  IOGOV_DEBT=$((IOGOV_DEBT + IOGOV_WPREV[$1])) IOGOV_DEBT_T=$2
  unset "IOGOV_WPREV[$1]" "IOGOV_WRITER_T[$1]"
}

# Starts pacing the job's writes, where it can be paced. Returns 1 (the
# caller puts the whole cap in io.max) where it cannot.
iogov_pace_begin() {
  local _pb_w
  ((IOGOV_PACE_RATE > 0)) && [[ -e $IOGOV_LEAF/cgroup.freeze ]] || return 1
  IOGOV_WPREV=() IOGOV_WRITER_T=() IOGOV_DEBT=0
  iogov_written_into _pb_w baseline || return 1
  if [[ -z $IOGOV_GUARD ]]; then
    cg_freeze_guard_open "$IOGOV_LEAF" IOGOV_GUARD || return 1
  fi
  IOGOV_PACING=1 IOGOV_PACED=1 IOGOV_CREDIT=$IOGOV_BURST IOGOV_PACE_T=${EPOCHREALTIME/[.,]/}
}

# Stops pacing: the job thawed if it was frozen.
iogov_pace_end() {
  ((IOGOV_PACING)) || return 0
  ((IOGOV_FROZEN)) && iogov_freeze 0
  IOGOV_PACING=0
  return 0
}

# Freezes ($1 = 1) or thaws (0) the job, counting the time it spent frozen.
iogov_freeze() {
  local now=${EPOCHREALTIME/[.,]/}
  ((IOGOV_FROZEN)) && IOGOV_PAUSED_USEC=$((IOGOV_PAUSED_USEC + now - IOGOV_FROZEN_T))
  cg_freeze_write "$IOGOV_LEAF" "$1" || ((IOGOV_FROZEN && ! $1)) || return 1
  IOGOV_FROZEN=$1 IOGOV_FROZEN_T=$now
}

# One look of the pacer: the token bucket at the write cap's rate (at most
# IOGOV_BURST ahead) less what the job wrote since the last look; the job
# is frozen while the bucket is below zero and thawed once it is not.
# (While nobody in the job writes, iogov_run looks five times less often.)
iogov_pace_tick() {
  local now=${EPOCHREALTIME/[.,]/} dt w mode=writers
  dt=$((now - IOGOV_PACE_T))
  ((dt > 1000000)) && dt=1000000
  ((dt > 0)) || dt=0
  IOGOV_PACE_T=$now
  # every tenth look (and every look while nobody in the job writes) reads
  # all the job's processes, the others only those writing
  ((IOGOV_LOOKS++ % 10 == 0 || ${#IOGOV_WRITER_T[@]} == 0)) && mode=full
  iogov_written_into w "$mode" || w=0
  IOGOV_WRITTEN=$((IOGOV_WRITTEN + w))
  IOGOV_CREDIT=$((IOGOV_CREDIT + IOGOV_PACE_RATE * dt / 1000000))
  ((IOGOV_CREDIT > IOGOV_BURST)) && IOGOV_CREDIT=$IOGOV_BURST
  IOGOV_CREDIT=$((IOGOV_CREDIT - w))
  if ((IOGOV_CREDIT < 0 && ! IOGOV_FROZEN)); then
    iogov_freeze 1
  elif ((IOGOV_CREDIT >= 0 && IOGOV_FROZEN)); then
    iogov_freeze 0
  fi
  return 0
}

# Writes the job's io.max fields for the disk ($1: the cap, or
# "rbps=max wbps=max"): to its leaf, or through systemd to its scope.
iogov_write() {
  if [[ -n $IOGOV_UNIT ]]; then
    cg_systemd_io_max_set "$IOGOV_UNIT.scope" "$IOGOV_DEV" "${1//=max/=infinity}"
  else
    cg_io_max_write "$IOGOV_LEAF" "$IOGOV_DEV $1"
  fi
}

# Under systemd: sets IOGOV_LEAF to the scope systemd-run made for the job
# (a path ending in /UNIT.scope in the job's /proc/PID/cgroup, IOGOV_PROC).
# Returns 1 while the job is not in it yet, 2 when the job is gone.
iogov_find_scope() {
  local _fs_line _fs_path=''
  [[ -e $IOGOV_PROC ]] || return 2
  { while read -r _fs_line; do
    [[ $_fs_line == 0::* ]] && _fs_path=${_fs_line#0::}
  done <"$IOGOV_PROC"; } 2>/dev/null || return 2
  [[ $_fs_path == */"$IOGOV_UNIT".scope ]] || return 1
  IOGOV_LEAF=$IOGOV_ROOT$_fs_path
}

# Sets up the governor's state. Arguments: $1 the job's leaf (empty under
# systemd: found from $7), $2 the cgroup root, $3 the disk's stat file
# (empty: none), $4 MAJ:MIN, $5 the cap ("wbps=N rbps=N"); under systemd
# $6 the scope's unit name (without .scope) and $7 the job's
# /proc/PID/cgroup.
iogov_init() {
  declare -g IOGOV_LEAF=$1 IOGOV_ROOT=$2 IOGOV_STAT=$3 IOGOV_DEV=$4 IOGOV_CAP=$5
  declare -g IOGOV_UNIT=${6:-} IOGOV_PROC=${7:-}
  declare -gA IOGOV_PREV=()
  declare -g IOGOV_DISK_PREV=''
  declare -g IOGOV_CAPPED=0 IOGOV_SWITCHES=0 IOGOV_CAPPED_USEC=0
  declare -g IOGOV_LAST_T=${EPOCHREALTIME/[.,]/} IOGOV_LAST_BUSY_T=0 IOGOV_STOP=0 IOGOV_QUIET_USEC=3000000
  declare -g IOGOV_FLOOR_IOPS=${LOWPRIO_GOV_FLOOR_IOPS:-20} IOGOV_FLOOR_BPS=${LOWPRIO_GOV_FLOOR_BPS:-1048576}
  declare -g IOGOV_HIDDEN_BPS=${LOWPRIO_GOV_HIDDEN_BPS:-33554432}
  # the pacer (iogov_pace_*): the write cap's rate, the cap left to io.max
  # while writes are paced (reads only), and its state
  declare -g IOGOV_PACE_RATE=0 IOGOV_CAP_READS='wbps=max' IOGOV_PROCFS=${LOWPRIO_GOV_PROCFS:-/proc}
  declare -g IOGOV_PACING=0 IOGOV_PACED=0 IOGOV_FROZEN=0 IOGOV_FROZEN_T=0 IOGOV_PAUSED_USEC=0
  declare -g IOGOV_CREDIT=0 IOGOV_PACE_T=0 IOGOV_BURST=4194304 IOGOV_GUARD=''
  declare -gA IOGOV_WPREV=() IOGOV_WRITER_T=()
  # (IOGOV_WRITTEN: the bytes the pacer counted in all, for
  # bench/h200/pace_check.sh)
  declare -g IOGOV_LOOKS=0 IOGOV_DEBT=0 IOGOV_DEBT_T=0 IOGOV_WRITTEN=0
  local kv
  for kv in $5; do
    case $kv in
      wbps=*) [[ ${kv#*=} =~ ^[0-9]{1,12}$ ]] && IOGOV_PACE_RATE=${kv#*=} ;;
      *) IOGOV_CAP_READS+=" $kv" ;;
    esac
  done
  [[ -z $IOGOV_UNIT && ${LOWPRIO_GOV_PACE:-on} != off ]] || IOGOV_PACE_RATE=0
  # the pacer's nap (LOWPRIO_GOV_TICK), and five of them while nobody in
  # the job writes: a job that starts writing again runs at most that long
  # before its first look
  declare -g IOGOV_TICK=${LOWPRIO_GOV_TICK:-0.01} IOGOV_SLOW_TICK
  [[ $IOGOV_TICK =~ ^0?\.[0-9]+$ ]] || IOGOV_TICK=0.01
  iogov_usec_into "$IOGOV_TICK" IOGOV_SLOW_TICK
  printf -v IOGOV_SLOW_TICK '%d.%06d' $((IOGOV_SLOW_TICK * 5 / 1000000)) $((IOGOV_SLOW_TICK * 5 % 1000000))
  iogov_usec_into "${LOWPRIO_GOV_QUIET:-3}" IOGOV_QUIET_USEC || IOGOV_QUIET_USEC=3000000
}

# The governor: runs until the job's cgroup is gone or empty, TERM, or a
# line on its wake pipe. The arguments are iogov_init's, then (optional)
# $8 the wake pipe: an fd its caller writes a line to when the job has
# ended. Ignores INT, QUIT and HUP (the terminal's keys reach the whole
# process group; the job decides on its own whether to stop), and on the
# way out takes its cap off a job still running.
iogov_run() {
  set +e +u
  iogov_init "${@:1:7}"
  local period=${LOWPRIO_GOV_PERIOD:-0.5} waited=0 seen=0 start=$IOGOV_LAST_T state period_usec
  [[ $period =~ ^[0-9]*\.?[0-9]+$ ]] || period=0.5
  iogov_usec_into "$period" period_usec
  trap '' INT QUIT HUP
  trap 'IOGOV_STOP=1' TERM
  # The nap between looks is a read -t on a pipe: a sleep without a fork.
  # bash runs a TERM trap only once such a read times out, so TERM alone
  # would keep lowprio-run waiting up to a period after its job; a line
  # on the wake pipe ends the nap at once.
  local nap=${8:-}
  [[ $nap =~ ^[0-9]+$ ]] || exec {nap}<> <(:)
  while ((! IOGOV_STOP)); do
    state=1
    if [[ -z $IOGOV_LEAF ]]; then
      iogov_find_scope
      state=$?
      ((state == 2)) && break
    fi
    if [[ -n $IOGOV_LEAF ]]; then
      iogov_populated "$IOGOV_LEAF"
      state=$?
    fi
    ((state == 2)) && break
    if ((state == 0)); then
      seen=1
      iogov_step
      if ((IOGOV_PACING)); then
        iogov_pace_until $((${EPOCHREALTIME/[.,]/} + period_usec)) "$nap"
        continue
      fi
    elif ((seen || waited > 600)); then
      # the job left its cgroup (or never came, for 600 naps)
      break
    else
      waited=$((waited + 1))
    fi
    read -r -t "$period" -u "$nap" _ && IOGOV_STOP=1
  done
  if ((IOGOV_CAPPED)) && [[ -n $IOGOV_LEAF && -d $IOGOV_LEAF ]]; then
    iogov_pace_end
    iogov_write "rbps=max wbps=max"
    IOGOV_CAPPED_USEC=$((IOGOV_CAPPED_USEC + ${EPOCHREALTIME/[.,]/} - IOGOV_LAST_T))
  fi
  exec {nap}<&-
  [[ -z $IOGOV_GUARD ]] || exec {IOGOV_GUARD}>&-
  printf 'GOV %s %s %s %s %s\n' "$IOGOV_CAPPED_USEC" "$IOGOV_SWITCHES" "$((${EPOCHREALTIME/[.,]/} - start))" \
    "$IOGOV_PAUSED_USEC" "$IOGOV_PACED" 2>/dev/null
  return 0
}

# The pacer's looks until the time $1 (microseconds, as EPOCHREALTIME),
# napping on the fd $2 between them (a line there stops the governor):
# every IOGOV_TICK, or IOGOV_SLOW_TICK while nobody in the job writes and
# it is not frozen.
iogov_pace_until() {
  local t
  while ((! IOGOV_STOP && ${EPOCHREALTIME/[.,]/} < $1)); do
    iogov_pace_tick
    t=$IOGOV_TICK
    ((${#IOGOV_WRITER_T[@]} || IOGOV_FROZEN)) || t=$IOGOV_SLOW_TICK
    read -r -t "$t" -u "$2" _ && IOGOV_STOP=1
  done
  return 0
}

# Seconds ("0.5", "3") as microseconds into the variable named $2.
iogov_usec_into() {
  local -n _us_out=$2
  [[ $1 =~ ^([0-9]*)(\.[0-9]{1,6})?[0-9]*$ ]] || return 1
  local frac=${BASH_REMATCH[2]:-.}000000
  _us_out=$((10#${BASH_REMATCH[1]:-0} * 1000000 + 10#${frac:1:6}))
}
