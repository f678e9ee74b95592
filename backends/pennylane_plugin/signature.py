"""Operation signatures of PennyLane tapes: one conversion serves every tape of a signature.

A gradient transform (parameter-shift, finite differences, SPSA) or ``qml.execute`` of a list
of tapes hands the device many tapes that differ only in their gate angles. The signature of a
tape is everything its conversion (:func:`~qdiff.circuits.pennylane_io.from_pennylane_tape`)
reads except those angles: per operation its exact class, wires and the hyperparameters that
select the gate (``PauliRot``'s word, ``PCPhase``'s dimension, a controlled gate's control
wires and values and its base's signature, a leading ``BasisState``'s bits), per measurement
its exact class, wires and the content of its observable, plus the device wires, the shots
and the trainable parameter positions. Anything outside the listed classes (matrices,
state vectors, projectors, snapshots, torch tensors and autograd boxes, mid-circuit
measurement values) has no signature: such a tape is converted on its own every time.

:func:`scan` reads a batch of tapes once; the device keeps one :class:`Template` (the
converted circuit and the tape parameter behind each theta column) per signature, reads a
tape's angles in column order with :func:`row` (or :func:`broadcast_theta` for a broadcast
tape), and stacks the rows of all tapes of one template into ONE ``(T, P)`` array.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

import numpy as np

from qdiff.circuits import caches

#: parameter types taken as plain real numbers (PennyLane hands a device numpy data)
REALS = frozenset({float, int, np.float64, np.float32, np.float16, np.int64, np.int32,
                   np.int16, np.int8, np.uint64, np.uint32, np.uint16, np.uint8})
_SCALARS = REALS
_NUMERIC_KINDS = frozenset("fiu")

_HANDLERS: dict = {}  # PennyLane class -> signature function (filled on first use)
_MEASUREMENTS: frozenset = frozenset()
_CONTROLLED = None


class Template:
    """What every tape of one signature shares: the converted circuit, the plan's fixed
    fields, and per theta column the index of the tape parameter it reads."""

    __slots__ = ("circuit", "sources", "columns", "native", "n", "wire_map", "trainable")

    def __init__(self, circuit, sources, native, n, wire_map, trainable):
        self.circuit, self.sources, self.native = circuit, sources, native
        self.columns = tuple(k for k, _ in sources)
        self.n, self.wire_map, self.trainable = n, wire_map, trainable


_ALL: "weakref.WeakSet" = weakref.WeakSet()  # every device's templates (qdiff.clear_caches)
caches.register("pennylane_plugin.templates", _ALL,
                clear=lambda: [t.clear() for t in list(_ALL)])


class Templates:
    """A bounded LRU map signature -> :class:`Template` (one per device)."""

    def __init__(self, size: int = 64):
        self.size = size
        self._d: OrderedDict = OrderedDict()
        self._lock = threading.Lock()  # threads may share a device
        _ALL.add(self)

    def get(self, key):
        with self._lock:
            t = self._d.get(key)
            if t is not None:
                self._d.move_to_end(key)
            return t

    def put(self, key, template: Template) -> None:
        with self._lock:
            self._d[key] = template
            if len(self._d) > self.size:
                self._d.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._d.clear()

    def __len__(self):
        return len(self._d)

    def __reduce__(self):
        """A copy or an unpickled device starts with empty templates (they are rebuilt on
        use; a lock does not pickle)."""
        return (Templates, (self.size,))


def _init() -> None:
    global _MEASUREMENTS, _CONTROLLED
    import pennylane as qml
    from pennylane.measurements import (CountsMP, ExpectationMP, ProbabilityMP, SampleMP,
                                        StateMP, VarianceMP)
    from pennylane.ops.op_math import Controlled
    from qdiff.circuits.pennylane_io import simple_tape_gates
    handlers = {}
    for name in simple_tape_gates():
        cls = getattr(qml, name, None) or getattr(qml.ops, name, None)
        if isinstance(cls, type) and cls.__name__ == name:
            handlers[cls] = _simple
    handlers[qml.PauliRot] = _pauli_rot
    handlers[qml.PCPhase] = _pcphase
    handlers[qml.BasisState] = _basis_state
    _CONTROLLED = Controlled
    _MEASUREMENTS = frozenset({ExpectationMP, VarianceMP, ProbabilityMP, StateMP, SampleMP,
                               CountsMP})
    _HANDLERS.update(handlers)


def _simple(op, pos):
    return type(op), op.wires.labels


def _pauli_rot(op, pos):
    word = op.hyperparameters["pauli_word"]
    return (type(op), op.wires.labels, word) if type(word) is str else None


def _pcphase(op, pos):
    dim = tuple(op.hyperparameters["dimension"])
    if not all(type(d) is int for d in dim):
        return None
    return type(op), op.wires.labels, dim


def _basis_state(op, pos):
    """A leading ``BasisState`` becomes X gates on its set bits: the bits are the signature."""
    if pos != 0 or len(op.data) != 1:
        return None
    d = op.data[0]
    if not isinstance(d, np.ndarray) or d.ndim != 1 or d.dtype.kind not in "iuf":
        return None
    return type(op), op.wires.labels, tuple(d.astype(int).tolist())


def _adjoint(op, pos):
    """``Adjoint`` of S, T, SX or ISWAP (one qdiff gate each)."""
    from qdiff.circuits.pennylane_io import TAPE_ADJOINT_BASES
    base = op.base
    if _HANDLERS.get(type(base)) is not _simple or op.data or \
            type(base).__name__ not in TAPE_ADJOINT_BASES:
        return None
    return type(op), type(base), op.wires.labels


def _controlled(op, pos):
    base = op.base
    h = _HANDLERS.get(type(base))
    if h is None or h is _basis_state or type(base).__name__ == "GlobalPhase":
        return None
    inner = h(base, 1)
    if inner is None:
        return None
    return (type(op), op.control_wires.labels, tuple(bool(v) for v in op.control_values),
            inner)


def _op_signature(op, pos):
    h = _HANDLERS.get(type(op))
    if h is None:
        if type(op).__name__.startswith("Adjoint"):
            h = _adjoint
        elif isinstance(op, _CONTROLLED):
            h = _controlled
        else:
            return None
    try:
        return h(op, pos)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def _plain_data(data) -> bool:
    """Whether every datum is a plain number or numeric numpy array (no torch tensor, autograd
    box or other interface)."""
    for d in data:
        t = type(d)
        if t in _SCALARS:
            continue
        if not isinstance(d, np.ndarray) or d.dtype.kind not in "fiuc":
            return False
    return True


def _measurement_signature(mp, observable_key):
    if type(mp) not in _MEASUREMENTS or mp.mv is not None:
        return None
    obs = mp.obs
    extra = getattr(mp, "all_outcomes", None)
    if obs is None:
        if getattr(mp, "_eigvals", None) is not None:
            return None
        return type(mp), mp.wires.labels, extra
    data = obs.data  # (a sum's data is gathered from its terms on every read)
    if not _plain_data(data):
        return None
    key = observable_key(obs, data)
    return None if key is None else (type(mp), mp.wires.labels, extra, key)


def scan(tapes, labels_of, observable_key) -> list:
    """Per tape, ``(signature, parameters)`` (the tape's operation data in order, i.e. the
    first entries of ``tape.get_parameters(trainable_only=False)``), or None when the tape
    has no signature. Operations and measurements shared by several tapes are read once."""
    if not _HANDLERS:
        _init()
    ops_seen: dict = {}
    mps_seen: dict = {}
    out = []
    for tape in tapes:
        out.append(_scan_one(tape, labels_of, observable_key, ops_seen, mps_seen))
    return out


def _scan_one(tape, labels_of, observable_key, ops_seen, mps_seen):
    parts, params = [], []
    for pos, op in enumerate(tape.operations):
        data = op.data
        seen = ops_seen.get(id(op))
        if seen is None or seen[0] is not op or pos == 0:
            sig = _op_signature(op, pos) if _plain_data(data) else None
            if pos:
                ops_seen[id(op)] = (op, sig)
        else:
            sig = seen[1]
        if sig is None:
            return None
        parts.append(sig)
        params.extend(data)
    mparts = []
    for mp in tape.measurements:
        seen = mps_seen.get(id(mp))
        if seen is None or seen[0] is not mp:
            sig = _measurement_signature(mp, observable_key)
            mps_seen[id(mp)] = (mp, sig)
        else:
            sig = seen[1]
        if sig is None:
            return None
        mparts.append(sig)
    key = (labels_of(tape), tape.shots, tuple(tape.trainable_params), tuple(parts),
           tuple(mparts))
    return key, params


def row(params, columns):
    """The angles of one tape in theta column order when they are all plain real scalars,
    else None."""
    vals = [params[k] for k in columns]
    for v in vals:
        if type(v) not in _SCALARS:
            return None
    return vals


def broadcast_theta(params, columns):
    """``(B, P)`` float64 angles of a broadcast tape (scalars and ``(B,)`` numeric arrays),
    ``(batched, array)``; None when some angle is of another kind or the rows disagree."""
    vals = [params[k] for k in columns]
    b = None
    for v in vals:
        if type(v) in _SCALARS:
            continue
        if not isinstance(v, np.ndarray) or v.dtype.kind not in _NUMERIC_KINDS or v.ndim > 1:
            return None
        if v.ndim == 1:
            if b is not None and v.shape[0] != b:
                return None
            b = v.shape[0]
    theta = np.empty((1 if b is None else b, len(vals)), dtype=np.float64)
    for c, v in enumerate(vals):
        theta[:, c] = v
    return b is not None, theta
