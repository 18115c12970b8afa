"""Every random stream a rank uses (Python's, numpy's, torch's, CUDA's): seeded, saved and restored exactly, and
seeded per sample for the Dataset, with public APIs only.

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


seed_torch = torch.default_generator.manual_seed  # not torch.manual_seed: that reseeds CUDA's streams too


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


# Seeding a stream costs 1 to 4 us (torch's, numpy's, Python's), for every sample more than many a Dataset's
# fetch: each is seeded once the Dataset is seen to draw from it (loaders.SampleSeeded).
WATCHED = (
    Stream("torch", torch.get_rng_state, torch.set_rng_state, seed_torch, torch.equal),
    Stream("numpy", np.random.get_state, np.random.set_state, seed_numpy, _same_numpy_state),
    Stream("python", random.getstate, random.setstate, random.seed, tuple.__eq__),
)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def roles(devices: tuple[torch.device, ...]) -> dict[str, torch.device]:
    """This rank's CUDA devices by their role in the engine ("devices[0]" takes the inputs, "devices[-1]" the
    targets), not by index: the same role finds its device on a machine that numbers or counts GPUs otherwise."""
    named = {"devices[0]": devices[0], **({"devices[-1]": devices[-1]} if devices[-1] != devices[0] else {})}
    return {role: device for role, device in named.items() if device.type == "cuda"}


def state(devices: tuple[torch.device, ...]) -> dict:
    """This process's random streams as tensors and plain values (loadable with weights_only=True); CUDA's only for
    this rank's own GPUs, when it trains on them: a CPU run never starts CUDA here."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    found = {
        "python": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    own = roles(devices)
    if own:
        found["cuda"] = {role: torch.cuda.get_rng_state(device) for role, device in own.items()}
    return found


def cuda_states_for(saved, devices: tuple[torch.device, ...]) -> list[tuple[torch.device, torch.Tensor]]:
    """(device, state) pairs to restore, by role; a role this rank lacks (split model resumed as DDP) keeps its seed."""
    return [(device, saved[role]) for role, device in roles(devices).items() if role in (saved or {})]


def set_state(saved: dict, devices: tuple[torch.device, ...]) -> None:
    random.setstate(tuple(x if not isinstance(x, list) else tuple(x) for x in saved["python"]))
    numpy = saved["numpy"]
    np.random.set_state(
        ("MT19937", numpy["keys"].numpy().astype(np.uint32), numpy["position"], numpy["has_gauss"], numpy["cached"])
    )
    torch.set_rng_state(saved["torch"])
    for device, cuda_state in cuda_states_for(saved.get("cuda"), devices):
        torch.cuda.set_rng_state(cuda_state, device)
