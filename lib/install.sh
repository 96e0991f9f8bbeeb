# shellcheck shell=bash
# install.sh's work: copy the tree under PREFIX/lib/gpuguard, link the
# commands into PREFIX/bin, place the config without overwriting an edited
# one, add cron or systemd, and record every path in a manifest so that
# --uninstall removes exactly that.

# shellcheck disable=SC2034 # INSTALL_UNINSTALL is read by install.sh main
INSTALL_COMMANDS=(yichuidingyin.sh gpu-leak-watch lowprio-run gpuguard)

# Parses the options into INSTALL_* globals.
install_parse() {
  INSTALL_PREFIX='' INSTALL_USER=0 INSTALL_CRON=0 INSTALL_SYSTEMD=0 INSTALL_UNINSTALL=0
  while (($#)); do
    case $1 in
      --prefix)
        [[ -n ${2:-} ]] || gg_usage_error "--prefix needs a folder" || return
        INSTALL_PREFIX=$2
        shift
        ;;
      --prefix=*) INSTALL_PREFIX=${1#*=} ;;
      --user) INSTALL_USER=1 ;;
      --cron) INSTALL_CRON=1 ;;
      --systemd) INSTALL_SYSTEMD=1 ;;
      --uninstall) INSTALL_UNINSTALL=1 ;;
      -h | --help)
        gg_help "$GPUGUARD_ROOT/install.sh"
        exit 0
        ;;
      *) gg_usage_error "unknown option '$1' (see --help)" || return ;;
    esac
    shift
  done
  if ((INSTALL_USER)); then
    : "${INSTALL_PREFIX:=${HOME:?}/.local}"
    INSTALL_CONFIG_DIR=${XDG_CONFIG_HOME:-$HOME/.config}/gpuguard
  else
    : "${INSTALL_PREFIX:=/usr/local}"
    INSTALL_CONFIG_DIR=/etc/gpuguard
  fi
  [[ $INSTALL_PREFIX == /* ]] || gg_usage_error "--prefix must be an absolute path (got '$INSTALL_PREFIX')" || return
  if ((INSTALL_SYSTEMD && INSTALL_USER)); then
    gg_usage_error "--systemd installs system units: not with --user (use --cron)" || return
  fi
  if ((INSTALL_SYSTEMD)) && [[ -z ${DESTDIR:-} ]] && ! gg_systemd_is_init; then
    gg_usage_error "systemd is not running here (PID 1 is $(cat /proc/1/comm 2>/dev/null)): use --cron, or nohup yichuidingyin.sh &" || return
  fi
  INSTALL_DEST=${DESTDIR:-}
  INSTALL_HOME=$INSTALL_PREFIX/lib/gpuguard
  INSTALL_MANIFEST=$INSTALL_DEST$INSTALL_HOME/.install-manifest
}

# Records a path (as installed, without DESTDIR) in the manifest.
install_record() {
  printf '%s\n' "$1" >>"$INSTALL_MANIFEST.new"
}

# Creates a folder (as installed, without DESTDIR) and records each level
# this install created, so --uninstall removes those and no others.
install_mkdir() {
  local path=$1 missing=()
  while [[ -n $path && $path != / && ! -d $INSTALL_DEST$path ]]; do
    missing+=("$path")
    path=$(dirname "$path")
  done
  mkdir -p "$INSTALL_DEST$1"
  for path in "${missing[@]}"; do
    install_record "$path"
  done
}

install_apply() {
  local d=$INSTALL_DEST home=$INSTALL_DEST$INSTALL_HOME
  local previous=''
  [[ -f $INSTALL_MANIFEST ]] && previous=$(<"$INSTALL_MANIFEST")
  # a run that died half-way may have left its list: start a fresh one
  rm -f -- "$INSTALL_MANIFEST.new"
  install_mkdir "$INSTALL_HOME"
  install_mkdir "$INSTALL_PREFIX/bin"
  # The tree, replaced as a whole so that files removed upstream go too.
  local part
  for part in bin lib python etc VERSION; do
    rm -rf -- "${home:?}/$part"
    cp -R -- "$GPUGUARD_ROOT/$part" "$home/$part"
    install_record "$INSTALL_HOME/$part"
  done
  local cmd
  for cmd in "${INSTALL_COMMANDS[@]}"; do
    ln -sfn -- "../lib/gpuguard/bin/$cmd" "$d$INSTALL_PREFIX/bin/$cmd"
    install_record "$INSTALL_PREFIX/bin/$cmd"
  done
  install_config
  ((INSTALL_CRON)) && install_cron
  ((INSTALL_SYSTEMD)) && install_systemd
  if ((!INSTALL_USER)); then
    install_mkdir /etc/logrotate.d
    cp -- "$GPUGUARD_ROOT/etc/logrotate.d/gpuguard" "$d/etc/logrotate.d/gpuguard"
    install_record /etc/logrotate.d/gpuguard
  fi
  # Keep paths from an earlier install that this one did not redo (cron,
  # units) so --uninstall still finds them.
  if [[ -n $previous ]]; then
    printf '%s\n' "$previous" >>"$INSTALL_MANIFEST.new"
  fi
  install_record "$INSTALL_HOME/.install-manifest"
  sort -u "$INSTALL_MANIFEST.new" >"$INSTALL_MANIFEST"
  rm -f -- "$INSTALL_MANIFEST.new"
  gg_log info "installed gpuguard $(<"$GPUGUARD_ROOT/VERSION") in $INSTALL_PREFIX (commands in $INSTALL_PREFIX/bin, config $INSTALL_CONFIG_DIR/gpuguard.conf)"
  case ":$PATH:" in
    *":$INSTALL_PREFIX/bin:"*) ;;
    *) gg_log warn "$INSTALL_PREFIX/bin is not on PATH: add it (export PATH=\"$INSTALL_PREFIX/bin:\$PATH\")" ;;
  esac
}

# Places the config: never over an edited one; mode 600 (it may hold tokens).
install_config() {
  local conf=$INSTALL_DEST$INSTALL_CONFIG_DIR/gpuguard.conf
  install_mkdir "$INSTALL_CONFIG_DIR"
  if [[ -f $conf ]] && ! cmp -s "$conf" "$GPUGUARD_ROOT/etc/gpuguard.conf"; then
    gg_log info "kept your edited $INSTALL_CONFIG_DIR/gpuguard.conf"
    return 0
  fi
  install -m 600 "$GPUGUARD_ROOT/etc/gpuguard.conf" "$conf"
  install_record "$INSTALL_CONFIG_DIR/gpuguard.conf"
}

# The cron line: the watchdog once a minute, logging to a file.
install_cron_line() {
  local log=/var/log/gpuguard.log
  ((INSTALL_USER)) && log=${XDG_STATE_HOME:-$HOME/.local/state}/gpuguard.log
  printf '* * * * * %s%s/bin/yichuidingyin.sh --once >>%s 2>&1\n' \
    "$( ((INSTALL_USER)) || echo 'root ')" "$INSTALL_PREFIX" "$log"
}

install_cron() {
  if ((INSTALL_USER)); then
    local current
    current=$(crontab -l 2>/dev/null | grep -v '# gpuguard$' || true)
    printf '%s\n%s # gpuguard\n' "$current" "$(install_cron_line)" | sed '/^$/d' | crontab -
    install_record "crontab:# gpuguard"
  else
    install_mkdir /etc/cron.d
    {
      printf '# gpuguard idle watchdog, installed by install.sh --cron\n'
      printf 'SHELL=/bin/bash\nPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n'
      install_cron_line
    } >"$INSTALL_DEST/etc/cron.d/gpuguard"
    chmod 644 "$INSTALL_DEST/etc/cron.d/gpuguard"
    install_record /etc/cron.d/gpuguard
  fi
}

install_systemd() {
  local unit dir=$INSTALL_DEST/etc/systemd/system
  install_mkdir /etc/systemd/system
  for unit in gpuguard-idle.service gpuguard-leak.service; do
    sed "s|@PREFIX@|$INSTALL_PREFIX|g" "$GPUGUARD_ROOT/etc/systemd/$unit" >"$dir/$unit"
    install_record "/etc/systemd/system/$unit"
  done
  if [[ -z $INSTALL_DEST ]]; then
    systemctl daemon-reload
    systemctl enable --now gpuguard-idle.service gpuguard-leak.service
  fi
}

# Removes what the manifest lists; an edited config is kept.
install_remove() {
  if [[ ! -f $INSTALL_MANIFEST ]]; then
    gg_usage_error "nothing to uninstall: no $INSTALL_MANIFEST" || return
  fi
  local path
  if grep -q '^/etc/systemd/system/' "$INSTALL_MANIFEST" && [[ -z $INSTALL_DEST ]] && gg_systemd_is_init; then
    systemctl disable --now gpuguard-idle.service gpuguard-leak.service 2>/dev/null || true
  fi
  # Longest paths first: files before the folders that hold them.
  while IFS= read -r path; do
    case $path in
      'crontab:# gpuguard')
        crontab -l 2>/dev/null | grep -v '# gpuguard$' | crontab - || true
        ;;
      */gpuguard.conf)
        if cmp -s "$INSTALL_DEST$path" "$GPUGUARD_ROOT/etc/gpuguard.conf"; then
          rm -f -- "$INSTALL_DEST$path"
        elif [[ -f $INSTALL_DEST$path ]]; then
          gg_log warn "kept your edited $path"
        fi
        ;;
      *)
        if [[ -d $INSTALL_DEST$path && ! -L $INSTALL_DEST$path ]]; then
          case $path in
            "$INSTALL_HOME"/*) rm -rf -- "${INSTALL_DEST}${path:?}" ;;
            *) rmdir -- "$INSTALL_DEST$path" 2>/dev/null || true ;;
          esac
        else
          rm -f -- "$INSTALL_DEST$path"
        fi
        ;;
    esac
  done < <(awk '{ print length, $0 }' "$INSTALL_MANIFEST" | sort -rn | cut -d' ' -f2-)
  gg_log info "uninstalled gpuguard from $INSTALL_PREFIX"
}
