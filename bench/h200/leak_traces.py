"""Training-like workloads whose GPU memory curves the leak detector must read
right, for recording on a real H200 (bench/h200/leak_traces.sh).

  python3 leak_traces.py KIND SECONDS

KIND:
  train      healthy: bf16 MLP training with torch.cuda.empty_cache() every
             25 steps, an evaluation phase (6x batch, no grad) of 12 s every
             45 s, a checkpoint save (a full GPU copy of the weights and the
             optimizer state for 6 s, then torch.save from the CPU) every 70 s,
             and one legitimate jump (the sequence length doubles) at 100 s
  leak       the same loop, plus a real leak: every second one more 10 MiB
             tensor is appended to a list that is never freed (36 GB/h)
  rl         healthy, phase-alternating: 30 s of rollout holding a 16 GiB
             "KV cache", then 30 s of training with the cache freed
  kvcache    healthy, a serving cache filling and decelerating toward a
             20 GiB ceiling (time constant 60 s), then holding
  fill       a fast leak from 0.6 GB: FILL_MIB_PER_S (default 614) MiB more
             every second until the GPU is out of memory (the recorded
             88-minute fill, compressed)
"""
import math
import os
import sys
import time

import torch

MIB = 1 << 20


def hold(mib):
    return torch.empty(int(mib) * MIB, dtype=torch.uint8, device="cuda")


def train(seconds, leak_mib_per_s=0.0):
    torch.manual_seed(0)
    width = 4096
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(8)]).cuda().to(torch.bfloat16)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    start = time.time()
    end = start + seconds
    seq = 2048
    kept = []
    leaked = 0.0
    step = 0
    next_eval, next_ckpt = start + 45, start + 70
    while time.time() < end:
        now = time.time()
        if now - start > 100 and seq == 2048:
            seq = 4096                      # a longer sequence bucket: one jump
        if leak_mib_per_s:
            due = (now - start) * leak_mib_per_s
            while leaked + 10 <= due:
                kept.append(hold(10))
                leaked += 10
        if now >= next_eval:
            with torch.no_grad():
                until = now + 12
                while time.time() < until:
                    x = torch.randn(seq * 6, width, device="cuda", dtype=torch.bfloat16)
                    model(x).float().mean().item()
            next_eval = time.time() + 45
            continue
        if now >= next_ckpt:
            copy = [p.detach().clone() for p in model.parameters()]
            copy += [s.clone() for st in opt.state.values() for s in st.values() if torch.is_tensor(s)]
            torch.cuda.synchronize()
            time.sleep(6)
            torch.save([c.cpu() for c in copy], "/tmp/leak_traces_ckpt.pt")
            del copy
            next_ckpt = time.time() + 70
            continue
        x = torch.randn(seq, width, device="cuda", dtype=torch.bfloat16)
        loss = (model(x).float() ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % 25 == 0:
            torch.cuda.empty_cache()
        time.sleep(0.01)
    print("steps", step, "leaked MiB", leaked, flush=True)


def rl(seconds):
    end = time.time() + seconds
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    while time.time() < end:
        cache = hold(16 * 1024)             # rollout: the inference engine's KV cache
        until = time.time() + 30
        while time.time() < until:
            (a @ a).sum().item()
            time.sleep(0.05)
        del cache
        torch.cuda.empty_cache()
        acts = hold(6 * 1024)               # training: activations and optimizer
        until = time.time() + 30
        while time.time() < until:
            (a @ a).sum().item()
            time.sleep(0.05)
        del acts
        torch.cuda.empty_cache()


def kvcache(seconds):
    start = time.time()
    blocks = []
    base = hold(2048)
    while time.time() < start + seconds:
        target = 20 * 1024 * (1 - math.exp(-(time.time() - start) / 60.0))
        while len(blocks) * 256 + 256 <= target:
            blocks.append(hold(256))
        time.sleep(1)
    del base


def fill(seconds):
    step = int(os.environ.get("FILL_MIB_PER_S", "614"))
    blocks = [hold(600)]
    end = time.time() + seconds
    while time.time() < end:
        try:
            blocks.append(hold(step))
        except torch.OutOfMemoryError:
            print("OOM after", len(blocks), "blocks", flush=True)
            sys.exit(3)
        time.sleep(1)


if __name__ == "__main__":
    kind, secs = sys.argv[1], float(sys.argv[2])
    print(kind, "pid", os.getpid(), flush=True)
    if kind == "train":
        train(secs)
    elif kind == "leak":
        train(secs, leak_mib_per_s=10.0)
    elif kind == "rl":
        rl(secs)
    elif kind == "kvcache":
        kvcache(secs)
    elif kind == "fill":
        fill(secs)
