"""Workloads for the H200 checks (PyTorch on CUDA).

  idle-then-busy FLAGDIR  hold 2 GiB and sleep ("fake running") until
                          FLAGDIR/busy exists, then bf16 matmuls until
                          FLAGDIR/stop exists
  train leak|healthy SECONDS
                          a small MLP training loop; "leak" keeps every
                          step's loss with its autograd graph (the classic
                          `total_loss += loss`), "healthy" keeps loss.item()
"""
import os
import sys
import time

import torch


def idle_then_busy(flags):
    hold = torch.empty(2 * 1024 ** 3 // 4, dtype=torch.float32, device="cuda")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    print("holding", hold.numel() * 4 >> 20, "MiB, pid", os.getpid(), flush=True)
    while not os.path.exists(os.path.join(flags, "busy")):
        time.sleep(0.2)
    print("busy", flush=True)
    while not os.path.exists(os.path.join(flags, "stop")):
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def train(mode, seconds):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2048, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 2048)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    kept = []
    total = 0.0
    end = time.time() + seconds
    step = 0
    while time.time() < end:
        x = torch.randn(256, 2048, device="cuda")
        loss = ((model(x) - x) ** 2).mean()
        opt.zero_grad()
        loss.backward(retain_graph=(mode == "leak"))
        opt.step()
        if mode == "leak":
            kept.append(loss)            # graph and activations stay alive
        else:
            total += loss.item()
        step += 1
        time.sleep(0.02)
    print(mode, "steps", step, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "idle-then-busy":
        idle_then_busy(sys.argv[2])
    else:
        train(sys.argv[2], float(sys.argv[3]))
