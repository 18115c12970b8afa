"""The default recipe of the benchmarked project with a wide model: Linear(10, 4096) -> ReLU -> Linear(4096, 5).

`bench.py` trains it with `--recipe wide_recipe` (this folder on PYTHONPATH, BENCH_PACKAGE naming the
project's package), against the bare loop's `--hidden 4096`.
"""

from __future__ import annotations

import importlib
import os

from torch import nn

toy = importlib.import_module(f"{os.environ['BENCH_PACKAGE']}.recipe")
METRIC, datasets, optimizer, schedule, loss, metric = (
    toy.METRIC,
    toy.datasets,
    toy.optimizer,
    toy.schedule,
    toy.loss,
    toy.metric,
)


def model(config, devices):
    return nn.Sequential(nn.Linear(10, 4096), nn.ReLU(), nn.Linear(4096, 5)).to(devices[0])
