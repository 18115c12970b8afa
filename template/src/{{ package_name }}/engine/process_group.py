"""The one place that knows which backend and devices the ranks use, how they meet, and what native
Windows needs.

Windows facts encoded here (docs/troubleshooting.md in the template explains each):
- NCCL is never built for Windows: gloo only.
- Windows wheels have no libuv, and torch >= 2.4 asks for it by default when it
  creates the TCPStore: USE_LIBUV=0 must be set before any store exists.
- torchrun's rendezvous also needs libuv on Windows, so the program starts its
  own ranks with multiprocessing (spawn) there; torchrun stays a Linux option.
- "localhost" can resolve to IPv6 or a Docker hosts entry: 127.0.0.1 on one machine.
- A program that listens beyond loopback triggers the Windows Defender Firewall prompt: ranks on one
  machine meet through a file (FileStore) and gloo listens on 127.0.0.1 (gloo_binding).
- Windows builds of torch have no gloo all_reduce of GPU tensors (pytorch#186535): under gloo every
  collective's tensor is on the host (reduction_device), DDP's gradients included (all_reduce_on_host).
- Windows has only the spawn start method, so ranks and DataLoader workers are spawned on every OS
  (START_METHOD): code that Windows would refuse to pickle fails on Linux too, where it is found first.

Importing this module does not import torch: the launcher uses it too. Functions that need torch import it.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import os
import socket
import sys
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import PACKAGE
from .config import Config

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

    from .context import RankContext

WINDOWS = sys.platform == "win32"
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class LaunchError(RuntimeError):
    """Training cannot start; the message names the setting and the fix."""


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    world_size: int
    started_by: str  # for the log: spawn (this program), torchrun, srun


def under_torchrun(environ: dict | os._Environ = os.environ) -> bool:
    """torchrun (or any env:// launcher) already started this process as one rank."""
    return all(name in environ for name in TORCHRUN_VARIABLES)


def rendezvous_environment(config: Config, platform: str = sys.platform) -> dict[str, str]:
    """Variables every rank needs before init_process_group, for the given OS."""
    env = {"MASTER_ADDR": config.master_addr, "MASTER_PORT": str(config.master_port)}
    if platform == "win32":
        env["USE_LIBUV"] = "0"  # Windows wheels have no libuv; the TCP store of a multi-node job would ask for it
    return env


def gpus_per_rank(config: Config) -> int:
    return 2 if config.parallelism == "ddp_model_parallel" else 1


def gpus_needed(config: Config) -> int:
    return config.nproc_per_node * gpus_per_rank(config)


def bound_by_slurm(environ: dict | os._Environ = os.environ) -> bool:
    """A task that srun started as one rank: Slurm may have bound it to its own GPUs (--gpus-per-task,
    --gpu-bind=single:1), so it sees only its share, not the node's."""
    return "SLURM_PROCID" in environ and "TORCHELASTIC_RUN_ID" not in environ


def gpus_each_process_needs(config: Config, environ: dict | os._Environ = os.environ) -> int:
    """Visible GPUs this process needs: its own under a Slurm binding, else those of every rank on the node
    (the spawn path and torchrun give all ranks the same view)."""
    return gpus_per_rank(config) if bound_by_slurm(environ) else gpus_needed(config)


def fit_to(config: Config, gpus: int) -> dict:
    """The settings that make this config train on `gpus` visible GPUs and still pass Config.problems().

    Fewer processes when the GPUs allow (2 per process for the split model), else plain DDP on the one GPU,
    else the CPU; and a global batch that divides over the new processes.
    """
    per_rank = gpus_per_rank(config)
    if gpus >= per_rank:
        changes: dict = {"nproc_per_node": gpus // per_rank}
    elif gpus == 1:
        changes = {"nproc_per_node": 1, "parallelism": "ddp"}
    else:
        changes = {"device": "cpu", "backend": "gloo"}
        if config.precision == "fp16":
            changes["precision"] = "bf16"  # fp16 needs CUDA; bf16 autocasts on the CPU
    parts = config.nnodes * changes.get("nproc_per_node", config.nproc_per_node) * config.accumulate_steps
    if config.global_batch_size % parts:
        changes["global_batch_size"] = parts * max(1, round(config.global_batch_size / parts))
    return changes


def as_flags(changes: dict) -> str:
    return " ".join(f"--{name.replace('_', '-')} {value}" for name, value in changes.items())


BF16_FLOOR = (8, 0)  # Ampere: bf16 in hardware; torch's is_bf16_supported() also counts emulation


def bf16_problem(gpus: dict[int, tuple[str, tuple[int, int]]]) -> str | None:
    """Why bf16 cannot run well on these GPUs ({index: (name, compute capability)}), with the fix; None if it can.

    Volta and Turing (7.x) emulate bf16 slowly; Pascal (6.x) can fail in cuBLAS
    (CUBLAS_STATUS_NOT_SUPPORTED ... CUDA_R_16BF). fp16 with a GradScaler runs on all of them.
    """
    old = [f"GPU {index} ({name}) is {cap[0]}.{cap[1]}" for index, (name, cap) in gpus.items() if cap < BF16_FLOOR]
    if not old:
        return None
    return (
        f"precision=bf16 needs compute capability {BF16_FLOOR[0]}.{BF16_FLOOR[1]} (Ampere) or newer, and "
        f"{', '.join(old)}: bf16 is emulated there (slow) or fails in cuBLAS; fix: --precision fp16 "
        '(precision = "fp16" in configs/train.toml), or --precision no'
    )


def visible_gpus() -> dict[int, tuple[str, tuple[int, int]]]:
    """{index: (name, compute capability)} of the GPUs this process sees (initializes CUDA when there are any)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    return {
        index: (torch.cuda.get_device_name(index), torch.cuda.get_device_capability(index))
        for index in range(torch.cuda.device_count())
    }


def backend_problems(config: Config, platform: str = sys.platform) -> list[str]:
    """Why this machine's torch cannot run the configured backend and devices, each with its fix.

    The one copy of these rules: training refuses to start on them, the doctor reports them.
    """
    import torch
    import torch.distributed as dist

    train = f"python -m {PACKAGE}.train"
    found = []
    if config.backend == "nccl" and platform == "win32":
        found.append(
            "backend=nccl is not available on Windows (PyTorch never builds NCCL there); "
            'use --backend gloo or set backend = "gloo" in configs/train.toml'
        )
    elif config.backend == "nccl" and not dist.is_nccl_available():
        found.append(f"backend nccl is not in this torch build; fix: {train} --backend gloo")
    if config.backend == "gloo" and not dist.is_gloo_available():
        found.append("backend gloo is not in this torch build; fix: reinstall torch from environment.yml")
    installed = torch.__version__.split("+")[0]
    if platform == "win32" and installed.startswith(("2.8.", "2.9.")):
        found.append(
            f"torch {installed} on Windows cannot start gloo (makeDeviceForHostname(): unsupported gloo device); "
            "fix: pin torch 2.7.1 or >= 2.10 in environment.yml and run scripts\\setup_env.bat"
        )
    if config.device == "cuda":
        needed, gpus = gpus_each_process_needs(config), torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus < needed:
            whose = "this Slurm task" if bound_by_slurm() else f"{config.nproc_per_node} process(es)"
            found.append(
                f"{needed} GPU(s) needed for {whose} with parallelism="
                f"{config.parallelism}, {gpus} visible; fix: install the CUDA build of environment.yml, check "
                f"nvidia-smi (python -m {PACKAGE}.doctor), or train with what is here: {train} "
                f"{as_flags(fit_to(config, gpus))}"
            )
        elif config.precision == "bf16":
            used = {index: gpu for index, gpu in visible_gpus().items() if index < needed}
            found += [problem] if (problem := bf16_problem(used)) else []
    return found


def check_backend(config: Config) -> None:
    found = backend_problems(config)
    if found:
        raise LaunchError("; ".join(found))


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


def device_indices(local_rank: int, visible: int, per_rank: int) -> tuple[int, ...]:
    """The CUDA indices of this rank's device(s) among the `visible` GPUs, under any GPU binding.

    All of the node's GPUs visible to every rank (spawn, torchrun, plain srun): rank r takes GPU r (r*2 and
    r*2+1 for the split model). Slurm's --gpus-per-task or --gpu-bind=single:1 leave each task only its
    own, so LOCAL_RANK would point past them: the rank takes its slot modulo what it sees (its own GPU 0).
    """
    slots = visible // per_rank
    if slots < 1:
        raise LaunchError(f"this rank sees {visible} GPU(s) and needs {per_rank}; check CUDA_VISIBLE_DEVICES")
    first = (local_rank % slots) * per_rank
    return tuple(range(first, first + per_rank))


def devices_for(config: Config, local_rank: int) -> tuple[torch.device, ...]:
    """The device(s) this rank owns: one for plain DDP, two for the split model."""
    import torch

    if config.device == "cpu":
        return (torch.device("cpu"),) * gpus_per_rank(config)
    indices = device_indices(local_rank, torch.cuda.device_count(), gpus_per_rank(config))
    return tuple(torch.device("cuda", index) for index in indices)


STORE_FILE_VARIABLE = "DDP_STORE_FILE"  # one machine: the ranks meet through this file, not a port
BOUND_GLOO = "gloo_bound"  # gloo, with its sockets on the address gloo_binding() picks


def gloo_binding(config: Config) -> tuple[dict, str]:
    """Where gloo's sockets listen, as create_device arguments, and why (for the log).

    gloo's default is the address of this machine's hostname, which is loopback on Ubuntu
    (127.0.1.1) and any adapter on Windows (WSL, Hyper-V, VPN ...). One machine stays on
    loopback: nothing listens on the network and no firewall prompt appears. Several machines
    use the address that routes to master_addr. GLOO_SOCKET_IFNAME, when set, wins.
    """
    named = os.environ.get("GLOO_SOCKET_IFNAME")
    if named:
        return {"interface": named.split(",")[0]}, f"interface {named} (GLOO_SOCKET_IFNAME)"
    if config.nnodes == 1:
        return {"hostname": "127.0.0.1"}, "127.0.0.1: every rank is on this machine"
    try:
        address = config.local_address
    except OSError as error:
        raise LaunchError(
            f"no route from this machine to master_addr {config.master_addr} ({error.strerror or error}); check "
            "the address and the network, or set GLOO_SOCKET_IFNAME to the interface that reaches it"
        ) from None
    return {"hostname": address}, f"{address}: the local address that routes to master_addr {config.master_addr}"


def _register_bound_gloo(device_options: dict) -> None:
    import torch.distributed as dist

    def create(store, rank, size, timeout):
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        options._devices = [dist.ProcessGroupGloo.create_device(**device_options)]
        return dist.ProcessGroupGloo(store, rank, size, options)

    if not hasattr(dist.Backend, BOUND_GLOO.upper()):
        dist.Backend.register_backend(BOUND_GLOO, create, devices=["cpu", "cuda"])


GLOO_BACKENDS = ("gloo", BOUND_GLOO)  # the group's backend name: gloo_bound where init_process_group made it


def under_gloo() -> bool:
    """The default process group runs on gloo."""
    import torch.distributed as dist

    return dist.get_backend() in GLOO_BACKENDS


def reduction_device(device: torch.device) -> torch.device:
    """The device a collective's tensor must sit on: the host under gloo, `device` itself under nccl.

    Windows builds of torch have no gloo all_reduce of CUDA tensors (ProcessGroupGlooCuda.cpp is not built
    there; pytorch/pytorch#186535): one dies with an access violation (0xC0000005), not an error. gloo's
    broadcast and all_gather of CUDA tensors exist, and copy through host memory themselves: so under gloo
    every collective of the engine uses host tensors, one rule at the same cost, run by the Linux tests too.
    """
    import torch

    return torch.device("cpu") if under_gloo() else torch.device(device)


# No annotations: DDP refuses a hook whose annotations are strings, as this module's `from __future__` makes them.
def all_reduce_on_host(state, bucket):
    """DDP's gradient all-reduce through host memory (reduction_device): a comm hook for gloo on GPUs.

    As torch's allreduce_hook: each rank divides its bucket by the world size, then the buckets are summed;
    here on a host copy, which then goes back into the bucket. `state`: the process group (None: the default).
    """
    import torch.distributed as dist

    group = state if state is not None else dist.group.WORLD
    bucket_on_device = bucket.buffer()
    on_host = bucket_on_device.to("cpu").div_(group.size())
    summed = dist.all_reduce(on_host, group=group, async_op=True).get_future()
    return summed.then(lambda done: bucket_on_device.copy_(done.value()[0]))


def reduce_gradients_where_gloo_can(model) -> bool:
    """Under gloo, a DDP model with parameters on a GPU all-reduces its gradients on the host; whether it does.

    On every OS, so that the path Windows needs runs on Linux too. On the CPU, and under nccl, DDP's own
    all-reduce stays.
    """
    if not under_gloo() or not any(parameter.is_cuda for parameter in model.parameters()):
        return False
    model.register_comm_hook(None, all_reduce_on_host)
    return True


def nccl_device(config: Config, devices: tuple[torch.device, ...]) -> torch.device | None:
    """The GPU that nccl's process group is bound to, for plain DDP: NCCL then connects inside
    init_process_group, where its errors name the cause (not later inside DDP's constructor), and barrier()
    knows its device instead of guessing ("using the device under current context"). The split model's
    collectives run on both of its GPUs, so its group stays unbound."""
    if config.backend != "nccl" or config.parallelism != "ddp":
        return None
    return devices[0]


def init_process_group(context: RankContext) -> str:
    """Join the process group, or fail with a message that says what to check, after timeout_s.

    Returns where gloo listens, for the log.
    """
    import torch._dynamo  # noqa: F401 - before the group: see below
    import torch.distributed as dist

    config = context.config
    # DDP's constructor imports torch._dynamo, and that import holds on to every process group that exists
    # then: such a group outlives destroy_process_group, its gloo threads still run as the interpreter exits,
    # and now and then the rank's exit aborts (SIGABRT, "terminate called without an active exception").
    # Imported first, the group is freed with the last reference to it, and its threads are joined.

    store_file = os.environ.get(STORE_FILE_VARIABLE)
    address = store_file or f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    timeout = datetime.timedelta(seconds=config.timeout_s)
    backend, listening = config.backend, "(nccl chooses its own interfaces)"
    try:
        if config.backend == "gloo":
            device_options, listening = gloo_binding(config)
            _register_bound_gloo(device_options)
            backend = BOUND_GLOO
        store = restart_store(timeout) if under_torchrun() else None
        if store_file and not store:
            store = dist.FileStore(store_file, context.world_size)
            store.set_timeout(timeout)
        dist.init_process_group(
            backend=backend,
            init_method=None if store else "env://",
            store=store,
            rank=context.rank,
            world_size=context.world_size,
            timeout=timeout,
            device_id=nccl_device(config, context.devices),
        )
    except (RuntimeError, TimeoutError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise LaunchError(
            f"rank {context.rank}: the {context.world_size} ranks did not all meet at {address} within "
            f"{config.timeout_s}s ({first_line}); gloo listened on {listening}. Start every node with the same "
            "--nnodes, --master-addr and --master-port; check that node 0 is reachable through its firewall; "
            "on machines with several network interfaces set GLOO_SOCKET_IFNAME to the one that reaches node 0"
        ) from error
    return listening


@contextlib.contextmanager
def in_the_group():
    """The block runs in the process group, which ends with it, after the trainer the block built.

    The trainer's DDP model holds the group from C++, and a group freed there is joined with the GIL held: a
    gloo worker still letting go of a collective's tensor then waits for the GIL forever. So the trainer lives
    in the block's functions only and is gone when they return; when they raise, the error's frames still hold
    it, and are cleared first (the traceback still names every line). destroy_process_group then drops the last
    reference from Python, which waits for gloo's workers with the GIL released (pytorch/pytorch#154976).
    """
    try:
        yield
    except BaseException as error:
        let_go_of_frames(error)
        raise
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def let_go_of_frames(error: BaseException | None) -> None:
    """Clear the locals of the frames the error, and the errors behind it, passed through."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__


def torchrun_rank() -> RankInfo:
    starters = {"TORCHELASTIC_RUN_ID": "torchrun", "SLURM_PROCID": "srun"}  # else set by hand
    return RankInfo(
        rank=int(os.environ["RANK"]),
        local_rank=int(os.environ["LOCAL_RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        started_by=next((name for variable, name in starters.items() if variable in os.environ), "RANK, WORLD_SIZE"),
    )


RESTART_VARIABLE = "DDP_RESTART_COUNT"  # the spawn path's twin of torchrun's TORCHELASTIC_RESTART_COUNT


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
    import torch.distributed as dist

    shared = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        int(os.environ["WORLD_SIZE"]),
        is_master=False,  # torchrun's agent on node 0 hosts it
        timeout=timeout,
    )
    return dist.PrefixStore(f"restart-{restart_count()}", shared)


START_METHOD = "spawn"  # the only start method Windows has: the launcher's ranks and every rank's DataLoader workers


def process_context() -> multiprocessing.context.BaseContext:
    """How this program starts processes: the launcher its ranks, each rank its DataLoader workers (loaders.py)."""
    return multiprocessing.get_context(START_METHOD)
