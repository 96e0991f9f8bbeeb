"""lowprio-run: exec semantics, tiers, and every mechanism - cgroup v2
against a fake cgroup root, cgroup v1 for real where it is writable (CI's
hybrid machine, as root), systemd-run and cpulimit through recording fakes."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, disk_of, recording_wrapper, require, user_environ, wait_for

CPUS = os.cpu_count()
V1 = "/sys/fs/cgroup/cpu"


def real_cgroup_mode():
    """v2 on a pure-v2 host with a writable root (the H200 machine), v1 where
    the v1 cpu hierarchy is writable (CI's hybrid machine), else None."""
    if os.geteuid() != 0:
        return None
    fs = subprocess.run(["stat", "-fc", "%T", "/sys/fs/cgroup"], capture_output=True, text=True).stdout.strip()
    if fs == "cgroup2fs" and "cpu" in open("/sys/fs/cgroup/cgroup.controllers").read().split() \
            and os.access("/sys/fs/cgroup", os.W_OK):
        return "v2"
    if os.path.exists(V1 + "/cpu.shares") and os.access(V1, os.W_OK):
        return "v1"
    return None


REAL = real_cgroup_mode()
real_cgroup = pytest.mark.require(REAL is not None, "needs root and a writable real cgroup hierarchy (v2 root or v1 cpu)")
REAL_ENV = {"LOWPRIO_MECHANISM": "cgroup-%s" % REAL}
LEAF_PARENT = "/sys/fs/cgroup" if REAL == "v2" else V1


@pytest.fixture(autouse=True)
def own_state_folder(tmp_path, monkeypatch):
    """Each test's own state folder (the disk bandwidth cache, iocost's saved
    settings) and a short disk measurement (a few MiB, not 256)."""
    monkeypatch.setenv("GPUGUARD_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("LOWPRIO_MEASURE_MIB", "8")


def lowprio_environ(**extra):
    """user_environ() with this test's own state folder and measurement
    size (the fixture above sets them; user_environ drops gpuguard keys)."""
    return user_environ(GPUGUARD_STATE_DIR=os.environ["GPUGUARD_STATE_DIR"],
                        LOWPRIO_MEASURE_MIB=os.environ["LOWPRIO_MEASURE_MIB"], **extra)


def run(args, env=None, timeout=60, **kw):
    full = lowprio_environ()
    full.update(env or {})
    return subprocess.run([str(ROOT / "bin/lowprio-run")] + args, env=full, text=True,
                          capture_output=True, timeout=timeout, **kw)


def test_a_jobs_own_tier_option_is_the_jobs():
    """`lowprio-run python3 serve.py --tier gold`: the job's own --tier was
    read as lowprio-run's, "unknown tier 'gold'", and the job never ran."""
    r = run(["--dry-run", "python3", "serve.py", "--tier", "gold"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("tier: batch\n") and r.stdout.endswith(" -- python3 serve.py --tier gold\n")
    r = run(["--tier=offline", "--dry-run", "python3", "serve.py", "--tier", "gold"])
    assert r.returncode == 0 and r.stdout.startswith("tier: offline\n"), r.stderr


def test_dry_run_shows_tier_and_overrides():
    r = run(["--tier", "offline", "--dry-run", "--", "swift", "sft", "--model_type", "qwen3-7b"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("nice -n 19 ionice -c 3 -- swift sft --model_type qwen3-7b\n")
    r = run(["--tier", "batch", "--nice", "10", "--io-class", "5", "--dry-run", "--", "x"])
    assert r.stdout.endswith("nice -n 10 ionice -c 2 -n 5 -- x\n")
    # "print the plan and the command": the limits lowprio-run sets itself,
    # which the command line cannot show (it printed nice and ionice only)
    r = run(["--tier", "offline", "--mem-max", "8G", "--dry-run", "--", "x"])
    plan = r.stdout.splitlines()
    assert plan[0] == "tier: offline" and plan[1].startswith("would apply: nice 19, ionice idle, ")
    assert "mem_max=8589934592" in plan[1] and plan[2].startswith("mechanism: ")


@pytest.mark.parametrize("sig, name", [("9", "KILL"), ("SEGV", "SEGV")])
def test_a_job_a_signal_ends_is_said_in_one_line_without_bash_job_notices(sig, name):
    """Every OOM kill under --mem-max (and kill -9, a segfault) printed
    bash's "lib/lowprio.sh: line 996: PID Killed ( trap - INT QUIT; ...
    )", a page of lowprio-run's own source."""
    r = run(["--", "sh", "-c", "kill -%s $$" % sig])
    assert r.returncode == 128 + signal.Signals["SIG" + name].value
    assert "lowprio.sh: line" not in r.stderr and "trap - INT" not in r.stderr, r.stderr
    assert "job ended with status %d (killed by SIG%s)" % (r.returncode, name) in r.stderr


def test_io_max_without_a_device_limits_the_disk_of_the_current_folder():
    """Users know where their checkpoints go, rarely the disk's MAJ:MIN:
    `--io-max wbps=200M` limits the whole disk holding the current folder;
    a folder on no disk (tmpfs, overlay) is one line and exit 2."""
    st = os.stat(ROOT)
    majmin = "%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))
    require(os.major(st.st_dev) != 0 and os.path.exists("/sys/dev/block/" + majmin),
            "the checkout on a block device")
    sysdir = os.path.realpath("/sys/dev/block/" + majmin)
    if os.path.exists(os.path.join(sysdir, "partition")):
        sysdir = os.path.dirname(sysdir)
    disk = open(os.path.join(sysdir, "dev")).read().strip()
    r = run(["--explain", "--io-max", "wbps=200M"], cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "io_max=%s wbps=209715200" % disk in r.stdout
    shm = os.stat("/dev/shm")
    require(os.major(shm.st_dev) == 0, "/dev/shm on tmpfs")
    r = run(["--io-max", "wbps=200M", "--", "true"], cwd="/dev/shm")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert "/dev/shm is on tmpfs" in r.stderr and "no disk to limit there" in r.stderr


@pytest.mark.parametrize("args,message", [
    (["--tier", "bogus", "--", "true"], "unknown tier 'bogus' (tiers: system, online, batch, offline)"),
    (["--nice", "25", "--", "true"], "--nice takes -20..19 (got '25')"),
    (["--cpu-weight", "0", "--", "true"], "--cpu-weight takes 1-10000 or idle (got '0')"),
    (["--cpu-max", "lots", "--", "true"], "--cpu-max takes a number of CPUs such as 2 or 0.5 (got 'lots')"),
    (["--mem-max", "5X", "--", "true"], "--mem-max takes a size such as 8G or 512M (got '5X')"),
    (["--io-max", "/nonexistent:rbps=1M", "--", "true"], "--io-max takes [DEV:]rbps=N,wbps=N"),
    (["--io-class", "realtime", "--", "true"], "the realtime I/O class is not offered"),
    (["--attach", "999999999"], "--attach needs a running PID (got '999999999')"),
    # both a job to demote and one to start: one of them was dropped (the
    # command never ran, and the PID's whole tree was demoted)
    (["--attach", str(os.getpid()), "--", "true"], "--attach PID demotes a running job; -- CMD starts one"),
    (["--tier", "batch"], "no command given"),
    (["--bogus", "--", "true"], "unknown option '--bogus'"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    r = run(args)
    assert r.returncode == 2
    assert message in r.stderr and len(r.stderr.splitlines()) == 1


@pytest.mark.parametrize("args,message", [
    (["--io-max", "wbps=9999999999T"], "--io-max: 'wbps=9999999999T' is not rbps=N or wbps=N"),   # wrapped past 2^64
    (["--io-max", "wbps=99999999999999999999"], "--io-max: 'wbps=99999999999999999999' is not rbps=N"),
    (["--io-max", "wbps=1025T"], "--io-max: 'wbps=1025T' is not rbps=N or wbps=N"),
    (["--nice", "1O"], "--nice takes -20..19 (got '1O')"),
    (["--nice", "99999999999999999999"], "--nice takes -20..19 (got '99999999999999999999')"),
    (["--nice", "-099"], "--nice takes -20..19 (got '-099')"),
    (["--cpu-weight", "0x10"], "--cpu-weight takes 1-10000 or idle (got '0x10')"),
    (["--cpu-max", "99999999999999999999"], "--cpu-max takes a number of CPUs such as 2 or 0.5"),
    (["--pids-max", "99999999999999999999"], "--pids-max takes 1-4194304 (got '99999999999999999999')"),
    (["--mem-max", "99999999999999999999G"], "--mem-max takes a size such as 8G or 512M"),
])
def test_a_number_that_is_not_plain_decimal_or_too_large_is_one_line_exit_2(tmp_path, args, message):
    """One check for every number: decimal digits only, an upper bound; no
    raw bash arithmetic error, no value wrapped around in 64 bits."""
    require(disk_of(tmp_path) is not None, "the test's folder on a block device")
    marker = tmp_path / "started"
    r = run(args + ["--", "touch", str(marker)], cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert not marker.exists()


def test_leading_zeros_are_read_as_decimal():
    """'09' is 9 and '010' is 10 (bash alone reads the first as a bad octal
    number and the second as 8)."""
    r = run(["--nice", "09", "--cpu-weight", "010", "--pids-max", "08", "--cpu-max", "02.5", "--explain"])
    assert r.returncode == 0, r.stderr
    assert "would apply: nice 9," in r.stdout
    for setting in ("cpu_weight=10", "pids_max=8", "cpu_max=2500"):
        assert setting in r.stdout
    r = run(["--nice", "010", "--dry-run", "--", "x"])
    assert r.returncode == 0 and " nice -n 10 " in r.stdout, r.stderr


def test_raising_priority_needs_root(tmp_path):
    if os.geteuid() != 0:
        r = run(["--tier", "system", "--", "true"])
    else:
        r = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                            str(ROOT / "bin/lowprio-run"), "--tier", "system", "--", "true"],
                           capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "only root may, and only when asked" in r.stderr


@pytest.mark.parametrize("mechanism", ["autogroup", "auto"])
def test_arguments_pass_verbatim_and_exit_code_returns(mechanism):
    args = ["a b", "$(touch /tmp/never)", "*", "'q'", "--nice", ""]
    r = run(["--", "printf", "[%s]\\n"] + args, env={"LOWPRIO_MECHANISM": mechanism})
    assert r.returncode == 0, r.stderr
    assert r.stdout == "".join("[%s]\n" % a for a in args)
    r = run(["--", "sh", "-c", "exit 42"], env={"LOWPRIO_MECHANISM": mechanism})
    assert r.returncode == 42


@pytest.mark.parametrize("mechanism", ["autogroup", "cgroup-v2"])
def test_a_missing_command_is_named_by_lowprio_run_and_a_dash_command_runs(tmp_path, mechanism):
    """The error names lowprio-run and the job's command, as a shell would
    (not ionice's "failed to execute"); a job whose name starts with '-'
    runs as a command, not as an option of nice or ionice."""
    env = {"LOWPRIO_MECHANISM": mechanism}
    if mechanism == "cgroup-v2":
        env.update(fake_v2_env(tmp_path, fake_v2_root(tmp_path)))
    r = run(["--", "nosuchcmd-gg", "arg"], env=env)
    assert r.returncode == 127
    assert r.stderr == "lowprio-run: nosuchcmd-gg: command not found\n"
    r = run(["--", str(tmp_path / "nothere")], env=env)
    assert r.returncode == 127 and r.stderr == "lowprio-run: %s: No such file or directory\n" % (tmp_path / "nothere")
    dash = tmp_path / "bin" / "-x"
    dash.parent.mkdir()
    dash.write_text('#!/bin/sh\necho "ran $*"\n')
    dash.chmod(0o755)
    env["PATH"] = "%s:%s" % (dash.parent, os.environ["PATH"])
    r = run(["--", "-x", "a b"], env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ran a b\n"


def default_signals():
    """A child with the default disposition for every signal: a job started
    in the background of a script inherits SIGINT/SIGQUIT ignored, and a
    shell cannot trap a signal ignored on entry."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


# The job records the signal it got, then dies of it (128+N is the status).
# Python, not bash: bash -c ignores QUIT sent to itself.
SIGNAL_JOB = r"""
import os, resource, signal, sys, time
name, marker, ready = sys.argv[1:]
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
def got(num, frame):
    with open(marker, "a") as f:
        f.write(name + "\n")
    signal.signal(num, signal.SIG_DFL)
    os.kill(os.getpid(), num)
signal.signal(getattr(signal, "SIG" + name), got)
open(ready, "w").close()
while True:
    time.sleep(0.05)
"""


@pytest.mark.parametrize("mechanism", ["auto", "autogroup"])
@pytest.mark.parametrize("sig", ["INT", "TERM", "HUP", "QUIT"])
def test_signals_are_forwarded_and_the_job_status_returned(tmp_path, sig, mechanism):
    marker, ready = tmp_path / "got", tmp_path / "ready"
    env = lowprio_environ(LOWPRIO_MECHANISM=mechanism)
    proc = subprocess.Popen([str(ROOT / "bin/lowprio-run"), "--", sys.executable, "-c", SIGNAL_JOB,
                             sig, str(marker), str(ready)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            restore_signals=True, preexec_fn=default_signals, start_new_session=True)
    try:
        # The job says when its handler is set: a signal sent earlier kills
        # it before it can record anything (the old test's intermittent 143).
        assert wait_for(ready.exists, timeout=60)
        proc.send_signal(getattr(signal, "SIG" + sig))
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
            proc.wait()
    assert marker.read_text() == sig + "\n", err
    assert proc.returncode == 128 + getattr(signal, "SIG" + sig), err


# Counts the INTs it gets; ends when told.
COUNTING_JOB = r"""
import os, signal, sys, time
marker, ready, stop = sys.argv[1:]
def got(num, frame):
    with open(marker, "a") as f:
        f.write("INT\n")
signal.signal(signal.SIGINT, got)
open(ready, "w").close()
while not os.path.exists(stop):
    time.sleep(0.05)
"""


@pytest.mark.parametrize("mechanism,decision", [
    ("auto", "INT reached the job too (sent to its process group): not sent again"),   # same process group
    ("autogroup", "passing INT on to the job"),                              # own session (setsid)
])
def test_ctrl_c_at_a_terminal_reaches_the_job_once(tmp_path, mechanism, decision):
    """A second INT would interrupt the job's own clean-up (a checkpoint
    save in `except KeyboardInterrupt`)."""
    import pty
    marker, ready, stop = tmp_path / "got", tmp_path / "ready", tmp_path / "stop"
    env = lowprio_environ(LOWPRIO_MECHANISM=mechanism, GPUGUARD_LOG_LEVEL="debug",
               GPUGUARD_LOG=str(tmp_path / "log"))
    pid, fd = pty.fork()
    if pid == 0:
        default_signals()
        os.execve(str(ROOT / "bin/lowprio-run"), [str(ROOT / "bin/lowprio-run"), "--", sys.executable, "-c",
                                                  COUNTING_JOB, str(marker), str(ready), str(stop)], env)
    try:
        assert wait_for(ready.exists, timeout=60)
        os.write(fd, b"\x03")                                  # Ctrl-C typed at the terminal
        assert wait_for(lambda: marker.exists() and marker.read_text(), timeout=60)
        assert wait_for(lambda: decision in (tmp_path / "log").read_text(), timeout=60)
        stop.touch()
        _, status = os.waitpid(pid, 0)
    finally:
        stop.touch()
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    assert marker.read_text() == "INT\n"


# Records every INT, TERM, HUP and QUIT it gets, one line each; ends when told.
RECORDING_JOB = r"""
import os, signal, sys, time
marker, ready, stop = sys.argv[1:]
def got(num, frame):
    with open(marker, "a") as f:
        f.write(signal.Signals(num).name + "\n")
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(s, got)
open(ready, "w").close()
while not os.path.exists(stop):
    time.sleep(0.05)
"""


def mechanism_env(tmp_path, mechanism):
    """The environment that makes lowprio-run pick a mechanism: its own
    cgroup v2 leaf (a fake root), its own session and autogroup, or a
    systemd scope (a recording systemd-run that runs what follows)."""
    if mechanism == "cgroup-v2":
        return fake_v2_env(tmp_path, fake_v2_root(tmp_path))
    if mechanism == "systemd":
        fake = recording_wrapper(tmp_path / "bin", "systemd-run", tmp_path / "args")
        return {"PATH": "%s:%s" % (fake, os.environ["PATH"]), "LOWPRIO_SYSTEMD": "1"}
    return {"LOWPRIO_MECHANISM": mechanism}


def tree_of(pid):
    """A process and all its descendants, parents first."""
    found = [pid]
    for task in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/children" % (pid, task)) as f:
                children = f.read().split()
        except OSError:
            children = []
        for child in children:
            found += tree_of(int(child))
    return found


@pytest.mark.parametrize("mechanism", ["cgroup-v2", "autogroup", "systemd"])
@pytest.mark.parametrize("sig,to", [("TERM", "group"), ("INT", "group"), ("HUP", "group"), ("QUIT", "group"),
                                    ("TERM", "every process"), ("TERM", "lowprio-run")])
def test_a_signal_to_the_whole_group_or_cgroup_reaches_the_job_exactly_once(tmp_path, mechanism, sig, to):
    """timeout, kill -- -PGID, a terminal's ^C or gpu-leak-watch passing one
    on send a signal to lowprio-run's whole process group; systemd and
    scancel send one to every process of its cgroup. Where that reached the
    job, lowprio-run must not send it again (a second TERM or INT breaks a
    checkpoint save); sent to lowprio-run alone, it is passed on. While the
    signal is sent lowprio-run is stopped, and it goes on only once the job
    has its copy, so that a second copy from lowprio-run cannot merge with
    the first in the job's pending signals."""
    marker, ready, stop, log = tmp_path / "got", tmp_path / "ready", tmp_path / "stop", tmp_path / "log"
    env = lowprio_environ(GPUGUARD_LOG_LEVEL="debug", GPUGUARD_LOG=str(log), **mechanism_env(tmp_path, mechanism))
    proc = subprocess.Popen([str(ROOT / "bin/lowprio-run"), "--tier", "online", "--", sys.executable, "-c",
                             RECORDING_JOB, str(marker), str(ready), str(stop)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=default_signals, start_new_session=True)
    try:
        assert wait_for(ready.exists, timeout=60)
        number = getattr(signal, "SIG" + sig)
        os.kill(proc.pid, signal.SIGSTOP)
        if to == "group":
            os.killpg(proc.pid, number)
        elif to == "every process":
            for pid in tree_of(proc.pid):
                os.kill(pid, number)
        else:
            os.kill(proc.pid, number)
        job_shares_group = mechanism != "autogroup"
        if to == "every process" or (to == "group" and job_shares_group):
            assert wait_for(marker.exists, timeout=30)
        os.kill(proc.pid, signal.SIGCONT)
        assert wait_for(lambda: log.exists() and ("%s reached the job too" % sig in log.read_text()
                                                  or "passing %s on to the job" % sig in log.read_text()),
                        timeout=30)
        assert wait_for(marker.exists, timeout=30)
        stop.touch()
        _, err = proc.communicate(timeout=60)
    finally:
        stop.touch()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert marker.read_text() == "SIG%s\n" % sig, log.read_text()
    assert proc.returncode == 0, err
    passed_on = "passing %s on to the job" % sig in log.read_text()
    assert passed_on == (to == "lowprio-run" or (to == "group" and not job_shares_group)), log.read_text()


def test_a_signal_during_start_up_is_not_lost(tmp_path):
    """TERM sent at once: it reaches lowprio-run before or while the job is
    being started; lowprio-run neither dies alone (leaving the job running)
    nor swallows it."""
    # (a duration no other process on the box uses: pgrep looks at them all)
    proc = subprocess.Popen([str(ROOT / "bin/lowprio-run"), "--", "sleep", "300.25"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            restore_signals=True, preexec_fn=default_signals)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode in (143, -15)
    assert subprocess.run(["pgrep", "-f", r"^sleep 300\.25$"], capture_output=True).returncode == 1


def test_stdin_reaches_the_job():
    r = subprocess.run([str(ROOT / "bin/lowprio-run"), "--", "cat"], input="hello\n", text=True,
                       capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "hello\n", r.stderr


THREAD_PROBE = r"""
import os, threading, subprocess, time
ts = [threading.Thread(target=time.sleep, args=(2,)) for _ in range(3)]
[t.start() for t in ts]
time.sleep(0.2)
nices = sorted({open("/proc/self/task/%s/stat" % t).read().rsplit(") ", 1)[1].split()[16] for t in os.listdir("/proc/self/task")})
print("threads", len(os.listdir("/proc/self/task")), "nice", ",".join(nices))
print("child", subprocess.run(["sh", "-c", "ionice -p $$; cut -d' ' -f19 /proc/$$/stat"], capture_output=True, text=True).stdout.split())
"""


@pytest.mark.parametrize("mechanism", ["autogroup", "auto"])
def test_every_thread_and_child_inherits_nice_and_io_class(mechanism):
    r = run(["--tier", "batch", "--", sys.executable, "-c", THREAD_PROBE], env={"LOWPRIO_MECHANISM": mechanism})
    assert r.returncode == 0, r.stderr
    assert "threads 4 nice 15" in r.stdout
    assert "child ['idle', '15']" in r.stdout


def test_autogroup_fallback_puts_the_job_in_its_own_niced_autogroup():
    r = run(["--tier", "offline", "--", "sh", "-c", "cat /proc/self/autogroup"],
            env={"LOWPRIO_MECHANISM": "autogroup"})
    assert r.returncode == 0, r.stderr
    assert re.match(r"/autogroup-\d+ nice 19$", r.stdout.strip())
    # A process in the boot-time autogroup (never under setsid, e.g. a CI
    # container's runner) reads an empty file: any named autogroup differs.
    mine = open("/proc/self/autogroup").read().split()
    assert not mine or r.stdout.split()[0] != mine[0]
    assert "via autogroup" in r.stderr


def fake_v2_root(tmp_path, caller="/"):
    """A cgroup v2 tree in a folder (the root has no cgroup.type; a child
    has), and a /proc/self/cgroup that puts the caller at `caller`."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids\n")
    (root / "cgroup.subtree_control").write_text("cpuset\n")
    (root / "cgroup.procs").write_text("")
    (tmp_path / "proc-cgroup").write_text("0::%s\n" % caller)
    return root


def fake_v2_env(tmp_path, root):
    return {"LOWPRIO_CGROUP_ROOT": str(root), "LOWPRIO_CGROUP_MODE": "v2",
            "LOWPRIO_PROC_CGROUP": str(tmp_path / "proc-cgroup")}


def fake_v2_child(parent, name, procs="", limits=None):
    """A non-root cgroup; `limits` maps interface files to values (the
    others read as unlimited)."""
    child = parent / name
    child.mkdir()
    (child / "cgroup.type").write_text("domain\n")
    (child / "cgroup.controllers").write_text((parent / "cgroup.controllers").read_text())
    (child / "cgroup.subtree_control").write_text("")
    (child / "cgroup.procs").write_text(procs)
    files = {"memory.max": "max", "memory.high": "max", "cpu.max": "max 100000", "cpu.weight": "100",
             "pids.max": "max", "io.max": ""}
    files.update(limits or {})
    for f, v in files.items():
        (child / f).write_text(v + "\n" if v else "")
    return child


CONTAINER = {"memory.max": str(8 << 30)}


def test_cgroup_v2_leaf_gets_every_limit(tmp_path):
    root = fake_v2_root(tmp_path)
    r = run(["--tier", "batch", "--mem-high", "1G", "--mem-max", "2G", "--io-max", "254:0:wbps=10M,rbps=20M",
             "--pids-max", "100", "--", "sh", "-c", "cat %s/gpuguard-lowprio-*/cgroup.procs; echo $$" % root],
            env=fake_v2_env(tmp_path, root))
    assert r.returncode == 0, r.stderr
    procs, me = r.stdout.split()
    assert procs == me                            # the job itself was moved in before exec
    (leaf,) = root.glob("gpuguard-lowprio-*")
    files = {p.name: p.read_text().strip() for p in leaf.iterdir()}
    assert files["cpu.idle"] == "1"
    assert files["cpu.max"] == "%d 100000" % (60 * CPUS * 10 * 100)
    assert files["memory.high"] == str(1 << 30) and files["memory.max"] == str(2 << 30)
    assert files["memory.swap.max"] == "0" and files["memory.oom.group"] == "1"
    assert files["io.max"] == "254:0 wbps=10485760 rbps=20971520"
    assert files["pids.max"] == "100"
    # ionice misses buffered writes (the flusher issues them): the idle
    # class goes on the cgroup too
    assert files["io.prio.class"] == "idle"
    assert (root / "cgroup.subtree_control").read_text() == "+cpu +memory +io +pids\n"
    assert "via cgroup-v2" in r.stderr and "CPU idle class (cpu.idle=1)" in r.stderr
    r = run(["--tier", "online", "--cpu-weight", "30", "--", "true"],
            env=fake_v2_env(tmp_path, root))
    assert "CPU weight 30 (cpu.weight=30)" in r.stderr
    assert "io.prio.class" not in r.stderr       # best-effort: the flusher's class stays


def test_io_idle_class_reaches_buffered_writes_or_says_why_not(tmp_path):
    """A user asking for the I/O idle class gets it for the checkpoint the
    job writes through the page cache too (io.prio.class), or a line
    saying it is not in force and why."""
    root = fake_v2_root(tmp_path)
    r = run(["--tier", "online", "--io-class", "idle", "--", "true"], env=fake_v2_env(tmp_path, root))
    assert r.returncode == 0, r.stderr
    (leaf,) = root.glob("gpuguard-lowprio-*")
    assert (leaf / "io.prio.class").read_text() == "idle\n"
    assert "I/O idle class for its buffered writes too (io.prio.class=idle)" in r.stderr
    r = run(["--tier", "batch", "--explain"], env=fake_v2_env(tmp_path, root))
    assert "io_prio=idle" in r.stdout
    r = run(["--tier", "batch", "--", "true"], env=dict(fake_v2_env(tmp_path, root), LOWPRIO_MECHANISM="autogroup"))
    assert r.returncode == 0
    assert "not in force: io_prio=idle needs a cgroup" in r.stderr


def test_cgroup_v2_offline_uses_the_idle_class(tmp_path):
    root = fake_v2_root(tmp_path)
    r = run(["--tier", "offline", "--", "true"], env=fake_v2_env(tmp_path, root))
    assert r.returncode == 0, r.stderr
    (leaf,) = root.glob("gpuguard-lowprio-*")
    assert (leaf / "cpu.idle").read_text() == "1\n"


def test_cgroup_failure_falls_back_and_says_what_is_not_in_force(tmp_path):
    root = fake_v2_root(tmp_path)
    (root / "cgroup.subtree_control").unlink()
    (root / "cgroup.subtree_control").mkdir()      # any write fails
    r = run(["--tier", "batch", "--mem-max", "1G", "--", "sh", "-c", "cat /proc/self/autogroup"],
            env=fake_v2_env(tmp_path, root))
    assert r.returncode == 0, r.stderr
    assert "not in force: cgroup v2 not used: Is a directory" in r.stderr
    # (once: it said "not in force: ... needs a cgroup: not in force")
    assert "not in force: mem_max=1073741824 needs a cgroup\n" in r.stderr
    assert "via autogroup" in r.stderr and r.stdout.strip().endswith("nice 15")


def test_v2_leaf_goes_under_the_callers_cgroup_whose_processes_move_aside(tmp_path):
    """A caller inside a container's (or slice's) cgroup: the leaf is made
    under it, not at the top, so its limits still hold; its own processes
    move into a sibling leaf first (no internal processes rule)."""
    root = fake_v2_root(tmp_path, caller="/ctr")
    ctr = fake_v2_child(root, "ctr", procs="4242\n4343\n", limits=CONTAINER)
    r = run(["--tier", "batch", "--mem-max", "1G", "--", "sh", "-c", "echo $$"], env=fake_v2_env(tmp_path, root))
    assert r.returncode == 0, r.stderr
    assert list(root.glob("gpuguard-lowprio-*")) == []          # nothing at the top
    (leaf,) = ctr.glob("gpuguard-lowprio-*")
    assert (leaf / "cgroup.procs").read_text() == r.stdout      # the job itself
    assert (leaf / "cpu.idle").read_text() == "1\n" and (leaf / "memory.max").read_text() == "%d\n" % (1 << 30)
    assert (ctr / "gpuguard-caller/cgroup.procs").read_text() == "4242\n4343\n"
    assert (ctr / "cgroup.subtree_control").read_text() == "+cpu +memory +io +pids\n"
    assert "moved its 2 processes into /ctr/gpuguard-caller" in r.stderr


def test_v2_leaf_goes_as_high_as_it_can_without_leaving_a_limit(tmp_path):
    """Weights and the idle class only order siblings: the leaf goes up to
    the first cgroup around the caller that sets a limit (here /a, with a
    CPU cap), not above it, and not needlessly below it."""
    root = fake_v2_root(tmp_path, caller="/a/b/c")
    a = fake_v2_child(root, "a", limits={"cpu.max": "400000 100000"})
    b = fake_v2_child(a, "b")
    c = fake_v2_child(b, "c", procs="4242\n")
    r = run(["--tier", "batch", "--", "true"], env=fake_v2_env(tmp_path, root))
    assert r.returncode == 0, r.stderr
    assert len(list(a.glob("gpuguard-lowprio-*"))) == 1
    assert list(root.glob("gpuguard-*")) == [] and list(c.glob("gpuguard-*")) == []
    assert "/a sets cpu.max=400000; the caller's cgroup is /a/b/c" in r.stderr
    # nothing limits anything: a sibling of the services at the top
    (tmp_path / "proc-cgroup").write_text("0::/free/session\n")
    free = fake_v2_child(root, "free")
    fake_v2_child(free, "session", procs="4242\n")
    r = run(["--tier", "batch", "--", "true"], env=fake_v2_env(tmp_path, root))
    assert r.returncode == 0, r.stderr
    assert len(list(root.glob("gpuguard-lowprio-*"))) == 1
    assert "no cgroup above it sets a limit; the caller's cgroup is /free/session" in r.stderr


def test_v2_a_caller_moved_aside_earlier_gets_a_sibling_leaf_not_a_nested_one(tmp_path):
    root = fake_v2_root(tmp_path, caller="/ctr/gpuguard-caller")
    ctr = fake_v2_child(root, "ctr", limits=CONTAINER)
    (ctr / "cgroup.subtree_control").write_text("cpu memory io pids\n")
    aside = fake_v2_child(ctr, "gpuguard-caller", procs="4242\n")
    r = run(["--tier", "batch", "--", "true"], env=fake_v2_env(tmp_path, root))
    assert r.returncode == 0, r.stderr
    assert len(list(ctr.glob("gpuguard-lowprio-*"))) == 1
    assert list(aside.glob("gpuguard-*")) == []
    assert "moved its" not in r.stderr


def test_v2_where_moving_is_forbidden_the_job_runs_and_the_reason_is_given(tmp_path):
    root = fake_v2_root(tmp_path, caller="/ctr")
    ctr = fake_v2_child(root, "ctr", procs="4242\n", limits=CONTAINER)
    env = dict(fake_v2_env(tmp_path, root), LOWPRIO_CGROUP_MOVE_CALLER="0")
    r = run(["--tier", "batch", "--", "sh", "-c", "exit 3"], env=env)
    assert r.returncode == 3
    assert "cgroup v2 not used: EBUSY: %s holds 1 processes of its own" % ctr in r.stderr
    assert "via autogroup" in r.stderr
    assert list(ctr.glob("gpuguard-*")) == [] and list(root.glob("gpuguard-*")) == []
    r = run(["--tier", "batch", "--explain"], env=env)
    assert "cgroup placement: none: /ctr holds 1 processes of its own (no internal processes rule)" in r.stdout


def test_explain_and_dry_run_name_the_placement_and_change_nothing(tmp_path):
    root = fake_v2_root(tmp_path, caller="/ctr")
    ctr = fake_v2_child(root, "ctr", procs="4242\n4343\n", limits=CONTAINER)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    r = run(["--tier", "batch", "--explain"], env=fake_v2_env(tmp_path, root))
    assert r.returncode == 0, r.stderr
    assert ("cgroup placement: a leaf under the caller's cgroup /ctr, after moving its 2 processes into "
            "/ctr/gpuguard-caller") in r.stdout
    r = run(["--tier", "batch", "--dry-run", "--", "true"], env=fake_v2_env(tmp_path, root))
    assert r.returncode == 0 and r.stdout.startswith("tier: batch\n") and "\nwould run:" in r.stdout
    assert "mechanism: cgroup-v2\n" in r.stdout
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    assert (ctr / "cgroup.procs").read_text() == "4242\n4343\n"


# The job writes what a kernel would count into its own (fake) leaf.
FAKE_USAGE = r"""d=$(echo {root}/gpuguard-lowprio-*)
printf 'usage_usec 2500000\nnr_periods 40\nnr_throttled 12\nthrottled_usec 1500000\n' > $d/cpu.stat
echo 734003200 > $d/memory.peak
printf 'anon 1\npgsteal 2560\n' > $d/memory.stat
printf 'low 0\nhigh 7\nmax 1\noom 0\noom_kill 0\n' > $d/memory.events
printf '254:0 rbytes=1048576 wbytes=3221225472 rios=1 wios=2\n259:0 rbytes=1048576 wbytes=0\n' > $d/io.stat
for f in cpu memory io; do
  printf 'some avg10=1.00 avg60=0 avg300=0 total=250000\nfull avg10=0 avg60=0 avg300=0 total=125000\n' > $d/$f.pressure
done
exit 5
"""


def test_exit_line_and_report_say_what_the_limits_did(tmp_path):
    root = fake_v2_root(tmp_path)
    r = run(["--tier", "batch", "--report", "--", "sh", "-c", FAKE_USAGE.format(root=root)],
            env=fake_v2_env(tmp_path, root))
    assert r.returncode == 5, r.stderr
    (line,) = [x for x in r.stderr.splitlines() if "job ended" in x]
    assert "job ended with status 5 after" in line
    for part in ("CPU time 2.50 s", "CPU throttled 12 periods, 1.50 s", "memory peak 700.0 MiB",
                 "memory reclaimed 10.0 MiB (memory.high hit 7 times, max 1, OOM kills 0)",
                 "I/O read 2.0 MiB, written 3.0 GiB",
                 "pressure stall cpu 0.25 s, memory 0.25 s, io 0.25 s (some); memory 0.12 s, io 0.12 s (full)"):
        assert part in line, (part, line)
    assert "not available" not in line
    report = r.stderr[r.stderr.index("lowprio-run report"):].splitlines()
    assert report[0].startswith("lowprio-run report (cgroup v2 leaf gpuguard-lowprio-")
    assert report[1].split() == ["exit", "status", "5"]
    assert "  memory peak        700.0 MiB" in report


def test_garbage_in_the_stat_files_never_costs_the_jobs_status(tmp_path):
    root = fake_v2_root(tmp_path)
    garbage = ("d=$(echo %s/gpuguard-lowprio-*); echo garbage > $d/memory.peak; "
               "printf 'usage_usec x\\n' > $d/cpu.stat; "
               "printf 'some avg10=1 total=\\n' > $d/cpu.pressure; printf '8:0 rbytes=abc wbytes=\\n' > $d/io.stat; "
               "exit 4" % root)
    r = run(["--report", "--", "sh", "-c", garbage], env=fake_v2_env(tmp_path, root))
    assert r.returncode == 4, r.stderr
    assert "job ended with status 4" in r.stderr and "memory peak (memory.peak" in r.stderr


def test_report_names_what_this_kernel_does_not_provide(tmp_path):
    root = fake_v2_root(tmp_path)
    r = run(["--", "true"], env=fake_v2_env(tmp_path, root))
    (line,) = [x for x in r.stderr.splitlines() if "job ended" in x]
    assert "not available: CPU throttling (cpu.stat), memory peak (memory.peak: kernel 5.19+)" in line
    r = run(["--report", "--", "true"], env={"LOWPRIO_MECHANISM": "autogroup"})
    assert "not available      throttling, memory, I/O and pressure stall (they need a cgroup" in r.stderr
    assert "  CPU time" in r.stderr


NOBODY = 65534


def as_user(args, uid=NOBODY, **kw):
    """Runs a command as another (real) user, as that user would type it."""
    require(os.geteuid() == 0, "needs root to run a command as a second user")
    return subprocess.run(["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups"] + args,
                          capture_output=True, text=True, timeout=60, **kw)


def shared_tmp():
    """A folder a second user can reach (pytest's tmp_path is root-only)."""
    import tempfile
    d = tempfile.mkdtemp(prefix="gg-lowprio-")
    os.chmod(d, 0o755)
    return d


def kernel_thread():
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            stat = open("/proc/%d/stat" % pid).read().rsplit(") ", 1)[1].split()
        except OSError:
            continue
        if stat[1] == "2":
            return pid
    return None


def test_attach_refuses_pid_1_and_kernel_threads():
    """Run where a regression could do no harm: PID 1 of a PID namespace of
    our own (a version that accepted it demoted a whole machine), and the
    kernel threads as a second user, who may not renice them anyway."""
    require(os.geteuid() == 0 and subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                                                 capture_output=True).returncode == 0,
            "needs root and unshare --pid (CAP_SYS_ADMIN)")
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", str(ROOT / "bin/lowprio-run"),
                        "--tier", "batch", "--attach", "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "--attach refuses PID 1 (init)" in r.stderr
    kthread = kernel_thread()
    require(kthread is not None, "needs a visible kernel thread (not in a PID namespace)")
    for pid in (2, kthread):
        r = as_user([str(ROOT / "bin/lowprio-run"), "--tier", "batch", "--attach", str(pid)])
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
        assert "--attach refuses PID %d: it is a kernel thread" % pid in r.stderr


def test_attach_refuses_another_users_process_unless_root():
    job = subprocess.Popen(["sleep", "60"])
    try:
        r = as_user([str(ROOT / "bin/lowprio-run"), "--tier", "batch", "--attach", str(job.pid)])
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
        assert "--attach refuses PID %d: it belongs to root; only root may demote another user's process" % job.pid \
            in r.stderr
        assert open("/proc/%d/stat" % job.pid).read().rsplit(") ", 1)[1].split()[16] == "0"
    finally:
        job.kill()
        job.wait()


def test_attach_by_a_user_reports_what_it_could_not_do():
    """nobody's own job already at nice 19: a user may not lower it to 15."""
    require(os.geteuid() == 0, "needs root to start a second user's job")
    job = subprocess.Popen(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups",
                            "nice", "-n", "19", "sleep", "60"])
    try:
        assert wait_for(lambda: open("/proc/%d/comm" % job.pid).read().strip() == "sleep")
        r = as_user([str(ROOT / "bin/lowprio-run"), "--tier", "batch", "--attach", str(job.pid)])
        assert r.returncode == 1, r.stderr
        assert "PID %d thread %d: nice 15 not set" % (job.pid, job.pid) in r.stderr
        assert "PID %d only partly demoted" % job.pid in r.stderr
        assert "demoted PID %d:" % job.pid not in r.stderr
    finally:
        job.kill()
        job.wait()


def test_dry_run_attach_changes_nothing():
    job = subprocess.Popen(["sleep", "60"])
    try:
        before = (open("/proc/%d/cgroup" % job.pid).read(),
                  subprocess.run(["ionice", "-p", str(job.pid)], capture_output=True, text=True).stdout)
        r = run(["--tier", "batch", "--dry-run", "--attach", str(job.pid)])
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("would demote PID %d: 1 processes (%d), 1 threads to nice 15" % (job.pid, job.pid))
        assert open("/proc/%d/stat" % job.pid).read().rsplit(") ", 1)[1].split()[16] == "0"
        assert (open("/proc/%d/cgroup" % job.pid).read(),
                subprocess.run(["ionice", "-p", str(job.pid)], capture_output=True, text=True).stdout) == before
    finally:
        job.kill()
        job.wait()


def test_a_user_whose_cgroup_is_not_delegated_runs_the_job_and_is_told_why():
    top = shared_tmp()
    try:
        from pathlib import Path
        root = fake_v2_root(Path(top), caller="/user.slice")
        fake_v2_child(root, "user.slice", procs="4242\n")
        r = as_user([str(ROOT / "bin/lowprio-run"), "--tier", "batch", "--", "sh", "-c", "exit 3"],
                    env=lowprio_environ(**fake_v2_env(Path(top), root)))
        assert r.returncode == 3, r.stderr
        assert "cgroup v2 not used: EACCES: the caller's cgroup /user.slice is not writable by nobody" in r.stderr
        assert "via autogroup" in r.stderr
    finally:
        subprocess.run(["rm", "-rf", top])


def test_explain_as_a_user_whose_cgroup_is_not_delegated_says_what_a_run_would_get():
    """--explain said "mechanism: cgroup-v2" (and --dry-run showed no
    fallback) to a user whose run falls back to autogroup: it never tried
    the cgroup it could not create."""
    top = shared_tmp()
    try:
        from pathlib import Path
        root = fake_v2_root(Path(top), caller="/user.slice")
        fake_v2_child(root, "user.slice", procs="4242\n")
        r = as_user([str(ROOT / "bin/lowprio-run"), "--tier", "batch", "--explain"],
                    env=lowprio_environ(**fake_v2_env(Path(top), root)))
        assert r.returncode == 0, r.stderr
        assert "mechanism: autogroup\n" in r.stdout
        assert "not in force: cgroup v2 not used: the caller's cgroup /user.slice is not writable by nobody\n" \
            in r.stdout
        assert "not in force: cpu_max=1200 needs a cgroup" in r.stdout
    finally:
        subprocess.run(["rm", "-rf", top])


def test_an_unreadable_tiers_file_does_not_stop_the_job():
    top = shared_tmp()
    try:
        tiers = os.path.join(top, "tiers.conf")
        with open(tiers, "w") as f:
            f.write("batch 15 idle idle 60\n")
        os.chmod(tiers, 0o600)
        r = as_user([str(ROOT / "bin/lowprio-run"), "--tier", "batch", "--", "sh", "-c", "exit 3"],
                    env=lowprio_environ(LOWPRIO_TIERS=tiers))
        assert r.returncode == 3, r.stderr
        assert "cannot read the tiers file %s: using the built-in tiers" % tiers in r.stderr
    finally:
        subprocess.run(["rm", "-rf", top])


def shipped_tiers():
    return (ROOT / "etc" / "lowprio-tiers.conf").read_text()


NICE_AND_WEIGHT = "cut -d' ' -f19 /proc/self/stat"


@pytest.mark.parametrize("tier,old,new,why", [
    ("batch", r"^batch(\s+)15 ", r"batch\g<1>1O ", "the nice column takes -20..19 (got '1O')"),
    ("batch", r"^(batch.*)wbps=12%", r"\g<1>wbps=12", "the disk column takes - or weight=1-10000,wbps=1-100%,rbps=1-100%,"
                                      "adaptive=on|off (got 'wbps=12')"),
    ("batch", r"^(batch.*)adaptive=on", r"\g<1>adaptive=yes", "the disk column takes - or weight=1-10000,wbps=1-100%,rbps=1-100%,"
                                              "adaptive=on|off (got 'adaptive=yes')"),
    ("batch", r"^batch(\s+15\s+)idle", r"batch\g<1>idel", "the I/O class column takes idle, best-effort, "
                                                           "best-effort:0-7 or 0-7 (got 'idel')"),
    ("batch", r"^online.*$", "garbage", "too few columns"),
    ("offline", r"^offline.*$", "offline 19 idle", "too few columns"),
    ("offline", r"^(offline\s+19\s+idle\s+)idle", r"\g<1>idl", "the cpu_weight column takes 1-10000 or idle (got 'idl')"),
], ids=["nice", "percent", "adaptive", "io-class", "garbage", "cut-row", "weight"])
def test_a_typo_in_the_tiers_file_is_named_once_and_the_job_runs_under_the_built_in_tiers(tmp_path, tier, old,
                                                                                            new, why):
    """A tiers file is checked as a whole when read: a bad line is one
    warning, FILE:LINE: why, and the job starts fully limited by the
    built-in tiers; no bash error, no bogus value in a cgroup file."""
    text = re.sub(old, new, shipped_tiers(), count=1, flags=re.MULTILINE)
    assert text != shipped_tiers()
    line = next(i for i, (a, b) in enumerate(zip(text.splitlines(), shipped_tiers().splitlines()), 1) if a != b)
    tiers = tmp_path / "tiers.conf"
    tiers.write_text(text)
    root = fake_v2_root(tmp_path)
    r = run(["--tier", tier, "--", "sh", "-c", NICE_AND_WEIGHT],
            env=dict(fake_v2_env(tmp_path, root), LOWPRIO_TIERS=str(tiers)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == {"batch": "15", "offline": "19"}[tier]
    warnings = [x for x in r.stderr.splitlines() if str(tiers) in x]
    assert warnings == [warnings[0]] and "%s:%d: %s" % (tiers, line, why) in warnings[0], r.stderr
    assert "using the built-in tiers" in warnings[0]
    assert "((" not in r.stderr and "invalid" not in r.stderr
    (leaf,) = root.glob("gpuguard-lowprio-*")
    files = {p.name: p.read_text().strip() for p in leaf.iterdir()}
    assert files["cpu.idle"] == "1" and "cpu.weight" not in files
    assert files.get("cpu.max") == ({"batch": "%d 100000" % (60 * CPUS * 10 * 100)}.get(tier))


def test_a_tiers_file_with_crlf_and_a_bom_is_read_as_plain_text(tmp_path):
    """Saved by a Windows editor: the BOM and the CR line ends are no typo."""
    tiers = tmp_path / "tiers.conf"
    text = re.sub(r"^batch(\s+)15 ", r"batch\g<1>12 ", shipped_tiers(), flags=re.MULTILINE)
    tiers.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    r = run(["--", "sh", "-c", NICE_AND_WEIGHT], env={"LOWPRIO_MECHANISM": "autogroup", "LOWPRIO_TIERS": str(tiers)})
    assert r.returncode == 0, r.stderr
    assert r.stdout == "12\n"
    assert "tiers" not in r.stderr


@pytest.mark.parametrize("text,name", [("write error: Device or resource busy", "EBUSY"),
                                       ("write error: Read-only file system", "EROFS"),
                                       ("write error: No such file or directory", "ENOENT")])
def test_errno_names(text, name):
    r = subprocess.run(["bash", "-c", 'source lib/cgroup.sh; cg_errno_name "$1"', "_", text],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.stdout.startswith(name)


def test_a_knob_the_kernel_does_not_offer_is_named_as_such():
    """cgroupfs answers EACCES, even to root, for a file it does not offer
    (io.prio.class without CONFIG_BLK_CGROUP_IOPRIO, as on the H200 host):
    the line must not send root looking for permissions. /proc/self stands
    in: a folder where a new file cannot be made."""
    r = subprocess.run(["bash", "-c", 'source lib/cgroup.sh; cg_write /proc/self/io.prio.class idle || '
                        'echo "$CG_LAST_ERROR"'], cwd=ROOT, capture_output=True, text=True)
    assert r.stdout == "not offered by this kernel (no io.prio.class in /proc/self)\n"


def test_systemd_scope_when_systemd_owns_the_tree(tmp_path):
    fake = recording_wrapper(tmp_path / "bin", "systemd-run", tmp_path / "args")
    r = run(["--tier", "batch", "--mem-max", "4G", "--", "sh", "-c", "echo ran; exit 3"],
            env={"PATH": "%s:%s" % (fake, os.environ["PATH"]), "LOWPRIO_SYSTEMD": "1"})
    assert r.returncode == 3 and r.stdout == "ran\n"
    args = (tmp_path / "args").read_text().splitlines()
    assert args[:4] == ["--scope", "--quiet", "--collect", "--unit"]
    for prop in ("CPUWeight=idle", "CPUQuota=%d%%" % (60 * CPUS), "MemoryMax=4294967296", "MemorySwapMax=0"):
        assert prop in args
    assert args[args.index("--") + 1:] == ["nice", "-n", "15", "ionice", "-c", "3", "--", "sh", "-c", "echo ran; exit 3"]


def test_cpulimit_only_when_asked_and_with_the_debian_flags(tmp_path):
    fake = recording_wrapper(tmp_path / "bin", "cpulimit", tmp_path / "args")
    env = {"PATH": "%s:%s" % (fake, os.environ["PATH"]), "LOWPRIO_MECHANISM": "autogroup"}
    r = run(["--cpulimit", "50", "--", "true"], env=env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "args").read_text().splitlines() == ["-l", "50", "-m", "--", "true"]


def test_explain_describes_the_host():
    r = run(["--tier", "batch", "--explain"])
    assert r.returncode == 0
    for key in ("tier: batch", "mechanism:", "cgroup mode:", "autogroup:", "scheduler:", "privileges:"):
        assert key in r.stdout


# ------------------------------------------------- real cgroup v1 / v2 ----

def leaf_of(stderr):
    m = re.search(r"leaf (gpuguard-lowprio-\d+)", stderr)
    assert m, stderr
    return m.group(1)


def leaf_dirs(name):
    """Every folder of that leaf left in any hierarchy."""
    out = subprocess.run(["find", "/sys/fs/cgroup", "-maxdepth", "8", "-type", "d", "-name", name],
                         capture_output=True, text=True).stdout
    return out.split()


CG_PROBE = r"""
if [ -e /sys/fs/cgroup/cgroup.controllers ]; then
  d=/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)
  echo leaf=${d##*/}; cat $d/cpu.idle; cut -d' ' -f1 $d/cpu.max; cat $d/memory.max
else
  c=$(grep ':cpu:' /proc/self/cgroup | cut -d: -f3); echo leaf=${c##*/}
  m=$(grep ':memory:' /proc/self/cgroup | cut -d: -f3)
  cat /sys/fs/cgroup/cpu$c/cpu.idle /sys/fs/cgroup/cpu$c/cpu.cfs_quota_us /sys/fs/cgroup/memory$m/memory.limit_in_bytes
fi
sleep 300.5 &
"""


@real_cgroup
def test_real_cgroup_limits_and_cleanup():
    r = run(["--tier", "batch", "--mem-max", "1G", "--", "sh", "-c", CG_PROBE], env=REAL_ENV)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    assert re.match(r"leaf=gpuguard-lowprio-\d+$", lines[0]), lines
    assert lines[-3:] == ["1", str(60 * CPUS * 1000), str(1 << 30)]
    assert leaf_dirs(leaf_of(r.stderr)) == []   # removed, the stray sleep killed with it
    assert subprocess.run(["pgrep", "-f", r"^sleep 300\.5$"], capture_output=True).returncode == 1


def own_memory_cgroup(limit):
    """A memory-limited cgroup of the test's own, where the caller may make
    one: v2 under the root, v1 under the test's own memory cgroup. Returns
    (folder, the command prefix that runs a command inside it)."""
    name = "gg-test-box-%d" % os.getpid()
    if REAL == "v2":
        with open("/sys/fs/cgroup/cgroup.subtree_control") as f:
            enabled = f.read().split()
        for c in ("cpu", "memory"):
            if c not in enabled:
                with open("/sys/fs/cgroup/cgroup.subtree_control", "w") as f:
                    f.write("+" + c)
        box = "/sys/fs/cgroup/" + name
        os.mkdir(box)
        with open(box + "/memory.max", "w") as f:
            f.write(str(limit))
        boxes = [box]
    else:
        mine = next(x.split(":", 2)[2].strip() for x in open("/proc/self/cgroup") if x.split(":")[1] == "memory")
        box = "/sys/fs/cgroup/memory%s/%s" % (mine.rstrip("/"), name)
        os.mkdir(box)
        with open(box + "/memory.limit_in_bytes", "w") as f:
            f.write(str(limit))
        boxes = [box, "/sys/fs/cgroup/cpu/" + name]
        os.mkdir(boxes[1])
    enter = " ".join("echo $$ > %s/cgroup.procs &&" % b for b in boxes)
    return boxes, ["sh", "-c", enter + ' exec "$@"', "sh"]


def remove_boxes(boxes):
    for box in reversed(boxes):
        for d, _, _ in sorted(os.walk(box), key=lambda x: -len(x[0])):
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except OSError:
                    time.sleep(0.1)


HOG = "x = bytearray(400 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1\nprint('survived')"


@real_cgroup
def test_real_the_callers_memory_limit_still_holds_for_the_job():
    """Before: the leaf was made at the top of the hierarchy and a job
    escaped its caller's (container's, slice's) memory limit."""
    boxes, inside = own_memory_cgroup(150 << 20)
    try:
        lowprio = [str(ROOT / "bin/lowprio-run"), "--tier", "online", "--"]
        r = subprocess.run(inside + lowprio + [sys.executable, "-c", HOG],
                           capture_output=True, text=True, timeout=120, env=lowprio_environ(**REAL_ENV))
        assert "survived" not in r.stdout
        assert r.returncode in (137, 1), (r.returncode, r.stderr)
        assert "gg-test-box-%d/gpuguard-lowprio-" % os.getpid() in r.stderr
    finally:
        remove_boxes(boxes)


@real_cgroup
def test_real_report_counts_the_jobs_memory():
    r = run(["--tier", "online", "--report", "--", sys.executable, "-c", HOG.replace("400", "64")], env=REAL_ENV)
    assert r.returncode == 0, r.stderr
    peak = re.search(r"memory peak +(\d+)\.\d MiB", r.stderr)
    assert peak and int(peak.group(1)) >= 64, r.stderr


@real_cgroup
def test_real_memory_limit_bites():
    hog = "import time; x = bytearray(512 << 20); [x.__setitem__(i, 1) for i in range(0, len(x), 4096)]; print('survived')"
    r = run(["--tier", "online", "--mem-max", "128M", "--", sys.executable, "-c", hog], env=REAL_ENV)
    assert "survived" not in r.stdout
    assert r.returncode in (137, 1), (r.returncode, r.stderr)
    assert leaf_dirs(leaf_of(r.stderr)) == []


@real_cgroup
def test_real_cpu_cap_bites():
    spin = ("import os, time\nfor _ in range(3):\n    if os.fork() == 0: break\n"
            "end = time.time() + 2\nwhile time.time() < end: pass\nos.write(1, b'%f\\n' % (os.times().user + os.times().system))")
    r = run(["--tier", "online", "--cpu-max", "0.5", "--", sys.executable, "-c", spin], env=REAL_ENV)
    assert r.returncode == 0, r.stderr
    total = sum(float(x) for x in r.stdout.split())
    assert total < 2.0, total                  # 4 spinners for 2 s would take 8 CPU-s uncapped


@real_cgroup
def test_real_stale_leaf_of_an_earlier_run_is_removed():
    stale = os.path.join(LEAF_PARENT, "gpuguard-lowprio-999999999")   # where versions before 0.2 put them
    os.mkdir(stale)
    try:
        r = run(["--", "true"], env=REAL_ENV)
        assert r.returncode == 0, r.stderr
        assert not os.path.exists(stale)
    finally:
        if os.path.exists(stale):
            os.rmdir(stale)


@real_cgroup
def test_real_attach_demotes_every_thread_and_descendant():
    job = subprocess.Popen([sys.executable, "-c",
                            "import threading, time, subprocess\n"
                            "[threading.Thread(target=time.sleep, args=(60,), daemon=True).start() for _ in range(3)]\n"
                            "subprocess.Popen(['sleep', '61'])\n"
                            "time.sleep(60)\n"])
    try:
        assert wait_for(lambda: len(os.listdir("/proc/%d/task" % job.pid)) == 4)
        assert wait_for(lambda: subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True).returncode == 0)
        kids = subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True, text=True).stdout.split()
        r = run(["--tier", "batch", "--attach", str(job.pid)], env=REAL_ENV)
        assert r.returncode == 0, r.stderr
        assert "2 processes, 5 threads" in r.stderr
        for tid in os.listdir("/proc/%d/task" % job.pid):
            stat = open("/proc/%d/task/%s/stat" % (job.pid, tid)).read().rsplit(") ", 1)[1].split()
            assert stat[16] == "15"
        for pid in [str(job.pid)] + kids:
            assert "/gpuguard-lowprio-" in open("/proc/%s/cgroup" % pid).read()
            assert subprocess.run(["ionice", "-p", pid], capture_output=True, text=True).stdout.strip() == "idle"
    finally:
        job.kill()
        job.wait()
        for kid in subprocess.run(["pgrep", "-f", "^sleep 61$"], capture_output=True, text=True).stdout.split():
            os.kill(int(kid), signal.SIGKILL)
        time.sleep(0.3)
        run(["--", "true"], env=REAL_ENV)      # cleans the now-stale leaf
    assert leaf_dirs(leaf_of(r.stderr)) == []


# ------------------------------------------------------------ the disk ----

def cached_bandwidth(tmp_path, majmin):
    for line in (tmp_path / "state" / "disk-bandwidth").read_text().splitlines():
        key, _name, _sectors, w, r, _t = line.split()
        if key == majmin:
            return int(w), int(r)
    return None


def rate_text(n):
    """Bytes/s as lowprio-run writes them (lib/disk.sh's disk_rate_text)."""
    if n >= 10 << 30:
        return "%d GiB/s" % (n >> 30)
    if n >= 1 << 30:
        return "%d.%d GiB/s" % (n >> 30, (n % (1 << 30)) * 10 >> 30)
    return "%d MiB/s" % (n >> 20)


def iocost_root(root, qos_line, model_line):
    """A fake v2 root that offers iocost (io.cost.* live at the root only)."""
    (root / "io.cost.qos").write_text(qos_line + "\n")
    (root / "io.cost.model").write_text(model_line + "\n")


def test_default_tier_caps_the_disk_from_its_measured_bandwidth_where_iocost_is_off(tmp_path):
    """No flag: the job's disk gets the adaptive io.max (lib/iogov.sh), at
    the tier's fraction of the disk's measured write and read bandwidth,
    measured once with O_DIRECT, kept in the state folder, named in one
    start line; nobody else uses the disk here, so no cap is written.
    --io-adaptive off makes it the static cap; --measure-disk measures
    again."""
    disk = disk_of(tmp_path)
    require(disk is not None, "the test's folder on a block device")
    majmin, name = disk
    root = fake_v2_root(tmp_path)
    env = fake_v2_env(tmp_path, root)
    r = run(["--", "true"], env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "measured disk %s (%s): writes" % (name, majmin) in r.stderr
    w, rd = cached_bandwidth(tmp_path, majmin)
    assert w > 0 and rd > 0
    (leaf,) = root.glob("gpuguard-lowprio-*")
    assert not (leaf / "io.max").exists()
    (line,) = [x for x in r.stderr.splitlines() if " disk: " in x]
    assert "%s %s: adaptive io.max: writes <= %s (12 %% of the measured " % (name, majmin, rate_text(w * 12 // 100)) \
        in line and "only while another cgroup uses the disk" in line
    # cached: the second job starts without measuring; the static cap
    r = run(["--io-adaptive", "off", "--", "true"], env=env, cwd=tmp_path)
    assert r.returncode == 0 and "measured disk" not in r.stderr
    leaf = max(root.glob("gpuguard-lowprio-*"), key=lambda p: p.stat().st_mtime)
    assert (leaf / "io.max").read_text() == "%s wbps=%d rbps=%d\n" % (majmin, w * 12 // 100, rd * 10 // 100)
    (line,) = [x for x in r.stderr.splitlines() if " disk: " in x]
    assert "%s %s: io.max fallback: writes <= " % (name, majmin) in line
    assert "offers no io.cost.qos" in line
    # offline takes less
    r = run(["--tier", "offline", "--io-adaptive", "off", "--", "true"], env=env, cwd=tmp_path)
    leaf = max(root.glob("gpuguard-lowprio-*"), key=lambda p: p.stat().st_mtime)
    assert (leaf / "io.max").read_text() == "%s wbps=%d rbps=%d\n" % (majmin, w * 2 // 100, rd * 10 // 100)
    # --explain names the mechanism and what it costs, and measures nothing
    r = run(["--explain", "--io-adaptive", "off"], env=env, cwd=tmp_path)
    assert "disk %s (%s; the job's folder, the state folder): io.max fallback" % (name, majmin) in r.stdout
    assert "not work-conserving: the job never writes faster, even alone" in r.stdout
    (tmp_path / "state" / "disk-bandwidth").write_text("%s %s 1 5 5 0\n" % (majmin, name))   # another disk's size
    r = run(["--measure-disk", str(tmp_path)], env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("disk %s (%s): writes " % (name, majmin))
    assert r.stdout.rstrip().endswith("(O_DIRECT, 8 MiB)"), r.stdout
    assert cached_bandwidth(tmp_path, majmin)[0] > 5


def test_setup_disk_turns_iocost_on_and_undo_puts_back_exactly_what_was_there(tmp_path):
    """--setup-disk (root) enables iocost with latency targets, a vrate
    ceiling of 100 % and a cost model written from the disk's measured
    speed; the job then gets a low io.weight and no cap (work-conserving);
    --explain names the model; --undo restores the QoS and the model the
    disk had, number for number, even after a second --setup-disk."""
    disk = disk_of(tmp_path)
    require(disk is not None, "the test's folder on a block device")
    require(os.geteuid() == 0, "--setup-disk is root only")
    majmin, name = disk
    root = fake_v2_root(tmp_path)
    env = fake_v2_env(tmp_path, root)
    qos_before = "%s enable=0 ctrl=user rpct=90.00 rlat=7000 wpct=0.00 wlat=250000 min=50.00 max=150.00" % majmin
    model_before = "%s ctrl=user model=linear rbps=1000 rseqiops=2 rrandiops=3 wbps=4 wseqiops=5 wrandiops=6" % majmin
    iocost_root(root, qos_before, model_before)
    r = run(["--setup-disk", majmin], env=env)
    assert r.returncode == 0, r.stderr
    assert (root / "io.cost.qos").read_text() == \
        "%s enable=1 ctrl=user rpct=95.00 rlat=5000 wpct=95.00 wlat=5000 min=1.00 max=100.00\n" % majmin
    w, rd = cached_bandwidth(tmp_path, majmin)           # measured now: nothing was cached
    assert (root / "io.cost.model").read_text() == "%s ctrl=user model=linear rbps=%d wbps=%d\n" % (majmin, rd, w)
    assert "iocost on" in r.stderr and "cost model: from the measured speed, writes " in r.stderr
    assert "before: enable=0 ctrl=user" in r.stderr
    assert run(["--setup-disk", majmin], env=env).returncode == 0   # again: the first "before" is kept
    r = run(["--", "true"], env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (leaf,) = root.glob("gpuguard-lowprio-*")
    assert (leaf / "io.weight").read_text() == "default 10\n"
    assert not (leaf / "io.max").exists()                  # no cap: the job keeps an idle disk's speed
    assert "disk: %s %s: adaptive io.max: writes <= " % (name, majmin) in r.stderr
    assert "only while another cgroup uses the disk (checked every 0.5 s, full speed otherwise), and iocost, " \
        "io.weight 10; cost model set by hand: writes %d MiB/s, reads %d MiB/s" % (w >> 20, rd >> 20) in r.stderr
    r = run(["--tier", "offline", "--explain"], env=env, cwd=tmp_path)
    assert "iocost, io.weight 1; cost model set by hand: writes %d MiB/s" % (w >> 20) in r.stdout
    # the ceiling bounds a job alone: 100 % of the measured write speed
    assert "beside it, iocost: work-conserving: up to %s (the cost model's write speed times the QoS ceiling) " \
        "while nobody else uses the disk" % rate_text(w) in r.stdout
    r = run(["--setup-disk", "--undo", "259:999"], env=env)   # a disk named: that one only (here: none)
    assert r.returncode == 2 and (root / "io.cost.qos").read_text().startswith("%s enable=1" % majmin)
    r = run(["--setup-disk", "--undo", majmin], env=env)
    assert r.returncode == 0, r.stderr
    assert (root / "io.cost.qos").read_text() == qos_before + "\n"
    assert (root / "io.cost.model").read_text() == model_before + "\n"
    assert not (tmp_path / "state" / "iocost-saved").exists()
    r = run(["--", "true"], env=env, cwd=tmp_path)
    (line,) = [x for x in r.stderr.splitlines() if " disk: " in x]
    assert "adaptive io.max: writes <= " in line and "iocost" not in line
    r = run(["--io-adaptive", "off", "--", "true"], env=env, cwd=tmp_path)
    assert "io.max fallback" in r.stderr and "iocost is not set up on this disk (as root: lowprio-run --setup-disk)" in r.stderr


def test_setup_disk_with_the_kernels_cost_model_and_where_the_disk_cannot_be_measured(tmp_path):
    """--cost-model kernel keeps the kernel's automatic model (and its own
    vrate ceiling row); a disk that cannot be measured gets the kernel's
    model too, and the line says why; the model is put back by --undo."""
    disk = disk_of(tmp_path)
    require(disk is not None and os.geteuid() == 0, "root, and the test's folder on a block device")
    majmin = disk[0]
    root = fake_v2_root(tmp_path)
    env = fake_v2_env(tmp_path, root)
    model_before = "%s ctrl=user model=linear rbps=1000 rseqiops=2 rrandiops=3 wbps=4 wseqiops=5 wrandiops=6" % majmin
    iocost_root(root, "", model_before)
    r = run(["--setup-disk", "--cost-model", "kernel", majmin], env=env)
    assert r.returncode == 0, r.stderr
    assert (root / "io.cost.model").read_text() == "%s ctrl=auto\n" % majmin
    assert (root / "io.cost.qos").read_text().endswith(" min=1.00 max=10000.00\n")
    assert "cost model: the kernel's automatic one)" in r.stderr
    assert not (tmp_path / "state" / "disk-bandwidth").exists()     # nothing measured for it
    r = run(["--explain"], env=env, cwd=tmp_path)
    assert "the kernel's automatic cost model\n  expected effect: " in r.stdout
    assert "; beside it, iocost: work-conserving: full speed while nobody" in r.stdout
    assert run(["--setup-disk", "--undo"], env=env).returncode == 0
    assert (root / "io.cost.model").read_text() == model_before + "\n"
    # a measurement that cannot be made (too little room for it)
    r = run(["--setup-disk", majmin], env=dict(env, LOWPRIO_MEASURE_MIB="1000000000"))
    assert r.returncode == 0, r.stderr
    assert (root / "io.cost.model").read_text() == "%s ctrl=auto\n" % majmin
    assert "cost model: the kernel's automatic one: the disk could not be measured (less than " in r.stderr


def test_the_cost_model_set_by_hand_keeps_the_kernels_figures_for_small_io():
    """The measured model replaces the bandwidths only: a 4 KiB I/O keeps
    the cost the kernel gives it (its IOPS figures, as the kernel shows them
    for an SSD in automatic mode)."""
    auto = "ctrl=auto model=linear rbps=488636629 rseqiops=8932 rrandiops=8518 wbps=427891549 wseqiops=28755 " \
           "wrandiops=21940"
    r = subprocess.run(["bash", "-c", 'source lib/common.sh; source lib/cgroup.sh; cg_iocost_model_merge "$0" "$1"',
                        auto, "wbps=1258291200 rbps=1050673152"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert r.stdout == ("ctrl=user model=linear rbps=1050673152 rseqiops=8932 rrandiops=8518 wbps=1258291200 "
                        "wseqiops=28755 wrandiops=21940")


def test_a_disk_never_set_up_gets_the_kernels_defaults_back(tmp_path):
    disk = disk_of(tmp_path)
    require(disk is not None and os.geteuid() == 0, "root, and the test's folder on a block device")
    root = fake_v2_root(tmp_path)
    env = fake_v2_env(tmp_path, root)
    iocost_root(root, "", "")
    assert run(["--setup-disk", disk[0]], env=env).returncode == 0
    assert run(["--setup-disk", "--undo", disk[0]], env=env).returncode == 0
    assert (root / "io.cost.qos").read_text() == "%s enable=0 ctrl=auto\n" % disk[0]


def test_setup_disk_is_root_only_and_says_why_iocost_cannot_be_had(tmp_path):
    require(os.geteuid() == 0, "needs root to run a command as a second user")
    r = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                        str(ROOT / "bin/lowprio-run"), "--setup-disk"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "root only" in r.stderr and len(r.stderr.splitlines()) == 1
    disk = disk_of(tmp_path)
    require(disk is not None, "the test's folder on a block device")
    root = fake_v2_root(tmp_path)
    (root / "cgroup.controllers").write_text("cpuset cpu memory pids\n")
    r = run(["--setup-disk", disk[0]], env=fake_v2_env(tmp_path, root))
    assert r.returncode == 1
    assert "iocost not turned on: the io controller is not on cgroup v2 here" in r.stderr


def test_no_io_controller_the_job_runs_and_is_told(tmp_path):
    disk = disk_of(tmp_path)
    require(disk is not None, "the test's folder on a block device")
    root = fake_v2_root(tmp_path)
    (root / "cgroup.controllers").write_text("cpuset cpu memory pids\n")
    r = run(["--", "sh", "-c", "echo ran"], env=fake_v2_env(tmp_path, root), cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == "ran\n"
    assert "disk: %s %s: none: no io controller in /cgroup.controllers" % (disk[1], disk[0]) in r.stderr
    assert "measured disk" not in r.stderr


@pytest.mark.parametrize("args,message", [
    (["--io-max", "/dev/shm:wbps=100M"], "--io-max: /dev/shm is on tmpfs with no block device of its own"),
    (["--io-max", "259:999:wbps=100M"], "--io-max: no block device 259:999 here (gone, or never there)"),
    (["--io-max", "/dev/gg-gone:wbps=100M"], "--io-max: /dev/gg-gone does not exist (a disk that is gone?)"),
    (["--io-max", "wbps=200MB"], "--io-max: 'wbps=200MB' is not rbps=N or wbps=N"),
    (["--io-max", "wbps=1.5G"], "--io-max: 'wbps=1.5G' is not rbps=N or wbps=N"),
    (["--io-max", "wpbs=200M"], "--io-max: no rbps= or wbps= in 'wpbs=200M'"),
    (["--setup-disk", "/dev/shm"], "--setup-disk: /dev/shm is on tmpfs"),
    (["--measure-disk", "259:999"], "--measure-disk: no block device 259:999"),
    (["--setup-disk", "--cost-model", "fast"], "--cost-model takes measured or kernel (got 'fast')"),
    (["--cost-model", "kernel"], "--cost-model goes with --setup-disk"),
    (["--setup-disk", "--undo", "--cost-model", "kernel"], "--cost-model goes with --setup-disk"),
])
def test_bad_disk_input_is_one_line_exit_2_and_the_job_never_starts(tmp_path, args, message):
    require(disk_of(tmp_path) is not None and os.path.isdir("/dev/shm") and disk_of("/dev/shm") is None,
            "the test's folder on a disk and /dev/shm on tmpfs")
    marker = tmp_path / "started"
    r = run(args + ["--", "touch", str(marker)], cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and len(r.stderr.splitlines()) == 1
    assert not marker.exists()


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1e3", "99999999999999999999"])
@pytest.mark.parametrize("args", [["--measure-disk", "."], ["--", "touch", "started"]])
def test_a_bad_measurement_size_is_one_line_exit_2_naming_the_key_and_range(tmp_path, value, args):
    """LOWPRIO_MEASURE_MIB=abc measured 256 MiB without a word (and a job
    started as if it were unset): now the key, the range and the value."""
    require(disk_of(tmp_path) is not None, "the test's folder on a disk")
    r = run(args, env={"LOWPRIO_MEASURE_MIB": value}, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == "lowprio-run: LOWPRIO_MEASURE_MIB must be a whole number of MiB from 1 to 1000000000 " \
        "(got '%s')\n" % value
    assert r.stdout == "" and not (tmp_path / "started").exists()
    assert not (tmp_path / "state" / "disk-bandwidth").exists()          # nothing measured


MEASURE_MIB = 300


def measuring(tmp_path):
    """The measurement's temporary files in the state folder (where a
    first measurement writes when the state folder is on the job's disk)."""
    return list((tmp_path / "state").glob(".gpuguard-disk-measure.*"))


def start_measuring(tmp_path, args):
    """Starts lowprio-run in a session of its own with a first disk
    measurement of MEASURE_MIB to do; returns once its file exists."""
    require(disk_of(tmp_path) is not None, "the test's folder on a block device")
    free = os.statvfs(tmp_path)
    require(free.f_bavail * free.f_frsize > 3 * MEASURE_MIB << 20, "%d MiB free for the measurement" % (3 * MEASURE_MIB))
    root = fake_v2_root(tmp_path)
    env = dict(lowprio_environ(**fake_v2_env(tmp_path, root)), LOWPRIO_MEASURE_MIB=str(MEASURE_MIB))
    proc = subprocess.Popen([str(ROOT / "bin/lowprio-run")] + args, cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=default_signals, start_new_session=True)
    assert wait_for(lambda: measuring(tmp_path) or proc.poll() is not None, timeout=60)
    require(proc.poll() is None, "the disk measured %d MiB before a signal could be sent" % MEASURE_MIB)
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("sig,to", [(signal.SIGTERM, "lowprio-run"), (signal.SIGINT, "its group"),
                                    (signal.SIGHUP, "lowprio-run")])
def test_a_signal_during_the_first_disk_measurement_stops_it_removes_its_file_and_reaches_the_job(tmp_path, sig,
                                                                                                  to):
    """TERM to lowprio-run (a scheduler) or ^C to its group (the terminal)
    while the disk is being measured for the first time: the measurement
    stops at once and its temporary file goes; the job still starts (a
    guard never stops it), gets the signal, and its status is lowprio-run's."""
    proc = start_measuring(tmp_path, ["--", "sleep", "30"])
    try:
        if to == "its group":
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert measuring(tmp_path) == [], err
    assert proc.returncode == 128 + sig, err
    assert "could not be measured: interrupted by %s" % sig.name in err
    assert "job ended with status %d" % (128 + sig) in err
    assert not (tmp_path / "state" / "disk-bandwidth").exists()
    assert subprocess.run(["pgrep", "-f", "of=%s/state/.gpuguard-disk-measure" % tmp_path]).returncode == 1


def test_a_signal_just_before_the_measurement_waits_for_its_dd_still_stops_the_dd_at_once(tmp_path):
    """The ^C lands after the dd has started but before lowprio-run waits
    for it (CI met this once: lowprio-run sat out the whole write, and
    the job started a minute late). The measurement stops at once all the
    same, the dd is gone, and the signal is raised again for the job."""
    require(disk_of(tmp_path) is not None, "the test's folder on a block device")
    fake = tmp_path / "bin"
    fake.mkdir()
    marker = "gpuguard-test-slow-dd-%d" % os.getpid()
    (fake / "dd").write_text("#!/bin/bash\nexec -a %s sleep 50\n" % marker)
    (fake / "dd").chmod(0o755)
    script = r"""
source lib/common.sh; source lib/disk.sh
PATH=$FAKE:$PATH
# the signal comes once the dd runs and just before the first wait for it
raised=0
wait() { ((raised)) || { raised=1; kill -INT "$BASHPID"; }; builtin wait "$@"; }
trap 'echo "the caller got INT"' INT
mkdir -p "$GPUGUARD_STATE_DIR"
disk_resolve_into "$GPUGUARD_STATE_DIR" majmin
start=$SECONDS
disk_measure_into "$majmin" measured
echo "status=$? error=$DISK_ERROR seconds=$((SECONDS - start))"
"""
    env = lowprio_environ(FAKE=str(fake))
    r = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    for pid in left:
        os.kill(int(pid), signal.SIGKILL)
    assert "status=1 error=interrupted by SIGINT" in r.stdout, r.stdout + r.stderr
    assert int(r.stdout.rsplit("seconds=", 1)[1]) <= 10, r.stdout
    assert "the caller got INT" in r.stdout
    assert left == [], "the measurement's dd still ran"
    assert measuring(tmp_path) == []


@pytest.mark.slow
def test_measure_disk_interrupted_leaves_no_file_and_a_stale_one_is_swept(tmp_path):
    proc = start_measuring(tmp_path, ["--measure-disk"])
    try:
        os.killpg(proc.pid, signal.SIGINT)                       # ^C
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGINT
    assert measuring(tmp_path) == []
    # one left by a lowprio-run killed with SIGKILL two hours ago
    stale = tmp_path / "state" / ".gpuguard-disk-measure.AbC123"
    stale.write_bytes(b"x" * 4096)
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    r = subprocess.run(["bash", "-c", "source lib/common.sh; gg_retention"], cwd=ROOT, capture_output=True,
                       text=True, env=lowprio_environ())
    assert r.returncode == 0, r.stderr
    assert not stale.exists()
    stale.write_bytes(b"x" * 4096)
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    fresh = tmp_path / "state" / ".gpuguard-disk-measure.XyZ789"     # another run's, under way
    fresh.write_bytes(b"x")
    r = run(["--measure-disk"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not stale.exists() and fresh.exists()


def test_report_gives_each_disks_bytes_rate_and_time_held_back(tmp_path):
    disk = disk_of(tmp_path)
    require(disk is not None, "the test's folder on a block device")
    majmin, name = disk
    root = fake_v2_root(tmp_path)
    iocost_root(root, "%s enable=1 ctrl=user rpct=95.00 rlat=5000 wpct=95.00 wlat=5000 min=1.00 max=10000.00"
                % majmin, "%s ctrl=auto" % majmin)
    job = ("d=$(echo %s/gpuguard-lowprio-*); printf '%s rbytes=0 wbytes=3221225472 rios=1 wios=2 dbytes=0 dios=0 "
           "cost.usage=9 cost.wait=2500000 cost.indebt=0 cost.indelay=500000\\n' > $d/io.stat" % (root, majmin))
    r = run(["--report", "--", "sh", "-c", job], env=fake_v2_env(tmp_path, root), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (row,) = [x for x in r.stderr.splitlines() if x.startswith("  disk %s " % name)]
    assert "written 3.0 GiB, mean " in row and "held back 3.00 s by iocost; adaptive io.max: writes <= " in row
    assert ", and iocost, io.weight 10" in row


# A real hierarchy: a loop device (its own disk) with ext4, the job's folder
# on it. Where the kernel offers iocost on cgroup v2 (the H200 host) the
# setup and the job's io.weight are checked for real; where it does not
# (CI's hybrid machine: the io controller is v1 blkio) --setup-disk must
# say so and the job must get the io.max fallback on the loop device.

@pytest.fixture
def loop_disk(tmp_path):
    require(os.geteuid() == 0 and REAL is not None, "root and a writable real cgroup hierarchy")
    tools = all(subprocess.run(["sh", "-c", "command -v " + t], capture_output=True).returncode == 0
                for t in ("losetup", "mkfs.ext4", "mount"))
    require(tools, "losetup, mkfs.ext4 and mount")
    image = tmp_path / "disk.img"
    with open(image, "wb") as f:
        f.truncate(96 << 20)
    dev = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True)
    require(dev.returncode == 0, "a free loop device: " + dev.stderr.strip())
    dev = dev.stdout.strip()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", dev], check=True, capture_output=True)
        subprocess.run(["mount", dev, str(mnt)], check=True, capture_output=True)
        st = os.stat(dev)
        yield "%d:%d" % (os.major(st.st_rdev), os.minor(st.st_rdev)), mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
        subprocess.run(["losetup", "-d", dev], capture_output=True)


JOB_IO_FILES = r"""
if [ -e /sys/fs/cgroup/cgroup.controllers ]; then
  d=/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup); cat $d/io.max $d/io.weight
else
  b=$(grep ':blkio:' /proc/self/cgroup | cut -d: -f3)
  sed 's/^/w /' /sys/fs/cgroup/blkio$b/blkio.throttle.write_bps_device
fi
"""


@real_cgroup
def test_real_mechanism_choice_on_a_loop_device(tmp_path, loop_disk):
    majmin, mnt = loop_disk
    have_iocost = os.path.exists("/sys/fs/cgroup/io.cost.qos")
    r = run(["--setup-disk", majmin])
    if not have_iocost:
        assert r.returncode == 1, r.stderr
        assert "iocost not turned on" in r.stderr
        r = run(["--", "sh", "-c", JOB_IO_FILES], env=REAL_ENV, cwd=mnt)
        assert r.returncode == 0, r.stderr
        w, _ = cached_bandwidth(tmp_path, majmin)
        want = w * 12 // 100
        assert ("w %s %d" % (majmin, want)) in r.stdout or ("%s rbps=" % majmin in r.stdout
                                                             and "wbps=%d" % want in r.stdout), r.stdout
        assert "io.max fallback: writes <= " in r.stderr
        return
    try:
        assert r.returncode == 0, r.stderr
        # the kernel keeps the measured bandwidths and its own IOPS figures
        w, rd = cached_bandwidth(tmp_path, majmin)
        (model,) = [x for x in open("/sys/fs/cgroup/io.cost.model").read().splitlines() if x.startswith(majmin + " ")]
        assert " ctrl=user " in model and " wbps=%d " % w in model and " rbps=%d " % rd in model, model
        assert " wrandiops=" in model
        r = run(["--", "sh", "-c", JOB_IO_FILES], env=REAL_ENV, cwd=mnt)
        assert r.returncode == 0, r.stderr
        assert "default 10" in r.stdout and "iocost, io.weight 10; cost model set by hand" in r.stderr
    finally:
        undo = run(["--setup-disk", "--undo", majmin])
    assert undo.returncode == 0, undo.stderr
    line = [x for x in open("/sys/fs/cgroup/io.cost.qos").read().splitlines() if x.startswith(majmin + " ")]
    assert not line or " enable=0 " in line[0]
    line = [x for x in open("/sys/fs/cgroup/io.cost.model").read().splitlines() if x.startswith(majmin + " ")]
    assert not line or " ctrl=auto " in line[0]


def test_install_setup_disk_is_for_root_on_this_host_only(tmp_path):
    """install.sh --setup-disk changes this host's disks: refused (one line,
    exit 2, nothing installed) with --user or DESTDIR."""
    for args, env in ((["--user", "--setup-disk"], {"HOME": str(tmp_path)}),
                      (["--prefix", "/opt/gg", "--setup-disk"], {"DESTDIR": str(tmp_path / "dest")})):
        r = subprocess.run([str(ROOT / "install.sh")] + args, env=dict(os.environ, **env),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
        assert "--setup-disk turns iocost on for this host's disks: root only, and not with --user or DESTDIR" in r.stderr
    assert not (tmp_path / "dest").exists() and not (tmp_path / ".local").exists()


def test_doctor_says_per_disk_whether_iocost_is_in_force(tmp_path):
    disks = [d for d in os.listdir("/sys/block") if not d.startswith(("loop", "ram", "zram", "dm-", "md"))
             and os.path.exists("/sys/block/%s/queue/scheduler" % d)]
    require(disks, "a real block device")
    name = disks[0]
    majmin = open("/sys/block/%s/dev" % name).read().strip()
    root = fake_v2_root(tmp_path)
    iocost_root(root, "%s enable=1 ctrl=user rpct=95.00 rlat=5000 wpct=95.00 wlat=5000 min=1.00 max=10000.00"
                % majmin, "%s ctrl=auto" % majmin)
    check = ("source lib/common.sh; source lib/cgroup.sh; source lib/doctor.sh; doctor_disk_iocost")
    r = subprocess.run(["bash", "-c", check], cwd=ROOT, env=dict(os.environ, LOWPRIO_CGROUP_ROOT=str(root)),
                       capture_output=True, text=True, timeout=30)
    assert "OK    disk %s (%s): iocost in force (ctrl=user rpct=95.00" % (name, majmin) in r.stdout
    assert "max=10000.00; the kernel's automatic cost model)" in r.stdout
    (root / "io.cost.model").write_text("%s ctrl=auto model=linear rbps=488636629 rseqiops=8932 rrandiops=8518 "
                                        "wbps=427891549 wseqiops=28755 wrandiops=21940\n" % majmin)
    r = subprocess.run(["bash", "-c", check], cwd=ROOT, env=dict(os.environ, LOWPRIO_CGROUP_ROOT=str(root)),
                       capture_output=True, text=True, timeout=30)
    assert "the kernel's automatic cost model: writes 408 MiB/s, reads 466 MiB/s)" in r.stdout
    (root / "io.cost.model").write_text("%s ctrl=user model=linear rbps=1050673152 wbps=1258291200\n" % majmin)
    r = subprocess.run(["bash", "-c", check], cwd=ROOT, env=dict(os.environ, LOWPRIO_CGROUP_ROOT=str(root)),
                       capture_output=True, text=True, timeout=30)
    assert "cost model set by hand: writes 1200 MiB/s, reads 1002 MiB/s)" in r.stdout
    (root / "io.cost.qos").write_text("%s enable=0 ctrl=auto\n" % majmin)
    r = subprocess.run(["bash", "-c", check], cwd=ROOT, env=dict(os.environ, LOWPRIO_CGROUP_ROOT=str(root)),
                       capture_output=True, text=True, timeout=30)
    assert "disk %s (%s): iocost off: lowprio-run caps jobs there with io.max" % (name, majmin) in r.stdout
    (root / "io.cost.qos").unlink()
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    r = subprocess.run(["bash", "-c", check], cwd=ROOT, env=dict(os.environ, LOWPRIO_CGROUP_ROOT=str(root)),
                       capture_output=True, text=True, timeout=30)
    assert "INFO  iocost not available: the io controller is not on cgroup v2 here" in r.stdout


@pytest.mark.slow
def test_iocost_matrix_dry_run_measures_every_phase_and_puts_the_disk_back(tmp_path):
    """bench/h200/iocost_matrix.sh's dry run (no root: a fake cgroup root,
    small jobs): the service beside each job kind, the job alone, the
    measured cost model written for the measured rows, one table, and the
    io.cost files as they were at the end."""
    require(disk_of(tmp_path) is not None and os.path.isdir("/var/tmp") and disk_of("/var/tmp") is not None,
            "/var/tmp on a block device (the bench's work folder)")
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(ROOT / "bench/h200/iocost_matrix.sh"), str(out)], cwd=ROOT, text=True,
                       capture_output=True, timeout=300,
                       env=dict(os.environ, DRY_RUN="1", ROWS="C"))
    assert r.returncode == 0, r.stdout + r.stderr
    table = (out / "iocost_matrix.md").read_text().splitlines()
    rows = {line.split(" | ")[0].strip("| "): line for line in table if line.startswith("| ")}
    assert set(rows) >= {"idle", "plain", "C"} and "A" not in rows
    assert "measured model, QoS 5/5 ms p95, vrate 1-100 %" in rows["C"]
    # plain alone is the base of both job kinds (a third "(100 %)" when the
    # dry run's tiny job beside the service happened to keep all its speed)
    assert rows["plain"].count("(100 %)") >= 2
    log = (out / "iocost_matrix.log").read_text()
    (w,) = re.findall(r"measured: writes (\d+) MiB/s", log)
    model = re.search(r"io\.cost\.model: (\S+) ctrl=user model=linear rbps=\d+ rseqiops=8932 rrandiops=8518 "
                      r"wbps=(\d+) ", log)
    assert model and int(model.group(2)) >> 20 == int(w)
    assert re.search(r"== at the end: io\.cost\.qos: \S+ enable=0 ctrl=auto; io\.cost\.model: \S+ ctrl=auto$", log,
                     re.MULTILINE)
    (work,) = re.findall(r"^== kernel [^;]*; (/var/tmp/gg-iocost-matrix\.\w+) on ", log, re.MULTILINE)
    assert not os.path.exists(work)                   # its work folder (and the fake root in it) removed


def test_a_user_without_home_gets_a_state_folder_of_their_own():
    """`env -i` or a service manager without HOME: the state folder was
    /tmp/.local/state/gpuguard, made by the first such user and refused
    to every other one after it."""
    state = "/tmp/gpuguard-%d" % NOBODY
    shutil.rmtree(state, ignore_errors=True)
    try:
        r = as_user(["env", "-i", "PATH=%s:/usr/bin:/bin" % (ROOT / "tests/fakebin"), "GPUGUARD_CONFIG=/dev/null",
                     str(ROOT / "bin/gpu-leak-watch"), "--", "true"], cwd="/")
        assert r.returncode == 0, r.stderr
        assert os.path.isdir(state) and os.stat(state).st_uid == NOBODY
        assert not os.path.exists("/tmp/.local/state/gpuguard") or os.stat("/tmp/.local").st_uid != NOBODY
    finally:
        shutil.rmtree(state, ignore_errors=True)
