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

from qdiff.backends.statevector.measure import apply_observable, marginal
from qdiff.backends.statevector.sampling import SAMPLED, ShotPlan, measure_shots
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


def rotated_probs(rho: torch.Tensor, ops, wires, n: int, readout=None) -> torch.Tensor:
    """Outcome probabilities ``(B, 2**k)`` of ``wires`` after the basis changes ``ops``
    (``(wires, matrix)`` pairs, :func:`~qdiff.backends.statevector.sampling.term_basis`),
    through ``readout``'s confusion matrices when given."""
    from qdiff.backends.mixed.simulate import apply_on
    b, d, _ = rho.shape
    vec = rho.reshape(b, d * d)
    for w, u in ops:
        u = u.to(device=rho.device, dtype=rho.dtype).reshape(1, *u.shape[-2:])
        vec = apply_on(vec, u, tuple(w), 2 * n)
        vec = apply_on(vec, u.conj(), tuple(n + x for x in w), 2 * n)
    p = marginal(diagonal(vec.reshape(b, d, d)), wires, n)
    return readout.readout_probs(p, wires) if readout is not None else p


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


def has_readout(noise) -> bool:
    """Whether the noise model ``noise`` (or None) has readout errors."""
    return noise is not None and (bool(noise.readout) or noise.readout_default is not None)


def measure_all(rho, circuit, shots, generator, readout=None) -> list:
    """One tensor per measurement of ``circuit`` from the final ``rho``; with ``shots``,
    every sampled measurement from its basis group's one draw (the readout errors' outcomes,
    of probs/sample/counts, drawn apart from expval/var's)."""
    n = circuit.num_wires
    out = []
    sampled = None
    for i, m in enumerate(circuit.measurements):
        if shots and m.kind in SAMPLED:
            if sampled is None:
                ro = readout if has_readout(readout) else None
                plan = ShotPlan(rho.shape[0], shots, generator,
                                lambda ops, wires, errs: rotated_probs(
                                    rho, ops, wires, n, ro if errs else None),
                                sample_indices, rho.real.dtype, rho.device)
                sampled = measure_shots(plan, circuit.measurements, n, ro is not None)
            out.append(sampled[i])
        elif m.kind == "expval":
            out.append(expval(rho, m.obs, n))
        elif m.kind == "var":
            out.append(variance(rho, m.obs, n))
        elif m.kind == "probs":
            out.append(probs(rho, m.wires, n, readout))
        elif m.kind in ("density_matrix", "purity"):
            if shots:
                raise QdiffError(f"{m.kind}() is exact only; it is not available with shots")
            out.append(reduced(rho, m.wires, n) if m.kind == "density_matrix" else
                       purity(rho, m.wires, n))
        elif m.kind == "state":
            raise QdiffError("state() returns a state vector; the mixed device holds density "
                             "matrices: use density_matrix(wires)")
        elif m.kind in ("sample", "counts"):
            raise QdiffError(f"{m.kind}() needs a device with shots (qd.device(..., shots=N))")
        else:
            raise QdiffError(f"unknown measurement '{m.kind}'")
    return out
