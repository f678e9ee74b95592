"""Prepared jobs of the statevector engine: the per-structure work of a job done once.

A record-once qnode (``qd.qnode(..., static=True)``) runs the same circuit for new bindings
on every training step. For the common shape -- every parameterised gate coded in the native
kernels, the outputs Z words on a small register, CPU, no shots -- :class:`NativePrepared`
keeps the coded program, the sign matrix of the outputs (coefficients folded in) and the
adjoint records, so that one run is: a zero state, ONE native program call, ``|psi|^2`` times
the signs; and one gradient is: the cotangent times the signs (the diagonal ``lam = d * psi``)
and ONE native adjoint sweep, which returns every binding's gradient row (per-sample input
gradients included). Everything else takes the engine's ordinary path.

>>> import torch, qdiff as qd
>>> from qdiff.backends.base import Job
>>> dev = qd.device("statevector", wires=2)
>>> c = qd.Circuit(2, (qd.Operation(qd.get_gate("rx"), (0,), (qd.ParamRef(0),)),),
...                (qd.expval(qd.Z(0)), qd.expval(qd.Z(1))), num_params=1)
>>> prep = dev.prepare(Job(c, torch.zeros(3, 1, dtype=torch.float64), flat=True))
>>> prep.execute(torch.zeros(3, 1, dtype=torch.float64)).outputs
tensor([[1., 1.],
        [1., 1.],
        [1., 1.]], dtype=torch.float64)
"""
from __future__ import annotations

import torch

from qdiff.backends.base import Prepared, Result
from qdiff.backends.statevector import native, zwords
from qdiff.backends.statevector.simulate import check_memory, zero_state

_MAX_WIRES = 16  # above, the sign matrix and the engine's half-register reads are better


def prepare(backend, job) -> Prepared:
    """:class:`NativePrepared` when the job fits it, else the generic :class:`Prepared`."""
    if not _fits(backend, job):
        return Prepared(backend, job)
    return NativePrepared(backend, job)


def _fits(backend, job) -> bool:
    c = job.circuit
    dev = backend.torch_device
    if backend.job_shots(job) or job.initial_state is not None or not job.flat:
        return False
    if (dev is not None and dev.type != "cpu") or job.theta.device.type != "cpu":
        return False
    if backend.cdtype not in (torch.complex128, torch.complex64) or native.library() is None:
        return False
    ms = c.measurements
    if not ms or c.num_wires > _MAX_WIRES or (2 ** c.num_wires) * len(ms) > zwords.SIGN_BUDGET:
        return False
    if not all(zwords.is_z_word(m) and not m.obs.coeffs.requires_grad and
               not m.obs.coeffs.is_complex() for m in ms):
        return False
    return native.coded_plan(c.operations, c.num_wires) is not None


class NativePrepared(Prepared):
    """A job of coded gates and Z-word outputs, run by the native kernels with no per-call
    structure work (see the module docstring). Observable coefficients are read once, here."""

    def __init__(self, backend, job):
        super().__init__(backend, job)
        c = job.circuit
        self.n = c.num_wires
        self.cdtype = backend.cdtype
        self.rdtype = torch.float64 if self.cdtype == torch.complex128 else torch.float32
        self.plan = native.coded_plan(c.operations, self.n)
        words = tuple(tuple(sorted(f.wires[0] for f in m.obs.terms[0])) for m in c.measurements)
        coeffs = torch.tensor([float(m.obs.real_coeffs()[0]) for m in c.measurements],
                              dtype=self.rdtype)
        self.signs = (zwords.sign_matrix(words, self.n, self.rdtype, "cpu") * coeffs).contiguous()
        self.signs_t = self.signs.T.contiguous()
        self.trainable = tuple(job.trainable) if job.trainable is not None else \
            (True,) * job.theta.shape[1]
        self.shared = job.shared
        check_memory(self.n, self.batch, self.cdtype, "cpu", copies=4.0)

    def _check(self, theta):
        if theta.shape[0] != self.batch or theta.device.type != "cpu" or theta.requires_grad:
            raise ValueError(f"prepared for {self.batch} CPU bindings without grad; got theta "
                             f"{tuple(theta.shape)} on {theta.device}")

    def execute(self, theta: torch.Tensor, keep: bool = False) -> Result:
        self._check(theta)
        state = zero_state(self.n, self.batch, self.cdtype, "cpu")
        native.run_plan(state, self.plan, theta, from_zero=True)
        flat = native.abs2(state) @ self.signs
        return Result(flat, state if keep else None)

    def vjp(self, theta: torch.Tensor, cotangent: torch.Tensor, residual) -> torch.Tensor:
        self._check(theta)
        state = residual if residual is not None else self.execute(theta, keep=True).residual
        diag = cotangent.to(self.rdtype) @ self.signs_t
        return native.plan_adjoint(self.plan, state, None, theta, self.trainable,
                                   shared=self.shared, lam_diagonal=diag)
