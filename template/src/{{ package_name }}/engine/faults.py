"""Fault injection for tests and drills, read once at start, never in the training loop.

DDP_CRASH_RANK1_AT_STEP=S makes rank 1 die before step S, on the first start only, so a restarted
job can get past it; DDP_CRASH_RANK1_STARTS=K crashes the first K starts instead (to use up the
restarts).
"""

from __future__ import annotations

import os
import sys

from .process_group import restart_count

CRASH_VARIABLE = "DDP_CRASH_RANK1_AT_STEP"
CRASH_STARTS_VARIABLE = "DDP_CRASH_RANK1_STARTS"


def crash_step(rank: int) -> int | None:
    at = os.environ.get(CRASH_VARIABLE)
    starts = int(os.environ.get(CRASH_STARTS_VARIABLE, "1"))
    return int(at) if at is not None and rank == 1 and restart_count() < starts else None


def crash(global_step: int) -> None:
    print(f"rank 1: crashing at step {global_step} ({CRASH_VARIABLE}={global_step})", file=sys.stderr, flush=True)
    os._exit(3)
