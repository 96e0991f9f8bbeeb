"""GPU patterns for bench/h200/spin.sh: what a hung job and busy jobs look
like to nvidia-smi. Each mode holds ~2 GiB (a training job's footprint),
writes "ready" on stdout, runs for SECONDS, then exits.

  sleep       one block spinning on the clock (torch.cuda._sleep), the
              shape of a kernel waiting forever
  poll BLOCKS BLOCKS blocks polling a flag in global memory (Triton), what a
              collective waiting for a dead peer does; one block per SM
              with 132
  matmul      a bf16 training-like loop (MLP forward, backward, AdamW)
  memcpy      a memory-bound copy of 2 GiB, back and forth
  starved     a loop starved by its data loader: 5 matmuls, 200 ms of CPU
  launch      tiny kernels launched one by one from Python (launch-bound)
  graph       tiny kernels replayed by a CUDA graph (latency-bound)
  nccl RANK WORLD INITFILE
              two ranks: rank 0 sleeps (its GPU idles), rank 1 waits in
              all_reduce (its GPU spins); run one process per rank

Usage: python3 spin_workload.py MODE SECONDS [ARGS]
"""
import os
import sys
import time

import torch


def hold():
    return torch.empty(2 * 1024 ** 3 // 4, dtype=torch.float32, device="cuda")


def ready(extra=""):
    print("ready", os.getpid(), extra, flush=True)


def run_sleep(seconds):
    kept = hold()
    ready()
    end = time.time() + seconds
    while time.time() < end:
        torch.cuda._sleep(500_000_000)          # ~0.25 s at 1980 MHz
        torch.cuda.synchronize()
    del kept


def run_poll(seconds, blocks):
    import triton
    import triton.language as tl

    @triton.jit
    def poll(flag_ptr, out_ptr):
        v = tl.load(flag_ptr, volatile=True)
        while v == 0:
            v = tl.load(flag_ptr, volatile=True)
        tl.store(out_ptr + tl.program_id(0), v)

    kept = hold()
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    out = torch.zeros(blocks, dtype=torch.int32, device="cuda")
    poll[(blocks,)](flag, out, num_warps=1)
    ready(blocks)
    time.sleep(seconds)
    # release the pollers from another stream; spin.sh kills us if it hangs
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        flag.fill_(1)
    torch.cuda.synchronize()
    del kept


def run_matmul(seconds):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8192, 8192), torch.nn.GELU(),
                                torch.nn.Linear(8192, 8192)).cuda().to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) * 0.01

    def train_step():
        loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    # one step first: cuBLAS and the optimizer's state are set up before the
    # watchdog's clock starts (the first H200 run read 1 % here)
    train_step()
    torch.cuda.synchronize()
    ready()
    end = time.time() + seconds
    steps, report = 0, time.time() + 1
    while time.time() < end:
        for _ in range(4):
            train_step()
        torch.cuda.synchronize()
        steps += 4
        if time.time() >= report:
            print("matmul steps", steps, flush=True)
            report = time.time() + 1


def run_memcpy(seconds):
    a = torch.empty(2 * 1024 ** 3, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ready()
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(10):
            b.copy_(a)
            a.copy_(b)
        torch.cuda.synchronize()


def run_starved(seconds):
    kept = hold()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ready()
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(5):
            a @ a
        torch.cuda.synchronize()
        t = time.time() + 0.2                   # the data loader: CPU only
        while time.time() < t:
            pass
    del kept


def run_launch(seconds):
    kept = hold()
    x = torch.zeros(256, device="cuda")
    ready()
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(1000):
            x.add_(1)
        torch.cuda.synchronize()
    del kept


def run_graph(seconds):
    kept = hold()
    x = torch.zeros(256, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            x.add_(1)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(200):
            x.add_(1)
    ready()
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            g.replay()
        torch.cuda.synchronize()
    del kept


def run_nccl(seconds, rank, world, initfile):
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="file://" + initfile, rank=rank, world_size=world)
    kept = hold()
    t = torch.ones(1024 * 1024, device="cuda")
    dist.all_reduce(t)                          # communicators up on both ranks
    torch.cuda.synchronize()
    dist.barrier()
    ready(rank)
    if rank == 0:
        time.sleep(seconds)                     # the rank that "hangs" (a stuck data loader)
    else:
        print("waiting", time.time(), flush=True)
        dist.all_reduce(t)                      # waits for rank 0: the GPU spins
        torch.cuda.synchronize()
    del kept
    os._exit(0)                                 # no teardown handshake with a killed peer


def main(argv):
    mode, seconds = argv[0], float(argv[1])
    if mode == "poll":
        run_poll(seconds, int(argv[2]))
    elif mode == "nccl":
        run_nccl(seconds, int(argv[2]), int(argv[3]), argv[4])
    else:
        globals()["run_" + mode](seconds)


if __name__ == "__main__":
    main(sys.argv[1:])
