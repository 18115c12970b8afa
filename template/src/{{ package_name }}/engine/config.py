"""Run settings: configs/train.toml, overridden by command-line flags.

The TOML file holds the defaults rendered from the project's copier answers;
every field can be overridden on the command line. The launch scripts pass only
`--config` and the user's own arguments, so an edit to the file always counts.

[train] and [distributed] are the engine's settings, declared in Config below. [recipe] is the
recipe's own table: any names and TOML values, handed over as `config.settings`, each overridable
with `--set NAME=VALUE` or its own flag (`--block-size 64`), and listed by `--help`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import difflib
import json
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import PACKAGE, PROJECT_ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.9/3.10 only
    import tomli as tomllib

from . import scalars

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
    # [recipe]: the recipe's own settings (block_size = 64, ...), as TOML gave them; recorded in run.json
    # and every checkpoint with the rest of the config.
    settings: dict = field(default_factory=dict)

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
    if not flags:  # another architecture's /proc/cpuinfo, without x86 flags
        return None
    return any(flag in flags for flag in NATIVE_BF16_FLAGS)


def precision_warning(config: Config) -> str | None:
    """The one line a run on the CPU in bf16 gets where the CPU emulates it."""
    emulated = config.device == "cpu" and config.precision == "bf16" and native_bf16() is False
    return EMULATED_BF16 if emulated else None


SETTINGS = [f for f in dataclasses.fields(Config) if f.name not in ("environment", "settings")]
SETTING_NAMES = [f.name for f in SETTINGS]
# Names a [recipe] setting cannot take: the engine's settings, Config's own attributes, the flags' names.
_TAKEN = {f.name for f in dataclasses.fields(Config)} | {name for name in dir(Config) if not name.startswith("_")}
_TAKEN |= {alias[2:].replace("-", "_") for f in SETTINGS for alias in f.metadata["aliases"]} | {"config", "set", "help"}


_SECTIONS = ("train", "distributed", "recipe")
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
    """The settings of `path`, in layers: configs/train.toml, then `path` over it; unknown keys are errors so
    typos never pass silently."""
    return Config(**layered(path)[0])


def layered(path: Path) -> tuple[dict, dict[str, str]]:
    """(Config's values, {setting: the file it came from}) of configs/train.toml, then `path` over it when it is
    another file: a file of yours names only what differs. Its [recipe] table adds to configs/train.toml's when
    both name the same recipe, and replaces it when `path` names another recipe (whose settings are its own).
    """
    layers = [DEFAULT_CONFIG] if DEFAULT_CONFIG.is_file() and not same_file(DEFAULT_CONFIG, path) else []
    values: dict = {"environment": {}, "settings": {}}
    sources: dict[str, str] = {}
    for layer in [*layers, Path(path)]:
        found = read_layer(layer)
        if "recipe" in found and found["recipe"] != values.get("recipe"):
            values["settings"] = {}
            sources = {name: source for name, source in sources.items() if not name.startswith("[recipe] ")}
        values["environment"] = {**values["environment"], **found.pop("environment")}
        values["settings"] = {**values["settings"], **found["settings"]}
        sources.update({f"[recipe] {name}": str(layer) for name in found.pop("settings")})
        values.update(found)
        sources.update({name: str(layer) for name in found})
    known = {f.name for f in dataclasses.fields(Config)}
    missing = [name for name in known if name not in values]
    if missing:
        raise ConfigError(
            f"{path}: missing setting(s) {', '.join(missing)}, in it and in {DEFAULT_CONFIG}; copy them from the "
            "template's train.toml"
        )
    return values, sources


def same_file(first: Path, second: Path) -> bool:
    try:
        return Path(first).samefile(second)
    except OSError:  # `second` is not there: read_layer says so
        return False


def read_layer(path: Path) -> dict:
    """One settings file's values, each of the type its setting takes: [train] and [distributed] by name, with
    "environment" and "settings" ([recipe]) as tables."""
    data = read_settings_file(path)
    known = {f.name: f for f in dataclasses.fields(Config)}
    values: dict = {"environment": data.pop("environment", {}), "settings": recipe_table(path, data)}
    for section in _SECTIONS[:2]:
        for key, value in data.pop(section, {}).items():
            if key not in known or key in ("environment", "settings"):
                raise ConfigError(f"{path}: unknown setting [{section}] {key}{did_you_mean(key, SETTING_NAMES)}")
            values[key] = value
    if data:
        expected = ", ".join((*_SECTIONS, "environment"))
        raise ConfigError(f"{path}: unknown section(s) {', '.join(sorted(data))}; expected {expected}")
    for name, value in values.items():
        expected = _TOML_TYPES.get(known[name].type)
        if expected and (not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected)):
            raise ConfigError(f"{path}: {name} must be {known[name].type}, got {value!r}")
    return values


def recipe_table(path: Path, data: dict) -> dict:
    """[recipe], taken out of the parsed file."""
    settings = data.pop("recipe", {})
    if not isinstance(settings, dict):
        raise ConfigError(f"{path}: recipe must be a table ([recipe]), got {settings!r}")
    for name, value in settings.items():
        if not name.isidentifier() or name in _TAKEN:
            why = "is the name of an engine setting or flag" if name in _TAKEN else "is not a Python name"
            raise ConfigError(f"{path}: [recipe] {name} {why}; rename it")
        if isinstance(value, (datetime.date, datetime.time)):  # checkpoints load with weights_only=True
            raise ConfigError(f"{path}: [recipe] {name} is a date or time; write it as a string")
    return settings


_KINDS = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array", dict: "a table"}


def _kind(value) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def override(settings: dict, assignment: str, typed: str = "") -> dict:
    """settings with `NAME=VALUE` applied (--set, or a [recipe] setting's own flag); ConfigError says why not.

    VALUE is TOML and must have the kind the setting has in the file (an integer may stand for a float).
    A string setting also takes a bare word (--set optimizer=adamw), which shells make hard to quote.
    A name the file lacks adds a setting of VALUE's kind, unless it looks like a typo of one the file has.
    `typed` is what the command line said, for the message (--lr abc), when it was not --set.
    """
    name, equals, text = assignment.partition("=")
    name, typed = name.strip(), typed or f"--set {assignment}"
    if not equals or not name:
        raise ConfigError(f"--set takes NAME=VALUE, got {assignment!r}")
    try:
        parsed = tomllib.loads(f"value = {text}")
        value = parsed["value"] if parsed.keys() == {"value"} else None
    except tomllib.TOMLDecodeError:
        value = None
    if name not in settings:
        close = difflib.get_close_matches(name, list(settings), n=1, cutoff=0.75)
        if close:
            raise ConfigError(
                f"--set {name}: no such setting in [recipe] of the config file; did you mean {close[0]}? "
                "(a new setting needs a name unlike those there)"
            )
        return {**settings, name: text if value is None else value}  # a bare word is a string, as above
    current = settings[name]
    if isinstance(current, str):
        value = value if isinstance(value, str) else text
    elif type(current) is float and type(value) is int:
        value = float(value)
    if value is None or type(value) is not type(current):
        got = "not a TOML value" if value is None else _kind(value)
        wanted = f"{name} is {_kind(current)} ({current!r}) in [recipe]"
        raise ConfigError(f"{typed}: {text!r} is {got}; {wanted}")
    return {**settings, name: value}


class _Override(argparse.Action):
    """--set NAME=VALUE and each [recipe] setting's own flag, collected in command-line order: the last one wins."""

    def __call__(self, parser, namespace, values, option_string=None):
        typed = ""
        if self.const:  # a setting's own flag: --block-size 64, or --augment / --no-augment
            typed = f"{option_string} {values}" if self.nargs != 0 else option_string
            values = f"{self.const}={values if self.nargs != 0 else str(not option_string.startswith('--no-')).lower()}"
        namespace.set = [*(namespace.set or []), (values, typed)]


_FLAG_TYPES = {"int": int, "float": float, "str": str}


CONFIG_HELP_HINT = "(`{prog} --help` lists every setting)"


class Parser(argparse.ArgumentParser):
    """argparse, with an error as one line (broken to the console's width, logs.wrapped) and a pointer to
    --help instead of the whole usage (30 lines here)."""

    def error(self, message: str):
        from .logs import wrapped

        if message.startswith("unrecognized arguments: "):
            flags = [flag for action in self._actions for flag in action.option_strings]
            message += did_you_mean(message.split()[2].split("=")[0], flags)
        self.exit(2, f"{wrapped(f'error: {message}')}\n{CONFIG_HELP_HINT.format(prog=self.prog)}\n")


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
    recipe = parser.add_argument_group(
        "recipe settings", "[recipe] in the config file; each flag is short for --set NAME=VALUE (VALUE in TOML)"
    )
    recipe.add_argument("--set", action=_Override, metavar="NAME=VALUE", help="override one of them (repeatable)")
    for name, value in (current.settings if current else {}).items():
        flag, shown = "--" + name.replace("_", "-"), f"{_kind(value)} (config: {value!r})"
        if isinstance(value, bool):
            recipe.add_argument(flag, "--no-" + flag[2:], action=_Override, const=name, dest="set", nargs=0, help=shown)
        else:
            metavar = _kind(value).split()[-1].upper()
            recipe.add_argument(flag, action=_Override, const=name, dest="set", metavar=metavar, help=shown)
    return parser


def from_command_line(argv: list[str] | None, prog: str) -> Config:
    """configs/train.toml, then the --config file, then flags; exits with status 2 and a one-line reason on bad
    input, and with 0 after --print-config has shown the result."""
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    first.add_argument("--set", action="append", default=[])
    try:
        known = first.parse_known_args(argv)[0]
        values, sources = layered(known.config)
        # A setting that only --set names is listed by --help and has its own flag, as the files' settings have.
        for assignment in known.set:
            if assignment.partition("=")[0].strip() not in values["settings"]:
                values["settings"] = override(values["settings"], assignment)
    except ConfigError as error:
        build_parser(prog).error(str(error))
    config = Config(**values)
    parser = build_parser(prog, current=config)
    parser.add_argument(
        "--print-config", action="store_true", help="print the settings as merged, each with where it came from; exit"
    )
    args = vars(parser.parse_args(argv))
    shown = args.pop("print_config")
    for name, value in args.items():
        if name in SETTING_NAMES and value is not None:
            sources[name] = "--" + name.replace("_", "-")
    for assignment, typed in args.get("set") or []:
        sources[f"[recipe] {assignment.partition('=')[0].strip()}"] = typed.split(" ")[0] if typed else "--set"
    config = with_flags(config, args, parser)
    if shown:
        print(merged_settings(config, sources))
        parser.exit(0)
    return config


def merged_settings(config: Config, sources: dict[str, str]) -> str:
    """The settings as TOML, each with where it came from: --print-config."""
    from .logs import shown_path

    distributed = SETTING_NAMES.index("backend")  # Config declares [train]'s settings, then [distributed]'s
    tables = {
        "train": {name: getattr(config, name) for name in SETTING_NAMES[:distributed]},
        "distributed": {name: getattr(config, name) for name in SETTING_NAMES[distributed:]},
        "recipe": config.settings,
    }
    lines = []
    for table, values in tables.items():
        lines += ["" if lines else None, f"[{table}]"]
        for name, value in values.items():
            source = sources.get(f"[recipe] {name}" if table == "recipe" else name, "")
            where = source if source.startswith("-") else shown_path(source)  # a flag, or a file
            lines.append(f"{f'{name} = {json.dumps(value)}':<40}  # {where}")
    return "\n".join(line for line in lines if line is not None)


def with_flags(config: Config, args: dict, parser: argparse.ArgumentParser) -> Config:
    """`config` with the flags build_parser parsed (`--set` included); exits with status 2 on bad input."""
    args.pop("config", None)
    settings = config.settings
    try:
        for assignment, typed in args.pop("set") or []:
            settings = override(settings, assignment, typed)
    except ConfigError as error:
        parser.error(str(error))
    config = dataclasses.replace(
        config, settings=settings, **{key: value for key, value in args.items() if value is not None}
    )
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
    config = from_command_line(train_args, f"python -m {PACKAGE}.train")
    names = args.get.split(",")
    computed = {"local_address", "world_size", "micro_batch"}
    known = {f.name for f in dataclasses.fields(Config)} | computed | config.settings.keys()
    unknown = [name for name in names if name not in known]
    if unknown:
        parser.error(f"unknown setting(s): {', '.join(unknown)}")
    try:
        print(" ".join(str(getattr(config, name)) for name in names))
    except OSError as error:  # local_address, when nothing routes to master_addr
        parser.error(f"no route from this machine to master_addr {config.master_addr} ({error.strerror or error})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
