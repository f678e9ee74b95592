"""Pass (level 3): re-synthesis as a sequence of Pauli rotations followed by one Clifford.

Every non-Clifford ``rz`` of the circuit is pushed through the Cliffords before it and becomes
a rotation ``exp(-i a P / 2)`` about a Pauli string ``P``; rotations about the same string that
commute with everything between them merge (affinely for ParamRefs). The rotations are then
re-synthesized greedily: among the rotations free to go next, the lightest in the current
Clifford frame is reduced to one qubit by basis changes and CXs chosen to lighten the next few
rotations too, and the remaining Clifford is synthesized by Qiskit's Clifford synthesis.

Paulis are ``(x, z, r)``: ``i**r X**x Z**z`` with bit masks ``x``, ``z`` over the qubits.

>>> from qdiff.circuits import Circuit
>>> from qdiff.compiler.ops import op
>>> c = Circuit(2, (op("cx", (0, 1)), op("rz", (1,), (0.3,)), op("cx", (0, 1)),
...                 op("cx", (0, 1)), op("rz", (1,), (0.4,)), op("cx", (0, 1))))
>>> sum(o.name == "cx" for o in pauli_resynthesis(c).operations)
2
"""
from __future__ import annotations

import math

import numpy as np

from qdiff.circuits import caches
from qdiff.circuits.operation import ParamRef
from qdiff.compiler.basis import h_phase, parse_basis
from qdiff.compiler.budget import EXACT_DELTA, phase_distance, rotation_distance
from qdiff.compiler.ops import add_angles, is_constant, matrix, op

LOOKAHEAD = 8
FRONT = 24
_HRZ = parse_basis("cx,h,rz")


def mul(p, q):
    return (p[0] ^ q[0], p[1] ^ q[1], (p[2] + q[2] + 2 * bin(p[1] & q[0]).count("1")) % 4)


def commutes(p, q) -> bool:
    return (bin(p[0] & q[1]).count("1") + bin(p[1] & q[0]).count("1")) % 2 == 0


def weight(p) -> int:
    return bin(p[0] | p[1]).count("1")


def hermitian_sign(p) -> int:
    """``s`` with ``p = s * (product of X, Y, Z letters)`` (Y = iXZ); +1 or -1."""
    return 1 if (p[2] - bin(p[0] & p[1]).count("1")) % 4 == 0 else -1


# -- conjugation V P V^dag by the gates the synthesis emits (h, s, sdg, cx) -----------------
def conj(p, gate: str, wires):
    x, z, r = p
    if gate == "cx":
        c, t = (1 << wires[0]), (1 << wires[1])
        if x & c:
            x ^= t
        if z & t:
            z ^= c
        return (x, z, r)
    b = 1 << wires[0]
    if gate == "h":
        xb, zb = bool(x & b), bool(z & b)
        if xb and zb:
            r += 2
        x = (x & ~b) | (b if zb else 0)
        z = (z & ~b) | (b if xb else 0)
    elif gate in ("s", "sdg") and x & b:
        r += 1 if gate == "s" else 3
        z ^= b
    return (x, z, r % 4)


# -- extraction ----------------------------------------------------------------------------
@caches.cached(maxsize=1)
def _clifford_words() -> list:
    """The 24 one-qubit Cliffords (mod phase) as shortest words in h and s."""
    words, seen, frontier = [], [], [()]
    mats = {"h": np.array([[1, 1], [1, -1]]) / math.sqrt(2), "s": np.diag([1, 1j])}
    while frontier and len(words) < 24:
        nxt = []
        for w in frontier:
            m = np.eye(2, dtype=complex)
            for g in w:
                m = mats[g] @ m
            if not any(phase_distance(m, s) <= 1e-9 for s in seen):
                seen.append(m)
                words.append((w, m))
                nxt += [w + ("h",), w + ("s",)]
        frontier = nxt
    return words


@caches.cached(maxsize=1)
def _clifford_stack() -> np.ndarray:
    return np.stack([m for _, m in _clifford_words()]).astype(complex)


def clifford_word(u: np.ndarray):
    """The word in h and s of the one-qubit Clifford ``u`` (to rounding), or None."""
    # phase_distance(u, m) for the 24 Cliffords at once: ||u - e^{i phi} m||_F / sqrt(2)
    # with e^{i phi} the phase of Tr(m^dag u), the same formula vectorized
    stack = _clifford_stack()
    t = np.einsum("kij,ij->k", stack.conj(), u)
    a = np.abs(t)
    # a trace near 0 (u far from m) leaves the phase free: 1 (no division by a subnormal)
    big = a > 1e-12
    ph = np.where(big, t / np.where(big, a, 1.0), 1.0)
    dist = np.linalg.norm((u[None] - ph[:, None, None] * stack).reshape(len(stack), -1),
                          axis=1) / math.sqrt(2.0)
    k = int(np.argmin(dist))
    if dist[k] <= EXACT_DELTA:  # a Clifford to rounding, never approximately
        return _clifford_words()[k][0]
    return None


def _as_h_s_rz(o) -> list:
    """A one-qubit op as [('h'|'s', None) | ('rz', angle)] in time order."""
    if not is_constant(o):
        return [("rz", o.params[0])]  # lowering leaves only rz(ParamRef)
    w = clifford_word(matrix(o))
    if w is not None:
        return [(g, None) for g in w]
    out = []
    for g in h_phase(matrix(o), 0, _HRZ):
        if g.name == "h":
            out.append(("h", None))
        else:
            a = float(g.params[0])
            k = round(a / (math.pi / 2))
            if abs(a - k * math.pi / 2) < 1e-12:
                out += [("s", None)] * (k % 4)
            else:
                out.append(("rz", a))
    return out


def extract(ops, n: int):
    """``(rotations [(pauli, angle)], clifford [(gate, wires)])`` with U = C . R_N ... R_1."""
    img_x = [(1 << q, 0, 0) for q in range(n)]  # F^dag X_q F
    img_z = [(0, 1 << q, 0) for q in range(n)]  # F^dag Z_q F
    rots, cliff = [], []
    for o in ops:
        if len(o.wires) == 2:
            c, t = o.wires
            img_x[c] = mul(img_x[c], img_x[t])
            img_z[t] = mul(img_z[c], img_z[t])
            cliff.append(("cx", o.wires))
            continue
        q = o.wires[0]
        for g, a in _as_h_s_rz(o):
            if g == "rz":
                rots.append((img_z[q], a))
            elif g == "h":
                img_x[q], img_z[q] = img_z[q], img_x[q]
                cliff.append(("h", (q,)))
            else:  # s^dag X s = -i X Z
                img_x[q] = mul((0, 0, 3), mul(img_x[q], img_z[q]))
                cliff.append(("s", (q,)))
    return rots, cliff


def merge(rots) -> list:
    """Merge rotations about one string across commuting neighbours; drop zero angles."""
    out: list = []
    for p, a in rots:
        s = hermitian_sign(p)
        key = (p[0], p[1])
        a = a * s if isinstance(a, ParamRef) else float(a) * s
        done = False
        for j in range(len(out) - 1, -1, -1):
            q, b = out[j]
            if (q[0], q[1]) == key:
                m = add_angles(b, a)
                if m is not None:
                    out[j] = (q, m)
                    done = True
                    break
            if not commutes((key[0], key[1], 0), (q[0], q[1], 0)):
                break
        if not done:
            out.append(((key[0], key[1]), a))
    return [(k, a) for k, a in out if isinstance(a, ParamRef) or abs(math.remainder(a, 2 * math.pi)) > 1e-12]


# -- synthesis -----------------------------------------------------------------------------
class Frame:
    """The Clifford V emitted so far, as images V X_q V^dag and V Z_q V^dag."""

    def __init__(self, n: int):
        self.n = n
        self.jx = [(1 << q, 0, 0) for q in range(n)]
        self.jz = [(0, 1 << q, 0) for q in range(n)]
        self.gates: list = []

    def apply(self, gate: str, wires) -> None:
        self.jx = [conj(p, gate, wires) for p in self.jx]
        self.jz = [conj(p, gate, wires) for p in self.jz]
        self.gates.append((gate, wires))

    def image(self, key):
        """V P V^dag for the Hermitian string ``key = (x, z)`` (phase included)."""
        x, z = key
        p = (0, 0, bin(x & z).count("1") % 4)  # Y = i X Z
        q = 0
        while x >> q or z >> q:
            if x >> q & 1:
                p = mul(p, self.jx[q])
            q += 1
        q = 0
        while z >> q:
            if z >> q & 1:
                p = mul(p, self.jz[q])
            q += 1
        return p


def _to_z_ops(p) -> list:
    """Basis changes making every letter of ``p`` a Z: X -> h; Y -> sdg, h."""
    out = []
    for q in range(max(p[0].bit_length(), p[1].bit_length())):
        xb, zb = p[0] >> q & 1, p[1] >> q & 1
        if xb and zb:
            out += [("sdg", (q,)), ("h", (q,))]
        elif xb:
            out.append(("h", (q,)))
    return out


def _lookahead_cost(paulis, gate_wires) -> float:
    cost, decay = 0.0, 1.0
    for p in paulis:
        cost += decay * weight(conj(p, "cx", gate_wires))
        decay *= 0.7
    return cost


def synthesize(rots, cliff, n: int, seed: int = 0, clifford: str = "full"):
    """Ops realizing ``C . R_N ... R_1`` (rotations greedy, then the Clifford remainder).

    ``seed`` > 0 breaks ties between equally good choices at random (a different, equally
    valid circuit; level 3 tries a few and keeps the smallest)."""
    import random
    rng = random.Random(seed)
    tie = (lambda i: i) if seed == 0 else (lambda i: rng.random())
    frame = Frame(n)
    out: list = []
    pending = list(rots)
    while pending:
        front = front_indices(pending)
        j = min(front, key=lambda i: (weight(frame.image(pending[i][0])), tie(i)))
        key, angle = pending.pop(j)
        for g, w in _to_z_ops(frame.image(key)):
            frame.apply(g, w)
            out.append(op(g, w))
        nxt = [frame.image(k) for k, _ in pending[:LOOKAHEAD]]
        p = frame.image(key)
        while weight(p) > 1:
            support = [q for q in range(n) if p[1] >> q & 1]
            best = min(((a, b) for a in support for b in support if a != b),
                       key=lambda ab: (_lookahead_cost(nxt, ab), tie(ab[0] * n + ab[1])))
            frame.apply("cx", best)
            out.append(op("cx", best))
            nxt = [conj(x, "cx", best) for x in nxt]
            p = frame.image(key)
        q = p[1].bit_length() - 1
        sign = 1 if p[2] % 4 == 0 else -1
        out.append(op("rz", (q,), (angle * sign if isinstance(angle, ParamRef) else angle * sign,)))
    out.extend(final_clifford(cliff, frame.gates, n, clifford))
    return out


def front_indices(pending) -> list:
    """Indices (among the first FRONT) of rotations commuting with every earlier pending one."""
    idx = []
    for i in range(min(FRONT, len(pending))):
        pi = (pending[i][0][0], pending[i][0][1], 0)
        if all(commutes(pi, (pending[j][0][0], pending[j][0][1], 0)) for j in range(i)):
            idx.append(i)
    return idx


def final_clifford(cliff, emitted, n: int, method: str = "full") -> list:
    """Ops for C V^dag (time order: undo the emitted Cliffords, then the circuit's) by Qiskit's
    ``full`` (greedy) or ``layers`` Clifford synthesis."""
    from qiskit import QuantumCircuit
    from qiskit.quantum_info import Clifford
    from qiskit.synthesis import synth_clifford_full, synth_clifford_layers
    from qdiff.circuits.circuit import Circuit
    from qdiff.compiler.lower import lower
    from qdiff.compiler.qiskit_translation import qiskit_basis_translation
    from qdiff.compiler.synth import from_qiskit_ops
    qv, qc = QuantumCircuit(n), QuantumCircuit(n)
    for g, w in emitted:
        getattr(qv, g)(*w)
    for g, w in cliff:
        getattr(qc, g)(*w)
    target = Clifford(qv.inverse().compose(qc))
    synth = {"full": synth_clifford_full, "layers": synth_clifford_layers}[method]
    qc_out = qiskit_basis_translation(synth(target))
    return list(lower(Circuit(n, tuple(from_qiskit_ops(qc_out, tuple(reversed(range(n))))))
                      ).operations)


def drop_rotations(rots, budget) -> list:
    """Drop the smallest constant rotations the approximation ``budget`` pays for (a rotation
    by ``a`` about any Pauli string is at distance ``2|sin(a/4)|`` from the identity)."""
    if budget is None or budget.exact:
        return rots
    ranked = sorted((rotation_distance(a), i) for i, (_, a) in enumerate(rots)
                    if not isinstance(a, ParamRef))
    drop = set()
    for delta, i in ranked:
        if not budget.spend(delta):
            break
        drop.add(i)
    return [r for i, r in enumerate(rots) if i not in drop]


def pauli_resynthesis(circuit, seed: int = 0, budget=None, clifford: str = "full"):
    """Pass: Circuit (one-qubit gates + CX) -> the same unitary as Pauli rotations + Clifford
    (``budget``: an approximation budget to spend on dropping the smallest rotations;
    ``clifford``: ``full`` or ``layers``, Qiskit's synthesis of the remaining Clifford)."""
    n = circuit.num_wires
    rots, cliff = extract(circuit.operations, n)
    ops = synthesize(drop_rotations(merge(rots), budget), cliff, n, seed, clifford)
    return circuit.with_operations(ops)
