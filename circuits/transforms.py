"""``adjoint`` and ``ctrl``: the inverse and the controlled version of an operation or of a
quantum function, recorded in place (PennyLane's ``qml.adjoint`` / ``qml.ctrl``).

Applied to an operation just recorded (``qd.adjoint(qd.RX(x, 0))``), they replace it; applied to
a function or a gate (``qd.adjoint(f)(*args)``, ``qd.ctrl(qd.RX, control=1)(x, wires=0)``) they
record what it records, inverted in reverse order or controlled, gate by gate.

>>> import qdiff as qd
>>> with qd.record() as rec:
...     _ = qd.adjoint(qd.S(0)), qd.ctrl(qd.RX(0.3, 1), control=[0, 2])
>>> [op.gate.pl_name for op in rec.operations]
['Sdg', 'C2(RX)']
"""
from __future__ import annotations

from qdiff.circuits import recording
from qdiff.circuits.circuit import StatePrep
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.gates import GATES, controlled_gate
from qdiff.circuits.midcircuit import is_mid_wire
from qdiff.circuits.operation import Operation, OpBlock, normalize_wires


def _operator_leaves(tree):
    """The operations (qdiff's or PennyLane's) among nested lists, tuples and dict values."""
    if isinstance(tree, (list, tuple)):
        return [leaf for t in tree for leaf in _operator_leaves(t)]
    if isinstance(tree, dict):
        return _operator_leaves(list(tree.values()))
    return [tree] if isinstance(tree, Operation) or _pennylane_operator(tree) else []


def _recorded_ops(fn, args, kwargs, what: str) -> tuple:
    """Record ``fn(*args, **kwargs)`` apart: ``(operations, return value)``. Operations
    passed as arguments (``qd.ctrl(qd.QuantumPhaseEstimation, 0)(qml.RX(x, 3), ...)``) are
    the function's input, not gates of the circuit: they leave the recording, as in
    PennyLane."""
    with recording.record() as rec:
        out = fn(*args, **kwargs)
    for leaf in _operator_leaves((args, kwargs)):
        recording.consume(leaf)
    ops = []
    for it in rec.raw:
        if isinstance(it, OpBlock):
            ops.extend(it.operations())
        elif isinstance(it, Operation):
            ops.append(it)
        elif isinstance(it, StatePrep):
            raise QdiffError(f"{what}: state preparation cannot be inverted or controlled")
        elif _pennylane_operator(it):
            ops.extend(_from_pennylane(it, what, _some_wire(rec.raw)))
        else:
            raise QdiffError(f"{what}: {type(it).__name__} {it!r} is not an operation "
                             "(measurements cannot be inverted or controlled)")
    _no_channels(ops, what)
    for op in ops:
        if any(is_mid_wire(w) for w in op.wires[op.gate.controls:]):
            raise QdiffError(f"{what}: a mid-circuit measurement (qd.measure) inside cannot be "
                             "inverted or controlled")
    return ops, out


def _no_channels(ops, what: str) -> None:
    from qdiff.circuits.channels import is_channel
    for op in ops:
        if is_channel(op.gate):
            raise QdiffError(f"{what}: channel {op.gate.name} on wires {list(op.wires)} cannot "
                             "be inverted or controlled")


def _pennylane_operator(obj) -> bool:
    """A PennyLane operator (``qml.RX(x, 0)``, ``qd.GroverOperator(...)``), not a measurement."""
    return recording.is_pennylane(obj) and hasattr(obj, "wires") and hasattr(obj, "data") \
        and not hasattr(obj, "obs")


def _some_wire(raw: list):
    """A wire some recorded item acts on (where a ``GlobalPhase`` naming none is put)."""
    for it in raw:
        for w in tuple(getattr(it, "wires", ())):
            return w
    return None


def _from_pennylane(op, what: str, any_wire) -> list:
    """qdiff's operations for a PennyLane operator (its decomposition into qdiff's gates, as a
    qnode converts it); a channel has no inverse or controlled form."""
    from pennylane.queuing import QueuingManager
    from qdiff.circuits.pennylane_io import TAPE_CHANNELS, op_items
    if type(op).__name__ in TAPE_CHANNELS:
        raise QdiffError(f"{what}: PennyLane channel {op!r} cannot be inverted or controlled")
    try:
        with QueuingManager.stop_recording():  # its decomposition is not part of the circuit
            items = op_items(op, what, first=False, any_wire=any_wire)
    except QdiffError as e:
        raise QdiffError(f"{what}: PennyLane operation {op!r}: {e}") from None
    return [o for it in items for o in (it.operations() if isinstance(it, OpBlock) else [it])]


def _emit(ops) -> None:
    rec = recording.active()
    if rec is not None:
        for op in ops:
            rec.append(op)


def _operation(obj, what: str):
    """The operations of ``obj`` when it is one (a qdiff or PennyLane operation), else None."""
    if isinstance(obj, Operation):
        _no_channels([obj], what)
        recording.consume(obj)  # it was recorded when made; its transform replaces it
        return [obj]
    if _pennylane_operator(obj):
        recording.consume(obj)
        return _from_pennylane(obj, what, _some_wire([obj]))
    return None


def adjoint(op_or_fn, lazy=True):
    """The inverse of an operation, or a function recording the inverse of ``op_or_fn``'s
    operations (reverse order, each gate's own inverse from its record). ``lazy`` is
    PennyLane's (how its ``Adjoint`` object is built): checked, the result is the same.

    >>> import torch, qdiff as qd
    >>> with qd.record() as rec:
    ...     qd.adjoint(qd.RX(0.3, wires=0))
    RX(-0.3, wires=[0])
    """
    if not isinstance(lazy, bool):
        raise QdiffError(f"adjoint: lazy must be True or False; got {lazy!r}")
    ops = _operation(op_or_fn, "adjoint")
    if ops is not None:
        inv = [o.inverse() for o in reversed(ops)]
        _emit(inv)
        return inv[0] if len(inv) == 1 else inv
    if not callable(op_or_fn):
        raise QdiffError(f"adjoint: expected an operation or a quantum function, got "
                         f"{type(op_or_fn).__name__}")

    def inverted(*args, **kwargs):
        ops, out = _recorded_ops(op_or_fn, args, kwargs, "adjoint")
        inv = [o.inverse() for o in reversed(ops)]
        _emit(inv)
        return inv[0] if len(inv) == 1 and isinstance(out, Operation) else out
    return inverted


def _controls(control, control_values, what):
    ctrl = normalize_wires(control)
    if not ctrl:
        raise QdiffError(f"{what}: need at least one control wire")
    if len(set(ctrl)) != len(ctrl):
        raise QdiffError(f"{what}: repeated control wire in {list(ctrl)}")
    if control_values is None:
        values = (1,) * len(ctrl)
    else:
        values = (control_values,) if isinstance(control_values, (bool, int)) else \
            tuple(control_values)
        if len(values) != len(ctrl) or any(v not in (0, 1, True, False) for v in values):
            raise QdiffError(f"{what}: control_values {control_values!r} must be one 0/1 per "
                             f"control wire {list(ctrl)}")
    return ctrl, tuple(int(v) for v in values)


def _controlled(op: Operation, ctrl: tuple, values: tuple) -> list:
    clash = set(ctrl) & set(op.wires)
    if clash:
        raise QdiffError(f"ctrl: control wire(s) {sorted(clash, key=str)} overlap the wires "
                         f"{list(op.wires)} of {op!r}")
    flips = [Operation(GATES["x"], (w,)) for w, v in zip(ctrl, values) if not v]
    gate = controlled_gate(op.gate, len(ctrl))
    return flips + [Operation(gate, ctrl + op.wires, op.params)] + flips


def ctrl(op_or_fn, control, control_values=None, work_wires=None, work_wire_type="borrowed"):
    """``op_or_fn`` controlled by the wires ``control`` (acting when they hold
    ``control_values``, default all 1): an operation, or a function recording its operations
    controlled. ``work_wires``/``work_wire_type`` are PennyLane's decomposition hints: checked,
    and not needed (the simulators apply a controlled gate directly).

    >>> import qdiff as qd
    >>> with qd.record() as rec:
    ...     _ = qd.ctrl(qd.RY(0.2, wires=2), control=[0, 1], control_values=[1, 0])
    >>> [op.gate.pl_name for op in rec.operations]
    ['PauliX', 'C2(RY)', 'PauliX']
    """
    ctrl_w, values = _controls(control, control_values, "ctrl")
    _work_wires("ctrl", ctrl_w, work_wires, work_wire_type)
    ops = _operation(op_or_fn, "ctrl")
    if ops is not None:
        out = [_controlled(o, ctrl_w, values) for o in ops]
        _emit([o for group in out for o in group])
        return out[0][len(out[0]) // 2] if len(out) == 1 else [g[len(g) // 2] for g in out]
    if not callable(op_or_fn):
        raise QdiffError(f"ctrl: expected an operation or a quantum function, got "
                         f"{type(op_or_fn).__name__}")

    def controlled(*args, **kwargs):
        ops, out = _recorded_ops(op_or_fn, args, kwargs, "ctrl")
        for o in ops:
            _emit(_controlled(o, ctrl_w, values))
        return out
    return controlled


def _no_other_keywords(who: str, kwargs: dict) -> None:
    if kwargs:
        raise QdiffError(f"{who}: unknown keyword(s) {sorted(kwargs)}; valid: wires, "
                         "control_values, work_wires, work_wire_type"
                         + (", unitary_check" if who == "ControlledQubitUnitary" else ""))


def _work_wires(who: str, wires: tuple, work_wires, work_wire_type) -> None:
    """PennyLane's ``work_wires``/``work_wire_type``: hints for decomposing a many-controlled
    gate, which the simulators apply directly; checked, then not needed."""
    work = normalize_wires(work_wires) if work_wires not in (None, ()) else ()
    clash = set(work) & set(wires)
    if clash:
        raise QdiffError(f"{who}: work_wires {sorted(clash, key=str)} overlap its wires "
                         f"{list(wires)}")
    if work_wire_type not in (None, "borrowed", "zeroed", "dirty", "clean"):
        raise QdiffError(f"{who}: work_wire_type {work_wire_type!r} must be 'borrowed' or "
                         "'zeroed'")


def MultiControlledX(wires=None, control_values=None, work_wires=(), work_wire_type="borrowed",
                     **kwargs):
    """PennyLane's ``MultiControlledX``: X on ``wires[-1]`` controlled by ``wires[:-1]``
    (acting when they hold ``control_values``, default all 1); ``qd.ctrl(qd.X(t), ...)``.

    >>> import qdiff as qd
    >>> with qd.record() as rec:
    ...     _ = qd.MultiControlledX(wires=[0, 1, 2], control_values=[1, 0])
    >>> [op.gate.pl_name for op in rec.operations]
    ['PauliX', 'Toffoli', 'PauliX']
    """
    _no_other_keywords("MultiControlledX", kwargs)
    ws = normalize_wires(wires)
    if len(ws) < 2:
        raise QdiffError(f"MultiControlledX: wires {list(ws)} must be the control wires "
                         "followed by the target wire (at least two)")
    _work_wires("MultiControlledX", ws, work_wires, work_wire_type)
    _controls(ws[:-1], control_values, "MultiControlledX")
    return ctrl(lambda: GATES["x"](wires=ws[-1]), ws[:-1], control_values)()


def ControlledQubitUnitary(base, wires, control_values=None, unitary_check=False,
                           work_wires=(), work_wire_type="borrowed", **kwargs):
    """PennyLane's ``ControlledQubitUnitary``: the matrix ``base`` (``2**k`` square) on the
    last ``k`` of ``wires``, controlled by the others; ``qd.ctrl(qd.QubitUnitary(...), ...)``
    (the matrix is always checked to be unitary)."""
    from qdiff.circuits.gates import QubitUnitary
    _no_other_keywords("ControlledQubitUnitary", kwargs)
    ws = normalize_wires(wires)
    shape = tuple(getattr(base, "shape", ()))
    dim = shape[-1] if len(shape) >= 2 else 0
    k = dim.bit_length() - 1 if dim > 0 else 0
    if dim < 2 or dim != 2 ** k or len(ws) <= k:
        raise QdiffError(f"ControlledQubitUnitary: base of shape {shape} needs a 2**k square "
                         f"matrix and more than k wires (control wires, then the k target "
                         f"wires); got wires {list(ws)}")
    if not isinstance(unitary_check, bool):
        raise QdiffError(f"ControlledQubitUnitary: unitary_check must be True or False; got "
                         f"{unitary_check!r}")
    _work_wires("ControlledQubitUnitary", ws, work_wires, work_wire_type)
    _controls(ws[:-k], control_values, "ControlledQubitUnitary")
    return ctrl(lambda: QubitUnitary(base, wires=ws[-k:]), ws[:-k], control_values)()
