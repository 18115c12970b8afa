"""Environment check: python -m <package>.doctor

Prints what this machine has (paste it into a bug report), then compares it
with what the project was generated for ([environment] in configs/train.toml).
Each mismatch is one line with the command that fixes it. Exits 1 when
anything would stop training, 0 otherwise (warnings do not count).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from .config import DEFAULT_CONFIG, Config, ConfigError, load
from .distributed import LaunchError, backend_problems, check_port_free, exit_now, gloo_binding, visible_gpus

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


def compare(config: Config) -> list[Finding]:
    """Machine against answers; every non-ok line carries its fix."""
    wanted = config.environment
    found: list[Finding] = []
    reinstall = (
        f"pip install --force-reinstall torch=={wanted.get('torch_version')}+{wanted.get('cuda')} "
        f"--index-url {wanted.get('torch_index_url')}   (or: conda env update -f environment.yml --prune)"
    )
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
    found += gpu_architectures(config)
    if config.nnodes > 1 and config.node_rank == 0:  # one machine needs no port: its ranks meet through a file
        try:
            check_port_free(config.master_addr, config.master_port)
        except LaunchError as error:
            found.append(Finding("FAIL", str(error)))
    if not found:
        found.append(Finding("ok", "this machine matches the project's answers"))
    return found


def tag_covers(tag: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """The lowest and highest compute capability that PyTorch's builds of a CUDA wheel tag have kernels for.

    CUDA 12.8 added Blackwell (sm_100, sm_120: RTX 50xx); CUDA 13 dropped Maxwell, Pascal and Volta (GTX 10xx).
    """
    version = int(tag[2:])
    if version < 128:
        return (5, 0), (9, 0)
    return ((5, 0), (12, 0)) if version < 130 else ((7, 5), (12, 1))


def runs_on(capability: tuple[int, int], arch_list: list[str]) -> bool:
    """Whether a build with these architectures (torch.cuda.get_arch_list(): sm_86, sm_90a, compute_90 ...) has
    code for a GPU: a cubin of the same major version and no higher minor, or PTX of no higher version (JIT)."""
    for arch in arch_list:
        kind, _, number = arch.partition("_")
        digits = number.rstrip("abcdefghijklmnopqrstuvwxyz")
        if not digits.isdigit() or len(digits) < 2:
            continue
        built = (int(digits[:-1]), int(digits[-1]))
        if kind == "compute" and built <= capability:
            return True
        same_family = built[0] == capability[0] and built[1] <= capability[1]
        if kind == "sm" and (same_family if digits == number else built == capability):  # sm_90a: sm_90 alone
            return True
    return False


def architecture_findings(
    gpus: dict[int, tuple[str, tuple[int, int]]], arch_list: list[str], wanted: dict, installed_tag: str
) -> list[Finding]:
    """A FAIL for each GPU the installed build has no kernels for, naming the CUDA tag whose builds do."""
    offered = wanted.get("cuda_tags") or [installed_tag]
    found = []
    for index, (name, capability) in gpus.items():
        if runs_on(capability, arch_list):
            continue
        sm = f"sm_{capability[0]}{capability[1]}"
        fitting = [tag for tag in offered if tag != "cpu" and tag_covers(tag)[0] <= capability <= tag_covers(tag)[1]]
        problem = (
            f"GPU {index} ({name}) is {sm}, and this torch build ({installed_tag}) has kernels for "
            f'{", ".join(arch_list) or "no GPU"} only: training would fail with "no kernel image is available for '
            'execution on the device"'
        )
        version = wanted.get("torch_version", torch.__version__.split("+")[0])
        if fitting:
            tag, current, url = fitting[0], wanted.get("cuda", ""), wanted.get("torch_index_url", "")
            same_index = current and url.endswith(current)  # a mirror's address, with the other tag at its end
            index_url = url[: -len(current)] + tag if same_index else f"https://download.pytorch.org/whl/{tag}"
            fix = (
                f"use the {tag} build: copier update --defaults --data cuda={tag}, then "
                f"pip install --force-reinstall torch=={version}+{tag} --index-url {index_url}"
            )
        else:
            fix = (
                f"no CUDA build of torch {version} ({', '.join(offered)}) covers {sm}: pick a torch release whose "
                "builds do (copier update --defaults --data torch_version=X.Y.Z)"
            )
        found.append(Finding("FAIL", f"{problem}; fix: {fix}"))
    return found


def gpu_architectures(config: Config) -> list[Finding]:
    """Each visible GPU's sm_XY against the architectures the installed torch was built for."""
    gpus = visible_gpus()
    return architecture_findings(gpus, torch.cuda.get_arch_list(), config.environment, cuda_tag()) if gpus else []


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


def smoke_check(config: Config) -> int:
    from .smoke import main as smoke

    return smoke(config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="train a short real run on this machine's devices (about 20 steps, a checkpoint, a resume) and print "
        "PASS or FAIL for each step, with the fix",
    )
    args = parser.parse_args(argv)
    try:
        config = load(args.config)
    except ConfigError as error:
        parser.error(str(error))
    if args.smoke:
        return smoke_check(config)
    for name, value in {**facts(), **network(config)}.items():
        print(f"{name:>10}: {value}")
    print()
    findings = compare(config)
    for finding in findings:
        print(f"{finding.level:<4}  {finding.text}")
    return 1 if any(f.level == "FAIL" for f in findings) else 0


if __name__ == "__main__":
    exit_now(main())  # without torch's teardown, as the ranks end
