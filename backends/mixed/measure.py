"""Measurements on a batch of density matrices ``rho`` ``(B, 2**n, 2**n)``, exact or by shots.

Observables act on the columns of ``rho`` as on a batch of state vectors (the statevector
engine's Pauli-sum kernels), so ``Tr(O rho)`` never builds a dense ``O``. Readout errors
(``readout``: a noise model's confusion matrices, see
:meth:`qdiff.circuits.noise.NoiseModel.readout_probs`) act on the outcomes:
``probs``, ``sample`` and ``counts``; ``expval``, ``var``, ``density_matrix`` and ``purity``
are of the state itself (as Aer's saved expectation values and its EstimatorV2 are).
"""
from __future__ import annotations

import string

import torch

from qdiff.backends.statevector.measure import apply_observable, marginal, shared_basis, \
    shared_basis_values, term_basis
from qdiff.backends.statevector.measure import sample_indices as _sample_indices
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.observables import Observable

_LETTERS = string.ascii_letters


def _columns(rho: torch.Tensor) -> torch.Tensor:
    """``(B*N, N)``: row ``(b, j)`` is column ``j`` of ``rho[b]``."""
    b, d, _ = rho.shape
    return rho.transpose(1, 2).reshape(b * d, d)


def _apply(rho: torch.Tensor, obs: Observable, n: int) -> torch.Tensor:
    """``O rho`` ``(B, N, N)``."""
    b, d, _ = rho.shape
    return apply_observable(_columns(rho), obs, n).reshape(b, d, d).transpose(1, 2)


def _trace(m: torch.Tensor) -> torch.Tensor:
    return m.diagonal(dim1=-2, dim2=-1).sum(-1).real


def expval(rho: torch.Tensor, obs: Observable, n: int) -> torch.Tensor:
    """``Tr(O rho)``: ``(B,)`` real."""
    return _trace(_apply(rho, obs, n))


def variance(rho: torch.Tensor, obs: Observable, n: int) -> torch.Tensor:
    """``Tr(O^2 rho) - Tr(O rho)^2``: ``(B,)`` real."""
    o_rho = _apply(rho, obs, n)
    mean = _trace(o_rho)
    return _trace(_apply(o_rho, obs, n)) - mean ** 2


def diagonal(rho: torch.Tensor) -> torch.Tensor:
    return rho.diagonal(dim1=-2, dim2=-1).real


def probs(rho: torch.Tensor, wires, n: int, readout=None) -> torch.Tensor:
    """Outcome probabilities of ``wires`` (all when ``None``): ``(B, 2**k)``."""
    wires = list(range(n)) if wires is None else list(wires)
    p = diagonal(rho)
    p = p if wires == list(range(n)) else marginal(p, wires, n)
    return readout.readout_probs(p, wires) if readout is not None else p


def reduced(rho: torch.Tensor, wires, n: int) -> torch.Tensor:
    """The reduced density matrix of ``wires`` (others traced out): ``(B, 2**k, 2**k)``."""
    wires = list(wires)
    if wires == list(range(n)):
        return rho
    b = rho.shape[0]
    rows = list(_LETTERS[1:n + 1])
    cols = [rows[w] if w not in wires else _LETTERS[n + 1 + w] for w in range(n)]
    out = "a" + "".join(rows[w] for w in wires) + "".join(cols[w] for w in wires)
    r = torch.einsum(f"a{''.join(rows)}{''.join(cols)}->{out}", rho.reshape(b, *([2] * 2 * n)))
    k = len(wires)
    return r.reshape(b, 2 ** k, 2 ** k)


def purity(rho: torch.Tensor, wires, n: int) -> torch.Tensor:
    """``Tr(rho_W^2)``: ``(B,)`` real."""
    r = reduced(rho, wires, n)
    return (r * r.transpose(1, 2)).sum((1, 2)).real


# ------------------------------------------------------------------------------------------
# shots


def _rotated(rho: torch.Tensor, term, n: int):
    """Outcome probabilities of ``term``'s wires in its eigenbasis, and its eigenvalues."""
    from qdiff.backends.mixed.simulate import apply_on
    ops, wires, eig = term_basis(term)
    b, d, _ = rho.shape
    vec = rho.reshape(b, d * d)
    for w, u in ops:
        u = u.to(device=rho.device, dtype=rho.dtype).reshape(1, *u.shape[-2:])
        vec = apply_on(vec, u, tuple(w), 2 * n)
        vec = apply_on(vec, u.conj(), tuple(n + x for x in w), 2 * n)
    r = vec.reshape(b, d, d)
    p = marginal(diagonal(r), wires, n) if wires else torch.ones(b, 1, dtype=rho.real.dtype,
                                                                 device=rho.device)
    return p, eig.to(device=rho.device, dtype=p.dtype)


class NotADistribution(QdiffError):
    """Outcome probabilities to draw shots from that are negative or NaN: the state is not a
    density matrix (a channel evaluated outside its parameter range)."""


def sample_indices(p: torch.Tensor, shots: int, generator, words: int = 3) -> torch.Tensor:
    """:func:`~qdiff.backends.statevector.measure.sample_indices` of probabilities ``p``
    checked first: negative entries (beyond rounding) or NaN are refused, never clipped."""
    if p.numel():
        low = float(p.detach().min()) if bool(torch.isfinite(p).all()) else float("nan")
        if not low >= -1e-9:
            raise NotADistribution(f"the outcome probabilities to sample are not a distribution "
                                   f"(smallest {low:.3g})")
    return _sample_indices(p, shots, generator, words)


def sampled_expval(rho, obs, n, shots, generator):
    total = torch.zeros(rho.shape[0], dtype=rho.real.dtype, device=rho.device)
    coeffs = obs.real_coeffs().to(device=rho.device, dtype=total.dtype)
    for c, term in zip(coeffs, obs.terms):
        p, eig = _rotated(rho, term, n)
        total = total + c * eig[sample_indices(p, shots, generator)].mean(-1)
    return total


def sampled_var(rho, obs, n, shots, generator):
    vals = sample_eigvals(rho, obs, n, shots, generator, what="var()")
    return vals.pow(2).mean(-1) - vals.mean(-1) ** 2


def sample_eigvals(rho, obs, n, shots, generator, readout=None, what: str = "sample(op)"):
    """``(B, shots)`` values of ``obs`` (one term, or terms commuting wire by wire): its wires
    are read out in the shared eigenbasis, through the readout errors of those wires."""
    basis = shared_basis(obs, what)
    p, _ = _rotated(rho, basis, n)
    wires = term_basis(basis)[1]
    if readout is not None and wires:
        p = readout.readout_probs(p, wires)
    return shared_basis_values(sample_indices(p, shots, generator), obs, basis, p.dtype)


def sample_bits(rho, wires, n, shots, generator, readout=None):
    """``(B, shots, k)`` int64 bits of ``wires`` (readout errors included)."""
    wires = list(range(n)) if wires is None else list(wires)
    k = len(wires)
    idx = sample_indices(probs(rho, wires, n, readout), shots, generator, words=k + 1)
    shifts = torch.arange(k - 1, -1, -1, device=idx.device)
    return (idx.unsqueeze(-1) >> shifts) & 1


def measure_all(rho, circuit, shots, generator, readout=None) -> list:
    """One tensor per measurement of ``circuit`` from the final ``rho``."""
    n = circuit.num_wires
    out = []
    for m in circuit.measurements:
        if m.kind == "expval":
            out.append(expval(rho, m.obs, n) if not shots else
                       sampled_expval(rho, m.obs, n, shots, generator))
        elif m.kind == "var":
            out.append(variance(rho, m.obs, n) if not shots else
                       sampled_var(rho, m.obs, n, shots, generator))
        elif m.kind == "probs":
            p = probs(rho, m.wires, n, readout)
            if shots:
                idx = sample_indices(p, shots, generator)
                p = torch.zeros_like(p).scatter_add_(
                    1, idx, torch.ones_like(idx, dtype=p.dtype)) / shots
            out.append(p)
        elif m.kind in ("density_matrix", "purity"):
            if shots:
                raise QdiffError(f"{m.kind}() is exact only; it is not available with shots")
            out.append(reduced(rho, m.wires, n) if m.kind == "density_matrix" else
                       purity(rho, m.wires, n))
        elif m.kind == "state":
            raise QdiffError("state() returns a state vector; the mixed device holds density "
                             "matrices: use density_matrix(wires)")
        elif m.kind in ("sample", "counts"):
            if not shots:
                raise QdiffError(f"{m.kind}() needs a device with shots (qd.device(..., shots=N))")
            out.append(sample_eigvals(rho, m.obs, n, shots, generator, readout)
                       if m.obs is not None
                       else sample_bits(rho, m.wires, n, shots, generator, readout))
        else:
            raise QdiffError(f"unknown measurement '{m.kind}'")
    return out
