"""A recipe whose Dataset augments at random in `__getitem__`, as torchvision transform pipelines do.

Each sample draws from torch and numpy, every 64th also from Python's random (a rare augmentation, whose
first draw comes in a later batch than the first), and the model has dropout: the draws in the data and the
rank's own stream must both come out the same whatever num_workers is, and after a resume.
Its settings come from [recipe] of the test's config: `samples` and `noise`.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

METRIC = "accuracy"
FEATURES, CLASSES = 8, 3


class Jittered(Dataset):
    def __init__(self, count: int, noise: float, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(count, FEATURES, generator=generator)
        self.labels = self.inputs[:, :CLASSES].argmax(dim=1)
        self.noise = noise

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        jitter = torch.randn(FEATURES) * self.noise  # torch's global generator
        jitter += torch.from_numpy(np.random.normal(0, self.noise, FEATURES)).float()
        scale = random.uniform(0.9, 1.1) if index % 64 == 0 else 1.0
        return (self.inputs[index] + jitter) * scale, int(self.labels[index])


def datasets(config):
    samples, noise = config.settings["samples"], config.settings["noise"]
    return Jittered(samples, noise, seed=config.seed), Jittered(64, noise, seed=config.seed + 1)


def model(config, devices):
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, CLASSES)).to(devices[0])


def optimizer(model, config):
    return torch.optim.SGD(model.parameters(), lr=config.settings["lr"], momentum=config.settings["momentum"])


def schedule(optimizer, config, total_steps):
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)


def loss(outputs, targets):
    return nn.functional.cross_entropy(outputs.float(), targets)


def metric(outputs, targets):
    return (outputs.argmax(dim=1) == targets).sum()
