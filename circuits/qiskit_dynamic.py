"""Qiskit dynamic circuits by deferred measurement (the machinery of
:mod:`qdiff.circuits.midcircuit`), for :func:`qdiff.circuits.qiskit_io.from_qiskit`.

A ``measure`` that is not final (its qubit is used afterwards, or its classical bit is read by
a condition or written inside a control-flow body later) becomes a CNOT onto a fresh extra wire
after the circuit's qubits; the classical bit then holds that wire's value. A ``reset`` after
operations on its qubit is a measurement onto a fresh wire followed by a CNOT back. An
``if_test`` / ``if_else`` / ``switch`` body runs controlled by the wires its condition reads:
the condition's truth table over those wires is split into disjoint cubes (partial assignments;
``c == 5`` on a 3-bit register is one cube, ``c0 | c1`` two), and every operation of the body is
applied controlled on each cube. A classical bit measured inside a body gets a fresh wire that
copies the bit's previous value when the condition does not hold, so it holds the value Qiskit's
classical bit holds in every branch. ``for_loop`` is unrolled with its loop parameter bound.

The extra wires only ever receive CNOTs from a measured qubit (and are read as controls), so the
state over the circuit's qubits is the measured circuit's mixed state, exactly.
"""
from __future__ import annotations

import numpy as np

from qdiff.circuits.errors import QdiffError

MAX_CONDITION_WIRES = 16  # measured bits one expression condition may read (its truth table)
_CONTROL_FLOW = {"if_else", "switch_case", "for_loop", "while_loop", "box"}


def final_measurements(qc) -> set:
    """Indices of the top-level ``measure`` instructions of ``qc`` that are final: no later
    instruction acts on their qubit, and no later control-flow instruction reads or writes
    their classical bit. (A backward walk on the instructions' names, which builds no
    operation objects; it stops once every qubit is used: no earlier measurement is final.)"""
    touched, read, out = set(), set(), set()
    data = qc.data
    n = qc.num_qubits
    for k in range(len(data) - 1, -1, -1):
        inst = data[k]
        name = inst.name
        if name in ("barrier", "delay"):
            continue
        if name == "measure":
            if inst.qubits[0] not in touched and inst.clbits[0] not in read:
                out.add(k)
        elif name in _CONTROL_FLOW:
            read.update(inst.clbits)
            read.update(_condition_clbits(inst.operation))
        touched.update(inst.qubits)
        if len(touched) == n:
            break
    return out


def bind_parameter(circ, param, value):
    """A copy of ``circ`` with ``param`` bound to ``value``, in its control-flow blocks too (a
    ``for_loop`` body, once per iteration). Every level is rebuilt: Qiskit's
    ``assign_parameters(inplace=False)`` binds the gate objects of nested blocks
    (``PauliEvolutionGate``, ``HamiltonianGate``, ...) in place, objects shared with ``circ``,
    so a second iteration would see the first one's value."""
    out = circ.copy_empty_like()
    for inst in circ.data:
        op = inst.operation
        blocks = getattr(op, "blocks", None)
        if blocks and any(param in set(b.parameters) for b in blocks):
            op = op.replace_blocks([bind_parameter(b, param, value) for b in blocks])
        out.append(op, inst.qubits, inst.clbits, copy=True)  # parametrized gates: copies
    if param in set(out.parameters):
        out.assign_parameters({param: value}, inplace=True)
    return out


def _condition_clbits(op) -> list:
    """The classical bits an ``if_else`` / ``while_loop`` condition or a ``switch`` target
    reads (a hand-built ``IfElseOp`` may read bits its instruction does not list)."""
    from qiskit.circuit import Clbit, ClassicalRegister
    from qiskit.circuit.classical import expr
    node = getattr(op, "condition", None)
    if node is None:
        node = getattr(op, "target", None)
    if isinstance(node, tuple):
        node = node[0]
    if isinstance(node, expr.Expr):
        found = [v.var for v in expr.iter_vars(node)]
    else:
        found = [node]
    out = []
    for x in found:
        if isinstance(x, Clbit):
            out.append(x)
        elif isinstance(x, ClassicalRegister):
            out.extend(x)
    return out


class Bits:
    """The classical bits of one scope (the top circuit or a control-flow body): bit object ->
    index of the top circuit's classical bit."""

    def __init__(self, mapping: dict):
        self.index = mapping

    def body(self, body, outer_clbits) -> "Bits":
        """The scope of a body whose bits are ``outer_clbits`` of this one, in order."""
        return Bits({b: self.index[o] for b, o in zip(body.clbits, outer_clbits)})

    def of(self, bit, where: str) -> int:
        if bit not in self.index:
            raise QdiffError(f"{where}: classical bit {bit} is not a bit of the circuit")
        return self.index[bit]


def condition_cubes(condition, bits: Bits, source: dict, where: str) -> tuple:
    """``(true cubes, false cubes)`` of a Qiskit condition (``(clbit or register, value)`` or a
    ``qiskit.circuit.classical.expr`` expression): each cube a tuple of ``(wire, value)``
    pairs, disjoint, on the wires ``source`` (top clbit -> wire) gives the bits read; a bit no
    measurement wrote is 0."""
    return mask_cubes(*truth_table(condition, bits, source, where, _bool_value))


def switch_cubes(target, cases: list, bits: Bits, source: dict, where: str) -> list:
    """``[(cubes, negated cubes)]`` per case of a ``switch`` (the default case, Qiskit's
    ``CASE_DEFAULT``, holds when no other case does)."""
    from qiskit.circuit import CASE_DEFAULT
    wires, value = truth_table(target, bits, source, where, _int_value)
    value = np.asarray(value).astype(np.int64)
    masks, taken = [], np.zeros(value.shape, dtype=bool)
    for values in cases:
        if any(v is CASE_DEFAULT for v in values):
            masks.append(None)
            continue
        m = np.isin(value, [int(v) for v in values])
        masks.append(m)
        taken |= m
    return [mask_cubes(wires, ~taken if m is None else m) for m in masks]


def truth_table(node, bits: Bits, source: dict, where: str, finish) -> tuple:
    """``(wires, values)``: the wires a condition reads and its value on every assignment of
    them (row ``r``: wire ``j`` holds bit ``j`` of ``r``, the first wire most significant)."""
    clbits = sorted(set(_clbits_of(node, bits, where)))
    wires = sorted({source[c] for c in clbits if c in source})
    if len(wires) > MAX_CONDITION_WIRES:
        raise QdiffError(f"{where}: the condition reads {len(wires)} measured bits; at most "
                         f"{MAX_CONDITION_WIRES} are supported")
    rows = np.arange(2 ** len(wires), dtype=np.int64)
    col = {w: (rows >> (len(wires) - 1 - j)) & 1 for j, w in enumerate(wires)}
    zero = np.zeros(rows.shape, dtype=np.int64)
    value = {c: col[source[c]] if c in source else zero for c in clbits}
    return wires, finish(_evaluate(node, bits, value, where, zero), where, zero)


def mask_cubes(wires: list, mask) -> tuple:
    """``(cubes where mask holds, cubes where it does not)``, each a disjoint cover."""
    table = np.broadcast_to(np.asarray(mask, dtype=bool), (2 ** len(wires),))
    return _cubes(wires, table, ()), _cubes(wires, ~table, ())


def _cubes(wires: list, table: np.ndarray, fixed: tuple) -> list:
    """Shannon expansion on the first wire until the table is constant."""
    if not table.any():
        return []
    if table.all():
        return [fixed]
    half = table.size // 2
    return _cubes(wires[1:], table[:half], fixed + ((wires[0], 0),)) + \
        _cubes(wires[1:], table[half:], fixed + ((wires[0], 1),))


def _bool_value(v, where: str, zero):
    if isinstance(v, tuple):  # a register's (value, width)
        raise QdiffError(f"{where}: a condition on a whole register needs a comparison "
                         "(creg == value)")
    return np.asarray(v).astype(bool) | np.zeros(zero.shape, dtype=bool)


def _int_value(v, where: str, zero):
    return (v[0] if isinstance(v, tuple) else np.asarray(v).astype(np.int64)) + zero


def _clbits_of(node, bits: Bits, where: str):
    from qiskit.circuit import Clbit, ClassicalRegister
    from qiskit.circuit.classical import expr
    if isinstance(node, tuple):  # a legacy (clbit or register, value) condition
        return _clbits_of(node[0], bits, where)
    if isinstance(node, Clbit):
        return [bits.of(node, where)]
    if isinstance(node, ClassicalRegister):
        return [bits.of(b, where) for b in node]
    if isinstance(node, expr.Var):
        return _clbits_of(node.var, bits, where) if isinstance(
            node.var, (Clbit, ClassicalRegister)) else _refuse_var(node, where)
    if isinstance(node, expr.Expr):
        return [c for sub in _children(node) for c in _clbits_of(sub, bits, where)]
    raise QdiffError(f"{where}: condition {node!r} is not supported")


def _refuse_var(node, where: str):
    raise QdiffError(f"{where}: classical variables (expr.Var '{getattr(node, 'name', node)}') "
                     "are not supported")


def _children(node) -> list:
    from qiskit.circuit.classical import expr
    if isinstance(node, expr.Unary):
        return [node.operand]
    if isinstance(node, expr.Binary):
        return [node.left, node.right]
    if isinstance(node, expr.Cast):
        return [node.operand]
    if isinstance(node, expr.Index):
        return [node.target, node.index]
    return []


def _width(node) -> int:
    return int(getattr(node.type, "width", 1) or 1)


def _evaluate(node, bits: Bits, value: dict, where: str, zero):
    """The value of a condition node on every row: a bool / int64 array, or ``(int64 array,
    width)`` for an unsigned integer."""
    from qiskit.circuit import Clbit, ClassicalRegister
    from qiskit.circuit.classical import expr
    if isinstance(node, tuple):  # legacy (clbit, 0/1) or (register, int)
        target, want = node
        got = _evaluate(target, bits, value, where, zero)
        return _int_value(got, where, zero) == int(want)
    if isinstance(node, Clbit):
        return value[bits.of(node, where)].astype(bool)
    if isinstance(node, ClassicalRegister):
        if len(node) > 62:
            raise QdiffError(f"{where}: register '{node.name}' of {len(node)} bits is wider "
                             "than the 62 bits a condition may read")
        out = zero.copy()
        for j, b in enumerate(node):
            out = out | (value[bits.of(b, where)] << j)
        return out, len(node)
    if isinstance(node, expr.Var):
        if isinstance(node.var, (Clbit, ClassicalRegister)):
            return _evaluate(node.var, bits, value, where, zero)
        _refuse_var(node, where)
    kind = type(node.type).__name__
    if kind not in ("Bool", "Uint"):
        raise QdiffError(f"{where}: condition of type {kind} ({node}) is not supported")
    if isinstance(node, expr.Value):
        v = node.value
        return np.asarray(bool(v)) if kind == "Bool" else (np.asarray(int(v)), _width(node))
    mask = (1 << _width(node)) - 1 if kind == "Uint" else 1
    if isinstance(node, expr.Cast):
        inner = _evaluate(node.operand, bits, value, where, zero)
        if kind == "Bool":
            return _int_value(inner, where, zero) != 0
        return _int_value(inner, where, zero) & mask, _width(node)
    if isinstance(node, expr.Index):
        target = _int_value(_evaluate(node.target, bits, value, where, zero), where, zero)
        idx = _int_value(_evaluate(node.index, bits, value, where, zero), where, zero)
        return ((target >> idx) & 1).astype(bool)
    if isinstance(node, expr.Unary):
        x = _evaluate(node.operand, bits, value, where, zero)
        if node.op == expr.Unary.Op.LOGIC_NOT:
            return ~_bool_value(x, where, zero)
        if node.op == expr.Unary.Op.BIT_NOT:
            return ~_bool_value(x, where, zero) if kind == "Bool" else \
                ((~_int_value(x, where, zero)) & mask, _width(node))
        raise QdiffError(f"{where}: operator {node.op.name} in condition {node} is not "
                         "supported")
    if isinstance(node, expr.Binary):
        op = expr.Binary.Op
        a = _evaluate(node.left, bits, value, where, zero)
        b = _evaluate(node.right, bits, value, where, zero)
        if node.op in (op.LOGIC_AND, op.LOGIC_OR):
            a, b = _bool_value(a, where, zero), _bool_value(b, where, zero)
            return a & b if node.op == op.LOGIC_AND else a | b
        if node.op in (op.BIT_AND, op.BIT_OR, op.BIT_XOR):
            if kind == "Bool":
                a, b = _bool_value(a, where, zero), _bool_value(b, where, zero)
            else:
                a, b = _int_value(a, where, zero), _int_value(b, where, zero)
            out = a & b if node.op == op.BIT_AND else a | b if node.op == op.BIT_OR else a ^ b
            return out if kind == "Bool" else (out, _width(node))
        compare = {op.EQUAL: np.equal, op.NOT_EQUAL: np.not_equal, op.LESS: np.less,
                   op.LESS_EQUAL: np.less_equal, op.GREATER: np.greater,
                   op.GREATER_EQUAL: np.greater_equal}.get(node.op)
        if compare is not None:
            return compare(_int_value(a, where, zero), _int_value(b, where, zero))
        if node.op in (op.SHIFT_LEFT, op.SHIFT_RIGHT):
            x, s = _int_value(a, where, zero), _int_value(b, where, zero)
            out = (x << s) if node.op == op.SHIFT_LEFT else (x >> s)
            return out & mask, _width(node)
        raise QdiffError(f"{where}: operator {node.op.name} in condition {node} is not "
                         "supported")
    raise QdiffError(f"{where}: condition {node} is not supported")
