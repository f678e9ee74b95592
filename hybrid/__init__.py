"""Torch modules built on qnodes: :class:`QuantumLayer`."""
from qdiff.hybrid.layer import QuantumLayer

__all__ = ["QuantumLayer"]
