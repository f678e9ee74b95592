"""Pass (level 3): greedy Pauli-gadget re-synthesis of the whole circuit by pytket.

The circuit (one-qubit gates + CX, constant angles) is read as a sequence of Pauli
exponentials (rotations about Pauli strings, commuting ones merged: phase folding) followed by
one Clifford, and re-synthesized by pytket's ``GreedyPauliSimp``: at each step the two-qubit
Clifford that most lightens the next rotations (discounted by distance) *and* the remaining
Clifford tableau is applied, so the final Clifford is reduced along the way instead of being
synthesized from scratch at the end (Martiel and Goubault de Brugiere, arXiv:2103.08602 and
arXiv:2305.10966). It is the strongest of the level-3 strategies on chemistry, Trotter and
oracle circuits; level 3 runs a few deterministic variants (seed, discount rate, depth
weight) and keeps the smallest verified result.

The search is bounded by its candidate and lookahead limits, not by time: pytket's
per-solution thread timeout is set far above anything these limits allow, so the same input
gives the same output on any machine load.

>>> from qdiff.circuits import Circuit
>>> from qdiff.compiler.ops import op
>>> c = Circuit(2, (op("cx", (0, 1)), op("rz", (1,), (0.3,)), op("cx", (0, 1)),
...                 op("cx", (0, 1)), op("rz", (1,), (0.4,)), op("cx", (0, 1))))
>>> sum(o.name == "cx" for o in greedy_pauli(c).operations)
2
"""
from __future__ import annotations

import math

import numpy as np

from qdiff.circuits.errors import QdiffError
from qdiff.compiler.fuse import canonical_1q
from qdiff.compiler.ops import cx_count, is_constant, matrix, op
from qdiff.compiler.pauli import _as_h_s_rz

# (seed, discount_rate, depth_weight, reverse): pytket's default first, then CX-only
# weightings; each also on the inverse circuit (a different final Clifford to reduce)
_FORWARD = ((0, 0.7, 0.3), (0, 0.7, 0.0), (1, 0.7, 0.3), (1, 0.7, 0.0), (2, 0.7, 0.3),
            (0, 0.5, 0.0), (0, 0.9, 0.0), (3, 0.8, 0.1))
VARIANTS = tuple(v + (False,) for v in _FORWARD) + tuple(v + (True,) for v in _FORWARD)
THREAD_TIMEOUT_MS = 2**31 - 1  # never reached: the search is bounded by its work limits


def to_tket(circuit):
    """A pytket circuit over H, S, Rz and CX (constant angles only)."""
    from pytket.circuit import Circuit as TkCircuit
    tk = TkCircuit(circuit.num_wires)
    for o in circuit.operations:
        if not is_constant(o):
            raise QdiffError(f"greedy Pauli re-synthesis: gate {o.name} on wires {o.wires} "
                             "has a symbolic angle (constant circuits only)")
        if o.name == "cx":
            tk.CX(*o.wires)
        elif len(o.wires) == 1:  # Cliffords as H and S (tableau updates), the rest as Rz
            q = o.wires[0]
            for g, a in _as_h_s_rz(o):
                if g == "h":
                    tk.H(q)
                elif g == "s":
                    tk.S(q)
                else:
                    tk.Rz(float(a) / math.pi, q)
        else:
            raise QdiffError(f"greedy Pauli re-synthesis: gate {o.name} on wires {o.wires}: "
                             "expected one-qubit gates and cx (lower the circuit first)")
    return tk


def from_tket(tk, circuit):
    """``circuit`` with the operations of the pytket circuit ``tk`` (same qubit order)."""
    from pytket.circuit import OpType
    tk.replace_implicit_wire_swaps()
    index = {q: i for i, q in enumerate(tk.qubits)}
    ops: list = []
    for cmd in tk.get_commands():
        w = tuple(index[q] for q in cmd.qubits)
        t = cmd.op.type
        if t == OpType.CX:
            ops.append(op("cx", w))
        elif len(w) == 1:
            ops.extend(canonical_1q(np.asarray(cmd.op.get_unitary(), dtype=complex), w[0]))
        elif t == OpType.CZ:
            ops += [op("h", (w[1],)), op("cx", w), op("h", (w[1],))]
        elif t == OpType.SWAP:
            ops += [op("cx", w), op("cx", w[::-1]), op("cx", w)]
        else:
            raise QdiffError(f"greedy Pauli re-synthesis: pytket returned {t.name} on {w}")
    return circuit.with_operations(ops)


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


def greedy_pauli(circuit, seed: int = 0, discount_rate: float = 0.7,
                 depth_weight: float = 0.3, reverse: bool = False):
    """Pass: Circuit (one-qubit gates + CX, constant) -> the same unitary (up to global
    phase) re-synthesized by pytket's ``GreedyPauliSimp`` with the given options
    (``reverse``: re-synthesize the inverse circuit and invert the result, which leaves a
    different final Clifford to the greedy reduction)."""
    if reverse:
        return inverse(greedy_pauli(inverse(circuit), seed, discount_rate, depth_weight))
    from pytket.circuit import OpType
    from pytket.passes import AutoRebase, GreedyPauliSimp
    tk = to_tket(circuit)
    GreedyPauliSimp(discount_rate=discount_rate, depth_weight=depth_weight, seed=seed,
                    thread_timeout=THREAD_TIMEOUT_MS, trials=1).apply(tk)
    AutoRebase({OpType.CX, OpType.TK1}).apply(tk)  # CY, CZ, ... -> CX and one-qubit gates
    return from_tket(tk, circuit)


def windowed(circuit, width: int, offset: int = 0, variants=VARIANTS, clean=None):
    """Pass: greedy Pauli re-synthesis of consecutive windows of ``width`` CX (the first one
    ``offset`` CX wide when ``offset`` > 0), each replaced only when a variant lowers its
    ``(CX, gates)``. Local re-synthesis finds the savings that a whole-circuit one misses on
    arithmetic circuits, whose whole-circuit Clifford is expensive to write again.
    ``clean``: a pass applied to each re-synthesized window (e.g. level 2)."""
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
            for v in variants:  # ranked as synthesized; only the best one is cleaned
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
