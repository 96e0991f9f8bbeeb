#!/usr/bin/env python3
"""Helpers for bench/h200/iocost_matrix.sh (stdlib only).

  iops SECONDS DIR THREADS   4 KiB O_DIRECT random and sequential reads and
                             writes, THREADS at a time, a quarter of SECONDS
                             each; prints "rrandiops rseqiops wrandiops
                             wseqiops" (what io.cost.model's linear model
                             wants besides the bandwidths)
  table TSV                  the Markdown table of the matrix
"""
import mmap
import os
import random
import sys
import threading
import time

_BLOCK = 4096


def _fill(path, size):
    """A file of SIZE bytes of real data (no unwritten extents to convert)."""
    if os.path.exists(path) and os.path.getsize(path) == size:
        return
    with open(path, "wb") as f:
        chunk = os.urandom(1 << 20)
        f.writelines(chunk for _ in range(size >> 20))
        f.flush()
        os.fsync(f.fileno())


def _run(path, write, sequential, seconds, threads):
    """IOPS of THREADS threads doing 4 KiB O_DIRECT I/O on PATH for SECONDS."""
    size = os.path.getsize(path)
    blocks = size // _BLOCK
    counts = [0] * threads
    end = time.monotonic() + seconds

    def worker(i):
        buf = mmap.mmap(-1, _BLOCK)             # page-aligned, for O_DIRECT
        buf.write(os.urandom(_BLOCK))
        fd = os.open(path, (os.O_WRONLY if write else os.O_RDONLY) | os.O_DIRECT)
        # sequential: each thread walks its own slice of the file
        pos = i * (blocks // threads)
        n = 0
        try:
            while time.monotonic() < end:
                if sequential:
                    pos = pos + 1 if pos + 1 < blocks else 0
                    off = pos * _BLOCK
                else:
                    off = random.randrange(blocks) * _BLOCK
                if write:
                    os.pwritev(fd, [buf], off)
                else:
                    os.preadv(fd, [buf], off)
                n += 1
        finally:
            os.close(fd)
        counts[i] = n

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    start = time.monotonic()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return int(sum(counts) / max(time.monotonic() - start, 1e-3))


def iops(seconds, folder, threads):
    path = os.path.join(folder, "iops.dat")
    _fill(path, 256 << 20)
    quarter = seconds / 4
    try:
        out = [_run(path, w, s, quarter, threads)
               for w, s in ((False, False), (False, True), (True, False), (True, True))]
    except OSError as e:                        # no O_DIRECT here (tmpfs, overlay)
        print("iops: %s" % e, file=sys.stderr)
        out = [0, 0, 0, 0]
    finally:
        os.unlink(path)
    print(" ".join(str(x) for x in out))


# TSV columns, one line per (row, job kind): id, hypothesis, label, kind,
# p50w, p99w, p50r, p99r, n, MiB/s beside, MiB/s alone, MiB written beside,
# MiB charged to the job's io.stat beside, iocost wait ms beside.
def _load(path):
    rows = {}
    order = []
    for line in open(path):
        if not line.strip():
            continue
        r = line.rstrip("\n").split("\t")
        if r[0] not in rows:
            rows[r[0]] = {"hyp": r[1], "label": r[2]}
            order.append(r[0])
        rows[r[0]][r[3]] = r
    return order, rows


def _num(v):
    try:
        return float(v)
    except ValueError:
        return None


def _x(r, col, base):
    v = _num(r[col]) if r else None
    if v is None or not base:
        return "-"
    return "%.1f (%.1fx)" % (v, v / base)


def _pct(v, base):
    v = _num(v)
    if v is None or not base:
        return "-"
    return "%.0f %%" % (100 * v / base)


def _charged(r):
    if not r:
        return "-"
    moved, charged = _num(r[11]), _num(r[12])
    if moved is None or charged is None:
        return "-"
    return "%.0f / %.0f" % (charged, moved)


def table(path):
    order, rows = _load(path)
    idle = rows.get("idle", {}).get("idle")
    w0 = _num(idle[5]) if idle else None
    r0 = _num(idle[7]) if idle else None
    plain = rows.get("plain", {})
    base = {k: _num(plain[k][10]) for k in ("new", "rewrite", "direct8") if k in plain}
    print("| row | hyp. | setting (job io.weight; service default 100) | beside ckpt: fsync p99 ms (x idle) "
          "| beside ckpt: read p99 ms (x idle) | ckpt MiB/s beside (of plain alone) | ckpt alone (of plain alone) "
          "| ckpt: MiB charged to job / written | beside 8 O_DIRECT: fsync p99 (x idle) | beside 8 O_DIRECT: read "
          "p99 (x idle) | 8 writers alone (of plain alone) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for rid in order:
        row = rows[rid]
        if rid == "idle":
            print("| idle | - | no job | %.2f | %.2f | - | - | - | - | - | - |" % (w0 or 0, r0 or 0))
            continue
        ck = row.get("new") or row.get("rewrite")
        kind = "new" if row.get("new") else "rewrite"
        d8 = row.get("direct8")
        cbase = base.get("new")
        print("| %s | %s | %s%s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            rid, row["hyp"], row["label"], " (rewrites one file)" if kind == "rewrite" else "",
            _x(ck, 5, w0), _x(ck, 7, r0),
            "%s (%s)" % (ck[9], _pct(ck[9], cbase)) if ck else "-",
            "%s (%s)" % (ck[10], _pct(ck[10], cbase)) if ck else "-",
            _charged(ck), _x(d8, 5, w0), _x(d8, 7, r0),
            "%s (%s)" % (d8[10], _pct(d8[10], base.get("direct8"))) if d8 else "-"))
    print()
    print("Goals (issue 23, default tier beside a checkpoint writer): read p99 <= 3x idle, fsync p99 <= 5x idle, "
          "job alone >= 90 % and beside >= 10 % of plain alone. 'charged / written': MiB the job's own io.stat "
          "counted as written (wbytes) against MiB its dd wrote, beside the service.")


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: iocost_matrix.py iops SECONDS DIR THREADS | table TSV")
    mode = sys.argv[1]
    if mode == "iops":
        iops(float(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    elif mode == "table":
        table(sys.argv[2])
    else:
        sys.exit("unknown mode %s" % mode)


if __name__ == "__main__":
    main()
