"""Small helpers the passes share: gate classification, constant matrices, counts.

A *constant* operation has only float angles; a *parametric* one has at least one
:class:`~qdiff.circuits.operation.ParamRef` and is never folded into a matrix.
"""
from __future__ import annotations

import math

import numpy as np

from qdiff.circuits import caches
from qdiff.circuits.gates import GATES
from qdiff.circuits.operation import Operation, ParamRef
from qdiff.compiler.budget import EXACT_DELTA, phase_distance

TWO_PI = 2.0 * math.pi


def is_constant(op: Operation) -> bool:
    return not any(isinstance(p, ParamRef) for p in op.params)


def wire_type(op: Operation, wire: int) -> str:
    """'z', 'x' or '' (neither) for ``op`` on ``wire``: the gate record's commutation class
    (a Z-type gate commutes through a CX control, an X-type one through a CX target)."""
    axes = getattr(op.gate, "wire_axes", ())
    return axes[op.wires.index(wire)] if len(axes) == len(op.wires) else ""


def commute(a: Operation, b: Operation) -> bool:
    """True when ``a`` and ``b`` provably commute (disjoint, or matching type on shared wires)."""
    shared = set(a.wires) & set(b.wires)
    for w in shared:
        ta = wire_type(a, w)
        if not ta or ta != wire_type(b, w):
            return False
    return True


@caches.cached(maxsize=65536)
def const_matrix(gate, params: tuple) -> np.ndarray:
    m = gate.matrix(*params)
    return np.asarray(m.detach().numpy() if hasattr(m, "detach") else m, dtype=complex)


def matrix(op: Operation) -> np.ndarray:
    """The ``(2**k, 2**k)`` matrix of a constant op (wire order = ``op.wires``)."""
    return const_matrix(op.gate, tuple(float(p) for p in op.params))


def cx_count(ops) -> int:
    """Two-qubit gate count (what the compiler minimizes)."""
    return sum(1 for op in ops if len(op.wires) >= 2)


def t_count(ops) -> int:
    """Non-Clifford phase gates (``t``/``tdg``) -- the cost measure of fault-tolerant circuits."""
    return sum(1 for op in ops if op.name in ("t", "tdg"))


def depth(ops, num_wires: int) -> int:
    level = [0] * max(num_wires, 1)
    for op in ops:
        d = 1 + max(level[w] for w in op.wires)
        for w in op.wires:
            level[w] = d
    return max(level) if ops else 0


def op(name: str, wires, params=()) -> Operation:
    return Operation(GATES[name], tuple(wires), tuple(params))


def wrap_angle(a: float) -> float:
    """Angle in (-pi, pi]."""
    a = math.fmod(a, TWO_PI)
    if a <= -math.pi:
        a += TWO_PI
    elif a > math.pi:
        a -= TWO_PI
    return a


def is_zero_angle(p, period: float = TWO_PI, tol: float = 1e-12) -> bool:
    if isinstance(p, ParamRef):
        return p.scale == 0.0 and is_zero_angle(p.offset, period, tol)
    r = math.fmod(float(p), period)
    return min(abs(r), abs(abs(r) - period)) < tol


def add_angles(a, b):
    """Sum of two angles (floats or ParamRefs on one column); None when not affine."""
    if isinstance(a, ParamRef) and isinstance(b, ParamRef):
        if a.index != b.index:
            return None
        return ParamRef(a.index, a.scale + b.scale, a.offset + b.offset)
    if isinstance(a, ParamRef):
        return a + float(b)
    if isinstance(b, ParamRef):
        return b + float(a)
    return float(a) + float(b)


def is_identity_up_to_phase(u: np.ndarray, tol: float = EXACT_DELTA) -> bool:
    """True when ``u`` is the identity up to phase to ``tol`` in phase-aligned distance (a
    rotation by ``a`` is at distance ``|a| / 2``: only rounding residues count as identity)."""
    if u.shape == (2, 2):  # quick rejection, implied by the distance bound: an entry of
        # u - e^{i phi} I is at most sqrt(2) tol, so |u01|, |u10| <= 1.5 tol, |u00 - u11| <= 2 tol
        if abs(u[0, 1]) > 1.5 * tol or abs(u[1, 0]) > 1.5 * tol or \
                abs(u[0, 0] - u[1, 1]) > 2.5 * tol:
            return False
    return phase_distance(u, np.eye(u.shape[0], dtype=complex)) <= tol


class single_thread:
    """Run torch on one thread: the fits use thousands of tiny tensors and the checks
    mid-sized ones, for which the thread pool costs far more than it gains on a busy machine
    (measured 8x slower for a 15-qubit check with 2 busy cores)."""

    def __enter__(self):
        import torch
        self._n = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        import torch
        torch.set_num_threads(self._n)
        return False
