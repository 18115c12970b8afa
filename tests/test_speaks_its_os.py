"""A project speaks its own OS: its READMEs (en and zh-CN) and the docs it ships show the commands, paths and
errors of the OS it was generated for, and a project for both labels every command block with its OS."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from render import render

# What a page of a project for one OS must not show: the other OS's commands and paths.
FOREIGN = {
    "linux": {
        "a .bat launcher": r"\.bat\b",
        "a .ps1 launcher": r"\.ps1\b",
        "a backslash path": r"\w\\\w",
        "taskkill": r"\btaskkill\b",
        "ipconfig": r"\bipconfig\b",
        "netsh": r"\bnetsh\b",
        "the Anaconda Prompt": r"Anaconda Prompt",
        "cmd's set": r"`set \w+=",
        "a cmd or PowerShell block": r"^```(bat|cmd|powershell)\b",
    },
    "windows": {
        "a .sh launcher": r"\.sh\b",
        "a / script path": r"\bscripts/",
        "bash's source": r"\bsource \S",
        "bash's export": r"\bexport \w+=",
        "kill -9": r"\bkill -9\b",
        "Slurm": r"\bsbatch\b",
    },
}
# What each must show: its own launcher and its own way to activate a .venv.
OWN = {
    "linux": ["scripts/setup_env.sh", "scripts/train.sh", "source .venv/bin/activate",
              "python scripts/find_conflicts.py"],
    "windows": ["scripts\\setup_env.bat", "scripts\\train.bat", "scripts\\train.ps1", ".venv\\Scripts\\activate.bat",
                "python scripts\\find_conflicts.py"],
}  # fmt: skip
OWN["both"] = OWN["linux"] + OWN["windows"]
COMMAND_FENCE = re.compile(r"^```(bash|sh|shell|console|bat|cmd|powershell|ps1)\s*$")
OS_LABEL = re.compile(r"(Windows|Linux).*[:：]\s*$")


class Projects(dict):
    """One project per target_os, with both READMEs, each rendered when a test first asks for it: xdist spreads
    the tests over workers, and each worker renders only the ones its tests read."""

    def __init__(self, tmp_path_factory) -> None:
        super().__init__()
        self.tmp_path_factory = tmp_path_factory

    def __missing__(self, target_os: str) -> Path:
        project = self.tmp_path_factory.mktemp(target_os) / "p"
        render(project, {"target_os": target_os, "readme_language": "both"})
        self[target_os] = project  # kept only once whole
        return project


@pytest.fixture(scope="module")
def projects(tmp_path_factory):
    return Projects(tmp_path_factory)


def pages_of(project):
    pages = [project / "README.md", project / "README.zh-CN.md", *sorted((project / "docs").glob("*.md"))]
    found = {page.relative_to(project).as_posix(): page.read_text(encoding="utf-8") for page in pages}
    shipped = {f"docs/{page}{language}.md" for page in ("make-it-your-own", "updating") for language in ("", ".zh-CN")}
    assert found.keys() == {"README.md", "README.zh-CN.md", *shipped}  # the docs in both languages, as the READMEs
    return found


@pytest.mark.parametrize("target_os", ["linux", "windows", "both"])
def test_every_page_shows_only_the_commands_of_the_projects_os(projects, target_os):
    found = []
    for name, text in pages_of(projects[target_os]).items():
        for number, line in enumerate(text.splitlines(), 1):
            found += [f"{name}:{number}: {what}: {line}" for what, pattern in FOREIGN.get(target_os, {}).items()
                      if re.search(pattern, line)]  # fmt: skip
    assert found == []
    readmes = pages_of(projects[target_os])
    for name in ("README.md", "README.zh-CN.md"):
        assert [command for command in OWN[target_os] if command not in readmes[name]] == [], name


def test_a_project_for_both_labels_every_command_block_with_its_os(projects):
    unlabelled = []
    for name, text in pages_of(projects["both"]).items():
        lines = text.splitlines()
        for number, line in enumerate(lines):
            if COMMAND_FENCE.match(line):
                before = next((previous for previous in reversed(lines[:number]) if previous.strip()), "")
                if not OS_LABEL.search(before):
                    unlabelled.append(f"{name}:{number + 1}: after {before!r}")
    assert unlabelled == []
    readme = pages_of(projects["both"])["README.md"]
    assert readme.count("Linux (bash):") >= 5 and readme.count("Windows (cmd):") >= 5
