"""Who holds an idle GPU (lib/jobinfo.sh, ARCHITECTURE.md, rule 5) and per-job idle
rules (IDLE_RULES), as a user meets them: real processes stand in for the
training job (they hold a stand-in GPU device file), the nvidia-smi double
lists their PIDs, and the watchdog's events name the job."""
import contextlib
import getpass
import json
import os
import re
import subprocess
import sys
import time

import gpuguard_render as render
import pytest
from conftest import app, busy_gpu, idle_gpu, wait_for

SECRETS = ["SEKRIT1", "SEKRIT2", "SEKRIT3", "SEKRIT4", "hf_abcdefghijklmnopqrstuvwx"]

LAUNCHER = r"""
import os, subprocess, sys, time
dev, n = sys.argv[1], int(sys.argv[2])
kids = []
for i in range(n):
    env = dict(os.environ, RANK=str(i), LOCAL_RANK=str(i), SLURM_JOB_ID="4242",
               HF_TOKEN="hf_abcdefghijklmnopqrstuvwx")
    kids.append(subprocess.Popen([sys.executable, "-c",
        "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); time.sleep(600)", dev],
        env=env, stdout=subprocess.PIPE, text=True))
for k in kids:
    k.stdout.readline()
print(" ".join(str(k.pid) for k in kids), flush=True)
time.sleep(600)
"""


class Job:
    """A launcher (its own session, like torchrun in a tmux pane) and N
    GPU processes holding the stand-in device file."""

    def __init__(self, tmp, n, args, cwd):
        script = tmp / "launcher.py"
        script.write_text(LAUNCHER)
        dev = tmp / "nvidia0"
        dev.touch()
        cwd.mkdir(exist_ok=True)
        self.proc = subprocess.Popen([sys.executable, str(script), str(dev), str(n)] + args, cwd=cwd,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.pids = [int(p) for p in self.proc.stdout.readline().split()]
        self.pid = self.proc.pid

    def stop(self):
        # a test may have ended the job already (it ended on its own)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, 9)
        self.proc.wait()


@pytest.fixture
def jobs(tmp_path):
    started = []

    def start(n=1, args=(), cwd="work dir"):
        job = Job(tmp_path, n, list(args), tmp_path / cwd)
        started.append(job)
        return job
    yield start
    for job in started:
        job.stop()


@pytest.fixture
def gbox(box, tmp_path):
    box.env["JOBINFO_DEVICE_GLOB"] = str(tmp_path / "nvidia*")
    return box


def run_cycles(box, steps, n, env=None, gpus=1, start=1000):
    box.write_scenario(steps, gpus=gpus)
    out = ""
    for t in range(n):
        out += box.once(now=start + 60 * t, env=env).stderr
    return out


def test_idle_event_names_the_job_and_masks_its_secrets(gbox, jobs):
    job = jobs(1, ["train.py", "--api-key", "SEKRIT1", "--token=SEKRIT2", "password=SEKRIT3",
                   "https://bob:SEKRIT4@git.example.com/x.git", "hf_abcdefghijklmnopqrstuvwx", "--lr", "3e-4"])
    holder = job.pids[0]
    step = {"gpus": [idle_gpu(mem=30000)], "apps": [app(holder, mem=29800)]}
    logs = run_cycles(gbox, [step] * 3, 3, env={"GPU_HOUR_PRICE": "24"})
    (event,) = gbox.events()
    j = event["job"]
    assert j["visible"] is True and j["pid"] == job.pid and j["pids"] == [holder]
    assert j["user"] == getpass.getuser() and j["uid"] == os.getuid()
    assert j["cwd"].endswith("work dir")
    assert j["slurm_job"] == "4242" and j["rank"] == 0 and j["local_rank"] == 0
    assert j["used_memory_mib"] == 29800 and event["jobs"] == [j]
    assert abs(j["start_ts"] - time.time()) < 120 and 0 <= j["elapsed_s"] < 120
    assert "train.py --api-key *** --token=*** password=*** https://bob:***@git.example.com/x.git hf_*** --lr 3e-4" in j["cmdline"]
    assert event["gpu_name"] == "NVIDIA H200" and event["incident_job_pid"] == job.pid
    # 2 idle minutes of one GPU at 24 an hour
    assert event["idle_seconds"] == 120 and event["cost"] == 0.8 and event["currency"] == "¥"
    everything = (gbox.state / "events.jsonl").read_text() + (gbox.state / "idle.state").read_text() + logs
    for secret in SECRETS:
        assert secret not in everything


def test_one_job_on_two_gpus_is_one_job(gbox, jobs):
    job = jobs(2, ["torchrun-like"])
    step = {"gpus": [idle_gpu(), idle_gpu()],
            "apps": [app(job.pids[0], gpu=0), app(job.pids[1], gpu=1)]}
    run_cycles(gbox, [step] * 3, 3, gpus=2)
    by_gpu = {e["gpu"]: e for e in gbox.events()}
    assert sorted(by_gpu) == [0, 1]
    for gpu in (0, 1):
        j = by_gpu[gpu]["job"]
        assert j["pid"] == job.pid and j["pids"] == sorted(job.pids)
        assert j["rank"] == gpu


def test_a_secret_inside_a_one_argument_command_is_masked_everywhere(gbox, jobs):
    """`bash -c "python3 train.py --api-key K"` (Kubernetes' `sh -c`): the
    whole command is one argument, and `--api-key K` inside it reached
    events.jsonl (the generic webhook's body), the ledger and its digest,
    status and the report in clear."""
    job = jobs(1, ["python3 train.py --api-key SEKRIT1 --run exp7 --password SEKRIT2 --lr 3e-4"])
    step = {"gpus": [idle_gpu(mem=30000)], "apps": [app(job.pids[0], mem=29800)]}
    run_cycles(gbox, [step] * 3, 3)
    (event,) = gbox.events()
    assert "--api-key *** --run exp7 --password *** --lr 3e-4" in event["job"]["cmdline"]
    status = gbox.run("status", "--json", cmd="bin/gpuguard", env={"GPUGUARD_NOW": "1180"})
    (proc,) = json.loads(status.stdout)["gpus"][0]["processes"]
    assert "--api-key *** --run exp7 --password ***" in proc["cmdline"]
    for path in gbox.state.rglob("*"):
        if path.is_file():
            assert b"SEKRIT" not in path.read_bytes(), path
    assert "SEKRIT" not in status.stdout + status.stderr


def test_two_jobs_on_one_gpu_main_job_holds_most_memory(gbox, jobs):
    small, big = jobs(1, ["small.py"], cwd="a"), jobs(1, ["big.py"], cwd="b")
    step = {"gpus": [idle_gpu(mem=40000)],
            "apps": [app(small.pids[0], mem=1000), app(big.pids[0], mem=38000)]}
    run_cycles(gbox, [step] * 3, 3)
    (event,) = gbox.events()
    assert event["job"]["pid"] == big.pid
    assert [j["pid"] for j in event["jobs"]] == [small.pid, big.pid]


def test_two_jobs_on_one_gpu_the_message_names_the_one_holding_most_memory(gbox, jobs):
    """The alert a team reads names the job the event names (eval.py, most
    memory), not whichever was listed first; the other job gets a line of
    its own, and the py-spy hint points at the named job."""
    train, evaluate = jobs(1, ["train.py"], cwd="a"), jobs(1, ["eval.py"], cwd="b")
    step = {"gpus": [idle_gpu(mem=20000)],
            "apps": [app(train.pids[0], mem=2556), app(evaluate.pids[0], mem=17000)]}
    run_cycles(gbox, [step] * 3, 3)
    (event,) = gbox.events()
    for lang, also in (("en", "Also held by: "), ("zh", "同时占用：")):
        _title, lines = render._render(event, lang, {})
        who, where = lines[1], lines[2]
        assert str(evaluate.pids[0]) in who and str(evaluate.pid) in who
        assert str(train.pid) not in who and str(train.pids[0]) not in who
        assert where.endswith(os.sep + "b") and str(train.pid) not in where
        (other,) = [line for line in lines if line.startswith(also)]
        assert str(train.pids[0]) in other and str(train.pid) in other and "2.5 GiB" in other
        assert str(evaluate.pids[0]) not in other
        assert re.search(r"py-spy dump --pid %d\b" % evaluate.pids[0], lines[-1])


def test_unseen_processes_on_two_gpus_are_two_jobs_each_on_its_gpu(gbox):
    """In a container the driver's PIDs name no process here: two of them
    on two GPUs are two holders, each reported on its own GPU."""
    free = [pid for pid in range(4194000, 4190000, -1) if not os.path.exists("/proc/%d" % pid)][:2]
    step = {"gpus": [idle_gpu(), idle_gpu(mem=40000)],
            "apps": [app(free[0], gpu=0), app(free[1], gpu=1, mem=39000, name="vllm")]}
    run_cycles(gbox, [step] * 3, 3, gpus=2)
    title, sections = render.render_digest(gbox.events(), "en", {})
    assert "GPU 0-1" not in title + json.dumps(sections)
    heads = sorted(head for head, _lines in sections)
    assert heads == ["GPU 0 (NVIDIA H200) idle 2 min, held by PID %d" % free[0],
                     "GPU 1 (NVIDIA H200) idle 2 min, held by PID %d" % free[1]]


def test_pid_this_namespace_cannot_vouch_for_is_named_and_nothing_more(gbox):
    """The driver lists host PIDs: inside a container the same number is
    another process, or none. Say the PID, nothing false."""
    other = os.getpid()                 # alive, but holds no GPU device file
    free = 4194000
    while os.path.exists("/proc/%d" % free):
        free -= 1
    step = {"gpus": [idle_gpu(mem=30000)], "apps": [app(other, mem=15000), app(free, mem=14000)]}
    run_cycles(gbox, [step] * 3, 3)
    (event,) = gbox.events()
    assert [(j["pid"], j["visible"], j["user"], j["cmdline"]) for j in event["jobs"]] == [
        (other, False, None, None), (free, False, None, None)]
    assert "pytest" not in json.dumps(event)


def test_hidden_processes_say_memory_held_and_no_job(gbox):
    step = {"gpus": [idle_gpu(mem=30000)], "apps": []}
    run_cycles(gbox, [step] * 3, 3)
    (event,) = gbox.events()
    assert event["job"] is None and event["jobs"] == [] and event["processes"] == []
    assert event["memory_used_mib"] == 30000 and event["incident_job_pid"] is None


def test_cost_uses_the_configured_currency_and_is_absent_without_price(gbox):
    step = {"gpus": [idle_gpu()], "apps": [app(1410)]}
    # (a watchdog sampling every 20 minutes: the hour below is watched time,
    # not a pause that leaves the incident's idle time out)
    slow = {"CHECK_INTERVAL": "1200"}
    run_cycles(gbox, [step] * 4, 3, env=dict(slow, GPU_HOUR_PRICE="2.5", GPU_PRICE_CURRENCY="$"))
    (event,) = gbox.events()
    assert event["cost"] == 0.08 and event["currency"] == "$" and event["gpu_hour_price"] == 2.5
    gbox.once(now=1000 + 3600 + 120, env=dict(slow, GPU_HOUR_PRICE="2.5", GPU_PRICE_CURRENCY="$",
                                              REPEAT_INTERVAL="3600"))
    assert gbox.events()[1]["state"] == "reminder" and gbox.events()[1]["cost"] == 2.58
    run_cycles(gbox, [step] * 3, 1, start=10_000, env=slow)
    assert gbox.events()[-1]["state"] == "reminder" and "cost" not in gbox.events()[-1]


@pytest.mark.parametrize("price,currency", [("2.5 USD", "USD"), ("$2.5", "$"), ("2.5", "¥")])
def test_a_price_written_as_the_readme_shows_it_is_taken_with_its_currency(gbox, tmp_path, price, currency):
    """The README gives GPU_HOUR_PRICE as 30, ¥30 or 2.5 USD; the last two
    stopped the watchdog (exit 2, every cron minute) from the environment
    and from the config file alike."""
    step = {"gpus": [idle_gpu()], "apps": [app(1410)]}
    conf = tmp_path / "gpuguard.conf"
    conf.write_text("GPU_HOUR_PRICE=%s\n" % price)
    run_cycles(gbox, [step] * 4, 3, env={"GPUGUARD_CONFIG": str(conf)})
    (event,) = gbox.events()
    assert event["gpu_hour_price"] == 2.5 and event["currency"] == currency and event["cost"] == 0.08


def test_resolved_after_the_job_left_keeps_the_incident_job_pid(gbox, jobs):
    job = jobs(1, ["train.py"])
    held = {"gpus": [idle_gpu()], "apps": [app(job.pids[0])]}
    gone = {"gpus": [idle_gpu(mem=0)], "apps": []}
    run_cycles(gbox, [held] * 3 + [gone], 4)
    firing, resolved = gbox.events()
    assert resolved["state"] == "resolved" and resolved["reason"] == "released"
    assert resolved["incident_job_pid"] == firing["job"]["pid"] == job.pid


def test_resolved_after_the_job_ended_names_the_job_not_a_container(gbox, jobs):
    """The job is killed and frees the GPU: the resolved message names the
    job the alert named (it was visible all along), not "container?"."""
    job = jobs(1, ["train.py"])
    held = {"gpus": [idle_gpu()], "apps": [app(job.pids[0])]}
    gone = {"gpus": [idle_gpu(mem=0)], "apps": []}
    gbox.write_scenario([held] * 3 + [gone])
    for t in range(3):
        gbox.once(now=1000 + 60 * t)
    job.stop()
    gbox.once(now=1180)
    firing, resolved = gbox.events()
    for lang, said, hidden in (("en", "; job Slurm job 4242", "container?"), ("zh", "；任务 Slurm 作业 4242", "容器？")):
        (line,) = render._render(resolved, lang, {})[1]
        assert line.endswith(said) and hidden not in line
        # with no process list ever seen there is no job to name
        (line,) = render._render(dict(resolved, incident_job=None, incident_job_pid=None), lang, {})[1]
        assert hidden in line
    assert resolved["job"] is None and resolved["incident_job"] == firing["job"]


# ----------------------------------------------------------- idle rules --

def write_rules(tmp_path, text):
    path = tmp_path / "idle-rules.conf"
    path.write_text(text)
    return str(path)


def test_exempt_job_never_alerts_others_still_do(gbox, jobs, tmp_path):
    server = jobs(1, ["-m", "vllm.entrypoints.openai.api_server", "--model", "qwen"], cwd="srv")
    trainer = jobs(1, ["train.py"], cwd="trn")
    rules = write_rules(tmp_path, "# inference servers idle at night\ncmd:vllm|sglang   exempt\n")
    step = {"gpus": [idle_gpu(), idle_gpu()],
            "apps": [app(server.pids[0], gpu=0), app(trainer.pids[0], gpu=1)]}
    run_cycles(gbox, [step] * 6, 6, env={"IDLE_RULES": rules}, gpus=2)
    assert [(e["gpu"], e["state"]) for e in gbox.events()] == [(1, "firing")]


def test_shipped_rules_spare_a_decoding_server_by_default(gbox, jobs):
    """With IDLE_RULES unset the shipped etc/idle-rules.conf is in force: a
    vLLM server replaying CUDA graphs of tiny kernels (on an H200: 99 % at
    131 W, what a spin looks like) is not called stuck; IDLE_RULES=none
    takes the rules away and the same GPU is."""
    server = jobs(1, ["-m", "vllm.entrypoints.openai.api_server", "--model", "qwen"], cwd="srv")
    decode = {"gpus": [idle_gpu(util=99, power=131, mem=60000)], "apps": [app(server.pids[0], mem=59000)]}
    run_cycles(gbox, [decode] * 6, 6)
    assert gbox.events() == []
    run_cycles(gbox, [decode] * 6, 6, env={"IDLE_RULES": "none"}, start=5000)
    assert [(e["event"], e["state"]) for e in gbox.events()] == [("gpu_stuck", "firing")]


def test_rule_by_user_changes_cycles_and_names_itself(gbox, jobs, tmp_path):
    job = jobs(1, ["notebook.py"])
    rules = write_rules(tmp_path, "cmd:nomatch exempt\nuser:%s   MAX_IDLE_CYCLES=5 THRESHOLD=20\n" % getpass.getuser())
    step = {"gpus": [idle_gpu(util=15)], "apps": [app(job.pids[0])]}
    run_cycles(gbox, [step] * 6, 4, env={"IDLE_RULES": rules})
    assert gbox.events() == []
    gbox.once(now=1000 + 60 * 4, env={"IDLE_RULES": rules})
    (event,) = gbox.events()
    assert event["idle_cycles"] == 5 and event["threshold"] == 20 and event["rule"] == rules + ":2"


def test_threshold_zero_rule_keeps_the_spin_rule(gbox, jobs, tmp_path):
    """An inference server may idle all night, but if it hangs spinning it
    is still caught."""
    server = jobs(1, ["serve.py", "--port", "8000"])
    rules = write_rules(tmp_path, "cmd:serve[.]py  THRESHOLD=0\n")
    idle = {"gpus": [idle_gpu(mem=30000)], "apps": [app(server.pids[0], mem=29000)]}
    spin = {"gpus": [idle_gpu(util=100, power=125, mem=30000)], "apps": [app(server.pids[0], mem=29000)]}
    run_cycles(gbox, [idle] * 8 + [spin] * 5, 13, env={"IDLE_RULES": rules})
    assert [(e["event"], e["state"]) for e in gbox.events()] == [("gpu_stuck", "firing")]


def test_rules_ignore_pids_of_another_namespace(gbox, tmp_path):
    """The PID listed is this test (another process than the GPU's): its
    command line (pytest) must not pick a rule."""
    rules = write_rules(tmp_path, "cmd:pytest|python exempt\n")
    step = {"gpus": [idle_gpu()], "apps": [app(os.getpid())]}
    run_cycles(gbox, [step] * 3, 3, env={"IDLE_RULES": rules})
    assert len(gbox.events()) == 1


@pytest.mark.parametrize("text,why", [
    ("cmd:( exempt\n", "bad regular expression"),
    ("cmd:x FOO=1\n", "unknown setting FOO"),
    ("cmd:x THRESHOLD=abc\n", "THRESHOLD must be a whole number"),
    ("cmd:x THRESHOLD=101\n", "THRESHOLD must be a whole number from 0 to 100"),
    ("cmd:x MAX_IDLE_CYCLES=0\n", "MAX_IDLE_CYCLES must be"),
    ("python exempt\n", "expected 'cmd:REGEX"),
    ("cmd:train.py\n", "expected 'cmd:REGEX"),
    ("user:a b exempt\n", "no spaces"),
])
def test_bad_rule_line_is_exit_2_with_file_and_line(box, tmp_path, text, why):
    rules = write_rules(tmp_path, "# rules\n\ncmd:ok exempt\n" + text)
    box.write_scenario([{"gpus": [busy_gpu()], "apps": []}])
    r = box.run("--once", env={"IDLE_RULES": rules})
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert "%s:4:" % rules in line and why in line
    assert box.smi_calls() == []


def test_missing_rules_file_is_exit_2(box, tmp_path):
    r = box.run("--once", env={"IDLE_RULES": str(tmp_path / "nope.conf")})
    assert r.returncode == 2 and "nope.conf" in r.stderr


def test_shipped_example_rules_parse(box):
    from conftest import ROOT
    box.write_scenario([{"gpus": [busy_gpu()], "apps": []}])
    r = box.run("--once", env={"IDLE_RULES": str(ROOT / "etc" / "idle-rules.conf")})
    assert r.returncode == 0, r.stderr


def test_daemon_stays_up_and_names_job(gbox, jobs):
    """The daemon (not --once) with a real job behind the PID."""
    from conftest import start_daemon, stop_daemon
    job = jobs(1, ["train.py"])
    gbox.write_scenario([{"gpus": [idle_gpu()], "apps": [app(job.pids[0])]}] * 50)
    proc = start_daemon(gbox, env={"CHECK_INTERVAL": "1", "MAX_IDLE_CYCLES": "2"})
    try:
        assert wait_for(lambda: gbox.events(), timeout=30)
    finally:
        rc, _, err = stop_daemon(proc)
    assert rc == 0, err
    assert gbox.events()[0]["job"]["pid"] == job.pid

