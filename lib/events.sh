# shellcheck shell=bash
# The one place events leave from (ARCHITECTURE.md, rule 4). An event is one JSON object.
# events_emit only ENQUEUES: it appends the event to
# $GPUGUARD_STATE_DIR/events.jsonl and, when a target is configured, writes
# it durably to the outbox (temp file, rename, fsync); it never sends.
# Each command saves its own state first and then calls events_flush once a
# cycle, which has the alert helper deliver one digest per target for
# everything waiting. A crash, a missing python3, a full disk or a receiver
# that is down never loses an event: the outbox is retried on later cycles.

# Runs the alert helper with only the variables it needs (ARCHITECTURE.md, rule 2: through
# gg_python where lib/common.sh has it; the configuration is not exported).
# Arguments:
#   $@ the helper's command and arguments
events_helper() {
  local vars="NOTIFY_URL NOTIFY_TYPE NOTIFY_SECRET NOTIFY_LANG NOTIFY_TIMEOUT NOTIFY_RETRIES"
  vars+=" NOTIFY_RATE_PER_MIN NOTIFY_MENTION ALERTMANAGER_URL OUTBOX_MAX REPEAT_INTERVAL GPU_HOUR_PRICE GPU_PRICE_CURRENCY"
  if declare -F gg_python >/dev/null; then
    gg_python gpuguard_alert.py "$vars" "$@"
    return
  fi
  if ! command -v python3 >/dev/null; then
    gg_log error "python3 not found: it is needed to send alerts; events wait in $GPUGUARD_STATE_DIR/outbox"
    return 127
  fi
  python3 -S "$GPUGUARD_ROOT/python/gpuguard_alert.py" "$@"
}

# Appends an event to events.jsonl and queues it for delivery.
# Arguments:
#   $1 the event, one line of JSON
# Globals:
#   GPUGUARD_STATE_DIR, NOTIFY_URL, ALERTMANAGER_URL; EVENTS_PENDING (set)
events_emit() {
  local event=$1 dir=$GPUGUARD_STATE_DIR
  # The outbox first: after a crash the watchdog re-queues a pending event
  # whose id is not yet in events.jsonl, so events.jsonl must never hold an
  # event that the outbox lacks.
  if events_targets_configured; then
    declare -ga EVENTS_PENDING
    EVENTS_PENDING+=("$event")
    events_enqueue_pending || true
  else
    events_warn_no_target
  fi
  # a link planted at the lock is refused (one line), never followed; a
  # folder removed this moment (the daemon makes it again before its next
  # cycle) is one "cannot write" line, not bash's own redirection error
  gg_refuse_link "$dir/events.lock" || return 0
  if [[ ! -d $dir ]]; then
    gg_write_failed "$dir/events.jsonl"
    return 0
  fi
  {
    flock 9
    # a file whose last line was cut (a crash, a full disk) gets a new line
    # first: glued to the fragment, this event would be lost with it
    local start=''
    [[ -s $dir/events.jsonl && -n $(tail -c 1 -- "$dir/events.jsonl" 2>/dev/null) ]] && start=$'\n'
    gg_append "$dir/events.jsonl" "$start$event"$'\n' || gg_write_failed "$dir/events.jsonl"
  } 9>>"$dir/events.lock"
}

# Writes the events kept in memory (EVENTS_PENDING) to the outbox, oldest
# first; what cannot be written (a full disk) stays in memory for the next
# call, so the daemon catches up when space returns.
events_enqueue_pending() {
  local dir=$GPUGUARD_STATE_DIR/outbox i name
  declare -ga EVENTS_PENDING
  EVENTS_PENDING+=()
  for i in "${!EVENTS_PENDING[@]}"; do
    # Names sort in emission order: microseconds since the epoch, then PID
    # and a per-process sequence for events of the same microsecond.
    EVENTS_SEQ=$((${EVENTS_SEQ:-0} + 1))
    printf -v name '%s/%s-%s-%06d.json' "$dir" "${EPOCHREALTIME/[.,]/}" "$$" "$EVENTS_SEQ"
    # a failure (disk full) is said once for all writers (gg_write_failed)
    gg_write_atomic "$name" "${EVENTS_PENDING[i]}"$'\n' 2>/dev/null || return 1
    # durable before anyone may send it: the file's data, then its name
    sync -- "$name" "$dir" 2>/dev/null || true
    unset 'EVENTS_PENDING[i]'
  done
  EVENTS_PENDING=("${EVENTS_PENDING[@]}")
}

# True when any notification target is configured.
events_targets_configured() {
  [[ -n ${NOTIFY_URL:-} || -n ${ALERTMANAGER_URL:-} ]]
}

# Says once, loudly, that no target is configured: once per state folder (a
# marker folder; mkdir never follows a planted link) until one is set.
events_warn_no_target() {
  ((${EVENTS_NO_TARGET_SAID:-0})) && return 0
  EVENTS_NO_TARGET_SAID=1
  mkdir -- "$GPUGUARD_STATE_DIR/no-target.warned" 2>/dev/null || return 0
  gg_log warn "NO ALERT TARGET CONFIGURED: events go only to the log and $GPUGUARD_STATE_DIR/events.jsonl; set NOTIFY_URL or ALERTMANAGER_URL (secrets.conf), then: gpuguard notify --test"
}

# Delivers what waits in the outbox: one digest per target. Cheap when the
# outbox is empty: no Python is started.
events_flush() {
  local dir=$GPUGUARD_STATE_DIR/outbox
  if ! events_targets_configured; then
    events_warn_no_target
    return 0
  fi
  declare -F config_say_bad_targets >/dev/null && config_say_bad_targets
  if [[ -d $GPUGUARD_STATE_DIR/no-target.warned ]]; then
    rmdir -- "$GPUGUARD_STATE_DIR/no-target.warned" 2>/dev/null || true
  fi
  declare -ga EVENTS_PENDING
  EVENTS_PENDING+=()
  ((${#EVENTS_PENDING[@]} == 0)) || events_enqueue_pending || true
  compgen -G "$dir/*.json" >/dev/null || return 0
  events_helper flush || gg_log warn "alert helper exited $?; undelivered events stay in $dir"
}

# Sends a test message to every target and prints one line per target.
# Returns:
#   0 when every target accepted it, 1 otherwise or when none is configured
events_test_alert() {
  local hint
  if ! events_targets_configured; then
    config_no_target_hint_into hint
    printf 'no target configured: %s\n' "$hint"
    return 1
  fi
  events_helper test
}

# gpuguard notify: --test sends a test message to every target; --check
# checks them without sending; --preview [FILE|-] prints each provider's
# message for recorded events (default: the last event of events.jsonl);
# --flush delivers the outbox now.
# Arguments:
#   $@ the subcommand's options
events_notify() {
  local action='' source='' hint
  while (($#)); do
    case $1 in
      --test | --check | --flush) action=${1#--} ;;
      --preview)
        action=preview
        if [[ $# -ge 2 && $2 != --* ]]; then
          source=$2
          shift
        fi
        ;;
      *) gg_usage_error "notify: unknown option '$1' (--test, --check, --preview [FILE|-], --flush)" || return ;;
    esac
    shift
  done
  case $action in
    test) events_test_alert ;;
    check)
      if ! events_targets_configured; then
        config_no_target_hint_into hint
        printf 'no alert target configured: %s\n' "$hint"
        return 1
      fi
      events_helper check
      ;;
    preview)
      if [[ -n $source && $source != - && ! -r $source ]]; then
        gg_usage_error "notify --preview: cannot read '$source'" || return
      fi
      events_helper preview ${source:+"$source"}
      ;;
    flush)
      if ! events_targets_configured; then
        printf 'no alert target configured: events stay in %s\n' "$GPUGUARD_STATE_DIR/events.jsonl"
        return 1
      fi
      events_flush
      ;;
    *) gg_usage_error "notify needs --test, --check, --preview [FILE|-] or --flush" ;;
  esac
}
