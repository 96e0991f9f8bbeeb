# shellcheck shell=bash
# gpu-leak-watch's cycle: which processes are watched (a PID, a cmdline
# pattern, every GPU process, or a job it started), their process trees from
# /proc (launchers such as swift, torchrun, timeout or bash hold no GPU memory
# themselves: their children do), GPU memory summed over each tree from one
# nvidia-smi sample, CPU and RSS from /proc. The trend maths is in
# python/gpuguard_leak.py; events leave through lib/events.sh.

# Declares the watcher's state (empty).
leak_init() {
  declare -ga LEAK_ROOT_PIDS=() LEAK_PIDS=()
  declare -gA LEAK_CPU_PREV=() LEAK_STATUS=() LEAK_CMDLINES=() LEAK_CMDLINE_IDS=() LEAK_RANKS=()
  declare -gA LEAK_GPU_FREE=() LEAK_GPU_TOTAL=()
  # when each series' identity (history/<key>.job.json) was last written or found
  declare -gA LEAK_NAMED=()
  # by root PID: ascend when its tree holds memory on an Ascend NPU (lib/npu.sh),
  # so that its leak alerts say NPU
  declare -gA LEAK_VENDOR=()
  # by watcher instance: what leak_covered_pids_into found of its lock
  declare -gA LEAK_COVER_SEEN=()
  # by claiming watcher instance: the roots leak_claimed_pids_into last said
  # it leaves to that watcher (said again only when they change)
  declare -gA LEAK_CLAIM_SAID=()
  # 1 in a --once run (cron): no lock is held between runs, so a targeted
  # watcher leaves a claim for the --all runs instead (leak_claim_write)
  declare -g LEAK_ONCE=0
  # the kinds of device (nvidia, ascend) this watcher has read (leak_tool_check)
  declare -gA LEAK_KINDS_SEEN=()
  declare -g LEAK_TOOL_SAID=''
  declare -g LEAK_MATCH='' LEAK_ALL=0 LEAK_FAILS=0 LEAK_ACTION=notify LEAK_GRACE=30
  # option values for the Python helper, set by leak_apply_options
  declare -gA LEAK_OPT_ENV=()
  declare -g LEAK_INSTANCE='' LEAK_JOB_PID='' LEAK_JOB_SIGNALLED=0 LEAK_LAST_SIGNAL=''
  declare -g LEAK_PENDING_SIGNAL='' LEAK_LOCK_FILE='' LEAK_WATCH_DONE=0 LEAK_JOB_OWN_GROUP=1
  declare -g LEAK_UNWATCHED=''
  # 1 while the detector coprocess this watcher started should be running
  declare -g LEAK_DETECTOR_STARTED=0
  declare -g LEAK_MATCH_WAIT_SINCE=0 LEAK_MATCH_NOTICE_AT=0
  declare -g LEAK_ID_LINES='' LEAK_ID_RESET=1
  # what the caller ignored (SigIgn mask): the job gets the same
  declare -g LEAK_IGNORED_AT_START=0
  LEAK_CLK_TCK=100
  LEAK_PAGE_KIB=4
}

# Reads /proc/PID/cmdline with NULs turned into spaces, into $2 (no fork).
# Kept across cycles while the PID has the same start time and name (an
# exec changes the name, so `bash -c 'exec python ...'` is read again);
# leak_cycle drops the PIDs that are gone.
# shellcheck disable=SC2034 # nameref: assigns the caller's variable
leak_cmdline_into() {
  local -n cmd_ref=$2
  local id="${GG_PROC_START[$1]:-}-${GG_PROC_COMM[$1]:-}"
  if [[ -z ${LEAK_CMDLINES[$1]+set} || ${LEAK_CMDLINE_IDS[$1]:-} != "$id" ]]; then
    local -a parts=()
    { mapfile -d '' -t parts <"/proc/$1/cmdline"; } 2>/dev/null || parts=()
    LEAK_CMDLINES[$1]="${parts[*]}"
    LEAK_CMDLINE_IDS[$1]=$id
  fi
  cmd_ref=${LEAK_CMDLINES[$1]}
}

# Picks the processes to watch this cycle into LEAK_ROOT_PIDS.
# Globals:
#   LEAK_PIDS (from --pid or the started job), LEAK_MATCH, LEAK_ALL
leak_select_roots() {
  LEAK_ROOT_PIDS=()
  local pid cmd parent parent_cmd
  if ((LEAK_ALL)); then
    # every compute process; also those whose PID this namespace cannot see;
    # not those another watcher already covers (one leak, one alert)
    local -A covered=()
    leak_covered_pids_into covered
    leak_claimed_pids_into covered
    for pid in "${!SMI_PIDS_MEM[@]}"; do
      [[ -n ${covered[$pid]:-} ]] || LEAK_ROOT_PIDS+=("$pid")
    done
  elif [[ -n $LEAK_MATCH ]]; then
    local -A own=()
    leak_own_pids_into own
    for pid in "${!GG_PROC_PPID[@]}"; do
      [[ -z ${own[$pid]:-} ]] || continue
      leak_cmdline_into "$pid" cmd
      [[ $cmd =~ $LEAK_MATCH ]] || continue
      # keep only the topmost match: its tree holds the others (a parent
      # that is the watcher's own, such as the script that started it,
      # is not watched, so its matching child is the topmost)
      parent=${GG_PROC_PPID[$pid]}
      if [[ -z ${own[$parent]:-} ]]; then
        leak_cmdline_into "$parent" parent_cmd
        [[ $parent_cmd =~ $LEAK_MATCH ]] && continue
      fi
      LEAK_ROOT_PIDS+=("$pid")
    done
  fi
  for pid in "${LEAK_PIDS[@]}"; do
    if [[ -n ${GG_PROC_PPID[$pid]:-} || -n ${SMI_PIDS_MEM[$pid]:-} ]]; then
      LEAK_ROOT_PIDS+=("$pid")
    fi
  done
  return 0
}

# Puts into the associative array named $1 (PID -> instance) the processes
# that a live wrapped-job watcher (job-<wrapper PID>: the wrapper's tree,
# the job in it) or --pid daemon (pid-<PID>: that tree) on this state
# folder covers, so that the --all daemon leaves them out: watched by both,
# one leak was alerted twice (the daemon named the GPU process, the other
# watcher the job's root). A watcher is live while its lock is held, tested
# with flock -n without keeping it, and only once its holder has written
# the .pid file (after taking the lock: a lock being taken is never
# touched, which would make that watcher's own gg_lock fail). The answer is
# kept per holder and target, so flock runs once per watcher, not every
# cycle; the tree is said once in the log. (--once runs hold no lock: they
# leave a claim instead, leak_claimed_pids_into.)
# shellcheck disable=SC2034,SC2004 # nameref: fills the caller's associative array
leak_covered_pids_into() {
  local -n covered_ref=$1
  local path inst target holder seen pid
  local -a tree
  for path in "$GPUGUARD_STATE_DIR"/leak-job-*.lock "$GPUGUARD_STATE_DIR"/leak-pid-*.lock; do
    inst=${path##*/leak-}
    inst=${inst%.lock}
    target=${inst#*-}
    [[ $target =~ ^[0-9]+$ && -n ${GG_PROC_PPID[$target]:-} ]] || continue
    holder=''
    { read -r holder <"$path.pid"; } 2>/dev/null || continue
    # a watcher killed with -9 leaves its files: its job is the daemon's
    # again once the holder is gone (this cycle's process scan)
    [[ $holder =~ ^[0-9]+$ && -n ${GG_PROC_PPID[$holder]:-} ]] || continue
    seen="${GG_PROC_START[$target]:-} $holder"
    if [[ ${LEAK_COVER_SEEN[$inst]:-} != "$seen "* ]]; then
      if flock -n "$path" true 2>/dev/null; then
        LEAK_COVER_SEEN[$inst]="$seen free"
      else
        LEAK_COVER_SEEN[$inst]="$seen held"
        gg_proc_tree_into "$target" tree
        gg_log info "leaving PID $target and its tree (${tree[*]}) to the watcher $inst (PID $holder), which covers it"
      fi
    fi
    [[ ${LEAK_COVER_SEEN[$inst]} == *' held' ]] || continue
    gg_proc_tree_into "$target" tree
    for pid in "${tree[@]}"; do
      covered_ref[$pid]=$inst
    done
  done
  for inst in "${!LEAK_COVER_SEEN[@]}"; do
    [[ -e $GPUGUARD_STATE_DIR/leak-$inst.lock ]] || unset "LEAK_COVER_SEEN[$inst]"
  done
  return 0
}

# Claims of targeted watchers that hold no lock the --all watcher looks for
# (leak_claims): cron's --pid, --match, --slurm-job --once runs, and the
# --match, --slurm-job and several-PID daemons: one file per instance,
# leak-claim-<instance>, one line "LAST INTERVAL PID:START...": the time of
# the claimer's last cycle, its own interval, and the roots it watched
# (START from /proc, '-' when /proc does not show the PID).
#
# The rule: the targeted watcher always watches its job (it is the user's
# more specific request, with its own --on-leak, --loss-log, thresholds),
# and the --all watcher (daemon or --once) leaves the claimed trees to it
# while the claim is fresh: its last cycle within LEAK_CLAIM_CYCLES of its
# own intervals. Both cron lines watching the same job sent each leak
# twice (two firing, two resolved events). When the claimer stops running
# (its cron line removed) the claim goes stale and the --all runs take the
# job over again, at most LEAK_CLAIM_CYCLES intervals later; the interval
# is the gap the claimer saw between its own last two cycles (cron's
# schedule, which a --once run cannot know otherwise), at least
# LEAK_INTERVAL and at most LEAK_CLAIM_MAX_INTERVAL_S, so the takeover
# comes within LEAK_CLAIM_CYCLES hours at worst.
LEAK_CLAIM_CYCLES=3
LEAK_CLAIM_MAX_INTERVAL_S=3600

# True when this watcher leaves claims (see above): it is targeted, and no
# lock of its tells the --all watcher (leak_covered_pids_into reads the
# wrapped job's and the one-PID daemon's). A --match daemon beside an --all
# one sent each leak twice.
leak_claims() {
  ((! LEAK_ALL)) || return 1
  ((LEAK_ONCE)) || [[ $LEAK_INSTANCE != job-* && $LEAK_INSTANCE != pid-* ]]
}

# Removes this watcher's claim (a daemon that stops: the --all watcher
# takes its jobs over at once, not 3 intervals later).
leak_claim_drop() {
  leak_claims || return 0
  rm -f -- "$GPUGUARD_STATE_DIR/leak-claim-$LEAK_INSTANCE"
}

# Writes this watcher's claim (see above) on the roots it watches
# this cycle, or removes it when none runs any more (the job ended: nothing
# to leave to it). Written atomically (a random exclusive temporary file,
# renamed: never through a link planted at the name); only a regular file
# is read back.
# Arguments:
#   $1 now (unix seconds)
leak_claim_write() {
  local now=$1 path=$GPUGUARD_STATE_DIR/leak-claim-$LEAK_INSTANCE line pid
  local interval=${LEAK_INTERVAL:-60} cap=$LEAK_CLAIM_MAX_INTERVAL_S
  local -a fields=()
  if ((${#LEAK_ROOT_PIDS[@]} == 0)); then
    rm -f -- "$path"
    return 0
  fi
  # (a regular file only: a FIFO planted at the name would block the read)
  if [[ -f $path && ! -L $path ]]; then
    { read -r -a fields <"$path"; } 2>/dev/null || true
  fi
  # the gap since this watcher's previous cycle is its real interval
  if [[ ${fields[0]:-} =~ ^[0-9]{1,12}$ ]] && ((now > fields[0] && now - fields[0] <= cap && now - fields[0] > interval)); then
    interval=$((now - fields[0]))
  fi
  ((interval <= cap)) || interval=$cap
  line="$now $interval"
  for pid in "${LEAK_ROOT_PIDS[@]}"; do
    line+=" $pid:${GG_PROC_START[$pid]:--}"
  done
  gg_write_atomic "$path" "$line"$'\n' || true
}

# Puts into the associative array named $1 (PID -> instance) the process
# trees that a fresh claim covers (see leak_claim_write), for the --all
# watcher to leave out. A root counts only while it is the same process
# (its start time), so a reused PID is not left out. A stale claim covers
# nothing and is removed (the --all watcher takes the job over again and
# says so once); one that is not a claim's line is removed too, so claims
# do not pile up. The trees left out are said when they change (in a
# --once run, which remembers nothing between runs, at debug level: not a
# line a minute in cron's log).
# shellcheck disable=SC2034,SC2004 # nameref: fills the caller's associative array
leak_claimed_pids_into() {
  local -n claimed_ref=$1
  local path inst now age item pid start said level
  local -a fields tree
  gg_now_into now
  for path in "$GPUGUARD_STATE_DIR"/leak-claim-*; do
    inst=${path##*/leak-claim-}
    # (a name no watcher writes is left to gg_retention)
    [[ -f $path && ! -L $path && $inst =~ ^[A-Za-z0-9_-]+$ ]] || continue
    fields=()
    { read -r -a fields <"$path"; } 2>/dev/null || true
    if [[ ! ${fields[0]:-} =~ ^[0-9]{1,12}$ || ! ${fields[1]:-} =~ ^[0-9]{1,12}$ ]]; then
      rm -f -- "$path"
      continue
    fi
    # a claim from the future (the clock set back) is as old as it is far
    # ahead, so it cannot stay fresh for ever
    age=$((now - fields[0]))
    ((age >= 0)) || age=$((-age))
    if ((age > LEAK_CLAIM_CYCLES * fields[1])); then
      rm -f -- "$path"
      unset "LEAK_CLAIM_SAID[$inst]"
      gg_log info "watching the processes the watcher $inst claimed again: its last cycle was ${age}s ago (its interval ${fields[1]}s)"
      continue
    fi
    said=''
    for item in "${fields[@]:2}"; do
      [[ $item =~ ^([0-9]+):([0-9]+|-)$ ]] || continue
      pid=${BASH_REMATCH[1]} start=${BASH_REMATCH[2]}
      [[ ${GG_PROC_START[$pid]:--} == "$start" ]] || continue
      if [[ -n ${GG_PROC_PPID[$pid]:-} ]]; then
        gg_proc_tree_into "$pid" tree
      else
        tree=("$pid")
      fi
      for pid in "${tree[@]}"; do
        claimed_ref[$pid]=$inst
      done
      said+="${said:+; }PID ${tree[0]} and its tree (${tree[*]})"
    done
    if [[ -n $said && ${LEAK_CLAIM_SAID[$inst]:-} != "$said" ]]; then
      LEAK_CLAIM_SAID[$inst]=$said
      level=info
      ((LEAK_ONCE)) && level=debug
      gg_log "$level" "leaving $said to the watcher $inst, which claims it (its last cycle ${age}s ago)"
    fi
  done
  # a daemon forgets what it said of claims that are gone
  for inst in "${!LEAK_CLAIM_SAID[@]}"; do
    [[ -e $GPUGUARD_STATE_DIR/leak-claim-$inst ]] || unset "LEAK_CLAIM_SAID[$inst]"
  done
  return 0
}

# Puts the watcher's own processes into the associative array named $1
# (PID -> 1), which --match never watches: the watching shell and its
# ancestors (`timeout 5 gpu-leak-watch --match X` would match X in its own
# command line, as would a launcher script), and what the watching shell
# started (the detector, python3 ...gpuguard_leakcheck.py, matched
# --match python; nvidia-smi's loops; sleep). A wrapped job is the
# wrapper's child, not the watching subshell's: it is not among them.
# shellcheck disable=SC2034,SC2004 # nameref: fills the caller's associative array
leak_own_pids_into() {
  local -n own_ref=$1
  local pid=$BASHPID
  local -a tree
  while [[ -n $pid && $pid != 0 && -z ${own_ref[$pid]:-} ]]; do
    own_ref[$pid]=1
    pid=${GG_PROC_PPID[$pid]:-}
  done
  own_ref[$$]=1
  gg_proc_tree_into "$BASHPID" tree
  for pid in "${tree[@]}"; do
    own_ref[$pid]=1
  done
}

# Decides what a cycle does when one device tool failed while the other
# answered (device_sample's SMI_TOOL_FAILED): a watcher that has read
# devices of that kind skips the cycle, as when no tool answers (their
# processes would read as holding nothing: a drop no job made); one that
# never has (a leftover npu-smi on an NVIDIA box) samples what answered.
# Either is logged once until the tool answers again.
# Returns:
#   1 when the cycle is skipped
leak_tool_check() {
  local uuid
  for uuid in "${SMI_UUIDS[@]}"; do
    LEAK_KINDS_SEEN[${SMI_VENDOR[$uuid]:-nvidia}]=1
  done
  if [[ -z ${SMI_TOOL_FAILED:-} ]]; then
    [[ -n ${LEAK_TOOL_SAID:-} ]] && gg_log info "${LEAK_TOOL_SAID%%:*} answers again"
    LEAK_TOOL_SAID=''
    return 0
  fi
  local skip=0
  [[ -n ${LEAK_KINDS_SEEN[$SMI_TOOL_FAILED]:-} ]] && skip=1
  if [[ ${LEAK_TOOL_SAID:-} != "${SMI_TOOL_ERROR%% *}:$skip" ]]; then
    LEAK_TOOL_SAID="${SMI_TOOL_ERROR%% *}:$skip"
    if ((skip)); then
      gg_log error "$SMI_TOOL_ERROR (no leak samples until it answers again)"
    else
      gg_log warn "$SMI_TOOL_ERROR; it has found no device here: left out until it answers"
    fi
  fi
  ((! skip))
}

# One cycle: sample, build the sample lines, run the detector, emit events,
# act, write metrics. Sample lines are tab-separated (python/gpuguard_leak.py
# PROTOCOL): a "T" line per watched tree (GPU memory summed over the tree,
# the free and total memory of its fullest GPU, CPU %, RSS, the PIDs holding
# GPU memory, name, command line) and, when several of its processes hold
# GPU memory (data-parallel ranks), an "M" line per such process with its
# own GPU's figures and its RANK.
# Arguments:
#   $1 now (unix seconds)
leak_cycle() {
  local now=$1
  if ! device_sample; then
    LEAK_FAILS=$((LEAK_FAILS + 1))
    ((LEAK_FAILS == 1)) && gg_log error "$SMI_ERROR (no leak samples until the device tool answers again)"
    return 0
  fi
  ((LEAK_FAILS > 0)) && gg_log info "the device tool answers again after $LEAK_FAILS failed cycles"
  LEAK_FAILS=0
  leak_tool_check || return 0
  # a --match pattern is looked for in every command line, which an exec
  # changes: every process is read then; otherwise only new ones and the
  # watched trees (below)
  if [[ -n $LEAK_MATCH ]]; then
    gg_proc_scan
  else
    gg_proc_update
  fi
  leak_select_roots
  if leak_claims; then
    leak_claim_write "$now"
  fi
  LEAK_ID_RESET=1
  local lines
  leak_samples_into lines "$now"
  lines+=$LEAK_ID_LINES
  LEAK_ID_LINES=''
  leak_cycle_send "$lines"
}

# The second half of a cycle: the sample lines ($1) to the detector, its
# events out, what is kept of ended processes forgotten, the metrics
# written. A series the lines leave out has ended (leak_job_ended_cycle
# sends none).
leak_cycle_send() {
  leak_run_detector "$1"
  # ARCHITECTURE.md, rule 4: events_emit only enqueues; one digest per target a cycle
  events_flush
  leak_forget_gone
  if [[ -n ${GPUGUARD_TEXTFILE_DIR:-} ]]; then
    textfile_write_leak || gg_write_outage || gg_log warn "could not write textfile metrics in $GPUGUARD_TEXTFILE_DIR"
  fi
}

# Reads this cycle's figures of the watched trees' processes: their CPU
# ticks, RSS, name and start time, in one call (gg_proc_update read only
# the processes new since the last cycle), and keeps each tree of more than
# one process in the caller's associative array. A PID not visible here
# (another PID namespace) is a tree of one; so is a process without
# children (no function call for it: these loops run for every watched
# process every cycle).
# Arguments:
#   $1 name of an associative array to fill: root PID -> PIDs of its tree
leak_read_trees_into() {
  local -n trees_ref=$1
  local root
  local -a tree visible=()
  trees_ref=()
  for root in "${LEAK_ROOT_PIDS[@]}"; do
    if [[ -n ${GG_PROC_KIDS[$root]:-} ]]; then
      gg_proc_tree_into "$root" tree
      # shellcheck disable=SC2004,SC2034 # nameref: the caller's associative array
      trees_ref[$root]=${tree[*]}
      visible+=("${tree[@]}")
    elif [[ -n ${GG_PROC_PPID[$root]:-} ]]; then
      visible+=("$root")
    fi
  done
  ((${#visible[@]} == 0)) || gg_proc_read "${visible[@]}"
}

# Builds the cycle's "T" and "M" sample lines (see leak_cycle) of every
# watched tree, and queues the "J" identity lines of trees not named yet.
# Arguments:
#   $1 name of the variable to set to the lines
#   $2 now (unix seconds)
leak_samples_into() {
  local -n samples_ref=$1
  local now=$2
  local samples='' root pid used free total cpu rss key name cmd ticks members mlines mfree mtotal rank uuids prev
  local -a tree holders
  local -A tree_of=()
  leak_gpu_rooms
  leak_read_trees_into tree_of
  for root in "${LEAK_ROOT_PIDS[@]}"; do
    if [[ -n ${tree_of[$root]:-} ]]; then
      # shellcheck disable=SC2206 # PIDs, split at the blanks that joined them
      tree=(${tree_of[$root]})
    else
      tree=("$root")
    fi
    used=0 free='' total='' ticks=0 rss=0 holders=()
    for pid in "${tree[@]}"; do
      used=$((used + ${SMI_PIDS_MEM[$pid]:-0})) ticks=$((ticks + ${GG_PROC_TICKS[$pid]:-0})) rss=$((rss + ${GG_PROC_RSS[$pid]:-0}))
      ((${SMI_PIDS_MEM[$pid]:-0} > 0)) && holders+=("$pid")
      # launchers are on no GPU
      uuids=${SMI_PID_UUIDS[$pid]:-}
      [[ -n $uuids ]] || continue
      [[ $uuids == NPU-* ]] && LEAK_VENDOR[$root]=ascend
      if [[ $uuids == *' '* ]]; then
        leak_gpu_room_into "$pid" mfree mtotal
      else
        # one GPU (nearly always): no function call in this loop
        mfree=${LEAK_GPU_FREE[$uuids]:-} mtotal=${LEAK_GPU_TOTAL[$uuids]:-}
      fi
      if [[ -n $mfree ]] && [[ -z $free || $mfree -lt $free ]]; then
        free=$mfree total=$mtotal
      fi
    done
    cpu=0
    prev=${LEAK_CPU_PREV[$root]:-}
    if [[ -n $prev ]] && ((now > ${prev#* })); then
      cpu=$(((ticks - ${prev% *}) * 100 / LEAK_CLK_TCK / (now - ${prev#* })))
    fi
    LEAK_CPU_PREV[$root]="$ticks $now"
    key="$root-${GG_PROC_START[$root]:-0}"
    name=${GG_PROC_COMM[$root]:-pid$root}
    cmd=''
    # no command line to read for a PID /proc does not show; one read
    # before is kept (the check is leak_cmdline_into's, here without a call)
    if [[ -n ${GG_PROC_PPID[$root]:-} ]]; then
      if [[ ${LEAK_CMDLINE_IDS[$root]:-} == "${GG_PROC_START[$root]:-}-$name" ]]; then
        cmd=${LEAK_CMDLINES[$root]}
      else
        leak_cmdline_into "$root" cmd
      fi
    fi
    cmd=${cmd:-$name}
    # tabs and newlines would break the protocol's fields
    [[ $name$cmd == *[$'\t\n']* ]] && name=${name//[$'\t\n']/ } cmd=${cmd//[$'\t\n']/ }
    members='' mlines=''
    for pid in "${holders[@]}"; do
      members+="${members:+,}$pid"
      ((${#holders[@]} > 1)) || continue
      leak_gpu_room_into "$pid" mfree mtotal
      leak_rank_into "$pid" rank
      mlines+="M"$'\t'"$key/$pid-${GG_PROC_START[$pid]:-0}"$'\t'"$key"$'\t'"$now"$'\t'"$pid"$'\t'"${SMI_PIDS_MEM[$pid]}"$'\t'"$mfree"$'\t'"$mtotal"$'\t'"$rank"$'\n'
    done
    samples+="T"$'\t'"$key"$'\t'"$now"$'\t'"$root"$'\t'"$used"$'\t'"$free"$'\t'"$total"$'\t'"$cpu"$'\t'"$((rss * LEAK_PAGE_KIB / 1024))"$'\t'"$members"$'\t'"$name"$'\t'"$cmd"$'\n'"$mlines"
    # a series is named once, when it first holds GPU memory; its file is
    # looked for again hourly (retention removes files by age)
    if [[ -n ${holders[0]:-} ]] && ((now - ${LEAK_NAMED[$key]:-0} >= LEAK_ID_RECHECK_S)); then
      leak_identity_lines "$key" "$now" "${holders[@]}"
    fi
  done
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  samples_ref=$samples
}

# Forgets what the cycle keeps per process (CPU ticks, ranks, command
# lines, names) for the processes that are gone.
leak_forget_gone() {
  local pid key
  for pid in "${!LEAK_CPU_PREV[@]}"; do
    [[ -n ${GG_PROC_PPID[$pid]:-} ]] || unset "LEAK_CPU_PREV[$pid]"
  done
  for pid in "${!LEAK_RANKS[@]}"; do
    [[ -n ${GG_PROC_PPID[$pid]:-} ]] || unset "LEAK_RANKS[$pid]"
  done
  for pid in "${!LEAK_VENDOR[@]}"; do
    [[ -n ${GG_PROC_PPID[$pid]:-} ]] || unset "LEAK_VENDOR[$pid]"
  done
  for pid in "${!LEAK_CMDLINES[@]}"; do
    [[ -n ${GG_PROC_PPID[$pid]:-} ]] || unset "LEAK_CMDLINES[$pid]" "LEAK_CMDLINE_IDS[$pid]"
  done
  for key in "${!LEAK_NAMED[@]}"; do
    [[ -n ${GG_PROC_PPID[${key%%-*}]:-} || -n ${SMI_PIDS_MEM[${key%%-*}]:-} ]] || unset "LEAK_NAMED[$key]"
  done
}

# Adds to LEAK_ID_LINES an "J" line (python/gpuguard_leak.py PROTOCOL)
# with the identity of a series not named yet: its job as the idle alerts
# name it (jobinfo_json_into: masked command line, user, start, folder,
# Slurm job or container, rank), read from the process holding its GPU
# memory, and one for each rank of a tree of several. A series already
# named in the state folder (a watcher started again, cron --once) costs
# one stat. The few forks of jobinfo_json_into are paid once per series.
# Arguments:
#   $1 the tree's key, $2 now, $3... its processes holding GPU memory
leak_identity_lines() {
  local key=$1 pid job mkey
  LEAK_NAMED[$key]=$2
  shift 2
  leak_identity_known "$key" && return 0
  # what jobinfo read is kept within a cycle only (PIDs are reused)
  if ((LEAK_ID_RESET)); then
    jobinfo_reset
    LEAK_ID_RESET=0
  fi
  jobinfo_json_into "$1" job
  LEAK_ID_LINES+="J"$'\t'"$key"$'\t'"$job"$'\n'
  (($# > 1)) || return 0
  for pid in "$@"; do
    mkey="$key/$pid-${GG_PROC_START[$pid]:-0}"
    jobinfo_json_into "$pid" job
    LEAK_ID_LINES+="J"$'\t'"$mkey"$'\t'"$job"$'\n'
  done
}

# True when the identity file of series $1 exists (written by the detector
# from a "J" line; the name as gpuguard_leak.py's history files).
leak_identity_known() {
  local name=${1//[!0-9A-Za-z_.-]/_}
  [[ -e $GPUGUARD_STATE_DIR/history/$name.job.json ]]
}

# Seconds between two looks for a named series' identity file.
LEAK_ID_RECHECK_S=3600

# Reads each GPU's free and total MiB from the sample into LEAK_GPU_FREE
# and LEAK_GPU_TOTAL (by UUID; none for a GPU whose figures nvidia-smi did
# not give), once per cycle.
leak_gpu_rooms() {
  declare -gA LEAK_GPU_FREE=() LEAK_GPU_TOTAL=()
  local uuid
  for uuid in "${SMI_UUIDS[@]}"; do
    [[ -n ${SMI_MEM_TOTAL[$uuid]:-} && -n ${SMI_MEM_USED[$uuid]:-} ]] || continue
    LEAK_GPU_TOTAL[$uuid]=${SMI_MEM_TOTAL[$uuid]%.*}
    LEAK_GPU_FREE[$uuid]=$((${SMI_MEM_TOTAL[$uuid]%.*} - ${SMI_MEM_USED[$uuid]%.*}))
  done
}

# Puts the free and total MiB of the fullest GPU a PID uses into $2 and $3
# ('' when unknown), from leak_gpu_rooms.
# shellcheck disable=SC2034 # nameref: assigns the caller's variables
leak_gpu_room_into() {
  local -n room_free=$2 room_total=$3
  local uuid
  room_free='' room_total=''
  for uuid in ${SMI_PID_UUIDS[$1]:-}; do
    [[ -n ${LEAK_GPU_FREE[$uuid]:-} ]] || continue
    if [[ -z $room_free ]] || ((LEAK_GPU_FREE[$uuid] < room_free)); then
      room_free=${LEAK_GPU_FREE[$uuid]}
      room_total=${LEAK_GPU_TOTAL[$uuid]}
    fi
  done
  return 0
}

# Puts a process's data-parallel rank into $2: RANK (else LOCAL_RANK) from
# /proc/PID/environ when readable, '' otherwise. Only that value is kept
# (the environment may hold secrets); read once per PID (no fork).
# shellcheck disable=SC2034 # nameref: assigns the caller's variable
leak_rank_into() {
  local -n rank_ref=$2
  if [[ -z ${LEAK_RANKS[$1]+set} ]]; then
    local -a env=()
    local item r='' lr=''
    { mapfile -d '' -t env <"/proc/$1/environ"; } 2>/dev/null || env=()
    for item in "${env[@]}"; do
      case $item in
        RANK=*) r=${item#RANK=} ;;
        LOCAL_RANK=*) lr=${item#LOCAL_RANK=} ;;
      esac
    done
    r=${r:-$lr}
    [[ $r =~ ^[0-9]{1,6}$ ]] || r=''
    LEAK_RANKS[$1]=$r
  fi
  rank_ref=${LEAK_RANKS[$1]}
}

# The detector's settings, passed to its process by gg_python.
LEAK_DETECTOR_VARS="LEAK_INSTANCE LEAK_THRESHOLD_MIB_H LEAK_BUCKET_S LEAK_RULES LEAK_HISTORY_MAX_ROWS LEAK_GPU_TOTAL_MIB LEAK_LOSS_LOG"
# Seconds to wait for the detector's answer before it is taken for hung
# and restarted (a cycle of thousands of series takes well under one).
LEAK_DETECTOR_WAIT_S=300

# Starts the detector (python/gpuguard_leak.py serve) as a coprocess: one
# Python process for the watcher's life instead of one per cycle, which was
# most of a live cycle's CPU (interpreter and imports, ~30 ms). Its pipes
# are close-on-exec, so nothing the watcher starts holds them: when the
# watcher ends, however it ends, the detector reads end of input and exits.
leak_detector_start() {
  # shellcheck disable=SC2034 # LEAK_DETECTOR_PID and the fds are set by coproc
  coproc LEAK_DETECTOR { gg_python --exec gpuguard_leakcheck.py "$LEAK_DETECTOR_VARS" serve; }
  LEAK_DETECTOR_STARTED=1
}

# Ends the detector: closing its input lets it finish the cycle it may be
# in and exit; one that does not answer is killed. Its exit is waited for.
# (Bash itself closes a coprocess's pipes and unsets its variables when it
# reaps one that ended on its own: then there is nothing left to do.)
# Arguments:
#   $1 kill to kill it at once (it did not answer)
leak_detector_stop() {
  local pid=${LEAK_DETECTOR_PID:-} wfd=${LEAK_DETECTOR[1]:-}
  LEAK_DETECTOR_STARTED=0
  [[ -n $pid ]] || return 0
  if [[ ${1:-} == kill ]]; then
    kill -KILL "$pid" 2>/dev/null || true
  fi
  if [[ -n $wfd ]]; then
    exec {wfd}>&- || true
  fi
  wait "$pid" 2>/dev/null || true
  return 0
}

# Sends one cycle's request ($1: the sample lines) to the detector,
# starting it if it is not running; a detector found dead (killed, or
# crashed on the last cycle) is restarted once. SIGPIPE is ignored around
# the write only: a dead reader makes it fail instead of ending the watcher.
leak_detector_send() {
  local _ rc wfd
  for _ in 1 2; do
    wfd=${LEAK_DETECTOR[1]:-}
    if [[ -z $wfd ]]; then
      # bash forgets a coprocess once it has ended on its own
      ((LEAK_DETECTOR_STARTED)) && gg_log warn "the leak detector process had ended; starting it again"
      leak_detector_stop
      leak_detector_start
      wfd=${LEAK_DETECTOR[1]:-}
    fi
    rc=1
    if [[ -n $wfd ]]; then
      trap '' PIPE
      rc=0
      printf '%sE\n' "$1" 1>&"$wfd" 2>/dev/null || rc=1
      trap - PIPE
    fi
    ((rc == 0)) && return 0
    gg_log warn "the leak detector process had ended; starting it again"
    leak_detector_stop kill
  done
  return 1
}

# Feeds the samples to the detector and handles what it prints
# (tab-separated):
#   warn MESSAGE           -> one warning in the log
#   event STATE PID JSON   -> events_emit, then the --on-leak action
#   status PID SLOPE FIRING USED SEVERITY OOM_S NAME -> LEAK_STATUS
#     (by PID, the fields after it), for the textfile metrics: read only
#     when they are written (status lines come after the events)
# A failed cycle (no answer, or "F": the detector said why on stderr) is
# one log line; the next cycle starts a new detector if this one ended.
# shellcheck disable=SC2034 # LEAK_STATUS is read by textfile_write_leak
leak_run_detector() {
  local head='' count='' size='' body='' line kind state pid rest rfd vendor
  local -a reply=()
  if ! leak_detector_send "$1"; then
    gg_log error "leak detector failed (could not start it)"
    return 0
  fi
  # gone when the detector died since (bash closed its pipes)
  rfd=${LEAK_DETECTOR[0]:-}
  if [[ -z $rfd ]] || ! read -r -t "$LEAK_DETECTOR_WAIT_S" -u "$rfd" head count size 2>/dev/null; then
    gg_log error "leak detector failed (no answer)"
    leak_detector_stop kill
    return 0
  fi
  if [[ $head != R || ! $count =~ ^[0-9]+$ || ! $size =~ ^[0-9]+$ ]]; then
    gg_log error "leak detector failed (exit ${count:-?})"
    return 0
  fi
  # written whole right after the header: no deadline needed
  if ! gg_read_bytes_into body "$rfd" "$size"; then
    gg_log error "leak detector failed (a cut answer)"
    leak_detector_stop kill
    return 0
  fi
  smi_lines_into reply "$body"
  LEAK_STATUS=()
  for line in "${reply[@]}"; do
    # fields by expansion, not a here-string per line (no field is empty)
    kind=${line%%$'\t'*} rest=${line#*$'\t'}
    # status lines come after the events and only feed the metrics
    [[ $kind == status && -z ${GPUGUARD_TEXTFILE_DIR:-} ]] && break
    state=${rest%%$'\t'*} rest=${rest#*$'\t'}
    pid=${rest%%$'\t'*} rest=${rest#*$'\t'}
    case $kind in
      event)
        # an NPU's leak says so (the detector knows no device kinds); a
        # tree not seen on a device since this watcher started (resolved,
        # gone) is an NPU's when the box has NPUs only
        vendor=${LEAK_VENDOR[$pid]:-}
        [[ -n $vendor ]] || device_kinds_into vendor
        [[ $vendor == ascend && $rest == *'}' ]] && rest="${rest%'}'},\"vendor\":\"ascend\"}"
        events_emit "$rest"
        gg_log warn "gpu_memory_leak $state: PID $pid"
        if [[ $state == firing ]]; then
          leak_act "$pid"
        fi
        ;;
      # for status lines the second field is the PID
      status) LEAK_STATUS[$state]="$pid"$'\t'"$rest" ;;
      # a problem with an optional input (--loss-log, rules), said once
      warn) gg_log warn "${line#*$'\t'}" ;;
    esac
  done
  return 0
}

# Applies --on-leak to a process tree: notify (nothing more), signal:SIG
# (send SIG to the root), kill (SIGTERM to the tree, SIGKILL after --grace).
leak_act() {
  local root=$1 pid
  local -a tree
  case $LEAK_ACTION in
    notify) return 0 ;;
    signal:*)
      gg_log warn "sending SIG${LEAK_ACTION#signal:} to PID $root (--on-leak)"
      kill -s "${LEAK_ACTION#signal:}" "$root" 2>/dev/null || leak_act_failed "could not signal PID $root" "$root"
      ;;
    kill)
      gg_proc_tree_into "$root" tree
      gg_log warn "stopping PID $root and its tree (${tree[*]}) (--on-leak kill, grace ${LEAK_GRACE}s)"
      if ! kill -TERM "${tree[@]}" 2>/dev/null && [[ ! -O /proc/$root ]] && ((EUID != 0)); then
        # (refused, EPERM: waiting out the grace would change nothing)
        leak_act_failed "could not stop PID $root" "$root"
        return 0
      fi
      local waited=0
      while ((waited < LEAK_GRACE)) && kill -0 "$root" 2>/dev/null; do
        sleep 1
        waited=$((waited + 1))
      done
      for pid in "${tree[@]}"; do
        # (one may end between the two: not an error)
        kill -0 "$pid" 2>/dev/null && { kill -KILL "$pid" 2>/dev/null || true; }
      done
      ;;
  esac
  return 0
}

# Logs that --on-leak could not act on PID $2 ($1: what failed), and why
# when it is another user's process (the kernel's EPERM): without it the log
# said "stopping PID ..." and nothing happened, with no error.
leak_act_failed() {
  if [[ -e /proc/$2 && ! -O /proc/$2 ]] && ((EUID != 0)); then
    gg_log error "$1: not permitted, it belongs to another user (--on-leak needs root or the process's owner)"
  else
    gg_log error "$1"
  fi
}

# Refuses (one line, exit 2) --on-leak kill or signal:NAME against a --pid
# target that belongs to another user when we are not root: the kernel
# refuses the signal (EPERM), so the user would be promised an action that
# cannot happen. Refused rather than warned: the user named that process,
# and a watcher that can only notify is what --on-leak notify is for.
# (--all and --match pick their processes as they come: a refusal is
# logged when the action fails, by leak_act_failed.)
leak_action_check() {
  local pid
  [[ $LEAK_ACTION != notify ]] && ((EUID != 0)) || return 0
  for pid in "${LEAK_PIDS[@]}"; do
    [[ -e /proc/$pid && ! -O /proc/$pid ]] || continue
    gg_usage_error "--on-leak $LEAK_ACTION cannot act on PID $pid: it belongs to another user (run as root or as its owner, or use --on-leak notify)"
    return
  done
  return 0
}

# Applies one option that takes a value. Values meant for the Python helper
# wait in LEAK_OPT_ENV until leak_apply_options: a wrapped job is started
# first and must see the user's environment, not the watcher's settings.
#
# A number is checked here against the same range as the configuration's
# (gg_number_into: at most 10^15), so a value out of range is the user's
# typo, said in one line naming the flag before a wrapped job starts;
# checked only by config_load it failed after the job had started, which
# then ran unwatched, and the line named LEAK_INTERVAL, not --interval.
leak_option() {
  local number shown
  case $1 in
    --interval | --grace | --gpu-total-mib | --bucket)
      if ! gg_number_into number "$2" int 1; then
        gg_shown_into shown "$2" 40
        gg_usage_error "$1 needs a whole number of at least 1 (at most 10^15) (got $shown)" || return
      fi
      [[ $1 == --interval ]] && LEAK_OPT_ENV[LEAK_INTERVAL]=$number
      [[ $1 == --grace ]] && LEAK_GRACE=$number
      [[ $1 == --gpu-total-mib ]] && LEAK_OPT_ENV[LEAK_GPU_TOTAL_MIB]=$number
      [[ $1 == --bucket ]] && LEAK_OPT_ENV[LEAK_BUCKET_S]=$number
      ;;
    --threshold)
      if ! gg_number_into number "$2" dec 0; then
        gg_shown_into shown "$2" 40
        gg_usage_error "--threshold needs MiB per hour, a decimal number from 0 to 10^15 (got $shown)" || return
      fi
      LEAK_OPT_ENV[LEAK_THRESHOLD_MIB_H]=$number
      ;;
    --rules | --loss-log | --config | --replay)
      # an empty one (--config="$UNSET") was taken as none given: the
      # default file read without a word, or "say what to watch"
      # `--rules --once` read "--once" as the rules file: an option where
      # the file should be is said as such
      config_file_value_check "$1" '' "$2" || return
      case $1 in
        --rules) LEAK_OPT_ENV[LEAK_RULES]=$2 ;;
        --loss-log) LEAK_OPT_ENV[LEAK_LOSS_LOG]=$2 ;;
        --config) LEAK_OPT_ENV[GPUGUARD_CONFIG]=$2 ;;
      esac
      ;;
    --on-leak)
      [[ $2 == notify || $2 == kill || $2 =~ ^signal:[A-Z0-9]+$ ]] ||
        gg_usage_error "--on-leak takes notify, kill or signal:NAME (got '$2')" || return
      LEAK_ACTION=$2
      if [[ $2 == signal:* ]]; then
        # said now, not when the leak comes ("could not signal PID")
        leak_signal_name_into LEAK_ACTION "${2#signal:}" ||
          gg_usage_error "--on-leak $2: no such signal (kill -l lists them)" || return
        LEAK_ACTION=signal:$LEAK_ACTION
      fi
      ;;
  esac
  return 0
}

# Puts the name of signal $2 (a name, with or without SIG, or a number)
# into the variable named $1: USR1 for USR1, SIGUSR1 or 10.
# Returns:
#   1 when it is no signal that kill can send (0, EXIT, FOO, 99, 137)
# shellcheck disable=SC2034 # nameref: assigns the caller's variable
leak_signal_name_into() {
  local -n signal_ref=$1
  local sig=${2#SIG} other
  other=$(kill -l "$sig" 2>/dev/null) || return 1
  if [[ $sig =~ ^[0-9]{1,2}$ ]]; then
    # a number names a signal from 1 to 64 (kill -l also turns exit
    # statuses such as 137 into names; 32 and 33 have none)
    ((10#$sig >= 1 && 10#$sig <= 64)) && [[ -n $other ]] || return 1
    signal_ref=$other
  else
    [[ $other =~ ^[0-9]+$ ]] && ((other >= 1 && other <= 64)) || return 1
    signal_ref=$sig
  fi
}

# Sets the option values collected by leak_option, before config_load so
# that they override the config file as the environment does.
leak_apply_options() {
  local name
  # shell variables, not exports: config_load takes a set variable as the
  # environment's value, and gg_python passes on only what a helper needs
  for name in "${!LEAK_OPT_ENV[@]}"; do
    printf -v "$name" '%s' "${LEAK_OPT_ENV[$name]}"
  done
}

# Names this watcher (ARCHITECTURE.md, rule 6) into LEAK_INSTANCE: job-<wrapper pid>,
# all, match-<cksum of the pattern>, slurm-<job id>, pid-<pid> or
# pids-<cksum of the list>. Each instance has its own lock
# ($GPUGUARD_STATE_DIR/leak-$LEAK_INSTANCE.lock) and detector state, so
# several wrapped jobs and one --all daemon can share a box.
# Arguments:
#   $1 1 when a job is wrapped, $2 the Slurm job ID or ''
leak_instance_name() {
  local sum
  if (($1)); then
    LEAK_INSTANCE=job-$$
  elif ((LEAK_ALL)); then
    LEAK_INSTANCE=all
  elif [[ -n $LEAK_MATCH ]]; then
    sum=$(printf '%s' "$LEAK_MATCH" | cksum)
    LEAK_INSTANCE=match-${sum%% *}
  elif [[ -n $2 ]]; then
    LEAK_INSTANCE=slurm-$2
  elif ((${#LEAK_PIDS[@]} == 1)); then
    LEAK_INSTANCE=pid-${LEAK_PIDS[0]}
  else
    sum=$(printf '%s\n' "${LEAK_PIDS[@]}" | sort -n | cksum)
    LEAK_INSTANCE=pids-${sum%% *}
  fi
}

# Takes this instance's lock; returns 1 (the holder logged by gg_lock) when
# another watcher of the same instance runs on this state folder. With the
# log in a file, the refusal is also said on stderr, where the user looks.
leak_lock() {
  local rc=0
  LEAK_LOCK_FILE=$GPUGUARD_STATE_DIR/leak-$LEAK_INSTANCE.lock
  gg_lock "$LEAK_LOCK_FILE" || rc=$?
  # 0: ours; 2: a planted link, refused in one line by gg_lock
  ((rc == 1)) || return "$rc"
  if [[ -n ${GPUGUARD_LOG:-} ]]; then
    printf '%s: another gpu-leak-watch (%s) already runs on %s (see %s)\n' \
      "$GG_PROG" "$LEAK_INSTANCE" "$GPUGUARD_STATE_DIR" "$GPUGUARD_LOG" >&2
  fi
  return 1
}

# Removes the lock files, the detector state and the metrics file of a
# wrapped job's instance once its watcher has stopped: the name is used once (the
# wrapper's PID), so leaving them would grow the state folder forever.
# Nothing needs the state after the job: its history and identity stay in
# history/ for `report` (pruned by gg_retention), and `status` lists the
# job as ended once no state holds its series (as a daemon's detector
# forgets a process that ended).
leak_unlock_job() {
  [[ $LEAK_INSTANCE == job-* && -n $LEAK_LOCK_FILE ]] || return 0
  rm -f -- "$LEAK_LOCK_FILE" "$LEAK_LOCK_FILE.pid" "$GPUGUARD_STATE_DIR/leak-state-$LEAK_INSTANCE.json"
  # its metrics file too: the job's series end with it (a daemon's stays)
  textfile_remove_leak
}

# Removes the lock files and detector states of wrapped jobs whose wrapper
# was killed before it could, so they do not pile up. They are named after
# the wrapper's PID: no such process, no owner. (Taking the lock to test it
# would make a starting wrapper's own gg_lock fail.)
leak_sweep_jobs() {
  local path pid
  for path in "$GPUGUARD_STATE_DIR"/leak-job-*.lock; do
    pid=${path##*/leak-job-}
    pid=${pid%.lock}
    [[ $pid =~ ^[0-9]+$ && ! -d /proc/$pid ]] || continue
    rm -f -- "$path" "$path.pid"
  done
  for path in "$GPUGUARD_STATE_DIR"/leak-state-job-*.json; do
    pid=${path##*/leak-state-job-}
    pid=${pid%.json}
    [[ $pid =~ ^[0-9]+$ && ! -d /proc/$pid ]] || continue
    rm -f -- "$path"
  done
  return 0
}

# Records which of SIGINT (2) and SIGQUIT (3) the caller left ignored, from
# this shell's SigIgn mask; call before any trap. Bash starts background
# commands with both ignored; the job gets them back unless the caller had
# ignored them too, so it behaves as if run directly.
leak_read_ignored_signals() {
  LEAK_IGNORED_AT_START=0
  if gg_signal_ignored 2; then
    LEAK_IGNORED_AT_START=$((LEAK_IGNORED_AT_START | 2))
  fi
  if gg_signal_ignored 3; then
    LEAK_IGNORED_AT_START=$((LEAK_IGNORED_AT_START | 4))
  fi
  return 0
}

# Notes which configuration and option variables the user's environment
# has, before config_load and leak_apply_options set them, so
# that the job gets the user's environment back (no watcher settings, no
# secrets read from a file).
leak_env_snapshot() {
  local name
  config_define
  declare -gA LEAK_USER_ENV=()
  declare -ga LEAK_ENV_NAMES=("${!GG_CONFIG_DEFAULT[@]}" "${!LEAK_OPT_ENV[@]}")
  for name in "${LEAK_ENV_NAMES[@]}"; do
    [[ -z ${!name+set} ]] || LEAK_USER_ENV[$name]=${!name}
  done
}

# Starts the job in its own session and process group (setsid), with the
# user's stdin, stdout, stderr and environment, into LEAK_JOB_PID. Its own
# group means a Ctrl-C at the terminal reaches the wrapper only, which
# passes it on once; its own session (no controlling terminal) means it can
# still read the terminal on stdin without being stopped as a background
# group. Bash starts background commands with INT and QUIT ignored: they
# are reset unless the caller had them ignored too.
leak_job_start() {
  local -a reset=()
  ((LEAK_IGNORED_AT_START & 2)) || reset+=(INT)
  ((LEAK_IGNORED_AT_START & 4)) || reset+=(QUIT)
  local -a session=(setsid --)
  if ! command -v setsid >/dev/null; then
    session=()
    LEAK_JOB_OWN_GROUP=0
    gg_log warn "setsid not found: the job shares the wrapper's process group"
  fi
  (
    local name
    local -a restore=()
    for name in "${LEAK_ENV_NAMES[@]}"; do
      unset "$name"
      # the user's own values come back (nothing of the watcher's); secrets
      # never reach the job, even ones the user exported
      if [[ -n ${LEAK_USER_ENV[$name]+set} && ! $name =~ ^($GG_SECRET_KEYS)$ ]]; then
        restore+=("$name=${LEAK_USER_ENV[$name]}")
      fi
    done
    ((${#reset[@]} == 0)) || trap - "${reset[@]}"
    local lock_fd=${GG_LOCK_FD:-1023}
    exec env "${restore[@]}" "${session[@]}" "$@" {lock_fd}>&- {LEAK_STDERR}>&-
  ) <&0 2>&"$LEAK_STDERR" &
  LEAK_JOB_PID=$!
  LEAK_PIDS+=("$LEAK_JOB_PID")
  if [[ -n $LEAK_PENDING_SIGNAL ]]; then
    leak_job_send "$LEAK_PENDING_SIGNAL"
  fi
}

# Trap handler: passes signal $1 on to the job's process group. A signal
# that comes before the job was started waits in LEAK_PENDING_SIGNAL for
# leak_job_start.
leak_job_forward() {
  LEAK_JOB_SIGNALLED=1
  LEAK_LAST_SIGNAL=$1
  if [[ -z $LEAK_JOB_PID ]]; then
    LEAK_PENDING_SIGNAL=$1
    return 0
  fi
  leak_job_send "$1"
}

# Sends signal $1 to the job's process group (to the job alone without
# one). Between fork and setsid bash still ignores INT and QUIT in the job,
# so the signal waits until the job has made its group (milliseconds; at
# most about 5 s, then it goes to the job as it is).
leak_job_send() {
  local tries=0
  while ! leak_job_grouped && leak_job_running && ((tries < 100)); do
    sleep 0.05
    tries=$((tries + 1))
  done
  gg_log info "passing SIG$1 on to job PID $LEAK_JOB_PID"
  kill -s "$1" -- "-$LEAK_JOB_PID" 2>/dev/null || kill -s "$1" "$LEAK_JOB_PID" 2>/dev/null || true
}

# True when the job can take a signal as the command would: it leads its
# own process group (setsid is done), or it never gets one (no setsid).
leak_job_grouped() {
  ((LEAK_JOB_OWN_GROUP)) || return 0
  local -a fields
  gg_proc_stat_into "/proc/$LEAK_JOB_PID/stat" fields || return 1
  # field 5: its process group
  [[ ${fields[4]} == "$LEAK_JOB_PID" ]]
}

# Trap handler for SIGTSTP (Ctrl-Z at the terminal): stops the job's group,
# then the wrapper, as a shell's job would stop. SIGSTOP, because the kernel
# drops SIGTSTP sent to a group in another session (orphaned) that keeps
# the default action. The SIGCONT of fg or bg resumes the wrapper right
# here, and the job's group with it. SIGCONT has no trap of its own: a
# terminal that hangs up sends SIGHUP and SIGCONT together, and bash,
# waiting for the job, runs the trap of the one delivered last and drops
# the other (its handler jumps out of the wait with the first one's
# frame still stacked), so a CONT trap cost the job its SIGHUP.
leak_job_suspend() {
  LEAK_JOB_SIGNALLED=1
  if [[ -n $LEAK_JOB_PID ]]; then
    kill -STOP -- "-$LEAK_JOB_PID" 2>/dev/null || kill -STOP "$LEAK_JOB_PID" 2>/dev/null || true
  fi
  kill -STOP $$
  if [[ -n $LEAK_JOB_PID ]]; then
    kill -CONT -- "-$LEAK_JOB_PID" 2>/dev/null || kill -CONT "$LEAK_JOB_PID" 2>/dev/null || true
  fi
}

# True while the job has not ended (or ended and was not reaped yet).
leak_job_running() {
  kill -0 "$LEAK_JOB_PID" 2>/dev/null
}

# Says in LEAK_UNWATCHED why the watcher cannot work beside a job (empty
# when it can): state folder, python3, nvidia-smi, rules file. Run before
# the job starts, so the warning comes first and always.
leak_job_watch_check() {
  local said=''
  LEAK_UNWATCHED=''
  if ! said=$(gg_state_dir_init 2>&1); then
    LEAK_UNWATCHED="the state folder $GPUGUARD_STATE_DIR is not writable"
  elif ! command -v python3 >/dev/null; then
    LEAK_UNWATCHED="python3 is not installed"
  elif ! smi_available && ! npu_available; then
    LEAK_UNWATCHED="$NVIDIA_SMI is not installed"
  elif [[ -n $LEAK_RULES && ! (-f $LEAK_RULES && -r $LEAK_RULES) ]]; then
    LEAK_UNWATCHED="cannot read rules file $LEAK_RULES"
  elif ! leak_settings_problem_into LEAK_UNWATCHED || ! leak_rules_problem_into LEAK_UNWATCHED; then
    # (watched without its rules, a job the user exempted could be killed
    # by --on-leak kill)
    :
  else
    leak_sweep_jobs
  fi
  if [[ -n $LEAK_PENDING_SIGNAL ]]; then
    # Ctrl-C while starting reached the checks' helpers too (stat, python3:
    # the terminal signals its whole foreground group), so what they said
    # ("owned by uid ?", a traceback) is not so; the job gets the signal
    LEAK_UNWATCHED="interrupted by SIG$LEAK_PENDING_SIGNAL while starting"
  elif [[ -n $said ]]; then
    printf '%s\n' "$said" >&2
  fi
  return 0
}

# Checks the detector's settings that only the environment can give beside
# the options (LEAK_BUCKET_S, LEAK_GPU_TOTAL_MIB: --bucket and
# --gpu-total-mib check theirs): a bucket of 0 or "abc" failed every cycle.
# Arguments:
#   $1 name of the variable to set to the problem ('' when none)
# Returns:
#   1 when one is not a whole number of at least 1
# shellcheck disable=SC2034 # nameref: assigns the caller's variable (value: the check's output, unused)
leak_settings_problem_into() {
  local -n settings_ref=$1
  local name value shown
  settings_ref=''
  for name in LEAK_BUCKET_S LEAK_GPU_TOTAL_MIB; do
    [[ -n ${!name:-} ]] || continue
    gg_number_into value "${!name}" int 1 '' && continue
    gg_shown_into shown "${!name}" 40
    settings_ref="$name must be a whole number of at least 1 (got $shown)"
    return 1
  done
  return 0
}

# Checks the rules file (LEAK_RULES) with the detector's own parser, so
# that a bad line is said once at start rather than failing every cycle.
# Arguments:
#   $1 name of the variable to set to "FILE:LINE: why" ('' when good)
# Returns:
#   1 when the file is not a good rules file
leak_rules_problem_into() {
  local -n problem_ref=$1
  problem_ref=''
  # (without python3 there is no detector either: its cycle says so)
  [[ -n $LEAK_RULES ]] && command -v python3 >/dev/null || return 0
  problem_ref=$(gg_python gpuguard_leak.py "" rules "$LEAK_RULES" 2>&1) && problem_ref='' && return 0
  # the detector's line, without its "gpu-leak-watch: "
  problem_ref=${problem_ref%%$'\n'*}
  problem_ref=${problem_ref#"$GG_PROG: "}
  problem_ref=${problem_ref:-"cannot check rules file $LEAK_RULES"}
  return 1
}

# The watcher beside a wrapped job, run as a background subshell so that
# nothing in it (a failing cycle included) can cost the job or its exit
# status: a cycle every LEAK_INTERVAL until the wrapper sends SIGTERM after
# the job ended.
leak_job_watch() {
  local stop=0 sleeper='' now
  trap leak_stop_caught TERM
  trap '' INT QUIT HUP
  trap 'leak_job_watch_ended $?' EXIT
  if ! leak_lock; then
    gg_log warn "not watching job PID $LEAK_JOB_PID for leaks: another watcher holds its lock (the job runs normally)"
    LEAK_WATCH_DONE=1
    return 0
  fi
  config_warn_secrets_unreadable
  leak_probe_system
  if ((stop)) || ! leak_job_running; then
    LEAK_WATCH_DONE=1
    return 0
  fi
  gg_log info "watching job PID $LEAK_JOB_PID ($LEAK_INSTANCE) every ${LEAK_INTERVAL}s, threshold ${LEAK_THRESHOLD_MIB_H} MiB/h"
  smi_stream_begin "$LEAK_INTERVAL"
  while ((! stop)) && leak_job_running; do
    gg_now_into now
    if [[ ! -d $GPUGUARD_STATE_DIR ]] && ! gg_state_dir_recreate "$LEAK_LOCK_FILE"; then
      gg_log error "not watching job PID $LEAK_JOB_PID for leaks any more: the state folder is gone (the job runs on)"
      break
    fi
    leak_cycle "$now"
    gg_retention_maybe || true
    ((stop)) && break
    leak_nap
  done
  smi_stream_end
  leak_job_ended_cycle
  leak_detector_stop
  LEAK_WATCH_DONE=1
  return 0
}

# Once the job has ended, tells the detector so with one cycle that holds
# no samples: it resolves an alert still firing (reason "gone") and the
# metrics drop the job, as a daemon's cycle does when a watched process
# ends. Without it the wrapper stopped its watcher and the alert stayed
# firing for ever. Nothing is asked of nvidia-smi, and a job that ended
# before the first cycle starts no detector.
leak_job_ended_cycle() {
  ((LEAK_DETECTOR_STARTED)) || return 0
  leak_job_running && return 0
  leak_cycle_send ''
}

# EXIT trap of leak_job_watch: a watcher that ends before the wrapper asked
# (a failed cycle) says so; the job goes on unwatched.
leak_job_watch_ended() {
  ((LEAK_WATCH_DONE)) && return 0
  gg_log warn "the leak watcher stopped (status $1); job PID $LEAK_JOB_PID runs on unwatched"
}

# Runs a job under the watcher and returns its exit status: its code, 127
# not found, 126 not executable, 128+N killed by signal N. INT, TERM, HUP
# and QUIT reaching the wrapper go to the job's process group, and the
# wrapper waits for the job. Interrupted by SIGINT and ended by it, the
# wrapper ends by SIGINT too, so a calling shell loop stops as it would with
# the job run directly.
# Arguments:
#   the command and its arguments
leak_job_main() {
  local rc=0 again sig watcher=''
  gg_command_check "$1" || return
  leak_read_ignored_signals
  for sig in INT TERM HUP QUIT; do
    # shellcheck disable=SC2064 # the signal name is fixed now, on purpose
    trap "leak_job_forward $sig" "$sig"
  done
  trap leak_job_suspend TSTP
  # the configuration is read first: once the job runs, the wrapper only
  # waits (a job killed by a signal while the shell runs something else
  # gets bash's "Killed" notice printed)
  leak_env_snapshot
  leak_apply_options
  if config_load; then
    leak_job_watch_check
  else
    LEAK_UNWATCHED="the configuration could not be loaded"
  fi
  # From the job's start until the wrapper waits for it, the wrapper's own
  # stderr is /dev/null; the job, the watcher and the log (GG_LOG_FD) get
  # the real one. A job ended by a signal the wrapper cannot trap (SIGKILL)
  # before the wait is reaped by bash on its SIGCHLD, and bash then prints
  # "PID Killed ( ...the job's subshell source... )" on the shell's stderr
  # before its next command: on the user's terminal, mid-start.
  exec {LEAK_STDERR}>&2 2>/dev/null
  # shellcheck disable=SC2034 # read by gg_log (lib/common.sh)
  GG_LOG_FD=$LEAK_STDERR
  leak_job_start "$@"
  gg_log info "started job PID $LEAK_JOB_PID: $1"
  if [[ -z $LEAK_UNWATCHED ]]; then
    leak_instance_name 1 ''
    LEAK_LOCK_FILE=$GPUGUARD_STATE_DIR/leak-$LEAK_INSTANCE.lock
    # (its stderr is the real one; the descriptor the wrapper's log lines
    # use meanwhile is closed there, so it logs to its stderr)
    GG_LOG_FD=2 leak_job_watch 2>&"$LEAK_STDERR" {LEAK_STDERR}>&- &
    watcher=$!
  else
    gg_log warn "not watching job PID $LEAK_JOB_PID for leaks: $LEAK_UNWATCHED (the job runs normally)"
  fi
  unset GG_LOG_FD
  exec 2>&"$LEAK_STDERR" {LEAK_STDERR}>&-
  while :; do
    LEAK_JOB_SIGNALLED=0
    rc=0
    wait "$LEAK_JOB_PID" 2>/dev/null || rc=$?
    # no signal came: wait returned because the job ended
    ((LEAK_JOB_SIGNALLED)) || break
    leak_job_running && continue
    # the job ended around a signal: was rc its status, or did the signal
    # interrupt wait? A second wait tells (127: the status was taken)
    again=0
    wait "$LEAK_JOB_PID" 2>/dev/null || again=$?
    ((again == 127)) || rc=$again
    break
  done
  gg_log info "job PID $LEAK_JOB_PID ended with status $rc"
  if [[ -n $watcher ]]; then
    kill -TERM "$watcher" 2>/dev/null || true
    wait "$watcher" 2>/dev/null || true
    leak_unlock_job
  fi
  trap - INT TERM HUP QUIT TSTP
  if [[ $LEAK_LAST_SIGNAL == INT ]] && ((rc == 130)); then
    kill -INT $$
  fi
  return "$rc"
}

# The watch loops' (leak_job_watch, leak_watch_loop) trap for a stop: sets
# their local `stop` and ends the sleep between cycles if one runs (their
# local `sleeper`, seen here as the loop is the function running). A stop
# that came between the loop's check of `stop` and its wait would not cut
# that wait short: the sleep is ended instead.
leak_stop_caught() {
  stop=1
  [[ -z ${sleeper:-} ]] || kill "$sleeper" 2>/dev/null || true
}

# The watch loops' sleep of LEAK_INTERVAL between cycles, cut short by a
# stop (leak_stop_caught); none when the stop came before the sleep's PID
# was known. Uses the calling loop's `stop` and `sleeper`.
leak_nap() {
  sleep "$LEAK_INTERVAL" {GG_LOCK_FD}>&- &
  sleeper=$!
  if ((stop)); then
    kill "$sleeper" 2>/dev/null || true
  else
    wait "$sleeper" || true
  fi
  sleeper=''
}

# Samples until stopped (daemon mode: --pid, --match, --all, --slurm-job).
leak_watch_loop() {
  local stop=0 sleeper='' now
  trap leak_stop_caught TERM INT HUP
  gg_log info "watching every ${LEAK_INTERVAL}s, threshold ${LEAK_THRESHOLD_MIB_H} MiB/h"
  if [[ -n $LEAK_MATCH ]]; then
    gg_log info "watching processes whose command line matches '$LEAK_MATCH'"
  fi
  smi_stream_begin "$LEAK_INTERVAL"
  while ((! stop)); do
    now=$(gg_now)
    if [[ ! -d $GPUGUARD_STATE_DIR ]] && ! gg_state_dir_recreate "$LEAK_LOCK_FILE"; then
      smi_stream_end
      leak_detector_stop
      gg_log error "stopped: the state folder $GPUGUARD_STATE_DIR could not be made again"
      return 1
    fi
    leak_cycle "$now"
    gg_retention_maybe || true
    leak_match_notice "$now"
    if leak_all_targets_gone; then
      gg_log info "every watched process has ended; stopping"
      smi_stream_end
      leak_detector_stop
      return 0
    fi
    leak_nap
  done
  smi_stream_end
  leak_detector_stop
  leak_claim_drop
  gg_log info "stopped"
  return 0
}

# With --match: says when nothing matches (at once, then every
# LEAK_MATCH_NOTICE_S seconds) and when matching processes appear, so a
# pattern that never matches does not wait in silence.
# Arguments:
#   $1 now (unix seconds)
leak_match_notice() {
  local now=$1
  [[ -n $LEAK_MATCH ]] || return 0
  if ((${#LEAK_ROOT_PIDS[@]} > 0)); then
    if ((LEAK_MATCH_WAIT_SINCE != 0 || LEAK_MATCH_NOTICE_AT == 0)); then
      gg_log info "found ${#LEAK_ROOT_PIDS[@]} process(es) matching '$LEAK_MATCH': PID ${LEAK_ROOT_PIDS[*]}"
    fi
    LEAK_MATCH_WAIT_SINCE=0
    LEAK_MATCH_NOTICE_AT=$now
    return 0
  fi
  if ((LEAK_MATCH_WAIT_SINCE == 0)); then
    LEAK_MATCH_WAIT_SINCE=$now
    LEAK_MATCH_NOTICE_AT=$now
    gg_log info "no process matches '$LEAK_MATCH' yet; waiting for one (checking every ${LEAK_INTERVAL}s)"
  elif ((now - LEAK_MATCH_NOTICE_AT >= ${LEAK_MATCH_NOTICE_S:-300})); then
    LEAK_MATCH_NOTICE_AT=$now
    gg_log info "still waiting for a process matching '$LEAK_MATCH' ($(((now - LEAK_MATCH_WAIT_SINCE) / 60)) min so far)"
  fi
  return 0
}

# Checks the --pid targets at start: when none of them exists (a typo)
# it says so and returns 2, rather than a first cycle that finds nothing
# and a "stopping" that looks like success; one missing among others is a
# warning. Existing means /proc shows it, as for leak_all_targets_gone.
# Targets this instance watched before (its state file is there) are not
# checked: cron's --once run after the job ended resolves its alerts.
leak_pids_check() {
  local pid
  local -a gone=() here=()
  [[ ! -e $GPUGUARD_STATE_DIR/leak-state-$LEAK_INSTANCE.json ]] || return 0
  for pid in "${LEAK_PIDS[@]}"; do
    if [[ -d /proc/$pid && $pid != 0* ]]; then
      here+=("$pid")
    else
      gone+=("$pid")
    fi
  done
  ((${#gone[@]})) || return 0
  if ((${#here[@]} == 0)); then
    gg_usage_error "--pid ${gone[*]}: no such process"
    return
  fi
  gg_log warn "--pid ${gone[*]}: no such process; watching PID ${here[*]}"
}

# True when only --pid targets are watched and none of them runs any more
# (their series were closed by the cycle that just ran).
leak_all_targets_gone() {
  ((${#LEAK_PIDS[@]} > 0 && LEAK_ALL == 0)) || return 1
  [[ -z $LEAK_MATCH ]] || return 1
  local pid
  for pid in "${LEAK_PIDS[@]}"; do
    [[ -d /proc/$pid ]] && return 1
  done
  return 0
}

# True when $1 is a valid extended regular expression for bash's =~ (the
# matcher leak_select_roots uses): [[ =~ ]] returns 2 on a bad pattern.
leak_regex_ok() {
  # shellcheck disable=SC2319 # $? of the test is the point: 2 = bad pattern
  [[ '' =~ $1 ]] || (($? != 2))
}

# Reads the clock tick rate and page size once.
leak_probe_system() {
  LEAK_CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)
  LEAK_PAGE_KIB=$(($(getconf PAGESIZE 2>/dev/null || echo 4096) / 1024))
}

# Resolves a Slurm job to its PIDs on this node (scontrol listpids) and adds
# them as watched roots. A job on another node is a clear error naming the
# command to run there.
leak_slurm_resolve() {
  local job=$1 info nodes node here
  if ! command -v scontrol >/dev/null; then
    gg_usage_error "--slurm-job needs Slurm's scontrol, which is not on PATH here"
    return
  fi
  info=$(scontrol show job -o "$job" 2>&1) || {
    gg_usage_error "scontrol show job $job: ${info%%$'\n'*}"
    return
  }
  nodes=$(sed -n 's/.* NodeList=\([^ ]*\).*/\1/p' <<<"$info")
  [[ -n $nodes && $nodes != '(null)' ]] || {
    gg_usage_error "Slurm job $job has no nodes yet ($(sed -n 's/.*JobState=\([^ ]*\).*/\1/p' <<<"$info"))"
    return
  }
  # node[07-08,10] -> node07; a,b -> a
  node=${nodes%%,*}
  if [[ $nodes =~ ^([^[,]*)\[([0-9]+) ]]; then
    node=${BASH_REMATCH[1]}${BASH_REMATCH[2]}
  fi
  here=$(hostname -s 2>/dev/null || uname -n)
  if [[ $node != "$here" && $node != "${GPUGUARD_HOST:-}" ]]; then
    gg_usage_error "Slurm job $job runs on $node, not here ($here): run there: ssh $node gpu-leak-watch --slurm-job $job"
    return
  fi
  local pid rest count=0
  while read -r pid rest; do
    [[ $pid =~ ^[0-9]+$ ]] || continue
    LEAK_PIDS+=("$pid")
    count=$((count + 1))
  done < <(scontrol listpids "$job" 2>/dev/null)
  ((count > 0)) || {
    gg_usage_error "scontrol listpids $job shows no process of the job on $here"
    return
  }
  gg_log info "Slurm job $job on $node: watching $count processes"
}
