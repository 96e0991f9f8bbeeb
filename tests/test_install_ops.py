"""install.sh, gpuguard doctor and gpuguard status, as a newcomer uses them."""
import os
import stat
import subprocess

import pytest

from conftest import ROOT, app, idle_gpu

COMMANDS = ["yichuidingyin.sh", "gpu-leak-watch", "lowprio-run", "gpuguard"]


def install(args, env=None, cwd=ROOT):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run([str(ROOT / "install.sh")] + args, env=full, cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def tree(root):
    out = set()
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            out.add(os.path.relpath(os.path.join(d, name), root))
    return out


def test_install_runs_from_anywhere_and_uninstall_leaves_nothing(tmp_path):
    dest = tmp_path / "dest"
    (dest / "etc/cron.d").mkdir(parents=True)            # a folder the system already had
    r = install(["--prefix", "/opt/gg", "--cron"], env={"DESTDIR": str(dest)})
    assert r.returncode == 0, r.stderr
    bin_dir = dest / "opt/gg/bin"
    assert sorted(os.listdir(bin_dir)) == sorted(COMMANDS)
    for cmd in COMMANDS:
        h = subprocess.run([str(bin_dir / cmd), "--help"], cwd="/", capture_output=True, text=True)
        assert h.returncode == 0 and h.stdout.startswith("Summary:"), (cmd, h.stderr)
    v = subprocess.run([str(bin_dir / "gpuguard"), "version"], cwd="/", capture_output=True, text=True)
    assert v.stdout == "gpuguard %s\n" % (ROOT / "VERSION").read_text().strip()
    conf = dest / "etc/gpuguard/gpuguard.conf"
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600
    assert (dest / "etc/cron.d/gpuguard").read_text().splitlines()[-1] == \
        "* * * * * root /opt/gg/bin/yichuidingyin.sh --once >>/var/log/gpuguard.log 2>&1"
    first = tree(dest)
    assert install(["--prefix", "/opt/gg", "--cron"], env={"DESTDIR": str(dest)}).returncode == 0
    assert tree(dest) == first                           # idempotent
    r = install(["--prefix", "/opt/gg", "--uninstall"], env={"DESTDIR": str(dest)})
    assert r.returncode == 0, r.stderr
    assert tree(dest) == {"etc", "etc/cron.d"}


def test_installed_watchdog_works_from_another_directory(tmp_path, box):
    dest = tmp_path / "dest"
    assert install(["--prefix", "/opt/gg"], env={"DESTDIR": str(dest)}).returncode == 0
    box.write_scenario([{"gpus": [idle_gpu()], "apps": [app(1410)]}] * 3)
    for t in range(3):
        r = box.run("--once", cmd="../" * 20 + str(dest / "opt/gg/bin/yichuidingyin.sh").lstrip("/"),
                    env={"GPUGUARD_NOW": str(t)})
        assert r.returncode == 0, r.stderr
    assert [e["state"] for e in box.events()] == ["firing"]


def test_edited_config_is_kept_on_reinstall_and_uninstall(tmp_path):
    dest = tmp_path / "dest"
    env = {"DESTDIR": str(dest)}
    assert install(["--prefix", "/opt/gg"], env=env).returncode == 0
    conf = dest / "etc/gpuguard/gpuguard.conf"
    conf.write_text("NOTIFY_URL=http://127.0.0.1:9/hook\n")
    r = install(["--prefix", "/opt/gg"], env=env)
    assert "kept your edited /etc/gpuguard/gpuguard.conf" in r.stderr
    assert conf.read_text() == "NOTIFY_URL=http://127.0.0.1:9/hook\n"
    r = install(["--prefix", "/opt/gg", "--uninstall"], env=env)
    assert r.returncode == 0 and conf.exists()


def test_user_install_with_crontab(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    fake = tmp_path / "fakebin"
    fake.mkdir()
    tab = tmp_path / "crontab.txt"
    tab.write_text("0 3 * * * backup.sh\n")
    (fake / "crontab").write_text('#!/bin/sh\nif [ "$1" = "-l" ]; then cat %s; else cat > %s.new && mv %s.new %s; fi\n'
                                  % (tab, tab, tab, tab))
    (fake / "crontab").chmod(0o755)
    env = {"HOME": str(home), "PATH": "%s:%s" % (fake, os.environ["PATH"]), "XDG_CONFIG_HOME": "", "XDG_STATE_HOME": ""}
    env = {k: v for k, v in env.items() if v}
    full = {k: v for k, v in os.environ.items() if k not in ("XDG_CONFIG_HOME", "XDG_STATE_HOME")}
    full.update(env)
    for _ in range(2):
        r = subprocess.run([str(ROOT / "install.sh"), "--user", "--cron"], env=full, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    assert (home / ".local/bin/gpuguard").exists()
    assert stat.S_IMODE((home / ".config/gpuguard/gpuguard.conf").stat().st_mode) == 0o600
    lines = tab.read_text().splitlines()
    assert lines == ["0 3 * * * backup.sh",
                     "* * * * * %s/.local/bin/yichuidingyin.sh --once >>%s/.local/state/gpuguard.log 2>&1 # gpuguard"
                     % (home, home)]
    r = subprocess.run([str(ROOT / "install.sh"), "--user", "--uninstall"], env=full, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert tab.read_text().splitlines() == ["0 3 * * * backup.sh"]
    assert tree(home) == set()


def test_systemd_refused_where_systemd_is_not_running():
    if os.path.isdir("/run/systemd/system") and open("/proc/1/comm").read().strip() == "systemd":
        pytest.skip("systemd runs here")
    r = install(["--prefix", "/opt/gg", "--systemd"])
    assert r.returncode == 2 and "systemd is not running here" in r.stderr


def test_systemd_units_staged(tmp_path):
    dest = tmp_path / "dest"
    assert install(["--prefix", "/opt/gg", "--systemd"], env={"DESTDIR": str(dest)}).returncode == 0
    unit = (dest / "etc/systemd/system/gpuguard-idle.service").read_text()
    assert "ExecStart=/opt/gg/bin/yichuidingyin.sh\n" in unit


def test_doctor_without_nvidia_smi_says_so_and_fails(box):
    r = box.run("doctor", cmd="bin/gpuguard", env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 1
    assert "FAIL  nvidia-smi: 'nvidia-smi' not found" in r.stdout


def test_doctor_reports_hidden_processes_and_mig(box):
    box.write_scenario([{"gpus": [{"utilization.gpu": "[N/A]", "memory.used": 9000, "power.draw": 80.0,
                                   "mig.mode.current": "Enabled"}],
                         "apps": [app(999999999)]}])
    r = box.run("doctor", cmd="bin/gpuguard")
    assert r.returncode == 0, r.stdout
    assert "MIG is on" in r.stdout
    assert "1 of 1 compute PIDs are not visible here: a container PID namespace" in r.stdout
    assert "WARN  no alert target" in r.stdout
    assert "OK    python3:" in r.stdout


def test_status_table_with_idle_counter_and_sparkline(box):
    box.write_scenario([{"gpus": [idle_gpu(util=u)], "apps": [app(1410)]} for u in (50, 0, 0, 0, 0)])
    for t in range(4):
        box.once(now=t)
    r = box.run("status", cmd="bin/gpuguard")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["GPU", "UTIL", "MEMORY", "POWER", "IDLE", "STATE", "RECENT", "UTIL"]
    assert lines[1].split()[:7] == ["0", "0%", "2576/143771", "MiB", "76W", "3", "IDLE"]
    assert lines[1].split()[7] == "▄▁▁▁"
    assert lines[2].split()[:3] == ["pid", "1410", "python3"]
