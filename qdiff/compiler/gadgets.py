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
from qdiff.compiler.ops import is_constant, op
from qdiff.compiler.pauli import _as_h_s_rz

# (seed, discount_rate, depth_weight): pytket's default first, then CX-only weightings
VARIANTS = ((0, 0.7, 0.3), (0, 0.7, 0.0), (1, 0.7, 0.3), (1, 0.7, 0.0), (2, 0.7, 0.3),
            (0, 0.5, 0.0), (0, 0.9, 0.0), (3, 0.8, 0.1))
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


def greedy_pauli(circuit, seed: int = 0, discount_rate: float = 0.7,
                 depth_weight: float = 0.3):
    """Pass: Circuit (one-qubit gates + CX, constant) -> the same unitary (up to global
    phase) re-synthesized by pytket's ``GreedyPauliSimp`` with the given options."""
    from pytket.circuit import OpType
    from pytket.passes import AutoRebase, GreedyPauliSimp
    tk = to_tket(circuit)
    GreedyPauliSimp(discount_rate=discount_rate, depth_weight=depth_weight, seed=seed,
                    thread_timeout=THREAD_TIMEOUT_MS, trials=1).apply(tk)
    AutoRebase({OpType.CX, OpType.TK1}).apply(tk)  # CY, CZ, ... -> CX and one-qubit gates
    return from_tket(tk, circuit)
