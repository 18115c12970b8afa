"""The questionnaire as a person meets it: `copier copy` in an 80-column pseudo-terminal, driven by keys.

Arrow keys, typing and Enter go to the real prompt. A terminal emulator (pyte) turns its output into
the 80 x 40 screen a person would see; the tests read that screen, line by line, and the project that
comes out. A message that does not fit one 80-column line is not found on one line.

`--data` never reaches these paths: copier checks a question's validator only for typed answers, and a
menu only through its per-choice validators.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import yaml

from render import copy_template

pexpect = pytest.importorskip("pexpect", reason="pexpect drives the pseudo-terminal (POSIX only)")
pyte = pytest.importorskip("pyte", reason="pyte draws the terminal's screen")

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")

DOWN, ENTER, CLEAR_LINE, CTRL_C = "\x1b[B", "\r", "\x15", "\x03"
COLUMNS, ROWS = 80, 40
NAMES_AND_README = (
    "What is the project's name?",
    "What is its Python package called?",
    "Which language should the README use?",
)
PACKAGES = ("Which companions of torch?", "Where do conda, pip and PyTorch's wheels come from?")


@pytest.fixture(scope="module")
def plain_template(tmp_path_factory):
    return copy_template(tmp_path_factory.mktemp("template") / "plain")


class Prompt:
    """One interactive `copier copy` run."""

    def __init__(self, template: Path, destination: Path) -> None:
        self.destination = destination
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "copier", "copy", str(template), str(destination)],
            dimensions=(40, 80),
            encoding="utf-8",
            timeout=60,
            # No cursor-position requests: a real terminal answers them, pexpect does not (2 s wait each).
            env={**os.environ, "TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1"},
        )
        self.screen = pyte.Screen(COLUMNS, ROWS)
        self.terminal = pyte.Stream(self.screen)
        self.lines_shown: set[str] = set()  # every line that was ever on the screen

    def read(self, timeout: float) -> None:
        self.terminal.feed(self.child.read_nonblocking(65536, timeout=timeout))
        self.lines_shown.update(line.rstrip() for line in self.screen.display)

    def shows(self) -> str:
        return "\n".join(line.rstrip() for line in self.screen.display)

    def sees(self, text: str, timeout: float = 60) -> str:
        """Wait until one line of the screen holds `text`; return the screen."""
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.screen.display):
            if time.monotonic() > deadline:
                raise AssertionError(f"never saw {text!r} on one line; the screen:\n{self.shows()}")
            try:
                self.read(timeout=0.5)
            except pexpect.TIMEOUT:
                continue
        return self.shows()

    def ever_showed(self, text: str) -> bool:
        return any(text in line for line in self.lines_shown)

    def answer(self, question: str, *keys: str) -> None:
        """Wait for the question, then type: each key string is sent after a short pause, as a hand would."""
        self.sees(question)
        for key in keys:
            time.sleep(0.2)
            self.child.send(key)

    def send(self, keys: str) -> None:
        self.child.send(keys)

    def finish(self) -> None:
        """Wait for the program to end."""
        try:
            while True:
                self.read(timeout=60)
        except pexpect.EOF:
            pass
        self.child.close()

    def answers(self) -> dict:
        return yaml.safe_load((self.destination / ".copier-answers.yml").read_text(encoding="utf-8"))

    def config(self) -> str:
        return (self.destination / "configs" / "train.toml").read_text(encoding="utf-8")


def defaults_until(prompt: Prompt, *questions: str) -> None:
    for question in questions:
        prompt.answer(question, ENTER)


def test_windows_gpu_project_typed_refusals_and_no_nccl_or_torchrun_to_pick(plain_template, tmp_path):
    prompt = Prompt(plain_template, tmp_path / "win")
    defaults_until(prompt, *NAMES_AND_README, "Which operating systems")
    prompt.answer("How many GPUs does each machine have? (a number; 0 trains on the CPU)", CLEAR_LINE, "two", ENTER)
    prompt.sees("Invalid input")  # copier's own type check, before any validator (docs/questions.md says why)
    prompt.send(CLEAR_LINE + "-1" + ENTER)
    prompt.sees("Validation error for question 'gpus_per_node': use 0 (CPU) or more")
    prompt.send(CLEAR_LINE + "2" + ENTER)
    prompt.answer("How should each process hold the model?", ENTER)  # asked: 2 GPUs can hold a split model
    prompt.answer("How many processes", ENTER)
    prompt.answer("Which PyTorch release", CLEAR_LINE, "2.8.0", ENTER)
    prompt.sees("Validation error for question 'torch_version': use 2.10+: gloo fails on Windows")
    prompt.send(CLEAR_LINE + "2.13.0" + ENTER)
    prompt.answer("Which Python version", ENTER)
    # The tags of torch 2.13, the experimental one marked; the GPU generations named by offered tags only; each
    # tag's oldest NVIDIA driver on the project's system.
    prompt.sees("Which PyTorch build? cpu, or a CUDA tag of torch 2.13:")
    # The question and its lines may arrive in two writes: the screen is read once its last line is there too.
    screen = prompt.sees("NVIDIA driver, Windows:").splitlines()
    question = next(number for number, line in enumerate(screen) if "Which PyTorch build?" in line)
    assert screen[question + 1 : question + 5] == [
        "  cu126, cu130, cu132 (experimental)",
        "  RTX 50xx (Blackwell) needs cu130 or cu132",
        "  GTX 10xx (Pascal) needs cu126",
        "  NVIDIA driver, Windows: cu126 528.33+, cu130 580.88+, cu132 580.88+",
    ]
    prompt.send(CLEAR_LINE + "cpu" + ENTER)
    prompt.sees("Validation error for question 'cuda': use cu126 or 0 GPUs: cpu builds lack CUDA")
    prompt.send(CLEAR_LINE + "cu126" + ENTER)
    prompt.answer("How many machines", ENTER)
    prompt.answer("Which TCP port", CLEAR_LINE, "70000", ENTER)
    prompt.sees("Validation error for question 'master_port': use 1024 to 65535, such as 29500")
    prompt.send(CLEAR_LINE + "29510" + ENTER)
    prompt.answer("Which autocast precision", DOWN, ENTER)  # fp16 is enabled: this project has CUDA GPUs
    defaults_until(prompt, *PACKAGES)
    prompt.finish()
    # Never offered: the collective backend (Windows has no NCCL) and the launcher (Windows always spawns).
    assert not prompt.ever_showed("collective backend") and not prompt.ever_showed("start the ranks")
    answers = prompt.answers()
    assert {k: answers[k] for k in ("target_os", "gpus_per_node", "cuda", "master_port", "mixed_precision")} == {
        "target_os": "windows", "gpus_per_node": 2, "cuda": "cu126", "master_port": 29510, "mixed_precision": "fp16",
    }  # fmt: skip
    assert answers["torch_version"] == "2.13.0"
    assert "backend" not in answers and "launcher" not in answers
    config = prompt.config()
    assert 'backend = "gloo"' in config and 'precision = "fp16"' in config


def test_cpu_project_shows_fp16_disabled_with_its_fix_and_skips_it(plain_template, tmp_path):
    prompt = Prompt(plain_template, tmp_path / "cpu")
    defaults_until(prompt, *NAMES_AND_README)
    prompt.answer("Which operating systems", DOWN, DOWN, ENTER)  # Both: Linux may use torchrun
    defaults_until(prompt, "How many GPUs", "How many processes", "Which PyTorch release", "Which Python version",
                   "Which PyTorch build")  # fmt: skip
    prompt.answer("How should Linux start the ranks?", DOWN, ENTER)  # torchrun: allowed, Linux is a target
    defaults_until(prompt, "How many machines", "Which TCP port")
    prompt.sees("Which autocast precision")
    menu = prompt.sees("bf16 (CPU or CUDA)")
    assert "- fp16 (CUDA only, with a GradScaler) (use bf16 or no: fp16 needs CUDA)" in menu
    prompt.send(DOWN + ENTER)  # one step down skips the disabled fp16 and lands on bf16
    defaults_until(prompt, *PACKAGES)
    prompt.finish()
    answers = prompt.answers()
    assert (answers["mixed_precision"], answers["launcher"], answers["target_os"]) == ("bf16", "torchrun", "both")
    assert "backend" not in answers and "parallelism" not in answers  # a CPU project has neither choice
    assert 'backend = "gloo"' in prompt.config()


def test_linux_gpu_project_may_pick_nccl(plain_template, tmp_path):
    prompt = Prompt(plain_template, tmp_path / "linux")
    defaults_until(prompt, *NAMES_AND_README)
    prompt.answer("Which operating systems", DOWN, ENTER)
    prompt.answer("How many GPUs", CLEAR_LINE, "1", ENTER)
    defaults_until(prompt, "How many processes", "Which PyTorch release", "Which Python version", "Which PyTorch build")
    prompt.answer("Which collective backend?", DOWN, DOWN, ENTER)
    defaults_until(prompt, "How should Linux start the ranks?", "How many machines", "Which TCP port",
                   "Which autocast precision")  # fmt: skip
    prompt.answer(PACKAGES[0], " ", ENTER)  # space selects torchvision, the first
    prompt.answer(PACKAGES[1], DOWN, ENTER)  # china
    prompt.finish()
    answers = prompt.answers()
    assert (answers["backend"], answers["launcher"], answers["cuda"]) == ("nccl", "torchrun", "cu126")
    assert (answers["extras"], answers["package_mirror"]) == (["torchvision"], "china")
    assert 'backend = "nccl"' in prompt.config()


def test_leaving_at_a_refusal_writes_no_project(plain_template, tmp_path):
    prompt = Prompt(plain_template, tmp_path / "left")
    defaults_until(prompt, *NAMES_AND_README, "Which operating systems")
    prompt.answer("How many GPUs", CLEAR_LINE, "-1", ENTER)
    prompt.sees("use 0 (CPU) or more")
    prompt.send(CTRL_C)
    prompt.finish()
    assert prompt.child.exitstatus != 0
    assert not (tmp_path / "left").exists()
