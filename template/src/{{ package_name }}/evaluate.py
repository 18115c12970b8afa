"""Score a trained model: python -m <package>.evaluate --checkpoint PATH [--split val|test] [--nproc-per-node N]

PATH is best.pt, model.pt or a step checkpoint. The recipe's validation (validation_step and metrics,
or loss and metric) runs over the whole split, shared among the ranks, with every sample counted once;
the sums are added over all ranks, so 1 rank and 2 ranks give the same numbers. --split test takes the
recipe's test_dataset(config). The metrics are printed and written as JSON beside the checkpoint
(best.pt -> best.val.json).

The settings are the run's own, from the run.json beside the checkpoint (or, for a checkpoint on its
own, those it carries); any training flag overrides one. The ranks start as training's do: spawned here, or
joined under torchrun.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from pathlib import Path

if not __package__:  # started as a file (python src/<package>/evaluate.py, an editor's Run button): as the module, with
    here = Path(__file__).resolve().parent  # the package importable and its folder's files not shadowing others
    sys.path[:] = [str(here.parent), *(entry for entry in sys.path if Path(entry or ".").resolve() != here)]
    __package__ = here.name

from .engine.command_line import build_parser, usage, with_flags
from .engine.config import DEFAULT_CONFIG, Config, ConfigError
from .engine.config_file import load
from .engine.launch import evaluation, join_as_rank, spawn
from .engine.logs import escape_what_stdout_cannot_encode
from .engine.ownership import private_temporary_folder
from .engine.process_group import LaunchError
from .engine.processes import torchrun_rank, under_torchrun
from .engine.records import RUN_RECORD

PROG = f"python -m {__package__}.evaluate"
SETTING_NAMES = {field.name for field in dataclasses.fields(Config)}


def run_folder(checkpoint: Path) -> Path:
    """The output folder a checkpoint belongs to: its own folder, or the one above checkpoints/."""
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent


def trained_settings(checkpoint: Path) -> dict:
    """The settings a checkpoint was trained with: the run.json beside it, or, for a file on its own (a best.pt
    handed over), the copy that every checkpoint carries."""
    record = run_folder(checkpoint) / RUN_RECORD
    if record.is_file():
        return json.loads(record.read_text(encoding="utf-8")).get("config", {})
    import torch  # only for a file on its own: where run.json answers, this process stays without torch

    try:
        carried = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True).get("config", {})
    except Exception:  # noqa: BLE001 - not a checkpoint, or damaged: the ranks load it and say which
        return {}
    return {**carried, "output_dir": str(run_folder(checkpoint))}  # the run's own folder is elsewhere


def run_settings(checkpoint: Path, config_file: Path) -> Config:
    """The settings the checkpoint was trained with, on top of config_file for any it lacks."""
    trained = trained_settings(checkpoint)
    base = load(config_file)
    return dataclasses.replace(base, **{name: value for name, value in trained.items() if name in SETTING_NAMES})


def result_path(checkpoint: Path, split: str) -> Path:
    return checkpoint.with_name(f"{checkpoint.stem}.{split}.json")


def from_command_line(argv: list[str] | None) -> tuple[Config, Path, str]:
    """(settings, checkpoint, split); exits with status 2 and a one-line reason on bad input."""
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--checkpoint", type=Path)
    first.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    known, _ = first.parse_known_args(argv)
    parser = build_parser(PROG)
    try:
        config = run_settings(known.checkpoint, known.config) if known.checkpoint else load(known.config)
    except (ConfigError, ValueError, TypeError) as error:
        parser.error(str(error))
    parser = build_parser(PROG, current=config)
    parser.description = __doc__.splitlines()[0] + ". Every training flag overrides the run's setting."
    parser.usage = usage(
        PROG, "[-h]", "--checkpoint CHECKPOINT", "[--split {val,test}]", "[--config CONFIG]", "[--SETTING VALUE ...]"
    )
    parser.add_argument("--checkpoint", type=Path, required=True, help="best.pt, model.pt or a step checkpoint")
    parser.add_argument("--split", choices=("val", "test"), default="val", help="which data set (default: val)")
    args = vars(parser.parse_args(argv))
    checkpoint, split = args.pop("checkpoint"), args.pop("split")
    if not checkpoint.exists():  # a file, or under fsdp a step checkpoint's folder
        parser.error(f"checkpoint not found: {checkpoint}")
    config = with_flags(config, args, parser)
    return dataclasses.replace(config, max_restarts=0), checkpoint, split  # a failed evaluation is simply rerun


def main(argv: list[str] | None = None) -> int:
    escape_what_stdout_cannot_encode()
    config, checkpoint, split = from_command_line(argv)
    target = result_path(checkpoint, split)
    each_rank = functools.partial(evaluation, checkpoint=str(checkpoint), split=split, result_path=str(target))
    try:
        with private_temporary_folder():
            if under_torchrun():
                status = join_as_rank(config, each_rank)
                if torchrun_rank().rank != 0:
                    return status
            else:
                status = spawn(config, each_rank)
    except LaunchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if status != 0:
        return status
    result = json.loads(target.read_text(encoding="utf-8"))
    print(f"{checkpoint} on {result['samples']} {split} samples ({result['world_size']} rank(s)):")
    for name, value in result["metrics"].items():
        print(f"  {name} {value:.6g}")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
