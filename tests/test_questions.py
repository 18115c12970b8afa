"""The questionnaire: impossible answers are refused with a message that names the fix,
and a refusal leaves nothing behind."""

from __future__ import annotations

import pytest
import yaml

from render import ANSWER_SETS, TEMPLATE, render

REFUSED = {
    "nccl-on-windows": (
        {"gpus_per_node": 2, "cuda": "cu126", "backend": "nccl"},
        "nccl is never built for Windows",
        "pick backend=gloo or auto",
    ),
    "nccl-without-gpus": ({"target_os": "linux", "backend": "nccl"}, "nccl only runs on CUDA GPUs", "backend=gloo"),
    "gpus-with-cpu-build": (
        {"gpus_per_node": 2, "cuda": "cpu"},
        "gpus_per_node=2 needs a CUDA build but cuda=cpu",
        "pick cu126 or cu130 for torch 2.13.0",
    ),
    "unpublished-cuda-tag": (
        {"gpus_per_node": 1, "cuda": "cu118"},
        "torch 2.13.0 has no cu118 wheels; pick cu126 or cu130",
        "RTX 50xx (Blackwell) needs cu128 or newer",
    ),
    "torch-2.8-on-windows": (
        {"torch_version": "2.8.0"},
        "torch 2.8.x Windows wheels cannot start gloo",
        "pick 2.7.1, or 2.10.0 or newer",
    ),
    "torch-2.9-on-both": (
        {"torch_version": "2.9.1", "target_os": "both"},
        "makeDeviceForHostname(): unsupported gloo device",
        "or target_os=linux",
    ),
    "torch-too-old": ({"torch_version": "2.3.1"}, "outside the supported series 2.4 to 2.14", "pick 2.13.0"),
    "torch-not-on-index": ({"torch_version": "2.15.0"}, "not on PyTorch's wheel index yet", "pick 2.14.x"),
    "torch-malformed": ({"torch_version": "2.13"}, "must look like 2.13.0", "three numbers"),
    "python-without-wheels": ({"python_version": "3.9"}, "no wheels for Python 3.9", "pick one of 3.10, 3.11"),
    "package-with-dash": ({"package_name": "my-pkg"}, "not a valid Python package name", "for example my_ddp"),
    "package-with-digit-first": (
        {"package_name": "1st"},
        "not a valid Python package name",
        "not starting with a digit",
    ),
    "package-is-keyword": ({"package_name": "class"}, "is a Python keyword", "class_ddp"),
    "package-shadows-torch": ({"package_name": "torch"}, "would shadow an installed module", "my_torch"),
    "port-too-low": ({"master_port": 80}, "between 1024 and 65535, got 80", "29500"),
    "port-too-high": ({"master_port": 70000}, "between 1024 and 65535, got 70000", "29500"),
    "multi-node-on-loopback": ({"nnodes": 2}, "nnodes=2 needs the real IP address of node 0", "192.168.1.10"),
    "localhost": ({"master_addr": "localhost"}, "Use 127.0.0.1 instead of localhost", "IPv6"),
    "torchrun-on-windows": ({"launcher": "torchrun"}, "torchrun cannot start on Windows", "pick launcher=spawn"),
    "model-parallel-one-gpu": (
        {"gpus_per_node": 1, "cuda": "cu126", "parallelism": "ddp_model_parallel"},
        "ddp_model_parallel needs at least 2 GPUs per node",
        "pick parallelism=ddp",
    ),
    "model-parallel-too-many-processes": (
        {"gpus_per_node": 4, "cuda": "cu126", "parallelism": "ddp_model_parallel", "nproc_per_node": 3},
        "3 processes need 6 GPUs but gpus_per_node=4",
        "set nproc_per_node to 2",
    ),
    "fp16-on-cpu": ({"mixed_precision": "fp16"}, "fp16 autocast needs CUDA GPUs", "mixed_precision=bf16"),
    "more-processes-than-gpus": (
        {"gpus_per_node": 2, "cuda": "cu126", "nproc_per_node": 3},
        "3 processes need 3 GPUs but gpus_per_node=2",
        "set nproc_per_node to 2",
    ),
    "negative-gpus": ({"gpus_per_node": -1}, "gpus_per_node must be 0 or more", "0 trains on the CPU"),
    "zero-processes": ({"nproc_per_node": 0}, "nproc_per_node must be at least 1", "got 0"),
    "zero-nodes": ({"nnodes": 0}, "nnodes must be at least 1", "got 0"),
    "bad-project-name": ({"project_name": "my project"}, "not a usable project name", "for example my-ddp"),
}


@pytest.mark.parametrize("answers,problem,fix", REFUSED.values(), ids=REFUSED.keys())
def test_impossible_answers_are_refused_with_the_fix_and_leave_nothing(tmp_path, answers, problem, fix):
    destination = tmp_path / "project"
    with pytest.raises(ValueError) as refusal:
        render(destination, answers)
    message = " ".join(str(refusal.value).split())
    assert problem in message
    assert fix in message
    assert not destination.exists()


ACCEPTED = {
    "torch-2.8-on-linux": {"target_os": "linux", "torch_version": "2.8.0"},
    "experimental-tag": {"gpus_per_node": 1, "cuda": "cu132"},
    "oldest-series": {"torch_version": "2.4.1", "gpus_per_node": 1, "cuda": "cu118", "python_version": "3.9"},
    "multi-node-real-ip": {"nnodes": 2, "master_addr": "192.168.1.10"},
    "gpus-default-to-their-count": {"gpus_per_node": 3},
    **ANSWER_SETS,
}


@pytest.mark.parametrize("answers", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_possible_answers_render(tmp_path, answers):
    render(tmp_path / "project", answers)
    recorded = yaml.safe_load((tmp_path / "project" / ".copier-answers.yml").read_text(encoding="utf-8"))
    assert {key: recorded[key] for key in answers} == answers


def test_defaults_follow_earlier_answers(tmp_path):
    render(tmp_path / "p", {"gpus_per_node": 4, "parallelism": "ddp_model_parallel", "target_os": "linux"})
    answers = yaml.safe_load((tmp_path / "p" / ".copier-answers.yml").read_text(encoding="utf-8"))
    assert answers["nproc_per_node"] == 2  # two GPUs per process
    assert answers["cuda"] == "cu126"  # the recommended tag of torch 2.13
    assert answers["launcher"] == "torchrun"  # Linux-only projects default to torchrun


def test_every_question_has_help_and_no_setting_needs_trust():
    config = yaml.safe_load((TEMPLATE / "copier.yml").read_text(encoding="utf-8"))
    questions = {k: v for k, v in config.items() if not k.startswith("_") and v.get("when") is not False}
    assert len(questions) == 16
    assert all(question.get("help") for question in questions.values())
    assert not {"_tasks", "_migrations", "_jinja_extensions"} & config.keys()
    assert config["_min_copier_version"] >= "9"
