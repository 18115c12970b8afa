"""Checkpoints that survive Windows file semantics and interrupted writes.

Only rank 0 writes, through files.write_durably (temporary file, fsync,
os.replace, fsync of the folder), so a crash or a power cut mid-save leaves
the previous checkpoint intact. Loading uses
weights_only=True: a checkpoint holds only tensors and plain Python values.
Each file carries a SHA-256 of its contents, checked on load, so a flipped
byte is caught instead of trained on. Each name carries the run's identity
(step-00000016-<run id>.pt): a run lists, resumes from and prunes only its own.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from pathlib import Path

import torch

from .files import write_durably

_NAME = re.compile(r"^step-(\d{8})-([0-9a-f]{8})\.pt$")
CHECKSUM = "sha256"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read; the message names the file."""


def directory(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def path_for(output_dir: str | Path, global_step: int, run_id: str) -> Path:
    return directory(output_dir) / f"step-{global_step:08d}-{run_id}.pt"


def fingerprint(value, digest=None) -> str:
    """SHA-256 over every tensor's bytes and every plain value, in a fixed order."""
    digest = digest or hashlib.sha256()
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            if key != CHECKSUM:
                digest.update(repr(key).encode())
                fingerprint(value[key], digest)
    elif isinstance(value, (list, tuple)):
        digest.update(f"[{len(value)}".encode())
        for item in value:
            fingerprint(item, digest)
    elif isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{flat.dtype}{tuple(value.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    else:
        digest.update(repr(value).encode())
    return digest.hexdigest()


def on_cpu(state_dict: dict) -> dict:
    """A model's state_dict with every tensor on the CPU: model.pt, best.pt and checkpoints then load on a machine
    without the GPU(s) that trained them (torch.load would otherwise look for "cuda:1" there)."""
    return {
        name: value.detach().cpu() if isinstance(value, torch.Tensor) else value for name, value in state_dict.items()
    }


def slow_save_warning(seconds: float, timeout_s: int) -> str | None:
    """Past half of timeout_s, a save risks the job: the other ranks wait for it in barrier(), and one that takes
    longer than timeout_s ends the job (nccl: "Watchdog caught collective operation timeout")."""
    if seconds < timeout_s / 2:
        return None
    enough = max(2 * timeout_s, 60 * math.ceil(4 * seconds / 60))
    return (
        f"saving the checkpoint took {seconds:.0f} s, more than half of timeout_s={timeout_s}: the other ranks wait "
        f"for it, and a save longer than timeout_s stops the job; set timeout_s = {enough} in configs/train.toml "
        f"(--timeout-s {enough}), or put output_dir on a faster disk"
    )


def save_atomic(state: dict, path: Path) -> None:
    state = {**state, CHECKSUM: fingerprint(state)}
    write_durably(path, lambda handle: torch.save(state, handle))


def existing(output_dir: str | Path, run_id: str | None) -> list[Path]:
    """The run's finished checkpoints, newest first (temporary files and other runs' files are never listed)."""
    folder = directory(output_dir)
    if not folder.is_dir():
        return []
    steps = {}
    for path in folder.iterdir():
        match = _NAME.match(path.name)
        if match and match.group(2) == run_id:
            steps[path] = int(match.group(1))
    return sorted(steps, key=steps.get, reverse=True)


def any_checkpoint(output_dir: str | Path) -> bool:
    """Whether the folder holds a checkpoint of any run, or of an older version without run names."""
    folder = directory(output_dir)
    return folder.is_dir() and any(path.suffix == ".pt" for path in folder.iterdir())


def prune(output_dir: str | Path, run_id: str, keep: int) -> None:
    """Keep the run's newest `keep` checkpoints; also drop temporary files a killed save left behind
    (only rank 0 writes, one save at a time, so no other save is in flight here)."""
    for old in existing(output_dir, run_id)[keep:]:
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
    if CHECKSUM in state and state[CHECKSUM] != fingerprint(state):
        raise CheckpointError(f"checkpoint {path} is damaged (its contents do not match its {CHECKSUM} checksum)")
    return state


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint to <name>.damaged, so nothing later overwrites it and it can be inspected."""
    aside = path.with_name(path.name + ".damaged")
    os.replace(path, aside)
    return aside


def load_newest_good(output_dir: str | Path, run_id: str, warn) -> tuple[Path, dict] | None:
    """The run's newest checkpoint that loads. Damaged ones are reported and set aside (rank 0 alone calls this)."""
    candidates = existing(output_dir, run_id)
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
