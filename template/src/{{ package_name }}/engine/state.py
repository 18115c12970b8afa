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

from . import checkpoint, records
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


class Resumable:
    """The Trainer's checkpoint contents, and a resume from them (every rank loads what rank 0 picked)."""

    def state(self) -> dict:
        rng_states: list = [None] * self.info.world_size
        dist.all_gather_object(rng_states, state(self.devices))  # a collective: every rank calls state()
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
        if state.get("total_steps", self.total_steps) == self.total_steps:
            self.scheduler.load_state_dict(state["scheduler"])
        else:
            self.rebuild_schedule(state["config"]["epochs"])

    def rebuild_schedule(self, trained_for: int) -> None:
        """A resume with another --epochs rebuilds the recipe's schedule for the new length, and says so."""
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        self.scheduler = lr_schedule(self.recipe, self.optimizer, self.config, self.total_steps)
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
