"""Target gate sets and the final translation pass into one of them.

A basis is a comma-separated list of gate names: one two-qubit gate (cx, cz or ecr) and a
one-qubit set from which every 2x2 unitary can be written (u | u3 | rz,sx[,x] | p,sx | rz,ry |
rz,rx | u1,u2,u3 | h with rz or Clifford+T phases).

>>> parse_basis("rz,sx,x,cx").euler
'ZSXX'
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qdiff.circuits import caches
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.gates import get_gate
from qdiff.circuits.operation import ParamRef
from qdiff.compiler.budget import EXACT_DELTA, phase_distance
from qdiff.compiler.fuse import canonical_1q
from qdiff.compiler.ops import is_constant, matrix, op
from qdiff.compiler.synth import from_qiskit_ops, guarded

_TWO_Q = ("cx", "cz", "ecr")
_EULER = [({"u"}, "U3"), ({"u1", "u2", "u3"}, "U321"), ({"u3"}, "U3"),
          ({"rz", "sx", "x"}, "ZSXX"), ({"rz", "sx"}, "ZSX"), ({"p", "sx"}, "PSX"),
          ({"rz", "ry"}, "ZYZ"), ({"rz", "rx"}, "ZXZ"), ({"h", "rz"}, "HRZ"),
          ({"h", "t"}, "CLIFFORD_T")]
SNAP_TOL = 1e-11


@dataclass(frozen=True)
class Basis:
    names: frozenset
    two_q: str
    euler: str

    def __str__(self):
        return ",".join(sorted(self.names))


def parse_basis(text) -> Basis:
    names = frozenset(_canonical(s.strip().lower()) for s in (
        text.split(",") if isinstance(text, str) else text) if s.strip())
    unknown = sorted(n for n in names if not _is_gate_name(n))
    if unknown:
        raise QdiffError(f"basis '{','.join(sorted(names))}': unknown gate "
                         f"{', '.join(repr(n) for n in unknown)}")
    two = [g for g in _TWO_Q if g in names]
    if not two:
        raise QdiffError(f"basis '{','.join(sorted(names))}': needs a two-qubit gate "
                         f"(one of {', '.join(_TWO_Q)})")
    for need, euler in _EULER:
        if need <= names:
            return Basis(names, two[0], euler)
    raise QdiffError(f"basis '{','.join(sorted(names))}': cannot write every one-qubit gate "
                     "with it (use u, or rz,sx,x, or rz,ry, or h,rz, or h,s,t,...)")


_INSTRUCTIONS = {"measure", "reset", "delay", "barrier"}  # in device basis lists, not gates
_CLIFFORD_T = {"s", "sdg", "tdg", "z"}  # with h, t (and x): a Clifford+T basis


def _canonical(name: str) -> str:
    """A gate's name as a basis lists it: Qiskit's standard names as they are (``u``, ``p``,
    ``cx``), another name of a qdiff gate (``cnot``, ``toffoli``, ``hadamard``) as that gate's
    own name; an unknown name as it is (refused by :func:`parse_basis`)."""
    if name in _INSTRUCTIONS or name in _TWO_Q or any(name in s for s, _ in _EULER) or \
            name in _CLIFFORD_T:
        return name
    try:
        canonical = get_gate(name).name
    except QdiffError:
        return name
    if canonical == name:
        return name
    from qiskit.circuit.library import get_standard_gate_name_mapping
    return name if name in get_standard_gate_name_mapping() else canonical


def _is_gate_name(name: str) -> bool:
    """Whether ``name`` is a gate of qdiff's registry or of Qiskit's standard library (a basis
    may list gates the output does not use, as Qiskit's ``basis_gates``)."""
    if name in _INSTRUCTIONS:
        return True
    try:
        get_gate(name)
        return True
    except QdiffError:
        pass
    from qiskit.circuit.library import get_standard_gate_name_mapping
    return name in get_standard_gate_name_mapping()


def translate(circuit, basis: Basis, fuse: bool = True):
    """Pass: rewrite a lowered circuit (one-qubit gates + CX) into ``basis``.

    ``fuse=False`` rewrites gate by gate (the *rebased input* every level is compared with).
    ``fuse=True`` rewrites each run of constant one-qubit gates on a wire as the shortest of:
    the run gate by gate, a known short word of basis gates for the run's product (exact
    Clifford+T words included), and the Euler/``h``-phase synthesis of the product when the
    basis can write it exactly -- so a run never grows (a lone ``h`` stays ``h``)."""
    ops = []
    for o in circuit.operations:
        ops.extend(_two_q(o, basis) if o.name == "cx" and basis.two_q != "cx" else [o])
    out: list = []
    if not fuse:
        for o in ops:
            out.extend(_one_q(o, basis) if len(o.wires) == 1 else [o])
        return circuit.with_operations(out)
    pending: dict = {}

    def flush(w):
        run = pending.pop(w, None)
        if run:
            out.extend(_run_ops(run, w, basis))

    for o in ops:
        if len(o.wires) == 1 and is_constant(o):
            pending.setdefault(o.wires[0], []).append(o)
            continue
        for w in o.wires:
            flush(w)
        out.extend(_one_q(o, basis) if len(o.wires) == 1 else [o])
    for w in sorted(pending):
        flush(w)
    return circuit.with_operations(out)


def _run_ops(run, wire: int, basis: Basis) -> list:
    by_gate = [x for o in run for x in _one_q(o, basis)]
    u = np.eye(2, dtype=complex)
    for o in run:
        u = matrix(o) @ u
    cands = []
    word = _word(u, basis)
    if word is not None:
        cands.append([op(n, (wire,)) for n in word])
    try:
        cands.append([x for g in canonical_1q(u, wire) for x in _one_q(g, basis)])
    except QdiffError:  # not exactly writable in a discrete basis: keep the run's own gates
        pass
    cands.append(by_gate)
    return min(cands, key=len)


def _unitary_key(u: np.ndarray) -> bytes:
    """The 2x2 unitary up to global phase, rounded (a dictionary key)."""
    i = int(np.argmax(np.abs(u.ravel()) > 0.3))
    ph = u.ravel()[i] / abs(u.ravel()[i])
    return (np.round(u / ph, 9) + 0.0).tobytes()  # + 0.0 turns -0.0 into 0.0


_CONST_1Q = ("id", "x", "y", "z", "h", "s", "sdg", "t", "tdg", "sx", "sxdg")


def _word(u: np.ndarray, basis: Basis):
    """The shortest word of the basis's constant gates whose product is ``u`` to rounding
    (phase-aligned distance ``<= EXACT_DELTA``), or None. The table's keys are rounded to
    1e-9, so a rotation by 1e-9 rad shares its key with the identity: the word is checked."""
    word = _words(basis).get(_unitary_key(u))
    if word is None:
        return None
    m = np.eye(2, dtype=complex)
    for name in word:
        m = matrix(op(name, (0,))) @ m
    return word if phase_distance(m, u) <= EXACT_DELTA else None


@caches.cached(maxsize=16)
def _words(basis: Basis, max_len: int = 5) -> dict:
    """Shortest words (up to ``max_len``) of the basis's constant one-qubit gates, by unitary."""
    gates = [g for g in _CONST_1Q if g in basis.names and g != "id"]
    mats = {g: matrix(op(g, (0,))) for g in gates}
    table = {_unitary_key(np.eye(2, dtype=complex)): ()}
    frontier = [((), np.eye(2, dtype=complex))]
    for _ in range(max_len):
        nxt = []
        for word, m in frontier:
            for g in gates:
                m2 = mats[g] @ m
                key = _unitary_key(m2)
                if key not in table:
                    table[key] = word + (g,)
                    nxt.append((word + (g,), m2))
        frontier = nxt
    return table


def _two_q(o, basis: Basis) -> list:
    c, t = o.wires
    if basis.two_q == "cz":
        return [op("h", (t,)), op("cz", (c, t)), op("h", (t,))]
    return [op(name, tuple(o.wires[i] for i in ws), ps) for name, ws, ps in _ecr_template()]


@caches.cached(maxsize=1)
def _ecr_template():
    from qiskit.circuit.library import ECRGate
    from qiskit.synthesis import TwoQubitBasisDecomposer
    cx = np.eye(4, dtype=complex)[[0, 1, 3, 2]]
    ops = from_qiskit_ops(TwoQubitBasisDecomposer(ECRGate())(cx), (0, 1))
    return tuple((x.name, x.wires, x.params) for x in ops)


def _one_q(o, basis: Basis) -> list:
    w = o.wires
    if not is_constant(o):  # lowering leaves only rz(ParamRef) here
        return [op(_param_rz_name(basis), w, (0.0, 0.0, o.params[0]) if _param_rz_name(basis)
                   == "u3" else o.params)]
    if o.name in basis.names and o.name != "u3":
        return [o]
    u = matrix(o)
    word = _word(u, basis)
    word = None if word is None else [op(n, w) for n in word]
    try:
        synth = (h_phase(u, w[0], basis) if basis.euler in ("HRZ", "CLIFFORD_T")
                 else euler_ops(u, w[0], basis.euler))
    except QdiffError:
        if word is None:
            raise
        return word
    return word if word is not None and len(word) <= len(synth) else synth


def _param_rz_name(basis: Basis) -> str:
    for name in ("rz", "p", "u1"):
        if name in basis.names:
            return name
    if basis.euler == "U3":
        return "u3"
    raise QdiffError(f"basis '{basis}': cannot express a parametric rotation (add rz or p)")


def euler_ops(u: np.ndarray, wire: int, euler: str) -> list:
    from qiskit.synthesis import OneQubitEulerDecomposer
    return from_qiskit_ops(guarded(_decomposer(euler), u), (wire,))


@caches.cached(maxsize=16)
def _decomposer(euler: str):
    from qiskit.synthesis import OneQubitEulerDecomposer
    return OneQubitEulerDecomposer(euler, use_dag=False)


def h_phase(u: np.ndarray, wire: int, basis: Basis) -> list:
    """``rz(a) h rz(b) h rz(c)`` (ZXZ with rx = h rz h); phases exact in Clifford+T if asked."""
    seq = []
    for g in canonical_1q(u, wire):
        if g.name == "rz":
            seq.append(("z", g.params[0]))
        elif g.name == "rx":
            seq += [("h", None), ("z", g.params[0]), ("h", None)]
        else:
            th, ph, lam = g.params  # u3 = rz(ph) ry(th) rz(lam); ry(t) = rz(pi/2) rx(t) rz(-pi/2)
            if "rz" not in basis.names and abs(abs(th) - math.pi) < SNAP_TOL:
                # U3(pi, ph, lam) ~ U3(pi, ph - lam, 0): phi - lam whole, so an exact
                # Clifford+T gate stays in multiples of pi/4
                ph, lam = ph - lam, 0.0
            seq += [("z", lam - math.pi / 2), ("h", None), ("z", th), ("h", None),
                    ("z", ph + math.pi / 2)]
    out = []
    for kind, a in seq:
        out.extend([op("h", (wire,))] if kind == "h" else _phase(a, wire, basis))
    return out


_EIGHTHS = {"t": 1, "s": 2, "z": 4, "sdg": 6, "tdg": 7}


@caches.cached(maxsize=16)
def _phase_words(names: frozenset) -> dict:
    """``k -> shortest list of phase gates`` adding up to ``k pi/4`` (mod 2 pi)."""
    gates = [g for g in _EIGHTHS if g in names]
    best: dict = {0: []}
    frontier = [0]
    while frontier:
        nxt = []
        for k in frontier:
            for g in gates:
                k2 = (k + _EIGHTHS[g]) % 8
                if k2 not in best:
                    best[k2] = best[k] + [g]
                    nxt.append(k2)
        frontier = nxt
    return best


def _phase(a: float, wire: int, basis: Basis) -> list:
    k = round(a / (math.pi / 4))
    if abs(a - k * math.pi / 4) < SNAP_TOL:
        names = _phase_words(basis.names).get(k % 8)
        if names is not None and (len(names) <= 1 or "rz" not in basis.names):
            return [op(n, (wire,)) for n in names]
    if "rz" in basis.names:
        return [op("rz", (wire,), (a,))]
    raise QdiffError(f"basis '{basis}': rotation by {a:.15g} rad is not a multiple of pi/4 and "
                     "the basis has no rz")


__all__ = ["Basis", "parse_basis", "translate", "euler_ops", "ParamRef"]
