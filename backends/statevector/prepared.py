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

import ctypes
from dataclasses import replace

import numpy as np
import torch

from qdiff.backends.base import Bound, Prepared, Result
from qdiff.backends.statevector import native, zwords
from qdiff.backends.statevector.native_abi import (DTYPES, BatchArgs, check, program_arg, ptr,
                                                   threads)
from qdiff.backends.statevector.simulate import check_memory
from qdiff.circuits.decompositions import lowered

_MAX_WIRES = 16  # above, the sign matrix and the engine's half-register reads are better
_DENSE_MAX = 64  # largest 2**n for the embedding-then-shared-unitary path
_F64 = torch.float64
_LANE_MAXN = 10  # largest register for the lane-layout kernels (a chunk stays in cache)


def prepare(backend, job) -> Prepared:
    """:class:`NativePrepared` when the job fits it, else the generic :class:`Prepared`."""
    low = lowered(job.circuit, "statevector")
    if low is not job.circuit:
        job = replace(job, circuit=low)
    if not _fits(backend, job):
        return Prepared(backend, job)
    return NativePrepared(backend, job)


def _fits(backend, job) -> bool:
    c = job.circuit
    dev = backend.torch_device
    if backend.job_shots(job) or job.initial_state is not None or not job.flat:
        return False
    if backend.trajectories:  # noisy runs go through execute (trajectories are sampled)
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
        self.dense = None
        split = embedding_split(c, job.shared)
        d = 2 ** self.n
        if split and d <= _DENSE_MAX and self.batch >= 8 * d:  # measured crossover
            pre = ProductPrefix.build(c.operations[:split], self.n, self.cdtype) or \
                native.coded_plan(c.operations[:split], self.n)
            post = native.coded_plan(c.operations[split:], self.n)
            if pre is not None and post is not None:
                self.dense = (pre, post, _columns(c.operations[:split]),
                              _columns(c.operations[split:]))

    def bind(self, gather):
        """A :class:`LaneBound` (the lane-layout kernels, angles read from the arguments) for
        registers of up to ``_LANE_MAXN`` qubits, else ``None``."""
        if self.n > _LANE_MAXN or gather.idx.device.type != "cpu":
            return None
        return LaneBound(self, gather)

    def abs2(self, state: torch.Tensor) -> torch.Tensor:
        """``|state|^2`` in one native pass (also for small states: one call, no temporaries)."""
        out = torch.empty(state.shape, dtype=self.rdtype)
        if native.library().qd_abs2(DTYPES[state.dtype], ptr(state), ptr(out), state.numel()):
            return native.abs2(state)
        return out

    def _start(self) -> torch.Tensor:
        """Room for the batch's states (checked against memory when prepared): the kernels
        write |0...0> or the leading product into it themselves (``from_zero``)."""
        return torch.empty(self.batch, 2 ** self.n, dtype=self.cdtype)

    def _check(self, theta):
        if theta.shape[0] != self.batch or theta.device.type != "cpu" or theta.requires_grad:
            raise ValueError(f"prepared for {self.batch} CPU bindings without grad; got theta "
                             f"{tuple(theta.shape)} on {theta.device}")

    def execute(self, theta: torch.Tensor, keep: bool = False) -> Result:
        self._check(theta)
        if self.dense is not None:
            return self._dense_execute(theta, keep)
        state = self._start()
        native.run_plan(state, self.plan, theta, from_zero=True)
        flat = self.abs2(state) @ self.signs
        return Result(flat, state if keep else None)

    def vjp(self, theta: torch.Tensor, cotangent: torch.Tensor, residual) -> torch.Tensor:
        self._check(theta)
        if self.dense is not None:
            return self._dense_vjp(theta, cotangent, residual)
        state = residual if residual is not None else self.execute(theta, keep=True).residual
        diag = cotangent.to(self.rdtype) @ self.signs_t
        return native.plan_adjoint(self.plan, state, None, theta, self.trainable,
                                   shared=self.shared, lam_diagonal=diag)

    # -- the embedding-then-shared-unitary path ----------------------------------------------
    # psi_b = V e_b: e_b the product state of binding b's leading one-qubit gates, V the rest
    # of the circuit, the same for every binding (all its angles shared). V is computed once
    # per call on the 2**n basis states; the batch costs matmuls. The gradient of a shared
    # angle is sum_b 2 Re <lam_b| dV e_b> = 2 Re Tr(dV M), M = sum_b e_b lam_b^dag: ONE adjoint
    # sweep over V on the 2**n states m_c = M|c> with cotangent states |c>. The per-binding
    # gradients of the leading gates: a sweep over them with cotangent states V^dag lam_b.

    def _dense_execute(self, theta, keep):
        pre, post, _, _ = self.dense
        if isinstance(pre, ProductPrefix):
            e = pre.state(theta)
        else:
            e = native.run_plan(self._start(), pre, theta, from_zero=True)
        s = torch.eye(2 ** self.n, dtype=self.cdtype)  # row c: V|c>, so V = s^T
        native.run_plan(s, post, theta[:1])
        psi = e @ s
        flat = self.abs2(psi) @ self.signs
        return Result(flat, (e, s, psi) if keep else None)

    def _dense_vjp(self, theta, cotangent, residual):
        pre, post, pre_cols, post_cols = self.dense
        e, s, psi = residual if residual is not None else \
            self._dense_execute(theta, keep=True).residual
        lam = psi * (cotangent.to(self.rdtype) @ self.signs_t)
        grad = torch.zeros(self.batch, theta.shape[1], dtype=self.rdtype)
        if any(self.trainable[i] for i in pre_cols):
            mu = (lam @ s.conj().T).contiguous()  # V^dag lam_b
            if isinstance(pre, ProductPrefix):
                pre.add_gradient(grad, e, mu, self.trainable)
            else:
                grad += native.plan_adjoint(pre, e.clone(), mu, theta, self.trainable)
        if any(self.trainable[i] for i in post_cols):
            m = lam.conj().T @ e  # row c: M|c>
            d = 2 ** self.n
            g = native.plan_adjoint(post, (m @ s).contiguous(),
                                    torch.eye(d, dtype=self.cdtype), theta[:1], self.trainable)
            grad[0] += g.sum(0)
        return grad


def _columns(ops) -> set:
    return {p.index for op in ops for p in op.params if hasattr(p, "index")}


def embedding_split(circuit, shared) -> int:
    """``k`` when the circuit is ``k >= 1`` leading one-qubit gates (a product state from
    |0...0>, any angles) followed by at least one gate whose angles are all shared over the
    batch (or constant), else 0."""
    if shared is None:
        return 0
    ops = circuit.operations
    k = 0  # the leading one-qubit gates up to the first one with only shared angles
    while k < len(ops) and ops[k].gate.num_wires == 1 and not (ops[k].params and all(
            hasattr(p, "index") and shared[p.index] for p in ops[k].params)):
        k += 1
    if k == 0 or k == len(ops):
        return 0
    for op in ops[k:]:
        for p in op.params:
            if hasattr(p, "index") and not shared[p.index]:
                return 0
    return k


class ProductPrefix:
    """Leading one-parameter one-qubit gates on distinct wires with ``U(phi) = exp(-i phi G)``
    (e.g. an angle embedding): the product state of every binding and its per-binding angle
    gradients ``2 Re <mu_b| -i G_j e_b>`` in a few batched torch ops."""

    @classmethod
    def build(cls, ops, n: int, cdtype):
        wires = [op.wires[0] for op in ops]
        if len(set(wires)) != len(wires) or 2 ** n > _DENSE_MAX:
            return None
        gens = []
        for op in ops:
            g = op.gate
            if g.num_params != 1 or not g.generators or g.generators[0] is None or \
                    not hasattr(op.params[0], "index"):
                return None
            gen = torch.as_tensor(g.generators[0], dtype=torch.complex128)
            for phi in (0.37, -1.9):  # no constant factors: U is exactly exp(-i phi G)
                u = g.matrix_fn(torch.tensor(phi, dtype=torch.float64)).to(torch.complex128)
                if not torch.allclose(u, torch.linalg.matrix_exp(-1j * phi * gen), atol=1e-12):
                    return None
            gens.append(gen)
        plan = native.coded_plan(ops, n)
        if plan is None:
            return None
        return cls(ops, n, cdtype, wires, gens, plan)

    def __init__(self, ops, n, cdtype, wires, gens, plan):
        self.n, self.cdtype, self.wires, self.plan = n, cdtype, wires, plan
        rdtype = torch.float64 if cdtype == torch.complex128 else torch.float32
        self.cols = torch.tensor([op.params[0].index for op in ops])
        self.scale = torch.tensor([float(op.params[0].scale) for op in ops], dtype=rdtype)
        self.offset = torch.tensor([float(op.params[0].offset) for op in ops], dtype=rdtype)
        d = 2 ** n
        full = []
        for w, g in zip(wires, gens):  # G on wire w (wire 0 the most significant bit)
            full.append(torch.kron(torch.kron(torch.eye(2 ** w, dtype=torch.complex128), g),
                                   torch.eye(2 ** (n - 1 - w), dtype=torch.complex128)))
        self.g_cat = torch.cat([f.T for f in full], dim=1).to(cdtype).contiguous()  # (d, m d)

    def state(self, theta):
        """``(B, 2**n)`` product states (the native kernels write them directly)."""
        # written whole by the kernels (from_zero): no zero pass first
        e = torch.empty(theta.shape[0], 2 ** self.n, dtype=self.cdtype)
        return native.run_plan(e, self.plan, theta, from_zero=True)

    def add_gradient(self, grad, e, mu, trainable) -> None:
        """Add ``d/dtheta 2 Re <mu_b|e_b>`` to ``grad`` ``(B, P)`` (trainable columns)."""
        b, m = e.shape[0], len(self.wires)
        ge = (e @ self.g_cat).view(b, m, -1)  # G_j e_b
        g = 2 * torch.bmm(ge, mu.conj().unsqueeze(-1)).squeeze(-1).imag * self.scale
        keep = [j for j, c in enumerate(self.cols.tolist()) if trainable[c]]
        if len(keep) == m:
            grad[:, self.cols] += g.to(grad.dtype)
        elif keep:
            grad[:, self.cols[keep]] += g[:, keep].to(grad.dtype)


def lanes_for(n: int, batch: int) -> int:
    """Bindings per chunk of the lane layout: a multiple of 8, about 8192 amplitudes per chunk
    (psi and lam of a chunk stay in the L2 cache), at most 64 and not beyond the batch."""
    w = max(8, min(64, (8192 >> n) // 8 * 8))
    return min(w, -(-batch // 8) * 8)


class LaneBound(Bound):
    """The prepared job run by ``qd_batch_run`` / ``qd_batch_adjoint`` (``qdsim_batch.h``):
    the angles gathered from the argument tensors, the outputs, ``lam`` and the scatter of the
    gradients into the arguments all in the kernels; one call each way."""

    def __init__(self, prep: NativePrepared, gather, lanes: int = 0):
        self.prep, self.gather = prep, gather
        n, b = prep.n, prep.batch
        idx = gather.idx.to("cpu", torch.int64).contiguous()
        p = idx.shape[1]
        sizes = list(gather.sizes) + ([gather.consts.numel()] if gather.consts is not None else [])
        self.sizes, self.needs = tuple(gather.sizes), tuple(gather.needs)
        self.total = sum(sizes)
        bounds = torch.tensor(np.cumsum([0] + list(gather.sizes)), dtype=torch.int64)
        owner = torch.bucketize(idx, bounds[1:], right=True)  # argument of each element
        need = torch.tensor(list(gather.needs) + [False], dtype=torch.bool)
        col_need = need[owner].any(dim=0).tolist() if b else [False] * p
        train = tuple(bool(prep.trainable[j]) and col_need[j] for j in range(p))
        recs, _ = prep.plan.adjoint_records(train)
        self.recs, self.data = recs, prep.plan.data_for(prep.cdtype)
        self.idx = idx
        self.scale = None if gather.scale is None else \
            gather.scale.to("cpu", torch.float64).contiguous()
        self.offset = None if gather.offset is None else \
            gather.offset.to("cpu", torch.float64).contiguous()
        self.consts = None if gather.consts is None else \
            gather.consts.to("cpu", torch.float64).contiguous()
        c = prep.job.circuit
        self.words = np.array([sum(1 << (n - 1 - f.wires[0]) for f in m.obs.terms[0])
                               for m in c.measurements], dtype=np.int64)
        self.coeffs = np.array([float(m.obs.real_coeffs()[0]) for m in c.measurements],
                               dtype=np.float64)
        self.k = len(self.words)
        self.lanes = lanes or lanes_for(n, b)
        self.bpad = -(-b // self.lanes) * self.lanes if b else 0
        # the residual's states and a chunk of scratch (the dense form's blocks are a few
        # d x d matrices)
        check_memory(n, self.bpad + self.lanes, prep.cdtype, "cpu", copies=1.0)
        self.src_len = np.array(sizes, dtype=np.int64)
        shared = (idx == idx[:1]).all(dim=0) if b else torch.ones(p, dtype=torch.bool)
        for t in (self.scale, self.offset):
            if t is not None and b:
                shared &= (t == t[:1]).all(dim=0)
        self.cshared = shared.to(torch.int8).contiguous()
        self.args = BatchArgs(
            dtype=DTYPES[prep.cdtype], n=n, batch=b, prog=program_arg(recs, self.data), P=p,
            idx=ptr(idx), scale=ptr(self.scale), offset=ptr(self.offset),
            src_len=self.src_len.ctypes.data, nsrc=len(sizes), K=self.k,
            words=ptr(self.words), coeffs=ptr(self.coeffs), lanes=self.lanes,
            cshared=ptr(self.cshared), bad_record=-1)
        self._src_array = ctypes.c_void_p * max(len(sizes), 1)
        # the residual buffer: the final states (psi), then the angles (float64, aligned)
        psi_bytes = (2 * self.bpad << n) * (8 if prep.cdtype == torch.complex128 else 4)
        self._theta_at = -(-psi_bytes // 8) * 8
        self._buf_len = max((self._theta_at >> 3) + self.bpad * p, 1)
        self._nsrc = len(gather.sizes)
        self._spare = []  # slots free again (list pop/append: thread-safe)
        self._out_shape = (b, self.k)
        self.lib = native.library()

    def _release(self, slot) -> None:
        if len(self._spare) < 2:
            self._spare.append(slot)

    def _sources(self, tensors):
        """The tensors as contiguous float64 CPU tensors (themselves when they are)."""
        for t in tensors:
            if t.dtype is not _F64 or not t.is_cpu or not t.is_contiguous():
                break
        else:
            return tensors
        out = []
        for t in tensors:
            if t.dtype is not _F64 or not t.is_cpu:
                t = t.to("cpu", _F64)
            out.append(t if t.is_contiguous() else t.contiguous())
        return out

    def run(self, tensors, keep: bool) -> tuple:
        srcs = self._sources(tensors)
        try:  # a free slot (the residual buffer with its own argument block), or a new one
            slot = self._spare.pop()
        except IndexError:
            slot = _Slot(self)
        a, arr = slot.args, slot.src
        i = 0
        for t in srcs:
            arr[i] = t.data_ptr()
            i += 1
        out = torch.empty(self._out_shape, dtype=_F64)
        a.out = out.data_ptr()
        a.nthreads = threads()
        a.theta_ready = 0
        rc = self.lib.qd_batch_run(slot.ref)
        if rc:
            self._release(slot)
            check(self.lib, rc, a, "batched program")
        if keep:  # the residual: the slot (final states, angles) and the sources it read
            return out, (slot, srcs)
        self._release(slot)
        return out, None

    def grad(self, tensors, residual, cotangent: torch.Tensor) -> list:
        """The run's gradients; with a residual ``tensors`` is not read (the residual holds
        the run's sources and angles). The residual is consumed: the sweep overwrites its
        states, and its slot serves a later run."""
        if residual is None:
            residual = self.run(tensors, keep=True)[1]
        slot, srcs = residual
        a = slot.args  # the run's sources and angles are in it already
        a.theta_ready = 1
        a.nthreads = threads()
        cot = cotangent  # read through its pointer only (never part of a graph here)
        if cot.dtype is not _F64 or not cot.is_cpu or not cot.is_contiguous():
            if cot.dtype is not _F64 or not cot.is_cpu:
                cot = cot.detach().to("cpu", _F64)
            if not cot.is_contiguous():
                cot = cot.contiguous()
        # the kernel writes every element of each wanted gradient (zeros where none flows)
        new = torch.empty if self.prep.batch else torch.zeros
        out = []
        gout = slot.gout
        i = 0
        for t, need in zip(srcs, self.needs):
            if need:
                g = new(t.shape, dtype=_F64)
                gout[i] = g.data_ptr()
            else:
                g = gout[i] = None
            out.append(g)
            i += 1
        a.cot = cot.data_ptr()
        rc = self.lib.qd_batch_adjoint(slot.ref)
        self._release(slot)  # the residual is consumed: its slot serves the next run
        if rc:
            check(self.lib, rc, a, "batched adjoint sweep")
        return out


class _Slot:
    """One run's residual buffer (final states, then angles) with its own argument block: the
    fixed fields, the constants' and the buffer's pointers set once; a run fills in the
    sources and the outputs, its gradient the cotangent and the gradient buffers."""

    __slots__ = ("buf", "args", "ref", "src", "gout")

    def __init__(self, bound: LaneBound):
        self.buf = torch.empty(bound._buf_len, dtype=_F64)
        self.args = a = BatchArgs.from_buffer_copy(bound.args)
        self.ref = ctypes.byref(a)
        self.src = bound._src_array()
        self.gout = bound._src_array()
        if bound.consts is not None:
            self.src[bound._nsrc] = bound.consts.data_ptr()
        a.src = ctypes.addressof(self.src)
        a.gout = ctypes.addressof(self.gout)
        a.psi = base = self.buf.data_ptr()
        a.theta = base + bound._theta_at
