#!/usr/bin/env python3
"""Workloads for bench/h200/lowprio_io.sh (stdlib only).

  cpu SECONDS N        N busy processes; prints their total loop iterations/s
  io SECONDS DIR       every 20 ms a 4 KiB write+fsync and a 4 KiB O_DIRECT
                       read at a random offset of DIR/probe.r (made first);
                       prints "p50w p99w p50r p99r n" in ms
  flush SECONDS DIR    every 100 ms an fsync of DIR/probe.f, unchanged since
                       its first: a bare cache flush of the disk, with
                       nothing to write or journal; prints "p50 p99 n" in ms
  hog SECONDS N        N busy processes (the job's all-core CPU hog)
  table RESULTS        the Markdown table from the tab-separated results
"""
import mmap
import os
import random
import sys
import time


def spin(seconds, n, report):
    end = time.monotonic() + seconds
    pipes = []
    for _ in range(n):
        r, w = os.pipe()
        if os.fork() == 0:
            os.close(r)
            count = 0
            while time.monotonic() < end:
                for _ in range(1000):
                    pass
                count += 1
            os.write(w, b"%d" % count)
            os._exit(0)
        os.close(w)
        pipes.append(r)
    total = 0
    for r in pipes:
        data = b""
        while True:
            chunk = os.read(r, 64)
            if not chunk:
                break
            data += chunk
        total += int(data or b"0")
        os.close(r)
    for _ in pipes:
        os.wait()
    if report:
        print("%.0f" % (total / seconds))


def probe(seconds, folder):
    rpath = os.path.join(folder, "probe.r")
    size = 64 << 20
    if not os.path.exists(rpath) or os.path.getsize(rpath) != size:
        with open(rpath, "wb") as f:
            block = os.urandom(1 << 20)
            f.writelines(block for _ in range(size >> 20))
            f.flush()
            os.fsync(f.fileno())
    buf = mmap.mmap(-1, 4096)                   # page-aligned, for O_DIRECT
    try:
        rfd = os.open(rpath, os.O_RDONLY | os.O_DIRECT)
        direct = True
    except OSError:                             # a file system without O_DIRECT (overlay, tmpfs)
        rfd = os.open(rpath, os.O_RDONLY)
        direct = False
        print("O_DIRECT unavailable here: reads after dropping the file's cache", file=sys.stderr)
    wfd = os.open(os.path.join(folder, "probe.w"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    data = os.urandom(4096)
    writes, reads = [], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        os.pwrite(wfd, data, random.randrange(0, 256) * 4096)
        os.fsync(wfd)
        t1 = time.monotonic()
        offset = random.randrange(0, size // 4096) * 4096
        if not direct:
            os.posix_fadvise(rfd, offset, 4096, os.POSIX_FADV_DONTNEED)
        os.preadv(rfd, [buf], offset)
        t2 = time.monotonic()
        writes.append((t1 - t0) * 1000)
        reads.append((t2 - t1) * 1000)
        rest = 0.020 - (time.monotonic() - t0)
        if rest > 0:
            time.sleep(rest)
    os.close(rfd)
    os.close(wfd)
    writes.sort()
    reads.sort()

    def pct(v, p):
        return v[min(len(v) - 1, int(len(v) * p))]
    print("%.2f %.2f %.2f %.2f %d" % (pct(writes, 0.5), pct(writes, 0.99), pct(reads, 0.5), pct(reads, 0.99),
                                      len(writes)))


def flush(seconds, folder):
    """Is the floor of a write+fsync beside a capped writer the disk's own
    cache flush? An fsync of a file that has not changed since its last
    fsync has nothing to write or journal; ext4 then only asks the device
    to make its write cache durable (a bare flush, ext4_sync_file's
    needs_barrier). If that costs what the service's write+fsync costs
    beside the job, the wait is the job's data in the disk's volatile
    cache, not the journal or the cap's queue."""
    path = os.path.join(folder, "probe.f")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    waits = []
    try:
        os.write(fd, os.urandom(4096))
        os.fsync(fd)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            os.fsync(fd)
            waits.append((time.monotonic() - t0) * 1000)
            rest = 0.100 - (time.monotonic() - t0)
            if rest > 0:
                time.sleep(rest)
    finally:
        os.close(fd)
    waits.sort()
    print("%.2f %.2f %d" % (waits[len(waits) // 2], waits[min(len(waits) - 1, int(len(waits) * 0.99))], len(waits)))


def table(path):
    """Rows: device, job, cpu_iter_s, p50w, p99w, p50r, p99r, n, job_mib_s."""
    rows = [line.rstrip("\n").split("\t") for line in open(path) if line.strip()]
    idle = {}
    for r in rows:
        if r[1] == "none (idle)":
            idle[r[0]] = r
    print("| device | job beside the service | service CPU throughput, % of idle | write+fsync p99 ms (x idle) "
          "| O_DIRECT read p99 ms (x idle) | probes | job wrote MiB/s | >= 95 % CPU and p99 <= 2x idle |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        base = idle.get(r[0])
        cpu = "-"
        ok_cpu = True
        if r[2] != "-" and base and base[2] != "-":
            share = 100.0 * float(r[2]) / float(base[2])
            cpu = "%.1f" % share
            ok_cpu = share >= 95.0
        xw = float(r[4]) / float(base[4]) if base and float(base[4]) else 0
        xr = float(r[6]) / float(base[6]) if base and float(base[6]) else 0
        ok = ok_cpu and xw <= 2.0 and xr <= 2.0
        verdict = "-" if r[1] == "none (idle)" else ("yes" if ok else "no")
        print("| %s | %s | %s | %s (%.1fx) | %s (%.1fx) | %s | %s | %s |" % (
            r[0], r[1], cpu, r[4], xw, r[6], xr, r[7], r[8], verdict))


def main():
    mode = sys.argv[1]
    if mode == "cpu":
        spin(float(sys.argv[2]), int(sys.argv[3]), True)
    elif mode == "hog":
        spin(float(sys.argv[2]), int(sys.argv[3]), False)
    elif mode == "io":
        probe(float(sys.argv[2]), sys.argv[3])
    elif mode == "flush":
        flush(float(sys.argv[2]), sys.argv[3])
    elif mode == "table":
        table(sys.argv[2])
    else:
        sys.exit("unknown mode %s" % mode)


if __name__ == "__main__":
    main()
