"""Differentiable re-synthesis: fit a CX template's one-qubit angles to a target unitary.

A template on ``k`` qubits is a layer of U3 gates followed, for each CX ``(a, b)`` of its
structure, by that CX and U3 gates on ``a`` and ``b``. Its ``3k + 6m`` angles are fitted by torch
autograd: Adam on ``1 - |Tr(U^dag V(theta))|^2 / d^2`` from many random starts at once (one
batched tensor), then L-BFGS polishes the best starts on ``1 - |Tr(U^dag V)| / d`` to machine
precision. A fit counts only below ``ACCEPT`` (1e-10) and after an independent numpy check.

>>> import numpy as np
>>> cx = np.eye(4)[[0, 1, 3, 2]].astype(complex)
>>> ops, infid = fit(cx @ np.kron(np.eye(2), [[0, 1], [1, 0]]), [(0, 1)], (5, 7))
>>> [o.name for o in ops].count("cx"), infid < 1e-10
(1, True)
"""
from __future__ import annotations


import numpy as np
import torch

from qdiff.circuits import caches
from qdiff.compiler.blocks import block_unitary
from qdiff.compiler.ops import op

ACCEPT = 1e-10


def u3_batch(t: torch.Tensor) -> torch.Tensor:
    """``(..., 3)`` angles -> ``(..., 2, 2)`` U3 matrices (complex128)."""
    th, ph, lam = t[..., 0], t[..., 1], t[..., 2]
    c, s = torch.cos(th / 2).to(torch.complex128), torch.sin(th / 2).to(torch.complex128)
    eph, elam = torch.polar(torch.ones_like(ph), ph), torch.polar(torch.ones_like(lam), lam)
    row0 = torch.stack([c, -elam * s], -1)
    row1 = torch.stack([eph * s, eph * elam * c], -1)
    return torch.stack([row0, row1], -2)


@caches.cached(maxsize=64)
def _cx_perm(k: int, a: int, b: int) -> torch.Tensor:
    idx = np.arange(2 ** k)
    ctrl = (idx >> (k - 1 - a)) & 1
    return torch.as_tensor(idx ^ (ctrl << (k - 1 - b)))


def template_unitary(params: torch.Tensor, pairs, k: int) -> torch.Tensor:
    """``(S, P)`` angles -> ``(S, d, d)`` template unitaries."""
    s, d = params.shape[0], 2 ** k
    v = torch.eye(d, dtype=torch.complex128).expand(s, d, d)
    u = u3_batch(params.reshape(s, -1, 3))
    for q in range(k):
        v = _apply1(v, u[:, q], q, k)
    for i, (a, b) in enumerate(pairs):
        v = v[:, _cx_perm(k, a, b), :]
        v = _apply1(v, u[:, k + 2 * i], a, k)
        v = _apply1(v, u[:, k + 2 * i + 1], b, k)
    return v


def _apply1(v: torch.Tensor, g: torch.Tensor, q: int, k: int) -> torch.Tensor:
    s, d = v.shape[0], v.shape[-1]
    vv = v.reshape(s, 2 ** q, 2, 2 ** (k - q - 1), d)
    return torch.einsum("sij,sajbd->saibd", g, vv).reshape(s, d, d)


def _overlap(target_h: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.einsum("ji,sij->s", target_h, v).abs() / v.shape[-1]


def fit(target: np.ndarray, pairs, wires, starts: int = 8, adam_steps: int = 60,
        lm_iters: int = 80, seed: int = 0):
    """Fit the template ``pairs`` (local qubit indices) to ``target``; ``(ops|None, 1-F)``."""
    k = len(wires)
    pairs = list(pairs)
    tgt = torch.as_tensor(np.ascontiguousarray(target))
    tgt_h = tgt.conj().T
    g = torch.Generator().manual_seed(seed)
    n_par = 3 * k + 6 * len(pairs)
    x = (torch.rand(starts, n_par, generator=g, dtype=torch.float64) * 2 - 1) * np.pi
    x.requires_grad_(True)
    opt = torch.optim.Adam([x], lr=0.1)
    for _ in range(adam_steps):  # gradient descent on the fidelity from every start at once
        opt.zero_grad()
        loss = 1.0 - _overlap(tgt_h, template_unitary(x, pairs, k))
        loss.sum().backward()
        opt.step()
    x = x.detach()
    x, infid = _levenberg_marquardt(x, tgt, pairs, k, lm_iters)
    for i in torch.argsort(infid)[:2].tolist():
        if float(infid[i]) < ACCEPT:
            ops = to_ops(x[i, :-1].numpy(), pairs, wires)
            true = 1.0 - abs(np.trace(target.conj().T @ block_unitary(ops, wires))) / 2 ** k
            if true < ACCEPT:
                return ops, float(true)
    return None, float(infid.min())


def fit_from(target: np.ndarray, pairs, wires, x0: torch.Tensor, lm_iters: int = 30):
    """Polish given starts ``x0`` ``(S, 3k + 6m)`` (warm starts) on ``pairs``."""
    k = len(wires)
    tgt = torch.as_tensor(np.ascontiguousarray(target))
    x, infid = _levenberg_marquardt(x0.clone(), tgt, list(pairs), k, lm_iters, give_up=10)
    i = int(torch.argmin(infid))
    if float(infid[i]) < ACCEPT:
        ops = to_ops(x[i, :-1].numpy(), pairs, wires)
        true = 1.0 - abs(np.trace(target.conj().T @ block_unitary(ops, wires))) / 2 ** k
        if true < ACCEPT:
            return ops, x[i, :-1].clone(), float(true)
    return None, None, float(infid.min())


def _levenberg_marquardt(x, tgt, pairs, k, iters, give_up: int = 25):
    """Polish every start on the residual ``V(x) e^{-i phi} - U`` (analytic Jacobian)."""
    d = 2 ** k
    s = x.shape[0]
    with torch.no_grad():
        v = template_unitary(x, pairs, k)
        phi = torch.angle(torch.einsum("ij,sij->s", tgt.conj(), v))
    x = torch.cat([x, phi[:, None]], 1)
    r, jac = _residual_and_jacobian(x, tgt, pairs, k)
    cost = (r ** 2).sum(-1)
    lam = torch.full((s,), 1e-3, dtype=torch.float64)
    eye = torch.eye(x.shape[1], dtype=torch.float64)
    for it in range(iters):
        a = jac.transpose(1, 2) @ jac
        grad = (jac.transpose(1, 2) @ r[..., None])[..., 0]
        damp = lam[:, None, None] * (torch.diag_embed(torch.diagonal(a, dim1=1, dim2=2)) + eye)
        step = torch.linalg.solve(a + damp, -grad)
        rn = _residual(x + step, tgt, pairs, k)
        cn = (rn ** 2).sum(-1)
        ok = cn < cost
        x = torch.where(ok[:, None], x + step, x)
        cost = torch.where(ok, cn, cost)
        if bool(ok.any()):
            r, jac = _residual_and_jacobian(x, tgt, pairs, k)
        lam = torch.where(ok, lam / 3, lam * 4).clamp(1e-12, 1e8)
        best = float(cost.min()) / (2 * d)
        if best < 1e-15 or (it == give_up and best > 1e-4):
            break
    return x, cost / (2 * d)  # |r|^2 = 2d (1 - |Tr(U^dag V)| / d) at the optimal phase


def _residual(x, tgt, pairs, k):
    v = template_unitary(x[:, :-1], pairs, k)
    res = (v * torch.polar(torch.ones_like(x[:, -1]), -x[:, -1])[:, None, None] - tgt)
    res = res.reshape(x.shape[0], -1)
    return torch.cat([res.real, res.imag], -1)


def _embed(u: torch.Tensor, q: int, k: int) -> torch.Tensor:
    """``(..., 2, 2)`` on qubit ``q`` -> ``(..., d, d)``."""
    a, b = 2 ** q, 2 ** (k - q - 1)
    ea, eb = torch.eye(a, dtype=u.dtype), torch.eye(b, dtype=u.dtype)
    full = torch.einsum("ac,...ij,bd->...aibcjd", ea, u, eb)
    return full.reshape(*u.shape[:-2], 2 ** k, 2 ** k)


def _u3_derivatives(t: torch.Tensor) -> torch.Tensor:
    """``(S, 3)`` -> ``(S, 3, 2, 2)``: d U3 / d(theta, phi, lam)."""
    th, ph, lam = t[:, 0], t[:, 1], t[:, 2]
    c, s = torch.cos(th / 2).to(torch.complex128), torch.sin(th / 2).to(torch.complex128)
    eph, elam = torch.polar(torch.ones_like(ph), ph), torch.polar(torch.ones_like(lam), lam)
    z = torch.zeros_like(c)
    dth = torch.stack([torch.stack([-s / 2, -elam * c / 2], -1),
                       torch.stack([eph * c / 2, -eph * elam * s / 2], -1)], -2)
    dph = torch.stack([torch.stack([z, z], -1), torch.stack([1j * eph * s, 1j * eph * elam * c], -1)], -2)
    dlam = torch.stack([torch.stack([z, -1j * elam * s], -1),
                        torch.stack([z, 1j * eph * elam * c], -1)], -2)
    return torch.stack([dth, dph, dlam], 1)


def _residual_and_jacobian(x, tgt, pairs, k):
    """Residuals ``(S, 2 d^2)`` and their Jacobian ``(S, 2 d^2, P + 1)`` (last: the phase)."""
    s, d = x.shape[0], 2 ** k
    ang = x[:, :-1].reshape(s, -1, 3)
    qubits = list(range(k)) + [q for a, b in pairs for q in (a, b)]
    gates, which = [], []  # embedded gate matrices in time order; u3 index or -1 for CX
    n1 = 0
    for i in range(len(qubits)):
        if i >= k and (i - k) % 2 == 0:
            a, b = pairs[(i - k) // 2]
            perm = _cx_perm(k, a, b)
            gates.append(torch.eye(d, dtype=torch.complex128)[perm].expand(s, d, d))
            which.append(-1)
        gates.append(_embed(u3_batch(ang[:, i]), qubits[i], k))
        which.append(i)
    pre = [torch.eye(d, dtype=torch.complex128).expand(s, d, d)]
    for gm in gates:
        pre.append(gm @ pre[-1])
    v = pre[-1]
    post = [None] * len(gates)
    acc = torch.eye(d, dtype=torch.complex128).expand(s, d, d)
    for j in range(len(gates) - 1, -1, -1):
        post[j] = acc
        acc = acc @ gates[j]
    ph = torch.polar(torch.ones_like(x[:, -1]), -x[:, -1])[:, None, None]
    cols = []
    for j, i in enumerate(which):
        if i < 0:
            continue
        du = _embed(_u3_derivatives(ang[:, i]), qubits[i], k)  # (S, 3, d, d)
        cols.append(post[j][:, None] @ du @ pre[j][:, None])
    dv = torch.cat(cols, 1) * ph[:, None]  # (S, P, d, d)
    dphi = (-1j * v * ph)[:, None]
    dall = torch.cat([dv, dphi], 1).reshape(s, -1, d * d)
    res = (v * ph - tgt).reshape(s, d * d)
    r = torch.cat([res.real, res.imag], -1)
    jac = torch.cat([dall.real, dall.imag], -1).transpose(1, 2)
    return r, jac


def to_ops(x: np.ndarray, pairs, wires) -> list:
    k = len(wires)
    ang = x.reshape(-1, 3)
    out = [op("u3", (wires[q],), tuple(float(a) for a in ang[q])) for q in range(k)]
    for i, (a, b) in enumerate(pairs):
        out.append(op("cx", (wires[a], wires[b])))
        out.append(op("u3", (wires[a],), tuple(float(t) for t in ang[k + 2 * i])))
        out.append(op("u3", (wires[b],), tuple(float(t) for t in ang[k + 2 * i + 1])))
    return out
