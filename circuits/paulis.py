"""Pauli sums applied to state batches by flip-mask groups: the one copy of this kernel, used by
the statevector engine's measurements and by :class:`qdiff.operators.PauliSumOperator`.

A Pauli word acts on a basis state as a bit flip times a sign and a power of ``i``:
``P|b> = i**n_y (-1)**popcount(b & zy) |b ^ x>`` (``x``: X/Y wires, ``zy``: Z/Y wires; wire 0 is
the most significant bit). Terms sharing a flip mask ``m`` add up to one diagonal ``D_m`` and

    (H psi)[y] = sum_m D_m[y] psi[y ^ m],   D_m = WHT(coefficients scattered at their zy masks)

so a Hamiltonian of ``T`` terms in ``G`` flip groups costs ``G`` gathers and multiply-adds of the
state instead of ``T`` term-by-term passes. The diagonals can be formed a few groups at a time
(:func:`apply`), so a long sum on a large register needs O(1) extra states, not O(G).

>>> import torch
>>> g = PauliGroups([{0: "X"}, {0: "Z"}], 1)   # H = 1 X + 0.5 Z
>>> apply(g, torch.tensor([1.0, 0.5], dtype=torch.float64),
...       torch.tensor([[1, 0]], dtype=torch.complex128))
tensor([[0.5000+0.j, 1.0000+0.j]], dtype=torch.complex128)
"""
from __future__ import annotations

import numbers

import torch

from qdiff.circuits import caches
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.operation import is_concrete



DIRECT_TERMS = 8  # a group with at most this many terms builds its diagonal term by term


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


def word_masks(word: dict, n: int) -> tuple:
    """``(x mask, zy mask, number of Y)`` of a Pauli word ``{wire: letter}`` on ``n`` wires."""
    x = zy = ny = 0
    for w, letter in word.items():
        if isinstance(w, bool) or not (isinstance(w, numbers.Integral) and 0 <= w < n):
            raise QdiffError(f"Pauli word acts on wire {w!r}, outside 0..{n - 1}")
        w = int(w)
        if letter not in ("X", "Y", "Z"):
            raise QdiffError(f"unknown Pauli letter {letter!r} on wire {w}")
        bit = 1 << (n - 1 - w)
        x |= bit if letter in "XY" else 0
        zy |= bit if letter in "ZY" else 0
        ny += letter == "Y"
    return x, zy, ny


class PauliGroups:
    """Flip-mask grouping of Pauli words on ``n`` qubits (no coefficients).

    ``masks`` ``[G]`` (the diagonal group, mask 0, first when present); per term, in group order:
    ``order`` (original term index), ``group`` (its group), ``zy`` and ``phase`` (the
    ``y``-independent part ``i**n_y (-1)**popcount(m & zy)``). ``real``: every phase is real.
    """

    def __init__(self, words, n: int):
        self.n = n
        info = [word_masks(w, n) for w in words]
        groups: dict = {}
        for t, (x, _, _) in enumerate(info):
            groups.setdefault(x, []).append(t)
        self.masks = sorted(groups, key=lambda m: (m != 0, m))
        order, gidx, zys, phase = [], [], [], []
        for g, m in enumerate(self.masks):
            for t in groups[m]:
                _, zy, ny = info[t]
                order += [t]
                gidx += [g]
                zys += [zy]
                phase += [(1j) ** ny * (-1) ** (bin(m & zy).count("1") & 1)]
        self.order = torch.tensor(order, dtype=torch.long)
        self.group = torch.tensor(gidx, dtype=torch.long)
        self.zy = torch.tensor(zys, dtype=torch.long)
        self.phase = torch.tensor(phase, dtype=torch.complex128)
        self.real = all(abs(p.imag) < 0.5 for p in phase)

    @property
    def num_groups(self) -> int:
        return len(self.masks)

    @property
    def constant(self) -> torch.Tensor:
        """``(G,)`` bool: the groups of X words alone (no Z or Y), whose diagonal is constant."""
        flags = self.__dict__.get("_constant")
        if flags is None:
            flags = torch.ones(self.num_groups, dtype=torch.bool)
            flags.index_fill_(0, self.group[self.zy != 0], False)
            flags = self.__dict__.setdefault("_constant", flags)
        return flags

    def kernel_rows(self, lo: int, hi: int) -> torch.Tensor:
        """int64 ``(hi - lo,)``: each group's row among the diagonals of groups ``lo..hi``,
        or -1 for a constant one (kernels read its value, not its row); cached."""
        rows = self.__dict__.setdefault("_kernel_rows", {})
        row = rows.get((lo, hi))
        if row is None:
            if len(rows) > 64:
                rows.clear()
            row = rows.setdefault((lo, hi),
                                  torch.where(self.constant[lo:hi], -1, torch.arange(hi - lo)))
        return row

    @property
    def mask_tensor(self) -> torch.Tensor:
        """``masks`` as an int64 CPU tensor (for kernels)."""
        masks = self.__dict__.get("_mask_tensor")
        if masks is None:
            # the first one stored is the one every thread gets (a pointer the kernels read
            # must stay valid while another thread builds the same tensor)
            masks = self.__dict__.setdefault(
                "_mask_tensor", torch.tensor(self.masks, dtype=torch.int64))
        return masks

    def diagonals(self, coeffs: torch.Tensor, rdtype: torch.dtype, lo: int = 0,
                  hi: int = None) -> torch.Tensor:
        """``D`` ``(hi - lo, 2**n)`` of groups ``lo..hi`` (real when every phase and coefficient
        is real, else complex); differentiable w.r.t. ``coeffs`` ``(T,)``."""
        hi = self.num_groups if hi is None else hi
        dev = coeffs.device
        cdtype = torch.complex64 if rdtype == torch.float32 else torch.complex128
        sel = ((self.group >= lo) & (self.group < hi)).nonzero().reshape(-1)
        vals = coeffs[self.order[sel].to(dev)].to(cdtype) * self.phase[sel].to(dev, cdtype)
        if not coeffs.is_complex() and bool((self.phase[sel].imag == 0).all()):
            vals = vals.real  # these groups' diagonals are real
        if hi - lo == 1 and len(sel) <= DIRECT_TERMS:
            # a few terms: their sign vectors directly (no transform temporaries)
            # out of place under autograd and torch.func transforms (vmap batches vals alone)
            grad = (torch.is_grad_enabled() and vals.requires_grad) or not is_concrete(vals)
            d = torch.zeros(1 << self.n, dtype=vals.dtype, device=dev)
            for v, zy in zip(vals, self.zy[sel].tolist()):
                signs = z_signs(zy, self.n, vals.real.dtype, dev)
                d = d + v * signs if grad else d.addcmul_(signs, v)
            return d.reshape(1, 1 << self.n)
        pos = ((self.group[sel] - lo) << self.n) + self.zy[sel]
        flat = torch.zeros((hi - lo) << self.n, dtype=vals.dtype, device=dev)
        flat = flat.index_add(0, pos.to(dev), vals)
        return walsh_hadamard(flat.reshape(hi - lo, 1 << self.n))


def z_signs(zy: int, n: int, dtype, device) -> torch.Tensor:
    """``(-1)**popcount(y & zy)`` for ``y`` in ``0..2**n-1`` (the diagonal of a Z word)."""
    s = torch.ones(1, dtype=dtype, device=device)
    for b in range(n - 1, -1, -1):
        s = torch.stack((s, -s) if (zy >> b) & 1 else (s, s), dim=-1).reshape(-1)
    return s


GATHER_MAX_WIRES = 20  # up to here a mask of 3+ bit runs permutes by one index gather


@caches.cached(maxsize=8)
def _indices(n: int, device) -> torch.Tensor:
    return torch.arange(1 << n, device=device)


def xor_permute(x: torch.Tensor, mask: int, n: int, dim: int = 0) -> torch.Tensor:
    """``y[i] = x[i ^ mask]`` along axis ``dim`` (of length ``2**n``), as a new tensor.

    The axis is viewed as runs of consecutive index bits, flipped or kept; reversing a run of
    ``k`` bits is XOR with ``2**k - 1``, so one ``flip`` does it with no index tensor. A mask of
    many runs (a ``flip`` over many axes is several times slower than a gather) is one
    ``index_select`` of ``arange(2**n) ^ mask`` on registers up to ``GATHER_MAX_WIRES``."""
    dim = dim % x.dim()
    if n <= GATHER_MAX_WIRES and ((mask ^ (mask >> 1)) & ((1 << max(n - 1, 0)) - 1)).bit_count() > 1:
        return x.index_select(dim, _indices(n, x.device) ^ mask)
    sizes, flipped, b = [], [], n - 1
    while b >= 0:
        f = (mask >> b) & 1
        k = 0
        while b >= 0 and (mask >> b) & 1 == f:
            k += 1
            b -= 1
        sizes.append(1 << k)
        flipped.append(bool(f))
    dims = [dim + i for i, f in enumerate(flipped) if f]
    view = x.reshape(*x.shape[:dim], *sizes, *x.shape[dim + 1:])
    return view.flip(dims).reshape(x.shape)


def group_chunks(num_groups: int, n: int, rows: int) -> int:
    """How many groups' diagonals to form at once: all of them while they are no bigger than
    the ``rows`` states they act on (or small), else ``rows`` at a time, so that the diagonals
    never take more memory than the states (O(1) extra states for any number of terms)."""
    if (num_groups << n) <= max(rows << n, 1 << 16):
        return num_groups
    return max(1, min(num_groups, rows))


_KERNELS: list = []  # engines' flip-group products (register_kernel)


def register_kernel(kernel) -> None:
    """Register an engine's flip-group product for the states it takes: ``kernel.takes(x)``
    for states ``x`` ``(B, 2**n)``, and ``kernel(x, groups, lo, hi, D, out)`` adds
    ``sum_g D[g - lo, i] x[b, i ^ masks[g]]`` over groups ``lo..hi`` to ``out`` (a new tensor
    when ``None``) and returns it. The statevector engine registers its native kernel."""
    if kernel not in _KERNELS:
        _KERNELS.append(kernel)


def kernel_for(psi: torch.Tensor):
    """The first registered kernel that takes the states ``psi`` ``(..., 2**n)``, or None."""
    x = psi.reshape(-1, psi.shape[-1])
    return next((k for k in _KERNELS if k.takes(x)), None)


def apply(groups: PauliGroups, coeffs: torch.Tensor, psi: torch.Tensor,
          diagonals: torch.Tensor = None, kernel=None) -> torch.Tensor:
    """``H psi`` for ``psi`` ``(..., 2**n)`` (a new tensor; real stays real for a real ``H``).

    ``diagonals``: all groups' ``D`` when the caller has them (cached); otherwise they are
    formed a chunk of groups at a time (:func:`group_chunks`). ``kernel``: a registered
    kernel (:func:`register_kernel`; default: :func:`kernel_for` the states) forms the sum
    outside autograd; the torch loop below runs where none takes the states."""
    dim = 1 << groups.n
    if psi.shape[-1] != dim:
        raise QdiffError(f"a Pauli sum on {groups.n} qubits needs states of length {dim}; got "
                         f"shape {tuple(psi.shape)}")
    rdtype = torch.float32 if psi.dtype in (torch.float32, torch.complex64) else torch.float64
    needs_complex = not (groups.real and not coeffs.is_complex())
    if needs_complex and not psi.is_complex():
        psi = psi.to(torch.complex64 if rdtype == torch.float32 else torch.complex128)
    if (torch.is_grad_enabled() and psi.requires_grad and not coeffs.requires_grad
            and not coeffs.is_complex() and (diagonals is None or not diagonals.requires_grad)
            and is_concrete(psi) and is_concrete(coeffs)
            and (diagonals is None or is_concrete(diagonals))):
        # H is Hermitian: its vector-Jacobian product is H applied again, so nothing of the
        # forward (a diagonal per group) is kept for the backward pass (inside torch.func
        # transforms the differentiable loop below runs instead)
        return _HermitianApply.apply(psi, groups, coeffs, diagonals, kernel)
    lead = psi.shape[:-1]
    x = psi.reshape(-1, dim)
    rows = x.shape[0]
    grad = torch.is_grad_enabled() and (psi.requires_grad or coeffs.requires_grad or (
        diagonals is not None and diagonals.requires_grad))
    step = max(1, groups.num_groups if diagonals is not None else
               group_chunks(groups.num_groups, groups.n, rows))  # no groups: H = 0
    if kernel is None and not grad:
        kernel = kernel_for(x)

    def chunks():  # (lo, hi, the diagonals of groups lo..hi)
        for lo in range(0, groups.num_groups, step):
            hi = min(lo + step, groups.num_groups)
            d = diagonals[lo:hi] if diagonals is not None else \
                groups.diagonals(coeffs, rdtype, lo, hi)
            yield lo, hi, d.to(psi.device)

    # the kernels read raw memory: the diagonals too must be plain tensors (coefficients
    # batched by vmap wrap them while the states are plain)
    if kernel is not None and not grad and groups.num_groups and kernel.takes(x) and \
            is_concrete(coeffs) and (diagonals is None or is_concrete(diagonals)):
        out = None
        for lo, hi, d in chunks():
            out = kernel(x, groups, lo, hi, d, out)
        return out.reshape(*lead, dim)
    # rows = basis states: gathering rows is several times faster than along the last axis
    x = x.reshape(dim) if rows == 1 else x.transpose(0, 1).contiguous()
    out = None
    for lo, hi, d in chunks():
        dcol = d if rows == 1 else d.unsqueeze(-1)
        for g in range(lo, hi):
            term = x if groups.masks[g] == 0 else xor_permute(x, groups.masks[g], groups.n)
            if out is None:
                out = dcol[g - lo] * term
            elif grad:
                out = out + dcol[g - lo] * term
            else:
                out.addcmul_(dcol[g - lo], term)
    if out is None:
        out = torch.zeros_like(x)
    out = out if out.dim() == 1 else out.transpose(0, 1)
    return out.reshape(*lead, dim)


class _HermitianApply(torch.autograd.Function):
    """``H psi`` for a Hermitian ``H`` (real coefficients, no grad): backward is ``H g``."""

    @staticmethod
    def forward(ctx, psi, groups, coeffs, diagonals, kernel):
        ctx.groups, ctx.coeffs, ctx.diagonals, ctx.kernel = groups, coeffs, diagonals, kernel
        with torch.no_grad():
            return apply(groups, coeffs, psi.detach(), diagonals, kernel)

    @staticmethod
    def backward(ctx, g):
        return apply(ctx.groups, ctx.coeffs, g, ctx.diagonals, ctx.kernel), None, None, None, None
