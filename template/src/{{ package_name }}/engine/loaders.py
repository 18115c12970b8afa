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

import ctypes
import dataclasses
import itertools
import random
import sys
from collections.abc import Mapping

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, get_worker_info
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
    if isinstance(batch, torch.Tensor):  # the common cases, without a function call per tensor
        return batch.to(device, non_blocking=True)
    if type(batch) in (tuple, list, Batch) and all(isinstance(item, torch.Tensor) for item in batch):
        return type(batch)(item.to(device, non_blocking=True) for item in batch)
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
    if isinstance(batch, torch.Tensor) and batch.dim():  # the common cases, without walking a structure
        return len(batch)
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor) and batch[0].dim():
        return len(batch[0])
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
        skip, self.skip = self.skip, 0  # only the first epoch after a resume starts part-way
        # Paired as the batches are drawn, in C: no Python step per sample at the epoch's start.
        return zip(itertools.repeat(self.epoch), itertools.islice(super().__iter__(), skip, None))

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


class NumpyStream:
    """numpy's global stream (MT19937 and its cached normal) saved and put back in microseconds.

    get_state and set_state copy the generator's 624 words one Python step at a time (about 70 us the pair);
    here they are copied as one block, through the generator's own memory (`ctypes.state_address`). numpy
    also caches the second normal of each pair it draws, and only get_state reads that cache: one draw tells
    instead, as a cached normal is handed out without moving the generator. Where the generator is not an
    MT19937 laid out as checked here (another numpy), save and restore are get_state and set_state.
    """

    WORDS = 625  # mt19937_state: uint32 key[624], then int pos

    def __init__(self, bit_generator) -> None:
        self.bit_generator, self.words = bit_generator, None  # held: the words below are its memory
        if isinstance(bit_generator, np.random.MT19937):
            memory = (ctypes.c_uint32 * self.WORDS).from_address(bit_generator.ctypes.state_address)
            words, state = np.ctypeslib.as_array(memory), np.random.get_state()
            if np.array_equal(words[:624], state[1]) and int(words[624]) == state[2]:
                self.words = words

    def save(self):
        if self.words is None:
            return np.random.get_state()
        words = self.words.copy()
        normal = np.random.standard_normal()
        return words, normal if self.words.tobytes() == words.tobytes() else None

    def restore(self, saved) -> None:
        if self.words is None:
            np.random.set_state(saved)
            return
        words, cached = saved
        if cached is None:
            np.random.seed(0)  # empties the normal cache, as it was; the words below replace the stream
            self.words[:] = words
        else:  # the stream held a cached normal: only set_state can put one back
            np.random.set_state(("MT19937", words[:624], int(words[624]), 1, cached))


_numpy_stream = NumpyStream(None)  # one per process, for the generator numpy's global stream draws from


class PythonStream:
    """Python's global `random` stream saved and put back as one block of memory, as NumpyStream does numpy's.

    getstate and setstate build and read a tuple of 625 Python ints one by one; the generator's C state
    (its index, then its 624 words, right after the object header) is copied as 2500 bytes instead, and
    gauss_next (its cached normal) as the attribute it is. The layout is checked against getstate once per
    process; where it differs (another Python), save and restore are getstate and setstate.
    """

    SIZE = 4 + 624 * 4  # CPython's RandomObject: int index; uint32_t state[624]

    def __init__(self, generator: random.Random) -> None:
        self.generator, self.address = generator, None
        c_part = random.Random.__bases__[0]  # _random.Random, whose C struct holds the state
        if sys.implementation.name == "cpython" and c_part.__basicsize__ >= object.__basicsize__ + self.SIZE:
            address = id(generator) + object.__basicsize__  # id() is the object's address in CPython
            index, *words = (ctypes.c_uint32 * 625).from_address(address)
            if (*words, index) == generator.getstate()[1]:
                self.address = address

    def save(self):
        if self.address is None:
            return self.generator.getstate()
        return ctypes.string_at(self.address, self.SIZE), self.generator.gauss_next

    def restore(self, saved) -> None:
        if self.address is None:
            self.generator.setstate(saved)
            return
        memory, self.generator.gauss_next = saved
        ctypes.memmove(self.address, memory, self.SIZE)


_python_stream = PythonStream(random._inst)  # the generator behind random.random(), random.seed() and the rest


def numpy_stream() -> NumpyStream:
    global _numpy_stream
    get_bit_generator = getattr(np.random, "get_bit_generator", lambda: None)  # numpy >= 1.25
    if _numpy_stream.bit_generator is not get_bit_generator():  # the first call, or np.random.set_bit_generator
        _numpy_stream = NumpyStream(get_bit_generator())
    return _numpy_stream


class SampleSeeded(Dataset):
    """The recipe's dataset, with torch's, numpy's and Python's random draws seeded per sample.

    A sample's draws come from (seed, epoch, index); a dataset with `__getitems__` gets one seed per
    batch, from its first sample. Validation samples (plain indices) use epoch -1: the same every epoch.
    A rank without workers gets its own streams back after each batch, so it keeps its dropout stream;
    a worker draws from them for the dataset alone, so it leaves them seeded. Only CPU generators are
    seeded: workers cannot use CUDA.
    """

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, seed
        self.batched = callable(getattr(dataset, "__getitems__", None))

    def __len__(self) -> int:
        return len(self.dataset)

    def seed_draws(self, epoch: int, index: int) -> None:
        seed = sample_seed(self.seed, epoch, index)
        torch.default_generator.manual_seed(seed)  # not torch.manual_seed: that reseeds CUDA's streams too
        # numpy from 32 bits of it, as PyTorch seeds numpy in its workers: seed(int) skips seed(array)'s checks.
        np.random.seed((seed ^ (seed >> 32)) & 0xFFFFFFFF)
        random.seed(seed)

    def __getitem__(self, key):
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: list):
        if get_worker_info() is not None:
            return self.fetch(keys)
        stream = numpy_stream()
        saved = torch.default_generator.get_state(), stream.save(), _python_stream.save()
        try:
            return self.fetch(keys)
        finally:
            torch.default_generator.set_state(saved[0])
            stream.restore(saved[1])
            _python_stream.restore(saved[2])

    def fetch(self, keys: list):
        # One sampler gives every key of a batch: (epoch, index) pairs in training, plain indices in validation.
        epoch, indices = (keys[0][0], [index for _, index in keys]) if isinstance(keys[0], tuple) else (-1, keys)
        if self.batched:
            self.seed_draws(epoch, indices[0])
            return self.dataset.__getitems__(indices)
        samples = []
        for index in indices:
            self.seed_draws(epoch, index)
            samples.append(self.dataset[index])
        return samples


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
