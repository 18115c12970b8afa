"""The questionnaire: impossible answers are refused with a message that names the fix,
and a refusal leaves nothing behind; in English, or in Chinese where the terminal or the README is Chinese."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml
from wcwidth import wcswidth

from render import ANSWER_SETS, ENGLISH_TERMINAL, TEMPLATE, copy_template, render, terminal_locale

CHINESE_TERMINAL = "zh_CN.UTF-8"

# Each refusal: the answers, then what the one-line message must say (it leads with the fix).
REFUSED = {
    "nccl-on-windows": (
        {"gpus_per_node": 2, "cuda": "cu126", "backend": "nccl"},
        "use gloo or auto: Windows has no NCCL",
    ),
    "nccl-without-gpus": ({"target_os": "linux", "backend": "nccl"}, "use gloo or auto: nccl needs GPUs"),
    "gpus-with-cpu-build": ({"gpus_per_node": 2, "cuda": "cpu"}, "use cu126 or 0 GPUs: cpu builds lack CUDA"),
    "unpublished-cuda-tag": ({"gpus_per_node": 1, "cuda": "cu118"}, "use cu126/cu130/cu132: no cu118 for 2.13"),
    "torch-2.8-on-windows": ({"torch_version": "2.8.0"}, "use 2.10+: gloo fails on Windows"),
    "torch-2.9-on-both": ({"torch_version": "2.9.1", "target_os": "both"}, "use 2.10+: gloo fails on Windows"),
    "torch-too-old": ({"torch_version": "2.3.1"}, "use 2.4 to 2.14 (2.13.0 tested)"),
    "torch-not-on-index": ({"torch_version": "2.15.0"}, "use 2.14.x: 2.15 not on the index"),
    "torch-malformed": ({"torch_version": "2.13"}, "use X.Y.Z, for example 2.13.0"),
    "python-without-wheels": ({"python_version": "3.9"}, "use 3.10 to 3.14 for torch 2.13"),
    "package-with-dash": ({"package_name": "my-pkg"}, "use a-z, 0-9, _; no digit first"),
    "package-with-digit-first": ({"package_name": "1st"}, "use a-z, 0-9, _; no digit first"),
    "package-is-keyword": ({"package_name": "class"}, "pick another: it is a keyword"),
    "package-shadows-torch": ({"package_name": "torch"}, "pick another: it shadows a module"),
    "port-too-low": ({"master_port": 80}, "use 1024 to 65535, such as 29500"),
    "port-too-high": ({"master_port": 70000}, "use 1024 to 65535, such as 29500"),
    "multi-node-on-loopback": ({"nnodes": 2}, "use node 0's LAN IP (192.168.1.10)"),
    "localhost": ({"master_addr": "localhost"}, "use 127.0.0.1, not localhost"),
    "multi-node-without-address": ({"nnodes": 2, "master_addr": ""}, "use node 0's LAN IP (192.168.1.10)"),
    "one-node-without-address": ({"master_addr": ""}, "use 127.0.0.1 for one machine"),
    "torchrun-on-windows": ({"launcher": "torchrun"}, "use spawn: torchrun fails on Windows"),
    "model-parallel-one-gpu": (
        {"gpus_per_node": 1, "cuda": "cu126", "parallelism": "ddp_model_parallel"},
        "use ddp: a split model needs 2+ GPUs",
    ),
    "model-parallel-too-many-processes": (
        {"gpus_per_node": 4, "cuda": "cu126", "parallelism": "ddp_model_parallel", "nproc_per_node": 3},
        "use 2 or fewer: 2 GPUs each",
    ),
    "fp16-on-cpu": ({"mixed_precision": "fp16"}, "use bf16 or no: fp16 needs CUDA"),
    "fsdp-with-fp16": (
        {"target_os": "linux", "gpus_per_node": 2, "cuda": "cu126", "parallelism": "fsdp", "mixed_precision": "fp16"},
        "use bf16: fsdp has no fp16 GradScaler",
    ),
    "fsdp-on-windows-gpus": (
        {"gpus_per_node": 2, "cuda": "cu126", "parallelism": "fsdp"},
        "use ddp or Linux+nccl: no GPU fsdp on Windows",
    ),
    "fsdp-on-both-os-gpus": (
        {"target_os": "both", "gpus_per_node": 1, "cuda": "cu126", "parallelism": "fsdp"},
        "use ddp or Linux+nccl: no GPU fsdp on Windows",
    ),
    "fsdp-on-gpus-with-gloo": (
        {"target_os": "linux", "gpus_per_node": 2, "cuda": "cu126", "parallelism": "fsdp", "backend": "gloo"},
        "use nccl or auto: fsdp on GPUs needs nccl",
    ),
    "more-processes-than-gpus": (
        {"gpus_per_node": 2, "cuda": "cu126", "nproc_per_node": 3},
        "use 2 or fewer: 1 GPU each",
    ),
    "negative-gpus": ({"gpus_per_node": -1}, "use 0 (CPU) or more"),
    "zero-processes": ({"nproc_per_node": 0}, "use 1 or more"),
    "zero-nodes": ({"nnodes": 0}, "use 1 or more"),
    "bad-project-name": ({"project_name": "my project"}, "use letters, digits . _ - only"),
    "mirror-url-not-a-url": (
        {"package_mirror": "custom", "conda_url": "not a url"},
        "use http(s)://host/path, no spaces",
    ),
    "torchaudio-not-built": ({"extras": ["torchaudio"]}, "use torch 2.11.0 or older for torchaudio"),
    "torchvision-not-built": (
        {"extras": ["torchvision"], "torch_version": "2.13.9"},
        "use torch 2.4.0 to 2.14.1 for torchvision",
    ),
}


# The same refusals as a terminal whose locale is zh shows them: the fix first, its reason after a full-width
# colon, flags and values as in English.
REFUSED_IN_CHINESE = {
    "nccl-on-windows": "改用 gloo 或 auto：Windows 没有 NCCL",
    "nccl-without-gpus": "改用 gloo 或 auto：nccl 需要 GPU",
    "gpus-with-cpu-build": "改用 cu126 或 0 块 GPU：cpu 版不含 CUDA",
    "unpublished-cuda-tag": "改用 cu126/cu130/cu132：2.13 没有 cu118",
    "torch-2.8-on-windows": "换 2.10+：Windows 上 gloo 失效",
    "torch-2.9-on-both": "换 2.10+：Windows 上 gloo 失效",
    "torch-too-old": "填 2.4 到 2.14（已测试 2.13.0）",
    "torch-not-on-index": "改用 2.14.x：索引上还没有 2.15",
    "torch-malformed": "填 X.Y.Z 格式，如 2.13.0",
    "python-without-wheels": "填 3.10 到 3.14（torch 2.13）",
    "package-with-dash": "只用 a-z、0-9 和 _，不以数字开头",
    "package-with-digit-first": "只用 a-z、0-9 和 _，不以数字开头",
    "package-is-keyword": "换个名字：这是关键字",
    "package-shadows-torch": "换个名字：与已有模块重名",
    "port-too-low": "填 1024 到 65535，如 29500",
    "port-too-high": "填 1024 到 65535，如 29500",
    "multi-node-on-loopback": "填节点 0 的内网 IP（192.168.1.10）",
    "localhost": "改用 127.0.0.1，不要用 localhost",
    "multi-node-without-address": "填节点 0 的内网 IP（192.168.1.10）",
    "one-node-without-address": "填 127.0.0.1（单机训练）",
    "torchrun-on-windows": "改用 spawn：torchrun 在 Windows 上无法启动",
    "model-parallel-one-gpu": "改用 ddp：拆分模型至少要 2 块 GPU",
    "model-parallel-too-many-processes": "最多填 2：每个进程占 2 块 GPU",
    "fp16-on-cpu": "改用 bf16 或 no：fp16 需要 CUDA",
    "fsdp-with-fp16": "改用 bf16：fsdp 没有 fp16 的 GradScaler",
    "fsdp-on-windows-gpus": "改用 ddp 或 Linux+nccl：Windows 无 fsdp GPU",
    "fsdp-on-both-os-gpus": "改用 ddp 或 Linux+nccl：Windows 无 fsdp GPU",
    "fsdp-on-gpus-with-gloo": "改用 nccl 或 auto：GPU 上的 fsdp 需要 nccl",
    "more-processes-than-gpus": "最多填 2：每个进程占 1 块 GPU",
    "negative-gpus": "填 0（CPU）或更大的数",
    "zero-processes": "填 1 或更大的数",
    "zero-nodes": "填 1 或更大的数",
    "bad-project-name": "只用字母、数字和 . _ -",
    "mirror-url-not-a-url": "填 http(s)://host/path，不含空格",
    "torchaudio-not-built": "改用 torch 2.11.0 或更早版本才有 torchaudio",
    "torchvision-not-built": "改用 torch 2.4.0 到 2.14.1 才有 torchvision",
}
# language: (the terminal's locale, each refusal's message, the words a fix starts with, what ends the fix)
LANGUAGES = {
    "English": (ENGLISH_TERMINAL, {name: message for name, (_, message) in REFUSED.items()}, ("use ", "pick "), ": "),
    "Chinese": (CHINESE_TERMINAL, REFUSED_IN_CHINESE, ("改用 ", "换", "填", "最多填 ", "只用"), "："),
}


@pytest.mark.parametrize("language", LANGUAGES)
@pytest.mark.parametrize("name", REFUSED)
def test_impossible_answers_are_refused_on_one_short_line_and_leave_nothing(tmp_path, name, language):
    locale, messages, fixes, _ = LANGUAGES[language]
    destination = tmp_path / "project"
    with terminal_locale(locale), pytest.raises(ValueError) as refusal:
        render(destination, REFUSED[name][0])
    shown = str(refusal.value)  # exactly what copier prints, on one terminal line
    assert "\n" not in shown
    assert shown.endswith(f"': {messages[name]}"), shown
    assert shown.split("': ", 1)[1].startswith(fixes), "a refusal leads with the fix"
    assert wcswidth(shown) <= 80, f"{wcswidth(shown)} columns: {shown}"
    assert not destination.exists()


def values_not_in_both(english: str, chinese: str) -> list[str]:
    """What the Chinese text of a message changes: an ASCII word (flag, value, command) the English lacks, or a
    number of the English that the Chinese lacks."""
    numbers = re.compile(r"\d+(?:\.\d+)*")
    invented = [word for word in re.findall(r"[!-~]+", chinese) if word not in english]
    return invented + [number for number in numbers.findall(english) if number not in numbers.findall(chinese)]


@pytest.mark.parametrize("name", REFUSED)
def test_a_chinese_refusal_names_the_values_of_the_english_one(name):
    assert values_not_in_both(REFUSED[name][1], REFUSED_IN_CHINESE[name]) == []


# Refusals whose fix alone would leave a person guessing: each says why, after the fix ("FIX: REASON").
WITH_A_REASON = [
    "nccl-on-windows", "nccl-without-gpus", "gpus-with-cpu-build", "unpublished-cuda-tag", "torch-2.8-on-windows",
    "torch-2.9-on-both", "torch-not-on-index", "package-is-keyword", "package-shadows-torch",
    "torchrun-on-windows", "model-parallel-one-gpu", "model-parallel-too-many-processes", "fp16-on-cpu",
    "more-processes-than-gpus", "fsdp-with-fp16", "fsdp-on-windows-gpus", "fsdp-on-both-os-gpus",
    "fsdp-on-gpus-with-gloo",
]  # fmt: skip


@pytest.mark.parametrize("language", LANGUAGES)
@pytest.mark.parametrize("name", WITH_A_REASON)
def test_refusals_that_need_a_reason_give_it_after_the_fix(name, language):
    _, messages, fixes, colon = LANGUAGES[language]
    fix, _, reason = messages[name].partition(colon)
    assert fix.startswith(fixes) and reason, messages[name]


def test_every_validator_message_is_tested_here():
    """Each refusal copier.yml can give is in REFUSED or REFUSED_IN_CHINESE, so the 80-column and leads-with-a-fix
    checks reach it."""
    config = yaml.safe_load((TEMPLATE / "copier.yml").read_text(encoding="utf-8"))
    validators = [q["validator"] for q in config.values() if isinstance(q, dict) and "validator" in q]
    validators += [c["validator"] for q in config.values() if isinstance(q, dict) and isinstance(q.get("choices"), dict)
                   for c in q["choices"].values() if isinstance(c, dict) and "validator" in c]  # fmt: skip
    messages = {re.sub(r"{{.*?}}", "", line).strip() for text in validators
                for line in re.split(r"{%.*?%}", text) if line.strip()}  # fmt: skip
    tested = " | ".join(message for _, messages, _, _ in LANGUAGES.values() for message in messages.values())
    untested = sorted(message for message in messages if not all(part in tested for part in message.split() if part))
    assert untested == []


ACCEPTED = {
    "torch-2.8-on-linux": {"target_os": "linux", "torch_version": "2.8.0"},
    "experimental-tag": {"gpus_per_node": 1, "cuda": "cu132"},
    "oldest-series": {"torch_version": "2.4.1", "gpus_per_node": 1, "cuda": "cu118", "python_version": "3.9"},
    "multi-node-real-ip": {"nnodes": 2, "master_addr": "192.168.1.10"},
    "gpus-default-to-their-count": {"gpus_per_node": 3},
    "fsdp-on-linux-gpus-in-bf16": dict(
        target_os="linux", gpus_per_node=2, cuda="cu126", parallelism="fsdp", mixed_precision="bf16"
    ),
    **ANSWER_SETS,
}


@pytest.mark.parametrize("name", ACCEPTED)
def test_possible_answers_render(tmp_path, rendered, name):
    answers = ACCEPTED[name]
    if name in ANSWER_SETS:  # the session renders the named sets once
        project = rendered(name)
    else:
        project = tmp_path / "project"
        render(project, answers)
    recorded = yaml.safe_load((project / ".copier-answers.yml").read_text(encoding="utf-8"))
    assert {key: recorded[key] for key in answers} == answers


def test_defaults_follow_earlier_answers(tmp_path):
    render(tmp_path / "p", {"gpus_per_node": 4, "parallelism": "ddp_model_parallel", "target_os": "linux"})
    answers = yaml.safe_load((tmp_path / "p" / ".copier-answers.yml").read_text(encoding="utf-8"))
    assert answers["nproc_per_node"] == 2  # two GPUs per process
    assert answers["cuda"] == "cu126"  # the recommended tag of torch 2.13
    assert answers["launcher"] == "torchrun"  # Linux-only projects default to torchrun


def test_every_question_has_help_and_no_setting_needs_trust():
    config = yaml.safe_load((TEMPLATE / "copier.yml").read_text(encoding="utf-8"))
    questions = {k: v for k, v in config.items() if not k.startswith("_") and v.get("when") is not False}
    assert len(questions) == 22
    assert all(question.get("help") for question in questions.values())
    assert list(questions)[0] == "readme_language"  # its answer chooses the language of every question after it
    assert not {"_tasks", "_migrations", "_jinja_extensions"} & config.keys()
    assert config["_min_copier_version"] >= "9"


def helps_shown(template, destination, locale: str, answers: dict) -> dict[str, tuple[str, list[str]]]:
    """Each question's help and its menu's lines as the prompt prints them once ANSWERS are given, in a terminal
    of LOCALE: copier's own Question renders them (a help is rendered only at the prompt). questionary puts a
    3-cell pointer before each choice, then a check box in a multi-choice menu, or `- NAME (FIX)` for a choice
    that earlier answers rule out; a question these answers skip shows no menu."""
    from copier._main import Worker
    from copier._user_data import Question

    def shown(question: Question) -> tuple[str, list[str]]:
        choices = question._formatted_choices if question.get_when() else []
        box = "○ " if question.multiselect else ""
        menu = [f" » - {c.title} ({c.disabled})" if c.disabled else f" » {box}{c.title}" for c in choices]
        return question.get_message().rstrip(), menu

    with terminal_locale(locale):
        worker = Worker(src_path=str(template), dst_path=str(destination), data=answers, defaults=True, quiet=True)
        worker._ask()
        context = worker._render_context()
        return {
            key: shown(Question(answers=worker.answers, context=context, jinja_env=worker.jinja_env,
                                settings=worker.settings, var_name=key, **details))
            for key, details in worker.template.questions_data.items() if "help" in details
        }  # fmt: skip


# The answer sets, and one that is asked every question the others skip (a custom mirror, two machines).
HELP_CONTEXTS = {
    **ANSWER_SETS,
    "custom-mirror-two-nodes": {"package_mirror": "custom", "nnodes": 2, "master_addr": "192.168.1.10"},
}


@pytest.fixture(scope="module")
def helps(tmp_path_factory):
    """Every help and menu in both languages after each answer set: (language, answer set) -> {key: text}."""
    template = copy_template(tmp_path_factory.mktemp("template") / "plain")
    readme = {"English": "en", "Chinese": "zh"}
    return {
        (language, name): helps_shown(template, tmp_path_factory.mktemp("out") / "p", LANGUAGES[language][0],
                                      {**answers, "readme_language": readme[language]})
        for language in LANGUAGES for name, answers in HELP_CONTEXTS.items()
    }  # fmt: skip


CJK = re.compile(r"[\u4e00-\u9fff]")


def test_every_help_and_menu_fits_the_prompt_in_its_language_with_the_values_of_the_english_one(helps):
    for (language, name), shown in helps.items():
        assert len(shown) == 22, (language, name)
        for key, (text, menu) in shown.items():
            # The prompt prints "🎤 " and the help on an 80-column line: no line of a help may wrap there.
            widths = [wcswidth(line) for line in text.splitlines()]
            assert 0 <= min(widths) and max(widths) <= 76, (language, name, key, text)
            assert [line for line in menu if not 0 <= wcswidth(line) <= 80] == [], (language, name, key)
            question = text.splitlines()[0]
            assert bool(CJK.search(question)) == (language == "Chinese"), (language, name, key, text)
    for name in HELP_CONTEXTS:
        whole = {language: {key: "\n".join([text, *menu]) for key, (text, menu) in helps[language, name].items()}
                 for language in LANGUAGES}  # fmt: skip
        changed = {key: values_not_in_both(whole["English"][key], whole["Chinese"][key]) for key in whole["English"]}
        assert changed == dict.fromkeys(whole["English"], [])


# Whose language the questionnaire speaks: (the locale variables set, readme_language) -> its language.
SPOKEN = {
    "zh-terminal-english-readme": ({"LANG": "zh_CN.UTF-8"}, "en", "Chinese"),
    "lc-all-before-lang": ({"LC_ALL": "zh_TW.UTF-8", "LANG": "en_US.UTF-8"}, "en", "Chinese"),
    "english-lc-all-over-zh-lang": ({"LC_ALL": "en_US.UTF-8", "LANG": "zh_CN.UTF-8"}, "en", "English"),
    "lc-messages-before-lang": ({"LC_MESSAGES": "zh_CN.UTF-8", "LANG": "C.UTF-8"}, "en", "Chinese"),
    "chinese-readme-english-terminal": ({"LANG": "en_US.UTF-8"}, "zh", "Chinese"),
    "both-readmes-english-terminal": ({"LANG": "en_US.UTF-8"}, "both", "English"),
    "both-readmes-no-locale": ({}, "both", "Chinese"),  # a Windows console sets no locale: the README decides
    "english-readme-no-locale": ({}, "en", "English"),
}


@pytest.mark.parametrize("variables,readme,language", SPOKEN.values(), ids=SPOKEN.keys())
def test_the_questionnaire_speaks_chinese_for_a_chinese_readme_or_terminal(tmp_path, variables, readme, language):
    answers, _ = REFUSED["nccl-on-windows"]
    with terminal_locale(None), pytest.raises(ValueError) as refusal:
        os.environ.update(variables)
        render(tmp_path / "p", {**answers, "readme_language": readme})
    assert str(refusal.value).endswith(f"': {LANGUAGES[language][1]['nccl-on-windows']}")


# `copier copy --defaults` in a terminal of a locale, with a README language or its default:
# (locale, readme_language, the README chosen, the message's blocks).
AFTER_COPY = {
    "zh-terminal": (CHINESE_TERMINAL, None, "zh", ["下一步"]),
    "english-terminal": (ENGLISH_TERMINAL, None, "en", ["Next steps"]),
    "chinese-readme": (ENGLISH_TERMINAL, "zh", "zh", ["下一步"]),
    "both-readmes": (ENGLISH_TERMINAL, "both", "both", ["Next steps", "下一步"]),
}


@pytest.mark.parametrize("locale,readme,chosen,blocks", AFTER_COPY.values(), ids=AFTER_COPY.keys())
def test_the_readme_and_the_message_after_the_copy_follow_the_language(tmp_path, locale, readme, chosen, blocks):
    data = ["--data", f"readme_language={readme}"] if readme else []
    with terminal_locale(locale):
        done = subprocess.run(
            [sys.executable, "-m", "copier", "copy", "--defaults", *data, "--vcs-ref", "HEAD", str(TEMPLATE),
             str(tmp_path / "p")],
            capture_output=True, text=True, encoding="utf-8", timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answers = yaml.safe_load((tmp_path / "p" / ".copier-answers.yml").read_text(encoding="utf-8"))
    assert answers["readme_language"] == chosen
    assert [block for block in ("Next steps", "下一步") if block in done.stderr] == blocks
    if "下一步" in blocks:  # the Chinese block is the last; each line fits 80 columns but the `cd` to the destination
        chinese = done.stderr[done.stderr.index("下一步") :].splitlines()
        assert len(chinese) >= 5 and [line for line in chinese if wcswidth(line) > 80 and "cd " not in line] == []


SYSTEMS = {"windows": ["windows"], "linux": ["linux"], "both": ["windows", "linux"]}


@pytest.fixture(scope="module")
def cuda_help(tmp_path_factory):
    """The cuda question's help as the prompt renders it: copier's own Jinja environment (its filters, this
    template's _envops) over copier.yml's help, for a torch series, a target_os and a driver table."""
    from copier._main import Worker  # copier's renderer; a help is rendered only at the prompt

    template = copy_template(tmp_path_factory.mktemp("template") / "plain")
    environment = Worker(src_path=str(template), dst_path=str(tmp_path_factory.mktemp("out"))).jinja_env
    config = yaml.safe_load((TEMPLATE / "copier.yml").read_text(encoding="utf-8"))
    shown = environment.from_string(config["cuda"]["help"])
    matrix = yaml.safe_load(config["support_matrix"]["default"])
    return lambda series, target_os, drivers, chinese=False: shown.render(
        support_matrix=matrix, cuda_drivers=drivers, torch_series=series, target_os=target_os,
        messages_in_chinese=chinese,
    )  # fmt: skip


# How each language writes a driver line: "  {prefix}{tag floor+}{separator}{tag floor+}..."
DRIVER_LINES = {"English": ("  NVIDIA driver, {}: ", ", "), "Chinese": ("  NVIDIA 驱动，{}：", "、")}


@pytest.mark.parametrize("language", DRIVER_LINES)
def test_the_cuda_help_names_each_offered_tags_oldest_driver_from_cuda_drivers(cuda_help, language):
    prefix, separator = DRIVER_LINES[language]
    chinese = language == "Chinese"
    config = yaml.safe_load((TEMPLATE / "copier.yml").read_text(encoding="utf-8"))
    matrix, drivers = (yaml.safe_load(config[key]["default"]) for key in ("support_matrix", "cuda_drivers"))
    for series, row in matrix.items():
        offered = row["tags"] + row["experimental"]
        for target_os, systems in SYSTEMS.items():
            lines = cuda_help(series, target_os, drivers, chinese).splitlines()
            floors = {system: separator.join(f"{tag} {drivers[tag][system]}+" for tag in offered) for system in systems}
            named = [line for line in lines if "NVIDIA" in line]
            expected = [prefix.format(system.capitalize()) + floors[system] for system in systems if offered]
            assert named == expected, (series, target_os)
            # an 80-column prompt, no wrapping
            assert max(map(wcswidth, lines)) <= 76, (series, target_os, lines)
    # The numbers are read from cuda_drivers, not written into the help: another table, another help.
    other = {tag: {"linux": f"{tag[2:]}.1.2", "windows": f"{tag[2:]}.3"} for tag in drivers}
    assert cuda_help("2.13", "both", other, chinese).splitlines()[-2:] == [
        prefix.format("Windows") + separator.join(["cu126 126.3+", "cu130 130.3+", "cu132 132.3+"]),
        prefix.format("Linux") + separator.join(["cu126 126.1.2+", "cu130 130.1.2+", "cu132 132.1.2+"]),
    ]
