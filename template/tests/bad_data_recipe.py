"""The user's recipe, with one NaN sample in the training data (a broken file, a division by zero ...)."""

from __future__ import annotations

import torch
from user_recipe import METRIC, Points, loss, metric, model, optimizer, schedule  # noqa: F401

BROKEN_SAMPLE = 300


class PointsWithANaN(Points):
    def __getitem__(self, index: int):
        features, label = super().__getitem__(index)
        return (features * torch.nan if index == BROKEN_SAMPLE else features), label


def datasets(config):
    return PointsWithANaN(config.settings["samples"], seed=config.seed), Points(101, seed=config.seed + 1)
