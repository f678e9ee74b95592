"""Templates and ansatzes, with PennyLane's names, argument orders and conventions.

Every template records its gates into the active recording and keeps them in ``.operations``;
weights may carry leading batch dimensions (``weights[..., l, i, j]``), which broadcast.

>>> import torch, qdiff as qd
>>> qd.StronglyEntanglingLayers.shape(n_layers=2, n_wires=4)
(2, 4, 3)
"""
from __future__ import annotations

import abc
import inspect
import numbers

from typing import Optional, Sequence

import numpy as np
import torch

from qdiff.circuits import caches, memory
from qdiff.circuits import gates as G
from qdiff.circuits import recording
from qdiff.circuits.circuit import StatePrep as _StatePrepItem
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.observables import as_observable
from qdiff.circuits.operation import (BlockStructure, OpBlock, Operation, ParamRef, normalize_wires,
                                      plain_values)


def _tensor(x, who: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x if (x.dtype.is_floating_point or x.is_complex()) else x.to(torch.float64)
    a = _numbers(x, who)  # complex amplitudes stay complex (angles refuse them by name)
    return torch.as_tensor(a.astype(complex if np.iscomplexobj(a) else float))


def _numbers(x, who: str) -> np.ndarray:
    """``x`` as a numeric array (an object array of numbers by their own types); strings
    ("0.3") and other objects are refused, never parsed."""
    try:
        a = np.asarray(x)
        if a.dtype == object and all(isinstance(v, numbers.Number)
                                     for v in a.reshape(-1).tolist()):
            a = np.array(a.tolist())
    except (TypeError, ValueError):
        a = None
    if a is None or a.dtype.kind not in "biufc":
        raise QdiffError(f"{who}: expected numbers or a tensor; got "
                         f"{type(x).__name__}" + (f" of {a.dtype}" if a is not None else ""))
    return a


def _check_tail(name: str, w: torch.Tensor, expected: tuple) -> None:
    k = len(expected)
    if w.ndim < k or tuple(w.shape[w.ndim - k:]) != tuple(expected):
        raise QdiffError(f"{name}: weights must have shape (..., {', '.join(map(str, expected))}); "
                         f"got {tuple(w.shape)}")


def _real_angles(name: str, t: torch.Tensor) -> None:
    if t.is_complex():
        raise QdiffError(f"{name}: angles must be real, got a complex tensor")


def _distinct(name: str, wires: tuple) -> None:
    if len(set(wires)) != len(wires):
        raise QdiffError(f"{name}: repeated wire in {list(wires)}")


def _emit(gate, wires: tuple, params: tuple = ()) -> None:
    """Record an operation whose wires and angles the template has already validated (the
    checks of ``Gate.__call__`` cost more than the rest of recording in large templates)."""
    recording.active().append(Operation(gate, wires, params))


class Template(abc.ABC):
    """Base: subclasses implement ``_build`` (gate calls); ``__init__`` records them.

    A subclass may also implement ``_block`` returning an :class:`OpBlock` (all its angles drawn
    from one tensor, structure cached per signature) or ``None`` for the general path: a qnode
    then records the template as one item, and ``.operations`` expands it on demand."""

    def __init__(self, *args, id=None, **kwargs):
        if id is not None and not isinstance(id, str):
            raise QdiffError(f"{type(self).__name__}: id must be a string label (PennyLane's "
                             f"id=); got {id!r}")
        if kwargs:
            names = _keywords(type(self))
            for k in kwargs:
                if k not in names:
                    raise QdiffError(f"{type(self).__name__}: unknown keyword {k!r}; valid "
                                     f"keywords: {', '.join(sorted(names | {'id'}))}")
        try:
            block = self._block(*args, **kwargs)
        except TypeError:
            _check_call(self, args, kwargs)  # a missing or extra argument: named
            raise
        if block is not None:
            parent = recording.active()
            if parent is not None:
                parent.append(block)
            self._block_item, self._items = block, None
            return
        with recording.record() as rec:
            try:
                self._build(*args, **kwargs)
            except TypeError:
                _check_call(self, args, kwargs)
                raise
        parent = recording.active()
        if parent is not None:
            for item in rec.raw:
                parent.append(item)
        self._block_item, self._items = None, rec.items

    def _block(self, *args, **kwargs) -> Optional[OpBlock]:
        return None

    @property
    def items(self) -> list:
        if self._items is None:
            self._items = self._block_item.operations()
        return self._items

    @property
    def operations(self) -> list:
        return [i for i in self.items if not isinstance(i, _StatePrepItem)]

    @abc.abstractmethod
    def _build(self, *args, **kwargs):
        """Record the template's gates (subclasses)."""

    def __repr__(self):
        return f"{type(self).__name__}({len(self.items)} operations)"


_KEYWORDS: dict = {}  # template class -> the keyword names of its _build


def _keywords(cls) -> frozenset:
    names = _KEYWORDS.get(cls)
    if names is None:
        names = _KEYWORDS[cls] = frozenset(
            n for n, p in inspect.signature(cls._build).parameters.items()
            if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return names


def _check_call(template, args: tuple, kwargs: dict) -> None:
    """Raise a :class:`QdiffError` naming the template when ``args``/``kwargs`` do not fit its
    signature (a missing or surplus argument)."""
    try:
        inspect.signature(template._build).bind(*args, **kwargs)
    except TypeError as e:
        raise QdiffError(f"{type(template).__name__}: {e}") from None


_STRUCTURES: dict = caches.register("templates.structures", {})  # signature -> BlockStructure (templates are few; signatures are small)


def _structure(key: tuple, build) -> BlockStructure:
    try:
        st = _STRUCTURES.get(key)
    except TypeError:  # unhashable wire labels: no cache
        return build()
    if st is None:
        if len(_STRUCTURES) > 4096:
            _STRUCTURES.clear()
        st = _STRUCTURES[key] = build()
    return st


class AngleEmbedding(Template):
    """Features ``(..., N)`` as rotation angles on the first N wires (``rotation`` X, Y or Z)."""

    @staticmethod
    def _checked(features, wires, rotation):
        wires = normalize_wires(wires)
        f = _tensor(features, "AngleEmbedding")
        if f.ndim == 0 or f.shape[-1] > len(wires):
            raise QdiffError(f"AngleEmbedding: features of shape {tuple(f.shape)} need at most "
                             f"{len(wires)} entries in the last dimension (one per wire)")
        gate = {"X": G.GATES["rx"], "Y": G.GATES["ry"], "Z": G.GATES["rz"]}.get(str(rotation).upper())
        if gate is None:
            raise QdiffError(f"AngleEmbedding: rotation must be 'X', 'Y' or 'Z'; got {rotation!r}")
        _real_angles("AngleEmbedding", f)
        _distinct("AngleEmbedding", wires)
        return f, wires, gate

    def _block(self, features, wires, rotation="X"):
        f, wires, gate = self._checked(features, wires, rotation)
        m = f.shape[-1]

        def build():
            ops = tuple(Operation(gate, (wires[i],), (ParamRef(i),)) for i in range(m))
            return BlockStructure(ops, (m,), m)
        return OpBlock(_structure(("AngleEmbedding", gate, m, wires), build), f)

    def _build(self, features, wires, rotation="X"):
        f, wires, gate = self._checked(features, wires, rotation)
        for i in range(f.shape[-1]):
            _emit(gate, (wires[i],), (f[..., i],))


class AmplitudeEmbedding(Template):
    """Features ``(..., 2**k)`` as the amplitudes of the state on ``wires`` (must come first)."""

    def _build(self, features, wires, pad_with=None, normalize=False, validate_norm=True):
        if not isinstance(validate_norm, (bool, np.bool_)):
            raise QdiffError(f"{type(self).__name__}: validate_norm must be True or False; got "
                             f"{validate_norm!r}")
        wires = normalize_wires(wires)
        _distinct("AmplitudeEmbedding", wires)
        f = _tensor(features, type(self).__name__)
        d = 2 ** len(wires)
        if f.ndim == 0 or f.shape[-1] > d or (f.shape[-1] < d and pad_with is None):
            n = f.shape[-1] if f.ndim else 1
            raise QdiffError(f"AmplitudeEmbedding: {n} features for {len(wires)} wires "
                             f"(expected {d}{', or fewer with pad_with' if n < d else ''})")
        if not bool(torch.isfinite(plain_values(f)).all()):
            raise QdiffError("AmplitudeEmbedding: features must be finite (NaN or infinite "
                             "entries)")
        f = f.to(torch.complex128 if f.dtype != torch.complex64 else f.dtype)
        if f.shape[-1] < d:
            pad = _pad_value(pad_with)
            memory.require(16.0 * d * max(1, f[..., 0].numel()),
                           f"AmplitudeEmbedding: padding {f.shape[-1]} features to the "
                           f"{d} amplitudes of {len(wires)} wires", f.device)
            pad = torch.full((*f.shape[:-1], d - f.shape[-1]), pad, dtype=f.dtype,
                             device=f.device)
            f = torch.cat([f, pad], dim=-1)
        norm = torch.linalg.vector_norm(f, dim=-1, keepdim=True)
        values = plain_values(norm)  # every slice of a vmapped input
        if normalize:
            if bool((values == 0).any()):
                raise QdiffError("AmplitudeEmbedding: cannot normalize a zero feature vector")
            f = f / norm
        elif not torch.allclose(values, torch.ones_like(values), atol=1e-7):
            raise QdiffError(f"{type(self).__name__}: features must be normalized (norm 1 to "
                             f"1e-7, checked whatever validate_norm says), or pass "
                             f"normalize=True")
        rec = recording.active()
        rec.append(_StatePrepItem(f, wires))


def _pad_value(pad_with) -> complex:
    """``pad_with`` of AmplitudeEmbedding as a number: real or complex, finite."""
    if isinstance(pad_with, torch.Tensor) and pad_with.numel() == 1:
        pad_with = pad_with.detach().reshape(()).item()
    elif isinstance(pad_with, np.ndarray) and pad_with.size == 1:
        pad_with = pad_with.reshape(()).item()
    if isinstance(pad_with, bool) or not isinstance(pad_with, numbers.Number) or \
            not np.isfinite(complex(pad_with)):
        raise QdiffError(f"AmplitudeEmbedding: pad_with must be a finite real or complex "
                         f"number; got {pad_with!r}")
    return complex(pad_with)


class StatePrep(AmplitudeEmbedding):
    """Prepare ``state`` (normalized amplitudes) on ``wires``."""

    def _build(self, state, wires, pad_with=None, normalize=False, validate_norm=False):
        super()._build(state, wires, pad_with, normalize, validate_norm)


class BasicEntanglerLayers(Template):
    """Layers of one-parameter rotations followed by a closed ring of CNOTs."""

    @staticmethod
    def shape(n_layers: int, n_wires: int) -> tuple:
        return (n_layers, n_wires)

    def _build(self, weights, wires=None, rotation=None):
        w = _tensor(weights, "BasicEntanglerLayers")
        wires = normalize_wires(wires)
        n = len(wires)
        if w.ndim < 2:
            raise QdiffError(f"BasicEntanglerLayers: weights must have shape (..., L, {n}); "
                             f"got {tuple(w.shape)}")
        _check_tail("BasicEntanglerLayers", w, (w.shape[-2], n))
        rot = rotation if rotation is not None else G.GATES["rx"]
        if not callable(rot):
            raise QdiffError(f"BasicEntanglerLayers: rotation must be a one-parameter gate "
                             f"(qd.RX, qd.RY, ...); got {rotation!r}")
        for layer in range(w.shape[-2]):
            for i in range(n):
                rot(w[..., layer, i], wires=wires[i])
            if n == 2:
                G.GATES["cx"](wires=[wires[0], wires[1]])
            elif n > 2:
                for i in range(n):
                    G.GATES["cx"](wires=[wires[i], wires[(i + 1) % n]])


def _scalar_int(r):
    """A 0-d integer tensor or array as a Python int; anything else unchanged."""
    if isinstance(r, torch.Tensor) and r.ndim == 0 and not (r.dtype.is_floating_point or
                                                             r.is_complex()):
        return r.item()
    if isinstance(r, np.ndarray) and r.ndim == 0 and r.dtype.kind in "iu":
        return r.item()
    return r


class StronglyEntanglingLayers(Template):
    """Layers of general rotations (``Rot``) and CNOTs of range ``r = l mod (N-1) + 1``."""

    @staticmethod
    def shape(n_layers: int, n_wires: int) -> tuple:
        return (n_layers, n_wires, 3)

    @staticmethod
    def _checked(weights, wires, ranges):
        w = _tensor(weights, "StronglyEntanglingLayers")
        wires = normalize_wires(wires)
        n = len(wires)
        if w.ndim < 3:
            raise QdiffError(f"StronglyEntanglingLayers: weights must have shape (..., L, {n}, 3); "
                             f"got {tuple(w.shape)}")
        _check_tail("StronglyEntanglingLayers", w, (w.shape[-3], n, 3))
        layers = w.shape[-3]
        if ranges is None:  # valid by construction
            _real_angles("StronglyEntanglingLayers", w)
            _distinct("StronglyEntanglingLayers", wires)
            return w, wires, tuple((l % (n - 1)) + 1 if n > 1 else 0 for l in range(layers))
        try:
            ranges = [_scalar_int(r) for r in ranges]
        except TypeError:
            raise QdiffError(f"StronglyEntanglingLayers: ranges must be a sequence of integers "
                             f"(one per layer); got {ranges!r}") from None
        if len(ranges) != layers:
            raise QdiffError(f"StronglyEntanglingLayers: {len(ranges)} ranges for {layers} layers")
        for r in ranges:
            if isinstance(r, (bool, np.bool_)) or not isinstance(r, (int, np.integer)):
                raise QdiffError(f"StronglyEntanglingLayers: ranges must be integers; got {r!r}")
            if n > 1 and r % n == 0:
                raise QdiffError(f"StronglyEntanglingLayers: ranges must not be zero nor "
                                 f"divisible by the number of wires ({n}); got {r}")
        _real_angles("StronglyEntanglingLayers", w)
        _distinct("StronglyEntanglingLayers", wires)
        return w, wires, tuple(int(r) for r in ranges)

    def _block(self, weights, wires, ranges: Optional[Sequence[int]] = None, imprimitive=None):
        if imprimitive is not None:
            if not callable(imprimitive):
                raise QdiffError(f"StronglyEntanglingLayers: imprimitive must be a two-wire "
                                 f"gate (qd.CZ, qd.CNOT, ...); got {imprimitive!r}")
            return None
        w, wires, ranges = self._checked(weights, wires, ranges)
        n, layers = len(wires), w.shape[-3]
        rot, cx = G.GATES["rot"], G.GATES["cx"]

        def build():
            ops = []
            for layer in range(layers):
                for i in range(n):
                    j = 3 * (layer * n + i)
                    ops.append(Operation(rot, (wires[i],), (ParamRef(j), ParamRef(j + 1),
                                                           ParamRef(j + 2))))
                if n > 1:
                    ops.extend(Operation(cx, (wires[i], wires[(i + ranges[layer]) % n]))
                               for i in range(n))
            return BlockStructure(tuple(ops), (layers, n, 3), 3 * layers * n)
        return OpBlock(_structure(("StronglyEntanglingLayers", rot, cx, layers, wires, ranges),
                                  build), w)

    def _build(self, weights, wires, ranges: Optional[Sequence[int]] = None, imprimitive=None):
        w, wires, ranges = self._checked(weights, wires, ranges)
        n, layers = len(wires), w.shape[-3]
        rot = G.GATES["rot"]
        cx = G.GATES["cx"] if imprimitive is None else None
        for layer in range(layers):
            for i in range(n):
                _emit(rot, (wires[i],), (w[..., layer, i, 0], w[..., layer, i, 1],
                                         w[..., layer, i, 2]))
            if n > 1:
                r = ranges[layer]
                for i in range(n):
                    pair = (wires[i], wires[(i + r) % n])
                    if cx is not None:
                        _emit(cx, pair)
                    else:  # a custom entangler: the checked path
                        imprimitive(wires=list(pair))


class HardwareEfficientAnsatz(Template):
    """Layers of RY, RZ on every wire followed by a CNOT ladder (i -> i+1)."""

    @staticmethod
    def shape(n_layers: int, n_wires: int) -> tuple:
        return (n_layers, n_wires, 2)

    def _build(self, weights, wires):
        w = _tensor(weights, "HardwareEfficientAnsatz")
        wires = normalize_wires(wires)
        n = len(wires)
        if w.ndim < 3:
            raise QdiffError(f"HardwareEfficientAnsatz: weights must have shape (..., L, {n}, 2); "
                             f"got {tuple(w.shape)}")
        _check_tail("HardwareEfficientAnsatz", w, (w.shape[-3], n, 2))
        for layer in range(w.shape[-3]):
            for i in range(n):
                G.GATES["ry"](w[..., layer, i, 0], wires=wires[i])
                G.GATES["rz"](w[..., layer, i, 1], wires=wires[i])
            for i in range(n - 1):
                G.GATES["cx"](wires=[wires[i], wires[i + 1]])


class BasisState(Template):
    """Prepare the computational basis state ``state`` (bits, or an integer whose binary digits
    are the bits, ``wires[0]`` most significant) on ``wires`` with X gates."""

    def _build(self, state, wires):
        wires = normalize_wires(wires)
        if isinstance(state, torch.Tensor):
            try:  # tolist() also reads a constant made inside torch.func.grad/jacrev/jacfwd
                state = state.detach().cpu().tolist()
            except RuntimeError:
                raise QdiffError("BasisState: the bits of a state batched by torch.func.vmap "
                                 "cannot be read; pass the bits as a constant, not as a vmapped "
                                 "argument") from None
        if isinstance(state, (int, np.integer)) and not isinstance(state, bool):
            if not 0 <= state < 2 ** len(wires):  # PennyLane's integer form: wires[0] first
                raise QdiffError(f"BasisState: integer state {int(state)} has no {len(wires)}-bit "
                                 f"form (0 to {2 ** len(wires) - 1})")
            state = [int(b) for b in format(int(state), f"0{len(wires)}b")] if wires else []
        bits = np.asarray(state).reshape(-1)
        if len(bits) != len(wires) or not np.isin(bits, [0, 1]).all():
            raise QdiffError(f"BasisState: state must be {len(wires)} bits (0/1); got {bits.tolist()}")
        for b, w in zip(bits, wires):
            if b:
                G.GATES["x"](wires=w)


def _counts(who: str, electrons, orbitals) -> tuple:
    """``(electrons, orbitals)`` as Python ints (integers only, bools refused)."""
    for name, v in (("electrons", electrons), ("orbitals", orbitals)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise QdiffError(f"{who}: {name} must be an integer; got {v!r}")
    return int(electrons), int(orbitals)


def hf_state(electrons: int, orbitals: int, basis: str = "occupation_number") -> np.ndarray:
    """Hartree-Fock occupation ``[1]*electrons + [0]*(orbitals-electrons)`` (Jordan-Wigner;
    ``basis`` ``"occupation_number"`` only here: ``qd.hf_state``, :func:`qdiff.qchem.hf_state`,
    also gives PennyLane's parity and Bravyi-Kitaev forms)."""
    if basis != "occupation_number":
        raise QdiffError(f"hf_state: basis {basis!r} is not supported here (only "
                         "'occupation_number'; qd.hf_state / qdiff.qchem.hf_state gives the "
                         "parity and Bravyi-Kitaev forms)")
    electrons, orbitals = _counts("hf_state", electrons, orbitals)
    if not 0 < electrons <= orbitals:
        raise QdiffError(f"hf_state: need 0 < electrons <= orbitals; got {electrons}, {orbitals}")
    memory.require(8.0 * orbitals, f"hf_state of {orbitals} orbitals")
    out = np.zeros(orbitals, dtype=np.int64)
    out[:electrons] = 1
    return out


def excitations(electrons: int, orbitals: int, delta_sz: int = 0, fermionic: bool = False):
    """Single and double excitations changing the spin projection by ``delta_sz`` (0, +-1,
    +-2), in PennyLane's order, as wire lists (``fermionic=True``, PennyLane's ``FermiWord``
    form, is refused)."""
    if fermionic is not False:
        raise QdiffError(f"excitations: fermionic={fermionic!r} is not supported (wire lists "
                         "only; use qml.qchem.excitations for FermiWords)")
    if isinstance(delta_sz, (bool, np.bool_)) or delta_sz not in (0, 1, -1, 2, -2):
        raise QdiffError(f"excitations: delta_sz must be 0, +/-1 or +/-2; got {delta_sz!r}")
    electrons, orbitals = _counts("excitations", electrons, orbitals)
    if not 0 < electrons < orbitals:
        raise QdiffError(f"excitations: need 0 < electrons < orbitals; got {electrons}, {orbitals}")
    empty = orbitals - electrons  # at most C(e, 2) * C(o - e, 2) doubles of ~200 bytes each
    memory.require(200.0 * (electrons * empty + electrons * (electrons - 1) * empty * (empty - 1)
                            / 4), f"excitations of {electrons} electrons in {orbitals} orbitals")
    sz = np.array([0.5 if i % 2 == 0 else -0.5 for i in range(orbitals)])
    singles = [[r, p] for r in range(electrons) for p in range(electrons, orbitals)
               if sz[p] - sz[r] == delta_sz]
    doubles = [[s, r, q, p] for s in range(electrons - 1) for r in range(s + 1, electrons)
               for q in range(electrons, orbitals - 1) for p in range(q + 1, orbitals)
               if sz[p] + sz[q] - sz[r] - sz[s] == delta_sz]
    return singles, doubles


class AllSinglesDoubles(Template):
    """HF state, then Givens rotations: ``DoubleExcitation`` for each double
    (``weights[..., len(singles)+i]``), then ``SingleExcitation`` for each single (``weights[..., j]``)."""

    @staticmethod
    def shape(singles, doubles) -> tuple:
        return (len(singles) + len(doubles),)

    def _build(self, weights, wires, hf_state, singles=None, doubles=None):
        wires = normalize_wires(wires)
        singles = [list(s) for s in (singles or [])]
        doubles = [list(d) for d in (doubles or [])]
        if not singles and not doubles:
            raise QdiffError("AllSinglesDoubles: singles and doubles cannot both be empty")
        w = _tensor(weights, "AllSinglesDoubles")
        _check_tail("AllSinglesDoubles", w, (len(singles) + len(doubles),))
        BasisState(hf_state, wires=wires)
        for i, d in enumerate(doubles):
            G.GATES["double_excitation"](w[..., len(singles) + i], wires=d)
        for j, s in enumerate(singles):
            G.GATES["single_excitation"](w[..., j], wires=s)


def cost_layer(gamma, hamiltonian):
    """``exp(-i gamma H)`` for a Hamiltonian of commuting Pauli words (QAOA cost unitary)."""
    h = as_observable(hamiltonian)
    ops = []
    for c, word in zip(h.real_coeffs(), h.pauli_words()):
        if not word:
            continue
        wires = sorted(word, key=str)
        letters = "".join(word[x] for x in wires)
        angle = 2 * _tensor(gamma, "cost_layer") * c
        if set(letters) == {"Z"}:
            ops.append(G.MultiRZ(angle, wires=wires))
        else:
            ops.append(G.PauliRot(angle, letters, wires=wires))
    return ops


def mixer_layer(alpha, hamiltonian):
    """``exp(-i alpha H_mixer)`` (same construction as :func:`cost_layer`)."""
    return cost_layer(alpha, hamiltonian)


def x_mixer(wires):
    """The standard QAOA mixer ``sum_i X_i``."""
    from qdiff.circuits.observables import Observable
    out = None
    for w in normalize_wires(wires):
        o = Observable.pauli("X", w)
        out = o if out is None else out + o
    return out


class QAOALayers(Template):
    """``depth`` alternating cost and mixer layers: ``params`` ``(..., depth, 2)`` = (gamma, alpha).

    Starts from |+>^n (Hadamards) unless ``init_plus=False``.
    """

    @staticmethod
    def shape(n_layers: int) -> tuple:
        return (n_layers, 2)

    def _build(self, params, wires, cost_h, mixer_h=None, init_plus=True):
        wires = normalize_wires(wires)
        p = _tensor(params, "QAOALayers")
        if p.ndim < 2 or p.shape[-1] != 2:
            raise QdiffError(f"QAOALayers: params must have shape (..., depth, 2); got {tuple(p.shape)}")
        mixer_h = mixer_h if mixer_h is not None else x_mixer(wires)
        if init_plus:
            for w in wires:
                G.GATES["h"](wires=w)
        for layer in range(p.shape[-2]):
            cost_layer(p[..., layer, 0], cost_h)
            mixer_layer(p[..., layer, 1], mixer_h)


class QFT(Template):
    """The quantum Fourier transform on ``wires`` (PennyLane's ``QFT``: Hadamards and
    controlled phases ``pi / 2**(j-i)``, then the wire-reversing SWAPs)."""

    def _build(self, wires):
        wires = normalize_wires(wires)
        _distinct("QFT", wires)
        n = len(wires)
        for i in range(n):
            _emit(G.GATES["h"], (wires[i],))
            for j in range(i + 1, n):
                _emit(G.GATES["cp"], (wires[j], wires[i]), (np.pi / 2 ** (j - i),))
        for i in range(n // 2):
            _emit(G.GATES["swap"], (wires[i], wires[n - 1 - i]))


class IQPEmbedding(Template):
    """Features ``(..., N)`` in an IQP circuit on N wires, repeated ``n_repeats`` times:
    Hadamards, ``RZ(x_i)`` on wire i, then ``MultiRZ(x_i * x_j)`` on each pair of ``pattern``
    (default: every pair of wires, in order), as PennyLane's ``IQPEmbedding``."""

    def _build(self, features, wires, n_repeats: int = 1, pattern=None):
        wires = normalize_wires(wires)
        f = _tensor(features, "IQPEmbedding")
        _real_angles("IQPEmbedding", f)
        _distinct("IQPEmbedding", wires)
        if f.ndim == 0 or f.shape[-1] != len(wires):
            raise QdiffError(f"IQPEmbedding: features of shape {tuple(f.shape)} need one entry "
                             f"per wire ({len(wires)}) in the last dimension")
        if isinstance(n_repeats, (bool, np.bool_)) or \
                not isinstance(n_repeats, (int, np.integer)) or n_repeats < 1:
            raise QdiffError(f"IQPEmbedding: n_repeats must be a positive integer; got "
                             f"{n_repeats!r}")
        pos = {w: i for i, w in enumerate(wires)}
        if pattern is None:
            pairs = [(wires[i], wires[j]) for i in range(len(wires))
                     for j in range(i + 1, len(wires))]
        else:
            pairs = [tuple(normalize_wires(p)) for p in pattern]
            for p in pairs:
                if len(p) != 2 or p[0] == p[1] or any(w not in pos for w in p):
                    raise QdiffError(f"IQPEmbedding: pattern entry {list(p)} must be two "
                                     f"distinct wires of {list(wires)}")
        zz = G.multirz_gate(2)
        for _ in range(int(n_repeats)):
            for i, w in enumerate(wires):
                _emit(G.GATES["h"], (w,))
                _emit(G.GATES["rz"], (w,), (f[..., i],))
            for a, b in pairs:
                _emit(zz, (a, b), (f[..., pos[a]] * f[..., pos[b]],))
