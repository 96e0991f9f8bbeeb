#!/usr/bin/env python3
"""Size and render time of `gpuguard report` for a big box: 7 days of 64
processes on 8 GPUs sampled every 60 s (645,120 process samples, 80,640 GPU
rows), plus the screenshot in docs/.

  python3 bench/report_bench.py                 # the figures (bench/report-results.md)
  python3 bench/report_bench.py --example docs   # docs/report.png (the README's picture) and
                                                 # docs/report-example.html (the report it shows)

The render time is measured in headless Chromium (tests/cdp.py):
performance.now() at the load event after a forced layout (the page's own
data-load-ms), best and median of 5 loads.
"""
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "python"))

DAY = 86400
T_END = 1796220000
TOTAL_MIB = 143771      # an H200


def make_week(state, n_gpus=8, per_gpu=8, days=7, step=60, seed=7):
    """The files a week of `gpu-leak-watch --all` and the watchdog leave, in
    their current formats: history/<key>.csv with the GPU's used and total
    memory (gpuguard_history.HISTORY_HEADER), leak-state-all.json ({"series",
    "meta"}), gpu-history.tsv (lib/gpuhistory.sh) and events.jsonl."""
    import gpuguard_history
    rng = random.Random(seed)
    (state / "history").mkdir(parents=True)
    n = days * DAY // step
    t0 = T_END - n * step
    procs = []
    for g in range(n_gpus):
        for k in range(per_gpu):
            pid = 10000 + g * 100 + k
            base = rng.uniform(4000, 14000)
            leak = 60.0 if (g * per_gpu + k) % 16 == 3 else 0.0
            procs.append((pid, g, base, leak, rng.uniform(0, 2 * math.pi)))
    files = {pid: open(state / "history" / ("%d-777.csv" % pid), "w") for pid, *_ in procs}
    for f in files.values():
        f.write(gpuguard_history.HISTORY_HEADER + "\n")
    gh = open(state / "gpu-history.tsv", "w")
    gh.write("# ts\tindex\tuuid\tutil_pct\tmem_used_mib\tmem_total_mib\tpower_w\tidle\tholders\n")
    for i in range(n):
        t = t0 + i * step
        used = [0.0] * n_gpus
        holders = [[] for _ in range(n_gpus)]
        values = []
        for pid, g, base, leak, phase in procs:
            v = base + leak * (t - t0) / 3600.0 + 300 * (math.sin(t / 1800.0 + phase) > 0.9) + rng.uniform(0, 40)
            v = int(v)
            values.append((pid, g, v))
            used[g] += v
            holders[g].append("%d:%d" % (pid, v))
        for pid, g, v in values:
            # the row of gpuguard_history.history_append: the GPU's used and total
            files[pid].write("%d,%d,%d,%d,%d\n" % (t, pid, v, used[g] + 512, TOTAL_MIB))
        for g in range(n_gpus):
            idle = 1 if (g == 2 and 3 * DAY <= t - t0 < 3 * DAY + 5400) else 0
            util = rng.randint(0, 4) if idle else rng.randint(85, 100)
            gh.write("%d\t%d\tGPU-%08x-0000-0000-0000-000000000000\t%d\t%d\t%d\t%.1f\t%d\t%s\n"
                     % (t, g, g, util, used[g] + 512, TOTAL_MIB, 120.0 if idle else rng.uniform(550, 690),
                        2 if idle and t - t0 >= 3 * DAY + 180 else idle, ",".join(holders[g])))
    gh.close()
    for f in files.values():
        f.close()
    series, meta = {}, {}
    events = []
    for pid, _, base, leak, _ in procs:
        key = "%d-777" % pid
        series[key] = {"key": key, "pid": pid, "firing": bool(leak),
                       "last": {"ts": T_END, "used": base, "free": 20000, "slope": leak or 1.0,
                                "window_s": 6 * 3600}}
        meta[key] = {"pid": pid, "rows": n, "members": [str(pid)], "alerting": bool(leak)}
        if leak:
            events.append({"ts": t0 + DAY, "event": "gpu_memory_leak", "state": "firing", "pid": pid,
                           "name": "python3", "slope_mib_per_hour": leak})
    events.append({"ts": t0 + 3 * DAY + 180, "event": "gpu_idle", "state": "firing", "gpu": 2, "utilization": 1,
                   "idle_cycles": 3})
    events.append({"ts": t0 + 3 * DAY + 5400, "event": "gpu_idle", "state": "resolved", "gpu": 2, "utilization": 97,
                   "idle_cycles": 0})
    for pid, g, *_ in procs:
        # each series' identity as the watcher keeps it (gpuguard_history.identity_write)
        job = {"user": "user%d" % (pid % 5), "uid": 1000 + pid % 5, "pid": pid, "pids": [pid],
               "cmdline": "/opt/venv/bin/python3 /home/user%d/projects/llm-finetune/train.py --run-name exp-%d "
                          "--model Qwen2.5-7B-Instruct --dataset /data/sft/mix-v3.jsonl --lr 2e-5 --epochs 3 "
                          "--per-device-train-batch-size 4 --gradient-accumulation-steps 8 --wandb-key ***"
                          % (pid % 5, pid),
               "cwd": "/home/user%d/projects/llm-finetune" % (pid % 5), "start_ts": t0, "slurm_job": None,
               "container": None, "rank": None, "local_rank": None, "visible": True}
        (state / "history" / ("%d-777.job.json" % pid)).write_text(json.dumps(job) + "\n")
    (state / "leak-state-all.json").write_text(json.dumps({"series": series, "meta": meta}))
    (state / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return n * len(procs), n * n_gpus


def run_report(state, out):
    env = dict(os.environ, GPUGUARD_CONFIG="/dev/null", GPUGUARD_STATE_DIR=str(state), GPUGUARD_HOST="bench")
    start = time.monotonic()
    r = subprocess.run([str(ROOT / "bin/gpuguard"), "report", "--out", str(out)], env=env, capture_output=True,
                       text=True)
    if r.returncode:
        sys.exit(r.stderr)
    return time.monotonic() - start


def measure(url, loads=5):
    import cdp
    b = cdp.Browser()
    try:
        ms = []
        for _ in range(loads):
            b.load(url)
            if b.problems():
                sys.exit("browser problems: %s" % b.problems())
            ms.append(int(b.eval("document.documentElement.dataset.loadMs")))
            b.call("Page.navigate", url="about:blank")
            b.wait_event("Page.loadEventFired")
        return ms
    finally:
        b.close()


def example(folder):
    """The report of tests/report_fixtures.py's story and its screenshot."""
    import cdp
    import report_fixtures
    folder = Path(folder)
    with tempfile.TemporaryDirectory() as d:
        state = Path(d) / "state"
        report_fixtures.build(state)
        out = folder / "report-example.html"
        env = dict(os.environ, GPUGUARD_CONFIG="/dev/null", GPUGUARD_STATE_DIR=str(state),
                   GPUGUARD_HOST="h200-demo", TZ="UTC", GPUGUARD_NOW=str(report_fixtures.T0 + 7200))
        subprocess.run([str(ROOT / "bin/gpuguard"), "report", "--out", str(out)], env=env, check=True)
        b = cdp.Browser(width=1040, height=1560)
        try:
            b.load(out.resolve().as_uri())
            b.screenshot(str(folder / "report.png"))
        finally:
            b.close()


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--example":
        example(sys.argv[2])
        return
    with tempfile.TemporaryDirectory() as d:
        state = Path(d) / "state"
        t = time.monotonic()
        samples, gpu_rows = make_week(state)
        made = time.monotonic() - t
        out = Path(d) / "report.html"
        gen = run_report(state, out)
        size = out.stat().st_size
        ms = measure(out.as_uri())
        # the same measure for a blank page: what the browser costs anyway
        import gpuguard_report
        blank = Path(d) / "blank.html"
        blank.write_text("<!doctype html><html><body><script>%s</script></body></html>" % gpuguard_report._LOAD_JS)
        blank_ms = measure(blank.as_uri())
        named = sum(1 for n in range(64) if "exp-%d " % (10000 + (n // 8) * 100 + n % 8) in out.read_text())
        print("input: %d process samples, %d GPU rows (%.0f MB on disk, made in %.1f s)"
              % (samples, gpu_rows, sum(f.stat().st_size for f in state.rglob("*") if f.is_file()) / 1e6, made))
        print("gpuguard report: %.1f s, %d bytes (%.2f MB)" % (gen, size, size / 1e6))
        print("chromium %s: load + layout ms %s (best %d, median %d)"
              % (subprocess.run(["chromium", "--version"], capture_output=True, text=True).stdout.split()[1],
                 ms, min(ms), statistics.median(ms)))
        print("blank page: load + layout ms %s (best %d, median %d)" % (blank_ms, min(blank_ms),
                                                                          statistics.median(blank_ms)))
        print("jobs named by their command line in the report: %d of 64" % named)


if __name__ == "__main__":
    main()
