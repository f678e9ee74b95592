"""``qd.device("pennylane", name=..., wires=n, shots=...)``: any PennyLane device.

Circuits convert to PennyLane tapes (:mod:`qdiff.circuits.pennylane_io`), all ``B`` bindings
as one broadcast tape, and run through ``qml.execute`` (one call per execute()). Devices with
their own adjoint method (``lightning.qubit``, ``default.qubit``) expose :meth:`vjp`, and the
``device_vjp`` capability, so ``diff_method="adjoint"`` can use the device's adjoint.
No dependency on the pennylane-qiskit plugin.

>>> import torch, qdiff as qd
>>> dev = qd.device("pennylane", name="default.qubit", wires=1)
>>> @qd.qnode(dev)
... def f(x):
...     qd.RY(x, wires=0)
...     return qd.expval(qd.Z(0))
>>> round(float(f(torch.tensor(0.3))), 10) == round(float(torch.cos(torch.tensor(0.3))), 10)
True
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from qdiff.backends.base import Backend, Capabilities, Result, flat_outputs, register_backend
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.memory import require


def pennylane_device_names() -> list:
    """Names of the installed PennyLane devices (``default.qubit``, ``lightning.qubit``, ...)."""
    import pennylane as qml
    return sorted(qml.plugin_devices)


@register_backend("pennylane", "pl")
class PennyLaneBackend(Backend):
    """A PennyLane device as a qdiff backend.

    Args:
        wires: number of wires or their labels.
        name: the PennyLane device name (``"default.qubit"``, ``"lightning.qubit"``, ...).
        shots: None (exact) or shots per execution (set on the tapes).
        seed: the device's seed (where it takes one).
        **device_kwargs: passed to ``qml.device``.
    """

    name = "pennylane"
    capabilities = Capabilities(backprop=False, vjp=False, shots=True, exact=True,
                                call_shots=False)

    def __init__(self, wires, name: str = "default.qubit", shots: Optional[int] = None,
                 seed: Optional[int] = None, **device_kwargs):
        super().__init__(wires, shots, seed)
        import pennylane as qml
        from pennylane.devices import ExecutionConfig
        if name not in qml.plugin_devices:
            raise QdiffError(f"unknown PennyLane device '{name}'; installed: "
                             f"{pennylane_device_names()}")
        kwargs = dict(device_kwargs)
        if seed is not None:
            # passed on even where the signature does not show it: the device then refuses it
            # (a QdiffError below) instead of qdiff dropping it
            kwargs["seed"] = int(seed)
        try:
            self.pl_device = qml.device(name, wires=self.num_wires, **kwargs)
        except Exception as exc:  # noqa: BLE001
            raise QdiffError(f"could not create PennyLane device '{name}': "
                             f"{type(exc).__name__}: {exc}") from None
        self.device_name = name
        has_adjoint = bool(self.pl_device.supports_derivatives(
            ExecutionConfig(gradient_method="adjoint")))
        self.capabilities = Capabilities(backprop=False, vjp=has_adjoint, shots=True, exact=True,
                                         vjp_kinds=("expval",), call_shots=False)
        self.executions = 0  # qml.execute calls made (forward and vjp)

    def __repr__(self):
        shots = f", shots={self.shots}" if self.shots else ""
        return f"<PennyLaneBackend {self.device_name} wires={self.num_wires}{shots}>"

    def _check(self, circuit, theta):
        if circuit.num_wires != self.num_wires:
            raise QdiffError(f"circuit has {circuit.num_wires} wires but the device has "
                             f"{self.num_wires}")
        theta = theta.reshape(1, -1) if theta.ndim == 1 else theta
        if theta.ndim != 2 or theta.shape[1] != circuit.num_params:
            raise QdiffError(f"theta must have shape (B, {circuit.num_params}); got "
                             f"{tuple(theta.shape)}")
        return theta

    def _tape(self, circuit, theta, initial_state, interface):
        from qdiff.circuits.pennylane_io import to_pennylane
        for m in circuit.measurements:
            if m.kind in ("sample", "counts") and not self.shots:
                raise QdiffError(f"{m.kind}() needs a device with shots "
                                 "(qd.device('pennylane', ..., shots=N))")
        return to_pennylane(circuit, theta, shots=self.shots, initial_state=initial_state,
                            interface=interface, use_labels=False, counts_as_samples=True)

    def execute(self, jobs) -> list:
        """One ``qml.execute`` of one broadcast tape per job (see the Backend protocol)."""
        out = []
        for job in jobs:
            if self.job_shots(job) != self.shots:
                raise QdiffError(f"PennyLane device '{self.device_name}': shots are set on the "
                                 f"device ({self.shots}); a job cannot ask for {job.shots}")
            outs = self._execute(job.circuit, job.theta, job.initial_state)
            out.append(Result(flat_outputs(outs) if job.flat else outs))
        return out

    def _execute(self, circuit, theta: torch.Tensor, initial_state=None) -> list:
        import pennylane as qml
        theta = self._check(circuit, theta)
        if self.shots:  # the device draws int64 samples of every wire for every binding
            require(8.0 * theta.shape[0] * self.shots * circuit.num_wires,
                    f"PennyLane device '{self.device_name}': {self.shots} shots x "
                    f"{theta.shape[0]} bindings on {circuit.num_wires} wires",
                    hint="use fewer shots or a smaller batch")
        tape = self._tape(circuit, theta.detach(), initial_state, "numpy")
        try:
            if tape.batch_size and any(isinstance(op, qml.operation.Channel)
                                       for op in tape.operations):
                # PennyLane's channels take one value per parameter (no broadcasting, and
                # broadcast_expand leaves their parameters whole): one tape per binding
                res = self._per_binding(circuit, theta, initial_state)
            else:
                res = qml.execute([tape], self.pl_device)[0]
        except QdiffError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise QdiffError(f"PennyLane device '{self.device_name}' failed: "
                             f"{type(exc).__name__}: {exc}") from None
        self.executions += 1
        return _outputs(circuit, res, tape.batch_size, theta.shape[0], theta.device)

    def _per_binding(self, circuit, theta, initial_state):
        """The results of a broadcast tape computed one binding at a time, stacked as the
        broadcast tape's would be (each measurement ``(B, ...)``)."""
        import pennylane as qml
        tapes = [self._tape(circuit, theta[b:b + 1].detach(), None if initial_state is None else
                            initial_state[b:b + 1] if initial_state.shape[0] > 1 else
                            initial_state, "numpy") for b in range(theta.shape[0])]
        rows = []
        for t, r in zip(tapes, qml.execute(tapes, self.pl_device)):
            r = [r] if len(circuit.measurements) == 1 else list(r)
            rows.append([np.asarray(x) if t.batch_size else np.asarray(x)[None] for x in r])
        out = [np.concatenate([row[i] for row in rows]) for i in range(len(rows[0]))]
        return out[0] if len(out) == 1 else tuple(out)

    def vjp(self, jobs, cotangents, residuals) -> list:
        """``(B, P)`` vector-Jacobian products by the device's adjoint method, one per job
        (``cotangents`` ``(B, K)`` match the flat outputs: expval only, as the adjoint method on
        PennyLane devices supports). The device keeps no residual: it runs its own forward."""
        return [self._vjp(job.circuit, job.theta, g, job.initial_state)
                for job, g in zip(jobs, cotangents)]

    def _vjp(self, circuit, theta: torch.Tensor, cotangent: torch.Tensor,
             initial_state=None) -> torch.Tensor:
        import pennylane as qml
        if not self.capabilities.vjp:
            raise QdiffError(f"PennyLane device '{self.device_name}' has no adjoint method")
        for m in circuit.measurements:
            if m.kind != "expval":
                raise QdiffError(f"{m.kind}() is not differentiable with the adjoint method of "
                                 f"'{self.device_name}'; use diff_method='parameter-shift'")
        theta = self._check(circuit, theta)
        t = theta.detach().clone().requires_grad_(True)
        states = [None] * t.shape[0] if initial_state is None else \
            initial_state.expand(t.shape[0], -1).unsqueeze(1)
        with torch.enable_grad():
            # one tape per binding: PennyLane 0.45's adjoint mishandles broadcast tapes
            # (wrong shapes/values for MultiRZ, crashes on partly broadcast Rot)
            tapes = [self._tape(circuit, t[b:b + 1], states[b], "torch")
                     for b in range(t.shape[0])]
            try:
                res = qml.execute(tapes, self.pl_device, diff_method="adjoint", device_vjp=True)
            except Exception as exc:  # noqa: BLE001
                raise QdiffError(f"adjoint on '{self.device_name}' failed: "
                                 f"{type(exc).__name__}: {exc}") from None
            self.executions += 1
            rows = [torch.cat([o.reshape(1, -1) for o in _outputs(circuit, r, None, 1, t.device,
                                                                   keep_graph=True)], dim=-1)
                    for r in res]
            flat = torch.cat(rows, dim=0)
            if not flat.requires_grad:
                return torch.zeros_like(theta)
            g = _pullback(flat, t, cotangent.to(torch.float64), _single_precision(res))
        return torch.zeros_like(theta) if g is None else g.to(theta.dtype)


def _single_precision(res) -> bool:
    """Whether PennyLane handed a result to torch in single precision: devices that return
    Python floats (``lightning.qubit``) come back as torch's default float32, and the
    cotangent then reaches the device's VJP rounded to float32 (relative error ~6e-8)."""
    if isinstance(res, (list, tuple)):
        return any(_single_precision(r) for r in res)
    return isinstance(res, torch.Tensor) and res.is_floating_point() and \
        torch.finfo(res.dtype).bits < 64


def _pullback(flat, t, cotangent, single: bool):
    """``cotangent^T d flat / d t`` ``(B, P)`` in float64 for outputs ``flat`` ``(B, K)``.

    With single-precision outputs a general cotangent would reach the device rounded to
    float32 (and the device's VJP combines the observables with those rounded weights), so
    the Jacobian rows are pulled back one output at a time with unit cotangents (exact in
    float32) and contracted here in float64."""
    if not single:
        return torch.autograd.grad(flat, t, cotangent, allow_unused=True)[0]
    g, k_last = None, flat.shape[1] - 1
    for k in range(flat.shape[1]):
        if not bool(cotangent[:, k].any()):
            continue
        unit = torch.zeros_like(cotangent)
        unit[:, k] = 1.0
        (jk,) = torch.autograd.grad(flat, t, unit, retain_graph=k < k_last, allow_unused=True)
        if jk is not None:
            term = jk.to(torch.float64) * cotangent[:, k:k + 1]
            g = term if g is None else g + term
    return g


def _outputs(circuit, res, batch_size, batch: int, device, keep_graph: bool = False) -> list:
    """PennyLane results -> one ``(B, ...)`` tensor per measurement."""
    res = [res] if len(circuit.measurements) == 1 else list(res)
    if len(res) != len(circuit.measurements):  # zip would pair results with the wrong ones
        raise QdiffError(f"the PennyLane device returned {len(res)} result(s) for "
                         f"{len(circuit.measurements)} measurement(s) "
                         f"{list(circuit.measurements)}")
    out = []
    for m, r in zip(circuit.measurements, res):
        t = r if isinstance(r, torch.Tensor) else torch.as_tensor(np.asarray(r))
        if m.kind == "state" and t.ndim != (1 if batch_size is None else 2):
            # a mixed-state device (default.mixed) answers qml.state() with its density matrix
            raise QdiffError(f"state() returns a state vector; the PennyLane device returned "
                             f"shape {tuple(t.shape)} (a density matrix): use "
                             "density_matrix(wires)")
        if batch_size is None:
            t = t.unsqueeze(0).expand(batch, *t.shape) if batch > 1 else t.unsqueeze(0)
        if not keep_graph:
            t = t.detach()
        if t.is_floating_point():
            t = t.to(torch.float64)
        elif m.kind in ("sample", "counts") and m.obs is None:
            t = t.to(torch.int64)
        if m.kind in ("sample", "counts") and m.obs is None and t.ndim == 2:
            t = t.unsqueeze(-1)  # one wire: (B, shots) -> (B, shots, 1)
        out.append(t.to(device).contiguous())
    return out
