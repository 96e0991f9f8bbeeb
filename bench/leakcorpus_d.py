#!/usr/bin/env python3
"""Corpus D: labelled per-process GPU memory traces for the leak detector,
written blind (without reading the detector, its docs or its tests).  The
format is corpus-b's and corpus C's: one CSV `timestamp,pid,used_memory_mib`
per trace (T0 = 1796200000; a file may hold several PIDs: the ranks of one
job, or a job and its resumed successor), labels in DIR/manifest.json.

Nothing is drawn: a model of PyTorch's caching allocator gives what
nvidia-smi shows: CUDA context (500-620 MiB) + reserved pool + CUDA-graph
private pools + small pool (2 MiB segments) + memory outside torch (NCCL,
cuBLAS).  The pool only grows (a request cached blocks cannot serve maps a
segment: 20 MiB for 1-10 MiB, its own size in 2 MiB units above); it gives
back only at empty_cache() (segments without a live block) or when cudaMalloc
fails (the allocator frees its cached segments and retries).  Kinds, and why
each is realistic: bench/leakcorpus_d.md.  Deterministic per (kind, seed).

  python3 bench/leakcorpus_d.py DIR [--seeds N] [--first-seed K] [--kinds a,b] [--check]
  python3 bench/leakcorpus_d.py --score DIR [--detector CMD]
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import leakcorpus_c  # the sibling corpus's scorer: the same rules for both

T0 = 1796200000.0
VERSION = 1
GPUS = {"H200": 143771, "H100-80GB": 81559, "A100-40GB": 40960, "A100-80GB": 81920, "L40S": 46068,
        "RTX4090": 24564}
BIG = ["H200", "H100-80GB", "H100-80GB", "A100-80GB"]
ANY = list(GPUS)
LOST_P = 0.002
HEALTHY = ["graph_buckets", "zero3_flush", "teacher_swap", "kv_prealloc", "nccl_lazy", "eval_growing"]
LEAKING = ["graph_shape_leak", "hook_rank_leak", "resume_leak", "slow_flush_leak", "epoch_leak", "kv_server_oom"]
KINDS = HEALTHY + LEAKING
H = 3600.0


def _ceil(v, unit=2):
    return int(math.ceil(max(0.0, v) / unit) * unit)


def _seg(req):
    """Size of the segment mapped for a request of `req` MiB that did not fit."""
    return 2 if req < 1 else 20 if req <= 10 else _ceil(req)


class _Proc:
    """One process as nvidia-smi sees it (MiB)."""
    def __init__(self, rng, gpu, static, act, pid, born=0.0, cv=None):
        self.gpu, self.total, self.pid, self.born = gpu, GPUS[gpu], pid, born
        self.static, self.act = static, act
        self.ctx = rng.randrange(500, 622, 2)
        self.load_s = rng.uniform(60, 420)               # weights arrive in 1-7 min
        self.chunk = rng.choice([64, 128, 256, 512])     # tensors copied while loading
        self.cv = cv if cv is not None else rng.choice([0.02, 0.05, 0.1, 0.15])
        self.step_s = rng.uniform(0.25, 3.0)
        self.ws_level = rng.choice([8, 16, 32, 64])
        self.reserved = self.private = self.small = self.ext = self.ws = 0
        self.until = float("inf")
        self.flushes = []
        self.grew_at = 0.0                              # the last time the pool mapped a big segment

    def used(self):
        return int(self.ctx + self.reserved + self.private + self.small + self.ext + self.ws)

    def need(self, live, peak, req=20, t=0.0):
        """The interval's largest footprint `peak`; maps segments of _seg(req)."""
        short = peak - self.reserved
        if short <= 0:
            return
        seg = _seg(req)
        add = math.ceil(short / seg) * seg
        if self.used() + add > self.total and self.reserved > _ceil(live):
            self.reserved = _ceil(live)                  # cudaMalloc failed: free cached segments, retry
            self.flushes.append(round(t))
            add = math.ceil(max(0.0, peak - self.reserved) / seg) * seg
        if add >= max(64, 0.004 * self.total):
            self.grew_at = t
        self.reserved += add

    def empty_cache(self, live):
        self.reserved = min(self.reserved, _ceil(live))

    def peak(self, rng, dt, scale=1.0, cv=None):
        """Largest activation footprint of the interval's steps (bounded shapes)."""
        k = max(1, int(dt / self.step_s))
        u = rng.random() ** (1.0 / k)
        return self.act * scale * (1 + (self.cv if cv is None else cv) * (2 * u - 1))


def _grid(rng, hours, dt):
    """[(t, t written or None)]: a sample is lost now and then (nvidia-smi timed out)."""
    jit = rng.uniform(0.1, 1.5)
    out = []
    for i in range(int(hours * H / dt)):
        t = i * dt
        w = None if i and rng.random() < LOST_P else t + (rng.uniform(-jit, jit) if i else 0.0)
        out.append((t, w))
    return out


def _run(rng, grid, procs, plans):
    """The processes of one job on one clock; plan(t, dt) -> (live, peak, release,
    req).  One query shows every process; an OOM in any one ends the job."""
    dt = grid[1][0] - grid[0][0]
    rows, oom = [], None
    for t, w in grid:
        out = []
        for p, plan in zip(procs, plans):
            if t < p.born or t >= p.until:
                continue
            age = t - p.born
            if age < p.load_s:
                p.need(0.0, p.static * age / p.load_s, p.chunk, t)
            else:
                live, peak, release, req = plan(t, dt)
                if release:
                    p.empty_cache(live)
                p.need(live, peak, req, t)
            if rng.random() < 0.002:                     # a cuBLAS/NCCL workspace comes or goes
                p.ws = rng.choice((0, p.ws_level))
            if p.small < 6 and rng.random() < 0.01:      # small pool warming up
                p.small += 2
            if p.used() > p.total:
                oom = t
                break
            out.append((p.pid, p.used()))
        if oom is not None:
            break
        if w is not None:
            rows += [(w, pid, v) for pid, v in out]
    return rows, oom


def _drip(st, amount, unit=2):
    """Accumulates `amount` MiB of kept tensors; returns the whole units now mapped."""
    st["owed"] += amount
    n = int(st["owed"] // unit) * unit
    st["owed"] -= n
    st["kept"] += n
    return n


def _hours(rng, lo=12, hi=48):
    return rng.choice([h for h in (12, 16, 20, 24, 30, 36, 48) if lo <= h <= hi])


def _dt(rng, hours, ranks=1):
    if hours <= 16 and ranks <= 2:
        return float(rng.choice([10, 10, 15, 30, 60]))
    return float(rng.choice([15, 20, 30, 60, 60, 120] if ranks <= 2 else [30, 60, 60, 120]))


def _pid(rng):
    return rng.randint(2000, 4000000)


def _job(rng, gpus=ANY, util=(0.35, 0.75), share=(0.15, 0.4), gpu=None, pid=None, born=0.0):
    gpu = gpu or rng.choice(gpus)
    working = GPUS[gpu] * rng.uniform(*util)
    s = rng.uniform(*share)
    return _Proc(rng, gpu, working * (1 - s), working * s, pid or _pid(rng), born)


def _one(rng, lo, hi, gpus, util, share=(0.15, 0.4)):
    """(process, hours, dt) of a single-process job."""
    p = _job(rng, gpus, util, share)
    hours = _hours(rng, lo, hi)
    return p, hours, _dt(rng, hours)


def _spans(rng, hours, every, length, first=None):
    """[(a, b)] recurring spans (evaluations, teacher phases...), a little irregular."""
    out, t = [], first if first is not None else rng.uniform(0.4, 1.0) * every
    while t < hours * H:
        d = rng.uniform(*length)
        out.append((t, t + d))
        t += d + every * rng.uniform(0.85, 1.15)
    return out


class _At:
    """Which span a time falls in, for times that only increase; `ended` is
    true once, at the first call after a span closes."""

    def __init__(self, spans):
        self.spans, self.i, self.was = spans, 0, None

    def at(self, t):
        while self.i < len(self.spans) and self.spans[self.i][1] <= t:
            self.i += 1
        now = self.i if self.i < len(self.spans) and self.spans[self.i][0] <= t else None
        self.ended = self.was is not None and now != self.was
        self.was = now
        return now


def _leak(proc, rows, start, kept, oom, hours, **extra):
    """Leak labels; the rate is what the leak added (`kept` MiB), over the time from start_s to the end."""
    rate = kept / (((oom if oom is not None else hours * H) - start) / H)
    mine = [r for r in rows if r[1] == proc.pid]
    if oom is None:
        t, _, v = mine[-1]
        oom_s = round(max(t, start) + (proc.total - v) / max(rate, 1.0) * H)
    else:
        oom_s = round(oom, 1)
    label = {"leak": True, "start_s": round(start, 1), "rate_mib_h": round(rate, 1), "leak_pid": proc.pid,
             "oom_s": oom_s, "oom_in_trace": oom is not None}
    label.update(extra)
    return label


def _base(proc, hours, dt, **extra):
    label = {"gpu": proc.gpu, "total_mib": proc.total, "hours": hours, "dt_s": dt}
    label.update(extra)
    return label


# ---------------------------------------------------------------- kinds --
# Each returns (rows [(t, pid, used)], label); t in seconds from the job's start.

def _graphs(rng, leak):
    """CUDA graphs per shape bucket (torch.compile "reduce-overhead"): each new bucket's first batch is captured
    into a private pool; rare buckets come late.  Leak: from start_s, exact dynamic shapes capture a graph each."""
    p, hours, dt = _one(rng, 16 if leak else 12, 48, ANY, (0.3, 0.6))
    n_b = rng.randint(4, 14)
    biggest = min(p.act, rng.uniform(150, 1500))
    steps_h = 3600 / p.step_s
    r = rng.uniform(0.35, 0.7)
    p0 = (1 - r) / (1 - r ** n_b)
    rare = rng.uniform(1.0, 8.0)            # expected hour of the rarest bucket's first batch
    scale = 1.0 / (p0 * r ** (n_b - 1) * steps_h * rare)
    events = []                             # (t, MiB of the graph's pool)
    for i in range(n_b):
        t = p.load_s + 60 + rng.expovariate(p0 * r ** i * steps_h * scale) * H
        if t < hours * H:
            events.append((t, biggest * (0.25 + 0.75 * rng.random())))
    start = rate = None
    if leak:
        start = rng.uniform(0.3, 4) * H
        rate = rng.uniform(40, 500)
        m = rng.choice([4, 6, 12, 24, 40])                   # MiB per new graph
        draws_h = rate / _seg(m)
        dist = draws_h * (hours - start / H) / rng.uniform(0.2, 0.6)      # distinct shapes
        t, seen = start, 0
        while True:
            t += rng.expovariate(draws_h) * H
            if t >= hours * H:
                break
            if rng.random() < 1 - seen / dist:
                seen += 1
                events.append((t, m * rng.uniform(0.7, 1.3)))
    events.sort()
    st = {"i": 0, "cap": 0.0}

    def plan(t, dt):
        extra = 0.0
        while st["i"] < len(events) and events[st["i"]][0] <= t:
            size = events[st["i"]][1]
            p.private += _seg(size)
            if start is None or events[st["i"]][0] < start:
                extra = max(extra, size)                     # the eager warm-up run before capture
            st["cap"] += _seg(size) if start is not None and events[st["i"]][0] >= start else 0
            st["i"] += 1
        return p.static, p.static + p.peak(rng, dt) + extra, False, 64

    rows, oom = _run(rng, _grid(rng, hours, dt), [p], [plan])
    label = _base(p, hours, dt, buckets=n_b, graphs=len(events))
    if leak:
        label.update(_leak(p, rows, start, st["cap"], oom, hours, nominal_rate_mib_h=round(rate, 1),
                           distinct_shapes=round(dist)))
    else:
        label["growth_end_s"] = round(max(t for t, _ in events) + 60) if events else round(p.load_s)
    return rows, label


def _zero3(rng, leak):
    """DeepSpeed ZeRO-3 near the limit: big gathers get fresh segments when the cache is fragmented, the pool
    climbs until cudaMalloc fails and the allocator frees its cached segments ("cache flushes")."""
    p, hours, dt = _one(rng, 16, 48, BIG, (0.55, 0.72), (0.1, 0.2))
    bucket = p.total * rng.uniform(0.02, 0.05)
    g_mean = p.total * rng.uniform(0.012, 0.04)
    frag = rng.uniform(0.3, 0.8)
    room = p.total - p.ctx - p.static - p.act - bucket
    per_h = room / (frag * g_mean * rng.uniform(1.5, 10))          # a cycle of 1.5-10 h

    def plan(t, dt):
        peak = p.static + p.peak(rng, dt) + bucket
        if rng.random() < 1 - math.exp(-per_h * dt / H):
            g = g_mean * rng.uniform(0.6, 1.4)
            if rng.random() < frag:                          # no cached block fits: a fresh segment
                if p.used() + _ceil(g) > p.total:
                    p.reserved = _ceil(p.static)
                    p.flushes.append(round(t))
                else:
                    p.reserved += _ceil(g)
            peak += g
        return p.static, peak, False, 256

    rows, _ = _run(rng, _grid(rng, hours, dt), [p], [plan])
    return rows, _base(p, hours, dt, flushes_s=p.flushes[:50], n_flushes=len(p.flushes),
                       big_gather_mib=round(g_mean), floor_flat=True)


def _teacher(rng, leak):
    """Distillation in shards: the teacher on the GPU for 0.3-2 h (soft targets), then teacher.cpu() and the
    student trains 1-4 h; most jobs call empty_cache() after (two levels), the others stay at the top."""
    p, hours, dt = _one(rng, 16, 48, BIG + ["L40S"], (0.2, 0.4))
    teacher = p.total * rng.uniform(0.2, 0.45)
    t_act = teacher * rng.uniform(0.05, 0.2)
    phases = _spans(rng, hours, rng.uniform(1, 4) * H, (0.3 * H, 2 * H), first=rng.uniform(1, 4) * H)
    at = _At(phases)
    release = rng.random() < 0.7
    ramp = rng.uniform(60, 240)

    def plan(t, dt):
        i = at.at(t)
        if i is None:
            return p.static, p.static + p.peak(rng, dt), release and at.ended, 64
        live = p.static + teacher * min(1.0, (t - phases[i][0]) / ramp)
        return live, live + p.peak(rng, dt, 0.15) + t_act, False, 256

    rows, _ = _run(rng, _grid(rng, hours, dt), [p], [plan])
    return rows, _base(p, hours, dt, teacher_mib=round(teacher), empty_cache=release,
                       phases_s=[[round(a), round(b)] for a, b in phases], growth_end_s=round(phases[0][0] + ramp + 600))


def _kv(rng, leak):
    """vLLM-style server: profiling run, empty_cache(), KV preallocated to 85-95 %, graphs; then activation
    records as traffic peaks.  Leak: per-schema GPU masks never evicted, at the traffic's pace (OOM in hours)."""
    p, hours, dt = _one(rng, 12, 36 if leak else 48, ANY, (0.15, 0.5), (0.0, 0.0))
    util = rng.uniform(0.9, 0.95) if leak else rng.uniform(0.85, 0.95)
    prof = p.total * rng.uniform(0.02, 0.08)
    kv = util * p.total - p.ctx - p.static - prof
    p.act = prof
    graphs = rng.uniform(100, 800)
    t_prof = p.load_s + rng.uniform(20, 90)
    t_kv = t_prof + rng.uniform(5, 30)
    t_gr = t_kv + rng.uniform(30, 120)
    phase, amp, base = rng.uniform(0, 24), rng.uniform(0.3, 0.8), rng.uniform(0.25, 0.6)
    start = rng.uniform(0.5, 5) * H if leak else None
    rate = rng.uniform(600, 2000) if leak else 0.0
    st = {"owed": 0.0, "kept": 0.0, "mid": 0.0, "m": 0.0, "g": False}

    def traffic(t):
        return 1 + amp * math.sin(2 * math.pi * (t / H - phase) / 24)

    def plan(t, dt):
        if t < t_prof:
            return p.static, p.static + prof, False, 64
        if t < t_kv:
            return p.static, p.static, True, 64
        live = p.static + kv
        if t >= t_gr and not st["g"]:
            p.private += _ceil(graphs)
            st["g"] = True
        if leak and t >= start:
            st["owed"] += rate * traffic(t) * dt / H
            if not st["m"]:
                st["m"] = rng.uniform(1, 40)
            while st["owed"] >= st["m"]:        # a new schema's masks (<= 10 MiB: shared 20 MiB segments)
                st["owed"] -= st["m"]
                before = p.private
                if st["m"] <= 10:
                    p.private += _ceil(st["mid"] + st["m"], 20) - _ceil(st["mid"], 20)
                    st["mid"] += st["m"]
                else:
                    p.private += _ceil(st["m"])
                st["kept"] += p.private - before
                st["m"] = rng.uniform(1, 40)
        load = min(1.0, base * traffic(t) * rng.uniform(0.6, 1.0 + 0.8 * rng.random() ** 8))
        return live, live + p.peak(rng, dt, load), False, 32

    rows, oom = _run(rng, _grid(rng, hours, dt), [p], [plan])
    label = _base(p, hours, dt, gpu_memory_utilization=round(util, 3), kv_mib=round(kv))
    if leak:
        label.update(_leak(p, rows, start, st["kept"], oom, hours, nominal_rate_mib_h=round(rate)))
    else:
        label["growth_end_s"] = round(max(t_gr + 60, p.grew_at))     # the last new largest batch
    return rows, label


def _ranks(rng, n, gpu, util, share=(0.15, 0.4)):
    first = _pid(rng)
    procs, pid = [], first
    w = GPUS[gpu] * rng.uniform(*util)
    s = rng.uniform(*share)
    for r in range(n):
        q = _Proc(rng, gpu, w * (1 - s) * rng.uniform(0.97, 1.03) + (rng.uniform(300, 1200) if r == 0 else 0),
                  w * s, pid)
        procs.append(q)
        pid += rng.randint(1, 40)
    return procs


def _nccl(rng, leak):
    """One PID per GPU; NCCL maps a communicator (100-500 MiB, outside torch) on a group's first collective:
    the default group, then eval, checkpoint and rare subgroups in the first hours, then none."""
    n = rng.choice([2, 4, 8])
    gpu = rng.choice(BIG)
    hours = _hours(rng, 12, 36)
    dt = _dt(rng, hours, n)
    procs = _ranks(rng, n, gpu, (0.35, 0.7))
    last = rng.uniform(2, 10) * H
    comms = [(max(q.load_s for q in procs) + 30, list(range(n)), rng.uniform(200, 500))]
    for _ in range(rng.randint(2, 5)):
        who = rng.choice([list(range(n)), sorted(rng.sample(range(n), max(1, n // 2))), [0, n - 1]])
        comms.append((rng.uniform(0.3 * H, last), sorted(set(who)), rng.uniform(100, 500)))
    comms.append((last, list(range(n)), rng.uniform(100, 500)))
    comms.sort()
    evals = _spans(rng, hours, rng.uniform(1, 3) * H, (300, 1500))
    scale = rng.uniform(1.1, 1.5)
    plans = []
    for r, q in enumerate(procs):
        at, st = _At(evals), {"i": 0}

        def plan(t, dt, r=r, q=q, at=at, st=st):
            while st["i"] < len(comms) and comms[st["i"]][0] <= t:
                if r in comms[st["i"]][1]:
                    q.ext += _ceil(comms[st["i"]][2])
                st["i"] += 1
            i = at.at(t)
            return q.static, q.static + q.peak(rng, dt, scale if i is not None else 1.0), False, 64
        plans.append(plan)
    rows, _ = _run(rng, _grid(rng, hours, dt), procs, plans)
    return rows, _base(procs[0], hours, dt, pids=[q.pid for q in procs],
                       comms=[[round(a), who, round(m)] for a, who, m in comms],
                       growth_end_s=round(max(last, evals[0][1] + 60)))


def _eval_growing(rng, leak):
    """Continual learning: after each task (1-4 h), an evaluation on every task seen so far gathers their
    outputs on the GPU (the peak rises task by task), then empty_cache(): the floor stays flat."""
    p, hours, dt = _one(rng, 16, 48, ANY, (0.3, 0.55))
    task = rng.uniform(1, 4) * H
    n_tasks = int(hours * H / task) + 1
    per_task = min(rng.uniform(200, 2000), (0.92 * p.total - p.ctx - p.static - 1.2 * p.act) / n_tasks)
    evals, t, k = [], task, 1
    while t < hours * H:
        d = rng.uniform(5, 12) * 60 * k ** 0.5
        evals.append((t, t + d, k))
        t += d + task * rng.uniform(0.9, 1.1)
        k += 1
    at = _At(evals)

    def plan(t, dt):
        i = at.at(t)
        if i is None:
            return p.static, p.static + p.peak(rng, dt), at.ended, 64
        a, _b, k = evals[i]
        gathered = per_task * k * min(1.0, (t - a) / max(60.0, (evals[i][1] - a) * 0.8))
        return p.static, p.static + gathered + p.peak(rng, dt, 0.6), False, max(20.0, per_task / 4)

    rows, _ = _run(rng, _grid(rng, hours, dt), [p], [plan])
    return rows, _base(p, hours, dt, per_task_mib=round(per_task), evals_s=[[round(a), round(b)] for a, b, _ in evals],
                       floor_flat=True)


def _hook_rank(rng, leak):
    """DDP: a forward hook on one rank only (under `if rank == 0`) appends a layer's output every logging
    step; the other ranks are healthy (an alert on them is false)."""
    n = rng.choice([2, 4, 8])
    gpu = rng.choice(BIG + ["L40S"])
    hours = _hours(rng, 12, 36)
    dt = _dt(rng, hours, n)
    procs = _ranks(rng, n, gpu, (0.3, 0.6))
    bad = 0 if rng.random() < 0.5 else rng.randrange(n)
    start = rng.uniform(0.3, 4) * H
    rate = rng.uniform(40, 600)
    every = rng.uniform(60, 900)
    m = rate * every / H
    evals = _spans(rng, hours, rng.uniform(1.5, 4) * H, (300, 1200))
    release = rng.random() < 0.5
    plans, st = [], {"kept": 0.0, "next": start}
    for r, q in enumerate(procs):
        at = _At(evals)

        def plan(t, dt, r=r, q=q, at=at):
            if r == bad:
                while st["next"] <= t:
                    st["kept"] += m
                    st["next"] += every * rng.uniform(0.9, 1.1)
            live = q.static + (st["kept"] if r == bad else 0.0)
            i = at.at(t)
            return live, live + q.peak(rng, dt, 1.3 if i is not None else 1.0), release and at.ended, m
        plans.append(plan)
    rows, oom = _run(rng, _grid(rng, hours, dt), procs, plans)
    label = _base(procs[0], hours, dt, pids=[q.pid for q in procs], append_mib=round(m, 1), every_s=round(every))
    label.update(_leak(procs[bad], rows, start, st["kept"], oom, hours, leak_rank=bad))
    return rows, label


def _resume(rng, leak):
    """Preempted, resumed from the checkpoint (new PID); only the resumed run leaks (its resume path keeps
    small GPU tensors per step: 2 MiB small-pool segments).  Alerts on the first PID are false."""
    p1 = _job(rng, ANY, util=(0.3, 0.65))
    hours = _hours(rng, 20, 48)
    dt = _dt(rng, hours)
    cut = rng.uniform(3, hours - 8) * H
    p2 = _Proc(rng, p1.gpu, p1.static, p1.act, p1.pid + rng.randint(3, 900), born=cut + rng.uniform(120, 1800))
    p2.cv, p2.step_s = p1.cv, p1.step_s
    p1.until = cut
    opt = p1.static * rng.uniform(0.2, 0.5)
    flush = rng.random() < 0.5
    rate = rng.uniform(40, 400)
    t_opt = p2.born + p2.load_s + rng.uniform(60, 300)
    start = t_opt + rng.uniform(120, 1800)
    st = {"owed": 0.0, "kept": 0}

    def plan1(t, dt):
        return p1.static, p1.static + p1.peak(rng, dt), False, 64

    def plan2(t, dt):
        if t < t_opt:
            return p2.static, p2.static + opt, False, 256
        if t >= start:
            p2.small += _drip(st, rate * dt / H * rng.uniform(0.5, 1.5))
        return p2.static, p2.static + p2.peak(rng, dt), flush and t - t_opt < dt, 64

    rows, oom = _run(rng, _grid(rng, hours, dt), [p1, p2], [plan1, plan2])
    label = _base(p1, hours, dt, pids=[p1.pid, p2.pid], resume_s=round(p2.born), opt_load_mib=round(opt))
    label.update(_leak(p2, rows, start, st["kept"], oom, hours))
    return rows, label


def _slow_flush(rng, leak):
    """empty_cache() every step with dynamic shapes (readings jump by GBs); under it 40-70 MiB/h of small
    tensors kept alive pin 2 MiB segments that empty_cache() cannot return."""
    p, hours, dt = _one(rng, 30, 48, ANY, (0.3, 0.6), (0.25, 0.45))
    cv = rng.uniform(0.15, 0.4)
    start = rng.uniform(0, 4) * H
    rate = rng.uniform(40, 70)
    st = {"owed": 0.0, "kept": 0}

    def plan(t, dt):
        if t >= start:
            p.small += _drip(st, rate * dt / H)
        z = max(-2.5, min(2.5, rng.gauss(0, 1)))
        inst = p.act * (1 + cv * z) * rng.random() ** 0.5       # where in a step the query lands
        return p.static, p.static + max(0.0, inst), True, 64

    rows, oom = _run(rng, _grid(rng, hours, dt), [p], [plan])
    label = _base(p, hours, dt, cv=round(cv, 3), empty_cache_every_step=True)
    label.update(_leak(p, rows, start, st["kept"], oom, hours, pool="small"))
    return rows, label


def _epoch(rng, leak):
    """Epochs of 1-3 h; at each boundary an evaluation, a checkpoint, empty_cache() for half the jobs, and a
    snapshot (an EMA/head state_dict clone meant for the CPU) appended on the GPU."""
    p, hours, dt = _one(rng, 16, 48, ANY, (0.3, 0.6))
    epoch = rng.uniform(1, 3) * H
    rate = rng.uniform(60, 450)
    snap = rate * epoch / H
    evals = _spans(rng, hours, epoch, (300, 1800), first=epoch)
    release = rng.random() < 0.5
    scale = rng.uniform(1.1, 1.6)
    at, st = _At(evals), {"kept": 0.0}

    def plan(t, dt):
        i = at.at(t)
        if at.ended:
            st["kept"] += snap * rng.uniform(0.95, 1.05)
        live = p.static + st["kept"]
        if i is not None:
            return live, live + p.peak(rng, dt, scale), False, 64
        return live, live + p.peak(rng, dt), release and at.ended, snap

    rows, oom = _run(rng, _grid(rng, hours, dt), [p], [plan])
    start = evals[0][1]
    label = _base(p, hours, dt, epoch_s=round(epoch), snapshot_mib=round(snap), empty_cache=release)
    label.update(_leak(p, rows, start, st["kept"], oom, hours))
    return rows, label


MAKERS = {
    "graph_buckets": (_graphs, False), "graph_shape_leak": (_graphs, True),
    "zero3_flush": (_zero3, False), "teacher_swap": (_teacher, False),
    "kv_prealloc": (_kv, False), "kv_server_oom": (_kv, True),
    "nccl_lazy": (_nccl, False), "hook_rank_leak": (_hook_rank, True),
    "eval_growing": (_eval_growing, False), "epoch_leak": (_epoch, True),
    "resume_leak": (_resume, True), "slow_flush_leak": (_slow_flush, True),
}


def make_trace(kind, seed):
    """(rows [(ts, pid, used_mib)] sorted by time, label) of one (kind, seed)."""
    return leakcorpus_c.seeded_trace(MAKERS, "d/", "d%d" % VERSION, kind, seed)


def generate(out, seeds, kinds=None, first=0, check=False):
    """Writes the traces and manifest.json into `out`; returns (manifest, problems)."""
    return leakcorpus_c.write_corpus(out, make_trace, kinds or KINDS, seeds, first, _check if check else None)


def _win(series, a, b, f=max):
    vals = [v for t, v in series if a <= t < b]
    return f(vals) if vals else None


def _check(rows, lab):
    """Do the data agree with the label?  Returns a list of disagreements."""
    bad = []
    total = lab["total_mib"]
    if any(v > total for _, _, v in rows):
        bad.append("a sample above the GPU's capacity")
    end = max(r[0] for r in rows) - T0
    if lab["leak"]:
        mine = [(t - T0, v) for t, pid, v in rows if pid == lab["leak_pid"]]
        a = lab["start_s"] + 1800                     # after the load of a resumed PID too
        last = min(end, lab["oom_s"] if lab["oom_in_trace"] else end)
        if last - a < 6 * H:
            a = lab["start_s"]
        w = min(3 * H, (last - a) / 3)
        f = min if lab.get("empty_cache_every_step") else max
        m0, m1 = _win(mine, a, a + w, f), _win(mine, last - w, last + 1, f)
        want = lab["rate_mib_h"] * (last - w - a) / H
        if m0 is None or m1 is None or want <= 0:
            bad.append("no 3 h windows after start_s")
        elif not 0.5 <= (m1 - m0) / want <= 1.6:
            bad.append("%.1f h %s rose %d MiB, rate x time says %d" % (w / H, f.__name__, m1 - m0, want))
        if lab["oom_in_trace"] and lab["hours"] * H - end < 60:
            bad.append("OOM in trace but the trace runs to the end")
        for pid in {r[1] for r in rows} - {lab["leak_pid"]}:
            s = [(t - T0, v) for t, p, v in rows if p == pid]
            g = _win(s, s[-1][0] - 3 * H, s[-1][0] + 1) - _win(s, 1800, 3 * H + 1800)
            if g > 0.02 * total + 64 and lab["kind"] != "resume_leak":
                bad.append("healthy PID %d grew %d MiB" % (pid, g))
        return bad
    for pid in sorted({r[1] for r in rows}):
        s = [(t - T0, v) for t, p, v in rows if p == pid]
        slack = 0.01 * total + 64
        if lab.get("floor_flat"):                     # zero3: every 12 h holds a flush (cycles <= 10 h)
            w = 12 * H if lab["kind"] == "zero3_flush" else 3 * H
            g = _win(s, end - w, end + 1, min) - _win(s, 1800, w + 1800, min)
            what = "%d h minima" % (w / H)
            slack += 0.01 * total if lab["kind"] == "zero3_flush" else 0
        elif "growth_end_s" in lab:
            g0 = lab["growth_end_s"]
            g = _win(s, g0, end + 1) - _win(s, 0, g0)
            what = "maxima after growth_end_s"
            slack += 0.02 * total if lab["kind"] == "kv_prealloc" else 0
        else:
            g = _win(s, end - 3 * H, end + 1) - _win(s, 0, 6 * H)
            what = "last 3 h maximum over the first 6 h's"
        if g > slack:
            bad.append("PID %d: %s rose %d MiB" % (pid, what, g))
    return bad


def main(argv=None):
    return leakcorpus_c.corpus_main("leakcorpus_d.py", "D", KINDS, make_trace, _check, argv)


if __name__ == "__main__":
    sys.exit(main())
