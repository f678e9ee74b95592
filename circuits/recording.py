"""Recording of gate calls: the queue a ``qnode`` (or ``qd.record()``) collects operations into.

Outside any recording context a gate call just returns its :class:`Operation`.

>>> import qdiff as qd
>>> with qd.record() as rec:
...     _ = qd.Hadamard(0), qd.CNOT([0, 1])
>>> [op.name for op in rec.operations]
['h', 'cx']
"""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager, nullcontext

from qdiff.circuits.operation import Operation, OpBlock

_LOCAL = threading.local()


def _stack() -> list:
    if not hasattr(_LOCAL, "stack"):
        _LOCAL.stack = []
    return _LOCAL.stack


class Recorder:
    """Collects operations and measurements in call order. Templates may record an
    :class:`~qdiff.circuits.operation.OpBlock` (many operations as one item): ``raw`` keeps it
    as recorded (a qnode reads that), ``items`` and ``operations`` expand it."""

    def __init__(self):
        self.raw: list = []
        self.mid_count = 0  # mid-circuit measurements so far (their extra wires' indices)
        self.root = False  # a circuit's own recording (a qnode's), not a sub-recording
        self.condition = None  # the mid-circuit condition of a function qd.cond records

    def append(self, item):
        if _QUEUING is not None:  # PennyLane records here: not inside a function of its own
            refuse_inside_pennylane_function(item)
        self.raw.append(item)

    def remove(self, item) -> None:
        for i in range(len(self.raw) - 1, -1, -1):
            if self.raw[i] is item:
                del self.raw[i]
                return

    @property
    def items(self) -> list:
        out = []
        for i in self.raw:
            if isinstance(i, OpBlock):
                out.extend(i.operations())
            else:
                out.append(i)
        return out

    @property
    def operations(self) -> list:
        return [i for i in self.items if isinstance(i, Operation)]


def recorders() -> list:
    """The active recorders, outermost first."""
    return list(_stack())


def active() -> Recorder | None:
    st = _stack()
    return st[-1] if st else None


def circuit_root() -> Recorder | None:
    """The recorder of the innermost circuit being recorded: the innermost ``root`` recorder
    (a qnode called inside another qnode's function records a circuit of its own), else the
    outermost one. Sub-recordings (``qd.adjoint``, ``qd.ctrl``, ``qd.cond`` of a function)
    belong to it, so mid-circuit measurements inside them count against it."""
    st = _stack()
    for rec in reversed(st):
        if rec.root:
            return rec
    return st[0] if st else None


@contextmanager
def record(root: bool = False):
    """Collect the operations and measurements made inside. Where PennyLane is loaded, its
    operators and measurements made inside are collected too, in call order (a queue that
    forwards PennyLane's queuing into this recorder): a qnode converts or refuses them, it
    never drops them. ``root=True`` marks a circuit's own recording (a qnode's): recordings
    opened inside it are parts of that circuit, recordings around it are not."""
    rec = Recorder()
    rec.root = root
    _stack().append(rec)
    try:
        capture = _pennylane_capture(rec)
        if not isinstance(capture, nullcontext):
            rec._late_queue = None  # forwarded from the start
        with capture:
            yield rec
    finally:
        late = rec.__dict__.pop("_late_queue", None)
        if late is not None:
            late.__exit__(None, None, None)
        _stack().pop()


def capture_pennylane_late() -> None:
    """PennyLane imported while recording (``qd.GroverOperator`` used first inside a qnode):
    forward its queue into the active recorders from now on, outermost first (each stops with
    its recording), so the operator about to be made is recorded, not dropped."""
    if "pennylane" not in sys.modules:
        return
    for rec in _stack():
        if "_late_queue" not in rec.__dict__:
            queue = _pennylane_capture(rec)
            queue.__enter__()
            rec._late_queue = queue


def _pennylane_capture(rec: Recorder):
    """A PennyLane queuing context forwarding into ``rec`` (a no-op while PennyLane is not
    imported: then no PennyLane object can be made inside)."""
    if "pennylane" not in sys.modules:
        return nullcontext()
    global _FORWARD, _QUEUING
    if _FORWARD is None:
        from pennylane.queuing import AnnotatedQueue, QueuingManager

        class ForwardingQueue(AnnotatedQueue):
            """PennyLane's queue, mirrored into a qdiff :class:`Recorder`."""

            def __init__(self, target):
                super().__init__()
                self.target = target

            def append(self, obj, **kwargs):
                super().append(obj, **kwargs)
                self.target.append(obj)

            def remove(self, obj):
                super().remove(obj)
                self.target.remove(obj)

        _FORWARD, _QUEUING = ForwardingQueue, QueuingManager
    return _FORWARD(rec)


_FORWARD = None
_QUEUING = None  # PennyLane's QueuingManager, once a recording has forwarded PennyLane's queue


def refuse_pennylane_recording(what: str = "a qdiff qnode") -> None:
    """Refuse a qdiff qnode run while PennyLane records a quantum function: a PennyLane
    transform or drawer given a qdiff qnode (``qml.add_noise(qnode, model)``,
    ``qml.adjoint(qnode)``), or a qdiff qnode called inside a PennyLane qnode. PennyLane would
    see none of its gates, so its transform would silently leave the result as it is."""
    queuing = sys.modules.get("pennylane.queuing")
    if queuing is None:
        return
    ctx = queuing.QueuingManager.active_context()
    if ctx is not None and (_FORWARD is None or not isinstance(ctx, _FORWARD)):
        from qdiff.circuits.errors import QdiffError
        raise QdiffError(f"{what} was called while PennyLane records a quantum function (a "
                         "PennyLane transform or drawer given a qdiff qnode, or a qdiff qnode "
                         "inside a PennyLane qnode): PennyLane sees none of its gates. Use "
                         "qdiff's own (qd.draw, qd.specs, qd.adjoint, qd.ctrl, qd.compile, "
                         "device noise models), or call it outside and pass its result in")


def refuse_inside_pennylane_function(item) -> None:
    """Refuse a qdiff gate or measurement made while PennyLane records a function inside a
    qdiff recording (``qml.cond(m, fn)``, ``qml.adjoint(fn)``, ``qml.ctrl(fn, ...)`` with
    qdiff gates in ``fn``): PennyLane conditions, inverts or controls only the operations it
    records itself, so the qdiff one would act unchanged."""
    if _QUEUING is None:
        return
    # PennyLane 0.45's stack of active queues, read directly (this runs for every recorded
    # gate; QueuingManager.active_context() reads the same list through two calls)
    stack = getattr(_QUEUING, "_active_contexts", None)
    ctx = (stack[-1] if stack else None) if stack is not None else _QUEUING.active_context()
    if ctx is None or type(ctx) is _FORWARD or is_pennylane(item):
        return
    from qdiff.circuits.errors import QdiffError
    gate = getattr(item, "gate", None)
    what = f"{gate.name} on wires {list(item.wires)}" if gate is not None else \
        type(item).__name__
    raise QdiffError(f"qdiff {what} was made inside a function PennyLane records (qml.cond, "
                     "qml.adjoint or qml.ctrl of a function): PennyLane would condition, "
                     "invert or control only its own operations and leave this one as it is. "
                     "Write that function with PennyLane's gates, or use qd.cond, qd.adjoint "
                     "or qd.ctrl")


def is_pennylane(obj) -> bool:
    """Whether ``obj`` is a PennyLane object (operator, measurement process, ...)."""
    return type(obj).__module__.split(".", 1)[0] == "pennylane"


@contextmanager
def paused():
    """Stop recording inside (templates build sub-operations explicitly)."""
    st = _stack()
    saved = list(st)
    st.clear()
    try:
        yield
    finally:
        st.extend(saved)


def record_operation(gate, wires, params) -> Operation:
    op = Operation.make(gate, wires, params)
    rec = active()
    if rec is not None:
        rec.append(op)
    return op


def consume(item) -> None:
    """Remove an item used as an observable (``qd.expval(qd.Z(0))``) from the active queue."""
    rec = active()
    if rec is not None:
        rec.remove(item)
