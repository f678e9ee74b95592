"""The statevector engine behind the Backend protocol: batched torch statevector simulation
(CPU or CUDA), native CPU kernels where they apply, and the adjoint method as its ``vjp``.

>>> import torch, qdiff as qd
>>> dev = qd.device("statevector", wires=2, dtype=torch.complex64)
>>> dev.cdtype
torch.complex64
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Optional

import torch

from qdiff.backends.base import (Backend, Capabilities, Result, flat_outputs, register_backend,
                                 torch_placement)
from qdiff.backends.statevector import native, zwords
from qdiff.backends.statevector.adjoint import adjoint_vjp
from qdiff.backends.statevector.measure import (measure_all, probs, purity,
                                                reduced_density_matrix)
from qdiff.backends.statevector.measure import expval as state_expval
from qdiff.backends.statevector.trajectories import simulate_trajectories
from qdiff.circuits.circuit import trainable_matrix_op
from qdiff.circuits.channels import has_channels, is_channel
from qdiff.circuits.decompositions import lowered
from qdiff.circuits.noise import resolve_noise
from qdiff.backends.statevector.simulate import Trace, simulate
from qdiff.circuits.errors import QdiffError

_TRACE_LIMIT = 1 << 20  # complex entries of forward gate data worth keeping for the backward


@dataclass
class Residual:
    """What the adjoint ``vjp`` needs from its forward ``execute``: the final states, the
    forward's :class:`~qdiff.backends.statevector.simulate.Trace` and its kernel choice."""

    state: torch.Tensor
    trace: Trace
    use_native: bool


@register_backend("statevector", "default", "torch")
class StatevectorBackend(Backend):
    """Batched torch statevector simulation; exact, or sampled with a seeded generator.

    Args:
        wires: number of wires or their labels.
        shots: None for exact results, or the number of samples per measurement.
        device: torch device (``"cpu"``, ``"cuda"``, ...).
        dtype: ``torch.complex128`` (default) or ``torch.complex64``.
        seed: seed of the sampling generator (same seed, same samples).
        noise: a noise model (:mod:`qdiff.noise`, a device name, a Qiskit backend or Aer
            noise model); needs ``trajectories``.
        trajectories: ``K``: run circuits with channels as ``K`` quantum trajectories per
            binding (one batched simulation); results are unbiased estimates of the
            mixed-state values, their gradients by backpropagation.
        layout: with a device noise model, the device qubit of each wire (a permutation of
            ``0..n-1``); circuits are then routed from that placement. Without it, wire ``i``
            is device qubit ``i``; a circuit not native to the device is routed first.
    """

    name = "statevector"

    @property
    def capabilities(self) -> Capabilities:
        """Backprop, the adjoint method as ``vjp``, shots; ``fast_vjp`` where the native adjoint
        sweep runs (CPU, complex128 or complex64, the kernels built): then it is the fastest
        exact gradient at every size."""
        dev, cdtype = getattr(self, "torch_device", None), getattr(self, "cdtype", None)
        if getattr(self, "trajectories", None):
            return Capabilities(backprop=True, vjp=False, shots=False, exact=True,
                                stochastic=True)
        fast = (dev is None or dev.type == "cpu") and \
            cdtype in (torch.complex128, torch.complex64) and native.library() is not None
        return Capabilities(backprop=True, vjp=True, shots=True, exact=True, fast_vjp=fast)

    def __init__(self, wires, shots: Optional[int] = None, device=None, dtype=torch.complex128,
                 seed: Optional[int] = None, fuse: bool = True, noise=None,
                 trajectories: Optional[int] = None, layout=None):
        if trajectories is not None and (isinstance(trajectories, bool) or
                                         not isinstance(trajectories, int) or trajectories < 1):
            raise QdiffError(f"trajectories must be a positive integer; got {trajectories!r}")
        if trajectories and shots:
            raise QdiffError("trajectories and shots together are not supported: trajectory "
                             "averages are already estimates (use qd.device('mixed', shots=...) "
                             "for sampled noisy outcomes)")
        self.trajectories = trajectories
        super().__init__(wires, shots, seed)
        self.noise = resolve_noise(noise)
        if self.noise is not None and not trajectories:
            raise QdiffError("noise on the statevector device needs trajectories=K (or use "
                             "qd.device('mixed', noise=...) for exact density matrices)")
        if self.noise is not None:
            self.noise.check_wires(self.num_wires)
        if layout is not None and self.noise is None:
            raise QdiffError(f"layout={layout!r} needs a device noise model (noise=...)")
        self.layout = None if self.noise is None else self.noise.check_layout(layout,
                                                                              self.num_wires)
        self.cdtype, self.torch_device = torch_placement(dtype, device)
        self.fuse = check_fuse(fuse)

    def target_device(self, theta: torch.Tensor) -> torch.device:
        return self.torch_device if self.torch_device is not None else theta.device

    def final_state(self, circuit, theta, initial_state=None, trace=None,
                    use_native=None) -> torch.Tensor:
        """Final states ``(B, 2**n)`` (differentiable by autograd when ``theta`` requires grad)."""
        dev = self.target_device(theta)
        return simulate(lowered(circuit, "statevector"), theta.to(dev), initial_state,
                        self.cdtype, dev, self.fuse, trace, use_native)

    def _use_native(self, job) -> bool:
        """The kernel choice for ``job``, made once here and kept for its adjoint sweep."""
        grad = torch.is_grad_enabled() and (job.theta.requires_grad or (
            job.initial_state is not None and job.initial_state.requires_grad) or
            trainable_matrix_op(job.circuit) is not None)
        return native.runs(self.cdtype, self.target_device(job.theta), job.theta, grad)

    def execute(self, jobs) -> list:
        """One :class:`~qdiff.backends.base.Result` per job (see the Backend protocol)."""
        return [self._execute_one(job) for job in jobs]

    def _execute_one(self, job, measure: bool = True) -> Result:
        """``measure=False``: the residual of a ``keep`` job only (no outputs)."""
        if self.trajectories:
            return self._execute_trajectories(job)
        if has_channels(job.circuit):
            ch = next(op for op in job.circuit.operations if is_channel(op.gate))
            raise QdiffError(f"channel '{ch.gate.pl_name}' on wires {list(ch.wires)}: the "
                             "statevector device runs channels only with trajectories=K; use "
                             "qd.device('mixed') for exact density matrices")
        shots = self.job_shots(job)
        if job.keep and shots:
            raise QdiffError("the adjoint method is exact only: a job with shots keeps no "
                             "residual")
        trace = Trace() if job.keep else None
        use_native = self._use_native(job)
        state = self.final_state(job.circuit, job.theta, job.initial_state, trace, use_native)
        residual = None
        if job.keep:
            if trace.data is not None and sum(d.value.numel() for d in trace.data
                                              if d.value is not None) > _TRACE_LIMIT:
                trace.data = trace.program = None  # recomputed by the sweep: memory first
            residual = Residual(state, trace, use_native)
        if not measure:
            return Result(None, residual)
        if job.flat and not shots:
            flat = zwords.stacked_expvals(state, job.circuit)
            if flat is not None:
                return Result(flat, residual)
        outs = measure_all(state, job.circuit, shots,
                           self.generator(state.device) if shots else None)
        return Result(flat_outputs(outs) if job.flat else outs, residual)

    def prepare(self, job):
        """The job with its structure fixed: the native kernels' coded program and output
        signs kept when the job fits them (:mod:`qdiff.backends.statevector.prepared`)."""
        from qdiff.backends.statevector.prepared import prepare
        return prepare(self, job)

    def _execute_trajectories(self, job) -> Result:
        if job.keep:
            raise QdiffError("trajectories are differentiated by backprop only; use "
                             "diff_method='backprop' (or 'best')")
        if self.job_shots(job):
            raise QdiffError("trajectories and shots together are not supported")
        circuit = lowered(job.circuit if self.noise is None else self.noise.apply(job.circuit),
                          "statevector")
        dev = self.target_device(job.theta)
        k = self.trajectories
        states, weights = simulate_trajectories(circuit, job.theta, k, self.cdtype, dev,
                                                self.generator(dev), job.initial_state)
        outs = trajectory_measurements(states, circuit, k, self.noise, weights)
        return Result(flat_outputs(outs) if job.flat else outs)

    def vjp(self, jobs, cotangents, residuals) -> list:
        """``(B, P)`` gradients by the adjoint method: one reverse sweep per job over the
        residual its forward kept (or a fresh forward run when there is none)."""
        out = []
        for job, g, res in zip(jobs, cotangents, residuals):
            if res is None:  # the forward's final state (its measurements are not needed)
                res = self._execute_one(_keeping(job), measure=False).residual
            trainable = job.trainable or (True,) * job.theta.shape[1]
            theta = job.theta.to(res.state.device)
            out.append(adjoint_vjp(lowered(job.circuit, "statevector"), theta, res.state,
                                   g.to(res.state.device), trainable, shared=job.shared,
                                   trace=res.trace, use_native=res.use_native))
        return out


MAX_FUSE = 6  # widest fused block: 4**6 complex entries per binding


def check_fuse(fuse):
    """``fuse``: ``True`` (runs of one-qubit gates multiplied into one 2x2, the default),
    ``False`` (gate by gate) or an int ``k`` in ``2..MAX_FUSE`` (blocks over windows of ``k``
    consecutive wires); anything else is a ``QdiffError``."""
    if isinstance(fuse, bool):
        return fuse
    if isinstance(fuse, numbers.Integral) and 2 <= int(fuse) <= MAX_FUSE:
        return int(fuse)
    raise QdiffError(f"fuse={fuse!r}: expected True, False or an int from 2 to {MAX_FUSE} "
                     f"(gates fused within windows of that many consecutive wires)")


def _keeping(job):
    from dataclasses import replace
    return replace(job, keep=True, flat=True)


def trajectory_measurements(states, circuit, k: int, noise=None, weights=None) -> list:
    """Trajectory averages (``states`` ``(B*K, 2**n)``, unnormalised, with ``weights``
    ``(B*K,)``) of each measurement."""
    n = circuit.num_wires
    b = states.shape[0] // k

    def mean(x):
        if weights is not None:
            x = x * weights.reshape(-1, *([1] * (x.ndim - 1))).to(
                x.real.dtype if x.is_complex() else x.dtype)
        return x.reshape(b, k, *x.shape[1:]).mean(1)
    out = []
    for m in circuit.measurements:
        if m.kind == "expval":
            out.append(mean(state_expval(states, m.obs, n)))
        elif m.kind == "var":
            out.append(mean(state_expval(states, m.obs @ m.obs, n)) -
                       mean(state_expval(states, m.obs, n)) ** 2)
        elif m.kind == "probs":
            wires = list(range(n)) if m.wires is None else list(m.wires)
            p = mean(probs(states, wires, n))
            out.append(noise.readout_probs(p, wires) if noise is not None else p)
        elif m.kind in ("density_matrix", "purity"):
            rho = mean(reduced_density_matrix(states, m.wires, n))
            out.append(rho if m.kind == "density_matrix" else purity(rho))
        else:
            raise QdiffError(f"{m.kind}() is not available with trajectories (expval, var, "
                             "probs, density_matrix and purity are)")
    return out
