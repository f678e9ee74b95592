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
from typing import Any, Optional

import numpy as np
import torch

from qdiff.circuits import caches
from qdiff.circuits.circuit import Circuit
from qdiff.circuits.decompositions import decompose
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.gates import GATES, unitary_gate
from qdiff.circuits.observables import Factor, Observable, as_observable
from qdiff.circuits.operation import Operation, ParamRef
from qdiff.circuits.qiskit_dynamic import (Bits, bind_parameter, condition_cubes,
                                           final_measurements, switch_cubes)
from qdiff.circuits.qiskit_expr import ExpressionTable, analyse

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
# control flow and classical instructions: refused, each with what it is
_CLASSICAL = {
    "if_else": "classically controlled operations are not supported",
    "while_loop": "classically controlled operations are not supported",
    "switch_case": "classically controlled operations are not supported",
    "for_loop": "control flow (for_loop) is not supported; unroll the loop first "
                "(qiskit.transpiler.passes.UnrollForLoops)",
    "box": "control flow (box) is not supported; append its body instead",
    "store": "classical variables (store) are not supported",
    "break_loop": "control flow (break_loop) is not supported",
    "continue_loop": "control flow (continue_loop) is not supported",
}
# noise instructions (a Kraus / SuperOp appended, Aer's QuantumError.to_instruction()): refused
_NOISE = {"kraus", "superop", "quantum_channel"}
_NOISE_HINT = ("is a noise channel, not a gate: a Qiskit circuit imports its gates only; "
               "run noise on qd.device('mixed', noise=<Aer NoiseModel or qdiff noise model>), "
               "or write the channel in a qnode (qd.QubitChannel(kraus, wires))")
_DYNAMIC = {"if_else", "switch_case", "for_loop", "while_loop"}  # run by deferred measurement
_WHILE = ("control flow (while_loop) is not supported: the number of its iterations depends on "
          "measurement outcomes (unbounded); deferred measurement needs a fixed circuit")
# XXPlusYYGate(theta, beta) with a constant beta that makes it one qdiff gate:
# beta -> (qdiff gate, factor on theta) (checked against the matrices in tests/test_gates.py)
_XX_PLUS_YY = {0.0: ("isingxy", -1.0), -math.pi / 2: ("single_excitation", 1.0),
               math.pi / 2: ("single_excitation", -1.0)}


@dataclass
class QiskitImport:
    """Result of :func:`from_qiskit`: the circuit, Qiskit parameters in column order, and the
    trailing measurements ``[(qubit, clbit), ...]`` with the number of classical bits and the
    classical registers ``[(name, [clbit, ...])]``. A dynamic circuit's deferred measurements
    are ``(extra wire, clbit)`` entries (wires from :attr:`num_qubits` on).

    ``circuit`` has ``len(parameters) + len(expressions)`` theta columns: one per parameter,
    then one per distinct non-affine angle expression (``expressions``, evaluated in torch from
    the parameter columns by :meth:`theta`). Run it with bindings through ``qd.qnode(dev)(imp)``.
    """

    circuit: Circuit
    parameters: list = field(default_factory=list)
    measurements: list = field(default_factory=list)
    num_clbits: int = 0
    global_phase: Any = 0.0  # a float, or the circuit's ParameterExpression of its parameters
    expressions: Optional[ExpressionTable] = None
    registers: list = field(default_factory=list)  # [(name, [clbit, ...])] classical registers
    delays: int = 0  # delays of nonzero duration left out (the identity, without noise)

    @property
    def num_qubits(self) -> int:
        """The Qiskit circuit's qubits: the circuit's wires less the extra wires of deferred
        measurements (``MidWire`` labels, after the qubits)."""
        c = self.circuit
        if c.wire_labels is None:
            return c.num_wires
        from qdiff.circuits.midcircuit import is_mid_wire
        return sum(1 for w in c.wire_labels if not is_mid_wire(w))

    @property
    def num_expressions(self) -> int:
        return 0 if self.expressions is None else len(self.expressions)

    def columns(self) -> list:
        """The Qiskit object (``Parameter`` or ``ParameterExpression``) of every theta column."""
        extra = [] if self.expressions is None else list(self.expressions.expressions)
        return list(self.parameters) + extra

    def theta(self, values: torch.Tensor) -> torch.Tensor:
        """``(B, len(parameters))`` parameter values -> the circuit's ``(B, P)`` theta (the
        expression columns computed in torch, so gradients reach ``values``)."""
        if values.ndim != 2 or values.shape[1] != len(self.parameters):
            raise QdiffError(f"parameter values have shape {tuple(values.shape)}; expected "
                             f"(B, {len(self.parameters)})")
        if not self.num_expressions:
            return values
        return torch.cat([values, self.expressions.evaluate(values)], dim=1)


def is_quantum_circuit(obj) -> bool:
    """Whether ``obj`` is a ``qiskit.QuantumCircuit``, a subclass included (the library's
    ``QFT``, ``RealAmplitudes``, ``EfficientSU2``, ... classes); without importing qiskit when
    the caller never did (such an object cannot exist then)."""
    import sys
    module = sys.modules.get("qiskit.circuit")
    return module is not None and isinstance(obj, module.QuantumCircuit)


def angle_from_qiskit(value, params: dict, where: str):
    """Float, or ``ParamRef`` for an expression affine in one Qiskit Parameter (columns from
    ``params``, extended in place); any other expression is an error. For callers that need
    affine angles only (gate decompositions); :func:`from_qiskit` accepts every expression."""
    from qiskit.circuit import ParameterExpression
    if not isinstance(value, ParameterExpression) or not value.parameters:
        return float(value)
    kind, *rest = analyse(value, where)
    if kind == "const":
        return rest[0]
    if kind != "affine":
        raise QdiffError(f"{where}: angle {value} is not affine in one parameter")
    par, a, b = rest
    if par not in params:
        params[par] = len(params)
    return ParamRef(params[par], a, b)


class _Importer:
    """State of one conversion: parameter columns, the expression table, the output lists;
    for a dynamic circuit the extra wires of deferred measurements (``source``: classical bit
    -> the wire holding its value) and the depth of control-flow bodies."""

    def __init__(self, qc, allow_measurements: bool, dynamic: bool = False):
        self.params = {p: i for i, p in enumerate(qc.parameters)}
        self.table = ExpressionTable(self.params)
        self.ops: list = []
        self.meas: list = []
        self.cidx = {c: i for i, c in enumerate(qc.clbits)}
        self.allow_meas = allow_measurements
        self.dynamic = dynamic
        self.nq = qc.num_qubits
        self.extra = 0
        self.delays = 0
        self.barriers: list = []  # (position, wires) of the top level's barriers
        self.source: dict = {}
        self.depth = 0
        self.phase = 0.0  # the global phases of the definitions expanded (outside conditions)
        self._qc, self._final = qc, None

    def final(self, k: int) -> bool:
        """Whether top-level instruction ``k`` (a measure) is a final measurement."""
        if self._final is None:
            self._final = final_measurements(self._qc)
        return k in self._final

    def new_wire(self) -> int:
        self.extra += 1
        return self.nq + self.extra - 1

    def angle(self, value, where: str):
        """Float, ``ParamRef`` (affine in one parameter) or the column of an expression."""
        from qiskit.circuit import Parameter, ParameterExpression
        if not isinstance(value, ParameterExpression):
            v = float(value)
            if not math.isfinite(v):
                raise QdiffError(f"{where}: angle {value} is NaN or infinite")
            return v
        if isinstance(value, Parameter):
            return ParamRef(self._column(value, where))
        kind, *rest = analyse(value, where)
        if kind == "const":
            return rest[0]
        if kind == "affine":
            par, a, b = rest
            return ParamRef(self._column(par, where), a, b)
        return ParamRef(len(self.params) + self.table.add(value, where))

    def _column(self, par, where: str) -> int:
        if par not in self.params:
            raise QdiffError(f"{where}: parameter {par} is not a parameter of the circuit")
        return self.params[par]


def from_qiskit(qc, allow_measurements: bool = True, dynamic: bool = True) -> QiskitImport:
    """Convert a ``QuantumCircuit``; unknown gates are expanded through their Qiskit definition.
    Angles affine in one parameter become ``ParamRef`` s; any other parameter expression becomes
    a theta column evaluated in torch (see :mod:`qdiff.circuits.qiskit_expr`).

    With ``dynamic`` (default), mid-circuit measurements, resets, ``if_test`` / ``if_else`` /
    ``switch`` and ``for_loop`` run by deferred measurement (:mod:`qdiff.circuits.qiskit_dynamic`):
    the circuit gets one extra wire (a ``MidWire`` label) per deferred measurement or reset after
    its qubits, and ``measurements`` lists ``(wire, clbit)`` in program order, the wire an extra
    wire for a deferred measurement (a classical bit holds the value of its last entry)."""
    imp = _Importer(qc, allow_measurements, dynamic)
    qidx = {q: i for i, q in enumerate(qc.qubits)}
    _convert_into(qc, [qidx[q] for q in qc.qubits], imp, True)
    params = list(qc.parameters)
    table = imp.table if len(imp.table) else None
    labels = None
    if imp.extra:
        labels = _deferred_labels(imp)
    circ = Circuit(qc.num_qubits + imp.extra, tuple(imp.ops), (), len(params) + len(imp.table),
                   labels, tuple(imp.barriers))
    phase = qc.global_phase + imp.phase
    cidx = {c: i for i, c in enumerate(qc.clbits)}
    registers = [(r.name, [cidx[b] for b in r]) for r in qc.cregs]
    if not getattr(phase, "parameters", None):
        phase = float(phase)
        if not math.isfinite(phase):
            raise QdiffError(f"the circuit's global phase (gphase) {phase} is NaN or infinite")
    return QiskitImport(circ, params, imp.meas, qc.num_clbits, phase, table, registers,
                        imp.delays)


def _nonzero_duration(op) -> bool:
    """Whether a delay lasts (a parametrized duration counts: it may)."""
    try:
        return float(op.params[0]) != 0.0
    except (TypeError, ValueError, IndexError):
        return True


def _deferred_labels(imp: _Importer) -> tuple:
    """Wire labels of a dynamic import (its qubits, then one ``MidWire`` per extra wire), after
    checking that the deferred state fits in memory."""
    from qdiff.circuits import memory
    from qdiff.circuits.midcircuit import MidWire
    busy = len({w for op in imp.ops for w in op.wires if w < imp.nq})
    n = busy + imp.extra
    memory.require(4 * 16.0 * 2.0 ** n,  # the engine's working states (simulate.check_memory)
                   f"deferred measurement of a dynamic circuit ({busy} qubit(s) in use and "
                   f"{imp.extra} extra wire(s), one per mid-circuit measurement or reset: 4 "
                   f"states of {n} qubits)")
    return tuple(range(imp.nq)) + tuple(MidWire(i) for i in range(imp.extra))


def _convert_into(qc, qmap, imp: _Importer, top: bool, bits: Optional[Bits] = None):
    local_q = {q: qmap[i] for i, q in enumerate(qc.qubits)}
    if not top and not imp.depth:  # a phase under a classical condition is unobservable
        imp.phase = imp.phase + qc.global_phase
    if bits is None:
        bits = Bits(imp.cidx) if top else Bits({})  # read only
    ops, meas = imp.ops, imp.meas
    for k, inst in enumerate(qc.data):
        op = inst.operation
        name = op.name
        qubits = tuple(local_q[q] for q in inst.qubits)
        where = f"instruction {k} ('{name}' on qubits {list(qubits)})"
        if imp.dynamic and name in _DYNAMIC:
            _control_flow(inst, qubits, bits, imp, where)
            continue
        if getattr(op, "condition", None) is not None or name in _CLASSICAL:
            raise QdiffError(f"{where}: {_CLASSICAL.get(name, _CLASSICAL['if_else'])}")
        if name in _NOISE:
            raise QdiffError(f"{where}: '{name}' {_NOISE_HINT}")
        if name in _SKIP:
            if name == "delay" and _nonzero_duration(op):
                imp.delays += 1
            elif name == "barrier" and top and not imp.depth and qubits:
                imp.barriers.append((len(ops), qubits))  # where it stands, for the exporters
            continue
        if imp.dynamic and name in ("measure", "reset"):
            if name == "measure" and top and imp.allow_meas and imp.final(k):
                meas.append((qubits[0], imp.cidx[inst.clbits[0]]))  # read at the end
            else:
                _measure_or_reset(inst, qubits, bits, imp, where)
            continue
        if name == "measure":
            if not (imp.allow_meas and top):
                raise QdiffError(f"{where}: mid-circuit measurement is not supported")
            meas.append((qubits[0], imp.cidx.get(inst.clbits[0], 0)))
            continue
        if name == "reset":
            if any(qubits[0] in o.wires for o in ops) or qubits[0] in {q for q, _ in meas}:
                raise QdiffError(f"{where}: reset of a qubit after operations on it is not "
                                 "supported")
            continue  # a qubit still in |0> (as qc.initialize() writes it): the identity
        if meas and set(qubits) & {q for q, _ in meas}:
            raise QdiffError(f"{where}: gate on a measured qubit (mid-circuit measurement) "
                             "is not supported")
        xy = _xx_plus_yy(op, name)
        if xy is not None:
            gate, factor = xy
            if not imp.depth:
                imp.phase = imp.phase + _standard_phase(op, name)
            theta = imp.angle(op.params[0], where)
            ops.append(Operation(GATES[gate], qubits, (-theta if factor < 0 else theta,)))
        elif name in FROM_QISKIT and (std_phase := _standard_phase(op, name)) is not None:
            if std_phase and not imp.depth:  # a user definition's phase over the standard gate
                imp.phase = imp.phase + std_phase
            gate = GATES[FROM_QISKIT[name]]
            ops.append(Operation(gate, qubits, tuple(imp.angle(v, where) for v in op.params)))
        elif _is_unitary_gate(op):
            ops.append(_matrix_operation(op.to_matrix(), qubits, where))
        elif name == "PauliEvolution" and hasattr(op, "operator"):
            _pauli_evolution(op, qubits, imp, where)
        elif name == "annotated" and hasattr(op, "modifiers"):
            _convert_into(_unannotated(op, where), list(qubits), imp, False)
        elif name == "hamiltonian" and _free_parameters(op.params[-1:]):
            _hamiltonian_evolution(op, qubits, imp, where)
        elif _definition(op, where) is not None:
            _convert_into(op.definition, list(qubits), imp, False,
                          bits.body(op.definition, inst.clbits) if inst.clbits else None)
        else:
            ops.append(_matrix_operation(_operator_matrix(op, qubits, where), qubits, where))


def _measure_or_reset(inst, qubits: tuple, bits: Bits, imp: _Importer, where: str) -> None:
    """A measurement that is not final or a reset, in a dynamic circuit: deferred onto a fresh
    extra wire (a reset then CNOTs the wire back onto its qubit); a top-level reset of a qubit
    nothing has acted on yet is the identity."""
    from qdiff.circuits.midcircuit import measurement_ops
    q = qubits[0]
    if inst.name == "measure":
        if not imp.allow_meas:
            raise QdiffError(f"{where}: mid-circuit measurement is not supported")
        c = bits.of(inst.clbits[0], where)
        w = imp.new_wire()
        imp.ops.extend(measurement_ops(q, w, False))
        imp.meas.append((w, c))
        imp.source[c] = w
        return
    if imp.depth == 0 and not any(q in o.wires for o in imp.ops) and \
            q not in {m for m, _ in imp.meas}:
        return  # a qubit still in |0> (as qc.initialize() writes it): the identity
    imp.ops.extend(measurement_ops(q, imp.new_wire(), True))


def _control_flow(inst, qubits: tuple, bits: Bits, imp: _Importer, where: str) -> None:
    """``if_else`` / ``switch_case`` bodies controlled by the wires their condition reads;
    ``for_loop`` unrolled; ``while_loop`` refused."""
    op = inst.operation
    name = op.name
    if name == "while_loop":
        raise QdiffError(f"{where}: {_WHILE}")
    if name == "for_loop":
        indexset, loop_param, body = op.params
        inner = bits.body(body, inst.clbits)
        bind = loop_param is not None and loop_param in set(body.parameters)
        for value in indexset:
            b = bind_parameter(body, loop_param, value) if bind else body
            _convert_into(b, list(qubits), imp, False, inner)
        return
    if name == "if_else":
        yes, no = condition_cubes(op.condition, bits, imp.source, where)
        branches = [(op.blocks[0], yes, no)]
        if len(op.blocks) > 1 and op.blocks[1] is not None:
            branches.append((op.blocks[1], no, yes))
    else:  # switch_case: the cases' conditions read the target before any case runs
        cases = list(op.cases_specifier())
        cubes = switch_cubes(op.target, [v for v, _ in cases], bits, imp.source, where)
        branches = [(body, c[0], c[1]) for (_, body), c in zip(cases, cubes)]
    for body, cubes, negated in branches:
        _controlled_body(body, qubits, bits.body(body, inst.clbits), imp, cubes, negated)


def _controlled_body(body, qubits: tuple, bits: Bits, imp: _Importer, cubes: list,
                     negated: list) -> None:
    """Convert ``body`` and apply its operations controlled on each cube; a classical bit
    measured in it keeps its previous value (copied onto the new wire) where the condition
    does not hold. Inside another body the operations stay ``(operation, cube)`` pairs, so
    nested conditions merge into one cube (a wire read by both is one control)."""
    outer, before = imp.ops, dict(imp.source)
    imp.ops = []
    imp.depth += 1
    try:
        _convert_into(body, list(qubits), imp, False, bits)
        inner = imp.ops
    finally:
        imp.ops = outer
        imp.depth -= 1
    items = []
    for cube in cubes:
        for it in inner:
            op, own = it if isinstance(it, tuple) else (it, ())
            merged = _merge_cubes(cube, own)
            if merged is not None:
                items.append((op, merged))
    for c, w in imp.source.items():
        old = before.get(c)
        if old is not None and old != w:
            items.extend((Operation(GATES["cx"], (old, w), ()), cube) for cube in negated)
    if imp.depth:
        outer.extend(items)
    else:
        for op, cube in items:
            outer.extend(_conditioned(op, cube))


def _merge_cubes(a: tuple, b: tuple):
    """The cube where both hold (None when they ask a wire for different values)."""
    out = dict(a)
    for w, v in b:
        if out.setdefault(w, v) != v:
            return None
    return tuple(sorted(out.items()))


def _conditioned(op: Operation, cube: tuple) -> list:
    """``op`` applied where the extra wires hold the cube's values; the copy of a wire the cube
    fixes (``cx(old, new)``) is an X on the new wire under the cube, or nothing."""
    from qdiff.circuits.midcircuit import controlled_by
    fixed = dict(cube)
    if op.name == "cx" and op.wires[0] in fixed:
        if not fixed[op.wires[0]]:
            return []
        op = Operation(GATES["x"], (op.wires[1],), ())
    if not fixed:
        return [op]
    ws = tuple(fixed)
    return controlled_by(op, ws, tuple(fixed[w] for w in ws))


def _pauli_evolution(op, qubits: tuple, imp: _Importer, where: str) -> None:
    """A ``PauliEvolutionGate`` as Qiskit's ``Operator``/``Statevector`` evaluate it: exactly
    ``exp(-i t H)``. Commuting terms: a product formula, exact (the gate's own when it is a
    deterministic one). Otherwise its definition only approximates ``exp(-i t H)``: a numeric
    time gives the exact matrix; a parameter time is refused."""
    from qiskit.circuit import ParameterExpression
    from qiskit.synthesis import LieTrotter, ProductFormula, QDrift
    terms = [_sparse_pauli_op(o, where)
             for o in (op.operator if isinstance(op.operator, list) else [op.operator])]
    synthesis = getattr(op, "synthesis", None)
    if _paulis_commute(terms):
        if isinstance(synthesis, ProductFormula) and not isinstance(synthesis, QDrift):
            body = op.definition
        else:  # QDrift samples terms at random; a matrix exponential needs a numeric time
            body = LieTrotter().synthesize(op)
        _convert_into(body, list(qubits), imp, False)
        return
    time = op.params[0]
    if isinstance(time, ParameterExpression) and time.parameters:
        raise QdiffError(
            f"{where}: PauliEvolutionGate of non-commuting terms with time {time}: Qiskit's "
            f"Statevector evaluates it as the exact exp(-i t H), its definition "
            f"({type(synthesis).__name__}) only approximates that; bind the time, or expand "
            "the product formula explicitly (qc.decompose()) to run it as written")
    if len(qubits) > MAX_MATRIX_QUBITS:
        raise QdiffError(f"{where}: PauliEvolutionGate of non-commuting terms on {len(qubits)} "
                         f"qubits: its exact matrix is above the limit of {MAX_MATRIX_QUBITS} "
                         "qubits; expand the product formula explicitly (qc.decompose())")
    from scipy.linalg import expm
    t = complex(time).real if isinstance(time, ParameterExpression) else float(time)
    h = sum(term.to_matrix() for term in terms)
    ops = imp.ops
    ops.append(_matrix_operation(expm(-1j * t * h), qubits, where))


def _free_parameters(values) -> bool:
    """Whether any of ``values`` is a parameter expression with unbound parameters."""
    from qiskit.circuit import ParameterExpression
    return any(isinstance(v, ParameterExpression) and v.parameters for v in values)


def _definition(op, where: str):
    """``op.definition``; a definition Qiskit cannot build (one that needs a bound parameter)
    is a QdiffError naming the gate."""
    try:
        return getattr(op, "definition", None)
    except Exception as exc:  # qiskit raises several types for unbound parameters
        raise QdiffError(f"{where}: Qiskit cannot build the definition of '{op.name}' with "
                         f"parameters {[str(p) for p in op.params if not hasattr(p, 'shape')]} "
                         f"({type(exc).__name__}: {exc}); bind them first "
                         "(qc.assign_parameters)") from None


def _hamiltonian_evolution(op, qubits: tuple, imp: _Importer, where: str) -> None:
    """A ``HamiltonianGate`` ``exp(-i t H)`` with a parameter time, exactly: ``H = V D V^†``
    gives ``V exp(-i t D) V^†``, and ``exp(-i t D)`` is a product of commuting ``MultiRZ``
    rotations by ``2 t c_s`` on the Z words ``s`` of ``D``'s Walsh expansion (the identity term
    ``c_0`` is the global phase ``-t c_0``)."""
    from qdiff.circuits.gates import multirz_gate
    k = len(qubits)
    if k > MAX_MATRIX_QUBITS:
        raise QdiffError(f"{where}: HamiltonianGate on {k} qubits: its matrix is above the "
                         f"limit of {MAX_MATRIX_QUBITS} qubits")
    time = imp.angle(op.params[1], where)
    if not isinstance(time, ParamRef):  # the expression is a constant after all
        return _convert_into(op.definition, list(qubits), imp, False)
    h = np.asarray(op.params[0], dtype=complex)
    d, v = np.linalg.eigh((h + h.conj().T) / 2)
    x = np.arange(2 ** k)
    # c_s = 2^-k sum_x d_x (-1)^popcount(s & x); bit j of x (little-endian) is qubit j
    parity = np.array([[bin(s & i).count("1") & 1 for i in x] for s in x])
    coeffs = (1 - 2 * parity) @ d / 2 ** k
    if not imp.depth:
        imp.phase = imp.phase - float(coeffs[0]) * op.params[1]
    imp.ops.append(_matrix_operation(v.conj().T, qubits, where))
    for s in range(1, 2 ** k):
        if abs(coeffs[s]) > 1e-14 * max(1.0, float(np.abs(d).max())):
            wires = tuple(qubits[j] for j in range(k) if s >> j & 1)
            imp.ops.append(Operation(multirz_gate(len(wires)), wires, (time * (2 * coeffs[s]),)))
    imp.ops.append(_matrix_operation(v, qubits, where))


def _unannotated(op, where: str):
    """An ``AnnotatedOperation`` as a circuit of its base operation with its modifiers applied
    in order (``inverse()``, ``control(k, ctrl_state)``, ``power(x)``)."""
    from qiskit import QuantumCircuit
    out = op.base_op
    try:
        for m in op.modifiers:
            kind = type(m).__name__
            if kind == "InverseModifier":
                out = out.inverse()
            elif kind == "ControlModifier":
                out = out.control(m.num_ctrl_qubits, ctrl_state=m.ctrl_state)
            elif kind == "PowerModifier":
                out = out.power(m.power)
            else:
                raise QdiffError(f"{where}: modifier {kind} is not supported")
        qc = QuantumCircuit(op.num_qubits)
        qc.append(out, range(op.num_qubits))
    except QdiffError:
        raise
    except Exception as exc:  # Qiskit's refusal (a power of a gate with a free parameter)
        raise QdiffError(f"{where}: annotated {op.base_op.name} with modifiers "
                         f"{[type(m).__name__ for m in op.modifiers]}: Qiskit cannot apply "
                         f"them ({type(exc).__name__}: {exc})") from None
    return qc


def _sparse_pauli_op(obj, where: str):
    from qiskit.quantum_info import SparseObservable, SparsePauliOp
    try:
        if isinstance(obj, SparseObservable):
            return SparsePauliOp.from_sparse_observable(obj)
        out = SparsePauliOp(obj)
        if out.coeffs.dtype == object:
            raise TypeError("its coefficients are parameter expressions")
        return out
    except (TypeError, ValueError, AttributeError) as exc:
        raise QdiffError(f"{where}: PauliEvolutionGate operator {type(obj).__name__} is not "
                         f"supported ({exc})") from None


def _paulis_commute(terms: list) -> bool:
    """Whether every pair of Pauli terms of all ``terms`` (``SparsePauliOp`` s) commutes."""
    x = np.concatenate([t.paulis.x for t in terms]).astype(np.int64)
    z = np.concatenate([t.paulis.z for t in terms]).astype(np.int64)
    for i in range(0, len(x), 512):  # (512, T) blocks: bounded memory for large sums
        if ((x[i:i + 512] @ z.T + z[i:i + 512] @ x.T) % 2).any():
            return False
    return True


def _xx_plus_yy(op, name: str):
    """``(qdiff gate, factor)`` for an ``XXPlusYYGate`` whose beta is one of ``_XX_PLUS_YY``'s
    (else None: it is converted through its definition)."""
    if name != "xx_plus_yy" or len(op.params) != 2 or _standard_phase(op, name) is None:
        return None
    from qiskit.circuit import ParameterExpression
    beta = op.params[1]
    if isinstance(beta, ParameterExpression):
        if beta.parameters:
            return None
        beta = complex(beta).real
    for b, hit in _XX_PLUS_YY.items():
        if abs(float(beta) - b) < 1e-12:
            return hit
    return None


# the widest operation without a gate definition converted through its dense matrix
MAX_MATRIX_QUBITS = 10
_STANDARD: dict = {}


def _standard(name: str):
    """Qiskit's standard gate instance called ``name`` (a gate of ``FROM_QISKIT``)."""
    if not _STANDARD:
        from qiskit.circuit.library import get_standard_gate_name_mapping
        _STANDARD.update({n: g for n, g in get_standard_gate_name_mapping().items()
                          if n in FROM_QISKIT or n == "xx_plus_yy"})
    return _STANDARD[name]


def _is_standard(op, name: str) -> bool:
    """Whether ``op`` is Qiskit's own standard gate called ``name`` (not a user gate that only
    shares the name, such as an OpenQASM 3 ``gate iswap`` or a custom ``Gate`` named ``cz``)."""
    return getattr(op, "base_class", type(op)) is _standard(name).base_class


_SAME: dict = caches.register("qiskit_io.standard_definitions", {})
_SAME_PROBES = (0.7316, 1.2931, 0.4127, 1.6183)


def _standard_phase(op, name: str):
    """For a user gate named like a standard gate: the global phase by which its definition
    differs from the standard gate (a float), or None where it is not that gate. It is that
    gate when it has the same width and number of parameters, and its definition has the
    standard gate's matrix times one constant phase at probe values of every free parameter
    (a phase that depends on the parameters is not recognised: the definition runs as
    written). Such a definition runs as the standard gate, its phase added to the circuit's
    global phase. Qiskit's OpenQASM exporters write such definitions (``gate iswap``, ``gate
    rzz(p0)``, ``gate sxdg`` as ``s; h; s``) for standard gates outside ``stdgates.inc`` /
    ``qelib1.inc``. Qiskit's own gate ``name`` has phase 0."""
    if _is_standard(op, name):
        return 0.0
    std = _standard(name)
    definition = getattr(op, "definition", None)
    if (definition is None or op.num_qubits != std.num_qubits or op.num_clbits
            or len(op.params) != len(std.params)):
        return None
    key = (name, tuple(str(p) for p in op.params), _fingerprint(definition))
    same = caches.fetch(_SAME, key, lambda: _matrices_agree(op, definition, std))
    caches.trim(_SAME, 4096)
    return same


def _fingerprint(qc) -> tuple:
    """A content key of a definition: every instruction's class, name, qubits and parameters
    (the definitions of non-standard gates included), and the global phase."""
    index = {q: i for i, q in enumerate(qc.qubits)}
    out = [str(qc.global_phase)]
    for inst in qc.data:
        op = inst.operation
        cls = getattr(op, "base_class", type(op))
        sub = None
        if not (op.name in FROM_QISKIT and _is_standard(op, op.name)):
            d = getattr(op, "definition", None)
            sub = _fingerprint(d) if d is not None else repr(op)
        out.append((cls.__module__, cls.__qualname__, op.name,
                    tuple(index.get(q, -1) for q in inst.qubits),
                    tuple(str(p) for p in getattr(op, "params", ())), sub))
    return tuple(out)


def _matrices_agree(op, definition, std):
    """The one phase ``definition`` has over ``std``'s matrix at every probe, or None."""
    from qiskit.circuit import ParameterExpression
    from qiskit.quantum_info import Operator
    free = set(definition.parameters)
    for v in op.params:
        if isinstance(v, ParameterExpression):
            free |= set(v.parameters)
    names = sorted({p.name for p in free})
    phases = []
    for shift in range(2 if names else 1):
        value = {n: _SAME_PROBES[(i + shift) % len(_SAME_PROBES)] * (1 + i // 4)
                 for i, n in enumerate(names)}
        try:
            params = [complex(v.bind({p: value[p.name] for p in v.parameters}))
                      if isinstance(v, ParameterExpression) else complex(v) for v in op.params]
            if any(abs(c.imag) > 1e-12 for c in params):
                return None
            body = definition.assign_parameters({p: value[p.name] for p in definition.parameters})
            got = Operator(body).data
            want = std.base_class(*[c.real for c in params]).to_matrix()
        except Exception:  # a definition Qiskit cannot evaluate: not recognised
            return None
        if got.shape != want.shape:
            return None
        k = np.unravel_index(np.argmax(np.abs(want)), want.shape)
        phase = got[k] / want[k]
        if abs(abs(phase) - 1.0) > 1e-10 or not np.allclose(got, phase * want, atol=1e-10):
            return None
        phases.append(phase)
    if any(abs(p - phases[0]) > 1e-10 for p in phases):
        return None
    return float(np.angle(phases[0])) if abs(phases[0] - 1.0) > 1e-12 else 0.0


def _is_unitary_gate(op) -> bool:
    from qiskit.circuit.library import UnitaryGate
    return isinstance(op, UnitaryGate)


def _operator_matrix(op, qubits: tuple, where: str) -> np.ndarray:
    """The matrix of an operation without a gate definition (a ``Clifford``, a
    ``PermutationGate``), as Qiskit's ``Operator`` computes it; at most ``MAX_MATRIX_QUBITS``."""
    k = len(qubits)
    if k > MAX_MATRIX_QUBITS:
        raise QdiffError(f"{where}: '{op.name}' has no gate definition and its matrix on {k} "
                         f"qubits is above the limit of {MAX_MATRIX_QUBITS}; decompose it "
                         "first (e.g. qiskit.transpile)")
    from qiskit.quantum_info import Operator
    try:
        return Operator(op).data
    except Exception as exc:  # qiskit raises several types for operations without a matrix
        raise QdiffError(f"{where}: unknown gate '{op.name}' with no definition and no matrix "
                         f"({type(exc).__name__}: {exc})") from None


def _matrix_operation(matrix, qubits: tuple, where: str) -> Operation:
    """A constant unitary operation from a Qiskit (little-endian) matrix on ``qubits``."""
    m = np.asarray(matrix, dtype=complex)
    d = 2 ** len(qubits)
    if m.shape != (d, d):
        raise QdiffError(f"{where}: a matrix of shape {m.shape} on {len(qubits)} qubit(s)")
    if not np.isfinite(m).all():
        raise QdiffError(f"{where}: the matrix has NaN or infinite entries")
    perm = _le_to_be(len(qubits))
    try:
        gate = unitary_gate(m[perm][:, perm])
    except QdiffError as exc:
        raise QdiffError(f"{where}: {exc}") from None
    return Operation(gate, qubits, ())


def observable_from_qiskit(obj, num_qubits: int, where: str = "observable") -> Observable:
    """A qdiff observable on wires ``0..num_qubits-1`` from a ``SparsePauliOp``, ``Pauli``,
    ``SparseObservable`` (projector letters expanded into Paulis), a Pauli label such as
    ``"ZZI"`` (Qiskit order: the last letter is qubit 0), or a qdiff observable (``qd.Z(0)``,
    ``qd.Hamiltonian``), whose width is checked."""
    if isinstance(obj, (Observable, Operation)):
        obs = as_observable(obj)
        bad = [w for w in obs.wires if not (isinstance(w, int) and 0 <= w < num_qubits)]
        if bad:
            raise QdiffError(f"{where} acts on wire {bad[0]!r}; the circuit has qubits "
                             f"0..{num_qubits - 1}")
        return obs
    from qiskit.quantum_info import SparseObservable
    try:
        sparse = SparseObservable(obj)
    except (TypeError, ValueError) as exc:
        raise QdiffError(f"{where}: expected a SparsePauliOp, Pauli, Pauli label or qdiff "
                         f"observable; got {type(obj).__name__} ({exc})") from None
    if sparse.num_qubits != num_qubits:
        raise QdiffError(f"{where} acts on {sparse.num_qubits} qubit(s); the circuit has "
                         f"{num_qubits}")
    coeffs, terms = [], []
    for letters, indices, c in sparse.as_paulis().to_sparse_list():
        coeffs.append(complex(c))
        terms.append(tuple(Factor((int(q),), ch)
                           for ch, q in sorted(zip(letters, indices), key=lambda lq: lq[1])))
    if not terms:
        return Observable([0.0], [()])
    obs = Observable(coeffs, terms)  # like terms merged: (1+1j) Z + (1-1j) Z is 2 Z
    bad = [i for i, c in enumerate(obs.coeffs.tolist()) if abs(c.imag) > 1e-12]
    if bad:
        word = " @ ".join(repr(f) for f in obs.terms[bad[0]]) or "I"
        raise QdiffError(f"{where} is not Hermitian (coefficient {obs.coeffs[bad[0]].item()} "
                         f"of {word})")
    return Observable(obs.coeffs.real.clone(), obs.terms, simplify=False)


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


def to_qiskit(circuit: Circuit, theta=None, measure: bool = False, columns=None,
              global_phase: float = 0.0):
    """A ``QuantumCircuit``; theta columns become a ``ParameterVector('theta', P)`` unless
    ``theta`` (a ``(P,)`` or ``(1, P)`` tensor/array) binds them, or ``columns`` (one Qiskit
    ``Parameter``/``ParameterExpression`` per column, e.g. ``QiskitImport.columns()``) names
    them. ``measure`` adds final measures. The extra wires of mid-circuit measurements
    (deferred measurement, :mod:`qdiff.circuits.midcircuit`) become classical bits again: a
    ``measure`` into bit ``m<i>`` and ``if`` blocks for the operations they control.

    ``circuit`` may also be a :class:`QiskitImport` (from :func:`from_qiskit` or
    ``qasm.loads``): its own parameters, angle expressions, global phase and final
    measurements come back, and ``theta`` binds values of ``parameters`` in that order."""
    if isinstance(circuit, QiskitImport):
        return _import_to_qiskit(circuit, theta, measure, columns, global_phase)
    if not isinstance(circuit, Circuit):
        raise QdiffError(f"to_qiskit: expected a Circuit or a QiskitImport; got "
                         f"{type(circuit).__name__}")
    from qiskit import ClassicalRegister, QuantumCircuit, QuantumRegister
    from qdiff.circuits.midcircuit import is_mid_wire
    pv, values = _column_sources(circuit.num_params, theta, columns)
    mids = [i for i, lbl in enumerate(circuit.labels) if is_mid_wire(lbl)]
    nq = circuit.num_wires - len(mids)
    if mids:
        if measure:
            raise QdiffError("to_qiskit: measure=True with mid-circuit measurements; measure "
                             "explicitly")
        qc = QuantumCircuit(QuantumRegister(nq, "q"), ClassicalRegister(len(mids), "m"))
    else:
        qc = QuantumCircuit(circuit.num_wires, circuit.num_wires if measure else 0)
    qc.global_phase = global_phase if getattr(global_phase, "parameters", None) else \
        float(global_phase)
    clbit = {w: qc.clbits[k] for k, w in enumerate(mids)}
    negated: set = set()  # mid wires currently flipped (an X pair around a condition on 0)

    def val(p):
        if isinstance(p, ParamRef):
            base = values[p.index] if values is not None else pv[p.index]
            if p.scale == 1.0 and p.offset == 0.0:
                return base  # keeps a parameter a plain symbol in exported text
            return p.scale * base + p.offset
        return float(p)

    def emit(op, qc, wmap):
        if op.name == "iswapdg":
            qc.append(_iswap_dg(), [wmap[w] for w in op.wires])
            return
        if op.name == "isingxy":  # IsingXY(t) = XXPlusYY(-t, beta=0)
            from qiskit.circuit.library import XXPlusYYGate
            qc.append(XXPlusYYGate(-val(op.params[0]), 0.0), [wmap[w] for w in op.wires])
            return
        if op.name == "globalphase":  # exp(-i phi) I: Qiskit's global phase -phi
            qc.global_phase = qc.global_phase - val(op.params[0])
            return
        if op.name == "u2":
            qc.u(math.pi / 2, val(op.params[0]), val(op.params[1]), wmap[op.wires[0]])
            return
        if op.name == "unitary":
            from qiskit.circuit.library import UnitaryGate
            m = np.asarray(op.gate.hyper[0].detach().cpu())
            perm = _le_to_be(len(op.wires))
            qc.append(UnitaryGate(m[perm][:, perm]), [wmap[w] for w in op.wires])
            return
        if op.name == "ctrl":
            qc.append(_controlled(op, emit), [wmap[w] for w in op.wires])
            return
        meth = _TO_QISKIT_METHOD.get(op.name)
        if meth is None:
            for sub in decompose(op):
                emit(sub, qc, wmap)
            return
        getattr(qc, meth)(*[val(p) for p in op.params], *[wmap[w] for w in op.wires])

    def emit_mid(op):
        """An operation touching mid-circuit measurement wires."""
        from qdiff.circuits.gates import controlled_gate
        w = op.wires
        if op.name == "x":
            negated.symmetric_difference_update(w)
            return
        if op.name == "cx" and w[1] in clbit and w[0] not in clbit:
            qc.measure(w[0], clbit[w[1]])
            return
        k = op.gate.controls
        conds = [c for c in w[:k] if c in clbit]
        if any(t in clbit for t in w[k:]) or not conds:
            raise QdiffError(f"to_qiskit: operation {op!r} acts on a measurement outcome")
        rest = tuple(c for c in w[:k] if c not in clbit)
        gate = op.gate.target if not rest else controlled_gate(op.gate.target, len(rest))
        inner = Operation(gate, rest + w[k:], op.params)
        with qc.if_test(_condition([(clbit[c], c not in negated) for c in conds])):
            emit(inner, qc, list(range(nq)))

    wmap = list(range(circuit.num_wires))
    fences: dict = {}  # position -> the wires of each barrier standing there
    for pos, wires in circuit.barriers:
        if wires:  # (qc.barrier() of no qubits would stand on all of them)
            fences.setdefault(pos, []).append(wires)
    for i, op in enumerate(circuit.operations):
        for wires in fences.get(i, ()):
            qc.barrier(*wires)
        if mids and any(w in clbit for w in op.wires):
            emit_mid(op)
        else:
            emit(op, qc, wmap)
    for wires in fences.get(len(circuit.operations), ()):
        qc.barrier(*wires)
    if columns is not None and values is None:
        _keep_unused(qc, pv)
    if measure:
        qc.measure(range(circuit.num_wires), range(circuit.num_wires))
    return qc


def _import_to_qiskit(imp: QiskitImport, theta, measure: bool, columns, global_phase):
    """:func:`to_qiskit` of an import: its parameters as the columns (or ``theta`` binding
    them), its global phase and its final measurements into its classical registers."""
    if columns is not None or global_phase:
        raise QdiffError("to_qiskit: a QiskitImport brings its own parameters and global "
                         "phase; columns= and global_phase= apply to a Circuit")
    if measure and imp.measurements:
        raise QdiffError("to_qiskit: measure=True for a circuit with final measurements of "
                         "its own")
    if imp.num_qubits != imp.circuit.num_wires:
        raise QdiffError("to_qiskit: the import is a dynamic circuit run by deferred "
                         "measurement (its classical bits are extra wires); use the "
                         "QuantumCircuit itself")
    values = None
    if theta is not None:
        theta, values = import_theta(imp, theta, "to_qiskit")
    elif all(p is not None for p in imp.parameters):
        columns = imp.columns()
    qc = to_qiskit(imp.circuit, theta, measure, columns=columns,
                   global_phase=import_phase(imp, values))
    if imp.measurements:
        bits = classical_bits(qc, imp.registers, imp.num_clbits, imp.measurements)
        for q, c in imp.measurements:
            qc.measure(q, bits[c])
    return qc


def import_theta(imp: QiskitImport, theta, who: str) -> tuple:
    """``(theta columns (1, P), values)``: values of the import's parameters (in
    ``imp.parameters`` order) and the circuit's columns they give (the expression columns
    computed from them)."""
    values = torch.as_tensor(real_values(theta, who)).reshape(-1)
    k = len(imp.parameters)
    if values.numel() != k:
        names = ", ".join(f"theta[{i}]" if p is None else p.name
                          for i, p in enumerate(imp.parameters))
        raise QdiffError(f"{who}: theta has {values.numel()} values for the circuit's {k} "
                         f"parameter(s){' (' + names + ')' if names else ''}")
    return imp.theta(values.reshape(1, k)), values


def import_phase(imp: QiskitImport, values=None):
    """The import's global phase for an export: a float, evaluated at ``values`` of its
    parameters when they are bound, else its expression (of the circuit's own parameters)."""
    phase = imp.global_phase
    if not getattr(phase, "parameters", None):
        return float(phase)
    if values is None:
        return phase
    used = set(phase.parameters)
    return float(phase.bind({p: float(v) for p, v in zip(imp.parameters, values.tolist())
                             if p in used}))


def classical_bits(qc, registers, num_clbits: int, measurements) -> list:
    """Add the classical registers to ``qc``; returns its bit of each clbit index. An import's
    registers are kept (names, sizes, bits) when no clbit is in two of them; clbits in none (an
    OpenQASM 3 ``bit b;``, a loose Qiskit clbit) go to registers of fresh names, one per run of
    such bits, and the registers are added in the order of their first clbit, so that every
    clbit keeps its index. Overlapping registers: one register ``c``."""
    from qiskit import ClassicalRegister
    size = max(num_clbits, 1 + max(c for _, c in measurements))
    held = [c for _, bits in (registers or ()) for c in bits]
    if len(held) != len(set(held)) or not all(0 <= c < size for c in held):
        registers, held = [], []
    regs = list(registers or ())
    taken = {name for name, _ in regs}
    runs: list = []
    for c in sorted(set(range(size)) - set(held)):
        if runs and runs[-1][-1] == c - 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    for run in runs:
        name = next(n for n in ("c", *(f"c{i}" for i in range(len(taken) + 1)))
                    if n not in taken)
        taken.add(name)
        regs.append((name, run))
    out = [None] * size
    for name, bits in sorted(regs, key=lambda r: min(r[1], default=size)):
        reg = ClassicalRegister(len(bits), name)
        qc.add_register(reg)
        for j, c in enumerate(bits):
            out[c] = reg[j]
    return out


_CTRL_BASIS = ["u", "p", "rx", "ry", "rz", "h", "x", "cx", "cp", "crx", "cry", "crz", "cu",
               "ccx"]


def _controlled(op, emit):
    """The Qiskit gate of a ``ctrl`` operation: its base gate as a sub-circuit gate (with the
    base's actual angles, expressions of the circuit's parameters), controlled by ``k`` qubits.
    The sub-circuit's name (``qd_ry``) is no standard gate's: Qiskit controls its definition
    instead of rebuilding a standard gate from its first parameter."""
    from qiskit import QuantumCircuit
    base, k = op.gate.hyper
    n = base.num_wires
    sub = QuantumCircuit(n, name=f"qd_{base.qiskit_name or base.name}")
    emit(Operation(base, tuple(range(n)), op.params), sub, list(range(n)))
    gate = sub.to_gate().control(k)
    if not gate.params:
        return gate
    # with free parameters, the definition in standard gates only: Qiskit's OpenQASM 3
    # exporter writes nested library gates of parameter expressions (mcphase) wrongly
    from qiskit import transpile
    from qiskit.circuit import Gate
    body = transpile(gate.definition, basis_gates=_CTRL_BASIS, optimization_level=0)
    flat = Gate(gate.name, gate.num_qubits, list(gate.params))
    flat.definition = body
    return flat


def _condition(bits: list):
    """A Qiskit ``if_test`` condition: every ``(clbit, value)`` holds."""
    if len(bits) == 1:
        return (bits[0][0], int(bits[0][1]))
    from qiskit.circuit.classical import expr
    terms = [expr.lift(b) if v else expr.logic_not(b) for b, v in bits]
    out = terms[0]
    for t in terms[1:]:
        out = expr.logic_and(out, t)
    return out


def real_values(theta, who: str) -> np.ndarray:
    """``theta`` (a tensor, an array, a list) as a float64 array; complex values are refused,
    never cut to their real parts."""
    try:
        arr = np.asarray(theta.detach().cpu() if hasattr(theta, "detach") else theta)
        if arr.dtype.kind == "c":
            raise QdiffError(f"{who}: theta must be real; got complex values "
                             f"{arr.reshape(-1)[:4].tolist()}")
        return np.asarray(arr, dtype=float)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, QdiffError):
            raise
        raise QdiffError(f"{who}: theta must be real numbers; got {type(theta).__name__}") \
            from None


def _column_sources(num_params: int, theta, columns) -> tuple:
    """``(symbols per column, bound values or None)`` for :func:`to_qiskit`."""
    from qiskit.circuit import ParameterVector
    if columns is not None:
        pv = list(columns)
        if len(pv) != num_params:
            raise QdiffError(f"to_qiskit: {len(pv)} column expressions for {num_params} "
                             "parameters")
    else:
        pv = ParameterVector("theta", num_params) if num_params else []
    values = None
    if theta is not None:
        values = real_values(theta, "to_qiskit").reshape(-1)
        if values.size != num_params:
            raise QdiffError(f"to_qiskit: theta has {values.size} values for {num_params} "
                             "parameters")
    return pv, values


def _keep_unused(qc, columns) -> None:
    """Keep named parameters that no gate uses (an OpenQASM 3 ``input`` read nowhere) in the
    circuit's interface: ``p - p`` in the global phase is zero but still refers to ``p`` (the
    idiom Qiskit's own OpenQASM 3 importer uses)."""
    from qiskit.circuit import Parameter
    present = set(qc.parameters)
    for p in columns:
        if isinstance(p, Parameter) and p not in present:
            qc.global_phase += p - p


def _iswap_dg():
    from qiskit.circuit.library import iSwapGate
    return iSwapGate().inverse()
