"""metrics.csv's scalars as TensorBoard event files, written by rank 0 when `tensorboard = true`."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

_writers: dict[Path, object] = {}


def missing_package(enabled: bool) -> str | None:
    """The config check of `tensorboard`: an error before any rank starts, instead of after an epoch."""
    if enabled and importlib.util.find_spec("tensorboard") is None:
        return "needs the tensorboard package: pip install tensorboard (or answer extras=tensorboard)"
    return None


def write(output_dir: Path, row: dict) -> None:
    """A row's measurements at its step, flushed; a resumed run adds an event file, joined by step."""
    if output_dir not in _writers:
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when asked for

        _writers[output_dir] = SummaryWriter(log_dir=str(output_dir / "tensorboard"))
    writer = _writers[output_dir]
    for name, value in row.items():
        if name not in ("epoch", "step", "resumed") and math.isfinite(value):  # x axis, and a marker
            writer.add_scalar(name, value, int(row["step"]))
    writer.flush()
