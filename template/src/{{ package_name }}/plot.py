"""Training curves of one run or several: python -m <package>.plot RUN [RUN ...]

One run writes RUN/curves.png; several are drawn over each other (one colour per run) into
curves.png here, or wherever --output says. Panels: the loss (a log axis once it spans more than a
decade), the recipe's metric, the learning rate, and grad_norm when metrics.csv has it. Training is
a solid line, validation a dashed one; markers only while a run has few epochs.

matplotlib is optional (pip install -e .[plot]); without it this says so and exits 1.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # started as a file (python src/<package>/plot.py, an editor's Run button): as the module, with
    here = Path(__file__).resolve().parent  # the package importable and its folder's files not shadowing others
    sys.path[:] = [str(here.parent), *(entry for entry in sys.path if Path(entry or ".").resolve() != here)]
    __package__ = here.name

from .engine.logs import escape_what_stdout_cannot_encode

PROG = f"python -m {__package__}.plot"
NOT_METRICS = {"epoch", "step", "loss", "lr", "samples_per_s", "resumed", "grad_norm"}
MARKERS_UP_TO = 30  # epochs; beyond that, markers only blot the line
# Fonts that hold Chinese glyphs, tried after matplotlib's default (Windows, macOS, Linux in that order).
CJK_FONTS = ["Microsoft YaHei", "SimHei", "PingFang SC", "Noto Sans CJK SC", "Source Han Sans SC", "WenQuanYi Zen Hei"]


@dataclass
class Run:
    folder: Path
    rows: list[dict] = field(default_factory=list)  # one per epoch: the last row written for it wins
    metric: str | None = None
    skipped: list[str] = field(default_factory=list)  # what of metrics.csv could not be read, and why
    record: dict = field(default_factory=dict)  # run.json

    @property
    def run_id(self) -> str:
        return self.record.get("run_id") or "?"

    def column(self, name: str) -> list[float]:
        return [row[name] for row in self.rows]

    def has(self, name: str) -> bool:
        return bool(self.rows) and all(name in row for row in self.rows)

    def resumes(self) -> list[int]:
        """The first epoch finished after each resume."""
        return [int(row["epoch"]) for row in self.rows if row.get("resumed") == 1]

    def setting(self, name: str):
        config = self.record.get("config") or {}
        tables = [config, *(value for value in config.values() if isinstance(value, dict))]  # [recipe] too
        return next((table[name] for table in tables if name in table), None)

    def settings(self) -> str:
        """The run id and the settings that shape a curve, for the title."""
        parts = [f"run {self.run_id}"]
        if self.record.get("world_size"):
            parts.append(f"{self.record['world_size']} ranks")
        for name, label in (("global_batch_size", "batch"), ("lr", "lr"), ("epochs", "epochs"), ("precision", "")):
            value = self.setting(name)
            if value not in (None, "", "no"):
                parts.append(f"{label} {value}".strip())
        return ", ".join(parts)


def read_run(folder: Path) -> Run:
    """What is valid of FOLDER/metrics.csv (an empty or cut-off file included), and its run.json."""
    run = Run(folder)
    try:
        run.record = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass  # a run from an older version, or a copied metrics.csv: no title details
    with open(folder / "metrics.csv", encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        if not {"epoch", "loss"} <= set(header):
            run.skipped.append("no header with epoch and loss columns" if header else "the file is empty")
            return run
        run.metric = next((name for name in header if name not in NOT_METRICS and not name.startswith("val_")), None)
        latest: dict[int, dict] = {}
        for line, row in enumerate(reader, start=2):
            try:
                values = {name: number(row[name]) for name in header if row.get(name) not in (None, "")}
                if None in row or len(values) < len(header):
                    raise ValueError("a cut-off or over-long row")
                values["epoch"] = int(values["epoch"])
            except (ValueError, TypeError) as error:
                run.skipped.append(f"line {line} ({error})")
                continue
            latest[values["epoch"]] = values  # an epoch trained again after a resume: the later row is the run's
    run.rows = [latest[epoch] for epoch in sorted(latest)]
    return run


def number(text: str) -> float:
    value = float(text)
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value


def spans_decades(values: list[float]) -> bool:
    positive = [value for value in values if value > 0 and math.isfinite(value)]
    return len(positive) == len(values) > 1 and max(positive) / min(positive) > 10


def readable(text: str, covered) -> tuple[str, bool]:
    """The text with characters no installed font can draw as '?', and whether any were replaced."""
    shown = "".join(char if covered(char) else "?" for char in text)
    return shown, shown != text


def glyph_check(matplotlib):
    """covered(char): whether the font family in use (default plus CJK_FONTS found here) can draw char."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    installed = {font.name for font in font_manager.fontManager.ttflist}
    families = [name for name in CJK_FONTS if name in installed]
    default = matplotlib.rcParams["font.sans-serif"][:1]
    # First, not after the default: matplotlib's glyph-by-glyph fallback does not reach an OpenType collection
    # such as Linux's Noto Sans CJK (.ttc), and these fonts draw Latin text as well.
    matplotlib.rcParams["font.sans-serif"] = [*families, *matplotlib.rcParams["font.sans-serif"]]
    charmaps = []
    for name in [*default, *families]:
        path = font_manager.findfont(font_manager.FontProperties(family=name), fallback_to_default=True)
        charmaps.append(FT2Font(path).get_charmap())
    return lambda char: char.isspace() or any(ord(char) in charmap for charmap in charmaps)


def figure_of(runs: list[Run], matplotlib):
    """The figure for these runs; a note is returned for each name shown with '?' instead of its glyphs."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    covered, notes = glyph_check(matplotlib), []
    metric = runs[0].metric
    panels = ["loss", metric, "lr"] + (["grad_norm"] if any(run.has("grad_norm") for run in runs) else [])
    panels = [name for name in panels if name and any(run.has(name) for run in runs)]
    columns = 2 if len(panels) == 4 else len(panels)
    rows = math.ceil(len(panels) / columns)
    figure, grid = plt.subplots(rows, columns, figsize=(4.6 * columns, 3.6 * rows), squeeze=False)
    axes_of = dict(zip(panels, grid.flat))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for number_, run in enumerate(runs):
        colour = colours[number_ % len(colours)]
        name, replaced = readable(run.folder.resolve().name, covered)
        if replaced:
            notes.append(f"no installed font draws every character of {run.folder.name!r}: shown as {name!r}")
        label = f"{name} ({run.run_id})" if len(runs) > 1 else ""
        epochs = run.column("epoch")
        marks = {"marker": "o", "markersize": 3.5} if len(epochs) <= MARKERS_UP_TO else {}
        for panel, axes in axes_of.items():
            if run.has(panel):  # lr and grad_norm are of training only: the run's name alone
                split = "training" if panel not in ("lr", "grad_norm") else ""
                axes.plot(epochs, run.column(panel), color=colour, linestyle="-",
                          label=f"{label} {split}".strip() or None, **marks)  # fmt: skip
            if panel not in ("lr", "grad_norm") and run.has("val_" + panel):
                axes.plot(epochs, run.column("val_" + panel), color=colour, linestyle="--",
                          label=f"{label} validation".strip(), **marks)  # fmt: skip
            for count, epoch in enumerate(run.resumes()):
                axes.axvline(epoch - 0.5, color=colour if len(runs) > 1 else "gray", linestyle=":", linewidth=1,
                             label=f"{label} resumed".strip() if count == 0 else None)  # fmt: skip
    for panel, axes in axes_of.items():
        values = [value for run in runs if run.has(panel) for value in run.column(panel)]
        values += [value for run in runs if run.has("val_" + panel) for value in run.column("val_" + panel)]
        if panel == "loss" and spans_decades(values):
            axes.set_yscale("log")
        title = {"lr": "learning rate", "grad_norm": "gradient norm"}.get(panel, panel)
        axes.set(title=title, xlabel="epoch", ylabel=title)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.grid(True, alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize="small")
    if len(runs) == 1:
        title, replaced = readable(f"{runs[0].folder.resolve().name}: {runs[0].settings()}", covered)
    else:
        title, replaced = readable(f"{len(runs)} runs: " + "; ".join(run.settings() for run in runs[:3]), covered)
    figure.suptitle(title, fontsize="medium")
    figure.tight_layout()
    return figure, notes


def main(argv: list[str] | None = None) -> int:
    escape_what_stdout_cannot_encode()
    parser = argparse.ArgumentParser(prog=PROG, description="Plot metrics.csv of one or several training runs.")
    parser.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="a run's output folder (holds metrics.csv)")
    parser.add_argument("--output", type=Path, help="the PNG to write (one run: RUN/curves.png; several: curves.png)")
    args = parser.parse_args(argv)
    for folder in args.runs:
        if not (folder / "metrics.csv").is_file():
            parser.error(f"{folder / 'metrics.csv'} does not exist; train first, or pass the run's --output-dir")
    try:
        import matplotlib

        matplotlib.use("Agg")
    except ImportError:
        print(f"error: {PROG} needs matplotlib: pip install matplotlib (or pip install -e .[plot])", file=sys.stderr)
        return 1
    runs = []
    for run in map(read_run, args.runs):
        if run.skipped:
            shown = "; ".join(run.skipped[:3]) + (f"; and {len(run.skipped) - 3} more" if len(run.skipped) > 3 else "")
            print(f"{run.folder / 'metrics.csv'}: skipped {shown}", file=sys.stderr)
        if run.rows:
            runs.append(run)
    if not runs:
        print("error: no epoch to plot yet; metrics.csv gets a row after each epoch", file=sys.stderr)
        return 1
    figure, notes = figure_of(runs, matplotlib)
    target = args.output or (runs[0].folder / "curves.png" if len(args.runs) == 1 else Path("curves.png"))
    figure.savefig(target, dpi=100)
    for note in notes:
        print(note, file=sys.stderr)
    resumes = runs[0].resumes() if len(runs) == 1 else []
    print(f"wrote {target}" + (f" (resumed before epoch {', '.join(map(str, resumes))})" if resumes else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
