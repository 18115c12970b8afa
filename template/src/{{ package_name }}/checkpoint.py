"""Checkpoints that survive Windows file semantics, interrupted writes and flipped bits.

Only rank 0 writes, through files.write_durably (temporary file, fsync,
os.replace, fsync of the folder), so a crash or a power cut mid-save leaves
the previous checkpoint intact. A checkpoint is a plain torch.save file that
holds only tensors and plain Python values: torch.load(path, weights_only=True)
reads it. torch.save stores a CRC-32 of every record (the pickled structure and
each tensor's bytes) in the zip archive, and torch.load never checks them; load
does, in a second thread while torch.load reads the same pages, so a flipped
byte is caught instead of trained on, for about the cost of the load alone.
Each name carries the run's identity (step-00000016-<run id>.pt): a run lists,
resumes from and prunes only its own.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import re
import struct
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from .files import write_durably

try:
    from torch.utils.serialization import config as serialization_config
except ImportError:  # torch < 2.6 has no switch: torch.save always computes the CRC-32s
    serialization_config = None

_NAME = re.compile(r"^step-(\d{8})-([0-9a-f]{8})\.pt$")
# Checkpoints of earlier versions carry a SHA-256 of their values under this key; their CRC-32s cover the same bytes.
EARLIER_CHECKSUM = "sha256"
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, the fixed fields, then the name and extra-field lengths


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read; the message names the file."""


def directory(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def path_for(output_dir: str | Path, global_step: int, run_id: str) -> Path:
    return directory(output_dir) / f"step-{global_step:08d}-{run_id}.pt"


@contextlib.contextmanager
def _crc32_on():
    """torch.save computes its records' CRC-32s even where a recipe turned that off: load relies on them."""
    if serialization_config is None:
        yield
        return
    before, serialization_config.save.compute_crc32 = serialization_config.save.compute_crc32, True
    try:
        yield
    finally:
        serialization_config.save.compute_crc32 = before


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
    with _crc32_on():
        write_durably(path, lambda handle: torch.save(state, handle))


def damaged_records(path: Path) -> list[str]:
    """The archive's records whose bytes do not match their CRC-32 (empty: the file is as torch.save wrote it).

    Each record is checked in one call over the mapped file, so the check holds the GIL only between records
    and runs beside torch.load. Raises zipfile.BadZipFile or ValueError for a file that is not a whole archive.
    """
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        with zipfile.ZipFile(handle) as archive:
            records = archive.infolist()
        if all(record.CRC == 0 for record in records):
            return []  # saved with CRC-32s turned off: nothing to check against
        damaged = []
        with memoryview(mapped) as view:
            for record in records:
                signature, name_length, extra_length = _LOCAL_HEADER.unpack_from(mapped, record.header_offset)
                start = record.header_offset + _LOCAL_HEADER.size + name_length + extra_length
                data = view[start : start + record.compress_size]
                if (
                    signature != b"PK\x03\x04"
                    or record.compress_type != zipfile.ZIP_STORED
                    or len(data) != record.compress_size
                    or zlib.crc32(data) != record.CRC
                ):
                    damaged.append(record.filename)
                data.release()
        return damaged


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


def load(path: Path, training_state: bool = True) -> dict:
    """A checkpoint's contents after its CRC-32s are checked (in a second thread, beside torch.load);
    training_state=False also takes best.pt and model.pt (weights only)."""
    with ThreadPoolExecutor(1) as pool:
        checked = pool.submit(damaged_records, path)
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint not found: {path}") from None
        except Exception as error:  # torch raises several types for damaged files
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise CheckpointError(
                f"checkpoint {path} is damaged or not a checkpoint ({type(error).__name__}: {first_line})"
            ) from None
        try:
            damaged = checked.result()
        except (OSError, ValueError, struct.error, zipfile.BadZipFile) as error:
            raise CheckpointError(f"checkpoint {path} is damaged ({type(error).__name__}: {error})") from None
    if damaged:
        raise CheckpointError(
            f"checkpoint {path} is damaged (its contents do not match their CRC-32 checksums: {', '.join(damaged)})"
        )
    if not isinstance(state, dict) or "model" not in state or (training_state and "global_step" not in state):
        what = "a training state (no model or global_step)" if training_state else "a model (no 'model' entry)"
        raise CheckpointError(f"checkpoint {path} does not hold {what}")
    state.pop(EARLIER_CHECKSUM, None)
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
