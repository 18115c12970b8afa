"""Walk the whole support matrix: every torch series x CUDA tag x OS, and every series x Python.

The expected answer comes from this file's own copy of PyTorch's published tables (the facts
in docs/troubleshooting.md), not from copier.yml, so a wrong entry in the template's matrix fails here.
Renders run with pretend=True from a plain copy of the template: the questionnaire and every
template are evaluated, nothing is written, and nothing may be left behind.
"""

from __future__ import annotations

from pathlib import Path

import copier
import pytest

from render import copy_template

# torch series: (stable tags, experimental tags, Python versions with wheels usable by the code, Windows OK)
PUBLISHED = {
    "2.4": ({"cu118", "cu121"}, {"cu124"}, {"3.9", "3.10", "3.11", "3.12"}, True),
    "2.5": ({"cu118", "cu121", "cu124"}, set(), {"3.9", "3.10", "3.11", "3.12"}, True),
    "2.6": ({"cu118", "cu124"}, {"cu126"}, {"3.9", "3.10", "3.11", "3.12", "3.13"}, True),
    "2.7": ({"cu118", "cu126"}, {"cu128"}, {"3.9", "3.10", "3.11", "3.12", "3.13"}, True),
    "2.8": ({"cu126", "cu128"}, {"cu129"}, {"3.9", "3.10", "3.11", "3.12", "3.13"}, False),
    "2.9": ({"cu126", "cu128"}, {"cu130"}, {"3.10", "3.11", "3.12", "3.13", "3.14"}, False),
    "2.10": ({"cu126", "cu128"}, {"cu130"}, {"3.10", "3.11", "3.12", "3.13", "3.14"}, True),
    "2.11": ({"cu126", "cu128", "cu130"}, set(), {"3.10", "3.11", "3.12", "3.13", "3.14"}, True),
    "2.12": ({"cu126", "cu130"}, {"cu132"}, {"3.10", "3.11", "3.12", "3.13", "3.14"}, True),
    "2.13": ({"cu126", "cu130"}, {"cu132"}, {"3.10", "3.11", "3.12", "3.13", "3.14"}, True),
    "2.14": ({"cu126", "cu130", "cu132"}, set(), {"3.10", "3.11", "3.12", "3.13", "3.14"}, True),
}
ALL_TAGS = ["cpu", "cu118", "cu121", "cu124", "cu126", "cu128", "cu129", "cu130", "cu132"]
ALL_PYTHONS = ["3.8", "3.9", "3.10", "3.11", "3.12", "3.13", "3.14"]
OUT_OF_RANGE = {"2.3": "use 2.4 to 2.14", "2.15": "not on the index"}


def version_key(python: str) -> tuple[int, ...]:
    return tuple(int(part) for part in python.split("."))


def expected_refusal(series: str, tag: str, target_os: str, python: str) -> str | None:
    """The part of the one-line refusal that this table alone decides, or None when the answers are fine."""
    if series in OUT_OF_RANGE:
        return OUT_OF_RANGE[series]
    stable, experimental, pythons, windows_ok = PUBLISHED[series]
    if not windows_ok and target_os != "linux":
        return "use 2.10+: gloo fails on Windows"
    if python not in pythons:
        ordered = sorted(pythons, key=version_key)
        return f"use {ordered[0]} to {ordered[-1]} for torch {series}"
    if tag != "cpu" and tag not in stable | experimental:
        return f"no {tag} for {series}"
    return None


def cases():
    for series in [*PUBLISHED, *OUT_OF_RANGE]:
        for tag in ALL_TAGS:
            for target_os in ("windows", "linux", "both"):
                yield series, tag, target_os, "3.11" if series not in ("2.4", "2.5") else "3.10"
        for python in ALL_PYTHONS:
            yield series, "cpu", "linux", python


CASES = list(dict.fromkeys(cases()))


@pytest.fixture(scope="session")  # session: xdist interleaves modules
def plain_template(tmp_path_factory):
    return copy_template(tmp_path_factory.mktemp("template") / "plain")


def answers_for(series, tag, target_os, python):
    answers = {"torch_version": f"{series}.0", "cuda": tag, "target_os": target_os, "python_version": python}
    if tag != "cpu":
        answers["gpus_per_node"] = 1
    return answers


@pytest.mark.parametrize("case", CASES, ids=["-".join(case) for case in CASES])
def test_matrix_combination(plain_template: Path, tmp_path: Path, case):
    destination = tmp_path / "project"
    refusal = expected_refusal(*case)
    if refusal is None:
        copier.run_copy(str(plain_template), str(destination), data=answers_for(*case), defaults=True,
                        pretend=True, quiet=True)  # fmt: skip
    else:
        with pytest.raises(ValueError) as error:
            copier.run_copy(str(plain_template), str(destination), data=answers_for(*case), defaults=True,
                            pretend=True, quiet=True)  # fmt: skip
        message = str(error.value)
        assert refusal in message
        if refusal.startswith("no "):  # the fix names every tag published for that series
            stable, experimental = PUBLISHED[case[0]][:2]
            offered = message.split("': use ", 1)[1].split(":", 1)[0].split("/")
            assert set(offered) == stable | experimental, message
    assert not destination.exists()


def test_the_walk_covers_both_outcomes():
    accepted = sum(expected_refusal(*case) is None for case in CASES)
    assert len(CASES) > 350 and 100 < accepted < len(CASES) - 100
