"""The Backend protocol every executor implements, and the device registry.

A backend runs a :class:`~qdiff.circuits.Circuit` for ``B`` parameter bindings at once:
``execute(circuit, theta)`` returns one tensor per measurement, each with leading dim ``B``.
``execute_many(jobs)`` runs several (circuit, theta) jobs — on hardware, as one job.

>>> import qdiff as qd
>>> qd.device("statevector", wires=2).capabilities.backprop
True
"""
from __future__ import annotations

import abc

import importlib
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
    device_vjp: bool = False  # vjp(circuit, theta, cotangent) by the device's own adjoint method


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


class Backend(abc.ABC):
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

    @abc.abstractmethod
    def execute(self, circuit, theta: torch.Tensor, initial_state=None) -> list:
        """One tensor per measurement of ``circuit``, each with leading dim ``B``."""

    def execute_many(self, jobs) -> list:
        """``[(circuit, theta), ...] -> [[tensor per measurement], ...]``."""
        return [self.execute(c, t) for c, t in jobs]

    def __repr__(self):
        shots = f", shots={self.shots}" if self.shots else ""
        return f"<{type(self).__name__} wires={self.num_wires}{shots}>"


_REGISTRY: dict = {}
# backends whose modules import heavy toolkits: imported on first use by device()
_LAZY = {"aer": "qdiff.backends.aer", "qiskit.aer": "qdiff.backends.aer",
         "aer_simulator": "qdiff.backends.aer", "ibm": "qdiff.backends.ibm",
         "qiskit.ibm": "qdiff.backends.ibm", "ibm_runtime": "qdiff.backends.ibm",
         "pennylane": "qdiff.backends.pennylane_device", "pl": "qdiff.backends.pennylane_device"}


def register_backend(*names):
    def deco(factory):
        for n in names:
            _REGISTRY[n] = factory
        return factory
    return deco


def device(name: str = "statevector", /, wires=None, **kwargs) -> Backend:
    """Create a backend by name: ``"statevector"`` (default), ``"aer"``, ``"ibm"``, ``"pennylane"``.

    ``name`` is positional-only, so backends may take a ``name=`` option of their own
    (``qd.device("pennylane", name="lightning.qubit", wires=4)``).

    >>> import qdiff as qd
    >>> qd.device("statevector", wires=3)
    <StatevectorBackend wires=3>
    """
    from qdiff.backends import statevector  # noqa: F401  (registers the default)
    if wires is None:
        raise QdiffError("device(...) needs wires=")
    key = name.lower()
    if key not in _REGISTRY and key in _LAZY:
        importlib.import_module(_LAZY[key])  # registers it; qiskit/pennylane load only now
    if key not in _REGISTRY:
        names = sorted(set(_REGISTRY) | set(_LAZY))
        raise QdiffError(f"unknown device '{name}'; available: {names}")
    return _REGISTRY[key](wires=wires, **kwargs)


def available(kind: Optional[str] = None):
    """What ``qd.device`` can create.

    ``available()`` -> ``{"devices": [...], "ibm": [fake backend names], "pennylane": [...]}``;
    ``available("devices" | "ibm" | "pennylane")`` -> that list. IBM names are the fake
    backends qiskit-ibm-runtime ships (``fake_manila``, ``fake_sherbrooke``, ...); real
    device names depend on the account and are not listed (``service.backends()``).
    """
    kinds = ("devices", "ibm", "pennylane")
    if kind is not None and kind not in kinds:
        raise QdiffError(f"available(kind) takes one of {list(kinds)}; got {kind!r}")
    out = {}
    if kind in (None, "devices"):
        from qdiff.backends import statevector  # noqa: F401
        out["devices"] = sorted(set(_REGISTRY) | set(_LAZY))
    if kind in (None, "ibm"):
        from qdiff.backends.ibm import fake_backend_names
        out["ibm"] = fake_backend_names()
    if kind in (None, "pennylane"):
        from qdiff.backends.pennylane_device import pennylane_device_names
        out["pennylane"] = pennylane_device_names()
    return out if kind is None else out[kind]
