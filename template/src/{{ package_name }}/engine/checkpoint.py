"""Checkpoint files that survive Windows file semantics, interrupted writes and flipped bits, and a run's checkpoints
(files, or fsdp's folders) found, pruned, set aside and read.

Only rank 0 writes a file, through files.write_durably (temporary file, fsync,
os.replace, fsync of the folder), so a crash or a power cut mid-save leaves
the previous checkpoint intact. A checkpoint is the zip archive torch.save
writes, holding only tensors and plain Python values, so
torch.load(path, weights_only=True) reads it. Its archive comment holds a
CRC-32 of the whole archive, summed as the bytes stream to the file (in place
of torch's CRC-32 of each record, which torch.load never checks) and checked
on load in a second thread beside torch.load (see load), so a flipped byte or
a cut file is caught instead of trained on, for about what torch.save and
torch.load cost alone. Each name carries the run's identity (step-00000016-<run id>.pt):
a run lists, resumes from and prunes only its own.

Under fsdp a checkpoint is a folder of the same name without .pt (folders.py), checked against its manifest here
before it is read.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import pickle
import re
import shutil
import struct
import threading
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO

import torch

from .files import write_durably
from .folders import MANIFEST, TRAINER_STATE, damage, sharded_tensors, whole_model

try:
    from torch.utils.serialization import config as serialization_config
except ImportError:  # torch < 2.6
    serialization_config = None

_NAME = re.compile(r"^step-(\d{8})-([0-9a-f]{8})(\.pt)?$")  # a file; a folder (fsdp) without .pt
# The archive comment: the CRC-32 of the archive as torch.save wrote it (ending in a comment length of 0).
_TRAILER = re.compile(rb"crc32=([0-9a-f]{8})\Z")
_TRAILER_SIZE = len(b"crc32=00000000")
_END_OF_ARCHIVE = struct.Struct("<4s16xH")  # the zip's last record: signature ... comment length
_NO_COMMENT = b"\0\0"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read; the message names the file."""


def directory(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def path_for(output_dir: str | Path, global_step: int, run_id: str) -> Path:
    return directory(output_dir) / f"step-{global_step:08d}-{run_id}.pt"


def is_folder(path: Path) -> bool:
    """Whether `path` is a folder checkpoint (fsdp's), whole or damaged."""
    return path.is_dir() and (bool(_NAME.match(path.name)) or (path / MANIFEST).exists())


def folder_for(output_dir: str | Path, global_step: int, run_id: str) -> Path:
    return directory(output_dir) / f"step-{global_step:08d}-{run_id}"


class _SummingWriter:
    """What torch.save writes into: each buffer goes on to the file and into a running CRC-32 of the archive."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle, self.crc, self.tail = handle, 0, b""

    def write(self, data) -> int:
        self.crc = zlib.crc32(data, self.crc)
        self.tail = (self.tail + bytes(data[-_END_OF_ARCHIVE.size :]))[-_END_OF_ARCHIVE.size :]
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()


@contextlib.contextmanager
def _without_record_crc32s():
    """torch.save's own CRC-32 of each record is left out (0): the archive's CRC-32 covers every byte of it."""
    if serialization_config is None:  # torch < 2.6 always computes them
        yield
        return
    before, serialization_config.save.compute_crc32 = serialization_config.save.compute_crc32, False
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


def _write_summed(state: dict, handle: BinaryIO) -> None:
    writer = _SummingWriter(handle)
    with _without_record_crc32s():
        torch.save(state, writer)
    signature, comment_length = _END_OF_ARCHIVE.unpack(writer.tail)
    if signature == b"PK\x05\x06" and comment_length == 0:  # always so for torch.save; else load checks records
        handle.seek(-len(_NO_COMMENT), os.SEEK_CUR)
        handle.write(struct.pack("<H", _TRAILER_SIZE) + b"crc32=%08x" % writer.crc)


def save_atomic(state: dict, path: Path) -> None:
    write_durably(path, lambda handle: _write_summed(state, handle))


@contextlib.contextmanager
def _mapped(path: Path, handle: BinaryIO):
    """The open file as a read-only memoryview of its pages (nothing copied, no lock that torch.load needs)."""
    try:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except ValueError:  # an empty file cannot be mapped
        raise CheckpointError(f"checkpoint {path} is damaged (the file is empty)") from None
    with mapped, memoryview(mapped) as view:
        yield view


def existing(output_dir: str | Path, run_id: str | None) -> list[Path]:
    """The run's finished checkpoints, newest first (temporary files and other runs' files are never listed)."""
    folder = directory(output_dir)
    if not folder.is_dir():
        return []
    steps = {}
    for path in folder.iterdir():
        match = _NAME.match(path.name)
        if match and match.group(2) == run_id and (match.group(3) is not None or path.is_dir()):
            steps[path] = int(match.group(1))
    return sorted(steps, key=steps.get, reverse=True)


def of_any_run(output_dir: str | Path) -> list[Path]:
    """Every checkpoint in the folder, of any run or of an older version without run names."""
    folder = directory(output_dir)
    if not folder.is_dir():
        return []
    return [path for path in folder.iterdir() if path.suffix == ".pt" or (_NAME.match(path.name) and path.is_dir())]


def any_checkpoint(output_dir: str | Path) -> bool:
    return bool(of_any_run(output_dir))


def remove(path: Path) -> None:
    """A checkpoint gone, file or folder."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def prune(output_dir: str | Path, run_id: str, keep: int) -> None:
    """Keep the run's newest `keep` checkpoints; also drop temporary files and folders a killed save left behind
    (rank 0, once every rank has written: no other save is in flight here)."""
    for old in existing(output_dir, run_id)[keep:]:
        remove(old)
    for leftover in [*directory(output_dir).glob("*.pt.tmp"), *directory(output_dir).glob(f"step-*-{run_id}.tmp")]:
        remove(leftover)


def load(path: Path, training_state: bool = True, checked: bool = False) -> dict:
    """A checkpoint's contents after its CRC-32s are checked; training_state=False also takes best.pt and
    model.pt (weights only), and gathers a folder's model whole. A folder's training state holds no model or
    optimizer tensors: every rank reads its own shards of them (saving.with_shards). checked: the folder's
    manifest was checked already (rank 0 checks it; the other ranks read trainer.pt alone)."""
    if not is_folder(path):  # another folder: "cannot be read"
        return _checked(path, _load_file(path), training_state)
    found = None if checked else damage(path)
    if found:
        raise CheckpointError(f"checkpoint {path} is damaged ({found})")
    state = _load_file(path / TRAINER_STATE)
    if not training_state:
        try:
            state = {**state, "model": whole_model(path)}
        except Exception as error:  # DCP raises several types for damaged files
            raise CheckpointError(f"checkpoint {path} is damaged ({type(error).__name__}: {error})") from None
    return _checked(path, state, training_state)


def _checked(path: Path, state, training_state: bool) -> dict:
    holds_model = isinstance(state, dict) and ("model" in state or is_folder(path))
    if not holds_model or (training_state and "global_step" not in state):
        what = "a training state (no model or global_step)" if training_state else "a model (no 'model' entry)"
        raise CheckpointError(f"checkpoint {path} does not hold {what}")
    return state


def _load_file(path: Path) -> dict:
    """A file's contents, its CRC-32 checked.

    The archive's CRC-32 is summed in a second thread while torch.load reads the file. That thread runs
    nothing but zlib's sum over the mapped file, which lets go of the GIL for all of it; everything else
    about the check happens here, before and after, so neither of the two waits for the other's Python.
    """
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: {path}") from None
    except OSError as error:  # a folder, a file without read permission
        raise CheckpointError(f"checkpoint {path} cannot be read ({type(error).__name__}: {error})") from None
    try:
        with handle, _mapped(path, handle) as view:
            trailer = _TRAILER.search(view[-_TRAILER_SIZE:].tobytes())
            summed_end = max(0, len(view) - _TRAILER_SIZE - len(_NO_COMMENT))
            with view[:summed_end] as archive:
                sums: list[int] = []
                summing = threading.Thread(target=lambda: sums.append(zlib.crc32(archive)))
                if trailer:
                    summing.start()
                try:
                    state = _torch_load(path)
                finally:  # the archive's view is released only once the sum is done with it
                    if trailer:
                        summing.join()
            if not trailer:
                damage = "no CRC-32 at its end: it is cut short, or another program wrote it"
            elif zlib.crc32(_NO_COMMENT, sums[0]) != int(trailer.group(1), 16):
                damage = "its contents do not match their CRC-32 checksum"
            else:
                damage = ""
    except (OSError, ValueError, struct.error, zipfile.BadZipFile) as error:
        raise CheckpointError(f"checkpoint {path} is damaged ({type(error).__name__}: {error})") from None
    if damage:
        raise CheckpointError(f"checkpoint {path} is damaged ({damage})")
    return state


def _torch_load(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for damaged files
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        if isinstance(error, pickle.UnpicklingError):  # torch's advice to load with weights_only=False runs
            first_line = "not a torch.save file of tensors and plain values"  # any code in the file: never here
        raise CheckpointError(
            f"checkpoint {path} is damaged or not a checkpoint ({type(error).__name__}: {first_line})"
        ) from None


def what_it_resumes(path: Path) -> dict | None:
    """What a resume from a checkpoint must agree with, read without reading the tensors (None: it does not load):
    the shape of every model tensor, the settings and where in its epoch it stopped.

    The file is mapped, not read, and unmapped before this returns (a mapped file could not be renamed on Windows).
    """
    try:
        if is_folder(path):
            state = torch.load(path / TRAINER_STATE, map_location="cpu", weights_only=True, mmap=True)
            shapes = {name: tuple(entry.size) for name, entry in sharded_tensors(path).items()}
        else:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            shapes = {name: tuple(tensor.shape) for name, tensor in state["model"].items()}
        return {
            "shapes": shapes,
            "config": dict(state.get("config", {})),
            "epoch": int(state["epoch"]),
            "step_in_epoch": int(state["step_in_epoch"]),
        }
    except Exception:  # damaged or not a checkpoint: load_newest_good reports it and sets it aside
        return None


def misfit(model: dict[str, tuple[int, ...]], saved: dict[str, tuple[int, ...]]) -> str | None:
    """The first tensor in which a checkpoint's model (name -> shape) differs from the model's, described."""
    for name, shape in model.items():
        if name not in saved:
            return f"{name} {list(shape)} is in the model but not in the checkpoint"
        if saved[name] != shape:
            return f"{name} is {list(saved[name])} in the checkpoint and {list(shape)} in the model"
    extra = next((name for name in saved if name not in model), None)
    return f"{extra} {list(saved[extra])} is in the checkpoint but not in the model" if extra else None


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint to <name>.damaged, so nothing later overwrites it and it can be inspected."""
    aside = path.with_name(path.name + ".damaged")
    if path.is_dir() and aside.is_dir():  # a folder replaces no folder: the same step damaged before goes
        shutil.rmtree(aside)
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
