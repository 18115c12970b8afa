"""Benchmark: the rendered project against a bare DDP loop and a same-work loop, in one run, interleaved, medians.

    python tests/bench/bench.py --project RENDERED_DEFAULT_PROJECT [--reps 3]

Run through `nox -s bench`, which renders the default project and installs it first. Writes
.bench/results.json, .bench/results.md, and the tables of docs/performance.md (`--only checkpoints`:
the checkpoint table alone, from tests/bench/checkpoints.py; `--only same-work`: the engine against the
same-work loop and what per-sample seeding costs a batch, tests/bench/sample_seeded.py; `--only cnn`: a small
CNN through the engine against the same work written as PyTorch's DDP tutorial writes it; `--only memory`: what
each rank holds of a 50 M-parameter model under ddp and fsdp, tests/bench/memory_recipe.py).
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BARE = HERE / "bare_ddp.py"
SAME_WORK = HERE / "same_work_ddp.py"
GLOBAL_BATCH = 64
SAMPLES = 8192  # 128 steps per epoch at the global batch of 64
# The same-work comparison looks for a gap of 2 %: epochs of 512 steps (about 2 s each) so that a slow second of
# the shared machine moves one epoch's rate less.
SAME_WORK_SAMPLES = 32768


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run(command: list[str], cwd: Path | None = None, env: dict | None = None) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=900, env=env)
    if done.returncode != 0:
        raise SystemExit(f"benchmark command failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-3000:]}")
    return done.stdout


def package_of(project: Path) -> str:
    answers = (project / ".copier-answers.yml").read_text(encoding="utf-8")
    return re.search(r"^package_name: (\S+)$", answers, re.M).group(1)


def train_args(project: Path, output_dir: Path, *extra: str, ranks: int = 2) -> list[str]:
    return ["--config", str(project / "configs" / "train.toml"), "--output-dir", str(output_dir), "--resume", "none",
            "--nproc-per-node", str(ranks), "--global-batch-size", str(GLOBAL_BATCH), "--master-port",
            str(free_port()), *extra]  # fmt: skip


# -- 1. steady-state throughput ----------------------------------------------------------------
def rendered_steps_per_s(
    project: Path, *extra: str, batch: int = GLOBAL_BATCH, env: dict | None = None, samples: int = SAMPLES
) -> float:
    with tempfile.TemporaryDirectory() as output:
        args = train_args(project, Path(output), "--epochs", "4", "--samples", str(samples), *extra)
        run([sys.executable, "-m", f"{package_of(project)}.train", *args], cwd=project, env=env)
        with open(Path(output) / "metrics.csv", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    # Epoch 1 is warm-up; each epoch's time is its training steps (validation and the checkpoint come after).
    return statistics.median(float(row["samples_per_s"]) / batch for row in rows[1:])


def rendered_general_steps_per_s(project: Path) -> float:
    """The same work through training_step and validation_step (tests/bench/steps_recipe.py)."""
    env = {**os.environ, "PYTHONPATH": str(HERE), "BENCH_PACKAGE": package_of(project)}
    return rendered_steps_per_s(project, "--recipe", "steps_recipe", env=env, samples=SAME_WORK_SAMPLES)


def rendered_wide_steps_per_s(project: Path) -> float:
    """The same project with a wide model (tests/bench/wide_recipe.py), batch 256."""
    env = {**os.environ, "PYTHONPATH": str(HERE), "BENCH_PACKAGE": package_of(project)}
    return rendered_steps_per_s(project, "--recipe", "wide_recipe", "--global-batch-size", "256", batch=256, env=env)


def bare_steps_per_s(ranks: int = 2, threads: int = 1, hidden: int = 10, batch: int = GLOBAL_BATCH,
                     steps: int = 384, warmup: int = 16) -> float:  # fmt: skip
    output = run([sys.executable, str(BARE), "--ranks", str(ranks), "--threads", str(threads), "--hidden",
                  str(hidden), "--batch", str(batch), "--steps", str(steps), "--warmup", str(warmup),
                  "--port", str(free_port())])  # fmt: skip
    return float(re.search(r"steps-per-s (\S+)", output).group(1))


def same_work_steps_per_s(project: Path) -> float:
    """The hand-written loop doing the rendered project's work (same_work_ddp.py), same batch, data and epochs."""
    output = run([sys.executable, str(SAME_WORK), "--package", package_of(project), "--batch", str(GLOBAL_BATCH),
                  "--samples", str(SAME_WORK_SAMPLES), "--epochs", "4", "--port", str(free_port())])  # fmt: skip
    return float(re.search(r"steps-per-s (\S+)", output).group(1))


# -- 1a-1d. the engine against the same work by hand; its loader, and what per-sample seeding costs ---------
SAME_WORK_MARKERS = ("<!-- bench:same-work:start -->", "<!-- bench:same-work:end -->")


def same_work(project: Path, reps: int) -> dict:
    rendered = functools.partial(rendered_steps_per_s, project, samples=SAME_WORK_SAMPLES)
    throughput = interleaved(reps, {"rendered": rendered, "same work": lambda: same_work_steps_per_s(project),
                                    "training_step": lambda: rendered_general_steps_per_s(project)})  # fmt: skip
    seeding = json.loads(run([sys.executable, str(HERE / "sample_seeded.py"), "--package", package_of(project),
                              "--reps", str(max(reps, 5))]))  # fmt: skip
    in_process = json.loads(run([sys.executable, str(HERE / "in_process_steps.py"), "--package", package_of(project),
                                 "--epochs", str(reps + 1), "--port", str(free_port())]))  # fmt: skip
    return {"throughput": throughput, "seeding": seeding, "in process": in_process}


def same_work_markdown(result: dict) -> str:
    runs = result["throughput"]
    rates = {name: statistics.median(values) for name, values in runs.items()}
    # Each repetition's runs follow each other within a minute: its own ratio is free of the drift between them.
    paired = {name: [value / same for value, same in zip(runs[name], runs["same work"], strict=True)]
              for name in ("rendered", "training_step")}  # fmt: skip
    per_run = {name: spread(ratios) for name, ratios in paired.items()}
    seeding, steps = result["seeding"], result["in process"]

    def epochs(name: str) -> str:
        return spread(steps["ratios"][name])

    us = seeding["us_per_batch"]
    lines = [
        f"Machine: {machine()}. Medians of {len(runs['same work'])} interleaved repetitions; in 1a and 1b the "
        "ratio is the median of the repetitions' own ratios, whose range is in brackets.",
        "",
        "| measurement | rendered project | same-work loop | ratio | target |",
        "|---|---|---|---|---|",
        f"| 1a. steady-state steps/s, 2 gloo ranks x 1 thread, batch 64 | {rates['rendered']:.0f} | "
        f"{rates['same work']:.0f} | {statistics.median(paired['rendered']):.2f} ({per_run['rendered']}) "
        "| none (the toy) |",
        f"| 1b. the same through training_step and validation_step | {rates['training_step']:.0f} | "
        f"{rates['same work']:.0f} | {statistics.median(paired['training_step']):.2f} "
        f"({per_run['training_step']}) | none (the toy) |",
        f"| 1c. one rank, in one process, turns of {steps['turn']} steps: us a step (loader and step) | "
        f"{steps['us_per_step']['engine']:.0f} | {steps['us_per_step']['same work']:.0f} | "
        f"{steps['ratio']['engine']:.3f} ({epochs('engine')}: the epochs' own) | none (the toy) |",
        f"| 1d. the same, a second copy of the same-work loop in the engine's place: what 1c reads for no "
        f"difference | {steps['us_per_step']['same work again']:.0f} | {steps['us_per_step']['same work']:.0f} | "
        f"{steps['ratio']['same work again']:.3f} ({epochs('same work again')}) | none |",
        "",
        f"The engine's training loader and per-sample seeding, per batch of {seeding['batch']} on one rank "
        f"without workers (medians of {seeding['reps']} interleaved repetitions of 1024 batches):",
        "",
        "| dataset | `training_loader` (SampleSeeded) | the same, unseeded | plain DataLoader | ratio to "
        "DataLoader | seeding adds |",
        "|---|---|---|---|---|---|",
    ]
    for kind, label in (("batched", "the default data through a `__getitems__` (a batch at a time)"),
                        ("one by one", "the default data, `__getitem__` (a sample at a time)")):  # fmt: skip
        seeded, unseeded, plain = (us[f"{kind}, {name}"] for name in ("SampleSeeded", "unseeded", "plain indexing"))
        lines.append(f"| {label} | {seeded:.1f} us | {unseeded:.1f} us | {plain:.1f} us | {seeded / plain:.2f} | "
                     f"{seeded - unseeded:.1f} us a batch |")  # fmt: skip
    return "\n".join(lines) + "\n"


# -- 0. real work: a small CNN through the engine against the DDP tutorial's way (cnn_recipe.py, cnn_tutorial.py) --
CNN_MARKERS = ("<!-- bench:cnn:start -->", "<!-- bench:cnn:end -->")
CNN_SAMPLES = 4096  # 64 steps an epoch at the global batch of 64


def engine_cnn_steps_per_s(project: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    return rendered_steps_per_s(project, "--recipe", "cnn_recipe", "--lr", "0.001", env=env, samples=CNN_SAMPLES)


def tutorial_cnn_steps_per_s() -> float:
    output = run([sys.executable, str(HERE / "cnn_tutorial.py"), "--batch", str(GLOBAL_BATCH), "--samples",
                  str(CNN_SAMPLES), "--epochs", "4", "--port", str(free_port())])  # fmt: skip
    return float(re.search(r"steps-per-s (\S+)", output).group(1))


CNN_EPOCHS_IN_PROCESS = 31  # 30 measured epochs of 8 rounds: 240 paired turns


def cnn(project: Path, reps: int) -> dict:
    runs = interleaved(reps, {"engine": lambda: engine_cnn_steps_per_s(project), "tutorial": tutorial_cnn_steps_per_s})
    in_process = json.loads(run([sys.executable, str(HERE / "in_process_steps.py"), "--package", package_of(project),
                                 "--work", "cnn", "--ranks", "2", "--epochs", str(CNN_EPOCHS_IN_PROCESS),
                                 "--port", str(free_port())]))  # fmt: skip
    return {"runs": runs, "in process": in_process}


def cnn_markdown(result: dict) -> str:
    runs, steps = result["runs"], result["in process"]
    ratios = [engine / tutorial for engine, tutorial in zip(runs["engine"], runs["tutorial"], strict=True)]
    us, ratio = steps["us_per_step"], steps["ratio"]
    rounds = steps["epochs"] * -(-steps["steps"] // steps["turn"])
    return "\n".join([
        f"Machine: {machine()}.",
        "",
        "| measurement | rendered project | DDP tutorial's way | ratio | target |",
        "|---|---|---|---|---|",
        f"| 0a. small CNN, 3x24x24, random flip per `__getitem__`, AdamW + cosine: steady-state steps/s, 2 gloo "
        f"ranks x 1 thread, batch 64, whole runs | {statistics.median(runs['engine']):.1f} | "
        f"{statistics.median(runs['tutorial']):.1f} | {statistics.median(ratios):.3f} (the {len(ratios)} runs' "
        f"own: {spread(ratios)}) | >= 0.98 (goal >= 1.0) |",
        f"| 0b. the same in the same 2 ranks, turns of {steps['turn']} steps: us a step (loader and step) | "
        f"{us['engine']:.0f} | {us['same work']:.0f} | {ratio['engine']:.3f} (median of {rounds} paired turns) | "
        ">= 0.98 (goal >= 1.0) |",
        f"| 0c. the same, a second copy of the tutorial's loop in the engine's place: what 0b reads for no "
        f"difference | {us['same work again']:.0f} | {us['same work']:.0f} | {ratio['same work again']:.3f} | none |",
    ]) + "\n"  # fmt: skip


# -- 7. memory: what each rank holds under ddp and fsdp (memory_recipe.py) ----------------------------------------
MEMORY_MARKERS = ("<!-- bench:memory:start -->", "<!-- bench:memory:end -->")
MEMORY_RANKS = (1, 2, 4)
MEMORY_SAMPLES = 512  # 8 steps an epoch at the global batch of 64


def memory_run(project: Path, parallelism: str, ranks: int, epochs: int = 1) -> dict:
    """One training run of memory_recipe.py: each rank's bytes held after the first step, and (epochs > 1) the
    steps/s of the last epoch (the first warms up). No checkpoint but the run's model.pt."""
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    with tempfile.TemporaryDirectory() as output:
        env["BENCH_MEMORY_FILE"] = str(Path(output) / "memory")
        args = train_args(project, Path(output) / "run", "--recipe", "memory_recipe", "--lr", "0.001", "--parallelism",
                          parallelism, "--epochs", str(epochs), "--samples", str(MEMORY_SAMPLES),
                          "--checkpoint-every", "1000000", ranks=ranks)  # fmt: skip
        run([sys.executable, "-m", f"{package_of(project)}.train", *args], cwd=project, env=env)
        held = [json.loads((Path(output) / f"memory.rank{rank}.json").read_text()) for rank in range(ranks)]
        with open(Path(output) / "run" / "metrics.csv", encoding="utf-8") as handle:
            last = list(csv.DictReader(handle))[-1]
    return {"ranks": held, "steps_per_s": float(last["samples_per_s"]) / GLOBAL_BATCH}


def memory(project: Path, reps: int) -> dict:
    """Bytes for 1, 2 and 4 ranks (the same in every run), and fsdp's steps/s against ddp's at 2 ranks, interleaved."""
    held = {f"{parallelism} x {ranks}": memory_run(project, parallelism, ranks)["ranks"]
            for ranks in MEMORY_RANKS if ranks != 2 for parallelism in ("ddp", "fsdp")}  # fmt: skip
    timed: dict[str, list[dict]] = {"ddp": [], "fsdp": []}
    for rep in range(reps):
        for parallelism in ("ddp", "fsdp") if rep % 2 == 0 else ("fsdp", "ddp"):
            timed[parallelism].append(memory_run(project, parallelism, 2, epochs=2))
    held.update({f"{parallelism} x 2": runs[0]["ranks"] for parallelism, runs in timed.items()})
    rates = {parallelism: [one["steps_per_s"] for one in runs] for parallelism, runs in timed.items()}
    return {"held": held, "steps_per_s": rates}


def memory_markdown(result: dict) -> str:
    held, rates = result["held"], result["steps_per_s"]

    def most(name: str) -> int:  # the rank holding the most: per-rank bytes are the largest of any rank's
        return max(rank["parameters"] + rank["gradients"] + rank["optimizer"] for rank in held[name])

    def mb(count: float) -> str:
        return f"{count / 1e6:.1f} MB"

    count = held["ddp x 1"][0]["parameter_count"]
    targets = {1: "", 2: "<= 0.55", 4: "<= 0.3"}
    lines = [
        f"Model: {count / 1e6:.1f} M parameters (fp32), AdamW; bytes held by each rank after the first step "
        "(the largest of any rank's; local shards), gloo ranks on the CPU.",
        "",
        "| ranks | ddp: parameters + gradients + optimizer | fsdp: parameters + gradients + optimizer | "
        "fsdp / ddp | target |",
        "|---|---|---|---|---|",
    ]
    for ranks in MEMORY_RANKS:
        parts = {}
        for parallelism in ("ddp", "fsdp"):
            rank = max(
                held[f"{parallelism} x {ranks}"], key=lambda r: r["parameters"] + r["gradients"] + r["optimizer"]
            )
            parts[parallelism] = (f"{mb(most(f'{parallelism} x {ranks}'))} ({mb(rank['parameters'])} + "
                                  f"{mb(rank['gradients'])} + {mb(rank['optimizer'])})")  # fmt: skip
        ratio = most(f"fsdp x {ranks}") / most(f"ddp x {ranks}")
        lines.append(f"| {ranks} | {parts['ddp']} | {parts['fsdp']} | {ratio:.3f} | {targets[ranks] or 'none'} |")
    speed = [fsdp / ddp for fsdp, ddp in zip(rates["fsdp"], rates["ddp"], strict=True)]
    lines += [
        "",
        "| measurement | fsdp | ddp | ratio | target |",
        "|---|---|---|---|---|",
        f"| steps/s, 2 gloo ranks x 1 thread, batch 64, the same model (medians of {len(speed)} interleaved runs; "
        f"each run's ratio in brackets) | {statistics.median(rates['fsdp']):.2f} | "
        f"{statistics.median(rates['ddp']):.2f} | {statistics.median(speed):.2f} "
        f"({', '.join(f'{ratio:.2f}' for ratio in speed)}) | none |",
    ]
    return "\n".join(lines) + "\n"


# -- 2. launch to the first optimizer step ---------------------------------------------------------
def rendered_launch_s(project: Path) -> float:
    with tempfile.TemporaryDirectory() as output:
        args = train_args(project, Path(output), "--epochs", "1", "--samples", "640")
        started = time.time()
        run(["bash", str(project / "scripts" / "train.sh"), *args], cwd=project)
        log = (Path(output) / "logs" / "rank0.log").read_text(encoding="utf-8")
    return float(re.search(r"first optimizer step at (\S+)", log).group(1)) - started


def bare_launch_s() -> float:
    started = time.time()
    output = run([sys.executable, str(BARE), "--steps", "1", "--warmup", "1", "--port", str(free_port())])
    return float(re.search(r"first-step (\S+)", output).group(1)) - started


def import_torch_s() -> float:
    started = time.perf_counter()
    run([sys.executable, "-c", "import torch"])
    return time.perf_counter() - started


# -- 3b. what fsync costs per checkpoint ------------------------------------------------------------
def checkpoint_state(project: Path) -> dict:
    """A real checkpoint of the default model: the full training state the rendered loop saves."""
    import torch

    with tempfile.TemporaryDirectory() as output:
        args = train_args(project, Path(output), "--epochs", "1", "--samples", "640")
        run([sys.executable, "-m", f"{package_of(project)}.train", *args], cwd=project)
        newest = sorted((Path(output) / "checkpoints").glob("step-*.pt"))[-1]
        return torch.load(newest, weights_only=True)


def save_s(project: Path, state: dict, folder: Path, durable: bool) -> float:
    """One checkpoint save: the project's own write_durably, or the same write without any fsync."""
    import importlib

    import torch

    files = importlib.import_module(f"{package_of(project)}.engine.files")
    path = folder / "step-00000001.pt"
    started = time.perf_counter()
    if durable:
        files.write_durably(path, lambda handle: torch.save(state, handle))
    else:
        with open(path.with_name(path.name + ".tmp"), "wb") as handle:
            torch.save(state, handle)
        os.replace(path.with_name(path.name + ".tmp"), path)
    return time.perf_counter() - started


# -- 6. checkpoints at scale: tests/bench/checkpoints.py --------------------------------------------------------
CHECKPOINT_SIZES_MB = (4, 64, 512)
CHECKPOINT_MARKERS = ("<!-- bench:checkpoints:start -->", "<!-- bench:checkpoints:end -->")


def checkpoint_scaling(project: Path, reps: int) -> dict:
    """save_atomic and load against plain torch, per state size, in a process of their own (it needs ~2 GB)."""
    (ROOT / ".bench").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=ROOT / ".bench") as scratch:  # the disk the project lives on
        output = run([sys.executable, str(HERE / "checkpoints.py"), "--package", package_of(project), "--folder",
                      scratch, "--reps", str(reps), "--sizes-mb", *map(str, CHECKPOINT_SIZES_MB)])  # fmt: skip
    return json.loads(output)["sizes"]


def checkpoint_markdown(sizes: dict) -> str:
    lines = [
        "| state | `save_atomic` | `torch.save` + fsync | save ratio | `load` | `torch.load` | load ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for megabytes, result in sizes.items():
        m = result["medians"]
        lines.append(
            f"| {megabytes} MB ({result['reps']} saves and loads each) | {m['save_atomic'] * 1e3:.1f} ms | "
            f"{m['torch.save + fsync'] * 1e3:.1f} ms | {result['save ratio']:.2f} | {m['load'] * 1e3:.1f} ms | "
            f"{m['torch.load'] * 1e3:.1f} ms | {result['load ratio']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def write_docs_section(markers: tuple[str, str], text: str) -> None:
    """Replace what lies between the two markers in docs/performance.md (nothing, if the page lacks them)."""
    page = ROOT / "docs" / "performance.md"
    start, end = markers
    content = page.read_text(encoding="utf-8")
    if start in content and end in content:
        page.write_text(content.split(start)[0] + start + "\n" + text + end + content.split(end)[1], encoding="utf-8")


# -- 4. render cost ----------------------------------------------------------------------------------
def trivial_template(folder: Path) -> Path:
    folder.mkdir()
    (folder / "copier.yml").write_text("name:\n  type: str\n  default: x\n", encoding="utf-8")
    (folder / "hello.txt.jinja").write_text("hello {{ name }}\n", encoding="utf-8")
    for command in (["init", "-q"], ["add", "-A"], ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "t"]):
        run(["git", *command], cwd=folder)
    return folder


def render_s(template: Path) -> float:
    with tempfile.TemporaryDirectory() as target:
        started = time.perf_counter()
        run([sys.executable, "-m", "copier", "copy", "--quiet", "--defaults", "--vcs-ref", "HEAD", str(template),
             str(Path(target) / "p")])  # fmt: skip
        return time.perf_counter() - started


def spread(ratios: list[float]) -> str:
    """The range of single readings, beside their median: how far one run of its own could mislead."""
    return f"{min(ratios):.3f} to {max(ratios):.3f}"


def interleaved(reps: int, pairs: dict) -> dict[str, list[float]]:
    """Run every measurement once per repetition, alternating the order, so drift hits all alike."""
    samples: dict[str, list[float]] = {name: [] for name in pairs}
    for rep in range(reps):
        names = list(pairs) if rep % 2 == 0 else list(reversed(pairs))
        for name in names:
            samples[name].append(pairs[name]())
    return samples


def machine() -> str:
    model = ""
    if Path("/proc/cpuinfo").exists():
        found = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
        model = found.group(1).strip() if found else ""
    import torch

    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores {model}, Python " \
           f"{platform.python_version()}, torch {torch.__version__}"  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--project", type=Path, required=True)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--ci-cold-s", type=float, help="wall time of a cold `nox` run, measured separately")
    parser.add_argument("--ci-warm-s", type=float, help="wall time of a warm `nox -R` run, measured separately")
    parser.add_argument(
        "--only", choices=["cnn", "checkpoints", "same-work", "memory"], help="run one section, update only its table"
    )
    args = parser.parse_args()
    project = args.project.resolve()
    reps = args.reps
    sections = {
        "cnn": (lambda: cnn(project, reps), CNN_MARKERS, cnn_markdown),
        "same-work": (lambda: same_work(project, reps), SAME_WORK_MARKERS, same_work_markdown),
        "memory": (lambda: memory(project, reps), MEMORY_MARKERS, memory_markdown),
    }
    for name, (measure, markers, markdown_of) in sections.items():
        if args.only in (None, name):
            result = measure()
            (ROOT / ".bench").mkdir(exist_ok=True)
            (ROOT / ".bench" / f"{name}.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
            write_docs_section(markers, markdown_of(result))
            print(markdown_of(result))
    if args.only in (None, "checkpoints"):
        checkpoints = checkpoint_markdown(checkpoint_scaling(project, reps))
        write_docs_section(CHECKPOINT_MARKERS, checkpoints)
        print(checkpoints)
    if args.only:
        return 0

    throughput = interleaved(reps, {"rendered": lambda: rendered_steps_per_s(project), "bare": bare_steps_per_s})
    launch = interleaved(reps + 2, {"rendered": lambda: rendered_launch_s(project), "bare": bare_launch_s,
                                    "import torch": import_torch_s})  # fmt: skip
    wide = interleaved(reps, {
        "1 rank x 2 threads": lambda: bare_steps_per_s(1, 2, 4096, 256, 30, 3) * 256,
        "2 ranks x 1 thread": lambda: bare_steps_per_s(2, 1, 4096, 256, 30, 3) * 256,
        "rendered, 2 ranks": lambda: rendered_wide_steps_per_s(project) * 256,
    })  # fmt: skip
    state = checkpoint_state(project)
    (ROOT / ".bench").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=ROOT / ".bench") as scratch:  # the disk the project lives on, not a tmpfs
        folder = Path(scratch)
        saves = interleaved(reps * 10, {"with fsync": lambda: save_s(project, state, folder, True),
                                        "without fsync": lambda: save_s(project, state, folder, False)})  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        trivial = trivial_template(Path(scratch) / "trivial")
        render = interleaved(reps + 2, {"template": lambda: render_s(ROOT), "trivial": lambda: render_s(trivial)})

    median = {group: {name: statistics.median(values) for name, values in samples.items()}
              for group, samples in {"throughput": throughput, "launch": launch, "wide": wide,
                                     "render": render, "saves": saves}.items()}  # fmt: skip
    ratios = {
        "throughput (rendered / bare, the toy)": median["throughput"]["rendered"] / median["throughput"]["bare"],
        "launch to first step (rendered / bare, target <= 1.15)": median["launch"]["rendered"]
        / median["launch"]["bare"],
        "render (template / trivial, target <= 2)": median["render"]["template"] / median["render"]["trivial"],
        "wide model (2 ranks / 1 rank)": median["wide"]["2 ranks x 1 thread"] / median["wide"]["1 rank x 2 threads"],
        "wide model throughput (rendered / bare)": median["wide"]["rendered, 2 ranks"]
        / median["wide"]["2 ranks x 1 thread"],
    }
    results = {"machine": machine(), "reps": reps, "samples": {"throughput": throughput, "launch": launch,
               "wide": wide, "render": render, "saves": saves}, "medians": median, "ratios": ratios,
               "ci": {"cold_s": args.ci_cold_s, "warm_s": args.ci_warm_s}}  # fmt: skip
    table = markdown(results)
    out = ROOT / ".bench"
    out.mkdir(exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    (out / "results.md").write_text(table, encoding="utf-8")
    page = ROOT / "docs" / "performance.md"
    text = page.read_text(encoding="utf-8")
    start, end = "<!-- bench:start -->", "<!-- bench:end -->"
    if start in text and end in text:
        page.write_text(text.split(start)[0] + start + "\n" + table + end + text.split(end)[1], encoding="utf-8")
    print(table)
    return 0


def markdown(results: dict) -> str:
    m = results["medians"]
    lines = [
        f"Machine: {results['machine']}. Medians of {results['reps']} interleaved repetitions "
        f"({results['reps'] + 2} for launch and render).",
        "",
        "| measurement | rendered project | baseline | ratio | target |",
        "|---|---|---|---|---|",
        f"| 1. steady-state steps/s, 2 gloo ranks x 1 thread, batch 64 | {m['throughput']['rendered']:.0f} | "
        f"{m['throughput']['bare']:.0f} (bare loop) | {m['throughput']['rendered'] / m['throughput']['bare']:.2f} "
        "| none (the toy) |",
        f"| 2. launch to first optimizer step, s | {m['launch']['rendered']:.2f} (train.sh) | "
        f"{m['launch']['bare']:.2f} (bare loop); `import torch` alone {m['launch']['import torch']:.2f} | "
        f"{m['launch']['rendered'] / m['launch']['bare']:.2f} | <= 1.15 |",
        f"| 3. wide model (hidden 4096, batch 256) samples/s | 2 ranks x 1 thread: "
        f"{m['wide']['2 ranks x 1 thread']:.0f} | 1 rank x 2 threads: {m['wide']['1 rank x 2 threads']:.0f} | "
        f"{m['wide']['2 ranks x 1 thread'] / m['wide']['1 rank x 2 threads']:.2f} | none |",
        f"| 3a. wide model samples/s, 2 ranks | {m['wide']['rendered, 2 ranks']:.0f} | "
        f"{m['wide']['2 ranks x 1 thread']:.0f} (bare loop) | "
        f"{m['wide']['rendered, 2 ranks'] / m['wide']['2 ranks x 1 thread']:.2f} | none (the toy's data) |",
        f"| 4. `copier copy --defaults`, s | {m['render']['template']:.2f} | {m['render']['trivial']:.2f} "
        f"(one-file template) | {m['render']['template'] / m['render']['trivial']:.2f} | <= 2 |",
    ]
    # The default config checkpoints once per epoch: 2048 samples / 64 per step = 32 steps.
    epoch_s = 32 / m["throughput"]["rendered"]
    fsync_s = m["saves"]["with fsync"] - m["saves"]["without fsync"]
    lines.append(
        f"| 3b. checkpoint save (temp file, fsync, replace, fsync folder), ms | {m['saves']['with fsync'] * 1e3:.2f} | "
        f"{m['saves']['without fsync'] * 1e3:.2f} (same write, no fsync) | "
        f"{m['saves']['with fsync'] / m['saves']['without fsync']:.2f} | fsync adds {fsync_s * 1e3:.2f} ms per "
        f"checkpoint, {fsync_s / epoch_s:.1%} of a default epoch ({epoch_s * 1e3:.0f} ms) |"
    )
    ci = results["ci"]
    if ci["cold_s"]:
        lines.append(f"| 5. whole default `nox` run, min | cold {ci['cold_s'] / 60:.1f}, warm "
                     f"{(ci['warm_s'] or 0) / 60:.1f} | | | <= 12 cold, <= 6 warm |")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
