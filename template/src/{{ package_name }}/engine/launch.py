"""Starting the ranks of one machine, watching them from both sides, and saying how they ended."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import multiprocessing.connection
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from .config import Config
from .logs import shown_path, wrapped
from .process_group import RESTART_VARIABLE, STORE_FILE_VARIABLE, LaunchError, check_meeting_place, restart_count
from .processes import WINDOWS, RankInfo, process_context, torchrun_rank, under_torchrun
from .stopping import (
    INTERRUPTED,
    SETTINGS_REFUSED,
    STOPPED,
    TERMINATED,
    WHEN_INTERRUPTED,
    SettingsRefused,
    listen_for_stop_requests,
)

FOLLOWERS_GRACE_S = 3  # how long a failed rank's peers get to end and report, so the first failure is named
STOPPING_GRACE_S = 30  # how long ranks that stopped on request get to end before they are killed
# A collective whose peer left: gloo's source path in the error ("Connection reset by peer", "Connection closed").
GLOO_LOST_A_PEER = re.compile(r"gloo[/\\]transport[/\\]")
_running: list = []  # the ranks of the current start, for the launcher's signal handler
_stop_signal = 0  # the signal that asked the launcher to stop its ranks cleanly (0: none)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def training(config: Config, info: RankInfo) -> int:
    """What every rank of a training run runs, imported in the rank: the launcher never imports torch."""
    from .rank import run_rank

    return run_rank(config, info)


def evaluation(config: Config, info: RankInfo, checkpoint: str, split: str, result_path: str) -> int:
    """What every rank of `python -m <package>.evaluate` runs (functools.partial gives it the last three)."""
    from .rank import run_evaluation

    return run_evaluation(config, info, checkpoint, split, result_path)


def become_a_rank(rank_main: Callable[[Config, RankInfo], int], heartbeat: tuple | None = None) -> None:
    """Make this process a rank that ends within a second once its launcher is gone (killed outright), else it would
    train on, holding its GPUs; it beats into `heartbeat` (array, slot) from a thread of its own, so that only a
    frozen rank falls silent, not one waiting in a collective."""
    if rank_main is training:
        # Ctrl+C reaches a training rank only from what started it (stopping.py), as a request to save and stop.
        listen_for_stop_requests((signal.SIGINT,))
    elif not under_torchrun():
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # nothing to save: the launcher stops them all on Ctrl+C
    parent = multiprocessing.parent_process()
    if parent is None and WINDOWS:
        return  # not started by multiprocessing: torchrun is Linux-only here
    original_parent = os.getppid()

    def watch() -> None:
        gone = False
        while not gone:
            if heartbeat is not None:
                beats, slot = heartbeat
                beats[slot] = time.time()
            if parent is not None:
                gone = bool(multiprocessing.connection.wait([parent.sentinel], timeout=1.0))
            else:
                time.sleep(1.0)
                gone = os.getppid() != original_parent  # under torchrun: re-parented
        say(f"rank (pid {os.getpid()}) stopping: its launcher is gone")
        if not WINDOWS and os.getpgid(0) == os.getpid():
            os.killpg(0, signal.SIGKILL)  # with its DataLoader workers, which would print tracebacks seconds later
        os._exit(1)  # from this thread only os._exit ends the rank: its main thread may wait in a collective

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def join_as_rank(config: Config, rank_main: Callable[[Config, RankInfo], int] = training) -> int:
    """torchrun, or one Slurm task per rank, started this process as one rank: run `rank_main` as that rank."""
    become_a_rank(rank_main)
    return rank_main(torchrun_layout(config), torchrun_rank())


def torchrun_layout(config: Config) -> Config:
    """Under torchrun, torchrun decides the process layout and the restarts, not the config."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", config.nproc_per_node))
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    if config.max_restarts not in (0, restarts) and torchrun_rank().rank == 0:
        say(
            f"warning: max_restarts={config.max_restarts} does not apply under torchrun, which restarts the ranks "
            f"itself (here {restarts} time(s)): use MAX_RESTARTS={config.max_restarts} scripts/train.sh "
            f"or torchrun --max-restarts {config.max_restarts}"
        )
    layout = {"nproc_per_node": local, "nnodes": int(os.environ["WORLD_SIZE"]) // local, "max_restarts": restarts}
    return dataclasses.replace(config, **layout, resume="auto" if restart_count() else config.resume)  # as spawn


def _spawned_rank(local_rank: int, config: Config, beats, report: str, rank_main: Callable) -> None:
    """Entry point of every spawned process (top level, so Windows can pickle it); a failure goes to `report`."""
    if not WINDOWS:
        os.setpgid(0, 0)  # a group of its own, as torchrun gives each rank: _stop ends it with its workers
    info = RankInfo(config.node_rank * config.nproc_per_node + local_rank, local_rank, config.world_size, "spawn")
    try:
        become_a_rank(rank_main, (beats, local_rank))
        status = rank_main(config, info)
    except Exception as error:
        write_report(report, error)
        sys.exit(1)
    sys.exit(status or 0)  # a normal end: atexit handlers and finalisers run, as in any Python program


def _signal_ranks(ranks: list, signum: int) -> None:
    """Pass a stop request on: the ranks run in groups of their own (a Windows console signals every process)."""
    for rank in ranks:
        if not WINDOWS and rank.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank.pid, signum)


def _ask_ranks_to_stop(signum, frame) -> None:
    """SIGTERM (Ctrl+Break) reached the launcher: the ranks agree, save and stop."""
    global _stop_signal
    if not _stop_signal:
        _signal_ranks(_running, signal.SIGTERM)
    _stop_signal = signum


def spawn(config: Config, rank_main: Callable[[Config, RankInfo], int] = training) -> int:
    """Run config.nproc_per_node ranks here, each `rank_main(config, info)` (top level, importing torch only when
    called); the job's exit status. A failure stops every rank and restarts them max_restarts times at most (not
    after a refusal: exit 2 for settings); Ctrl+C stops them (130); SIGTERM (Ctrl+Break) saves and stops (143)."""
    global _stop_signal
    _stop_signal = 0
    os.environ.update({"MASTER_ADDR": config.master_addr, "MASTER_PORT": str(config.master_port)})
    if WINDOWS:
        os.environ["USE_LIBUV"] = "0"  # Windows wheels have no libuv; the TCP store of a multi-node job asks for it
    check_meeting_place(config)
    warn_about_oversubscription(config)
    stops = [getattr(signal, name) for name in ("SIGTERM", "SIGBREAK") if hasattr(signal, name)]
    previous = {signum: signal.signal(signum, _ask_ranks_to_stop) for signum in stops}
    try:
        for attempt in range(config.max_restarts + 1):
            os.environ[RESTART_VARIABLE] = str(attempt)
            if attempt:
                say(f"restarting all ranks from the newest checkpoint (restart {attempt} of {config.max_restarts})")
                config = dataclasses.replace(config, resume="auto")
            # New each start, as a killed start's store would mix in its keys: the failure reports, and on one
            # machine the FileStore the ranks meet through (so nothing listens on a port).
            folder = Path(tempfile.mkdtemp(prefix="ddp-start-"))
            if config.nnodes == 1:
                os.environ[STORE_FILE_VARIABLE] = str(folder / "store")
            try:
                status = _run_ranks(config, folder, rank_main)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            if status <= 0 or status in (INTERRUPTED, STOPPED, TERMINATED) or _stop_signal:
                return abs(status)  # negative: a refusal, which no restart helps
        return status
    finally:
        os.environ.pop(STORE_FILE_VARIABLE, None)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def warn_about_oversubscription(config: Config) -> None:
    """More CPU ranks than cores: each gets a fraction of one, and every rank holds its own torch (memory)."""
    cores = os.cpu_count() or 1
    if config.device == "cpu" and config.nproc_per_node > cores:
        say(
            f"warning: nproc_per_node={config.nproc_per_node} CPU ranks on {cores} core(s): each rank gets a "
            f"fraction of a core and its own copy of torch in memory, so training is slower than with "
            f"--nproc-per-node {cores}"
        )


def _run_ranks(config: Config, folder: Path, rank_main: Callable) -> int:
    context = process_context()
    beats = context.RawArray("d", config.nproc_per_node)  # each rank's last sign of life (0: not started yet)
    reports = [folder / f"rank{slot}.failure.json" for slot in range(config.nproc_per_node)]
    ranks = [
        context.Process(target=_spawned_rank, args=(slot, config, beats, str(report), rank_main), name=f"rank{slot}")
        for slot, report in enumerate(reports)
    ]
    _running[:] = ranks
    try:
        # Started with Ctrl+C ignored, which they inherit until they listen for it (become_a_rank): one pressed
        # while a rank starts up cannot end it with a traceback.
        interrupts = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for rank in ranks:
                rank.start()
        finally:
            signal.signal(signal.SIGINT, interrupts)
        while not any(rank.exitcode for rank in ranks):  # until one fails
            if all(rank.exitcode == 0 for rank in ranks):
                return 0
            silent = _silent_ranks(beats, config.timeout_s, ranks)
            if silent:
                _stop(ranks)
                say(f"error: {describe_silence(silent)}; every rank was stopped")
                return 1
            multiprocessing.connection.wait([rank.sentinel for rank in ranks if rank.exitcode is None], timeout=1.0)
    except KeyboardInterrupt:
        if rank_main is training:  # each rank saves and stops; a second Ctrl+C, or STOPPING_GRACE_S, ends them
            with contextlib.suppress(KeyboardInterrupt):
                _signal_ranks(ranks, signal.SIGINT)
                _join(ranks, STOPPING_GRACE_S)
        _stop(ranks)  # a probe or an evaluation has nothing to save: it ends at once
        say(WHEN_INTERRUPTED)
        return INTERRUPTED
    finally:
        _running.clear()
    # A failed rank's peers fail once it has left the group, and the first to end may be one of them: the others
    # get a moment to end and leave their reports, so that the first failure is named, not one it caused.
    _join(ranks, FOLLOWERS_GRACE_S)
    slot, failure = first_failure([slot for slot, rank in enumerate(ranks) if rank.exitcode], reports)
    code = ranks[slot].exitcode
    silent = _silent_ranks(beats, 3.0, ranks) if failure else {}  # a rank timed out waiting: was a peer frozen?
    if code in (STOPPED, TERMINATED):  # every rank saved and is ending too: let each end as a program does
        _join(ranks, STOPPING_GRACE_S)
    _stop(ranks)
    return outcome(config, slot, code, failure, silent, _stop_signal)


def _join(ranks: list, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    for rank in ranks:
        rank.join(timeout=max(0.0, deadline - time.monotonic()))


def _silent_ranks(beats, after_s: float, ranks: list) -> dict[int, float]:
    """Ranks still running that beat once and then fell silent for after_s seconds: {local rank: seconds silent}."""
    now = time.time()
    return {
        slot: now - beat
        for slot, beat in enumerate(beats)
        if beat and now - beat >= after_s and ranks[slot].exitcode is None  # an ended rank beats no more
    }


def _stop(processes: list) -> None:
    """Kill every rank still alive with, on POSIX, its group (its DataLoader workers; on Windows torch's watchdog
    ends them). Not SIGTERM: a rank takes that as a request to save and stop, which needs peers."""
    started = [process for process in processes if process.pid is not None]
    for process in started:
        if not WINDOWS:
            with contextlib.suppress(ProcessLookupError, PermissionError):  # no such group: ended, or not made yet
                os.killpg(process.pid, signal.SIGKILL)
        if process.is_alive():
            process.kill()
    for process in started:
        process.join()


def write_report(path: str, error: Exception) -> None:
    """A rank's failure for the launcher, in a file (a pipe could block an exiting rank): a refusal's message and
    exit status, or the traceback."""
    refused = SETTINGS_REFUSED if isinstance(error, SettingsRefused) else int(isinstance(error, LaunchError))
    message = str(error) if refused else "".join(traceback.format_exception(type(error), error, error.__traceback__))
    Path(path).write_text(json.dumps({"refused": refused, "message": message, "time": time.time()}), encoding="utf-8")


def first_failure(ended: list[int], reports: list[Path]) -> tuple[int, dict | None]:
    """The local rank that failed first, and its report: gloo's transport error (a peer left) comes after every
    other failure; then the earliest report, then the ranks that left none (killed, or ended with a status)."""
    failures = {}
    for slot in ended:
        with contextlib.suppress(OSError, ValueError):
            failures[slot] = json.loads(reports[slot].read_text(encoding="utf-8"))

    def following(slot: int) -> tuple[bool, float]:
        failure = failures.get(slot)
        if failure is None:
            return False, math.inf
        return GLOO_LOST_A_PEER.search(failure["message"]) is not None, failure["time"]

    slot = min(ended, key=following)
    return slot, failures.get(slot)


def describe_silence(silent: dict[int, float]) -> str:
    return "; ".join(
        f"rank {slot} stopped answering (no sign of life for {seconds:.0f} s: suspended, stopped or frozen)"
        for slot, seconds in silent.items()
    )


def outcome(config: Config, slot: int, code: int, failure: dict | None, silent: dict, stop_signal: int) -> int:
    """Say how a start ended, from local rank `slot`'s exit code and report; its status (negative: refused)."""
    if code in (STOPPED, TERMINATED):
        asked_by = "SIGUSR1" if code == STOPPED else signal.Signals(stop_signal or signal.SIGTERM).name
        say(f"stopped on {asked_by} with a checkpoint saved; --resume auto continues")
        return code
    if failure and failure["refused"]:
        say(wrapped(f"error: {failure['message']}"))
        return -failure["refused"]
    if failure:
        reason = [line for line in failure["message"].splitlines() if line.strip()][-1]
        logs = Path(config.output_dir) / "logs"
        details = f" (details: {shown_path(logs / 'rank*.log')})" if logs.is_dir() else ""  # where logs were written
        cause = f"{describe_silence(silent)}, and " if silent else ""
        if not details:  # no log of this run holds the traceback: it goes here
            say(failure["message"].rstrip())
        say(wrapped(f"error: {cause}rank {slot} failed: {reason}{details}"))
        return 1
    if stop_signal:  # asked to stop before the ranks could save (still starting)
        say(f"interrupted by {signal.Signals(stop_signal).name}: every rank was stopped")
        return TERMINATED
    how = f"was killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    say(f"error: rank {slot} {how}")
    return code if code > 0 else 1
