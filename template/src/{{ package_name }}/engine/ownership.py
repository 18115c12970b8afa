"""What a run holds while it lives, its output folder and a temporary folder, each through a file lock that the
operating system drops however the holder ends (SIGKILL and a closed console window included)."""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import multiprocessing
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from .files import disk_full
from .processes import WINDOWS, under_torchrun

# Windows locks byte ranges, and a locked range cannot be read by others: lock one byte far past the
# holder's note (pid, host, run) at the start of the file, so a refused launch can still read who holds it.
_WINDOWS_LOCKED_BYTE = 1 << 30
TEMPORARY_PREFIX = "ddp-run-"


class InUse(RuntimeError):
    """Another live process holds the lock; the message says which and what to do."""


def _open_locked(path: Path):
    """The file at `path`, open and locked by this process, or None when another process holds it. On POSIX the lock
    counts only while the name still points at the locked file: a holder that ends well deletes it."""
    for _ in range(50):
        handle = open(path, "a+b")  # noqa: SIM115 - held for the whole run
        try:
            if WINDOWS:
                import msvcrt

                handle.seek(_WINDOWS_LOCKED_BYTE)
                msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
                handle.seek(0)
            else:
                import fcntl

                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            handle.close()
            if error.errno in (errno.EACCES, errno.EAGAIN, errno.EWOULDBLOCK, errno.EDEADLK):
                return None
            raise
        with contextlib.suppress(FileNotFoundError):
            if WINDOWS or os.path.samestat(os.fstat(handle.fileno()), os.stat(path)):
                return handle
        handle.close()
    raise OSError(f"{path} kept being replaced while it was being locked")


def _note(handle, note: dict) -> None:
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps(note).encode("utf-8"))
    handle.flush()


def _read_note(path: Path) -> dict:
    try:
        with open(path, "rb") as handle:
            return json.loads(handle.read(4096).decode("utf-8", "replace") or "{}")
    except (OSError, ValueError):
        return {}


def lock_file(output_dir: Path, node: int) -> Path:
    return Path(output_dir) / f".node{node}.lock"


@contextlib.contextmanager
def hold_output_dir(output_dir: Path, node: int = 0) -> Iterator[None]:
    """Hold output_dir for this run's node (.node<N>.lock: a job's nodes never refuse each other) until the block
    ends; InUse when another live run holds it. A folder this created and the run left empty is removed again."""
    output_dir, fix = Path(output_dir), "choose a folder you can write to with --output-dir"
    created = not output_dir.exists()
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (output_dir, *output_dir.parents) if p.exists() and not p.is_dir()), output_dir)
        message = f"output_dir {output_dir} cannot be a folder: {blocker} is a file; choose another --output-dir"
        raise InUse(message) from None
    except OSError as error:
        raise InUse(f"output_dir {output_dir} cannot be created ({error.strerror or error}); {fix}") from None
    path = lock_file(output_dir, node)
    try:
        handle = _open_locked(path)
    except OSError as error:
        if not isinstance(error, PermissionError) and error.errno not in (errno.EROFS, errno.EACCES):
            raise
        raise InUse(f"output_dir {output_dir} is not writable ({error.strerror or error}); {fix}") from None
    if handle is None:
        for _ in range(50):  # the holder writes its note right after it takes the lock
            note = _read_note(path)
            if note:
                break
            time.sleep(0.02)
        run = f"run {note['run']}" if note.get("run") else "a run that is starting"
        where = f"pid {note.get('pid', '?')} on {note.get('host', '?')}, started {note.get('started', '?')}"
        raise InUse(f"output_dir {output_dir} is in use by {run} ({where}); wait for it, or use another --output-dir")
    started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z").strip()
    try:
        try:
            _note(handle, {"pid": os.getpid(), "host": socket.gethostname(), "started": started, "run": None})
        except OSError as error:  # a full disk: not even the note's hundred bytes fit
            room = "free space on that disk, or use another --output-dir" if disk_full(error, output_dir) else fix
            message = f"output_dir {output_dir}: {path.name} cannot be written ({error.strerror or error}); {room}"
            raise InUse(message) from None
        yield
    finally:
        # The lock file goes while it is held (POSIX), or once closed (Windows: not while another launch has it open,
        # which then owns it).
        if not WINDOWS:
            with contextlib.suppress(OSError):
                path.unlink()
        with contextlib.suppress(OSError):  # the note that did not fit would be flushed again here
            handle.close()
        with contextlib.suppress(OSError):
            if WINDOWS:
                path.unlink()
            if created:
                output_dir.rmdir()  # only when empty: nothing of a run is ever deleted here


def name_the_run(output_dir: Path, run_id: str) -> None:
    """Put the run's id into node 0's lock note (rank 0 decides it, after the launcher took the lock)."""
    path = lock_file(output_dir, 0)
    note = _read_note(path)
    if not note:
        return  # no holder wrote a note here
    note["run"] = run_id
    with contextlib.suppress(OSError), open(path, "r+b") as handle:
        _note(handle, note)


def sweep_temporary_folders(parent: Path) -> None:
    """Delete the ddp-run-* folders of launches that are gone (their lock is free), as a killed one leaves."""
    with contextlib.suppress(OSError):
        for folder in Path(parent).glob(TEMPORARY_PREFIX + "*"):
            path = folder / ".lock"
            if not path.is_file():
                continue  # being created right now, or not one of ours
            with contextlib.suppress(OSError):
                handle = _open_locked(path)
                if handle is None:
                    continue  # its launch is alive
                empty = not _read_note(path)  # its creator has not written its note yet: alive
                handle.close()
                if not empty:
                    shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def temporary_files_in(folder: Path) -> Iterator[None]:
    """Point this process's children (TMPDIR, TEMP, TMP) at `folder` while the block runs."""
    saved = {name: os.environ.get(name) for name in ("TMPDIR", "TEMP", "TMP")}
    os.environ.update(dict.fromkeys(saved, str(folder)))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def private_temporary_folder() -> Iterator[Path]:
    """Point this process and its children (TMPDIR, TEMP, TMP) at a new ddp-run-* folder, deleted after, or by the
    next launch here when this one is killed: multiprocessing's, the ranks' and torch's temporary files go there."""
    parent = Path(tempfile.gettempdir())
    sweep_temporary_folders(parent)
    folder = Path(tempfile.mkdtemp(prefix=TEMPORARY_PREFIX, dir=parent))
    for _ in range(100):  # a sweeping launch may hold the new lock for a moment
        handle = _open_locked(folder / ".lock")
        if handle is not None:
            _note(handle, {"pid": os.getpid()})
            break
        time.sleep(0.01)
    mp_config = multiprocessing.current_process()._config
    saved = tempfile.tempdir, mp_config.get("tempdir")
    # multiprocessing's own folder for this process (its sockets and temporary files) is this one, not a pymp-* inside
    # it: a pymp-* folder is deleted at the interpreter's exit, which would fail once this one is gone.
    tempfile.tempdir = mp_config["tempdir"] = str(folder)
    try:
        with temporary_files_in(folder):
            yield folder
    finally:
        tempfile.tempdir, mp_config["tempdir"] = saved
        if handle is not None:
            handle.close()
        shutil.rmtree(folder, ignore_errors=True)


def holding_the_output_dir(config):
    """This machine's hold on output_dir: the spawn launcher's for its ranks, else (torchrun, srun) local rank 0's."""
    if not under_torchrun():
        return hold_output_dir(Path(config.output_dir), config.node_rank)
    if int(os.environ.get("LOCAL_RANK", "0")) != 0:
        return contextlib.nullcontext()
    node = int(os.environ["RANK"]) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return hold_output_dir(Path(config.output_dir), node)
