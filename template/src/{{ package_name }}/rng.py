"""Every random stream a rank uses (python, numpy, torch, CUDA), seeded, saved and restored exactly."""

from __future__ import annotations

import random

import numpy as np
import torch


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
    """This process's random streams as tensors and plain values (loadable with weights_only=True).

    CUDA's only for this rank's own GPUs, and only when it trains on them: a CPU run never starts CUDA here.
    """
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
    """(device, state) pairs to restore: each saved role on this rank's device of that role.

    A role this rank does not have (a split model resumed as plain DDP) is left at its seed. A checkpoint of an
    older version holds a list by index, of every visible GPU; this rank's indices are taken from it when present.
    """
    own = roles(devices)
    if isinstance(saved, dict):
        return [(device, saved[role]) for role, device in own.items() if role in saved]
    found = []
    for device in own.values():
        if saved and device.index is not None and device.index < len(saved):
            found.append((device, saved[device.index]))
    return found


def set_state(saved: dict, devices: tuple[torch.device, ...]) -> None:
    random.setstate(tuple(x if not isinstance(x, list) else tuple(x) for x in saved["python"]))
    numpy = saved["numpy"]
    np.random.set_state(
        ("MT19937", numpy["keys"].numpy().astype(np.uint32), numpy["position"], numpy["has_gauss"], numpy["cached"])
    )
    torch.set_rng_state(saved["torch"])
    for device, cuda_state in cuda_states_for(saved.get("cuda"), devices):
        torch.cuda.set_rng_state(cuda_state, device)
