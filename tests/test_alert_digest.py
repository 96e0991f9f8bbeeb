"""What a team reads (issue 13 points 1, 2, 3, 7): one digest per target per
flush, grouped by job and GPU, naming the job, in the target's language;
doctor checks targets without posting; notify --test/--preview."""
import json
import os
import re
import string
import subprocess
import time

import gpuguard_alert as alert
import gpuguard_messages_en
import gpuguard_messages_zh
import gpuguard_render as render
import pytest
import webhook_sink
from conftest import ROOT, app, idle_gpu, user_environ

JOB = {"user": "alice", "pid": 23690, "pids": [23690 + i for i in range(8)],
       "cmdline": "python3 train.py --config cfg/llama.yaml --api-key sk-live-0123456789 --lr 3e-4",
       "cwd": "/home/alice/llama", "start_ts": 1796198400, "elapsed_s": 8100, "slurm_job": "4242",
       "container": None, "rank": None}


def idle8(state="firing", job=JOB, **kw):
    out = []
    for i in range(8):
        e = {"ts": 1796206508, "host": "node7", "event": "gpu_idle", "state": state, "reason": "utilization",
             "gpu": i, "uuid": "GPU-%08x-3a23-ca8c-52da-f8eedc850d97" % (0x21b026da + i),
             "gpu_name": "NVIDIA H200", "utilization": 0, "threshold": 10, "memory_used_mib": 71800,
             "memory_total_mib": 143771, "power_draw_w": 123.4, "idle_cycles": 12, "idle_seconds": 720,
             "processes": [{"pid": 23690 + i, "name": "python3", "used_memory_mib": 71780}],
             "job": dict(job, rank=i) if job else None}
        if state == "resolved":
            e.update(reason="busy", utilization=98, idle_seconds=900)
        e.update(kw)
        out.append(e)
    return out


@pytest.fixture
def env(tmp_path):
    state = tmp_path / "state"
    (state / "outbox").mkdir(parents=True)
    return {"GPUGUARD_STATE_DIR": str(state), "GPUGUARD_LOG": str(tmp_path / "log"), "NOTIFY_RETRIES": "0",
            "LANG": "C"}


def queue(env, events):
    outbox = os.path.join(env["GPUGUARD_STATE_DIR"], "outbox")
    for n, e in enumerate(events):
        with open(os.path.join(outbox, f"{int(time.time() * 1e6)}-1-{n:06d}.json"), "w") as f:
            f.write(json.dumps(e) + "\n")


@pytest.fixture
def sink():
    server, rec = webhook_sink.serve(quiet=True)
    rec.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield rec
    server.shutdown()


def all_targets(url):
    return (f"dingtalk+{url}/dingtalk/robot/send?access_token=t1 feishu+{url}/feishu/hook/abc "
            f"wecom+{url}/wecom/send?key=k1 slack+{url}/slack/services/T/B/C {url}/generic")


def by_provider(sink):
    out = {}
    for r in sink.requests:
        out.setdefault(r["path"].split("/")[1], []).append(r["body"])
    return out


def text_of(provider, body):
    return {"dingtalk": lambda b: b["markdown"]["text"], "feishu": lambda b: b["content"]["text"],
            "wecom": lambda b: b["markdown"]["content"], "slack": lambda b: b["text"],
            "generic": lambda b: b["message"]}[provider](body)


# ----------------------------------------------------------- tables ----

def placeholders(template):
    return sorted(f for _, f, _, _ in string.Formatter().parse(template) if f)


def test_message_tables_have_the_same_keys_and_placeholders():
    en, zh = gpuguard_messages_en.MESSAGES, gpuguard_messages_zh.MESSAGES
    assert sorted(en) == sorted(zh)
    for key in en:
        assert placeholders(en[key]) == placeholders(zh[key]), key


def test_no_user_visible_string_outside_the_tables():
    """Every English or Chinese sentence of a message comes from a table:
    the renderer holds no Chinese text at all."""
    for name in ("gpuguard_render.py", "gpuguard_alert.py"):
        src = (ROOT / "python" / name).read_text()
        code = re.sub(r'""".*?"""', "", src, flags=re.DOTALL)
        code = "\n".join(ln.split("#")[0] for ln in code.splitlines())
        assert not re.search(r"[\u4e00-\u9fff]", code), name


# ----------------------------------------------------------- digests ----

def test_eight_idle_gpus_of_one_job_make_one_post_per_target_in_its_language(env, sink):
    env = dict(env, NOTIFY_URL=all_targets(sink.url), ALERTMANAGER_URL=sink.url,
               NOTIFY_MENTION="13800000000", GPU_HOUR_PRICE="30")
    queue(env, idle8())
    assert alert.flush(env) == 0
    posts = by_provider(sink)
    assert {k: len(v) for k, v in posts.items()} == {
        "dingtalk": 1, "feishu": 1, "wecom": 1, "slack": 1, "generic": 1, "api": 1}
    for provider in ("dingtalk", "feishu", "wecom"):
        text = text_of(provider, posts[provider][0])
        assert "GPU 0-7 (NVIDIA H200) 已空闲 12 分钟，占用者：Slurm 作业 4242" in text, provider
        assert "用户 alice" in text and "PID 23690-23697" in text and "rank 0-7" in text
        assert "命令：python3 train.py --config cfg/llama.yaml --api-key *** --lr 3e-4" in text
        assert "目录：/home/alice/llama" in text and "已运行 2 小时 15 分" in text
        assert "占用显存 8 × 70.1 GiB" in text and "空转已花费约 ¥ 48.00" in text
        assert "py-spy dump --pid 23690" in text and "NCCL_DEBUG" in text
        assert "GPU-21b026da" in text and "GPU-21b026e1" in text
        assert "sk-live" not in text
    for provider in ("slack", "generic"):
        text = text_of(provider, posts[provider][0])
        assert "GPU 0-7 (NVIDIA H200) idle 12 min, held by Slurm job 4242" in text, provider
        assert "user alice" in text and "cwd: /home/alice/llama" in text and "running 2 h 15 min" in text
        assert "idle so far costs ≈ 48.00 (1.6 GPU-h at 30.00/GPU-h)" in text
        assert "py-spy dump --pid 23690" in text
    # one @mention per digest, where each platform wants it
    ding = posts["dingtalk"][0]
    assert ding["at"]["atMobiles"] == ["13800000000"] and ding["markdown"]["text"].count("@13800000000") == 1
    assert text_of("wecom", posts["wecom"][0]).count("<@13800000000>") == 1
    assert text_of("feishu", posts["feishu"][0]).count('<at user_id="13800000000">') == 1
    assert text_of("slack", posts["slack"][0]).count("<@13800000000>") == 1
    # Alertmanager: one POST with 8 alerts, labels as the shipped rules
    alerts = posts["api"][0]
    assert sorted(a["labels"]["gpu"] for a in alerts) == [str(i) for i in range(8)]
    assert {a["labels"]["alertname"] for a in alerts} == {"GpuIdleHeld"}
    assert set(alerts[0]["labels"]) == {"alertname", "instance", "job", "severity", "gpu", "uuid", "vendor"}
    assert "held by Slurm job 4242" in alerts[0]["annotations"]["description"]


def test_eight_gpus_resolving_make_one_post_per_target_without_mention(env, sink):
    env = dict(env, NOTIFY_URL=all_targets(sink.url), NOTIFY_MENTION="13800000000")
    queue(env, idle8("resolved"))
    assert alert.flush(env) == 0
    posts = by_provider(sink)
    assert all(len(v) == 1 for v in posts.values()) and len(posts) == 5
    zh = text_of("dingtalk", posts["dingtalk"][0])
    assert "[gpuguard 恢复] node7：GPU 0-7 不再空闲占用" in zh
    assert "GPU 0-7 已恢复繁忙（利用率 98%），此前空闲 15 分钟；任务 Slurm 作业 4242" in zh
    assert "13800000000" not in json.dumps(posts["dingtalk"][0])
    en = text_of("slack", posts["slack"][0])
    assert "GPU 0-7 busy again (utilization 98%) after 15 min idle; job Slurm job 4242" in en


def test_two_jobs_and_a_resolved_gpu_are_one_post_with_a_line_each(env, sink):
    events = idle8()
    for e in events[4:]:
        e["job"] = dict(JOB, slurm_job="5151", user="bob")
    events.append(dict(idle8("resolved")[0], gpu=9, uuid="GPU-9", job=None,
                       processes=[{"pid": 99, "name": "infer", "used_memory_mib": 10}]))
    env = dict(env, NOTIFY_URL=f"slack+{sink.url}/slack/x")
    queue(env, events)
    assert alert.flush(env) == 0
    (req,) = sink.requests
    text = req["body"]["text"]
    assert "3 alerts (2 firing, 1 resolved)" in text
    assert "GPU 0-3 (NVIDIA H200) idle 12 min, held by Slurm job 4242" in text
    assert "GPU 4-7 (NVIDIA H200) idle 12 min, held by Slurm job 5151" in text and "user bob" in text
    assert "GPU 9 busy again" in text and "infer (PID 99)" in text


def test_language_follows_the_target_not_LANG(env, sink):
    env = dict(env, LANG="C", LC_ALL="C", NOTIFY_URL=f"dingtalk+{sink.url}/dingtalk/a feishu:en+{sink.url}/feishu/b "
                                                    f"slack:zh+{sink.url}/slack/c")
    queue(env, idle8()[:1])
    assert alert.flush(env) == 0
    posts = by_provider(sink)
    assert "占用但空闲" in posts["dingtalk"][0]["markdown"]["title"]
    assert "idle but occupied" in text_of("feishu", posts["feishu"][0])
    assert "占用但空闲" in text_of("slack", posts["slack"][0])
    # NOTIFY_LANG sets every target that has no prefix of its own
    targets = alert._targets_from_env({"NOTIFY_URL": "https://oapi.dingtalk.com/robot/send?access_token=x "
                                                    "zh+https://hooks.slack.com/services/a/b/c",
                                      "NOTIFY_LANG": "en", "ALERTMANAGER_URL": "http://am:9093"})
    assert [(t.provider, t.lang) for t in targets] == [("dingtalk", "en"), ("slack", "zh"), ("alertmanager", "en")]
    assert [t.lang for t in alert._targets_from_env({"NOTIFY_URL": "https://open.feishu.cn/open-apis/bot/v2/hook/x "
                                                                  "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=1 "
                                                                  "http://x/y"})] == ["zh", "zh", "en"]


def test_missing_fields_render_gracefully_in_both_languages():
    sparse = [{"event": "gpu_idle"}, {"event": "gpu_idle", "state": "resolved"},
              {"event": "gpu_idle", "gpu": "x", "job": {"user": None, "pid": None, "pids": None, "cmdline": None,
                                                        "cwd": None, "start_ts": None, "elapsed_s": None,
                                                        "slurm_job": None, "container": None, "rank": None}},
              {"event": "gpu_idle", "job": [{"container": "c0ffee"}], "processes": "garbage"},
              {"event": "gpu_memory_leak"}, {"event": "monitor_degraded"}, {"event": "strange", "x": 1},
              {"event": "gpu_idle", "job": {"start_ts": "soon", "elapsed_s": "long"}, "idle_seconds": "NaN"}]
    for lang in ("zh", "en"):
        for e in sparse:
            title, lines = render._render(e, lang, {})
            assert title.startswith("[gpuguard") and all(isinstance(x, str) for x in lines)
        title, _sections = render.render_digest(sparse, lang, {"GPU_HOUR_PRICE": "junk"})
        assert "gpuguard" in title
    title, lines = render._render(sparse[3], "en", {})
    assert "held by container c0ffee" in lines[0]
    assert "an unknown job" in render._render(sparse[0], "en", {})[1][0]


def test_the_headline_names_a_job_run_from_a_conda_env_by_its_script_not_its_interpreter_path(env):
    """Sixty characters of "/home/u/miniconda3/envs/qwen-sft/bin/python
    /home/u/miniconda..." told two jobs apart no better than nothing, while
    `gpuguard status` showed the short form."""
    conda = "/home/u/miniconda3/envs/qwen-sft/bin"
    cmd = "%s/python %s/torchrun --nproc-per-node 8 sft.py --run exp7" % (conda, conda)
    for state, head in (("firing", "held by"), ("resolved", "job")):
        ev = idle8(state, job=dict(JOB, cmdline=cmd, slurm_job=None, container=None))
        _, sections = render.render_digest(ev, "en", {})
        text = render.plain_text("", sections)
        assert "%s python torchrun --nproc-per-node 8 sft.py --run exp7" % head in text, text
        if state == "firing":
            assert "command: " + cmd in text, text


def test_cost_appears_only_with_a_price_and_accepts_a_currency(env):
    ev = idle8()[:2]
    assert not any("costs" in ln for ln in render._render(ev[0], "en", {})[1])
    _, sections = render.render_digest(ev, "en", {"GPU_HOUR_PRICE": "$2.5"})
    text = render.plain_text("", sections)
    assert "idle so far costs ≈ $ 1.00 (0.4 GPU-h at $ 2.50/GPU-h)" in text
    _, sections = render.render_digest([dict(e, gpu_hour_price="40 CNY") for e in ev], "zh", {})
    assert "空转已花费约 16.00 CNY" in render.plain_text("", sections)


def test_untrusted_job_fields_cannot_mention_anyone(env):
    evil = dict(JOB, cmdline="python x.py @all <at user_id=\"all\"></at> <!channel> @everyone", user="<@U1>")
    for provider in ("dingtalk", "feishu", "wecom", "slack"):
        body = render.chat_body(provider, idle8(job=evil), "en", env={})
        text = json.dumps(body, ensure_ascii=False)
        for bad in ("@all", "<at", "<!channel>", "<@U1>", "@everyone"):
            assert bad not in text, (provider, bad)


# ------------------------------------------- notify and doctor ----

def gpuguard(args, env, input=None):
    full = user_environ(GPUGUARD_CONFIG="/dev/null")
    full.update(env)
    return subprocess.run([str(ROOT / "bin/gpuguard")] + args, env=full, capture_output=True, text=True, check=False,
                          timeout=60, input=input)


def test_notify_preview_prints_every_provider_and_sends_nothing(env, sink):
    env = dict(env, NOTIFY_URL=all_targets(sink.url), ALERTMANAGER_URL=sink.url)
    lines = "".join(json.dumps(e) + "\n" for e in idle8())
    r = gpuguard(["notify", "--preview", "-"], env, input=lines)
    assert r.returncode == 0, r.stderr
    for head in ("===== dingtalk (zh)", "===== feishu (zh)", "===== wecom (zh)", "===== slack (en)",
                 "===== generic (en)", "===== alertmanager (en)"):
        assert head in r.stdout
    assert r.stdout.count("GPU 0-7 (NVIDIA H200) 已空闲 12 分钟") == 3
    assert r.stdout.count("GPU 0-7 (NVIDIA H200) idle 12 min") == 2
    assert sink.requests == []
    # default: the last line of events.jsonl
    with open(os.path.join(env["GPUGUARD_STATE_DIR"], "events.jsonl"), "w") as f:
        f.write(lines)
    r = gpuguard(["notify", "--preview"], env)
    assert r.returncode == 0 and "GPU 7 (NVIDIA H200) idle 12 min" in r.stdout
    assert sink.requests == []
    r = gpuguard(["notify", "--preview", "/nonexistent"], env)
    assert r.returncode == 2 and "cannot read" in r.stderr


def test_notify_preview_of_what_is_not_an_event_is_one_line_naming_it(env, tmp_path):
    # before: "gpuguard_alert: [Errno 21] Is a directory: 3" and
    # "gpuguard_alert: Expecting value: line 1 column 1 (char 0)", and a cut
    # last line of events.jsonl failed the preview of the default event
    r = gpuguard(["notify", "--preview", str(tmp_path)], env)
    assert (r.returncode, r.stdout, r.stderr) == (
        2, "", "gpuguard: notify --preview: cannot read '%s': it is a folder\n" % tmp_path)
    r = gpuguard(["notify", "--preview", "-"], env, input="not json\n")
    assert (r.returncode, r.stdout, r.stderr) == (2, "", "gpuguard: notify --preview: '-' holds no JSON event (line 1)\n")
    events = os.path.join(env["GPUGUARD_STATE_DIR"], "events.jsonl")
    with open(events, "w") as f:
        f.write("".join(json.dumps(e) + "\n" for e in idle8()) + '{"ts": 1796206568, "host": "node7", "eve')
    r = gpuguard(["notify", "--preview"], env)
    assert (r.returncode, r.stderr) == (0, "") and "GPU 7 (NVIDIA H200) idle 12 min" in r.stdout
    # a FILE the user named through a link is read as cat reads it (it had
    # said "[Errno 40] Too many levels of symbolic links"); its cut line is
    # skipped with a word
    os.symlink(events, tmp_path / "link.jsonl")
    r = gpuguard(["notify", "--preview", str(tmp_path / "link.jsonl")], env)
    assert r.returncode == 0 and "GPU 0-7 (NVIDIA H200) idle 12 min" in r.stdout
    assert r.stderr == ("gpuguard: notify --preview: skipped 1 line(s) of '%s' that are not JSON events (first: line 9)\n"
                        % (tmp_path / "link.jsonl"))
    with open(events, "w") as f:
        f.write('{"ts": 1796206568, "host": "node7", "eve')
    r = gpuguard(["notify", "--preview"], env)
    assert (r.returncode, r.stdout, r.stderr) == (
        2, "", "gpuguard: notify --preview: no recorded event: %s holds no JSON event\n" % events)


def test_notify_test_posts_once_per_target(env, sink):
    env = dict(env, NOTIFY_URL=all_targets(sink.url))
    r = gpuguard(["notify", "--test"], env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(sink.requests) == 5 and r.stdout.count("sent") == 5
    assert "告警通道测试" in text_of("dingtalk", by_provider(sink)["dingtalk"][0])
    assert "t1" not in r.stdout and "k1" not in r.stdout


def test_doctor_checks_targets_without_posting(box, sink):
    box.write_scenario([{"gpus": [idle_gpu()], "apps": [app(1410)]}] * 3)
    env = {"NOTIFY_URL": f"{sink.url}/generic dingtalk+https://oapi.dingtalk.com/robot/oops?access_token=tok12345 "
                         "http://no-such-host.invalid/hook"}
    r = box.run("doctor", env=env, cmd="bin/gpuguard")
    out = r.stdout
    assert re.search(r"^OK +target generic http://127\.0\.0\.1:[0-9]+/\*\*\*: reachable", out, re.MULTILINE), out
    assert re.search(r"^FAIL +target dingtalk https://oapi\.dingtalk\.com/\*\*\*: URL does not look like", out, re.MULTILINE)
    assert re.search(r"^FAIL +target generic http://no-such-host\.invalid/\*\*\*: name", out, re.MULTILINE)
    assert sink.requests == []
    assert "tok12345" not in out + r.stderr


def test_no_target_is_said_once_loudly(box):
    box.write_scenario([{"gpus": [idle_gpu()], "apps": [app(1410)]}] * 8)
    log = box.tmp / "gg.log"
    for t in range(6):
        box.once(now=t * 60, env={"GPUGUARD_LOG": str(log), "MAX_IDLE_CYCLES": "2"})
    text = log.read_text()
    assert text.count("NO ALERT TARGET CONFIGURED") == 1
    assert any(e["event"] == "gpu_idle" for e in box.events())
    assert not list((box.state / "outbox").glob("*.json"))


def test_events_emit_only_enqueues_and_flush_sends_one_digest(tmp_path, sink):
    state = tmp_path / "s"
    (state / "outbox").mkdir(parents=True)
    script = """
set -euo pipefail
source "$GPUGUARD_ROOT/lib/common.sh"
source "$GPUGUARD_ROOT/lib/events.sh"
for i in 0 1 2 3; do
  events_emit "{\\"ts\\":1,\\"host\\":\\"n\\",\\"event\\":\\"gpu_idle\\",\\"state\\":\\"firing\\",\\"gpu\\":$i}"
done
ls "$GPUGUARD_STATE_DIR/outbox" | grep -c 'json$'
curl_count=$(wc -l <"$RECORD" 2>/dev/null || echo 0)
echo "before-flush $curl_count"
events_flush
"""
    record = tmp_path / "record.jsonl"
    server, rec = webhook_sink.serve(quiet=True, record=str(record))
    env = user_environ(GPUGUARD_ROOT=str(ROOT), GPUGUARD_STATE_DIR=str(state), RECORD=str(record),
               GPUGUARD_LOG=str(tmp_path / "log"),
               NOTIFY_URL=f"http://127.0.0.1:{server.server_address[1]}/generic")
    try:
        r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False)
    finally:
        server.shutdown()
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["4", "before-flush", "0"]
    (req,) = rec.requests
    assert [e["gpu"] for e in req["body"]["events"]] == [0, 1, 2, 3]
    assert len((state / "events.jsonl").read_text().splitlines()) == 4


def test_dingtalk_gets_at_most_20_posts_a_minute_and_the_rest_later_in_one(env, sink):
    """A cycle every 2 s, each with a new alert: the robot's own limit (20 a
    minute; it throttles for 10 minutes past it) holds without any setting."""
    env = dict(env, NOTIFY_URL=f"dingtalk+{sink.url}/dingtalk/robot/send?access_token=t")
    now = time.time()
    for cycle in range(30):
        queue(env, [dict(idle8()[0], gpu=cycle, uuid=f"GPU-{cycle}")])
        alert.flush(env, now=now + 2 * cycle)
    assert len(sink.requests) == 20
    assert alert.flush(env, now=now + 61) == 0
    assert len(sink.requests) == 21
    assert "GPU 20-29" in sink.requests[-1]["body"]["markdown"]["title"]


def test_reminders_are_tagged_as_such_unless_something_new_fires():
    first = idle8()[0]
    title, _ = render._render(dict(first, state="reminder"), "en", {})
    assert title.startswith("[gpuguard REMINDER] node7: GPU 0 idle")
    title, _ = render.render_digest([dict(first, state="reminder"), dict(idle8()[1], job=None)], "zh")
    assert title.startswith("[gpuguard 告警]")


def test_ranks_of_one_job_without_slurm_are_one_line():
    events = idle8(job=dict(JOB, slurm_job=None))
    for i, e in enumerate(events):
        e["job"]["cmdline"] = f"python -m torch.distributed.launch train.py --local_rank={i}"
    title, sections = render.render_digest(events, "en", {})
    assert len(sections) == 1 and "GPU 0-7 idle but occupied" in title
    assert "held by python -m torch.distributed.launch train.py --local_rank=0" in sections[0][0]


def test_a_job_known_only_by_its_pid_still_lists_the_processes_name_and_memory():
    # jobinfo gives a job with only the PID ("visible": false) when /proc
    # cannot show it (a container, or it went): nvidia-smi's name and memory
    # are then all the reader has
    hidden = {"user": None, "pid": 437, "pids": [437], "cmdline": None, "cwd": None, "start_ts": None,
              "elapsed_s": None, "slurm_job": None, "container": None, "rank": None, "visible": False}
    e = dict(idle8(job=hidden)[0], processes=[{"pid": 437, "name": "python3", "used_memory_mib": 2696}])
    for lang in ("en", "zh"):
        assert any("437 python3 (2696 MiB)" in line for line in render._render(e, lang, {})[1])
    # a job read from /proc names what runs: no process list
    assert not any("Processes:" in line for line in render._render(idle8()[0], "en", {})[1])


# ------------------------------------- stuck, degraded, leak verdicts ----

def stuck8(state="firing", job=JOB, **kw):
    """8 GPUs of one job spinning, as lib/idle.sh's idle_emit writes them."""
    out = []
    for e in idle8(state, job):
        e.update(event="gpu_stuck", reason="spinning", utilization=100, power_draw_w=124.0, power_limit_w=700.0,
                 idle_power_pct=22, spin_cycles=5, idle_cycles=5, idle_seconds=240, since=1796206268)
        if state == "resolved":
            e.update(reason="busy", power_draw_w=690.0, spin_cycles=8, idle_seconds=480)
        e.update(kw)
        out.append(e)
    return out


def degraded(gpu=3, state="firing", **kw):
    e = {"id": f"1796206508-GPU-{gpu}-gpu_degraded-{state}", "ts": 1796206508, "host": "node7",
         "event": "gpu_degraded", "state": state, "reason": "fault" if state == "firing" else "recovered",
         "severity": "critical", "gpu": gpu, "uuid": "GPU-%08x-3a23-ca8c-52da-f8eedc850d97" % (0x21b026da + gpu),
         "gpu_name": "NVIDIA H200", "fault": "GPU requires reset" if state == "firing" else None,
         "faulted_cycles": 3}
    e.update(kw)
    return e


# 2026-12-02 10:45:00 UTC
LEAK_TS = 1796208300


def leak(**kw):
    """A gpu_memory_leak event as the detector branch writes it
    (gpuguard_leakstat.Series.event + gpuguard_leak.check)."""
    e = {"ts": LEAK_TS, "event": "gpu_memory_leak", "state": "firing", "pid": 51000, "host": "node7",
         "name": "/usr/bin/python3", "slope_mib_per_hour": 2400.0, "used_memory_mib": 131072,
         "free_memory_mib": 8000, "projected_oom_hours": 3.3333, "window_seconds": 7200,
         "severity": "critical", "trend": "accelerating", "since_ts": LEAK_TS - 7200, "confidence": 0.87,
         "tier": "fast", "threshold_mib_per_hour": 50.0, "leaking_pid": 51003, "rank": "3"}
    e.update(kw)
    return e


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_stuck_gpus_of_one_job_are_one_post_per_target_with_job_cost_and_hint(env, sink):
    env = dict(env, NOTIFY_URL=all_targets(sink.url), ALERTMANAGER_URL=sink.url,
               NOTIFY_MENTION="13800000000", GPU_HOUR_PRICE="30")
    queue(env, stuck8())
    assert alert.flush(env) == 0
    posts = by_provider(sink)
    assert {k: len(v) for k, v in posts.items()} == {
        "dingtalk": 1, "feishu": 1, "wecom": 1, "slack": 1, "generic": 1, "api": 1}
    for provider in ("dingtalk", "feishu", "wecom"):
        text = text_of(provider, posts[provider][0])
        assert "GPU 0-7 (NVIDIA H200) 卡住：利用率 100 %，功耗仅 124 W（上限 700 W 的 18 %），已持续 5 个周期" in text
        assert "占用者：Slurm 作业 4242，已卡住 4 分钟" in text and "用户 alice" in text
        assert "py-spy dump --native --pid 23690" in text and "NCCL_DEBUG=INFO" in text and "其他 rank" in text
        assert "空转已花费约 ¥ 16.00" in text and "占用显存 8 × 70.1 GiB" in text
        assert "event gpu_stuck" not in text and "事件" not in text
    for provider in ("slack", "generic"):
        text = text_of(provider, posts[provider][0])
        assert ("GPU 0-7 (NVIDIA H200) stuck: 100 % busy at 124 W (18 % of 700 W) for 5 cycles"
                " — a hung collective or spin-wait?") in text, provider
        assert "Held by Slurm job 4242, stuck for 4 min" in text and "user alice" in text
        assert "py-spy dump --native --pid 23690" in text and "check the other ranks" in text
        assert "idle so far costs ≈ 16.00 (0.5 GPU-h at 30.00/GPU-h)" in text
        assert "sk-live" not in text
    assert text_of("dingtalk", posts["dingtalk"][0]).count("@13800000000") == 1
    alerts = posts["api"][0]
    assert len(alerts) == 8
    for a in alerts:
        assert a["labels"]["alertname"] == "GpuStuckSpinning"
        assert set(a["labels"]) == {"alertname", "instance", "job", "severity", "gpu", "uuid", "vendor"}
        assert (a["labels"]["job"], a["labels"]["instance"], a["labels"]["severity"]) == (
            "gpuguard", "node7", "warning")
        assert a["startsAt"] == render._iso(1796206268)


def test_stuck_resolving_is_one_post_without_mention(env, sink):
    env = dict(env, NOTIFY_URL=all_targets(sink.url), NOTIFY_MENTION="13800000000")
    queue(env, stuck8("resolved"))
    assert alert.flush(env) == 0
    posts = by_provider(sink)
    assert all(len(v) == 1 for v in posts.values()) and len(posts) == 5
    assert "GPU 0-7 working again (power 690 W) after 8 min stuck; job Slurm job 4242" in \
        text_of("slack", posts["slack"][0])
    assert "GPU 0-7 已恢复工作（功耗 690 W），此前卡住 8 分钟" in text_of("feishu", posts["feishu"][0])
    assert posts["dingtalk"][0]["at"]["atMobiles"] == []


def test_degraded_gpu_is_critical_and_names_gpu_model_uuid_fault_and_what_to_check(env, sink):
    env = dict(env, NOTIFY_URL=all_targets(sink.url), ALERTMANAGER_URL=sink.url)
    queue(env, [degraded(3)])
    assert alert.flush(env) == 0
    posts = by_provider(sink)
    uuid = "GPU-21b026dd-3a23-ca8c-52da-f8eedc850d97"
    for provider in ("dingtalk", "feishu", "wecom"):
        text = text_of(provider, posts[provider][0])
        assert "[gpuguard 严重] node7：GPU 3 故障：GPU requires reset" in text
        assert "GPU 3 (NVIDIA H200)：nvidia-smi 连续 3 个周期报告“GPU requires reset”" in text
        assert uuid in text and "nvidia-smi -q -i 3" in text and "xid" in text and "需要该卡空闲" in text
    for provider in ("slack", "generic"):
        text = text_of(provider, posts[provider][0])
        assert "[gpuguard CRITICAL] node7: GPU 3 faulted: GPU requires reset" in text
        assert "GPU 3 (NVIDIA H200): nvidia-smi prints “GPU requires reset” for 3 cycles" in text
        assert uuid in text and "nvidia-smi -q -i 3" in text and "grep -i xid" in text
        assert "a reset (nvidia-smi -r -i 3) needs the GPU idle" in text
    (a,) = posts["api"][0]
    assert a["labels"] == {"alertname": "GpuDegraded", "instance": "node7", "job": "gpuguard",
                           "severity": "critical", "gpu": "3", "uuid": uuid, "vendor": "nvidia"}
    assert a["annotations"]["fault"] == "GPU requires reset"
    title, lines = render._render(degraded(3, "resolved"), "en", {})
    assert title == "[gpuguard RESOLVED] node7: GPU 3 reads normally again"
    assert lines[0] == "GPU 3 (NVIDIA H200) reads normally again after 3 faulted cycles"
    assert render._alertmanager_labels(degraded(3, "resolved"))["severity"] == "critical"


def test_a_digest_mixing_idle_stuck_degraded_leak_and_resolved_is_one_post_per_target(env, sink):
    other = dict(JOB, slurm_job="5151", user="bob", cmdline="torchrun --nproc 2 rl.py", pid=30000,
                 pids=[30000, 30001])
    events = (idle8()[:2] + stuck8(job=other)[4:6] + [degraded(7), leak()]
              + idle8("resolved")[2:4] + [dict(leak(state="resolved"), severity=None)])
    env = dict(env, NOTIFY_URL=all_targets(sink.url), ALERTMANAGER_URL=sink.url, NOTIFY_MENTION="13800000000")
    queue(env, events)
    assert alert.flush(env) == 0
    posts = by_provider(sink)
    assert {k: len(v) for k, v in posts.items()} == {
        "dingtalk": 1, "feishu": 1, "wecom": 1, "slack": 1, "generic": 1, "api": 1}
    en = text_of("slack", posts["slack"][0])
    assert en.startswith("*[gpuguard CRITICAL] node7: 6 alerts (4 firing, 2 resolved)*")
    # critical first, then the rest, resolved last
    order = [en.index(s) for s in ("[CRITICAL] GPU 7 (NVIDIA H200): nvidia-smi prints",
                                   "[CRITICAL] Growing +2400 MiB/h",
                                   "[ALERT] GPU 0-1 (NVIDIA H200) idle 12 min, held by Slurm job 4242",
                                   "[ALERT] GPU 4-5 (NVIDIA H200) stuck: 100 % busy at 124 W",
                                   "[RESOLVED] GPU 2-3 busy again",
                                   "[RESOLVED] Now 128.0 GiB")]
    assert order == sorted(order)
    zh = text_of("dingtalk", posts["dingtalk"][0])
    for part in ("GPU 7 (NVIDIA H200)：nvidia-smi 连续 3 个周期报告", "增长 +2400 MiB/h",
                 "GPU 0-1 (NVIDIA H200) 已空闲 12 分钟", "GPU 4-5 (NVIDIA H200) 卡住", "GPU 2-3 已恢复繁忙"):
        assert part in zh, part
    assert zh.count("@13800000000") == 1
    firing = sorted(a["labels"]["alertname"] for a in posts["api"][0] if a["endsAt"] > render._iso(time.time() + 600))
    assert firing == sorted(["GpuIdleHeld"] * 2 + ["GpuStuckSpinning"] * 2 + ["GpuDegraded", "GpuMemoryLeak"])
    resolved = sorted((a["labels"]["alertname"], a["labels"]["severity"]) for a in posts["api"][0]
                      if a["endsAt"] <= render._iso(time.time() + 600))
    # the resolved leak without a severity resolves each name it may have fired as
    assert resolved == sorted([("GpuIdleHeld", "warning")] * 2 + list(render._LEAK_RESOLVE_AS))
    assert len(posts["generic"][0]["events"]) == len(events)


def test_leak_verdict_fields_render_rate_since_oom_clock_confidence_and_rank(utc):
    title, lines = render._render(leak(), "en", {})
    assert title == "[gpuguard CRITICAL] node7: PID 51000 python3: GPU memory leak suspected"
    text = "\n".join(lines)
    assert "Growing +2400 MiB/h (window 2 h 0 min), now 128.0 GiB, GPU free 7.8 GiB" in text
    assert "Growing since 2026-12-02 08:45 (2 h 0 min ago)" in text
    assert "Projected OOM in 3 h 20 min (about 14:05)" in text
    assert "Verdict: accelerating, confidence 87 %" in text
    assert "Leaking: rank 3, PID 51003 (of the process tree of PID 51000)" in text
    title, lines = render._render(leak(), "zh", {})
    text = "\n".join(lines)
    assert title == "[gpuguard 严重] node7：PID 51000 python3 疑似显存泄漏"
    assert "自 2026-12-02 08:45 起增长（已 2 小时 0 分）" in text
    assert "预计 3 小时 20 分 后 OOM（约 14:05）" in text
    assert "判定：加速增长，置信度 87 %" in text and "泄漏者：rank 3，PID 51003（属于 PID 51000 的进程树）" in text
    # a projection past midnight carries the date; a rank unknown names the PID
    text = "\n".join(render._render(leak(severity="warning", free_memory_mib=None, projected_oom_hours=30.0, rank=None,
                                       trend="steady (phase-aware)"), "en", {})[1])
    assert "Projected OOM in 30 h 0 min (about 2026-12-03 16:45)" in text
    assert "Verdict: steady growth across phases" in text
    assert "Leaking: PID 51003 (of the process tree of PID 51000)" in text
    assert render._render(leak(severity="warning"), "en", {})[0].startswith("[gpuguard ALERT]")


def test_leak_alert_says_whether_the_ranks_grow_alone_or_in_step(utc):
    """A tree's alert carries how many of its ranks grow: one alone is a
    leak's signature, all in step more often new data shapes, some are
    counted. A single process (no ranks_rising) says nothing of peers."""
    def text(lang, **kw):
        return "\n".join(render._render(leak(**kw), lang, {})[1])
    assert "Its 7 peer ranks stay flat: one rank growing alone is a leak's signature" in text("en", ranks_rising=[1, 8])
    assert "其余 7 个 rank 保持平稳" in text("zh", ranks_rising=[1, 8])
    assert "All 8 ranks grow in step: more often new data shapes" in text("en", ranks_rising=[8, 8])
    assert "全部 8 个 rank 同步增长" in text("zh", ranks_rising=[8, 8])
    # all in step: the rank named is the fastest, not "the leaking" one
    assert "Fastest-growing: rank 3, PID 51003" in text("en", ranks_rising=[8, 8])
    assert "Leaking: rank" not in text("en", ranks_rising=[8, 8])
    assert "增长最快：rank 3" in text("zh", ranks_rising=[8, 8])
    assert "Leaking: rank 3, PID 51003" in text("en", ranks_rising=[3, 8])
    assert "3 of the 8 ranks are growing" in text("en", ranks_rising=[3, 8])
    assert "8 个 rank 中有 3 个在增长" in text("zh", ranks_rising=[3, 8])
    for bad in (None, [1], [0, 8], [9, 8], ["x", 8], [1, 1]):
        t = text("en", ranks_rising=bad)
        assert "peer ranks" not in t and "in step" not in t and "ranks are growing" not in t, bad


def test_leak_beyond_the_warning_horizon_is_a_trend_note_not_a_page(env, sink):
    note = leak(severity="info", slope_mib_per_hour=60.0, free_memory_mib=18000, projected_oom_hours=300.0,
                confidence=0.62,
                trend="steady", leaking_pid=None, rank=None)
    env = dict(env, NOTIFY_URL=all_targets(sink.url), ALERTMANAGER_URL=sink.url, NOTIFY_MENTION="13800000000")
    queue(env, [note])
    assert alert.flush(env) == 0
    posts = by_provider(sink)
    en = text_of("slack", posts["slack"][0])
    assert "[gpuguard NOTE] node7: PID 51000 python3: GPU memory grows slowly (trend note, not urgent)" in en
    assert "OOM 12 d" not in en and "OOM 300 h 0 min away at this rate: a trend note for a ticket, not a page" in en
    assert "Projected OOM" not in en and "Leaking:" not in en
    zh = text_of("dingtalk", posts["dingtalk"][0])
    assert "[gpuguard 提示]" in zh and "显存缓慢增长（趋势提示，不紧急）" in zh and "记个工单即可" in zh
    # no @mention anywhere: it is not a page
    assert posts["dingtalk"][0]["at"]["atMobiles"] == [] and "@13800000000" not in zh
    assert "<@13800000000>" not in en and "<at" not in text_of("feishu", posts["feishu"][0])
    (a,) = posts["api"][0]
    assert a["labels"] == {"alertname": "GpuMemoryLeakTrend", "instance": "node7", "job": "gpuguard",
                           "severity": "info", "pid": "51000", "name": "python3"}
    # beside a real alert, the digest pages once (for the alert)
    body = render.chat_body("dingtalk", [note] + idle8()[:1], "zh", env={"NOTIFY_MENTION": "13800000000"})
    assert body["at"]["atMobiles"] == ["13800000000"] and "[提示]" in body["markdown"]["text"]


def test_leak_alertmanager_severity_follows_the_event_and_old_events_still_render():
    assert render._alertmanager_labels(leak())["severity"] == "critical"
    assert render._alertmanager_labels(leak(severity="warning")) == {
        "alertname": "GpuMemoryLeak", "instance": "node7", "job": "gpuguard", "severity": "warning",
        "pid": "51000", "name": "python3"}
    annotations = render.alertmanager_alert(leak(), "en", now=LEAK_TS)["annotations"]
    assert (annotations["confidence"], annotations["trend"], annotations["rank"], annotations["leaking_pid"]) == (
        "0.87", "accelerating", "3", "51003")
    # an event from the detector before its verdict fields: as before
    old = {"ts": LEAK_TS, "event": "gpu_memory_leak", "state": "firing", "pid": 4242, "host": "node7",
           "name": "python3", "slope_mib_per_hour": 120.0, "used_memory_mib": 20000, "free_memory_mib": 1200,
           "projected_oom_hours": 10.0, "window_seconds": 10800}
    assert render._alertmanager_labels(old) == {
        "alertname": "GpuMemoryLeakDetected", "instance": "node7", "job": "gpuguard", "severity": "warning",
        "pid": "4242", "name": "python3"}
    for lang in ("en", "zh"):
        title, lines = render._render(old, lang, {})
        assert "4242" in title and "+120" in lines[0]
        assert not any("confidence" in ln or "置信度" in ln or "Leaking" in ln for ln in lines)
    assert "Projected OOM in 10 h 0 min" in "\n".join(render._render(old, "en", {})[1])
    # hostile or odd detector fields never crash nor mention anyone
    odd = leak(trend="@all <at user_id=\"all\">", confidence="high", since_ts="yesterday", rank="<!channel>",
               projected_oom_hours=float("nan"), severity="bogus", leaking_pid="x")
    for lang in ("en", "zh"):
        text = "\n".join(render._render(odd, lang, {})[1])
        assert "@all" not in text and "<at" not in text and "<!channel>" not in text


def rule_block(name):
    rules = (ROOT / "etc/prometheus/gpuguard.rules.yml").read_text()
    m = re.search(r"- alert: " + re.escape(name) + r"\n(.*?)(?=\n\s*- alert:|\Z)", rules, re.DOTALL)
    assert m, name
    return m.group(1)


@pytest.mark.parametrize("kind", ["gpu_idle", "gpu_stuck", "gpu_degraded"])
def test_shipped_rules_carry_the_labels_gpuguard_sends_alertmanager(kind):
    """Same alert name, severity, job and instance (the scrape port
    stripped) as the alerts gpuguard pushes, and the GPU identity labels
    (gpu, uuid, and vendor, which the metrics carry) kept by the expression."""
    labels = render._alertmanager_labels({"event": kind, "host": "node7", "gpu": 3, "uuid": "GPU-x",
                                        "severity": "critical" if kind == "gpu_degraded" else None})
    block = rule_block(labels["alertname"])
    assert f"severity: {labels['severity']}" in block
    assert "job: gpuguard" in block and 'reReplaceAll ":[0-9]+$" "" $labels.instance' in block
    assert set(labels) - {"alertname", "instance", "job", "severity"} == {"gpu", "uuid", "vendor"}
    expr = block.split("expr:", 1)[1].split("for:", 1)[0]
    assert "on (instance, gpu, uuid)" in expr or re.fullmatch(r"\s*gpuguard_gpu_fault == 1\s*", expr)


def test_watchdog_stuck_gpu_reaches_each_target_once_and_previews(box, sink):
    """As a user meets it: a spinning GPU (100 % at 124.8 W of 700 W, the
    H200 spin figures) through the nvidia-smi double and the watchdog, one
    post per target; then `gpuguard notify --preview` of the recorded
    event."""
    spin = {"gpus": [idle_gpu(util=100, power=124.8, mem=12000)], "apps": [app(4242, mem=11800)]}
    box.write_scenario([spin] * 7)
    env = {"NOTIFY_URL": all_targets(sink.url), "ALERTMANAGER_URL": sink.url, "NOTIFY_RETRIES": "0",
           "GPU_HOUR_PRICE": "30"}
    for t in range(7):
        box.once(now=1796206508 + 60 * t, env=env)
    assert [(e["event"], e["state"]) for e in box.events()] == [("gpu_stuck", "firing")]
    posts = by_provider(sink)
    assert {k: len(v) for k, v in posts.items()} == {
        "dingtalk": 1, "feishu": 1, "wecom": 1, "slack": 1, "generic": 1, "api": 1}
    assert "GPU 0 (NVIDIA H200) stuck: 100 % busy at 125 W (18 % of 700 W) for 5 cycles" in \
        text_of("slack", posts["slack"][0])
    assert "GPU 0 (NVIDIA H200) 卡住：利用率 100 %，功耗仅 125 W（上限 700 W 的 18 %）" in \
        text_of("wecom", posts["wecom"][0])
    assert posts["api"][0][0]["labels"]["alertname"] == "GpuStuckSpinning"
    r = gpuguard(["notify", "--preview", str(box.state / "events.jsonl")], {"GPUGUARD_STATE_DIR": str(box.state)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("py-spy dump --native --pid 4242") == 5
    assert '"alertname": "GpuStuckSpinning"' in r.stdout and "event gpu_stuck" not in r.stdout


def test_watchdog_device_fault_previews_as_critical(box):
    ok = {"gpus": [idle_gpu(mem=600)], "apps": [app(1410, mem=580)]}
    reset = {"gpus": [{k: "[GPU requires reset]" for k in ("utilization.gpu", "memory.used", "memory.total",
                                                            "power.draw", "power.limit")}], "apps": []}
    box.write_scenario([ok] + [reset] * 4)
    for t in range(5):
        box.once(now=1796206508 + 60 * t, env={"SMI_FAIL_ALERT_CYCLES": "3"})
    assert [(e["event"], e["state"]) for e in box.events()] == [("gpu_degraded", "firing")]
    r = gpuguard(["notify", "--preview"], {"GPUGUARD_STATE_DIR": str(box.state)})
    assert r.returncode == 0, r.stderr
    # slack, generic and the Alertmanager summary; the three Chinese platforms
    assert r.stdout.count("[gpuguard CRITICAL]") == 3 and r.stdout.count("[gpuguard 严重]") == 3
    assert "nvidia-smi -q -i 0" in r.stdout and "GPU requires reset" in r.stdout
    assert '"alertname": "GpuDegraded"' in r.stdout and '"severity": "critical"' in r.stdout


def test_a_leak_resolved_without_severity_ends_the_critical_alert_in_a_real_alertmanager(env, tmp_path):
    """The detector does not repeat the severity when a leak resolves;
    Alertmanager knows an alert by all its labels: the resolve must still
    end the critical GpuMemoryLeak it fired as, and page no one else."""
    import shutil

    from conftest import free_port, require, wait_for
    from test_prometheus import am_alerts, get
    binary = shutil.which("prometheus-alertmanager")
    require(binary is not None, "Debian package prometheus-alertmanager not installed")
    server, hooks = webhook_sink.serve(quiet=True)
    port = free_port()
    (tmp_path / "am.yml").write_text(json.dumps({
        "route": {"receiver": "hook", "group_by": ["..."], "group_wait": "1s", "group_interval": "1s",
                  "repeat_interval": "1h"},
        "receivers": [{"name": "hook", "webhook_configs": [
            {"url": f"http://127.0.0.1:{server.server_address[1]}/hook", "send_resolved": True}]}]}))
    am = subprocess.Popen([binary, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'am'}",
                           f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    am_url = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: get(am_url + "/-/ready") is not None, timeout=30)
        env = dict(env, ALERTMANAGER_URL=am_url)
        firing = leak(ts=int(time.time()))
        queue(env, [firing])
        assert alert.flush(env) == 0
        (active,) = am_alerts(port)
        assert active["labels"] == {"alertname": "GpuMemoryLeak", "instance": "node7", "job": "gpuguard",
                                    "severity": "critical", "pid": "51000", "name": "python3"}
        assert wait_for(lambda: len(hooks.requests) == 1, timeout=30)
        resolved = {k: v for k, v in firing.items() if k not in ("severity", "trend", "since_ts", "confidence",
                                                                  "tier", "leaking_pid", "rank")}
        queue(env, [dict(resolved, state="resolved", ts=int(time.time()))])
        assert alert.flush(env) == 0
        assert wait_for(lambda: am_alerts(port) == [], timeout=30)
        assert wait_for(lambda: len(hooks.requests) == 2, timeout=30)
        time.sleep(2)
        # one firing and one resolved notification; the other names never fired
        statuses = [(r["body"]["status"], [a["labels"]["alertname"] for a in r["body"]["alerts"]])
                    for r in hooks.requests]
        assert statuses == [("firing", ["GpuMemoryLeak"]), ("resolved", ["GpuMemoryLeak"])]
    finally:
        am.terminate()
        am.wait(timeout=10)
        server.shutdown()


def test_an_escalated_leak_says_it_was_a_warning_and_replaces_it_in_alertmanager(utc):
    """A leak sent as a warning and sent again as critical when its OOM came
    near: the title says it is getting worse, the first line when it was
    sent and as what, in English and Chinese; Alertmanager gets the critical
    alert and the warning one ended, so one leak is one alert there."""
    ev = leak(escalated_from="warning", first_alert_ts=LEAK_TS - 6 * 3600, tier="slow")
    title, lines = render._render(ev, "en", {})
    assert title == "[gpuguard CRITICAL] node7: PID 51000 python3: GPU memory leak getting worse"
    assert lines[0] == "Sent as a warning at %s; the memory kept growing and the OOM is nearer now" % \
        time.strftime("%Y-%m-%d %H:%M", time.gmtime(LEAK_TS - 6 * 3600))
    title, lines = render._render(ev, "zh", {})
    assert title.endswith("PID 51000 python3 显存泄漏加剧") and lines[0].startswith("已于 ") and "以警告发出" in lines[0]
    alerts = render.alertmanager_alerts(ev, now=LEAK_TS + 60)
    assert [(a["labels"]["alertname"], a["labels"]["severity"]) for a in alerts] == [
        ("GpuMemoryLeak", "critical"), ("GpuMemoryLeak", "warning")]
    assert alerts[1]["endsAt"] <= render._iso(LEAK_TS + 60) < alerts[0]["endsAt"]
    # a first alert (no escalation) reads as before
    title, lines = render._render(leak(), "en", {})
    assert title.endswith("PID 51000 python3: GPU memory leak suspected") and not lines[0].startswith("Sent as")
    assert len(render.alertmanager_alerts(leak(), now=LEAK_TS + 60)) == 1
