"""Imported by the fork server alone, before torch (distributed.PRELOADED): the server's process settings.

The server only forks ranks and DataLoader workers; it holds no file, no GPU and none of the run's state.

- Garbage collection, as Python's `gc.freeze` documentation advises for a process that forks without exec:
  off in the server, everything it imported frozen before each fork, on again in every child. torch then
  imports without collections in the server, and a child's collections never walk torch's hundreds of
  thousands of objects: its first imports (torch._dynamo, which DDP's constructor loads) run faster and touch
  fewer shared pages.
- No teardown: when its launcher (or rank) ends, Python would unload torch module by module before the
  server exits, for nothing. Its children end
  through os._exit, as every forkserver child does, and never run this; the pid check keeps it so should
  one of them exit another way.
"""

from __future__ import annotations

import atexit
import gc
import os

_SERVER = os.getpid()


def _freeze_before_fork() -> None:
    if os.getpid() == _SERVER:  # a child that forks on its own keeps its collector as it is
        gc.freeze()


def _exit_without_teardown() -> None:
    if os.getpid() == _SERVER:
        os._exit(0)  # the server ends only when the process it serves has gone: nothing waits for a status


gc.disable()
os.register_at_fork(before=_freeze_before_fork, after_in_child=gc.enable)
atexit.register(_exit_without_teardown)
