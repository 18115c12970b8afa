"""What each finished epoch leaves: its metrics.csv row (and TensorBoard's copy), best.pt, the reason to stop
early; Trainer (trainer.py) takes these methods from EpochRecords."""

from __future__ import annotations

import math
import signal

import torch

from . import checkpoint, records, scalars
from .logs import epoch_line, show_epoch
from .process_group import LaunchError
from .totals import validation_metrics


class EpochRecords:
    """The Trainer's end of an epoch, on every rank (track_best, early_stop_reason) or rank 0 (record_epoch)."""

    def epoch_row(self, trained: dict, seen: float, validated: dict, val_seen: float, seconds: float) -> dict:
        """The epoch's metrics.csv row: training means, validation metrics, lr, grad_norm, speed.

        Values keep every digit of their float64: `evaluate` on the saved weights gives the same number.
        """
        row = {"epoch": self.epoch, "step": self.global_step}
        for name, total in trained.items():
            row[name] = float(total) / max(seen, 1)
        for name, value in validation_metrics(self.recipe, validated, val_seen).items():
            row[f"val_{name}"] = float(value)
        row["lr"] = float(self.scheduler.get_last_lr()[0])
        if self.grad_norms:
            norms = torch.stack([norm.double().cpu() for norm in self.grad_norms])
            row["grad_norm"] = float(norms[norms.isfinite()].mean())  # fp16 overflow steps are skipped
        row["samples_per_s"] = round(seen / seconds, 1) if seconds > 0 else math.inf
        row["resumed"] = int(self.resumed)
        return row

    def track_best(self, row: dict) -> bool:
        """Whether this epoch's best_metric is the best so far (the first epoch on a tie); updates self.best."""
        name = self.config.best_metric
        if name not in row:
            columns = [column for column in row if column not in ("epoch", "step", "lr", "samples_per_s", "resumed")]
            raise LaunchError(
                f"best_metric {name!r} is not a metrics.csv column; this recipe's columns are {', '.join(columns)}"
            )
        value, sign = float(row[name]), 1 if self.config.best_mode == "min" else -1  # text: an earlier file's row
        if self.best is None or sign * value < sign * self.best[0]:
            self.best = (value, row["epoch"])
            return True
        return False

    def early_stop_reason(self) -> str | None:
        """Why training ends now: best_metric has not improved for early_stop_patience epochs (None: go on)."""
        patience = self.config.early_stop_patience
        if not patience or self.best is None or self.epoch - self.best[1] < patience:
            return None
        value, epoch = self.best
        return (
            f"stopped early after epoch {self.epoch}: {self.config.best_metric} has not improved for {patience} "
            f"epoch(s)\nbest.pt holds epoch {epoch} ({self.config.best_metric} {value}), model.pt epoch {self.epoch}"
        )

    def stopped_at(self, signum: int) -> str:
        name = signal.Signals(signum).name
        why = "a time limit or preemption is near" if name == "SIGUSR1" else "asked to stop"
        return (
            f"stopped at step {self.global_step} on {name} ({why}); the checkpoint is saved, and --resume auto "
            "continues from it"
        )

    def record_epoch(self, row: dict, progress, weights: dict | None) -> None:
        """Rank 0: the log line, the progress bar, metrics.csv (and TensorBoard's copy) and best.pt (`weights`:
        the model's, where the epoch improved best_metric)."""
        self.log.info(epoch_line(row, self.config.epochs))
        show_epoch(progress, row, self.config.epochs)
        lost = records.write_metrics(self.output_dir / records.METRICS, self.rows, len(self.rows) - 1)
        if lost:
            self.log.warning(lost)
        if self.config.tensorboard:
            scalars.write(self.output_dir, row)
        if weights is not None:
            name = self.config.best_metric
            best = {"model": weights, "epoch": row["epoch"], name: row[name]}
            best.update(self.what_it_is())
            checkpoint.save_atomic(best, self.output_dir / "best.pt")
