"""What the ranks log and print: a log file per rank, and rank 0's console lines, fitted to 80 columns."""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import textwrap
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from .files import write_error

if TYPE_CHECKING:  # tqdm is imported by the ranks only: the launcher prints its refusals with wrapped()
    from tqdm import tqdm


class AboveTheBar(logging.StreamHandler):
    """Console lines printed above rank 0's progress bar instead of through it, broken to the window's width."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            text = wrapped(self.format(record), self.stream)
            encoding = getattr(self.stream, "encoding", None) or "utf-8"
            # A console that cannot show a character (LC_ALL=C, an old Windows code page) gets an escape instead.
            tqdm.write(text.encode(encoding, "backslashreplace").decode(encoding), file=self.stream)
        except Exception:
            self.handleError(record)


class LogFile(logging.FileHandler):
    """A rank's log file. A full disk or a refusal stops the rank with a checkpoint's one line (files.write_error),
    not logging's traceback per line: a run that goes on unlogged loses its record, and its next save fails."""

    failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:  # after a failure the rank is stopping: its last lines have nowhere to go
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        failure = write_error(error, Path(self.baseFilename)) if isinstance(error, OSError) else None
        if failure is None:
            return super().handleError(record)
        self.failed = True
        with contextlib.suppress(OSError):  # the unwritten line: closed, not retried at exit
            self.close()
        raise failure from error


def rank_logger(logger: logging.Logger, output_dir: Path, rank: int) -> logging.Logger:
    """`logger` into logs/rank<N>.log (torchrun's redirects do not work on Windows), rank 0's to the console too."""
    logger.setLevel(logging.DEBUG)  # the file gets DEBUG lines too; the console only INFO
    logger.handlers.clear()
    logger.propagate = False
    (output_dir / "logs").mkdir(parents=True, exist_ok=True)
    # Paths from a command line Python could not decode (LC_ALL=C without UTF-8 mode) carry their raw bytes
    # as surrogates: written back as those bytes, the file shows the path as it is on the disk.
    to_file = LogFile(output_dir / "logs" / f"rank{rank}.log", encoding="utf-8", errors="surrogateescape")
    to_file.setFormatter(logging.Formatter("%(asctime)s rank" + str(rank) + " %(levelname)s %(message)s"))
    if rank == 0:
        # tqdm's default lock is a multiprocessing semaphore, which a rank stopped by SIGTERM leaks
        # (a resource_tracker warning after every failed run). Only rank 0 draws: a thread lock does.
        from tqdm import tqdm

        tqdm.set_lock(threading.RLock())
        to_console = AboveTheBar(sys.stdout)
        to_console.setFormatter(logging.Formatter("%(message)s"))
        to_console.setLevel(logging.INFO)
        # A traceback goes to the file only: the console gets the launcher's one line, which names the file.
        to_console.addFilter(lambda record: not record.exc_info)
        logger.addHandler(to_console)
    logger.addHandler(to_file)  # last: a line the file cannot take is on the console still
    return logger


COLUMNS = 80  # the narrowest console the lines are written for: the Windows default


def shown_path(path: Path | str) -> str:
    """A path as the user would type it: relative to the current folder (the project) when inside it."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        return str(path)


def number(value: float) -> str:
    """4 significant digits: 0.003512 and 1.609 alike, so a loss that falls by decades stays readable."""
    return f"{value:.4g}"


NOT_SHOWN = ("epoch", "step", "lr", "samples_per_s", "resumed")  # metrics.csv's columns that are not values


def epoch_values(row: dict) -> list[str]:
    """`loss 0.1234 (val 0.1301)`, one item per value, its validation twin beside it; validation-only last."""
    names = [name for name in row if name not in NOT_SHOWN]
    items = [
        f"{name} {number(row[name])}" + (f" (val {number(row['val_' + name])})" if "val_" + name in row else "")
        for name in names
        if not name.startswith("val_")
    ]
    return items + [f"{name} {number(row[name])}" for name in names if name.startswith("val_") and name[4:] not in row]


def epoch_line(row: dict, epochs: int) -> str:
    """`epoch 3/5  loss 0.1234 (val 0.1301)  accuracy 0.961 (val 0.955)  52340 samples/s` within 80 columns:
    the rate is shortened, then left out, and values that still do not fit go on indented lines below."""
    lines, rate = [f"epoch {row['epoch']}/{epochs}"], row["samples_per_s"]
    for item in epoch_values(row):
        if len(lines[-1]) + 2 + len(item) <= COLUMNS:
            lines[-1] += "  " + item
        else:
            lines.append("    " + item)
    for suffix in (f"  {rate:.0f} samples/s", f"  {rate:.0f}/s"):
        if len(lines[-1] + suffix) <= COLUMNS:
            lines[-1] += suffix
            break
    return "\n".join(lines)


def plural(count: int, ending: str = "s") -> str:
    return "" if count == 1 else ending


def escape_what_stdout_cannot_encode() -> None:
    """Redirected on Windows, stdout encodes in the ANSI code page (1252 on an English one): a path's characters
    outside it are printed as escapes, not a UnicodeEncodeError once the work is done."""
    sys.stdout.reconfigure(errors="backslashreplace")


def wrapped(message: str, stream=None, indent: str = "  ") -> str:
    """A long message broken at spaces to the console's width, continuation lines indented; unchanged when
    the stream (stderr by default) is not a terminal: a log file or a pipe keeps one line per message."""
    if not (stream or sys.stderr).isatty():
        return message
    width = max(shutil.get_terminal_size((COLUMNS, 24)).columns, 40)
    fill = textwrap.TextWrapper(width, subsequent_indent=indent, break_on_hyphens=False).fill
    return "\n".join(fill(line) for line in message.splitlines())


# The bar's own fields first: the postfix (epoch, loss) comes last and the bar itself shrinks to fit.
BAR_FORMAT = "{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


def progress_bar(total: int, done: int) -> tqdm | None:
    """Rank 0's bar, only on a terminal (a CI log or a file gets the epoch lines alone), as wide as the window."""
    if not sys.stdout.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=done, unit="step", dynamic_ncols=True, bar_format=BAR_FORMAT, file=sys.stdout)


def show_training(progress: tqdm | None, epoch: int, epochs: int, finished: dict | None) -> None:
    """The bar's postfix as an epoch starts: `training epoch 4/5; epoch 3: loss 0.5818`, cut from the right."""
    if progress is None:
        return
    last = ""
    if finished and "loss" in finished:
        last = f"; epoch {finished['epoch']}: loss {number(float(finished['loss']))}"
    progress.set_postfix_str(f"training epoch {epoch}/{epochs}{last}")


def show_epoch(progress: tqdm | None, row: dict, epochs: int) -> None:
    """The bar's postfix after an epoch: its loss and number, cut from the right; more values in a wide window."""
    if progress is None:
        return
    fields = f"loss {number(row['loss'])}, epoch {row['epoch']}/{epochs}"
    if shutil.get_terminal_size((COLUMNS, 24)).columns >= COLUMNS + 20:
        values = [item.split(" (val")[0] for item in epoch_values(row)[:3]]
        fields = ", ".join([*values, f"epoch {row['epoch']}/{epochs}"])
    progress.set_postfix_str(fields)
