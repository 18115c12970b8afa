"""The docs cannot drift from copier.yml."""

from __future__ import annotations

import yaml

from render import TEMPLATE


def questions() -> dict:
    config = yaml.safe_load((TEMPLATE / "copier.yml").read_text(encoding="utf-8"))
    return {k: v for k, v in config.items() if not k.startswith("_") and v.get("when") is not False}


def choice_values(question: dict) -> list:
    """A choice is a plain value, or {value, validator} when earlier answers can rule it out."""
    return [c["value"] if isinstance(c, dict) else c for c in (question.get("choices") or {}).values()]


def refusing(question: dict) -> bool:
    choices = (question.get("choices") or {}).values()
    return bool(question.get("validator")) or any(isinstance(c, dict) and c.get("validator") for c in choices)


def test_questions_reference_lists_every_question_and_choice():
    page = (TEMPLATE / "docs" / "questions.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip().strip("`"): line for line in page.splitlines() if line.startswith("| `")}
    assert list(rows) == list(questions()), "docs/questions.md must list the questions in copier.yml's order"
    for key, question in questions().items():
        for choice in choice_values(question):
            assert f"`{choice}`" in rows[key], f"{key}: choice {choice} is missing from docs/questions.md"


def test_every_refusing_question_has_its_why_under_its_key():
    """Refusals are one short line at the prompt; the page explains each, under a heading named by the key."""
    page = (TEMPLATE / "docs" / "questions.md").read_text(encoding="utf-8")
    sections = {part.split("\n", 1)[0].strip().strip("`"): part for part in page.split("\n### ")[1:]}
    for key, question in questions().items():
        if refusing(question):
            assert key in sections, f"docs/questions.md has no '### `{key}`' section explaining its refusals"
            assert len(sections[key].split("\n", 1)[1].strip()) > 40, f"{key}: the why is missing"


def test_every_troubleshooting_entry_quotes_an_error_and_says_what_the_template_does():
    page = (TEMPLATE / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    entries = page.split("\n### ")[1:]
    assert len(entries) >= 19  # one per row of the Windows facts table, at least
    for entry in entries:
        assert entry.strip().splitlines()[1:], entry.splitlines()[0]


def test_the_cuda_section_names_every_driver_floor_of_cuda_drivers():
    """docs/questions.md quotes the floors in prose: each number in copier.yml's cuda_drivers is there."""
    config = yaml.safe_load((TEMPLATE / "copier.yml").read_text(encoding="utf-8"))
    drivers = yaml.safe_load(config["cuda_drivers"]["default"])
    page = (TEMPLATE / "docs" / "questions.md").read_text(encoding="utf-8")
    section = page.split("\n### `cuda`\n", 1)[1].split("\n### ", 1)[0]
    missing = {f"{tag} {system}: {floors[system]}" for tag, floors in drivers.items() for system in ("linux", "windows")
               if floors[system] not in section}  # fmt: skip
    assert missing == set()
