"""How the engine feeds a recipe's datasets to the ranks: PyTorch's standard DataLoader path.

Training: DataLoader(batch_size=per-rank micro-batch, sampler=a DistributedSampler that can start an
epoch part-way). Any map-style Dataset with integer indexing works; one that implements PyTorch's
batched fetch (`__getitems__`) gets whole index lists instead, and may return a ready `Batch`.
Validation: each rank takes every world_size-th sample, without DistributedSampler's padding, so
exactly the N validation samples count once.
A batch may be any structure of tensors (tuples, lists, dicts, namedtuples, dataclasses): `to_device`
moves each tensor in it, and `samples_in` counts the batch by its first tensor's leading dimension.

Random draws inside the dataset (augmentation in `__getitem__`, with torch, numpy or Python's random)
are seeded per sample from (seed, epoch, index) by SampleSeeded: they depend on which sample is drawn
in which epoch, never on the process that draws it, so any num_workers and a resume mid-epoch give the
same batches.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler
from torch.utils.data._utils.collate import default_collate

from . import Batch
from .process_group import process_context


def collate(samples):
    return samples if isinstance(samples, Batch) else default_collate(samples)


def map_tensors(batch, change):
    """The batch in the same structure, with `change(tensor)` in place of each tensor; anything else as it is."""
    if isinstance(batch, torch.Tensor):
        return change(batch)
    if isinstance(batch, Mapping):
        changed = {key: map_tensors(value, change) for key, value in batch.items()}
        try:
            return type(batch)(changed)
        except TypeError:  # a mapping that cannot be built from a dict (e.g. a defaultdict): a plain dict
            return changed
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(map_tensors(value, change) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_tensors(value, change) for value in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        fields = [field.name for field in dataclasses.fields(batch) if field.init]
        return dataclasses.replace(batch, **{name: map_tensors(getattr(batch, name), change) for name in fields})
    return batch


def to_device(batch, device: torch.device):
    """The batch with every tensor in it on `device` (tensors, tuples, lists, dicts, namedtuples, dataclasses)."""
    if isinstance(batch, torch.Tensor):  # the common case, without a function call per tensor
        return batch.to(device, non_blocking=True)
    return map_tensors(batch, lambda tensor: tensor.to(device, non_blocking=True))


def tensors_in(batch):
    """Every tensor in the batch, depth first, in the order map_tensors visits them."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from tensors_in(value)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            yield from tensors_in(value)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        for field in dataclasses.fields(batch):
            yield from tensors_in(getattr(batch, field.name))


def samples_in(batch) -> int:
    """How many samples the batch holds: the leading dimension of its first tensor."""
    if isinstance(batch, torch.Tensor) and batch.dim():  # the common case, without walking a structure
        return len(batch)
    first = next(tensors_in(batch), None)
    if first is None or first.dim() == 0:
        raise TypeError(
            f"cannot count the samples of a batch of type {type(batch).__name__}: it holds no tensor with a "
            "batch dimension; return tensors from the Dataset (or its collate_fn)"
        )
    return len(first)


class ResumableSampler(DistributedSampler):
    """DistributedSampler whose next epoch can start after the first `skip` of this rank's samples.

    A run resumed mid-epoch continues with exactly the samples it had not trained on yet, without
    loading the ones it skips. The order is DistributedSampler's own (seed + epoch). It yields
    (epoch, index) pairs, so that SampleSeeded, in whichever worker, knows the epoch too.
    """

    skip = 0

    def __iter__(self):
        order = list(super().__iter__())
        skip, self.skip = self.skip, 0  # only the first epoch after a resume starts part-way
        return iter([(self.epoch, index) for index in order[skip:]])

    def __len__(self) -> int:
        return self.num_samples - self.skip


class EveryNth(Sampler):
    """Samples rank, rank + world_size, ...: every sample on exactly one rank, none padded or repeated."""

    def __init__(self, size: int, rank: int, world_size: int) -> None:
        self.indices = range(rank, size, world_size)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


_BITS = 2**64 - 1


def sample_seed(*numbers: int) -> int:
    """A 64-bit seed that depends on every one of the numbers (splitmix64's mixing, one round per number)."""
    mixed = 0x9E3779B97F4A7C15
    for number in numbers:
        mixed = ((mixed ^ (number & _BITS)) * 0xBF58476D1CE4E5B9) & _BITS
        mixed = ((mixed ^ (mixed >> 31)) * 0x94D049BB133111EB) & _BITS
    return mixed ^ (mixed >> 29)


class SampleSeeded(Dataset):
    """The recipe's dataset, with torch's, numpy's and Python's random draws seeded per sample.

    A sample's draws come from (seed, epoch, index); a dataset with `__getitems__` gets one seed per
    batch, from its first sample. Validation samples (plain indices) use epoch -1: the same every epoch.
    The process's own streams are put back after each batch, so a rank without workers keeps its
    dropout stream. Only CPU generators are seeded: workers cannot use CUDA.
    """

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, seed
        self.batched = callable(getattr(dataset, "__getitems__", None))

    def __len__(self) -> int:
        return len(self.dataset)

    def seed_draws(self, epoch: int, index: int) -> None:
        seed = sample_seed(self.seed, epoch, index)
        torch.default_generator.manual_seed(seed)  # not torch.manual_seed: that reseeds CUDA's streams too
        np.random.seed((seed & 0xFFFFFFFF, seed >> 32))
        random.seed(seed)

    def __getitem__(self, key):
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: list):
        keys = [key if isinstance(key, tuple) else (-1, key) for key in keys]
        saved = torch.default_generator.get_state(), np.random.get_state(), random.getstate()
        try:
            if self.batched:
                self.seed_draws(*keys[0])
                return self.dataset.__getitems__([index for _, index in keys])
            samples = []
            for epoch, index in keys:
                self.seed_draws(epoch, index)
                samples.append(self.dataset[index])
            return samples
        finally:
            torch.default_generator.set_state(saved[0])
            np.random.set_state(saved[1])
            random.setstate(saved[2])


def seed_worker(worker_id: int) -> None:
    """DataLoader workers: python and numpy follow the worker's torch seed (set from the loader's generator)."""
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


def _loader(dataset: Dataset, batch_size: int, sampler: Sampler, workers: int, seed: int, rank: int, pin: bool, **more):
    return DataLoader(
        SampleSeeded(dataset, seed),
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=collate,
        num_workers=workers,
        persistent_workers=workers > 0,  # started once per run, not once per epoch and validation
        # Spawned, as the ranks are and as on Windows: a Dataset that Windows cannot pickle fails on Linux too.
        multiprocessing_context=process_context() if workers > 0 else None,
        worker_init_fn=seed_worker,
        generator=torch.Generator().manual_seed(seed + rank),
        pin_memory=pin,
        **more,
    )


def training_loader(dataset, micro_batch: int, rank: int, world_size: int, seed: int, workers: int, pin: bool):
    # drop_last twice: every rank gets as many samples (sampler) and every micro-batch is full (loader).
    sampler = ResumableSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True)
    return _loader(dataset, micro_batch, sampler, workers, seed, rank, pin, drop_last=True)


def validation_loader(dataset, batch: int, rank: int, world_size: int, seed: int, workers: int, pin: bool):
    return _loader(dataset, batch, EveryNth(len(dataset), rank, world_size), workers, seed, rank, pin)
