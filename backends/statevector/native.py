"""Native CPU kernels: a whole circuit (or a whole adjoint sweep) in one call.

The torch kernels pay torch's per-op dispatch (tens of microseconds) for every gate, and torch's
complex elementwise kernels run far below memory bandwidth on CPU. On CPU, for complex128 and
complex64 states outside autograd (inference, the forward pass of the adjoint and
parameter-shift methods, the adjoint sweep itself), qdiff therefore encodes the circuit as a
program of gate records (``qd_record`` in ``qdsim.h``, :data:`native_abi.RECORD` here) and runs
it in ``qdsim.c``: one pass per gate at memory speed, runs of gates on the low wires of a large
state applied chunk by chunk in cache, small states walked gate after gate while they sit in L1.

Gates whose :class:`~qdiff.circuits.gates.Gate` record names a ``native_code`` are *coded*: the
kernels evaluate their matrices and derivatives from ``theta`` themselves
(:class:`CodedPlan`). The kernels validate every record and return an error code, raised here
as :class:`~qdiff.circuits.errors.QdiffError`. Building and loading the library:
:mod:`qdiff.backends.statevector.native_lib`. Without it (no compiler, ``QDIFF_NATIVE=0``)
every path falls back to the torch kernels, which compute the same results (tests compare the
two). Autograd (backprop), CUDA and gates on more than 6 wires always use torch.

Threads: the kernels use ``torch.get_num_threads()`` threads (set it with
``torch.set_num_threads`` or ``OMP_NUM_THREADS``): one large state is split over them inside
each kernel, a batch of states is split by tiles.

>>> import torch
>>> from qdiff.circuits import Circuit, Operation, ParamRef, get_gate
>>> c = Circuit(1, (Operation(get_gate("rx"), (0,), (ParamRef(0),)),), num_params=1)
>>> plan = coded_plan(c.operations, 1)
>>> state = torch.tensor([[1, 0]], dtype=torch.complex128)
>>> theta = torch.tensor([[3.141592653589793]], dtype=torch.float64)
>>> plan is None or torch.allclose(run_plan(state, plan, theta).abs(),
...                                torch.tensor([[0.0, 1.0]], dtype=torch.float64))
True
"""
from __future__ import annotations

import contextlib
import ctypes

import numpy as np
import torch
from torch._C._functorch import is_functorch_wrapped_tensor as _is_functorch_wrapped

from qdiff.backends.statevector import native_lib
from qdiff.backends.statevector.gate_data import circuit_angles, circuit_data, fused_schedule
from qdiff.backends.statevector.native_abi import (DENSE, DIAG, DTYPES, MAXK, PAULI_DTYPES,
                                                   RECORD, AdjointArgs, angles_arg, call_run, check,
                                                   program_arg, ptr, record, threads,
                                                   tiles)
from qdiff.backends.statevector.native_coded import (PLANS, CodedPlan, Unsupported,
                                                     code_of, coded_plan, const_gate,
                                                     plan_adjoint, run_plan)
from qdiff.circuits.errors import QdiffError

__all__ = ["library", "disabled", "runs", "usable", "Unsupported", "Program", "run", "abs2",
           "evolve", "adjoint_sweep", "pauli_kernel", "CodedPlan", "coded_plan", "code_of",
           "run_plan", "plan_adjoint", "PLANS"]


def library():
    """The loaded kernel library, or ``None`` (disabled, no compiler, build failed)."""
    return native_lib.library()


@contextlib.contextmanager
def disabled():
    """Within the block every path uses the torch kernels (tests and benchmarks compare)."""
    saved = native_lib.reset(None, native_lib.NativeStatus(False, "disabled in this block"))
    try:
        yield
    finally:
        native_lib.reset(*saved)


def runs(cdtype, device, theta: torch.Tensor, grad: bool) -> bool:
    """THE choice between native and torch kernels for one run, made by the engine once per
    job and kept for its adjoint sweep: native for complex128 and complex64 states on the CPU
    outside autograd and torch.func transforms, when the library is built."""
    return (not grad and torch.device(device).type == "cpu" and cdtype in DTYPES
            and transform_free(theta) and library() is not None)


def usable(state: torch.Tensor) -> bool:
    """Whether ``state`` ``(B, 2**n)`` itself can be handed to the native kernels."""
    return (state.device.type == "cpu" and state.dtype in DTYPES
            and not state.requires_grad and transform_free(state) and state.is_contiguous()
            and library() is not None)


def transform_free(t: torch.Tensor) -> bool:
    """Whether ``t`` is a plain tensor, not one wrapped by a torch.func transform."""
    return not _is_functorch_wrapped(t)


# ------------------------------------------------------------------------------------------
# records


class Program:
    """Gate records and one data buffer of ``cdtype`` (complex128 or complex64)."""

    def __init__(self, batch: int, n: int, cdtype=torch.complex128):
        self.batch, self.n, self.cdtype = batch, n, cdtype
        self.recs: list = []
        self.chunks: list = []
        self.size = 0

    def add(self, kind: int, bits, cmask: int, value, per_item: int) -> None:
        """``value``: ``(B', per_item)`` or ``(per_item,)`` complex data, ``B'`` 1 or B (None
        for flips and swaps, which read no data)."""
        if len(bits) > MAXK or not bits:
            raise Unsupported(f"{len(bits)}-wire gate")
        if value is None:
            self.recs.append(record(kind, bits, cmask))
            return
        flat = value.reshape(-1)
        if flat.dtype != self.cdtype:
            flat = flat.to(self.cdtype)
        if flat.is_conj():
            flat = flat.resolve_conj()
        count = flat.numel() // per_item
        if count not in (1, self.batch):
            raise Unsupported(f"data for {count} bindings, batch {self.batch}")
        self.recs.append(record(kind, bits, cmask, self.size, per_item if count > 1 else 0))
        self.chunks.append(flat)
        self.size += flat.numel()

    def add_gate(self, gate, bits, cmask: int = 0) -> None:
        """A parameterless gate: fast paths for X-type flips, SWAP and diagonals."""
        kind, tb, cmask, d = const_gate(gate, bits, cmask)
        self.add(kind, tb, cmask, d, 0 if d is None else d.numel())

    def add_data(self, op, kind: str, value, n: int) -> None:
        """An op with gate data of ``kind`` (see :mod:`qdiff.backends.statevector.gate_data`)."""
        bits = [n - 1 - w for w in op.wires]
        if kind == "const":
            return self.add_gate(op.gate, bits)
        if kind == "diag":
            return self.add(DIAG, bits, 0, value, value.shape[-1])
        d = value.shape[-1]
        if kind in ("ctrl", "dctrl"):  # the target's matrix, every control in the mask
            k = op.gate.controls
            return self.add(DENSE, bits[k:], sum(1 << c for c in bits[:k]), value, d * d)
        return self.add(DENSE, bits, 0, value, d * d)

    def add_matrix(self, wire: int, u: torch.Tensor) -> None:
        self.add(DENSE, [self.n - 1 - wire], 0, u, 4)

    def copy(self) -> "Program":
        other = Program(self.batch, self.n, self.cdtype)
        other.recs, other.chunks, other.size = list(self.recs), list(self.chunks), self.size
        return other

    def buffers(self):
        """``(records (m,) RECORD array, data (size,) cdtype tensor)``."""
        recs = np.array(self.recs, dtype=RECORD)
        data = torch.cat(self.chunks) if self.chunks else torch.zeros(0, dtype=self.cdtype)
        return recs, data.contiguous()


# ------------------------------------------------------------------------------------------
# calls


def run(state: torch.Tensor, prog: Program, dagger: bool = False) -> torch.Tensor:
    """Apply the program (or its inverse) to ``state`` ``(B, 2**n)`` in place."""
    recs, data = prog.buffers()
    return call_run(library(), state, recs, data.to(state.dtype), dagger=dagger)


def abs2(state: torch.Tensor) -> torch.Tensor:
    """``|state|^2`` (real): one native pass when possible (torch's complex ``real**2 +
    imag**2`` takes three passes and two temporaries), differentiable torch otherwise."""
    if state.numel() >= 1 << 12 and usable(state):
        out = torch.empty(state.shape, dtype=state.real.dtype)
        rc = library().qd_abs2(DTYPES[state.dtype], ptr(state), ptr(out), state.numel())
        if rc == 0:
            return out
    return state.real ** 2 + state.imag ** 2


def half_marginals(state: torch.Tensor, n: int, low_bits: int):
    """``|state|^2`` ``(B, 2**n)`` summed to its high ``n - low_bits`` bits and to its low
    ``low_bits`` bits (the first wires and the rest): ``(B, 2**(n - low_bits))`` and
    ``(B, 2**low_bits)`` in the states' real dtype, in one native pass over the states (no
    ``|state|^2`` array; sums in double precision, the same bits for any thread count), or
    ``None`` where the kernels do not take ``state`` (autograd, other dtypes or devices)."""
    if state.numel() < 1 << 12 or not usable(state):
        return None
    b, rd = state.shape[0], state.real.dtype
    hi = torch.empty(b, 2 ** (n - low_bits), dtype=rd)
    lo = torch.empty(b, 2 ** low_bits, dtype=rd)
    rc = library().qd_zmarginals(DTYPES[state.dtype], ptr(state), b, n, low_bits, ptr(hi),
                                 ptr(lo), threads())
    return (hi, lo) if rc == 0 else None


class PauliKernel:
    """The flip-group product ``out[b, i] (+)= sum_g D[g, i] x[b, i ^ m_g]`` of a Pauli sum
    (:func:`qdiff.circuits.paulis.apply`'s ``kernel``) in one native call per chunk of groups:
    the torch loop takes a gather and a multiply-add per group, each a pass over the states.
    A group of X words alone has a constant diagonal: the kernel reads its value, not its row."""

    def takes(self, x: torch.Tensor) -> bool:
        """Whether states ``x`` ``(B, 2**n)`` (complex128/complex64, or float64/float32 for a
        real matrix, on the CPU, not under a torch.func transform; the caller keeps autograd
        out) go to the native kernel."""
        return (x.dim() == 2 and x.device.type == "cpu" and x.dtype in PAULI_DTYPES
                and transform_free(x) and library() is not None)

    def __call__(self, x: torch.Tensor, groups, lo: int, hi: int, d: torch.Tensor,
                 out: torch.Tensor = None) -> torch.Tensor:
        """``out`` (new when ``None``, else added to) for states ``x`` taken by :meth:`takes`,
        the groups ``lo..hi`` of :class:`~qdiff.circuits.paulis.PauliGroups` ``groups`` and
        their diagonals ``d`` ``(hi - lo, 2**n)`` (real, or complex for complex states)."""
        x = resolved(x.detach())
        b, dim = x.shape
        dcomplex = d.is_complex()
        if dcomplex and not x.is_complex():
            raise QdiffError("a complex Pauli-sum diagonal on real states")
        d = resolved(d.detach().to(x.dtype if dcomplex else x.real.dtype))
        drow = groups.kernel_rows(lo, hi)
        # held here for the call: the kernel reads them with the GIL released, while another
        # thread may replace the groups' cached mask tensor (a temporary slice would leave
        # only a pointer into memory freed with it)
        masks = groups.mask_tensor[lo:hi]
        consts = d[:, 0].contiguous()
        accumulate = out is not None
        if out is None:
            out = torch.empty_like(x)
        rc = library().qd_pauli_apply(PAULI_DTYPES[x.dtype], ptr(x), b, dim.bit_length() - 1,
                                      hi - lo, ptr(masks), ptr(drow),
                                      d.shape[0], ptr(d), ptr(consts), int(dcomplex), ptr(out),
                                      int(accumulate), threads())
        if rc:
            raise QdiffError(f"native kernels rejected a Pauli sum's flip groups: "
                             f"{library().qd_strerror(rc).decode()}")
        return out


def resolved(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous with its lazy conjugate or negation applied (the kernels read memory)."""
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t.contiguous()


pauli_kernel = PauliKernel()


def evolve(state, operations, theta, n, rdtype, fuse: bool = True, from_zero: bool = False,
           trace=None):
    """Native twin of :func:`qdiff.backends.statevector.simulate.evolve` (in place); raises
    :class:`Unsupported` before touching ``state`` if a gate cannot be encoded. ``fuse``
    allows multiplying runs of one-qubit gates on a wire into one 2x2 (large states only).

    Circuits whose parameterised gates all have native formulas (:func:`coded_plan`) run
    from ``theta`` directly: no gate data is computed in torch at all. ``trace``
    (:class:`~qdiff.backends.statevector.simulate.Trace`) receives the gate data and program an
    adjoint sweep of this run can reuse."""
    plan = coded_plan(operations, n)
    if plan is not None:  # large states: runs of gates share passes in cache tiles
        return run_plan(state, plan, theta, from_zero=from_zero)
    data = circuit_data(operations, circuit_angles(operations, theta, rdtype), state.dtype)
    prog = Program(state.shape[0], n, state.dtype)
    # fusing runs of one-qubit gates costs a small torch matmul per gate: worth it only when
    # a pass over the states costs more than that
    fuse = fuse and state.numel() >= 1 << 16
    for kind, a, b in fused_schedule(operations, data, state, fuse, fuse_flips=False):
        if kind == "1q":
            prog.add_matrix(a, b)
        else:
            prog.add_data(a, b.kind, b.value, n)
    if trace is not None:
        # the adjoint sweep needs these very gates: one record per op, in order (fused runs
        # reorder gates, so a fused program is not reusable)
        trace.data, trace.program = data, (None if fuse else prog)
    return run(state, prog)


def adjoint_sweep(ops, data, slot_data, psi, lam, n, program=None):
    """One reverse sweep over ``ops`` with forward ``data``; ``slot_data`` is a list of
    ``(op index, GateData of dU/dphi)`` sorted by op index. Uncomputes ``psi`` and ``lam`` in
    place and returns the ``(B, len(slot_data))`` float64 gradients
    ``2 Re <lam_i| dU_i |psi_{i-1}>``. ``program``: the forward pass's encoding of the same
    ``data`` (reused when given)."""
    b = psi.shape[0]
    if program is not None and program.batch == b and program.cdtype == psi.dtype:
        prog = program
    else:
        prog = Program(b, n, psi.dtype)
        for op, d in zip(ops, data):
            prog.add_data(op, d.kind, d.value, n)
    slots = Program(b, n, psi.dtype)
    slots.size, slots.chunks = prog.size, list(prog.chunks)  # one data buffer for both
    for i, dd in slot_data:
        slots.add_data(ops[i], dd.kind, dd.value, n)
    recs, _ = prog.buffers()
    slot_recs, buf = slots.buffers()
    slot_op = np.array([i for i, _ in slot_data], dtype=np.int64)
    grads = torch.empty(b, len(slot_data), dtype=torch.float64)
    args = AdjointArgs(dtype=DTYPES[psi.dtype], n=n, batch=b, psi=ptr(psi), lam=ptr(lam),
                       prog=program_arg(recs, buf), angles=angles_arg(None),
                       slots=program_arg(slot_recs, buf), slot_op=ptr(slot_op),
                       grads=ptr(grads), nthreads=threads(), tiles=tiles(), bad_record=-1)
    check(library(), library().qd_adjoint_slots(ctypes.byref(args)), args, "adjoint sweep")
    return grads
