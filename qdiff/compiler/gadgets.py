"""Pass (level 3): greedy Pauli-network re-synthesis with two-qubit Clifford entanglers.

As in ``pauli.py`` the circuit becomes rotations about Pauli strings (merged where they commute:
phase folding) followed by one Clifford ``C``. The rotations are then synthesized greedily in
the spirit of Martiel and Goubault de Brugiere (arXiv:2103.08602, 2305.10966): each rotation
of the front (commuting with everything before it) is reduced to one qubit by two-qubit
entanglers ``E(A, B)`` = controlled-``B`` on ``A``'s eigenbasis (a CX between single-qubit
Clifford basis changes: ``A`` in {X, Y, Z} on one qubit, ``B`` on the other). Among the
entanglers that lower the weight of the rotation in hand, the one chosen minimises a
discounted weight of the next rotations *and* of the Clifford still to be written after them
(the tableau of ``V C^dag``, with ``V`` the Clifford emitted so far): so the final Clifford
shrinks along the way instead of being synthesized from scratch. Weight changes depend only
on the letters at the two qubits, so they are looked up in a table per entangler.

The remaining Clifford is written by Qiskit's Clifford synthesis (as in ``pauli.py``).
Level 3 runs a few deterministic variants (seed for tie-breaking, weight of the Clifford
term, the circuit or its inverse) and keeps the smallest verified result.

>>> from qdiff.circuits import Circuit
>>> from qdiff.compiler.ops import op
>>> c = Circuit(2, (op("cx", (0, 1)), op("rz", (1,), (0.3,)), op("cx", (0, 1)),
...                 op("cx", (0, 1)), op("rz", (1,), (0.4,)), op("cx", (0, 1))))
>>> sum(o.name == "cx" for o in greedy_pauli(c).operations)
2
"""
from __future__ import annotations

import functools
import random

from qdiff.circuits.errors import QdiffError
from qdiff.circuits.operation import ParamRef
from qdiff.compiler.fuse import canonical_1q
from qdiff.compiler.ops import cx_count, is_constant, matrix, op
from qdiff.compiler.pauli import (LOOKAHEAD, Frame, conj, extract, final_clifford,
                                  front_indices, merge, weight)

# (seed, weight of the remaining Clifford in the cost, reverse)
VARIANTS = ((0, 0.3, False), (0, 0.1, False), (1, 0.3, False), (0, 0.6, False),
            (0, 0.3, True), (0, 0.1, True), (1, 0.3, True), (0, 0.6, True))
DECAY = 0.7
_TO_Z = {"X": ("h",), "Y": ("sdg", "h"), "Z": ()}
_TO_X = {"X": (), "Y": ("sdg",), "Z": ("h",)}
_INV = {"h": "h", "s": "sdg", "sdg": "s"}
_LETTERS = ("I", "X", "Z", "Y")  # index x + 2 z


def _letter(p, q) -> str:
    return _LETTERS[(p[0] >> q & 1) + 2 * (p[1] >> q & 1)]


def entangler(a: int, la: str, b: int, lb: str) -> list:
    """Gates ``[(name, wires)]`` of E(A, B) on qubits ``a``, ``b``: CX between the basis
    changes taking ``A`` to Z on ``a`` and ``B`` to X on ``b``."""
    pre = [(g, (a,)) for g in _TO_Z[la]] + [(g, (b,)) for g in _TO_X[lb]]
    return pre + [("cx", (a, b))] + [(_INV[g], w) for g, w in reversed(pre)]


@functools.lru_cache(maxsize=None)
def _delta(la: str, lb: str) -> tuple:
    """Weight change on qubits (0, 1) of each two-letter Pauli under E(la, lb): a 16-entry
    table indexed ``i + 4 j`` for letters ``_LETTERS[i]`` on 0 and ``_LETTERS[j]`` on 1."""
    seq = entangler(0, la, 1, lb)
    out = []
    for j in range(4):
        for i in range(4):
            p = ((i & 1) | (j & 1) << 1, (i >> 1) | (j >> 1) << 1, 0)
            before = weight(p)
            for g, w in seq:
                p = conj(p, g, w)
            out.append(weight(p) - before)
    return tuple(out)


def _pair_index(p, a: int, b: int) -> int:
    return ((p[0] >> a & 1) + 2 * (p[1] >> a & 1)) + 4 * ((p[0] >> b & 1) + 2 * (p[1] >> b & 1))


def _clifford_rows(cliff, n: int) -> list:
    """The 2n rows ``C^dag X_q C``, ``C^dag Z_q C`` of the circuit's Clifford ``C``."""
    rows = [(1 << q, 0, 0) for q in range(n)] + [(0, 1 << q, 0) for q in range(n)]
    for g, w in reversed(cliff):  # C^dag P C = g_1^dag ... g_k^dag P g_k ... g_1
        inv = _INV.get(g, g)
        rows = [conj(p, inv, w) for p in rows]
    return rows


def synthesize(rots, cliff, n: int, seed: int = 0, cliff_weight: float = 0.1,
               clifford: str = "full") -> list:
    """Ops realizing ``C . R_N ... R_1`` with entangler choices scored as described above."""
    rng = random.Random(seed)
    tie = (lambda: 0.0) if seed == 0 else rng.random
    frame = Frame(n)
    rows = _clifford_rows(cliff, n)  # of M = V C^dag, updated as gates are emitted
    out: list = []
    pending = list(rots)

    def emit(seq):
        nonlocal rows
        for g, w in seq:
            frame.apply(g, w)
            rows = [conj(p, g, w) for p in rows]
            out.append(op(g, w))

    while pending:
        front = front_indices(pending)
        j = min(front, key=lambda i: (weight(frame.image(pending[i][0])), i))
        key, angle = pending.pop(j)
        p = frame.image(key)
        while weight(p) > 1:
            support = [q for q in range(n) if (p[0] | p[1]) >> q & 1]
            nxt = [frame.image(k) for k, _ in pending[:LOOKAHEAD]]
            best, best_cost = None, None
            for a in support:
                la = _letter(p, a)
                for b in support:
                    if a == b:
                        continue
                    lb_p = _letter(p, b)
                    for lb in ("X", "Y", "Z"):
                        if lb == lb_p:  # E(A, B) frees b only when B anticommutes with P_b
                            continue
                        d = _delta(la, lb)
                        cost, dec = 0.0, 1.0
                        for x in nxt:
                            cost += dec * d[_pair_index(x, a, b)]
                            dec *= DECAY
                        if cliff_weight:
                            cost += cliff_weight * sum(d[_pair_index(r, a, b)] for r in rows)
                        c = (cost, tie())
                        if best_cost is None or c < best_cost:
                            best, best_cost = (a, la, b, lb), c
            # the entangler frees qubit b: P = A_a x P_b  ->  A_a (weight one less)
            emit(entangler(*best))
            p = frame.image(key)
        q = (p[0] | p[1]).bit_length() - 1
        emit([(g, (q,)) for g in _TO_Z[_letter(p, q)]])
        p = frame.image(key)
        sign = 1 if p[2] % 4 == 0 else -1
        out.append(op("rz", (q,), (angle * sign,)))
    out.extend(final_clifford(cliff, frame.gates, n, clifford))
    return out


def inverse(circuit):
    """``circuit`` with the inverse unitary (ops reversed, each one inverted)."""
    ops: list = []
    for o in reversed(circuit.operations):
        if o.name == "cx":
            ops.append(o)
        elif len(o.wires) == 1 and is_constant(o):
            ops.extend(canonical_1q(matrix(o).conj().T, o.wires[0]))
        else:
            raise QdiffError(f"greedy Pauli re-synthesis: cannot invert gate {o.name} on "
                             f"wires {o.wires} (constant one-qubit gates and cx only)")
    return circuit.with_operations(ops)


def greedy_pauli(circuit, seed: int = 0, cliff_weight: float = 0.1, reverse: bool = False,
                 clifford: str = "full"):
    """Pass: Circuit (one-qubit gates + CX) -> the same unitary (up to global phase) as
    greedily synthesized Pauli rotations and a Clifford (``reverse``: synthesize the inverse
    circuit and invert the result, which leaves a different Clifford; constant circuits
    only)."""
    if reverse:
        return inverse(greedy_pauli(inverse(circuit), seed, cliff_weight, False, clifford))
    n = circuit.num_wires
    rots, cliff = extract(circuit.operations, n)
    rots = [(k, a) for k, a in merge(rots)]
    return circuit.with_operations(synthesize(rots, cliff, n, seed, cliff_weight, clifford))


def windowed(circuit, width: int, offset: int = 0, variants=VARIANTS, clean=None):
    """Pass: greedy Pauli re-synthesis of consecutive windows of ``width`` CX (the first one
    ``offset`` CX wide when ``offset`` > 0), each replaced only when a variant lowers its
    ``(CX, gates)`` (ranked as synthesized; ``clean``, e.g. level 2, is applied to the best
    one). Local re-synthesis finds savings a whole-circuit one misses on arithmetic circuits,
    whose whole-circuit Clifford is expensive to write again."""
    ops = list(circuit.operations)
    out: list = []
    i, limit = 0, (offset or width)
    while i < len(ops):
        j, k = i, 0
        while j < len(ops) and (k < limit or len(ops[j].wires) == 1):
            k += len(ops[j].wires) == 2
            j += 1
        limit = width
        seg = circuit.with_operations(tuple(ops[i:j]))
        best, key = seg, (cx_count(seg.operations), len(seg.operations))
        if key[0] >= 2:
            found = None
            for v in variants:
                r = greedy_pauli(seg, *v)
                rk = (cx_count(r.operations), len(r.operations))
                if found is None or rk < found[1]:
                    found = (r, rk)
            r = found[0] if clean is None else clean(found[0])
            rk = (cx_count(r.operations), len(r.operations))
            if rk < key:
                best, key = r, rk
        out += list(best.operations)
        i = j
    return circuit.with_operations(out)
