"""The leak watcher's history folder (stdlib only): the one owner of its
file formats.

- history/<key>.csv: one row per watch cycle of a series,
  `timestamp,pid,used_memory_mib,gpu_used_mib,gpu_total_mib` (HISTORY_HEADER;
  the last two are empty when unknown). The live detector (gpuguard_leak.py)
  appends with history_append; past a bounded number of rows the file is
  rotated to .csv.1. The report (gpuguard_report.py) reads with read_history.
- history/<key>.job.json: a series' identity, the job object of
  lib/jobinfo.sh (masked command line, user, start, folder, Slurm job or
  container, rank), written with identity_write and read with identity_read.

lib/common.sh's gg_retention prunes both with the rest of the state folder.
"""
import json
import os
import re

from gpuguard_files import write_atomic

HISTORY_HEADER = "timestamp,pid,used_memory_mib,gpu_used_mib,gpu_total_mib"

# The fields of a job object (lib/jobinfo.sh) kept in an identity file;
# longer strings are cut, so a file stays under a kilobyte or two.
_IDENTITY_FIELDS = ("user", "uid", "pid", "pids", "cmdline", "cwd", "start_ts", "slurm_job", "container",
                    "rank", "local_rank", "visible")
_IDENTITY_MAX_CHARS = 400


def _history_name(state_dir, key, suffix):
    """history/<key><suffix>, the key made safe for a file name."""
    return os.path.join(state_dir, "history", re.sub(r"[^0-9A-Za-z_.-]", "_", key) + suffix)


def history_append(state_dir, key, ts, pid, used, free, total, max_rows, rows=None):
    """Appends to history/<key>.csv; past max_rows rows (or 64 bytes a row:
    a file that grew behind the count's back) it is rotated to .1. `rows`
    is the count kept in the state (the file is counted only when it is
    unknown); returns the new count. One open and one write: a cycle never
    re-reads the history."""
    path = _history_name(state_dir, key, ".csv")
    gpu_used = (total - free) if total is not None and free is not None else None
    row = "%d,%d,%d,%s,%s\n" % (ts, pid, used, "" if gpu_used is None else gpu_used, "" if total is None else total)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    except FileNotFoundError:
        fd = None
    if fd is not None:
        if rows is None:
            with open(path, "rb") as f:
                rows = sum(1 for _ in f) - 1
        if rows >= max_rows or os.fstat(fd).st_size > 64 * (max_rows + 1):
            os.close(fd)
            os.replace(path, path + ".1")
            fd = None
    if fd is None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        row, rows = HISTORY_HEADER + "\n" + row, 0
    try:
        os.write(fd, row.encode())
    finally:
        os.close(fd)
    return rows + 1


class HistoryRow(tuple):
    """(timestamp, used_mib), with the GPU's figures as attributes:
    pid, gpu_used_mib, gpu_total_mib, gpu_free_mib (None when unknown)."""

    def __new__(cls, ts, used, pid=None, gpu_used=None, gpu_total=None):
        row = tuple.__new__(cls, (ts, used))
        row.pid, row.gpu_used_mib, row.gpu_total_mib = pid, gpu_used, gpu_total
        row.gpu_free_mib = (gpu_total - gpu_used) if gpu_total is not None and gpu_used is not None else None
        return row


def _num_or_none(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def read_history(folder):
    """{key: [(timestamp, used_mib), ...]} for every history file; each row
    also carries .pid, .gpu_used_mib, .gpu_total_mib and .gpu_free_mib
    (None when the file predates them). A line that is not a row (garbage
    text, NUL padding, bytes that are not UTF-8) is skipped."""
    out = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not name.endswith(".csv"):
            continue
        with open(os.path.join(folder, name), "rb") as f:
            # Lines are split here, not by the csv module: one stray quote
            # there swallowed every row after it, a long garbage line raised
            # "field larger than field limit", and a byte that is not UTF-8
            # raised UnicodeDecodeError, each a traceback from the report.
            lines = f.read().decode("utf-8-sig", "replace").split("\n")
        rows = _history_rows(lines)
        if rows:
            out[name[:-4]] = rows
    return out


def _history_rows(lines):
    """The rows of a history file's lines, its header first."""
    header = [h.strip() for h in lines[0].rstrip("\r").split(",")]
    try:
        at_ts, at_used = header.index("timestamp"), header.index("used_memory_mib")
    except ValueError:
        return []
    at = {k: header.index(k) if k in header else None for k in ("pid", "gpu_used_mib", "gpu_total_mib")}
    rows = []
    for line in lines[1:]:
        fields = line.rstrip("\r").split(",")
        try:
            ts, used = float(fields[at_ts]), float(fields[at_used])
        except (IndexError, ValueError):
            continue
        more = [_num_or_none(fields[i]) if i is not None and i < len(fields) else None for i in at.values()]
        rows.append(HistoryRow(ts, used, *more))
    return rows


def _identity_clean(job):
    """The known fields of a job object, strings cut and PID lists
    bounded; None when it is not one."""
    if not isinstance(job, dict):
        return None
    out = {}
    for k in _IDENTITY_FIELDS:
        v = job.get(k)
        if isinstance(v, str):
            v = v[:_IDENTITY_MAX_CHARS]
        elif isinstance(v, list):
            v = [x for x in v if isinstance(x, int)][:64]
        elif not (v is None or isinstance(v, (int, float, bool))):
            v = None
        out[k] = v
    return out


def identity_write(state_dir, key, text, drop_rank=False):
    """Keeps a series' identity (a "J" line's job object) in
    history/<key>.job.json, written atomically. A malformed object is
    dropped; drop_rank: the series is a tree of several ranks (its rank
    fields are unknown)."""
    try:
        job = _identity_clean(json.loads(text))
    except ValueError:
        return
    if job is not None:
        if drop_rank:
            job["rank"] = job["local_rank"] = None
        write_atomic(_history_name(state_dir, key, ".job.json"),
                     json.dumps(job, ensure_ascii=False, separators=(",", ":")) + "\n")


def identity_read(state_dir, key):
    """The job object kept for a series; None when there is none."""
    try:
        with open(_history_name(state_dir, key, ".job.json"), encoding="utf-8") as f:
            return _identity_clean(json.loads(f.read(65536)))
    except (OSError, ValueError):
        return None
