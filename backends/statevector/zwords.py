"""Z-word outputs: expectations of products of Z, read off ``|psi|^2`` with sign matrices.

A Z word ``Z_a Z_b ...`` is diagonal: ``<Z_w> = sum_x |psi_x|^2 (-1)**popcount(x & mask_w)``.
Many of them (the usual "expval Z on every wire") cost one ``|psi|^2`` pass and one matmul with
a cached ``(2**n, K)`` sign matrix; on large registers, words within one half of the wires are
read off that half's marginal. The adjoint method folds its cotangent into the same signs
(``lam = diag * psi``, :func:`z_word_diagonal`).
"""
from __future__ import annotations

import torch

from qdiff.circuits import caches
from qdiff.backends.statevector import native
from qdiff.circuits.circuit import memo

_SIGN_CACHE: dict = caches.register("statevector.z_sign_matrices", {})
SIGN_BUDGET = 1 << 22  # entries of a cached (2**n, T) sign matrix (32 MiB in float64)
#: from this many wires on, Z words within one half of the register are read off (or folded
#: into) the two half-register marginals: a (2**n, K) sign matrix is then too large to read
#: per call (measured: 6-10x slower at n = 16)
HALVES_MIN_WIRES = 12


def is_z_word(m) -> bool:
    return (m.kind == "expval" and m.obs.is_pauli and len(m.obs.terms) == 1
            and all(f.kind == "Z" for f in m.obs.terms[0]))


def sign_matrix(words: tuple, n: int, dtype, device) -> torch.Tensor:
    """``S[x, t] = (-1)**popcount(x & mask_t)`` for Z words given as wire tuples."""
    def build():
        x = torch.arange(2 ** n, device=device)
        cols = []
        for wires in words:
            par = torch.zeros_like(x)
            for w in wires:
                par ^= (x >> (n - 1 - w)) & 1
            cols.append(1 - 2 * par)
        return torch.stack(cols, dim=-1).to(dtype)
    return caches.fetch(_SIGN_CACHE, (words, n, dtype, str(device)), build)


def half_register_words(words: dict, n: int) -> list:
    """Group Z words ``{key: wire tuple}`` by the half of the register they lie in:
    ``[(first wire, half size, keys, words shifted into the half)]`` for the first ``n // 2``
    wires and the rest; words spanning both halves are in neither."""
    a = n // 2
    out = []
    for lo, m in ((0, a), (a, n - a)):
        keys = [k for k, ws in words.items() if all(lo <= w < lo + m for w in ws)]
        out.append((lo, m, keys, tuple(tuple(w - lo for w in words[k]) for k in keys)))
    return out


def joint_z_expvals(state, circuit) -> dict:
    """Z-word expvals from one ``|psi|^2``: one sign matmul on a small register; on a large
    one, the probabilities are first summed to the two halves' marginals (two reductions), and
    each word within a half is a matmul with that half's small sign matrix (words that span
    both halves are left to the general path)."""
    n = circuit.num_wires
    words = z_words(circuit)
    idx = list(words)
    big = (2 ** n) * len(idx) > SIGN_BUDGET or n >= HALVES_MIN_WIRES
    if not idx or (len(idx) < 2 and not big):
        return {}
    vals = {}
    if not big:
        p = native.abs2(state)
        v = p @ sign_matrix(tuple(words[i] for i in idx), n, p.dtype, p.device)
        vals = {i: v[:, j] for j, i in enumerate(idx)}
    else:
        for (lo, m, mine, shifted), marg in zip(halves(circuit), state_marginals(state, n)):
            if mine:
                v = marg @ sign_matrix(shifted, m, marg.dtype, marg.device)
                vals.update({i: v[:, j] for j, i in enumerate(mine)})
    out = {}
    ms = circuit.measurements
    for (i, v), c in zip(vals.items(), coefficients([ms[i] for i in vals])):
        out[i] = v if c == 1.0 else v * c
    return out


def z_words(circuit) -> dict:
    """``{measurement index: sorted wire tuple}`` of the circuit's Z-word expvals (cached per
    circuit object: circuits are immutable)."""
    return memo(circuit, "z_words", lambda: {
        i: tuple(sorted(f.wires[0] for f in m.obs.terms[0]))
        for i, m in enumerate(circuit.measurements) if is_z_word(m)})


def halves(circuit) -> list:
    """:func:`half_register_words` of the circuit's Z words (cached per circuit object)."""
    return memo(circuit, "z_halves",
                lambda: half_register_words(z_words(circuit), circuit.num_wires))


def marginals(p: torch.Tensor, n: int) -> tuple:
    """The probabilities ``(B, 2**n)`` summed to the first ``n // 2`` wires and to the rest."""
    a = n // 2
    pv = p.view(p.shape[0], 2 ** a, 2 ** (n - a))
    return pv.sum(2), pv.sum(1)


def state_marginals(state: torch.Tensor, n: int) -> tuple:
    """:func:`marginals` of ``|state|^2``: in one native pass where the kernels take the
    states (split over the threads, no ``|state|^2`` array), else in torch."""
    out = native.half_marginals(state, n, n - n // 2)
    return out if out is not None else marginals(native.abs2(state), n)


def coefficient(m) -> float:
    """The real coefficient of a one-term observable, read now (an observable's coefficient
    tensor may be changed in place between calls)."""
    c = m.obs.coeffs
    return float(c.real if c.is_complex() else c)


def coefficients(ms) -> list:
    """:func:`coefficient` of each measurement in ``ms``, read in one gather."""
    cs = [m.obs.coeffs for m in ms]
    if len(cs) < 2:
        return [coefficient(m) for m in ms]
    try:
        with torch.no_grad():
            v = torch.cat(cs)
    except RuntimeError:  # coefficients on different devices
        return [coefficient(m) for m in ms]
    return (v.real if v.is_complex() else v).tolist()


def _z_plan(circuit):
    """For a circuit whose measurements are all Z words: ``(words, halves)`` where ``halves``
    says the words are read off the two half-register marginals (:func:`halves`, each word
    within one half, and a large register), else off one ``(2**n, K)`` sign matrix (small
    registers within :data:`SIGN_BUDGET`); ``None`` when neither applies."""

    def build():
        ms, n = circuit.measurements, circuit.num_wires
        if not ms or not all(is_z_word(m) for m in ms):
            return None
        words = tuple(tuple(sorted(f.wires[0] for f in m.obs.terms[0])) for m in ms)
        if n >= HALVES_MIN_WIRES and sum(len(h[2]) for h in halves(circuit)) == len(ms):
            order = [i for h in halves(circuit) for i in h[2]]
            return words, (None if order == list(range(len(ms))) else
                           torch.argsort(torch.tensor(order)))
        if (2 ** n) * len(ms) > SIGN_BUDGET:
            return None
        return words, False
    return memo(circuit, "z_plan", build)


def stacked_expvals(state, circuit):
    """``(B, K)`` expvals when every measurement is a Z word, on a small register (one
    ``|psi|^2`` pass and one matmul) or, each word within one half, on a large one (the two
    half-register marginals and two small matmuls); else ``None``."""
    plan = _z_plan(circuit)
    if plan is None:
        return None
    ms = circuit.measurements
    if any(m.obs.coeffs.requires_grad for m in ms):
        return None
    words, split = plan
    n = circuit.num_wires
    # coefficients are read on every call: an observable may be changed in place
    coeffs = coefficients(ms)
    if split is False:
        p = native.abs2(state)
        v = p @ sign_matrix(words, n, p.dtype, p.device)
    else:
        v = torch.cat([marg @ sign_matrix(shifted, m, marg.dtype, marg.device)
                       for (_, m, keys, shifted), marg in zip(halves(circuit),
                                                              state_marginals(state, n))
                       if keys], dim=1)
        if split is not None:  # back to measurement order
            v = v[:, split.to(v.device)]
    if all(c == 1.0 for c in coeffs):
        return v
    return v * torch.tensor(coeffs, dtype=v.dtype, device=v.device)


def lam_from_z_words(state, circuit, cotangent, n):
    """``(lam, covered measurement indices)``: :func:`z_word_diagonal` times ``psi``."""
    diag, done = z_word_diagonal(state, circuit, cotangent, n)
    if diag is None:
        return None, done
    if state.dtype in (torch.complex64, torch.complex128) and state.is_contiguous():
        # a real multiply on the (re, im) view: torch's complex-by-real path converts first
        return torch.view_as_complex(torch.view_as_real(state) * diag.unsqueeze(-1)), done
    return state * diag, done


def z_word_diagonal(state, circuit, cotangent, n):
    """``sum over Z-word expvals of g_k c_k S_k`` (``S_k`` the word's +-1 signs) as one real
    diagonal ``(B, 2**n)`` (``lam = diag * psi``), and the set of measurement indices it covers
    (``None, set()`` when fewer than two outputs are Z words).

    Small registers: the diagonal is one matmul with the ``(2**n, K)`` sign matrix. Large
    ones: words within the first or the second half of the wires give two small diagonals
    ``D_hi (2**a)`` and ``D_lo (2**(n-a))``, and the full one is their broadcast sum (words
    spanning both halves are left to the general path)."""
    diag, done = z_word_diagonal_parts(state, circuit, cotangent, n)
    if isinstance(diag, tuple):
        hi, lo = diag
        diag = (hi[:, :, None] + lo[:, None, :]).reshape(state.shape[0], -1)
    return diag, done


def z_word_diagonal_parts(state, circuit, cotangent, n):
    """:func:`z_word_diagonal`, with a large register's diagonal left as its two halves'
    ``(D_hi (B, 2**a), D_lo (B, 2**(n-a)))`` (a tuple; ``diag[b, x] = D_hi[b, x >> (n - a)] +
    D_lo[b, x & (2**(n-a) - 1)]``, the native sweep forms ``lam`` from them directly)."""
    def columns():
        cols, col = [], 0
        for i, m in enumerate(circuit.measurements):
            if is_z_word(m):
                cols.append((i, col))
            col += 1 if m.kind in ("expval", "var") else (
                2 ** (n if m.wires is None else len(m.wires)) if m.kind == "probs" else 0)
        every = [c for _, c in cols] == list(range(col))
        return cols, every
    cols, every = memo(circuit, ("z_columns", n), columns)
    if len(cols) < 2:
        return None, set()
    ms = circuit.measurements
    rdtype = state.real.dtype
    words = z_words(circuit)

    def weights(sel):
        coeff = coefficients([ms[i] for i, _ in sel])
        g = cotangent if every and len(sel) == len(cols) else cotangent[:, [c for _, c in sel]]
        g = g.to(rdtype)
        if all(c == 1.0 for c in coeff):
            return g
        return g * torch.tensor(coeff, dtype=rdtype, device=state.device)

    split = halves(circuit) if n >= HALVES_MIN_WIRES or (2 ** n) * len(cols) > SIGN_BUDGET \
        else None
    if split is not None and sum(len(h[2]) for h in split) < len(cols) and \
            (2 ** n) * len(cols) <= SIGN_BUDGET:
        split = None  # a word spans both halves: one sign matrix covers them all
    if split is None:
        signs = sign_matrix(tuple(words[i] for i, _ in cols), n, rdtype, state.device)
        return weights(cols) @ signs.T, {i for i, _ in cols}
    if sum(len(h[2]) for h in split) < 2:
        return None, set()

    def half_columns():  # per half: its cotangent columns as an index tensor (cached)
        col_of = dict(cols)
        return [torch.tensor([col_of[i] for i in keys], device=state.device) if keys else None
                for _, _, keys, _ in split]
    index = memo(circuit, ("z_half_columns", n, str(state.device)), half_columns)
    # the coefficients of every Z word in one read, the cotangent converted once
    coeff = dict(zip((i for i, _ in cols), coefficients([ms[i] for i, _ in cols])))
    g_all = cotangent.to(rdtype)
    parts, done = [], set()
    for (_, m, keys, shifted), idx in zip(split, index):
        if keys:
            g = g_all.index_select(1, idx)
            c = [coeff[i] for i in keys]
            if not all(x == 1.0 for x in c):
                g = g * torch.tensor(c, dtype=rdtype, device=state.device)
            parts.append(g @ sign_matrix(shifted, m, rdtype, state.device).T)
            done.update(keys)
        else:
            parts.append(torch.zeros(state.shape[0], 2 ** m, dtype=rdtype, device=state.device))
    return (parts[0], parts[1]), done
