"""The Trainer: one rank's training, read from fit() down to run_step(), and its state for exact resume."""

from __future__ import annotations

import contextlib
import functools
import math
import time
from pathlib import Path

import torch
import torch.distributed as dist

from . import checkpoint, recipes, records, resuming, saving, scalars, sharding, streams
from .config import precision_warning
from .context import RankContext
from .loaders import batches_of, order_of, samples_in
from .logs import epoch_line, progress_bar, show_epoch, show_training, shown_path
from .process_group import LaunchError, reduction_device, restart_count
from .recipes import lr_schedule
from .stopping import STOP_CHECK_EVERY, StopRequested, received, stopped_at
from .totals import Totals, all_reduced, validation_metrics


class NonFiniteLoss(RuntimeError):
    """The loss turned NaN or infinite; nothing after the last good checkpoint was saved."""


class Trainer:
    """One rank's training, given the objects the recipe built; follows torch.distributed.checkpoint's Stateful."""

    def __init__(self, context: RankContext, model, optimizer, train_data, val_data) -> None:
        self.context, self.model, self.optimizer, self.train_data, self.val_data = (
            context, model, optimizer, train_data, val_data
        )  # fmt: skip
        self.config, self.devices, self.recipe, self.log = context.config, context.devices, context.recipe, context.log
        config = self.config
        self.output_dir = Path(config.output_dir)
        self.samples_per_step = config.micro_batch * config.accumulate_steps  # per rank
        self.steps_per_epoch = len(order_of(train_data)) // self.samples_per_step
        if self.steps_per_epoch < 1:
            raise LaunchError(
                f"the training set gives each of {context.world_size} rank(s) {len(order_of(train_data))} samples, "
                f"fewer than one step's {self.samples_per_step}; lower global_batch_size or use more data"
            )
        self.total_steps = config.epochs * self.steps_per_epoch
        self.scheduler = lr_schedule(self.recipe, optimizer, config, self.total_steps)
        self.scaler = torch.amp.GradScaler("cuda", enabled=config.precision == "fp16")
        self.autocast_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(config.precision)
        self.epoch = self.step_in_epoch = self.global_step = 0
        self.run_id, self.best, self.resumed = "", None, False  # best: (value, epoch) of best_metric so far
        # The recipe's optional functions; without them, (inputs, targets) batches with loss and metric.
        # A partial of module functions, not a bound method: no cycle keeps the trainer (and its group) alive.
        step = recipes.custom_step if hasattr(self.recipe, "training_step") else recipes.pair_step
        self.loss_of = functools.partial(step, self.recipe, self.devices)
        self.validation_step = getattr(self.recipe, "validation_step", None)
        self.parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
        # The epoch so far (a checkpoint mid-epoch carries it): training sums, gradient norms before clipping
        # (max_grad_norm > 0), seconds; and every finished epoch's metrics.csv row, the same on every rank.
        self.training, self.grad_norms, self.seconds = Totals(self.devices[-1]), [], 0.0
        self.rows: list[dict] = []
        self.stop_vote = None  # (work, flag): the last mid-epoch stop check's all-reduce, still in flight

    def fit(self) -> None:
        self.resume()
        config, is_main = self.config, self.context.is_main
        if is_main:
            world_size = self.context.world_size
            records.write_run_record(
                self.output_dir, self.run_id, world_size, restart_count(), vars(config), self.global_step
            )
            trained = self.steps_per_epoch * config.global_batch_size  # of the training set: whole steps only
            dataset = len(order_of(self.train_data).dataset)
            for line in records.start_lines(self.run_id, config, world_size, trained, dataset):
                self.log.info(line)
            if warning := precision_warning(config):
                self.log.warning(warning)
        progress = progress_bar(self.total_steps, self.schedule_position) if is_main and config.progress else None
        with progress if progress is not None else contextlib.nullcontext():  # the bar closed, however it ends
            for epoch in range(self.epoch, config.epochs):
                stop = records.early_stop_reason(self.best, self.epoch, config)
                if stop:
                    if is_main:
                        self.log.info(stop)
                    break
                self.run_epoch(epoch, progress)
        weights = sharding.full_weights(self.model)  # every rank: under fsdp it gathers
        if is_main:
            saving.save_weights(weights, self.output_dir / "model.pt", config, epoch=self.epoch)
            self.log.info(f"done: {self.global_step} steps; model saved to {shown_path(self.output_dir / 'model.pt')}")
        dist.barrier()

    def run_epoch(self, epoch: int, progress) -> None:
        show_training(progress, epoch + 1, self.config.epochs, self.rows[-1] if self.rows else None)
        order = order_of(self.train_data)
        order.set_epoch(epoch)
        order.skip = self.step_in_epoch * self.samples_per_step  # resumed mid-epoch: skip what was trained on
        batches = batches_of(self.train_data)
        training, validation = self.training, Totals(self.devices[-1])
        started = time.perf_counter() - self.seconds
        for step in range(self.step_in_epoch, self.steps_per_epoch):
            self.run_step(batches, training)
            if self.global_step == 0:
                self.log.debug(f"first optimizer step at {time.time():.6f}")
            self.global_step, self.step_in_epoch = self.global_step + 1, step + 1
            if progress is not None:
                progress.update(1)
            if step + 1 == self.steps_per_epoch:
                break  # the epoch's end saves and checks for a stop: a checkpoint never ends an epoch half-done
            if self.config.checkpoint_every and self.global_step % self.config.checkpoint_every == 0:
                self.save_mid_epoch(started)
            if self.global_step % STOP_CHECK_EVERY == 0 and (stop := self.stop_voted()):
                self.save_mid_epoch(started)
                raise StopRequested(stopped_at(stop, self.global_step), stop)
        seconds = time.perf_counter() - started
        self.validate(validation)
        (trained, seen), (validated, val_seen) = all_reduced([training, validation])  # one all-reduce for both
        self.stop_if_not_finite(float(trained.get("loss", 0.0)))
        self.epoch, self.step_in_epoch = epoch + 1, 0
        validated = validation_metrics(self.recipe, validated, val_seen)
        lr = float(self.scheduler.get_last_lr()[0])
        row = records.epoch_row(self.epoch, self.global_step, trained, seen, validated, lr, self.grad_norms, seconds)
        row["resumed"] = int(self.resumed)  # marks the first epoch after a resume (and the plot)
        self.rows.append(row)
        self.training, self.grad_norms, self.seconds, self.resumed = Totals(self.devices[-1]), [], 0.0, False
        # On every rank: the rows are equal, and early stopping needs best everywhere.
        improved = records.new_best(self.best, row, self.config)
        self.best = improved or self.best
        every = self.config.checkpoint_every
        stop = self.stop_voted(wait=True)
        early = records.early_stop_reason(self.best, self.epoch, self.config)
        if not every or self.global_step % every == 0 or stop or early:
            self.save()  # holds best (value, epoch) with this epoch's row counted
        weights = sharding.full_weights(self.model) if improved else None  # every rank: under fsdp it gathers
        if self.context.is_main:
            self.record_epoch(row, progress, weights)
        if stop:
            raise StopRequested(stopped_at(stop, self.global_step), stop)

    def run_step(self, batches, totals: Totals) -> None:
        """One optimizer step over accumulate_steps micro-batches; gradients are all-reduced on the last only."""
        self.optimizer.zero_grad(set_to_none=True)
        parts, step = self.config.accumulate_steps, self.loss_of
        for micro in range(parts):
            with contextlib.nullcontext() if micro == parts - 1 else self.model.no_sync():
                with self.autocast():
                    loss, logged, sums, samples = step(self.model, next(batches))
                self.scaler.scale(loss if parts == 1 else loss / parts).backward()
            totals.add(samples, {"loss": loss.detach(), **logged}, sums)  # detached: no graph kept alive
        if self.config.max_grad_norm:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the fp16-scaled ones
            # The gradients are all-reduced, so every rank computes the same norm; over both devices of a split model.
            self.grad_norms.append(sharding.clip_grad_norm(self.parameters, self.config.max_grad_norm))
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()  # entering a disabled autocast still costs time every step
        return torch.autocast(self.devices[-1].type, dtype=self.autocast_dtype)

    @torch.no_grad()
    def validate(self, totals: Totals) -> None:
        """This rank's share of the validation set, scored with rank 0's buffers (BatchNorm's statistics), as saved."""
        module = self.model.module
        for buffer in module.buffers():
            sent = buffer.to(reduction_device(buffer.device))
            dist.broadcast(sent, src=0)
            buffer.copy_(sent)  # nothing to copy where the buffer is on that device already
        module.eval()  # no collectives from here: ranks may hold one sample more or less
        with sharding.whole_for_validation(self.model):  # fsdp: gathered once, before the first batch
            for batch in batches_of(self.val_data):
                with self.autocast():
                    if self.validation_step is not None:
                        batch = recipes.on_devices(batch, self.devices)
                        totals.add(samples_in(batch), {}, self.validation_step(module, batch))
                    else:
                        loss, logged, sums, samples = self.loss_of(module, batch)
                        totals.add(samples, {"loss": loss, **logged}, sums)
        module.train()

    def evaluate(self) -> dict[str, float]:
        """The validation metrics of the model as it is, over all ranks (what each epoch's val_ columns hold)."""
        totals = Totals(self.devices[-1])
        self.validate(totals)
        ((sums, samples),) = all_reduced([totals])
        return {"samples": samples, **validation_metrics(self.recipe, sums, samples)}

    def record_epoch(self, row: dict, progress, weights: dict | None) -> None:
        """Rank 0: the log line, the progress bar, metrics.csv (and TensorBoard's copy), and best.pt where `weights`."""
        self.log.info(epoch_line(row, self.config.epochs))
        show_epoch(progress, row, self.config.epochs)
        lost = records.write_metrics(self.output_dir / records.METRICS, self.rows, len(self.rows) - 1)
        if lost:
            self.log.warning(lost)
        if self.config.tensorboard:
            scalars.write(self.output_dir, row)
        if weights is not None:
            best = {"epoch": row["epoch"], self.config.best_metric: row[self.config.best_metric]}
            saving.save_weights(weights, self.output_dir / "best.pt", self.config, **best)

    def state_dict(self) -> dict:
        """All that exact resume needs. A collective: each rank's random streams and epoch so far go to every rank."""
        ranks: list = [None] * self.context.world_size
        so_far = {"totals": self.training.state_dict(), "grad_norms": [norm.cpu() for norm in self.grad_norms]}
        dist.all_gather_object(ranks, (streams.state(self.devices), {**so_far, "seconds": self.seconds}))
        return {
            "run_id": self.run_id,
            **sharding.training_state(self.model, self.optimizer),  # ddp: whole, on rank 0; fsdp: each rank's shards
            "scheduler": self.scheduler.state_dict(),
            "total_steps": self.total_steps,
            "scaler": self.scaler.state_dict(),
            "rng": [rng for rng, _ in ranks],
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "global_step": self.global_step,
            "best": self.best,
            "rows": self.rows,
            "epoch_so_far": [so_far for _, so_far in ranks],
            # The epoch's order is a function of (seed, epoch, num_replicas); position: samples taken, per rank.
            "sampler": {
                "seed": self.config.seed,
                "epoch": self.epoch,
                "num_replicas": self.context.world_size,
                "position": self.step_in_epoch * self.samples_per_step,
            },
            **records.what_it_is(self.config),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state_dict()`'s contents, with the settings this run changed in effect from here on."""
        rank, world_size, log = self.context.rank, self.context.world_size, self.log
        # This run's hyperparameters (lr, momentum, ...), before the saved ones replace them.
        chosen = [
            {key: value for key, value in group.items() if key != "params"} for group in self.optimizer.param_groups
        ]
        sharding.load_weights(self.model, state["model"])
        sharding.load_optimizer_state(self.model, self.optimizer, state["optimizer"])
        resuming.restore_scaler(self.scaler, state["config"]["precision"], self.config.precision, state["scaler"], log)
        self.epoch, self.step_in_epoch, self.global_step = state["epoch"], state["step_in_epoch"], state["global_step"]
        self.best, self.rows, self.resumed = state["best"], state["rows"], True
        if self.step_in_epoch:  # the epoch's row goes on from each rank's saved sums
            own = resuming.own_part(state["epoch_so_far"], rank, world_size)
            self.training.load_state_dict(own["totals"])
            self.grad_norms = [norm.to(self.devices[-1]) for norm in own["grad_norms"]]
            self.seconds = own["seconds"]
        if len(state["rng"]) == world_size:
            streams.set_state(state["rng"][rank], self.devices)
        for warning in resuming.layout_warnings(state, self.config, world_size):
            log.warning(warning)
        resuming.apply_settings(self, state, chosen)

    @property
    def schedule_position(self) -> int:
        """The schedule's steps that the samples trained so far make in this run's batch (global_step: steps taken)."""
        return self.epoch * self.steps_per_epoch + self.step_in_epoch

    def resume(self) -> None:
        """Continue from the checkpoint rank 0 picks, if any, with its run's identity."""
        path, state, self.run_id = saving.starting_point(self.context, self.model, self.optimizer)
        if path is None:
            return
        self.load_state_dict(state)
        if self.context.is_main:  # rows of epochs after the checkpoint go: those epochs are trained again
            lost = records.write_metrics(self.output_dir / records.METRICS, self.rows, len(self.rows))
            if lost:
                self.log.warning(lost)
        epochs, where = self.config.epochs, f"continuing at epoch {self.epoch + 1}/{self.config.epochs}"
        if self.epoch >= epochs:
            where = f"all {epochs} epochs were already trained"
        elif self.step_in_epoch:
            where += f", step {self.step_in_epoch + 1}/{self.steps_per_epoch}"
        in_output = path.parent.resolve() == checkpoint.directory(self.output_dir).resolve()
        self.log.info(f"resumed from {path.name if in_output else shown_path(path)}: {where}")

    def save(self) -> None:
        """A step checkpoint, in the run's format: every rank takes part, and none runs ahead of it."""
        saving.save_step(self.state_dict(), self.config, sharding.is_sharded(self.model), self.log.warning)

    def save_mid_epoch(self, started: float) -> None:
        self.seconds = time.perf_counter() - started
        so_far = self.training.fold().get("loss", torch.zeros((), dtype=torch.float64, device=self.devices[-1]))
        so_far = so_far.reshape(1).to(reduction_device(so_far.device), copy=True)
        dist.all_reduce(so_far, op=dist.ReduceOp.SUM)
        self.stop_if_not_finite(so_far.item())
        self.save()

    def stop_voted(self, wait: bool = False) -> int:
        """The stop signal any rank got (0: none): mid-epoch by the previous check, whose vote no step waited for; at an
        epoch's end (`wait`) by now."""
        if self.stop_vote is not None:
            (work, flag), self.stop_vote = self.stop_vote, None
            work.wait()
            if int(flag.item()) and not wait:
                return int(flag.item())
        flag = torch.tensor([float(received())], device=reduction_device(self.devices[-1]))
        work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=not wait)
        if wait:
            return int(flag.item())
        self.stop_vote = work, flag
        return 0

    def stop_if_not_finite(self, loss_sum: float) -> None:
        """Given the loss summed over all ranks (NaN or inf if any rank's was), every rank finds where it first was."""
        if not self.config.stop_on_nonfinite_loss or math.isfinite(loss_sum):
            return
        first = self.training.first_nonfinite
        home = reduction_device(self.devices[-1])
        batch = torch.tensor(torch.iinfo(torch.int64).max, device=home) if first is None else first.to(home, copy=True)
        dist.all_reduce(batch, op=dist.ReduceOp.MIN)
        step_in_epoch = int(batch.item()) // self.config.accumulate_steps
        first_at = f", first at step {self.global_step - self.step_in_epoch + step_in_epoch + 1}"
        kept = checkpoint.existing(self.output_dir, self.run_id)
        newest = f"the newest good checkpoint is {kept[0]}" if kept else "no checkpoint was saved before it"
        raise NonFiniteLoss(
            f"the loss became {loss_sum} by step {self.global_step} (epoch {self.epoch + 1})"
            f"{first_at if step_in_epoch < self.step_in_epoch else ''}; stopped without saving, and {newest}. "
            "Lower --lr, check the data for NaN/inf, or set stop_on_nonfinite_loss = false to train on"
        )
