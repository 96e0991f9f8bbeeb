# shellcheck shell=bash
# The one place events leave from. An event is one JSON object: it is
# appended to $GPUGUARD_STATE_DIR/events.jsonl, logged, and, when a
# notification target is configured, written to the outbox before the alert
# helper is asked to deliver it, so a crash, a missing python3 or a receiver
# that is down never loses it: the outbox is retried on every later cycle.

# The configuration keys the alert helper reads (gg_python exports only these).
EVENTS_PY_VARS="NOTIFY_URL NOTIFY_TYPE NOTIFY_SECRET NOTIFY_LANG NOTIFY_TIMEOUT NOTIFY_RETRIES NOTIFY_RATE_PER_MIN NOTIFY_MENTION ALERTMANAGER_URL OUTBOX_MAX REPEAT_INTERVAL"

# Appends an event and hands it to the alert helper.
# Arguments:
#   $1 the event, one line of JSON
# Globals:
#   GPUGUARD_STATE_DIR, NOTIFY_URL, ALERTMANAGER_URL, GPUGUARD_ROOT
events_emit() {
  local event=$1 dir=$GPUGUARD_STATE_DIR
  {
    flock 9
    gg_append "$dir/events.jsonl" "$event"$'\n' || true
  } 9>>"$dir/events.lock"
  if events_targets_configured; then
    local name
    # Names sort in emission order: microseconds since the epoch, then PID
    # and a per-process sequence for events of the same microsecond.
    EVENTS_SEQ=$((${EVENTS_SEQ:-0} + 1))
    printf -v name '%s/outbox/%s-%s-%06d.json' "$dir" "${EPOCHREALTIME/[.,]/}" "$$" "$EVENTS_SEQ"
    gg_write_atomic "$name" "$event"$'\n' ||
      gg_log error "could not write $name; the event stays in events.jsonl only"
    events_flush
  fi
}

# True when any notification target is configured.
events_targets_configured() {
  [[ -n ${NOTIFY_URL:-} || -n ${ALERTMANAGER_URL:-} ]]
}

# Asks the alert helper to deliver what waits in the outbox, oldest first.
# Cheap when the outbox is empty: no Python is started.
events_flush() {
  local dir=$GPUGUARD_STATE_DIR/outbox
  events_targets_configured || return 0
  compgen -G "$dir/*.json" >/dev/null || return 0
  if ! command -v python3 >/dev/null; then
    gg_log error "python3 not found: events wait in $dir"
    return 0
  fi
  gg_python gpuguard_alert.py "$EVENTS_PY_VARS" flush ||
    gg_log warn "alert helper exited $?; undelivered events stay in $dir"
}

# Sends a test message to every target and prints one line per target.
# Returns:
#   0 when every target accepted it, 1 otherwise or when none is configured
events_test_alert() {
  command -v python3 >/dev/null || {
    gg_log error "python3 not found: it is needed to send alerts"
    return 1
  }
  gg_python gpuguard_alert.py "$EVENTS_PY_VARS" test
}
