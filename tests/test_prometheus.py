"""Fleet: the textfile metrics, the shipped rules under promtool, and the
real stack end to end - yichuidingyin.sh's textfile -> node_exporter ->
Prometheus rule -> Alertmanager -> a local webhook, firing then resolved.
Everything listens on 127.0.0.1 only; readiness is polled, never slept."""
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request

import pytest
import webhook_sink
from conftest import ROOT, app, busy_gpu, free_port, idle_gpu, stop_processes, wait_for

PROMTOOL = shutil.which("promtool")
STACK = [shutil.which(b) for b in ("prometheus", "prometheus-node-exporter", "prometheus-alertmanager")]
need_promtool = pytest.mark.require(PROMTOOL is not None, "promtool (Debian package prometheus) not installed")
need_stack = pytest.mark.require(None not in STACK, "Debian packages prometheus, prometheus-node-exporter, "
                                                    "prometheus-alertmanager not installed")


@need_promtool
def test_rules_pass_promtool_check_and_unit_tests():
    r = subprocess.run([PROMTOOL, "check", "rules", str(ROOT / "etc/prometheus/gpuguard.rules.yml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([PROMTOOL, "test", "rules", "tests/prometheus/gpuguard.rules.test.yml"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


@need_promtool
@pytest.mark.parametrize("fault", [None, "driver"])
def test_idle_textfile_is_valid_and_atomic(box, tmp_path, fault):
    textdir = tmp_path / "textfile"
    steps = [{"gpus": [idle_gpu()], "apps": [app(1410, name='we"ird\\name')]}] * 2
    if fault:
        steps.append({"fault": fault})
    box.write_scenario(steps)
    for t in range(len(steps)):
        box.once(now=t, env={"GPUGUARD_TEXTFILE_DIR": str(textdir)})
    assert os.listdir(textdir) == ["gpuguard_idle.prom"]          # no temp file left behind
    text = (textdir / "gpuguard_idle.prom").read_text()
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    for line in text.splitlines():
        if not line.startswith("#"):
            assert len(line.rsplit(" ", 1)[1].split()) == 1           # no timestamps
    if fault:
        assert "gpuguard_monitor_up 0" in text and "gpuguard_gpu_utilization_ratio" not in text
    else:
        assert 'name="we\\"ird\\\\name"' in text and "gpuguard_gpu_idle_cycles" in text


@need_promtool
def test_shipped_rule_agrees_with_the_watchdog_on_a_free_ascend_npu(box, tmp_path):
    """Bug report 3 #2: the series the watchdog exports for a 910B box, one
    chip free and idle (its firmware's 3.4 GB in use, no process), one held
    by a hidden job (30 GB), fed to the shipped rules for 10 minutes:
    GpuIdleHeld fires for the held chip only, as the watchdog does."""
    from test_npu import two_chip_box
    two_chip_box(box, tmp_path, "empty", "hidden")
    fired = {e["uuid"] for e in box.events() if e["event"] == "gpu_idle"}
    assert fired == {"NPU-1-0"}
    series = []
    for line in (tmp_path / "prom" / "gpuguard_idle.prom").read_text().splitlines():
        if line.startswith("gpuguard_gpu_") and 'uuid="NPU-' in line:
            name, value = line.rsplit(" ", 1)
            series.append({"series": name.replace("{", '{instance="npu-node",', 1), "values": "%sx10" % value})
    assert any(x["series"].startswith("gpuguard_gpu_memory_used_bytes") and x["values"] == "3573547008x10"
               for x in series)
    alert = {"exp_labels": {"severity": "warning", "job": "gpuguard", "instance": "npu-node", "gpu": "1",
                            "uuid": "NPU-1-0", "vendor": "ascend"},
             "exp_annotations": {"summary": "GPU 1 on npu-node is held but idle",
                                 "description": "Utilization 0% while a job holds the GPU. Check the job "
                                                "(stuck data loader? dead NCCL rank?)."}}
    test = tmp_path / "npu.rules.test.yml"
    test.write_text(json.dumps({
        "rule_files": [str(ROOT / "etc/prometheus/gpuguard.rules.yml")], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": [
            {"eval_time": "5m", "alertname": "GpuIdleHeld", "exp_alerts": [alert]}]}]}))
    r = subprocess.run([PROMTOOL, "test", "rules", str(test)], capture_output=True, text=True)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


@need_promtool
def test_leak_textfile_is_valid_and_drops_gone_processes(box, tmp_path):
    from test_leak import Job, leak_scenario, watch_cycles
    textdir = tmp_path / "textfile"
    job = Job(tmp_path)
    try:
        leak_scenario(box, job.child())
        watch_cycles(box, ["--pid", str(job.proc.pid)], 3, env={"GPUGUARD_TEXTFILE_DIR": str(textdir)})
        text = (textdir / ("gpuguard_leak-pid-%d.prom" % job.proc.pid)).read_text()
        assert 'pid="%d"' % job.proc.pid in text
        r = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        job.stop()
    watch_cycles(box, ["--pid", str(job.proc.pid)], 1, env={"GPUGUARD_TEXTFILE_DIR": str(textdir)})
    assert 'pid="%d"' % job.proc.pid not in (textdir / ("gpuguard_leak-pid-%d.prom" % job.proc.pid)).read_text()


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.read().decode()
    except OSError:
        return None


@need_stack
def test_end_to_end_idle_alert_through_the_real_stack(box, tmp_path):
    prometheus, node_exporter, alertmanager = STACK
    d = tmp_path
    (d / "textfile").mkdir()
    ports = {k: free_port() for k in ("node", "prom", "am")}
    server, sink = webhook_sink.serve(quiet=True)
    # The shipped rules, with `for:` shortened from minutes to seconds.
    rules = (ROOT / "etc/prometheus/gpuguard.rules.yml").read_text()
    (d / "rules.yml").write_text(re.sub(r"for: \d+m", "for: 2s", rules))
    (d / "am.yml").write_text(json.dumps({
        "route": {"receiver": "hook", "group_by": ["alertname", "gpu"], "group_wait": "1s",
                  "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "hook", "webhook_configs": [
            {"url": "http://127.0.0.1:%d/hook" % server.server_address[1], "send_resolved": True}]}]}))
    (d / "prom.yml").write_text(json.dumps({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(d / "rules.yml")],
        "alerting": {"alertmanagers": [{"api_version": "v2", "static_configs": [
            {"targets": ["127.0.0.1:%d" % ports["am"]]}]}]},
        "scrape_configs": [{"job_name": "node", "static_configs": [
            {"targets": ["127.0.0.1:%d" % ports["node"]]}]}]}))
    procs = [
        subprocess.Popen([node_exporter, "--collector.disable-defaults", "--collector.textfile",
                          "--collector.textfile.directory=%s" % (d / "textfile"),
                          "--web.listen-address=127.0.0.1:%d" % ports["node"]],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen([alertmanager, "--config.file=%s" % (d / "am.yml"), "--storage.path=%s" % (d / "am"),
                          "--web.listen-address=127.0.0.1:%d" % ports["am"], "--cluster.listen-address=",
                          "--web.external-url=http://127.0.0.1:%d" % ports["am"]],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen([prometheus, "--config.file=%s" % (d / "prom.yml"), "--storage.tsdb.path=%s" % (d / "tsdb"),
                          "--web.listen-address=127.0.0.1:%d" % ports["prom"],
                          "--web.external-url=http://127.0.0.1:%d" % ports["prom"]],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    ]
    try:
        assert wait_for(lambda: get("http://127.0.0.1:%d/-/ready" % ports["prom"]) is not None, timeout=30)
        assert wait_for(lambda: get("http://127.0.0.1:%d/-/ready" % ports["am"]) is not None, timeout=30)
        # the watchdog, as cron runs it, writes the textfile
        box.write_scenario([{"gpus": [idle_gpu()], "apps": [app(1410)]}] * 3 + [{"gpus": [busy_gpu()], "apps": [app(1410)]}])
        env = {"GPUGUARD_TEXTFILE_DIR": str(d / "textfile")}
        for t in range(3):
            box.once(now=t, env=env)

        def status_of(state):
            return [a for r in sink.requests for a in r["body"].get("alerts", [])
                    if a["labels"].get("alertname") == "GpuIdleHeld" and a["status"] == state]

        assert wait_for(lambda: status_of("firing"), timeout=90), "no firing webhook"
        firing = status_of("firing")[0]
        assert firing["labels"]["gpu"] == "0" and firing["labels"]["uuid"].startswith("GPU-")
        metrics = get("http://127.0.0.1:%d/metrics" % ports["node"])
        assert "node_textfile_scrape_error 0" in metrics
        box.once(now=3, env=env)                                     # busy again
        assert wait_for(lambda: status_of("resolved"), timeout=90), "no resolved webhook"
    finally:
        stop_processes(procs)
        server.shutdown()


def am_alerts(port):
    text = get("http://127.0.0.1:%d/api/v2/alerts?silenced=true&inhibited=true&active=true" % port)
    return json.loads(text) if text else []


def test_alertmanager_silence_from_the_rules_labels_holds_for_gpuguards_own_alerts(box, tmp_path):
    """Issue 13 point 6 on the real stack: the shipped rule's alert and the
    one gpuguard pushes (ALERTMANAGER_URL) carry the same name and labels,
    so Alertmanager holds ONE alert per GPU, a silence written from the
    rule's labels silences gpuguard's, and gpuguard's resolved event ends
    it (endsAt) with Prometheus gone."""
    from conftest import require
    prometheus, node_exporter, alertmanager = STACK
    require(None not in STACK, "Debian packages prometheus, prometheus-node-exporter, prometheus-alertmanager")
    d = tmp_path
    (d / "textfile").mkdir()
    ports = {k: free_port() for k in ("node", "prom", "am")}
    server, sink = webhook_sink.serve(quiet=True)
    rules = (ROOT / "etc/prometheus/gpuguard.rules.yml").read_text()
    (d / "rules.yml").write_text(re.sub(r"for: \d+m", "for: 1s", rules))
    (d / "am.yml").write_text(json.dumps({
        "route": {"receiver": "hook", "group_by": ["..."], "group_wait": "1s",
                  "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "hook", "webhook_configs": [
            {"url": "http://127.0.0.1:%d/hook" % server.server_address[1], "send_resolved": True}]}]}))
    # scraped as localhost:PORT: the rule's instance becomes "localhost"
    (d / "prom.yml").write_text(json.dumps({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(d / "rules.yml")],
        "alerting": {"alertmanagers": [{"api_version": "v2", "static_configs": [
            {"targets": ["127.0.0.1:%d" % ports["am"]]}]}]},
        "scrape_configs": [{"job_name": "node", "static_configs": [
            {"targets": ["localhost:%d" % ports["node"]]}]}]}))
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = {
        "node": subprocess.Popen([node_exporter, "--collector.disable-defaults", "--collector.textfile",
                                  "--collector.textfile.directory=%s" % (d / "textfile"),
                                  "--web.listen-address=127.0.0.1:%d" % ports["node"]], **quiet),
        "am": subprocess.Popen([alertmanager, "--config.file=%s" % (d / "am.yml"), "--storage.path=%s" % (d / "am"),
                                "--web.listen-address=127.0.0.1:%d" % ports["am"], "--cluster.listen-address=",
                                "--web.external-url=http://127.0.0.1:%d" % ports["am"]], **quiet),
        "prom": subprocess.Popen([prometheus, "--config.file=%s" % (d / "prom.yml"),
                                  "--storage.tsdb.path=%s" % (d / "tsdb"),
                                  "--web.listen-address=127.0.0.1:%d" % ports["prom"]], **quiet),
    }
    am_url = "http://127.0.0.1:%d" % ports["am"]
    try:
        assert wait_for(lambda: get(am_url + "/-/ready") is not None, timeout=30)
        assert wait_for(lambda: get("http://127.0.0.1:%d/-/ready" % ports["prom"]) is not None, timeout=30)
        # two GPUs held and idle; Alertmanager is unreachable for gpuguard at
        # first, so its events wait in the outbox
        idle = {"gpus": [idle_gpu(), idle_gpu()], "apps": [app(1410, gpu=0), app(1411, gpu=1)]}
        busy = {"gpus": [busy_gpu(), busy_gpu()], "apps": [app(1410, gpu=0), app(1411, gpu=1)]}
        box.write_scenario([idle] * 3 + [busy], gpus=2)
        env = {"GPUGUARD_TEXTFILE_DIR": str(d / "textfile"), "GPUGUARD_HOST": "localhost",
               "ALERTMANAGER_URL": "http://127.0.0.1:%d" % free_port(), "NOTIFY_RETRIES": "0"}
        for t in range(3):
            box.once(now=t, env=env)
        assert len(list((box.state / "outbox").glob("*.json"))) == 2

        def rule_alerts():
            return [a for a in am_alerts(ports["am"]) if a["labels"].get("alertname") == "GpuIdleHeld"]

        assert wait_for(lambda: len(rule_alerts()) == 2, timeout=90), "the rule did not fire for both GPUs"
        rule_labels = {a["labels"]["gpu"]: a["labels"] for a in rule_alerts()}
        assert rule_labels["0"]["instance"] == "localhost" and rule_labels["0"]["job"] == "gpuguard"
        # a silence written from the rule's labels, every one of them
        now = time.time()
        silence = {"matchers": [{"name": k, "value": v, "isRegex": False, "isEqual": True}
                                for k, v in rule_labels["0"].items()],
                   "startsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 5)),
                   "endsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + 3600)),
                   "createdBy": "test", "comment": "GPU 0 under maintenance"}
        req = urllib.request.Request(am_url + "/api/v2/silences", data=json.dumps(silence).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            silence_id = json.loads(r.read())["silenceID"]
        # gpuguard delivers its own alerts, as a user would flush them
        r = box.run("notify", "--flush", env=dict(env, ALERTMANAGER_URL=am_url), cmd="bin/gpuguard")
        assert r.returncode == 0, r.stderr
        assert not list((box.state / "outbox").glob("*.json"))
        pushed = [a for a in am_alerts(ports["am"]) if a["labels"].get("alertname") == "GpuIdleHeld"]
        # same labels: Alertmanager merged them, one alert per GPU, not two
        assert sorted(a["labels"]["gpu"] for a in pushed) == ["0", "1"]
        assert any("held by" in a["annotations"].get("description", "") for a in pushed), \
            "gpuguard's push did not reach the same alerts"
        gpu0 = next(a for a in pushed if a["labels"]["gpu"] == "0")
        assert gpu0["status"]["state"] == "suppressed" and gpu0["status"]["silencedBy"] == [silence_id]
        gpu1 = next(a for a in pushed if a["labels"]["gpu"] == "1")
        assert gpu1["status"]["state"] == "active"
        # Prometheus gone: only gpuguard's resolved event (endsAt) ends GPU 1
        procs["prom"].terminate()
        procs["prom"].wait(timeout=20)
        box.once(now=3, env=dict(env, ALERTMANAGER_URL=am_url))

        def resolved_hooks(gpu):
            return [a for rq in sink.requests for a in rq["body"].get("alerts", [])
                    if a["labels"].get("gpu") == gpu and a["status"] == "resolved"]

        assert wait_for(lambda: resolved_hooks("1"), timeout=30), "no resolved notification for GPU 1"
        assert resolved_hooks("1")[0]["endsAt"] <= time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 1))
        assert not resolved_hooks("0")                               # silenced
    finally:
        stop_processes(procs.values())
        server.shutdown()


def test_a_textfile_folder_the_user_cannot_write_is_said_once_with_its_cause(box, tmp_path):
    """A fleet config names node_exporter's folder (root's) for every user:
    a user's wrapped job said "cannot write ... (disk full?)" at ERROR, then
    "could not write textfile metrics" every cycle for the whole job. Now
    one line at its start names the cause (not writable by this uid) and
    the rest is quiet; the watchdog's cron runs say it once across runs."""
    from conftest import require
    require(os.geteuid() == 0, "needs root to drop to another user")
    import tempfile
    base = tempfile.mkdtemp(prefix="gpuguard-textfile-")
    try:
        os.chmod(base, 0o777)
        textdir = os.path.join(base, "textfile")
        os.mkdir(textdir, 0o755)                      # node_exporter's folder: root's
        scenario = os.path.join(base, "scenario.json")
        with open(scenario, "w") as f:
            json.dump({"gpus": [{"index": 0, "uuid": "GPU-0", "name": "NVIDIA H200", "memory.total": 143771}],
                       "steps": [{"gpus": [idle_gpu()], "apps": []}]}, f)
        os.chmod(scenario, 0o644)
        env = dict(box.env, GPUGUARD_STATE_DIR=os.path.join(base, "state"), HOME=base, FAKE_SMI_SCENARIO=scenario,
                   FAKE_SMI_STATE=os.path.join(base, "step"), FAKE_SMI_LOG="", GPUGUARD_TEXTFILE_DIR=textdir)

        def as_nobody(cmd, *args):
            return subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                                   str(ROOT / "bin" / cmd), *args], env=env, capture_output=True, text=True,
                                  timeout=60, cwd=base)
        said = "textfile folder %s is not writable by this user (uid 65534): no metrics from this" % textdir
        r = as_nobody("gpu-leak-watch", "--interval", "1", "--", "sleep", "3.5")
        assert r.returncode == 0, r.stderr
        assert r.stderr.count(said + " watcher") == 1, r.stderr
        assert "disk full" not in r.stderr and "could not write textfile" not in r.stderr, r.stderr
        log = ""
        for _ in range(3):
            r = as_nobody("yichuidingyin.sh", "--once")
            assert r.returncode == 0, r.stderr
            log += r.stderr
        assert log.count(said + " watchdog") == 1, log
        assert "disk full" not in log and "could not write textfile" not in log, log
        assert os.listdir(textdir) == []
    finally:
        shutil.rmtree(base)
