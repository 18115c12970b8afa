"""Train a recipe (recipe.py) with DistributedDataParallel.

    python -m <package>.train --nproc-per-node 2 --epochs 5

Run plainly, this starts its own ranks with multiprocessing (spawn, on every OS,
as on native Windows, where it is the only way) and never imports torch itself:
only the ranks do (rank.py). Under torchrun the process joins as
the rank torchrun gave it. Every setting comes from
configs/train.toml and can be overridden by a flag; `--help` lists them.
The recipe builds the model, data, optimizer, schedule, loss and metric;
trainer.py owns the loop, checkpoints, validation and the run's records.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

from .config import from_command_line
from .distributed import (
    INTERRUPTED,
    TERMINATED,
    LaunchError,
    rank_program,
    spawn,
    torchrun_layout,
    torchrun_rank,
    under_torchrun,
)
from .logs import wrapped
from .ownership import InUse, hold_output_dir, private_temporary_folder

PROG = f"python -m {__package__}.train"


# scripts/train.* name themselves here (as the user typed them) and pass --config first.
LAUNCHER_VARIABLE = "DDP_LAUNCHER"


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
    return f"{launcher} {line(rest)}" if launcher else line([*PROG.split(), *rest])


def holding_the_output_dir(config):
    """This machine's hold on output_dir, taken by the process that owns the run here (ownership.py).

    The spawn path's launcher holds it for its ranks; under torchrun or srun each rank is started by
    another program, so local rank 0 holds it. Other ranks hold nothing.
    """
    if not under_torchrun():
        return hold_output_dir(Path(config.output_dir), config.node_rank)
    if int(os.environ.get("LOCAL_RANK", "0")) != 0:
        return contextlib.nullcontext()
    node = int(os.environ["RANK"]) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return hold_output_dir(Path(config.output_dir), node)


def main(argv: list[str] | None = None) -> int:
    config = from_command_line(argv, PROG)
    try:
        with holding_the_output_dir(config), private_temporary_folder():
            if under_torchrun():  # torchrun, or one Slurm task per rank: this process is one rank
                return rank_program()(torchrun_layout(config), torchrun_rank())
            status = spawn(config)
        if status in (INTERRUPTED, TERMINATED):
            print(
                wrapped(f"to continue from the newest checkpoint: {resume_command(argv)}"), file=sys.stderr, flush=True
            )
        return status
    except (LaunchError, InUse) as error:
        print(wrapped(f"error: {error}"), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
