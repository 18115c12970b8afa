"""After `copier update`: name every file that still needs a decision, in one line.

    python scripts/find_conflicts.py        exit 0 when clean, 1 when something needs attention

copier update exits 0 even when it leaves conflict markers (default) or .rej files
(--conflict rej), so run this before committing the update.
"""

from __future__ import annotations

import sys
from pathlib import Path

MARKERS = ("<<<<<<< ", ">>>>>>> ")
SKIP = {".git", ".nox", ".venv", "outputs", "__pycache__"}


def needing_attention(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*")):
        if SKIP & set(path.relative_to(root).parts) or not path.is_file():
            continue
        if path.suffix == ".rej":
            found.append(f"{path.relative_to(root).as_posix()} (rejected hunk)")
            continue
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        if any(line.startswith(MARKERS) for line in lines):
            found.append(f"{path.relative_to(root).as_posix()} (conflict markers)")
    return found


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    found = needing_attention(root)
    if found:
        print(f"copier update left {len(found)} file(s) to resolve: {', '.join(found)}")
        return 1
    print("copier update left nothing to resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
