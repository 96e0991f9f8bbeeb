#!/usr/bin/env bats
# lib/jobinfo.sh: secrets masked out of command lines, containers read from
# cgroup files, the job of a process found by walking up its parents.
# shellcheck disable=SC2030,SC2031,SC2034 # each @test runs in its own subshell
bats_require_minimum_version 1.5.0

setup() {
  load test_helper/assert
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd)
  source "$ROOT/lib/common.sh"
  source "$ROOT/lib/jobinfo.sh"
}

mask() {
  local out
  jobinfo_mask_args_into out "$@"
  printf '%s\n' "$out"
}

@test "secrets in options, pairs, URLs, query strings and token shapes are masked" {
  run -0 mask python3 train.py --api-key K1 --api_key=K2 --hf-token K3 --HF_TOKEN=K4 --password K5 \
    password=K6 secret=K7,token=K8 WANDB_API_KEY=K9
  refute_output --regexp 'K[0-9]'
  assert_output "python3 train.py --api-key *** --api_key=*** --hf-token *** --HF_TOKEN=*** --password *** password=*** secret=***,token=*** WANDB_API_KEY=***"
  run -0 mask git clone "https://bob:K10@git.example.com/r.git" \
    "https://oapi.dingtalk.com/robot/send?access_token=K11&sign=K12&timestamp=1" "http://h/?key=K13&q=1"
  refute_output --regexp 'K[0-9]'
  assert_output "git clone https://bob:***@git.example.com/r.git https://oapi.dingtalk.com/robot/send?access_token=***&sign=***&timestamp=1 http://h/?key=***&q=1"
  run -0 mask hf_abcdefghijklmnopqrstu sk-abcdefghijklmnopqrstuv "Authorization: Bearer K14" --lr 3e-4
  assert_output "hf_*** sk-*** 'Authorization: Bearer ***' --lr 3e-4"
}

@test "keys and passes by any name, webhook paths and a split Bearer header are masked" {
  run -0 mask python3 train.py --wandb-key K1 --db-pass K2 --key K3 --db_pwd=K4 data.api_key=K5 \
    https://hooks.slack.com/services/T0/B0/K6 "https://open.feishu.cn/open-apis/bot/v2/hook/K7?x=1" \
    https://discord.com/api/webhooks/1/K8 -H Authorization: Bearer K9
  refute_output --regexp 'K[0-9]'
  assert_output "python3 train.py --wandb-key *** --db-pass *** --key *** --db_pwd=*** data.api_key=*** https://hooks.slack.com/services/*** https://open.feishu.cn/open-apis/bot/v2/hook/***?x=1 https://discord.com/api/webhooks/*** -H Authorization: Bearer ***"
  # names that only contain the words stay
  run -0 mask train.py --key_column text --monkey 3 --bypass 1 --passes 2 --tokenizer_path /t
  assert_output "train.py --key_column text --monkey 3 --bypass 1 --passes 2 --tokenizer_path /t"
}

@test "FastChat's --api-keys, JWTs, cookies and headers given as arguments are masked" {
  run -0 mask python3 -m fastchat.serve.openai_api_server --api-keys K1,K2 --port 8000 --jwt K3 --cookie K4 \
    --header Authorization:K5 -H "X-Api-Key: K6" -H "Authorization: Bearer K7" -H Content-Type:application/json
  refute_output --regexp "K[0-9]"
  assert_output "python3 -m fastchat.serve.openai_api_server --api-keys *** --port 8000 --jwt *** --cookie *** --header Authorization:*** -H 'X-Api-Key: ***' -H 'Authorization: Bearer ***' -H Content-Type:application/json"
}

@test "ordinary arguments are kept; long command lines are cut in the middle" {
  run -0 mask torchrun --nproc_per_node 8 train.py --tokenizer_path /m/tok --output_dir "/data/run 1"
  assert_output "torchrun --nproc_per_node 8 train.py --tokenizer_path /m/tok --output_dir '/data/run 1'"
  run -0 mask python3 "$(printf 'x%.0s' {1..400})" --end
  assert_output --partial " … "
  assert_output --partial "x --end"
  ((${#output} <= 310))
}

@test "a long command line in Chinese is cut on characters under LC_ALL=C (cron) too" {
  local prompt
  prompt=$(printf '中文提示词%.0s' {1..60})
  for loc in C C.UTF-8; do
    LC_ALL=$loc run -0 mask python3 train.py --prompt "$prompt" --end
    # the cut leaves valid UTF-8 (a cut inside a character did not)
    printf '%s' "$output" | iconv -f UTF-8 -t UTF-8 >/dev/null
    assert_output --partial " … "
    assert_output --partial "词 --end"
  done
}

@test "containers from cgroup lines: docker, containerd, podman, kubepods" {
  local f="$BATS_TEST_TMPDIR/cgroup" c id=0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
  printf '0::/system.slice/docker-%s.scope\n' "$id" >"$f"
  jobinfo_container_from_file "$f" c
  assert_equal "$c" docker:0123456789ab
  printf '12:cpu:/docker/%s\n' "$id" >"$f"
  jobinfo_container_from_file "$f" c
  assert_equal "$c" docker:0123456789ab
  printf '0::/system.slice/containerd.service/kubepods-burstable-pod1b2c3d4e_aaaa_bbbb_cccc_0123456789ab.slice:cri-containerd:%s\n' "$id" >"$f"
  jobinfo_container_from_file "$f" c
  assert_equal "$c" kubepods:1b2c3d4e-aaaa-bbbb-cccc-0123456789ab
  printf '0::/machine.slice/libpod-%s.scope/container\n' "$id" >"$f"
  jobinfo_container_from_file "$f" c
  assert_equal "$c" podman:0123456789ab
  printf '0::/user.slice/user-1000.slice/session-3.scope\n' >"$f"
  jobinfo_container_from_file "$f" c
  assert_equal "$c" ''
}

@test "the job of a process: its launcher, not the shell of the terminal" {
  # a session-leading shell (a terminal) runs `timeout 60 sleep 60`
  # shellcheck disable=SC2016 # $! and $1 belong to the inner shell
  setsid bash -c 'timeout 60 sleep 60 & echo $! >"$1/launcher"; wait' _ "$BATS_TEST_TMPDIR" &
  local i
  for ((i = 0; i < 100; i++)); do
    [[ -s $BATS_TEST_TMPDIR/launcher ]] && pgrep -P "$(<"$BATS_TEST_TMPDIR/launcher")" >/dev/null && break
    sleep 0.05
  done
  local launcher holder top
  launcher=$(<"$BATS_TEST_TMPDIR/launcher")
  holder=$(pgrep -P "$launcher")
  jobinfo_reset
  jobinfo_top_into "$holder" top
  kill "$launcher" "$holder" 2>/dev/null || true
  assert_equal "$top" "$launcher"
}
