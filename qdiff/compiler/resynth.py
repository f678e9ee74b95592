"""Differentiable re-synthesis: fit a CX template's one-qubit angles to a target unitary.

A template on ``k`` qubits is a parameterized qdiff :class:`Circuit`: a layer of U3 gates, then
for each CX ``(a, b)`` of its structure that CX and U3 gates on ``a`` and ``b`` (``3k + 6m``
angles, ``ParamRef`` columns of theta). Its unitary and the Jacobian of the residual
``V(theta) e^{-i phi} - U`` come from ``qdiff.circuits.unitary`` (the gates' own torch matrix
functions; each gate's derivative by torch forward-mode autodiff, chained through the circuit by
the adjoint prefix/suffix sweep).
Levenberg-Marquardt on those derivatives runs from several starts at once and converges
quadratically to machine precision when the structure can hold ``U``.

A fit is accepted when its phase-aligned distance ``min_phi ||V - e^{i phi} U||_F / sqrt(d)``
is at most ``accept`` (exact compilation: 1e-11, i.e. rounding), confirmed by an independent
numpy product of the emitted gates.

>>> import numpy as np
>>> cx = np.eye(4)[[0, 1, 3, 2]].astype(complex)
>>> res = fit(cx @ np.kron(np.eye(2), [[0, 1], [1, 0]]), [(0, 1)], (5, 7), starts=4)
>>> [o.name for o in res.ops].count("cx"), res.delta < 1e-11
(1, True)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from qdiff.circuits import caches
from qdiff.circuits.circuit import Circuit
from qdiff.circuits.operation import Operation, ParamRef
from qdiff.circuits.unitary import unitary, unitary_jacobian
from qdiff.compiler.blocks import block_unitary
from qdiff.compiler.budget import EXACT_DELTA, phase_distance
from qdiff.compiler.ops import op
from qdiff.circuits.gates import GATES


@dataclass
class Fit:
    """``ops`` (None: no start reached ``accept``), the fitted angles ``x`` ``(3k + 6m,)``, the
    best distance reached, and the LM iterations spent (the work unit of the search)."""

    ops: list | None
    x: torch.Tensor | None
    delta: float
    work: int


def _u3(q: int, j: int) -> Operation:
    return Operation(GATES["u3"], (q,), (ParamRef(j), ParamRef(j + 1), ParamRef(j + 2)))


@caches.cached(maxsize=4096)
def template(pairs: tuple, k: int) -> Circuit:
    """The parameterized template circuit of a CX structure ``pairs`` on ``k`` qubits."""
    ops = [_u3(q, 3 * q) for q in range(k)]
    for i, (a, b) in enumerate(pairs):
        j = 3 * k + 6 * i
        ops += [Operation(GATES["cx"], (a, b)), _u3(a, j), _u3(b, j + 3)]
    return Circuit(k, tuple(ops), num_params=3 * k + 6 * len(pairs))


def num_angles(pairs, k: int) -> int:
    return 3 * k + 6 * len(pairs)


class Residual:
    """``r(x) = V(theta) e^{-i phi} - U`` as real vectors ``(S, 2 d^2)`` for ``x = (theta, phi)``
    ``(S, P + 1)``, and its Jacobian ``(S, 2 d^2, P + 1)`` from ``unitary_jacobian``."""

    def __init__(self, tmpl: Circuit, tgt: torch.Tensor):
        self.tmpl, self.tgt = tmpl, tgt

    def _phase(self, x):
        return torch.polar(torch.ones_like(x[:, -1]), -x[:, -1])[:, None, None]

    def __call__(self, x):
        v = unitary(self.tmpl, x[:, :-1]) * self._phase(x)
        return _real((v - self.tgt).reshape(x.shape[0], -1))

    def jacobian(self, x):
        s = x.shape[0]
        v, dv = unitary_jacobian(self.tmpl, x[:, :-1])
        ph = self._phase(x)
        r = _real((v * ph - self.tgt).reshape(s, -1))
        j = torch.cat([dv * ph[..., None], (-1j * v * ph)[..., None]], -1)
        return r, _real(j.reshape(s, -1, x.shape[1]), dim=1)


def _real(z: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return torch.cat([z.real, z.imag], dim)


def levenberg_marquardt(residual, x: torch.Tensor, iters: int, stop: float,
                        give_up: int = 10):
    """Batched LM on ``residual`` (a :class:`Residual`) from starts ``x`` ``(S, P)``;
    returns ``(x, cost (S,), iterations)`` with ``cost = |r|^2``."""
    r, jac = residual.jacobian(x)
    cost = (r ** 2).sum(-1)
    lam = torch.full((x.shape[0],), 1e-3, dtype=x.dtype)
    eye = torch.eye(x.shape[1], dtype=x.dtype)
    it = 0
    for it in range(1, iters + 1):
        a = jac.transpose(1, 2) @ jac
        grad = (jac.transpose(1, 2) @ r[..., None])[..., 0]
        damp = lam[:, None, None] * (torch.diag_embed(torch.diagonal(a, dim1=1, dim2=2)) + eye)
        step = torch.linalg.solve(a + damp, -grad)
        with torch.no_grad():
            cn = (residual(x + step) ** 2).sum(-1)
        ok = cn < cost
        x = torch.where(ok[:, None], x + step, x)
        cost = torch.where(ok, cn, cost)
        if float(cost.min()) < stop or (it >= give_up and float(cost.min()) > 1e-3 * x.shape[1]):
            break
        if bool(ok.any()):
            r, jac = residual.jacobian(x)
        lam = torch.where(ok, lam / 3, lam * 4).clamp(1e-15, 1e8)
    return x, cost, it


def fit(target: np.ndarray, pairs, wires, starts=8, iters: int = 60,
        accept: float = EXACT_DELTA, seed: int = 0) -> Fit:
    """Fit the template ``pairs`` (local qubit indices) on ``wires`` to ``target``.

    ``starts``: a number of random starts, or a tensor ``(S, 3k + 6m)`` of warm starts."""
    k, pairs = len(wires), tuple(tuple(p) for p in pairs)
    d = 2 ** k
    tgt = torch.as_tensor(np.ascontiguousarray(target), dtype=torch.complex128)
    if isinstance(starts, int):
        g = torch.Generator().manual_seed(seed)
        starts = (torch.rand(starts, num_angles(pairs, k), generator=g,
                             dtype=torch.float64) * 2 - 1) * math.pi
    x0 = torch.cat([starts, torch.zeros(starts.shape[0], 1, dtype=torch.float64)], 1)
    x0[:, -1] = _best_phase(template(pairs, k), starts, tgt)
    # cost = d * delta^2 at the optimal phase: stop well below the acceptance
    x, cost, work = levenberg_marquardt(Residual(template(pairs, k), tgt), x0, iters,
                                        stop=d * (accept * 1e-2) ** 2)
    i = int(torch.argmin(cost))
    best = math.sqrt(float(cost[i]) / d)
    if best <= accept:
        ops = to_ops(x[i, :-1].numpy(), pairs, wires)
        true = phase_distance(block_unitary(ops, wires), target)
        if true <= accept:
            return Fit(ops, x[i, :-1].clone(), true, work * x.shape[0])
    return Fit(None, None, best, work * x.shape[0])


def _best_phase(tmpl: Circuit, starts: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """The global phase minimizing the residual at each start: ``arg Tr(U^dag V)``."""
    with torch.no_grad():
        v = unitary(tmpl, starts)
        return torch.angle(torch.einsum("ij,sij->s", tgt.conj(), v))


def to_ops(x: np.ndarray, pairs, wires) -> list:
    """The template bound at angles ``x`` as constant ops on ``wires``."""
    k = len(wires)
    ang = np.asarray(x).reshape(-1, 3)
    out = [op("u3", (wires[q],), tuple(float(a) for a in ang[q])) for q in range(k)]
    for i, (a, b) in enumerate(pairs):
        out.append(op("cx", (wires[a], wires[b])))
        out.append(op("u3", (wires[a],), tuple(float(t) for t in ang[k + 2 * i])))
        out.append(op("u3", (wires[b],), tuple(float(t) for t in ang[k + 2 * i + 1])))
    return out
