"""The process group: how a rank joins it, where its collectives' tensors sit, and how it ends."""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import socket
import tempfile
import traceback
from typing import TYPE_CHECKING

from .config import Config
from .processes import WINDOWS

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist


class LaunchError(RuntimeError):
    """Training cannot start; the message names the setting and the fix."""


RESTART_VARIABLE = "DDP_RESTART_COUNT"  # the spawn path's twin of torchrun's TORCHELASTIC_RESTART_COUNT
STORE_FILE_VARIABLE = "DDP_STORE_FILE"  # one machine: the ranks meet through this file, not a port
BOUND_GLOO = "gloo_bound"  # gloo, with its sockets on the address gloo_binding() picks
_meshes: list = []  # the DeviceMeshes made of this rank's group (world_mesh), let go of as it ends (in_the_group)


def store_path(path: str) -> str | bytes:
    """The path of the file the ranks of one machine meet through, as torch's FileStore must be given it: it opens
    the file with the C runtime's narrow open(), which on Windows reads the bytes in the ANSI code page, not as
    UTF-8, so a temporary folder under a Chinese user name given as UTF-8 is not found. UnicodeEncodeError where
    that code page cannot hold the path."""
    return path.encode("mbcs") if WINDOWS else path


def check_meeting_place(config: Config) -> None:
    """Before any rank starts: fail, naming the fix, where the ranks could not meet (node 0's port, or one
    machine's store file)."""
    if config.nnodes > 1 and config.node_rank == 0:
        check_port_free(config.master_addr, config.master_port)
    elif config.nnodes == 1:
        folder = tempfile.gettempdir()  # spawn's store file goes in a new folder in there
        try:
            store_path(folder)
        except UnicodeEncodeError:
            raise LaunchError(
                f"the temporary folder {folder} has characters that this Windows' code page cannot "
                "hold, and PyTorch opens the file the ranks meet through in that code page. Point TEMP at a folder "
                'with a plain name first: mkdir C:\\Temp, then set TEMP=C:\\Temp (PowerShell: $env:TEMP = "C:\\Temp")'
            ) from None


def check_port_free(address: str, port: int) -> None:
    """Fail fast, naming the port, instead of a rank dying deep inside TCPStore."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        if not WINDOWS:
            # as TCPStore binds: a port in TIME_WAIT from the last run is free (on Windows, one in use would be too)
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as error:
            raise LaunchError(
                f"master_port {port} on {address} is not available ({error.strerror or error}). "
                f"Pick another port: --master-port {port + 1 if port < 65535 else 29500}, "
                "or master_port in configs/train.toml. On Windows, ports reserved by Hyper-V/WSL/Docker are listed "
                "by `netsh interface ipv4 show excludedportrange protocol=tcp`."
            ) from None


def restart_count() -> int:
    """How many times the ranks have been restarted in this job (0 on the first start)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", os.environ.get(RESTART_VARIABLE, "0")))


def gloo_binding(config: Config) -> tuple[dict, str]:
    """Where gloo's sockets listen (create_device's arguments) and why: not gloo's default, the hostname's address
    (127.0.1.1 on Ubuntu, any adapter on Windows), but loopback on one machine (no firewall prompt), else the
    address that routes to master_addr; GLOO_SOCKET_IFNAME, when set, wins."""
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


def under_gloo() -> bool:
    import torch.distributed as dist

    return dist.get_backend() in ("gloo", BOUND_GLOO)


def reduction_device(device: torch.device) -> torch.device:
    """Where a collective's tensor sits: the host under gloo, as Windows' torch has no gloo all_reduce of CUDA tensors
    (it dies, pytorch/pytorch#186535) and gloo's other collectives go through the host anyway; else `device`."""
    import torch

    return torch.device("cpu") if under_gloo() else torch.device(device)


# No annotations: DDP refuses a hook whose annotations are strings, as this module's `from __future__` makes them.
def all_reduce_on_host(state, bucket):
    """torch's allreduce_hook (divide by the world size, sum) on a host copy of the bucket (reduction_device), for
    DDP on GPUs under gloo; `state`: the process group (None: the default)."""
    import torch.distributed as dist

    group = state if state is not None else dist.group.WORLD
    bucket_on_device = bucket.buffer()
    on_host = bucket_on_device.to("cpu").div_(group.size())
    summed = dist.all_reduce(on_host, group=group, async_op=True).get_future()
    return summed.then(lambda done: bucket_on_device.copy_(done.value()[0]))


def reduce_gradients_where_gloo_can(model) -> bool:
    """Whether a DDP model now all-reduces its gradients on the host: under gloo on GPUs, on every OS alike."""
    if not under_gloo() or not any(parameter.is_cuda for parameter in model.parameters()):
        return False
    model.register_comm_hook(None, all_reduce_on_host)
    return True


def nccl_device(config: Config, devices: tuple[torch.device, ...]) -> torch.device | None:
    """The GPU plain DDP binds nccl's group to, so NCCL connects in init_process_group, where its errors name the
    cause, and barrier() knows its device; the split model's group spans two GPUs: unbound."""
    if config.backend != "nccl" or config.parallelism != "ddp":
        return None
    return devices[0]


def init_process_group(config: Config, rank: int, world_size: int, devices: tuple[torch.device, ...]) -> str:
    """Join the process group, or fail after timeout_s saying what to check; where gloo listens, for the log."""
    import torch._dynamo  # noqa: F401 - before the group: see below
    import torch.distributed as dist

    # DDP's constructor imports torch._dynamo, which holds on to every process group that exists then: such a
    # group outlives destroy_process_group and its gloo threads can abort the rank's exit (SIGABRT).
    store_file = os.environ.get(STORE_FILE_VARIABLE)
    address = store_file or f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    timeout = datetime.timedelta(seconds=config.timeout_s)
    backend, listening = config.backend, "(nccl chooses its own interfaces)"
    try:
        if config.backend == "gloo":
            device_options, listening = gloo_binding(config)
            _register_bound_gloo(device_options)
            backend = BOUND_GLOO
        store = restart_store(timeout)
        if store is None and store_file:
            store = dist.FileStore(store_path(store_file), world_size)
            store.set_timeout(timeout)
        dist.init_process_group(
            backend=backend,
            init_method=None if store else "env://",
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=timeout,
            device_id=nccl_device(config, devices),
        )
    except (RuntimeError, TimeoutError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise LaunchError(
            f"rank {rank}: the {world_size} ranks did not all meet at {address} within "
            f"{config.timeout_s}s ({first_line}); gloo listened on {listening}. Start every node with the same "
            "--nnodes, --master-addr and --master-port; check that node 0 is reachable through its firewall; "
            "on machines with several network interfaces set GLOO_SOCKET_IFNAME to the one that reaches node 0"
        ) from error
    return listening


@contextlib.contextmanager
def in_the_group():
    """The block runs in the process group, which ends with it, after the trainer the block built.

    A group freed from C++ (the trainer's DDP model holds it) is joined with the GIL held, and a gloo worker still
    letting go of a tensor then waits for the GIL forever. So the trainer lives in the block's functions only;
    when they raise, the error's frames (and its causes'), which still hold it, are cleared first.
    destroy_process_group then drops the last reference from Python, without the GIL (pytorch/pytorch#154976).
    """
    try:
        yield
    except BaseException as error:
        seen, cause = set(), error
        while cause is not None and id(cause) not in seen:
            seen.add(id(cause))
            traceback.clear_frames(cause.__traceback__)
            cause = cause.__cause__ or cause.__context__
        raise
    finally:
        import torch.distributed as dist

        # DTensor's caches keep each mesh for the life of the process, and a mesh its process groups (for
        # torch.compile): a gloo group still alive at exit has worker threads whose end can abort the rank's exit
        # ("terminate called without an active exception", SIGABRT). So the meshes let go of the groups, and the
        # sharded model, which its hooks hold in reference cycles, is collected now, not by a later collection.
        if _meshes:
            for mesh in _meshes:
                mesh._pg_registry.clear()
            _meshes.clear()
            gc.collect()
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def world_mesh(device_type: str):
    """The process group as the one-dimensional DeviceMesh that fully_shard takes; it ends with the group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    _meshes.append(mesh)
    return mesh


def restart_store(timeout: datetime.timedelta) -> dist.Store | None:
    """The store of this restart only, when torchrun shares its agent's store with the ranks: that store outlives
    a restart, and the dead ranks' gloo addresses in it fail the next meeting ("Gloo connectFullMesh failed")."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    import torch.distributed as dist

    address, port, size = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"])
    shared = dist.TCPStore(address, port, size, is_master=False, timeout=timeout)  # hosted by torchrun's agent
    return dist.PrefixStore(f"restart-{restart_count()}", shared)
