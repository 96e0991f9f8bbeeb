# shellcheck shell=bash
# shellcheck disable=SC2034 # SMI_* are filled here for idle.sh, leak.sh and textfile.sh
# shellcheck disable=SC2004 # the SMI_* arrays are associative (smi_reset in lib/smi.sh declares them)
# The one place that runs npu-smi (Huawei Ascend NPUs), beside lib/smi.sh
# for nvidia-smi. It reads the summary table of `npu-smi info` into the same
# SMI_* arrays smi_sample fills, so nothing above this layer learns a second
# vocabulary: an NPU chip is a device keyed "NPU-<card>-<chip>", its AICore %
# is the utilization, its HBM (or, without HBM, its DDR) the memory, and a
# Health other than OK a device fault. SMI_VENDOR says "ascend" for each.
# npu-smi must not run concurrently (its reference says so): every call goes
# through smi.sh's runner, one at a time, bounded by SMI_TIMEOUT.
# The layouts read are those recorded in tests/fixtures/npu (see its README).

# Values npu-smi prints for what it does not have ("-" on the second chip
# of an Atlas A3 card, whose power is counted on the first; NA on a 310P).
NPU_PLACEHOLDERS='|-|NA|N/A||'

# An idle Ascend chip with no process shows part of its memory in use (the
# recordings: about 3.4 GB of a 910B's 64 GB, 1.5 GB of a 310P chip's 44
# GB): that much, a share of its total, is SMI_MEM_BASE, which the idle
# rule adds to IDLE_MEM_MIB before it calls a chip without listed
# processes held (a container hides them; a job's memory is far above).
NPU_RESERVED_PCT=8

# True when the command of NPU_SMI (its first word) can be run.
npu_available() {
  smi_available "${NPU_SMI:-npu-smi}"
}

# Runs npu-smi with the given arguments through smi.sh's bounded runner.
# Arguments:
#   $1 variable for the output (stdout and stderr), the rest: npu-smi's
# Returns:
#   npu-smi's status; 124 when it timed out; 127 when it is missing
npu_run_into() {
  local -n _npu_run_out=$1
  shift
  local _nr_rc=0 _nr_text=''
  NVIDIA_SMI=${NPU_SMI:-npu-smi} smi_run_into _nr_text "$@" || _nr_rc=$?
  _npu_run_out=$_nr_text
  return "$_nr_rc"
}

# Puts the first line `npu-smi -v` prints (e.g. "npu-smi version: 23.0.6")
# into the variable named $1, or "version unknown"; asked once a process.
npu_version_into() {
  local -n _npu_ver=$1
  if [[ -z ${NPU_VERSION:-} ]]; then
    local out=''
    if npu_run_into out -v; then
      out=${out%%$'\n'*}
      out=${out//[^[:print:]]/}
      NPU_VERSION=${out:0:80}
    fi
    NPU_VERSION=${NPU_VERSION:-version unknown}
  fi
  _npu_ver=$NPU_VERSION
}

# Samples every NPU chip with one `npu-smi info` call and adds them to the
# SMI_* arrays (callers reset them first: smi_reset, or smi_sample on a
# mixed box).
# Globals (set):
#   the SMI_* arrays of smi_sample for each chip; SMI_VENDOR[id]=ascend;
#   NPU_APPS_OK (1 when the process table was read); SMI_ERROR
# Returns:
#   0 when the table was read and named at least one chip; 1 otherwise (a
#   failed call, or a layout this parser does not know, named with the
#   version npu-smi reports)
npu_sample() {
  local output rc=0 version
  declare -gA SMI_VENDOR SMI_MEM_BASE
  NPU_APPS_OK=0
  npu_run_into output info || rc=$?
  if ((rc != 0)); then
    npu_why_into output "$output"
    SMI_ERROR=$(smi_describe_failure "$rc" "$output" npu-smi)
    return 1
  fi
  if ! npu_parse_info "$output"; then
    npu_version_into version
    # NPU_PARSE_ERROR quotes the row npu-smi printed: made printable, as
    # smi_describe_failure does with a failed call's text
    gg_printable_into SMI_ERROR "npu-smi ($version) printed a layout of 'npu-smi info' gpuguard does not know: $NPU_PARSE_ERROR"
    return 1
  fi
  if ((! NPU_APPS_OK)); then
    SMI_ERROR="npu-smi printed no readable process table"
  fi
  npu_fill_unknown_util
  return 0
}

# Puts the line of a failed npu-smi's answer $2 that says why into the
# variable named $1: its first line is often the driver's log noise
# ("DrvMngGetConsoleLogLevel failed. (g_conLogLevel=3)") printed before
# the reason ("dcmi model initialized failed, because the device is used.
# ret is -8020"). The first line with "failed, because" or "ret is", else
# the last non-empty line.
npu_why_into() {
  local -n _npu_why=$1
  local line last=''
  local -a lines
  smi_lines_into lines "$2"
  for line in "${lines[@]}"; do
    line=${line%$'\r'}
    [[ -n ${line//[[:space:]]/} ]] || continue
    if [[ $line == *'failed, because'* || $line == *'ret is'* ]]; then
      _npu_why=$line
      return 0
    fi
    last=$line
  done
  _npu_why=$last
}

# Asks `npu-smi info -t usages -i CARD` for the AICore % of the chips whose
# row in `npu-smi info` gave none ("-" or NA), once per such card (no call
# at all when every chip has its figure, the usual case). A failed call or
# an answer without the figure leaves it unknown: the chip is then never
# idle, as before. The first failed call ends the asking for this cycle, so
# a wedged driver costs one SMI_TIMEOUT, not one per card.
npu_fill_unknown_util() {
  local card out
  # shellcheck disable=SC2086 # the card numbers, split at their blanks
  for card in ${NPU_UNKNOWN_UTIL:-}; do
    npu_run_into out info -t usages -i "$card" || break
    npu_parse_usages "$card" "$out"
  done
}

# Reads the AICore % of each chip of card $1 from the answer $2 of `npu-smi
# info -t usages -i CARD` ("Chip ID : N" opens a chip's block, "Aicore
# Usage Rate(%) : V" gives its figure; the layout of
# tests/fixtures/npu/usages-*.txt) into SMI_UTIL, where it was unknown.
npu_parse_usages() {
  local card=$1 line key value chip='' id util
  local -a lines
  smi_lines_into lines "$2"
  for line in "${lines[@]}"; do
    [[ $line == *:* ]] || continue
    # blanks dropped: "Chip ID" reads ChipID, whatever pads it
    key=${line%%:*} value=${line#*:}
    key=${key//[[:space:]]/} value=${value//[[:space:]]/}
    case $key in
      ChipID) chip=$value ;;
      AicoreUsageRate\(%\))
        id="NPU-$card-$chip"
        [[ -n $chip && -n ${SMI_INDEX[$id]+set} && -z ${SMI_UTIL[$id]} ]] || continue
        npu_value_into util "$value" dec 0 100
        SMI_UTIL[$id]=$util
        ;;
    esac
  done
}

# Reads one value the fast checks of npu_parse_info did not take: a
# placeholder gives '', a number in range itself, anything else '' counted
# in SMI_BAD_VALUES.
# Arguments:
#   $1 variable, $2 text, $3 int|dec, $4 MIN, $5 MAX
npu_value_into() {
  local -n _npu_val=$1
  _npu_val=''
  [[ $NPU_PLACEHOLDERS == *"|$2|"* ]] && return 0
  gg_number_into "$1" "$2" "$3" "$4" "$5" || SMI_BAD_VALUES=$((${SMI_BAD_VALUES:-0} + 1))
  return 0
}

# Parses the output of `npu-smi info`: a header, two rows per chip ("| card
# name | health | power temp hugepages |", then "| chip [device] | bus-id |
# aicore used / total [hbm-used / hbm-total] |"), then the process table
# ("| card chip | pid | name | MB |" rows, or "No running processes found in
# NPU N"). A row of a kind it does not know fails the whole parse: a chip
# missing from a sample must not read as released. Rows are split at their
# bars and cells at blanks by the shell in one step each, with no function
# call on the common path (it runs every cycle for every chip; a regular
# expression a row cost twice as much).
# Globals (set):
#   the SMI_* arrays; NPU_APPS_OK; NPU_PARSE_ERROR (why it failed); NPU_CHIPS
#   (chips read); NPU_UNKNOWN_UTIL (" CARD " for each card with a chip whose
#   AICore % was not given)
# Returns:
#   1 when no device header, no chip, or a cut or unknown row was read
npu_parse_info() {
  local text=$1 line section=none hbm=0 card='' name='' health='' power=''
  local -a lines cells w
  # a byte order mark: looked for at the start alone (${1#BOM} on the
  # whole answer tries every prefix: 18 ms on 30 kB in a UTF-8 locale), then
  # cut as a pattern (${text:3} would cut three characters there, the BOM
  # being one)
  [[ $text == $'\xef\xbb\xbf'* ]] && text=${text#$'\xef\xbb\xbf'}
  NPU_PARSE_ERROR='' NPU_APPS_OK=0 NPU_CHIPS=0 NPU_UNKNOWN_UTIL=''
  # associative, whoever called (an indexed array would read the key
  # "NPU-0-0" as arithmetic)
  declare -gA SMI_VENDOR SMI_MEM_BASE
  smi_lines_into lines "$text"
  local - IFS
  set -f
  for line in "${lines[@]}"; do
    # CRLF: a check first, as a removal tries every suffix of the line
    [[ $line == *$'\r' ]] && line=${line%$'\r'}
    # separators (+----+, +====+) and blank lines
    [[ -z $line || $line == '+'* ]] && continue
    # a data row (a chip's, a process's) first: nearly every line is one
    if [[ $section != none && $line == '|'+( )[0-9]*'|' ]]; then
      # shellcheck disable=SC2206 # splitting at the bars is the point
      IFS='|' cells=($line)
      IFS=$' \t'
      if [[ $section == devices ]]; then
        npu_device_row || return 1
      else
        npu_process_row || return 1
      fi
      continue
    fi
    case $line in
      '|'*'npu-smi '*'Version:'*) continue ;;
      '| NPU'*'Name'*'| Health'*)
        section=devices
        continue
        ;;
      '| Chip'*'| Bus-Id'*'AICore(%)'*)
        [[ $line == *HBM-Usage* ]] && hbm=1
        continue
        ;;
      '| NPU'*'Chip'*'| Process id'*)
        [[ -z $card ]] && section=procs NPU_APPS_OK=1
        continue
        ;;
      '| No running processes found in NPU '*) [[ $section == procs ]] && continue ;;
    esac
    NPU_PARSE_ERROR="a line read as no known row: ${line:0:60}"
    return 1
  done
  if [[ -n $card ]]; then
    NPU_PARSE_ERROR="a chip's first row without its second (cut output)"
    return 1
  fi
  if [[ $section == none ]] || ((NPU_CHIPS == 0)); then
    NPU_PARSE_ERROR="no NPU chip rows"
    return 1
  fi
  return 0
}

# Reads one row of the device section (npu_parse_info's cells, split at
# the bars, blanks as IFS): a chip's first row is kept in card, name,
# health and power until its second row comes.
npu_device_row() {
  # shellcheck disable=SC2206 # splitting at blanks is the point
  w=(${cells[1]})
  if [[ -z $card ]]; then
    if ((${#cells[@]} != 4 || ${#w[@]} < 2)) || [[ ${w[0]} != +([0-9]) ]]; then
      NPU_PARSE_ERROR="a chip's first row not read as 'card name | health | power ...': ${line:0:60}"
      return 1
    fi
    card=${w[0]} name=${w[*]:1}
    # shellcheck disable=SC2206
    w=(${cells[2]})
    health=${w[*]}
    # shellcheck disable=SC2206
    w=(${cells[3]})
    power=${w[0]:-}
    return 0
  fi
  if ((${#cells[@]} != 4 || ${#w[@]} < 1 || ${#w[@]} > 2)) || [[ ${w[0]} != +([0-9]) || ${w[1]:-0} != +([0-9]) ]]; then
    NPU_PARSE_ERROR="a chip's second row not read as 'chip [device] | bus | usage': ${line:0:60}"
    return 1
  fi
  local chip=${w[0]} device=${w[1]:-}
  # shellcheck disable=SC2206 # "41052/ 65536" reads as "41052 / 65536"
  w=(${cells[3]//\// \/ })
  if ((${#w[@]} != 4 && ${#w[@]} != 7)) || [[ ${w[2]} != / || ${w[5]:-/} != / ]]; then
    NPU_PARSE_ERROR="a chip's usage cell not read as 'aicore used / total': ${line:0:60}"
    return 1
  fi
  npu_add_chip
  card=''
}

# Reads one row of the process table (npu_parse_info's cells): "card chip |
# pid | name | MB"; the name is all between the PID's cell and the last.
npu_process_row() {
  local n=${#cells[@]}
  # shellcheck disable=SC2206 # splitting at blanks is the point
  w=(${cells[1]})
  if ((n < 5 || ${#w[@]} != 2)) || [[ ${w[0]} != +([0-9]) || ${w[1]} != +([0-9]) ]]; then
    NPU_PARSE_ERROR="a process row not read as 'card chip | pid | name | MB': ${line:0:60}"
    return 1
  fi
  local id="NPU-${w[0]}-${w[1]}" pid=${cells[2]} mem=${cells[n - 1]} pname
  [[ -n ${SMI_INDEX[$id]+set} ]] || return 0
  # the name: its cells joined (a name may hold a bar), its blanks
  # trimmed by a split (a run of blanks inside becomes one)
  IFS='|'
  pname="${cells[*]:3:n-4}"
  IFS=$' \t'
  # shellcheck disable=SC2206 # splitting at blanks is the point
  w=($pname)
  pname=${w[*]}
  pid=${pid// /} mem=${mem// /}
  if [[ $pid != [1-9]*([0-9]) || ${#pid} -gt 9 ]] && ! gg_number_into pid "$pid" int 1 "$SMI_MAX_PID"; then
    NPU_PARSE_ERROR="a process row without a PID: ${line:0:60}"
    return 1
  fi
  if [[ $mem != @(0|[1-9]*([0-9])) || ${#mem} -gt 8 ]] || ((mem > ${SMI_MEM_TOTAL[$id]:-SMI_MAX_MIB})); then
    npu_value_into mem "$mem" int 0 "${SMI_MEM_TOTAL[$id]:-$SMI_MAX_MIB}"
  fi
  # (the recordings leave the name blank: kept empty; a PID listed twice
  # on one chip is one holder)
  smi_proc_add "$id" "$pid" "$pname" "$mem"
}

# Adds the chip of a second row (npu_device_row's chip, device and usage
# words w; the first row's card, name, health and power) to the SMI_*
# arrays. Memory is the HBM where the chip has it (910 series), else its DDR
# (310P). A second pair of rows for one chip is skipped.
npu_add_chip() {
  local util=${w[0]} used=${w[1]} total=${w[3]} watts=$power id="NPU-$card-$chip"
  if ((hbm && ${#w[@]} == 7)) && [[ ${w[6]} != @(0|-|NA) ]]; then
    used=${w[4]} total=${w[6]}
  fi
  if [[ -n ${SMI_INDEX[$id]+set} ]]; then
    SMI_BAD_LINES=$((${SMI_BAD_LINES:-0} + 1))
    return 0
  fi
  # plain numbers in range need no call (nearly every value); the rest
  # (placeholders, garbage) goes through npu_value_into
  [[ $total == [1-9]*([0-9]) && ${#total} -le 8 ]] || npu_value_into total "$total" int 1 "$SMI_MAX_MIB"
  if [[ $used != @(0|[1-9]*([0-9])) || ${#used} -gt 8 || -z $total ]] || ((used > total)); then
    npu_value_into used "$used" int 0 "${total:-$SMI_MAX_MIB}"
  fi
  [[ $util == @([0-9]|[1-9][0-9]|100) ]] || npu_value_into util "$util" dec 0 100
  # a card to ask npu-smi info -t usages for (npu_fill_unknown_util)
  [[ -n $util || $NPU_UNKNOWN_UTIL == *" $card "* ]] || NPU_UNKNOWN_UTIL+=" $card "
  [[ $watts == @(0|[1-9]?([0-9])?([0-9])).[0-9] ]] || npu_value_into watts "$watts" dec 0 "$SMI_MAX_WATTS"
  SMI_UUIDS+=("$id")
  # the logic device id (what ASCEND_RT_VISIBLE_DEVICES names) where the
  # table prints one; the card number on one-chip cards
  SMI_INDEX[$id]=${device:-$card}
  SMI_UTIL[$id]=$util
  SMI_MEM_USED[$id]=$used
  SMI_MEM_TOTAL[$id]=$total
  SMI_MEM_BASE[$id]=$((${total:-0} * NPU_RESERVED_PCT / 100))
  SMI_POWER[$id]=$watts
  # npu-smi info prints no power limit: the power rule stays silent
  SMI_POWER_LIMIT[$id]=''
  [[ $name == Ascend* ]] || name="Ascend $name"
  SMI_NAME[$id]=${name//$'\t'/ }
  case $health in
    OK | '') SMI_GPU_FAULT[$id]='' ;;
    *) SMI_GPU_FAULT[$id]="Health $health" ;;
  esac
  SMI_VENDOR[$id]=ascend
  NPU_CHIPS=$((NPU_CHIPS + 1))
  SMI_NPROCS[$id]=0
  SMI_PROCS[$id]=''
}

# The kind of the device keyed $2 into the variable named $1: ascend for an
# NPU (its key is NPU-<card>-<chip>, npu_add_chip: known from the key
# alone, also once the chip left the sample), else nvidia.
# shellcheck disable=SC2034 # _dev_kind: nameref, assigns the caller's variable
device_kind_into() {
  local -n _dev_kind=$1
  _dev_kind=nvidia
  [[ $2 == NPU-* ]] && _dev_kind=ascend
  return 0
}

# The tool that reads devices of kind $2 (nvidia, ascend) into the
# variable named $1: nvidia-smi or npu-smi, for the lines that name it.
# shellcheck disable=SC2034 # _dev_tool: nameref, assigns the caller's variable
device_tool_into() {
  local -n _dev_tool=$1
  _dev_tool=nvidia-smi
  [[ $2 == ascend ]] && _dev_tool=npu-smi
  return 0
}

# The word a person reads for device $2 (a UUID), into the variable named
# $1: NPU for an Ascend chip (device_kind_into), else GPU. The log lines'
# twin of the message tables' NPU wording ("en-npu", "zh-npu") that alerts
# and the digest use.
# shellcheck disable=SC2034 # _dev_word: nameref, assigns the caller's variable
device_word_into() {
  local -n _dev_word=$1
  local kind
  device_kind_into kind "$2"
  _dev_word=GPU
  [[ $kind == ascend ]] && _dev_word=NPU
  return 0
}

# Which device tools this box is sampled with, from GPUGUARD_DEVICE:
# nvidia, ascend, or auto (each tool that is installed; nvidia-smi alone
# when neither is, so its "not found" is what the user reads).
# Arguments:
#   $1 variable for "nvidia", "ascend" or "nvidia ascend"
device_kinds_into() {
  local -n _dev_kinds=$1
  case ${GPUGUARD_DEVICE:-auto} in
    nvidia | ascend) _dev_kinds=$GPUGUARD_DEVICE ;;
    *)
      if npu_available && smi_available; then
        _dev_kinds='nvidia ascend'
      elif npu_available; then
        _dev_kinds=ascend
      else
        _dev_kinds=nvidia
      fi
      ;;
  esac
}

# Samples every device of this box in one cycle, into the SMI_* arrays:
# the GPUs through smi_sample, the NPUs through npu_sample, both on a mixed
# box. The call sites of smi_sample call this instead.
# On a box where both tools are in use (auto), a tool that fails while the
# other answers does not blind the devices that answered: they are the
# sample, and SMI_TOOL_FAILED names the kind whose tool failed. Its devices
# are missing from the sample; the callers treat them as not judged (never
# released: ARCHITECTURE.md, rule 1), not as gone.
# Globals (set):
#   SMI_FAILED_VENDOR: the kind whose tool failed or printed no process
#   table (nvidia or ascend), so that messages name it; '' when all is well
#   SMI_TOOL_FAILED, SMI_TOOL_ERROR: the kind whose tool failed while the
#   other answered, and why; '' when none did
# Returns:
#   0 when every tool in use answered, or one of two did (see above);
#   SMI_APPS_OK is 1 only when every process list read was read
device_sample() {
  local kinds
  declare -gA SMI_VENDOR=() SMI_MEM_BASE=()
  SMI_FAILED_VENDOR='' SMI_TOOL_FAILED='' SMI_TOOL_ERROR=''
  device_kinds_into kinds
  case $kinds in
    nvidia)
      smi_sample || {
        SMI_FAILED_VENDOR=nvidia
        return 1
      }
      ((SMI_APPS_OK)) || SMI_FAILED_VENDOR=nvidia
      ;;
    ascend)
      smi_reset
      SMI_FAILED_VENDOR=ascend
      npu_sample || return 1
      SMI_APPS_OK=$NPU_APPS_OK
      ((SMI_APPS_OK)) && SMI_FAILED_VENDOR=''
      ;;
    *) device_sample_both || return 1 ;;
  esac
  return 0
}

# device_sample on a box with both tools: each is asked, whatever the
# other answered.
# Returns:
#   1 when both failed (SMI_ERROR names both, SMI_FAILED_VENDOR nvidia)
device_sample_both() {
  local gpu_ok=1 gpu_apps gpu_error
  smi_sample || gpu_ok=0
  gpu_apps=$SMI_APPS_OK gpu_error=$SMI_ERROR
  # a failed sample may hold some GPUs (a truncated answer): none are kept
  ((gpu_ok)) || smi_reset
  if ! npu_sample; then
    # chips read before a cut or unknown row are not kept either
    device_drop_ascend
    if ((! gpu_ok)); then
      SMI_FAILED_VENDOR=nvidia
      SMI_ERROR="$gpu_error; $SMI_ERROR"
      return 1
    fi
    SMI_TOOL_FAILED=ascend SMI_TOOL_ERROR=$SMI_ERROR
    SMI_APPS_OK=$gpu_apps SMI_ERROR=$gpu_error
    ((SMI_APPS_OK)) || SMI_FAILED_VENDOR=nvidia
    return 0
  fi
  if ((! gpu_ok)); then
    SMI_TOOL_FAILED=nvidia SMI_TOOL_ERROR=$gpu_error
    SMI_APPS_OK=$NPU_APPS_OK
    ((SMI_APPS_OK)) || SMI_FAILED_VENDOR=ascend
    return 0
  fi
  SMI_APPS_OK=$((gpu_apps && NPU_APPS_OK))
  SMI_ERROR=${gpu_error:-$SMI_ERROR}
  if ((! gpu_apps)); then
    SMI_FAILED_VENDOR=nvidia
  elif ((! NPU_APPS_OK)); then
    SMI_FAILED_VENDOR=ascend
  fi
  return 0
}

# Takes the chips of a failed npu_sample out of the SMI_* arrays (and
# their processes out of the per-PID sums), so that a failed npu-smi adds
# nothing to the GPUs nvidia-smi read. Only on that failure: not a hot path.
device_drop_ascend() {
  local id pid name mem
  local -a keep=()
  for id in "${SMI_UUIDS[@]}"; do
    if [[ ${SMI_VENDOR[$id]:-} != ascend ]]; then
      keep+=("$id")
      continue
    fi
    while IFS=$SMI_FS read -r pid name mem; do
      [[ -n $pid && -n ${SMI_PIDS_MEM[$pid]+set} ]] || continue
      SMI_PIDS_MEM[$pid]=$((SMI_PIDS_MEM[$pid] - ${mem:-0}))
      SMI_PID_UUIDS[$pid]=${SMI_PID_UUIDS[$pid]//$id/}
      if [[ -z ${SMI_PID_UUIDS[$pid]// /} ]]; then
        unset "SMI_PIDS_MEM[$pid]" "SMI_PID_UUIDS[$pid]"
      fi
    done <<<"${SMI_PROCS[$id]:-}"
    unset "SMI_INDEX[$id]" "SMI_UTIL[$id]" "SMI_MEM_USED[$id]" "SMI_MEM_TOTAL[$id]" "SMI_MEM_BASE[$id]" \
      "SMI_POWER[$id]" "SMI_POWER_LIMIT[$id]" "SMI_NAME[$id]" "SMI_GPU_FAULT[$id]" "SMI_BAD_VALUE[$id]" \
      "SMI_NPROCS[$id]" "SMI_PROCS[$id]" "SMI_VENDOR[$id]"
  done
  SMI_UUIDS=("${keep[@]}")
}
