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
