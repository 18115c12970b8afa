"""Every random stream a rank uses (python, numpy, torch, CUDA), seeded, saved and restored exactly."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def state() -> dict:
    """This process's random streams as tensors and plain values (loadable with weights_only=True)."""
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
    if torch.cuda.is_available():
        found["cuda"] = torch.cuda.get_rng_state_all()
    return found


def set_state(saved: dict) -> None:
    random.setstate(tuple(x if not isinstance(x, list) else tuple(x) for x in saved["python"]))
    numpy = saved["numpy"]
    np.random.set_state(
        ("MT19937", numpy["keys"].numpy().astype(np.uint32), numpy["position"], numpy["has_gauss"], numpy["cached"])
    )
    torch.set_rng_state(saved["torch"])
    if "cuda" in saved and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])
