"""Long run of the alert pipeline's fault figures (issue 14's table, the
alert rows): kill -9 of flushes at random points, overlapping flushes, a
receiver slower than the timeout. Local only (127.0.0.1 sink).

Usage: python3 bench/alert_faults.py [--kills 300] [--overlaps 50]
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests")]
import gpuguard_alert as alert
import webhook_sink

HELPER = os.path.join(ROOT, "python", "gpuguard_alert.py")


def setup(**sink_kw):
    folder = tempfile.mkdtemp(prefix="gg-alert-bench.")
    os.makedirs(os.path.join(folder, "state", "outbox"))
    os.chmod(os.path.join(folder, "state"), 0o700)
    server, sink = webhook_sink.serve(quiet=True, **sink_kw)
    env = {"PATH": os.environ["PATH"], "GPUGUARD_STATE_DIR": os.path.join(folder, "state"),
           "GPUGUARD_LOG": os.path.join(folder, "log"), "NOTIFY_RETRIES": "0", "NOTIFY_RATE_PER_MIN": "100000",
           "NOTIFY_URL": f"http://127.0.0.1:{server.server_address[1]}/generic"}
    return env, server, sink


def queue(env, n):
    outbox = os.path.join(env["GPUGUARD_STATE_DIR"], "outbox")
    with open(os.path.join(outbox, f"{int(time.time() * 1e6)}-1-{n:06d}.json"), "w") as f:
        f.write(json.dumps({"ts": 1, "host": "bench", "event": "gpu_idle", "state": "firing", "gpu": n}) + "\n")


def count(sink, total):
    seen, dup_posts, copies = set(), 0, {}
    for r in sink.requests:
        ids = [e["gpu"] for e in r["body"]["events"]]
        dup_posts += any(i in seen for i in ids)
        seen.update(ids)
        for i in ids:
            copies[i] = copies.get(i, 0) + 1
    return len(sink.requests), dup_posts, len(set(range(total)) - seen), max(copies.values(), default=0)


def flush_rest(env):
    state = os.path.join(env["GPUGUARD_STATE_DIR"], "alert-state.json")
    if os.path.exists(state):
        os.remove(state)
    alert.flush(dict(env))


def kills(rounds, rng):
    env, server, sink = setup(delay=0.05)
    n = killed = 0
    for _ in range(rounds):
        for _ in range(rng.randint(1, 3)):
            queue(env, n)
            n += 1
        p = subprocess.Popen([sys.executable, "-S", HELPER, "flush"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.05, 0.6))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            killed += 1
        p.wait()
    flush_rest(env)
    posts, dups, missed, _ = count(sink, n)
    server.shutdown()
    return f"kill -9 of the flush at random points | {killed} kills, {n} events | {posts} posts, " \
           f"{dups} duplicate posts (<= {killed} allowed), {missed} missed"


def overlaps(rounds):
    env, server, sink = setup(delay=0.2)
    n = 0
    for _ in range(rounds):
        for _ in range(5):
            queue(env, n)
            n += 1
        procs = [subprocess.Popen([sys.executable, "-S", HELPER, "flush"], env=env) for _ in range(3)]
        for p in procs:
            p.wait()
    flush_rest(env)
    posts, dups, missed, worst = count(sink, n)
    server.shutdown()
    return f"3 flushes at once | {rounds} rounds, {n} events | {posts} posts, {dups} duplicate posts, " \
           f"{missed} missed, at most {worst} copies of an event"


def slow():
    env, server, sink = setup(delay=7)
    env.update(NOTIFY_TIMEOUT="1", NOTIFY_RETRIES="3")
    queue(env, 0)
    now = time.time()
    for cycle in range(4):
        alert.flush(dict(env), now=now + 600 * cycle)
    _, _, missed, worst = count(sink, 1)
    server.shutdown()
    return f"receiver answering after the timeout | 4 flushes | {worst} copies of the event, {missed} missed"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=300)
    ap.add_argument("--overlaps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1410)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    print("| fault | run | result |")
    print("|---|---|---|")
    for line in (kills(args.kills, rng), overlaps(args.overlaps), slow()):
        print("| " + line + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
