"""configs/train.toml says "Edit freely": with every value in it changed, the project's own tests still pass.

The rendered project's tests read their own copy of the generated settings (tests/train.toml); the user's
file is only checked for being valid. This renders a project, changes every value a CPU project can
change to another valid one, and runs the project's default tier as its README says (python -m pytest).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from render import render

# Another valid value for each setting of a CPU project on one machine.
EDITS = {
    "recipe": '"edited_cfg.my_recipe"',  # the user's own recipe module, next to the seed's
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


def test_every_value_of_configs_train_toml_edited_and_the_default_tier_still_passes(tmp_path):
    project = tmp_path / "edited project"
    render(project, {"project_name": "edited-cfg"})
    package = project / "src" / "edited_cfg"
    shutil.copy(package / "recipe.py", package / "my_recipe.py")
    config = project / "configs" / "train.toml"
    text = config.read_text(encoding="utf-8")
    # A new setting needs a value here (or a reason in NO_ALTERNATIVE).
    assert {key for key, _ in SETTING.findall(text)} == EDITS.keys() | NO_ALTERNATIVE
    edited = SETTING.sub(lambda found: f"{found[1]} = {EDITS.get(found[1], found[2])}", text)
    assert {key: value for key, value in SETTING.findall(edited) if key in EDITS} == EDITS
    config.write_text(edited, encoding="utf-8")
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    environment = {**os.environ, "PYTHONPATH": str(project / "src")}
    environment.pop("PYTEST_XDIST_WORKER", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-x"],
        cwd=project, capture_output=True, text=True, timeout=600, env=environment,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "tests/test_cli.py::test_your_config_file_is_valid PASSED" in result.stdout  # the edits are valid
    assert re.search(r"\b\d+ passed", result.stdout.splitlines()[-1]), result.stdout.splitlines()[-1]
