"""The engine's training steps against the same-work loop body in one process: what the engine adds per step.

    python tests/bench/in_process_steps.py --package PACKAGE [--epochs 4]

One gloo rank (world size 1) in this process, 1 thread, batches of 32 (a rank's share of bench.py's global
batch of 64). The rendered project's Trainer, built by engine.rank.build_trainer from its default recipe,
runs `run_step` over its own training loader (ResumableSampler, SampleSeeded); the loop body of
same_work_ddp.py (DataLoader + DistributedSampler, DDP, SGD with momentum, the cosine schedule, the loss and
correct predictions summed) runs on the same data and model. The two take turns step by step, each step
timed, so that a slow second of a shared machine hits both alike, which 2-rank runs of their own cannot
arrange; the first epoch warms up. Prints JSON: the median microseconds of a step of each and their ratio
(same-work / engine: 1.0 means the engine adds nothing to a step), and that ratio for each epoch.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import statistics
import tempfile
import time

import same_work_ddp  # this folder: the script's own, first on sys.path
import torch
import torch.distributed as dist

BATCH, SAMPLES = 32, 16384  # 512 steps an epoch


class Engine:
    """The rendered project's Trainer over its own training loader, one run_step at a time."""

    def __init__(self, package: str, output: str) -> None:
        engine = importlib.import_module(f"{package}.engine")
        config_module, rank, totals, process_group = (
            importlib.import_module(f"{package}.engine.{part}")
            for part in ("config", "rank", "totals", "process_group")
        )
        self.config = config_module.from_command_line(
            ["--config", str(engine.PROJECT_ROOT / "configs" / "train.toml"), "--output-dir", output,
             "--resume", "none", "--nproc-per-node", "1", "--global-batch-size", str(BATCH),
             "--samples", str(SAMPLES)], "bench",
        )  # fmt: skip
        info = process_group.RankInfo(0, 0, 1, "bench")
        self.trainer = rank.build_trainer(self.config, info, logging.getLogger("bench"))
        self.totals = totals.Totals(torch.device("cpu"))

    def start_epoch(self, epoch: int) -> None:
        self.trainer.train_data.sampler.set_epoch(epoch)
        self.batches = iter(self.trainer.train_data)

    def step(self) -> None:
        self.trainer.run_step(self.batches, self.totals)


class SameWork:
    """same_work_ddp.py's objects and step, for one rank."""

    def __init__(self, package: str, lr: float, momentum: float, seed: int) -> None:
        made = same_work_ddp.build(package, 1, 0, BATCH, SAMPLES, seed, lr, momentum, epochs=2048)  # lr stays up
        self.sampler, self.loader, *self.objects = made  # model, optimizer, schedule
        self.sums = torch.zeros(3, dtype=torch.float64)

    def start_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        self.batches = iter(self.loader)

    def step(self) -> None:
        same_work_ddp.step(*self.objects, self.sums, *next(self.batches))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--package", required=True, help="the rendered project's package (installed)")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as each of 2 ranks on 2 cores
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    with tempfile.TemporaryDirectory() as output:
        ours = Engine(args.package, output)
        settings = ours.config.settings
        runs = {
            "engine": ours,
            "same work": SameWork(args.package, settings["lr"], settings["momentum"], ours.config.seed),
        }
        steps = len(ours.trainer.train_data)
        timings: list[dict[str, list[float]]] = []
        for epoch in range(args.epochs):
            for run in runs.values():
                run.start_epoch(epoch)
            times: dict[str, list[float]] = {name: [] for name in runs}
            for step in range(steps):
                for name in runs if step % 2 == 0 else reversed(runs):
                    started = time.perf_counter()
                    runs[name].step()
                    times[name].append(time.perf_counter() - started)
            timings.append(times)
    dist.destroy_process_group()
    measured = timings[1:]  # the first epoch warms up
    medians = {name: statistics.median(t for epoch in measured for t in epoch[name]) * 1e6 for name in runs}
    per_epoch = [statistics.median(epoch["same work"]) / statistics.median(epoch["engine"]) for epoch in measured]
    print(json.dumps({"epochs": len(measured), "steps": steps, "batch": BATCH, "us_per_step": medians,
                      "ratio": medians["same work"] / medians["engine"], "ratios": per_epoch}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
