"""gpuguard report: made from recorded H200 histories (tests/report_fixtures.py:
a leak, a healthy warm-up, an idle incident), run as a user types it, then
loaded in headless Chromium (tests/cdp.py): no console errors, the expected
series, labels, markers and links, hover values, a screenshot."""
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import threading

import cdp
import pytest
import report_fixtures as fx
from conftest import ROOT, app, idle_gpu, require, user_environ, wait_for

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    base = tmp_path_factory.mktemp("story")
    state = base / "state"
    fx.build(state)
    return state


def gg_report(state, *args, cwd=None, cmd="bin/gpuguard"):
    env = user_environ(GPUGUARD_CONFIG="/dev/null", GPUGUARD_STATE_DIR=str(state), GPUGUARD_HOST="h200-demo",
               TZ="UTC")
    verb = ["report"]
    return subprocess.run([str(ROOT / cmd)] + verb + list(args), env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def page(story, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "report.html"
    r = gg_report(story, "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("wrote %s (2 GPUs, 2 processes" % out)
    return out


def rows_of(html_text, table_id):
    table = re.search(r"<table id='%s'>(.*?)</table>" % table_id, html_text, re.DOTALL).group(1)
    return re.findall(r"<tr class='([^']*)'>(.*?)</tr>", table, re.DOTALL)


def has_id(html_text, element_id):
    return re.search(r"""id=['"]%s['"]""" % re.escape(element_id), html_text) is not None


# ------------------------------------------------------------ the command --

@pytest.mark.parametrize("args, message", [
    (["--since", "yesterday"], "--since takes 90m, 24h, 7d"),
    (["--since"], "--since needs a value"),
    # a start before 1970 had printed "nothing was recorded since -711-01-10",
    # one past what a float holds an OverflowError traceback, exit 1
    (["--since", "999999d"], "--since 999999d is out of range: it starts before 1970"),
    (["--since", "99999999999999999999d"], "--since 99999999999999999999d is out of range"),
    (["--since", "1900-01-01"], "--since 1900-01-01 is out of range"),
    (["--pid", "12x"], "--pid needs a whole number"),
    (["--gpu", "-1"], "--gpu needs a whole number"),
    (["--out", ""], "--out needs a file name"),
    (["--colour"], "unknown option '--colour' for 'report'"),
])
def test_bad_values_exit_2_with_one_line(story, tmp_path, args, message):
    r = gg_report(story, *args, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("gpuguard: ") and message in r.stderr and len(r.stderr.splitlines()) == 1
    assert os.listdir(tmp_path) == []                                   # nothing written


def test_out_naming_a_folder_is_refused(story, tmp_path):
    r = gg_report(story, "--out", str(tmp_path))
    assert r.returncode == 2 and "is a folder" in r.stderr


def test_report_is_self_contained_with_summary_alerts_and_anchors(page):
    text = page.read_text()
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", text) and "<link" not in text and "@import" not in text
    assert "https://" not in text and "http://" not in text
    summary = rows_of(text, "summary-table")
    assert [cls for cls, _ in summary] == ["row-LEAK", "row-healthy"]
    leak_row = summary[0][1]
    assert "python3 (pid 1328)" in leak_row and "(in " in leak_row and "+3" in leak_row    # growth, OOM time
    # named by the leak watcher's record: the command line, whole on hover
    assert "python3 train.py --config cfg1328.yaml --run-name qwen7b-sf…" in leak_row
    assert "title='python3 train.py --config cfg1328.yaml --run-name qwen7b-sft-lr2e-5 --hf-token *** · in " \
        "/home/alice/sft · started " in leak_row and "user alice" in leak_row
    assert "none (not growing)" in summary[1][1]
    alerts = rows_of(text, "alerts-table")
    # the leak warned first (a job that never gave memory back is not paged
    # by the slow tier), then the fast tier escalated it: two rows, each
    # saying the level it was sent at
    assert [cls for cls, _ in alerts] == ["firing", "firing", "resolved", "firing"]
    # every alert links to a chart that exists
    for _, row in alerts:
        target = re.search(r"href='#([^']+)'", row).group(1)
        assert has_id(text, target), target
    assert "leak firing (warning): pid 1328" in alerts[0][1] and "href='#proc-1328-" in alerts[0][1]
    assert "leak firing (critical, was warning): pid 1328" in alerts[3][1] and "href='#proc-1328-" in alerts[3][1]
    assert "idle firing: GPU 1" in alerts[1][1] and "href='#gpu-1'" in alerts[1][1]
    # the report was atomically written: no temporary file left beside it
    assert sorted(os.listdir(page.parent)) == ["report.html"]


def test_filters_by_pid_gpu_and_since(story, tmp_path):
    out = tmp_path / "r.html"
    r = gg_report(story, "--pid", "1329", "--out", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert [c for c, _ in rows_of(text, "summary-table")] == ["row-healthy"]
    assert has_id(text, "gpu-1") and not has_id(text, "gpu-0")
    r = gg_report(story, "--gpu=0", "--out", str(out))
    text = out.read_text()
    assert r.returncode == 0 and [c for c, _ in rows_of(text, "summary-table")] == ["row-LEAK"]
    assert has_id(text, "gpu-0") and not has_id(text, "gpu-1")
    r = gg_report(story, "--since", str(fx.T0 + 10 * 86400), "--out", str(out))
    text = out.read_text()
    assert r.returncode == 0 and "No process history matches the filters" in text and "No alert" in text


def test_legend_shows_the_job_identity_from_the_alerts(story, tmp_path):
    state = tmp_path / "state"
    shutil.copytree(story, state)
    with open(state / "events.jsonl", "a") as f:
        f.write(json.dumps({"ts": fx.T0 + 3000, "event": "gpu_idle", "state": "reminder", "gpu": 1,
                            "processes": [{"pid": 1329, "name": "python3"}],
                            "job": {"user": "alice", "pid": 1329, "pids": [1329],
                                    "cmdline": "torchrun --nproc 8 train.py --token=***", "slurm_job": "4242"}}) + "\n")
    out = tmp_path / "r.html"
    assert gg_report(state, "--out", str(out)).returncode == 0
    row = rows_of(out.read_text(), "summary-table")[1][1]
    assert "torchrun --nproc 8 train.py --token=***" in row and "user alice" in row and "slurm 4242" in row


def test_gpu_leak_watch_report_still_works(story, tmp_path):
    out = tmp_path / "leak.html"
    r = gg_report(story, "--out", str(out), cmd="bin/gpu-leak-watch")
    assert r.returncode == 0, r.stderr
    assert "id='summary-table'" in out.read_text() and "python3 (pid 1328)" in out.read_text()


def test_empty_state_folder_says_what_to_run(tmp_path):
    out = tmp_path / "r.html"
    r = gg_report(tmp_path / "nothing", "--out", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "run <code>gpu-leak-watch</code>" in text and "yichuidingyin.sh" in text


# ------------------------------------------------------ where --out points --
# --out names where the HTML goes, as a shell's > does, but what is there is
# never replaced: the rename of an atomic write had turned /dev/full (as
# root), a FIFO and a link to /proc/self/fd/1 into regular files, exit 0.

BOTH = ["bin/gpuguard", "bin/gpu-leak-watch"]


def prog_of(cmd):
    """The name a command's messages start with."""
    return os.path.basename(cmd)


def _read_fifo_in_background(fifo):
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    return reader, got


@pytest.mark.parametrize("cmd", BOTH)
def test_out_writes_through_a_fifo_and_leaves_it_a_fifo(tmp_path, cmd):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader, got = _read_fifo_in_background(fifo)
    r = gg_report(tmp_path / "nothing", "--out", str(fifo), cmd=cmd)
    reader.join(30)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert got and got[0].startswith(b"<!doctype html>") and got[0].rstrip().endswith(b"</html>")


@pytest.mark.parametrize("cmd", BOTH)
@pytest.mark.parametrize("target", ["mine.html", "/proc/self/fd/1"])
def test_out_naming_a_symlink_is_refused_and_the_link_kept(tmp_path, cmd, target):
    folder = tmp_path / "out"
    folder.mkdir()
    mine = folder / "mine.html"
    mine.write_text("my own notes\n")
    link = folder / "link.html"
    link.symlink_to(target)
    r = gg_report(tmp_path / "nothing", "--out", str(link), cmd=cmd)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == "%s: --out %s is a symbolic link (to %s), neither followed nor replaced: " \
        "name the file itself\n" % (prog_of(cmd), link, target)
    assert os.readlink(link) == target and mine.read_text() == "my own notes\n"
    assert r.stdout == ""                  # not followed into stdout either
    assert sorted(os.listdir(folder)) == ["link.html", "mine.html"]     # no temporary file left


@pytest.mark.parametrize("cmd", BOTH)
def test_out_to_character_devices_writes_through_them(tmp_path, cmd):
    # /dev/null and /dev/full made in tmp_path: the real /dev is never touched
    require(os.geteuid() == 0, "mknod of a character device needs root")
    require(not os.statvfs(tmp_path).f_flag & os.ST_NODEV, "tmp_path is on a nodev mount: its devices cannot be opened")
    folder = tmp_path / "out"
    folder.mkdir()
    null, full = folder / "null", folder / "full"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.mknod(full, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    r = gg_report(tmp_path / "nothing", "--out", str(null), cmd=cmd)
    assert r.returncode == 0 and r.stdout.startswith("wrote %s (" % null), r.stderr
    r = gg_report(tmp_path / "nothing", "--out", str(full), cmd=cmd)
    assert (r.returncode, r.stderr) == (1, "%s report: cannot write %s: No space left on device\n"
                                        % (prog_of(cmd), full))
    for dev, minor in ((null, 3), (full, 7)):
        st = os.lstat(dev)
        assert stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == 1 and os.minor(st.st_rdev) == minor
    assert sorted(os.listdir(folder)) == ["full", "null"]


@pytest.mark.parametrize("cmd", BOTH)
@pytest.mark.parametrize("out", ["-", "/dev/stdout"])
def test_out_dash_or_dev_stdout_writes_the_html_to_stdout(tmp_path, cmd, out):
    r = gg_report(tmp_path / "nothing", "--out", out, cmd=cmd, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("<!doctype html>") and r.stdout.rstrip().endswith("</html>")
    # the summary line beside the HTML, not in it
    assert r.stderr.startswith("wrote %s (0 GPUs, 0 processes, " % ("stdout" if out == "-" else out))
    assert not [n for n in os.listdir(tmp_path) if n != "nothing"]


def test_out_to_a_process_substitution(tmp_path):
    got = tmp_path / "got.html"
    env = user_environ(GPUGUARD_CONFIG="/dev/null", GPUGUARD_STATE_DIR=str(tmp_path / "nothing"))
    r = subprocess.run(["bash", "-c", 'gpuguard report --out >(cat > "$1"); wait', "-", str(got)],
                       env=dict(env, PATH="%s:%s" % (ROOT / "bin", env["PATH"])), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert wait_for(lambda: got.exists() and got.read_text().rstrip().endswith("</html>"), timeout=10)


def test_out_naming_a_descriptor_that_is_not_open_is_refused(tmp_path):
    r = gg_report(tmp_path / "nothing", "--out", "/dev/fd/57")
    assert (r.returncode, r.stderr) == (2, "gpuguard: --out /dev/fd/57: descriptor 57 is not open\n")


@pytest.mark.parametrize("cmd", BOTH)
def test_out_into_a_missing_folder_is_one_line_naming_it(tmp_path, cmd):
    # was Python's "[Errno 2] ... '.x.html.b66c123b510b.tmp'", exit 1
    r = gg_report(tmp_path / "nothing", "--out", "nodir/x.html", cmd=cmd, cwd=tmp_path)
    assert (r.returncode, r.stderr) == (2, "%s: --out nodir/x.html: folder nodir does not exist\n" % prog_of(cmd))
    (tmp_path / "afile").write_text("")
    r = gg_report(tmp_path / "nothing", "--out", "afile/x.html", cmd=cmd, cwd=tmp_path)
    assert (r.returncode, r.stderr) == (2, "%s: --out afile/x.html: afile is not a folder\n" % prog_of(cmd))
    assert not (tmp_path / "nodir").exists() and (tmp_path / "afile").read_text() == ""


def as_nobody_when_root(argv, state):
    """argv run as user nobody when the tests run as root (root may write in
    any folder), else as is; state is handed to nobody."""
    if os.geteuid() != 0:
        return argv
    import pwd
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        require(False, "needs a second user: nobody")
    require(shutil.which("setpriv"), "needs setpriv to drop to user nobody")
    os.chown(state, nobody.pw_uid, nobody.pw_gid)
    return ["setpriv", "--reuid", str(nobody.pw_uid), "--regid", str(nobody.pw_gid), "--clear-groups"] + argv


@pytest.mark.parametrize("cmd", BOTH)
def test_out_into_a_folder_not_writable_is_one_line_naming_it(cmd):
    base = tempfile.mkdtemp(prefix="gpuguard-out-")      # pytest's tmp is root's only
    try:
        os.chmod(base, 0o755)
        closed, state = os.path.join(base, "closed"), os.path.join(base, "state")
        os.mkdir(closed, 0o555)
        os.mkdir(state, 0o700)
        argv = as_nobody_when_root([str(ROOT / cmd), "report", "--out", closed + "/r.html"], state)
        r = subprocess.run(argv, env=user_environ(GPUGUARD_CONFIG="/dev/null", GPUGUARD_STATE_DIR=state),
                           cwd=base, capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stderr) == (2, "%s: --out %s/r.html: folder %s is not writable\n"
                                            % (prog_of(cmd), closed, closed))
        assert os.listdir(closed) == []
    finally:
        shutil.rmtree(base)


# ------------------------------------------- gpu-leak-watch report agrees --

@pytest.mark.parametrize("cmd", BOTH)
def test_report_of_no_history_creates_nothing_and_says_so(tmp_path, cmd):
    # a state folder that is not there, and one that cannot be made even by
    # root: a report only reads it (gpu-leak-watch report had refused the
    # second, "is not writable", exit 2, and made history/ and outbox/ in the
    # first, and both commands wrote an empty report as if the box were quiet)
    (tmp_path / "a-file").write_text("")
    for state in (tmp_path / "none", tmp_path / "a-file" / "state"):
        out = tmp_path / "r.html"
        r = gg_report(state, "--out", str(out), cmd=cmd)
        assert r.returncode == 0, r.stderr
        assert re.fullmatch(r"wrote %s \(0 GPUs, 0 processes, \d+ KiB\); nothing recorded in %s yet: "
                            r"yichuidingyin.sh and gpu-leak-watch record there\n" % (re.escape(str(out)),
                                                                                     re.escape(str(state))),
                            r.stdout), r.stdout
        assert r.stderr == "" and "run <code>gpu-leak-watch</code>" in out.read_text()
    assert sorted(os.listdir(tmp_path)) == ["a-file", "r.html"]          # no state folder made


@pytest.mark.parametrize("cmd", BOTH)
def test_pid_gpu_and_since_filter_both_commands_alike(story, tmp_path, cmd):
    out = tmp_path / "r.html"
    r = gg_report(story, "--pid", "99999", "--out", str(out), cmd=cmd)
    # gpu-leak-watch report had dropped --pid silently: the whole report, no word
    assert (r.returncode, r.stderr) == (0, "%s: --pid 99999 matches no process in the history\n" % prog_of(cmd))
    assert r.stdout.startswith("wrote %s (0 GPUs, 0 processes, " % out) and "nothing recorded" not in r.stdout
    r = gg_report(story, "--pid=1329", "--out", str(out), cmd=cmd)
    assert r.returncode == 0 and [c for c, _ in rows_of(out.read_text(), "summary-table")] == ["row-healthy"]
    r = gg_report(story, "--gpu", "0", "--since", str(fx.T0), "--out", str(out), cmd=cmd)
    assert r.returncode == 0 and [c for c, _ in rows_of(out.read_text(), "summary-table")] == ["row-LEAK"]


@pytest.mark.parametrize("args", [["--all"], ["--match", "train"], ["--once"], ["--interval", "5"],
                                  ["--", "true"], ["--colour"]])
def test_gpu_leak_watch_report_refuses_a_watch_option(story, tmp_path, args):
    r = gg_report(story, *args, cmd="bin/gpu-leak-watch", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (2, "gpu-leak-watch: unknown option '%s' for 'report' (see --help)\n" % args[0])
    assert os.listdir(tmp_path) == []                                   # nothing written


# --------------------------------------------------------- GPU history file --

def test_gpu_history_rows_are_bounded_and_never_follow_a_link(box):
    box.write_scenario([{"gpus": [idle_gpu()], "apps": [app(1410), app(1411, mem=20)]}] * 40)
    env = {"GPU_HISTORY_MAX_BYTES": "600"}
    for t in range(40):
        box.once(now=1000 + t, env=env)
    hist = box.state / "gpu-history.tsv"
    rows = [line.split("\t") for line in hist.read_text().splitlines()]
    assert rows[0][0] == "# ts" and len(rows[1]) == 9
    assert rows[-1][:3] == ["1039", "0", rows[1][2]] and rows[-1][7:] == ["2", "1410:2556,1411:20"]  # idle alert firing
    assert hist.stat().st_size < 600 + 200 and (box.state / "gpu-history.tsv.1").stat().st_size < 600 + 200
    hist.unlink()
    target = box.tmp / "elsewhere"
    target.write_text("mine\n")
    hist.symlink_to(target)
    r = box.run("--once", env={"GPUGUARD_NOW": "2000"})
    assert r.returncode == 0 and target.read_text() == "mine\n" and "symbolic link" in r.stderr


# ---------------------------------------------------------------- browser --

@pytest.fixture(scope="module")
def browser():
    require(cdp.available(), "chromium not installed (Debian package chromium)")
    b = cdp.Browser()
    yield b
    b.close()


def test_report_in_headless_chromium(browser, page, tmp_path):
    browser.load(page.as_uri())
    assert browser.problems() == []
    assert browser.eval("document.documentElement.dataset.errors || ''") == ""
    assert int(browser.eval("document.documentElement.dataset.loadMs")) >= 0
    charts = browser.eval("[...document.querySelectorAll('svg.chart')].map(s => s.id)")
    assert charts == ["svg-gpu-0", "svg-gpu-1", "svg-proc-0", "svg-proc-1"]
    series = browser.eval("""Object.fromEntries([...document.querySelectorAll('svg.chart')].map(s =>
        [s.id, [...s.querySelectorAll('path.s')].map(p => p.dataset.name + ':' + p.getAttribute('d').length)]))""")
    for sid in ("svg-gpu-0", "svg-gpu-1"):
        assert [x.split(":")[0] for x in series[sid]] == ["utilization", "memory used"]
    for sid in ("svg-proc-0", "svg-proc-1"):
        assert [x.split(":")[0] for x in series[sid]] == ["memory", "floor"]
        assert all(int(x.split(":")[1]) > 50 for x in series[sid])       # real paths, not stubs
    leak = "document.getElementById('svg-proc-0')"
    assert browser.eval(leak + ".querySelectorAll('line.trend, line.proj, line.cap, circle.oom').length") == 4
    assert "capacity for this process" in browser.eval(leak + ".textContent")
    assert browser.eval(leak + ".querySelectorAll('g.marker.firing').length") == 2     # warned, then paged
    headings = browser.eval("[...document.querySelectorAll('section.proc h2')].map(h => h.textContent)")
    assert headings[0].startswith("LEAK python3 (pid 1328)") and headings[1].startswith("healthy python3 (pid 1329)")
    legend = browser.eval("document.querySelector('section.proc .legend').textContent")
    assert "projected OOM: 12-02" in legend and "trend +" in legend
    # the idle incident: shaded, and its alert and resolution marked, on GPU 1 only
    gpu1 = "document.getElementById('svg-gpu-1')"
    assert browser.eval(gpu1 + ".querySelectorAll('rect.idle2').length") >= 2       # both panels
    assert browser.eval("[...%s.querySelectorAll('g.marker')].map(m => m.getAttribute('class'))" % gpu1) == \
        ["marker firing", "marker resolved"]
    assert browser.eval("document.querySelectorAll('#svg-gpu-0 rect.idle1, #svg-gpu-0 rect.idle2').length") == 0
    # memory axes scaled to the data: GPU 1 holds 3.2-4.2 GiB, its axis does not start at 0
    lo = browser.eval(gpu1 + ".querySelectorAll('g.panel')[1].dataset.lo")
    assert 2800 < float(lo) < 3300
    # hover read-out
    tip = browser.eval("gpuguardHover('svg-gpu-1', 0.5)")
    assert re.fullmatch(r"2026-12-02 \d\d:\d\d\nutilization: 0 %\nmemory used: 4\d{3} MiB", tip), tip
    tip = browser.eval("gpuguardHover('svg-proc-0', 0.2)")
    assert "memory: " in tip and "floor: " in tip
    # one click from an alert to its chart
    browser.eval("document.querySelector(\"#alerts-table a[href^='#proc-']\").click()")
    assert browser.eval("location.hash").startswith("#proc-1328-")
    assert browser.eval("document.querySelector(':target').id") == browser.eval("location.hash").lstrip("#")
    top = browser.eval("document.querySelector(':target').getBoundingClientRect().top")
    assert 0 <= top < browser.eval("innerHeight") - 200                 # its chart is on screen
    shot = tmp_path / "report.png"
    browser.eval("window.scrollTo(0, 0)")
    browser.screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20000
    assert browser.problems() == []


def test_a_launcher_is_charted_on_the_gpu_its_children_hold(tmp_path):
    # the leak watcher's series is the process tree's root (a launcher holding
    # no GPU memory); nvidia-smi lists the child that does
    job = subprocess.Popen(["bash", "-c", "sleep 60 & wait"])
    try:
        assert wait_for(lambda: open("/proc/%d/task/%d/children" % (job.pid, job.pid)).read().strip(), timeout=10)
        child = int(open("/proc/%d/task/%d/children" % (job.pid, job.pid)).read().split()[0])
        start = open("/proc/%d/stat" % job.pid).read().rsplit(")", 1)[1].split()[19]
        state = tmp_path / "state"
        (state / "history").mkdir(parents=True)
        (state / "history" / ("%d-%s.csv" % (job.pid, start))).write_text(
            "timestamp,pid,used_memory_mib\n" + "".join("%d,%d,%d\n" % (1000 + 60 * i, job.pid, 5000 + i)
                                                         for i in range(30)))
        (state / "gpu-history.tsv").write_text("".join(
            "%d\t%d\tGPU-%d\t90\t%d\t143771\t600\t0\t%s\n" % (1000 + 60 * i, g, g, 6000 + i, holders)
            for i in range(30) for g, holders in ((0, "1:100"), (1, "%d:%d" % (child, 5000 + i)))))
        out = tmp_path / "r.html"
        assert gg_report(state, "--out", str(out)).returncode == 0
        row = rows_of(out.read_text(), "summary-table")[0][1]
        assert re.search(r"<td class='n'>1</td>", row), row
    finally:
        job.kill()
        job.wait()


@pytest.mark.parametrize("cmd", BOTH)
def test_garbage_lines_in_a_history_file_are_skipped_and_the_report_written(tmp_path, cmd):
    # a history file's lines that are not rows: bytes that are not UTF-8 had
    # printed a UnicodeDecodeError traceback (exit 1), a line longer than
    # the csv module's field limit a csv.Error one, and a stray quote had
    # swallowed every row after it
    state = tmp_path / "state"
    (state / "history").mkdir(parents=True)

    def rows(first, last):
        return "".join("%d,4242,%d\n" % (1000 + 60 * i, 5000 + i) for i in range(first, last)).encode()

    (state / "history" / "4242-1000.csv").write_bytes(
        b"timestamp,pid,used_memory_mib\n" + rows(0, 30) + b"\xff\xfe\n" + b'"cut' + b"\n" + b"x" * 200000 + b"\n"
        + b"\0" * 64 + b"\n" + rows(30, 60))
    out = tmp_path / "r.html"
    r = gg_report(state, "--out", str(out), cmd=cmd)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout.startswith("wrote %s (0 GPUs, 1 processes, " % out)
    assert "60 samples over 59 min, 5,000 → 5,059 MiB" in out.read_text()


@pytest.mark.parametrize("cmd", BOTH)
def test_a_job_that_died_in_its_first_seconds_is_in_the_report_and_found_by_pid(tmp_path, cmd):
    """A job that crashed at start leaves one history row and its .job.json
    (as gpu-leak-watch -- ./crash.sh wrote them): the report left it out
    ("0 processes") and --pid said it "matches no process in the history".
    Now it is a row named from its .job.json, not judged (1 sample)."""
    state = tmp_path / "state"
    (state / "history").mkdir(parents=True)
    (state / "history" / "25979-2602848.csv").write_text(
        "timestamp,pid,used_memory_mib,gpu_used_mib,gpu_total_mib\n1796646336,25979,4000,4000,143771\n")
    (state / "history" / "25979-2602848.job.json").write_text(json.dumps(
        {"user": "alice", "uid": 1000, "pid": 25979, "pids": [25979], "cmdline": "/bin/bash ./crash.sh",
         "cwd": "/home/alice", "start_ts": 1796646336, "slurm_job": None, "container": None, "rank": None,
         "local_rank": None, "visible": True}))
    for args in ([], ["--pid", "25979"]):
        out = tmp_path / "r.html"
        r = gg_report(state, "--out", str(out), *args, cmd=cmd)
        assert (r.returncode, r.stderr) == (0, ""), r.stderr
        assert r.stdout.startswith("wrote %s (0 GPUs, 1 processes, " % out), r.stdout
        text = out.read_text()
        [(cls, row)] = rows_of(text, "summary-table")
        assert cls == "row-not-judged" and "bash crash.sh" in row and "user alice" in row, row
        assert "none (1 sample)" in row and "unknown (1 sample)" in row, row
        assert "no trend (not judged: 1 sample)" in text and "1 sample over 0 min, 4,000 → 4,000 MiB" in text


def test_day_ticks_stay_on_midnight_past_a_clock_change(monkeypatch):
    """A week's chart across the autumn clock change put its day ticks at
    23:00 after it ("10-25 23:00, 10-26 23:00"): each was t0's midnight plus
    whole days of 86400 s, and one of those days had 25 hours."""
    import time

    import gpuguard_report
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        t0 = time.mktime((2026, 10, 22, 12, 0, 0, 0, 0, -1))
        ticks = gpuguard_report._time_ticks(t0, t0 + 7 * 86400)
        labels = [gpuguard_report._tlabel(t) for t in ticks]
        assert labels and all(label.endswith(" 00:00") for label in labels), labels
    finally:
        monkeypatch.undo()
        time.tzset()


def test_damaged_ledger_rows_and_event_lines_are_skipped_not_a_traceback(tmp_path):
    """A ledger day file with a held time of "²" (str.isdigit says yes, int()
    says no) or of 23 digits, and events.jsonl lines with a slope "n/a" or a
    time of 1e999: `gpuguard ledger` and `gpuguard report` died with a
    ValueError, TypeError or OverflowError traceback (exit 1), or printed
    27777777777777778688.0 GPU-hours. The damaged rows and lines are skipped;
    the good ones are shown."""
    import time
    state = tmp_path / "state"
    (state / "ledger").mkdir(parents=True)
    now = time.time()
    d2, d1 = (time.strftime("%Y-%m-%d", time.localtime(now - n * 86400)) for n in (2, 1))
    (state / "ledger" / (d2 + ".tsv")).write_text(
        "day\t%s\njob\talice\t1000\tpid:5@1\t\u00b2\t0\t0\t0\t0\tx\n"
        "job\tbob\t1000\tpid:6@1\t99999999999999999999999\t0\t0\t0\t0\tx\n"
        "job\tcarol\t1000\tpid:7@1\t3600\t1800\t1800\t%d\t0\tgood.py\n" % (d2, now - 2 * 86400), encoding="utf-8")
    (state / "ledger" / (d1 + ".tsv")).write_text("day\t%s\n" % d1)
    good = {"ts": int(now) - 600, "event": "gpu_idle", "gpu": 0, "state": "firing", "utilization": 0}
    (state / "events.jsonl").write_text("\n".join(json.dumps(e) for e in (
        {"ts": int(now) - 900, "event": "gpu_memory_leak", "pid": 5, "state": "firing", "slope_mib_per_hour": "n/a"},
        good)) + '\n{"ts":1e999,"event":"gpu_idle","gpu":0,"state":"firing"}\n')
    env = user_environ(GPUGUARD_CONFIG="/dev/null", GPUGUARD_STATE_DIR=str(state), GPUGUARD_HOST="h", TZ="UTC")
    r = subprocess.run([str(ROOT / "bin/gpuguard"), "ledger", "--since", "7d", "--json"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert json.loads(r.stdout)["held_s"] == 3600
    out = tmp_path / "r.html"
    r = gg_report(state, "--out", str(out))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    alerts = rows_of(out.read_text(), "alerts-table")
    assert len(alerts) == 1 and "idle firing" in alerts[0][1], alerts
