"""A recipe that takes its model's width and a name from [recipe] settings: `hidden` and `label`.

A run with another --set hidden=N builds another model, so its checkpoints do not fit this one's.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

METRIC = "accuracy"


def datasets(config):
    generator = torch.Generator().manual_seed(config.seed)
    inputs = torch.randn(config.settings["samples"] + 64, 4, generator=generator)
    labels = (inputs[:, 0] > 0).long()
    every = TensorDataset(inputs, labels)
    return torch.utils.data.Subset(every, range(64, len(every))), torch.utils.data.Subset(every, range(64))


def model(config, devices):
    hidden = config.settings["hidden"]
    return nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 2)).to(devices[0])


def optimizer(model, config):
    return torch.optim.SGD(model.parameters(), lr=config.settings["lr"])


def schedule(optimizer, config, total_steps):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def loss(outputs, targets):
    return nn.functional.cross_entropy(outputs.float(), targets)


def metric(outputs, targets):
    return (outputs.argmax(dim=1) == targets).sum()
