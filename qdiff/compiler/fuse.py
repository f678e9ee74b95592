"""Pass: fuse each run of constant one-qubit gates on a wire into one canonical gate.

The fused 2x2 becomes nothing (identity), ``rz`` (diagonal: commutes through CX controls),
``rx`` (commutes through CX targets) or ``u3``. Parametric gates end a run.

>>> from qdiff.circuits import Circuit
>>> from qdiff.compiler.ops import op
>>> [o.name for o in fuse_1q(Circuit(1, (op("h", (0,)), op("z", (0,)), op("h", (0,))))).operations]
['rx']
"""
from __future__ import annotations

import cmath
import math

import numpy as np

from qdiff.compiler.ops import is_constant, matrix, op, wrap_angle

EPS = 1e-12


def fuse_1q(circuit):
    """Circuit -> Circuit with at most one constant one-qubit gate between other gates."""
    out: list = []
    pending: dict = {}

    def flush(w):
        u = pending.pop(w, None)
        if u is not None:
            out.extend(canonical_1q(u, w))

    for o in circuit.operations:
        if len(o.wires) == 1 and is_constant(o):
            w = o.wires[0]
            pending[w] = matrix(o) @ pending[w] if w in pending else matrix(o)
            continue
        for w in o.wires:
            flush(w)
        out.append(o)
    for w in sorted(pending):
        flush(w)
    return circuit.with_operations(out)


def canonical_1q(u: np.ndarray, wire: int) -> list:
    """Ops for the 2x2 unitary ``u`` on ``wire`` (up to global phase)."""
    if abs(u[0, 1]) < EPS and abs(u[1, 0]) < EPS:
        lam = wrap_angle(cmath.phase(u[1, 1]) - cmath.phase(u[0, 0]))
        return [] if abs(lam) < EPS else [op("rz", (wire,), (lam,))]
    if abs(u[0, 0] - u[1, 1]) < EPS and abs(u[0, 1] - u[1, 0]) < EPS:
        a, b = u[0, 0], u[0, 1]
        g = a / abs(a) if abs(a) > 1e-6 else 1j * b / abs(b)
        th = 2.0 * math.atan2((1j * b / g).real, (a / g).real)
        return [op("rx", (wire,), (wrap_angle(th),))]
    return [op("u3", (wire,), u3_angles(u))]


def u3_angles(u: np.ndarray) -> tuple:
    """``(theta, phi, lam)`` with ``u = e^{i g} U3(theta, phi, lam)``."""
    det = np.linalg.det(u)
    su = u / np.sqrt(det)
    th = 2.0 * math.atan2(abs(su[1, 0]), abs(su[0, 0]))
    ph_plus = 2.0 * cmath.phase(su[1, 1]) if abs(su[1, 1]) > EPS else 0.0
    ph_minus = 2.0 * cmath.phase(su[1, 0]) if abs(su[1, 0]) > EPS else 0.0
    phi, lam = (ph_plus + ph_minus) / 2.0, (ph_plus - ph_minus) / 2.0
    return (th, wrap_angle(phi), wrap_angle(lam))
