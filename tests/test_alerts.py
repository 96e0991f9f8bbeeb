"""Notifications as the platforms really behave, against local receivers
that emulate each provider (tests/webhook_sink.py, 127.0.0.1 only)."""
import base64
import hashlib
import hmac
import json
import os
import subprocess
import time
import urllib.parse

import gpuguard_alert as alert
import gpuguard_render as render
import pytest
import webhook_sink
from conftest import ROOT, app, idle_gpu, user_environ

IDLE_EVENT = {"ts": 1796206508, "host": "node7", "event": "gpu_idle", "state": "firing",
              "reason": "utilization", "gpu": 0, "uuid": "GPU-21b026da-3a23-ca8c-52da-f8eedc850d97",
              "utilization": 6, "threshold": 10, "memory_used_mib": 2576,
              "memory_total_mib": 143771, "power_draw_w": 76.6, "idle_cycles": 3,
              "idle_seconds": 120, "processes": [{"pid": 1410, "name": "python3", "used_memory_mib": 2556}]}


def resolved(**kw):
    e = dict(IDLE_EVENT, state="resolved", reason="busy", utilization=97, **kw)
    return e


@pytest.fixture
def outbox_env(tmp_path):
    state = tmp_path / "state"
    (state / "outbox").mkdir(parents=True)
    env = {"GPUGUARD_STATE_DIR": str(state), "GPUGUARD_LOG": str(tmp_path / "log"),
           "NOTIFY_LANG": "en", "NOTIFY_RETRIES": "2", "NOTIFY_TIMEOUT": "2"}
    return env


def queue(env, *events):
    outbox = os.path.join(env["GPUGUARD_STATE_DIR"], "outbox")
    for e in events:
        name = "%d-%06d.json" % (time.time() * 1e6, len(os.listdir(outbox)))
        with open(os.path.join(outbox, name), "w") as f:
            f.write(json.dumps(e) + "\n")


def queued(env):
    outbox = os.path.join(env["GPUGUARD_STATE_DIR"], "outbox")
    return sorted(n for n in os.listdir(outbox) if n.endswith(".json"))


def log_text(env):
    try:
        with open(env["GPUGUARD_LOG"]) as f:
            return f.read()
    except OSError:
        return ""


def serve(**kw):
    server, sink = webhook_sink.serve(quiet=True, **kw)
    sink.url = "http://127.0.0.1:%d" % server.server_address[1]
    sink.server = server
    return sink


# ------------------------------------------------------------- signing ----

def independent_dingtalk_sign(secret, ts):
    key = secret.encode()
    msg = ("%s\n%s" % (ts, secret)).encode()
    return urllib.parse.quote(base64.b64encode(hmac.new(key, msg, hashlib.sha256).digest()).decode(), safe="")


def test_dingtalk_signature_matches_research_vector():
    assert alert._dingtalk_sign("SEC0123456789abcdef", "1700000000000") == \
        "TSZbRFUuvaSQaRKUpF970OPCb2%2FLcQAP3wOvwZIzBZk%3D"
    assert alert._dingtalk_sign("SECabc", "1800000000123") == independent_dingtalk_sign("SECabc", "1800000000123")


def test_feishu_signature_matches_research_vector_and_not_the_dingtalk_recipe():
    assert alert._feishu_sign("demo", "1599360473") == "l1N0gAcBjdwBvGm1xMjOF0XSyaLRpR7tuO5dHfhAYc8="
    assert alert._feishu_sign("demo", "1599360473") != "DkEDUyVoOOJ539qBvUgMyzkzIdRWlf4e/V3Rq+ONJnQ="


# ----------------------------------------------------------- providers ----

def test_provider_from_host_prefix_and_type():
    env = {"NOTIFY_URL": "https://oapi.dingtalk.com/robot/send?access_token=x "
                         "https://open.feishu.cn/open-apis/bot/v2/hook/abc,"
                         "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=k;"
                         "https://hooks.slack.com/services/T/B/C wecom+http://127.0.0.1:1/x "
                         "http://example.invalid/hook",
           "NOTIFY_TYPE": "slack"}
    assert [t.provider for t in alert._targets_from_env(env)] == [
        "dingtalk", "feishu", "wecom", "slack", "wecom", "slack"]


def test_dingtalk_signed_markdown_delivered(outbox_env):
    sink = serve(secret="SECtestsecret0001")
    env = dict(outbox_env, NOTIFY_URL="dingtalk+%s/dingtalk/robot/send?access_token=tok123456" % sink.url,
               NOTIFY_SECRET="SECtestsecret0001", NOTIFY_MENTION="13800000000")
    queue(env, IDLE_EVENT)
    assert alert.flush(env) == 0
    (req,) = sink.requests
    assert req["reply_status"] == 200 and req["query"]["access_token"] == "tok123456"
    body = req["body"]
    assert body["msgtype"] == "markdown"
    assert "GPU 0 idle but occupied" in body["markdown"]["title"]
    assert "1410 python3 (2556 MiB)" in body["markdown"]["text"]
    # DingTalk only mentions a mobile that also appears in the text
    assert body["at"]["atMobiles"] == ["13800000000"] and "@13800000000" in body["markdown"]["text"]
    assert queued(env) == []


def test_dingtalk_bad_signature_is_permanent_reported_once_and_kept(outbox_env):
    sink = serve(secret="SECtheRightOne0001")
    env = dict(outbox_env, NOTIFY_URL="dingtalk+%s/dingtalk?access_token=tok" % sink.url,
               NOTIFY_SECRET="SECaWrongOne000001")
    queue(env, IDLE_EVENT)
    now = time.time()
    assert alert.flush(env, now=now) == 1
    assert len(sink.requests) == 1           # permanent: no retry storm
    # not retried before the back-off, and reported only once
    assert alert.flush(env, now=now + 60) == 1
    assert len(sink.requests) == 1
    assert alert.flush(env, now=now + 700) == 1
    assert len(sink.requests) == 2
    log = log_text(env)
    assert log.count("rejected the alert: error 310000: sign not match") == 1
    assert "SECaWrong" not in log and "SECtheRight" not in log
    # fixing the secret delivers what waited
    env["NOTIFY_SECRET"] = "SECtheRightOne0001"
    assert alert.flush(env, now=now + 1400) == 0
    assert "delivering again" in log_text(env)


def test_errcode_in_http_200_is_not_a_delivery(outbox_env):
    sink = serve(script=[{"status": 200, "body": {"errcode": 300005, "errmsg": "token is not exist"}}])
    env = dict(outbox_env, NOTIFY_URL="wecom+%s/wecom" % sink.url)
    queue(env, IDLE_EVENT)
    assert alert.flush(env) == 1
    assert "error 300005: token is not exist" in log_text(env)


def test_feishu_signed_text_delivered_and_wrong_secret_rejected(outbox_env):
    sink = serve(secret="feishu-secret-1")
    env = dict(outbox_env, NOTIFY_URL="feishu+%s/feishu/open-apis/bot/v2/hook/abcdef" % sink.url,
               NOTIFY_SECRET="feishu-secret-1", NOTIFY_LANG="zh")
    queue(env, IDLE_EVENT)
    assert alert.flush(env) == 0
    body = sink.requests[0]["body"]
    assert body["msg_type"] == "text" and len(body["timestamp"]) == 10
    assert "占用但空闲" in body["content"]["text"]
    env["NOTIFY_SECRET"] = "other-secret-xx"
    queue(env, resolved())
    assert alert.flush(env) == 1
    assert "19021" in log_text(env)


def test_wecom_markdown_respects_4096_bytes(outbox_env):
    sink = serve()
    env = dict(outbox_env, NOTIFY_URL="wecom+%s/wecom/send?key=abc" % sink.url, NOTIFY_LANG="zh")
    procs = [{"pid": 1000 + i, "name": "训练进程" * 40, "used_memory_mib": 100} for i in range(200)]
    queue(env, dict(IDLE_EVENT, processes=procs))
    assert alert.flush(env) == 0
    content = sink.requests[0]["body"]["markdown"]["content"]
    assert len(content.encode("utf-8")) <= 4096
    assert "另有 190 个" in content
    content.encode("utf-8").decode("utf-8")      # cut on a character boundary


def test_slack_needs_plain_ok(outbox_env):
    sink = serve(script=[{"status": 200, "body": "invalid_token"}])
    env = dict(outbox_env, NOTIFY_URL="slack+%s/slack/services/T/B/C" % sink.url)
    queue(env, IDLE_EVENT)
    assert alert.flush(env) == 1
    assert alert.flush(env, now=time.time() + 700) == 0
    assert "*[gpuguard ALERT] node7: GPU 0 idle but occupied*" in sink.requests[-1]["body"]["text"]


def test_mentions_in_process_names_are_defused():
    evil = dict(IDLE_EVENT, processes=[{"pid": 1, "name": '@all <at user_id="all"></at> <!channel> <@U1> @everyone',
                                        "used_memory_mib": 1}])
    for provider in ("dingtalk", "feishu", "wecom", "slack"):
        body = render.chat_body(provider, [evil], "en", env={})
        text = json.dumps(body, ensure_ascii=False)
        for bad in ("@all", "<at", "<!channel>", "<@U1>", "@everyone"):
            assert bad not in text, (provider, bad)
        if provider == "dingtalk":
            assert body["at"]["isAtAll"] is False


def test_generic_gets_the_events_themselves_in_order_in_one_digest(outbox_env, sink):
    env = dict(outbox_env, NOTIFY_URL=sink.url + "/generic")
    queue(env, IDLE_EVENT, resolved())
    assert alert.flush(env) == 0
    (req,) = sink.requests
    assert [e["state"] for e in req["body"]["events"]] == ["firing", "resolved"]
    assert req["body"]["events"][0]["processes"] == IDLE_EVENT["processes"]
    assert req["body"]["lang"] == "en" and "GPU 0 idle" in req["body"]["message"]


# -------------------------------------------------- retries and outbox ----

def test_429_with_short_retry_after_is_honoured(outbox_env):
    sink = serve(script=[{"status": 429, "body": "slow down", "headers": {"Retry-After": "1"}}])
    env = dict(outbox_env, NOTIFY_URL=sink.url + "/generic")
    queue(env, IDLE_EVENT)
    start = time.time()
    assert alert.flush(env) == 0
    assert [r["reply_status"] for r in sink.requests] == [429, 200]
    assert sink.requests[1]["time"] - sink.requests[0]["time"] >= 0.9
    # retried within this flush after the 1 s asked for, not after a
    # back-off (30 s and more): a bound a loaded machine cannot reach
    assert time.time() - start < 20


def test_429_with_long_retry_after_waits_for_a_later_cycle(outbox_env):
    sink = serve(script=[{"status": 429, "body": "", "headers": {"Retry-After": "120"}}])
    env = dict(outbox_env, NOTIFY_URL=sink.url + "/generic")
    queue(env, IDLE_EVENT)
    now = time.time()
    assert alert.flush(env, now=now) == 1
    assert alert.flush(env, now=now + 60) == 1
    assert len(sink.requests) == 1
    assert alert.flush(env, now=now + 121) == 0
    assert len(sink.requests) == 2


def test_5xx_is_retried_with_backoff(outbox_env):
    sink = serve(script=[{"status": 500, "body": "rollup_error"}, {"status": 502, "body": ""}])
    env = dict(outbox_env, NOTIFY_URL=sink.url + "/generic")
    queue(env, IDLE_EVENT)
    assert alert.flush(env) == 0
    assert [r["reply_status"] for r in sink.requests] == [500, 502, 200]


def test_timeout_is_retried(outbox_env):
    sink = serve(script=[{"status": 200, "body": {}, "delay": 3}])
    env = dict(outbox_env, NOTIFY_URL=sink.url + "/generic", NOTIFY_TIMEOUT="1")
    queue(env, IDLE_EVENT)
    assert alert.flush(env) == 0
    assert len(sink.requests) == 2


def test_receiver_down_for_several_cycles_then_delivered_once_in_order(outbox_env, down_port):
    env = dict(outbox_env, NOTIFY_URL=down_port.url + "/generic", NOTIFY_RETRIES="1")
    queue(env, IDLE_EVENT)
    now = time.time()
    for cycle in range(4):
        assert alert.flush(env, now=now + 60 * cycle) >= 1
        if cycle == 2:
            queue(env, resolved())
    assert len(queued(env)) == 2
    server, sink = down_port.up(quiet=True)
    try:
        assert alert.flush(env, now=now + 600) == 0
        assert alert.flush(env, now=now + 660) == 0
        assert [e["state"] for r in sink.requests for e in r["body"]["events"]] == ["firing", "resolved"]
    finally:
        server.shutdown()


def test_one_target_down_does_not_block_or_duplicate_the_other(outbox_env, sink, down_port):
    env = dict(outbox_env, NOTIFY_URL="%s/generic %s/generic" % (sink.url, down_port.url),
               NOTIFY_RETRIES="0")
    queue(env, IDLE_EVENT)
    now = time.time()
    assert alert.flush(env, now=now) == 1
    assert alert.flush(env, now=now + 400) == 1
    assert len(sink.requests) == 1          # not sent twice to the healthy one
    server, sink2 = down_port.up(quiet=True)
    try:
        assert alert.flush(env, now=now + 800) == 0
        assert len(sink2.requests) == 1 and len(sink.requests) == 1
    finally:
        server.shutdown()


def test_outbox_is_bounded_and_says_what_it_drops(outbox_env, down_port):
    env = dict(outbox_env, NOTIFY_URL="http://127.0.0.1:%d/generic" % down_port.port,
               OUTBOX_MAX="3", NOTIFY_RETRIES="0")
    queue(env, *[dict(IDLE_EVENT, gpu=i) for i in range(5)])
    first_two = queued(env)[:2]
    alert.flush(env)
    assert len(queued(env)) == 3
    log = log_text(env)
    assert "dropped the 2 oldest undelivered events (%s .. %s)" % (first_two[0], first_two[1]) in log


def test_burst_becomes_one_digest_and_rate_limit_holds_the_rest(outbox_env):
    sink = serve()
    env = dict(outbox_env, NOTIFY_URL="dingtalk+%s/dingtalk?access_token=t" % sink.url,
               NOTIFY_RATE_PER_MIN="2")
    queue(env, *[dict(IDLE_EVENT, gpu=i) for i in range(8)])
    now = time.time()
    assert alert.flush(env, now=now) == 0
    (req,) = sink.requests
    assert "GPU 0-7 idle but occupied" in req["body"]["markdown"]["title"]
    for i in range(3):
        queue(env, dict(IDLE_EVENT, gpu=10 + i))
        alert.flush(env, now=now + 1 + i)
    assert len(sink.requests) == 2          # 2 per minute
    assert len(queued(env)) == 2
    assert "rate limit reached" in log_text(env)
    assert alert.flush(env, now=now + 61) == 0
    assert len(sink.requests) == 3 and "GPU 11-12 idle" in sink.requests[-1]["body"]["markdown"]["title"]


def test_unreadable_outbox_file_is_set_aside_not_fatal(outbox_env, sink):
    env = dict(outbox_env, NOTIFY_URL=sink.url + "/generic")
    outbox = os.path.join(env["GPUGUARD_STATE_DIR"], "outbox")
    with open(os.path.join(outbox, "0000-bad.json"), "w") as f:
        f.write("{not json")
    queue(env, IDLE_EVENT)
    assert alert.flush(env) == 0
    assert len(sink.requests) == 1
    assert os.path.exists(os.path.join(outbox, "0000-bad.json.bad"))


# -------------------------------------------------------- Alertmanager ----

def test_alertmanager_firing_then_resolved_with_stable_labels(outbox_env, sink):
    env = dict(outbox_env, ALERTMANAGER_URL=sink.url)
    queue(env, IDLE_EVENT)
    alert.flush(env)
    queue(env, dict(resolved(), utilization=97))
    alert.flush(env)
    first, second = [r["body"][0] for r in sink.requests]
    assert [r["path"] for r in sink.requests] == ["/api/v2/alerts"] * 2
    assert first["labels"] == second["labels"] == {
        "alertname": "GpuIdleHeld", "instance": "node7", "job": "gpuguard", "severity": "warning",
        "gpu": "0", "uuid": IDLE_EVENT["uuid"], "vendor": "nvidia"}
    assert first["annotations"]["utilization"] == "6" and second["annotations"]["utilization"] == "97"
    assert first["endsAt"] > time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    assert second["endsAt"] <= time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 1))


# ------------------------------------------------------------- secrets ----

def test_secrets_never_in_logs_events_or_argv(box, tmp_path):
    """End to end through the watchdog: a receiver that rejects, a token in
    the URL, a signing secret; python3 is wrapped to record its argv."""
    sink = serve(script=[{"status": 500, "body": "boom access_token=tok-SECRET-123456"}] * 20)
    shim = tmp_path / "shim"
    shim.mkdir()
    real = subprocess.run(["bash", "-c", "command -v python3"], capture_output=True, text=True).stdout.strip()
    (shim / "python3").write_text('#!/bin/sh\necho "$@" >> "%s"\nexec %s "$@"\n' % (tmp_path / "argv.log", real))
    (shim / "python3").chmod(0o755)
    conf = tmp_path / "gpuguard.conf"
    conf.write_text("NOTIFY_URL=dingtalk+%s/dingtalk/robot/send?access_token=tok-SECRET-123456\n"
                    "NOTIFY_SECRET=SEC-signing-SECRET-987\nNOTIFY_RETRIES=0\n" % sink.url)
    conf.chmod(0o600)
    box.write_scenario([{"gpus": [idle_gpu()], "apps": [app(1410)]}] * 5)
    env = {"GPUGUARD_CONFIG": str(conf), "PATH": "%s:%s" % (shim, box.env["PATH"]),
           "GPUGUARD_LOG": str(tmp_path / "gpuguard.log")}
    for t in range(4):
        box.once(now=t, env=env)
    assert len(sink.requests) >= 1
    everything = (tmp_path / "gpuguard.log").read_text() + (box.state / "events.jsonl").read_text() + \
        (tmp_path / "argv.log").read_text() + (box.state / "alert-state.json").read_text()
    assert "rejected" in everything or "HTTP 500" in everything
    assert "SECRET" not in everything
    assert "access_token=***" in everything


def test_test_alert_reports_each_target(tmp_path):
    ok = serve()
    bad = serve(script=[{"status": 200, "body": {"errcode": 93000, "errmsg": "invalid webhook url"}}])
    env = user_environ(NOTIFY_URL="%s/generic wecom+%s/wecom/send?key=KEYSECRET99" % (ok.url, bad.url),
               GPUGUARD_CONFIG="/dev/null", GPUGUARD_STATE_DIR=str(tmp_path / "s"), NOTIFY_RETRIES="0")
    r = subprocess.run([str(ROOT / "bin/gpuguard"), "test-alert"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("sent") and "generic %s/***" % ok.url in lines[0]
    assert lines[1].startswith("permanent") and "error 93000: invalid webhook url" in lines[1]
    assert "KEYSECRET" not in r.stdout + r.stderr
    assert ok.requests[0]["body"]["events"][0]["event"] == "test"


def test_render_languages():
    title, lines = render._render(IDLE_EVENT, "zh", {})
    assert "占用但空闲" in title and any("利用率 6%（阈值 10%）" in ln for ln in lines)
    title, lines = render._render(IDLE_EVENT, "en", {})
    assert title == "[gpuguard ALERT] node7: GPU 0 idle but occupied"
    # LANG does not choose: the target does, or NOTIFY_LANG for all
    assert render.language({"LANG": "zh_CN.UTF-8"}) is None
    assert render.language({"LANG": "en_US.UTF-8", "NOTIFY_LANG": "zh"}) == "zh"


def test_a_dead_receiver_is_tried_less_and_less_often(outbox_env, down_port):
    env = dict(outbox_env, NOTIFY_URL="http://127.0.0.1:%d/generic" % down_port.port, NOTIFY_RETRIES="0")
    queue(env, IDLE_EVENT)
    now = time.time()
    tries = []
    for second in range(0, 900, 10):                   # a cycle every 10 s for 15 min
        before = log_text(env).count("stay queued")
        alert.flush(env, now=now + second)
        if log_text(env).count("stay queued") > before:
            tries.append(second)
    assert tries[:5] == [0, 30, 90, 210, 450]          # 30, 60, 120, 240 s apart
    assert all(b - a <= 300 for a, b in zip(tries, tries[1:]))
    assert "next try in 30 s" in log_text(env)


def test_a_receiver_down_for_days_still_gets_its_alert(outbox_env, down_port):
    """Thousands of failed attempts (about four days at the 5-minute pause)
    must not break the back-off arithmetic: the receiver gets the alert once
    it is back."""
    env = dict(outbox_env, NOTIFY_URL=down_port.url + "/generic", NOTIFY_RETRIES="0")
    queue(env, IDLE_EVENT)
    now = time.time()
    assert alert.flush(env, now=now) == 1
    path = os.path.join(env["GPUGUARD_STATE_DIR"], "alert-state.json")
    with open(path) as f:
        state = json.load(f)
    (tstate,) = state.values()
    tstate["failures"] = 1200
    with open(path, "w") as f:
        json.dump(state, f)
    assert alert.flush(env, now=now + 400) == 1        # still down: kept
    assert "next try in 300 s" in log_text(env)
    server, sink = down_port.up(quiet=True)
    try:
        assert alert.flush(env, now=now + 800) == 0
        assert [e["uuid"] for r in sink.requests for e in r["body"]["events"]] == [IDLE_EVENT["uuid"]]
    finally:
        server.shutdown()


def test_a_write_into_a_removed_state_folder_is_not_called_a_full_disk(tmp_path):
    """The daemon's state folder removed while the helper writes into it:
    the daemon makes it again and says so; a "disk full?" line before that
    sent the reader after the wrong cause. A folder that is there but
    cannot take the marker still says it once."""
    log = tmp_path / "log"
    env = {"GPUGUARD_LOG": str(log)}
    gone = tmp_path / "gone"
    alert._write_failed(env, str(gone), str(gone / "outbox"), OSError(2, "No such file or directory"))
    assert not log.exists() or "disk full" not in log.read_text()
    here = tmp_path / "here"
    here.mkdir()
    alert._write_failed(env, str(here), str(here / "outbox"), OSError(28, "No space left on device"))
    alert._write_failed(env, str(here), str(here / "outbox"), OSError(28, "No space left on device"))
    assert log.read_text().count("disk full?") == 1


def test_a_write_refused_for_permission_is_not_called_a_full_disk(tmp_path):
    """EACCES (a folder of root's, as a user) was logged as "(Permission
    denied; disk full?)": the reader went looking for a full disk."""
    log = tmp_path / "log"
    env = {"GPUGUARD_LOG": str(log)}
    alert._write_failed(env, str(tmp_path), str(tmp_path / "outbox"), OSError(13, "Permission denied"))
    text = log.read_text()
    assert "disk full" not in text and "(Permission denied for uid %d)" % os.geteuid() in text
