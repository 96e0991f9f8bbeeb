#!/usr/bin/env python3
"""Leak detector bench: labelled synthetic traces (PyTorch-like 20 MiB
allocator blocks, noise, warm-ups, plateaus, steps, checkpoint sawtooth,
spikes, restarts, shrinking; leaks at 10/60/100/200/500 MB/h and staircase
leaks), scored for recall, false alerts per 24 h of clean traces, detection
delay and lead time before OOM, gpuguard's detector beside the source
article's rule (last 3 samples, growth > 50 MB/h); the labelled corpus of
issue 12's ten phenomena (bench/leakcorpus.py); corpus C, a third generator
family replayed through bin/gpu-leak-watch (bench/leakcorpus_c.py, with any
other corpus in its manifest format given by --corpus); the cost of a live
cycle and of replays. Prints Markdown.

  python3 bench/leak.py [--quick]   the make-bench set (about 2 minutes)
  python3 bench/leak.py --full      60 seeds per tidy kind, held-out seeds
  python3 bench/leak.py --full --before OLD/gpuguard_leak.py   a before row
  python3 bench/leak.py --only corpusc [--corpus DIR]...   corpus C (~15 s)"""
import argparse
import math
import os
import random
import subprocess
import sys
import zlib
from multiprocessing import Pool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import gpuguard_leakstat as leakstat

DT = 60.0                 # seconds between samples (the watcher's default)
BLOCK = 20                # MiB: PyTorch's large-segment size
HEADROOM = 20 * 1024      # MiB free when the leak starts (for lead time)
CLEAN_HOURS = 24
LEAK_T0 = 2.0             # hours: the leak starts after a clean warm-up


def q(v):
    return round(v / BLOCK) * BLOCK


def base_trace(rng, hours, kind):
    """Clean memory curve of one kind; returns list of (t, MiB)."""
    n = int(hours * 3600 / DT)
    base = 500 + q(rng.uniform(20_000, 60_000))
    warm_a, warm_tau = rng.uniform(1024, 8192), rng.uniform(120, 1200)
    sigma = rng.uniform(5, 50) if kind in ("noisy", "mixed") else 0.0
    steps = sorted(rng.uniform(1, hours) for _ in range(rng.randint(1, 3))) if kind in ("steps", "mixed") else []
    step_sizes = [rng.uniform(512, 6144) for _ in steps]
    saw_period, saw_high, saw_amp = rng.uniform(1800, 7200), rng.uniform(60, 480), rng.uniform(1024, 10240)
    spikes = set()
    if kind in ("spikes", "mixed"):
        for _ in range(int(rng.uniform(2, 20) * hours / 24) + 1):
            start = rng.randrange(n)
            for k in range(rng.randint(1, 6)):
                spikes.add(start + k)
    spike_amp = rng.uniform(512, 8192)
    ramp_a, ramp_tau = rng.uniform(1024, 4096), rng.uniform(3600, 8 * 3600)
    restart_at = rng.uniform(3, hours - 3) * 3600 if kind == "restart" else None
    gap = rng.uniform(120, 900)
    max_len = 0.0
    out = []
    toggles = 0
    for i in range(n):
        t = i * DT
        tt = t
        if restart_at is not None and t >= restart_at:
            if t < restart_at + gap:
                continue              # process absent
            tt = t - restart_at - gap
            if i and out and tt < DT:
                base = 500 + q(rng.uniform(20_000, 60_000))
        v = base + warm_a * (1 - math.exp(-tt / warm_tau))
        for st, size in zip(steps, step_sizes):
            if t >= st * 3600:
                v += size * min(1.0, (t - st * 3600) / rng.uniform(60, 600))
        if kind in ("sawtooth", "mixed") and (t % saw_period) < saw_high:
            v += saw_amp
        if i in spikes:
            v += spike_amp
        if kind == "records":
            max_len = max(max_len, min(8192, rng.lognormvariate(7, 0.6)))
            v += 0.5 * max_len
        if kind == "ramp":
            v += ramp_a * (1 - math.exp(-t / ramp_tau))
        if kind == "shrinking":
            v -= min(0.5 * warm_a, t / 3600 * 200)
        if rng.random() < 0.002:
            toggles ^= 1
        v += toggles * BLOCK + rng.gauss(0, sigma)
        out.append((t, max(0, q(v))))
    return out


def add_leak(trace, rate, t0_h, staircase=False):
    """Adds a leak (MiB/h) from t0; in 20 MiB blocks, or +300 MiB every 30 min."""
    out = []
    for t, v in trace:
        h = t / 3600 - t0_h
        extra = 0
        if h > 0:
            extra = 300 * int(h * 2) if staircase else BLOCK * int(h * rate / BLOCK)
        out.append((t, v + extra))
    return out


def detect(trace, method, total=None):
    """Alert times (s) of a method over a trace; total: the GPU's memory
    (MiB), so the detector knows the free memory, as it does live."""
    alerts = []
    if method == "gpuguard":
        s = leakstat.Series(dict(leakstat.DEFAULTS), "b", 1)
        prev_t = None
        for t, v in trace:
            if prev_t is not None and t - prev_t > 60 * DT:
                s = leakstat.Series(dict(leakstat.DEFAULTS), "b", 1)     # new process (restart)
            prev_t = t
            ev = s.add(t, v, (total - v) if total else None)
            if ev and ev["state"] == "firing":
                alerts.append(t)
    else:   # the source article: last 3 samples, growth > 50 MB/h
        for i in range(3, len(trace)):
            (ta, va), (tb, vb) = trace[i - 2], trace[i]
            if tb > ta and (vb - va) / ((tb - ta) / 3600) > 50:
                alerts.append(tb)
    return alerts


def episodes(alerts):
    """Alerts more than 1 h apart count as separate episodes."""
    n, last = 0, None
    for t in alerts:
        if last is None or t - last > 3600:
            n += 1
        last = t
    return n


CLEAN = ["plateau", "noisy", "steps", "sawtooth", "spikes", "records", "restart", "shrinking", "mixed"]
# The same kinds on a nearly full GPU: 3 GiB above the trace's highest point.
NEAR_FULL = 3 * 1024
HARD = ["ramp"]     # slow saturating ramp (tau 1-8 h): reported apart, as the research note advises
LEAKS = [("linear", 10), ("linear", 60), ("linear", 100), ("linear", 200), ("linear", 500),
         ("mixed+linear", 60), ("mixed+linear", 200), ("staircase", 600), ("restart+linear", 100),
         ("near-oom", 2000)]
NEAR_OOM_HEADROOM = 6 * 1024     # MiB free when the fast leak starts: OOM in 3 h


def run_case(args):
    kind, rate, seed = args
    # crc32, not hash(): str hashes change per process (PYTHONHASHSEED)
    rng = random.Random(zlib.crc32(repr((kind, rate, seed)).encode()))
    if rate is None:
        near = kind.endswith("@full")
        trace = base_trace(rng, CLEAN_HOURS, kind.split("@")[0])
        total = max(v for _, v in trace) + (NEAR_FULL if near else 20 * 1024)
        return ("clean", kind, None, {m: episodes(detect(trace, m, total)) for m in ("gpuguard", "source")})
    base_kind = {"linear": "plateau", "mixed+linear": "mixed", "staircase": "plateau",
                 "restart+linear": "restart", "near-oom": "plateau"}[kind]
    headroom = NEAR_OOM_HEADROOM if kind == "near-oom" else HEADROOM
    hours = LEAK_T0 + min(48.0, headroom / rate + 1)
    trace = base_trace(rng, hours, base_kind)
    t0 = LEAK_T0
    if kind == "restart+linear":
        # the leak lives in the second incarnation
        gaps = [b[0] for a, b in zip(trace, trace[1:]) if b[0] - a[0] > DT * 1.5]
        t0 = (gaps[0] / 3600 + 1.0) if gaps else LEAK_T0
    total = max(v for t, v in trace if t < t0 * 3600) + headroom
    trace = add_leak(trace, rate, t0, staircase=(kind == "staircase"))
    trace = [(t, v) for t, v in trace if v <= total]     # the OOM ends the trace
    result = {}
    for m in ("gpuguard", "source"):
        alerts = detect(trace, m, total)
        early = [a for a in alerts if a < t0 * 3600]
        late = [a for a in alerts if a >= t0 * 3600]
        delay = (late[0] / 3600 - t0) if late else None
        t_oom = t0 + headroom / rate
        lead = (t_oom - late[0] / 3600) if late else None
        result[m] = {"early": episodes(early), "delay": delay, "lead": lead, "oom_h": headroom / rate}
    return ("leak", kind, rate, result)


def pct(values, p):
    s = sorted(values)
    if not s:
        return float("nan")
    return s[min(len(s) - 1, round(p * (len(s) - 1)))]


# ------------------------------------------------------------------ cost --

def leak_cycle_cost(n_procs, cycles, work, real=False):
    """(CPU ms per leak_cycle beyond nvidia-smi, CPU ms with it, processes
    on the host): leak_cycle is bash + the Python detector + state + history,
    watching n_procs GPU processes that grow slowly, beyond the nvidia-smi
    calls (the bench double's own cost is subtracted). real: the PIDs are
    live processes (sleeps), so each tree's /proc files are read as on a GPU
    host; otherwise they are the double's only, as for processes in another
    PID namespace."""
    procs = [subprocess.Popen(["sleep", "3600"]) for _ in range(n_procs)] if real else []
    host_processes = len([d for d in os.listdir("/proc") if d.isdigit()])
    try:
        return _leak_cycle_cost(n_procs, cycles, work, [p.pid for p in procs] or None) + (host_processes,)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _leak_cycle_cost(n_procs, cycles, work, pids):
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import idle as idlebench
    fields = subprocess.run(["bash", "-c", 'source lib/common.sh; source lib/smi.sh; '
                             'echo "$SMI_GPU_FIELDS"; echo "$SMI_APP_FIELDS"'], cwd=ROOT,
                            capture_output=True, text=True).stdout.split()
    args = [["--query-gpu=%s" % fields[0], "--format=csv,noheader,nounits"],
            ["--query-compute-apps=%s" % fields[1], "--format=csv,noheader,nounits"]]
    steps = 20
    gpus = [{"index": i, "uuid": "GPU-%08x-3a23-ca8c-52da-f8eedc850d97" % (0x21b026da + i),
             "name": "NVIDIA H200", "pci.bus_id": "00000000:%02X:00.0" % (i + 6),
             "memory.total": 143771, "power.limit": 700.0} for i in range(8)]
    scen = {"gpus": gpus, "steps": []}
    for st in range(steps):
        apps = [{"pid": pids[p] if pids else 500000 + p, "process_name": "/opt/venv/bin/python3",
                 "used_memory": 6000 + 20 * ((st + p) // 3), "gpu": p % 8} for p in range(n_procs)]
        scen["steps"].append({"gpus": [{"utilization.gpu": 90, "memory.used": 8 * 6000 + 500,
                                        "power.draw": 500.0} for _ in range(8)], "apps": apps})
    smidir = os.path.join(work, "smi-leak-%d%s" % (n_procs, "-live" if pids else ""))
    idlebench.render(scen, steps, args, smidir)
    env = idlebench.bench_env(smidir, steps, os.path.join(work, "state-leak-%d%s" % (n_procs, "-live" if pids else "")))
    # as installed: the detector's bytecode cached (python3 -m compileall)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(ROOT, "python")], env=env, check=True)
    idlebench.run_cpu(["bash", os.path.join(ROOT, "bench", "leak_bench.sh"), "3"], env)     # warm the state
    cpu, _ = idlebench.run_cpu(["bash", os.path.join(ROOT, "bench", "leak_bench.sh"), str(cycles)], env)
    per_call = idlebench.double_cost(smidir, args[0], env, calls=50)
    return 1000 * (cpu - 2 * per_call * cycles) / cycles, 1000 * cpu / cycles


def replay_cost(path, total=None):
    """CPU seconds of `gpu-leak-watch --replay` (the whole command)."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import idle as idlebench
    env = dict(os.environ, GPUGUARD_CONFIG="/dev/null", GPUGUARD_STATE_DIR=os.path.dirname(path))
    cmd = [os.path.join(ROOT, "bin", "gpu-leak-watch"), "--replay", path]
    if total:
        cmd += ["--gpu-total-mib", str(total)]
    cpu, _ = idlebench.run_cpu(cmd, env)
    return cpu


def write_trace(path, series):
    """series: {pid: [(t, mib)]} -> a 3-column CSV in time order."""
    rows = sorted((t, pid, v) for pid, tr in series.items() for t, v in tr)
    with open(path, "w") as f:
        f.write("timestamp,pid,used_memory_mib\n")
        f.write("".join("%d,%d,%d\n" % (1796206508 + t, pid, v) for t, pid, v in rows))


def cost_table(quick):
    import tempfile
    rows = []
    with tempfile.TemporaryDirectory() as work:
        cycles = 20 if quick else 100
        beyond, total, _ = leak_cycle_cost(64, cycles, work)
        rows.append(("live cycle, 64 watched processes (%d cycles)" % cycles,
                     "%.1f ms CPU beyond nvidia-smi (%.1f ms with the bench double)" % (beyond, total), "<= 40 ms"))
        beyond, total, host_processes = leak_cycle_cost(64, cycles, work, real=True)
        rows.append(("live cycle, 64 watched processes alive in /proc (%d cycles, %d processes on the host)"
                     % (cycles, host_processes),
                     "%.1f ms CPU beyond nvidia-smi (%.1f ms with the bench double)" % (beyond, total), "<= 40 ms"))
        rng = random.Random(3)
        week = [(t, 40000 + (20 if rng.random() < 0.3 else 0)) for t in range(7 * 86400)]
        path = os.path.join(work, "week.csv")
        write_trace(path, {77: week})
        rows.append(("replay of 7 days at 1 s (604,800 samples, one process)",
                     "%.2f s CPU" % replay_cost(path, 143771), "<= 1 s"))
        n = 16 if quick else 64
        grow = {}
        for p in range(n):
            r = random.Random(p)
            grow[1000 + p] = [(i * 60, q(30000 + 30 * i / 60 + r.gauss(0, 10))) for i in range(24 * 60)]
        path = os.path.join(work, "grow.csv")
        write_trace(path, grow)
        rows.append(("replay of %d slowly growing series (30 MiB/h, 24 h at 60 s each)" % n,
                     "%.1f s CPU" % replay_cost(path, 143771), "<= 30 s for 64"))
    print("## Leak detector: cost\n")
    print("| what | measured | goal |")
    print("|---|---|---|")
    for r in rows:
        print("| %s | %s | %s |" % r)
    print()


def corpus_tables(quick, before):
    import leakcorpus
    sets = [("development seeds", "0-1" if quick else "0-3")]
    if not quick:
        sets.append(("held-out seeds", "100-103"))
    for title, seeds in sets:
        modules = [("after", os.path.join(ROOT, "python", "gpuguard_leak.py"))]
        if before:
            modules.insert(0, ("before", before))
        for label, mod in modules:
            res = leakcorpus.score(os.path.abspath(mod), leakcorpus.parse_seeds(seeds), leakcorpus.KINDS)
            print(leakcorpus.table(res, "issue-12 corpus, %s %s, %s" % (title, seeds, label)))
            print()


def corpus_c_tables(extra):
    """Corpus C (6 seeds of each kind, the figures of bench/RESULTS.md),
    written to a temporary directory and replayed as a live watcher reads
    it; then each corpus of `extra` (a directory with a manifest.json in
    the same format, e.g. ../shared/leak-corpus-b/corpus)."""
    import tempfile

    import leakcorpus_c
    seeds = int(os.environ.get("BENCH_LEAK_C_SEEDS", "6"))
    with tempfile.TemporaryDirectory() as work:
        leakcorpus_c.generate(work, seeds)
        man, alerts = leakcorpus_c.replay_all(work)
        print(leakcorpus_c.table(leakcorpus_c.score(man, alerts),
                                 "Corpus C (bench/leakcorpus_c.py, seeds 0-%d), bin/gpu-leak-watch" % (seeds - 1)))
        print()
    for corpus in extra:
        man, alerts = leakcorpus_c.replay_all(corpus)
        print(leakcorpus_c.table(leakcorpus_c.score(man, alerts), "%s, bin/gpu-leak-watch" % corpus))
        print()


CORPUS_B = os.path.join(os.path.dirname(ROOT), "shared", "leak-corpus-b", "corpus")
H200_TRACES = os.path.join(ROOT, "tests", "fixtures", "h200")


def _summary(kinds):
    """(recall, healthy flagged, of them after their growth ended, critical
    on healthy, median delay h, false alerts per 100 healthy job-days, leaks
    out of memory in the trace paged critical before it) of
    leakcorpus_c.score()'s counts."""
    import statistics
    pos = [k for k in kinds.values() if k["leak"]]
    neg = [k for k in kinds.values() if not k["leak"]]
    delays = [d for k in pos for d in k["delays"]]
    days = sum(k["job_days"] for k in neg)
    return ("%d/%d" % (sum(k["hit"] for k in pos), sum(k["n"] for k in pos)),
            "%d/%d" % (sum(k["flagged"] for k in neg), sum(k["n"] for k in neg)),
            "%d" % sum(k["flagged_late"] for k in neg),
            sum(k["critical"] for k in neg),
            "%.2f" % statistics.median(delays) if delays else "-",
            "%.1f" % (100.0 * sum(k["false"] for k in neg) / days) if days else "-",
            "%d/%d" % (sum(k["paged"] for k in pos), sum(k["ooms"] for k in pos)))


def _h200_row(work):
    """The real GPU recordings (tests/fixtures/h200/*/manifest.json: H200s and an H100, time
    stretched as recorded), as one corpus."""
    import json
    import shutil

    import leakcorpus_c
    man = {}
    for sub in sorted(os.listdir(H200_TRACES)):
        path = os.path.join(H200_TRACES, sub, "manifest.json")
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            for name, lab in json.load(f).items():
                shutil.copy(os.path.join(H200_TRACES, sub, name), os.path.join(work, sub + "-" + name))
                man[sub + "-" + name] = lab
    if not man:
        return None
    with open(os.path.join(work, "manifest.json"), "w") as f:
        json.dump(man, f)
    m, alerts = leakcorpus_c.replay_all(work)
    return leakcorpus_c.score(m, alerts)


def _replay_in_process(args):
    """Firing alerts of one trace replayed with these detector settings."""
    import csv

    import gpuguard_leak
    path, total, settings = args
    params = dict(leakstat.params_from({}), **settings)
    with open(path, newline="") as f:
        rows = [(float(r["timestamp"]), int(r["pid"]), float(r["used_memory_mib"])) for r in csv.DictReader(f)]
    events = gpuguard_leak.replay_rows(rows, params, gpu_total=total)
    return os.path.basename(path), [{"ts": float(e["ts"]), "pid": e["pid"], "severity": e.get("severity")}
                                    for e in events if e["state"] == "firing"]


def _score_settings(corpus, settings):
    import json

    import leakcorpus_c
    with open(os.path.join(corpus, "manifest.json")) as f:
        man = json.load(f)
    work = [(os.path.join(corpus, n), man[n]["total_mib"], settings) for n in sorted(man)]
    with Pool(min(2, os.cpu_count() or 1)) as pool:
        alerts = dict(pool.map(_replay_in_process, work, chunksize=2))
    return leakcorpus_c.score(man, alerts)


# How long a slow-tier verdict must hold before it pages: passes among the
# last evaluations (one per 10-minute bucket). The default is the middle row.
SETTINGS = [("2 in a row (v2)", {"slow_passes": 2, "slow_look": 2}),
            ("3 of the last 4", {}),
            ("4 of the last 6", {"slow_passes": 4, "slow_look": 6})]


def goals_table(settings):
    """Issue 22's goal table: each corpus nobody tuned on and the real
    recordings, for each setting (the trade-off between false pages and
    delay). Corpus-b is read from ../shared when it is there."""
    import tempfile

    import leakcorpus_c
    import leakcorpus_d
    print("## Leak detector v3: goals and trade-off\n")
    print("| corpus | slow-tier verdict held | recall | healthy flagged | of them after their growth ended "
          "| critical on healthy | median delay h | false alerts / 100 healthy job-days "
          "| leaks paged critical before their OOM |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        corpora = []
        if os.path.isfile(os.path.join(CORPUS_B, "manifest.json")):
            corpora.append(("leak-corpus-b (../shared)", CORPUS_B))
        for label, first in (("corpus C seeds 0-5", 0), ("corpus C seeds 100-105 (held out)", 100)):
            d = os.path.join(work, "c%d" % first)
            leakcorpus_c.generate(d, 6, first=first)
            corpora.append((label, d))
        for label, first in (("corpus D seeds 0-5 (written blind)", 0), ("corpus D seeds 100-105", 100)):
            d = os.path.join(work, "d%d" % first)
            leakcorpus_d.generate(d, 6, first=first)
            corpora.append((label, d))
        for label, d in corpora:
            for name, values in settings:
                print("| %s | %s | %s | %s | %s | %d | %s | %s | %s |" % ((label, name) + _summary(_score_settings(d, values))))
        h = os.path.join(work, "h200")
        os.makedirs(h)
        kinds = _h200_row(h)
        if kinds:
            print("| real GPU recordings (tests/fixtures/h200: H200, H100) | 3 of the last 4 | %s | %s | %s | %d | %s "
                  "| %s | %s |"
                  % _summary(kinds))
    print()


def tidy_tables(seeds):
    cases = [(k, None, s) for k in CLEAN + [k + "@full" for k in CLEAN] + HARD for s in range(seeds)] + \
            [(k, r, s) for k, r in LEAKS for s in range(seeds)]
    with Pool(min(2, os.cpu_count() or 1)) as pool:
        results = pool.map(run_case, cases, chunksize=4)
    print("## Leak detector: clean traces (%d x %d h per kind, 60 s samples; @full: 3 GiB free above the peak)\n"
          % (seeds, CLEAN_HOURS))
    print("| kind | gpuguard false alerts / 24 h | traces alerted | source rule false alerts / 24 h | traces alerted |")
    print("|---|---|---|---|---|")
    total = {"gpuguard": 0, "source": 0}
    for kind in CLEAN + [k + "@full" for k in CLEAN]:
        rows = [r[3] for r in results if r[0] == "clean" and r[1] == kind]
        cells = []
        for m in ("gpuguard", "source"):
            eps = [x[m] for x in rows]
            total[m] += sum(eps)
            cells += ["%.2f" % (sum(eps) / len(eps) * 24 / CLEAN_HOURS), "%d/%d" % (sum(1 for e in eps if e), len(eps))]
        print("| %s | %s |" % (kind, " | ".join(cells)))
    n_clean = seeds * len(CLEAN) * 2
    print("| **all clean** | **%.3f** | | **%.2f** | |" % (total["gpuguard"] / n_clean, total["source"] / n_clean))
    for kind in HARD:
        rows = [r[3] for r in results if r[0] == "clean" and r[1] == kind]
        g = [x["gpuguard"] for x in rows]
        s = [x["source"] for x in rows]
        print("| %s (hard: growth for hours that then stops) | %.2f | %d/%d | %.2f | %d/%d |" % (
            kind, sum(g) / len(g), sum(1 for e in g if e), len(g), sum(s) / len(s), sum(1 for e in s if e), len(s)))
    print("\n## Leak detector: leaks (leak starts %.0f h in; lead time with %d GiB free at the start, %d GiB for near-oom)\n"
          % (LEAK_T0, HEADROOM // 1024, NEAR_OOM_HEADROOM // 1024))
    print("| leak | MiB/h | gpuguard recall | median delay h | p90 delay h | median lead before OOM h (of) "
          "| alerts before the leak | source rule recall | source median delay h | source alerts before the leak |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kind, rate in LEAKS:
        rows = [r[3] for r in results if r[0] == "leak" and r[1] == kind and r[2] == rate]
        g = [x["gpuguard"] for x in rows]
        s = [x["source"] for x in rows]
        gd = [x["delay"] for x in g if x["delay"] is not None]
        sd = [x["delay"] for x in s if x["delay"] is not None]
        gl = [x["lead"] for x in g if x["lead"] is not None]
        print("| %s | %d | %d/%d | %.1f | %.1f | %.1f (%.1f) | %d | %d/%d | %.2f | %d |" % (
            kind, rate, len(gd), len(g), pct(gd, 0.5), pct(gd, 0.9), pct(gl, 0.5), g[0]["oom_h"],
            sum(x["early"] for x in g), len(sd), len(s), pct(sd, 0.5), sum(x["early"] for x in s)))
    print("\nThreshold 50 MiB/h (the default): a 10 MiB/h leak is below it by design.\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description="gpu-leak-watch bench: tidy corpus, issue-12 corpus, cost")
    ap.add_argument("--quick", action="store_true", help="the make-bench set (about 2 minutes)")
    ap.add_argument("--full", action="store_true", help="60 seeds per tidy kind, held-out seeds, 100 cycles")
    ap.add_argument("--before", default="", help="an older gpuguard_leak.py to score beside this one")
    ap.add_argument("--only", default="", help="tidy, corpus, corpusc, goals or cost")
    ap.add_argument("--corpus", action="append", default=[],
                    help="another corpus directory with a manifest.json to score beside corpus C")
    a = ap.parse_args(argv)
    for d in a.corpus:
        if not os.path.isfile(os.path.join(d, "manifest.json")):
            ap.error("no manifest.json in %s" % d)
    quick = not a.full
    seeds = int(os.environ.get("BENCH_LEAK_SEEDS", "3" if quick else "60"))
    if a.only in ("", "tidy"):
        tidy_tables(seeds)
    if a.only in ("", "corpus"):
        corpus_tables(quick, a.before)
    if a.only in ("", "corpusc"):
        corpus_c_tables(a.corpus)
    if a.only in ("", "goals"):
        goals_table(SETTINGS[1:2] if quick else SETTINGS)
    if a.only in ("", "cost"):
        cost_table(quick)


if __name__ == "__main__":
    main()
