"""The command line over the settings files: a flag per setting, --set, --help, --print-config and --get."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from . import PACKAGE
from .config import DEFAULT_CONFIG, SETTING_NAMES, SETTINGS, Config, ConfigError
from .config_file import did_you_mean, layered, toml_value
from .logs import shown_path, wrapped

TRAIN_COMMAND = f"python -m {PACKAGE}.train"
# scripts/train.* name themselves here (as the user typed them) and pass --config first.
LAUNCHER_VARIABLE = "DDP_LAUNCHER"
CONFIG_HELP_HINT = "(`{prog} --help` lists every setting)"
_KINDS = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array", dict: "a table"}
_FLAG_TYPES = {"int": int, "float": float, "str": str}


def _kind(value) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def override(settings: dict, assignment: str, typed: str = "") -> dict:
    """settings with `NAME=VALUE` (TOML, of the setting's kind) applied; ConfigError says why not. A string also
    takes a bare word (--set optimizer=adamw), which shells make hard to quote; `typed`: the flag, for the message."""
    name, equals, text = assignment.partition("=")
    name, typed = name.strip(), typed or f"--set {assignment}"
    if not equals or not name:
        raise ConfigError(f"--set takes NAME=VALUE, got {assignment!r}")
    value = toml_value(text)
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


class Parser(argparse.ArgumentParser):
    """argparse, with an error as one line and a pointer to --help instead of the whole usage (30 lines here)."""

    def error(self, message: str):
        if message.startswith("unrecognized arguments: "):
            flags = [flag for action in self._actions for flag in action.option_strings]
            message += did_you_mean(message.split()[2].split("=")[0], flags)
        self.exit(2, f"{wrapped(f'error: {message}')}\n{wrapped(CONFIG_HELP_HINT.format(prog=self.prog))}\n")


def usage(prog: str, *parts: str) -> str:
    """The command's shape for --help, wrapped as argparse wraps but never inside a part. argparse's own usage
    lists every flag again, above their list, and `[--stop-on-nonfinite-loss | --no-stop-on-nonfinite-loss]`
    alone overflows an 80-column console."""
    width = shutil.get_terminal_size().columns - 2  # argparse's width
    lines = [f"usage: {prog}"]
    indent = " " * len(lines[0])
    for part in parts:
        if len(lines[-1]) + 1 + len(part) > width and lines[-1] != indent:
            lines.append(indent)
        lines[-1] += " " + part
    return "\n".join(lines).removeprefix("usage: ")


def build_parser(prog: str, current: Config | None = None) -> argparse.ArgumentParser:
    """A flag per setting, generated from Config; --help shows each one's meaning and its value in the file."""
    parser = Parser(
        prog=prog,
        usage=usage(prog, "[-h]", "[--config CONFIG]", "[--SETTING VALUE ...]"),
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
            metavar = "{" + ",".join(meta["choices"]) + "}" if meta["choices"] else setting_field.type.upper()
            options.update(type=_FLAG_TYPES[setting_field.type], choices=meta["choices"] or None, metavar=metavar)
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
    """configs/train.toml, then the --config file, then flags; bad input exits with 2 and one line."""
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
    distributed = SETTING_NAMES.index("backend")  # Config declares [train]'s settings, then [distributed]'s
    tables = {
        "train": {name: getattr(config, name) for name in SETTING_NAMES[:distributed]},
        "distributed": {name: getattr(config, name) for name in SETTING_NAMES[distributed:]},
        "recipe": config.settings,
    }
    lines = []
    for table, values in tables.items():
        lines += [f"\n[{table}]" if lines else f"[{table}]"]
        for name, value in values.items():
            source = sources.get(f"[recipe] {name}" if table == "recipe" else name, "")
            where = source if source.startswith("-") else shown_path(source)  # a flag, or a file
            lines.append(f"{f'{name} = {json.dumps(value)}':<40}  # {where}")
    return "\n".join(lines)


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


def resume_command(argv: list[str] | None) -> str:
    """The command that was run, with --resume auto instead of any --resume it had: the launcher script and
    the user's own arguments when a launcher started this, else this module with every argument."""
    args, kept = list(sys.argv[1:] if argv is None else argv), []
    launcher = os.environ.get(LAUNCHER_VARIABLE)
    if launcher and args[:1] == ["--config"]:
        args = args[2:]  # the launcher's own --config, which it passes again
    while args:
        arg = args.pop(0)
        if arg == "--resume" and args:
            args.pop(0)
        elif not arg.startswith("--resume="):
            kept.append(arg)
    rest = [*kept, "--resume", "auto"]
    line = subprocess.list2cmdline if sys.platform == "win32" else shlex.join
    return f"{launcher} {line(rest)}" if launcher else line([*TRAIN_COMMAND.split(), *rest])


def main(argv: list[str] | None = None) -> int:
    """Print settings as training would see them (scripts/train.sh asks for torchrun's layout before it starts)."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {__package__}.command_line", description=main.__doc__.splitlines()[0]
    )
    parser.add_argument("--get", required=True, help="comma-separated setting names, e.g. nproc_per_node,master_port")
    args, train_args = parser.parse_known_args(argv)
    config = from_command_line(train_args, TRAIN_COMMAND)
    names = args.get.split(",")
    computed = {"local_address", "world_size", "micro_batch"}
    unknown = [name for name in names if name not in {*SETTING_NAMES, *computed, *config.settings}]
    if unknown:
        parser.error(f"unknown setting(s): {', '.join(unknown)}")
    try:
        print(
            " ".join(str(config.settings[name] if name in config.settings else getattr(config, name)) for name in names)
        )
    except OSError as error:  # local_address, when nothing routes to master_addr
        parser.error(f"no route from this machine to master_addr {config.master_addr} ({error.strerror or error})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
