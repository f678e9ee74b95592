"""The mixed-state engine: batched density-matrix simulation in torch with noise channels.

Behind the Backend protocol (:mod:`qdiff.backends.base`) only: ``qd.device("mixed", wires=n,
noise=...)``. Gates and channels are fused into superoperators of one or two wires
(:mod:`qdiff.backends.mixed.superops`); gradients of gate angles and channel parameters come
from the engine's own reverse mode (:mod:`qdiff.backends.mixed.reverse`, the Backend
protocol's ``vjp``) or from torch backpropagation through the simulation.
"""
from qdiff.backends.mixed.engine import MixedBackend

__all__ = ["MixedBackend"]
