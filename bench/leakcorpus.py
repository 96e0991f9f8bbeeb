#!/usr/bin/env python3
"""Labelled corpus of GPU memory traces for the leak detector, and its scorer.

Every trace is one (kind, seed): `make_trace(kind, seed)` is deterministic
(random.Random seeded from crc32 of the pair). A trace is a dict:
  kind, seed, leak (bool), t0 (leak start, s; None when healthy),
  rate (MiB/h of the leak, for the >= 50 MiB/h delay figure), pid (the
  leaking PID; None = any), total (GPU MiB, the detector is told), dt
  (sampling interval, s), oom (time the leak reaches capacity, s, or None),
  rows [(ts, pid, used_mib)] sorted by time (the 3-column replay format).

The kinds follow issue 12's ten phenomena (parameters in KINDS below, drawn
per seed):
  1 empty_cache dips: one sample 30-60 % lower every 2-10 min      ecache
  2 eval phases 10-40 min every 1-3 h, +-1-8 GiB; checkpoint
    saves +1-8 GiB for 1-5 min every 30-120 min                     eval, ckpt
  3 step leaks: a 128 MiB-2 GiB block every 1-6 h                   step
  4 one-time jumps (256 MiB .. 1/4 of the footprint) then plateau   jump
  5 KV/dataset cache filling for 1-6 h (2-40 GiB; exp, quadratic
    ease-out or square-root shape), decelerating to a ceiling       cachefill
  6 sampling gaps up to 30 min; restarts (new PID, collapse)        gaps, restart
  7 RL phase alternation every 10-30 min (levels 5-40 GiB apart)    rl
  8 8-rank data-parallel tree, one rank leaking                     dp
  9 fast leaks 1-60 GB/h from the first minute, H200 total known;
    the recorded 0.6 -> 120 GB in 88 min; 1 s traces of 5-10 min
    (leaks there reach OOM within them)                             fast, fill88, fast1s
 10 warm-ups ending 1-4 GiB below capacity; noisy series (CV up to
    0.5); leaks after 10 healthy hours; slow leaks 50-80 MiB/h      warmfull, noisy, late, slow
plus the tidy kinds of bench/leak.py (plateau, mixed). "h_" kinds are
healthy, "l_" kinds leak. Seeds 0-3 are the development set, 100-103 the
held-out set (scored only at the end).

  python3 bench/leakcorpus.py [--seeds 0-3] [--module FILE] [--kinds a,b]
prints a per-kind table and the totals.
"""
import argparse
import importlib.util
import math
import os
import random
import sys
import zlib
from multiprocessing import Pool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H200 = 143771
HEALTHY = ["h_plateau", "h_mixed", "h_ecache", "h_eval", "h_ckpt", "h_jump", "h_cachefill", "h_gaps",
           "h_restart", "h_rl", "h_dp", "h_warmfull", "h_noisy", "h_fast1s"]
LEAKING = ["l_linear", "l_ecache", "l_eval", "l_ckpt", "l_step", "l_jump", "l_gaps", "l_restart", "l_rl",
           "l_dp", "l_fast", "l_fill88", "l_fast1s", "l_late", "l_noisy", "l_slow"]
KINDS = HEALTHY + LEAKING


def q(v, block=2):
    return max(0, int(v // block) * block)


class Proc:
    """One process's memory curve as a sum of parts, evaluated per sample."""

    def __init__(self, rng, base=None, warm=None, tau=None):
        self.rng = rng
        self.base = base if base is not None else 500 + rng.uniform(8000, 60000)
        self.warm = warm if warm is not None else rng.uniform(1024, 8192)
        self.tau = tau if tau is not None else rng.uniform(120, 1200)
        self.leak = None            # (t0, rate MiB/h, block MiB)
        self.steps = []             # (t, size): permanent level shifts
        self.phases = []            # (start, end, delta): temporary levels
        self.dips = None            # (period s, depth range)
        self.fill = None            # (amount, tau, shape)
        self.noise_cv = 0.0
        self.toggle = 0

    def leaked(self, t):
        if not self.leak or t < self.leak[0]:
            return 0.0
        t0, rate, block = self.leak
        return block * math.floor((t - t0) / 3600.0 * rate / block)

    def value(self, t, i):
        v = self.base + self.warm * (1 - math.exp(-t / self.tau))
        for ts, size in self.steps:
            if t >= ts:
                v += size
        if self.fill:
            amount, dur, shape = self.fill
            x = min(1.0, t / dur)
            if shape == "exp":
                frac = (1 - math.exp(-3 * x)) / (1 - math.exp(-3))
            elif shape == "quad":
                frac = 1 - (1 - x) ** 2
            else:
                frac = math.sqrt(x)
            v += amount * frac
        v += self.leaked(t)
        if self.rng.random() < 0.002:
            self.toggle ^= 1
        v += self.toggle * 20
        for a, b, delta in self.phases:
            if a <= t < b:
                v += delta
                break
        if self.noise_cv:
            v *= max(0.05, 1 + self.rng.gauss(0, self.noise_cv))
        if self.dips and i % self.dips[0] == self.dips[1]:
            v *= 1 - self.rng.uniform(0.3, 0.6)
        return q(v)


def periodic(rng, hours, every, length, delta):
    """Phases [(start, end, delta)] every `every` s (range) lasting `length`."""
    out, t = [], rng.uniform(*every) * rng.random()
    while t < hours * 3600:
        d = rng.uniform(*length)
        out.append((t, t + d, delta() if callable(delta) else delta))
        t += d + rng.uniform(*every)
    return out


def sample(proc, pid, hours, dt, t_start=0.0, gaps=()):
    rows = []
    n = int(hours * 3600 / dt)
    for i in range(n):
        t = t_start + i * dt
        if any(a <= t < b for a, b in gaps):
            continue
        rows.append((t, pid, proc.value(t - t_start, i)))
    return rows


def make_trace(kind, seed):
    rng = random.Random(zlib.crc32(("%s/%d" % (kind, seed)).encode()))
    leak = kind.startswith("l_")
    k = kind[2:]
    dt, hours, total = 60.0, 24.0, H200
    t0 = rng.uniform(1.0, 3.0) * 3600 if leak else None
    rate = rng.choice([50, 60, 80, 100, 150, 200, 300, 500]) if leak else 0.0
    block = rng.choice([2, 20, 20, 20])
    pid, leak_pid = 1000 + seed, None
    p = Proc(rng)
    rows = None
    gaps = ()
    if k in ("plateau", "linear", "slow"):
        if k == "slow":
            rate = rng.uniform(50, 80)
    elif k == "mixed":
        p.steps = [(rng.uniform(2, 22) * 3600, rng.uniform(512, 6144)) for _ in range(rng.randint(1, 2))]
        p.phases = periodic(rng, hours, (1800, 7200), (60, 480), rng.uniform(1024, 8192))
        p.noise_cv = 0.0005
    elif k == "ecache":
        p.dips = (rng.randint(2, 10), rng.randint(0, 1))
    elif k == "eval":
        sign = rng.choice([1, -1])
        p.phases = periodic(rng, hours, (3600, 3 * 3600), (600, 2400), lambda: sign * rng.uniform(1024, 8192))
        if rng.random() < 0.5:
            p.dips = (rng.randint(3, 10), 0)
    elif k == "ckpt":
        p.phases = periodic(rng, hours, (1800, 7200), (60, 300), lambda: rng.uniform(1024, 8192))
    elif k == "step":
        size = rng.choice([128, 256, 512, 512, 1024, 2048])
        period = rng.uniform(1, 6) * 3600 if size >= 512 else rng.uniform(1, 2) * 3600
        rate = size / (period / 3600.0)
        hours = 36.0
        t0 = rng.uniform(1.0, 3.0) * 3600
        p.steps = [(t0 + j * period, size) for j in range(int(hours * 3600 / period) + 1)]
    elif k == "jump":
        foot = p.base + p.warm
        for _ in range(rng.randint(1, 2)):
            p.steps.append((rng.uniform(2, 20) * 3600, rng.uniform(256, foot / 4)))
    elif k == "cachefill":
        p.fill = (rng.uniform(2048, 40960), rng.uniform(1, 6) * 3600, rng.choice(["exp", "quad", "sqrt"]))
    elif k == "gaps":
        gaps = []
        for _ in range(rng.randint(2, 5)):
            a = rng.uniform(1, 23) * 3600
            gaps.append((a, a + rng.uniform(300, 1800)))
    elif k == "restart":
        tr = rng.uniform(4, 12) * 3600
        gap = rng.uniform(60, 600)
        p2 = Proc(rng, base=p.base * rng.uniform(0.6, 1.1))
        if leak:
            t0 = tr + gap + rng.uniform(0.5, 2) * 3600
            p2.leak = (t0 - tr - gap, rate, block)
        leak_pid = pid + 1 if leak else None
        rows = sample(p, pid, tr / 3600, dt) + sample(p2, pid + 1, hours - (tr + gap) / 3600, dt, t_start=tr + gap)
    elif k == "rl":
        delta = rng.choice([1, -1]) * rng.uniform(5120, 40960)
        if delta < 0:
            p.base -= delta
        p.phases = periodic(rng, hours, (600, 1800), (600, 1800), delta)
    elif k == "dp":
        leaker = rng.randrange(8)
        base = rng.uniform(20000, 60000)
        rows = []
        for r in range(8):
            pr = Proc(rng, base=base + rng.uniform(-500, 500))
            if rng.random() < 0.5:
                pr.dips = (rng.randint(3, 10), r % 2)
            if leak and r == leaker:
                pr.leak = (t0, rate, block)
            rows += sample(pr, pid * 10 + r, hours, dt)
        leak_pid = pid * 10 + leaker if leak else None
    elif k == "fast":
        rate = rng.uniform(1024, 61440)
        p.base = 500 + rng.uniform(2000, 60000)
        t0 = 60.0
        hours = 24.0
    elif k == "fill88":
        # recorded on an H200: 0.6 -> 120 GB in 88 min; OOM at 120 GB
        # (another tenant holds the rest)
        p = Proc(rng, base=600, warm=rng.uniform(0, 400), tau=60)
        rate = (120000 - 600) / (88 / 60.0)
        t0, hours, block = 0.0, 1.6, 2
        total = 120000 + rng.uniform(0, 2000)
    elif k == "fast1s":
        dt, hours = 1.0, rng.uniform(5, 10) / 60
        p = Proc(rng, base=500 + rng.uniform(1000, 30000), warm=rng.uniform(0, 3000), tau=rng.uniform(5, 30))
        p.dips = (rng.randint(10, 40), 0)
        p.phases = periodic(rng, hours, (60, 180), (10, 40), lambda: rng.uniform(1024, 8192))
        if leak:
            # GB/min: OOM 5-10 min after the start (the trace ends there)
            t0 = rng.uniform(0, 30)
            hours = 12 / 60.0
            rate = (H200 - p.base - p.warm) / (rng.uniform(5, 10) / 60.0)
            block = 64
    elif k == "warmfull":
        p.tau = rng.uniform(120, 3600)
        p.base = H200 - rng.uniform(1024, 4096) - p.warm
    elif k == "noisy":
        p.base = 500 + rng.uniform(2000, 20000)
        p.noise_cv = rng.uniform(0.05, 0.5)
    elif k == "late":
        t0 = rng.uniform(10, 12) * 3600
        hours = 24.0
    if leak and kind not in ("l_restart", "l_dp", "l_step"):
        p.leak = (t0, rate, block)
    if rows is None:
        rows = sample(p, pid, hours, dt, gaps=gaps)
    rows.sort()
    oom = None
    if leak:
        over = [t for t, _, v in rows if v > total]
        if over:
            oom = over[0]
            rows = [r for r in rows if r[0] < oom]
    start = 1796206508 + seed * 100000
    rows = [(start + t, pp, v) for t, pp, v in rows]
    return {"kind": kind, "seed": seed, "leak": leak, "t0": (start + t0) if leak else None, "rate": rate,
            "pid": leak_pid if leak_pid is not None else (pid if leak else None), "total": total, "dt": dt,
            "oom": (start + oom) if oom is not None else None, "rows": rows}


# ---------------------------------------------------------------- scoring --

def load_module(path):
    sys.path.insert(0, os.path.dirname(path))
    spec = importlib.util.spec_from_file_location("leakdet_%d" % (zlib.crc32(path.encode())), path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def detect(mod, tr):
    """Firing events [(ts, pid)] of a detector module over a trace."""
    if hasattr(mod, "replay_rows"):
        evs = mod.replay_rows(tr["rows"], mod.params_from({}), gpu_total=tr["total"])
        return [(e["ts"], e.get("leaking_pid", e["pid"])) for e in evs if e["state"] == "firing"]
    series, out = {}, []
    for ts, pid, v in tr["rows"]:
        s = series.get(pid)
        if s is None:
            s = series[pid] = mod.Series(dict(mod.DEFAULTS), str(pid), pid)
        ev = s.add(ts, v, tr["total"] - v)
        if ev and ev["state"] == "firing":
            out.append((ev["ts"], pid))
    return out


MODULE = None


def score_one(args):
    kind, seed, path = args
    global MODULE
    if MODULE is None:
        MODULE = load_module(path)
    tr = make_trace(kind, seed)
    fired = detect(MODULE, tr)
    res = {"kind": kind, "seed": seed, "leak": tr["leak"], "rate": tr["rate"], "fired": bool(fired)}
    if tr["leak"]:
        good = [t for t, pid in fired if t >= tr["t0"] and (tr["pid"] is None or pid == tr["pid"])]
        bad = [t for t, pid in fired if t < tr["t0"] or (tr["pid"] is not None and pid != tr["pid"])]
        res["caught"] = bool(good) and (tr["oom"] is None or good[0] < tr["oom"])
        res["early"] = bool(bad)
        res["delay_h"] = (good[0] - tr["t0"]) / 3600 if good else None
        res["lead_min"] = (tr["oom"] - good[0]) / 60 if good and tr["oom"] else None
        res["oom"] = tr["oom"] is not None
    return res


def parse_seeds(text):
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def median(v):
    s = sorted(v)
    if not s:
        return float("nan")
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def score(path, seeds, kinds, procs=2):
    jobs = [(k, s, path) for k in kinds for s in seeds]
    with Pool(procs) as pool:
        return pool.map(score_one, jobs, chunksize=1)


def table(results, title):
    lines = ["### %s" % title, "",
             "| kind | traces | leaks caught | healthy flagged | alerts before start / wrong PID "
             "| median delay h | min lead before OOM min |",
             "|---|---|---|---|---|---|---|"]
    kinds = []
    for r in results:
        if r["kind"] not in kinds:
            kinds.append(r["kind"])
    for k in kinds:
        rs = [r for r in results if r["kind"] == k]
        if rs[0]["leak"]:
            d = [r["delay_h"] for r in rs if r["caught"]]
            leads = [r["lead_min"] for r in rs if r["lead_min"] is not None]
            lines.append("| %s | %d | %d/%d | | %d | %s | %s |" % (
                k, len(rs), sum(r["caught"] for r in rs), len(rs), sum(r["early"] for r in rs),
                "%.2f" % median(d) if d else "-", "%.0f" % min(leads) if leads else "-"))
        else:
            lines.append("| %s | %d | | %d/%d | | | |" % (k, len(rs), sum(r["fired"] for r in rs), len(rs)))
    leaks = [r for r in results if r["leak"]]
    healthy = [r for r in results if not r["leak"]]
    d50 = [r["delay_h"] for r in leaks if r["caught"] and r["rate"] >= 50]
    lines.append("| **all** | %d | **%d/%d** | **%d/%d** | %d | **%.2f** | |" % (
        len(results), sum(r["caught"] for r in leaks), len(leaks), sum(r["fired"] for r in healthy),
        len(healthy), sum(r["early"] for r in leaks), median(d50)))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0-3", help="seed list, e.g. 0-3 or 100-103")
    ap.add_argument("--module", default=os.path.join(ROOT, "python", "gpuguard_leak.py"),
                    help="detector module to score (e.g. an older version)")
    ap.add_argument("--kinds", default="", help="comma-separated kinds (default: all)")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--verbose", action="store_true", help="one line per trace")
    a = ap.parse_args(argv)
    kinds = a.kinds.split(",") if a.kinds else KINDS
    results = score(os.path.abspath(a.module), parse_seeds(a.seeds), kinds, a.procs)
    if a.verbose:
        for r in results:
            print(r, file=sys.stderr)
    print(table(results, "corpus, seeds %s, %s" % (a.seeds, os.path.relpath(a.module, ROOT))))


if __name__ == "__main__":
    main()
