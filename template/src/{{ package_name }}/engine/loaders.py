"""How each rank samples, fetches and moves a recipe's datasets: PyTorch's DataLoader, with its own iterator.

Any map-style Dataset works; one with PyTorch's batched fetch (`__getitems__`) gets whole index lists and may
return a ready `Batch`. A batch may be any structure of tensors (tuples, lists, dicts, namedtuples, dataclasses).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, Subset, get_worker_info
from torch.utils.data._utils.collate import default_collate

from . import Batch
from .processes import process_context
from .streams import WATCHED, sample_seed

# A rank without workers fetches this many batches at a time: SampleSeeded then saves, watches and puts back the
# random streams once per fetch, not once per batch (numpy's get_state alone takes about 30 us); the fetch's
# batches wait in memory until trained on. A worker fetches one batch at a time, as DataLoader's workers do.
FETCHED_TOGETHER = 8


def collate(samples):
    return samples if isinstance(samples, Batch) else default_collate(samples)


def collate_each(batches: list) -> list:
    """One fetch's batches, each collated."""
    return [collate(samples) for samples in batches]


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
    return map_tensors(batch, lambda tensor: tensor.to(device, non_blocking=True))


def samples_in(batch) -> int:
    """How many samples the batch holds: the leading dimension of its first tensor, in map_tensors' order."""
    found: list[torch.Tensor] = []

    def remember(tensor: torch.Tensor) -> torch.Tensor:
        found.append(tensor)
        return tensor

    map_tensors(batch, remember)
    if not found or found[0].dim() == 0:
        raise TypeError(
            f"cannot count the samples of a batch of type {type(batch).__name__}: it holds no tensor with a "
            "batch dimension; return tensors from the Dataset (or its collate_fn)"
        )
    return len(found[0])


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
    """A sampler's order in batches of `size`, `together` batches a fetch, each fetch as
    (epoch, [[index, ...], ...]): the keys SampleSeeded fetches.

    The epoch travels with the indices, so SampleSeeded knows it in whichever worker. A batch is one slice
    of the epoch's order, where BatchSampler takes a Python step per sample (docs/performance.md).
    """

    def __init__(self, sampler: Sampler, size: int, drop_last: bool, together: int) -> None:
        self.sampler, self.size, self.drop_last, self.together = sampler, size, drop_last, together

    def __iter__(self):
        # A generator: the order is drawn with the first batch (a worker DataLoader calls iter() twice on its
        # first epoch and draws from the second only).
        order, size, epoch = list(self.sampler), self.size, self.sampler.epoch
        end = len(order) - len(order) % size if self.drop_last else len(order)
        starts = range(0, end, size)
        for first in range(0, len(starts), self.together):
            yield epoch, [order[start : start + size] for start in starts[first : first + self.together]]

    def __len__(self) -> int:
        """Fetches per epoch."""
        full, rest = divmod(len(self.sampler), self.size)
        return -(-(full + (rest > 0 and not self.drop_last)) // self.together)


def fetches_whole_batches(dataset: Dataset) -> bool:
    """Whether the dataset has a batched fetch (`__getitems__`) of its own: a Subset has one if what it holds does."""
    if isinstance(dataset, Subset):
        return fetches_whole_batches(dataset.dataset)
    return callable(getattr(dataset, "__getitems__", None))


class SampleSeeded(Dataset):
    """The recipe's dataset, fetched a few batches at a time with each sample's random draws seeded (streams.py).

    Keys come from KeyBatches as (epoch, [[index, ...], ...]); a dataset with `__getitems__` of its own gets one
    seed per batch, from its first sample. Validation batches come with epoch -1 (EveryNth): the same every epoch.
    A rank without workers gets its own streams back after each fetch, so its dropout stream is its own;
    a worker draws from them for the dataset alone. Only CPU streams are seeded: workers cannot use CUDA.

    A stream (torch's, numpy's, Python's: streams.WATCHED) is seeded for every sample once the dataset is seen to
    draw from it: until then each fetch compares its state before and after, and a fetch that moved one is made
    again with that stream put back and seeded from then on (again until no other stream moves: a draw may hang
    on another). So in each process (a rank, or a worker) such a fetch is made twice, once per stream at most.
    """

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, seed
        self.batched = fetches_whole_batches(dataset)
        self.draws_from: set[str] = set()  # the names of the watched streams the dataset has drawn from

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, keys: tuple[int, list]):
        own = get_worker_info() is None  # a rank's own streams, to give back; a worker's are the dataset's
        before = {stream.name: stream.get() for stream in WATCHED if own or stream.name not in self.draws_from}
        try:
            while True:
                samples = self.fetch(keys)
                moved = [
                    stream
                    for stream in WATCHED
                    if stream.name not in self.draws_from and not stream.same(before[stream.name], stream.get())
                ]
                if not moved:
                    return samples
                for stream in moved:  # drawn from unseeded: put back, and the batch again with it seeded
                    stream.put(before[stream.name])
                    self.draws_from.add(stream.name)
        finally:
            if own:
                for stream in WATCHED:
                    if stream.name in self.draws_from:
                        stream.put(before[stream.name])

    def fetch(self, keys: tuple[int, list]) -> list:
        epoch, batches = keys
        seeded = [stream.seed for stream in WATCHED if stream.name in self.draws_from]
        return [self.fetch_batch(seeded, epoch, indices) for indices in batches]

    def fetch_batch(self, seeded: list, epoch: int, indices: list):
        if not seeded:
            return self.dataset.__getitems__(indices) if self.batched else [self.dataset[index] for index in indices]
        if self.batched:
            seed = sample_seed(self.seed, epoch, indices[0])
            for seed_stream in seeded:
                seed_stream(seed)
            return self.dataset.__getitems__(indices)
        samples, dataset, run_seed = [], self.dataset, self.seed
        for index in indices:  # per sample only the seeding and the fetch: a call more costs each
            seed = sample_seed(run_seed, epoch, index)
            for seed_stream in seeded:
                seed_stream(seed)
            samples.append(dataset[index])
        return samples


def _loader(dataset: Dataset, batches: KeyBatches, workers: int, seed: int, rank: int, pin: bool):
    return DataLoader(
        SampleSeeded(dataset, seed),
        batch_sampler=batches,
        collate_fn=collate_each,
        num_workers=workers,
        persistent_workers=workers > 0,  # started once per run, not once per epoch and validation
        # Spawned, as the ranks are and as on Windows: a Dataset that Windows cannot pickle fails on Linux too.
        multiprocessing_context=process_context() if workers > 0 else None,
        generator=torch.Generator().manual_seed(seed + rank),
        pin_memory=pin,
    )


def training_loader(dataset, micro_batch: int, rank: int, world_size: int, seed: int, workers: int, pin: bool):
    # drop_last twice: every rank gets as many samples (sampler) and every micro-batch is full (batches).
    sampler = ResumableSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True)
    batches = KeyBatches(sampler, micro_batch, drop_last=True, together=1 if workers else FETCHED_TOGETHER)
    return _loader(dataset, batches, workers, seed, rank, pin)


def validation_loader(dataset, batch: int, rank: int, world_size: int, seed: int, workers: int, pin: bool):
    together = 1 if workers else FETCHED_TOGETHER
    batches = KeyBatches(EveryNth(len(dataset), rank, world_size), batch, drop_last=False, together=together)
    return _loader(dataset, batches, workers, seed, rank, pin)


def order_of(loader: DataLoader) -> Sampler:
    """The sampler behind a training_loader or validation_loader: the epoch's order (set_epoch, skip, len)."""
    return loader.batch_sampler.sampler


def batches_of(loader: DataLoader):
    """The loader's batches, one at a time, from DataLoader's own iterator (with workers or without)."""
    return itertools.chain.from_iterable(iter(loader))
