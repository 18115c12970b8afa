"""Kept so that a recipe written before the engine moved into engine/ still imports Config from here.

New code imports it from the engine's public names: `from .engine import Config`.
"""

from .engine.config import Config

__all__ = ["Config"]
