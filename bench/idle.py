#!/usr/bin/env python3
"""Idle watchdog bench: nvidia-smi calls and CPU per cycle for 1/8/64 GPUs,
gpuguard next to the source article's loop; RSS over 10,000 cycles with PIDs
that come and go. Run by `make bench`; prints a Markdown table."""
import contextlib
import io
import json
import os
import random
import re
import resource
import runpy
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOUBLE = os.path.join(ROOT, "tests", "fakebin", "nvidia-smi")
BENCH_DOUBLE = os.path.join(ROOT, "bench", "fakebin", "nvidia-smi")
OURS_ARGS = [
    ["--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total,power.draw,power.limit,name",
     "--format=csv,noheader,nounits"],
    ["--query-compute-apps=pid,process_name,used_memory,gpu_uuid", "--format=csv,noheader,nounits"],
]


def seed_args(n):
    args = [["--list-gpus"]]
    for i in range(n):
        args.append(["--id=%d" % i, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"])
        args.append(["--id=%d" % i, "--query-compute-apps=pid", "--format=csv,noheader"])
    return args


def scenario(n, steps, rng):
    gpus = [{"index": i, "uuid": "GPU-%08x-3a23-ca8c-52da-f8eedc850d97" % (0x21b026da + i),
             "name": "NVIDIA H200", "pci.bus_id": "00000000:%02X:00.0" % (i + 6),
             "memory.total": 143771, "power.limit": 700.0} for i in range(n)]
    out = []
    for _ in range(steps):
        g, apps = [], []
        for i in range(n):
            k = rng.randint(0, 3)
            g.append({"utilization.gpu": rng.choice([0, 3, 50, 100]), "memory.used": 3000 * k,
                      "power.draw": 80.0 + 600 * rng.random()})
            for _ in range(k):
                apps.append({"pid": rng.randint(1000, 4_000_000), "process_name": "/opt/venv/bin/python3",
                             "used_memory": 3000, "gpu": i})
        out.append({"gpus": g, "apps": apps})
    return {"gpus": gpus, "steps": out}


def render(scen, steps, arg_sets, outdir):
    """Writes the test double's answer to every argument set, per step."""
    os.makedirs(outdir, exist_ok=True)
    tmp = os.path.join(outdir, "scenario.json")
    for s in range(steps):
        with open(tmp, "w") as f:
            json.dump({"gpus": scen["gpus"], "steps": [scen["steps"][s]]}, f)
        os.environ["FAKE_SMI_SCENARIO"] = tmp
        os.makedirs(os.path.join(outdir, str(s)), exist_ok=True)
        for args in arg_sets:
            buf = io.StringIO()
            sys.argv = [DOUBLE] + args
            with contextlib.redirect_stdout(buf):
                try:
                    runpy.run_path(DOUBLE, run_name="__main__")
                except SystemExit:
                    pass
            key = re.sub(r"[^A-Za-z0-9]", "_", " ".join(args))
            with open(os.path.join(outdir, str(s), key), "w") as f:
                f.write(buf.getvalue())


NPU_DOUBLE = os.path.join(ROOT, "tests", "fakebin", "npu", "npu-smi")
# the bench double answers npu-smi too (files picked by the arguments)
NPU_BENCH_DOUBLE = os.path.join(ROOT, "bench", "fakebin", "npu", "npu-smi")


def npu_render(scen, steps, outdir):
    """The NPU double's `npu-smi info` for as many 910B chips (one a card)
    as the NVIDIA scenario has GPUs, per step the same cycle on them: the
    same utilization and the same processes, each chip with its ~3.4 GB
    firmware reserve on top, so that the two rows compare one layer with
    the other and not two random draws."""
    n = len(scen["gpus"])
    chips = [{"card": i, "chip": 0, "name": "910B3", "bus": "0000:%02X:00.0" % (i + 1), "total": 65536}
             for i in range(n)]
    for s in range(steps):
        step = scen["steps"][s]
        vals = [{"aicore": g["utilization.gpu"], "used": 3400 + g["memory.used"],
                 "power": round(90 + (g["power.draw"] - 80) * 0.25, 1), "temp": 40} for g in step["gpus"]]
        procs = [{"card": a["gpu"], "chip": 0, "pid": a["pid"], "name": "python3", "mem": a["used_memory"]}
                 for a in step["apps"]]
        path = os.path.join(outdir, "scenario.json")
        os.makedirs(os.path.join(outdir, str(s)), exist_ok=True)
        with open(path, "w") as f:
            json.dump({"layout": "910b", "version": "25.2.0", "chips": chips,
                       "steps": [{"chips": vals, "procs": procs}]}, f)
        out = subprocess.run([NPU_DOUBLE, "info"], env={"FAKE_NPU_SCENARIO": path},
                             capture_output=True, text=True, check=True).stdout
        with open(os.path.join(outdir, str(s), "info"), "w") as f:
            f.write(out)


def run_cpu(cmd, env):
    """CPU seconds (user+sys) of a command and everything it started."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit("bench command failed: %s\n%s%s" % (cmd, r.stdout, r.stderr))
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), r.stdout


def bench_env(smidir, steps, state):
    env = dict(os.environ)
    env.update({"PATH": "%s:%s" % (os.path.join(ROOT, "bench", "fakebin"), env["PATH"]),
                "BENCH_SMI_DIR": smidir, "BENCH_STEPS": str(steps), "GPUGUARD_CONFIG": "/dev/null",
                "GPUGUARD_STATE_DIR": state, "NOTIFY_URL": "", "ALERTMANAGER_URL": "",
                "GPUGUARD_LOG": os.path.join(state, "log")})
    env.pop("BENCH_SMI_LOG", None)
    return env


def double_cost(smidir, args, env, calls=200):
    """CPU seconds of one call to the bench double itself."""
    tool = env.get("NPU_SMI", "nvidia-smi")
    script = 'for ((i = 0; i < %d; i++)); do %s %s >/dev/null; done' % (
        calls, tool, " ".join("'%s'" % a for a in args))
    cpu, _ = run_cpu(["bash", "-c", script], env)
    return cpu / calls


def main():
    rng = random.Random(7)
    cycles = int(os.environ.get("BENCH_IDLE_CYCLES", "200"))
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for n in (1, 8, 64):
            steps = 5
            smidir = os.path.join(work, "smi%d" % n)
            scen = scenario(n, steps, rng)
            render(scen, steps, OURS_ARGS + seed_args(n), smidir)
            for name, cmd in (("gpuguard", ["bash", os.path.join(ROOT, "bench", "idle_bench.sh")]),
                              ("source loop", ["bash", os.path.join(ROOT, "bench", "seed_loop.sh")])):
                state = os.path.join(work, "state-%s-%d" % (name[0], n))
                env = bench_env(smidir, steps, state)
                log = os.path.join(work, "calls.log")
                env_count = dict(env, BENCH_SMI_LOG=log)
                if os.path.exists(log):
                    os.remove(log)
                run_cpu(cmd + ["10"], env_count)
                with open(log) as f:
                    calls_per_cycle = sum(1 for _ in f) / 10
                cpu, _ = run_cpu(cmd + [str(cycles)], env)
                per_call = double_cost(smidir, OURS_ARGS[0] if name == "gpuguard" else ["--list-gpus"], env)
                beyond = (cpu - per_call * calls_per_cycle * cycles) / cycles
                rows.append((n, name, calls_per_cycle, 1000 * cpu / cycles, 1000 * beyond,
                             1000 * per_call, 20.0 * calls_per_cycle))
            # the same cycle on n Ascend NPUs: one `npu-smi info` a cycle
            npudir = os.path.join(work, "npu%d" % n)
            npu_render(scen, steps, npudir)
            env = dict(bench_env(npudir, steps, os.path.join(work, "state-npu-%d" % n)),
                       GPUGUARD_DEVICE="ascend", NPU_SMI=NPU_BENCH_DOUBLE)
            log = os.path.join(work, "calls.log")
            if os.path.exists(log):
                os.remove(log)
            run_cpu(["bash", os.path.join(ROOT, "bench", "idle_bench.sh"), "10"], dict(env, BENCH_SMI_LOG=log))
            with open(log) as f:
                calls_per_cycle = sum(1 for _ in f) / 10
            cpu, _ = run_cpu(["bash", os.path.join(ROOT, "bench", "idle_bench.sh"), str(cycles)], env)
            per_call = double_cost(npudir, ["info"], env)
            beyond = (cpu - per_call * calls_per_cycle * cycles) / cycles
            rows.append((n, "gpuguard, Ascend NPUs", calls_per_cycle, 1000 * cpu / cycles, 1000 * beyond,
                         1000 * per_call, 20.0 * calls_per_cycle))
        print("## Idle watchdog: cost per cycle (%d cycles, PIDs churning)\n" % cycles)
        print("| GPUs | loop | nvidia-smi (npu-smi) calls/cycle | CPU ms/cycle (all) | CPU ms/cycle beyond nvidia-smi (npu-smi) | bench double ms/call | real nvidia-smi CPU ms/cycle at 20 ms/call (H200 recording) |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print("| %d | %s | %g | %.1f | %.1f | %.1f | %.0f |" % r)
        # RSS over many cycles with PIDs that come and go
        rss_cycles = int(os.environ.get("BENCH_RSS_CYCLES", "10000"))
        steps = 50
        smidir = os.path.join(work, "rss")
        render(scenario(8, steps, rng), steps, OURS_ARGS, smidir)
        env = bench_env(smidir, steps, os.path.join(work, "state-rss"))
        _, out = run_cpu(["bash", os.path.join(ROOT, "bench", "idle_bench.sh"), str(rss_cycles),
                          str(max(1, rss_cycles // 10))], env)
        rss = [line.split()[1:] for line in out.splitlines() if line.startswith("rss ")]
        print("\n## Idle watchdog: RSS of the watchdog shell, 8 GPUs, %d cycles, new PIDs every cycle\n" % rss_cycles)
        print("| cycle | " + " | ".join(c for c, _ in rss) + " |")
        print("|---|" + "---|" * len(rss))
        print("| RSS KiB | " + " | ".join(k for _, k in rss) + " |")
        first, last = int(rss[0][1]), int(rss[-1][1])
        print("\nRSS growth from cycle %s to %s: %+d KiB" % (rss[0][0], rss[-1][0], last - first))


if __name__ == "__main__":
    main()
