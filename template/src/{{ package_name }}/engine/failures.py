"""What the launcher says when a start of the ranks ends: the first failure and its cause, or how they stopped."""

from __future__ import annotations

import json
import math
import re
import signal
import sys
import time
import traceback
from pathlib import Path

from .config import Config
from .logs import shown_path, wrapped
from .process_group import LaunchError
from .stopping import STOPPED, TERMINATED, SettingsRefused

# A collective whose peer left: gloo's source path in the error ("Connection reset by peer", "Connection closed").
GLOO_LOST_A_PEER = re.compile(r"gloo[/\\]transport[/\\]")
REFUSED = -1  # inside the launcher only: a rank refused to start (LaunchError); restarting cannot help
REFUSED_SETTINGS = -2  # the same, for the settings (SettingsRefused): the run ends with SETTINGS_REFUSED


def write_report(path: str, error: Exception) -> None:
    """A rank's failure for the launcher: a refusal (LaunchError) as its message, anything else as its traceback.

    A file, not a pipe: a long traceback cannot block a rank that is exiting.
    """
    refused = isinstance(error, LaunchError)
    message = str(error) if refused else "".join(traceback.format_exception(type(error), error, error.__traceback__))
    settings = isinstance(error, SettingsRefused)
    failure = {"refused": refused, "settings": settings, "message": message, "time": time.time()}
    Path(path).write_text(json.dumps(failure), encoding="utf-8")


def read_report(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the rank ended without a report: killed, or it exited with a status of its own


def first_failure(ended: list[int], reports: list[Path]) -> tuple[int, dict | None]:
    """The local rank that failed first, and its report: a rank whose peer left fails with gloo's transport error,
    which comes after every other failure; then the earliest report, then the ranks that left none."""
    failures = {slot: read_report(reports[slot]) for slot in ended}

    def following(slot: int) -> tuple[bool, float]:
        failure = failures[slot]
        if failure is None:
            return False, math.inf
        return GLOO_LOST_A_PEER.search(failure["message"]) is not None, failure["time"]

    slot = min(ended, key=following)
    return slot, failures[slot]


def describe_silence(silent: dict[int, float]) -> str:
    return "; ".join(
        f"rank {slot} stopped answering (no sign of life for {seconds:.0f} s: suspended, stopped or frozen)"
        for slot, seconds in silent.items()
    )


def outcome(config: Config, slot: int, code: int, failure: dict | None, silent: dict, stop_signal: int) -> int:
    """Say on stderr how a start of the ranks ended, from local rank `slot`'s exit code and report; its status."""
    if code in (STOPPED, TERMINATED):
        asked_by = "SIGUSR1" if code == STOPPED else signal.Signals(stop_signal or signal.SIGTERM).name
        print(f"stopped on {asked_by} with a checkpoint saved; --resume auto continues", file=sys.stderr, flush=True)
        return code
    if failure and failure["refused"]:
        print(wrapped(f"error: {failure['message']}"), file=sys.stderr, flush=True)
        return REFUSED_SETTINGS if failure.get("settings") else REFUSED
    if failure:
        reason = [line for line in failure["message"].splitlines() if line.strip()][-1]
        logs = Path(config.output_dir) / "logs"
        details = f" (details: {shown_path(logs / 'rank*.log')})" if logs.is_dir() else ""  # where logs were written
        cause = f"{describe_silence(silent)}, and " if silent else ""
        if not details:  # no log of this run holds the traceback: it goes here
            print(failure["message"].rstrip(), file=sys.stderr, flush=True)
        print(wrapped(f"error: {cause}rank {slot} failed: {reason}{details}"), file=sys.stderr, flush=True)
        return 1
    if stop_signal:  # asked to stop before the ranks could save (still starting)
        print(f"interrupted by {signal.Signals(stop_signal).name}: every rank was stopped", file=sys.stderr, flush=True)
        return TERMINATED
    how = f"was killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    print(f"error: rank {slot} {how}", file=sys.stderr, flush=True)
    return code if code > 0 else 1
