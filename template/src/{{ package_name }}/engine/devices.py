"""Which devices each rank computes on, and whether this machine's torch can run the configured backend there."""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

from . import PACKAGE
from .config import Config
from .process_group import LaunchError
from .processes import WINDOWS, bound_by_slurm

if TYPE_CHECKING:
    import torch

BF16_FLOOR = (8, 0)  # Ampere: bf16 in hardware; torch's is_bf16_supported() also counts emulation


def gpus_per_rank(config: Config) -> int:
    return 2 if config.parallelism == "ddp_model_parallel" else 1


def gpus_needed(config: Config) -> int:
    return config.nproc_per_node * gpus_per_rank(config)


def gpus_each_process_needs(config: Config, environ: dict | os._Environ = os.environ) -> int:
    """Visible GPUs this process needs: its own under a Slurm binding, else every rank's on the node."""
    return gpus_per_rank(config) if bound_by_slurm(environ) else gpus_needed(config)


def fit_to(config: Config, gpus: int) -> dict:
    """The settings that train this config on `gpus` visible GPUs: fewer processes, else plain DDP on the one GPU,
    else the CPU; and a global batch that divides over the new processes."""
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


def bf16_problem(gpus: dict[int, tuple[str, tuple[int, int]]], parallelism: str = "ddp") -> str | None:
    """Why bf16 cannot run well on these GPUs ({index: (name, compute capability)}), with the fix; None if it can.
    7.x emulates it slowly, 6.x can fail in cuBLAS; fp16 runs on all of them, but fsdp refuses it (config.py)."""
    old = [f"GPU {index} ({name}) is {cap[0]}.{cap[1]}" for index, (name, cap) in gpus.items() if cap < BF16_FLOOR]
    if not old:
        return None
    if parallelism == "fsdp":
        fix = '--precision no (precision = "no" in configs/train.toml; parallelism=fsdp cannot use fp16)'
    else:
        fix = '--precision fp16 (precision = "fp16" in configs/train.toml), or --precision no'
    return (
        f"precision=bf16 needs compute capability {BF16_FLOOR[0]}.{BF16_FLOOR[1]} (Ampere) or newer, and "
        f"{', '.join(old)}: bf16 is emulated there (slow) or fails in cuBLAS; fix: {fix}"
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


def backend_problems(config: Config) -> list[str]:
    """Why this machine's torch cannot run the configured backend and devices, each with its fix: training refuses
    to start on them, the doctor reports them."""
    import torch
    import torch.distributed as dist

    train = f"python -m {PACKAGE}.train"
    found = []
    if config.backend == "nccl" and WINDOWS:
        found.append(
            "backend=nccl is not available on Windows (PyTorch never builds NCCL there); "
            'use --backend gloo or set backend = "gloo" in configs/train.toml'
        )
    elif config.backend == "nccl" and not dist.is_nccl_available():
        found.append(f"backend nccl is not in this torch build; fix: {train} --backend gloo")
    if config.backend == "gloo" and not dist.is_gloo_available():
        found.append("backend gloo is not in this torch build; fix: reinstall torch from environment.yml")
    installed = torch.__version__.split("+")[0]
    if WINDOWS and installed.startswith(("2.8.", "2.9.")):
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
            found += [problem] if (problem := bf16_problem(used, config.parallelism)) else []
    if config.parallelism == "fsdp" and not hasattr(importlib.import_module("torch.distributed.fsdp"), "fully_shard"):
        found.append(
            f"parallelism=fsdp needs FSDP2's torch.distributed.fsdp.fully_shard, which torch {installed} does not "
            "have (it is public from torch 2.6); fix: pin torch 2.6 or newer in environment.yml and set up the "
            f"environment again, or train without sharding: {train} --parallelism ddp"
        )
    return found


def check_backend(config: Config) -> None:
    found = backend_problems(config)
    if found:
        raise LaunchError("; ".join(found))


def device_indices(local_rank: int, visible: int, per_rank: int) -> tuple[int, ...]:
    """The CUDA indices of this rank's device(s) among the `visible` GPUs: rank r takes GPU r (r*2 and r*2+1 for the
    split model), modulo what it sees, as Slurm's --gpus-per-task or --gpu-bind=single:1 leave each task its own."""
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
