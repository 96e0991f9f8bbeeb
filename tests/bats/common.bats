#!/usr/bin/env bats
# lib/common.sh and lib/config.sh helpers.
# shellcheck disable=SC2030,SC2031,SC2016,SC2034 # each @test runs in its own subshell; literal $ in single-quoted bash -c scripts; fixtures' unused columns
bats_require_minimum_version 1.5.0

setup() {
  load test_helper/assert
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd)
  source "$ROOT/lib/common.sh"
  source "$ROOT/lib/config.sh"
}

@test "JSON escaping handles quotes, backslashes and control characters" {
  local out
  gg_json_escape_into $'a"b\\c\nd\te\x01f' out
  assert_equal "$out" 'a\"b\\c\nd\te\u0001f'
  run -0 python3 -c 'import json,sys; print(json.loads(sys.argv[1]))' "\"$out\""
  assert_output $'a"b\\c\nd\te\x01f'
}

@test "config file: comments, export, quotes; values kept verbatim" {
  local f="$BATS_TEST_TMPDIR/c.conf"
  printf '%s\n' '# c' '' 'A=1' 'export B="two words"' "C='\$(x)'" 'D = bad' >"$f"
  local -A got=()
  run -2 config_parse_file "$f" got
  assert_output --partial "c.conf:6: expected KEY=VALUE"
  sed -i '$d' "$f"
  config_parse_file "$f" got
  assert_equal "${got[A]}" 1
  assert_equal "${got[B]}" "two words"
  assert_equal "${got[C]}" '$(x)'
}

@test "numbers: integers and decimals, nothing else" {
  gg_is_uint 12
  run -1 gg_is_uint -1
  run -1 gg_is_uint 1.5
  gg_is_number 76.60
  run -1 gg_is_number 76.
  run -1 gg_is_number abc
}

@test "help text comes from the Summary/Usage header" {
  run -0 gg_help "$ROOT/bin/yichuidingyin.sh"
  assert_line --index 0 --partial "Summary: alert when a GPU is held"
  assert_line --index 1 "Usage: yichuidingyin.sh [--once] [--config FILE]"
  refute_output --partial "GPUGUARD_ROOT="
}

@test "log lines carry time and level, and go to GPUGUARD_LOG when set" {
  GG_PROG=t GPUGUARD_LOG="$BATS_TEST_TMPDIR/log"
  gg_log warn "hello"
  gg_log debug "hidden"
  run -0 cat "$BATS_TEST_TMPDIR/log"
  assert_output --regexp '^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8} WARN  t: hello$'
}

@test "sourcing the libraries defines functions only" {
  run -0 bash -c 'before=$(set -o; shopt); for f in "$1"/lib/*.sh; do source "$f"; done; [[ "$before" == "$(set -o; shopt)" ]] && [[ -z "$(jobs)" ]]' _ "$ROOT"
}

@test "gg_number_into: the one numeric check (leading zeros, overflow, exponents, ranges)" {
  local v
  gg_number_into v 07 int 0 100 && assert_equal "$v" 7
  gg_number_into v 000 int 0 100 && assert_equal "$v" 0
  gg_number_into v 076.50 dec 0 5000 && assert_equal "$v" 76.50
  gg_number_into v 100 int 0 100 && assert_equal "$v" 100
  run -1 gg_number_into v 101 int 0 100
  run -1 gg_number_into v 18446744073709551615 int 0 100
  run -1 gg_number_into v 9223372036854775808 int 0 ''
  run -1 gg_number_into v 1e30 dec 0 5000
  run -1 gg_number_into v 1.8e19 int 0 100
  run -1 gg_number_into v -1 int 0 100
  run -1 gg_number_into v 5000.5 dec 0 5000
  run -1 gg_number_into v 0x10 int 0 100
  run -1 gg_number_into v '' int 0 100
  # the quick path (no leading zero, fewer digits than MAX) and its edges
  gg_number_into v 0 int 0 10 && assert_equal "$v" 0
  run -1 gg_number_into v 0 int 1 10
  run -1 gg_number_into v 5 int 6 10
  gg_number_into v 4999.5 dec 0 5000 && assert_equal "$v" 4999.5
  gg_number_into v 0.5 dec 0 5000 && assert_equal "$v" 0.5
  run -1 gg_number_into v 12.5 int 0 100
  gg_number_into v 16777216 int 0 16777216 && assert_equal "$v" 16777216
  run -1 gg_number_into v 16777217 int 0 16777216
  gg_number_into v 1000000000000000 int 0 '' && assert_equal "$v" 1000000000000000
  run -1 gg_number_into v 1000000000000001 int 0 ''
  run -1 gg_number_into v 12. dec 0 100
}

@test "gg_python exports exactly the listed keys, never the rest of the configuration" {
  GPUGUARD_ROOT=$BATS_TEST_TMPDIR
  mkdir -p "$GPUGUARD_ROOT/python"
  printf 'import os, sys\nprint(" ".join(sorted(k for k in os.environ if k.startswith(("NOTIFY", "THRESHOLD", "GPUGUARD_STATE")))), sys.argv[1:])\n' >"$GPUGUARD_ROOT/python/env.py"
  export NOTIFY_SECRET=s NOTIFY_URL=u THRESHOLD=5
  GPUGUARD_CONFIG=/dev/null config_load
  run -0 env
  refute_output --partial NOTIFY_SECRET
  run -0 gg_python env.py "NOTIFY_URL" a "b c"
  assert_output "GPUGUARD_STATE_DIR NOTIFY_URL ['a', 'b c']"
  PATH=/nonexistent run -127 gg_python env.py ""
  assert_output --partial "python3 not found"
}

@test "config: a folder, a BOM, CRLF; a bad file leaves the configuration in force" {
  local f="$BATS_TEST_TMPDIR/c.conf"
  export GPUGUARD_CONFIG=$f
  printf '\xef\xbb\xbfTHRESHOLD=20\r\n' >"$f"
  config_load
  assert_equal "$THRESHOLD" 20
  printf 'THRESHOLD=1.8e19\n' >"$f"
  run -2 config_load
  assert_output "gpuguard: THRESHOLD must be a whole number from 0 to 100 (got '1.8e19')"
  config_load 2>/dev/null || true
  assert_equal "$THRESHOLD" 20
  GPUGUARD_CONFIG=$BATS_TEST_TMPDIR run -2 config_load
  assert_output "gpuguard: config file $BATS_TEST_TMPDIR is a folder, not a file"
}

@test "gg_proc_scan reads a process whose name holds blanks and parentheses" {
  local odd="$BATS_TEST_TMPDIR/a b) c"
  cp "$(command -v sleep)" "$odd"
  "$odd" 30 &
  local pid=$!
  gg_proc_scan
  kill "$pid"
  assert_equal "${GG_PROC_COMM[$pid]}" 'a b) c'
  assert_equal "${GG_PROC_PPID[$pid]}" "$$"
  [[ " ${GG_PROC_KIDS[$$]} " == *" $pid "* ]]
  local -a stat
  read -r -a stat </proc/self/stat
  # the start time is field 22 as proc(5) counts: the same for both ways of reading
  ((GG_PROC_START[$pid] >= stat[21]))
  [[ ${GG_PROC_RSS[$pid]} =~ ^[0-9]+$ && ${GG_PROC_TICKS[$pid]} =~ ^[0-9]+$ ]]
}

# Waits (up to 10 s) until process $1 has exec'd sleep.
exec_done() {
  local i
  for ((i = 0; i < 200; i++)); do
    [[ $(cat "/proc/$1/comm" 2>/dev/null) == sleep ]] && return 0
    sleep 0.05
  done
  return 1
}

@test "gg_proc_update: new processes appear, gone ones go, a watched one is read again; a full scan every GG_PROC_FULL_EVERY" {
  gg_proc_update
  sleep 30 &
  local p_first=$!
  gg_proc_update
  assert_equal "${GG_PROC_PPID[$p_first]}" "$$"
  [[ " ${GG_PROC_KIDS[$$]} " == *" $p_first "* ]]
  local before=${GG_PROC_COMM[$p_first]}
  kill "$p_first"
  wait "$p_first" || true
  sleep 30 &
  local p_second=$!
  gg_proc_update
  [[ -z ${GG_PROC_PPID[$p_first]:-} ]]
  [[ " ${GG_PROC_KIDS[$$]} " != *" $p_first "* ]]
  assert_equal "${GG_PROC_PPID[$p_second]}" "$$"
  # a process that exec'd reads as before until it is read again (it
  # execs when told to, not after a fixed time: under load a timer let it
  # exec before the first read, and the test read "sleep" there)
  local go=$BATS_TEST_TMPDIR/go
  bash -c 'while [[ ! -e $1 ]]; do sleep 0.05; done; exec sleep 30' _ "$go" &
  local p_exec=$!
  gg_proc_update
  assert_equal "${GG_PROC_COMM[$p_exec]}" bash
  touch "$go"
  exec_done "$p_exec"
  gg_proc_update
  assert_equal "${GG_PROC_COMM[$p_exec]}" bash
  gg_proc_read "$p_exec"
  assert_equal "${GG_PROC_COMM[$p_exec]}" sleep
  # ... or by the next full scan
  rm -f "$go"
  bash -c 'while [[ ! -e $1 ]]; do sleep 0.05; done; exec sleep 30' _ "$go" &
  local p_exec2=$!
  GG_PROC_FULL_EVERY=3
  gg_proc_scan
  touch "$go"
  exec_done "$p_exec2"
  gg_proc_update
  gg_proc_update
  gg_proc_update
  assert_equal "${GG_PROC_COMM[$p_exec2]}" bash
  gg_proc_update
  assert_equal "${GG_PROC_COMM[$p_exec2]}" sleep
  kill "$p_second" "$p_exec" "$p_exec2"
  assert_equal "$before" sleep
}

@test "a write into a state folder removed under the daemon is not called a full disk" {
  # the folder vanishes between the daemon's per-cycle check and a write in
  # the same cycle: the next cycle makes it again and says so; a
  # "disk full?" line before that sent the reader after the wrong cause
  GG_PROG=t GPUGUARD_LOG="$BATS_TEST_TMPDIR/log"
  GPUGUARD_STATE_DIR="$BATS_TEST_TMPDIR/gone"
  : >"$GPUGUARD_LOG"
  run -1 gg_write_atomic "$GPUGUARD_STATE_DIR/idle.state" "x"
  run -0 cat "$GPUGUARD_LOG"
  refute_output --partial "disk full"
  # a folder that is there but cannot be written is still said, once
  mkdir "$GPUGUARD_STATE_DIR"
  run -1 gg_write_atomic "$GPUGUARD_STATE_DIR/no/such/idle.state" "x"
  run -0 grep -c "disk full?" "$BATS_TEST_TMPDIR/log"
  assert_output 1
}
