"""The questionnaire as a person meets it: `copier copy` in an 80-column pseudo-terminal, driven by keys.

Arrow keys, typing and Enter go to the real prompt. A terminal emulator (pyte) turns its output into
the 80 x 40 screen a person would see; the tests read that screen, line by line, and the project that
comes out. A message that does not fit one 80-column line is not found on one line.

`--data` never reaches these paths: copier checks a question's validator only for typed answers, and a
menu only through its per-choice validators. Each run has the locale it names (English unless it says), and the
questionnaire speaks that language or the README's.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest
import yaml
from wcwidth import wcswidth

from render import ENGLISH_TERMINAL, copy_template, terminal_locale

pexpect = pytest.importorskip("pexpect", reason="pexpect drives the pseudo-terminal (POSIX only)")
pyte = pytest.importorskip("pyte", reason="pyte draws the terminal's screen")

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")

DOWN, ENTER, CLEAR_LINE, CTRL_C = "\x1b[B", "\r", "\x15", "\x03"
COLUMNS, ROWS = 80, 40
NAMES_AND_README = (
    "Which language should the README use?",
    "What is the project's name?",
    "What is its Python package called?",
)
PACKAGES = ("Which companions of torch?", "Where do conda, pip and PyTorch's wheels come from?")
CJK = re.compile(r"[\u4e00-\u9fff]")
README_MENU = "简体中文 (Simplified Chinese)"  # the one Chinese an English questionnaire shows


@pytest.fixture(scope="module")
def plain_template(tmp_path_factory):
    return copy_template(tmp_path_factory.mktemp("template") / "plain")


class Prompt:
    """One interactive `copier copy` run."""

    def __init__(self, template: Path, destination: Path, *options: str, locale: str | None = ENGLISH_TERMINAL) -> None:
        """`copier copy [OPTIONS]` in a terminal of LOCALE (None: no locale variable, as in a Windows console)."""
        self.destination = destination
        with terminal_locale(locale):
            self.child = pexpect.spawn(
                sys.executable,
                ["-m", "copier", "copy", *options, str(template), str(destination)],
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

    def wrapped_chinese(self) -> list[str]:
        """Lines with Chinese ever shown that fill their row: a line longer than 80 display cells (wcwidth's count,
        a CJK character takes 2) is wrapped by prompt_toolkit or the terminal, leaving a full first row, or one of
        79 cells where a wide character did not fit in the last column."""
        return [line for line in self.lines_shown if CJK.search(line) and wcswidth(line) >= COLUMNS - 1]

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
    prompt.answer("How should each process hold the model?", ENTER)  # ddp
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
    # An English terminal and README: nothing in Chinese but the name of the Chinese README in its menu.
    assert [line for line in prompt.lines_shown if CJK.search(line) and README_MENU not in line] == []


def test_cpu_project_shows_fp16_disabled_with_its_fix_and_skips_it(plain_template, tmp_path):
    prompt = Prompt(plain_template, tmp_path / "cpu")
    defaults_until(prompt, *NAMES_AND_README)
    prompt.answer("Which operating systems", DOWN, DOWN, ENTER)  # Both: Linux may use torchrun
    prompt.answer("How many GPUs", ENTER)
    prompt.sees("How should each process hold the model?")  # asked on the CPU too: fsdp runs there
    menu = prompt.sees("fsdp (sharded)")
    assert "- ddp_model_parallel (split model) (use ddp: a split model needs 2+ GPUs)" in menu
    prompt.send(ENTER)  # ddp
    defaults_until(prompt, "How many processes", "Which PyTorch release", "Which Python version", "Which PyTorch build")
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
    assert "backend" not in answers and answers["parallelism"] == "ddp"  # a CPU project has no backend to pick
    assert 'backend = "gloo"' in prompt.config()


def test_linux_gpu_project_may_pick_nccl(plain_template, tmp_path):
    prompt = Prompt(plain_template, tmp_path / "linux")
    defaults_until(prompt, *NAMES_AND_README)
    prompt.answer("Which operating systems", DOWN, ENTER)
    prompt.answer("How many GPUs", CLEAR_LINE, "1", ENTER)
    defaults_until(prompt, "How should each process hold the model?", "How many processes", "Which PyTorch release",
                   "Which Python version", "Which PyTorch build")  # fmt: skip
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


def test_a_chinese_terminal_is_asked_in_chinese_and_refused_nccl_on_windows_in_chinese(plain_template, tmp_path):
    # A Windows project is never asked for its backend: copier checks the one given with --data when it gets there.
    prompt = Prompt(plain_template, tmp_path / "zh", "--data", "backend=nccl", locale="zh_CN.UTF-8")
    prompt.answer("README 用哪种语言？（both：中英文各一份）", ENTER)  # the locale's default: 简体中文
    prompt.answer("项目叫什么名字？（用作 README 标题、conda 环境名和包名的默认值）", ENTER)
    prompt.answer("Python 包叫什么名字？（python -m <package>.train）", ENTER)
    prompt.answer("训练在哪些操作系统上运行？", ENTER)  # Windows
    prompt.answer("每台机器有几块 GPU？（填数字；0 表示用 CPU 训练）", CLEAR_LINE, "-1", ENTER)
    prompt.sees("Validation error for question 'gpus_per_node': 填 0（CPU）或更大的数")
    prompt.send(CLEAR_LINE + "2" + ENTER)
    prompt.answer("每个进程怎样放置模型？", ENTER)
    prompt.answer("每台机器启动几个进程（rank）？（填数字）", ENTER)
    prompt.answer("用哪个 PyTorch 版本，格式 X.Y.Z？（2.4 到 2.14；已测试 2.13.0）", CLEAR_LINE, "2.8.0", ENTER)
    prompt.sees("Validation error for question 'torch_version': 换 2.10+：Windows 上 gloo 失效")
    prompt.send(CLEAR_LINE + "2.13.0" + ENTER)
    prompt.answer("conda 环境用哪个 Python 版本？", ENTER)
    prompt.sees("用 torch 2.13 的哪个版本？cpu，或以下某个 CUDA 版本：")
    screen = prompt.sees("NVIDIA 驱动，Windows：").splitlines()
    question = next(number for number, line in enumerate(screen) if "用 torch 2.13 的哪个版本？" in line)
    assert screen[question + 1 : question + 5] == [
        "  cu126、cu130、cu132（实验性）",
        "  RTX 50xx（Blackwell）需要 cu130 或 cu132",
        "  GTX 10xx（Pascal）需要 cu126",
        "  NVIDIA 驱动，Windows：cu126 528.33+、cu130 580.88+、cu132 580.88+",
    ]
    prompt.send(CLEAR_LINE + "cu126" + ENTER)
    prompt.sees("Invalid choice for 'backend': 改用 gloo 或 auto：Windows 没有 NCCL")
    prompt.finish()
    assert prompt.child.exitstatus != 0 and not (tmp_path / "zh").exists()
    assert not prompt.ever_showed("How many") and not prompt.ever_showed("Which PyTorch")  # no English help
    assert prompt.wrapped_chinese() == []


def test_without_a_locale_picking_both_readmes_asks_the_rest_in_chinese(plain_template, tmp_path):
    prompt = Prompt(plain_template, tmp_path / "both", locale=None)  # as in a Windows console
    prompt.answer("Which language should the README use?", DOWN, DOWN, ENTER)  # Both
    defaults_until(prompt, "项目叫什么名字？", "Python 包叫什么名字？", "训练在哪些操作系统上运行？",
                   "每台机器有几块 GPU？", "每个进程怎样放置模型？", "每台机器启动几个进程", "用哪个 PyTorch 版本",
                   "conda 环境用哪个 Python 版本？", "用 torch 2.13 的哪个版本？", "共有几台机器一起训练？",
                   "节点 0 监听哪个 TCP 端口？")  # fmt: skip
    prompt.sees("autocast 用哪种混合精度？（参数和梯度仍为 fp32）")
    menu = prompt.sees("bf16（CPU 或 CUDA）")
    # fp16 is disabled, its fix in Chinese
    assert "- fp16（仅限 CUDA，配合 GradScaler） (改用 bf16 或 no：fp16 需要 CUDA)" in menu
    prompt.send(ENTER)
    defaults_until(prompt, "还需要哪些 torch 配套包？", "conda、pip 和 PyTorch 的包从哪个镜像下载？")
    prompt.sees("下一步（详见 README.zh-CN.md）：")  # both READMEs: the next steps in both languages
    prompt.finish()
    assert prompt.ever_showed("Next steps (README.md says more):")
    assert prompt.answers()["readme_language"] == "both"
    assert (tmp_path / "both" / "README.zh-CN.md").is_file()
    assert prompt.wrapped_chinese() == []
