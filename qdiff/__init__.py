"""qdiff: a hybrid quantum-classical differentiable stack on torch.

>>> import torch, qdiff as qd
>>> dev = qd.device("statevector", wires=2)
>>> @qd.qnode(dev)
... def bell(theta):
...     qd.RY(theta, wires=0); qd.CNOT(wires=[0, 1])
...     return qd.expval(qd.Z(0) @ qd.Z(1))
>>> float(bell(torch.tensor(0.3)))
1.0
"""
from qdiff.circuits.errors import QdiffError, QdiffMemoryError, QdiffParseError
from qdiff.circuits.gates import GATES as _GATES, MultiRZ, PauliRot, QubitUnitary, Gate, \
    get_gate, register_gate, unregister_gate
from qdiff.circuits.operation import Operation, ParamRef
from qdiff.circuits.circuit import Circuit
from qdiff.circuits.observables import Hamiltonian, Hermitian, Observable
from qdiff.circuits.measurements import counts, expval, probs, sample, state, var
from qdiff.circuits.recording import record
from qdiff.circuits.caches import clear as clear_caches
from qdiff.circuits.templates import (AllSinglesDoubles, AmplitudeEmbedding, AngleEmbedding,
                                      BasicEntanglerLayers, BasisState, HardwareEfficientAnsatz,
                                      QAOALayers, StatePrep, StronglyEntanglingLayers, cost_layer,
                                      excitations, hf_state, mixer_layer, x_mixer)
from qdiff.backends.base import Backend
from qdiff.backends.registry import device
from qdiff.backends.statevector.native_lib import native_status
from qdiff.qnode import QNode, qnode
from qdiff.draw import draw
from qdiff.hybrid import QuantumLayer
from qdiff.compiler import compile  # noqa: A001  (shadows the builtin inside this module only)

__version__ = "0.1.0"

# Gates under PennyLane's class names and short aliases (qd.RX, qd.CNOT, qd.H, qd.CX, ...).
for _g in _GATES.values():
    if _g.pl_name and _g.pl_name.isidentifier():
        globals()[_g.pl_name] = _g
I, X, Y, Z, H = Identity, PauliX, PauliY, PauliZ, Hadamard  # noqa: F821
CX, CCX, CPhase, iSWAP = CNOT, Toffoli, ControlledPhaseShift, ISWAP  # noqa: F821
Rxx, Ryy, Rzz = IsingXX, IsingYY, IsingZZ  # noqa: F821
del _g

# classical kernels: Pauli-sum operators, eigen/linear solvers, chemistry
from qdiff.operators import PauliSumOperator  # noqa: E402
from qdiff.solvers import SolverInfo, cg, eigsh, ground_state, lanczos, minres  # noqa: E402
from qdiff import qchem  # noqa: E402
from qdiff.metric import metric_tensor  # noqa: E402
from qdiff.optimize import QNGOptimizer  # noqa: E402
