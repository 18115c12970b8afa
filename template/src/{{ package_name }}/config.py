"""Run settings: configs/train.toml, overridden by command-line flags.

The TOML file holds the defaults rendered from the project's copier answers;
every field can be overridden on the command line. The launch scripts pass only
`--config` and the user's own arguments, so an edit to the file always counts.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.9/3.10 only
    import tomli as tomllib

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "train.toml"


class ConfigError(ValueError):
    """A setting is missing, unknown or out of range; the message says which and how to fix it."""


@dataclass
class Config:
    """Every field comes from configs/train.toml (the one place defaults live), then flags."""

    # [train]
    epochs: int
    global_batch_size: int
    lr: float
    momentum: float
    seed: int
    samples: int
    num_workers: int
    checkpoint_every: int
    keep_checkpoints: int
    output_dir: str
    resume: str
    precision: str
    parallelism: str
    deterministic: bool
    progress: bool
    # [distributed]
    backend: str
    device: str
    nproc_per_node: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    timeout_s: int
    max_restarts: int
    # [environment]: what the project was rendered for; read by the doctor.
    environment: dict = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def steps_per_epoch(self) -> int:
        return self.samples // self.global_batch_size

    def problems(self) -> list[str]:
        """Every reason this configuration cannot train, each with its fix."""
        found = []
        for name in ("epochs", "global_batch_size", "samples", "nproc_per_node", "nnodes", "timeout_s"):
            if getattr(self, name) < 1:
                found.append(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("num_workers", "checkpoint_every", "node_rank", "max_restarts"):
            if getattr(self, name) < 0:
                found.append(f"{name} must be 0 or more, got {getattr(self, name)}")
        if self.keep_checkpoints < 1:
            found.append(f"keep_checkpoints must be at least 1, got {self.keep_checkpoints}")
        if self.lr <= 0:
            found.append(f"lr must be positive, got {self.lr}")
        if not 1024 <= self.master_port <= 65535:
            found.append(f"master_port must be between 1024 and 65535, got {self.master_port}")
        if self.nnodes >= 1 and self.node_rank >= self.nnodes:
            found.append(f"node_rank must be below nnodes={self.nnodes}, got {self.node_rank}")
        choices = {
            "precision": ("no", "fp16", "bf16"),
            "parallelism": ("ddp", "ddp_model_parallel"),
            "backend": ("gloo", "nccl"),
            "device": ("cpu", "cuda"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                found.append(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.world_size >= 1 and self.global_batch_size % self.world_size:
            found.append(
                f"global_batch_size={self.global_batch_size} must divide evenly over "
                f"{self.world_size} processes; use a multiple of {self.world_size}"
            )
        if self.global_batch_size > self.samples >= 1:
            found.append(f"global_batch_size={self.global_batch_size} is larger than samples={self.samples}")
        if self.precision == "fp16" and self.device != "cuda":
            found.append("precision=fp16 needs device=cuda; use precision=bf16 on the CPU")
        if self.backend == "nccl" and self.device != "cuda":
            found.append("backend=nccl needs device=cuda; use backend=gloo on the CPU")
        if self.master_addr.lower() == "localhost":
            found.append('master_addr "localhost" can resolve to IPv6 or a Docker hosts entry; use 127.0.0.1')
        return found


_SECTIONS = ("train", "distributed")
_TOML_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,), "dict": (dict,)}


def load(path: Path) -> Config:
    """Read a TOML config; unknown keys are errors so typos never pass silently."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path} is not valid TOML: {error}") from None
    known = {f.name: f for f in dataclasses.fields(Config)}
    values: dict = {"environment": data.pop("environment", {})}
    for section in _SECTIONS:
        for key, value in data.pop(section, {}).items():
            if key not in known or key == "environment":
                raise ConfigError(f"{path}: unknown setting [{section}] {key}")
            values[key] = value
    if data:
        raise ConfigError(f"{path}: unknown section(s) {', '.join(sorted(data))}; expected {', '.join(_SECTIONS)}")
    for name, value in values.items():
        expected = _TOML_TYPES.get(known[name].type)
        if expected and (not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected)):
            raise ConfigError(f"{path}: {name} must be {known[name].type}, got {value!r}")
    missing = [name for name in known if name not in values]
    if missing:
        raise ConfigError(f"{path}: missing setting(s) {', '.join(missing)}; copy them from the template's train.toml")
    return Config(**values)


def _positive_or_zero(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 1024 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be between 1024 and 65535, got {value}")
    return value


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Train the toy model with DistributedDataParallel. "
        "Run plainly, it starts its own ranks; under torchrun it joins as one rank.",
    )
    add = parser.add_argument
    add("--config", type=Path, default=DEFAULT_CONFIG, help="TOML settings file (default: %(default)s)")
    add("--epochs", type=_at_least_one)
    add(
        "--global-batch-size",
        "--batch-size",
        type=_at_least_one,
        dest="global_batch_size",
        help="samples per optimizer step, summed over all ranks",
    )
    add("--lr", type=float)
    add("--seed", type=int)
    add("--samples", type=_at_least_one, help="size of the synthetic data set")
    add("--num-workers", type=_positive_or_zero, help="DataLoader worker processes per rank")
    add("--checkpoint-every", type=_positive_or_zero, help="steps between checkpoints (0: end of each epoch)")
    add("--keep-checkpoints", type=_at_least_one)
    add("--output-dir")
    add("--resume", help="auto (newest good checkpoint in the output dir), none, or a checkpoint path")
    add("--precision", choices=("no", "fp16", "bf16"))
    add("--parallelism", choices=("ddp", "ddp_model_parallel"))
    add("--deterministic", action=argparse.BooleanOptionalAction, default=None)
    add("--progress", action=argparse.BooleanOptionalAction, default=None,
        help="progress bar on rank 0 (only when stdout is a terminal)")  # fmt: skip
    add("--backend", choices=("gloo", "nccl"))
    add("--device", choices=("cpu", "cuda"))
    add("--nproc-per-node", type=_at_least_one, help="processes to start on this machine")
    add("--nnodes", type=_at_least_one)
    add("--node-rank", type=_positive_or_zero)
    add("--master-addr")
    add("--master-port", type=_port)
    add("--timeout-s", type=_at_least_one, help="seconds a collective may wait for a peer")
    add("--max-restarts", type=_positive_or_zero, help="restart all ranks from the newest checkpoint after a failure")
    return parser


def from_command_line(argv: list[str] | None, prog: str) -> Config:
    """Config file, then flags; exits with status 2 and a one-line reason on bad input."""
    parser = build_parser(prog)
    args = vars(parser.parse_args(argv))
    try:
        config = load(args.pop("config"))
    except ConfigError as error:
        parser.error(str(error))
    overrides = {key: value for key, value in args.items() if value is not None}
    config = dataclasses.replace(config, **overrides)
    found = config.problems()
    if found:
        parser.error("; ".join(found))
    return config


def main(argv: list[str] | None = None) -> int:
    """`python -m <package>.config --get NAME[,NAME...] [train flags]`: print settings as training would see them.

    scripts/train.sh asks it for torchrun's layout (processes, nodes, address, port) before torchrun starts,
    so configs/train.toml and the flags stay the one source, and bad flags are refused before any rank.
    """
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}.config", description=main.__doc__.splitlines()[0])
    parser.add_argument("--get", required=True, help="comma-separated setting names, e.g. nproc_per_node,master_port")
    args, train_args = parser.parse_known_args(argv)
    config = from_command_line(train_args, f"python -m {__package__}.train")
    names = args.get.split(",")
    unknown = [name for name in names if name not in {f.name for f in dataclasses.fields(Config)}]
    if unknown:
        parser.error(f"unknown setting(s): {', '.join(unknown)}")
    print(" ".join(str(getattr(config, name)) for name in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
