"""Evolve a batch of density matrices through a circuit (gates and channels).

``rho`` is ``(B, 2**n, 2**n)``; internally a vector on ``2n`` wires (row wires ``0..n-1``,
column wires ``n..2n-1``), updated block by block (:mod:`qdiff.backends.mixed.superops`) with
one einsum per block over a view whose untouched wires are merged into few axes.

>>> import torch, qdiff as qd
>>> c = qd.Circuit(1, (qd.Operation(qd.get_gate("h"), (0,)),
...                    qd.Operation(qd.PhaseFlip, (0,), (0.5,))))
>>> evolve(c, torch.zeros(1, 0, dtype=torch.float64))[0].real
tensor([[0.5000, 0.0000],
        [0.0000, 0.5000]], dtype=torch.float64)
"""
from __future__ import annotations

import string

import torch
import torch.autograd.forward_ad as _forward_ad

from qdiff.backends.mixed.superops import Evaluator, fusion_plan, is_constant, op_matrices
from qdiff.circuits import memory
from qdiff.circuits.circuit import memo, trainable_matrix_op, unitary_ops
from qdiff.circuits.errors import QdiffError

_LETTERS = string.ascii_letters[1:]  # "a" is the batch


def state_bytes(n: int, cdtype) -> float:
    """Bytes of one density matrix: ``4**n`` entries (16 * 4**n for complex128)."""
    return float(4 ** n) * cdtype.itemsize


def check_memory(n: int, batch: int, cdtype, device, copies: float) -> None:
    """Refuse (before allocating) ``copies`` batches of density matrices that do not fit."""
    one = state_bytes(n, cdtype)
    memory.require(one * batch * copies, f"simulating {n} qubits as density matrices with batch "
                   f"{batch} ({copies:g} cop{'y' if copies == 1 else 'ies'} of "
                   f"{memory.gib(one * batch)}; 16*4**n bytes per complex128 state)", device)


def zero_density(n: int, batch: int, cdtype, device) -> torch.Tensor:
    rho = torch.zeros(batch, 2 ** n, 2 ** n, dtype=cdtype, device=device)
    rho[:, 0, 0] = 1
    return rho


def merged_axes(wires: set, m: int) -> list:
    """Per axis of the merged view: ``("g", wire)`` for a wire in ``wires``, ``("r", size)``
    for a run of other wires."""
    out, run = [], 1
    for w in range(m):
        if w in wires:
            if run > 1:
                out.append(("r", run))
                run = 1
            out.append(("g", w))
        else:
            run *= 2
    if run > 1:
        out.append(("r", run))
    return out


def apply_on(vec: torch.Tensor, mat: torch.Tensor, wires, m: int) -> torch.Tensor:
    """``mat`` ``(B', 2**k, 2**k)`` on ``wires`` (in matrix order) of ``vec`` ``(B, 2**m)``."""
    b, bp = vec.shape[0], mat.shape[0]
    k = len(wires)
    axes = merged_axes(set(wires), m)
    letters = iter(_LETTERS)
    src, dst, shape, gl = [], [], [], {}
    for kind, val in axes:
        c = next(letters)
        src.append(c)
        if kind == "g":
            gl[val] = c
            shape.append(2)
        else:
            shape.append(val)
    new = {w: next(letters) for w in wires}
    dst = [new[val] if kind == "g" else c for (kind, val), c in zip(axes, src)]
    um = mat.reshape(bp, *([2] * (2 * k)))
    batch = "a" if bp == b and b > 1 else ""
    if not batch:
        um = um.reshape(*([2] * (2 * k)))
    spec = f"{batch}{''.join(new[w] for w in wires)}{''.join(gl[w] for w in wires)}," \
           f"a{''.join(src)}->a{''.join(dst)}"
    return torch.einsum(spec, um, vec.view(b, *shape)).reshape(vec.shape)


def is_superop(mat: torch.Tensor, wires) -> bool:
    """Whether a big block's matrix is a channel's superoperator (``4**k`` square) rather than
    a gate's unitary (``2**k``)."""
    return mat.shape[-1] == 4 ** len(wires)


def _tangent_matrix_op(circuit):
    """The name of the first QubitUnitary whose matrix carries a forward-mode tangent
    (``torch.func.jvp``/``jacfwd``, whose levels do not set ``requires_grad``) or is wrapped
    by nested ``torch.func`` levels (an outer one may differentiate it); ``None`` otherwise
    (a constant made inside one transform is wrapped at that level only)."""
    if not torch._C._are_functorch_transforms_active():
        return None
    f = torch._C._functorch
    for op, gate in unitary_ops(circuit):
        t, levels = gate.matrix_fn(), 0
        if _forward_ad.unpack_dual(t).tangent is not None:
            return op.gate.pl_name or op.gate.name
        while f.is_functorch_wrapped_tensor(t):
            levels += not f.is_batchedtensor(t)
            t = f.get_unwrapped(t)
        if levels > 1:
            return op.gate.pl_name or op.gate.name
    return None


def evolve(circuit, theta: torch.Tensor, initial=None, cdtype=torch.complex128,
           device=None) -> torch.Tensor:
    """Final density matrices ``(B, 2**n, 2**n)`` for bindings ``theta`` ``(B, P)``;
    differentiable by torch autograd in ``theta`` (gate angles and channel parameters) and in
    the matrices of ``QubitUnitary`` gates that require grad."""
    name = _tangent_matrix_op(circuit)
    if name is not None:
        raise QdiffError(f"{name}: a gate matrix that carries a torch.func tangent, or is built "
                         "inside nested torch.func transforms (which may differentiate it), is "
                         "not differentiable on the mixed device; build the gate from "
                         "parametrized gates, or the matrix outside the transformed function")
    n = circuit.num_wires
    device = theta.device if device is None else torch.device(device)
    batch = theta.shape[0]
    rdtype = torch.float32 if cdtype == torch.complex64 else torch.float64
    plan = fusion_plan(circuit)
    grad = torch.is_grad_enabled() and (theta.requires_grad or
                                        trainable_matrix_op(circuit) is not None)
    # under autograd each block keeps about three density matrices for the backward (its
    # input, the permuted copy its product reads, the product: 2.8 measured at 9 qubits)
    check_memory(n, batch, cdtype, device, 3.0 + (3.0 * len(plan) if grad else 0.0))
    if initial is None:
        rho = zero_density(n, batch, cdtype, device)
    else:
        rho = initial.to(device=device, dtype=cdtype).expand(batch, 2 ** n, 2 ** n)
    ops = circuit.operations
    if not ops:
        return rho.clone() if initial is not None else rho
    mats = op_matrices(ops, theta.to(device), rdtype, cdtype, skip=is_constant)
    cache = memo(circuit, ("mixed.constants", cdtype, str(device)), dict)
    ev = Evaluator(ops, mats, cache, cdtype, device)
    ev.prefetch(plan)
    vec = rho.reshape(batch, 4 ** n)
    m = 2 * n
    for bi, (blk, steps) in enumerate(plan):
        if blk.big and not is_superop(ev.op(blk.ops[0]), blk.wires):
            u = ev.op(blk.ops[0])
            vec = apply_on(vec, u, blk.wires, m)
            vec = apply_on(vec, u.conj(), tuple(n + w for w in blk.wires), m)
        elif blk.big:  # a channel on three or more wires: its superoperator
            vec = apply_on(vec, ev.op(blk.ops[0]), blk.wires + tuple(n + w for w in blk.wires), m)
        else:
            s = ev.steps(steps, blk, bi)
            vec = apply_on(vec, s, blk.wires + tuple(n + w for w in blk.wires), m)
    return vec.reshape(batch, 2 ** n, 2 ** n)
