"""The engine's training steps against a hand-written loop body in the same ranks: what the engine adds per step.

    python tests/bench/in_process_steps.py --package PACKAGE [--epochs 4] [--ranks 1] [--work toy|cnn]

`--ranks` gloo ranks (1: this process; more are spawned), 1 thread each, batches of 32 per rank (a rank's
share of bench.py's global batch of 64). In every rank the rendered project's Trainer, built by
engine.rank.build_trainer from its default recipe, runs `run_step` over its own training loader, drawn as
Trainer.run_epoch draws it (loaders.batches_of: KeyBatches over ResumableSampler, SampleSeeded), and the
loop body of same_work_ddp.py (DataLoader + DistributedSampler, DDP, SGD with momentum, the cosine schedule,
the loss and correct predictions summed) runs on the same data and model. The two, and a second copy of
the loop, take turns of TURN steps, each all-reducing its gradients over the same process group, so that a
slow second of a shared machine hits all alike, which runs of their own cannot arrange; the first epoch warms
up. A turn is timed whole: a rank without workers fetches FETCHED_TOGETHER batches at once, so most of the
engine's steps fetch nothing and the median of single steps would leave its loader out. Rank 0 prints JSON:
the median over turns of the microseconds a step takes in each, and the median over rounds (one turn of
each run) of the ratio same-work / engine (1.0: the engine adds nothing to a step) beside same-work / its
second copy (what the measurement reads for no difference at all), overall and for each epoch.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import itertools
import json
import logging
import os
import statistics
import tempfile
import time

import cnn_tutorial
import same_work_ddp  # this folder: the script's own, first on sys.path
import sample_seeded
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_group import init_gloo

BATCH, SAMPLES = 32, 16384  # per rank: 512 steps an epoch
CNN_SAMPLES = 4096  # per rank: 128 steps an epoch of the CNN's, which take milliseconds
CNN_LR = 0.001
# Steps a run takes in a row before the next run's turn: a run's own code and data stay in the caches, as in a
# run of its own; turns of 1 step would time each run with caches the other runs just filled.
TURN = 16


class Engine:
    """The rendered project's Trainer over its own training loader, one run_step at a time."""

    def __init__(self, package: str, output: str, rank: int, ranks: int, unseeded: bool, work: list[str]) -> None:
        engine = importlib.import_module(f"{package}.engine")
        command_line, context_module, rank_module, totals, processes, self.loaders = (
            importlib.import_module(f"{package}.engine.{part}")
            for part in ("command_line", "context", "rank", "totals", "processes", "loaders")
        )
        self.config = command_line.from_command_line(
            ["--config", str(engine.PROJECT_ROOT / "configs" / "train.toml"), "--output-dir", output,
             "--resume", "none", "--nproc-per-node", str(ranks), "--global-batch-size", str(BATCH * ranks), *work],
            "bench",
        )  # fmt: skip
        info = processes.RankInfo(rank, rank, ranks, "bench")
        context = context_module.RankContext.create(self.config, info, logging.getLogger("bench"))
        self.trainer = rank_module.build_trainer(context)
        self.totals = totals.Totals(torch.device("cpu"))
        if unseeded:  # what per-sample seeding costs a step: the Dataset's own fetch, without SampleSeeded
            seeded = self.trainer.train_data.dataset
            seeded.__getitems__ = sample_seeded.unseeded_fetch(seeded.dataset)

    def start_epoch(self, epoch: int) -> None:
        self.loaders.order_of(self.trainer.train_data).set_epoch(epoch)
        self.batches = self.loaders.batches_of(self.trainer.train_data)  # as Trainer.run_epoch draws them

    def step(self) -> None:
        self.trainer.run_step(self.batches, self.totals)


class Tutorial:
    """cnn_tutorial.py's objects and step, for one rank."""

    def __init__(self, rank: int, ranks: int, seed: int) -> None:
        made = cnn_tutorial.build(rank, ranks, BATCH * ranks, CNN_SAMPLES * ranks, seed, CNN_LR, epochs=2048)
        self.sampler, self.loader, *self.objects = made  # model, optimizer, schedule

    def start_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        self.batches = iter(self.loader)

    def step(self) -> None:
        cnn_tutorial.step(*self.objects, *next(self.batches))


class SameWork:
    """same_work_ddp.py's objects and step, for one rank."""

    def __init__(self, package: str, rank: int, ranks: int, lr: float, momentum: float, seed: int) -> None:
        made = same_work_ddp.build(package, ranks, rank, BATCH, SAMPLES * ranks, seed, lr, momentum, epochs=2048)
        self.sampler, self.loader, *self.objects = made  # model, optimizer, schedule
        self.sums = torch.zeros(3, dtype=torch.float64)

    def start_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        self.batches = iter(self.loader)

    def step(self) -> None:
        same_work_ddp.step(*self.objects, self.sums, *next(self.batches))


def rank_main(rank: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)  # as each of 2 ranks on 2 cores
    init_gloo(rank, args.ranks)
    with tempfile.TemporaryDirectory() as output:
        if args.work == "cnn":
            work = ["--recipe", "cnn_recipe", "--lr", str(CNN_LR), "--samples", str(CNN_SAMPLES * args.ranks)]
            ours = Engine(args.package, output, rank, args.ranks, args.unseeded, work)
            loop = functools.partial(Tutorial, rank, args.ranks, ours.config.seed)
        else:
            work = ["--samples", str(SAMPLES * args.ranks)]
            ours = Engine(args.package, output, rank, args.ranks, args.unseeded, work)
            loop = functools.partial(SameWork, args.package, rank, args.ranks, ours.config.settings["lr"],
                                     ours.config.settings["momentum"], ours.config.seed)  # fmt: skip
        # A second copy of the loop reads what this measurement gives for two runs with no difference.
        runs = {"engine": ours, "same work": loop(), "same work again": loop()}
        steps = len(ours.loaders.order_of(ours.trainer.train_data)) // BATCH
        timings: list[dict[str, list[float]]] = []  # per epoch, each run's seconds a step in each of its turns
        # Each round takes the next of the runs' orders, the same on every rank (their all-reduces pair): over the
        # rounds each run goes as often first, second and third, and after each of the others.
        orders = itertools.cycle(itertools.permutations(runs))
        for epoch in range(args.epochs):
            for run in runs.values():
                run.start_epoch(epoch)
            times: dict[str, list[float]] = {name: [] for name in runs}
            for first in range(0, steps, TURN):
                taken = range(first, min(first + TURN, steps))
                for name in next(orders):
                    started = time.perf_counter()
                    for _ in taken:
                        runs[name].step()
                    times[name].append((time.perf_counter() - started) / len(taken))
            timings.append(times)
    dist.barrier()
    dist.destroy_process_group()
    if rank:
        return
    measured = timings[1:]  # the first epoch warms up
    medians = {name: statistics.median(t for epoch in measured for t in epoch[name]) * 1e6 for name in runs}
    compared = ("engine", "same work again")

    def round_ratios(epochs: list[dict], name: str) -> list[float]:
        return [same / other for epoch in epochs for same, other in zip(epoch["same work"], epoch[name], strict=True)]

    ratios = {name: statistics.median(round_ratios(measured, name)) for name in compared}
    per_epoch = {name: [statistics.median(round_ratios([epoch], name)) for epoch in measured] for name in compared}
    print(json.dumps({"work": args.work, "ranks": args.ranks, "epochs": len(measured), "steps": steps,
                      "batch": BATCH, "turn": TURN, "us_per_step": medians, "ratio": ratios, "ratios": per_epoch},
                     indent=2))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--package", required=True, help="the rendered project's package (installed)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--ranks", type=int, default=1, help="more ranks also time each other's waits")
    parser.add_argument("--port", type=int, default=29779)
    parser.add_argument("--unseeded", action="store_true", help="the engine without per-sample seeding")
    parser.add_argument("--work", choices=["toy", "cnn"], default="toy", help="the default recipe, or cnn_recipe.py")
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    if args.ranks == 1:
        rank_main(0, args)
    else:
        mp.spawn(rank_main, args=(args,), nprocs=args.ranks)


if __name__ == "__main__":
    main()
