"""Run settings: configs/train.toml, overridden by command-line flags.

The TOML file holds the defaults rendered from the project's copier answers;
every field can be overridden on the command line. The launch scripts pass only
`--config` and the user's own arguments, so an edit to the file always counts.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.9/3.10 only
    import tomli as tomllib

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "train.toml"


class ConfigError(ValueError):
    """A setting is missing, unknown or out of range; the message says which and how to fix it."""


def at_least(low: float) -> Callable[[float], str | None]:
    return lambda value: None if value >= low else f"must be at least {low}, got {value}"


def port(value: int) -> str | None:
    return None if 1024 <= value <= 65535 else f"must be between 1024 and 65535, got {value}"


def positive_finite(value: float) -> str | None:
    return None if math.isfinite(value) and value > 0 else f"must be a finite number above 0, got {value}"


def momentum_range(value: float) -> str | None:
    return None if 0 <= value < 1 else f"must be at least 0 and below 1, got {value}"


def setting(help: str, check: Callable | None = None, choices: tuple = (), aliases: tuple = ()):
    """One setting: its meaning (shown by --help), its range check and its choices, declared once."""
    return field(metadata={"help": help, "check": check, "choices": choices, "aliases": aliases})


@dataclass
class Config:
    """Every field comes from configs/train.toml (the one place defaults live), then flags.

    The flags, `--help` and the range checks are all generated from these declarations.
    """

    # [train]
    epochs: int = setting("epochs to train", at_least(1))
    recipe: str = setting("module that builds the model, data, optimizer, schedule, loss and metric")
    global_batch_size: int = setting(
        "samples per optimizer step, summed over all ranks and micro-batches", at_least(1), aliases=("--batch-size",)
    )
    accumulate_steps: int = setting(
        "micro-batches per optimizer step on each rank (gradient accumulation)", at_least(1)
    )
    lr: float = setting("learning rate (cosine schedule over the whole run)", positive_finite)
    momentum: float = setting("SGD momentum", momentum_range)
    seed: int = setting("seed of the weights, the data order and every rank's random streams")
    samples: int = setting("size of the synthetic data set", at_least(1))
    num_workers: int = setting("DataLoader worker processes per rank (spawned on Windows)", at_least(0))
    checkpoint_every: int = setting("steps between checkpoints (0: at the end of each epoch)", at_least(0))
    keep_checkpoints: int = setting("how many of this run's newest checkpoints to keep", at_least(1))
    output_dir: str = setting("folder for checkpoints, logs, metrics.csv and model.pt")
    resume: str = setting("auto (newest good checkpoint in output_dir), none, or a checkpoint path")
    overwrite: bool = setting("let a new run replace what another run left in output_dir")
    best_metric: str = setting("metrics.csv column that picks best.pt: val_loss or val_<the recipe's metric>")
    best_mode: str = setting("whether best_metric is best when lowest or highest", choices=("min", "max"))
    stop_on_nonfinite_loss: bool = setting("stop when the loss turns NaN or infinite, keeping the last good checkpoint")
    precision: str = setting("autocast precision; parameters stay fp32", choices=("no", "fp16", "bf16"))
    parallelism: str = setting(
        "one device per process, or the model split over 2", choices=("ddp", "ddp_model_parallel")
    )
    deterministic: bool = setting("deterministic algorithms only (slower)")
    progress: bool = setting("progress bar on rank 0 (only when stdout is a terminal)")
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

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def local_address(self) -> str:
        """The address of this machine that routes to master_addr: what it tells the other nodes to call.

        The operating system picks it for a UDP socket "connected" to master_addr, which sends nothing;
        a VPN, a WSL/Docker adapter or a hostname mapped to 127.0.1.1 cannot mislead it. OSError: no route.
        """
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((self.master_addr, self.master_port))
            return probe.getsockname()[0]

    @property
    def micro_batch(self) -> int:
        """Samples each rank puts through the model at once."""
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
            found.append("precision=fp16 needs device=cuda; use precision=bf16 on the CPU")
        if self.backend == "nccl" and self.device != "cuda":
            found.append("backend=nccl needs device=cuda; use backend=gloo on the CPU")
        if self.master_addr.lower() == "localhost":
            found.append('master_addr "localhost" can resolve to IPv6 or a Docker hosts entry; use 127.0.0.1')
        return found


SETTINGS = [f for f in dataclasses.fields(Config) if f.name != "environment"]
SETTING_NAMES = [f.name for f in SETTINGS]


_SECTIONS = ("train", "distributed")
_TOML_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,), "dict": (dict,)}


def read_settings_file(path: Path) -> dict:
    """A TOML file as a Windows editor may save it: UTF-8 with or without a byte-order mark, CRLF or LF."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"--config {path} is a folder; pass the settings file in it, such as {path / 'train.toml'}")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as error:
        raise ConfigError(f"config file {path} cannot be read ({error.strerror or error})") from None
    try:
        text = raw.decode("utf-8-sig")  # tomllib reads CRLF itself
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise ConfigError(
            f"{path} is not UTF-8: byte 0x{raw[error.start]:02x} at offset {error.start} (line {line}); "
            "save the file as UTF-8 (in Notepad: Save as, Encoding UTF-8)"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path} is not valid TOML: {error}") from None


def did_you_mean(name: str, known) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {close[0]}?" if close else ""


def load(path: Path) -> Config:
    """Read a TOML config; unknown keys are errors so typos never pass silently."""
    data = read_settings_file(path)
    known = {f.name: f for f in dataclasses.fields(Config)}
    values: dict = {"environment": data.pop("environment", {})}
    for section in _SECTIONS:
        for key, value in data.pop(section, {}).items():
            if key not in known or key == "environment":
                raise ConfigError(f"{path}: unknown setting [{section}] {key}{did_you_mean(key, SETTING_NAMES)}")
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


_FLAG_TYPES = {"int": int, "float": float, "str": str}


CONFIG_HELP_HINT = "(`{prog} --help` lists every setting)"


class Parser(argparse.ArgumentParser):
    """argparse, with an error as one line and a pointer to --help instead of the whole usage (30 lines here)."""

    def error(self, message: str):
        if message.startswith("unrecognized arguments: "):
            flags = [flag for action in self._actions for flag in action.option_strings]
            message += did_you_mean(message.split()[2].split("=")[0], flags)
        self.exit(2, f"error: {message}\n{CONFIG_HELP_HINT.format(prog=self.prog)}\n")


def build_parser(prog: str, current: Config | None = None) -> argparse.ArgumentParser:
    """A flag per setting, generated from Config; --help shows each one's meaning and its value in the file."""
    parser = Parser(
        prog=prog,
        description="Train with DistributedDataParallel. Run plainly, it starts its own ranks; "
        "under torchrun it joins as one rank. Every flag overrides the same setting in the config file.",
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="TOML settings file (default: %(default)s)")
    for setting_field in SETTINGS:
        meta = setting_field.metadata
        flags = ["--" + setting_field.name.replace("_", "-"), *meta["aliases"]]
        now = f" (config: {getattr(current, setting_field.name)!r})" if current else ""
        options: dict = {"dest": setting_field.name, "default": None, "help": meta["help"] + now}
        if setting_field.type == "bool":
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["type"] = _FLAG_TYPES[setting_field.type]
            options["metavar"] = setting_field.type.upper()
            if meta["choices"]:
                options["choices"] = meta["choices"]
                options["metavar"] = "{" + ",".join(meta["choices"]) + "}"
        parser.add_argument(*flags, **options)
    return parser


def from_command_line(argv: list[str] | None, prog: str) -> Config:
    """Config file, then flags; exits with status 2 and a one-line reason on bad input."""
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    try:
        config = load(first.parse_known_args(argv)[0].config)
    except ConfigError as error:
        build_parser(prog).error(str(error))
    parser = build_parser(prog, current=config)
    args = vars(parser.parse_args(argv))
    args.pop("config")
    config = dataclasses.replace(config, **{key: value for key, value in args.items() if value is not None})
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
    computed = {"local_address", "world_size", "micro_batch"}
    unknown = [name for name in names if name not in {f.name for f in dataclasses.fields(Config)} | computed]
    if unknown:
        parser.error(f"unknown setting(s): {', '.join(unknown)}")
    try:
        print(" ".join(str(getattr(config, name)) for name in names))
    except OSError as error:  # local_address, when nothing routes to master_addr
        parser.error(f"no route from this machine to master_addr {config.master_addr} ({error.strerror or error})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
