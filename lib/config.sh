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
    # idle watchdog: spin rule, per-job rules, cost of idle time (idle branch)
    [SPIN_UTIL_MIN]=90
    [SPIN_CYCLES]=5
    [IDLE_RULES]=''
    [GPU_HOUR_PRICE]=0
    [GPU_PRICE_CURRENCY]='¥'
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
    [GPUGUARD_TEXTFILE_DIR]='str'
    [LEAK_INTERVAL]='int:1:'
    [LEAK_THRESHOLD_MIB_H]='num'
    [LEAK_HISTORY_MAX_ROWS]='int:100:'
    [LEAK_RULES]='str'
    # idle watchdog: spin rule, per-job rules, cost of idle time (idle branch)
    [SPIN_UTIL_MIN]='int:1:100'
    [SPIN_CYCLES]='int:1:'
    [IDLE_RULES]='str'
    [GPU_HOUR_PRICE]='num'
    [GPU_PRICE_CURRENCY]='str'
  )
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
# lines starting with # are skipped; one pair of surrounding quotes is removed;
# `export KEY=VALUE` is accepted. Nothing in the file is executed.
# Returns 2 with a one-line error naming file and line for anything else.
config_parse_file() {
  local file=$1
  local -n into_ref=$2
  local line key value n=0
  [[ -r $file ]] || {
    gg_usage_error "cannot read config file $file"
    return
  }
  while IFS= read -r line || [[ -n $line ]]; do
    n=$((n + 1))
    line=${line%$'\r'}
    [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
    if [[ ! $line =~ ^[[:space:]]*(export[[:space:]]+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]]; then
      gg_usage_error "$file:$n: expected KEY=VALUE"
      return
    fi
    key=${BASH_REMATCH[2]}
    value=${BASH_REMATCH[3]}
    value=${value%"${value##*[![:space:]]}"}
    if [[ $value =~ ^\"(.*)\"$ || $value =~ ^\'(.*)\'$ ]]; then
      value=${BASH_REMATCH[1]}
    fi
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
    into_ref["$key"]=$value
  done <"$file"
}

# Checks one value against its kind; prints the error and returns 2 if bad.
config_validate() {
  local key=$1 value=$2 kind=$3
  local min max
  case $kind in
    int:*)
      IFS=: read -r _ min max <<<"$kind"
      if ! gg_is_uint "$value" || ((10#$value < min)) ||
        { [[ -n $max ]] && ((10#$value > max)); }; then
        local range="of at least $min"
        [[ -n $max ]] && range="from $min to $max"
        gg_usage_error "$key must be a whole number $range (got '$value')"
        return
      fi
      ;;
    num)
      gg_is_number "$value" || {
        gg_usage_error "$key must be a number (got '$value')"
        return
      }
      ;;
    bool)
      [[ $value == 0 || $value == 1 ]] || {
        gg_usage_error "$key must be 0 or 1 (got '$value')"
        return
      }
      ;;
    enum:*)
      local allowed=${kind#enum:}
      if [[ -n $value && "|$allowed|" != *"|$value|"* ]]; then
        gg_usage_error "$key must be one of ${allowed//|/, } (got '$value')"
        return
      fi
      ;;
  esac
  return 0
}

# Loads the configuration into plain global variables named after the keys
# and exports them for the Python helpers (environment, never argv).
# Globals:
#   sets every key of GG_CONFIG_DEFAULT; GG_CONFIG_FILE (the file read)
# Returns:
#   2 on a malformed file or a bad value
config_load() {
  config_define
  local -A from_file=()
  GG_CONFIG_FILE=$(config_path)
  if [[ -n $GG_CONFIG_FILE ]]; then
    config_parse_file "$GG_CONFIG_FILE" from_file || return
  fi
  local key
  for key in "${!from_file[@]}"; do
    if [[ -z ${GG_CONFIG_KIND[$key]+set} ]]; then
      gg_log warn "unknown key $key in $GG_CONFIG_FILE (ignored)"
    fi
  done
  for key in "${!GG_CONFIG_DEFAULT[@]}"; do
    if [[ -z ${!key+set} ]]; then
      if [[ -n ${from_file[$key]+set} ]]; then
        printf -v "$key" '%s' "${from_file[$key]}"
      else
        printf -v "$key" '%s' "${GG_CONFIG_DEFAULT[$key]}"
      fi
    fi
    config_validate "$key" "${!key}" "${GG_CONFIG_KIND[$key]}" || return
    # shellcheck disable=SC2163 # exporting the variable whose name is $key
    export "$key"
  done
  if [[ -z $GPUGUARD_STATE_DIR ]]; then
    if ((EUID == 0)); then
      GPUGUARD_STATE_DIR=/var/lib/gpuguard
    else
      GPUGUARD_STATE_DIR=${XDG_STATE_HOME:-${HOME:-/tmp}/.local/state}/gpuguard
    fi
  fi
  [[ -n $GPUGUARD_HOST ]] || GPUGUARD_HOST=${HOSTNAME:-$(uname -n)}
  export GPUGUARD_STATE_DIR GPUGUARD_HOST
  config_warn_secret_file
}

# Warns when the config file holds a webhook secret or token and others can
# read it. Never prints the secret itself.
config_warn_secret_file() {
  [[ -n ${GG_CONFIG_FILE:-} && -f $GG_CONFIG_FILE ]] || return 0
  grep -Eq '^[[:space:]]*(export[[:space:]]+)?(NOTIFY_SECRET|NOTIFY_URL|ALERTMANAGER_URL)=.' \
    "$GG_CONFIG_FILE" 2>/dev/null || return 0
  local mode
  mode=$(stat -c '%a' -- "$GG_CONFIG_FILE" 2>/dev/null) || return 0
  if (((8#$mode & 8#044) != 0)); then
    gg_log warn "$GG_CONFIG_FILE holds webhook credentials and is readable by others (mode $mode): chmod 600 it"
  fi
}
