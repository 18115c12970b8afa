"""Step checkpoints as the trainer saves and reloads them: rank 0's file (ddp), or a folder of every rank's shards."""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist

from . import checkpoint, records
from .files import write_error
from .folders import TRAINER_STATE, file_sum, seal


def save_step(state: dict, config, sharded: bool, warn) -> None:
    """The trainer's state as its run's step checkpoint, older ones pruned; every rank leaves once it is named."""
    started, is_main = time.perf_counter(), dist.get_rank() == 0
    path = checkpoint.directory(config.output_dir) / f"step-{state['global_step']:08d}-{state['run_id']}"
    if sharded:
        save_shards(state, path)
    elif is_main:
        checkpoint.save_atomic(state, path.with_suffix(".pt"))
    if is_main:
        checkpoint.prune(config.output_dir, state["run_id"], config.keep_checkpoints)
        late = checkpoint.slow_save_warning(time.perf_counter() - started, config.timeout_s)
        if late:
            warn(late)
    dist.barrier()


def save_weights(weights: dict, path: Path, config, **about) -> None:
    """model.pt or best.pt (rank 0): the whole state dict and what it is, a plain file under fsdp too."""
    checkpoint.save_atomic({"model": weights, **about, **records.what_it_is(config)}, path)


def tensors_apart(state: dict) -> tuple[dict, dict]:
    """(the tensors, for DCP; the rest, for trainer.pt): DCP loads other values with pickle, trainer.pt never."""
    optimizer, tensors, others = state["optimizer"], {}, {}
    for name, per in optimizer["state"].items():
        tensors[name] = {key: value for key, value in per.items() if isinstance(value, torch.Tensor)}
        others[name] = {key: value for key, value in per.items() if not isinstance(value, torch.Tensor)}
    rest = {name: value for name, value in state.items() if name not in ("model", "optimizer")}
    rest["optimizer"] = {"state": others, "param_groups": optimizer["param_groups"]}
    return {"model": state["model"], "optimizer": tensors}, rest


def save_shards(state: dict, folder: Path) -> None:
    """A folder written as a file is, into `<name>.tmp`: every rank's shards summed, then rank 0 seals it."""
    import torch.distributed.checkpoint as dcp

    temporary, rank = folder.with_name(folder.name + ".tmp"), dist.get_rank()
    if rank == 0:
        shutil.rmtree(temporary, ignore_errors=True)  # a killed save's
    dist.barrier()  # no rank writes into the folder before it is empty
    tensors, rest = tensors_apart(state)
    try:  # DCP makes the folder, so a folder that refuses it fails here as a full disk does: on every rank
        dcp.save(tensors, storage_writer=dcp.FileSystemWriter(temporary, sync_files=True))
    except dcp.CheckpointException as error:  # raised on every rank, each done writing
        failures = error.failures
        failure = write_error(failures[min(failures)][0], folder) if failures else None  # the lowest rank's
        dist.barrier()  # every rank has judged the disk before one frees it
        shutil.rmtree(temporary, ignore_errors=True)  # every rank, before it logs: a full disk has room again
        if failure:
            raise failure from error  # each rank's traceback, in DCP's error, goes to the rank's log
        raise
    # When save returns on a rank, every rank has written (rank 0 wrote .metadata after hearing from all).
    own = {path.name: file_sum(path) for path in sorted(temporary.glob(f"__{rank}_*.distcp"))}
    sums: list | None = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(own, sums, dst=0)
    if rank == 0:
        try:
            checkpoint.save_atomic(rest, temporary / TRAINER_STATE)
            seal(temporary, folder, {name: entry for part in sums for name, entry in part.items()})
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)  # before the ranks log: a full disk has room again
            raise


def with_shards(state: dict, folder: Path, model, optimizer: torch.optim.Optimizer) -> dict:
    """trainer.pt's state with this rank's shards read from the folder, resharded for this run's ranks."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    weights, now = get_state_dict(model.module, optimizer)  # the shapes to fill, on this run's ranks
    tensors, _ = tensors_apart({"model": weights, "optimizer": now})
    dcp.load(tensors, storage_reader=dcp.FileSystemReader(folder))
    saved = state["optimizer"]
    per_parameter = {
        name: {**tensors["optimizer"].get(name, {}), **saved["state"].get(name, {})}
        for name in {*tensors["optimizer"], *saved["state"]}
    }
    return {**state, "model": tensors["model"], "optimizer": {**saved, "state": per_parameter}}


def starting_point(context, model, optimizer) -> tuple[Path | None, dict | None, str]:
    """(checkpoint or None, its state, the run's identity), as rank 0 picks them: PATH's run, auto the folder's run
    from its newest good checkpoint, else a new run."""
    picked, state, resume, output_dir = [None, None], None, context.config.resume, Path(context.config.output_dir)
    if context.is_main and resume not in ("auto", "none"):
        state = checkpoint.load(Path(resume))
        picked = [resume, state.get("run_id") or uuid.uuid4().hex[:8]]
    elif context.is_main:
        run_id = records.run_id_of(output_dir) if resume == "auto" else None
        found = checkpoint.load_newest_good(output_dir, run_id, context.log.warning) if run_id is not None else None
        path, state = found or (None, None)
        picked = [str(path) if path else None, uuid.uuid4().hex[:8] if run_id is None else run_id]
    dist.broadcast_object_list(picked, src=0)
    if picked[0] is None:
        return None, None, picked[1]
    path = Path(picked[0])
    state = state or checkpoint.load(path, checked=True)  # rank 0 checked it
    if checkpoint.is_folder(path):
        state = with_shards(state, path, model, optimizer)
    return path, state, picked[1]
