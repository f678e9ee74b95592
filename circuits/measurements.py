"""Measurements a circuit returns: ``expval``, ``var``, ``probs``, ``sample``, ``counts``,
``state``, and the reduced ``density_matrix`` of some wires with its ``purity``.

>>> import qdiff as qd
>>> qd.expval(qd.Z(0)).kind
'expval'
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from qdiff.circuits import recording
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.midcircuit import MeasurementValue
from qdiff.circuits.observables import Observable, as_observable
from qdiff.circuits.operation import normalize_wires


@dataclass(frozen=True, eq=False)
class Measurement:
    """What to read off the final state. ``obs`` for expval/var/sample, ``wires`` for probs/sample."""

    kind: str
    obs: Optional[Observable] = None
    wires: Optional[tuple] = None

    @property
    def is_scalar(self) -> bool:
        """One real number per binding (expval, var)."""
        return self.kind in ("expval", "var")

    def map_wires(self, mapping: dict) -> "Measurement":
        obs = self.obs.map_wires(mapping) if self.obs is not None else None
        wires = None
        if self.wires is not None:
            try:
                wires = tuple(mapping[w] for w in self.wires)
            except KeyError as e:
                raise QdiffError(f"{self.kind}: wire {e.args[0]!r} is not on the device "
                                 f"(device wires: {list(mapping)})") from None
        return Measurement(self.kind, obs, wires)

    def __repr__(self):
        inner = repr(self.obs) if self.obs is not None else (
            f"wires={list(self.wires)}" if self.wires is not None else "")
        return f"{self.kind}({inner})"


def _record(m: Measurement) -> Measurement:
    rec = recording.active()
    if rec is not None:
        rec.append(m)
    return m


def _obs(op, kind) -> Observable:
    if isinstance(op, MeasurementValue):  # a mid-circuit outcome: its 0/1 projector
        return op.observable()
    obs = as_observable(op)
    if obs._key is None:  # a Pauli word built from a gate is Hermitian by construction
        obs.check_hermitian()
    return obs


def _wires(wires, kind: str):
    """``None`` (all wires) or the tuple of ``wires``, each at most once."""
    if wires is None:
        return None
    if isinstance(wires, bool):
        raise QdiffError(f"{kind}: wires must be an int, a label or a sequence; got {wires!r}")
    ws = normalize_wires(wires)
    if len(set(ws)) != len(ws):
        raise QdiffError(f"{kind}: repeated wire in {list(ws)}")
    return ws


def expval(op) -> Measurement:
    """Expectation value of an observable: one real number per binding."""
    return _record(Measurement("expval", _obs(op, "expval")))


def var(op) -> Measurement:
    """Variance of an observable."""
    return _record(Measurement("var", _obs(op, "var")))


def probs(wires=None, op=None) -> Measurement:
    """Computational-basis probabilities of ``wires`` (all wires if None): ``(..., 2**k)``;
    ``op=m`` (or ``[m0, m1]``) gives those of mid-circuit measurement outcomes."""
    if op is not None:
        ms = list(op) if isinstance(op, (list, tuple)) else [op]
        if wires is not None or not ms or not all(isinstance(m, MeasurementValue) for m in ms):
            raise QdiffError("probs(op=...) takes mid-circuit measurement values (m = "
                             "qd.measure(w)); for an observable rotate the basis with gates "
                             "and use probs(wires)")
        ws = tuple(w for m in ms for w in m.probs_wires())
        return _record(Measurement("probs", None, _wires(ws, "probs")))
    return _record(Measurement("probs", None, _wires(wires, "probs")))


def sample(op=None, wires=None) -> Measurement:
    """Shot samples: eigenvalues of ``op`` (``(..., shots)``; a mid-circuit measurement value
    gives its 0/1 outcomes) or bits of ``wires`` (``(..., shots, k)``)."""
    if isinstance(op, (list, tuple)) and op and all(isinstance(m, MeasurementValue) for m in op):
        ws = tuple(w for m in op for w in m.probs_wires())
        return _record(Measurement("sample", None, _wires(ws, "sample")))
    if op is not None:
        return _record(Measurement("sample", _obs(op, "sample")))
    return _record(Measurement("sample", None, _wires(wires, "sample")))


def counts(wires=None) -> Measurement:
    """Shot counts of bit strings of ``wires``: a dict ``{'01': n, ...}`` (unbatched only)."""
    return _record(Measurement("counts", None, _wires(wires, "counts")))


def state() -> Measurement:
    """The final state vector, ``(..., 2**n)`` complex."""
    return _record(Measurement("state"))


def density_matrix(wires) -> Measurement:
    """The reduced density matrix of ``wires`` (the rest traced out): ``(..., 2**k, 2**k)``
    complex, indexed in the order of ``wires``."""
    ws = _wires(wires, "density_matrix")
    if ws is None or not ws:
        raise QdiffError("density_matrix: give the wires to keep (wires=...)")
    return _record(Measurement("density_matrix", None, ws))


def purity(wires) -> Measurement:
    """``Tr(rho_W**2)`` of the reduced state of ``wires``: one real number per binding."""
    ws = _wires(wires, "purity")
    if ws is None or not ws:
        raise QdiffError("purity: give the wires whose reduced state to measure (wires=...)")
    return _record(Measurement("purity", None, ws))
