"""The engine's Trainer: one rank's loop over the objects a recipe built, as in PyTorch's DDP tutorial.

It owns what every recipe needs done the same way: micro-batches and gradient accumulation,
mixed precision, validation on all ranks, checkpoints with exact resume, best.pt, metrics.csv.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from . import checkpoint, faults, records, rng
from .config import Config
from .distributed import LaunchError, RankInfo, devices_for, restart_count
from .logs import progress_bar


class NonFiniteLoss(RuntimeError):
    """The loss turned NaN or infinite; nothing after the last good checkpoint was saved."""


# SIGUSR1 asks for a clean stop: Slurm sends it before a time limit or a preemption (--signal=USR1@90).
# The ranks agree every STOP_CHECK_EVERY steps, save a checkpoint and exit with STOPPED.
CAN_REQUEST_A_STOP = hasattr(signal, "SIGUSR1")  # POSIX only; Windows has no such signal
STOP_REQUESTED = threading.Event()
STOP_CHECK_EVERY = 16


class StopRequested(Exception):
    """Every rank stopped on SIGUSR1 after saving a checkpoint."""


def listen_for_stop_requests() -> None:
    if CAN_REQUEST_A_STOP:
        signal.signal(signal.SIGUSR1, lambda signum, frame: STOP_REQUESTED.set())


class Totals:
    """Loss, metric and sample count summed over batches, without a device sync per batch.

    Each batch's tensors wait in a list; they are summed in fp64 when asked (and every 1024
    batches): one stack and one dot product instead of several small operations per step.
    """

    def __init__(self, device: torch.device) -> None:
        self.folded = torch.zeros(3, dtype=torch.float64, device=device)
        self.losses, self.scores, self.counts = [], [], []

    def add(self, mean_loss: torch.Tensor, score: torch.Tensor, samples: int) -> None:
        self.losses.append(mean_loss.detach())
        self.scores.append(score.detach())
        self.counts.append(samples)
        if len(self.counts) == 1024:
            self.sums()

    def sums(self) -> torch.Tensor:
        """(loss x samples, metric, samples), summed so far."""
        if self.counts:
            counts = torch.tensor(self.counts, dtype=torch.float64, device=self.folded.device)
            self.folded[0] += torch.stack(self.losses).double() @ counts
            self.folded[1] += torch.stack(self.scores).double().sum()
            self.folded[2] += counts.sum()
            self.losses, self.scores, self.counts = [], [], []
        return self.folded


def restore_scaler(scaler, saved_precision: str | None, precision: str, saved_state: dict, log) -> None:
    """Load the GradScaler's state only when both runs used fp16, and say when the precision changed.

    A run without fp16 saved a disabled scaler's empty state, which an enabled one refuses ("The source state
    dict is empty"): a resume into fp16 starts a fresh scale instead; one out of fp16 has no scaler to load.
    """
    if saved_precision is not None and saved_precision != precision:
        log.warning(
            f"precision changed from {saved_precision} to {precision} on resume"
            + (": the fp16 GradScaler starts from its initial scale" if precision == "fp16" else "")
        )
    if saved_precision == precision == "fp16" and saved_state:
        scaler.load_state_dict(saved_state)


class Trainer:
    """One rank's training, given the objects the recipe built, as in PyTorch's DDP tutorial."""

    def __init__(self, model, train_data, val_data, optimizer, recipe, config: Config, info: RankInfo, log) -> None:
        self.model, self.train_data, self.val_data, self.optimizer = model, train_data, val_data, optimizer
        self.recipe, self.config, self.info, self.log = recipe, config, info, log
        self.devices = devices_for(config, info.local_rank)
        self.output_dir = Path(config.output_dir)
        self.samples_per_step = config.micro_batch * config.accumulate_steps  # per rank
        self.steps_per_epoch = len(train_data.sampler) // self.samples_per_step
        if self.steps_per_epoch < 1:
            raise LaunchError(
                f"the training set gives each of {info.world_size} rank(s) {len(train_data.sampler)} samples, fewer "
                f"than one step's {self.samples_per_step}; lower global_batch_size or use more data"
            )
        self.total_steps = config.epochs * self.steps_per_epoch
        self.scheduler = recipe.schedule(optimizer, config, self.total_steps)
        self.scaler = torch.amp.GradScaler("cuda", enabled=config.precision == "fp16")
        self.autocast_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(config.precision)
        self.epoch = self.step_in_epoch = self.global_step = 0
        self.run_id, self.best = "", None  # best: (value, epoch) of best_metric so far
        self.resumed = False  # marks the first epoch after a resume in metrics.csv (and the plot)
        self.crash_at = faults.crash_step(info.rank)

    # -- state -------------------------------------------------------------
    def state(self) -> dict:
        rng_states: list = [None] * self.info.world_size
        dist.all_gather_object(rng_states, rng.state(self.devices))  # a collective: every rank calls state()
        return {
            "run_id": self.run_id,
            "model": checkpoint.on_cpu(self.model.module.state_dict()),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "total_steps": self.total_steps,
            "scaler": self.scaler.state_dict(),
            "rng": rng_states,
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "global_step": self.global_step,
            "best": self.best,
            # The epoch's order is a function of (seed, epoch, num_replicas); position: samples taken, per rank.
            "sampler": {
                "seed": self.config.seed,
                "epoch": self.epoch,
                "num_replicas": self.info.world_size,
                "position": self.step_in_epoch * self.samples_per_step,
            },
            "config": {k: v for k, v in vars(self.config).items() if k != "environment"},
            "versions": records.versions(),
        }

    def load_state(self, state: dict) -> None:
        self.model.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        restore_scaler(self.scaler, state["config"].get("precision"), self.config.precision, state["scaler"], self.log)
        self.epoch, self.step_in_epoch, self.global_step = state["epoch"], state["step_in_epoch"], state["global_step"]
        self.best = state.get("best")
        if len(state["rng"]) == self.info.world_size:
            rng.set_state(state["rng"][self.info.rank], self.devices)
        else:
            self.log.warning(
                f"checkpoint holds RNG states of {len(state['rng'])} ranks, this job has "
                f"{self.info.world_size}: random streams restart from the seed"
            )
        order = state["sampler"]
        if self.step_in_epoch and (order["seed"], order["num_replicas"]) != (self.config.seed, self.info.world_size):
            self.log.warning(
                f"checkpoint stopped mid-epoch with seed {order['seed']} over {order['num_replicas']} "
                f"ranks, this job has seed {self.config.seed} over {self.info.world_size}: the rest of "
                f"epoch {self.epoch + 1} uses a different sample order"
            )
        if state.get("total_steps", self.total_steps) == self.total_steps:
            self.scheduler.load_state_dict(state["scheduler"])
        else:
            self.rebuild_schedule(state["config"]["epochs"])

    def rebuild_schedule(self, trained_for: int) -> None:
        """A resume with another --epochs rebuilds the recipe's schedule for the new length, and says so."""
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        self.scheduler = self.recipe.schedule(self.optimizer, self.config, self.total_steps)
        with warnings.catch_warnings():  # stepping the schedule to where training stands, without training
            warnings.simplefilter("ignore")
            for _ in range(min(self.global_step, self.total_steps)):
                self.scheduler.step()
        self.log.warning(
            f"epochs changed from {trained_for} to {self.config.epochs}: the learning-rate schedule now spans "
            f"{self.config.epochs} epochs ({self.total_steps} steps) and continues at step {self.global_step} "
            f"with lr {self.optimizer.param_groups[0]['lr']:.6g}"
        )

    def resume(self) -> None:
        """Rank 0 decides the run's identity and the checkpoint (setting damaged ones aside); all ranks load it."""
        picked, state = [None, None], None
        if self.info.rank == 0:
            path, state, run_id = records.starting_point(self.config.resume, self.output_dir, self.log.warning)
            picked = [str(path) if path else None, run_id]
        dist.broadcast_object_list(picked, src=0)
        self.run_id = picked[1]
        if picked[0] is None:
            return
        self.load_state(state or checkpoint.load(Path(picked[0])))
        self.resumed = True
        self.log.info(f"resumed from {picked[0]}: {self.where_training_continues()}")

    def where_training_continues(self) -> str:
        if self.epoch >= self.config.epochs:
            return f"all {self.config.epochs} epochs were already trained"
        if self.step_in_epoch:
            return (
                f"continuing in epoch {self.epoch + 1}/{self.config.epochs} at step {self.step_in_epoch + 1} "
                f"of {self.steps_per_epoch}"
            )
        return f"continuing at epoch {self.epoch + 1}/{self.config.epochs}"

    def save(self) -> None:
        """Rank 0 writes; everyone waits so no rank runs ahead of a checkpoint."""
        state = self.state()
        if self.info.rank == 0:
            started = time.perf_counter()
            checkpoint.save_atomic(state, checkpoint.path_for(self.output_dir, self.global_step, self.run_id))
            checkpoint.prune(self.output_dir, self.run_id, self.config.keep_checkpoints)
            late = checkpoint.slow_save_warning(time.perf_counter() - started, self.config.timeout_s)
            if late:
                self.log.warning(late)
        dist.barrier()

    def save_mid_epoch(self, training: Totals) -> None:
        so_far = training.sums()[0].clone()
        dist.all_reduce(so_far, op=dist.ReduceOp.SUM)
        self.stop_if_not_finite(so_far.item())
        self.save()

    def stop_agreed(self) -> bool:
        """Whether any rank got SIGUSR1: all ranks must stop at the same step (one tiny all-reduce)."""
        if not CAN_REQUEST_A_STOP:
            return False
        flag = torch.tensor([float(STOP_REQUESTED.is_set())], device=self.devices[-1])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def stop_if_not_finite(self, loss_sum: float) -> None:
        """Given the loss summed over all ranks: a NaN or inf on any rank made it NaN or inf."""
        if self.config.stop_on_nonfinite_loss and not math.isfinite(loss_sum):
            kept = checkpoint.existing(self.output_dir, self.run_id)
            raise NonFiniteLoss(
                f"the loss became {loss_sum} by step {self.global_step} (epoch {self.epoch + 1}); stopped without "
                f"saving, the newest good checkpoint is {kept[0] if kept else 'none'}. Lower --lr, check the "
                "data for NaN/inf, or set stop_on_nonfinite_loss = false to train on"
            )

    # -- training ----------------------------------------------------------
    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()  # entering a disabled autocast still costs time every step
        return torch.autocast(self.devices[-1].type, dtype=self.autocast_dtype)

    def run_step(self, batches, totals: Totals) -> None:
        """One optimizer step over accumulate_steps micro-batches; gradients are all-reduced on the last only."""
        self.optimizer.zero_grad(set_to_none=True)
        parts = self.config.accumulate_steps
        for micro in range(parts):
            inputs, targets = next(batches)
            targets = targets.to(self.devices[-1], non_blocking=True)
            with contextlib.nullcontext() if micro == parts - 1 else self.model.no_sync():
                with self.autocast():
                    outputs = self.model(inputs.to(self.devices[0], non_blocking=True))
                    loss = self.recipe.loss(outputs, targets)
                self.scaler.scale(loss if parts == 1 else loss / parts).backward()
            totals.add(loss, self.recipe.metric(outputs.detach(), targets), len(targets))
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()

    @torch.no_grad()
    def validate(self, totals: Totals) -> None:
        """This rank's share of the validation set, every sample exactly once over all ranks."""
        module = self.model.module  # no collectives: ranks may hold one sample more or less
        module.eval()
        for inputs, targets in self.val_data:
            targets = targets.to(self.devices[-1], non_blocking=True)
            with self.autocast():
                outputs = module(inputs.to(self.devices[0], non_blocking=True))
                loss = self.recipe.loss(outputs, targets)
            totals.add(loss, self.recipe.metric(outputs, targets), len(targets))
        module.train()

    def run_epoch(self, epoch: int, progress) -> None:
        sampler = self.train_data.sampler
        sampler.set_epoch(epoch)
        sampler.skip = self.step_in_epoch * self.samples_per_step  # resumed mid-epoch: skip what was trained on
        batches = iter(self.train_data)
        training, validation = Totals(self.devices[-1]), Totals(self.devices[-1])
        started = time.perf_counter()
        for step in range(self.step_in_epoch, self.steps_per_epoch):
            if self.global_step == self.crash_at:
                faults.crash(self.global_step)
            self.run_step(batches, training)
            if self.global_step == 0:
                self.log.debug(f"first optimizer step at {time.time():.6f}")
            self.global_step, self.step_in_epoch = self.global_step + 1, step + 1
            if progress is not None:
                progress.update(1)
            if step + 1 == self.steps_per_epoch:
                break  # the epoch's end saves and checks for a stop: a checkpoint never ends an epoch half-done
            if self.config.checkpoint_every and self.global_step % self.config.checkpoint_every == 0:
                self.save_mid_epoch(training)
            if self.global_step % STOP_CHECK_EVERY == 0 and self.stop_agreed():
                self.save_mid_epoch(training)
                raise StopRequested(self.stopped_at())
        seconds = time.perf_counter() - started
        self.validate(validation)
        sums = torch.cat([training.sums(), validation.sums()])  # one all-reduce for both
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)  # gloo cannot AVG reliably (nor bf16): sum fp64, then divide
        self.stop_if_not_finite(sums[0].item())
        self.epoch, self.step_in_epoch = epoch + 1, 0
        every = self.config.checkpoint_every
        stop = self.stop_agreed()
        if not every or self.global_step % every == 0 or stop:
            self.save()
        loss, metric, seen, val_loss, val_metric, val_seen = sums.tolist()
        name = self.recipe.METRIC
        row = {
            "epoch": self.epoch,
            "step": self.global_step,
            "loss": round(loss / seen, 6),
            name: round(metric / seen, 4),
            "val_loss": round(val_loss / max(val_seen, 1), 6),
            f"val_{name}": round(val_metric / max(val_seen, 1), 4),
            "lr": f"{self.scheduler.get_last_lr()[0]:.6g}",
            "samples_per_s": round(seen / seconds, 1) if seconds > 0 else math.inf,
            "resumed": int(self.resumed),
        }
        self.resumed = False
        if self.info.rank == 0:
            self.record_epoch(row, progress)
        if stop:
            raise StopRequested(self.stopped_at())

    def stopped_at(self) -> str:
        return (
            f"stopped at step {self.global_step} on SIGUSR1 (a time limit or preemption is near); the checkpoint "
            "is saved, and --resume auto continues from it"
        )

    def record_epoch(self, row: dict, progress) -> None:
        name = self.recipe.METRIC
        self.log.info(
            f"epoch {row['epoch']}/{self.config.epochs}  loss {row['loss']:.4f}  {name} {row[name]:.3f}  "
            f"val_loss {row['val_loss']:.4f}  val_{name} {row['val_' + name]:.3f}  ({row['samples_per_s']} samples/s)"
        )
        if progress is not None:
            progress.set_postfix(epoch=row["epoch"], loss=row["loss"], acc=row[name], samples_s=row["samples_per_s"])
        records.append_metrics(self.output_dir / records.METRICS, row)
        value, sign = row[self.config.best_metric], 1 if self.config.best_mode == "min" else -1
        if self.best is None or sign * value < sign * self.best[0]:
            self.best = (value, row["epoch"])
            checkpoint.save_atomic(
                {
                    "model": checkpoint.on_cpu(self.model.module.state_dict()),
                    "epoch": row["epoch"],
                    self.config.best_metric: value,
                },
                self.output_dir / "best.pt",
            )

    def fit(self) -> None:
        self.resume()
        if self.info.rank == 0:
            records.write_run_record(
                self.output_dir, self.run_id, self.info.world_size, restart_count(), vars(self.config)
            )
            self.log.info(
                f"run {self.run_id}: global batch {self.config.global_batch_size} = "
                f"{self.info.world_size} rank(s) x {self.config.accumulate_steps} micro-batch(es) x "
                f"{self.config.micro_batch}; output in {self.output_dir}"
            )
        progress = (
            progress_bar(self.total_steps, self.global_step) if self.info.rank == 0 and self.config.progress else None
        )
        try:
            for epoch in range(self.epoch, self.config.epochs):
                self.run_epoch(epoch, progress)
        finally:
            if progress is not None:
                progress.close()
        if self.info.rank == 0:
            checkpoint.save_atomic(
                {"model": checkpoint.on_cpu(self.model.module.state_dict())}, self.output_dir / "model.pt"
            )
            self.log.info(f"done: {self.global_step} steps; model saved to {self.output_dir / 'model.pt'}")
        dist.barrier()
