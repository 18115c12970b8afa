"""A recipe whose validation loss rises every epoch, for the early-stopping tests.

One weight w, starting at 0, with x = 1: training pulls w towards +1 ((w - 1)^2), so w grows every
step, and the validation loss (w + 1)^2 grows with it. The best val_loss is epoch 1's.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

SAMPLES = 64
METRIC = "w"


def datasets(config):
    ones = torch.ones(SAMPLES, 1)
    return TensorDataset(ones, ones), TensorDataset(ones[:8], -ones[:8])


def model(config, devices):
    layer = nn.Linear(1, 1, bias=False)
    nn.init.zeros_(layer.weight)
    return layer.to(devices[0])


def optimizer(model, config):
    return torch.optim.SGD(model.parameters(), lr=0.05)


def schedule(optimizer, config, total_steps):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def loss(outputs, targets):
    return nn.functional.mse_loss(outputs, targets)


def metric(outputs, targets):
    return outputs.sum()  # the mean output is w: the column shows it growing
