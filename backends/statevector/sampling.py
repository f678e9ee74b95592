"""The shot measurements of one run, read from ONE draw per measurement basis.

Every sampled measurement names the bases it reads: ``probs``/``sample``/``counts`` of wires
and Z words read the computational basis, ``expval`` each term of its observable in the
term's eigenbasis, ``var``/``sample``/``counts`` of an observable the basis shared by its
terms (:func:`shared_basis`). Bases that agree on every
wire they share (qubit-wise commuting Pauli words, the same Hermitian factor, a diagonal
Hermitian as the computational basis) form one group; each group's wires are rotated into
their eigenbasis and drawn once, ``shots`` outcomes per binding, and every measurement of the
group reads its values off the same bit strings (``expval(Z0)`` is ``1 - 2 * mean`` of
``sample(wires=0)``, ``probs`` the normalised ``counts``, as PennyLane's ``default.qubit``
reads a group of measurements that share a basis).

>>> import qdiff as qd, torch
>>> dev = qd.device("statevector", wires=1, shots=100, seed=1)
>>> @qd.qnode(dev)
... def f(x):
...     qd.RX(x, 0)
...     return qd.expval(qd.Z(0)), qd.sample(wires=0)
>>> e, s = f(torch.tensor(0.5, dtype=torch.float64))
>>> bool(e == 1 - 2 * s.double().mean())
True
"""
from __future__ import annotations

import torch

from qdiff.circuits.gates import GATES
from qdiff.circuits.observables import Factor, Observable, one_term

_COMPUTATIONAL = "Z"  # the label of a wire read in the computational basis
#: the measurements a run with shots samples
SAMPLED = ("expval", "var", "probs", "sample", "counts")


def is_diagonal(f: Factor) -> bool:
    """A Hermitian factor diagonal in the computational basis (a mid-circuit measurement's
    projector): read there, its eigenvalues its diagonal."""
    m = f.matrix
    return bool(torch.count_nonzero(m) == torch.count_nonzero(torch.diagonal(m)))


def term_basis(term: tuple):
    """Basis change and eigenvalues of one term: ``(ops, wires, eigvals (2**k,))``.

    ``ops`` is a list of ``(wires, matrix)`` that rotates the term's eigenbasis onto the
    computational basis (none for Z and diagonal Hermitian factors; a Hermitian factor's
    eigenvalues in descending order, so its largest is read as all zeros).
    """
    ops, wires, eig = [], [], torch.ones(1, dtype=torch.float64)
    for f in term:
        if f.kind == "M":
            if is_diagonal(f):
                e = torch.diagonal(f.matrix.detach()).real.to(torch.float64)
            else:  # eigenvalues descending: the largest read as all zeros (as +1 of a Pauli
                # word, and Hadamard's RY(-pi/4)), which is where readout errors act
                vals, vecs = torch.linalg.eigh(f.matrix.to(torch.complex128))
                vals, vecs = vals.flip(0), vecs.flip(1)
                ops.append((f.wires, vecs.conj().T))
                e = vals
        else:
            if f.kind == "X":
                ops.append((f.wires, GATES["h"].matrix()))
            elif f.kind == "Y":
                ops.append((f.wires, GATES["h"].matrix() @ GATES["sdg"].matrix()))
            e = torch.tensor([1.0, -1.0], dtype=torch.float64)
        wires.extend(f.wires)
        eig = torch.kron(eig, e)
    return ops, wires, eig


def shared_basis(obs: Observable, what: str) -> tuple:
    """One term measuring every term of ``obs`` at once: its factors, one per wire, when the
    terms are Pauli words that agree on each wire they share (qubit-wise commuting, as
    ``Z0 + Z0 @ X1``), or a one-term observable itself; else (``Hadamard``, ``Z0 + X0``) one
    Hermitian factor, the dense matrix of ``obs`` on its wires (:func:`one_term`; ``what``
    names the measurement in the error when that is too wide)."""
    one = one_term(obs, what)
    if len(one.terms) == 1:
        return one.terms[0]
    factors = {}
    for term in obs.terms:
        for f in term:
            factors.setdefault(f.wires[0], f)
    return tuple(factors.values())


def _label(f: Factor):
    """The basis ``f`` is read in on each of its wires: ``"Z"``, ``"X"``, ``"Y"`` or the
    (non-diagonal) Hermitian factor itself."""
    if f.kind != "M":
        return f.kind
    return _COMPUTATIONAL if is_diagonal(f) else f


def _same(a, b) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return a is b or (a.wires == b.wires and a.matrix.shape == b.matrix.shape and
                      bool(torch.equal(a.matrix, b.matrix)))


class _Group:
    """Wires read together in one basis (``labels``: wire -> basis label), drawn once."""

    def __init__(self, readout: bool):
        self.labels: dict = {}
        self.readout = readout
        self.words = 3
        self.idx = None
        self.wires: list = []

    def takes(self, labels: dict, readout: bool) -> bool:
        return readout == self.readout and all(
            w not in self.labels or _same(self.labels[w], lab) for w, lab in labels.items())

    def factors(self) -> list:
        """The factors to rotate into their eigenbasis: ``(wires, label)``, once each."""
        seen, out = set(), []
        for w, lab in self.labels.items():
            if isinstance(lab, str):
                if lab != _COMPUTATIONAL:
                    out.append(((w,), lab))
            elif id(lab) not in seen:
                seen.add(id(lab))
                out.append((lab.wires, lab))
        return out


class ShotPlan:
    """The groups of one run's sampled measurements and the reads each makes.

    ``distribution(ops, wires, readout)``: the engine's outcome probabilities ``(B, 2**k)``
    of ``wires`` (sorted) after the basis changes ``ops`` (``(wires, matrix)`` pairs of
    :func:`term_basis`), through the readout errors when
    ``readout``; ``draw(p, shots, generator, words)`` the engine's sampler
    (:func:`~qdiff.circuits.measurements.sample_indices`). ``dtype``: the real dtype of the
    values."""

    def __init__(self, batch: int, shots: int, generator, distribution, draw, dtype, device):
        self.batch, self.shots, self.generator = batch, shots, generator
        self.distribution, self.draw = distribution, draw
        self.dtype, self.device = dtype, device
        self.groups: list = []
        self._bases: dict = {}

    def basis(self, term: tuple):
        """:func:`term_basis` of ``term``, once per run."""
        key = tuple(id(f) for f in term)
        if key not in self._bases:
            self._bases[key] = (term, term_basis(term))
        return self._bases[key][1]

    def read(self, basis: tuple, readout: bool = False, words: int = 3):
        """Register a read of ``basis`` (a term: factors on distinct wires); returns the
        handle :meth:`outcomes`, :meth:`bits` and :meth:`values` take, once every read of
        the run is registered."""
        labels = {}
        for f in basis:
            lab = _label(f)
            for w in f.wires:
                labels[w] = lab
        if not labels:
            return None, basis
        g = next((g for g in self.groups if g.takes(labels, readout)), None)
        if g is None:
            g = _Group(readout)
            self.groups.append(g)
        g.labels.update(labels)
        g.words = max(g.words, words)
        return g, basis

    def _drawn(self, g: _Group) -> torch.Tensor:
        if g.idx is None:
            g.wires = sorted(g.labels)
            ops = []
            for wires, lab in g.factors():
                f = Factor(wires, lab) if isinstance(lab, str) else lab
                ops.extend(self.basis((f,))[0])
            p = self.distribution(ops, g.wires, g.readout)
            g.idx = self.draw(p, self.shots, self.generator, words=g.words)
        return g.idx

    def outcomes(self, handle, wires) -> torch.Tensor:
        """``(B, shots)`` int64: each shot's outcome index on ``wires`` (first wire most
        significant), from the group's one draw."""
        g, _ = handle
        if g is None:
            return torch.zeros(self.batch, self.shots, dtype=torch.int64, device=self.device)
        idx = self._drawn(g)
        wires = list(wires)
        if wires == g.wires:
            return idx
        k, pos = len(g.wires), {w: i for i, w in enumerate(g.wires)}
        out = torch.zeros_like(idx)
        for j, w in enumerate(wires):
            out |= ((idx >> (k - 1 - pos[w])) & 1) << (len(wires) - 1 - j)
        return out

    def bits(self, handle, wires) -> torch.Tensor:
        """``(B, shots, k)`` int64 bits of ``wires`` (wire order)."""
        g, _ = handle
        if g is None:  # no wires: nothing drawn, no bits
            return torch.zeros(self.batch, self.shots, 0, dtype=torch.int64, device=self.device)
        idx = self._drawn(g)
        k, pos = len(g.wires), {w: i for i, w in enumerate(g.wires)}
        shifts = torch.tensor([k - 1 - pos[w] for w in wires], device=idx.device)
        return (idx.unsqueeze(-1) >> shifts) & 1

    def eigvals(self, handle) -> torch.Tensor:
        """``(B, shots)``: the eigenvalue of the read term on each shot."""
        _, wires, eig = self.basis(handle[1])
        return eig.to(device=self.device, dtype=self.dtype)[self.outcomes(handle, wires)]

    def values(self, handle, obs: Observable) -> torch.Tensor:
        """``(B, shots)`` values of ``obs`` read in the read basis (:func:`shared_basis`):
        ``sum_t c_t * prod_{w in t} (+-1)``, or the basis's eigenvalue (coefficients
        included) when ``obs`` has one term or one Hermitian factor measures its terms."""
        basis = handle[1]
        # the coefficients as tensors: a var() of trainable ones keeps their derivative
        coeffs = obs.real_coeffs().to(device=self.device, dtype=self.dtype)
        if len(obs.terms) == 1 or (len(basis) == 1 and basis[0].kind == "M"):
            return self.eigvals(handle) * (coeffs[0] if len(obs.terms) == 1 else 1.0)
        _, wires, _ = self.basis(basis)
        idx = self.outcomes(handle, wires)
        pos = {w: j for j, w in enumerate(wires)}
        k = len(wires)
        out = torch.zeros(idx.shape, dtype=self.dtype, device=idx.device)
        for c, term in zip(coeffs, obs.terms):
            sign = torch.ones(idx.shape, dtype=self.dtype, device=idx.device)
            for f in term:
                sign = sign * (1 - 2 * ((idx >> (k - 1 - pos[f.wires[0]])) & 1)).to(self.dtype)
            out = out + c * sign
        return out


def _z_basis(wires) -> tuple:
    return tuple(Factor((w,), "Z") for w in wires)


def measure_shots(plan: ShotPlan, measurements, n: int, readout: bool = False) -> dict:
    """``{i: tensor}`` for each sampled measurement (expval, var, probs, sample, counts) of
    ``measurements``, every one read off its basis group's one draw. ``readout``: the
    engine's outcomes pass through readout errors (probs, sample and counts read them;
    expval and var are of the state, drawn apart)."""
    reads = {}
    for i, m in enumerate(measurements):
        if m.kind == "expval":
            reads[i] = [plan.read(t) for t in m.obs.terms]
        elif m.kind == "var":
            reads[i] = plan.read(shared_basis(m.obs, "var()"))
        elif m.kind in ("probs", "sample", "counts"):
            if m.obs is not None:
                reads[i] = plan.read(shared_basis(m.obs, "sample(op)"), readout)
            else:
                wires = list(range(n)) if m.wires is None else list(m.wires)
                reads[i] = plan.read(_z_basis(wires), readout, words=len(wires) + 1)
    out = {}
    for i, h in reads.items():
        m = measurements[i]
        if m.kind == "expval":
            coeffs = m.obs.real_coeffs().to(device=plan.device, dtype=plan.dtype)
            means = [plan.eigvals(r).mean(-1) for r in h]
            means = torch.stack(means, -1) if means else \
                torch.zeros(plan.batch, 0, dtype=plan.dtype, device=plan.device)
            out[i] = means @ coeffs
        elif m.kind == "var" or m.obs is not None:
            vals = plan.values(h, m.obs)
            out[i] = vals.pow(2).mean(-1) - vals.mean(-1) ** 2 if m.kind == "var" else \
                vals.detach()  # samples carry no gradient
        else:
            wires = list(range(n)) if m.wires is None else list(m.wires)
            if m.kind == "probs":
                idx = plan.outcomes(h, wires)
                p = torch.zeros(plan.batch, 2 ** len(wires), dtype=plan.dtype,
                                device=idx.device)
                out[i] = p.scatter_add_(1, idx, torch.ones_like(idx, dtype=plan.dtype)) / plan.shots
            else:
                out[i] = plan.bits(h, wires)
    return out
