"""Every page of the docs site has its Chinese translation beside it (page.md / page.zh.md), and the two say
the same things where a reader copies or follows them: a page changed in one language and not the other
fails here, naming the page and what differs.

Compared: the headings of each level (count), every fenced code block and every table a benchmark writes
between markers (byte for byte, in order), the set of inline code spans (commands, flags, file names and error
texts stay verbatim in both), the error texts of the troubleshooting headings, the table rows (count) and the
link targets (the same ones, each to a page that exists).
The prose between them is the translator's. A project whose README is Chinese ships the Chinese pages of its
docs/ too, from the same source.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from render import ANSWER_SETS, SHIPPED_PAGES, TEMPLATE

DOCS = TEMPLATE / "docs"
ENGLISH = sorted(path for path in DOCS.glob("*.md") if not path.name.endswith(".zh.md"))
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)[^\n]*\n.*?^(?P=indent)(?P=fence)[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)
# What a benchmark writes into a page (docs/performance.md) between <!-- NAME:start --> and <!-- NAME:end -->.
GENERATED = re.compile(r"<!-- ([\w:-]+):start -->.*?<!-- \1:end -->", re.S)
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# A part of a page for one OS: the site shows it, a project keeps it (without the markers) where it runs there.
ONLY_OS = re.compile(r"<!-- only (\w+) -->\n(.*?)<!-- /only -->\n", re.S)


def chinese(english: Path) -> Path:
    return english.with_name(english.stem + ".zh.md")


class Markdown:
    """What a page holds that must not differ between its two languages."""

    def __init__(self, path: Path) -> None:
        text = path.read_text(encoding="utf-8")
        self.code_blocks = [match.group(0) for match in FENCE.finditer(text)]
        self.generated = [match.group(0) for match in GENERATED.finditer(text)]
        prose = FENCE.sub("", text)
        self.headings = Counter(len(line) - len(line.lstrip("#")) for line in prose.splitlines()
                                if re.match(r"#{1,6} ", line))  # fmt: skip
        # The code spans of each heading, in heading order (Chinese grammar may reorder them within one).
        self.heading_code = [sorted(span for _, span in INLINE_CODE.findall(line))
                             for line in prose.splitlines() if re.match(r"#{1,6} ", line)]  # fmt: skip
        # A span that wraps onto the next line is the same span: compare it with its whitespace collapsed.
        self.inline_code = {" ".join(span.split()) for _, span in INLINE_CODE.findall(prose)}
        self.table_rows = sum(1 for line in prose.splitlines() if line.lstrip().startswith("|"))
        self.links = Counter(LINK.findall(INLINE_CODE.sub("", prose)))


@pytest.mark.parametrize("english", ENGLISH, ids=lambda path: path.name)
def test_every_page_has_its_chinese_translation_saying_the_same_things(english):
    translated = chinese(english)
    assert translated.is_file(), f"{english.name} has no Chinese page: write docs/{translated.name}"
    en, zh = Markdown(english), Markdown(translated)
    page = f"{english.name} / {translated.name}"
    assert zh.headings == en.headings, f"{page}: headings per level differ (level: count)"
    counts = f"{len(en.code_blocks)} vs {len(zh.code_blocks)}"
    assert len(zh.code_blocks) == len(en.code_blocks), f"{page}: {counts} code blocks"
    for number, (ours, theirs) in enumerate(zip(en.code_blocks, zh.code_blocks, strict=True), 1):
        assert theirs == ours, f"{page}: code block {number} differs"
    assert zh.generated == en.generated, f"{page}: the benchmark's tables differ (copy them from {english.name})"
    assert sorted(en.inline_code - zh.inline_code) == [], f"{page}: inline code only in {english.name}"
    assert sorted(zh.inline_code - en.inline_code) == [], f"{page}: inline code only in {translated.name}"
    assert zh.table_rows == en.table_rows, f"{page}: {en.table_rows} vs {zh.table_rows} table rows"
    assert zh.links == en.links, f"{page}: the link targets differ"
    for target in en.links:
        if "://" not in target and not target.startswith(("#", "mailto:")):
            linked = english.parent / target.split("#")[0]
            assert linked.is_file() and chinese(linked).is_file(), f"{page}: link to {target} has no page in both"


def test_troubleshooting_keeps_every_error_text_in_both_languages():
    """The heading a reader finds by pasting the error must be there, verbatim, in the Chinese page too."""
    english, translated = Markdown(DOCS / "troubleshooting.md"), Markdown(DOCS / "troubleshooting.zh.md")
    errors = [code for code in english.heading_code if code]
    assert len(errors) >= 20
    assert [code for code in translated.heading_code if code] == errors, "troubleshooting.zh.md: an error text differs"


def test_every_chinese_page_has_its_english_page():
    orphans = [path.name for path in DOCS.glob("*.zh.md") if not (DOCS / path.name.replace(".zh.md", ".md")).is_file()]
    assert orphans == []


@pytest.mark.parametrize("name", ANSWER_SETS)
def test_the_project_ships_its_docs_in_its_readme_languages_and_their_links_resolve(rendered, name):
    project = rendered(name)
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text(encoding="utf-8"))
    language, target_os = answers["readme_language"], answers["target_os"]
    suffixes = [""] if language == "en" else ["", ".zh-CN"]
    docs = project / "docs"
    assert sorted(path.name for path in docs.iterdir()) == sorted(f"{page}{suffix}.md" for page in SHIPPED_PAGES
                                                                  for suffix in suffixes)  # fmt: skip
    without_links = re.compile(r"\]\([^)]*\)")
    for page in SHIPPED_PAGES:
        for suffix, source in (("", f"{page}.md"), (".zh-CN", f"{page}.zh.md"))[: len(suffixes)]:
            shipped = (docs / f"{page}{suffix}.md").read_text(encoding="utf-8")
            site = ONLY_OS.sub(lambda part: part[2] if target_os in (part[1], "both") else "",
                               (DOCS / source).read_text(encoding="utf-8"))  # fmt: skip
            assert without_links.sub("]", shipped) == without_links.sub("]", site), f"docs/{page}{suffix}.md"
    readmes = {path.name: path for path in project.glob("README*.md")}
    if language != "en":
        chinese_readme = readmes["README.zh-CN.md" if language == "both" else "README.md"].read_text(encoding="utf-8")
        assert [page for page in SHIPPED_PAGES if f"](docs/{page}.zh-CN.md)" not in chinese_readme] == []
    broken = []
    for path in [*readmes.values(), *docs.iterdir()]:
        for target in LINK.findall(path.read_text(encoding="utf-8")):
            if "://" not in target and not target.startswith("#"):
                if not (path.parent / target.split("#")[0]).is_file():
                    broken.append(f"{path.relative_to(project)}: {target}")
                elif path.name.endswith(".zh-CN.md") and target.startswith(SHIPPED_PAGES) and ".zh-CN." not in target:
                    broken.append(f"{path.relative_to(project)}: {target} is the English page")
    assert broken == []
