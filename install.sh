#!/usr/bin/env bash
# Summary: install gpuguard so its commands run from any directory
# Usage: ./install.sh [--prefix DIR] [--user] [--cron] [--systemd] [--setup-disk] [--uninstall] [--version]
#
#   --prefix DIR   where to install (default /usr/local; with --user ~/.local)
#   --user         install for this user: ~/.local, ~/.config/gpuguard,
#                  the user's crontab
#   --cron         run the idle watchdog every minute from cron
#                  (/etc/cron.d/gpuguard, or the user's crontab; --user
#                  needs the crontab command; it warns when no cron daemon
#                  runs)
#   --systemd      install and start systemd units for the watchdog and the
#                  leak watch (needs systemd as PID 1)
#   --setup-disk   turn iocost on for this host's disks (root only; as
#                  lowprio-run --setup-disk): lowprio-run's default tier then
#                  bounds a job's disk use without slowing it on an idle disk
#   --uninstall    remove exactly what an earlier install put in place (an
#                  edited config or secrets file is kept, and so is anything
#                  else put in its folders); disks set up by --setup-disk
#                  get back the iocost settings they had (the last
#                  install's uninstall does it); what another prefix's
#                  install still uses stays (README: Install)
#   --version      print the version
# Commands go to PREFIX/bin (links into PREFIX/lib/gpuguard; a file of
# one's own there stops the install, exit 2), the shared
# config to /etc/gpuguard/gpuguard.conf (mode 644, no secrets: every user's
# commands read it) and the secrets (webhook URLs, signing secret) to
# /etc/gpuguard/secrets.conf (mode 600); neither is ever overwritten. With
# --user: ~/.config/gpuguard/. Prerequisites are checked first; a failure
# part-way removes what the run had put in place, and the list of installed
# paths is written only on success. Modes are explicit: the caller's umask
# does not matter. No network. DESTDIR=DIR stages everything under DIR
# (packaging, tests).

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
