"""Read measurements off a batch of final states, exactly or by sampling shots.

Pauli-sum expectations never build a 2**n x 2**n matrix: the terms are grouped by their X/Y
flip mask; for each group ``w(x) = conj(psi(x)) * psi(x ^ mask)`` is formed once and each term
is a signed sum of ``w`` marginalised onto its Z/Y wires.
"""
from __future__ import annotations

import torch

from qdiff.circuits import caches
from qdiff.backends.statevector import kernels, native, pauli_sum, zwords
from qdiff.backends.statevector.apply import apply_gate
from qdiff.circuits import memory
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.gates import GATES
from qdiff.circuits.measurements import sample_indices  # noqa: F401  (the engines' sampler)
from qdiff.circuits.observables import Observable
from qdiff.backends.statevector.sampling import SAMPLED, ShotPlan, measure_shots


def _axes(state, n):
    return state.view(state.shape[0], *([2] * n))


def marginal(w: torch.Tensor, wires, n: int) -> torch.Tensor:
    """Sum ``w`` ``(B, 2**n)`` over every wire not in ``wires``; result ``(B, 2**k)`` in ``wires`` order.

    Runs of dropped wires are merged into one axis first, so the reduction has at most k+1 axes
    (a sum over 19 separate size-2 axes is several times slower).
    """
    wires = list(wires)
    kept = sorted(wires)
    shape, drop, prev = [w.shape[0]], [], -1
    for k in kept:
        shape.append(2 ** (k - prev - 1))
        drop.append(len(shape) - 1)
        shape.append(2)
        prev = k
    shape.append(2 ** (n - 1 - prev))
    drop.append(len(shape) - 1)
    t = w.reshape(shape).sum(dim=drop)
    if kept != wires:
        t = t.permute(0, *[1 + kept.index(x) for x in wires])
    return t.reshape(w.shape[0], 2 ** len(wires))


_SIGN_CACHE: dict = caches.register("statevector.parity_signs", {})


def _parity_signs(k: int, device, dtype) -> torch.Tensor:
    """``(-1)**popcount(x)`` for ``x`` in ``range(2**k)``."""
    def build():
        s = torch.ones(1, dtype=dtype, device=device)
        for _ in range(k):
            s = torch.cat([s, -s])
        return s
    return caches.fetch(_SIGN_CACHE, (k, str(device), dtype), build)


def pauli_term_values(state: torch.Tensor, words, n: int) -> torch.Tensor:
    """``<psi|P_t|psi>`` for Pauli words ``words`` (each ``{wire: letter}``): ``(B, T)`` real."""
    groups: dict = {}
    for t, word in enumerate(words):
        mask = tuple(sorted(w for w, l in word.items() if l in "XY"))
        groups.setdefault(mask, []).append(t)
    b = state.shape[0]
    out = [None] * len(words)
    for mask, terms in groups.items():
        if mask:
            flipped = _axes(state, n).flip([1 + w for w in mask]).reshape(state.shape)
            wv = state.conj() * flipped
        else:
            wv = native.abs2(state)
        for t in terms:
            word = words[t]
            zy = sorted(w for w, l in word.items() if l in "ZY")
            n_y = sum(1 for l in word.values() if l == "Y")
            if zy:
                val = (marginal(wv, zy, n) * _parity_signs(len(zy), state.device, wv.dtype)).sum(-1)
            else:
                val = wv.sum(-1)
            if val.is_complex():
                val = (val * (-1j) ** n_y).real
            out[t] = val
    return torch.stack(out, dim=-1) if out else torch.zeros(b, 0, dtype=state.real.dtype,
                                                            device=state.device)


def apply_term(state: torch.Tensor, term: tuple, n: int) -> torch.Tensor:
    """``F psi`` for one tensor-product term (new tensor)."""
    out = state
    for f in term:
        if f.kind == "M":
            u = kernels.as_batch_matrix(f.matrix.to(state.device), state.dtype)
            out = kernels.apply_matrix(out, u, f.wires, n) if len(f.wires) > 1 else \
                kernels.apply_one_qubit(out, u, f.wires[0], n)
        else:
            out = apply_gate(out, GATES[f.kind.lower()], f.wires, [], n)
    return out


def apply_observable(state: torch.Tensor, obs: Observable, n: int) -> torch.Tensor:
    """``O psi`` ``(B, 2**n)`` without a dense matrix (Pauli sums of many terms by flip-mask
    groups, :mod:`qdiff.backends.statevector.pauli_sum`; otherwise term by term)."""
    if pauli_sum.usable(obs):
        return pauli_sum.apply_pauli_sum(state, obs, n)
    coeffs = obs.coeffs.to(state.device)
    total = None
    for i, term in enumerate(obs.terms):
        part = apply_term(state, term, n) * coeffs[i].to(state.dtype)
        total = part if total is None else total + part
    return total if total is not None else torch.zeros_like(state)


def term_values(state: torch.Tensor, obs: Observable, n: int) -> torch.Tensor:
    """``<psi|F_t|psi>`` for every term of ``obs``: ``(B, T)`` real."""
    if obs.is_pauli:
        return pauli_term_values(state, obs.pauli_words(), n)
    cols = []
    for term in obs.terms:
        if all(f.kind != "M" for f in term):
            cols.append(pauli_term_values(state, [{f.wires[0]: f.kind for f in term}], n)[:, 0])
        else:
            cols.append((state.conj() * apply_term(state, term, n)).sum(-1).real)
    return torch.stack(cols, dim=-1)


def expval(state: torch.Tensor, obs: Observable, n: int) -> torch.Tensor:
    """``<psi|O|psi>``: ``(B,)`` real."""
    if pauli_sum.usable(obs):
        return pauli_sum.pauli_sum_expval(state, obs, n)
    vals = term_values(state, obs, n)
    c = obs.real_coeffs().to(device=vals.device, dtype=vals.dtype)
    return vals @ c


def variance(state: torch.Tensor, obs: Observable, n: int) -> torch.Tensor:
    """``<O^2> - <O>^2``: ``(B,)`` real."""
    phi = apply_observable(state, obs, n)
    mean = (state.conj() * phi).sum(-1).real
    sq = (phi.real ** 2 + phi.imag ** 2).sum(-1)
    return sq - mean ** 2


def probs(state: torch.Tensor, wires, n: int) -> torch.Tensor:
    p = native.abs2(state)
    return p if wires is None or list(wires) == list(range(n)) else marginal(p, wires, n)


def reduced_density_matrix(state: torch.Tensor, wires, n: int) -> torch.Tensor:
    """``(B, 2**k, 2**k)``: ``Tr_rest |psi><psi|`` with rows in ``wires`` order."""
    wires = list(wires)
    rest = [w for w in range(n) if w not in wires]
    memory.require(float(state.shape[0]) * 4 ** len(wires) * state.element_size(),
                   f"density matrices of {len(wires)} wire(s)", state.device)
    a = _axes(state, n).permute(0, *[1 + w for w in wires + rest])
    a = a.reshape(state.shape[0], 2 ** len(wires), 2 ** len(rest))
    return a @ a.conj().transpose(-1, -2)


# ------------------------------------------------------------------------------------------
# shots (one draw per basis group: :mod:`qdiff.backends.statevector.sampling`)


def rotated_probs(state: torch.Tensor, ops, wires, n: int) -> torch.Tensor:
    """Outcome probabilities ``(B, 2**k)`` of ``wires`` after the basis changes ``ops``
    (``(wires, matrix)`` pairs, :func:`~qdiff.backends.statevector.sampling.term_basis`)."""
    s = state
    for w, u in ops:
        u = kernels.as_batch_matrix(u.to(state.device), state.dtype)
        s = kernels.apply_matrix(s, u, w, n) if len(w) > 1 else kernels.apply_one_qubit(s, u, w[0], n)
    return probs(s, wires, n)


def purity(rho: torch.Tensor) -> torch.Tensor:
    """``Tr(rho**2)`` of ``(B, d, d)`` density matrices: ``(B,)`` real."""
    return (rho * rho.transpose(1, 2)).sum((1, 2)).real


def measure_all(state, circuit, shots, generator) -> list:
    """One tensor per measurement of ``circuit`` from the final ``state`` ``(B, 2**n)``; with
    ``shots``, every sampled measurement from its basis group's one draw."""
    n = circuit.num_wires
    out = []
    joint = {} if shots else zwords.joint_z_expvals(state, circuit)
    sampled = None
    for i, m in enumerate(circuit.measurements):
        if i in joint:
            out.append(joint[i])
        elif shots and m.kind in SAMPLED:
            if sampled is None:
                plan = ShotPlan(state.shape[0], shots, generator,
                                lambda ops, wires, _: rotated_probs(state, ops, wires, n),
                                sample_indices, state.real.dtype, state.device)
                sampled = measure_shots(plan, circuit.measurements, n)
            out.append(sampled[i])
        elif m.kind == "expval":
            out.append(expval(state, m.obs, n))
        elif m.kind == "var":
            out.append(variance(state, m.obs, n))
        elif m.kind == "probs":
            out.append(probs(state, m.wires, n))
        elif m.kind in ("density_matrix", "purity"):
            if shots:
                raise QdiffError(f"{m.kind}() is exact only; it is not available with shots")
            rho = reduced_density_matrix(state, m.wires, n)
            out.append(rho if m.kind == "density_matrix" else purity(rho))
        elif m.kind == "state":
            if shots:
                raise QdiffError("state() is not available with shots")
            out.append(state)
        elif m.kind in ("sample", "counts"):
            raise QdiffError(f"{m.kind}() needs a device with shots (qd.device(..., shots=N))")
        else:  # pragma: no cover - Measurement kinds are fixed
            raise QdiffError(f"unknown measurement '{m.kind}'")
    return out
