"""torchvision / torchaudio pins: every release in copier.yml's torch_releases, rendered, agrees with what
the companion's wheel declares (Requires-Dist), as published on PyPI.

The metadata was fetched once with `pip download --no-deps` (the command is in the file) and stored in
tests/data/companions.json, since the index is not reachable from every test machine.
"""

from __future__ import annotations

import json

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from render import TEMPLATE, render

CONFIG = yaml.safe_load((TEMPLATE / "copier.yml").read_text(encoding="utf-8"))
RELEASES = yaml.safe_load(CONFIG["torch_releases"]["default"])
MATRIX = yaml.safe_load(CONFIG["support_matrix"]["default"])
PUBLISHED = {
    (row["name"], row["version"]): row
    for row in json.loads((TEMPLATE / "tests" / "data" / "companions.json").read_text(encoding="utf-8"))["packages"]
}
COMPANIONS = ("torchvision", "torchaudio")


def torch_requirement(name: str, version: str) -> Requirement | None:
    row = PUBLISHED.get((name, version))
    assert row is not None, f"no stored metadata for {name}=={version}: fetch it (see tests/data/companions.json)"
    found = [Requirement(text) for text in row["requires_dist"] if Requirement(text).name == "torch"]
    return found[0] if found else None


def test_every_series_of_the_matrix_has_its_releases_and_nothing_else():
    series = {".".join(release.split(".")[:2]) for release in RELEASES}
    assert series == set(MATRIX)
    assert "2.14.1" in RELEASES and "2.15.0" in RELEASES


@pytest.mark.parametrize("release", RELEASES)
def test_each_pin_is_the_companion_published_for_that_torch(release):
    for name in COMPANIONS:
        version = RELEASES[release].get(name)
        if version is None:
            continue
        requirement = torch_requirement(name, version)
        if requirement is not None:  # torchaudio 2.11.0 declares no torch requirement at all
            assert Version(release) in requirement.specifier, f"{name} {version} requires {requirement}"
        # The newest companion that accepts this torch and was published before the next torch: no newer one
        # of the same series pins this release exactly.
        newer = [
            other
            for (other_name, other), row in PUBLISHED.items()
            if other_name == name and Version(other) > Version(version)
            and any(text.replace(" ", "").replace("(", "").replace(")", "") == f"torch=={release}"
                    for text in row["requires_dist"])
        ]  # fmt: skip
        assert newer == [], f"{name} {newer} pins torch=={release} exactly, newer than {version}"


def test_a_missing_companion_is_one_that_was_never_published():
    """torchaudio's last release is 2.11.x; torchvision has none for torch 2.15.0 yet."""
    audio = {version for name, version in PUBLISHED if name == "torchaudio"}
    vision = {version for name, version in PUBLISHED if name == "torchvision"}
    for release, companions in RELEASES.items():
        if "torchaudio" not in companions:
            assert Version(release) >= Version("2.12"), release
            assert not any(v.startswith(".".join(release.split(".")[:2]) + ".") for v in audio)
        if "torchvision" not in companions:
            assert release == "2.15.0" and not any(Version(v) >= Version("0.30") for v in vision)


@pytest.mark.parametrize("series", [s for s in MATRIX if MATRIX[s].get("index") is not False])
def test_rendered_pins_agree_with_the_published_metadata(tmp_path, series):
    release = max((r for r in RELEASES if r.startswith(series + ".")), key=Version)
    offered = [name for name in COMPANIONS if name in RELEASES[release]]
    python = "3.11" if "3.11" in MATRIX[series]["python"] else MATRIX[series]["python"][-1]
    answers = {"torch_version": release, "extras": offered, "python_version": python, "target_os": "linux"}
    render(tmp_path / "p", answers)
    lines = (tmp_path / "p" / "requirements.txt").read_text(encoding="utf-8").splitlines()
    pins = {line.split("==")[0]: line.split("==")[1] for line in lines if "==" in line}
    assert pins.pop("torch") == f"{release}+cpu"
    assert set(pins) == set(offered)
    for name, pin in pins.items():
        version, tag = pin.split("+")
        assert tag == "cpu"
        requirement = torch_requirement(name, version)
        assert requirement is None or Version(release) in requirement.specifier


def test_torchaudio_for_a_torch_without_one_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ValueError) as refusal:
        render(tmp_path / "p", {"extras": ["torchvision", "torchaudio"]})
    assert str(refusal.value) == "Invalid choice for 'extras': use torch 2.11.0 or older for torchaudio"
    assert not (tmp_path / "p").exists()
