#!/usr/bin/env bats
# lib/smi.sh: parsing real H200 output and everything nvidia-smi can print.
# shellcheck disable=SC2030,SC2031,SC2016,SC2034 # each @test runs in its own subshell; literal $ in single-quoted bash -c scripts; fixtures' unused columns
bats_require_minimum_version 1.5.0

setup() {
  load test_helper/assert
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd)
  source "$ROOT/lib/common.sh"
  source "$ROOT/lib/smi.sh"
  H200=GPU-21b026da-3a23-ca8c-52da-f8eedc850d97
  declare -gA SMI_INDEX=() SMI_UTIL=() SMI_MEM_USED=() SMI_MEM_TOTAL=() \
    SMI_POWER=() SMI_POWER_LIMIT=() SMI_NPROCS=() SMI_PROCS=() SMI_PIDS_MEM=() SMI_PID_UUIDS=()
  declare -ga SMI_UUIDS=()
  SMI_BAD_LINES=0
}

@test "parses the recorded H200 --query-gpu line" {
  smi_parse_gpus "0, $H200, 0, 0, 143771, 76.61, 700.00"
  assert_equal "${#SMI_UUIDS[@]}" 1
  assert_equal "${SMI_INDEX[$H200]}" 0
  assert_equal "${SMI_UTIL[$H200]}" 0
  assert_equal "${SMI_MEM_TOTAL[$H200]}" 143771
  assert_equal "${SMI_POWER[$H200]}" 76.61
}

@test "every sample of the recorded 1 Hz trace parses" {
  local line ts rest n=0
  while IFS=, read -r ts _ idx util used total; do
    declare -gA SMI_INDEX=()
    SMI_UUIDS=()
    smi_parse_gpus "${idx# }, $H200,${util},${used},${total}, 691.00, 700.00"
    assert_equal "${SMI_UTIL[$H200]}" "${util# }"
    assert_equal "${SMI_MEM_USED[$H200]}" "${used# }"
    n=$((n + 1))
  done <"$ROOT/tests/fixtures/h200/trace_query_gpu_1hz.csv"
  assert_equal "$n" 30
}

@test "placeholders become empty values, not zero" {
  smi_parse_gpus "0, $H200, [N/A], 9000, 143771, [Not Supported], [N/A]"
  assert_equal "${#SMI_UUIDS[@]}" 1
  assert_equal "${SMI_UTIL[$H200]}" ""
  assert_equal "${SMI_POWER[$H200]}" ""
  assert_equal "${SMI_MEM_USED[$H200]}" 9000
}

@test "[Insufficient Permissions] with its space is a placeholder" {
  smi_parse_gpus "0, $H200, [Insufficient Permissions], 1, 2, 3, 4"
  assert_equal "${SMI_UTIL[$H200]}" ""
  assert_equal "$SMI_BAD_LINES" 0
}

@test "garbage lines are skipped and counted, good ones kept" {
  smi_parse_gpus $'\e[31mWARNING: something\e[0m\n0, '"$H200"$', 5, 100, 143771, 80.00, 700.00\nnot, a, gpu, line, x, y, z\n1, GPU-x, banana, 1, 2, 3, 4'
  assert_equal "${#SMI_UUIDS[@]}" 1
  assert_equal "$SMI_BAD_LINES" 3
}

@test "a line with units (format without nounits) is rejected" {
  smi_parse_gpus "0, $H200, 0 %, 0 MiB, 143771 MiB, 76.60 W, 700.00 W"
  assert_equal "${#SMI_UUIDS[@]}" 0
}

@test "process lines join on the GPU UUID and sum per PID" {
  smi_parse_gpus "0, $H200, 0, 12266, 143771, 691.00, 700.00"
  run -0 smi_parse_apps $'1410, python3, 2556, '"$H200"$'\n1408, /opt/torch/.venv/bin/python3, 2910, '"$H200"
  smi_parse_apps $'1410, python3, 2556, '"$H200"$'\n1408, /opt/torch/.venv/bin/python3, 2910, '"$H200"
  assert_equal "${SMI_NPROCS[$H200]}" 2
  assert_equal "${SMI_PIDS_MEM[1408]}" 2910
  assert_equal "${SMI_PROCS[$H200]}" $'1410\tpython3\t2556\n1408\t/opt/torch/.venv/bin/python3\t2910\n'
}

@test "an empty process list (0 bytes, exit 0) is valid" {
  smi_parse_gpus "0, $H200, 0, 0, 143771, 76.61, 700.00"
  run -0 smi_parse_apps ""
}

@test "a process name with commas from an old driver keeps its commas" {
  smi_parse_gpus "0, $H200, 0, 1, 143771, 76.61, 700.00"
  smi_parse_apps "7, a, b, c, 10, $H200"
  assert_equal "${SMI_PROCS[$H200]}" $'7\ta, b, c\t10\n'
}

@test "garbage in the process list is reported" {
  smi_parse_gpus "0, $H200, 0, 1, 143771, 76.61, 700.00"
  run -1 smi_parse_apps "No running processes found"
}

@test "smi_run bounds a hanging command with the timeout" {
  local hang="$BATS_TEST_TMPDIR/hang"
  printf '#!/bin/sh\nsleep 30\n' >"$hang"
  chmod +x "$hang"
  NVIDIA_SMI=$hang SMI_TIMEOUT=1
  SECONDS=0
  run -124 smi_run -L
  ((SECONDS < 6))
}

@test "smi_describe_failure says what happened in one line" {
  run -0 smi_describe_failure 9 $'NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver.\n\n'
  assert_output "nvidia-smi exited 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
  SMI_TIMEOUT=10
  run -0 smi_describe_failure 124 ""
  assert_output "nvidia-smi timed out after 10s (driver wedged?)"
}
