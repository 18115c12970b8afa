"""A recipe for checking gradient clipping by arithmetic: plain SGD, lr 1, no momentum, a constant schedule.

One optimizer step moves the weights by lr times the (clipped) gradient, so with max_grad_norm = c and a
larger gradient norm, the weights move by exactly c in L2.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

SAMPLES, FEATURES, CLASSES = 32, 4, 3
METRIC = "accuracy"


def datasets(config):
    generator = torch.Generator().manual_seed(config.seed)
    inputs = torch.randn(SAMPLES, FEATURES, generator=generator) * 5
    labels = torch.randint(0, CLASSES, (SAMPLES,), generator=generator)
    return TensorDataset(inputs, labels), TensorDataset(inputs[:8], labels[:8])


def model(config, devices):
    return nn.Linear(FEATURES, CLASSES).to(devices[0])


def optimizer(model, config):
    return torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.0)


def schedule(optimizer, config, total_steps):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def loss(outputs, targets):
    return nn.functional.cross_entropy(outputs, targets)


def metric(outputs, targets):
    return (outputs.argmax(dim=1) == targets).sum()
