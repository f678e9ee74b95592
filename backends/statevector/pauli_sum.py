"""Pauli-sum observables on the engine's state batches: the flip-group kernel of
:mod:`qdiff.circuits.paulis`, with the groups and diagonals of recent observables cached.

The group structure of an observable is cached by its Pauli words (a qnode records a new
``Observable`` object each call, with the same words), and its diagonals by the coefficient
values, while the coefficients do not require grad; with grad, everything is rebuilt by
differentiable torch ops (gradients reach the state and the coefficients).
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from qdiff.circuits import caches, memory
from qdiff.circuits.operation import is_concrete
from qdiff.circuits.paulis import PauliGroups, apply, kernel_for, register_kernel
from qdiff.backends.statevector import native, pauli_triton

# cached diagonals, in bytes over all observables
_CACHE_BYTES = 1 << 28
# below this many terms the term-by-term path is as fast and needs no set-up
MIN_TERMS = 6


_LOCK = threading.Lock()  # the two caches' bookkeeping: threads share them


def _locked_clear(cache):
    def clear():
        with _LOCK:
            cache.clear()
    return clear


_GROUPS: "OrderedDict[tuple, PauliGroups]" = OrderedDict()
_DIAGS: "OrderedDict[tuple, tuple]" = OrderedDict()
caches.register("pauli_sum.groups", _GROUPS, clear=_locked_clear(_GROUPS))
caches.register("pauli_sum.diagonals", _DIAGS, clear=_locked_clear(_DIAGS))

register_kernel(native.pauli_kernel)  # Pauli sums on CPU states: one native call per chunk
register_kernel(pauli_triton.pauli_kernel)  # on CUDA states: one Triton launch per chunk


def _words_key(obs, n: int) -> tuple:
    return (n, tuple(tuple((f.wires[0], f.kind) for f in t) for t in obs.terms))


def groups_of(obs, n: int, key=None) -> PauliGroups:
    """The (cached) :class:`PauliGroups` of a Pauli-sum observable on ``n`` wires (``key``: its
    :func:`_words_key` when the caller has it)."""
    key = _words_key(obs, n) if key is None else key
    with _LOCK:
        g = _GROUPS.get(key)
        if g is not None:
            _GROUPS.move_to_end(key)
            return g
    with caches.constants():
        g = PauliGroups(obs.pauli_words(), n)
    with _LOCK:
        _GROUPS[key] = g
        while len(_GROUPS) > 32:
            _GROUPS.popitem(last=False)
    return g


def diagonals_of(obs, n: int, dtype: torch.dtype, device, words=None,
                 promote: bool = True) -> tuple:
    """``(groups, D (G, 2**n))`` of ``obs`` in the real dtype matching state dtype ``dtype``
    (complex when needed), on ``device``; cached unless the coefficients require grad
    (``words``: the observable's :func:`_words_key` when the caller has it). ``promote``: a
    real ``D`` for complex states is kept complex (for the torch loop; the native kernel reads
    it real)."""
    words = _words_key(obs, n) if words is None else words
    groups = groups_of(obs, n, words)
    rdtype = torch.float32 if dtype in (torch.float32, torch.complex64) else torch.float64
    c = obs.coeffs.to(device)
    if c.requires_grad or not is_concrete(c):  # a transformed (e.g. vmapped) coefficient
        return groups, groups.diagonals(c, rdtype)
    cplx = dtype.is_complex and promote
    key = (words, str(device), rdtype, cplx)
    with _LOCK:
        hit = _DIAGS.get(key)
        if hit is not None and hit[0].shape == c.shape and torch.equal(hit[0], c):
            _DIAGS.move_to_end(key)
            return groups, hit[1]
    with caches.constants():
        d = groups.diagonals(c, rdtype)
        if cplx and not d.is_complex() and 2 * d.numel() * d.element_size() <= _CACHE_BYTES // 4:
            # for complex states, kept complex: a real diagonal is promoted on every
            # multiply-add (the same values; the promotion costs as much as the product)
            d = d.to(torch.complex64 if rdtype == torch.float32 else torch.complex128)
    if d.numel() * d.element_size() <= _CACHE_BYTES:
        with _LOCK:
            _DIAGS[key] = (c.detach().clone(), d)
            while sum(v[1].numel() * v[1].element_size() for v in _DIAGS.values()) > _CACHE_BYTES:
                _DIAGS.popitem(last=False)
    return groups, d


def usable(obs) -> bool:
    """True when the grouped kernel applies and pays off (Pauli sum, enough terms)."""
    return len(obs.terms) >= MIN_TERMS and obs.is_pauli


def apply_pauli_sum(state: torch.Tensor, obs, n: int) -> torch.Tensor:
    """``O psi`` ``(B, 2**n)`` for a Pauli-sum observable by flip groups (new tensor). The
    diagonals come from the cache when they fit it, else a few groups at a time."""
    # the result, one permuted copy, a group's diagonal and its sign vectors (measured: about
    # 5.5 states beside a 20-qubit state for 40 terms in 29 groups)
    memory.require(6.0 * state.numel() * state.element_size(),
                   f"applying a {len(obs.terms)}-term Pauli sum to {state.shape[0]} state(s) of "
                   f"{n} qubits", state.device)
    words = _words_key(obs, n)
    groups = groups_of(obs, n, words)
    c = obs.coeffs.to(state.device)
    kernel = kernel_for(state)
    if (groups.num_groups << n) * 8 > _CACHE_BYTES // 4 and not c.requires_grad:
        return apply(groups, c, state, kernel=kernel)  # large: O(1) extra states, nothing cached
    _, d = diagonals_of(obs, n, state.dtype, state.device, words, promote=kernel is None)
    return apply(groups, c, state, diagonals=d, kernel=kernel)


def pauli_sum_expval(state: torch.Tensor, obs, n: int) -> torch.Tensor:
    """``<psi|O|psi>`` ``(B,)`` real for a Pauli-sum observable, by flip groups."""
    h = apply_pauli_sum(state, obs, n)
    if not state.is_complex():
        return (state * h).sum(-1)
    if state.shape[-1] >= 1 << 16 and not (torch.is_grad_enabled() and state.requires_grad):
        # large states: one dot product per row, no product state
        return torch.stack([torch.vdot(s, t).real for s, t in zip(state, h)])
    return (state.conj() * h).real.sum(-1)
