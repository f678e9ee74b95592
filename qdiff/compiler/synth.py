"""Exact synthesis helpers: Qiskit's KAK (two qubits) and Shannon decomposition (more).

Matrices are big-endian in the order of ``wires`` (qdiff's convention); Qiskit reads them
little-endian, so Qiskit qubit ``i`` is ``wires[k - 1 - i]``.
"""
from __future__ import annotations


import numpy as np

from qdiff.circuits import caches
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.gates import get_gate
from qdiff.compiler.ops import op


@caches.cached(maxsize=1)
def _kak():
    from qiskit.circuit.library import CXGate
    from qiskit.synthesis import TwoQubitBasisDecomposer
    return TwoQubitBasisDecomposer(CXGate())


def kak_cx_count(u: np.ndarray) -> int:
    return int(_kak().num_basis_gates(u))


def kak(u: np.ndarray, wires) -> list:
    """Optimal (<= 3 CX) circuit for a 4x4 unitary ``u`` on ``wires``."""
    return from_qiskit_ops(_kak()(u), wires)


def shannon(u: np.ndarray, wires) -> list:
    """Quantum Shannon decomposition of a ``2**k`` unitary (k >= 3), then basis cx/u3 by
    Qiskit's basis translation (not ``transpile``, whose first call loads every plugin)."""
    from qiskit.synthesis import qs_decomposition
    from qdiff.compiler.lower import qiskit_basis_translation
    return from_qiskit_ops(qiskit_basis_translation(qs_decomposition(u)), wires)


def from_qiskit_ops(qc, wires) -> list:
    """Qiskit instructions as qdiff ops on ``wires`` (gates looked up in the registry)."""
    k = len(wires)
    out = []
    for inst in qc.data:
        try:
            name = get_gate(inst.operation.name).name
        except QdiffError:
            raise QdiffError(f"synthesis produced unexpected gate '{inst.operation.name}'") \
                from None
        ws = tuple(wires[k - 1 - qc.find_bit(q).index] for q in inst.qubits)
        out.append(op(name, ws, tuple(float(p) for p in inst.operation.params)))
    return out
