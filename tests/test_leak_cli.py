"""gpu-leak-watch as a user types it: `gpu-leak-watch -- CMD` behaves like
running CMD (exit status, stdin/stdout/stderr, environment, signals, the
terminal), several watchers share a box, --match says what it waits for,
--version. Every command runs with default signal dispositions (a test
runner started in the background of a script inherits SIGINT ignored, which
would hide a job that cannot be interrupted)."""
import fcntl
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import termios
import time

import pytest
from conftest import ROOT, require, wait_for

WATCH = str(ROOT / "bin" / "gpu-leak-watch")
FORWARDED = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT]

# A job that records every forwarded signal it gets (one line each), waits a
# moment so that a second delivery would be recorded too, then dies of the
# first one, as an uncaught signal would kill it.
RECORDER = r"""
import os, signal, sys, time
out = sys.argv[1]
got = []
def record(sig, frame):
    got.append(sig)
    with open(out, "a") as f:
        f.write(signal.Signals(sig).name + "\n")
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(s, record)
open(out + ".ready", "w").close()
end = time.time() + 120
while not got and time.time() < end:
    time.sleep(0.05)
time.sleep(0.5)
signal.signal(got[0], signal.SIG_DFL)
os.kill(os.getpid(), got[0])
"""


def default_signals():
    """preexec_fn: the dispositions of a login shell's foreground command."""
    for s in FORWARDED:
        signal.signal(s, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))     # SIGQUIT: no core file


def env_for(box, **extra):
    env = dict(box.env, LEAK_INTERVAL="1")
    env.update(extra)
    return env


def watch(box, *args, env=None, input=None, timeout=60):
    """Runs gpu-leak-watch to the end, as typed in a shell."""
    return subprocess.run([WATCH, *args], env=env or env_for(box), text=True, input=input, check=False,
                          capture_output=True, timeout=timeout,
                          preexec_fn=default_signals)


def start(box, tmp_path, *args, env=None, name="watch", **kw):
    """Starts gpu-leak-watch in the background; its stderr goes to a file
    the test can poll (returned as proc.err_path)."""
    err_path = tmp_path / (name + ".err")
    with open(err_path, "w") as err:
        proc = subprocess.Popen([WATCH, *args], env=env or env_for(box), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err,
                                preexec_fn=default_signals, **kw)
    proc.err_path = err_path
    return proc


def err_of(proc):
    return proc.err_path.read_text() if proc.err_path.exists() else ""


def finish(proc, timeout=30):
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def gate_job(tmp_path, name, status):
    """A job that says it started, then waits for a release file."""
    started, release = tmp_path / (name + ".started"), tmp_path / "release"
    return (["bash", "-c", 'touch "$1"; while [ ! -e "$2" ]; do sleep 0.1; done; exit "$3"', "_",
             str(started), str(release), str(status)], started, release)


# ----------------------------------------------------------- exit status --

@pytest.mark.parametrize("cmd,status", [
    (["bash", "-c", "echo hi; exit 3"], 3),
    (["true"], 0),
    (["bash", "-c", "kill -KILL $$"], 128 + 9),
    (["bash", "-c", "kill -TERM $$"], 128 + 15),
])
def test_exit_status_is_the_jobs_even_before_the_first_cycle(box, cmd, status):
    r = watch(box, "--", *cmd)
    assert r.returncode == status, r.stderr
    assert r.stdout == ("hi\n" if "echo hi" in cmd[-1] else "")
    assert "Killed" not in r.stderr and "Terminated" not in r.stderr     # no bash job notice
    assert f"ended with status {status}" in r.stderr


def test_a_job_killed_before_the_wrapper_waits_gets_no_bash_notice(box, tmp_path):
    """A job killed by SIGKILL in its first milliseconds, while the wrapper
    was still starting the watcher (here held up by a slow syslog), got
    bash's "lib/leak.sh: line 1: PID Killed ( ... )" on the user's
    terminal, the whole source of the wrapper's subshell (CI saw it once).
    Its status stays 137 and the wrapper's own lines still come."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "logger").write_text("#!/bin/sh\nsleep 0.3\n")
    (fake / "logger").chmod(0o755)
    env = dict(env_for(box), GPUGUARD_SYSLOG="1", PATH="%s:%s" % (fake, env_for(box)["PATH"]))
    r = watch(box, "--", "bash", "-c", "kill -KILL $$", env=env)
    assert r.returncode == 137, r.stderr
    assert "Killed" not in r.stderr, r.stderr
    assert "started job PID" in r.stderr and "ended with status 137" in r.stderr


def test_command_not_found_is_127_with_one_shell_like_line(box):
    r = watch(box, "--", "no-such-cmd-gpuguard")
    assert r.returncode == 127
    assert r.stderr == "gpu-leak-watch: no-such-cmd-gpuguard: command not found\n"
    r = watch(box, "--", str(box.tmp / "missing.sh"))
    assert r.returncode == 127 and r.stderr.endswith("missing.sh: No such file or directory\n")


def test_command_not_executable_is_126(box):
    script = box.tmp / "train.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o644)
    r = watch(box, "--", str(script))
    assert r.returncode == 126 and r.stdout == ""
    assert r.stderr == f"gpu-leak-watch: {script}: Permission denied\n"


def test_a_job_of_one_second_keeps_its_status_and_leaves_no_lock_behind(box):
    # a wrapper killed by SIGKILL left these: its PID runs no more
    dead = subprocess.Popen(["true"])
    dead.wait()
    box.state.mkdir()
    (box.state / f"leak-job-{dead.pid}.lock").write_text("")
    (box.state / f"leak-job-{dead.pid}.lock.pid").write_text(f"{dead.pid}\n")
    r = watch(box, "--", "bash", "-c", "sleep 1; exit 5", env=env_for(box, LEAK_INTERVAL="60"))
    assert r.returncode == 5, r.stderr
    assert sorted(p.name for p in box.state.glob("*lock*")) == []


def test_the_job_gets_the_users_stdin_and_environment(box, tmp_path):
    conf = tmp_path / "gpuguard.conf"
    conf.write_text("NOTIFY_URL=https://hooks.example/secret-token\nLEAK_THRESHOLD_MIB_H=80\n")
    conf.chmod(0o600)
    env = dict(box.env, GPUGUARD_CONFIG=str(conf), MY_VAR="kept")
    r = watch(box, "--interval", "5", "--", "bash", "-c", 'cat; env', env=env, input="hello from stdin\n")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "hello from stdin"
    assert "MY_VAR=kept" in lines and f"GPUGUARD_CONFIG={conf}" in lines
    names = {line.split("=", 1)[0] for line in lines[1:]}
    assert not names & {"NOTIFY_URL", "LEAK_INTERVAL", "LEAK_THRESHOLD_MIB_H", "LEAK_INSTANCE"}
    assert "secret-token" not in r.stdout


# --------------------------------------------------------------- signals --

@pytest.mark.parametrize("sig", FORWARDED, ids=lambda s: s.name)
def test_signals_to_the_wrapper_reach_the_job_once_and_its_end_is_the_status(box, tmp_path, sig):
    record = tmp_path / "signals"
    proc = start(box, tmp_path, "--", sys.executable, "-c", RECORDER, str(record))
    try:
        assert wait_for(lambda: (tmp_path / "signals.ready").exists(), timeout=30), err_of(proc)
        proc.send_signal(sig)
        rc = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert record.read_text().splitlines() == [sig.name]
    # ended by the Ctrl-C it passed on, the wrapper ends by SIGINT too (a
    # calling shell loop then stops); otherwise 128+N as a shell reports it
    assert rc == (-signal.SIGINT if sig == signal.SIGINT else 128 + sig), err_of(proc)


@pytest.mark.parametrize("ignored", [(), (signal.SIGINT, signal.SIGQUIT), (signal.SIGHUP,)],
                         ids=["defaults", "from-a-script-background", "nohup"])
def test_the_job_starts_with_the_signal_dispositions_it_would_have_run_directly(box, ignored):
    """A wrapped job ignores exactly what the same command run directly
    would: nothing from a terminal, INT and QUIT when the caller is a
    script's background job, HUP under nohup."""
    def caller():
        default_signals()
        for s in ignored:
            signal.signal(s, signal.SIG_IGN)

    def sig_ign(argv):
        r = subprocess.run(argv, env=env_for(box), text=True, capture_output=True, check=False,
                           preexec_fn=caller)
        assert r.returncode == 0, r.stderr
        return [line for line in r.stdout.splitlines() if line.startswith("SigIgn:")]

    cmd = ["grep", "SigIgn", "/proc/self/status"]
    assert sig_ign([WATCH, "--", *cmd]) == sig_ign(cmd)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGQUIT], ids=lambda s: s.name)
def test_a_job_with_default_signal_actions_can_be_interrupted(box, tmp_path, sig):
    """Bash starts background commands with INT and QUIT ignored: a job that
    keeps the default actions (sleep, most C programs) must still stop."""
    proc = start(box, tmp_path, "--", "sleep", "600")
    try:
        assert wait_for(lambda: "started job PID" in err_of(proc), timeout=30), err_of(proc)
        proc.send_signal(sig)
        rc = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == (-signal.SIGINT if sig == signal.SIGINT else 128 + sig), err_of(proc)


class Terminal:
    """gpu-leak-watch run as a shell runs a foreground command: session
    leader of a pseudo-terminal, its process group in the foreground."""

    def __init__(self, box, tmp_path, *args):
        self.master, slave = os.openpty()
        self.err_path = tmp_path / "watch.err"

        def session():
            default_signals()
            os.setsid()
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

        with open(self.err_path, "w") as err:
            self.proc = subprocess.Popen([WATCH, *args], env=env_for(box), stdin=slave, stdout=slave,
                                         stderr=err, preexec_fn=session,
                                         pass_fds=(slave,))
        os.close(slave)
        assert wait_for(lambda: "started job PID" in self.err(), timeout=30), self.err()
        self.job_pid = int(self.err().split("started job PID ")[1].split(":")[0])

    def err(self):
        return self.err_path.read_text()

    def type(self, data):
        os.write(self.master, data)

    def read_until(self, text, timeout=30):
        out, end = b"", time.time() + timeout
        while text not in out:
            ready, _, _ = select.select([self.master], [], [], max(0, end - time.time()))
            assert ready, f"no {text!r} on the terminal after {timeout}s: {out!r} {self.err()}"
            out += os.read(self.master, 1024)
        return out

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            os.killpg(self.job_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        os.close(self.master)


def state_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0]
    except FileNotFoundError:
        return "gone"


def test_ctrl_c_at_a_terminal_reaches_the_job_once_and_the_job_can_read_the_terminal(box, tmp_path):
    """The job reads a line typed at the terminal (it is not stopped as a
    background group would be), then Ctrl-C is typed: the job gets exactly
    one SIGINT, and the wrapper ends by SIGINT as the job did."""
    record = tmp_path / "signals"
    job = "import sys; print('read:', sys.stdin.readline().strip(), flush=True); exec(sys.argv[2])"
    term = Terminal(box, tmp_path, "--", sys.executable, "-c", job, str(record), RECORDER)
    try:
        term.type(b"typed line\n")
        term.read_until(b"read: typed line")
        assert wait_for(lambda: (tmp_path / "signals.ready").exists(), timeout=30)
        term.type(b"\x03")                                       # Ctrl-C
        rc = finish(term.proc)
    finally:
        term.close()
    assert record.read_text().splitlines() == ["SIGINT"]
    assert rc == -signal.SIGINT, term.err()


def test_ctrl_z_at_a_terminal_stops_the_job_and_fg_resumes_it(box, tmp_path):
    term = Terminal(box, tmp_path, "--", "bash", "-c", "read -r line; echo got $line; exit 9")
    try:
        term.type(b"\x1a")                                       # Ctrl-Z
        assert wait_for(lambda: state_of(term.job_pid) == "T" and state_of(term.proc.pid) == "T",
                        timeout=30), (state_of(term.job_pid), state_of(term.proc.pid), term.err())
        os.killpg(term.proc.pid, signal.SIGCONT)                  # what `fg` does
        assert wait_for(lambda: state_of(term.job_pid) not in ("T", "gone"), timeout=30)
        term.type(b"go\n")
        term.read_until(b"got go")
        assert finish(term.proc) == 9, term.err()
    finally:
        term.close()


def test_a_terminal_that_hangs_up_sends_the_job_sighup_and_the_wrapper_waits_for_it(box, tmp_path):
    """An SSH connection drops: the terminal's session leader, the wrapper,
    gets SIGHUP and SIGCONT together. The job gets SIGHUP, as it would run
    directly, and the wrapper, whose log lines now go to a terminal that is
    gone (EIO), waits for it and exits with its status."""
    record, pid_file = tmp_path / "signals", tmp_path / "job.pid"
    master, slave = os.openpty()

    def session():
        default_signals()
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

    job = ["sh", "-c", 'echo $$ > "$1"; shift; exec "$@"', "_", str(pid_file), sys.executable, "-c", RECORDER,
           str(record)]
    proc = subprocess.Popen([WATCH, "--", *job], env=env_for(box), stdin=slave, stdout=slave, stderr=slave,
                            preexec_fn=session, pass_fds=(slave,))
    os.close(slave)
    try:
        assert wait_for(lambda: (tmp_path / "signals.ready").exists(), timeout=30)
        os.close(master)                                         # the terminal hangs up
        master = None
        rc = finish(proc)
    finally:
        if master is not None:
            os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pid_file.exists() and state_of(int(pid_file.read_text())) != "gone":
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert record.read_text().splitlines() == ["SIGHUP"]
    assert rc == 128 + signal.SIGHUP


# ------------------------------------------------------ several per box --

def job_pid_of(proc):
    return int(err_of(proc).split("started job PID ")[1].split(":")[0])


def history_rows(box, pid):
    """The data rows of a process's GPU memory history (timestamp,pid,MiB)."""
    rows = []
    for path in (box.state / "history").glob(f"{pid}-*.csv"):
        rows += path.read_text().splitlines()[1:]
    return rows


def test_two_wrapped_jobs_run_at_once_on_one_state_folder(box, tmp_path):
    box.write_scenario([{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}], "apps": []}])
    cmd_a, started_a, release = gate_job(tmp_path, "a", 10)
    cmd_b, started_b, _ = gate_job(tmp_path, "b", 11)
    a = start(box, tmp_path, "--", *cmd_a, name="a")
    b = start(box, tmp_path, "--", *cmd_b, name="b")
    try:
        assert wait_for(lambda: started_a.exists() and started_b.exists(), timeout=30), err_of(a) + err_of(b)
        # each job's tree now holds GPU memory: each watcher records its own job
        pids = [job_pid_of(a), job_pid_of(b)]
        box.write_scenario([{"gpus": [{"utilization.gpu": 50, "memory.used": 9000, "power.draw": 300.0}],
                             "apps": [{"pid": pid, "process_name": "bash", "used_memory": 3000 + 2000 * i}
                                      for i, pid in enumerate(pids)]}])
        assert wait_for(lambda: all(history_rows(box, pid) for pid in pids), timeout=30), err_of(a) + err_of(b)
        release.touch()
        assert (finish(a), finish(b)) == (10, 11), err_of(a) + err_of(b)
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
    # timestamp,pid,used_memory_mib[,...]
    assert [history_rows(box, pid)[0].split(",")[1:3] for pid in pids] == [[str(pids[0]), "3000"],
                                                                            [str(pids[1]), "5000"]]


@pytest.mark.slow
def test_a_wrapped_job_leaves_no_detector_state_and_status_lists_it_as_ended(box, tmp_path):
    """Each `gpu-leak-watch -- CMD` left leak-state-job-<pid>.json behind
    for ever (retention kept it), and while it was there `gpuguard status`
    took the job for one still watched, never for one that ended."""
    box.write_scenario([{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}], "apps": []}])
    cmd, started, release = gate_job(tmp_path, "a", 3)
    proc = start(box, tmp_path, "--", *cmd)
    try:
        assert wait_for(started.exists, timeout=30), err_of(proc)
        pid = job_pid_of(proc)
        box.write_scenario([{"gpus": [{"utilization.gpu": 50, "memory.used": 5000, "power.draw": 300.0}],
                             "apps": [{"pid": pid, "process_name": "bash", "used_memory": 3000}]}])
        assert wait_for(lambda: len(history_rows(box, pid)) >= 2 and any(box.state.glob("leak-state-job-*")),
                        timeout=30), err_of(proc)
        release.touch()
        assert finish(proc) == 3, err_of(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert list(box.state.glob("leak-state*")) == [] and history_rows(box, pid)
    box.write_scenario([{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}], "apps": []}])
    r = subprocess.run([str(ROOT / "bin" / "gpuguard"), "status", "--json"], env=env_for(box), text=True,
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert [j["pid"] for j in json.loads(r.stdout)["ended_jobs"]] == [pid]


def test_a_wrapped_jobs_leak_alert_is_resolved_when_the_job_ends(box, tmp_path, sink):
    """The wrapper stopped its watcher once the job ended and nothing told
    the detector: a leak alert sent while the job ran stayed firing for
    ever (the chat never heard it ended, the metric stayed 1). Now the job's
    end resolves it, reason "gone", as a daemon does for a process that
    ended. The chat is told the job ended, not that its memory stopped
    growing."""
    box.write_scenario([{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}], "apps": []}])
    cmd, started, release = gate_job(tmp_path, "a", 0)
    prom = tmp_path / "prom"
    prom.mkdir()
    env = env_for(box, LEAK_BUCKET_S="1", GPUGUARD_TEXTFILE_DIR=str(prom), NOTIFY_URL=sink.url + "/generic")
    proc = start(box, tmp_path, "--", *cmd, env=env)
    try:
        assert wait_for(started.exists, timeout=30), err_of(proc)
        pid = job_pid_of(proc)
        box.write_scenario([{"gpus": [{"utilization.gpu": 90, "memory.used": 3500 + 64 * i, "power.draw": 500.0}],
                             "apps": [{"pid": pid, "process_name": "python3", "used_memory": 3000 + 64 * i}]}
                            for i in range(400)])
        assert wait_for(lambda: [e["state"] for e in box.events()] == ["firing"], timeout=120), err_of(proc)
        release.touch()
        assert finish(proc) == 0, err_of(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [(e["state"], e.get("reason"), e["pid"]) for e in box.events()] == \
        [("firing", None, pid), ("resolved", "gone", pid)]
    # the job's metrics file went with it
    assert list(prom.iterdir()) == []
    ended = sink.requests[-1]["body"]["message"]
    assert f"PID {pid} bash ended: its GPU memory leak alert is closed" in ended, ended
    assert "stopped growing" not in ended and "slope" not in ended


def test_detector_states_of_killed_wrappers_and_of_long_gone_watchers_are_swept(box):
    box.state.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    killed = box.state / f"leak-state-job-{dead.pid}.json"      # its wrapper was killed by SIGKILL
    old = box.state / "leak-state-pid-77.json"                  # a watcher that last ran 40 days ago
    for path in (killed, old):
        path.write_text('{"series":{},"meta":{}}')
    os.utime(old, (time.time() - 40 * 86400,) * 2)
    box.write_scenario([{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}], "apps": []}])
    r = watch(box, "--", "true", env=env_for(box, LEAK_INTERVAL="60"))
    assert r.returncode == 0, r.stderr
    assert not killed.exists()
    target = subprocess.Popen(["sleep", "30"])
    try:
        r = watch(box, "--pid", str(target.pid), "--once")
    finally:
        target.kill()
        target.wait()
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in box.state.glob("leak-state*")) == ["leak-state-pid-%d.json" % target.pid]


def test_a_wrapped_job_runs_beside_an_all_daemon_and_a_second_daemon_is_refused(box, tmp_path):
    box.write_scenario([{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}], "apps": []}])
    daemon = start(box, tmp_path, "--all", name="daemon")
    try:
        assert wait_for(lambda: "watching every" in err_of(daemon), timeout=30), err_of(daemon)
        r = watch(box, "--", "bash", "-c", "exit 4")
        assert r.returncode == 4, r.stderr
        second = watch(box, "--all")
        assert second.returncode == 1
        assert "another instance holds" in second.stderr and "leak-all.lock" in second.stderr
        # logging to a file, the refusal is still said where the user looks
        log = tmp_path / "gpuguard.log"
        second = watch(box, "--all", env=env_for(box, GPUGUARD_LOG=str(log)))
        assert second.returncode == 1
        assert second.stderr == f"gpu-leak-watch: another gpu-leak-watch (all) already runs on {box.state} (see {log})\n"
        assert "another instance holds" in log.read_text()
        assert daemon.poll() is None
        daemon.send_signal(signal.SIGTERM)
        assert finish(daemon) == 0, err_of(daemon)
    finally:
        if daemon.poll() is None:
            daemon.kill()


# ------------------------------------------- a guard never stops a job --

def path_without_python(tmp_path):
    """A PATH with every command of /usr/bin and /usr/local/bin but python."""
    folder = tmp_path / "bin-without-python"
    folder.mkdir()
    for src in ("/usr/local/bin", "/usr/bin"):
        for name in os.listdir(src):
            if not name.startswith("python") and not (folder / name).exists():
                (folder / name).symlink_to(os.path.join(src, name))
    return str(folder)


@pytest.mark.parametrize("setup,warning", [
    ("state", "is not writable"),
    ("config", "the configuration could not be loaded"),
    ("python", "python3 is not installed"),
    ("smi", "/nonexistent/nvidia-smi is not installed"),
])
def test_the_job_runs_with_a_warning_when_the_watcher_cannot(box, tmp_path, setup, warning):
    env = env_for(box)
    if setup == "state":
        (tmp_path / "a-file").write_text("")
        env["GPUGUARD_STATE_DIR"] = str(tmp_path / "a-file" / "state")    # cannot be created, even by root
    elif setup == "config":
        env["GPUGUARD_CONFIG"] = str(tmp_path / "missing.conf")
    elif setup == "python":
        env["PATH"] = path_without_python(tmp_path)
    else:
        env["NVIDIA_SMI"] = "/nonexistent/nvidia-smi"
    r = watch(box, "--", "bash", "-c", "echo ran; exit 6", env=env)
    assert r.returncode == 6, r.stderr
    assert r.stdout == "ran\n"
    assert "WARN" in r.stderr and warning in r.stderr and "the job runs normally" in r.stderr


# ------------------------------------------------------------------ pid --

@pytest.mark.parametrize("pid", ["99999999", "0"])
def test_a_pid_that_does_not_exist_is_no_such_process_and_exit_2(box, pid):
    """Before, a typo looked like success: "every watched process has
    ended; stopping" and exit 0."""
    box.write_scenario([{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}], "apps": []}])
    for once in ([], ["--once"]):
        r = watch(box, "--pid", pid, "--interval", "1", *once)
        assert (r.returncode, r.stderr) == (2, "gpu-leak-watch: --pid %s: no such process\n" % pid)


def test_one_missing_pid_among_others_is_a_warning(box):
    box.write_scenario([{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}], "apps": []}])
    target = subprocess.Popen(["sleep", "30"])
    try:
        r = watch(box, "--pid", str(target.pid), "--pid", "99999999", "--once")
    finally:
        target.kill()
        target.wait()
    assert r.returncode == 0, r.stderr
    assert "WARN  gpu-leak-watch: --pid 99999999: no such process; watching PID %d\n" % target.pid in r.stderr


# ---------------------------------------------------------------- rules --

@pytest.mark.parametrize("text,why", [
    ("python ignore\n[bad( 30\n", ":2: bad regex: unterminated character set at position 0"),
    ("root:x:0:0:root:/root:/bin/bash\n", ":1: expected 'REGEX ignore|THRESHOLD|KEY=VALUE...'"),
    ("python ignore\ncaf\xe9 30\n", ":2: not UTF-8 text"),
    ("python threshold=nan\n", ":1: threshold must be a number (got 'nan')"),
], ids=["regex", "passwd", "latin1", "nan"])
def test_a_bad_rules_file_is_one_line_and_exit_2_at_start(box, text, why):
    """Before, the watcher started, logged the same error and "leak detector
    failed" every cycle, never analysed anything, and exited 0."""
    rules = box.tmp / "bad.rules"
    rules.write_bytes(text.encode("latin-1"))
    box.write_scenario([{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}], "apps": []}])
    target = subprocess.Popen(["sleep", "3"])
    try:
        for once in (["--once"], ["--interval", "1"]):
            r = watch(box, "--rules", str(rules), "--pid", str(target.pid), *once)
            assert (r.returncode, r.stderr) == (2, "gpu-leak-watch: %s%s\n" % (rules, why))
    finally:
        target.kill()
        target.wait()


def test_a_bad_rules_file_beside_a_job_is_one_warning_and_the_job_runs(box):
    rules = box.tmp / "bad.rules"
    rules.write_text("python ignore\n[bad( 30\n")
    r = watch(box, "--rules", str(rules), "--", "bash", "-c", "echo ran; exit 6")
    assert (r.returncode, r.stdout) == (6, "ran\n"), r.stderr
    (warning,) = [line for line in r.stderr.splitlines() if "WARN" in line]
    assert warning.endswith("not watching job PID %s for leaks: %s:2: bad regex: unterminated character set "
                            "at position 0 (the job runs normally)" % (warning.split("PID ")[1].split()[0], rules))
    assert "leak detector failed" not in r.stderr


@pytest.mark.parametrize("name,value", [("LEAK_BUCKET_S", "abc"), ("LEAK_BUCKET_S", "0"),
                                        ("LEAK_GPU_TOTAL_MIB", "lots")])
def test_a_bad_detector_setting_from_the_environment_is_said_at_start(box, name, value):
    """Only --bucket was checked: LEAK_BUCKET_S=abc from the environment
    failed every cycle ("could not convert string to float"), and 0 ended
    the detector with a traceback every cycle."""
    box.write_scenario([{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}], "apps": []}])
    line = "gpu-leak-watch: %s must be a whole number of at least 1 (got '%s')\n" % (name, value)
    target = subprocess.Popen(["sleep", "30"])
    try:
        r = watch(box, "--pid", str(target.pid), "--once", env=env_for(box, **{name: value}))
        assert (r.returncode, r.stderr) == (2, line)
    finally:
        target.kill()
        target.wait()
    r = watch(box, "--replay", str(box.tmp / "none.csv"), env=env_for(box, **{name: value}))
    assert (r.returncode, r.stderr) == (2, line)
    r = watch(box, "--", "bash", "-c", "exit 4", env=env_for(box, **{name: value}))
    assert r.returncode == 4 and "not watching job PID" in r.stderr and line.split(": ", 1)[1].strip() in r.stderr


# ---------------------------------------------------------------- match --

def test_match_that_matches_nothing_says_what_it_waits_for(box, tmp_path):
    box.write_scenario([{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}], "apps": []}])
    proc = start(box, tmp_path, "--match", "no-such-training-job-[0-9]+",
                 env=env_for(box, LEAK_MATCH_NOTICE_S="1"))
    try:
        assert wait_for(lambda: "still waiting for a process matching" in err_of(proc), timeout=30), err_of(proc)
        proc.send_signal(signal.SIGTERM)
        assert finish(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "no process matches 'no-such-training-job-[0-9]+' yet; waiting for one" in err_of(proc)


def descendants(pid):
    """PIDs of a process's children, grandchildren, ... (pgrep -P)."""
    out, todo = set(), [pid]
    while todo:
        r = subprocess.run(["pgrep", "-P", str(todo.pop())], capture_output=True, text=True)
        kids = {int(p) for p in r.stdout.split()}
        todo += list(kids - out)
        out |= kids
    return out


@pytest.mark.slow
def test_match_never_watches_the_watcher_its_launcher_or_its_detector(box, tmp_path):
    """Before, `timeout 5 gpu-leak-watch --match zzz-nothing` found 1
    process matching: timeout's own command line; and a pattern matching
    the detector (python3 ...gpuguard_leakcheck.py serve) watched it.
    (Other watchers' detectors on this machine may match: only this
    watcher's own processes must not.)"""
    box.write_scenario([{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}], "apps": []}])
    err_path = tmp_path / "watch.err"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(["timeout", "60", WATCH, "--match", "zzz-nothing|gpuguard_leakcheck"],
                                env=env_for(box), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err, preexec_fn=default_signals)
    try:
        # three cycles: the detector runs from the first on
        assert wait_for(lambda: len(box.smi_calls()) >= 3, timeout=30), err_path.read_text()
        own = {proc.pid} | descendants(proc.pid)
        assert any("gpuguard_leakcheck" in open("/proc/%d/cmdline" % p).read() for p in own if
                   os.path.exists("/proc/%d/cmdline" % p))
    finally:
        proc.send_signal(signal.SIGTERM)
        finish(proc)
    log = err_path.read_text()
    found = {int(p) for line in log.splitlines() if "process(es) matching" in line
             for p in line.split(": PID ")[1].split()}
    assert not found & own, log


@pytest.mark.slow
def test_match_from_a_launcher_that_matches_watches_its_matching_job(box, tmp_path):
    """A launcher script whose own command line matches the pattern, and
    that starts the job and the watcher: the job is watched, not the
    launcher (which holds the watcher itself)."""
    box.write_scenario([{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}], "apps": []}])
    job_pid = tmp_path / "job.pid"
    launcher = ('python3 -c "import time; time.sleep(120)" job-marker-42 & echo $! > "$2"; '
                '"$1" --match job-marker-42; kill $!')
    err_path = tmp_path / "watch.err"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(["bash", "-c", launcher, "job-marker-42", WATCH, str(job_pid)],
                                env=env_for(box), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, preexec_fn=default_signals, start_new_session=True)
    try:
        assert wait_for(lambda: "matching 'job-marker-42'" in err_path.read_text(), timeout=30), \
            err_path.read_text()
        pid = int(job_pid.read_text())
        assert "found 1 process(es) matching 'job-marker-42': PID %d\n" % pid in err_path.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        finish(proc)


def test_match_with_an_invalid_pattern_is_one_line_exit_2(box):
    r = watch(box, "--match", "train(")
    assert r.returncode == 2 and r.stderr == "gpu-leak-watch: --match: invalid regular expression 'train('\n"


# --------------------------------------------------------------- options --

@pytest.mark.parametrize("args", [["--pid", str(os.getpid())], ["--all"], ["--match", "train"], ["--once"],
                                  ["--slurm-job", "42"], ["--replay", "trace.csv"]])
def test_a_target_beside_a_command_is_one_line_exit_2_and_nothing_runs(box, tmp_path, args):
    """`--pid N -- CMD` ran CMD and dropped --pid without a word (so did
    --all, --match, --once, --slurm-job and --replay)."""
    ran = tmp_path / "ran"
    r = watch(box, *args, "--", "touch", str(ran))
    assert r.returncode == 2 and r.stderr == "gpu-leak-watch: %s and -- CMD do not go together: " \
        "-- CMD starts a job and watches it\n" % args[0]
    assert not ran.exists()


@pytest.mark.parametrize("args", [["--pid", str(os.getpid())], ["--all"], ["--match", "train"], ["--once"],
                                  ["--slurm-job", "42"]])
def test_a_target_beside_a_replay_is_one_line_exit_2(box, args):
    """`--replay FILE --all` replayed the file and dropped --all without a
    word."""
    r = watch(box, "--replay", str(ROOT / "tests/fixtures/h200/leak-trace-healthy.csv"), *args)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == "gpu-leak-watch: %s and --replay do not go together: --replay reads a recorded CSV\n" % args[0]


def test_version(box):
    r = watch(box, "--version")
    assert r.returncode == 0
    assert r.stdout == "gpu-leak-watch {}\n".format((ROOT / "VERSION").read_text().strip())


def test_bad_option_is_one_line_exit_2_and_help_stays(box):
    r = watch(box, "--frobnicate", "--", "true")
    assert r.returncode == 2 and r.stderr == "gpu-leak-watch: unknown option '--frobnicate' (see --help)\n"
    r = watch(box, "--help")
    assert r.returncode == 0 and "--version" in r.stdout and r.stdout.startswith("Summary:")


def test_ctrl_c_while_the_wrapper_starts_says_so_and_nothing_false(box, tmp_path):
    """Ctrl-C in the wrapper's first tenth of a second reached its helpers
    too (the terminal signals its whole foreground group): it said the state
    folder was "owned by uid ?" or that the job was not watched because of
    a Python traceback. Here a python3 that takes a second to start stands
    for the helper the signal catches."""
    slow = tmp_path / "slowbin"
    slow.mkdir()
    real = shutil.which("python3")
    (slow / "python3").write_text('#!/bin/sh\nsleep 1\nexec %s "$@"\n' % real)
    (slow / "python3").chmod(0o755)
    env = env_for(box, PATH="%s:%s" % (slow, box.env["PATH"]))
    proc = start(box, tmp_path, "--", "sleep", "30", env=env, start_new_session=True)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    assert finish(proc) in (130, -signal.SIGINT)
    err = err_of(proc)
    assert "not watching job PID" in err and "interrupted by SIGINT while starting" in err, err
    assert "Traceback" not in err and "uid ?" not in err and "refusing" not in err


@pytest.mark.parametrize("flag,value", [("--interval", "99999999999999999999"), ("--grace", "99999999999999999999"),
                                        ("--bucket", "99999999999999999999"),
                                        ("--gpu-total-mib", "9999999999999999")])
def test_a_flag_value_out_of_range_is_one_line_naming_the_flag_before_the_job_starts(box, flag, value):
    """--interval 99999999999999999999 -- CMD ran the job unwatched with
    "the configuration could not be loaded" and exit 0 (the same value
    with --all was one line, exit 2); a huge --gpu-total-mib named
    LEAK_GPU_TOTAL_MIB, not the flag the user typed."""
    marker = box.tmp / "ran"
    line = "gpu-leak-watch: %s needs a whole number of at least 1 (at most 10^15) (got '%s')\n" % (flag, value)
    r = watch(box, flag, value, "--", "bash", "-c", "touch %s" % marker)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", line)
    assert not marker.exists()                                   # the job never started
    r = watch(box, flag, value, "--all", "--once")
    assert (r.returncode, r.stderr) == (2, line)


def test_report_on_a_state_folder_the_user_cannot_read_says_so_as_gpuguard_report_does(box):
    """`gpu-leak-watch report` on a root watcher's state folder (mode 700)
    wrote an empty report, "nothing recorded in ... yet", exit 0, where
    `gpuguard report` on the same folder says it cannot read it, exit 2."""
    require(os.geteuid() == 0, "needs root to drop to another user")
    import tempfile
    base = tempfile.mkdtemp(prefix="gpuguard-user-")
    try:
        os.chmod(base, 0o777)
        state = os.path.join(base, "state")
        os.makedirs(os.path.join(state, "history"), 0o700)
        os.chmod(state, 0o700)
        open(os.path.join(state, "events.jsonl"), "w").close()
        env = dict(box.env, GPUGUARD_STATE_DIR=state, HOME=base)
        line = "cannot read the state folder %s (it belongs to root): run as its owner or root\n" % state
        for cmd, prog in ((WATCH, "gpu-leak-watch"), (str(ROOT / "bin/gpuguard"), "gpuguard")):
            out = os.path.join(base, prog + ".html")
            r = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", cmd, "report",
                                "--out", out], env=env, capture_output=True, text=True, timeout=60, cwd=base)
            assert (r.returncode, r.stdout, r.stderr) == (2, "", prog + ": " + line), (prog, r.stdout, r.stderr)
            assert not os.path.exists(out)
    finally:
        shutil.rmtree(base)


def leak_textfiles(folder):
    """{file name: its sample lines} of the leak metrics files in a folder."""
    return {p.name: [line for line in p.read_text().splitlines() if line and not line.startswith("#")]
            for p in folder.glob("gpuguard_leak*.prom")}


@pytest.mark.slow
def test_each_watcher_writes_its_own_metrics_file_and_a_wrapped_jobs_goes_with_the_job(box, tmp_path):
    """Two wrapped jobs and an --all daemon all wrote one gpuguard_leak.prom,
    each from its own series only: every scrape saw one watcher at random,
    so GpuMemoryLeak flapped and dashboards had holes. Now each watcher has
    its own file, its series labelled watcher="<instance>" (no label set
    twice across files, which node_exporter refuses); a wrapped job's file
    is removed when the job ends, a daemon's stays."""
    prom = tmp_path / "prom"
    prom.mkdir()
    (tmp_path / "b").mkdir()
    box.write_scenario([{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}], "apps": []}])
    env = env_for(box, LEAK_BUCKET_S="1", GPUGUARD_TEXTFILE_DIR=str(prom), SMI_STREAM="0")
    cmd_a, started_a, release_a = gate_job(tmp_path, "a", 0)
    cmd_b, started_b, release_b = gate_job(tmp_path / "b", "b", 0)
    a = start(box, tmp_path, "--", *cmd_a, env=env, name="a")
    b = start(box, tmp_path, "--", *cmd_b, env=env, name="b")
    daemon = start(box, tmp_path, "--all", env=env, name="daemon")
    try:
        assert wait_for(lambda: started_a.exists() and started_b.exists(), timeout=30), err_of(a) + err_of(b)
        job_a, job_b = job_pid_of(a), job_pid_of(b)
        box.write_scenario([{"gpus": [{"utilization.gpu": 90, "memory.used": 7000, "power.draw": 500.0}],
                             "apps": [{"pid": job_a, "process_name": "python3", "used_memory": 3000},
                                      {"pid": job_b, "process_name": "python3", "used_memory": 4000}]}])
        file_a, file_b = "gpuguard_leak-job-%d.prom" % a.pid, "gpuguard_leak-job-%d.prom" % b.pid

        def both_written():
            files = leak_textfiles(prom)
            return (any('pid="%d"' % job_a in line for line in files.get(file_a, []))
                    and any('pid="%d"' % job_b in line for line in files.get(file_b, []))
                    and "gpuguard_leak-all.prom" in files)
        assert wait_for(both_written, timeout=60), (err_of(a), err_of(b), leak_textfiles(prom))
        files = leak_textfiles(prom)
        assert 'gpuguard_process_tree_gpu_memory_bytes{pid="%d",name="bash",watcher="job-%d"} %d' % (
            job_a, a.pid, 3000 * 1048576) in files[file_a]
        assert not any('pid="%d"' % job_b in line for line in files[file_a])
        assert not any('pid="%d"' % job_a in line for line in files[file_b])
        assert 'gpuguard_leak_watcher_last_cycle_timestamp_seconds{watcher="all"}' in \
            " ".join(files["gpuguard_leak-all.prom"])
        # no metric and label set twice across the files
        series = [line.rsplit(" ", 1)[0] for lines in files.values() for line in lines]
        assert len(series) == len(set(series)), series
        assert "gpuguard_leak.prom" not in files
        release_a.touch()
        assert finish(a) == 0, err_of(a)
        files = leak_textfiles(prom)
        assert file_a not in files and file_b in files
        release_b.touch()
        assert finish(b) == 0, err_of(b)
        daemon.send_signal(signal.SIGTERM)
        assert finish(daemon) == 0, err_of(daemon)
        assert sorted(leak_textfiles(prom)) == ["gpuguard_leak-all.prom"]
    finally:
        release_a.touch()
        release_b.touch()
        for proc in (a, b, daemon):
            if proc.poll() is None:
                proc.kill()


def test_metrics_files_of_killed_wrappers_and_long_gone_watchers_are_swept(box):
    """A watcher killed with -9 leaves its file: a wrapped job's goes at the
    next retention pass once its wrapper is gone, any other once untouched
    for RETENTION_DAYS; the file all watchers once shared is written by none."""
    prom = box.tmp / "prom"
    prom.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = {"gpuguard_leak-job-%d.prom" % dead.pid: 0, "gpuguard_leak-pid-77.prom": 40 * 86400,
             "gpuguard_leak.prom": 0, "gpuguard_leak-match-5.prom": 3600}
    for name, age in stale.items():
        (prom / name).write_text('gpuguard_process_leak{pid="1",name="x"} 1\n')
        os.utime(prom / name, (time.time() - age,) * 2)
    box.write_scenario([{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}], "apps": []}])
    target = subprocess.Popen(["sleep", "30"])
    try:
        r = watch(box, "--pid", str(target.pid), "--once", env=env_for(box, GPUGUARD_TEXTFILE_DIR=str(prom)))
    finally:
        target.kill()
        target.wait()
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in prom.iterdir()) == ["gpuguard_leak-match-5.prom",
                                                      "gpuguard_leak-pid-%d.prom" % target.pid]


@pytest.mark.slow
def test_a_wrapped_jobs_leak_beside_an_all_daemon_is_alerted_once(box, tmp_path, sink):
    """An --all daemon and a wrapped job's watcher both followed the job's
    GPU process, and one leak was alerted twice (two firing events, two
    chat messages naming the same job). The daemon now leaves a tree that a
    live wrapped-job watcher covers (its lock held) to that watcher, and
    says so once in its log."""
    box.write_scenario([{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}], "apps": []}])
    env = env_for(box, LEAK_BUCKET_S="1", SMI_STREAM="0", NOTIFY_URL=sink.url + "/generic")
    daemon = start(box, tmp_path, "--all", env=env, name="daemon")
    cmd, started, release = gate_job(tmp_path, "a", 0)
    proc = None
    try:
        assert wait_for(lambda: "watching every" in err_of(daemon), timeout=30), err_of(daemon)
        proc = start(box, tmp_path, "--", *cmd, env=env)
        assert wait_for(started.exists, timeout=30), err_of(proc)
        pid = job_pid_of(proc)
        assert wait_for(lambda: (box.state / f"leak-job-{proc.pid}.lock.pid").exists(), timeout=30), err_of(proc)
        box.write_scenario([{"gpus": [{"utilization.gpu": 90, "memory.used": 3500 + 64 * i, "power.draw": 500.0}],
                             "apps": [{"pid": pid, "process_name": "python3", "used_memory": 3000 + 64 * i}]}
                            for i in range(400)])
        assert wait_for(lambda: [e for e in box.events() if e["state"] == "firing"], timeout=120), \
            err_of(proc) + err_of(daemon)
        time.sleep(5)                       # the second watcher's cycles, had it followed the job too
        assert [(e["state"], e["pid"]) for e in box.events()] == [("firing", pid)], err_of(daemon)
        release.touch()
        assert finish(proc) == 0, err_of(proc)
        said = [line for line in err_of(daemon).splitlines() if "leaving PID" in line]
        assert len(said) == 1 and f"to the watcher job-{proc.pid}" in said[0], err_of(daemon)
        assert "gpu_memory_leak firing" not in err_of(daemon)
    finally:
        release.touch()
        for p in (proc, daemon):
            if p is not None and p.poll() is None:
                p.kill()


@pytest.mark.slow
def test_on_leak_against_another_users_process_is_refused_at_start_or_logged(box, tmp_path):
    """As a user other than root, --on-leak kill against a root process
    logged "stopping PID ..." and nothing happened, with no error. Now a
    --pid target of another user is refused at start (one line, exit 2),
    and where the watcher picks processes as they come (--all) the
    kernel's refusal is logged when the leak comes."""
    require(os.geteuid() == 0, "needs root to drop to another user")
    import tempfile
    base = tempfile.mkdtemp(prefix="gpuguard-user-")
    victim = subprocess.Popen(["sleep", "600"])
    try:
        os.chmod(base, 0o777)
        scenario = os.path.join(base, "scenario.json")
        box.scenario = type(box.scenario)(scenario)
        from test_leak import leak_scenario
        leak_scenario(box, victim.pid)
        os.chmod(scenario, 0o644)
        env = dict(box.env, GPUGUARD_STATE_DIR=os.path.join(base, "state"), HOME=base, FAKE_SMI_SCENARIO=scenario,
                   FAKE_SMI_STATE=os.path.join(base, "step"), FAKE_SMI_LOG="")

        def as_nobody(*args, now=None):
            e = dict(env, GPUGUARD_NOW=str(now)) if now else env
            return subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", WATCH,
                                   *args], env=e, capture_output=True, text=True, timeout=60, cwd=base)
        r = as_nobody("--pid", str(victim.pid), "--once", "--on-leak", "kill")
        assert (r.returncode, r.stderr) == (2, "gpu-leak-watch: --on-leak kill cannot act on PID %d: it belongs to "
                                            "another user (run as root or as its owner, or use --on-leak notify)\n"
                                            % victim.pid)
        log = ""
        for i in range(30):
            r = as_nobody("--all", "--once", "--bucket", "1", "--on-leak", "kill", "--grace", "1",
                          now=1796206508 + i)
            assert r.returncode == 0, r.stderr
            log += r.stderr
        assert "stopping PID %d" % victim.pid in log, log
        assert ("could not stop PID %d: not permitted, it belongs to another user (--on-leak needs root or the "
                "process's owner)" % victim.pid) in log, log
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()
        shutil.rmtree(base)


@pytest.mark.slow  # a daemon's cycles: about 2 s
def test_a_killed_wrappers_lock_files_do_not_keep_its_job_from_the_all_daemon(box, tmp_path):
    """A wrapper killed with -9 leaves leak-job-<pid>.lock and its .pid
    behind; its job runs on. The daemon, which had left the job to that
    wrapper while it lived, watches it again once the wrapper is gone,
    where the lock it had seen held kept the job unwatched for good."""
    target = subprocess.Popen(["sleep", "120"])
    box.state.mkdir(parents=True)
    lock = box.state / ("leak-job-%d.lock" % target.pid)
    holder = subprocess.Popen(["flock", str(lock), "sleep", "120"])
    (box.state / ("leak-job-%d.lock.pid" % target.pid)).write_text("%d\n" % holder.pid)
    box.write_scenario([{"gpus": [{"utilization.gpu": 50, "memory.used": 3500, "power.draw": 300.0}],
                         "apps": [{"pid": target.pid, "process_name": "sleep", "used_memory": 3000}]}])
    daemon = start(box, tmp_path, "--all", env=env_for(box, SMI_STREAM="0"), name="daemon")

    def watched():
        try:
            state = json.loads((box.state / "leak-state-all.json").read_text())
        except (OSError, ValueError):
            return False
        return any(s["pid"] == target.pid for s in state["series"].values())
    try:
        assert wait_for(lambda: "leaving PID %d" % target.pid in err_of(daemon), timeout=30), err_of(daemon)
        assert not watched()
        holder.kill()                                  # the wrapper's kill -9
        holder.wait()
        assert wait_for(watched, timeout=30), err_of(daemon)
    finally:
        for p in (daemon, holder, target):
            if p.poll() is None:
                p.kill()
            p.wait()
