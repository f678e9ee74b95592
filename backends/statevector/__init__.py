"""The statevector engine: batched torch statevector simulation with native CPU kernels.

Behind the Backend protocol (:mod:`qdiff.backends.base`) only; everything else in this package
(kernels, gate data, the native program encoder and ``qdsim.c``, measurements, the adjoint
sweep) is the engine's own. ``ENGINE.md`` beside this file describes how a circuit becomes a
native program and how the adjoint sweep works.
"""
from qdiff.backends.statevector.engine import StatevectorBackend

__all__ = ["StatevectorBackend"]
