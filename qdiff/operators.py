"""Pauli-sum operators applied to batches of states without a dense ``2**n x 2**n`` matrix.

A Pauli word ``P`` on ``n`` qubits acts on a basis state as a bit flip times a phase:
``P|b> = i**n_y (-1)**popcount(b & zy) |b ^ x>``, with ``x`` the mask of its X/Y wires and
``zy`` the mask of its Z/Y wires (wire 0 is the most significant bit, as everywhere in qdiff).
Terms that share a flip mask ``m`` therefore add up to one *diagonal* ``D_m``:

    (H psi)[y] = sum_m D_m[y] * psi[y ^ m]
    D_m[y]     = sum_{t in m} c_t i**n_y(t) (-1)**popcount((y ^ m) & zy_t)

and ``D_m`` is the Walsh-Hadamard transform of the coefficients scattered at their ``zy`` masks,
so it is built in ``O(G n 2**n)`` by differentiable torch ops (``G`` = number of flip masks).
Applying ``H`` costs ``G`` gathers and multiply-adds of the state; expectations, the sparse CSR
matrix and the dense matrix all derive from the same diagonals, on the device and in the dtype of
the tensors given, and are differentiable with respect to the state and the coefficients.

>>> import torch, qdiff as qd
>>> H = qd.PauliSumOperator.from_observable(0.5 * qd.Z(0) @ qd.Z(1) + 0.3 * qd.X(1), n_qubits=2)
>>> psi = torch.tensor([[1.0, 0, 0, 0]], dtype=torch.complex128)
>>> H.expval(psi)
tensor([0.5000], dtype=torch.float64)
"""
from __future__ import annotations

import numbers
import warnings
from collections.abc import Mapping
from typing import Optional, Sequence

import numpy as np
import torch

import qdiff.backends.base  # noqa: F401  (loads the embedded engine: it registers its kernels)
from qdiff.circuits import caches, memory
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.observables import Observable, as_coeff_tensor, as_observable, check_finite
from qdiff.circuits.operation import is_concrete
from qdiff.circuits.paulis import PauliGroups, apply, kernel_for, walsh_hadamard, xor_permute

MAX_QUBITS = 62  # flip and sign masks are int64 bit masks


def _require(nbytes: float, what: str, device=None) -> None:
    memory.require(nbytes, what, device, hint="apply() works on states without a matrix")


def _coeff_vector(coeffs, who: str) -> torch.Tensor:
    """``(T,)`` floating or complex coefficients (a tensor keeps its graph), checked finite."""
    if isinstance(coeffs, torch.Tensor):
        c = coeffs if (coeffs.is_complex() or coeffs.dtype.is_floating_point) else \
            coeffs.to(torch.float64)
        c = c.reshape(-1)
    else:
        try:
            c = as_coeff_tensor(coeffs)
        except QdiffError:
            raise QdiffError(f"{who}: coefficients must be numbers; got {coeffs!r:.80}") from None
    check_finite(c)
    return c


def _scalar_result_dtype(coeffs: torch.Tensor, other) -> torch.dtype:
    """torch's rule for ``coeffs op other``: a Python number or 0-d tensor keeps float32
    coefficients float32 (complex64 for a complex number); never complex32, which torch's
    kernels mostly lack."""
    dt = torch.result_type(coeffs, other)
    return torch.complex64 if dt == torch.complex32 else dt


class PauliSumOperator:
    """``H = sum_t c_t P_t`` on ``n_qubits`` qubits, applied to ``(..., 2**n)`` states.

    Args:
        words: one ``{wire: "X"|"Y"|"Z"}`` dict per term (``{}`` is the identity), wires 0..n-1.
        coeffs: ``(T,)`` real (or complex) tensor; may require grad.
        n_qubits: number of qubits ``n``.
    """

    def __init__(self, words: Sequence[dict], coeffs, n_qubits: int):
        if isinstance(n_qubits, bool) or not isinstance(n_qubits, (int, np.integer)) \
                or not 0 <= n_qubits <= MAX_QUBITS:
            raise QdiffError(f"PauliSumOperator: n_qubits must be an integer in 0..{MAX_QUBITS}; "
                             f"got {n_qubits!r}")
        self.n_qubits = int(n_qubits)
        bad = [w for w in words if not isinstance(w, Mapping)]
        if bad:
            raise QdiffError(f"PauliSumOperator: each Pauli word must be a dict {{wire: "
                             f"'X'|'Y'|'Z'}}; got {bad[0]!r:.60} (for strings such as 'XXIZ' "
                             "use PauliSumOperator.from_strings)")
        self.words = [dict(w) for w in words]
        self.coeffs = _coeff_vector(coeffs, "PauliSumOperator")
        if self.coeffs.numel() != len(self.words):
            raise QdiffError(f"PauliSumOperator: {self.coeffs.numel()} coefficient(s) for "
                             f"{len(self.words)} Pauli word(s)")
        self.groups = PauliGroups(self.words, self.n_qubits)
        self.masks = self.groups.masks
        self._diag_cache = {}

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_observable(cls, obs: Observable, n_qubits: Optional[int] = None,
                        wire_order: Optional[Sequence] = None) -> "PauliSumOperator":
        """From a Pauli-only :class:`qdiff.Observable` (or ``qd.Z(0)``, a PennyLane observable);
        its wires are mapped through ``wire_order`` (default ``0..n-1`` by label). The
        coefficients tensor is shared (gradients reach it)."""
        obs = as_observable(obs)
        if not obs.is_pauli:
            raise QdiffError("PauliSumOperator needs a Pauli-sum observable; this one has a "
                             "Hermitian-matrix factor")
        words = obs.pauli_words()
        if wire_order is not None:
            pos = {w: i for i, w in enumerate(wire_order)}
            try:
                words = [{pos[w]: l for w, l in word.items()} for word in words]
            except KeyError as e:
                raise QdiffError(f"observable acts on wire {e.args[0]!r}, not in wire_order "
                                 f"{list(wire_order)}") from None
        elif any(isinstance(w, bool) or not isinstance(w, (int, np.integer))
                 for word in words for w in word):
            labels = [w for w in obs.wires if isinstance(w, bool)
                      or not isinstance(w, (int, np.integer))]
            raise QdiffError(f"PauliSumOperator.from_observable: wire label {labels[0]!r} is not "
                             "an integer; pass wire_order=[...] to give each wire its position")
        if n_qubits is None:
            n_qubits = len(wire_order) if wire_order is not None else \
                1 + max((w for word in words for w in word), default=-1)
        return cls(words, obs.coeffs, n_qubits)

    @classmethod
    def from_strings(cls, strings: Sequence[str], coeffs) -> "PauliSumOperator":
        """From Pauli strings like ``"XXIZ"`` (character ``k`` acts on wire ``k``)."""
        if isinstance(strings, str):
            raise QdiffError(f"PauliSumOperator.from_strings takes a list of Pauli strings; got "
                             f"the string {strings!r:.60} (for one term: [{strings!r:.60}])")
        n = len(strings[0]) if strings else 0
        words = []
        for s in strings:
            if len(s) != n:
                raise QdiffError(f"Pauli string {s!r} has length {len(s)}, expected {n}")
            words.append({i: ch for i, ch in enumerate(s) if ch != "I"})
        return cls(words, coeffs, n)

    def with_coeffs(self, coeffs: torch.Tensor) -> "PauliSumOperator":
        """The same Pauli words with new coefficients (structure shared, nothing recomputed)."""
        new = object.__new__(PauliSumOperator)
        new.__dict__.update(self.__dict__)
        new.coeffs = _coeff_vector(coeffs, "with_coeffs")
        if new.coeffs.numel() != len(self.words):
            raise QdiffError(f"with_coeffs: expected {len(self.words)} coefficients, got "
                             f"{new.coeffs.numel()}")
        new._diag_cache = {}
        return new

    def to_observable(self) -> Observable:
        from qdiff.circuits.observables import Factor
        terms = [tuple(Factor((w,), l) for w, l in sorted(word.items())) for word in self.words]
        return Observable(self.coeffs, terms, simplify=False)

    # -- properties -----------------------------------------------------------------------
    @property
    def num_terms(self) -> int:
        return len(self.words)

    @property
    def num_groups(self) -> int:
        return len(self.masks)

    @property
    def dim(self) -> int:
        return 1 << self.n_qubits

    def __repr__(self):
        return (f"PauliSumOperator(n_qubits={self.n_qubits}, terms={self.num_terms}, "
                f"flip_groups={self.num_groups}, real={self.real_matrix})")

    @property
    def real_matrix(self) -> bool:
        """True when the matrix is real (every term has an even number of Y, real coefficients)."""
        return self.groups.real and not self.coeffs.is_complex()

    @property
    def hermitian(self) -> bool:
        """True unless the coefficients of some Pauli word (its terms added up) have an
        imaginary part above 1e-10: only then is ``H`` not Hermitian."""
        if not self.coeffs.is_complex():
            return True
        imag = self.coeffs.detach().imag
        if len(self.words) > 1:
            idx = self.__dict__.get("_word_index")  # which terms are the same word (structure)
            if idx is None:
                key = torch.stack([self.groups.group, self.groups.zy])
                idx = torch.empty(len(self.words), dtype=torch.long)
                idx[self.groups.order] = torch.unique(key, dim=1, return_inverse=True)[1]
                idx = self.__dict__.setdefault("_word_index", idx)
            idx = idx.to(imag.device)
            imag = torch.zeros(len(self.words), dtype=imag.dtype, device=imag.device) \
                .index_add(0, idx, imag)
        return not bool((imag.abs() > 1e-10).any())

    def check_hermitian(self, who: str, why: str = "") -> None:
        """Raise :class:`QdiffError` naming ``who`` (and ``why``) unless :attr:`hermitian`."""
        if not self.hermitian:
            raise QdiffError(f"{who}: this Pauli sum is not Hermitian (complex coefficients "
                             f"whose imaginary parts do not cancel){why}")

    # -- the diagonals --------------------------------------------------------------------
    def diagonals(self, device=None, dtype=None) -> torch.Tensor:
        """``D`` ``(G, 2**n)``: ``(H psi)[y] = sum_g D[g, y] psi[y ^ masks[g]]``.

        Real when :attr:`real_matrix`, else complex; differentiable w.r.t. :attr:`coeffs`.
        Cached while the coefficients do not require grad.
        """
        src = self.coeffs
        c = src if device is None else src.to(device)
        crdtype = torch.float32 if c.dtype in (torch.float32, torch.complex64) else torch.float64
        own = crdtype if self.real_matrix else crdtype.to_complex()
        target = own if dtype is None or (own.is_complex and not dtype.is_complex) else dtype
        # formed in the wider of the coefficients' and the result's precision (as torch
        # promotes a float32 factor in a float64 product)
        rdtype = torch.float64 if target in (torch.float64, torch.complex128) else crdtype
        # one entry per result, valid while the coefficients are the same tensor object
        # (the entry holds it: its address cannot pass to another tensor) unchanged in place;
        # none inside torch.func transforms (the coefficients are wrapped there, without
        # storage) nor for inference tensors (which count no in-place changes)
        cached = not c.requires_grad and is_concrete(c) and not src.is_inference()
        key = (str(c.device), target)
        if cached:
            hit = self._diag_cache.get(key)  # read once: another thread may trim the cache
            if hit is not None and hit[0] is src and hit[1] == src._version:
                return hit[2]
        # the diagonals (complex in general) and one transform temporary
        _require(2.0 * self.num_groups * 2.0 ** self.n_qubits * 2 * rdtype.itemsize,
                 f"the {self.num_groups} flip-group diagonals of a {self.n_qubits}-qubit "
                 "Pauli sum", c.device)
        d = self.groups.diagonals(c, rdtype).to(target)
        if cached:
            self._diag_cache[key] = (src, src._version, d)
            caches.trim(self._diag_cache, 4)
        return d

    # -- application ------------------------------------------------------------------------
    def _check_state(self, psi: torch.Tensor) -> None:
        if not isinstance(psi, torch.Tensor):
            raise QdiffError(f"PauliSumOperator applies to a state tensor (..., {self.dim}); "
                             f"got {type(psi).__name__} (the operator's matrix product with "
                             "another operator is not formed: use to_dense() or to_sparse_csr())")
        if psi.shape[-1] != self.dim:
            raise QdiffError(f"PauliSumOperator on {self.n_qubits} qubits needs states of "
                             f"length {self.dim}; got shape {tuple(psi.shape)}")

    def apply(self, psi: torch.Tensor) -> torch.Tensor:
        """``H psi`` for ``psi`` ``(..., 2**n)`` (real psi stays real if the matrix is real)."""
        self._check_state(psi)
        kernel = kernel_for(psi)
        # D in the states' precision: real for a real matrix where the native kernel reads it
        # (the torch loop multiplies complex states fastest by a complex one), else complex
        if not self.real_matrix:
            dtype = torch.complex64 if psi.dtype in (torch.float32, torch.complex64) else \
                torch.complex128
        else:
            dtype = psi.real.dtype if kernel is not None else psi.dtype
        d = self.diagonals(device=psi.device, dtype=dtype)
        return apply(self.groups, self.coeffs.to(psi.device), psi, diagonals=d, kernel=kernel)

    __matmul__ = apply

    # -- arithmetic -----------------------------------------------------------------------
    def __add__(self, other):
        """``H + K`` (Pauli sums on the same number of qubits; terms concatenated, so the
        coefficients of both keep their gradients), ``H + c`` (``c`` times the identity)."""
        if isinstance(other, (numbers.Number, torch.Tensor)) and not isinstance(other, bool):
            c = _coeff_vector(other, "PauliSumOperator + scalar")
            if c.numel() != 1:
                raise QdiffError(f"PauliSumOperator + tensor: the tensor must have one element; "
                                 f"got shape {tuple(other.shape)}")
            c = c.to(_scalar_result_dtype(self.coeffs, other))
            other = PauliSumOperator([{}], c, self.n_qubits)
        if not isinstance(other, PauliSumOperator):
            return NotImplemented
        if other.n_qubits != self.n_qubits:
            raise QdiffError(f"PauliSumOperator: cannot add operators on {self.n_qubits} and "
                             f"{other.n_qubits} qubits")
        dt = torch.promote_types(self.coeffs.dtype, other.coeffs.dtype)
        c = torch.cat([self.coeffs.to(dt), other.coeffs.to(device=self.coeffs.device, dtype=dt)])
        return PauliSumOperator(self.words + other.words, c, self.n_qubits)

    __radd__ = __add__

    def __neg__(self):
        return self.with_coeffs(-self.coeffs)

    def __sub__(self, other):
        if isinstance(other, (numbers.Number, torch.Tensor, PauliSumOperator)) \
                and not isinstance(other, bool):
            return self + (-other)
        return NotImplemented

    def __rsub__(self, other):
        return (-self) + other

    def __mul__(self, c):
        """``c * H`` for a number or a one-element tensor (which may require grad)."""
        if isinstance(c, bool) or not isinstance(c, (numbers.Number, torch.Tensor)):
            return NotImplemented
        t = _coeff_vector(c, "PauliSumOperator * scalar")
        if t.numel() != 1:
            raise QdiffError(f"PauliSumOperator * tensor: the tensor must have one element; got "
                             f"shape {tuple(c.shape)} (use with_coeffs for new coefficients)")
        dt = _scalar_result_dtype(self.coeffs, c)
        return self.with_coeffs(self.coeffs * t.to(self.coeffs.device, dt))

    __rmul__ = __mul__

    def __truediv__(self, c):
        if isinstance(c, bool) or not isinstance(c, (numbers.Number, torch.Tensor)):
            return NotImplemented
        t = 1.0 / _coeff_vector(c, "PauliSumOperator / scalar")
        return self * (t.reshape(()) if t.numel() == 1 and isinstance(c, numbers.Number) else t)

    def expval(self, psi: torch.Tensor) -> torch.Tensor:
        """``<psi|H|psi>`` ``(...)`` real, for (unnormalized) ``psi`` ``(..., 2**n)``; a
        non-Hermitian ``H`` (complex coefficients) is refused."""
        self.check_hermitian("expval", ", so <psi|H|psi> is complex: use "
                             "(psi.conj() * H.apply(psi)).sum(-1)")
        h = self.apply(psi)
        if h.is_complex():
            return (psi.conj() * h).real.sum(-1) if psi.is_complex() else (psi * h).real.sum(-1)
        return (psi * h).sum(-1)

    def term_expvals(self, psi: torch.Tensor) -> torch.Tensor:
        """``<psi|P_t|psi>`` for every term, ``(..., T)`` real."""
        return self.bilinear_terms(psi, psi)

    def bilinear_terms(self, a: torch.Tensor, b: torch.Tensor, chunk: int = 1 << 22) -> torch.Tensor:
        """``Re <a|P_t|b>`` for every term, ``(..., T)`` (the coefficient gradient of ``Re<a|H|b>``).

        Per flip group: ``w[y] = conj(a[y]) b[y ^ m]``, one Walsh-Hadamard transform, and a
        gather at the terms' ``zy`` masks (so the extra memory is a few states, whatever the
        number of groups).
        """
        self._check_state(a)
        self._check_state(b)
        lead = torch.broadcast_shapes(a.shape[:-1], b.shape[:-1])
        a = a.expand(*lead, self.dim)
        b = b.expand(*lead, self.dim)
        cd = a.dtype if a.is_complex() else (b.dtype if b.is_complex() else None)
        ac = a.conj() if a.is_complex() else a
        # structure, shared by with_coeffs copies: built whole, then stored once (threads)
        layout = self.__dict__.get("_term_layout")
        if layout is None:
            sizes = torch.bincount(self.groups.group, minlength=self.num_groups).tolist()
            inv = torch.empty_like(self.groups.order)
            inv[self.groups.order] = torch.arange(len(self.words))
            layout = self.__dict__.setdefault("_term_layout", (sizes, inv))
        group_sizes, term_position = layout
        zy = self.groups.zy.to(a.device)
        phase = self.groups.phase.to(a.device, dtype=cd or torch.complex128)
        imag = (self.groups.phase.imag != 0).tolist()
        parts, start = [], 0
        for g, size in enumerate(group_sizes):
            stop = start + size
            bg = b if self.masks[g] == 0 else xor_permute(b, self.masks[g], self.n_qubits, -1)
            picked = walsh_hadamard(ac * bg).index_select(-1, zy[start:stop])
            ph = phase[start:stop]
            # a real phase can still be -1 (two Y factors: i**2), so it is applied in every case
            parts.append((picked * ph).real if (picked.is_complex() or any(imag[start:stop]))
                         else picked * ph.real.to(picked.dtype))
            start = stop
        if not parts:
            return torch.zeros(*lead, 0, dtype=a.real.dtype, device=a.device)
        res = torch.cat(parts, -1).to(a.real.dtype)
        return res.index_select(-1, term_position.to(res.device))

    # -- matrices -----------------------------------------------------------------------------
    def _real_check(self, d: torch.Tensor, dtype, who: str) -> None:
        """Refuse a real ``dtype`` (or a non-numeric one) for a matrix with imaginary entries."""
        if not (dtype.is_complex or dtype.is_floating_point):
            raise QdiffError(f"{who}: dtype must be a floating or complex torch dtype; got {dtype}")
        if not dtype.is_complex and d.is_complex() and bool((d.detach().imag != 0).any()):
            raise QdiffError(f"{who}: this operator has imaginary matrix entries (odd numbers "
                             f"of Y or complex coefficients); dtype {dtype} would drop them: "
                             "use a complex dtype")

    def _flip_columns(self, rows: torch.Tensor) -> torch.Tensor:
        """``(G, N)``: the column ``y ^ m`` of each row ``y`` per flip mask ``m``."""
        if not self.masks:  # no terms: the zero operator
            return rows.new_empty(0, self.dim)
        return torch.stack([rows ^ m for m in self.masks])

    def _coo(self, tol: float = 0.0, dtype=None):
        # rows, columns and mask (int64) beside the values, per group and basis state
        _require(40.0 * self.num_groups * 2.0 ** self.n_qubits,
                 f"the sparse matrix of a {self.n_qubits}-qubit Pauli sum "
                 f"({self.num_groups} flip groups)", self.coeffs.device)
        d = self.diagonals(dtype=dtype).detach()
        rows = torch.arange(self.dim, device=d.device)
        cols = self._flip_columns(rows)  # (G, N)
        r = rows.expand(self.num_groups, -1)
        keep = d.abs() > tol
        return r[keep], cols[keep], d[keep]

    def to_sparse_csr(self, dtype: torch.dtype = torch.complex128, tol: float = 0.0) -> torch.Tensor:
        """``(2**n, 2**n)`` torch sparse CSR matrix (entries with ``|value| <= tol`` dropped)."""
        if not isinstance(dtype, torch.dtype) or not (dtype.is_complex or dtype.is_floating_point):
            raise QdiffError(f"to_sparse_csr: dtype must be a floating or complex torch dtype; got "
                             f"{dtype!r}")
        r, c, v = self._coo(tol, dtype)
        self._real_check(v, dtype, "to_sparse_csr")
        v = v.real if v.is_complex() and not dtype.is_complex else v
        coo = torch.sparse_coo_tensor(torch.stack([r, c]), v.to(dtype), (self.dim, self.dim),
                                      check_invariants=False)
        with warnings.catch_warnings():  # torch: "sparse CSR support is in beta"
            warnings.simplefilter("ignore", UserWarning)
            return coo.coalesce().to_sparse_csr()

    def to_scipy(self, tol: float = 0.0):
        """``scipy.sparse.csr_matrix`` (real when the matrix is real)."""
        import scipy.sparse as sp
        r, c, v = self._coo(tol)
        return sp.csr_matrix((v.cpu().numpy(), (r.cpu().numpy(), c.cpu().numpy())),
                             shape=(self.dim, self.dim))

    def to_dense(self, dtype: torch.dtype = torch.complex128) -> torch.Tensor:
        """``(2**n, 2**n)`` dense matrix, differentiable w.r.t. the coefficients (small ``n``)."""
        if self.n_qubits > 14:
            raise QdiffError(f"to_dense: {self.n_qubits} qubits would need a "
                             f"{self.dim}x{self.dim} matrix; use apply() or to_sparse_csr()")
        if not isinstance(dtype, torch.dtype) or not (dtype.is_complex or dtype.is_floating_point):
            raise QdiffError(f"to_dense: dtype must be a floating or complex torch dtype; got "
                             f"{dtype!r}")
        _require(2.0 * 4.0 ** self.n_qubits * dtype.itemsize,
                 f"the dense {self.dim}x{self.dim} matrix of a {self.n_qubits}-qubit Pauli sum",
                 self.coeffs.device)
        d = self.diagonals(dtype=dtype)  # in the result's precision, as apply() on its states
        self._real_check(d, dtype, "to_dense")
        d = (d.real if d.is_complex() and not dtype.is_complex else d).to(dtype)
        rows = torch.arange(self.dim, device=d.device)
        cols = self._flip_columns(rows)
        out = torch.zeros(self.dim, self.dim, dtype=dtype, device=d.device)
        return out.index_put((rows.expand(self.num_groups, -1).reshape(-1), cols.reshape(-1)),
                             d.reshape(-1), accumulate=True)

    def to(self, device=None, dtype=None) -> "PauliSumOperator":
        """A copy with coefficients moved (structure shared)."""
        if dtype is not None and not (dtype.is_complex or dtype.is_floating_point):
            raise QdiffError(f"PauliSumOperator.to: dtype must be a floating or complex torch "
                             f"dtype; got {dtype}")
        return self.with_coeffs(self.coeffs.to(device=device, dtype=dtype))


def as_operator(H, n_qubits: Optional[int] = None) -> PauliSumOperator:
    """A :class:`PauliSumOperator` from an operator or a Pauli-sum :class:`qdiff.Observable`."""
    if isinstance(H, PauliSumOperator):
        if n_qubits is not None and n_qubits != H.n_qubits:
            raise QdiffError(f"n_qubits={n_qubits}: the operator acts on {H.n_qubits} qubits "
                             "(n_qubits sizes an observable's register; leave it out)")
        return H
    if isinstance(H, Observable):
        return PauliSumOperator.from_observable(H, n_qubits)
    from qdiff.circuits.operation import Operation
    from qdiff.circuits.recording import is_pennylane
    if isinstance(H, Operation):
        return PauliSumOperator.from_observable(H.as_observable(), n_qubits)
    if is_pennylane(H):  # a PennyLane observable, as from_observable takes it
        return PauliSumOperator.from_observable(H, n_qubits)
    raise QdiffError(f"expected a PauliSumOperator or a Pauli-sum observable (qdiff's or "
                     f"PennyLane's), got {type(H).__name__}")
