"""The Grafana dashboard (etc/grafana/gpuguard-dashboard.json): every
panel's, variable's and annotation's PromQL runs against a real Prometheus
(127.0.0.1, temporary config, the shipped rules) scraping a real
node_exporter whose textfile folder the watchdog (against the nvidia-smi
double) and the leak watcher's textfile writer filled, and must return
data. Variables take their "All" value."""
import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request

import pytest
from conftest import ROOT, app, free_port, idle_gpu, require, stop_processes, wait_for

DASHBOARD = ROOT / "etc" / "grafana" / "gpuguard-dashboard.json"


def load():
    return json.loads(DASHBOARD.read_text())


def queries(dash):
    """(where, PromQL) for every query the dashboard runs."""
    out = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            out.append(("panel %r %s" % (p["title"], t["refId"]), t["expr"]))
    for a in dash["annotations"]["list"]:
        if a.get("expr"):
            out.append(("annotation %r" % a["name"], a["expr"]))
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+), *(\w+)\)", v["query"]["query"])
            assert m, v["query"]
            out.append(("variable %r" % v["name"], "count by (%s) (%s)" % (m.group(2), m.group(1))))
    return out


def test_dashboard_is_well_formed():
    dash = load()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    names = {v["name"] for v in dash["templating"]["list"]}
    assert names == {"datasource", "instance", "gpu"}
    for p in dash["panels"]:
        assert set(p["gridPos"]) == {"x", "y", "w", "h"} and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"} and p["targets"], p["title"]
        for t in p["targets"]:
            assert "$instance" in t["expr"], (p["title"], t["expr"])     # every panel follows the node picker
    assert any(a.get("expr", "").startswith("ALERTS{") for a in dash["annotations"]["list"])
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for topic in ("idle", "floor", "slope", "monitor", "alerts", "severity", "oom", "stuck", "fault"):
        assert topic in titles
    # the detector's verdict and the watchdog's spin/fault state are on the
    # dashboard (and so, below, must return data)
    exprs = " ".join(e for _, e in queries(dash))
    for metric in ("gpuguard_process_leak_severity", "gpuguard_process_leak_projected_oom_seconds",
                   "gpuguard_gpu_stuck", "gpuguard_gpu_fault"):
        assert re.search(r"\b%s\{" % metric, exprs), metric


def test_every_query_is_valid_promql():
    promtool = shutil.which("promtool")
    require(promtool is not None, "promtool not installed (Debian package prometheus)")
    exprs = [e for _, e in queries(load())]
    rules = {"groups": [{"name": "dash", "rules": [
        {"record": "dash:q%d" % i, "expr": re.sub(r"\$\w+", ".*", e)} for i, e in enumerate(exprs)]}]}
    r = subprocess.run([promtool, "check", "rules", "/dev/stdin"], input=json.dumps(rules), capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.read().decode()
    except OSError:
        return None


def instant(port, expr):
    body = get("http://127.0.0.1:%d/api/v1/query?%s" % (port, urllib.parse.urlencode({"query": expr})))
    if body is None:
        return None
    doc = json.loads(body)
    return doc["data"]["result"] if doc.get("status") == "success" else None


def write_leak_textfile(textdir):
    """The leak watcher's textfile writer, as its cycle calls it: LEAK_STATUS
    holds what leak_run_detector keeps of the detector's status lines
    (status ROOT_PID SLOPE FIRING USED SEVERITY OOM_S NAME, tab-separated):
    by PID, the fields after it. 1328 leaks, critical, OOM in 2 h 39 min;
    1329 is flat (no OOM time)."""
    script = ("source lib/common.sh; source lib/textfile.sh; declare -A LEAK_STATUS=("
              "[1328]=$'31890.0\\t1\\t58634\\tcritical\\t9540\\tpython3' "
              "[1329]=$'0.0\\t0\\t956\\tnone\\t-\\tpython3'); textfile_write_leak")
    env = {"PATH": "/usr/bin:/bin", "GPUGUARD_TEXTFILE_DIR": str(textdir), "LEAK_INSTANCE": "all"}
    r = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_panel_query_returns_data_from_real_prometheus(box, tmp_path):
    stack = [shutil.which(b) for b in ("prometheus", "prometheus-node-exporter")]
    require(None not in stack, "Debian packages prometheus and prometheus-node-exporter not installed")
    prometheus, node_exporter = stack
    d = tmp_path
    textdir = d / "textfile"
    textdir.mkdir()
    ports = {k: free_port() for k in ("node", "prom")}
    rules = (ROOT / "etc/prometheus/gpuguard.rules.yml").read_text()
    (d / "rules.yml").write_text(re.sub(r"for: \d+m", "for: 1s", rules))
    (d / "prom.yml").write_text(json.dumps({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(d / "rules.yml")],
        "scrape_configs": [{"job_name": "node", "static_configs": [
            {"targets": ["127.0.0.1:%d" % ports["node"]]}]}]}))
    # the watchdog, as cron runs it: three idle cycles with a holder fire the idle alert
    box.write_scenario([{"gpus": [idle_gpu(), idle_gpu(util=97, power=650.0)],
                         "apps": [app(1328, gpu=0, mem=58634), app(1329, gpu=1, mem=956)]}] * 3, gpus=2)
    for t in range(3):
        box.once(now=1796220302 + 60 * t, env={"GPUGUARD_TEXTFILE_DIR": str(textdir)})
    write_leak_textfile(textdir)
    assert sorted(p.name for p in textdir.iterdir()) == ["gpuguard_idle.prom", "gpuguard_leak-all.prom"]
    procs = [
        subprocess.Popen([node_exporter, "--collector.disable-defaults", "--collector.textfile",
                          "--collector.textfile.directory=%s" % textdir,
                          "--web.listen-address=127.0.0.1:%d" % ports["node"]],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen([prometheus, "--config.file=%s" % (d / "prom.yml"), "--storage.tsdb.path=%s" % (d / "tsdb"),
                          "--web.listen-address=127.0.0.1:%d" % ports["prom"]],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    ]
    try:
        assert wait_for(lambda: get("http://127.0.0.1:%d/-/ready" % ports["prom"]) is not None, timeout=60)
        missing = {}
        for where, expr in queries(load()):
            q = re.sub(r"\$(instance|gpu)\b", ".*", expr)
            if not wait_for(lambda q=q: bool(instant(ports["prom"], q)), timeout=60, step=0.5):
                missing[where] = q
        assert missing == {}, "queries without data: %s" % json.dumps(missing, indent=1)
        # the annotation query sees both kinds of alert (GpuIdleHeld after
        # its 'for', which the queries above need not have waited out)
        def firing():
            return {r["metric"]["alertname"] for r in instant(ports["prom"], 'ALERTS{alertstate="firing"}') or []}

        wait_for(lambda: {"GpuIdleHeld", "GpuMemoryLeak"} <= firing(), timeout=60, step=0.5)
        assert {"GpuIdleHeld", "GpuMemoryLeak"} <= firing()

        def by_pid(metric):
            return {r["metric"]["pid"]: float(r["value"][1]) for r in instant(ports["prom"], metric)}

        # the leak table carries the verdict, severity, slope and time to OOM by pid
        assert by_pid("gpuguard_process_leak_slope_mib_per_hour") == {"1328": pytest.approx(31890.0), "1329": 0.0}
        assert by_pid("gpuguard_process_leak") == {"1328": 1.0, "1329": 0.0}
        assert by_pid("gpuguard_process_leak_severity") == {"1328": 3.0, "1329": 0.0}
        assert by_pid("gpuguard_process_leak_projected_oom_seconds") == {"1328": 9540.0}
        # the stuck/fault timeline has a state for each GPU
        for metric in ("gpuguard_gpu_stuck", "gpuguard_gpu_fault"):
            assert sorted(r["metric"]["gpu"] for r in instant(ports["prom"], metric)) == ["0", "1"]
    finally:
        stop_processes(procs)
