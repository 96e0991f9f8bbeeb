"""State folders for the report tests, made from the H200 recordings in
tests/fixtures/h200 by the project's own code: the watchdog
(yichuidingyin.sh --once, against the nvidia-smi double) writes
gpu-history.tsv and the idle alerts, and the leak detector's live cycle
(gpuguard_leak.check) writes the per-process history, its state and the
leak alerts. Time is stretched 60x (a recorded second becomes a minute) so
the 2-minute leak recording makes a 2-hour story.

The story, two H200s, one sample every 2 minutes for 2 hours:
The leak watcher samples every minute (its default interval).
  GPU 0: pid 1328 leaks (leak-trace-leaking.csv), busy throughout
  GPU 1: pid 1329 warms up then holds steady (leak-trace-healthy.csv), and
         pid 437 holds 2.6 GiB; the GPU goes idle-but-occupied for 24
         minutes in the middle (recording-idle-then-busy.txt's utilization
         and power), which fires and resolves the idle alert.
"""
import csv
import io
import json
import os
import subprocess

import gpuguard_leak as leak
from conftest import ROOT, gpu_list, user_environ

H200 = ROOT / "tests" / "fixtures" / "h200"
T0 = 1796220302          # the leak recordings' first second
STEP_S = 120             # one watchdog cycle every 2 minutes
STEPS = 60
STRETCH = 60             # a recorded second becomes a minute
LEAK_INTERVAL_S = 60     # the leak watcher's default LEAK_INTERVAL
LEAK_PID, HEALTHY_PID, IDLE_PID = 1328, 1329, 437
GPU_TOTAL_MIB = 143771    # an H200's memory.total


def trace(name):
    with open(H200 / name, newline="") as f:
        return [(int(r["timestamp"]) - T0, float(r["used_memory_mib"])) for r in csv.DictReader(f)]


def at(tr, seconds):
    """The recorded value at a recorded second (last one before it)."""
    v = tr[0][1]
    for t, m in tr:
        if t > seconds:
            break
        v = m
    return v


def recording_samples():
    """(util, used, power) of each recording sample."""
    out = []
    lines = (H200 / "recording-idle-then-busy.txt").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("### 1"):
            p = [x.strip() for x in lines[i + 1].split(",")]
            out.append((int(p[2]), int(p[3]), float(p[5])))
    return out


def memory_at(leaking, healthy, recorded):
    """{pid: MiB} at a recorded second."""
    return {LEAK_PID: at(leaking, recorded), HEALTHY_PID: at(healthy, recorded), IDLE_PID: 2696.0}


def story():
    """Per step: (now, gpu0 (util, power), gpu1 (util, power), {pid: MiB})."""
    rec = recording_samples()
    busy = [s for s in rec if s[0] > 50]
    held = [s for s in rec if s[0] == 0 and s[1] > 0]
    leaking, healthy = trace("leak-trace-leaking.csv"), trace("leak-trace-healthy.csv")
    steps = []
    for i in range(STEPS):
        now = T0 + i * STEP_S
        recorded = i * STEP_S / STRETCH
        mem = memory_at(leaking, healthy, recorded)
        g0 = busy[i % len(busy)][0], busy[i % len(busy)][2]
        if 20 <= i < 32:
            g1 = held[i % len(held)][0], held[i % len(held)][2]
        else:
            g1 = busy[(i + 1) % len(busy)][0], busy[(i + 1) % len(busy)][2]
        steps.append((now, g0, g1, mem))
    return steps


def build(state, with_gpu_history=True, with_leak=True):
    """Fills the state folder; returns the steps."""
    state.mkdir(parents=True, exist_ok=True)
    steps = story()
    if with_gpu_history:
        scenario = state.parent / "scenario.json"
        scenario.write_text(json.dumps({"gpus": gpu_list(2), "steps": [
            {"gpus": [{"utilization.gpu": g0[0], "memory.used": int(mem[LEAK_PID]) + 512, "power.draw": g0[1]},
                      {"utilization.gpu": g1[0], "memory.used": int(mem[HEALTHY_PID] + mem[IDLE_PID]) + 512,
                       "power.draw": g1[1]}],
             "apps": [{"pid": LEAK_PID, "process_name": "python3", "used_memory": int(mem[LEAK_PID]), "gpu": 0},
                      {"pid": HEALTHY_PID, "process_name": "python3", "used_memory": int(mem[HEALTHY_PID]), "gpu": 1},
                      {"pid": IDLE_PID, "process_name": "python3", "used_memory": int(mem[IDLE_PID]), "gpu": 1}]}
            for _, g0, g1, mem in steps]}))
        env = user_environ(PATH="%s:%s" % (ROOT / "tests/fakebin", os.environ.get("PATH", "/usr/bin:/bin")),
                   GPUGUARD_CONFIG="/dev/null", GPUGUARD_STATE_DIR=str(state), FAKE_SMI_SCENARIO=str(scenario),
                   FAKE_SMI_STATE=str(state.parent / "smi-step"), GPUGUARD_HOST="h200-demo")
        for now, *_ in steps:
            r = subprocess.run([str(ROOT / "bin/yichuidingyin.sh"), "--once"], env=dict(env, GPUGUARD_NOW=str(now)),
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
    if with_leak:
        env = {"GPUGUARD_STATE_DIR": str(state), "LEAK_BUCKET_S": "120", "GPUGUARD_HOST": "h200-demo",
               "LEAK_INSTANCE": "h200-demo"}
        events = []
        leaking, healthy = trace("leak-trace-leaking.csv"), trace("leak-trace-healthy.csv")
        # the leak watcher samples at its default interval (LEAK_INTERVAL=60):
        # twice per watchdog cycle; a longer gap reads to the detector as a
        # missed sample, and a level change after one as a restart
        for i in range(STEPS * STEP_S // LEAK_INTERVAL_S):
            now = T0 + i * LEAK_INTERVAL_S
            mem = memory_at(leaking, healthy, i * LEAK_INTERVAL_S / STRETCH)
            lines = ""
            for pid, start in ((LEAK_PID, 5000), (HEALTHY_PID, 5001)):
                gpu_used = mem[LEAK_PID] + 512 if pid == LEAK_PID else mem[HEALTHY_PID] + mem[IDLE_PID] + 512
                # the tab-separated protocol of gpuguard_leak.py (PROTOCOL):
                # T KEY TS PID USED FREE TOTAL CPU RSS MEMBERS NAME CMDLINE
                lines += "T\t%d-%d\t%d\t%d\t%d\t%d\t%d\t90\t4000\t%d\tpython3\tpython3 train.py --config cfg%d.yaml\n" % (
                    pid, start, now, pid, mem[pid], GPU_TOTAL_MIB - gpu_used, GPU_TOTAL_MIB, pid, pid)
            if i == 0:
                # the watcher names a series when it first sees it (lib/jobinfo.sh's job object)
                lines += "J\t%d-5000\t%s\n" % (LEAK_PID, json.dumps({
                    "user": "alice", "uid": 1001, "pid": LEAK_PID, "pids": [LEAK_PID],
                    "cmdline": "python3 train.py --config cfg1328.yaml --run-name qwen7b-sft-lr2e-5 --hf-token ***",
                    "cwd": "/home/alice/sft", "start_ts": T0 - 600, "elapsed_s": 600, "slurm_job": None,
                    "container": None, "rank": None, "local_rank": None, "visible": True}))
            out = io.StringIO()
            leak.check(env, io.StringIO(lines), out)
            for line in out.getvalue().splitlines():
                if line.startswith("event\t"):
                    events.append(line.split("\t", 3)[3])
        with open(state / "events.jsonl", "a") as f:
            f.writelines(e + "\n" for e in events)
    return steps
