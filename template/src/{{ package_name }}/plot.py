"""Loss and accuracy curves: python -m <package>.plot OUTPUT_DIR  (writes OUTPUT_DIR/curves.png)

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
    with open(metrics, encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    epochs = [int(row["epoch"]) for row in rows]
    figure, (loss_axes, accuracy_axes) = plt.subplots(1, 2, figsize=(9, 3.5))
    loss_axes.plot(epochs, [float(row["loss"]) for row in rows], marker="o")
    loss_axes.set(title="loss", xlabel="epoch")
    accuracy_axes.plot(epochs, [float(row["accuracy"]) for row in rows], marker="o", color="tab:green")
    accuracy_axes.set(title="accuracy", xlabel="epoch", ylim=(0, 1))
    figure.tight_layout()
    target = args.output_dir / "curves.png"
    figure.savefig(target, dpi=100)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
