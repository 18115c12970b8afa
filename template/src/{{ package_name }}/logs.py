"""One log file per rank (torchrun's redirects do not work on Windows); rank 0 also prints."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

from tqdm import tqdm


class AboveTheBar(logging.StreamHandler):
    """Console lines printed above rank 0's progress bar instead of through it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            encoding = getattr(self.stream, "encoding", None) or "utf-8"
            # A console that cannot show a character (LC_ALL=C, an old Windows code page) gets an escape instead.
            tqdm.write(text.encode(encoding, "backslashreplace").decode(encoding), file=self.stream)
        except Exception:
            self.handleError(record)


def rank_logger(output_dir: Path, rank: int) -> logging.Logger:
    logger = logging.getLogger(f"{__package__}.rank{rank}")
    logger.setLevel(logging.DEBUG)  # the file gets DEBUG lines too; the console only INFO
    logger.handlers.clear()
    logger.propagate = False
    (output_dir / "logs").mkdir(parents=True, exist_ok=True)
    # Paths from a command line Python could not decode (LC_ALL=C without UTF-8 mode) carry their raw bytes
    # as surrogates: written back as those bytes, the file shows the path as it is on the disk.
    to_file = logging.FileHandler(output_dir / "logs" / f"rank{rank}.log", encoding="utf-8", errors="surrogateescape")
    to_file.setFormatter(logging.Formatter("%(asctime)s rank" + str(rank) + " %(levelname)s %(message)s"))
    logger.addHandler(to_file)
    if rank == 0:
        # tqdm's default lock is a multiprocessing semaphore, which a rank stopped by SIGTERM leaks
        # (a resource_tracker warning after every failed run). Only rank 0 draws: a thread lock does.
        tqdm.set_lock(threading.RLock())
        to_console = AboveTheBar(sys.stdout)
        to_console.setFormatter(logging.Formatter("%(message)s"))
        to_console.setLevel(logging.INFO)
        logger.addHandler(to_console)
    return logger


def progress_bar(total: int, done: int) -> tqdm | None:
    """Rank 0's bar, only on a terminal (a CI log or a file gets the epoch lines alone)."""
    if not sys.stdout.isatty():
        return None
    return tqdm(total=total, initial=done, unit="step", dynamic_ncols=True)
