#!/usr/bin/env python3
"""Records five PyTorch habits on one GPU, each in its own process, as the
leak watcher sees them: one CSV per habit (timestamp,pid,used_memory_mib,
the replay format) and manifest.json with the labels of bench/leakcorpus_c.py
(leak, start_s, rate_mib_h, leak_pid, total_mib...), so
../shared/leak-corpus-b/score.py and `bench/leakcorpus_c.py --score` read it.

  python3 bench/h200/leak_habits.py --out $OUT [--minutes 4] [--stretch 60]
  python3 bench/h200/leak_habits.py --out DIR --dry-run --minutes 1   (CPU)

The habits, each a child process training the same small model (LayerNorm
and Linear blocks in bf16 autocast, random data, about 2-4 GiB each):
  a eval_graph   leaking: evaluation without torch.no_grad() that sums
                 `val += loss` and keeps `history.append(val / n)`: the
                 graph of every evaluation batch stays alive
  b eval_item    healthy twin: `val += loss.item()`
  c metrics_list leaking slowly: `losses.append(loss)` and the per-token
                 losses appended each step without .item()/.detach()
  d ckpt_cache   healthy: checkpoints copy the state to the CPU, evaluation
                 under no_grad, torch.cuda.empty_cache() after both and
                 every 200 steps
  e dyn_shapes   healthy: sequence lengths drawn at random each step, now
                 and then a new longest one
  f frag_churn   healthy: beside training, buffers of random sizes kept for
                 random lifetimes (a prefetch queue): the pool fragments
                 and creeps with nothing leaked
  g adapter_lru  healthy: LoRA adapters (40-160 MiB) loaded at random
                 times, the least recently used evicted past 12
  h adapter_noevict  leaking twin of g: never evicted (the leak starts
                 when the cap is passed)
  i flush_cap    healthy: a memory cap (set_per_process_memory_fraction)
                 4 GiB above the pool after the first steps, and gathers
                 of 64-512 MiB kept for 1-8 steps (3 GiB live at most): the fragmented pool
                 climbs to the cap, where cudaMalloc fails and the
                 allocator frees its cached blocks and retries (a ZeRO-3
                 job run near the GPU's limit); the child notes each flush
  j flush_leak   leaking twin of i: the same gathers under the same cap,
                 and a 2 MiB tensor kept every LEAK_EVERY steps (a debug
                 hook's output appended to a list): the flushes give the
                 cache back, never the leak, so each comes back higher
Time is stretched: a second of the run is --stretch seconds of the job
(default 60: a 4-minute run reads as 4 hours), as the timestamps say
(T0 = 1796200000 + stretched seconds since the start).  The rate of a leak
is measured inside the child (torch.cuda.memory_allocated), not taken from
the curve the detector reads.

The sampler reads each child's used memory once a second from NVML
(nvidia-ml-py), or from nvidia-smi through lib/smi.sh when NVML is missing,
or, with --dry-run, the children's resident memory from /proc (CPU run).
At most 8 files go to --out: one CSV per habit (--habits picks up to six),
manifest.json, log.txt.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
T0 = 1796200000.0
MIB = 1 << 20
HABITS = {
    "a": ("eval_graph", True, "evaluation without no_grad, val += loss, history.append(val / n)"),
    "b": ("eval_item", False, "evaluation without no_grad, val += loss.item()"),
    "c": ("metrics_list", True, "losses.append(loss) and per-token losses appended on the GPU each step"),
    "d": ("ckpt_cache", False, "checkpoint copies to CPU, no_grad evaluation, empty_cache() after them"),
    "e": ("dyn_shapes", False, "random sequence lengths, a new longest one now and then"),
    "f": ("frag_churn", False, "buffers of random sizes kept for random lifetimes beside training: the pool fragments"),
    "g": ("adapter_lru", False, "adapters loaded at random times, the least recently used evicted past 12"),
    "h": ("adapter_noevict", True, "adapters loaded at random times, never evicted"),
    "i": ("flush_cap", False, "gathers of random sizes under a memory cap: the allocator flushes its cache when it fails"),
    "j": ("flush_leak", True, "the gathers of i under the same cap, and a 2 MiB tensor kept every few steps"),
}
FLUSH_HEADROOM = 4 << 30   # i: the cap, this far above the pool after the first steps
GATHERS_LIVE = 3 << 30     # i: at most this much gathered at once (the oldest dropped first), so
                           # the training step always fits under the cap once the cache is flushed
LEAK_EVERY = 4             # j: a 2 MiB tensor kept every this many steps (at 15 steps a second and
                           # --stretch 120: about 225 MiB an hour of the job's time, 2.6 GB a run)
ADAPTER_CAP = 12        # adapters kept by g (h keeps every one)
ADAPTERS_PER_H = 3.0    # new adapters an hour of the job's (stretched) time
STARTUP_S = 40          # CUDA init and the model's first steps, inside --minutes
SMALL = {"width": 128, "tokens": 1024, "pace": 10.0}       # --dry-run on a CPU
FULL = {"width": 1024, "tokens": 32768, "pace": 15.0}


# --------------------------------------------------------------- child --

def _child(habit, seconds, device, events_path, size, stretch=60.0):
    """One habit's training loop for `seconds`; appends its events (JSON
    lines: evaluations, checkpoints, allocated memory) to events_path."""
    import torch
    torch.manual_seed(ord(habit))
    rnd = random.Random(ord(habit))
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    width, tokens, pace = size["width"], size["tokens"], size["pace"]
    blocks = []
    for _ in range(4):
        blocks += [torch.nn.LayerNorm(width), torch.nn.Linear(width, 2 * width), torch.nn.GELU(),
                   torch.nn.Linear(2 * width, width)]
    model = torch.nn.Sequential(*blocks).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    state = {"history": [], "losses": [], "token_losses": [], "max_seq": 512, "evals": 0}

    def note(event, **kw):
        kw.update(t=time.time(), event=event)
        if cuda:
            kw.update(allocated_mib=round(torch.cuda.memory_allocated() / MIB, 1),
                      reserved_mib=round(torch.cuda.memory_reserved() / MIB, 1))
        with open(events_path, "a") as f:
            f.write(json.dumps(kw) + "\n")

    def forward(n_tokens, seq):
        x = torch.randn(max(1, n_tokens // seq), seq, width, device=dev)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=cuda):
            out = model(x)
        return ((out.float() - x) ** 2).mean(-1)       # per-token loss, (batch, seq)

    note("start", pid=os.getpid())
    start = time.time()
    next_eval, next_ckpt, step = start + 30, start + 40, 0
    side = _SideMemory(habit, rnd, torch, dev, note, stretch, start)
    while time.time() < start + seconds:
        seq = _seq_len(habit, rnd, state)
        loss_tok = forward(16 * seq if habit == "e" else tokens, seq)   # e: 16 rows of any length
        loss = loss_tok.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if habit == "c":
            state["losses"].append(loss)            # the habit: no .item(), no .detach()
            state["token_losses"].append(loss_tok)
        elif step % 50 == 0:
            loss.item()                             # logging as it should be
        step += 1
        if step == 1:
            note("first_step", leaked_mib=0)
        now = time.time()
        if now >= next_eval and habit in "abd":
            _evaluate(habit, forward, state, torch, note)
            next_eval = now + 30
        if habit == "d" and (now >= next_ckpt or step % 200 == 0):
            if now >= next_ckpt:
                _checkpoint(model, opt)
                next_ckpt = now + 40
                note("checkpoint")
            if cuda:
                torch.cuda.empty_cache()
        side.step(now)
        if step % 100 == 0:
            note("steps", step=step, leaked_mib=side.leaked_mib())
        _pace(start, step, pace)
    note("end", step=step, leaked_mib=side.leaked_mib())


class _SideMemory:
    """What f, g and h keep beside the training step.

    f: each step allocates a buffer of a random size (1-96 MiB, a long
    tail) and keeps it for a random number of steps (a prefetch queue, a
    rolling KV or feature cache): the caching allocator splits its
    segments around the long-lived ones and maps new segments for large
    requests that no free block fits, so the pool creeps with nothing
    leaked; the creep should slow as the pool holds free blocks of every
    size. g and h: adapters (LoRA weights of 40, 80 or 160 MiB) arrive at
    random times, ADAPTERS_PER_H an hour of the job's time, after a hot
    set of 4 at the start; g evicts the least recently used past
    ADAPTER_CAP (the freed block serves the next adapter of its size), h
    never evicts: the leak starts when the cap is passed."""

    def __init__(self, habit, rnd, torch, dev, note, stretch, start):
        self.habit, self.rnd, self.torch, self.dev, self.note = habit, rnd, torch, dev, note
        self.keep, self.adapters, self.loaded, self.passed, self.leaked = [], [], 0, False, []
        self.next_load = start
        self.per_s = ADAPTERS_PER_H * stretch / 3600.0      # adapters a wall second
        self.hot = 4
        self.steps = 0          # j: steps seen, for LEAK_EVERY

    def step(self, now):
        if self.habit == "f":
            self._churn()
        elif self.habit in "ij":
            self._gather()
            if self.habit == "j":
                self._leak()
        elif self.habit in "gh":
            while now >= self.next_load:
                self._load()
                gap = 1.0 if self.hot > 0 else self.rnd.expovariate(self.per_s)
                self.hot -= 1
                self.next_load += gap

    def _churn(self):
        mib = min(96.0, self.rnd.lognormvariate(1.5, 1.0))
        n = int(mib * MIB // 2)
        self.keep.append((self.rnd.randint(1, 60), self.torch.empty(n, dtype=self.torch.bfloat16, device=self.dev)))
        self.keep = [(left - 1, t) for left, t in self.keep if left > 1]

    def _gather(self):
        """i: a gather of a random size kept for a few steps, under a cap
        set at the first call; notes when the allocator has flushed (its
        num_alloc_retries count grows) or could not serve a gather."""
        torch = self.torch
        cuda = self.dev.type == "cuda"
        if cuda and not self.keep and not getattr(self, "cap", None):
            total = torch.cuda.get_device_properties(self.dev).total_memory
            self.cap = torch.cuda.memory_reserved(self.dev) + FLUSH_HEADROOM
            torch.cuda.set_per_process_memory_fraction(min(1.0, self.cap / total), self.dev)
            self.retries = 0
            self.note("cap", cap_mib=round(self.cap / MIB))
        mib = self.rnd.randrange(64, 513, 32)
        try:
            t = torch.empty(int(mib * MIB // 2), dtype=torch.bfloat16, device=self.dev)
        except torch.cuda.OutOfMemoryError:
            self.keep = []
            self.note("gather_failed", mib=mib)
            return
        self.keep.append((self.rnd.randint(1, 8), t))
        self.keep = [(left - 1, x) for left, x in self.keep if left > 1]
        while sum(x.numel() * 2 for _, x in self.keep) > GATHERS_LIVE:
            del self.keep[0]
        if cuda:
            retries = torch.cuda.memory_stats(self.dev).get("num_alloc_retries", 0)
            if retries > self.retries:
                self.retries = retries
                self.note("flush", retries=retries)

    def _leak(self):
        """j: every LEAK_EVERY steps a 2 MiB tensor is kept for good."""
        self.steps += 1
        if self.steps % LEAK_EVERY == 0:
            self.leaked.append(self.torch.empty(MIB, dtype=self.torch.bfloat16, device=self.dev))

    def leaked_mib(self):
        return 2 * len(self.leaked)

    def _load(self):
        mib = self.rnd.choice([40, 80, 80, 160])
        self.adapters.append(self.torch.ones(int(mib * MIB // 2), dtype=self.torch.bfloat16, device=self.dev))
        self.loaded += 1
        if len(self.adapters) > ADAPTER_CAP:
            if self.habit == "g":
                del self.adapters[0]
            elif not self.passed:
                self.passed = True
                self.note("cap_passed", loaded=self.loaded)
        self.note("adapter", loaded=self.loaded, held=len(self.adapters), mib=mib)


def _seq_len(habit, rnd, state):
    """The sequence length of one step: fixed, or for dyn_shapes drawn from
    a long tail (a new longest one now and then, up to 4096)."""
    if habit != "e":
        return 512
    seq = min(4096, int(rnd.lognormvariate(6.2, 0.6)) + 64)
    state["max_seq"] = max(state["max_seq"], seq)
    return seq


def _evaluate(habit, forward, state, torch, note):
    """An evaluation of 4 batches: without no_grad for habits a and b (the
    graph is built), under no_grad for d."""
    val = 0.0
    n = 4
    if habit == "d":
        with torch.no_grad():
            for _ in range(n):
                val += forward(4096, 512).mean().item()
    else:
        for _ in range(n):
            loss = forward(512, 512).mean()
            if habit == "a":
                val += loss                         # the habit: keeps each batch's graph
            else:
                val += loss.item()
        if habit == "a":
            state["history"].append(val / n)        # ...and keeps the sum after the evaluation
    state["evals"] += 1
    note("eval", n=state["evals"])


def _checkpoint(model, opt):
    """A checkpoint as jobs write it: the state copied to the CPU."""
    cpu = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    for group in opt.state.values():
        for k, v in group.items():
            if hasattr(v, "to"):
                cpu["opt." + k + str(len(cpu))] = v.detach().to("cpu", copy=True)
    return len(cpu)


def _pace(start, step, pace):
    """Steps at a fixed pace, so the five processes share the GPU evenly and
    a leak per step is a leak per second."""
    ahead = start + step / pace - time.time()
    if ahead > 0:
        time.sleep(ahead)


# ------------------------------------------------------------ samplers --

class NvmlSampler:
    """Per-process used memory of one GPU from NVML."""

    def __init__(self, index=0):
        import pynvml
        self.nv = pynvml
        try:
            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.total_mib = pynvml.nvmlDeviceGetMemoryInfo(self.handle).total // MIB
            name = pynvml.nvmlDeviceGetName(self.handle)
        except pynvml.NVMLError as e:
            raise RuntimeError("NVML: %s" % e) from None
        self.name = name.decode() if isinstance(name, bytes) else name

    def sample(self, pids):
        out = {}
        try:
            procs = self.nv.nvmlDeviceGetComputeRunningProcesses(self.handle)
        except self.nv.NVMLError as e:
            raise RuntimeError("NVML: %s" % e) from None
        for p in procs:
            if p.usedGpuMemory is not None:
                out[p.pid] = p.usedGpuMemory // MIB
        return out


class SmiSampler:
    """Per-process used memory from nvidia-smi, run through lib/smi.sh (the
    project's one nvidia-smi caller, with its timeout)."""

    def __init__(self, index=0):
        self.index = index
        lines = self._run("--query-gpu=memory.total,name", "-i", str(index)).splitlines()
        total, _, name = lines[0].partition(",") if lines else ("", "", "")
        if not total.strip().isdigit():
            raise RuntimeError("nvidia-smi did not answer: %s" % (lines[:1] or ["no output"])[0])
        self.total_mib, self.name = int(total), name.strip()

    def _run(self, *args):
        script = ('source "$1/lib/common.sh"; source "$1/lib/smi.sh"; shift; '
                  'smi_run "$@" --format=csv,noheader,nounits')
        try:
            p = subprocess.run(["bash", "-c", script, "sh", ROOT] + list(args), capture_output=True, text=True,
                               timeout=30)
        except (OSError, subprocess.SubprocessError):
            return ""
        return p.stdout if p.returncode == 0 else ""

    def sample(self, pids):
        out = {}
        for line in self._run("--query-compute-apps=pid,used_memory", "-i", str(self.index)).splitlines():
            pid, _, used = line.partition(",")
            if pid.strip().isdigit() and used.strip().isdigit():
                out[int(pid)] = int(used)
        return out


class ProcSampler:
    """--dry-run: each child's resident memory from /proc, in MiB, as a
    stand-in for GPU memory (exercises every path but the GPU's)."""

    total_mib, name = 143771, "dry-run (resident memory of CPU processes)"

    def sample(self, pids):
        out = {}
        for pid in pids:
            try:
                with open("/proc/%d/status" % pid) as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            out[pid] = int(line.split()[1]) // 1024
            except OSError:
                continue
        return out


def make_sampler(kind):
    if kind == "proc":
        return ProcSampler()
    if kind == "nvml":
        return NvmlSampler()
    if kind == "smi":
        return SmiSampler()
    try:
        return NvmlSampler()
    except (ImportError, RuntimeError):     # no nvidia-ml-py, or NVML refuses: nvidia-smi instead
        return SmiSampler()


# -------------------------------------------------------------- parent --

def _start_children(habits, seconds, device, work, size_name, stretch):
    kids = {}
    for h in habits:
        events = os.path.join(work, h + ".jsonl")
        log = open(os.path.join(work, h + ".log"), "w")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", h, "--seconds", str(seconds),
               "--device", device, "--events", events, "--size", size_name, "--stretch", str(stretch)]
        kids[h] = {"proc": subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), "events": events,
                   "log": log, "rows": []}
        time.sleep(1.0)         # staggered: the PIDs appear in the order of the habits
    return kids


def _record(kids, sampler, start, deadline, stretch, before):
    """Samples every second until the children end or the deadline.
    before: the GPU's PIDs before the run."""
    pids = {k["proc"].pid: h for h, k in kids.items()}
    strangers = []          # PIDs the children do not have: another PID namespace?
    while time.time() < deadline and any(k["proc"].poll() is None for k in kids.values()):
        tick = time.time()
        try:
            seen = sampler.sample(list(pids))
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:  # a lost sample, not the end
            seen = {}
            print("sample failed: %s" % e, file=sys.stderr)
        strangers += [p for p in seen if p not in pids and p not in strangers and p not in before]
        if tick - start > 60 and not any(k["rows"] for k in kids.values()) and len(strangers) == len(kids):
            # the GPU reports PIDs of another namespace: the children started
            # a second apart, so their GPU processes appeared in that order
            print("PIDs differ from the children's (namespace?): mapped by order %s" % strangers, file=sys.stderr)
            pids = dict(zip(strangers, kids))
        ts = T0 + (tick - start) * stretch
        for pid, used in seen.items():
            if pid in pids:
                kids[pids[pid]]["rows"].append((ts, pid, used))
        time.sleep(max(0.0, 1.0 - (time.time() - tick)))


def _stop(kids):
    """Stops the children still running (ours, by PID), and waits for them."""
    for k in kids.values():
        if k["proc"].poll() is None:
            k["proc"].terminate()
    for k in kids.values():
        try:
            k["proc"].wait(timeout=10)
        except subprocess.TimeoutExpired:
            k["proc"].kill()
            k["proc"].wait()
        k["log"].close()


def _events(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def _label(h, kid, start, stretch, sampler, device):
    """The manifest entry of one habit: the leak's start and its rate from
    the child's own allocated-memory notes, in stretched time."""
    name, leak, what = HABITS[h]
    ev = _events(kid["events"])
    pid = kid["rows"][0][1] if kid["rows"] else kid["proc"].pid     # as the GPU reports it
    hours = (kid["rows"][-1][0] - T0) / 3600 if kid["rows"] else 0.0
    lab = {"kind": name, "habit": h, "what": what, "leak": leak, "pid": pid, "pids": [pid],
           "total_mib": int(sampler.total_mib), "gpu": sampler.name, "stretch": stretch, "dt_s": stretch,
           "hours": round(hours, 2), "device": device, "samples": len(kid["rows"]),
           "exit": kid["proc"].returncode, "recorded_unix_start": round(start, 1)}
    # the leak starts at the first evaluation (a) or the first step (c); its
    # rate is what the child had allocated from then to its last note
    marks = {"a": ("eval",), "h": ("cap_passed", "adapter")}.get(h, ("first_step", "steps", "end"))
    # (h: from the load that passed the cap to the last load)
    first = next((e for e in ev if e["event"] in marks[:1 if h == "h" else None]), None)
    last = next((e for e in reversed(ev) if e["event"] in marks), None)
    if leak:        # from the first evaluation (a) or the first steps (c); else the first sample
        begin = first["t"] if first else start + ((kid["rows"][0][0] - T0) / stretch if kid["rows"] else 0)
        lab.update(start_s=round((begin - start) * stretch, 1), leak_pid=pid)
    key = "leaked_mib" if h == "j" else "allocated_mib"    # (j: its gathers move what is allocated)
    if leak and first and last and last["t"] > first["t"] and key in first and key in last:
        grown = last[key] - first[key]
        lab["rate_mib_h"] = round(grown / ((last["t"] - first["t"]) * stretch / 3600), 1)
    lab["evals"] = sum(1 for e in ev if e["event"] == "eval")
    lab["flushes"] = sum(1 for e in ev if e["event"] == "flush")
    lab["steps"] = max([e.get("step", 0) for e in ev] or [0])
    return lab


def _write_out(out, kids, start, stretch, sampler, device):
    manifest = {}
    for h, kid in kids.items():
        name = "habit_%s_%s.csv" % (h, HABITS[h][0])
        with open(os.path.join(out, name), "w") as f:
            f.write("timestamp,pid,used_memory_mib\n")
            f.writelines("%.3f,%d,%d\n" % (ts, pid, used) for ts, pid, used in kid["rows"])
        manifest[name] = _label(h, kid, start, stretch, sampler, device)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    return manifest


def _report(out, manifest, kids, work):
    """log.txt: each child's own output, then one line per habit (printed too)."""
    lines = []
    for name, lab in sorted(manifest.items()):
        kid = kids[lab["habit"]]
        used = [r[2] for r in kid["rows"]]
        lines.append("%-26s pid %-7d %s samples %4d  used %s -> %s MiB (max %s)  evals %d steps %d  %s" % (
            name, lab["pid"], "LEAK" if lab["leak"] else "ok  ", lab["samples"], used[0] if used else "-",
            used[-1] if used else "-", max(used) if used else "-", lab["evals"], lab["steps"],
            ("measured %s MiB/h from %.0f s" % (lab.get("rate_mib_h", "?"), lab.get("start_s", 0)))
            if lab["leak"] else ""))
    with open(os.path.join(out, "log.txt"), "w") as f:
        for h in kids:
            with open(os.path.join(work, h + ".log")) as child:
                f.write("== child %s\n%s" % (h, child.read()[-4000:]))
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def run(a):
    sampler = make_sampler("proc" if a.dry_run else a.sampler)
    device = "cpu" if a.dry_run else a.device
    seconds = max(20, a.minutes * 60 - STARTUP_S)
    work = tempfile.mkdtemp(prefix="leak-habits-")
    try:
        start = time.time()
        deadline = start + a.minutes * 60 - 15
        before = set(sampler.sample([]))
        kids = _start_children(a.habits, seconds, device, work, "small" if a.dry_run else "full", a.stretch)
        try:
            _record(kids, sampler, start, deadline, a.stretch, before)
        finally:
            _stop(kids)
        manifest = _write_out(a.out, kids, start, a.stretch, sampler, device)
        _report(a.out, manifest, kids, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    bad = [n for n, lab in manifest.items() if lab["samples"] < 10 or lab["exit"] not in (0, -15)]
    if bad:
        print("leak_habits.py: too few samples or a failed child: %s (see log.txt)" % ", ".join(bad),
              file=sys.stderr)
        return 1
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description="record PyTorch memory habits, one process each, on GPU 0")
    ap.add_argument("--out", help="the output directory ($OUT)")
    ap.add_argument("--minutes", type=float, default=4.0, help="wall-clock length of the whole run (default 4)")
    ap.add_argument("--stretch", type=float, default=60.0, help="job seconds per wall second (default 60)")
    ap.add_argument("--habits", default="abcde", help="which habits, letters of abcdefghij (default abcde)")
    ap.add_argument("--sampler", default="auto", choices=["auto", "nvml", "smi"])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--dry-run", action="store_true", help="on the CPU, resident memory as the sampler")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--events", help=argparse.SUPPRESS)
    ap.add_argument("--size", default="full", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        _child(a.child, a.seconds, a.device, a.events, SMALL if a.size == "small" else FULL, a.stretch)
        return 0
    problem = None
    if not a.out:
        problem = "--out DIR is required"
    elif not 1 <= a.minutes <= 30 or a.stretch <= 0:
        problem = "--minutes must be 1-30 and --stretch positive"
    elif not a.habits or len(a.habits) > 6 or any(h not in HABITS for h in a.habits) or len(set(a.habits)) != len(a.habits):
        problem = "--habits takes up to six letters of %s, each once" % "".join(HABITS)
    if problem:
        print("leak_habits.py: %s" % problem, file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    try:
        return run(a)
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:   # no GPU, no sampler: one line
        print("leak_habits.py: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
