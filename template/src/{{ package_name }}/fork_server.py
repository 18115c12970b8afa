"""Imported by the fork server alone, after torch (distributed.PRELOADED): the server exits without teardown.

The server only forks ranks and DataLoader workers; it holds no file, no GPU and none of the run's state.
When its launcher (or rank) ends, Python would unload torch module by module before the server exits:
about 0.4 CPU-s after every run and every rank with workers, for nothing (docs/performance.md in the
template). Its children end through os._exit, as every forkserver child does, and never run this; the
pid check keeps it so should one of them exit another way.
"""

from __future__ import annotations

import atexit
import os

_SERVER = os.getpid()


def _exit_without_teardown() -> None:
    if os.getpid() == _SERVER:
        os._exit(0)  # the server ends only when the process it serves has gone: nothing waits for a status


atexit.register(_exit_without_teardown)
