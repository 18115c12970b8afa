"""cnn_recipe.py's work written as PyTorch's DDP tutorial writes a training script: the benchmark's baseline.

mp.spawn, init_process_group(gloo), DistributedDataParallel, DataLoader + DistributedSampler with set_epoch,
AdamW, a cosine schedule stepped every step, and torch.save of the model on rank 0 after each epoch.
Prints `steps-per-s <value>`: the median over epochs 2.. of each epoch's training steps, as bench.py reads
the rendered project's metrics.csv (whose rate, too, leaves out what follows the steps: validation, the save).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import cnn_recipe  # this folder: the script's own, first on sys.path
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_group import init_gloo
from torch.nn import functional
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler


def build(rank: int, ranks: int, batch: int, samples: int, seed: int, lr: float, epochs: int) -> tuple:
    """(sampler, loader, model, optimizer, schedule) of one rank, as the tutorial makes them."""
    dataset = cnn_recipe.FlippedImages(samples, seed)
    sampler = DistributedSampler(dataset, num_replicas=ranks, rank=rank, shuffle=True, seed=seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=batch // ranks, sampler=sampler, drop_last=True)
    torch.manual_seed(seed)
    model = DistributedDataParallel(cnn_recipe.network())
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * len(loader))
    return sampler, loader, model, optimizer, schedule


def step(model, optimizer, schedule, inputs: torch.Tensor, targets: torch.Tensor) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss = functional.cross_entropy(model(inputs).float(), targets)
    loss.backward()
    optimizer.step()
    schedule.step()


def train(rank: int, args: argparse.Namespace, folder: str) -> list[float]:
    """Each epoch's training steps per second."""
    sampler, loader, *objects = build(rank, args.ranks, args.batch, args.samples, args.seed, args.lr, args.epochs)
    model = objects[0]
    rates = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        started = time.perf_counter()
        for inputs, targets in loader:
            step(*objects, inputs, targets)
        rates.append(len(loader) / (time.perf_counter() - started))
        if rank == 0:
            torch.save(model.module.state_dict(), Path(folder) / "snapshot.pt")
    return rates


def worker(rank: int, args: argparse.Namespace, folder: str) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.ranks))  # as the engine sets it
    init_gloo(rank, args.ranks)
    # The model lives in train() only: a DDP model still alive at destroy_process_group frees the group later,
    # from its Reducer with the GIL held, and a gloo worker that still holds a tensor then hangs the exit.
    rates = train(rank, args, folder)
    if rank == 0:
        print(f"steps-per-s {statistics.median(rates[1:]):.3f}", flush=True)
    dist.barrier()  # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64, help="global batch")
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=29779)
    arguments = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(arguments.port))
    with tempfile.TemporaryDirectory() as snapshots:
        mp.spawn(worker, args=(arguments, snapshots), nprocs=arguments.ranks)
