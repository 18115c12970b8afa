"""A model of about 50 M parameters for the memory row: what each rank holds of parameters, gradients and AdamW's state.

`bench.py` trains it through the rendered project (`--recipe memory_recipe`, this folder on PYTHONPATH) with
`--parallelism ddp` and `--parallelism fsdp` on 1, 2 and 4 gloo ranks. The engine wraps the model as it wraps any
recipe's (DistributedDataParallel, or fully_shard with each Linear a unit); the optimizer this recipe builds gets a
step hook that, after the first step, writes what this rank holds (local shards: DTensor.to_local()) as JSON to
BENCH_MEMORY_FILE.rank<N>.json.
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional
from torch.utils.data import TensorDataset

METRIC = "accuracy"
WIDTH, LAYERS, CLASSES = 2048, 12, 16  # 12 x (2048 x 2048 + 2048) + 2048 x 16 + 16: 50.39 M parameters
VALIDATION = 64


def datasets(config):
    generator = torch.Generator().manual_seed(config.seed)
    samples = config.settings["samples"] + VALIDATION
    inputs = torch.randn(samples, WIDTH, generator=generator)
    targets = torch.randint(0, CLASSES, (samples,), generator=generator)
    return TensorDataset(inputs[VALIDATION:], targets[VALIDATION:]), TensorDataset(
        inputs[:VALIDATION], targets[:VALIDATION]
    )


def model(config, devices):
    layers = [layer for _ in range(LAYERS) for layer in (nn.Linear(WIDTH, WIDTH), nn.ReLU())]
    return nn.Sequential(*layers, nn.Linear(WIDTH, CLASSES)).to(devices[0])


def local_bytes(tensor: torch.Tensor) -> int:
    """The bytes this rank holds of a tensor: a DTensor's local shard, or the tensor."""
    held = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return held.numel() * held.element_size()


def held(optimizer: torch.optim.Optimizer) -> dict:
    parameters = [parameter for group in optimizer.param_groups for parameter in group["params"]]
    states = [value for state in optimizer.state.values() for value in state.values() if torch.is_tensor(value)]
    return {
        "parameters": sum(local_bytes(parameter) for parameter in parameters),
        "gradients": sum(local_bytes(parameter.grad) for parameter in parameters if parameter.grad is not None),
        "optimizer": sum(local_bytes(value) for value in states),
        "parameter_count": sum(parameter.numel() for parameter in parameters),  # whole: a DTensor's numel
    }


def optimizer(model, config):
    chosen = torch.optim.AdamW(model.parameters(), lr=config.settings["lr"])
    path = os.environ.get("BENCH_MEMORY_FILE")

    def write_once(optimizer, args, kwargs):  # after the first step: gradients and AdamW's moments all exist
        if path and not os.path.exists(f"{path}.rank{dist.get_rank()}.json"):
            with open(f"{path}.rank{dist.get_rank()}.json", "w", encoding="utf-8") as handle:
                json.dump(held(optimizer), handle)

    chosen.register_step_post_hook(write_once)
    return chosen


def loss(outputs, targets):
    return functional.cross_entropy(outputs, targets)


def metric(outputs, targets):
    return (outputs.argmax(dim=1) == targets).sum()
