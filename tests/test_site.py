"""The documentation as a person reads it: the HTML that `mkdocs build --strict` writes, not the markdown.

The site is built once per test session (strict: any warning fails), in English and in Chinese (zh/); the
checks below hold for every page of both, each page's language switch leads to its counterpart, and the search
index finds Chinese words. The pages' numbered steps must
render as one list, command blocks must hold only commands and comments, every `copier copy` must name
the template by its one address, and the Linux path of getting-started must run as pasted (which also
installs the rendered environment.yml's pip section into a fresh environment).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest

from render import TEMPLATE, TEMPLATE_ADDRESS, copy_template, render

TESTS = Path(__file__).resolve().parent
# One worker runs them all: each worker would otherwise build the whole site for itself (seconds of CPU each).
pytestmark = pytest.mark.xdist_group("site")


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("material", reason="the docs theme (pip install mkdocs-material)")
    pytest.importorskip("mkdocs_static_i18n", reason="the site's two languages (pip install mkdocs-static-i18n)")
    folder = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=TEMPLATE, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    return folder


class Page(HTMLParser):
    """The parts of a built page these tests read: the article's lists and its code blocks."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.depth_in_article = 0
        self.open_lists: list[dict] = []
        self.lists: list[dict] = []  # {"kind", "items", "nested", "heading"}
        self.blocks: list[dict] = []  # {"language", "text", "heading"}
        self.heading = ""
        self.in_heading = False
        self.language = ""
        self.code: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "article":
            self.depth_in_article += 1
        if not self.depth_in_article:
            return
        if tag in ("h1", "h2", "h3"):
            self.in_heading, self.heading = True, ""
        elif tag in ("ol", "ul"):
            entry = {"kind": tag, "items": 0, "nested": bool(self.open_lists), "heading": self.heading}
            self.open_lists.append(entry)
            self.lists.append(entry)
        elif tag == "li" and self.open_lists:
            self.open_lists[-1]["items"] += 1
        elif tag == "div" and "language-" in attrs.get("class", ""):
            self.language = re.search(r"language-(\w+)", attrs["class"]).group(1)
        elif tag == "code" and self.language:
            self.code = []

    def handle_endtag(self, tag):
        if tag == "article":
            self.depth_in_article -= 1
        elif tag in ("h1", "h2", "h3"):
            self.in_heading = False
        elif tag in ("ol", "ul") and self.open_lists:
            self.open_lists.pop()
        elif tag == "code" and self.code is not None:
            self.blocks.append(
                {"language": self.language, "text": unescape("".join(self.code)), "heading": self.heading}
            )
            self.code, self.language = None, ""

    def handle_data(self, data):
        if self.in_heading:
            self.heading += data.strip("¶").strip()
        if self.code is not None:
            self.code.append(data)


def page(site: Path, name: str) -> Page:
    return Page((site / name / "index.html").read_text(encoding="utf-8"))


def all_pages(site: Path) -> dict[str, Page]:
    return {str(p.relative_to(site)): Page(p.read_text(encoding="utf-8")) for p in sorted(site.rglob("index.html"))
            if "search" not in p.parts}  # fmt: skip


@pytest.mark.parametrize("name", ["getting-started", "zh/getting-started"])
def test_getting_started_steps_render_as_one_numbered_list(site, name):
    numbered = [entry for entry in page(site, name).lists if entry["kind"] == "ol" and not entry["nested"]]
    assert [entry["items"] for entry in numbered] == [4], numbered  # steps 1-4 in one list, none split off


def english_pages(site: Path) -> list[str]:
    return [name for name in all_pages(site) if not name.startswith("zh/")]


def test_both_languages_build_every_page(site):
    english = english_pages(site)
    assert len(english) >= 11
    chinese = sorted(name for name in all_pages(site) if name.startswith("zh/"))
    assert chinese == sorted(f"zh/{name}" for name in english)


def test_code_blocks_keep_their_languages_in_both_languages(site):
    """A command block is highlighted as the shell it is pasted into, in the translation too."""
    pages = all_pages(site)
    for name in english_pages(site):
        languages = [block["language"] for block in pages[name].blocks]
        assert [block["language"] for block in pages[f"zh/{name}"].blocks] == languages, name
    assert {"bat", "bash", "powershell", "python", "toml"} <= {b["language"] for p in pages.values() for b in p.blocks}


class LanguageSwitch(HTMLParser):
    """The links of material's language selector: {language: href}."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.links: dict[str, str] = {}
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a" and "md-select__link" in attrs.get("class", "") and "hreflang" in attrs:
            self.links[attrs["hreflang"]] = attrs["href"]


def test_the_language_switch_links_each_page_to_its_counterpart(site):
    for name in english_pages(site):
        for language, own in (("en", name), ("zh", f"zh/{name}")):
            where = (site / own).parent
            links = LanguageSwitch((site / own).read_text(encoding="utf-8")).links
            assert set(links) == {"en", "zh"}, own
            for target_language, target in links.items():
                # The home pages link to the site's root, /, and /zh/ (mkdocs-static-i18n's links).
                folder = site / target.lstrip("/") if target.startswith("/") else where / target
                expected = name if target_language == "en" else f"zh/{name}"
                assert (folder / "index.html").resolve() == (site / expected).resolve(), (own, language, target)


@pytest.mark.skipif(not shutil.which("node"), reason="runs material's own search code (needs node)")
def test_search_finds_a_chinese_word_in_the_chinese_pages(site):
    """material's search worker, run on the built index as the browser runs it: a Chinese word finds the Chinese
    pages that hold it, and no English page (an index without a fitting separator would find none, or all)."""
    worker = next((site / "assets" / "javascripts" / "workers").glob("search.*.min.js"))
    index = site / "search" / "search_index.json"
    found = {}
    for query in ("检查点", "checkpoint"):
        run = subprocess.run(["node", str(TESTS / "search_site.js"), str(worker), str(index), query],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert run.returncode == 0, run.stderr
        found[query] = run.stdout.split()
    assert found["检查点"][0].startswith("zh/") and "zh/checkpoints/" in found["检查点"], found["检查点"][:5]
    assert [location for location in found["检查点"] if not location.startswith(("zh/", "glossary/"))] == []
    assert found["checkpoint"][0] == "checkpoints/"


COMMENT = {"bat": ("rem ", "::"), "bash": ("#",), "powershell": ("#",)}
COMMANDS = {"pip", "copier", "cd", "conda", "python", "pytest", "powershell", "nox", "git", "torchrun", "set",
            "export", "sbatch", "ssh", "netsh", "curl", "apt-get"}  # fmt: skip


def test_command_blocks_hold_only_commands_and_comments(site):
    """What a reader pastes must run: no prose after a command unless it is behind a comment marker."""
    problems = []
    for name, built in all_pages(site).items():
        for block in built.blocks:
            markers = COMMENT.get(block["language"])
            if markers is None:
                continue  # toml, yaml, text: not pasted into a shell
            for line in block["text"].splitlines():
                stripped = line.strip()
                if not stripped or stripped.startswith(markers):
                    continue
                first = stripped.split()[0]
                if first not in COMMANDS and not re.match(r"^(scripts[\\/]|\.[\\/]|[A-Z_]+=)", first):
                    problems.append(f"{name}: {line!r} does not start with a command")
                # Two spaces or more inside a line only ever lead to a comment.
                for gap in re.finditer(r"\S(\s{2,})(\S.*)$", stripped):
                    if not gap.group(2).startswith(markers):
                        problems.append(f"{name}: {line!r} has text after the command that is not a comment")
    assert problems == []


def copy_sources(text: str) -> list[str]:
    """The template argument of every `copier copy` command in a text: the first word that is not a flag."""
    sources = []
    for line in re.findall(r"copier copy [^\n`]*", text):
        words = shlex.split(line.split("#")[0])[2:]
        positional = []
        skip = False
        for word in words:
            if skip:
                skip = False
            elif word in ("--vcs-ref", "--data", "-d", "-r"):
                skip = True
            elif not word.startswith("-"):
                positional.append(word)
        if len(positional) == 2:
            sources.append(positional[0])
    return sources


# A copy command names the clone by its full path, as the shell in front of it writes the current folder: copier
# records the source as typed, and `copier update` inside the project must find it again.
FULL_PATH_PREFIXES = ("$PWD/", "%CD%\\", "$PWD\\")


def test_every_copy_command_names_the_template_by_its_one_address(site):
    texts = {"README.md": (TEMPLATE / "README.md").read_text(encoding="utf-8")}
    for name, built in all_pages(site).items():
        texts[name] = "\n".join(block["text"] for block in built.blocks)
    found = {name: copy_sources(text) for name, text in texts.items()}
    for name in ("README.md", "index.html", "getting-started/index.html"):
        assert found[name] and (name == "README.md" or found[f"zh/{name}"]), name
    named = [prefix + TEMPLATE_ADDRESS for prefix in FULL_PATH_PREFIXES]
    wrong = {name: [s for s in sources if s not in named] for name, sources in found.items()}
    assert {name: s for name, s in wrong.items() if s} == {}
    assert "<owner>" not in "".join(texts.values())


CONDA_STANDIN = r"""
# conda, as far as the getting-started page uses it: `env create -f FILE` makes the environment the file
# describes (its pip section; torch from TORCH_SPEC, as everywhere in these tests), `activate NAME` enters it.
conda() {
    case "$1 $2" in
    "env create")
        local name; name=$(python -c "import yaml,sys; print(yaml.safe_load(open('$4'))['name'])")
        # Without pip of its own: the outer pip installs into it, so ensurepip's work is not repeated.
        python -m venv --without-pip "$CONDA_ENVS/$name" || return 1
        python - "$4" > "$CONDA_ENVS/$name.txt" <<'PY' || return 1
import os, sys, yaml
pip = next(d["pip"] for d in yaml.safe_load(open(sys.argv[1]))["dependencies"] if isinstance(d, dict))
for line in pip:
    # -r FILE is read from the environment file's folder, as conda runs pip there.
    lines = open(line[3:]).read().splitlines() if line.startswith("-r ") else [line]
    for line in lines:
        if line.startswith("torch=="):
            print(os.environ.get("TORCH_SPEC", "torch==2.13.0"))
        elif line and not line.startswith(("#", "--")):  # the index options name hosts this machine cannot reach
            print(line)
PY
        # --no-compile: byte-compiling all of torch would be most of this test's work; Python compiles
        # what the run imports instead (the test lets it write .pyc files).
        python -m pip --python "$CONDA_ENVS/$name/bin/python" install -q --no-compile -r "$CONDA_ENVS/$name.txt" ;;
    "activate "*) source "$CONDA_ENVS/$2/bin/activate" ;;
    *) echo "conda stand-in: $* is not on the getting-started page" >&2; return 2 ;;
    esac
}
"""


@pytest.mark.skipif(sys.platform == "win32" or not shutil.which("bash"), reason="the Linux path runs in bash")
def test_the_linux_path_of_getting_started_runs_as_pasted(site, tmp_path):
    blocks = [block["text"] for block in page(site, "getting-started").blocks if block["heading"] == "Linux"]
    assert len(blocks) == 1 and "copier copy" in blocks[0]
    clone = copy_template(tmp_path / TEMPLATE_ADDRESS)  # the folder a reader cloned the repository into
    for command in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v"]):
        subprocess.run(["git", *command], cwd=clone, check=True, capture_output=True)
    (tmp_path / "envs").mkdir()
    script = f"set -euo pipefail\n{CONDA_STANDIN}\n{blocks[0]}"
    env = {
        **{name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"},
        "CONDA_ENVS": str(tmp_path / "envs"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    result = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "epoch 1/1" in result.stdout
    assert (tmp_path / "my-ddp" / "outputs" / "model.pt").is_file()
    # The environment came from the rendered environment.yml, with only the torch line swapped for this machine.
    installed = subprocess.run([str(tmp_path / "envs" / "my-ddp" / "bin" / "python"), "-c",
                                "import torch, numpy, tqdm, my_ddp.doctor; print(torch.__version__)"],
                               capture_output=True, text=True, timeout=120)  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    spec = os.environ.get("TORCH_SPEC", "torch==2.13.0")
    if "==" in spec:
        assert installed.stdout.strip().startswith(spec.split("==")[1])


def test_the_home_page_shows_windows_and_linux(site):
    blocks = {block["language"]: block["text"] for block in page_at(site, "index.html").blocks}
    assert "scripts\\setup_env.bat" in blocks["bat"] and "scripts\\train.bat" in blocks["bat"]
    assert "scripts/setup_env.sh" in blocks["bash"] and "scripts/train.sh" in blocks["bash"]


def css_rules(site: Path) -> dict[str, str]:
    """{selector: declarations} of the site's own stylesheet, as every page links it."""
    text = re.sub(r"/\*.*?\*/", "", (site / "stylesheets" / "extra.css").read_text(encoding="utf-8"), flags=re.DOTALL)
    return {selector.strip(): body.strip() for selector, body in re.findall(r"([^{}]+)\{([^}]*)\}", text)}


def test_answer_keys_stay_whole_and_shell_numbers_are_not_painted(site):
    for name in ("questions/index.html", "launching/index.html", "index.html"):
        assert "stylesheets/extra.css" in (site / name).read_text(encoding="utf-8"), name
    rules = css_rules(site)
    keys = next(body for selector, body in rules.items() if selector.endswith("td:first-child code"))
    assert "white-space: nowrap" in keys and "word-break: normal" in keys
    # Every row of the Questions table starts with its key, alone in a code element: the rule above keeps it whole.
    questions = (site / "questions" / "index.html").read_text(encoding="utf-8")
    first_cells = re.findall(r"<tr>\s*<td>(.*?)</td>", questions, re.DOTALL)
    assert len(first_cells) >= 15 and all(re.fullmatch(r"<code>[a-z_]+</code>", cell) for cell in first_cells)
    numbers = next(body for selector, body in rules.items() if ".language-bash" in selector and ".m," in selector)
    assert "color: inherit" in numbers
    # The digits of the multi-node commands are such number tokens, inside a bash block.
    launching = (site / "launching" / "index.html").read_text(encoding="utf-8")
    bash = re.findall(r'<div class="language-bash highlight">(.*?)</div>', launching, re.DOTALL)
    assert any('<span class="m">192</span>' in block for block in bash)


def test_one_multi_node_command_per_machine_in_the_readme_and_the_docs(site, tmp_path):
    docs = [block["text"].split() for block in page(site, "launching").blocks
            if block["heading"] == "Several machines" and block["language"] == "bash"]  # fmt: skip
    project = tmp_path / "p"
    render(project, {"target_os": "linux"})
    readme = (project / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## 7. ") : readme.index("## 8. ")]
    (block,) = re.findall(r"^```bash\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert docs == [block.split()]
    lines = block.splitlines()
    assert [line.split("--node-rank ")[1].split()[0] for line in lines] == ["0", "1"]


def page_at(site: Path, path: str) -> Page:
    return Page((site / path).read_text(encoding="utf-8"))
