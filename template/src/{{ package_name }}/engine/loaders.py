"""How the engine feeds a recipe's datasets to the ranks: PyTorch's standard DataLoader path.

Training: DataLoader(batch_sampler=a DistributedSampler that can start an epoch part-way, cut into
per-rank micro-batches). Any map-style Dataset with integer indexing works; one that implements
PyTorch's batched fetch (`__getitems__`) gets whole index lists instead, and may return a ready `Batch`.
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
    """DistributedSampler whose epoch can start after the first `skip` of this rank's samples.

    A run resumed mid-epoch continues with exactly the samples it had not trained on yet, without
    loading the ones it skips. The order is DistributedSampler's own (seed + epoch). The trainer sets
    `skip` with every epoch (0 but in the first after a resume); each iteration of the epoch skips alike.
    """

    skip = 0

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.skip, None)

    def __len__(self) -> int:
        return self.num_samples - self.skip


class EveryNth(Sampler):
    """Samples rank, rank + world_size, ...: every sample on exactly one rank, none padded or repeated."""

    epoch = -1  # validation draws the same every epoch (SampleSeeded)

    def __init__(self, size: int, rank: int, world_size: int) -> None:
        self.indices = range(rank, size, world_size)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class KeyBatches(Sampler):
    """A sampler's order in batches of `size`, each as (epoch, [index, ...]): the keys SampleSeeded fetches.

    The epoch travels with the indices, so SampleSeeded knows it in whichever worker. A batch is one slice
    of the epoch's order, where BatchSampler takes a Python step per sample (docs/performance.md).
    """

    def __init__(self, sampler: Sampler, size: int, drop_last: bool) -> None:
        self.sampler, self.size, self.drop_last = sampler, size, drop_last

    def __iter__(self):
        # A generator: the order is drawn with the first batch (a worker DataLoader calls iter() twice on its
        # first epoch and draws from the second only).
        order, size, epoch = list(self.sampler), self.size, self.sampler.epoch
        end = len(order) - len(order) % size if self.drop_last else len(order)
        for start in range(0, end, size):
            yield epoch, order[start : start + size]

    def __len__(self) -> int:
        full, rest = divmod(len(self.sampler), self.size)
        return full + (rest > 0 and not self.drop_last)


_BITS = 2**64 - 1


SEED_START = 0x9E3779B97F4A7C15


def mixed_in(mixed: int, number: int) -> int:
    """`mixed` with the number mixed in: one round of splitmix64's mixing."""
    mixed = ((mixed ^ (number & _BITS)) * 0xBF58476D1CE4E5B9) & _BITS
    return ((mixed ^ (mixed >> 31)) * 0x94D049BB133111EB) & _BITS


def sample_seed(*numbers: int) -> int:
    """A 64-bit seed that depends on every one of the numbers, one round each."""
    mixed = SEED_START
    for number in numbers:
        mixed = mixed_in(mixed, number)
    return mixed ^ (mixed >> 29)


class Stream:
    """One of the global random streams a dataset may draw from, seeded per sample or watched for draws.

    `mark()` is a few numbers that every draw changes, read without copying the state (None where a draw
    might not show in it); `save()` and `restore()` copy the whole state.
    """

    name = ""
    kept = (None, None)  # (mark, saved): the last save, and the mark it was taken at

    def saved_at(self, mark):
        """`save()`, taken again only when the mark has moved since the last one: the rank's own state."""
        if self.kept[0] != mark:
            self.kept = mark, self.save()
        return self.kept[1]


class TorchStream(Stream):
    """torch's default CPU generator, seeded for every sample: a dataset may read torch.initial_seed() too."""

    name = "torch"

    def seed(self, seed: int) -> None:
        torch.default_generator.manual_seed(seed)  # not torch.manual_seed: that reseeds CUDA's streams too

    def save(self):
        return torch.default_generator.get_state()

    def restore(self, saved) -> None:
        torch.default_generator.set_state(saved)


class NumpyStream(Stream):
    """numpy's global stream (MT19937 and its cached normal) saved and put back in microseconds.

    get_state and set_state copy the generator's 624 words one Python step at a time (about 70 us the pair);
    here they are copied as one block, through the generator's own memory (`ctypes.state_address`). numpy
    also caches the second normal of each pair it draws, and only get_state reads that cache: one draw tells
    instead, as a cached normal is handed out without moving the generator. Where the generator is not an
    MT19937 laid out as checked here (another numpy), save and restore are get_state and set_state.

    The mark is the position in the words and the first two words (the 624th draw from any point makes them
    anew). A draw that takes a cached normal moves none of them, so the mark counts only while the stream is
    known to cache none: `clean` is the mark of the last moment it cached none (just seeded, or put back
    without one), and a normal is cached only by a draw, which moves the mark.
    """

    name = "numpy"
    WORDS = 625  # mt19937_state: uint32 key[624], then int pos

    def __init__(self, bit_generator) -> None:
        self.bit_generator, self.words, self.clean = bit_generator, None, None  # held: the words are its memory
        if isinstance(bit_generator, np.random.MT19937):
            memory = (ctypes.c_uint32 * self.WORDS).from_address(bit_generator.ctypes.state_address)
            words, state = np.ctypeslib.as_array(memory), np.random.get_state()
            if np.array_equal(words[:624], state[1]) and int(words[624]) == state[2]:
                self.memory, self.words = memory, words

    def seed(self, seed: int) -> None:
        # 32 bits of the seed, as PyTorch seeds numpy in its workers: seed(int) skips seed(array)'s checks.
        np.random.seed((seed ^ (seed >> 32)) & 0xFFFFFFFF)
        if self.words is not None:
            self.clean = self.memory[624], self.memory[0], self.memory[1]

    def mark(self):
        if self.words is None:
            return None
        mark = self.memory[624], self.memory[0], self.memory[1]
        return mark if mark == self.clean else None

    def save(self):
        if self.words is None:
            return np.random.get_state()
        if self.mark() is not None:  # no cached normal to find out about
            return self.words.tobytes(), None
        words = self.words.tobytes()
        normal = np.random.standard_normal()
        return words, normal if self.words.tobytes() == words else None

    def restore(self, saved) -> None:
        if self.words is None:
            np.random.set_state(saved)
            return
        words, cached = saved
        if cached is None:
            np.random.seed(0)  # empties the normal cache, as it was; the words below replace the stream
            self.words[:] = np.frombuffer(words, dtype=np.uint32)
            self.clean = self.memory[624], self.memory[0], self.memory[1]
        else:  # the stream held a cached normal: only set_state can put one back
            words = np.frombuffer(words, dtype=np.uint32)
            np.random.set_state(("MT19937", words[:624], int(words[624]), 1, cached))


_numpy_stream = NumpyStream(None)  # one per process, for the generator numpy's global stream draws from


class PythonStream(Stream):
    """Python's global `random` stream saved and put back as one block of memory, as NumpyStream does numpy's.

    getstate and setstate build and read a tuple of 625 Python ints one by one; the generator's C state
    (its index, then its 624 words, right after the object header) is copied as 2500 bytes instead, and
    gauss_next (its cached normal) as the attribute it is. The layout is checked against getstate once per
    process; where it differs (another Python), save and restore are getstate and setstate, and there is no
    mark. The mark is the index, the first two words (the 624th draw from any point makes them anew) and
    gauss_next.
    """

    name = "python"
    SIZE = 4 + 624 * 4  # CPython's RandomObject: int index; uint32_t state[624]

    def __init__(self, generator: random.Random) -> None:
        self.generator, self.address = generator, None
        c_part = random.Random.__bases__[0]  # _random.Random, whose C struct holds the state
        if sys.implementation.name == "cpython" and c_part.__basicsize__ >= object.__basicsize__ + self.SIZE:
            address = id(generator) + object.__basicsize__  # id() is the object's address in CPython
            index, *words = (ctypes.c_uint32 * 625).from_address(address)
            if (*words, index) == generator.getstate()[1]:
                self.address, self.memory = address, (ctypes.c_uint32 * 3).from_address(address)

    def seed(self, seed: int) -> None:
        self.generator.seed(seed)

    def mark(self):
        if self.address is None:
            return None
        return self.memory[0], self.memory[1], self.memory[2], self.generator.gauss_next

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


_torch_stream = TorchStream()
_python_stream = PythonStream(random._inst)  # the generator behind random.random(), random.seed() and the rest
_get_bit_generator = getattr(np.random, "get_bit_generator", lambda: None)  # numpy >= 1.25


def numpy_stream() -> NumpyStream:
    global _numpy_stream
    if _numpy_stream.bit_generator is not _get_bit_generator():  # the first call, or np.random.set_bit_generator
        _numpy_stream = NumpyStream(_get_bit_generator())
    return _numpy_stream


class SampleSeeded(Dataset):
    """The recipe's dataset, with torch's, numpy's and Python's random draws seeded per sample.

    It fetches a batch at a time, keyed (epoch, [index, ...]) by KeyBatches. A sample's draws come from
    (seed, epoch, index); a dataset with `__getitems__` gets one seed per batch, from its first sample.
    Validation batches come with epoch -1 (EveryNth): the same every epoch.
    A rank without workers gets its own streams back after each batch, so it keeps its dropout stream;
    a worker draws from them for the dataset alone, so it leaves them seeded. Only CPU generators are
    seeded: workers cannot use CUDA.

    torch's stream is seeded for every sample. numpy's and Python's are seeded once the dataset is seen to
    draw from them, as seeding and putting them back would cost a plain batch more than its fetch: until
    then each is watched through its mark, and the first batch that moves one is fetched again, with that
    stream put back as it was and seeded from then on. So in each process (a rank, or a worker) that batch
    is fetched twice.
    """

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, seed
        self.batched = callable(getattr(dataset, "__getitems__", None))
        self.draws_from: set[str] = set()  # the names of the watched streams the dataset has drawn from
        self.epoch_mixed = (None, 0)  # (epoch, the seed and epoch mixed): where each sample's seed starts

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]):
        epoch, index = key
        return self.__getitems__((epoch, [index]))[0]

    def __getitems__(self, keys: tuple[int, list]):
        in_worker = get_worker_info() is not None
        seeded, watched = [_torch_stream], []
        for stream in (numpy_stream(), _python_stream):
            mark = None if stream.name in self.draws_from else stream.mark()
            if mark is None:
                seeded.append(stream)
            else:
                watched.append((stream, mark, None if in_worker else stream.saved_at(mark)))
        samples = self.fetch_seeded(keys, seeded, in_worker)
        moved = [(stream, saved) for stream, mark, saved in watched if stream.mark() != mark]
        if not moved:
            return samples
        for stream, saved in moved:  # drawn from unseeded: put back, and the batch again with all seeded
            if saved is not None:
                stream.restore(saved)
            self.draws_from.add(stream.name)
        return self.fetch_seeded(keys, [_torch_stream, numpy_stream(), _python_stream], in_worker)

    def fetch_seeded(self, keys: tuple[int, list], streams: list, in_worker: bool):
        """The samples, with `streams` seeded for each; a rank without workers gets its own states back."""
        outer = [] if in_worker else [(stream, stream.save()) for stream in streams]
        try:
            return self.fetch(keys, streams)
        finally:
            for stream, saved in outer:
                stream.restore(saved)

    def fetch(self, keys: tuple[int, list], streams: list):
        epoch, indices = keys
        if self.epoch_mixed[0] != epoch:
            self.epoch_mixed = epoch, mixed_in(mixed_in(SEED_START, self.seed), epoch)
        if self.batched:
            seed_draws(streams, self.epoch_mixed[1], indices[0])
            return self.dataset.__getitems__(indices)
        samples = []
        for index in indices:
            seed_draws(streams, self.epoch_mixed[1], index)
            samples.append(self.dataset[index])
        return samples


def seed_draws(streams: list, epoch_mixed: int, index: int) -> None:
    """Seeds the streams with sample_seed(seed, epoch, index), from the seed and epoch mixed already."""
    seed = mixed_in(epoch_mixed, index)
    seed ^= seed >> 29  # sample_seed's last step
    for stream in streams:
        stream.seed(seed)


def seed_worker(worker_id: int) -> None:
    """DataLoader workers: python and numpy follow the worker's torch seed (set from the loader's generator)."""
    seed = torch.initial_seed() % 2**32
    _python_stream.seed(seed)
    numpy_stream().seed(seed)


def _loader(dataset: Dataset, batches: KeyBatches, workers: int, seed: int, rank: int, pin: bool):
    return DataLoader(
        SampleSeeded(dataset, seed),
        batch_sampler=batches,
        collate_fn=collate,
        num_workers=workers,
        persistent_workers=workers > 0,  # started once per run, not once per epoch and validation
        # Spawned, as the ranks are and as on Windows: a Dataset that Windows cannot pickle fails on Linux too.
        multiprocessing_context=process_context() if workers > 0 else None,
        worker_init_fn=seed_worker,
        generator=torch.Generator().manual_seed(seed + rank),
        pin_memory=pin,
    )


def training_loader(dataset, micro_batch: int, rank: int, world_size: int, seed: int, workers: int, pin: bool):
    # drop_last twice: every rank gets as many samples (sampler) and every micro-batch is full (batches).
    sampler = ResumableSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True)
    return _loader(dataset, KeyBatches(sampler, micro_batch, drop_last=True), workers, seed, rank, pin)


def validation_loader(dataset, batch: int, rank: int, world_size: int, seed: int, workers: int, pin: bool):
    batches = KeyBatches(EveryNth(len(dataset), rank, world_size), batch, drop_last=False)
    return _loader(dataset, batches, workers, seed, rank, pin)


def order_of(loader: DataLoader) -> Sampler:
    """The sampler behind a training_loader or validation_loader: the epoch's order (set_epoch, skip, len)."""
    return loader.batch_sampler.sampler


def batches_of(loader: DataLoader):
    """The loader's batches. Without workers they are fetched right here, as DataLoader would fetch them.

    DataLoader's own single-process iterator does the same fetch and collate, and adds a profiler record
    and its bookkeeping to every batch (what that costs a step: docs/performance.md).
    """
    if loader.num_workers:
        return iter(loader)
    return _fetched_here(loader.dataset, loader.batch_sampler, loader.pin_memory)


def _fetched_here(dataset: SampleSeeded, keys: KeyBatches, pin: bool):
    for batch_keys in keys:
        batch = collate(dataset.__getitems__(batch_keys))
        yield map_tensors(batch, torch.Tensor.pin_memory) if pin else batch
