"""``qml.device("qdiff.statevector")``: qdiff's statevector engine as a PennyLane device.

The device speaks PennyLane's ``pennylane.devices.Device`` API. Preprocessing decomposes every
operation into the gates qdiff runs natively (the TOML file beside this module lists them),
resolves mid-circuit measurements by deferring them (a postselection becomes the engine's
projector gate; the final state is then normalised, and with shots the kept shots drawn, as on
``default.qubit``), and validates wires and measurements.
``execute`` converts each tape (:func:`qdiff.circuits.pennylane_io.from_pennylane_tape`) into a
:class:`~qdiff.backends.base.Job` and runs the whole batch through the engine in ONE
``execute(jobs)`` call; a broadcast tape is one job with ``B`` parameter rows.

Measurements: exact ``expval``/``var`` of any observable qdiff converts, ``probs(wires)`` and
``state()`` are computed by the engine itself. Every other measurement (``density_matrix``,
``probs(op=...)``, projectors, sparse Hamiltonians, mid-circuit measurement statistics) and every
finite-shot measurement (``sample``, ``counts``, estimated ``expval``/``var``/``probs``, shot
vectors) is read off the engine's final state by PennyLane's own measurement functions, the
same ones ``default.qubit`` uses, so the result formats are PennyLane's.

Derivatives: ``diff_method="adjoint"`` (and ``"best"``) uses the engine's adjoint reverse mode
(``Backend.vjp``) for ``compute_vjp``/``execute_and_compute_vjp`` and, with one-hot
cotangents, ``compute_derivatives``; ``diff_method="backprop"`` runs the torch engine inside
torch autograd (torch interface, exact results).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import replace
from pathlib import Path
from typing import Optional

import numpy as np
import pennylane as qml
import torch
from pennylane.devices import Device, ExecutionConfig
from pennylane.devices.modifiers import simulator_tracking, single_tape_support
from pennylane.devices.preprocess import (decompose, device_resolve_dynamic_wires, no_sampling,
                                          validate_adjoint_trainable_params,
                                          validate_device_wires, validate_measurements,
                                          validate_observables)
from pennylane.exceptions import DeviceError
from pennylane.math import Interface
from pennylane.measurements import (ClassicalShadowMP, ExpectationMP, ProbabilityMP, ShadowExpvalMP, StateMP,
                                    StateMeasurement, VarianceMP)

from qdiff.backends.base import Job
from qdiff.backends.pennylane_plugin import signature
from qdiff.circuits import pennylane_one_shot as one_shot
from qdiff.circuits import pennylane_tree as tree
from qdiff.circuits.pennylane_autograd import (backprop_interface, execute_autograd, has_boxes,
                                               nested_boxes, to_user, torch_backprop,
                                               torch_tape)
from qdiff.backends.statevector import StatevectorBackend
from qdiff.backends.statevector.engine import Residual
from qdiff.backends.statevector.simulate import Trace
from qdiff.circuits import memory
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.measurements import Measurement
from qdiff.circuits.pennylane_transforms import (decompose_broadcast, defer_within,
                                                 map_measurement_wires,
                                                 sampled_measurements, snapshot_store,
                                                 snapshots_taken)
from qdiff.circuits.operation import is_concrete
from qdiff.circuits.gates import check_unitary
from qdiff.circuits.pennylane_io import (autograd_exp_matrix, broadcast_exp_rotation,
                                        exp_pauli_rotation, from_pennylane_observable,
                                        from_pennylane_tape, tape_op_supported, tape_projector,
                                        tape_trainable_matrix, transform_matrix_refusal,
                                        trainable_matrix_ops, trainable_unitary_decomposition)

_DTYPES = {np.complex128: torch.complex128, np.complex64: torch.complex64,
           torch.complex128: torch.complex128, torch.complex64: torch.complex64}
_BACKPROP_INTERFACES = (Interface.TORCH, Interface.AUTOGRAD, Interface.NUMPY)


def _stopping_condition(op) -> bool:
    """Operations the engine runs as they are: its gates, a postselection's projector, and a
    ``QubitUnitary`` (also controlled) whose matrix requires grad, one engine gate holding
    that matrix (backprop differentiates it as ``default.qubit`` does; the adjoint method
    decomposes it, see :func:`_decomposer`)."""
    return tape_op_supported(op) or tape_projector(op) or tape_trainable_matrix(op)


def _decomposer(op):
    """PennyLane's decomposition of ``op``; an operation without one but with a matrix (e.g.
    ``BlockEncode``, ``DoubleExcitationPlus``) becomes that ``QubitUnitary``, only when the
    matrix is unitary (anything else is refused by name; under autograd the matrix of
    ``qml.exp``/``qml.evolve`` with a trainable coefficient is :func:`autograd_exp_matrix`'s).
    A trainable one reaches this only
    where the adjoint method would differentiate it: on one wire it decomposes into
    differentiable ``Rot`` angles, a wider or controlled one is refused by name (PennyLane's
    decomposition of it does not carry the matrix's gradient). ``qml.exp``/``qml.evolve`` of
    a Pauli word with a torch coefficient becomes its ``PauliRot``."""
    if tape_trainable_matrix(op) and (type(op).__name__ != "QubitUnitary" or
                                      len(op.wires) > 1):
        raise DeviceError(_adjoint_matrix_refusal(op))
    name = type(op).__name__
    if name in ("Exp", "Evolution"):
        rot = exp_pauli_rotation(op) or broadcast_exp_rotation(op)
        if rot is not None:
            return [qml.PauliRot(rot[0], rot[1], wires=rot[2])]
        m = autograd_exp_matrix(op)
        if m is not None or qml.math.ndim(op.coeff) > 0:  # PennyLane's decomposition cannot
            # read a broadcast coefficient: its (checked) matrix, one row per coefficient
            m = op.matrix() if m is None else m
            _unitary(m, op)
            return [qml.QubitUnitary(m, wires=op.wires)]
    if name == "QubitUnitary":
        _unitary(op.data[0], op)
        if qml.math.requires_grad(op.data[0]):
            try:
                return trainable_unitary_decomposition(op)
            except QdiffError as e:
                raise DeviceError(f"qdiff device: {e}") from None
    if name == "StatePrep" and hasattr(op.data[0], "toarray"):  # a sparse state: PennyLane's
        # decomposition of it needs the dense vector
        return [qml.StatePrep(op.data[0].toarray().reshape(-1), wires=op.wires)]
    if op.has_decomposition or not op.has_matrix:
        return op.decomposition()
    m = op.matrix()
    if qml.math.shape(m)[-1] != 2 ** len(op.wires):
        raise DeviceError(f"qdiff device: {op.name} on wires {list(op.wires)}: a "
                          f"{qml.math.shape(m)[-1]}-dimensional matrix is not a qubit operator")
    _unitary(m, op)
    return [qml.QubitUnitary(m, wires=op.wires)]


def _adjoint_matrix_refusal(op) -> str:
    d = 2 ** len(op.wires)
    return (f"adjoint + qdiff.statevector: {op.name} on wires {list(op.wires)}: a trainable "
            f"{d}x{d} matrix is differentiated by diff_method='backprop' only (the adjoint "
            f"method differentiates gate angles); use diff_method='backprop' or 'best'")


def _refuse_adjoint_matrix(circuit) -> None:
    """A ``DeviceError`` naming the first trainable matrix of ``circuit`` (a tape, or None)
    that the adjoint method cannot differentiate: on two or more wires, or controlled."""
    for op in trainable_matrix_ops(circuit) if circuit is not None else ():
        if type(op).__name__ != "QubitUnitary" or len(op.wires) > 1:
            raise DeviceError(_adjoint_matrix_refusal(op))


def _unitary(m, op) -> None:
    """Raise a ``DeviceError`` naming ``op`` unless its matrix ``m`` is unitary."""
    if qml.math.is_abstract(m):
        return
    if not isinstance(m, torch.Tensor):
        m = torch.as_tensor(np.asarray(qml.math.to_numpy(m)))
    try:
        check_unitary(m, who=f"{op.name} on wires {list(op.wires)}")
    except QdiffError as e:
        raise DeviceError(f"qdiff device: {e}") from None


def _adjoint_stopping_condition(op) -> bool:
    """Gates the adjoint sweep differentiates: every native gate except a trainable
    ``QubitUnitary``/``GlobalPhase`` matrix-only op (those are decomposed)."""
    return tape_op_supported(op)


def _adjoint_measurement(mp) -> bool:
    """Measurements the engine's reverse mode differentiates: exact expval/var of an observable
    qdiff converts, probs of wires."""
    if isinstance(mp, (ExpectationMP, VarianceMP)):
        return mp.obs is not None and mp.mv is None
    return type(mp) is ProbabilityMP and mp.obs is None and mp.mv is None


def _adjoint_observable(obs) -> bool:
    return _observable(obs) is not None


def _accepted_analytic(mp) -> bool:
    return qml.devices.default_qubit.accepted_analytic_measurement(mp)


def _accepted_sample(mp) -> bool:
    return qml.devices.default_qubit.accepted_sample_measurement(mp)


@qml.transform
def _expand_postselected_broadcast(tape):
    """``broadcast_expand`` for a sampled broadcast tape with postselection (each row keeps
    its own number of postselected shots) or a classical shadow (PennyLane's shadow
    measurements read one unbatched state)."""
    if tape.shots and tape.batch_size is not None and (
            any(tape_projector(op) for op in tape.operations) or
            any(isinstance(m, (ClassicalShadowMP, ShadowExpvalMP)) for m in tape.measurements)):
        return qml.transforms.broadcast_expand(tape)
    return (tape,), lambda results: results[0]


@qml.transform
def _refuse_postselection(tape, name: str):
    """Postselection in a tape the adjoint method would differentiate: refused."""
    for op in tape.operations:
        if tape_projector(op) or getattr(op, "postselect", None) is not None:
            raise DeviceError(f"{name}: postselection ({op!r}) is not differentiated by the "
                              "adjoint method; use diff_method='parameter-shift' or "
                              "'backprop'")
    return (tape,), lambda results: results[0]


def _add_measurement_checks(program, name: str) -> None:
    """The adjoint method's checks of a tape's observables and measurements."""
    program.add_transform(validate_observables, _adjoint_observable, name=name)
    program.add_transform(validate_measurements, analytic_measurements=_adjoint_measurement,
                          name=name)
    program.add_transform(_refuse_trainable_observables, name=name)


def _trainable_state_prep(tape) -> bool:
    """Whether the tape starts with a state preparation whose amplitudes are trainable."""
    ops = tape.operations if tape is not None else ()
    return bool(ops) and isinstance(ops[0], qml.operation.StatePrepBase) and \
        ops[0].num_params > 0 and 0 in tape.trainable_params


@qml.transform
def _refuse_trainable_observables(tape, name: str):
    """A trainable observable parameter in a tape the adjoint method would differentiate:
    refused (the reverse mode differentiates gate parameters only)."""
    for mp in tape.measurements:
        if mp.obs is not None and any(qml.math.requires_grad(d) for d in mp.obs.data):
            raise DeviceError(f"{name}: the parameters of the observable {mp.obs!r} are "
                              "trainable; the adjoint method differentiates gate parameters "
                              "only (use diff_method='backprop' or 'parameter-shift')")
    return (tape,), lambda results: results[0]


@qml.transform
def _expand_trainable_broadcast(tape):
    """``broadcast_expand`` for a broadcast tape with a trainable non-scalar parameter."""
    # (the tape's trainable_params are not set yet here: ask the parameters themselves)
    if tape.batch_size is not None and any(
            qml.math.ndim(p) > 0 and qml.math.requires_grad(p)
            for p in tape.get_parameters(trainable_only=False)):
        return qml.transforms.broadcast_expand(tape)
    return (tape,), lambda results: results[0]


class _PureStates(one_shot.Model):
    """State vectors for one-shot execution: rows ``(B, 2**n)`` run by the device's engine."""

    def __init__(self, device, labels, n, wire_map):
        self.device, self.labels, self.n, self.wire_map = device, labels, n, wire_map
        self.engine = device._engine(n)
        self.rng, self.row_shape = device._rng, (2,) * n
        self.row_bytes = float(2 ** n) * torch.empty((), dtype=device._cdtype).element_size()
        # amplitudes under 100 eps are rounding: 4.9e-28 in complex128, 1.4e-10 in complex64
        self.rounding = 1e4 * float(torch.finfo(device._cdtype).eps) ** 2

    def evolve(self, states, ops):
        if states is not None and not ops:
            return states
        circuit, theta, initial = self._converted(qml.tape.QuantumScript(list(ops)))
        if states is not None and initial is not None:
            raise QdiffError(f"{ops[0].name} on wires {list(ops[0].wires)}: a state "
                             "preparation after a mid-circuit measurement is not supported")
        start = states if states is not None else initial
        rows = 1 if start is None else start.shape[0]
        theta = theta if theta.shape[0] == rows else theta.expand(rows, -1)
        (res,) = self.engine.execute([Job(circuit, theta.contiguous(), start, shots=None)])
        return res.outputs[0]

    def _converted(self, tape):
        """``(circuit, theta, initial state)`` of a stretch of gates; a stretch whose signature
        the device has converted before (its template, kept when its theta is its angles
        gathered by column) only has its angles read (the same stretches recur in every
        call and branch)."""
        scanned = signature.scan([tape], lambda t: self.labels, _observable_key)[0]
        key = None if scanned is None else ("stretch", self.labels, scanned[0])
        tpl = None if key is None else self.device._templates.get(key)
        if tpl is not None:
            r = signature.row(scanned[1], tpl.columns)
            if r is not None and all(map(math.isfinite, r)):
                return tpl.circuit, torch.tensor([r], dtype=torch.float64), None
        rec, sources = from_pennylane_tape(tape, self.labels, [Measurement("state")],
                                           self.engine.check_batch)
        theta = rec.theta
        if key is not None and rec.initial_state is None and not theta.requires_grad and \
                theta.dtype == torch.float64 and theta.shape[0] == 1 and \
                len(sources) == theta.shape[1] and all(f == 1.0 for _, f in sources):
            r = signature.row(scanned[1], tuple(k for k, _ in sources))
            if r is not None and torch.equal(torch.tensor([r], dtype=torch.float64), theta):
                self.device._templates.put(key, signature.Template(
                    rec.circuit, sources, None, self.n, None, None))
        return rec.circuit, theta, rec.initial_state

    def _split(self, states, wire):
        return states.reshape(states.shape[0], 2 ** wire, 2, -1)

    def weights(self, states):
        return torch.view_as_real(states).square().sum(-1)  # |amplitude|^2, no sqrt

    def collapse(self, states, wire, outcomes, reset):
        s = self._split(states, wire)
        rows = torch.arange(s.shape[0], device=s.device)
        o = torch.as_tensor(outcomes, device=s.device)
        kept = s[rows, :, o]  # (B, 2**wire, rest)
        norm = torch.view_as_real(kept).square().sum((1, 2, 3)).sqrt()
        kept = kept / norm.reshape(-1, 1, 1).to(kept.dtype)
        new = torch.zeros_like(s)
        new[rows, :, torch.zeros_like(o) if reset else o] = kept
        return new.reshape(states.shape)


class _Plan:
    """One tape as one engine job: the job, its theta sources, and how to read the results."""

    __slots__ = ("tape", "job", "sources", "native", "batched", "n", "wire_map", "postselect",
                 "torch")

    def __init__(self, tape, job, sources, native, n, wire_map, postselect=False,
                 batched=None, torch_params=None):
        self.tape, self.job, self.sources, self.native = tape, job, sources, native
        self.batched = tape.batch_size is not None if batched is None else batched
        self.n, self.wire_map, self.postselect = n, wire_map, postselect
        self.torch = torch_params  # whether the tape has torch parameters (None: ask it)

    def torch_params(self) -> bool:
        return torch_tape(self.tape) if self.torch is None else self.torch


@simulator_tracking
@single_tape_support
class QdiffStatevector(Device):
    """qdiff's statevector engine (native CPU kernels, adjoint reverse mode) as a PennyLane
    device.

    Args:
        wires: number of wires or their labels (None: the wires of each circuit).
        shots: None (exact), an int, or a shot vector.
        seed: seed of the sampling generator (``numpy.random.default_rng`` seed; ``"global"``
            draws it from numpy's global generator).
        c_dtype: ``numpy.complex128`` (default) or ``numpy.complex64`` state amplitudes.
    """

    config_filepath = Path(__file__).parent / "qdiff_statevector.toml"
    _device_options = ("c_dtype",)

    @property
    def name(self):
        return "qdiff.statevector"

    def __init__(self, wires=None, shots=None, seed="global", c_dtype=np.complex128):
        super().__init__(wires=wires, shots=shots)
        key = c_dtype if c_dtype in _DTYPES else getattr(np, str(c_dtype), None)
        if key not in _DTYPES:
            raise DeviceError(f"qdiff.statevector: c_dtype must be numpy.complex128 or "
                              f"numpy.complex64; got {c_dtype!r}")
        self._c_dtype = c_dtype
        self._cdtype = _DTYPES[key]
        # drawn as default.qubit/default.mixed draw it: after np.random.seed(s) the device
        # samples what PennyLane's devices sample and leaves the global stream where they do
        seed = np.random.randint(0, high=10000000) if seed == "global" else seed
        self._rng = np.random.default_rng(seed)
        self._engines: dict = {}
        self._gate_set = self.capabilities.gate_set()  # the TOML's gates (computed once)
        self._adjoint_checked = (None, (), False)  # the last tape the adjoint program checked
        self._templates = signature.Templates()  # conversions by tape signature
        self._debugger = None  # qml.snapshots' debugger while it is active (snapshots_taken)

    def _engine(self, n: int) -> StatevectorBackend:
        eng = self._engines.get(n)
        if eng is None:
            eng = self._engines[n] = StatevectorBackend(n, dtype=self._cdtype)
        return eng

    # -- configuration ---------------------------------------------------------------------

    def supports_derivatives(self, execution_config: Optional[ExecutionConfig] = None,
                             circuit=None) -> bool:
        if execution_config is None:
            return True
        if one_shot.traversed(execution_config):
            return False  # the branches' weights are not differentiated: gradient transforms
        method = execution_config.gradient_method
        if method == "backprop":
            return self._backprop_supports(execution_config, circuit)
        if method == "adjoint":
            _refuse_adjoint_matrix(circuit)
            return self._adjoint_supports(execution_config, circuit)
        if method == "best":
            return self._adjoint_supports(execution_config, circuit) or \
                self._backprop_supports(execution_config, circuit)
        return False

    @staticmethod
    def _backprop_supports(config, circuit) -> bool:
        """Backprop through the torch engine: the torch interface, autograd (the engine inside
        one autograd primitive) and numpy (no derivatives), exact; ``"auto"`` resolved from
        the circuit's parameters; without a circuit (``qml.add_noise`` resolving a QNode's
        diff method), ``"auto"`` is offered, the call resolving it."""
        interface = backprop_interface(config, circuit)
        if interface not in _BACKPROP_INTERFACES and \
                not (circuit is None and interface == Interface.AUTO):
            return False
        return circuit is None or not circuit.shots

    def _adjoint_supports(self, config, circuit) -> bool:
        """The engine's reverse mode: first derivatives of what :meth:`_adjoint_program`
        accepts (a VJP of constant cotangents has no second derivative). PennyLane asks up to
        three times about the same tape per call: the last tape's answer is kept."""
        if config.derivative_order > 1 or nested_boxes(circuit):
            return False
        if circuit is None:
            return True
        key = tuple(circuit.trainable_params)
        last, last_key, last_ok = self._adjoint_checked
        if last is circuit and last_key == key:
            return last_ok
        try:
            self._adjoint_program(expand=None)((circuit,))
            ok = True
        except (DeviceError, qml.exceptions.DecompositionUndefinedError, AttributeError,
                qml.exceptions.QuantumFunctionError):
            ok = False
        self._adjoint_checked = (circuit, key, ok)
        return ok

    def supports_vjp(self, execution_config=None, circuit=None) -> bool:
        """The adjoint method's VJP; under backprop PennyLane never asks the device for a
        VJP, so ``device_vjp=True`` is accepted there (also where ``"best"`` resolves to
        backprop), as on ``default.qubit``."""
        return execution_config is None or self.supports_derivatives(execution_config, circuit)

    def setup_execution_config(self, config: Optional[ExecutionConfig] = None,
                               circuit=None) -> ExecutionConfig:
        config = config or ExecutionConfig()
        for option in config.device_options:
            if option not in self._device_options:
                raise DeviceError(f"device option {option} not present on {self}")
        updated = {}
        method = config.gradient_method
        if method is not None and not isinstance(method, str):  # a gradient transform
            refusal = transform_matrix_refusal(circuit, method) if circuit is not None else None
            if refusal is not None:
                raise DeviceError(f"{self.name}: {refusal}")
        if method == "best" and self._backprop_supports(config, circuit) and (
                config.interface == Interface.NUMPY or
                not self._adjoint_supports(config, circuit) or _trainable_state_prep(circuit) or
                (circuit is not None and trainable_matrix_ops(circuit))):
            # higher derivatives, measurements of the state (purity, entropies, density
            # matrices), trainable observables, postselection, a trainable state
            # preparation (the adjoint would differentiate its decomposition, singular where
            # amplitudes vanish) and a trainable matrix (the adjoint method differentiates a
            # one-wire matrix through its Rot angles, singular where they are not unique, and
            # no wider one): torch autograd through the engine. Under numpy nothing is
            # differentiated: a plain execution, without the adjoint method's checks (PennyLane
            # resolves "best" on a batch's first tape; ``qml.snapshots`` makes batches whose
            # later tapes measure the state)
            method = updated["gradient_method"] = "backprop"
        elif method == "best":
            # the engine's reverse mode, used as a VJP (one reverse sweep per backward pass,
            # broadcast tapes kept whole): the fastest exact derivative this device has
            method = updated["gradient_method"] = "adjoint"
            updated["use_device_jacobian_product"] = True
            updated["grad_on_execution"] = False
        if config.use_device_gradient is None:
            updated["use_device_gradient"] = method in ("adjoint", "backprop")
        if config.use_device_jacobian_product is None:
            updated["use_device_jacobian_product"] = method == "adjoint"
        if config.grad_on_execution is None:
            updated["grad_on_execution"] = method == "adjoint"
        updated["mcm_config"] = one_shot.mcm_config(config.mcm_config, self.name)
        options = dict(config.device_options)
        options.setdefault("c_dtype", self._c_dtype)
        updated["device_options"] = options
        return replace(config, **updated)

    def preprocess_transforms(self, execution_config: Optional[ExecutionConfig] = None):
        config = execution_config or ExecutionConfig()
        program = qml.CompilePipeline()
        measured = config.mcm_config.mcm_method in ("one-shot", "tree-traversal")
        if not measured:
            program.add_transform(defer_within(), device_wires=self.wires, name=self.name,
                                  allow_postselect=True)
        program.add_transform(decompose_broadcast(),
                              stopping_condition=one_shot.stopping_condition(_stopping_condition)
                              if measured else _stopping_condition,
                              decomposer=_decomposer, device_wires=self.wires,
                              target_gates=self._gate_set, name=self.name)
        program.add_transform(_expand_postselected_broadcast)
        program.add_transform(device_resolve_dynamic_wires, wires=self.wires,
                              allow_resets=measured)
        program.add_transform(validate_device_wires, self.wires, name=self.name)
        program.add_transform(validate_measurements, analytic_measurements=_accepted_analytic,
                              sample_measurements=_accepted_sample, name=self.name)
        program.add_transform(snapshots_taken(), device=self)
        if measured:
            one_shot.measured_transforms(program, config.mcm_config.mcm_method,
                                         config.mcm_config.postselect_mode)
        if config.gradient_method == "backprop":
            program.add_transform(no_sampling, name=f"backprop + {self.name}")
        if config.gradient_method == "adjoint":
            program += self._adjoint_program(expand=not config.use_device_jacobian_product)
        return program

    def _adjoint_program(self, expand=True):
        """The adjoint method's transforms; ``expand=None``: its checks only (a broadcast tape
        is not split, which checks nothing more)."""
        name = f"adjoint + {self.name}"
        program = qml.CompilePipeline()
        program.add_transform(no_sampling, name=name)
        program.add_transform(_refuse_postselection, name=name)
        program.add_transform(decompose_broadcast(),
                              stopping_condition=_adjoint_stopping_condition,
                              decomposer=_decomposer, device_wires=self.wires,
                              target_gates=self._gate_set,
                              skip_initial_state_prep="constant", name=name)
        program.add_transform(snapshots_taken(), device=None)  # (taken, if asked, before)
        _add_measurement_checks(program, name)
        program.add_transform(validate_adjoint_trainable_params)
        # PennyLane's Jacobian format has no broadcast axis, and its VJPs none for a trainable
        # broadcast parameter: expand those tapes (the engine merges the expanded tapes, one
        # structure, back into one batched job). A VJP w.r.t. scalar parameters keeps the
        # broadcast tape as it is.
        if expand is not None:
            program.add_transform(qml.transforms.broadcast_expand if expand
                                  else _expand_trainable_broadcast)
        return program

    # -- conversion ------------------------------------------------------------------------

    def _labels(self, tape):
        if self.wires is not None:
            return tuple(self.wires)
        return tuple(tape.wires)

    def _register(self, tape):
        """``(labels, n)``: the engine's wire labels for ``tape`` (one wire for none)."""
        labels = self._labels(tape)
        return (labels, len(labels)) if labels else ((0,), 1)

    @staticmethod
    def _check_sampling(tape, n: int) -> None:
        """PennyLane's sampler holds a float64 draw, an index and n bits per shot."""
        if tape.shots:
            total, rows = tape.shots.total_shots, tape.batch_size or 1
            memory.require(float(total) * rows * (16.0 + 8 * n),
                           f"sampling {total} shots of {rows} state(s) on {n} wires")

    def _plan(self, tape) -> _Plan:
        labels, n = self._register(tape)
        wire_map = None if labels == tuple(range(n)) else {w: i for i, w in enumerate(labels)}
        postselect = any(tape_projector(op) for op in tape.operations)
        native = None if tape.shots or postselect else \
            _native_measurements(tape.measurements, labels)
        meas = native if native is not None else [Measurement("state")]
        engine = self._engine(n)
        try:
            self._check_sampling(tape, n)
            rec, sources = from_pennylane_tape(tape, labels, meas, engine.check_batch,
                                               postselect=True)
        except QdiffError as exc:
            raise DeviceError(f"{self.name}: {exc}") from None
        trainable = _column_trainable(tape, sources)
        job = Job(rec.circuit, rec.theta, rec.initial_state, shots=None, trainable=trainable)
        # batched by the converted parameters themselves: PennyLane's ``tape.batch_size`` can
        # outlive ``broadcast_expand`` (an expanded MultiRZ keeps its batch size); it checks
        # every operator, so it is asked only when the parameters are batched
        batched = (bool(rec.batch_shape) or rec.initial_state is not None) and \
            tape.batch_size is not None
        return _Plan(tape, job, sources, native is not None, n, wire_map, postselect, batched)

    def _scan(self, tapes) -> list:
        """Per tape its signature and parameters (:func:`signature.scan`), or None."""
        return signature.scan(tapes, lambda t: self._register(t)[0], _observable_key)

    def _plans(self, tapes, scans=None) -> list:
        """One plan per tape. A tape whose signature was converted before reuses that
        conversion (:class:`signature.Template`): only its angles are read, and the angles of
        all tapes of one template become ONE ``(T, P)`` array. The first tape of a signature
        is converted in full and, when its angles alone make its theta, becomes the
        template."""
        if scans is None:
            scans = self._scan(tapes)
        plans: list = [None] * len(tapes)
        rows: dict = {}  # id(template) -> (template, [(tape index, row of angles)])
        for i, (tape, sc) in enumerate(zip(tapes, scans)):
            tpl = None if sc is None else self._templates.get(sc[0])
            if tpl is not None:
                plans[i] = self._template_plan(tape, tpl, sc[1], rows, i)
            if plans[i] is None:
                plans[i] = self._plan(tape)
                if sc is not None and tpl is None:
                    self._remember(sc, plans[i])
        for tpl, members in rows.values():
            big = torch.from_numpy(np.array([r for _, r in members], dtype=np.float64))
            for j, (i, _) in enumerate(members):
                plans[i] = _Plan(tapes[i], Job(tpl.circuit, big[j:j + 1], None, shots=None,
                                               trainable=tpl.trainable),
                                 tpl.sources, tpl.native, tpl.n, tpl.wire_map, False, False,
                                 torch_params=False)
        return plans

    def _template_plan(self, tape, tpl, params, rows, i):
        """The plan of ``tape`` from its template: a broadcast tape's now, an unbatched
        tape's angles appended to ``rows`` (its plan made with its template's array: returns
        ``False``); None when the angles need the full conversion (another kind of number, a
        NaN or infinite angle, a batch too large: it names the fault)."""
        p = len(tpl.columns)
        try:
            r = signature.row(params, tpl.columns)
            if r is not None:
                if not all(map(math.isfinite, r)):
                    return None
                bsz, batched, theta = 1, False, None
            else:
                got = signature.broadcast_theta(params, tpl.columns)
                if got is None or not np.isfinite(got[1]).all():
                    return None
                batched, theta = got
                bsz = theta.shape[0]
            self._engine(tpl.n).check_batch(bsz, p)
            memory.require(8.0 * bsz * p, f"the parameters of a batch of {bsz} bindings")
            self._check_sampling(tape, tpl.n)
        except (QdiffError, OverflowError):
            return None
        if theta is None:
            rows.setdefault(id(tpl), (tpl, []))[1].append((i, r))
            return False
        batched = batched and tape.batch_size is not None
        job = Job(tpl.circuit, torch.from_numpy(theta), None, shots=None,
                  trainable=tpl.trainable)
        return _Plan(tape, job, tpl.sources, tpl.native, tpl.n, tpl.wire_map, False, batched,
                     torch_params=False)

    def _remember(self, scanned, plan) -> None:
        """Keep ``plan``'s conversion as the template of its tape's signature when its theta
        is exactly the tape's angles gathered by column (checked here, bit for bit)."""
        key, params = scanned
        job = plan.job
        theta = job.theta
        if job.initial_state is not None or plan.postselect or theta.requires_grad or \
                theta.dtype != torch.float64 or theta.device.type != "cpu" or \
                len(plan.sources) != theta.shape[1] or \
                any(f != 1.0 for _, f in plan.sources):
            return
        columns = tuple(k for k, _ in plan.sources)
        r = signature.row(params, columns)
        if r is not None:
            again, batched = np.array([r], dtype=np.float64), False
        else:
            got = signature.broadcast_theta(params, columns)
            if got is None:
                return
            batched, again = got
        if again.shape != tuple(theta.shape) or not torch.equal(torch.from_numpy(again), theta) \
                or plan.batched != (batched and plan.tape.batch_size is not None):
            return
        self._templates.put(key, signature.Template(job.circuit, plan.sources, plan.native,
                                                    plan.n, plan.wire_map, job.trainable))

    # -- execution -------------------------------------------------------------------------

    def execute(self, circuits, execution_config: Optional[ExecutionConfig] = None):
        if any(one_shot.has_mid_measure(t) for t in circuits):  # measured, not deferred
            return tuple(self._measured(t) if one_shot.has_mid_measure(t) else
                         self.execute((t,), execution_config)[0] for t in circuits)
        scans = self._scan(circuits)  # a tape with a signature has plain numbers only
        if has_boxes([t for t, sc in zip(circuits, scans) if sc is None]):
            return execute_autograd(circuits, self._execute)  # backprop under autograd
        return self._execute(circuits, torch_backprop(execution_config), scans)

    def _measured(self, tape):
        """A tape with mid-circuit measurements measured
        (:func:`qdiff.circuits.pennylane_tree.run`: one-shot with shots, the outcome tree
        without)."""
        labels, n = self._register(tape)
        wire_map = None if labels == tuple(range(n)) else {w: i for i, w in enumerate(labels)}
        try:
            return tree.run(tape, _PureStates(self, labels, n, wire_map), self._rng,
                            snapshot_store(self._debugger))
        except QdiffError as exc:
            raise DeviceError(f"{self.name}: {exc}") from None

    def _snapshot_result(self, tape, whole):
        """One snapshot's measurement, on the circuit up to it (torch and autograd parameters
        kept differentiable; a torch result where the ``whole`` tape has torch parameters)."""
        if has_boxes((tape,)):
            return execute_autograd((tape,), self._execute)[0]
        return self._execute((tape,), torch_tape(whole))[0]

    def _execute(self, circuits, torch_out: bool = False, scans=None):
        """The tapes' results; torch tensors for torch parameters, and for every tape with
        ``torch_out`` (backprop under the torch interface)."""
        plans = self._plans(circuits, scans)
        outputs = self._execute_grouped([p.job for p in plans])
        return tuple(self._finish(p, o, torch_out) for p, o in zip(plans, outputs))

    def _execute_grouped(self, jobs, keep_residuals=False):
        """Run ``jobs`` with ONE engine ``execute`` call per register size; jobs of the same
        circuit structure (tapes that differ only in their parameter values, e.g. a broadcast
        tape after ``broadcast_expand``) are merged into one job of stacked theta rows. Returns
        each job's outputs (and, with ``keep_residuals``, the merged jobs and residuals)."""
        merged, members = _merge(jobs)
        results = [None] * len(merged)
        by_n: dict = {}
        for i, job in enumerate(merged):
            by_n.setdefault(job.circuit.num_wires, []).append(i)
        for n, idx in by_n.items():
            res = self._engine(n).execute([merged[i] for i in idx])
            for i, r in zip(idx, res):
                results[i] = r
        outputs = [None] * len(jobs)
        for r, mem in zip(results, members):
            for j, rows in mem:
                o = r.outputs
                outputs[j] = o[rows] if isinstance(o, torch.Tensor) else [x[rows] for x in o]
        if keep_residuals:
            return outputs, merged, members, results
        return outputs

    def _finish(self, plan: _Plan, outputs, torch_out: bool = False):
        tape = plan.tape
        mps = tape.measurements
        if plan.native:
            if isinstance(outputs, torch.Tensor):  # flat
                outputs = _split_flat(outputs, plan.job.circuit.measurements, plan.n)
            keep = torch_out or plan.torch_params()
            vals = [to_user(o if plan.batched else o[0], keep) for o in outputs]
            return vals[0] if len(mps) == 1 else tuple(vals)
        state = to_user(outputs[0], torch_out or plan.torch_params())
        shots = tape.shots
        if plan.postselect:
            state, shots = self._postselected(state, shots)
        shape = ((state.shape[0],) if plan.batched else ()) + (2,) * plan.n
        state = state.reshape(shape) if plan.batched else state[0].reshape(shape)
        if plan.wire_map is not None:
            mps = [map_measurement_wires(m, plan.wire_map) for m in mps]
        if shots:
            mps = sampled_measurements(mps)
        from pennylane.devices.qubit.simulate import measure_final_state
        if plan.postselect and shots and 0 in list(shots):
            # a shot count the postselection kept none of: NaN results, as default.qubit's
            # mid-circuit measurements give for shots that are all discarded
            from pennylane.devices.qubit.simulate import measurement_with_no_shots
            per = []
            for s in shots:
                if s:
                    script = qml.tape.QuantumScript([], mps, shots=s)
                    per.append(measure_final_state(script, state, plan.batched, rng=self._rng))
                else:
                    vals = [measurement_with_no_shots(m) for m in mps]
                    per.append(vals[0] if len(vals) == 1 else tuple(vals))
            return tuple(per) if shots.has_partitioned_shots else per[0]
        script = qml.tape.QuantumScript([], mps, shots=shots)
        return measure_final_state(script, state, plan.batched, rng=self._rng)

    def _postselected(self, state, shots):
        """The projected states ``(B, 2**n)`` normalised (NaN where the postselected outcome
        has probability 0, as ``default.qubit``), and with shots, the shots that keep the
        postselected outcome: ``binomial(shots, probability)`` of each shot count (a sampled
        tape has one row here)."""
        from pennylane.devices.qubit.simulate import _FlexShots
        norm = qml.math.sqrt(qml.math.sum(qml.math.real(qml.math.conj(state) * state), axis=-1))
        zero = np.isclose(np.asarray(qml.math.unwrap(qml.math.detach(norm))), 0.0, rtol=0,
                          atol=1e-8)
        if zero.any():
            norm = qml.math.where(qml.math.asarray(zero, like=norm), 0.0 * norm, norm)
        if shots:
            p = float(np.asarray(qml.math.unwrap(qml.math.detach(norm)))[0]) ** 2
            shots = _FlexShots([int(self._rng.binomial(s, p)) for s in shots])
        with np.errstate(divide="ignore", invalid="ignore"):
            state = state / qml.math.cast_like(norm, state)[:, None]
        return state, shots

    # -- derivatives -----------------------------------------------------------------------

    def compute_derivatives(self, circuits, execution_config=None):
        return self._derivatives(circuits, results=False)

    def execute_and_compute_derivatives(self, circuits, execution_config=None):
        return self._derivatives(circuits, results=True)

    def _derivatives(self, circuits, results: bool):
        """Jacobians in PennyLane's nested format by the engine's reverse mode: tapes of one
        structure merged into one job, ONE forward over its rows, then one reverse sweep per
        output over the final states repeated once per output (one-hot cotangents, one engine
        ``vjp`` call)."""
        plans = self._adjoint_plans(circuits)
        jobs = [replace(p.job, flat=True, keep=True) for p in plans]
        outputs, merged, members, res = self._execute_grouped(jobs, keep_residuals=True)
        big, cots, resid, todo = [], [], [], []
        for i, (job, mem, r) in enumerate(zip(merged, members, res)):
            if not any(job.trainable or ()):
                continue
            k = sum(_flat_size(m, job.circuit.num_wires) for m in job.circuit.measurements)
            b = job.theta.shape[0]
            n = job.circuit.num_wires
            try:  # k copies of each final state (and the sweep's two), k one-hot cotangents
                memory.require(k * b * (4 * 2.0 ** n * r.residual.state.element_size()
                                        + 8.0 * (k + job.theta.shape[1])),
                               f"the adjoint Jacobian of {k} outputs x {b} binding(s) on {n} "
                               f"wires (one reverse sweep per output)",
                               hint="a vector-Jacobian product (device_vjp=True) needs one sweep")
            except QdiffError as exc:
                raise DeviceError(f"{self.name}: {exc}") from None
            init = None if job.initial_state is None else \
                job.initial_state.expand(b, -1).repeat(k, 1)
            big.append(replace(job, theta=job.theta.repeat(k, 1), initial_state=init))
            cots.append(torch.eye(k, dtype=torch.float64).repeat_interleave(b, dim=0))
            resid.append(Residual(r.residual.state.repeat(k, 1), Trace(),
                                  r.residual.use_native))
            todo.append(i)
        grads = [None] * len(merged)
        for i, g in zip(todo, self._vjp(big, cots, resid)):
            grads[i] = g.reshape(-1, merged[i].theta.shape[0], g.shape[-1])  # (out, row, col)
        jacs = [()] * len(plans)
        for g, mem in zip(grads, members):
            for j, rows in mem:
                p = plans[j]
                if g is None or not p.tape.trainable_params:
                    continue
                sizes = [_flat_size(m, p.n) for m in p.job.circuit.measurements]
                jac = _by_parameter(p.tape, g[:, rows], p.sources)
                jacs[j] = _jacobian_format(p.tape, jac, sizes, p.batched)
        jacs = tuple(jacs)
        if not results:
            return jacs
        vals = tuple(self._finish(p, o) for p, o in zip(plans, outputs))
        return vals, jacs

    def _adjoint_plans(self, tapes) -> list:
        plans = self._plans(tapes)
        for plan in plans:
            if not plan.native or plan.tape.shots:
                raise DeviceError(f"{self.name}: the adjoint method differentiates exact "
                                  f"expval, var and probs(wires) only; got "
                                  f"{list(plan.tape.measurements)}")
        return plans

    def compute_vjp(self, circuits, cotangents, execution_config=None):
        if execution_config is not None and execution_config.interface == Interface.TORCH \
                and torch.is_grad_enabled():
            # torch's backward with create_graph=True (a Hessian, a gradient penalty; torch
            # runs a plain backward with grad mode off): the tapes hold plain numbers here, so
            # the VJP cannot be differentiated again
            raise DeviceError(f"{self.name}: the device VJP (diff_method='best' or 'adjoint' "
                              "with device_vjp=True) is a first derivative and torch asked to "
                              "differentiate it again (create_graph=True); pass max_diff=2 "
                              "('best' then backpropagates) or use diff_method='backprop' or "
                              "'parameter-shift' with max_diff=2")
        plans = self._adjoint_plans(circuits)
        cots = [_flat_cotangent(p, dy) for p, dy in zip(plans, cotangents)]
        merged, members = _merge([p.job for p in plans])
        mcots = [torch.cat([cots[j] for j, _ in mem]) if len(mem) > 1 else cots[mem[0][0]]
                 for mem in members]
        grads = self._vjp(merged, mcots, [None] * len(merged))
        out = [None] * len(plans)
        for g, mem in zip(grads, members):
            for j, rows in mem:
                p = plans[j]
                out[j] = _param_grads(p.tape, g[rows], p.sources) if p.tape.trainable_params \
                    else ()
        return tuple(out)

    def execute_and_compute_vjp(self, circuits, cotangents, execution_config=None):
        return self.execute(circuits, execution_config), \
            self.compute_vjp(circuits, cotangents, execution_config)

    def _vjp(self, jobs, cots, residuals) -> list:
        out = [None] * len(jobs)
        by_eng: dict = {}
        for i, job in enumerate(jobs):
            by_eng.setdefault(job.circuit.num_wires, []).append(i)
        for n, idx in by_eng.items():
            res = self._engine(n).vjp([jobs[i] for i in idx], [cots[i] for i in idx],
                                      [residuals[i] for i in idx])
            for i, g in zip(idx, res):
                out[i] = g
        return out


def _merge(jobs):
    """Merge jobs of one circuit object (same structure, same trainable columns, no initial
    state) into one job of stacked theta rows: ``(merged jobs, members)``, ``members[i]`` the
    ``(job index, row slice)`` pairs merged job ``i`` serves."""
    merged, members, slot = [], [], {}
    for j, job in enumerate(jobs):
        b = job.theta.shape[0]
        key = None if job.initial_state is not None or job.theta.requires_grad else \
            (id(job.circuit), job.trainable, job.flat, job.keep)
        i = slot.get(key) if key is not None else None
        if i is None:
            if key is not None:
                slot[key] = len(merged)
            merged.append([job])
            members.append([(j, slice(0, b))])
        else:
            start = members[i][-1][1].stop
            merged[i].append(job)
            members[i].append((j, slice(start, start + b)))
    out = []
    for group in merged:
        if len(group) == 1:
            out.append(group[0])
        else:
            out.append(replace(group[0], theta=torch.cat([g.theta for g in group])))
    return out, members


# -- helpers -------------------------------------------------------------------------------


_OBS_CACHE: dict = {}
_MISSING = object()


def _data_key(d):
    """A content key of one operator datum (its exact values, dtype and shape: PennyLane's
    ``op.hash`` prints the data, abbreviated), or None when it has no byte form."""
    if hasattr(d, "tocsr") and hasattr(d, "nnz"):  # scipy sparse
        c = d.tocsr()
        parts = ("sparse", c.shape, c.data, c.indices, c.indptr)
    else:
        if isinstance(d, torch.Tensor):
            d = d.detach().cpu().resolve_conj().resolve_neg().numpy()
        try:
            a = np.asarray(qml.math.unwrap(d))
        except Exception:  # noqa: BLE001 - an interface numpy cannot read: not cached
            return None
        if a.dtype == object:
            return None
        parts = ("dense", a.shape, a)
    h = hashlib.blake2b(digest_size=16)
    for x in parts:
        if isinstance(x, np.ndarray):
            x = np.ascontiguousarray(x)
            h.update(str(x.dtype).encode())
            h.update(x.tobytes())
        else:
            h.update(repr(x).encode())
    return h.digest()


def _pauli_key(op):
    """The content key of an observable with a Pauli representation whose coefficients are
    real numbers: its wire labels, its Pauli words and the coefficients' float64 bytes, in the
    representation's order (the conversion reads that representation alone); else None."""
    rep = getattr(op, "pauli_rep", None)
    if rep is None:
        return None
    coeffs = list(rep.values())
    if not all(type(c) in signature.REALS for c in coeffs):
        return None
    try:
        c = np.array(coeffs, dtype=np.float64)
    except OverflowError:
        return None
    return ("pauli", tuple(map(repr, op.wires)), tuple(rep), c.tobytes())


def _observable_key(op, values=None):
    """The cache key of a PennyLane observable: its structure (``op.hash``), wire labels and
    the exact bytes of its data (``values``: ``op.data`` when the caller has read it); None
    when some datum has no byte form (then not cached). Data that are all plain real numbers
    (a Hamiltonian's coefficients) are one array, hashed once."""
    key = _pauli_key(op)
    if key is not None:
        return key
    values = op.data if values is None else values
    if values and all(isinstance(d, (float, int, np.floating, np.integer)) and
                      not isinstance(d, (bool, np.bool_)) for d in values):
        data = _data_key(np.asarray(values))
    else:
        data = tuple(_data_key(d) for d in values)
        if any(k is None for k in data):
            return None
    return (op.hash, tuple(map(repr, op.wires)), data)  # hash(-1) == hash(-2): the labels too


def _observable(op):
    """The qdiff observable for a PennyLane observable, or None when it has none (cached by
    content, see :func:`_observable_key`)."""
    key = _observable_key(op)
    hit = _OBS_CACHE.get(key, _MISSING) if key is not None else _MISSING
    if hit is not _MISSING:  # read once: another thread may empty the cache meanwhile
        return hit
    try:
        obs = from_pennylane_observable(op)
    except Exception:  # noqa: BLE001 - PennyLane raises many kinds; the fallback handles it
        obs = None
    if obs is not None and not obs.terms:
        obs = None
    if obs is not None and not is_concrete(obs.coeffs):
        return obs  # made inside a torch.func transform: valid for this call only
    if key is not None:
        if len(_OBS_CACHE) > 256:
            _OBS_CACHE.clear()
        _OBS_CACHE[key] = obs
    return obs


def _native_measurements(mps, labels):
    """qdiff measurements for ``mps`` when the engine computes them all exactly, else None."""
    out = []
    for mp in mps:
        if mp.mv is not None:
            return None
        if isinstance(mp, (ExpectationMP, VarianceMP)) and mp.obs is not None:
            if any(qml.math.requires_grad(d) for d in mp.obs.data):
                return None
            obs = _observable(mp.obs)
            if obs is None:
                return None
            if not obs.terms:
                return None
            out.append(Measurement("expval" if isinstance(mp, ExpectationMP) else "var", obs))
        elif type(mp) is ProbabilityMP and mp.obs is None:
            out.append(Measurement("probs", None, tuple(mp.wires) or tuple(labels)))
        elif type(mp) is StateMP and (not mp.wires or tuple(mp.wires) == tuple(labels)):
            out.append(Measurement("state"))
        else:
            return None
    return out


def _column_trainable(tape, sources) -> tuple:
    tr = set(tape.trainable_params)
    return tuple(k in tr for k, _ in sources)




def _flat_size(m: Measurement, n: int) -> int:
    if m.kind == "probs":
        return 2 ** (len(m.wires) if m.wires is not None else n)
    return 1


def _split_flat(flat: torch.Tensor, mps, n: int) -> list:
    out, i = [], 0
    for m in mps:
        s = _flat_size(m, n)
        out.append(flat[:, i:i + s] if m.kind == "probs" else flat[:, i])
        i += s
    return out


def _flat_cotangent(plan: _Plan, dy) -> torch.Tensor:
    """PennyLane's cotangent structure for one tape -> a real ``(B, K)`` tensor."""
    b = plan.job.theta.shape[0]
    parts = [dy] if len(plan.tape.measurements) == 1 else list(dy)
    cols = []
    for part in parts:
        t = torch.as_tensor(np.asarray(qml.math.unwrap(part), dtype=np.float64))
        cols.append(t.reshape(b, -1) if plan.batched else t.reshape(1, -1))
    return torch.cat(cols, dim=1)


def _by_parameter(tape, g: torch.Tensor, sources) -> np.ndarray:
    """Gradients by theta column ``(..., P)`` -> by trainable tape parameter ``(..., T)``:
    column ``c`` from parameter ``t`` with ``factor`` adds ``factor * g[..., c]`` to ``t``
    (a scatter over the columns, O(P) work: a dense ``(P, T)`` map would be quadratic)."""
    index = {k: i for i, k in enumerate(tape.trainable_params)}
    cols, params, factors = [], [], []
    for c, (k, factor) in enumerate(sources):
        i = index.get(k)
        if i is not None:
            cols.append(c)
            params.append(i)
            factors.append(factor)
    g = g.detach().cpu().to(torch.float64)
    out = torch.zeros(g.shape[:-1] + (len(index),), dtype=torch.float64)
    if cols:
        picked = g[..., cols] * torch.tensor(factors, dtype=torch.float64)
        out.index_add_(-1, torch.tensor(params, dtype=torch.long), picked)
    return out.numpy()


def _param_grads(tape, g: torch.Tensor, sources) -> tuple:
    """``(B, P)`` column gradients -> one gradient per trainable tape parameter, shaped like
    the parameter (a broadcast parameter keeps its rows; a scalar sums them)."""
    per = _by_parameter(tape, g, sources)  # (B, T)
    params = tape.get_parameters(trainable_only=True)
    out = []
    for t, p in enumerate(params):
        shape = np.shape(p)
        v = per[:, t]
        out.append(v.reshape(shape) if len(shape) and np.prod(shape) == v.size
                   else np.asarray(v.sum()))
    return tuple(out)


def _jacobian_format(tape, jac, sizes, batched):
    """PennyLane's nested Jacobian (per measurement, per trainable parameter) from ``jac``
    ``(K, B, T)`` (flat outputs, rows, trainable parameters)."""
    nm, npar = len(sizes), jac.shape[-1]
    per_meas = []
    start = 0
    for s, mp in zip(sizes, tape.measurements):
        blk = jac[start:start + s]  # (s, B, T)
        blk = np.moveaxis(blk, 0, -1) if isinstance(mp, ProbabilityMP) else blk[0]  # (B,T,s)|(B,T)
        blk = blk if batched else blk[0]
        per_meas.append([blk[..., t, :] if isinstance(mp, ProbabilityMP) else blk[..., t]
                         for t in range(npar)])
        start += s
    if nm == 1 and npar == 1:
        return per_meas[0][0]
    if nm == 1:
        return tuple(per_meas[0])
    if npar == 1:
        return tuple(e[0] for e in per_meas)
    return tuple(tuple(e) for e in per_meas)
