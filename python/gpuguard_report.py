#!/usr/bin/env python3
"""gpuguard's report and status data (stdlib only).

Commands:
  report [--out FILE] [--since WHEN] [--pid PID] [--gpu N|UUID]
          write one self-contained HTML file (inline SVG, CSS and a little
          JS; nothing fetched): per GPU utilization and memory over time
          with idle incidents shaded and alerts marked; per watched process
          its memory, 10-minute floors, fitted trend, projection to the
          GPU's capacity and projected OOM; a summary table linking to each
          chart. WHEN: 90m, 24h, 7d, unix seconds or 2026-12-01[T10:00].
  leaks   for `gpuguard status`: one line per watched series,
          "PID<TAB>SLOPE<TAB>FIRING<TAB>VERDICT<TAB>recent,memory,values",
          then one per watched job that ended in the last hour,
          "ended<TAB>PID<TAB>LAST_TS<TAB>USER<TAB>SHORT<TAB>CMDLINE"

Inputs, all under $GPUGUARD_STATE_DIR: gpu-history.tsv(.1) (the watchdog,
lib/gpuhistory.sh), history/*.csv (the leak watcher, read through
gpuguard_history.read_history), leak-state.json and leak-state-<instance>.json
(the detector's verdicts and slopes, under "series"), history/*.job.json
(each series' identity: its job as lib/jobinfo.sh read it, command line
masked), events.jsonl (every alert).

Charts are drawn here as SVG paths, each series reduced to a min/max
envelope per pixel column, so a week of 64 processes stays near 1 MB and the
browser only lays out a few thousand points per chart. The trend line uses
the detector's slope where it judged the series; otherwise a Theil-Sen fit
of the floors, drawn for the eye and labelled "not judged".
"""
import glob
import html
import json
import math
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpuguard_ledger
from gpuguard_files import Refused, descriptor_of, write_named
from gpuguard_history import identity_read, read_history
from gpuguard_leakstat import median, params_from, theil_sen

_WIDTH = 960                     # chart width, px
_PLOT_LEFT, _PLOT_RIGHT = 74, 18  # margins, px
_PLOT_W = _WIDTH - _PLOT_LEFT - _PLOT_RIGHT
_PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#7f7f7f", "#bcbd22", "#e377c2")


class _UsageError(Exception):
    pass


class _WriteError(Exception):
    """The report could not be written (disk full, /dev/full, a FIFO's reader
    gone): one line naming --out, exit 1."""


# ------------------------------------------------------------------ input --

def _parse_since(text, now):
    """Unix seconds from "90m", "24h", "7d", "3600s", unix seconds, or an
    ISO date/time (local time)."""
    start = _since_start(text, now)
    # Nothing is recorded before 1970, and a start there is a typo: left in,
    # it was printed as a negative year or overflowed time_t in a traceback.
    if start is None or start < 0:
        raise _UsageError("--since %s is out of range: it starts before 1970-01-01 00:00 UTC" % text)
    return start


def _since_start(text, now):
    """The start --since names, or None where it lies too far back for a
    float (a day count of twenty digits)."""
    m = re.fullmatch(r"(\d+)([smhd])", text)
    if m:
        back = int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        return now - back if back <= now else None
    if re.fullmatch(r"\d{9,11}", text):
        return float(text)
    for layout in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S"):
        try:
            parsed = time.strptime(text, layout)
        except ValueError:
            continue
        try:
            return time.mktime(parsed)
        except (OverflowError, ValueError):
            return None
    raise _UsageError("--since takes 90m, 24h, 7d, unix seconds or 2026-12-01[T10:00] (got '%s')" % text)


def _parse_ints(option, text, out):
    for part in text.split(","):
        if not re.fullmatch(r"\d{1,9}", part):
            raise _UsageError("%s needs a whole number (got '%s')" % (option, text))
        out.add(int(part))


def _parse_gpus(text, out):
    """--gpu: GPU indexes and UUIDs (GPU-xxxxxxxx-...), comma-separated;
    a UUID is kept as a string and matched in the GPU history."""
    for part in text.split(","):
        if re.fullmatch(r"\d{1,4}", part):
            out.add(int(part))
        elif re.fullmatch(r"(GPU|MIG)-[0-9A-Fa-f-]{8,64}", part):
            out.add(part.lower())
        elif re.fullmatch(r"NPU-\d{1,4}-\d{1,4}", part):
            # an Ascend NPU chip (lib/npu.sh): NPU-<card>-<chip>
            out.add(part.lower())
        else:
            raise _UsageError("--gpu needs a whole number (GPU or NPU index), a GPU UUID or an NPU id such as"
                              " NPU-0-0 (got '%s')" % text)


def _parse_args(args, now):
    opts = {"out": "gpuguard-report.html", "since": None, "pids": set(), "gpus": set()}
    i = 0
    while i < len(args):
        a = args[i]
        name, eq, value = a.partition("=")
        if name not in ("--out", "--since", "--pid", "--gpu"):
            raise _UsageError("unknown option '%s' for 'report' (see --help)" % a)
        if not eq:
            if i + 1 >= len(args):
                raise _UsageError("%s needs a value" % name)
            i += 1
            value = args[i]
        if name == "--out":
            if not value or value.endswith("/"):
                raise _UsageError("--out needs a file name (got '%s')" % value)
            # `--out --pid 1` wrote a report named "--pid" (or said "unknown
            # option '1'"): an option where the name should be is said, unless
            # a file by that name exists; "-" alone is stdout
            if not eq and value.startswith("-") and value != "-" and not os.path.exists(value):
                raise _UsageError("--out needs a file name (got the option '%s')" % value[:40])
            opts["out"] = value
        elif name == "--since":
            opts["since"] = _parse_since(value, now)
        elif name == "--pid":
            _parse_ints("--pid", value, opts["pids"])
        else:
            _parse_gpus(value, opts["gpus"])
        i += 1
    return opts


def _num(text):
    try:
        v = float(text)
    except (TypeError, ValueError):
        return None
    return v if not math.isnan(v) and abs(v) < 1e12 else None


# An Ascend NPU's key among the devices (lib/npu.sh numbers its chips from
# 0 as nvidia-smi numbers GPUs): its index plus this, so that GPU 0 and NPU
# 0 of a mixed box keep a section each.
_NPU_KEY_BASE = 1 << 20


def _device_key(index, uuid):
    """The report's key of a device: its index (an NPU's offset by
    _NPU_KEY_BASE)."""
    return index + (_NPU_KEY_BASE if str(uuid or "").startswith("NPU-") else 0)


def _device_word(uuid):
    """"NPU" for an Ascend chip (lib/npu.sh keys it NPU-<card>-<chip>), else
    "GPU": what the report calls a device in its titles."""
    return "NPU" if str(uuid or "").startswith("NPU-") else "GPU"


def _read_gpu_history(state_dir, since=None):
    """By device key (_device_key): {"uuid", "index", "rows": [(ts, util,
    used, total, power, idle, holders {pid: MiB})]}; unreadable rows are
    skipped."""
    gpus = {}
    for path in (os.path.join(state_dir, "gpu-history.tsv.1"), os.path.join(state_dir, "gpu-history.tsv")):
        try:
            f = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 - closed by the with below
        except OSError:
            continue
        with f:
            for line in f:
                if line.startswith("#"):
                    continue
                p = line.rstrip("\n").split("\t")
                if len(p) < 8 or not p[1].isdigit():
                    continue
                ts = _num(p[0])
                if ts is None or (since is not None and ts < since):
                    continue
                holders = {}
                for h in (p[8] if len(p) > 8 else "").split(","):
                    pid, _, used = h.partition(":")
                    if pid.isdigit():
                        holders[int(pid)] = _num(used)
                g = gpus.setdefault(_device_key(int(p[1]), p[2]), {"uuid": p[2], "index": int(p[1]), "rows": []})
                g["uuid"] = p[2]
                g["rows"].append((ts, _num(p[3]), _num(p[4]), _num(p[5]), _num(p[6]),
                                  int(p[7]) if p[7].isdigit() else 0, holders))
    for g in gpus.values():
        g["rows"].sort(key=lambda r: r[0])
    return gpus


def _event_ok(e):
    """False for a damaged events.jsonl line, which is skipped: a time that
    is no real time (1e999 made localtime() raise) or a leak slope that is
    no number ("n/a" made the alerts table raise)."""
    if not isinstance(e, dict):
        return False
    ts, slope = e.get("ts"), e.get("slope_mib_per_hour")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not 0 <= ts < 1e11:
        return False
    return slope is None or (isinstance(slope, (int, float)) and not isinstance(slope, bool) and math.isfinite(slope))


def _read_events(state_dir, since=None):
    events = []
    try:
        with open(os.path.join(state_dir, "events.jsonl"), encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if _event_ok(e) and (since is None or e["ts"] >= since):
                    events.append(e)
    except OSError:
        pass
    events.sort(key=lambda e: e["ts"])
    return events


def _read_leak_states(state_dir):
    """The detector's saved series by key, from leak-state.json and the
    per-instance leak-*.json files; the newest wins when a key repeats."""
    out = {}
    paths = glob.glob(os.path.join(glob.escape(state_dir), "leak-*.json"))
    for path in sorted(paths, key=lambda p: os.path.getmtime(p) if os.path.exists(p) else 0):
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("series"), dict):
            data = data["series"]
        if not isinstance(data, dict):
            continue
        for key, s in data.items():
            if isinstance(s, dict) and "pid" in s:
                old = out.get(key)
                if old is None or (s.get("last") or {}).get("ts", 0) >= (old.get("last") or {}).get("ts", 0):
                    out[key] = s
    return out


def _tail_rows(path, n=24):
    """The last n (timestamp, memory) rows of a history CSV (reads only
    its end)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 64 * n))
            lines = f.read().decode("utf-8", "replace").splitlines()[1:]
    except OSError:
        return []
    rows = []
    for line in lines[-n:]:
        p = line.split(",")
        if len(p) >= 3 and _num(p[0]) is not None and _num(p[2]) is not None:
            rows.append((_num(p[0]), _num(p[2])))
    return rows


def _tail_values(path, n=24):
    """The last n memory values of a history CSV, as text (reads only its end)."""
    return ["%d" % v for _, v in _tail_rows(path, n)]


def _leak_word(s, slope, threshold):
    """The verdict status shows: LEAK (the alert fires), watching (growing
    at the threshold or faster, not judged a leak yet), healthy, or
    judging (too short to have a slope)."""
    if s.get("firing"):
        return "LEAK"
    if not isinstance((s.get("last") or {}).get("slope"), (int, float)):
        return "judging"
    return "watching" if slope >= threshold else "healthy"


def leaks(state_dir, out, threshold=50.0):
    """For gpuguard status: PID, slope, firing, verdict (_leak_word) and
    recent memory of every series the detector keeps (newest series of a
    PID wins)."""
    by_pid = {}
    for key, s in _read_leak_states(state_dir).items():
        pid = s.get("pid")
        if not isinstance(pid, int):
            continue
        last = s.get("last") or {}
        if pid in by_pid and by_pid[pid][0] > last.get("ts", 0):
            continue
        slope = last.get("slope", 0.0) or 0.0
        if not isinstance(slope, (int, float)) or not math.isfinite(slope):
            slope = 0.0             # status prints it into JSON: a number, always
        path = os.path.join(state_dir, "history", re.sub(r"[^0-9A-Za-z_.-]", "_", str(key)) + ".csv")
        by_pid[pid] = (last.get("ts", 0), "%d\t%.0f\t%d\t%s\t%s\n" % (
            pid, slope, bool(s.get("firing")), _leak_word(s, slope, threshold), ",".join(_tail_values(path))))
    for pid in sorted(by_pid):
        out.write(by_pid[pid][1])


# How long status lists a job after the leak watcher last recorded it.
_ENDED_S = 3600


def _ended(state_dir, out, live, now=None):
    """For gpuguard status: the watched jobs that ended within ENDED_S (their
    history stopped and the detector let their series go), named by their
    identity files: "ended PID LAST_TS USER SHORT CMDLINE" (tab-separated;
    '-' for unknown, as bash's read merges empty fields), newest first."""
    now = time.time() if now is None else now
    folder = os.path.join(state_dir, "history")
    live = {re.sub(r"[^0-9A-Za-z_.-]", "_", str(k)) for k in live}
    identities = _read_identities(state_dir)
    rows = []
    for path in glob.glob(os.path.join(glob.escape(folder), "*.csv")):
        stem = os.path.basename(path)[:-4]
        if stem in live or not re.fullmatch(r"\d+-\d+", stem):
            continue                    # still watched, or one rank of a tree
        last = _tail_rows(path, 60)
        if not last or not 0 <= now - last[-1][0] <= _ENDED_S:
            continue
        if not any(used > 0 for _, used in last):
            continue                    # a wrapped job that never held GPU memory
        job = identities.get(stem) or {}
        cmd = " ".join(str(job.get("cmdline") or "").split())
        rows.append((last[-1][0], "ended\t%s\t%d\t%s\t%s\t%s\n" % (
            stem.split("-")[0], last[-1][0], " ".join(str(job.get("user") or "-").split()),
            _short_cmd(cmd, 48) if cmd else "-", cmd or "-")))
    for _, line in sorted(rows, reverse=True)[:10]:
        out.write(line)


# --------------------------------------------------------------- analysis --

def _floors(rows, bucket_s):
    """Minimum of each bucket, drawn at the time of that minimum:
    [(ts, MiB)]."""
    out = []
    cur, low = None, None
    for t, v in rows:
        b = int(t // bucket_s)
        if b != cur:
            if cur is not None:
                out.append(low)
            cur, low = b, (t, v)
        elif v < low[1]:
            low = (t, v)
    if cur is not None:
        out.append(low)
    return out


def _fit_line(pts, slope_per_s=None):
    """Theil-Sen fit of [(t, v)] (at most ~150 points, evenly thinned);
    with slope_per_s given only the intercept is fitted. (slope, icpt)."""
    if len(pts) < 2:
        return None
    step = max(1, len(pts) // 150)
    sub = pts[::step]
    xs = [t for t, _ in sub]
    ys = [v for _, v in sub]
    beta = theil_sen(xs, ys) if slope_per_s is None else slope_per_s
    icpt = median([y - beta * x for x, y in zip(xs, ys)])
    return beta, icpt


def _job_identity(events):
    """By PID: {"name", "cmdline", "user"} from the alerts' job objects and
    process lists (cmdlines there are already masked)."""
    ident = {}

    def note(pid, **kw):
        if isinstance(pid, int):
            d = ident.setdefault(pid, {})
            for k, v in kw.items():
                if v not in (None, "") and not d.get(k):
                    d[k] = str(v)

    for e in events:
        # the device's key (_device_key), an NPU's apart from a GPU's
        gpu = _device_key(e["gpu"], e.get("uuid")) if e.get("event") == "gpu_idle" and isinstance(
            e.get("gpu"), int) else None
        if e.get("event") == "gpu_memory_leak":
            note(e.get("pid"), name=e.get("name"))
        for p in e.get("processes") or []:
            if isinstance(p, dict):
                note(p.get("pid"), name=p.get("name"), gpu=gpu)
        jobs = [e.get("job")] + list(e.get("jobs") or [])
        jobs += [p.get("job") for p in e.get("processes") or [] if isinstance(p, dict)]
        for j in jobs:
            if not isinstance(j, dict):
                continue
            for pid in [j.get("pid")] + list(j.get("pids") or []):
                note(pid, cmdline=j.get("cmdline"), user=j.get("user"),
                     slurm=j.get("slurm_job"), container=j.get("container"), gpu=gpu)
    return ident


def _read_identities(state_dir):
    """{history file name without .csv: job object} from the leak watcher's
    history/<key>.job.json files (gpuguard_history.identity_write; the command
    lines there are already masked)."""
    folder = os.path.join(state_dir, "history")
    out = {}
    for path in glob.glob(os.path.join(glob.escape(folder), "*.job.json")):
        name = os.path.basename(path)[:-len(".job.json")]
        job = identity_read(state_dir, name)
        if job is not None:
            out[name] = job
    return out


def _identity_who(job):
    """The report's "who" fields of a job object."""
    who = {"cmdline": job.get("cmdline"), "user": job.get("user"), "slurm": job.get("slurm_job"),
           "container": job.get("container"), "cwd": job.get("cwd"), "start_ts": job.get("start_ts"),
           "job_pid": job.get("pid"), "pids": job.get("pids") or []}
    if job.get("rank") is not None:
        who["rank"] = str(job["rank"])
    if job.get("visible") is False:
        who["hidden"] = True
    return {k: v for k, v in who.items() if v not in (None, "", [])}


def _proc_tree():
    """Children and start time of every process, from one pass over /proc."""
    kids, starts = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, encoding="utf-8", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        kids.setdefault(int(fields[1]), []).append(int(name))
        starts[int(name)] = fields[19]
    return kids, starts


def _descendants(tree, pid, start):
    """The PIDs below a still running process; empty when it is gone or its
    PID now belongs to another process."""
    kids, starts = tree
    if pid not in starts or (start is not None and starts[pid] != str(start)):
        return []
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def _proc_identity(pid, start):
    """Name and user of a still running process whose start time matches the
    series key (a reused PID is someone else)."""
    try:
        with open("/proc/%d/stat" % pid, encoding="utf-8", errors="replace") as f:
            stat = f.read()
        if start is not None and stat.rsplit(")", 1)[1].split()[19] != str(start):
            return {}
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        uid = os.stat("/proc/%d" % pid).st_uid
        user = str(uid)
        try:
            import pwd
            user = pwd.getpwuid(uid).pw_name
        except (ImportError, KeyError):
            pass
        return {"name": name, "user": user}
    except (OSError, IndexError, ValueError):
        return {}


def _short(text, n=60):
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 1] + "…"


def _build(state_dir, opts, params, now):
    """(gpus, procs, events) of the report: the GPU history, one entry per
    leak history series (its GPU, fit, verdict and job), the events; as
    --pid and --gpu filter them, the likeliest leaks first."""
    since = opts["since"]
    gpus = _read_gpu_history(state_dir, since)
    events = _read_events(state_dir, since)
    states = _read_leak_states(state_dir)
    ident = _job_identity(events)
    identities = _read_identities(state_dir)
    history = read_history(os.path.join(state_dir, "history"))
    holders = {}                # pid -> {gpu index: rows holding it}
    for idx, g in gpus.items():
        for r in g["rows"]:
            for pid in r[6]:
                h = holders.setdefault(pid, {})
                h[idx] = h.get(idx, 0) + 1
    last_mem = {idx: next((r for r in reversed(g["rows"]) if r[2] is not None and r[3] is not None), None)
                for idx, g in gpus.items()}
    procs = []
    lazy = {}                   # the /proc tree, read only when a launcher needs it
    for key, rows in history.items():
        if since is not None:
            rows = [r for r in rows if r[0] >= since]
        # a job that died in its first seconds has one row: it is the one a
        # user most wants to see, so it is listed (not judged), not dropped
        if not rows:
            continue
        rows.sort(key=lambda r: r[0])
        m = re.match(r"(\d+)(?:-(\d+))?", key)
        pid = int(m.group(1)) if m else -1
        start = m.group(2) if m else None
        gpu = _series_gpu(pid, start, holders, ident, lazy)
        st = states.get(key)
        if st is None:
            cands = [s for s in states.values() if s.get("pid") == pid]
            st = cands[0] if len(cands) == 1 else None
        free = _series_free(rows, gpu, gpus, last_mem, (st or {}).get("last") or {})
        p = _series_fit(rows, st, free, params)
        pev = [e for e in events if e.get("event") == "gpu_memory_leak" and e.get("pid") == pid
               and (e.get("key") in (None, key)) and p["t0"] - 3600 <= e["ts"] <= p["t1"] + 3600]
        p.update(key=key, pid=pid, rows=rows, gpu=gpu, events=pev,
                 device=_device_word(gpus[gpu]["uuid"]) if gpu in gpus else "GPU",
                 index=gpus[gpu]["index"] if gpu in gpus else gpu,
                 verdict=_series_verdict(st, pev, p["judged"], p["slope_h"], params["threshold"]),
                 who=_series_who(key, pid, start, ident, identities))
        procs.append(p)
    gpus, procs = _filtered(gpus, procs, opts)
    order = {"LEAK": 0, "watching": 1, "resolved": 2, "not judged": 3, "healthy": 4}
    procs.sort(key=lambda p: (order.get(p["verdict"], 5), -p["slope_h"], p["key"]))
    return gpus, procs, events


def _series_gpu(pid, start, holders, ident, lazy):
    """The GPU of a series: the one whose holders list this PID (or, for a
    launcher, its descendants, or the alerts its job was named in) most
    often; None when nothing says."""
    votes = dict(holders.get(pid) or {})
    if not votes:
        if "tree" not in lazy:
            lazy["tree"] = _proc_tree()
        for kid in _descendants(lazy["tree"], pid, start):
            for idx, n in (holders.get(kid) or {}).items():
                votes[idx] = votes.get(idx, 0) + n
    if not votes and ident.get(pid, {}).get("gpu") is not None:
        votes = {int(ident[pid]["gpu"]): 1}
    return max(votes, key=votes.get) if votes else None


def _series_free(rows, gpu, gpus, last_mem, last):
    """The GPU's free memory (MiB) at the series' last sample, or None."""
    t1 = rows[-1][0]
    free = None
    if gpu is not None and last_mem.get(gpu) is not None:
        near = last_mem[gpu]
        if near[0] > t1 + 120:
            near = next((r for r in reversed(gpus[gpu]["rows"]) if r[0] <= t1 + 120 and r[2] is not None
                         and r[3] is not None), None)
        if near is not None:
            free = near[3] - near[2]
    if free is None and getattr(rows[-1], "gpu_free_mib", None) is not None:
        free = rows[-1].gpu_free_mib    # the leak watcher's own GPU figures (5-column history)
    if free is None and isinstance(last.get("free"), (int, float)):
        free = last["free"]
    return free


def _series_fit(rows, st, free, params):
    """The series' floors, its line (the detector's slope when it judged
    the series) and the projected hours to OOM."""
    last = (st or {}).get("last") or {}
    t0, t1 = rows[0][0], rows[-1][0]
    capacity = rows[-1][1] + free if free is not None else None
    span = max(t1 - t0, 1.0)
    bucket = max(1.0, min(params["bucket_s"], span / 30.0))
    fl = _floors(rows, bucket)
    judged = (len(rows) >= 2 and st is not None and isinstance(last.get("slope"), (int, float))
              and math.isfinite(last["slope"]))
    window = last.get("window_s") or 24 * 3600
    fit_pts = [p for p in fl if p[0] >= fl[-1][0] - window] or fl
    fit = _fit_line(fit_pts, last["slope"] / 3600.0 if judged else None)
    slope_h = last["slope"] if judged else (fit[0] * 3600 if fit else 0.0)
    oom_h = None
    if capacity is not None and slope_h > 0 and fit:
        headroom = capacity - (fit[1] + fit[0] * t1)
        oom_h = max(0.0, headroom / slope_h)
    return {"floors": fl, "bucket": bucket, "capacity": capacity, "fit": fit, "fit_from": fit_pts[0][0],
            "slope_h": slope_h, "judged": judged, "oom_h": oom_h, "t0": t0, "t1": t1}


def _series_verdict(st, pev, judged, slope_h, threshold):
    last = (st or {}).get("last") or {}
    firing = bool(st.get("firing")) if st else (bool(pev) and pev[-1].get("state") == "firing")
    if firing:
        return "LEAK"
    if pev and pev[-1].get("state") == "resolved":
        return "resolved"
    if judged and isinstance((st or {}).get("verdict") or last.get("verdict"), str):
        return (st or {}).get("verdict") or last.get("verdict")      # the detector's own word
    if judged:
        return "watching" if slope_h >= threshold else "healthy"
    return "not judged"


def _series_who(key, pid, start, ident, identities):
    who = dict(_proc_identity(pid, start))
    who.update({k: v for k, v in ident.get(pid, {}).items() if v and k != "gpu"})
    # the watcher's record of the series (a rank's own, else its tree's)
    # names it best, also long after it ended
    job = identities.get(key) or identities.get(key.split("_", 1)[0])
    if job is not None:
        who.update(_identity_who(job))
    return who


def _filtered(gpus, procs, opts):
    """The GPUs and series --pid and --gpu keep."""
    if opts["pids"]:
        # a job's own PID, the watched root's, or one of its GPU processes
        procs = [p for p in procs if p["pid"] in opts["pids"] or p["who"].get("job_pid") in opts["pids"]
                 or set(p["who"].get("pids") or []) & opts["pids"]]
        keep = {p["gpu"] for p in procs}
        gpus = {i: g for i, g in gpus.items() if i in keep or any(
            set(r[6]) & opts["pids"] for r in g["rows"])}
    if opts["gpus"]:
        wanted = {i for i, g in gpus.items() if g["index"] in opts["gpus"] or str(g["uuid"]).lower() in opts["gpus"]}
        gpus = {i: g for i, g in gpus.items() if i in wanted}
        procs = [p for p in procs if p["gpu"] in wanted]
    return gpus, procs


# ------------------------------------------------------------------ draw --

def _typical_step(rows, default):
    """The median time between consecutive rows (their first field)."""
    gaps = sorted(b[0] - a[0] for a, b in zip(rows, rows[1:]))
    return gaps[len(gaps) // 2] if gaps else default


def _envelope(points, t0, span):
    """Min/max per pixel column, in time order within a column, with None
    where the samples stop for longer than 5 typical intervals (a gap)."""
    if not points:
        return []
    gap = max(_typical_step(points, 0) * 5, span / _PLOT_W * 3)
    out = []
    col = None
    lo = hi = None
    prev_t = None

    def flush():
        if col is None:
            return
        a, b = (lo, hi) if lo[0] <= hi[0] else (hi, lo)
        out.append((col, a[1]))
        if b is not a and b[1] != a[1]:
            out.append((col, b[1]))

    for t, v in points:
        if v is None:
            continue
        if prev_t is not None and t - prev_t > gap:
            flush()
            out.append(None)
            col = None
        prev_t = t
        c = int((t - t0) / span * _PLOT_W) if span > 0 else 0
        if c != col:
            flush()
            col, lo, hi = c, (t, v), (t, v)
        else:
            if v < lo[1]:
                lo = (t, v)
            if v > hi[1]:
                hi = (t, v)
    flush()
    return out


def _path_d(env, ymap):
    """Compact SVG path: absolute moves, relative line-tos between integer
    columns (deltas of rounded positions, so nothing drifts)."""
    parts = []
    px = py = None
    pen = False
    for p in env:
        if p is None:
            pen = False
            continue
        x = _PLOT_LEFT + p[0]
        y = round(ymap(p[1]), 1)
        if not pen:
            parts.append("M%d %s" % (x, _fmt(y)))
            pen = True
        else:
            parts.append("%s %s" % (_fmt(x - px), _fmt(round(y - py, 1))))
        px, py = x, y
    out = []
    for i, s in enumerate(parts):
        out.append(s if s[0] == "M" or (i and parts[i - 1][0] != "M") else "l" + s)
    return " ".join(out).replace(" l", "l")


def _fmt(v):
    s = ("%.1f" % v).rstrip("0").rstrip(".")
    if s.startswith("0."):
        s = s[1:]
    elif s.startswith("-0."):
        s = "-" + s[2:]
    return s if s not in ("", "-") else "0"


def _nice_ticks(lo, hi, n=5):
    """Round tick values (1, 2, 2.5, 5 x 10^k apart) within [lo, hi]."""
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = 10 * mag
    for m in (1, 2, 2.5, 5):
        if raw <= m * mag:
            step = m * mag
            break
    v = math.ceil(lo / step) * step
    ticks = []
    while v <= hi + 1e-9:
        ticks.append(v)
        v += step
    return ticks


def _time_ticks(t0, t1):
    span = t1 - t0
    for step in (60, 300, 600, 1800, 3600, 7200, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400):
        if span / step <= 8:
            break
    off = time.localtime(t0).tm_gmtoff
    first = ((t0 + off) // step + 1) * step - off
    ticks = list(_frange(first, t1, step))
    if step > 3600:
        # the offset of t0 holds only until the clocks change: past a change
        # a tick moves with the wall clock, so a day's tick stays on midnight
        ticks = [t + off - time.localtime(t).tm_gmtoff for t in ticks]
    return ticks


def _frange(a, b, step):
    while a <= b:
        yield a
        a += step


def _tlabel(t):
    return time.strftime("%m-%d %H:%M", time.localtime(t))


def _mib(v):
    return f"{v:,.0f}"


class _Chart:
    """One SVG: time on x, one or two stacked panels. Panels carry their
    value mapping in data- attributes for the hover read-out."""

    def __init__(self, cid, t0, t1):
        self.cid, self.t0, self.t1 = cid, t0, max(t1, t0 + 1)
        self.span = self.t1 - self.t0
        self.parts = []
        self.ticks = []
        self.top = 8
        self.npanel = 0

    def X(self, t):
        return _PLOT_LEFT + (t - self.t0) / self.span * _PLOT_W

    def panel(self, height, lo, hi, unit, ticks_fmt=_mib, label=""):
        y0, y1 = self.top, self.top + height
        if hi - lo < 1e-9:
            hi = lo + 1

        def Y(v):
            return y1 - (v - lo) / (hi - lo) * height
        self.npanel += 1
        clip = "clip-%s-%d" % (self.cid, self.npanel)
        self.parts.append('<clipPath id="%s"><rect x="%d" y="%d" width="%d" height="%d"/></clipPath>'
                          % (clip, _PLOT_LEFT, y0 - 1, _PLOT_W, height + 2))
        self.parts.append('<g class="panel" data-y0="%d" data-y1="%d" data-lo="%s" data-hi="%s" data-unit="%s" '
                          'clip-path="url(#%s)">' % (y0, y1, _fmt(lo), _fmt(hi), html.escape(unit), clip))
        self.parts.append('<rect class="plot" x="%d" y="%d" width="%d" height="%d"/>' % (_PLOT_LEFT, y0, _PLOT_W, height))
        for v in _nice_ticks(lo, hi, 4):
            y = Y(v)
            self.parts.append('<line class="grid" x1="%d" x2="%d" y1="%.1f" y2="%.1f"/>' % (_PLOT_LEFT, _PLOT_LEFT + _PLOT_W, y, y))
            self.ticks.append('<text class="yt" x="%d" y="%.1f">%s</text>' % (_PLOT_LEFT - 4, y + 3.5, ticks_fmt(v)))
        if label:
            self.parts.append('<text class="ylab" x="%d" y="%d">%s</text>' % (_PLOT_LEFT + 5, y0 + 12, html.escape(label)))
        self.top = y1 + 8
        return Y

    def end_panel(self):
        self.parts.append("</g>")

    def series(self, points, Y, cls, name):
        env = _envelope(points, self.t0, self.span)
        d = _path_d(env, Y)
        if d:
            self.parts.append('<path class="s %s" data-name="%s" d="%s"/>' % (cls, html.escape(name), d))

    def shade(self, a, b, y0, y1, cls, title):
        x0, x1 = self.X(max(a, self.t0)), self.X(min(b, self.t1))
        self.parts.append('<rect class="%s" x="%.1f" y="%d" width="%.1f" height="%d"><title>%s</title></rect>'
                          % (cls, x0, y0, max(x1 - x0, 1.5), y1 - y0, html.escape(title)))

    def marker(self, ev, mid, y0, y1, text):
        x = self.X(min(max(ev["ts"], self.t0), self.t1))
        cls = "firing" if ev.get("state") in ("firing", "reminder") else "resolved"
        self.parts.append('<g class="marker %s" id="%s"><line x1="%.1f" x2="%.1f" y1="%d" y2="%d"/>'
                          '<path d="M%.1f %dl-4 -7h8z"/><title>%s</title></g>'
                          % (cls, mid, x, x, y0, y1, x, y0, html.escape(text)))

    def svg(self, title):
        ticks = _time_ticks(self.t0, self.t1)
        grid, labels = [], []
        for t in ticks:
            x = self.X(t)
            if x > _PLOT_LEFT + _PLOT_W - 34:
                continue
            grid.append('<line class="grid" x1="%.1f" x2="%.1f" y1="8" y2="%d"/>' % (x, x, self.top - 8))
            labels.append('<text class="xt" x="%.1f" y="%d">%s</text>' % (x, self.top + 6, _tlabel(t)))
        h = self.top + 12
        # the plot backgrounds come first, then the time grid, then the rest
        body = "".join(self.parts)
        return ('<svg class="chart" id="svg-%s" viewBox="0 0 %d %d" width="%d" height="%d" data-t0="%s" data-t1="%s" '
                'data-left="%d" data-w="%d" role="img" aria-label="%s">%s%s%s</svg>'
                % (self.cid, _WIDTH, h, _WIDTH, h, _fmt(self.t0), _fmt(self.t1), _PLOT_LEFT, _PLOT_W,
                   html.escape(title), "".join(grid), body, "".join(labels + self.ticks)
                   + '<line class="cursor" x1="0" x2="0" y1="0" y2="0" visibility="hidden"/>'))


def _gpu_section(idx, g, events, procs):
    rows = g["rows"]
    t0, t1 = rows[0][0], rows[-1][0]
    c = _Chart("gpu-%d" % idx, t0, t1)
    # idle incidents: runs of counted-idle cycles, darker while the alert fires
    runs = []
    for r in rows:
        if r[5] and runs and runs[-1][2] == r[5] and runs[-1][3]:
            runs[-1][1] = r[0]
        else:
            runs.append([r[0], r[0], r[5], bool(r[5])])
    runs = [r for r in runs if r[2]]
    cycle = _typical_step(rows, 60)
    yu = c.panel(90, 0, 100, "%", lambda v: "%d%%" % v, "utilization")

    def shade(top, height):
        for a, b, level, _ in runs:
            c.shade(a, b + cycle, top, top + height, "idle%d" % level,
                    "idle but occupied %s – %s%s" % (_tlabel(a), _tlabel(b), " (alert fired)" if level == 2 else ""))
    shade(c.top - 8 - 90, 90)
    c.series([(r[0], r[1]) for r in rows], yu, "util", "utilization")
    c.end_panel()
    used = [(r[0], r[2]) for r in rows if r[2] is not None]
    totals = [r[3] for r in rows if r[3] is not None]
    if used:
        lo, hi = min(v for _, v in used), max(v for _, v in used)
        pad = max((hi - lo) * 0.08, 16)
        ym = c.panel(120, max(0, lo - pad), hi + pad, "MiB", label="memory MiB")
        shade(c.top - 8 - 120, 120)
        c.series(used, ym, "mem", "memory used")
        c.end_panel()
    if totals:
        cap = "capacity %s MiB" % _mib(totals[-1])
    else:
        cap = ""
    mine = [e for e in events if (e.get("event") == "gpu_idle"
                                  and (e.get("uuid") == g["uuid"] or (not e.get("uuid") and e.get("gpu") == g["index"])))
            or e.get("event") == "monitor_degraded"
            or (e.get("event") == "gpu_memory_leak" and any(p["gpu"] == idx and e in p["events"] for p in procs))]
    for e in mine:
        c.marker(e, e["_id"], 8, c.top - 8, e["_text"])
    peak = max((r[1] for r in rows if r[1] is not None), default=None)
    name = html.escape(g.get("name") or "")
    word = _device_word(g["uuid"])
    head = ('<section class="gpu" id="gpu-%d"><h2>%s %d <small>%s %s · %s</small></h2>'
            '<p class="legend"><span class="sw util"></span>utilization <span class="sw mem"></span>memory used '
            '<span class="sw idle1"></span>idle but occupied <span class="sw idle2"></span>idle alert firing '
            '<span class="mk firing">▼</span>alert <span class="mk resolved">▼</span>resolved · %s · peak %s%%</p>'
            % (idx, word, g["index"], html.escape(g["uuid"]), name, cap or "capacity unknown", _span_text(t1 - t0),
               "?" if peak is None else "%d" % peak))
    return head + c.svg("%s %d utilization and memory" % (word, g["index"])) + "</section>"


def _span_text(s):
    if s >= 2 * 86400:
        return "%.1f days" % (s / 86400)
    if s >= 7200:
        return "%.1f h" % (s / 3600)
    return "%.0f min" % (s / 60)


def _short_cmd(cmdline, n=60):
    """A command line shortened for a table: the program's and the script's
    folders dropped (/opt/venv/bin/python3 /home/a/train.py -> python3
    train.py), then cut to n characters."""
    words = str(cmdline).split(" ")
    for i, w in enumerate(words[:2]):
        if "/" in w and "=" not in w and not w.startswith("-"):
            words[i] = w.rstrip("/").rsplit("/", 1)[-1] or w
    return _short(" ".join(words), n)


def _proc_label(p):
    who = p["who"]
    if who.get("hidden"):
        # the watcher saw only a PID (another PID namespace, a container)
        return "pid %d (another PID namespace: not visible to the watcher)" % p["pid"]
    # the name /proc or an alert gave, else the program of the command line
    name = who.get("name") or _short_cmd(str(who.get("cmdline") or "").split(" ")[0], 32) or "process"
    bits = ["%s (pid %d)" % (name, p["pid"])]
    if who.get("cmdline"):
        bits.append(_short_cmd(who["cmdline"], 60))
    if who.get("user"):
        bits.append("user " + str(who["user"]))
    if who.get("rank"):
        bits.append("rank " + who["rank"])
    if who.get("slurm"):
        bits.append("slurm " + str(who["slurm"]))
    elif who.get("container"):
        bits.append(str(who["container"]))
    return " · ".join(bits)


def _proc_title(p):
    """The whole (masked) command line and where it ran, for a hover."""
    who = p["who"]
    bits = [str(who["cmdline"])] if who.get("cmdline") else []
    if who.get("cwd"):
        bits.append("in " + str(who["cwd"]))
    if isinstance(who.get("start_ts"), (int, float)):
        bits.append("started " + time.strftime("%Y-%m-%d %H:%M", time.localtime(who["start_ts"])))
    return " · ".join(bits) or _proc_label(p)


def _proc_section(n, p):
    t0, t1 = p["t0"], p["t1"]
    rows = p["rows"]
    fl = p["floors"]
    fit, cap, slope_h = p["fit"], p["capacity"], p["slope_h"]
    oom_ts = t1 + p["oom_h"] * 3600 if p["oom_h"] is not None else None
    # the projection is drawn up to the capacity, or one data span ahead
    proj_end = t1
    if fit and slope_h > 0:
        proj_end = min(oom_ts, t1 + 2 * (t1 - t0)) if oom_ts is not None else t1 + (t1 - t0) * 0.25
    c = _Chart("proc-%d" % n, t0, max(proj_end, t1))
    lo = min(v for _, v in rows)
    hi = max(v for _, v in rows)
    if fit:
        hi = max(hi, fit[1] + fit[0] * proj_end)
    cap_in = cap is not None and oom_ts is not None and oom_ts <= proj_end + 1
    if cap_in:
        hi = max(hi, cap)
    pad = max((hi - lo) * 0.08, 8)
    Y = c.panel(200, lo - pad, hi + pad, "MiB", label="GPU memory MiB")
    c.series(rows, Y, "raw", "memory")
    c.series(fl, Y, "floor", "floor")
    if len(rows) < 2:
        # a single sample draws no line: a dot marks it
        c.parts.append('<circle class="one" cx="%.1f" cy="%.1f" r="4"><title>%s MiB</title></circle>'
                       % (c.X(t0), Y(rows[0][1]), _mib(rows[0][1])))
    if fit:
        a, b = p["fit_from"], t1
        c.parts.append('<line class="trend" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>'
                       % (c.X(a), Y(fit[1] + fit[0] * a), c.X(b), Y(fit[1] + fit[0] * b)))
        if proj_end > t1:
            c.parts.append('<line class="proj" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>'
                           % (c.X(t1), Y(fit[1] + fit[0] * t1), c.X(proj_end), Y(fit[1] + fit[0] * proj_end)))
    if cap_in:
        y = Y(cap)
        c.parts.append('<line class="cap" x1="%d" x2="%d" y1="%.1f" y2="%.1f"/><text class="caplab" x="%d" y="%.1f">'
                       'capacity for this process %s MiB · projected OOM %s</text>'
                       % (_PLOT_LEFT, _PLOT_LEFT + _PLOT_W, y, y, _PLOT_LEFT + _PLOT_W - 10, y + 14, _mib(cap), _tlabel(oom_ts)))
        c.parts.append('<circle class="oom" cx="%.1f" cy="%.1f" r="4"><title>projected OOM %s</title></circle>'
                       % (c.X(oom_ts), y, _tlabel(oom_ts)))
    if t1 < c.t1:
        c.parts.append('<line class="now" x1="%.1f" x2="%.1f" y1="8" y2="%d"/>' % (c.X(t1), c.X(t1), c.top - 8))
    c.end_panel()
    for e in p["events"]:
        c.marker(e, e["_id"], 8, c.top - 8, e["_text"])
    oom = _oom_text(p)
    cap_note = ""
    if cap is not None and not cap_in and slope_h > 0:
        cap_note = " · capacity %s MiB is above the chart" % _mib(cap)
    trend = "trend %+.0f MiB/h%s" % (slope_h, "" if p["judged"] else " (not judged by the detector: a fit for the eye)")
    if len(rows) < 2:
        trend = "no trend (not judged: 1 sample)"
    head = ('<section class="proc" id="%s"><h2 title="%s"><span class="verdict v-%s">%s</span> %s <small>%s %s</small></h2>'
            '%s<p class="legend"><span class="sw raw"></span>memory <span class="sw floor"></span>%s floors '
            '<span class="sw trend"></span>%s <span class="sw proj"></span>projection%s · projected OOM: %s · '
            '%d sample%s over %s, %s → %s MiB</p>'
            % (p["anchor"], html.escape(_proc_title(p)), _vclass(p["verdict"]), html.escape(p["verdict"]),
               html.escape(_proc_label(p)), p.get("device", "GPU"), "?" if p["gpu"] is None else p["index"], _cmd_line(p),
               _span_text(p["bucket"]),
               html.escape(trend), cap_note, html.escape(oom), len(rows), "s" if len(rows) != 1 else "",
               _span_text(t1 - t0),
               _mib(rows[0][1]), _mib(rows[-1][1])))
    return head + c.svg("memory of " + _proc_label(p)) + "</section>"


def _cmd_line(p):
    """The paragraph under a chart's heading with the whole masked command
    line (empty when it is not known)."""
    if not p["who"].get("cmdline"):
        return ""
    return "<p class='cmd'><code>%s</code></p>" % html.escape(_proc_title(p))


def _vclass(verdict):
    """A verdict as a CSS class name."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", verdict)


def _growth_cell(p):
    """The table's growth figure: the slope, starred when the detector did
    not judge it; none for a single sample, which has no trend."""
    if len(p["rows"]) < 2:
        return "none (1 sample)"
    return "%+.0f%s" % (p["slope_h"], "" if p["judged"] else "*")


def _oom_text(p):
    if len(p["rows"]) < 2:
        return "unknown (1 sample)"
    if p["oom_h"] is None:
        return "none (not growing)" if p["slope_h"] <= 0 or p["capacity"] is not None else "unknown (no capacity)"
    return "%s (in %.1f h)" % (_tlabel(p["t1"] + p["oom_h"] * 3600), p["oom_h"])


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.2em 2em;color:#222;max-width:1000px}
h1{font-size:1.4em;margin:.2em 0}h2{font-size:1.05em;margin:1.4em 0 .2em}small{color:#666;font-weight:normal}
table{border-collapse:collapse;margin:.6em 0}td,th{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left}
th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
.verdict{font-weight:bold;padding:0 5px;border-radius:3px}.v-LEAK{background:#c62828;color:#fff}
.v-watching{background:#f9a825}.v-healthy{background:#c8e6c9}.v-resolved{background:#bbdefb}.v-not-judged{background:#eee}
.warn{color:#9a3412}.legend{margin:.1em 0;color:#444;font-size:12px}.cmd{margin:.1em 0;font-size:12px;overflow-wrap:anywhere}.sw{display:inline-block;width:18px;height:0;border-top:3px solid;margin:0 3px 3px 8px}
.sw.util{border-color:#1f77b4}.sw.mem{border-color:#9467bd}.sw.raw{border-color:#9ecae1}.sw.floor{border-color:#08519c}
.sw.trend{border-color:#d62728}.sw.proj{border-color:#d62728;border-top-style:dashed}
.sw.idle1{border-top:8px solid #ffe0b2}.sw.idle2{border-top:8px solid #ffab91}.mk{margin-left:8px}.mk.firing{color:#c62828}.mk.resolved{color:#2e7d32}
svg.chart{display:block;font-size:11px;max-width:100%;height:auto}.plot{fill:none;stroke:#ccc}
.grid{stroke:#eee}.yt{text-anchor:end;fill:#555}.xt{text-anchor:middle;fill:#555}.ylab{fill:#333;font-weight:bold}
.s{fill:none;stroke-width:1.2;stroke-linejoin:round}.util{stroke:#1f77b4}.mem{stroke:#9467bd;stroke-width:1.5}
.raw{stroke:#9ecae1}.floor{stroke:#08519c;stroke-width:2}
.trend{stroke:#d62728;stroke-width:2}.proj{stroke:#d62728;stroke-width:2;stroke-dasharray:6 4}
.one{fill:#08519c}.cap{stroke:#000;stroke-dasharray:2 3}.caplab{fill:#000;text-anchor:end;font-weight:bold}.oom{fill:#d62728}.now{stroke:#888;stroke-dasharray:1 3}
.idle1{fill:#ffe0b2}.idle2{fill:#ffab91}
.marker line{stroke-width:1.5}.marker.firing line,.marker.firing path{stroke:#c62828;fill:#c62828}
.marker.resolved line,.marker.resolved path{stroke:#2e7d32;fill:#2e7d32}.marker:target line{stroke-width:4}
#tip{position:absolute;pointer-events:none;background:rgba(255,255,255,.95);border:1px solid #999;padding:3px 6px;
font-size:12px;display:none;white-space:pre}.cursor{stroke:#444;stroke-width:.8}
"""

_JS = r"""
(function(){
var tip=document.getElementById('tip');
function parse(p){if(p._pts)return p._pts;var d=p.getAttribute('d'),pts=[],x=0,y=0,rel=false,brk=false,i=0;
var tok=d.match(/[Ml]|-?[0-9]*\.?[0-9]+/g);
while(i<tok.length){var t=tok[i];if(t==='M'){rel=false;brk=true;i++;continue}if(t==='l'){rel=true;i++;continue}
var a=+tok[i],b=+tok[i+1];i+=2;if(rel){x+=a;y+=b}else{x=a;y=b;rel=true}pts.push([x,y,brk]);brk=false}
p._pts=pts;return pts}
function at(pts,px){var lo=null,hi=null,k;for(k=0;k<pts.length;k++){if(Math.abs(pts[k][0]-px)<0.5){
lo=lo===null?pts[k][1]:Math.max(lo,pts[k][1]);hi=hi===null?pts[k][1]:Math.min(hi,pts[k][1])}}
if(lo!==null)return[lo,hi];for(k=0;k+1<pts.length;k++){var a=pts[k],b=pts[k+1];
if(!b[2]&&a[0]<=px&&px<=b[0]&&b[0]>a[0]){var y=a[1]+(b[1]-a[1])*(px-a[0])/(b[0]-a[0]);return[y,y]}}return null}
function fmtT(t){var d=new Date(t*1000);function z(n){return(n<10?'0':'')+n}
return d.getFullYear()+'-'+z(d.getMonth()+1)+'-'+z(d.getDate())+' '+z(d.getHours())+':'+z(d.getMinutes())}
function move(ev){var s=ev.currentTarget,r=s.getBoundingClientRect(),vb=s.viewBox.baseVal;
var px=(ev.clientX-r.left)*vb.width/r.width,left=+s.dataset.left,w=+s.dataset.w;
if(px<left||px>left+w){out(ev);return}
var t=+s.dataset.t0+(px-left)/w*(+s.dataset.t1-+s.dataset.t0),lines=[fmtT(t)];
s.querySelectorAll('g.panel').forEach(function(g){var y0=+g.dataset.y0,y1=+g.dataset.y1,lo=+g.dataset.lo,hi=+g.dataset.hi;
g.querySelectorAll('path.s').forEach(function(p){var r=at(parse(p),px);if(!r)return;var lo2=r[0],hi2=r[1];
function v(y){return lo+(y1-y)/(y1-y0)*(hi-lo)}
var a=v(lo2),b=v(hi2),u=g.dataset.unit;
lines.push(p.dataset.name+': '+(Math.abs(b-a)<0.5?Math.round(a):Math.round(a)+'–'+Math.round(b))+' '+u)})});
var c=s.querySelector('line.cursor');c.style.visibility='visible';c.setAttribute('x1',px);c.setAttribute('x2',px);
c.setAttribute('y1',8);c.setAttribute('y2',vb.height-20);
tip.textContent=lines.join('\n');tip.style.display='block';tip.style.left=(ev.pageX+12)+'px';tip.style.top=(ev.pageY+12)+'px'}
function out(ev){tip.style.display='none';ev.currentTarget.querySelector('line.cursor').style.visibility='hidden'}
document.querySelectorAll('svg.chart').forEach(function(s){s.addEventListener('mousemove',move);s.addEventListener('mouseleave',out)});
window.gpuguardHover=function(id,frac){var s=document.getElementById(id),r=s.getBoundingClientRect(),
left=+s.dataset.left,w=+s.dataset.w,vb=s.viewBox.baseVal;
move({currentTarget:s,clientX:r.left+(left+frac*w)*r.width/vb.width,pageX:0,pageY:0});return tip.textContent};
})();
"""

_HEAD_JS = ("window.gpuguardErrors=[];window.addEventListener('error',function(e){window.gpuguardErrors.push(String(e.message));"
           "document.documentElement.setAttribute('data-errors',window.gpuguardErrors.join(' | '))});")
_LOAD_JS = ("window.addEventListener('load',function(){void document.body.offsetHeight;"
           "document.documentElement.setAttribute('data-load-ms',performance.now().toFixed(0))});")


def _render(gpus, procs, events, host, now, opts, ledger_html=""):
    # every alert gets an id; the alerts table links to the chart holding it
    where = {}
    for p in procs:
        p["anchor"] = "proc-" + re.sub(r"[^0-9A-Za-z_-]", "_", p["key"])
        for e in p["events"]:
            where.setdefault(id(e), p["anchor"])
    alerts = [e for e in events if e.get("event") in ("gpu_idle", "gpu_memory_leak", "monitor_degraded")]
    for n, e in enumerate(alerts):
        e["_id"] = "alert-%d" % (n + 1)
        if e["event"] == "gpu_idle":
            e["_text"] = "%s idle %s: %s %s, util %s%%, %s cycles" % (
                _tlabel(e["ts"]), e.get("state"), _device_word(e.get("uuid")), e.get("gpu"), e.get("utilization"),
                e.get("idle_cycles"))
            target = "gpu-%s" % _device_key(e.get("gpu") if isinstance(e.get("gpu"), int) else -1, e.get("uuid"))
        elif e["event"] == "gpu_memory_leak":
            job = e.get("job") if isinstance(e.get("job"), dict) else {}
            # the level it went out at, and what it was before when it
            # escalated: a second row for one leak says why it was sent
            level = e.get("severity") if e.get("state") == "firing" and isinstance(e.get("severity"), str) else ""
            if level and isinstance(e.get("escalated_from"), str):
                level += ", was " + e["escalated_from"]
            e["_text"] = "%s leak %s%s: pid %s %s, %+.0f MiB/h" % (
                _tlabel(e["ts"]), e.get("state"), " (%s)" % level if level else "", e.get("pid"),
                _short_cmd(job["cmdline"], 60) if job.get("cmdline") else e.get("name") or "",
                e.get("slope_mib_per_hour") or 0)
            target = where.get(id(e))
        else:
            e["_text"] = "%s monitor %s: %s" % (_tlabel(e["ts"]), e.get("state"), _short(e.get("error") or "", 80))
            target = "gpu-%d" % min(gpus) if gpus else None
        e["_target"] = target
    shown = set(["gpu-%d" % i for i in gpus] + [p["anchor"] for p in procs])
    out = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
           "<meta name='viewport' content='width=device-width'><title>gpuguard report · %s</title>" % html.escape(host),
           "<script>%s</script><style>%s</style></head><body>" % (_HEAD_JS, _CSS),
           "<h1>gpuguard report · %s</h1>" % html.escape(host),
           "<p>Generated %s%s. Memory axes are scaled to the data, not from 0. Hover a chart for values; "
           "click a row to go to its chart.</p>" % (
               time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now)),
               _filters_text(opts))]
    out.append("<h2 id='summary'>Processes</h2>")
    if procs:
        kinds = {p.get("device", "GPU") for p in procs}
        out.append("<table id='summary-table'><tr><th>verdict</th><th>job</th><th>%s</th><th>growth MiB/h</th>"
                   "<th>since</th><th>projected OOM</th></tr>" % (kinds.pop() if len(kinds) == 1 else "device"))
        for p in procs:
            out.append("<tr class='row-%s'><td><span class='verdict v-%s'>%s</span></td><td><a href='#%s' title='%s'>%s</a></td>"
                       "<td class='n'>%s</td><td class='n'>%s</td><td>%s</td><td>%s</td></tr>"
                       % (_vclass(p["verdict"]), _vclass(p["verdict"]), html.escape(p["verdict"]),
                          p["anchor"], html.escape(_proc_title(p)), html.escape(_proc_label(p)),
                          "?" if p["gpu"] is None else p["index"],
                          _growth_cell(p), _tlabel(p["t0"]), html.escape(_oom_text(p))))
        out.append("</table>")
        if not all(p["judged"] or len(p["rows"]) < 2 for p in procs):
            out.append("<p class='legend'>* not judged by the leak detector (no saved verdict): a Theil-Sen fit for the eye.</p>")
    else:
        out.append("<p>No process history%s: run <code>gpu-leak-watch</code> (e.g. <code>--all</code>) to record it.</p>"
                   % (" matches the filters" if opts["pids"] or opts["gpus"] or opts["since"] else ""))
    out.append("<h2 id='alerts'>Alerts</h2>")
    if alerts:
        out.append("<table id='alerts-table'><tr><th>time</th><th>alert</th></tr>")
        for e in alerts:
            tgt = e["_target"] if e["_target"] in shown else None
            label = html.escape(e["_text"])
            cell = "<a href='#%s' data-alert='%s'>%s</a>" % (tgt, e["_id"], label) if tgt else label
            out.append("<tr class='%s'><td>%s</td><td>%s</td></tr>" % (
                html.escape(str(e.get("state"))), time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["ts"])), cell))
        out.append("</table>")
    else:
        out.append("<p>No alert in this period.</p>")
    out.append(ledger_html)
    words = {_device_word(g["uuid"]) for g in gpus.values()}
    out.append("<h2>%s</h2>" % {frozenset(["NPU"]): "NPUs", frozenset(["GPU", "NPU"]): "GPUs and NPUs"}.get(
        frozenset(words), "GPUs"))
    if not gpus:
        out.append("<p>No GPU history%s: the idle watchdog (<code>yichuidingyin.sh</code>) records it every cycle "
                   "in gpu-history.tsv.</p>" % (" matches the filters" if opts["gpus"] or opts["pids"] else ""))
    for idx in sorted(gpus):
        if gpus[idx]["rows"]:
            out.append(_gpu_section(idx, gpus[idx], alerts, procs))
    out.append("<h2>Processes, one chart each</h2>" if procs else "")
    for n, p in enumerate(procs):
        out.append(_proc_section(n, p))
    out.append("<div id='tip'></div><script>%s%s</script></body></html>\n" % (_JS, _LOAD_JS))
    return "\n".join(out)


def _ledger_section(env, opts, now, today_text=""):
    """The ledger of the report's period (default: the last 7 days): GPU-hours
    held and held idle per user as a bar chart, then the jobs as a table
    (python/gpuguard_ledger.py reads the day files; today's rows come from
    the watchdog's memory on stdin)."""
    last = gpuguard_ledger.day_of(now)
    first = gpuguard_ledger.day_of(opts["since"]) if opts["since"] else gpuguard_ledger.days_back(last, 7)[0]
    first = min(first, last)            # --since in the future: today, empty
    s, jobs = gpuguard_ledger.period(env, first, last, today_text)
    first = s["from"]                   # (no earlier than the ledger's first day)
    # an Ascend box's ledger says NPU (as its digest); a mixed box's GPU,
    # its NPUs npuN (python/gpuguard_ledger.py)
    npu = gpuguard_ledger.npu_box(env)
    word = "NPU" if npu else "GPU"
    out = ["<h2 id='ledger'>Ledger: who held %ss, and how long idle <small>%s – %s</small></h2>" % (word, first, last)]
    if env.get("LEDGER_NO_LEDGER"):
        # no watchdog books time in this state folder (lib/common.sh,
        # gg_state_unwatched_into): its empty table would read as "nobody
        # held a GPU"
        out.append("<p class='warn' id='no-ledger'>%s</p>" % html.escape(env["LEDGER_NO_LEDGER"]))
    if not jobs:
        return "\n".join(out + ["<p>No %s was held in this period (the watchdog, <code>yichuidingyin.sh</code>, "
                                "keeps the ledger).</p>" % word])
    cost = (" · wasted %.2f %s" % (s["cost"], html.escape(s["currency"] or ""))) if s["cost"] is not None else ""
    out.append("<p>%.1f %s-hours held, %.1f of them idle or stuck%s.</p>" % (
        s["held_s"] / 3600, word, s["idle_s"] / 3600, cost))
    out.append(_ledger_bars(s["users"], word))
    out.append("<table id='ledger-table'><tr><th>day</th><th>user</th><th>job</th><th>%s</th><th>held h</th>"
               "<th>idle h</th><th>longest idle</th><th>cost</th></tr>" % word)
    price = s["gpu_hour_price"]
    for j in jobs[:50]:
        job = (j["job"] or "-") + (" · " + j["cmd"] if j["cmd"] else "")
        out.append("<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td class='n'>%.1f</td><td class='n'>%.1f</td>"
                   "<td>%s</td><td class='n'>%s</td></tr>" % (
                       j["day"], html.escape(j["user"] or "-"), html.escape(_short(job, 90)),
                       html.escape(gpuguard_ledger.device_list(j["gpus"], npu)),
                       j["held_s"] / 3600, j["idle_s"] / 3600, _span_text(j["longest_s"]),
                       "%.2f" % (j["idle_s"] / 3600 * price) if price else "-"))
    out.append("</table>")
    if len(jobs) > 50:
        out.append("<p class='legend'>%d more jobs, less idle.</p>" % (len(jobs) - 50))
    return "\n".join(out)


def _ledger_bars(users, word="GPU"):
    """A horizontal bar per user: GPU-hours (word: NPU on an Ascend box)
    held (grey) and held idle (red)."""
    if not users:
        return ""
    top = max(u["held_s"] for u in users) or 1
    row, left, width = 22, 140, 560
    # not class 'chart': the hover script and the chart list are the time charts'
    parts = ["<svg id='ledger-bars' style='display:block;font-size:11px;max-width:100%%;height:auto' "
             "width='%d' height='%d' role='img' "
             "aria-label='%s-hours held and held idle per user'>" % (left + width + 120, row * len(users) + 8, word)]
    for n, u in enumerate(users):
        y = 4 + n * row
        held_w, idle_w = width * u["held_s"] / top, width * u["idle_s"] / top
        parts.append("<text x='%d' y='%d' class='yt'>%s</text>" % (left - 6, y + 14, html.escape(u["user"] or "-")))
        parts.append("<rect x='%d' y='%d' width='%.1f' height='16' fill='#cfd8dc'><title>held %.1f h</title></rect>"
                     % (left, y, held_w, u["held_s"] / 3600))
        parts.append("<rect x='%d' y='%d' width='%.1f' height='16' fill='#e53935'><title>idle %.1f h</title></rect>"
                     % (left, y, idle_w, u["idle_s"] / 3600))
        parts.append("<text x='%.1f' y='%d'>%.1f h idle / %.1f h held</text>"
                     % (left + held_w + 6, y + 13, u["idle_s"] / 3600, u["held_s"] / 3600))
    parts.append("</svg>")
    return "".join(parts)


def _filters_text(opts):
    f = []
    if opts["since"]:
        f.append("since " + time.strftime("%Y-%m-%d %H:%M", time.localtime(opts["since"])))
    if opts["pids"]:
        f.append("pid " + ",".join(map(str, sorted(opts["pids"]))))
    if opts["gpus"]:
        # the option's own name: an index names a GPU or an NPU alike
        f.append("--gpu " + ",".join(map(str, sorted(opts["gpus"]))))
    return " (" + "; ".join(f) + ")" if f else ""


def report(state_dir, args, env, now=None, today_text=""):
    now = time.time() if now is None else now
    opts = _parse_args(args, now)
    params = params_from(env)
    gpus, procs, events = _build(state_dir, opts, params, now)
    host = env.get("GPUGUARD_HOST") or os.uname().nodename
    text = _render(gpus, procs, events, host, now, opts, _ledger_section(env, opts, now, today_text))
    out = opts["out"]
    if os.path.isdir(out) and descriptor_of(out) is None:
        raise _UsageError("--out %s is a folder; give a file name" % out)
    try:
        # never replaces what is not a regular file: a device, a FIFO or a
        # link at --out is written through or refused (gpuguard_files)
        write_named(out, text, mode=0o644)
    except Refused as e:
        raise _UsageError("--out %s" % e) from None
    except OSError as e:
        # the user's name, not the temporary file's
        raise _WriteError("cannot write %s: %s" % (out, e.strerror or e)) from None
    report.unmatched = _unmatched(opts, gpus, procs, events)
    report.nothing_recorded = _nothing_recorded(state_dir, today_text)
    return out, len(gpus), len(procs), len(text.encode("utf-8"))


def _nothing_recorded(state_dir, today_text=""):
    """True when the state folder holds nothing a report draws from (no GPU
    history, event, leak history or ledger day): an empty report then says
    so, rather than pass for a quiet box. Only read: a missing folder is
    not created."""
    if today_text.strip():
        return False
    for name in ("gpu-history.tsv", "gpu-history.tsv.1", "events.jsonl"):
        try:
            if os.path.getsize(os.path.join(state_dir, name)) > 0:
                return False
        except OSError:
            pass
    return not any(glob.glob(os.path.join(glob.escape(os.path.join(state_dir, sub)), pattern))
                   for sub, pattern in (("history", "*.csv"), ("ledger", "*.tsv")))


def _unmatched(opts, gpus, procs, events):
    """One line saying which filter matched nothing (None when something
    was found): a PID or GPU typed wrong should not pass for a quiet box."""
    def listed(values):
        return ",".join(str(v) for v in sorted(values, key=str))
    if procs or gpus:
        return None
    if opts["pids"]:
        return "--pid %s matches no process in the history" % listed(opts["pids"])
    if opts["gpus"]:
        return "--gpu %s matches no GPU in the history" % listed(opts["gpus"])
    if opts["since"] is not None and not events:
        return "nothing was recorded since %s" % time.strftime("%Y-%m-%d %H:%M", time.localtime(opts["since"]))
    return None


def main(argv):
    env = os.environ
    cmd = argv[1] if len(argv) > 1 else ""
    state_dir = env.get("GPUGUARD_STATE_DIR") or "."
    # messages name the command the user typed (gpu-leak-watch report passes it)
    prog = env.get("GG_PROG") or "gpuguard"
    try:
        if cmd == "report":
            now = float(env["GPUGUARD_NOW"]) if env.get("GPUGUARD_NOW") else None
            today = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read(1 << 20)
            out, ng, npr, size = report(state_dir, argv[2:], env, now, today)
            empty = "; nothing recorded in %s yet: yichuidingyin.sh and gpu-leak-watch record there" % state_dir \
                if report.nothing_recorded else ""
            # the HTML went to stdout ("-", /dev/stdout): the line goes beside it
            print("wrote %s (%d GPUs, %d processes, %d KiB)%s" % ("stdout" if out == "-" else out, ng, npr,
                                                                 (size + 1023) // 1024, empty),
                  file=sys.stderr if descriptor_of(out) == 1 else sys.stdout)
            if report.unmatched:
                print("%s: %s" % (prog, report.unmatched), file=sys.stderr)
            return 0
        if cmd == "leaks":
            leaks(state_dir, sys.stdout, params_from(env)["threshold"])
            now = float(env["GPUGUARD_NOW"]) if env.get("GPUGUARD_NOW") else None
            _ended(state_dir, sys.stdout, set(_read_leak_states(state_dir)), now)
            return 0
    except _UsageError as e:
        print("%s: %s" % (prog, e), file=sys.stderr)
        return 2
    except PermissionError as e:
        # a part of the state this user may not read (a root watchdog's)
        print("%s report: cannot read %s: run as its owner or root" % (prog, e.filename or state_dir),
              file=sys.stderr)
        return 1
    except (OSError, _WriteError) as e:
        print("%s report: %s" % (prog, e), file=sys.stderr)
        return 1
    print("usage: gpuguard_report.py report [--out FILE] [--since WHEN] [--pid PID] [--gpu N] | leaks", file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except KeyboardInterrupt:
        # Ctrl-C: one line and 130 (128 + SIGINT, as a shell reports it),
        # never a 30-line traceback
        print("%s: interrupted" % (os.environ.get("GG_PROG") or "gpuguard"), file=sys.stderr)
        sys.exit(130)
