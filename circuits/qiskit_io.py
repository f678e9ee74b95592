"""Conversion between qdiff circuits and ``qiskit.QuantumCircuit`` (qiskit imported lazily).

Wire ``i`` is Qiskit qubit ``i``; gates keep their argument order (Qiskit's little-endian
convention only changes how a statevector is printed, not what a gate on given qubits does).
Qiskit ``Parameter``s become theta columns; an angle ``a * p + b`` becomes ``ParamRef(i, a, b)``.

>>> from qiskit import QuantumCircuit
>>> qc = QuantumCircuit(2); _ = qc.h(0); _ = qc.cx(0, 1)
>>> from_qiskit(qc).circuit.count_ops()
{'h': 1, 'cx': 1}
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from qdiff.circuits.circuit import Circuit
from qdiff.circuits.decompositions import decompose
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.gates import GATES, unitary_gate
from qdiff.circuits.operation import Operation, ParamRef

# qiskit instruction name -> (qdiff gate name, angle transform)
FROM_QISKIT = {
    "id": "id", "x": "x", "y": "y", "z": "z", "h": "h", "s": "s", "sdg": "sdg", "t": "t",
    "tdg": "tdg", "sx": "sx", "sxdg": "sxdg", "rx": "rx", "ry": "ry", "rz": "rz", "p": "p",
    "u1": "p", "u2": "u2", "u3": "u3", "u": "u3", "cx": "cx", "cy": "cy", "cz": "cz", "ch": "ch",
    "swap": "swap", "iswap": "iswap", "ecr": "ecr", "ccx": "ccx", "cswap": "cswap", "ccz": "ccz",
    "crx": "crx", "cry": "cry", "crz": "crz", "cp": "cp", "cu1": "cp", "rxx": "rxx",
    "ryy": "ryy", "rzz": "rzz",
}
_SKIP = {"barrier", "delay"}


@dataclass
class QiskitImport:
    """Result of :func:`from_qiskit`: the circuit, Qiskit parameters in column order, and the
    trailing measurements ``[(qubit, clbit), ...]`` with the classical register size."""

    circuit: Circuit
    parameters: list = field(default_factory=list)
    measurements: list = field(default_factory=list)
    num_clbits: int = 0
    global_phase: float = 0.0


def angle_from_qiskit(value, params: dict, where: str):
    """Float, or ParamRef for an affine expression of one Qiskit Parameter."""
    from qiskit.circuit import ParameterExpression
    if not isinstance(value, ParameterExpression):
        return float(value)
    if not value.parameters:
        return float(value)
    if len(value.parameters) != 1:
        raise QdiffError(f"{where}: angle {value} depends on several parameters; only affine "
                         "expressions of one parameter are supported")
    (par,) = value.parameters
    b = float(value.bind({par: 0.0}))
    a = float(value.bind({par: 1.0})) - b
    if abs(float(value.bind({par: 0.5})) - (0.5 * a + b)) > 1e-12:
        raise QdiffError(f"{where}: angle {value} is not affine in {par}")
    if par not in params:
        params[par] = len(params)
    return ParamRef(params[par], a, b)


def from_qiskit(qc, allow_measurements: bool = True) -> QiskitImport:
    """Convert a ``QuantumCircuit``; unknown gates are expanded through their Qiskit definition."""
    ordered = {p: i for i, p in enumerate(qc.parameters)}
    ops: list = []
    meas: list = []
    qidx = {q: i for i, q in enumerate(qc.qubits)}
    cidx = {c: i for i, c in enumerate(qc.clbits)}
    _convert_into(qc, [qidx[q] for q in qc.qubits], ordered, ops, meas, cidx, allow_measurements)
    params = list(qc.parameters)
    circ = Circuit(qc.num_qubits, tuple(ops), (), len(params))
    return QiskitImport(circ, params, meas, qc.num_clbits, float(qc.global_phase)
                        if not hasattr(qc.global_phase, "parameters") else 0.0)


def _convert_into(qc, qmap, params, ops, meas, cidx_top, allow_meas):
    local_q = {q: qmap[i] for i, q in enumerate(qc.qubits)}
    for k, inst in enumerate(qc.data):
        op = inst.operation
        name = op.name
        qubits = tuple(local_q[q] for q in inst.qubits)
        where = f"instruction {k} ('{name}' on qubits {list(qubits)})"
        if getattr(op, "condition", None) is not None or name in ("if_else", "while_loop",
                                                                   "for_loop", "switch_case"):
            raise QdiffError(f"{where}: classically controlled operations are not supported")
        if name in _SKIP:
            continue
        if name == "measure":
            if not allow_meas:
                raise QdiffError(f"{where}: mid-circuit measurement is not supported")
            meas.append((qubits[0], cidx_top.get(inst.clbits[0], 0)))
            continue
        if name == "reset":
            raise QdiffError(f"{where}: reset is not supported")
        if meas and set(qubits) & {q for q, _ in meas}:
            raise QdiffError(f"{where}: gate on a measured qubit (mid-circuit measurement) "
                             "is not supported")
        if name in FROM_QISKIT:
            gate = GATES[FROM_QISKIT[name]]
            angles = tuple(angle_from_qiskit(v, params, where) for v in op.params)
            ops.append(Operation(gate, qubits, angles))
        elif name == "unitary":
            ops.append(Operation(unitary_gate(np.asarray(op.to_matrix())[_le_to_be(len(qubits))]
                                              [:, _le_to_be(len(qubits))]), qubits, ()))
        elif op.definition is not None:
            _convert_into(op.definition, list(qubits), params, ops, meas, cidx_top, False)
        else:
            raise QdiffError(f"{where}: unknown gate '{name}' with no definition")


def _le_to_be(k: int) -> np.ndarray:
    """Index permutation reversing the bit order of k-bit indices."""
    idx = np.arange(2 ** k)
    rev = np.zeros_like(idx)
    for b in range(k):
        rev |= ((idx >> b) & 1) << (k - 1 - b)
    return rev


_TO_QISKIT_METHOD = {
    "id": "id", "x": "x", "y": "y", "z": "z", "h": "h", "s": "s", "sdg": "sdg", "t": "t",
    "tdg": "tdg", "sx": "sx", "sxdg": "sxdg", "rx": "rx", "ry": "ry", "rz": "rz", "p": "p",
    "u1": "p", "u3": "u", "cx": "cx", "cy": "cy", "cz": "cz", "ch": "ch", "swap": "swap",
    "iswap": "iswap", "ecr": "ecr", "ccx": "ccx", "cswap": "cswap", "ccz": "ccz", "crx": "crx",
    "cry": "cry", "crz": "crz", "cp": "cp", "rxx": "rxx", "ryy": "ryy", "rzz": "rzz",
}


def to_qiskit(circuit: Circuit, theta=None, measure: bool = False):
    """A ``QuantumCircuit``; theta columns become a ``ParameterVector('theta', P)`` unless
    ``theta`` (a ``(P,)`` or ``(1, P)`` tensor/array) binds them. ``measure`` adds final measures."""
    from qiskit import QuantumCircuit
    from qiskit.circuit import ParameterVector
    pv = ParameterVector("theta", circuit.num_params) if circuit.num_params else []
    values = None
    if theta is not None:
        values = np.asarray(theta.detach().cpu() if hasattr(theta, "detach") else theta,
                            dtype=float).reshape(-1)
        if values.size != circuit.num_params:
            raise QdiffError(f"to_qiskit: theta has {values.size} values for "
                             f"{circuit.num_params} parameters")
    qc = QuantumCircuit(circuit.num_wires, circuit.num_wires if measure else 0)

    def val(p):
        if isinstance(p, ParamRef):
            base = values[p.index] if values is not None else pv[p.index]
            return p.scale * base + p.offset
        return float(p)

    def emit(op):
        if op.name == "iswapdg":
            qc.append(_iswap_dg(), list(op.wires))
            return
        if op.name == "u2":
            qc.u(math.pi / 2, val(op.params[0]), val(op.params[1]), op.wires[0])
            return
        if op.name == "unitary":
            from qiskit.circuit.library import UnitaryGate
            m = np.asarray(op.gate.hyper[0].detach().cpu())
            perm = _le_to_be(len(op.wires))
            qc.append(UnitaryGate(m[perm][:, perm]), list(op.wires))
            return
        meth = _TO_QISKIT_METHOD.get(op.name)
        if meth is None:
            for sub in decompose(op):
                emit(sub)
            return
        getattr(qc, meth)(*[val(p) for p in op.params], *op.wires)

    for op in circuit.operations:
        emit(op)
    if measure:
        qc.measure(range(circuit.num_wires), range(circuit.num_wires))
    return qc


def _iswap_dg():
    from qiskit.circuit.library import iSwapGate
    return iSwapGate().inverse()
