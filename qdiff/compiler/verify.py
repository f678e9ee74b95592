"""Equivalence checking up to global phase: full unitaries up to 12 qubits, random states above.

``equivalence(a, b)`` applies ``a`` and then ``b``'s inverse to a batch of states and measures
how far ``W = B^dag A`` is from a multiple of the identity, as a *process infidelity*
``1 - |Tr W|^2 / d^2`` (``d = 2**n``):

* ``unitary``: the batch is the identity matrix, so ``Tr W`` is computed exactly (to rounding,
  about 1e-16 per gate on ``|Tr W| / d``).
* ``statevector``: the batch is ``num_states`` Haar-random states ``psi_j``. For any ``W``,
  ``E_psi[1 - |<psi|W|psi>|^2] = d / (d + 1) * (1 - |Tr W|^2 / d^2)`` exactly, so each state
  reads the process infidelity without bias (scaled by ``(d + 1) / d``); the verdict takes the
  largest reading, plus the spread of the overlaps' phases. The hardest deviation to see is
  one eigenphase of ``W`` off the rest: one state then reads ``E * eps`` with ``E`` ~ Exp(1),
  so a circuit whose process infidelity is ``eps`` passes ``tol`` with probability at most
  ``(tol / eps) ** num_states`` (8 states: a 100x violation escapes with probability 1e-16).

Parametric circuits are checked at two random bindings of theta.

>>> from qdiff.circuits import Circuit
>>> from qdiff.compiler.ops import op
>>> a = Circuit(1, (op("h", (0,)), op("h", (0,))))
>>> equivalence(a, Circuit(1, ())).ok
True
>>> v = equivalence(Circuit(1, (op("rz", (0,), (1e-5,)),)), Circuit(1, ()))
>>> v.ok, round(v.infidelity * 1e11, 2)   # a 1e-5 rad rotation is not the identity
(False, 2.5)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qdiff.circuits.decompositions import lowered_op
from qdiff.circuits.errors import QdiffError, QdiffMemoryError
from qdiff.circuits.memory import require
from qdiff.circuits.operation import Operation, ParamRef
from qdiff.compiler.ops import matrix

TOL = 1e-12  # process infidelity of an exact result
# float64 rounding of the products moves the measured infidelity by up to ~2e-16 per gate
# (measured 1.6e-16 on 30000 Hadamards): the verdict allows 4x that on top of the tolerance
ROUNDING_PER_GATE = 8.9e-16
MAX_UNITARY_QUBITS = 12
FINAL_BUDGET = 8e9
UNITARY_BUDGET = 1e7  # 4**n * gates above which a pass guard ('auto') uses random states
NUM_STATES = 8
BINDINGS = 2  # random bindings of theta at which parametric circuits are compared


@dataclass(frozen=True)
class Verdict:
    """``infidelity``: measured process infidelity ``1 - |Tr(A^dag B)|^2 / d^2`` (``unitary``)
    or its random-state estimate (``statevector``); ``ok``: at most the tolerance."""

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
    """``[(matrix | 'cx', wires)]``: one-qubit runs multiplied into one 2x2 each; CX kept as a
    permutation (applied as a slice swap, no arithmetic)."""
    pending: dict = {}
    out = []

    def flush(w):
        if w in pending:
            out.append((pending.pop(w), (w,)))

    for o in ops:
        if len(o.wires) == 1:
            w = o.wires[0]
            m = matrix(o)
            pending[w] = m if w not in pending else m @ pending[w]
            continue
        for w in o.wires:
            flush(w)
        out.append(("cx" if o.name == "cx" else matrix(o), o.wires))
    for w in list(pending):
        flush(w)
    return out


def apply(state: np.ndarray, m: np.ndarray, wires: tuple) -> np.ndarray:
    """Apply a ``(2**k, 2**k)`` matrix on ``wires`` to ``state`` ``(B, 2, ..., 2)`` (numpy)."""
    k = len(wires)
    t = m.reshape((2,) * (2 * k))
    axes = [w + 1 for w in wires]
    res = np.tensordot(t, state, axes=(list(range(k, 2 * k)), axes))
    return np.moveaxis(res, list(range(k)), axes)


def _dagger(seq) -> list:
    return [(g if isinstance(g, str) else g.conj().T, w) for g, w in reversed(seq)]


def _apply_torch(st, g, w, n: int):
    """One fused gate on a torch state ``(B, 2, ..., 2)``. One-qubit gates and CX work on
    3-5 dimensional views (few dimensions keep torch's strided loops fast), in place."""
    import torch
    b = st.shape[0]
    if isinstance(g, str):  # cx: swap the target halves where the control is 1
        c, t = w
        lo, hi = min(c, t), max(c, t)
        v = st.view(b * 2 ** lo, 2, 2 ** (hi - lo - 1), 2, 2 ** (n - hi - 1))
        one = v[:, 1] if c == lo else v[:, :, :, 1]
        sel = (lambda x, i: x[:, :, i]) if c == lo else (lambda x, i: x[:, i])
        tmp = sel(one, 0).clone()
        sel(one, 0).copy_(sel(one, 1))
        sel(one, 1).copy_(tmp)
        return st
    if len(w) == 1:  # in place: two half-size passes
        v = st.view(b * 2 ** w[0], 2, 2 ** (n - w[0] - 1))
        x0, x1 = v[:, 0], v[:, 1]
        g00, g01, g10, g11 = (complex(x) for x in g.ravel())
        if g01 == 0 and g10 == 0:
            x0.mul_(g00)
            x1.mul_(g11)
            return st
        tmp = x0.clone()
        x0.mul_(g00).add_(x1, alpha=g01)
        x1.mul_(g11).add_(tmp, alpha=g10)
        return st
    k = len(w)
    letters = "abcdefghijklmnopqrstuvwxyz"
    ins = letters[:n + 1]
    out = list(ins)
    new = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:k]
    for i, q in enumerate(w):
        out[q + 1] = new[i]
    expr = f"{new}{''.join(ins[q + 1] for q in w)},{ins}->{''.join(out)}"
    return torch.einsum(expr, torch.from_numpy(g.reshape((2,) * (2 * k))), st).contiguous()


def run(state: np.ndarray, ops, inverse: bool = False) -> np.ndarray:
    """``state`` ``(B, 2, ..., 2)`` after ``ops`` (or their inverse), complex128."""
    import torch
    seq = fused([sub for o in ops for sub in lowered_op(o)])  # wide rotations: few wires each
    if inverse:
        seq = _dagger(seq)
    st = torch.from_numpy(np.array(state, dtype=complex))
    n = state.ndim - 1
    for g, w in seq:
        st = _apply_torch(st, g, w, n)
    return st.contiguous().numpy()


def choose_method(n: int, num_ops: int, method: str = "auto") -> str:
    """``auto`` (the checks between passes): the full unitary when ``n <= 12`` and
    ``4**n * gates <= UNITARY_BUDGET``, random states otherwise; ``final`` (the check of a
    compiled circuit): the full unitary whenever ``n <= 12`` and ``4**n * gates <=
    FINAL_BUDGET`` (12 qubits and about 500 gates: tens of seconds)."""
    if method == "final":
        fits = n <= MAX_UNITARY_QUBITS and (4.0 ** n) * max(num_ops, 1) <= FINAL_BUDGET
        return "unitary" if fits else "statevector"
    if method != "auto":
        return method
    fits = n <= MAX_UNITARY_QUBITS and (4.0 ** n) * max(num_ops, 1) <= UNITARY_BUDGET
    return "unitary" if fits else "statevector"


MAX_SIM_QUBITS = 25  # _apply_torch names the state's axes with letters: a batch axis + 25 wires
_COPIES = {"unitary": 4, "statevector": 5}  # live arrays of the check's size at its peak


def check_memory(n: int, method: str, num_states: int = NUM_STATES) -> None:
    """Refuse, before anything is allocated, a check that would not fit in memory."""
    if method not in _COPIES:
        return
    if n > MAX_SIM_QUBITS:
        raise QdiffMemoryError(f"verification by simulation supports up to {MAX_SIM_QUBITS} "
                               f"qubits; this circuit has {n} (--verify none skips it)")
    if method == "unitary" and n > MAX_UNITARY_QUBITS:
        raise QdiffError(f"verifying {n} qubits by unitary would simulate 2**{n} columns "
                         f"(the limit is {MAX_UNITARY_QUBITS} qubits); --verify statevector "
                         "checks random states instead")
    width = _chunk(n) if method == "unitary" else num_states
    require(_COPIES[method] * 16.0 * width * 2.0 ** n,
            f"verifying {n} qubits by {'unitary' if method == 'unitary' else 'random states'}",
            hint="--verify statevector or none needs less" if method == "unitary" else
            "--verify none skips the check")


def feasible_method(n: int, num_ops: int, method: str, num_states: int) -> str:
    """``method`` resolved (:func:`choose_method`), checked against the memory budget; the
    automatic choices fall back from the unitary to random states when it does not fit."""
    chosen = choose_method(n, num_ops, method)
    if method in ("auto", "final") and chosen == "unitary":
        try:
            check_memory(n, "unitary")
        except QdiffMemoryError:
            chosen = "statevector"
    check_memory(n, chosen, num_states)
    return chosen


def _check_finite(ops) -> None:
    for o in ops:
        for p in o.params:
            if not (isinstance(p, ParamRef) or math.isfinite(float(p))):
                raise QdiffError(f"verification: gate '{o.name}' on wires {list(o.wires)} has "
                                 f"the non-finite angle {p}")


def equivalence(a, b, method: str = "auto", seed: int = 1234, num_states: int = NUM_STATES,
                tol: float = TOL) -> Verdict:
    """Compare circuits ``a`` and ``b`` (same wires and parameters) up to global phase.

    ``method``: ``auto`` | ``final`` | ``unitary`` | ``statevector`` | ``none``; ``tol`` bounds
    the process infidelity (1e-12: exact; an approximation budget when one was given), plus
    the rounding of the comparison itself (``ROUNDING_PER_GATE`` per gate of ``a`` and ``b``:
    1e-13 for 100 gates, 3e-11 for 30000)."""
    if a.num_wires != b.num_wires:
        raise QdiffError(f"verification: {a.num_wires} vs {b.num_wires} qubits")
    n = a.num_wires
    if method == "none":
        return Verdict(True, "none", float("nan"))
    if method not in ("auto", "final", "unitary", "statevector"):
        raise QdiffError(f"unknown verification method '{method}' "
                         "(auto, final, unitary, statevector, none)")
    method = feasible_method(n, len(a.operations) + len(b.operations), method, num_states)
    rng = np.random.default_rng(seed)
    nb = 1 if max(a.num_params, b.num_params) == 0 else BINDINGS
    worst = 0.0
    for _ in range(nb):
        theta = rng.uniform(-np.pi, np.pi, size=max(a.num_params, b.num_params))
        oa, ob = bind(a.operations, theta), bind(b.operations, theta)
        _check_finite(oa)
        _check_finite(ob)
        bad = _infidelity(oa, ob, n, method, rng, num_states)
        worst = max(worst, bad if math.isfinite(bad) else math.inf)  # NaN is a failure
    allowed = tol + ROUNDING_PER_GATE * (len(a.operations) + len(b.operations))
    return Verdict(worst <= allowed, method, worst)


def process_infidelity(trace_over_d: complex) -> float:
    """``1 - |t|^2`` for ``t = Tr W / d``, written ``(1 - |t|)(1 + |t|)`` to keep digits."""
    r = abs(trace_over_d)
    return float(max(0.0, (1.0 - r) * (1.0 + r)))


def _infidelity(oa, ob, n, method, rng, num_states) -> float:
    d = 2 ** n
    if method == "unitary":
        tr = 0j
        for lo in range(0, d, _chunk(n)):  # columns in chunks: the working set stays small
            cols = np.arange(lo, min(d, lo + _chunk(n)))
            st = np.zeros((len(cols), d), dtype=complex)
            st[np.arange(len(cols)), cols] = 1.0
            w = run(run(st.reshape((len(cols),) + (2,) * n), oa), ob, inverse=True)
            tr += np.sum(w.reshape(len(cols), d)[np.arange(len(cols)), cols])
        return process_infidelity(tr / d)
    psi = rng.normal(size=(num_states, d)) + 1j * rng.normal(size=(num_states, d))
    psi /= np.linalg.norm(psi, axis=1, keepdims=True)
    out = run(run(psi.reshape((num_states,) + (2,) * n), oa), ob, inverse=True)
    ov = np.einsum("bi,bi->b", psi.conj(), out.reshape(num_states, d))
    # each reading is unbiased for the process infidelity; the phases must agree as well
    reading = max(process_infidelity(z) for z in ov) * (d + 1) / d
    unit = ov / np.maximum(np.abs(ov), 1e-300)
    spread = float(np.max(np.abs(unit - unit[0])))
    return float(max(reading, spread ** 2))


def _chunk(n: int) -> int:
    return max(1, min(2 ** n, 2 ** 20 // 2 ** n))
