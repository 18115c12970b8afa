"""The README's quick start, pasted into bash from the folder that holds the clone, then `copier update --defaults`
typed inside the project (as the generated README says) after the template changed: the user's edits survive.

The last two lines of the block (setup_env.sh, train.sh) are tested by tests/test_setup_env.py, where a local
index stands in for PyTorch's; here they are only checked to be those two scripts.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from render import TEMPLATE, TEMPLATE_ADDRESS, copy_template

pytestmark = pytest.mark.update


def readme_block() -> list[str]:
    text = (TEMPLATE / "README.md").read_text(encoding="utf-8")
    quick = text.split("To generate your own project", 1)[1]
    block = re.search(r"```bash\n(.*?)```", quick, re.S).group(1)
    return block.strip().splitlines()


def git(cwd: Path, env: dict, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True)


@pytest.fixture
def shell_env(tmp_path):
    """A user's shell: git that knows who they are and no settings of copier's own; copier from this Python."""
    config = tmp_path / "gitconfig"
    config.write_text("[user]\n\tname = Test\n\temail = test@example.invalid\n[init]\n\tdefaultBranch = main\n")
    settings = tmp_path / "copier-settings.yml"
    settings.write_text("{}\n")
    return {
        **os.environ,
        "GIT_CONFIG_GLOBAL": str(config),
        "GIT_CONFIG_NOSYSTEM": "1",
        "COPIER_SETTINGS_PATH": str(settings),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }


def test_the_quick_start_as_pasted_then_an_update_inside_the_project_keeps_the_users_edits(tmp_path, shell_env):
    lines = readme_block()
    commands = [line.split("  #")[0].strip() for line in lines]
    assert commands[-2:] == ["scripts/setup_env.sh", "scripts/train.sh"]
    clone = copy_template(tmp_path / TEMPLATE_ADDRESS)
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "v1"]):
        git(clone, shell_env, *command)
    pasted = "set -euo pipefail\n" + "\n".join(lines[:-2]) + "\n"
    done = subprocess.run(["bash", "-c", pasted], cwd=tmp_path, env=shell_env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    project = tmp_path / "my-ddp"
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text(encoding="utf-8"))
    assert Path(answers["_src_path"]).is_absolute()  # what makes the update below work from inside the project
    assert "Next steps" in done.stderr and "scripts\\setup_env.bat" in done.stderr  # _message_after_copy
    # The user's own edits, committed.
    train = project / "src" / "my_ddp" / "train.py"
    train.write_text(train.read_text(encoding="utf-8") + "\n# my note\n", encoding="utf-8")
    config = project / "configs" / "train.toml"
    config.write_text(config.read_text(encoding="utf-8").replace("epochs = 5", "epochs = 7"), encoding="utf-8")
    git(project, shell_env, "commit", "-qam", "mine")
    # The template moves on.
    bat = clone / "template" / "scripts" / "train.bat.jinja"
    bat.write_text(
        bat.read_text(encoding="utf-8").replace('set "USE_LIBUV=0"\n', 'set "USE_LIBUV=0"\nset "PYTHONUTF8=1"\n')
    )
    git(clone, shell_env, "commit", "-qam", "v2")
    # The generated README's update command, typed inside the project.
    readme = (project / "README.md").read_text(encoding="utf-8")
    assert "copier update --defaults\n" in readme
    updated = subprocess.run(["copier", "update", "--defaults"], cwd=project, env=shell_env, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
    assert updated.returncode == 0, updated.stderr[-3000:]
    assert "Local template must be a directory" not in updated.stderr
    assert train.read_text(encoding="utf-8").endswith("# my note\n")
    assert "epochs = 7" in config.read_text(encoding="utf-8")
    assert b'set "PYTHONUTF8=1"\r\n' in (project / "scripts" / "train.bat").read_bytes()
