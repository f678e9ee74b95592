"""The unitary of a circuit as a differentiable torch function of its parameters.

``unitary(circuit, theta)`` multiplies the gates' own matrix functions (``Gate.matrix``), so its
derivatives with respect to ``theta`` come from torch autograd (reverse mode, or forward mode
with ``torch.func.jacfwd``). The compiler fits parameterized templates with it; it is also a
reference for small circuits. Matrices are big-endian in wire order (wire 0 is the most
significant bit), as everywhere in qdiff.

>>> import torch
>>> from qdiff.circuits.circuit import Circuit
>>> from qdiff.circuits.gates import GATES
>>> from qdiff.circuits.operation import Operation, ParamRef
>>> c = Circuit(2, (Operation(GATES["ry"], (0,), (ParamRef(0),)),
...                 Operation(GATES["cx"], (0, 1))), num_params=1)
>>> u = unitary(c, torch.tensor([torch.pi]))
>>> u.abs().round().to(torch.int64).tolist()   # column 0: RY(pi), CX take |00> to |11>
[[0, 0, 1, 0], [0, 0, 0, 1], [0, 1, 0, 0], [1, 0, 0, 0]]
"""
from __future__ import annotations

import torch

from qdiff.circuits.errors import QdiffError
from qdiff.circuits.operation import ParamRef


def _angle(p, theta: torch.Tensor):
    """One angle: a float, or ``scale * theta[..., index] + offset`` for a ParamRef."""
    if isinstance(p, ParamRef):
        return theta[..., p.index] * p.scale + p.offset
    if isinstance(p, torch.Tensor):
        return p.to(theta.dtype)
    return torch.tensor(float(p), dtype=theta.dtype, device=theta.device)


def _apply(u: torch.Tensor, g: torch.Tensor, wires: tuple, n: int) -> torch.Tensor:
    """``G u`` for a ``(..., 2**k, 2**k)`` gate ``g`` on ``wires`` and ``u`` ``(..., d, d)``."""
    k, d = len(wires), 2 ** n
    lead = u.shape[:-2]
    t = u.reshape(*lead, *([2] * n), d)
    rows = [len(lead) + w for w in wires]
    t = torch.movedim(t, rows, list(range(len(lead), len(lead) + k)))
    moved = t.shape
    t = t.reshape(*lead, 2 ** k, -1)
    t = g @ t if g.dim() == 2 else torch.matmul(g, t)
    t = torch.movedim(t.reshape(moved), list(range(len(lead), len(lead) + k)), rows)
    return t.reshape(*lead, d, d)


def unitary(circuit, theta=None) -> torch.Tensor:
    """``(*batch, 2**n, 2**n)`` complex unitary of ``circuit`` at ``theta`` ``(*batch, P)``.

    ``theta`` may be omitted for a circuit without parameters (result ``(2**n, 2**n)``).
    Differentiable in ``theta`` (autograd and ``torch.func`` transforms).
    """
    if theta is None:
        if circuit.num_params:
            raise QdiffError(f"unitary: the circuit has {circuit.num_params} parameter(s); "
                             "pass theta")
        theta = torch.zeros(0, dtype=torch.float64)
    if theta.shape[-1:] != (circuit.num_params,):
        raise QdiffError(f"unitary: theta has shape {tuple(theta.shape)}; expected "
                         f"(..., {circuit.num_params})")
    n = circuit.num_wires
    cdtype = torch.complex64 if theta.dtype == torch.float32 else torch.complex128
    u = torch.eye(2 ** n, dtype=cdtype, device=theta.device)
    u = u.expand(*theta.shape[:-1], 2 ** n, 2 ** n)
    for op in circuit.operations:
        g = op.gate.matrix(*[_angle(p, theta) for p in op.params]).to(cdtype)
        u = _apply(u, g, op.wires, n)
    return u


def _right(u: torch.Tensor, g: torch.Tensor, wires: tuple, n: int) -> torch.Tensor:
    """``u G`` (``G`` embedded on ``wires``): ``(G^T u^T)^T``."""
    return _apply(u.mT, g.mT, wires, n).mT


def _op_derivatives(circuit, theta: torch.Tensor) -> tuple:
    """Per operation: its matrix ``(B, k, k)`` and the derivatives with respect to its own
    angles ``(B, a, k, k)`` (None for a constant gate), by torch autograd through the gate's
    matrix function -- one graph per gate type with all its operations batched, and one
    backward pass per matrix entry (real and imaginary part): each entry depends only on its
    own operation's angles, so the gradient of the entry summed over the batch separates."""
    groups: dict = {}
    for i, op in enumerate(circuit.operations):
        groups.setdefault(op.gate, []).append(i)
    mats, ders = [None] * len(circuit.operations), [None] * len(circuit.operations)
    b = theta.shape[0]
    for gate, idx in groups.items():
        if gate.num_params == 0:
            m = gate.matrix().to(torch.complex128)
            for i in idx:
                mats[i] = m.expand(b, *m.shape)
            continue
        ops = [circuit.operations[i] for i in idx]
        with torch.enable_grad():
            ang = torch.stack([torch.stack([_angle(p, theta).expand(b) for p in o.params], -1)
                               for o in ops], 1).detach().requires_grad_(True)  # (B, n, a)
            m = gate.matrix(*ang.unbind(-1)).to(torch.complex128)  # (B, n, k, k)
            dm = _entrywise_grad(m, ang)  # (B, n, a, k, k)
        for j, i in enumerate(idx):
            mats[i], ders[i] = m[:, j].detach(), dm[:, j]
    return mats, ders


def _entrywise_grad(m: torch.Tensor, ang: torch.Tensor) -> torch.Tensor:
    k = m.shape[-1]
    cols = []
    flat = torch.view_as_real(m).reshape(*m.shape[:-2], -1)  # (B, n, 2 k^2)
    for e in range(flat.shape[-1]):
        g, = torch.autograd.grad(flat[..., e].sum(), ang, retain_graph=True)
        cols.append(g)
    d = torch.stack(cols, -1).reshape(*ang.shape, k, k, 2)  # (B, n, a, k, k, re/im)
    return torch.view_as_complex(d.contiguous())


def unitary_jacobian(circuit, theta: torch.Tensor) -> tuple:
    """``(U (B, d, d), dU/dtheta (B, d, d, P))`` of ``circuit`` at ``theta`` ``(B, P)``.

    Each gate's derivative comes from torch autograd through its own matrix function; the
    chain rule through the circuit is the adjoint sweep ``dU = post_j (dG_j) pre_j`` with
    prefix and suffix products, and ``ParamRef`` scales map angles onto theta columns.

    >>> import torch
    >>> from qdiff.circuits.circuit import Circuit
    >>> from qdiff.circuits.gates import GATES
    >>> from qdiff.circuits.operation import Operation, ParamRef
    >>> c = Circuit(1, (Operation(GATES["rz"], (0,), (ParamRef(0, 2.0),)),), num_params=1)
    >>> u, j = unitary_jacobian(c, torch.tensor([[0.0]]))
    >>> j[0, :, :, 0].diagonal().tolist()   # d/dt diag(e^{-it}, e^{it}) at 0
    [-1j, 1j]
    """
    n, d = circuit.num_wires, 2 ** circuit.num_wires
    theta = theta.to(torch.float64)
    b, p = theta.shape
    mats, ders = _op_derivatives(circuit, theta)
    eye = torch.eye(d, dtype=torch.complex128).expand(b, d, d)
    pre = [eye]
    for op, m in zip(circuit.operations, mats):
        pre.append(_apply(pre[-1], m, op.wires, n))
    jac = torch.zeros(b, d, d, p, dtype=torch.complex128)
    post = eye
    for j in range(len(mats) - 1, -1, -1):
        op = circuit.operations[j]
        if ders[j] is not None:
            lead = ders[j].shape[:2]
            dv = post[:, None] @ _apply(pre[j][:, None].expand(*lead, d, d), ders[j], op.wires, n)
            for a, prm in enumerate(op.params):
                if isinstance(prm, ParamRef):
                    jac[..., prm.index] += prm.scale * dv[:, a]
        post = _right(post, mats[j], op.wires, n)
    return pre[-1], jac


__all__ = ["unitary", "unitary_jacobian"]
