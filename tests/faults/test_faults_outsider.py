"""What an outsider still broke (issue 25): a malformed alert target that
silenced every other one, hostile values in every configuration key that
reaches a Python helper, links planted at the lock files, and cron's leak
watch that never pruned its history. Each runs the commands as a user
types them; GG_FAULTS_LONG=1 fuzzes every value against every key."""
import os
import signal
import subprocess
import time

import webhook_sink
from conftest import ROOT, app
from faultlib import LONG, base_env, record, scenario_file

SECRET = "SECfuzz0signing0secret0value"
TOKEN = "TOKfuzz0access0token0value"
# Values a typo, a paste from a chat window or an attacker puts in a key.
NASTY = [
    "http://[::1",
    "http://[::1/robot/send?access_token=" + TOKEN,
    "https://[::1]:99999/hook/" + TOKEN,
    "http://exa mple.com/" + TOKEN,
    "http://a\x01b\x1b[31m/?key=" + TOKEN,
    "http://例子.中国/hook?access_token=" + TOKEN,
    "dingtalk:xx+http://127.0.0.1:1/" + TOKEN,
    "https://127.0.0.1:1/" + "A" * 50000,
    "B" * 50000,
    TOKEN,
    "'\";$(touch /tmp/gg-pwned)`id`",
    "\u3000\u200b\ufeff",
    "%s%n%x{}{0}",
    "-1e309",
]
# Keys that reach a Python helper (gg_python's lists in events.sh, leak.sh,
# bin/gpu-leak-watch and bin/gpuguard), by kind: free text goes on to
# Python, the others are checked by lib/config.sh first.
STR_KEYS = ["NOTIFY_URL", "ALERTMANAGER_URL", "NOTIFY_SECRET", "NOTIFY_MENTION", "GPU_PRICE_CURRENCY",
            "GPUGUARD_HOST", "GPUGUARD_LOG"]
CHECKED_KEYS = ["NOTIFY_TYPE", "NOTIFY_LANG", "NOTIFY_TIMEOUT", "NOTIFY_RETRIES", "NOTIFY_RATE_PER_MIN",
                "OUTBOX_MAX", "REPEAT_INTERVAL", "GPU_HOUR_PRICE", "GPUGUARD_LOG_LEVEL", "GPUGUARD_SYSLOG",
                "LEAK_THRESHOLD_MIB_H", "LEAK_HISTORY_MAX_ROWS", "LEAK_RULES", "GPUGUARD_STATE_DIR"]


def idle_scenario(tmp_path, cycles=8):
    path = tmp_path / "s.json"
    scenario_file(path, [{"gpus": [{"utilization.gpu": 0, "memory.used": 2576, "power.draw": 76.6}],
                          "apps": [app(1410, gpu=0)]}] * cycles, gpus=1)
    return path


def run(cmd, env, *args, timeout=60):
    """Runs a command from its own folder (a relative path in a value lands
    there, never in the source tree), in its own session: one that does not
    end in time is killed with all its children, then the test fails."""
    proc = subprocess.Popen([str(ROOT / "bin" / cmd)] + list(args), env=env, text=True, errors="replace",
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=env["HOME"],
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_once(env, now):
    return run("yichuidingyin.sh", dict(env, GPUGUARD_NOW=str(now)), "--once")


def problems_of(r, what, allowed=(0, 1, 2)):
    """What a user should never see: a traceback, an exit status outside
    0/1/2, a secret, an error or warning longer than one line."""
    out = r.stdout + r.stderr
    found = []
    if "Traceback" in out or 'File "' in out:
        found.append(what + ": traceback")
    if r.returncode not in allowed:
        found.append("%s: exit %d" % (what, r.returncode))
    if SECRET in out or TOKEN in out:
        found.append(what + ": secret shown")
    for line in r.stderr.splitlines():
        if len(line) > 2000:
            found.append(what + ": a %d-character line" % len(line))
    return found


def test_a_malformed_target_never_silences_the_others(tmp_path):
    """The issue's reproduction: a typo in the first of two targets; three
    cron cycles; the good receiver gets its alert, the bad one is named in
    one log line in all, and no traceback."""
    server, recorder = webhook_sink.serve(quiet=True)
    good = "http://127.0.0.1:%d/hook" % server.server_address[1]
    env = base_env(tmp_path, idle_scenario(tmp_path), NOTIFY_URL="http://[::1 " + good, MAX_IDLE_CYCLES=1,
                   GPUGUARD_LOG=tmp_path / "log")
    try:
        outs = [run_once(env, t) for t in (0, 60, 120)]
    finally:
        server.shutdown()
    log = (tmp_path / "log").read_text()
    named = [line for line in log.splitlines() if "NOTIFY_URL #1" in line]
    tracebacks = sum((r.stdout + r.stderr + log).count("Traceback") for r in outs)
    got = len(recorder.requests)
    record("badurl", "good receiver got %d alert(s) in 3 cycles; bad one named in %d log line(s); "
           "tracebacks: %d" % (got, len(named), tracebacks), got >= 1 and len(named) == 1 and tracebacks == 0)
    assert [r.returncode for r in outs] == [0, 0, 0]
    assert got >= 1 and tracebacks == 0
    assert len(named) == 1 and "http://[::1/***" in named[0] and "malformed" in named[0], log


def test_hostile_values_in_every_key_give_one_line_and_no_secret(tmp_path):
    """Each value in every free-text key at once (the alert helper renders
    and sends a firing digest with them, notify --check and doctor check
    them), and in each checked key alone (refused by lib/config.sh: one
    line, exit 2). Default run: the checked keys get four of the values."""
    server, recorder = webhook_sink.serve(quiet=True)
    good = "http://127.0.0.1:%d/hook" % server.server_address[1]
    found, runs = [], 0
    start = time.time()
    try:
        values = NASTY if LONG else NASTY[:2] + NASTY[4:6] + NASTY[7:8] + NASTY[10:11]
        for i, value in enumerate(values):
            case = tmp_path / ("case%d" % i)
            case.mkdir()
            env = base_env(case, idle_scenario(case), MAX_IDLE_CYCLES=1, NOTIFY_RETRIES=0, NOTIFY_TIMEOUT=1)
            # a token goes only where tokens belong (GPUGUARD_HOST is shown)
            env.update({k: value.replace(TOKEN, "tok") for k in STR_KEYS})
            env.update(ALERTMANAGER_URL=value, NOTIFY_URL=value + " " + good + "?access_token=" + TOKEN,
                       NOTIFY_SECRET=SECRET + " " + value, GPUGUARD_LOG=str(case / "log"))
            env = {k: v.replace("\0", "") for k, v in env.items()}
            commands = [("--once", lambda e: run_once(e, 0)),
                        ("notify --check", lambda e: run("gpuguard", e, "notify", "--check"))]
            if LONG or i < 2:
                commands.append(("doctor", lambda e: run("gpuguard", e, "doctor")))
            for what, command in commands:
                r = command(env)
                runs += 1
                found += problems_of(r, "free-text keys = %r: %s" % (value[:30], what))
            log = case / "log"
            text = log.read_text(errors="replace") if log.exists() else ""
            if "Traceback" in text or SECRET in text or TOKEN in text:
                found.append("free-text keys = %r: log has a traceback or a secret" % value[:30])
            if not LONG and value not in (NASTY[1], NASTY[7]):
                continue
            for key in CHECKED_KEYS:
                # the token is a secret of this configuration too
                env = base_env(case, idle_scenario(case), NOTIFY_URL=good + "?access_token=" + TOKEN)
                env[key] = value
                if key.startswith("LEAK_"):
                    r = run("gpu-leak-watch", env, "--all", "--once")
                elif key == "GPUGUARD_STATE_DIR":
                    r = run_once(env, 0)
                else:
                    r = run("gpuguard", env, "notify", "--check")
                runs += 1
                found += problems_of(r, "%s = %r" % (key, value[:30]))
                if r.returncode == 2 and len(r.stderr.splitlines()) != 1:
                    found.append("%s = %r: exit 2 with %d lines" % (key, value[:30], len(r.stderr.splitlines())))
        delivered = len(recorder.requests)
    finally:
        server.shutdown()
    record("fuzz", "%d runs, %d values x %d keys (%.0f s): %d problem(s)%s; good receiver got %d digests"
           % (runs, len(values), len(STR_KEYS) + len(CHECKED_KEYS), time.time() - start, len(found),
              (": " + "; ".join(found[:3])) if found else "", delivered),
           not found and delivered == len(values))
    assert found == []
    # the malformed first target never kept the good one from its digest
    assert delivered == len(values)


def test_links_planted_at_locks_are_not_followed(tmp_path):
    """A link at each lock (events.lock, yichuidingyin.lock, flush.lock,
    leak-*.lock) pointing at a missing file: the file is never created and
    the command says so in one line."""
    server, _ = webhook_sink.serve(quiet=True)
    env = base_env(tmp_path, idle_scenario(tmp_path), MAX_IDLE_CYCLES=1,
                   NOTIFY_URL="http://127.0.0.1:%d/hook" % server.server_address[1])
    state = tmp_path / "state"
    assert run_once(env, 0).returncode == 0
    created, said = [], []
    try:
        for name, cmd, args in (("yichuidingyin.lock", "yichuidingyin.sh", ["--once"]),
                                ("events.lock", "yichuidingyin.sh", ["--once"]),
                                ("flush.lock", "gpuguard", ["notify", "--flush"]),
                                ("leak-all.lock", "gpu-leak-watch", ["--all"])):
            target = tmp_path / ("nologin-" + name)
            link = state / name
            if link.exists() or link.is_symlink():
                link.unlink()
            os.symlink(target, link)
            if name == "flush.lock":
                # something waiting to be sent, so the flush opens its lock
                (state / "outbox" / "1-1-000001.json").write_text('{"event":"test","state":"test","ts":1}\n')
            e = dict(env, GPUGUARD_NOW="600", MAX_IDLE_CYCLES="1", GPUGUARD_LOG=str(tmp_path / "log"))
            if name == "events.lock":
                os.unlink(state / "idle.state")       # a new incident: an event to append
            r = run(cmd, e, *args, timeout=30)
            log = (tmp_path / "log").read_text() if (tmp_path / "log").exists() else ""
            lines = [ln for ln in (r.stderr + log).splitlines() if name in ln and "symlink" in ln]
            if target.exists():
                created.append(name)
            if lines:
                said.append(name)
            link.unlink()
    finally:
        server.shutdown()
    record("locklink", "link at a lock followed: %d/4%s; said in one line: %d/4"
           % (len(created), (" (" + ", ".join(created) + ")") if created else "", len(said)),
           not created and len(said) == 4)
    assert created == []
    assert said == ["yichuidingyin.lock", "events.lock", "flush.lock", "leak-all.lock"]


def test_a_state_folder_others_can_write_is_refused(tmp_path):
    """GPUGUARD_STATE_DIR given by the environment, ours but mode 0777 (a
    misconfigured shared folder): refused before anything is opened."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    env = base_env(tmp_path, idle_scenario(tmp_path), GPUGUARD_STATE_DIR=str(shared))
    r = run_once(env, 0)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "writable by group or others" in r.stderr
    assert os.listdir(shared) == []


def test_cron_leak_watch_prunes_history(tmp_path):
    """200 short-lived series' history files, 8 days old with
    RETENTION_DAYS=7: one `gpu-leak-watch --all --once` from cron prunes
    them and keeps the recent ones."""
    env = base_env(tmp_path, idle_scenario(tmp_path), RETENTION_DAYS=7)
    history = tmp_path / "state" / "history"
    history.mkdir(parents=True, mode=0o700)
    (tmp_path / "state").chmod(0o700)
    old = time.time() - 8 * 86400
    for i in range(200):
        path = history / ("%d-%d.csv" % (20000 + i, 1000 + i))
        path.write_text("ts,used_mib\n1,100\n")
        os.utime(path, (old, old))
    for i in range(3):
        (history / ("%d-1.csv" % (30000 + i))).write_text("ts,used_mib\n1,100\n")
    before = len(list(history.iterdir()))
    r = run("gpu-leak-watch", env, "--all", "--once")
    after = sorted(p.name for p in history.iterdir())
    # what is left: the 3 recent series and the one this run watched (its
    # history and the identity recorded beside it)
    record("cronprune", "history files after 200 short-lived series, 8 days on, one --once: %d -> %d"
           % (before, len(after)), r.returncode == 0 and not [n for n in after if n.startswith("2")])
    assert r.returncode == 0, r.stderr
    assert [n for n in after if n.startswith("2")] == []
    assert {"30000-1.csv", "30001-1.csv", "30002-1.csv"} <= set(after)
