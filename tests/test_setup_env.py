"""scripts/setup_env.sh without conda, for real: it makes .venv, installs requirements.txt through a local
stand-in of the mirror (tests/wheel_index.py, serving this machine's wheels under PyPI's and PyTorch's
layouts) and runs the doctor. Then the README's first run, every command as written (scripts/train.sh trains in
that .venv), each in a fresh shell that activates .venv with the README's own line.

pip reads no configuration of its own here: only the rendered requirements.txt says where packages come from.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from render import render
from wheel_index import WheelIndex


def needed(project: Path) -> list[str]:
    """What setup_env.sh installs: the torch pin, the project's own, test and plot requirements, its build backend."""
    pyproject = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
    extras = pyproject["project"]["optional-dependencies"]
    return [f"torch=={torch.__version__}", *pyproject["project"]["dependencies"], *extras["test"], *extras["plot"],
            *pyproject["build-system"]["requires"]]  # fmt: skip


@pytest.fixture(scope="module")
def local_mirror(tmp_path_factory, rendered):
    """The mirror's stand-in, with every wheel the project needs, fetched once from where this machine's pip finds
    them (a local folder here)."""
    if "+cpu" not in torch.__version__ or sys.platform == "win32":
        pytest.skip("the venv path is run with a +cpu torch build, in bash")
    folder = tmp_path_factory.mktemp("wheels")
    project = rendered("windows-cpu-default")  # the defaults
    fetched = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(folder), *needed(project)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if fetched.returncode != 0:
        pytest.skip(f"pip cannot fetch the project's packages here: {fetched.stderr[-300:]}")
    index = WheelIndex(sorted(folder.glob("*.whl")), ["simple", "whl/cpu"], [])
    yield index
    index.close()


def without_conda_path() -> str:
    """PATH without any folder that holds conda, as on a machine without it."""
    folders = [f for f in os.environ["PATH"].split(os.pathsep) if not (Path(f) / "conda").exists()]
    return os.pathsep.join([str(Path(sys.executable).parent), *folders])


def test_setup_env_sh_makes_a_venv_from_requirements_and_train_sh_trains_in_it(tmp_path, local_mirror):
    project = tmp_path / "my project"
    render(project, {
        "package_mirror": "custom", "target_os": "linux", "launcher": "spawn",
        "conda_url": f"{local_mirror.url}/conda-forge",
        "pypi_url": f"{local_mirror.url}/simple",
        "torch_url": f"{local_mirror.url}/whl",
    })  # fmt: skip
    # A user's machine: no PYTHONDONTWRITEBYTECODE (set on CI machines), so each module imported is compiled once,
    # not in every process; pip compiles nothing at install (PIP_NO_COMPILE), the first imports do.
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PIP_", "VIRTUAL_ENV", "CONDA", "PYTHONDONTWRITEBYTECODE"))}  # fmt: skip
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_CACHE_DIR=str(tmp_path / "cache"),
               PIP_NO_COMPILE="1", PATH=without_conda_path(), GIT_CONFIG_GLOBAL=os.devnull,
               GIT_CONFIG_NOSYSTEM="1")  # fmt: skip
    assert shutil.which("conda", path=env["PATH"]) is None
    # Committed first, as the README's quick start does: what the first run writes must leave it clean.
    for command in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "g"]):
        subprocess.run(["git", *command], cwd=project, env=env, check=True, capture_output=True)
    ran = the_first_run_as_the_readme_says(project, env)
    setup = ran["scripts/setup_env.sh"]
    assert "Environment .venv is ready. Activate it in each new terminal:\n  source .venv/bin/activate\n" in (
        setup.stdout
    )
    assert f"torch from: {local_mirror.url}/whl/cpu (answers" in setup.stdout  # the doctor, from inside .venv
    venv_python = project / ".venv" / "bin" / "python"
    installed = subprocess.run([str(venv_python), "-c", "import torch; print(torch.__version__)"],
                               capture_output=True, text=True, timeout=120)  # fmt: skip
    assert installed.stdout.strip() == torch.__version__  # exactly the pinned build
    assert any(request.startswith("/whl/cpu/torch/") for request in local_mirror.requests)


def first_run_of(readme: str) -> tuple[str, list[str]]:
    """The README's line that activates .venv in bash, and every command of its first run (sections 1 and 2, from
    the setup script on), in order."""
    first_run = readme[readme.index("## 1. ") : readme.index("## 3. ")]
    (activate,) = re.findall(r"^\| Linux \(bash\) \| `[^`]*` \| `([^`]*)` \|$", first_run, re.MULTILINE)
    blocks = re.findall(r"^```bash\n(.*?)^```$", first_run, re.MULTILINE | re.DOTALL)
    return activate, [line for block in blocks for line in block.splitlines() if line.strip()]


def the_first_run_as_the_readme_says(project: Path, env: dict) -> dict[str, subprocess.CompletedProcess]:
    """Each command of the README's first run, run as written; what each did, by command."""
    activate, commands = first_run_of((project / "README.md").read_text(encoding="utf-8"))
    assert activate == "source .venv/bin/activate"
    assert commands[0] == "scripts/setup_env.sh"
    assert [c.split()[2] if c.startswith("python -m ") else c.split()[0] for c in commands[1:]] == [
        "my_ddp.doctor", "scripts/train.sh", "scripts/train.sh", "my_ddp.plot", "my_ddp.evaluate", "pytest",
    ]  # fmt: skip
    ran = {}
    for command in commands:
        # A new terminal: nothing active, then the README's line (once the setup script has made .venv), then the
        # command as written.
        line = command if command == commands[0] else f"{activate} && {command}"
        done = subprocess.run(["bash", "-c", line], cwd=project, env=env, capture_output=True, text=True,
                              timeout=900)  # fmt: skip
        assert done.returncode == 0, f"{command}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        ran[command] = done
    outputs = project / "outputs"
    assert all((outputs / name).is_file() for name in ("model.pt", "curves.png", "best.val.json"))
    # The README's overlay of two runs, then git sees nothing new: every example writes where git looks away.
    (overlay,) = re.findall(r"`(python -m \S+\.plot outputs runs/seed1 --output runs/both\.png)`",
                            (project / "README.md").read_text(encoding="utf-8"))  # fmt: skip
    done = subprocess.run(["bash", "-c", f"{activate} && {overlay}"], cwd=project, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (project / "runs" / "both.png").is_file()
    status = subprocess.run(["git", "status", "--porcelain"], cwd=project, env=env, capture_output=True, text=True)
    assert status.stdout == ""
    return ran


def test_setup_env_sh_without_a_python_of_the_pinned_version_says_how_to_name_one(tmp_path):
    env = {**os.environ, "PATH": without_conda_path()}
    missing = [v for v in ("3.14", "3.13", "3.12", "3.10") if not shutil.which(f"python{v}", path=env["PATH"])]
    if not missing:
        pytest.skip("this machine has every Python torch 2.13 has wheels for")
    version = missing[0]
    project = tmp_path / "p"
    render(project, {"python_version": version, "target_os": "linux"})
    done = subprocess.run([str(project / "scripts" / "setup_env.sh"), "--venv"], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"error: Python {version} was not found (the project pins it). Install it, or conda, then run this again; "
        f"or name one: PYTHON=/path/to/python{version} scripts/setup_env.sh --venv"
    )
    assert not (project / ".venv").exists()


def test_setup_env_sh_refuses_an_unknown_argument(rendered):
    project = rendered("windows-cpu-default")  # the defaults; the refusal changes nothing
    done = subprocess.run([str(project / "scripts" / "setup_env.sh"), "--conda"], capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (2, "usage: scripts/setup_env.sh [--venv]\n")
