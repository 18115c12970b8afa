"""GPU runs, small enough for a few minutes on a GPU machine (`pytest -m gpu`); each skips, with its reason, where
there are too few CUDA GPUs. tests/test_devices.py checks the same rules on the CPU, as functions.
"""

import subprocess
import sys

import pytest
import torch

from conftest import (
    CONFIG,
    DRILL,
    PACKAGE,
    RENDERED_BACKEND,
    ROOT,
    assert_ok,
    assert_same_parameters,
    checkpoints,
    crashing,
    final_parameters,
    free_port,
    run_module,
    train,
    train_command,
)

GPUS = torch.cuda.device_count()
AMPERE = GPUS > 0 and torch.cuda.get_device_capability(0) >= (8, 0)
pytestmark = pytest.mark.gpu


def needs(count: int) -> pytest.MarkDecorator:
    return pytest.mark.skipif(GPUS < count, reason=f"needs {count} CUDA GPU(s); this machine has {GPUS}")


needs_bf16 = pytest.mark.skipif(not AMPERE, reason="bf16 needs compute capability 8.0 (Ampere) or newer")


def on_gpus(*args: str) -> tuple[str, ...]:
    return ("--device", "cuda", "--backend", RENDERED_BACKEND, *args)


def saved_on(path) -> set[str]:
    seen = set()
    torch.load(path, map_location=lambda storage, location: seen.add(location) or storage, weights_only=True)
    return seen


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--nproc-per-node", "1"], marks=needs(1), id="1-gpu"),
        pytest.param(["--nproc-per-node", "2", "--precision", "fp16"], marks=needs(2), id="fp16-2-ranks"),
        pytest.param(["--nproc-per-node", "2", "--precision", "bf16"], marks=[needs(2), needs_bf16], id="bf16-2-ranks"),
        pytest.param(
            ["--nproc-per-node", "1", "--parallelism", "ddp_model_parallel"], marks=needs(2), id="split-model"
        ),
    ],
)
def test_gpu_training_saves_cpu_tensors_and_each_rank_s_own_random_streams(tmp_path, args):
    assert_ok(train(tmp_path, *on_gpus(*args)))
    assert all(value.isfinite().all() for value in final_parameters(tmp_path).values())
    for path in (tmp_path / "model.pt", tmp_path / "best.pt", checkpoints(tmp_path)[0]):
        assert saved_on(path) == {"cpu"}, path  # loads on a machine without these GPUs
    streams = torch.load(checkpoints(tmp_path)[0], weights_only=True)["rng"]
    split = "ddp_model_parallel" in args
    assert all(set(rank["cuda"]) == ({"devices[0]", "devices[-1]"} if split else {"devices[0]"}) for rank in streams)


@needs(2)
def test_an_fp16_run_on_2_gpus_resumes_bitwise_equal_to_an_uninterrupted_one(tmp_path):
    """Rank 1 dies before step 20; the restart resumes from step 16's checkpoint, GradScaler state included."""
    settings = on_gpus("--nproc-per-node", "2", "--precision", "fp16", "--deterministic")
    assert_ok(train(tmp_path / "whole", *settings))
    crashed = train(tmp_path / "restarted", *settings, *DRILL, "--max-restarts", "1", env=crashing(20))
    assert_ok(crashed)
    assert "resumed from" in crashed.stdout and "step-00000016-" in crashed.stdout
    assert_same_parameters(tmp_path / "whole", tmp_path / "restarted")


@needs(1)
def test_a_run_without_fp16_continues_in_fp16_on_a_gpu(tmp_path):
    assert_ok(train(tmp_path, *on_gpus("--nproc-per-node", "1", "--epochs", "1")))
    resumed = train(tmp_path, *on_gpus("--nproc-per-node", "1", "--epochs", "2", "--precision", "fp16"))
    assert_ok(resumed)
    assert "precision changed from no to fp16 on resume" in resumed.stdout


@needs(2)
@pytest.mark.skipif(sys.platform == "win32", reason="torchrun is the Linux launcher")
def test_torchrun_on_2_gpus(tmp_path):
    port = str(free_port())
    program = train_command(tmp_path, *on_gpus())[3:]
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "-m", f"{PACKAGE}.train",
               *program]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert_ok(result)
    assert "started by torchrun" in (tmp_path / "logs" / "rank1.log").read_text(encoding="utf-8")


@needs(1)
def test_the_smoke_check_passes_on_this_machine_s_gpus(tmp_path):
    text = CONFIG.read_text(encoding="utf-8")
    settings = {"device": '"cuda"', "backend": f'"{RENDERED_BACKEND}"', "nproc_per_node": str(min(GPUS, 2))}
    if not AMPERE:
        settings["precision"] = '"fp16"'  # bf16 is refused before Ampere
    for key, value in settings.items():
        line = next(line for line in text.splitlines() if line.startswith(f"{key} ="))
        text = text.replace(line, f"{key} = {value}")
    config = tmp_path / "train.toml"
    config.write_text(text, encoding="utf-8")
    result = run_module("doctor", "--smoke", "--config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 0: cuda:0" in result.stdout
