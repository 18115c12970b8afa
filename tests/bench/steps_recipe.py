"""The default recipe of the benchmarked project through training_step and validation_step instead of loss and metric.

`bench.py` trains it with `--recipe steps_recipe` (this folder on PYTHONPATH, BENCH_PACKAGE naming the
project's package): the engine's general step on the same work as the default recipe's pair path.
"""

from __future__ import annotations

import importlib
import os

toy = importlib.import_module(f"{os.environ['BENCH_PACKAGE']}.recipe")
datasets, model, optimizer, schedule = toy.datasets, toy.model, toy.optimizer, toy.schedule


def training_step(wrapped, batch):
    inputs, targets = batch
    outputs = wrapped(inputs)
    return toy.loss(outputs, targets), {"accuracy": toy.metric(outputs.detach(), targets) / len(targets)}


def validation_step(module, batch):
    inputs, targets = batch
    outputs = module(inputs)
    return {"loss": toy.loss(outputs, targets) * len(targets), "accuracy": toy.metric(outputs, targets)}
