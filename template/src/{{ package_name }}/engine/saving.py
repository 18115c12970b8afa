"""Step checkpoints as the trainer saves them and finds them again: one file that rank 0 writes (ddp), or a folder in
which every rank writes its own shards (fsdp); checkpoint.py holds the file format, folders.py the folder's.

A folder is written as a file is (files.py): into a temporary sibling, `<name>.tmp`, named only once whole.
1. rank 0 clears a killed save's `<name>.tmp`; the ranks meet;
2. every rank writes its shards of the model and the optimizer through torch.distributed.checkpoint
   (`__<rank>_<n>.distcp`, each synced; rank 0 also `.metadata`), then sums its own files (size, CRC-32);
   a rank's failure there, a full disk for one, reaches every rank, which each remove `<name>.tmp` and stop
   with the one line of files.write_error;
3. rank 0 writes trainer.pt, the rest of the state, as ddp's file without the model and optimizer tensors,
   then the manifest of every file, syncs the folder, renames it and syncs its parent.
Only tensors go through torch.distributed.checkpoint: it loads any other value with pickle (weights_only=False),
and its load fills a state dict of the same structure, which the trainer's state before loading (the rows,
the random streams of each rank) does not have. So everything else is in trainer.pt, read with
weights_only=True, and each rank's random streams and epoch so far are gathered to rank 0 for it, as for ddp.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist

from . import checkpoint, records
from .files import write_error
from .folders import TRAINER_STATE, file_sum, seal
from .logs import shown_path


def save_step(state: dict, config, sharded: bool, warn) -> None:
    """The trainer's state (Trainer.state_dict()) as the step checkpoint of its run, in the run's format; the
    run's older ones pruned to keep_checkpoints. Every rank calls it, and leaves once the checkpoint is named."""
    started = time.perf_counter()
    step, run_id, is_main = state["global_step"], state["run_id"], dist.get_rank() == 0
    if sharded:
        save_shards(state, checkpoint.folder_for(config.output_dir, step, run_id))
    elif is_main:
        checkpoint.save_atomic(state, checkpoint.path_for(config.output_dir, step, run_id))
    if is_main:
        checkpoint.prune(config.output_dir, run_id, config.keep_checkpoints)
        late = checkpoint.slow_save_warning(time.perf_counter() - started, config.timeout_s)
        if late:
            warn(late)
    dist.barrier()


def save_weights(weights: dict, path: Path, config, **about) -> None:
    """model.pt or best.pt (rank 0): the model's state dict whole (sharding.full_weights) with what it is, a plain
    torch.save file under fsdp too, which evaluate and torch.load(path, weights_only=True) read."""
    checkpoint.save_atomic({"model": weights, **about, **records.what_it_is(config)}, path)


def tensors_apart(state: dict) -> tuple[dict, dict]:
    """(the model's and the optimizer's tensors, for torch.distributed.checkpoint; the rest, for trainer.pt)."""
    optimizer = state["optimizer"]
    tensors = {
        name: {key: value for key, value in per.items() if isinstance(value, torch.Tensor)}
        for name, per in optimizer["state"].items()
    }
    others = {
        name: {key: value for key, value in per.items() if not isinstance(value, torch.Tensor)}
        for name, per in optimizer["state"].items()
    }
    rest = {name: value for name, value in state.items() if name not in ("model", "optimizer")}
    rest["optimizer"] = {"state": others, "param_groups": optimizer["param_groups"]}
    return {"model": state["model"], "optimizer": tensors}, rest


def save_shards(state: dict, folder: Path) -> None:
    """A folder checkpoint, each rank writing its own shards (see the module's docstring)."""
    import torch.distributed.checkpoint as dcp

    temporary, rank = folder.with_name(folder.name + ".tmp"), dist.get_rank()
    if rank == 0:
        shutil.rmtree(temporary, ignore_errors=True)
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
    """trainer.pt's state with this rank's shards of the model and optimizer read from the folder, resharded for
    this run's ranks (any number, and under ddp whole); every rank calls it. Loaded in place: the model's
    parameters and the optimizer's state hold the checkpoint's values when it returns."""
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


def starting_point(context, output_dir: Path, model, optimizer) -> tuple[Path | None, dict | None, str]:
    """(the checkpoint this run continues from or None, the trainer's state from it, the run's identity): rank 0
    decides the run and the checkpoint (setting damaged ones aside), and every rank loads what it picked."""
    picked, state = [None, None], None
    if context.is_main:
        path, state, run_id = records.starting_point(context.config.resume, output_dir, context.log.warning)
        picked = [str(path) if path else None, run_id]
    dist.broadcast_object_list(picked, src=0)
    if picked[0] is None:
        return None, None, picked[1]
    path = Path(picked[0])
    state = state or checkpoint.load(path, checked=True)  # rank 0 checked it
    if checkpoint.is_folder(path):
        state = with_shards(state, path, model, optimizer)
    return path, state, picked[1]


def shown(path: Path, output_dir: Path) -> str:
    """A checkpoint as the log names it: in the run's own folder by its name alone."""
    in_output = path.parent.resolve() == checkpoint.directory(output_dir).resolve()
    return path.name if in_output else shown_path(path)
