"""The one place that knows how ranks start, which backend and devices they use,
and what native Windows needs.

Windows facts encoded here (docs/troubleshooting.md in the template explains each):
- NCCL is never built for Windows: gloo only.
- Windows wheels have no libuv, and torch >= 2.4 asks for it by default when it
  creates the TCPStore: USE_LIBUV=0 must be set before any store exists.
- torchrun's rendezvous also needs libuv on Windows, so the program starts its
  own ranks with torch.multiprocessing (spawn) there; torchrun stays a Linux option.
- "localhost" can resolve to IPv6 or a Docker hosts entry: 127.0.0.1 on one machine.
- Windows has only the spawn start method: workers are top-level functions and
  the entry point sits behind `if __name__ == "__main__":`.
"""

from __future__ import annotations

import dataclasses
import datetime
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .config import Config

WINDOWS = sys.platform == "win32"
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class LaunchError(RuntimeError):
    """Training cannot start; the message names the setting and the fix."""


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    world_size: int


def under_torchrun(environ: dict | os._Environ = os.environ) -> bool:
    """torchrun (or any env:// launcher) already started this process as one rank."""
    return all(name in environ for name in TORCHRUN_VARIABLES)


def rendezvous_environment(config: Config, platform: str = sys.platform) -> dict[str, str]:
    """Variables every rank needs before init_process_group, for the given OS."""
    env = {"MASTER_ADDR": config.master_addr, "MASTER_PORT": str(config.master_port)}
    if platform == "win32":
        env["USE_LIBUV"] = "0"
    return env


def check_backend(config: Config, platform: str = sys.platform) -> None:
    if config.backend == "nccl" and platform == "win32":
        raise LaunchError(
            "backend=nccl is not available on Windows (PyTorch never builds NCCL there); "
            'use --backend gloo or set backend = "gloo" in configs/train.toml'
        )
    if config.backend == "nccl" and not dist.is_nccl_available():
        raise LaunchError("this torch build has no NCCL; use --backend gloo")
    if config.device == "cuda":
        needed = config.nproc_per_node * (2 if config.parallelism == "ddp_model_parallel" else 1)
        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found < needed:
            raise LaunchError(
                f"device=cuda with {config.nproc_per_node} process(es) and parallelism={config.parallelism} "
                f"needs {needed} GPU(s), this machine shows {found}; "
                "run `python -m <package>.doctor`, or use --device cpu / a smaller --nproc-per-node"
            )


def check_port_free(address: str, port: int) -> None:
    """Fail fast, naming the port, instead of a rank dying deep inside TCPStore."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        if not WINDOWS:
            # TCPStore itself binds with SO_REUSEADDR, so a socket in TIME_WAIT
            # from the previous run must not count as busy. (On Windows the same
            # flag would let us share a port that is really in use.)
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


def devices_for(config: Config, local_rank: int) -> tuple[torch.device, ...]:
    """The device(s) this rank owns: one for plain DDP, two for the split model."""
    if config.device == "cpu":
        return (torch.device("cpu"),) * (2 if config.parallelism == "ddp_model_parallel" else 1)
    if config.parallelism == "ddp_model_parallel":
        return torch.device("cuda", 2 * local_rank), torch.device("cuda", 2 * local_rank + 1)
    return (torch.device("cuda", local_rank),)


def init_process_group(config: Config, info: RankInfo) -> None:
    """Join the process group, or fail with a message that says what to check, after timeout_s."""
    address = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    timeout = datetime.timedelta(seconds=config.timeout_s)
    try:
        store = restart_store(timeout) if under_torchrun() else None
        dist.init_process_group(
            backend=config.backend,
            init_method=None if store else "env://",
            store=store,
            rank=info.rank,
            world_size=info.world_size,
            timeout=timeout,
        )
    except (RuntimeError, TimeoutError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise LaunchError(
            f"rank {info.rank}: the {info.world_size} ranks did not all meet at {address} within "
            f"{config.timeout_s}s ({first_line}). Start every node with the same --nnodes, --master-addr "
            "and --master-port; check that node 0 is reachable through its firewall; on machines with several "
            "network interfaces set GLOO_SOCKET_IFNAME to the interface name (e.g. Ethernet)"
        ) from error


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def die_with_the_launcher() -> None:
    """Stop this rank within about a second once the process that started it is gone.

    A launcher killed outright (SIGKILL, the task manager, its console window closed) cannot stop its
    ranks, which would train on, write to the output folder and hold their GPUs. Spawned ranks wait on
    their parent's sentinel (Windows and POSIX); ranks under torchrun notice that they were re-parented.
    """
    parent = multiprocessing.parent_process()
    if parent is None and WINDOWS:
        return  # not started by multiprocessing: torchrun is Linux-only here
    original_parent = os.getppid()

    def launcher_gone() -> bool:
        if parent is not None:
            return bool(multiprocessing.connection.wait([parent.sentinel], timeout=1.0))
        time.sleep(1.0)
        return os.getppid() != original_parent

    def watch() -> None:
        while not launcher_gone():
            pass
        print(f"rank (pid {os.getpid()}) stopping: its launcher is gone", file=sys.stderr, flush=True)
        os._exit(1)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def _spawned_rank(local_rank: int, worker: Callable[[Config, RankInfo], None], config: Config) -> None:
    """Entry point of every spawned process (top level, so Windows can pickle it)."""
    info = RankInfo(
        rank=config.node_rank * config.nproc_per_node + local_rank,
        local_rank=local_rank,
        world_size=config.world_size,
    )
    worker(config, info)


def torchrun_rank() -> RankInfo:
    return RankInfo(
        rank=int(os.environ["RANK"]),
        local_rank=int(os.environ["LOCAL_RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
    )


RESTART_VARIABLE = "DDP_RESTART_COUNT"  # the spawn path's twin of torchrun's TORCHELASTIC_RESTART_COUNT
INTERRUPTED = 130  # the shell convention for Ctrl+C


def restart_count() -> int:
    """How many times the ranks have been restarted in this job (0 on the first start)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", os.environ.get(RESTART_VARIABLE, "0")))


def restart_store(timeout: datetime.timedelta) -> dist.Store | None:
    """The store of this restart only, when torchrun shares its agent's store with the ranks.

    That store outlives a restart, and init_process_group would read the dead
    ranks' gloo addresses from it ("Gloo connectFullMesh failed ... Connection
    refused": 4 of 6 restarted jobs with torch 2.13 here). A prefix per restart
    keeps the attempts apart. Without the shared store
    (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1) every restart gets a new store anyway,
    and env:// is used.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    shared = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        int(os.environ["WORLD_SIZE"]),
        is_master=False,  # torchrun's agent on node 0 hosts it
        timeout=timeout,
    )
    return dist.PrefixStore(f"restart-{restart_count()}", shared)


class _Terminated(Exception):
    """SIGTERM reached the launcher (a CI cancel, a scheduler): stop the ranks like Ctrl+C."""


def _raise_terminated(signum, frame) -> None:
    raise _Terminated


def spawn(worker: Callable[[Config, RankInfo], None], config: Config) -> int:
    """Start config.nproc_per_node ranks on this machine and wait for all of them.

    Returns the exit status for the whole job: 0 when every rank finished,
    otherwise non-zero. When one rank fails, the others are stopped, so the
    job never hangs on a dead peer; with max_restarts > 0 all ranks are then
    started again and resume from the newest checkpoint. Ctrl+C (or SIGTERM)
    stops every rank and returns 130.
    """
    check_backend(config)
    os.environ.update(rendezvous_environment(config))
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
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
            if config.node_rank == 0:
                check_port_free(config.master_addr, config.master_port)
            status = _run_ranks(worker, config)
            if status in (0, INTERRUPTED):
                return status
        return status
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_ranks(worker: Callable[[Config, RankInfo], None], config: Config) -> int:
    context = mp.start_processes(
        _spawned_rank, args=(worker, config), nprocs=config.nproc_per_node, join=False, start_method="spawn"
    )
    try:
        while not context.join():
            pass
    except (KeyboardInterrupt, _Terminated):
        _stop(context.processes)
        print("interrupted: every rank was stopped", file=sys.stderr, flush=True)
        return INTERRUPTED
    except mp.ProcessRaisedException as failure:
        _stop(context.processes)
        reason = [line for line in str(failure).splitlines() if line.strip()][-1]
        logs = Path(config.output_dir) / "logs"
        details = f" (details: {logs / 'rank*.log'})" if logs.is_dir() else ""  # only where logs were written
        print(f"error: rank {failure.error_index} failed: {reason}{details}", file=sys.stderr, flush=True)
        return 1
    except mp.ProcessExitedException as failure:
        _stop(context.processes)
        print(f"error: rank {failure.error_index} exited with code {failure.exit_code}", file=sys.stderr, flush=True)
        return failure.exit_code if failure.exit_code and failure.exit_code > 0 else 1
    return 0


def _stop(processes: list, grace_s: float = 5.0) -> None:
    """Terminate, then kill, every rank still alive."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(grace_s)
        if process.is_alive():
            process.kill()
            process.join()


def ignore_interrupts_in_children() -> None:
    """Ranks leave Ctrl+C to the parent, which stops them all in order."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
