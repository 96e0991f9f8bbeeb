"""Shared helpers: run gpuguard's commands as a user would, against the
project's nvidia-smi test double and a local webhook sink."""
import json
import os
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
            "PATH": "%s:%s" % (FAKEBIN, os.environ.get("PATH", "/usr/bin:/bin")),
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
                              capture_output=True, timeout=timeout, input=input)

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
    recorder.url = "http://127.0.0.1:%d" % server.server_address[1]
    yield recorder
    server.shutdown()


def recording_wrapper(folder, name, log):
    """Writes a fake wrapper command (systemd-run, cpulimit) into folder:
    it records its arguments, one per line, in log, then runs what follows
    its "--"."""
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text('#!/bin/sh\nprintf "%%s\\n" "$@" > %s\n'
                    'while [ "$1" != "--" ]; do shift; done\nshift\nexec "$@"\n' % log)
    path.chmod(0o755)
    return folder


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on (for "receiver down")."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_for(pred, timeout=15.0, step=0.05):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(step)
    return False


def start_daemon(box, env=None, cmd="bin/yichuidingyin.sh", args=()):
    full = dict(box.env)
    full.update(env or {})
    return subprocess.Popen([str(ROOT / cmd)] + list(args), env=full, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def stop_daemon(proc, sig=signal.SIGTERM, timeout=15):
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err
