"""Real work for the benchmark: a small CNN on 3x24x24 images, one sample per `__getitem__` with a random
flip, AdamW and a cosine schedule. A step takes milliseconds on a CPU core, as a user's model's does.

`bench.py` trains it through the rendered project (`--recipe cnn_recipe`, this folder on PYTHONPATH) and
through `cnn_tutorial.py`, the same work written as PyTorch's DDP tutorial writes it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import Dataset

METRIC = "accuracy"
CLASSES = 10


class FlippedImages(Dataset):
    """Images of 10 classes (a fixed pattern each, plus noise), flipped left to right at random when fetched."""

    def __init__(self, count: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        patterns = torch.randn(CLASSES, 3, 24, 24, generator=generator)
        self.labels = torch.randint(0, CLASSES, (count,), generator=generator)
        self.images = patterns[self.labels] + torch.randn(count, 3, 24, 24, generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index]
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        return image, self.labels[index]


def network() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 6 * 6, CLASSES),
    )  # fmt: skip


def datasets(config):
    samples = config.settings["samples"]
    return FlippedImages(samples, config.seed), FlippedImages(max(1, samples // 8), config.seed + 1)


def model(config, devices):
    return network().to(devices[0])


def optimizer(model, config):
    return torch.optim.AdamW(model.parameters(), lr=config.settings["lr"])


def schedule(optimizer, config, total_steps):
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)


def loss(outputs, targets):
    return functional.cross_entropy(outputs.float(), targets)


def metric(outputs, targets):
    return (outputs.argmax(dim=1) == targets).sum()
