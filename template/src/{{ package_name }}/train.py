"""Train the recipe (recipe.py) with DistributedDataParallel.

    python -m <package>.train --nproc-per-node 2 --epochs 5

What happens, in order: the settings are read (configs/train.toml, then the flags; `--help` lists them);
this machine takes its hold on the output folder, so no other run writes there; then either this process
starts nproc_per_node ranks and watches them (spawn, as on Windows), or it is one rank already, started by
torchrun or srun. Each rank checks the run, joins the process group, builds what the recipe describes and
fits it (engine/rank.py, engine/trainer.py). This process never imports torch: only the ranks do.
"""

from __future__ import annotations

import sys

from .engine.config import from_command_line
from .engine.launch import TRAIN_COMMAND, join_as_rank, resume_command, spawn
from .engine.logs import wrapped
from .engine.ownership import InUse, holding_the_output_dir, private_temporary_folder
from .engine.process_group import LaunchError, under_torchrun
from .engine.stopping import INTERRUPTED, TERMINATED


def main(argv: list[str] | None = None) -> int:
    config = from_command_line(argv, TRAIN_COMMAND)
    try:
        with holding_the_output_dir(config), private_temporary_folder():
            if under_torchrun():
                return join_as_rank(config)
            status = spawn(config)
    except (LaunchError, InUse) as error:
        print(wrapped(f"error: {error}"), file=sys.stderr)
        return 1
    if status in (INTERRUPTED, TERMINATED):
        print(wrapped(f"to continue from the newest checkpoint: {resume_command(argv)}"), file=sys.stderr, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
