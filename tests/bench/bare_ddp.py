"""The shortest honest DDP training loop: the benchmark's baseline.

mp.spawn, init_process_group(gloo), DDP, SGD, a fixed batch per rank, nothing else.
Prints `first-step <unix time>` after rank 0's first optimizer step and
`steps-per-s <value>` over the timed steps.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_group import init_gloo  # this folder: the script's own, first on sys.path
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def worker(rank: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    init_gloo(rank, args.ranks)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(10, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 5)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)  # the rendered config's optimizer
    loss_fn = nn.CrossEntropyLoss()
    inputs = torch.randn(args.batch // args.ranks, 10)
    labels = torch.randint(0, 5, (args.batch // args.ranks,))
    started = 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            started = time.perf_counter()
        optimizer.zero_grad()
        loss_fn(model(inputs), labels).backward()
        optimizer.step()
        if step == 0 and rank == 0:
            print(f"first-step {time.time():.6f}", flush=True)
    elapsed = time.perf_counter() - started
    if rank == 0:
        print(f"steps-per-s {args.steps / elapsed:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64, help="global batch")
    parser.add_argument("--steps", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=16)
    parser.add_argument("--port", type=int, default=29777)
    arguments = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(arguments.port))
    mp.spawn(worker, args=(arguments,), nprocs=arguments.ranks)
