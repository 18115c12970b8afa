"""The engine: the part of the training program that is the same for every recipe.

`copier update` replaces these files; your changes belong in recipe.py, model.py, data.py and configs/
(docs/make-it-your-own.md). A recipe or a Dataset imports only the names defined or imported here
(Config, Batch), which stay where they are across updates.
"""

from .config import PROJECT_ROOT, Config

PACKAGE = __package__.rpartition(".")[0]  # the project's package: python -m <PACKAGE>.train


class Batch(tuple):
    """A batch that a dataset's `__getitems__` already assembled, e.g. (inputs, targets); passed on as it is."""


__all__ = ["PACKAGE", "PROJECT_ROOT", "Batch", "Config"]
