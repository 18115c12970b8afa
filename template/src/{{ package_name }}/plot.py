"""Training and validation curves: python -m <package>.plot OUTPUT_DIR  (writes OUTPUT_DIR/curves.png)

matplotlib is optional (pip install -e .[plot]); without it this says so and exits 1.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

PROG = f"python -m {__package__}.plot"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="Plot metrics.csv of a training run.")
    parser.add_argument("output_dir", type=Path, help="the run's output directory (holds metrics.csv)")
    args = parser.parse_args(argv)
    metrics = args.output_dir / "metrics.csv"
    if not metrics.is_file():
        parser.error(f"{metrics} does not exist; train first, or pass the run's --output-dir")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"error: {PROG} needs matplotlib: pip install matplotlib (or pip install -e .[plot])", file=sys.stderr)
        return 1
    from matplotlib.ticker import MaxNLocator

    with open(metrics, encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        # An epoch trained again after a resume has two rows: the later one is the run's.
        latest = {int(row["epoch"]): row for row in reader}
        metric = reader.fieldnames[3]  # epoch, step, loss, then the recipe's metric (accuracy by default)
    rows = [latest[epoch] for epoch in sorted(latest)]
    epochs = [int(row["epoch"]) for row in rows]
    # The first epoch finished after each resume (column absent in files from older versions).
    resumes = [int(row["epoch"]) for row in rows if row.get("resumed") == "1"]
    figure, (loss_axes, accuracy_axes) = plt.subplots(1, 2, figsize=(9, 3.8))
    figure.suptitle(f"run: {args.output_dir.resolve().name}")
    for axes, column, title in ((loss_axes, "loss", "loss"), (accuracy_axes, metric, metric)):
        axes.plot(epochs, [float(row[column]) for row in rows], marker="o", label="training")
        if rows and row_has(rows, "val_" + column):  # files from older versions have no validation columns
            axes.plot(epochs, [float(row["val_" + column]) for row in rows], marker="s", label="validation")
        axes.set(title=title, xlabel="epoch", ylabel=title)
    for axes in (loss_axes, accuracy_axes):
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        for number, epoch in enumerate(resumes):
            axes.axvline(epoch - 0.5, color="gray", linestyle="--", label="resumed" if number == 0 else None)
        axes.legend()
    figure.tight_layout()
    target = args.output_dir / "curves.png"
    figure.savefig(target, dpi=100)
    print(f"wrote {target}" + (f" (resumed before epoch {', '.join(map(str, resumes))})" if resumes else ""))
    return 0


def row_has(rows: list[dict], column: str) -> bool:
    return all(row.get(column) not in (None, "") for row in rows)


if __name__ == "__main__":
    sys.exit(main())
