"""A recipe with a two-headed model and exact macro-F1, for the tests.

Batches are (features, label, size) triples; the model returns a tuple (class logits, size estimate), and
training_step combines both losses. validation_step returns sums (per-class true positives, false positives
and false negatives as tensors), and metrics() turns the global sums into macro-F1, exact for any world size
and batch size.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

FEATURES, CLASSES = 6, 4
TRAINING_SAMPLES, VALIDATION_SAMPLES, TEST_SAMPLES = 256, 101, 77


class Blobs(Dataset):
    """Gaussian blobs, one per class, of unequal sizes; `size` is the distance from the origin (the second head)."""

    def __init__(self, count: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        centres = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(0)) * 1.5
        self.labels = torch.multinomial(torch.tensor([0.4, 0.3, 0.2, 0.1]), count, True, generator=generator)
        self.features = centres[self.labels] + torch.randn(count, FEATURES, generator=generator)
        self.sizes = self.features.norm(dim=1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.features[index], self.labels[index], self.sizes[index]


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU())
        self.classes = nn.Linear(16, CLASSES)
        self.size = nn.Linear(16, 1)

    def forward(self, features):
        hidden = self.body(features)
        return self.classes(hidden), self.size(hidden).squeeze(-1)


def datasets(config):
    return Blobs(TRAINING_SAMPLES, config.seed), Blobs(VALIDATION_SAMPLES, config.seed + 1)


def test_dataset(config):
    """For `evaluate --split test`: data no training run saw."""
    return Blobs(TEST_SAMPLES, config.seed + 2)


def model(config, devices):
    return TwoHeads().to(devices[0])


def optimizer(model, config):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def schedule(optimizer, config, total_steps):
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)


def losses(model, batch):
    features, labels, sizes = batch
    logits, size = model(features)
    classification = nn.functional.cross_entropy(logits.float(), labels, reduction="none")
    regression = (size.float() - sizes) ** 2
    return logits, classification, regression


def training_step(model, batch):
    logits, classification, regression = losses(model, batch)
    return classification.mean() + 0.1 * regression.mean(), {"size_error": regression.mean()}


def validation_step(model, batch):
    logits, classification, regression = losses(model, batch)
    predicted, labels = logits.argmax(dim=1), batch[1]
    hits = nn.functional.one_hot(predicted, CLASSES) * nn.functional.one_hot(labels, CLASSES)
    return {
        "loss": (classification + 0.1 * regression).sum(),
        "tp": hits.sum(dim=0),
        "fp": nn.functional.one_hot(predicted, CLASSES).sum(dim=0) - hits.sum(dim=0),
        "fn": nn.functional.one_hot(labels, CLASSES).sum(dim=0) - hits.sum(dim=0),
    }


def metrics(sums):
    f1 = 2 * sums["tp"] / (2 * sums["tp"] + sums["fp"] + sums["fn"]).clamp(min=1)
    return {"macro_f1": f1.mean(), "accuracy": sums["tp"].sum() / sums["samples"]}
