"""The docs cannot drift from copier.yml."""

from __future__ import annotations

import yaml

from render import TEMPLATE


def questions() -> dict:
    config = yaml.safe_load((TEMPLATE / "copier.yml").read_text(encoding="utf-8"))
    return {k: v for k, v in config.items() if not k.startswith("_") and v.get("when") is not False}


def test_questions_reference_lists_every_question_and_choice():
    page = (TEMPLATE / "docs" / "questions.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip().strip("`"): line for line in page.splitlines() if line.startswith("| `")}
    assert list(rows) == list(questions()), "docs/questions.md must list the questions in copier.yml's order"
    for key, question in questions().items():
        for choice in (question.get("choices") or {}).values():
            assert f"`{choice}`" in rows[key], f"{key}: choice {choice} is missing from docs/questions.md"


def test_every_troubleshooting_entry_quotes_an_error_and_says_what_the_template_does():
    page = (TEMPLATE / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    entries = page.split("\n### ")[1:]
    assert len(entries) >= 19  # one per row of the Windows facts table, at least
    for entry in entries:
        assert entry.strip().splitlines()[1:], entry.splitlines()[0]
