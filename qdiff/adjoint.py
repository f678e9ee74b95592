"""The adjoint method: a vector-Jacobian product by one reverse sweep of uncomputation.

Given the final states ``psi = U_N ... U_1 |0>`` ``(B, 2**n)`` and the effective observable
``A_b`` folded from the cotangent (``lam = A_b psi``), the sweep walks the gates backwards:

    psi <- U_i^dag psi                       (uncompute: psi is now psi_{i-1})
    grad_ij = 2 Re <lam| dU_i/dphi_j |psi>   (one gate-sized application per trainable angle)
    lam <- U_i^dag lam

Memory: three states (psi, lam and one scratch) whatever the depth; the sweep restores the
input state, which the tests check.
"""
from __future__ import annotations

import torch

from qdiff.backends import measure
from qdiff.backends.simulate import apply_gate, op_angles, real_dtype_of
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.operation import ParamRef, is_concrete


def effective_state(state, circuit, cotangent, n):
    """``lam_b = sum_k g[b, k] O_k psi_b`` for the flattened outputs of ``circuit``."""
    lam = torch.zeros_like(state)
    col = 0
    for m in circuit.measurements:
        if m.kind == "expval":
            g = cotangent[:, col].to(state.dtype)
            lam = lam + g[:, None] * measure.apply_observable(state, m.obs, n)
            col += 1
        elif m.kind == "var":
            g = cotangent[:, col].to(state.dtype)
            phi = measure.apply_observable(state, m.obs, n)
            mean = (state.conj() * phi).sum(-1).real.to(state.dtype)
            phi2 = measure.apply_observable(phi, m.obs, n)
            lam = lam + g[:, None] * (phi2 - 2 * mean[:, None] * phi)
            col += 1
        elif m.kind == "probs":
            wires = list(range(n)) if m.wires is None else list(m.wires)
            k = len(wires)
            g = cotangent[:, col:col + 2 ** k].to(state.real.dtype)
            lam = lam + state * _expand_marginal(g, wires, n).to(state.dtype)
            col += 2 ** k
        else:
            raise QdiffError(f"{m.kind}() outputs are not differentiable with diff_method='adjoint'")
    return lam


def _expand_marginal(g, wires, n):
    """``(B, 2**k)`` values on ``wires`` broadcast to ``(B, 2**n)``."""
    b = g.shape[0]
    k = len(wires)
    t = g.reshape(b, *([2] * k))
    order = sorted(range(k), key=lambda i: wires[i])
    t = t.permute(0, *[1 + i for i in order])
    shape = [b] + [1] * n
    for w in wires:
        shape[1 + w] = 2
    return t.reshape(shape).expand(b, *([2] * n)).reshape(b, 2 ** n)


def _derivative_matrix(gate, angles, slot, cdtype, device):
    """``dU/dphi_slot`` at ``angles``: ``(B', d, d)`` by forward-mode AD of the matrix function."""
    angles = list(torch.broadcast_tensors(*angles))

    def f(a):
        args = list(angles)
        args[slot] = a
        return gate.matrix_fn(*args)
    _, du = torch.func.jvp(f, (angles[slot],), (torch.ones_like(angles[slot]),))
    du = du.to(device=device, dtype=cdtype)
    return du.unsqueeze(0) if du.ndim == 2 else du.reshape(-1, du.shape[-2], du.shape[-1])


def adjoint_vjp(circuit, theta, state, cotangent, trainable, return_state: bool = False):
    """``d(sum_bk g[b,k] f_k(theta_b)) / d theta`` ``(B, P)`` by one reverse sweep.

    ``circuit`` must use each theta column once with scale 1 (see ``bridge.unshare``). States
    are updated in place, except inside torch.func transforms (functional updates there).
    With ``return_state`` also returns the uncomputed state (the circuit's input state).
    """
    n = circuit.num_wires
    rdtype = real_dtype_of(state.dtype)
    inplace = is_concrete(state) and is_concrete(cotangent)
    psi = state.clone()
    lam = effective_state(psi, circuit, cotangent, n)
    cols = [None] * theta.shape[1]
    for op in reversed(circuit.operations):
        angles = op_angles(op, theta, rdtype)
        inv_gate, inv_angles = op.gate.inverse(angles)
        inv_angles = [a if isinstance(a, torch.Tensor) else
                      torch.tensor([float(a)], dtype=rdtype, device=psi.device) for a in inv_angles]
        psi = apply_gate(psi, inv_gate, op.wires, inv_angles, n, inplace=inplace)
        for slot, p in enumerate(op.params):
            if isinstance(p, ParamRef) and trainable[p.index]:
                du = _derivative_matrix(op.gate, angles, slot, psi.dtype, psi.device)
                dpsi = apply_gate(psi, op.gate, op.wires, angles, n, inplace=False, matrix=du)
                cols[p.index] = 2 * (lam.conj() * dpsi).sum(-1).real
        lam = apply_gate(lam, inv_gate, op.wires, inv_angles, n, inplace=inplace)
    zero = torch.zeros(psi.shape[0], dtype=rdtype, device=psi.device)
    grad = torch.stack([zero if c is None else c for c in cols], dim=-1) if cols else \
        torch.zeros(psi.shape[0], 0, dtype=rdtype, device=psi.device)
    return (grad, psi) if return_state else grad
