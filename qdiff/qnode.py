"""``qd.qnode``: a Python function of torch tensors that records a circuit and runs it.

>>> import torch, qdiff as qd
>>> dev = qd.device("statevector", wires=2)
>>> @qd.qnode(dev)
... def f(x):
...     qd.RX(x, wires=0); qd.CNOT(wires=[0, 1])
...     return qd.expval(qd.Z(1))
>>> f(torch.tensor(0.0, dtype=torch.float64))
tensor(1., dtype=torch.float64)
>>> f(torch.zeros(3)).shape
torch.Size([3])
"""
from __future__ import annotations

import functools
from collections import Counter
import torch

from qdiff.backends.base import shot_vector
from qdiff.circuits import pennylane_io, recording  # noqa: F401  (pennylane_io installs the
# conversion of PennyLane observables given to qd.expval & co.; PennyLane itself stays unimported)
from qdiff.circuits.circuit import Circuit, Recorded
from qdiff.circuits.errors import QdiffError, QdiffMemoryError
from qdiff.circuits.measurements import Measurement
from qdiff.rules import DIFF_METHODS, RULES, make_options  # noqa: F401  (DIFF_METHODS re-exported)

DEVICE_SHOTS = "device"  # shots=: the device's own setting (qdiff.backends.base.DEVICE_SHOTS)
INTERFACES = ("auto", "torch")  # results are torch tensors, differentiable by torch autograd


def check_keywords(gradient_kwargs: dict, interface) -> None:
    """Refuse a keyword no qnode takes (listing those it takes) and an interface other than
    torch: nothing the user wrote is silently ignored."""
    rule_opts = sorted({k for r in RULES.values() for k in r.options})
    unknown = sorted(set(gradient_kwargs) - set(rule_opts))
    if unknown:
        raise QdiffError(f"qnode: unknown keyword(s) {unknown}; valid keywords: "
                         f"{['device', 'diff_method', 'interface', 'shots', 'static']} and the options "
                         f"of a diff_method {rule_opts}")
    if interface not in INTERFACES:
        raise QdiffError(f"qnode: interface={interface!r} is not available; qdiff qnodes take "
                         f"and return torch tensors (interface 'torch' or 'auto')")


def _keep_calls_eager() -> None:
    """Wrap ``QNode.__call__`` in ``torch.compiler.disable`` once, when the first qnode is made
    rather than at import: the wrapper imports ``torch._dynamo`` (about 2 s), and no qnode can
    be traced by ``torch.compile`` before one exists."""
    if not getattr(QNode, "_calls_eager", False):
        from qdiff.bridge import eager_under_compile
        QNode.__call__ = eager_under_compile(QNode.__call__)
        QNode._calls_eager = True


class QNode:
    """A recorded-and-executed quantum function bound to a backend.

    Args:
        func: records gates and returns a measurement or a list/tuple of measurements.
        device: a backend from :func:`qdiff.device`.
        diff_method: ``"best"`` (default), ``"backprop"``, ``"adjoint"``, ``"parameter-shift"``,
            ``"finite-diff"`` or ``"spsa"``.
        interface: ``"auto"`` or ``"torch"`` (the only one: results are torch tensors).
        shots: ``"device"`` (default: the device's setting), ``None`` (exact) or a number of
            shots; a call may override it with ``shots=`` (unless the function itself has a
            ``shots`` argument).
        **gradient_kwargs: options of the gradient rule (``h`` for finite-diff; ``num_directions``,
            ``epsilon``, ``seed`` for spsa).

    Calling it returns torch tensors: scalar measurements in a list are stacked along the last
    dimension, leading batch dimensions of the inputs broadcast into leading output dimensions.
    """

    def __init__(self, func, device, diff_method: str = "best", interface: str = "auto",
                 shots=DEVICE_SHOTS, **gradient_kwargs):
        check_keywords(gradient_kwargs, interface)
        from qdiff.bridge import check_device
        check_device(device)
        # validated once; SPSA's direction stream lives here, advanced by every backward
        self.options = make_options(diff_method, gradient_kwargs)
        from qdiff.bridge import effective_shots
        if shots != DEVICE_SHOTS:  # refused now, not at the first call
            for s in shot_vector(shots) or (shots,):
                effective_shots(device, s)
        self.func = func
        self.device = device
        self.diff_method = diff_method
        self.interface = interface
        self.shots = shots
        self.gradient_kwargs = dict(gradient_kwargs)
        try:
            import inspect
            self._func_takes_shots = "shots" in inspect.signature(func).parameters
        except (TypeError, ValueError):
            self._func_takes_shots = False
        functools.update_wrapper(self, func)
        _keep_calls_eager()

    # -- recording ------------------------------------------------------------------------
    def construct(self, *args, **kwargs) -> tuple[Recorded, object]:
        """Record one call: ``(Recorded, returned measurement structure)``."""
        return _record(self.func, self.device.wires, args, kwargs)

    def __call__(self, *args, **kwargs):
        """Run the circuit. Under ``torch.compile`` this call stays eager (a graph break):
        recording is Python-level work that dynamo would otherwise retrace gate by gate
        (``_keep_calls_eager`` wraps it when the first qnode is made). A shot vector
        (``shots=[100, (10, 3)]``) gives a tuple with one result per partition."""
        from qdiff.bridge import refuse_graph_capture
        from qdiff.static import refuse_nested
        refuse_graph_capture("qnode", self.func)
        refuse_nested()
        recording.refuse_pennylane_recording()
        shots = self.shots
        if "shots" in kwargs and not self._func_takes_shots:
            shots = kwargs.pop("shots")
        vector = shot_vector(shots)
        if vector is not None:  # one result per partition, as PennyLane's shot vectors
            return tuple(self._run(args, kwargs, s) for s in vector)
        return self._run(args, kwargs, shots)

    def _run(self, args, kwargs, shots):
        from qdiff.bridge import execute
        # the device refuses a batch that cannot run before theta (B, P) is assembled
        recorded, result = _record(self.func, self.device.wires, args, kwargs,
                                   getattr(self.device, "check_batch", None))
        try:
            outs = execute(recorded, self.backend_for(recorded.circuit), self.diff_method,
                           stacked=True, options=self.options, shots=shots)
        except QdiffMemoryError as e:
            extra = recorded.circuit.num_wires - self.device.num_wires
            if extra <= 0:
                raise
            raise QdiffMemoryError(f"{e} ({extra} of the {recorded.circuit.num_wires} wires "
                                   f"are the circuit's mid-circuit measurements: deferred "
                                   f"measurement adds one wire each)") from None
        if isinstance(outs, torch.Tensor):  # (B, K) of scalar measurements
            bshape = tuple(recorded.batch_shape)
            if isinstance(result, Measurement):
                out = outs[:, 0].reshape(bshape)
            else:
                out = outs.reshape(bshape + (outs.shape[-1],))
        else:
            out = _assemble(outs, recorded, result)
        if recorded.theta.dtype is torch.float16:
            from qdiff.bridge import refuse_float16_overflow
            refuse_float16_overflow(out, f"qnode '{getattr(self.func, '__name__', '?')}'")
        return out

    def backend_for(self, circuit):
        """The device, or for a circuit with mid-circuit measurements (extra wires after the
        device's) a copy of it with those wires, kept per width so its sampling stream goes
        on from call to call."""
        if circuit.num_wires <= self.device.num_wires:
            return self.device
        from qdiff.bridge import deferred_backend
        return deferred_backend(self.device, circuit, self.__dict__.setdefault("_widened", {}))

    def __deepcopy__(self, memo):
        """A deep copy shares the qnode, as it shares a function: ``copy.deepcopy(model)``
        works whatever scope the qnode was defined in."""
        return self

    def __reduce__(self):
        """Pickle by reference (module + name), so ``torch.save(model)`` works for qnodes
        defined at module level (with the decorator, or bound to any module-level name)."""
        from qdiff.bridge import module_reference
        return (_load_qnode, module_reference(self, "qnode"))

    def __repr__(self):
        shots = "" if self.shots == DEVICE_SHOTS else f", shots={self.shots}"
        return f"<QNode {getattr(self.func, '__name__', '?')} on {self.device!r}, " \
               f"diff_method={self.diff_method!r}{shots}>"


def _load_qnode(module: str, qualname: str):
    import importlib
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def qnode(device, diff_method: str = "best", interface: str = "auto", shots=DEVICE_SHOTS,
          static: bool = False, **gradient_kwargs):
    """Decorator form of :class:`QNode`: ``@qd.qnode(dev, diff_method="adjoint")``.

    ``static=True`` records the circuit once per call signature and replays only the angle
    binding (:class:`~qdiff.static.StaticQNode`; valid when the structure depends on argument
    shapes and non-tensor arguments only, which the trace checks).

    Applied to a ready circuit instead of a function (a ``Circuit``, a Qiskit
    ``QuantumCircuit`` or an OpenQASM import), it returns a
    :class:`~qdiff.circuit_qnode.CircuitQNode` called with parameter bindings
    (``observables=`` and ``arguments=`` are its options)."""
    if not isinstance(static, bool):
        raise QdiffError(f"static must be True or False; got {static!r}")

    def wrap(func):
        if not callable(func):
            if static:
                raise QdiffError("static=True applies to a qnode function, not to a ready "
                                 "circuit (whose structure is fixed already)")
            if shots != DEVICE_SHOTS:
                raise QdiffError("qnode: shots= is taken by qnodes of functions; for a ready "
                                 "circuit give the device its shots")
            check_keywords({k: v for k, v in gradient_kwargs.items()
                            if k not in ("observables", "arguments")}, interface)
            from qdiff.circuit_qnode import CircuitQNode
            return CircuitQNode(func, device, diff_method, **gradient_kwargs)
        node = QNode(func, device, diff_method, interface, shots, **gradient_kwargs)
        if static:
            from qdiff.static import StaticQNode
            return StaticQNode(node)
        return node
    return wrap


def _flatten_measurements(result) -> list:
    if isinstance(result, Measurement):
        return [result]
    if isinstance(result, (list, tuple)) and result and all(isinstance(m, Measurement) for m in result):
        return list(result)
    raise QdiffError("a qnode must return a measurement (qd.expval, qd.var, qd.probs, qd.sample, "
                     f"qd.counts, qd.state) or a list of them; got {type(result).__name__}")


def _to_counts(samples: torch.Tensor, m: Measurement):
    """Per binding, the dict of outcome counts of ``samples`` (bits ``(B, shots, k)`` or
    eigenvalues ``(B, shots)``); with ``all_outcomes`` every possible outcome is a key.
    Eigenvalues count under the observable's eigenvalue they were sampled from
    (:func:`~qdiff.circuits.measurements.outcome_values`), in any precision."""
    import numpy as np
    from qdiff.circuits.measurements import (MAX_ALL_OUTCOMES_WIRES, nearest_outcomes,
                                             outcome_values)
    if m.obs is None:
        k = samples.shape[-1]
        if m.all_outcomes and k > MAX_ALL_OUTCOMES_WIRES:
            raise QdiffError(f"counts(all_outcomes=True) of {k} wires would list 2**{k} "
                             f"outcomes; at most {MAX_ALL_OUTCOMES_WIRES} wires")
        every = [format(i, f"0{k}b") for i in range(2 ** k)] if m.all_outcomes else []

        def tally(b):
            # each shot's bits as one integer, counted by torch: only the distinct outcomes
            # become Python strings
            if not 0 < k <= 62:
                return Counter("".join(str(int(v)) for v in row) for row in b.tolist()).items()
            weights = torch.tensor([1 << (k - 1 - j) for j in range(k)], dtype=torch.int64,
                                   device=b.device)
            vals, cnt = torch.unique((b.to(torch.int64) * weights).sum(-1), return_counts=True)
            return zip([format(v, f"0{k}b") for v in vals.tolist()], cnt.tolist())
    else:
        outcomes = outcome_values(m.obs)
        every = outcomes if m.all_outcomes else []

        if m.integer:  # 0/1 values of a mid-circuit measurement value, int as its samples
            outcomes = [int(v) for v in outcomes]
            every = outcomes if m.all_outcomes else []

        def tally(b):
            vals, cnt = np.unique(b.detach().cpu().numpy().reshape(-1), return_counts=True)
            return zip(nearest_outcomes(vals, outcomes), cnt.tolist())

    def one(b):
        out = dict.fromkeys(every, 0)
        for key, c in tally(b):
            out[key] = out.get(key, 0) + c
        return dict(sorted(out.items()))
    return one(samples[0]) if samples.shape[0] == 1 else [one(b) for b in samples]


def _assemble(outs: list, recorded: Recorded, result):
    """Reshape ``(B, ...)`` outputs to ``batch_shape + (...)`` and rebuild the user's structure."""
    bshape = recorded.batch_shape
    theta = recorded.theta
    real_dtype = theta.dtype if recorded.circuit.num_params else None
    shaped = []
    for m, o in zip(recorded.circuit.measurements, outs):
        if m.kind == "counts":
            shaped.append(_to_counts(o, m))
            continue
        if m.integer:  # 0/1 outcomes of a mid-circuit measurement value
            o = o.round().to(torch.int64)
        if real_dtype is not None and o.dtype.is_floating_point and o.dtype != real_dtype:
            o = o.to(real_dtype)
        shaped.append(o.reshape(tuple(bshape) + tuple(o.shape[1:])))
    if isinstance(result, Measurement):
        return shaped[0]
    ms = recorded.circuit.measurements
    if all(m.is_scalar for m in ms):
        return torch.stack(shaped, dim=-1)
    return type(result)(shaped) if isinstance(result, tuple) else list(shaped)


def _record(func, wires, args, kwargs, check_batch=None) -> tuple:
    with recording.record(root=True) as rec:
        result = func(*args, **kwargs)
    raw = rec.raw
    if any(recording.is_pennylane(i) for i in raw) or recording.is_pennylane(result) or (
            isinstance(result, (list, tuple)) and any(map(recording.is_pennylane, result))):
        raw, result, mid_count = pennylane_io.convert_recording(raw, result, rec.mid_count,
                                                                     wires)
    else:
        mid_count = rec.mid_count
    items = [i for i in raw if not isinstance(i, Measurement)]
    flat = _flatten_measurements(result)
    if mid_count:
        wires, flat = _deferred(wires, flat, mid_count)
    return Circuit.from_recording(items, wires, flat, check_batch=check_batch), result


def _deferred(wires: tuple, flat: list, count: int) -> tuple:
    """Wires and measurements of a call with ``count`` mid-circuit measurements: one extra
    wire per measurement after the device's (deferred measurement); measurements of "all
    wires" keep meaning the device's wires."""
    from qdiff.circuits.midcircuit import MidWire
    out = []
    for m in flat:
        if m.kind == "state":
            raise QdiffError("state() of a circuit with mid-circuit measurements is a mixed "
                             "state; return density_matrix(wires) or probs() instead")
        if m.wires is None and m.obs is None and m.kind in ("probs", "sample", "counts"):
            m = Measurement(m.kind, None, tuple(wires), m.all_outcomes)
        out.append(m)
    return tuple(wires) + tuple(MidWire(i) for i in range(count)), out


def record_circuit(func, wires, *args, **kwargs) -> Recorded:
    """Record ``func(*args)`` on ``wires`` without running it (for drawing, compiling, export).

    ``func`` is a quantum function or a qnode of one (plain or static: its function is
    recorded)."""
    from qdiff.backends.base import normalize_device_wires
    if isinstance(func, QNode) or isinstance(getattr(func, "qnode", None), QNode):
        func = func.func
    return _record(func, normalize_device_wires(wires), args, kwargs)[0]

