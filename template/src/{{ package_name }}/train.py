"""Train a recipe (recipe.py) with DistributedDataParallel.

    python -m <package>.train --nproc-per-node 2 --epochs 5

Run plainly, this starts its own ranks with torch.multiprocessing (the only
way that works on native Windows, and it works on Linux too). Under torchrun
the process joins as the rank torchrun gave it. Every setting comes from
configs/train.toml and can be overridden by a flag; `--help` lists them.
The recipe builds the model, data, optimizer, schedule, loss and metric;
trainer.py owns the loop, checkpoints, validation and the run's records.
"""

from __future__ import annotations

import importlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from . import checkpoint, loaders, records, rng
from .config import Config, from_command_line
from .distributed import (
    INTERRUPTED,
    STOPPED,
    LaunchError,
    RankInfo,
    check_backend,
    cleanup,
    devices_for,
    die_with_the_launcher,
    exit_now,
    ignore_interrupts_in_children,
    init_process_group,
    spawn,
    torchrun_layout,
    torchrun_rank,
    under_torchrun,
)
from .logs import rank_logger
from .trainer import StopRequested, Trainer, listen_for_stop_requests

PROG = f"python -m {__package__}.train"


def build_trainer(config: Config, info: RankInfo, log) -> Trainer:
    """The recipe builds the objects; the engine wraps the model and makes the loaders."""
    recipe = importlib.import_module(config.recipe)
    devices = devices_for(config, info.local_rank)
    train_set, val_set = recipe.datasets(config)
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


def run_rank(config: Config, info: RankInfo) -> int:
    """Everything one rank does, from process-group start to clean-up."""
    die_with_the_launcher()
    if not under_torchrun():
        ignore_interrupts_in_children()
    log = rank_logger(Path(config.output_dir), info.rank)
    if config.device == "cpu":  # ranks share the cores; more threads than cores only slows every rank down
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.nproc_per_node))
    if config.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    if config.device == "cuda":
        torch.cuda.set_device(devices_for(config, info.local_rank)[0])
    listen_for_stop_requests()
    listening = init_process_group(config, info)
    try:
        devices = ", ".join(str(d) for d in devices_for(config, info.local_rank))
        log.info(
            f"rank {info.rank} of {info.world_size} started on {devices} (backend {config.backend}, "
            f"pid {os.getpid()}); gloo listens on {listening}"
        )
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


def resume_command(argv: list[str] | None) -> str:
    """The command that was run, with --resume auto instead of any --resume it had."""
    args, kept = list(sys.argv[1:] if argv is None else argv), []
    while args:
        arg = args.pop(0)
        if arg == "--resume" and args:
            args.pop(0)
        elif not arg.startswith("--resume="):
            kept.append(arg)
    command = [*PROG.split(), *kept, "--resume", "auto"]
    return subprocess.list2cmdline(command) if sys.platform == "win32" else shlex.join(command)


def refusal(config: Config) -> str | None:
    """What stops this run before any rank starts: a bad checkpoint path, best_metric, or another run's folder."""
    resumed_run = None
    if config.resume not in ("auto", "none"):
        resumed_run = checkpoint.load(Path(config.resume)).get("run_id")  # a bad path fails here
    metric = importlib.import_module(config.recipe).METRIC
    if config.best_metric not in ("val_loss", f"val_{metric}", "loss", metric):
        return f"best_metric {config.best_metric!r} is not a metrics.csv column; use val_loss or val_{metric}"
    first_rank = torchrun_rank().rank == 0 if under_torchrun() else config.node_rank == 0
    if not first_rank:  # only the first rank writes, so only its folder matters
        return None
    return records.claim_output_dir(Path(config.output_dir), config.resume, config.overwrite, resumed_run)


def main(argv: list[str] | None = None) -> int:
    config = from_command_line(argv, PROG)
    if under_torchrun():
        config = torchrun_layout(config)
    try:
        reason = refusal(config)
        if reason:
            raise LaunchError(reason)
        if under_torchrun():  # torchrun, or one Slurm task per rank
            check_backend(config)
            return run_rank(config, torchrun_rank())
        status = spawn(run_rank, config)
        if status == INTERRUPTED:
            print(f"to continue from the newest checkpoint: {resume_command(argv)}", file=sys.stderr, flush=True)
        return status
    except (LaunchError, checkpoint.CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    exit_now(main())
