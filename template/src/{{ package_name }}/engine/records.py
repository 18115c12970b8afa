"""What a run leaves behind besides checkpoints: run.json (who, what, with which versions) and metrics.csv."""

from __future__ import annotations

import csv
import io
import json
import platform
import subprocess
import uuid
from pathlib import Path

import torch

from .. import __version__
from . import PROJECT_ROOT, checkpoint
from .config import Config
from .files import write_text_durably
from .logs import plural, shown_path
from .ownership import name_the_run

RUN_RECORD = "run.json"
METRICS = "metrics.csv"


def versions() -> dict:
    return {
        "package": __version__,
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda or "cpu",
        "python": platform.python_version(),
        "os": platform.platform(),
    }


def git_commit() -> str | None:
    try:
        found = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found.stdout.strip() if found.returncode == 0 else None


def write_run_record(output_dir: Path, run_id: str, world_size: int, restart: int, config: dict) -> None:
    answers_file = PROJECT_ROOT / ".copier-answers.yml"
    record = {
        "run_id": run_id,
        "versions": versions(),
        "git_commit": git_commit(),
        "world_size": world_size,
        "restart": restart,
        "config": config,
        "answers": answers_file.read_text(encoding="utf-8") if answers_file.exists() else None,
    }
    write_text_durably(output_dir / RUN_RECORD, json.dumps(record, indent=2, default=str))
    name_the_run(output_dir, run_id)  # a second launch into this folder is told which run holds it


def run_id_of(output_dir: Path) -> str | None:
    """The identity of the run that owns this folder, from its run.json (None: no record, or an older one)."""
    try:
        return json.loads((output_dir / RUN_RECORD).read_text(encoding="utf-8")).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


def starting_point(resume: str, output_dir: Path, warn) -> tuple[Path | None, dict | None, str]:
    """Rank 0's choice: the checkpoint to continue from (None: from scratch), its state, and the run's identity.

    auto continues the folder's own run from its newest good checkpoint (damaged ones are set aside);
    a checkpoint path continues the run it belongs to; none, or an empty folder, starts a new run.
    """
    if resume not in ("auto", "none"):
        state = checkpoint.load(Path(resume))
        return Path(resume), state, state.get("run_id") or uuid.uuid4().hex[:8]
    run_id = run_id_of(output_dir) if resume == "auto" else None
    if run_id is None:
        return None, None, uuid.uuid4().hex[:8]
    found = checkpoint.load_newest_good(output_dir, run_id, warn)
    return (*found, run_id) if found else (None, None, run_id)


def append_metrics(path: Path, row: dict) -> None:
    """Add one row; the whole (small) file is rewritten durably, so it is never left half-written.

    A last line without its newline (the file was cut: copied while written, or by a full disk elsewhere)
    is dropped first, so the new row starts a line of its own instead of being glued onto a partial one.
    A file written by an older version keeps its own columns, so every row stays under its header.
    """
    text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    text = text[: text.rfind("\n") + 1]  # whole lines only; nothing at all when even the header was cut
    columns = next(csv.reader([text.splitlines()[0]])) if text else list(row)
    line = io.StringIO()
    writer = csv.DictWriter(line, fieldnames=columns, lineterminator="\n", restval="", extrasaction="ignore")
    if not text:
        writer.writeheader()
    writer.writerow(row)
    write_text_durably(path, text + line.getvalue())


def claim_output_dir(output_dir: Path, resume: str, overwrite: bool, resumed_run: str | None) -> str | None:
    """Refuse to start a run in a folder another run wrote, unless told to replace it; return the refusal.

    One folder holds one run, so a new run can never prune, overwrite or mix its rows into another's
    files. The folder's own run continues with --resume auto or one of its checkpoints.
    """
    owner = run_id_of(output_dir)
    traces = [name for name in (RUN_RECORD, METRICS, "model.pt", "best.pt") if (output_dir / name).exists()]
    traces += ["checkpoints"] if checkpoint.any_checkpoint(output_dir) else []
    continuing = owner is not None and (resume == "auto" or resumed_run == owner)
    if not traces or continuing:
        return None
    if overwrite:
        for name in (RUN_RECORD, METRICS, "model.pt", "best.pt", "curves.png"):
            (output_dir / name).unlink(missing_ok=True)
        resuming_from = Path(resume).resolve() if resume not in ("auto", "none") else None
        for old in checkpoint.directory(output_dir).glob("*.pt"):
            if old.resolve() != resuming_from:  # the checkpoint this run continues from stays
                old.unlink()
        return None
    whose = f"run {owner}" if owner else "files of another run"
    return (
        f"output_dir {output_dir} already holds {whose} ({', '.join(traces)}); nothing was changed. "
        "Continue that run with --resume auto, train into a new --output-dir, "
        "or replace it with --overwrite (overwrite = true in configs/train.toml)"
    )


def start_lines(run_id: str, config: Config, ranks: int) -> list[str]:
    """The run's identity, how the global batch is made, and where its files go: two short lines."""
    micro = config.accumulate_steps
    return [
        f"run {run_id}: global batch {config.global_batch_size} = {ranks} rank{plural(ranks)} x "
        f"{micro} micro-batch{plural(micro, 'es')} x {config.micro_batch}",
        f"output in {shown_path(config.output_dir)}",
    ]
