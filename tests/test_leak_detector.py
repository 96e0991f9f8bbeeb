"""gpu-leak-watch's detector v2 on the ten phenomena of issue 12 (replayed
from bench/leakcorpus.py, a few seeds per kind), the replay CLI on the
watcher's own history and on 1-second H200-style traces, and the live
protocol (tab-separated, ranks of a data-parallel tree, instance state)."""
import importlib.util
import io
import json
import random
import subprocess
import sys
import zlib

import gpuguard_history as gg_history
import gpuguard_leak as leak
import gpuguard_leakstat as leakstat
import pytest
from conftest import ROOT, user_environ

sys.path.insert(0, str(ROOT / "bench"))
import leakcorpus as corpus

H200 = 143771


def firing(trace):
    events = leak.replay_rows(trace["rows"], leakstat.params_from({}), gpu_total=trace["total"])
    return [e for e in events if e["state"] == "firing"]


# ------------------------------------------------------- the phenomena --

@pytest.mark.parametrize("kind", corpus.HEALTHY)
def test_healthy_shapes_stay_quiet(kind):
    """empty_cache dips, eval phases, checkpoints, one-time jumps, cache
    fills, gaps, restarts, RL phases, 8 ranks, warm-ups under capacity,
    noise, 1-second loops: no alert."""
    for seed in (0, 1):
        trace = corpus.make_trace(kind, seed)
        assert firing(trace) == [], (kind, seed)


@pytest.mark.parametrize("kind", [k for k in corpus.LEAKING if k != "l_noisy"])
def test_leaks_are_caught_after_they_start_and_before_oom(kind):
    for seed in (0, 1):
        trace = corpus.make_trace(kind, seed)
        fired = firing(trace)
        assert fired, (kind, seed)
        first = fired[0]
        assert first["ts"] >= trace["t0"], (kind, seed)
        if trace["oom"] is not None:
            assert first["ts"] < trace["oom"], (kind, seed)
        if trace["pid"] is not None:
            # a data-parallel tree: the leaking rank is the one named
            assert first["pid"] == trace["pid"], (kind, seed)
        if trace["rate"] >= 50 and kind not in ("l_step", "l_rl"):
            assert first["ts"] - trace["t0"] <= 4 * 3600, (kind, seed)


@pytest.mark.parametrize("seed", [0, 7, 11])
def test_noisy_leak_is_caught_from_bucket_levels(seed):
    """A 2-20 GB process with multiplicative noise (coefficient of
    variation up to 0.5) leaking 200-300 MiB/h: its floors are the tail of
    the noise (v1 never fired on these seeds), the bucket levels show the
    growth; the alert comes after the leak starts and says it is noisy."""
    trace = corpus.make_trace("l_noisy", seed)
    fired = firing(trace)
    assert fired, seed
    assert fired[0]["ts"] >= trace["t0"]
    assert fired[0]["trend"] == "steady (noisy)"
    assert fired[0]["slope_mib_per_hour"] >= 50


def test_noisy_healthy_series_stay_quiet():
    for seed in range(2, 10):
        assert firing(corpus.make_trace("h_noisy", seed)) == [], seed


@pytest.mark.parametrize("seed", [1, 18, 30])
def test_noisy_leak_missed_by_the_rank_test_is_caught(seed):
    """100-300 MiB/h under a coefficient of variation of 0.2-0.45 on ~20
    GB: Mann-Kendall on group medians of the bucket levels never got there
    in 24 h; the least-squares slope against its standard error does,
    with the Theil-Sen rate near the truth."""
    trace = corpus.make_trace("l_noisy", seed)
    fired = firing(trace)
    assert fired, seed
    assert fired[0]["ts"] >= trace["t0"]
    assert fired[0]["trend"] == "steady (noisy)"
    assert fired[0]["slope_mib_per_hour"] == pytest.approx(trace["rate"], rel=0.6)


def test_noisy_series_that_wanders_slowly_stays_quiet():
    """A 25 % CV on top of a level that wanders (AR(1), a correlation of
    0.97 per minute, about 800 MiB wide): its bucket levels are not
    independent, and a slope test that took them as such fired on 5 of
    these 20 healthy series; the variance inflated for their
    autocorrelation keeps them quiet."""
    import random
    for seed in range(20):
        rng = random.Random(seed)
        rows, drift = [], 0.0
        for i in range(24 * 60):
            drift = 0.97 * drift + rng.gauss(0, 200)
            v = (10000 + drift) * max(0.05, 1 + rng.gauss(0, 0.25))
            rows.append((1796206508 + i * 60.0, 5, int(v) // 2 * 2))
        events = leak.replay_rows(rows, leakstat.params_from({}), gpu_total=H200)
        assert [e for e in events if e["state"] == "firing"] == [], seed


def test_new_record_lengths_are_not_a_leak():
    """A flat process that meets longer sequences now and then: +180, +160,
    +20 and +120 MiB within 3 h (read as 138 MiB/h before), then +320 and
    +1060 MiB. Few rises of unlike size are records, not blocks leaking."""
    steps = [(0.0, 34800), (3.75, 34980), (4.6, 35140), (5.75, 35160), (5.95, 35280), (6.9, 35600),
             (7.25, 36660)]
    rows = [(1796206508 + i * 60.0, 7, [lv for t, lv in steps if t <= i / 60.0][-1]) for i in range(24 * 60)]
    assert leak.replay_rows(rows, leakstat.params_from({}), gpu_total=39732) == []


def tidy_firing(kind, seed):
    """Alerts on one clean 24 h trace of bench/leak.py's tidy corpus, one
    PID throughout (a restart there keeps its PID and leaves a gap)."""
    spec = importlib.util.spec_from_file_location("tidy_bench", ROOT / "bench" / "leak.py")
    tidy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tidy)
    rng = random.Random(zlib.crc32(repr((kind, None, seed)).encode()))
    trace = tidy.base_trace(rng, tidy.CLEAN_HOURS, kind.split("@")[0])
    total = max(v for _, v in trace) + (tidy.NEAR_FULL if kind.endswith("@full") else 20 * 1024)
    rows = [(1796206200 + t, 7, v) for t, v in trace]     # bucket-aligned, as in the bench
    events = leak.replay_rows(rows, leakstat.params_from({}), gpu_total=total)
    return [e for e in events if e["state"] == "firing"]


@pytest.mark.parametrize("kind,seed", [("restart", 36), ("restart", 59), ("restart@full", 53)])
def test_restart_during_a_gap_near_the_old_level_is_a_new_segment(kind, seed):
    """A job restarted in a 9-14 minute gap under the same PID and came
    back 740 or 1120 MiB lower (under 2 % of 53-61 GB), or 240 MiB higher
    and 1 GB higher two minutes later: its warm-up was read as growth (the
    slow tier at 120-506 MiB/h; the fast tier on a GPU 3 GiB from full)."""
    assert tidy_firing(kind, seed) == []


@pytest.mark.parametrize("kind,seed", [("records", 41), ("records@full", 49)])
def test_warm_up_tail_then_new_record_lengths_is_not_a_leak(kind, seed):
    """A warm-up that outlasts the skipped half hour (its tail adds 80-400
    MiB per bucket), an hour or more still, then a few longer sequences
    (+120, +220, +160 MiB) hours later: a 6 h window over both read a
    steady 64-111 MiB/h."""
    assert tidy_firing(kind, seed) == []


def test_warm_up_with_one_record_jump_on_a_nearly_full_gpu_is_not_a_fast_leak():
    """A warm-up from the first minute 11 GB under capacity (17 GB/h,
    slowing) with one +2 GB record length 15 minutes in: the jump kept the
    second half's rate up, so the fast tier saw no deceleration."""
    assert tidy_firing("records@full", 47) == []


def test_three_alike_jumps_at_an_unsteady_pace_are_not_a_step_leak():
    """+3.8, +3.5 and +3.7 GiB one-time jumps 4.2 h and then 2.5 h apart
    (tidy mixed 29) were rated a 1122 MiB/h step leak."""
    assert tidy_firing("mixed", 29) == []


def test_step_leak_after_an_unlike_warm_up_step_is_caught_at_its_fourth_step():
    """2 GiB every 3.9 h, after a 414 MiB up-shift at the end of the
    warm-up: the run of alike steps counts without the warm-up's (before,
    the odd step hid the leak until it left the last six: 19.9 h)."""
    trace = corpus.make_trace("l_step", 100)
    first = firing(trace)[0]
    assert first["trend"] == "steps"
    assert first["ts"] - trace["t0"] < 14 * 3600
    assert first["slope_mib_per_hour"] == pytest.approx(trace["rate"], rel=0.1)


def test_live_state_round_trip_gives_the_replays_verdict():
    """The live cycle saves and loads the state every sample (packed fine
    floors appended in place, bucket levels of noisy series): the alert
    comes at the same sample as in one uninterrupted replay."""
    from gpuguard_leakstat import DEFAULTS, Series
    trace = corpus.make_trace("l_noisy", 11)
    straight, live = Series(dict(DEFAULTS), "k", 1), Series(dict(DEFAULTS), "k", 1)
    a, b = [], []
    for ts, _pid, mib in trace["rows"]:
        ev = straight.add(ts, mib, trace["total"] - mib)
        a.append(ev and (ev["state"], ev["ts"]))
        live = Series.from_json(dict(DEFAULTS), json.loads(json.dumps(live.to_json())))
        ev = live.add(ts, mib, trace["total"] - mib)
        b.append(ev and (ev["state"], ev["ts"]))
    assert any(a)
    assert a == b


def test_recorded_88_minute_fill_alerts_30_minutes_before_oom():
    for seed in range(4):
        trace = corpus.make_trace("l_fill88", seed)
        first = firing(trace)[0]
        assert trace["oom"] - first["ts"] >= 30 * 60
        assert first["severity"] == "critical" and first["tier"] == "fast"


def test_cache_fill_is_called_saturating_not_a_leak():
    rows = [(1796206508 + i * 60.0, 1, 20000 + int(12000 * (1 - 2.718 ** (-i / 90.0))) // 20 * 20)
            for i in range(12 * 60)]
    leak.replay_rows(rows, leakstat.params_from({}), gpu_total=H200)
    series = leak.replay_rows.series[1]
    assert not series.firing
    # while it still grew, the verdict said why it is no leak
    rows = rows[:150]
    assert leak.replay_rows(rows, leakstat.params_from({}), gpu_total=H200) == []


def test_alert_payload_says_rate_since_projection_confidence_and_severity():
    trace = corpus.make_trace("l_linear", 0)
    first = firing(trace)[0]
    assert first["slope_mib_per_hour"] == pytest.approx(trace["rate"], rel=0.5)
    assert trace["t0"] - 3 * 3600 <= first["since_ts"] <= first["ts"]
    assert first["projected_oom_hours"] == pytest.approx(first["free_memory_mib"] / first["slope_mib_per_hour"],
                                                         rel=0.01)
    assert 0.5 <= first["confidence"] <= 0.99
    assert first["trend"] in ("steady", "accelerating")
    # 100+ GB free at a few hundred MiB/h: days away, a trend note
    assert first["severity"] == ("info" if first["projected_oom_hours"] >= 168 else "warning")


@pytest.mark.parametrize("oom_h,severity", [(2.0, "critical"), (30.0, "warning"), (951.0, "info"), (None, "warning")])
def test_severity_follows_the_projection(oom_h, severity):
    assert leakstat.Series.__module__ == "gpuguard_leakstat"
    from gpuguard_leakstat import severity_for
    assert severity_for(oom_h, leakstat.params_from({})) == severity


# ------------------------------------------------------------ the CLI --

def run(args, env=None):
    full = user_environ(GPUGUARD_CONFIG="/dev/null")
    full.update(env or {})
    return subprocess.run([str(ROOT / "bin/gpu-leak-watch")] + args, env=full, text=True,
                          capture_output=True, timeout=120)


def write_rows(path, rows, header="timestamp,pid,used_memory_mib", bom=False):
    text = header + "\n" + "".join(",".join(str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)
                                            for x in r) + "\n" for r in rows)
    path.write_bytes(("\ufeff" if bom else "").encode() + text.encode())


def test_one_second_fast_leak_alerts_before_oom_and_loop_stays_quiet(tmp_path):
    """The integrator's H200 recordings: 1-second samples of 5-10 minutes,
    replayed with the GPU total only."""
    for kind, expect in (("l_fast1s", True), ("h_fast1s", False)):
        trace = corpus.make_trace(kind, 2)
        path = tmp_path / (kind + ".csv")
        write_rows(path, trace["rows"])
        r = run(["--replay", str(path), "--gpu-total-mib", str(H200)], env={"GPUGUARD_STATE_DIR": str(tmp_path)})
        assert r.returncode == 0, r.stderr
        events = [json.loads(line) for line in r.stdout.splitlines()]
        if expect:
            assert events and events[0]["state"] == "firing" and events[0]["ts"] < trace["oom"]
            assert events[0]["severity"] == "critical"
        else:
            assert events == []
        assert len(r.stderr.splitlines()) == 1 and "replayed %d samples" % len(trace["rows"]) in r.stderr


def test_replay_of_the_watchers_own_history_knows_the_capacity(tmp_path):
    """The history carries the GPU's used and total memory: no
    --gpu-total-mib needed, and the fast tier is in play."""
    trace = corpus.make_trace("l_fill88", 1)
    rows = [(t, pid, v, v + 3000, int(trace["total"]) + 3000) for t, pid, v in trace["rows"]]
    path = tmp_path / "1234-5678.csv"
    write_rows(path, rows, header=gg_history.HISTORY_HEADER, bom=True)
    r = run(["--replay", str(path)], env={"GPUGUARD_STATE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert events[0]["state"] == "firing" and events[0]["ts"] <= trace["oom"] - 30 * 60
    assert "1 series" in r.stderr and "leak" in r.stderr


@pytest.mark.parametrize("text,where", [
    ("timestamp,pid,used_memory_mib\n1,2,3\n4,5\n", ":3: not a number"),
    ("timestamp,pid,used_memory_mib\n1,2,3\n2,2,-4\n", ":3: not a number"),
    ("timestamp,pid,used_memory_mib\n100,2,3\n5,2,3\n", ":3: timestamp 5 goes back in time"),
    ("", "empty file"),
])
def test_malformed_replay_file_is_exit_2_with_the_line(tmp_path, text, where):
    bad = tmp_path / "bad.csv"
    bad.write_text(text)
    r = run(["--replay", str(bad)], env={"GPUGUARD_STATE_DIR": str(tmp_path)})
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert where in r.stderr and r.stdout == ""


# ----------------------------------------------------------- the live --

def check(tmp_path, lines, env=None, rules=None):
    out = io.StringIO()
    full = {"GPUGUARD_STATE_DIR": str(tmp_path), "GPUGUARD_HOST": "h"}
    if rules:
        (tmp_path / "rules").write_text(rules)
        full["LEAK_RULES"] = str(tmp_path / "rules")
    full.update(env or {})
    leak.check(full, io.StringIO("".join(lines)), out)
    return out.getvalue().splitlines()


def tree_line(ts, used, name="python3", cmd="python3 train.py", members="11,12", free=40000, total=H200):
    return "\t".join(["T", "10-99", str(ts), "10", str(used), str(free), str(total), "5", "300", members,
                      name, cmd]) + "\n"


def member_line(ts, pid, used, rank):
    return "\t".join(["M", "10-99/%d-1" % pid, "10-99", str(ts), str(pid), str(used), "40000", str(H200),
                      rank]) + "\n"


def test_names_and_command_lines_with_spaces_survive_the_protocol(tmp_path):
    out = check(tmp_path, [tree_line(1796206508, 5000, name="my trainer", cmd="python3 my script.py --x 1",
                                     members="11")])
    (status,) = out
    fields = status.split("\t")
    assert fields[0] == "status" and fields[1] == "10" and fields[-1] == "my trainer"
    assert (tmp_path / "leak-state.json").exists()


def serve_cycle(proc, lines):
    """One request to `gpuguard_leak.py serve` and its answer, read as the
    watcher reads it: the header, then exactly BYTES bytes."""
    proc.stdin.write(("".join(lines) + "E\n").encode())
    proc.stdin.flush()
    head = proc.stdout.readline().decode().split("\t")
    assert head[0] == "R", head
    body = proc.stdout.read(int(head[2]))
    assert body.count(b"\n") == int(head[1])
    return body.decode().splitlines()


def test_serve_answers_in_bytes_and_reads_a_state_changed_behind_its_back(tmp_path):
    """The watcher reads the detector's answer by its size in bytes (a
    non-ASCII name counts as its UTF-8 bytes), and the detector, which keeps
    last cycle's state in memory, notices a state file that another hand
    replaced: the series then goes on from that file, not from memory; a
    file that is gone is written again from memory."""
    env = {"GPUGUARD_STATE_DIR": str(tmp_path), "GPUGUARD_HOST": "h", "PYTHONPATH": str(ROOT / "python")}
    proc = subprocess.Popen([sys.executable, str(ROOT / "python/gpuguard_leak.py"), "serve"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        t0 = 1796206508
        state = tmp_path / "leak-state.json"
        for i in range(3):
            (status,) = serve_cycle(proc, [tree_line(t0 + 60 * i, 5000, name="训练 job", members="11")])
            assert status.split("\t")[-1] == "训练 job"
        saved = state.read_text()
        # meta.rows: the history rows the state knows of
        assert json.loads(saved)["meta"]["10-99"]["rows"] == 3
        for i in range(3, 5):
            serve_cycle(proc, [tree_line(t0 + 60 * i, 5000, name="训练 job", members="11")])
        # a restore of the older file: the next cycle builds on it
        state.write_text(saved)
        serve_cycle(proc, [tree_line(t0 + 60 * 5, 5000, name="训练 job", members="11")])
        assert json.loads(state.read_text())["meta"]["10-99"]["rows"] == 4
        # a file removed (the state folder removed under the watcher, made
        # again: lib/common.sh gg_state_dir_recreate): memory stands for it
        # and is written again, 5 rows with this cycle's (before, nothing
        # was known and the series started afresh)
        state.unlink()
        serve_cycle(proc, [tree_line(t0 + 60 * 6, 5000, name="训练 job", members="11")])
        assert json.loads(state.read_text())["meta"]["10-99"]["rows"] == 5
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=10) == 0


def test_state_file_is_named_after_the_instance(tmp_path):
    check(tmp_path, [tree_line(1796206508, 5000, members="11")], env={"LEAK_INSTANCE": "job-4242"})
    assert (tmp_path / "leak-state-job-4242.json").exists() and not (tmp_path / "leak-state.json").exists()
    r = subprocess.run([sys.executable, str(ROOT / "python/gpuguard_leak.py"), "slopes"], text=True,
                       capture_output=True, env={"GPUGUARD_STATE_DIR": str(tmp_path)})
    assert r.stdout.split() == ["10", "0", "0"]


def _ddp_events(tmp_path, leaking):
    """The alerts on a tree of 8 ranks sampled every minute for 10 hours;
    the ranks in `leaking` grow by 300 MiB/h from 2 h on, in 20 MiB blocks,
    and each rank's floor drops by 40 % for one sample in seven
    (empty_cache)."""
    t0 = 1796206508
    events = []
    for i in range(10 * 60):
        ts = t0 + 60 * i
        lines = []
        total = 0
        for r in range(8):
            used = 30000 + (300 * max(0, i - 120) // 60 // 20 * 20 if r in leaking else 0)
            if (i + r) % 7 == 0:
                used = int(used * 0.6)          # empty_cache dip
            total += used
            lines.append(member_line(ts, 11 + r, used, str(r)))
        lines.insert(0, tree_line(ts, total, members=",".join(str(11 + r) for r in range(8))))
        events += [line for line in check(tmp_path, lines) if line.startswith("event\t")]
    assert events, "no alert"
    _, state, pid, payload = events[0].split("\t", 3)
    assert state == "firing" and pid == "10"
    return t0, json.loads(payload)


def test_data_parallel_tree_names_the_leaking_rank(tmp_path):
    """8 ranks: the tree's sum hides one rank's 300 MiB/h among the others'
    empty_cache dips; each rank is analysed, and the alert names rank 5
    and says its 7 peers stay flat."""
    t0, ev = _ddp_events(tmp_path, {5})
    assert ev["pid"] == 10 and ev["leaking_pid"] == 16 and ev["rank"] == "5"
    assert ev["ts"] >= t0 + 120 * 60
    assert ev["ranks_rising"] == [1, 8]


def test_ranks_growing_in_step_are_said_to_be_in_step(tmp_path):
    """All 8 ranks grow alike (new shapes reach every rank, and so does a
    leak in the training step): the alert still comes, naming a rank, and
    says that all 8 grow in step."""
    _, ev = _ddp_events(tmp_path, set(range(8)))
    assert ev["pid"] == 10 and ev["rank"] is not None
    assert ev["ranks_rising"] == [8, 8]


def test_rules_exempt_servers_and_set_thresholds(tmp_path):
    rules = leak.load_rules(str(ROOT / "etc/leak-rules.conf"))
    assert leak.rule_for(rules, "python3 -m vllm.entrypoints.openai.api_server --model x") == "ignore"
    assert leak.rule_for(rules, "python -m sglang.launch_server") == "ignore"
    # adapters loaded on demand up to a cap climb as linearly as a leak
    # (corpus C lora_cap): a LoRA server is exempt like the others
    assert leak.rule_for(rules, "lorax-launcher --model-id mistral --adapter-source hub") == "ignore"
    assert leak.rule_for(rules, "text-generation-server serve qwen --sharded") == "ignore"
    assert leak.rule_for(rules, "/usr/bin/ollama runner --model blobs/sha256-x") == "ignore"
    assert leak.rule_for(rules, "swift sft --train_type lora --model qwen2-7b") == {}
    assert leak.rule_for(rules, "swift sft --model qwen2-72b") == {"threshold": 120.0}
    (tmp_path / "r").write_text("train\\.py threshold=80 fast_oom_h=2\nbad threshold=x\n")
    with pytest.raises(ValueError, match="r:2: threshold must be a number"):
        leak.load_rules(str(tmp_path / "r"))
    (tmp_path / "r").write_text("train\\.py threshold=80 fast_oom_h=2\n")
    assert leak.rule_for(leak.load_rules(str(tmp_path / "r")), "python3 train.py") == {"threshold": 80.0,
                                                                                       "fast_oom_h": 2.0}
    out = check(tmp_path, [tree_line(1796206508, 5000, cmd="python3 -m vllm.entrypoints.api_server")],
                rules="(?i)vllm ignore\n")
    assert out[0].split("\t")[5] == "none"


def test_a_standing_alert_is_sent_again_once_when_it_becomes_critical(tmp_path):
    """A watched job leaking 1.2 GB/h with 31 GB free, sampled every 2
    minutes: the alert goes out as a warning (OOM a day away); when the OOM
    comes within hours it goes out once more, as critical, saying it was a
    warning, and the status line and metrics say critical from then on."""
    t0, total = 1796206508, 81559
    events, status = [], None
    for i in range(int(24 * 3600 / 120)):
        used = 50000 + 1200 * i * 120 // 3600
        out = check(tmp_path, [tree_line(t0 + 120 * i, used, members="11", free=total - used, total=total)])
        events += [json.loads(line.split("\t", 3)[3]) for line in out if line.startswith("event\t")]
        status = [line for line in out if line.startswith("status\t")][-1]
    assert [(e["state"], e["severity"]) for e in events] == [("firing", "warning"), ("firing", "critical")], events
    first, page = events
    assert page["escalated_from"] == "warning" and page["first_alert_ts"] == first["ts"] and page["pid"] == 10
    assert status.split("\t")[5] == "critical"
