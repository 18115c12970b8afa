"""The random streams a Dataset draws from (torch, numpy, Python's random), seeded per sample, with public APIs only.

A sample's draws come from (seed, epoch, index) alone, never from the process that fetches it: any num_workers,
and a resume mid-epoch, give the same batches. numpy's SeedSequence derives the sample's seed.
"""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The 64-bit seed of sample `index` in `epoch` (-1: validation, the same every epoch) of a run's `seed`."""
    words = np.random.SeedSequence(seed % 2**64, spawn_key=(epoch + 1, index)).generate_state(1, np.uint64)
    return int(words[0])


def seed_streams(seed: int) -> None:
    """torch's CPU, numpy's and Python's global streams, each seeded from the 64-bit `seed`."""
    torch.default_generator.manual_seed(seed)  # not torch.manual_seed: that reseeds CUDA's streams too
    np.random.seed((seed ^ (seed >> 32)) & 0xFFFFFFFF)  # numpy's global stream takes 32 bits
    random.seed(seed)


@contextlib.contextmanager
def streams_kept():
    """The block may reseed and draw from the three streams; they are as they were after it (a cached normal too)."""
    torch_state, numpy_state, python_state = torch.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        yield
    finally:
        torch.set_rng_state(torch_state)
        np.random.set_state(numpy_state)
        random.setstate(python_state)
