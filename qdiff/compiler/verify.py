"""Equivalence checking up to global phase: full unitaries for small circuits, random states above.

``equivalence(a, b)`` applies ``a`` and then ``b``'s inverse to a batch of states (the identity
matrix for a unitary check, Haar-random states otherwise) and measures how far the result is
from a multiple of the input. Parametric circuits are checked at random bindings of theta.

>>> from qdiff.circuits import Circuit
>>> from qdiff.compiler.ops import op
>>> a = Circuit(1, (op("h", (0,)), op("h", (0,))))
>>> equivalence(a, Circuit(1, ())).ok
True
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qdiff.circuits.errors import QdiffError, QdiffMemoryError
from qdiff.circuits.memory import require
from qdiff.circuits.operation import Operation, ParamRef
from qdiff.compiler.ops import matrix

TOL = 1e-7  # on 1 - fidelity; a real mistake is O(1), accumulated rounding is ~1e-12
UNITARY_BUDGET = 2e8  # 4**n * gates above which 'auto' switches to random states


@dataclass(frozen=True)
class Verdict:
    ok: bool
    method: str  # 'unitary' | 'statevector' | 'none'
    infidelity: float


def bind(ops, theta: np.ndarray) -> list:
    """Replace every ParamRef by its value at ``theta`` ``(P,)``."""
    out = []
    for o in ops:
        if any(isinstance(p, ParamRef) for p in o.params):
            ps = tuple(p.scale * float(theta[p.index]) + p.offset if isinstance(p, ParamRef)
                       else p for p in o.params)
            o = Operation(o.gate, o.wires, ps)
        out.append(o)
    return out


def fused(ops) -> list:
    """``[(matrix, wires)]`` with one-qubit runs folded into the neighbouring gates."""
    pending: dict = {}
    out = []
    for o in ops:
        m = matrix(o)
        if len(o.wires) == 1:
            w = o.wires[0]
            pending[w] = m if w not in pending else m @ pending[w]
            continue
        pre = np.eye(1, dtype=complex)
        for w in o.wires:
            pre = np.kron(pre, pending.pop(w, np.eye(2, dtype=complex)))
        out.append((m @ pre, o.wires))
    out.extend((m, (w,)) for w, m in pending.items())
    return out


def apply(state: np.ndarray, m: np.ndarray, wires: tuple) -> np.ndarray:
    """Apply a ``(2**k, 2**k)`` matrix on ``wires`` to ``state`` ``(B, 2, ..., 2)``."""
    k = len(wires)
    t = m.reshape((2,) * (2 * k))
    axes = [w + 1 for w in wires]
    res = np.tensordot(t, state, axes=(list(range(k, 2 * k)), axes))
    return np.moveaxis(res, list(range(k)), axes)


def run(state: np.ndarray, ops, inverse: bool = False) -> np.ndarray:
    """``state`` ``(B, 2, ..., 2)`` after ``ops`` (or their inverse); torch einsum is ~10x
    faster than numpy's tensordot for the wide, shallow states used here."""
    import torch
    seq = fused(ops)
    if inverse:
        seq = [(m.conj().T, w) for m, w in reversed(seq)]
    st = torch.from_numpy(np.ascontiguousarray(state))
    letters = "abcdefghijklmnopqrstuvwxyz"
    n = state.ndim - 1
    ins = letters[:n + 1]
    for m, w in seq:
        k = len(w)
        out = list(ins)
        new = "ABCDEFGH"[:k]
        for i, q in enumerate(w):
            out[q + 1] = new[i]
        expr = f"{new}{''.join(ins[q + 1] for q in w)},{ins}->{''.join(out)}"
        st = torch.einsum(expr, torch.from_numpy(m.reshape((2,) * (2 * k))), st)
    return st.contiguous().numpy()


def choose_method(n: int, num_ops: int, method: str = "auto") -> str:
    if method != "auto":
        return method
    return "unitary" if n <= 12 and (4.0 ** n) * max(num_ops, 1) <= UNITARY_BUDGET else "statevector"


MAX_SIM_QUBITS = 25  # run() names the state's axes with letters: a batch axis + 25 wires
_COPIES = {"unitary": 4, "statevector": 5}  # live arrays of the check's size at its peak


def check_memory(n: int, method: str, num_states: int = 4) -> None:
    """Refuse, before anything is allocated, a check that would not fit in memory."""
    if method not in _COPIES:
        return
    width = 2 ** n if method == "unitary" else num_states
    if n > MAX_SIM_QUBITS:
        raise QdiffMemoryError(f"verification by simulation supports up to {MAX_SIM_QUBITS} "
                               f"qubits; this circuit has {n} (--verify none skips it)")
    require(_COPIES[method] * 16.0 * width * 2.0 ** n,
            f"verifying {n} qubits by {'unitary' if method == 'unitary' else 'random states'}",
            hint="--verify statevector or none needs less" if method == "unitary" else
            "--verify none skips the check")


def feasible_method(n: int, num_ops: int, method: str, num_states: int) -> str:
    """``method`` ('auto' resolved: the unitary check where it fits, else random states),
    checked against the memory budget."""
    chosen = choose_method(n, num_ops, method)
    if method == "auto" and chosen == "unitary":
        try:
            check_memory(n, "unitary")
        except QdiffMemoryError:
            chosen = "statevector"
    check_memory(n, chosen, num_states)
    return chosen


def _check_finite(ops) -> None:
    for o in ops:
        for p in o.params:
            if not (isinstance(p, ParamRef) or math.isfinite(p)):
                raise QdiffError(f"verification: gate '{o.name}' on wires {list(o.wires)} has "
                                 f"the non-finite angle {p}")


def equivalence(a, b, method: str = "auto", seed: int = 1234, num_states: int = 4,
                tol: float = TOL) -> Verdict:
    """Compare circuits ``a`` and ``b`` (same wires and parameters) up to global phase."""
    if a.num_wires != b.num_wires:
        raise QdiffError(f"verification: {a.num_wires} vs {b.num_wires} qubits")
    n = a.num_wires
    if method == "none":
        return Verdict(True, "none", float("nan"))
    method = feasible_method(n, len(a.operations) + len(b.operations), method, num_states)
    rng = np.random.default_rng(seed)
    nb = 1 if max(a.num_params, b.num_params) == 0 else 2
    worst = 0.0
    for _ in range(nb):
        theta = rng.uniform(-np.pi, np.pi, size=max(a.num_params, b.num_params))
        oa, ob = bind(a.operations, theta), bind(b.operations, theta)
        _check_finite(oa)
        _check_finite(ob)
        bad = _infidelity(oa, ob, n, method, rng, num_states)
        worst = max(worst, bad if math.isfinite(bad) else math.inf)  # NaN is a failure
    return Verdict(worst < tol, method, worst)


def _infidelity(oa, ob, n, method, rng, num_states) -> float:
    d = 2 ** n
    if method == "unitary":
        st = np.eye(d, dtype=complex).reshape((d,) + (2,) * n)
        w = run(run(st, oa), ob, inverse=True).reshape(d, d)
        return _nonnegative(1.0 - abs(np.trace(w)) / d)
    if method != "statevector":
        raise QdiffError(f"unknown verification method '{method}' (auto, unitary, statevector, none)")
    psi = rng.normal(size=(num_states, d)) + 1j * rng.normal(size=(num_states, d))
    psi /= np.linalg.norm(psi, axis=1, keepdims=True)
    out = run(run(psi.reshape((num_states,) + (2,) * n), oa), ob, inverse=True)
    ov = np.einsum("bi,bi->b", psi.conj(), out.reshape(num_states, d))
    # the same phase on every state, and unit modulus: W is a multiple of the identity
    spread = float(np.max(np.abs(ov - ov[0])))
    return _nonnegative(max(1.0 - np.min(np.abs(ov)), spread ** 2))


def _nonnegative(x) -> float:
    """``max(0, x)`` where NaN stays a failure (``max(0.0, nan)`` is 0.0 in Python)."""
    x = float(x)
    return max(0.0, x) if math.isfinite(x) else math.inf
