# shellcheck shell=bash
# The ledger: who held GPUs, and for how long idle or stuck, per day and per
# user and job. The watchdog calls ledger_cycle once a cycle after judging
# the GPUs; the day's totals live in bash arrays and reach the disk in two
# ways, so that a cycle costs no fork:
#
# - every cycle, one line is appended to ledger/journal (a plain append,
#   no fork): the cycle's sequence number, time, the seconds it accounts
#   and, per held GPU, who held it and whether it was idle or stuck; and
#   once per job, when it is first seen, its masked command line (a cron
#   run that replays the journal after the job ended still names it);
# - every LEDGER_SAVE_EVERY (20) cycles, at a day's end and when the daemon
#   stops, the day's aggregate is written atomically to ledger/DAY.tsv
#   (with the last sequence number it holds) and the journal is emptied.
#
# A start (daemon, or each cron --once run) loads the newest day file and
# replays the journal lines whose sequence number it does not hold yet, so
# a kill -9 at any point loses nothing that was journaled and counts
# nothing twice. A cycle accounts the time since the last accounted one,
# capped at LEDGER_GAP_CYCLES cycles: a watchdog stopped for hours (or a
# cron line that stopped running) does not invent held time; a failed
# nvidia-smi sample accounts nothing (the next good one covers the gap, up
# to the cap). The day an interval belongs to is the local day it ends in.
#
# The day file's format is described (and read) in python/gpuguard_ledger.py;
# the journal is this module's own. The daily digest is built there too and
# queued here, once per day (see ledger_digest_maybe).

LEDGER_SAVE_EVERY=20
LEDGER_GAP_CYCLES=3
# Job rows kept per day; later jobs of a user are added to its "(other)" row,
# so a day file stays under ~28 KB (0.9 MB a month) on the busiest box.
LEDGER_MAX_JOBS=120
LEDGER_CMD_MAX=100

# Declares the ledger's arrays and loads the saved ledger (see module comment).
# Arguments:
#   $1 "readonly" to load without ever writing (gpuguard ledger)
ledger_init() {
  declare -gA LG_HELD=() LG_IDLE=() LG_LONG=() LG_LONG_END=() LG_GPUS=() LG_CMD=() LG_UID=()
  declare -gA LG_RUN=() LG_RUN_KEY=() LG_TOT_HELD=() LG_TOT_IDLE=() LG_PIDKEY=() LG_HASH=()
  declare -g LG_DAY='' LG_LAST=0 LG_SEQ=0 LG_SAVED_SEQ=0 LG_JOURNAL_N=0 LG_NJOBS=0
  declare -g LG_READONLY=0 LG_DIR=$GPUGUARD_STATE_DIR/ledger LG_DIGEST_DONE='' LG_OK=1
  [[ ${1:-} == readonly ]] && LG_READONLY=1
  if ((LG_READONLY)) && [[ ! -d $LG_DIR ]]; then
    LG_OK=0
    return 0
  fi
  if [[ -L $LG_DIR ]] || { [[ ! -d $LG_DIR ]] && ! mkdir -m 700 -- "$LG_DIR" 2>/dev/null; }; then
    gg_log warn "ledger: cannot use $LG_DIR (a link, or not writable); the ledger is off"
    LG_OK=0
    return 0
  fi
  { read -r LG_DIGEST_DONE <"$LG_DIR/digest-sent"; } 2>/dev/null || LG_DIGEST_DONE=''
  ledger_load
}

# Loads the newest day file, then replays the journal past it.
ledger_load() {
  local -a days=("$LG_DIR"/????-??-??.tsv)
  local newest=${days[${#days[@]} - 1]}
  [[ -f $newest ]] && ledger_read_day "$newest"
  [[ -f $LG_DIR/journal ]] || return 0
  local -a lines=()
  mapfile -t lines <"$LG_DIR/journal" 2>/dev/null || return 0
  local line cycles=0
  local -a f
  LG_REPLAYING=1
  for line in "${lines[@]}"; do
    # c SEQ TS DT ENTRY... . (the dot ends a whole line: a write cut
    # short by a full disk is left out); j USER JOB UID CMD . (a job's
    # command line, as ledger_holder_key read it: "-" for none)
    IFS=$'\t' read -r -a f <<<"$line"
    if [[ ${f[0]:-} == j && ${#f[@]} == 6 && ${f[5]} == . ]]; then
      ledger_journal_job "${f[@]:1:4}"
      continue
    fi
    if [[ ${f[0]:-} != c || ${f[${#f[@]} - 1]} != . ]] || ! gg_is_uint "${f[1]:-}" ||
      ! gg_is_uint "${f[2]:-}" || ! gg_is_uint "${f[3]:-}"; then
      continue
    fi
    cycles=$((cycles + 1))
    ((f[1] > LG_SEQ)) || continue
    ledger_account "${f[@]:1:${#f[@]}-2}"
  done
  LG_REPLAYING=0
  # the journal stays as it is: the next save takes it in (its cycles
  # count towards it; the few job lines do not)
  LG_JOURNAL_N=$cycles
}

# Takes a job's command line from a journal line (USER JOB UID CMD), unless
# the day already holds one or is full of job rows (ledger_holder_key).
ledger_journal_job() {
  local key=$1$'\t'$2
  [[ -z ${LG_CMD[$key]:-} ]] && ((LG_NJOBS < LEDGER_MAX_JOBS)) || return 0
  [[ $4 == - ]] || LG_CMD[$key]=$4
  [[ $3 == - ]] || LG_UID[$key]=$3
}

# Reads a day file into the arrays (the format: python/gpuguard_ledger.py).
ledger_read_day() {
  local file=$1 kind a b c d e f g h i key ours=0
  LG_DAY=${file##*/}
  LG_DAY=${LG_DAY%.tsv}
  while IFS=$'\t' read -r kind a b c d e f g h i; do
    case $kind in
      day) [[ $a == "$LG_DAY" ]] && ours=1 ;;
      last)
        gg_is_uint "$a" && gg_is_uint "$b" && LG_LAST=$a LG_SEQ=$b LG_SAVED_SEQ=$b
        ;;
      job)
        # job USER UID JOB HELD IDLE LONGEST LONGEST_END GPUS CMD (more
        # than 10 digits is damage: bash arithmetic wraps it silently)
        gg_is_uint "$d" && gg_is_uint "$e" && gg_is_uint "$f" && gg_is_uint "$g" || continue
        ((${#d} <= 10 && ${#e} <= 10 && ${#f} <= 10 && ${#g} <= 10)) || continue
        key=$a$'\t'$c
        [[ $b == - ]] && b=''
        [[ $h == - ]] && h=''
        [[ $i == - ]] && i=''
        LG_UID[$key]=$b LG_HELD[$key]=$d LG_IDLE[$key]=$e LG_LONG[$key]=$f LG_LONG_END[$key]=$g
        LG_GPUS[$key]=$h LG_CMD[$key]=$i
        LG_NJOBS=$((LG_NJOBS + 1))
        ;;
      run)
        # run UUID USER JOB SECONDS: an idle stretch still open
        gg_is_uint "$d" && LG_RUN[$a]=$d LG_RUN_KEY[$a]=$b$'\t'$c
        ;;
      total)
        # total USER HELD IDLE: all-time counters (the textfile metrics)
        gg_is_uint "$b" && gg_is_uint "$c" && LG_TOT_HELD[$a]=$b LG_TOT_IDLE[$a]=$c
        ;;
    esac
  done <"$file" 2>/dev/null || true
  # a day file overwritten or cut (a disk error, a hand) read as a day
  # without jobs, with no word of why
  if ((! ours)) && [[ -s $file ]]; then
    gg_log warn "ledger: $file is not the ledger of $LG_DAY (damaged?): that day shows what is left of it"
  fi
}

# Accounts one interval. Journaled by ledger_cycle, replayed by ledger_load.
# Arguments:
#   $1 sequence number, $2 time it ends, $3 seconds, $4... one per holder
#   of a held GPU: "RUN|INDEX|IDLE(0/1)|USER|JOB|SECONDS", RUN naming the
#   holder's idle stretch on that GPU ("UUID/JOB"), SECONDS its share of the
#   interval (ledger_entries_into; older journal lines have "UUID" and no
#   share: the whole interval)
ledger_account() {
  local seq=$1 ts=$2 dt=$3 entry uuid idx idle user job key day run secs pause=0 limit
  shift 3
  # a pause in sampling past the watchdog's own limit ends every idle
  # stretch: before, the longest stretch ran across a stopped watchdog or
  # a sleeping host as if watched all along; the next one starts with
  # this sample, as the watchdog's idle counts do
  idle_pause_limit_into limit
  ((LG_LAST > 0 && ts - LG_LAST > limit)) && pause=1
  printf -v day '%(%Y-%m-%d)T' "$ts"
  if [[ $day != "$LG_DAY" ]]; then
    # a clock set back past midnight never reopens (and empties) a finished day
    if [[ -n $LG_DAY && $day < $LG_DAY ]]; then
      LG_SEQ=$seq
      return 0
    fi
    ledger_rollover "$day"
  fi
  local -A seen=()
  for entry in "$@"; do
    # UUID|INDEX|IDLE|USER|JOB, split without a here-string (no temp file)
    uuid=${entry%%|*} entry=${entry#*|}
    idx=${entry%%|*} entry=${entry#*|}
    idle=${entry%%|*} entry=${entry#*|}
    user=${entry%%|*} job=${entry#*|} secs=$dt
    [[ $job != *'|'* ]] || secs=${job##*|} job=${job%|*}
    # a damaged journal line is left out, never a bad subscript (nor a
    # share in another base, or more than the interval)
    [[ -n $uuid && -n $user && -n $job && $job != *'|'* && $secs != *[!0-9]* && ${#secs} -le 10 &&
      ($secs == 0 || $secs == [1-9]*) ]] || continue
    ((secs <= dt)) || secs=$dt
    key=$user$'\t'$job
    if [[ -z ${LG_HELD[$key]+set} ]]; then
      if ((LG_NJOBS >= LEDGER_MAX_JOBS)); then
        key=$user$'\t'other
      else
        LG_NJOBS=$((LG_NJOBS + 1))
      fi
      : "${LG_HELD[$key]:=0}" "${LG_IDLE[$key]:=0}" "${LG_LONG[$key]:=0}" "${LG_LONG_END[$key]:=0}"
    fi
    seen[$uuid]=1
    LG_HELD[$key]=$((LG_HELD[$key] + secs))
    LG_TOT_HELD[$user]=$((${LG_TOT_HELD[$user]:-0} + secs))
    [[ ,${LG_GPUS[$key]:-}, == *,"$idx",* ]] || LG_GPUS[$key]=${LG_GPUS[$key]:+${LG_GPUS[$key]},}$idx
    if [[ $idle == 1 ]]; then
      LG_IDLE[$key]=$((LG_IDLE[$key] + secs))
      LG_TOT_IDLE[$user]=$((${LG_TOT_IDLE[$user]:-0} + secs))
      # one idle stretch per GPU and holder; it may run past midnight
      run=0
      if ((! pause)); then
        [[ ${LG_RUN_KEY[$uuid]:-} == "$key" ]] && run=${LG_RUN[$uuid]:-0}
        run=$((run + dt))
      fi
      LG_RUN[$uuid]=$run LG_RUN_KEY[$uuid]=$key
      if ((run > LG_LONG[$key])); then
        LG_LONG[$key]=$run LG_LONG_END[$key]=$ts
      fi
    else
      unset "LG_RUN[$uuid]" "LG_RUN_KEY[$uuid]"
    fi
  done
  for uuid in "${!LG_RUN[@]}"; do
    [[ -n ${seen[$uuid]:-} ]] || unset "LG_RUN[$uuid]" "LG_RUN_KEY[$uuid]"
  done
  LG_LAST=$ts LG_SEQ=$seq
}

# Starts a new day: the finished one is saved, the day's rows start empty
# (the all-time counters and open idle stretches go on).
ledger_rollover() {
  if [[ -n $LG_DAY ]] && ((LG_SEQ > LG_SAVED_SEQ)); then
    ledger_save keep-journal
  fi
  LG_DAY=$1 LG_NJOBS=0
  LG_HELD=() LG_IDLE=() LG_LONG=() LG_LONG_END=() LG_GPUS=()
  # the command lines of jobs still running are kept for the new day's rows
  local key
  local -A live=()
  for key in "${LG_PIDKEY[@]}"; do live[${key/|/$'\t'}]=1; done
  for key in "${!LG_CMD[@]}"; do
    [[ -n ${live[$key]:-} ]] || unset "LG_CMD[$key]" "LG_UID[$key]"
  done
}

# Makes the ledger folder again after the state folder was removed under
# the watchdog, and writes the day and the last digest's mark there from
# memory: the journal alone would hold only the cycles after the removal,
# and a missing mark would send yesterday's digest again on a restart.
ledger_dir_recreate() {
  ((LG_OK && ! LG_READONLY)) || return 0
  if [[ -L $LG_DIR ]] || { [[ ! -d $LG_DIR ]] && ! mkdir -m 700 -- "$LG_DIR" 2>/dev/null; }; then
    gg_log warn "ledger: cannot use $LG_DIR (a link, or not writable); the ledger is off"
    LG_OK=0
    return 0
  fi
  [[ -z $LG_DIGEST_DONE ]] || gg_write_atomic "$LG_DIR/digest-sent" "$LG_DIGEST_DONE"$'\n' || true
  ledger_save || true
}

# Writes the day file atomically, then empties the journal (unless $1 is
# "keep-journal": more lines of it may belong to the next day).
ledger_save() {
  ((LG_OK && ! LG_READONLY)) && [[ -n $LG_DAY ]] || return 0
  local text key user
  ledger_day_text_into text
  gg_write_atomic "$LG_DIR/$LG_DAY.tsv" "$text" || return 1
  LG_SAVED_SEQ=$LG_SEQ
  # a day ended during the replay: the rest of the journal is the next day's
  [[ ${1:-} == keep-journal || ${LG_REPLAYING:-0} == 1 ]] && return 0
  # the day file now holds every journaled cycle: start the journal again
  # (never through a link planted in the ledger folder)
  if [[ ! -L $LG_DIR/journal ]]; then
    : 2>/dev/null >"$LG_DIR/journal" || true
  fi
  LG_JOURNAL_N=0
}

# Puts the day file's text into the variable named $1.
ledger_day_text_into() {
  local -n text_ref=$1
  local key user
  text_ref="# gpuguard ledger 1"$'\n'"day"$'\t'"$LG_DAY"$'\n'
  text_ref+="last"$'\t'"$LG_LAST"$'\t'"$LG_SEQ"$'\n'
  for key in "${!LG_HELD[@]}"; do
    user=${key%%$'\t'*}
    # empty fields are written "-": read splits on runs of tabs
    text_ref+="job"$'\t'"$user"$'\t'"${LG_UID[$key]:--}"$'\t'"${key#*$'\t'}"$'\t'"${LG_HELD[$key]}"$'\t'"${LG_IDLE[$key]}"
    text_ref+=$'\t'"${LG_LONG[$key]}"$'\t'"${LG_LONG_END[$key]}"$'\t'"${LG_GPUS[$key]:--}"$'\t'"${LG_CMD[$key]:--}"$'\n'
  done
  for key in "${!LG_RUN[@]}"; do
    text_ref+="run"$'\t'"$key"$'\t'"${LG_RUN_KEY[$key]}"$'\t'"${LG_RUN[$key]}"$'\n'
  done
  for user in "${!LG_TOT_HELD[@]}"; do
    text_ref+="total"$'\t'"$user"$'\t'"${LG_TOT_HELD[$user]}"$'\t'"${LG_TOT_IDLE[$user]:-0}"$'\n'
  done
}

# The watchdog's per-cycle call: accounts the interval since the last
# accounted cycle from this cycle's sample and verdicts, journals it, saves
# every LEDGER_SAVE_EVERY cycles, and queues the daily digest when due.
# Globals:
#   SMI_* (this cycle's sample), IDLE_CYCLES, IDLE_SPIN (this cycle's
#   verdicts), MON_FAILS, CHECK_INTERVAL, IDLE_MEM_MIB (through idle_held)
# Arguments:
#   $1 now, unix seconds
ledger_cycle() {
  local now=$1
  ((${LG_OK:-0})) || return 0
  # a failed sample tells nothing: the next good one covers the gap; a
  # clock set back a little accounts nothing until it passes the last cycle
  # again (at most a capped gap), one set back further ends the wait
  if ((MON_FAILS == 0 && now >= LG_LAST)); then
    ledger_cycle_account "$now"
  elif ((LG_LAST - now > LEDGER_GAP_CYCLES * CHECK_INTERVAL)); then
    ledger_clock_back "$now"
  fi
  [[ -z ${LEDGER_DIGEST_AT:-} ]] || ledger_digest_maybe "$now"
}

# The clock reads more than a capped gap before the last accounted cycle.
# Time does not go backwards, so that cycle's clock was wrong (a VM that
# booted with its RTC ahead, a mistyped date -s): waiting for the clock to
# pass it again kept the ledger silent for as long as the clock had been
# ahead (400 days). The rule: the clock now is right; the last cycle's time
# and the open idle stretches are dropped (this cycle accounts nothing, as
# after any gap), and the day files of days after today, written by that
# clock, are removed (their day is after today's, so retention never takes
# them). The all-time counters are kept: a counter never goes down.
# Arguments:
#   $1 now, unix seconds
ledger_clock_back() {
  local now=$1 today file user gone='' seq=$LG_SEQ
  local -A tot_held=() tot_idle=()
  printf -v today '%(%Y-%m-%d)T' "$now"
  for file in "$LG_DIR"/????-??-??.tsv; do
    [[ -f $file && ${file##*/} > $today.tsv ]] || continue
    if rm -f -- "$file" 2>/dev/null; then gone+=" ${file##*/}"; fi
  done
  gg_log warn "ledger: the clock is $((LG_LAST - now)) s before the last accounted cycle: that cycle's clock was wrong; the ledger counts again from now${gone:+ (removed the day files of days after today:$gone)}"
  if [[ $LG_DAY > $today ]]; then
    # today's rows as saved before the clock went ahead; the counters and
    # the sequence number as they are now (the command lines of jobs
    # still running are kept, as at a rollover)
    for user in "${!LG_TOT_HELD[@]}"; do
      tot_held[$user]=${LG_TOT_HELD[$user]} tot_idle[$user]=${LG_TOT_IDLE[$user]:-0}
    done
    LG_NJOBS=0 LG_HELD=() LG_IDLE=() LG_LONG=() LG_LONG_END=() LG_GPUS=()
    if [[ -f $LG_DIR/$today.tsv ]]; then ledger_read_day "$LG_DIR/$today.tsv"; fi
    LG_DAY=$today LG_TOT_HELD=() LG_TOT_IDLE=()
    for user in "${!tot_held[@]}"; do
      LG_TOT_HELD[$user]=${tot_held[$user]} LG_TOT_IDLE[$user]=${tot_idle[$user]}
    done
  fi
  LG_RUN=() LG_RUN_KEY=()
  LG_LAST=$now LG_SEQ=$seq
  # saved now, the journal emptied: its cycles from the wrong clock are
  # not replayed by the next start
  ledger_save || true
}

# Accounts this cycle's sample, journals it, and saves every
# LEDGER_SAVE_EVERY journaled cycles.
ledger_cycle_account() {
  local now=$1 dt=0 cap=$((LEDGER_GAP_CYCLES * CHECK_INTERVAL)) seq line entry
  ((LG_LAST == 0)) || dt=$((now - LG_LAST))
  ((dt <= cap)) || dt=$cap
  local -a entries=()
  ledger_entries_into entries "$dt"
  seq=$((LG_SEQ + 1))
  ledger_account "$seq" "$now" "$dt" "${entries[@]}"
  printf -v line 'c\t%s\t%s\t%s' "$seq" "$now" "$dt"
  for entry in "${entries[@]}"; do line+=$'\t'$entry; done
  if gg_append "$LG_DIR/journal" "$line"$'\t.\n' 2>/dev/null; then
    LG_JOURNAL_N=$((LG_JOURNAL_N + 1))
  else
    # the journal cannot grow (disk full): save the day now instead
    LG_JOURNAL_N=$LEDGER_SAVE_EVERY
  fi
  ((LG_JOURNAL_N < LEDGER_SAVE_EVERY)) || ledger_save || true
}

# Puts one entry per holder of each held GPU of this cycle's sample into
# the array named $1 (see ledger_account), with its share of the $2 seconds
# of the interval. Held is the idle rule's own test (idle_held,
# lib/idle.sh: a free Ascend chip's firmware reserve is no job); a GPU is
# idle or stuck while the watchdog counts it so. An NPU's index is written
# npuN (as gpuguard status shows it), so that a mixed box's GPU 0 and NPU
# 0 stay two devices in the day file. Its holders (one per user
# and job) split its time by the memory each holds (evenly when one's is not
# known), so that each is booked, as the idle alert names each, and the
# day's GPU-seconds still add up to the GPUs' time; the biggest holder takes
# the seconds the split leaves over.
ledger_entries_into() {
  local -n entries_ref=$1
  local dt=$2 uuid pid mem best best_mem idle key rest line total even left idx
  local -A pids_now=() mem_of=() share=()
  local -a keys=()
  for uuid in "${SMI_UUIDS[@]}"; do
    best='' best_mem=-1 total=0 keys=() mem_of=()
    # "PID NAME MIB" lines (SMI_FS between), read by expansion (a cycle forks nothing)
    rest=${SMI_PROCS[$uuid]:-}
    while [[ -n $rest ]]; do
      line=${rest%%$'\n'*}
      rest=${rest#"$line"}
      rest=${rest#$'\n'}
      pid=${line%%"$SMI_FS"*} mem=${line##*"$SMI_FS"}
      [[ -n $pid && $pid != "$line" ]] || continue
      pids_now[$pid]=1
      mem=${mem%.*}
      [[ -n $mem && $mem != *[!0-9]* ]] || mem=0
      if ((mem > best_mem)); then
        best=$pid best_mem=$mem
      fi
      [[ -n ${LG_PIDKEY[$pid]:-} ]] || ledger_holder_key "$pid"
      key=${LG_PIDKEY[$pid]}
      [[ -n ${mem_of[$key]+set} ]] || keys+=("$key")
      mem_of[$key]=$((${mem_of[$key]:-0} + mem))
      total=$((total + mem))
    done
    idle_held "$uuid" || continue
    idle=0
    ((${IDLE_CYCLES[$uuid]:-0} > 0 || ${IDLE_SPIN[$uuid]:-0} > 0)) && idle=1
    idx=${SMI_INDEX[$uuid]:-?}
    [[ ${SMI_VENDOR[$uuid]:-} != ascend ]] || idx=npu$idx
    if [[ -z $best ]]; then
      entries_ref+=("$uuid/-|$idx|$idle|?|-|$dt")
      continue
    fi
    if ((${#keys[@]} == 1)); then
      # one holder (the common case): the whole interval, no split
      entries_ref+=("$uuid/${key#*|}|$idx|$idle|$key|$dt")
      continue
    fi
    even=0 left=$dt share=()
    for key in "${keys[@]}"; do
      ((${mem_of[$key]} > 0)) || even=1
    done
    for key in "${keys[@]}"; do
      if ((even)); then
        share[$key]=$((dt / ${#keys[@]}))
      else
        share[$key]=$((dt * ${mem_of[$key]} / total))
      fi
      left=$((left - ${share[$key]}))
    done
    key=${LG_PIDKEY[$best]}
    share[$key]=$((${share[$key]} + left))
    for key in "${keys[@]}"; do
      entries_ref+=("$uuid/${key#*|}|$idx|$idle|$key|${share[$key]}")
    done
  done
  # PIDs are reused: forget those no longer listed
  for pid in "${!LG_PIDKEY[@]}"; do
    [[ -n ${pids_now[$pid]:-} ]] || unset "LG_PIDKEY[$pid]"
  done
}

# Works out who holds a GPU through PID (once per PID: cached in
# LG_PIDKEY as "USER|JOB"): the job's user (name, "uid:N" without a passwd
# entry, "?" when it cannot be told), the job (Slurm job, else the top
# process and its start), and its masked command line for the day file.
ledger_holder_key() {
  local pid=$1 top uid name job cmd rc=0
  local -a st args
  local -A env=()
  jobinfo_holds_gpu "$pid" || rc=$?
  if ((rc == 1)) || ! jobinfo_top_into "$pid" top || ! jobinfo_stat_into "$top" st; then
    LG_PIDKEY[$pid]="?|pid:$pid"
    return 0
  fi
  jobinfo_user_into "$top" uid name
  [[ -n $name ]] || name=${uid:+uid:$uid}
  name=${name:-?}
  name=${name//[|$'\t']/_}
  jobinfo_environ_into "$pid" env SLURM_JOB_ID
  if [[ ${env[SLURM_JOB_ID]:-} =~ ^[0-9_]+$ ]]; then
    job=slurm:${env[SLURM_JOB_ID]}
  else
    job=pid:$top@${st[3]}
  fi
  LG_PIDKEY[$pid]=$name'|'$job
  local key=$name$'\t'$job
  # past the day's row cap a job gets no row of its own, nor a command line
  if [[ -z ${LG_CMD[$key]:-} ]] && ((LG_NJOBS < LEDGER_MAX_JOBS)); then
    jobinfo_args_into "$top" args
    cmd=''
    ((${#args[@]})) && jobinfo_mask_args_into cmd "${args[@]}"
    cmd=${cmd//[$'\t\n\r']/ }
    gg_cut_into cmd "$cmd" "$LEDGER_CMD_MAX"
    LG_CMD[$key]=$cmd
    LG_UID[$key]=$uid
    # journaled too: a cron run that replays the journal after the job has
    # ended still knows its command line (ledger_load)
    gg_append "$LG_DIR/journal" "j"$'\t'"$name"$'\t'"$job"$'\t'"${uid:--}"$'\t'"${cmd:--}"$'\t.\n' 2>/dev/null || true
  fi
}

# The label a user gets outside this box (LEDGER_NAMES): the name, a
# salted hash ("u" and 8 hex digits; the salt stays in the ledger folder)
# or nothing ('').
# shellcheck disable=SC2034 # name_ref: nameref, assigns the caller's variable
ledger_name_into() {
  local user=$1 salt=''
  local -n name_ref=$2
  case ${LEDGER_NAMES:-user} in
    none) name_ref='' ;;
    hash)
      if [[ -z ${LG_HASH[$user]:-} ]]; then
        ledger_salt_into salt
        local sum
        sum=$(printf '%s:%s' "$salt" "$user" | sha256sum)
        LG_HASH[$user]=u${sum:0:8}
      fi
      name_ref=${LG_HASH[$user]}
      ;;
    *) name_ref=$user ;;
  esac
}

# Puts the ledger's salt into the variable named $1 (made on first use).
ledger_salt_into() {
  local -n salt_ref=$1
  local file=$LG_DIR/salt
  { read -r salt_ref <"$file"; } 2>/dev/null || salt_ref=''
  [[ $salt_ref =~ ^[0-9a-f]{32}$ ]] && return 0
  salt_ref=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
  # private (0600), like a secret: the hash is only as good as the salt
  ((LG_READONLY)) || (umask 077 && gg_write_atomic "$file" "$salt_ref"$'\n') || true
}

# Puts the textfile samples of the all-time counters into the variables
# named $1 (held) and $2 (idle or stuck while held): "{user="NAME"} SECONDS"
# lines, users mapped by LEDGER_NAMES (all in one series when "none").
ledger_samples_into() {
  local -n held_ref=$1 idle_ref=$2
  held_ref='' idle_ref=''
  ((${LG_OK:-0})) || return 0
  local user label esc
  local -A held=() idle=()
  for user in "${!LG_TOT_HELD[@]}"; do
    ledger_name_into "$user" label
    # "k" + label: an empty label (LEDGER_NAMES=none) is no valid subscript
    held[k$label]=$((${held[k$label]:-0} + LG_TOT_HELD[$user]))
    idle[k$label]=$((${idle[k$label]:-0} + ${LG_TOT_IDLE[$user]:-0}))
  done
  for label in "${!held[@]}"; do
    textfile_label_escape_into "${label#k}" esc
    held_ref+="{user=\"$esc\"} ${held[$label]}"$'\n'
    idle_ref+="{user=\"$esc\"} ${idle[$label]}"$'\n'
  done
}

# Queues yesterday's digest once LEDGER_DIGEST_AT has passed today, once
# per day across restarts, kill -9 and cron runs: the day is marked in
# ledger/digest-sent after its event is queued, and an event already
# queued (a kill between the two) is found by its id in the outbox or in
# events.jsonl. Nothing is sent for a day without held GPUs.
ledger_digest_maybe() {
  local now=$1 hm h m s yesterday
  ((! LG_READONLY)) || return 0
  # a value a SIGHUP reload let through unchecked sends nothing
  [[ $LEDGER_DIGEST_AT == [0-2][0-9]:[0-5][0-9] ]] || return 0
  printf -v hm '%(%H:%M)T' "$now"
  [[ ! $hm < $LEDGER_DIGEST_AT ]] || return 0
  # yesterday as a calendar date: today's local noon less a day. The wall
  # clock's time since midnight is not the time elapsed on the days the
  # clocks change (25 or 23 hours), so "midnight less a second" landed on
  # today itself on a fall-back morning; noon is hours away from either end.
  printf -v h '%(%H %M %S)T' "$now"
  read -r h m s <<<"$h"
  printf -v yesterday '%(%Y-%m-%d)T' "$((now - 10#$h * 3600 - 10#$m * 60 - 10#$s + 12 * 3600 - 86400))"
  [[ $LG_DIGEST_DONE != "$yesterday" ]] || return 0
  ((LG_SEQ == LG_SAVED_SEQ)) || ledger_save || return 0
  local id="ledger-$yesterday" event=''
  if ! ledger_digest_queued "$id"; then
    local GPUGUARD_DEVICE_KINDS
    ledger_kinds_into GPUGUARD_DEVICE_KINDS
    event=$(gg_python gpuguard_ledger.py "LEDGER_NAMES GPU_HOUR_PRICE GPU_PRICE_CURRENCY GPUGUARD_DEVICE_KINDS LEDGER_KEEP_DAYS" \
      digest-event "$yesterday" --now "$now") || {
      # said once a day, tried again every cycle
      [[ ${LG_DIGEST_FAILED:-} == "$yesterday" ]] ||
        gg_log warn "ledger: could not build the digest for $yesterday; trying again every cycle"
      LG_DIGEST_FAILED=$yesterday
      return 0
    }
    [[ -z $event ]] || events_emit "$event"
  fi
  gg_write_atomic "$LG_DIR/digest-sent" "$yesterday"$'\n' || return 0
  LG_DIGEST_DONE=$yesterday
}

# True when the digest event with id $1 was queued already.
ledger_digest_queued() {
  local dir=$GPUGUARD_STATE_DIR
  grep -qsF -- "\"id\":\"$1\"" "$dir"/outbox/*.json "$dir/events.jsonl" "$dir/events.jsonl.1" 2>/dev/null
}

# Puts the kinds of device of this box (device_kinds_into, lib/npu.sh:
# "nvidia", "ascend" or "nvidia ascend") into the variable named $1, for
# python/gpuguard_ledger.py as GPUGUARD_DEVICE_KINDS: an Ascend box's
# ledger and digest say NPU and NPU-hours; a mixed box's keep the GPU words.
# shellcheck disable=SC2034 # _lg_kinds: nameref, assigns the caller's variable
ledger_kinds_into() {
  local -n _lg_kinds=$1
  _lg_kinds=nvidia
  if declare -F device_kinds_into >/dev/null; then device_kinds_into _lg_kinds; fi
}

# Runs a command (gpuguard ledger, gpuguard report) with today's ledger on
# its stdin: the day file's text as the watchdog holds it (the journal
# replayed), read only; nothing is written. GPUGUARD_DEVICE_KINDS is set
# for it (ledger_kinds_into): a gg_python that lists it passes it on.
ledger_with_today() {
  ledger_init readonly
  # shellcheck disable=SC2034 # read by gg_python through its list of names
  local text='' GPUGUARD_DEVICE_KINDS
  ledger_kinds_into GPUGUARD_DEVICE_KINDS
  ((LG_OK)) && [[ -n $LG_DAY ]] && ledger_day_text_into text
  "$@" <<<"$text"
}

# gpuguard ledger: today's ledger as the watchdog holds it and the days
# before, shown by python/gpuguard_ledger.py, which also says (stderr, and
# "no_ledger" in --json) when no watchdog keeps a ledger in this state
# folder: an empty day there is no fact (a user's own folder while the
# watchdog runs as root), as gpuguard status says of its counters. The text
# is in ASCII where the terminal's locale is not UTF-8 (gg_utf8_locale
# decides, GG_ASCII tells the helper).
# Arguments:
#   the command's options (--since WHEN, --json)
# shellcheck disable=SC2034 # LEDGER_NO_LEDGER, GG_ASCII: passed to the reader by name (gg_python)
ledger_show() {
  local LEDGER_NO_LEDGER='' GG_ASCII=1
  gg_utf8_locale && GG_ASCII=0
  gg_state_unwatched_into LEDGER_NO_LEDGER ledger ledger "no GPU time is booked there" "gpuguard ledger"
  ledger_with_today gg_python gpuguard_ledger.py \
    "LEDGER_NAMES GPU_HOUR_PRICE GPU_PRICE_CURRENCY NOTIFY_LANG GPUGUARD_DEVICE_KINDS LEDGER_NO_LEDGER GG_ASCII LEDGER_KEEP_DAYS" show "$@"
}

# Checks the ledger's keys that the configuration's kinds cannot.
# Returns:
#   2 with a one-line error for a LEDGER_DIGEST_AT that is not HH:MM
ledger_config_check() {
  [[ -z ${LEDGER_DIGEST_AT:-} || $LEDGER_DIGEST_AT =~ ^([01][0-9]|2[0-3]):[0-5][0-9]$ ]] && return 0
  gg_usage_error "LEDGER_DIGEST_AT must be HH:MM, 00:00-23:59, or empty for no digest (got '$LEDGER_DIGEST_AT')"
}
