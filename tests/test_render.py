"""What a render contains: the files, their line endings, the pins, and none of the seed's bugs."""

from __future__ import annotations

import os
import re
import subprocess
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import pytest
import yaml
from wcwidth import wcswidth

from render import ANSWER_SETS, TEMPLATE

REQUIRED = [
    "environment.yml", "requirements.txt", "pyproject.toml", ".gitattributes", ".copier-answers.yml",
    "configs/train.toml", "scripts/train.sh", "scripts/setup_env.sh",
    "README.md", "tests/conftest.py", "tests/test_ddp.py", ".github/workflows/ci.yml", ".gitignore",
]  # fmt: skip
# The launchers of each OS, generated only where the project runs on it (a Windows project keeps the .sh ones:
# its own tests run them on Linux).
WINDOWS_LAUNCHERS = ["train.bat", "train.ps1", "setup_env.bat", "setup_env.ps1"]
LINUX_LAUNCHERS = ["train.sh", "setup_env.sh"]
# The user's files and the entry points on top, the engine in its own package.
PACKAGE_MODULES = [
    "__init__", "recipe", "model", "data", "train", "evaluate", "doctor", "plot",
    "engine/__init__", "engine/launch", "engine/process_group", "engine/rank", "engine/trainer", "engine/context",
]  # fmt: skip
COMPUTED = ["dist_backend", "world_size", "torch_index_url", "torch_pin", "support_matrix", "torch_series"]


def answers_of(project):
    return yaml.safe_load((project / ".copier-answers.yml").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", ANSWER_SETS)
def test_render_has_every_file(rendered, name):
    project = rendered(name)
    package = answers_of(project)["package_name"]
    windows = answers_of(project)["target_os"] != "linux"
    required = REQUIRED + [f"scripts/{name}" for name in WINDOWS_LAUNCHERS if windows]
    missing = [path for path in required if not (project / path).is_file()]
    assert windows or [p.name for p in (project / "scripts").iterdir() if p.suffix in {".bat", ".ps1"}] == []
    missing += [m for m in PACKAGE_MODULES if not (project / "src" / package / f"{m}.py").is_file()]
    assert missing == []
    ignored = set((project / ".gitignore").read_text().splitlines())
    assert {"outputs/", "runs/", "__pycache__/", "*.egg-info/"} <= ignored


@pytest.mark.parametrize("name", ANSWER_SETS)
def test_windows_scripts_are_crlf_ascii_and_shell_scripts_lf(rendered, name):
    scripts = rendered(name) / "scripts"
    windows = answers_of(rendered(name))["target_os"] != "linux"
    for script in WINDOWS_LAUNCHERS if windows else []:
        data = (scripts / script).read_bytes()
        data.decode("ascii")  # cmd.exe and PowerShell 5.1 read these in the ANSI code page
        assert data.count(b"\n") == data.count(b"\r\n") > 3, script
        assert data.endswith(b"\r\n"), script
    shell = (scripts / "train.sh").read_bytes()
    assert b"\r" not in shell
    assert sys.platform == "win32" or os.access(scripts / "train.sh", os.X_OK)
    gitattributes = (rendered(name) / ".gitattributes").read_text(encoding="utf-8")
    for pattern in ("*.bat text eol=crlf", "*.cmd text eol=crlf", "*.ps1 text eol=crlf"):
        assert pattern in gitattributes


@pytest.mark.parametrize("name", ANSWER_SETS)
def test_environment_pins_torch_from_the_wheel_index_of_its_tag(rendered, name):
    project = rendered(name)
    answers = answers_of(project)
    environment = yaml.safe_load((project / "environment.yml").read_text(encoding="utf-8"))
    assert environment["name"] == answers["project_name"]
    assert f"python={answers['python_version']}" in environment["dependencies"]
    pip = next(item["pip"] for item in environment["dependencies"] if isinstance(item, dict))
    assert pip == ["-r requirements.txt", "-e .[test,plot]"]  # one list of pins for conda and for .venv
    requirements = (project / "requirements.txt").read_text(encoding="utf-8").splitlines()
    tag = answers["cuda"]
    assert f"--extra-index-url https://download.pytorch.org/whl/{tag}" in requirements
    assert f"torch=={answers['torch_version']}+{tag}" in requirements
    assert "numpy" in requirements


@pytest.mark.parametrize("name", ANSWER_SETS)
def test_answers_file_holds_answers_and_config_holds_the_derived_values(rendered, name):
    project = rendered(name)
    answers = answers_of(project)
    assert not set(COMPUTED) & answers.keys()
    assert {**{k: answers[k] for k in ANSWER_SETS[name]}} == ANSWER_SETS[name]
    config = tomllib.loads((project / "configs" / "train.toml").read_text(encoding="utf-8"))
    distributed = config["distributed"]
    assert distributed["nproc_per_node"] == answers["nproc_per_node"]
    assert distributed["master_port"] == answers["master_port"]
    assert distributed["device"] == ("cuda" if answers["gpus_per_node"] else "cpu")
    linux_gpu = answers["target_os"] == "linux" and answers["gpus_per_node"] > 0
    expected_backend = (
        # backend is only asked (and recorded) for Linux-only GPU projects; elsewhere it is gloo.
        "nccl"
        if answers.get("backend", "auto") == "nccl" or (answers.get("backend", "auto") == "auto" and linux_gpu)
        else "gloo"
    )
    assert distributed["backend"] == expected_backend
    assert config["train"]["precision"] == answers["mixed_precision"]


SEED_BUGS = {
    "torch.distributed.launch": re.compile(r"torch\.distributed\.launch\b"),
    "log_softmax into CrossEntropyLoss": re.compile(r"log_softmax"),
    "_identity hacks": re.compile(r"_identity"),
    "localhost as an address": re.compile(r"""(MASTER_ADDR|master_addr)\s*[=:]\s*["']?localhost"""),
    "training after mp.spawn in the parent": re.compile(r"mp\.spawn\([^)]*\)\s*\n\s*\w+\(model"),
}


@pytest.mark.parametrize("name", ANSWER_SETS)
def test_none_of_the_seed_bugs_reappear(rendered, name):
    project = rendered(name)
    found = []
    for path in project.rglob("*"):
        if path.is_file() and path.suffix in {".py", ".bat", ".ps1", ".sh", ".toml", ".yml"}:
            text = path.read_text(encoding="utf-8")
            found += [f"{path.name}: {bug}" for bug, pattern in SEED_BUGS.items() if pattern.search(text)]
    assert found == []
    requirements = (project / "environment.yml").read_text(encoding="utf-8") + (project / "pyproject.toml").read_text(
        encoding="utf-8"
    )
    assert re.findall(r"torch[-_]directml|pytorch-gpu|torch-cuda", requirements) == []  # no made-up packages


def test_copier_cli_renders_the_defaults_without_trust(tmp_path):
    destination = tmp_path / "p"
    result = subprocess.run(
        [sys.executable, "-m", "copier", "copy", "--defaults", "--vcs-ref", "HEAD", str(TEMPLATE), str(destination)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (destination / "scripts" / "train.bat").is_file()
    assert "--trust" not in result.stderr


# The message's heading and what it says of the doctor's last line, per readme_language.
AFTER_COPY = {"en": ("Next steps", "activates the environment"), "zh": ("下一步", "激活环境")}


@pytest.mark.parametrize("language", AFTER_COPY)
@pytest.mark.parametrize("target_os", ["windows", "linux", "both"])
def test_the_message_after_copy_fits_80_columns_and_names_the_projects_os(tmp_path, target_os, language):
    destination = tmp_path / "p"
    result = subprocess.run(
        [sys.executable, "-m", "copier", "copy", "--defaults", "--vcs-ref", "HEAD", "--data", f"target_os={target_os}",
         "--data", f"readme_language={language}", str(TEMPLATE), str(destination)],
        capture_output=True, text=True, encoding="utf-8", timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    heading, activates = AFTER_COPY[language]
    message = result.stderr[result.stderr.index(heading) :].rstrip().splitlines()
    assert [line for line in message if wcswidth(line) > 80] == []  # display cells: a Chinese character takes two
    setup, train = ("scripts/setup_env.sh", "scripts/train.sh") if target_os == "linux" else (
        "scripts\\setup_env.bat", "scripts\\train.bat")  # fmt: skip
    after_setup = message.index(f"  {setup}") + 1
    assert message[-2:] == ["  python -m my_ddp.doctor --smoke", f"  {train}"]
    assert activates in " ".join(message[after_setup:-2])


@pytest.mark.parametrize("name", ANSWER_SETS)
def test_every_command_and_path_in_the_readme_exists(rendered, name):
    project = rendered(name)
    package = answers_of(project)["package_name"]
    readmes = sorted(project.glob("README*.md"))
    language = answers_of(project)["readme_language"]
    assert [p.name for p in readmes] == (["README.md", "README.zh-CN.md"] if language == "both" else ["README.md"])
    for readme in readmes:
        text = readme.read_text(encoding="utf-8")
        chinese = readme.name == "README.zh-CN.md" or language == "zh"
        assert ("分布式训练" if chinese else "Distributed training") in text
        scripts = set(re.findall(r"scripts[\\/]([\w.]+\.(?:bat|ps1|sh|py))", text))
        target_os = answers_of(project)["target_os"]
        launchers = {"windows": WINDOWS_LAUNCHERS, "linux": LINUX_LAUNCHERS}.get(
            target_os, WINDOWS_LAUNCHERS + LINUX_LAUNCHERS
        )
        assert set(launchers) <= scripts
        assert [s for s in scripts if not (project / "scripts" / s).is_file()] == []
        modules = set(re.findall(r"python -m ([\w.]+)", text)) - {"pytest"}
        assert {f"{package}.train", f"{package}.doctor", f"{package}.plot"} <= modules
        assert [m for m in modules if not (project / "src" / (m.replace(".", "/") + ".py")).is_file()] == []
        files = set(re.findall(r"`((?:configs|src)/[\w./{}-]+|environment\.yml)`", text))
        assert "configs/train.toml" in files and "environment.yml" in files
        assert [f for f in files if not (project / f).exists()] == []
