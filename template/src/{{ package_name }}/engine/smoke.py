"""`python -m <package>.doctor --smoke`: a short real run on this machine's devices, one PASS/FAIL line per step."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import PACKAGE
from .config import Config
from .devices import as_flags, fit_to, gpus_needed
from .launch import spawn, training
from .logs import wrapped
from .ownership import temporary_files_in
from .process_group import LaunchError

STEPS_PER_EPOCH = 10  # two epochs: 20 steps, a checkpoint after the first 10
SLOWER_THAN_BARE = 0.1  # the engine below a tenth of a bare loop's samples/s fails (10-step epochs are noisy)
# One node, two epochs, a checkpoint after each; a fresh run that neither restarts nor draws a bar.
SHORT_RUN = dict(nnodes=1, node_rank=0, master_addr="127.0.0.1", epochs=2, checkpoint_every=0, keep_checkpoints=2)
QUIET_RUN = dict(resume="none", overwrite=False, progress=False, max_restarts=0)


@dataclass
class Step:
    name: str
    passed: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        fix = f"; fix: {self.fix}" if not self.passed and self.fix else ""
        return f"{'PASS' if self.passed else 'FAIL'}  {self.name}: {self.detail}{fix}"


def say(line: str) -> None:
    print(wrapped(line, sys.stdout), flush=True)  # 80 columns on a terminal, one line in a log


def smoke_config(config: Config, output_dir: Path) -> Config:
    """The project's settings for a short run of one node into output_dir, on the devices this machine has."""
    import torch

    gpus = torch.cuda.device_count() if config.device == "cuda" and torch.cuda.is_available() else 0
    if config.device == "cuda" and gpus < gpus_needed(config):
        fitted = fit_to(config, gpus)
        say(
            f"note  the project wants {gpus_needed(config)} GPU(s), {gpus} visible: the smoke check runs with "
            f"{as_flags(fitted)}"
        )
        config = dataclasses.replace(config, **fitted)
    settings = dict(config.settings)
    if "samples" in settings:  # the seed recipe's data set: 10 steps per epoch (a recipe of your own sizes its own)
        settings["samples"] = config.global_batch_size * STEPS_PER_EPOCH
    timeout_s = min(config.timeout_s, 60)  # a rank that hangs fails its step within a minute, not five
    return dataclasses.replace(
        config, settings=settings, output_dir=str(output_dir), timeout_s=timeout_s, **SHORT_RUN, **QUIET_RUN
    )


def probing(config: Config, info) -> int:
    """What every rank of the probe runs: probe.py, imported in the rank (it imports torch, the doctor does not)."""
    from .probe import probe_rank

    return probe_rank(config, info)


def run_phase(config: Config, log: Path, rank_main=training) -> tuple[int, str]:
    """Spawn the ranks with this process's output and theirs in `log` (fd level); (status, its "error: ..." lines)."""
    start = log.stat().st_size if log.exists() else 0
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(log, "ab") as target:
        os.dup2(target.fileno(), 1)
        os.dup2(target.fileno(), 2)
    try:
        status = spawn(config, rank_main)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)
    said = log.read_bytes()[start:].decode("utf-8", errors="replace").splitlines()
    errors = " ".join(line[len("error: ") :] for line in said if line.startswith("error: "))
    return status, errors or f"the ranks exited with status {status}"


def probe_steps(config: Config, status: int, error: str, ranks: list[dict]) -> list[Step]:
    import torch

    precision = f"precision={config.precision}"
    names = ["ranks on their devices", f"a collective over {config.backend}", f"a step under {precision}"]
    names += ["the split model over 2 devices"] if config.parallelism == "ddp_model_parallel" else []
    if status or len(ranks) < config.world_size:
        fix = error if "fix" in error or "use " in error else f"python -m {PACKAGE}.doctor lists what to change"
        return [Step(name, False, f"the probe did not run on all ranks: {error}", fix) for name in names]
    gpus = [device for found in ranks for device in dict.fromkeys(found["devices"]) if device != "cpu"]
    where = ", ".join(f"rank {found['rank']}: {'+'.join(found['devices'])}" for found in ranks)
    if gpus:
        where += f" ({', '.join(f'{d} {torch.cuda.get_device_name(torch.device(d))}' for d in sorted(set(gpus)))})"
    shared = "two ranks share a GPU: give each rank its own (CUDA_VISIBLE_DEVICES, Slurm --gpus-per-task)"
    sums = [found["collective"] for found in ranks]
    failed = [
        f"rank {found['rank']}: {found['collective']['error']}" for found in ranks if "error" in found["collective"]
    ]
    wrong = [s for s in sums if "error" not in s and s["sum"] != s["expected"]]
    summed = f"all_reduce over {config.world_size} rank(s) summed to {sums[0].get('sum')}"
    if failed or wrong:
        summed = "; ".join(failed) or f"all_reduce gave {wrong[0]['sum']}, expected {wrong[0]['expected']}"
    nccl = (
        "nccl: NCCL_DEBUG=INFO shows why; NCCL_P2P_DISABLE=1 works around broken peer-to-peer (some consumer boards,"
        " VMs); or --backend gloo"
    )
    step = ranks[0]["step"]
    step_ok = "error" not in step and step["finite"]
    overflow = "--precision no trains in fp32; under fp16 or bf16 a loss computed in fp32 (recipe.loss) avoids overflow"
    steps = [
        Step(names[0], len(gpus) == len(set(gpus)), where, shared),
        Step(names[1], not failed and not wrong, summed, nccl),
        Step(
            names[2],
            step_ok,
            step.get("error") or f"loss {step['loss']:.4f}, gradients finite: {step['finite']}",
            step["error"].split("fix: ")[-1] if "error" in step else overflow,
        ),
    ]
    if config.parallelism == "ddp_model_parallel":
        spread = step.get("parameter_devices", [])
        steps.append(
            Step(
                names[3],
                step_ok and spread == sorted(set(ranks[0]["devices"])),
                f"parameters on {', '.join(spread) or 'no device'} (rank 0 owns {', '.join(ranks[0]['devices'])})",
                "recipe.model must place its parts on devices[0] and devices[1] (model.ToyModelParallel does)",
            )
        )
    return steps


def same_weights(first: Path, second: Path) -> str | None:
    """None when the two model.pt files hold bitwise equal tensors, else the first that differs."""
    import torch

    one, other = (torch.load(path, map_location="cpu", weights_only=True)["model"] for path in (first, second))
    if one.keys() != other.keys():
        return "the two runs' models have different parameters"
    differing = [name for name in one if not torch.equal(one[name], other[name])]
    return f"{differing[0]} differs ({len(differing)} of {len(one)} tensors)" if differing else None


def training_steps(trained: tuple, resumed: tuple | None, run: Path, again: Path, kept: list) -> list[Step]:
    status, error = trained
    kind = "sharded checkpoint folder" if kept and kept[0].is_dir() else "checkpoint"
    steps = [
        Step(
            f"{2 * STEPS_PER_EPOCH} training steps and a checkpoint",
            not status and len(kept) == 2,
            error if status else f"{len(kept)} {kind}(s), model.pt written",
            error if "fix" in error else f"the rank logs in a run of your own say more: python -m {PACKAGE}.train",
        )
    ]
    if resumed is None:
        return [*steps, Step("bitwise resume", False, "not run: the training run failed", "fix the training run first")]
    status, error = resumed
    difference = error if status else same_weights(run / "model.pt", again / "model.pt")
    equal = "equal bit for bit" if difference is None else f"not equal ({difference})"
    streams = (
        "set deterministic = true (some GPU kernels are not), and draw every random number from torch, numpy or"
        " random, whose streams the checkpoint keeps (not a generator seeded from the clock or os.urandom)"
    )
    return [
        *steps,
        Step(
            "bitwise resume",
            difference is None,
            f"resumed from step {STEPS_PER_EPOCH}: final weights {equal}",
            error if status else streams,
        ),
    ]


def throughput_step(run: Path, ranks: list[dict]) -> Step:
    from . import records

    metrics = run / records.METRICS
    rows = list(csv.DictReader(metrics.read_text(encoding="utf-8").splitlines())) if metrics.exists() else []
    bare = ranks[0].get("bare", {}) if ranks else {}
    if not rows or "samples_per_s" not in bare:
        reason = bare.get("error", "the training run wrote no metrics")
        return Step("throughput", False, f"not measured: {reason}", "fix the steps above first")
    engine = max(float(row["samples_per_s"]) for row in rows)  # the faster epoch: the first one warms up
    ratio = engine / bare["samples_per_s"]
    return Step(
        "throughput",
        ratio >= SLOWER_THAN_BARE,
        f"{engine:.0f} samples/s; a bare DDP loop here: {bare['samples_per_s']:.0f} ({ratio:.2f}x)",
        "most of the time goes outside the model: num_workers > 0 for a Dataset that does real work per "
        "sample, deterministic = false, and a model that is not tiny show where the time goes",
    )


def main(config: Config) -> int:
    """Run the smoke check in a temporary folder, started as training starts its ranks, on the devices this machine
    has (the fix that training's refusal names, where the project wants more GPUs); 1 when a step failed."""
    folder = Path(tempfile.mkdtemp(prefix="smoke-"))
    try:
        # torch's compile cache (torchinductor_<user>) goes with the check's folder; multiprocessing's own stays
        with temporary_files_in(folder):
            steps = run_steps(config, folder)
    except LaunchError as error:  # refused before any rank started (check_meeting_place): so would every launch be
        steps = [Step("starting the ranks", False, str(error))]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for step in steps:
        say(step.line())
    failed = sum(not step.passed for step in steps)
    print(f"{len(steps) - failed} of {len(steps)} steps passed", flush=True)
    return 1 if failed else 0


def run_steps(config: Config, folder: Path) -> list[Step]:
    """The probe (devices, a collective, a step under the precision, a bare DDP loop, timed), 20 training steps with
    a checkpoint after each 10-step epoch, and a run resumed from the first checkpoint, whose final weights must
    equal the first run's bit for bit; each in its own folder under `folder`."""
    from . import checkpoint, records

    smoke = smoke_config(config, folder / "probe-run")
    say(
        f"smoke check: {smoke.world_size} rank(s) on {smoke.device} ({smoke.backend}, precision {smoke.precision}, "
        f"{smoke.parallelism}), recipe {smoke.recipe}"
    )
    output = folder / "output.log"
    probed = run_phase(smoke, output, probing)
    ranks = [json.loads(path.read_text(encoding="utf-8")) for path in (folder / "probe-run").glob("rank*.json")]
    ranks.sort(key=lambda found: found["rank"])
    run, again = folder / "run", folder / "resumed"
    trained = run_phase(dataclasses.replace(smoke, output_dir=str(run)), output)
    kept = checkpoint.existing(run, records.run_id_of(run)) if not trained[0] else []
    resumed = None
    if len(kept) == 2:
        resumed = run_phase(dataclasses.replace(smoke, output_dir=str(again), resume=str(kept[-1])), output)
    return [
        *probe_steps(smoke, *probed, ranks),
        *training_steps(trained, resumed, run, again, kept),
        throughput_step(run, ranks),
    ]
