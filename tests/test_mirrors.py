"""package_mirror: where conda, pip and PyTorch's wheels come from, and what pip does with it.

Every answer's rendered URLs and commands are checked against this file's own copy of the mirrors'
published forms (an index URL for pip --index-url / --extra-index-url, a flat page for --find-links).
Then the rendered requirements.txt's pip settings, verbatim but for the host, are given to a pip that
has no configuration of its own, pointed at a local index (tests/wheel_index.py) that serves this
machine's CPU torch wheel under each host's path layout: it must install exactly the pinned build.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
import yaml

from render import render
from wheel_index import WheelIndex

# What each answer must produce (docs/questions.md, package_mirror, says why these hosts and forms).
OFFICIAL = {
    "conda": "conda-forge",
    "pypi": "https://pypi.org/simple",
    "torch": "https://download.pytorch.org/whl/cpu",
    "option": "--extra-index-url",
}
CHINA = {
    "conda": "https://mirrors.tuna.tsinghua.edu.cn/anaconda/cloud/conda-forge",
    "pypi": "https://pypi.tuna.tsinghua.edu.cn/simple",
    "torch": "https://mirrors.nju.edu.cn/pytorch/whl/cpu",
    "option": "--extra-index-url",
}
CUSTOM_FLAT = {  # Aliyun's form: one flat page of wheel files per tag
    "answers": {
        "package_mirror": "custom",
        "conda_url": "https://mirrors.bfsu.edu.cn/anaconda/cloud/conda-forge/",
        "pypi_url": "https://mirrors.aliyun.com/pypi/simple/",
        "torch_url": "https://mirrors.aliyun.com/pytorch-wheels/",
        "torch_url_layout": "flat",
    },
    "conda": "https://mirrors.bfsu.edu.cn/anaconda/cloud/conda-forge",
    "pypi": "https://mirrors.aliyun.com/pypi/simple",
    "torch": "https://mirrors.aliyun.com/pytorch-wheels/cpu",
    "option": "--find-links",
}
CUSTOM_INDEX = {
    "answers": {
        "package_mirror": "custom",
        "conda_url": "https://mirrors.ustc.edu.cn/anaconda/cloud/conda-forge",
        "pypi_url": "https://mirrors.ustc.edu.cn/pypi/simple",
        "torch_url": "https://mirror.example.edu/pytorch/whl",
        "torch_url_layout": "index",
    },
    "conda": "https://mirrors.ustc.edu.cn/anaconda/cloud/conda-forge",
    "pypi": "https://mirrors.ustc.edu.cn/pypi/simple",
    "torch": "https://mirror.example.edu/pytorch/whl/cpu",
    "option": "--extra-index-url",
}
MIRRORS = {
    "official": {"answers": {}, **OFFICIAL},
    "china": {"answers": {"package_mirror": "china"}, **CHINA},
    "custom-flat": CUSTOM_FLAT,
    "custom-index": CUSTOM_INDEX,
}


def pip_lines(project: Path) -> list[str]:
    return [line for line in (project / "requirements.txt").read_text(encoding="utf-8").splitlines()
            if line and not line.startswith("#")]  # fmt: skip


@pytest.mark.parametrize("name", MIRRORS)
def test_each_mirror_answer_renders_its_urls_and_commands(tmp_path, name):
    expected = MIRRORS[name]
    project = tmp_path / "project"
    render(project, {**expected["answers"], "extras": ["torchvision", "tensorboard"]})
    index_line = [] if name == "official" else [f"--index-url {expected['pypi']}"]  # official: pip's own default
    assert pip_lines(project) == [
        *index_line,
        f"{expected['option']} {expected['torch']}",
        "torch==2.13.0+cpu",
        "torchvision==0.28.0+cpu",
        "tensorboard",
        "numpy",
        "tqdm",
    ]
    environment = yaml.safe_load((project / "environment.yml").read_text(encoding="utf-8"))
    assert environment["channels"] == [expected["conda"], *([] if name == "official" else ["nodefaults"])]
    assert environment["dependencies"][-1] == {"pip": ["-r requirements.txt", "-e .[test,plot]"]}
    recorded = tomllib.loads((project / "configs" / "train.toml").read_text(encoding="utf-8"))["environment"]
    assert (recorded["torch_index_url"], recorded["pypi_index_url"], recorded["conda_channel"]) == (
        expected["torch"], expected["pypi"], expected["conda"],
    )  # fmt: skip
    assert recorded["torch_pip_option"] == expected["option"]
    # Both setups read requirements.txt: none of them names a host of its own.
    for script in ("setup_env.bat", "setup_env.ps1", "setup_env.sh"):
        text = (project / "scripts" / script).read_text(encoding="ascii")
        assert "-r requirements.txt" in text and "download.pytorch.org" not in text, script


def test_a_gpu_project_takes_its_tag_from_the_mirror_too(tmp_path):
    render(tmp_path / "p", {"package_mirror": "china", "gpus_per_node": 2, "cuda": "cu130", "extras": ["torchvision"]})
    assert pip_lines(tmp_path / "p")[1:4] == [
        "--extra-index-url https://mirrors.nju.edu.cn/pytorch/whl/cu130",
        "torch==2.13.0+cu130",
        "torchvision==0.28.0+cu130",
    ]


BAD_URLS = {
    "no-scheme": ("pypi_url", "pypi.tuna.tsinghua.edu.cn/simple"),
    "ftp": ("torch_url", "ftp://mirrors.example.org/pytorch/whl"),
    "space": ("conda_url", "https://mirrors.tuna.tsinghua.edu.cn/anaconda/cloud/conda forge"),
    "empty": ("torch_url", ""),
    "no-host": ("pypi_url", "https:///simple"),
}


@pytest.mark.parametrize("key,value", BAD_URLS.values(), ids=BAD_URLS.keys())
def test_a_malformed_custom_url_is_refused_on_one_short_line(tmp_path, key, value):
    with pytest.raises(ValueError) as refusal:
        render(tmp_path / "p", {"package_mirror": "custom", key: value})
    shown = str(refusal.value)
    assert shown == f"Validation error for question '{key}': use http(s)://host/path, no spaces"
    assert len(shown) <= 80
    assert not (tmp_path / "p").exists()


# -- pip, with the rendered settings, against a local stand-in of each host ----------------------------------------

# The path layout each host serves (what the stand-in serves under 127.0.0.1).
INDEX_PREFIXES = ["whl/cpu", "pytorch/whl/cpu"]  # download.pytorch.org/whl/<tag>/<project>/, NJU's /pytorch/whl/...
FLAT_PREFIXES = ["pytorch-wheels/cpu"]  # Aliyun's mirrors.aliyun.com/pytorch-wheels/<tag>/


def clean_pip_env(tmp_path: Path) -> dict[str, str]:
    """A pip that reads no configuration file and no PIP_* variable: only what requirements.txt says."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_CACHE_DIR": str(tmp_path / "pip-cache")}  # fmt: skip


@pytest.fixture(scope="session")
def torch_wheel(tmp_path_factory) -> Path:
    """This machine's CPU torch wheel, the build the tests run: where pip finds it (here: a local folder)."""
    version = torch.__version__
    if "+cpu" not in version:
        pytest.skip(f"the pip checks need a +cpu torch build (this one is {version})")
    folder = tmp_path_factory.mktemp("wheel")
    fetched = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(folder), f"torch=={version}"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if fetched.returncode != 0:
        pytest.skip(f"pip cannot fetch torch=={version} here: {fetched.stderr[-300:]}")
    return next(folder.glob("torch-*.whl"))


@pytest.fixture(scope="session")
def wheel_index(torch_wheel):
    index = WheelIndex([torch_wheel], INDEX_PREFIXES, FLAT_PREFIXES)
    yield index
    index.close()


def to_local(line: str, local: str) -> str:
    """The same URL on the stand-in: only the scheme and host change, the path (the layout) stays."""
    return re.sub(r"https?://[^/\s]+", local, line)


def pip_resolves(requirements: Path, env: dict, report: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps", "--quiet",
         "--report", str(report), "-r", str(requirements)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


@pytest.mark.xdist_group("wheel_index")  # one worker: the torch wheel is fetched and served once
@pytest.mark.parametrize("name", MIRRORS)
def test_pip_installs_exactly_the_pinned_build_through_each_mirror(tmp_path, wheel_index, name):
    expected = MIRRORS[name]
    project = tmp_path / "project"
    render(project, expected["answers"])
    # The pip settings verbatim, with torch's pin; numpy and tqdm come from PyPI (or its mirror), not served here.
    kept = [to_local(line, wheel_index.url) for line in pip_lines(project) if line.startswith(("-", "torch=="))]
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("\n".join(kept) + "\n", encoding="utf-8")
    env = clean_pip_env(tmp_path)
    wheel_index.requests.clear()
    if name == "official":  # no --index-url line: pip's default index is PyPI, which the stand-in plays too
        env["PIP_INDEX_URL"] = f"{wheel_index.url}/simple"
    report = tmp_path / "report.json"
    done = pip_resolves(requirements, env, report)
    assert done.returncode == 0, done.stdout + done.stderr
    installed = json.loads(report.read_text(encoding="utf-8"))["install"]
    assert [(item["metadata"]["name"], item["metadata"]["version"]) for item in installed] == [
        ("torch", torch.__version__)
    ]
    path = to_local(expected["torch"], "")
    assert any(request.rstrip("/").startswith(path) for request in wheel_index.requests), wheel_index.requests


@pytest.mark.xdist_group("wheel_index")
def test_a_flat_mirror_given_to_pip_as_an_index_finds_no_torch(tmp_path, wheel_index):
    """Why the layout answer exists: Aliyun's flat page has no <project>/ pages under it."""
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(
        f"--index-url {wheel_index.url}/simple\n--extra-index-url {wheel_index.url}/pytorch-wheels/cpu\n"
        f"torch=={torch.__version__}\n",
        encoding="utf-8",
    )
    done = pip_resolves(requirements, clean_pip_env(tmp_path), tmp_path / "report.json")
    assert done.returncode == 1
    assert f"No matching distribution found for torch=={torch.__version__}" in done.stderr
