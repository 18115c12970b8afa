"""A DDP loop written by hand that does the rendered project's work: the benchmark's same-work reference.

The project's own data, model and loss, but none of its engine: mp.spawn, init_process_group(gloo),
DistributedDataParallel(model), DataLoader + DistributedSampler, SGD with momentum, a cosine schedule,
and the loss and the correct predictions summed every step (in tensors, synchronised once per epoch).
What the engine adds beyond this (micro-batching, checkpoints, validation, records) is either outside
the timed steps or has to cost nothing. Prints `steps-per-s <value>`: the median over epochs 2.. of each
epoch's training steps, as bench.py reads the rendered project's metrics.csv.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_group import init_gloo  # this folder: the script's own, first on sys.path
from torch.nn import functional
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset


def build(package: str, ranks: int, rank: int, batch: int, samples: int, seed: int, lr: float, momentum: float,
          epochs: int) -> tuple:  # fmt: skip
    """(sampler, loader, model, optimizer, schedule) of one rank, as a hand-written DDP script makes them."""
    project = {name: importlib.import_module(f"{package}.{name}") for name in ("data", "engine.loaders", "model")}
    every = project["data"].make_dataset(samples + samples // 4, seed)
    training = Subset(every, range(samples))
    sampler = DistributedSampler(training, num_replicas=ranks, rank=rank, shuffle=True, seed=seed, drop_last=True)
    # The dataset's own batched fetch (__getitems__) needs the project's collate, which passes its batches on.
    loader = DataLoader(training, batch_size=batch, sampler=sampler, drop_last=True,
                        collate_fn=project["engine.loaders"].collate)  # fmt: skip
    torch.manual_seed(seed)
    model = DistributedDataParallel(project["model"].build("ddp", (torch.device("cpu"),)))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * len(loader))
    return sampler, loader, model, optimizer, schedule


def step(model, optimizer, schedule, sums: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor) -> None:
    """One step of the work: forward, loss, backward, SGD, schedule; loss x samples, correct, samples into sums."""
    optimizer.zero_grad(set_to_none=True)
    outputs = model(inputs)
    loss = functional.cross_entropy(outputs.float(), targets)
    loss.backward()
    optimizer.step()
    schedule.step()
    sums[0] += loss.detach() * len(targets)
    sums[1] += (outputs.detach().argmax(dim=1) == targets).sum()
    sums[2] += len(targets)


def train(rank: int, args: argparse.Namespace) -> list[float]:
    """Each epoch's training steps per second."""
    sampler, loader, model, optimizer, schedule = build(
        args.package,
        args.ranks,
        rank,
        args.batch // args.ranks,
        args.samples,
        args.seed,
        args.lr,
        args.momentum,
        args.epochs,
    )
    rates = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        sums = torch.zeros(3, dtype=torch.float64)  # loss x samples, correct, samples
        started = time.perf_counter()
        for inputs, targets in loader:
            step(model, optimizer, schedule, sums, inputs, targets)
        rates.append(len(loader) / (time.perf_counter() - started))
        dist.all_reduce(sums)
    return rates


def worker(rank: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.ranks))  # as the engine sets it
    init_gloo(rank, args.ranks)
    # The model lives in train() only: a DDP model still alive at destroy_process_group frees the group later,
    # from its Reducer with the GIL held, and a gloo worker that still holds a tensor then hangs the exit.
    rates = train(rank, args)
    if rank == 0:
        print(f"steps-per-s {statistics.median(rates[1:]):.3f}", flush=True)
    dist.barrier()  # no rank tears gloo down while another still talks to it (a rank aborted once without it)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--package", required=True, help="the rendered project's package (installed)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64, help="global batch")
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=29778)
    arguments = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(arguments.port))
    mp.spawn(worker, args=(arguments,), nprocs=arguments.ranks)
