#!/usr/bin/env bash
# Summary: alert when a GPU is held by processes but sits idle ("fake running")
# Usage: yichuidingyin.sh [--once] [--config FILE]
#        yichuidingyin.sh --version
#
# Watches every GPU with two nvidia-smi calls a cycle (--once), or, as a
# daemon checking every 10 s or more often, from two nvidia-smi loops kept
# running (one-shot calls while a loop is down). A GPU whose
# utilization stays under THRESHOLD % for MAX_IDLE_CYCLES cycles while
# processes hold it raises one alert, a reminder every REPEAT_INTERVAL
# seconds, and one resolved message when it is busy again or released.
#
#   --once         run one cycle and exit; for cron: * * * * * yichuidingyin.sh --once
#   --config FILE  read FILE (KEY=VALUE lines) instead of the default config
#   --version      print the version
#   -h, --help     show this help
#
# Keys (environment over config file over default):
#   THRESHOLD=10  CHECK_INTERVAL=60  MAX_IDLE_CYCLES=3  REPEAT_INTERVAL=3600
#   IDLE_MEM_MIB=1024  IDLE_POWER_PCT=22  SPIN_UTIL_MIN=90  SPIN_CYCLES=5
#   IDLE_RULES  GPU_HOUR_PRICE=0  GPU_PRICE_CURRENCY=¥  NVIDIA_SMI=nvidia-smi  SMI_TIMEOUT=10
#   SMI_FAIL_ALERT_CYCLES=5  SMI_STREAM=1  NOTIFY_URL  NOTIFY_TYPE  NOTIFY_SECRET
#   ALERTMANAGER_URL  GPUGUARD_STATE_DIR  GPUGUARD_LOG  GPUGUARD_TEXTFILE_DIR
#   RETENTION_DAYS=7  RETENTION_INTERVAL=300  HISTORY_MAX_FILES=1500
#   HISTORY_MAX_MB=30  EVENTS_MAX_MB=5 (disk bounds of the state folder)
#   LEDGER_DIGEST_AT (e.g. 09:00: yesterday's ledger to the targets)
#   LEDGER_NAMES=user|hash|none  LEDGER_KEEP_DAYS=35
#   GPUGUARD_DEVICE=auto (nvidia, ascend: Huawei Ascend NPUs)  NPU_SMI=npu-smi
# Webhook URLs and secrets belong in secrets.conf (mode 600) beside the
# config file; the environment still overrides both.
# Signals: SIGHUP re-reads the configuration (a bad file keeps the one in
# force; under nohup, which ignores SIGHUP, a warning says a restart is
# needed); SIGTERM/SIGINT stop after the current cycle, with one log line.
# Exit status: 0 done or stopped by SIGTERM/SIGINT, 1 another instance runs,
# 2 bad option, configuration or state folder (a link planted at its lock).

GPUGUARD_ROOT=${GPUGUARD_ROOT:-$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)}
# shellcheck source=../lib/common.sh
source "$GPUGUARD_ROOT/lib/common.sh"
# shellcheck source=../lib/config.sh
source "$GPUGUARD_ROOT/lib/config.sh"
# shellcheck source=../lib/smi.sh
source "$GPUGUARD_ROOT/lib/smi.sh"
# shellcheck source=../lib/npu.sh
source "$GPUGUARD_ROOT/lib/npu.sh"
# shellcheck source=../lib/events.sh
source "$GPUGUARD_ROOT/lib/events.sh"
# shellcheck source=../lib/textfile.sh
source "$GPUGUARD_ROOT/lib/textfile.sh"
# shellcheck source=../lib/jobinfo.sh
source "$GPUGUARD_ROOT/lib/jobinfo.sh"
# shellcheck source=../lib/idle.sh
source "$GPUGUARD_ROOT/lib/idle.sh"
# shellcheck source=../lib/gpuhistory.sh
source "$GPUGUARD_ROOT/lib/gpuhistory.sh"
# shellcheck source=../lib/ledger.sh
source "$GPUGUARD_ROOT/lib/ledger.sh"

main() {
  GG_PROG=yichuidingyin
  local once=0 now
  local -a argv=()
  gg_long_opts_split_into argv --config '' "$@"
  set -- ${argv[@]+"${argv[@]}"}
  while (($#)); do
    case $1 in
      --once) once=1 ;;
      --config)
        config_option '' "${@:2:1}" || return
        shift
        ;;
      -h | --help)
        gg_help "${BASH_SOURCE[0]}"
        return 0
        ;;
      --version)
        gg_print_version
        return 0
        ;;
      *) gg_usage_error "unknown option '$1' (see --help)" || return ;;
    esac
    shift
  done
  config_load || return
  gg_state_dir_init || return
  gg_lock "$GPUGUARD_STATE_DIR/yichuidingyin.lock" || return
  config_warn_secrets_unreadable
  idle_init
  idle_rules_load || return
  ledger_config_check || return
  idle_state_load
  ledger_init
  if ((once)); then
    # a textfile folder this user cannot write: said once across cron's runs
    TEXTFILE_ONCE_RUN=1
    idle_cycle "$(gg_now)" || gg_log error "cycle failed (exit $?)"
    gg_retention_maybe || true
    return 0
  fi
  WATCHDOG_STOP='' WATCHDOG_RELOAD=0 WATCHDOG_SLEEP_PID=''
  trap 'watchdog_wake TERM' TERM
  trap 'watchdog_wake INT' INT
  trap 'watchdog_wake HUP' HUP
  if gg_signal_ignored 1; then
    gg_log warn "SIGHUP was ignored when this daemon started (nohup?): it cannot reload its configuration; restart it to apply a change"
  fi
  gg_log info "watching GPUs every ${CHECK_INTERVAL}s (threshold ${THRESHOLD}%, ${MAX_IDLE_CYCLES} cycles, state in $GPUGUARD_STATE_DIR)"
  # nvidia-smi stays running in its loop mode between cycles (lib/smi.sh)
  smi_stream_begin "$CHECK_INTERVAL"
  while [[ -z $WATCHDOG_STOP ]]; do
    if ((WATCHDOG_RELOAD)); then
      WATCHDOG_RELOAD=0
      watchdog_reload
      smi_stream_begin "$CHECK_INTERVAL"
    fi
    # a failing cycle (disk full, a bug) is logged and the watch goes on:
    # in this `||` context nothing inside stops the daemon
    gg_now_into now
    if [[ ! -d $GPUGUARD_STATE_DIR ]] && ! watchdog_state_dir_recreate; then
      WATCHDOG_STOP=none
      break
    fi
    idle_cycle "$now" || gg_log error "cycle failed (exit $?); watching on"
    gg_retention_maybe || true
    [[ -n $WATCHDOG_STOP ]] && break
    ((WATCHDOG_RELOAD)) && continue
    sleep "$CHECK_INTERVAL" {GG_LOCK_FD}>&- &
    WATCHDOG_SLEEP_PID=$!
    # a signal caught before the line above found no sleep to cut short
    # (its trap ran first): waited for, that sleep would put off the stop
    # or the reload by a whole interval
    if [[ -z $WATCHDOG_STOP ]] && ((! WATCHDOG_RELOAD)); then
      wait "$WATCHDOG_SLEEP_PID" || true
    else
      kill "$WATCHDOG_SLEEP_PID" 2>/dev/null || true
    fi
    WATCHDOG_SLEEP_PID=''
  done
  smi_stream_end
  local saved=1
  idle_state_save || saved=0
  ledger_save || saved=0
  if [[ $WATCHDOG_STOP == none ]]; then
    gg_log error "stopped: the state folder $GPUGUARD_STATE_DIR could not be made again"
    return 1
  elif ((saved)); then
    gg_log info "stopped; state saved in $GPUGUARD_STATE_DIR/idle.state (SIG$WATCHDOG_STOP)"
  else
    gg_log error "stopped (SIG$WATCHDOG_STOP); the state could not be saved in $GPUGUARD_STATE_DIR: the next start counts idle time afresh"
  fi
}

# The state folder was removed under the daemon: makes it again and
# writes the idle counters and the day's ledger there at once, so that a
# restart finds them (see gg_state_dir_recreate).
watchdog_state_dir_recreate() {
  gg_state_dir_recreate "$GPUGUARD_STATE_DIR/yichuidingyin.lock" || return 1
  IDLE_SAVED_STATE=''
  idle_state_save || true
  ledger_dir_recreate
}

# Signal handler: TERM and INT stop after the current step, HUP asks for a
# reload; either ends the sleep between cycles at once.
watchdog_wake() {
  if [[ $1 == HUP ]]; then
    WATCHDOG_RELOAD=1
  else
    WATCHDOG_STOP=$1
  fi
  # (the sleep may be gone already: a TERM to the whole process group,
  # as systemctl stop sends, reached it too; a failed kill here ended the
  # daemon under errexit, before it saved its state)
  [[ -n ${WATCHDOG_SLEEP_PID:-} ]] && { kill "$WATCHDOG_SLEEP_PID" 2>/dev/null || true; }
  return 0
}

# Re-reads the configuration (SIGHUP). A bad new file leaves the one in
# force untouched and is reported in one line; the state folder cannot
# change while the daemon holds its lock there.
watchdog_reload() {
  local err state_dir=$GPUGUARD_STATE_DIR
  # a dry run in a subshell first, for the error line
  if ! err=$(config_load 2>&1 >/dev/null); then
    err=${err%$'\n'}
    gg_log error "SIGHUP: configuration not reloaded, keeping the one in force: ${err##*$'\n'}"
    return 0
  fi
  config_load || return 0
  if [[ $GPUGUARD_STATE_DIR != "$state_dir" ]]; then
    gg_log warn "SIGHUP: GPUGUARD_STATE_DIR changes only on restart; still using $state_dir"
    GPUGUARD_STATE_DIR=$state_dir
  fi
  gg_log info "SIGHUP: configuration reloaded from ${GG_CONFIG_FILE:-defaults and environment} (threshold ${THRESHOLD}%, every ${CHECK_INTERVAL}s, ${MAX_IDLE_CYCLES} cycles)"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  main "$@"
fi
