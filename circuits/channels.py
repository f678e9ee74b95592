"""Noise channels: one :class:`Channel` record per channel, under PennyLane's names.

A channel is an operation like a gate (recorded by calling it, placed in a
:class:`~qdiff.circuits.Circuit` as an :class:`~qdiff.circuits.operation.Operation` whose
parameters become theta columns), but it maps density matrices: ``rho -> sum_k K_k rho K_k^+``.
Each record gives, in torch and differentiable in its parameters:

* ``superop_fn(*params) -> (..., d*d, d*d)``: the superoperator ``S = sum_k K_k (x) conj(K_k)``
  acting on ``vec(rho)`` (row-major: index ``i*d + j`` holds ``rho[i, j]``); written in closed
  form, without square roots where the channel has none, so derivatives exist at ``p = 0``;
* ``kraus_fn(*params) -> (..., K, d, d)``: the Kraus operators (the trajectory method samples
  them).

Parameters are checked when they are concrete (probabilities in [0, 1], times positive, Kraus
sets trace preserving): a :class:`~qdiff.circuits.errors.QdiffError` names the channel and the
parameter.

>>> import torch, qdiff as qd
>>> op = qd.DepolarizingChannel(0.3, wires=0)
>>> op.name, op.gate.num_params
('DepolarizingChannel', 1)
>>> S = qd.DepolarizingChannel.superop(torch.tensor(0.75, dtype=torch.float64))
>>> (S @ torch.tensor([1, 0, 0, 0], dtype=torch.complex128)).real   # full depolarization
tensor([0.5000, 0.0000, 0.0000, 0.5000], dtype=torch.float64)
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from qdiff.circuits import caches, recording
from qdiff.circuits.errors import QdiffError

__all__ = ["Channel", "CHANNELS", "get_channel", "is_channel", "has_channels", "PauliError",
           "QubitChannel", "kraus_superop"]

_PAULI = {
    "I": np.eye(2, dtype=complex),
    "X": np.array([[0, 1], [1, 0]], dtype=complex),
    "Y": np.array([[0, -1j], [1j, 0]], dtype=complex),
    "Z": np.array([[1, 0], [0, -1]], dtype=complex),
}


def _cplx(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.complex64 if x.dtype in (torch.float32, torch.float16) else torch.complex128)


def _const(m: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(m, dtype=_cplx(like).dtype, device=like.device)


def kraus_superop(kraus: torch.Tensor) -> torch.Tensor:
    """``sum_k K_k (x) conj(K_k)`` of Kraus operators ``(..., K, d, d)``: ``(..., d*d, d*d)``."""
    d = kraus.shape[-1]
    s = torch.einsum("...kab,...kcd->...acbd", kraus, kraus.conj())
    return s.reshape(*kraus.shape[:-3], d * d, d * d)


def _mix(terms, like: torch.Tensor) -> torch.Tensor:
    """``sum_t c_t * M_t`` for real coefficient tensors ``c_t`` (``(...)``) and constant
    matrices ``M_t``: ``(..., D, D)`` complex."""
    out = None
    for c, m in terms:
        part = _cplx(c)[..., None, None] * _const(m, like)
        out = part if out is None else out + part
    return out


def _pauli_super(letter: str) -> np.ndarray:
    p = _PAULI[letter]
    return np.kron(p, p.conj())


_I4 = np.eye(4, dtype=complex)


def _e(i: int, j: int, d: int = 4) -> np.ndarray:
    m = np.zeros((d, d), dtype=complex)
    m[i, j] = 1
    return m


# ---------------------------------------------------------------------------------------------
# the record


@dataclass(frozen=True, eq=False)
class Channel:
    """One noise channel.

    Attributes:
        name: PennyLane's class name (also the IR's name).
        num_wires: qubits it acts on.
        num_params: real parameters (theta columns when they are tensors).
        param_names: the parameters' names, for error messages.
        superop_fn: ``(*params) -> (..., d*d, d*d)`` complex superoperator (see the module).
        kraus_fn: ``(*params) -> (..., K, d, d)`` complex Kraus operators.
        check_fn: ``(*floats) -> None``; raises :class:`QdiffError` on invalid parameters.
        qiskit_name: always "" (Qiskit has no channel instructions).
    """

    name: str
    num_wires: int
    num_params: int
    param_names: tuple
    superop_fn: Callable[..., torch.Tensor]
    kraus_fn: Callable[..., torch.Tensor]
    check_fn: Callable[..., None]
    pl_name: str = ""
    qiskit_name: str = ""
    pl_params: tuple = ()     # PennyLane's parameter names, where they differ
    unbounded: tuple = ()     # indices of parameters that may be +inf (a T1 or T2 without decay)
    branches_fn: Optional[Callable[..., tuple]] = None  # see branches()
    generators = None
    shift_rules = None
    diag_fn = None
    perm = None
    controls = 0
    target = None             # no controlled base (the Gate attribute)
    native_code = ""
    decomposition = None
    is_channel = True

    def __post_init__(self):
        if not self.pl_name:
            object.__setattr__(self, "pl_name", self.name)

    def unwrap_controls(self, limit: Optional[int] = None) -> tuple:
        """``(0, self)``: a channel has no controls (the Gate method's answer, so that
        drawings and counts walk gates and channels alike)."""
        return 0, self

    @property
    def differentiable(self) -> bool:
        return False  # no shift rule: backprop, or finite differences with shots

    @property
    def is_diagonal(self) -> bool:
        return False

    def _tensors(self, params) -> list:
        out = []
        for p in params:
            if not isinstance(p, torch.Tensor):
                p = torch.tensor(float(p), dtype=torch.float64)
            out.append(p)
        return list(torch.broadcast_tensors(*out)) if out else out

    def superop(self, *params) -> torch.Tensor:
        """The superoperator at ``params`` (numbers or real tensors)."""
        return self.superop_fn(*self._tensors(params))

    def kraus(self, *params) -> torch.Tensor:
        """The Kraus operators at ``params``: ``(..., K, d, d)``."""
        return self.kraus_fn(*self._tensors(params))

    def branches(self, *params) -> tuple:
        """``(w, M)``: real weights ``(..., K)`` and operators ``(..., K, d, d)`` with Kraus
        operators ``K_k = sqrt(w_k) M_k``, both smooth in the parameters where the channel has
        such a form (the trajectory method differentiates ``w`` instead of ``sqrt(w)``, so
        gradients exist at p = 0); else ``w = 1`` and ``M = K``."""
        ps = self._tensors(params)
        if self.branches_fn is not None:
            return self.branches_fn(*ps)
        k = self.kraus_fn(*ps)
        return torch.ones(k.shape[:-2], dtype=k.real.dtype, device=k.device), k

    def check(self, params: Sequence) -> None:
        """Validate concrete parameters (numbers or tensors); raises :class:`QdiffError`."""
        if not params:
            return self.check_fn()
        if all(type(p) is float or type(p) is int for p in params):
            return _check_numbers(self, tuple(float(p) for p in params))
        vals = []
        for i, p in enumerate(params):
            if isinstance(p, torch.Tensor):
                if p.numel() == 0 or not _readable(p):
                    return  # under torch.func.vmap values cannot be read (as for angles)
                v = p.detach().to("cpu", torch.float64)
                if type(p) not in (torch.Tensor, torch.nn.Parameter):
                    try:  # a tensor subclass: its values may be hidden (a static trace)
                        bool(torch.isfinite(v).all())
                    except QdiffError:
                        raise QdiffError(
                            f"channel '{self.name}': parameter {self.param_names[i]} is a "
                            f"traced tensor ({type(p).__name__}); channel parameters are "
                            "checked by value when recorded, so a static qnode or qd.jit "
                            "takes them as Python numbers (or use static=False)") from None
                    v = v.as_subclass(torch.Tensor)
                vals.append(v)
            else:
                vals.append(torch.tensor(float(p), dtype=torch.float64))
        if vals:
            vals = list(torch.broadcast_tensors(*vals))
        for i, v in enumerate(vals):
            ok = torch.isfinite(v) | (v == math.inf) if i in self.unbounded else \
                torch.isfinite(v)
            if not ok.all():
                raise QdiffError(f"channel '{self.name}': parameter {self.param_names[i]} is NaN "
                                 "or infinite")
        self.check_fn(*vals)

    def __call__(self, *args, wires=None, **kwargs):
        """Record this channel: ``qd.DepolarizingChannel(0.1, wires=0)``."""
        args = list(args)
        if kwargs:
            args = self._keyword_params(args, kwargs)
        if wires is None:
            if len(args) != self.num_params + 1:
                raise QdiffError(f"channel '{self.name}' takes {self.num_params} parameter(s) "
                                 f"{list(self.param_names)} and wires; got {len(args)} "
                                 "positional argument(s)")
            wires = args.pop()
        if len(args) != self.num_params:
            raise QdiffError(f"channel '{self.name}' takes {self.num_params} parameter(s) "
                             f"{list(self.param_names)}; got {len(args)}")
        args = [self._param(i, a) for i, a in enumerate(args)]
        self.check(args)
        return recording.record_operation(self, wires, args)

    def _keyword_params(self, args: list, kwargs: dict) -> list:
        """Positional parameters followed by keyword ones, by qdiff's or PennyLane's names
        (``qd.ResetError(p0=0.1, p1=0.2, wires=0)``)."""
        names = {n: i for i, n in enumerate(self.param_names)}
        names.update({n: i for i, n in enumerate(self.pl_params)})
        unknown = sorted(k for k in kwargs if k not in names)
        if unknown:
            raise QdiffError(f"channel '{self.name}': unexpected keyword(s) {unknown}; its "
                             f"parameters are {list(self.pl_params or self.param_names)}")
        slots = list(args) + [None] * max(0, self.num_params - len(args))
        for k, v in kwargs.items():
            i = names[k]
            if i < len(args) or slots[i] is not None:
                raise QdiffError(f"channel '{self.name}': parameter {k} given twice")
            slots[i] = v
        missing = [self.param_names[i] for i in range(self.num_params) if slots[i] is None]
        if missing:
            raise QdiffError(f"channel '{self.name}': missing parameter(s) {missing}")
        return slots

    def _param(self, i: int, a):
        """Parameter ``i`` as a float or a real tensor (a list or array: a batch of values,
        as for gate angles)."""
        pname = self.param_names[i]
        bad = QdiffError(f"channel '{self.name}': parameter {pname} must be a real number or "
                         f"tensor; got {type(a).__name__} {a!r}")
        if isinstance(a, torch.Tensor):
            if a.is_complex():
                raise QdiffError(f"channel '{self.name}': parameter {pname} must be real; got "
                                 "a complex tensor")
            if a.dtype is torch.bool:
                raise bad
            return a
        if isinstance(a, (str, bytes, bool)) or a is None:
            raise bad
        if isinstance(a, (int, float)):
            return math.inf if a == math.inf and i in self.unbounded else a
        try:
            if np.iscomplexobj(a) or np.asarray(a).dtype == np.bool_:
                raise bad
            arr = np.asarray(a, dtype=float)
        except (TypeError, ValueError):
            raise bad from None
        return float(arr) if arr.ndim == 0 else torch.as_tensor(arr)

    def __repr__(self):
        return f"Channel({self.name!r})"

    def __deepcopy__(self, memo):
        """A channel is immutable: a deep copy (of a noise model, a device) shares it."""
        return self

    def __reduce__(self):
        """Pickle by how the channel is made: a registered channel by its name, a PauliError
        by its word, a QubitChannel by its Kraus matrices (its functions are closures)."""
        if CHANNELS.get(self.name) is self:
            return get_channel, (self.name,)
        if _PAULI_ERRORS.get(self.name[len("PauliError["):-1]) is self:
            return pauli_error_channel, (self.name[len("PauliError["):-1],)
        if self.name == "QubitChannel" and self.num_params == 0:
            return qubit_channel, (self.kraus_fn().detach().cpu(),)
        raise QdiffError(f"cannot pickle channel '{self.name}': it is not a registered channel, "
                         "a PauliError or a QubitChannel")


def _readable(t: torch.Tensor) -> bool:
    """Whether ``t``'s values can be read in Python: not under ``torch.func.vmap`` (a batched
    tensor at some level of its functorch wrappers; ``torch.func.grad`` alone reads fine)."""
    try:
        f = torch._C._functorch
        while f.is_functorch_wrapped_tensor(t):
            if f.is_batchedtensor(t):
                return False
            t = f.get_unwrapped(t)
    except (AttributeError, RuntimeError):  # another torch: read only plain tensors
        return type(t) in (torch.Tensor, torch.nn.Parameter) and \
            not torch._C._functorch.is_functorch_wrapped_tensor(t)
    return True


@functools.lru_cache(maxsize=4096)
def _check_numbers(channel: Channel, params: tuple) -> None:
    """Validation of plain-number parameters, remembered (noise after every gate repeats the
    same few values)."""
    channel.check([torch.tensor(p, dtype=torch.float64) for p in params])


def _in_unit(name, pname, v):
    if bool(((v < 0) | (v > 1)).any()):
        bad = v[(v < 0) | (v > 1)].reshape(-1)[0].item()
        raise QdiffError(f"channel '{name}': probability {pname}={bad!r} is outside [0, 1]")


def _probabilities(name: str, names: tuple, total: Optional[str] = None):
    def check(*vals):
        for pname, v in zip(names, vals):
            _in_unit(name, pname, v)
        if total is not None:
            _in_unit(name, total, sum(vals))
    return check


# ---------------------------------------------------------------------------------------------
# the channels (closed-form superoperators; Kraus operators as PennyLane defines them)


def _flip_super(letter):
    def superop(p):
        return _mix([(1 - p, _I4), (p, _pauli_super(letter))], p)
    return superop


def _flip_kraus(letter):
    def kraus(p):
        s0, s1 = torch.sqrt(1 - p), torch.sqrt(p)
        return torch.stack([_mix([(s0, _PAULI["I"])], p), _mix([(s1, _PAULI[letter])], p)], -3)
    return kraus


def _depol_super(p):
    return _mix([(1 - p, _I4), (p / 3, _pauli_super("X") + _pauli_super("Y") +
                                _pauli_super("Z"))], p)


def _depol_kraus(p):
    s0, s1 = torch.sqrt(1 - p), torch.sqrt(p / 3)
    return torch.stack([_mix([(s0, _PAULI["I"])], p)] +
                       [_mix([(s1, _PAULI[c])], p) for c in "XYZ"], -3)


def _amp_super(g):
    one = torch.ones_like(g)
    return _mix([(one, _e(0, 0)), (torch.sqrt(1 - g), _e(1, 1) + _e(2, 2)), (1 - g, _e(3, 3)),
                 (g, _e(0, 3))], g)


def _amp_kraus(g):
    s, one = torch.sqrt(1 - g), torch.ones_like(g)
    k0 = _mix([(one, _e(0, 0, 2)), (s, _e(1, 1, 2))], g)
    k1 = _mix([(torch.sqrt(g), _e(0, 1, 2))], g)
    return torch.stack([k0, k1], -3)


def _gad_super(g, p):
    s = torch.sqrt(1 - g)
    return _mix([(1 - p * g, _e(0, 0)), ((1 - p) * g, _e(0, 3)), (s, _e(1, 1) + _e(2, 2)),
                 (p * g, _e(3, 0)), (1 - g + p * g, _e(3, 3))], g)


def _gad_kraus(g, p):
    s, a, b = torch.sqrt(1 - g), torch.sqrt(1 - p), torch.sqrt(p)
    one = torch.ones_like(g)
    sg = torch.sqrt(g)
    return torch.stack([_mix([(a, _e(0, 0, 2)), (a * s, _e(1, 1, 2))], g),
                        _mix([(a * sg, _e(0, 1, 2))], g),
                        _mix([(b * s, _e(0, 0, 2)), (b * one, _e(1, 1, 2))], g),
                        _mix([(b * sg, _e(1, 0, 2))], g)], -3)


def _phase_damp_super(g):
    one = torch.ones_like(g)
    return _mix([(one, _e(0, 0) + _e(3, 3)), (torch.sqrt(1 - g), _e(1, 1) + _e(2, 2))], g)


def _phase_damp_kraus(g):
    one = torch.ones_like(g)
    return torch.stack([_mix([(one, _e(0, 0, 2)), (torch.sqrt(1 - g), _e(1, 1, 2))], g),
                        _mix([(torch.sqrt(g), _e(1, 1, 2))], g)], -3)


def _branches(weights, mats, like):
    """``(w (..., K), M (..., K, d, d))`` from weight tensors and operators (constant matrices
    or ``(..., d, d)`` tensors)."""
    w = torch.stack(torch.broadcast_tensors(*weights), -1)
    ms = [(_const(m, like) if isinstance(m, np.ndarray) else m) for m in mats]
    ms = [m.expand(*w.shape[:-1], *m.shape[-2:]) for m in ms]
    return w, torch.stack(ms, -3)


def _flip_branches(letter):
    def branches(p):
        return _branches([1 - p, p], [_PAULI["I"], _PAULI[letter]], p)
    return branches


def _depol_branches(p):
    return _branches([1 - p, p / 3, p / 3, p / 3],
                     [_PAULI["I"], _PAULI["X"], _PAULI["Y"], _PAULI["Z"]], p)


def _damp_diag(g):
    """``diag(1, sqrt(1 - g))`` (smooth below g = 1)."""
    return _mix([(torch.ones_like(g), _e(0, 0, 2)), (torch.sqrt(1 - g), _e(1, 1, 2))], g)


def _amp_branches(g):
    return _branches([torch.ones_like(g), g], [_damp_diag(g), _e(0, 1, 2)], g)


def _phase_damp_branches(g):
    return _branches([torch.ones_like(g), g], [_damp_diag(g), _e(1, 1, 2)], g)


def _gad_branches(g, p):
    s = _mix([(torch.sqrt(1 - g), _e(0, 0, 2)), (torch.ones_like(g), _e(1, 1, 2))], g)
    return _branches([1 - p, (1 - p) * g, p, p * g],
                     [_damp_diag(g), _e(0, 1, 2), s, _e(1, 0, 2)], g)


def _reset_branches(p0, p1):
    return _branches([1 - p0 - p1, p0, p0, p1, p1],
                     [_PAULI["I"], _e(0, 0, 2), _e(0, 1, 2), _e(1, 0, 2), _e(1, 1, 2)], p0)


def _thermal_rates(t1, t2, tq):
    p_reset = -torch.expm1(-tq / t1)  # 1 - exp(-tq/t1), accurate for short times too
    return p_reset, torch.exp(-tq / t2)


def _thermal_super(pe, t1, t2, tq):
    """Populations relax towards ``(1-pe, pe)`` with probability ``1 - exp(-tq/t1)``;
    coherences decay by ``exp(-tq/t2)``."""
    r, c = _thermal_rates(t1, t2, tq)
    return _mix([(1 - r * pe, _e(0, 0)), (r * (1 - pe), _e(0, 3)), (c, _e(1, 1) + _e(2, 2)),
                 (r * pe, _e(3, 0)), (1 - r + r * pe, _e(3, 3))], pe)


def _thermal_kraus(pe, t1, t2, tq):
    """Kraus operators of the same map from the eigen-decomposition of its Choi matrix (valid
    for every parameter set that passes the check)."""
    return _choi_kraus(_thermal_super(pe, t1, t2, tq), 2)


def _thermal_branches(pe, t1, t2, tq):
    """The map's Choi matrix split without square roots of the rates: the jumps
    ``|1><0|`` (weight ``r pe``) and ``|0><1|`` (``r (1 - pe)``), and its population block
    ``[[A, c], [c, D]]`` as ``A (1, c/A)(1, c/A)^T + (D - c**2/A) e_1 e_1^T`` (``A >= 1 - r > 0``;
    ``A D >= c**2`` for every physical parameter set). ``A = (1 - pe) + pe exp(-tq/t1)`` is
    formed without ``1 - r``, which rounds to 0 from ``tq/t1`` ~ 37; where ``A`` underflows
    (``pe = 1``, ``tq/t1`` > 745) ``c`` is 0 too, mathematically, and so is the first
    branch."""
    r, c = _thermal_rates(t1, t2, tq)
    decay = torch.exp(-tq / t1)
    a, d = (1 - pe) + pe * decay, pe + (1 - pe) * decay
    pos = a > 0
    safe = torch.where(pos, a, torch.ones_like(a))
    ratio = torch.where(pos, c / safe, torch.zeros_like(c))
    rest = torch.clamp(d - torch.where(pos, c * c / safe, torch.zeros_like(c)), min=0)
    keep = _mix([(torch.ones_like(a), _e(0, 0, 2)), (ratio, _e(1, 1, 2))], pe)
    return _branches([a, rest, r * pe, r * (1 - pe)],
                     [keep, _e(1, 1, 2), _e(1, 0, 2), _e(0, 1, 2)], pe)


def _thermal_check(pe, t1, t2, tq):
    name = "ThermalRelaxationError"
    _in_unit(name, "pe", pe)
    for pname, v in (("t1", t1), ("t2", t2)):
        if bool((v <= 0).any()):
            raise QdiffError(f"channel '{name}': {pname} must be positive; got "
                             f"{v[v <= 0].reshape(-1)[0].item()!r}")
    if bool((tq < 0).any()):
        raise QdiffError(f"channel '{name}': gate time tq must be >= 0; got "
                         f"{tq[tq < 0].reshape(-1)[0].item()!r}")
    if bool((t2 > 2 * t1 * (1 + 1e-12)).any()):
        raise QdiffError(f"channel '{name}': t2 must be at most 2*t1 (a physical channel)")


def _reset_super(p0, p1):
    return _mix([(1 - p0 - p1, _I4), (p0, _e(0, 0) + _e(0, 3)), (p1, _e(3, 0) + _e(3, 3))], p0)


def _reset_kraus(p0, p1):
    s, a, b = torch.sqrt(1 - p0 - p1), torch.sqrt(p0), torch.sqrt(p1)
    return torch.stack([_mix([(s, _PAULI["I"])], p0), _mix([(a, _e(0, 0, 2))], p0),
                        _mix([(a, _e(0, 1, 2))], p0), _mix([(b, _e(1, 0, 2))], p0),
                        _mix([(b, _e(1, 1, 2))], p0)], -3)


def _choi_kraus(superop: torch.Tensor, d: int) -> torch.Tensor:
    """Kraus operators ``(..., d*d, d, d)`` of a superoperator by its Choi matrix's eigenvectors."""
    s = superop.reshape(*superop.shape[:-2], d, d, d, d)        # [a, c, b, e]: K[a,b] conj(K[c,e])
    choi = s.permute(*range(s.ndim - 4), -4, -2, -3, -1)         # [a, b, c, e]
    choi = choi.reshape(*superop.shape[:-2], d * d, d * d)
    vals, vecs = torch.linalg.eigh(choi)
    k = vecs * torch.sqrt(vals.clamp_min(0)).unsqueeze(-2).to(vecs.dtype)
    return k.transpose(-1, -2).reshape(*superop.shape[:-2], d * d, d, d)


def _register(ch: Channel) -> Channel:
    CHANNELS[ch.name] = ch
    return ch


CHANNELS: dict = {}

BitFlip = _register(Channel("BitFlip", 1, 1, ("p",), _flip_super("X"), _flip_kraus("X"),
                            _probabilities("BitFlip", ("p",)),
                            branches_fn=_flip_branches("X")))
PhaseFlip = _register(Channel("PhaseFlip", 1, 1, ("p",), _flip_super("Z"), _flip_kraus("Z"),
                              _probabilities("PhaseFlip", ("p",)),
                              branches_fn=_flip_branches("Z")))
DepolarizingChannel = _register(Channel("DepolarizingChannel", 1, 1, ("p",), _depol_super,
                                        _depol_kraus,
                                        _probabilities("DepolarizingChannel", ("p",)),
                                        branches_fn=_depol_branches))
AmplitudeDamping = _register(Channel("AmplitudeDamping", 1, 1, ("gamma",), _amp_super,
                                     _amp_kraus, _probabilities("AmplitudeDamping", ("gamma",)),
                                     branches_fn=_amp_branches))
GeneralizedAmplitudeDamping = _register(Channel(
    "GeneralizedAmplitudeDamping", 1, 2, ("gamma", "p"), _gad_super, _gad_kraus,
    _probabilities("GeneralizedAmplitudeDamping", ("gamma", "p")), branches_fn=_gad_branches))
PhaseDamping = _register(Channel("PhaseDamping", 1, 1, ("gamma",), _phase_damp_super,
                                 _phase_damp_kraus, _probabilities("PhaseDamping", ("gamma",)),
                                 branches_fn=_phase_damp_branches))
ThermalRelaxationError = _register(Channel(
    "ThermalRelaxationError", 1, 4, ("pe", "t1", "t2", "tq"), _thermal_super, _thermal_kraus,
    _thermal_check, pl_params=("pe", "t1", "t2", "tg"), unbounded=(1, 2),
    branches_fn=_thermal_branches))
ResetError = _register(Channel("ResetError", 1, 2, ("p_0", "p_1"), _reset_super, _reset_kraus,
                               _probabilities("ResetError", ("p_0", "p_1"), "p_0 + p_1"),
                               pl_params=("p0", "p1"), branches_fn=_reset_branches))


# ---------------------------------------------------------------------------------------------
# families: PauliError(word), QubitChannel(kraus matrices)


def pauli_word_matrix(word: str) -> np.ndarray:
    """The matrix of a Pauli word (``"XIZ"``: its first letter on the most significant
    qubit)."""
    m = np.ones((1, 1), dtype=complex)
    for c in word:
        m = np.kron(m, _PAULI[c])
    return m


_PAULI_ERRORS: dict = {}


def _superop_memory(name: str, k: int, copies: int) -> None:
    """Refuse (before allocating) the ``4**k x 4**k`` complex superoperator of a channel on
    ``k`` wires (``copies`` of it) when it does not fit the memory budget."""
    from qdiff.circuits import memory
    memory.require(16.0 * 16.0 ** k * copies, f"the superoperator of channel '{name}' on {k} "
                   f"wires ({copies} cop{'y' if copies == 1 else 'ies'} of 16*16**k bytes)",
                   hint="a channel on fewer wires, or the trajectory method "
                   "(qd.device('statevector', trajectories=...))")


def pauli_error_channel(word: str) -> Channel:
    """The channel ``rho -> (1-p) rho + p P rho P`` for the Pauli word ``word`` (e.g. ``"XZ"``)."""
    if not isinstance(word, str) or not word or any(c not in "IXYZ" for c in word):
        raise QdiffError(f"channel 'PauliError': operators must be a non-empty string of "
                         f"I, X, Y, Z; got {word!r}")
    if word not in _PAULI_ERRORS:
        pm = pauli_word_matrix(word)
        d2 = 4 ** len(word)

        @functools.lru_cache(maxsize=1)
        def big():
            return np.kron(pm, pm.conj())

        def superop(p):
            # the constant factors (numpy and torch) and the batch of results with its terms
            _superop_memory(f"PauliError[{word}]", len(word), 4 + 3 * max(1, p.numel()))
            return _mix([(1 - p, np.eye(d2, dtype=complex)), (p, big())], p)

        def kraus(p):
            return torch.stack([_mix([(torch.sqrt(1 - p), np.eye(len(pm), dtype=complex))], p),
                                _mix([(torch.sqrt(p), pm)], p)], -3)
        def branches(p):
            return _branches([1 - p, p], [np.eye(len(pm), dtype=complex), pm], p)
        _PAULI_ERRORS[word] = Channel(f"PauliError[{word}]", len(word), 1, ("p",), superop,
                                      kraus, _probabilities("PauliError", ("p",)),
                                      pl_name="PauliError", branches_fn=branches)
    return _PAULI_ERRORS[word]


class _PauliErrorFamily:
    """``qd.PauliError("XY", p, wires=[0, 1])`` (PennyLane's argument order)."""

    name = "PauliError"

    def __call__(self, operators, p, wires=None, **kwargs):
        if kwargs:
            raise QdiffError(f"channel 'PauliError': unexpected keyword(s) {sorted(kwargs)}")
        ch = pauli_error_channel(operators)
        if wires is None:
            raise QdiffError("channel 'PauliError' needs wires=")
        return ch(p, wires=wires)

    def __repr__(self):
        return "PauliError"


PauliError = _PauliErrorFamily()


def qubit_channel(kraus_matrices, atol: float = 1e-10) -> Channel:
    """A constant channel from Kraus matrices ``(K, d, d)`` (or a list of ``(d, d)``), checked
    trace preserving (``sum_k K_k^+ K_k = I`` to ``atol``). Kraus matrices that require grad
    are refused: the channel is a constant, it has no parameters to differentiate."""
    items = [kraus_matrices] if isinstance(kraus_matrices, torch.Tensor) else \
        (kraus_matrices if isinstance(kraus_matrices, (list, tuple)) else [])
    if any(isinstance(k, torch.Tensor) and k.requires_grad for k in items):
        raise QdiffError("channel 'QubitChannel': the Kraus matrices require grad, but a "
                         "QubitChannel is a constant channel (its Kraus matrices are not "
                         "differentiated); detach them, or write the noise with parametrized "
                         "channels (qd.AmplitudeDamping(gamma, wires), ...) whose parameters "
                         "are differentiable")
    try:
        ks = torch.stack([torch.as_tensor(np.asarray(k) if not isinstance(k, torch.Tensor)
                                          else k).to(torch.complex128)
                          for k in kraus_matrices]) if not isinstance(kraus_matrices, torch.Tensor) \
            else kraus_matrices.detach().to(torch.complex128)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise QdiffError(f"channel 'QubitChannel': Kraus matrices must be equal-sized square "
                         f"matrices ({exc})") from None
    if ks.ndim != 3 or ks.shape[-1] != ks.shape[-2] or ks.shape[0] == 0:
        raise QdiffError(f"channel 'QubitChannel': expected Kraus matrices of shape (K, d, d); "
                         f"got {tuple(ks.shape)}")
    d = ks.shape[-1]
    k = int(round(math.log2(d)))
    if 2 ** k != d or k < 1:
        raise QdiffError(f"channel 'QubitChannel': Kraus matrices must be 2**k x 2**k; got {d}x{d}")
    if not torch.isfinite(torch.view_as_real(ks)).all():
        raise QdiffError("channel 'QubitChannel': Kraus matrices contain NaN or infinity")
    err = (torch.einsum("kba,kbc->ac", ks.conj(), ks) - torch.eye(d, dtype=ks.dtype)).abs().max()
    if float(err) > atol:
        raise QdiffError(f"channel 'QubitChannel': the Kraus matrices are not trace preserving "
                         f"(max |sum K^+ K - I| = {float(err):.3g} > {atol:g})")
    @functools.lru_cache(maxsize=1)
    def superop():
        _superop_memory("QubitChannel", k, 2)
        with caches.constants():  # kept: a plain constant whatever mode first asks for it
            return kraus_superop(ks)

    def kraus():
        return ks

    return Channel("QubitChannel", k, 0, (), superop, kraus, lambda: None)


class _QubitChannelFamily:
    """``qd.QubitChannel(K_list, wires=...)``: a channel from its Kraus matrices."""

    name = "QubitChannel"

    def __call__(self, K_list, wires=None, **kwargs):
        if kwargs:
            raise QdiffError(f"channel 'QubitChannel': unexpected keyword(s) {sorted(kwargs)}")
        if wires is None:
            raise QdiffError("channel 'QubitChannel' needs wires=")
        ch = qubit_channel(K_list)
        return ch(wires=wires)

    def __repr__(self):
        return "QubitChannel"


QubitChannel = _QubitChannelFamily()


# ---------------------------------------------------------------------------------------------
# queries


def is_channel(gate) -> bool:
    """Whether an operation's record is a channel (not a unitary gate)."""
    return getattr(gate, "is_channel", False)


def has_channels(circuit) -> bool:
    """Whether any operation of ``circuit`` is a channel (found once per circuit object)."""
    from qdiff.circuits.circuit import Circuit, memo
    if isinstance(circuit, Circuit):
        return memo(circuit, "has_channels",
                    lambda: any(is_channel(op.gate) for op in circuit.operations))
    return any(is_channel(op.gate) for op in circuit.operations)


def get_channel(name: str) -> Channel:
    """The channel registered as ``name`` (PennyLane's class name)."""
    if name not in CHANNELS:
        raise QdiffError(f"unknown channel '{name}'; known: {sorted(CHANNELS)}")
    return CHANNELS[name]


def channel_names() -> tuple:
    return tuple(sorted(CHANNELS)) + ("PauliError", "QubitChannel")

