"""The counts of bench/h200/faults.sh from its folder (usable on a run still going).

Usage: faults_summary.py OUT KILLS STARTS
"""
import json
import os
import sys

out, kills, restarts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
shown = []
for line in open(os.path.join(out, "receiver.jsonl")):
    r = json.loads(line)
    if r["mode"] not in ("ok", "late") or not isinstance(r["body"], dict):
        continue
    for e in r["body"].get("events") or [r["body"]]:
        if e.get("event") == "gpu_idle":
            shown.append((e.get("uuid"), e.get("ts"), e.get("state")))
emitted = set()
for line in open(os.path.join(out, "events.jsonl")):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    if e.get("event") == "gpu_idle":
        emitted.add((e.get("uuid"), e.get("ts"), e.get("state")))
# a duplicate: the same event shown again, or a second "firing" (or
# "resolved") for a GPU before the other state came
dup, last = 0, {}
for uuid, ts, state in sorted(set(shown), key=lambda x: x[1]):
    if last.get(uuid) == state:
        dup += 1
    last[uuid] = state
dup += len(shown) - len(set(shown))
firing_open = sum(1 for s in last.values() if s == "firing")
calls = [int(l.split()[0]) for l in open(os.path.join(out, "smi-calls.txt")) if l[0].isdigit()]
print("kills", kills, "daemon starts", restarts)
print("gpu_idle events emitted", len(emitted), "shown by the receiver", len(shown), "duplicates", dup)
print("emitted but never shown", len(emitted - set(shown)), "GPUs left firing (never resolved)", firing_open)
print("nvidia-smi calls", len(calls), "max ms", max(calls or [0]),
      "secrets seen by nvidia-smi", sum(1 for l in open(os.path.join(out, "smi-calls.txt")) if "SECRET" in l))
