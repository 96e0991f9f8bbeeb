"""gpuguard status (once, --json, --watch under tmux), doctor --json and
--version, run as a user types them, against the nvidia-smi double."""
import getpass
import json
import os
import shlex
import shutil
import signal
import subprocess

import pytest
from conftest import H200_UUID, ROOT, app, default_signals, idle_gpu, require, wait_for


def leak_state(box, series):
    """Writes the leak watcher's saved state: {pid: (slope, firing)}."""
    box.state.mkdir(parents=True, exist_ok=True)
    state = {"%d-1000" % pid: {"key": "%d-1000" % pid, "pid": pid, "firing": firing,
                               "last": {"ts": 100, "used": 4000, "slope": slope}}
             for pid, (slope, firing) in series.items()}
    (box.state / "leak-state.json").write_text(json.dumps(state))


def two_jobs(box, steps=1):
    box.write_scenario([{"gpus": [idle_gpu(mem=9000, util=37)],
                         "apps": [app(1410, mem=6000, name="python3"), app(1411, mem=3000, name="torchrun")]}]
                       * steps)


def test_status_lists_a_leaking_and_a_healthy_process_together(box):
    two_jobs(box)
    leak_state(box, {1410: (180.0, True), 1411: (2.0, False)})
    r = box.run("status", cmd="bin/gpuguard")
    assert r.returncode == 0, r.stderr
    rows = {line.split()[1]: line for line in r.stdout.splitlines() if line.split()[:1] == ["pid"]}
    assert "LEAK" in rows["1410"] and "180 MiB/h" in rows["1410"]
    assert "LEAK" not in rows["1411"] and "2 MiB/h" in rows["1411"]


def test_status_json_for_scripts(box):
    two_jobs(box)
    leak_state(box, {1410: (180.0, True), 1411: (2.0, False)})
    r = box.run("status", "--json", cmd="bin/gpuguard")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    gpu = doc["gpus"][0]
    assert gpu["index"] == 0 and gpu["utilization"] == 37 and gpu["memory_used_mib"] == 9000
    assert gpu["memory_total_mib"] == 143771 and gpu["power_w"] == 76.6
    procs = {p["pid"]: p for p in gpu["processes"]}
    assert procs[1410]["leak"] == {"slope_mib_per_hour": 180.0, "firing": True, "verdict": "LEAK",
                                   "recent_memory_mib": []}
    assert procs[1411]["leak"] == {"slope_mib_per_hour": 2.0, "firing": False, "verdict": "healthy",
                                   "recent_memory_mib": []}
    assert procs[1411]["name"] == "torchrun" and procs[1411]["used_memory_mib"] == 3000


def test_a_process_without_a_name_keeps_its_memory_in_status_events_and_metrics(box, tmp_path):
    """nvidia-smi printing an empty process_name: the memory stays the
    memory (before: status "? MiB", the name "20000", used_memory_mib null
    in the alert, no process series)."""
    textdir = tmp_path / "textfile"
    box.write_scenario([{"gpus": [idle_gpu(mem=20500)], "apps": [app(1410, mem=20000, name="")]}] * 5)
    for t in range(4):
        box.once(now=60 * t, env={"GPUGUARD_TEXTFILE_DIR": str(textdir)})
    (fired,) = [e for e in box.events() if e["event"] == "gpu_idle"]
    assert fired["processes"] == [{"pid": 1410, "name": "", "used_memory_mib": 20000}]
    prom = (textdir / "gpuguard_idle.prom").read_text()
    assert 'pid="1410",name=""} %d' % (20000 * 1048576) in prom, prom
    status = box.run("status", cmd="bin/gpuguard").stdout
    (row,) = [ln for ln in status.splitlines() if ln.split()[:2] == ["pid", "1410"]]
    assert row.split()[2:4] == ["20000", "MiB"], status
    (gpu,) = json.loads(box.run("status", "--json", cmd="bin/gpuguard").stdout)["gpus"]
    assert [(p["pid"], p["name"], p["used_memory_mib"]) for p in gpu["processes"]] == [(1410, "", 20000)]


def test_a_pid_listed_twice_on_one_gpu_is_one_row_and_one_series(box, tmp_path):
    """Two compute-app lines of one PID on one GPU (contexts on two MIG
    instances): one metric series with the memory summed (node_exporter
    rejects a file with duplicate series), one status row, one process
    (before: two identical series, the PID listed twice)."""
    textdir = tmp_path / "textfile"
    box.write_scenario([{"gpus": [idle_gpu(mem=50500)],
                         "apps": [app(1410, mem=20000), app(1411, mem=500), app(1410, mem=30000)]}] * 2)
    box.once(now=0, env={"GPUGUARD_TEXTFILE_DIR": str(textdir)})
    prom = (textdir / "gpuguard_idle.prom").read_text()
    series = [ln for ln in prom.splitlines() if ln.startswith("gpuguard_process_gpu_memory_bytes{")]
    assert len(series) == len({ln.rsplit(" ", 1)[0] for ln in series}) == 2, prom
    assert any('pid="1410"' in ln and ln.endswith(" %d" % (50000 * 1048576)) for ln in series), prom
    assert 'gpuguard_gpu_processes{gpu="0",uuid="%s",vendor="nvidia"} 2' % H200_UUID in prom
    status = box.run("status", cmd="bin/gpuguard").stdout
    rows = [ln.split()[:4] for ln in status.splitlines() if ln.split()[:1] == ["pid"]]
    assert rows == [["pid", "1410", "50000", "MiB"], ["pid", "1411", "500", "MiB"]], status


def test_status_json_when_nvidia_smi_fails_is_still_json(box):
    box.write_scenario([{"fault": "driver"}])
    r = box.run("status", "--json", cmd="bin/gpuguard")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["gpus"] == [] and "nvidia-smi" in doc["error"]


def test_status_bad_options_exit_2(box):
    for args in (["--interval", "0"], ["--interval", "x"], ["--interval"], ["--bogus"], ["--json", "--watch"]):
        r = box.run("status", *args, cmd="bin/gpuguard")
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("gpuguard: "), r.stderr


def test_status_watch_without_a_terminal_has_no_colour(box, tmp_path):
    two_jobs(box, steps=3)
    log = tmp_path / "out.txt"
    with open(log, "w") as f:
        p = subprocess.Popen([str(ROOT / "bin/gpuguard"), "status", "--watch", "--interval", "1"],
                             env=box.env, stdout=f, stderr=subprocess.PIPE, text=True, start_new_session=True,
                             preexec_fn=default_signals)
        redrawn = wait_for(lambda: log.read_text().count("gpuguard status") >= 2, timeout=30)
        # Ctrl-C reaches the whole foreground process group, the sleep between
        # frames included
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=10)
    out = log.read_text()
    assert redrawn, out
    assert p.returncode == 0, err
    assert "\x1b" not in out and "pid 1410" in out


def test_doctor_json(box):
    two_jobs(box)
    r = box.run("doctor", "--json", cmd="bin/gpuguard")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] is True and doc["host"]
    levels = {c["level"] for c in doc["checks"]}
    assert levels <= {"OK", "WARN", "FAIL", "INFO"}
    assert any(c["level"] == "OK" and c["message"].startswith("nvidia-smi answers") for c in doc["checks"])
    r = box.run("doctor", "--json", cmd="bin/gpuguard", env={"PATH": "/usr/bin:/bin"})
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["ok"] is False
    assert any(c["level"] == "FAIL" and "not found" in c["message"] for c in doc["checks"])


@pytest.mark.parametrize("fault", [{"fault": "garbage", "text": "<html>502 Bad Gateway</html>\n"},
                                   {"fault": "empty"}, {"fault": "partial"}], ids=["garbage", "nothing", "a cut line"])
def test_doctor_fails_when_nvidia_smi_prints_no_valid_gpu_line(box, fault):
    """nvidia-smi answering garbage, nothing or a cut line: doctor said "OK
    nvidia-smi answers (1 GPUs)", printed the garbage as a GPU row and exited
    0 with "ok": true, while status and every watchdog cycle failed. It now
    fails the check with status's words."""
    box.write_scenario([dict(fault, gpus=[idle_gpu()], apps=[app(1410)])])
    status = box.run("status", cmd="bin/gpuguard")
    assert status.returncode == 1 and status.stderr.startswith("gpuguard status: nvidia-smi printed "), status.stderr
    r = box.run("doctor", cmd="bin/gpuguard")
    assert r.returncode == 1, r.stdout
    assert "FAIL  nvidia-smi: %s\n" % status.stderr.splitlines()[0][len("gpuguard status: "):] in r.stdout, r.stdout
    assert "OK    nvidia-smi" not in r.stdout and "INFO  GPU" not in r.stdout and "502" not in r.stdout, r.stdout
    doc = json.loads(box.run("doctor", "--json", cmd="bin/gpuguard").stdout)
    assert doc["ok"] is False and doc["failures"] >= 1


def test_version_everywhere(box):
    want = "gpuguard %s\n" % (ROOT / "VERSION").read_text().strip()
    for args in (["--version"], ["version"], ["status", "--version"], ["doctor", "--version"]):
        r = box.run(*args, cmd="bin/gpuguard")
        assert (r.returncode, r.stdout) == (0, want), args


# ----------------------------------------------------------------- tmux --

def tmux(sock, *args):
    return subprocess.run(["tmux", "-S", str(sock)] + list(args), capture_output=True, text=True, timeout=10)


def test_status_watch_redraws_in_a_terminal_and_ctrl_c_restores_it(box, tmp_path):
    require(shutil.which("tmux") is not None, "tmux not installed (Debian package tmux)")
    two_jobs(box, steps=1)
    leak_state(box, {1410: (180.0, True), 1411: (2.0, False)})
    (box.state / "history").mkdir(parents=True, exist_ok=True)
    (box.state / "history" / "1410-1000.csv").write_text(
        "timestamp,pid,used_memory_mib\n" + "".join("%d,1410,%d\n" % (t, 5000 + 40 * t) for t in range(24)))
    sock = tmp_path / "tmux.sock"
    env = " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in box.env.items())
    script = tmp_path / "run.sh"
    script.write_text("clear; echo before-watch\nenv -i %s TERM=xterm-256color %s status --watch --interval 0.3\n"
                      "echo \"exit=$?\"\nsleep 60\n" % (env, ROOT / "bin/gpuguard"))
    try:
        r = tmux(sock, "new-session", "-d", "-x", "120", "-y", "30", "bash --norc --noprofile %s" % script)
        assert r.returncode == 0, r.stderr

        def pane(*extra):
            return tmux(sock, "capture-pane", "-p", *extra).stdout

        assert wait_for(lambda: "holders" in pane() or "pid 1410" in pane(), timeout=20), pane()
        screen = pane()
        assert "GPU" in screen and "1410" in screen and "python3" in screen and "LEAK" in screen
        assert any(ch in screen for ch in "▁▂▃▄▅▆▇█")            # sparklines
        assert "before-watch" not in screen                        # alternate screen in use
        assert "\x1b[" in pane("-e")                               # colour on a terminal
        # redrawn: the clock in the title changes
        first = [line for line in screen.splitlines() if "gpuguard status" in line]
        assert first and wait_for(lambda: [line for line in pane().splitlines()
                                          if "gpuguard status" in line] != first, timeout=10)
        tmux(sock, "send-keys", "C-c")
        assert wait_for(lambda: "exit=0" in pane(), timeout=10), pane()
        after = pane()
        assert "before-watch" in after and "pid 1410" not in after   # terminal restored
        assert "\x1b[?25l" not in pane("-e")
    finally:
        tmux(sock, "kill-server")


def test_status_watch_honours_no_color_in_a_terminal(box, tmp_path):
    require(shutil.which("tmux") is not None, "tmux not installed (Debian package tmux)")
    two_jobs(box, steps=1)
    leak_state(box, {1410: (180.0, True)})
    sock = tmp_path / "tmux.sock"
    env = " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in box.env.items())
    script = tmp_path / "run.sh"
    script.write_text("env -i %s NO_COLOR=1 TERM=xterm-256color %s status --watch --interval 0.3\nsleep 60\n"
                      % (env, ROOT / "bin/gpuguard"))
    try:
        assert tmux(sock, "new-session", "-d", "-x", "120", "-y", "30", "bash --norc %s" % script).returncode == 0
        assert wait_for(lambda: "LEAK" in tmux(sock, "capture-pane", "-p").stdout, timeout=20)
        coloured = tmux(sock, "capture-pane", "-p", "-e").stdout
        assert "\x1b[3" not in coloured and "\x1b[1m" not in coloured
    finally:
        tmux(sock, "kill-server")




def test_status_names_the_job_with_its_secrets_masked(box, tmp_path):
    script = tmp_path / "train.py"
    # like a CUDA process, it holds a GPU device file (a stand-in) open
    script.write_text("import os, time\nf = open(os.environ['DEV'])\ntime.sleep(60)\n")
    (tmp_path / "nvidia0").touch()
    box.env["JOBINFO_DEVICE_GLOB"] = str(tmp_path / "nvidia*")
    job = subprocess.Popen(["python3", str(script), "--token=s3cr3t-value", "--lr", "0.1"], start_new_session=True,
                           env=dict(os.environ, DEV=str(tmp_path / "nvidia0")))
    try:
        assert wait_for(lambda: any(os.readlink("/proc/%d/fd/%s" % (job.pid, fd)).endswith("nvidia0")
                                    for fd in os.listdir("/proc/%d/fd" % job.pid)), timeout=10)
        box.write_scenario([{"gpus": [idle_gpu(mem=9000, util=90)], "apps": [app(job.pid, mem=6000)]}])
        r = box.run("status", cmd="bin/gpuguard")
        assert r.returncode == 0, r.stderr
        row = next(line for line in r.stdout.splitlines() if "pid %d" % job.pid in line)
        assert "python3 train.py --token=*** --lr 0.1 (%s)" % getpass.getuser() in row, r.stdout
        assert "s3cr3t" not in r.stdout
        doc = json.loads(box.run("status", "--json", cmd="bin/gpuguard").stdout)
        proc = doc["gpus"][0]["processes"][0]
        assert proc["job"].startswith("python3 train.py ") and proc["job"].endswith(" --token=*** --lr 0.1 (%s)"
                                                                                      % getpass.getuser())
        assert proc["cmdline"].endswith("%s --token=*** --lr 0.1" % script)
    finally:
        job.kill()
        job.wait()


def test_ctrl_c_while_a_frame_is_drawn_still_exits_0(box, tmp_path):
    # the third sample hangs in nvidia-smi: Ctrl-C lands while a frame is
    # being drawn, not in the pause between frames
    box.write_scenario([{"gpus": [idle_gpu()], "apps": [app(1410)]}] * 2 + [{"fault": "hang", "seconds": 30}])
    p = subprocess.Popen([str(ROOT / "bin/gpuguard"), "status", "--watch", "--interval", "0.2"], env=box.env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=default_signals)
    try:
        assert wait_for(lambda: len(box.smi_calls()) >= 5, timeout=30), box.smi_calls()
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=15)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 0, err


def test_status_json_stays_valid_with_a_hand_edited_state_file(box):
    two_jobs(box)
    box.state.mkdir(parents=True, exist_ok=True)
    (box.state / "idle.state").write_text("gpu %s 2 100 0 0 0 0\nhistory %s 5,-,7\n" % (H200_UUID, H200_UUID))
    r = box.run("status", "--json", cmd="bin/gpuguard")
    assert r.returncode == 0, r.stderr
    gpu = json.loads(r.stdout)["gpus"][0]
    assert gpu["recent_utilization"] == [5, 7] and gpu["idle_cycles"] == 2


def test_status_says_when_no_watchdog_keeps_its_counters_in_the_state_folder(box):
    """A user's `gpuguard status` after a root install reads their own state
    folder: it showed "idle 0/3 ok" for a GPU whose idle alert the root
    watchdog had open, with no word that these were not its counters."""
    box.write_scenario([{"gpus": [idle_gpu()], "apps": [app(1410)]}] * 5)
    r = box.run("status", cmd="bin/gpuguard")
    assert r.returncode == 0
    assert r.stderr.startswith("gpuguard status: no watchdog counters in %s: idle and stuck read 0" % box.state)
    doc = json.loads(box.run("status", "--json", cmd="bin/gpuguard").stdout)
    assert doc["no_watchdog_state"].startswith("no watchdog counters in")
    for t in range(3):
        box.once(now=t)
    r = box.run("status", cmd="bin/gpuguard")
    assert r.returncode == 0 and r.stderr == "" and "IDLE" in r.stdout
    assert json.loads(box.run("status", "--json", cmd="bin/gpuguard").stdout)["no_watchdog_state"] is None


def test_status_says_the_process_list_could_not_be_read(box):
    """The GPU query answered and the process list did not: status showed
    a held GPU with no holder and "error": null, as if nobody held it."""
    box.once(now=0)
    box.write_scenario([{"gpus": [idle_gpu()], "apps": [app(1410)], "fault_apps": "garbage"}])
    r = box.run("status", cmd="bin/gpuguard")
    assert r.returncode == 0
    assert "gpuguard status: the process list could not be read" in r.stderr and "unknown" in r.stderr
    doc = json.loads(box.run("status", "--json", cmd="bin/gpuguard").stdout)
    assert doc["processes_error"].startswith("the process list could not be read")


def test_status_refuses_a_relative_state_folder_as_the_watchdog_does(box):
    r = box.run("status", cmd="bin/gpuguard", env={"GPUGUARD_STATE_DIR": "ggstate"})
    assert r.returncode == 2
    assert r.stderr == "gpuguard: GPUGUARD_STATE_DIR must be an absolute path (got 'ggstate')\n"


def test_a_wrapped_job_that_never_held_gpu_memory_is_not_listed_as_ended(box):
    """`gpu-leak-watch -- python3 prep.py` around a CPU-only step: status
    listed "pid N (not named) last seen 0 min ago" for an hour after it."""
    box.write_scenario([{"gpus": [idle_gpu(mem=0)], "apps": []}])
    r = box.run("--interval", "1", "--", "sleep", "2.5", cmd="bin/gpu-leak-watch")
    assert r.returncode == 0, r.stderr
    assert list((box.state / "history").glob("*.csv"))         # it was sampled
    r = box.run("status", cmd="bin/gpuguard")
    assert r.returncode == 0 and "ended in the last hour" not in r.stdout, r.stdout


@pytest.mark.parametrize("locale, utf8", [
    ({"LANG": "C"}, False), ({"LANG": "POSIX"}, False), ({"LANG": ""}, False),
    ({"LANG": "C.UTF-8", "LC_ALL": "C"}, False), ({"LANG": "C.UTF-8"}, True),
    ({"LANG": "C", "LC_CTYPE": "en_US.UTF-8"}, True)],
    ids=["LANG=C", "LANG=POSIX", "no locale", "LC_ALL=C over LANG=C.UTF-8", "LANG=C.UTF-8",
         "LC_CTYPE=en_US.UTF-8 over LANG=C"])
def test_status_draws_in_ascii_where_the_locale_is_not_utf8(box, tmp_path, locale, utf8):
    """On a console set to C or POSIX, status printed its sparklines and the
    ellipsis of a cut job name as UTF-8, which such a console shows as
    mojibake; there it now draws them in ASCII, and under a UTF-8 locale
    as before. The locale is the C library's: LC_ALL, then LC_CTYPE, then
    LANG."""
    now = 1796169600
    script = tmp_path / "train.py"
    script.write_text("import os, time\nf = open(os.environ['DEV'])\ntime.sleep(60)\n")
    (tmp_path / "nvidia0").touch()
    box.env["JOBINFO_DEVICE_GLOB"] = str(tmp_path / "nvidia*")
    job = subprocess.Popen(["python3", str(script), "--run-name", "llama-70b-sft-long-context-experiment-42",
                            "--lr", "0.1"], start_new_session=True, env=dict(os.environ, DEV=str(tmp_path / "nvidia0")))
    try:
        assert wait_for(lambda: any(os.readlink("/proc/%d/fd/%s" % (job.pid, fd)).endswith("nvidia0")
                                    for fd in os.listdir("/proc/%d/fd" % job.pid)), timeout=10)
        box.write_scenario([{"gpus": [idle_gpu(mem=9000, util=37)], "apps": [app(job.pid, mem=6000)]}])
        # the watchdog's recent utilization, the leak watcher's recent memory
        # of the job, and a job that ended 2 minutes ago
        leak_state(box, {job.pid: (2.0, False)})
        (box.state / "idle.state").write_text("gpu %s 2 100 0 0 0 0\nhistory %s 0,14,28,43,57,71,85,100\n"
                                              % (H200_UUID, H200_UUID))
        history = box.state / "history"
        history.mkdir()
        (history / ("%d-1000.csv" % job.pid)).write_text("timestamp,pid,used_memory_mib,gpu_used_mib,gpu_total_mib\n" + "".join(
            "%d,%d,%d,9000,143771\n" % (now - 80 + 10 * i, job.pid, 4000 + 100 * i) for i in range(8)))
        (history / "4242-1000.csv").write_text("timestamp,pid,used_memory_mib,gpu_used_mib,gpu_total_mib\n"
                                               "%d,4242,3000,9000,143771\n" % (now - 120))
        (history / "4242-1000.job.json").write_text(json.dumps({
            "user": "alice", "cmdline": "/opt/venv/bin/python3 /home/alice/eval_checkpoint.py --checkpoint "
                                        "/data/ckpt/llama-70b-step-12000 --batch 8"}))
        r = box.run("status", cmd="bin/gpuguard", env=dict(locale, GPUGUARD_NOW=str(now)))
    finally:
        job.kill()
        job.wait()
    assert r.returncode == 0, r.stderr
    dots, gpu_spark, mem_spark = ("…", "▁▁▂▄▄▅▆█", "▁▂▃▄▅▆▇█") if utf8 else ("...", "__.--=+#", "_.:-=+*#")
    lines = r.stdout.splitlines()
    assert lines[1].startswith("0 ") and lines[1].endswith(" idle?  " + gpu_spark), r.stdout
    assert lines[2].startswith("       pid %-8s %7s MiB  python3 train.py --run-name llama-70b-sft-long-%s (%s)"
                               % (job.pid, 6000, dots, getpass.getuser())), r.stdout
    assert lines[2].endswith("healthy +2 MiB/h " + mem_spark), r.stdout
    assert lines[3:] == ["ended in the last hour",
                         "       pid 4242     python3 eval_checkpoint.py --checkpoint /data/c%s (alice)  "
                         "last seen 2 min ago" % dots], r.stdout
    assert r.stdout.isascii() is not utf8


@pytest.mark.parametrize("lang, shown", [("C", "python3 ??.py --data ???.jsonl"),
                                         ("C.UTF-8", "python3 训练.py --data 数据集.jsonl")])
def test_status_shows_a_chinese_command_line_in_ascii_where_the_locale_is_not_utf8(box, tmp_path, lang, shown):
    """`python3 训练.py --data 数据集.jsonl` on a GPU: under LANG=C status
    printed the command line's UTF-8 bytes, mojibake on such a console
    (the sparklines and the ellipsis were ASCII already); each character
    that is not ASCII is now a "?" there, and a UTF-8 terminal shows it as
    it is."""
    script = tmp_path / "训练.py"
    script.write_text("import os, time\nf = open(os.environ['DEV'])\ntime.sleep(60)\n")
    (tmp_path / "nvidia0").touch()
    box.env["JOBINFO_DEVICE_GLOB"] = str(tmp_path / "nvidia*")
    job = subprocess.Popen(["python3", str(script), "--data", "数据集.jsonl"], start_new_session=True,
                           env=dict(os.environ, DEV=str(tmp_path / "nvidia0")))
    try:
        assert wait_for(lambda: any(os.readlink("/proc/%d/fd/%s" % (job.pid, fd)).endswith("nvidia0")
                                    for fd in os.listdir("/proc/%d/fd" % job.pid)), timeout=10)
        box.write_scenario([{"gpus": [idle_gpu(mem=9000)], "apps": [app(job.pid, mem=6000)]}])
        r = box.run("status", cmd="bin/gpuguard", env={"LANG": lang})
    finally:
        job.kill()
        job.wait()
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if "pid %d" % job.pid in line)
    assert "MiB  %s (%s)" % (shown, getpass.getuser()) in row, r.stdout
    if lang == "C":
        assert r.stdout.isascii(), r.stdout
