"""A synthetic, seeded and learnable classification task.

Labels come from a fixed random "teacher" network, so the toy model can
reach high accuracy; chance level is 1 / CLASSES. Every rank builds the same
tensors from the seed, so no rank needs to send data to another, and the
tensors stay on the CPU (DataLoader workers on Windows are spawned processes).
"""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from .model import CLASSES, IN_FEATURES


def make_dataset(samples: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, IN_FEATURES, generator=generator)
    teacher = torch.randn(IN_FEATURES, CLASSES, generator=generator)
    labels = (inputs @ teacher).argmax(dim=1)
    return TensorDataset(inputs, labels)
