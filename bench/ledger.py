#!/usr/bin/env python3
"""Ledger bench: the CPU the ledger adds to a watchdog cycle at 8 GPUs, the
disk a busy 8-GPU box's ledger takes per day and month, and the daily
digest as each provider shows it. Run by `make bench`; prints Markdown."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
DAY0 = 1796169600                       # 2026-12-02 00:00 UTC
H = 3600


def base_env(state):
    return dict(os.environ, GPUGUARD_CONFIG="/dev/null", GPUGUARD_STATE_DIR=state, TZ="UTC",
                PATH=os.path.join(ROOT, "tests", "fakebin") + ":" + os.environ.get("PATH", "/usr/bin:/bin"))


def cycle_cost(work, cycles):
    out = subprocess.run(["bash", os.path.join(ROOT, "bench", "ledger_bench.sh"), str(cycles)],
                         env=base_env(os.path.join(work, "cost")), capture_output=True, text=True, check=True).stdout
    return float(out.split("cpu_ms_per_cycle ")[1].split()[0])


def busy_day_bytes(work):
    """A day of 400 jobs (8 GPUs, a new job every 3 minutes; the worst a
    shared box sees) replayed through the watchdog, as the test does."""
    state = os.path.join(work, "busy")
    os.makedirs(os.path.join(state, "ledger"), mode=0o700)
    lines = []
    for i in range(1, 471):
        entries = "\t".join(f"GPU-{g}|{g}|{i % 2}|user{i % 7}|slurm:{100000 + i * 8 + g // 4}" for g in range(8))
        lines.append(f"c\t{i}\t{DAY0 + 180 * i}\t180\t{entries}\t.")
    with open(os.path.join(state, "ledger", "journal"), "w") as f:
        f.write("\n".join(lines) + "\n")
    scen = os.path.join(work, "scenario.json")
    with open(scen, "w") as f:
        json.dump({"gpus": [{"index": 0, "uuid": "GPU-x", "name": "NVIDIA H200", "pci.bus_id": "0:6.0",
                             "memory.total": 143771, "power.limit": 700.0}],
                   "steps": [{"gpus": [{"utilization.gpu": 0, "memory.used": 0, "power.draw": 70}], "apps": []}]}, f)
    env = dict(base_env(state), FAKE_SMI_SCENARIO=scen, CHECK_INTERVAL="180", GPUGUARD_NOW=str(DAY0 + 86000))
    subprocess.run([os.path.join(ROOT, "bin", "yichuidingyin.sh"), "--once"], env=env, check=True,
                   capture_output=True)
    with open(os.path.join(state, "ledger", "2026-12-02.tsv"), encoding="utf-8") as f:
        text = f.read()
    # the worst case: every row with a 32-character user and a full
    # (LEDGER_CMD_MAX, 100 characters) command line
    worst = 0
    for line in text.splitlines(keepends=True):
        f = line.rstrip("\n").split("\t")
        if f[0] == "job":
            f[1], f[9] = "u" * 32, "c" * 100
            line = "\t".join(f) + "\n"
        worst += len(line.encode())
    return len(text.encode()), worst


DAY_FILE = """# gpuguard ledger 1
day\t2026-12-02
last\t{last}\t61
job\talice\t1001\tpid:48211@1796198400\t18000\t7200\t7200\t{a_end}\t0\tpython train_llama.py --model llama-3-8b --lr 2e-5
job\tbob\t1002\tslurm:4242\t28800\t7200\t5400\t{b_end}\t1\ttorchrun --nproc-per-node 1 sft.py --config qwen2-7b.yaml
job\tbob\t1002\tpid:51877@1796223600\t3600\t3600\t3600\t{c_end}\t0\tpython eval.py --ckpt out/step-1200
"""


def examples(work):
    import gpuguard_ledger
    import gpuguard_render
    folder = os.path.join(work, "ex", "ledger")
    os.makedirs(folder)
    with open(os.path.join(folder, "2026-12-02.tsv"), "w") as f:
        f.write(DAY_FILE.format(last=DAY0 + 18 * H, a_end=DAY0 + 12 * H, b_end=DAY0 + 15 * H + 1800,
                                c_end=DAY0 + 16 * H))
    env = {"GPUGUARD_STATE_DIR": os.path.join(work, "ex"), "GPU_HOUR_PRICE": "20", "GPU_PRICE_CURRENCY": "¥",
           "GPUGUARD_HOST": "lab-8gpu", "LEDGER_NAMES": "user"}
    event = gpuguard_ledger.digest_event("2026-12-02", DAY0 + 33 * H, env)
    out = []
    for provider in ("dingtalk", "feishu", "wecom", "slack"):
        lang = gpuguard_render.PROVIDER_LANG[provider]
        title, sections = gpuguard_render.render_digest([event], lang, env)
        out.append((provider, gpuguard_render._chat_text(provider, title, sections, [])))
    return out


def main():
    cycles = int(os.environ.get("BENCH_LEDGER_CYCLES", "1000"))
    with tempfile.TemporaryDirectory() as work:
        cost = cycle_cost(work, cycles)
        day, worst = busy_day_bytes(work)
        print("## Ledger: cost per watchdog cycle and disk (%d cycles, 8 GPUs held by 8 jobs)\n" % cycles)
        print("| what | figure | bound |")
        print("|---|---|---|")
        print("| CPU added to a cycle (ledger_cycle, day file saved every 20 cycles) | %.2f ms | 2 ms |" % cost)
        print("| day file of a busy day (470 jobs on 8 GPUs, 120-row cap) | %.1f KB | - |" % (day / 1000))
        print("| a month of such days | %.2f MB | 1 MB |" % (31 * day / 1e6))
        print("| the same day, every row with a 32-character user and a 100-character command line | %.1f KB | - |"
              % (worst / 1000))
        print("| a month of those | %.2f MB | 1 MB |" % (31 * worst / 1e6))
        print("\n## Ledger: the daily digest as each provider shows it (2 users, 14 GPU-hours held, 5 idle)\n")
        for provider, text in examples(work):
            print("### %s\n\n```\n%s\n```\n" % (provider, text))


if __name__ == "__main__":
    main()
