#!/usr/bin/env python3
"""Where does the service's fsync floor beside a capped checkpoint writer
come from: the disk, or the way io.max caps the job? (issue 23; root,
cgroup v2; stdlib only)

Usage: bench/h200/disk_freeze.py DIR [IO_S] [PCTS]
  DIR    a folder on the disk under test (the job's checkpoints and the
         service's probe files go there; removed at the end)
  IO_S   seconds per row (default 20)
  PCTS   comma-separated shares of the disk's measured write speed (default 12,24)

io.max caps the job's bios: its writeback waits in the block layer's
throttle, and a service's fsync on ext4 (data=ordered) waits for the job's
data that rides in the same journal commit, throttled bios included. The
other way to cap a writer is at the source: hold back the process that
dirties the pages (here: freeze its cgroup while it is ahead of a byte
budget, /proc/PID/io write_bytes counting each page when it is dirtied),
and let its writeback go at the disk's speed. Rows, each with the service
of bench/h200/lowprio_io.py (every 20 ms a 4 KiB write+fsync and a 4 KiB
O_DIRECT read) beside a job writing new 1000 MiB files with dd conv=fsync
from a cgroup of its own:
  idle              no job
  plain             the job uncapped
  io.max P %        io.max wbps at P % of the measured speed (where the
                    cgroup has the io controller)
  frozen P %        the job's cgroup frozen while it is ahead of P % of
                    the measured speed (10 ms looks, 4 MiB of burst)
  cpu.max P %       the job's cgroup held at P % of the measured speed by
                    its CPU quota instead (cpu.max, set every 50 ms from
                    what it wrote and the CPU it used: the kernel paces
                    it in 20 ms periods, and nothing stays stopped if the
                    governor dies)
  plain alone       no service: the job's own speed, the 100 % of the
                    "job MiB/s" column
Prints a Markdown table; the job's MiB/s is what it dirtied (write_bytes)
while the row ran.
"""
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TICK = 0.01
BURST = 4 << 20


def _cgroup_root():
    """The v2 hierarchy: /sys/fs/cgroup on a pure v2 host, its unified
    part on a hybrid one."""
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if os.path.exists(os.path.join(root, "cgroup.subtree_control")):
            return root
    sys.stderr.write("disk_freeze: no cgroup v2 hierarchy\n")
    sys.exit(2)


def _measure_write(folder):
    """MiB/s of 256 MiB written with O_DIRECT in 4 MiB blocks, without
    lowprio-run --measure-disk's 1 MiB blocks and final fsync: its figure
    is higher (1974 against 1017 MiB/s on the H100 host), so P % here is
    not the shipped default's P %."""
    path = os.path.join(folder, "measure")
    t = time.monotonic()
    subprocess.run(["dd", "if=/dev/zero", "of=" + path, "bs=4M", "count=64", "oflag=direct", "status=none"],
                   check=True)
    speed = 256 / (time.monotonic() - t)
    os.unlink(path)
    return speed


def _written(pids, last):
    """Updates last (PID -> write_bytes) and returns the sum over every PID seen."""
    for pid in pids:
        try:
            with open("/proc/%s/io" % pid) as f:
                for line in f:
                    if line.startswith("write_bytes:"):
                        last[pid] = int(line.split()[1])
        except OSError:
            pass
    return sum(last.values())


class _Job:
    """The checkpoint writer in a cgroup of its own, metered (and, with a
    rate, frozen while ahead of it)."""

    def __init__(self, root, folder, rate=None, wbps=None, dev=None, cpu=False):
        self.cg = os.path.join(root, "gg-fz-%d" % os.getpid())
        os.mkdir(self.cg)
        self.cpu = cpu
        if wbps:
            with open(os.path.join(self.cg, "io.max"), "w") as f:
                f.write("%s wbps=%d" % (dev, wbps))
        self.rate, self.last, self.frozen_s = rate, {}, 0.0
        self.stop = threading.Event()
        script = ("echo $$ > %s/cgroup.procs; i=0; while :; do i=$((i+1)); "
                  "dd if=/dev/zero of=%s/ckpt.$((i%%2)) bs=1M count=1000 conv=fsync status=none; done")
        self.proc = subprocess.Popen(["sh", "-c", script % (self.cg, folder)])
        while not open(os.path.join(self.cg, "cgroup.procs")).read().strip():
            time.sleep(0.001)
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self._govern_cpu if cpu else self._govern)
        self.thread.start()

    def _freeze(self, on):
        with open(os.path.join(self.cg, "cgroup.freeze"), "w") as f:
            f.write("1" if on else "0")

    def _govern(self):
        credit, frozen, prev_t, prev_w = BURST, False, time.monotonic(), 0
        while not self.stop.is_set():
            pids = open(os.path.join(self.cg, "cgroup.procs")).read().split()
            w = _written(pids, self.last)
            now = time.monotonic()
            if self.rate:
                credit = min(BURST, credit + self.rate * (now - prev_t)) - (w - prev_w)
                if (credit < 0) != frozen:
                    frozen = credit < 0
                    self._freeze(frozen)
                if frozen:
                    self.frozen_s += now - prev_t
            prev_t, prev_w = now, w
            time.sleep(TICK)
        if frozen:
            self._freeze(False)

    def _cpu_usage(self):
        with open(os.path.join(self.cg, "cpu.stat")) as f:
            for line in f:
                if line.startswith("usage_usec"):
                    return int(line.split()[1])
        return 0

    def _cpu_max(self, allowance):
        if allowance is None:
            text = "max 100000"
        else:
            period = min(1000000, max(20000, int(1000 / max(allowance, 0.001))))
            text = "%d %d" % (max(1000, int(allowance * period)), period)
        with open(os.path.join(self.cg, "cpu.max"), "w") as f:
            f.write(text)

    def _govern_cpu(self):
        """Every 50 ms: writing faster than the rate cuts the CPU the job
        may use in proportion; slower lets it grow (at most doubling)."""
        ncpu = os.cpu_count() or 1
        allowance, prev_t, prev_w, prev_u = None, time.monotonic(), 0, self._cpu_usage()
        while not self.stop.is_set():
            time.sleep(0.05)
            pids = open(os.path.join(self.cg, "cgroup.procs")).read().split()
            w, u, now = _written(pids, self.last), self._cpu_usage(), time.monotonic()
            dt = max(now - prev_t, 1e-3)
            rate, used = (w - prev_w) / dt, (u - prev_u) / 1e6 / dt
            new = allowance
            if rate > self.rate * 1.05:
                new = max(0.001, used * self.rate / rate)
            elif allowance is not None:
                new = allowance * (min(2.0, self.rate / rate) if rate > 0 else 2.0)
                if new >= ncpu:
                    new = None
            if new != allowance:
                allowance = new
                self._cpu_max(allowance)
            if allowance is not None:
                self.frozen_s += now - prev_t
            prev_t, prev_w, prev_u = now, w, u
        if allowance is not None:
            self._cpu_max(None)

    def end(self):
        """Stops the job; returns (MiB/s dirtied, seconds frozen)."""
        self.stop.set()
        self.thread.join()
        pids = open(os.path.join(self.cg, "cgroup.procs")).read().split()
        mib_s = _written(pids, self.last) / 2**20 / (time.monotonic() - self.t0)
        with open(os.path.join(self.cg, "cgroup.kill"), "w") as f:
            f.write("1")
        self.proc.wait()
        while open(os.path.join(self.cg, "cgroup.procs")).read().strip():
            time.sleep(0.01)
        os.rmdir(self.cg)
        return mib_s, self.frozen_s


def _service(folder, seconds):
    out = subprocess.run([sys.executable, os.path.join(HERE, "lowprio_io.py"), "io", str(seconds), folder],
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[1]), float(out[3])


def main(argv):
    if len(argv) < 2 or not os.path.isdir(argv[1]):
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    folder = argv[1]
    io_s = int(argv[2]) if len(argv) > 2 else 20
    pcts = [float(p) for p in (argv[3] if len(argv) > 3 else "12,24").split(",")]
    root = _cgroup_root()
    st = os.stat(folder)
    dev = "%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))
    # a partition's io.max goes to its whole disk
    part = "/sys/dev/block/%s/partition" % dev
    if os.path.exists(part):
        dev = open(os.path.join(os.path.dirname(os.path.realpath("/sys/dev/block/" + dev)), "dev")).read().strip()
    ctl = open(os.path.join(root, "cgroup.subtree_control")).read().split()
    has_io, has_cpu = "io" in ctl, "cpu" in ctl
    speed = _measure_write(folder)
    print("disk %s measured %.0f MiB/s (O_DIRECT writes); io controller: %s; %d s a row\n" % (
        dev, speed, "yes" if has_io else "no (no io.max rows)", io_s))
    rows = [("idle", None)] + [("plain", {})]
    for p in pcts:
        if has_io:
            rows.append(("io.max %g %%" % p, {"wbps": int(speed * p / 100 * 2**20), "dev": dev}))
        rows.append(("frozen %g %%" % p, {"rate": speed * p / 100 * 2**20}))
        if has_cpu:
            rows.append(("cpu.max %g %%" % p, {"rate": speed * p / 100 * 2**20, "cpu": True}))
    rows.append(("plain alone", "alone"))
    print("| row | write+fsync p99 ms | O_DIRECT read p99 ms | job MiB/s | job frozen (or under a quota) s |")
    print("|---|---|---|---|---|")
    try:
        for name, how in rows:
            job = None
            if how is not None:
                job = _Job(root, folder, **({} if how == "alone" else how))
                time.sleep(1)       # the job's first checkpoint is under way
            if how == "alone":
                time.sleep(io_s)
                w = r = float("nan")
            else:
                w, r = _service(folder, io_s)
            mib_s, frozen = job.end() if job else (0.0, 0.0)
            print("| %s | %.2f | %.2f | %.0f | %.1f |" % (name, w, r, mib_s, frozen), flush=True)
    finally:
        for name in os.listdir(folder):
            if name.startswith(("ckpt.", "probe.")):
                os.unlink(os.path.join(folder, name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
