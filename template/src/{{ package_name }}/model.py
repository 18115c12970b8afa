"""The toy model: Linear(10, 10) -> ReLU -> Linear(10, 5), returning logits."""

from __future__ import annotations

import torch
from torch import nn

IN_FEATURES = 10
HIDDEN = 10
CLASSES = 5


class ToyModel(nn.Module):
    """Returns raw logits: CrossEntropyLoss applies log-softmax itself."""

    def __init__(self) -> None:
        super().__init__()
        self.net1 = nn.Linear(IN_FEATURES, HIDDEN)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))


class ToyModelParallel(ToyModel):
    """The same layers split over two devices: net1 on `first`, net2 on `second`.

    One process owns both devices, so DDP wraps it without `device_ids`. The
    devices are parameters so the split runs on the CPU too (both "cpu").
    Parameters match ToyModel's for the same seed, so the two can be compared.
    """

    def __init__(self, first: torch.device, second: torch.device) -> None:
        super().__init__()
        self.first, self.second = torch.device(first), torch.device(second)
        self.net1.to(self.first)
        self.net2.to(self.second)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.relu(self.net1(x.to(self.first)))
        return self.net2(hidden.to(self.second))


def build(parallelism: str, devices: tuple[torch.device, ...]) -> nn.Module:
    """ToyModel on devices[0], or the split model over devices[0] and devices[1]."""
    if parallelism == "ddp_model_parallel":
        return ToyModelParallel(devices[0], devices[1])
    return ToyModel().to(devices[0])
