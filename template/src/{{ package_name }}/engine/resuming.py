"""What a resume changes: this run's settings against the checkpoint's, and the schedule, scaler and partial
epoch they call for (docs/checkpoints.md). Plain functions the Trainer calls from load_state_dict()."""

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


def changed_settings(saved: dict, current: dict) -> dict[str, tuple]:
    """{name: (saved value, this run's)} of every engine and [recipe] setting that differs ("unset": not there)."""
    changed = {}
    for name in SETTING_NAMES:
        if name not in NOT_TRAINING and saved[name] != current[name]:
            changed[name] = (saved[name], current[name])
    then, now = saved["settings"], current["settings"]
    for name in [*now, *(name for name in then if name not in now)]:
        if then.get(name, "unset") != now.get(name, "unset"):
            changed[name] = (then.get(name, "unset"), now.get(name, "unset"))
    return changed


def settings_changes(state: dict, config: Config, steps_per_epoch: int) -> tuple[dict[str, str], list[str]]:
    """({name: "name changed from A to B"}, the names among them that reshape the schedule, epochs last).

    Another total of steps with no setting changed (the data set's size, or the number of ranks) reshapes it too.
    """
    changed = changed_settings(state["config"], vars(config))
    reshaping = [name for name in changed if name in RESHAPE_THE_SCHEDULE or name in config.settings]
    if state["total_steps"] != config.epochs * steps_per_epoch and not reshaping:
        changed["steps per epoch"] = (state["total_steps"] // state["config"]["epochs"], steps_per_epoch)
        reshaping.append("steps per epoch")
    reshaping.sort(key=lambda name: name == "epochs")  # "epochs changed from 1 to 3: the schedule now spans ..."
    return {name: f"{name} changed from {old} to {new}" for name, (old, new) in changed.items()}, reshaping


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


def hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict]:
    """The hyperparameters of each param group (lr, momentum, ...), as this run's settings gave them."""
    return [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]


def apply_settings(trainer, state: dict, chosen: list[dict]) -> None:
    """The trainer's settings that differ from the checkpoint's, in effect from here on and named in the log: the
    schedule they reshape is rebuilt (else the saved one goes on), and best is found again by a new measure."""
    config, log = trainer.config, trainer.log
    said, reshaping = settings_changes(state, config, trainer.steps_per_epoch)
    if reshaping:
        trainer.scheduler, why = rebuilt_schedule(
            trainer.recipe, trainer.optimizer, chosen, config, trainer.total_steps, trainer.schedule_position,
            reshaping,
        )  # fmt: skip
        log.warning(f"{', '.join(said[name] for name in reshaping)}: {why}")
    else:
        trainer.scheduler.load_state_dict(state["scheduler"])
    others = [text for name, text in said.items() if name not in reshaping]
    if others:
        log.warning(f"{', '.join(others)}: in effect from here on")
    if {"best_metric", "best_mode"} & said.keys():  # found again from the run's rows, by the new measure
        trainer.best = None
        for row in trainer.rows:
            trainer.best = records.new_best(trainer.best, row, config) or trainer.best


def rebuilt_schedule(recipe, optimizer: torch.optim.Optimizer, chosen: list[dict], config: Config, total_steps: int,
                     position: int, reshaping: list[str]) -> tuple:  # fmt: skip
    """The schedule of a resume with settings that shape it (epochs, the batch, lr or another recipe setting), and
    what it does now, in words: the optimizer takes this run's hyperparameters (`chosen`), and the recipe's schedule
    is built for this run's length and stepped to `position`, where the samples trained so far place it, so it ends
    on its last step with the run."""
    for group, hyperparameters in zip(optimizer.param_groups, chosen):
        group.update(hyperparameters)
        group["lr"] = group["initial_lr"]
    scheduler = lr_schedule(recipe, optimizer, config, total_steps)
    with warnings.catch_warnings():  # stepping the schedule to where training stands, without training
        warnings.simplefilter("ignore")
        for _ in range(min(position, total_steps)):
            scheduler.step()
    steps = f"{total_steps} steps"
    if {"global_batch_size", "accumulate_steps"} & set(reshaping):
        steps += f" of {config.global_batch_size} samples"
    return scheduler, (
        f"the learning-rate schedule now spans {config.epochs} epochs ({steps}) and continues at step {position} "
        f"with lr {optimizer.param_groups[0]['lr']:.6g}"
    )


def layout_warnings(state: dict, config: Config, world_size: int) -> list[str]:
    """What a resume on another number of ranks (or, mid-epoch, another seed) cannot continue exactly."""
    found = []
    if len(state["rng"]) != world_size:
        found.append(
            f"checkpoint holds RNG states of {len(state['rng'])} ranks, this job has "
            f"{world_size}: random streams restart from the seed"
        )
        if config.parallelism == FSDP:  # each rank's shards were resharded when they loaded
            found.append(
                f"the shards were resharded from {len(state['rng'])} ranks to {world_size}: gradients are reduced "
                "in another order, so results are no longer bitwise comparable with the uninterrupted run"
            )
    order = state["sampler"]
    if state["step_in_epoch"] and (order["seed"], order["num_replicas"]) != (config.seed, world_size):
        found.append(
            f"checkpoint stopped mid-epoch with seed {order['seed']} over {order['num_replicas']} "
            f"ranks, this job has seed {config.seed} over {world_size}: the rest of "
            f"epoch {state['epoch'] + 1} uses a different sample order"
        )
    return found


def where_it_continues(epoch: int, step_in_epoch: int, epochs: int, steps_per_epoch: int) -> str:
    if epoch >= epochs:
        return f"all {epochs} epochs were already trained"
    if step_in_epoch:
        return f"continuing at epoch {epoch + 1}/{epochs}, step {step_in_epoch + 1}/{steps_per_epoch}"
    return f"continuing at epoch {epoch + 1}/{epochs}"


def own_part(saved: list[dict], rank: int, world_size: int) -> dict:
    """This rank's part of the unfinished epoch that a checkpoint saved per rank. On another number of ranks, rank 0
    takes them all: the epoch's row is the same up to the order of the sums."""
    if len(saved) == world_size:
        return saved[rank]
    if rank != 0:
        return {**saved[0], "totals": {"sums": {}, "samples": torch.zeros((), dtype=torch.float64)}}
    totals = [part["totals"] for part in saved]
    sums = {name: sum(part["sums"][name] for part in totals) for name in totals[0]["sums"]}
    return {**saved[0], "totals": {"sums": sums, "samples": sum(part["samples"] for part in totals)}}
