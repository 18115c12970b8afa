"""`nox -s matrix` (tools/matrix.py) on saved copies of PyTorch's index pages (tests/data/index/<tag>/<project>/):
the live index is not reachable from the test machines, and the scheduled workflow
(.github/workflows/matrix.yml) runs the same tool against it.

The saved pages have the real pages' form (links to /whl/<tag>/<wheel>%2B...#sha256=..., macOS wheels without a
tag, aarch64 wheels, free-threaded cp313t) for torch 2.13.0, 2.14.0, 2.14.1 and their torchvision; their sha256
values are placeholders. Each test changes a copy of them as a new PyTorch release would.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from render import TEMPLATE

SAVED = TEMPLATE / "tests" / "data" / "index"
TOOL = TEMPLATE / "tools" / "matrix.py"


def run_tool(index: Path, *series: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), "--index", str(index), "--series", *series],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.fixture
def index(tmp_path) -> Path:
    return Path(shutil.copytree(SAVED, tmp_path / "index"))


def add_wheels(index: Path, tag: str, project: str, *names: str) -> None:
    page = index / tag / project / "index.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    text = page.read_text(encoding="utf-8") if page.exists() else "<html>\n  <body>\n  </body>\n</html>\n"
    links = "".join(f'    <a href="/whl/{tag}/{n.replace("+", "%2B")}#sha256={"0" * 64}">{n}</a><br/>\n' for n in names)
    page.write_text(text.replace("  </body>", links + "  </body>"), encoding="utf-8")


def test_the_saved_index_agrees_with_copier_yml_and_prints_its_rows(index):
    done = run_tool(index, "2.13", "2.14")
    assert done.returncode == 0, done.stdout + done.stderr
    python = '"3.10", "3.11", "3.12", "3.13", "3.14"'
    assert done.stdout.splitlines()[1:3] == [
        f'"2.13": {{tags: [cu126, cu130, cu132], python: [{python}], releases: [2.13.0]}}',
        f'"2.14": {{tags: [cu126, cu130, cu132], python: [{python}], releases: [2.14.0, 2.14.1]}}',
    ]
    assert done.stdout.rstrip().endswith("# differences from copier.yml: 0")


def test_a_release_that_reaches_the_index_is_reported(index):
    for tag in ("cpu", "cu130"):
        add_wheels(index, tag, "torch", f"torch-2.15.0+{tag}-cp311-cp311-manylinux_2_28_x86_64.whl",
                   f"torch-2.15.0+{tag}-cp311-cp311-win_amd64.whl")  # fmt: skip
    done = run_tool(index, "2.15")
    assert done.returncode == 1
    assert "- 2.15: on the index now, copier.yml says index: false" in done.stdout
    assert "- 2.15: tags on the index ['cu130'], copier.yml []" in done.stdout


def test_a_new_tag_and_a_new_patch_release_are_reported(index):
    add_wheels(index, "cu134", "torch", "torch-2.14.1+cu134-cp311-cp311-manylinux_2_28_x86_64.whl",
               "torch-2.14.1+cu134-cp311-cp311-win_amd64.whl")  # fmt: skip
    add_wheels(index, "cpu", "torch", "torch-2.14.2+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    done = run_tool(index, "2.14")
    assert done.returncode == 1
    assert "- 2.14: tags on the index ['cu126', 'cu130', 'cu132', 'cu134'], copier.yml ['cu126', 'cu130', 'cu132']" in (
        done.stdout
    )
    assert "- 2.14: releases on the index not in torch_releases: ['2.14.2']" in done.stdout


def test_a_tag_with_linux_wheels_only_is_told_apart(index):
    add_wheels(index, "cu134", "torch", "torch-2.14.1+cu134-cp311-cp311-manylinux_2_28_x86_64.whl")
    done = run_tool(index, "2.14")
    assert "linux only: [cu134]" in done.stdout


def test_a_companion_pin_without_its_wheel_is_reported(index):
    page = index / "cpu" / "torchvision" / "index.html"
    page.write_text("\n".join(line for line in page.read_text(encoding="utf-8").splitlines()
                              if "0.29.1" not in line), encoding="utf-8")  # fmt: skip
    done = run_tool(index, "2.14")
    assert done.returncode == 1
    assert "- 2.14.1: torch_releases pins torchvision 0.29.1, no 0.29.1+cpu wheel" in done.stdout


def test_the_scheduled_workflow_runs_the_session_against_the_live_index():
    workflow = yaml.safe_load((TEMPLATE / ".github" / "workflows" / "matrix.yml").read_text(encoding="utf-8"))
    assert "schedule" in workflow[True]  # YAML reads the key `on` as True
    steps = [step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"]]
    assert any("nox -s matrix" in run for run in steps)
    noxfile = (TEMPLATE / "noxfile.py").read_text(encoding="utf-8")
    assert "def matrix(session" in noxfile and "tools/matrix.py" in noxfile
