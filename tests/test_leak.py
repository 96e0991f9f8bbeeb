"""gpu-leak-watch: the detector on the shapes that fool naive rules, the
replay CLI, and the live watcher on a real local process tree."""
import io
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import gpuguard_history as gg_history
import gpuguard_leak as leak
import gpuguard_leakstat as leakstat
import pytest
from conftest import ROOT, start_daemon, stop_daemon, user_environ, wait_for

sys.path.insert(0, str(ROOT / "bench"))
import leak as bench


def firing_times(trace, **params):
    p = dict(leakstat.DEFAULTS, **params)
    s = leakstat.Series(p, "k", 1)
    out = []
    for t, v in trace:
        ev = s.add(t, v, 40000)
        if ev:
            out.append((ev["state"], t))
    return out


# ------------------------------------------------------------ statistics --

def test_mann_kendall_and_theil_sen_known_values():
    assert leakstat.mann_kendall_z([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]) == pytest.approx(3.9354, abs=1e-3)
    assert leakstat.mann_kendall_z([5] * 10) == 0.0
    assert leakstat.mann_kendall_z(list(range(10, 0, -1))) < -3.9
    assert leakstat.theil_sen([0, 1, 2, 3, 4], [0, 2, 4, 100, 8]) == 2.0     # an outlier does not move it


@pytest.mark.parametrize("kind", bench.CLEAN)
def test_quiet_on_clean_training_shapes(kind):
    for seed in range(3):
        rng = random.Random(1000 + seed)
        trace = bench.base_trace(rng, 24, kind)
        assert firing_times(trace) == [], (kind, seed)


@pytest.mark.parametrize("rate", [60, 200, 500])
def test_catches_steady_leaks_hours_before_oom(rate):
    rng = random.Random(rate)
    trace = bench.add_leak(bench.base_trace(rng, 12, "plateau"), rate, 2.0)
    events = firing_times(trace)
    assert events and events[0][0] == "firing"
    delay_h = events[0][1] / 3600 - 2.0
    assert 0 < delay_h < 5
    assert bench.HEADROOM / rate - delay_h > 30     # long before 20 GiB run out


def test_catches_staircase_leak_that_step_cutting_alone_misses():
    rng = random.Random(5)
    trace = bench.add_leak(bench.base_trace(rng, 10, "plateau"), 600, 2.0, staircase=True)
    assert firing_times(trace)[0][0] == "firing"


def test_leak_then_plateau_resolves():
    trace = [(t * 60.0, 20000 + (min(t, 600) * 60 // 60 // 20) * 20) for t in range(1200)]
    states = [s for s, _ in firing_times(trace)]
    assert states == ["firing", "resolved"]


def test_below_threshold_growth_is_not_a_leak_and_rules_raise_it():
    rng = random.Random(9)
    trace = bench.add_leak(bench.base_trace(rng, 12, "plateau"), 100, 2.0)
    assert firing_times(trace, threshold=150) == []
    assert firing_times(trace, threshold=50) != []


# ---------------------------------------------------------------- replay --

def write_csv(path, rows, pid=4242):
    with open(path, "w") as f:
        f.write("timestamp,pid,used_memory_mib\n")
        f.writelines("%d,%d,%d\n" % (1796206508 + t, pid, v) for t, v in rows)


def run(args, env=None, **kw):
    full = user_environ(GPUGUARD_CONFIG="/dev/null")
    full.update(env or {})
    return subprocess.run([str(ROOT / "bin/gpu-leak-watch")] + args, env=full, text=True,
                          capture_output=True, timeout=120, **kw)


def test_replay_prints_one_json_line_per_event(tmp_path):
    rng = random.Random(3)
    leaking = bench.add_leak(bench.base_trace(rng, 10, "sawtooth"), 120, 2.0)
    csv_path = tmp_path / "trace.csv"
    write_csv(csv_path, leaking)
    r = run(["--replay", str(csv_path), "--gpu-total-mib", "143771"],
            env={"GPUGUARD_STATE_DIR": str(tmp_path / "s")})
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert events[0]["state"] == "firing"
    assert set(events[0]) >= {"ts", "event", "state", "pid", "slope_mib_per_hour", "used_memory_mib",
                              "projected_oom_hours"}
    assert events[0]["event"] == "gpu_memory_leak" and events[0]["pid"] == 4242
    assert 80 <= events[0]["slope_mib_per_hour"] <= 160
    free = 143771 - events[0]["used_memory_mib"]
    assert events[0]["projected_oom_hours"] == pytest.approx(free / events[0]["slope_mib_per_hour"], rel=0.01)
    assert not (tmp_path / "s" / "events.jsonl").exists()       # a replay pages nobody


def test_a_fast_fill_projects_its_oom_in_seconds_not_zero_hours(tmp_path):
    """The H200 fill (600 MiB/s) alerted 96 s before OOM with
    projected_oom_hours 0.0: the figure must say how little time is left."""
    rows = [(t, 600 + 600 * t) for t in range(236)]
    csv_path = tmp_path / "fill.csv"
    write_csv(csv_path, rows)
    r = run(["--replay", str(csv_path), "--gpu-total-mib", "143771"],
            env={"GPUGUARD_STATE_DIR": str(tmp_path / "s")})
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout.splitlines()[0])
    assert first["state"] == "firing" and first["severity"] == "critical"
    free = 143771 - first["used_memory_mib"]
    seconds_left = 3600 * free / first["slope_mib_per_hour"]
    assert 30 < seconds_left < 200
    assert 3600 * first["projected_oom_hours"] == pytest.approx(seconds_left, rel=0.05)


def test_replay_of_clean_trace_prints_no_event_and_a_summary(tmp_path):
    csv_path = tmp_path / "clean.csv"
    write_csv(csv_path, bench.base_trace(random.Random(4), 24, "mixed"))
    r = run(["--replay", str(csv_path)], env={"GPUGUARD_STATE_DIR": str(tmp_path / "s")})
    assert r.returncode == 0 and r.stdout == ""
    assert r.stderr.startswith("gpu-leak-watch: replayed 1440 samples, 1 series, 24.0 h: 0 events; 4242: no leak")


def test_replay_bad_input_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("time,pid,mem\n1,2,3\n")
    r = run(["--replay", str(bad)], env={"GPUGUARD_STATE_DIR": str(tmp_path / "s")})
    assert r.returncode == 2
    assert r.stderr.strip() == "gpu-leak-watch: %s: missing column(s) timestamp,used_memory_mib (need timestamp,pid,used_memory_mib)" % bad
    bad.write_text("timestamp,pid,used_memory_mib\n1,2,lots\n")
    r = run(["--replay", str(bad)], env={"GPUGUARD_STATE_DIR": str(tmp_path / "s")})
    assert r.returncode == 2 and "bad.csv:2: not a number" in r.stderr
    r = run(["--replay", str(tmp_path / "missing.csv")], env={"GPUGUARD_STATE_DIR": str(tmp_path / "s")})
    assert r.returncode == 2 and "cannot read" in r.stderr
    # a folder given by mistake: said as one, not as Python's errno text
    r = run(["--replay", str(tmp_path)], env={"GPUGUARD_STATE_DIR": str(tmp_path / "s")})
    assert (r.returncode, r.stderr) == (2, "gpu-leak-watch: %s is a folder; --replay takes a CSV file\n" % tmp_path)


def test_replay_needs_no_state_folder(tmp_path):
    # a replay reads its CSV and prints: it had refused to run ("state folder
    # ... is not writable", exit 2) where the state folder could not be made,
    # as for user nobody (HOME=/nonexistent) after a root install
    (tmp_path / "a-file").write_text("")
    unusable = {"GPUGUARD_STATE_DIR": str(tmp_path / "a-file" / "state")}   # not even root can make it
    csv_path = tmp_path / "trace.csv"
    write_csv(csv_path, [(60 * i, 20000 + 3 * i) for i in range(720)])        # +180 MiB/h for 12 h
    r = run(["--replay", str(csv_path)], env=unusable)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["state"] == "firing"
    assert r.stderr.startswith("gpu-leak-watch: replayed 720 samples, 1 series, 12.0 h: 1 events; 4242: leak +180")
    # the watcher keeps its state there: it still says so
    r = run(["--all", "--once"], env=unusable)
    assert r.returncode == 2 and "is not writable" in r.stderr


def test_replay_of_a_file_that_is_not_utf8_text_names_it_and_the_line(tmp_path):
    """Before: "'utf-8' codec can't decode byte 0xff in position 31", with
    neither the file nor the line."""
    import gzip
    env = {"GPUGUARD_STATE_DIR": str(tmp_path / "s")}
    bad = tmp_path / "latin1.csv"
    bad.write_bytes(b"timestamp,pid,used_memory_mib\n1796206508,1,5\n1796206509,1,5 caf\xe9\n")
    r = run(["--replay", str(bad)], env=env)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", "gpu-leak-watch: %s:3: not UTF-8 text (byte 0xe9)\n" % bad)
    packed = tmp_path / "trace.csv.gz"
    packed.write_bytes(gzip.compress(b"timestamp,pid,used_memory_mib\n1796206508,1,5\n"))
    r = run(["--replay", str(packed)], env=env)
    assert (r.returncode, r.stderr) == (2, "gpu-leak-watch: %s:1: not text but gzip-compressed: gunzip it first "
                                           "(zcat %s > FILE.csv)\n" % (packed, packed))


@pytest.mark.parametrize("ts", ["99999999999999999999", "1796206510000", "-5"])
def test_replay_of_an_impossible_timestamp_is_exit_2_naming_the_line(tmp_path, ts):
    """Before, 99999999999999999999 was taken: the summary said
    27777777777278824.0 h."""
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,pid,used_memory_mib\n1796206508,1,5\n1796206509,1,5\n%s,1,5\n" % ts)
    r = run(["--replay", str(bad)], env={"GPUGUARD_STATE_DIR": str(tmp_path / "s")})
    assert (r.returncode, r.stdout, r.stderr) == (
        2, "", "gpu-leak-watch: %s:4: timestamp %s is not Unix time in seconds\n" % (bad, ts))


def test_replay_leaves_out_nvidia_smi_garbage_memory_and_says_so(tmp_path):
    """18446744073709551615 (unsigned -1) is what a glitching nvidia-smi
    prints; the live path takes such a sample as unknown. Before, the
    replay took it as 16 EiB in use, silently."""
    rows = [(t, 3000) for t in range(60)]
    trace = tmp_path / "trace.csv"
    write_csv(trace, rows)
    text = trace.read_text().splitlines()
    text[31] = "1796206538,4242,18446744073709551615"
    trace.write_text("\n".join(text) + "\n")
    r = run(["--replay", str(trace)], env={"GPUGUARD_STATE_DIR": str(tmp_path / "s")})
    assert (r.returncode, r.stdout) == (0, ""), r.stderr
    assert r.stderr.startswith("gpu-leak-watch: replayed 59 samples, 1 series")
    assert r.stderr.endswith("; skipped 1 row with an impossible used_memory_mib (over 16777216 MiB; first %s:32)\n"
                             % trace)


@pytest.mark.parametrize("args,message", [
    ([], "say what to watch"),
    (["--pid", "abc"], "--pid needs a process ID (got 'abc')"),
    (["--match", "(unclosed"], "--match: invalid regular expression '(unclosed'"),
    (["--interval", "0", "--all"], "--interval needs a whole number of at least 1 (at most 10^15) (got '0')"),
    (["--on-leak", "explode", "--all"], "--on-leak takes notify, kill or signal:NAME (got 'explode')"),
    # said at start, not as "could not signal PID" when the leak comes
    (["--on-leak", "signal:FOO", "--all", "--once"], "--on-leak signal:FOO: no such signal (kill -l lists them)"),
    (["--on-leak", "signal:99", "--all", "--once"], "--on-leak signal:99: no such signal (kill -l lists them)"),
    (["--on-leak", "signal:0", "--all", "--once"], "--on-leak signal:0: no such signal (kill -l lists them)"),
    (["--on-leak", "signal:FOO", "--", "true"], "--on-leak signal:FOO: no such signal (kill -l lists them)"),
    (["--"], "nothing to run after --"),
])
def test_bad_usage_exit_2(tmp_path, args, message):
    r = run(args, env={"GPUGUARD_STATE_DIR": str(tmp_path)})
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.splitlines()) == 1


# ------------------------------------------------------------------ live --

class Job:
    """A launcher (bash) whose child (sleep) 'holds' GPU memory."""

    def __init__(self, tmp_path, trap_usr1=False):
        script = "trap 'echo got-usr1 > %s' USR1; " % (tmp_path / "usr1") if trap_usr1 else ""
        self.proc = subprocess.Popen(["bash", "-c", script + "sleep 600 & wait; wait"],
                                     start_new_session=True)
        assert wait_for(lambda: self.child() is not None)

    def child(self):
        r = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True)
        return int(r.stdout.split()[0]) if r.stdout.split() else None

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def leak_scenario(box, pid, steps=40, per_step=64, name="python3"):
    box.write_scenario([{"gpus": [{"utilization.gpu": 90, "memory.used": 3000 + per_step * i + 500,
                                   "power.draw": 500.0}],
                         "apps": [{"pid": pid, "process_name": name, "used_memory": 3000 + per_step * i}]}
                        for i in range(steps)])


def watch_cycles(box, args, n, env=None):
    out = ""
    for i in range(n):
        e = dict(env or {}, GPUGUARD_NOW=str(1796206508 + i))
        r = box.run(*(args + ["--bucket", "1", "--once"]), cmd="bin/gpu-leak-watch", env=e)
        assert r.returncode == 0, r.stderr
        out += r.stderr
    return out


def test_live_watch_follows_the_tree_and_alerts_with_context(box, tmp_path, sink):
    job = Job(tmp_path)
    try:
        leak_scenario(box, job.child())
        (tmp_path / "logging.jsonl").write_text("".join(json.dumps({"loss": 0.5 + 0.001 * (i % 3), "global_step": i}) + "\n"
                                                       for i in range(60)))
        watch_cycles(box, ["--pid", str(job.proc.pid), "--loss-log", str(tmp_path / "logging.jsonl")], 30,
                     env={"NOTIFY_URL": sink.url + "/generic", "GPUGUARD_TEXTFILE_DIR": str(tmp_path / "prom")})
    finally:
        job.stop()
    (event,) = [e for e in box.events() if e["event"] == "gpu_memory_leak"]
    assert event["state"] == "firing" and event["pid"] == job.proc.pid
    assert event["name"] == "bash" and event["host"]
    assert event["slope_mib_per_hour"] > 50 and event["projected_oom_hours"] > 0
    assert event["free_memory_mib"] < 143771 and event["loss_plateau"] is True
    assert sink.requests[0]["body"]["events"][0]["event"] == "gpu_memory_leak"
    assert "GPU memory leak suspected" in sink.requests[0]["body"]["message"]
    prom = (tmp_path / "prom" / ("gpuguard_leak-pid-%d.prom" % job.proc.pid)).read_text()
    label = '{pid="%d",name="bash",watcher="pid-%d"}' % (job.proc.pid, job.proc.pid)
    assert 'gpuguard_process_leak%s 1' % label in prom
    history = list((box.state / "history").glob("%d-*.csv" % job.proc.pid))
    # the history records the GPU's used and total memory, so a replay of it
    # knows the capacity
    assert len(history) == 1 and history[0].read_text().startswith(gg_history.HISTORY_HEADER + "\n")
    assert prom.count("gpuguard_process_leak_slope_mib_per_hour{") == 1
    slope = float(prom.split('gpuguard_process_leak_slope_mib_per_hour%s ' % label)[1].split()[0])
    assert slope == pytest.approx(event["slope_mib_per_hour"], rel=0.5) and slope > 50
    # a warning (2), not a page: the job never gave memory back, so its
    # level is the reserved pool, and the slow tier does not page it
    assert event["severity"] == "warning"
    assert 'gpuguard_process_leak_severity%s 2' % label in prom


def test_steady_memory_does_not_alert(box, tmp_path):
    job = Job(tmp_path)
    try:
        leak_scenario(box, job.child(), per_step=0)
        watch_cycles(box, ["--pid", str(job.proc.pid)], 30)
    finally:
        job.stop()
    assert box.events() == []


def test_match_watches_the_topmost_matching_process(box, tmp_path):
    job = Job(tmp_path)
    try:
        leak_scenario(box, job.child())
        watch_cycles(box, ["--match", "^bash -c .*sleep 600"], 28)
    finally:
        job.stop()
    assert [e["pid"] for e in box.events()] == [job.proc.pid]


def test_rules_exempt_a_pattern(box, tmp_path):
    rules = tmp_path / "rules"
    rules.write_text("# LongLoRA grows its context on purpose\nsleep\\s600 ignore\n")
    job = Job(tmp_path)
    try:
        leak_scenario(box, job.child())
        watch_cycles(box, ["--all", "--rules", str(rules)], 30)
    finally:
        job.stop()
    assert box.events() == []


def test_rules_edited_into_a_bad_state_mid_run_are_one_warning_and_the_old_ones_stay(tmp_path):
    """The watcher checks the rules at start; a file edited badly while it
    runs used to fail every cycle of the detector (no analysis at all)."""
    rules = tmp_path / "rules"
    rules.write_text("train\\.py ignore\n")
    env = {"GPUGUARD_STATE_DIR": str(tmp_path), "GPUGUARD_HOST": "h", "LEAK_RULES": str(rules)}
    out = []
    for i in range(6):
        if i == 2:
            rules.write_text("train\\.py ignore\n[bad( 30\n")
        if i == 4:
            rules.unlink()
        buf = io.StringIO()
        leak.check(env, io.StringIO(rising_tree("10-1", 1796206508 + 60 * i, 3000 + 100 * i)), buf)
        out += buf.getvalue().splitlines()
    assert [line.split("\t")[5] for line in out if line.startswith("status\t")] == ["none"] * 6   # still ignored
    assert [line for line in out if line.startswith("warn\t")] == [
        "warn\t%s:2: bad regex: unterminated character set at position 0; the rules read before stay in force"
        % rules,
        "warn\tcannot read rules file %s (no such file); the rules read before stay in force" % rules]


def test_on_leak_signal_is_sent_to_the_root(box, tmp_path):
    job = Job(tmp_path, trap_usr1=True)
    try:
        leak_scenario(box, job.child())
        watch_cycles(box, ["--pid", str(job.proc.pid), "--on-leak", "signal:USR1"], 28)
        assert wait_for(lambda: (tmp_path / "usr1").exists(), timeout=30)
    finally:
        job.stop()


def once_at(box, args, now, env=None):
    """One cron run of gpu-leak-watch ARGS --once at the time NOW."""
    e = dict(env or {}, GPUGUARD_NOW=str(now), LEAK_INTERVAL="1")
    r = box.run(*(args + ["--bucket", "1", "--once"]), cmd="bin/gpu-leak-watch", env=e)
    assert r.returncode == 0, r.stderr
    return r.stderr


def watched_by_all(box, pid):
    """True when the --all watcher's detector state has a series of PID."""
    try:
        state = json.loads((box.state / "leak-state-all.json").read_text())
    except (OSError, ValueError):
        return False
    return any(s["pid"] == pid for s in state["series"].values())


@pytest.mark.slow  # 74 cron runs
def test_cron_all_and_pid_once_runs_alert_one_leak_once(box, tmp_path, sink):
    """Two cron lines, `gpu-leak-watch --all --once` and `gpu-leak-watch
    --pid N --once`, both followed the job (a --once run holds no lock for
    the other to see), and one leak was alerted twice: two firing events,
    two chat messages, two resolutions. The --pid runs leave a claim that
    the --all runs honour while it is fresh: one alert, one resolution."""
    job = Job(tmp_path)
    env = {"NOTIFY_URL": sink.url + "/generic"}
    t0 = 1796206508
    try:
        leak_scenario(box, job.child(), steps=80)
        # --all first: it sees the job before any claim exists
        for i in range(36):
            for args in (["--all"], ["--pid", str(job.proc.pid)]):
                once_at(box, args, t0 + i, env)
    finally:
        job.stop()
    box.write_scenario([{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}], "apps": []}])
    for args in (["--all"], ["--pid", str(job.proc.pid)]):
        once_at(box, args, t0 + 36, env)
    leaks = [(e["state"], e["pid"]) for e in box.events() if e["event"] == "gpu_memory_leak"]
    assert leaks == [("firing", job.proc.pid), ("resolved", job.proc.pid)], leaks
    sent = [(e["state"], e["pid"]) for r in sink.requests for e in r["body"]["events"]
            if e["event"] == "gpu_memory_leak"]
    assert sent == leaks
    # the job ended: its claim went with it
    assert not list(box.state.glob("leak-claim-*"))


@pytest.mark.slow  # 30 cron runs
def test_the_all_runs_take_a_job_over_once_its_pid_runs_stop(box, tmp_path):
    """The --pid cron line removed, its claim goes stale after three of its
    own intervals (the gap between its runs: cron's schedule) and the --all
    runs watch the job again, saying so once; the --pid line back, they
    leave it again. The --pid runs never stop watching for the --all ones."""
    job = Job(tmp_path)
    child, root = job.child(), job.proc.pid
    t0 = 1796206508
    claim = box.state / ("leak-claim-pid-%d" % root)
    try:
        leak_scenario(box, child, steps=200, per_step=0)
        for i in range(3):
            once_at(box, ["--all"], t0 + i)
            once_at(box, ["--pid", str(root)], t0 + i)
        assert claim.exists() and not watched_by_all(box, child)
        # the --pid line removed: the claim is fresh for 3 of its 1-second
        # intervals after its last run (t0 + 2)
        for t in (t0 + 3, t0 + 4, t0 + 5):
            once_at(box, ["--all"], t)
            assert not watched_by_all(box, child), t - t0
        log = once_at(box, ["--all"], t0 + 6)
        assert watched_by_all(box, child)
        assert "watching the processes the watcher pid-%d claimed again" % root in log, log
        assert not claim.exists()                  # a stale claim is swept
        once_at(box, ["--all"], t0 + 7)
        # the --pid line back, run every minute: the --all runs leave the
        # job again, for three minutes after its last run
        for t in (t0 + 60, t0 + 120):
            once_at(box, ["--pid", str(root)], t)
            once_at(box, ["--all"], t)
            assert not watched_by_all(box, child)
        assert claim.read_text().split()[1] == "60"
        once_at(box, ["--all"], t0 + 120 + 180)
        assert not watched_by_all(box, child)
        once_at(box, ["--all"], t0 + 120 + 181)
        assert watched_by_all(box, child)
        # the --all line removed: the --pid runs watch on, as they always did
        rows = history_rows_of(box, root)
        once_at(box, ["--pid", str(root)], t0 + 400)
        assert history_rows_of(box, root) == rows + 1
    finally:
        job.stop()


def pid_runs_then_all_runs(box, job, env, t0, between=None):
    """A leaking job watched by 30 cron runs of `--pid` (the launcher), then,
    that line removed, by 44 of `--all`; `between` runs in the gap."""
    leak_scenario(box, job.child(), steps=90)
    for i in range(30):
        once_at(box, ["--pid", str(job.proc.pid)], t0 + i, env)
    if between:
        between()
    for i in range(30, 74):
        once_at(box, ["--all"], t0 + i, env)


@pytest.mark.slow  # 75 cron runs
def test_the_all_runs_take_over_a_claimed_job_with_its_history(box, tmp_path, sink):
    """The --pid cron line that alerted a leak removed, the --all runs took
    the job over from nothing: hours blind to it (a new series), then the
    same leak alerted a second time. They take the series the --pid runs
    kept: the leak stays one incident (one firing, one resolution), and the
    --all runs go on from its floors."""
    job = Job(tmp_path)
    env = {"NOTIFY_URL": sink.url + "/generic"}
    t0 = 1796206508
    child = job.child()
    try:
        pid_runs_then_all_runs(box, job, env, t0)
        state = json.loads((box.state / "leak-state-all.json").read_text())
        (series,) = [s for s in state["series"].values() if s["pid"] == child]
        assert series["firing"]
    finally:
        job.stop()
    box.write_scenario([{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}], "apps": []}])
    once_at(box, ["--all"], t0 + 74, env)
    leaks = [(e["state"], e["pid"]) for e in box.events() if e["event"] == "gpu_memory_leak"]
    assert leaks == [("firing", job.proc.pid), ("resolved", child)], leaks
    sent = [(e["state"], e["pid"]) for r in sink.requests for e in r["body"]["events"]
            if e["event"] == "gpu_memory_leak"]
    assert sent == leaks


@pytest.mark.slow  # 74 cron runs
def test_a_reused_pid_is_not_handed_another_jobs_series(box, tmp_path, sink):
    """A series kept by a removed cron line matches the job the --all runs
    now see by its PIDs only: when the process that series named (its
    launcher, by PID and start time) is not the one running now, a PID
    was reused, and the new job is judged on its own: its leak is alerted,
    not taken as the old job's alert standing."""
    job = Job(tmp_path)
    root = job.proc.pid

    def as_if_an_earlier_process_had_this_pid():
        path = box.state / ("leak-state-pid-%d.json" % root)
        text = path.read_text()
        (key,) = json.loads(text)["series"]
        path.write_text(text.replace('"%s"' % key, '"%d-1"' % root))

    try:
        pid_runs_then_all_runs(box, job, {"NOTIFY_URL": sink.url + "/generic"}, 1796206508,
                               as_if_an_earlier_process_had_this_pid)
        leaks = [(e["state"], e["pid"]) for e in box.events() if e["event"] == "gpu_memory_leak"]
        assert leaks == [("firing", root), ("firing", job.child())], leaks
    finally:
        job.stop()


@pytest.mark.slow  # 75 cron runs
def test_the_all_runs_take_over_one_leaking_rank_of_two_without_a_second_alert(box, tmp_path, sink):
    """Two ranks under one launcher, one leaking: the --pid runs alert the
    tree naming the rank; taken over by the --all runs (which watch each
    process on its own), the leaking rank's alert stands (no second one)
    and the flat rank is never alerted."""
    proc = subprocess.Popen(["bash", "-c", "sleep 600 & sleep 600 & wait"], start_new_session=True)
    kids = lambda: subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert wait_for(lambda: len(kids()) == 2)
    leaky, flat = (int(p) for p in kids())
    env = {"NOTIFY_URL": sink.url + "/generic"}
    t0 = 1796206508
    try:
        box.write_scenario([{"gpus": [{"utilization.gpu": 90, "memory.used": 9000 + 64 * i, "power.draw": 500.0}],
                             "apps": [{"pid": leaky, "process_name": "python3", "used_memory": 3000 + 64 * i},
                                      {"pid": flat, "process_name": "python3", "used_memory": 3000}]}
                            for i in range(90)])
        for i in range(30):
            once_at(box, ["--pid", str(proc.pid)], t0 + i, env)
        fired = [e for e in box.events() if e["event"] == "gpu_memory_leak"]
        assert [(e["state"], e.get("leaking_pid")) for e in fired] == [("firing", leaky)]
        for i in range(30, 74):
            once_at(box, ["--all"], t0 + i, env)
        assert watched_by_all(box, leaky) and watched_by_all(box, flat)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    leaks = [e["state"] for e in box.events() if e["event"] == "gpu_memory_leak"]
    assert leaks == ["firing"], leaks


@pytest.mark.slow  # a daemon and cron runs for some seconds
def test_a_match_daemon_beside_the_all_runs_leaves_one_watcher_per_job(box, tmp_path):
    """A `--match` daemon holds no lock the `--all` watcher reads, so both
    followed the job and each leak was alerted twice. The daemon leaves a
    claim every cycle: the `--all` runs leave the job to it while it runs,
    and take the job over at once when it stops."""
    job = Job(tmp_path)
    child = job.child()
    daemon = None
    try:
        leak_scenario(box, child, steps=400, per_step=0)
        daemon = start_daemon(box, env={"LEAK_INTERVAL": "1"}, cmd="bin/gpu-leak-watch",
                              args=["--match", "^bash -c .*sleep 600", "--bucket", "1"])
        # the daemon's first cycle recorded the job's root
        assert wait_for(lambda: history_rows_of(box, job.proc.pid) > 0, timeout=30)
        for _ in range(3):
            r = box.run("--all", "--bucket", "1", "--once", cmd="bin/gpu-leak-watch", env={"LEAK_INTERVAL": "1"})
            assert r.returncode == 0, r.stderr
            assert not watched_by_all(box, child)
        _, _, err = stop_daemon(daemon)
        daemon = None
        assert not list(box.state.glob("leak-claim-*")), err
        r = box.run("--all", "--bucket", "1", "--once", cmd="bin/gpu-leak-watch", env={"LEAK_INTERVAL": "1"})
        assert r.returncode == 0, r.stderr
        assert watched_by_all(box, child)
    finally:
        if daemon is not None:
            daemon.kill()
            daemon.wait()
        job.stop()


def history_rows_of(box, pid):
    files = list((box.state / "history").glob("%d-*.csv" % pid))
    return len(files[0].read_text().splitlines()) if files else 0


def test_on_leak_kill_stops_the_whole_tree(box, tmp_path):
    job = Job(tmp_path)
    child = job.child()
    try:
        leak_scenario(box, child)
        watch_cycles(box, ["--pid", str(job.proc.pid), "--on-leak", "kill", "--grace", "2"], 28)
        assert wait_for(lambda: job.proc.poll() is not None, timeout=30)
        assert not os.path.exists("/proc/%d" % child) or \
            open("/proc/%d/stat" % child).read().split(") ")[1].startswith("Z")
    finally:
        job.stop()


def test_run_a_job_and_exit_with_its_status(box):
    box.write_scenario([{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}], "apps": []}])
    start = time.time()
    r = box.run("--interval", "30", "--", "bash", "-c", "sleep 1; exit 7", cmd="bin/gpu-leak-watch")
    assert r.returncode == 7, r.stderr
    # the wrapper ends with the job, not after the watcher's 30 s interval
    # (a bound far from both, so a loaded machine cannot fail it)
    assert time.time() - start < 25
    assert "ended with status 7" in r.stderr


def test_history_is_bounded(box, tmp_path):
    job = Job(tmp_path)
    env = {"LEAK_HISTORY_MAX_ROWS": "100"}
    try:
        leak_scenario(box, job.child(), per_step=0)
        watch_cycles(box, ["--pid", str(job.proc.pid)], 1, env=env)
        path = next((box.state / "history").glob("*.csv"))
        # the row count lives in the state (a cycle never re-reads the
        # history); without a state it is counted once
        path.write_text(gg_history.HISTORY_HEADER + "\n" + "1,2,3,,\n" * 98)
        for state in box.state.glob("leak-state*.json"):
            state.unlink()
        watch_cycles(box, ["--pid", str(job.proc.pid)], 3, env=env)
        # rotation keeps one old file; no file grows past the bound
        assert len(path.read_text().splitlines()) == 2
        assert len(open(str(path) + ".1").read().splitlines()) == 101
        # a file that grew behind the watcher's back is rotated by its size
        path.write_text(gg_history.HISTORY_HEADER + "\n" + "1796206508,8111,3000,3500,143771\n" * 250)
        watch_cycles(box, ["--pid", str(job.proc.pid)], 1, env=env)
        assert len(path.read_text().splitlines()) == 2
        assert len(open(str(path) + ".1").read().splitlines()) == 251
    finally:
        job.stop()


def test_report_is_one_self_contained_html_file(box, tmp_path):
    job = Job(tmp_path)
    try:
        leak_scenario(box, job.child())
        watch_cycles(box, ["--pid", str(job.proc.pid)], 30)
    finally:
        job.stop()
    out = tmp_path / "report.html"
    r = box.run("report", "--out", str(out), cmd="bin/gpu-leak-watch")
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    assert page.count("<svg") == 1 and "firing" in page and "trend +" in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page and "<script src" not in page


def test_loss_plateau_reading(tmp_path):
    log = tmp_path / "logging.jsonl"
    log.write_text("".join(json.dumps({"loss": 2.0 - i * 0.02}) + "\n" for i in range(60)))
    assert leak.loss_plateau(str(log)) is False
    log.write_text("not json\n" + "".join(json.dumps({"loss": 0.7, "step": i}) + "\n" for i in range(60)))
    assert leak.loss_plateau(str(log)) is True
    assert leak.loss_plateau(str(tmp_path / "none")) is None


def loss_lines(n, loss=0.7):
    return "".join(json.dumps({"loss": loss, "global_step": i, "model": "通义千问"}, ensure_ascii=False) + "\n"
                   for i in range(n)).encode()


def write_loss_log_being_written(path):
    """An ms-swift logging.jsonl as a running job leaves it: a line with
    bytes that are not UTF-8, then the line being appended, cut in the
    middle of a Chinese character."""
    last = json.dumps({"loss": 0.7, "model": "通义千问"}, ensure_ascii=False).encode()
    cut = last[:last.index("千".encode()) + 1]
    path.write_bytes(loss_lines(30) + b'{"loss": 0.7, "note": "\xff\xfe"}\n' + loss_lines(30) + cut)


def test_loss_log_with_bad_bytes_and_a_line_being_written_is_read(tmp_path):
    log = tmp_path / "logging.jsonl"
    write_loss_log_being_written(log)
    assert leak.loss_plateau(str(log)) is True
    # a line of 400 digits, a nested line, and a line too long for a log entry
    log.write_bytes(b'{"loss": 1' + b"0" * 400 + b'}\n' + b"[" * 100000 + b"\n" + b"x" * (3 << 20) + b"\n"
                    + loss_lines(60))
    assert leak.loss_plateau(str(log)) is True


def test_a_loss_log_that_is_a_fifo_or_a_folder_is_unknown_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path, tmp_path / "none"):
        # a FIFO nobody writes to would block the open for ever
        r = subprocess.run([sys.executable, str(ROOT / "python/gpuguard_leak.py"), "loss", str(path)],
                           capture_output=True, text=True, timeout=20, env={"PYTHONPATH": str(ROOT / "python")})
        assert (r.returncode, r.stdout) == (0, "null\n"), r.stderr


@pytest.mark.slow
def test_a_loss_log_the_job_is_writing_never_costs_the_alert(box, tmp_path):
    """Seen with ms-swift writing Chinese text: bytes that are not UTF-8 in
    the loss log failed every cycle of the detector that needed it (the one
    that alerts), so the alert never came and --on-leak never acted."""
    job = Job(tmp_path)
    log = tmp_path / "logging.jsonl"
    write_loss_log_being_written(log)
    try:
        leak_scenario(box, job.child())
        out = watch_cycles(box, ["--pid", str(job.proc.pid), "--loss-log", str(log)], 22)
    finally:
        job.stop()
    (event,) = [e for e in box.events() if e["event"] == "gpu_memory_leak"]
    assert event["state"] == "firing" and event["loss_plateau"] is True
    assert "leak detector failed" not in out and "loss log" not in out


@pytest.mark.slow
def test_a_loss_log_that_cannot_be_read_is_one_warning_and_the_alert_comes(box, tmp_path):
    job = Job(tmp_path)
    log = tmp_path / "logs"
    log.mkdir()
    try:
        leak_scenario(box, job.child())
        out = watch_cycles(box, ["--pid", str(job.proc.pid), "--loss-log", str(log)], 22)
    finally:
        job.stop()
    (event,) = [e for e in box.events() if e["event"] == "gpu_memory_leak"]
    assert event["state"] == "firing" and event["loss_plateau"] is None
    warnings = [line for line in out.splitlines() if "loss log" in line]
    assert len(warnings) == 1 and "WARN" in warnings[0] and str(log) in warnings[0], out
    assert "Is a directory" in warnings[0] and "ERROR" not in out


def rising_tree(key, ts, used):
    return "\t".join(["T", key, str(ts), key.split("-")[0], str(used), str(143771 - used), "143771", "5", "300",
                      "11", "python3", "python3 train.py"]) + "\n"


def test_the_detector_says_an_unreadable_loss_log_once(tmp_path):
    """Two trees alerting at different cycles of one detector process (the
    watcher's coprocess): one warning, not one per alert."""
    env = {"GPUGUARD_STATE_DIR": str(tmp_path), "GPUGUARD_HOST": "h", "LEAK_BUCKET_S": "60",
           "LEAK_LOSS_LOG": str(tmp_path / "no-such.jsonl")}
    out = []
    for i in range(400):
        ts = 1796206508 + 60 * i
        lines = [rising_tree("10-1", ts, 3000 + 100 * i)]
        if i >= 100:
            lines.append(rising_tree("20-1", ts, 3000 + 100 * (i - 100)))
        buf = io.StringIO()
        leak.check(env, io.StringIO("".join(lines)), buf)
        out += buf.getvalue().splitlines()
    fired = [line for line in out if line.startswith("event\tfiring")]
    warned = [line for line in out if line.startswith("warn\t")]
    assert {line.split("\t")[2] for line in fired} == {"10", "20"}
    assert len(warned) == 1 and "no-such.jsonl" in warned[0] and "No such file" in warned[0]


def test_watched_job_ending_resolves_and_the_watcher_survives(box, tmp_path):
    """Seen on the H200: the watcher died with the job it watched."""
    job = Job(tmp_path)
    pid = job.proc.pid
    try:
        leak_scenario(box, job.child(), steps=60)
        watch_cycles(box, ["--pid", str(pid)], 28)
        assert [e["state"] for e in box.events()] == ["firing"]
    finally:
        job.stop()
    watch_cycles(box, ["--pid", str(pid)], 2)        # exit status 0 checked inside
    assert [(e["state"], e.get("reason")) for e in box.events()] == [("firing", None), ("resolved", "gone")]


def test_daemon_with_pid_targets_stops_when_they_have_ended(box, tmp_path):
    job = Job(tmp_path)
    leak_scenario(box, job.child(), per_step=0)
    proc = subprocess.Popen([str(ROOT / "bin/gpu-leak-watch"), "--pid", str(job.proc.pid), "--interval", "1"],
                            env=dict(box.env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the job ends once the watcher has sampled it twice (on a loaded
    # machine the first cycle may take longer than any fixed pause)
    assert wait_for(lambda: len(box.smi_calls()) >= 2 and any((box.state / "history").glob("*.csv")), timeout=60)
    job.stop()
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "every watched process has ended; stopping" in err


def fake_scontrol(tmp_path, nodelist, pids):
    fake = tmp_path / "slurmbin"
    fake.mkdir()
    (fake / "scontrol").write_text(
        "#!/bin/sh\n"
        'if [ "$1 $2" = "show job" ]; then echo "JobId=$4 JobName=sft UserId=u(1) JobState=RUNNING NodeList=%s NumNodes=1"; exit 0; fi\n'
        'if [ "$1" = "listpids" ]; then printf "PID      JOBID    STEPID   LOCALID GLOBALID\\n"; %s exit 0; fi\n'
        "exit 1\n" % (nodelist, " ".join('printf "%d      $2      0        0       0\\n";' % p for p in pids)))
    (fake / "scontrol").chmod(0o755)
    return fake


def test_slurm_job_on_this_node_is_watched_by_its_pids(box, tmp_path):
    job = Job(tmp_path)
    try:
        leak_scenario(box, job.child())
        fake = fake_scontrol(tmp_path, "gpuhost[07-08]", [job.proc.pid])
        env = {"PATH": "%s:%s" % (fake, box.env["PATH"]), "GPUGUARD_HOST": "gpuhost07"}
        out = watch_cycles(box, ["--slurm-job", "4242"], 28, env=env)
    finally:
        job.stop()
    assert "Slurm job 4242 on gpuhost07: watching 1 processes" in out
    assert [e["pid"] for e in box.events()] == [job.proc.pid]


def test_slurm_job_on_another_node_says_where_to_run(box, tmp_path):
    fake = fake_scontrol(tmp_path, "node7", [1])
    r = box.run("--slurm-job", "99", "--once", cmd="bin/gpu-leak-watch",
                env={"PATH": "%s:%s" % (fake, box.env["PATH"]), "GPUGUARD_HOST": "login1"})
    assert r.returncode == 2
    assert "Slurm job 99 runs on node7, not here" in r.stderr and "ssh node7 gpu-leak-watch --slurm-job 99" in r.stderr


def test_slurm_job_without_slurm_is_one_line(box):
    """A box without Slurm printed bash's own "line 1123: scontrol: command
    not found" behind the message."""
    r = box.run("--slurm-job", "42", "--once", cmd="bin/gpu-leak-watch")
    assert r.returncode == 2
    assert r.stderr == "gpu-leak-watch: --slurm-job needs Slurm's scontrol, which is not on PATH here\n"


@pytest.mark.parametrize("name,expected", [("leak-trace-leaking.csv", ["firing"]), ("leak-trace-healthy.csv", [])])
def test_replay_of_real_h200_traces(tmp_path, name, expected):
    """Recorded by bench/h200/checks.sh: a PyTorch loop keeping each step's
    loss with its graph, and the same loop keeping loss.item(), sampled
    every second (so 2-second buckets)."""
    r = run(["--replay", str(ROOT / "tests/fixtures/h200" / name), "--bucket", "2"],
            env={"GPUGUARD_STATE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["state"] for line in r.stdout.splitlines()] == expected


def near_full_trace(rng, rate, headroom_mib):
    trace = bench.base_trace(rng, 6, "plateau")
    total = max(v for t, v in trace if t < 2 * 3600) + headroom_mib
    leaking = [(t, v) for t, v in bench.add_leak(trace, rate, 2.0) if v <= total]
    return leaking, total


def test_near_oom_leak_fires_within_about_an_hour():
    """2000 MiB/h with 6 GiB free leaves about 3 h: the hours-long windows
    would alert too late; the near-OOM tier does not wait for them."""
    trace, total = near_full_trace(random.Random(11), 2000, 6 * 1024)
    s = leakstat.Series(dict(leakstat.DEFAULTS), "k", 1)
    fired = []
    for t, v in trace:
        ev = s.add(t, v, total - v)
        if ev and ev["state"] == "firing":
            fired.append(t)
    assert fired, "no alert before OOM"
    delay_h = fired[0] / 3600 - 2.0
    assert delay_h < 1.5
    assert 6 * 1024 / 2000 - delay_h > 1.5      # well over an hour left to act


def test_warm_up_after_a_quick_restart_on_a_nearly_full_gpu_is_not_a_leak():
    """Seen in the bench: a restart with a 2-minute gap (no gap cut, floors do
    not halve), then the new process's warm-up ramp right under OOM, before
    the hours-long windows have data. It decelerates; a leak does not. The
    near-OOM tier's tail gate is what tells them apart."""
    flat = [(i * 60.0, 40000) for i in range(70)]
    ramp = [(70 * 60.0 + 120 + i * 60.0, 39000 + int(8000 * (1 - math.exp(-i / 20.0))) // 20 * 20)
            for i in range(240)]
    total = 48500

    def alerts(**params):
        s = leakstat.Series(dict(leakstat.DEFAULTS, **params), "k", 1)
        return [ev for ev in (s.add(t, v, total - v) for t, v in flat + ramp) if ev]

    assert alerts() == []


def detector_of(watcher_pid):
    """PID of a watcher's detector process (its coprocess), or None."""
    r = subprocess.run(["pgrep", "-P", str(watcher_pid), "-f", "gpuguard_leakcheck.py serve"],
                       capture_output=True, text=True)
    return int(r.stdout.split()[0]) if r.stdout.split() else None


def start_all_watcher(box, tmp_path):
    """A flat job and `gpu-leak-watch --all` sampling it every second:
    (job, watcher, the file its stderr goes to)."""
    job = Job(tmp_path)
    leak_scenario(box, job.child(), steps=200, per_step=0)
    err_path = tmp_path / "watch.err"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([str(ROOT / "bin/gpu-leak-watch"), "--all", "--interval", "1", "--bucket", "1"],
                                env=dict(box.env), stdout=subprocess.DEVNULL, stderr=err)
    return job, proc, err_path


def test_a_state_folder_removed_under_the_watcher_is_made_again_with_what_it_followed(box, tmp_path):
    """The state folder removed under a running watcher (by hand, a /tmp
    cleaner): the watcher makes it again, locked (a second --all is still
    refused), and the detector writes the series it kept in memory there
    rather than starting them afresh (a leak hours into its evidence would
    wait hours again)."""
    job, proc, err_path = start_all_watcher(box, tmp_path)

    def first_samples():
        try:
            state = json.loads((box.state / "leak-state-all.json").read_text())
        except (OSError, ValueError):
            return None
        # where each series' segment starts: a series started afresh starts later
        cuts = {key: s["cut"] for key, s in state["series"].items()}
        return cuts if cuts and None not in cuts.values() else None
    try:
        assert wait_for(lambda: first_samples() is not None, timeout=30), err_path.read_text()
        before = first_samples()
        shutil.rmtree(box.state)
        assert wait_for(lambda: first_samples() is not None, timeout=30), err_path.read_text()
        assert first_samples() == before, err_path.read_text()
        assert oct(box.state.stat().st_mode & 0o777) == "0o700"
        # (not refused, it would watch on: the timeout fails the test)
        second = subprocess.run([str(ROOT / "bin/gpu-leak-watch"), "--all"], env=dict(box.env),
                                capture_output=True, text=True, timeout=20)
        assert second.returncode == 1 and "another instance holds" in second.stderr, second.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        job.stop()
    assert proc.returncode == 0
    log = err_path.read_text()
    assert "was removed while running: making it again" in log and "Traceback" not in log, log


def test_a_killed_detector_is_started_again_and_the_watch_goes_on(box, tmp_path):
    """The detector is one long-lived process beside the watcher (no Python
    start per cycle): killed, the next cycle starts a new one from the saved
    state; stopping the watcher leaves no detector behind."""
    job, proc, err_path = start_all_watcher(box, tmp_path)
    try:
        def rows():
            files = list((box.state / "history").glob("*.csv"))
            return len(files[0].read_text().splitlines()) if files else 0
        assert wait_for(lambda: rows() >= 3 and detector_of(proc.pid), timeout=30)
        first = detector_of(proc.pid)
        os.kill(first, signal.SIGKILL)
        before = rows()
        assert wait_for(lambda: rows() >= before + 3, timeout=30), err_path.read_text()
        second = detector_of(proc.pid)
        assert proc.poll() is None and second not in (None, first)
        log = err_path.read_text()
        assert "leak detector" in log and "Traceback" not in log
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        job.stop()
    assert proc.returncode == 0
    # the watcher waited for its detector to end
    assert not os.path.exists("/proc/%d" % second)


@pytest.mark.slow
def test_a_leak_alert_says_how_long_the_job_has_run(box, tmp_path):
    """Leak alerts said "started 06:12 (running ?)" though the job's start
    was known: the leak event's job lacked elapsed_s, which idle alerts
    carry. It is the event's time less the job's start."""
    device = tmp_path / "fakedev0"
    device.touch()
    # the job holds the "GPU" (the device file) as a CUDA job holds /dev/nvidia0
    proc = subprocess.Popen(["bash", "-c", "exec 3<'%s'; sleep 600 & wait" % device], start_new_session=True)
    job = Job.__new__(Job)
    job.proc = proc
    assert wait_for(lambda: job.child() is not None)
    try:
        leak_scenario(box, job.child())
        start = int(time.time())
        for i in range(30):
            r = box.run("--pid", str(job.proc.pid), "--bucket", "1", "--once", cmd="bin/gpu-leak-watch",
                        env={"GPUGUARD_NOW": str(start + 600 + i),
                             "JOBINFO_DEVICE_GLOB": str(tmp_path / "fakedev*")})
            assert r.returncode == 0, r.stderr
    finally:
        job.stop()
    (event,) = [e for e in box.events() if e["event"] == "gpu_memory_leak" and e["state"] == "firing"]
    assert event["job"]["elapsed_s"] == event["ts"] - event["job"]["start_ts"] >= 600
    r = box.run("notify", "--preview", str(box.state / "events.jsonl"), cmd="bin/gpuguard")
    assert r.returncode == 0, r.stderr
    assert "running ?" not in r.stdout and "running 10 min" in r.stdout, r.stdout
