# shellcheck shell=bash
# Which disk a path is on, and how fast that disk writes: lowprio-run bounds
# a job's disk use per whole disk (the kernel's io.max and io.weight take a
# disk's MAJ:MIN, never a partition's), and its io.max fallback is a
# fraction of the disk's measured bandwidth, never a number typed by hand.
# The measurement is a short O_DIRECT write (then read) of a temporary file
# on that disk, cached in the state folder's disk-bandwidth, one line per
# disk: "MAJ:MIN NAME SECTORS WRITE_B/S READ_B/S UNIX_TIME". A line whose
# name or size no longer match (another disk got the number after a
# reboot) is measured again.

# Puts into the variable named $2 the whole disk's MAJ:MIN for a block
# device (/dev/sda1), a MAJ:MIN, or a file or folder (the disk it is on).
# Returns 1 with DISK_ERROR (read by the callers) set to one line saying why not (a path on
# tmpfs or NFS, a device that is gone).
# shellcheck disable=SC2034 # DISK_ERROR is read by the callers
disk_resolve_into() {
  local _dr_spec=$1 _dr_majmin='' _dr_fstype _dr_sys
  local -n disk_ref=$2
  DISK_ERROR=''
  if [[ $_dr_spec =~ ^[0-9]+:[0-9]+$ ]]; then
    _dr_majmin=$_dr_spec
    [[ -e /sys/dev/block/$_dr_majmin ]] || {
      DISK_ERROR="no block device $_dr_majmin here (gone, or never there)"
      return 1
    }
  elif [[ -b $_dr_spec ]]; then
    _dr_majmin=$(stat -Lc '%Hr:%Lr' -- "$_dr_spec" 2>/dev/null)
  elif [[ $_dr_spec == /dev/* && ! -e $_dr_spec ]]; then
    DISK_ERROR="$_dr_spec does not exist (a disk that is gone?)"
    return 1
  elif [[ -e $_dr_spec ]]; then
    _dr_majmin=$(stat -c '%Hd:%Ld' -- "$_dr_spec" 2>/dev/null)
    if [[ ${_dr_majmin%%:*} == 0 || -z $_dr_majmin ]]; then
      _dr_fstype=$(stat -fc %T -- "$_dr_spec" 2>/dev/null)
      DISK_ERROR="$_dr_spec is on ${_dr_fstype:-a file system} with no block device of its own (tmpfs, NFS, overlay): no disk to limit there"
      return 1
    fi
  else
    DISK_ERROR="$_dr_spec is neither a block device, a MAJ:MIN nor an existing path"
    return 1
  fi
  if [[ ! -e /sys/dev/block/$_dr_majmin ]]; then
    DISK_ERROR="no block device $_dr_majmin behind $_dr_spec (gone?)"
    return 1
  fi
  _dr_sys=$(readlink -f "/sys/dev/block/$_dr_majmin")
  # a partition's parent folder is its disk
  [[ -e $_dr_sys/partition ]] && _dr_majmin=$(<"${_dr_sys%/*}/dev")
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  disk_ref=$_dr_majmin
}

# Prints a disk's kernel name (vda, nvme0n1, loop3) for a MAJ:MIN.
disk_name() {
  local sys
  sys=$(readlink -f "/sys/dev/block/$1" 2>/dev/null) || return 1
  printf '%s' "${sys##*/}"
}

# Prints a disk's size in 512-byte sectors (part of its identity in the cache).
disk_sectors() {
  local name
  name=$(disk_name "$1") || return 1
  cat "/sys/class/block/$name/size" 2>/dev/null
}

# True for a spinning disk (its latency targets are looser). Virtual
# disks (virtio vd*, Xen xvd*) often report rotational=1 by default while
# a cloud SSD sits behind them: they count as SSDs.
disk_rotational() {
  local name
  name=$(disk_name "$1") || return 1
  [[ $name != vd* && $name != xvd* ]] || return 1
  [[ $(cat "/sys/class/block/$name/queue/rotational" 2>/dev/null) == 1 ]]
}

# The cache file of measured bandwidths.
disk_cache_file() {
  printf '%s/disk-bandwidth' "$GPUGUARD_STATE_DIR"
}

# Puts "WRITE_B/S READ_B/S UNIX_TIME" of a disk's cached measurement into
# the variable named $2; returns 1 when there is none that fits the disk
# now there.
disk_cached_into() {
  local majmin=$1 file key name sectors w r t
  local -n cached_ref=$2
  file=$(disk_cache_file)
  [[ -f $file && ! -L $file ]] || return 1
  local want_name want_sectors
  want_name=$(disk_name "$majmin") || return 1
  want_sectors=$(disk_sectors "$majmin")
  while read -r key name sectors w r t; do
    [[ $key == "$majmin" && $name == "$want_name" && $sectors == "$want_sectors" ]] || continue
    [[ $w =~ ^[1-9][0-9]*$ && $r =~ ^[0-9]+$ && $t =~ ^[0-9]+$ ]] || continue
    # shellcheck disable=SC2034 # nameref: assigns the caller's variable
    cached_ref="$w $r $t"
    return 0
  done <"$file"
  return 1
}

# Prints a folder on the disk, writable by us, to hold the measurement's
# temporary file: the state folder, /var/tmp or /tmp when they are on that
# disk, else the first writable mount point of the disk or its partitions,
# else the extra candidate $2 (the job's own folder).
disk_probe_folder() {
  local majmin=$1 extra=${2:-} dir d
  for dir in "$GPUGUARD_STATE_DIR" /var/tmp /tmp; do
    [[ -d $dir && -w $dir ]] || continue
    disk_resolve_into "$dir" d 2>/dev/null || continue
    [[ $d == "$majmin" ]] && printf '%s' "$dir" && return 0
  done
  local src target
  while read -r _ target; do
    [[ -d $target && -w $target ]] || continue
    disk_resolve_into "$target" d 2>/dev/null || continue
    [[ $d == "$majmin" ]] && printf '%s' "$target" && return 0
  done < <(findmnt -rn -o MAJ:MIN,TARGET 2>/dev/null)
  if [[ -n $extra && -d $extra && -w $extra ]] && disk_resolve_into "$extra" d 2>/dev/null && [[ $d == "$majmin" ]]; then
    printf '%s' "$extra"
    return 0
  fi
  return 1
}

# Prints bytes per second for BYTES moved in the time since START
# ($EPOCHREALTIME).
disk_rate_since() {
  local bytes=$1 start=$2 usec
  usec=$((${EPOCHREALTIME/[.,]/} - ${start/[.,]/}))
  ((usec > 0)) || usec=1
  printf '%d' "$((bytes * 1000000 / usec))"
}

# The measurement's temporary files: ".gpuguard-disk-measure.XXXXXX" in the
# folder disk_probe_folder picks. One left behind (lowprio-run killed with
# SIGKILL mid-measurement) is removed by the next measurement in that
# folder and by gg_retention in the state folder, once an hour old (a
# measurement takes two minutes at most).
DISK_MEASURE_PREFIX=.gpuguard-disk-measure.

# Removes this user's measurement files older than an hour from folder $1.
disk_measure_sweep() {
  find "$1" -maxdepth 1 -type f -name "$DISK_MEASURE_PREFIX*" -user "$EUID" -mmin +60 -delete 2>/dev/null || true
}

# Reads the measurement's size, LOWPRIO_MEASURE_MIB (default 256), into
# DISK_MEASURE_MIB. A value that is not a whole number in range is refused
# in one line (status 2): replaced by the default without a word, a typo
# measured 256 MiB where the user meant a few.
disk_measure_mib_check() {
  local shown
  gg_number_into DISK_MEASURE_MIB "${LOWPRIO_MEASURE_MIB:-256}" int 1 1000000000 && return 0
  gg_shown_into shown "$LOWPRIO_MEASURE_MIB" 24
  gg_usage_error "LOWPRIO_MEASURE_MIB must be a whole number of MiB from 1 to 1000000000 (got $shown)"
}

# Measures a disk: writes DISK_MEASURE_MIB (default 256) MiB with
# O_DIRECT and a final flush into a new temporary file on it, reads it back
# with O_DIRECT, removes it; caches and puts "WRITE_B/S READ_B/S UNIX_TIME"
# into the variable named $2. Returns 1 with DISK_ERROR set when it cannot
# (no writable folder on the disk, too little space, no O_DIRECT there).
# INT, TERM, HUP and QUIT stop it at once (its dd runs in the background,
# where a signal does not wait for it to finish): the temporary file is
# removed, DISK_ERROR says which signal, DISK_SIGNAL holds it, and the
# signal is raised again for the caller's own handling once its traps are
# back (lowprio-run keeps it for the job it then starts; --measure-disk
# ends by it).
# Arguments:
#   $1 MAJ:MIN, $2 variable, $3 an extra folder to try (the job's)
# shellcheck disable=SC2034 # DISK_ERROR is read by the callers
disk_measure_into() {
  local majmin=$1 extra=${3:-} dir tmp mib start w r avail err saved_traps rc
  local -n measured_ref=$2
  DISK_ERROR='' DISK_SIGNAL=''
  # (checked by disk_measure_mib_check when the options were read)
  mib=${DISK_MEASURE_MIB:-256}
  if ! dir=$(disk_probe_folder "$majmin" "$extra"); then
    DISK_ERROR="no folder on disk $majmin that $(id -un) may write a temporary file in"
    return 1
  fi
  disk_measure_sweep "$dir"
  avail=$(df -Pk -- "$dir" 2>/dev/null | awk 'NR == 2 { print $4 }')
  if [[ ! $avail =~ ^[0-9]+$ ]] || ((avail < mib * 1024 * 2)); then
    DISK_ERROR="less than $((mib * 2)) MiB free in $dir for the measurement"
    return 1
  fi
  saved_traps=$(trap -p INT TERM HUP QUIT)
  DISK_DD_PID=''
  trap 'disk_signal_caught INT' INT
  trap 'disk_signal_caught TERM' TERM
  trap 'disk_signal_caught HUP' HUP
  trap 'disk_signal_caught QUIT' QUIT
  if ! disk_measure_file_into tmp "$dir"; then
    DISK_ERROR="cannot create a temporary file in $dir"
  else
    start=$EPOCHREALTIME
    rc=0
    disk_dd_into err if=/dev/zero of="$tmp" bs=1M count="$mib" oflag=direct conv=fsync,notrunc || rc=$?
    if [[ -z $DISK_SIGNAL ]] && ((rc != 0)); then
      DISK_ERROR="the O_DIRECT write in $dir failed: ${err:-took over 60 s}"
    elif [[ -z $DISK_SIGNAL ]]; then
      w=$(disk_rate_since "$((mib * 1048576))" "$start")
      start=$EPOCHREALTIME
      if disk_dd_into err if="$tmp" of=/dev/null bs=1M iflag=direct; then
        r=$(disk_rate_since "$((mib * 1048576))" "$start")
      else
        r=0
      fi
    fi
    rm -f -- "$tmp"
  fi
  trap - INT TERM HUP QUIT
  disk_traps_restore "$saved_traps"
  if [[ -n $DISK_SIGNAL ]]; then
    DISK_ERROR="interrupted by SIG$DISK_SIGNAL"
    kill -s "$DISK_SIGNAL" "$BASHPID"
    return 1
  fi
  [[ -z $DISK_ERROR ]] || return 1
  measured_ref="$w $r $(printf '%(%s)T' -1)"
  disk_cache_store "$majmin" "$measured_ref"
}

# The measurement's trap for signal $1: keeps the first signal in
# DISK_SIGNAL and stops the dd running now, if any. Stopping it here, and
# not only after `wait` returns, matters when the signal lands between
# the dd's start and the `wait`: that wait would not be cut short by a
# signal that came before it, and would sit out the whole write (up to
# 60 s) before the job could start.
disk_signal_caught() {
  DISK_SIGNAL=${DISK_SIGNAL:-$1}
  [[ -n ${DISK_DD_PID:-} ]] || return 0
  kill -TERM -- "-$DISK_DD_PID" 2>/dev/null || kill -TERM "$DISK_DD_PID" 2>/dev/null || true
}

# Sets again the traps that `trap -p` printed ($1), without eval: each
# line is trap -- 'COMMAND' SIGNAME, a ' in COMMAND written '\''.
disk_traps_restore() {
  local line command
  while IFS= read -r line; do
    [[ $line =~ ^trap\ --\ \'(.*)\'\ SIG([A-Z]+)$ ]] || continue
    command=${BASH_REMATCH[1]//"'\\''"/"'"}
    trap -- "$command" "${BASH_REMATCH[2]}"
  done <<<"$1"
}

# Creates the measurement's temporary file in folder $2 (a new name, never
# one already there) and puts its path into the variable named $1. In this
# shell, not in mktemp's command substitution: a ^C there would kill the
# substitution after the file was made and before its name came back,
# leaving a file nobody knows to remove.
disk_measure_file_into() {
  local -n file_ref=$1
  local name try had_noclobber=0
  file_ref=''
  [[ $- == *C* ]] && had_noclobber=1
  set -C
  for try in 1 2 3 4 5; do
    printf -v name '%s/%s%03x%03x' "$2" "$DISK_MEASURE_PREFIX" "$((RANDOM % 4096))" "$((RANDOM % 4096))"
    [[ -e $name || -L $name ]] && continue
    if { : >"$name"; } 2>/dev/null; then
      file_ref=$name
    fi
    break
  done
  ((had_noclobber)) || set +C
  [[ -n $file_ref ]]
}

# Runs dd with the arguments given, bounded to 60 s (a disk that hangs must
# not keep the job from starting), in the background so that a signal
# caught meanwhile (disk_measure_into's traps set DISK_SIGNAL) stops it at
# once instead of after the whole write. Puts dd's first error line into
# the variable named $1.
# Returns:
#   dd's status (timeout's 124 after 60 s); 1 when stopped by a signal
disk_dd_into() {
  local -n dd_err=$1
  shift
  local pid rc pipe tries=0
  dd_err=''
  [[ -z $DISK_SIGNAL ]] || return 1
  # dd's error line waits in a pipe (no file); both ends on one descriptor
  exec {pipe}<> <(:)
  timeout 60 dd "$@" status=none 2>&"$pipe" &
  pid=$!
  DISK_DD_PID=$pid
  while :; do
    rc=0
    # a signal caught before this point found no dd to stop (its trap ran
    # before DISK_DD_PID was set); one caught after it stops the dd itself
    [[ -n $DISK_SIGNAL ]] || wait "$pid" || rc=$?
    # a caught signal ends wait early, with the dd still running
    if [[ -n $DISK_SIGNAL ]]; then
      # timeout leads a process group of its own, so a ^C at the terminal
      # did not reach the dd. TERM goes to that whole group: timeout
      # signalled alone before it knows its child's PID exits and leaves
      # the dd writing. Then wait for the group to be gone.
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      # (TERM again each time: a dd that timeout started after the first
      # TERM, or before it moved into its own group, gets one too)
      while kill -TERM -- "-$pid" 2>/dev/null && ((tries < 100)); do
        sleep 0.05
        tries=$((tries + 1))
      done
      rc=1
      break
    fi
    ((rc > 128)) && kill -0 "$pid" 2>/dev/null && continue
    break
  done
  DISK_DD_PID=''
  if ((rc != 0)) && read -r -t 0 -u "$pipe"; then
    read -r -u "$pipe" dd_err || true
  fi
  exec {pipe}<&-
  return "$rc"
}

# Replaces a disk's line in the cache (other disks' lines stay). A cache
# that cannot be written only means measuring again next time.
disk_cache_store() {
  local majmin=$1 values=$2 file text='' key rest
  file=$(disk_cache_file)
  [[ -d $GPUGUARD_STATE_DIR && -w $GPUGUARD_STATE_DIR ]] || return 0
  if [[ -f $file && ! -L $file ]]; then
    while read -r key rest; do
      [[ -n $key && $key != "$majmin" ]] && text+="$key $rest"$'\n'
    done <"$file"
  fi
  text+="$majmin $(disk_name "$majmin") $(disk_sectors "$majmin") $values"$'\n'
  gg_write_atomic "$file" "$text" || true
}

# Bytes per second as text: "1.2 GiB/s", "200 MiB/s".
disk_rate_text() {
  local n=$1
  if ((n >= 10 * 1073741824)); then
    printf '%d GiB/s' "$((n / 1073741824))"
  elif ((n >= 1073741824)); then
    printf '%d.%d GiB/s' "$((n / 1073741824))" "$(((n % 1073741824) * 10 / 1073741824))"
  else
    printf '%d MiB/s' "$((n / 1048576))"
  fi
}

# --------------------------------------------------- iocost, set up by hand --
# `lowprio-run --setup-disk [DEV]` (and install.sh --setup-disk) turn iocost
# on; what each disk had before is kept in the state folder's iocost-saved,
# one line per disk, "MAJ:MIN|io.cost.qos line|io.cost.model line" (an
# empty field: the disk had none), and `--setup-disk --undo` (and
# install.sh --uninstall) put exactly that back.

disk_saved_file() {
  printf '%s/iocost-saved' "$GPUGUARD_STATE_DIR"
}

# Puts the disks --setup-disk covers without DEV into the array named $1:
# every whole disk with a request queue (dm and md devices are left out:
# iocost works on the disks below them).
disk_all_into() {
  local -n all_ref=$1
  local disk _sched
  all_ref=()
  while read -r disk _sched; do
    [[ $disk == dm-* || $disk == md* ]] && continue
    [[ -r /sys/block/$disk/dev ]] && all_ref+=("$(<"/sys/block/$disk/dev")")
  done < <(gg_disk_schedulers)
}

# Puts the saved lines into the associative array named $1 (MAJ:MIN ->
# "qos|model").
disk_saved_into() {
  local -n saved_ref=$1
  local file key qos model
  file=$(disk_saved_file)
  saved_ref=()
  [[ -f $file && ! -L $file ]] || return 0
  while IFS='|' read -r key qos model; do
    # shellcheck disable=SC2034 # nameref: assigns the caller's array
    [[ $key =~ ^[0-9]+:[0-9]+$ ]] && saved_ref["$key"]="$qos|$model"
  done <"$file"
}

# Writes the saved lines back (the file is removed when none is left).
disk_saved_store() {
  local -n store_ref=$1
  local file key text=''
  file=$(disk_saved_file)
  for key in "${!store_ref[@]}"; do
    text+="$key|${store_ref[$key]}"$'\n'
  done
  if [[ -z $text ]]; then
    rm -f -- "$file"
    return 0
  fi
  gg_write_atomic "$file" "$text"
}

# The iocost settings --setup-disk writes, one row per kind of disk and
# cost model; the first row of a kind is its default. Change them here from
# bench/h200/iocost_matrix.sh's figures (bench/RESULTS.md). Columns:
#   model    measured: a linear cost model from the disk's measured O_DIRECT
#            write and read speed (this file's cache; the kernel's own
#            figures for small I/O); kernel: the kernel's automatic model,
#            which assumes ~400 MiB/s for any SSD or virtual disk
#   p, lat   the disk counts as saturated when more than (100 - p) % of its
#            reads (writes) take longer than lat microseconds beyond what
#            their size costs; iocost then slows every cgroup in proportion
#            to its io.weight, the job's low one first
#   min,max  how far iocost may slow every cgroup down or let it speed up,
#            in % of the model's speed: a job alone writes at most max %
#            of what the model says the disk does. With max 10000 on the
#            H200 host's write-back-cached virtio disk iocost never slowed
#            the job (bench/RESULTS.md section 8): the ceiling goes with a
#            model that knows the disk's real speed.
# SSDs and virtual disks get 5 ms targets (one fsync there takes ~2 ms
# idle); spinning disks 50/100 ms (one seek takes ~10 ms).
# Prints "MODEL QOS" for disk kind $1 (ssd, rotational) and cost model $2
# (measured, kernel; empty: the kind's default): QOS is io.cost.qos's
# fields after the MAJ:MIN.
disk_iocost_settings() {
  local want_kind=$1 want_model=${2:-} kind model rpct rlat wpct wlat min max
  while read -r kind model rpct rlat wpct wlat min max; do
    [[ $kind == "$want_kind" && (-z $want_model || $model == "$want_model") ]] || continue
    printf '%s enable=1 ctrl=user rpct=%s.00 rlat=%s wpct=%s.00 wlat=%s min=%s.00 max=%s.00' \
      "$model" "$rpct" "$rlat" "$wpct" "$wlat" "$min" "$max"
    return 0
  done <<'TABLE'
ssd         measured  95  5000   95  5000    1  100
ssd         kernel    95  5000   95  5000    1  10000
rotational  measured  95  50000  95  100000  1  100
rotational  kernel    95  50000  95  100000  1  10000
TABLE
  return 1
}

# For the measured cost model: puts the io.cost.model figures of a disk's
# measured speed ("wbps=N rbps=N") into the variable named $2 and a text
# saying so into the one named $3. Measures now when nothing is cached
# (--measure-disk measures again). Returns 1 with DISK_ERROR set when the
# disk cannot be measured.
disk_model_figures_into() {
  local majmin=$1 bw w r
  local -n figures_ref=$2 figures_text=$3
  if ! disk_cached_into "$majmin" bw; then
    disk_measure_into "$majmin" bw || return 1
  fi
  read -r w r _ <<<"$bw"
  figures_ref="wbps=$w" figures_text="from the measured speed, writes $(disk_rate_text "$w")"
  if ((r > 0)); then
    figures_ref+=" rbps=$r"
    figures_text+=", reads $(disk_rate_text "$r")"
  fi
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  figures_text+=" (O_DIRECT; the kernel's figures for small I/O)"
}

# Turns iocost on for each disk named (all disks when none) with the cost
# model $1 (measured, kernel; empty: the default of disk_iocost_settings),
# saving what was there the first time. A disk that cannot be measured gets
# the kernel's model, and says so. One line per disk; a disk that fails
# does not stop the others. Returns 1 when any failed.
disk_setup() {
  local want_model=$1
  shift
  local -a disks=("$@")
  local -A saved=()
  local majmin settings model qos figures text qos_was model_was failed=0 kind
  ((${#disks[@]})) || disk_all_into disks
  if ! gg_state_dir_init 2>/dev/null; then
    gg_log error "cannot keep what the disks had before: the state folder $GPUGUARD_STATE_DIR is not usable; nothing changed"
    return 1
  fi
  disk_saved_into saved
  for majmin in "${disks[@]}"; do
    # no measurement for a disk iocost cannot have
    if ! cg_iocost_root; then
      gg_log error "disk $(disk_name "$majmin") ($majmin): iocost not turned on: $CG_LAST_ERROR"
      failed=1
      continue
    fi
    kind=ssd
    disk_rotational "$majmin" && kind=rotational
    settings=$(disk_iocost_settings "$kind" "$want_model")
    model=${settings%% *} figures='' text="the kernel's automatic one"
    if [[ $model == measured ]] && ! disk_model_figures_into "$majmin" figures text; then
      settings=$(disk_iocost_settings "$kind" kernel)
      text="the kernel's automatic one: the disk could not be measured ($DISK_ERROR)"
    fi
    qos=${settings#* }
    if ! cg_iocost_enable "$majmin" "$qos" "$figures"; then
      gg_log error "disk $(disk_name "$majmin") ($majmin): iocost not turned on: $CG_LAST_ERROR"
      failed=1
      continue
    fi
    qos_was=$CG_IOCOST_WAS_QOS model_was=$CG_IOCOST_WAS_MODEL
    if [[ -z ${saved[$majmin]+set} ]]; then
      saved[$majmin]="$qos_was|$model_was"
      disk_saved_store saved || {
        gg_log error "disk $majmin: could not save what it had; putting it back"
        cg_iocost_restore "$majmin" "$qos_was" "$model_was" || true
        unset "saved[$majmin]"
        failed=1
        continue
      }
    fi
    gg_log info "disk $(disk_name "$majmin") ($majmin): iocost on ($qos; cost model: $text); before: ${qos_was:-never set up}; lowprio-run --setup-disk --undo puts it back"
  done
  return "$failed"
}

# Puts back what disk_setup saved, for the disks named (all saved ones
# when none). One line per disk; returns 1 when any failed.
disk_undo() {
  local -A saved=()
  local -a disks=("$@")
  local majmin failed=0 qos model
  disk_saved_into saved
  ((${#disks[@]})) || disks=("${!saved[@]}")
  if ((${#disks[@]} == 0)); then
    gg_log info "nothing to undo: no disk was set up by lowprio-run --setup-disk (no $(disk_saved_file))"
    return 0
  fi
  for majmin in "${disks[@]}"; do
    if [[ -z ${saved[$majmin]+set} ]]; then
      gg_log warn "disk $majmin: not set up by lowprio-run --setup-disk: left as it is"
      continue
    fi
    IFS='|' read -r qos model <<<"${saved[$majmin]}"
    if cg_iocost_restore "$majmin" "$qos" "$model"; then
      gg_log info "disk $majmin: iocost put back as it was (${qos:-off, never set up})"
      unset "saved[$majmin]"
    else
      gg_log error "disk $majmin: could not put iocost back: $CG_LAST_ERROR (kept in $(disk_saved_file))"
      failed=1
    fi
  done
  disk_saved_store saved || failed=1
  return "$failed"
}
