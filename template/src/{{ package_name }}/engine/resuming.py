"""What a resume changes (docs/checkpoints.md): the settings, schedule, scaler and partial epoch it continues with."""

from __future__ import annotations

import warnings

import torch

from . import records
from .config import SETTING_NAMES, Config
from .recipes import lr_schedule
from .sharding import FSDP

# These reshape the schedule, as [recipe] settings do; seed, and a batch change mid-epoch, are refused before the
# ranks meet (rank.unresumable).
RESHAPE_THE_SCHEDULE = ("epochs", "global_batch_size", "accumulate_steps")
# Where and how a run is launched and watched, not what it trains; precision says itself (restore_scaler).
NOT_TRAINING = {"resume", "overwrite", "output_dir", "master_addr", "master_port", "node_rank", "progress", "precision"}


def settings_changes(state: dict, config: Config, steps_per_epoch: int) -> tuple[dict[str, str], list[str]]:
    """({name: "name changed from A to B"}, the names that reshape the schedule, epochs last)."""
    saved, current = state["config"], vars(config)
    changed = {}
    for name in SETTING_NAMES:
        if name not in NOT_TRAINING and saved[name] != current[name]:
            changed[name] = (saved[name], current[name])
    then, now = saved["settings"], current["settings"]
    for name in [*now, *(name for name in then if name not in now)]:
        if then.get(name, "unset") != now.get(name, "unset"):
            changed[name] = (then.get(name, "unset"), now.get(name, "unset"))
    reshaping = [name for name in changed if name in RESHAPE_THE_SCHEDULE or name in config.settings]
    if state["total_steps"] != config.epochs * steps_per_epoch and not reshaping:
        changed["steps per epoch"] = (state["total_steps"] // saved["epochs"], steps_per_epoch)
        reshaping.append("steps per epoch")
    reshaping.sort(key=lambda name: name == "epochs")  # "epochs changed from 1 to 3: the schedule now spans ..."
    return {name: f"{name} changed from {old} to {new}" for name, (old, new) in changed.items()}, reshaping


def restore_scaler(scaler, saved_precision: str | None, precision: str, saved_state: dict, log) -> None:
    """The GradScaler's state, only from fp16 to fp16: a disabled scaler's empty state an enabled one refuses."""
    if saved_precision is not None and saved_precision != precision:
        log.warning(
            f"precision changed from {saved_precision} to {precision} on resume"
            + (": the fp16 GradScaler starts from its initial scale" if precision == "fp16" else "")
        )
    if saved_precision == precision == "fp16" and saved_state:
        scaler.load_state_dict(saved_state)


def apply_settings(trainer, state: dict, chosen: list[dict]) -> None:
    """This run's changed settings in effect from here on, logged; a reshaped schedule is rebuilt with this run's
    hyperparameters (`chosen`) and stepped to where training stands, so it ends with the run."""
    config, optimizer, position = trainer.config, trainer.optimizer, trainer.schedule_position
    said, reshaping = settings_changes(state, config, trainer.steps_per_epoch)
    if not reshaping:
        trainer.scheduler.load_state_dict(state["scheduler"])
    else:
        for group, chosen_here in zip(optimizer.param_groups, chosen):
            group.update(chosen_here)
            group["lr"] = group["initial_lr"]
        trainer.scheduler = lr_schedule(trainer.recipe, optimizer, config, trainer.total_steps)
        with warnings.catch_warnings():  # stepping the schedule to where training stands, without training
            warnings.simplefilter("ignore")
            for _ in range(min(position, trainer.total_steps)):
                trainer.scheduler.step()
        steps = f"{trainer.total_steps} steps"
        if {"global_batch_size", "accumulate_steps"} & set(reshaping):
            steps += f" of {config.global_batch_size} samples"
        changes = ", ".join(said[name] for name in reshaping)
        trainer.log.warning(
            f"{changes}: the learning-rate schedule now spans {config.epochs} epochs ({steps}) and continues at "
            f"step {position} with lr {optimizer.param_groups[0]['lr']:.6g}"
        )
    others = [text for name, text in said.items() if name not in reshaping]
    if others:
        trainer.log.warning(f"{', '.join(others)}: in effect from here on")
    if {"best_metric", "best_mode"} & said.keys():  # found again from the run's rows, by the new measure
        trainer.best = None
        for row in trainer.rows:
            trainer.best = records.new_best(trainer.best, row, config) or trainer.best


def layout_warnings(state: dict, config: Config, world_size: int) -> list[str]:
    """What a resume on another number of ranks (or, mid-epoch, another seed) cannot continue exactly."""
    found, saved_ranks, order = [], len(state["rng"]), state["sampler"]
    if saved_ranks != world_size:
        found.append(
            f"checkpoint holds RNG states of {saved_ranks} ranks, this job has {world_size}: random streams restart "
            "from the seed"
        )
        if config.parallelism == FSDP:  # each rank's shards were resharded when they loaded
            found.append(
                f"the shards were resharded from {saved_ranks} ranks to {world_size}: gradients are reduced "
                "in another order, so results are no longer bitwise comparable with the uninterrupted run"
            )
    if state["step_in_epoch"] and (order["seed"], order["num_replicas"]) != (config.seed, world_size):
        found.append(
            f"checkpoint stopped mid-epoch with seed {order['seed']} over {order['num_replicas']} "
            f"ranks, this job has seed {config.seed} over {world_size}: the rest of "
            f"epoch {state['epoch'] + 1} uses a different sample order"
        )
    return found


def own_part(saved: list[dict], rank: int, world_size: int) -> dict:
    """This rank's part of the unfinished epoch; on another number of ranks rank 0 takes them all."""
    if len(saved) == world_size:
        return saved[rank]
    if rank != 0:
        return {**saved[0], "totals": {"sums": {}, "samples": torch.zeros((), dtype=torch.float64)}}
    totals = [part["totals"] for part in saved]
    sums = {name: sum(part["sums"][name] for part in totals) for name in totals[0]["sums"]}
    return {**saved[0], "totals": {"sums": sums, "samples": sum(part["samples"] for part in totals)}}
