# shellcheck shell=bash
# shellcheck disable=SC2154 # output, lines and status are set by bats' `run`
# The asserts the .bats files use, written here so the suite needs no
# bats-assert/bats-support package. Same names, options and failure output
# shape as bats-assert (a subset): load with `load test_helper/assert`.
#
# assert_equal ACTUAL EXPECTED        assert_not_equal ACTUAL UNEXPECTED
# assert_success                      assert_failure [STATUS]
# assert_output [--partial|--regexp] EXPECTED
# refute_output [--partial|--regexp] UNEXPECTED
# assert_line [--index N] [--partial|--regexp] EXPECTED
# refute_line [--index N] [--partial|--regexp] UNEXPECTED
# fail [MESSAGE]

# Prints the message (or stdin) to stderr and fails the test.
fail() {
  if (($#)); then
    printf '%s\n' "$*" >&2
  else
    cat >&2
  fi
  return 1
}

# Prints a bats-assert style block: a title, then "key : value" rows.
assert_report() {
  local title=$1
  shift
  {
    printf -- '-- %s --\n' "$title"
    while (($# >= 2)); do
      printf '%-10s : %s\n' "$1" "$2"
      shift 2
    done
    printf -- '--\n'
  } >&2
  return 1
}

# True when TEXT matches WANT in MODE (exact, partial, regexp).
assert_matches() {
  local mode=$1 text=$2 want=$3
  case $mode in
    partial) [[ $text == *"$want"* ]] ;;
    regexp) [[ $text =~ $want ]] ;;
    *) [[ $text == "$want" ]] ;;
  esac
}

# Reads --partial/--regexp/--index N; sets assert_mode, assert_index and
# assert_args (what is left).
assert_parse_options() {
  assert_mode=exact assert_index='' assert_args=()
  while (($#)); do
    case $1 in
      -p | --partial) assert_mode=partial ;;
      -e | --regexp) assert_mode=regexp ;;
      -n | --index)
        assert_index=$2
        shift
        ;;
      --) shift && break ;;
      *) break ;;
    esac
    shift
  done
  assert_args=("$@")
}

assert_equal() {
  [[ $1 == "$2" ]] || assert_report 'values do not equal' expected "$2" actual "$1"
}

assert_not_equal() {
  [[ $1 != "$2" ]] || assert_report 'values should not be equal' unexpected "$2" actual "$1"
}

assert_success() {
  ((status == 0)) || assert_report 'command failed' status "$status" output "$output"
}

assert_failure() {
  if (($#)); then
    ((status == $1)) || assert_report 'command failed as expected, but status differs' expected "$1" actual "$status" output "$output"
  else
    ((status != 0)) || assert_report 'command succeeded, but it was expected to fail' output "$output"
  fi
}

assert_output() {
  local assert_mode assert_index assert_args
  assert_parse_options "$@"
  assert_matches "$assert_mode" "$output" "${assert_args[0]-}" ||
    assert_report "output differs ($assert_mode)" expected "${assert_args[0]-}" actual "$output"
}

refute_output() {
  local assert_mode assert_index assert_args
  assert_parse_options "$@"
  if ((${#assert_args[@]} == 0)); then
    [[ -z $output ]] || assert_report 'output non-empty, but expected no output' output "$output"
    return
  fi
  ! assert_matches "$assert_mode" "$output" "${assert_args[0]}" ||
    assert_report "output should not match ($assert_mode)" unexpected "${assert_args[0]}" output "$output"
}

assert_line() {
  local assert_mode assert_index assert_args line
  assert_parse_options "$@"
  if [[ -n $assert_index ]]; then
    assert_matches "$assert_mode" "${lines[assert_index]-}" "${assert_args[0]-}" ||
      assert_report "line $assert_index differs ($assert_mode)" index "$assert_index" expected "${assert_args[0]-}" actual "${lines[assert_index]-}"
    return
  fi
  for line in "${lines[@]}"; do
    assert_matches "$assert_mode" "$line" "${assert_args[0]-}" && return 0
  done
  assert_report "no line matches ($assert_mode)" expected "${assert_args[0]-}" output "$output"
}

refute_line() {
  local assert_mode assert_index assert_args line
  assert_parse_options "$@"
  if [[ -n $assert_index ]]; then
    ! assert_matches "$assert_mode" "${lines[assert_index]-}" "${assert_args[0]-}" ||
      assert_report "line $assert_index should differ ($assert_mode)" index "$assert_index" unexpected "${assert_args[0]-}"
    return
  fi
  for line in "${lines[@]}"; do
    if assert_matches "$assert_mode" "$line" "${assert_args[0]-}"; then
      assert_report "a line should not match ($assert_mode)" unexpected "${assert_args[0]-}" line "$line"
      return
    fi
  done
}
