"""What a run leaves besides checkpoints, and what its rows decide: run.json, metrics.csv, best epoch, early stop."""

from __future__ import annotations

import csv
import datetime
import io
import json
import math
import platform
import subprocess
from pathlib import Path

import torch

from .. import __version__
from . import PROJECT_ROOT, checkpoint
from .config import Config
from .files import write_text_durably
from .logs import plural, shown_path
from .ownership import name_the_run
from .process_group import LaunchError

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


def write_run_record(output_dir: Path, run_id: str, world_size: int, restart: int, config: dict, step: int) -> None:
    """run.json: the run's identity, versions and settings, and under "segments" every start of it and its step."""
    answers_file = PROJECT_ROOT / ".copier-answers.yml"
    try:
        earlier = json.loads((output_dir / RUN_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        earlier = {}
    segments = earlier.get("segments", []) if isinstance(earlier, dict) and earlier.get("run_id") == run_id else []
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    segment = {"started": started, "from_step": step, "world_size": world_size, "restart": restart, "config": config}
    record = {
        "run_id": run_id,
        "versions": versions(),
        "git_commit": git_commit(),
        "world_size": world_size,
        "restart": restart,
        "config": config,
        "answers": answers_file.read_text(encoding="utf-8") if answers_file.exists() else None,
        "segments": [*segments, segment],
    }
    write_text_durably(output_dir / RUN_RECORD, json.dumps(record, indent=2, default=str))
    name_the_run(output_dir, run_id)  # a second launch into this folder is told which run holds it


def run_id_of(output_dir: Path) -> str | None:
    """The identity of the run that owns this folder, from its run.json (None: no record, or an older one)."""
    try:
        return json.loads((output_dir / RUN_RECORD).read_text(encoding="utf-8")).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


def what_it_is(config: Config) -> dict:
    """What every checkpoint holds beside the weights, to rebuild the model alone: recipe.model(Config(**config))."""
    settings = {name: value for name, value in vars(config).items() if name != "environment"}
    return {"config": settings, "recipe": config.recipe, "versions": versions()}


def metrics_text(rows: list[dict]) -> str:
    """metrics.csv holding `rows`: a header of every column they have, in the order they first appear."""
    if not rows:
        return ""
    text = io.StringIO()
    columns = list(dict.fromkeys(name for row in rows for name in row))
    writer = csv.DictWriter(text, fieldnames=columns, lineterminator="\n", restval="")
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


def write_metrics(path: Path, rows: list[dict], held: int) -> str | None:
    """The trainer's rows as metrics.csv, whole; a warning where the file had lost some of the `held` rows."""
    try:
        before = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        before = ""
    after = metrics_text(rows)
    if after != before:
        if rows:
            write_text_durably(path, after)
        else:
            path.unlink(missing_ok=True)
    if before.startswith(metrics_text(rows[:held])):
        return None
    return f"{METRICS} had lost rows while the run wrote it; rewritten with its {len(rows)} row{plural(len(rows))}"


def claim_output_dir(output_dir: Path, resume: str, overwrite: bool, resumed_run: str | None) -> str | None:
    """The refusal to start in another run's folder, unless told to replace it: one folder holds one run."""
    owner = run_id_of(output_dir)
    traces = [name for name in (RUN_RECORD, METRICS, "model.pt", "best.pt") if (output_dir / name).exists()]
    traces += ["checkpoints"] if checkpoint.of_any_run(output_dir) else []
    continuing = owner is not None and (resume == "auto" or resumed_run == owner)
    if not traces or continuing:
        return None
    if overwrite:
        for name in (RUN_RECORD, METRICS, "model.pt", "best.pt", "curves.png"):
            (output_dir / name).unlink(missing_ok=True)
        resuming_from = Path(resume).resolve() if resume not in ("auto", "none") else None
        for old in checkpoint.of_any_run(output_dir):
            if old.resolve() != resuming_from:  # the checkpoint this run continues from stays
                checkpoint.remove(old)
        return None
    whose = f"run {owner}" if owner else "files of another run"
    return (
        f"output_dir {output_dir} already holds {whose} ({', '.join(traces)}); nothing was changed. "
        "Continue that run with --resume auto, train into a new --output-dir, "
        "or replace it with --overwrite (overwrite = true in configs/train.toml)"
    )


def start_lines(run_id: str, config: Config, ranks: int, trained: int, dataset: int) -> list[str]:
    """The run's identity, how the global batch is made, what an epoch trains and where its files go."""
    micro = config.accumulate_steps
    batch = (
        f"run {run_id}: global batch {config.global_batch_size} = {ranks} rank{plural(ranks)} x "
        f"{micro} micro-batch{plural(micro, 'es')} x {config.micro_batch}"
    )
    epoch = f"{trained} of {dataset} samples an epoch (the rest rotate in as the order reshuffles)"
    return [batch, *([epoch] if trained < dataset else []), f"output in {shown_path(config.output_dir)}"]


def new_best(best: tuple | None, row: dict, config: Config) -> tuple | None:
    """(value, epoch) of best_metric when this epoch's row beats `best` (the first epoch on a tie); else None."""
    name = config.best_metric
    if name not in row:
        columns = [column for column in row if column not in ("epoch", "step", "lr", "samples_per_s", "resumed")]
        raise LaunchError(
            f"best_metric {name!r} is not a metrics.csv column; this recipe's columns are {', '.join(columns)}"
        )
    value, sign = float(row[name]), 1 if config.best_mode == "min" else -1
    return (value, row["epoch"]) if best is None or sign * value < sign * best[0] else None


def early_stop_reason(best: tuple | None, epoch: int, config: Config) -> str | None:
    """Why training ends after `epoch`: best_metric has not improved for early_stop_patience epochs (None: go on)."""
    patience = config.early_stop_patience
    if not patience or best is None or epoch - best[1] < patience:
        return None
    return (
        f"stopped early after epoch {epoch}: {config.best_metric} has not improved for {patience} epoch(s)\n"
        f"best.pt holds epoch {best[1]} ({config.best_metric} {best[0]}), model.pt epoch {epoch}"
    )


def epoch_row(epoch: int, step: int, trained: dict, seen: float, validated: dict, lr: float, grad_norms: list,
              seconds: float) -> dict:  # fmt: skip
    """An epoch's metrics.csv row in whole float64s, as `evaluate` gives them; grad_norm: before clipping."""
    row = {"epoch": epoch, "step": step}
    row.update({name: float(total) / max(seen, 1) for name, total in trained.items()})
    row.update({f"val_{name}": float(value) for name, value in validated.items()})
    row["lr"] = lr
    if grad_norms:
        norms = torch.stack([norm.double().cpu() for norm in grad_norms])
        row["grad_norm"] = float(norms[norms.isfinite()].mean())  # fp16 overflow steps are skipped
    row["samples_per_s"] = round(seen / seconds, 1) if seconds > 0 else math.inf
    return row
