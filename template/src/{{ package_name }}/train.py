"""Train a recipe (recipe.py) with DistributedDataParallel.

    python -m <package>.train --nproc-per-node 2 --epochs 5

Run plainly, this starts its own ranks with multiprocessing (spawn, the only
way that works on native Windows; a fork server that has imported torch once
where Python has one) and never imports torch itself: only the ranks do
(rank.py). Under torchrun the process joins as
the rank torchrun gave it. Every setting comes from
configs/train.toml and can be overridden by a flag; `--help` lists them.
The recipe builds the model, data, optimizer, schedule, loss and metric;
trainer.py owns the loop, checkpoints, validation and the run's records.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from .config import from_command_line
from .distributed import (
    INTERRUPTED,
    LaunchError,
    exit_now,
    rank_program,
    spawn,
    torchrun_layout,
    torchrun_rank,
    under_torchrun,
)
from .logs import wrapped

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


def main(argv: list[str] | None = None) -> int:
    config = from_command_line(argv, PROG)
    try:
        if under_torchrun():  # torchrun, or one Slurm task per rank: this process is one rank
            return rank_program()(torchrun_layout(config), torchrun_rank())
        status = spawn(config)
        if status == INTERRUPTED:
            print(
                wrapped(f"to continue from the newest checkpoint: {resume_command(argv)}"), file=sys.stderr, flush=True
            )
        return status
    except LaunchError as error:
        print(wrapped(f"error: {error}"), file=sys.stderr)
        return 1


if __name__ == "__main__":
    exit_now(main())
