"""install.sh, gpuguard doctor and gpuguard status, as a newcomer uses them."""
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile

import pytest
from conftest import ROOT, app, busy_gpu, idle_gpu, require, user_environ, wait_for

COMMANDS = ["yichuidingyin.sh", "gpu-leak-watch", "lowprio-run", "gpuguard"]


def install(args, env=None, cwd=ROOT):
    full = user_environ()
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
    assert stat.S_IMODE(conf.stat().st_mode) == 0o644               # every user's commands read it
    assert stat.S_IMODE((dest / "etc/gpuguard/secrets.conf").stat().st_mode) == 0o600
    assert not re.search(r"^(NOTIFY_URL|NOTIFY_SECRET|ALERTMANAGER_URL)=", conf.read_text(), re.MULTILINE)
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
    # (its blank lines too: install's crontab had every one removed)
    mine = "MAILTO=me@example.com\n\n# nightly backup\n0 3 * * * backup.sh\n"
    tab.write_text(mine)
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
    assert stat.S_IMODE((home / ".config/gpuguard/gpuguard.conf").stat().st_mode) == 0o644
    assert stat.S_IMODE((home / ".config/gpuguard/secrets.conf").stat().st_mode) == 0o600
    assert tab.read_text() == mine + (
        "* * * * * %s/.local/bin/yichuidingyin.sh --once >>%s/.local/state/gpuguard.log 2>&1 # gpuguard\n"
        % (home, home))
    r = subprocess.run([str(ROOT / "install.sh"), "--user", "--uninstall"], env=full, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert tab.read_text() == mine
    assert tree(home) == set()


@pytest.mark.parametrize("args, env, message", [
    (["--prefix="], {}, "install.sh: --prefix needs a folder\n"),
    (["--user"], {"HOME": ""}, "install.sh: --user installs under HOME, which is not set\n"),
])
def test_an_empty_prefix_or_home_is_one_line_and_installs_nothing(tmp_path, args, env, message):
    """`--prefix=$PREFIX` with PREFIX unset installed into /usr/local and
    /etc; `--user` without HOME printed bash's 'HOME: parameter null or not
    set'."""
    r = install(args, env=dict(env, DESTDIR=str(tmp_path / "dest")))
    assert r.returncode == 2 and r.stderr == message
    assert not (tmp_path / "dest").exists()


def user_env(tmp_path, path_dirs=()):
    """An environment for a --user install into tmp_path/home."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    full = {k: v for k, v in os.environ.items() if k not in ("XDG_CONFIG_HOME", "XDG_STATE_HOME")}
    full["HOME"] = str(home)
    full["PATH"] = ":".join([str(d) for d in path_dirs] + [full["PATH"]])
    return home, full


def path_without(tmp_path, name):
    """A PATH holding every command of this machine except `name`."""
    only = tmp_path / ("path-without-" + name)
    only.mkdir()
    for d in os.environ["PATH"].split(":") + ["/usr/sbin", "/sbin"]:
        if not os.path.isdir(d):
            continue
        for cmd in os.listdir(d):
            if cmd != name and not (only / cmd).exists():
                (only / cmd).symlink_to(os.path.join(d, cmd))
    return str(only)


def test_user_cron_without_crontab_installs_nothing(tmp_path):
    home, env = user_env(tmp_path)
    env["PATH"] = path_without(tmp_path, "crontab")
    r = subprocess.run([str(ROOT / "install.sh"), "--user", "--cron"], env=env, capture_output=True, text=True)
    assert r.returncode == 2
    assert "--cron needs the crontab command" in r.stderr and "nothing was installed" in r.stderr
    assert len(r.stderr.splitlines()) == 1
    assert tree(home) == set()


def test_a_failure_part_way_removes_what_the_run_put_in_place(tmp_path):
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "crontab").write_text('#!/bin/sh\n[ "$1" = "-l" ] && exit 0\necho "crontab: cannot write" >&2; exit 1\n')
    (fake / "crontab").chmod(0o755)
    home, env = user_env(tmp_path, [fake])
    r = subprocess.run([str(ROOT / "install.sh"), "--user", "--cron"], env=env, capture_output=True, text=True)
    assert r.returncode != 0
    assert "install failed: what this run had put in place was removed again" in r.stderr
    assert tree(home) == set()                           # no half install, no manifest


def test_cron_without_a_running_daemon_warns_and_says_what_to_do(tmp_path):
    r = install(["--prefix", "/opt/gg", "--cron"], env={"DESTDIR": str(tmp_path / "dest")})
    if subprocess.run(["pgrep", "-x", "cron|crond|cronie|fcron"], capture_output=True).returncode == 0:
        assert "no cron daemon" not in r.stderr
        pytest.skip("a cron daemon runs here: the warning case cannot be shown")
    assert r.returncode == 0, r.stderr
    assert "no cron daemon is running here" in r.stderr and "service cron start" in r.stderr
    # a daemon named cron running: no warning
    daemon = tmp_path / "cron"
    daemon.write_bytes(open("/bin/sleep", "rb").read())
    daemon.chmod(0o755)
    proc = subprocess.Popen([str(daemon), "60"])
    try:
        r = install(["--prefix", "/opt/gg", "--cron"], env={"DESTDIR": str(tmp_path / "dest2")})
        assert r.returncode == 0 and "no cron daemon" not in r.stderr, r.stderr
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("umask", [0o077, 0o000])
def test_modes_do_not_depend_on_the_callers_umask(tmp_path, umask):
    dest = tmp_path / "dest"
    r = subprocess.run(["sh", "-c", "umask %03o; exec \"$@\"" % umask, "sh", str(ROOT / "install.sh"),
                        "--prefix", "/opt/gg", "--cron"], env=user_environ(DESTDIR=str(dest)),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for d, dirs, files in os.walk(dest):
        for name in dirs + files:
            path = os.path.join(d, name)
            if os.path.islink(path):
                continue
            mode = stat.S_IMODE(os.lstat(path).st_mode)
            rel = os.path.relpath(path, dest)
            if rel == "etc/gpuguard/secrets.conf":
                assert mode == 0o600
            elif os.path.isdir(path):
                assert mode == 0o755, rel
            else:
                assert mode in (0o644, 0o755), (rel, oct(mode))
    assert stat.S_IMODE((dest / "opt/gg/lib/gpuguard/bin/lowprio-run").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "etc/gpuguard/gpuguard.conf").stat().st_mode) == 0o644


def test_uninstall_removes_exactly_what_the_manifest_lists(tmp_path):
    dest = tmp_path / "dest"
    (dest / "opt/gg/bin").mkdir(parents=True)
    (dest / "opt/gg/bin/their-tool").write_text("#!/bin/sh\n")          # there before
    env = {"DESTDIR": str(dest)}
    assert install(["--prefix", "/opt/gg"], env=env).returncode == 0
    manifest = (dest / "opt/gg/lib/gpuguard/.install-manifest").read_text().split()
    assert "/opt/gg/bin/their-tool" not in manifest and "/opt/gg/bin" not in manifest
    mine = dest / "opt/gg/lib/gpuguard/etc/my-rules.conf"            # put there after
    mine.write_text("x\n")
    r = install(["--prefix", "/opt/gg", "--uninstall"], env=env)
    assert r.returncode == 0, r.stderr
    assert tree(dest) == {"opt", "opt/gg", "opt/gg/bin", "opt/gg/bin/their-tool", "opt/gg/lib",
                          "opt/gg/lib/gpuguard", "opt/gg/lib/gpuguard/etc", "opt/gg/lib/gpuguard/etc/my-rules.conf"}


SHARED = ["etc/gpuguard/gpuguard.conf", "etc/gpuguard/secrets.conf", "etc/logrotate.d/gpuguard", "etc/cron.d/gpuguard",
          "etc/systemd/system/gpuguard-idle.service", "etc/systemd/system/gpuguard-leak.service"]


@pytest.mark.parametrize("first", ["/opt/a", "/opt/b"])
def test_uninstalling_one_prefix_leaves_the_shared_files_another_install_uses(tmp_path, first):
    """Two installs (/opt/a, then /opt/b, both --cron --systemd): uninstalling
    either removed the shared config, secrets, logrotate, cron and unit
    files the other still used. Now the config stays for the other, the cron
    file and units stay while they run the other's commands, and one line
    says what was left and why; the second uninstall leaves nothing."""
    dest = tmp_path / "dest"
    for system_dir in ("opt", "etc/cron.d", "etc/logrotate.d", "etc/systemd/system"):   # the system had them
        (dest / system_dir).mkdir(parents=True)
    env = {"DESTDIR": str(dest)}
    for prefix in ("/opt/a", "/opt/b"):
        r = install(["--prefix", prefix, "--cron", "--systemd"], env=env)
        assert r.returncode == 0, r.stderr
    other = "/opt/b" if first == "/opt/a" else "/opt/a"
    r = install(["--prefix", first, "--uninstall"], env=env)
    assert r.returncode == 0, r.stderr
    assert not (dest / first.lstrip("/") / "bin").exists()
    left = [line for line in r.stderr.splitlines() if "still uses them" in line]
    assert len(left) == 1 and left[0].endswith(
        "left /etc/gpuguard/gpuguard.conf, /etc/gpuguard/secrets.conf, /etc/logrotate.d/gpuguard: "
        "the gpuguard install in %s still uses them" % other), r.stderr
    for path in SHARED[:3]:
        assert (dest / path).exists(), path
    if first == "/opt/a":       # /opt/b wrote the cron file and units last: they are its own
        assert "/opt/b/bin/yichuidingyin.sh --once" in (dest / "etc/cron.d/gpuguard").read_text()
        assert "ExecStart=/opt/b/bin/yichuidingyin.sh\n" in (dest / SHARED[4]).read_text()
        assert "they run another install's commands, not /opt/a's" in r.stderr
    else:                       # they ran /opt/b's commands, now gone: removed, and /opt/a is told
        assert not (dest / "etc/cron.d/gpuguard").exists() and not (dest / SHARED[4]).exists()
        assert "(the install in /opt/a had them too: install.sh --prefix /opt/a --cron or --systemd " \
            "writes them again)" in r.stderr
    h = subprocess.run([str(dest / other.lstrip("/") / "bin/gpuguard"), "--help"], capture_output=True, text=True)
    assert h.returncode == 0, h.stderr
    r = install(["--prefix", other, "--uninstall"], env=env)
    assert r.returncode == 0, r.stderr
    assert "still uses" not in r.stderr
    assert tree(dest) == {"etc", "etc/cron.d", "etc/logrotate.d", "etc/systemd", "etc/systemd/system", "opt"}


@pytest.mark.parametrize("others", ["/opt/b\n", ""])
def test_uninstalling_one_prefix_keeps_the_disks_iocost_while_another_install_remains(tmp_path, others):
    """`install.sh --uninstall` of /opt/a put the disks' iocost settings back
    (lowprio-run --setup-disk --undo) while the install in /opt/b, whose
    lowprio-run bounds its jobs' disk use with them, stayed. Now the
    settings stay, said in one line; the last install's uninstall puts
    them back."""
    require(os.geteuid() == 0, "the disks' settings are root's")
    fake = tmp_path / "root"
    (fake / "bin").mkdir(parents=True)
    calls = tmp_path / "calls"
    (fake / "bin/lowprio-run").write_text("#!/bin/sh\necho \"$*\" >>%s\n" % calls)
    (fake / "bin/lowprio-run").chmod(0o755)
    state = tmp_path / "state"
    state.mkdir()
    (state / "iocost-saved").write_text("8:0 qos enable=0\n")
    script = ('source lib/common.sh; source lib/install.sh; GPUGUARD_ROOT=$FAKE INSTALL_DEST= '
              'INSTALL_OTHERS=$OTHERS install_undo_disks')
    r = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, FAKE=str(fake), OTHERS=others, GPUGUARD_STATE_DIR=str(state)))
    assert r.returncode == 0, r.stderr
    if others:
        assert not calls.exists()
        assert "left the disks' iocost settings (--setup-disk): the gpuguard install in /opt/b still uses them" \
            in r.stderr
    else:
        assert calls.read_text() == "--setup-disk --undo\n" and r.stderr == ""


def test_uninstalling_one_user_prefix_keeps_the_other_prefixs_crontab_line_and_config(tmp_path):
    """Two --user --cron installs (~/a, then ~/b): uninstalling ~/a removed
    ~/b's watchdog line from the crontab and the config both read."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    tab = tmp_path / "crontab.txt"
    tab.write_text("0 3 * * * backup.sh\n")
    (fake / "crontab").write_text('#!/bin/sh\nif [ "$1" = "-l" ]; then cat %s; else cat > %s.new && mv %s.new %s; fi\n'
                                  % (tab, tab, tab, tab))
    (fake / "crontab").chmod(0o755)
    home, env = user_env(tmp_path, [fake])
    for prefix in ("a", "b"):
        r = subprocess.run([str(ROOT / "install.sh"), "--user", "--cron", "--prefix", str(home / prefix)], env=env,
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    line = "* * * * * %s/b/bin/yichuidingyin.sh --once >>%s/.local/state/gpuguard.log 2>&1 # gpuguard\n" % (home, home)
    assert tab.read_text() == "0 3 * * * backup.sh\n" + line
    r = subprocess.run([str(ROOT / "install.sh"), "--user", "--uninstall", "--prefix", str(home / "a")], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert tab.read_text() == "0 3 * * * backup.sh\n" + line
    assert (home / ".config/gpuguard/gpuguard.conf").exists() and (home / ".config/gpuguard/secrets.conf").exists()
    assert "the gpuguard install in %s/b still uses them" % home in r.stderr
    r = subprocess.run([str(ROOT / "install.sh"), "--user", "--uninstall", "--prefix", str(home / "b")], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert tab.read_text() == "0 3 * * * backup.sh\n"
    assert not (home / ".config/gpuguard").exists()


@pytest.mark.parametrize("own", ["file", "link elsewhere"])
def test_install_never_replaces_a_command_of_ones_own_and_uninstall_never_deletes_one(tmp_path, own):
    """A script of the admin's own at PREFIX/bin/gpuguard was replaced by the
    install's link without a word, and --uninstall then deleted it. Now the
    install refuses in one line (exit 2, the file named, nothing installed),
    and --uninstall keeps a command that is no longer gpuguard's link."""
    dest = tmp_path / "dest"
    mine = dest / "opt/gg/bin/gpuguard"
    mine.parent.mkdir(parents=True)
    if own == "file":
        mine.write_text("#!/bin/sh\necho my own gpuguard\n")
    else:
        mine.symlink_to("/opt/gpuguard-git/bin/gpuguard")
    before = tree(dest)
    env = {"DESTDIR": str(dest)}
    r = install(["--prefix", "/opt/gg"], env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr == "install.sh: /opt/gg/bin/gpuguard: not installed by gpuguard, and an install would replace " \
        "it: move it away or install with another --prefix; nothing was installed\n"
    assert tree(dest) == before
    if own == "file":
        assert mine.read_text() == "#!/bin/sh\necho my own gpuguard\n"
    else:
        assert os.readlink(mine) == "/opt/gpuguard-git/bin/gpuguard"
    # the admin moves it away, installs, then puts it back over the link
    aside = tmp_path / "aside"
    os.rename(mine, aside)
    assert install(["--prefix", "/opt/gg"], env=env).returncode == 0
    mine.unlink()
    os.rename(aside, mine)
    r = install(["--prefix", "/opt/gg", "--uninstall"], env=env)
    assert r.returncode == 0, r.stderr
    assert "kept /opt/gg/bin/gpuguard: it is no longer the link gpuguard installed" in r.stderr
    assert os.path.lexists(mine) and sorted(os.listdir(mine.parent)) == ["gpuguard"]


def test_an_earlier_private_config_without_secrets_becomes_readable(tmp_path):
    dest = tmp_path / "dest"
    conf = dest / "etc/gpuguard/gpuguard.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("THRESHOLD=20\n")
    conf.chmod(0o600)                                     # as version 0.1 installed it
    r = install(["--prefix", "/opt/gg"], env={"DESTDIR": str(dest)})
    assert r.returncode == 0, r.stderr
    assert conf.read_text() == "THRESHOLD=20\n" and stat.S_IMODE(conf.stat().st_mode) == 0o644
    conf.write_text("THRESHOLD=20\nNOTIFY_URL=https://oapi.dingtalk.com/robot/send?access_token=abc\n")
    conf.chmod(0o600)
    r = install(["--prefix", "/opt/gg"], env={"DESTDIR": str(dest)})
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600
    assert "move the NOTIFY_URL, NOTIFY_SECRET and ALERTMANAGER_URL lines into /etc/gpuguard/secrets.conf" in r.stderr
    assert "access_token" not in r.stderr


def test_a_second_user_after_a_root_install_runs_every_command(box):
    """`sudo ./install.sh` (here with root's umask 077), then a real second
    user: the shared config is readable, the secrets are not, and nothing
    exits 2 for want of either; the job always starts."""
    require(os.geteuid() == 0, "needs root to install and to create a second user")
    # the sbin folders may be missing from a user's PATH (make test under a venv)
    sbin = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    tools = {t: shutil.which(t, path=sbin) for t in ("useradd", "runuser", "userdel")}
    require(all(tools.values()), "needs useradd, runuser and userdel (passwd package)")
    top = tempfile.mkdtemp(prefix="gg-second-user-")
    os.chmod(top, 0o755)
    user = "ggtest%d" % os.getpid()
    home = os.path.join(top, "home")
    subprocess.run([tools["useradd"], "-m", "-d", home, "-s", "/bin/bash", user], check=True, capture_output=True)
    try:
        dest = os.path.join(top, "dest")
        r = subprocess.run(["sh", "-c", 'umask 077; exec "$@"', "sh", str(ROOT / "install.sh"), "--prefix", "/opt/gg"],
                           env=user_environ(DESTDIR=dest), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        bin_dir = os.path.join(dest, "opt/gg/bin")
        conf = os.path.join(dest, "etc/gpuguard/gpuguard.conf")
        secrets = os.path.join(dest, "etc/gpuguard/secrets.conf")
        with open(secrets, "w") as f:                       # root's own secret, as an admin would
            f.write("NOTIFY_URL=http://127.0.0.1:9/hook?access_token=root-only\n")
        scenario = os.path.join(top, "scenario.json")
        with open(scenario, "w") as f:
            json.dump({"gpus": [{"index": 0, "uuid": "GPU-1", "name": "NVIDIA H200", "pci.bus_id": "00000000:06:00.0",
                                 "memory.total": 143771, "power.limit": 700.0}],
                       "steps": [{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70.0}],
                                  "apps": []}]}, f)
        os.chmod(scenario, 0o644)

        def as_user(args, config=conf):
            env = ["HOME=" + home, "LANG=C.UTF-8", "PATH=%s:/usr/bin:/bin" % (ROOT / "tests/fakebin"),
                   "FAKE_SMI_SCENARIO=" + scenario]
            if config:
                env.append("GPUGUARD_CONFIG=" + config)
            return subprocess.run([tools["runuser"], "-u", user, "--", "env", "-i"] + env + args, cwd=home,
                                  capture_output=True, text=True, timeout=120)

        assert as_user(["id", "-u"]).stdout.strip() != "0"
        assert as_user(["cat", secrets]).returncode != 0     # the secrets stay root's
        r = as_user([bin_dir + "/lowprio-run", "true"])
        assert r.returncode == 0, r.stderr
        r = as_user([bin_dir + "/lowprio-run", "--tier", "batch", "sh", "-c", "exit 3"])
        assert r.returncode == 3, r.stderr
        for config in (conf, None):                           # named, and the installed tree's own
            r = as_user([bin_dir + "/gpuguard", "doctor"], config=config)
            assert r.returncode in (0, 1), r.stdout + r.stderr
            # the one thing it cannot read is root's secrets.conf, and it says
            # so where it would otherwise say to set a target (d340afa)
            unread = [line for line in (r.stdout + r.stderr).splitlines() if "cannot read" in line]
            assert all(line.endswith("secrets.conf (webhook URLs and secrets): run as its owner or root "
                                     "(events still go to events.jsonl)") for line in unread), unread
            assert "OK    nvidia-smi answers" in r.stdout and "OK    python3" in r.stdout
            assert "root-only" not in r.stdout + r.stderr
    finally:
        subprocess.run([tools["userdel"], "-r", user], capture_output=True)
        shutil.rmtree(top, ignore_errors=True)


def test_version():
    r = install(["--version"])
    assert r.returncode == 0 and r.stdout == "install.sh %s\n" % (ROOT / "VERSION").read_text().strip()
    r = subprocess.run([str(ROOT / "bin/lowprio-run"), "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "lowprio-run %s\n" % (ROOT / "VERSION").read_text().strip()


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


def test_doctor_compares_the_textfile_folder_with_what_node_exporter_reads(box, tmp_path):
    """A typo in GPUGUARD_TEXTFILE_DIR went unnoticed: the watchdog made
    the folder and node_exporter never read it."""
    box.write_scenario([{"gpus": [idle_gpu()], "apps": []}])
    reads = tmp_path / "node-exporter"
    fake = tmp_path / "node_exporter"
    fake.write_text("#!/bin/sh\nsleep 60\n")
    fake.chmod(0o755)
    exporter = subprocess.Popen([str(fake), "--collector.textfile.directory", str(reads)])
    try:
        assert wait_for(lambda: "node_exporter" in open("/proc/%d/comm" % exporter.pid).read())
        r = box.run("doctor", cmd="bin/gpuguard", env={"GPUGUARD_TEXTFILE_DIR": str(tmp_path / "node-exportr")})
        # (a node_exporter of the machine's own may be named first)
        assert "WARN  textfile metrics go to %s, but node_exporter (PID " % (tmp_path / "node-exportr") in r.stdout
        assert "OK    textfile metrics" not in r.stdout, r.stdout
        r = box.run("doctor", cmd="bin/gpuguard", env={"GPUGUARD_TEXTFILE_DIR": str(reads) + "/"})
        assert "OK    textfile metrics in %s/, which node_exporter (PID %d) reads" % (reads, exporter.pid) in r.stdout
    finally:
        exporter.kill()
        exporter.wait()


def test_status_table_with_idle_counter_and_sparkline(box):
    box.write_scenario([{"gpus": [idle_gpu(util=u)], "apps": [app(1410)]} for u in (50, 0, 0, 0, 0)])
    for t in range(4):
        box.once(now=t)
    r = box.run("status", cmd="bin/gpuguard")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["GPU", "UTIL", "MEMORY", "POWER", "IDLE", "STUCK", "STATE", "RECENT", "UTIL"]
    # the idle and stuck counters against their limits (issue 24)
    assert lines[1].split()[:10] == ["0", "0%", "2576/143771", "MiB", "76W", "idle", "3/3", "stuck", "0/5", "IDLE"]
    assert lines[1].split()[10] == "▄▁▁▁"
    # a PID the double invents is no process here: named by PID, marked
    assert lines[2].split()[:2] == ["pid", "1410"] and "python3 (not visible here)" in lines[2]


def test_status_does_not_call_a_gpu_idle_once_its_job_has_freed_it(box):
    # the alert fired; the job then ended and no watchdog cycle has run since
    # (the daemon was stopped, or cron's next minute has not come): the
    # sample shows the GPU free, so status must not send anyone to an idle job
    box.write_scenario([{"gpus": [idle_gpu(util=0)], "apps": [app(1410)]}] * 3)
    for t in range(3):
        box.once(now=t)
    assert box.run("status", cmd="bin/gpuguard").stdout.splitlines()[1].split()[9] == "IDLE"
    box.write_scenario([{"gpus": [idle_gpu(util=0, mem=0)], "apps": []}])
    r = box.run("status", cmd="bin/gpuguard")
    assert r.returncode == 0, r.stderr
    line = r.stdout.splitlines()[1].split()
    assert line[:3] == ["0", "0%", "0/143771"] and line[9] == "freed", r.stdout
    gpu = json.loads(box.run("status", "--json", cmd="bin/gpuguard").stdout)["gpus"][0]
    assert gpu["state"] == "freed" and gpu["processes"] == []
    # and busy again: the open alert is about to resolve, the GPU is busy
    box.write_scenario([{"gpus": [busy_gpu()], "apps": [app(1410)]}])
    assert box.run("status", cmd="bin/gpuguard").stdout.splitlines()[1].split()[9] == "busy"
