"""PennyLane qubit operators that have no qdiff gate: calling ``qd.NAME`` raises a
:class:`QdiffError` naming the operator and what to use instead (never a silent no-op).

>>> import qdiff as qd
>>> try:
...     qd.Barrier(wires=[0, 1])
... except qd.QdiffError as e:
...     print(str(e).split(":")[0])
Barrier
"""
from __future__ import annotations

from qdiff.circuits.errors import QdiffError

#: name -> (why qdiff has no such gate, what to use instead)
REFUSED = {
    "Barrier": ("a recorded circuit carries no barriers: the simulators need none",
                "drop it; to keep the compiler from merging across a point, compile a Qiskit "
                "QuantumCircuit or an OpenQASM file with a barrier there (both keep theirs), "
                "or the two parts separately"),
    "Snapshot": ("qdiff records no intermediate states",
                 "return qd.state() (or qd.density_matrix) from a qnode that stops at that "
                 "point"),
    "WireCut": ("qdiff does no circuit cutting", "simulate the whole circuit"),
    "Projector": ("a projector is an observable, not a gate, in qdiff",
                  "qd.expval(qd.Hermitian(P, wires)) with the projector's matrix P, or a "
                  "qml.Projector inside qd.expval (it is converted)"),
    "BasisStateProjector": ("a projector is an observable, not a gate, in qdiff",
                            "qd.expval(qd.Hermitian(P, wires)) or qd.probs(wires)"),
    "StateVectorProjector": ("a projector is an observable, not a gate, in qdiff",
                             "qd.expval(qd.Hermitian(P, wires)) with P = |v><v|"),
    "SpecialUnitary": ("its parameters' generators do not commute, so it has no gate record "
                       "(one generator per parameter)",
                       "qd.QubitUnitary(torch.linalg.matrix_exp(...)) for backprop, or a "
                       "product of qd.PauliRot gates"),
    "BlockEncode": ("a block encoding is a matrix, not a gate record",
                    "qd.QubitUnitary(qml.matrix(qml.BlockEncode(A, wires)), wires)"),
    "IntegerComparator": ("qdiff has no arithmetic gates beyond QubitCarry/QubitSum",
                          "qd.QubitUnitary(qml.matrix(qml.IntegerComparator(...)), wires), or "
                          "qml.IntegerComparator inside a qdiff qnode (it is decomposed)"),
    "QubitDensityMatrix": ("a statevector circuit cannot start from a mixed state",
                           "prepare the state with gates (and channels on qd.device('mixed')), "
                           "or use qml.QubitDensityMatrix on the 'qdiff.mixed' PennyLane device"),
    "SparseHamiltonian": ("a Hamiltonian is an observable, not a gate, in qdiff",
                          "qd.Hamiltonian, qd.Hermitian or qd.PauliSumOperator"),
    "TmpPauliRot": ("it is PennyLane's internal placeholder for PauliRot", "qd.PauliRot"),
}


class Refused:
    """``qd.NAME`` for a PennyLane operator qdiff has no gate for: calling it raises."""

    def __init__(self, name: str):
        self.name = name
        self.why, self.instead = REFUSED[name]

    def __call__(self, *args, **kwargs):
        raise QdiffError(f"{self.name}: qdiff has no {self.name} ({self.why}); use instead: "
                         f"{self.instead}")

    def __repr__(self):
        return f"Refused({self.name!r})"


Barrier = Refused("Barrier")
Snapshot = Refused("Snapshot")
WireCut = Refused("WireCut")
Projector = Refused("Projector")
BasisStateProjector = Refused("BasisStateProjector")
StateVectorProjector = Refused("StateVectorProjector")
SpecialUnitary = Refused("SpecialUnitary")
BlockEncode = Refused("BlockEncode")
IntegerComparator = Refused("IntegerComparator")
QubitDensityMatrix = Refused("QubitDensityMatrix")
SparseHamiltonian = Refused("SparseHamiltonian")
TmpPauliRot = Refused("TmpPauliRot")
