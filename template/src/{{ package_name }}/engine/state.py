"""Everything exact resume needs: the checkpoint's contents, every random stream, the sampler's position and the
starting point; Trainer (trainer.py) takes these methods from Resumable.

Every random stream a rank uses (python, numpy, torch, CUDA) is seeded, saved and restored exactly.
"""

from __future__ import annotations

import random
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from . import checkpoint, records, sharding
from .config import MOVED_TO_RECIPE, SETTING_NAMES
from .logs import shown_path


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def lr_schedule(recipe, optimizer: torch.optim.Optimizer, config, total_steps: int):
    """The recipe's schedule(), an optional hook: without it the learning rate stays constant."""
    if hasattr(recipe, "schedule"):
        return recipe.schedule(optimizer, config, total_steps)
    return torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)


def roles(devices: tuple[torch.device, ...]) -> dict[str, torch.device]:
    """This rank's CUDA devices by their role in the engine ("devices[0]" takes the inputs, "devices[-1]" the
    targets), not by index: the same role finds its device on a machine that numbers or counts GPUs otherwise."""
    named = {"devices[0]": devices[0], **({"devices[-1]": devices[-1]} if devices[-1] != devices[0] else {})}
    return {role: device for role, device in named.items() if device.type == "cuda"}


def state(devices: tuple[torch.device, ...]) -> dict:
    """This process's random streams as tensors and plain values (loadable with weights_only=True).

    CUDA's only for this rank's own GPUs, and only when it trains on them: a CPU run never starts CUDA here.
    """
    kind, keys, position, has_gauss, cached = np.random.get_state()
    found = {
        "python": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    own = roles(devices)
    if own:
        found["cuda"] = {role: torch.cuda.get_rng_state(device) for role, device in own.items()}
    return found


def cuda_states_for(saved, devices: tuple[torch.device, ...]) -> list[tuple[torch.device, torch.Tensor]]:
    """(device, state) pairs to restore: each saved role on this rank's device of that role.

    A role this rank does not have (a split model resumed as plain DDP) is left at its seed.
    """
    return [(device, saved[role]) for role, device in roles(devices).items() if role in (saved or {})]


def set_state(saved: dict, devices: tuple[torch.device, ...]) -> None:
    random.setstate(tuple(x if not isinstance(x, list) else tuple(x) for x in saved["python"]))
    numpy = saved["numpy"]
    np.random.set_state(
        ("MT19937", numpy["keys"].numpy().astype(np.uint32), numpy["position"], numpy["has_gauss"], numpy["cached"])
    )
    torch.set_rng_state(saved["torch"])
    for device, cuda_state in cuda_states_for(saved.get("cuda"), devices):
        torch.cuda.set_rng_state(cuda_state, device)


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


# What a resume changes, and how, is in docs/checkpoints.md. These reshape the schedule, as [recipe] settings do;
# seed, and a batch change mid-epoch, are refused before the ranks meet (rank.unresumable).
RESHAPE_THE_SCHEDULE = ("epochs", "global_batch_size", "accumulate_steps")
# Where and how a run is launched and watched, not what it trains; precision says itself (restore_scaler).
NOT_TRAINING = {"resume", "overwrite", "output_dir", "master_addr", "master_port", "node_rank", "progress", "precision"}


def changed_settings(saved: dict, current: dict) -> dict[str, tuple]:
    """{name: (saved value, this run's)} of every engine and [recipe] setting that differs ("unset": not there).

    An engine setting that an earlier version's checkpoint lacks counts as unchanged; its [recipe] settings may be
    engine settings of that time (MOVED_TO_RECIPE)."""
    changed = {}
    for name in SETTING_NAMES:
        if name in saved and name not in NOT_TRAINING and saved[name] != current[name]:
            changed[name] = (saved[name], current[name])
    then = {**{name: saved[name] for name in MOVED_TO_RECIPE if name in saved}, **saved.get("settings", {})}
    now = current["settings"]
    for name in [*now, *(name for name in then if name not in now)]:
        if then.get(name, "unset") != now.get(name, "unset"):
            changed[name] = (then.get(name, "unset"), now.get(name, "unset"))
    return changed


class Resumable:
    """The Trainer's checkpoint contents, and a resume from them (every rank loads what rank 0 picked)."""

    def state(self) -> dict:
        # Every rank's own random streams and epoch so far, in one collective: every rank calls state().
        ranks: list = [None] * self.info.world_size
        dist.all_gather_object(ranks, (state(self.devices), self.epoch_so_far()))
        return {
            "run_id": self.run_id,
            # Whole, in ddp's format, on rank 0 (it writes): under fsdp every rank takes part in gathering them.
            "model": sharding.full_weights(self.model),
            "optimizer": sharding.optimizer_state(self.model, self.optimizer),
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
                "num_replicas": self.info.world_size,
                "position": self.step_in_epoch * self.samples_per_step,
            },
            **self.what_it_is(),
        }

    def what_it_is(self) -> dict:
        """Beside the weights in every checkpoint, best.pt and model.pt, as plain values: the settings, the recipe's
        module and the versions. A script with the file alone rebuilds the model: recipe.model(Config(**config))."""
        settings = {name: value for name, value in vars(self.config).items() if name != "environment"}
        return {"config": settings, "recipe": self.config.recipe, "versions": records.versions()}

    def load_state(self, state: dict) -> None:
        sharding.load_weights(self.model, state["model"])
        # The hyperparameters this run's settings gave (lr, momentum, ...), before the saved ones replace them.
        groups = self.optimizer.param_groups
        chosen = [{key: value for key, value in group.items() if key != "params"} for group in groups]
        sharding.load_optimizer_state(self.model, self.optimizer, state["optimizer"])
        restore_scaler(self.scaler, state["config"].get("precision"), self.config.precision, state["scaler"], self.log)
        self.epoch, self.step_in_epoch, self.global_step = state["epoch"], state["step_in_epoch"], state["global_step"]
        self.best = state.get("best")
        so_far = state.get("epoch_so_far")  # an earlier version's checkpoint: the epoch's row counts from here
        if so_far and self.step_in_epoch:
            self.continue_epoch(so_far)
        if len(state["rng"]) == self.info.world_size:
            set_state(state["rng"][self.info.rank], self.devices)
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
        changed = changed_settings(state["config"], vars(self.config))
        reshaping = [name for name in changed if name in RESHAPE_THE_SCHEDULE or name in self.config.settings]
        saved_total = state.get("total_steps", self.total_steps)
        if saved_total != self.total_steps and not reshaping:  # the data set's size, or the number of ranks
            changed["steps per epoch"] = (saved_total // state["config"]["epochs"], self.steps_per_epoch)
            reshaping.append("steps per epoch")
        said = {name: f"{name} changed from {old} to {new}" for name, (old, new) in changed.items()}
        if reshaping:
            # epochs last: "epochs changed from 1 to 3: the learning-rate schedule now spans ..."
            reshaping.sort(key=lambda name: name == "epochs")
            batch = bool({"global_batch_size", "accumulate_steps"} & set(reshaping))
            self.rebuild_schedule(chosen, ", ".join(said[name] for name in reshaping), batch)
        else:
            self.scheduler.load_state_dict(state["scheduler"])
        others = [said[name] for name in changed if name not in reshaping]
        if others:
            self.log.warning(f"{', '.join(others)}: in effect from here on")
        if {"best_metric", "best_mode"} & changed.keys():
            self.best = None  # found again from the run's rows (resume), by the new measure

    def epoch_so_far(self) -> dict:
        """This rank's part of the unfinished epoch's row: its training sums, gradient norms and seconds."""
        norms = [norm.cpu() for norm in self.grad_norms]
        return {"totals": self.training.state_dict(), "grad_norms": norms, "seconds": self.seconds}

    def continue_epoch(self, saved: list[dict]) -> None:
        """The epoch's row goes on from each rank's saved sums. On another number of ranks, rank 0 takes them all:
        the row is the same up to the order of the sums."""
        if len(saved) == self.info.world_size:
            own = saved[self.info.rank]
        elif self.info.rank == 0:
            totals = [part["totals"] for part in saved]
            sums = {name: sum(part["sums"][name] for part in totals) for name in totals[0]["sums"]}
            own = {**saved[0], "totals": {"sums": sums, "samples": sum(part["samples"] for part in totals)}}
        else:
            own = {**saved[0], "totals": {"sums": {}, "samples": torch.zeros((), dtype=torch.float64)}}
        self.training.load_state_dict(own["totals"])
        self.grad_norms = [norm.to(self.devices[-1]) for norm in own["grad_norms"]]
        self.seconds = own["seconds"]

    def rebuild_schedule(self, chosen: list[dict], why: str, batch_changed: bool) -> None:
        """A resume with settings that shape the schedule (epochs, the batch, lr or another recipe setting): the
        optimizer takes this run's hyperparameters, and the recipe's schedule is built for this run's length and
        stepped to where the samples trained so far place it, so it ends on its last step with the run."""
        for group, hyperparameters in zip(self.optimizer.param_groups, chosen):
            group.update(hyperparameters)
            group["lr"] = group["initial_lr"]
        self.scheduler = lr_schedule(self.recipe, self.optimizer, self.config, self.total_steps)
        with warnings.catch_warnings():  # stepping the schedule to where training stands, without training
            warnings.simplefilter("ignore")
            for _ in range(min(self.schedule_position, self.total_steps)):
                self.scheduler.step()
        steps = f"{self.total_steps} steps"
        if batch_changed:
            steps += f" of {self.config.global_batch_size} samples"
        self.log.warning(
            f"{why}: the learning-rate schedule now spans {self.config.epochs} epochs ({steps}) and continues at "
            f"step {self.schedule_position} with lr {self.optimizer.param_groups[0]['lr']:.6g}"
        )

    @property
    def schedule_position(self) -> int:
        """The schedule's steps that the samples trained so far make, in this run's batch: the global step, unless
        a resume changed the batch (global_step counts the steps taken, and names the checkpoints)."""
        return self.epoch * self.steps_per_epoch + self.step_in_epoch

    def resume(self) -> None:
        """Rank 0 decides the run's identity and the checkpoint (setting damaged ones aside); all ranks load it."""
        picked, state = [None, None, None], None
        if self.info.rank == 0:
            path, state, run_id = records.starting_point(self.config.resume, self.output_dir, self.log.warning)
            metrics = self.output_dir / records.METRICS
            # An earlier version's checkpoint keeps no rows: the file's, up to the checkpoint's epoch, stand in.
            rows = state.get("rows") if state else []
            if rows is None:
                rows = [row for row in records.read_metrics(metrics) if str(row.get("epoch")).isdigit()]
                rows = [row for row in rows if int(row["epoch"]) <= state["epoch"]]
            picked = [str(path) if path else None, run_id, rows]
        dist.broadcast_object_list(picked, src=0)
        self.run_id = picked[1]
        if picked[0] is None:
            return
        self.load_state(state or checkpoint.load(Path(picked[0])))
        self.rows, self.resumed = picked[2], True
        if self.best is None:  # best_metric or best_mode changed, or an earlier version's checkpoint
            for row in self.rows:
                self.track_best(row)
        if self.info.rank == 0:  # rows of epochs after the checkpoint go: those epochs are trained again
            lost = records.write_metrics(self.output_dir / records.METRICS, self.rows, len(self.rows))
            if lost:
                self.log.warning(lost)
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
