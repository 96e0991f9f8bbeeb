#!/usr/bin/env bats
# lib/smi.sh's resident loops: how loop-mode lines become samples.
# shellcheck disable=SC2030,SC2031,SC2034 # each @test runs in its own subshell; globals read by smi.sh
bats_require_minimum_version 1.5.0

setup() {
  load test_helper/assert
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd)
  source "$ROOT/lib/common.sh"
  source "$ROOT/lib/smi.sh"
  A=GPU-21b026da-3a23-ca8c-52da-f8eedc850d97
  B=GPU-21b026db-3a23-ca8c-52da-f8eedc850d97
  SMI_STREAM_MS=1000 SMI_STREAM_NGPU=2
  SMI_SG_BUF='' SMI_SG_PEND='' SMI_SG_PEND_N=0 SMI_SG_PEND_LAST=-1 SMI_SG_PEND_TS=''
  SMI_SG_DONE='' SMI_SG_DONE_N=0 SMI_SG_DONE_TS=-1 SMI_SG_NEW=0 SMI_SG_JUNK='' SMI_SG_DONE_TSS='' SMI_SG_MORE=0
  SMI_SA_BUF='' SMI_SA_PEND='' SMI_SA_PEND_TS=-1 SMI_SA_DONE='' SMI_SA_DONE_TS=-1 SMI_SA_JUNK=''
  SMI_SA_PREV='' SMI_SA_PREV_TS=-1 SMI_SA_PEND_AT=0
}

gpu_line() { # TS INDEX UUID UTIL
  printf '2026/12/02 %s, %s, %s, %s, 2576, 143771, 76.60, 700.00, NVIDIA H200\n' "$1" "$2" "$3" "$4"
}

@test "the header is skipped and the newest whole GPU block is taken, without its timestamps" {
  SMI_SG_BUF="timestamp, index, uuid"$'\n'
  SMI_SG_BUF+=$(gpu_line 10:15:08.487 0 "$A" 0)$'\n'$(gpu_line 10:15:08.487 1 "$B" 100)$'\n'
  SMI_SG_BUF+=$(gpu_line 10:15:09.540 0 "$A" 5)$'\n'$(gpu_line 10:15:09.540 1 "$B" 99)$'\n'
  smi_stream_split_gpus
  assert_equal "$SMI_SG_JUNK" ""
  assert_equal "$SMI_SG_NEW" 1
  assert_equal "$SMI_SG_DONE_TS" $(((10 * 3600 + 15 * 60 + 9) * 1000 + 540))
  smi_reset
  smi_parse_gpus "$SMI_SG_DONE"
  assert_equal "${#SMI_UUIDS[@]}" 2
  assert_equal "${SMI_UTIL[$A]}" 5
  assert_equal "${SMI_UTIL[$B]}" 99
  assert_equal "$SMI_BAD_LINES" 0
}

@test "a block is whole at its GPU count, before the next sample starts" {
  SMI_SG_BUF=$(gpu_line 10:15:08.487 0 "$A" 0)$'\n'
  smi_stream_split_gpus
  assert_equal "$SMI_SG_NEW" 0
  SMI_SG_BUF=$(gpu_line 10:15:08.487 1 "$B" 100)$'\n'
  smi_stream_split_gpus
  assert_equal "$SMI_SG_NEW" 1
  assert_equal "$SMI_SG_DONE_N" 2
}

@test "a GPU vanishing shows as a short block; one coming back is noticed" {
  # GPU 1 gone: the next sample's index 0 ends a block of one line
  SMI_SG_BUF=$(gpu_line 10:15:08.487 0 "$A" 0)$'\n'$(gpu_line 10:15:09.487 0 "$A" 0)$'\n'
  smi_stream_split_gpus
  assert_equal "$SMI_SG_DONE_N" 1
  # with one GPU expected, GPU 1 back: a line of the block just closed
  SMI_STREAM_NGPU=1 SMI_SG_NEW=0
  SMI_SG_BUF=$(gpu_line 10:15:10.487 0 "$A" 0)$'\n'$(gpu_line 10:15:10.487 1 "$B" 0)$'\n'
  smi_stream_split_gpus
  assert_equal "$SMI_SG_MORE" 1
}

@test "a line cut short that runs into the next sample is garbage, not a GPU" {
  local cut
  cut=$(gpu_line 10:15:08.487 1 "$B" 100)
  SMI_SG_BUF=$(gpu_line 10:15:08.487 0 "$A" 0)$'\n'${cut:0:70}$(gpu_line 10:15:09.487 0 "$A" 0)$'\n'
  smi_stream_split_gpus
  [[ $SMI_SG_JUNK == "2026/12/02 10:15:08.487, 1, $B"* ]]
  # and so are warnings and bytes no terminal should get in the log
  SMI_SG_JUNK=''
  SMI_SG_BUF=$'WARNING: infoROM is corrupted \e[31mat gpu 0\n'
  smi_stream_split_gpus
  assert_equal "$SMI_SG_JUNK" "WARNING: infoROM is corrupted ?[31mat gpu 0"
}

@test "process lines group by moment; quiet ends the last group; the one before is kept" {
  SMI_SA_BUF="2026/12/02 10:15:08.512, 1410, python3, 2556, $A"$'\n'
  SMI_SA_BUF+="2026/12/02 10:15:08.513, 1408, python3, 2910, $B"$'\n'
  SMI_SA_BUF+="2026/12/02 10:15:09.564, 1410, python3, 2556, $A"$'\n'
  smi_stream_split_apps
  assert_equal "$SMI_SA_DONE" "1410, python3, 2556, $A"$'\n'"1408, python3, 2910, $B"$'\n'
  assert_equal "$SMI_SA_PEND" "1410, python3, 2556, $A"$'\n'
  # the block being read is not done while lines may still come
  SMI_SA_PEND_AT=${EPOCHREALTIME/./}
  smi_stream_apps_settle 0
  assert_equal "$SMI_SA_PEND_TS" $(((10 * 3600 + 15 * 60 + 9) * 1000 + 564))
  SMI_SA_PEND_AT=$((${EPOCHREALTIME/./} - 200000))
  smi_stream_apps_settle 0
  assert_equal "$SMI_SA_PEND_TS" -1
  assert_equal "$SMI_SA_DONE" "1410, python3, 2556, $A"$'\n'
  assert_equal "$SMI_SA_PREV_TS" $(((10 * 3600 + 15 * 60 + 8) * 1000 + 512))
}

@test "time differences hold across midnight" {
  local d
  smi_ms_diff_into d 100 86399900
  assert_equal "$d" 200
  smi_ms_diff_into d 86399900 100
  assert_equal "$d" -200
  smi_ms_diff_into d 5000 4000
  assert_equal "$d" 1000
}

@test "framed lines are read whole; a broken frame and the stream's end are told apart" {
  local fd buf='' rc=0
  # two frames, then the loop ends: both lines, and status 1
  exec {fd}< <(printf '\002%06d%s\n\002%06d%s\n' 4 abc 6 'x y z')
  sleep 0.2
  smi_stream_drain "$fd" buf || rc=$?
  assert_equal "$buf" $'abc\nx y z\n'
  assert_equal "$rc" 1
  exec {fd}<&-
  exec {fd}< <(printf 'garbage without a frame\n')
  sleep 0.2
  run smi_stream_drain "$fd" buf
  assert_equal "$status" 3
  # a frame read out of step (its STX lost): broken at its first byte
  exec {fd}< <(printf '%06d%s\n' 4 abc)
  sleep 0.2
  run smi_stream_drain "$fd" buf
  assert_equal "$status" 3
}

@test "the loop wrapper frames nvidia-smi's lines, drops NULs and control bytes" {
  local fd buf='' fake=$BATS_TEST_TMPDIR/nvidia-smi
  printf '#!/bin/sh\nprintf "a\\000b\\001c\\n\\344\\270\\255 ok\\n"\n' >"$fake"
  chmod +x "$fake"
  exec {fd}< <(SMI_AWK='awk' setsid sh -c "$SMI_STREAM_SCRIPT" sh $$ "$fake")
  sleep 0.5
  smi_stream_drain "$fd" buf || true
  assert_equal "$buf" $'ab?c\n\xe4\xb8\xad ok\n'
}
