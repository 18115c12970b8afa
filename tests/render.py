"""Render the template with copier's API; shared by the template's tests and noxfile.py.

python tests/render.py NAME DESTINATION    renders one named answer set
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parents[1]
# How the README and the docs name the template in `copier copy`: a clone of this repository in a folder of
# this name (there is no public home yet). tests/test_site.py holds every page to it.
TEMPLATE_ADDRESS = "copier-torch-ddp"
# What a copy of the template needs: the questionnaire, the generated tree, and the partials it includes.
TEMPLATE_PARTS = ("copier.yml", "template", "includes")

# Named answer sets: each is what a user would type on top of the defaults.
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
}


def copy_template(destination: Path) -> Path:
    """A plain (non-git) copy of the template's own files, for tests that build template versions."""
    destination.mkdir(parents=True, exist_ok=True)
    for part in TEMPLATE_PARTS:
        source = TEMPLATE / part
        if source.is_dir():
            shutil.copytree(source, destination / part)
        else:
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


if __name__ == "__main__":
    name, destination = sys.argv[1], Path(sys.argv[2])
    render(destination, ANSWER_SETS[name])
    print(f"rendered {name} into {destination}")
