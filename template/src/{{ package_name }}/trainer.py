"""The engine's Trainer: one rank's loop over the objects a recipe built, as in PyTorch's DDP tutorial.

It owns what every recipe needs done the same way: micro-batches and gradient accumulation,
mixed precision, validation on all ranks, checkpoints with exact resume, best.pt, metrics.csv.
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from . import checkpoint, records, rng, scalars
from .config import Config
from .distributed import STOP_SIGNALS, LaunchError, RankInfo, devices_for, restart_count
from .loaders import map_tensors, samples_in, to_device
from .logs import epoch_line, progress_bar, show_epoch, shown_path, start_lines


class NonFiniteLoss(RuntimeError):
    """The loss turned NaN or infinite; nothing after the last good checkpoint was saved."""


# A STOP_SIGNALS signal asks for a clean stop: Slurm's SIGUSR1 before a time limit or a preemption
# (--signal=USR1@90), SIGTERM from docker stop, Kubernetes or a process manager, Ctrl+Break on Windows.
# The ranks agree every STOP_CHECK_EVERY steps and at each epoch's end, save a checkpoint and exit with
# STOPPED (SIGUSR1) or TERMINATED (the others).
STOP_CHECK_EVERY = 16
_stop_signal = 0  # the signal this rank received (0: none)


class StopRequested(Exception):
    """Every rank stopped on a stop signal after saving a checkpoint."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


def _request_a_stop(signum, frame) -> None:
    global _stop_signal
    _stop_signal = max(_stop_signal, signum)


def listen_for_stop_requests(signals: tuple[int, ...] = STOP_SIGNALS) -> None:
    for signum in signals:
        signal.signal(signum, _request_a_stop)


class Totals:
    """What a recipe reports per batch, summed over batches in fp64, without a device sync per batch.

    `means` are the batch's per-sample means (the loss, values a training_step logs): weighted by the batch's
    samples. `sums` are sums already (metric(), validation_step's counts), of any shape. A batch costs one
    append; the batches wait, detached, and are folded when asked (and every 1024 batches): one stack per name.
    Every batch reports the same names.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.folded: dict[str, torch.Tensor] = {}
        self.samples = torch.zeros((), dtype=torch.float64, device=device)
        self.waiting: list[tuple[int, dict, dict]] = []

    def add(self, samples: int, means: dict, sums: dict) -> None:
        self.waiting.append((samples, means, sums))
        if len(self.waiting) == 1024:
            self.fold()

    def fold(self) -> dict[str, torch.Tensor]:
        """{name: sum so far} (a mean times its batch's samples); `self.samples` the samples so far."""
        if self.waiting:
            counts = torch.tensor([batch[0] for batch in self.waiting], dtype=torch.float64, device=self.device)
            for position, weighted in ((1, True), (2, False)):
                for name in self.waiting[0][position]:
                    values = stacked([batch[position][name] for batch in self.waiting], self.device)
                    total = values @ counts if weighted else values.sum(0)
                    self.folded[name] = self.folded.get(name, 0) + total
            self.samples += counts.sum()
            self.waiting = []
        return self.folded

    def layout(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(name, tuple(value.shape)) for name, value in self.fold().items()]


def stacked(values: list, device: torch.device) -> torch.Tensor:
    """Reported values (tensors of one shape, or Python numbers) as one fp64 tensor on `device`."""
    try:
        together = torch.stack(values)  # the common case: tensors on one device
    except (TypeError, RuntimeError):  # numbers, or tensors on the two devices of a split model
        together = torch.stack([torch.as_tensor(value).to(device) for value in values])
    return together.to(device, torch.float64)


def all_reduced(totals: list[Totals]) -> list[tuple[dict[str, torch.Tensor], float]]:
    """Every rank's totals summed over all ranks in fp64, in one all-reduce: [({name: sum}, samples), ...].

    The names and shapes come from every rank (a rank may have had no validation batch), so all ranks
    pack the same vector; gloo cannot AVG reliably (nor bf16): sum fp64 here, divide later.
    """
    layouts: list = [None] * dist.get_world_size()
    dist.all_gather_object(layouts, [part.layout() for part in totals])
    merged = [dict(kv for layout in layouts for kv in layout[index]) for index in range(len(totals))]
    device = totals[0].device
    pieces = []
    for part, names in zip(totals, merged):
        for name, shape in names.items():
            value = part.folded.get(name)
            pieces.append(value.reshape(-1) if value is not None else torch.zeros(math.prod(shape), device=device))
        pieces.append(part.samples.reshape(1))
    flat = torch.cat([piece.double() for piece in pieces])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    results, start = [], 0
    for names in merged:
        sums = {}
        for name, shape in names.items():
            size = math.prod(shape)
            sums[name] = flat[start : start + size].reshape(shape).cpu()
            start += size
        results.append((sums, float(flat[start])))
        start += 1
    return results


def validation_metrics(recipe, sums: dict[str, torch.Tensor], samples: float) -> dict[str, float]:
    """Each scalar sum per sample (the loss, metric()'s count), then what the recipe's metrics(sums) computes."""
    values = {name: float(total) / max(samples, 1) for name, total in sums.items() if total.dim() == 0}
    if hasattr(recipe, "metrics"):  # from the global sums: exact for any world size and batch size
        found = recipe.metrics({**sums, "samples": torch.tensor(samples, dtype=torch.float64)})
        values.update({name: float(value) for name, value in found.items()})
    return values


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
        # The recipe's optional functions; without them, (inputs, targets) batches with loss and metric.
        self.custom_steps = hasattr(recipe, "training_step")  # a flag, not a bound method: no cycle keeps self alive
        self.validation_step = getattr(recipe, "validation_step", None)
        self.parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
        self.grad_norms: list[torch.Tensor] = []  # this epoch's, before clipping (max_grad_norm > 0)

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
        # The start line names the output folder: a checkpoint in it is named by its file name alone.
        picked_path = Path(picked[0])
        in_output = picked_path.parent.resolve() == checkpoint.directory(self.output_dir).resolve()
        shown = picked_path.name if in_output else shown_path(picked_path)
        self.log.info(f"resumed from {shown}: {self.where_training_continues()}")

    def where_training_continues(self) -> str:
        if self.epoch >= self.config.epochs:
            return f"all {self.config.epochs} epochs were already trained"
        if self.step_in_epoch:
            return (
                f"continuing at epoch {self.epoch + 1}/{self.config.epochs}, "
                f"step {self.step_in_epoch + 1}/{self.steps_per_epoch}"
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
        so_far = training.fold().get("loss", torch.zeros((), dtype=torch.float64, device=self.devices[-1]))
        so_far = so_far.reshape(1).clone()
        dist.all_reduce(so_far, op=dist.ReduceOp.SUM)
        self.stop_if_not_finite(so_far.item())
        self.save()

    def stop_agreed(self) -> int:
        """The stop signal any rank got (0: none): all ranks must stop at the same step (one tiny all-reduce)."""
        flag = torch.tensor([float(_stop_signal)], device=self.devices[-1])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

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

    def on_devices(self, batch):
        """The batch on this rank's device; an (inputs, targets) pair of the split model: targets on its last."""
        if len(self.devices) > 1 and isinstance(batch, (tuple, list)) and len(batch) == 2:
            return type(batch)((to_device(batch[0], self.devices[0]), to_device(batch[1], self.devices[-1])))
        return to_device(batch, self.devices[0])

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
            self.grad_norms.append(torch.nn.utils.clip_grad_norm_(self.parameters, self.config.max_grad_norm))
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()

    @torch.no_grad()
    def validate(self, totals: Totals) -> None:
        """This rank's share of the validation set, every sample exactly once over all ranks."""
        module = self.model.module  # no collectives: ranks may hold one sample more or less
        module.eval()
        step = self.custom_step if self.custom_steps else self.pair_step
        for batch in self.val_data:
            with self.autocast():
                if self.validation_step is not None:
                    totals.add(samples_in(batch), {}, self.validation_step(module, self.on_devices(batch)))
                else:
                    loss, logged, sums, samples = step(module, batch)
                    totals.add(samples, {"loss": loss, **logged}, sums)
        module.train()

    def evaluate(self) -> dict[str, float]:
        """The validation metrics of the model as it is, over all ranks (what each epoch's val_ columns hold)."""
        totals = Totals(self.devices[-1])
        self.validate(totals)
        ((sums, samples),) = all_reduced([totals])
        return {"samples": samples, **validation_metrics(self.recipe, sums, samples)}

    def run_epoch(self, epoch: int, progress) -> None:
        sampler = self.train_data.sampler
        sampler.set_epoch(epoch)
        sampler.skip = self.step_in_epoch * self.samples_per_step  # resumed mid-epoch: skip what was trained on
        batches = iter(self.train_data)
        training, validation = Totals(self.devices[-1]), Totals(self.devices[-1])
        started = time.perf_counter()
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
                self.save_mid_epoch(training)
            if self.global_step % STOP_CHECK_EVERY == 0 and (stop := self.stop_agreed()):
                self.save_mid_epoch(training)
                raise StopRequested(self.stopped_at(stop), stop)
        seconds = time.perf_counter() - started
        self.validate(validation)
        (trained, seen), (validated, val_seen) = all_reduced([training, validation])  # one all-reduce for both
        self.stop_if_not_finite(float(trained.get("loss", 0.0)))
        self.epoch, self.step_in_epoch = epoch + 1, 0
        row = self.epoch_row(trained, seen, validated, val_seen, seconds)
        self.resumed = False
        improved = self.track_best(row)  # on every rank: the rows are equal, and early stopping needs it everywhere
        every = self.config.checkpoint_every
        stop = self.stop_agreed()
        if not every or self.global_step % every == 0 or stop or self.early_stop_reason():
            self.save()  # holds best (value, epoch) with this epoch's row counted
        if self.info.rank == 0:
            self.record_epoch(row, progress, improved)
        if stop:
            raise StopRequested(self.stopped_at(stop), stop)

    def epoch_row(self, trained: dict, seen: float, validated: dict, val_seen: float, seconds: float) -> dict:
        """The epoch's metrics.csv row: training means, validation metrics, lr, grad_norm, speed."""
        row = {"epoch": self.epoch, "step": self.global_step}
        for name, total in trained.items():
            row[name] = round(float(total) / max(seen, 1), 6 if name == "loss" else 4)
        for name, value in validation_metrics(self.recipe, validated, val_seen).items():
            row[f"val_{name}"] = round(float(value), 6 if name == "loss" else 4)
        row["lr"] = f"{self.scheduler.get_last_lr()[0]:.6g}"
        if self.grad_norms:
            norms = torch.stack(self.grad_norms).double()
            row["grad_norm"] = round(float(norms[norms.isfinite()].mean()), 6)  # fp16 overflow steps are skipped
            self.grad_norms = []
        row["samples_per_s"] = round(seen / seconds, 1) if seconds > 0 else math.inf
        row["resumed"] = int(self.resumed)
        return row

    def track_best(self, row: dict) -> bool:
        """Whether this epoch's best_metric is the best so far (the first epoch on a tie); updates self.best."""
        name = self.config.best_metric
        if name not in row:
            columns = [column for column in row if column not in ("epoch", "step", "lr", "samples_per_s", "resumed")]
            raise LaunchError(
                f"best_metric {name!r} is not a metrics.csv column; this recipe's columns are {', '.join(columns)}"
            )
        value, sign = row[name], 1 if self.config.best_mode == "min" else -1
        if self.best is None or sign * value < sign * self.best[0]:
            self.best = (value, row["epoch"])
            return True
        return False

    def early_stop_reason(self) -> str | None:
        """Why training ends now: best_metric has not improved for early_stop_patience epochs (None: go on)."""
        patience = self.config.early_stop_patience
        if not patience or self.best is None or self.epoch - self.best[1] < patience:
            return None
        value, epoch = self.best
        return (
            f"stopped early after epoch {self.epoch}: {self.config.best_metric} has not improved for {patience} "
            f"epoch(s)\nbest.pt holds epoch {epoch} ({self.config.best_metric} {value}), model.pt epoch {self.epoch}"
        )

    def stopped_at(self, signum: int) -> str:
        name = signal.Signals(signum).name
        why = "a time limit or preemption is near" if name == "SIGUSR1" else "asked to stop"
        return (
            f"stopped at step {self.global_step} on {name} ({why}); the checkpoint is saved, and --resume auto "
            "continues from it"
        )

    def record_epoch(self, row: dict, progress, improved: bool) -> None:
        """Rank 0: the log line, the progress bar, metrics.csv (and TensorBoard's copy) and best.pt."""
        self.log.info(epoch_line(row, self.config.epochs))
        show_epoch(progress, row, self.config.epochs)
        records.append_metrics(self.output_dir / records.METRICS, row)
        if self.config.tensorboard:
            scalars.write(self.output_dir, row)
        if improved:
            name = self.config.best_metric
            best = {"model": checkpoint.on_cpu(self.model.module.state_dict()), "epoch": row["epoch"], name: row[name]}
            checkpoint.save_atomic(best, self.output_dir / "best.pt")

    def fit(self) -> None:
        self.resume()
        if self.info.rank == 0:
            records.write_run_record(
                self.output_dir, self.run_id, self.info.world_size, restart_count(), vars(self.config)
            )
            for line in start_lines(self.run_id, self.config, self.info.world_size):
                self.log.info(line)
        progress = (
            progress_bar(self.total_steps, self.global_step) if self.info.rank == 0 and self.config.progress else None
        )
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
        if self.info.rank == 0:
            checkpoint.save_atomic(
                {"model": checkpoint.on_cpu(self.model.module.state_dict())}, self.output_dir / "model.pt"
            )
            self.log.info(f"done: {self.global_step} steps; model saved to {shown_path(self.output_dir / 'model.pt')}")
        dist.barrier()
