"""A synthetic, seeded and learnable classification task: replace it with your own data.

Labels come from a fixed random "teacher" network, so the toy model can
reach high accuracy; chance level is 1 / CLASSES. Every rank builds the same
tensors from the seed, so no rank needs to send data to another, and the
tensors stay on the CPU (DataLoader workers on Windows are spawned processes).

Any map-style Dataset works in its place: `dataset[i]` returning `(inputs, target)`
(docs/make-it-your-own.md, "Your own Dataset").
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from .model import CLASSES, IN_FEATURES


class TeacherTask(Dataset):
    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        self.inputs, self.labels = inputs, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.labels[index]


def make_dataset(samples: int, seed: int) -> TeacherTask:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, IN_FEATURES, generator=generator)
    teacher = torch.randn(IN_FEATURES, CLASSES, generator=generator)
    labels = (inputs @ teacher).argmax(dim=1)
    return TeacherTask(inputs, labels)
