"""Fleet: the textfile metrics, the shipped rules under promtool, and the
real stack end to end - yichuidingyin.sh's textfile -> node_exporter ->
Prometheus rule -> Alertmanager -> a local webhook, firing then resolved.
Everything listens on 127.0.0.1 only; readiness is polled, never slept."""
import json
import os
import re
import shutil
import subprocess
import urllib.request

import pytest

import webhook_sink
from conftest import free_port, ROOT, app, busy_gpu, idle_gpu, wait_for

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
def test_leak_textfile_is_valid_and_drops_gone_processes(box, tmp_path):
    from test_leak import Job, leak_scenario, watch_cycles
    textdir = tmp_path / "textfile"
    job = Job(tmp_path)
    try:
        leak_scenario(box, job.child())
        watch_cycles(box, ["--pid", str(job.proc.pid)], 3, env={"GPUGUARD_TEXTFILE_DIR": str(textdir)})
        text = (textdir / "gpuguard_leak.prom").read_text()
        assert 'pid="%d"' % job.proc.pid in text
        r = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        job.stop()
    watch_cycles(box, ["--pid", str(job.proc.pid)], 1, env={"GPUGUARD_TEXTFILE_DIR": str(textdir)})
    assert 'pid="%d"' % job.proc.pid not in (textdir / "gpuguard_leak.prom").read_text()


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
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        server.shutdown()
