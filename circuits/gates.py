"""Gate definitions: the single extension point for gates.

A :class:`Gate` carries everything the rest of qdiff needs to know about one gate: its OpenQASM
name, its wire and parameter counts, a differentiable torch matrix function, one Hermitian
generator per parameter (``U(..., phi_j, ...) = A exp(-i phi_j G_j) B``, from which parameter-shift
rules are *derived*), its inverse, and structural hints the simulator uses for fast paths
(diagonal, permutation, controlled).

Conventions follow PennyLane: wire 0 is the most significant bit of a basis index, and a
k-qubit matrix is written in the order of the wires it acts on.

>>> import torch, qdiff as qd
>>> qd.RX.matrix(torch.tensor([0.0], dtype=torch.float64))[0].real
tensor([[1., 0.],
        [0., 1.]], dtype=torch.float64)
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from qdiff.circuits import caches, memory
from qdiff.circuits.errors import QdiffError
from qdiff.circuits import recording
from qdiff.circuits.operation import plain_values

__all__ = ["Gate", "GATES", "register_gate", "get_gate", "MultiRZ", "PauliRot", "QubitUnitary",
           "PCPhase", "DiagonalQubitUnitary", "GlobalPhase"]

_SQ2 = 1.0 / math.sqrt(2.0)

# ---------------------------------------------------------------------------------------------
# small tensor helpers (params are real tensors of any batch shape; matrices are (..., d, d))


def _cplx(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.complex64 if x.dtype in (torch.float32, torch.float16) else torch.complex128)


def _expi(x: torch.Tensor) -> torch.Tensor:
    return torch.polar(torch.ones_like(x), x)


def _stack(rows, like: torch.Tensor) -> torch.Tensor:
    """Stack a nested list of (...,) tensors / numbers into a (..., d, d) complex tensor."""
    ref = _cplx(like)
    consts: dict = {}
    flat = []
    for row in rows:
        for e in row:
            if isinstance(e, torch.Tensor):
                flat.append(e if e.dtype == ref.dtype else e.to(ref.dtype))
            else:
                if e not in consts:
                    consts[e] = torch.tensor(e, dtype=ref.dtype, device=ref.device)
                flat.append(consts[e])
    d = len(rows)
    return torch.stack(torch.broadcast_tensors(*flat), dim=-1).reshape(*ref.shape, d, d)


def _diag_embed(d: torch.Tensor) -> torch.Tensor:
    return torch.diag_embed(d)


# ---------------------------------------------------------------------------------------------
# the gate definition


@dataclass(frozen=True, eq=False)
class Gate:
    """One gate.

    Attributes:
        name: OpenQASM lowercase name (the IR's name).
        num_wires: number of qubits.
        num_params: number of real angles.
        matrix_fn: ``(*angles) -> (..., 2**k, 2**k)`` complex, differentiable; angles are real
            tensors broadcast to a common batch shape ``...`` (constant gates ignore them and
            return ``(2**k, 2**k)``).
        generators: one Hermitian ``(2**k, 2**k)`` numpy array per parameter with
            ``U(phi_j) = A exp(-i phi_j G_j) B`` (None: not differentiable by shift rules).
        inverse_fn: ``angles -> (Gate, angles)`` giving the inverse gate.
        diag_fn: for diagonal gates, ``(*angles) -> (..., 2**k)``.
        perm: for permutation gates, the basis permutation ``out[i] = in[perm[i]]``.
        controls: number of leading control wires; ``target`` acts on the rest when all are 1.
        shift_rules: optional user-provided rules, one tuple of ``(coeff, shift)`` per parameter,
            overriding the rule derived from the generator.
        pl_name: PennyLane's class name; qiskit_name: Qiskit's gate name.
        decomposition: ``params -> [(gate name, params[, local wires]), ...]``: the same
            unitary (up to a global phase) as built-in gates, in circuit order, each on the
            gate's wires or on the ``local wires`` (indices into them) it names; given for
            multi-parameter gates (as one-parameter gates), for a gate ``U = A exp(-i phi G)``
            with ``A != I``, and for gates no other toolkit has (the metric tensor, exporters
            and the compiler expand with it).
        native_code: name of the formula the native CPU kernels evaluate this gate's matrix
            and derivatives with (``CODES`` in ``backends/statevector/qdsim.c``; "" for none:
            the kernels then take the matrix computed by ``matrix_fn``). A controlled gate
            whose target has one is coded through its target.
    """

    name: str
    num_wires: int
    num_params: int
    matrix_fn: Callable[..., torch.Tensor]
    generators: Optional[tuple] = None
    inverse_fn: Optional[Callable] = None
    diag_fn: Optional[Callable[..., torch.Tensor]] = None
    perm: Optional[tuple] = None
    controls: int = 0
    target: Optional["Gate"] = None
    shift_rules: Optional[tuple] = None
    pl_name: str = ""
    qiskit_name: str = ""
    hyper: tuple = field(default=())
    decomposition: Optional[Callable] = None
    native_code: str = ""
    # -- compiler facts (filled in by ``_compiler_facts`` below; qdiff.compiler reads them) --
    # wire_axes: per wire "z" (diagonal there), "x" (diagonal in the X basis there) or "";
    # axis_angle: a constant one-qubit gate equal up to phase to a rotation by this angle about
    # its axis; additive: two applications on the same wires add their angles; symmetric:
    # the wires may be exchanged; zyz: angles -> (a, b, c) with U = RZ(c) RY(b) RZ(a) up to phase
    wire_axes: tuple = ()
    axis_angle: Optional[float] = None
    additive: bool = False
    symmetric: bool = False
    zyz: Optional[Callable] = None

    def unwrap_controls(self, limit: Optional[int] = None) -> tuple:
        """``(control wires, gate)``: the controls of nested controlled gates, outermost
        first, and the target they leave (up to ``limit`` control wires; default all)."""
        gate, c = self, 0
        while gate.controls and gate.target is not None and (limit is None or c < limit):
            c, gate = c + gate.controls, gate.target
        return c, gate

    # -- math ---------------------------------------------------------------------------------
    def matrix(self, *angles) -> torch.Tensor:
        """The unitary, ``(..., 2**k, 2**k)`` complex (constant gates: ``(2**k, 2**k)``)."""
        angles = [a if isinstance(a, torch.Tensor) else torch.tensor(float(a), dtype=torch.float64)
                  for a in angles]
        if self.num_params:
            angles = list(torch.broadcast_tensors(*angles))
        return self.matrix_fn(*angles)

    @property
    def generator(self) -> Optional[np.ndarray]:
        """The generator of a one-parameter gate (``U = exp(-i phi G)``)."""
        if self.num_params != 1 or self.generators is None:
            return None
        return self.generators[0]

    def spectrum(self, slot: int = 0) -> np.ndarray:
        """The distinct eigenvalues (ascending) of generator ``slot``: the frequencies of the
        parameter-shift rule and the spectral derivative of the matrix both derive from them."""
        return generator_spectrum(self, slot)

    @property
    def is_diagonal(self) -> bool:
        return self.diag_fn is not None

    @property
    def differentiable(self) -> bool:
        return self.num_params > 0 and (self.generators is not None or self.shift_rules is not None)

    def inverse(self, angles: Sequence = ()) -> tuple["Gate", tuple]:
        """``(gate, angles)`` of the inverse; angles may be floats or tensors."""
        if self.inverse_fn is None:
            raise QdiffError(f"gate '{self.name}' has no inverse defined")
        return self.inverse_fn(tuple(angles))

    # -- recording ----------------------------------------------------------------------------
    def __call__(self, *args, wires=None, **kwargs):
        """Record this gate: ``qd.RX(0.3, wires=0)``, ``qd.CNOT([0, 1])``, ``qd.Rot(a, b, c, 0)``."""
        args = list(args)
        if wires is None:
            if len(args) != self.num_params + 1:
                raise QdiffError(f"gate '{self.pl_name or self.name}' takes {self.num_params} "
                                 f"parameter(s) and wires; got {len(args)} positional argument(s)")
            wires = args.pop()
        if len(args) != self.num_params:
            raise QdiffError(f"gate '{self.pl_name or self.name}' takes {self.num_params} "
                             f"parameter(s); got {len(args)}")
        if kwargs:
            raise QdiffError(f"gate '{self.pl_name or self.name}': unexpected keyword(s) "
                             f"{sorted(kwargs)}")
        return recording.record_operation(self, wires, args)

    def __repr__(self):
        return f"Gate({self.name!r})"

    def __deepcopy__(self, memo):
        """A gate is immutable: a deep copy (of a circuit, a model) shares it."""
        return self

    def __reduce__(self):
        """Pickle a registered gate by its name (its functions are closures); a gate made per
        call (``PauliRot``, ``QubitUnitary``, ``qd.ctrl``, ...) does not pickle."""
        if GATES.get(self.name) is self:
            return get_gate, (self.name,)
        raise QdiffError(f"cannot pickle gate '{self.pl_name or self.name}': only registered "
                         "gates pickle (by name); save the parameters (a state_dict) and "
                         "rebuild the circuit instead")


@caches.cached(maxsize=None)
def generator_spectrum(gate: Gate, slot: int, tol: float = 1e-9) -> np.ndarray:
    """Distinct eigenvalues of ``gate.generators[slot]``, ascending (see :meth:`Gate.spectrum`).
    A gate that is not one of qdiff's own records has its generator checked against its
    matrix first (:func:`check_generator`)."""
    if gate.generators is None or gate.generators[slot] is None:
        raise QdiffError(f"gate '{gate.pl_name or gate.name}' has no generator for parameter "
                         f"{slot}")
    if isinstance(gate.generators[slot], (PauliGenerator, ControlledGenerator)):
        return gate.generators[slot].spectrum()
    if not _own_record(gate):
        check_generator(gate, slot)
    out: list = []
    for v in np.sort(np.linalg.eigvalsh(np.asarray(gate.generators[slot]))):
        if not out or v - out[-1] > tol:
            out.append(float(v))
    return np.array(out)


_CHECK_MAX_WIRES = 6  # a larger gate's generator is taken as given (dense checks cost 8**k)


def _own_record(gate: Gate) -> bool:
    """Whether ``gate`` is one of qdiff's own records (a built-in gate, a MultiRZ / PauliRot /
    PCPhase of the factories below, or one of those controlled): generators checked by the
    tests, not at run time."""
    if BUILTIN_GATES.get(gate.name) is gate:
        return True
    h = gate.hyper
    if gate.name == "multirz" and len(h) == 1:
        return multirz_gate(gate.num_wires) is gate
    if gate.name == "paulirot" and len(h) == 1 and isinstance(h[0], str):
        return paulirot_gate(h[0]) is gate
    if gate.name == "pcphase" and len(h) == 2:
        return pcphase_gate(*h) is gate
    if gate.name == "ctrl" and len(h) == 2 and isinstance(h[0], Gate):
        return controlled_gate(*h) is gate and _own_record(h[0])
    return False


def check_generator(gate: Gate, slot: int) -> None:
    """Refuse a generator that does not match the gate's matrix: for ``U = A exp(-i phi G) B``,
    ``i U^dag dU/dphi = B^dag G B`` has G's eigenvalues at every angle (checked at two angles,
    by central differences). Shift rules and the engines' reverse modes derive from them, so
    a generator off by a factor would make those gradients wrong."""
    name = gate.pl_name or gate.name
    g = np.asarray(gate.generators[slot], dtype=complex)
    d = 2 ** gate.num_wires
    if g.shape != (d, d) or not np.allclose(g, g.conj().T, atol=1e-10):
        raise QdiffError(f"gate '{name}': the generator of parameter {slot} must be a Hermitian "
                         f"{d}x{d} matrix; got shape {g.shape}"
                         + ("" if g.shape != (d, d) else " (not Hermitian)"))
    if gate.num_wires > _CHECK_MAX_WIRES:
        return
    want = np.linalg.eigvalsh(g)
    scale = max(1.0, float(np.abs(want).max()))
    for angles in ((0.37, -1.21, 0.83), (2.05, 0.61, -2.4)):
        a = [torch.tensor(angles[i % 3], dtype=torch.float64) for i in range(gate.num_params)]
        try:
            u = gate.matrix(*a).detach()
            # central-difference error ~ (h |G|)**2 against rounding ~ eps / h
            low = u.dtype not in (torch.complex128, torch.float64)
            h, rtol = (3e-3, 1e-3) if low else (1e-4, 1e-5)
            up, dn = list(a), list(a)
            up[slot], dn[slot] = a[slot] + h / scale, a[slot] - h / scale
            u, u_up, u_dn = (m.to(torch.complex128).numpy() for m in (
                u, gate.matrix(*up).detach(), gate.matrix(*dn).detach()))
        except Exception as e:  # a user's matrix function
            raise QdiffError(f"gate '{name}': its matrix function failed at angles "
                             f"{[float(x) for x in a]}: {e}") from None
        m = 1j * u.conj().T @ (u_up - u_dn) / (2 * h / scale)
        got = np.linalg.eigvalsh((m + m.conj().T) / 2)
        if not np.allclose(got, want, atol=rtol * scale):
            raise QdiffError(
                f"gate '{name}': the generator of parameter {slot} does not match its matrix "
                f"(U = A exp(-i phi G) B needs G's eigenvalues {np.round(want, 6).tolist()}; "
                f"the matrix has {np.round(got, 6).tolist()}); its shift rule and reverse-mode "
                "gradients would be wrong")


def check_record(gate: Gate) -> None:
    """Refuse ``generators`` / ``shift_rules`` that do not give one entry per parameter, and a
    shift rule that is not a sequence of ``(coefficient, shift)`` pairs of finite numbers."""
    name = gate.pl_name or gate.name
    for field_name in ("generators", "shift_rules"):
        entries = getattr(gate, field_name)
        if entries is not None and len(entries) != gate.num_params:
            raise QdiffError(f"gate '{name}': {field_name} has {len(entries)} entr"
                             f"{'y' if len(entries) == 1 else 'ies'} for {gate.num_params} "
                             "parameter(s) (one per parameter; None for a parameter without)")
    for slot, rule in enumerate(gate.shift_rules or ()):
        if rule is None:
            continue
        try:
            pairs = [(float(c), float(x)) for c, x in rule]
        except (TypeError, ValueError):
            pairs = None
        if pairs is None or not all(math.isfinite(c) and math.isfinite(x) for c, x in pairs):
            raise QdiffError(f"gate '{name}': the shift rule of parameter {slot} must be a "
                             f"sequence of (coefficient, shift) pairs of finite "
                             f"numbers; got {rule!r:.80}")


@caches.cached(maxsize=None)
def generator_on_left(gate: Gate) -> bool:
    """Whether a one-parameter gate is ``exp(-i phi G) B`` (``dU/dphi = -i G U``), the form
    the engines' reverse modes differentiate directly; a gate ``A exp(-i phi G) B`` with an
    ``A`` that does not commute with G takes the spectral-shift formula instead. qdiff's own
    records are of that form (tests/test_gate_facts.py); another gate is checked at two
    angles (one of more than ``_CHECK_MAX_WIRES`` wires is taken as given)."""
    if gate.num_wires > _CHECK_MAX_WIRES or _own_record(gate):
        return True
    g = np.asarray(gate.generators[0], dtype=complex)
    h = 1e-4 / max(1.0, float(np.abs(g).max()))
    for phi in (0.37, 2.05):
        u, u_up, u_dn = (gate.matrix(torch.tensor(x, dtype=torch.float64)).detach()
                         .to(torch.complex128).numpy() for x in (phi, phi + h, phi - h))
        if not np.allclose(1j * (u_up - u_dn) / (2 * h) @ u.conj().T, g,
                           atol=1e-6 * max(1.0, float(np.abs(g).max()))):
            return False
    return True


def _self_inverse(gate_name: str):
    return lambda p: (GATES[gate_name], p)


def _negate(gate_name: str):
    return lambda p: (GATES[gate_name], tuple(-a for a in p))


# ---------------------------------------------------------------------------------------------
# matrices

_I2 = np.eye(2, dtype=complex)
_X = np.array([[0, 1], [1, 0]], dtype=complex)
_Y = np.array([[0, -1j], [1j, 0]], dtype=complex)
_Z = np.array([[1, 0], [0, -1]], dtype=complex)
_H = np.array([[1, 1], [1, -1]], dtype=complex) * _SQ2
_P1 = np.array([[0, 0], [0, 1]], dtype=complex)


def _const(m: np.ndarray):
    t64 = torch.tensor(m, dtype=torch.complex128)

    def fn(*_):
        return t64
    return fn


def _controlled_np(u: np.ndarray, controls: int = 1) -> np.ndarray:
    d = u.shape[0]
    full = np.eye(d * 2 ** controls, dtype=complex)
    full[-d:, -d:] = u
    return full


def _controlled_fn(target_fn: Callable, d: int, controls: int = 1):
    def fn(*angles):
        u = target_fn(*angles)
        batch = u.shape[:-2]
        full = torch.eye(d * 2 ** controls, dtype=u.dtype, device=u.device).expand(*batch, -1, -1)
        top = full[..., :-d, :]
        left = torch.zeros(*batch, d, d * 2 ** controls - d, dtype=u.dtype, device=u.device)
        return torch.cat([top, torch.cat([left, u], dim=-1)], dim=-2)
    return fn


def _rx(t):
    c, s = _cplx(torch.cos(t / 2)), _cplx(torch.sin(t / 2))
    return _stack([[c, -1j * s], [-1j * s, c]], t)


def _ry(t):
    c, s = _cplx(torch.cos(t / 2)), _cplx(torch.sin(t / 2))
    return _stack([[c, -s], [s, c]], t)


def _rz_diag(t):
    return torch.stack([_expi(-t / 2), _expi(t / 2)], dim=-1)


def _phase_diag(t):
    return torch.stack([torch.ones_like(_cplx(t)), _expi(t)], dim=-1)


def _rot(phi, theta, omega):
    c, s_ = _cplx(torch.cos(theta / 2)), _cplx(torch.sin(theta / 2))
    # phases as products, not of the angles' sum: unitary to rounding for any finite angles
    # (phi + omega drops omega when |phi| is 1e17 or more, and is infinite near 1e308)
    ep, eo = _expi(-phi / 2), _expi(-omega / 2)
    a, b = ep * eo, ep.conj() * eo
    return _stack([[a * c, -b * s_], [b.conj() * s_, a.conj() * c]], theta)


def _u3(theta, phi, lam):
    c, s = _cplx(torch.cos(theta / 2)), _cplx(torch.sin(theta / 2))
    el, ep = _expi(lam), _expi(phi)  # e^{i(phi + lam)} as a product, as in _rot
    return _stack([[c, -el * s], [ep * s, ep * el * c]], theta)


def _u2(phi, lam):
    return _u3(torch.full_like(phi, math.pi / 2), phi, lam)


def _ising(pauli: np.ndarray):
    pp = torch.tensor(np.kron(pauli, pauli), dtype=torch.complex128)
    eye = torch.eye(4, dtype=torch.complex128)

    def fn(t):
        c, s = _cplx(torch.cos(t / 2)), _cplx(torch.sin(t / 2))
        return (c[..., None, None] * eye.to(device=c.device, dtype=c.dtype)
                - 1j * s[..., None, None] * pp.to(device=c.device, dtype=c.dtype))
    return fn


def _isingzz_diag(t):
    a, b = _expi(-t / 2), _expi(t / 2)
    return torch.stack([a, b, b, a], dim=-1)


def _single_exc(t):
    c, s = _cplx(torch.cos(t / 2)), _cplx(torch.sin(t / 2))
    return _stack([[1, 0, 0, 0], [0, c, -s, 0], [0, s, c, 0], [0, 0, 0, 1]], t)


def _double_exc(t):
    c, s = _cplx(torch.cos(t / 2)), _cplx(torch.sin(t / 2))
    eye = torch.eye(16, dtype=c.dtype, device=c.device).expand(*t.shape, 16, 16).clone()
    eye[..., 3, 3] = c
    eye[..., 12, 12] = c
    eye[..., 3, 12] = -s
    eye[..., 12, 3] = s
    return eye


def _exc_generator(d: int, i: int, j: int) -> np.ndarray:
    g = np.zeros((d, d), dtype=complex)
    g[i, j] = -0.5j
    g[j, i] = 0.5j
    return g


def _perm_of(m: np.ndarray) -> tuple:
    return tuple(int(np.argmax(np.abs(row))) for row in m)


# ---------------------------------------------------------------------------------------------
# the registry

GATES: dict[str, Gate] = {}
_ALIASES: dict[str, str] = {}
BUILTIN_GATES: dict[str, Gate] = {}  # filled once the built-in gates below are registered
_BUILTINS_DONE = False


def register_gate(gate: Gate, aliases: Sequence[str] = (), replace: bool = False) -> Gate:
    """Register ``gate`` under its name (and aliases) so that QASM I/O and the rules find it.

    A custom gate needs a ``matrix_fn`` and either ``generators`` (shift rules are derived from
    their spectra) or explicit ``shift_rules``.
    """
    if gate.name in GATES and not replace:
        raise QdiffError(f"a gate named '{gate.name}' is already registered")
    if _BUILTINS_DONE:  # a user's gate: checked now
        check_record(gate)
    if _BUILTINS_DONE and gate.generators is not None:
        for slot, g in enumerate(gate.generators):
            if g is not None:
                check_generator(gate, slot)
    GATES[gate.name] = gate
    for a in (gate.pl_name, *aliases):
        if a:
            _ALIASES[a.lower()] = gate.name
    return gate


def unregister_gate(name: str) -> None:
    """Remove a registered gate and its aliases (e.g. a custom gate in a test)."""
    gate = GATES.pop(name, None)
    for alias in [a for a, target in _ALIASES.items() if target == name]:
        del _ALIASES[alias]
    if gate is None:
        raise QdiffError(f"no gate named '{name}' is registered")


def get_gate(name: str) -> Gate:
    """Look a gate up by OpenQASM name, PennyLane name or alias (case-insensitive)."""
    key = name.lower()
    key = _ALIASES.get(key, key)
    if key not in GATES:
        raise QdiffError(f"unknown gate '{name}'")
    return GATES[key]


def _g(name, wires, params, fn, gens=None, inv=None, diag=None, perm=None, controls=0,
       target=None, pl="", qk="", aliases=(), decomp=None, native=""):
    gate = Gate(name=name, num_wires=wires, num_params=params, matrix_fn=fn,
                generators=None if gens is None else tuple(np.asarray(g, dtype=complex) for g in gens),
                inverse_fn=inv, diag_fn=diag, perm=perm, controls=controls, target=target,
                pl_name=pl, qiskit_name=qk or name, decomposition=decomp, native_code=native)
    return register_gate(gate, aliases)


def _fixed(name, m, inv=None, pl="", qk="", aliases=(), controls=0, target=None, decomp=None):
    m = np.asarray(m, dtype=complex)
    is_diag = np.allclose(m, np.diag(np.diag(m)))
    is_perm = (not is_diag) and np.allclose(np.abs(m), (np.abs(m) > 0.5)) and np.allclose(
        m[np.abs(m) > 0.5], 1.0)
    d = torch.tensor(np.diag(m), dtype=torch.complex128)
    return _g(name, int(round(math.log2(m.shape[0]))), 0, _const(m),
              inv=inv or _self_inverse(name), diag=(lambda *_: d) if is_diag else None,
              perm=_perm_of(m) if is_perm else None, controls=controls, target=target, pl=pl,
              qk=qk, aliases=aliases, decomp=decomp)


_S = np.diag([1, 1j])
_T = np.diag([1, np.exp(1j * math.pi / 4)])
_SX = 0.5 * np.array([[1 + 1j, 1 - 1j], [1 - 1j, 1 + 1j]])

_fixed("id", _I2, pl="Identity", aliases=("I",))
_fixed("x", _X, pl="PauliX", aliases=("X", "NOT"))
_fixed("y", _Y, pl="PauliY", aliases=("Y",))
_fixed("z", _Z, pl="PauliZ", aliases=("Z",))
_fixed("h", _H, pl="Hadamard", aliases=("H",))
_fixed("s", _S, inv=lambda p: (GATES["sdg"], p), pl="S")
_fixed("sdg", _S.conj().T, inv=lambda p: (GATES["s"], p), pl="Sdg", aliases=("Adjoint(S)",))
_fixed("t", _T, inv=lambda p: (GATES["tdg"], p), pl="T")
_fixed("tdg", _T.conj().T, inv=lambda p: (GATES["t"], p), pl="Tdg", aliases=("Adjoint(T)",))
_fixed("sx", _SX, inv=lambda p: (GATES["sxdg"], p), pl="SX")
_fixed("sxdg", _SX.conj().T, inv=lambda p: (GATES["sx"], p), pl="SXdg", aliases=("Adjoint(SX)",))

_g("rx", 1, 1, _rx, gens=[_X / 2], inv=_negate("rx"), pl="RX", native="rx")
_g("ry", 1, 1, _ry, gens=[_Y / 2], inv=_negate("ry"), pl="RY", native="ry")
_g("rz", 1, 1, lambda t: _diag_embed(_rz_diag(t)), gens=[_Z / 2], inv=_negate("rz"),
   diag=_rz_diag, pl="RZ", native="rz")
_g("p", 1, 1, lambda t: _diag_embed(_phase_diag(t)), gens=[-_P1], inv=_negate("p"),
   diag=_phase_diag, pl="PhaseShift", qk="p", aliases=("phase", "cphaseshift0"), native="phase")
_g("u1", 1, 1, lambda t: _diag_embed(_phase_diag(t)), gens=[-_P1], inv=_negate("u1"),
   diag=_phase_diag, pl="U1", native="phase")
_g("rot", 1, 3, _rot, gens=[_Z / 2, _Y / 2, _Z / 2],
   inv=lambda p: (GATES["rot"], (-p[2], -p[1], -p[0])), pl="Rot", native="rot",
   decomp=lambda p: [("rz", (p[0],)), ("ry", (p[1],)), ("rz", (p[2],))])
# U3 = exp(i(phi+lam)/2) RZ(phi) RY(theta) RZ(lam): the phase makes the phi/lam generators -P1
_g("u3", 1, 3, _u3, gens=[_Y / 2, -_P1, -_P1],
   inv=lambda p: (GATES["u3"], (-p[0], -p[2], -p[1])), pl="U3", aliases=("u", "U"),
   decomp=lambda p: [("rz", (p[2],)), ("ry", (p[0],)), ("rz", (p[1],))])
_g("u2", 1, 2, _u2, gens=[-_P1, -_P1],
   inv=lambda p: (GATES["u3"], (-math.pi / 2, -p[1], -p[0])), pl="U2",
   decomp=lambda p: [("rz", (p[1],)), ("ry", (math.pi / 2,)), ("rz", (p[0],))])

_CX = _controlled_np(_X)
_fixed("cx", _CX, pl="CNOT", aliases=("CX",), controls=1, target=GATES["x"])
_fixed("cy", _controlled_np(_Y), pl="CY", controls=1, target=GATES["y"])
_fixed("cz", _controlled_np(_Z), pl="CZ", controls=1, target=GATES["z"])
_fixed("ch", _controlled_np(_H), pl="CH", controls=1, target=GATES["h"])
_SWAP = np.eye(4)[[0, 2, 1, 3]]
_fixed("swap", _SWAP, pl="SWAP")
_ISWAP = np.array([[1, 0, 0, 0], [0, 0, 1j, 0], [0, 1j, 0, 0], [0, 0, 0, 1]])
_fixed("iswap", _ISWAP, inv=lambda p: (GATES["iswapdg"], p), pl="ISWAP", aliases=("iSWAP",))
_fixed("iswapdg", _ISWAP.conj().T, inv=lambda p: (GATES["iswap"], p), pl="Adjoint(ISWAP)")
_ECR = _SQ2 * np.array([[0, 0, 1, 1j], [0, 0, 1j, 1], [1, -1j, 0, 0], [-1j, 1, 0, 0]])
_fixed("ecr", _ECR, pl="ECR")
_fixed("ccx", _controlled_np(_X, 2), pl="Toffoli", aliases=("CCX", "CCNOT"), controls=2,
       target=GATES["x"])
_fixed("cswap", _controlled_np(_SWAP), pl="CSWAP", aliases=("Fredkin",), controls=1,
       target=GATES["swap"])
_fixed("ccz", _controlled_np(_Z, 2), pl="CCZ", controls=2, target=GATES["z"])


def _controlled_rot(name, base: str, pl: str, qk: str = "", decomp=None):
    tgt = GATES[base]
    gens = [np.kron(_P1, g) for g in tgt.generators]
    diag = None
    if tgt.diag_fn is not None:
        def diag(*a, _t=tgt):
            d = _t.diag_fn(*a)
            return torch.cat([torch.ones_like(d), d], dim=-1)
    inv = (lambda p: (GATES[name], tuple(-a for a in p))) if base != "rot" else (
        lambda p: (GATES[name], (-p[2], -p[1], -p[0])))
    return _g(name, 2, tgt.num_params, _controlled_fn(tgt.matrix_fn, 2), gens=gens, inv=inv,
              diag=diag, controls=1, target=tgt, pl=pl, qk=qk, decomp=decomp)


_controlled_rot("crx", "rx", "CRX")
_controlled_rot("cry", "ry", "CRY")
_controlled_rot("crz", "rz", "CRZ")
_controlled_rot("cp", "p", "ControlledPhaseShift", qk="cp")
_ALIASES["cphase"] = "cp"
_ALIASES["cu1"] = "cp"
_controlled_rot("crot", "rot", "CRot",
                decomp=lambda p: [("crz", (p[0],)), ("cry", (p[1],)), ("crz", (p[2],))])

_g("rxx", 2, 1, _ising(_X), gens=[np.kron(_X, _X) / 2], inv=_negate("rxx"), pl="IsingXX",
   native="rxx")
_g("ryy", 2, 1, _ising(_Y), gens=[np.kron(_Y, _Y) / 2], inv=_negate("ryy"), pl="IsingYY",
   native="ryy")
_g("rzz", 2, 1, lambda t: _diag_embed(_isingzz_diag(t)), gens=[np.kron(_Z, _Z) / 2],
   inv=_negate("rzz"), diag=_isingzz_diag, pl="IsingZZ", native="rzz")
_g("single_excitation", 2, 1, _single_exc, gens=[_exc_generator(4, 1, 2)],
   inv=_negate("single_excitation"), pl="SingleExcitation", native="single_excitation")
_g("double_excitation", 4, 1, _double_exc, gens=[_exc_generator(16, 3, 12)],
   inv=_negate("double_excitation"), pl="DoubleExcitation", native="double_excitation")


# the rest of PennyLane's qubit gates, in PennyLane's conventions (matrices, generators and
# parameter order checked against qml.matrix and qml.generator: qdiff's G is minus PennyLane's,
# which writes U = exp(i phi G))


def _exp_gen(g: np.ndarray):
    """``phi -> exp(-i phi G)`` for a constant Hermitian ``G``, through its eigenbasis (exact
    to rounding, differentiable in ``phi``, batched)."""
    ev, vec = np.linalg.eigh(g)
    ev_t = torch.tensor(ev, dtype=torch.float64)
    v_t = torch.tensor(vec, dtype=torch.complex128)

    def fn(t):
        v = v_t.to(device=t.device, dtype=_cplx(t).dtype)
        ph = _expi(-t[..., None] * ev_t.to(device=t.device, dtype=t.dtype))
        # sum_k v[i, k] ph[k] conj(v[j, k]) as products and a sum, not a matrix product: a
        # batched BLAS call can start a thread pool, which hangs in a forked child of a
        # process that ran one (the kernels' own fork safety, test_native.py)
        return ((v * ph[..., None, :])[..., :, None, :] * v.conj()[..., None, :, :]).sum(-1)
    return fn


def _diag_gen(d: np.ndarray):
    """``phi -> exp(-i phi d)`` for the real diagonal ``d`` of a diagonal generator."""
    d_t = torch.tensor(np.real(d), dtype=torch.float64)
    return lambda t: _expi(-t[..., None] * d_t.to(t.dtype).to(t.device))


def _scale(p, c: float):
    """``c * p`` for a float, tensor or ParamRef angle."""
    return float(p) * c if isinstance(p, (int, float)) else p * c


def _proj(d: int, *idx: int) -> np.ndarray:
    m = np.zeros((d, d), dtype=complex)
    for i in idx:
        m[i, i] = 1.0
    return m


_XX, _YY, _ZZ = np.kron(_X, _X), np.kron(_Y, _Y), np.kron(_Z, _Z)
_G_XY = -(_XX + _YY) / 4
# GlobalPhase(phi) = exp(-i phi) I: one wire holds it (the same on any wires; qd.GlobalPhase
# records it on the first wire it is given)
_g("globalphase", 1, 1, lambda t: _diag_embed(_diag_gen(np.ones(2))(t)), gens=[_I2],
   inv=_negate("globalphase"), diag=_diag_gen(np.ones(2)), pl="GlobalPhase")
_g("isingxy", 2, 1, _exp_gen(_G_XY), gens=[_G_XY], inv=_negate("isingxy"), pl="IsingXY")
for _bits in ("00", "01", "10"):
    _i = int(_bits, 2)
    _gd = -np.diag(_proj(4, _i))
    _g(f"cphaseshift{_bits}", 2, 1, lambda t, _f=_diag_gen(_gd): _diag_embed(_f(t)),
       gens=[np.diag(_gd)], inv=_negate(f"cphaseshift{_bits}"), diag=_diag_gen(_gd),
       pl=f"CPhaseShift{_bits}")
# PSWAP(phi) = SWAP exp(-i phi G), G = -(|01><01| + |10><10|)
_G_PSWAP = -_proj(4, 1, 2)
_pswap_phase = _diag_gen(np.diag(_G_PSWAP))
_g("pswap", 2, 1, lambda t: _diag_embed(_pswap_phase(t))[..., [0, 2, 1, 3], :],
   gens=[_G_PSWAP], inv=_negate("pswap"), pl="PSWAP",
   decomp=lambda p: [("swap", ()), ("cx", ()), ("p", (p[0],), (1,)), ("cx", ())])
_G_SE = _exc_generator(4, 1, 2)
for _s, _sfx in ((1, "plus"), (-1, "minus")):
    # the excitation rotation, and exp(+-i phi/2) on |00> and |11>
    _gen = _G_SE - _s * 0.5 * _proj(4, 0, 3)
    _g(f"single_excitation_{_sfx}", 2, 1, _exp_gen(_gen), gens=[_gen],
       inv=_negate(f"single_excitation_{_sfx}"), pl=f"SingleExcitation{_sfx.title()}")
    _gen = _exc_generator(16, 3, 12) - _s * 0.5 * (np.eye(16) - _proj(16, 3, 12))
    _g(f"double_excitation_{_sfx}", 4, 1, _exp_gen(_gen), gens=[_gen],
       inv=_negate(f"double_excitation_{_sfx}"), pl=f"DoubleExcitation{_sfx.title()}")
_XZY_YZX = np.kron(_X, np.kron(_Z, _Y)) - np.kron(_Y, np.kron(_Z, _X))
_G_ORB = -0.25 * (np.kron(_XZY_YZX, _I2) + np.kron(_I2, _XZY_YZX))
_g("orbital_rotation", 4, 1, _exp_gen(_G_ORB), gens=[_G_ORB], inv=_negate("orbital_rotation"),
   pl="OrbitalRotation")
# FermionicSWAP(phi) = exp(-i phi G), G = -I/2 + (Z0 + Z1)/4 + (XX + YY)/4: the (XX + YY) and
# Z terms do not commute term by term, so its decomposition is given
_G_FSWAP = -0.5 * np.eye(4) + (np.kron(_Z, _I2) + np.kron(_I2, _Z)) / 4 + (_XX + _YY) / 4
_g("fermionic_swap", 2, 1, _exp_gen(_G_FSWAP), gens=[_G_FSWAP], inv=_negate("fermionic_swap"),
   pl="FermionicSWAP",
   decomp=lambda p: [("isingxy", (-p[0],)), ("rz", (_scale(p[0], 0.5),), (0,)),
                     ("rz", (_scale(p[0], 0.5),), (1,)), ("globalphase", (_scale(p[0], -0.5),),
                                                          (0,))])
# SISWAP = sqrt(iSWAP) = IsingXY(pi/2)
_fixed("siswap", _exp_gen(_G_XY)(torch.tensor(math.pi / 2, dtype=torch.float64)).numpy(),
       inv=lambda p: (GATES["isingxy"], (-math.pi / 2,)), pl="SISWAP", aliases=("SQISW",),
       decomp=lambda p: [("isingxy", (math.pi / 2,))])
_CARRY = np.eye(16)[[0, 1, 2, 3, 7, 6, 4, 5, 8, 9, 11, 10, 15, 14, 13, 12]]
_fixed("qubit_carry", _CARRY, inv=lambda p: (unitary_gate(_CARRY.T), ()), pl="QubitCarry",
       decomp=lambda p: [("ccx", (), (1, 2, 3)), ("cx", (), (1, 2)), ("ccx", (), (0, 2, 3))])
_fixed("qubit_sum", np.eye(8)[[0, 1, 3, 2, 5, 4, 6, 7]], pl="QubitSum",
       decomp=lambda p: [("cx", (), (1, 2)), ("cx", (), (0, 2))])

# ---------------------------------------------------------------------------------------------
# compiler facts: commutation classes, rotation axes and angles, symmetric wires, Euler angles


def _compiler_facts(name: str, **facts) -> None:
    """Attach compiler facts to a registered gate (at import, before any use: the record stays
    one object, so identity-based lookups such as the native kernels' keep working)."""
    for key, value in facts.items():
        object.__setattr__(GATES[name], key, value)


for _n in ("id", "z", "s", "sdg", "t", "tdg"):
    _compiler_facts(_n, wire_axes=("z",),
                    axis_angle={"id": 0.0, "z": math.pi, "s": math.pi / 2, "sdg": -math.pi / 2,
                                "t": math.pi / 4, "tdg": -math.pi / 4}[_n])
for _n in ("x", "sx", "sxdg"):
    _compiler_facts(_n, wire_axes=("x",),
                    axis_angle={"x": math.pi, "sx": math.pi / 2, "sxdg": -math.pi / 2}[_n])
for _n in ("rz", "p", "u1"):
    _compiler_facts(_n, wire_axes=("z",), additive=True)
_compiler_facts("rx", wire_axes=("x",), additive=True)
_compiler_facts("ry", additive=True)
for _n, _axes in (("cx", ("z", "x")), ("cz", ("z", "z")), ("cp", ("z", "z")),
                  ("crz", ("z", "z")), ("rzz", ("z", "z")), ("rxx", ("x", "x")),
                  ("crx", ("z", "x"))):
    _compiler_facts(_n, wire_axes=_axes)
for _n in ("rzz", "rxx", "ryy", "crz", "crx", "cry", "cp"):
    _compiler_facts(_n, additive=True)
for _n in ("cphaseshift00", "cphaseshift01", "cphaseshift10"):
    _compiler_facts(_n, wire_axes=("z", "z"))
for _n in ("isingxy", "cphaseshift00", "cphaseshift01", "cphaseshift10", "single_excitation",
           "single_excitation_plus", "single_excitation_minus", "double_excitation",
           "double_excitation_plus", "double_excitation_minus", "orbital_rotation",
           "fermionic_swap"):
    _compiler_facts(_n, additive=True)
for _n in ("cz", "swap", "rzz", "rxx", "ryy", "cp", "iswap", "ccz", "isingxy", "pswap",
           "cphaseshift00", "fermionic_swap", "siswap"):
    _compiler_facts(_n, symmetric=True)
_compiler_facts("u3", zyz=lambda p: (p[2], p[0], p[1]))
_compiler_facts("u2", zyz=lambda p: (p[1], math.pi / 2, p[0]))
_compiler_facts("rot", zyz=lambda p: (p[0], p[1], p[2]))  # rot = RZ(omega) RY(theta) RZ(phi)

# the built-in gates as defined here (a user may replace a registry entry; the native kernels'
# formulas apply to these objects only)
BUILTIN_GATES.update(GATES)
_BUILTINS_DONE = True


# ---------------------------------------------------------------------------------------------
# gate families with a width or data fixed per instance


_PAULI = {"I": _I2, "X": _X, "Y": _Y, "Z": _Z}


def _kron_all(ms) -> np.ndarray:
    return functools.reduce(np.kron, ms, np.eye(1, dtype=complex))


#: widest MultiRZ / PauliRot whose generator is kept as a dense matrix; a wider one keeps its
#: Pauli word (:class:`PauliGenerator`) and the engines run it as a basis change around a
#: diagonal (:func:`qdiff.circuits.decompositions.lowered`)
DENSE_WORD_WIRES = 6


class PauliGenerator:
    """The generator ``coeff * P`` of a Pauli word ``P`` on many wires, kept as the word: its
    spectrum, diagonal and Pauli terms come from the word; a dense matrix is made only when a
    caller asks for one (``np.asarray``), checked against memory first."""

    __slots__ = ("word", "coeff")
    ndim = 2

    def __init__(self, word: str, coeff: float):
        self.word, self.coeff = word, float(coeff)

    @property
    def shape(self) -> tuple:
        return (2 ** len(self.word),) * 2

    def spectrum(self) -> np.ndarray:
        c = abs(self.coeff)
        return np.array([self.coeff] if set(self.word) <= {"I"} else [-c, c])

    def diagonal(self) -> np.ndarray:
        """The diagonal (zero unless the word has only I and Z letters)."""
        if set(self.word) - {"I", "Z"}:
            return np.zeros(2 ** len(self.word))
        return self.coeff * _word_signs(self.word)

    def __array__(self, dtype=None, copy=None):
        side = 2 ** len(self.word)
        memory.require(16.0 * side * side, f"the generator of a Pauli rotation on "
                                           f"{len(self.word)} wires as a dense {side}x{side} "
                                           "matrix")
        m = self.coeff * _kron_all([_PAULI[c] for c in self.word])
        return m if dtype is None else m.astype(dtype)

    def __repr__(self):
        return f"PauliGenerator({self.word!r}, {self.coeff})"


class ControlledGenerator:
    """The generator ``|1..1><1..1| ⊗ G`` of a gate controlled by ``k`` wires, kept as
    ``(k, G)``: its spectrum is G's and 0; a dense matrix is made only when a caller asks for
    one (``np.asarray``), checked against memory first (a gate with many controls runs coded
    through its target, and its shift rules need only the spectrum)."""

    __slots__ = ("k", "base")
    ndim = 2

    def __init__(self, k: int, base):
        self.k, self.base = int(k), base

    @property
    def shape(self) -> tuple:
        return (2 ** self.k * np.shape(self.base)[0],) * 2

    def spectrum(self, tol: float = 1e-9) -> np.ndarray:
        vals = self.base.spectrum() if hasattr(self.base, "spectrum") else \
            np.linalg.eigvalsh(np.asarray(self.base))
        out: list = []
        for v in np.sort(np.append(np.asarray(vals, dtype=float), 0.0)):
            if not out or v - out[-1] > tol:
                out.append(float(v))
        return np.array(out)

    def diagonal(self) -> np.ndarray:
        """The diagonal: zeros, then G's diagonal on the all-ones control block."""
        base = self.base.diagonal() if hasattr(self.base, "diagonal") else \
            np.diagonal(np.asarray(self.base))
        return np.concatenate([np.zeros((2 ** self.k - 1) * len(base), dtype=base.dtype), base])

    def __array__(self, dtype=None, copy=None):
        side = self.shape[0]
        memory.require(16.0 * side * side, f"the generator of a gate controlled by {self.k} "
                                           f"wires as a dense {side}x{side} matrix")
        proj = np.zeros((2 ** self.k, 2 ** self.k), dtype=complex)
        proj[-1, -1] = 1.0
        m = np.kron(proj, np.asarray(self.base))
        return m if dtype is None else m.astype(dtype)

    def __repr__(self):
        return f"ControlledGenerator({self.k}, {self.base!r})"


def _word_signs(word: str) -> np.ndarray:
    """The diagonal of an I/Z word: ``(-1)**(parity of the Z bits)`` per basis state."""
    return functools.reduce(np.kron, [np.array([1.0, -1.0]) if c == "Z" else np.ones(2)
                                      for c in word], np.ones(1))


def _signs_on_demand(word: str):
    """``get(device, dtype)``: the diagonal of an I/Z word as a tensor, made on first use and
    checked against memory first (a wide word's ``2**n`` signs are the size of a state; the
    engines apply wide words without them)."""
    box: list = []

    def get(device, dtype):
        if not box:
            memory.require(16.0 * 2 ** len(word), f"the {2 ** len(word)} signs of a "
                           f"{len(word)}-wire Z word (its diagonal)")
            with caches.constants():  # kept by the gate: plain, whatever transform asks first
                box.append(torch.tensor(_word_signs(word), dtype=torch.float64))
        return box[0].to(dtype).to(device)
    return get


def _dense_on_demand(fn, what: str, k: int):
    """``fn`` (a matrix function on ``k`` wires) with its dense output checked against memory
    first: wide rotations run structured; their matrix is made only when asked for."""
    side = 2 ** k

    def checked(t):
        memory.require(16.0 * side * side * max(1, t.numel()),
                       f"the matrix of {what} on {k} wires (dense {side}x{side})", t.device)
        return fn(t)
    return checked


@caches.cached(maxsize=None)
def multirz_gate(n: int) -> Gate:
    """``exp(-i theta Z⊗…⊗Z / 2)`` on ``n`` wires (diagonal)."""
    signs = _signs_on_demand("Z" * n)

    def diag(t):
        return _expi(-t[..., None] / 2 * signs(t.device, t.dtype))
    if n > DENSE_WORD_WIRES:
        gen, fn = PauliGenerator("Z" * n, 0.5), _dense_on_demand(
            lambda t: _diag_embed(diag(t)), "MultiRZ", n)
    else:
        gen, fn = np.diag(_word_signs("Z" * n)) / 2 + 0j, lambda t: _diag_embed(diag(t))
    gate = Gate("multirz", n, 1, fn, generators=(gen,),
                inverse_fn=lambda p: (multirz_gate(n), (-p[0],)), diag_fn=diag,
                pl_name="MultiRZ", qiskit_name="multirz", hyper=(n,), native_code="multirz")
    return gate


@caches.cached(maxsize=None)
def paulirot_gate(word: str) -> Gate:
    """``exp(-i theta P / 2)`` for a Pauli word such as ``"XYZ"``."""
    if not word or any(c not in "IXYZ" for c in word):
        raise QdiffError(f"PauliRot: invalid Pauli word '{word}' (letters I, X, Y, Z)")
    wide = len(word) > DENSE_WORD_WIRES
    dense = None if wide else _kron_all([_PAULI[c] for c in word])
    pt0 = None if wide else torch.tensor(dense, dtype=torch.complex128)

    def fn(t):
        c, s = _cplx(torch.cos(t / 2)), _cplx(torch.sin(t / 2))
        pt = pt0 if pt0 is not None else torch.tensor(_kron_all([_PAULI[x] for x in word]))
        pt = pt.to(device=c.device, dtype=c.dtype)
        eye = torch.eye(pt.shape[0], dtype=c.dtype, device=c.device)
        return c[..., None, None] * eye - 1j * s[..., None, None] * pt
    diag = None
    if set(word) <= {"I", "Z"}:
        signs = _signs_on_demand(word)

        def diag(t):
            return _expi(-t[..., None] / 2 * signs(t.device, t.dtype))
    if wide:
        gen, fn = PauliGenerator(word, 0.5), _dense_on_demand(fn, f"PauliRot '{word}'",
                                                              len(word))
    else:
        gen = dense / 2
    return Gate("paulirot", len(word), 1, fn, generators=(gen,),
                inverse_fn=lambda a: (paulirot_gate(word), (-a[0],)), diag_fn=diag,
                pl_name="PauliRot", qiskit_name="paulirot", hyper=(word,))


UNITARY_ATOL = 1e-6  # PennyLane's own unitarity check (QubitUnitary(unitary_check=True))


def unitary_tolerance(m: torch.Tensor, given=None, d: int = 1) -> float:
    """The unitarity tolerance of matrix (or diagonal) ``m`` of size ``d``: ``UNITARY_ATOL``, or
    the rounding of single precision (``64 d eps``) when the values carry single precision
    only: given in a single-precision dtype (``given``, default ``m.dtype``), or stored in
    double precision with every entry a float32 value (a float32 torch computation cast to
    complex128)."""
    given = m.dtype if given is None else given
    single = given in (torch.complex64, torch.float32, torch.float16, torch.bfloat16)
    if not single and m.dtype in (torch.complex128, torch.float64):
        narrow = torch.complex64 if m.is_complex() else torch.float32
        single = bool((m.to(narrow).to(m.dtype) == m).all())
    return max(UNITARY_ATOL, 64 * d * torch.finfo(torch.float32).eps) if single else UNITARY_ATOL


def check_unitary(m: torch.Tensor, given=None, who: str = "QubitUnitary") -> None:
    """Raise a :class:`QdiffError` naming ``who`` unless every matrix of ``m`` ``(..., d, d)``
    is unitary: ``|U^dag U - I|`` checked in double precision against
    :func:`unitary_tolerance` (``given``: the dtype the matrix was given in, default
    ``m.dtype``; every slice of a matrix vmapped by ``torch.func.vmap``)."""
    m = plain_values(m)
    d = m.shape[-1]
    memory.require(4.0 * 16 * m.numel(),
                   f"{who}: checking that the {d}x{d} matrix is unitary (U^dag U in "
                   "complex128)", m.device)
    atol = unitary_tolerance(m, given, d)
    m128 = m.to(torch.complex128)
    dev = (m128.conj().transpose(-2, -1) @ m128 -
           torch.eye(d, dtype=torch.complex128, device=m.device)).abs().max().item()
    if not dev <= atol:
        hermitian = bool((m128 - m128.conj().transpose(-2, -1)).abs().max() <= atol)
        raise QdiffError(f"{who}: matrix is not unitary (|U^dag U - I| = {dev:.3g}, "
                         f"tolerance {atol:.3g})" + (
                             "; it is Hermitian: an observable or a generator, not a gate "
                             "(PennyLane's metric_tensor(approx=None) applies generators as "
                             "gates: qml.adjoint_metric_tensor gives the full metric tensor "
                             "here)" if hermitian else ""))


def unitary_gate(matrix, who: str = "QubitUnitary") -> Gate:
    """A constant gate from a unitary matrix (not differentiable by shift rules); ``who`` names
    the operation in the refusal of a matrix that is not unitary."""
    if isinstance(matrix, torch.Tensor):
        # a conjugate view (``U.mH``, an inverse's ``conj()``) is materialised: the exporters
        # and the compiler read the matrix through NumPy, which refuses such views
        matrix = matrix.resolve_conj().resolve_neg()
    m = matrix.detach() if isinstance(matrix, torch.Tensor) else torch.as_tensor(np.asarray(matrix))
    given = m.dtype
    m = m.to(torch.complex128) if not m.is_complex() or m.dtype == torch.complex128 else m
    d = m.shape[-1]
    if m.ndim == 3 and m.shape[1] == m.shape[2]:
        raise QdiffError(f"QubitUnitary: a batch of matrices (shape {tuple(m.shape)}) is not "
                         "supported; give one matrix per gate (broadcast the angles of "
                         "parametrized gates instead)")
    if m.ndim != 2 or m.shape[0] != d or d & (d - 1) or d < 2:
        raise QdiffError(f"QubitUnitary: matrix must be square with a power-of-two size; "
                         f"got shape {tuple(m.shape)}")
    check_unitary(m, given, who=who)
    src = matrix if isinstance(matrix, torch.Tensor) else m
    # the inverse keeps the user's tensor (and its autograd graph), as the gate itself does
    return Gate("unitary", int(round(math.log2(d))), 0, lambda *_: src.to(m.dtype),
                inverse_fn=lambda p: (unitary_gate(src.conj().transpose(-2, -1)), ()),
                pl_name="QubitUnitary",
                qiskit_name="unitary", hyper=(m,))


@caches.cached(maxsize=None)
def pcphase_gate(dim: int, n: int) -> Gate:
    """PennyLane's ``PCPhase(phi, dim)`` on ``n`` wires: ``exp(i phi (2 Pi - I))``, ``Pi`` the
    projector onto the first ``dim`` basis states (diagonal; ``G = I - 2 Pi``)."""
    side = 2 ** n
    memory.require(16.0 * side * side, f"the generator of PCPhase on {n} wires "
                                       f"(dense {side}x{side})")
    d = np.where(np.arange(side) < dim, -1.0, 1.0)
    diag = _diag_gen(d)
    return Gate("pcphase", n, 1, lambda t: _diag_embed(diag(t)), generators=(np.diag(d) + 0j,),
                inverse_fn=lambda p: (pcphase_gate(dim, n), (-p[0],)), diag_fn=diag,
                pl_name="PCPhase", qiskit_name="pcphase", hyper=(dim, n))


def diagonal_unitary_gate(diag) -> Gate:
    """A constant diagonal gate (PennyLane's ``DiagonalQubitUnitary``): a ``unitary`` gate
    whose record carries the diagonal fast path."""
    d = diag.detach() if isinstance(diag, torch.Tensor) else torch.as_tensor(np.asarray(diag))
    if d.ndim != 1 or d.shape[0] < 2 or d.shape[0] & (d.shape[0] - 1):
        raise QdiffError(f"DiagonalQubitUnitary: the diagonal must be a vector whose length is "
                         f"a power of two (at least 2); got shape {tuple(d.shape)}")
    d = d.to(torch.complex64 if d.dtype in (torch.complex64, torch.float32) else
             torch.complex128)
    dev = (d.abs() - 1).abs().max().item()
    atol = unitary_tolerance(d)
    if not dev <= atol:
        raise QdiffError(f"DiagonalQubitUnitary: the diagonal is not unitary (max ||d_i| - 1| = "
                         f"{dev:.3g}, tolerance {atol:.3g})")
    side = d.shape[0]
    memory.require(float(side) * side * d.element_size(),
                   f"DiagonalQubitUnitary on {int(round(math.log2(side)))} wires: its dense "
                   f"{side}x{side} matrix (kept for export and comparison)", d.device)
    src = diag if isinstance(diag, torch.Tensor) else d
    if src.dtype != d.dtype:
        src = src.to(d.dtype)
    return Gate("unitary", int(round(math.log2(d.shape[0]))), 0,
                lambda *_: torch.diag_embed(src), diag_fn=lambda *_: src,
                inverse_fn=lambda p: (diagonal_unitary_gate(src.conj()), ()),
                pl_name="DiagonalQubitUnitary", qiskit_name="unitary",
                hyper=(torch.diag_embed(d),))


class _Family:
    """A user-facing callable for a gate family whose width or data is fixed per call."""

    def __init__(self, pl_name: str, resolve: Callable, num_params: int):
        self.pl_name = pl_name
        self.name = pl_name.lower()
        self._resolve = resolve
        self.num_params = num_params

    def __call__(self, *args, wires=None, **kw):
        args = list(args)
        if wires is None:
            if not args:
                raise QdiffError(f"{self.pl_name}: missing wires")
            wires = args.pop()
        gate, params = self._resolve(args, wires, **kw)
        return recording.record_operation(gate, wires, params)

    def __repr__(self):
        return f"GateFamily({self.pl_name!r})"


def _wires_len(wires) -> int:
    return 1 if isinstance(wires, (int, str)) else len(list(wires))


def _resolve_multirz(args, wires):
    if len(args) != 1:
        raise QdiffError(f"MultiRZ takes 1 parameter; got {len(args)}")
    return multirz_gate(_wires_len(wires)), args


def _resolve_paulirot(args, wires, pauli_word=None):
    if pauli_word is None:
        if len(args) != 2:
            raise QdiffError("PauliRot takes (theta, pauli_word, wires)")
        args, pauli_word = args[:1], args[1]
    if len(pauli_word) != _wires_len(wires):
        raise QdiffError(f"PauliRot: word '{pauli_word}' has {len(pauli_word)} letters but "
                         f"{_wires_len(wires)} wire(s) were given")
    return paulirot_gate(pauli_word), args


def _resolve_unitary(args, wires):
    if len(args) != 1:
        raise QdiffError("QubitUnitary takes (U, wires)")
    gate = unitary_gate(args[0])
    if gate.num_wires != _wires_len(wires):
        raise QdiffError(f"QubitUnitary: a {2 ** gate.num_wires}x{2 ** gate.num_wires} matrix "
                         f"acts on {gate.num_wires} wire(s); got {_wires_len(wires)}")
    return gate, []


def _resolve_pcphase(args, wires, dim=None):
    if dim is None:
        if len(args) != 2:
            raise QdiffError("PCPhase takes (phi, dim, wires)")
        args, dim = args[:1], args[1]
    n = _wires_len(wires)
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or \
            not 0 <= int(dim) <= 2 ** n:
        raise QdiffError(f"PCPhase: dim must be an integer from 0 to {2 ** n} on {n} wire(s); "
                         f"got {dim!r}")
    return pcphase_gate(int(dim), n), args


def _resolve_diagonal(args, wires):
    if len(args) != 1:
        raise QdiffError("DiagonalQubitUnitary takes (D, wires)")
    gate = diagonal_unitary_gate(args[0])
    if gate.num_wires != _wires_len(wires):
        raise QdiffError(f"DiagonalQubitUnitary: a diagonal of length {2 ** gate.num_wires} acts "
                         f"on {gate.num_wires} wire(s); got {_wires_len(wires)}")
    return gate, []


class _GlobalPhaseCall(_Family):
    """``qd.GlobalPhase(phi, wires)``: ``exp(-i phi)`` times the identity, recorded on the
    first of ``wires`` (the same operator on any of them; a controlled global phase is a
    relative phase). Without wires it is refused: PennyLane's form acts on all wires of the
    device, which a recording does not know."""

    def __init__(self):
        super().__init__("GlobalPhase", None, 1)

    def __call__(self, *args, wires=None, **kw):
        args = list(args)
        if wires is None and len(args) == 2:
            wires = args.pop()
        if kw or len(args) != 1:
            raise QdiffError(f"GlobalPhase takes (phi, wires); got {len(args)} positional "
                             f"argument(s){' and ' + str(sorted(kw)) if kw else ''}")
        if wires is None or _wires_len(wires) == 0:
            raise QdiffError("GlobalPhase: give the wires (any wire of the circuit: "
                             "qd.GlobalPhase(phi, wires=0)); PennyLane's GlobalPhase(phi) "
                             "without wires has no qdiff form")
        first = wires if isinstance(wires, (int, str)) else list(wires)[0]
        return recording.record_operation(GATES["globalphase"], first, args)


MultiRZ = _Family("MultiRZ", _resolve_multirz, 1)
PauliRot = _Family("PauliRot", _resolve_paulirot, 1)
QubitUnitary = _Family("QubitUnitary", _resolve_unitary, 0)
PCPhase = _Family("PCPhase", _resolve_pcphase, 1)
DiagonalQubitUnitary = _Family("DiagonalQubitUnitary", _resolve_diagonal, 0)
GlobalPhase = _GlobalPhaseCall()
FAMILIES = {"multirz": MultiRZ, "paulirot": PauliRot, "unitary": QubitUnitary,
            "pcphase": PCPhase}


# ---------------------------------------------------------------------------------------------
# controlled gates: any gate with k more control wires, one record per (gate, k)

# a built-in gate controlled by k wires that is itself a built-in gate
_CONTROLLED_BUILTIN = {("x", 1): "cx", ("x", 2): "ccx", ("y", 1): "cy", ("z", 1): "cz",
                       ("z", 2): "ccz", ("h", 1): "ch", ("swap", 1): "cswap", ("rx", 1): "crx",
                       ("ry", 1): "cry", ("rz", 1): "crz", ("p", 1): "cp", ("rot", 1): "crot"}


@caches.cached(maxsize=None)
def controlled_gate(base: Gate, k: int) -> Gate:
    """``base`` acting when ``k`` leading control wires are all 1.

    Its generators are ``|1..1><1..1| ⊗ G_j`` (so the shift rules, derived from their spectra,
    are the four-term rules of controlled rotations); a built-in controlled gate is returned
    where one exists (``controlled_gate(RX, 1)`` is ``CRX``)."""
    if k < 1:
        raise QdiffError(f"ctrl: need at least one control wire; got {k}")
    short = _CONTROLLED_BUILTIN.get((base.name, k))
    if short is not None and BUILTIN_GATES.get(base.name) is base and short in BUILTIN_GATES:
        return BUILTIN_GATES[short]
    d = 2 ** base.num_wires
    rest = (2 ** k - 1) * d
    gens = None
    if base.generators is not None and k + base.num_wires > DENSE_WORD_WIRES:
        gens = tuple(None if g is None else ControlledGenerator(k, g) for g in base.generators)
    elif base.generators is not None:
        proj = np.zeros((2 ** k, 2 ** k), dtype=complex)
        proj[-1, -1] = 1.0
        gens = tuple(None if g is None else np.kron(proj, np.asarray(g))
                     for g in base.generators)
    diag = None
    if base.diag_fn is not None:
        def diag(*angles):
            t = base.diag_fn(*angles)
            ones = torch.ones(*t.shape[:-1], rest, dtype=t.dtype, device=t.device)
            return torch.cat([ones, t], dim=-1)
    perm = None  # (a wide one, 2**wires long, would be made at recording: engines take the
    if base.perm is not None and k + base.num_wires <= DENSE_WORD_WIRES:  # target instead)
        perm = tuple(range(rest)) + tuple(rest + i for i in base.perm)

    def inverse(p):
        g, q = base.inverse(p)
        return controlled_gate(g, k), q
    label = base.pl_name or base.name
    return Gate("ctrl", base.num_wires + k, base.num_params,
                _controlled_fn(base.matrix_fn, d, k), generators=gens, inverse_fn=inverse,
                diag_fn=diag, perm=perm, controls=k, target=base,
                pl_name=f"C({label})" if k == 1 else f"C{k}({label})",
                qiskit_name="ctrl", hyper=(base, k))
