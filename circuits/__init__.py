"""The circuit IR: gates, operations, circuits, observables, measurements, templates, QASM I/O."""
from qdiff.circuits.errors import QdiffError, QdiffMemoryError, QdiffParseError
from qdiff.circuits.gates import GATES, Gate, get_gate, register_gate
from qdiff.circuits.operation import Operation, ParamRef
from qdiff.circuits.circuit import Circuit, Recorded, StatePrep
from qdiff.circuits.observables import Hamiltonian, Hermitian, Observable
from qdiff.circuits.measurements import Measurement
from qdiff.circuits.recording import record

__all__ = ["QdiffError", "QdiffMemoryError", "QdiffParseError", "GATES", "Gate", "get_gate",
           "register_gate", "Operation", "ParamRef", "Circuit", "Recorded", "StatePrep",
           "Hamiltonian", "Hermitian", "Observable", "Measurement", "record"]
