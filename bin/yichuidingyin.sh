#!/usr/bin/env bash
# Summary: alert when a GPU is held by processes but sits idle ("fake running")
# Usage: yichuidingyin.sh [--once] [--config FILE]
#
# Watches every GPU with two nvidia-smi calls a cycle. A GPU whose
# utilization stays under THRESHOLD % for MAX_IDLE_CYCLES cycles while
# processes hold it raises one alert, a reminder every REPEAT_INTERVAL
# seconds, and one resolved message when it is busy again or released.
#
#   --once         run one cycle and exit; for cron: * * * * * yichuidingyin.sh --once
#   --config FILE  read FILE (KEY=VALUE lines) instead of the default config
#   -h, --help     show this help
#
# Keys (environment over config file over default):
#   THRESHOLD=10  CHECK_INTERVAL=60  MAX_IDLE_CYCLES=3  REPEAT_INTERVAL=3600
#   IDLE_MEM_MIB=1024  IDLE_POWER_PCT=22  SPIN_UTIL_MIN=90  SPIN_CYCLES=5
#   IDLE_RULES  GPU_HOUR_PRICE=0  GPU_PRICE_CURRENCY=¥  NVIDIA_SMI=nvidia-smi  SMI_TIMEOUT=10
#   SMI_FAIL_ALERT_CYCLES=5  NOTIFY_URL  NOTIFY_TYPE  NOTIFY_SECRET
#   ALERTMANAGER_URL  GPUGUARD_STATE_DIR  GPUGUARD_LOG  GPUGUARD_TEXTFILE_DIR
# Exit status: 0 done or stopped by SIGTERM/SIGINT, 1 another instance runs,
# 2 bad option or configuration.

GPUGUARD_ROOT=${GPUGUARD_ROOT:-$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)}
# shellcheck source=../lib/common.sh
source "$GPUGUARD_ROOT/lib/common.sh"
# shellcheck source=../lib/config.sh
source "$GPUGUARD_ROOT/lib/config.sh"
# shellcheck source=../lib/smi.sh
source "$GPUGUARD_ROOT/lib/smi.sh"
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

main() {
  GG_PROG=yichuidingyin
  local once=0
  while (($#)); do
    case $1 in
      --once) once=1 ;;
      --config)
        [[ $# -ge 2 ]] || gg_usage_error "--config needs a file" || return
        export GPUGUARD_CONFIG=$2
        shift
        ;;
      --config=*) export GPUGUARD_CONFIG=${1#*=} ;;
      -h | --help)
        gg_help "${BASH_SOURCE[0]}"
        return 0
        ;;
      *) gg_usage_error "unknown option '$1' (see --help)" || return ;;
    esac
    shift
  done
  config_load || return
  gg_state_dir_init || return
  gg_lock "$GPUGUARD_STATE_DIR/yichuidingyin.lock" || return 1
  idle_init
  idle_rules_load || return
  idle_state_load
  if ((once)); then
    idle_cycle "$(gg_now)"
    return 0
  fi
  WATCHDOG_STOP=0
  trap 'WATCHDOG_STOP=1; [[ -n ${WATCHDOG_SLEEP_PID:-} ]] && kill "$WATCHDOG_SLEEP_PID" 2>/dev/null' TERM INT
  gg_log info "watching GPUs every ${CHECK_INTERVAL}s (threshold ${THRESHOLD}%, ${MAX_IDLE_CYCLES} cycles, state in $GPUGUARD_STATE_DIR)"
  while ((!WATCHDOG_STOP)); do
    idle_cycle "$(gg_now)"
    ((WATCHDOG_STOP)) && break
    sleep "$CHECK_INTERVAL" &
    WATCHDOG_SLEEP_PID=$!
    wait "$WATCHDOG_SLEEP_PID" || true
    WATCHDOG_SLEEP_PID=''
  done
  idle_state_save || true
  gg_log info "stopped; state saved in $GPUGUARD_STATE_DIR/idle.state"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  main "$@"
fi
