"""Distributed training of a toy model with PyTorch DDP, Windows first."""

__version__ = "0.1.0"
