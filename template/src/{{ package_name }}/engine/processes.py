"""This program's processes: which rank this one is, who started it (spawn, torchrun, srun), how new ones start."""

from __future__ import annotations

import multiprocessing
import os
import sys
from dataclasses import dataclass

WINDOWS = sys.platform == "win32"


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    world_size: int
    started_by: str  # for the log: spawn (this program), torchrun, srun


def under_torchrun() -> bool:
    """torchrun (or any env:// launcher) already started this process as one rank."""
    return all(name in os.environ for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def bound_by_slurm(environ: dict | os._Environ = os.environ) -> bool:
    """A task srun started as one rank, which Slurm may have bound to its own GPUs (--gpus-per-task)."""
    return "SLURM_PROCID" in environ and "TORCHELASTIC_RUN_ID" not in environ


def torchrun_rank() -> RankInfo:
    starters = {"TORCHELASTIC_RUN_ID": "torchrun", "SLURM_PROCID": "srun"}  # else set by hand
    return RankInfo(
        rank=int(os.environ["RANK"]),
        local_rank=int(os.environ["LOCAL_RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        started_by=next((name for variable, name in starters.items() if variable in os.environ), "RANK, WORLD_SIZE"),
    )


def process_context() -> multiprocessing.context.BaseContext:
    """How the launcher starts its ranks and each rank its DataLoader workers: spawn, Windows' only way, on every OS,
    so that what Windows cannot pickle fails on Linux too."""
    return multiprocessing.get_context("spawn")
