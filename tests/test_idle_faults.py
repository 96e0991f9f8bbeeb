"""The idle watchdog under nvidia-smi faults and kill -9, as a user runs it
(--once from cron, the daemon): no false idle alert, no false resolved,
one monitor_degraded per persistent fault, one gpu_degraded per faulted
GPU, and an incident is never lost nor sent twice across kill -9."""
import fcntl
import json
import os
import random
import signal
import socket
import subprocess
import time

import pytest
from conftest import H200_UUID, ROOT, app, busy_gpu, idle_gpu, run_killed_after, uuid_for, wait_for

IDLE = {"gpus": [idle_gpu()], "apps": [app(1410)]}
BUSY = {"gpus": [busy_gpu()], "apps": [app(1410)]}
# a small job (600 MiB, under IDLE_MEM_MIB): with its process list lost it
# would read as "released"
SMALL_IDLE = {"gpus": [idle_gpu(mem=600)], "apps": [app(1410, mem=580)]}
RESET = "[GPU requires reset]"


def faulted(text=RESET):
    return {"gpus": [{"utilization.gpu": text, "memory.used": text, "memory.total": text,
                      "power.draw": text, "power.limit": text}], "apps": []}


def line(util, mem="2576", total="143771", power="76.60", limit="700.00", uuid=H200_UUID, index=0):
    return "%d, %s, %s, %s, %s, %s, %s, NVIDIA H200\n" % (index, uuid, util, mem, total, power, limit)


# One cycle of each fault, as nvidia-smi or a broken driver prints it.
FAULTS = {
    "driver not loaded (exit 9)": {"fault": "driver"},
    "GPU lost (exit 15)": {"fault": "gpu_lost"},
    "version mismatch (exit 18)": {"fault": "mismatch"},
    "garbage": {"fault": "garbage"},
    "empty output": {"fault": "garbage", "text": ""},
    "partial line": {"fault": "garbage", "text": "0, %s, 0, 25" % H200_UUID},
    "process list garbage": dict(IDLE, fault_apps="garbage"),
    "process list driver error": dict(IDLE, fault_apps="driver"),
    "process list hangs": dict(IDLE, fault_apps="hang", seconds=30),
    "utilization [N/A]": {"gpus": [idle_gpu(util="[N/A]")], "apps": [app(1410)]},
    "memory [N/A], processes hidden": {"gpus": [idle_gpu(mem="[N/A]")], "apps": []},
    "unsigned -1 utilization": {"fault": "garbage", "text": line("18446744073709551615")},
    "huge memory": {"fault": "garbage", "text": line("0", mem="99999999999999")},
    "GPU requires reset": faulted(),
    "Unknown Error": faulted("[Unknown Error]"),
}


def kinds(events):
    return [(e["event"], e["state"]) for e in events]


@pytest.mark.parametrize("fault", list(FAULTS), ids=list(FAULTS))
def test_one_fault_cycle_during_an_incident_changes_nothing(box, fault):
    """Firing, one faulty cycle, idle again: no resolved, no second alert;
    the job then gets busy: exactly one resolved."""
    box.write_scenario([SMALL_IDLE] * 3 + [FAULTS[fault], SMALL_IDLE, BUSY])
    for t in range(5):
        box.once(now=60 * t, env={"SMI_TIMEOUT": "1"})
    assert kinds(box.events()) == [("gpu_idle", "firing")], fault
    box.once(now=300)
    assert kinds(box.events()) == [("gpu_idle", "firing"), ("gpu_idle", "resolved")]
    assert box.events()[1]["reason"] == "busy"


@pytest.mark.parametrize("fault", list(FAULTS), ids=list(FAULTS))
def test_one_fault_cycle_neither_counts_nor_resets(box, fault):
    """Two idle cycles, a faulty one, one more idle cycle: the third idle
    reading fires (the fault did not count as idle, nor reset the count)."""
    box.write_scenario([SMALL_IDLE] * 2 + [FAULTS[fault], SMALL_IDLE])
    for t in range(3):
        box.once(now=t, env={"SMI_TIMEOUT": "1"})
    assert box.events() == [], fault
    box.once(now=3)
    assert kinds(box.events()) == [("gpu_idle", "firing")]
    assert box.events()[0]["idle_cycles"] == 3


def test_bom_and_crlf_are_a_good_reading(box):
    bom = {"fault": "garbage", "text": "\ufeff" + line("0").replace("\n", "\r\n")}
    box.write_scenario([IDLE, bom, IDLE])
    for t in range(3):
        box.once(now=t)
    assert kinds(box.events()) == [("gpu_idle", "firing")]


def test_missing_gpu_line_for_one_cycle_changes_nothing(box):
    two = {"gpus": [idle_gpu(), idle_gpu()], "apps": [app(10), app(11, gpu=1)]}
    only_gpu1 = {"fault": "garbage", "text": line("0", uuid=uuid_for(1), index=1)}
    box.write_scenario([two] * 3 + [only_gpu1, two], gpus=2)
    for t in range(5):
        box.once(now=t)
    assert sorted(kinds(box.events())) == [("gpu_idle", "firing")] * 2


@pytest.mark.parametrize("fault", ["driver", "garbage", "apps", "mixed"])
def test_persistent_fault_raises_exactly_one_monitor_degraded(box, fault):
    steps = {"driver": [{"fault": "driver"}] * 8,
             "garbage": [{"fault": "garbage"}] * 8,
             "apps": [dict(IDLE, fault_apps="garbage")] * 8,
             "mixed": [{"fault": "driver"}, dict(IDLE, fault_apps="garbage"), {"fault": "garbage"},
                       dict(IDLE, fault_apps="driver")] * 2}[fault]
    box.write_scenario([IDLE] + steps + [IDLE])
    logs = ""
    for t in range(9):
        logs += box.once(now=t, env={"SMI_FAIL_ALERT_CYCLES": "3"}).stderr
    assert kinds(box.events()) == [("monitor_degraded", "firing")]
    assert box.events()[0]["failures"] == 3
    assert logs.count("ERROR") == 1
    box.once(now=9)
    assert kinds(box.events()) == [("monitor_degraded", "firing"), ("monitor_degraded", "resolved")]


@pytest.mark.parametrize("text", [RESET, "[Unknown Error]"])
def test_device_fault_raises_one_critical_gpu_degraded_then_resolves(box, text):
    box.write_scenario([IDLE] * 2 + [faulted(text)] * 6 + [IDLE])
    for t in range(8):
        box.once(now=t, env={"SMI_FAIL_ALERT_CYCLES": "3"})
    (event,) = box.events()
    assert (event["event"], event["state"], event["severity"]) == ("gpu_degraded", "firing", "critical")
    assert event["gpu"] == 0 and event["uuid"] == H200_UUID
    assert event["fault"] == text.strip("[]")
    box.once(now=8)
    # the GPU reads fine: degraded resolves; the idle count was kept (2 + 1)
    assert kinds(box.events()) == [("gpu_degraded", "firing"), ("gpu_degraded", "resolved"),
                                   ("gpu_idle", "firing")]


def test_device_fault_names_the_gpu_among_eight(box):
    def step(bad):
        gpus = [idle_gpu(mem=0) for _ in range(8)]
        if bad:
            gpus[5] = faulted()["gpus"][0]
        return {"gpus": gpus, "apps": []}
    box.write_scenario([step(False)] + [step(True)] * 5, gpus=8)
    for t in range(6):
        box.once(now=t, env={"SMI_FAIL_ALERT_CYCLES": "3"})
    (event,) = box.events()
    assert event["gpu"] == 5 and event["uuid"] == uuid_for(5) and event["gpu_name"] == "NVIDIA H200"


LOST = "%d, [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost]\n"


def test_lost_gpu_resolves_on_its_first_good_reading(box):
    """nvidia-smi prints "[GPU is lost]" in place of the UUID too: the
    incident is the GPU's own (the UUID read at its index before), and it
    resolves on the first cycle that reads it fine (before: keyed on a
    made-up GPU-index-0, never matched, cleared as "gone" ~1 h later)."""
    box.write_scenario([BUSY] + [dict(BUSY, fault="uuid_lost")] * 4 + [BUSY] * 3)
    for t in range(6):
        box.once(now=60 * t, env={"SMI_FAIL_ALERT_CYCLES": "3"})
    fired, resolved = box.events()
    assert (fired["event"], fired["state"], fired["severity"]) == ("gpu_degraded", "firing", "critical")
    assert (fired["gpu"], fired["uuid"], fired["fault"]) == (0, H200_UUID, "GPU is lost")
    assert (resolved["event"], resolved["state"], resolved["reason"]) == ("gpu_degraded", "resolved", "recovered")
    assert (resolved["uuid"], resolved["ts"]) == (H200_UUID, 300)


def test_lost_gpu_is_never_resolved_by_another_gpu_reading_fine(box):
    """GPU 1 is lost; then the indices move (the lost line at index 0, GPU 0
    now at index 1): GPU 0 reading fine resolves nothing and takes no fault;
    GPU 1 reading fine again resolves its own incident."""
    a, b = uuid_for(0), uuid_for(1)

    def sample(*lines):
        return {"fault": "garbage", "text": "".join(lines)}
    both = sample(line(100, power="650.00", uuid=a), line(100, power="650.00", uuid=b, index=1))
    b_lost = sample(line(100, power="650.00", uuid=a), LOST % 1)
    moved = sample(LOST % 0, line(100, power="650.00", uuid=a, index=1))
    box.write_scenario([both] + [b_lost] * 3 + [moved] * 2 + [both], gpus=2)
    for t in range(6):
        box.once(now=t, env={"SMI_FAIL_ALERT_CYCLES": "3"})
    assert [(e["event"], e["state"], e["uuid"]) for e in box.events()] == [("gpu_degraded", "firing", b)]
    box.once(now=6, env={"SMI_FAIL_ALERT_CYCLES": "3"})
    assert [(e["event"], e["state"], e["uuid"], e["reason"]) for e in box.events()] == \
        [("gpu_degraded", "firing", b, "fault"), ("gpu_degraded", "resolved", b, "recovered")]


@pytest.mark.parametrize("fault,said", [("out_of_range", "utilization.gpu 250 (expected 0-100), memory.used 148771"),
                                         ("negative", "utilization.gpu -1 (expected 0-100)"),
                                         ("huge", "utilization.gpu 18446744073709551615 (expected 0-100)")])
def test_values_out_of_range_are_a_failed_reading_then_one_monitor_degraded(box, fault, said):
    """A GPU line with utilization 250 %, more memory used than the GPU has,
    -1 or 2^64-1: the GPU is not judged (no idle count, nothing resolved),
    the log says what was read (not "[N/A], MIG?"), once, and after
    SMI_FAIL_ALERT_CYCLES one monitor_degraded fires; sane readings resolve
    it (before: one "utilization not available ([N/A], MIG?)" line, no
    event, status "ok")."""
    box.write_scenario([BUSY] + [dict(BUSY, fault=fault)] * 5 + [BUSY])
    logs = ""
    for t in range(5):
        logs += box.once(now=60 * t, env={"SMI_FAIL_ALERT_CYCLES": "3"}).stderr
    (fired,) = box.events()
    assert (fired["event"], fired["state"], fired["failures"]) == ("monitor_degraded", "firing", 3)
    assert said in fired["error"] and "GPU 0 (%s)" % H200_UUID in fired["error"], fired["error"]
    assert logs.count("ERROR") == 1 and said in logs and "MIG" not in logs, logs
    # (status takes the fifth bad sample, the next run the sane one)
    status = box.run("status", cmd="bin/gpuguard", env={"GPUGUARD_NOW": "270"}).stdout
    assert " bad " in status and said in status, status
    box.once(now=300, env={"SMI_FAIL_ALERT_CYCLES": "3"})
    assert kinds(box.events()) == [("monitor_degraded", "firing"), ("monitor_degraded", "resolved")]


def test_nvidia_smis_error_text_reaches_terminal_log_and_events_printable(box, tmp_path):
    """nvidia-smi (or NVIDIA_SMI="ssh node7 nvidia-smi") failing with an
    escape sequence and bytes that are not UTF-8 in its text: status,
    doctor and the watchdog's log line quoted it raw (the terminal's title
    changed, the screen cleared), and the monitor_degraded event in
    events.jsonl and status --json were not valid UTF-8. Now it reads as a
    job name does: \\e and ? for control characters, U+FFFD for bad bytes."""
    smi = tmp_path / "badsmi"
    smi.write_text('#!/bin/sh\nprintf "\\033]0;pwned\\007\\033[2J\\033[31mEVIL \\377\\376GBK\\324\\332 bytes\\n"\nexit 9\n')
    smi.chmod(0o755)
    env = dict(box.env, NVIDIA_SMI=str(smi), SMI_FAIL_ALERT_CYCLES="2")
    said = "nvidia-smi exited 9: \\e]0;pwned?\\e[2J\\e[31mEVIL \ufffd\ufffdGBK\ufffd\ufffd bytes"

    def run(cmd, *args, **extra):
        r = subprocess.run([str(ROOT / cmd)] + list(args), env=dict(env, **extra), capture_output=True,
                           timeout=60, check=False)
        # strict: bytes that are not UTF-8 fail here
        return r.returncode, r.stdout.decode("utf-8") + r.stderr.decode("utf-8")

    logs = "".join(run("bin/yichuidingyin.sh", "--once", GPUGUARD_NOW=str(60 * t))[1] for t in range(2))
    (fired,) = [json.loads(ln) for ln in (box.state / "events.jsonl").read_bytes().decode("utf-8").splitlines()]
    assert fired["event"] == "monitor_degraded" and said in fired["error"], fired
    rc, status = run("bin/gpuguard", "status")
    rc_json, doc = run("bin/gpuguard", "status", "--json")
    rc_doctor, doctor = run("bin/gpuguard", "doctor")
    assert (rc, rc_json, rc_doctor) == (1, 1, 1)
    assert said in json.loads(doc)["error"]
    for out in (logs, status, doctor):
        assert said in out and "\x1b" not in out and "\x07" not in out, out


@pytest.mark.parametrize("locale", [{"LANG": "C"}, {"LANG": "C.UTF-8", "LC_ALL": "C"}],
                         ids=["LANG=C", "LC_ALL=C over LANG=C.UTF-8"])
def test_nvidia_smis_bad_bytes_are_a_question_mark_on_a_console_that_is_not_utf8(box, tmp_path, locale):
    """nvidia-smi failing with bytes that are not UTF-8: each became a
    U+FFFD, which status, doctor, status --watch and the watchdog's log
    printed as UTF-8 under LANG=C too (three bytes of mojibake each on
    such a console, and cron's mail). There each is now a "?", as the
    status table shows a job name; status --json and the monitor_degraded
    event (the chat text) keep U+FFFD."""
    smi = tmp_path / "badsmi"
    smi.write_text('#!/bin/sh\nprintf "EVIL \\377\\376GBK\\324\\332 bytes\\n"\nexit 9\n')
    smi.chmod(0o755)
    env = dict(box.env, NVIDIA_SMI=str(smi), SMI_FAIL_ALERT_CYCLES="2", **locale)
    said, said_utf8 = "nvidia-smi exited 9: EVIL ??GBK?? bytes", "nvidia-smi exited 9: EVIL \ufffd\ufffdGBK\ufffd\ufffd bytes"

    def run(*words, **extra):
        r = subprocess.run(list(words), env=dict(env, **extra), capture_output=True, timeout=60, check=False)
        return r.returncode, r.stdout + r.stderr

    gpuguard = str(ROOT / "bin/gpuguard")
    logs = b"".join(run(str(ROOT / "bin/yichuidingyin.sh"), "--once", GPUGUARD_NOW=str(60 * t))[1] for t in range(2))
    rc, status = run(gpuguard, "status")
    rc_doctor, doctor = run(gpuguard, "doctor")
    # a frame or two of --watch, then Ctrl-C
    _, watch = run("timeout", "-s", "INT", "1", gpuguard, "status", "--watch", "--interval", "0.3")
    assert (rc, rc_doctor) == (1, 1)
    for out in (status, doctor, watch, logs):
        assert out.isascii() and said in out.decode(), out
    _, doc = run(gpuguard, "status", "--json")
    (fired,) = [json.loads(ln) for ln in (box.state / "events.jsonl").read_bytes().decode("utf-8").splitlines()]
    assert said_utf8 in json.loads(doc)["error"] and said_utf8 in fired["error"]


def test_status_says_fault_for_a_gpu_that_requires_reset_while_its_alert_is_open(box):
    """A GPU printing [GPU requires reset]: the watchdog pages gpu_degraded,
    and status says FAULT with the fault's text, in the table and in
    --json (before: STATE "ok", no fault key)."""
    box.write_scenario([dict(faulted(), apps=[app(1410, mem=20000)])] * 6)
    for t in range(4):
        box.once(now=60 * t, env={"SMI_FAIL_ALERT_CYCLES": "3"})
    assert ("gpu_degraded", "firing") in kinds(box.events())
    status = box.run("status", cmd="bin/gpuguard", env={"GPUGUARD_NOW": "240"})
    (row,) = [ln for ln in status.stdout.splitlines() if ln.split()[:1] == ["0"]]
    assert "FAULT" in row.split() and " ok " not in row, status.stdout
    assert "fault: GPU requires reset (gpu_degraded alert open)" in status.stdout, status.stdout
    doc = json.loads(box.run("status", "--json", cmd="bin/gpuguard", env={"GPUGUARD_NOW": "300"}).stdout)
    (gpu,) = doc["gpus"]
    assert (gpu["state"], gpu["fault"], gpu["degraded_firing"]) == ("FAULT", "GPU requires reset", True)


def test_status_json_fault_is_null_on_a_sound_gpu(box):
    box.write_scenario([BUSY])
    (gpu,) = json.loads(box.run("status", "--json", cmd="bin/gpuguard").stdout)["gpus"]
    assert (gpu["state"], gpu["fault"], gpu["degraded_firing"]) == ("ok", None, False)


def test_pending_events_of_a_killed_run_are_enqueued_once(box):
    """A run killed after it saved the incident but before it enqueued its
    event: the next run enqueues it; one killed after enqueueing it too:
    not again."""
    box.write_scenario([IDLE] * 10)
    for t in range(3):
        box.once(now=t)
    (fired,) = box.events()
    state = (box.state / "idle.state").read_text()
    # as if killed between the two writes: the event in the state only
    (box.state / "events.jsonl").write_text("")
    (box.state / "idle.state").write_text(state + "pending %s %s\n" % (fired["id"], json.dumps(fired)))
    box.once(now=3)
    assert [e["id"] for e in box.events()] == [fired["id"]]
    # as if killed after enqueueing: events.jsonl already holds it
    (box.state / "idle.state").write_text(state + "pending %s %s\n" % (fired["id"], json.dumps(fired)))
    box.once(now=4)
    assert [e["id"] for e in box.events()] == [fired["id"]]
    assert "pending" not in (box.state / "idle.state").read_text()


def lock_free(path):
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


def test_kill_9_at_random_points_never_loses_nor_repeats_an_incident(box):
    """--once runs killed at random moments over a job that idles and gets
    busy again and again; then clean runs. Incidents alternate firing,
    resolved: none is sent twice, none left open."""
    pattern = [IDLE] * 4 + [BUSY] * 2
    box.write_scenario(pattern)
    env = dict(box.env, FAKE_SMI_LOOP="1", GPUGUARD_LOG_LEVEL="error")
    rng = random.Random(7)
    kills = 0
    for i in range(100):
        env["GPUGUARD_NOW"] = str(1000 + i)
        killed, _ = run_killed_after([str(ROOT / "bin/yichuidingyin.sh"), "--once"], env, rng.uniform(0.0, 0.25))
        kills += killed
    # a killed run's children (nvidia-smi) may hold the lock a moment longer
    assert wait_for(lambda: lock_free(box.state / "yichuidingyin.lock"))
    for i in range(12):
        env["GPUGUARD_NOW"] = str(2000 + i)
        r = subprocess.run([str(ROOT / "bin/yichuidingyin.sh"), "--once"], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    states = [e["state"] for e in box.events() if e["event"] == "gpu_idle"]
    assert kills > 10
    assert states, "no incident at all"
    assert all(a != b for a, b in zip(states, states[1:])), states
    ids = [e["id"] for e in box.events()]
    assert len(ids) == len(set(ids))


def test_kill_9_while_the_alert_is_being_sent_does_not_fire_it_twice(box):
    """The receiver hangs while the firing alert goes out; the watchdog is
    killed (-9, with its children) in that moment; the next run does not
    fire the same incident again."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)                       # accepts connections, never answers
    url = "http://127.0.0.1:%d/generic" % silent.getsockname()[1]
    try:
        box.write_scenario([IDLE] * 6)
        for t in range(2):
            box.once(now=t, env={"NOTIFY_URL": url})
        env = dict(box.env, NOTIFY_URL=url, NOTIFY_TIMEOUT="30", GPUGUARD_NOW="2")
        p = subprocess.Popen([str(ROOT / "bin/yichuidingyin.sh"), "--once"], env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        fired = wait_for(lambda: any(e["state"] == "firing" for e in box.events()))
        time.sleep(0.5)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        assert fired
    finally:
        silent.close()
    assert wait_for(lambda: lock_free(box.state / "yichuidingyin.lock"))
    for t in range(3, 5):
        box.once(now=t)
    assert kinds(box.events()) == [("gpu_idle", "firing")]
