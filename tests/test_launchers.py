"""The rendered Windows launchers, run by a real cmd.exe (Wine) with a recording python.exe/conda.exe.

Projects are rendered into paths with a space in them. PowerShell cannot run here, so the
.ps1 files are checked statically against the .bat files they mirror.
"""

from __future__ import annotations

import re
import shutil

import pytest
import yaml

from conftest import windows_path
from render import ANSWER_SETS, render

# One worker runs them all: each worker would otherwise create its own Wine prefix (seconds of CPU each)
# and render the Windows answer sets again.
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


def test_train_bat_double_clicked_in_a_folder_named_with_an_ampersand(tmp_path, wine_cmd):
    """Explorer starts a double-clicked script as `cmd /c ""C:\\R&D project\\scripts\\train.bat" "`."""
    project = tmp_path / "R&D project"
    render(project, ANSWER_SETS["windows-cpu-default"])
    script = launcher(project, "train.bat")
    run = wine_cmd.run(script.replace("&", "^&"))  # ^: the driver's own line would end at the &
    assert run.launcher_exit == 0, run.stdout
    config = windows_path(project / "scripts") + "\\..\\configs\\train.toml"
    assert run.args("python") == ["-m", f"{answers_of(project)['package_name']}.train", "--config", config]
    assert run.env("python").get("DDP_LAUNCHER") == script, run.stdout  # the hint after Ctrl+C names it


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
    assert f"Environment {answers['project_name']} is ready and active here. In a new window, first:" in run.stdout
    assert f"  conda activate {answers['project_name']}" in run.stdout


def test_setup_env_bat_stops_with_the_doctors_failure(rendered, wine_cmd):
    run = wine_cmd.run(launcher(rendered("windows-cpu-default"), "setup_env.bat"), exits={"python": 1})
    assert run.launcher_exit == 1
    assert "is ready" not in run.stdout


def test_setup_env_bat_without_conda_or_python_says_what_to_install(rendered, wine_cmd):
    run = wine_cmd.run(launcher(rendered("windows-cpu-default"), "setup_env.bat"), path_has_standins=False)
    assert run.launcher_exit == 1
    assert (
        "error: neither conda nor Python 3.11 was found. Install Python 3.11 from https://www.python.org" in run.stdout
    )
    assert "Miniconda (https://docs.conda.io/en/latest/miniconda.html), then run this again." in run.stdout
    assert run.records == []


# -- without conda: the project's .venv ---------------------------------------------------------


@pytest.fixture
def venv_project(tmp_path, rendered, wine_cmd):
    """A fresh render whose .venv exists (its python.exe is the recording stand-in), as setup_env.bat leaves it."""
    project = shutil.copytree(rendered("windows-cpu-default"), tmp_path / "my project")  # the defaults
    scripts = project / ".venv" / "Scripts"
    scripts.mkdir(parents=True)
    shutil.copy(wine_cmd.bin / "python.exe", scripts / "python.exe")
    return project


def test_setup_env_bat_without_conda_installs_requirements_into_the_venv(venv_project, wine_cmd):
    run = wine_cmd.run(launcher(venv_project, "setup_env.bat"), exits={"conda": 1})
    assert run.launcher_exit == 0, run.stdout
    assert run.programs() == ["conda", "python", "python"]  # conda --version, then the .venv's python twice
    assert run.args("python") == [
        "-m", "pip", "install", "-r", "requirements.txt", "-e", ".[test,plot]",
        "-m", "my_ddp.doctor", "--config", "configs\\train.toml",
    ]  # fmt: skip
    assert "Environment .venv is ready. Activate it in each new window:" in run.stdout
    assert "  .venv\\Scripts\\activate.bat" in run.stdout


def test_setup_env_bat_venv_flag_never_asks_conda(venv_project, wine_cmd):
    run = wine_cmd.run(launcher(venv_project, "setup_env.bat") + " --venv")
    assert run.launcher_exit == 0, run.stdout
    assert run.programs() == ["python", "python"]


def test_setup_env_bat_makes_the_venv_with_a_python_of_the_pinned_version(rendered, wine_cmd, tmp_path):
    project = shutil.copytree(rendered("windows-cpu-default"), tmp_path / "fresh")  # the defaults
    run = wine_cmd.run(launcher(project, "setup_env.bat"), exits={"conda": 1})
    # The stand-in makes no folder: the script probes python's version, asks it for a venv, then says none came.
    assert run.launcher_exit == 1, run.stdout
    assert run.args("python") == [
        "-c", "import sys; sys.exit(sys.version_info[:2] != (3, 11))", "-m", "venv", ".venv",
    ]  # fmt: skip
    assert "error: python -m venv .venv made no .venv\\Scripts\\python.exe; see the messages above." in run.stdout


def test_setup_env_bat_refuses_an_unknown_argument(rendered, wine_cmd):
    run = wine_cmd.run(launcher(rendered("windows-cpu-default"), "setup_env.bat") + " --conda")
    assert run.launcher_exit == 2
    assert "usage: scripts\\setup_env.bat [--venv]" in run.stdout
    assert run.records == []


def test_setup_env_bat_passes_the_pip_failure_on(venv_project, wine_cmd):
    run = wine_cmd.run(launcher(venv_project, "setup_env.bat") + " --venv", exits={"python": 1})
    assert run.launcher_exit == 1
    assert run.programs() == ["python"]  # pip failed: no doctor
    assert "is ready" not in run.stdout


def test_train_bat_uses_the_projects_venv_first(venv_project, wine_cmd):
    run = wine_cmd.run(launcher(venv_project, "train.bat") + " --epochs 1")
    assert run.launcher_exit == 0, run.stdout
    assert run.programs() == ["python"]  # no conda, no probe
    assert run.env("python")["VIRTUAL_ENV"] == windows_path(venv_project / "scripts") + "\\..\\.venv"
    assert run.args("python")[:2] == ["-m", "my_ddp.train"]


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
    assert dict(BAT_SET.findall(bat)) == {
        "USE_LIBUV": "0", "VIRTUAL_ENV": "%~dp0..\\.venv", "PATH": "%~dp0..\\.venv\\Scripts;%PATH%",
    }  # fmt: skip
    # The script as typed, quoted: the value holds its quotes, and a path holding & or a space stays one word.
    assert 'set DDP_LAUNCHER="%~0"' in bat.splitlines()
    launcher_line = (
        '$env:DDP_LAUNCHER = "powershell -ExecutionPolicy Bypass -File `"$(Resolve-Path -Relative $PSCommandPath)`""'
    )
    assert launcher_line in ps1.splitlines()
    # The same .venv, set up the same way (PowerShell's lines hold a variable, so they are not PS1_SET's form).
    assert "$venv = Join-Path $PSScriptRoot '..\\.venv'" in ps1
    assert "$env:VIRTUAL_ENV = $venv" in ps1 and '$env:PATH = "$venv\\Scripts;$env:PATH"' in ps1
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
    venv_python = ".venv\\Scripts\\python.exe"
    doctor = f"{venv_python} -m {answers_of(project)['package_name']}.doctor --config configs\\train.toml"
    install = f'{venv_python} -m pip install -r requirements.txt -e ".[test,plot]"'
    for command in (install, doctor, "-m venv .venv", "py -3.11 -m venv .venv"):
        assert command in ps1 and command in bat, command
    assert "neither conda nor Python 3.11 was found" in ps1 and "neither conda nor Python 3.11 was found" in bat
    assert "$args[0] -eq '--venv'" in ps1 and '"%~1"=="--venv"' in bat
    assert "$ErrorActionPreference = 'Stop'" in ps1 and "exit $LASTEXITCODE" in ps1


@pytest.mark.parametrize("name", WINDOWS_SETS)
def test_windows_launchers_never_use_torchrun(rendered, name):
    for script in ("train.bat", "train.ps1", "setup_env.bat", "setup_env.ps1"):
        assert "torchrun" not in (rendered(name) / "scripts" / script).read_text(encoding="ascii").lower()
