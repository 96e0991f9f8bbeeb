#!/usr/bin/env bash
# Summary: install gpuguard so its commands run from any directory
# Usage: ./install.sh [--prefix DIR] [--user] [--cron] [--systemd] [--uninstall]
#
#   --prefix DIR   where to install (default /usr/local; with --user ~/.local)
#   --user         install for this user: ~/.local, ~/.config/gpuguard,
#                  the user's crontab
#   --cron         run the idle watchdog every minute from cron
#                  (/etc/cron.d/gpuguard, or the user's crontab)
#   --systemd      install and start systemd units for the watchdog and the
#                  leak watch (needs systemd as PID 1)
#   --uninstall    remove exactly what an earlier install put in place (an
#                  edited config file is kept)
# Commands go to PREFIX/bin (links into PREFIX/lib/gpuguard), the config to
# /etc/gpuguard/gpuguard.conf (mode 600, never overwritten). No network.
# DESTDIR=DIR stages everything under DIR (packaging, tests).

GPUGUARD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/common.sh
source "$GPUGUARD_ROOT/lib/common.sh"
# shellcheck source=lib/install.sh
source "$GPUGUARD_ROOT/lib/install.sh"

main() {
  GG_PROG=install.sh
  install_parse "$@" || return
  if ((INSTALL_UNINSTALL)); then
    install_remove
  else
    install_apply
  fi
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  main "$@"
fi
