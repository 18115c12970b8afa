"""A folder checkpoint (fsdp's): every rank's shards and trainer.pt, sealed with a manifest of their sizes and CRC-32s.

DCP's metadata has no checksum: without the manifest a flipped byte would load unnoticed, and a cut shard would fail
mid-way through a collective load.
"""

from __future__ import annotations

import json
import shutil
import warnings
import zlib
from pathlib import Path

import torch

from .files import replace, sync_folder, write_text_durably

MANIFEST, TRAINER_STATE = "manifest.json", "trainer.pt"


def file_sum(path: Path) -> dict:
    """A file's size and CRC-32, read in chunks (a shard may be large)."""
    crc, size = 0, 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            crc, size = zlib.crc32(chunk, crc), size + len(chunk)
    return {"bytes": size, "crc32": f"{crc:08x}"}


def seal(temporary: Path, folder: Path, sums: dict[str, dict]) -> None:
    """Rank 0, once every rank's files are synced: the manifest written, then `temporary` named `folder`, durably."""
    for name in (".metadata", TRAINER_STATE):
        sums[name] = file_sum(temporary / name)
    write_text_durably(temporary / MANIFEST, json.dumps({"files": sums}, indent=1, sort_keys=True))  # syncs the folder
    if folder.is_dir():  # this step saved before, by a run resumed from an earlier checkpoint since
        shutil.rmtree(folder)
    replace(temporary, folder)
    sync_folder(folder.parent)


def damage(folder: Path) -> str | None:
    """What is wrong with a folder against its manifest, or None: the sizes first, which a cut file fails unread."""
    try:
        files = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["files"]
        sizes = {name: (folder / name).stat().st_size for name in files}
    except FileNotFoundError as error:
        return f"{Path(error.filename or MANIFEST).name} is missing"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return f"{MANIFEST}: {type(error).__name__}: {error}"
    for name, size in sizes.items():
        if size != files[name]["bytes"]:
            said = files[name]["bytes"]
            return f"{name} is {size} bytes, {MANIFEST} says {said}: it is cut short, or another program wrote it"
    for name in files:
        if file_sum(folder / name)["crc32"] != files[name]["crc32"]:
            return f"{name} does not match its CRC-32 checksum"
    return None


def sharded_tensors(folder: Path) -> dict:
    """{name: TensorStorageMetadata} of the model's tensors in a folder's shards (named "model.<name>" there)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    entries = FileSystemReader(folder).read_metadata().state_dict_metadata
    return {
        name.removeprefix("model."): entry
        for name, entry in entries.items()
        if name.startswith("model.") and isinstance(entry, TensorStorageMetadata)
    }


def whole_model(folder: Path) -> dict:
    """A folder's model state dict, whole, on the CPU, read in this process from every rank's shards."""
    import torch.distributed.checkpoint as dcp

    shapes = sharded_tensors(folder)
    model = {name: torch.empty(entry.size, dtype=entry.properties.dtype) for name, entry in shapes.items()}
    with warnings.catch_warnings():  # that it reads in one process, which is the intent
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"model": model}, storage_reader=dcp.FileSystemReader(folder), no_dist=True)
    return model
