# shellcheck shell=bash
# install.sh's work: check every prerequisite first, then install each file
# of the tree under PREFIX/lib/gpuguard with an explicit mode (whatever the
# caller's umask or the checkout's modes), link the commands into
# PREFIX/bin, place the shared config (0644, no secrets) and the secrets
# file (0600) without overwriting edited ones, add cron or systemd. Every
# path this run creates is listed; a failure removes them again, and the
# manifest is written only when everything succeeded, so that --uninstall
# removes exactly what it lists.

# shellcheck disable=SC2034 # INSTALL_UNINSTALL is read by install.sh main
INSTALL_COMMANDS=(yichuidingyin.sh gpu-leak-watch lowprio-run gpuguard)
# The parts of the source tree that are installed.
INSTALL_PARTS=(bin lib python etc VERSION)
# Keys that belong in secrets.conf, never in the shared config.

INSTALL_REGISTRY_HEADER="# gpuguard installs sharing this folder's config (install.sh keeps this list; --uninstall of one leaves what another still uses)"

# Parses the options into INSTALL_* globals.
install_parse() {
  INSTALL_PREFIX='' INSTALL_USER=0 INSTALL_CRON=0 INSTALL_SYSTEMD=0 INSTALL_UNINSTALL=0 INSTALL_SETUP_DISK=0
  while (($#)); do
    case $1 in
      --prefix)
        [[ -n ${2:-} ]] || gg_usage_error "--prefix needs a folder" || return
        INSTALL_PREFIX=$2
        shift
        ;;
      --prefix=*)
        # (--prefix=$PREFIX with PREFIX unset installed system-wide)
        [[ -n ${1#*=} ]] || gg_usage_error "--prefix needs a folder" || return
        INSTALL_PREFIX=${1#*=}
        ;;
      --user) INSTALL_USER=1 ;;
      --cron) INSTALL_CRON=1 ;;
      --systemd) INSTALL_SYSTEMD=1 ;;
      --setup-disk) INSTALL_SETUP_DISK=1 ;;
      --uninstall) INSTALL_UNINSTALL=1 ;;
      -h | --help)
        gg_help "$GPUGUARD_ROOT/install.sh"
        exit 0
        ;;
      --version)
        gg_print_version
        exit 0
        ;;
      *) gg_usage_error "unknown option '$1' (see --help)" || return ;;
    esac
    shift
  done
  if ((INSTALL_USER)); then
    [[ -n ${HOME:-} ]] || gg_usage_error "--user installs under HOME, which is not set" || return
    : "${INSTALL_PREFIX:=$HOME/.local}"
    INSTALL_CONFIG_DIR=${XDG_CONFIG_HOME:-$HOME/.config}/gpuguard
  else
    : "${INSTALL_PREFIX:=/usr/local}"
    INSTALL_CONFIG_DIR=/etc/gpuguard
  fi
  [[ $INSTALL_PREFIX == /* ]] || gg_usage_error "--prefix must be an absolute path (got '$INSTALL_PREFIX')" || return
  if ((INSTALL_SYSTEMD && INSTALL_USER)); then
    gg_usage_error "--systemd installs system units: not with --user (use --cron)" || return
  fi
  INSTALL_DEST=${DESTDIR:-}
  if ((INSTALL_SETUP_DISK)) && { ((INSTALL_USER || EUID != 0)) || [[ -n $INSTALL_DEST ]]; }; then
    gg_usage_error "--setup-disk turns iocost on for this host's disks: root only, and not with --user or DESTDIR" || return
  fi
  INSTALL_HOME=$INSTALL_PREFIX/lib/gpuguard
  INSTALL_MANIFEST=$INSTALL_DEST$INSTALL_HOME/.install-manifest
  # Every install that shares the config folder (and, system-wide, the
  # cron, systemd and logrotate files) is listed here, so that --uninstall
  # of one leaves what another still uses.
  INSTALL_REGISTRY=$INSTALL_CONFIG_DIR/installs
}

# True when a folder (as installed, without DESTDIR) can be created or
# written: the nearest existing level is a writable folder.
install_writable() {
  local path=$INSTALL_DEST$1
  while [[ -n $path && ! -e $path ]]; do
    path=${path%/*}
  done
  path=${path:-/}
  [[ -d $path && -w $path ]]
}

# True when a cron daemon runs (cron, crond, cronie, fcron, busybox crond).
install_cron_daemon_running() {
  local f comm
  for f in /proc/[0-9]*/comm; do
    { read -r comm <"$f"; } 2>/dev/null || continue
    case $comm in
      cron | crond | cronie | fcron | anacron | busybox-crond) return 0 ;;
    esac
  done
  return 1
}

# Checks everything an install needs before anything is written; one line
# and status 2 for what is missing. Warns where the result would not run.
install_check() {
  local dir
  local -a dirs=("$INSTALL_PREFIX" "$INSTALL_CONFIG_DIR")
  ((INSTALL_USER)) || dirs+=(/etc/logrotate.d)
  ((INSTALL_CRON && ! INSTALL_USER)) && dirs+=(/etc/cron.d)
  ((INSTALL_SYSTEMD)) && dirs+=(/etc/systemd/system)
  for dir in "${dirs[@]}"; do
    if ! install_writable "$dir"; then
      gg_usage_error "cannot write under $INSTALL_DEST$dir: run it with sudo, or install for yourself with --user" || return
    fi
  done
  local cmd
  local -a foreign=()
  for cmd in "${INSTALL_COMMANDS[@]}"; do
    if [[ -e $INSTALL_DEST$INSTALL_PREFIX/bin/$cmd || -L $INSTALL_DEST$INSTALL_PREFIX/bin/$cmd ]] &&
      ! install_is_our_link "$INSTALL_PREFIX/bin/$cmd"; then
      foreign+=("$INSTALL_PREFIX/bin/$cmd")
    fi
  done
  if ((${#foreign[@]})); then
    gg_usage_error "${foreign[*]}: not installed by gpuguard, and an install would replace it: move it away or install with another --prefix; nothing was installed" || return
  fi
  if ((INSTALL_SYSTEMD)) && [[ -z $INSTALL_DEST ]] && ! gg_systemd_is_init; then
    gg_usage_error "systemd is not running here (PID 1 is $(cat /proc/1/comm 2>/dev/null)): use --cron, or nohup yichuidingyin.sh &" || return
  fi
  if ((INSTALL_CRON && INSTALL_USER)) && ! command -v crontab >/dev/null; then
    gg_usage_error "--cron needs the crontab command (Debian/Ubuntu: apt-get install cron); nothing was installed. Without cron: install without --cron and start the watchdog with nohup yichuidingyin.sh &" || return
  fi
  if ((INSTALL_CRON)) && ! install_cron_daemon_running; then
    gg_log warn "no cron daemon is running here: the watchdog entry will not run until one is started (service cron start, or systemctl enable --now cron); or run the watchdog as a service (--systemd) or with nohup yichuidingyin.sh &"
  fi
  return 0
}

# True when PREFIX/bin/CMD ($1, as installed) is the link install.sh puts
# there; anything else in its place is someone's own, never replaced or
# removed.
install_is_our_link() {
  local link
  link=$(readlink -- "$INSTALL_DEST$1") && [[ $link == "../lib/gpuguard/bin/${1##*/}" ]]
}

# Records a path this run installed (as installed, without DESTDIR) for the
# manifest; $2=new also for the roll-back (it did not exist before).
install_record() {
  INSTALL_LISTED+=("$1")
  [[ ${2:-new} == new ]] && INSTALL_CREATED+=("$1")
  return 0
}

# Creates a folder (as installed, without DESTDIR), mode 755, recording each
# level this run created, so that --uninstall removes those and no others.
install_mkdir() {
  local path=$1
  local -a missing=()
  while [[ -n $path && $path != / && ! -d $INSTALL_DEST$path ]]; do
    missing=("$path" "${missing[@]}")
    path=${path%/*}
  done
  for path in "${missing[@]}"; do
    mkdir -m 755 -- "$INSTALL_DEST$path" || return
    install_record "$path"
  done
}

# Installs one file with a mode: a temporary file in the target folder,
# then rename, so a reader never sees half a file and a symlink placed at
# the target is replaced, not followed.
# Arguments:
#   $1 source file, $2 destination (as installed), $3 mode
install_file() {
  local src=$1 dest=$2 mode=$3 tmp was=new
  [[ -e $INSTALL_DEST$dest ]] && was=old
  tmp=$(mktemp -- "$INSTALL_DEST$dest.XXXXXX") || return
  if ! { cp -- "$src" "$tmp" && chmod "$mode" -- "$tmp" && mv -f -- "$tmp" "$INSTALL_DEST$dest"; }; then
    rm -f -- "$tmp"
    return 1
  fi
  install_record "$dest" "$was"
}

# Writes text to a file (as installed) with a mode, the same safe way.
install_text() {
  local dest=$1 mode=$2 text=$3 tmp was=new
  [[ -e $INSTALL_DEST$dest ]] && was=old
  tmp=$(mktemp -- "$INSTALL_DEST$dest.XXXXXX") || return
  if ! { printf '%s' "$text" >"$tmp" && chmod "$mode" -- "$tmp" && mv -f -- "$tmp" "$INSTALL_DEST$dest"; }; then
    rm -f -- "$tmp"
    return 1
  fi
  install_record "$dest" "$was"
}

# Copies the tree: staged in a temporary folder beside it, then copied
# over it with --remove-destination (a new file for each, so a running
# daemon keeps reading the old one), then modes made explicit (executables
# 755, the rest 644, folders 755). Files of one's own put in the tree stay.
install_tree() {
  local home=$INSTALL_DEST$INSTALL_HOME stage rel
  local -a rels=() paths=()
  stage=$(mktemp -d -- "$home/.staging.XXXXXX") || return
  INSTALL_STAGE=$stage
  cp -R -- "${INSTALL_PARTS[@]/#/$GPUGUARD_ROOT/}" "$stage/" || return
  mapfile -t rels < <(cd "$stage" && find . -mindepth 1 \( -name __pycache__ -o -name '*.pyc' \) -prune -o -printf '%P\n')
  for rel in "${rels[@]}"; do
    if [[ -e $home/$rel ]]; then
      install_record "$INSTALL_HOME/$rel" old
    else
      install_record "$INSTALL_HOME/$rel" new
    fi
    paths+=("$home/$rel")
  done
  (cd "$stage" && find . \( -name __pycache__ -o -name '*.pyc' \) -prune -exec rm -rf {} +) || return
  cp -R --remove-destination -- "$stage"/. "$home"/ || return
  chmod u=rwX,go=rX -- "${paths[@]}" || return
  rm -rf -- "$stage"
  INSTALL_STAGE=''
}

# Undoes this run: removes what it created, newest first.
install_rollback() {
  local i path
  [[ -n ${INSTALL_STAGE:-} ]] && rm -rf -- "$INSTALL_STAGE"
  for ((i = ${#INSTALL_CREATED[@]} - 1; i >= 0; i--)); do
    path=${INSTALL_CREATED[i]}
    case $path in
      'crontab:# gpuguard') install_crontab_remove ;;
      *)
        if [[ -d $INSTALL_DEST$path && ! -L $INSTALL_DEST$path ]]; then
          rmdir -- "$INSTALL_DEST$path" 2>/dev/null || true
        else
          rm -f -- "$INSTALL_DEST$path"
        fi
        ;;
    esac
  done
  gg_log error "install failed: what this run had put in place was removed again"
}

install_apply() {
  umask 022
  declare -ga INSTALL_CREATED=() INSTALL_LISTED=()
  INSTALL_STAGE=''
  install_check || return
  local previous=''
  [[ -f $INSTALL_MANIFEST ]] && previous=$(<"$INSTALL_MANIFEST")
  if [[ -n $INSTALL_DEST ]]; then
    # the staging folder itself is the packager's, not part of the install
    mkdir -p -- "$INSTALL_DEST" || return
  fi
  if ! install_steps; then
    install_rollback
    return 1
  fi
  install_remove_stale "$previous"
  # Keep paths from an earlier install that this one did not redo (cron,
  # units, an edited config) so --uninstall still finds them.
  local list
  list=$(
    printf '%s\n' "${INSTALL_LISTED[@]}" "$INSTALL_HOME/.install-manifest"
    if [[ -n $previous ]]; then
      printf '%s\n' "$previous" | install_still_there
    fi
  )
  if ! install_text "$INSTALL_HOME/.install-manifest" 644 "$(sort -u <<<"$list")"$'\n'; then
    install_rollback
    return 1
  fi
  if ((INSTALL_SETUP_DISK)); then
    # lowprio-run owns the disk settings and keeps what each disk had in
    # the state folder; --uninstall puts it back
    "$GPUGUARD_ROOT/bin/lowprio-run" --setup-disk ||
      gg_log warn "iocost could not be turned on for every disk (see above): lowprio-run falls back to io.max there"
  fi
  gg_log info "installed gpuguard $(<"$GPUGUARD_ROOT/VERSION") in $INSTALL_PREFIX (commands in $INSTALL_PREFIX/bin, config $INSTALL_CONFIG_DIR/gpuguard.conf, secrets $INSTALL_CONFIG_DIR/secrets.conf)"
  case ":$PATH:" in
    *":$INSTALL_PREFIX/bin:"*) ;;
    *) gg_log warn "$INSTALL_PREFIX/bin is not on PATH: add it (export PATH=\"$INSTALL_PREFIX/bin:\$PATH\")" ;;
  esac
}

# Every step that writes; returns 1 at the first failure.
install_steps() {
  install_mkdir "$INSTALL_HOME" || return
  install_mkdir "$INSTALL_PREFIX/bin" || return
  install_tree || return
  local cmd link
  for cmd in "${INSTALL_COMMANDS[@]}"; do
    link=$INSTALL_DEST$INSTALL_PREFIX/bin/$cmd
    if [[ -e $link || -L $link ]]; then
      ln -sfn -- "../lib/gpuguard/bin/$cmd" "$link" || return
      install_record "$INSTALL_PREFIX/bin/$cmd" old
    else
      ln -s -- "../lib/gpuguard/bin/$cmd" "$link" || return
      install_record "$INSTALL_PREFIX/bin/$cmd" new
    fi
  done
  install_config || return
  install_register || return
  if ((INSTALL_CRON)); then
    install_cron || return
  fi
  if ((INSTALL_SYSTEMD)); then
    install_systemd || return
  fi
  if ((! INSTALL_USER)); then
    install_mkdir /etc/logrotate.d || return
    install_file "$GPUGUARD_ROOT/etc/logrotate.d/gpuguard" /etc/logrotate.d/gpuguard 644 || return
  fi
}

# Filters manifest lines to those that still exist.
install_still_there() {
  local path
  while IFS= read -r path; do
    [[ -n $path ]] || continue
    if [[ $path == crontab:* || -e $INSTALL_DEST$path || -L $INSTALL_DEST$path ]]; then
      printf '%s\n' "$path"
    fi
  done
}

# After an upgrade: removes files of the earlier install under the tree
# that this version no longer ships.
install_remove_stale() {
  local previous=$1 path
  local -A now=()
  for path in "${INSTALL_LISTED[@]}"; do
    now[$path]=1
  done
  [[ -n $previous ]] || return 0
  while IFS= read -r path; do
    [[ $path == "$INSTALL_HOME"/* && -z ${now[$path]:-} ]] || continue
    [[ -f $INSTALL_DEST$path && ! -L $INSTALL_DEST$path ]] || continue
    # still shipped, only not recreated this time: keep
    [[ -e $GPUGUARD_ROOT/${path#"$INSTALL_HOME"/} ]] && continue
    rm -f -- "$INSTALL_DEST$path"
  done < <(printf '%s\n' "$previous")
}

# True when a config file sets any secret key to a value.
install_has_secrets() {
  grep -Eq "^[[:space:]]*(export[[:space:]]+)?($GG_SECRET_KEYS)=[^[:space:]]" "$1" 2>/dev/null
}

# Places the shared config (0644: every user's commands read it) and the
# secrets file (0600) beside it; never over edited ones.
install_config() {
  local dir=$INSTALL_CONFIG_DIR conf=$INSTALL_DEST$INSTALL_CONFIG_DIR/gpuguard.conf
  # (the folder is gpuguard's even where another install made it: the
  # last uninstall removes it once empty)
  [[ -d $INSTALL_DEST$dir ]] && install_record "$dir" old
  install_mkdir "$dir" || return
  if [[ ! -e $conf ]] || cmp -s "$conf" "$GPUGUARD_ROOT/etc/gpuguard.conf"; then
    install_file "$GPUGUARD_ROOT/etc/gpuguard.conf" "$dir/gpuguard.conf" 644 || return
  else
    # (listed all the same: uninstall keeps it while edited)
    install_record "$dir/gpuguard.conf" old
    if install_has_secrets "$conf"; then
      gg_log warn "kept your edited $dir/gpuguard.conf; it holds webhook credentials, so it stays private and other users' commands cannot read it: move the NOTIFY_URL, NOTIFY_SECRET and ALERTMANAGER_URL lines into $dir/secrets.conf, then chmod 644 $dir/gpuguard.conf"
    else
      gg_log info "kept your edited $dir/gpuguard.conf"
      if [[ $(stat -c %a -- "$conf") != 644 ]]; then
        chmod 644 -- "$conf" || return
        gg_log info "made $dir/gpuguard.conf readable by every user (mode 644): it holds no secrets"
      fi
    fi
  fi
  if [[ -e $INSTALL_DEST$dir/secrets.conf ]]; then
    # (listed all the same: uninstall removes it unless edited)
    install_record "$dir/secrets.conf" old
    gg_log info "kept your $dir/secrets.conf"
  else
    install_file "$GPUGUARD_ROOT/etc/secrets.conf" "$dir/secrets.conf" 600 || return
  fi
}

# Adds this prefix to the list of installs sharing the config folder;
# drops those whose manifest is gone (removed by hand: install_others_into
# lists only the others still there).
install_register() {
  local -A unused=()
  install_others_into unused
  install_text "$INSTALL_REGISTRY" 644 "$INSTALL_REGISTRY_HEADER"$'\n'"$INSTALL_OTHERS$INSTALL_PREFIX"$'\n'
}

# Puts the paths that the other registered installs' manifests list into
# the associative array named $1 (path -> that install's prefix), and
# their prefixes, one a line, into INSTALL_OTHERS.
install_others_into() {
  local -n others_ref=$1
  local list=$INSTALL_DEST$INSTALL_REGISTRY prefix path manifest
  INSTALL_OTHERS=''
  [[ -f $list ]] || return 0
  while IFS= read -r prefix; do
    manifest=$INSTALL_DEST$prefix/lib/gpuguard/.install-manifest
    [[ $prefix == /* && $prefix != "$INSTALL_PREFIX" && -f $manifest ]] || continue
    INSTALL_OTHERS+=$prefix$'\n'
    while IFS= read -r path; do
      [[ -z $path ]] || others_ref["$path"]=$prefix
    done <"$manifest"
  done <"$list"
}

# True when a cron file or unit ($1, as installed) runs this prefix's
# commands: such a file is this install's even where another install wrote
# it first (the last install's --cron or --systemd wins).
install_runs_this_prefix() {
  grep -qF -e " $INSTALL_PREFIX/bin/" -e "=$INSTALL_PREFIX/bin/" -- "$INSTALL_DEST$1" 2>/dev/null
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
    # the log's folder: cron's redirection fails when it is missing
    local log
    log=$(install_cron_line)
    log=${log##*>>}
    log=${log%% *}
    install_mkdir "$(dirname -- "$log")" || return
    # the user's lines as they were, blank ones too, then ours
    {
      [[ -z $current ]] || printf '%s\n' "$current"
      printf '%s # gpuguard\n' "$(install_cron_line)"
    } | crontab - || return
    install_record "crontab:# gpuguard"
  else
    install_mkdir /etc/cron.d || return
    install_text /etc/cron.d/gpuguard 644 "$(
      printf '# gpuguard idle watchdog, installed by install.sh --cron\n'
      printf 'SHELL=/bin/bash\nPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n'
      install_cron_line
    )"$'\n' || return
  fi
}

# Removes this prefix's watchdog line from the user's crontab; another
# install's line stays.
install_crontab_remove() {
  command -v crontab >/dev/null || return 0
  local current
  current=$(crontab -l 2>/dev/null) || return 0
  if grep -q '# gpuguard$' <<<"$current" && ! grep -qF " $INSTALL_PREFIX/bin/yichuidingyin.sh " <<<"$current"; then
    gg_log info "left your crontab's gpuguard line: it runs another install's watchdog, not $INSTALL_PREFIX's"
    return 0
  fi
  grep -v '# gpuguard$' <<<"$current" | crontab - || true
}

install_systemd() {
  local unit text
  install_mkdir /etc/systemd/system || return
  for unit in gpuguard-idle.service gpuguard-leak.service; do
    text=$(sed "s|@PREFIX@|$INSTALL_PREFIX|g" "$GPUGUARD_ROOT/etc/systemd/$unit") || return
    install_text "/etc/systemd/system/$unit" 644 "$text"$'\n' || return
  done
  if [[ -z $INSTALL_DEST ]]; then
    systemctl daemon-reload || return
    systemctl enable --now gpuguard-idle.service gpuguard-leak.service || return
  fi
}

# Removes exactly what the manifest lists: files and links, and folders
# only when empty (anything else put there stays). An edited config or
# secrets file is kept, and so is a command in PREFIX/bin that is no longer
# our link. What another registered install's manifest lists stays (the
# shared config, logrotate), except a cron file or unit that runs this
# prefix's commands; one that runs another's stays too. One line says
# what was left for another install and why.
install_remove() {
  if [[ ! -f $INSTALL_MANIFEST ]]; then
    gg_usage_error "nothing to uninstall: no $INSTALL_MANIFEST" || return
  fi
  local path target
  local -A listed=() others=() users=()
  local -a used=() elsewhere=() lost=()
  while IFS= read -r path; do
    [[ -n $path ]] && listed[$path]=1
  done <"$INSTALL_MANIFEST"
  install_others_into others
  install_undo_disks
  local unit=/etc/systemd/system/gpuguard-idle.service
  if [[ -n ${listed[$unit]:-} && -z $INSTALL_DEST ]] && install_runs_this_prefix "$unit" && gg_systemd_is_init; then
    systemctl disable --now gpuguard-idle.service gpuguard-leak.service 2>/dev/null || true
  fi
  # Files first (one rm), then folders, longest paths first (one rmdir),
  # so that a folder is tried once its own files are gone.
  local -a files=() dirs=() trees=()
  while IFS= read -r path; do
    target=$INSTALL_DEST$path
    case $path in
      '') continue ;;
      # (it removes this prefix's line only, whoever else lists it)
      'crontab:# gpuguard')
        install_crontab_remove
        continue
        ;;
      /etc/cron.d/gpuguard | /etc/systemd/system/gpuguard-*.service)
        if [[ -e $target ]] && ! install_runs_this_prefix "$path"; then
          elsewhere+=("$path")
          continue
        fi
        [[ -n ${others[$path]:-} && -e $target ]] && lost+=("$path") && users[${others[$path]}]=1
        ;;
      "$INSTALL_REGISTRY")
        if [[ -n $INSTALL_OTHERS ]]; then
          install_unregister || return
          continue
        fi
        ;;
      "$INSTALL_CONFIG_DIR"/*)
        # every install reads the config folder, whichever wrote the file
        if [[ -n $INSTALL_OTHERS ]]; then
          [[ -e $target && ! -d $target ]] && used+=("$path") && install_users_add users "$INSTALL_OTHERS"
          continue
        fi
        ;;
      *)
        if [[ -n ${others[$path]:-} ]]; then
          [[ -e $target && ! -d $target ]] && used+=("$path") && users[${others[$path]}]=1
          continue
        fi
        ;;
    esac
    case $path in
      */gpuguard.conf) install_remove_unless_edited "$path" "$GPUGUARD_ROOT/etc/gpuguard.conf" ;;
      */secrets.conf) install_remove_unless_edited "$path" "$GPUGUARD_ROOT/etc/secrets.conf" ;;
      "$INSTALL_PREFIX"/bin/*)
        if install_is_our_link "$path"; then
          files+=("$target")
        elif [[ -e $target || -L $target ]]; then
          gg_log warn "kept $path: it is no longer the link gpuguard installed"
        fi
        ;;
      *)
        if [[ -d $target && ! -L $target ]]; then
          # A manifest of version 0.1 listed the tree's parts as whole
          # folders (bin, lib, ...) with no file of theirs listed.
          if [[ $path == "$INSTALL_HOME"/* ]] && ! install_lists_below "$path" listed; then
            trees+=("$target")
          else
            dirs+=("$target")
          fi
        elif [[ -e $target || -L $target ]]; then
          files+=("$target")
        fi
        ;;
    esac
  done < <(awk '{ print length, $0 }' "$INSTALL_MANIFEST" | sort -rn | cut -d' ' -f2-)
  ((${#files[@]} == 0)) || rm -f -- "${files[@]}"
  ((${#trees[@]} == 0)) || rm -rf -- "${trees[@]}"
  ((${#dirs[@]} == 0)) || rmdir -- "${dirs[@]}" 2>/dev/null || true
  local left=" ${used[*]} ${elsewhere[*]} "
  for target in "${dirs[@]}"; do
    # (a folder kept for what another install uses is said below)
    [[ -d $target && $left != *" ${target#"$INSTALL_DEST"}/"* ]] &&
      gg_log info "kept the folder ${target#"$INSTALL_DEST"}: it holds something gpuguard did not install"
  done
  local who="${!users[*]}" these
  who=${who// /, }
  if ((${#used[@]})); then
    printf -v these '%s, ' "${used[@]}"
    gg_log info "left ${these%, }: the gpuguard install in $who still uses them"
  fi
  if ((${#elsewhere[@]})); then
    printf -v these '%s, ' "${elsewhere[@]}"
    gg_log info "left ${these%, }: they run another install's commands, not $INSTALL_PREFIX's"
  fi
  if ((${#lost[@]})); then
    printf -v these '%s, ' "${lost[@]}"
    gg_log warn "removed ${these%, }: they ran $INSTALL_PREFIX's commands (the install in $who had them too: install.sh --prefix ${who%%,*} --cron or --systemd writes them again)"
  fi
  gg_log info "uninstalled gpuguard from $INSTALL_PREFIX"
}

# Adds each line of $2 as a key of the associative array named $1.
install_users_add() {
  local -n users_ref=$1
  local prefix
  while IFS= read -r prefix; do
    [[ -z $prefix ]] || users_ref["$prefix"]=1
  done <<<"$2"
}

# Takes this prefix off the list of installs; the others stay on it.
install_unregister() {
  install_text "$INSTALL_REGISTRY" 644 "$INSTALL_REGISTRY_HEADER"$'\n'"$INSTALL_OTHERS"
}

# Puts back the disks' iocost settings that --setup-disk changed (kept in
# root's state folder), before the commands are removed. Not while another
# install of this host remains (INSTALL_OTHERS, install_others_into): the
# setting is the host's, and that install's lowprio-run bounds its jobs'
# disk use with it; its own --uninstall puts the disks back.
install_undo_disks() {
  local saved=${GPUGUARD_STATE_DIR:-/var/lib/gpuguard}/iocost-saved who
  ((EUID == 0)) && [[ -z $INSTALL_DEST && -f $saved ]] || return 0
  if [[ -n ${INSTALL_OTHERS:-} ]]; then
    who=${INSTALL_OTHERS%$'\n'}
    gg_log info "left the disks' iocost settings (--setup-disk): the gpuguard install in ${who//$'\n'/, } still uses them (its --uninstall puts them back)"
    return 0
  fi
  "$GPUGUARD_ROOT/bin/lowprio-run" --setup-disk --undo ||
    gg_log warn "could not put every disk's iocost setting back: what is left is listed in $saved"
}

# True when the manifest (assoc named $2) lists any path below folder $1.
install_lists_below() {
  local -n listed_ref=$2
  local key
  for key in "${!listed_ref[@]}"; do
    [[ $key == "$1"/* ]] && return 0
  done
  return 1
}

# Removes a config file that is still as shipped; keeps an edited one.
install_remove_unless_edited() {
  local path=$1 shipped=$2
  if cmp -s "$INSTALL_DEST$path" "$shipped"; then
    rm -f -- "$INSTALL_DEST$path"
  elif [[ -f $INSTALL_DEST$path ]]; then
    gg_log warn "kept your edited $path"
  fi
}
