#!/usr/bin/env bats
# lib/textfile.sh: the leak watcher's metrics file from the detector's status
# lines, and what it does with malformed ones.
# shellcheck disable=SC2030,SC2031,SC2034,SC2016 # each @test runs in its own subshell; LEAK_STATUS is read by the library; a literal $( ) as garbage
bats_require_minimum_version 1.5.0

setup() {
  load test_helper/assert
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd)
  source "$ROOT/lib/common.sh"
  source "$ROOT/lib/textfile.sh"
  GPUGUARD_TEXTFILE_DIR=$BATS_TEST_TMPDIR/textfile
  T=$'\t'
  LEAK_INSTANCE=all
  declare -gA LEAK_STATUS=()
}

# As leak_run_detector stores a status line: by PID, the fields after it.
status_of() {
  LEAK_STATUS[$1]="$2$T$3$T$4$T$5$T$6$T$7"
}

@test "a status line of the detector becomes the leak metrics" {
  status_of 1328 31890.0 1 58634 critical 9540 python3
  status_of 1329 -3.5 0 956 none - 'py "x"'
  set -euo pipefail
  textfile_write_leak
  run cat "$GPUGUARD_TEXTFILE_DIR/gpuguard_leak-all.prom"
  assert_line 'gpuguard_process_tree_gpu_memory_bytes{pid="1328",name="python3",watcher="all"} 61482205184'
  assert_line 'gpuguard_process_leak_slope_mib_per_hour{pid="1328",name="python3",watcher="all"} 31890.0'
  assert_line 'gpuguard_process_leak_slope_mib_per_hour{pid="1329",name="py \"x\"",watcher="all"} -3.5'
  assert_line 'gpuguard_process_leak{pid="1328",name="python3",watcher="all"} 1'
  assert_line 'gpuguard_process_leak_severity{pid="1328",name="python3",watcher="all"} 3'
  assert_line 'gpuguard_process_leak_severity{pid="1329",name="py \"x\"",watcher="all"} 0'
  assert_line 'gpuguard_process_leak_projected_oom_seconds{pid="1328",name="python3",watcher="all"} 9540'
  refute_output --partial 'projected_oom_seconds{pid="1329"'
}

@test "malformed or empty values skip their series and never stop the writer" {
  status_of 1328 31890.0 1 58634 critical 9540 python3
  # the old space-separated format, empty fields, garbage, overflow
  LEAK_STATUS[1]="31890.0 1 58634 python3"
  LEAK_STATUS[2]=""
  status_of 3 '' 1 100 none - a
  status_of 4 12.0 1 '' none - a
  status_of 5 12.0 yes 100 none - a
  status_of 6 12.0 1 '[N/A]' none - a
  status_of 7 12.0 1 99999999999999999999 none - a
  status_of 8 1e3 1 100 none - a
  status_of 9 12.0 1 100 '$(touch x)' - a
  status_of 10 '12.0 * 2' 1 100 none - a
  LEAK_STATUS[x11]="12.0${T}1${T}100${T}none$T-${T}a"
  set -euo pipefail
  run textfile_write_leak
  assert_success
  run cat "$GPUGUARD_TEXTFILE_DIR/gpuguard_leak-all.prom"
  assert_line 'gpuguard_process_leak{pid="1328",name="python3",watcher="all"} 1'
  run grep -c 'pid=' "$GPUGUARD_TEXTFILE_DIR/gpuguard_leak-all.prom"
  assert_output 5
}

@test "nothing but malformed values writes a file without series" {
  LEAK_STATUS[1]="31890.0 1 58634 python3"
  set -euo pipefail
  run textfile_write_leak
  assert_success
  run grep -c 'pid=' "$GPUGUARD_TEXTFILE_DIR/gpuguard_leak-all.prom"
  assert_output 0
}
