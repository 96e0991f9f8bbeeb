"""The adaptive io.max (lib/iogov.sh): lowprio-run's governor caps the job's
disk only while another cgroup uses it. Its decisions are driven here step by
step against fake cgroup trees and a fake /sys/block/DEV/stat; its loop and
its life beside a job run for real (a fake v2 root; a real one where this
machine has cgroup v2 with the io controller)."""
import os
import re
import signal
import subprocess
import time

import pytest
from conftest import ROOT, disk_of, require, user_environ, wait_for

DEV = "253:0"
CAP = "wbps=104857600 rbps=268435456"
LIBS = "source lib/common.sh; source lib/cgroup.sh; source lib/iogov.sh; "


class Tree:
    """A cgroup v2 tree in a folder: the job's leaf somewhere in it, other
    cgroups beside it, each with an io.stat, and the disk's stat file."""

    def __init__(self, tmp_path, leaf="gpuguard-lowprio-1"):
        self.root = tmp_path / "cg"
        self.leaf = self.root / leaf
        self.leaf.mkdir(parents=True)
        (self.leaf / "cgroup.events").write_text("populated 1\nfrozen 0\n")
        self.stat = tmp_path / "vda.stat"
        self.disk_bytes = 0
        self.io(self.leaf, 0, 0)
        self.disk(0)

    def io(self, cgroup, nbytes, ios, dev=DEV):
        """A cgroup's io.stat with its totals for the disk (another disk's
        line beside it, which must not count)."""
        cgroup.mkdir(parents=True, exist_ok=True)
        (cgroup / "io.stat").write_text(
            "8:16 rbytes=999999999 wbytes=999999999 rios=99999 wios=99999 dbytes=0 dios=0\n"
            "%s rbytes=%d wbytes=%d rios=%d wios=%d dbytes=0 dios=0\n" % (dev, nbytes // 2, nbytes - nbytes // 2,
                                                                          ios // 2, ios - ios // 2))

    def disk(self, nbytes):
        """The disk's totals as /sys/block/DEV/stat shows them (sectors)."""
        self.disk_bytes = nbytes
        sectors = nbytes // 512
        (self.stat).write_text("    1000 0 %d 10 2000 0 %d 20 0 30 30 0 0 0 0 0 0\n" % (sectors // 2,
                                                                                     sectors - sectors // 2))

    def io_max(self):
        f = self.leaf / "io.max"
        return f.read_text() if f.exists() else None


def steps(tree, actions, quiet="3600"):
    """Runs the governor's decision once per action: each action is a shell
    command changing the fake files (or "") followed by one iogov_step; the
    io.max after each step, one line each ("-" while never written)."""
    script = LIBS + 'iogov_init "$1" "$2" "$3" %s "%s"; iogov_step\n' % (DEV, CAP)
    for action in actions:
        script += '%s\niogov_step; if [[ -e $1/io.max ]]; then echo "$(<"$1/io.max")"; else echo -; fi\n' % action
    r = subprocess.run(["bash", "-c", script, "_", str(tree.leaf), str(tree.root), str(tree.stat)], cwd=ROOT,
                       env=dict(os.environ, LOWPRIO_GOV_QUIET=quiet), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return r.stdout.splitlines()


def write_io(path, nbytes, ios):
    half = nbytes // 2
    return "printf '%s rbytes=%d wbytes=%d rios=%d wios=%d\\n' > %s" % (DEV, half, nbytes - half, ios // 2,
                                                                    ios - ios // 2, path)


def write_disk(path, nbytes):
    return "printf '1 0 %d 1 1 0 %d 1 0 1 1\\n' > %s" % (nbytes // 1024, nbytes // 1024, path)


def test_another_cgroups_io_caps_the_job_and_the_cap_stays_while_it_goes_on(tmp_path):
    """A service's 4 KiB I/O in a cgroup beside the job: the cap goes on at
    the next look, and stays while the service keeps going."""
    t = Tree(tmp_path)
    svc = t.root / "system.slice"
    t.io(svc, 0, 0)
    out = steps(t, ["", write_io(svc / "io.stat", 409600, 100), write_io(svc / "io.stat", 819200, 200)])
    assert out == ["-", "%s %s" % (DEV, CAP), "%s %s" % (DEV, CAP)]


def test_the_jobs_own_io_never_caps_it(tmp_path):
    """The job writing a checkpoint at full speed: its io.stat and the
    disk's totals grow together, other lowprio-run jobs write too, and
    another disk is busy: no cap, ever."""
    t = Tree(tmp_path)
    other_job = t.root / "gpuguard-lowprio-2"
    t.io(other_job, 0, 0)
    actions = []
    for i in range(1, 5):
        gib = i << 30
        actions.append("; ".join([write_io(t.leaf / "io.stat", gib, 1000 * i),
                                  write_io(other_job / "io.stat", gib, 1000 * i), write_disk(t.stat, 2 * gib)]))
    assert steps(t, actions) == ["-"] * 4


def test_a_trickle_below_the_floor_does_not_cap_the_job(tmp_path):
    """One I/O in a fifth of a second (a log line, an atime update) is
    under 20 I/Os per second and 1 MiB/s: the job keeps its speed."""
    t = Tree(tmp_path)
    svc = t.root / "user.slice"
    t.io(svc, 0, 0)
    assert steps(t, ["sleep 0.2; " + write_io(svc / "io.stat", 4096, 1)]) == ["-"]


def test_io_beside_a_cgroup_higher_up_counts_and_a_new_cgroups_past_does_not(tmp_path):
    """The job's leaf deep in the tree (under the caller's cgroup): a
    sibling of any cgroup above it counts. A cgroup that appears with a long
    history (its totals from before) is not news: only what it does next."""
    t = Tree(tmp_path, leaf="user.slice/user-1000.slice/session-3.scope/gpuguard-lowprio-7")
    late = t.root / "system.slice"
    out = steps(t, ["mkdir -p %s; %s" % (late, write_io(late / "io.stat", 50 << 30, 10 ** 6)),
                    write_io(late / "io.stat", (50 << 30) + 409600, 10 ** 6 + 100)])
    assert out == ["-", "%s %s" % (DEV, CAP)]


def test_io_no_cgroup_beside_the_job_accounts_for_caps_it_only_when_large(tmp_path):
    """The disk busier than the job and the cgroups beside it (a process in
    the root cgroup, a writer outside a container): counted above 32 MiB/s
    and half the job's rate, so that the job's own requests in flight
    (issued but not yet completed) never look like someone else's."""
    t = Tree(tmp_path)
    gib = 1 << 30
    out = steps(t, ["; ".join([write_io(t.leaf / "io.stat", gib, 1000), write_disk(t.stat, gib + (64 << 20))]),
                    write_disk(t.stat, 3 * gib)])
    assert out == ["-", "%s %s" % (DEV, CAP)]


def test_the_cap_is_lifted_only_after_the_others_have_been_quiet(tmp_path):
    """Hysteresis: while the quiet time has not passed the cap stays;
    once it has, the next look writes max back."""
    t = Tree(tmp_path)
    svc = t.root / "svc"
    t.io(svc, 0, 0)
    busy = write_io(svc / "io.stat", 409600, 100)
    assert steps(t, [busy, "", ""], quiet="3600") == ["%s %s" % (DEV, CAP)] * 3
    t.io(svc, 0, 0)
    (t.leaf / "io.max").unlink()
    assert steps(t, [busy, "sleep 0.3", ""], quiet="0.2") == ["%s %s" % (DEV, CAP),
                                                              "%s rbps=max wbps=max" % DEV,
                                                              "%s rbps=max wbps=max" % DEV]


SERVICE_IOS = [0]


def service_io(t, svc):
    """The service does 100 more 4 KiB I/Os (whenever the governor looks,
    they are news). True, for wait_for."""
    SERVICE_IOS[0] += 100
    t.io(svc, SERVICE_IOS[0] * 4096, SERVICE_IOS[0])
    return True


def start_governor(t, **env):
    return subprocess.Popen(["bash", "-c", LIBS + 'iogov_run "$@"', "_", str(t.leaf), str(t.root), str(t.stat),
                             DEV, CAP], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, LOWPRIO_GOV_PERIOD="0.05", LOWPRIO_GOV_QUIET="3600", **env))


@pytest.mark.slow
def test_the_governor_exits_when_the_jobs_cgroup_is_gone_or_empty(tmp_path):
    t = Tree(tmp_path)
    svc = t.root / "svc"
    t.io(svc, 0, 0)
    gov = start_governor(t)
    assert wait_for(lambda: service_io(t, svc) and t.io_max() == "%s %s\n" % (DEV, CAP))
    os.kill(gov.pid, signal.SIGINT)                # the terminal's ^C: the job decides, not the governor
    (t.leaf / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    out, err = gov.communicate(timeout=30)
    assert gov.returncode == 0 and err == ""
    capped, switches, elapsed, paused, paced = (int(x) for x in out.split()[1:])
    assert out.startswith("GOV ") and switches == 1 and 0 < capped <= elapsed and (paused, paced) == (0, 0)
    # the job left but its leaf is still there: the cap is taken off
    assert t.io_max() == "%s rbps=max wbps=max\n" % DEV
    t.io(svc, 0, 0)
    (t.leaf / "cgroup.events").write_text("populated 1\n")
    gov = start_governor(t)
    for f in t.leaf.iterdir():
        f.unlink()
    t.leaf.rmdir()
    out, err = gov.communicate(timeout=30)
    assert gov.returncode == 0 and err == "" and out.startswith("GOV 0 0 ")


@pytest.mark.slow
def test_the_governor_waits_for_the_job_to_enter_and_stops_on_term(tmp_path):
    """Started before the job has moved into its leaf, the governor waits
    for it (it must not exit on an empty leaf at the start); TERM (from
    lowprio-run once the job has ended) stops it with its summary."""
    t = Tree(tmp_path)
    (t.leaf / "cgroup.events").write_text("populated 0\n")
    gov = start_governor(t)
    time.sleep(0.3)
    assert gov.poll() is None
    (t.leaf / "cgroup.events").write_text("populated 1\n")
    svc = t.root / "svc"
    t.io(svc, 0, 0)
    assert wait_for(lambda: service_io(t, svc) and t.io_max() == "%s %s\n" % (DEV, CAP))
    gov.send_signal(signal.SIGTERM)
    out, _ = gov.communicate(timeout=30)
    assert out.startswith("GOV ") and out.split()[2] == "1"
    assert t.io_max() == "%s rbps=max wbps=max\n" % DEV


def replace(path, text):
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


class PacedJob:
    """The job's side of the pacer on a fake tree: a leaf that can be
    frozen (cgroup.freeze), its processes (cgroup.procs) and a fake /proc
    with each one's write_bytes."""

    def __init__(self, t, pids=(4242,)):
        self.t, self.proc = t, t.root.parent / "proc"
        (t.leaf / "cgroup.freeze").write_text("0\n")
        self.written = {}
        for pid in pids:
            self.write(pid, 0)

    def write(self, pid, nbytes):
        """Process PID has written nbytes in all (it joins the job if new)."""
        self.written[pid] = nbytes
        (self.proc / str(pid)).mkdir(parents=True, exist_ok=True)
        # (whole files at once, as the kernel shows them)
        replace(self.proc / str(pid) / "io",
                "rchar: 1\nwchar: %d\nsyscr: 1\nsyscw: 1\nread_bytes: 0\nwrite_bytes: %d\ncancelled_write_bytes: 0\n"
                % (nbytes, nbytes))
        replace(self.t.leaf / "cgroup.procs", "".join("%d\n" % p for p in self.written))

    def shell(self, pid, nbytes):
        """The same as a shell command, for steps()."""
        return ("mkdir -p %s/%d; printf 'rchar: 1\\nwrite_bytes: %d\\ncancelled_write_bytes: 0\\n' > %s/%d/io; "
                "grep -qx %d %s/cgroup.procs || echo %d >> %s/cgroup.procs"
                % (self.proc, pid, nbytes, self.proc, pid, pid, self.t.leaf, pid, self.t.leaf))

    def frozen(self):
        return (self.t.leaf / "cgroup.freeze").read_text().strip()


def children(pid):
    """The PIDs whose parent is pid."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open("/proc/%s/stat" % entry) as f:
                if entry.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except (OSError, IndexError, ValueError):
            pass
    return found


def pace_steps(t, job, actions):
    """steps() for the pacer: each action is a shell command, then
    "step" (iogov_step), "tick" (one look of the pacer), "tick+50ms" (one
    look as if 50 ms had passed since the last) or "tick+50ms, all" (the
    same, a look that reads every process of the job, as every tenth look
    does, not only those writing); prints io.max and cgroup.freeze after
    each."""
    script = LIBS + 'iogov_init "$1" "$2" "$3" %s "%s"; iogov_step\n' % (DEV, CAP)
    for action, what in actions:
        call = {"step": "iogov_step", "tick": "iogov_pace_tick",
                "tick+50ms": "IOGOV_PACE_T=$((IOGOV_PACE_T - 50000)); iogov_pace_tick",
                "tick+50ms, all": "IOGOV_PACE_T=$((IOGOV_PACE_T - 50000)) IOGOV_LOOKS=0; iogov_pace_tick"}[what]
        script += '%s\n%s; io=-; [[ -e $1/io.max ]] && io=$(<"$1/io.max"); echo "$io freeze=$(<"$1/cgroup.freeze")"\n' % (
            action, call)
    script += "iogov_pace_end; echo \"end freeze=$(<\"$1/cgroup.freeze\") paused=$((IOGOV_PAUSED_USEC > 0))\"\n"
    r = subprocess.run(["bash", "-c", script, "_", str(t.leaf), str(t.root), str(t.stat)], cwd=ROOT,
                       env=dict(os.environ, LOWPRIO_GOV_QUIET="3600", LOWPRIO_GOV_PROCFS=str(job.proc)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return r.stdout.splitlines()


def test_while_others_use_the_disk_the_jobs_writes_are_paced_by_pausing_it_and_reads_go_to_io_max(tmp_path):
    """The cap at 100 MiB/s with 4 MiB of burst: io.max gets only the read
    cap (the job's writeback must not be throttled, or a service's fsync
    waits behind it); a job 8 MiB ahead is frozen until 50 ms at the cap's
    rate have paid for it, then thawed. What a process wrote before the cap
    went on is not held against it; a process that joins later counts from
    its first byte."""
    t = Tree(tmp_path)
    job = PacedJob(t)
    job.write(4242, 10 << 30)                          # 10 GiB written before anyone else came
    svc = t.root / "system.slice"
    t.io(svc, 0, 0)
    reads_only = "%s wbps=max rbps=268435456 freeze=0" % DEV
    out = pace_steps(t, job, [
        (write_io(svc / "io.stat", 409600, 100), "step"),                   # the service: cap on
        ("", "tick"),                                                      # nothing written since: running
        (job.shell(4242, (10 << 30) + (8 << 20)), "tick"),                 # 8 MiB at once: 4 MiB ahead
        ("", "tick"),                                                      # still ahead
        ("", "tick+50ms"),                                                 # 5 MiB of credit came: thawed
        (job.shell(4243, 3 << 20), "tick+50ms, all"),                      # a new process, 3 MiB: within
        (job.shell(4243, 9 << 20), "tick"),                                # 6 MiB more: ahead again
    ])
    assert out == [reads_only, reads_only, reads_only.replace("freeze=0", "freeze=1"),
                   reads_only.replace("freeze=0", "freeze=1"), reads_only, reads_only,
                   reads_only.replace("freeze=0", "freeze=1"), "end freeze=0 paused=1"]


def test_without_a_freezer_or_with_pacing_off_io_max_caps_the_writes_as_before(tmp_path):
    """A leaf with no cgroup.freeze (a kernel before 5.2), LOWPRIO_GOV_PACE=off,
    or a job none of whose /proc/PID/io can be read: the whole cap goes to
    io.max, and nothing is ever frozen."""
    t = Tree(tmp_path)
    svc = t.root / "svc"
    t.io(svc, 0, 0)
    assert steps(t, [write_io(svc / "io.stat", 409600, 100)]) == ["%s %s" % (DEV, CAP)]
    for how in ("off", "unreadable"):
        t = Tree(tmp_path / how)
        job = PacedJob(t)
        t.io(t.root / "svc", 0, 0)
        script = LIBS + 'iogov_init "$1" "$2" "$3" %s "%s"; iogov_step; %s; iogov_step; echo "$(<"$1/io.max")"' % (
            DEV, CAP, write_io(t.root / "svc" / "io.stat", 409600, 100))
        env = dict(os.environ, LOWPRIO_GOV_QUIET="3600", LOWPRIO_GOV_PROCFS=str(job.proc))
        if how == "off":
            env["LOWPRIO_GOV_PACE"] = "off"
        else:
            env["LOWPRIO_GOV_PROCFS"] = str(tmp_path / "nowhere")
        r = subprocess.run(["bash", "-c", script, "_", str(t.leaf), str(t.root), str(t.stat)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert r.stdout == "%s %s\n" % (DEV, CAP) and job.frozen() == "0"


@pytest.mark.slow
def test_a_governor_killed_while_the_job_is_paused_never_leaves_it_frozen(tmp_path):
    """The governor paces a job that keeps writing beside a busy service,
    so it is frozen part of the time; a kill -9 of the governor (or a
    `pkill -9 -f lowprio-run`, which takes the governor too) must not leave
    the job frozen for good: its guard thaws it. A governor stopped with
    TERM thaws it itself and says how long the job was paused."""
    for how in ("KILL", "TERM"):
        t = Tree(tmp_path / how)
        job = PacedJob(t)
        svc = t.root / "svc"
        t.io(svc, 0, 0)
        gov = start_governor(t, LOWPRIO_GOV_PROCFS=str(job.proc))
        written = [0]

        def busy_and_writing(t=t, svc=svc, job=job, written=written):
            service_io(t, svc)
            written[0] += 64 << 20                     # 64 MiB a look: far ahead of 100 MiB/s
            job.write(4242, written[0])
            return job.frozen() == "1"
        assert wait_for(busy_and_writing)
        assert t.io_max() == "%s wbps=max rbps=268435456\n" % DEV
        # `pkill -f lowprio` must not find the guard: no "lowprio" in its command line
        guards = [c for c in children(gov.pid) if open("/proc/%d/cmdline" % c, "rb").read().startswith(b"sh\0")]
        assert len(guards) == 1 and b"lowprio" not in open("/proc/%d/cmdline" % guards[0], "rb").read()
        gov.send_signal(getattr(signal, "SIG" + how))
        out, _ = gov.communicate(timeout=30)
        assert wait_for(lambda job=job: job.frozen() == "0", timeout=10)
        if how == "TERM":
            capped, switches, elapsed, paused, paced = (int(x) for x in out.split()[1:])
            assert switches == 1 and paced == 1 and 0 < paused <= capped <= elapsed
            assert t.io_max() == "%s rbps=max wbps=max\n" % DEV


# A stand-in for a governor still starting: deaf to TERM for its first
# $1 seconds (as one is until its trap is set), then it answers TERM with
# its summary; "never" ignores TERM for good (a governor stuck).
DEAF_GOVERNOR = r"""
source lib/common.sh; source lib/cgroup.sh; source lib/disk.sh; source lib/iogov.sh; source lib/lowprio.sh
declare -gA LP_GOV_PID=() LP_GOV_FD=() LP_GOV_WAKE=() LP_GOV_SUM=()
exec {fd}< <(
  trap '' TERM
  if [[ $1 == never ]]; then
    while :; do sleep 0.1; done
  fi
  sleep "$1"
  trap 'printf "GOV 7 1 9\n"; exit 0' TERM
  while :; do sleep 0.05; done
)
LP_GOV_PID[253:0]=$! LP_GOV_FD[253:0]=$fd
sleep 0.1
start=$EPOCHREALTIME
lowprio_gov_stop
printf '%s %s\n' "${LP_GOV_SUM[253:0]:-none}" "$(( ${EPOCHREALTIME/[.,]/} - ${start/[.,]/} ))"
"""


def test_lowprio_run_gets_the_summary_of_a_governor_that_missed_the_first_term(tmp_path):
    """A job that ends at once is stopped while its governor is still
    starting; a TERM lost before the governor's trap is set must not leave
    lowprio-run waiting (nor its stderr held open) for minutes: TERM goes
    again until the summary comes, and a governor that never answers is
    killed after 5 s."""
    r = subprocess.run(["bash", "-c", DEAF_GOVERNOR, "_", "0.5"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    summary, usec = r.stdout.rsplit(" ", 1)
    assert summary == "7 1 9" and int(usec) < 2000000
    r = subprocess.run(["bash", "-c", DEAF_GOVERNOR, "_", "never"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    summary, usec = r.stdout.rsplit(" ", 1)
    assert summary == "none" and 4500000 < int(usec) < 8000000


# A governor that has already said its summary and exited (its nap was cut
# short by the wake pipe) when lowprio-run sends its TERM; lowprio-run runs
# under set -e.
GONE_GOVERNOR = r"""
set -euo pipefail
source lib/common.sh; source lib/cgroup.sh; source lib/disk.sh; source lib/iogov.sh; source lib/lowprio.sh
declare -gA LP_GOV_PID=() LP_GOV_FD=() LP_GOV_WAKE=() LP_GOV_SUM=()
exec {fd}< <(printf 'GOV 4 1 6\n')
LP_GOV_PID[253:0]=$! LP_GOV_FD[253:0]=$fd
exec {wake}<> <(:)
LP_GOV_WAKE[253:0]=$wake
while kill -0 "${LP_GOV_PID[253:0]}" 2>/dev/null; do sleep 0.05; done
lowprio_gov_stop
printf '%s\n' "${LP_GOV_SUM[253:0]:-none}"
"""


def test_lowprio_run_survives_a_governor_gone_before_its_term(tmp_path):
    """A job that ends at once: the wake line ends the governor's nap and it
    exits before lowprio-run's TERM; a failed kill must not end lowprio-run
    (set -e) with status 1 and no word, the job's status and report lost."""
    r = subprocess.run(["bash", "-c", GONE_GOVERNOR], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (0, "4 1 6\n"), r.stderr


# ------------------------------------------------------- with lowprio-run --

def fake_root(tmp_path):
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("cpuset\n")
    (root / "cgroup.procs").write_text("")
    (tmp_path / "proc-cgroup").write_text("0::/\n")
    return root


def lowprio(args, tmp_path, env=None, timeout=120, **kw):
    full = user_environ(GPUGUARD_STATE_DIR=str(tmp_path / "state"), LOWPRIO_MEASURE_MIB="8")
    full.update(env or {})
    return subprocess.run([str(ROOT / "bin/lowprio-run")] + args, env=full, text=True, capture_output=True,
                          timeout=timeout, **kw)


def alive_with(marker):
    """PIDs of live processes whose environment holds marker."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


# The job: a service beside it starts doing I/O; the job waits (bounded)
# until its leaf's io.max holds the cap, prints it, and ends a moment
# later (capped for that moment).
JOB = r"""
leaf=$(echo "$1"/gpuguard-lowprio-*)
printf '%s rbytes=0 wbytes=0 rios=0 wios=0\n' "$2" > "$1/svc/io.stat"
sleep 0.3
printf '%s rbytes=409600 wbytes=409600 rios=100 wios=100\n' "$2" > "$1/svc/io.stat"
for i in $(seq 100); do
  grep -q wbps=[0-9] "$leaf/io.max" 2>/dev/null && break
  sleep 0.1
done
cat "$leaf/io.max"
sleep 0.2
"""


@pytest.mark.slow
def test_lowprio_run_caps_the_job_while_a_service_uses_the_disk_and_the_governor_dies_with_it(tmp_path):
    """No flag: the start line names the adaptive io.max and its figures
    (12 % of the measured write speed, 10 % of the read speed); the cap goes
    on while another cgroup does I/O; --report says how long and how often;
    the governor is gone when lowprio-run returns."""
    disk = disk_of(tmp_path)
    require(disk is not None, "the test's folder on a block device")
    majmin, name = disk
    root = fake_root(tmp_path)
    (root / "svc").mkdir()
    marker = "IOGOV_TEST_%d" % os.getpid()
    env = {"LOWPRIO_CGROUP_ROOT": str(root), "LOWPRIO_CGROUP_MODE": "v2", "LOWPRIO_MECHANISM": "cgroup-v2",
           "LOWPRIO_PROC_CGROUP": str(tmp_path / "proc-cgroup"), "LOWPRIO_GOV_PERIOD": "0.1", marker: "1"}
    r = lowprio(["--report", "--", "bash", "-c", JOB, "_", str(root), majmin], tmp_path, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    w, rd = (int(x) for x in (tmp_path / "state" / "disk-bandwidth").read_text().split()[3:5])
    assert r.stdout == "%s wbps=%d rbps=%d\n" % (majmin, w * 12 // 100, rd * 10 // 100)
    (line,) = [x for x in r.stderr.splitlines() if " disk: " in x]
    assert "%s %s: adaptive io.max: writes <= " % (name, majmin) in line
    assert "only while another cgroup uses the disk" in line
    (row,) = [x for x in r.stderr.splitlines() if x.startswith("  adaptive %s " % name)]
    assert "the cap went on 1 times" in row and " capped 0.00 s " not in row
    assert alive_with(marker) == []
    # --io-adaptive off: the static cap, as before, with no governor
    r = lowprio(["--io-adaptive", "off", "--report", "--", "true"], tmp_path, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "io.max fallback: writes <= " in r.stderr and "static (adaptive off" in r.stderr
    assert "  adaptive " not in r.stderr


@pytest.mark.slow
def test_lowprio_run_returns_as_its_job_ends_not_a_governor_period_later(tmp_path):
    """The governor naps between looks in a read -t, which bash does not
    cut short for TERM: lowprio-run wakes it through a pipe instead, so a
    job's end is not followed by up to a period of waiting (0.5 s by
    default on every run; here a period of 20 s)."""
    disk = disk_of(tmp_path)
    require(disk is not None, "the test's folder on a block device")
    _, name = disk
    root = fake_root(tmp_path)
    env = {"LOWPRIO_CGROUP_ROOT": str(root), "LOWPRIO_CGROUP_MODE": "v2", "LOWPRIO_MECHANISM": "cgroup-v2",
           "LOWPRIO_PROC_CGROUP": str(tmp_path / "proc-cgroup"), "LOWPRIO_GOV_PERIOD": "20"}
    lowprio(["--measure-disk", str(tmp_path)], tmp_path, env=env, cwd=tmp_path)
    start = time.monotonic()
    r = lowprio(["--report", "--", "sleep", "0.5"], tmp_path, env=env, cwd=tmp_path)
    took = time.monotonic() - start
    assert r.returncode == 0, r.stderr
    (row,) = [x for x in r.stderr.splitlines() if x.startswith("  adaptive %s " % name)]
    assert " capped 0.00 s of " in row
    assert took < 4, "lowprio-run took %.1f s for a 0.5 s job" % took


def test_explain_and_dry_run_describe_the_adaptive_cap(tmp_path):
    disk = disk_of(tmp_path)
    require(disk is not None, "the test's folder on a block device")
    majmin, name = disk
    root = fake_root(tmp_path)
    env = {"LOWPRIO_CGROUP_ROOT": str(root), "LOWPRIO_CGROUP_MODE": "v2", "LOWPRIO_MECHANISM": "cgroup-v2",
           "LOWPRIO_PROC_CGROUP": str(tmp_path / "proc-cgroup")}
    r = lowprio(["--explain"], tmp_path, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "disk %s (%s; the job's folder, the state folder): adaptive io.max at 12 %% of the disk's write " \
        "bandwidth, only while another cgroup uses the disk" % (name, majmin) in r.stdout
    assert not (tmp_path / "state" / "disk-bandwidth").exists()          # --explain measures nothing
    (tmp_path / "state").mkdir()
    sectors = open("/sys/class/block/%s/size" % name).read().strip()
    (tmp_path / "state" / "disk-bandwidth").write_text("%s %s %s 1073741824 2147483648 0\n" % (majmin, name, sectors))
    r = lowprio(["--tier", "offline", "--explain"], tmp_path, env=env, cwd=tmp_path)
    assert "adaptive io.max: writes <= 20 MiB/s (2 % of the measured 1.0 GiB/s), reads <= 204 MiB/s " \
        "(10 % of 2.0 GiB/s), only while another cgroup uses the disk" in r.stdout
    assert "  expected effect: work-conserving: full speed while no other cgroup uses the disk" in r.stdout
    r = lowprio(["--io-adaptive", "off", "--explain"], tmp_path, env=env, cwd=tmp_path)
    assert "io.max fallback: writes <= 122 MiB/s (12 % of the measured 1.0 GiB/s)" in r.stdout
    assert "not work-conserving" in r.stdout


@pytest.mark.parametrize("args, message", [
    (["--io-adaptive", "maybe"], "--io-adaptive takes on or off (got 'maybe')"),
    (["--io-adaptive"], "--io-adaptive takes on or off (got '--')"),
])
def test_bad_io_adaptive_is_one_line_exit_2_and_the_job_never_starts(tmp_path, args, message):
    flag = tmp_path / "started"
    r = lowprio(args + ["--", "touch", str(flag)], tmp_path)
    assert r.returncode == 2 and not flag.exists()
    assert r.stderr.count("\n") == 1 and message in r.stderr


def test_a_tiers_file_with_a_bad_adaptive_value_is_named_and_the_job_runs_under_the_built_in_tiers(tmp_path):
    """A typo in the tiers file is not the user's command line: one warning
    naming the line, and the job starts under the built-in tiers."""
    tiers = tmp_path / "tiers.conf"
    tiers.write_text("batch 15 idle idle 60 weight=10,wbps=8%,rbps=25%,adaptive=sometimes\n")
    flag = tmp_path / "started"
    r = lowprio(["--explain"], tmp_path, env={"LOWPRIO_TIERS": str(tiers)})
    assert r.returncode == 0, r.stderr
    assert "%s:1: the disk column takes - or weight=1-10000,wbps=1-100%%,rbps=1-100%%,adaptive=on|off " \
           "(got 'adaptive=sometimes'); using the built-in tiers" % tiers in r.stderr
    assert r.stderr.count("\n") == 1
    r = lowprio(["--", "touch", str(flag)], tmp_path, env={"LOWPRIO_TIERS": str(tiers), "LOWPRIO_MECHANISM": "autogroup"})
    assert r.returncode == 0 and flag.exists(), r.stderr


def real_v2_io():
    if os.geteuid() != 0:
        return False
    try:
        fs = subprocess.run(["stat", "-fc", "%T", "/sys/fs/cgroup"], capture_output=True, text=True).stdout.strip()
        return fs == "cgroup2fs" and "io" in open("/sys/fs/cgroup/cgroup.controllers").read().split()
    except OSError:
        return False


@pytest.mark.slow
def test_real_cgroup_v2_a_service_beside_the_job_caps_it_and_it_is_lifted_after(tmp_path):
    """On a real cgroup v2 hierarchy with the io controller (root): a
    service cgroup beside the job reads the disk with O_DIRECT; the job's
    leaf gets the cap in io.max, and `max` back once the service stopped.
    On a host whose io controller is not on cgroup v2 (CI's hybrid one:
    blkio on v1), the job runs and its start line says the cap there is
    static, never that a governor watches the disk."""
    require(os.geteuid() == 0, "root (the real cgroup tree)")
    disk = disk_of(tmp_path)
    require(disk is not None, "the test's folder on a block device")
    majmin, _ = disk
    if not real_v2_io():
        r = lowprio(["--report", "--", "true"], tmp_path, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        (line,) = [x for x in r.stderr.splitlines() if " disk: " in x]
        assert "io.max fallback: writes <= " in line and "static: no adaptive cap on cgroup v1" in line, line
        assert "  adaptive " not in r.stderr
        return
    svc = "/sys/fs/cgroup/gg-iogov-test-%d" % os.getpid()
    os.mkdir(svc)
    data = tmp_path / "data"
    data.write_bytes(os.urandom(8 << 20))
    job = r"""
leaf=/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)
sh -c 'echo $$ > "$0/cgroup.procs"; for i in $(seq 40); do dd if="$1" of=/dev/null bs=4k count=64 iflag=direct status=none; sleep 0.05; done' "$1" "$2" &
for i in $(seq 100); do grep -q "^$3 .*wbps=[0-9]" "$leaf/io.max" && break; sleep 0.1; done
grep "^$3 " "$leaf/io.max"; wait
for i in $(seq 100); do grep -q "^$3 .*wbps=[0-9]" "$leaf/io.max" || break; sleep 0.1; done
grep -c "^$3 .*wbps=[0-9]" "$leaf/io.max"
"""
    try:
        r = lowprio(["--", "bash", "-c", job, "_", svc, str(data), majmin], tmp_path,
                    env={"LOWPRIO_MECHANISM": "cgroup-v2", "LOWPRIO_GOV_QUIET": "0.5"}, cwd=tmp_path)
    finally:
        os.rmdir(svc)
    assert r.returncode == 1, r.stderr              # grep -c found no cap line at the end
    first, last = r.stdout.splitlines()
    assert first.startswith(majmin + " ") and "wbps=" in first and last == "0"


# ------------------------------------------------------------- systemd ----

def test_under_systemd_the_governor_finds_the_jobs_scope_and_caps_it_through_systemctl(tmp_path):
    """Where systemd owns the tree, the job's cgroup is the scope
    systemd-run made (UNIT.scope): the governor finds it in the job's
    /proc/PID/cgroup once the job is in it, and sets and lifts the cap with
    `systemctl set-property --runtime` (systemd stays the one writer)."""
    t = Tree(tmp_path, leaf="user.slice/gpuguard-lowprio-9.scope")
    svc = t.root / "system.slice"
    t.io(svc, 0, 0)
    proc = tmp_path / "proc-cgroup"
    proc.write_text("0::/user.slice/session-2.scope\n")
    log = tmp_path / "systemctl.log"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "systemctl").write_text('#!/bin/sh\nprintf "%%s|" "$@" >> %s\necho >> %s\n' % (log, log))
    (fake / "systemctl").chmod(0o755)
    script = LIBS + """
iogov_init "" "$1" "$2" %s "%s" gpuguard-lowprio-9 "$3"
iogov_find_scope; echo "before: $? ${IOGOV_LEAF:-none}"
echo "0::/user.slice/gpuguard-lowprio-9.scope" > "$3"
iogov_find_scope; echo "after: $? $IOGOV_LEAF"
iogov_step
%s
iogov_step
sleep 0.3
iogov_step
rm "$3"; iogov_find_scope; echo "gone: $?"
""" % (DEV, CAP, write_io(svc / "io.stat", 409600, 100))
    r = subprocess.run(["bash", "-c", script, "_", str(t.root), str(t.stat), str(proc)], cwd=ROOT,
                       env=dict(os.environ, LOWPRIO_GOV_QUIET="0.2", PATH="%s:%s" % (fake, os.environ["PATH"])),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.splitlines() == ["before: 1 none", "after: 0 %s" % t.leaf, "gone: 2"]
    user = [] if os.geteuid() == 0 else ["--user"]
    calls = [line.rstrip("|").split("|") for line in log.read_text().splitlines()]
    assert calls == [user + ["set-property", "--runtime", "gpuguard-lowprio-9.scope",
                             "IOWriteBandwidthMax=/dev/block/%s 104857600" % DEV,
                             "IOReadBandwidthMax=/dev/block/%s 268435456" % DEV],
                     user + ["set-property", "--runtime", "gpuguard-lowprio-9.scope",
                             "IOWriteBandwidthMax=/dev/block/%s infinity" % DEV,
                             "IOReadBandwidthMax=/dev/block/%s infinity" % DEV]]
    assert t.io_max() is None                     # nothing written past systemd


def test_under_systemd_the_scope_gets_io_accounting_and_no_static_cap(tmp_path):
    disk = disk_of(tmp_path)
    require(disk is not None, "the test's folder on a block device")
    majmin, name = disk
    root = fake_root(tmp_path)
    (tmp_path / "state").mkdir()
    sectors = open("/sys/class/block/%s/size" % name).read().strip()
    (tmp_path / "state" / "disk-bandwidth").write_text("%s %s %s 1073741824 2147483648 0\n" % (majmin, name, sectors))
    env = {"LOWPRIO_CGROUP_ROOT": str(root), "LOWPRIO_CGROUP_MODE": "v2", "LOWPRIO_SYSTEMD": "1",
           "LOWPRIO_PROC_CGROUP": str(tmp_path / "proc-cgroup")}
    r = lowprio(["--dry-run", "--", "true"], tmp_path, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert " -p IOAccounting=yes " in r.stdout and "BandwidthMax" not in r.stdout
    r = lowprio(["--explain"], tmp_path, env=env, cwd=tmp_path)
    assert "disk %s (%s; the job's folder, the state folder): adaptive io.max: writes <= 122 MiB/s" % (name, majmin) \
        in r.stdout
    # on a hybrid host (cgroup v1) systemd's static cap, said so
    r = lowprio(["--dry-run", "--", "true"], tmp_path, env=dict(env, LOWPRIO_CGROUP_MODE="v1"), cwd=tmp_path)
    assert "IOWriteBandwidthMax=/dev/block/%s\\ %d" % (majmin, (1 << 30) * 12 // 100) in r.stdout   # %q's quoting


@pytest.mark.slow
def test_disk_adaptive_bench_dry_run_gives_the_goal_table_and_leaves_nothing(tmp_path):
    """bench/h200/disk_adaptive.sh's dry run (no root: a fake cgroup root,
    small jobs): every row, the goal table with a verdict per goal, and its
    work folder removed."""
    require(disk_of(tmp_path) is not None and os.path.isdir("/var/tmp") and disk_of("/var/tmp") is not None,
            "/var/tmp on a block device (the bench's work folder)")
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(ROOT / "bench/h200/disk_adaptive.sh"), str(out)], cwd=ROOT, text=True,
                       capture_output=True, timeout=300, env=dict(os.environ, DRY_RUN="1"))
    assert r.returncode == 0, r.stdout + r.stderr
    table = (out / "disk_adaptive.md").read_text()
    rows = [line.split(" | ")[:2] for line in table.splitlines() if line.startswith("| ")]
    for want in (["| idle", "ckpt"], ["| plain", "read"], ["| default", "direct8"], ["| default onset", "ckpt"],
                 ["| offline", "ckpt"], ["| default at 8 %", "ckpt"], ["| default at 16 %", "ckpt"]):
        assert want in rows, table
    goals = [line for line in table.splitlines() if line.startswith(("| service ", "| job"))]
    assert len(goals) >= 8 and all(line.endswith(("| yes |", "| **no** |")) for line in goals)
    log = (out / "disk_adaptive.log").read_text()
    assert "adaptive io.max: writes <= " in log and "the cap went on" in log
    (work,) = set(re.findall(r"^== kernel [^;]*; (/var/tmp/gg-disk-adaptive\.\w+) on ", log, re.MULTILINE))
    assert not os.path.exists(work)


REPORT_ROWS = r"""
source lib/common.sh; source lib/cgroup.sh; source lib/disk.sh; source lib/iogov.sh; source lib/lowprio.sh
declare -gA LP_GOV_CAP=([253:0]="wbps=104857600 rbps=268435456") LP_GOV_SUM=([253:0]="$1")
disk_name() { printf vda; }
rows=()
lowprio_gov_rows_into rows 20000000
printf '%s\n' "${rows[@]}"
"""


@pytest.mark.parametrize("summary, says", [
    ("6000000 2 20000000 4500000 1", "capped 6.00 s of 20.00 s (30 %), the cap went on 2 times (writes <= 100 MiB/s, "
     "reads <= 256 MiB/s while another cgroup used the disk; writes paced by pausing the job, paused 4.50 s in all)"),
    ("6000000 2 20000000 0 0", "capped 6.00 s of 20.00 s (30 %), the cap went on 2 times (writes <= 100 MiB/s, "
     "reads <= 256 MiB/s while another cgroup used the disk)"),
    # a governor of before this change said three figures
    ("6000000 2 20000000", "the cap went on 2 times (writes <= 100 MiB/s, reads <= 256 MiB/s while another cgroup "
     "used the disk)"),
])
def test_the_report_says_how_long_the_paced_job_was_paused(summary, says):
    """--report's row for the disk: how long the job was capped and, where
    its writes were paced, how long they paused it."""
    r = subprocess.run(["bash", "-c", REPORT_ROWS, "_", summary], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.startswith("adaptive vda|") and r.stdout.rstrip("\n").endswith(says), r.stdout


def test_a_child_reaped_by_its_parent_in_the_job_is_not_counted_twice(tmp_path):
    """A checkpoint written by a child process (a dd per checkpoint): when
    the parent reaps it, the kernel adds the child's 500 MiB to the
    parent's write_bytes. Counted again, the job would be frozen for
    seconds for bytes already paid for; only what the child wrote since the
    last look counts (1 MiB here), and the job runs on."""
    t = Tree(tmp_path)
    job = PacedJob(t, pids=(4242, 4243))
    svc = t.root / "svc"
    t.io(svc, 0, 0)
    reaped = ("printf '4242\\n' > %s/cgroup.procs; rm -r %s/4243; printf 'write_bytes: %d\\n' > %s/4242/io"
              % (t.leaf, job.proc, (500 << 20) + (1 << 20), job.proc))
    out = pace_steps(t, job, [
        (write_io(svc / "io.stat", 409600, 100), "step"),                   # cap on
        (job.shell(4243, 500 << 20), "tick+50ms, all"),                     # the child writes 500 MiB (over 10 s)
        ("IOGOV_CREDIT=$IOGOV_BURST; iogov_freeze 0", "tick+50ms, all"),                 # paid up (a test shortcut)
        (reaped, "tick+50ms, all"),                                         # reaped: 1 MiB more, not 501
    ])
    assert out[-2:] == ["%s wbps=max rbps=268435456 freeze=0" % DEV, "end freeze=0 paused=1"], out
