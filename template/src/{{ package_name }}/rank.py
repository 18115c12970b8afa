"""What one rank does: refuse a bad start before anything is written, join the group, train the recipe.

The launcher (train.py) never imports torch; every rank does, so each check that needs torch,
the recipe or a checkpoint runs here, first thing, on the spawn, torchrun and Slurm paths alike.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from . import checkpoint, loaders, records, rng
from .config import Config
from .distributed import (
    STOPPED,
    LaunchError,
    RankInfo,
    check_backend,
    cleanup,
    devices_for,
    die_with_the_launcher,
    ignore_interrupts_in_children,
    init_process_group,
    under_torchrun,
)
from .files import write_text_durably
from .logs import rank_logger
from .trainer import StopRequested, Trainer, listen_for_stop_requests


def refusal(config: Config, info: RankInfo) -> str | None:
    """What stops this run before its ranks meet: the backend, a bad checkpoint path, best_metric, another run's folder.

    Only rank 0 reads the checkpoint and claims the folder (the others wait for it in init_process_group
    and write nothing until then), so a big checkpoint is read once and --overwrite deletes once.
    """
    check_backend(config)
    recipe = importlib.import_module(config.recipe)
    metric = getattr(recipe, "METRIC", None)
    # A recipe with functions of its own names its columns itself: checked against its first epoch's row.
    own_columns = any(hasattr(recipe, name) for name in ("training_step", "validation_step", "metrics"))
    if not own_columns and config.best_metric not in ("val_loss", f"val_{metric}", "loss", metric):
        return f"best_metric {config.best_metric!r} is not a metrics.csv column; use val_loss or val_{metric}"
    if info.rank != 0:
        return None
    resumed_run = None
    if config.resume not in ("auto", "none"):
        try:
            resumed_run = checkpoint.load(Path(config.resume)).get("run_id")
        except checkpoint.CheckpointError as error:
            return str(error)
    return records.claim_output_dir(Path(config.output_dir), config.resume, config.overwrite, resumed_run)


def build_trainer(config: Config, info: RankInfo, log, split: str = "val") -> Trainer:
    """The recipe builds the objects; the engine wraps the model and makes the loaders (validation: `split`)."""
    recipe = importlib.import_module(config.recipe)
    devices = devices_for(config, info.local_rank)
    train_set, val_set = recipe.datasets(config)
    if split == "test":
        val_set = recipe.test_dataset(config)
    torch.manual_seed(config.seed)  # same initial weights on every rank
    model = recipe.model(config, devices)
    rng.seed_everything(config.seed + info.rank)  # then each rank its own stream (dropout, augmentation, ...)
    single_gpu = len(devices) == 1 and devices[0].type == "cuda"  # a model over two devices has no device_ids
    wrapped = DistributedDataParallel(
        model, device_ids=[devices[0]] if single_gpu else None, gradient_as_bucket_view=True
    )  # one gradient copy less per step
    where = (info.rank, info.world_size, config.seed, config.num_workers, devices[0].type == "cuda")
    train_data = loaders.training_loader(train_set, config.micro_batch, *where)
    val_data = loaders.validation_loader(val_set, config.micro_batch * config.accumulate_steps, *where)
    return Trainer(wrapped, train_data, val_data, recipe.optimizer(model, config), recipe, config, info, log)


def run_evaluation(config: Config, info: RankInfo, checkpoint_path: str, split: str, result_path: str) -> int:
    """One rank of `python -m <package>.evaluate`: the checkpoint's weights scored on this rank's share of `split`.

    Nothing is trained and nothing written but the result, which rank 0 writes as JSON.
    """
    die_with_the_launcher()
    if not under_torchrun():
        ignore_interrupts_in_children()
    check_backend(config)
    recipe = importlib.import_module(config.recipe)
    if split == "test" and not hasattr(recipe, "test_dataset"):
        raise LaunchError(
            f"--split test needs test_dataset(config) in the recipe ({config.recipe}); define it, or use --split val"
        )
    try:
        weights = checkpoint.load(Path(checkpoint_path), training_state=False)["model"]
    except checkpoint.CheckpointError as error:
        raise LaunchError(str(error)) from None
    if config.device == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.nproc_per_node))
    if config.device == "cuda":
        torch.cuda.set_device(devices_for(config, info.local_rank)[0])
    init_process_group(config, info)
    log = logging.getLogger(f"{__package__}.evaluate")
    try:
        trainer = build_trainer(config, info, log, split)
        try:
            trainer.model.module.load_state_dict(weights)
        except RuntimeError as error:
            raise LaunchError(
                f"{checkpoint_path} does not fit the recipe's model ({str(error).strip().splitlines()[-1].strip()}); "
                "evaluate it with the recipe and settings it was trained with"
            ) from None
        values = trainer.evaluate()
        if info.rank == 0:
            samples = int(values.pop("samples"))
            result = {
                "checkpoint": str(checkpoint_path),
                "split": split,
                "world_size": info.world_size,
                "samples": samples,
                "metrics": {f"{split}_{name}": value for name, value in values.items()},
            }
            write_text_durably(Path(result_path), json.dumps(result, indent=2))
    finally:
        cleanup()
    return 0


def run_smoke_probe(config: Config, info: RankInfo) -> int:
    """One rank of `python -m <package>.doctor --smoke`'s probe (smoke.py)."""
    from .smoke import probe_rank

    return probe_rank(config, info)


def run_rank(config: Config, info: RankInfo) -> int:
    """Everything one rank does, from its checks to clean-up. A refusal raises LaunchError before any write."""
    die_with_the_launcher()
    if not under_torchrun():
        ignore_interrupts_in_children()
    reason = refusal(config, info)
    if reason:
        raise LaunchError(reason)
    if config.device == "cpu":  # ranks share the cores; more threads than cores only slows every rank down
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.nproc_per_node))
    if config.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    if config.device == "cuda":
        torch.cuda.set_device(devices_for(config, info.local_rank)[0])
    listen_for_stop_requests()
    listening = init_process_group(config, info)
    log = rank_logger(Path(config.output_dir), info.rank)  # after the meeting: rank 0 has claimed the folder
    try:
        devices = ", ".join(str(d) for d in devices_for(config, info.local_rank))
        log.info(
            f"rank {info.rank} of {info.world_size} started on {devices} (backend {config.backend}, "
            f"started by {info.started_by}, pid {os.getpid()})"
        )
        log.info(f"gloo listens on {listening}")  # a line of its own: both fit an 80-column console
        build_trainer(config, info, log).fit()
    except StopRequested as stop:
        log.info(str(stop))
        return STOPPED
    except Exception:
        log.exception("rank failed")
        raise
    finally:
        cleanup()
    return 0
