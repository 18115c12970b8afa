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

WINDOWS_SETS = [name for name, answers in ANSWER_SETS.items() if answers.get("target_os", "windows") != "linux"]
PASSTHROUGH = ["--epochs", "1", '--output-dir "C:\\out dir\\run 1"', "--seed=5", "--resume", "none"]
PASSTHROUGH_PARSED = ["--epochs", "1", "--output-dir", "C:\\out dir\\run 1", "--seed=5", "--resume", "none"]


def answers_of(project):
    return yaml.safe_load((project / ".copier-answers.yml").read_text(encoding="utf-8"))


def launcher(project, name):
    return '"' + windows_path(project / "scripts" / name) + '"'


@pytest.mark.parametrize("name", WINDOWS_SETS)
def test_train_bat_passes_the_rendered_defaults_then_every_argument(rendered, wine_cmd, name):
    project = rendered(name)
    answers = answers_of(project)
    run = wine_cmd.run(launcher(project, "train.bat") + " " + " ".join(PASSTHROUGH))
    assert run.launcher_exit == 0, run.stdout
    assert run.programs() == ["python"]
    assert run.args("python") == [
        "-m", f"{answers['package_name']}.train",
        "--config", windows_path(project / "scripts") + "\\..\\configs\\train.toml",
        "--nproc-per-node", str(answers["nproc_per_node"]),
        "--master-port", str(answers["master_port"]),
        *PASSTHROUGH_PARSED,
    ]  # fmt: skip
    environment = run.env("python")
    assert environment["USE_LIBUV"] == "0"
    assert environment["MASTER_ADDR"] == "127.0.0.1"


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
PS1_PARAM = re.compile(r"^\s+\[int\]\$(\w+) = (\d+),?$", re.M)


@pytest.mark.parametrize("name", WINDOWS_SETS)
def test_train_ps1_mirrors_train_bat(rendered, name):
    project = rendered(name)
    answers = answers_of(project)
    bat = (project / "scripts" / "train.bat").read_text(encoding="ascii")
    ps1 = (project / "scripts" / "train.ps1").read_text(encoding="ascii")  # ASCII: PowerShell 5.1 reads UTF-8 as ANSI
    assert dict(PS1_SET.findall(ps1)) == dict(BAT_SET.findall(bat)) == {"USE_LIBUV": "0", "MASTER_ADDR": "127.0.0.1"}
    assert dict(PS1_PARAM.findall(ps1)) == {
        "NprocPerNode": str(answers["nproc_per_node"]),
        "MasterPort": str(answers["master_port"]),
    }
    assert f'python -m {answers["package_name"]}.train --config "$PSScriptRoot\\..\\configs\\train.toml"' in ps1
    assert "--nproc-per-node $NprocPerNode --master-port $MasterPort @TrainArgs" in ps1
    assert "[CmdletBinding(PositionalBinding = $false)]" in ps1  # "--epochs 10" must not bind 10 positionally
    assert "[Parameter(ValueFromRemainingArguments = $true)][string[]]$TrainArgs" in ps1
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
