"""The rendered environment.yml really installs: its pip section goes into a fresh venv.

Only the torch source is swapped for this machine (TORCH_SPEC, default torch==2.13.0, and
TORCH_INDEX_URL if set), exactly as noxfile.py does; every other line is used as rendered.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv

import yaml

TORCH_SPEC = os.environ.get("TORCH_SPEC", "torch==2.13.0")
TORCH_INDEX_URL = os.environ.get("TORCH_INDEX_URL")


def test_cpu_environment_installs_and_imports_the_package(rendered, tmp_path):
    project = rendered("windows-cpu-default")
    environment = yaml.safe_load((project / "environment.yml").read_text(encoding="utf-8"))
    pip = next(item["pip"] for item in environment["dependencies"] if isinstance(item, dict))
    requirements = []
    for line in pip:
        if line.startswith("--extra-index-url"):
            assert line.endswith("/whl/cpu")
            if TORCH_INDEX_URL:
                requirements.append(f"--extra-index-url {TORCH_INDEX_URL}")
        elif line.startswith("torch=="):
            assert line.endswith("+cpu")
            requirements.append(TORCH_SPEC)
        else:
            requirements.append(line)
    (project / "requirements-local.txt").write_text("\n".join(requirements) + "\n", encoding="utf-8")

    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "-r", "requirements-local.txt"],
        cwd=project, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    check = subprocess.run(
        [str(python), "-c", "import my_ddp.train, my_ddp.doctor, numpy, tqdm, torch; print(torch.__version__)"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    if "==" in TORCH_SPEC:
        assert check.stdout.strip().startswith(TORCH_SPEC.split("==")[1])
