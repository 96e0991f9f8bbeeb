"""The daemons' resident nvidia-smi loops (issue 29): a watchdog daemon at
CHECK_INTERVAL=1 reads `nvidia-smi ... -lms 1000` as it prints instead of
starting nvidia-smi twice a cycle, and a loop that stalls, ends, prints
garbage or loses a GPU is replaced by one-shot calls until it is restarted,
without a false alert. Cycles are counted from gpu-history.tsv (one row per
GPU per cycle); nothing here asserts a duration."""
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import H200_UUID, ROOT, app, busy_gpu, default_signals, idle_gpu, start_daemon, stop_daemon, wait_for

pytestmark = pytest.mark.slow

IDLE = {"gpus": [idle_gpu()], "apps": [app(1410)]}
BUSY = {"gpus": [busy_gpu()], "apps": [app(1410), app(1408, mem=2910)]}
# two GPUs: 0 held and idle, 1 held and busy
PAIR = {"gpus": [idle_gpu(), busy_gpu()], "apps": [app(1410, gpu=0), app(1411, gpu=1, mem=11000)]}


def history(box, gpu=0):
    """(unix time, idle flag, holders) of each cycle for one GPU."""
    path = box.state / "gpu-history.tsv"
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            f = line.split("\t")
            if len(f) >= 9 and f[1] == str(gpu):
                rows.append((int(f[0]), int(f[7] or 0), f[8]))
    return rows


def loop_calls(box):
    return [c for c in box.smi_calls() if "-lms" in c]


def one_shot_calls(box):
    return [c for c in box.smi_calls() if "-lms" not in c]


def loops_of(marker):
    """PIDs of the double's loops whose environment holds marker (this
    test's FAKE_SMI_STATE path)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            env = (d / "environ").read_bytes()
        except OSError:
            continue
        argv = cmd.split(b"\0")
        # the double itself (python3 .../nvidia-smi), not its sh wrapper
        if len(argv) > 1 and argv[1].endswith(b"/nvidia-smi") and b"-lms" in argv and marker.encode() in env:
            pids.append(int(d.name))
    return pids


def run_daemon(box, cycles, env=None, gpu=0):
    """Starts the watchdog, lets it run `cycles` cycles, stops it (SIGTERM)."""
    proc = start_daemon(box, env=env)
    try:
        assert wait_for(lambda: len(history(box, gpu)) >= cycles, timeout=60 + 2 * cycles), \
            (history(box, gpu), proc.poll())
    finally:
        rc, _, err = stop_daemon(proc)
    assert rc == 0, err
    return err


def no_loops_left(box):
    """The loops end with the daemon (SIGKILL to their groups: a moment
    later on a loaded machine)."""
    return wait_for(lambda: loops_of(box.env["FAKE_SMI_STATE"]) == [], timeout=10)


def events(box, kind=None):
    return [e for e in box.events() if kind is None or e["event"] == kind]


def test_daemon_reads_two_loops_instead_of_two_calls_a_cycle(box):
    box.write_scenario([IDLE] * 100)
    err = run_daemon(box, 8)
    loops = loop_calls(box)
    assert len(loops) == 2, box.smi_calls()
    assert any(c.startswith("--query-gpu=timestamp,") and c.endswith("-lms 1000") for c in loops)
    assert any(c.startswith("--query-compute-apps=timestamp,") and c.endswith("-lms 1000") for c in loops)
    # the first cycle asks the one-shot way (it tells how many GPUs a
    # sample of the loop must hold); every later one reads the loop (on a
    # loaded machine the loop's first sample may come after the second
    # cycle began, which then asks the one-shot way too: 8 cycles without
    # the loops would make 16 calls)
    assert 2 <= len(one_shot_calls(box)) <= 4, box.smi_calls()
    assert "nvidia-smi loop" not in err, err
    assert [(e["gpu"], e["state"]) for e in events(box, "gpu_idle")] == [(0, "firing")]
    assert no_loops_left(box)


def test_idle_gpu_fires_after_exactly_max_idle_cycles_of_the_loop(box):
    box.write_scenario([BUSY] * 3 + [IDLE] * 100)
    run_daemon(box, 12, env={"MAX_IDLE_CYCLES": "4"})
    flags = [flag for _, flag, _ in history(box)]
    first = next(i for i, flag in enumerate(flags) if flag)
    assert flags[:first] and set(flags[:first]) == {0}
    # counted idle three times, the alert on the fourth idle cycle
    assert flags[first:first + 4] == [1, 1, 1, 2], flags
    (firing,) = events(box, "gpu_idle")
    assert firing["state"] == "firing" and firing["idle_cycles"] == 4
    assert 2 <= len(one_shot_calls(box)) <= 4       # (see above: 24 without the loops)


def test_stalled_loop_gives_way_to_one_shot_calls_and_is_restarted(box):
    # the GPU loop stops printing for 30 s; one-shot calls still answer
    box.write_scenario([IDLE] * 4 + [dict(IDLE, fault="stall", seconds=30)] + [IDLE] * 100)
    err = run_daemon(box, 12, env={"SMI_TIMEOUT": "1", "MAX_IDLE_CYCLES": "3"})
    assert "nvidia-smi loop: no GPU sample for 2s (stalled); one-shot calls until it restarts" in err, err
    assert err.count("(stalled)") == 1, err
    # killed, then started again after the back-off
    assert len(loop_calls(box)) == 4, box.smi_calls()
    assert "sampling from the loop again" in err
    # the stall cost no cycle its sample and raised nothing
    assert all(holders == "1410:2556" for _, _, holders in history(box))
    assert [(e["gpu"], e["state"]) for e in box.events()] == [(0, "firing")]
    assert no_loops_left(box)


@pytest.mark.parametrize("fault", ["garbage", "die", "driver", "partial", "binary", "warning_line"])
def test_loop_fault_mid_stream_never_alerts_nor_resolves(box, fault):
    box.write_scenario([PAIR] * 4 + [dict(PAIR, fault=fault)] + [PAIR] * 100, gpus=2)
    err = run_daemon(box, 12, env={"SMI_TIMEOUT": "1", "MAX_IDLE_CYCLES": "3"})
    assert "nvidia-smi loop:" in err and "one-shot calls until it restarts" in err, err
    assert len(loop_calls(box)) >= 4, box.smi_calls()
    # GPU 0 fired once while warming up; nothing resolved it, GPU 1 never
    # fired, and one faulty sample is no degraded monitor
    assert [(e["gpu"], e["state"]) for e in box.events()] == [(0, "firing")]
    assert all(holders == "1411:11000" for _, _, holders in history(box, gpu=1))


def test_gpu_vanishing_mid_stream_is_not_read_as_released(box):
    box.write_scenario([PAIR] * 4 + [dict(PAIR, fault="missing_gpu")] * 3 + [PAIR] * 100, gpus=2)
    run_daemon(box, 12, env={"MAX_IDLE_CYCLES": "3"})
    assert [(e["gpu"], e["state"]) for e in box.events()] == [(0, "firing")]
    # the samples without GPU 1 were taken the one-shot way (the loop's GPU
    # count no longer matched); the loop itself was never restarted
    assert len(loop_calls(box)) == 2
    assert len(one_shot_calls(box)) > 2


def test_process_loop_stall_is_caught_by_the_one_shot_list(box):
    # the process loop stops printing while GPU 0 is held: the cycle asks
    # the one-shot way, sees the process, restarts the loops; the incident
    # stays open
    box.write_scenario([PAIR] * 4 + [dict(PAIR, fault_apps="stall", seconds=30)] + [PAIR] * 100, gpus=2)
    err = run_daemon(box, 12, env={"MAX_IDLE_CYCLES": "3"})
    assert "the process loop missed" in err, err
    assert [(e["gpu"], e["state"]) for e in box.events()] == [(0, "firing")]
    assert all(holders == "1410:2556" for _, _, holders in history(box))


def test_released_gpu_with_a_silent_process_loop_resolves(box):
    """nvidia-smi prints nothing for an empty process list: silence with the
    GPU's memory back at 0 MiB is "released", at once."""
    gone = {"gpus": [idle_gpu(mem=0)], "apps": []}
    box.write_scenario([IDLE] * 4 + [gone] * 100)
    run_daemon(box, 10, env={"MAX_IDLE_CYCLES": "3"})
    idle = events(box, "gpu_idle")
    assert [e["state"] for e in idle] == ["firing", "resolved"]
    assert idle[-1]["reason"] == "released"
    assert len(loop_calls(box)) == 2 and 2 <= len(one_shot_calls(box)) <= 4


def test_hidden_processes_cost_one_check_then_read_from_the_loop(box):
    """Memory held, no process listed (another PID namespace): one one-shot
    list confirms it, then the loop's silence is trusted while the memory
    stays as it was."""
    hidden = {"gpus": [idle_gpu(mem=5000)], "apps": []}
    box.write_scenario([hidden] * 100)
    run_daemon(box, 10)
    apps_calls = [c for c in one_shot_calls(box) if c.startswith("--query-compute-apps")]
    assert len(apps_calls) == 2, box.smi_calls()
    assert [(e["gpu"], e["state"]) for e in events(box, "gpu_idle")] == [(0, "firing")]


def test_kill_9_of_the_daemon_leaves_no_loop(box):
    box.write_scenario([IDLE] * 200)
    proc = start_daemon(box)
    marker = box.env["FAKE_SMI_STATE"]
    try:
        assert wait_for(lambda: len(loops_of(marker)) == 2, timeout=30)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=15)
        # the loop's wrapper sees the daemon gone (tail --pid, once a
        # second) and ends its process group
        assert wait_for(lambda: loops_of(marker) == [], timeout=15), loops_of(marker)
    finally:
        for pid in loops_of(marker):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stopping_the_daemon_ends_its_loops(box, sig):
    box.write_scenario([IDLE] * 200)
    proc = start_daemon(box)
    marker = box.env["FAKE_SMI_STATE"]
    assert wait_for(lambda: len(loops_of(marker)) == 2, timeout=30)
    rc, _, err = stop_daemon(proc, sig=sig)
    assert rc == 0, err
    assert no_loops_left(box)


def test_sighup_with_a_new_interval_restarts_the_loops(box, tmp_path):
    conf = tmp_path / "gpuguard.conf"
    conf.write_text("CHECK_INTERVAL=1\n")
    env = dict(box.env, GPUGUARD_CONFIG=str(conf))
    env.pop("CHECK_INTERVAL")
    box.write_scenario([IDLE] * 300)
    # (the dispositions of a terminal: a suite run under nohup has SIGHUP
    # ignored, and bash cannot trap a signal ignored on entry)
    proc = subprocess.Popen([str(ROOT / "bin/yichuidingyin.sh")], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_signals)
    marker = env["FAKE_SMI_STATE"]
    try:
        assert wait_for(lambda: sum("-lms 1000" in c for c in box.smi_calls()) == 2, timeout=30)
        conf.write_text("CHECK_INTERVAL=2\n")
        proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: sum("-lms 2000" in c for c in box.smi_calls()) == 2, timeout=30), box.smi_calls()
        assert wait_for(lambda: len(loops_of(marker)) == 2, timeout=15)
    finally:
        rc, _, err = stop_daemon(proc)
    assert rc == 0, err
    assert sum("-lms 1000" in c for c in box.smi_calls()) == 2, "\n".join(box.smi_calls())


def test_a_daemon_started_under_nohup_says_it_cannot_reload(box):
    """nohup starts the daemon with SIGHUP ignored, and bash cannot trap a
    signal ignored on entry: a reload would silently never happen. The
    daemon says so at start, and a SIGHUP neither reloads nor stops it."""
    def under_nohup():
        default_signals()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    box.write_scenario([IDLE] * 300)
    proc = subprocess.Popen([str(ROOT / "bin/yichuidingyin.sh")], env=box.env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=under_nohup)
    try:
        # (the loops start after the traps are set)
        assert wait_for(lambda: sum("-lms " in c for c in box.smi_calls()) == 2, timeout=30)
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.5)
        assert proc.poll() is None
    finally:
        rc, _, err = stop_daemon(proc)
    assert rc == 0, err
    assert "SIGHUP was ignored when this daemon started (nohup?)" in err, err
    assert "SIGHUP: configuration reloaded" not in err, err
    # started the usual way, it says nothing of the kind
    proc = start_daemon(box)
    assert wait_for(lambda: sum("-lms " in c for c in box.smi_calls()) == 4, timeout=30)
    rc, _, err = stop_daemon(proc)
    assert rc == 0 and "SIGHUP was ignored" not in err, err


def test_remote_nvidia_smi_command_runs_the_loops_through_it(box, tmp_path):
    fake_ssh = tmp_path / "ssh"
    fake_ssh.write_text('#!/bin/sh\necho "$1" >> "%s"\nshift\nexec "$@"\n' % (tmp_path / "ssh.log"))
    fake_ssh.chmod(0o755)
    box.write_scenario([IDLE] * 100)
    run_daemon(box, 6, env={"NVIDIA_SMI": "%s node7 nvidia-smi" % fake_ssh})
    # two one-shot calls for the first cycle, then the two loops
    assert (tmp_path / "ssh.log").read_text().split() == ["node7"] * 4
    assert len(loop_calls(box)) == 2
    assert [(e["gpu"], e["state"]) for e in events(box, "gpu_idle")] == [(0, "firing")]


def test_smi_stream_0_keeps_one_shot_calls(box):
    box.write_scenario([IDLE] * 100)
    run_daemon(box, 4, env={"SMI_STREAM": "0"})
    assert loop_calls(box) == []
    assert len(one_shot_calls(box)) >= 8


def test_leak_watcher_daemon_reads_the_loops(box):
    box.write_scenario([{"gpus": [idle_gpu()], "apps": [app(os.getpid(), mem=2556)]}] * 100)
    proc = subprocess.Popen([str(ROOT / "bin/gpu-leak-watch"), "--pid", str(os.getpid()), "--interval", "1"],
                            env=box.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    marker = box.env["FAKE_SMI_STATE"]
    try:
        # (a loop shows in /proc before the double has logged its call: on a
        # loaded machine the daemon was stopped in between, CI run of 1958826)
        assert wait_for(lambda: len(loops_of(marker)) == 2 and len(loop_calls(box)) >= 2, timeout=30), \
            box.smi_calls()
    finally:
        rc, _, err = stop_daemon(proc)
    assert rc == 0, err
    assert len(loop_calls(box)) == 2
    assert no_loops_left(box)


def test_persistent_driver_fault_raises_one_monitor_degraded(box):
    """The loop dies at once each time it is started and the one-shot calls
    fail too: exactly one monitor_degraded (then resolved), no idle event."""
    fault = dict(PAIR, fault="driver")
    box.write_scenario([PAIR] * 4 + [fault] * 6 + [PAIR] * 100, gpus=2)
    run_daemon(box, 14, env={"SMI_FAIL_ALERT_CYCLES": "3", "MAX_IDLE_CYCLES": "3"})
    assert [(e["event"], e["state"]) for e in box.events()] == \
        [("gpu_idle", "firing"), ("monitor_degraded", "firing"), ("monitor_degraded", "resolved")]


# A line as the process loop prints it, and a bash reader that calls
# lib/smi.sh's smi_stream_wait on the pipe it is given (fd $4), as the
# daemon does: it says "waiting" before each wait, then the wait's status
# and every line it got.
LINE = "2026/12/06 22:38:28.321, 32329, python3, 2556, " + H200_UUID
READER = r"""
source "$1/lib/common.sh"; source "$1/lib/smi.sh"
for ((i = 0; i < $2; i++)); do
  buf='' rc=0
  echo waiting
  smi_stream_wait "$4" buf $((${EPOCHREALTIME/[.,]/} + $3)) || rc=$?
  printf 'rc %s\n%s' "$rc" "$buf"
  ((rc == 1 || rc == 3)) && break
done
echo done
"""


def frames(*lines):
    """The bytes the loop wrapper (SMI_STREAM_SCRIPT) prints for these lines,
    whatever its framing."""
    # (the wrapper ends with kill -KILL 0: its status says nothing)
    script = 'source lib/common.sh; source lib/smi.sh; setsid sh -c "$SMI_STREAM_SCRIPT" sh $$ printf "%s\\n" "$@"'
    out = subprocess.run(["bash", "-c", script, "bash"] + list(lines), cwd=ROOT, capture_output=True,
                         env=dict(os.environ, SMI_AWK="awk"), check=False).stdout
    assert out.count(b"\n") == len(lines), out
    return out


def start_reader(read_end, waits, wait_us):
    return subprocess.Popen(["bash", "-c", READER, "bash", str(ROOT), str(waits), str(wait_us), str(read_end)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, pass_fds=(read_end,))


def test_a_byte_that_comes_as_the_deadline_passes_is_kept():
    """bash's `read -t` stores a byte and then looks at the clock: a byte that
    came as the deadline passed is in the variable with the timeout's status.
    The reader is stopped inside its wait, the frame written, the deadline let
    pass, the reader let go: the whole line must come out of the next waits
    (before the fix the byte was dropped and the frame read as broken; in a
    daemon: 'the process loop printed something else than a sample: 026/12/06
    ...', up to ~10 s blocked, the loops restarted)."""
    r, w = os.pipe()
    reader = start_reader(r, 4, 400000)
    os.close(r)
    try:
        assert reader.stdout.readline() == "waiting\n"
        began = time.monotonic()
        time.sleep(0.15)                       # inside the read's wait by now
        os.kill(reader.pid, signal.SIGSTOP)
        os.write(w, frames(LINE))
        time.sleep(max(0.0, began + 0.55 - time.monotonic()))    # past the deadline
        os.kill(reader.pid, signal.SIGCONT)
        time.sleep(0.2)
        os.write(w, frames(LINE))
        time.sleep(0.2)
    finally:
        os.kill(reader.pid, signal.SIGCONT)
        os.close(w)
        out, _ = reader.communicate(timeout=30)
    lines = [x for x in out.splitlines() if x not in ("waiting", "done") and not x.startswith("rc ")]
    statuses = [x for x in out.splitlines() if x.startswith("rc ")]
    assert lines == [LINE, LINE], out
    assert "rc 3" not in statuses, out


def test_a_frame_cut_short_then_silence_returns_by_the_deadline():
    """The stream's first byte lost (as bash's timeout used to drop it), then
    the loop prints nothing more (the job ended: an empty process list prints
    nothing). The rest read as a length ran past what was sent: the reader
    used to wait for bytes that never came, in a read without a timeout
    (the live daemon stalled ~9 s, until ten more samples filled it). It must
    say "broken frame" (status 3, the loops are then restarted) by its
    deadline."""
    r, w = os.pipe()
    reader = start_reader(r, 1, 300000)
    os.close(r)
    try:
        assert reader.stdout.readline() == "waiting\n"
        began = time.monotonic()
        os.write(w, frames(LINE)[1:])
        # the writer stays, silent, for 5 s; the answer is waited for 3 s
        line = reader.stdout.readline() if select.select([reader.stdout], [], [], 3)[0] else "(none in 3 s)"
        took = time.monotonic() - began
    finally:
        time.sleep(max(0.0, began + 5 - time.monotonic()))
        os.close(w)
        reader.communicate(timeout=30)
    assert line == "rc 3\n" and took < 1.5, (line, took)
