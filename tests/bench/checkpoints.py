"""Benchmark: the project's checkpoint save and load against plain torch, for states of several sizes.

    python tests/bench/checkpoints.py --package my_ddp --folder DIR [--sizes-mb 4 64 512] [--reps 5]

Run by bench.py with the rendered project's src/ first on PYTHONPATH, in a process of its own so that
the states it builds (up to 512 MB, and as much again loaded back) are freed when it ends. Prints one
JSON object: for each size, the medians of interleaved repetitions of

- save: `checkpoint.save_atomic` (temporary file, fsync, replace, fsync of the folder) against
  `torch.save` into an open file, flush and fsync;
- load: `checkpoint.load` (with its integrity check) against `torch.load(path, weights_only=True)`,
  both of the file just saved, so both read it from the page cache, and both into memory the process has
  not touched yet, as a resume's load is the first in its process: the memory the previous load freed is
  handed back to the system first (glibc's malloc_trim, outside the timing). A process that loads again
  into the pages its last load left mapped skips their page faults, and `torch.load` then copies at
  memory speed; `--reuse-memory` measures that case.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import importlib
import json
import os
import re
import statistics
import time
from pathlib import Path

import torch

LAYERS = 16  # tensors per half: a model's weights and the optimizer's momentum of each


def training_state(megabytes: int) -> dict:
    """A state shaped like the trainer's: weights, one optimizer moment per weight, plain values."""
    per_tensor = megabytes * 2**20 // 4 // (2 * LAYERS)  # float32 elements
    generator = torch.Generator().manual_seed(megabytes)
    weights = {f"{i}.weight": torch.randn(per_tensor, generator=generator) for i in range(LAYERS)}
    moments = {i: {"momentum_buffer": torch.randn(per_tensor, generator=generator)} for i in range(LAYERS)}
    return {"model": weights, "optimizer": {"state": moments, "param_groups": [{"lr": 0.1, "params": list(moments)}]},
            "global_step": 1000, "epoch": 3, "run_id": "0123abcd"}  # fmt: skip


def memory_releaser():
    """glibc's malloc_trim(0): freed memory goes back to the system, so the next load page-faults it in anew."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "malloc_trim"):
        raise SystemExit("loads into fresh memory need glibc's malloc_trim; run with --reuse-memory here")
    return lambda: libc.malloc_trim(0)


def timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def measure(checkpoint, state: dict, folder: Path, reps: int, before_load) -> dict[str, float]:
    """Medians of each action; every save writes a new file, as training does (step-N), and the loads read it."""
    paths = {"ours": folder / "step-00000000-0123abcd.pt", "plain": folder / "plain-0.pt"}

    def fresh(kind: str, rep: int) -> Path:
        paths[kind].unlink(missing_ok=True)  # untimed, as the trainer's prune after a save
        paths[kind] = paths[kind].with_name(re.sub(r"\d+", f"{rep:08d}", paths[kind].name, count=1))
        return paths[kind]

    def plain_save(path: Path) -> None:
        with open(path, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())

    samples: dict[str, list[float]] = {"save_atomic": [], "torch.save + fsync": [], "load": [], "torch.load": []}
    for rep in range(reps + 1):  # the first round is not counted: code and allocator warm up
        order = ["ours", "plain"] if rep % 2 == 0 else ["plain", "ours"]  # alternate, so drift hits both alike
        times = {}
        for kind in order:
            path = fresh(kind, rep)
            if kind == "ours":
                times["save_atomic"] = timed(lambda path=path: checkpoint.save_atomic(state, path))
            else:
                times["torch.save + fsync"] = timed(lambda path=path: plain_save(path))
        for kind in order:
            before_load()
            if kind == "ours":
                times["load"] = timed(lambda: checkpoint.load(paths["ours"]))
            else:
                times["torch.load"] = timed(lambda: torch.load(paths["plain"], map_location="cpu", weights_only=True))
        if rep:
            for name, value in times.items():
                samples[name].append(value)
    for path in paths.values():
        path.unlink()
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--package", required=True)
    parser.add_argument("--folder", type=Path, required=True, help="scratch folder on the disk to measure")
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[4, 64, 512])
    parser.add_argument("--reps", type=int, default=5, help="repetitions at 512 MB; smaller states get more")
    parser.add_argument("--reuse-memory", action="store_true", help="load into the pages the last load freed")
    args = parser.parse_args()
    before_load = (lambda: None) if args.reuse_memory else memory_releaser()
    checkpoint = importlib.import_module(f"{args.package}.engine.checkpoint")
    results = {}
    for megabytes in args.sizes_mb:
        reps = args.reps * max(1, round((512 / megabytes) ** 0.5))  # 5, 15, 55 at 512, 64, 4 MB
        state = training_state(megabytes)
        medians = measure(checkpoint, state, args.folder, reps, before_load)
        results[str(megabytes)] = {"reps": reps, "medians": medians,
                                   "save ratio": medians["save_atomic"] / medians["torch.save + fsync"],
                                   "load ratio": medians["load"] / medians["torch.load"]}  # fmt: skip
        del state
    print(json.dumps({"source": checkpoint.__file__, "fresh memory": not args.reuse_memory, "sizes": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
