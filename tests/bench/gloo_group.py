"""The benchmark loops' gloo process group, started so that a rank's exit cannot abort."""

from __future__ import annotations


def init_gloo(rank: int, world_size: int) -> None:
    # DDP's constructor imports torch._dynamo; imported after the group, it keeps the group alive past
    # destroy_process_group, and the rank's exit now and then aborts with SIGABRT (the rendered project's
    # engine/process_group.py imports it first for the same reason).
    import torch._dynamo  # noqa: F401
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
