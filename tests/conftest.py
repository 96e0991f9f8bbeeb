"""Shared helpers: run gpuguard's commands as a user would, against the
project's nvidia-smi test double and a local webhook sink."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAKEBIN = ROOT / "tests" / "fakebin"
SCENARIOS = ROOT / "tests" / "fixtures" / "scenarios"
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests"))

H200_UUID = "GPU-21b026da-3a23-ca8c-52da-f8eedc850d97"
# Under CI every prerequisite is installed by .ci/run: a missing one there is
# a failure, never a quiet skip.
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(ok, reason):
    """Skips the calling test with `reason` when `ok` is false, or fails it
    when CI=true, where .ci/run installs everything the suite needs."""
    if ok:
        return
    if IN_CI:
        pytest.fail("prerequisite missing under CI=true: " + reason, pytrace=False)
    pytest.skip(reason)


# `make test-fast` runs `pytest -m "not slow"`. Slow: a test that starts a
# server or a daemon, sleeps over 1 s, or took 1.5 s or more under
# `pytest --durations=0` on the 2-core CI machine, and a few 1.2-1.4 s ones
# (the loop must stay under a minute on cores shared with others). New tests
# mark themselves with @pytest.mark.slow; this list covers the older ones, so
# their files need no edit. An entry is "file.py" (the whole module),
# "file.py::test" (every parameter) or "file.py::test[param]".
SLOW = {
    "test_report.py",  # a module fixture runs the watchdog and the leak watch over recordings (~20 s)
    "test_prometheus.py::test_end_to_end_idle_alert_through_the_real_stack",  # Prometheus, Alertmanager, node_exporter
    "test_double_and_demo.py::test_make_demo_shows_a_firing_and_a_resolved_alert",  # a daemon and a webhook
    "test_double_and_demo.py::test_replays_a_raw_recording_verbatim",
    "test_bats_and_lint.py::test_shellcheck_clean",  # 10 s; `make lint` runs it too
    "test_bats_and_lint.py::test_bats_file[smi.bats]",
    "test_leak.py::test_live_watch_follows_the_tree_and_alerts_with_context",  # live watchers, 5-7 s each
    "test_leak.py::test_on_leak_kill_stops_the_whole_tree",
    "test_leak.py::test_watched_job_ending_resolves_and_the_watcher_survives",
    "test_leak.py::test_report_is_one_self_contained_html_file",
    "test_leak.py::test_slurm_job_on_this_node_is_watched_by_its_pids",
    "test_leak.py::test_rules_exempt_a_pattern",
    "test_leak.py::test_steady_memory_does_not_alert",
    "test_leak.py::test_match_watches_the_topmost_matching_process",
    "test_leak.py::test_on_leak_signal_is_sent_to_the_root",
    "test_leak.py::test_daemon_with_pid_targets_stops_when_they_have_ended",  # a daemon, sleeps 2.5 s
    "test_leak.py::test_history_is_bounded",
    "test_watchdog.py::test_daemon_makes_two_smi_calls_per_cycle_and_stops_cleanly",  # a daemon
    "test_watchdog.py::test_reminder_every_repeat_interval_and_not_more",  # many cycles, 1.2-1.6 s each
    "test_watchdog.py::test_reminders_off_with_zero_interval",
    "test_watchdog.py::test_threshold_is_strict_and_configurable",
    # the fast loop keeps the garbage and driver cases of this one
    "test_watchdog.py::test_failing_nvidia_smi_never_alerts_idle_and_keeps_counters[no_devices]",
    "test_watchdog.py::test_failing_nvidia_smi_never_alerts_idle_and_keeps_counters[mismatch]",
    "test_watchdog.py::test_failing_nvidia_smi_never_alerts_idle_and_keeps_counters[unknown]",
    "test_watchdog.py::test_failing_nvidia_smi_never_alerts_idle_and_keeps_counters[gpu_lost]",
    "test_lowprio.py::test_real_cpu_cap_bites",  # sleeps 2 s
    "test_lowprio.py::test_every_thread_and_child_inherits_nice_and_io_class",  # threads sleep 2 s
    "test_alerts.py::test_receiver_down_for_several_cycles_then_delivered_once_in_order",
    "test_alerts.py::test_timeout_is_retried",  # the receiver answers after a delay
    "test_alerts.py::test_5xx_is_retried_with_backoff",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: left out of `make test-fast` (a server or daemon, a sleep over "
                                       "1 s, or 1.5 s or more here)")
    config.addinivalue_line("markers", "require(ok, reason): require(ok, reason) before the test runs "
                                       "(skips locally, fails under CI=true)")


def measured_slow():
    """The node ids of tests/slow.txt (measured: 0.5 s or more each)."""
    lines = (ROOT / "tests" / "slow.txt").read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def pytest_collection_modifyitems(config, items):
    slow = SLOW | measured_slow()
    for item in items:
        module = item.path.name
        base = getattr(item, "originalname", item.name)
        # the fault-injection suite runs daemons, kills and full disks
        if item.path.parent.name == "faults" or {module, module + "::" + base, module + "::" + item.name} & slow:
            item.add_marker(pytest.mark.slow)


def pytest_runtest_setup(item):
    # @pytest.mark.require(ok, reason): the decorator form of require()
    for mark in item.iter_markers("require"):
        require(*mark.args, **mark.kwargs)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    # Under CI=true every prerequisite is installed: a skip from anywhere
    # (pytest.skip, skipif, importorskip) hides a missing install step.
    report = yield
    if report.skipped and not hasattr(report, "wasxfail") and isinstance(report.longrepr, tuple):
        path, line, reason = report.longrepr
        if IN_CI:
            report.outcome = "failed"
            report.longrepr = "skipped under CI=true, where .ci/run installs everything: " + reason
        elif path == __file__:
            # a skip from require(): name the test, not this file, in -rs
            path, line, _ = item.location
            report.longrepr = (path, line + 1, item.name + ": " + reason.removeprefix("Skipped: "))
    return report


def uuid_for(i):
    return "GPU-%08x-3a23-ca8c-52da-f8eedc850d97" % (0x21b026da + i) if i else H200_UUID


def gpu_list(n):
    return [{"index": i, "uuid": uuid_for(i), "name": "NVIDIA H200",
             "pci.bus_id": "00000000:%02X:00.0" % (i + 6), "memory.total": 143771,
             "power.limit": 700.0} for i in range(n)]


def idle_gpu(mem=2576, util=0, power=76.6):
    return {"utilization.gpu": util, "memory.used": mem, "power.draw": power}


def busy_gpu(mem=12266):
    return {"utilization.gpu": 100, "memory.used": mem, "power.draw": 691.0}


def app(pid, gpu=0, mem=2556, name="python3"):
    return {"pid": pid, "process_name": name, "used_memory": mem, "gpu": gpu}


class Box:
    """A temporary machine: state folder, scenario, double and sink wiring."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.state = tmp_path / "state dir"       # a space, on purpose
        self.scenario = tmp_path / "scenario.json"
        self.smi_log = tmp_path / "smi.log"
        self.env = {
            "PATH": f"{FAKEBIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(tmp_path / "home"),
            "LANG": "C.UTF-8",
            "GPUGUARD_CONFIG": "/dev/null",
            "GPUGUARD_STATE_DIR": str(self.state),
            "FAKE_SMI_SCENARIO": str(self.scenario),
            "FAKE_SMI_STATE": str(tmp_path / "smi-step"),
            "FAKE_SMI_LOG": str(self.smi_log),
            "CHECK_INTERVAL": "1",
        }
        (tmp_path / "home").mkdir()

    def write_scenario(self, steps, gpus=1):
        self.scenario.write_text(json.dumps({"gpus": gpu_list(gpus), "steps": steps}))

    def run(self, *args, env=None, cmd="bin/yichuidingyin.sh", timeout=60, input=None):
        full = dict(self.env)
        full.update(env or {})
        return subprocess.run([str(ROOT / cmd)] + list(args), env=full, text=True,
                              capture_output=True, timeout=timeout, input=input, check=False)

    def once(self, now=None, env=None):
        extra = dict(env or {})
        if now is not None:
            extra["GPUGUARD_NOW"] = str(now)
        r = self.run("--once", env=extra)
        assert r.returncode == 0, r.stderr
        return r

    def events(self):
        path = self.state / "events.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def smi_calls(self):
        return self.smi_log.read_text().splitlines() if self.smi_log.exists() else []


@pytest.fixture
def box(tmp_path):
    return Box(tmp_path)


@pytest.fixture
def sink():
    import webhook_sink
    server, recorder = webhook_sink.serve(quiet=True)
    recorder.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield recorder
    server.shutdown()


def recording_wrapper(folder, name, log):
    """Writes a fake wrapper command (systemd-run, cpulimit) into folder:
    it records its arguments, one per line, in log, then runs what follows
    its "--"."""
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {log}\n'
                    'while [ "$1" != "--" ]; do shift; done\nshift\nexec "$@"\n')
    path.chmod(0o755)
    return folder


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now, for a server a
    test starts on it (Prometheus, node_exporter). For a receiver that is
    down, and perhaps up later, use DownPort: it keeps the port."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class DownPort:
    """A receiver that is down: a port bound but not listening, so a
    connect is refused and no other process (a parallel suite, a leftover
    server) can take the port meanwhile; up() starts a webhook sink on that
    very socket. Use as a context manager, or close()."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port

    def up(self, **kwargs):
        import webhook_sink
        sock, self.sock = self.sock, None
        return webhook_sink.serve(sock=sock, **kwargs)

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@pytest.fixture
def down_port():
    port = DownPort()
    yield port
    port.close()


def config_keys():
    text = (ROOT / "lib" / "config.sh").read_text()
    return set(re.findall(r"^\s*\[([A-Z][A-Z0-9_]*)\]=", text, re.MULTILINE))


def user_environ(**extra):
    """The runner's environment without what would change a command's
    behaviour behind a test's back: gpuguard's configuration keys and its
    internal or test-double variables (a suite run after another check, or
    from a shell where NOTIFY_URL or LOWPRIO_TIER is set, sees the same)."""
    keys = config_keys()
    env = {k: v for k, v in os.environ.items()
           if k not in keys and not re.match(r"(GPUGUARD|GG|LOWPRIO|LEAK|FAKE_SMI|NOTIFY|SMI)_", k)}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def disk_of(path):
    """The whole disk's MAJ:MIN and name for a path, or None (tmpfs...)."""
    st = os.stat(path)
    majmin = "%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))
    if os.major(st.st_dev) == 0 or not os.path.exists("/sys/dev/block/" + majmin):
        return None
    sysdir = os.path.realpath("/sys/dev/block/" + majmin)
    if os.path.exists(os.path.join(sysdir, "partition")):
        sysdir = os.path.dirname(sysdir)
    return open(os.path.join(sysdir, "dev")).read().strip(), os.path.basename(sysdir)


def wait_for(pred, timeout=15.0, step=0.05):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(step)
    return False


def run_killed_after(cmd, env, seconds):
    """Runs cmd and kills it with SIGKILL when it still runs after `seconds`
    (None: never), as a crash or an OOM kill lands at a random point.
    Returns (killed, exit status)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return False, proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        return True, proc.wait()


def stop_processes(procs):
    """Stops servers a test started (prometheus, node_exporter...): TERM to
    each still running, then up to 10 s for each before KILL."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


def fill_filesystem(folder):
    """Fills the file system holding folder with one file; returns its path."""
    filler = Path(folder) / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def default_signals():
    """In the child before exec: the dispositions a user's terminal gives.
    A test suite started in the background of a script inherits SIGINT and
    SIGQUIT ignored, and bash can neither trap nor reset a signal ignored
    on entry, so a Ctrl-C test would test the harness, not the command."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def start_daemon(box, env=None, cmd="bin/yichuidingyin.sh", args=()):
    full = dict(box.env)
    full.update(env or {})
    return subprocess.Popen([str(ROOT / cmd)] + list(args), env=full, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_signals)


def stop_daemon(proc, sig=signal.SIGTERM, timeout=15):
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        # a daemon that did not stop is a failure; say where it and its
        # children were (rare, and seen only on a loaded CI machine)
        where = process_tree_report(proc.pid)
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"did not stop within {timeout}s of {sig!r}; its processes then:\n{where}"
                             f"\nits stderr:\n{err}") from exc
    return proc.returncode, out, err


def process_tree_report(root):
    """One line per process of the tree under root: PID, state, what the
    kernel says it waits in (wchan), its command line."""
    children, states = {}, {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                state, ppid = (d / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            except (OSError, ValueError):
                continue
            states[int(d.name)] = state
            children.setdefault(int(ppid), []).append(int(d.name))
    lines, todo = [], [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        base = Path("/proc") / str(pid)
        try:
            state = states.get(pid, "?")
            wchan = (base / "wchan").read_text() or "-"
            cmd = (base / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
        except OSError:
            continue
        lines.append(f"{pid} {state} {wchan} {cmd}")
    return "\n".join(lines)
