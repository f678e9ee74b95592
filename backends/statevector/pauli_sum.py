"""Pauli sums applied to state batches by flip-mask groups (the backends' copy of the kernel).

A Pauli word acts on a basis state as a bit flip times a sign and a power of ``i``:
``P|b> = i**n_y (-1)**popcount(b & zy) |b ^ x>`` (``x``: X/Y wires, ``zy``: Z/Y wires; wire 0 is
the most significant bit). Terms sharing a flip mask ``m`` add up to one diagonal ``D_m`` and

    (H psi)[y] = sum_m D_m[y] psi[y ^ m],   D_m = WHT(coefficients scattered at their zy masks)

so a Hamiltonian of ``T`` terms in ``G`` flip groups costs ``G`` gathers and multiply-adds of the
state instead of ``T`` term-by-term passes of one gate per factor (BeH2 in 12 qubits: 327 terms,
far fewer groups). :mod:`qdiff.operators` (``PauliSumOperator``: CSR/dense conversion, batched
expectations for the solvers) builds on the same Walsh-Hadamard transform from this module.

The group structure of an observable is cached by its Pauli words (a qnode records a new
``Observable`` object each call, with the same words), and its diagonals by the coefficient
values, while the coefficients do not require grad; with grad, everything is rebuilt by
differentiable torch ops (gradients reach the state and the coefficients).
"""
from __future__ import annotations

from collections import OrderedDict

import torch

# cached diagonals and gather indices, in bytes over all observables
_CACHE_BYTES = 1 << 28
# below this many terms the term-by-term path is as fast and needs no set-up
MIN_TERMS = 6


def _hadamard(bits: int, dtype, device) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=dtype, device=device)
    h1 = torch.tensor([[1, 1], [1, -1]], dtype=dtype, device=device)
    for _ in range(bits):
        h = torch.kron(h, h1)
    return h


def walsh_hadamard(x: torch.Tensor, chunk: int = 5) -> torch.Tensor:
    """Unnormalized Walsh-Hadamard transform along the last axis of ``x`` ``(..., 2**n)``."""
    size = x.shape[-1]
    n = size.bit_length() - 1
    lead = x.shape[:-1]
    k = 0
    while k < n:
        c = min(chunk, n - k)
        v = x.reshape(-1, 1 << c, 1 << k)
        x = torch.einsum("ij,ajb->aib", _hadamard(c, x.dtype, x.device), v).reshape(*lead, size)
        k += c
    return x


class PauliGroups:
    """Flip-mask grouping of Pauli words on ``n`` qubits (no coefficients).

    ``masks`` ``[G]`` (the diagonal group, mask 0, first when present); per term, in group order:
    ``order`` (original term index), ``flat_pos = group * 2**n + zy`` and ``phase`` (the
    ``y``-independent part ``i**n_y (-1)**popcount(m & zy)``).
    """

    def __init__(self, words, n: int):
        self.n = n
        groups: dict = {}
        info = []
        for t, word in enumerate(words):
            x = zy = ny = 0
            for w, letter in word.items():
                bit = 1 << (n - 1 - w)
                x |= bit if letter in "XY" else 0
                zy |= bit if letter in "ZY" else 0
                ny += letter == "Y"
            info.append((x, zy, ny))
            groups.setdefault(x, []).append(t)
        self.masks = sorted(groups, key=lambda m: (m != 0, m))
        order, pos, phase = [], [], []
        for g, m in enumerate(self.masks):
            for t in groups[m]:
                x, zy, ny = info[t]
                order.append(t)
                pos.append(g * (1 << n) + zy)
                phase.append((1j) ** ny * (-1) ** (bin(m & zy).count("1") & 1))
        self.order = torch.tensor(order, dtype=torch.long)
        self.flat_pos = torch.tensor(pos, dtype=torch.long)
        self.phase = torch.tensor(phase, dtype=torch.complex128)
        self.real = all(abs(p.imag) < 0.5 for p in phase)
        self._index: dict = {}

    def diagonals(self, coeffs: torch.Tensor, rdtype: torch.dtype) -> torch.Tensor:
        """``D`` ``(G, 2**n)`` (real when every term has an even number of Y and real
        coefficients, else complex); differentiable w.r.t. ``coeffs`` ``(T,)``."""
        dev = coeffs.device
        cdtype = torch.complex64 if rdtype == torch.float32 else torch.complex128
        vals = coeffs[self.order.to(dev)].to(cdtype) * self.phase.to(dev, cdtype)
        if self.real and not coeffs.is_complex():
            vals = vals.real
        flat = torch.zeros(len(self.masks) << self.n, dtype=vals.dtype, device=dev)
        flat = flat.index_add(0, self.flat_pos.to(dev), vals)
        return walsh_hadamard(flat.reshape(len(self.masks), 1 << self.n))

    def gather_index(self, g: int, device) -> torch.Tensor:
        key = (g, str(device))
        idx = self._index.get(key)
        if idx is None:
            idx = torch.arange(1 << self.n, device=device) ^ self.masks[g]
            self._index[key] = idx
        return idx


_GROUPS: "OrderedDict[tuple, PauliGroups]" = OrderedDict()
_DIAGS: "OrderedDict[tuple, tuple]" = OrderedDict()


def _words_key(obs, n: int) -> tuple:
    return (n, tuple(tuple((f.wires[0], f.kind) for f in t) for t in obs.terms))


def groups_of(obs, n: int) -> PauliGroups:
    """The (cached) :class:`PauliGroups` of a Pauli-sum observable on ``n`` wires."""
    key = _words_key(obs, n)
    g = _GROUPS.get(key)
    if g is None:
        g = PauliGroups(obs.pauli_words(), n)
        _GROUPS[key] = g
        while len(_GROUPS) > 32:
            _GROUPS.popitem(last=False)
    else:
        _GROUPS.move_to_end(key)
    return g


def diagonals_of(obs, n: int, dtype: torch.dtype, device) -> tuple:
    """``(groups, D (G, 2**n))`` of ``obs`` in the real dtype matching state dtype ``dtype``
    (complex when needed), on ``device``; cached unless the coefficients require grad."""
    groups = groups_of(obs, n)
    rdtype = torch.float32 if dtype in (torch.float32, torch.complex64) else torch.float64
    c = obs.coeffs.to(device)
    if c.requires_grad:
        return groups, groups.diagonals(c, rdtype)
    key = (_words_key(obs, n), str(device), rdtype)
    hit = _DIAGS.get(key)
    if hit is not None and hit[0].shape == c.shape and torch.equal(hit[0], c):
        _DIAGS.move_to_end(key)
        return groups, hit[1]
    d = groups.diagonals(c, rdtype)
    if d.numel() * d.element_size() <= _CACHE_BYTES:
        _DIAGS[key] = (c.detach().clone(), d)
        while sum(v[1].numel() * v[1].element_size() for v in _DIAGS.values()) > _CACHE_BYTES:
            _DIAGS.popitem(last=False)
    return groups, d


def usable(obs) -> bool:
    """True when the grouped kernel applies and pays off (Pauli sum, enough terms)."""
    return len(obs.terms) >= MIN_TERMS and obs.is_pauli


def apply_pauli_sum(state: torch.Tensor, obs, n: int) -> torch.Tensor:
    """``O psi`` ``(B, 2**n)`` for a Pauli-sum observable by flip groups (new tensor)."""
    groups, d = diagonals_of(obs, n, state.dtype, state.device)
    if d.is_complex() and not state.is_complex():
        state = state.to(d.dtype)
    grad = torch.is_grad_enabled() and (state.requires_grad or d.requires_grad)
    b = state.shape[0]
    # rows = basis states: gathering rows is faster than gathering along the last axis
    x = state.reshape(-1) if b == 1 else state.transpose(0, 1).contiguous()
    dcol = d if b == 1 else d.unsqueeze(-1)
    start = 1 if groups.masks and groups.masks[0] == 0 else 0
    out = x * dcol[0] if start else torch.zeros_like(x)
    for g in range(start, len(groups.masks)):
        shifted = x.index_select(0, groups.gather_index(g, x.device))
        out = out + dcol[g] * shifted if grad else out.add_(shifted.mul_(dcol[g]))
    return out.reshape(1, -1) if b == 1 else out.transpose(0, 1)


def pauli_sum_expval(state: torch.Tensor, obs, n: int) -> torch.Tensor:
    """``<psi|O|psi>`` ``(B,)`` real for a Pauli-sum observable, by flip groups."""
    h = apply_pauli_sum(state, obs, n)
    return (state.conj() * h).real.sum(-1) if state.is_complex() else (state * h).sum(-1)
