"""Corpus C (bench/leakcorpus_c.py): the same seed writes the same bytes, and
every label says what its trace shows (a leaking PID grows at the labelled
rate from the labelled start; a healthy job stops growing)."""
import csv
import json
import subprocess
import sys
from collections import defaultdict

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import leakcorpus_c as corpus

HOUR = 3600.0


def _write(out):
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "leakcorpus_c.py"), str(out), "--seeds", "1"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads((out / "manifest.json").read_text())


def _series(path):
    by = defaultdict(list)
    with open(path) as f:
        r = csv.reader(f)
        assert next(r) == ["timestamp", "pid", "used_memory_mib"]
        for ts, pid, used in r:
            by[int(pid)].append((float(ts) - corpus.T0, int(used)))
    return by


def _peak(tr, a, b):
    return max((v for t, v in tr if a <= t < b), default=None)


def test_one_seed_of_each_kind_is_written_the_same_way_twice(tmp_path):
    man = _write(tmp_path / "a")
    assert sorted(lab["kind"] for lab in man.values()) == sorted(corpus.KINDS)
    assert {lab["leak"] for lab in man.values()} == {True, False}
    # in-process generation of a few kinds gives the files' bytes again
    again = corpus.generate(str(tmp_path / "b"), 1, ["pp_stage_leak", "cron_gaps", "lora_noevict"])
    for name in again:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
        assert again[name] == man[name]


def test_labels_match_what_the_traces_show(tmp_path):
    man = _write(tmp_path)
    for name, lab in man.items():
        by = _series(tmp_path / name)
        assert lab["total_mib"] in corpus.GPUS.values(), name
        assert 12 <= lab["hours"] <= 48 and 10 <= lab["dt_s"] <= 60, name
        for pid, tr in by.items():
            assert all(b[0] > a[0] for a, b in zip(tr, tr[1:])), (name, pid)
            assert max(v for _, v in tr) <= lab["total_mib"], (name, pid)
            assert 500 <= min(v for _, v in tr), (name, pid)     # a CUDA context at least
        for pid in lab.get("pids", []):
            assert pid in by, (name, pid)
        if lab["leak"]:
            _check_leak(name, lab, by)
        else:
            _check_healthy(name, lab, by)


def _check_leak(name, lab, by):
    """The leaking PID's peak level rises at about the labelled rate after
    the labelled start (peaks over 3 h windows ride over phases and evals)."""
    assert lab["leak_pid"] in by, name
    assert 20 <= lab["rate_mib_h"] <= 500, name
    tr = by[lab["leak_pid"]]
    start, end = lab["start_s"], tr[-1][0]
    assert 0 <= start < lab["hours"] * HOUR and lab["oom_s"] > start, name
    assert end - start >= 6 * HOUR, name
    first, last = _peak(tr, start, start + 3 * HOUR), _peak(tr, end - 3 * HOUR, end + 1)
    expected = lab["rate_mib_h"] * (end - start - 3 * HOUR) / HOUR
    assert 0.5 * expected <= last - first <= 1.6 * expected, (name, last - first, expected)
    if lab["oom_in_trace"]:
        assert end < lab["oom_s"], name
    others = [p for p in by if p != lab["leak_pid"]]
    for pid in others:      # a pipeline's other stages stay where they were
        peers = by[pid]
        assert _peak(peers, end - 3 * HOUR, end + 1) - _peak(peers, start, start + 3 * HOUR) < 1024, (name, pid)


def _check_healthy(name, lab, by):
    """After its legitimate growth, a healthy process sets no new record
    of a leak's size in its last 3 hours."""
    assert "rate_mib_h" not in lab and "leak_pid" not in lab, name
    for pid, tr in by.items():
        settled = max(tr[0][0] + HOUR, lab.get("growth_end_s", 0))
        end = tr[-1][0]
        before = _peak(tr, settled, end - 3 * HOUR)
        if before is None:
            continue
        assert _peak(tr, end - 3 * HOUR, end + 1) - before < 1024, (name, pid)


def test_bad_arguments_get_one_line_and_exit_2(tmp_path):
    for args in (["--kinds", "nope"], ["--seeds", "0"], ["--score"]):
        p = subprocess.run([sys.executable, str(ROOT / "bench" / "leakcorpus_c.py"), str(tmp_path / "x")] + args,
                           capture_output=True, text=True)
        assert p.returncode == 2, args
        assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr


def test_the_score_keeps_apart_false_alerts_after_a_healthy_job_stopped_growing():
    """The goals table (bench/leak.py) says how many healthy traces were
    alerted after their legitimate growth ended (the label's growth_end_s):
    an alert while a cache still fills is told apart from one on a job
    that holds still. A trace with no growth_end_s counts from its start."""
    man = {"fill.csv": {"kind": "lora_cap", "leak": False, "hours": 24, "growth_end_s": 6 * HOUR},
           "late.csv": {"kind": "lora_cap", "leak": False, "hours": 24, "growth_end_s": 6 * HOUR},
           "flat.csv": {"kind": "moe_wander", "leak": False, "hours": 24}}
    alert = {"pid": 1, "severity": "warning"}
    alerts = {"fill.csv": [dict(alert, ts=corpus.T0 + 3 * HOUR)],
              "late.csv": [dict(alert, ts=corpus.T0 + 3 * HOUR), dict(alert, ts=corpus.T0 + 9 * HOUR)],
              "flat.csv": [dict(alert, ts=corpus.T0 + 1 * HOUR)]}
    kinds = corpus.score(man, alerts)
    assert (kinds["lora_cap"]["flagged"], kinds["lora_cap"]["flagged_late"]) == (2, 1)
    assert (kinds["moe_wander"]["flagged"], kinds["moe_wander"]["flagged_late"]) == (1, 1)
