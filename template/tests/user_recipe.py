"""A recipe written the way a user writes one, for the tests: nothing in it comes from the template.

An ordinary map-style Dataset (`dataset[i]` -> `(tensor, int)`, as in PyTorch's data tutorial),
another model, another loss, another optimizer and schedule. Train with it by setting
`recipe = "user_recipe"` (this folder on PYTHONPATH), as a user would with their own module.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import Dataset

METRIC = "top2"
FEATURES, CLASSES = 6, 4


class Points(Dataset):
    """Points on a circle, labelled by quadrant, with a little noise; one sample per __getitem__."""

    def __init__(self, count: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.angles = torch.rand(count, generator=generator) * 2 * math.pi
        self.noise = torch.randn(count, FEATURES, generator=generator) * 0.1

    def __len__(self) -> int:
        return len(self.angles)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        angle = float(self.angles[index])
        features = torch.tensor([math.cos(angle), math.sin(angle), math.cos(2 * angle), math.sin(2 * angle), 1.0, 0.0])
        return features + self.noise[index], int(angle // (math.pi / 2)) % CLASSES


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Dropout(0.1), nn.Linear(32, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def datasets(config):
    return Points(config.settings["samples"], seed=config.seed), Points(101, seed=config.seed + 1)


def model(config, devices):
    return Classifier().to(devices[0])


def optimizer(model, config):
    return torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)


def schedule(optimizer, config, total_steps):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / (total_steps + 1))


def loss(outputs, targets):
    return nn.functional.cross_entropy(outputs.float(), targets, label_smoothing=0.1)


def metric(outputs, targets):
    return (outputs.topk(2, dim=1).indices == targets[:, None]).any(dim=1).sum()
