"""The random streams a Dataset draws from (torch, numpy, Python's random), seeded per sample, with public APIs only.

A sample's draws come from (seed, epoch, index) alone, never from the process that fetches it: any num_workers,
and a resume mid-epoch, give the same batches. numpy's SeedSequence derives the samples' seeds, SEEDS_AT_ONCE
of them from each of its states, as deriving one costs more than seeding the streams with it.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

SEEDS_AT_ONCE = 256  # consecutive indices whose seeds one SeedSequence derives
KEPT_SEEDS = 4096  # blocks of seeds kept derived: every seed of an epoch of up to a million samples


@functools.lru_cache(maxsize=KEPT_SEEDS)
def _seeds(seed: int, epoch: int, block: int) -> np.ndarray:
    entropy = np.random.SeedSequence(seed % 2**64, spawn_key=(epoch + 1, block))
    return entropy.generate_state(SEEDS_AT_ONCE, np.uint64)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The 64-bit seed of sample `index` in `epoch` (-1: validation, the same every epoch) of a run's `seed`."""
    return int(_seeds(seed, epoch, index // SEEDS_AT_ONCE)[index % SEEDS_AT_ONCE])


def seed_torch(seed: int) -> None:
    torch.default_generator.manual_seed(seed)  # not torch.manual_seed: that reseeds CUDA's streams too


def seed_numpy(seed: int) -> None:
    np.random.seed((seed ^ (seed >> 32)) & 0xFFFFFFFF)  # numpy's global stream takes 32 bits


def _same_numpy_state(first: tuple, second: tuple) -> bool:
    return first[2:] == second[2:] and np.array_equal(first[1], second[1])


@dataclass(frozen=True)
class Stream:
    """A global stream that a Dataset may or may not draw from: watched through its state until it does."""

    name: str
    get: Callable[[], Any]
    put: Callable[[Any], None]
    seed: Callable[[int], None]
    same: Callable[[Any, Any], bool]


# Seeding these two for every sample would cost a plain Dataset more than its fetch: they are seeded once the
# Dataset is seen to draw from them (loaders.SampleSeeded). torch's stream, cheap to seed, always is.
WATCHED = (
    Stream("numpy", np.random.get_state, np.random.set_state, seed_numpy, _same_numpy_state),
    Stream("python", random.getstate, random.setstate, random.seed, tuple.__eq__),
)
