"""Environment check: python -m <package>.doctor

Prints what this machine has (paste it into a bug report), then compares it
with what the project was generated for ([environment] in configs/train.toml).
Each mismatch is one line with the command that fixes it. Exits 1 when
anything would stop training, 0 otherwise (warnings do not count).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # started as a file (python src/<package>/doctor.py, an editor's Run button): as the module, with
    here = Path(__file__).resolve().parent  # the package importable and its folder's files not shadowing others
    sys.path[:] = [str(here.parent), *(entry for entry in sys.path if Path(entry or ".").resolve() != here)]
    __package__ = here.name

try:  # the doctor answers where torch cannot load: a CUDA build missing its libraries, or no torch at all
    import torch
    import torch.distributed as dist
except Exception as error:  # noqa: BLE001 - ImportError, OSError ("libcudnn.so.9: cannot open shared object file")
    torch = dist = None
    TORCH_FAILURE = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"

from .engine.config import DEFAULT_CONFIG, Config, ConfigError
from .engine.config_file import load
from .engine.devices import backend_problems, visible_gpus
from .engine.logs import escape_what_stdout_cannot_encode, wrapped
from .engine.process_group import LaunchError, check_meeting_place, gloo_binding

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
        "env": environment_shown(),
    }


def environment_kind(prefix: str = sys.prefix, base_prefix: str = sys.base_prefix) -> str:
    """What this Python runs in, which decides the fix lines: "conda" (an environment of conda's, which marks
    its own with conda-meta/), "venv" (the project's .venv, or any virtual environment) or "system"."""
    if (Path(prefix) / "conda-meta").is_dir():
        return "conda"
    return "venv" if prefix != base_prefix else "system"


def environment_shown() -> str:
    kind = environment_kind()
    name = f" {os.environ['CONDA_DEFAULT_ENV']}" if kind == "conda" and "CONDA_DEFAULT_ENV" in os.environ else ""
    return f"{kind}{name} ({sys.prefix})"


def reinstall_command(wanted: dict) -> str:
    """The project's own torch (the pin, from its index), as one command; a conda environment's alternative."""
    conda = "   (or: conda env update -f environment.yml --prune)" if environment_kind() == "conda" else ""
    return (
        f"pip install --force-reinstall torch=={wanted.get('torch_version')}+{wanted.get('cuda')} "
        f"{torch_source_option(wanted)} {wanted.get('torch_index_url')}{conda}"
    )


def python_fix(want: str) -> str:
    """How to get the project's Python: a conda environment updates in place; a .venv is made again."""
    if environment_kind() == "conda":
        return "conda env update -f environment.yml --prune, then conda activate it"
    if sys.platform == "win32":  # setup_env.bat makes .venv with `py -<version>` when that Python is installed
        return rf"install Python {want}, delete .venv, then scripts\setup_env.bat --venv"
    return f"delete .venv, then PYTHON=python{want} scripts/setup_env.sh --venv"


def torch_missing(config: Config) -> int:
    """What the doctor can say without torch: the machine, the one command that brings the right torch back, and
    whether the hosts it installs from answer (the likeliest reason a setup ended without torch)."""
    sources, unreachable = probe_sources(config.environment)
    machine = {
        "os": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "python": f"{platform.python_version()} ({sys.executable})",
    }
    fix = reinstall_command(config.environment)
    failure = Finding("FAIL", f"torch cannot be imported ({TORCH_FAILURE}); fix: {fix}")
    return report({**machine, **sources}, [failure, *unreachable])


def report(shown: dict[str, str], findings: list[Finding]) -> int:
    """The facts, a blank line, then one line per finding; 1 when any finding would stop training."""
    for name, value in shown.items():
        print(wrapped(f"{name:>10}: {value}", sys.stdout, indent=" " * 12))
    print()
    for finding in findings:
        print(wrapped(f"{finding.level:<4}  {finding.text}", sys.stdout, indent=" " * 6))
    return 1 if any(f.level == "FAIL" for f in findings) else 0


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
                f"fix: {python_fix(want_python)}",
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
    try:
        check_meeting_place(config)
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
                f"pip install --force-reinstall torch=={version}+{tag} {torch_source_option(wanted)} {index_url}"
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


def torch_source_option(wanted: dict) -> str:
    """How pip reads the torch wheel URL on its own: an index replaces PyPI, a flat page is --find-links."""
    return "--find-links" if wanted.get("torch_pip_option") == "--find-links" else "--index-url"


# -- where the project installs from ----------------------------------------------------------

HOST_TIMEOUT_S = 5.0
MIRROR_FIX = "copier update --defaults --data package_mirror=china"


def install_sources(wanted: dict) -> dict[str, str]:
    """The addresses requirements.txt and environment.yml install from (the answers' package_mirror)."""
    channel = wanted.get("conda_channel") or ""
    if channel and "://" not in channel:  # a channel name: conda's default host
        channel = f"https://conda.anaconda.org/{channel}"
    found = {"torch from": wanted.get("torch_index_url"), "pypi from": wanted.get("pypi_index_url")}
    return {label: url for label, url in {**found, "conda from": channel}.items() if url}


def probe(url: str, timeout: float = HOST_TIMEOUT_S) -> tuple[str | None, float]:
    """(None, seconds) when the host answers at all (any HTTP status counts), else (the reason, seconds)."""
    start = time.monotonic()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            pass
    except urllib.error.HTTPError:
        pass  # it answered: a mirror may refuse HEAD or list no page at the folder
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        return str(reason) or type(reason).__name__, time.monotonic() - start
    return None, time.monotonic() - start


def probe_sources(wanted: dict) -> tuple[dict[str, str], list[Finding]]:
    """Each install address and whether it answers within HOST_TIMEOUT_S; the fix when PyTorch's does not."""
    sources = install_sources(wanted)
    with ThreadPoolExecutor(max_workers=max(len(sources), 1)) as pool:
        pending = {label: pool.submit(probe, url) for label, url in sources.items()}
        results = {label: future.result() for label, future in pending.items()}
    lines, found = {}, []
    for label, url in sources.items():
        problem, seconds = results[label]
        lines[label] = f"{url} ({f'answers, {seconds:.2f} s' if problem is None else 'no answer: ' + problem})"
    problem = results.get("torch from", (None, 0.0))[0]
    if problem is not None:
        mirror = wanted.get("package_mirror", "official")
        fix = MIRROR_FIX if mirror == "official" else "copier update --defaults --data package_mirror=custom"
        found.append(
            Finding(
                "warn",
                f"the PyTorch wheels at {sources['torch from']} do not answer ({problem}); where that host is "
                f"slow or blocked, install from a mirror: {fix}, then run the setup script again",
            )
        )
    return lines, found


# -- torchvision / torchaudio against torch --------------------------------------------------


def companion_findings(wanted: dict) -> list[Finding]:
    """torchvision and torchaudio must be the release built for this torch, with its +tag."""
    found = []
    for name in ("torchvision", "torchaudio"):
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            have = None
        built_for = wanted.get(name) or ""
        want = f"{built_for}+{wanted.get('cuda')}" if built_for else ""
        chosen = name in wanted.get("extras", [])
        if have is None:
            if chosen:
                found.append(Finding("FAIL", f"{name} is not installed; fix: pip install -r requirements.txt"))
            continue
        if have == want:
            continue
        pin = f"{name}=={want}" if want else f"(none is built for torch {wanted.get('torch_version')})"
        fix = (
            "pip install -r requirements.txt"
            if chosen
            else (
                f"pip install {pin} {wanted.get('torch_pip_option')} {wanted.get('torch_index_url')}"
                if want
                else f"pip uninstall {name}"
            )
        )
        found.append(
            Finding(
                "FAIL",
                f"{name} {have} is installed, torch {wanted.get('torch_version')}+{wanted.get('cuda')} "
                f"needs {pin}; fix: {fix}",
            )
        )
    return found


# -- NVIDIA driver against the CUDA build ----------------------------------------------------


def driver_version() -> str | None:
    """The installed NVIDIA driver as nvidia-smi reports it; None without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.split()
    return lines[0] if done.returncode == 0 and lines else None


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def driver_findings(wanted: dict, installed: str | None) -> list[Finding]:
    """FAIL below the oldest driver that starts the project's CUDA build on this OS."""
    system = "windows" if sys.platform == "win32" else "linux"
    floor = wanted.get(f"driver_min_{system}")
    if not floor or installed is None or version_tuple(installed) >= version_tuple(floor):
        return []
    return [
        Finding(
            "FAIL",
            f"NVIDIA driver {installed} is older than {floor}, the oldest that starts {wanted.get('cuda')} builds "
            f"on {system}; fix: install a newer driver (https://www.nvidia.com/drivers)",
        )
    ]


def network(config: Config) -> dict[str, str]:
    """Where gloo's sockets will listen, and why: the rule training itself uses."""
    if config.backend != "gloo":
        return {}
    try:
        return {"gloo": gloo_binding(config)[1]}
    except LaunchError as error:
        return {"gloo": f"FAIL {error}"}


def smoke_check(config: Config) -> int:
    from .engine.smoke import main as smoke

    return smoke(config)


def main(argv: list[str] | None = None) -> int:
    escape_what_stdout_cannot_encode()
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="train a short real run on this machine's devices (about 20 steps, a checkpoint, a resume) and print "
        "PASS or FAIL for each step, with the fix",
    )
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
    if args.smoke:
        return smoke_check(config)
    wanted = config.environment
    sources, unreachable = probe_sources(wanted)
    driver = driver_version()
    installed = {"driver": driver or "none (no nvidia-smi)"}
    findings = compare(config) + companion_findings(wanted) + driver_findings(wanted, driver) + unreachable
    return report({**facts(), **installed, **network(config), **sources}, findings)


if __name__ == "__main__":
    sys.exit(main())
