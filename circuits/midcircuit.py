"""Mid-circuit measurement by the deferred-measurement principle: ``m = qd.measure(w)``,
``qd.cond(m, op)`` and the statistics of ``m`` (``qd.expval(m)``, ``qd.probs(op=m)``,
``qd.sample(m)``), simulated exactly and differentiably.

Each ``measure`` gets one extra wire (a :class:`MidWire` label after the device's wires): the
measurement is a CNOT from the measured wire onto it (plus a CNOT back for ``reset=True``), an
operation conditioned on ``m`` is the operation controlled by that wire, and a statistic of
``m`` is a measurement of that wire at the end. Measuring a qubit and acting on the outcome
classically gives the same statistics as this unitary circuit, so expectation values and
probabilities are exact and their gradients are those of an ordinary circuit. The OpenQASM 3
exporter writes the extra wires back as classical bits (``measure`` and ``if``).

>>> import torch, qdiff as qd
>>> dev = qd.device("statevector", wires=2)
>>> @qd.qnode(dev)
... def f(x):
...     qd.RY(x, wires=0)
...     m = qd.measure(0)
...     qd.cond(m, qd.X)(wires=1)
...     return qd.expval(qd.Z(1)), qd.expval(m)
>>> [round(float(v), 6) for v in f(torch.tensor(1.0, dtype=torch.float64))]
[0.540302, 0.229849]
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qdiff.circuits import recording
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.gates import GATES, controlled_gate
from qdiff.circuits.observables import Hermitian
from qdiff.circuits.operation import Operation, OpBlock, normalize_wires


@dataclass(frozen=True)
class MidWire:
    """The extra wire holding the outcome of the ``index``-th mid-circuit measurement of a
    recording (labels compare equal across calls, so recorded structures are reused)."""

    index: int

    def __repr__(self):
        return f"m{self.index}"


def is_mid_wire(w) -> bool:
    return isinstance(w, MidWire)


class MeasurementValue:
    """The outcome of mid-circuit measurements, as a condition: the conjunction of
    ``(wire, value)`` pairs, true when every measurement gave its value. ``m`` (value 1),
    ``~m`` / ``m == 0`` (value 0) and ``m0 & m1`` are supported."""

    def __init__(self, pairs):
        self.pairs = tuple(pairs)

    @property
    def wires(self) -> tuple:
        return tuple(w for w, _ in self.pairs)

    @property
    def values(self) -> tuple:
        return tuple(v for _, v in self.pairs)

    def __invert__(self):
        if len(self.pairs) != 1:
            raise QdiffError("~ of a conjunction of mid-circuit measurements is not supported; "
                             "negate single measurements (~m0 & m1)")
        (w, v), = self.pairs
        return MeasurementValue([(w, 1 - v)])

    def __eq__(self, other):
        if isinstance(other, (bool, int, np.integer)) and int(other) in (0, 1) and \
                len(self.pairs) == 1:
            return self if int(other) == 1 else ~self
        raise QdiffError(f"a mid-circuit measurement value compares only with 0 or 1 (single "
                         f"measurement); got == {other!r}")

    def __ne__(self, other):
        return ~(self == other)

    def __and__(self, other):
        if not isinstance(other, MeasurementValue):
            raise QdiffError(f"& of a mid-circuit measurement value and "
                             f"{type(other).__name__}: combine measurement values only")
        mine = dict(self.pairs)
        for w, v in other.pairs:
            if mine.get(w, v) != v:
                raise QdiffError(f"condition asks measurement {w!r} for both 0 and 1")
            mine[w] = v
        return MeasurementValue(mine.items())

    __hash__ = object.__hash__

    def _refuse(self, what):
        def op(*_):
            raise QdiffError(f"mid-circuit measurement values support m, ~m, m == 0/1 and "
                             f"m0 & m1 as conditions; '{what}' is not supported")
        return op

    def __bool__(self):
        raise QdiffError("a mid-circuit measurement value has no Python truth value while the "
                         "circuit is recorded; use qd.cond(m, op)")

    def observable(self):
        """The 0/1-valued observable of this condition on its wires: the projector onto the
        wires holding the values (``qd.expval(m)`` is the probability of ``m == 1``)."""
        proj = np.ones(1)
        for v in self.values:
            proj = np.kron(proj, np.array([1.0 - v, float(v)]))
        return Hermitian(np.diag(proj), list(self.wires))

    def probs_wires(self) -> tuple:
        """The wires ``qd.probs(op=m)`` reads: plain measurements (value 1) only."""
        if any(v != 1 for v in self.values):
            raise QdiffError("probs(op=...) takes plain measurement values (m or m0 & m1 as a "
                             "list [m0, m1]), not negated ones")
        return self.wires

    def __repr__(self):
        return " & ".join(f"{w!r}=={v}" for w, v in self.pairs)


for _name, _sym in (("__add__", "+"), ("__radd__", "+"), ("__sub__", "-"), ("__mul__", "*"),
                    ("__rmul__", "*"), ("__or__", "|"), ("__ror__", "|"), ("__xor__", "^"),
                    ("__lt__", "<"), ("__le__", "<="), ("__gt__", ">"), ("__ge__", ">=")):
    setattr(MeasurementValue, _name, MeasurementValue._refuse(None, _sym))


def measure(wires, reset: bool = False, postselect=None) -> MeasurementValue:
    """Measure ``wires`` (one wire) in the computational basis mid-circuit; ``reset=True``
    returns it to |0> afterwards. Returns the outcome for :func:`cond` and for statistics."""
    if postselect is not None:
        raise QdiffError("measure: postselect is not supported (deferred measurement keeps "
                         "every outcome)")
    if not isinstance(reset, bool):
        raise QdiffError(f"measure: reset must be True or False; got {reset!r}")
    ws = normalize_wires(wires)
    if len(ws) != 1:
        raise QdiffError(f"measure: one wire at a time; got {list(ws)}")
    (w,) = ws
    if is_mid_wire(w):
        raise QdiffError(f"measure: wire {w!r} is a measurement outcome, not a qubit")
    root = recording.circuit_root()
    if root is None:
        raise QdiffError("qd.measure is only available while a qnode records its circuit")
    aux = MidWire(root.mid_count)
    root.mid_count += 1
    for op in measurement_ops(w, aux, reset):
        recording.active().append(op)
    return MeasurementValue([(aux, 1)])


def controlled_by(op: Operation, wires: tuple, values: tuple) -> list:
    """``op`` applied when the measurement wires ``wires`` hold ``values``: X flips around
    the controlled gate for the values 0."""
    if getattr(op.gate, "is_channel", False):  # a noise channel (no controlled form)
        raise QdiffError(f"cond: channel {op.gate.name} on wires {list(op.wires)} cannot be "
                         "conditioned on a mid-circuit measurement (gates and templates only)")
    flips = [Operation(GATES["x"], (w,), ()) for w, v in zip(wires, values) if not v]
    gate = controlled_gate(op.gate, len(wires))
    return flips + [Operation(gate, tuple(wires) + op.wires, op.params)] + flips


def measurement_ops(wire, aux: MidWire, reset: bool) -> list:
    """The deferred form of measuring ``wire`` into ``aux`` (and resetting it)."""
    ops = [Operation(GATES["cx"], (wire, aux), ())]
    if reset:
        ops.append(Operation(GATES["cx"], (aux, wire), ()))
    return ops


def _controlled_by(op: Operation, cond: MeasurementValue) -> list:
    return controlled_by(op, cond.wires, cond.values)


class ConditionedOps:
    """Operations a ``qd.cond`` inside a conditioned function recorded, already conditioned
    on both conditions (the enclosing ``qd.cond`` passes them on unchanged)."""

    def __init__(self, ops):
        self.ops = list(ops)


def _conjoin(a: MeasurementValue | None, b: MeasurementValue):
    """``a & b``, or None where they contradict (the branch never fires)."""
    if a is None:
        return b
    mine = dict(a.pairs)
    if any(mine.get(w, v) != v for w, v in b.pairs):
        return None
    return a & b


def _ops_of(fn, args, kwargs, condition) -> list:
    """``(operation, conditioned already)`` pairs of ``fn(*args)`` recorded under
    ``condition``."""
    with recording.record() as rec:
        rec.condition = condition
        fn(*args, **kwargs)
    ops = []
    for it in rec.raw:
        if isinstance(it, ConditionedOps):
            ops.extend((op, True) for op in it.ops)
        elif isinstance(it, OpBlock):
            ops.extend((op, False) for op in it.operations())
        elif isinstance(it, Operation):
            ops.append((it, False))
        else:
            raise QdiffError(f"cond: {type(it).__name__} {it!r} cannot be conditioned on a "
                             "measurement (qdiff's gates and templates only: write qd.RX, ...; "
                             "a PennyLane qml.cond converts inside a qdiff qnode)")
    for op, done in ops:
        if not done and any(is_mid_wire(w) for w in op.wires[op.gate.controls:]):
            raise QdiffError("cond: a mid-circuit measurement inside a conditioned function "
                             "is not supported (nor a qd.cond under qd.adjoint or qd.ctrl "
                             "there: write qd.cond(m0 & m1, ...) instead)")
    return ops


def cond(condition, true_fn, false_fn=None):
    """Apply ``true_fn`` (an operation, a gate or a quantum function) when ``condition`` (a
    mid-circuit measurement value) holds, and ``false_fn`` otherwise (single measurements
    only). An operation is replaced at once; a callable returns a function to call with its
    arguments, as PennyLane's ``qml.cond``."""
    if not isinstance(condition, MeasurementValue):
        raise QdiffError(f"cond: the condition must be a mid-circuit measurement value "
                         f"(m = qd.measure(w)); got {type(condition).__name__}")
    if false_fn is not None and len(condition.pairs) != 1:
        raise QdiffError("cond: false_fn needs a condition on one measurement")
    branches = [(condition, true_fn)] + ([(~condition, false_fn)] if false_fn is not None else [])
    if isinstance(true_fn, Operation):
        if false_fn is not None and not isinstance(false_fn, Operation):
            raise QdiffError("cond: give both branches as operations or both as functions")
        outer = _outer_condition()
        out = []
        for c, op in branches:
            recording.consume(op)
            full = _conjoin(outer, c)
            if full is not None:
                out.extend(_controlled_by(op, full))
        _emit(out)
        return None
    for _, fn in branches:
        if not callable(fn):
            raise QdiffError(f"cond: expected an operation, a gate or a function; got "
                             f"{type(fn).__name__}")

    def conditioned(*args, **kwargs):
        outer = _outer_condition()  # a qd.cond inside a conditioned function: both hold
        out = []
        for c, fn in branches:
            full = _conjoin(outer, c)
            ops = _ops_of(fn, args, kwargs, full)
            if full is not None:
                out.extend(o for op, done in ops
                           for o in ([op] if done else _controlled_by(op, full)))
        _emit(out)
    return conditioned


def _outer_condition():
    rec = recording.active()
    return None if rec is None else rec.condition


def _emit(ops) -> None:
    rec = recording.active()
    if rec is None:
        raise QdiffError("qd.cond is only available while a qnode records its circuit")
    if rec.condition is not None:  # recorded by an enclosing qd.cond of a function
        rec.append(ConditionedOps(ops))
        return
    for op in ops:
        rec.append(op)
