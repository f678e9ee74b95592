"""Pass: collect two-qubit blocks and re-synthesize each with the optimal CX count (KAK).

A block is replaced only when the synthesis uses fewer CX than the block and reproduces its
4x4 unitary to rounding (phase-aligned distance 1e-11) (checked here, independently of the decomposer).

>>> from qdiff.circuits import Circuit
>>> from qdiff.compiler.ops import op
>>> c = Circuit(2, (op("cx", (0, 1)), op("cx", (1, 0)), op("cx", (0, 1)), op("cx", (1, 0))))
>>> sum(o.name == "cx" for o in consolidate_2q(c).operations)
2
"""
from __future__ import annotations

import numpy as np

from qdiff.compiler.budget import EXACT_DELTA, phase_distance
from qdiff.compiler.blocks import block_unitary, partition
from qdiff.compiler.synth import kak, kak_cx_count


def consolidate_2q(circuit):
    """Circuit -> Circuit; each two-qubit block with more CX than it needs is re-synthesized."""
    out = []
    for b in partition(circuit.operations, 2):
        if len(b.wires) == 2 and b.cx >= 2:
            u = b.unitary()
            need = kak_cx_count(u)
            if need < b.cx:
                new = kak(u, b.wires)
                if same_up_to_phase(block_unitary(new, b.wires), u):
                    out.extend(new)
                    continue
        out.extend(b.ops)
    return circuit.with_operations(out)


def same_up_to_phase(a: np.ndarray, b: np.ndarray, tol: float = EXACT_DELTA) -> bool:
    return phase_distance(a, b) <= tol
