"""Observables: Pauli words, Hermitian matrices, tensor products and their linear combinations.

Every observable is a linear combination ``sum_t c_t F_t`` of *terms*; a term is a tensor product
of factors on disjoint wires, each factor a Pauli letter on one wire or a dense Hermitian matrix
on some wires. Pauli-only observables (``is_pauli``) take the simulator's fast path.

>>> import qdiff as qd
>>> H = 0.5 * qd.Z(0) @ qd.Z(1) - 0.2 * qd.X(0) + qd.Z(0) @ qd.Z(1)
>>> H
1.5 * Z(0) @ Z(1) + -0.2 * X(0)
"""
from __future__ import annotations

import contextlib
import importlib
import numbers
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from qdiff.circuits import caches, memory
from qdiff.circuits import recording
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.operation import (Operation, is_concrete, normalize_wires, plain_values,
                                      set_observable_conversion)

# product of Pauli letters: (a, b) -> (phase, letter)
_PMUL = {("X", "Y"): (1j, "Z"), ("Y", "Z"): (1j, "X"), ("Z", "X"): (1j, "Y"),
         ("Y", "X"): (-1j, "Z"), ("Z", "Y"): (-1j, "X"), ("X", "Z"): (-1j, "Y")}
_PAULI_NP = {"X": np.array([[0, 1], [1, 0]], dtype=complex),
             "Y": np.array([[0, -1j], [1j, 0]], dtype=complex),
             "Z": np.array([[1, 0], [0, -1]], dtype=complex)}


@dataclass(frozen=True, eq=False)
class Factor:
    """A Pauli letter on one wire (``matrix`` None) or a Hermitian matrix on ``wires``."""

    wires: tuple
    kind: str  # "X" | "Y" | "Z" | "M"
    matrix: Optional[torch.Tensor] = None

    def key(self):
        return (self.wires, self.kind, None if self.matrix is None else id(self.matrix))

    def dense(self) -> torch.Tensor:
        if self.matrix is not None:
            return self.matrix.to(torch.complex128)
        return torch.tensor(_PAULI_NP[self.kind])

    def __repr__(self):
        if self.kind == "M":
            return f"Hermitian(wires={list(self.wires)})"
        return f"{self.kind}({self.wires[0]})"


def _mul_terms(a: tuple, b: tuple) -> tuple[complex, tuple]:
    """Product of two terms: (phase, term). Paulis on one wire multiply by the Pauli algebra;
    factors that share a wire with a dense factor multiply as matrices on the union of their
    wires (one dense factor)."""
    factors = list(a)
    phase = 1.0 + 0j
    for f in b:
        hit = [i for i, g in enumerate(factors) if set(g.wires) & set(f.wires)]
        if not hit:
            factors.append(f)
            continue
        g = factors[hit[0]]
        if g.kind != "M" and f.kind != "M":  # two Pauli letters on one wire
            if g.kind == f.kind:
                del factors[hit[0]]
            else:
                p, letter = _PMUL[(g.kind, f.kind)]
                phase *= p
                factors[hit[0]] = Factor(g.wires, letter)
            continue
        gs = [factors[i] for i in hit]
        order = [w for h in gs for w in h.wires]
        order += [w for w in f.wires if w not in order]
        memory.require(4 * 16.0 * 4.0 ** len(order), f"the product of observables on wires "
                       f"{order} ({len(order)}-qubit dense matrices)")
        prod = _term_dense(tuple(gs), order) @ _term_dense((f,), order)
        factors = [h for i, h in enumerate(factors) if i not in hit] + \
            [Factor(tuple(order), "M", prod)]
    return phase, tuple(sorted(factors, key=lambda f: str(f.wires[0])))


def _term_key(term: tuple) -> tuple:
    return tuple(f.key() for f in term)


def as_coeff_tensor(coeffs) -> torch.Tensor:
    """A 1-D coefficient tensor; plain (fit for a recorded circuit that later calls reuse)
    unless ``coeffs`` is a tensor that requires grad or comes from a torch.func transform."""
    if isinstance(coeffs, torch.Tensor):
        t = coeffs
        with (caches.constants() if is_concrete(t) and not t.requires_grad
              else contextlib.nullcontext()):
            if not (t.is_complex() or t.dtype.is_floating_point):
                t = t.to(torch.float64)
            return t.reshape(-1)
    if isinstance(coeffs, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in coeffs):
        return _stack_coeffs(coeffs)
    try:
        arr = np.asarray(coeffs)
        if arr.dtype.kind not in "biufc" and not all(
                isinstance(x, numbers.Number) for x in arr.reshape(-1).tolist()):
            raise TypeError
        if np.iscomplexobj(arr):
            arr = arr.astype(complex)
        else:
            arr = arr.astype(float)
    except (TypeError, ValueError):
        raise QdiffError(f"observable coefficients must be numbers; got {coeffs!r}") from None
    with caches.constants():
        if np.iscomplexobj(arr):
            return torch.tensor(arr.reshape(-1), dtype=torch.complex128)
        return torch.tensor(arr.reshape(-1), dtype=torch.float64)


def _stack_coeffs(items) -> torch.Tensor:
    """Coefficients given as a list holding tensors (``[c, 0.5]`` with ``c`` a trainable 0-d
    tensor): one 1-D tensor in the tensors' promoted dtype (complex where a number is), their
    autograd graph kept."""
    for x in items:
        if not isinstance(x, (numbers.Number, torch.Tensor)):
            raise QdiffError(f"observable coefficients must be numbers; got {list(items)!r}")
    scalars = [_scalar(x, "coefficient") if isinstance(x, torch.Tensor) else x for x in items]
    tensors = [x for x in scalars if isinstance(x, torch.Tensor)]
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    if any(isinstance(x, complex) for x in scalars):
        dtype = torch.promote_types(dtype, torch.complex64)
    device = tensors[0].device
    return torch.stack([torch.as_tensor(x, dtype=dtype, device=device) for x in scalars])


def _scalar(c, what: str) -> torch.Tensor:
    """A number or one-element tensor as a 0-d floating/complex tensor (python floats stay
    float64, not torch's default dtype); anything else, a batch of coefficients included, is
    refused."""
    if isinstance(c, bool) or not isinstance(c, (numbers.Number, torch.Tensor)):
        raise QdiffError(f"a number {what} must be a scalar; got {type(c).__name__}")
    if isinstance(c, numbers.Number):
        return torch.tensor(c, dtype=torch.complex128 if isinstance(c, complex) else torch.float64)
    if c.numel() != 1:
        raise QdiffError(f"a tensor {what} must have one element; got shape {tuple(c.shape)} "
                         "(an observable has one coefficient per term, not a batch)")
    c = c.reshape(())
    return c if (c.dtype.is_floating_point or c.is_complex()) else c.to(torch.float64)


def _number_array(x):
    """A one-element NumPy array of numbers (``np.array(2.5)``) as its Python number, which
    adds to an observable as it multiplies one; anything else as it is."""
    if isinstance(x, np.ndarray) and x.size == 1 and x.dtype.kind in "iufc":
        return x.item()
    return x


def check_finite(coeffs: torch.Tensor) -> None:
    """NaN or infinite coefficients would only turn every result into NaN: refuse them."""
    if coeffs.numel() and is_concrete(coeffs) and not bool(torch.isfinite(coeffs.detach()).all()):
        bad = [c for c in coeffs.detach().reshape(-1).tolist()
               if not (abs(c) < float("inf"))]
        raise QdiffError(f"observable coefficient {bad[0]} is NaN or infinite")


class Observable:
    """A linear combination of tensor-product terms.

    ``coeffs`` is a 1-D tensor (may require grad: expectations are then differentiable with
    respect to the coefficients); ``terms`` a tuple of factor tuples.
    """

    def __init__(self, coeffs, terms: Sequence[tuple], simplify: bool = True, check: bool = True):
        self.coeffs = as_coeff_tensor(coeffs)
        if check:  # off where the coefficients come unchanged from a checked observable
            check_finite(self.coeffs)
        self.terms = tuple(tuple(t) for t in terms)
        if len(self.terms) != self.coeffs.numel():
            raise QdiffError(f"Hamiltonian: {self.coeffs.numel()} coefficient(s) for "
                             f"{len(self.terms)} observable(s)")
        if simplify:
            self._merge()

    # -- construction helpers --------------------------------------------------------------
    _key = None  # a content key of observables built by ``pauli`` (lets a qnode reuse its circuit)

    @classmethod
    def pauli(cls, letter: str, wire) -> "Observable":
        obs = cls.__new__(cls)  # one term, coefficient 1: nothing to check or merge
        # (the coefficient tensor is made when first read: a qnode call that reuses its
        # recorded circuit never reads it)
        obs.terms = ((),) if letter == "I" else ((Factor((wire,), letter),),)
        try:
            obs._key = ("pauli", letter, wire, hash(wire))
        except TypeError:  # an unhashable wire label
            pass
        return obs

    def __getattr__(self, name):
        """Only reached when ``name`` is not set: the unit coefficient of a :meth:`pauli`
        observable, made on first use."""
        if name == "coeffs" and "terms" in self.__dict__:
            with caches.constants():  # the observable may outlive the call (recorded circuits)
                c = self.coeffs = torch.ones(1, dtype=torch.float64)
            return c
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def _merge(self):
        index: dict = {}
        pos = [index.setdefault(_term_key(t), len(index)) for t in self.terms]
        if len(index) < len(self.terms):
            idx = torch.tensor(pos, device=self.coeffs.device)
            merged = torch.zeros(len(index), dtype=self.coeffs.dtype, device=self.coeffs.device)
            self.coeffs = merged.index_add(0, idx, self.coeffs)
            first = {}
            for p, t in zip(pos, self.terms):
                first.setdefault(p, t)
            self.terms = tuple(first.values())
        self.__dict__["_index"] = index

    def _term_index(self) -> Optional[dict]:
        """``{term key: position}`` when the terms are distinct, else None. Kept on the
        observable (its terms never change): a sum built one term at a time,
        ``sum(c * P for ...)``, then keys each term once instead of at every addition."""
        d = self.__dict__
        if "_index" not in d:
            index: dict = {}
            for i, t in enumerate(self.terms):
                index.setdefault(_term_key(t), i)
            d["_index"] = index if len(index) == len(self.terms) else None
        return d["_index"]

    def _with_coeffs(self, coeffs) -> "Observable":
        """The same terms with new coefficients (already checked)."""
        out = Observable(coeffs, self.terms, simplify=False, check=False)
        if "_index" in self.__dict__:
            out.__dict__["_index"] = self.__dict__["_index"]
        return out

    def _extend(self, index: dict, a: torch.Tensor, other: "Observable",
                b: torch.Tensor) -> "Observable":
        """``self + other`` for ``self`` with distinct terms (``index``): ``other``'s terms are
        looked up in a copy of the index, so the work is a copy of ``self``, not a re-keying."""
        check_finite(b)
        index = dict(index)
        new_terms, pos = [], []
        for t in other.terms:
            k = _term_key(t)
            p = index.get(k)
            if p is None:
                p = index[k] = len(index)
                new_terms.append(t)
            pos.append(p)
        if len(new_terms) == len(other.terms):
            coeffs = torch.cat([a, b])
        else:
            coeffs = torch.cat([a, a.new_zeros(len(new_terms))]).index_add(
                0, torch.tensor(pos, device=a.device), b)
        out = Observable.__new__(Observable)
        out.coeffs, out.terms = coeffs, self.terms + tuple(new_terms)
        out.__dict__["_index"] = index
        return out

    def simplify(self, tol: float = 0.0) -> "Observable":
        """Drop terms whose coefficient magnitude is at most ``tol`` (like terms are already
        merged). Coefficients that require grad are all kept (a zero one still has a gradient):
        the observable is returned as it is."""
        if self.coeffs.requires_grad:
            return self
        keep = [i for i in range(len(self.terms)) if abs(complex(self.coeffs[i])) > tol]
        return Observable(self.coeffs[keep], [self.terms[i] for i in keep], simplify=False)

    # -- properties ------------------------------------------------------------------------
    @property
    def wires(self) -> tuple:
        seen = []
        for t in self.terms:
            for f in t:
                for w in f.wires:
                    if w not in seen:
                        seen.append(w)
        return tuple(seen)

    @property
    def is_pauli(self) -> bool:
        return all(f.kind != "M" for t in self.terms for f in t)

    def pauli_words(self) -> list[dict]:
        """Each term as ``{wire: letter}`` (Pauli observables only)."""
        if not self.is_pauli:
            raise QdiffError("observable is not a Pauli sum")
        return [{f.wires[0]: f.kind for f in t} for t in self.terms]

    def check_hermitian(self, atol: float = 1e-10) -> None:
        if self.coeffs.is_complex() and self.coeffs.numel() and float(plain_values(self.coeffs).imag.abs().max()) > atol:
            raise QdiffError(f"observable {self!r} is not Hermitian (complex coefficients)")
        for t in self.terms:
            for f in t:
                if f.kind == "M":
                    m = plain_values(f.matrix)
                    if not torch.allclose(m, m.conj().transpose(-1, -2), atol=1e-8):
                        raise QdiffError(f"observable on wires {list(f.wires)} is not Hermitian")

    @property
    def has_trainable_matrix(self) -> bool:
        """Whether a matrix factor (``Hermitian``) requires grad."""
        if self._key is not None:  # a Pauli letter (built by ``pauli``): no matrix
            return False
        return any(f.kind == "M" and isinstance(f.matrix, torch.Tensor) and f.matrix.requires_grad
                   for t in self.terms for f in t)

    def real_coeffs(self) -> torch.Tensor:
        return self.coeffs.real if self.coeffs.is_complex() else self.coeffs

    def map_wires(self, mapping: dict) -> "Observable":
        def mf(f):
            try:
                return Factor(tuple(mapping[w] for w in f.wires), f.kind, f.matrix)
            except KeyError as e:
                raise QdiffError(f"observable acts on wire {e.args[0]!r}, which the device does "
                                 f"not have (device wires: {list(mapping)})") from None
        return Observable(self.coeffs, [tuple(mf(f) for f in t) for t in self.terms],
                          simplify=False, check=False)

    def matrix(self, wire_order: Optional[Sequence] = None) -> torch.Tensor:
        """Dense ``(2**n, 2**n)`` complex128 matrix in ``wire_order`` (default: own wires)."""
        order = list(self.wires if wire_order is None else wire_order)
        n = len(order)
        if len(set(order)) != n:
            raise QdiffError(f"matrix: wire_order {order} repeats a wire")
        # the sum, one term's Kronecker product and its permuted copy
        memory.require(3 * 16.0 * 4.0 ** n, f"the dense {n}-qubit matrix of an observable "
                       f"({2.0 ** n:.0f}x{2.0 ** n:.0f} complex128)")
        total = torch.zeros(2 ** n, 2 ** n, dtype=torch.complex128)
        for c, t in zip(self.coeffs.to(torch.complex128), self.terms):
            total = total + c * _term_dense(t, order)
        return total

    def eigvals(self) -> torch.Tensor:
        """Eigenvalues of :meth:`matrix`: real and ascending for a Hermitian observable;
        complex (``torch.linalg.eigvals``) for one that is not, such as ``qd.X(0) @ qd.Y(0)``
        (``1j * Z(0)``: ``[1j, -1j]``), as PennyLane's ``qml.eigvals``."""
        m = self.matrix()
        md = m.detach()
        if torch.allclose(md, md.conj().transpose(0, 1), atol=1e-8):  # Hermitian()'s check
            return torch.linalg.eigvalsh(m)
        return torch.linalg.eigvals(m)

    # -- arithmetic ------------------------------------------------------------------------
    def __matmul__(self, other):
        other = as_observable(other)
        coeffs, terms = [], []
        for i, a in enumerate(self.terms):
            for j, b in enumerate(other.terms):
                phase, t = _mul_terms(a, b)
                coeffs.append(self.coeffs[i] * other.coeffs[j] * (phase if phase != 1 else 1.0))
                terms.append(t)
        return Observable(torch.stack([torch.as_tensor(c) for c in coeffs]), terms)

    def __rmatmul__(self, other):
        return as_observable(other) @ self

    def __add__(self, other):
        other = _number_array(other)
        if isinstance(other, numbers.Number) and other == 0 and not isinstance(other, bool):
            return self  # sum([...]) starts from 0: no identity term
        if isinstance(other, numbers.Number) or (isinstance(other, torch.Tensor)
                                                 and other.numel() == 1):
            other = Observable(_scalar(other, "added to an observable").reshape(1), [()])
        other = as_observable(other)
        a, b = self.coeffs, other.coeffs
        dt = torch.promote_types(a.dtype, b.dtype)
        index = self._term_index()
        if index is not None and a.device == b.device:
            return self._extend(index, a.to(dt), other, b.to(dt))
        return Observable(torch.cat([a.to(dt), b.to(dt)]), self.terms + other.terms)

    __radd__ = __add__

    def __neg__(self):
        return self._with_coeffs(-self.coeffs)

    def __sub__(self, other):
        other = _number_array(other)
        if isinstance(other, numbers.Number) and not isinstance(other, bool):
            return self + -other
        if isinstance(other, (bool, torch.Tensor)):
            return self + -_scalar(other, "subtracted from an observable")
        return self + -as_observable(other)

    def __rsub__(self, other):
        return (-self) + other

    def __mul__(self, c):
        if isinstance(c, (numbers.Number, torch.Tensor)):
            coeffs = self.coeffs * _scalar(c, "multiplying an observable")
            check_finite(coeffs)
            return self._with_coeffs(coeffs)
        return NotImplemented

    __rmul__ = __mul__

    def __truediv__(self, c):
        if isinstance(c, (numbers.Number, torch.Tensor)):
            return self * (1.0 / _scalar(c, "dividing an observable"))
        return NotImplemented

    def __pow__(self, k):
        """``H ** k`` for an integer ``k >= 0`` (``H @ H @ ...``; ``H ** 0`` is the identity)."""
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
            return NotImplemented
        out = Observable([1.0], [()])
        for _ in range(int(k)):
            out = out @ self
        return out

    def __repr__(self):
        parts = []
        for c, t in zip(self.coeffs.detach().tolist(), self.terms):
            body = " @ ".join(repr(f) for f in t) if t else "I"
            parts.append(f"{c:.6g} * {body}" if not isinstance(c, complex) else f"({c:.6g}) * {body}")
        return " + ".join(parts) if parts else "0"


@caches.cached(maxsize=None)
def _eye(n):
    return torch.eye(2 ** n, dtype=torch.complex128)


def _term_dense(term: tuple, order: list) -> torch.Tensor:
    """Dense matrix of one term on ``order`` by permuting a kron of its factors."""
    n = len(order)
    mats, wires = [], []
    for f in term:
        mats.append(f.dense())
        wires.extend(f.wires)
    rest = [w for w in order if w not in wires]
    missing = [w for w in wires if w not in order]
    if missing:
        raise QdiffError(f"observable acts on wire(s) {missing} outside the wire order {order}")
    full = torch.ones(1, 1, dtype=torch.complex128)
    for m in mats:
        full = torch.kron(full, m)
    full = torch.kron(full, _eye(len(rest)))
    cur = wires + rest
    perm = [cur.index(w) for w in order]
    t = full.reshape([2] * (2 * n))
    t = t.permute(perm + [n + p for p in perm])
    return t.reshape(2 ** n, 2 ** n)


def Hermitian(A, wires) -> Observable:
    """A Hermitian matrix observable on ``wires`` (checked)."""
    try:
        m = A if isinstance(A, torch.Tensor) else torch.as_tensor(np.asarray(A))
    except (TypeError, ValueError, RuntimeError):
        raise QdiffError(f"Hermitian: the matrix must be a square array of numbers; got "
                         f"{type(A).__name__} {A!r:.60}") from None
    wires = normalize_wires(wires)
    if len(set(wires)) != len(wires):
        raise QdiffError(f"Hermitian: repeated wire in {list(wires)}")
    d = 2 ** len(wires)
    if tuple(m.shape) != (d, d):
        raise QdiffError(f"Hermitian: a matrix on {len(wires)} wire(s) must be {d}x{d}; got "
                         f"shape {tuple(m.shape)}")
    # the complex128 copy and the comparison with its conjugate transpose: three matrices
    memory.require(3 * 16.0 * d * d, f"Hermitian: the {d}x{d} matrix in complex128 and its "
                   "check", m.device)
    try:
        m = m.to(torch.complex128)
    except (TypeError, RuntimeError):
        raise QdiffError(f"Hermitian: the matrix must be an array of numbers; got dtype "
                         f"{m.dtype}") from None
    v = plain_values(m)  # every slice of a vmapped matrix
    if not torch.allclose(v, v.conj().transpose(-1, -2), atol=1e-8):
        raise QdiffError(f"Hermitian: the matrix on wires {list(wires)} is not Hermitian")
    return Observable([1.0], [(Factor(wires, "M", m),)])


#: wires of the one dense matrix that a sampled observable whose terms do not share an
#: eigenbasis wire by wire (``Hadamard``, ``Z0 + X0``) is read out in (its eigendecomposition)
DENSE_SAMPLE_WIRES = 12


def qubitwise_commuting(obs: Observable) -> bool:
    """Whether the terms of ``obs`` are Pauli words that agree on every wire they share (one
    measurement basis serves them all), or ``obs`` has a single term."""
    if len(obs.terms) == 1:
        return True
    letters: dict = {}
    for term in obs.terms:
        for f in term:
            if f.kind == "M" or letters.setdefault(f.wires[0], f.kind) != f.kind:
                return False
    return True


def one_term(obs: Observable, what: str, shared: bool = True) -> Observable:
    """``obs`` read out in one basis: itself when it has one term, or (``shared``) when its
    terms share a basis wire by wire, else ONE term, the Hermitian of its dense matrix on its
    wires (as PennyLane samples a sum by its eigendecomposition), at most
    :data:`DENSE_SAMPLE_WIRES` wires."""
    if len(obs.terms) == 1 or (shared and qubitwise_commuting(obs)):
        return obs
    k = len(obs.wires)
    if k > DENSE_SAMPLE_WIRES:
        raise QdiffError(f"{what} with shots of an observable whose terms do not commute wire "
                         f"by wire is read out in the eigenbasis of its dense matrix, at most "
                         f"{DENSE_SAMPLE_WIRES} wires; this one acts on {k}: measure the terms "
                         f"separately")
    return Hermitian(obs.matrix().detach(), obs.wires)


def Hamiltonian(coeffs, observables) -> Observable:
    """``sum_i coeffs[i] * observables[i]``, like terms merged.

    >>> import qdiff as qd
    >>> qd.Hamiltonian([0.5, 0.5], [qd.Z(0), qd.Z(0)])
    1 * Z(0)
    """
    if isinstance(observables, (Observable, Operation, str)) or \
            recording.is_pennylane(observables) or not hasattr(observables, "__iter__"):
        raise QdiffError(f"Hamiltonian: observables must be a list of observables; got "
                         f"{type(observables).__name__} (write qd.Hamiltonian([c], [obs]))")
    obs = [as_observable(o) for o in observables]
    c = as_coeff_tensor(coeffs)
    if c.numel() != len(obs):
        raise QdiffError(f"Hamiltonian: {c.numel()} coefficient(s) for {len(obs)} observable(s)")
    if not obs:
        return Observable(c, [])
    # one tensor operation for all terms (a product per term would give the backward pass a
    # full-length gradient per term: quadratic in the number of terms)
    inner = torch.cat([o.coeffs.reshape(-1) for o in obs]).to(c.device)
    counts = [len(o.terms) for o in obs]
    dt = torch.promote_types(c.dtype, inner.dtype)
    if len(inner) == len(obs) and is_concrete(inner) and not inner.requires_grad and \
            bool((inner == 1).all()):
        # unit terms (qd.Z(0) @ qd.X(1), ...): the coefficient tensor itself, in its own
        # real dtype, so an optimizer's in-place update of it reaches the observable
        all_c = c if c.dtype.is_floating_point and not dt.is_complex else c.to(dt)
    else:
        all_c = c.to(dt).repeat_interleave(torch.tensor(counts, device=c.device)) * inner.to(dt)
    return Observable(all_c, [t for o in obs for t in o.terms])


_OP_OBS = {"x": "X", "y": "Y", "z": "Z", "id": "I"}


def observable_from_op(op: Operation) -> Observable:
    """``qd.Z(0)`` used as an observable; removes it from the active recording."""
    recording.consume(op)
    name = op.gate.name
    if name in _OP_OBS:
        return Observable.pauli(_OP_OBS[name], op.wires[0])
    if name == "h":
        s = 1 / np.sqrt(2)
        return Observable([s, s], [(Factor(op.wires, "X"),), (Factor(op.wires, "Z"),)])
    raise QdiffError(f"gate '{op.gate.pl_name or name}' cannot be used as an observable "
                     "(use qd.Hermitian for a general matrix)")


set_observable_conversion(observable_from_op)


_FROM_PENNYLANE = None


def set_pennylane_conversion(fn) -> None:
    """Install ``fn(pennylane_operator) -> Observable`` (done by
    :mod:`qdiff.circuits.pennylane_io` on import)."""
    global _FROM_PENNYLANE
    _FROM_PENNYLANE = fn


def as_observable(obj) -> Observable:
    if isinstance(obj, Observable):
        return obj
    if isinstance(obj, Operation):
        return observable_from_op(obj)
    if recording.is_pennylane(obj):
        # a PennyLane operator: converted (and taken off the recording, where PennyLane's
        # queuing put it) by qdiff.circuits.pennylane_io.from_pennylane_observable, which that
        # module installs here when it is imported (PennyLane is, since obj is its object)
        if _FROM_PENNYLANE is None:  # the converter builds on this module: loaded by name
            importlib.import_module("qdiff.circuits.pennylane_io")  # (it installs itself)
        if _FROM_PENNYLANE is None:
            raise QdiffError(f"expected a qdiff observable, got PennyLane's "
                             f"{type(obj).__name__}; convert it with qdiff.circuits."
                             "pennylane_io.from_pennylane_observable")
        try:
            obs = _FROM_PENNYLANE(obj)
        except QdiffError as e:
            raise QdiffError(f"{e}; convert it with qdiff.circuits.pennylane_io."
                             "from_pennylane_observable or build it from qd.X/qd.Y/qd.Z/"
                             "qd.Hermitian") from None
        recording.consume(obj)
        return obs
    raise QdiffError(f"expected an observable (qd.Z(0), a product/sum of them, qd.Hermitian, "
                     f"or a PennyLane observable), got {type(obj).__name__}")
