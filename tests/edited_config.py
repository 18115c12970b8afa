"""configs/train.toml says "Edit freely": another valid value for every setting a CPU project can change.

The project's tests read their own copy of the generated settings (tests/train.toml); the user's file is only
checked for being valid. So `nox -s render_and_test` runs the project that it tests in both tiers with every
value here changed (noxfile.py, EDITED_ANSWER_SET), and tests/test_edited_config.py checks that every setting of
the file has an edit here and that the edited file passes the project's own validity test.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

# Another valid value for each setting of a CPU project on one machine; {package} is the project's package.
EDITS = {
    "recipe": '"{package}.my_recipe"',  # the user's own recipe module, next to the seed's
    "epochs": "8",
    "global_batch_size": "96",
    "accumulate_steps": "2",
    "lr": "0.05",
    "momentum": "0.5",
    "seed": "1",
    "samples": "1024",
    "num_workers": "1",
    "checkpoint_every": "7",
    "keep_checkpoints": "2",
    "output_dir": '"runs"',
    "resume": '"none"',
    "overwrite": "true",
    "best_metric": '"val_accuracy"',
    "best_mode": '"max"',
    "stop_on_nonfinite_loss": "false",
    "precision": '"bf16"',
    "parallelism": '"ddp_model_parallel"',
    "max_grad_norm": "1.0",
    "early_stop_patience": "3",
    "deterministic": "true",
    "progress": "false",
    "nproc_per_node": "1",
    "master_port": "29611",
    "timeout_s": "120",
    "max_restarts": "1",
    "target_os": '"both"',
    "torch_version": '"2.13.1"',
    "python_version": '"3.12"',
    "launcher": '"torchrun"',
    "torch_index_url": '"https://mirrors.nju.edu.cn/pytorch/whl/cpu"',
    "cuda_tags": '["cu126"]',
    "torch_pip_option": '"--find-links"',
    "package_mirror": '"china"',
    "pypi_index_url": '"https://pypi.tuna.tsinghua.edu.cn/simple"',
    "conda_channel": '"https://mirrors.tuna.tsinghua.edu.cn/anaconda/cloud/conda-forge"',
    "torchvision": '""',
    "torchaudio": '"2.13.0"',
    "extras": '["tensorboard"]',
}
# Settings with no other valid value on a CPU-only machine alone: gloo on the CPU, one machine, no GPUs.
# The drivers: a CPU build needs none. tensorboard = true needs the tensorboard package, which the
# project's test extra does not install.
NO_ALTERNATIVE = {"backend", "device", "nnodes", "node_rank", "master_addr", "gpus_per_node", "cuda",
                  "driver_min_linux", "driver_min_windows", "tensorboard"}  # fmt: skip
SETTING = re.compile(r"^(\w+) = (\"[^\"]*\"|\[[^\]]*\]|\S+)", re.M)


def package_of(project: Path) -> str:
    (package,) = [path.parent.name for path in (project / "src").glob("*/__init__.py")]
    return package


def settings_of(config: Path) -> dict[str, str]:
    """{name: value as written} of every setting in a configs/train.toml."""
    return dict(SETTING.findall(config.read_text(encoding="utf-8")))


def edit_every_setting(project: Path) -> dict[str, str]:
    """Give a rendered project the user's own recipe module (a copy of the seed's) and change every value of its
    configs/train.toml to the one in EDITS; returns the edited settings as written."""
    package = package_of(project)
    shutil.copy(project / "src" / package / "recipe.py", project / "src" / package / "my_recipe.py")
    config = project / "configs" / "train.toml"
    wanted = {name: value.format(package=package) for name, value in EDITS.items()}
    text = SETTING.sub(lambda found: f"{found[1]} = {wanted.get(found[1], found[2])}", config.read_text("utf-8"))
    config.write_text(text, encoding="utf-8")
    return {name: value for name, value in settings_of(config).items() if name in wanted}
