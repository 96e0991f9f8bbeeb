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
  declare -gA LEAK_CPU_PREV=() LEAK_STATUS=() LEAK_CMDLINES=() LEAK_RANKS=()
  declare -g LEAK_MATCH='' LEAK_ALL=0 LEAK_FAILS=0 LEAK_ACTION=notify LEAK_GRACE=30
  LEAK_CLK_TCK=100
  LEAK_PAGE_KIB=4
}

# Reads /proc/PID/cmdline with NULs turned into spaces, into $2 (no fork);
# each PID is read once a cycle (leak_cycle empties LEAK_CMDLINES).
# shellcheck disable=SC2034 # nameref: assigns the caller's variable
leak_cmdline_into() {
  local -n cmd_ref=$2
  if [[ -z ${LEAK_CMDLINES[$1]+set} ]]; then
    local -a parts=()
    { mapfile -d '' -t parts <"/proc/$1/cmdline"; } 2>/dev/null || parts=()
    LEAK_CMDLINES[$1]="${parts[*]}"
  fi
  cmd_ref=${LEAK_CMDLINES[$1]}
}

# Picks the processes to watch this cycle into LEAK_ROOT_PIDS.
# Globals:
#   LEAK_PIDS (from --pid or the started job), LEAK_MATCH, LEAK_ALL
leak_select_roots() {
  LEAK_ROOT_PIDS=()
  local pid cmd parent_cmd
  if ((LEAK_ALL)); then
    # every compute process; also those whose PID this namespace cannot see
    for pid in "${!SMI_PIDS_MEM[@]}"; do
      LEAK_ROOT_PIDS+=("$pid")
    done
  elif [[ -n $LEAK_MATCH ]]; then
    for pid in "${!GG_PROC_PPID[@]}"; do
      ((pid == $$ || pid == BASHPID)) && continue
      leak_cmdline_into "$pid" cmd
      [[ $cmd =~ $LEAK_MATCH ]] || continue
      # keep only the topmost match: its tree holds the others
      leak_cmdline_into "${GG_PROC_PPID[$pid]}" parent_cmd
      [[ $parent_cmd =~ $LEAK_MATCH ]] && continue
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
  if ! smi_sample; then
    LEAK_FAILS=$((LEAK_FAILS + 1))
    ((LEAK_FAILS == 1)) && gg_log error "$SMI_ERROR (no leak samples until nvidia-smi answers again)"
    return 0
  fi
  ((LEAK_FAILS > 0)) && gg_log info "nvidia-smi answers again after $LEAK_FAILS failed cycles"
  LEAK_FAILS=0
  gg_proc_scan
  LEAK_CMDLINES=()
  leak_select_roots
  local samples='' root pid used free total cpu rss key name cmd ticks members mlines mfree mtotal rank
  local -a tree holders
  for root in "${LEAK_ROOT_PIDS[@]}"; do
    # a PID not visible here (another PID namespace) is a tree of one
    gg_proc_tree_into "$root" tree
    used=0 free='' total='' ticks=0 rss=0 holders=()
    for pid in "${tree[@]}"; do
      used=$((used + ${SMI_PIDS_MEM[$pid]:-0}))
      ticks=$((ticks + ${GG_PROC_TICKS[$pid]:-0}))
      rss=$((rss + ${GG_PROC_RSS[$pid]:-0}))
      ((${SMI_PIDS_MEM[$pid]:-0} > 0)) && holders+=("$pid")
      leak_gpu_room_into "$pid" mfree mtotal
      if [[ -n $mfree ]] && [[ -z $free || $mfree -lt $free ]]; then
        free=$mfree total=$mtotal
      fi
    done
    cpu=0
    if [[ -n ${LEAK_CPU_PREV[$root]:-} ]]; then
      local prev_ticks=${LEAK_CPU_PREV[$root]% *} prev_time=${LEAK_CPU_PREV[$root]#* }
      ((now > prev_time)) && cpu=$(((ticks - prev_ticks) * 100 / LEAK_CLK_TCK / (now - prev_time)))
    fi
    LEAK_CPU_PREV[$root]="$ticks $now"
    key="$root-${GG_PROC_START[$root]:-0}"
    name=${GG_PROC_COMM[$root]:-pid$root}
    leak_cmdline_into "$root" cmd
    cmd=${cmd:-$name}
    # tabs and newlines would break the protocol's fields
    name=${name//[$'\t\n']/ } cmd=${cmd//[$'\t\n']/ }
    members='' mlines=''
    for pid in "${holders[@]}"; do
      members+="${members:+,}$pid"
      ((${#holders[@]} > 1)) || continue
      leak_gpu_room_into "$pid" mfree mtotal
      leak_rank_into "$pid" rank
      mlines+="M"$'\t'"$key/$pid-${GG_PROC_START[$pid]:-0}"$'\t'"$key"$'\t'"$now"$'\t'"$pid"$'\t'"${SMI_PIDS_MEM[$pid]}"$'\t'"$mfree"$'\t'"$mtotal"$'\t'"$rank"$'\n'
    done
    samples+="T"$'\t'"$key"$'\t'"$now"$'\t'"$root"$'\t'"$used"$'\t'"$free"$'\t'"$total"$'\t'"$cpu"$'\t'"$((rss * LEAK_PAGE_KIB / 1024))"$'\t'"$members"$'\t'"$name"$'\t'"$cmd"$'\n'"$mlines"
  done
  leak_run_detector "$samples"
  for pid in "${!LEAK_CPU_PREV[@]}"; do
    [[ -n ${GG_PROC_PPID[$pid]:-} ]] || unset "LEAK_CPU_PREV[$pid]"
  done
  for pid in "${!LEAK_RANKS[@]}"; do
    [[ -n ${GG_PROC_PPID[$pid]:-} ]] || unset "LEAK_RANKS[$pid]"
  done
  if [[ -n ${GPUGUARD_TEXTFILE_DIR:-} ]]; then
    textfile_write_leak || gg_log warn "could not write textfile metrics in $GPUGUARD_TEXTFILE_DIR"
  fi
}

# Puts the free and total MiB of the fullest GPU a PID uses into $2 and $3
# ('' when unknown: a GPU whose figures nvidia-smi did not give).
# shellcheck disable=SC2034 # nameref: assigns the caller's variables
leak_gpu_room_into() {
  local -n room_free=$2 room_total=$3
  local uuid f
  room_free='' room_total=''
  for uuid in ${SMI_PID_UUIDS[$1]:-}; do
    [[ -n ${SMI_MEM_TOTAL[$uuid]:-} && -n ${SMI_MEM_USED[$uuid]:-} ]] || continue
    f=$((${SMI_MEM_TOTAL[$uuid]%.*} - ${SMI_MEM_USED[$uuid]%.*}))
    if [[ -z $room_free ]] || ((f < room_free)); then
      room_free=$f
      room_total=${SMI_MEM_TOTAL[$uuid]%.*}
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

# Feeds the samples to the detector and handles what it prints
# (tab-separated):
#   event STATE PID JSON   -> events_emit, then the --on-leak action
#   status PID SLOPE FIRING USED SEVERITY OOM_S NAME -> LEAK_STATUS
#     (by PID, the fields after it), for metrics and status
# shellcheck disable=SC2034 # LEAK_STATUS is read by textfile_write_leak
leak_run_detector() {
  local out kind state pid rest
  out=$(printf '%s' "$1" | LEAK_INSTANCE=${LEAK_INSTANCE:-} python3 -S "$GPUGUARD_ROOT/python/gpuguard_leakcheck.py" check) || {
    gg_log error "leak detector failed (exit $?)"
    return 0
  }
  LEAK_STATUS=()
  while IFS=$'\t' read -r kind state pid rest; do
    case $kind in
      event)
        events_emit "$rest"
        gg_log warn "gpu_memory_leak $state: PID $pid"
        if [[ $state == firing ]]; then
          leak_act "$pid"
        fi
        ;;
      # for status lines the second field is the PID
      status) LEAK_STATUS[$state]="$pid"$'\t'"$rest" ;;
    esac
  done <<<"$out"
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
      kill -s "${LEAK_ACTION#signal:}" "$root" 2>/dev/null || gg_log error "could not signal PID $root"
      ;;
    kill)
      gg_proc_tree_into "$root" tree
      gg_log warn "stopping PID $root and its tree (${tree[*]}) (--on-leak kill, grace ${LEAK_GRACE}s)"
      kill -TERM "${tree[@]}" 2>/dev/null || true
      local waited=0
      while ((waited < LEAK_GRACE)) && kill -0 "$root" 2>/dev/null; do
        sleep 1
        waited=$((waited + 1))
      done
      for pid in "${tree[@]}"; do
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
      done
      ;;
  esac
  return 0
}

# Applies one option that takes a value.
leak_option() {
  case $1 in
    --interval | --grace | --gpu-total-mib)
      [[ $2 =~ ^[0-9]+$ && $2 -gt 0 ]] || gg_usage_error "$1 needs a whole number of at least 1 (got '$2')" || return
      [[ $1 == --interval ]] && export LEAK_INTERVAL=$2
      [[ $1 == --grace ]] && LEAK_GRACE=$2
      [[ $1 == --gpu-total-mib ]] && export LEAK_GPU_TOTAL_MIB=$2
      ;;
    --threshold)
      gg_is_number "$2" || gg_usage_error "--threshold needs MiB per hour (got '$2')" || return
      export LEAK_THRESHOLD_MIB_H=$2
      ;;
    --bucket)
      [[ $2 =~ ^[0-9]+$ && $2 -gt 0 ]] || gg_usage_error "--bucket needs seconds (got '$2')" || return
      export LEAK_BUCKET_S=$2
      ;;
    --rules) export LEAK_RULES=$2 ;;
    --loss-log) export LEAK_LOSS_LOG=$2 ;;
    --config) export GPUGUARD_CONFIG=$2 ;;
    --on-leak)
      [[ $2 == notify || $2 == kill || $2 =~ ^signal:[A-Z0-9]+$ ]] ||
        gg_usage_error "--on-leak takes notify, kill or signal:NAME (got '$2')" || return
      LEAK_ACTION=$2
      ;;
  esac
  return 0
}

# Samples until stopped; with a job, until the job ends (then its status).
leak_watch_loop() {
  local job_pid='' stop=0 rc=0 sleeper
  if (($#)); then
    "$@" &
    job_pid=$!
    LEAK_PIDS+=("$job_pid")
    gg_log info "started job PID $job_pid: $1"
    trap 'kill -TERM "$job_pid" 2>/dev/null' TERM INT
  else
    trap 'stop=1' TERM INT
  fi
  gg_log info "watching every ${LEAK_INTERVAL}s, threshold ${LEAK_THRESHOLD_MIB_H} MiB/h"
  while ((!stop)); do
    leak_cycle "$(gg_now)"
    if leak_all_targets_gone; then
      gg_log info "every watched process has ended; stopping"
      return 0
    fi
    sleep "$LEAK_INTERVAL" &
    sleeper=$!
    if [[ -n $job_pid ]]; then
      wait -n "$sleeper" "$job_pid" 2>/dev/null || true
      if ! kill -0 "$job_pid" 2>/dev/null; then
        kill "$sleeper" 2>/dev/null || true
        rc=0
        wait "$job_pid" || rc=$?
        gg_log info "job PID $job_pid ended with status $rc"
        return "$rc"
      fi
    else
      wait "$sleeper" || true
    fi
  done
  kill "$sleeper" 2>/dev/null || true
  gg_log info "stopped"
  return 0
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

# True when $1 is a valid extended regular expression.
leak_regex_ok() {
  local rc=0
  grep -Eq -- "$1" <<<'' 2>/dev/null || rc=$?
  ((rc != 2))
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
