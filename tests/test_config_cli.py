"""Configuration and command-line behaviour a user meets first."""
import json
import os
import signal
import subprocess
import time

import pytest
from conftest import ROOT, app, default_signals, idle_gpu, require, user_environ, wait_for

BINS = sorted(p.name for p in (ROOT / "bin").iterdir())


@pytest.mark.parametrize("name", BINS)
def test_every_command_has_summary_usage_and_help(name):
    text = (ROOT / "bin" / name).read_text()
    assert "\n# Summary: " in text and "\n# Usage: " in text
    r = subprocess.run([str(ROOT / "bin" / name), "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    assert r.stdout.startswith("Summary: ") and "Usage: " in r.stdout


@pytest.mark.parametrize("key,value,message", [
    ("THRESHOLD", "abc", "THRESHOLD must be a whole number from 0 to 100 (got 'abc')"),
    ("THRESHOLD", "101", "THRESHOLD must be a whole number from 0 to 100 (got '101')"),
    ("CHECK_INTERVAL", "0", "CHECK_INTERVAL must be a whole number of at least 1 (got '0')"),
    ("MAX_IDLE_CYCLES", "-3", "MAX_IDLE_CYCLES must be a whole number of at least 1 (got '-3')"),
    ("NOTIFY_TYPE", "teams", "NOTIFY_TYPE must be one of dingtalk, feishu, wecom, slack, generic (got 'teams')"),
    ("GPUGUARD_SYSLOG", "yes", "GPUGUARD_SYSLOG must be 0 or 1 (got 'yes')"),
    ("GPU_HOUR_PRICE", "¥30元", "GPU_HOUR_PRICE must be a price such as 30, ¥30 or 2.5 USD (got '¥30元')"),
    ("GPU_HOUR_PRICE", "-3", "GPU_HOUR_PRICE must be a price such as 30, ¥30 or 2.5 USD (got '-3')"),
])
def test_bad_value_is_one_clear_line_and_exit_2(box, key, value, message):
    box.write_scenario([{"gpus": [idle_gpu()], "apps": []}])
    r = box.run("--once", env={key: value})
    assert r.returncode == 2
    assert r.stderr == "yichuidingyin.sh: %s\n".replace("yichuidingyin.sh", "yichuidingyin") % message
    assert box.smi_calls() == []


@pytest.mark.parametrize("spaced,joined", [
    (["gpuguard", "status", "--config", "{missing}"], ["gpuguard", "status", "--config={missing}"]),
    (["gpuguard", "--config", "{missing}", "status"], ["gpuguard", "--config={missing}", "status"]),
    (["gpuguard", "notify", "--preview", "{missing}"], ["gpuguard", "notify", "--preview={missing}"]),
    (["gpu-leak-watch", "--pid", "1", "--interval", "abc"], ["gpu-leak-watch", "--pid=1", "--interval=abc"]),
    (["gpu-leak-watch", "--replay", "{missing}"], ["gpu-leak-watch", "--replay={missing}"]),
    (["gpu-leak-watch", "--pid", "", "--once"], ["gpu-leak-watch", "--pid=", "--once"]),
    (["lowprio-run", "--tier", "offline", "--nice", "3", "--dry-run", "--", "true"],
     ["lowprio-run", "--tier=offline", "--nice=3", "--dry-run", "--", "true"]),
    (["yichuidingyin.sh", "--config", "{missing}", "--once"], ["yichuidingyin.sh", "--config={missing}", "--once"]),
])
def test_an_option_takes_its_value_after_an_equals_sign_too(tmp_path, spaced, joined):
    """`--pid=1` is `--pid 1` in every command, as in GNU tools: before,
    some commands took it and others said "unknown option '--pid=1'"."""
    def run(words):
        words = [w.replace("{missing}", str(tmp_path / "missing")) for w in words]
        return subprocess.run([str(ROOT / "bin" / words[0])] + words[1:], capture_output=True, text=True,
                              timeout=60, env=user_environ(GPUGUARD_STATE_DIR=str(tmp_path / "state")))
    a, b = run(spaced), run(joined)
    assert "unknown" not in b.stderr, b.stderr
    assert (b.returncode, b.stdout, b.stderr) == (a.returncode, a.stdout, a.stderr)


def test_a_jobs_own_options_with_an_equals_sign_reach_it_untouched():
    """Only the command's own options are split: the job's `--nice=9` and
    `--pid=3` are its arguments, as typed."""
    r = subprocess.run([str(ROOT / "bin/lowprio-run"), "--nice=3", "--dry-run", "printf", "%s", "--nice=9"],
                       capture_output=True, text=True, timeout=60, env=user_environ())
    assert r.returncode == 0, r.stderr
    assert "nice -n 3 " in r.stdout and r.stdout.rstrip().endswith("--nice=9")
    r = subprocess.run([str(ROOT / "bin/gpu-leak-watch"), "--", "printf", "%s", "--pid=3"], capture_output=True,
                       text=True, timeout=60, env=user_environ())
    assert r.returncode == 0 and r.stdout == "--pid=3", r.stderr


@pytest.mark.parametrize("args,message", [
    (["version", "--json"], "unknown option '--json' for 'version'"),
    (["status", "--interval", "3"], "--interval goes with --watch"),
])
def test_an_option_a_command_would_ignore_is_refused(args, message):
    """`gpuguard version --json` printed text and `status --interval 3`
    printed one table: the option did nothing and nobody was told."""
    r = subprocess.run([str(ROOT / "bin/gpuguard")] + args, capture_output=True, text=True, timeout=60,
                       env=user_environ())
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("gpuguard: " + message) and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize("cmd", [["gpuguard", "--config=", "status"], ["gpuguard", "status", "--config", ""],
                                 ["yichuidingyin.sh", "--once", "--config="], ["gpu-leak-watch", "--all", "--config="],
                                 ["gpu-leak-watch", "report", "--config="], ["gpu-leak-watch", "--replay="]])
def test_an_empty_file_name_is_refused_not_taken_for_none(tmp_path, cmd):
    """`--config="$CONF"` with CONF unset read the default config without a
    word (its errors then named no file); `--replay=` said "say what to
    watch". Both are one line naming the option, exit 2."""
    home = tmp_path / "home"
    (home / ".config/gpuguard").mkdir(parents=True)
    (home / ".config/gpuguard/gpuguard.conf").write_text("THRESHOLD=bad\n")
    r = subprocess.run([str(ROOT / "bin" / cmd[0])] + cmd[1:], capture_output=True, text=True, timeout=60,
                       env=user_environ(HOME=str(home), GPUGUARD_STATE_DIR=str(tmp_path / "state")))
    option = "--replay" if "--replay=" in cmd else "--config"
    assert (r.returncode, r.stderr) == (2, "%s: %s needs a file (got '')\n" % (cmd[0].replace(".sh", ""), option))


@pytest.mark.parametrize("cmd,message", [
    (["gpuguard", "--config", "status"], "--config needs a file before the command (got the command 'status')"),
    (["gpuguard", "--config=ledger", "--json"], "--config needs a file before the command (got the command 'ledger')"),
    (["gpuguard", "status", "--config", "--json"], "--config needs a file (got the option '--json')"),
    (["yichuidingyin.sh", "--config", "--once"], "--config needs a file (got the option '--once')"),
    (["gpu-leak-watch", "--all", "--config", "--once"], "--config needs a file (got the option '--once')"),
    (["gpu-leak-watch", "--config", "--", "touch", "ran"], "--config needs a file (got the option '--')"),
    (["gpu-leak-watch", "report", "--config", "--out", "r.html"], "--config needs a file (got the option '--out')"),
])
def test_a_forgotten_config_file_name_is_said_not_read_from_the_next_word(tmp_path, cmd, message):
    """`gpuguard --config status` (the file name forgotten) took `status`
    as the config file and then said "a command is needed";
    `yichuidingyin.sh --config --once` said config file --once does not
    exist, `gpu-leak-watch --config -- CMD` that CMD was an unknown option.
    Each now says in one line that --config needs a file and what it got
    instead, exit 2 (and runs no job)."""
    r = subprocess.run([str(ROOT / "bin" / cmd[0])] + cmd[1:], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path, env=user_environ(GPUGUARD_STATE_DIR=str(tmp_path / "state")))
    assert (r.returncode, r.stdout, r.stderr) == (2, "", "%s: %s\n" % (cmd[0].replace(".sh", ""), message))
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("cmd,message", [
    (["gpu-leak-watch", "--rules", "--once", "--all"], "--rules needs a file (got the option '--once')"),
    (["gpu-leak-watch", "--all", "--loss-log", "--once"], "--loss-log needs a file (got the option '--once')"),
    (["gpu-leak-watch", "--replay", "--threshold", "5"], "--replay needs a file (got the option '--threshold')"),
    (["gpu-leak-watch", "--rules", "--", "touch", "ran"], "--rules needs a file (got the option '--')"),
    (["gpu-leak-watch", "report", "--out", "--since", "1h"], "--out needs a file name (got the option '--since')"),
    (["gpuguard", "report", "--out", "--pid", "1"], "--out needs a file name (got the option '--pid')"),
])
def test_a_forgotten_file_name_of_any_option_is_said_not_read_from_the_next_word(tmp_path, cmd, message):
    """Every option that takes a file behaves as --config does: `--rules
    --once` read "--once" as the rules file ("cannot read rules file
    '--once'"), `--replay --threshold 5` said "cannot read --threshold",
    `report --out --since 1h` said "unknown option '1h'" and `gpuguard
    report --out --since` wrote a report named "--since". One line naming
    the option and what it got, exit 2, no job run, no file written."""
    r = subprocess.run([str(ROOT / "bin" / cmd[0])] + cmd[1:], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path, env=user_environ(GPUGUARD_STATE_DIR=str(tmp_path / "state")))
    assert (r.returncode, r.stdout, r.stderr) == (2, "", "%s: %s\n" % (cmd[0], message))
    assert os.listdir(tmp_path) in ([], ["state"])


def test_an_out_file_named_like_an_option_is_written_when_it_exists(tmp_path):
    """A file by the name is the file meant, as for --config: `--out
    --since` where ./--since exists (and `--out -` is stdout)."""
    (tmp_path / "--since").write_text("old")
    env = user_environ(GPUGUARD_STATE_DIR=str(tmp_path / "state"))
    r = subprocess.run([str(ROOT / "bin/gpuguard"), "report", "--out", "--since"], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "--since").read_text().startswith("<!doctype html>")
    r = subprocess.run([str(ROOT / "bin/gpu-leak-watch"), "report", "--out", "-"], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path, env=env)
    assert r.returncode == 0 and r.stdout.startswith("<!doctype html>"), r.stderr


def test_a_config_file_named_like_a_command_is_read_when_it_exists(box, tmp_path):
    """A file by the name is the file meant: `gpuguard --config status
    status` in a folder holding a config file named "status"."""
    (tmp_path / "status").write_text("MAX_IDLE_CYCLES=7\n")
    box.write_scenario([{"gpus": [idle_gpu(util=50)], "apps": [app(5)]}])
    env = dict(box.env, GPUGUARD_CONFIG="")
    r = subprocess.run([str(ROOT / "bin/gpuguard"), "--config", "status", "status", "--json"], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["gpus"][0]["idle_limit"] == 7


def test_a_webhook_url_given_as_the_config_file_is_not_printed(tmp_path):
    """`--config=https://oapi.dingtalk.com/robot/send?access_token=...` (the
    URL pasted into the wrong place) was printed whole, token and all, in
    "config file ... does not exist", on stderr that cron mails."""
    url = "https://oapi.dingtalk.com/robot/send?access_token=0123456789abcdef"
    for cmd in (["gpuguard", "--config=" + url, "status"], ["yichuidingyin.sh", "--once", "--config", url]):
        r = subprocess.run([str(ROOT / "bin" / cmd[0])] + cmd[1:], capture_output=True, text=True, timeout=60,
                           env=user_environ(GPUGUARD_STATE_DIR=str(tmp_path / "state")))
        assert r.returncode == 2 and "0123456789abcdef" not in r.stderr
        assert r.stderr.endswith(": config file a URL (not shown) does not exist\n"), r.stderr


def test_unknown_option_exit_2(box):
    r = box.run("--bogus")
    assert r.returncode == 2 and "unknown option '--bogus'" in r.stderr


def test_environment_over_file_over_default(box, tmp_path):
    conf = tmp_path / "gpuguard.conf"
    conf.write_text("# comment\n\nMAX_IDLE_CYCLES=2\nexport THRESHOLD=\"50\"\nREPEAT_INTERVAL='0'\n")
    step = {"gpus": [idle_gpu(util=30)], "apps": [app(5)]}
    box.write_scenario([step] * 10)
    env = {"GPUGUARD_CONFIG": str(conf)}
    # file: THRESHOLD=50 makes 30 % idle, MAX_IDLE_CYCLES=2 fires on the 2nd
    box.once(now=1, env=env)
    box.once(now=2, env=env)
    assert [e["state"] for e in box.events()] == ["firing"]
    assert box.events()[0]["threshold"] == 50
    # environment wins over the file: THRESHOLD=20 makes 30 % busy -> resolved
    env["THRESHOLD"] = "20"
    box.once(now=3, env=env)
    assert [e["state"] for e in box.events()] == ["firing", "resolved"]


def test_config_flag_and_default_when_absent(box, tmp_path):
    conf = tmp_path / "other.conf"
    conf.write_text("THRESHOLD=77\n")
    box.write_scenario([{"gpus": [idle_gpu(util=50)], "apps": [app(5)]}] * 3)
    env = {"GPUGUARD_CONFIG": ""}
    for t in range(3):
        r = box.run("--once", "--config", str(conf), env=dict(env, GPUGUARD_NOW=str(t)))
        assert r.returncode == 0, r.stderr
    assert box.events()[0]["threshold"] == 77


@pytest.mark.parametrize("before", [True, False])
def test_gpuguard_takes_config_before_or_after_the_command(box, tmp_path, before):
    """`gpuguard --config FILE status` (as git's global options go) was
    refused as an unknown command, while --help says every command takes it."""
    conf = tmp_path / "other.conf"
    conf.write_text("MAX_IDLE_CYCLES=7\n")
    box.write_scenario([{"gpus": [idle_gpu(util=50)], "apps": [app(5)]}])
    args = ["--config", str(conf), "status", "--json"] if before else ["status", "--json", "--config", str(conf)]
    r = box.run(*args, cmd="bin/gpuguard", env={"GPUGUARD_CONFIG": ""})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["gpus"][0]["idle_limit"] == 7


def test_config_file_is_never_executed(box, tmp_path):
    marker = tmp_path / "pwned"
    conf = tmp_path / "evil.conf"
    conf.write_text("NOTIFY_TYPE=generic\nGPUGUARD_HOST=$(touch %s)\n`touch %s`\n" % (marker, marker))
    r = box.run("--once", env={"GPUGUARD_CONFIG": str(conf)})
    assert r.returncode == 2
    assert r.stderr.strip() == "yichuidingyin: %s:3: expected KEY=VALUE" % conf
    assert not marker.exists()
    conf.write_text("GPUGUARD_HOST=$(touch %s)\n" % marker)
    box.write_scenario([{"gpus": [idle_gpu()], "apps": [app(1)]}] * 3)
    for t in range(3):
        box.once(now=t, env={"GPUGUARD_CONFIG": str(conf)})
    assert not marker.exists()
    assert box.events()[0]["host"] == "$(touch %s)" % marker


def test_unknown_key_warns(box, tmp_path):
    conf = tmp_path / "c.conf"
    conf.write_text("THRESHHOLD=5\n")
    box.write_scenario([{"gpus": [idle_gpu()], "apps": []}])
    r = box.run("--once", env={"GPUGUARD_CONFIG": str(conf)})
    assert r.returncode == 0
    assert "unknown key THRESHHOLD" in r.stderr


def test_world_readable_config_with_secret_warns_without_leaking(box, tmp_path):
    conf = tmp_path / "c.conf"
    conf.write_text("NOTIFY_URL=http://127.0.0.1:9/robot/send?access_token=TOPSECRETTOKEN\nNOTIFY_SECRET=SECxyzxyzxyz\n")
    conf.chmod(0o644)
    box.write_scenario([{"gpus": [idle_gpu()], "apps": []}])
    r = box.run("--once", env={"GPUGUARD_CONFIG": str(conf)})
    assert "readable by others (mode 644): chmod 600" in r.stderr
    assert "TOPSECRET" not in r.stderr and "SECxyz" not in r.stderr
    conf.chmod(0o600)
    r = box.run("--once", env={"GPUGUARD_CONFIG": str(conf)})
    assert "readable by others" not in r.stderr


def test_unwritable_state_dir_is_exit_2(box, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = box.run("--once", env={"GPUGUARD_STATE_DIR": str(blocker / "sub")})
    assert r.returncode == 2 and "not writable" in r.stderr


def test_default_state_dir_for_non_root_user(box, tmp_path):
    require(os.geteuid() == 0, "needs root to drop to another user")
    import pwd
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        require(False, "needs a second user: nobody")
    import shutil
    import tempfile
    base = tempfile.mkdtemp(prefix="gpuguard-user-")   # pytest's tmp is root-only
    try:
        os.chmod(base, 0o755)
        home = os.path.join(base, "home")
        os.mkdir(home)
        os.chown(home, nobody.pw_uid, nobody.pw_gid)
        scenario = os.path.join(base, "scenario.json")
        box.write_scenario([{"gpus": [idle_gpu()], "apps": []}])
        shutil.copy(box.scenario, scenario)
        os.chmod(scenario, 0o644)
        _run_as_nobody(box, nobody, home, scenario)
    finally:
        shutil.rmtree(base)


def test_a_user_who_cannot_read_the_secrets_is_told_so_not_to_set_a_target(box):
    """After a root install (secrets.conf 0600 beside a readable
    gpuguard.conf), a user's `gpuguard test-alert`, `notify --test`,
    `notify --check` and `doctor` said "set NOTIFY_URL", while a target was
    configured."""
    require(os.geteuid() == 0, "needs root to drop to another user")
    import shutil
    import tempfile
    base = tempfile.mkdtemp(prefix="gpuguard-user-")
    try:
        os.chmod(base, 0o755)
        conf, secrets = os.path.join(base, "gpuguard.conf"), os.path.join(base, "secrets.conf")
        with open(conf, "w") as f:
            f.write("THRESHOLD=10\n")
        os.chmod(conf, 0o644)
        with open(secrets, "w") as f:
            f.write("NOTIFY_URL=https://oapi.dingtalk.com/robot/send?access_token=abc123\n")
        os.chmod(secrets, 0o600)
        env = dict(box.env, GPUGUARD_CONFIG=conf, HOME=base, GPUGUARD_STATE_DIR=os.path.join(base, "state"))
        want = "cannot read %s (webhook URLs and secrets): run as its owner or root" % secrets
        for args in (["test-alert"], ["notify", "--test"], ["notify", "--check"], ["doctor"]):
            r = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                                str(ROOT / "bin/gpuguard")] + args, env=env, capture_output=True, text=True, timeout=60)
            out = r.stdout + r.stderr
            assert want in out and "set NOTIFY_URL" not in out and "abc123" not in out, (args, out)
    finally:
        shutil.rmtree(base)


def test_a_user_who_cannot_read_the_watchdogs_state_is_told_so(box):
    """Pointed at a root watchdog's state folder (mode 700), a user's
    `gpuguard status`, `ledger` and `report` showed a box where nothing
    happened (idle 0/3, 0.0 GPU-hours, "nothing recorded"), exit 0; with the
    folder open but its history closed, report printed a raw [Errno 13]."""
    require(os.geteuid() == 0, "needs root to drop to another user")
    import shutil
    import tempfile
    base = tempfile.mkdtemp(prefix="gpuguard-user-")
    try:
        os.chmod(base, 0o755)
        state = os.path.join(base, "state")
        os.mkdir(state, 0o700)
        open(os.path.join(state, "idle.state"), "w").close()
        box.write_scenario([{"gpus": [idle_gpu()], "apps": []}])
        scenario = os.path.join(base, "scenario.json")
        shutil.copy(box.scenario, scenario)
        os.chmod(scenario, 0o644)
        env = dict(box.env, GPUGUARD_STATE_DIR=state, HOME=base, FAKE_SMI_SCENARIO=scenario, FAKE_SMI_STATE="",
                   FAKE_SMI_LOG="")

        def as_nobody(*args):
            return subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                                   str(ROOT / "bin/gpuguard"), *args], env=env, capture_output=True, text=True,
                                  timeout=60, cwd=base)
        for args in (["status"], ["status", "--json"], ["ledger"], ["report", "--out", os.path.join(base, "r.html")]):
            r = as_nobody(*args)
            assert r.returncode == 2 and r.stderr == "gpuguard: cannot read the state folder %s (it belongs to " \
                "root): run as its owner or root\n" % state, (args, r.stderr)
        os.chmod(state, 0o755)
        os.mkdir(os.path.join(state, "history"), 0o700)
        out = os.path.join(base, "out")
        os.mkdir(out)
        os.chmod(out, 0o777)
        r = as_nobody("report", "--out", os.path.join(out, "r.html"))
        assert r.returncode == 1 and r.stderr == "gpuguard report: cannot read %s/history: run as its owner or " \
            "root\n" % state, r.stderr
    finally:
        shutil.rmtree(base)


def _run_as_nobody(box, nobody, home, scenario):
    env = dict(box.env, HOME=home, FAKE_SMI_SCENARIO=scenario, FAKE_SMI_STATE="", FAKE_SMI_LOG="")
    del env["GPUGUARD_STATE_DIR"]
    r = subprocess.run(["setpriv", "--reuid", str(nobody.pw_uid), "--regid", str(nobody.pw_gid),
                        "--clear-groups", str(ROOT / "bin/yichuidingyin.sh"), "--once"],
                       env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert os.path.exists(os.path.join(home, ".local/state/gpuguard/idle.state"))


def test_log_file_and_syslog(box, tmp_path):
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "logger").write_text('#!/bin/sh\necho "$@" >> %s\n' % (tmp_path / "syslog"))
    (fake / "logger").chmod(0o755)
    box.write_scenario([{"gpus": [idle_gpu()], "apps": [app(1)]}] * 3)
    env = {"PATH": "%s:%s" % (fake, box.env["PATH"]), "GPUGUARD_SYSLOG": "1",
           "GPUGUARD_LOG": str(tmp_path / "gpuguard.log")}
    for t in range(3):
        r = box.once(now=t, env=env)
        assert r.stderr == ""                      # all of it went to the file
    log = (tmp_path / "gpuguard.log").read_text()
    assert " WARN  yichuidingyin: gpu_idle firing: GPU 0 util 0% for 3 cycles" in log
    assert "-t gpuguard/yichuidingyin -p user.warning -- gpu_idle firing" in (tmp_path / "syslog").read_text()


SECRET_ENV = {"NOTIFY_SECRET": "SECsigningsecret123", "ALERTMANAGER_URL": "http://127.0.0.1:9/am-TOKEN77",
              "THRESHOLD": "10"}


def test_configuration_never_reaches_nvidia_smi_but_the_alert_helper_gets_it(box, sink, tmp_path):
    """ARCHITECTURE.md, rule 2: config_load exports no key (not even one the user
    exported): nvidia-smi's environment holds none of them, while the alert
    helper still gets the webhook and delivers."""
    env_log = tmp_path / "smi-env"
    url = sink.url + "/hook/TOKEN42"
    env = dict(SECRET_ENV, NOTIFY_URL=url, NOTIFY_TYPE="generic", FAKE_SMI_ENV_LOG=str(env_log))
    box.write_scenario([{"gpus": [idle_gpu()], "apps": [app(1410)]}] * 3)
    for t in range(3):
        box.once(now=t * 60, env=env)
    seen = env_log.read_text()
    assert seen.count("--\n") == 6                       # two calls a cycle, each recorded
    # (the test's own folders hold digits of pytest's counters, such as
    # "pytest-101", where THRESHOLD's "10" would be found)
    masked = seen.replace(str(tmp_path), "<tmp>").replace(str(ROOT), "<root>")
    for name, value in env.items():
        if not name.startswith("FAKE_"):
            assert name + "=" not in seen
            assert value not in masked
    assert "TOKEN42" not in seen and "FAKE_SMI_SCENARIO=" in seen
    assert wait_for(lambda: len(sink.requests) >= 1)
    assert "TOKEN42" in sink.requests[0]["path"]


def test_secrets_conf_beside_the_config_file(box, sink, tmp_path):
    """ARCHITECTURE.md, rule 3: secrets.conf beside the config file in force holds the
    webhook; the environment still wins; group/world-readable warns."""
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    conf = conf_dir / "gpuguard.conf"
    conf.write_text("MAX_IDLE_CYCLES=2\nNOTIFY_TYPE=generic\n")
    secrets = conf_dir / "secrets.conf"
    secrets.write_text("NOTIFY_URL=%s/hook/FROMSECRETS\n" % sink.url)
    secrets.chmod(0o600)
    box.write_scenario([{"gpus": [idle_gpu()], "apps": [app(1410)]}] * 4)
    env = {"GPUGUARD_CONFIG": str(conf)}
    for t in range(2):
        r = box.once(now=t * 60, env=env)
        assert "readable by others" not in r.stderr
    assert wait_for(lambda: len(sink.requests) == 1)
    assert "FROMSECRETS" in sink.requests[0]["path"]
    secrets.chmod(0o644)
    r = box.once(now=180, env=env)
    assert "secrets.conf holds webhook credentials and is readable by others (mode 644)" in r.stderr
    assert "FROMSECRETS" not in r.stderr


@pytest.mark.parametrize("content,message", [
    (None, "config file {path} is a folder, not a file"),
    (b"THRESHOLD=1.8e19\n", "THRESHOLD must be a whole number from 0 to 100 (got '1.8e19')"),
    (b"THRESHOLD=18446744073709551615\n",
     "THRESHOLD must be a whole number from 0 to 100 (got '18446744073709551615')"),
    (b"MAX_IDLE_CYCLES=99999999999999999999\n",
     "MAX_IDLE_CYCLES must be a whole number of at least 1 (at most 10^15) (got '99999999999999999999')"),
    (b"LEAK_THRESHOLD_MIB_H=1e3\n", "LEAK_THRESHOLD_MIB_H must be a decimal number from 0 to 10^15 (got '1e3')"),
])
def test_bad_config_file_is_one_line_and_exit_2(box, tmp_path, content, message):
    path = tmp_path / "gpuguard.conf"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    box.write_scenario([{"gpus": [idle_gpu()], "apps": []}])
    r = box.run("--once", env={"GPUGUARD_CONFIG": str(path)})
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == "yichuidingyin: %s\n" % message.format(path=path)


def test_config_with_bom_crlf_and_leading_zeros_is_read(box, tmp_path):
    conf = tmp_path / "gpuguard.conf"
    # (a space after "=" too: "MAX_IDLE_CYCLES= 02" was refused, "THRESHOLD=010 " taken)
    conf.write_bytes(b"\xef\xbb\xbfMAX_IDLE_CYCLES= 02\r\nTHRESHOLD=010 \r\n")
    box.write_scenario([{"gpus": [idle_gpu(util=9)], "apps": [app(1410)]}] * 2)
    for t in range(2):
        r = box.once(now=t * 60, env={"GPUGUARD_CONFIG": str(conf)})
        assert "unknown key" not in r.stderr
    ev = box.events()
    assert [e["state"] for e in ev] == ["firing"]
    assert ev[0]["threshold"] == 10


# ------------------------------------------------------ alert targets (25) --

URL_CASES = [
    "http://127.0.0.1:8080/hook", "https://oapi.dingtalk.com/robot/send?access_token=abc", "http://[::1]:9/x",
    "https://user:pw@host.example/x", "http://host_name.internal", "http://[::1", "http://[::1]:99999/",
    "http://host:0/", "http://host:/", "ftp://host/", "//host/x", "http:///x", "http://exa mple/",
    "http://a\x01b/", "http://例子.中国/", "https://h/" + "a" * 2039, "https://h/" + "a" * 2038,
    "HTTP://host/", "http://[zz]/", "http://h\u3000/", "HtTpS://h/", "HTTPX://h/",
]


def test_bash_and_python_agree_on_which_targets_are_malformed():
    """lib/config.sh warns about the targets the alert helper leaves out:
    both apply one rule (a disagreement would be a target dropped in
    silence, or a warning about one that gets its alerts)."""
    import gpuguard_alert as alert
    script = 'source lib/common.sh; source lib/config.sh; for u in "$@"; do ' \
             'if config_url_problem "$u" >/dev/null; then echo ok; else echo bad; fi; done'
    r = subprocess.run(["bash", "-c", script, "bash"] + URL_CASES, cwd=ROOT, capture_output=True, text=True,
                       env={"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}, check=True)
    in_bash = r.stdout.split()
    in_python = ["bad" if alert._url_problem(u) else "ok" for u in URL_CASES]
    assert in_bash == in_python
    assert in_python[:5] == ["ok"] * 5 and in_python.count("ok") == 8
    # a scheme is case-insensitive (RFC 3986): HTTP:// as a chat client copies it
    assert in_python[URL_CASES.index("HTTP://host/")] == "ok" and in_python[-1] == "bad"


@pytest.mark.slow  # three commands, doctor among them: over 1.5 s here
def test_notify_check_and_doctor_name_the_malformed_target_in_one_line(box, sink):
    """A typo in the first of two targets: notify --check and doctor name it
    (masked: no path or token) in one line each, check the good one, and
    --check exits 2, a configuration error."""
    box.write_scenario([{"gpus": [idle_gpu()], "apps": []}])
    env = {"NOTIFY_URL": "http://[::1/robot/send?access_token=T0KEN5ecret " + sink.url + "/hook"}
    r = box.run("notify", "--check", cmd="bin/gpuguard", env=env)
    lines = r.stdout.splitlines()
    assert r.returncode == 2 and r.stderr == ""
    assert lines[0] == ("FAIL\tNOTIFY_URL #1 (http://[::1/***)\tmalformed: bad host or port (an IPv6 address "
                        "goes in [brackets]); the other targets still get alerts")
    assert lines[1].startswith("OK\tgeneric %s/***" % sink.url) and len(lines) == 2
    r = box.run("doctor", cmd="bin/gpuguard", env=env)
    named = [line for line in r.stdout.splitlines() if "NOTIFY_URL #1" in line]
    assert len(named) == 1 and named[0].startswith("FAIL") and "T0KEN5ecret" not in r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr


@pytest.mark.slow  # three watchdog cycles with a flush each
def test_a_malformed_target_is_logged_once_and_the_good_one_gets_its_alert(box, sink):
    box.write_scenario([{"gpus": [idle_gpu()], "apps": [app(4242)]}] * 3)
    env = {"NOTIFY_URL": "http://[::1 " + sink.url + "/hook", "MAX_IDLE_CYCLES": "1"}
    err = "".join(box.once(now=60 * i, env=env).stderr for i in range(3))
    assert len(sink.requests) == 1 and "Traceback" not in err
    assert err.count("NOTIFY_URL #1 (http://[::1/***) is malformed and gets no alert") == 1, err


def test_a_comment_after_a_value_is_not_part_of_it(box, sink, tmp_path):
    """`KEY=value  # comment`, a habit from shell and most .conf files: the
    comment's words became targets of their own (and with quotes, the URL
    itself was refused), and THRESHOLD=5 # percent stopped the watchdog."""
    conf = tmp_path / "gg.conf"
    conf.write_text('NOTIFY_URL="%s/hook"  # ops channel\nMAX_IDLE_CYCLES=1 # one cycle\n'
                    "GPU_HOUR_PRICE='30'\t# yuan\nGPUGUARD_HOST=lab#7\n" % sink.url)
    box.write_scenario([{"gpus": [idle_gpu()], "apps": [app(4242)]}])
    env = {"GPUGUARD_CONFIG": str(conf)}
    r = box.run("notify", "--check", cmd="bin/gpuguard", env=env)
    assert r.returncode == 0 and r.stdout.startswith("OK\tgeneric %s/***" % sink.url), r.stdout + r.stderr
    assert len(r.stdout.splitlines()) == 1
    r = box.once(now=60, env=env)
    assert r.returncode == 0 and "malformed" not in r.stderr, r.stderr
    assert len(sink.requests) == 1 and box.events()[0]["cost"] is not None
    assert box.events()[0]["host"] == "lab#7"          # a # with no space before it is the value's


def test_when_every_target_is_malformed_the_log_says_none_is_left(box, tmp_path):
    """The one line said "the other targets still get alerts" where there
    were none."""
    box.write_scenario([{"gpus": [idle_gpu()], "apps": [app(4242)]}])
    env = {"NOTIFY_URL": "htps://127.0.0.1:9/hook", "MAX_IDLE_CYCLES": "1"}
    err = box.once(now=60, env=env).stderr
    assert "is malformed and gets no alert: not an http:// or https:// URL; NO TARGET IS LEFT" in err, err
    assert "other targets" not in err
    r = box.run("notify", "--check", cmd="bin/gpuguard", env=env)
    assert r.returncode == 2 and "no target is left to get alerts" in r.stdout


@pytest.mark.parametrize("name", ["yichuidingyin.sh", "gpu-leak-watch", "gpuguard", "lowprio-run"])
def test_every_command_answers_version(name):
    r = subprocess.run([str(ROOT / "bin" / name), "--version"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout == "%s %s\n" % (name.removesuffix(".sh"), (ROOT / "VERSION").read_text().strip())


def test_notify_check_of_a_misspelt_dingtalk_url_shows_the_example_whole(box):
    """The token masker took the example's closing parenthesis with it:
    "(https://oapi.dingtalk.com/robot/send?access_token=***" and no ")"."""
    box.write_scenario([{"gpus": [idle_gpu()], "apps": []}])
    r = box.run("notify", "--check", cmd="bin/gpuguard",
                env={"NOTIFY_URL": "https://oapi.dingtalk.com/robot/send?acess_token=abc123"})
    assert r.stdout.rstrip("\n").endswith(
        "URL does not look like a dingtalk webhook (https://oapi.dingtalk.com/robot/send?access_token=***)")
    assert "abc123" not in r.stdout + r.stderr


def test_a_textfile_folder_that_is_relative_or_cannot_be_made_says_so_in_one_line(box):
    """A relative GPUGUARD_TEXTFILE_DIR was made wherever the watchdog ran
    (cron's HOME), where node_exporter never looks; one that cannot be made
    printed mkdir's own error before the watchdog's warning."""
    box.write_scenario([{"gpus": [idle_gpu()], "apps": []}])
    r = box.run("--once", env={"GPUGUARD_TEXTFILE_DIR": "prom"})
    assert r.returncode == 2
    assert r.stderr == "yichuidingyin: GPUGUARD_TEXTFILE_DIR must be an absolute path (got 'prom')\n"
    r = box.once(now=60, env={"GPUGUARD_TEXTFILE_DIR": "/etc/passwd/prom"})
    assert r.returncode == 0
    assert "mkdir" not in r.stderr and "textfile folder /etc/passwd/prom cannot be made (Not a directory" in r.stderr
    assert "disk full" not in r.stderr


def test_alertmanager_url_pasted_with_its_api_path_posts_once_to_it_and_labels_keep_the_port(box, sink):
    """ALERTMANAGER_URL pasted as Alertmanager's docs give it
    (http://host:9093/api/v2/alerts) was posted to /api/v2/alerts/api/v2/alerts
    (a real Alertmanager answers 404) while --check said OK; the masked label
    dropped the port (http://127.0.0.1/***). A v1 URL (v1 is gone from
    Alertmanager 0.27) posts to v2; a route prefix is kept."""
    port = sink.url.rsplit(":", 1)[1]
    for given, path in (("/api/v2/alerts", "/api/v2/alerts"), ("/api/v2/alerts/", "/api/v2/alerts"),
                        ("/api/v1/alerts", "/api/v2/alerts"), ("/am/api/v2/alerts", "/am/api/v2/alerts"),
                        ("", "/api/v2/alerts")):
        before = len(sink.requests)
        env = {"ALERTMANAGER_URL": sink.url + given}
        r = box.run("notify", "--check", cmd="bin/gpuguard", env=env)
        assert r.returncode == 0 and r.stdout.startswith("OK\talertmanager http://127.0.0.1:%s/***\t" % port), r.stdout
        r = box.run("notify", "--test", cmd="bin/gpuguard", env=env)
        assert (r.returncode, r.stdout) == (0, "sent     alertmanager http://127.0.0.1:%s/***: HTTP 200\n" % port)
        assert [q["path"] for q in sink.requests[before:]] == [path], given


def test_an_upper_case_scheme_is_a_url_and_ipv6_labels_keep_brackets_and_port(box, sink):
    """NOTIFY_URL=HTTPS://... (as some chat clients copy it) was "malformed:
    not an http:// or https:// URL", although a scheme is case-insensitive;
    an IPv6 target was shown as http://::1/***."""
    port = sink.url.rsplit(":", 1)[1]
    env = {"NOTIFY_URL": "HTTP://127.0.0.1:%s/hook" % port, "NOTIFY_TYPE": "generic"}
    r = box.run("notify", "--test", cmd="bin/gpuguard", env=env)
    assert (r.returncode, r.stdout) == (0, "sent     generic http://127.0.0.1:%s/***: HTTP 200\n" % port), r.stdout
    assert sink.requests[-1]["path"] == "/hook"
    box.write_scenario([{"gpus": [idle_gpu()], "apps": []}])
    r = box.once(now=60, env=env)
    assert "malformed" not in r.stderr, r.stderr
    r = box.run("notify", "--check", cmd="bin/gpuguard",
                env={"NOTIFY_URL": "http://[::1]:9/hook", "NOTIFY_TYPE": "generic", "NOTIFY_TIMEOUT": "1"})
    assert "generic http://[::1]:9/***" in r.stdout, r.stdout


def _week_of_gpu_history(state):
    """A week of 8 GPUs at one row a minute: a report that takes a while."""
    state.mkdir(mode=0o700, exist_ok=True)
    with open(state / "gpu-history.tsv", "w") as f:
        f.writelines("%d\t%d\tGPU-%08d-3a23-ca8c-52da-f8eedc850d97\t%d\t20000\t143771\t300.00\t0\t%d:20000\n"
                     % (1796000000 + 60 * i, g, g, i % 100, 1000 + g) for i in range(7 * 1440) for g in range(8))


@pytest.mark.slow  # a hanging webhook and a week of history: seconds each
@pytest.mark.parametrize("args", [["notify", "--test"], ["test-alert"], ["report", "--out", "r.html"]])
def test_ctrl_c_during_a_python_helper_is_one_line_and_exit_130(box, tmp_path, args):
    """Ctrl-C during `gpuguard notify --test` (a webhook that hangs),
    `test-alert` or `report` printed a 30-line KeyboardInterrupt traceback
    and died of the signal. Now: "gpuguard: interrupted", exit 130."""
    import socket
    import threading
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted = threading.Event()
    held = []

    def hang():
        try:
            held.append(listener.accept())
            accepted.set()
        except OSError:
            pass
    threading.Thread(target=hang, daemon=True).start()
    env = dict(box.env, NOTIFY_URL="http://127.0.0.1:%d/hook" % listener.getsockname()[1], NOTIFY_TIMEOUT="30",
               NOTIFY_RETRIES="0")
    if args[0] == "report":
        _week_of_gpu_history(box.state)
        env.pop("NOTIFY_URL")
    try:
        # a new session: the signal goes to its group, as a terminal's ^C
        proc = subprocess.Popen([str(ROOT / "bin/gpuguard"), *args], env=env, cwd=tmp_path, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                preexec_fn=default_signals)

        def helper_running():
            for pid in os.listdir("/proc"):
                try:
                    if pid.isdigit() and os.getpgid(int(pid)) == proc.pid and \
                            b"python/gpuguard_" in open("/proc/%s/cmdline" % pid, "rb").read():
                        return True
                except OSError:
                    pass
            return False
        if args[0] == "report":
            assert wait_for(helper_running, timeout=30)
            time.sleep(0.3)                  # its imports done: in the middle of the report
        else:
            assert accepted.wait(30)         # posted, waiting for an answer that never comes
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert (proc.returncode, err) == (130, "gpuguard: interrupted\n"), err
        assert "Traceback" not in out + err
    finally:
        listener.close()
        for conn, _ in held:
            conn.close()
