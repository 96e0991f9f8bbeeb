"""Hostile files and secrets (issue 14): symlinks planted at temp and state
paths, state folders that are not ours, secrets in children's environments
and state files, SIGHUP/SIGTERM, config files that are folders or carry a
BOM. Each runs the commands as a user types them."""
import os
import pwd
import signal
import subprocess
import time
from pathlib import Path

import flaky_receiver
from conftest import ROOT, app, default_signals, uuid_for
from faultlib import base_env, record, run_once, scenario_file, wait_until

GPU0 = uuid_for(0)
VICTIM_TEXT = "root:x:0:0:victim file, must stay as it is\n"


def idle_scenario(tmp_path, cycles=8):
    path = tmp_path / "s.json"
    scenario_file(path, [{"gpus": [{"utilization.gpu": 0, "memory.used": 2576, "power.draw": 76.6}],
                          "apps": [app(1410, gpu=0)]}] * cycles, gpus=1)
    return path


def test_symlink_attacks_fail(tmp_path):
    """Three tries, as a local attacker would plant them:
    1. the old fixed temp names (idle.state.tmp.<pid>) for the next PIDs;
    2. state paths: events.jsonl, idle.state and the log file as links to a victim;
    3. a state folder that is a symlink, or belongs to another user."""
    victim = tmp_path / "victim"
    victim.write_text(VICTIM_TEXT)
    env = base_env(tmp_path, idle_scenario(tmp_path), GPUGUARD_LOG=tmp_path / "state" / "gpuguard.log",
                   MAX_IDLE_CYCLES=2)
    state = tmp_path / "state"
    r = run_once(env, 0)
    assert r.returncode == 0, r.stderr
    succeeded = []
    # 1. fixed temp names for the next few thousand PIDs
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    for pid in range(last, last + 3000):
        os.symlink(victim, state / ("idle.state.tmp.%d" % pid))
    for t in (60, 120):
        run_once(env, t)
    if victim.read_text() != VICTIM_TEXT:
        succeeded.append("temp name")
    for link in state.glob("idle.state.tmp.*"):
        link.unlink()
    # 2. state paths
    for name in ("events.jsonl", "idle.state", "gpuguard.log"):
        path = state / name
        if path.exists() or path.is_symlink():
            path.unlink()
        os.symlink(victim, path)
    for t in (180, 240, 300):
        run_once(env, t)
    if victim.read_text() != VICTIM_TEXT:
        succeeded.append("state path")
    # 3. state folder: a symlink, then a folder of another user
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    os.symlink(real, tmp_path / "linked")
    r1 = run_once(dict(env, GPUGUARD_STATE_DIR=str(tmp_path / "linked")), 360)
    refused = r1.returncode == 2 and "symlink" in r1.stderr and len(r1.stderr.splitlines()) == 1
    if os.geteuid() == 0:
        other = tmp_path / "others"
        other.mkdir(mode=0o777)
        os.chown(other, pwd.getpwnam("nobody").pw_uid, -1)
        r2 = run_once(dict(env, GPUGUARD_STATE_DIR=str(other)), 420)
        refused = refused and r2.returncode == 2 and "owned by uid" in r2.stderr
    if not refused or list(real.iterdir()):
        succeeded.append("state folder")
    record("symlink", "%d/3 succeed%s" % (len(succeeded), (": " + ", ".join(succeeded)) if succeeded else ""),
           not succeeded)
    assert succeeded == []


def environ_of(path):
    return path.read_bytes().replace(b"\0", b"\n").decode("utf-8", "replace") if path.exists() else ""


def test_secrets_reach_only_the_sender(tmp_path):
    """Webhook token and signing secret in secrets.conf (0600) and, for a
    second key, exported by the user: nvidia-smi and the job never see them;
    the state folder holds them nowhere; a failing target is one line."""
    token, signing, am_token = "TOKEN5ecr3t", "SEC0signing0secret", "AMt0ken"
    server, _, url = flaky_receiver.serve(mix={"500": 1})
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    (conf_dir / "gpuguard.conf").write_text("NOTIFY_TYPE=generic\nMAX_IDLE_CYCLES=2\nNOTIFY_RETRIES=0\n")
    secrets = conf_dir / "secrets.conf"
    secrets.write_text("NOTIFY_URL=%s/hook/%s\nNOTIFY_SECRET=%s\n" % (url, token, signing))
    secrets.chmod(0o600)
    env = base_env(tmp_path, idle_scenario(tmp_path), GPUGUARD_CONFIG=conf_dir / "gpuguard.conf",
                   FAKE_SMI_ENV_LOG=tmp_path / "smi-env", GPUGUARD_LOG=tmp_path / "log",
                   ALERTMANAGER_URL="http://127.0.0.1:1/%s" % am_token)
    outputs = ""
    for t in (0, 60, 120):
        r = run_once(env, t)
        outputs += r.stdout + r.stderr
    secret_strings = (token, signing, am_token)
    smi_env = environ_of(tmp_path / "smi-env")
    in_smi = [s for s in secret_strings if s in smi_env]
    # the job, started by gpu-leak-watch the way a user starts it
    job_env = tmp_path / "job-env"
    r = subprocess.run([str(ROOT / "bin/gpu-leak-watch"), "--interval", "1", "--",
                        "sh", "-c", "cat /proc/$$/environ > '%s'" % job_env],
                       env=env, capture_output=True, text=True, timeout=60)
    outputs += r.stdout + r.stderr
    in_job = [s for s in secret_strings if s in environ_of(job_env)]
    in_state = []
    for root, _, names in os.walk(tmp_path / "state"):
        for n in names:
            text = Path(root, n).read_bytes().decode("utf-8", "replace")
            in_state += ["%s in %s" % (s, n) for s in secret_strings if s in text]
    outputs += (tmp_path / "log").read_text(errors="replace") if (tmp_path / "log").exists() else ""
    in_output = [s for s in secret_strings if s in outputs]
    tracebacks = outputs.count("Traceback")
    server.shutdown()
    ok_children = not in_smi and not in_job and job_env.exists()
    record("secrets", "in nvidia-smi's environment: %d, in the job's: %d, in state files: %d, in logs/errors: %d; "
           "tracebacks: %d" % (len(in_smi), len(in_job), len(in_state), len(in_output), tracebacks),
           ok_children and not in_state and not in_output and tracebacks == 0)
    assert job_env.exists(), r.stderr
    assert in_smi == [] and in_job == []
    assert in_output == []


def test_state_files_mask_secrets_and_errors_have_no_traceback(tmp_path):
    token = "TOKEN5ecr3t"
    server, _, url = flaky_receiver.serve(mix={"500": 1})
    env = base_env(tmp_path, idle_scenario(tmp_path), NOTIFY_URL="%s/hook/%s" % (url, token),
                   NOTIFY_TYPE="generic", MAX_IDLE_CYCLES=2, NOTIFY_RETRIES=0, GPUGUARD_LOG=tmp_path / "log")
    out = "".join(run_once(env, t).stderr for t in (0, 60, 120))
    server.shutdown()
    for root, _, names in os.walk(tmp_path / "state"):
        for n in names:
            assert token not in Path(root, n).read_bytes().decode("utf-8", "replace"), n
    assert "Traceback" not in out + (tmp_path / "log").read_text()


def test_sighup_reloads_and_sigterm_stops_with_one_line(tmp_path):
    conf = tmp_path / "gpuguard.conf"
    conf.write_text("THRESHOLD=10\n")
    env = base_env(tmp_path, idle_scenario(tmp_path, 1), GPUGUARD_CONFIG=conf, GPUGUARD_LOG=tmp_path / "log")
    log = tmp_path / "log"
    # SIGHUP and SIGINT as a terminal leaves them: under nohup or a script's
    # background job they are ignored on entry, and bash cannot trap them
    proc = subprocess.Popen([str(ROOT / "bin/yichuidingyin.sh")], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_signals)
    try:
        assert wait_until(lambda: log.exists() and "watching GPUs" in log.read_text(), 60)
        conf.write_text("THRESHOLD=25\n")
        proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: "configuration reloaded" in log.read_text(), 60), log.read_text()[-3000:]
        conf.write_text("THRESHOLD=1.8e19\n")
        proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: "not reloaded" in log.read_text(), 60), log.read_text()[-3000:]
        time.sleep(1.5)
        alive = proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    text = log.read_text()
    reloaded = [line for line in text.splitlines() if "SIGHUP" in line]
    stops = [line for line in text.splitlines() if "stopped" in line]
    record("sighup", "HUP: %s; bad file on HUP: %s; still watching: %s; SIGTERM: exit %d, %d log line"
           % ("reloaded (threshold 25%)" if "threshold 25%" in reloaded[0] else reloaded[0],
              "kept the config in force, 1 line" if "not reloaded" in reloaded[-1] else reloaded[-1],
              "yes" if alive else "NO", proc.returncode, len(stops)),
           alive and proc.returncode == 0 and len(stops) == 1 and len(reloaded) == 2)
    assert "threshold 25%" in reloaded[0]
    assert "THRESHOLD must be a whole number" in reloaded[1]
    assert alive and proc.returncode == 0 and len(stops) == 1


def test_config_that_is_a_folder_or_has_a_bom(tmp_path):
    env = base_env(tmp_path, idle_scenario(tmp_path, 1))
    folder = tmp_path / "conf.d"
    folder.mkdir()
    r1 = run_once(dict(env, GPUGUARD_CONFIG=str(folder)), 0)
    bom = tmp_path / "bom.conf"
    bom.write_bytes(b"\xef\xbb\xbfMAX_IDLE_CYCLES=1\r\n")
    env.pop("MAX_IDLE_CYCLES")              # the file's value must be the one in force
    r2 = run_once(dict(env, GPUGUARD_CONFIG=str(bom)), 0)
    fired = "gpu_idle firing" in r2.stderr
    record("config", "folder: exit %d, %d line (%s); BOM + CRLF file: read (%s)"
           % (r1.returncode, len(r1.stderr.splitlines()), r1.stderr.strip(),
              "MAX_IDLE_CYCLES=1 took effect" if fired else "NOT applied"),
           r1.returncode == 2 and len(r1.stderr.splitlines()) == 1 and fired)
    assert r1.returncode == 2 and r1.stderr == "yichuidingyin: config file %s is a folder, not a file\n" % folder
    assert r2.returncode == 0 and fired, r2.stderr


def test_no_fixed_temp_names_in_bash():
    """Every file is written through gg_write_atomic (random exclusive
    names): no `$$`-suffixed or fixed `.tmp` names anywhere in bin/ or lib/."""
    import re
    hits = []
    for path in list((ROOT / "lib").glob("*.sh")) + list((ROOT / "bin").iterdir()):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if ".tmp" in code and not re.search(r"\$RANDOM|mktemp|-name ", code):
                hits.append("%s:%d" % (path.name, n))
    assert hits == []
