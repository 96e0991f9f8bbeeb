#!/usr/bin/env python3
"""gpuguard's GPU memory leak detector (stdlib only).

Commands:
  replay FILE     run the detector over a CSV without sleeping: the 3-column
                  `timestamp,pid,used_memory_mib` (GPU total from
                  LEAK_GPU_TOTAL_MIB / --gpu-total-mib) or the watcher's own
                  history file (`...,gpu_used_mib,gpu_total_mib`, which knows
                  the capacity); a UTF-8 BOM is ignored. One JSON line per
                  event on stdout, then one summary line on stderr
                  ("replayed N samples, K series, H h: E events; PID: verdict,
                  ..."). A malformed file is exit 2 naming the line (text
                  that is not UTF-8, a timestamp that is not Unix seconds);
                  a row with an impossible used memory (nvidia-smi's
                  garbage) is left out and counted in the summary.
  check           live mode, one call per watch cycle. Reads tab-separated
                  lines on stdin (see PROTOCOL), keeps compact per-series
                  state in $GPUGUARD_STATE_DIR/leak-state-$LEAK_INSTANCE.json,
                  appends to history/<key>.csv, prints tab-separated "event"
                  and "status" lines on stdout.
  serve           `check` for every cycle of a watcher, in one long-lived
                  process (lib/leak.sh runs it as a coprocess, so a cycle
                  pays no Python start): reads a cycle's lines up to a line
                  "E", answers "R<TAB>N<TAB>BYTES" and the N lines `check`
                  prints (BYTES long in UTF-8), or "F<TAB>2" when the cycle
                  failed (the reason on stderr).
                  The state is written each cycle exactly as by `check`, so
                  a kill -9 loses nothing, and read back only when the file
                  is no longer the one it wrote; ends at end of input.
  rules FILE      check a rules file (LEAK_RULES): nothing when it is good,
                  else "FILE:LINE: why" and exit 2 (the watcher's check at start)
  loss FILE       say whether the loss in an ms-swift logging.jsonl plateaued
  slopes          print "PID SLOPE FIRING" for every watched process tree

PROTOCOL (bash -> Python, one line per series, fields separated by tabs):
  T KEY TS PID USED_MIB FREE_MIB TOTAL_MIB CPU_PCT RSS_MIB MEMBERS NAME CMDLINE
      a watched process tree (MEMBERS: comma-separated PIDs holding GPU
      memory; a complete change of them is a restart)
  M KEY ROOT_KEY TS PID USED_MIB FREE_MIB TOTAL_MIB RANK
      one GPU-holding process of a tree that has several (RANK from its
      environment, '' when unreadable)
  J KEY JOB_JSON
      the identity of a series the watcher sees for the first time (the
      job object of lib/jobinfo.sh: masked command line, user, start,
      folder, Slurm job or container, rank), kept in history/<key>.job.json
      beside its history and put into its leak alerts as "job"
  FREE/TOTAL '' or '-' when unknown. Python -> bash (warnings, then events):
  warn MESSAGE
      a problem with an optional input (the --loss-log, the rules file),
      said once per detector process; bash logs it as a warning
  event STATE ROOT_PID JSON
  status ROOT_PID SLOPE FIRING USED SEVERITY OOM_S NAME
      SEVERITY none|info|warning|critical; OOM_S: seconds to OOM at the
      trend, '-' when not growing or unknown (bash's read merges empty
      tab-separated fields, so no field Python prints is empty).

The method (module gpuguard_leakstat, docs/LEAK.md): robust floors that
ignore empty_cache dips, level shifts subtracted (one-time jumps, eval and
RL phases), step leaks, a deceleration test (cache fills), a slow tier on
10-minute floors and a fast tier driven by the projected time to OOM. Each
process of a multi-process tree is analysed on its own as well, and an alert
names the leaking rank.
"""
import gc
import json
import math
import os
import re
import sys
import time

from gpuguard_files import write_atomic
from gpuguard_history import history_append, identity_read, identity_write
from gpuguard_leakstat import LEVELS, Series, median, params_from

# ---------------------------------------------------------------- replay --

def replay_rows(rows, params, gpu_total=None, out=None):
    """Runs the detector over (ts, pid, used[, gpu_used, gpu_total]) rows;
    returns the events (also written as JSON lines to `out`)."""
    cols = {}
    for row in rows:
        c = cols.get(row[1])
        if c is None:
            c = cols[row[1]] = ([], [], [])
        total = row[4] if len(row) > 4 and row[4] is not None else gpu_total
        gpu_used = row[3] if len(row) > 3 and row[3] is not None else row[2]
        c[0].append(row[0])
        c[1].append(row[2])
        c[2].append((total - gpu_used) if total else None)
    return _replay_columns(cols, params, out)


def _replay_columns(cols, params, out=None):
    """{pid: (timestamps, used_mib, free_mib or None)} -> events in time order."""
    series = {}
    events = []
    for pid, (tss, used, free) in cols.items():
        s = series[pid] = Series(params, str(pid), pid)
        events += s.add_many(tss, used, free)
    events.sort(key=lambda e: e["ts"])
    if out is not None:
        for ev in events:
            out.write(json.dumps(ev) + "\n")
    replay_rows.series = series
    return events


# What a replay takes as a sample. A timestamp is Unix time in seconds
# (one of milliseconds, 1.7e12, is over the bound); GPU memory is at most
# lib/smi.sh's SMI_MAX_MIB (16 TiB), as the live path reads nvidia-smi:
# above it is garbage such as 18446744073709551615 (unsigned -1).
_TS_MAX = 1e10
_MAX_MIB = 16777216


def _decode_replay(path, data):
    """The text of a replay file's bytes (a UTF-8 BOM dropped); ValueError
    naming the line of the first byte that is not UTF-8."""
    if data[:2] == b"\x1f\x8b":
        raise ValueError("%s:1: not text but gzip-compressed: gunzip it first (zcat %s > FILE.csv)"
                         % (path, path))
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError("%s:%d: not UTF-8 text (byte 0x%02x)"
                         % (path, data.count(b"\n", 0, e.start) + 1, data[e.start]))


def _read_csv_columns(path, gpu_total=None, skipped=None):
    """{pid: (timestamps, used_mib, free_mib)} of a replay CSV (free from
    the file's gpu_used_mib/gpu_total_mib, else from gpu_total, else None);
    ValueError naming the line on bad input. A row whose used memory is
    impossible (over _MAX_MIB) is left out, as the live path leaves out
    such a sample, and its line number goes into the list `skipped`."""
    import csv  # replay only: a live cycle does not pay for it
    with open(path, "rb") as f:
        text = _decode_replay(path, f.read())
    # the header alone first: a clean body is never split into lines
    head, _, body = text.partition("\n")
    first = head.splitlines()
    lines = None
    if len(first) != 1:             # another line break in the first line
        lines = text.splitlines()
        first, body = lines[:1], "\n".join(lines[1:])
    if not first or not first[0].strip():
        raise ValueError("%s: empty file (need the header timestamp,pid,used_memory_mib)" % path)
    header = [h.strip() for h in next(csv.reader([first[0]]))]
    missing = {"timestamp", "pid", "used_memory_mib"} - set(header)
    if missing:
        raise ValueError("%s: missing column(s) %s (need timestamp,pid,used_memory_mib)"
                         % (path, ",".join(sorted(missing))))
    width = len(header)
    it, ip, iu = header.index("timestamp"), header.index("pid"), header.index("used_memory_mib")
    ig = header.index("gpu_used_mib") if "gpu_used_mib" in header else None
    itot = header.index("gpu_total_mib") if "gpu_total_mib" in header else None
    quoted = '"' in text
    if not quoted:
        cols = _fast_columns(body, width, it, ip, iu, ig, itot, gpu_total)
        if cols is not None:
            return cols
    # the careful way, which names the first bad line
    if lines is None:
        lines = text.splitlines()
    cols = {}
    last_ts = None
    isfinite = math.isfinite
    for n in range(1, len(lines)):
        line = lines[n]
        if not line.strip():
            continue
        row = next(csv.reader([line])) if quoted else line.split(",")
        try:
            if len(row) != width:
                raise ValueError
            ts = float(row[it])
            pid = int(row[ip])
            mib = float(row[iu])
            if not (isfinite(ts) and isfinite(mib)) or mib < 0:
                raise ValueError
            free = None
            tot = float(row[itot]) if itot is not None and row[itot] not in ("", "-") else gpu_total
            if tot:
                gu = float(row[ig]) if ig is not None and row[ig] not in ("", "-") else mib
                free = tot - gu
        except (TypeError, ValueError):
            raise ValueError("%s:%d: not a number in %r (expected %d comma-separated numbers)"
                             % (path, n + 1, line, width))
        if not 0 <= ts < _TS_MAX:
            raise ValueError("%s:%d: timestamp %s is not Unix time in seconds" % (path, n + 1, row[it].strip()))
        if mib > _MAX_MIB:
            if skipped is not None:
                skipped.append(n + 1)
            continue
        if last_ts is not None and ts < last_ts - 1:
            raise ValueError("%s:%d: timestamp %s goes back in time" % (path, n + 1, row[it]))
        last_ts = ts
        c = cols.get(pid)
        if c is None:
            c = cols[pid] = ([], [], [])
        c[0].append(ts)
        c[1].append(mib)
        c[2].append(free)
    return cols


def _numbers(cells):
    """Numbers of a column: ints when they all are (a third faster to read
    than floats), else floats; ValueError on anything else."""
    try:
        return list(map(int, cells))
    except ValueError:
        return list(map(float, cells))


# str.splitlines' line breaks besides "\n" (and "\r\n"), as "\n"
_LINE_BREAKS = {ord(c): "\n" for c in "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}


def _fast_columns(body, width, it, ip, iu, ig, itot, gpu_total):
    """read_csv_columns for a clean file, a column at a time (a 7-day
    1-second trace is 600,000 lines): the body (the text after the header
    line) is split once, at commas and line ends together, a line end
    marked by a cell of its own, so no per-line Python work: columns are
    taken by slicing, and a line with a wrong field count shows as a data
    cell where a line-end mark should be (it would shift every column after
    it). None when anything is off: the careful reader then names the line."""
    # the lines of str.splitlines (the careful reader's), blank ones
    # dropped: every line break becomes "\n" (int() would take the others
    # for blanks around a number), runs of them one
    body = body.replace("\r\n", "\n")
    if any(chr(c) in body for c in _LINE_BREAKS):
        body = body.translate(_LINE_BREAKS)
    while "\n\n" in body:
        body = body.replace("\n\n", "\n")
    body = body.strip("\n")
    if not body:
        return {}
    n_lines = body.count("\n") + 1
    step = width + 1
    cells = (body + "\n").replace("\n", ",\n,").split(",")
    end = n_lines * step
    if len(cells) != end + 1 or set(cells[width:end:step]) != {"\n"}:
        return None
    try:
        ts, used = _numbers(cells[it:end:step]), _numbers(cells[iu:end:step])
        total = sum(ts) + sum(used)
        if not math.isfinite(total) or min(used) < 0:
            return None
        if min(ts) < 0 or max(ts) >= _TS_MAX or max(used) > _MAX_MIB:
            return None                 # the careful reader names or skips the line
        if ts != sorted(ts):
            return None                 # a step back: the careful reader decides
        if itot is not None:
            tot_cells = cells[itot:end:step]
            if "" in tot_cells or "-" in tot_cells:
                return None
            tot = list(map(float, tot_cells))
            gu = list(map(float, cells[ig:end:step])) if ig is not None else used
            free = [a - b for a, b in zip(tot, gu)]
        elif gpu_total:
            free = [gpu_total - u for u in used]
        else:
            free = [None] * len(used)
        pid_cells = cells[ip:end:step]
        distinct = set(pid_cells)
        pid_of = {c: int(c) for c in distinct}
    except ValueError:
        return None
    if len(pid_of) == 1:
        return {pid_of[pid_cells[0]]: (ts, used, free)}
    cols = {}
    for i, c in enumerate(pid_cells):
        pid = pid_of[c]
        col = cols.get(pid)
        if col is None:
            col = cols[pid] = ([], [], [])
        col[0].append(ts[i])
        col[1].append(used[i])
        col[2].append(free[i])
    return cols


def _replay(path, params, gpu_total=None, out=sys.stdout, err=sys.stderr):
    """Runs the detector over a CSV; returns the events. Prints one summary
    line on `err` even when there is no event."""
    skipped = []
    cols = _read_csv_columns(path, gpu_total, skipped)
    events = _replay_columns(cols, params, out)
    series = replay_rows.series
    n = sum(len(c[0]) for c in cols.values())
    hours = (max(c[0][-1] for c in cols.values()) - min(c[0][0] for c in cols.values())) / 3600.0 if cols else 0.0
    parts = []
    for pid, s in sorted(series.items()):
        slope = s.verdict()[0]
        fired = [e for e in events if e["pid"] == pid and e["state"] == "firing"]
        if fired:
            e = fired[0]
            parts.append("%s: leak %+.0f MiB/h (%s, %s, OOM in %s h)" % (
                pid, e["slope_mib_per_hour"], e["trend"], e["severity"],
                e["projected_oom_hours"] if e["projected_oom_hours"] is not None else "?"))
        else:
            parts.append("%s: no leak (%s, %+.0f MiB/h)" % (pid, s.last.get("trend", "too short"), slope))
    if skipped:
        # nvidia-smi's garbage in a recording: left out, and said
        parts.append("skipped %d row%s with an impossible used_memory_mib (over %d MiB; first %s:%d)" % (
            len(skipped), "" if len(skipped) == 1 else "s", _MAX_MIB, path, skipped[0]))
    err.write("gpu-leak-watch: replayed %d samples, %d series, %.1f h: %d events; %s\n" % (
        n, len(series), hours, len(events), "; ".join(parts) or "no series"))
    return events


# ----------------------------------------------------------------- rules --

_RULE_KEYS = {"threshold": float, "min_growth": float, "fast_oom_h": float, "note_h": float,
             "critical_h": float, "step_mib": float}


def load_rules(path):
    """Per-pattern settings, first match wins. A line is a regular
    expression (no spaces: use \\s) followed by "ignore", a bare threshold
    (MiB/h), or KEY=VALUE settings (threshold, min_growth, fast_oom_h,
    note_h, critical_h, step_mib)."""
    rules = []
    if not path or not os.path.exists(path):
        return rules
    import stat
    # O_NONBLOCK: a FIFO put in its place would block the open
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError("%s: not a regular file" % path)
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8").strip()
            except UnicodeDecodeError:
                raise ValueError("%s:%d: not UTF-8 text" % (path, n))
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) < 2:
                raise ValueError("%s:%d: expected 'REGEX ignore|THRESHOLD|KEY=VALUE...'" % (path, n))
            pattern = parts[0]
            try:
                rx = re.compile(pattern, re.IGNORECASE)
            except re.error as e:
                raise ValueError("%s:%d: bad regex: %s" % (path, n, e))
            if parts[1:] == ["ignore"]:
                rules.append((rx, "ignore"))
                continue
            settings = {}
            for item in parts[1:]:
                key, eq, value = item.partition("=")
                if not eq:
                    key, value = "threshold", item
                if key not in _RULE_KEYS:
                    raise ValueError("%s:%d: unknown setting %r (known: ignore, %s)"
                                     % (path, n, key, ", ".join(sorted(_RULE_KEYS))))
                try:
                    settings[key] = _RULE_KEYS[key](value)
                    if not math.isfinite(settings[key]):
                        raise ValueError
                except ValueError:
                    raise ValueError("%s:%d: %s must be a number (got %r)" % (path, n, key, value))
            rules.append((rx, settings))
    return rules


def rule_for(rules, cmdline, default=None):
    """The first matching rule's settings ("ignore" or a dict)."""
    for rx, value in rules:
        if rx.search(cmdline or ""):
            return value
    return default if default is not None else {}


# ------------------------------------------------------------------ loss --

# The longest loss-log line read (bytes); ms-swift's are under a few KiB.
_LOSS_LINE_MAX = 1 << 20


def loss_plateau(path, last=60, problems=None):
    """True when the loss stopped falling (last third vs first third of the
    recent entries improved by under 2 %), False when it still falls, None
    when unknown. A line that is not JSON, holds bytes that are not UTF-8
    or is still being written (no line end yet) is skipped; a file that
    cannot be read is None, and why goes into the list `problems` when one
    is given (the live detector warns once; the loss-log is optional input
    and must never cost an alert)."""
    import collections
    import stat
    losses = collections.deque(maxlen=last)
    try:
        # O_NONBLOCK: a FIFO with no writer would block the open for ever;
        # only a regular file is read (not a device such as /dev/zero)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise OSError("not a regular file")
            too_long = False
            while True:
                # a bounded read: a file without line ends is not read whole
                raw = f.readline(_LOSS_LINE_MAX)
                if not raw:
                    break
                if not raw.endswith(b"\n"):
                    if len(raw) < _LOSS_LINE_MAX:
                        break           # the job is still appending this line
                    too_long = True     # no log entry is that long: skipped
                    continue
                if too_long:
                    too_long = False    # the end of the long line
                    continue
                try:
                    v = json.loads(raw.decode("utf-8", "replace")).get("loss")
                    # (an integer of 400 digits does not fit a float)
                    v = float(v) if isinstance(v, (int, float)) else None
                except (ValueError, AttributeError, RecursionError, OverflowError):
                    continue
                if v is not None and math.isfinite(v):
                    losses.append(v)
    except OSError as e:
        if problems is not None:
            problems.append(e.strerror or str(e))
        return None
    losses = list(losses)
    if len(losses) < 9:
        return None
    third = len(losses) // 3
    early, late = median(losses[:third]), median(losses[-third:])
    if early <= 0:
        return None
    return (early - late) / abs(early) < 0.02


# ------------------------------------------------------------------ live --

def _num(text):
    """An int from a protocol field; None when empty, '-' or malformed."""
    try:
        return int(float(text))
    except ValueError:
        return None


class _Cycle:
    """What one live cycle works on: the settings read from the
    environment, the series and their meta (history rows, members, name,
    alerting) loaded from the state, and what the lines fed so far built."""

    def __init__(self, env):
        self.state_dir = env.get("GPUGUARD_STATE_DIR") or "."
        self.params = params_from(env)
        self.warnings = []        # "warn" lines for the watcher's log
        self.rules = self.live_rules(env.get("LEAK_RULES") or "")
        self.instance = env.get("LEAK_INSTANCE") or ""
        self.path = _state_path(self.state_dir, self.instance)
        self.max_rows = int(env.get("LEAK_HISTORY_MAX_ROWS") or 20000)
        self.loss_log = env.get("LEAK_LOSS_LOG") or ""
        self.host = env.get("GPUGUARD_HOST") or os.uname().nodename
        self.series, self.meta = _load_series(self.path, self.state_dir, self.instance, self.params)
        self.others = None        # other watchers' series (taken_over), read when needed
        self.seen = set()
        self.trees = {}           # root key -> [pid, name, settings, used, cpu, rss]
        self.statuses = []
        self.member_events = {}   # root key -> [event]

    def live_rules(self, path):
        """The rules in force this cycle. The watcher checked the file at
        start (`rules`); one edited into a bad state since, or made
        unreadable, is said once and the rules read last stay in force
        (none if none were): a rules file never stops the detector."""
        if not path:
            return []
        sig = _file_signature(path)
        known = _RULES_CACHE.get(path)
        if known is not None and sig is not None and known[0] == sig:
            return known[1]
        problem = None
        try:
            if sig is None:
                raise FileNotFoundError(2, "no such file")
            rules = load_rules(path)
        except OSError as e:
            problem = "cannot read rules file %s (%s)" % (path, e.strerror or e)
        except ValueError as e:
            problem = str(e)            # "FILE:LINE: why"
        if problem is not None:
            self.warn_once(("rules", path, sig), "%s; the rules read before stay in force" % problem)
            return known[1] if known is not None else []
        _RULES_CACHE[path] = (sig, rules)
        return rules

    def taken_over(self, key, pid, ts, own, holders):
        """The series of the same memory that another watcher kept, when it
        fed it later than this one (`own`, None when this watcher never
        did) and within _TAKEOVER_MAX_AGE_S of `ts`: the job comes to this
        watcher from another (the --all runs take a job over when the --pid
        cron line that claimed it is removed, lib/leak.sh
        leak_claimed_pids_into). Started afresh, the job's leak went unseen
        for the hours a new series needs, and one already alerted was
        alerted again: the adopted series keeps its floors and whether it is
        firing, so the incident stays one. The same memory: the same key, or
        the same GPU-holding processes (`holders`, PIDs as text): --all
        watches each process by its own key, a --pid watcher the tree it
        roots (one series per rank where several hold memory)."""
        if self.others is None:
            self.others = _other_series(self.state_dir, self.path)
        best, best_ts = None, max(_seen_ts(own.pend if own is not None else None), ts - _TAKEOVER_MAX_AGE_S)
        holders = sorted(holders)
        for k, theirs, data, meta in self.others:
            seen = _seen_ts(data.get("pend"))
            if not best_ts < seen <= ts:
                continue
            # a key names a process with its start time; the same PIDs alone
            # may be a reused PID, so that match needs the process the other
            # series names still running as it was
            if k == key or k.endswith("/" + key) or (theirs == holders and _same_process(k)):
                best, best_ts = (data, meta), seen
        if best is None:
            return None
        try:
            s = Series.from_json(self.params, best[0])
        except (KeyError, TypeError, ValueError):
            return None
        s.key, s.pid = key, pid
        if self.instance == "all":
            # what was sent of it (_tree_alerts): an alert standing is not
            # sent again. Only the --all watcher takes this: the watcher it
            # takes a job from has stopped and resolves nothing, while the
            # --all watcher that leaves a job to a specific one resolves its
            # alert as the job gone, so the specific one alerts on its own.
            m = self.meta.setdefault(key, {})
            for name in ("alerting", "paged", "paged_ts"):
                if name in best[1]:
                    m[name] = best[1][name]
        return s

    def warn_once(self, what, message):
        """Queues a warning for the watcher's log, once per `what` for the
        life of this process (the serve coprocess: once per watcher)."""
        if what in _WARNED:
            return
        _WARNED.add(what)
        # one protocol field: no tab, no line break, no control character
        self.warnings.append("warn\t%s\n" % re.sub(r"[\x00-\x1f\x7f]", "?", message))

    def loss_plateau(self):
        """loss_plateau of the --loss-log for an alert; a file that cannot
        be read is said once and the alert goes out without the verdict."""
        problems = []
        verdict = loss_plateau(self.loss_log, problems=problems)
        if problems:
            self.warn_once(("loss-log", self.loss_log),
                           "cannot read the loss log %s (--loss-log): %s; leak alerts go out without "
                           "loss_plateau" % (self.loss_log, problems[0]))
        return verdict


def check(env, stdin, stdout, keep=False):
    """One live cycle: samples in, events and status out. keep (serve):
    remember the state written, for the next cycle of this process."""
    cyc = _Cycle(env)
    lines = [line.rstrip("\n").split("\t") for line in stdin]
    # the state folder itself is the watcher's to make (mode 700, checked:
    # lib/common.sh gg_state_dir_init); a missing one fails this cycle
    if os.path.isdir(cyc.state_dir):
        os.makedirs(os.path.join(cyc.state_dir, "history"), mode=0o700, exist_ok=True)
    # trees first: members take their settings from the tree's cmdline
    for parts in sorted(lines, key=lambda p: p[0] != "T"):
        _feed_line(cyc, parts, lines)
    # warnings first: a watcher that writes no metrics stops reading at
    # the first status line
    stdout.write("".join(cyc.warnings))
    _tree_alerts(cyc, stdout)
    _forget_gone(cyc, stdout)
    # status lines after the events: a watcher that writes no metrics
    # stops reading at the first
    stdout.write("".join(cyc.statuses))
    write_atomic(cyc.path, json.dumps({"series": {k: s.to_json() for k, s in cyc.series.items()},
                                       "meta": cyc.meta}, separators=(",", ":")))
    if keep:
        _LIVE_CACHE[cyc.path] = (_file_signature(cyc.path), cyc.series, cyc.meta)


# A series this watcher has not fed for longer than this (or never) is
# looked for in the other watchers' state (_Cycle.taken_over): two missed
# samples at the default interval; a cron line every few minutes reads them
# each run, which costs a cron run little.
_TAKEOVER_GAP_S = 150
# ... and one that another watcher last fed longer ago than this is not
# taken (the detector starts a new segment after 6 h without a sample).
_TAKEOVER_MAX_AGE_S = 6 * 3600


def _other_series(state_dir, own_path):
    """(key, GPU-holding PIDs as sorted text, series JSON, meta) of every
    series the other watchers of this state folder keep (_Cycle.taken_over)."""
    out = []
    for path, state in _instance_states(state_dir):
        if path == own_path:
            continue
        meta = state.get("meta") if isinstance(state.get("meta"), dict) else {}
        for k, data in state.get("series", {}).items():
            if not isinstance(data, dict):
                continue
            sent = meta.get(k) or {}
            if "/" in k:                      # one rank of a tree
                holders = [str(data.get("pid"))]
                # the tree's alert is this rank's when the rank is firing
                sent = (meta.get(k.split("/", 1)[0]) or {}) if data.get("firing") else {}
            else:
                holders = sent.get("members") or [str(data.get("pid"))]
            out.append((k, sorted(holders), data, sent))
    return out


def _same_process(key):
    """True when the process a series key names ("PID-START", where START is
    /proc/PID/stat's start time, lib/leak.sh) still runs with that start
    time; never for a PID this namespace does not show (START 0)."""
    pid, _, start = key.split("/", 1)[0].partition("-")
    if not pid.isdigit() or start in ("", "0"):
        return False
    try:
        with open("/proc/%s/stat" % pid, "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # the fields after the command name, which may hold spaces and ")"
    fields = stat[stat.rfind(b")") + 2:].split()
    return len(fields) > 19 and fields[19] == start.encode()


def _seen_ts(pend):
    """The time of a series' last sample (its held-back one, Series.pend),
    -inf for none."""
    if isinstance(pend, list) and pend and isinstance(pend[0], (int, float)):
        return float(pend[0])
    return float("-inf")


def _load_series(path, state_dir, instance, params):
    """(series, meta) of the state: serve's own objects when the file is as
    this process wrote it last cycle, else parsed from the file."""
    cached = _LIVE_CACHE.pop(path, None)
    sig = _file_signature(path)
    if cached and (sig is None or cached[0] == sig):
        # the file is as this process wrote it last cycle: its objects
        # stand for it (no JSON to parse, a third of a cycle's CPU). A
        # file that is gone (the state folder was removed under the
        # watcher and made again: lib/common.sh gg_state_dir_recreate)
        # is written again from them, not started afresh.
        return cached[1], cached[2]
    state = _load_state(state_dir, instance)
    series = {k: Series.from_json(params, v) for k, v in state.get("series", {}).items()}
    return series, state.get("meta", {})      # meta per key: history rows, members, name


def _feed_line(cyc, parts, lines):
    """One protocol line: a "J" identity is kept; a "T" tree or "M" member
    sample goes to the history and to its series, whose event (if any) is
    kept for its tree's alert."""
    if parts[0] == "J":
        if len(parts) >= 3:
            # a tree of several ranks is one job: the ranks are its members'
            ranked = any(p[0] == "J" and len(p) > 1 and p[1].startswith(parts[1] + "/") for p in lines)
            identity_write(cyc.state_dir, parts[1], parts[2], drop_rank=ranked)
        return
    trees = cyc.trees
    if parts[0] == "T" and len(parts) >= 11:
        key, ts, pid, used, free, total, cpu, rss, members, name = parts[1:11]
        cmdline = parts[11] if len(parts) > 11 and parts[11] else name
        root_key, rank = None, None
    elif parts[0] == "M" and len(parts) >= 8:
        key, root_key, ts, pid, used, free, total = parts[1:8]
        rank = parts[8] if len(parts) > 8 and parts[8] else None
        cpu = rss = members = ""
        if root_key not in trees:
            return
        name, cmdline = trees[root_key][1], None
    else:
        return
    try:
        ts, pid, used = float(ts), int(pid), int(float(used))
    except ValueError:
        return
    free = _num(free)
    cyc.seen.add(key)
    m = cyc.meta.setdefault(key, {})
    m["pid"] = pid
    if root_key is None:
        m["name"] = name          # for the event that says the process ended
    if rank is not None:
        m["rank"] = rank
    m["rows"] = history_append(cyc.state_dir, key, ts, pid, used, free, _num(total), cyc.max_rows, m.get("rows"))
    settings = rule_for(cyc.rules, cmdline, {}) if root_key is None else trees[root_key][2]
    if root_key is None:
        trees[key] = [pid, name, settings, used, cpu, rss]
    if settings == "ignore":
        if root_key is None:
            cyc.statuses.append("status\t%d\t0\t0\t%d\tnone\t-\t%s\n" % (pid, used, name))
        return
    s = cyc.series.get(key)
    if s is None or ts - _seen_ts(s.pend) > _TAKEOVER_GAP_S:
        holders = members.split(",") if root_key is None and members else [str(pid)]
        s = cyc.series[key] = cyc.taken_over(key, pid, ts, s, holders) or s or Series(cyc.params, key, pid)
    s.p = dict(cyc.params, **settings)
    if root_key is None and members:
        new = set(members.split(","))
        old = set(m.get("members") or [])
        if old and not (old & new):
            s.restart(ts)                 # same key, new processes
        m["members"] = sorted(new)
    ev = s.add(ts, used, free)
    if ev:
        ev.update({"host": cyc.host, "name": name, "threshold_mib_per_hour": s.p["threshold"]})
        if root_key is None:
            ev.update({"cpu_pct": int(cpu) if cpu.isdigit() else None,
                       "rss_mib": int(rss) if rss.isdigit() else None})
        else:
            # one rank of a data-parallel tree: the tree is the unit
            # acted on, the rank is named
            ev.update({"pid": trees[root_key][0], "leaking_pid": pid, "rank": rank})
        if cyc.loss_log:
            ev["loss_plateau"] = cyc.loss_plateau()
        cyc.member_events.setdefault(key if root_key is None else root_key, []).append(ev)


def _ranks_rising(members):
    """How many ranks of a tree grow now: firing, or leaking at their last
    evaluation (at least the one that fired). Ranks of one job run the
    same code on alike shapes, so one rank growing while its peers stay
    flat is a leak's signature, and all of them growing in step is more
    often new data shapes; the alert says which (gpuguard_render.py)."""
    return max(1, sum(1 for s in members if s.firing or s.streak & 1))


def _tree_alerts(cyc, stdout):
    """Per watched tree: one firing or resolved event when its alerting
    changed, and its status line (the worst verdict of it and its ranks)."""
    series, meta, host = cyc.series, cyc.meta, cyc.host
    by_tree = {}
    for k, s in series.items():
        by_tree.setdefault(k.split("/", 1)[0], []).append(s)
    for key, (pid, name, settings, used, _cpu, _rss) in cyc.trees.items():
        if settings == "ignore":
            continue
        parts = by_tree.get(key, [])
        if not parts:
            continue
        m = meta[key]
        alerting = any(s.firing for s in parts)
        evs = cyc.member_events.get(key, [])
        # an alert standing on the tree goes out again only when a part's
        # escalation takes it above the level the tree was sent with
        # (a rank's escalation, or a rank firing on its own at a higher level)
        was = m.get("paged") if alerting and m.get("alerting") else None
        raised = [e for e in evs if was in LEVELS and e["state"] == "firing"
                  and LEVELS.get(e.get("severity"), 0) > LEVELS[was]]
        if alerting and (raised or not m.get("alerting")):
            # one alert per tree: a rank's when one fires (it names the
            # rank), else the tree's with its fastest-growing rank named
            fired = raised or [e for e in evs if e["state"] == "firing"] or \
                [s.event("firing") for s in parts if s.firing]
            ev = max(fired, key=lambda e: ("leaking_pid" in e, e["slope_mib_per_hour"]))
            ev.setdefault("host", host)
            ev.setdefault("name", name)
            members = [s for s in parts if s.key != key]
            if "leaking_pid" not in ev and members:
                top = max(members, key=lambda s: s.last.get("slope") or 0.0)
                ev.update({"leaking_pid": top.pid, "rank": meta.get(top.key, {}).get("rank")})
            if len(members) >= 2:
                ev["ranks_rising"] = [_ranks_rising(members), len(members)]
            if raised:
                # (the level the tree was sent with, not the rank's own)
                ev.update({"escalated_from": was, "first_alert_ts": m.get("paged_ts")})
            else:
                m["paged_ts"] = ev.get("ts")
            m["paged"] = ev.get("severity")
            _with_job(cyc.state_dir, key, ev, series)
            _emit_event(stdout, pid, ev)
        elif m.get("alerting") and not alerting:
            resolved = [e for e in evs if e["state"] == "resolved"]
            ev = resolved[0] if resolved else series[key].event("resolved")
            ev.setdefault("host", host)
            _with_job(cyc.state_dir, key, ev)
            _emit_event(stdout, pid, ev)
        m["alerting"] = alerting
        if not alerting:
            m.pop("paged", None)
            m.pop("paged_ts", None)
        # the tree's verdict: the worst of its own and its ranks'
        slope, firing, sev, oom = max((s.verdict() for s in parts), key=lambda v: (v[1], v[0]))
        cyc.statuses.append("status\t%d\t%.1f\t%d\t%d\t%s\t%s\t%s\n" % (
            pid, slope, firing, used, sev, "-" if oom is None else int(oom * 3600), name))


def _forget_gone(cyc, stdout):
    """Drops the series not seen this cycle; one that was alerting is
    resolved with reason "gone"."""
    series = cyc.series
    for key in list(cyc.meta):
        if key not in cyc.seen:
            m = cyc.meta.pop(key)
            if m.get("alerting"):
                if key in series:
                    ev = series[key].event("resolved")
                else:
                    ev = {"ts": int(time.time()), "event": "gpu_memory_leak", "state": "resolved",
                          "pid": m.get("pid")}
                ev.update({"host": cyc.host, "reason": "gone"})
                ev.setdefault("name", m.get("name"))
                _with_job(cyc.state_dir, key, ev)
                _emit_event(stdout, m.get("pid") or 0, ev)
    for key in list(series):
        if key not in cyc.seen:
            series.pop(key)


# The rules file's rules by path: (signature, rules), read again when the
# file changes (_Cycle.live_rules).
_RULES_CACHE = {}


# What this process has warned about (_Cycle.warn_once): a problem with an
# optional input is said once, not every cycle.
_WARNED = set()


# serve's memory of the state it wrote: {path: (signature, series, meta)}.
# Read back only while the file is unchanged (another writer, a restore
# or a removal changes its signature); dropped on any failed cycle.
_LIVE_CACHE = {}


def _file_signature(path):
    """(inode, size, mtime ns) of a file; None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _serve(env, stdin, stdout, err=sys.stderr):
    """`check` once per request on stdin (the module docstring's `serve`);
    returns at end of input. Every cycle writes the state as `check` does;
    the objects behind it are kept for the next cycle while the file is
    unchanged (_LIVE_CACHE), so only a file changed behind its back is read.
    Ctrl-C and SIGHUP are for the watcher, which ends the detector by
    closing its input (a detector killed mid-cycle would lose that cycle)."""
    import io
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while True:
        lines = []
        line = stdin.readline()
        while line and line != "E\n":
            lines.append(line)
            line = stdin.readline()
        if not line:
            return 0
        out = io.StringIO()
        try:
            check(env, lines, out, keep=True)
        except (OSError, ValueError) as e:
            err.write("gpu-leak-watch: %s\n" % e)
            err.flush()
            stdout.write("F\t2\n")
        else:
            # the size in bytes lets bash read the answer in one call
            # (read -N; line by line it reads a pipe a byte per system call)
            body = out.getvalue().encode("utf-8", "surrogateescape")
            stdout.flush()
            _write_bytes(stdout, b"R\t%d\t%d\n%s" % (body.count(b"\n"), len(body), body))
        stdout.flush()


def _protocol_input():
    """The watcher's lines on stdin, bytes that are not UTF-8 read as U+FFFD.
    A job's name, command line and folder arrive as the kernel keeps them
    (a GBK file name, raw bytes); decoded as the locale decodes stdin they
    became lone surrogates, which the identity file, the events and the
    answer could not encode, so the whole cycle failed and the job was never
    named. Replaced once here, nothing after this sees them."""
    import io
    return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace", newline="\n")


def _write_bytes(stdout, data):
    """Writes bytes to a text stream (its buffer when it has one)."""
    buf = getattr(stdout, "buffer", None)
    if buf is not None:
        buf.write(data)
    else:
        stdout.write(data.decode("utf-8", "surrogateescape"))


def _emit_event(stdout, pid, ev):
    # the raw command line stays out of events (it may hold tokens): the
    # job object (with_job) carries the masked one
    stdout.write("event\t%s\t%d\t%s\n" % (ev["state"], pid, json.dumps(ev)))


def _state_path(state_dir, instance=""):
    """leak-state-<instance>.json (ARCHITECTURE.md, rule 6); leak-state.json without one."""
    if instance:
        return os.path.join(state_dir, "leak-state-%s.json" % re.sub(r"[^0-9A-Za-z_.-]", "_", instance))
    return os.path.join(state_dir, "leak-state.json")


def _load_state(state_dir, instance=""):
    """{"series": {key: ...}, "meta": {...}}; empty when there is none or it
    is unreadable (an older flat file is read as its series)."""
    try:
        with open(_state_path(state_dir, instance), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    if "series" not in data:
        data = {"series": {k: v for k, v in data.items() if isinstance(v, dict) and "key" in v}}
    return data


def _instance_states(state_dir):
    """(path, state) of every watcher instance's state file, by name."""
    try:
        names = sorted(os.listdir(state_dir))
    except OSError:
        return
    for name in names:
        if name.startswith("leak-state") and name.endswith(".json"):
            inst = name[len("leak-state-"):-5] if name.startswith("leak-state-") else ""
            yield _state_path(state_dir, inst), _load_state(state_dir, inst)


def _all_states(state_dir):
    """Every instance's saved series."""
    out = {}
    for _path, state in _instance_states(state_dir):
        out.update(state.get("series", {}))
    return out


def _with_job(state_dir, key, ev, keys=()):
    """Puts the series' job into a leak event, as idle events carry theirs
    (the leaking rank's own when it was kept: `keys` are the series keys,
    a rank's is KEY/PID-START), so a digest names the job."""
    job = None
    if ev.get("leaking_pid") is not None:
        prefix = "%s/%s-" % (key, ev["leaking_pid"])
        member = next((k for k in keys if k.startswith(prefix)), None)
        job = identity_read(state_dir, member) if member else None
    job = job or identity_read(state_dir, key)
    if job is not None:
        # the identity is kept without elapsed_s (it is written once and
        # would go stale): the event's own time gives it, as idle alerts
        # carry it, so the alert says "running 3 h", not "running ?"
        ts, start = ev.get("ts"), job.get("start_ts")
        if isinstance(ts, int) and isinstance(start, int) and not isinstance(start, bool) and ts >= start:
            job["elapsed_s"] = ts - start
        ev["job"] = job


def main(argv):
    env = os.environ
    cmd = argv[1] if len(argv) > 1 else ""
    try:
        if cmd == "replay" and len(argv) >= 3:
            # a short-lived process building 10^5-10^6 small lists: the
            # cycle collector would only cost time
            gc.disable()
            gpu_total = float(env["LEAK_GPU_TOTAL_MIB"]) if env.get("LEAK_GPU_TOTAL_MIB") else None
            _replay(argv[2], params_from(env), gpu_total)
            return 0
        if cmd == "check":
            check(env, _protocol_input(), sys.stdout)
            return 0
        if cmd == "serve":
            return _serve(env, _protocol_input(), sys.stdout)
        if cmd == "slopes":
            # for gpuguard status: "PID SLOPE FIRING" per watched series
            for data in _all_states(env.get("GPUGUARD_STATE_DIR") or ".").values():
                print("%s %.0f %d" % (data.get("pid"), (data.get("last") or {}).get("slope", 0.0) or 0.0,
                                      data.get("firing", False)))
            return 0
        if cmd == "rules" and len(argv) >= 3:
            # the watcher's check at start: "FILE:LINE: why" and exit 2
            load_rules(argv[2])
            return 0
        if cmd == "loss" and len(argv) >= 3:
            print(json.dumps(loss_plateau(argv[2])))
            return 0
    except (OSError, ValueError) as e:
        print("gpu-leak-watch: %s" % e, file=sys.stderr)
        return 2
    print("usage: gpuguard_leak.py replay FILE | check | serve | rules FILE | loss FILE | slopes", file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except KeyboardInterrupt:
        # Ctrl-C: one line and 130 (128 + SIGINT, as a shell reports it),
        # never a 30-line traceback
        print("gpu-leak-watch: interrupted", file=sys.stderr)
        sys.exit(130)
