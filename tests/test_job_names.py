"""Every view names the job (issue 24): three training jobs started as a user
starts them (`python3 train.py --run-name NAME ...`, each in its own session,
holding a stand-in GPU device file open like a CUDA process) run under the
idle watchdog and the leak watcher, cron-style and as daemons. The report
(also in headless Chromium), `status`, `status --json`, `status --watch` in
tmux and the leak alert's digest name each job by its command line, while it
runs and, for the report, after it ended; a PID the watcher cannot see stays
a PID, marked as such."""
import getpass
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys

import cdp
import pytest
from conftest import ROOT, gpu_list, idle_gpu, require, start_daemon, stop_daemon, wait_for

sys.path.insert(0, str(ROOT / "python"))
import gpuguard_render

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

TRAIN = "import os, time\nf = open(os.environ['GG_TEST_DEVICE'])\nprint('ready', flush=True)\ntime.sleep(600)\n"
NAMES = {"leak": "leaky-llama-7b", "warm": "warmup-qwen-14b", "idle": "idle-mistral-7b"}
HIDDEN = 3999999                # a PID nvidia-smi lists that this namespace has no process for
T0 = 1796206508


class Jobs:
    """The three jobs: `python3 train.py --run-name NAME --api-key SECRET`
    started from a runs folder, each in its own session."""

    def __init__(self, tmp):
        self.dev = tmp / "nvidia0"
        self.dev.touch()
        runs = tmp / "runs"
        runs.mkdir()
        (runs / "train.py").write_text(TRAIN)
        self.procs = {}
        for role, name in NAMES.items():
            p = subprocess.Popen(["python3", "train.py", "--run-name", name, "--api-key", "SEKRIT-" + role,
                                  "--lr", "3e-4"], cwd=runs, env=dict(os.environ, GG_TEST_DEVICE=str(self.dev)),
                                 stdout=subprocess.PIPE, text=True, start_new_session=True)
            assert p.stdout.readline() == "ready\n"
            self.procs[role] = p
        self.pid = {role: p.pid for role, p in self.procs.items()}

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@pytest.fixture
def jobs(tmp_path):
    j = Jobs(tmp_path)
    yield j
    j.stop()


@pytest.fixture
def nbox(box, tmp_path):
    box.env["JOBINFO_DEVICE_GLOB"] = str(tmp_path / "nvidia*")
    return box


def scenario(box, jobs, steps=30):
    """GPU 0: the leaking job (64 MiB a cycle); GPU 1: a warm-up that
    levels off, and a process of another PID namespace; GPU 2: a job that
    holds its GPU idle (0 %, 76 W)."""
    out = []
    for i in range(steps):
        leak = 3000 + 64 * i
        warm = min(20000, 6000 + 5000 * i)
        out.append({"gpus": [{"utilization.gpu": 90, "memory.used": leak + 500, "power.draw": 520.0},
                             {"utilization.gpu": 95, "memory.used": warm + 1500, "power.draw": 610.0},
                             {"utilization.gpu": 0, "memory.used": 30500, "power.draw": 76.6}],
                    "apps": [{"pid": jobs.pid["leak"], "process_name": "python3", "used_memory": leak, "gpu": 0},
                             {"pid": jobs.pid["warm"], "process_name": "python3", "used_memory": warm, "gpu": 1},
                             {"pid": HIDDEN, "process_name": "python3", "used_memory": 1000, "gpu": 1},
                             {"pid": jobs.pid["idle"], "process_name": "python3", "used_memory": 30000, "gpu": 2}]})
    box.scenario.write_text(json.dumps({"gpus": gpu_list(3), "steps": out}))


def cron_cycles(box, n, start=0):
    """The watchers as cron runs them: one --once of each per minute (each
    with its own place in the nvidia-smi double's scenario)."""
    for i in range(start, start + n):
        now = str(T0 + 60 * i)
        r = box.run("--once", env={"GPUGUARD_NOW": now, "FAKE_SMI_STATE": str(box.tmp / "smi-idle")})
        assert r.returncode == 0, r.stderr
        r = box.run("--all", "--once", "--bucket", "60", cmd="bin/gpu-leak-watch",
                    env={"GPUGUARD_NOW": now, "FAKE_SMI_STATE": str(box.tmp / "smi-leak")})
        assert r.returncode == 0, r.stderr


def report(box, *args):
    out = box.tmp / "report.html"
    r = box.run("report", "--out", str(out), *args, cmd="bin/gpuguard", env={"TZ": "UTC"})
    assert r.returncode == 0, r.stderr
    return out.read_text(), r


def summary_rows(text):
    table = re.search(r"<table id='summary-table'>(.*?)</table>", text, re.DOTALL).group(1)
    return re.findall(r"<tr class='row-[^']*'>(.*?)</tr>", table, re.DOTALL)


def row_naming(rows, name):
    (row,) = [r for r in rows if name in r]
    return row


def assert_no_secret(box):
    for path in box.state.rglob("*"):
        if path.is_file():
            assert b"SEKRIT" not in path.read_bytes(), path


@pytest.mark.slow
def test_cron_watchers_name_every_job_in_alerts_status_and_report(nbox, jobs, tmp_path):
    scenario(nbox, jobs)
    cron_cycles(nbox, 30)
    # the leak watcher kept each series' identity once, beside its history
    ids = {p.name: json.loads(p.read_text()) for p in (nbox.state / "history").glob("*.job.json")}
    by_pid = {j["pid"]: j for j in ids.values()}
    for role, name in NAMES.items():
        j = by_pid[jobs.pid[role]]
        # (the program as exec'd: python3 may be a shim that runs another)
        assert re.fullmatch(r"(\S*/)?python3 train.py --run-name %s --api-key \*\*\* --lr 3e-4" % name, j["cmdline"])
        assert j["user"] == getpass.getuser() and j["cwd"].endswith("/runs") and j["visible"] is True
    assert by_pid[HIDDEN]["visible"] is False and by_pid[HIDDEN]["cmdline"] is None
    assert all(path.stat().st_size < 2048 for path in (nbox.state / "history").glob("*.job.json"))

    # the leak alert carries the job as the idle alert does; the digest names it
    events = nbox.events()
    (leak,) = [e for e in events if e["event"] == "gpu_memory_leak"]
    (idle,) = [e for e in events if e["event"] == "gpu_idle"]
    assert leak["pid"] == jobs.pid["leak"] and NAMES["leak"] in leak["job"]["cmdline"]
    assert NAMES["idle"] in idle["job"]["cmdline"]
    title, sections = gpuguard_render.render_digest([leak], "en", {})
    text = "\n".join([title, sections[0][0]] + sections[0][1])
    # the subject names the job as an idle digest does (its command line,
    # cut), the details give it whole and say whose it is
    assert gpuguard_render._job_label([leak], "en", {}) in title and "python3 train.py --run-n" in title, title
    assert "python3 train.py --run-name %s --api-key *** --lr 3e-4" % NAMES["leak"] in text, text
    assert getpass.getuser() in text and "SEKRIT" not in text

    # status, table and JSON: every holder's job, user, counters and verdicts
    doc = json.loads(nbox.run("status", "--json", cmd="bin/gpuguard").stdout)
    procs = {p["pid"]: (g, p) for g in doc["gpus"] for p in g["processes"]}
    for role, name in NAMES.items():
        _, p = procs[jobs.pid[role]]
        assert name in p["cmdline"] and name in p["job"] and "SEKRIT" not in p["cmdline"]
        assert p["user"] == getpass.getuser() and p["visible"] is True and p["job_pid"] == jobs.pid[role]
    assert procs[jobs.pid["leak"]][1]["leak"]["verdict"] == "LEAK"
    assert procs[jobs.pid["leak"]][1]["leak"]["slope_mib_per_hour"] > 1000
    assert procs[jobs.pid["warm"]][1]["leak"]["verdict"] != "LEAK"
    assert procs[HIDDEN][1]["visible"] is False and "not visible" in procs[HIDDEN][1]["job"]
    idle_gpu = procs[jobs.pid["idle"]][0]
    assert idle_gpu["idle_firing"] is True and idle_gpu["idle_limit"] == 3 and idle_gpu["idle_cycles"] >= 3
    assert idle_gpu["stuck_cycles"] == 0 and idle_gpu["stuck_limit"] == 5
    table = nbox.run("status", cmd="bin/gpuguard").stdout
    for role, name in NAMES.items():
        line = next((x for x in table.splitlines() if "pid %d " % jobs.pid[role] in x), table)
        assert "python3 train.py --run-name %s" % name in line and "(%s)" % getpass.getuser() in line
    assert re.search(r"^2 .* idle \d+/3 +stuck 0/5 +IDLE", table, re.MULTILINE), table
    assert re.search(r"pid %d .*LEAK \+\d+ MiB/h" % jobs.pid["leak"], table), table
    assert re.search(r"pid %d .* python3 \(not visible here\)" % HIDDEN, table), table

    # the report, while the jobs run and after they ended
    text, _ = report(nbox)
    for name in NAMES.values():
        row = row_naming(summary_rows(text), name)
        assert "python3 train.py --run-name %s --api-key ***" % name in row
        assert re.search(r"title='(\S*/)?python3 train.py --run-name %s --api-key \*\*\* --lr 3e-4 · in [^']*/runs" % name,
                         row), row
    hidden = row_naming(summary_rows(text), "pid %d" % HIDDEN)
    assert "another PID namespace" in hidden
    jobs.stop()
    # the jobs ended: nvidia-smi lists no process any more
    nbox.scenario.write_text(json.dumps({"gpus": gpu_list(3), "steps": [{
        "gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}] * 3, "apps": []}]}))
    cron_cycles(nbox, 1, start=30)
    text, _ = report(nbox)
    rows = summary_rows(text)
    assert len(rows) == 4
    for name in NAMES.values():
        row_naming(rows, "--run-name " + name)
    # status names what just ended too (the leak watcher's record of it)
    now = {"GPUGUARD_NOW": str(T0 + 60 * 31)}
    doc = json.loads(nbox.run("status", "--json", cmd="bin/gpuguard", env=now).stdout)
    assert all(g["processes"] == [] for g in doc["gpus"])
    ended = {e["pid"]: e for e in doc["ended_jobs"]}
    for role, name in NAMES.items():
        e = ended[jobs.pid[role]]
        assert name in e["job"] and name in e["cmdline"] and e["user"] == getpass.getuser()
        assert e["last_seen_ts"] == T0 + 60 * 29
    assert ended[HIDDEN]["cmdline"] is None
    table = nbox.run("status", cmd="bin/gpuguard", env=now).stdout
    assert "ended in the last hour" in table
    for role, name in NAMES.items():
        assert re.search(r"pid %d +python3 train.py --run-name %s .*\(%s\) +last seen 2 min ago"
                         % (jobs.pid[role], name, getpass.getuser()), table), table
    assert_no_secret(nbox)


@pytest.mark.slow
def test_report_filters_keep_the_right_job(nbox, jobs):
    scenario(nbox, jobs)
    cron_cycles(nbox, 12)
    text, _ = report(nbox, "--pid", str(jobs.pid["warm"]))
    rows = summary_rows(text)
    assert len(rows) == 1 and NAMES["warm"] in rows[0]
    text, _ = report(nbox, "--gpu", "2")
    rows = summary_rows(text)
    assert len(rows) == 1 and NAMES["idle"] in rows[0]
    uuid = gpu_list(3)[0]["uuid"]
    text, _ = report(nbox, "--gpu", uuid)
    rows = summary_rows(text)
    assert len(rows) == 1 and NAMES["leak"] in rows[0]
    # the last 5 minutes of the 11 recorded: each job still named, fewer samples
    text, _ = report(nbox, "--since", str(T0 + 60 * 6))
    assert all(n in text for n in NAMES.values()) and re.search(r"\b\d samples over", text)
    # a value that matches nothing says so in one line
    _, r = report(nbox, "--pid", "999999")
    assert r.stderr == "gpuguard: --pid 999999 matches no process in the history\n"
    _, r = report(nbox, "--gpu", "7")
    assert r.stderr == "gpuguard: --gpu 7 matches no GPU in the history\n"
    _, r = report(nbox, "--since", "1h")
    assert r.stderr.startswith("gpuguard: nothing was recorded since ") and len(r.stderr.splitlines()) == 1
    for bad in (["--gpu", "GPU-zz"], ["--since", "soon"], ["--pid", "-3"]):
        r = nbox.run("report", "--out", str(nbox.tmp / "x.html"), *bad, cmd="bin/gpuguard")
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr, bad


@pytest.mark.slow
def test_daemons_name_the_jobs_and_the_report_shows_them_in_chromium(nbox, jobs, tmp_path):
    require(cdp.available(), "chromium not installed (Debian package chromium)")
    scenario(nbox, jobs, steps=200)
    leak = start_daemon(nbox, cmd="bin/gpu-leak-watch", args=["--all", "--interval", "1", "--bucket", "1"],
                        env={"FAKE_SMI_STATE": str(tmp_path / "smi-leak")})
    idle = start_daemon(nbox, env={"FAKE_SMI_STATE": str(tmp_path / "smi-idle")})
    try:
        def ready():
            hist = nbox.state / "history"
            rows = [len(p.read_text().splitlines()) for p in hist.glob("*.csv")] if hist.is_dir() else []
            return len(list(hist.glob("*.job.json"))) == 4 and len(rows) == 4 and min(rows) >= 4 and \
                (nbox.state / "gpu-history.tsv").exists()
        assert wait_for(ready, timeout=90)
    finally:
        for d in (leak, idle):
            rc, _, err = stop_daemon(d)
            assert rc == 0 and "Traceback" not in err, err
    jobs.stop()
    report(nbox)
    page = nbox.tmp / "report.html"
    b = cdp.Browser()
    try:
        b.load(page.as_uri())
        assert b.problems() == []
        links = b.eval("[...document.querySelectorAll('#summary-table a')].map(a => [a.textContent, a.title])")
        for name in NAMES.values():
            (text_, title), = [x for x in links if name in x[0]]
            assert "python3 train.py --run-name %s --api-key ***" % name in text_
            assert re.match(r"(\S*/)?python3 train.py --run-name %s" % name, title), title
        heads = b.eval("[...document.querySelectorAll('section.proc h2')].map(h => [h.textContent, h.title])")
        for name in NAMES.values():
            assert any(name in h and name in t for h, t in heads), heads
        assert any("another PID namespace" in h for h, _ in heads)
        cmds = b.eval("[...document.querySelectorAll('section.proc p.cmd')].map(p => p.textContent)")
        named = sorted(c.split(" --api-key")[0].split("python3 ", 1)[1] for c in cmds)
        assert named == sorted("train.py --run-name " + n for n in NAMES.values())
    finally:
        b.close()


@pytest.mark.slow
def test_status_watch_in_tmux_names_every_job(nbox, jobs, tmp_path):
    require(shutil.which("tmux") is not None, "tmux not installed (Debian package tmux)")
    scenario(nbox, jobs)
    cron_cycles(nbox, 5)
    sock = tmp_path / "tmux.sock"
    env = " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in nbox.env.items())
    script = tmp_path / "run.sh"
    script.write_text("env -i %s GPUGUARD_NOW=%d TERM=xterm-256color %s status --watch --interval 0.5\nsleep 60\n"
                      % (env, T0 + 60 * 6, ROOT / "bin/gpuguard"))

    def tmux(*args):
        return subprocess.run(["tmux", "-S", str(sock)] + list(args), capture_output=True, text=True, timeout=10)
    try:
        assert tmux("new-session", "-d", "-x", "160", "-y", "30", "bash --norc %s" % script).returncode == 0
        assert wait_for(lambda: all(n in tmux("capture-pane", "-p").stdout for n in NAMES.values()), timeout=30), \
            tmux("capture-pane", "-p").stdout
        screen = tmux("capture-pane", "-p").stdout
        assert re.search(r"idle \d+/3 +stuck 0/5 +IDLE", screen), screen
        # five minutes in, the leak watcher has a slope for each watched job
        for name in NAMES.values():
            assert re.search(r"%s.*(judging|watching|healthy|LEAK) [+-]\d+ MiB/h" % name, screen), screen
        assert "(%s)" % getpass.getuser() in screen and "not visible here" in screen
        assert any(ch in screen for ch in "▁▂▃▄▅▆▇█")
        assert "SEKRIT" not in screen
        # the jobs end: the next frames name them as ended
        jobs.stop()
        nbox.scenario.write_text(json.dumps({"gpus": gpu_list(3), "steps": [{
            "gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}] * 3, "apps": []}]}))
        cron_cycles(nbox, 1, start=5)
        assert wait_for(lambda: "ended in the last hour" in tmux("capture-pane", "-p").stdout, timeout=30)
        screen = tmux("capture-pane", "-p").stdout
        for role, name in NAMES.items():
            assert re.search(r"pid %d +python3 train.py --run-name %s .*last seen 2 min ago" % (jobs.pid[role], name),
                             screen), screen
    finally:
        tmux("kill-server")


def test_identity_files_are_pruned_with_their_history(tmp_path):
    """gg_retention keeps a series' identity as long as its history: an old
    identity of a series still recorded stays, one whose history went goes."""
    state = tmp_path / "state"
    hist = state / "history"
    hist.mkdir(parents=True)
    old = 1796206508 - 9 * 86400
    for name, age in (("100-1", old), ("200-2", None), ("300-3", old)):
        if name != "300-3":
            (hist / (name + ".csv")).write_text("timestamp,pid,used_memory_mib\n1,1,1\n")
        (hist / (name + ".job.json")).write_text('{"pid": 1, "cmdline": "python3 train.py"}\n')
    os.utime(hist / "100-1.csv", (old, old))
    os.utime(hist / "100-1.job.json", (old, old))
    # a long-running series: written once, nine days ago; its history is fresh
    os.utime(hist / "200-2.job.json", (old, old))
    os.utime(hist / "300-3.job.json", (old, old))
    r = subprocess.run(["bash", "-c", 'source lib/common.sh; GPUGUARD_STATE_DIR="$1"; gg_retention', "-", str(state)],
                       cwd=ROOT, env=dict(os.environ, GPUGUARD_NOW="1796206508"), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in hist.iterdir()) == ["200-2.csv", "200-2.job.json"]


RANKS = r"""
import os, subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c",
                          "import os, time; f = open(os.environ['GG_TEST_DEVICE']); print('ready', flush=True); time.sleep(600)"],
                         env=dict(os.environ, RANK=str(i), LOCAL_RANK=str(i)), stdout=subprocess.PIPE, text=True)
        for i in range(2)]
for k in kids:
    k.stdout.readline()
print(" ".join(str(k.pid) for k in kids), flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_each_rank_of_a_watched_tree_is_named_with_its_rank(nbox, tmp_path):
    (tmp_path / "nvidia0").touch()
    (tmp_path / "torchrun_like.py").write_text(RANKS)
    job = subprocess.Popen(["python3", "torchrun_like.py", "--run-name", "ddp-run", "--hf-token", "hf_abcdefghijklmnopqrstuvwx"],
                           cwd=tmp_path, env=dict(os.environ, GG_TEST_DEVICE=str(tmp_path / "nvidia0")),
                           stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        ranks = [int(p) for p in job.stdout.readline().split()]
        nbox.scenario.write_text(json.dumps({"gpus": gpu_list(2), "steps": [{
            "gpus": [{"utilization.gpu": 90, "memory.used": 9000 + i, "power.draw": 500.0}] * 2,
            "apps": [{"pid": ranks[g], "process_name": "python3", "used_memory": 8000 + i, "gpu": g} for g in (0, 1)]}
            for i in range(3)]}))
        for i in range(3):
            r = nbox.run("--pid", str(job.pid), "--once", cmd="bin/gpu-leak-watch", env={"GPUGUARD_NOW": str(T0 + 60 * i)})
            assert r.returncode == 0, r.stderr
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    ids = {p.name: json.loads(p.read_text()) for p in (nbox.state / "history").glob("*.job.json")}
    assert len(ids) == 3                                     # the tree and its two ranks
    tree = [j for n, j in ids.items() if "_" not in n]
    assert len(tree) == 1 and tree[0]["pid"] == job.pid and "--run-name ddp-run --hf-token ***" in tree[0]["cmdline"]
    assert sorted(j["rank"] for n, j in ids.items() if "_" in n) == [0, 1]
    text, _ = report(nbox)
    rows = summary_rows(text)
    assert len(rows) == 3 and all("--run-name ddp-run" in r for r in rows)
    assert sum("rank 0" in r for r in rows) == 1 and sum("rank 1" in r for r in rows) == 1
    assert_no_secret(nbox)
    assert "hf_abcdefghijklmnopqrstuvwx" not in "".join(p.read_text() for p in (nbox.state / "history").iterdir())


# A wrapped job that holds the stand-in device open and puts its own PID into
# the double's process list, so the watcher's first cycle that sees it sends
# its identity.
SELF_LISTING_JOB = 'exec 3<"$GG_TEST_DEVICE"\nsed "s/JOBPID/$$/" scenario.in > "$FAKE_SMI_SCENARIO"\nsleep 3\nexit 0\n'


@pytest.mark.slow
def test_a_job_whose_arguments_are_not_utf8_is_named_with_replacement_characters(box, tmp_path):
    # a GBK file name (模型.yaml) and raw bytes in argv: the detector had
    # failed the cycle that carried the job's identity ("surrogates not
    # allowed", "leak detector failed (exit 2)"), so the job was never named
    (tmp_path / "nvidia0").touch()
    (tmp_path / "job.sh").write_text(SELF_LISTING_JOB)
    box.write_scenario([{"gpus": [idle_gpu(mem=0)], "apps": []}])
    (tmp_path / "scenario.in").write_text(json.dumps({"gpus": gpu_list(1), "steps": [
        {"gpus": [{"utilization.gpu": 90, "memory.used": 3500, "power.draw": 500.0}],
         "apps": [{"pid": "JOBPID", "process_name": "bash", "used_memory": 3000, "gpu": 0}]}]}).replace('"JOBPID"', "JOBPID"))
    env = dict(box.env, JOBINFO_DEVICE_GLOB=str(tmp_path / "nvidia*"), GG_TEST_DEVICE=str(tmp_path / "nvidia0"))
    r = subprocess.run([str(ROOT / "bin/gpu-leak-watch"), "--interval", "1", "--", "bash", "job.sh",
                        b"\xc4\xa3\xd0\xcd.yaml", b"bad\xff\xfe"], cwd=tmp_path, env=env, capture_output=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert b"failed" not in r.stderr and b"surrogates" not in r.stderr, r.stderr
    # each byte that does not start valid UTF-8 is one U+FFFD (c4 a3 is ģ)
    cmdline = "bash job.sh \u0123\ufffd\ufffd.yaml bad\ufffd\ufffd"
    (identity,) = [json.loads(p.read_text(encoding="utf-8")) for p in (box.state / "history").glob("*.job.json")]
    assert identity["cmdline"] == cmdline
    status = subprocess.run([str(ROOT / "bin/gpuguard"), "status", "--json"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert [j["cmdline"] for j in json.loads(status.stdout)["ended_jobs"]] == [cmdline], status.stderr


def test_an_argument_with_a_newline_an_escape_sequence_or_gbk_bytes_is_shown_as_text(nbox, tmp_path):
    """Any user on a shared box names their process: a newline in an
    argument split `gpuguard status`'s table and the alert's message (a job
    could forge lines in the chat), an escape sequence reached the admin's
    terminal (window title, clear screen), and a GBK file name put bytes
    that are not UTF-8 into events.jsonl, the state and the ledger."""
    dev = tmp_path / "nvidia0"
    dev.touch()
    (tmp_path / "train.py").write_text(TRAIN)
    argv = [b"python3", b"train.py", b"--note=a\nFAKE ROW", b"\x1b]0;pwned\x07\x1b[2J", b"\xc4\xa3\xd0\xcd\xff.yaml"]
    p = subprocess.Popen(argv, cwd=tmp_path, env=dict(os.environ, GG_TEST_DEVICE=str(dev)),
                         stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert p.stdout.readline() == b"ready\n"
        idle = {"gpus": [{"utilization.gpu": 0, "memory.used": 30500, "power.draw": 76.6}],
                "apps": [{"pid": p.pid, "process_name": "python3", "used_memory": 30000, "gpu": 0}]}
        nbox.scenario.write_text(json.dumps({"gpus": gpu_list(1), "steps": [idle]}))
        for i in range(3):
            r = nbox.run("--once", env={"GPUGUARD_NOW": str(T0 + 60 * i)})
            assert r.returncode == 0, r.stderr
        status = nbox.run("status", cmd="bin/gpuguard", env={"GPUGUARD_NOW": str(T0 + 180)})
        preview = nbox.run("notify", "--preview", cmd="bin/gpuguard")
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    (firing,) = [json.loads(line) for line in (nbox.state / "events.jsonl").read_bytes().decode("utf-8").splitlines()]
    cmdline = firing["job"]["cmdline"]
    assert "--note=a\\nFAKE ROW" in cmdline and "\\e]0;pwned?\\e[2J" in cmdline
    assert "\ufffd.yaml" in cmdline
    for out in (status.stdout, preview.stdout):
        assert "\x1b" not in out and "\x07" not in out
        assert not any(line.startswith("FAKE ROW") for line in out.splitlines()), out
    assert "--note=a\\nFAKE ROW" in status.stdout
    for path in nbox.state.rglob("*"):
        if path.is_file():
            path.read_bytes().decode("utf-8")          # every file the watchdog wrote is UTF-8 text
