"""Reading the settings files: configs/train.toml with a file of yours over it, every key known and typed."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import difflib
import sys
from pathlib import Path

from .config import DEFAULT_CONFIG, SETTING_NAMES, SETTINGS, Config, ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.9/3.10 only
    import tomli as tomllib

_SECTIONS = ("train", "distributed", "recipe")
_TOML_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,), "dict": (dict,)}
# Names a [recipe] setting cannot take: the engine's settings, Config's own attributes, the flags' names.
_TAKEN = {f.name for f in dataclasses.fields(Config)} | {name for name in dir(Config) if not name.startswith("_")}
_TAKEN |= {alias[2:].replace("-", "_") for f in SETTINGS for alias in f.metadata["aliases"]} | {"config", "set", "help"}


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


def toml_value(text: str):
    """`text` read as a TOML value (as in `name = text`); None when it is not one."""
    try:
        parsed = tomllib.loads(f"value = {text}")
    except tomllib.TOMLDecodeError:
        return None
    return parsed["value"] if parsed.keys() == {"value"} else None


def did_you_mean(name: str, known) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {close[0]}?" if close else ""


def load(path: Path) -> Config:  # configs/train.toml with `path` over it
    return Config(**layered(path)[0])


def layered(path: Path) -> tuple[dict, dict[str, str]]:
    """(Config's values, {setting: the file it came from}) of configs/train.toml, then `path` over it: a file of
    yours names only what differs. Its [recipe] adds to train.toml's, or replaces it when it names another recipe.
    """
    same = False
    with contextlib.suppress(OSError):  # `path` is not there: read_layer says so
        same = DEFAULT_CONFIG.samefile(path)
    layers = [DEFAULT_CONFIG] if DEFAULT_CONFIG.is_file() and not same else []
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
    missing = [f.name for f in dataclasses.fields(Config) if f.name not in values]
    if missing:
        raise ConfigError(
            f"{path}: missing setting(s) {', '.join(missing)}, in it and in {DEFAULT_CONFIG}; copy them from the "
            "template's train.toml"
        )
    return values, sources


def read_layer(path: Path) -> dict:
    """One settings file's values, each of its setting's type; "environment" and "settings" ([recipe]) as tables."""
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
