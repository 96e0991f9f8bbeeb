# shellcheck shell=bash
# Shared plumbing for every gpuguard command: logging, errors, --help text
# taken from a command's header, JSON string escaping and the state folder.
# Sourcing this file defines functions and one constant, nothing else.

# The configuration keys that hold secrets (webhook URLs carry tokens): they
# live in secrets.conf and reach no child but the alert helper.
# shellcheck disable=SC2034 # read by config.sh, install.sh and leak.sh
GG_SECRET_KEYS='NOTIFY_URL|NOTIFY_SECRET|ALERTMANAGER_URL'

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
  # a byte that was not UTF-8 in a tool's text is a U+FFFD
  # (gg_printable_into), three bytes of mojibake on a console that is not
  # UTF-8 (cron's C): there it is "?", as in the views (gg_term_text_into);
  # the rest of the line, a path or a job's command line, is kept as written
  if [[ $line == *$'\xef\xbf\xbd'* ]] && ! gg_utf8_locale; then
    line=${line//$'\xef\xbf\xbd'/?}
  fi
  # A line that cannot be written (stderr on a terminal that hung up: EIO)
  # is lost, never fatal: under set -e it would end a command that must
  # outlive its terminal (gpu-leak-watch's wrapper, waiting for its job).
  # (GG_LOG_FD: another descriptor for stderr while the shell's own is set
  # aside, as gpu-leak-watch's wrapper does around its job's start)
  if [[ -n "${GPUGUARD_LOG:-}" ]]; then
    gg_append "$GPUGUARD_LOG" "$line"$'\n' 2>/dev/null || printf '%s\n' "$line" 1>&"${GG_LOG_FD:-2}" 2>/dev/null || true
  else
    printf '%s\n' "$line" 1>&"${GG_LOG_FD:-2}" 2>/dev/null || true
  fi
  if [[ "${GPUGUARD_SYSLOG:-0}" == 1 ]] && command -v logger >/dev/null; then
    local prio=$level
    [[ $prio == warn ]] && prio=warning
    [[ $prio == error ]] && prio=err
    logger -t "gpuguard/${GG_PROG:-gpuguard}" -p "user.$prio" -- "$*" 2>/dev/null || true
  fi
}

# Puts $2 into the variable named $1 as text a terminal and a JSON reader
# can take: a byte that is not part of valid UTF-8 (a GBK file name in a
# job's arguments, raw bytes) becomes U+FFFD, and a control character
# becomes \n, \t, \r, \e or ? (a newline in an argument split the alert
# and the status table; an escape sequence reached the admin's terminal).
# The U+FFFD stays in JSON and chat texts; a terminal view or a log line
# shows it as "?" where the locale is not UTF-8 (gg_term_text_into, gg_log).
gg_printable_into() {
  local -n printable_ref=$1
  local text=$2 LC_ALL=C clean='' valid
  if [[ $text == *[$'\x80'-$'\xff']* ]]; then
    valid=$'([\x01-\x7f]|[\xc2-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]|[\xe1-\xec\xee\xef][\x80-\xbf][\x80-\xbf]|\xed[\x80-\x9f][\x80-\xbf]|\xf0[\x90-\xbf][\x80-\xbf][\x80-\xbf]|[\xf1-\xf3][\x80-\xbf][\x80-\xbf][\x80-\xbf]|\xf4[\x80-\x8f][\x80-\xbf][\x80-\xbf])+'
    if [[ ! $text =~ ^${valid}$ ]]; then
      while [[ -n $text ]]; do
        if [[ $text =~ ^$valid ]]; then
          clean+=${BASH_REMATCH[0]}
          text=${text:${#BASH_REMATCH[0]}}
        else
          clean+=$'\xef\xbf\xbd'
          text=${text:1}
        fi
      done
      text=$clean
    fi
  fi
  if [[ $text == *[[:cntrl:]]* ]]; then
    text=${text//$'\n'/\\n}
    text=${text//$'\t'/\\t}
    text=${text//$'\r'/\\r}
    text=${text//$'\e'/\\e}
    text=${text//[[:cntrl:]]/?}
  fi
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  printable_ref=$text
}

# Puts into the variable named $1 the first $3 characters of $2 (with
# `tail`, as $4, the last $3), cut on a character boundary whatever the
# locale: under LC_ALL=C (cron's) bash counts bytes, and a cut inside a
# UTF-8 character left invalid text in the state files and the messages.
# In a UTF-8 locale the loops find nothing to drop.
# shellcheck disable=SC2053 # the patterns on the right are byte ranges
gg_cut_into() {
  local -n cut_ref=$1
  local text=$2 n=$3 k=0 need=0 lead
  local cont=[$'\x80'-$'\xbf'] two=[$'\xc0'-$'\xdf'] three=[$'\xe0'-$'\xef'] four=[$'\xf0'-$'\xf7']
  if [[ ${4:-head} == tail ]]; then
    ((${#text} <= n)) || text=${text:${#text}-n}
    # continuation bytes (10xxxxxx) left from a character cut in two
    while [[ -n $text && ${text:0:1} == $cont ]]; do text=${text:1}; done
  elif ((${#text} > n)); then
    text=${text:0:n}
    # the last character: its continuation bytes, then its lead byte,
    # which says how many it needs; an incomplete one is dropped
    while ((k < 3 && k < ${#text})) && [[ ${text:${#text}-1-k:1} == $cont ]]; do ((k += 1)); done
    if ((k < ${#text})); then
      lead=${text:${#text}-1-k:1}
      if [[ $lead == $two ]]; then need=1; elif [[ $lead == $three ]]; then need=2; elif [[ $lead == $four ]]; then need=3; fi
      if ((need != k)); then
        ((need > 0)) && k=$((k + 1))
        text=${text:0:${#text}-k}
      fi
    fi
  fi
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  cut_ref=$text
}

# True when the terminal takes UTF-8: the locale, as the C library picks it
# (the first of LC_ALL, LC_CTYPE and LANG that is set and not empty; none
# is C), names the UTF-8 character set. The one place that decides: under
# C, POSIX or a Latin-1 locale the views drawn for a terminal (status, the
# ledger's text) use ASCII stand-ins, as such a console shows UTF-8 as
# mojibake. Chat texts and JSON stay UTF-8: no console reads them.
gg_utf8_locale() {
  local loc=${LC_ALL:-${LC_CTYPE:-${LANG:-}}}
  loc=${loc,,}
  [[ $loc == *.utf-8* || $loc == *.utf8* ]]
}

# Puts $2 (UTF-8) into the variable named $1 as a terminal shows it: where
# the locale is not UTF-8 (gg_utf8_locale), the ellipsis of a cut name as
# "..." and any other character that is not ASCII as "?" (a job's command
# line in Chinese was mojibake on a C console).
gg_term_text_into() {
  local -n term_ref=$1
  term_ref=$2
  gg_utf8_locale && return 0
  local LC_ALL=C
  term_ref=${term_ref//…/...}
  if [[ $term_ref == *[$'\x80'-$'\xff']* ]]; then
    # one "?" a character: its continuation bytes go, its lead byte becomes "?"
    term_ref=${term_ref//[$'\x80'-$'\xbf']/}
    term_ref=${term_ref//[$'\xc0'-$'\xff']/?}
  fi
}

# Sets the variable named $1 to a value ($2) the way an error line may show
# it: quoted when plain and at most $3 characters; a URL (a webhook token
# pasted into the wrong key), a value holding a piece of a secret key's
# value (GG_SECRET_KEYS), a longer value or one with control characters is
# described instead, so an error stays one short line with no secret.
gg_shown_into() {
  local -n shown_ref=$1
  local value=$2 max=${3:-200} key piece
  local -a pieces=()
  for key in ${GG_SECRET_KEYS//|/ }; do
    [[ ${#value} -ge 8 && -n ${!key:-} ]] || continue
    IFS=$'/?&=#@:;,+ \t\n' read -r -d '' -a pieces <<<"${!key}" || true
    for piece in ${pieces[@]+"${pieces[@]}"}; do
      if ((${#piece} >= 8)) && [[ $value == *"$piece"* ]]; then
        shown_ref="a value holding a secret (not shown)"
        return 0
      fi
    done
  done
  if [[ $value == *://* ]]; then
    shown_ref="a URL (not shown)"
  elif ((${#value} > max)); then
    shown_ref="a ${#value}-character value (not shown)"
  elif [[ $value == *[[:cntrl:]]* ]]; then
    shown_ref="a value with control characters (not shown)"
  else
    # shellcheck disable=SC2034 # nameref: assigns the caller's variable
    shown_ref="'$value'"
  fi
}

# Prints "prog: message" on stderr and returns 2, the exit status for bad
# input. Callers end with `|| return` so main's status becomes the exit code.
gg_usage_error() {
  printf '%s: %s\n' "${GG_PROG:-gpuguard}" "$*" >&2
  return 2
}

# Puts the arguments $4... into the array named $1 with each
# "--name=value" written as "--name" "value" when --name takes a value, as
# GNU tools read them (`--pid=1` is `--pid 1`); so every command takes both
# forms and its own parser sees one. $2 lists the options that take one
# value, $3 those followed by any number of words (lowprio-run's
# --setup-disk DISK...). Nothing is split from "--" on, nor from the first
# word that is not an option or an option's value: that is the job's
# command, and `--lr=1e-4` belongs to it.
gg_long_opts_split_into() {
  local -n split_ref=$1
  local one=" $2 " many=" $3 " name
  shift 3
  split_ref=()
  while (($#)); do
    case $1 in
      --)
        split_ref+=("$@")
        return 0
        ;;
      -*)
        name=${1%%=*}
        if [[ $1 == --?*=* && ($one == *" $name "* || $many == *" $name "*) ]]; then
          split_ref+=("$name" "${1#*=}")
        else
          split_ref+=("$1")
          if [[ $one == *" $1 "* ]] && (($# >= 2)); then
            split_ref+=("$2")
            shift
          fi
        fi
        shift
        if [[ $many == *" $name "* ]]; then
          while (($#)) && [[ $1 != -* ]]; do
            split_ref+=("$1")
            shift
          done
        fi
        ;;
      *)
        split_ref+=("$@")
        return 0
        ;;
    esac
  done
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

# The one numeric check for everything read from outside (nvidia-smi output,
# the configuration): a plain decimal within [MIN, MAX], with leading zeros
# removed ("07" -> "7", "076.50" -> "76.50"). Anything else fails: signs,
# exponents (1e30), hex, and values too long for bash arithmetic, which wraps
# at 2^63 (18446744073709551615, unsigned -1, would read as -1). Lengths are
# compared before numbers, so no arithmetic ever sees more than 18 digits.
# No forks: it runs for every field of every GPU every cycle.
# Arguments:
#   $1 name of the variable to receive the normalised value
#   $2 the text; $3 int (whole numbers only) or dec (decimals allowed)
#   $4 MIN, $5 MAX (whole numbers; MAX empty = 10^15)
# Returns:
#   0 and the value set; 1 (variable set to '') when invalid or out of range
gg_number_into() {
  local _num_max=${5:-1000000000000000} _num_whole=${2%%.*}
  # Nearly every value read is a number without leading zeros that has
  # fewer digits than MAX (so is below it) and is not below MIN: one test
  # and done. The rest is a function of its own because bash copies a
  # function's body at every call: a small one is cheap, and this one runs
  # for every value read.
  if [[ $2 == @(0|[1-9]*([0-9])) || ($3 == dec && $2 == @(0|[1-9]*([0-9])).+([0-9])) ]] &&
    ((${#_num_whole} < ${#_num_max} && ${#_num_max} <= 18 && _num_whole >= $4)); then
    local -n _num_out=$1
    # shellcheck disable=SC2034 # nameref: assigns the caller's variable
    _num_out=$2
    return 0
  fi
  gg_number_checked_into "$@"
}

# gg_number_into for the values that are not plain (leading zeros,
# decimals of an int, out of range, garbage); same arguments.
gg_number_checked_into() {
  local -n _num_out=$1
  local _num_max=${5:-1000000000000000} _num_whole
  local _num_text=$2 _num_kind=$3 _num_min=$4 _num_frac='' _num_zeros
  _num_out=''
  # patterns, not regular expressions: bash compiles a regular expression
  # at every use (~0.05 ms), and this runs for every number of every sample
  if [[ $_num_kind == int ]]; then
    [[ $_num_text == +([0-9]) ]] || return 1
    _num_whole=$_num_text
  else
    [[ $_num_text == +([0-9])?(.+([0-9])) ]] || return 1
    _num_whole=${_num_text%%.*}
    [[ $_num_text == *.* ]] && _num_frac=.${_num_text#*.}
  fi
  # leading zeros go, one digit stays
  _num_zeros=${_num_whole%%[!0]*}
  _num_whole=${_num_whole#"$_num_zeros"}
  _num_whole=${_num_whole:-0}
  # longer than MAX (or than 18 digits) is out of range without arithmetic
  ((${#_num_whole} <= 18 && ${#_num_whole} <= ${#_num_max})) || return 1
  ((_num_whole >= _num_min && _num_whole <= _num_max)) || return 1
  # MAX.5 is above MAX
  if ((_num_whole == _num_max)) && [[ -n $_num_frac && $_num_frac != .+(0) ]]; then
    return 1
  fi
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  _num_out=$_num_whole$_num_frac
}

# Reads exactly $3 bytes from fd $2 into the variable named $1, NUL bytes
# dropped, in one call: for an answer written whole right after a header
# the caller waited for (nvidia-smi's, the leak detector's), so no
# deadline is needed; a `read -t`, like mapfile, reads a pipe a byte per
# system call. Byte counts need the C locale.
# Returns:
#   1 when fewer bytes came (the writer ended mid-answer)
gg_read_bytes_into() {
  local -n _bytes_out=$1
  local LC_ALL=C
  _bytes_out=''
  (($3 > 0)) || return 0
  IFS= read -r -N "$3" -u "$2" _bytes_out 2>/dev/null || true
  ((${#_bytes_out} == $3))
}

# Prints a shell's one-line error naming this command (GG_PROG) and the
# job's command, and returns 127 (not found) or 126 (not executable), when
# the job $1 cannot be run; returns 0 when it can. The wrappers check this
# before they set anything up, so that the error is theirs and says what a
# shell would say.
gg_command_check() {
  local cmd=$1
  if [[ $cmd == */* ]]; then
    if [[ ! -e $cmd ]]; then
      printf '%s: %s: No such file or directory\n' "$GG_PROG" "$cmd" >&2
      return 127
    fi
    if [[ -d $cmd ]]; then
      printf '%s: %s: Is a directory\n' "$GG_PROG" "$cmd" >&2
      return 126
    fi
    if [[ ! -x $cmd ]]; then
      printf '%s: %s: Permission denied\n' "$GG_PROG" "$cmd" >&2
      return 126
    fi
  elif ! type -P -- "$cmd" >/dev/null; then
    printf '%s: %s: command not found\n' "$GG_PROG" "$cmd" >&2
    return 127
  fi
  return 0
}

# Runs a Python helper with only what it needs in its environment: the
# configuration is never exported (secrets must not reach nvidia-smi, the
# job or any other child), so each call names the keys its helper reads.
# Arguments:
#   [--exec] replace the calling process by the helper instead of running
#   it in a subshell, for a caller that is one already (a coprocess: its
#   PID is then the helper's, which can be killed and waited for);
#   $1 script name under $GPUGUARD_ROOT/python; $2 space-separated variable
#   names to export; $3... the script's arguments (stdin passes through)
# Returns:
#   the helper's status; 127 with one log line when python3 is missing
gg_python() {
  if [[ ${1:-} != --exec ]]; then
    # the exports stay in this subshell
    (gg_python --exec "$@")
    return
  fi
  shift
  local script=$1 wanted=$2 name
  shift 2
  if ! command -v python3 >/dev/null 2>&1; then
    gg_log error "python3 not found: cannot run $script"
    return 127
  fi
  # a key the user exported stays exported unless listed
  for name in ${GG_CONFIG_DEFAULT[@]+"${!GG_CONFIG_DEFAULT[@]}"}; do
    # shellcheck disable=SC2163 # un-exporting the variable named by $name
    export -n "$name" 2>/dev/null || true
  done
  for name in $wanted GPUGUARD_STATE_DIR GPUGUARD_HOST GPUGUARD_LOG GPUGUARD_LOG_LEVEL GPUGUARD_SYSLOG; do
    [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ && -n ${!name+set} ]] || continue
    # shellcheck disable=SC2163 # exporting the variable named by $name
    export "$name"
  done
  local lock_fd=${GG_LOCK_FD:-1023}
  exec python3 -S "$GPUGUARD_ROOT/python/$script" "$@" {lock_fd}>&-
}

# Sets GPUGUARD_STATE_DIR when nothing set it: root's /var/lib/gpuguard;
# a user's XDG state folder, or ~/.local/state/gpuguard; without HOME
# (env -i, some service managers) /tmp/gpuguard-UID: a shared
# /tmp/.local/state, made by the first such user, locked out every other.
gg_state_dir_default() {
  if ((EUID == 0)); then
    GPUGUARD_STATE_DIR=/var/lib/gpuguard
  elif [[ -n ${XDG_STATE_HOME:-} ]]; then
    GPUGUARD_STATE_DIR=$XDG_STATE_HOME/gpuguard
  elif [[ -n ${HOME:-} ]]; then
    GPUGUARD_STATE_DIR=$HOME/.local/state/gpuguard
  else
    GPUGUARD_STATE_DIR=/tmp/gpuguard-$EUID
  fi
}

# For the commands that only read the state (status, report, ledger):
# prints a one-line error and returns 2 when the state folder is not an
# absolute path, or is there but this user cannot read it (a root
# watchdog's folder is mode 700). Reading on would show a box where
# nothing happened, counters and GPU-hours at zero, with no word of why.
gg_state_dir_readable() {
  local dir=$GPUGUARD_STATE_DIR owner shown
  if [[ $dir != /* ]]; then
    # (the watchdog refuses it too: it would never have written there)
    gg_shown_into shown "$dir"
    gg_usage_error "GPUGUARD_STATE_DIR must be an absolute path (got $shown)"
    return
  fi
  [[ -e $dir ]] || return 0
  [[ -d $dir && -r $dir && -x $dir ]] && return 0
  owner=$(stat -c %U -- "$dir" 2>/dev/null) || owner='?'
  gg_usage_error "cannot read the state folder $dir (it belongs to $owner): run as its owner or root"
}

# Puts into the variable named $1 why this state folder cannot vouch for
# what a reading command shows ('' when it can): no watchdog has kept $2 (a
# file or folder in it) there, so $3 (what the watchdog keeps there) is
# missing and what the command shows reads empty ($4 says how). The usual
# case is a user's own folder while the watchdog runs as root with
# /var/lib/gpuguard; $5 is the command to run there with sudo. One wording
# for status and ledger.
# shellcheck disable=SC2034 # why_ref: nameref, assigns the caller's variable
gg_state_unwatched_into() {
  local -n why_ref=$1
  why_ref=''
  [[ ! -e $GPUGUARD_STATE_DIR/$2 ]] || return 0
  why_ref="no watchdog $3 in $GPUGUARD_STATE_DIR: $4"
  if [[ $GPUGUARD_STATE_DIR != /var/lib/gpuguard && -e /var/lib/gpuguard ]]; then
    why_ref+=" (the watchdog may run as root with /var/lib/gpuguard: sudo $5, or set GPUGUARD_STATE_DIR)"
  else
    why_ref+=" (is yichuidingyin.sh running with this state folder? GPUGUARD_STATE_DIR names it)"
  fi
}

# Creates the state folder (mode 700) and its outbox and history folders, or
# checks them when they exist: each must be a real folder (not a symlink)
# owned by us, since everything in it is trusted (state, outbox, locks).
# Prints a one-line error and returns 2 when it cannot, or when the folder
# belongs to someone else.
# Globals:
#   GPUGUARD_STATE_DIR
gg_state_dir_init() {
  local dir=$GPUGUARD_STATE_DIR sub owner mode shown
  if [[ $dir != /* ]]; then
    gg_shown_into shown "$dir"
    gg_usage_error "GPUGUARD_STATE_DIR must be an absolute path (got $shown)"
    return
  fi
  if [[ ! -e $dir && ! -L $dir ]]; then
    mkdir -p -- "$(dirname -- "$dir")" 2>/dev/null || true
    mkdir -m 700 -- "$dir" 2>/dev/null || true
  fi
  for sub in "$dir" "$dir/outbox" "$dir/history"; do
    [[ $sub == "$dir" || -e $sub || -L $sub ]] || mkdir -m 700 -- "$sub" 2>/dev/null || true
    if [[ -L $sub ]]; then
      gg_shown_into shown "$sub"
      gg_usage_error "refusing state folder $shown: it is a symlink (set GPUGUARD_STATE_DIR to a folder of your own)"
      return
    fi
    if [[ ! -d $sub || ! -w $sub ]]; then
      gg_shown_into shown "$sub"
      gg_usage_error "state folder $shown is not writable (set GPUGUARD_STATE_DIR)"
      return
    fi
    read -r owner mode < <(stat -c '%u %a' -- "$sub" 2>/dev/null) || owner=''
    if [[ $owner != "$EUID" ]]; then
      gg_shown_into shown "$sub"
      gg_usage_error "refusing state folder $shown: owned by uid ${owner:-?}, not by us (uid $EUID)"
      return
    fi
    # someone else could have planted links in it (locks, journals)
    if (((8#${mode:-0} & 8#022) != 0)); then
      gg_shown_into shown "$sub"
      gg_usage_error "refusing state folder $shown: writable by group or others (mode $mode); check it for links that are not yours, then chmod 700 it"
      return
    fi
  done
  chmod 700 -- "$dir" 2>/dev/null || true
}

# Makes the state folder again when it was removed under a running daemon
# (by hand, or by a cleaner of /tmp or /var/tmp), and takes its lock file
# again: the lock held so far is on a removed file, so without a new one a
# second daemon could start on the new folder beside this one. The caller
# then writes what it keeps in memory there. Without this every write
# failed as if the disk were full and the stop line said "state saved".
# Arguments:
#   $1 the daemon's lock file in the state folder
# Returns:
#   0 made again and locked; 1 it cannot be (one line said why): stop
gg_state_dir_recreate() {
  local old_fd=${GG_LOCK_FD:-}
  gg_log warn "the state folder $GPUGUARD_STATE_DIR was removed while running: making it again and saving what is kept in memory there"
  gg_state_dir_init || return 1
  gg_lock "$1" || return 1
  [[ -n $old_fd ]] && exec {old_fd}>&-
  return 0
}

# Writes a string to a file atomically and durably: a new temporary file in
# the same folder (random name, created exclusively, so a planted file or
# symlink there is never opened), fsync, then rename over the destination.
# A reader or a crash sees the old file or the new one, never half of one; a
# failed write (disk full) leaves the old file and removes the temporary.
# An outage is logged once for all writers (gg_write_failed).
# Arguments:
#   $1 destination path, $2 content
# Returns:
#   0 written; 1 not written (the old file is intact)
gg_write_atomic() {
  local dest=$1 dir base tmp='' name try had_noclobber=0
  # the folder by expansion, not dirname: this runs every watchdog cycle
  dir=. base=${dest##*/}
  [[ $dest == */* ]] && dir=${dest%/*}
  [[ -n $dir ]] || dir=/
  [[ $- == *C* ]] && had_noclobber=1
  set -C
  for try in 1 2 3 4 5; do
    name="$dir/.$base.$RANDOM$RANDOM$try.tmp"
    # a name already there (collision, or planted) is never opened
    [[ -e $name || -L $name ]] && continue
    if { printf '%s' "$2" >"$name"; } 2>/dev/null; then
      tmp=$name
    else
      # a real error (disk full): remove what was created
      rm -f -- "$name"
    fi
    break
  done
  ((had_noclobber)) || set +C
  if [[ -n $tmp ]] && sync -- "$tmp" 2>/dev/null && mv -f -- "$tmp" "$dest" 2>/dev/null; then
    gg_write_ok "$dest"
    return 0
  fi
  [[ -n $tmp ]] && rm -f -- "$tmp"
  gg_write_failed "$dest"
  return 1
}

# The one "disk full" flag of every writer (gg_write_atomic, the outbox,
# events.jsonl, the alert helper's state): a whole outage is one log line
# and its end one more, across writers and across processes (cron's --once
# runs). For the state folder the flag is an empty marker file, disk-full,
# created exclusively (no data block: it can be made on a full disk; never
# through a planted link); whoever creates it logs, whoever removes it says
# writing works again. Elsewhere (or when even the marker cannot be made)
# the flag lives in this process (GG_WRITE_FAILING).
# Arguments:
#   $1 the path that could not be written
gg_write_failed() {
  local marker=''
  [[ -n ${GPUGUARD_STATE_DIR:-} && $1 == "$GPUGUARD_STATE_DIR"/* ]] && marker=$GPUGUARD_STATE_DIR/disk-full
  # The state folder itself is gone (removed under a daemon between its
  # check and this write): not a full disk. The daemon's next cycle makes
  # it again and says so (gg_state_dir_recreate); a "disk full?" line
  # here would send the reader after the wrong cause.
  [[ -n $marker && ! -d $GPUGUARD_STATE_DIR ]] && return 0
  if [[ -n $marker ]] && [[ -e $marker || -L $marker ]]; then
    GG_WRITE_FAILING=1
    return 0
  fi
  if [[ -n $marker ]] && (set -C && : >"$marker") 2>/dev/null; then
    GG_WRITE_FAILING=0
  fi
  if ((! ${GG_WRITE_FAILING:-0})); then
    # a permission error is named as one: "disk full?" sent the reader
    # after the wrong cause (a folder of root's, a file of another user's
    # in a sticky folder such as /tmp)
    local dir=. cause='disk full?'
    [[ $1 == */* ]] && dir=${1%/*}
    if [[ -d $dir ]] && [[ ! -w $dir || ! -x $dir ]]; then
      cause="its folder is not writable by uid $EUID"
    elif [[ -k $dir && -e $1 && ! -O $1 ]]; then
      cause="owned by another user in a sticky folder"
    fi
    gg_log error "cannot write $1 ($cause): previous files are kept, new events wait in memory, retried every cycle; one line for the whole outage"
  fi
  GG_WRITE_FAILING=1
}

# Ends an outage that gg_write_failed started, with one line.
# Arguments:
#   $1 the path just written
gg_write_ok() {
  local marker=''
  [[ -n ${GPUGUARD_STATE_DIR:-} && $1 == "$GPUGUARD_STATE_DIR"/* ]] && marker=$GPUGUARD_STATE_DIR/disk-full
  if [[ -n $marker && -f $marker && ! -L $marker ]] && rm -f -- "$marker" 2>/dev/null; then
    gg_log info "writing to $GPUGUARD_STATE_DIR works again"
  elif [[ -z $marker ]] && ((${GG_WRITE_FAILING:-0})); then
    gg_log info "writing to ${1%/*} works again"
  fi
  GG_WRITE_FAILING=0
}

# True while a write outage is on (see gg_write_failed): the callers of a
# failed write stay quiet, the outage was said once.
gg_write_outage() {
  ((${GG_WRITE_FAILING:-0})) || [[ -n ${GPUGUARD_STATE_DIR:-} && -f $GPUGUARD_STATE_DIR/disk-full ]]
}

# Appends text to a file, never through a symlink: a link planted at a log
# or journal path (events.jsonl, the log file) is refused, not followed.
# Arguments:
#   $1 file, $2 text (include the newline)
# Returns:
#   1 when the path is a symlink or the write fails
gg_append() {
  gg_refuse_link "$1" || return 1
  printf '%s' "$2" >>"$1"
}

# Says in one line, and returns 1, when a path about to be opened for
# writing (a lock, a log, a journal) is a symlink: a link planted there is
# never followed, so a missing target (/etc/nologin) is never created. Bash
# has no O_NOFOLLOW; this check stands in for it because the state folder is
# ours and not writable by others (gg_state_dir_init), so nobody can plant a
# link between the check and the open.
# Arguments:
#   $1 the path
gg_refuse_link() {
  [[ -L $1 ]] || return 0
  printf '%s: refusing to open %s: it is a symlink (planted? remove it)\n' "${GG_PROG:-gpuguard}" "$1" >&2
  return 1
}

# Renames FILE to FILE.1 (replacing the older one) when it is larger than
# MiB; with a lock file, under that lock, so an appender never writes into
# the file being moved.
# Arguments:
#   $1 file, $2 limit in MiB, $3 lock file (optional)
gg_rotate_by_size() {
  local file=$1 limit=$2 lock=${3:-} size fd
  [[ -f $file && ! -L $file ]] || return 0
  size=$(stat -c %s -- "$file" 2>/dev/null) || return 0
  ((size > limit * 1048576)) || return 0
  if [[ -n $lock ]]; then
    gg_refuse_link "$lock" || return 0
    exec {fd}>>"$lock" || return 0
    flock "$fd"
    mv -f -- "$file" "$file.1"
    exec {fd}>&-
  else
    mv -f -- "$file" "$file.1"
  fi
  gg_log info "rotated $file (over $limit MiB) to $file.1"
}

# Bounds the state folder's disk use in one pass: events.jsonl and the log
# rotated by size (one old copy each), rejected outbox files (*.bad), leak
# watcher states (leak-state-*.json) and claims (leak-claim-*) untouched for
# RETENTION_DAYS removed, stray temporary files after an hour (a disk measurement's
# 256 MiB file of a lowprio-run killed mid-way too), history files
# (one per leak series) removed after RETENTION_DAYS and then, oldest first,
# until at most HISTORY_MAX_FILES files and HISTORY_MAX_MB remain, the
# ledger's day files by their day (gg_retention_ledger_days).
# Ages count from gg_now (GPUGUARD_NOW pins it), so replays age files too.
# Globals:
#   GPUGUARD_STATE_DIR, GPUGUARD_LOG, RETENTION_DAYS, HISTORY_MAX_FILES,
#   HISTORY_MAX_MB, EVENTS_MAX_MB
gg_retention() {
  local dir=$GPUGUARD_STATE_DIR now cutoff stamp size path files=0 bytes=0 removed=0
  local max_files=${HISTORY_MAX_FILES:-1500} max_bytes=$((${HISTORY_MAX_MB:-30} * 1048576))
  local -a doomed=()
  now=$(gg_now)
  cutoff=$((now - ${RETENTION_DAYS:-7} * 86400))
  gg_rotate_by_size "$dir/events.jsonl" "${EVENTS_MAX_MB:-5}" "$dir/events.lock"
  [[ -n ${GPUGUARD_LOG:-} ]] && gg_rotate_by_size "$GPUGUARD_LOG" "${EVENTS_MAX_MB:-5}"
  # (a leak watcher writes its leak-state-<instance>.json every cycle, and a
  # cron --once one its leak-claim-<instance>: one untouched for
  # RETENTION_DAYS is a watcher's that is long gone; an --all watcher
  # removes a claim as soon as it is stale, this is for boxes without one)
  find "$dir" "$dir/outbox" "$dir/history" "$dir/ledger" -maxdepth 1 -type f \
    \( \( -name '*.tmp' -o -name '*.tmp.*' -o -name '*.tmp[0-9]*' -o -name '.gpuguard-disk-measure.*' \) \
    ! -newermt "@$((now - 3600))" \
    -o \( -path "$dir/outbox/*.bad" -o -path "$dir/leak-state*.json" -o -path "$dir/leak-claim-*" \) \
    ! -newermt "@$cutoff" \) \
    -delete 2>/dev/null || true
  # newest first: keep while under both caps and younger than the cutoff
  # (a series' identity, <key>.job.json, goes with its history, below)
  while read -r -d '' stamp size path; do
    [[ $path == *.job.json ]] && continue
    files=$((files + 1))
    bytes=$((bytes + size))
    if ((${stamp%.*} < cutoff || files > max_files || bytes > max_bytes)); then
      doomed+=("$path")
    fi
  done < <(find "$dir/history" -maxdepth 1 -type f -printf '%T@ %s %p\0' 2>/dev/null | sort -z -rn)
  gg_retention_ledger_days "$dir/ledger" "$now"
  if ((${#doomed[@]})); then
    printf '%s\0' "${doomed[@]}" | xargs -0 rm -f --
    removed=${#doomed[@]}
    gg_log info "retention: removed $removed history files (kept $((files - removed)), caps ${max_files} files, ${HISTORY_MAX_MB:-30} MiB, ${RETENTION_DAYS:-7} days)"
  fi
  for path in "$dir"/history/*.job.json; do
    [[ -e ${path%.job.json}.csv || ! -f $path ]] || rm -f -- "$path"
  done
  gg_retention_leak_textfiles "$cutoff"
  gg_write_atomic "$dir/.retention-last" "$now"$'\n' || true
}

# Removes the ledger's day files (lib/ledger.sh) of the days more than
# LEDGER_KEEP_DAYS before today, as `gpuguard ledger` counts them
# (python/gpuguard_ledger.py). A file's day is in its name, and the name
# ages it, not its mtime, which a copy or a restore changes. The newest
# LEDGER_KEEP_DAYS + 1 day files, what a normal day keeps, are never
# removed: one cycle run while the clock was far ahead (a VM booted with
# its RTC 400 days ahead, before NTP set it back) found every day file too
# old and removed the whole ledger. Such a cycle's future day file is
# removed by ledger_clock_back (lib/ledger.sh) once the clock is right. A
# ledger that stopped (the watchdog off for months) keeps its last
# LEDGER_KEEP_DAYS + 1 files, as many as a running one.
# Arguments:
#   $1 the ledger folder, $2 now, unix seconds
gg_retention_ledger_days() {
  local dir=$1 now=$2 keep=${LEDGER_KEEP_DAYS:-35} h m s noon oldest file i
  local -a days=()
  [[ -d $dir && ! -L $dir ]] || return 0
  # the glob sorts the names, oldest day first (ledger_load relies on it too)
  for file in "$dir"/????-??-??.tsv; do
    [[ -f $file && ! -L $file ]] && days+=("$file")
  done
  # the day KEEP days before today counted from today's noon, so that a
  # 23- or 25-hour day (a clock change) in between never shifts it
  printf -v h '%(%H)T' "$now"
  printf -v m '%(%M)T' "$now"
  printf -v s '%(%S)T' "$now"
  noon=$((now - 10#$h * 3600 - 10#$m * 60 - 10#$s + 43200))
  printf -v oldest '%(%Y-%m-%d)T' "$((noon - keep * 86400))"
  for ((i = 0; i < ${#days[@]} - keep - 1; i++)); do
    file=${days[i]}
    [[ ${file##*/} < $oldest.tsv ]] || break
    rm -f -- "$file"
  done
}

# Removes the leak watchers' metrics files (gpuguard_leak-<instance>.prom,
# lib/textfile.sh) that no watcher writes any more, so that a watcher
# killed with -9 neither keeps its series (a firing leak among them) in
# Prometheus for ever nor leaves one file per job behind: a wrapped job's
# (job-<wrapper PID>) once its wrapper is gone, any other once untouched
# since the cutoff ($1), as its detector state. gpuguard_leak.prom, the one
# file all watchers shared before, is written by none now.
gg_retention_leak_textfiles() {
  local tdir=${GPUGUARD_TEXTFILE_DIR:-} path pid
  [[ -n $tdir && -d $tdir ]] || return 0
  rm -f -- "$tdir/gpuguard_leak.prom"
  for path in "$tdir"/gpuguard_leak-job-*.prom; do
    pid=${path##*/gpuguard_leak-job-}
    pid=${pid%.prom}
    [[ $pid =~ ^[0-9]+$ && ! -d /proc/$pid ]] || continue
    rm -f -- "$path"
  done
  find "$tdir" -maxdepth 1 -type f -name 'gpuguard_leak-*.prom' ! -newermt "@$1" -delete 2>/dev/null || true
}

# Runs gg_retention when RETENTION_INTERVAL seconds have passed since the
# last pass in this state folder (by any command: the time is kept in a
# file), so the daemon, cron --once runs and the leak watcher share one
# schedule. Cheap otherwise: one read, no fork.
gg_retention_maybe() {
  local now last=0
  now=${GPUGUARD_NOW:-$EPOCHSECONDS}
  { read -r last <"$GPUGUARD_STATE_DIR/.retention-last"; } 2>/dev/null || last=0
  [[ $last =~ ^[0-9]{1,12}$ ]] || last=0
  ((now - last >= ${RETENTION_INTERVAL:-300} || now < last)) || return 0
  gg_retention
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
  local gg_now_value
  gg_now_into gg_now_value
  printf '%s\n' "$gg_now_value"
}

# The same into the variable named $1, without the fork of $(gg_now): the
# daemons' loops take the time every cycle.
gg_now_into() {
  local -n now_ref=$1
  if [[ -n ${GPUGUARD_NOW:-} ]]; then
    now_ref=$GPUGUARD_NOW
  else
    printf -v now_ref '%(%s)T' -1
  fi
}

# Reads every /proc/PID/stat once (fork-free): parent, children, start
# time, CPU ticks, RSS pages and name of every process.
# Globals (set):
#   GG_PROC_PPID, GG_PROC_KIDS (" pid pid ..."), GG_PROC_START,
#   GG_PROC_TICKS, GG_PROC_RSS, GG_PROC_COMM (assoc, by PID)
gg_proc_scan() {
  declare -gA GG_PROC_PPID=() GG_PROC_START=() GG_PROC_TICKS=() GG_PROC_RSS=() GG_PROC_COMM=()
  local -a pids=(/proc/[0-9]*)
  gg_proc_read "${pids[@]#/proc/}"
  gg_proc_link
  GG_PROC_UPDATES=0
}

# How many gg_proc_update calls may follow a full scan before the next one.
GG_PROC_FULL_EVERY=10

# gg_proc_scan at the cost of the processes that are new since the last
# call, for a watcher that asks every cycle: PIDs are listed, the gone
# ones forgotten and only the new ones read (a full scan read every
# process on the box, ~50 us each: most of a cycle on a host with hundreds
# of processes). A process that exec'd or a PID taken by a new process
# reads as before until the process is read again: by gg_proc_read (the
# caller's watched trees, every cycle) or by the full scan every
# GG_PROC_FULL_EVERY calls.
gg_proc_update() {
  if ((${GG_PROC_UPDATES:--1} < 0 || GG_PROC_UPDATES >= GG_PROC_FULL_EVERY)); then
    gg_proc_scan
    return 0
  fi
  GG_PROC_UPDATES=$((GG_PROC_UPDATES + 1))
  local pid
  local -a pids=(/proc/[0-9]*) new=()
  pids=("${pids[@]#/proc/}")
  for pid in "${pids[@]}"; do
    [[ -n ${GG_PROC_PPID[$pid]:-} ]] || new+=("$pid")
  done
  # as many known processes listed as known: none is gone
  if ((${#pids[@]} - ${#new[@]} != ${#GG_PROC_PPID[@]})); then
    local -A alive=()
    for pid in "${pids[@]}"; do
      alive[$pid]=1
    done
    for pid in "${!GG_PROC_PPID[@]}"; do
      [[ -n ${alive[$pid]:-} ]] || gg_proc_forget "$pid"
    done
    gg_proc_read "${new[@]}"
    gg_proc_link
    return 0
  fi
  ((${#new[@]} > 0)) || return 0
  gg_proc_read "${new[@]}"
  for pid in "${new[@]}"; do
    [[ -n ${GG_PROC_PPID[$pid]:-} ]] && GG_PROC_KIDS[${GG_PROC_PPID[$pid]}]+=" $pid"
  done
  return 0
}

# Drops a process from GG_PROC_* (its children's links stay until the next
# gg_proc_link).
gg_proc_forget() {
  unset "GG_PROC_PPID[$1]" "GG_PROC_START[$1]" "GG_PROC_TICKS[$1]" "GG_PROC_RSS[$1]" "GG_PROC_COMM[$1]"
}

# Builds GG_PROC_KIDS from GG_PROC_PPID.
gg_proc_link() {
  declare -gA GG_PROC_KIDS=()
  local pid
  for pid in "${!GG_PROC_PPID[@]}"; do
    GG_PROC_KIDS[${GG_PROC_PPID[$pid]}]+=" $pid"
  done
}

# Reads a /proc stat file (/proc/PID/stat or /proc/PID/task/TID/stat) into
# the array named $2, its fields numbered as proc(5) numbers them less one:
# [0] pid, [1] comm (without its parentheses), [2] state, [3] ppid, [4] pgrp,
# [5] session, ... The fields are found after the last ") ", so a process
# name holding blanks or parentheses cannot shift them.
# Arguments:
#   $1 the stat file
#   $2 name of the array to set
# Returns:
#   1 (the array empty) when the file cannot be read or is not a stat line
gg_proc_stat_into() {
  local stat_line stat_comm IFS=$' \t\n'
  local -a stat_rest
  local -n stat_fields=$2
  stat_fields=()
  { read -r stat_line <"$1"; } 2>/dev/null || return 1
  [[ $stat_line == *') '* ]] || return 1
  stat_comm=${stat_line#*(}
  stat_comm=${stat_comm%)*}
  read -r -a stat_rest <<<"${stat_line##*) }"
  # shellcheck disable=SC2034 # nameref: assigns the caller's array
  stat_fields=("${stat_line%% *}" "$stat_comm" "${stat_rest[@]}")
}

# Reads /proc/PID/stat of each PID given into GG_PROC_* (all but
# GG_PROC_KIDS); a process that is gone is forgotten.
# shellcheck disable=SC2034 # GG_PROC_* are read by leak.sh and lowprio.sh
gg_proc_read() {
  local f pid comm IFS=$' \t\n'
  local -a a
  # A stat line split at blanks has as many fields as ours unless the
  # process name (comm) holds blanks: then gg_proc_stat_into reads it,
  # numbering the fields alike. read -a splits in one step (no expansions): this runs for
  # many processes every cycle.
  if [[ -z ${GG_PROC_STAT_WIDTH:-} ]]; then
    read -r -a a </proc/self/stat
    GG_PROC_STAT_WIDTH=${#a[@]}
  fi
  for pid in "$@"; do
    f=/proc/$pid/stat
    if ! { read -r -a a <"$f"; } 2>/dev/null; then
      gg_proc_forget "$pid"
      continue
    fi
    if ((${#a[@]} == GG_PROC_STAT_WIDTH)) && [[ ${a[1]} == '('*')' ]]; then
      comm=${a[1]:1:-1}
    else
      gg_proc_stat_into "$f" a || continue
      comm=${a[1]}
    fi
    # fields as proc(5) numbers them, less one
    GG_PROC_PPID[$pid]=${a[3]}
    GG_PROC_TICKS[$pid]=$((a[13] + a[14]))
    GG_PROC_START[$pid]=${a[21]}
    GG_PROC_RSS[$pid]=${a[23]}
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
#   0 with the lock held; 1 when another process holds it (its PID logged);
#   2 when the path is a symlink (refused in one line, never followed)
gg_lock() {
  local lockfile=$1 fd
  gg_refuse_link "$lockfile" || return 2
  exec {fd}>>"$lockfile" || return 1
  if ! flock -n "$fd"; then
    local holder
    holder=$(cat -- "$lockfile.pid" 2>/dev/null || true)
    gg_log error "another instance holds $lockfile${holder:+ (pid $holder)}"
    return 1
  fi
  gg_write_atomic "$lockfile.pid" "$$"$'\n' || true
  # Every child inherits the descriptor, and flock holds while any holder of
  # it lives: a killed daemon's hung nvidia-smi or sleep would keep the lock
  # and refuse the restart. Children that may outlive us close it
  # ({GG_LOCK_FD}>&-; 1023, never open, where no lock is held).
  declare -g GG_LOCK_FD=$fd
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

# True when this shell ignores signal number $1 (the SigIgn mask of
# /proc/PID/status). bash cannot trap a signal that was ignored when it
# started (nohup starts its command with SIGHUP ignored): a trap set for it
# does nothing, and the bit stays set after the trap. The one reader of
# SigIgn (gpu-leak-watch asks it which signals its caller ignored).
gg_signal_ignored() {
  local line mask=''
  while IFS= read -r line; do
    [[ $line == SigIgn:* ]] && mask=${line#SigIgn:} && break
  done <"/proc/$$/status" 2>/dev/null
  mask=${mask//[[:space:]]/}
  [[ $mask =~ ^[0-9a-fA-F]{1,16}$ ]] || return 1
  (((16#$mask >> ($1 - 1)) & 1))
}

# Prints "PROG VERSION" for every command's --version.
gg_print_version() {
  printf '%s %s\n' "${GG_PROG:-gpuguard}" "$(<"$GPUGUARD_ROOT/VERSION")"
}
