"""The Backend protocol every executor implements, and the device registry.

A backend runs a :class:`~qdiff.circuits.Circuit` for ``B`` parameter bindings at once:
``execute(circuit, theta)`` returns one tensor per measurement, each with leading dim ``B``.
``execute_many(jobs)`` runs several (circuit, theta) jobs — on hardware, as one job.

>>> import qdiff as qd
>>> qd.device("statevector", wires=2).capabilities.backprop
True
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Optional

import torch

from qdiff.circuits.errors import QdiffError


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do; ``diff_method="best"`` reads this."""

    backprop: bool = False   # torch autograd flows through execute()
    adjoint: bool = False    # exposes final states for the adjoint method
    shots: bool = True       # supports finite shots
    exact: bool = True       # supports shots=None (exact expectations)


def normalize_device_wires(wires) -> tuple:
    if isinstance(wires, numbers.Integral):
        if wires < 1:
            raise QdiffError(f"a device needs at least one wire; got wires={wires}")
        return tuple(range(int(wires)))
    try:
        labels = tuple(wires)
    except TypeError:
        raise QdiffError(f"wires must be an int or a sequence of labels; got {wires!r}") from None
    if len(set(labels)) != len(labels):
        raise QdiffError(f"device wires contain duplicates: {list(labels)}")
    if not labels:
        raise QdiffError("a device needs at least one wire")
    return labels


class Backend:
    """Base class: holds wires, shots and the seeded generator."""

    name = "backend"
    capabilities = Capabilities()

    def __init__(self, wires, shots: Optional[int] = None, seed: Optional[int] = None):
        self.wires = normalize_device_wires(wires)
        if shots is not None and (not isinstance(shots, numbers.Integral) or shots < 1):
            raise QdiffError(f"shots must be a positive integer or None; got {shots!r}")
        if shots is None and not self.capabilities.exact:
            raise QdiffError(f"backend '{self.name}' needs shots")
        if shots is not None and not self.capabilities.shots:
            raise QdiffError(f"backend '{self.name}' does not support shots")
        self.shots = None if shots is None else int(shots)
        self.seed = seed

    @property
    def num_wires(self) -> int:
        return len(self.wires)

    def execute(self, circuit, theta: torch.Tensor, initial_state=None) -> list:
        raise NotImplementedError  # abstract: every backend defines it

    def execute_many(self, jobs) -> list:
        """``[(circuit, theta), ...] -> [[tensor per measurement], ...]``."""
        return [self.execute(c, t) for c, t in jobs]

    def __repr__(self):
        shots = f", shots={self.shots}" if self.shots else ""
        return f"<{type(self).__name__} wires={self.num_wires}{shots}>"


_REGISTRY: dict = {}


def register_backend(*names):
    def deco(factory):
        for n in names:
            _REGISTRY[n] = factory
        return factory
    return deco


def device(name: str = "statevector", wires=None, **kwargs) -> Backend:
    """Create a backend by name: ``"statevector"`` (default), ``"aer"``, ``"ibm"``, ``"pennylane"``.

    >>> import qdiff as qd
    >>> qd.device("statevector", wires=3)
    <StatevectorBackend wires=3>
    """
    from qdiff.backends import statevector  # noqa: F401  (registers the default)
    if wires is None:
        raise QdiffError("device(...) needs wires=")
    key = name.lower()
    if key not in _REGISTRY:
        raise QdiffError(f"unknown device '{name}'; available: {sorted(_REGISTRY)}")
    return _REGISTRY[key](wires=wires, **kwargs)
