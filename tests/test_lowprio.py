"""lowprio-run: exec semantics, tiers, and every mechanism - cgroup v2
against a fake cgroup root, cgroup v1 for real where it is writable (CI's
hybrid machine, as root), systemd-run and cpulimit through recording fakes."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, recording_wrapper, wait_for

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
real_cgroup = pytest.mark.skipif(REAL is None, reason="needs root and a writable real cgroup hierarchy")
REAL_ENV = {"LOWPRIO_MECHANISM": "cgroup-%s" % REAL}
LEAF_PARENT = "/sys/fs/cgroup" if REAL == "v2" else V1


def run(args, env=None, timeout=60, **kw):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run([str(ROOT / "bin/lowprio-run")] + args, env=full, text=True,
                          capture_output=True, timeout=timeout, **kw)


def test_dry_run_shows_tier_and_overrides():
    r = run(["--tier", "offline", "--dry-run", "--", "swift", "sft", "--model_type", "qwen3-7b"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("nice -n 19 ionice -c 3 swift sft --model_type qwen3-7b\n")
    r = run(["--tier", "batch", "--nice", "10", "--io-class", "5", "--dry-run", "--", "x"])
    assert r.stdout.endswith("nice -n 10 ionice -c 2 -n 5 x\n")


@pytest.mark.parametrize("args,message", [
    (["--tier", "bogus", "--", "true"], "unknown tier 'bogus' (tiers: system, online, batch, offline)"),
    (["--nice", "25", "--", "true"], "--nice takes -20..19 (got '25')"),
    (["--cpu-weight", "0", "--", "true"], "--cpu-weight takes 1-10000 or idle (got '0')"),
    (["--cpu-max", "lots", "--", "true"], "--cpu-max takes a number of CPUs such as 2 or 0.5 (got 'lots')"),
    (["--mem-max", "5X", "--", "true"], "--mem-max takes a size such as 8G or 512M (got '5X')"),
    (["--io-max", "/nonexistent:rbps=1M", "--", "true"], "--io-max takes DEV:rbps=N,wbps=N"),
    (["--io-class", "realtime", "--", "true"], "the realtime I/O class is not offered"),
    (["--attach", "999999999"], "--attach needs a running PID (got '999999999')"),
    (["--tier", "batch"], "no command given"),
    (["--bogus", "--", "true"], "unknown option '--bogus'"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    r = run(args)
    assert r.returncode == 2
    assert message in r.stderr and len(r.stderr.splitlines()) == 1


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
    env = dict(os.environ, LOWPRIO_MECHANISM=mechanism)
    proc = subprocess.Popen([str(ROOT / "bin/lowprio-run"), "--", sys.executable, "-c", SIGNAL_JOB,
                             sig, str(marker), str(ready)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            restore_signals=True, preexec_fn=default_signals)
    # The job says when its trap is set: a signal sent earlier would kill it
    # before it can record anything (the old test's intermittent 143).
    assert wait_for(ready.exists, timeout=60)
    proc.send_signal(getattr(signal, "SIG" + sig))
    _, err = proc.communicate(timeout=60)
    assert marker.read_text() == sig + "\n", err
    assert proc.returncode == 128 + getattr(signal, "SIG" + sig), err


def test_a_signal_during_start_up_is_not_lost(tmp_path):
    """TERM sent at once: it reaches lowprio-run before or while the job is
    being started; lowprio-run neither dies alone (leaving the job running)
    nor swallows it."""
    proc = subprocess.Popen([str(ROOT / "bin/lowprio-run"), "--", "sleep", "300"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            restore_signals=True, preexec_fn=default_signals)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode in (143, -15)
    assert subprocess.run(["pgrep", "-f", "^sleep 300$"], capture_output=True).returncode == 1


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


def fake_v2_root(tmp_path):
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids\n")
    (root / "cgroup.subtree_control").write_text("cpuset\n")
    (root / "cgroup.procs").write_text("")
    return root


def test_cgroup_v2_leaf_gets_every_limit(tmp_path):
    root = fake_v2_root(tmp_path)
    r = run(["--tier", "batch", "--mem-high", "1G", "--mem-max", "2G", "--io-max", "254:0:wbps=10M,rbps=20M",
             "--pids-max", "100", "--", "sh", "-c", "cat %s/gpuguard-lowprio-*/cgroup.procs; echo $$" % root],
            env={"LOWPRIO_CGROUP_ROOT": str(root), "LOWPRIO_CGROUP_MODE": "v2"})
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
    assert (root / "cgroup.subtree_control").read_text() == "+cpu +memory +io +pids\n"
    assert "via cgroup-v2" in r.stderr and "CPU idle class (cpu.idle=1)" in r.stderr
    r = run(["--tier", "online", "--cpu-weight", "30", "--", "true"],
            env={"LOWPRIO_CGROUP_ROOT": str(root), "LOWPRIO_CGROUP_MODE": "v2"})
    assert "CPU weight 30 (cpu.weight=30)" in r.stderr


def test_cgroup_v2_offline_uses_the_idle_class(tmp_path):
    root = fake_v2_root(tmp_path)
    r = run(["--tier", "offline", "--", "true"], env={"LOWPRIO_CGROUP_ROOT": str(root), "LOWPRIO_CGROUP_MODE": "v2"})
    assert r.returncode == 0, r.stderr
    (leaf,) = root.glob("gpuguard-lowprio-*")
    assert (leaf / "cpu.idle").read_text() == "1\n"


def test_cgroup_failure_falls_back_and_says_what_is_not_in_force(tmp_path):
    root = fake_v2_root(tmp_path)
    (root / "cgroup.subtree_control").unlink()
    (root / "cgroup.subtree_control").mkdir()      # any write fails
    r = run(["--tier", "batch", "--mem-max", "1G", "--", "sh", "-c", "cat /proc/self/autogroup"],
            env={"LOWPRIO_CGROUP_ROOT": str(root), "LOWPRIO_CGROUP_MODE": "v2"})
    assert r.returncode == 0, r.stderr
    assert "not in force: cgroup v2 not used: Is a directory" in r.stderr
    assert "not in force: mem_max=1073741824 needs a cgroup" in r.stderr
    assert "via autogroup" in r.stderr and r.stdout.strip().endswith("nice 15")


@pytest.mark.parametrize("text,name", [("write error: Device or resource busy", "EBUSY"),
                                       ("write error: Read-only file system", "EROFS"),
                                       ("write error: No such file or directory", "ENOENT")])
def test_errno_names(text, name):
    r = subprocess.run(["bash", "-c", 'source lib/cgroup.sh; cg_errno_name "$1"', "_", text],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.stdout.startswith(name)


def test_systemd_scope_when_systemd_owns_the_tree(tmp_path):
    fake = recording_wrapper(tmp_path / "bin", "systemd-run", tmp_path / "args")
    r = run(["--tier", "batch", "--mem-max", "4G", "--", "sh", "-c", "echo ran; exit 3"],
            env={"PATH": "%s:%s" % (fake, os.environ["PATH"]), "LOWPRIO_SYSTEMD": "1"})
    assert r.returncode == 3 and r.stdout == "ran\n"
    args = (tmp_path / "args").read_text().splitlines()
    assert args[:4] == ["--scope", "--quiet", "--collect", "--unit"]
    for prop in ("CPUWeight=idle", "CPUQuota=%d%%" % (60 * CPUS), "MemoryMax=4294967296", "MemorySwapMax=0"):
        assert prop in args
    assert args[args.index("--") + 1:] == ["nice", "-n", "15", "ionice", "-c", "3", "sh", "-c", "echo ran; exit 3"]


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

def leaves():
    return [d for d in os.listdir(LEAF_PARENT) if d.startswith("gpuguard-lowprio-")]


CG_PROBE = r"""
if grep -q '^0::/gpuguard' /proc/self/cgroup; then
  d=/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)
  echo leaf=${d##*/}; cat $d/cpu.idle; cut -d' ' -f1 $d/cpu.max; cat $d/memory.max
else
  d=$(grep ':cpu:' /proc/self/cgroup | cut -d: -f3); echo leaf=${d##*/}
  grep -q ':memory:/gpuguard' /proc/self/cgroup && echo memory-moved
  cat /sys/fs/cgroup/cpu$d/cpu.idle /sys/fs/cgroup/cpu$d/cpu.cfs_quota_us /sys/fs/cgroup/memory$d/memory.limit_in_bytes
fi
sleep 300 &
"""


@real_cgroup
def test_real_cgroup_limits_and_cleanup():
    r = run(["--tier", "batch", "--mem-max", "1G", "--", "sh", "-c", CG_PROBE], env=REAL_ENV)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    assert re.match(r"leaf=gpuguard-lowprio-\d+$", lines[0]), lines
    assert lines[-3:] == ["1", str(60 * CPUS * 1000), str(1 << 30)]
    assert leaves() == []                      # removed, the stray sleep killed with it
    assert subprocess.run(["pgrep", "-f", "^sleep 300$"], capture_output=True).returncode == 1


@real_cgroup
def test_real_memory_limit_bites():
    hog = "import time; x = bytearray(512 << 20); [x.__setitem__(i, 1) for i in range(0, len(x), 4096)]; print('survived')"
    r = run(["--tier", "online", "--mem-max", "128M", "--", sys.executable, "-c", hog], env=REAL_ENV)
    assert "survived" not in r.stdout
    assert r.returncode in (137, 1), (r.returncode, r.stderr)
    assert leaves() == []


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
    stale = os.path.join(LEAF_PARENT, "gpuguard-lowprio-999999999")
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
    assert leaves() == []
