"""Read PyTorch's wheel index and compare it with copier.yml's support matrix: nox -s matrix

For each CUDA tag (and cpu) it reads the PEP 503 pages of torch, torchvision and torchaudio under
<index>/<tag>/, and from the wheel file names learns which torch releases exist, for which CPython
versions and operating systems, and which companion releases are built with the same tag. It prints
the support-matrix rows it found, then every difference from copier.yml, and exits 1 when there is one.

    python tools/matrix.py                                    the live index, every series of copier.yml
    python tools/matrix.py --index tests/data/index --series 2.13 2.14   saved pages (the tests use these)

<index> is a URL or a folder holding <tag>/<project>/index.html, as a saved copy of the index does.
"""

from __future__ import annotations

import argparse
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
OFFICIAL_INDEX = "https://download.pytorch.org/whl"
PROJECTS = ("torch", "torchvision", "torchaudio")
# Tags to look for beyond those copier.yml already names, so that a new one is noticed.
CANDIDATE_TAGS = ("cu118", "cu121", "cu124", "cu126", "cu128", "cu129", "cu130", "cu132", "cu134")
WHEEL = re.compile(
    r"^(?P<project>[A-Za-z0-9_]+)-(?P<version>[0-9.]+)(?:\+(?P<tag>[a-z0-9]+))?-(?P<python>[a-z0-9_]+)-"
    r"(?P<abi>[a-z0-9_]+)-(?P<platform>[A-Za-z0-9_.]+)\.whl$"
)


def read_page(index: str, tag: str, project: str) -> str | None:
    """The HTML of <index>/<tag>/<project>/, or None when there is no such page (404, no file)."""
    if "://" not in index:
        page = Path(index) / tag / project / "index.html"
        return page.read_text(encoding="utf-8") if page.is_file() else None
    try:
        with urllib.request.urlopen(f"{index.rstrip('/')}/{tag}/{project}/", timeout=60) as response:
            return response.read().decode("utf-8")
    except urllib.error.HTTPError as error:
        if error.code in (403, 404):
            return None
        raise


def wheel_names(html: str) -> list[str]:
    return [urllib.parse.unquote(href.split("#")[0].rsplit("/", 1)[-1]) for href in re.findall(r'href="([^"]+)"', html)]


def python_of(tag: str) -> str | None:
    """cp311 -> 3.11; cp313t (free-threaded) and py3 wheels say nothing about the CPython range."""
    found = re.fullmatch(r"cp3(\d+)", tag)
    return f"3.{found.group(1)}" if found else None


def os_of(platform: str) -> str | None:
    if platform.startswith("win_amd64"):
        return "windows"
    if "linux" in platform and "x86_64" in platform:
        return "linux"
    return None


@dataclass
class Series:
    tags: set[str] = field(default_factory=set)  # CUDA tags with both a Windows and a Linux wheel
    linux_only_tags: set[str] = field(default_factory=set)
    python: set[str] = field(default_factory=set)
    releases: set[str] = field(default_factory=set)
    companions: dict[str, dict[str, set[str]]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(set)))


def version_key(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def read_index(index: str, tags: list[str]) -> dict[str, Series]:
    """series -> what the index holds for it."""
    found: dict[str, Series] = defaultdict(Series)
    systems: dict[tuple[str, str], set[str]] = defaultdict(set)  # (series, tag) -> OSes with a torch wheel
    for tag in ["cpu", *tags]:
        for project in PROJECTS:
            html = read_page(index, tag, project)
            if html is None:
                continue
            for name in wheel_names(html):
                wheel = WHEEL.match(name)
                if not wheel or wheel["tag"] != tag:
                    continue
                system = os_of(wheel["platform"])
                if project == "torch":
                    series = ".".join(wheel["version"].split(".")[:2])
                    found[series].releases.add(wheel["version"])
                    if system:
                        systems[(series, tag)].add(system)
                    python = python_of(wheel["python"])
                    if python and tag == "cpu":
                        found[series].python.add(python)
                else:
                    found["companions"].companions[project][tag].add(wheel["version"])
    for (series, tag), oses in systems.items():
        if tag == "cpu":
            continue
        (found[series].tags if oses == {"windows", "linux"} else found[series].linux_only_tags).add(tag)
    return found


def differences(found: dict[str, Series], config: dict, only: list[str] | None) -> list[str]:
    matrix = yaml.safe_load(config["support_matrix"]["default"])
    releases = yaml.safe_load(config["torch_releases"]["default"])
    problems = []
    series_on_index = sorted((s for s in found if s != "companions"), key=version_key)
    for series in only or sorted(set(series_on_index) | set(matrix), key=version_key):
        row, seen = matrix.get(series), found.get(series)
        if seen is None or not seen.releases:
            if row is not None and row.get("index") is not False:
                problems.append(f"{series}: copier.yml lists it, the index has no torch wheels of it")
            continue
        if row is None:
            problems.append(f"{series}: on the index ({', '.join(sorted(seen.releases, key=version_key))}), "
                            "not in copier.yml's support_matrix")  # fmt: skip
            continue
        if row.get("index") is False:
            problems.append(f"{series}: on the index now, copier.yml says index: false")
        listed = set(row["tags"]) | set(row["experimental"])
        if listed != seen.tags | seen.linux_only_tags:
            problems.append(f"{series}: tags on the index {sorted(seen.tags | seen.linux_only_tags)}, "
                            f"copier.yml {sorted(listed)}")  # fmt: skip
        if seen.python and set(row["python"]) != seen.python:
            problems.append(f"{series}: CPython on the index {sorted(seen.python, key=version_key)}, "
                            f"copier.yml {row['python']}")  # fmt: skip
        known = {release for release in releases if release.startswith(series + ".")}
        if seen.releases - known:
            problems.append(f"{series}: releases on the index not in torch_releases: "
                            f"{sorted(seen.releases - known, key=version_key)}")  # fmt: skip
        companions = found["companions"].companions if "companions" in found else {}
        for release in sorted(seen.releases & known, key=version_key):
            for project, version in releases[release].items():
                if version not in companions.get(project, {}).get("cpu", set()):
                    problems.append(f"{release}: torch_releases pins {project} {version}, no {version}+cpu wheel")
    return problems


def rows(found: dict[str, Series], only: list[str] | None) -> list[str]:
    lines = []
    for series in sorted((s for s in found if s != "companions"), key=version_key):
        if only and series not in only:
            continue
        seen = found[series]
        python = ", ".join(f'"{p}"' for p in sorted(seen.python, key=version_key))
        linux_only = f", linux only: [{', '.join(sorted(seen.linux_only_tags))}]" if seen.linux_only_tags else ""
        lines.append(f'"{series}": {{tags: [{", ".join(sorted(seen.tags))}]{linux_only}, python: [{python}], '
                     f"releases: [{', '.join(sorted(seen.releases, key=version_key))}]}}")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/matrix.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--index", default=OFFICIAL_INDEX, help=f"URL or folder of saved pages (default {OFFICIAL_INDEX})"
    )
    parser.add_argument("--series", nargs="*", help="compare only these series (default: all)")
    parser.add_argument("--copier-yml", type=Path, default=ROOT / "copier.yml")
    args = parser.parse_args(argv)
    config = yaml.safe_load(args.copier_yml.read_text(encoding="utf-8"))
    matrix = yaml.safe_load(config["support_matrix"]["default"])
    tags = sorted({t for row in matrix.values() for t in row["tags"] + row["experimental"]} | set(CANDIDATE_TAGS))
    found = read_index(args.index, tags)
    print("# support matrix as the index has it (tags: Windows and Linux wheels both)")
    for line in rows(found, args.series):
        print(line)
    problems = differences(found, config, args.series)
    print(f"\n# differences from {args.copier_yml.name}: {len(problems)}")
    for problem in problems:
        print(f"- {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
