"""Render the template with copier's API; shared by the template's tests and noxfile.py.

python tests/render.py NAME DESTINATION    renders one named answer set
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parents[1]
# How the README and the docs name the template in `copier copy`: a clone of this repository in a folder of
# this name (there is no public home yet). tests/test_site.py holds every page to it.
TEMPLATE_ADDRESS = "copier-torch-ddp"
# What a copy of the template needs: the questionnaire, the generated tree, and the partials it includes.
# The generated project's docs/ includes these pages of the template's docs (one source for both), in English and,
# for a Chinese README, in Chinese.
SHIPPED_PAGES = ("make-it-your-own", "updating")
TEMPLATE_PARTS = ("copier.yml", "template", "includes",
                  *(f"docs/{page}{language}.md" for page in SHIPPED_PAGES for language in ("", ".zh")))  # fmt: skip

# copier.yml's terminal_locale reads these, in this order, to choose the questionnaire's language (and the
# README's default). The answer sets and the tests mean an English terminal unless they say otherwise.
LOCALE_VARIABLES = ("LC_ALL", "LC_MESSAGES", "LANG")
ENGLISH_TERMINAL = "C.UTF-8"

# Named answer sets: each is what a user would type on top of the defaults (in an English terminal).
ANSWER_SETS: dict[str, dict] = {
    "windows-cpu-default": {},
    "linux-torchrun": {
        "target_os": "linux",
        "launcher": "torchrun",
        "project_name": "linux-ddp",
        "readme_language": "zh",
    },
    "windows-2gpu-cu126": {"gpus_per_node": 2, "cuda": "cu126", "master_port": 29650},
    "both-os-bf16": {
        "target_os": "both",
        "mixed_precision": "bf16",
        "package_name": "trainer",
        "readme_language": "both",
    },
    "model-parallel-linux-4gpu": {
        "target_os": "linux",
        "gpus_per_node": 4,
        "parallelism": "ddp_model_parallel",
        "cuda": "cu130",
        "backend": "nccl",
        "mixed_precision": "fp16",
    },
    # Sharded data parallel (FSDP2) on the CPU over gloo: the one place it runs without GPUs.
    "linux-fsdp-cpu": {"target_os": "linux", "parallelism": "fsdp", "project_name": "linux-fsdp"},
}


def copy_template(destination: Path) -> Path:
    """A plain (non-git) copy of the template's own files, for tests that build template versions."""
    destination.mkdir(parents=True, exist_ok=True)
    for part in TEMPLATE_PARTS:
        source = TEMPLATE / part
        if source.is_dir():
            shutil.copytree(source, destination / part)
        else:
            (destination / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, destination / part)
    return destination


def render(destination: Path, answers: dict | None = None, **options):
    """Render the working tree (vcs_ref HEAD, uncommitted changes included) without --trust."""
    import copier  # here, so noxfile.py can read ANSWER_SETS without copier installed

    return copier.run_copy(
        str(TEMPLATE),
        str(destination),
        data=answers or {},
        defaults=True,
        vcs_ref="HEAD",
        unsafe=False,
        quiet=True,
        **options,
    )


@contextlib.contextmanager
def terminal_locale(locale: str | None) -> Iterator[None]:
    """Within this block copier, here and in the processes started here, reads LOCALE as the terminal's locale:
    LANG alone, LC_ALL and LC_MESSAGES unset. None: no locale at all, as in a Windows console."""
    saved = {name: os.environ.pop(name) for name in LOCALE_VARIABLES if name in os.environ}
    if locale:
        os.environ["LANG"] = locale
    try:
        yield
    finally:
        for name in LOCALE_VARIABLES:
            os.environ.pop(name, None)
        os.environ.update(saved)


@contextlib.contextmanager
def templates_compiled_once() -> Iterator[None]:
    """Within this block, jinja compiles each template source once per process instead of once per render.

    Compiling is a pure function of the source and of the environment's syntax, extensions, filters and
    tests, all part of the key, and of the locale: jinja folds a filter over constants while it compiles, and
    copier.yml's `"$LANG" | expandvars` is one, so the locale variables are in the key too. copier builds a
    new environment for every render, so walking hundreds of answer sets compiled the same ~400 sources
    each time (about half of a render). Every template is still rendered with each answer set, by the real
    copier and jinja.
    """
    import jinja2

    original = jinja2.Environment.compile
    compiled = _COMPILED

    def compile_once(env, source, name=None, filename=None, raw=False, defer_init=False):
        if not isinstance(source, str):  # an already parsed template
            return original(env, source, name, filename, raw, defer_init)
        syntax = tuple(getattr(env, option) for option in SYNTAX_OPTIONS)
        locale = tuple(os.environ.get(variable) for variable in LOCALE_VARIABLES)
        key = (type(env), syntax, tuple(env.extensions), tuple(sorted(env.filters)), tuple(sorted(env.tests)),
               locale, source, name, filename, raw, defer_init)  # fmt: skip
        if key not in compiled:
            compiled[key] = original(env, source, name, filename, raw, defer_init)
        return compiled[key]

    jinja2.Environment.compile = compile_once
    try:
        yield
    finally:
        jinja2.Environment.compile = original


_COMPILED: dict = {}  # kept between blocks: one per process
# Every Environment setting that changes what a source compiles to.
SYNTAX_OPTIONS = (
    "block_start_string", "block_end_string", "variable_start_string", "variable_end_string",
    "comment_start_string", "comment_end_string", "line_statement_prefix", "line_comment_prefix",
    "trim_blocks", "lstrip_blocks", "newline_sequence", "keep_trailing_newline", "optimized", "is_async",
    "autoescape", "finalize",
)  # fmt: skip


if __name__ == "__main__":
    name, destination = sys.argv[1], Path(sys.argv[2])
    with terminal_locale(ENGLISH_TERMINAL):
        render(destination, ANSWER_SETS[name])
    print(f"rendered {name} into {destination}")
