"""The ledger (lib/ledger.sh, python/gpuguard_ledger.py) as a shared lab box
meets it: one simulated day, the clock pinned (GPUGUARD_NOW, TZ=UTC),
cycles every 10 minutes from cron (--once) and from the daemon, two users
whose real processes hold the stand-in GPU device file, idle, stuck and
busy stretches, a kill -9 in the middle. The ledger is checked to the
minute against the schedule, then the daily digest per provider (exactly
once), the JSON, the privacy modes and the textfile counters."""
import html
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time

import pytest
import webhook_sink
from conftest import (
    ROOT,
    Box,
    app,
    busy_gpu,
    idle_gpu,
    require,
    run_killed_after,
    start_daemon,
    stop_daemon,
    user_environ,
    wait_for,
)

DAY0 = 1796169600                       # 2026-12-02 00:00 UTC
H, M = 3600, 60
STEP = 10 * M
PYTHON = "/usr/bin/python3"             # the second user cannot run a venv under /root
HOLD = "import sys, time\nf = open(sys.argv[1])\nprint('ready', flush=True)\ntime.sleep(3600)\n"


def at(hh, mm=0, day=0):
    return DAY0 + day * 86400 + hh * H + mm * M


class Holder:
    """A training job of one user: its own session, holding the stand-in
    GPU device file open as a CUDA process holds /dev/nvidia*."""

    def __init__(self, dev, user, script):
        pw = pwd.getpwnam(user)
        path = os.path.join(os.path.dirname(dev), script)
        with open(path, "w") as f:
            f.write(HOLD)
        self.proc = subprocess.Popen([PYTHON, path, dev], user=pw.pw_uid, group=pw.pw_gid,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True, cwd="/")
        assert self.proc.stdout.readline().strip() == "ready"
        self.pid = self.proc.pid

    def stop(self):
        os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait()


def spinning_gpu(mem=30000):
    # a collective waiting for a dead peer: 100 % at the idle power floor
    return {"utilization.gpu": 100, "memory.used": mem, "power.draw": 121.0}


def schedule(t, a, b1, b2):
    """The day as a list of (gpus, apps) at sample time t (minutes since
    midnight, the sample covering the 10 minutes before it):
      GPU 0: root's job a 08:00-13:00, idle 10:00-12:00; nobody's job b2
             15:00-16:00, idle all along;
      GPU 1: nobody's job b1 09:00-17:00, idle 14:00-15:30, stuck
             16:00-16:30, busy otherwise."""
    gpu0, gpu1, apps = idle_gpu(mem=0), idle_gpu(mem=0), []
    if 8 * 60 <= t <= 13 * 60:
        gpu0 = idle_gpu(mem=30000) if 10 * 60 < t <= 12 * 60 else busy_gpu(mem=30000)
        apps.append(app(a, gpu=0, mem=29800))
    elif 15 * 60 < t <= 16 * 60:
        gpu0 = idle_gpu(mem=20000)
        apps.append(app(b2, gpu=0, mem=19800))
    if 9 * 60 < t <= 17 * 60:
        if 14 * 60 < t <= 15 * 60 + 30:
            gpu1 = idle_gpu(mem=40000)
        elif 16 * 60 < t <= 16 * 60 + 30:
            gpu1 = spinning_gpu(mem=40000)
        else:
            gpu1 = busy_gpu(mem=40000)
        apps.append(app(b1, gpu=1, mem=39800))
    return [{"gpus": [gpu0, gpu1], "apps": apps}]


# What the schedule says, by hand: sample 08:00 is the first cycle ever
# (it accounts nothing); every later sample accounts its 10 minutes.
ROOT_HELD, ROOT_IDLE = 5 * H, 2 * H                 # a: 08:10-13:00 held, 10:10-12:00 idle
B1_HELD, B1_IDLE, B1_LONGEST = 8 * H, 2 * H, 90 * M    # 1 h 30 idle + 30 min stuck
B2_HELD = B2_IDLE = 1 * H
PRICE = 20


def env_for(box, extra=None):
    env = {"TZ": "UTC", "CHECK_INTERVAL": "600", "GPU_HOUR_PRICE": str(PRICE), "GPUGUARD_HOST": "lab-8gpu",
           "GPUGUARD_TEXTFILE_DIR": str(box.tmp / "textfile")}
    env.update(extra or {})
    return env


def cycle(box, t_min, ids, env=None, day=0):
    box.write_scenario(schedule(t_min, *ids), gpus=2)
    box.once(now=at(0, t_min, day), env=env_for(box, env))


def daemon_cycle_then(box, t_min, ids, how):
    """The daemon runs its cycle at t (pinned), then is stopped by `how`:
    SIGKILL once its cycle reached the journal, or SIGTERM."""
    box.write_scenario(schedule(t_min, *ids), gpus=2)
    journal = box.state / "ledger" / "journal"
    proc = start_daemon(box, env=dict(env_for(box), GPUGUARD_NOW=str(at(0, t_min))))
    assert wait_for(lambda: journal.exists() and f"\t{at(0, t_min)}\t" in journal.read_text(), timeout=30)
    if how == "kill":
        kill9(proc)
    else:
        rc, _, err = stop_daemon(proc)
        assert rc == 0, err


def kill9(proc):
    """kill -9 of the daemon; its `sleep` child, which a real kill leaves
    behind holding nothing of ours, is ended too."""
    kids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if entry.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == proc.pid:
                    kids.append(int(entry))
        except (OSError, IndexError, ValueError):
            pass
    proc.kill()
    proc.wait(timeout=15)
    for pid in kids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.stdout.close()
    proc.stderr.close()


def two_users_device(box):
    """A device file that root's and nobody's jobs can both hold open (in a
    folder of its own, readable by all), named in the box's
    JOBINFO_DEVICE_GLOB; skips where two users' jobs cannot be had."""
    require(os.geteuid() == 0, "two users' jobs need root (a job of the user nobody)")
    require(os.access(PYTHON, os.X_OK), PYTHON + " missing")
    devdir = tempfile.mkdtemp(prefix="gg-ledger-dev-")
    os.chmod(devdir, 0o755)
    dev = os.path.join(devdir, "nvidia0")
    open(dev, "w").close()
    os.chmod(dev, 0o644)
    box.env["JOBINFO_DEVICE_GLOB"] = os.path.join(devdir, "nvidia*")
    return dev


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """One simulated day, run once for the module's tests."""
    box = Box(tmp_path_factory.mktemp("lab"))
    dev = two_users_device(box)
    holders = [Holder(dev, "root", "train_llama.py"), Holder(dev, "nobody", "sft.py"),
               Holder(dev, "nobody", "eval.py")]
    ids = [h.pid for h in holders]
    try:
        for t in range(8 * 60, 11 * 60, 10):              # 08:00-10:50 from cron
            cycle(box, t, ids)
        daemon_cycle_then(box, 11 * 60, ids, "kill")        # 11:00 the daemon, then kill -9
        # 11:10: a daemon killed at some point of its cycle, then cron at the same time
        box.write_scenario(schedule(11 * 60 + 10, *ids), gpus=2)
        env = dict(box.env, **env_for(box), GPUGUARD_NOW=str(at(11, 10)))
        run_killed_after([str(ROOT / "bin/yichuidingyin.sh")], env, 0.15)
        for t in range(11 * 60 + 10, 14 * 60, 10):
            cycle(box, t, ids)
        daemon_cycle_then(box, 14 * 60, ids, "term")        # 14:00 the daemon, stopped cleanly
        for t in range(14 * 60 + 10, 18 * 60 + 10, 10):   # 14:10-18:00 from cron
            cycle(box, t, ids)
        yield box, holders
    finally:
        for h in holders:
            h.stop()
        shutil.rmtree(os.path.dirname(dev), ignore_errors=True)


def ledger(box, *args, now=None, env=None):
    now = at(18) if now is None else now
    r = box.run("ledger", *args, cmd="bin/gpuguard", env=dict(env_for(box, env), GPUGUARD_NOW=str(now)))
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.slow
def test_the_day_is_accounted_to_the_minute_across_cron_daemon_and_kill(lab):
    box, holders = lab
    s = json.loads(ledger(box, "--json"))
    assert (s["from"], s["to"], s["names"]) == ("2026-12-02", "2026-12-02", "user")
    users = {u["user"]: (u["held_s"], u["idle_s"], u["longest_s"]) for u in s["users"]}
    assert users == {"nobody": (B1_HELD + B2_HELD, B1_IDLE + B2_IDLE, B1_LONGEST),
                     "root": (ROOT_HELD, ROOT_IDLE, 2 * H)}
    assert s["held_s"] == 14 * H and s["idle_s"] == 5 * H
    # 5 idle GPU-hours at 20 an hour
    assert s["cost"] == 100.0 and s["currency"] == "¥"
    assert [u["user"] for u in s["users"]] == ["nobody", "root"]        # most idle first
    assert [u["cost"] for u in s["users"]] == [60.0, 40.0]
    worst = [(w["user"], w["gpus"], w["longest_s"], w["end_ts"]) for w in s["worst"]]
    assert worst == [("root", ["0"], 2 * H, at(12)), ("nobody", ["1"], B1_LONGEST, at(15, 30)),
                     ("nobody", ["0"], H, at(16))]
    assert "train_llama.py" in s["worst"][0]["cmd"]
    rows = {(j["user"], j["gpus"][0]): (j["held_s"], j["idle_s"], j["longest_s"], j["longest_end"]) for j in s["jobs"]}
    assert rows == {("root", "0"): (ROOT_HELD, ROOT_IDLE, 2 * H, at(12)),
                    ("nobody", "1"): (B1_HELD, B1_IDLE, B1_LONGEST, at(15, 30)),
                    ("nobody", "0"): (B2_HELD, B2_IDLE, H, at(16))}
    assert s["worst"][0]["job"] == "pid:%d@%s" % (holders[0].pid, s["worst"][0]["job"].split("@")[1])
    # the day file on disk says the same (the journal holds at most 20 cycles)
    day = (box.state / "ledger" / "2026-12-02.tsv").read_text()
    assert day.startswith("# gpuguard ledger 1\nday\t2026-12-02\n")
    journal = (box.state / "ledger" / "journal").read_text().splitlines()
    assert len([line for line in journal if line.startswith("c\t")]) < 20


def test_a_job_that_ended_between_cron_runs_keeps_its_command_line(box):
    """From cron, each --once run knew only the jobs it saw itself: a job
    that ended before the ledger's 20-cycle save had no command line in
    `gpuguard ledger` or the daily digest ("GPU 0 idle for 9 min: root")."""
    require(os.geteuid() == 0, "a holder of the stand-in device file")
    devdir = tempfile.mkdtemp(prefix="gg-ledger-dev-")
    try:
        dev = os.path.join(devdir, "nvidia0")
        open(dev, "w").close()
        box.env["JOBINFO_DEVICE_GLOB"] = os.path.join(devdir, "nvidia*")
        job = Holder(dev, "root", "exp7_sft.py")
        held = [{"gpus": [idle_gpu(mem=30000)], "apps": [app(job.pid, gpu=0, mem=29800)]}]
        for t in range(8 * 60, 9 * 60 + 40, 10):
            if t == 9 * 60 + 20:
                job.stop()
                held = [{"gpus": [idle_gpu(mem=0)], "apps": []}]
            box.write_scenario(held)
            box.once(now=at(0, t), env=env_for(box))
        s = json.loads(ledger(box, "--json", now=at(10)))
        (row,) = s["jobs"]
        assert row["user"] == "root" and "exp7_sft.py" in row["cmd"], row
        assert "exp7_sft.py" in ledger(box, now=at(10))
    finally:
        shutil.rmtree(os.path.dirname(dev), ignore_errors=True)


@pytest.mark.slow
def test_text_and_a_later_day(lab):
    box, _ = lab
    text = ledger(box, env={"NOTIFY_LANG": "zh"})
    assert "[gpuguard 日报] lab-8gpu：GPU 占用日报 2026-12-02" in text
    assert "空闲占卡 5.0 GPU 时（共占用 14.0 GPU 时，其中 36% 空闲或卡死），浪费 ¥ 100.00" in text
    assert "nobody：空闲 3.0 / 占用 9.0，最长一次连续空闲 1 小时 30 分，浪费 ¥ 60.00" in text
    en = ledger(box)
    assert "5.0 GPU-hours held idle (36% of 14.0 GPU-hours held were idle or stuck), wasted ¥ 100.00" in en
    assert "1. GPU 0 idle for 2 h 0 min (until 12:00): root · " in en and "train_llama.py" in en
    # a week: the day shows in the trend; a day later without samples is empty
    week = json.loads(ledger(box, "--since", "7d", "--json", now=at(12, day=1)))
    assert week["from"] == "2026-11-27" and week["to"] == "2026-12-03"
    assert [t["idle_s"] for t in week["trend"]] == [0, 0, 0, 0, 0, 5 * H, 0]
    today = json.loads(ledger(box, "--json", now=at(12, day=1)))
    assert today["held_s"] == 0 and today["users"] == [] and today["worst"] == []


@pytest.mark.slow
def test_report_has_the_ledger_table_and_bars(lab, tmp_path):
    box, _ = lab
    out = tmp_path / "r.html"
    r = box.run("report", "--out", str(out), "--since", "2026-12-01", cmd="bin/gpuguard",
                env=dict(env_for(box), GPUGUARD_NOW=str(at(18))))
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    section = page.split("<h2 id='ledger'>")[1].split("<h2>")[0]
    assert "2026-12-01 – 2026-12-02" in section and "14.0 GPU-hours held, 5.0 of them idle or stuck" in section
    bars = section.split("<svg id='ledger-bars'")[1].split("</svg>")[0]
    assert "3.0 h idle / 9.0 h held" in bars and "2.0 h idle / 5.0 h held" in bars
    rows = section.split("<table id='ledger-table'>")[1].split("</table>")[0].split("<tr>")[2:]
    # most idle first (ties: most held): sft.py 2 h of 8, train_llama.py 2 h of 5, eval.py 1 h
    assert ["sft.py" in rows[0], "train_llama.py" in rows[1]] == [True, True]
    assert "<td>root</td>" in rows[1] and "<td class='n'>5.0</td><td class='n'>2.0</td><td>2.0 h</td>" \
        "<td class='n'>40.00</td>" in rows[1]
    assert "<td>nobody</td>" in rows[2] and "<td class='n'>1.0</td><td class='n'>1.0</td><td>60 min</td>" in rows[2]


@pytest.mark.slow
def test_privacy_hash_and_none(lab):
    box, _ = lab
    hashed = json.loads(ledger(box, "--json", env={"LEDGER_NAMES": "hash"}))
    names = [u["user"] for u in hashed["users"]]
    assert all(re.fullmatch(r"u[0-9a-f]{8}", n) for n in names) and len(set(names)) == 2
    assert json.loads(ledger(box, "--json", env={"LEDGER_NAMES": "hash"}))["users"] == hashed["users"]
    assert "root" not in json.dumps(hashed) and "nobody" not in json.dumps(hashed)
    assert all(w["cmd"] is None for w in hashed["worst"])
    assert all(j["cmd"] is None and j["job"] is None for j in hashed["jobs"])
    none = json.loads(ledger(box, "--json", env={"LEDGER_NAMES": "none"}))
    assert none["users"] == [] and none["idle_s"] == 5 * H
    assert all(w["user"] is None and w["cmd"] is None for w in none["worst"])
    text = ledger(box, env={"LEDGER_NAMES": "none"})
    assert "root" not in text and "nobody" not in text and "5.0 GPU-hours held idle" in text


@pytest.mark.slow
def test_counters_in_the_textfile(lab):
    box, _ = lab
    text = (box.tmp / "textfile" / "gpuguard_idle.prom").read_text()
    assert "# TYPE gpuguard_gpu_held_seconds_total counter" in text
    assert 'gpuguard_gpu_held_seconds_total{user="root"} %d' % ROOT_HELD in text
    assert 'gpuguard_gpu_idle_held_seconds_total{user="nobody"} %d' % (B1_IDLE + B2_IDLE) in text
    promtool = shutil.which("promtool")
    require(promtool is not None, "promtool (Debian package prometheus) not installed")
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def providers_of(sink):
    out = {}
    for r in sink.requests:
        out.setdefault(r["path"].split("/")[1], []).append(r["body"])
    return out


TEXT_OF = {"dingtalk": lambda b: b["markdown"]["text"], "feishu": lambda b: b["content"]["text"],
           "wecom": lambda b: b["markdown"]["content"], "slack": lambda b: b["text"]}


@pytest.mark.slow
def test_daily_digest_once_per_target_across_restarts_kill_and_cron(lab, tmp_path):
    src, _ = lab
    box = Box(tmp_path)
    shutil.copytree(src.state, box.state)
    box.env["JOBINFO_DEVICE_GLOB"] = src.env["JOBINFO_DEVICE_GLOB"]
    server, sink = webhook_sink.serve(quiet=True)
    url = "http://127.0.0.1:%d" % server.server_address[1]
    try:
        digest = {"LEDGER_DIGEST_AT": "09:00", "NOTIFY_URL": (
            f"dingtalk+{url}/dingtalk/robot/send?access_token=t1 feishu+{url}/feishu/hook/abc "
            f"wecom+{url}/wecom/send?key=k1 slack+{url}/slack/services/T/B/C"),
            "ALERTMANAGER_URL": url}
        empty = [{"gpus": [idle_gpu(mem=0), idle_gpu(mem=0)], "apps": []}]
        box.write_scenario(empty, gpus=2)
        box.once(now=at(8, 50, day=1), env=env_for(box, digest))
        assert sink.requests == []                                   # not yet 09:00
        box.once(now=at(9, 0, day=1), env=env_for(box, digest))
        posts = providers_of(sink)
        assert sorted(posts) == ["api", "dingtalk", "feishu", "slack", "wecom"]
        assert posts["api"] == [[]]                                  # Alertmanager: a report is no alert
        for p in ("dingtalk", "feishu", "wecom", "slack"):
            assert len(posts[p]) == 1, p
        texts = {p: TEXT_OF[p](posts[p][0]) for p in TEXT_OF}
        for p in ("dingtalk", "feishu", "wecom"):
            t = texts[p]
            assert "[gpuguard 日报] lab-8gpu：GPU 占用日报 2026-12-02" in t, t
            assert "空闲占卡 5.0 GPU 时" in t and "浪费 ¥ 100.00" in t
            assert "root：空闲 2.0 / 占用 5.0，最长一次连续空闲 2 小时 0 分，浪费 ¥ 40.00" in t
            assert "1. GPU 0 连续空闲 2 小时 0 分（至 12:00）：root" in t
            assert "近 7 天空闲 GPU 时：11-26 0.0 · 11-27 0.0 · 11-28 0.0 · 11-29 0.0 · 11-30 0.0 · 12-01 0.0 · 12-02 5.0" in t
        assert "*[gpuguard DAILY] lab-8gpu: GPU ledger 2026-12-02*" in texts["slack"]
        assert "nobody: idle 3.0 / held 9.0, longest idle stretch 1 h 30 min, wasted ¥ 60.00" in texts["slack"]
        assert not any("@" in t for t in texts.values())             # a report mentions nobody
        examples = tmp_path / "examples"
        examples.mkdir()
        for p, t in texts.items():
            (examples / p).write_text(t)
        n = len(sink.requests)
        # later cycles, a restart, a kill -9 of the daemon, a lost marker: never again
        box.once(now=at(9, 10, day=1), env=env_for(box, digest))
        proc = start_daemon(box, env=dict(env_for(box, digest), GPUGUARD_NOW=str(at(9, 20, day=1))))
        assert wait_for(lambda: f"\t{at(9, 20, day=1)}\t" in (box.state / "ledger" / "journal").read_text())
        kill9(proc)
        (box.state / "ledger" / "digest-sent").unlink()           # as if killed before the mark
        box.once(now=at(9, 30, day=1), env=env_for(box, digest))
        assert len(sink.requests) == n
        assert (box.state / "ledger" / "digest-sent").read_text() == "2026-12-02\n"
        # the next day had no held GPU: nothing is sent for it
        box.once(now=at(9, 0, day=2), env=env_for(box, digest))
        assert len(sink.requests) == n
        assert (box.state / "ledger" / "digest-sent").read_text() == "2026-12-03\n"
    finally:
        server.shutdown()


# ------------------------------------------------ fast, one user ----

def test_bad_since_and_digest_time_are_one_line_errors(box):
    r = box.run("ledger", "--since", "yesterday", cmd="bin/gpuguard")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--since" in r.stderr
    r = box.run("ledger", "--bogus", cmd="bin/gpuguard")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = box.run("--once", env={"LEDGER_DIGEST_AT": "9am"})
    assert r.returncode == 2 and "LEDGER_DIGEST_AT" in r.stderr and r.stderr.count("\n") == 1
    r = box.run("--once", env={"LEDGER_NAMES": "initials"})
    assert r.returncode == 2 and "LEDGER_NAMES" in r.stderr


def test_a_stopped_watchdog_does_not_invent_held_time(box):
    """Cron stopped for five hours: the first cycle after accounts at most
    3 cycles; a failed nvidia-smi sample accounts nothing."""
    box.write_scenario([{"gpus": [idle_gpu(mem=30000)], "apps": [app(os.getpid(), mem=29800)]}])
    env = {"CHECK_INTERVAL": "60", "TZ": "UTC", "JOBINFO_DEVICE_GLOB": "/nonexistent*"}
    for t in (0, 60, 120, 120 + 5 * H):
        box.once(now=at(10) + t, env=env)
    box.write_scenario([{"fault": "driver"}])
    box.once(now=at(10) + 5 * H + 180, env=env)
    s = json.loads(ledger(box, "--json", now=at(23), env=env))
    # 2 minutes, then 3 cycles (180 s) for the 5-hour gap; the failed sample: 0
    assert s["held_s"] == 300 and s["idle_s"] == 300
    # a PID this namespace cannot vouch for is no one's: "?"
    assert [u["user"] for u in s["users"]] == ["?"]


@pytest.mark.parametrize("pause_h, start", [(3, at(1)), (9, at(20))], ids=["watchdog stopped 3 h", "host asleep overnight"])
def test_a_pause_in_sampling_ends_the_longest_idle_stretch(box, pause_h, start):
    """A job idle for 10 watched minutes, then a pause in sampling (the
    watchdog stopped, the host asleep past midnight), then 5 more watched
    idle minutes. The longest stretch read 10 min + 3 capped cycles of the
    pause + 5 min = 18 min, as if watched all along; it ends at the pause
    (the watchdog's own rule: a pause over max(5 cycles, 15 min) is a
    break), and the next one starts with the first sample after it."""
    box.write_scenario([{"gpus": [idle_gpu(mem=30000)], "apps": [app(os.getpid(), mem=29800)]}])
    env = {"CHECK_INTERVAL": "60", "TZ": "UTC", "JOBINFO_DEVICE_GLOB": "/nonexistent*"}
    for t in range(0, 11 * M, M):
        box.once(now=start + t, env=env)
    after = start + 10 * M + pause_h * H
    for t in range(0, 6 * M, M):
        box.once(now=after + t, env=env)
    s = json.loads(ledger(box, "--json", "--since", "2d", now=after + 6 * M, env=env))
    rows = {j["day"]: (j["longest_s"], j["longest_end"]) for j in s["jobs"]}
    want = {time.strftime("%Y-%m-%d", time.gmtime(after)): (5 * M, after + 5 * M),
            time.strftime("%Y-%m-%d", time.gmtime(start)): (10 * M, start + 10 * M)}
    assert rows == want
    # a pause of 15 minutes at 1-minute cycles is within the rule: no
    # break (5 min, 3 capped cycles, 5 min)
    for t in range(20 * M, 26 * M, M):
        box.once(now=after + t, env=env)
    s = json.loads(ledger(box, "--json", now=after + 26 * M, env=env))
    assert [(j["longest_s"], j["longest_end"]) for j in s["jobs"]] == [(13 * M, after + 25 * M)]


@pytest.mark.parametrize("locale, utf8", [({"LANG": "C"}, False), ({"LANG": "C.UTF-8", "LC_ALL": "POSIX"}, False),
                                          ({"LANG": "C.UTF-8"}, True)], ids=["LANG=C", "LC_ALL=POSIX", "LANG=C.UTF-8"])
def test_ledger_text_is_ascii_where_the_locale_is_not_utf8(box, locale, utf8):
    """`gpuguard ledger --since 2d` on a console set to C printed its span's
    dash and the dots between a job's user, Slurm job and command line as
    UTF-8 (mojibake there); it now prints ASCII there, and as before under
    a UTF-8 locale. The digest sent to chat keeps them. (The incident line
    once read "(until 15:00)": over two days it now names its day.)"""
    ledger_dir = box.state / "ledger"
    ledger_dir.mkdir(parents=True)
    for n, day in enumerate(("2026-12-01", "2026-12-02"), 1):
        ts = at(15, day=n - 2)
        (ledger_dir / (day + ".tsv")).write_text(
            "# gpuguard ledger 1\nday\t%s\nlast\t%d\t%d\n"
            "job\talice\t1000\tslurm:4242\t7200\t%d\t3600\t%d\t0,1\tpython3 train.py --lr 0.1\n"
            % (day, ts, n, 1800 * n, ts))
    r = box.run("ledger", "--since", "2d", cmd="bin/gpuguard",
                env=dict(env_for(box, {"GPU_HOUR_PRICE": "0"}), GPUGUARD_HOST="lab", GPUGUARD_NOW=str(at(18)), **locale))
    assert r.returncode == 0, r.stderr
    dash, dot = ("\u2013", "\u00b7") if utf8 else ("-", "|")
    lines = r.stdout.splitlines()
    assert lines[0] == "[gpuguard DAILY] lab: GPU ledger 2026-12-01 %s 2026-12-02" % dash
    assert f"  1. GPU 0,1 idle for 1 h 0 min (12-02, until 15:00): alice {dot} Slurm job 4242 {dot} python3 train.py --lr 0.1" \
        in lines
    assert lines[-1] == f"  Idle GPU-hours, last 2 days: 12-01 0.5 {dot} 12-02 1.0"
    assert r.stdout.isascii() is not utf8


@pytest.mark.parametrize("locale, utf8", [({"LANG": "C"}, False), ({"LANG": "C.UTF-8"}, True)],
                         ids=["LANG=C", "LANG=C.UTF-8"])
def test_a_c_terminal_gets_the_price_and_the_words_in_ascii(box, locale, utf8):
    """Under LANG=C the glyphs were ASCII but the default currency ¥ and the
    Chinese of NOTIFY_LANG=zh (set for the chat group) still came as UTF-8
    bytes, mojibake on that terminal. There: CNY and English; under a
    UTF-8 locale, as configured."""
    ledger_dir = box.state / "ledger"
    ledger_dir.mkdir(parents=True)
    ts = at(15, day=-1)
    (ledger_dir / "2026-12-02.tsv").write_text(
        "# gpuguard ledger 1\nday\t2026-12-02\nlast\t%d\t1\n"
        "job\talice\t1000\tslurm:4242\t7200\t3600\t3600\t%d\t0\tpython3 train.py\n" % (ts, ts))
    env = dict(env_for(box, {"GPU_HOUR_PRICE": "20", "NOTIFY_LANG": "zh"}), GPUGUARD_HOST="lab",
               GPUGUARD_NOW=str(at(18)), **locale)
    env.pop("GPU_PRICE_CURRENCY", None)                  # the default, ¥
    r = box.run("ledger", "--since", "1d", cmd="bin/gpuguard", env=env)
    assert r.returncode == 0, r.stderr
    if utf8:
        assert "空闲占卡 1.0 GPU 时" in r.stdout and "¥ 20.00" in r.stdout
    else:
        assert r.stdout.isascii(), r.stdout
        assert "1.0 GPU-hours held idle" in r.stdout and "CNY 20.00" in r.stdout, r.stdout


def test_busy_box_stays_under_a_megabyte_a_month(box):
    """A day of 400 jobs (a new job every few minutes on 8 GPUs) keeps
    LEDGER_MAX_JOBS rows; the rest of a user's jobs add up in one row."""
    ledger_dir = box.state / "ledger"
    ledger_dir.mkdir(parents=True)
    lines = []
    for i in range(1, 401):
        entries = "\t".join(f"GPU-{g}|{g}|{i % 2}|user{i % 7}|slurm:{100000 + i * 8 + g // 4}" for g in range(8))
        lines.append(f"c\t{i}\t{at(0, 3 * i)}\t180\t{entries}\t.")
    (ledger_dir / "journal").write_text("\n".join(lines) + "\n")
    box.write_scenario([{"gpus": [idle_gpu(mem=0)], "apps": []}])
    box.once(now=at(0, 3 * 401), env={"CHECK_INTERVAL": "180", "TZ": "UTC"})
    day = (ledger_dir / "2026-12-02.tsv").read_text()
    rows = [ln for ln in day.splitlines() if ln.startswith("job\t")]
    assert len(rows) <= 120 + 7
    assert len(day.encode()) * 31 < 1 << 20
    s = json.loads(ledger(box, "--json", now=at(23), env={"TZ": "UTC"}))
    assert s["held_s"] == 400 * 8 * 180                   # nothing dropped, only merged
    assert (ledger_dir / "journal").read_text() == ""


def day_name(day):
    return time.strftime("%Y-%m-%d", time.gmtime(at(0, day=day)))


def past_days(box, first, last=-1):
    """Day files of the days first..last (days since DAY0, negative) as the
    watchdog left them, each with one hour of a job of alice's and its
    mtime at the day's end (today's at 09:50)."""
    ledger_dir = box.state / "ledger"
    ledger_dir.mkdir(parents=True, exist_ok=True)
    for seq, day in enumerate(range(first, last + 1), start=1):
        end = at(23, 59, day=day) if day < 0 else at(9, 50, day=day)
        f = ledger_dir / (day_name(day) + ".tsv")
        f.write_text(f"# gpuguard ledger 1\nday\t{day_name(day)}\nlast\t{end}\t{seq}\n"
                     f"job\talice\t1000\tslurm:{seq}\t3600\t0\t0\t0\t0\t-\n")
        os.utime(f, (end, end))
    return ledger_dir


def test_retention_prunes_day_files_by_their_day(box):
    """Day files more than LEDGER_KEEP_DAYS (35) days before today go, by
    the day in their name: a restore from backup gave them all a fresh
    mtime."""
    ledger_dir = past_days(box, -60, 0)
    for f in ledger_dir.glob("*.tsv"):
        os.utime(f)
    box.write_scenario([{"gpus": [idle_gpu(mem=0)], "apps": []}])
    r = box.once(now=at(10), env={"TZ": "UTC"})
    assert "clock" not in r.stderr
    assert sorted(p.name[:-4] for p in ledger_dir.glob("*.tsv")) == [day_name(d) for d in range(-35, 1)]


def test_a_cycle_with_the_clock_far_ahead_keeps_the_ledgers_month(box):
    """A VM booted with its RTC 400 days ahead ran two cycles before NTP set
    the clock back: their retention pass found every day file over
    LEDGER_KEEP_DAYS old by its mtime and removed them, and `gpuguard
    ledger --since 30d` showed an empty month. The newest LEDGER_KEEP_DAYS
    + 1 day files are now never removed: the month is still there."""
    ledger_dir = past_days(box, -40)
    box.write_scenario([{"gpus": [idle_gpu(mem=0)], "apps": []}])
    env = {"CHECK_INTERVAL": "60", "TZ": "UTC"}
    box.once(now=at(10), env=env)
    before = json.loads(ledger(box, "--since", "30d", "--json", now=at(10), env=env))
    assert before["held_s"] == 29 * H                    # 11-03..12-01, an hour each
    for t in (at(10, day=400), at(10, day=401), at(10, 2), at(10, 3)):
        box.once(now=t, env=env)
    after = json.loads(ledger(box, "--since", "30d", "--json", now=at(10, 4), env=env))
    assert (after["from"], after["to"], after["held_s"]) == (before["from"], before["to"], 29 * H)
    # the last 35 days, today's file among them; the future one gone
    assert sorted(p.name[:-4] for p in ledger_dir.glob("*.tsv")) == [day_name(d) for d in range(-34, 1)]


def test_one_cycle_with_the_clock_far_ahead_does_not_silence_the_ledger(box):
    """A VM booted with its RTC 400 days ahead ran two cycles before NTP set
    the clock back: the ledger took their day and time as its own and booked
    nothing until the wall clock caught up (400 days), without a word, and
    the future day file was never pruned. It now says so once, drops the
    future day file and counts again from the first cycle with the right
    clock (which accounts nothing, as after a gap)."""
    box.write_scenario([{"gpus": [idle_gpu(mem=30000)], "apps": [app(os.getpid(), mem=29800)]}])
    env = {"CHECK_INTERVAL": "60", "TZ": "UTC", "JOBINFO_DEVICE_GLOB": "/nonexistent*"}
    for t in (at(10), at(10, 1), at(10, day=400), at(10, day=401)):
        box.once(now=t, env=env)
    ledger_dir = box.state / "ledger"
    future = time.strftime("%Y-%m-%d", time.gmtime(at(10, day=400))) + ".tsv"
    assert (ledger_dir / future).exists()
    said = []
    for t in range(2, 13):
        r = box.once(now=at(10, t), env=env)
        said += [x for x in r.stderr.splitlines() if "clock" in x]
    assert len(said) == 1 and "the ledger counts again from now" in said[0] and future in said[0], said
    assert sorted(p.name for p in ledger_dir.glob("*.tsv")) == ["2026-12-02.tsv"]
    s = json.loads(ledger(box, "--json", now=at(10, 12), env=env))
    # 1 minute before the clock went ahead, 10 after it came back
    assert s["held_s"] == s["idle_s"] == 11 * M


def test_a_torn_journal_line_is_left_out(box):
    box.write_scenario([{"gpus": [idle_gpu(mem=30000)], "apps": []}])
    env = {"CHECK_INTERVAL": "60", "TZ": "UTC"}
    for t in (0, 60):
        box.once(now=at(10) + t, env=env)
    with open(box.state / "ledger" / "journal", "a") as f:
        f.write(f"c\t3\t{at(10, 2)}\t60\t|0|1||\tGPU-y|0|1|eve|pid:2@2\t.\n")  # damaged
        f.write(f"c\t4\t{at(10, 3)}\t60\tGPU-x|0|1|mallory|pid:1@1")     # a write cut short
    s = json.loads(ledger(box, "--json", now=at(23), env=env))
    assert s["held_s"] == 120 and sorted(u["user"] for u in s["users"]) == ["?", "eve"]
    box.once(now=at(10, 4), env=env)                         # the watchdog reads it too, and goes on


@pytest.mark.slow
def test_counters_through_the_real_prometheus(lab, tmp_path):
    """The textfile as node_exporter serves it, scraped by the real
    Prometheus with the shipped rules: the counters by user, and the
    recording rule's idle GPU-hours per user and day."""
    import http.server
    import threading
    import urllib.parse
    import urllib.request

    from conftest import free_port, stop_processes
    prometheus = shutil.which("prometheus")
    require(prometheus is not None, "prometheus (Debian package prometheus) not installed")
    src, _ = lab
    box = Box(tmp_path)
    shutil.copytree(src.state, box.state)
    box.env["JOBINFO_DEVICE_GLOB"] = src.env["JOBINFO_DEVICE_GLOB"]
    prom_file = box.tmp / "textfile" / "gpuguard_idle.prom"
    cycle(box, 18 * 60, [h.pid for h in lab[1]])

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = prom_file.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = free_port()
    (tmp_path / "prom.yml").write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ROOT / "etc/prometheus/gpuguard.rules.yml")],
        "scrape_configs": [{"job_name": "node", "static_configs": [
            {"targets": ["127.0.0.1:%d" % server.server_address[1]], "labels": {"instance": "lab-8gpu"}}]}]}))
    proc = subprocess.Popen([prometheus, "--config.file=%s" % (tmp_path / "prom.yml"),
                             "--storage.tsdb.path=%s" % (tmp_path / "tsdb"),
                             "--web.listen-address=127.0.0.1:%d" % port],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def query(expr):
        url = "http://127.0.0.1:%d/api/v1/query?%s" % (port, urllib.parse.urlencode({"query": expr}))
        try:
            with urllib.request.urlopen(url, timeout=3) as r:
                doc = json.loads(r.read())
        except OSError:
            return {}
        return {x["metric"].get("user"): float(x["value"][1]) for x in doc["data"]["result"]}

    try:
        assert wait_for(lambda: len(query("gpuguard_gpu_held_seconds_total")) == 2, timeout=90, step=0.5)
        assert query("gpuguard_gpu_held_seconds_total") == {"root": ROOT_HELD, "nobody": B1_HELD + B2_HELD}
        assert query("gpuguard_gpu_idle_held_seconds_total") == {"root": ROOT_IDLE, "nobody": B1_IDLE + B2_IDLE}
        # nobody's eval job idles on GPU 0 for one more cycle: the counter and the rule follow
        box.write_scenario([{"gpus": [idle_gpu(mem=20000), idle_gpu(mem=0)],
                             "apps": [app(lab[1][2].pid, gpu=0, mem=19800)]}], gpus=2)
        box.once(now=at(18, 10), env=env_for(box))
        assert wait_for(lambda: query("gpuguard_gpu_idle_held_seconds_total").get("nobody") ==
                        B1_IDLE + B2_IDLE + 600, timeout=60, step=0.5)
        assert wait_for(lambda: query("gpuguard:gpu_idle_held_hours:by_user_1d").get("nobody", 0) > 0,
                        timeout=60, step=0.5)
        rule = query("gpuguard:gpu_idle_held_hours:by_user_1d")
        assert rule["root"] == 0 and rule["nobody"] >= 600 / 3600
    finally:
        stop_processes([proc])
        server.shutdown()


@pytest.mark.parametrize("names", ["hash", "none"])
def test_metrics_follow_ledger_names_as_the_posts_do(box, names):
    """The textfile's user label (bash) and the digest's name (Python) are
    the same salted hash; with none, one series without a user."""
    box.write_scenario([{"gpus": [idle_gpu(mem=30000)], "apps": [app(os.getpid(), mem=29800)]}])
    textdir = box.tmp / "textfile"
    env = {"CHECK_INTERVAL": "60", "TZ": "UTC", "LEDGER_NAMES": names, "GPUGUARD_TEXTFILE_DIR": str(textdir)}
    for t in (0, 60, 120):
        box.once(now=at(10) + t, env=env)
    prom = (textdir / "gpuguard_idle.prom").read_text()
    s = json.loads(ledger(box, "--json", now=at(23), env=env))
    if names == "hash":
        (user,) = [u["user"] for u in s["users"]]
        assert re.fullmatch(r"u[0-9a-f]{8}", user) and user != "?"
        assert 'gpuguard_gpu_held_seconds_total{user="%s"} 120' % user in prom
        assert oct((box.state / "ledger" / "salt").stat().st_mode & 0o777) == "0o600"
    else:
        assert s["users"] == [] and 'gpuguard_gpu_held_seconds_total{user=""} 120' in prom


def test_week_trend_and_change_on_the_week_before(tmp_path, monkeypatch):
    """Two weeks of day files: the digest's trend line has the 7 days ending
    yesterday and the change on the 7 before (1 h a day, then 30 min)."""
    import gpuguard_ledger
    monkeypatch.setenv("TZ", "UTC")
    folder = tmp_path / "ledger"
    folder.mkdir()
    days = gpuguard_ledger.days_back("2026-12-02", 14)
    for n, day in enumerate(days):
        idle = H if n < 7 else H // 2
        (folder / f"{day}.tsv").write_text(
            f"# gpuguard ledger 1\nday\t{day}\nlast\t1\t1\n"
            f"job\talice\t1001\tslurm:77\t{2 * H}\t{idle}\t{idle}\t{at(12)}\t3\tpython a.py\n")
    env = {"GPUGUARD_STATE_DIR": str(tmp_path), "GPU_HOUR_PRICE": "0", "GPUGUARD_HOST": "h"}
    e = gpuguard_ledger.digest_event("2026-12-02", at(9, day=1), env)
    assert e["id"] == "ledger-2026-12-02" and e["cost"] is None and e["idle_s"] == H // 2
    assert [t["day"] for t in e["trend"]] == days[7:] and e["prev_idle_s"] == 7 * H
    _, lines = gpuguard_ledger.render_lines(e, "en")
    assert lines[-1] == ("Idle GPU-hours, last 7 days: 11-26 0.5 · 11-27 0.5 · 11-28 0.5 · 11-29 0.5 · "
                         "11-30 0.5 · 12-01 0.5 · 12-02 0.5; -50% on the 7 days before")
    assert "Slurm job 77 · python a.py" in lines[-2]
    _, zh = gpuguard_ledger.render_lines(e, "zh")
    assert zh[-1].endswith("12-02 0.5；比前 7 天 -50%") and "浪费" not in zh[0]


def test_a_long_period_starts_at_the_ledgers_first_day_and_its_trend_is_weekly(box):
    """`gpuguard ledger --since 1999-01-01` was cut to ten years without a
    word and its trend was one line of 3,650 days; `--since 90d` one of 90.
    The period starts at the ledger's first day (the header says so), and
    more than 14 days are shown a week at a time, the last week ending today.
    (This test once expected the 5 days before the five weeks drawn as a
    week, "10-24 1.0": a short oldest span read as a drop, and is left out.)"""
    ledger_dir = box.state / "ledger"
    ledger_dir.mkdir(parents=True)
    import gpuguard_ledger
    days = gpuguard_ledger.days_back("2026-12-02", 40)
    for n, day in enumerate(days):
        (ledger_dir / (day + ".tsv")).write_text(
            "# gpuguard ledger 1\nday\t%s\nlast\t1\t1\n"
            "job\talice\t1000\tslurm:42\t7200\t%d\t%d\t%d\t0\tpython3 train.py\n" % (day, 360 * n, 360 * n, at(12)))
    env = dict(env_for(box, {"GPU_HOUR_PRICE": "0"}), GPUGUARD_HOST="lab", GPUGUARD_NOW=str(at(18)))
    for since in ("1999-01-01", "90d"):
        r = box.run("ledger", "--since", since, cmd="bin/gpuguard", env=env)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == "[gpuguard DAILY] lab: GPU ledger %s \u2013 2026-12-02" % days[0], lines[0]
        # 40 days: five weeks and the 5 days before them (left out), idle 0.1 h
        # more each day (day n, from 0, idle 0.1 n h: 5-11 sum to 5.6 h, 33-39 to 25.2 h)
        assert lines[-1] == ("  Idle GPU-hours a week, last 5 weeks: 10-29 5.6 · 11-05 10.5 · 11-12 15.4 · "
                             "11-19 20.3 · 11-26 25.2"), lines[-1]
    r = box.run("ledger", "--since", "14d", cmd="bin/gpuguard", env=env)
    assert r.stdout.splitlines()[-1].startswith("  Idle GPU-hours, last 14 days: 11-19 2.6 · ")


def test_a_flat_ledger_shows_no_change_against_days_retention_removed(box):
    """35 kept days of exactly 1 idle GPU-hour each: `gpuguard ledger --since
    30d` said "+383% on the 30 days before" (its 29 h against the 6 h of the
    5 earlier days still kept) and drew the oldest 2 days as a week, "11-03
    2.0". The change is shown only when the period before is all kept, and
    the trend has whole weeks only."""
    import gpuguard_ledger
    ledger_dir = box.state / "ledger"
    ledger_dir.mkdir(parents=True)
    for day in gpuguard_ledger.days_back("2026-12-02", 36)[:-1]:
        (ledger_dir / (day + ".tsv")).write_text(
            "# gpuguard ledger 1\nday\t%s\nlast\t1\t1\n"
            "job\talice\t1000\tpid:5@1\t7200\t3600\t3600\t%d\t0\tpython train.py\n" % (day, at(12)))
    env = {"GPU_HOUR_PRICE": "0"}
    last = ledger(box, "--since", "30d", env=env).splitlines()[-1]
    assert last == ("  Idle GPU-hours a week, last 4 weeks: 11-05 7.0 · 11-12 7.0 · 11-19 7.0 · 11-26 6.0"), last
    assert json.loads(ledger(box, "--since", "30d", "--json", env=env))["prev_idle_s"] is None
    # 14 days and the 14 before are all kept: the change is shown (today has nothing yet)
    last = ledger(box, "--since", "14d", env=env).splitlines()[-1]
    assert last.endswith("12-01 1.0 · 12-02 0.0; -7% on the 14 days before"), last


def test_worst_incidents_over_several_days_say_their_day(box):
    """A Slurm job idle 30 minutes at noon three days running: `gpuguard
    ledger --since 7d` listed three identical "(until 12:00)" lines that read
    as one incident listed three times. Over more than one day each says its
    day, in English and in Chinese; a single day's lines stay as they were."""
    ledger_dir = box.state / "ledger"
    ledger_dir.mkdir(parents=True)
    for n, day in ((1, "2026-11-29"), (2, "2026-11-30"), (3, "2026-12-01")):
        (ledger_dir / (day + ".tsv")).write_text(
            "# gpuguard ledger 1\nday\t%s\nlast\t1\t1\n"
            "job\tbob\t1001\tslurm:42\t7200\t3600\t%d\t%d\t1\ttorchrun sft.py\n" % (day, 1800 + n, at(12, day=n - 4)))
    lines = ledger(box, "--since", "7d").splitlines()
    worst = lines[lines.index("  Worst incidents:") + 1:][:3]
    assert worst == ["  %d. GPU 1 idle for 30 min (%s, until 12:00): bob · Slurm job 42 · torchrun sft.py" % (n, day)
                     for n, day in ((1, "12-01"), (2, "11-30"), (3, "11-29"))], worst
    zh = ledger(box, "--since", "7d", env={"NOTIFY_LANG": "zh"})
    assert "1. GPU 1 连续空闲 30 分钟（12-01，至 12:00）：bob · Slurm 作业 42 · torchrun sft.py" in zh, zh
    # the ledger of 12-01 alone (today, at 18:00 that day)
    one = ledger(box, now=at(18, day=-1)).splitlines()
    assert one[one.index("  Worst incidents:") + 1] == (
        "  1. GPU 1 idle for 30 min (until 12:00): bob · Slurm job 42 · torchrun sft.py"), one


def test_digest_beside_an_idle_alert_in_one_post_names_its_day():
    import gpuguard_render
    event = {"id": "ledger-2026-12-02", "ts": at(9, day=1), "host": "lab", "event": "ledger_digest",
             "state": "firing", "severity": "info", "from": "2026-12-02", "to": "2026-12-02", "names": "user",
             "held_s": 7200, "idle_s": 3600, "cost": None, "users": [], "worst": [], "trend": []}
    alert = {"id": "x", "ts": at(9, day=1), "host": "lab", "event": "gpu_idle", "state": "firing", "gpu": 3,
             "uuid": "GPU-3", "utilization": 0, "idle_seconds": 600}
    title, sections = gpuguard_render.render_digest([alert, event], "zh", {})
    heads = [h for h, _ in sections]
    assert any(h.endswith("GPU 占用日报 2026-12-02：空闲占卡 1.0 GPU 时（共占用 2.0 GPU 时，其中 50% 空闲或卡死）")
               for h in heads), heads
    title, sections = gpuguard_render.render_digest([event], "en", {})
    assert title == "[gpuguard DAILY] lab: GPU ledger 2026-12-02"
    assert sections[0][0] == "1.0 GPU-hours held idle (50% of 2.0 GPU-hours held were idle or stuck)"
    assert gpuguard_render.alertmanager_alerts(event) == [] and not gpuguard_render._is_page(event)


@pytest.mark.slow
def test_kill9_at_random_points_counts_each_second_once(box):
    """Cron runs killed at random points (mid-sample, mid-journal, mid-save):
    with the cap out of the way, the ledger holds exactly the time between
    the first and the last clean run - nothing twice, nothing lost."""
    import random
    rng = random.Random(26)
    box.write_scenario([{"gpus": [idle_gpu(mem=30000)], "apps": []}])
    env = dict(box.env, CHECK_INTERVAL="6000", TZ="UTC")
    import time
    began = time.monotonic()
    box.once(now=at(10), env=env)
    run_s = time.monotonic() - began                      # kill points spread over a run, on any machine
    killed = 0
    for n in range(1, 41):
        was_killed, _ = run_killed_after([str(ROOT / "bin/yichuidingyin.sh"), "--once"],
                                         dict(env, GPUGUARD_NOW=str(at(10, n))), rng.uniform(0.05, 1.2) * run_s)
        killed += was_killed
    box.once(now=at(10, 41), env=env)
    s = json.loads(ledger(box, "--json", now=at(23), env={"TZ": "UTC"}))
    assert killed >= 5                                    # the kills did land
    assert s["held_s"] == s["idle_s"] == 41 * M


def test_a_damaged_day_file_is_said_not_shown_as_an_empty_day(box):
    """A day file overwritten with garbage read as a day nobody held a GPU,
    0.0 GPU-hours and no word of why."""
    ledger_dir = box.state / "ledger"
    ledger_dir.mkdir(parents=True)
    (ledger_dir / "2026-12-01.tsv").write_bytes(b"\x00\x00garbage\xff\n")
    r = box.run("ledger", "--since", "2026-12-01", cmd="bin/gpuguard",
                env=dict(env_for(box), GPUGUARD_NOW=str(at(18))))
    assert r.returncode == 0
    said = "ledger: %s is not the ledger of 2026-12-01 (damaged?): that day shows what is left of it" % (
        ledger_dir / "2026-12-01.tsv")
    assert r.stderr.count(said) == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    # an older day than the newest: the same line, from the reader of old days
    (ledger_dir / "2026-12-02.tsv").write_text("# gpuguard ledger 1\nday\t2026-12-02\nlast\t0\t0\n")
    r = box.run("ledger", "--since", "2026-12-01", cmd="bin/gpuguard",
                env=dict(env_for(box), GPUGUARD_NOW=str(at(18))))
    assert r.returncode == 0 and r.stderr.count(said) == 1 and len(r.stderr.splitlines()) == 1, r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("tz,day", [("Europe/Berlin", "2026-10-25"), ("America/New_York", "2026-11-01"),
                                    ("Europe/Berlin", "2026-03-29"), ("America/New_York", "2026-03-08")])
def test_each_morning_around_a_clock_change_sends_the_day_before_whole(box, tz, day):
    """On the morning clocks went back, "yesterday" (the time since midnight
    on the wall clock, less a second) was today: the digest of the day in
    progress went out at 09:00 and was marked sent, so the day before's never
    went, nor the whole 25-hour day's the morning after. Each morning now
    sends the day before, whole, fall-back and spring-forward alike."""
    import datetime
    from zoneinfo import ZoneInfo
    zone = ZoneInfo(tz)
    the_day = datetime.date.fromisoformat(day)
    before, after = the_day - datetime.timedelta(days=1), the_day + datetime.timedelta(days=1)
    start = int(datetime.datetime.combine(before, datetime.time(20), zone).timestamp())
    end = int(datetime.datetime.combine(after, datetime.time(12), zone).timestamp())
    step = 3 * H
    box.write_scenario([{"gpus": [idle_gpu(mem=30000)], "apps": []}])
    env = {"TZ": tz, "CHECK_INTERVAL": str(step), "LEDGER_DIGEST_AT": "09:00", "JOBINFO_DEVICE_GLOB": "/nonexistent*"}
    held = {}
    for t in range(start, end + 1, step):
        box.once(now=t, env=env)
        if t > start:                                   # the first cycle accounts nothing
            d = datetime.datetime.fromtimestamp(t, zone).date()
            held[d] = held.get(d, 0) + step
    sent = [(e["from"], datetime.datetime.fromtimestamp(e["ts"], zone).date(), e["held_s"])
            for e in box.events() if e["event"] == "ledger_digest"]
    assert sent == [(str(before), the_day, held[before]), (day, after, held[the_day])]


def test_two_jobs_on_one_gpu_are_both_booked_by_memory_share(box):
    """Root's idle 20 GB job beside nobody's 30 GB job on one H200: the
    ledger booked the GPU to the bigger holder only, so root's idle hour was
    in no ledger row, digest or per-user counter while the idle alert named
    both. Now the GPU's time is split by memory (2:3): each user is booked,
    and the GPU-hours still add up to the GPU's time."""
    dev = two_users_device(box)
    jobs = [Holder(dev, "root", "small.py"), Holder(dev, "nobody", "big.py")]
    try:
        box.write_scenario([{"gpus": [idle_gpu(mem=50000)],
                             "apps": [app(jobs[0].pid, mem=20000), app(jobs[1].pid, mem=30000)]}])
        textdir = box.tmp / "textfile"
        env = {"CHECK_INTERVAL": "60", "TZ": "UTC", "GPUGUARD_TEXTFILE_DIR": str(textdir)}
        for n in range(11):
            box.once(now=at(8, n), env=env)
        s = json.loads(ledger(box, "--json", now=at(8, 10), env=env))
        users = {u["user"]: (u["held_s"], u["idle_s"], u["longest_s"]) for u in s["users"]}
        assert users == {"root": (240, 240, 600), "nobody": (360, 360, 600)}
        assert s["held_s"] == s["idle_s"] == 600                # one GPU for 10 minutes
        assert sorted(w["user"] for w in s["worst"]) == ["nobody", "root"]
        prom = (textdir / "gpuguard_idle.prom").read_text()
        assert 'gpuguard_gpu_held_seconds_total{user="root"} 240' in prom
        assert 'gpuguard_gpu_idle_held_seconds_total{user="nobody"} 360' in prom
        text = ledger(box, now=at(8, 10), env=env)
        assert "root: idle 0.1 / held 0.1" in text and "nobody: idle 0.1 / held 0.1" in text
    finally:
        for j in jobs:
            j.stop()
        shutil.rmtree(os.path.dirname(dev), ignore_errors=True)


def test_a_folder_without_a_watchdog_ledger_says_so_as_status_does(box):
    """A user's `gpuguard ledger` after a root install reads the user's own
    state folder, where no watchdog runs: it printed "0.0 GPU-hours held",
    exit 0, without a word, while `gpuguard status` warned. Now the same
    caveat, on stderr and as "no_ledger" in --json; none once a watchdog
    keeps a ledger there."""
    box.write_scenario([{"gpus": [idle_gpu(mem=30000)], "apps": []}])
    said = "gpuguard ledger: no watchdog ledger in %s: no GPU time is booked there (" % box.state
    r = box.run("ledger", cmd="bin/gpuguard", env=env_for(box))
    assert r.returncode == 0 and "0.0 GPU-hours held" in r.stdout
    assert r.stderr.startswith(said) and len(r.stderr.splitlines()) == 1, r.stderr
    assert "GPUGUARD_STATE_DIR" in r.stderr
    status = box.run("status", cmd="bin/gpuguard", env=env_for(box)).stderr
    hint = r.stderr.split(" (", 1)[1]
    assert hint.replace("gpuguard ledger", "gpuguard status") in status        # one wording for both
    r = box.run("ledger", "--json", cmd="bin/gpuguard", env=env_for(box))
    assert r.returncode == 0 and json.loads(r.stdout)["no_ledger"] == r.stderr.split(": ", 1)[1].rstrip("\n")
    box.once(now=at(10), env=env_for(box))
    r = box.run("ledger", "--json", cmd="bin/gpuguard", env=dict(env_for(box), GPUGUARD_NOW=str(at(10))))
    assert r.returncode == 0 and r.stderr == "" and json.loads(r.stdout)["no_ledger"] is None


def test_the_reports_ledger_says_no_watchdog_keeps_one_here(box, tmp_path):
    """`gpuguard report` in a state folder no watchdog books time in: its
    ledger section read "No GPU was held in this period", which is no
    fact. It says what `gpuguard ledger` says; once a watchdog keeps the
    ledger, nothing."""
    box.write_scenario([{"gpus": [idle_gpu(mem=30000)], "apps": []}])
    out = tmp_path / "r.html"
    r = box.run("report", "--out", str(out), cmd="bin/gpuguard", env=env_for(box))
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    assert "id='no-ledger'>no watchdog ledger in %s: no GPU time is booked there" % html.escape(str(box.state)) \
        in page
    box.once(now=at(10), env=env_for(box))
    r = box.run("report", "--out", str(out), cmd="bin/gpuguard", env=dict(env_for(box), GPUGUARD_NOW=str(at(10))))
    assert r.returncode == 0, r.stderr
    assert "no-ledger" not in out.read_text()


def test_hashed_names_without_the_salt_are_said_not_made_up(tmp_path):
    """LEDGER_NAMES=hash, the ledger made readable to users, the salt kept
    0600: a user's every `gpuguard ledger` made a new salt and showed new
    pseudonyms that looked real and matched nothing. Now one line says the
    salt cannot be read, no per-user names are shown, and the salt stays
    the watchdog's."""
    require(os.geteuid() == 0, "a second user (nobody) reading root's ledger")
    box = Box(tmp_path)
    shared = tempfile.mkdtemp(prefix="gg-ledger-salt-")
    try:
        os.chmod(shared, 0o755)
        state = os.path.join(shared, "state")
        env = dict(env_for(box), GPUGUARD_STATE_DIR=state, LEDGER_NAMES="hash", CHECK_INTERVAL="60",
                   JOBINFO_DEVICE_GLOB="/nonexistent*", GPUGUARD_TEXTFILE_DIR=os.path.join(shared, "textfile"))
        box.write_scenario([{"gpus": [idle_gpu(mem=30000)], "apps": [app(os.getpid(), mem=29800)]}])
        for t in (0, 60, 120):
            box.once(now=at(10) + t, env=env)
        salt = os.path.join(state, "ledger", "salt")
        before = open(salt).read()
        root_view = json.loads(ledger(box, "--json", now=at(11), env=env))
        assert re.fullmatch(r"u[0-9a-f]{8}", root_view["users"][0]["user"]) and root_view.get("names_problem") is None
        for folder in (state, os.path.join(state, "ledger")):
            os.chmod(folder, 0o755)
        os.chmod(box.scenario.parent, 0o755)
        user = user_environ(PATH=box.env["PATH"], HOME="/", LANG="C.UTF-8", GPUGUARD_CONFIG="/dev/null", TZ="UTC",
                            GPUGUARD_STATE_DIR=state, LEDGER_NAMES="hash", GPUGUARD_NOW=str(at(11)))
        nobody = pwd.getpwnam("nobody")
        for _ in range(2):
            r = subprocess.run([str(ROOT / "bin/gpuguard"), "ledger", "--json"], env=user, user=nobody.pw_uid,
                               group=nobody.pw_gid, capture_output=True, text=True, cwd="/", check=False)
            assert r.returncode == 0, r.stderr
            s = json.loads(r.stdout)
            assert s["users"] == [] and s["names"] == "none" and s["held_s"] == 120
            assert all(w["user"] is None for w in s["worst"]) and all(j["user"] is None for j in s["jobs"])
            assert r.stderr == "gpuguard: ledger: %s\n" % s["names_problem"]
            assert "cannot read the salt %s (Permission denied)" % salt in r.stderr
        r = subprocess.run([str(ROOT / "bin/gpuguard"), "ledger"], env=user, user=nobody.pw_uid,
                           group=nobody.pw_gid, capture_output=True, text=True, cwd="/", check=False)
        assert r.returncode == 0 and not re.search(r"\bu[0-9a-f]{8}\b", r.stdout) and "0.0 / held 0.0" not in r.stdout
        assert open(salt).read() == before and os.stat(salt).st_uid == 0
    finally:
        shutil.rmtree(shared, ignore_errors=True)
