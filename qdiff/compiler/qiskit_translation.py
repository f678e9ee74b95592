"""Qiskit's basis translation onto the lowering basis (one-qubit gates and CX), shared by the
lowering and the synthesis passes."""
from __future__ import annotations

from qdiff.circuits import caches

QISKIT_BASIS = ["cx", "u3", "u", "rz", "rx", "ry", "h", "x", "y", "z", "s", "sdg", "t", "tdg",
                "sx", "sxdg", "p", "id"]


@caches.cached(maxsize=1)
def _translator():
    """Qiskit's unitary synthesis, high-level synthesis and basis translation (its equivalence
    library) as one pass manager: what ``transpile(optimization_level=0)`` runs for this,
    without building the preset pass managers (whose plugin scan imports
    qiskit-ibm-runtime, several seconds)."""
    from qiskit.circuit.equivalence_library import SessionEquivalenceLibrary
    from qiskit.transpiler import PassManager
    from qiskit.transpiler.passes import BasisTranslator, HighLevelSynthesis, UnitarySynthesis
    return PassManager([UnitarySynthesis(QISKIT_BASIS),
                        HighLevelSynthesis(basis_gates=QISKIT_BASIS),
                        BasisTranslator(SessionEquivalenceLibrary, QISKIT_BASIS)])


def qiskit_basis_translation(qc):
    """A Qiskit circuit rewritten over the lowering basis (synthesis plugins + equivalences)."""
    return _translator().run(qc)
