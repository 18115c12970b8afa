"""Checkpoints that survive Windows file semantics and interrupted writes.

Only rank 0 writes, through files.write_durably (temporary file, fsync,
os.replace, fsync of the folder), so a crash or a power cut mid-save leaves
the previous checkpoint intact. Loading uses
weights_only=True: a checkpoint holds only tensors and plain Python values.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from .files import write_durably

_NAME = re.compile(r"^step-(\d{8})\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read; the message names the file."""


def directory(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def path_for(output_dir: str | Path, global_step: int) -> Path:
    return directory(output_dir) / f"step-{global_step:08d}.pt"


def save_atomic(state: dict, path: Path) -> None:
    write_durably(path, lambda handle: torch.save(state, handle))


def existing(output_dir: str | Path) -> list[Path]:
    """Finished checkpoints, newest first (temporary files are never listed)."""
    folder = directory(output_dir)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if _NAME.match(p.name)]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)), reverse=True)


def prune(output_dir: str | Path, keep: int) -> None:
    """Keep the newest `keep` checkpoints; also drop temporary files a killed save left behind
    (only rank 0 writes, one save at a time, so no other save is in flight here)."""
    for old in existing(output_dir)[keep:]:
        old.unlink(missing_ok=True)
    for leftover in directory(output_dir).glob("*.pt.tmp"):
        leftover.unlink(missing_ok=True)


def load(path: Path) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: {path}") from None
    except Exception as error:  # torch raises several types for damaged files
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise CheckpointError(
            f"checkpoint {path} is damaged or not a checkpoint ({type(error).__name__}: {first_line})"
        ) from None
    if not isinstance(state, dict) or "model" not in state or "global_step" not in state:
        raise CheckpointError(f"checkpoint {path} does not hold a training state (no model or global_step)")
    return state


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint to <name>.damaged, so nothing later overwrites it and it can be inspected."""
    aside = path.with_name(path.name + ".damaged")
    os.replace(path, aside)
    return aside


def load_newest_good(output_dir: str | Path, warn) -> tuple[Path, dict] | None:
    """The newest checkpoint that loads. Damaged ones are reported and set aside (rank 0 alone calls this)."""
    candidates = existing(output_dir)
    for candidate in candidates:
        try:
            return candidate, load(candidate)
        except CheckpointError as error:
            warn(f"{error}; set aside as {set_aside(candidate).name}; falling back to the checkpoint before it")
    if candidates:
        warn(
            f"no checkpoint in {directory(output_dir)} loads (all {len(candidates)} were damaged and set aside as "
            "*.damaged): training starts from scratch"
        )
    return None
