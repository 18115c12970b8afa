"""Training a rendered project from the template's own tests (two hosts, Slurm): one copy of each helper.

torch is imported where it is used: every pytest worker collects these modules, most never compare models.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def package_of(project: Path) -> str:
    return next(path.parent.name for path in (project / "src").glob("*/train.py"))


def train_on_one_machine(project: Path, output: Path, *settings: str) -> Path:
    """`python -m <package>.train` with 2 ranks on this machine, the spawn path: the result to match."""
    done = subprocess.run(
        [sys.executable, "-m", f"{package_of(project)}.train", "--config", str(project / "configs" / "train.toml"),
         *settings, "--output-dir", str(output), "--nproc-per-node", "2", "--nnodes", "1", "--master-addr",
         "127.0.0.1"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(project / "src")},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return output


def assert_bitwise_equal(first: Path, second: Path) -> None:
    import torch

    a = torch.load(first / "model.pt", weights_only=True)["model"]
    b = torch.load(second / "model.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
