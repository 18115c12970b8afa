"""How a run is asked to stop cleanly, and the exit statuses the launcher and the ranks agree on."""

from __future__ import annotations

import signal

from .process_group import LaunchError

INTERRUPTED = 130  # the shell convention for Ctrl+C
STOPPED = 75  # EX_TEMPFAIL: stopped on SIGUSR1 with a checkpoint saved; run again to continue
TERMINATED = 143  # 128 + SIGTERM: stopped on SIGTERM (or Ctrl+Break on Windows) with a checkpoint saved
# Each asks for a clean stop: Slurm's SIGUSR1 before a time limit or a preemption (--signal=USR1@90), SIGTERM
# (docker stop, Kubernetes), Ctrl+Break in a Windows console (every process there gets it), and Ctrl+C, which a
# rank gets only from what started it (the spawn launcher, scripts/train.sh around torchrun, srun).
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGUSR1", "SIGTERM", "SIGBREAK", "SIGINT") if hasattr(signal, name)
)
# The ranks vote every this many steps (each vote read at the next, so no step waits for it) and agree at each
# epoch's end (trainer.py), save a checkpoint and exit with STOPPED, INTERRUPTED or TERMINATED.
STOP_CHECK_EVERY = 16
WHEN_INTERRUPTED = "interrupted: every rank was stopped"  # what the launcher (or rank 0 under torchrun) prints
SETTINGS_REFUSED = 2  # as argparse exits on a bad flag
# Under torchrun, a rank that refused the settings ends with 0 (torchrun would report any other status as its
# failure, or restart the ranks) and writes SETTINGS_REFUSED to this file, which scripts/train.sh exits with.
STATUS_FILE_VARIABLE = "DDP_STATUS_FILE"

_received = 0  # the signal this process received (0: none)


class SettingsRefused(LaunchError):
    """The settings cannot train, found by rank 0 before anything was written; `every_rank`: each rank has it (rank 0
    hands it to the others under torchrun), so each can end alike."""

    def __init__(self, message: str, every_rank: bool = False) -> None:
        super().__init__(message)
        self.every_rank = every_rank


class StopRequested(Exception):
    """Every rank stopped on a stop signal after saving a checkpoint."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


def _request_a_stop(signum, frame) -> None:
    global _received
    _received = max(_received, signum)


def listen_for_stop_requests(signals: tuple[int, ...] = STOP_SIGNALS) -> None:
    for signum in signals:
        signal.signal(signum, _request_a_stop)


def received() -> int:
    """The stop signal this process got (0: none)."""
    return _received


def exit_status(stop: StopRequested) -> int:
    if stop.signum == signal.SIGINT:
        return INTERRUPTED
    return STOPPED if stop.signum == getattr(signal, "SIGUSR1", None) else TERMINATED


def stopped_at(signum: int, step: int) -> str:
    name = signal.Signals(signum).name
    why = "a time limit or preemption is near" if name == "SIGUSR1" else "asked to stop"
    return f"stopped at step {step} on {name} ({why}); the checkpoint is saved, and --resume auto continues from it"
