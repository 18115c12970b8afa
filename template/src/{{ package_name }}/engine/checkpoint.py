"""A run's checkpoints on disk, files (rank 0's, atomic and CRC-checked) or fsdp's folders: found, pruned, set aside,
written and read."""

from __future__ import annotations

import contextlib
import functools
import math
import mmap
import os
import pickle
import re
import shutil
import struct
import threading
import zlib
from pathlib import Path

import torch

from .files import write_durably
from .folders import MANIFEST, TRAINER_STATE, damage, sharded_tensors, whole_model

try:
    from torch.utils.serialization import config as serialization_config
except ImportError:  # torch < 2.6
    serialization_config = None

# The run's identity in each name: a run lists, resumes from and prunes only its own. A folder (fsdp) has no .pt.
_NAME = re.compile(r"^step-(\d{8})-([0-9a-f]{8})(\.pt)?$")
# A file is torch.save's zip archive, weights_only-loadable, whose comment holds the CRC-32 of the whole archive as
# it streamed out: torch.load never checks torch's per-record CRC-32s, and a second thread checks this one beside it.
_TRAILER = re.compile(rb"crc32=([0-9a-f]{8})\Z")
_TRAILER_SIZE = len(b"crc32=00000000")
_END_OF_ARCHIVE = struct.Struct("<4s16xH")  # the zip's last record: signature ... comment length
_NO_COMMENT = b"\0\0"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read; the message names the file."""


def _damaged(path: Path, why: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {path} is damaged ({why})")


def directory(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def is_folder(path: Path) -> bool:
    """Whether `path` is a folder checkpoint (fsdp's), whole or damaged."""
    return path.is_dir() and (bool(_NAME.match(path.name)) or (path / MANIFEST).exists())


def on_cpu(state_dict: dict) -> dict:
    """Every tensor on the CPU: the file then loads on a machine without the GPU(s) that trained it."""
    return {
        name: value.detach().cpu() if isinstance(value, torch.Tensor) else value for name, value in state_dict.items()
    }


def slow_save_warning(seconds: float, timeout_s: int) -> str | None:
    """Past half of timeout_s a save risks the job: the other ranks wait for it, and past timeout_s they give up."""
    if seconds < timeout_s / 2:
        return None
    enough = max(2 * timeout_s, 60 * math.ceil(4 * seconds / 60))
    return (
        f"saving the checkpoint took {seconds:.0f} s, more than half of timeout_s={timeout_s}: the other ranks wait "
        f"for it, and a save longer than timeout_s stops the job; set timeout_s = {enough} in configs/train.toml "
        f"(--timeout-s {enough}), or put output_dir on a faster disk"
    )


class _SummingWriter:
    """What torch.save writes into: each buffer goes on to the file and into a running CRC-32 of the archive."""

    def __init__(self, handle) -> None:
        self.handle, self.crc, self.tail = handle, 0, b""

    def write(self, data) -> int:
        self.crc = zlib.crc32(data, self.crc)
        self.tail = (self.tail + bytes(data[-_END_OF_ARCHIVE.size :]))[-_END_OF_ARCHIVE.size :]
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()


@contextlib.contextmanager
def _without_record_crc32s():
    """torch.save's CRC-32 of each record left out (torch < 2.6 always sums them): the archive's covers them."""
    if serialization_config is None:
        yield
        return
    before, serialization_config.save.compute_crc32 = serialization_config.save.compute_crc32, False
    try:
        yield
    finally:
        serialization_config.save.compute_crc32 = before


def _write_summed(state: dict, handle) -> None:
    writer = _SummingWriter(handle)
    with _without_record_crc32s():
        torch.save(state, writer)
    signature, comment_length = _END_OF_ARCHIVE.unpack(writer.tail)
    if signature == b"PK\x05\x06" and comment_length == 0:  # always so for torch.save
        handle.seek(-len(_NO_COMMENT), os.SEEK_CUR)
        handle.write(struct.pack("<H", _TRAILER_SIZE) + b"crc32=%08x" % writer.crc)


def save_atomic(state: dict, path: Path) -> None:
    write_durably(path, functools.partial(_write_summed, state))


def existing(output_dir: str | Path, run_id: str | None) -> list[Path]:
    """The run's finished checkpoints, newest first (temporary files and other runs' files are never listed)."""
    folder = directory(output_dir)
    steps = {}
    for path in folder.iterdir() if folder.is_dir() else ():
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


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def prune(output_dir: str | Path, run_id: str, keep: int) -> None:
    """Keep the run's newest `keep` checkpoints and drop what a killed save left (rank 0, once every rank wrote)."""
    for old in existing(output_dir, run_id)[keep:]:
        remove(old)
    for leftover in [*directory(output_dir).glob("*.pt.tmp"), *directory(output_dir).glob(f"step-*-{run_id}.tmp")]:
        remove(leftover)


def load(path: Path, training_state: bool = True, checked: bool = False) -> dict:
    """A checkpoint's contents, checked (`checked`: rank 0 did); training_state=False: model.pt and best.pt too, and a
    folder's model whole, else a folder's trainer.pt alone (saving.with_shards reads the shards)."""
    folder = is_folder(path)
    if not folder:  # another folder: "cannot be read"
        state = _load_file(path)
    elif (found := None if checked else damage(path)) is not None:
        raise _damaged(path, found)
    else:
        state = _load_file(path / TRAINER_STATE)
        try:
            state = state if training_state else {**state, "model": whole_model(path)}
        except Exception as error:  # DCP raises several types for damaged files
            raise _damaged(path, f"{type(error).__name__}: {error}") from None
    holds_model = isinstance(state, dict) and (folder or "model" in state)
    if not holds_model or (training_state and "global_step" not in state):
        what = "a training state (no model or global_step)" if training_state else "a model (no 'model' entry)"
        raise CheckpointError(f"checkpoint {path} does not hold {what}")
    return state


def _load_file(path: Path) -> dict:
    """A file's contents; its CRC-32 is summed in a second thread while torch.load reads it (zlib frees the GIL)."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: {path}") from None
    except OSError as error:  # a folder, a file without read permission
        raise CheckpointError(f"checkpoint {path} cannot be read ({type(error).__name__}: {error})") from None
    sums: list[int] = []
    try:  # mapped, not read: nothing copied, and no lock that torch.load needs
        with handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
            trailer = _TRAILER.search(view[-_TRAILER_SIZE:].tobytes())
            with view[: max(0, len(view) - _TRAILER_SIZE - len(_NO_COMMENT))] as archive:
                summing = threading.Thread(target=lambda: sums.append(zlib.crc32(archive)))
                if trailer:
                    summing.start()
                try:
                    state = _torch_load(path)
                finally:  # the archive's view is released only once the sum is done with it
                    if trailer:
                        summing.join()
    except (OSError, ValueError) as error:  # ValueError: an empty file cannot be mapped
        why = "the file is empty" if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
        raise _damaged(path, why) from None
    if not trailer:
        raise _damaged(path, "no CRC-32 at its end: it is cut short, or another program wrote it")
    if zlib.crc32(_NO_COMMENT, sums[0]) != int(trailer.group(1), 16):
        raise _damaged(path, "its contents do not match their CRC-32 checksum")
    return state


def _torch_load(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for damaged files
        first_line = (str(error).strip().splitlines() or [""])[0]
        if isinstance(error, pickle.UnpicklingError):  # torch's advice, weights_only=False, would run its code
            first_line = "not a torch.save file of tensors and plain values"
        raise CheckpointError(
            f"checkpoint {path} is damaged or not a checkpoint ({type(error).__name__}: {first_line})"
        ) from None


def what_it_resumes(path: Path) -> dict | None:
    """Shapes, settings and place in its epoch, read without the tensors (None: it does not load); mapped and
    unmapped at once, as Windows renames no mapped file."""
    try:
        if is_folder(path):
            state = torch.load(path / TRAINER_STATE, map_location="cpu", weights_only=True, mmap=True)
            shapes = {name: tuple(entry.size) for name, entry in sharded_tensors(path).items()}
        else:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            shapes = {name: tuple(tensor.shape) for name, tensor in state["model"].items()}
        config, epoch, step_in_epoch = dict(state.get("config", {})), int(state["epoch"]), int(state["step_in_epoch"])
    except Exception:  # damaged or not a checkpoint: load_newest_good reports it and sets it aside
        return None
    return {"shapes": shapes, "config": config, "epoch": epoch, "step_in_epoch": step_in_epoch}


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
    """A damaged checkpoint renamed to <name>.damaged, so nothing later overwrites it and it can be inspected."""
    aside = path.with_name(path.name + ".damaged")
    if path.is_dir() and aside.is_dir():  # a folder replaces no folder: the same step damaged before goes
        shutil.rmtree(aside)
    os.replace(path, aside)
    return aside


def load_newest_good(output_dir: str | Path, run_id: str, warn) -> tuple[Path, dict] | None:
    """The run's newest checkpoint that loads; damaged ones are reported and set aside (rank 0 alone calls this)."""
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
