"""One gate on a batch of states with the torch kernels: the fastest kernel for the gate's
kind (diagonal, CNOT, controlled, permutation, dense), its angles and its matrix.

>>> import torch, qdiff as qd
>>> from qdiff.backends.statevector.simulate import zero_state
>>> apply_gate(zero_state(1, 1, torch.complex128, "cpu"), qd.get_gate("x"), (0,), [], 1)
tensor([[0.+0.j, 1.+0.j]], dtype=torch.complex128)
"""
from __future__ import annotations

import torch

from qdiff.backends.statevector import kernels
from qdiff.circuits.operation import ParamRef


def real_dtype_of(cdtype: torch.dtype) -> torch.dtype:
    return torch.float32 if cdtype == torch.complex64 else torch.float64


def op_angles(op, theta: torch.Tensor, rdtype: torch.dtype) -> list:
    """Angles of ``op``: ``(B,)`` tensors for references, 0-d tensors for constants."""
    out = []
    for p in op.params:
        if isinstance(p, ParamRef):
            a = theta[:, p.index].to(rdtype)
            if p.scale != 1.0:
                a = a * p.scale
            if p.offset != 0.0:
                a = a + p.offset
            out.append(a)
        elif isinstance(p, torch.Tensor):
            out.append(p.to(rdtype).to(theta.device).reshape(-1))
        else:
            out.append(torch.tensor([float(p)], dtype=rdtype, device=theta.device))
    return out


def gate_matrix(gate, angles, cdtype, device) -> torch.Tensor:
    """``(B', d, d)`` matrix of ``gate`` at ``angles``."""
    if gate.num_params:
        angles = torch.broadcast_tensors(*angles)
    u = gate.matrix_fn(*angles)
    return kernels.as_batch_matrix(u.to(device), cdtype)


def apply_gate(state, gate, wires, angles, n: int, inplace: bool = False, matrix=None):
    """Apply one gate (dispatching to the fastest kernel); returns the new state."""
    cdtype, device = state.dtype, state.device
    if gate.diag_fn is not None and matrix is None:
        if gate.num_params:
            d = gate.diag_fn(*torch.broadcast_tensors(*angles))
        else:
            d = gate.diag_fn()
        d = d.to(device=device, dtype=cdtype)
        d = d.unsqueeze(0) if d.ndim == 1 else d.reshape(-1, d.shape[-1])
        return kernels.apply_diagonal(state, d, wires, n, inplace)
    if gate.name == "cx" and matrix is None:
        return kernels.apply_cnot(state, wires[0], wires[1], n, inplace)
    if gate.controls and matrix is None:
        controls, targets = wires[:gate.controls], wires[gate.controls:]

        def target_apply(sub, m, wmap, ip):
            return apply_gate(sub, gate.target, tuple(wmap[w] for w in targets), angles, m, ip)
        return kernels.apply_controlled(state, tuple(controls), target_apply, n, inplace)
    if matrix is None and gate.perm is not None and gate.num_wires <= 2 and gate.controls == 0:
        if gate.num_wires == 1:
            return kernels.apply_x(state, wires[0], n, inplace)
        if gate.name == "swap":
            return kernels.apply_permutation_swap(state, wires[0], wires[1], n, inplace)
    u = matrix if matrix is not None else gate_matrix(gate, angles, cdtype, device)
    if len(wires) == 1:
        return kernels.apply_one_qubit(state, u, wires[0], n, inplace)
    out = kernels.apply_matrix(state, u, wires, n)
    return state.copy_(out) if inplace else out
