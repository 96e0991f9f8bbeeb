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
  smi_reset
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

@test "garbage lines are skipped and counted; a GPU line with a bad value keeps the GPU, value unknown" {
  smi_parse_gpus $'\e[31mWARNING: something\e[0m\n0, '"$H200"$', 5, 100, 143771, 80.00, 700.00\nnot, a, gpu, line, x, y, z\n1, GPU-x, banana, 1, 2, 3, 4'
  assert_equal "${#SMI_UUIDS[@]}" 2
  assert_equal "$SMI_BAD_LINES" 2
  assert_equal "${SMI_UTIL["GPU-x"]}" ""
  assert_equal "${SMI_MEM_USED["GPU-x"]}" 1
  assert_equal "$SMI_TRUNCATED" 0
}

@test "a line with units (format without nounits) gives unknown values, never numbers" {
  smi_parse_gpus "0, $H200, 0 %, 0 MiB, 143771 MiB, 76.60 W, 700.00 W"
  assert_equal "${SMI_UTIL[$H200]}" ""
  assert_equal "${SMI_MEM_USED[$H200]}" ""
  assert_equal "$SMI_BAD_VALUES" 5
}

@test "the GPU name (last field) is read; lines without it still parse" {
  smi_parse_gpus $'0, '"$H200"$', 0, 0, 143771, 76.61, 700.00, NVIDIA H200\n1, GPU-b, 3, 4, 143771, 76.61, 700.00'
  assert_equal "${SMI_NAME[$H200]}" "NVIDIA H200"
  assert_equal "${SMI_NAME["GPU-b"]}" ""
  assert_equal "${SMI_UTIL["GPU-b"]}" 3
}

@test "numbers are validated once: leading zeros, unsigned -1, huge, out of range" {
  smi_parse_gpus "0, $H200, 07, 0100, 143771, 076.50, 700.00, NVIDIA H200"
  assert_equal "${SMI_UTIL[$H200]}" 7
  assert_equal "${SMI_MEM_USED[$H200]}" 100
  assert_equal "${SMI_POWER[$H200]}" 76.50
  smi_reset
  smi_parse_gpus "0, $H200, 18446744073709551615, 150000, 143771, 1e30, 99999, NVIDIA H200"
  assert_equal "${#SMI_UUIDS[@]}" 1
  assert_equal "${SMI_UTIL[$H200]}" ""
  assert_equal "${SMI_MEM_USED[$H200]}" ""
  assert_equal "${SMI_POWER[$H200]}" ""
  assert_equal "${SMI_POWER_LIMIT[$H200]}" ""
  assert_equal "${SMI_MEM_TOTAL[$H200]}" 143771
  smi_reset
  smi_parse_gpus "0, $H200, 101, -5, 143771, 76.00, 700.00"
  assert_equal "${SMI_UTIL[$H200]}" ""
  assert_equal "${SMI_MEM_USED[$H200]}" ""
  assert_equal "${SMI_BAD_VALUE[$H200]}" "utilization.gpu 101 (expected 0-100), memory.used -5 (expected 0-143771)"
  local said
  smi_bad_values_into said
  assert_equal "$said" "nvidia-smi read values out of range: GPU 0 ($H200): ${SMI_BAD_VALUE[$H200]}"
  # placeholders are no values out of range
  smi_reset
  smi_parse_gpus "0, $H200, [N/A], 9000, 143771, [N/A], [N/A], NVIDIA H200"
  assert_equal "${SMI_BAD_VALUE[$H200]}" ""
  run ! smi_bad_values_into said
}

@test "[GPU requires reset] and [Unknown Error] are device faults, not MIG [N/A]" {
  smi_parse_gpus $'0, '"$H200"$', [GPU requires reset], [GPU requires reset], [GPU requires reset], [GPU requires reset], [GPU requires reset], NVIDIA H200\n1, GPU-b, [Unknown Error], 5, 143771, 70.00, 700.00, NVIDIA H200\n2, GPU-c, [N/A], 5, 143771, [N/A], [N/A], NVIDIA H200'
  assert_equal "${#SMI_UUIDS[@]}" 3
  assert_equal "${SMI_GPU_FAULT[$H200]}" "GPU requires reset"
  assert_equal "${SMI_UTIL[$H200]}" ""
  assert_equal "${SMI_GPU_FAULT["GPU-b"]}" "Unknown Error"
  assert_equal "${SMI_GPU_FAULT["GPU-c"]}" ""
  assert_equal "$SMI_BAD_LINES" 0
}

@test "a fault in place of the UUID keeps the GPU under its index" {
  smi_parse_gpus "3, [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost]"
  assert_equal "${SMI_UUIDS[*]}" GPU-index-3
  assert_equal "${SMI_GPU_FAULT["GPU-index-3"]}" "GPU is lost"
}

@test "a fault in place of the UUID takes the UUID last read at its index, unless that GPU reads elsewhere" {
  local gone='[GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost]'
  smi_parse_gpus $'0, '"$H200"$', 5, 100, 143771, 80.00, 700.00, NVIDIA H200\n1, GPU-b, 5, 100, 143771, 80.00, 700.00, NVIDIA H200'
  smi_reset
  smi_parse_gpus "0, $gone, [GPU is lost]"$'\n1, GPU-b, 5, 100, 143771, 80.00, 700.00, NVIDIA H200'
  assert_equal "${SMI_UUIDS[*]}" "$H200 GPU-b"
  assert_equal "${SMI_INDEX[$H200]}" 0
  assert_equal "${SMI_GPU_FAULT[$H200]}" "GPU is lost"
  assert_equal "${SMI_UTIL[$H200]}" ""
  assert_equal "${SMI_INDEX["GPU-index-0"]+set}" ""
  # the indices moved: GPU-b reads at 0, the lost line at 1 is not GPU-b's
  smi_reset
  smi_parse_gpus $'0, GPU-b, 5, 100, 143771, 80.00, 700.00, NVIDIA H200\n1, '"$gone, [GPU is lost]"
  assert_equal "${SMI_UUIDS[*]}" "GPU-b GPU-index-1"
  assert_equal "${SMI_GPU_FAULT["GPU-b"]}" ""
}

@test "BOM, CRLF and a duplicate line are handled; a truncated GPU line is flagged" {
  smi_parse_gpus $'\xef\xbb\xbf0, '"$H200"$', 5, 100, 143771, 80.00, 700.00, NVIDIA H200\r\n0, '"$H200"$', 5, 100, 143771, 80.00, 700.00, NVIDIA H200\r\n1, GPU-b, 5, 10'
  assert_equal "${SMI_UUIDS[*]}" "$H200"
  assert_equal "${SMI_NAME[$H200]}" "NVIDIA H200"
  assert_equal "$SMI_TRUNCATED" 1
  assert_equal "$SMI_BAD_LINES" 2
}

@test "process lines join on the GPU UUID and sum per PID" {
  smi_parse_gpus "0, $H200, 0, 12266, 143771, 691.00, 700.00"
  run -0 smi_parse_apps $'1410, python3, 2556, '"$H200"$'\n1408, /opt/torch/.venv/bin/python3, 2910, '"$H200"
  smi_parse_apps $'1410, python3, 2556, '"$H200"$'\n1408, /opt/torch/.venv/bin/python3, 2910, '"$H200"
  assert_equal "${SMI_NPROCS[$H200]}" 2
  assert_equal "${SMI_PIDS_MEM[1408]}" 2910
  assert_equal "${SMI_PROCS[$H200]//$SMI_FS/|}" $'1410|python3|2556\n1408|/opt/torch/.venv/bin/python3|2910\n'
}

@test "an empty process name stays empty: a reader gets the memory as memory" {
  smi_parse_gpus "0, $H200, 0, 12266, 143771, 691.00, 700.00"
  smi_parse_apps $'1410, , 2556, '"$H200"
  IFS=$SMI_FS read -r pid name mem <<<"${SMI_PROCS[$H200]}"
  assert_equal "$pid|$name|$mem" "1410||2556"
}

@test "a PID listed twice on one GPU is one line with its memory summed" {
  smi_parse_gpus "0, $H200, 0, 50000, 143771, 691.00, 700.00"
  smi_parse_apps $'1410, python3, 20000, '"$H200"$'\n1411, python3, 5, '"$H200"$'\n1410, python3, 30000, '"$H200"
  assert_equal "${SMI_NPROCS[$H200]}" 2
  assert_equal "${SMI_PROCS[$H200]//$SMI_FS/|}" $'1410|python3|50000\n1411|python3|5\n'
  assert_equal "${SMI_PIDS_MEM[1410]}" 50000
  assert_equal "${SMI_PID_UUIDS[1410]}" "$H200"
}

@test "an empty process list (0 bytes, exit 0) is valid" {
  smi_parse_gpus "0, $H200, 0, 0, 143771, 76.61, 700.00"
  run -0 smi_parse_apps ""
}

@test "a process name with commas from an old driver keeps its commas" {
  smi_parse_gpus "0, $H200, 0, 1, 143771, 76.61, 700.00"
  smi_parse_apps "7, a, b, c, 10, $H200"
  assert_equal "${SMI_PROCS[$H200]//$SMI_FS/|}" $'7|a, b, c|10\n'
}

@test "garbage in the process list is reported" {
  smi_parse_gpus "0, $H200, 0, 1, 143771, 76.61, 700.00"
  run -1 smi_parse_apps "No running processes found"
  run -1 smi_parse_apps "1410, python3, 25"
  run -1 smi_parse_apps "18446744073709551615, python3, 2556, $H200"
  # a partial read cut inside the UUID of the last line
  run -1 smi_parse_apps $'1410, python3, 2556, '"$H200"$'\n1411, python3, 2556, '"${H200:0:20}"
  # a process on a GPU outside the sample is still just ignored
  run -0 smi_parse_apps "1412, python3, 2556, GPU-00000000-1111-2222-3333-444444444444"
}

@test "process memory: placeholders and out-of-range values are unknown, leading zeros dropped" {
  smi_parse_gpus "0, $H200, 0, 12266, 143771, 691.00, 700.00"
  smi_parse_apps $'1410, python3, [N/A], '"$H200"$'\n1411, python3, 0256, '"$H200"$'\n1412, python3, 18446744073709551615, '"$H200"
  assert_equal "${SMI_PROCS[$H200]//$SMI_FS/|}" $'1410|python3|\n1411|python3|256\n1412|python3|\n'
  assert_equal "${SMI_PIDS_MEM[1411]}" 256
}

@test "smi_sample: SMI_APPS_OK says whether the process list was read" {
  NVIDIA_SMI=$ROOT/tests/fakebin/nvidia-smi
  export FAKE_SMI_SCENARIO=$BATS_TEST_TMPDIR/s.json
  printf '%s' '{"gpus":[{"index":0,"uuid":"'"$H200"'","name":"NVIDIA H200","memory.total":143771,"power.limit":700.0}],"steps":[{"gpus":[{"utilization.gpu":0,"memory.used":2556,"power.draw":76.6}],"apps":[{"pid":1410,"process_name":"python3","used_memory":2556,"gpu":0}]},{"gpus":[{"utilization.gpu":0,"memory.used":2556,"power.draw":76.6}],"fault_apps":"garbage"}]}' >"$FAKE_SMI_SCENARIO"
  export FAKE_SMI_STATE=$BATS_TEST_TMPDIR/step
  smi_sample
  assert_equal "$SMI_APPS_OK" 1
  assert_equal "${SMI_NPROCS[$H200]}" 1
  assert_equal "${SMI_NAME[$H200]}" "NVIDIA H200"
  smi_sample
  assert_equal "$SMI_APPS_OK" 0
  assert_equal "${SMI_NPROCS[$H200]}" 0
  assert_equal "${#SMI_PIDS_MEM[@]}" 0
}

@test "smi_run_into reads a long answer whole, NUL bytes dropped, trailing newlines gone" {
  local big="$BATS_TEST_TMPDIR/big"
  # 2.5 MB: more than one read of at most 1 MiB
  printf '#!/bin/sh\nhead -c 2500000 /dev/zero | tr "\\\\0" x\nprintf "a\\\\0b\\\\n\\\\n"\n' >"$big"
  chmod +x "$big"
  NVIDIA_SMI=$big
  local out
  smi_run_into out -q
  assert_equal "${#out}" 2500002
  assert_equal "${out: -4}" xxab
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

@test "smi_run is bounded even when a setsid child holds its stdout" {
  local hang="$BATS_TEST_TMPDIR/hang"
  printf '#!/bin/sh\necho partial\nsetsid sleep 30 &\necho $! >"$0.child"\nsleep 30\n' >"$hang"
  chmod +x "$hang"
  NVIDIA_SMI=$hang SMI_TIMEOUT=1
  SECONDS=0
  run -124 smi_run -L
  ((SECONDS < 6))
  # a cut answer is no answer: nothing of it is kept
  assert_output ''
  kill "$(cat "$hang.child")" 2>/dev/null || true
}

@test "smi_run_into keeps the exit status, and an answer in UTF-8 whole under LANG=C and a UTF-8 locale" {
  local fake="$BATS_TEST_TMPDIR/fake"
  printf '#!/bin/sh
printf "0, 训练进程, 5, GPU-x\\n1, b, 6, GPU-y\\n"
exit 3
' >"$fake"
  chmod +x "$fake"
  NVIDIA_SMI=$fake
  local out rc loc
  for loc in C C.UTF-8; do
    rc=0
    LC_ALL=$loc smi_run_into out -q || rc=$?
    assert_equal "$rc" 3
    assert_equal "$out" $'0, 训练进程, 5, GPU-x\n1, b, 6, GPU-y'
  done
  NVIDIA_SMI=$BATS_TEST_TMPDIR/none
  run -127 smi_run -q
}

@test "smi_describe_failure says what happened in one line" {
  run -0 smi_describe_failure 9 $'NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver.\n\n'
  assert_output "nvidia-smi exited 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
  SMI_TIMEOUT=10
  run -0 smi_describe_failure 124 ""
  assert_output "nvidia-smi timed out after 10s (driver wedged?)"
}

@test "smi_sample: one run for both queries; each has its own deadline, in the caller's locale" {
  local fake="$BATS_TEST_TMPDIR/fake" log="$BATS_TEST_TMPDIR/calls"
  # a GPU line, then (second call) a process list that hangs when told to
  cat >"$fake" <<SH
#!/bin/sh
printf '%s LC_ALL=%s\n' "\$1" "\${LC_ALL-unset}" >>"$log"
case \$1 in
  --query-gpu=*) [ -e "$BATS_TEST_TMPDIR/gpu-fails" ] && { echo "No devices were found"; exit 6; }
    echo "0, $H200, 0, 2556, 143771, 76.61, 700.00, NVIDIA H200" ;;
  *) [ -e "$BATS_TEST_TMPDIR/apps-hang" ] && sleep 30
    echo "1410, python3, 2556, $H200" ;;
esac
SH
  chmod +x "$fake"
  NVIDIA_SMI=$fake SMI_TIMEOUT=1
  smi_sample
  assert_equal "$SMI_APPS_OK" 1
  assert_equal "${SMI_PIDS_MEM[1410]}" 2556
  # the caller's locale reaches both calls (the byte count's C locale does not)
  assert_equal "$(cut -d' ' -f2 "$log" | sort -u)" "LC_ALL=unset"
  LC_ALL=C.UTF-8 smi_sample
  assert_equal "$(tail -2 "$log" | cut -d' ' -f2 | sort -u)" "LC_ALL=C.UTF-8"
  # the process list hangs: the GPU figures stay, the list is unknown,
  # within the process list's own deadline
  touch "$BATS_TEST_TMPDIR/apps-hang"
  SECONDS=0
  smi_sample
  ((SECONDS < 5))
  assert_equal "$SMI_APPS_OK" 0
  assert_equal "${SMI_MEM_USED[$H200]}" 2556
  [[ $SMI_ERROR == "process list: nvidia-smi timed out after 1s"* ]]
  # the GPU query fails: no process list is asked for
  : >"$log"
  touch "$BATS_TEST_TMPDIR/gpu-fails"
  run -1 smi_sample
  assert_equal "$(wc -l <"$log")" 1
  smi_sample || true
  assert_equal "$SMI_ERROR" "nvidia-smi exited 6: No devices were found"
  NVIDIA_SMI=$BATS_TEST_TMPDIR/none
  smi_sample || true
  [[ $SMI_ERROR == "nvidia-smi not found ("*"none: command not found)" ]]
}
