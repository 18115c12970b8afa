"""The rank side of the smoke check (smoke.py): each rank's devices, an all-reduce, one step, a bare DDP loop, timed."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import torch
import torch.distributed as dist

from . import PACKAGE
from .config import Config
from .context import RankContext
from .devices import bf16_problem
from .loaders import batches_of
from .process_group import in_the_group, init_process_group, reduction_device
from .rank import build_trainer
from .recipes import on_devices

BARE_STEPS = 30  # the bare loop's timed steps, after 3 untimed ones


def probe_rank(config: Config, info) -> int:
    """One rank of the probe: each part's outcome goes to <output_dir>/rank<N>.json."""
    context = RankContext.create(config, info, logging.getLogger(f"{PACKAGE}.smoke"))
    context.use_devices()
    init_process_group(config, context.rank, context.world_size, context.devices)
    found: dict = {"rank": info.rank, "devices": [str(device) for device in context.devices]}
    with in_the_group():
        try:
            found.update(parts(context))
        finally:
            Path(config.output_dir).mkdir(parents=True, exist_ok=True)
            (Path(config.output_dir) / f"rank{info.rank}.json").write_text(json.dumps(found), encoding="utf-8")
    return 0


def parts(context: RankContext) -> dict:
    """Each part's outcome, or its error's first line: one that fails does not stop the others. The trainer lives
    in here only: see in_the_group()."""
    found, trainer = {}, None
    for name, part in (("collective", _collective), ("step", _step), ("bare", _bare_loop)):
        try:
            if name != "collective" and trainer is None:
                trainer = build_trainer(context)
            found[name] = part(context, trainer)
        except Exception as error:  # noqa: BLE001 - reported as that part's FAIL, with its message
            text = str(error).strip()
            found[name] = {"error": f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"}
    return found


def _collective(context: RankContext, trainer) -> dict:
    total = torch.tensor([float(context.rank + 1)], device=reduction_device(context.devices[-1]))
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    dist.barrier()
    return {"sum": total.item(), "expected": context.world_size * (context.world_size + 1) / 2}


def _one_step(trainer, batch) -> tuple:
    """The engine's step on one batch under the precision, with its scaler: (loss, whether the gradients are finite)."""
    trainer.optimizer.zero_grad(set_to_none=True)
    with trainer.autocast():
        loss = trainer.loss_of(trainer.model, batch)[0]  # as Trainer.run_step computes it
    trainer.scaler.scale(loss).backward()
    finite = all(p.grad is None or bool(p.grad.isfinite().all()) for p in trainer.model.parameters())
    trainer.scaler.step(trainer.optimizer)
    trainer.scaler.update()
    return loss, finite


def _step(context: RankContext, trainer) -> dict:
    config, devices = context.config, context.devices
    if config.device == "cuda" and config.precision == "bf16":
        own = {d.index: (torch.cuda.get_device_name(d), torch.cuda.get_device_capability(d)) for d in devices}
        problem = bf16_problem(own, config.parallelism)
        if problem:
            return {"error": problem}
    loss, finite = _one_step(trainer, next(batches_of(trainer.train_data)))
    return {
        "loss": loss.item(),
        "finite": math.isfinite(loss.item()) and finite,
        "parameter_devices": sorted({str(p.device) for p in trainer.model.parameters()}),
    }


def _bare_loop(context: RankContext, trainer) -> dict:
    """The same model, optimizer and step in DDP on one batch kept on the devices: no loader, totals or schedule."""
    devices = context.devices
    batch = on_devices(next(batches_of(trainer.train_data)), devices)
    for _ in range(3):
        _one_step(trainer, batch)
    synchronize = torch.cuda.synchronize if devices[0].type == "cuda" else lambda: None
    synchronize()
    started = time.perf_counter()
    for _ in range(BARE_STEPS):
        _one_step(trainer, batch)
    synchronize()
    slowest = torch.tensor([time.perf_counter() - started], dtype=torch.float64, device=reduction_device(devices[-1]))
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return {"samples_per_s": BARE_STEPS * context.config.micro_batch * context.world_size / slowest.item()}
