"""The engine's Trainer: one rank's loop over the objects a recipe built, as in PyTorch's DDP tutorial.

Read from fit() down: epochs, steps (micro-batches, gradient accumulation, mixed precision, clipping) and
validation on all ranks. What a checkpoint holds and how a run resumes is in state.py (Resumable); what an
epoch leaves behind (metrics.csv, best.pt, early stopping) in epochs.py (EpochRecords).
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

import torch
import torch.distributed as dist

from . import checkpoint, records, sharding
from .config import Config, precision_warning
from .epochs import EpochRecords
from .loaders import batches_of, map_tensors, order_of, samples_in, to_device
from .logs import progress_bar, show_training, shown_path
from .process_group import LaunchError, RankInfo, devices_for, reduction_device, restart_count
from .state import Resumable, lr_schedule
from .stopping import STOP_CHECK_EVERY, StopRequested, received
from .totals import Totals, all_reduced, validation_metrics


class NonFiniteLoss(RuntimeError):
    """The loss turned NaN or infinite; nothing after the last good checkpoint was saved."""


class Trainer(Resumable, EpochRecords):
    """One rank's training, given the objects the recipe built, as in PyTorch's DDP tutorial."""

    def __init__(self, model, train_data, val_data, optimizer, recipe, config: Config, info: RankInfo, log) -> None:
        self.model, self.train_data, self.val_data, self.optimizer = model, train_data, val_data, optimizer
        self.recipe, self.config, self.info, self.log = recipe, config, info, log
        self.devices = devices_for(config, info.local_rank)
        self.output_dir = Path(config.output_dir)
        self.samples_per_step = config.micro_batch * config.accumulate_steps  # per rank
        self.steps_per_epoch = len(order_of(train_data)) // self.samples_per_step
        if self.steps_per_epoch < 1:
            raise LaunchError(
                f"the training set gives each of {info.world_size} rank(s) {len(order_of(train_data))} samples, fewer "
                f"than one step's {self.samples_per_step}; lower global_batch_size or use more data"
            )
        self.total_steps = config.epochs * self.steps_per_epoch
        self.scheduler = lr_schedule(recipe, optimizer, config, self.total_steps)
        self.scaler = torch.amp.GradScaler("cuda", enabled=config.precision == "fp16")
        self.autocast_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(config.precision)
        self.epoch = self.step_in_epoch = self.global_step = 0
        self.run_id, self.best = "", None  # best: (value, epoch) of best_metric so far
        self.resumed = False  # marks the first epoch after a resume in metrics.csv (and the plot)
        # The recipe's optional functions; without them, (inputs, targets) batches with loss and metric.
        self.custom_steps = hasattr(recipe, "training_step")  # a flag, not a bound method: no cycle keeps self alive
        self.validation_step = getattr(recipe, "validation_step", None)
        self.parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
        # The epoch so far (a checkpoint mid-epoch carries it): training sums, gradient norms before clipping
        # (max_grad_norm > 0), seconds; and every finished epoch's metrics.csv row, the same on every rank.
        self.training = Totals(self.devices[-1])
        self.grad_norms: list[torch.Tensor] = []
        self.seconds = 0.0
        self.rows: list[dict] = []
        self.stop_vote = None  # (work, flag): the last mid-epoch stop check's all-reduce, still in flight

    def fit(self) -> None:
        self.resume()
        if self.info.rank == 0:
            records.write_run_record(
                self.output_dir, self.run_id, self.info.world_size, restart_count(), vars(self.config), self.global_step
            )
            trained = self.steps_per_epoch * self.config.global_batch_size  # of the training set: whole steps only
            dataset = len(order_of(self.train_data).dataset)
            for line in records.start_lines(self.run_id, self.config, self.info.world_size, trained, dataset):
                self.log.info(line)
            if warning := precision_warning(self.config):
                self.log.warning(warning)
        drawn = self.info.rank == 0 and self.config.progress
        progress = progress_bar(self.total_steps, self.schedule_position) if drawn else None
        try:
            for epoch in range(self.epoch, self.config.epochs):
                stop = self.early_stop_reason()
                if stop:
                    if self.info.rank == 0:
                        self.log.info(stop)
                    break
                self.run_epoch(epoch, progress)
        finally:
            if progress is not None:
                progress.close()
        weights = sharding.full_weights(self.model)  # every rank: under fsdp it gathers
        if self.info.rank == 0:
            final = {"model": weights, "epoch": self.epoch}
            checkpoint.save_atomic({**final, **self.what_it_is()}, self.output_dir / "model.pt")
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
                raise StopRequested(self.stopped_at(stop), stop)
        seconds = time.perf_counter() - started
        self.validate(validation)
        (trained, seen), (validated, val_seen) = all_reduced([training, validation])  # one all-reduce for both
        self.stop_if_not_finite(float(trained.get("loss", 0.0)))
        self.epoch, self.step_in_epoch = epoch + 1, 0
        row = self.epoch_row(trained, seen, validated, val_seen, seconds)
        self.rows.append(row)
        self.training, self.grad_norms, self.seconds, self.resumed = Totals(self.devices[-1]), [], 0.0, False
        improved = self.track_best(row)  # on every rank: the rows are equal, and early stopping needs it everywhere
        every = self.config.checkpoint_every
        stop = self.stop_agreed()
        if not every or self.global_step % every == 0 or stop or self.early_stop_reason():
            self.save()  # holds best (value, epoch) with this epoch's row counted
        weights = sharding.full_weights(self.model) if improved else None  # every rank: under fsdp it gathers
        if self.info.rank == 0:
            self.record_epoch(row, progress, weights)
        if stop:
            raise StopRequested(self.stopped_at(stop), stop)

    def run_step(self, batches, totals: Totals) -> None:
        """One optimizer step over accumulate_steps micro-batches; gradients are all-reduced on the last only."""
        self.optimizer.zero_grad(set_to_none=True)
        parts, step = self.config.accumulate_steps, self.custom_step if self.custom_steps else self.pair_step
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

    def pair_step(self, model, batch) -> tuple[torch.Tensor, dict, dict, int]:
        """A recipe without training_step: (inputs, targets) batches, `loss` and `metric`."""
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise TypeError(
                f"the recipe has no training_step, so each batch must be an (inputs, targets) pair, got a "
                f"{type(batch).__name__}{f' of {len(batch)}' if isinstance(batch, (tuple, list)) else ''}; define "
                "training_step(model, batch) in the recipe to take batches of any structure "
                "(docs/make-it-your-own.md)"
            )
        inputs, targets = batch
        targets = to_device(targets, self.devices[-1])
        outputs = model(to_device(inputs, self.devices[0]))
        loss = self.recipe.loss(outputs, targets)
        detached = outputs.detach() if isinstance(outputs, torch.Tensor) else map_tensors(outputs, torch.detach)
        return loss, {}, {self.recipe.METRIC: self.recipe.metric(detached, targets)}, samples_in(targets)

    def custom_step(self, model, batch) -> tuple[torch.Tensor, dict, dict, int]:
        """The recipe's training_step: the batch's mean loss, or (loss, {name: value to log})."""
        result = self.recipe.training_step(model, self.on_devices(batch))
        loss, logged = result if isinstance(result, tuple) else (result, {})
        logged = {name: value.detach() if isinstance(value, torch.Tensor) else value for name, value in logged.items()}
        return loss, logged, {}, samples_in(batch)

    def on_devices(self, batch):
        """The batch on this rank's device; an (inputs, targets) pair of the split model: targets on its last."""
        if len(self.devices) > 1 and isinstance(batch, (tuple, list)) and len(batch) == 2:
            return type(batch)((to_device(batch[0], self.devices[0]), to_device(batch[1], self.devices[-1])))
        return to_device(batch, self.devices[0])

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()  # entering a disabled autocast still costs time every step
        return torch.autocast(self.devices[-1].type, dtype=self.autocast_dtype)

    @torch.no_grad()
    def validate(self, totals: Totals) -> None:
        """This rank's share of the validation set, every sample exactly once over all ranks, scored with the
        weights and buffers rank 0 saves."""
        module = self.model.module
        self.take_rank_0_buffers(module)
        module.eval()  # no collectives from here: ranks may hold one sample more or less
        step = self.custom_step if self.custom_steps else self.pair_step
        with sharding.whole_for_validation(self.model):  # fsdp: gathered once, before the first batch
            for batch in batches_of(self.val_data):
                with self.autocast():
                    if self.validation_step is not None:
                        totals.add(samples_in(batch), {}, self.validation_step(module, self.on_devices(batch)))
                    else:
                        loss, logged, sums, samples = step(module, batch)
                        totals.add(samples, {"loss": loss, **logged}, sums)
        module.train()

    @staticmethod
    def take_rank_0_buffers(module) -> None:
        """Rank 0's buffers (BatchNorm's running statistics) on every rank, as DDP would copy them at the next
        training forward: after the last step each rank holds its own, updated by its own batches, while
        checkpoints, best.pt and model.pt hold rank 0's. Training is unchanged; validation scores what is saved."""
        for buffer in module.buffers():
            sent = buffer.to(reduction_device(buffer.device))
            dist.broadcast(sent, src=0)
            buffer.copy_(sent)  # nothing to copy where the buffer is on that device already

    def evaluate(self) -> dict[str, float]:
        """The validation metrics of the model as it is, over all ranks (what each epoch's val_ columns hold)."""
        totals = Totals(self.devices[-1])
        self.validate(totals)
        ((sums, samples),) = all_reduced([totals])
        return {"samples": samples, **validation_metrics(self.recipe, sums, samples)}

    def save_mid_epoch(self, started: float) -> None:
        self.seconds = time.perf_counter() - started
        so_far = self.training.fold().get("loss", torch.zeros((), dtype=torch.float64, device=self.devices[-1]))
        so_far = so_far.reshape(1).to(reduction_device(so_far.device), copy=True)
        dist.all_reduce(so_far, op=dist.ReduceOp.SUM)
        self.stop_if_not_finite(so_far.item())
        self.save()

    def stop_voted(self) -> int:
        """The stop signal any rank had got by the previous check (0: none); this check's vote goes out.

        The vote is an all-reduce left in flight until the next check, so no step waits for it; every rank
        reads the same result at the same step, so all still stop together, at most two checks after the signal.
        """
        stop = self.settled_vote()
        if not stop:
            flag = torch.tensor([float(received())], device=reduction_device(self.devices[-1]))
            self.stop_vote = dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True), flag
        return stop

    def settled_vote(self) -> int:
        if self.stop_vote is None:
            return 0
        (work, flag), self.stop_vote = self.stop_vote, None
        work.wait()
        return int(flag.item())

    def stop_agreed(self) -> int:
        """The stop signal any rank got (0: none), agreed now: one tiny all-reduce, waited for (an epoch's end)."""
        self.settled_vote()  # a signal it counted, received() still returns
        flag = torch.tensor([float(received())], device=reduction_device(self.devices[-1]))
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    def stop_if_not_finite(self, loss_sum: float) -> None:
        """Given the loss summed over all ranks: a NaN or inf on any rank made it NaN or inf. Every rank calls this
        with the same sum, so all of them find the step where it first appeared."""
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
