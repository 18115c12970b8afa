"""A folder checkpoint (fsdp's): every rank's shards and trainer.pt, sealed with a manifest of their sizes and CRC-32s.

The folder holds torch.distributed.checkpoint's __<rank>_<n>.distcp files and its .metadata, trainer.pt (the rest
of the state, a checkpoint file of checkpoint.py's format) and, written last, manifest.json, the size and CRC-32 of
each of those files. The folder is checked against its manifest before it is read: DCP's own metadata holds the
offset and length of each tensor but no checksum, so a flipped byte would load unnoticed, and a cut shard would
fail only in the middle of a collective load on every rank. saving.py writes the folder; checkpoint.py reads it.
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
_CHUNK = 1 << 24


def file_sum(path: Path) -> dict:
    """A file's size and CRC-32, as a folder's manifest holds them, read in chunks (a shard may be large)."""
    crc, size = 0, 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            crc, size = zlib.crc32(chunk, crc), size + len(chunk)
    return {"bytes": size, "crc32": f"{crc:08x}"}


def seal(temporary: Path, folder: Path, sums: dict[str, dict]) -> None:
    """Rank 0, once every rank's files in `temporary` are written and synced: the manifest of them all (`sums`, and
    the files rank 0 wrote), the folder synced, then named `folder` (whole or not at all) and its parent synced."""
    for name in (".metadata", TRAINER_STATE):
        sums[name] = file_sum(temporary / name)
    write_text_durably(temporary / MANIFEST, json.dumps({"files": sums}, indent=1, sort_keys=True))  # syncs the folder
    if folder.is_dir():  # this step saved before, by a run resumed from an earlier checkpoint since
        shutil.rmtree(folder)
    replace(temporary, folder)
    sync_folder(folder.parent)


def damage(folder: Path) -> str | None:
    """What is wrong with a folder against its manifest ("__1_0.distcp is missing"), or None when every file it
    names is there with its size and CRC-32: the sizes first, which a cut file fails without a byte read."""
    try:
        files = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["files"]
        sizes = {name: (folder / name).stat().st_size for name in files}
    except FileNotFoundError as error:
        return f"{Path(error.filename or MANIFEST).name} is missing"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return f"{MANIFEST}: {type(error).__name__}: {error}"
    for name, size in sizes.items():
        if size != files[name]["bytes"]:
            return (
                f"{name} is {size} bytes, {MANIFEST} says {files[name]['bytes']}: it is cut short, or another "
                "program wrote it"
            )
    for name in files:
        if file_sum(folder / name)["crc32"] != files[name]["crc32"]:
            return f"{name} does not match its CRC-32 checksum"
    return None


def sharded_tensors(folder: Path) -> dict:
    """{name: TensorStorageMetadata} of the model's tensors in a folder's shards (DCP's .metadata: names are
    "model.<name>" there)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    entries = FileSystemReader(folder).read_metadata().state_dict_metadata
    return {
        name.removeprefix("model."): entry
        for name, entry in entries.items()
        if name.startswith("model.") and isinstance(entry, TensorStorageMetadata)
    }


def whole_model(folder: Path) -> dict:
    """A folder's model state dict, whole, on the CPU, read in this process from every rank's shards (DCP raises
    several types for damaged files)."""
    import torch.distributed.checkpoint as dcp

    model = {name: torch.empty(entry.size, dtype=entry.properties.dtype) for name, entry in
             sharded_tensors(folder).items()}  # fmt: skip
    with warnings.catch_warnings():  # that it reads in one process, which is the intent
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"model": model}, storage_reader=dcp.FileSystemReader(folder), no_dist=True)
    return model
