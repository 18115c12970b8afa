"""Train the toy model with DistributedDataParallel.

    python -m <package>.train --nproc-per-node 2 --epochs 5

Run plainly, this starts its own ranks with torch.multiprocessing (the only
way that works on native Windows, and it works on Linux too). Under torchrun
the process joins as the rank torchrun gave it. Every setting comes from
configs/train.toml and can be overridden by a flag; `--help` lists them.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import logging
import math
import os
import platform
import random
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Sampler
from tqdm import tqdm

from . import __version__, checkpoint
from .config import Config, from_command_line
from .data import make_dataset
from .distributed import (
    INTERRUPTED,
    LaunchError,
    RankInfo,
    cleanup,
    devices_for,
    die_with_the_launcher,
    ignore_interrupts_in_children,
    init_process_group,
    restart_count,
    spawn,
    torchrun_rank,
    under_torchrun,
)
from .files import write_text_durably
from .model import build

PROG = f"python -m {__package__}.train"


def versions() -> dict:
    return {
        "package": __version__,
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda or "cpu",
        "python": platform.python_version(),
        "os": platform.platform(),
    }


class AboveTheBar(logging.StreamHandler):
    """Console lines printed above rank 0's progress bar instead of through it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


def rank_logger(output_dir: Path, rank: int) -> logging.Logger:
    """One log file per rank (torchrun's redirects do not work on Windows); rank 0 also prints."""
    logger = logging.getLogger(f"{__package__}.rank{rank}")
    logger.setLevel(logging.DEBUG)  # the file gets DEBUG lines too; the console only INFO
    logger.handlers.clear()
    logger.propagate = False
    (output_dir / "logs").mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(output_dir / "logs" / f"rank{rank}.log", encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(asctime)s rank" + str(rank) + " %(levelname)s %(message)s"))
    logger.addHandler(to_file)
    if rank == 0:
        # tqdm's default lock is a multiprocessing semaphore, which a rank stopped by SIGTERM leaks
        # (a resource_tracker warning after every failed run). Only rank 0 draws: a thread lock does.
        tqdm.set_lock(threading.RLock())
        to_console = AboveTheBar(sys.stdout)
        to_console.setFormatter(logging.Formatter("%(message)s"))
        to_console.setLevel(logging.INFO)
        logger.addHandler(to_console)
    return logger


class EpochBatches(Sampler):
    """This rank's batches as index tensors: one gather per batch instead of one __getitem__ per sample.

    The order is exactly DistributedSampler's (seed + epoch), cut into full batches.
    """

    def __init__(self, sampler: DistributedSampler, batch_size: int) -> None:
        self.sampler, self.batch_size = sampler, batch_size

    def __iter__(self):
        order = torch.tensor(list(self.sampler), dtype=torch.long)
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            yield order[start : start + self.batch_size]

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size


class Trainer:
    """One rank's training: build, resume, run epochs, checkpoint."""

    def __init__(self, config: Config, info: RankInfo, log: logging.Logger) -> None:
        self.config, self.info, self.log = config, info, log
        self.output_dir = Path(config.output_dir)
        self.devices = devices_for(config, info.local_rank)
        if info.world_size < 1 or config.global_batch_size % info.world_size:
            raise LaunchError(
                f"global_batch_size={config.global_batch_size} does not divide over {info.world_size} ranks"
            )

        torch.manual_seed(config.seed)  # same initial weights on every rank
        model = build(config.parallelism, self.devices)
        seed_rank(config.seed + info.rank)  # then each rank its own stream (dropout, augmentation, ...)
        # A model that spans two devices must be wrapped without device_ids.
        single_gpu = len(self.devices) == 1 and self.devices[0].type == "cuda"
        self.model = DistributedDataParallel(
            model,
            device_ids=[self.devices[0]] if single_gpu else None,
            gradient_as_bucket_view=True,  # gradients live in the all-reduce buckets: one copy less per step
        )
        self.loss_fn = nn.CrossEntropyLoss()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=config.lr, momentum=config.momentum)
        self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
            self.optimizer, T_max=config.epochs * config.steps_per_epoch
        )
        self.autocast_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(config.precision)
        self.scaler = torch.amp.GradScaler("cuda", enabled=config.precision == "fp16")

        dataset = make_dataset(config.samples, config.seed)
        self.sampler = DistributedSampler(
            dataset, num_replicas=info.world_size, rank=info.rank, shuffle=True, seed=config.seed, drop_last=True
        )
        self.loader = DataLoader(
            dataset,
            batch_size=None,  # EpochBatches already yields whole batches
            sampler=EpochBatches(self.sampler, config.global_batch_size // info.world_size),
            num_workers=config.num_workers,
            persistent_workers=config.num_workers > 0,
            # Windows only has spawn; using it everywhere keeps Linux runs identical to Windows ones.
            multiprocessing_context="spawn" if config.num_workers > 0 else None,
            worker_init_fn=seed_worker,
            generator=torch.Generator().manual_seed(config.seed + info.rank),
            pin_memory=self.devices[0].type == "cuda",
        )
        self.epoch = 0
        self.step_in_epoch = 0
        self.global_step = 0
        self.first_step_at: float | None = None  # wall clock, for launch-time measurements
        self.resumed = False  # marks the first epoch after a resume in metrics.csv (and the plot)
        self.crash_at = crash_step(info.rank)

    # -- state -------------------------------------------------------------
    def state(self) -> dict:
        return {
            "model": self.model.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": self.gathered_rng_states(),
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "global_step": self.global_step,
            # Where this epoch's shuffled order stands: the order is a function of (seed, epoch, num_replicas).
            "sampler": {
                "seed": self.sampler.seed,
                "epoch": self.epoch,
                "num_replicas": self.sampler.num_replicas,
                "position": self.step_in_epoch * self.loader.sampler.batch_size,  # samples taken, per rank
            },
            "config": {k: v for k, v in vars(self.config).items() if k != "environment"},
            "versions": versions(),
        }

    def load_state(self, state: dict) -> None:
        self.model.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        states = state["rng"]
        if len(states) == self.info.world_size:
            set_rng_state(states[self.info.rank])
        else:
            self.log.warning(
                f"checkpoint holds RNG states of {len(states)} ranks, this job has "
                f"{self.info.world_size}: random streams restart from the seed"
            )
        self.epoch, self.step_in_epoch, self.global_step = (
            state["epoch"],
            state["step_in_epoch"],
            state["global_step"],
        )
        # Checkpoints from before the sampler entry existed are taken to match this job.
        order = state.get("sampler", {"seed": self.sampler.seed, "num_replicas": self.info.world_size})
        if self.step_in_epoch and (order["seed"], order["num_replicas"]) != (self.sampler.seed, self.info.world_size):
            self.log.warning(
                f"checkpoint stopped mid-epoch with seed {order['seed']} over {order['num_replicas']} ranks, this job "
                f"has seed {self.sampler.seed} over {self.info.world_size}: the rest of epoch {self.epoch + 1} "
                "uses a different sample order"
            )

    def gathered_rng_states(self) -> list[dict]:
        """Every rank's RNG state, in rank order (a collective: all ranks call it)."""
        states: list = [None] * self.info.world_size
        dist.all_gather_object(states, rng_state())
        return states

    def resume(self) -> None:
        choice = self.config.resume
        if choice == "none":
            return
        state = None
        if choice == "auto":
            # Rank 0 picks (and sets damaged files aside); every rank then loads the one it picked.
            picked = [None]
            if self.info.rank == 0:
                found = checkpoint.load_newest_good(self.output_dir, self.log.warning)
                picked, state = ([str(found[0])], found[1]) if found else ([None], None)
            dist.broadcast_object_list(picked, src=0)
            if picked[0] is None:
                return
            path = Path(picked[0])
        else:
            path = Path(choice)
        state = state or checkpoint.load(path)
        self.load_state(state)
        self.fit_schedule_to_this_run(state)
        self.resumed = True
        self.log.info(f"resumed from {path}: {self.where_training_continues()}")

    def fit_schedule_to_this_run(self, state: dict) -> None:
        """A resume with another --epochs stretches (or shrinks) the cosine schedule to the new length, and says so."""
        total = self.config.epochs * self.config.steps_per_epoch
        if self.scheduler.T_max == total:
            return
        trained_for = state.get("config", {}).get("epochs", "?")
        self.scheduler.T_max = total
        # The closed form at this step of the new schedule; the scheduler's steps then follow that curve.
        cosine = (1 + math.cos(math.pi * min(self.global_step, total) / total)) / 2
        low = self.scheduler.eta_min
        for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs):
            group["lr"] = low + (base - low) * cosine
        self.log.warning(
            f"epochs changed from {trained_for} to {self.config.epochs}: the learning-rate schedule now spans "
            f"{self.config.epochs} epochs ({total} steps) and continues at step {self.global_step} with lr "
            f"{self.optimizer.param_groups[0]['lr']:.6g}"
        )

    def where_training_continues(self) -> str:
        epochs, steps = self.config.epochs, self.config.steps_per_epoch
        if self.epoch >= epochs:
            return f"all {epochs} epochs were already trained"
        if self.step_in_epoch:
            return f"continuing in epoch {self.epoch + 1}/{epochs} at step {self.step_in_epoch + 1} of {steps}"
        return f"continuing at epoch {self.epoch + 1}/{epochs}"

    def save(self) -> None:
        """Rank 0 writes; everyone waits so no rank runs ahead of a checkpoint."""
        state = self.state()  # every rank takes part: it gathers all RNG states
        if self.info.rank == 0:
            checkpoint.save_atomic(state, checkpoint.path_for(self.output_dir, self.global_step))
            checkpoint.prune(self.output_dir, self.config.keep_checkpoints)
        dist.barrier()

    # -- training ----------------------------------------------------------
    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()  # entering a disabled autocast still costs time every step
        return torch.autocast(self.devices[-1].type, dtype=self.autocast_dtype)

    def _run_batch(self, inputs: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step; returns the batch's mean loss and correct count as tensors (no sync)."""
        labels = labels.to(self.devices[-1], non_blocking=True)
        self.optimizer.zero_grad(set_to_none=True)
        with self._autocast():
            logits = self.model(inputs.to(self.devices[0], non_blocking=True))
            loss = self.loss_fn(logits.float(), labels)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        return loss.detach(), (logits.argmax(dim=1) == labels).sum()

    def _run_epoch(self, epoch: int, progress) -> None:
        self.sampler.set_epoch(epoch)
        resume_at = self.step_in_epoch
        loss_total = torch.zeros((), dtype=torch.float64, device=self.devices[-1])
        correct_total = torch.zeros_like(loss_total)
        seen = 0
        started = time.perf_counter()
        for index, (inputs, labels) in enumerate(self.loader):
            if index < resume_at:  # resumed mid-epoch: these batches were already trained on
                continue
            if self.global_step == self.crash_at:
                crash(self.global_step)
            loss, correct = self._run_batch(inputs, labels)
            if self.first_step_at is None:
                self.first_step_at = time.time()
                self.log.debug(f"first optimizer step at {self.first_step_at:.6f}")
            loss_total += loss  # tensors: no device sync inside the loop; every batch has the same size
            correct_total += correct
            seen += labels.numel()
            self.global_step += 1
            self.step_in_epoch = index + 1
            if progress is not None:
                progress.update(1)
            if self.config.checkpoint_every and self.global_step % self.config.checkpoint_every == 0:
                self.save()
        # gloo cannot all-reduce AVG reliably (and never bf16): sum fp64, then divide.
        seen_total = torch.tensor(float(seen), dtype=torch.float64, device=loss_total.device)
        totals = torch.stack([loss_total * self.loader.sampler.batch_size, correct_total, seen_total])
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        loss_sum, correct, seen = totals.tolist()
        self.epoch, self.step_in_epoch = epoch + 1, 0
        if not self.config.checkpoint_every:
            self.save()
        if self.info.rank == 0 and seen:
            seconds = time.perf_counter() - started
            row = {
                "epoch": epoch + 1,
                "step": self.global_step,
                "loss": round(loss_sum / seen, 6),
                "accuracy": round(correct / seen, 4),
                "lr": f"{self.scheduler.get_last_lr()[0]:.6g}",
                "samples_per_s": round(seen / seconds, 1) if seconds > 0 else math.inf,
                "resumed": int(self.resumed),
            }
            self.resumed = False
            self.log.info(
                f"epoch {row['epoch']}/{self.config.epochs}  loss {row['loss']:.4f}  "
                f"accuracy {row['accuracy']:.3f}  ({row['samples_per_s']} samples/s)"
            )
            if progress is not None:
                progress.set_postfix(
                    epoch=row["epoch"], loss=row["loss"], acc=row["accuracy"], samples_s=row["samples_per_s"]
                )
            append_metrics(self.output_dir / "metrics.csv", row)

    def fit(self) -> None:
        self.resume()
        progress = None
        if self.info.rank == 0 and self.config.progress and sys.stdout.isatty():
            total = self.config.epochs * self.config.steps_per_epoch
            progress = tqdm(total=total, initial=self.global_step, unit="step", dynamic_ncols=True)
        try:
            for epoch in range(self.epoch, self.config.epochs):
                self._run_epoch(epoch, progress)
        finally:
            if progress is not None:
                progress.close()
        if self.info.rank == 0:
            checkpoint.save_atomic({"model": self.model.module.state_dict()}, self.output_dir / "model.pt")
            self.log.info(f"done: {self.global_step} steps; model saved to {self.output_dir / 'model.pt'}")
        dist.barrier()


def seed_rank(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def seed_worker(worker_id: int) -> None:
    """DataLoader workers: python and numpy follow the worker's torch seed (set from the loader's generator)."""
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


def rng_state() -> dict:
    """This process's random streams as tensors and plain values (loadable with weights_only=True)."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(tuple(x if not isinstance(x, list) else tuple(x) for x in state["python"]))
    numpy = state["numpy"]
    np.random.set_state(
        ("MT19937", numpy["keys"].numpy().astype(np.uint32), numpy["position"], numpy["has_gauss"], numpy["cached"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


CRASH_VARIABLE = "DDP_CRASH_RANK1_AT_STEP"
CRASH_STARTS_VARIABLE = "DDP_CRASH_RANK1_STARTS"


def crash_step(rank: int) -> int | None:
    """Fault injection for tests and drills: DDP_CRASH_RANK1_AT_STEP=S makes rank 1 die before step S,
    on the first start only, so a restarted job can get past it; DDP_CRASH_RANK1_STARTS=K crashes the
    first K starts instead (to use up the restarts). Read once, not in the training loop."""
    at = os.environ.get(CRASH_VARIABLE)
    starts = int(os.environ.get(CRASH_STARTS_VARIABLE, "1"))
    return int(at) if at is not None and rank == 1 and restart_count() < starts else None


def crash(global_step: int) -> None:
    print(f"rank 1: crashing at step {global_step} ({CRASH_VARIABLE}={global_step})", file=sys.stderr, flush=True)
    os._exit(3)


def append_metrics(path: Path, row: dict) -> None:
    """Add one row; the whole (small) file is rewritten durably, so it is never left half-written.

    A file written by an older version keeps its own columns, so every row stays under its header.
    """
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    columns = next(csv.reader([text.splitlines()[0]])) if text else list(row)
    line = io.StringIO()
    writer = csv.DictWriter(line, fieldnames=columns, lineterminator="\n", restval="", extrasaction="ignore")
    if not text:
        writer.writeheader()
    writer.writerow(row)
    write_text_durably(path, text + line.getvalue())


def git_commit() -> str | None:
    try:
        found = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found.stdout.strip() if found.returncode == 0 else None


def write_run_record(config: Config, info: RankInfo) -> None:
    answers_file = Path(__file__).resolve().parents[2] / ".copier-answers.yml"
    record = {
        "versions": versions(),
        "git_commit": git_commit(),
        "world_size": info.world_size,
        "restart": restart_count(),
        "config": vars(config),
        "answers": answers_file.read_text(encoding="utf-8") if answers_file.exists() else None,
    }
    path = Path(config.output_dir) / "run.json"
    write_text_durably(path, json.dumps(record, indent=2, default=str))


def run_rank(config: Config, info: RankInfo) -> None:
    """Everything one rank does, from process-group start to clean-up."""
    die_with_the_launcher()
    if not under_torchrun():
        ignore_interrupts_in_children()
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    log = rank_logger(output_dir, info.rank)
    if config.device == "cpu":
        # Ranks share the cores; more threads than cores only slows every rank down.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.nproc_per_node))
    if config.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    if config.device == "cuda":
        torch.cuda.set_device(devices_for(config, info.local_rank)[0])
    init_process_group(config, info)
    try:
        devices = ", ".join(str(d) for d in devices_for(config, info.local_rank))
        log.info(
            f"rank {info.rank} of {info.world_size} started on {devices} (backend {config.backend}, pid {os.getpid()})"
        )
        if info.rank == 0:
            write_run_record(config, info)
            log.info(f"output in {output_dir}")
        Trainer(config, info, log).fit()
    except Exception:
        log.exception("rank failed")
        raise
    finally:
        cleanup()


def torchrun_layout(config: Config) -> Config:
    """Under torchrun, torchrun decides the process layout and the restarts, not the config."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", config.nproc_per_node))
    torchrun_restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    if config.max_restarts not in (0, torchrun_restarts) and torchrun_rank().rank == 0:
        print(
            f"warning: max_restarts={config.max_restarts} does not apply under torchrun, which restarts the ranks "
            f"itself (here {torchrun_restarts} time(s)): use MAX_RESTARTS={config.max_restarts} scripts/train.sh "
            f"or torchrun --max-restarts {config.max_restarts}",
            file=sys.stderr,
            flush=True,
        )
    return dataclasses.replace(
        config,
        nproc_per_node=local,
        nnodes=int(os.environ["WORLD_SIZE"]) // local,
        max_restarts=torchrun_restarts,
        # A restarted rank continues from the newest checkpoint, as on the spawn path.
        resume="auto" if restart_count() else config.resume,
    )


def resume_command(argv: list[str] | None) -> str:
    """The command that was run, with --resume auto instead of any --resume it had."""
    args = list(sys.argv[1:] if argv is None else argv)
    kept = []
    while args:
        arg = args.pop(0)
        if arg == "--resume" and args:
            args.pop(0)
        elif not arg.startswith("--resume="):
            kept.append(arg)
    command = [*PROG.split(), *kept, "--resume", "auto"]
    return subprocess.list2cmdline(command) if sys.platform == "win32" else shlex.join(command)


def main(argv: list[str] | None = None) -> int:
    config = from_command_line(argv, PROG)
    if under_torchrun():
        config = torchrun_layout(config)
    try:
        if config.resume not in ("auto", "none"):
            checkpoint.load(Path(config.resume))  # a bad path fails here, before any rank starts
        if under_torchrun():
            run_rank(config, torchrun_rank())
            return 0
        status = spawn(run_rank, config)
        if status == INTERRUPTED:
            print(f"to continue from the newest checkpoint: {resume_command(argv)}", file=sys.stderr, flush=True)
        return status
    except (LaunchError, checkpoint.CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
