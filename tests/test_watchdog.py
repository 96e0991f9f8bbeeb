"""The idle watchdog as its users run it: `yichuidingyin.sh &` or from cron
with --once, against the nvidia-smi test double."""
import json
import os
import shutil
import signal
import subprocess
import time

import pytest
from conftest import (
    H200_UUID,
    ROOT,
    app,
    busy_gpu,
    default_signals,
    idle_gpu,
    start_daemon,
    stop_daemon,
    uuid_for,
    wait_for,
)

IDLE = {"gpus": [idle_gpu()], "apps": [app(1410)]}
BUSY = {"gpus": [busy_gpu()], "apps": [app(1410), app(1408, mem=2910)]}
GONE = {"gpus": [idle_gpu(mem=0)], "apps": []}


def states(events, kind="gpu_idle"):
    return [(e["gpu"], e["state"]) for e in events if e["event"] == kind]


def test_fires_once_after_max_idle_cycles_then_resolves_when_busy(box):
    box.write_scenario([IDLE] * 5 + [BUSY])
    for cycle in range(1, 6):
        box.once(now=1000 + 60 * cycle)
        expected = [] if cycle < 3 else [(0, "firing")]
        assert states(box.events()) == expected, "after cycle %d" % cycle
    box.once(now=1000 + 60 * 6)
    assert states(box.events()) == [(0, "firing"), (0, "resolved")]
    firing, resolved = box.events()
    assert firing["utilization"] == 0 and firing["idle_cycles"] == 3
    assert firing["idle_seconds"] == 120
    assert firing["processes"] == [{"pid": 1410, "name": "python3", "used_memory_mib": 2556}]
    assert firing["uuid"] == H200_UUID and firing["host"]
    assert resolved["reason"] == "busy" and resolved["utilization"] == 100
    assert resolved["idle_seconds"] == 300


def test_resolved_when_processes_exit(box):
    box.write_scenario([IDLE] * 3 + [GONE])
    for cycle in range(4):
        box.once(now=100 + cycle)
    assert states(box.events()) == [(0, "firing"), (0, "resolved")]
    assert box.events()[-1]["reason"] == "released"


def test_another_job_taking_the_gpu_counts_afresh(box):
    """Job A idles two cycles and ends; job B takes the GPU before the next
    cycle (cron every minute). B's first idle sample fired at once ("idle
    for 3 cycles", naming B) before the count was tied to one job."""
    job_b = {"gpus": [idle_gpu()], "apps": [app(2222)]}
    box.write_scenario([IDLE, IDLE] + [job_b] * 3)
    for cycle in range(4):
        box.once(now=1000 + 60 * cycle)
    assert box.events() == []
    box.once(now=1000 + 60 * 4)
    (firing,) = box.events()
    assert firing["state"] == "firing" and [p["pid"] for p in firing["processes"]] == [2222]
    assert firing["idle_seconds"] == 120


def test_an_open_incident_resolves_when_its_job_leaves_and_the_next_job_counts_afresh(box):
    job_b = {"gpus": [idle_gpu()], "apps": [app(2222)]}
    box.write_scenario([IDLE] * 3 + [job_b] * 3)
    for cycle in range(5):
        box.once(now=1000 + 60 * cycle)
    assert states(box.events()) == [(0, "firing"), (0, "resolved")]
    resolved = box.events()[1]
    assert resolved["reason"] == "released" and resolved["incident_job_pid"] == 1410
    box.once(now=1000 + 60 * 5)
    assert states(box.events()) == [(0, "firing"), (0, "resolved"), (0, "firing")]
    assert [p["pid"] for p in box.events()[2]["processes"]] == [2222]


def test_a_day_without_samples_starts_the_count_again(box):
    """The watchdog (or its cron line) was stopped for a day: the first
    idle sample after it fired with "idle 24 h" and a day's cost."""
    box.write_scenario([IDLE] * 6)
    box.once(now=10_000)
    box.once(now=10_060)
    r = box.once(now=10_000 + 86_400, env={"GPU_HOUR_PRICE": "30"})
    assert box.events() == []
    # (a cron line slower than CHECK_INTERVAL would reset every count: said)
    assert "no good sample for 1439 min (more than 5 cycles of CHECK_INTERVAL=1s): idle counts start again" \
        in r.stderr
    box.once(now=10_060 + 86_400)
    box.once(now=10_120 + 86_400, env={"GPU_HOUR_PRICE": "30"})
    (firing,) = box.events()
    assert firing["idle_seconds"] == 120 and firing["cost"] == 1


def test_an_incident_goes_on_across_a_gap_while_its_job_holds_the_gpu(box):
    box.write_scenario([IDLE] * 5)
    for t in (0, 60, 120):
        box.once(now=10_000 + t)
    r = box.once(now=10_000 + 7200)
    assert "start again" not in r.stderr
    # the incident's reminder, not a new incident or a resolution, and
    # the two hours nobody watched are not counted as idle (it said 7200 s)
    assert states(box.events()) == [(0, "firing"), (0, "reminder")]
    # (the watched two minutes, to the minute the state keeps the last
    # good sample at)
    assert 60 <= box.events()[1]["idle_seconds"] <= 180


def test_reminder_every_repeat_interval_and_not_more(box):
    box.write_scenario([IDLE] * 20)
    times = [0, 60, 120, 180, 240, 3719, 3720, 3780, 7320]
    for t in times:
        box.once(now=10_000 + t, env={"REPEAT_INTERVAL": "3600"})
    got = [(e["state"], e["ts"] - 10_000) for e in box.events()]
    assert got == [("firing", 120), ("reminder", 3720), ("reminder", 7320)]


def test_reminders_off_with_zero_interval(box):
    box.write_scenario([IDLE] * 10)
    # a cycle every 10 minutes (a longer pause starts the count again)
    for t in range(8):
        box.once(now=t * 600, env={"REPEAT_INTERVAL": "0"})
    assert [e["state"] for e in box.events()] == ["firing"]


def test_busy_blip_resets_the_count(box):
    box.write_scenario([IDLE, IDLE, BUSY, IDLE, IDLE, BUSY])
    for t in range(6):
        box.once(now=t)
    assert box.events() == []


def test_threshold_is_strict_and_configurable(box):
    at_threshold = {"gpus": [idle_gpu(util=10)], "apps": [app(1)]}
    box.write_scenario([at_threshold] * 4)
    for t in range(4):
        box.once(now=t)
    assert box.events() == []
    for t in range(4, 8):
        box.once(now=t, env={"THRESHOLD": "11"})
    assert states(box.events()) == [(0, "firing")]


def test_daemon_makes_two_smi_calls_per_cycle_and_stops_cleanly(box):
    """With SMI_STREAM=0 (tests/test_smi_stream.py has the loops)."""
    box.write_scenario([IDLE] * 50)
    proc = start_daemon(box, env={"SMI_STREAM": "0"})
    assert wait_for(lambda: len(box.smi_calls()) >= 6)
    rc, _, err = stop_daemon(proc)
    assert rc == 0, err
    calls = box.smi_calls()
    assert len(calls) % 2 == 0
    assert all(c.startswith("--query-gpu=") for c in calls[0::2])
    assert all(c.startswith("--query-compute-apps=") for c in calls[1::2])
    assert "stopped; state saved" in err
    state = (box.state / "idle.state").read_text()
    assert H200_UUID in state


def _history_rows(box):
    """The watchdog's cycles so far: one row of gpu-history.tsv each."""
    rows = box.state / "gpu-history.tsv"
    return len(rows.read_text().splitlines()) if rows.exists() else 0


def test_a_term_to_the_whole_process_group_stops_the_daemon_cleanly(box):
    """systemctl stop (the shipped unit sets no KillMode) and `kill --
    -PGID` send SIGTERM to the daemon and its children at once: the sleep
    between cycles died of it first, the handler's kill of that sleep
    failed, and errexit ended the daemon with status 1 before it saved its
    state and the ledger (6 stops of 8)."""
    box.write_scenario([IDLE] * 400)
    env = dict(box.env, CHECK_INTERVAL="1")
    for n in range(5):
        proc = subprocess.Popen([str(ROOT / "bin/yichuidingyin.sh")], env=env, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, preexec_fn=default_signals, start_new_session=True)
        # a few cycles in (one a second), with the sleep between them hit
        # at other moments each time
        want = _history_rows(box) + n % 3 + 2
        assert wait_for(lambda want=want: _history_rows(box) >= want, timeout=30), proc.stderr
        time.sleep(0.1 * n)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and "stopped; state saved" in err and "SIGTERM" in err, err


def test_a_state_folder_removed_under_the_daemon_is_made_again_and_the_incident_goes_on(box):
    """Someone removes the state folder (by hand, a /tmp cleaner) while the
    watchdog runs: every write failed as if the disk were full, an event
    printed a raw bash error, the firing alert's resolution went nowhere
    and the stop line said "state saved" over an empty folder."""
    box.write_scenario([IDLE] * 8 + [BUSY])
    proc = start_daemon(box, env={"SMI_STREAM": "0"})
    try:
        assert wait_for(lambda: states(box.events()) == [(0, "firing")], timeout=30)
        shutil.rmtree(box.state)
        # the GPU gets busy after the removal: the resolution lands in the
        # folder made again, and no second "firing" comes
        assert wait_for(lambda: states(box.events()) == [(0, "resolved")], timeout=30)
        assert oct(box.state.stat().st_mode & 0o777) == "0o700"
        second = box.run("--once")
        assert second.returncode == 1 and "another instance" in second.stderr, second.stderr
    finally:
        rc, _, err = stop_daemon(proc)
    assert rc == 0, err
    assert "was removed while running: making it again" in err
    assert "disk full" not in err and "No such file" not in err, err
    assert "stopped; state saved" in err
    assert H200_UUID in (box.state / "idle.state").read_text()


def test_restart_keeps_counting(box):
    """Two idle cycles in a daemon, SIGTERM, then a cron-style --once:
    the third idle cycle fires."""
    box.write_scenario([IDLE] * 10)
    proc = start_daemon(box, env={"CHECK_INTERVAL": "3600", "MAX_IDLE_CYCLES": "2"})
    assert wait_for(lambda: len(box.smi_calls()) >= 2)
    time.sleep(0.2)
    rc, _, _ = stop_daemon(proc)
    assert rc == 0 and box.events() == []
    box.once(env={"MAX_IDLE_CYCLES": "2"})
    assert states(box.events()) == [(0, "firing")]


def test_sigint_also_stops_cleanly(box):
    box.write_scenario([IDLE] * 10)
    proc = start_daemon(box, env={"CHECK_INTERVAL": "3600"})
    assert wait_for(lambda: len(box.smi_calls()) >= 2)
    rc, _, err = stop_daemon(proc, sig=signal.SIGINT)
    assert rc == 0, err


def test_second_instance_refused(box):
    box.write_scenario([IDLE] * 10)
    proc = start_daemon(box, env={"CHECK_INTERVAL": "3600"})
    try:
        assert wait_for(lambda: len(box.smi_calls()) >= 2)
        r = box.run("--once")
        assert r.returncode == 1
        assert "another instance" in r.stderr and str(proc.pid) in r.stderr
    finally:
        stop_daemon(proc)


@pytest.mark.parametrize("ngpus", [8, 64])
def test_many_gpus_two_calls_only_held_idle_gpus_fire(box, ngpus):
    held_idle = {1, 5, ngpus - 1}
    busy = {0, 2}

    def step():
        gpus, apps = [], []
        for i in range(ngpus):
            if i in busy:
                gpus.append(busy_gpu())
                apps.append(app(20000 + i, gpu=i))
            elif i in held_idle:
                gpus.append(idle_gpu())
                apps.append(app(10000 + i, gpu=i))
            else:
                gpus.append(idle_gpu(mem=0))      # idle and free: fine
        return {"gpus": gpus, "apps": apps}

    box.write_scenario([step()] * 4, gpus=ngpus)
    for t in range(3):
        box.once(now=t)
    assert len(box.smi_calls()) == 6
    fired = sorted(e["gpu"] for e in box.events())
    assert fired == sorted(held_idle)
    by_gpu = {e["gpu"]: e for e in box.events()}
    assert by_gpu[5]["processes"][0]["pid"] == 10005
    assert by_gpu[5]["uuid"] == uuid_for(5)


def test_hidden_processes_with_memory_held_count_as_occupied(box):
    """In a container the process list is often empty while memory is held."""
    hidden = {"gpus": [idle_gpu(mem=30000)], "apps": []}
    small = {"gpus": [idle_gpu(mem=600)], "apps": []}
    box.write_scenario([small] * 3 + [hidden] * 3)
    for t in range(3):
        box.once(now=t)
    assert box.events() == []
    for t in range(3, 6):
        box.once(now=t)
    (event,) = box.events()
    assert event["state"] == "firing" and event["processes"] == []
    assert event["memory_used_mib"] == 30000


def test_unreadable_process_list_is_a_degraded_monitor_not_an_idle_gpu(box):
    """A process list that cannot be read says nothing about who holds the
    GPU: no idle count, and after SMI_FAIL_ALERT_CYCLES one monitor alert."""
    step = {"gpus": [idle_gpu(mem=30000)], "apps": [app(1)], "fault_apps": "garbage"}
    box.write_scenario([step] * 6)
    for t in range(6):
        box.once(now=t, env={"SMI_FAIL_ALERT_CYCLES": "3"})
    assert [(e["event"], e["state"]) for e in box.events()] == [("monitor_degraded", "firing")]
    assert "process list" in box.events()[0]["error"]


def test_mig_utilization_not_available_never_fires(box):
    mig = {"gpus": [{"utilization.gpu": "[N/A]", "memory.used": 9000, "power.draw": "[N/A]"}],
           "apps": [app(7)]}
    box.write_scenario([mig] * 6)
    logs = ""
    for t in range(6):
        logs += box.once(now=t).stderr
    assert box.events() == []
    assert logs.count("utilization not available") == 1


def test_spinning_nccl_hang_is_caught_by_default(box):
    """100 % utilization at the idle floor (90 W of 700 W): stuck, after
    SPIN_CYCLES; the H200 patterns are in test_idle_spin.py."""
    spinning = {"gpus": [idle_gpu(util=100, power=90.0)], "apps": [app(3)]}
    box.write_scenario([spinning] * 6)
    for t in range(4):
        box.once(now=t)
    assert box.events() == []
    box.once(now=4)
    (event,) = box.events()
    assert event["event"] == "gpu_stuck" and event["reason"] == "spinning"
    assert event["utilization"] == 100 and event["gpu"] == 0


@pytest.mark.parametrize("fault", ["driver", "no_devices", "mismatch", "gpu_lost",
                                   "garbage", "unknown"])
def test_failing_nvidia_smi_never_alerts_idle_and_keeps_counters(box, fault):
    box.write_scenario([IDLE, IDLE] + [{"fault": fault}] * 7 + [IDLE, BUSY])
    logs = ""
    for t in range(9):
        r = box.once(now=t, env={"SMI_FAIL_ALERT_CYCLES": "5"})
        logs += r.stderr
    assert states(box.events()) == []
    assert [e["state"] for e in box.events() if e["event"] == "monitor_degraded"] == ["firing"]
    degraded = box.events()[0]
    assert degraded["failures"] == 5 and degraded["error"]
    # logged once per streak, not every cycle
    assert logs.count("ERROR") == 1
    # counters were kept: the third idle cycle (after the failures) fires
    logs = box.once(now=9).stderr
    assert "answers again after 7 failed cycles" in logs
    assert [(e["event"], e["state"]) for e in box.events()][1:] == [
        ("monitor_degraded", "resolved"), ("gpu_idle", "firing")]


def test_hanging_nvidia_smi_is_cut_by_the_timeout(box):
    box.write_scenario([{"fault": "hang", "seconds": 30}])
    start = time.time()
    r = box.once(env={"SMI_TIMEOUT": "1"})
    # cut long before the 30 s hang ends (a loose bound: a loaded machine
    # may take seconds to start the cycle)
    assert time.time() - start < 25
    assert "timed out after 1s" in r.stderr
    assert box.events() == []


def test_missing_nvidia_smi_is_reported_not_fatal(box):
    box.write_scenario([IDLE])
    r = box.once(env={"NVIDIA_SMI": "/nonexistent/nvidia-smi"})
    assert "not found" in r.stderr


def test_remote_nvidia_smi_command_with_arguments(box, tmp_path):
    """NVIDIA_SMI may be a command line such as `ssh node7 nvidia-smi`."""
    fake_ssh = tmp_path / "ssh"
    fake_ssh.write_text('#!/bin/sh\necho "$1" >> "%s"\nshift\nexec "$@"\n' % (tmp_path / "ssh.log"))
    fake_ssh.chmod(0o755)
    box.write_scenario([IDLE] * 3)
    for t in range(3):
        box.once(now=t, env={"NVIDIA_SMI": "%s node7 nvidia-smi" % fake_ssh})
    assert states(box.events()) == [(0, "firing")]
    assert (tmp_path / "ssh.log").read_text().split() == ["node7"] * 6


def test_event_json_survives_hostile_process_names(box):
    name = 'evil "name" \\ with\ttab @all <at user_id="all">'
    step = {"gpus": [idle_gpu()], "apps": [app(42, name=name)]}
    box.write_scenario([step] * 3)
    for t in range(3):
        box.once(now=t)
    (event,) = box.events()
    assert event["processes"][0]["name"] == name.replace("\t", " ")


def test_comma_in_process_name(box):
    step = {"gpus": [idle_gpu()], "apps": [app(42, name="py,comma")]}
    box.write_scenario([step] * 3)
    for t in range(3):
        box.once(now=t)
    assert box.events()[0]["processes"][0]["name"] == "py?comma"


def test_corrupt_state_file_is_survived(box):
    box.write_scenario([IDLE] * 4)
    box.state.mkdir(parents=True)
    # a word where a number goes, garbage, and a line cut after its sixth
    # field (a crash mid-write: the cut line killed every cron run with
    # "f[6]: unbound variable" until someone deleted the file)
    (box.state / "idle.state").write_text("gpu %s banana 1 2 3 4\n\x00garbage\ngpu %s 5 1796620311 1 179662031\n"
                                          % (H200_UUID, H200_UUID))
    first = box.once(now=0)
    assert first.returncode == 0 and "unbound" not in first.stderr, first.stderr
    assert first.stderr.count("ignoring corrupt line") == 3
    status = box.run("status", cmd="bin/gpuguard")
    assert status.returncode == 0 and "unbound" not in status.stderr, status.stderr
    for t in range(1, 3):
        box.once(now=t)
    assert states(box.events()) == [(0, "firing")]


def test_an_event_after_a_cut_last_line_of_events_jsonl_stands_on_its_own_line(box):
    """A crash or a full disk cut the file's last line: the next event was
    glued to the fragment, and `gpuguard report` and `notify --preview`
    lost it with it."""
    box.write_scenario([IDLE] * 3)
    box.state.mkdir(parents=True)
    (box.state / "events.jsonl").write_text('{"id": "x", "ts": 17966')
    for t in range(3):
        box.once(now=t)
    lines = (box.state / "events.jsonl").read_text().splitlines()
    assert lines[0] == '{"id": "x", "ts": 17966'
    assert json.loads(lines[1])["state"] == "firing" and len(lines) == 2


def test_posts_event_to_generic_webhook(box, sink):
    box.write_scenario([IDLE] * 3 + [BUSY])
    for t in range(4):
        box.once(now=t, env={"NOTIFY_URL": sink.url + "/generic"})
    bodies = [r["body"] for r in sink.requests]
    # one digest a cycle; a generic webhook gets the events themselves
    assert [(e["event"], e["state"]) for b in bodies for e in b["events"]] == [
        ("gpu_idle", "firing"), ("gpu_idle", "resolved")]
    assert bodies[0]["events"][0]["processes"][0]["pid"] == 1410
    assert "idle but occupied" in bodies[0]["message"]
    assert not os.listdir(box.state / "outbox")
