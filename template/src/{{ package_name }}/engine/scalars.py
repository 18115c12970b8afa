"""metrics.csv's scalars as TensorBoard event files, written by rank 0 when `tensorboard = true`."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

FOLDER = "tensorboard"
NOT_SCALARS = ("epoch", "step", "resumed")  # the x axis, and a marker that is no measurement
_writers: dict[Path, object] = {}


def missing_package(enabled: bool) -> str | None:
    """The config check of `tensorboard`: an error before any rank starts, instead of after an epoch."""
    if enabled and importlib.util.find_spec("tensorboard") is None:
        return "needs the tensorboard package: pip install tensorboard (or answer extras=tensorboard)"
    return None


def write(output_dir: Path, row: dict) -> None:
    """One metrics.csv row as scalars at the row's step, under <output_dir>/tensorboard; flushed, so a crash loses
    nothing written. A resumed run appends a new event file to the folder, and TensorBoard joins them by step."""
    writer = _writers.get(output_dir)
    if writer is None:
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when asked for

        writer = _writers[output_dir] = SummaryWriter(log_dir=str(output_dir / FOLDER))
    for name, value in row.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if name not in NOT_SCALARS and math.isfinite(number):
            writer.add_scalar(name, number, int(row["step"]))
    writer.flush()
