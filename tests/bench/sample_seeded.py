"""What the engine's training loader costs a batch, and what seeding every sample's random draws adds to it.

    python tests/bench/sample_seeded.py --package PACKAGE [--reps 5]

The rendered project's own data (data.make_dataset, one sample per `__getitem__`) and the same data fetched a
batch at a time by a `__getitems__` that returns a ready `Batch`, read as rank 0 of 2 reads it:
batches of 32, no workers. Three loaders of each, interleaved repetitions:
- "SampleSeeded": engine.loaders.training_loader drawn through batches_of, as the trainer draws it
  (ResumableSampler cut by KeyBatches, and SampleSeeded: torch, numpy and Python's random seeded from
  (seed, epoch, index), the rank's own streams put back after each batch);
- "unseeded": the same loader with SampleSeeded's fetch replaced by the dataset's own;
- "plain indexing": DataLoader(dataset, sampler=DistributedSampler, collate_fn=collate), iterated.
Prints JSON: the medians in microseconds per batch, and each loader's ratio to plain indexing.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

BATCH, RANKS, SAMPLES = 32, 2, 8192  # bench.py's throughput runs: a global batch of 64 over 2 ranks
EPOCHS = 8  # per timing: 1024 batches


class WholeBatches(Dataset):
    """The default data fetched a batch per call: one indexing operation, returned as the engine's `Batch`."""

    def __init__(self, dataset: Dataset, batch_type: type) -> None:
        self.dataset, self.batch_type = dataset, batch_type

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        return self.dataset[index]

    def __getitems__(self, indices: list):
        chosen = torch.tensor(indices)
        return self.batch_type((self.dataset.inputs[chosen], self.dataset.labels[chosen]))


def per_batch_us(sampler: DistributedSampler, batches_of) -> float:
    """Microseconds per batch of `batches_of()` over EPOCHS epochs of `sampler`."""
    batches, started = 0, time.perf_counter()
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for _ in batches_of():
            batches += 1
    return (time.perf_counter() - started) / batches * 1e6


def unseeded_fetch(dataset: Dataset):
    """SampleSeeded's fetch of its keys (epoch, [indices of a batch, ...]) without the seeding: the dataset's own."""
    if hasattr(dataset, "__getitems__"):
        return lambda keys: [dataset.__getitems__(indices) for indices in keys[1]]
    return lambda keys: [[dataset[index] for index in indices] for indices in keys[1]]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--package", required=True, help="the rendered project's package (installed)")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    data = importlib.import_module(f"{args.package}.data")
    loaders = importlib.import_module(f"{args.package}.engine.loaders")
    torch.set_num_threads(1)  # as each of 2 ranks on 2 cores
    dataset = data.make_dataset(SAMPLES, 0)
    timed = {}
    engine = importlib.import_module(f"{args.package}.engine")
    for kind, chosen in (("batched", WholeBatches(dataset, engine.Batch)), ("one by one", dataset)):
        sampler = DistributedSampler(chosen, num_replicas=RANKS, rank=0, shuffle=True, seed=0, drop_last=True)
        plain = DataLoader(chosen, batch_size=BATCH, sampler=sampler, drop_last=True, collate_fn=loaders.collate)
        seeded = loaders.training_loader(chosen, BATCH, 0, RANKS, 0, workers=0, pin=False)
        unseeded = loaders.training_loader(chosen, BATCH, 0, RANKS, 0, workers=0, pin=False)
        unseeded.dataset.__getitems__ = unseeded_fetch(chosen)
        timed[f"{kind}, plain indexing"] = lambda loader=plain: per_batch_us(loader.sampler, lambda: loader)
        for name, loader in (("SampleSeeded", seeded), ("unseeded", unseeded)):
            timed[f"{kind}, {name}"] = lambda loader=loader: per_batch_us(  # as Trainer.run_epoch draws them
                loaders.order_of(loader), lambda: loaders.batches_of(loader)
            )
    samples: dict[str, list[float]] = {name: [] for name in timed}
    for rep in range(args.reps + 1):  # the first round warms up
        for name in timed if rep % 2 == 0 else reversed(timed):
            value = timed[name]()
            if rep:
                samples[name].append(value)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    ratios = {f"{kind}, {name}": medians[f"{kind}, {name}"] / medians[f"{kind}, plain indexing"]
              for kind in ("batched", "one by one") for name in ("SampleSeeded", "unseeded")}  # fmt: skip
    print(json.dumps({"reps": args.reps, "batch": BATCH, "us_per_batch": medians, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
