"""GPU runs; each skips with its reason on machines without enough CUDA GPUs."""

import pytest
import torch

from conftest import RENDERED_BACKEND, assert_ok, final_parameters, train

requires_gpus = {
    count: pytest.mark.skipif(
        torch.cuda.device_count() < count,
        reason=f"needs {count} CUDA GPU(s); this machine has {torch.cuda.device_count()}",
    )
    for count in (1, 2)
}

GPU_RUNS = [
    pytest.param(["--nproc-per-node", "1"], marks=requires_gpus[1], id="1-gpu"),
    pytest.param(["--nproc-per-node", "2"], marks=requires_gpus[2], id="2-gpus-ddp"),
    pytest.param(
        ["--nproc-per-node", "1", "--parallelism", "ddp_model_parallel"],
        marks=requires_gpus[2],
        id="split-model-over-2-gpus",
    ),
    pytest.param(
        ["--nproc-per-node", "1", "--precision", "fp16"],
        marks=requires_gpus[1],
        id="fp16-grad-scaler",
    ),
    pytest.param(
        ["--nproc-per-node", "1", "--precision", "bf16"],
        marks=requires_gpus[1],
        id="bf16-autocast",
    ),
]


@pytest.mark.gpu
@pytest.mark.parametrize("args", GPU_RUNS)
def test_gpu_training(tmp_path, args):
    assert_ok(train(tmp_path, "--device", "cuda", "--backend", RENDERED_BACKEND, *args))
    assert all(value.isfinite().all() for value in final_parameters(tmp_path).values())
