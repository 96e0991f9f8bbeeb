#!/usr/bin/env python3
"""Corpus C: a third family of labelled GPU memory traces for the leak
detector, written without looking at how the detector decides.

Each trace is what `nvidia-smi --query-compute-apps=pid,used_memory` shows
for the processes of one job: a CSV `timestamp,pid,used_memory_mib` (the
replay format of `gpu-leak-watch --replay`, timestamps from T0 = 1796200000
as in ../shared/leak-corpus-b) and a label in DIR/manifest.json (leak,
kind, start_s, rate_mib_h, leak_pid, total_mib, oom_s, growth_end_s...).

The curves are not drawn: they come from a small model of PyTorch's CUDA
caching allocator.  What nvidia-smi reports for a process is
    CUDA context (500-620 MiB) + reserved pool + small pool + workspaces
and the reserved pool only grows: when a step needs more than is cached, a
new segment is mapped (the size of the allocation that did not fit, at
least 20 MiB, in 2 MiB units), and memory goes back to the driver only when
the program calls torch.cuda.empty_cache(), and then only the segments that
hold no live block.  Fragmentation is cached memory no request can reuse:
it makes the pool creep.  So a leak shows as 2-256 MiB segments, often when
a large batch forces one, and a level the job already held costs nothing.

Kinds (see bench/leakcorpus_c.md for why each is realistic):
  healthy: rl_colocate, lora_cap, frag_creep, pp_stages, cron_gaps,
           moe_wander, resume_bs, seqlen_curriculum
  leaking: pp_stage_leak, rl_train_leak, lora_noevict, frag_leak,
           cron_leak, eval_graph, moe_leak
Every (kind, seed) is deterministic: random.Random seeded with the crc32 of
"kind/seed".  Sampling is 10-60 s (a 1 s watcher is emitted every 10 s to
keep 48 h traces small); a sample is lost now and then as when nvidia-smi
times out.

  python3 bench/leakcorpus_c.py DIR [--seeds N] [--first-seed S] [--kinds a,b]
  python3 bench/leakcorpus_c.py --score DIR [--detector CMD]
The second form replays every trace through bin/gpu-leak-watch with the
GPU's capacity (as a live watcher reads it) and prints a per-kind table.
"""
import argparse
import csv
import json
import math
import os
import random
import shlex
import statistics
import subprocess
import sys
import zlib
from multiprocessing import Pool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T0 = 1796200000.0
VERSION = 1
GPUS = {"H200": 143771, "H100-80GB": 81559, "A100-80GB": 81920, "L40S": 46068, "RTX4090": 24564}
BIG = ["H200", "H200", "H100-80GB", "A100-80GB"]
ANY = ["H200", "H100-80GB", "A100-80GB", "L40S", "RTX4090"]
LOST_P = 0.002          # a sample lost (nvidia-smi timed out)

HEALTHY = ["rl_colocate", "lora_cap", "frag_creep", "pp_stages", "cron_gaps", "moe_wander", "resume_bs",
           "seqlen_curriculum"]
LEAKING = ["pp_stage_leak", "rl_train_leak", "lora_noevict", "frag_leak", "cron_leak", "eval_graph", "moe_leak"]
KINDS = HEALTHY + LEAKING


def _ceil(v, unit=2):
    return int(math.ceil(max(0.0, v) / unit) * unit)


class _Pool:
    """The caching allocator's reserved memory of one process (MiB)."""

    def __init__(self, grain):
        self.reserved = 0
        self.grain = grain          # typical size of the allocations that map new segments

    def need(self, peak):
        """A step needs `peak` MiB at once: map a segment if the cache is short."""
        short = peak - self.reserved
        if short > 0:
            self.reserved += _ceil(max(short, max(20, self.grain)))

    def empty_cache(self, live):
        """torch.cuda.empty_cache(): unused segments go back; those with a live block stay."""
        self.reserved = min(self.reserved, _ceil(live))


class _Job:
    """The parameters one process draws: GPU, context, weights, activations."""

    def __init__(self, rng, gpus=ANY, util=(0.35, 0.8), gpu=None):
        self.gpu = gpu or rng.choice(gpus)
        self.total = GPUS[self.gpu]
        self.ctx = rng.choice([502, 514, 532, 548, 566, 590, 612])
        working = self.total * rng.uniform(*util)
        share = rng.uniform(0.15, 0.45)
        self.static = working * (1 - share)     # weights, grads, optimizer state
        self.act = working * share              # activations at the usual batch
        self.cv = rng.choice([0.02, 0.05, 0.1, 0.2])
        self.grain = rng.choice([20, 20, 64, 128, 256])
        self.step_s = rng.uniform(0.3, 4.0)
        self.load_s = rng.uniform(60, 400)
        self.ws_levels = [0, rng.choice([8, 16, 32, 64])]

    def peak(self, rng, dt, scale=1.0):
        """Largest activation footprint among the steps of one interval
        (bounded shapes: the max of k uniform draws)."""
        k = max(1, int(dt / self.step_s))
        u = rng.random() ** (1.0 / k)
        return self.act * scale * (1 + self.cv * (2 * u - 1))


def _grid(rng, hours, dt, gaps=(), cron=False):
    """[(t on the job's clock, t written or None)]: the simulation runs on
    every tick, samples in gaps or lost are not written."""
    out = []
    n = int(hours * 3600 / dt)
    for i in range(n):
        t = i * dt
        written = t + (rng.uniform(0.2, 2.5) if cron else rng.uniform(-0.3, 0.3) if i else 0.0)
        if cron and rng.random() < 0.01:
            written += rng.uniform(3, 20)       # cron started late on a loaded box
        lost = i > 0 and rng.random() < LOST_P
        if lost or any(a <= t < b for a, b in gaps):
            written = None
        out.append((t, written))
    return out


def _simulate(rng, job, grid, plan, pid, t_offset=0.0):
    """Runs one process over `grid`; plan(t, dt) -> (live, peak, release).
    Returns (rows, oom_t): the process dies at the first sample above the
    GPU's capacity (OOM), which is not written."""
    pool = _Pool(job.grain)
    rows, ws, small = [], 0, 0
    dt = grid[1][0] - grid[0][0] if len(grid) > 1 else 60.0
    for t, written in grid:
        if t < job.load_s:                      # weights arriving, no steps yet
            pool.need(job.static * t / job.load_s)
        else:
            live, peak, release = plan(t, dt)
            if release:
                pool.empty_cache(live)
            pool.need(peak)
        if rng.random() < 0.003:                # a cuBLAS/NCCL workspace comes or goes
            ws = rng.choice(job.ws_levels)
        if small < 6 and rng.random() < 0.01:   # small pool warming up (2 MiB segments)
            small += 2
        used = job.ctx + pool.reserved + small + ws
        if used > job.total:
            return rows, t + t_offset
        if written is not None:
            rows.append((written + t_offset, pid, int(used)))
    return rows, None


def _schedule(rng, hours, every, length, start=None):
    """[(a, b)] recurring spans (evaluations, checkpoints), a little irregular."""
    out = []
    t = start if start is not None else rng.uniform(0.3, 1.0) * every
    while t < hours * 3600:
        d = rng.uniform(*length)
        out.append((t, t + d))
        t += every * rng.uniform(0.85, 1.15)
    return out


class _Spans:
    """Which recurring span a time falls in, for times that only increase."""

    def __init__(self, spans):
        self.spans, self.i = spans, 0

    def at(self, t):
        while self.i < len(self.spans) and self.spans[self.i][1] <= t:
            self.i += 1
        if self.i < len(self.spans) and self.spans[self.i][0] <= t:
            return self.i
        return None


def _projected_oom(rows, total, rate, start_s):
    t, _, v = rows[-1]
    return round(max(t - T0, start_s) + (total - v) / rate * 3600.0)


def _leak_label(job, rows, pid, start, rate, oom, **extra):
    mine = [r for r in rows if r[1] == pid]
    label = {"leak": True, "start_s": round(start, 1), "rate_mib_h": round(rate, 1), "leak_pid": pid,
                 "oom_s": round(oom, 1) if oom is not None else _projected_oom(mine, job.total, rate, start),
                 "oom_in_trace": oom is not None}
    label.update(extra)
    return label


def _hours(rng, lo=12, hi=48):
    return rng.choice([h for h in (12, 16, 24, 30, 36, 48) if lo <= h <= hi])


def _dt(rng, choices=(10, 10, 15, 20, 30, 60)):
    return float(rng.choice(choices))


def _pid(rng):
    return rng.randint(2000, 4000000)


# ---------------------------------------------------------------- kinds --
# Each returns (rows [(ts, pid, used)], label).  Times inside are seconds
# from the job's start; _write adds T0.

def _rl(rng, leak):
    """RL colocation (verl/OpenRLHF hybrid engine): one process alternates
    a rollout (weights + the inference engine's KV cache) with a training
    phase (weights + grads + optimizer + activations); between phases the
    engine sleeps or the optimizer is offloaded, then empty_cache()."""
    job = _Job(rng, BIG, util=(0.15, 0.3))
    hours, dt = _hours(rng), _dt(rng)
    kv = job.total * rng.uniform(0.25, 0.5)
    train = job.static * rng.uniform(1.5, 3.0) if rng.random() < 0.5 else job.static * rng.uniform(0.3, 0.8)
    phases, t, kind = [], 0.0, rng.choice(["rollout", "train"])
    while t < hours * 3600:
        d = rng.uniform(5, 40) * 60
        phases.append((t, t + d, kind))
        t += d
        kind = "train" if kind == "rollout" else "rollout"
    start = rng.uniform(0.5, 3.0) * 3600 if leak else None
    r_train = rng.uniform(40, 800) if leak else 0.0     # MiB per training hour
    st = {"i": 0, "leaked": 0.0, "phase": -1}

    def plan(t, dt):
        while phases[st["i"]][1] <= t and st["i"] < len(phases) - 1:
            st["i"] += 1
        _a, _b, kind = phases[st["i"]]
        release = st["phase"] != st["i"]
        st["phase"] = st["i"]
        if leak and kind == "train" and t >= start:
            st["leaked"] += r_train * dt / 3600.0
        live = job.static + st["leaked"]
        if kind == "rollout":
            return live, live + kv + job.peak(rng, dt, 0.2), release
        return live, live + train + job.peak(rng, dt), release

    pid = _pid(rng)
    rows, oom = _simulate(rng, job, _grid(rng, hours, dt), plan, pid)
    label = {"gpu": job.gpu, "total_mib": job.total, "hours": hours, "dt_s": dt, "kv_mib": round(kv),
                 "train_extra_mib": round(train)}
    if leak:
        end = (oom if oom is not None else hours * 3600)
        share = sum(max(0.0, min(b, end) - max(a, start)) for a, b, k in phases if k == "train") / max(1.0, end - start)
        label.update(_leak_label(job, rows, pid, start, r_train * share, oom, train_rate_mib_h=round(r_train, 1)))
    return rows, label


class _Blocks:
    """Free blocks in the cached segments that hold LoRA adapters."""

    def __init__(self):
        self.free = []
        self.reserved = 0

    def load(self, size):
        fits = [b for b in self.free if b >= size]
        if fits:
            b = min(fits)
            self.free.remove(b)
            if b - size > 1:
                self.free.append(b - size)
        else:
            self.reserved += _ceil(size)

    def evict(self, size):
        self.free.append(size)


def _lora(rng, leak):
    """A serving process (PEFT/LoRAX style) loads LoRA adapters on demand: a
    hot set at once, then a long tail of adapters at Poisson times; the
    cache holds at most `cap` and evicts the least recently used (the freed
    block is reused by the next adapter).  The leak: eviction never runs."""
    job = _Job(rng, ANY, util=(0.3, 0.55))
    hours, dt = _hours(rng, 16, 48), _dt(rng)
    size0 = rng.choice([16, 40, 80, 160, 320])
    sizes = [size0 * rng.choice([0.5, 1, 1, 1, 2]) for _ in range(4)]
    rate = rng.uniform(30, 400)
    per_h = rate / statistics.mean(sizes)                # new adapters an hour
    if per_h < 1.5:         # at least a few an hour: smaller adapters (lower ranks)
        sizes = [s * per_h / 1.5 for s in sizes]
        per_h = 1.5
    hot = rng.randint(2, 12)
    cap_h = rng.uniform(1.0, hours / 3)
    cap = hot + max(2, int(per_h * cap_h))
    loads, t = [], rng.uniform(300, 900)
    for _ in range(hot):
        loads.append((t, rng.choice(sizes)))
        t += rng.uniform(5, 120)
    t = loads[-1][0]
    while t < hours * 3600:
        t += rng.expovariate(per_h) * 3600
        loads.append((t, rng.choice(sizes)))
    blocks, lru, st = _Blocks(), [], {"i": 0, "start": None, "after": 0.0}

    def plan(t, dt):
        while st["i"] < len(loads) and loads[st["i"]][0] <= t:
            size = loads[st["i"]][1]
            if len(lru) >= cap:
                if not leak:
                    blocks.evict(lru.pop(0))
                elif st["start"] is None:
                    st["start"] = loads[st["i"]][0]
            blocks.load(size)
            lru.append(size)
            if st["start"] is not None:
                st["after"] += size
            st["i"] += 1
        live = job.static + blocks.reserved
        return live, live + job.peak(rng, dt), False

    pid = _pid(rng)
    rows, oom = _simulate(rng, job, _grid(rng, hours, dt), plan, pid)
    cap_at = loads[cap - 1][0]
    label = {"gpu": job.gpu, "total_mib": job.total, "hours": hours, "dt_s": dt, "adapters_cap": cap,
                 "adapter_mib": sorted({round(s) for s in sizes}), "growth_end_s": round(cap_at)}
    if leak:
        # the rate is what was loaded past the cap, over the time since
        start = st["start"] if st["start"] is not None else cap_at
        end = oom if oom is not None else hours * 3600
        label.pop("growth_end_s")
        label.update(_leak_label(job, rows, pid, start, max(st["after"], size0) / ((end - start) / 3600), oom,
                                 cap_passed_s=round(start), nominal_rate_mib_h=round(rate, 1)))
    return rows, label


def _frag(rng, leak):
    """Variable shapes (packing, dynamic batches) fragment the cache: memory
    no request can reuse grows, and the pool maps more segments.  Healthy:
    the creep decelerates (A * (1 - exp(-t/tau))).  Leak: it does not (a
    long-lived small tensor pinned in each new segment, 40-150 MiB/h)."""
    job = _Job(rng, ANY, util=(0.4, 0.75))
    job.cv = rng.choice([0.1, 0.2, 0.3])
    hours, dt = _hours(rng, 24, 48), _dt(rng)
    amount, tau = rng.uniform(768, 2560), rng.uniform(2, 8) * 3600
    start = rng.uniform(0, 4) * 3600 if leak else None
    rate = rng.uniform(40, 150) if leak else 0.0
    ckpt = _Spans(_schedule(rng, hours, rng.uniform(3600, 3 * 3600), (60, 300))) if rng.random() < 0.5 else None
    st = {"in": None}

    def plan(t, dt):
        waste = amount * (1 - math.exp(-t / tau)) if not leak else 0.0
        if leak:
            waste = amount * 0.3 * (1 - math.exp(-t / 3600)) + (rate * (t - start) / 3600 if t >= start else 0)
        release = False
        if ckpt:
            now = ckpt.at(t)
            release = now is None and st["in"] is not None
            st["in"] = now
        live = job.static + waste
        return live, live + job.peak(rng, dt), release

    pid = _pid(rng)
    rows, oom = _simulate(rng, job, _grid(rng, hours, dt), plan, pid)
    label = {"gpu": job.gpu, "total_mib": job.total, "hours": hours, "dt_s": dt, "cv": job.cv, "empty_cache": bool(ckpt)}
    if leak:
        label.update(_leak_label(job, rows, pid, start, rate, oom))
    else:
        label.update(creep_mib=round(amount), creep_tau_h=round(tau / 3600, 2), growth_end_s=round(3 * tau))
    return rows, label


def _pp(rng, leak):
    """Pipeline parallelism (1F1B): stage i keeps activations of (S - i)
    micro-batches, the first holds the embeddings, the last the LM head and
    the logits; each stage is a process on its own GPU.  Evaluations change
    shapes; some jobs call empty_cache() after them."""
    gpu = rng.choice(BIG)
    stages = rng.choice([4, 4, 8])
    hours, dt = _hours(rng, 12, 36), _dt(rng, (15, 20, 30, 60))
    w = GPUS[gpu] * rng.uniform(0.15, 0.35)
    mb = GPUS[gpu] * rng.uniform(0.3, 0.45) / stages
    evals = _schedule(rng, hours, rng.uniform(2, 4) * 3600, (300, 1200))
    release_after_eval = rng.random() < 0.5
    bad = rng.randrange(stages) if leak else None
    start = rng.uniform(1, 6) * 3600 if leak else None
    rate = rng.uniform(20, 500) if leak else 0.0
    pid0 = _pid(rng)
    rows, oom_all, jobs = [], None, []
    scales = [rng.uniform(0.6, 1.5) for _ in range(stages)]     # evaluation shapes per stage
    for s in range(stages):
        job = _Job(rng, gpu=gpu)
        job.static = w * (1.25 if s in (0, stages - 1) else 1.0)
        job.act = mb * (stages - s) + (mb * 0.8 if s == stages - 1 else 0)
        jobs.append(job)
    # a job that runs: its busiest stage, evaluating, fits in 85 % of the GPU
    worst = max(j.ctx + j.static + j.act * max(1.0, k) * (1 + j.cv) for j, k in zip(jobs, scales))
    fit = min(1.0, 0.85 * GPUS[gpu] / worst)
    for job in jobs:
        job.static *= fit
        job.act *= fit
    grid = _grid(rng, hours, dt)
    for s, job in enumerate(jobs):
        spans, st = _Spans(evals), {"in": None}
        scale = scales[s]

        def plan(t, dt, s=s, job=job, spans=spans, st=st, scale=scale):
            now = spans.at(t)
            release = release_after_eval and now is None and st["in"] is not None
            st["in"] = now
            live = job.static + (rate * (t - start) / 3600 if s == bad and t >= start else 0.0)
            return live, live + job.peak(rng, dt, scale if now is not None else 1.0), release

        r, oom = _simulate(random.Random(rng.random()), job, grid, plan, pid0 + s)
        if oom is not None:
            oom_all = oom
        rows.append(r)
    if oom_all is not None:                  # one stage's OOM ends the whole job
        rows = [[x for x in r if x[0] < oom_all] for r in rows]
    flat = sorted((x for r in rows for x in r), key=lambda x: (x[0], x[1]))
    label = {"gpu": gpu, "total_mib": GPUS[gpu], "hours": hours, "dt_s": dt, "stages": stages,
                 "pids": [pid0 + s for s in range(stages)], "eval_release": release_after_eval}
    if leak:
        label.update(_leak_label(jobs[bad], flat, pid0 + bad, start, rate, oom_all, leak_stage=bad))
    return flat, label


def _cron_gaps(rng, hours):
    """Gaps of a watcher run from cron each minute: runs skipped on a loaded
    box (minutes) and the watcher stopped for hours and restarted."""
    gaps = []
    for _ in range(int(rng.uniform(4, 12) * hours / 24) + 1):
        a = rng.uniform(0.5, hours - 0.5) * 3600
        gaps.append((a, a + rng.uniform(3, 25) * 60))
    for _ in range(rng.randint(1, 2)):
        a = rng.uniform(0.2, 0.75) * hours * 3600
        gaps.append((a, a + rng.uniform(1, 6) * 3600))
    return sorted(gaps)


def _cron(rng, leak):
    """A training job with checkpoints (state copied to CPU, then
    empty_cache()) and evaluations (bigger batches, kept in the cache until
    the next checkpoint), watched from cron at 60 s with gaps."""
    job = _Job(rng, ANY, util=(0.35, 0.7))
    hours = _hours(rng, 24, 48)
    gaps = _cron_gaps(rng, hours)
    ckpt = _Spans(_schedule(rng, hours, rng.uniform(1, 2) * 3600, (60, 400)))
    evals = _Spans(_schedule(rng, hours, rng.uniform(2, 4) * 3600, (300, 1500)))
    scale = rng.uniform(1.2, 1.8)
    start = rng.uniform(1, 8) * 3600 if leak else None
    rate = rng.uniform(20, 300) if leak else 0.0
    st = {"ck": None}

    def plan(t, dt):
        now = ckpt.at(t)
        release = now is None and st["ck"] is not None
        st["ck"] = now
        live = job.static + (rate * (t - start) / 3600 if leak and t >= start else 0.0)
        return live, live + job.peak(rng, dt, scale if evals.at(t) is not None else 1.0), release

    pid = _pid(rng)
    rows, oom = _simulate(rng, job, _grid(rng, hours, 60.0, gaps, cron=True), plan, pid)
    label = {"gpu": job.gpu, "total_mib": job.total, "hours": hours, "dt_s": 60.0,
                 "gaps_s": [[round(a), round(b)] for a, b in gaps]}
    if leak:
        label.update(_leak_label(job, rows, pid, start, rate, oom))
    return rows, label


def _moe(rng, leak):
    """Dropless MoE: activations follow the busiest expert's token count,
    which wanders (mean-reverting) as the router's load shifts; the job
    calls empty_cache() every few minutes, so nvidia-smi follows the wander
    within a band."""
    job = _Job(rng, BIG, util=(0.4, 0.7))
    hours, dt = _hours(rng, 24 if leak else 16, 48), _dt(rng)
    band_mib = rng.uniform(1024, 4096)                      # +-1-4 GiB around the mean
    tau = rng.uniform(0.5, 4) * 3600
    every = rng.uniform(5, 30) * 60
    start = rng.uniform(1, 6) * 3600 if leak else None
    rate = rng.uniform(50, 400) if leak else 0.0
    if leak:        # a leak that outgrows the band within the trace (else no one could see it)
        band_mib = min(band_mib, rate * (hours - start / 3600) / 3)
    band = min(0.4, band_mib / job.act)
    st = {"b": 1.0, "last": 0.0}

    def plan(t, dt):
        b = st["b"] - (st["b"] - 1.0) * dt / tau + band * math.sqrt(2 * dt / tau) * rng.gauss(0, 0.5)
        st["b"] = min(1 + band, max(1 - band, b))
        release = t - st["last"] >= every
        if release:
            st["last"] = t
        live = job.static + (rate * (t - start) / 3600 if leak and t >= start else 0.0)
        return live, live + job.peak(rng, dt, st["b"]), release

    pid = _pid(rng)
    rows, oom = _simulate(rng, job, _grid(rng, hours, dt), plan, pid)
    label = {"gpu": job.gpu, "total_mib": job.total, "hours": hours, "dt_s": dt, "band_mib": round(band * job.act),
                 "wander_tau_h": round(tau / 3600, 2), "empty_cache_every_s": round(every)}
    if leak:
        label.update(_leak_label(job, rows, pid, start, rate, oom))
    return rows, label


def _resume_bs(rng, leak):
    """A job preempted and resumed from its checkpoint with another batch
    size (1-2 times): a new PID after minutes, the optimizer state loaded
    to the GPU first (that peak stays cached unless empty_cache()), then a
    level set by the new batch."""
    del leak
    job = _Job(rng, ANY, util=(0.3, 0.6))
    hours, dt = _hours(rng, 16, 48), _dt(rng)
    n = rng.randint(2, 3)
    cuts = sorted(rng.uniform(3, hours - 3) * 3600 for _ in range(n - 1))
    bounds = [0.0] + cuts + [hours * 3600]
    rows, pid, pids, scales = [], _pid(rng), [], []
    for k in range(n):
        gap = 0.0 if k == 0 else rng.uniform(120, 1800)
        a, b = bounds[k] + gap, bounds[k + 1]
        scale = 1.0 if k == 0 else rng.uniform(0.5, 2.0)
        load = rng.uniform(0.3, 1.0) * job.static if k else 0.0
        load_end = job.load_s + rng.uniform(60, 240)
        flush = rng.random() < 0.3

        def plan(t, dt, scale=scale, load=load, load_end=load_end, flush=flush):
            if t < load_end:
                return job.static, job.static + load, False
            return job.static, job.static + job.peak(rng, dt, scale), flush and t - load_end < dt

        r, _ = _simulate(rng, job, _grid(rng, (b - a) / 3600, dt), plan, pid, t_offset=a)
        rows += r
        pids.append(pid)
        scales.append(round(scale, 2))
        pid += rng.randint(3, 900)
    return rows, {"gpu": job.gpu, "total_mib": job.total, "hours": hours, "dt_s": dt, "pids": pids,
                      "resumes_s": [round(c) for c in cuts], "batch_scales": scales}


def _curriculum(rng, leak):
    """Sequence-length curriculum: the context doubles 2-3 times at
    scheduled steps (activations scale with it), then stays."""
    del leak
    job = _Job(rng, ANY, util=(0.25, 0.45))
    hours, dt = _hours(rng, 16, 48), _dt(rng)
    stages = sorted(rng.uniform(1, 12) * 3600 for _ in range(rng.randint(2, 3)))
    growth = rng.uniform(1.3, 2.0)
    room = job.total * 0.9 - job.ctx - job.static      # the last stage still fits the GPU
    rise = rng.uniform(3072, 16384)                     # all the stages together (MiB)
    job.act = min(job.act, room / (growth ** len(stages) * (1 + job.cv)), rise / (growth ** len(stages) - 1))

    def plan(t, dt):
        scale = growth ** sum(1 for s in stages if t >= s)
        return job.static, job.static + job.peak(rng, dt, scale), False

    rows, _ = _simulate(rng, job, _grid(rng, hours, dt), plan, _pid(rng))
    return rows, {"gpu": job.gpu, "total_mib": job.total, "hours": hours, "dt_s": dt, "growth_end_s": round(stages[-1]),
                      "stages_s": [round(s) for s in stages], "act_growth": round(growth, 2)}


def _eval_graph(rng, leak):
    """An evaluation loop without torch.no_grad() that sums `val += loss`
    into a value kept after the evaluation (an attribute, a history list):
    the graph of every evaluation batch stays alive, a fixed amount each
    evaluation.  Half the jobs call empty_cache() after evaluating."""
    del leak
    job = _Job(rng, ANY, util=(0.3, 0.6))
    hours, dt = _hours(rng, 12, 48), _dt(rng)
    every = rng.uniform(20, 120) * 60
    rate = rng.uniform(20, 500)
    per_eval = rate * every / 3600
    evals = _schedule(rng, hours, every, (120, 900), start=rng.uniform(0.5, 2.5) * 3600)
    spans = _Spans(evals)
    release = rng.random() < 0.5
    st = {"kept": 0.0, "in": None}

    def plan(t, dt):
        now = spans.at(t)
        ended = now is None and st["in"] is not None
        st["in"] = now
        if now is not None:
            a, b = evals[now]
            growing = per_eval * (t - a) / (b - a)
            live = job.static + st["kept"] + growing
            return live, live + job.peak(rng, dt, 0.7), False
        if ended:
            st["kept"] += per_eval
        live = job.static + st["kept"]
        return live, live + job.peak(rng, dt), release and ended

    pid = _pid(rng)
    rows, oom = _simulate(rng, job, _grid(rng, hours, dt), plan, pid)
    label = {"gpu": job.gpu, "total_mib": job.total, "hours": hours, "dt_s": dt, "eval_every_s": round(every),
                 "per_eval_mib": round(per_eval, 1), "empty_cache": release}
    label.update(_leak_label(job, rows, pid, evals[0][0], rate, oom))
    return rows, label


MAKERS = {
    "rl_colocate": (_rl, False), "rl_train_leak": (_rl, True),
    "lora_cap": (_lora, False), "lora_noevict": (_lora, True),
    "frag_creep": (_frag, False), "frag_leak": (_frag, True),
    "pp_stages": (_pp, False), "pp_stage_leak": (_pp, True),
    "cron_gaps": (_cron, False), "cron_leak": (_cron, True),
    "moe_wander": (_moe, False), "moe_leak": (_moe, True),
    "resume_bs": (_resume_bs, False), "seqlen_curriculum": (_curriculum, False),
    "eval_graph": (_eval_graph, True),
}


def seeded_trace(makers, tag, family, kind, seed):
    """(rows [(ts, pid, used_mib)] sorted by time, label) of one (kind,
    seed) of a generator family (its `makers`: kind -> (function, leak)),
    the random state seeded from TAG + "KIND/SEED" (corpus D's too)."""
    fn, leak = makers[kind]
    rng = random.Random(zlib.crc32(("%s%s/%d" % (tag, kind, seed)).encode()))
    rows, label = fn(rng, leak)
    rows = sorted(((T0 + t, pid, v) for t, pid, v in rows), key=lambda r: (r[0], r[1]))
    label.setdefault("leak", False)
    label.update(kind=kind, seed=seed, family=family)
    return rows, label


def make_trace(kind, seed):
    """(rows [(ts, pid, used_mib)] sorted by time, label) of one (kind, seed)."""
    return seeded_trace(MAKERS, "", "c%d" % VERSION, kind, seed)


def _write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["timestamp", "pid", "used_memory_mib"])
        for t, pid, v in rows:
            w.writerow(["%.3f" % t, pid, v])


def write_corpus(out, make, kinds, seeds, first=0, check=None):
    """Writes make(kind, seed)'s trace for each kind and seed, and
    manifest.json, into `out` (corpus D's too); returns (manifest, the
    disagreements check(rows, label) found, each "FILE: what")."""
    os.makedirs(out, exist_ok=True)
    manifest, problems = {}, []
    for kind in kinds:
        for seed in range(first, first + seeds):
            rows, label = make(kind, seed)
            name = "%s_%d.csv" % (kind, seed)
            _write(os.path.join(out, name), rows)
            manifest[name] = label
            if check:
                problems += ["%s: %s" % (name, s) for s in check(rows, label)]
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    return manifest, problems


def generate(out, seeds, kinds=None, first=0):
    """Writes the traces and manifest.json into `out`; returns the manifest."""
    return write_corpus(out, make_trace, kinds or KINDS, seeds, first)[0]


# --------------------------------------------------------------- scoring --
# The rules of ../shared/leak-corpus-b/score.py, so both give the same
# recall and false alerts: a leak trace is caught by its first alert for
# the leaking PID at or after the leak's start (and before an OOM in the
# trace); any other alert on it, and every alert on a healthy trace after
# its quiet_after_s, is false.  Critical alerts among the false ones are
# counted apart: a page on a healthy job is the worst outcome.

DETECTOR = os.path.join(ROOT, "bin", "gpu-leak-watch")


def _alerts(args):
    cmd, path, total = args
    env = dict(os.environ, GPUGUARD_CONFIG="/dev/null")
    p = subprocess.run(cmd + ["--gpu-total-mib", str(total), "--replay", path], capture_output=True,
                       text=True, env=env, timeout=1800)
    out = []
    for line in p.stdout.splitlines():
        if not line.startswith("{"):
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("state") == "firing" or ("leak" in str(ev.get("event", "")) and "state" not in ev):
            out.append({"ts": float(ev.get("ts", 0) or 0), "pid": ev.get("pid"), "severity": ev.get("severity")})
    return os.path.basename(path), out, p.returncode


def replay_all(corpus, detector=DETECTOR, jobs=2):
    """{file: [alert]} of a detector command over every trace of a corpus."""
    with open(os.path.join(corpus, "manifest.json")) as f:
        man = json.load(f)
    cmd = shlex.split(detector)
    work = [(cmd, os.path.join(corpus, n), man[n]["total_mib"]) for n in sorted(man)]
    with Pool(jobs) as pool:
        res = pool.map(_alerts, work, chunksize=1)
    bad = [n for n, _, rc in res if rc != 0]
    if bad:
        raise RuntimeError("the detector failed on %s" % ", ".join(bad))
    return man, {n: al for n, al, _ in res}


def _judge(lab, al):
    """(hit delay h or None, false alerts, critical false alerts, paged,
    late): paged is None unless the job runs out of memory within the trace
    (the label's oom_in_trace), then whether a critical alert of the job
    came before that; late counts the false alerts of a healthy job after
    its legitimate growth ended (the label's growth_end_s, when it has one:
    a cache still filling may look like a leak while it fills; corpus-b's
    scorer counts the alerts before apart)."""
    paged, late = None, 0
    if lab["leak"]:
        start = T0 + lab["start_s"]
        lp = lab.get("leak_pid")
        mine = [lp is None or a["pid"] in (None, lp) for a in al]     # no leak_pid: any PID is the job's
        good = [a["ts"] for a, m in zip(al, mine) if a["ts"] >= start and m]
        bad = [a for a, m in zip(al, mine) if a["ts"] < start or not m]
        first = min(good) if good else None
        if first is not None and lab.get("oom_in_trace") and first - T0 > lab["oom_s"]:
            first = None
        delay = (first - start) / 3600 if first is not None else None
        if lab.get("oom_in_trace"):
            paged = any(a.get("severity") == "critical" and start <= a["ts"] < T0 + lab["oom_s"] and m
                        for a, m in zip(al, mine))
    else:
        bad = [a for a in al if a["ts"] >= T0 + lab.get("quiet_after_s", 0)]
        delay = None
        late = sum(1 for a in bad if a["ts"] >= T0 + lab.get("growth_end_s", 0))
    return delay, len(bad), sum(1 for a in bad if a.get("severity") == "critical"), paged, late


def score(man, alerts):
    """Per-kind counts: n, leak, hit, flagged, false, critical, delays,
    job-days, ooms (leaks that run out of memory within the trace), paged
    (those of them paged critical before) and flagged_late (healthy traces
    with a false alert after their legitimate growth ended)."""
    kinds = {}
    for name, lab in sorted(man.items()):
        k = kinds.setdefault(lab["kind"], {"n": 0, "leak": lab["leak"], "hit": 0, "flagged": 0, "false": 0,
                                           "critical": 0, "delays": [], "job_days": 0.0, "ooms": 0, "paged": 0,
                                           "flagged_late": 0})
        delay, false, crit, paged, late = _judge(lab, alerts[name])
        k["flagged_late"] += late > 0
        k["ooms"] += paged is not None
        k["paged"] += bool(paged)
        k["n"] += 1
        k["hit"] += delay is not None
        k["flagged"] += false > 0
        k["false"] += false
        k["critical"] += crit
        k["job_days"] += lab["hours"] / 24.0
        if delay is not None:
            k["delays"].append(delay)
    return kinds


def table(kinds, title):
    """Markdown: one row per kind, then the totals."""
    out = ["### %s\n" % title,
           "| kind | n | recall / healthy flagged | false alerts | critical false alerts | median delay h |",
           "|---|---|---|---|---|---|"]
    tot = {"hit": 0, "pos": 0, "flagged": 0, "neg": 0, "false": 0, "critical": 0, "delays": [], "days": 0.0}
    order = sorted(kinds, key=lambda k: (kinds[k]["leak"], KINDS.index(k) if k in KINDS else len(KINDS), k))
    for kind in order:
        k = kinds[kind]
        if k["leak"]:
            cell = "recall %d/%d" % (k["hit"], k["n"]) + (", %d false-alerted" % k["flagged"] if k["flagged"] else "")
            tot["hit"] += k["hit"]
            tot["pos"] += k["n"]
            tot["delays"] += k["delays"]
        else:
            cell = "%d/%d flagged" % (k["flagged"], k["n"])
            tot["flagged"] += k["flagged"]
            tot["neg"] += k["n"]
            tot["days"] += k["job_days"]
        tot["false"] += k["false"]
        tot["critical"] += k["critical"]
        med = "%.2f" % statistics.median(k["delays"]) if k["delays"] else "-"
        out.append("| %s | %d | %s | %d | %d | %s |" % (kind, k["n"], cell, k["false"], k["critical"], med))
    med = "%.2f" % statistics.median(tot["delays"]) if tot["delays"] else "-"
    healthy_false = sum(k["false"] for k in kinds.values() if not k["leak"])
    out.append("\nrecall %d/%d, healthy traces flagged %d/%d, false alerts %d (%d critical), median delay %s h; "
               "%.1f false alerts per 100 healthy job-days (%.0f job-days)"
               % (tot["hit"], tot["pos"], tot["flagged"], tot["neg"], tot["false"], tot["critical"], med,
                  100 * healthy_false / tot["days"] if tot["days"] else 0.0, tot["days"]))
    return "\n".join(out)


class _Args(argparse.ArgumentParser):
    """argparse, with a usage error said in one line (exit 2)."""

    def error(self, message):
        print("%s: %s" % (self.prog, message), file=sys.stderr)
        sys.exit(2)


def corpus_main(prog, letter, kinds_all, make, check=None, argv=None):
    """The command line of a generator family (this one's, corpus D's):
    write DIR, or --score DIR with a detector. `kinds_all` are its kinds,
    make(kind, seed) makes one trace, check(rows, label) lists where the
    data disagree with the label (--check)."""
    ap = _Args(prog=prog, description="corpus %s: write it, or score a detector on it" % letter)
    ap.add_argument("dir", help="the corpus directory")
    ap.add_argument("--seeds", type=int, default=6, help="seeds per kind (default 6)")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--kinds", default="", help="comma-separated kinds (default: all)")
    if check:
        ap.add_argument("--check", action="store_true", help="check that the data agree with the labels")
    ap.add_argument("--score", action="store_true", help="score a detector on DIR instead of writing it")
    ap.add_argument("--detector", default=DETECTOR, help="the replay command (default bin/gpu-leak-watch)")
    a = ap.parse_args(argv)
    kinds = [k for k in a.kinds.split(",") if k] or kinds_all
    unknown = [k for k in kinds if k not in kinds_all]
    if unknown or a.seeds < 1 or a.first_seed < 0:
        print("%s: %s" % (prog, "unknown kind %s (kinds: %s)" % (unknown[0], ", ".join(kinds_all))
                          if unknown else "--seeds must be >= 1 and --first-seed >= 0"), file=sys.stderr)
        return 2
    if a.score:
        if not os.path.isfile(os.path.join(a.dir, "manifest.json")):
            print("%s: no manifest.json in %s" % (prog, a.dir), file=sys.stderr)
            return 2
        try:
            man, alerts = replay_all(a.dir, a.detector)
            print(table(score(man, alerts), "corpus %s: %s" % (letter, a.dir)))
        except (KeyError, ValueError, OSError, RuntimeError) as e:
            print("%s: cannot score %s: %s" % (prog, a.dir, e if str(e) else type(e).__name__), file=sys.stderr)
            return 1
        return 0
    man, problems = write_corpus(a.dir, make, kinds, a.seeds, a.first_seed,
                                 check if getattr(a, "check", False) else None)
    print("%d traces (%d leaking) in %s" % (len(man), sum(1 for v in man.values() if v["leak"]), a.dir))
    for s in problems:
        print("check: %s" % s)
    return 1 if problems else 0


def main(argv=None):
    return corpus_main("leakcorpus_c.py", "C", KINDS, make_trace, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
