"""The questionnaire: impossible answers are refused with a message that names the fix,
and a refusal leaves nothing behind."""

from __future__ import annotations

import re

import pytest
import yaml

from render import ANSWER_SETS, TEMPLATE, copy_template, render

# Each refusal: the answers, then what the one-line message must say (it leads with the fix).
REFUSED = {
    "nccl-on-windows": (
        {"gpus_per_node": 2, "cuda": "cu126", "backend": "nccl"},
        "use gloo or auto: Windows has no NCCL",
    ),
    "nccl-without-gpus": ({"target_os": "linux", "backend": "nccl"}, "use gloo or auto: nccl needs GPUs"),
    "gpus-with-cpu-build": ({"gpus_per_node": 2, "cuda": "cpu"}, "use cu126 or 0 GPUs: cpu builds lack CUDA"),
    "unpublished-cuda-tag": ({"gpus_per_node": 1, "cuda": "cu118"}, "use cu126/cu130/cu132: no cu118 for 2.13"),
    "torch-2.8-on-windows": ({"torch_version": "2.8.0"}, "use 2.10+: gloo fails on Windows"),
    "torch-2.9-on-both": ({"torch_version": "2.9.1", "target_os": "both"}, "use 2.10+: gloo fails on Windows"),
    "torch-too-old": ({"torch_version": "2.3.1"}, "use 2.4 to 2.14 (2.13.0 tested)"),
    "torch-not-on-index": ({"torch_version": "2.15.0"}, "use 2.14.x: 2.15 not on the index"),
    "torch-malformed": ({"torch_version": "2.13"}, "use X.Y.Z, for example 2.13.0"),
    "python-without-wheels": ({"python_version": "3.9"}, "use 3.10 to 3.14 for torch 2.13"),
    "package-with-dash": ({"package_name": "my-pkg"}, "use a-z, 0-9, _; no digit first"),
    "package-with-digit-first": ({"package_name": "1st"}, "use a-z, 0-9, _; no digit first"),
    "package-is-keyword": ({"package_name": "class"}, "pick another: it is a keyword"),
    "package-shadows-torch": ({"package_name": "torch"}, "pick another: it shadows a module"),
    "port-too-low": ({"master_port": 80}, "use 1024 to 65535, such as 29500"),
    "port-too-high": ({"master_port": 70000}, "use 1024 to 65535, such as 29500"),
    "multi-node-on-loopback": ({"nnodes": 2}, "use node 0's LAN IP (192.168.1.10)"),
    "localhost": ({"master_addr": "localhost"}, "use 127.0.0.1, not localhost"),
    "multi-node-without-address": ({"nnodes": 2, "master_addr": ""}, "use node 0's LAN IP (192.168.1.10)"),
    "one-node-without-address": ({"master_addr": ""}, "use 127.0.0.1 for one machine"),
    "torchrun-on-windows": ({"launcher": "torchrun"}, "use spawn: torchrun fails on Windows"),
    "model-parallel-one-gpu": (
        {"gpus_per_node": 1, "cuda": "cu126", "parallelism": "ddp_model_parallel"},
        "use ddp: a split model needs 2+ GPUs",
    ),
    "model-parallel-too-many-processes": (
        {"gpus_per_node": 4, "cuda": "cu126", "parallelism": "ddp_model_parallel", "nproc_per_node": 3},
        "use 2 or fewer: 2 GPUs each",
    ),
    "fp16-on-cpu": ({"mixed_precision": "fp16"}, "use bf16 or no: fp16 needs CUDA"),
    "more-processes-than-gpus": (
        {"gpus_per_node": 2, "cuda": "cu126", "nproc_per_node": 3},
        "use 2 or fewer: 1 GPU each",
    ),
    "negative-gpus": ({"gpus_per_node": -1}, "use 0 (CPU) or more"),
    "zero-processes": ({"nproc_per_node": 0}, "use 1 or more"),
    "zero-nodes": ({"nnodes": 0}, "use 1 or more"),
    "bad-project-name": ({"project_name": "my project"}, "use letters, digits . _ - only"),
    "mirror-url-not-a-url": (
        {"package_mirror": "custom", "conda_url": "not a url"},
        "use http(s)://host/path, no spaces",
    ),
    "torchaudio-not-built": ({"extras": ["torchaudio"]}, "use torch 2.11.0 or older for torchaudio"),
    "torchvision-not-built": (
        {"extras": ["torchvision"], "torch_version": "2.13.9"},
        "use torch 2.4.0 to 2.14.1 for torchvision",
    ),
}


@pytest.mark.parametrize("answers,message", REFUSED.values(), ids=REFUSED.keys())
def test_impossible_answers_are_refused_on_one_short_line_and_leave_nothing(tmp_path, answers, message):
    destination = tmp_path / "project"
    with pytest.raises(ValueError) as refusal:
        render(destination, answers)
    shown = str(refusal.value)  # exactly what copier prints, on one terminal line
    assert "\n" not in shown
    assert shown.endswith(f"': {message}"), shown
    assert shown.split("': ", 1)[1].startswith(("use ", "pick ")), "a refusal leads with the fix"
    assert len(shown) <= 80, f"{len(shown)} columns: {shown}"
    assert not destination.exists()


# Refusals whose fix alone would leave a person guessing: each says why, after the fix ("FIX: REASON").
WITH_A_REASON = [
    "nccl-on-windows", "nccl-without-gpus", "gpus-with-cpu-build", "unpublished-cuda-tag", "torch-2.8-on-windows",
    "torch-2.9-on-both", "torch-not-on-index", "package-is-keyword", "package-shadows-torch",
    "torchrun-on-windows", "model-parallel-one-gpu", "model-parallel-too-many-processes", "fp16-on-cpu",
    "more-processes-than-gpus",
]  # fmt: skip


@pytest.mark.parametrize("name", WITH_A_REASON)
def test_refusals_that_need_a_reason_give_it_after_the_fix(name):
    fix, _, reason = REFUSED[name][1].partition(": ")
    assert fix.startswith(("use ", "pick ")) and reason, REFUSED[name][1]


def test_every_validator_message_is_tested_here():
    """Each refusal copier.yml can give is in REFUSED, so the 80-column and leads-with-a-fix checks reach it."""
    config = yaml.safe_load((TEMPLATE / "copier.yml").read_text(encoding="utf-8"))
    validators = [q["validator"] for q in config.values() if isinstance(q, dict) and "validator" in q]
    validators += [c["validator"] for q in config.values() if isinstance(q, dict) and isinstance(q.get("choices"), dict)
                   for c in q["choices"].values() if isinstance(c, dict) and "validator" in c]  # fmt: skip
    messages = {re.sub(r"{{.*?}}", "", line).strip() for text in validators
                for line in re.split(r"{%.*?%}", text) if line.strip()}  # fmt: skip
    tested = " | ".join(message for _, message in REFUSED.values())
    untested = sorted(message for message in messages if not all(part in tested for part in message.split() if part))
    assert untested == []


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
    assert len(questions) == 22
    assert all(question.get("help") for question in questions.values())
    # The prompt prints "🎤 " and the help on an 80-column line: no line of a help may wrap there.
    long = [key for key, q in questions.items() if "{" not in q["help"] and max(map(len, q["help"].splitlines())) > 76]
    assert long == []
    assert not {"_tasks", "_migrations", "_jinja_extensions"} & config.keys()
    assert config["_min_copier_version"] >= "9"


SYSTEMS = {"windows": ["windows"], "linux": ["linux"], "both": ["windows", "linux"]}


@pytest.fixture(scope="module")
def cuda_help(tmp_path_factory):
    """The cuda question's help as the prompt renders it: copier's own Jinja environment (its filters, this
    template's _envops) over copier.yml's help, for a torch series, a target_os and a driver table."""
    from copier._main import Worker  # copier's renderer; a help is rendered only at the prompt

    template = copy_template(tmp_path_factory.mktemp("template") / "plain")
    environment = Worker(src_path=str(template), dst_path=str(tmp_path_factory.mktemp("out"))).jinja_env
    config = yaml.safe_load((TEMPLATE / "copier.yml").read_text(encoding="utf-8"))
    shown = environment.from_string(config["cuda"]["help"])
    matrix = yaml.safe_load(config["support_matrix"]["default"])
    return lambda series, target_os, drivers: shown.render(
        support_matrix=matrix, cuda_drivers=drivers, torch_series=series, target_os=target_os
    )


def test_the_cuda_help_names_each_offered_tags_oldest_driver_from_cuda_drivers(cuda_help):
    config = yaml.safe_load((TEMPLATE / "copier.yml").read_text(encoding="utf-8"))
    matrix, drivers = (yaml.safe_load(config[key]["default"]) for key in ("support_matrix", "cuda_drivers"))
    for series, row in matrix.items():
        offered = row["tags"] + row["experimental"]
        for target_os, systems in SYSTEMS.items():
            lines = cuda_help(series, target_os, drivers).splitlines()
            floors = {system: ", ".join(f"{tag} {drivers[tag][system]}+" for tag in offered) for system in systems}
            named = [line for line in lines if "NVIDIA driver" in line]
            expected = [f"  NVIDIA driver, {system.capitalize()}: {floors[system]}" for system in systems if offered]
            assert named == expected, (series, target_os)
            assert max(map(len, lines)) <= 76, (series, target_os, lines)  # an 80-column prompt, no wrapping
    # The numbers are read from cuda_drivers, not written into the help: another table, another help.
    other = {tag: {"linux": f"{tag[2:]}.1.2", "windows": f"{tag[2:]}.3"} for tag in drivers}
    assert cuda_help("2.13", "both", other).splitlines()[-2:] == [
        "  NVIDIA driver, Windows: cu126 126.3+, cu130 130.3+, cu132 132.3+",
        "  NVIDIA driver, Linux: cu126 126.1.2+, cu130 130.1.2+, cu132 132.1.2+",
    ]
