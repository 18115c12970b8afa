"""The rendered Windows launchers, run by a real cmd.exe (Wine) with a recording python.exe/conda.exe.

Projects are rendered into paths with a space in them. PowerShell cannot run here, so the
.ps1 files are checked statically against the .bat files they mirror.
"""

from __future__ import annotations

import re

import pytest
import yaml

from conftest import windows_path
from render import ANSWER_SETS

# One worker runs them all: each worker would otherwise create its own Wine prefix (about 4 CPU seconds and
# 6 s each) and render the Windows answer sets again.
pytestmark = pytest.mark.xdist_group("wine")

WINDOWS_SETS = [name for name, answers in ANSWER_SETS.items() if answers.get("target_os", "windows") != "linux"]
PASSTHROUGH = ["--epochs", "1", '--output-dir "C:\\out dir\\run 1"', "--seed=5", "--resume", "none"]
PASSTHROUGH_PARSED = ["--epochs", "1", "--output-dir", "C:\\out dir\\run 1", "--seed=5", "--resume", "none"]


def answers_of(project):
    return yaml.safe_load((project / ".copier-answers.yml").read_text(encoding="utf-8"))


def launcher(project, name):
    return '"' + windows_path(project / "scripts" / name) + '"'


@pytest.mark.parametrize("name", WINDOWS_SETS)
def test_train_bat_passes_only_the_config_then_every_argument(rendered, wine_cmd, name):
    """configs/train.toml is the one source: the launcher adds no setting of its own, so edits there count."""
    project = rendered(name)
    answers = answers_of(project)
    run = wine_cmd.run(launcher(project, "train.bat") + " " + " ".join(PASSTHROUGH))
    assert run.launcher_exit == 0, run.stdout
    assert run.programs() == ["conda", "python"]  # a fresh window: it activates the project's environment first
    assert run.args("conda") == ["activate", answers["project_name"]]
    assert run.args("python") == [
        "-m", f"{answers['package_name']}.train",
        "--config", windows_path(project / "scripts") + "\\..\\configs\\train.toml",
        *PASSTHROUGH_PARSED,
    ]  # fmt: skip
    assert run.env("python")["USE_LIBUV"] == "0"
    # As typed: the resume hint after Ctrl+C names this script (train.py's resume_command).
    assert run.env("python")["DDP_LAUNCHER"] == launcher(project, "train.bat")


def test_train_bat_in_the_projects_active_environment_starts_python_directly(rendered, wine_cmd):
    project = rendered("windows-cpu-default")
    run = wine_cmd.run(launcher(project, "train.bat"), env={"CONDA_DEFAULT_ENV": answers_of(project)["project_name"]})
    assert run.launcher_exit == 0, run.stdout
    assert run.programs() == ["python"]


def test_train_bat_without_the_environment_uses_a_python_that_has_the_project(rendered, wine_cmd):
    """A venv or a CI runner: conda cannot activate the project's environment, but python can import it."""
    project = rendered("windows-cpu-default")
    run = wine_cmd.run(launcher(project, "train.bat"), exits={"conda": 1})
    assert run.launcher_exit == 0, run.stdout
    assert run.programs() == ["conda", "python", "python"]
    probe, train = [line for line in run.records if line.startswith("python arg -")][:2]
    assert probe == "python arg -c" and "find_spec('my_ddp')" in " ".join(run.args("python"))
    assert train == "python arg -m"


def test_train_bat_with_no_environment_at_all_stops_and_names_the_setup_script(rendered, wine_cmd):
    project = rendered("windows-cpu-default")
    run = wine_cmd.run(launcher(project, "train.bat") + " --epochs 1", exits={"conda": 1, "python": 1})
    assert run.launcher_exit == 1
    assert 'the conda environment "my-ddp" is not there to activate' in run.stdout
    assert "Create it once with: scripts\\setup_env.bat" in run.stdout
    assert run.programs() == ["conda", "python"]  # the probe only: training never started


@pytest.mark.parametrize("code", [1, 3, 42])
def test_train_bat_returns_the_programs_exit_code(rendered, wine_cmd, code):
    project = rendered("windows-cpu-default")
    run = wine_cmd.run(launcher(project, "train.bat") + " --epochs 1", exits={"python": code})
    assert run.launcher_exit == code, run.stdout


def test_setup_env_bat_updates_activates_then_runs_the_doctor(rendered, wine_cmd):
    project = rendered("windows-cpu-default")
    answers = answers_of(project)
    run = wine_cmd.run(launcher(project, "setup_env.bat"))
    assert run.launcher_exit == 0, run.stdout
    assert run.programs() == ["conda", "conda", "conda", "python"]
    assert run.args("conda") == [
        "--version",
        "env", "update", "--name", answers["project_name"], "--file", "environment.yml", "--prune",
        "activate", answers["project_name"],
    ]  # fmt: skip
    assert run.args("python") == ["-m", f"{answers['package_name']}.doctor", "--config", "configs\\train.toml"]
    assert f"Environment {answers['project_name']} is ready" in run.stdout


def test_setup_env_bat_stops_with_the_doctors_failure(rendered, wine_cmd):
    run = wine_cmd.run(launcher(rendered("windows-cpu-default"), "setup_env.bat"), exits={"python": 1})
    assert run.launcher_exit == 1
    assert "is ready" not in run.stdout


def test_setup_env_bat_without_conda_says_how_to_get_it(rendered, wine_cmd):
    run = wine_cmd.run(launcher(rendered("windows-cpu-default"), "setup_env.bat"), path_has_standins=False)
    assert run.launcher_exit == 1
    assert "conda was not found. Install Miniconda" in run.stdout
    assert run.records == []


# -- static checks: what cannot run here ------------------------------------------------------

BAT_SET = re.compile(r'^set "(\w+)=(.*)"$', re.M)
PS1_SET = re.compile(r"^\$env:(\w+) = '(.*)'$", re.M)


@pytest.mark.parametrize("name", WINDOWS_SETS)
def test_train_ps1_mirrors_train_bat(rendered, name):
    project = rendered(name)
    answers = answers_of(project)
    bat = (project / "scripts" / "train.bat").read_text(encoding="ascii")
    ps1 = (project / "scripts" / "train.ps1").read_text(encoding="ascii")  # ASCII: PowerShell 5.1 reads UTF-8 as ANSI
    assert dict(PS1_SET.findall(ps1)) == {"USE_LIBUV": "0"}
    assert dict(BAT_SET.findall(bat)) == {"USE_LIBUV": "0", "DDP_LAUNCHER": "%0"}  # the script as typed
    launcher_line = '$env:DDP_LAUNCHER = "powershell -ExecutionPolicy Bypass -File $(Resolve-Path -Relative $PSCommandPath)"'
    assert launcher_line in ps1.splitlines()
    package, name = answers["package_name"], answers["project_name"]
    # The same three ways to an environment, in the same order: active already, conda activate, an installed project.
    assert f"if ($env:CONDA_DEFAULT_ENV -ne '{name}')" in ps1 and f'"%CONDA_DEFAULT_ENV%"=="{name}"' in bat
    assert f"conda activate {name}" in ps1 and f"call conda activate {name}" in bat
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec('{package}') is None)"
    assert probe in ps1 and probe in bat
    assert "scripts\\setup_env.ps1" in ps1 and "scripts\\setup_env.bat" in bat
    assert f'python -m {package}.train --config "$PSScriptRoot\\..\\configs\\train.toml" @args' in ps1
    assert "param(" not in ps1  # every argument reaches the program; none is taken by the script
    assert "$ErrorActionPreference = 'Stop'" in ps1
    assert ps1.rstrip().endswith("exit $LASTEXITCODE")


def test_setup_env_ps1_mirrors_setup_env_bat(rendered):
    project = rendered("windows-cpu-default")
    name = answers_of(project)["project_name"]
    ps1 = (project / "scripts" / "setup_env.ps1").read_text(encoding="ascii")
    bat = (project / "scripts" / "setup_env.bat").read_text(encoding="ascii")
    for command in (f"conda env update --name {name} --file environment.yml --prune", f"conda activate {name}"):
        assert command in ps1 and command in bat
    assert "conda was not found" in ps1
    assert "$ErrorActionPreference = 'Stop'" in ps1 and "exit $LASTEXITCODE" in ps1


@pytest.mark.parametrize("name", WINDOWS_SETS)
def test_windows_launchers_never_use_torchrun(rendered, name):
    for script in ("train.bat", "train.ps1", "setup_env.bat", "setup_env.ps1"):
        assert "torchrun" not in (rendered(name) / "scripts" / script).read_text(encoding="ascii").lower()
