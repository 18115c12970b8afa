"""`copier update` from a real older template version, in hermetic git repositories.

The template's working tree is committed and tagged v1 in a temporary repository; a realistic
change (a launcher line, a new file, a new default) becomes v2. Projects are generated at v1
and updated to v2 as a user would. One scenario starts instead from this repository's own commit
MAIN_BEFORE, the main branch as projects were generated from it, and updates to the working tree.
Marked `update`: `nox -s update` runs these.
"""

from __future__ import annotations

import csv
import filecmp
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import copier
import pytest

from render import TEMPLATE, copy_template

pytestmark = pytest.mark.update

# main before the engine lost its compatibility code (issue 49): its src/<package>/config.py and loaders.py are gone.
MAIN_BEFORE = "3d97003fb864871789a5d3ce06721bbfcf09eb10"


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout


GITCONFIG = (
    "[user]\n\tname = Test\n\temail = test@example.invalid\n[core]\n\tautocrlf = input\n"
    "[init]\n\tdefaultBranch = main\n[commit]\n\tgpgsign = false\n"
)


def hermetic(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """git and copier read only the settings written into FOLDER."""
    config = folder / "gitconfig"
    config.write_text(GITCONFIG, encoding="utf-8")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    settings = folder / "copier-settings.yml"
    settings.write_text("{}\n", encoding="utf-8")
    monkeypatch.setenv("COPIER_SETTINGS_PATH", str(settings))
    return config


@pytest.fixture(autouse=True)
def hermetic_git(tmp_path, monkeypatch):
    return hermetic(tmp_path, monkeypatch)


def make_versions(repo: Path) -> Path:
    """A template repository with tags v1 (the working tree) and v2 (v1 plus a realistic change)."""
    copy_template(repo)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "v1")
    git(repo, "tag", "v1")
    # v2: a launcher gains a line, a new file appears, a default changes.
    bat = repo / "template" / "scripts" / "train.bat.jinja"
    text = bat.read_text(encoding="utf-8")
    bat.write_text(text.replace('set "USE_LIBUV=0"\n', 'set "USE_LIBUV=0"\nset "PYTHONUTF8=1"\n'), encoding="utf-8")
    (repo / "template" / "docs").mkdir(exist_ok=True)
    (repo / "template" / "docs" / "UPGRADING.md").write_text("# Upgrading\n\nNew in v2.\n", encoding="utf-8")
    config = repo / "template" / "configs" / "train.toml.jinja"
    config.write_text(config.read_text(encoding="utf-8").replace("timeout_s = 300 ", "timeout_s = 600 "), "utf-8")
    git(repo, "commit", "-qam", "v2")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "v2 files")
    git(repo, "tag", "v2")
    return repo


def generate(template: Path, destination: Path, ref: str, **data) -> Path:
    copier.run_copy(str(template), str(destination), data=data, defaults=True, vcs_ref=ref, quiet=True)
    git(destination, "init", "-q")
    git(destination, "add", "-A")
    git(destination, "commit", "-qm", "generated")
    return destination


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The template repository (v1, v2) and a default project generated at v1 and committed, built once per
    module with the same hermetic settings: tests that only read the repository share it, and each test that
    edits a project edits its own copy of the generated one."""
    folder = tmp_path_factory.mktemp("versions")
    with pytest.MonkeyPatch.context() as monkeypatch:
        hermetic(folder, monkeypatch)
        versions = make_versions(folder / "template-repo")
        generated = generate(versions, folder / "generated-v1", "v1")
    return versions, generated


@pytest.fixture
def versions(built) -> Path:
    return built[0]


@pytest.fixture
def generated_v1(built, tmp_path):
    """A copy of the default project generated at v1 (with its git repository), for the test to change."""

    def copy(name: str) -> Path:
        return Path(shutil.copytree(built[1], tmp_path / name, symlinks=True))

    return copy


def update(project: Path, ref: str = "v2", **options) -> None:
    copier.run_update(str(project), defaults=True, overwrite=True, vcs_ref=ref, quiet=True, **options)


def tree(root: Path) -> dict[str, bytes]:
    files = {}
    for path in root.rglob("*"):
        relative = path.relative_to(root).as_posix()
        if path.is_file() and not relative.startswith(".git/"):
            files[relative] = path.read_bytes()
    return files


def find_conflicts(project: Path) -> subprocess.CompletedProcess:
    script = project / "scripts" / "find_conflicts.py"
    return subprocess.run([sys.executable, str(script), str(project)], capture_output=True, text=True)


def test_update_without_edits_equals_a_fresh_copy(versions, generated_v1, tmp_path):
    updated = generated_v1("updated")
    update(updated)
    fresh = tmp_path / "fresh"
    copier.run_copy(str(versions), str(fresh), defaults=True, vcs_ref="v2", quiet=True)
    old, new = tree(updated), tree(fresh)
    for files in (old, new):  # the only line allowed to differ
        answers = files[".copier-answers.yml"].splitlines(keepends=True)
        files[".copier-answers.yml"] = b"".join(line for line in answers if not line.startswith(b"_commit:"))
    assert old.keys() == new.keys()
    assert [name for name in old if old[name] != new[name]] == []
    assert b'set "PYTHONUTF8=1"' in old["scripts/train.bat"]  # the update really moved to v2


def test_user_edits_survive_and_the_template_change_arrives(generated_v1):
    project = generated_v1("project")
    train = next((project / "src").glob("*/train.py"))
    train.write_text(train.read_text(encoding="utf-8") + "\n\n# my own note about this run\n", encoding="utf-8")
    config = project / "configs" / "train.toml"
    config.write_text(config.read_text(encoding="utf-8").replace("epochs = 5", "epochs = 9"), encoding="utf-8")
    (project / "notes.md").write_text("mine\n", encoding="utf-8")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "my edits")
    update(project)
    assert train.read_text(encoding="utf-8").endswith("# my own note about this run\n")
    text = config.read_text(encoding="utf-8")
    assert "epochs = 9" in text and "timeout_s = 600" in text
    assert (project / "notes.md").read_text(encoding="utf-8") == "mine\n"
    assert b'set "PYTHONUTF8=1"\r\n' in (project / "scripts" / "train.bat").read_bytes()
    assert (project / "docs" / "UPGRADING.md").is_file()
    assert find_conflicts(project).returncode == 0


def test_recipe_edits_survive_an_engine_change_and_the_project_still_trains(versions, tmp_path):
    # v3 changes the engine (a log line in engine/trainer.py) and the template's own toy recipe, in a copy of the
    # shared repository.
    versions = Path(shutil.copytree(versions, tmp_path / "template-repo", symlinks=True))
    package_dir = versions / "template" / "src" / "{{ package_name }}"
    trainer = package_dir / "engine" / "trainer.py"
    trainer.write_text(
        trainer.read_text(encoding="utf-8").replace(
            "        self.resume()\n", '        self.resume()\n        self.log.debug("engine v3")\n'
        ),
        encoding="utf-8",
    )
    template_recipe = package_dir / "recipe.py"
    template_recipe.write_text(
        template_recipe.read_text(encoding="utf-8").replace(
            'momentum=config.settings["momentum"])', 'momentum=config.settings["momentum"], nesterov=True)'
        ),
        encoding="utf-8",
    )
    git(versions, "commit", "-qam", "v3")
    git(versions, "tag", "v3")
    project = generate(versions, tmp_path / "project", "v1")
    package = next((project / "src").glob("*/recipe.py")).parent
    recipe = package / "recipe.py"
    mine = recipe.read_text(encoding="utf-8")
    mine = mine.replace(
        'torch.optim.SGD(model.parameters(), lr=config.settings["lr"], momentum=config.settings["momentum"])',
        "torch.optim.AdamW(model.parameters(), lr=0.01)",
    )
    mine = mine.replace(
        "functional.cross_entropy(outputs.float(), targets)",
        "functional.cross_entropy(outputs.float(), targets, label_smoothing=0.1)",
    )
    assert "AdamW" in mine and "label_smoothing" in mine
    recipe.write_text(mine, encoding="utf-8")
    git(project, "commit", "-qam", "my recipe")
    update(project, ref="v3")
    assert recipe.read_text(encoding="utf-8") == mine  # untouched: no merge, no conflict markers
    assert 'self.log.debug("engine v3")' in (package / "engine" / "trainer.py").read_text(encoding="utf-8")
    assert find_conflicts(project).returncode == 0
    result = subprocess.run(
        [sys.executable, "-m", f"{package.name}.train", "--device", "cpu", "--backend", "gloo", "--precision", "no",
         "--parallelism", "ddp", "--nproc-per-node", "2", "--epochs", "1", "--samples", "256", "--no-progress",
         "--output-dir", str(tmp_path / "run")],
        cwd=project, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(project / "src")},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "engine v3" in (tmp_path / "run" / "logs" / "rank0.log").read_text(encoding="utf-8")


@pytest.mark.parametrize("mode", ["inline", "rej"])
def test_conflicting_edits_are_reported(generated_v1, mode):
    project = generated_v1("project")
    config = project / "configs" / "train.toml"
    config.write_text(config.read_text(encoding="utf-8").replace("timeout_s = 300 ", "timeout_s = 120 "), "utf-8")
    git(project, "commit", "-qam", "shorter timeout")
    update(project, conflict=mode)  # exits normally even though the same line changed on both sides
    report = find_conflicts(project)
    assert report.returncode == 1
    expected = "configs/train.toml (conflict markers)" if mode == "inline" else "configs/train.toml.rej"
    assert expected in report.stdout
    assert report.stdout.count("\n") == 1  # one line


def test_changed_answers_regenerate_every_dependent_file(generated_v1, tmp_path):
    project = generated_v1("project")
    update(project, data={"gpus_per_node": 2, "cuda": "cu126", "nproc_per_node": 2, "master_port": 29700})
    assert "torch==2.13.0+cu126" in (project / "requirements.txt").read_text(encoding="utf-8")
    config = (project / "configs" / "train.toml").read_text(encoding="utf-8")
    assert 'device = "cuda"' in config and "master_port = 29700" in config and 'cuda = "cu126"' in config
    for launcher in ("train.bat", "train.ps1", "train.sh"):  # they carry no setting: the config is the one source
        assert (
            b"29700" not in (project / "scripts" / launcher).read_bytes()
            and b"29500" not in (project / "scripts" / launcher).read_bytes()
        )
    assert "2 GPUs per machine with the cu126 build" in (project / "README.md").read_text(encoding="utf-8")
    assert find_conflicts(project).returncode == 0
    # The updated project's own fast tests still pass (its training tests run in render_and_test).
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_cli.py", "tests/test_model.py"],
        cwd=project, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(project / "src")},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("autocrlf", ["input", "true"])
def test_bat_files_stay_crlf_after_an_update(versions, tmp_path, hermetic_git, autocrlf):
    hermetic_git.write_text(hermetic_git.read_text().replace("autocrlf = input", f"autocrlf = {autocrlf}"))
    project = generate(versions, tmp_path / "project", "v1")
    update(project)
    for script in ("train.bat", "setup_env.bat", "train.ps1"):
        data = (project / "scripts" / script).read_bytes()
        assert data.count(b"\n") == data.count(b"\r\n"), script


def test_recopy_restores_a_deleted_template_file(built, generated_v1):
    project = generated_v1("project")
    (project / "scripts" / "train.ps1").unlink()
    git(project, "commit", "-qam", "oops")
    copier.run_recopy(str(project), defaults=True, overwrite=True, quiet=True)
    fresh = built[1]  # the same copy at v1, untouched
    assert filecmp.cmp(project / "scripts" / "train.ps1", fresh / "scripts" / "train.ps1", shallow=False)


@pytest.fixture
def main_to_current(tmp_path) -> Path:
    """A template repository whose v1 is this repository at MAIN_BEFORE and whose v2 is the working tree.

    v1 is read with `git archive`, so the tags live only in the temporary repository: a tag in this one would
    change the version `copier copy` picks. CI's checkout has the history (fetch-depth: 0).
    """
    archive = subprocess.run(["git", "archive", "--format=tar", MAIN_BEFORE], cwd=TEMPLATE, capture_output=True)
    assert archive.returncode == 0, f"needs this repository's history with {MAIN_BEFORE}: {archive.stderr!r}"
    repo = tmp_path / "template-repo"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as old:
        old.extractall(repo, filter="data")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "main before")
    git(repo, "tag", "v1")
    for part in ("copier.yml", "template", "includes", "docs"):  # every path copier reads, as the tree has them now
        shutil.rmtree(repo / part) if (repo / part).is_dir() else (repo / part).unlink()
    copy_template(repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "working tree", "--allow-empty")
    git(repo, "tag", "v2")
    return repo


def test_a_project_from_main_with_its_own_recipe_updates_and_trains(main_to_current, tmp_path):
    project = generate(main_to_current, tmp_path / "project", "v1")
    package = next((project / "src").glob("*/recipe.py")).parent
    # The user's own recipe: the template's toy files edited in place, their imports kept.
    edits = {
        "recipe.py": [
            (
                'torch.optim.SGD(model.parameters(), lr=config.settings["lr"], momentum=config.settings["momentum"])',
                "torch.optim.AdamW(model.parameters(), lr=0.01)",
            ),
            ("functional.cross_entropy(outputs.float(), targets)", "functional.cross_entropy(outputs.float(), "
             "targets, label_smoothing=0.1)"),
        ],
        "model.py": [("HIDDEN = 10\n", "HIDDEN = 24\n")],
        "data.py": [("labels = (inputs @ teacher).argmax(dim=1)", "labels = torch.relu(inputs @ teacher).argmax(1)")],
    }  # fmt: skip
    config_edits = [("epochs = 5\n", "epochs = 2\n"), ("samples = 2048 ", "samples = 384 ")]
    for name, changes in edits.items():
        edit(package / name, changes)
    edit(project / "configs" / "train.toml", config_edits)
    git(project, "commit", "-qam", "my recipe and settings")
    mine = {name: (package / name).read_bytes() for name in edits}

    # What each version renders on its own, with the same answers.
    old = tree(generate(main_to_current, tmp_path / "old", "v1"))
    new = tree(generate(main_to_current, tmp_path / "new", "v2"))
    removed = old.keys() - new.keys()
    assert {f"src/{package.name}/config.py", f"src/{package.name}/loaders.py"} <= removed, removed

    # As docs/updating.md says: from the project's folder, no --trust.
    result = subprocess.run(
        [sys.executable, "-m", "copier", "update", "--defaults"], cwd=project, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "_commit: v2\n" in (project / ".copier-answers.yml").read_text(encoding="utf-8")
    for name, data in mine.items():
        assert (package / name).read_bytes() == data, name
    updated = tree(project)
    assert sorted(removed & updated.keys()) == []  # the old layout's files the template no longer has are gone
    assert updated.keys() == new.keys()  # and nothing else is left over or missing
    users = {f"src/{package.name}/{name}" for name in edits} | {"configs/train.toml", ".copier-answers.yml"}
    assert [name for name in new.keys() - users if updated[name] != new[name]] == []  # the template's files as v2
    config = new["configs/train.toml"].decode("utf-8")
    for before, after in config_edits:
        assert before in config, f"v2's train.toml has no {before!r}: update this test's edit"
        config = config.replace(before, after)
    assert updated["configs/train.toml"].decode("utf-8") == config  # the user's edit kept, v2's changes arrived
    assert find_conflicts(project).returncode == 0

    # It trains, with the user's files and settings (2 epochs of 384 samples from configs/train.toml).
    run = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", f"{package.name}.train", "--device", "cpu", "--backend", "gloo", "--precision", "no",
         "--nproc-per-node", "2", "--no-progress", "--output-dir", str(run)],
        cwd=project, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(project / "src")},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    with open(run / "metrics.csv", encoding="utf-8", newline="") as handle:
        assert [row["epoch"] for row in csv.DictReader(handle)] == ["1", "2"]


def edit(path: Path, changes: list[tuple[str, str]]) -> None:
    """Apply each (old, new) replacement; each must match. Bytes in and out: line endings stay as rendered."""
    text = path.read_bytes().decode("utf-8")
    for before, after in changes:
        assert before in text, f"{path.name} has no {before!r}"
        text = text.replace(before, after)
    path.write_bytes(text.encode("utf-8"))
