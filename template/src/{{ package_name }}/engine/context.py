"""One rank's fixed facts, made once in its entry function (rank.py) and handed to everything below it."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from types import ModuleType

import torch

from . import PACKAGE
from .config import Config
from .devices import devices_for
from .processes import RankInfo
from .recipes import load_recipe


@dataclass(frozen=True)
class RankContext(RankInfo):
    """Who this rank is (RankInfo), where it computes, what it trains and where it logs."""

    config: Config
    devices: tuple[torch.device, ...]  # one for plain DDP; the split model's two: inputs on [0], targets on [-1]
    recipe: ModuleType
    log: logging.Logger  # rank<N>: logs.rank_logger gives it its files once rank 0 has claimed the folder

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def create(cls, config: Config, info: RankInfo, log: logging.Logger | None = None) -> RankContext:
        """The rank's devices computed and the recipe imported (and checked) here, once."""
        return cls(
            **vars(info),
            config=config,
            devices=devices_for(config, info.local_rank),
            recipe=load_recipe(config.recipe),
            log=log or logging.getLogger(f"{PACKAGE}.rank{info.rank}"),
        )

    def use_devices(self) -> None:
        """Compute where this rank owns: its GPU as CUDA's current device, or its share of the CPU's cores."""
        if self.devices[0].type == "cuda":
            torch.cuda.set_device(self.devices[0])
        else:  # ranks share the cores; more threads than cores only slows every rank down
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.config.nproc_per_node))
