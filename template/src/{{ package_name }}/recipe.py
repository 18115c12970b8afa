"""Your recipe: the model, the data, the optimizer and schedule, the loss and the metric.

This file is yours. `copier update` never touches it (nor model.py and data.py); the
engine (train.py and the modules it uses) calls these functions and owns the loop,
the ranks, checkpoints and logs. Point `recipe` in configs/train.toml at another
module to keep several recipes side by side. docs/make-it-your-own.md walks through
swapping in your own model, Dataset and optimizer.

Every function gets the run's Config (configs/train.toml plus flags). Your own settings live in
[recipe] there and arrive as `config.settings` (here lr, momentum and samples). Batches are
`(inputs, targets)`: inputs go to the rank's first device, targets to its last.

Required: datasets, model, optimizer, and loss, metric and METRIC (or training_step in their place).
Optional hooks, each with its section in docs/make-it-your-own.md:
- schedule(optimizer, config, total_steps) -> LRScheduler, stepped once per optimizer step; without it
  the learning rate stays constant (#your-own-model-optimizer-and-loss).
- training_step(model, batch) -> loss or (loss, {name: value}), instead of loss and metric
  (#two-heads-a-training-step-of-your-own).
- validation_step(model, batch) -> {name: sum over the batch}, added over the ranks
  (#exact-metrics-from-sums-macro-f1).
- metrics(sums) -> {name: float}, the epoch's figures from the global sums (#exact-metrics-from-sums-macro-f1).
- test_dataset(config) -> Dataset, for `evaluate --split test` (#scoring-a-checkpoint-evaluate).
- check(config) -> an error string or None, shown as the engine's own refusals (#your-recipes-settings).
"""

from __future__ import annotations

import json
import math

import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import Dataset, Subset

from .data import make_dataset
from .engine import Config
from .model import build

# The name of what metric() counts; metrics.csv gets "accuracy" and "val_accuracy" columns.
METRIC = "accuracy"


def datasets(config: Config) -> tuple[Dataset, Dataset]:
    """(training, validation). Every rank calls this, so keep it deterministic (seeded) or load from disk."""
    samples = config.settings["samples"]
    validation = max(1, samples // 4)
    every = make_dataset(samples + validation, config.seed)  # one teacher for both splits
    return Subset(every, range(samples)), Subset(every, range(samples, len(every)))


def model(config: Config, devices: tuple[torch.device, ...]) -> nn.Module:
    """The model on this rank's device(s); the engine wraps it in DistributedDataParallel.

    `devices` holds one device, or two when parallelism is ddp_model_parallel (the split model).
    """
    return build(config.parallelism, devices)


def optimizer(model: nn.Module, config: Config) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=config.settings["lr"], momentum=config.settings["momentum"])


def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The batch's mean loss (computed in fp32 under mixed precision)."""
    return functional.cross_entropy(outputs.float(), targets)


def metric(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed over the batch (here: correct predictions); the engine divides by the sample count."""
    return (outputs.argmax(dim=1) == targets).sum()


# -- optional hooks --------------------------------------------------------------------------------------------
def check(config: Config) -> str | None:
    """What is wrong with the settings, or None. A string refuses the run in one line (exit status 2), before
    anything is written: a value of the wrong type would otherwise fail deep inside torch, mid-start."""
    lr, momentum, samples = (config.settings.get(name) for name in ("lr", "momentum", "samples"))
    if not (is_number(lr) and math.isfinite(lr) and lr > 0):
        return f"lr is {shown(lr)} in [recipe]; use a number above 0, such as 0.1"
    if not (is_number(momentum) and 0 <= momentum < 1):
        return f"momentum is {shown(momentum)} in [recipe]; use a number from 0 up to (not including) 1, such as 0.9"
    if not (isinstance(samples, int) and not isinstance(samples, bool) and samples >= 1):
        return f"samples is {shown(samples)} in [recipe]; use a whole number of at least 1, such as 512"
    return None


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)  # TOML's true is no number


def shown(value) -> str:
    """A setting's value as the config file writes it: "fast" in quotes, missing when [recipe] lacks it."""
    return "missing" if value is None else json.dumps(value)


def schedule(optimizer: torch.optim.Optimizer, config: Config, total_steps: int):
    """Stepped once per optimizer step. A resume with another length calls this again with the new total."""
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
