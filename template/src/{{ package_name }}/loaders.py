"""Kept so that a Dataset written before the engine moved into engine/ still imports Batch from here.

New code imports it from the engine's public names: `from .engine import Batch`.
"""

from .engine import Batch
from .engine.loaders import map_tensors, samples_in, to_device

__all__ = ["Batch", "map_tensors", "samples_in", "to_device"]
