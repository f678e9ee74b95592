"""Measurements a circuit returns: ``expval``, ``var``, ``probs``, ``sample``, ``counts``,
``state``, and the reduced ``density_matrix`` of some wires with its ``purity``.

>>> import qdiff as qd
>>> qd.expval(qd.Z(0)).kind
'expval'
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from qdiff.circuits import caches, memory, recording
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.midcircuit import MeasurementValue
from qdiff.circuits.observables import Observable, as_observable, one_term
from qdiff.circuits.operation import normalize_wires


@dataclass(frozen=True, eq=False)
class Measurement:
    """What to read off the final state. ``obs`` for expval/var/sample, ``wires`` for probs/sample."""

    kind: str
    obs: Optional[Observable] = None
    wires: Optional[tuple] = None
    all_outcomes: bool = False  # counts: every possible outcome, zero counts included
    integer: bool = False  # sample of a mid-circuit measurement value: int64 0/1 outcomes

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
        return Measurement(self.kind, obs, wires, self.all_outcomes, self.integer)

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
    for w in ws:
        try:
            hash(w)
        except TypeError:
            raise QdiffError(f"{kind}: wire {w!r} is not a wire label (an int or a hashable "
                             f"label); wires must be a flat sequence of labels") from None
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
    gives its 0/1 outcomes, int64 as PennyLane's) or bits of ``wires`` (``(..., shots, k)``),
    not both."""
    if op is not None and wires is not None:
        raise QdiffError("sample: give an observable (op) or wires, not both")
    if isinstance(op, (list, tuple)) and op and all(isinstance(m, MeasurementValue) for m in op):
        ws = tuple(w for m in op for w in m.probs_wires())
        return _record(Measurement("sample", None, _wires(ws, "sample")))
    if op is not None:
        return _record(Measurement("sample", _obs(op, "sample"),
                                   integer=isinstance(op, MeasurementValue)))
    return _record(Measurement("sample", None, _wires(wires, "sample")))


MAX_ALL_OUTCOMES_WIRES = 20  # all_outcomes=True lists 2**k bit strings


def counts(op=None, wires=None, all_outcomes: bool = False) -> Measurement:
    """Shot counts: of the bit strings of ``wires`` (all wires if None), a dict
    ``{'01': n, ...}``, or of the eigenvalues of ``op`` (one term), ``{-1.0: n, 1.0: m}``; a
    mid-circuit measurement value counts its 0/1 values (int keys, as its samples), a list of
    them their bits. One dict per binding (a list for a batch). ``all_outcomes=True`` lists
    every possible outcome, zero counts included (at most 2**20 bit strings)."""
    if not isinstance(all_outcomes, bool):
        raise QdiffError(f"counts: all_outcomes must be True or False; got {all_outcomes!r}")
    if op is not None and wires is not None:
        raise QdiffError("counts: give an observable (op) or wires, not both")
    if isinstance(op, (list, tuple)):
        if not op or not all(isinstance(m, MeasurementValue) for m in op):
            raise QdiffError("counts(op=[...]) takes mid-circuit measurement values")
        ws = tuple(w for m in op for w in m.probs_wires())
        m = Measurement("counts", None, _wires(ws, "counts"), all_outcomes)
    elif op is not None:
        m = Measurement("counts", one_term(_obs(op, "counts"), "counts(op)", shared=False), None,
                        all_outcomes, integer=isinstance(op, MeasurementValue))
    else:
        m = Measurement("counts", None, _wires(wires, "counts"), all_outcomes)
    if all_outcomes and m.wires is not None and len(m.wires) > MAX_ALL_OUTCOMES_WIRES:
        raise QdiffError(f"counts(all_outcomes=True) of {len(m.wires)} wires would list "
                         f"2**{len(m.wires)} outcomes; at most {MAX_ALL_OUTCOMES_WIRES} wires")
    return _record(m)


def outcome_key(value: float, scale: float = 1.0) -> float:
    """The dict key of a counted eigenvalue (no negative zero), rounded so that equal
    eigenvalues computed in different ways count together: to 12 decimals, or for an
    observable whose eigenvalues are all smaller (``scale``: the largest magnitude, below
    0.1) to about 12 significant digits of that scale (``1e-13 * Z(0)`` keeps its two
    outcomes)."""
    digits = 12
    if 0 < scale < 0.1:
        digits += -math.floor(math.log10(scale)) - 1
    return round(float(value), digits) + 0.0


def outcome_values(obs: Observable) -> list:
    """Every eigenvalue a one-term observable can show, each once (sorted :func:`outcome_key`
    values): the products of its factors' eigenvalues, times its coefficient. Products that
    agree to the eigensolver's precision (1e-9, relative) are one eigenvalue."""
    import numpy as np
    (term,) = obs.terms
    vals = np.ones(1)
    for f in term:
        eig = np.array([1.0, -1.0]) if f.matrix is None else \
            np.linalg.eigvalsh(f.matrix.detach().cpu().numpy())
        vals = np.outer(vals, eig).reshape(-1)
    vals = np.sort(float(obs.real_coeffs()[0]) * vals)
    scale = float(np.abs(vals).max())
    tol = 1e-9 * scale  # relative: the eigensolver's error scales with the matrix
    keep = [vals[0]]
    for v in vals[1:]:
        if v - keep[-1] > tol:
            keep.append(v)
    return sorted({outcome_key(v, scale) for v in keep})


def nearest_outcomes(values, outcomes: list) -> list:
    """Each sampled eigenvalue in ``values`` as the nearest of ``outcomes`` (the sorted keys
    of :func:`outcome_values`): the dict key it counts under, whatever the precision it was
    computed in."""
    import numpy as np
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    ref = np.asarray(outcomes, dtype=np.float64)
    if len(ref) == 1:
        return [outcomes[0]] * len(x)
    i = np.clip(np.searchsorted(ref, x), 1, len(ref) - 1)
    pick = np.where(np.abs(x - ref[i - 1]) <= np.abs(ref[i] - x), i - 1, i)
    return [outcomes[j] for j in pick.tolist()]


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


_MULTINOMIAL_MAX = 2 ** 24  # torch.multinomial's limit on the number of categories


def sample_indices(p: torch.Tensor, shots: int, generator, words: int = 3) -> torch.Tensor:
    """``(B, shots)`` basis indices drawn from probabilities ``p`` ``(B, 2**k)``.

    ``words``: 8-byte values per shot the caller builds from the indices (checked against
    the memory budget with the indices themselves before anything is drawn). Above 2**24
    outcomes, inverse-CDF sampling replaces ``torch.multinomial``, which refuses them."""
    b, d = p.shape
    memory.require(8.0 * b * (shots * words + 2 * d), f"sampling {shots} shots of {b} "
                   f"distribution(s) over {d} outcomes", p.device)
    p = p.clamp_min(0).to(torch.float64)
    p = p / p.sum(-1, keepdim=True)
    if d <= _MULTINOMIAL_MAX:
        with caches.outside_legacy_vmap():
            return torch.multinomial(p, shots, replacement=True, generator=generator)
    cdf = torch.cumsum(p, -1)
    with caches.outside_legacy_vmap():
        u = torch.rand(b, shots, dtype=torch.float64, device=p.device, generator=generator)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_max_(d - 1)
