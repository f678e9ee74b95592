"""A ready circuit as a qnode: a qdiff ``Circuit``, a Qiskit ``QuantumCircuit`` or an OpenQASM
import (:class:`~qdiff.circuits.qiskit_io.QiskitImport`), run with parameter bindings.

``qd.qnode(dev)(circuit)`` returns a :class:`CircuitQNode`. It records nothing per call: the
circuit is fixed, and each call builds ``theta`` ``(B, P)`` from the bindings with a few tensor
operations (one column per parameter; angle expressions that are not affine in one parameter are
evaluated in torch into extra columns), then runs the same execute path as any qnode: every
backend and ``diff_method``, batched bindings, torch autograd back into the bindings.

>>> import torch, qdiff as qd
>>> from qiskit import QuantumCircuit
>>> from qiskit.circuit import Parameter
>>> a, b = Parameter("a"), Parameter("b")
>>> qc = QuantumCircuit(1); _ = qc.rx(a * b, 0)
>>> f = qd.qnode(qd.device("statevector", wires=1))(qc)
>>> f(torch.tensor([0.5, 2.0]))          # values of qc.parameters (a, b) on the last dim
tensor([0.5403])
>>> f({a: torch.zeros(3), "b": 1.0}).shape   # or a mapping by Parameter or name
torch.Size([3, 1])
"""
from __future__ import annotations

import inspect
import numbers

import torch

from qdiff.circuits import recording
from qdiff.circuits.circuit import Circuit, Recorded
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.measurements import Measurement
from qdiff.circuits.observables import Factor, Observable
from qdiff.circuits.qiskit_io import (QiskitImport, from_qiskit, is_quantum_circuit,
                                      observable_from_qiskit)
from qdiff.bridge import eager_under_compile


class CircuitQNode:
    """A fixed circuit bound to a backend, called with parameter bindings.

    Args:
        source: a ``Circuit`` (columns named ``theta[i]``), a ``QuantumCircuit`` or a
            ``QiskitImport`` (``qasm.load``; parameters are ``imp.parameters``).
        device: a backend from :func:`qdiff.device`, as wide as the circuit.
        diff_method: as for :class:`qdiff.QNode`.
        observables: ``None`` (the circuit's own measurements; else the probabilities of the
            values its measurements leave in the classical bits (a dynamic circuit's deferred
            ones included), indexed by the classical bits' integer (bit 0 least
            significant, as Qiskit's counts and SamplerQNN); else ``Z`` on every qubit as one observable, ``Z⊗...⊗Z`` as
            Qiskit ML's EstimatorQNN), one observable (output without a trailing dim) or a list
            (output ``(..., K)``); each a ``SparsePauliOp``, ``Pauli``, label or qdiff observable.
        arguments: ``{argument name: parameters}`` splitting the parameters into named call
            arguments (Qiskit ``Parameter`` s, ``ParameterVector`` s, names or column indices);
            default one argument ``values`` with every parameter in order. Every parameter must
            be in exactly one argument.

    Calling it with tensors ``(..., k)`` per argument (``k`` its number of parameters; leading
    dims broadcast into the batch) returns ``(..., K)`` expectation values (float64).
    """

    def __init__(self, source, device, diff_method: str = "best", observables=None,
                 arguments=None, **gradient_kwargs):
        from qdiff.bridge import check_device
        from qdiff.rules import make_options
        check_device(device)
        # validated once; SPSA's direction stream lives here, advanced by every backward
        self.options = make_options(diff_method, gradient_kwargs)
        imp = as_import(source)
        # a QuantumCircuit source is kept so that the qnode pickles (torch.save of a model)
        self._args = (source if is_quantum_circuit(source) else None,
                      device, diff_method, observables, arguments, dict(gradient_kwargs))
        circuit = imp.circuit
        nq = imp.num_qubits
        if device.num_wires != nq:
            raise QdiffError(f"the circuit has {nq} qubits but the device has "
                             f"{device.num_wires} wires")
        noisy = getattr(device, "noise", None) is not None or \
            getattr(device, "noise_model", None) is not None or getattr(device, "name", "") == "ibm"
        if imp.delays and noisy:  # (qdiff's circuits carry no delays: they are left out)
            raise QdiffError(f"the circuit has {imp.delays} delay(s) of nonzero duration and "
                             f"the device ({getattr(device, 'name', '?')}) has noise: the "
                             "decoherence during the delays would be left out; remove them, "
                             "or model the idle time as channels (qd.ThermalRelaxationError "
                             "on the wires, on a qdiff noise device)")
        self.source, self.device, self.diff_method = imp, device, diff_method
        # a dynamic circuit's deferred measurements: one extra wire each after the device's
        self._backend = device if nq == circuit.num_wires else _deferred_backend(device, circuit)
        self.gradient_kwargs = dict(gradient_kwargs)
        try:
            ms, self.single = _measurements(imp, observables)
        except QdiffError as exc:
            if getattr(source, "layout", None) is None or "acts on" not in str(exc):
                raise
            raise QdiffError(f"{exc}: the circuit is transpiled, so observables act on its "
                             "physical qubits, as for Qiskit's Estimator; lay a logical one "
                             "out with obs.apply_layout(qc.layout)") from None
        if observables is not None:  # converted (qd.Z(0) holds a gate object: not picklable)
            obs = [m.obs for m in ms]
            self._args = self._args[:3] + (obs[0] if self.single else obs,) + self._args[4:]
        self.circuit = circuit.with_measurements(ms)
        self.names = _parameter_names(imp)
        self.arg_names, self.arg_sizes, self.perm = _split(imp, self.names, arguments)
        # a circuit without parameters is called with no bindings: f() (or f(torch.zeros(0)))
        empty = inspect.Parameter.empty if any(self.arg_sizes) else None
        self.__signature__ = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=empty)
             for n in self.arg_names])
        self.__name__ = "circuit"

    @property
    def num_parameters(self) -> int:
        return len(self.names)

    @eager_under_compile
    def __call__(self, *args, **kwargs):
        """Run the circuit for the given bindings (stays eager under ``torch.compile``)."""
        from qdiff.bridge import execute, refuse_graph_capture
        refuse_graph_capture("circuit qnode", None)
        recording.refuse_pennylane_recording("a circuit qnode")
        recorded = self.record(*args, **kwargs)
        outs = execute(recorded, self._backend, self.diff_method, stacked=True,
                       options=self.options)
        outs = _in_dtype(outs, recorded.theta.dtype if self.circuit.num_params else None)
        bshape = tuple(recorded.batch_shape)
        if isinstance(outs, torch.Tensor):
            outs = list(outs.unbind(1)) if self.single else [outs]
            if not self.single:
                return outs[0].reshape(bshape + (outs[0].shape[-1],))
        shaped = [o.reshape(bshape + tuple(o.shape[1:])) for o in outs]
        if self.single:
            return shaped[0]
        if all(m.is_scalar for m in self.circuit.measurements):
            return torch.stack(shaped, dim=-1)
        return shaped

    def record(self, *args, **kwargs) -> Recorded:
        """The :class:`~qdiff.circuits.circuit.Recorded` call: the circuit, ``theta`` ``(B, P)``
        built from the bindings, the batch shape and the trainable/shared columns."""
        try:
            bound = self.__signature__.bind(*args, **kwargs)
        except TypeError as exc:
            raise QdiffError(f"circuit qnode: {exc}; its arguments are {list(self.arg_names)}") \
                from None
        bound.apply_defaults()
        values = [torch.zeros(0, dtype=torch.float64) if bound.arguments[n] is None else
                  bound.arguments[n] for n in self.arg_names]
        if len(values) == 1 and isinstance(values[0], dict):
            values = [self._from_mapping(values[0])]
        tensors = [_as_tensor(v, n, k) for v, n, k in zip(values, self.arg_names, self.arg_sizes)]
        return self._recorded(tensors)

    def _from_mapping(self, mapping: dict) -> torch.Tensor:
        """``{Parameter or name: value}`` -> ``(..., Np)`` in argument order."""
        by_key: dict = {}
        vector = _parameter_vector_class()
        for key, v in mapping.items():
            if isinstance(key, vector):  # Qiskit's {ParameterVector: values (..., len)}
                t = _as_tensor(v, key.name, len(key), f"binding for {key.name}")
                for i, element in enumerate(key):
                    self._bind(by_key, element, t[..., i])
                continue
            self._bind(by_key, key, v)
        order = [self.names[i] for i in self.perm] if self.perm is not None else self.names
        missing = [n for n in order if n not in by_key]
        if missing:
            raise QdiffError(f"no binding for parameter(s) {_preview(missing)}")
        cols = [_float(by_key[n]) for n in order]
        try:
            shape = torch.broadcast_shapes(*(c.shape for c in cols)) if cols else ()
        except RuntimeError:
            raise QdiffError("binding batch shapes do not broadcast: " + ", ".join(
                f"{n} {tuple(c.shape)}" for n, c in zip(order, cols))) from None
        if not cols:
            return torch.zeros(0, dtype=torch.float64)
        return torch.stack([c.expand(shape) for c in cols], dim=-1)

    def _bind(self, by_key: dict, key, value) -> None:
        """One ``{Parameter or name: value}`` entry; a value that is not a tensor (a Python or
        numpy number, a list) becomes float64, as Qiskit binds it."""
        name = key if isinstance(key, str) else getattr(key, "name", None)
        if name not in self.names:
            raise QdiffError(f"binding for {key!r}: not a parameter of the circuit "
                             f"(its parameters: {_preview(self.names)})")
        if name in by_key:
            raise QdiffError(f"parameter '{name}' is bound twice")
        if hasattr(key, "uuid") and self.source.parameters[self.names.index(name)] != key:
            raise QdiffError(f"binding for {key!r}: a different Parameter of the same name as "
                             "the circuit's")
        if name in by_key:
            raise QdiffError(f"parameter '{name}' is bound twice")
        by_key[name] = _real_tensor(value, f"binding for {key!r}", "a real number or tensor")

    def _recorded(self, tensors: list) -> Recorded:
        try:
            batch_shape = tuple(torch.broadcast_shapes(*(t.shape[:-1] for t in tensors)))
        except RuntimeError:
            raise QdiffError("argument batch shapes do not broadcast: " + ", ".join(
                f"{n} {tuple(t.shape)}" for n, t in zip(self.arg_names, tensors))) from None
        dtype = _result_dtype(tensors)
        device = next((t.device for t in tensors if t.numel()), None)
        bsz = 1
        for s in batch_shape:
            bsz *= s
        parts = [t.to(dtype=dtype, device=device).expand(*batch_shape, t.shape[-1])
                 .reshape(bsz, t.shape[-1]) for t in tensors]
        values = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0] if parts else \
            torch.zeros(bsz, 0, dtype=dtype, device=device)
        if self.perm is not None:
            values = values.index_select(1, self.perm.to(values.device))
        theta = self.source.theta(values) if isinstance(self.source, QiskitImport) and \
            self.source.num_expressions else values
        self._check_finite(theta)
        trainable, shared = self._column_flags(tensors, bsz)
        return Recorded(self.circuit, theta, batch_shape, trainable, None, shared=shared)

    def _column_flags(self, tensors: list, bsz: int) -> tuple:
        train, share = [], []
        for t in tensors:
            k = t.shape[-1]
            train.extend([bool(t.requires_grad)] * k)
            share.extend([t.numel() == k] * k)
        if self.perm is not None:
            order = self.perm.tolist()
            train, share = [train[i] for i in order], [share[i] for i in order]
        table = getattr(self.source, "expressions", None)
        for deps in ([] if table is None else table.dependencies):
            train.append(any(train[d] for d in deps))
            share.append(all(share[d] for d in deps))
        return tuple(train), (tuple(share) if bsz > 1 else None)

    def _check_finite(self, theta: torch.Tensor) -> None:
        if theta.numel() == 0:
            return
        ok = torch.isfinite(theta.detach()).all(dim=0)
        if bool(ok.all()):
            return
        bad = int((~ok).nonzero()[0, 0])
        if bad < len(self.names):
            raise QdiffError(f"parameter '{self.names[bad]}' has a NaN or infinite value")
        expr = self.source.expressions.expressions[bad - len(self.names)]
        raise QdiffError(f"angle {expr} is NaN or infinite at the given parameter values")

    def __deepcopy__(self, memo):
        """A deep copy shares the qnode, as it shares a function: ``copy.deepcopy(model)``
        works whatever scope the qnode was defined in."""
        return self

    def __reduce__(self):
        """Pickle by construction arguments (a QuantumCircuit source; a converted circuit holds
        gate objects that do not pickle)."""
        if self._args[0] is None:
            raise QdiffError("cannot pickle a qnode built from a Circuit or an OpenQASM import; "
                             "save the model's state_dict() instead")
        qc, device, method, observables, arguments, kwargs = self._args
        return (_rebuild, (qc, device, method, observables, arguments, kwargs))

    def __repr__(self):
        return (f"<CircuitQNode {self.circuit.num_wires} qubits, {self.num_parameters} "
                f"parameters on {self.device!r}, diff_method={self.diff_method!r}>")


def _deferred_backend(device, circuit):
    """The device widened by the extra wires of a dynamic circuit's deferred measurements,
    after checking that its states fit (every wire of the device is simulated)."""
    from qdiff.bridge import deferred_backend
    from qdiff.circuits import memory
    n, extra = circuit.num_wires, circuit.num_wires - device.num_wires
    memory.require(4 * 16.0 * 2.0 ** n,  # the engine's working states (simulate.check_memory)
                   f"deferred measurement of a dynamic circuit ({device.num_wires} wire(s) of "
                   f"the device and {extra} extra wire(s), one per mid-circuit measurement or "
                   f"reset: 4 states of {n} qubits)", getattr(device, "torch_device", None),
                   hint="qdiff.primitives' Sampler / Estimator simulate only the qubits the "
                        "circuit uses")
    return deferred_backend(device, circuit, {})


def _rebuild(qc, device, diff_method, observables, arguments, kwargs) -> CircuitQNode:
    return CircuitQNode(qc, device, diff_method, observables, arguments, **kwargs)


def as_import(source) -> QiskitImport:
    """A ``QiskitImport`` view of a ``Circuit`` / ``QuantumCircuit`` / ``QiskitImport``."""
    if isinstance(source, QiskitImport):
        return source
    if isinstance(source, Circuit):
        return QiskitImport(source, [None] * source.num_params)
    if is_quantum_circuit(source):
        return from_qiskit(source)
    raise QdiffError(f"expected a callable, a Circuit, a QuantumCircuit or a QiskitImport "
                     f"(qasm.load); got {type(source).__name__}")


def _parameter_names(imp: QiskitImport) -> list:
    return [f"theta[{i}]" if p is None else p.name for i, p in enumerate(imp.parameters)]


def _preview(names, limit: int = 8) -> str:
    names = list(names)
    more = f", ... ({len(names)} in all)" if len(names) > limit else ""
    return ", ".join(repr(n) for n in names[:limit]) + more


def _measurements(imp: QiskitImport, observables) -> tuple:
    """``(measurements, single)``: ``single`` when one observable was given (no trailing dim)."""
    n = imp.num_qubits
    if observables is None:
        if imp.circuit.measurements:
            return tuple(imp.circuit.measurements), len(imp.circuit.measurements) == 1
        if imp.measurements:
            owner = {}  # clbit -> the qubit of its last measurement (Qiskit's value)
            for q, c in imp.measurements:
                owner[c] = q
            wires = []
            for c in sorted(owner):
                if owner[c] not in wires:
                    wires.append(owner[c])
            # the last classical bit first: index = sum_i c_i 2**i, Qiskit's integer of the
            # bit string (SamplerQNN's output index)
            return (Measurement("probs", None, tuple(reversed(wires))),), True
        z_all = Observable([1.0], [tuple(Factor((w,), "Z") for w in range(n))])
        return (Measurement("expval", z_all),), False
    single = not isinstance(observables, (list, tuple))
    obs = [observables] if single else list(observables)
    if not obs:
        raise QdiffError("observables: an empty list (give at least one observable)")
    measured = {q for q, _ in imp.measurements}  # final measurements (not run: read)
    ms = []
    for i, o in enumerate(obs):
        what = "observable" if single else f"observables[{i}]"
        ob = observable_from_qiskit(o, n, what)
        ob.check_hermitian()
        _check_after_final_measurements(ob, measured, what)
        ms.append(Measurement("expval", ob))
    return tuple(ms), single


def _check_after_final_measurements(ob: Observable, measured: set, what: str) -> None:
    """An observable of a circuit with final measurements acts on the measured qubits by Z
    (or I) only: those commute with the measurements, so their value is the same with or
    without them; another one's value would have to be of the measured mixture: refused."""
    for term in ob.terms:
        for f in term:
            if not measured.intersection(f.wires) or f.kind in ("Z", "I"):
                continue
            if f.kind == "M" and bool((f.matrix - torch.diag(torch.diagonal(f.matrix)))
                                      .abs().max() == 0):
                continue  # a diagonal matrix commutes with the measurements too
            raise QdiffError(f"{what}: applies {f.kind} to qubit(s) "
                             f"{sorted(measured & set(f.wires))} after their final "
                             "measurement, so its value would "
                             "be of the measured mixture; remove the final measurements "
                             "(circuit.remove_final_measurements()) to take it of the state")


def _split(imp: QiskitImport, names: list, arguments) -> tuple:
    """``(argument names, sizes, permutation to column order or None)``."""
    if arguments is None:
        return ("values",), (len(names),), None
    if not isinstance(arguments, dict) or not arguments:
        raise QdiffError("arguments must be a non-empty dict {name: parameters}")
    owner: dict = {}
    cols, sizes = [], []
    for arg, params in arguments.items():
        if not str(arg).isidentifier():
            raise QdiffError(f"argument name {arg!r} is not a Python identifier")
        mine = resolve_parameters(imp, names, params, arg)
        for c in mine:
            if c in owner:
                where = "twice in" if owner[c] == arg else f"in both {owner[c]} and"
                raise QdiffError(f"parameter '{names[c]}' is listed {where} {arg}")
            owner[c] = arg
        cols.extend(mine)
        sizes.append(len(mine))
    left = [names[c] for c in range(len(names)) if c not in owner]
    if left:
        raise QdiffError(f"circuit parameter(s) {_preview(left)} are in none of "
                         f"{' / '.join(arguments)}: every parameter must be an input or a weight")
    perm = None
    if cols != list(range(len(cols))):
        perm = torch.argsort(torch.tensor(cols, dtype=torch.long))
    return tuple(arguments), tuple(sizes), perm


def resolve_parameters(imp: QiskitImport, names: list, params, what: str) -> list:
    """Column indices of ``params`` (Parameters, ParameterVectors, names or column ints; a
    ``ParameterVector`` stands for its elements in order)."""
    if params is None:
        return []
    vector = _parameter_vector_class()
    if isinstance(params, (str, numbers.Integral)) or (hasattr(params, "uuid")
                                                       and not isinstance(params, vector)):
        params = [params]
    out = []
    for p in params:
        if isinstance(p, vector):
            out.extend(resolve_parameters(imp, names, list(p), what))
            continue
        if isinstance(p, numbers.Integral) and not isinstance(p, bool):
            if not 0 <= int(p) < len(names):
                raise QdiffError(f"{what}: column {p} is out of range (the circuit has "
                                 f"{len(names)} parameters)")
            out.append(int(p))
            continue
        name = p if isinstance(p, str) else getattr(p, "name", None)
        if name not in names or (hasattr(p, "uuid") and imp.parameters[names.index(name)] != p):
            raise QdiffError(f"{what}: {p!r} is not a parameter of the circuit (its parameters: "
                             f"{_preview(names)})")
        out.append(names.index(name))
    return out


def _parameter_vector_class():
    """Qiskit's ``ParameterVector`` class, or ``()`` (matches nothing) without Qiskit."""
    try:
        from qiskit.circuit import ParameterVector
    except ImportError:
        return ()
    return ParameterVector


def _float(t: torch.Tensor) -> torch.Tensor:
    if t.is_complex():
        raise QdiffError("parameter values must be real; got a complex tensor")
    return t if t.dtype.is_floating_point else t.to(torch.float64)


def _real_tensor(value, what: str, expected: str) -> torch.Tensor:
    """A real tensor (a value that is not a tensor -- a number, a list, a numpy array -- as
    float64, as Qiskit binds it; complex values refused, never cast to their real part)."""
    if not isinstance(value, torch.Tensor):
        import numpy as np
        try:
            arr = np.asarray(value)
            complex_values = np.iscomplexobj(arr)
            if not complex_values:
                value = torch.as_tensor(arr.astype(np.float64))
        except (TypeError, ValueError, RuntimeError):
            raise QdiffError(f"{what}: expected {expected}; got {type(value).__name__}") \
                from None
        if complex_values:
            raise QdiffError(f"{what}: parameter values must be real; got complex values")
    return _float(value)


def _as_tensor(value, name: str, k: int, what: str = "") -> torch.Tensor:
    """An argument (or ``what``) as a real tensor ``(..., k)``."""
    what = what or f"argument '{name}'"
    value = _real_tensor(value, what, f"a real tensor of shape (..., {k})")
    if value.ndim == 0 or value.shape[-1] != k:
        raise QdiffError(f"{what} has shape {tuple(value.shape)}; expected "
                         f"(..., {k}) ({k} parameter value(s) on the last dim)")
    return value


def _in_dtype(outs, dtype):
    """Real outputs in the bindings' ``dtype`` (float32 bindings give float32 outputs, whichever
    path ran: the rules' Function, backprop or a call without gradients), as a function
    qnode's; complex outputs (states) and integer samples keep theirs."""
    if dtype is None:
        return outs
    if isinstance(outs, torch.Tensor):
        return outs.to(dtype) if outs.dtype.is_floating_point and outs.dtype != dtype else outs
    return [o.to(dtype) if o.dtype.is_floating_point and o.dtype != dtype else o for o in outs]


def _result_dtype(tensors: list) -> torch.dtype:
    """float64 unless every argument is float32 (a model cast with ``.float()``)."""
    dts = {t.dtype for t in tensors}
    return torch.float32 if dts == {torch.float32} else torch.float64
