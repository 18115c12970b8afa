"""Train the recipe (recipe.py) with DistributedDataParallel.

    python -m <package>.train --nproc-per-node 2 --epochs 5

What happens, in order: the settings are read (configs/train.toml, then the flags; `--help` lists them);
this machine takes its hold on the output folder, so no other run writes there; then either this process
starts nproc_per_node ranks and watches them (spawn, as on Windows), or it is one rank already, started by
torchrun or srun. Each rank checks the run, joins the process group, builds what the recipe describes and
fits it (engine/rank.py, engine/trainer.py). This process never imports torch: only the ranks do.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if not __package__:  # started as a file (python src/<package>/train.py, an editor's Run button): as the module, with
    here = Path(__file__).resolve().parent  # the package importable and its folder's files not shadowing others
    sys.path[:] = [str(here.parent), *(entry for entry in sys.path if Path(entry or ".").resolve() != here)]
    __package__ = here.name

from .engine.command_line import TRAIN_COMMAND, from_command_line, resume_command
from .engine.launch import join_as_rank, spawn
from .engine.logs import escape_what_stdout_cannot_encode, wrapped
from .engine.ownership import InUse, holding_the_output_dir, private_temporary_folder
from .engine.process_group import LaunchError
from .engine.processes import torchrun_rank, under_torchrun
from .engine.stopping import (
    INTERRUPTED,
    SETTINGS_REFUSED,
    STATUS_FILE_VARIABLE,
    TERMINATED,
    WHEN_INTERRUPTED,
    SettingsRefused,
)


def main(argv: list[str] | None = None) -> int:
    escape_what_stdout_cannot_encode()  # --print-config names the settings files, whose folders may be Chinese
    config = from_command_line(argv, TRAIN_COMMAND)
    try:
        with holding_the_output_dir(config), private_temporary_folder():
            if under_torchrun():
                return as_one_rank(config, argv)
            status = spawn(config)
    except (LaunchError, InUse) as error:
        print(wrapped(f"error: {error}"), file=sys.stderr)
        return 1
    if status in (INTERRUPTED, TERMINATED):
        print_how_to_continue(argv)
    return status


def as_one_rank(config, argv: list[str] | None) -> int:
    """One rank, started by torchrun or srun. Under torchrun, Ctrl+C comes from scripts/train.sh, which exits 130
    itself: a rank that saved and stopped on it ends with 0, since torchrun takes any other status for a failure
    (it would restart the ranks, or print its failure report). Rank 0 says how to continue, as spawn's launcher does.
    Refused settings are said once a machine, and end every rank alike: with 0 and SETTINGS_REFUSED in the file
    scripts/train.sh exits with, where it gave one."""
    rank = torchrun_rank()
    try:
        status = join_as_rank(config)
    except SettingsRefused as refused:
        status_file = os.environ.get(STATUS_FILE_VARIABLE) if refused.every_rank else None
        if rank.local_rank == 0:
            print(wrapped(f"error: {refused}"), file=sys.stderr, flush=True)
            if status_file:
                Path(status_file).write_text(str(SETTINGS_REFUSED), encoding="utf-8")
        return 0 if status_file else SETTINGS_REFUSED
    if status != INTERRUPTED or rank.started_by != "torchrun":
        return status
    if rank.rank == 0:
        print(WHEN_INTERRUPTED, file=sys.stderr, flush=True)
        print_how_to_continue(argv)
    return 0


def print_how_to_continue(argv: list[str] | None) -> None:
    print(wrapped(f"to continue from the newest checkpoint: {resume_command(argv)}"), file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
