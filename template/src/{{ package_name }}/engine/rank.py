"""What one rank does (the launcher never imports torch): refuse a bad start before any write, join, train or score."""

from __future__ import annotations

import datetime
import json
import logging
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from . import PACKAGE, checkpoint, loaders, records, sharding, streams
from .config import Config
from .context import RankContext
from .devices import check_backend
from .files import WriteError, write_text_durably
from .logs import rank_logger, shown_path
from .process_group import LaunchError, in_the_group, init_process_group, reduce_gradients_where_gloo_can, restart_store
from .processes import RankInfo
from .recipes import in_the_recipe, recipe_check
from .stopping import STOP_SIGNALS, SettingsRefused, StopRequested, exit_status, listen_for_stop_requests
from .trainer import Trainer

REFUSAL_KEY = "refusal"  # in torchrun's store, of this start only (restart_store): rank 0's verdict, "" to train


def refusal(context: RankContext) -> str | None:
    """Why these settings cannot train, found before the ranks meet (the recipe's check, best_metric, a checkpoint, the
    folder); rank 0 alone decides, so a big checkpoint is read once and --overwrite deletes once."""
    if not context.is_main:
        return None
    config, recipe = context.config, context.recipe
    problem = recipe_check(recipe, config)
    if problem:
        return problem
    metric = getattr(recipe, "METRIC", None)
    # A recipe with functions of its own names its columns itself: checked against its first epoch's row.
    own_columns = any(hasattr(recipe, name) for name in ("training_step", "validation_step", "metrics"))
    if not own_columns and config.best_metric not in ("val_loss", f"val_{metric}", "loss", metric):
        return f"best_metric {config.best_metric!r} is not a metrics.csv column; use val_loss or val_{metric}"
    resumed_run = None
    if config.resume not in ("auto", "none"):
        try:
            resumed_run = checkpoint.load(Path(config.resume)).get("run_id")
        except checkpoint.CheckpointError as error:
            return str(error)
    return unresumable(context) or records.claim_output_dir(
        Path(config.output_dir), config.resume, config.overwrite, resumed_run
    )


def told_by_rank_0(context: RankContext, reason: str | None) -> SettingsRefused | None:
    """Rank 0's refusal, as every rank's under torchrun (read from its store), so torchrun reports no failure;
    elsewhere rank 0's alone, and the spawn launcher or srun stops the others as it ends."""
    timeout = datetime.timedelta(seconds=context.config.timeout_s)
    store = restart_store(timeout) if context.started_by == "torchrun" else None
    if store is None:
        return SettingsRefused(reason) if reason else None
    if context.is_main:
        store.set(REFUSAL_KEY, reason or "")
    else:
        reason = store.get(REFUSAL_KEY).decode("utf-8")  # waits for rank 0's verdict
    return SettingsRefused(reason, every_rank=True) if reason else None


def unresumable(context: RankContext) -> str | None:
    """Why this run cannot continue from the checkpoint it would resume: another seed, a batch changed mid-epoch, a
    model that does not fit it; rank 0 builds the model once more for it, the random streams left as they were."""
    config, output_dir = context.config, Path(context.config.output_dir)
    if config.resume == "none":
        return None
    paths = [Path(config.resume)]
    if config.resume == "auto":
        paths = checkpoint.existing(output_dir, records.run_id_of(output_dir))
    saved = None
    for path in paths:  # the first that loads: the trainer reports damaged ones and sets them aside
        saved = checkpoint.what_it_resumes(path)
        if saved is not None:
            break
    if saved is None:
        return None
    new_run = "--resume none with a new --output-dir"
    trained = saved["config"]
    if trained.get("seed", config.seed) != config.seed:
        return (
            f"checkpoint {path} was trained with seed {trained['seed']} and this run sets seed {config.seed}: a "
            "resume keeps the seed that made its weights, data order and random streams; nothing was changed. "
            f"Resume with --seed {trained['seed']}, or train seed {config.seed} as a new run: {new_run}"
        )
    batch = [name for name in ("global_batch_size", "accumulate_steps") if trained.get(name, getattr(config, name)) !=
             getattr(config, name)]  # fmt: skip
    if batch and saved["step_in_epoch"]:
        was = ", ".join(f"{name} = {trained[name]}" for name in batch)
        return (
            f"checkpoint {path} stopped in epoch {saved['epoch'] + 1}, at its step {saved['step_in_epoch'] + 1}, and "
            f"this run changes {' and '.join(batch)}: a batch changes only between epochs; nothing was changed. "
            "Resume from a checkpoint saved at an epoch's end (--resume PATH; checkpoint_every = 0 saves only "
            f"those), or keep {was} for this run"
        )
    with torch.random.fork_rng(devices=[]):
        model = context.recipe.model(config, context.devices)
    problem = checkpoint.misfit({name: tuple(value.shape) for name, value in model.state_dict().items()},
                                saved["shapes"])  # fmt: skip
    if problem is None:
        return None
    return (
        f"checkpoint {path} does not fit the model: {problem}; nothing was changed. To train this model, start a "
        f"new run: {new_run}, or --resume none --overwrite to replace the run in {output_dir}"
    )


def build_trainer(context: RankContext, split: str = "val") -> Trainer:
    """The recipe builds the objects; the engine wraps the model and makes the loaders (validation: `split`)."""
    config, recipe, devices = context.config, context.recipe, context.devices
    train_set, val_set = recipe.datasets(config)
    if split == "test":
        val_set = recipe.test_dataset(config)
    if hasattr(val_set, "__len__") and len(val_set) == 0:  # an IterableDataset has no length to check
        raise LaunchError(
            f"the test set is empty: test_dataset() in {recipe.__file__} returned no samples; return the held-out "
            "test split from it"
            if split == "test"
            else f"the validation set is empty: datasets() in {recipe.__file__} returned no validation samples; "
            "return a held-out split as its second value (val_loss, the metric's val_ column and best.pt come from it)"
        )
    torch.manual_seed(config.seed)  # same initial weights on every rank
    model = recipe.model(config, devices)
    if not any(parameter.requires_grad for parameter in model.parameters()):
        raise LaunchError(
            f"the model that model() in {shown_path(recipe.__file__)} returns has no trainable parameters (none with "
            "requires_grad): there is nothing to train; leave at least one layer unfrozen"
        )
    streams.seed_everything(config.seed + context.rank)  # then each rank its own stream (dropout, augmentation, ...)
    single_gpu = len(devices) == 1 and devices[0].type == "cuda"  # a model over two devices has no device_ids
    if config.parallelism == sharding.FSDP:
        wrapped = sharding.shard(model, recipe, config, devices[0])
    else:
        wrapped = DistributedDataParallel(
            model, device_ids=[devices[0]] if single_gpu else None, gradient_as_bucket_view=True
        )  # one gradient copy less per step
        if reduce_gradients_where_gloo_can(wrapped):
            context.log.debug("gradients are all-reduced through host memory: gloo's GPU all_reduce is missing")
    where = (context.rank, context.world_size, config.seed, config.num_workers, devices[0].type == "cuda")
    train_data = loaders.training_loader(train_set, config.micro_batch, *where)
    val_data = loaders.validation_loader(val_set, config.micro_batch * config.accumulate_steps, *where)
    # The optimizer over the model's parameters as they are now: fully_shard made them this rank's shards.
    return Trainer(context, wrapped, recipe.optimizer(model, config), train_data, val_data)


def score(context: RankContext, weights: dict, checkpoint_path: str, split: str) -> dict:
    """The weights' metrics on `split`. The trainer lives in here only: see in_the_group()."""
    trainer = build_trainer(context, split)
    try:
        sharding.load_weights(trainer.model, weights)
    except RuntimeError as error:
        raise LaunchError(
            f"{checkpoint_path} does not fit the recipe's model ({str(error).strip().splitlines()[-1].strip()}); "
            "evaluate it with the recipe and settings it was trained with"
        ) from None
    return trainer.evaluate()


def run_evaluation(config: Config, info: RankInfo, checkpoint_path: str, split: str, result_path: str) -> int:
    """One rank of `python -m <package>.evaluate`: the weights scored on `split`; rank 0 writes the result as JSON."""
    check_backend(config)
    context = RankContext.create(config, info, logging.getLogger(f"{PACKAGE}.evaluate"))
    if split == "test" and not hasattr(context.recipe, "test_dataset"):
        raise LaunchError(
            f"--split test needs test_dataset(config) in the recipe ({config.recipe}); define it, or use --split val"
        )
    try:
        weights = checkpoint.load(Path(checkpoint_path), training_state=False)["model"]
    except checkpoint.CheckpointError as error:
        raise LaunchError(str(error)) from None
    context.use_devices()
    init_process_group(context.config, context.rank, context.world_size, context.devices)
    with in_the_group():
        values = score(context, weights, checkpoint_path, split)
        if context.is_main:
            samples = int(values.pop("samples"))
            result = {
                "checkpoint": str(checkpoint_path),
                "split": split,
                "world_size": context.world_size,
                "samples": samples,
                "metrics": {f"{split}_{name}": value for name, value in values.items()},
            }
            write_text_durably(Path(result_path), json.dumps(result, indent=2))
        dist.barrier()  # as at training's end: every rank is done with the group before one tears it down
    return 0


def run_rank(config: Config, info: RankInfo) -> int:
    """Everything one rank does, from its checks to clean-up. A refusal raises SettingsRefused before any write."""
    check_backend(config)
    context = RankContext.create(config, info)
    refused = told_by_rank_0(context, refusal(context))
    if refused:
        raise refused
    context.use_devices()
    if config.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    # SIGUSR1 from here on, so an early one cannot end the rank (its default); SIGTERM and Ctrl+Break only once
    # training is built: before that they end the rank at once, as a rank waiting for its peers must be able to.
    listen_for_stop_requests(tuple(signum for signum in STOP_SIGNALS if signum == getattr(signal, "SIGUSR1", None)))
    listening = init_process_group(context.config, context.rank, context.world_size, context.devices)
    log = rank_logger(context.log, Path(config.output_dir), context.rank)  # after the meeting: the folder is claimed
    with in_the_group():
        try:
            devices = ", ".join(str(d) for d in context.devices)
            log.info(
                f"rank {context.rank} of {context.world_size} started on {devices} (backend {config.backend}, "
                f"started by {context.started_by}, pid {os.getpid()})"
            )
            log.info(f"gloo listens on {listening}")  # a line of its own: both fit an 80-column console
            return train(context)
        except Exception as error:
            log.exception("rank failed")  # to the rank's log file
            if isinstance(error, WriteError):  # a disk or permission problem: one line with its fix, no restart
                raise LaunchError(str(error)) from None
            raise


def train(context: RankContext) -> int:
    """Build the trainer and fit; the exit status. The trainer lives in here only: see in_the_group()."""
    log = context.log
    try:
        trainer = build_trainer(context)
    except (LaunchError, WriteError):  # a refusal, or a disk's (run_rank's one line): not the recipe's fault
        raise
    except Exception as error:  # the recipe's code, with this run's settings: retrying cannot help
        log.exception("the recipe failed")  # to the rank's log file
        log_file = shown_path(Path(context.config.output_dir) / "logs" / f"rank{context.rank}.log")
        raise LaunchError(f"{in_the_recipe(error)} (details: {log_file})") from None
    listen_for_stop_requests()
    try:
        trainer.fit()
    except StopRequested as stop:
        # After Ctrl+C the console gets one line from the launcher (rank 0's under torchrun); the log gets this.
        (log.debug if stop.signum == signal.SIGINT else log.info)(str(stop))
        # Saved and stopping: a second request, or srun ending the step once a peer has exited, must not cut
        # this rank's own end short (srun would then report the signal, not the status that asks to requeue).
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        return exit_status(stop)
    return 0
