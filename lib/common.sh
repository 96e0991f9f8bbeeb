# shellcheck shell=bash
# Shared plumbing for every gpuguard command: logging, errors, --help text
# taken from a command's header, JSON string escaping and the state folder.
# Sourcing this file defines functions and nothing else.

# Prints a log line: "2026-12-02 10:15:00 WARN yichuidingyin: message".
# Globals:
#   GG_PROG (command name), GPUGUARD_LOG (file; stderr when empty),
#   GPUGUARD_SYSLOG (1: also send to syslog through logger),
#   GPUGUARD_LOG_LEVEL (debug|info|warn|error; default info)
# Arguments:
#   $1 level (debug|info|warn|error), $2... message
gg_log() {
  local level=$1
  shift
  local -A rank=([debug]=0 [info]=1 [warn]=2 [error]=3)
  local min=${GPUGUARD_LOG_LEVEL:-info}
  if ((${rank[$level]:-1} < ${rank[$min]:-1})); then
    return 0
  fi
  local line
  printf -v line '%(%Y-%m-%d %H:%M:%S)T %-5s %s: %s' -1 "${level^^}" \
    "${GG_PROG:-gpuguard}" "$*"
  if [[ -n "${GPUGUARD_LOG:-}" ]]; then
    printf '%s\n' "$line" >>"$GPUGUARD_LOG" 2>/dev/null || printf '%s\n' "$line" >&2
  else
    printf '%s\n' "$line" >&2
  fi
  if [[ "${GPUGUARD_SYSLOG:-0}" == 1 ]] && command -v logger >/dev/null; then
    local prio=$level
    [[ $prio == warn ]] && prio=warning
    [[ $prio == error ]] && prio=err
    logger -t "gpuguard/${GG_PROG:-gpuguard}" -p "user.$prio" -- "$*" 2>/dev/null || true
  fi
}

# Prints "prog: message" on stderr and returns 2, the exit status for bad
# input. Callers end with `|| return` so main's status becomes the exit code.
gg_usage_error() {
  printf '%s: %s\n' "${GG_PROG:-gpuguard}" "$*" >&2
  return 2
}

# Prints the comment block that starts with "# Summary:" in a command file,
# without the leading "# ", as the command's --help.
# Arguments:
#   $1 path of the command file
gg_help() {
  sed -n '/^# Summary:/,/^[^#]/{/^#/!d;s/^# \{0,1\}//;p;}' "$1"
}

# Escapes a string for use inside a JSON string literal (RFC 8259): backslash,
# quote and every control character.
# Arguments:
#   $1 the raw string
# Outputs:
#   the escaped text, without surrounding quotes, in the variable named $2
gg_json_escape_into() {
  local s=$1
  local -n out_ref=$2
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\r'/\\r}
  s=${s//$'\t'/\\t}
  if [[ $s == *[$'\001'-$'\037']* ]]; then
    local i c clean=''
    for ((i = 0; i < ${#s}; i++)); do
      c=${s:i:1}
      if [[ $c == [$'\001'-$'\037'] ]]; then
        printf -v c '\\u%04x' "'$c"
      fi
      clean+=$c
    done
    s=$clean
  fi
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  out_ref=$s
}

# Returns 0 when $1 is a whole number (no sign, no decimals).
gg_is_uint() {
  [[ $1 =~ ^[0-9]+$ ]]
}

# Returns 0 when $1 is a non-negative decimal number ("12", "76.60").
gg_is_number() {
  [[ $1 =~ ^[0-9]+([.][0-9]+)?$ ]]
}

# Creates the state folder (mode 700) and its outbox; prints a clear error and
# returns 2 when it cannot.
# Globals:
#   GPUGUARD_STATE_DIR
gg_state_dir_init() {
  local dir=$GPUGUARD_STATE_DIR
  if ! mkdir -p -- "$dir" 2>/dev/null || [[ ! -w $dir ]]; then
    gg_usage_error "state folder $dir is not writable (set GPUGUARD_STATE_DIR)"
    return
  fi
  chmod 700 -- "$dir" 2>/dev/null || true
  mkdir -p -- "$dir/outbox" "$dir/history"
}

# Writes a string to a file atomically: a temporary file in the same folder,
# then rename, so a reader or a crash never sees half a file. One fork (mv):
# state and textfiles are written every cycle.
# Arguments:
#   $1 destination path, $2 content
gg_write_atomic() {
  local dest=$1 tmp="$1.tmp.$$"
  if printf '%s' "$2" >"$tmp" && mv -f -- "$tmp" "$dest"; then
    return 0
  fi
  rm -f -- "$tmp"
  return 1
}

# Prints "DISK SCHEDULER" for each real block device (loop, ram and zram
# devices left out), the scheduler being the one in force ([bracketed]).
gg_disk_schedulers() {
  local f sched disk
  for f in /sys/block/*/queue/scheduler; do
    [[ $f == */loop* || $f == */ram* || $f == */zram* || ! -r $f ]] && continue
    sched=$(<"$f")
    sched=${sched#*[}
    sched=${sched%%]*}
    disk=${f#/sys/block/}
    printf '%s %s\n' "${disk%%/*}" "$sched"
  done
}

# Prints the time in unix seconds; GPUGUARD_NOW pins it (replays, tests).
gg_now() {
  if [[ -n ${GPUGUARD_NOW:-} ]]; then
    printf '%s\n' "$GPUGUARD_NOW"
  else
    printf '%(%s)T\n' -1
  fi
}

# Reads every /proc/PID/stat once (fork-free): parent, children, start
# time, CPU ticks, RSS pages and name of every process.
# Globals (set):
#   GG_PROC_PPID, GG_PROC_KIDS (" pid pid ..."), GG_PROC_START,
#   GG_PROC_TICKS, GG_PROC_RSS, GG_PROC_COMM (assoc, by PID)
# shellcheck disable=SC2034 # GG_PROC_* are read by leak.sh and lowprio.sh
gg_proc_scan() {
  declare -gA GG_PROC_PPID=() GG_PROC_KIDS=() GG_PROC_START=() GG_PROC_TICKS=() \
    GG_PROC_RSS=() GG_PROC_COMM=()
  local f line pid rest comm
  local -a a
  for f in /proc/[0-9]*/stat; do
    { read -r line <"$f"; } 2>/dev/null || continue
    pid=${line%% *}
    comm=${line#*(}
    comm=${comm%)*}
    # after the last ") ": state ppid pgrp ... (comm may hold spaces)
    rest=${line##*) }
    read -r -a a <<<"$rest"
    GG_PROC_PPID[$pid]=${a[1]}
    GG_PROC_KIDS[${a[1]}]+=" $pid"
    GG_PROC_TICKS[$pid]=$((a[11] + a[12]))
    GG_PROC_START[$pid]=${a[19]}
    GG_PROC_RSS[$pid]=${a[21]}
    GG_PROC_COMM[$pid]=$comm
  done
}

# Puts the PIDs of a process tree (the root first) into the array named $2,
# from the last gg_proc_scan.
gg_proc_tree_into() {
  local -n tree_ref=$2
  tree_ref=("$1")
  local i=0
  while ((i < ${#tree_ref[@]})); do
    # shellcheck disable=SC2206 # splitting the list of child PIDs
    [[ -n ${GG_PROC_KIDS[${tree_ref[i]}]:-} ]] && tree_ref+=(${GG_PROC_KIDS[${tree_ref[i]}]})
    i=$((i + 1))
  done
}

# Takes an exclusive, non-blocking lock on a file for the life of the shell.
# Arguments:
#   $1 lock file path
# Returns:
#   0 with the lock held; 1 when another process holds it (its PID logged)
gg_lock() {
  local lockfile=$1 fd
  exec {fd}>>"$lockfile" || return 1
  if ! flock -n "$fd"; then
    local holder
    holder=$(cat -- "$lockfile.pid" 2>/dev/null || true)
    gg_log error "another instance holds $lockfile${holder:+ (pid $holder)}"
    return 1
  fi
  printf '%s\n' "$$" >"$lockfile.pid"
}

# True when the kernel groups tasks by session (autogroup): nice then only
# orders processes within one session of the root cgroup.
gg_autogroup_enabled() {
  [[ $(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null) == 1 ]]
}

# True when systemd is PID 1: it then owns the cgroup tree and runs units.
gg_systemd_is_init() {
  [[ -d /run/systemd/system && $(cat /proc/1/comm 2>/dev/null) == systemd ]]
}

# Prints "PROG VERSION" for every command's --version.
gg_print_version() {
  printf '%s %s\n' "${GG_PROG:-gpuguard}" "$(<"$GPUGUARD_ROOT/VERSION")"
}
