"""The fault-injection suite (issue 14): shared pieces and the summary table.

Each test records its measured figures with `record(row, measured, goal_met)`;
test_faults_zz_summary.py (collected last) registers a terminal-summary
plugin, so the issue's table with the measured figures ends pytest's output;
it is also written to $GG_FAULTS_REPORT (markdown) when that is set. (No
conftest.py here: a second conftest module would shadow tests/conftest.py.)
GG_FAULTS_LONG=1 (make test-faults) runs the long version: ~770 nvidia-smi
fault cycles, 1000 cycles with 390 kills, the full 24 h churn.
"""
import json
import os
import subprocess
from pathlib import Path

from conftest import FAKEBIN, ROOT, gpu_list, wait_for

LONG = os.environ.get("GG_FAULTS_LONG") == "1"

# row -> (what the issue measured before, goal); filled in by the tests
ROWS = [
    ("smi", "33 kinds of nvidia-smi faults over ~770 cycles",
     "0 crashes, 2 false idle alerts, 7 false resolved, 4 kinds raise no event",
     "0 false alerts, 0 false resolved, each persistent fault one monitor degraded event"),
    ("hang", "nvidia-smi hangs with a setsid child holding stdout, SMI_TIMEOUT=2", "30 s",
     "every call <= SMI_TIMEOUT + 1 s"),
    ("device", "[GPU requires reset], [Unknown Error]", "read as MIG [N/A]",
     "a critical GPU degraded event naming the GPU"),
    ("apps", "one failed process-list call during an idle incident", "incident resolved",
     "nothing changes until a good reading"),
    ("kill", "kill -9 of the daemon at random points", "30-67 duplicates/200 cycles, 30 never resolved, 1 missed",
     "0 missed, 0 never resolved, <= 1 duplicate per kill between a send and its record"),
    ("flush", "two flushes at once (daemon + cron + manual)", "40/40 delivered twice", "0 duplicates"),
    ("diskfull", "disk full", "daemon exits, alert lost",
     "keeps watching, one log line, catches up, no corrupted state"),
    ("symlink", "symlink planted at a temp or state path", "3/3 succeed", "0/3"),
    ("secrets", "secrets in children, state files, errors", "exported to nvidia-smi and the job; raw URLs; traceback",
     "only the sender has them; masked; one line"),
    ("disk", "disk use, 64 processes churning for 24 h", "35,568 files / 141 MB in 15 min",
     "<= 50 MB and <= 2,000 files"),
    ("sighup", "SIGHUP", "daemon stops silently", "reloads and says so; TERM/INT one log line"),
    ("config", "config path that is a folder; a file with a BOM", "unbound variable; misread",
     "one clear line, exit 2; BOM ignored"),
    ("badurl", "a malformed first target (http://[::1) before a good one, 3 cron cycles",
     "0 alerts to the good one, 9 tracebacks", "the good one gets its alert; the bad one named in 1 log line"),
    ("fuzz", "hostile values (brackets, spaces, control characters, unicode, 50 KB, secrets) in every key "
     "that reaches Python", "tracebacks, exit 1", "one-line errors, exit 0/1/2, no secret shown"),
    ("locklink", "a symlink planted at each lock, pointing at a missing file", "root creates the file",
     "0/4 followed, each refused in one line"),
    ("cronprune", "200 short-lived series, 8 days past RETENTION_DAYS=7, gpu-leak-watch --all --once",
     "201 -> 201 files", "pruned to the recent ones"),
]
RESULTS = {}


def record(row, measured, ok):
    """Keeps a row's measured figure for the summary table."""
    RESULTS[row] = (measured, ok)


def table_lines():
    lines = ["| fault | before (issue) | goal | measured here | goal met |", "|---|---|---|---|---|"]
    for key, fault, before, goal in ROWS:
        if key in RESULTS:
            measured, ok = RESULTS[key]
            lines.append("| %s | %s | %s | %s | %s |" % (fault, before, goal, measured, "yes" if ok else "NO"))
    return lines


class SummaryPlugin:
    """Prints the table at the end of pytest's output."""

    def pytest_terminal_summary(self, terminalreporter):
        if not RESULTS:
            return
        lines = table_lines()
        terminalreporter.section("gpuguard fault-injection figures (%s run)" % ("long" if LONG else "CI"))
        for line in lines:
            terminalreporter.write_line(line)
        out = os.environ.get("GG_FAULTS_REPORT")
        if out:
            Path(out).write_text("\n".join(lines) + "\n")


def scenario_file(path, steps, gpus=2):
    path.write_text(json.dumps({"gpus": gpu_list(gpus), "steps": steps}))


def base_env(tmp_path, scenario, **extra):
    """The environment of a user running gpuguard against the double."""
    (tmp_path / "home").mkdir(exist_ok=True)
    env = {
        "PATH": "%s:%s" % (FAKEBIN, os.environ.get("PATH", "/usr/bin:/bin")),
        "HOME": str(tmp_path / "home"),
        "LANG": "C.UTF-8",
        "GPUGUARD_CONFIG": "/dev/null",
        "GPUGUARD_STATE_DIR": str(tmp_path / "state"),
        "FAKE_SMI_SCENARIO": str(scenario),
        "FAKE_SMI_STATE": str(tmp_path / "smi-step"),
        "FAKE_SMI_CHILDREN": str(tmp_path / "smi-children"),
        "SMI_TIMEOUT": "1",
        "SMI_FAIL_ALERT_CYCLES": "3",
        "MAX_IDLE_CYCLES": "3",
        "REPEAT_INTERVAL": "0",
        "CHECK_INTERVAL": "1",
    }
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_once(env, now, timeout=60):
    e = dict(env, GPUGUARD_NOW=str(now))
    return subprocess.run([str(ROOT / "bin/yichuidingyin.sh"), "--once"], env=e, text=True,
                          capture_output=True, timeout=timeout, errors="replace")


def kill_recorded_children(env):
    """Ends the setsid children the double started (by their PIDs)."""
    path = Path(env["FAKE_SMI_CHILDREN"])
    if not path.exists():
        return
    for line in path.read_text().split():
        try:
            os.kill(int(line), 9)
        except (OSError, ValueError):
            pass
    path.unlink()


def events_of(state_dir):
    path = Path(state_dir) / "events.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append({"event": "CORRUPT", "line": line})
    return out


def delivered_events(requests):
    """The events a generic receiver got: one per body or a digest list."""
    out = []
    for r in requests:
        body = r.get("body")
        if isinstance(body, dict) and isinstance(body.get("events"), list):
            out.extend(body["events"])
        elif isinstance(body, dict):
            out.append(body)
    return out


def wait_until(pred, timeout=20.0, step=0.05):
    """conftest's wait_for with the fault suite's longer default."""
    return wait_for(pred, timeout, step)

