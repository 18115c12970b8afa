"""This program's processes: which rank this one is, who started it (spawn, torchrun, srun), how new ones start."""

from __future__ import annotations

import multiprocessing
import os
import sys
from dataclasses import dataclass

WINDOWS = sys.platform == "win32"
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# The only start method Windows has, used on every OS for the ranks and their DataLoader workers: code that
# Windows would refuse to pickle fails on Linux too, where it is found first.
START_METHOD = "spawn"


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    world_size: int
    started_by: str  # for the log: spawn (this program), torchrun, srun


def under_torchrun(environ: dict | os._Environ = os.environ) -> bool:
    """torchrun (or any env:// launcher) already started this process as one rank."""
    return all(name in environ for name in TORCHRUN_VARIABLES)


def bound_by_slurm(environ: dict | os._Environ = os.environ) -> bool:
    """A task that srun started as one rank: Slurm may have bound it to its own GPUs (--gpus-per-task,
    --gpu-bind=single:1), so it sees only its share, not the node's."""
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
    """How this program starts processes: the launcher its ranks, each rank its DataLoader workers (loaders.py)."""
    return multiprocessing.get_context(START_METHOD)
