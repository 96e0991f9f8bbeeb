#!/usr/bin/env python3
"""gpuguard's GPU memory leak detector (stdlib only).

Commands:
  replay FILE     run the detector over a CSV (timestamp,pid,used_memory_mib)
                  without sleeping; one JSON line per event on stdout
  check           live mode, one call per watch cycle: reads sample lines on
                  stdin ("KEY TS PID USED_MIB FREE_MIB NAME"), keeps state in
                  $GPUGUARD_STATE_DIR/leak-state.json and history CSVs, prints
                  events and "status" JSON lines on stdout
  report          write one self-contained HTML file charting the history
  loss FILE       say whether the loss in an ms-swift logging.jsonl plateaued
  slopes          print "PID SLOPE FIRING" for every watched process tree

Method (see shared research, "floor-trend"): samples are reduced to the
minimum of each bucket (default 10 min), which removes spikes, evaluation
peaks and checkpoint sawtooth; the series is cut at restarts (floor halves)
and at short steps (>= 256 MiB within <= 3 buckets: a new batch shape, a
re-warm), after which a warm-up is skipped; four or more steps with no drop
between them are a staircase leak and are analysed uncut. A tail window of
3, 6, 12 or 24 h is leaking when all gates pass: one-sided Mann-Kendall
Z >= 2.326, Theil-Sen slope >= threshold, net growth >= 64 MiB spread over
at least 5 rising buckets with no jump carrying 40 % of it, and the second
half still rising (slope >= 0.7 of the whole). Near OOM there is
no time for hours of evidence: when free memory is known, the last hour of
floors rising in every step, by at least 64 MiB, with no single step
carrying half of it and the second half keeping the pace, above the threshold and with OOM projected within
6 h, also counts as leaking. Two leaking evaluations in a row fire; growth
stopping for two evaluations resolves.
"""
import csv
import json
import math
import os
import re
import sys

DEFAULTS = {
    "bucket_s": 600.0,          # floor bucket length
    "threshold": 50.0,          # MiB/h
    "min_growth": 64.0,         # MiB of net growth in the window
    "step_mib": 256.0,          # a jump this big between buckets is a step
    "step_max_buckets": 3,      # ... if it lasts no longer than this
    "skip_buckets": 6,          # warm-up skipped after a start or a cut
    "windows": (18, 36, 72, 144),
    "z_min": 2.326,             # one-sided alpha = 0.01
    "tail_ratio": 0.7,
    "debounce": 2,
    "staircase_steps": 4,       # this many steps ...
    "staircase_buckets": 36,    # ... within this many buckets: a staircase leak
    "max_jump_share": 0.4,      # one bucket's jump may carry at most this of the growth
    "min_rises": 5,             # a leak raises the floor in at least this many buckets
    "gap_s": 300.0,             # no sample for this long: the process restarted
    "fast_buckets": 6,          # near-OOM tier: the last hour of floors ...
    "fast_oom_h": 6.0,          # ... rising steadily with OOM this close
}


# ------------------------------------------------------------ statistics --

def median(values):
    s = sorted(values)
    n = len(s)
    if n == 0:
        return 0.0
    mid = n // 2
    return float(s[mid]) if n % 2 else (s[mid - 1] + s[mid]) / 2.0


def theil_sen(xs, ys):
    """Median of pairwise slopes."""
    slopes = []
    n = len(xs)
    for i in range(n):
        xi, yi = xs[i], ys[i]
        for j in range(i + 1, n):
            dx = xs[j] - xi
            if dx:
                slopes.append((ys[j] - yi) / dx)
    return median(slopes) if slopes else 0.0


def mann_kendall_z(ys):
    """One-sided Mann-Kendall Z with the tie correction."""
    n = len(ys)
    if n < 3:
        return 0.0
    s = 0
    for k in range(n - 1):
        yk = ys[k]
        for j in range(k + 1, n):
            d = ys[j] - yk
            s += (d > 0) - (d < 0)
    counts = {}
    for y in ys:
        counts[y] = counts.get(y, 0) + 1
    ties = sum(t * (t - 1) * (2 * t + 5) for t in counts.values() if t > 1)
    var = (n * (n - 1) * (2 * n + 5) - ties) / 18.0
    if var <= 0:
        return 0.0
    if s > 0:
        return (s - 1) / math.sqrt(var)
    if s < 0:
        return (s + 1) / math.sqrt(var)
    return 0.0


# -------------------------------------------------------------- detector --

class Series:
    """One process incarnation: bucket floors and the alert state."""

    def __init__(self, params, key, pid):
        self.p = params
        self.key = key
        self.pid = pid
        self.bucket = None
        self.bucket_min = None
        self.floors = []        # [bucket_index, floor_mib]
        self.streak = 0
        self.calm = 0
        self.firing = False
        self.last = {}
        self.cut_bucket = None      # first bucket after a gap in the samples

    def to_json(self):
        return {"key": self.key, "pid": self.pid, "bucket": self.bucket, "bucket_min": self.bucket_min,
                "floors": self.floors, "streak": self.streak, "calm": self.calm, "firing": self.firing,
                "last": self.last, "cut_bucket": self.cut_bucket}

    @classmethod
    def from_json(cls, params, data):
        s = cls(params, data["key"], data["pid"])
        for name in ("bucket", "bucket_min", "floors", "streak", "calm", "firing", "last", "cut_bucket"):
            setattr(s, name, data.get(name, getattr(s, name)))
        return s

    def add(self, ts, mib, free_mib=None):
        """Adds a sample; returns an event dict when the state changes."""
        b = int(ts // self.p["bucket_s"])
        prev_ts = self.last.get("ts")
        if prev_ts is not None and ts - prev_ts > self.p["gap_s"]:
            self.cut_bucket = b       # samples stopped: a restart, PID reused
        self.last = {"ts": ts, "used": mib, "free": free_mib}
        if self.bucket is None:
            self.bucket, self.bucket_min = b, mib
            return None
        if b == self.bucket:
            self.bucket_min = min(self.bucket_min, mib)
            return None
        self.floors.append([self.bucket, self.bucket_min])
        keep = max(self.p["windows"]) + self.p["skip_buckets"] + 8
        if len(self.floors) > keep:
            del self.floors[:len(self.floors) - keep]
        self.bucket, self.bucket_min = b, mib
        return self.evaluate()

    def segment(self):
        """Index where the analysed part of the floors starts: after the last
        cut and the warm-up that follows it."""
        f = [v for _, v in self.floors]
        p = self.p
        start = 0
        steps = []                  # (first, last) bucket indices of jumps
        run = None
        for j in range(1, len(f)):
            prev, cur = f[j - 1], f[j]
            if cur < 0.5 * prev or (self.cut_bucket is not None and self.floors[j][0] >= self.cut_bucket
                                    and self.floors[j - 1][0] < self.cut_bucket) or self.floors[j][0] - self.floors[j - 1][0] > 3 * max(p["windows"]):
                start, steps, run = j, [], None          # restart or long gap
                continue
            if cur - prev >= p["step_mib"]:
                run = [j, j] if run is None else [run[0], j]
                continue
            if run is not None:
                steps.append(tuple(run))
                run = None
            if cur - prev <= -p["step_mib"]:
                steps = []                                # a drop ends a staircase
        if run is not None and run[1] - run[0] + 1 <= p["step_max_buckets"]:
            steps.append(tuple(run))
        short = [s for s in steps if s[1] - s[0] + 1 <= p["step_max_buckets"]]
        # Legitimate steps (new batch shapes, a re-warm) come a few a day; a
        # leak that keeps e.g. one evaluation's outputs per half hour comes
        # as dense steps: those are analysed uncut.
        recent = [s for s in short if s[1] >= len(f) - p["staircase_buckets"]]
        if short and len(recent) < p["staircase_steps"]:
            start = max(start, short[-1][1])
        return start + p["skip_buckets"]

    def window_verdict(self, xs, ys, threshold):
        growth = median(ys[-3:]) - median(ys[:3])
        if growth < self.p["min_growth"]:
            return False, theil_sen(xs[-6:], ys[-6:]), 0.0     # cheap gate first
        # A leak grows in many increments; one or two jumps (a new batch
        # shape, a cache that filled) carry most of a step's growth.
        jumps = [b - a for a, b in zip(ys, ys[1:])]
        if max(jumps) > self.p["max_jump_share"] * (ys[-1] - ys[0] if ys[-1] > ys[0] else growth) \
                or sum(1 for d in jumps if d > 0) < self.p["min_rises"]:
            return False, theil_sen(xs[-6:], ys[-6:]), 0.0
        z = mann_kendall_z(ys)
        beta = theil_sen(xs, ys)
        half = len(xs) // 2
        tail = theil_sen(xs[half:], ys[half:])
        ok = (z >= self.p["z_min"] and beta >= threshold and growth >= self.p["min_growth"]
              and tail >= self.p["tail_ratio"] * beta)
        return ok, beta, z

    def near_oom_verdict(self, xs, ys, threshold):
        """The slope when the last hour of floors says OOM comes within
        fast_oom_h hours; None otherwise (or when free memory is unknown)."""
        p = self.p
        free = self.last.get("free")
        n = p["fast_buckets"]
        if free is None or len(xs) < n:
            return None
        fx, fy = xs[-n:], ys[-n:]
        steps = [b - a for a, b in zip(fy, fy[1:])]
        growth = fy[-1] - fy[0]
        # A leak fast enough to matter this close to OOM (more than free/6 h)
        # raises the floor in every bucket; a filling cache does not.
        if min(steps) <= 0 or growth < p["min_growth"] \
                or max(steps) > 0.5 * growth:
            return None
        beta = theil_sen(fx, fy)
        # a warm-up ramp decelerates; a leak keeps its pace
        tail = theil_sen(fx[n // 2:], fy[n // 2:])
        if beta >= threshold and free / beta <= p["fast_oom_h"] and tail >= p["tail_ratio"] * beta:
            return beta
        return None

    def evaluate(self):
        p = self.p
        threshold = p["threshold"]
        first = self.segment()
        pts = self.floors[first:]
        xs = [b * p["bucket_s"] / 3600.0 for b, _ in pts]
        ys = [float(v) for _, v in pts]
        leaking, slope, window = False, 0.0, 0
        for w in p["windows"]:
            if len(xs) < w:
                break
            ok, beta, _ = self.window_verdict(xs[-w:], ys[-w:], threshold)
            if ok:
                leaking, slope, window = True, beta, w
                break
            slope, window = beta, w
        if not leaking:
            fast = self.near_oom_verdict(xs, ys, threshold)
            if fast is not None:
                leaking, slope, window = True, fast, p["fast_buckets"]
        self.last["slope"] = slope
        self.last["window_s"] = window * p["bucket_s"]
        if self.firing:
            restarted = len(self.floors) >= 2 and self.floors[-1][1] < 0.5 * self.floors[-2][1]
            recent = self.floors[-min(len(self.floors), 12):]
            rx = [b * p["bucket_s"] / 3600.0 for b, _ in recent]
            ry = [float(v) for _, v in recent]
            stopped = len(recent) >= 6 and theil_sen(rx, ry) < 0.25 * threshold and \
                median(ry[-3:]) - median(ry[:3]) < p["min_growth"]
            self.calm = self.calm + 1 if (stopped or restarted) else 0
            if self.calm >= p["debounce"] or restarted:
                self.firing, self.streak, self.calm = False, 0, 0
                self.last["slope"] = theil_sen(rx, ry) if len(rx) > 1 else 0.0
                return self.event("resolved")
            return None
        self.streak = self.streak + 1 if leaking else 0
        if self.streak >= p["debounce"]:
            self.firing, self.calm = True, 0
            return self.event("firing")
        return None

    def event(self, state):
        slope = round(self.last.get("slope", 0.0), 1)
        free = self.last.get("free")
        oom = None
        if free is not None and slope > 0:
            oom = round(free / slope, 1)
        return {"ts": int(self.last["ts"]), "event": "gpu_memory_leak", "state": state, "pid": self.pid,
                "slope_mib_per_hour": slope, "used_memory_mib": self.last["used"],
                "free_memory_mib": free, "projected_oom_hours": oom,
                "window_seconds": int(self.last.get("window_s", 0))}


def params_from(args_or_env):
    p = dict(DEFAULTS)
    for key, name in (("bucket_s", "LEAK_BUCKET_S"), ("threshold", "LEAK_THRESHOLD_MIB_H")):
        value = args_or_env.get(name)
        if value not in (None, ""):
            p[key] = float(value)
    return p


# ---------------------------------------------------------------- replay --

def replay(path, params, gpu_total=None, out=sys.stdout):
    """Runs the detector over a CSV; returns the events."""
    series = {}
    events = []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = {"timestamp", "pid", "used_memory_mib"} - set(reader.fieldnames or [])
        if missing:
            raise ValueError("%s: missing column(s) %s (need timestamp,pid,used_memory_mib)"
                             % (path, ",".join(sorted(missing))))
        for n, row in enumerate(reader, 2):
            try:
                ts = float(row["timestamp"])
                pid = int(row["pid"])
                mib = float(row["used_memory_mib"])
                mib = int(mib) if mib.is_integer() else mib
            except (TypeError, ValueError):
                raise ValueError("%s:%d: not a number in %r" % (path, n, row))
            s = series.get(pid)
            if s is None:
                s = series[pid] = Series(params, str(pid), pid)
            free = (gpu_total - mib) if gpu_total else None
            ev = s.add(ts, mib, free)
            if ev:
                events.append(ev)
                out.write(json.dumps(ev) + "\n")
    return events


# ----------------------------------------------------------------- rules --

def load_rules(path):
    """Per-pattern thresholds: lines "REGEX THRESHOLD" or "REGEX ignore"."""
    rules = []
    if not path or not os.path.exists(path):
        return rules
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.rsplit(None, 1)
            if len(parts) != 2:
                raise ValueError("%s:%d: expected 'REGEX THRESHOLD|ignore'" % (path, n))
            pattern, value = parts
            try:
                rx = re.compile(pattern, re.I)
            except re.error as e:
                raise ValueError("%s:%d: bad regex: %s" % (path, n, e))
            if value != "ignore":
                try:
                    value = float(value)
                except ValueError:
                    raise ValueError("%s:%d: threshold must be a number or 'ignore'" % (path, n))
            rules.append((rx, value))
    return rules


def rule_for(rules, cmdline, default):
    for rx, value in rules:
        if rx.search(cmdline or ""):
            return value
    return default


# ------------------------------------------------------------------ loss --

def loss_plateau(path, last=60):
    """True when the loss stopped falling (last third vs first third of the
    recent entries improved by under 2 %), False when it still falls, None
    when unknown."""
    losses = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    v = json.loads(line).get("loss")
                except (ValueError, AttributeError):
                    continue
                if isinstance(v, (int, float)) and math.isfinite(v):
                    losses.append(float(v))
    except OSError:
        return None
    losses = losses[-last:]
    if len(losses) < 9:
        return None
    third = len(losses) // 3
    early, late = median(losses[:third]), median(losses[-third:])
    if early <= 0:
        return None
    return (early - late) / abs(early) < 0.02


# ------------------------------------------------------------------ live --

def check(env, stdin, stdout):
    """One live cycle: samples in, events and status out."""
    state_dir = env.get("GPUGUARD_STATE_DIR") or "."
    params = params_from(env)
    rules = load_rules(env.get("LEAK_RULES") or "")
    series = {k: Series.from_json(params, v) for k, v in load_state(state_dir).items()}
    seen = set()
    max_rows = int(env.get("LEAK_HISTORY_MAX_ROWS") or 20000)
    loss_log = env.get("LEAK_LOSS_LOG") or ""
    host = env.get("GPUGUARD_HOST") or os.uname().nodename
    for line in stdin:
        # KEY TS PID USED_MIB FREE_MIB CPU_PCT RSS_MIB NAME CMDLINE
        parts = line.rstrip("\n").split(" ", 8)
        if len(parts) < 8:
            continue
        key, ts, pid, used, free, cpu, rss, name = parts[:8]
        cmdline = parts[8] if len(parts) > 8 else name
        try:
            ts, pid, used = float(ts), int(pid), int(float(used))
            free = int(float(free)) if free not in ("", "-") else None
        except ValueError:
            continue
        seen.add(key)
        s = series.get(key)
        threshold = rule_for(rules, cmdline, params["threshold"])
        if s is None:
            s = series[key] = Series(params, key, pid)
        history_append(state_dir, key, ts, pid, used, max_rows)
        if threshold == "ignore":
            stdout.write("status - %d - 0 %d %s\n" % (pid, used, name))
            continue
        s.p = dict(params, threshold=threshold)
        ev = s.add(ts, used, free)
        if ev:
            # the command line stays out of events: it may hold tokens
            ev.update({"host": host, "name": name, "threshold_mib_per_hour": threshold,
                       "cpu_pct": int(cpu) if cpu.isdigit() else None,
                       "rss_mib": int(rss) if rss.isdigit() else None})
            if loss_log:
                ev["loss_plateau"] = loss_plateau(loss_log)
            stdout.write("event %s %d %s\n" % (ev["state"], pid, json.dumps(ev)))
        stdout.write("status - %d %.1f %d %d %s\n" % (pid, s.last.get("slope", 0.0), s.firing, used, name))
    for key in list(series):
        if key not in seen:
            s = series.pop(key)
            if s.firing:
                ev = s.event("resolved")
                ev.update({"host": host, "reason": "gone"})
                stdout.write("event resolved %d %s\n" % (s.pid, json.dumps(ev)))
    write_atomic(state_path(state_dir), json.dumps({k: s.to_json() for k, s in series.items()}))


def state_path(state_dir):
    return os.path.join(state_dir, "leak-state.json")


def load_state(state_dir):
    """The saved series by key; empty when there is none or it is unreadable."""
    try:
        with open(state_path(state_dir), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def write_atomic(path, text):
    """Writes through a temporary file and a rename: readers never see half."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def history_append(state_dir, key, ts, pid, used, max_rows):
    """Appends to history/<key>.csv; past max_rows it is rotated to .1."""
    folder = os.path.join(state_dir, "history")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, re.sub(r"[^0-9A-Za-z_.-]", "_", key) + ".csv")
    new = not os.path.exists(path)
    if not new:
        with open(path, "rb") as f:
            rows = sum(1 for _ in f)
        if rows > max_rows:
            os.replace(path, path + ".1")
            new = True
    with open(path, "a", encoding="utf-8") as f:
        if new:
            f.write("timestamp,pid,used_memory_mib\n")
        f.write("%d,%d,%g\n" % (ts, pid, used))


# ---------------------------------------------------------------- report --

def read_history(folder):
    out = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not name.endswith(".csv"):
            continue
        rows = []
        with open(os.path.join(folder, name), newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                try:
                    rows.append((float(row["timestamp"]), float(row["used_memory_mib"])))
                except (KeyError, TypeError, ValueError):
                    continue
        if rows:
            out[name[:-4]] = rows
    return out


def report(state_dir, out_path, params):
    """`gpu-leak-watch report`: the same report as `gpuguard report`
    (python/gpuguard_report.py); returns the number of processes charted."""
    import gpuguard_report
    env = dict(os.environ, GPUGUARD_STATE_DIR=state_dir, LEAK_BUCKET_S=str(params["bucket_s"]),
               LEAK_THRESHOLD_MIB_H=str(params["threshold"]))
    return gpuguard_report.report(state_dir, ["--out", out_path], env)[2]


def main(argv):
    env = os.environ
    cmd = argv[1] if len(argv) > 1 else ""
    try:
        if cmd == "replay" and len(argv) >= 3:
            gpu_total = float(env["LEAK_GPU_TOTAL_MIB"]) if env.get("LEAK_GPU_TOTAL_MIB") else None
            replay(argv[2], params_from(env), gpu_total)
            return 0
        if cmd == "check":
            check(env, sys.stdin, sys.stdout)
            return 0
        if cmd == "report" and len(argv) >= 3:
            n = report(env.get("GPUGUARD_STATE_DIR") or ".", argv[2], params_from(env))
            print("wrote %s (%d processes)" % (argv[2], n))
            return 0
        if cmd == "slopes":
            # for gpuguard status: "PID SLOPE FIRING" per watched series
            for data in load_state(env.get("GPUGUARD_STATE_DIR") or ".").values():
                print("%s %.0f %d" % (data.get("pid"), (data.get("last") or {}).get("slope", 0.0), data.get("firing", False)))
            return 0
        if cmd == "loss" and len(argv) >= 3:
            print(json.dumps(loss_plateau(argv[2])))
            return 0
    except (OSError, ValueError) as e:
        print("gpu-leak-watch: %s" % e, file=sys.stderr)
        return 2
    print("usage: gpuguard_leak.py replay FILE | check | report OUT.html | loss FILE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
