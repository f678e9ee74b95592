"""``qml.device("qdiff.mixed", wires=n, noise=None)``: qdiff's mixed-state engine as a PennyLane
device.

The device speaks PennyLane's ``pennylane.devices.Device`` API. Preprocessing defers mid-circuit
measurements and decomposes every operation into the gates and channels qdiff converts
(:func:`~qdiff.circuits.pennylane_io.from_pennylane_tape`: qdiff's gates, and PennyLane's
``BitFlip``, ``PhaseFlip``, ``DepolarizingChannel``, ``AmplitudeDamping``,
``GeneralizedAmplitudeDamping``, ``PhaseDamping``, ``ThermalRelaxationError``, ``ResetError``,
``PauliError`` and constant ``QubitChannel``; a leading ``QubitDensityMatrix`` runs as the
batch of its eigenvectors, weighted, a later one as the channel that prepares its state).
``execute`` runs each tape (all its broadcast rows at once) on the mixed engine (``qd.device("mixed")``), which returns the final density
matrix; every measurement is then read off that density matrix by PennyLane's own
``default.mixed`` measurement functions (expval, var, probs, ``density_matrix``, ``purity``,
``vn_entropy``, ``mutual_info``, sample/counts with shots, shot vectors), so results have
PennyLane's formats.

``noise=`` (a device name such as ``"fake_manila"``, a Qiskit backend, an Aer noise model or a
:class:`qdiff.noise.NoiseModel`) adds the device's noise: a tape not native to the device is
routed and translated first (:mod:`qdiff.noise`, the compiler's ``--target`` path), so the
noise acts on the gates the device would run; wire ``i`` of the device is qubit ``i`` (or
``layout=``). Readout errors of the model act on ``probs``/``sample``/``counts`` of wires;
every other measurement is of the state (as qdiff's own devices do). Mid-circuit
measurements with a noise model are refused (deferred measurement would add wires and gates
the model would treat as device qubits and gates).

Derivatives: ``diff_method="backprop"`` (and ``"best"``) with the torch interface runs the
torch engine inside torch autograd: exact gradients of gate angles and channel parameters;
with the autograd interface the engine runs inside one autograd primitive whose VJP is torch
autograd (exact to every order). ``"backprop"`` with jax or tensorflow is refused when the
call resolves its interface (PennyLane's ``QuantumFunctionError``); ``"best"`` there gives
PennyLane's gradient transforms (parameter-shift, finite differences for channel parameters).

>>> import pennylane as qml, torch
>>> dev = qml.device("qdiff.mixed", wires=1)
>>> @qml.qnode(dev, interface="torch")
... def f(p):
...     qml.Hadamard(0); qml.DepolarizingChannel(p, wires=0)
...     return qml.expval(qml.PauliX(0)), qml.purity(wires=[0])
>>> [round(float(v), 6) for v in f(torch.tensor(0.3, dtype=torch.float64))]
[0.6, 0.68]
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

import numpy as np
import pennylane as qml
import torch
from pennylane.devices import Device, ExecutionConfig
from pennylane.devices.default_mixed import observable_stopping_condition
from pennylane.devices.modifiers import simulator_tracking, single_tape_support
from pennylane.devices.preprocess import (device_resolve_dynamic_wires, no_sampling,
                                          validate_device_wires, validate_measurements,
                                          validate_observables)
from pennylane.devices.qubit_mixed import measure_final_state
from pennylane.exceptions import DeviceError
from pennylane.math import Interface
from pennylane.measurements import (ClassicalShadowMP, CountsMP, DensityMatrixMP, ExpectationMP,
                                    ProbabilityMP, PurityMP, SampleMP, ShadowExpvalMP,
                                    VarianceMP)

from qdiff.backends.base import Job
from qdiff.circuits import pennylane_one_shot as one_shot
from qdiff.circuits import pennylane_tree as tree
from qdiff.circuits.pennylane_autograd import (backprop_interface, execute_autograd, has_boxes,
                                               to_user, torch_backprop, torch_tape)
from qdiff.circuits import memory
from qdiff.circuits.circuit import trainable_matrix_op
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.gates import check_unitary
from qdiff.circuits.measurements import Measurement
from qdiff.circuits.noise import resolve_noise
from qdiff.circuits.pennylane_io import (autograd_exp_matrix, broadcast_exp_rotation,
                                        exp_pauli_rotation, from_pennylane_observable,
                                        from_pennylane_tape,
                                        tape_channel_supported, tape_op_supported,
                                        tape_trainable_matrix, trainable_matrix_ops,
                                        transform_matrix_refusal)
from qdiff.circuits.pennylane_transforms import (decompose_broadcast, defer_within,
                                                 map_measurement_wires,
                                                 sampled_measurements, snapshot_store,
                                                 snapshots_taken)
from qdiff.noise import routing_for

_DTYPES = {np.complex128: torch.complex128, np.complex64: torch.complex64,
           torch.complex128: torch.complex128, torch.complex64: torch.complex64}
# torch autograd runs through the engine (under autograd inside one primitive; jax and
# tensorflow cannot trace it); numpy is what PennyLane asks about when a QNode is built, before
# the interface is known (and execution without derivatives)
_BACKPROP_INTERFACES = (Interface.TORCH, Interface.AUTOGRAD, Interface.NUMPY)


def _stopping_condition(op) -> bool:
    """What the engine runs as it is: its gates and channels, ``QubitDensityMatrix``, and a
    ``QubitUnitary`` (also controlled) whose matrix requires grad, one engine gate holding that
    matrix (backprop differentiates it, as ``default.mixed`` does)."""
    return tape_op_supported(op) or tape_channel_supported(op) or tape_trainable_matrix(op) or \
        type(op).__name__ == "QubitDensityMatrix"


def _decomposer(op):
    """PennyLane's decomposition of ``op``; an operation without one but with a matrix becomes
    that ``QubitUnitary``; ``qml.exp``/``qml.evolve`` of a Pauli word with a torch coefficient,
    or with a broadcast coefficient (which PennyLane's decomposition cannot read), becomes its
    ``PauliRot`` (another broadcast one its matrix), and with a
    trainable autograd coefficient its matrix from :func:`autograd_exp_matrix`."""
    if type(op).__name__ in ("Exp", "Evolution"):
        rot = exp_pauli_rotation(op) or broadcast_exp_rotation(op)
        if rot is not None:
            return [qml.PauliRot(rot[0], rot[1], wires=rot[2])]
        m = autograd_exp_matrix(op)
        if m is not None or qml.math.ndim(op.coeff) > 0:
            return [qml.QubitUnitary(_unitary(op, m), wires=op.wires)]
    if type(op).__name__ == "QubitUnitary":  # its decomposition holds for a unitary only
        _unitary(op)
    if op.has_decomposition or not op.has_matrix:
        return op.decomposition()
    return [qml.QubitUnitary(_unitary(op), wires=op.wires)]


def _unitary(op, m=None):
    """``op``'s matrix (``m`` where given); a ``DeviceError`` naming ``op`` unless it is
    unitary."""
    m = op.matrix() if m is None else m
    if not qml.math.is_abstract(m):
        t = m if isinstance(m, torch.Tensor) else torch.as_tensor(np.asarray(qml.math.to_numpy(m)))
        try:
            check_unitary(t, who=f"{op.name} on wires {list(op.wires)}")
        except QdiffError as e:
            raise DeviceError(f"qdiff.mixed: {e}") from None
    return m


def _accepted_analytic(mp) -> bool:
    return qml.devices.default_qubit.accepted_analytic_measurement(mp)


def _accepted_sample(mp) -> bool:
    return qml.devices.default_qubit.accepted_sample_measurement(mp)


@qml.transform
def _refuse_mid_circuit_measurements(tape, noise_name: str):
    """Mid-circuit measurements with a noise model: refused (see the module)."""
    for op in tape.operations:
        if type(op).__name__ in ("MidMeasureMP", "MidMeasure", "Conditional"):
            raise DeviceError(f"qdiff.mixed: mid-circuit measurements with the noise model "
                              f"'{noise_name}' are not simulated: deferred measurement adds "
                              "wires and gates that the model would treat as device qubits and "
                              "gates, and the model routes and translates whole circuits, not "
                              "the stretches between measurements (mcm_method='one-shot'); "
                              "measure at the end of the circuit, or put the noise in the "
                              "circuit as channels on a device without a noise model")
    return (tape,), lambda results: results[0]


class _DensityStates(one_shot.Model):
    """Density matrices for one-shot execution: rows ``(B, 2**n, 2**n)`` run by the device's
    mixed engine (channels included)."""

    pennylane = "qubit_mixed"

    def __init__(self, device, labels, wire_map):
        self.device, self.labels, self.n, self.wire_map = device, labels, len(labels), wire_map
        self.engine = device._engine(self.n)
        self.rng, self.row_shape = device._rng, (2,) * (2 * self.n)
        self.row_bytes = float(4 ** self.n) * \
            torch.empty((), dtype=device._cdtype).element_size()
        # diagonal entries under 100 eps are rounding: 2.2e-14 in complex128, 1.2e-5 in
        # complex64
        self.rounding = 100.0 * float(torch.finfo(device._cdtype).eps)

    def evolve(self, states, ops):
        ops = list(ops)
        if states is not None and not ops:
            return states
        start = None
        if states is None and ops and type(ops[0]).__name__ == "QubitDensityMatrix":
            start = self._embedded(ops.pop(0))
        rec, _ = from_pennylane_tape(qml.tape.QuantumScript(ops), self.labels,
                                     [Measurement("density_matrix", None, self.labels)],
                                     self.engine.check_batch, channels=True)
        if rec.initial_state is not None:
            if states is not None:
                raise QdiffError(f"{ops[0].name} on wires {list(ops[0].wires)}: a state "
                                 "preparation after a mid-circuit measurement is not supported")
            start = rec.initial_state
        start = states if states is not None else start
        rows = 1 if start is None else start.shape[0]
        theta = rec.theta if rec.theta.shape[0] == rows else rec.theta.expand(rows, -1)
        return self.engine.density_matrices(rec.circuit, theta.contiguous(), start)

    def _embedded(self, op):
        """A leading ``QubitDensityMatrix(sigma)``'s state ``(1, 2**n, 2**n)``: ``sigma`` on
        its wires, |0><0| on the others."""
        sigma = op.data[0]
        if qml.math.requires_grad(sigma) or qml.math.ndim(sigma) != 2:
            raise QdiffError("QubitDensityMatrix must be one constant density matrix (not "
                             "trainable, not broadcast)")
        k = len(op.wires)
        t = np.asarray(qml.math.unwrap(sigma), dtype=complex).reshape((2,) * (2 * k))
        perm = [list(op.wires).index(w) for w in self.labels if w in op.wires]
        full = np.zeros((2,) * (2 * self.n), dtype=complex)
        where = tuple(slice(None) if w in op.wires else 0 for w in self.labels)
        full[where * 2] = t.transpose(perm + [k + p for p in perm])
        d = 2 ** self.n
        return torch.as_tensor(full.reshape(1, d, d))

    def _split(self, states, wire):
        b, r = states.shape[0], 2 ** (self.n - wire - 1)
        return states.reshape(b, 2 ** wire, 2, r, 2 ** wire, 2, r)

    def weights(self, states):
        return torch.diagonal(states, dim1=1, dim2=2).real

    def collapse(self, states, wire, outcomes, reset):
        s = self._split(states, wire)
        rows = torch.arange(s.shape[0], device=s.device)
        o = torch.as_tensor(outcomes, device=s.device)
        kept = s.permute(0, 2, 5, 1, 3, 4, 6)[rows, o, o]  # (B, 2**w, r, 2**w, r)
        trace = torch.diagonal(kept.reshape(kept.shape[0], kept[0, :, :, 0, 0].numel(), -1),
                               dim1=1, dim2=2).sum(1).real
        kept = kept / trace.reshape(-1, 1, 1, 1, 1).to(kept.dtype)
        new = torch.zeros_like(s).permute(0, 2, 5, 1, 3, 4, 6)
        at = torch.zeros_like(o) if reset else o
        new[rows, at, at] = kept
        return new.permute(0, 3, 1, 4, 5, 2, 6).reshape(states.shape)


@qml.transform
def _density_resets(tape):
    """A ``QubitDensityMatrix(sigma)`` after the first operation replaces its wires' state by
    ``sigma`` (``rho -> Tr_w(rho) (x) sigma``, as ``default.mixed`` applies it): the constant
    channel with Kraus matrices ``sqrt(l_i) |v_i><j|`` over the eigenpairs of ``sigma`` and
    the basis states ``j``."""
    ops = list(tape.operations)
    if not any(type(op).__name__ == "QubitDensityMatrix" for op in ops[1:]):
        return (tape,), lambda results: results[0]
    for i, op in enumerate(ops[1:], start=1):
        if type(op).__name__ != "QubitDensityMatrix":
            continue
        sigma = op.data[0]
        if qml.math.requires_grad(sigma) or qml.math.ndim(sigma) != 2:
            raise DeviceError(f"qdiff.mixed: QubitDensityMatrix on wires {list(op.wires)} "
                              "after the first operation must be one constant density matrix "
                              "(not trainable, not broadcast)")
        lam, vecs = np.linalg.eigh(np.asarray(qml.math.unwrap(sigma), dtype=complex))
        d = vecs.shape[0]
        kraus = [np.sqrt(l) * np.outer(vecs[:, a], np.eye(d)[j])
                 for a, l in enumerate(lam) if l > 1e-15 for j in range(d)]
        ops[i] = qml.QubitChannel(kraus, wires=op.wires)
    return (tape.copy(operations=ops),), lambda results: results[0]


_SHADOWS = (ClassicalShadowMP, ShadowExpvalMP)


@qml.transform
def _expand_shadow_broadcast(tape):
    """Classical shadows: a broadcast tape runs row by row (PennyLane draws a shadow from one
    density matrix)."""
    if not any(isinstance(m, _SHADOWS) for m in tape.measurements) or not _batched(tape):
        return (tape,), lambda results: results[0]
    if tape.batch_size is None:
        raise DeviceError("qdiff.mixed: classical shadows of a circuit broadcast by a channel "
                          "parameter only are not simulated; broadcast a gate parameter too or "
                          "run one circuit per value")
    rows, fn = qml.transforms.broadcast_expand(tape)
    if any(_broadcast_channel(op) for op in tape.operations):
        rows = _split_channel_rows(rows)
    return tuple(rows), fn


def _computational(mp) -> bool:
    """A measurement in the computational basis of wires (readout errors act on it)."""
    return isinstance(mp, (ProbabilityMP, SampleMP, CountsMP)) and mp.obs is None and \
        mp.mv is None


@simulator_tracking
@single_tape_support
class QdiffMixed(Device):
    """qdiff's mixed-state engine (batched density matrices in torch, channels, device noise
    models) as a PennyLane device.

    Args:
        wires: number of wires or their labels (None: the wires of each circuit).
        shots: None (exact), an int, or a shot vector.
        seed: seed of the sampling generator (``numpy.random.default_rng`` seed; ``"global"``
            draws it from numpy's global generator).
        c_dtype: ``numpy.complex128`` (default) or ``numpy.complex64``.
        noise: ``None``, a fake IBM device name (``"fake_manila"``), a Qiskit backend, a
            ``qiskit_aer.noise.NoiseModel`` or a :class:`qdiff.noise.NoiseModel`.
        layout: with a device noise model, the device qubit of each wire (a permutation of
            ``0..n-1``).
    """

    _device_options = ("c_dtype",)

    @property
    def name(self):
        return "qdiff.mixed"

    def __init__(self, wires=None, shots=None, seed="global", c_dtype=np.complex128,
                 noise=None, layout=None):
        super().__init__(wires=wires, shots=shots)
        key = c_dtype if c_dtype in _DTYPES else getattr(np, str(c_dtype), None)
        if key not in _DTYPES:
            raise DeviceError(f"qdiff.mixed: c_dtype must be numpy.complex128 or "
                              f"numpy.complex64; got {c_dtype!r}")
        self._c_dtype = c_dtype
        self._cdtype = _DTYPES[key]
        try:
            self.noise = resolve_noise(noise)
        except QdiffError as exc:
            raise DeviceError(f"qdiff.mixed: {exc}") from None
        self.layout = layout
        # drawn as default.qubit/default.mixed draw it: after np.random.seed(s) the device
        # samples what PennyLane's devices sample and leaves the global stream where they do
        seed = np.random.randint(0, high=10000000) if seed == "global" else seed
        self._rng = np.random.default_rng(seed)
        self._engines: dict = {}
        self._debugger = None  # qml.snapshots' debugger while it is active (snapshots_taken)
        if self.wires is not None:
            self._engine(len(self.wires))  # a device wider than the noise model: refused now

    def _engine(self, n: int):
        eng = self._engines.get(n)
        if eng is None:
            import qdiff  # the device registry sits above the engines, at the package front
            try:
                eng = qdiff.device("mixed", wires=n, noise=self.noise, dtype=self._cdtype,
                                   layout=self.layout)
            except QdiffError as exc:
                raise DeviceError(f"qdiff.mixed: {exc}") from None
            self._engines[n] = eng
        return eng

    # -- configuration ---------------------------------------------------------------------

    def supports_derivatives(self, execution_config: Optional[ExecutionConfig] = None,
                             circuit=None) -> bool:
        if execution_config is None:
            return True
        if one_shot.traversed(execution_config):
            return False  # the branches' weights are not differentiated: gradient transforms
        if execution_config.gradient_method not in ("backprop", "best"):
            return False
        interface = backprop_interface(execution_config, circuit)
        if interface not in _BACKPROP_INTERFACES and \
                not (circuit is None and interface == Interface.AUTO):
            return False  # jax, tensorflow: PennyLane's gradient transforms (without a
            # circuit, e.g. ``qml.add_noise`` resolving a QNode's diff method, "auto" is
            # offered: the call resolves it)
        return circuit is None or not circuit.shots

    def setup_execution_config(self, config: Optional[ExecutionConfig] = None,
                               circuit=None) -> ExecutionConfig:
        config = config or ExecutionConfig()
        for option in config.device_options:
            if option not in self._device_options:
                raise DeviceError(f"device option {option} not present on {self}")
        updated = {}
        method = config.gradient_method
        if method is not None and not isinstance(method, str) and circuit is not None:
            refusal = transform_matrix_refusal(circuit, method)  # a gradient transform
            if refusal is not None:
                raise DeviceError(f"{self.name}: {refusal}")
        if method == "best" and config.interface in (Interface.TORCH, Interface.AUTOGRAD):
            method = updated["gradient_method"] = "backprop"
        updated["use_device_gradient"] = method == "backprop"
        updated["use_device_jacobian_product"] = False
        updated["grad_on_execution"] = False
        updated["mcm_config"] = one_shot.mcm_config(config.mcm_config, self.name)
        options = dict(config.device_options)
        options.setdefault("c_dtype", self._c_dtype)
        updated["device_options"] = options
        return replace(config, **updated)

    def preprocess_transforms(self, execution_config: Optional[ExecutionConfig] = None):
        config = execution_config or ExecutionConfig()
        program = qml.CompilePipeline()
        measured = config.mcm_config.mcm_method in ("one-shot", "tree-traversal")
        if self.noise is not None:
            program.add_transform(_refuse_mid_circuit_measurements, self.noise.name)
        if not measured:
            program.add_transform(defer_within(), device_wires=self.wires, name=self.name,
                                  allow_postselect=False)
        program.add_transform(_density_resets)
        program.add_transform(decompose_broadcast(),
                              stopping_condition=one_shot.stopping_condition(_stopping_condition)
                              if measured else _stopping_condition,
                              decomposer=_decomposer, split_rows=_split_channel_rows,
                              name=self.name)
        program.add_transform(device_resolve_dynamic_wires, wires=self.wires,
                              allow_resets=measured)
        program.add_transform(validate_device_wires, self.wires, name=self.name)
        program.add_transform(validate_measurements, analytic_measurements=_accepted_analytic,
                              sample_measurements=_accepted_sample, name=self.name)
        program.add_transform(validate_observables, stopping_condition=observable_stopping_condition,
                              name=self.name)
        program.add_transform(_expand_shadow_broadcast)
        program.add_transform(snapshots_taken(), device=self)
        if config.gradient_method == "backprop":
            program.add_transform(no_sampling, name=f"backprop + {self.name}")
        if measured:
            program.add_transform(_measured_channel_rows)
            one_shot.measured_transforms(program, config.mcm_config.mcm_method,
                                         config.mcm_config.postselect_mode)
        return program

    # -- execution -------------------------------------------------------------------------

    def execute(self, circuits, execution_config: Optional[ExecutionConfig] = None):
        if any(one_shot.has_mid_measure(t) for t in circuits):  # measured, not deferred
            return tuple(self._measured(t) if one_shot.has_mid_measure(t) else
                         self.execute((t,), execution_config)[0] for t in circuits)
        if has_boxes(circuits):  # backprop under the autograd interface
            return execute_autograd(circuits, lambda tapes: tuple(self._run(t) for t in tapes))
        torch_out = torch_backprop(execution_config)
        return tuple(self._run(t, torch_out) for t in circuits)

    def _measured(self, tape):
        """A tape with mid-circuit measurements measured
        (:func:`qdiff.circuits.pennylane_tree.run`: one-shot with shots, the outcome tree
        without)."""
        labels = self._labels(tape)
        wire_map = None if labels == tuple(range(len(labels))) else \
            {w: i for i, w in enumerate(labels)}
        try:
            return tree.run(tape, _DensityStates(self, labels, wire_map), self._rng,
                            snapshot_store(self._debugger))
        except QdiffError as exc:
            raise DeviceError(f"{self.name}: {exc}") from None

    def _snapshot_result(self, tape, whole):
        """One snapshot's measurement, on the circuit up to it (torch and autograd parameters
        kept differentiable; a torch result where the ``whole`` tape has torch parameters)."""
        if has_boxes((tape,)):
            return execute_autograd((tape,), lambda tapes: tuple(self._run(t) for t in tapes))[0]
        return self._run(tape, torch_tape(whole))

    def _labels(self, tape) -> tuple:
        labels = tuple(self.wires) if self.wires is not None else tuple(tape.wires)
        return labels or (0,)

    def _mixture_run(self, tape, labels):
        """The final density matrix of a tape that starts from ``QubitDensityMatrix(rho0)``:
        by linearity, ``sum_i p_i E(|v_i><v_i|)`` over the eigen-decomposition of ``rho0``
        (the other wires in |0>), all eigenvectors run as one batch of initial states."""
        op = tape.operations[0]
        rho0 = op.data[0]
        if qml.math.requires_grad(rho0) or qml.math.ndim(rho0) != 2:
            raise DeviceError(f"{self.name}: QubitDensityMatrix must be one constant density "
                              "matrix (not trainable, not broadcast)")
        lam, vecs = np.linalg.eigh(np.asarray(qml.math.unwrap(rho0), dtype=complex))
        keep = lam > 1e-15
        lam, vecs = lam[keep], vecs[:, keep]
        n, k = len(labels), len(op.wires)
        where = [slice(None) if w in op.wires else 0 for w in labels]
        order = [list(op.wires).index(w) for w in labels if w in op.wires]
        states = []
        for v in vecs.T:
            full = np.zeros((2,) * n, dtype=complex)
            full[tuple(where)] = np.transpose(v.reshape((2,) * k), order)
            states.append(full.reshape(-1))
        rest = tape.copy(operations=tape.operations[1:])
        engine = self._engine(n)
        m = len(states)
        try:
            rec, _ = from_pennylane_tape(rest, labels,
                                         [Measurement("density_matrix", None, labels)],
                                         engine.check_batch, channels=True)
            b = rec.theta.shape[0]
            init = torch.tensor(np.stack(states), dtype=torch.complex128)
            init = init.repeat_interleave(b, dim=0)
            routing = routing_for(rec.circuit, engine, init)
            final = tuple(range(n))
            res = engine.execute([Job(rec.circuit, rec.theta.repeat(m, 1), init,
                                      shots=None)])[0]
        except QdiffError as exc:
            raise DeviceError(f"{self.name}: {exc}") from None
        assert routing is None  # a circuit that needs routing refuses a state preparation
        rho = res.outputs[0].reshape(m, b, 2 ** n, 2 ** n)
        weights = torch.tensor(lam, dtype=rho.real.dtype, device=rho.device)
        return torch.einsum("m,mbij->bij", weights.to(rho.dtype), rho), final

    def _engine_run(self, tape, meas):
        """Run ``tape`` with the qdiff measurements ``meas`` (on wire labels): ``(outputs, final
        device qubit of each wire)``, routed for a device noise model (see the module)."""
        labels = self._labels(tape)
        n = len(labels)
        engine = self._engine(n)
        try:
            rec, _ = from_pennylane_tape(tape, labels, meas, engine.check_batch, channels=True)
            routing = routing_for(rec.circuit, engine, rec.initial_state)
            circuit, theta, final = rec.circuit, rec.theta, tuple(range(n))
            if routing is not None and trainable_matrix_op(rec.circuit) is not None:
                op = trainable_matrix_ops(tape)[0]
                raise QdiffError(f"{op.name} on wires {list(op.wires)}: a trainable matrix in "
                                 f"a circuit routed and translated for the noise model "
                                 f"'{self.noise.name}' is not differentiable (the translation "
                                 f"synthesizes gates from the matrix's values); parametrize "
                                 f"the gate with rotations, or detach the matrix")
            if routing is not None:
                circuit, theta, final = routing.circuit, routing.theta(theta), routing.final
            res = engine.execute([Job(circuit, theta, rec.initial_state, shots=None)])[0]
        except QdiffError as exc:
            raise DeviceError(f"{self.name}: {exc}") from None
        return res.outputs, final

    def _run(self, tape, torch_out: bool = False):
        """One tape's results; torch tensors for torch parameters, and with ``torch_out``
        (backprop under the torch interface)."""
        keep = torch_out or torch_tape(tape)
        labels = self._labels(tape)
        n = len(labels)
        batched = _batched(tape)
        mps = list(tape.measurements)
        if labels != tuple(range(n)):
            wire_map = {w: i for i, w in enumerate(labels)}
            mps_idx = [map_measurement_wires(m, wire_map) for m in mps]
        else:
            mps_idx = mps
        if tape.shots:  # PennyLane's sampler: a float64 draw, an index and n bits per shot
            total, rows = tape.shots.total_shots, tape.batch_size or 1
            try:
                memory.require(float(total) * rows * (16.0 + 8 * n),
                               f"sampling {total} shots of {rows} state(s) on {n} wires")
            except QdiffError as exc:
                raise DeviceError(f"{self.name}: {exc}") from None
        if _density_prep(tape) is not None:
            rho, final = self._mixture_run(tape, labels)
            if tape.shots:
                return self._sampled(mps_idx, rho, final, tape, batched, n, keep)
            return self._measure(mps_idx, rho, tape, batched, n, keep)
        if tape.shots:  # every sample from the one final density matrix
            outs, final = self._engine_run(tape, [Measurement("density_matrix", None, labels)])
            return self._sampled(mps_idx, outs[0], final, tape, batched, n, keep)
        native = [_native_measurement(m, labels) for m in mps]
        rest = [m for m, q in zip(mps_idx, native) if q is None]
        meas = [q for q in native if q is not None]
        # the others (entropies, probs of an observable, trainable observables, ...) by
        # PennyLane, each from the reduced density matrix of the wires it reads: an idle
        # wire's zero probabilities would reach PennyLane's square root of the probabilities
        # and turn backprop gradients into NaN (default.mixed's are finite there)
        reads = [sorted({int(w) for w in m.wires}) or list(range(n)) for m in rest]
        meas += [Measurement("density_matrix", None, tuple(labels[i] for i in ws))
                 for ws in reads]
        outs, _ = self._engine_run(tape, meas)
        got = iter(to_user(o if batched else o[0], keep)
                   for o in outs[:len(outs) - len(rest)])
        if rest:
            others = iter(
                self._measure_one(m if ws == list(range(n)) else
                                  map_measurement_wires(m, {w: i for i, w in enumerate(ws)}),
                                  rho, tape, batched, len(ws), keep)
                for m, ws, rho in zip(rest, reads, outs[len(outs) - len(rest):]))
        vals = [_mid_statistic(m, next(got)) if q is not None else next(others)
                for m, q in zip(mps, native)]
        return vals[0] if len(vals) == 1 else tuple(vals)

    def _sampled(self, mps, rho, final, tape, batched, n, keep=False):
        read = self._readout(rho, final) if self.noise is not None and (
            self.noise.readout or self.noise.readout_default is not None) \
            and any(_computational(m) for m in mps) else None
        if read is None or all(_computational(m) for m in mps):
            return self._measure(mps, read if read is not None else rho, tape, batched, n, keep)
        # readout errors on the computational-basis measurements only: those read one set of
        # samples through them, the others PennyLane's groups of the state itself
        vector = tape.shots.has_partitioned_shots
        got = {}
        for through in (True, False):
            idx = [i for i, m in enumerate(mps) if _computational(m) == through]
            if not idx:
                continue
            res = self._measure([mps[i] for i in idx], read if through else rho, tape, batched,
                                n, keep)
            if len(idx) == 1:  # one measurement's result comes unwrapped
                res = tuple((r,) for r in res) if vector else (res,)
            for j, i in enumerate(idx):
                got[i] = tuple(r[j] for r in res) if vector else res[j]
        parts = [got[i] for i in range(len(mps))]
        if vector:
            return tuple(tuple(p[i] for p in parts) for i in range(tape.shots.num_copies))
        return tuple(parts)

    def _measure_one(self, mp, rho, tape, batched: bool, n: int, keep: bool):
        """The exact result of ``mp`` (on wires ``0..n-1``) from the density matrices ``rho``
        ``(B, 2**n, 2**n)``: an expval/var of an observable with trainable parameters as
        ``Tr(rho O)`` (``Tr(rho O**2) - Tr(rho O)**2``) of its dense matrix, whose gradient is
        finite where an outcome has probability 0; anything else by PennyLane."""
        if isinstance(mp, (ExpectationMP, VarianceMP)) and mp.obs is not None and \
                mp.mv is None and keep:
            try:
                obs = from_pennylane_observable(mp.obs)
                m = obs.matrix(wire_order=range(n)).to(device=rho.device, dtype=rho.dtype)
            except (QdiffError, TypeError, ValueError):
                m = None
            if m is not None:
                mean = torch.einsum("bij,ji->b", rho, m).real
                val = mean if isinstance(mp, ExpectationMP) else \
                    torch.einsum("bij,ji->b", rho, m @ m).real - mean ** 2
                return to_user(val if batched else val[0], keep)
        return self._measure([mp], rho, tape, batched, n, keep)

    def _measure(self, mps, rho, tape, batched: bool, n: int, keep: bool = False):
        state = to_user(rho, keep)
        shape = ((rho.shape[0],) if batched else ()) + (2,) * (2 * n)
        state = state.reshape(shape) if batched else state[0].reshape(shape)
        mps = sampled_measurements(mps) if tape.shots else mps
        script = qml.tape.QuantumScript([], mps, shots=tape.shots)
        return measure_final_state(script, state, batched, rng=self._rng)

    def _readout(self, rho: torch.Tensor, final) -> torch.Tensor:
        """``rho`` through the noise model's readout confusion of each wire's device qubit,
        as the classical channel ``|p><p| -> sum_m M[m, p] |m><m|`` (exact for measurements in
        the computational basis)."""
        n = len(final)
        b = rho.shape[0]
        t = rho.reshape((b,) + (2,) * (2 * n))
        for i, q in enumerate(final):
            m = self.noise.readout.get(q, self.noise.readout_default)
            if m is None:
                continue
            m = m.to(device=rho.device, dtype=rho.real.dtype).to(rho.dtype)
            diag = torch.diagonal(t, dim1=1 + i, dim2=1 + n + i)     # (b, ..., 2)
            new = torch.tensordot(diag, m, dims=([-1], [1]))         # (b, ..., 2) measured
            t = torch.diag_embed(new, dim1=1 + i, dim2=1 + n + i)
        return t.reshape(rho.shape)

    def __repr__(self):
        noise = f", noise={self.noise.name!r}" if self.noise is not None else ""
        return f"<QdiffMixed device (wires={None if self.wires is None else len(self.wires)}" \
               f"{noise}, shots={self.shots})>"


def _batched(tape) -> bool:
    """Whether ``tape`` is broadcast: a broadcast gate parameter (``tape.batch_size``) or a
    broadcast channel parameter (PennyLane's channels report no ``batch_size``; the engine
    runs one row per value, as for gate angles)."""
    if tape.batch_size is not None:
        return True
    return any(_broadcast_channel(op) for op in tape.operations)


def _broadcast_channel(op) -> bool:
    return tape_channel_supported(op) and type(op).__name__ != "QubitChannel" and \
        any(qml.math.ndim(d) > 0 for d in op.data)


def _split_channel_rows(rows):
    """Row ``b`` of each broadcast channel parameter in row tape ``b`` (``broadcast_expand``
    splits gates only)."""
    out = []
    for b, row in enumerate(rows):
        ops = []
        for op in row.operations:
            if _broadcast_channel(op):
                sizes = {qml.math.shape(d)[0] for d in op.data if qml.math.ndim(d) > 0}
                if sizes != {len(rows)}:
                    raise DeviceError(f"qdiff.mixed: {op.name} on wires {list(op.wires)}: "
                                      f"broadcast parameters of sizes {sorted(sizes)} in a "
                                      f"circuit broadcast {len(rows)} times")
                op = qml.ops.functions.bind_new_parameters(
                    op, [d[b] if qml.math.ndim(d) > 0 else d for d in op.data])
            ops.append(op)
        out.append(row.copy(operations=ops))
    return out


@qml.transform
def _measured_channel_rows(tape):
    """A tape whose mid-circuit measurements are measured (one-shot, tree traversal) and that
    is broadcast by a channel parameter, as one tape per row: those methods take a broadcast
    tape row by row, and PennyLane's row split (``broadcast_expand``, also inside
    ``dynamic_one_shot``) sees gate parameters only, so the channel's rows would meet one row
    of states. Results are stacked as ``broadcast_expand`` stacks them."""
    if not one_shot.has_mid_measure(tape) or \
            not any(_broadcast_channel(op) for op in tape.operations):
        return (tape,), lambda results: results[0]
    if tape.batch_size is not None:
        rows, join = qml.transforms.broadcast_expand(tape)
        return tuple(_split_channel_rows(rows)), join
    size = max(qml.math.shape(d)[0] for op in tape.operations if _broadcast_channel(op)
               for d in op.data if qml.math.ndim(d) > 0)
    return tuple(_split_channel_rows([tape] * size)), _stacked_rows(tape)


def _stacked_rows(tape):
    """The results of one tape per broadcast row of ``tape`` stacked per measurement (and per
    shot-vector entry), the layout of a broadcast tape's results."""
    many = len(tape.measurements) > 1
    copies = tape.shots.num_copies if tape.shots.has_partitioned_shots else None

    def stack(per_row):
        if many:
            return tuple(qml.math.stack([r[m] for r in per_row])
                         for m in range(len(tape.measurements)))
        return qml.math.stack(list(per_row))

    def fn(results):
        if copies is None:
            return stack(results)
        return tuple(stack([r[s] for r in results]) for s in range(copies))
    return fn


def _density_prep(tape):
    """The leading ``QubitDensityMatrix`` of ``tape``, or ``None``."""
    ops = tape.operations
    return ops[0] if ops and type(ops[0]).__name__ == "QubitDensityMatrix" else None


def _native_measurement(mp, labels):
    """The qdiff measurement (on wire labels) of ``mp`` when the engine computes it exactly
    (expval/var of an observable qdiff converts, probs/density_matrix/purity of wires), else
    ``None`` (PennyLane measures it from the density matrix)."""
    if mp.mv is not None:  # deferred: the probabilities of its measurement wires
        kinds = (ExpectationMP, VarianceMP, ProbabilityMP)
        return Measurement("probs", None, tuple(mp.wires)) if type(mp) in kinds else None
    if isinstance(mp, (ExpectationMP, VarianceMP)) and mp.obs is not None:
        if any(qml.math.requires_grad(d) for d in mp.obs.data):
            return None
        try:
            obs = from_pennylane_observable(mp.obs)
        except Exception:  # noqa: BLE001 - PennyLane raises many kinds; measured from rho
            return None
        if not obs.terms:
            return None
        return Measurement("expval" if isinstance(mp, ExpectationMP) else "var", obs)
    wires = tuple(mp.wires) or tuple(labels)
    if type(mp) is ProbabilityMP and mp.obs is None:
        return Measurement("probs", None, wires)
    if type(mp) in (DensityMatrixMP, PurityMP):
        return Measurement("density_matrix" if type(mp) is DensityMatrixMP else "purity", None,
                           wires)
    return None


def _mid_statistic(mp, probs):
    """The statistic of a mid-circuit measurement value from the engine's probabilities
    ``probs`` of its measurement wires (``(2**k,)`` or ``(B, 2**k)``), as PennyLane's
    measurement functions compute it from them: the probabilities themselves, or their dot
    with the value of each outcome (``mp.eigvals()``). PennyLane's own route from a density
    matrix takes square roots of its diagonal, whose derivative is NaN where one is zero;
    these are polynomials in the probabilities. Other measurements pass through."""
    if mp.mv is None or type(mp) is ProbabilityMP:
        return probs
    values = qml.math.convert_like(np.asarray(mp.eigvals(), dtype=np.float64), probs)
    mean = qml.math.dot(probs, values)
    if type(mp) is ExpectationMP:
        return mean
    return qml.math.dot(probs, values ** 2) - mean ** 2
