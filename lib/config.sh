# shellcheck shell=bash
# Configuration: KEY=VALUE lines read as data (never sourced). Precedence:
# environment, then the config file, then the defaults below. Every value is
# validated; a bad one is a one-line error and exit status 2.

# Declares the known keys: their defaults and their kinds.
# Kinds: "int:MIN:MAX" (MAX may be empty), "num" (decimal >= 0), "bool" (0|1),
# "str" (anything), "enum:a|b|c" (empty allowed).
config_define() {
  declare -gA GG_CONFIG_DEFAULT=(
    [THRESHOLD]=10
    [CHECK_INTERVAL]=60
    [MAX_IDLE_CYCLES]=3
    [REPEAT_INTERVAL]=3600
    [IDLE_MEM_MIB]=1024
    [IDLE_POWER_PCT]=22
    [NVIDIA_SMI]=nvidia-smi
    [SMI_TIMEOUT]=10
    [SMI_FAIL_ALERT_CYCLES]=5
    [NOTIFY_URL]=''
    [NOTIFY_TYPE]=''
    [NOTIFY_SECRET]=''
    [NOTIFY_LANG]=''
    [NOTIFY_TIMEOUT]=5
    [NOTIFY_RETRIES]=3
    [NOTIFY_RATE_PER_MIN]=0
    [NOTIFY_MENTION]=''
    [ALERTMANAGER_URL]=''
    [OUTBOX_MAX]=1000
    [GPUGUARD_HOST]=''
    [GPUGUARD_STATE_DIR]=''
    [GPUGUARD_LOG]=''
    [GPUGUARD_LOG_LEVEL]=info
    [GPUGUARD_SYSLOG]=0
    [GPUGUARD_TEXTFILE_DIR]=''
    [LEAK_INTERVAL]=60
    [LEAK_THRESHOLD_MIB_H]=50
    [LEAK_HISTORY_MAX_ROWS]=20000
    [LEAK_RULES]=''
    # report (gpu-history.tsv for gpuguard report)
    [GPU_HISTORY_MAX_BYTES]=8388608
    # leakcmd
    [LEAK_MATCH_NOTICE_S]=300
    # idle watchdog: spin rule, per-job rules, cost of idle time (idle branch)
    [SPIN_UTIL_MIN]=90
    [SPIN_CYCLES]=5
    [IDLE_RULES]=''
    [GPU_HOUR_PRICE]=0
    [GPU_PRICE_CURRENCY]='¥'
    # faults: disk bounds (gg_retention)
    [RETENTION_DAYS]=7
    [RETENTION_INTERVAL]=300
    [HISTORY_MAX_FILES]=1500
    [HISTORY_MAX_MB]=30
    [EVENTS_MAX_MB]=5
    # ledger (lib/ledger.sh): the daily digest, names in posts, days kept
    [LEDGER_DIGEST_AT]=''
    [LEDGER_NAMES]=user
    [LEDGER_KEEP_DAYS]=35
    # daemons sample from nvidia-smi loops kept running (lib/smi.sh)
    [SMI_STREAM]=1
    # Ascend NPUs (lib/npu.sh)
    [GPUGUARD_DEVICE]=auto
    [NPU_SMI]=npu-smi
  )
  declare -gA GG_CONFIG_KIND=(
    [THRESHOLD]='int:0:100'
    [CHECK_INTERVAL]='int:1:'
    [MAX_IDLE_CYCLES]='int:1:'
    [REPEAT_INTERVAL]='int:0:'
    [IDLE_MEM_MIB]='int:0:'
    [IDLE_POWER_PCT]='int:0:100'
    [NVIDIA_SMI]='str'
    [SMI_TIMEOUT]='int:1:3600'
    [SMI_FAIL_ALERT_CYCLES]='int:1:'
    [NOTIFY_URL]='str'
    [NOTIFY_TYPE]='enum:dingtalk|feishu|wecom|slack|generic'
    [NOTIFY_SECRET]='str'
    [NOTIFY_LANG]='enum:zh|en'
    [NOTIFY_TIMEOUT]='int:1:300'
    [NOTIFY_RETRIES]='int:0:10'
    [NOTIFY_RATE_PER_MIN]='int:0:'
    [NOTIFY_MENTION]='str'
    [ALERTMANAGER_URL]='str'
    [OUTBOX_MAX]='int:1:'
    [GPUGUARD_HOST]='str'
    [GPUGUARD_STATE_DIR]='str'
    [GPUGUARD_LOG]='str'
    [GPUGUARD_LOG_LEVEL]='enum:debug|info|warn|error'
    [GPUGUARD_SYSLOG]='bool'
    [GPUGUARD_TEXTFILE_DIR]='abspath'
    [LEAK_INTERVAL]='int:1:'
    [LEAK_THRESHOLD_MIB_H]='num'
    [LEAK_HISTORY_MAX_ROWS]='int:100:'
    [LEAK_RULES]='str'
    # report (gpu-history.tsv for gpuguard report)
    [GPU_HISTORY_MAX_BYTES]='int:1:'
    # leakcmd
    [LEAK_MATCH_NOTICE_S]='int:1:'
    # idle watchdog: spin rule, per-job rules, cost of idle time (idle branch)
    [SPIN_UTIL_MIN]='int:1:100'
    [SPIN_CYCLES]='int:1:'
    [IDLE_RULES]='str'
    [GPU_HOUR_PRICE]='price'
    [GPU_PRICE_CURRENCY]='str'
    # faults: disk bounds (gg_retention)
    [RETENTION_DAYS]='int:1:3650'
    [RETENTION_INTERVAL]='int:10:86400'
    [HISTORY_MAX_FILES]='int:10:'
    [HISTORY_MAX_MB]='int:1:'
    [EVENTS_MAX_MB]='int:1:'
    # ledger (lib/ledger.sh): the daily digest, names in posts, days kept
    [LEDGER_DIGEST_AT]='str'
    [LEDGER_NAMES]='enum:user|hash|none'
    [LEDGER_KEEP_DAYS]='int:1:3650'
    # daemons sample from nvidia-smi loops kept running (lib/smi.sh)
    [SMI_STREAM]='bool'
    # Ascend NPUs (lib/npu.sh)
    [GPUGUARD_DEVICE]='enum:auto|nvidia|ascend'
    [NPU_SMI]='str'
  )
}

# Takes the value of a --config option into GPUGUARD_CONFIG, once
# config_file_value_check found it a file name.
# Arguments:
#   $1 the command's own command words (see config_file_value_check), $2 the
#   value: absent when the option ended the command line
config_option() {
  config_file_value_check --config "$@" || return
  export GPUGUARD_CONFIG=$2
}

# Returns 2 with one line when the value of an option that takes a file
# (--config; gpu-leak-watch's --rules, --loss-log and --replay too) is no
# file name: absent (the option ended the command line), or empty
# (--config="$UNSET" in a cron line: taken as none given, the default file
# was read without a word). The file name forgotten, the next word was
# taken as the file: `gpuguard --config status` then said a command was
# needed, `yichuidingyin.sh --config --once` that a config file "--once"
# does not exist, `gpu-leak-watch --rules --once` that it could not read
# rules file "--once". A value that is one of the command words ($2,
# gpuguard's commands where --config came before one) or an option is
# refused naming what it is, unless a file by that name exists: then it is
# the file meant (./status works too).
# Arguments:
#   $1 the option (--config, --rules...), $2 command words, separated by
#   spaces ('' for none), $3 the value: absent when the option ended the
#   command line
config_file_value_check() {
  local option=$1 commands=$2 shown
  shift 2
  if (($# == 0)); then
    gg_usage_error "$option needs a file"
    return
  fi
  [[ -n $1 ]] || gg_usage_error "$option needs a file (got '')" || return
  [[ ! -e $1 ]] || return 0
  if [[ " $commands " == *" $1 "* ]]; then
    gg_usage_error "$option needs a file before the command (got the command '$1')"
    return
  fi
  if [[ $1 == -?* ]]; then
    gg_shown_into shown "$1" 40
    gg_usage_error "$option needs a file (got the option $shown)"
    return
  fi
  return 0
}

# Prints the config file in force: $GPUGUARD_CONFIG, else the first of
# /etc/gpuguard/gpuguard.conf, the user's config folder, the source tree's
# etc/gpuguard.conf that exists. Prints nothing when there is none.
config_path() {
  if [[ -n "${GPUGUARD_CONFIG:-}" ]]; then
    printf '%s\n' "$GPUGUARD_CONFIG"
    return
  fi
  local candidate
  for candidate in /etc/gpuguard/gpuguard.conf \
    "${XDG_CONFIG_HOME:-${HOME:-/nonexistent}/.config}/gpuguard/gpuguard.conf" \
    "${GPUGUARD_ROOT:-}/etc/gpuguard.conf"; do
    if [[ -f $candidate ]]; then
      printf '%s\n' "$candidate"
      return
    fi
  done
}

# Reads a KEY=VALUE file into the associative array named $2. Blank lines and
# lines starting with # are skipped; so is a comment after a value, from a #
# that follows a space (`NOTIFY_URL=https://... # ops channel`: its words
# became targets of their own; a # with no space before it, as in a URL's
# #fragment, is part of the value); one pair of surrounding quotes is removed;
# `export KEY=VALUE` is accepted; a UTF-8 byte-order mark (Windows editors)
# and CRLF line ends are ignored. Nothing in the file is executed.
# Returns 2 with a one-line error naming file and line for anything else,
# and for a path that is a folder or cannot be read.
config_parse_file() {
  local file=$1
  local -n into_ref=$2
  local line key value n=0 shown
  # (a webhook URL given as the file, --config=https://...?access_token=,
  # is described, not printed: these lines go to cron's mail and logs)
  gg_shown_into shown "$file"
  [[ $shown != \'*\' ]] || shown=$file
  if [[ -d $file ]]; then
    gg_usage_error "config file $shown is a folder, not a file"
    return
  fi
  if [[ ! -e $file ]]; then
    gg_usage_error "config file $shown does not exist"
    return
  fi
  # -r says what access(2) says; the open below is the real test (root, ACLs)
  if ! { : <"$file"; } 2>/dev/null; then
    gg_usage_error "cannot read config file $shown (permission denied?)"
    return
  fi
  while IFS= read -r line || [[ -n $line ]]; do
    n=$((n + 1))
    ((n == 1)) && line=${line#$'\xef\xbb\xbf'}
    line=${line%$'\r'}
    [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
    if [[ ! $line =~ ^[[:space:]]*(export[[:space:]]+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]]; then
      gg_usage_error "$file:$n: expected KEY=VALUE"
      return
    fi
    key=${BASH_REMATCH[2]}
    value=${BASH_REMATCH[3]}
    # spaces around the value are not part of it, before as after
    value=${value%"${value##*[![:space:]]}"}
    value=${value#"${value%%[![:space:]]*}"}
    if [[ $value =~ ^\"(.*)\"$ || $value =~ ^\'(.*)\'$ ]]; then
      value=${BASH_REMATCH[1]}
    elif [[ $value =~ ^\"([^\"]*)\"[[:space:]]+# || $value =~ ^\'([^\']*)\'[[:space:]]+# ]]; then
      value=${BASH_REMATCH[1]}
    elif [[ $value == *[[:space:]]#* ]]; then
      # from the first space before a #, then the spaces before it
      value=${value%%[[:space:]]#*}
      value=${value%"${value##*[![:space:]]}"}
    fi
    # shellcheck disable=SC2034 # nameref: assigns the caller's variable
    into_ref["$key"]=$value
  done <"$file"
}

# Checks one value against its kind and stores it, normalised ("07" -> 7),
# as element KEY of the associative array named $4; prints the error and
# returns 2 if bad.
# Numbers go through gg_number_into, the one numeric check: 1.8e19 or a
# 20-digit THRESHOLD is refused, never wrapped by bash arithmetic.
config_validate() {
  local key=$1 value=$2 kind=$3 into=$4
  local min max normal shown
  gg_shown_into shown "$value" 24
  case $kind in
    int:*)
      IFS=: read -r _ min max <<<"$kind"
      if ! gg_number_into normal "$value" int "$min" "$max"; then
        local range="of at least $min"
        [[ -n $max ]] && range="from $min to $max"
        [[ -z $max && $value =~ ^[0-9]{16,}$ ]] && range+=" (at most 10^15)"
        gg_usage_error "$key must be a whole number $range (got $shown)"
        return
      fi
      printf -v "${into}[$key]" '%s' "$normal"
      ;;
    num)
      gg_number_into normal "$value" dec 0 || {
        gg_usage_error "$key must be a decimal number from 0 to 10^15 (got $shown)"
        return
      }
      printf -v "${into}[$key]" '%s' "$normal"
      ;;
    price)
      # "30", "¥30", "2.5 USD" (README): the number, and a currency of its
      # own, kept apart for config_load (it wins over GPU_PRICE_CURRENCY)
      local before='' amount=$value after=''
      if [[ $value =~ ^([^0-9.[:space:]+-]*)[[:space:]]*([0-9][0-9.]*)[[:space:]]*([^0-9.[:space:]+-]*)$ ]]; then
        before=${BASH_REMATCH[1]} amount=${BASH_REMATCH[2]} after=${BASH_REMATCH[3]}
      fi
      if [[ -n $before && -n $after ]] || ! gg_number_into normal "$amount" dec 0; then
        gg_usage_error "$key must be a price such as 30, ¥30 or 2.5 USD (got $shown)"
        return
      fi
      printf -v "${into}[$key]" '%s' "$normal"
      printf -v "${into}[${key}_CURRENCY]" '%s' "${before:-$after}"
      ;;
    abspath)
      # (a relative folder lands wherever the command runs: cron's HOME)
      [[ -z $value || $value == /* ]] || {
        gg_usage_error "$key must be an absolute path (got $shown)"
        return
      }
      ;;
    bool)
      [[ $value == 0 || $value == 1 ]] || {
        gg_usage_error "$key must be 0 or 1 (got $shown)"
        return
      }
      ;;
    enum:*)
      local allowed=${kind#enum:}
      if [[ -n $value && "|$allowed|" != *"|$value|"* ]]; then
        gg_usage_error "$key must be one of ${allowed//|/, } (got $shown)"
        return
      fi
      ;;
  esac
  return 0
}

# Loads the configuration into plain global variables named after the keys.
# Nothing is exported: a key the user exported is un-exported too, so secrets
# never reach nvidia-smi, the job or any child; Python helpers get the keys
# they need through gg_python. GPUGUARD_STATE_DIR and GPUGUARD_HOST stay
# exported (no secret; every helper reads them).
# Sources, highest first: the environment (as it was at the first load, so a
# reload on SIGHUP sees new file values), secrets.conf beside the config file
# (webhook URLs and secrets, mode 0600; skipped silently when unreadable),
# the config file, the defaults. All values are checked before any is set:
# a bad file leaves the configuration in force untouched.
# Globals:
#   sets every key of GG_CONFIG_DEFAULT; GG_CONFIG_FILE (the file read),
#   GG_SECRETS_FILE (its secrets.conf) and GG_SECRETS_READ (1 when read)
# Returns:
#   2 on a malformed file or a bad value
config_load() {
  config_define
  local -A from_file=() from_secrets=() checked=()
  local key file secrets
  if [[ -z ${GG_CONFIG_ENV_TAKEN:-} ]]; then
    declare -gA GG_CONFIG_ENV=()
    for key in "${!GG_CONFIG_DEFAULT[@]}"; do
      [[ -n ${!key+set} ]] && GG_CONFIG_ENV[$key]=${!key}
    done
    GG_CONFIG_ENV_TAKEN=1
  fi
  file=$(config_path)
  secrets=''
  if [[ -n $file ]]; then
    config_parse_file "$file" from_file || return
    secrets=$(dirname -- "$file")/secrets.conf
    # unreadable or absent: skipped here; delivering commands warn once
    if [[ -f $secrets ]] && { : <"$secrets"; } 2>/dev/null; then
      config_parse_file "$secrets" from_secrets || return
    fi
  fi
  for key in "${!from_file[@]}" "${!from_secrets[@]}"; do
    if [[ -z ${GG_CONFIG_KIND[$key]+set} ]]; then
      gg_log warn "unknown key $key in ${file} or its secrets.conf (ignored)"
    fi
  done
  for key in "${!GG_CONFIG_DEFAULT[@]}"; do
    if [[ -n ${GG_CONFIG_ENV[$key]+set} ]]; then
      checked[$key]=${GG_CONFIG_ENV[$key]}
    elif [[ -n ${from_secrets[$key]+set} ]]; then
      checked[$key]=${from_secrets[$key]}
    elif [[ -n ${from_file[$key]+set} ]]; then
      checked[$key]=${from_file[$key]}
    else
      checked[$key]=${GG_CONFIG_DEFAULT[$key]}
    fi
    config_validate "$key" "${checked[$key]}" "${GG_CONFIG_KIND[$key]}" checked || return
  done
  # a price that names its currency ("¥30", "2.5 USD") names it for every
  # cost shown
  [[ -n ${checked[GPU_HOUR_PRICE_CURRENCY]:-} ]] && checked[GPU_PRICE_CURRENCY]=${checked[GPU_HOUR_PRICE_CURRENCY]}
  unset 'checked[GPU_HOUR_PRICE_CURRENCY]'
  for key in "${!checked[@]}"; do
    printf -v "$key" '%s' "${checked[$key]}"
    # shellcheck disable=SC2163 # un-exporting the variable named by $key
    export -n "$key"
  done
  GG_CONFIG_FILE=$file
  GG_SECRETS_FILE=$secrets
  GG_SECRETS_READ=$((${#from_secrets[@]} > 0))
  [[ -n $GPUGUARD_STATE_DIR ]] || gg_state_dir_default
  [[ -n $GPUGUARD_HOST ]] || GPUGUARD_HOST=${HOSTNAME:-$(uname -n)}
  config_default_rules
  export GPUGUARD_STATE_DIR GPUGUARD_HOST
  config_check_targets
  config_warn_secret_file
}

# Why one alert target URL ($1, its "provider:lang+" prefix removed) cannot
# be used, printed as a phrase; status 1 then, 0 and nothing when it is fine.
# The same rule as _url_problem in python/gpuguard_alert.py, which leaves such
# a target out (tests/test_config_cli.py runs both over one list).
config_url_problem() {
  local url=$1 LC_ALL=C port
  if ((${#url} > 2048)); then
    printf 'longer than 2048 characters\n'
  elif [[ $url =~ [^!-~] ]]; then
    printf 'has a space, control or non-ASCII character (a domain goes in its xn-- form)\n'
  elif [[ ! $url =~ ^[Hh][Tt][Tt][Pp][Ss]?://([^/?#]*) ]]; then
    # (a scheme is case-insensitive: HTTPS:// as a chat client copies it)
    printf 'not an http:// or https:// URL\n'
  elif [[ ! ${BASH_REMATCH[1]##*@} =~ ^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:([0-9]{1,5}))?$ ]]; then
    printf 'bad host or port (an IPv6 address goes in [brackets])\n'
  else
    port=${BASH_REMATCH[3]}
    if [[ -z $port ]] || ((10#$port >= 1 && 10#$port <= 65535)); then
      return 0
    fi
    printf 'port out of range 1..65535\n'
  fi
  return 1
}

# Checks every target of NOTIFY_URL and ALERTMANAGER_URL (split on spaces,
# commas and semicolons, as the alert helper splits them). A malformed one
# is no reason to refuse the configuration: the helper leaves it out and
# the others get their alerts; events_flush says it once (config_say_bad_targets).
# Globals (set):
#   GG_CONFIG_BAD_TARGETS: one line per malformed target, with no secret in
#   it (the key, its place, scheme://host, the problem)
#   GG_CONFIG_N_TARGETS: how many targets there are, well formed or not
config_check_targets() {
  declare -ga GG_CONFIG_BAD_TARGETS=()
  declare -g GG_CONFIG_N_TARGETS=0
  local key raw url prefix part problem shown i LC_ALL=C
  local -a parts prefix_parts
  for key in NOTIFY_URL ALERTMANAGER_URL; do
    IFS=$' \t\n\r\f\v,;' read -r -d '' -a parts <<<"${!key}" || true
    i=0
    for raw in "${parts[@]}"; do
      i=$((i + 1)) GG_CONFIG_N_TARGETS=$((GG_CONFIG_N_TARGETS + 1))
      prefix='' url=$raw
      if [[ ${raw%%://*} == *+* ]]; then
        prefix=${raw%%+*} url=${raw#*+}
      fi
      problem=''
      IFS=: read -r -a prefix_parts <<<"$prefix"
      for part in ${prefix_parts[@]+"${prefix_parts[@]}"}; do
        case $key:$part in
          *:) ;;
          *:zh | *:en | NOTIFY_URL:dingtalk | NOTIFY_URL:feishu | NOTIFY_URL:wecom | NOTIFY_URL:slack | NOTIFY_URL:generic) ;;
          *) problem="unknown provider or language '${part:0:20}' in its prefix" ;;
        esac
      done
      if [[ -z $problem ]] && problem=$(config_url_problem "$url"); then
        continue
      fi
      shown="$key #$i"
      if [[ $url =~ ^([A-Za-z]{1,10})://([^/?#]*) ]]; then
        part=${BASH_REMATCH[2]##*@}
        part=${part//[^!-~]/?}
        shown+=" (${BASH_REMATCH[1]}://${part:0:60}/***)"
      fi
      GG_CONFIG_BAD_TARGETS+=("$shown is malformed and gets no alert: $problem")
    done
  done
}

# Logs the malformed targets once: once per process and, for cron's runs,
# once per state folder (the lines are kept in bad-targets.said) until they
# change; the file goes when every target is well formed again.
config_say_bad_targets() {
  local text='' said='' file=$GPUGUARD_STATE_DIR/bad-targets.said line
  ((${#GG_CONFIG_BAD_TARGETS[@]})) && printf -v text '%s\n' "${GG_CONFIG_BAD_TARGETS[@]}"
  [[ $text == "${GG_BAD_TARGETS_SAID-}" ]] && return 0
  GG_BAD_TARGETS_SAID=$text
  if [[ -z $text ]]; then
    [[ -f $file && ! -L $file ]] && rm -f -- "$file"
    return 0
  fi
  [[ -d $GPUGUARD_STATE_DIR ]] || return 0
  [[ -f $file && ! -L $file ]] && said=$(<"$file")
  [[ $said$'\n' == "$text" ]] && return 0
  local rest='the other targets still get alerts'
  if ((${#GG_CONFIG_BAD_TARGETS[@]} >= ${GG_CONFIG_N_TARGETS:-0})); then
    rest="NO TARGET IS LEFT: events go only to the log and $GPUGUARD_STATE_DIR/events.jsonl"
  fi
  for line in "${GG_CONFIG_BAD_TARGETS[@]}"; do
    gg_log warn "$line; $rest (gpuguard notify --check)"
  done
  gg_write_atomic "$file" "$text" || true
}

# Warns when a file holding webhook credentials (the config file, or
# secrets.conf beside it) can be read by group or others. Never prints the
# secret itself.
config_warn_secret_file() {
  local mode file
  for file in "${GG_CONFIG_FILE:-}" "${GG_SECRETS_FILE:-}"; do
    [[ -n $file && -f $file ]] || continue
    grep -Eq "^[[:space:]]*(export[[:space:]]+)?($GG_SECRET_KEYS)=." \
      "$file" 2>/dev/null || continue
    mode=$(stat -c '%a' -- "$file" 2>/dev/null) || continue
    if (((8#$mode & 8#044) != 0)); then
      gg_log warn "$file holds webhook credentials and is readable by others (mode $mode): chmod 600 it"
    fi
  done
}

# Rule files: empty means the shipped ones (etc/idle-rules.conf exempts
# inference servers, whose batch-1 CUDA-graph decoding reads like a spin on
# an H200: 99 % at 131 W; etc/leak-rules.conf exempts their KV caches);
# "none" means no rules.
config_default_rules() {
  local key
  for key in IDLE_RULES LEAK_RULES; do
    case ${!key} in
      none) printf -v "$key" '' ;;
      '')
        local shipped=${key%_RULES}
        shipped=${GPUGUARD_ROOT:-/nonexistent}/etc/${shipped,,}-rules.conf
        [[ -r $shipped ]] && printf -v "$key" '%s' "$shipped"
        ;;
    esac
  done
  return 0
}

# For commands that deliver alerts: warns once when secrets.conf exists but
# this user cannot read it (alerts then go only to the log and the outbox).
config_warn_secrets_unreadable() {
  config_secrets_unreadable || return 0
  gg_log warn "cannot read $GG_SECRETS_FILE (webhook URLs and secrets): run as its owner or root"
}

# True when secrets.conf is there but this user cannot read it.
config_secrets_unreadable() {
  [[ -n ${GG_SECRETS_FILE:-} && -e $GG_SECRETS_FILE ]] || return 1
  ((${GG_SECRETS_READ:-0})) && return 1
  ! { : <"$GG_SECRETS_FILE"; } 2>/dev/null
}

# Puts into the variable named $1 what to do when no alert target is
# configured: a secrets.conf this user cannot read most likely holds it
# (a root install's, mode 0600), else one is to be set.
config_no_target_hint_into() {
  local -n hint_ref=$1
  if config_secrets_unreadable; then
    hint_ref="cannot read $GG_SECRETS_FILE (webhook URLs and secrets): run as its owner or root"
  else
    # shellcheck disable=SC2034 # nameref: assigns the caller's variable
    hint_ref="set NOTIFY_URL or ALERTMANAGER_URL"
  fi
}
