"""Environment check: python -m <package>.doctor

Prints what this machine has (paste it into a bug report), then compares it
with what the project was generated for ([environment] in configs/train.toml).
Each mismatch is one line with the command that fixes it. Exits 1 when
anything would stop training, 0 otherwise (warnings do not count).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

try:  # the doctor answers where torch cannot load: a CUDA build missing its libraries, or no torch at all
    import torch
    import torch.distributed as dist
except Exception as error:  # noqa: BLE001 - ImportError, OSError ("libcudnn.so.9: cannot open shared object file")
    torch = dist = None
    TORCH_FAILURE = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"

from .config import DEFAULT_CONFIG, Config, ConfigError, load
from .distributed import LaunchError, backend_problems, check_port_free, exit_now, gloo_binding

PROG = f"python -m {__package__}.doctor"


@dataclass
class Finding:
    level: str  # "ok", "warn" or "FAIL"
    text: str


def cuda_tag() -> str:
    """The wheel tag of the installed torch build: cpu, cu126, ..."""
    return "cu" + torch.version.cuda.replace(".", "") if torch.version.cuda else "cpu"


def libuv_in_store() -> bool:
    """Whether this torch's TCPStore was built with libuv (Windows wheels were not)."""
    try:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True, wait_for_workers=False)
    except Exception:  # noqa: BLE001 - the build without libuv raises a RuntimeError
        return False
    del store
    return True


def facts() -> dict[str, str]:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(gpus)) or "none"
    return {
        "os": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "python": platform.python_version(),
        "torch": f"{torch.__version__} ({cuda_tag()} build)",
        "cudnn": str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else "none",
        "gpus": f"{gpus}: {names}",
        "gloo": "yes" if dist.is_gloo_available() else "no",
        "nccl": "yes" if dist.is_nccl_available() else "no",
        "libuv": "yes" if libuv_in_store() else "no (the launchers set USE_LIBUV=0)",
        "conda env": os.environ.get("CONDA_DEFAULT_ENV", "none active"),
    }


def reinstall_command(wanted: dict) -> str:
    """The project's own torch (environment.yml's pin, from its index), as one command."""
    return (
        f"pip install --force-reinstall torch=={wanted.get('torch_version')}+{wanted.get('cuda')} "
        f"--index-url {wanted.get('torch_index_url')}   (or: conda env update -f environment.yml --prune)"
    )


def torch_missing(config: Config) -> int:
    """What the doctor can say without torch: the machine, and the one command that brings the right torch back."""
    print(f"{'os':>10}: {platform.system()} {platform.release()} ({platform.machine()})")
    print(f"{'python':>10}: {platform.python_version()} ({sys.executable})")
    print()
    print(f"FAIL  torch cannot be imported ({TORCH_FAILURE}); fix: {reinstall_command(config.environment)}")
    return 1


def compare(config: Config) -> list[Finding]:
    """Machine against answers; every non-ok line carries its fix."""
    wanted = config.environment
    found: list[Finding] = []
    reinstall = reinstall_command(wanted)
    installed_version = torch.__version__.split("+")[0]
    if wanted.get("torch_version") and installed_version != wanted["torch_version"]:
        found.append(
            Finding(
                "warn",
                f"torch {installed_version} is installed, the project pins {wanted['torch_version']}; fix: {reinstall}",
            )
        )
    have_tag = cuda_tag()
    if wanted.get("cuda") and have_tag != wanted["cuda"]:
        level = "FAIL" if wanted["cuda"] != "cpu" and have_tag == "cpu" else "warn"
        found.append(
            Finding(level, f"torch is a {have_tag} build, the project wants {wanted['cuda']}; fix: {reinstall}")
        )
    want_python = wanted.get("python_version")
    if want_python and platform.python_version().rsplit(".", 1)[0] != want_python:
        found.append(
            Finding(
                "warn",
                f"Python {platform.python_version()} runs this, the project pins {want_python}; "
                "fix: conda env update -f environment.yml --prune, then conda activate it",
            )
        )
    here = "windows" if sys.platform == "win32" else "linux" if sys.platform.startswith("linux") else sys.platform
    target = wanted.get("target_os")
    if target in ("windows", "linux") and here != target:
        found.append(
            Finding(
                "warn",
                f"this project was generated for {target}, this machine runs {here}: its launchers and defaults "
                f"are {target}'s; fix: copier update --defaults --data target_os=both",
            )
        )
    found += [Finding("FAIL", problem) for problem in backend_problems(config)]
    if config.nnodes > 1 and config.node_rank == 0:  # one machine needs no port: its ranks meet through a file
        try:
            check_port_free(config.master_addr, config.master_port)
        except LaunchError as error:
            found.append(Finding("FAIL", str(error)))
    if not found:
        found.append(Finding("ok", "this machine matches the project's answers"))
    return found


def network(config: Config) -> dict[str, str]:
    """Where gloo's sockets will listen, and why: the rule training itself uses."""
    if config.backend != "gloo":
        return {}
    try:
        return {"gloo": gloo_binding(config)[1]}
    except LaunchError as error:
        return {"gloo": f"FAIL {error}"}


def _train() -> str:
    return f"python -m {__package__}.train"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--master-port", type=int, help="check this port instead of master_port in the config")
    args = parser.parse_args(argv)
    try:
        config = load(args.config)
    except ConfigError as error:
        parser.error(str(error))
    if args.master_port is not None:
        config = dataclasses.replace(config, master_port=args.master_port)
    if torch is None:
        return torch_missing(config)
    for name, value in {**facts(), **network(config)}.items():
        print(f"{name:>10}: {value}")
    print()
    findings = compare(config)
    for finding in findings:
        print(f"{finding.level:<4}  {finding.text}")
    return 1 if any(f.level == "FAIL" for f in findings) else 0


if __name__ == "__main__":
    exit_now(main())  # without torch's teardown, as the ranks end
