"""configs/train.toml as a user edits it: every setting has another valid value in tests/edited_config.py, and
the file with all of them stays valid. `nox -s render_and_test` runs the project's both tiers with these edits in
place (noxfile.py, EDITED_ANSWER_SET): the user's file changes no test's result.
"""

from __future__ import annotations

import os
import subprocess
import sys

from edited_config import EDITS, NO_ALTERNATIVE, edit_every_setting, settings_of
from render import render

VALIDITY = "tests/test_cli.py::test_your_config_file_is_valid"


def validity(project) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(project / "src")}
    environment.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", VALIDITY],
        cwd=project, capture_output=True, text=True, timeout=300, env=environment,
    )  # fmt: skip


def test_every_setting_of_configs_train_toml_has_an_edit_and_the_edited_file_is_valid(tmp_path):
    project = tmp_path / "edited project"
    render(project, {"project_name": "edited-cfg"})
    config = project / "configs" / "train.toml"
    # A new setting needs a value in EDITS (or a reason in NO_ALTERNATIVE).
    assert settings_of(config).keys() == EDITS.keys() | NO_ALTERNATIVE
    as_generated = validity(project)
    assert f"{VALIDITY} PASSED" in as_generated.stdout, as_generated.stdout[-3000:] + as_generated.stderr[-3000:]
    edited = edit_every_setting(project)
    assert edited == {name: value.format(package="edited_cfg") for name, value in EDITS.items()}
    assert (project / "src" / "edited_cfg" / "my_recipe.py").is_file()
    result = validity(project)
    assert f"{VALIDITY} PASSED" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
