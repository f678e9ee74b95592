"""Coded programs: circuits whose parameterised gates the native kernels evaluate themselves.

A gate whose :class:`~qdiff.circuits.gates.Gate` record names a ``native_code`` (the name of a
formula in ``qdsim.c``'s ``CODES``) is encoded as a record with that code, its angles' theta
columns, scales and shifts: no gate data is computed in torch, and the adjoint sweep evaluates
the derivatives too. A controlled gate whose target is coded is coded through its target, with
its controls (any number) as the record's control mask. A :class:`CodedPlan` is built once per circuit
structure (cached) and runs with any ``theta``.

>>> import torch
>>> from qdiff.circuits import Operation, ParamRef, get_gate
>>> ops = (Operation(get_gate("h"), (0,)), Operation(get_gate("crx"), (0, 1), (ParamRef(0),)))
>>> plan = coded_plan(ops, 2)
>>> plan is None or plan.columns == [(), (0,)]
True
"""
from __future__ import annotations

import ctypes

import numpy as np
import torch

from qdiff.backends.statevector import native_lib
from qdiff.backends.statevector.native_abi import (DENSE, DIAG, DTYPES, FLIP, MAXA, MAXK,
                                                   RECORD, SWAP, AdjointArgs, angles_arg,
                                                   call_run, check, program_arg, ptr, record,
                                                   threads, tiles)
from qdiff.circuits import caches
from qdiff.circuits.operation import ParamRef


class Unsupported(Exception):
    """The circuit has a gate the native kernels do not take (the caller falls back)."""


@caches.cached(maxsize=None)
def const_matrix(gate) -> torch.Tensor:
    """A parameterless gate's matrix, flat complex128."""
    return gate.matrix_fn().to(torch.complex128).reshape(-1).contiguous()


@caches.cached(maxsize=None)
def const_diag(gate) -> torch.Tensor:
    """A parameterless diagonal gate's diagonal, flat complex128."""
    return gate.diag_fn().to(torch.complex128).reshape(-1).contiguous()


def const_gate(gate, bits, cmask: int = 0) -> tuple:
    """``(kind, target bits, control mask, complex128 data or None)`` of a parameterless gate:
    X-type flips and SWAP read no data, diagonals their diagonal, others their matrix."""
    if gate.controls and gate.target is not None:
        for b in bits[:gate.controls]:
            cmask |= 1 << b
        return const_gate(gate.target, bits[gate.controls:], cmask)
    if gate.name == "x":
        return FLIP, bits, cmask, None
    if gate.name == "swap":
        return SWAP, bits, cmask, None
    if gate.diag_fn is not None:
        return DIAG, bits, cmask, const_diag(gate)
    return DENSE, bits, cmask, const_matrix(gate)


@caches.cached(maxsize=None)
def formula(name: str) -> tuple:
    """``(code, kind, target bits (0: any), angles)`` of the kernels' formula ``name``, or
    ``(0, 0, 0, 0)`` when the library has none of that name."""
    lib = native_lib.library()
    code = lib.qd_gate_code(name.encode()) if lib is not None else 0
    if not code:
        return 0, 0, 0, 0
    kind, k, na = ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int32()
    lib.qd_code_info(code, ctypes.byref(kind), ctypes.byref(k), ctypes.byref(na))
    return code, kind.value, k.value, na.value


def code_of(gate):
    """``(code, kind, number of control wires)`` of a coded gate, or ``None``."""
    base, nctrl = gate, 0
    while not base.native_code:  # controls first in the wires, also of a controlled target
        tgt = base.target
        if not (base.controls >= 1 and tgt is not None and tgt.num_params == gate.num_params):
            return None
        base, nctrl = tgt, nctrl + base.controls
    code, kind, k, na = formula(base.native_code)
    if not code or na != gate.num_params or (k and k != base.num_wires) or \
            base.num_wires > MAXK:
        return None
    return code, kind, nctrl


class CodedPlan:
    """A circuit encoded once: constant gates with their data, parameterised gates as codes
    with their theta columns. Runs need only ``theta``."""

    def __init__(self, ops, n: int):
        self.ops, self.n = ops, n
        recs, chunks, size = [], [], 0
        self.columns = []  # per op: the theta column of each angle (-1: constant)
        for op in ops:
            bits = [n - 1 - w for w in op.wires]
            if not op.params:
                kind, tb, cmask, d = const_gate(op.gate, bits)
                if len(tb) > MAXK:
                    raise Unsupported(f"{len(tb)}-wire gate '{op.name}'")
                recs.append(record(kind, tb, cmask, size if d is not None else 0))
                if d is not None:
                    chunks.append(d)
                    size += d.numel()
                self.columns.append(())
                continue
            recs.append(self._coded_record(op, bits))
        self.recs = np.array(recs, dtype=RECORD)
        data = torch.cat(chunks) if chunks else torch.zeros(0, dtype=torch.complex128)
        self._data = {torch.complex128: data}
        self._adjoint: dict = {}
        self._shared: dict = {}

    def _coded_record(self, op, bits) -> tuple:
        code = code_of(op.gate)
        if code is None or len(op.params) > MAXA:
            raise Unsupported(f"no native formula for '{op.name}'")
        code, kind, nctrl = code
        cmask = 0
        for b in bits[:nctrl]:
            cmask |= 1 << b
        scales, shifts, cols = [], [], []
        for p in op.params:
            if isinstance(p, ParamRef):
                scales.append(float(p.scale))
                shifts.append(float(p.offset))
                cols.append(p.index)
            elif isinstance(p, torch.Tensor):
                raise Unsupported("tensor angle in a circuit")
            else:
                scales.append(0.0)
                shifts.append(float(p))
                cols.append(-1)
        self.columns.append(tuple(cols))
        return record(kind, bits[nctrl:], cmask, code=code, cols=cols, scales=scales,
                      shifts=shifts)

    def data_for(self, cdtype) -> torch.Tensor:
        """The constant gates' data in ``cdtype`` (converted once)."""
        hit = self._data.get(cdtype)
        if hit is None:
            with caches.constants():
                hit = self._data[cdtype] = self._data[torch.complex128].to(cdtype)
        return hit

    def shared_flags(self, shared):
        """The int64 flag array of ``shared`` (cached), or ``None`` when no column is shared."""
        if shared is None:
            return None
        key = tuple(bool(x) for x in shared)
        hit = self._shared.get(key)
        if hit is None:
            hit = np.array(key, dtype=np.int64) if any(key) else False
            if len(self._shared) > 16:
                self._shared.clear()
            self._shared[key] = hit
        return None if hit is False else hit

    def adjoint_records(self, trainable) -> tuple:
        """Records with each gate's trainable-angle mask, and the first gate that has one."""
        key = tuple(trainable)
        hit = self._adjoint.get(key)
        if hit is None:
            recs = self.recs.copy()
            lo = len(self.columns)
            for i, cols in enumerate(self.columns):
                mask = sum(1 << j for j, c in enumerate(cols) if c >= 0 and key[c])
                recs["train"][i] = mask
                if mask and lo == len(self.columns):
                    lo = i
            hit = self._adjoint[key] = (recs, lo)
            caches.trim(self._adjoint, 16)  # threads share the plan: never a KeyError
        return hit


PLANS: dict = caches.register("native.coded_plans", {})


def coded_plan(ops, n: int):
    """The :class:`CodedPlan` of ``ops`` (a circuit's operations tuple; cached per object), or
    ``None`` when a gate has no native formula (or the kernels are not built)."""
    if native_lib.library() is None:
        return None
    hit = PLANS.get(id(ops))
    if hit is not None and hit[0] is ops and hit[1] == n:
        return hit[2]
    try:
        with caches.constants():
            plan = CodedPlan(ops, n)
    except Unsupported:
        plan = None
    if len(PLANS) >= 64:
        PLANS.clear()
    PLANS[id(ops)] = (ops, n, plan)
    return plan


def _theta_arg(theta: torch.Tensor, batch: int) -> torch.Tensor:
    th = theta.detach()
    if th.dtype != torch.float64:
        th = th.to(torch.float64)
    th = th.contiguous()
    if th.shape[0] not in (1, batch):
        raise Unsupported(f"theta has {th.shape[0]} rows for {batch} states")
    return th


def run_plan(state: torch.Tensor, plan: CodedPlan, theta: torch.Tensor,
             dagger: bool = False, from_zero: bool = False) -> torch.Tensor:
    """Apply the coded circuit (or its inverse) to ``state`` in place. ``from_zero``: the state
    is |0...0> (a leading product of one-qubit gates, with the CNOTs after it whose control
    lies above the target, is then written in one pass)."""
    th = _theta_arg(theta, state.shape[0])
    return call_run(native_lib.library(), state, plan.recs, plan.data_for(state.dtype), th,
                    dagger, from_zero)


def plan_adjoint(plan: CodedPlan, psi, lam, theta, trainable, restore: bool = False,
                 shared=None, lam_diagonal=None):
    """The adjoint sweep of a coded circuit: ``(B, P)`` gradients (of the states' real dtype)
    with respect to theta's columns (zero for columns not ``trainable``),
    ``2 Re <lam_i| dU_i/dtheta |psi_{i-1}>`` summed over every use of a column, in one native
    call. ``psi`` and ``lam`` are overwritten; with ``restore`` the sweep runs down to the
    first gate, leaving ``psi`` the input state.

    ``lam_diagonal`` (``(B, 2**n)`` real, instead of ``lam``): ``lam = lam_diagonal * psi``
    is formed in cache, tile by tile, and ``psi`` is left untouched (no copies of the states).
    It may be given as two halves ``(D_hi (B, 2**(n-m)), D_lo (B, 2**m))``:
    ``lam_diagonal[b, x] = D_hi[b, x >> m] + D_lo[b, x & (2**m - 1)]``.

    ``shared`` (optional, per column): True where the column is one value broadcast over the
    batch by construction (a weight), so that only its gradient's sum over the rows matters;
    the kernels may then return partial sums in some rows and zeros in others."""
    b = psi.shape[0]
    th = _theta_arg(theta, b)
    recs, lo = plan.adjoint_records(trainable)
    grad = torch.zeros(b, th.shape[1], dtype=torch.float64)
    sh = plan.shared_flags(shared)
    low, low_bits = None, 0
    if lam_diagonal is not None:
        if restore:
            raise ValueError("restore needs psi itself to be uncomputed: pass lam")
        if isinstance(lam_diagonal, tuple):
            lam_diagonal, low = (d.to(psi.real.dtype).contiguous() for d in lam_diagonal)
            low_bits = low.shape[1].bit_length() - 1
            if lam_diagonal.shape != (b, 2 ** (plan.n - low_bits)) or \
                    low.shape != (b, 2 ** low_bits):
                raise ValueError(f"diagonal halves of shapes {tuple(lam_diagonal.shape)} and "
                                 f"{tuple(low.shape)} for {b} states of {plan.n} qubits")
        else:
            lam_diagonal = lam_diagonal.to(psi.real.dtype).contiguous()
    data = plan.data_for(psi.dtype)
    args = AdjointArgs(dtype=DTYPES[psi.dtype], n=plan.n, batch=b, psi=ptr(psi), lam=ptr(lam),
                       prog=program_arg(recs, data), angles=angles_arg(th), gtheta=ptr(grad),
                       shared_cols=ptr(sh), lo=0 if restore else lo, ldiag=ptr(lam_diagonal),
                       nthreads=threads(), tiles=tiles(), bad_record=-1, ldiag_lo=ptr(low),
                       ldiag_bits=low_bits)
    lib = native_lib.library()
    check(lib, lib.qd_adjoint_coded(ctypes.byref(args)), args, "adjoint sweep")
    return grad if psi.dtype == torch.complex128 else grad.to(psi.real.dtype)
