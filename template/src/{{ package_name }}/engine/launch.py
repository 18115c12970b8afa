"""Starting the ranks of one machine and watching them, from both sides: restarts, heartbeats, stop requests."""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .config import Config
from .failures import REFUSED, REFUSED_SETTINGS, describe_silence, first_failure, outcome, write_report
from .process_group import RESTART_VARIABLE, STORE_FILE_VARIABLE, LaunchError, restart_count
from .processes import WINDOWS, RankInfo, process_context, torchrun_rank, under_torchrun
from .stopping import (
    INTERRUPTED,
    SETTINGS_REFUSED,
    STOPPED,
    TERMINATED,
    WHEN_INTERRUPTED,
    listen_for_stop_requests,
)

FOLLOWERS_GRACE_S = 3  # how long a failed rank's peers get to end and report, so the first failure is named
STOPPING_GRACE_S = 30  # how long ranks that stopped on request get to end before they are killed
_heartbeat: tuple | None = None  # (shared array, slot) of a spawned rank: see _run_ranks


def die_with_the_launcher() -> None:
    """Stop this rank within about a second once the process that started it is gone; beat meanwhile.

    A launcher killed outright (SIGKILL, its console window closed) cannot stop its ranks, which would train on
    and hold their GPUs. Spawned ranks wait on their parent's sentinel; ranks under torchrun notice that they
    were re-parented. The heartbeat comes from this thread, so only a frozen process falls silent, not a rank
    that waits in a collective.
    """
    parent = multiprocessing.parent_process()
    if parent is None and WINDOWS:
        return  # not started by multiprocessing: torchrun is Linux-only here
    original_parent = os.getppid()

    def launcher_gone() -> bool:
        if _heartbeat is not None:
            beats, slot = _heartbeat
            beats[slot] = time.time()
        if parent is not None:
            return bool(multiprocessing.connection.wait([parent.sentinel], timeout=1.0))
        time.sleep(1.0)
        return os.getppid() != original_parent

    def watch() -> None:
        while not launcher_gone():
            pass
        print(f"rank (pid {os.getpid()}) stopping: its launcher is gone", file=sys.stderr, flush=True)
        if not WINDOWS and os.getpgid(0) == os.getpid():
            # The group of its own that _spawned_rank made: its DataLoader workers end with it, where they would
            # notice the lost rank only seconds later and print tracebacks into the console.
            os.killpg(0, signal.SIGKILL)
        os._exit(1)  # from this thread only os._exit ends the rank: its main thread may wait in a collective

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def training(config: Config, info: RankInfo) -> int:
    """What every rank of a training run runs: rank.py, imported in the rank, as the launcher never imports torch."""
    from .rank import run_rank

    return run_rank(config, info)


def evaluation(config: Config, info: RankInfo, checkpoint: str, split: str, result_path: str) -> int:
    """What every rank of `python -m <package>.evaluate` runs (functools.partial gives it the last three)."""
    from .rank import run_evaluation

    return run_evaluation(config, info, checkpoint, split, result_path)


def become_a_rank(rank_main: Callable[[Config, RankInfo], int]) -> None:
    """Make this process a rank that ends with its launcher, before it runs `rank_main`."""
    die_with_the_launcher()
    if rank_main is training:
        # Ctrl+C reaches a training rank only from what started it (see stopping.py), as a request to save and
        # stop: kept from the start, acted on once training runs.
        listen_for_stop_requests((signal.SIGINT,))
    elif not under_torchrun():
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # nothing to save: the launcher stops them all on Ctrl+C


def join_as_rank(config: Config, rank_main: Callable[[Config, RankInfo], int] = training) -> int:
    """torchrun, or one Slurm task per rank, started this process as one rank: run `rank_main` as that rank."""
    become_a_rank(rank_main)
    return rank_main(torchrun_layout(config), torchrun_rank())


def torchrun_layout(config: Config) -> Config:
    """Under torchrun, torchrun decides the process layout and the restarts, not the config."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", config.nproc_per_node))
    torchrun_restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    if config.max_restarts not in (0, torchrun_restarts) and torchrun_rank().rank == 0:
        print(
            f"warning: max_restarts={config.max_restarts} does not apply under torchrun, which restarts the ranks "
            f"itself (here {torchrun_restarts} time(s)): use MAX_RESTARTS={config.max_restarts} scripts/train.sh "
            f"or torchrun --max-restarts {config.max_restarts}",
            file=sys.stderr,
            flush=True,
        )
    return dataclasses.replace(
        config,
        nproc_per_node=local,
        nnodes=int(os.environ["WORLD_SIZE"]) // local,
        max_restarts=torchrun_restarts,
        # A restarted rank continues from the newest checkpoint, as on the spawn path.
        resume="auto" if restart_count() else config.resume,
    )


def _spawned_rank(local_rank: int, config: Config, beats, report: str, rank_main: Callable) -> None:
    """Entry point of every spawned process (top level, so Windows can pickle it); a failure goes to `report`."""
    global _heartbeat
    _heartbeat = (beats, local_rank)
    if not WINDOWS:
        # A process group of its own, as torchrun gives each rank, so that the launcher can end the rank with its
        # DataLoader workers (_stop); a rank that crashed leaves its workers behind to be ended too.
        os.setpgid(0, 0)
    info = RankInfo(
        rank=config.node_rank * config.nproc_per_node + local_rank,
        local_rank=local_rank,
        world_size=config.world_size,
        started_by="spawn",
    )
    try:
        become_a_rank(rank_main)
        status = rank_main(config, info)
    except Exception as error:
        write_report(report, error)
        sys.exit(1)
    sys.exit(status or 0)  # a normal end: atexit handlers and finalisers run, as in any Python program


_running: list = []  # the ranks of the current start, for the launcher's signal handler
_stop_signal = 0  # the signal that asked the launcher to stop its ranks cleanly (0: none)


def _ask_ranks_to_stop(signum, frame) -> None:
    """SIGTERM reached the launcher: pass it on, so the ranks agree, save and stop (Windows gives Ctrl+Break to
    every process of the console)."""
    global _stop_signal
    first, _stop_signal = not _stop_signal, signum
    if first and not WINDOWS:
        for rank in _running:
            if rank.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rank.pid, signal.SIGTERM)


def spawn(config: Config, rank_main: Callable[[Config, RankInfo], int] = training) -> int:
    """Start config.nproc_per_node ranks on this machine, each running `rank_main(config, info)`, and wait for all
    of them; the job's exit status.

    `rank_main` is a top-level function (or a functools.partial of one) that imports torch only when called. When
    one rank fails, the others are stopped, and with max_restarts > 0 all start again from the newest checkpoint
    (a refusal is not retried; refused settings return 2). Ctrl+C stops every rank (130); SIGTERM (Ctrl+Break on
    Windows) asks them to save a checkpoint and stop (143).
    """
    global _stop_signal
    _stop_signal = 0
    os.environ.update({"MASTER_ADDR": config.master_addr, "MASTER_PORT": str(config.master_port)})
    if WINDOWS:
        os.environ["USE_LIBUV"] = "0"  # Windows wheels have no libuv; the TCP store of a multi-node job asks for it
    if config.nnodes > 1 and config.node_rank == 0:
        check_port_free(config.master_addr, config.master_port)
    warn_about_oversubscription(config)
    stops = [name for name in ("SIGTERM", "SIGBREAK") if hasattr(signal, name)]
    previous = {name: signal.signal(getattr(signal, name), _ask_ranks_to_stop) for name in stops}
    try:
        for attempt in range(config.max_restarts + 1):
            os.environ[RESTART_VARIABLE] = str(attempt)
            if attempt:
                print(
                    f"restarting all ranks from the newest checkpoint (restart {attempt} of {config.max_restarts})",
                    file=sys.stderr,
                    flush=True,
                )
                config = dataclasses.replace(config, resume="auto")
            with _start_folder(config) as folder:
                status = _run_ranks(config, folder, rank_main)
            if status in (0, INTERRUPTED, STOPPED, TERMINATED, REFUSED, REFUSED_SETTINGS) or _stop_signal:
                return {REFUSED: 1, REFUSED_SETTINGS: SETTINGS_REFUSED}.get(status, status)
        return status
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)


def warn_about_oversubscription(config: Config) -> None:
    """More CPU ranks than cores: each gets a fraction of one, and every rank holds its own torch (memory)."""
    cores = os.cpu_count() or 1
    if config.device == "cpu" and config.nproc_per_node > cores:
        print(
            f"warning: nproc_per_node={config.nproc_per_node} CPU ranks on {cores} core(s): each rank gets a "
            f"fraction of a core and its own copy of torch in memory, so training is slower than with "
            f"--nproc-per-node {cores}",
            file=sys.stderr,
            flush=True,
        )


def check_port_free(address: str, port: int) -> None:
    """Fail fast, naming the port, instead of a rank dying deep inside TCPStore."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        if not WINDOWS:
            # TCPStore binds with SO_REUSEADDR, so a port in TIME_WAIT from the last run is free for it too (on
            # Windows the flag would let us share a port that is really in use).
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as error:
            hint = (
                " On Windows, ports reserved by Hyper-V/WSL/Docker are listed by "
                "`netsh interface ipv4 show excludedportrange protocol=tcp`."
            )
            raise LaunchError(
                f"master_port {port} on {address} is not available ({error.strerror or error}). "
                f"Pick another port: --master-port {port + 1 if port < 65535 else 29500}, "
                f"or master_port in configs/train.toml.{hint}"
            ) from None


@contextlib.contextmanager
def _start_folder(config: Config):
    """A new folder for one start of the ranks: their failure reports and, on one machine, the FileStore they meet
    through (so nothing listens on a port); new per start, as a killed start's store would mix in its keys."""
    folder = Path(tempfile.mkdtemp(prefix="ddp-start-"))
    if config.nnodes == 1:
        os.environ[STORE_FILE_VARIABLE] = str(folder / "store")
    try:
        yield folder
    finally:
        os.environ.pop(STORE_FILE_VARIABLE, None)
        shutil.rmtree(folder, ignore_errors=True)


def _run_ranks(config: Config, folder: Path, rank_main: Callable) -> int:
    context = process_context()
    # Each rank's last sign of life (0: not started yet), written by its launcher-watch thread every second.
    beats = context.RawArray("d", config.nproc_per_node)
    reports = [folder / f"rank{slot}.failure.json" for slot in range(config.nproc_per_node)]
    ranks = [
        context.Process(
            target=_spawned_rank,
            args=(slot, config, beats, str(reports[slot]), rank_main),
            name=f"rank{slot}",
        )
        for slot in range(config.nproc_per_node)
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
        while True:
            multiprocessing.connection.wait([rank.sentinel for rank in ranks], timeout=1.0)
            ended = [slot for slot, rank in enumerate(ranks) if rank.exitcode not in (None, 0)]
            if ended:
                break
            if all(rank.exitcode == 0 for rank in ranks):
                return 0
            silent = _silent_ranks(beats, config.timeout_s, ranks)
            if silent:
                _stop(ranks)
                print(f"error: {describe_silence(silent)}; every rank was stopped", file=sys.stderr, flush=True)
                return 1
    except KeyboardInterrupt:
        if rank_main is training:
            _interrupt(ranks)
        else:  # a probe or an evaluation has nothing to save: it ends at once
            _stop(ranks)
        print(WHEN_INTERRUPTED, file=sys.stderr, flush=True)
        return INTERRUPTED
    finally:
        _running.clear()
    # A failed rank's peers fail once it has left the group, and the first to end may be one of them: the others
    # get a moment to end and leave their reports, so that the first failure is named, not one it caused.
    deadline = time.monotonic() + FOLLOWERS_GRACE_S
    for rank in ranks:
        rank.join(timeout=max(0.0, deadline - time.monotonic()))
    ended = [slot for slot, rank in enumerate(ranks) if rank.exitcode not in (None, 0)]
    slot, failure = first_failure(ended, reports)
    code = ranks[slot].exitcode
    silent = _silent_ranks(beats, 3.0, ranks) if failure else {}  # a rank timed out waiting: was a peer frozen?
    if code in (STOPPED, TERMINATED):  # every rank saved and is ending too: let each end as a program does
        for rank in ranks:
            rank.join(timeout=STOPPING_GRACE_S)
    _stop(ranks)
    return outcome(config, slot, code, failure, silent, _stop_signal)


def _silent_ranks(beats, after_s: float, ranks: list) -> dict[int, float]:
    """Ranks still running that beat once and then fell silent for after_s seconds: {local rank: seconds silent}."""
    now = time.time()
    return {
        slot: now - beat
        for slot, beat in enumerate(beats)
        if beat and now - beat >= after_s and ranks[slot].exitcode is None  # an ended rank beats no more
    }


def _stop(processes: list) -> None:
    """Kill every rank still alive with, on POSIX, its process group (its DataLoader workers would outlive the job
    for seconds; on Windows torch's watchdog ends them within 5 s). Not SIGTERM: a rank takes that as a request
    to save and stop, which a job ending on a failure has no peers left for."""
    started = [process for process in processes if process.pid is not None]
    for process in started:
        if not WINDOWS:
            with contextlib.suppress(ProcessLookupError, PermissionError):  # no such group: ended, or not made yet
                os.killpg(process.pid, signal.SIGKILL)
        if process.is_alive():
            process.kill()
    for process in started:
        process.join()


def _interrupt(ranks: list) -> None:
    """Ctrl+C: each rank saves a checkpoint and stops; a second Ctrl+C, or STOPPING_GRACE_S, ends them at once.
    The ranks run in process groups of their own, so the terminal's Ctrl+C reaches them from here (a Windows
    console gives it to every process)."""
    try:
        for rank in ranks:
            if not WINDOWS and rank.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rank.pid, signal.SIGINT)
        deadline = time.monotonic() + STOPPING_GRACE_S
        for rank in ranks:
            rank.join(timeout=max(0.0, deadline - time.monotonic()))
    except KeyboardInterrupt:
        pass
    _stop(ranks)
