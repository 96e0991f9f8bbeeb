#!/usr/bin/env python3
"""lowprio-run bench: a latency-sensitive probe (a thread sleeping 10 ms in
a loop, recording how late it wakes) and a CPU-bound service worker run in
one session; a CPU hog on all cores runs in another session: not at all,
plain, under `nice -n 19`, under `lowprio-run --tier batch`. Reports the
probe's lateness p50/p99 and the CPU shares side by side. Prints Markdown."""
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECONDS = float(os.environ.get("BENCH_LOWPRIO_SECONDS", "4"))
REPEAT = int(os.environ.get("BENCH_LOWPRIO_REPEAT", "3"))
NCPU = os.cpu_count()

PROBE = r"""
import sys, time, threading
dur = float(sys.argv[1])
late = []
def loop():
    end = time.monotonic() + dur
    while time.monotonic() < end:
        t = time.monotonic()
        time.sleep(0.010)
        late.append((time.monotonic() - t - 0.010) * 1000)
th = threading.Thread(target=loop); th.start(); th.join()
late.sort()
print("%.3f %.3f %d" % (late[len(late) // 2], late[int(len(late) * 0.99)], len(late)))
"""
# NCPU busy children for DUR seconds; prints their CPU seconds (wait4).
SPINNERS = ("import os, sys, time\nn, dur = int(sys.argv[1]), float(sys.argv[2])\nkids = []\n"
            "for _ in range(n):\n    pid = os.fork()\n    if pid == 0:\n        end = time.monotonic() + dur\n"
            "        while time.monotonic() < end: pass\n        os._exit(0)\n    kids.append(pid)\n"
            "cpu = 0.0\nfor k in kids:\n    _, _, ru = os.wait4(k, 0)\n    cpu += ru.ru_utime + ru.ru_stime\n"
            "print('%.3f' % cpu)\n")


def start_hog(prefix, dur):
    if prefix is None:
        return None
    hog = subprocess.Popen(prefix + [sys.executable, "-c", SPINNERS, str(NCPU), str(dur + 1.0)],
                           start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    return hog


def finish_hog(hog, dur):
    if hog is None:
        return 0.0, ""
    out, err = hog.communicate(timeout=60)
    mechanism = ""
    for line in err.splitlines():
        if " via " in line:
            mechanism = line.split(" via ", 1)[1].split(":", 1)[0]
    return float(out.split()[-1]) * dur / (dur + 1.0), mechanism   # the service's window


def scenario(prefix):
    """Phase 1: the probe alone against the hog (latency). Phase 2: a
    CPU-bound service wanting every core against the hog (shares). Each
    side runs in a session of its own, as services and SSH logins do."""
    dur = SECONDS
    hog = start_hog(prefix, dur)
    probe = subprocess.Popen([sys.executable, "-c", PROBE, str(dur)], start_new_session=True,
                             stdout=subprocess.PIPE, text=True)
    p50, p99, _ = probe.communicate()[0].split()
    finish_hog(hog, dur)
    hog = start_hog(prefix, dur)
    service = subprocess.Popen([sys.executable, "-c", SPINNERS, str(NCPU), str(dur)],
                               start_new_session=True, stdout=subprocess.PIPE, text=True)
    service_cpu = float(service.communicate()[0])
    hog_cpu, mechanism = finish_hog(hog, dur)
    machine = dur * NCPU
    return float(p50), float(p99), 100 * service_cpu / machine, 100 * hog_cpu / machine, mechanism


def main():
    lowprio = [os.path.join(ROOT, "bin", "lowprio-run"), "--tier", "batch", "--"]
    weight10 = lowprio[:-1] + ["--cpu-weight", "10", "--"]
    rows = []
    for name, prefix in (("no hog", None), ("hog, plain", []), ("hog, nice -n 19", ["nice", "-n", "19"]),
                         ("hog, lowprio-run --tier batch", lowprio),
                         ("hog, lowprio-run --tier batch --cpu-weight 10", weight10)):
        runs = [scenario(prefix) for _ in range(REPEAT)]
        med = [sorted(r[i] for r in runs)[len(runs) // 2] for i in range(4)]
        rows.append((name,) + tuple(med) + (runs[0][4],))
    try:
        cg = subprocess.run(["stat", "-fc", "%T", "/sys/fs/cgroup"], capture_output=True, text=True).stdout.strip()
    except OSError:
        cg = "?"
    print("## lowprio-run: a service's latency and CPU under an all-core hog in another session\n")
    print("Host: %d CPUs, /sys/fs/cgroup is %s, autogroup %s; medians of %d runs of %.0f s per phase.\n" % (
        NCPU, cg, open("/proc/sys/kernel/sched_autogroup_enabled").read().strip(), REPEAT, SECONDS))
    print("| hog | probe lateness p50 ms | probe lateness p99 ms | CPU share: service % | CPU share: hog % | mechanism |")
    print("|---|---|---|---|---|---|")
    for name, p50, p99, service, hog, mech in rows:
        print("| %s | %.2f | %.2f | %.0f | %.0f | %s |" % (name, p50, p99, service, hog, mech or "-"))


def start_cost(n=15):
    """Wall time of `lowprio-run -- true` against `true` run directly: what
    the guard adds before a job starts and after it ends (cgroup, nice and
    ionice, the signal witnesses, the end report), median and worst of n."""
    import tempfile
    times = {}
    with tempfile.TemporaryDirectory() as state:
        env = dict(os.environ, GPUGUARD_STATE_DIR=state)
        for name, cmd in (("true", ["true"]), ("lowprio-run -- true", [os.path.join(ROOT, "bin", "lowprio-run"), "--", "true"])):
            subprocess.run(cmd, env=env, stderr=subprocess.DEVNULL, check=False)     # warm: the disk measured once
            ms = []
            for _ in range(n):
                t = time.monotonic()
                subprocess.run(cmd, env=env, stderr=subprocess.DEVNULL, check=False)
                ms.append((time.monotonic() - t) * 1000)
            times[name] = sorted(ms)
    print("\n## lowprio-run: what it adds to a job's start and end\n")
    print("| command | wall ms, median | worst of %d |" % n)
    print("|---|---|---|")
    for name, ms in times.items():
        print("| `%s` | %.0f | %.0f |" % (name, ms[len(ms) // 2], ms[-1]))


# The disk governor's pacer (lib/iogov.sh iogov_pace_tick) on a fake leaf
# with N processes in a fake /proc, LOOKS looks in one bash. While nobody in
# the job writes, every look reads all N processes, one every 50 ms; while
# one process writes, a look every 10 ms reads that one, and every tenth
# look all N.
PACE = r"""
source lib/common.sh; source lib/cgroup.sh; source lib/iogov.sh
iogov_init "$1" "$2" "" 253:0 "wbps=100000000000 rbps=104857600"
iogov_pace_begin || exit 1
io=$4/1000/io
for ((i = 0; i < $3; i++)); do
  ((${#5})) && printf 'rchar: 1\nwrite_bytes: %d\n' $((4096 * (i + 2))) >"$io"
  iogov_pace_tick
done
"""


def pacer_cost(looks=2000):
    """CPU of the pacer's looks, as a share of one core, with 1, 8 and 64
    processes in the job: nobody writing, and one process writing."""
    import tempfile
    print("\n## The disk governor's pacer: CPU while the cap is on (a service uses the disk)\n")
    print("| processes in the job | nobody writes: ms per look, CPU % (a look every 50 ms) "
          "| one writes: ms per look, CPU % (a look every 10 ms) |")
    print("|---|---|---|")
    for n in (1, 8, 64):
        row = []
        for writing, every_ms in (("", 50), ("yes", 10)):
            with tempfile.TemporaryDirectory() as tmp:
                leaf, proc = os.path.join(tmp, "cg", "job"), os.path.join(tmp, "proc")
                os.makedirs(leaf)
                for name, text in (("cgroup.freeze", "0\n"),
                                   ("cgroup.procs", "".join("%d\n" % (1000 + i) for i in range(n)))):
                    with open(os.path.join(leaf, name), "w") as f:
                        f.write(text)
                for i in range(n):
                    os.makedirs(os.path.join(proc, str(1000 + i)))
                    with open(os.path.join(proc, str(1000 + i), "io"), "w") as f:
                        f.write("rchar: 1\nwchar: 1\nsyscr: 1\nsyscw: 1\nread_bytes: 0\nwrite_bytes: 4096\n"
                                "cancelled_write_bytes: 0\n")
                env = dict(os.environ, LOWPRIO_GOV_PROCFS=proc)
                costs = []
                for count in (0, looks):
                    before = os.times()
                    subprocess.run(["bash", "-c", PACE, "_", leaf, os.path.dirname(leaf), str(count), proc, writing],
                                   cwd=ROOT, env=env, check=True)
                    after = os.times()
                    costs.append(after.children_user + after.children_system - before.children_user
                                 - before.children_system)
                ms = (costs[1] - costs[0]) / looks * 1000
                row.append("%.3f ms, %.1f %%" % (ms, ms / every_ms * 100))
        print("| %d | %s | %s |" % (n, row[0], row[1]))


if __name__ == "__main__":
    main()
    start_cost()
    pacer_cost()
