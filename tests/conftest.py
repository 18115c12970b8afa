"""Fixtures for the template's own tests: renders, and Wine's cmd.exe with a recording stand-in."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from render import ANSWER_SETS, ENGLISH_TERMINAL, render, templates_compiled_once, terminal_locale

HERE = Path(__file__).resolve().parent


# xdist hands tests out in collection order, a couple at a time per worker: the longest go first, so that
# none of them starts last while the other workers sit idle (`nox -s tests -- --durations=20` lists them).
LONGEST_FIRST = (
    "tests/test_setup_env.py",  # installs torch into a fresh .venv and trains in it: the longest test
    "tests/test_hosts.py",
    "tests/test_slurm.py",
    "tests/test_site.py::test_the_linux_path_of_getting_started_runs_as_pasted",
    "tests/test_update.py",
    "tests/test_launchers.py",
    "tests/test_quickstart.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def position(item: pytest.Item) -> int:
        return next((i for i, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)), len(LONGEST_FIRST))

    items.sort(key=position)  # stable: the rest keep their order


@pytest.fixture(scope="session", autouse=True)
def compile_each_template_once():
    """Hundreds of renders in one process: jinja compiles each source once (see templates_compiled_once)."""
    with templates_compiled_once():
        yield


@pytest.fixture(scope="session", autouse=True)
def english_terminal():
    """copier.yml follows the terminal's locale: every copier run of the tests, in this process or in one it
    starts, sees an English terminal whatever the machine's locale, unless a test sets another."""
    with terminal_locale(ENGLISH_TERMINAL):
        yield


@pytest.fixture(scope="session")
def rendered(tmp_path_factory):
    """Each named answer set, rendered once per test session, into a path with a space in it."""
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            destination = tmp_path_factory.mktemp("renders") / f"my project {name}"
            render(destination, ANSWER_SETS[name])
            cache[name] = destination
        return cache[name]

    return get


def needed_tool(name: str) -> str:
    """Path of a tool the Windows tests need; CI must have it (.ci/run installs it), a laptop may not."""
    if sys.platform == "win32":
        pytest.skip("on Windows the rendered project's own tests run train.bat in the real cmd.exe")
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is missing on CI; .ci/run installs Wine and mingw-w64")
        pytest.skip(f"{name} is not installed (apt-get install wine wine64 gcc-mingw-w64-x86-64-win32)")
    return found


def windows_path(path: Path) -> str:
    """Wine maps the Linux root to drive Z:."""
    return "Z:" + str(path).replace("/", "\\")


@dataclass
class CmdRun:
    stdout: str
    launcher_exit: int | None
    records: list[str]

    def args(self, program: str) -> list[str]:
        prefix = f"{program} arg "
        return [line[len(prefix) :] for line in self.records if line.startswith(prefix)]

    def env(self, program: str) -> dict[str, str]:
        prefix = f"{program} env "
        pairs = (line[len(prefix) :].split("=", 1) for line in self.records if line.startswith(prefix))
        return dict(pairs)

    def programs(self) -> list[str]:
        return [line.split()[0] for line in self.records if line.endswith(" start")]


class WineCmd:
    """Runs batch files under Wine's real cmd.exe, with python.exe and conda.exe replaced by the stand-in."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.bin = workdir / "bin"
        self.bin.mkdir()
        compiler = needed_tool("x86_64-w64-mingw32-gcc")
        needed_tool("wine")
        subprocess.run(
            [compiler, "-O1", "-Wall", "-o", str(self.bin / "python.exe"), str(HERE / "standin" / "standin.c")],
            check=True,
        )
        shutil.copy(self.bin / "python.exe", self.bin / "conda.exe")
        self.env = {
            **os.environ,
            "WINEDEBUG": "-all",
            "WINEPREFIX": str(workdir / "prefix"),
            "WINEDLLOVERRIDES": "mscoree,mshtml=",  # no Mono/Gecko install prompts
        }
        self.runs = 0
        # One Wine server, with Wine's own services, for the whole session: otherwise every `wine` starts and
        # stops its own, which costs several times the command itself. Both start with none of
        # our pipes: services that a captured run started would hold its output open after it ended.
        quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        (workdir / "prefix").mkdir()
        self.server = shutil.which("wineserver")
        if self.server:
            subprocess.run([self.server, "--persistent"], env=self.env, check=True, **quiet)
        subprocess.run(["wine", "wineboot", "--init"], env=self.env, check=True, timeout=300, **quiet)

    def close(self) -> None:
        if self.server:
            subprocess.run([self.server, "--kill"], env=self.env, check=False)

    def run(
        self,
        command: str,
        exits: dict[str, int] | None = None,
        path_has_standins: bool = True,
        env: dict[str, str] | None = None,
    ) -> CmdRun:
        """Run one command line from a driver .bat (Wine re-quotes arguments typed on the Linux side).

        The launcher runs under `cmd /c`, whose exit status is the launcher's own `exit /b` code;
        the driver echoes it (Wine's `call` would report 1 for any non-zero code).
        """
        self.runs += 1
        log = self.workdir / f"record-{self.runs}.txt"
        lines = ["@echo off"]
        if path_has_standins:
            lines.append(f'set "PATH={windows_path(self.bin)};%PATH%"')
        lines.append(f'set "STANDIN_LOG={windows_path(log)}"')
        for program, code in (exits or {}).items():
            lines.append(f'set "STANDIN_EXIT_{program.upper()}={code}"')
        for name, value in (env or {}).items():
            lines.append(f'set "{name}={value}"')
        # The outer quotes keep cmd /c from stripping the quotes of a quoted script path.
        lines += [f'cmd /c "{command}"', "echo LAUNCHER_EXIT=%ERRORLEVEL%"]
        driver = self.workdir / f"driver-{self.runs}.bat"
        driver.write_bytes(("\r\n".join(lines) + "\r\n").encode("ascii"))
        for attempt in range(2):
            result = subprocess.run(
                ["wine", "cmd", "/c", windows_path(driver)],
                capture_output=True,
                text=True,
                env=self.env,
                timeout=120,
            )
            exit_lines = [line for line in result.stdout.splitlines() if line.startswith("LAUNCHER_EXIT=")]
            records = log.read_text(encoding="ascii").splitlines() if log.exists() else []
            run = CmdRun(result.stdout, int(exit_lines[-1].split("=")[1]) if exit_lines else None, records)
            # Now and then, on a loaded machine, Wine's cmd fails to start the first program of a run and reports
            # 9009 ("not recognized") with nothing started: once more. A launcher that calls a program that is
            # not there gets 9009 again.
            if attempt or run.launcher_exit != 9009 or records:
                return run
        return run


@pytest.fixture(scope="session")
def wine_cmd(tmp_path_factory):
    wine = WineCmd(tmp_path_factory.mktemp("wine"))
    yield wine
    wine.close()
