"""The engine: the part of the training program that is the same for every recipe.

`copier update` replaces these files; your changes belong in recipe.py, model.py, data.py and configs/
(docs/make-it-your-own.md). A recipe or a Dataset imports only the names defined or imported here
(Config, Batch), which stay where they are across updates.
"""

from pathlib import Path

PACKAGE = __package__.rpartition(".")[0]  # the project's package: python -m <PACKAGE>.train
PROJECT_ROOT = Path(__file__).resolve().parents[3]  # src/<package>/engine/ -> the folder with configs/


class Batch(tuple):
    """A batch that a dataset's `__getitems__` already assembled, e.g. (inputs, targets); passed on as it is."""


__all__ = ["PACKAGE", "PROJECT_ROOT", "Batch", "Config"]


def __getattr__(name: str):
    """Config on first use, not at import: config.py imports PROJECT_ROOT from here."""
    if name == "Config":
        from .config import Config

        return Config
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
