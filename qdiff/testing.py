"""Gradient checks for users and tests (in the spirit of JAX's ``check_vjp``).

* :func:`check_directional` — the derivative along one random direction against a central
  finite difference;
* :func:`check_vjp` — the dot-product test ``<u, J v> == <J^T u, v>`` with ``J v`` by central
  differences and ``J^T u`` by the qnode's own backward;
* :func:`compare_methods` — the same qnode under several ``diff_method``s, gradients compared.

>>> import torch, qdiff as qd
>>> dev = qd.device("statevector", wires=1)
>>> @qd.qnode(dev, diff_method="adjoint")
... def f(x):
...     qd.RY(x[0], wires=0); qd.RX(x[1], wires=0); return qd.expval(qd.Z(0))
>>> check_vjp(f, torch.tensor([0.3, 0.4], dtype=torch.float64))
True
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from qdiff.circuits.errors import QdiffError


def _flat(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out.reshape(-1)
    return torch.cat([o.reshape(-1) for o in out])


def _jvp_fd(f: Callable, x: torch.Tensor, v: torch.Tensor, eps: float) -> torch.Tensor:
    with torch.no_grad():
        return (_flat(f(x + eps * v)) - _flat(f(x - eps * v))) / (2 * eps)


def check_directional(f: Callable, x: torch.Tensor, eps: float = 1e-6, atol: float = 1e-7,
                      rtol: float = 1e-6, seed: int = 0) -> bool:
    """``d/dt sum(f(x + t v))`` by autograd vs central differences, ``v`` random unit."""
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(x.shape, generator=gen, dtype=x.dtype)
    v = v / v.norm()
    xr = x.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(_flat(f(xr)).sum(), xr)
    fd = _jvp_fd(f, x.detach(), v, eps).sum()
    got = (g * v).sum()
    if not torch.allclose(got, fd, atol=atol, rtol=rtol):
        raise QdiffError(f"directional derivative mismatch: autograd {float(got):.10g} vs finite "
                         f"differences {float(fd):.10g}")
    return True


def check_vjp(f: Callable, x: torch.Tensor, eps: float = 1e-6, atol: float = 1e-7,
              rtol: float = 1e-6, seed: int = 0) -> bool:
    """Dot-product test: ``<u, J v>`` (finite differences) equals ``<J^T u, v>`` (backward)."""
    gen = torch.Generator().manual_seed(seed)
    xr = x.detach().clone().requires_grad_(True)
    y = _flat(f(xr))
    u = torch.randn(y.shape, generator=gen, dtype=y.dtype)
    v = torch.randn(x.shape, generator=gen, dtype=x.dtype)
    (vjp,) = torch.autograd.grad(y, xr, grad_outputs=u)
    lhs = (u * _jvp_fd(f, x.detach(), v, eps)).sum()
    rhs = (vjp * v).sum()
    if not torch.allclose(lhs, rhs, atol=atol, rtol=rtol):
        raise QdiffError(f"VJP dot-product test failed: <u, Jv> = {float(lhs):.10g}, "
                         f"<J^T u, v> = {float(rhs):.10g}")
    return True


def compare_methods(qnode, args: Sequence[torch.Tensor],
                    methods: Sequence[str] = ("backprop", "adjoint", "parameter-shift", "finite-diff"),
                    atol: float = 1e-8) -> dict:
    """Gradients of ``sum(qnode(*args))`` w.r.t. every arg that requires grad, per method.

    Returns ``{method: [grads]}``; raises ``QdiffError`` naming the first method that differs
    from the first one by more than ``atol``.
    """
    from qdiff.qnode import QNode
    results = {}
    for m in methods:
        q = QNode(qnode.func, qnode.device, diff_method=m)
        leaves = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
        wrt = [a for a in leaves if a.requires_grad]
        results[m] = list(torch.autograd.grad(_flat(q(*leaves)).sum(), wrt))
    ref_name = methods[0]
    for m in methods[1:]:
        for a, b in zip(results[ref_name], results[m]):
            err = float((a - b).abs().max()) if a.numel() else 0.0
            if err > atol:
                raise QdiffError(f"diff_method '{m}' differs from '{ref_name}' by {err:.3g}")
    return results
