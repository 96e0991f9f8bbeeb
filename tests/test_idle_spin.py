"""The stuck-job signal (utilization high, power at the idle floor), as a
user meets it: every pattern measured on an H200 (the raw samples in
tests/fixtures/h200/dmon-gpm.txt and the power and utilization figures
lib/idle.sh quotes) replayed through the
nvidia-smi double with the default configuration: every spin raises one
gpu_stuck alert, no busy pattern ever does."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import H200_UUID, ROOT, app, busy_gpu, idle_gpu, require

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "h200" / "dmon-gpm.txt"
CYCLES = 7          # SPIN_CYCLES (5) + 2: a spin must have fired by then


def dmon_samples(section):
    """(utilization %, power W) samples of one workload of the fixture: the
    --query-gpu line, then dmon's sm % and pwr columns."""
    text = FIXTURE.read_text().split("## " + section + "\n", 1)[1].split("\n## ", 1)[0]
    out = []
    for line in text.splitlines():
        m = re.match(r"(\d+) %, \d+ %, ([\d.]+) W", line)
        if m:
            out.append((int(m.group(1)), float(m.group(2))))
            continue
        cols = line.split()
        if cols and cols[0] == "0":
            out.append((int(cols[4]), float(cols[1])))
    assert out, section
    return out


# Table 1 (medians, 250 ms samples), as (utilization, power) per cycle.
TABLE1_SPIN = {
    "t1 torch.cuda._sleep, one block": [(100, 121)],
    "t1 2 blocks polling a flag": [(100, 122)],
    "t1 16 blocks polling a flag": [(100, 126)],
    "t1 32 blocks polling a flag": [(100, 127)],
    "t1 132 blocks polling a flag": [(100, 132)],
}
TABLE1_BUSY = {
    "t1 tiny kernels, CUDA graph": [(100, 183)],
    "t1 tiny kernels from Python (launch-bound)": [(41, 139)],
    "t1 GEMV decode, CUDA graph": [(100, 640)],
    "t1 memory copy 2 x 8 GiB": [(100, 476)],
    "t1 bf16 8192^2 matmul": [(100, 692)],
}
# Held but doing nothing: the utilization rule's business, never "stuck".
# The starved loop's bursts (5 matmuls, then 200 ms of CPU) read a few %.
TABLE1_IDLE = {
    "t1 context held, deep idle": [(0, 79)],
    "t1 nothing running just after work": [(0, 122)],
    "t1 loop starved by its data loader": [(0, 126), (0, 126), (4, 131), (0, 126), (2, 128), (0, 126)],
}
TABLE2_SPIN = {"t2 " + s: dmon_samples(s) for s in ("sleep1", "poll32", "poll132")}
TABLE2_BUSY = {"t2 " + s: dmon_samples(s) for s in ("graph", "launch", "memcpy", "gemv", "matmul")}
TABLE2_IDLE = {"t2 idle": dmon_samples("idle")}

PATTERNS = ([(k, v, "gpu_stuck") for k, v in {**TABLE1_SPIN, **TABLE2_SPIN}.items()]
            + [(k, v, None) for k, v in {**TABLE1_BUSY, **TABLE2_BUSY}.items()]
            + [(k, v, "gpu_idle") for k, v in {**TABLE1_IDLE, **TABLE2_IDLE}.items()])


def held(util, power, pid=4242):
    return {"gpus": [idle_gpu(util=util, power=power, mem=12000)], "apps": [app(pid, mem=11800)]}


def fired(events):
    return [(e["event"], e["state"]) for e in events]


@pytest.mark.parametrize("name,samples,expected", PATTERNS, ids=[p[0] for p in PATTERNS])
def test_h200_pattern_replayed_with_defaults(box, name, samples, expected):
    steps = [held(*samples[i % len(samples)]) for i in range(CYCLES)]
    box.write_scenario(steps)
    for t in range(CYCLES):
        box.once(now=1000 + 60 * t)
    events = box.events()
    if expected is None:
        assert events == [], name
    else:
        assert fired(events) == [(expected, "firing")], name
    if expected == "gpu_stuck":
        (event,) = events
        assert event["reason"] == "spinning" and event["spin_cycles"] == 5
        assert event["utilization"] >= 90 and event["power_limit_w"] == 700
        assert event["idle_seconds"] == 240


def test_stuck_fires_once_then_resolves_under_its_own_name(box):
    spin = held(100, 124.8)
    box.write_scenario([spin] * 8 + [{"gpus": [busy_gpu()], "apps": [app(4242)]}])
    for t in range(9):
        box.once(now=60 * t)
    assert fired(box.events()) == [("gpu_stuck", "firing"), ("gpu_stuck", "resolved")]
    assert box.events()[1]["reason"] == "busy"


def test_stuck_job_that_then_idles_stays_one_incident(box):
    """A rank spins, then its collective times out and it sits idle: one
    alert, no resolve in between, resolved when the job exits."""
    gone = {"gpus": [idle_gpu(mem=0)], "apps": []}
    box.write_scenario([held(100, 125)] * 5 + [held(0, 80)] * 4 + [gone])
    for t in range(10):
        box.once(now=60 * t)
    assert fired(box.events()) == [("gpu_stuck", "firing"), ("gpu_stuck", "resolved")]
    assert box.events()[1]["reason"] == "released"


def test_spin_threshold_follows_the_power_limit(box):
    """Relative to power.limit: 150 W is spinning-level on a 700 W H200 and
    busy on a GPU capped at 400 W (37 %)."""
    box.write_scenario([held(100, 150)] * 6)
    for t in range(6):
        box.once(now=t)
    assert fired(box.events()) == [("gpu_stuck", "firing")]
    capped = {"gpus": [{"index": 0, "uuid": "GPU-cap0", "memory.total": 81559, "power.limit": 400.0}],
              "steps": [held(100, 150)] * 6}
    box.scenario.write_text(json.dumps(capped))
    (box.tmp / "smi-step").write_text("0")
    for t in range(6):
        box.once(now=100 + t)
    assert [e["uuid"] for e in box.events()] == [box.events()[0]["uuid"]]


def test_spin_rule_configurable_and_off_with_zero(box):
    box.write_scenario([held(100, 125)] * 12)
    for t in range(6):
        box.once(now=t, env={"IDLE_POWER_PCT": "0"})
    assert box.events() == []
    for t in range(6, 9):
        box.once(now=t, env={"SPIN_CYCLES": "2"})
    assert fired(box.events()) == [("gpu_stuck", "firing")]


def test_high_but_not_full_utilization_under_spin_util_min_is_not_stuck(box):
    box.write_scenario([held(85, 125)] * 7)
    for t in range(7):
        box.once(now=t)
    assert box.events() == []
    box.write_scenario([held(85, 125)] * 7)
    (box.tmp / "smi-step").write_text("0")
    for t in range(7, 14):
        box.once(now=t, env={"SPIN_UTIL_MIN": "80"})
    assert fired(box.events()) == [("gpu_stuck", "firing")]


def test_unknown_power_never_counts_and_never_resolves_a_spin(box):
    """power.draw [N/A] in the middle of a spin: the count holds (no alert
    from it, no reset); on a GPU never read spinning it is just busy."""
    na = held(100, "[N/A]")
    box.write_scenario([held(100, 125)] * 4 + [na] * 3 + [held(100, 125)])
    for t in range(7):
        box.once(now=t)
    assert box.events() == []
    box.once(now=7)
    assert fired(box.events()) == [("gpu_stuck", "firing")]
    assert box.events()[0]["spin_cycles"] == 5


def test_busy_with_unknown_power_is_busy(box):
    box.write_scenario([held(100, "[N/A]")] * 8)
    for t in range(8):
        box.once(now=t)
    assert box.events() == []


def test_spinning_free_gpu_is_not_held(box):
    """No process and memory under IDLE_MEM_MIB: nothing holds it."""
    free = {"gpus": [idle_gpu(util=100, power=125, mem=300)], "apps": []}
    box.write_scenario([free] * 7)
    for t in range(7):
        box.once(now=t)
    assert box.events() == []


PROMTOOL = shutil.which("promtool")


def test_stuck_gpu_in_the_textfile_metrics(box, tmp_path):
    require(PROMTOOL is not None, "promtool (Debian package prometheus) not installed")
    textdir = tmp_path / "textfile"
    box.write_scenario([held(100, 125)] * 6)
    for t in range(6):
        box.once(now=t, env={"GPUGUARD_TEXTFILE_DIR": str(textdir)})
    text = (textdir / "gpuguard_idle.prom").read_text()
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    lbl = '{gpu="0",uuid="%s",vendor="nvidia"}' % H200_UUID
    for line in ("gpuguard_gpu_stuck%s 1" % lbl, "gpuguard_gpu_idle%s 0" % lbl,
                 "gpuguard_gpu_spin_cycles%s 6" % lbl, "gpuguard_gpu_power_limit_watts%s 700.00" % lbl,
                 "gpuguard_gpu_fault%s 0" % lbl):
        assert line in text.splitlines(), line


def test_shipped_rules_stuck_and_degraded_under_promtool():
    require(PROMTOOL is not None, "promtool (Debian package prometheus) not installed")
    r = subprocess.run([PROMTOOL, "test", "rules", "tests/prometheus/idle.rules.test.yml"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
