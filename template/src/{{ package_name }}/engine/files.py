"""Every file the training writes goes through write_durably: it either appears whole, or not at all."""

from __future__ import annotations

import errno
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

RETRY_DELAYS = (0.05, 0.1, 0.2, 0.4, 0.5, 0.75)  # seconds between attempts: about 2 s in all


class WriteError(OSError):
    """A file could not be written; the message names it and what to do. Earlier files are untouched."""


class WriteDenied(WriteError, PermissionError):
    """The operating system denied the write (permission, an immutable folder): a PermissionError with our message."""


def write_durably(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write `path` through a temporary file: write(handle), flush, fsync, replace, fsync the folder."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())  # else a power cut right after the rename can leave an empty file there
        replace(temporary, path)
    except BaseException as error:
        failure = write_error(error, path)  # first: the disk as full as the write found it
        temporary.unlink(missing_ok=True)  # never leave a partial file behind
        if failure:
            raise failure from error
        raise
    sync_folder(path.parent)


def write_error(error: BaseException, path: Path) -> WriteError | None:
    """`error`, met while writing `path` (a file, or a folder of them), as the WriteError that names its fix; None
    when neither the disk nor the operating system refused. Call it before the partial write is removed."""
    then = "then resume (--resume auto). Earlier checkpoints are intact."
    if isinstance(error, OSError) and not is_transient_lock(error):
        too_long = getattr(error, "winerror", None) == 206 or error.errno == errno.ENAMETOOLONG  # 206: on Windows
        refused = REFUSALS[errno.ENAMETOOLONG] if too_long else REFUSALS.get(error.errno)
        if refused:  # first: a refusal on a disk that is also nearly full is still a refusal
            kind = WriteDenied if isinstance(error, PermissionError) else WriteError
            shorter = "set output_dir to a shorter path (such as C:\\runs on Windows)"
            writable = f"make {path.parent} writable (on Linux also: lsattr, chattr -i), or set output_dir to a folder"
            fix = shorter if too_long else f"{writable} you can write"
            return kind(f"{refused} while writing {path}: {fix}, {then}")
    if isinstance(error, Exception) and disk_full(error, path.parent):
        # torch.save reports a full disk as "inline_container.cc:... unexpected pos": say what it is.
        return WriteError(
            f"no space left on device while writing {path}: free space on that disk, or set output_dir to "
            "a folder on another one, then resume (--resume auto). Earlier checkpoints are intact."
        )
    return None


# What the operating system refused a write for, by errno.
REFUSALS = {errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
            errno.EROFS: "the file system is read-only", errno.ENAMETOOLONG: "the path is too long"}  # fmt: skip


def disk_full(error: Exception, folder: Path) -> bool:
    """Whether a failed write ran out of space (ENOSPC, or torch's own error with the disk found full)."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return True
    try:
        return shutil.disk_usage(folder).free < 1 << 20
    except OSError:
        return False


def write_text_durably(path: Path, text: str) -> None:
    write_durably(path, lambda handle: handle.write(text.encode("utf-8")))


def is_transient_lock(error: OSError) -> bool:
    """ERROR_ACCESS_DENIED or ERROR_SHARING_VIOLATION: what a scanner or sync client holding a file causes."""
    return isinstance(error, PermissionError) and getattr(error, "winerror", None) in (5, 32)


def replace(source: Path, target: Path) -> None:
    """os.replace, retried while another program (an antivirus scanner, the search indexer, a sync client) briefly
    holds one of the two files, which Windows reports as WinError 5 or 32."""
    for delay in (*RETRY_DELAYS, None):
        try:
            os.replace(source, target)
            return
        except PermissionError as error:
            if not is_transient_lock(error):
                raise
            if delay is None:
                raise WriteError(
                    f"{target} stayed locked by another program for {sum(RETRY_DELAYS):.1f}s "
                    f"(WinError {error.winerror}: {error.strerror}). An antivirus scanner, the Windows Search "
                    "indexer or a OneDrive/Dropbox sync client usually holds it: put output_dir outside synced "
                    "folders (for example C:\\ddp-runs), or exclude it from scanning. Earlier checkpoints are intact.",
                ) from error
            time.sleep(delay)


def sync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable. POSIX only: Windows cannot open a folder as a file."""
    if sys.platform == "win32":
        return
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
