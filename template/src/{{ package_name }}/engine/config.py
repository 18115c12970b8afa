"""The run's settings: each declared once, with its meaning and range, and the combinations that cannot train."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import scalars

PROJECT_ROOT = Path(__file__).resolve().parents[3]  # src/<package>/engine/ -> the folder with configs/
DEFAULT_CONFIG = PROJECT_ROOT / "configs" / "train.toml"


class ConfigError(ValueError):
    """A setting is missing, unknown or out of range; the message says which and how to fix it."""


def at_least(low: float) -> Callable[[float], str | None]:
    return lambda value: None if value >= low else f"must be at least {low}, got {value}"


def port(value: int) -> str | None:
    return None if 1024 <= value <= 65535 else f"must be between 1024 and 65535, got {value}"


def a_folder(value: str) -> str | None:
    return None if value.strip() else f"must name a folder, got {value!r}; use one such as --output-dir outputs"


def setting(help: str, check: Callable | None = None, choices: tuple = (), aliases: tuple = ()):
    """One setting: its meaning (shown by --help), its range check and its choices, declared once."""
    return field(metadata={"help": help, "check": check, "choices": choices, "aliases": aliases})


@dataclass
class Config:
    """[train] and [distributed] of configs/train.toml (the one place defaults live), then flags; the flags,
    --help and the range checks are generated from these declarations."""

    # [train]
    epochs: int = setting("epochs to train", at_least(1))
    recipe: str = setting("module that builds the model, data, optimizer, schedule, loss and metric")
    global_batch_size: int = setting(
        "samples per optimizer step, summed over all ranks and micro-batches", at_least(1), aliases=("--batch-size",)
    )
    accumulate_steps: int = setting(
        "micro-batches per optimizer step on each rank (gradient accumulation)", at_least(1)
    )
    seed: int = setting("seed of the weights, the data order and every rank's random streams")
    num_workers: int = setting("DataLoader worker processes per rank (spawned, started once per run)", at_least(0))
    checkpoint_every: int = setting("steps between checkpoints (0: at the end of each epoch)", at_least(0))
    keep_checkpoints: int = setting("how many of this run's newest checkpoints to keep", at_least(1))
    output_dir: str = setting("folder for checkpoints, logs, metrics.csv and model.pt", a_folder)
    resume: str = setting("auto (newest good checkpoint in output_dir), none, or a checkpoint path")
    overwrite: bool = setting("let a new run replace what another run left in output_dir")
    best_metric: str = setting("metrics.csv column that picks best.pt: val_loss or val_<the recipe's metric>")
    best_mode: str = setting("whether best_metric is best when lowest or highest", choices=("min", "max"))
    stop_on_nonfinite_loss: bool = setting("stop when the loss turns NaN or infinite, keeping the last good checkpoint")
    max_grad_norm: float = setting(
        "clip the gradients' global L2 norm to this once per step (0: no clipping)", at_least(0)
    )
    early_stop_patience: int = setting(
        "stop after this many epochs without a better best_metric (0: train every epoch)", at_least(0)
    )
    precision: str = setting("autocast precision; parameters stay fp32", choices=("no", "fp16", "bf16"))
    parallelism: str = setting(
        "one device per process, the model split over 2, or sharded over the ranks",
        choices=("ddp", "ddp_model_parallel", "fsdp"),
    )
    deterministic: bool = setting("deterministic algorithms only (slower)")
    progress: bool = setting("progress bar on rank 0 (only when stdout is a terminal)")
    tensorboard: bool = setting(
        "rank 0 also writes metrics.csv's scalars as TensorBoard events under output_dir", scalars.missing_package
    )
    # [distributed]
    backend: str = setting("collective backend (Windows: gloo only)", choices=("gloo", "nccl"))
    device: str = setting("where each rank computes", choices=("cpu", "cuda"))
    nproc_per_node: int = setting("processes (ranks) to start on this machine", at_least(1))
    nnodes: int = setting("machines in the job", at_least(1))
    node_rank: int = setting("this machine's number, 0 to nnodes-1", at_least(0))
    master_addr: str = setting("address of machine 0 (127.0.0.1 for one machine)")
    master_port: int = setting("TCP port of the rendezvous on machine 0", port)
    timeout_s: int = setting("seconds a collective waits for a missing peer", at_least(1))
    max_restarts: int = setting("restart all ranks from the newest checkpoint after a failure, this often", at_least(0))
    # [environment]: what the project was rendered for; read by the doctor.
    environment: dict = field(default_factory=dict)
    # [recipe]: the recipe's own settings (block_size = 64, ...), as TOML gave them, each overridable with
    # --set NAME=VALUE or its own flag; recorded in run.json and every checkpoint with the rest of the config.
    settings: dict = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def local_address(self) -> str:
        """This machine's address that routes to master_addr (OSError: none), as the OS picks it for a UDP socket
        that sends nothing: a VPN, a WSL/Docker adapter or a hostname mapped to 127.0.1.1 cannot mislead it."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((self.master_addr, self.master_port))
            return probe.getsockname()[0]

    @property
    def micro_batch(self) -> int:  # samples each rank puts through the model at once
        return self.global_batch_size // (self.world_size * self.accumulate_steps)

    def problems(self) -> list[str]:
        """Every reason this configuration cannot train, each with its fix."""
        found = []
        for setting_field in SETTINGS:
            value = getattr(self, setting_field.name)
            check, choices = setting_field.metadata["check"], setting_field.metadata["choices"]
            reason = check(value) if check else None
            if choices and value not in choices:
                reason = f"must be one of {', '.join(choices)}, got {value!r}"
            if reason:
                found.append(f"{setting_field.name} {reason}")
        if found:
            return found  # the rules below assume every value is in range
        if self.node_rank >= self.nnodes:
            found.append(f"node_rank must be below nnodes={self.nnodes}, got {self.node_rank}")
        parts = self.world_size * self.accumulate_steps
        if self.global_batch_size % parts:
            found.append(
                f"global_batch_size={self.global_batch_size} must divide evenly over {self.world_size} processes"
                f" x accumulate_steps={self.accumulate_steps}; use a multiple of {parts}"
            )
        if self.precision == "fp16" and self.device != "cuda":
            cpu = "precision=bf16 on the CPU" if native_bf16() is not False else "precision=no on this CPU"
            found.append(f"precision=fp16 needs device=cuda; use {cpu}")
        # fsdp (engine/sharding.py says why); here, as this module must not import torch.
        if self.parallelism == "fsdp" and self.precision == "fp16":
            found.append(
                "parallelism=fsdp cannot use precision=fp16: sharded gradients need a GradScaler that checks them "
                "for inf over all ranks, which the engine does not have; use precision=bf16"
            )
        if self.parallelism == "fsdp" and self.device == "cuda" and self.backend != "nccl":
            found.append(
                "parallelism=fsdp on GPUs needs backend=nccl (Linux): gloo reduce-scatters through an all_reduce, "
                "which torch on Windows cannot run on GPU tensors; use parallelism=ddp there"
            )
        if self.backend == "nccl" and self.device != "cuda":
            found.append("backend=nccl needs device=cuda; use backend=gloo on the CPU")
        if self.master_addr.lower() == "localhost":
            found.append('master_addr "localhost" can resolve to IPv6 or a Docker hosts entry; use 127.0.0.1')
        return found


# The CPU flags of bf16 in hardware (Linux's /proc/cpuinfo names): without them, autocast emulates bf16 on the CPU.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# An AVX2 CPU without them trained a small CNN at 15 samples/s in bf16, against 194 in fp32.
EMULATED_BF16 = "bf16 has no hardware support on this CPU: ~13x slower; use --precision no"


def native_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU does bf16 in hardware, from /proc/cpuinfo's flags (`cpuinfo`: its text); None: not known."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:  # not Linux
            return None
    lines = [line for line in cpuinfo.splitlines() if line.startswith("flags")]
    flags = {flag for line in lines for flag in line.partition(":")[2].split()}
    return bool(flags & set(NATIVE_BF16_FLAGS)) if flags else None  # no flags: another architecture


def precision_warning(config: Config) -> str | None:
    """The one line a run on the CPU in bf16 gets where the CPU emulates it."""
    emulated = config.device == "cpu" and config.precision == "bf16" and native_bf16() is False
    return EMULATED_BF16 if emulated else None


SETTINGS = [f for f in dataclasses.fields(Config) if f.name not in ("environment", "settings")]
SETTING_NAMES = [f.name for f in SETTINGS]
