"""The recipe as the engine calls it: imported and checked once per rank, its optional hooks given defaults."""

from __future__ import annotations

import importlib
import inspect
import os
import traceback
from pathlib import Path

import torch

from . import PACKAGE
from .config import Config
from .loaders import map_tensors, samples_in, to_device
from .logs import shown_path
from .process_group import LaunchError

# What the engine calls, with the arguments it passes. A recipe defines training_step, or loss, metric and METRIC.
RECIPE_FUNCTIONS = {
    "datasets": ("config",),
    "model": ("config", "devices"),
    "optimizer": ("model", "config"),
    "schedule": ("optimizer", "config", "total_steps"),
    "loss": ("outputs", "targets"),
    "metric": ("outputs", "targets"),
    "training_step": ("model", "batch"),
    "validation_step": ("model", "batch"),
    "metrics": ("sums",),
    "test_dataset": ("config",),
    "check": ("config",),
}
REQUIRED = ("datasets", "model", "optimizer")


def where(error: BaseException) -> str:
    """file:line of the code that raised `error` (the innermost frame outside Python's import machinery)."""
    if isinstance(error, SyntaxError) and error.filename:
        code = f" ({error.text.strip()})" if error.text and error.text.strip() else ""
        return f"{error.filename}:{error.lineno}: {type(error).__name__}: {error.msg}{code}"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith("<frozen")]
    message = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    if not frames:
        return message
    code = f" ({frames[-1].line})" if frames[-1].line else ""
    return f"{frames[-1].filename}:{frames[-1].lineno}: {message}{code}"


def in_the_recipe(error: BaseException) -> str:
    """`src/pkg/recipe.py:47 in optimizer(): TypeError: ...`: the innermost frame of the user's code (not the
    engine's, torch's or Python's), then the exception."""
    libraries = (Path(__file__).parent, Path(torch.__file__).parents[1], Path(os.__file__).parent)
    frames = traceback.extract_tb(error.__traceback__)
    own = [frame for frame in frames if not any(Path(frame.filename).is_relative_to(lib) for lib in libraries)]
    message = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    if not (own or frames):
        return message
    frame = (own or frames)[-1]
    return f"{shown_path(frame.filename)}:{frame.lineno} in {frame.name}(): {message}"


def load_recipe(name: str):
    """Import the recipe and check what the engine will call, before any rank meets another or trains; LaunchError
    names the file and line of the code that failed to import, or of a function the engine cannot call so."""
    try:
        recipe = importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name and (name == error.name or name.startswith(error.name + ".")):
            raise LaunchError(
                f"recipe {name!r} not found (no module named {error.name!r}); set recipe in configs/train.toml "
                f"to an importable module, such as {PACKAGE}.recipe"
            ) from None
        raise LaunchError(f"recipe {name} cannot be imported: {where(error)}") from None
    except Exception as error:  # whatever the recipe's own code raised while it was imported
        raise LaunchError(f"recipe {name} cannot be imported: {where(error)}") from None
    source = getattr(recipe, "__file__", name)
    needed = [*REQUIRED, *(() if hasattr(recipe, "training_step") else ("loss", "metric"))]
    missing = [function for function in needed if not callable(getattr(recipe, function, None))]
    if not hasattr(recipe, "training_step") and not isinstance(getattr(recipe, "METRIC", None), str):
        missing.append("METRIC (the metric's name, a string)")
    if missing:
        raise LaunchError(
            f"recipe {name} ({source}) has no {', '.join(missing)}: define {'them' if len(missing) > 1 else 'it'} "
            f"as {PACKAGE}/recipe.py does (training_step(model, batch) can stand in for loss, metric and METRIC)"
        )
    for function, arguments in RECIPE_FUNCTIONS.items():
        defined = getattr(recipe, function, None)
        if not callable(defined):
            continue
        try:
            inspect.signature(defined).bind(*arguments)
        except TypeError as error:
            code = getattr(defined, "__code__", None)
            line = f"{code.co_filename}:{code.co_firstlineno}" if code else source
            raise LaunchError(
                f"{line}: the recipe's {function}{inspect.signature(defined)} cannot be called as "
                f"{function}({', '.join(arguments)}), which the engine does ({error})"
            ) from None
        except ValueError:
            continue  # no signature to check (a builtin)
    return recipe


def recipe_check(recipe, config: Config) -> str | None:
    """What the recipe's own check(config) finds wrong with the settings, if it defines one, before the ranks meet:
    `src/pkg/recipe.py: check(): lr is "fast" in [recipe]; use a number`."""
    check = getattr(recipe, "check", None)
    if not callable(check):
        return None
    try:
        found = check(config)
    except Exception as error:  # the check itself failed: where, in one line
        return in_the_recipe(error)
    return f"{shown_path(recipe.__file__)}: check(): {found}" if found else None


def lr_schedule(recipe, optimizer: torch.optim.Optimizer, config: Config, total_steps: int):
    """The recipe's schedule(), or a constant learning rate."""
    if hasattr(recipe, "schedule"):
        return recipe.schedule(optimizer, config, total_steps)
    return torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)


def pair_step(recipe, devices: tuple[torch.device, ...], model, batch) -> tuple[torch.Tensor, dict, dict, int]:
    """A recipe without training_step: (inputs, targets) batches, `loss` and `metric`."""
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        raise TypeError(
            f"the recipe has no training_step, so each batch must be an (inputs, targets) pair, got a "
            f"{type(batch).__name__}{f' of {len(batch)}' if isinstance(batch, (tuple, list)) else ''}; define "
            "training_step(model, batch) in the recipe to take batches of any structure "
            "(docs/make-it-your-own.md)"
        )
    inputs, targets = batch
    targets = to_device(targets, devices[-1])
    outputs = model(to_device(inputs, devices[0]))
    loss = recipe.loss(outputs, targets)
    detached = outputs.detach() if isinstance(outputs, torch.Tensor) else map_tensors(outputs, torch.detach)
    return loss, {}, {recipe.METRIC: recipe.metric(detached, targets)}, samples_in(targets)


def custom_step(recipe, devices: tuple[torch.device, ...], model, batch) -> tuple[torch.Tensor, dict, dict, int]:
    """The recipe's training_step: the batch's mean loss, or (loss, {name: value to log})."""
    result = recipe.training_step(model, on_devices(batch, devices))
    loss, logged = result if isinstance(result, tuple) else (result, {})
    logged = {name: value.detach() if isinstance(value, torch.Tensor) else value for name, value in logged.items()}
    return loss, logged, {}, samples_in(batch)


def on_devices(batch, devices: tuple[torch.device, ...]):
    """The batch on this rank's device; an (inputs, targets) pair of the split model: targets on its last."""
    if len(devices) > 1 and isinstance(batch, (tuple, list)) and len(batch) == 2:
        return type(batch)((to_device(batch[0], devices[0]), to_device(batch[1], devices[-1])))
    return to_device(batch, devices[0])
