"""Differentiation rules as a table: one :class:`Rule` per ``diff_method``.

Each entry says what the rule needs from the backend (a capability), whether it runs with
shots, how its own derivative behaves (``second_order``), which keyword options it takes, and
whether the forward pass must keep the engine's residual for the backward. ``best`` is a lookup
over the backend's :class:`~qdiff.backends.base.Capabilities`, done once per call.

>>> from qdiff.rules import RULES
>>> sorted(RULES)
['adjoint', 'backprop', 'finite-diff', 'parameter-shift', 'spsa']
>>> RULES["parameter-shift"].second_order, RULES["adjoint"].needs
('exact', 'vjp')
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from qdiff.circuits import caches, memory
from qdiff.circuits.circuit import trainable_matrix_op  # noqa: F401  (re-exported)
from qdiff.circuits.errors import QdiffError
from qdiff.backends.base import global_generator
from qdiff.circuits.operation import ParamRef
from qdiff.shift_rules import shift_rule


@dataclass(frozen=True)
class Rule:
    """One differentiation method.

    ``needs``: the capability the backend must have (``"backprop"``, ``"vjp"`` or ``None``).
    ``exact_only``: refuses devices with shots. ``second_order``: ``"exact"`` (its backward is
    itself differentiable), ``"autograd"`` (torch differentiates the simulation), or ``"none"``
    (a second derivative raises). ``keep``: the forward keeps the engine's residual for ``vjp``.
    ``options``: ``{keyword: default}`` the rule accepts. ``shifts``: for the rules evaluated
    at shifted parameters, ``(circuit, trainable, theta, options) -> (shifts (S, P), weights
    (S, P))`` with ``d f / d theta_j ~ sum_r weights[r, j] f(theta + shifts[r])``; the VJP is
    then one backend call over all ``S * B`` shifted bindings (:func:`qdiff.bridge.shift_vjp`).
    """

    name: str
    needs: Optional[str]
    exact_only: bool
    second_order: str
    keep: bool = False
    options: dict = field(default_factory=dict)
    shifts: Optional[Callable] = None


def _require_shifts(method: str, s: int, theta, extra: float = 0.0) -> None:
    """State the shift table ``(S, P)`` (shifts and weights) and the ``S * B`` shifted bindings
    built from it before either is made."""
    b, p = theta.shape
    memory.require((2.0 + b) * s * p * theta.element_size() + extra,
                   f"{method}: {s} shifted copies of {b} binding(s) of {p} parameters",
                   theta.device, hint="diff_method='adjoint' or 'backprop' on a simulator "
                                      "needs no shifted copies")


def _table(rows, p: int, theta, method: str):
    """``(shifts, weights)`` from rows ``(column, weight, shift)``."""
    _require_shifts(method, len(rows), theta)
    shifts = torch.zeros(len(rows), p, dtype=theta.dtype, device=theta.device)
    weights = torch.zeros(len(rows), p, dtype=theta.dtype, device=theta.device)
    for r, (j, c, x) in enumerate(rows):
        shifts[r, j] = x
        weights[r, j] = c
    return shifts, weights


def _slot_of(circuit) -> dict:
    """Theta column -> ``(op, slot)`` of its (single) use."""
    return {par.index: (op, s) for op in circuit.operations
            for s, par in enumerate(op.params) if isinstance(par, ParamRef)}


def _parameter_shifts(circuit, trainable, theta, options):
    slot_of = _slot_of(circuit)
    rows = [(j, c, x) for j in range(circuit.num_params) if trainable[j]
            for c, x in shift_rule(slot_of[j][0].gate, slot_of[j][1])]
    return _table(rows, circuit.num_params, theta, "parameter-shift")


def default_step(real_dtype: torch.dtype) -> float:
    """Central-difference step for a computation in ``real_dtype``: ``1e-6`` in float64, about
    ``eps ** (1/3)`` (rounding error ``eps / h`` against truncation ``h**2``) in lower precision
    (``4.9e-3`` in float32)."""
    if real_dtype == torch.float64:
        return 1e-6
    return float(torch.finfo(real_dtype).eps) ** (1 / 3)


def _finite_diff_shifts(circuit, trainable, theta, options):
    h = options["h"]
    h = default_step(theta.dtype) if h is None else float(h)
    rows = [(j, c, x) for j in range(circuit.num_params) if trainable[j]
            for c, x in ((0.5 / h, h), (-0.5 / h, -h))]
    return _table(rows, circuit.num_params, theta, "finite-diff")


def _spsa_shifts(circuit, trainable, theta, options):
    p = circuit.num_params
    cols = [j for j in range(p) if trainable[j]]
    k, eps = int(options["num_directions"]), float(options["epsilon"])
    dt, dev = theta.dtype, theta.device
    _require_shifts("spsa", 2 * k, theta, extra=(8.0 + 3 * theta.element_size()) * k * p)
    # the qnode's own stream, also inside torch.func transforms and torch's legacy vmap mode
    with caches.constants(), caches.outside_legacy_vmap():
        signs = torch.randint(0, 2, (k, len(cols)), generator=options.generator)
    delta = torch.zeros(k, p, dtype=dt, device=dev)
    delta[:, cols] = signs.to(dt).mul_(2).sub_(1).to(dev)
    return torch.cat([eps * delta, -eps * delta]), torch.cat([delta, -delta]) / (2 * eps * k)


BACKPROP = Rule("backprop", "backprop", exact_only=True, second_order="autograd")
ADJOINT = Rule("adjoint", "vjp", exact_only=True, second_order="none", keep=True)
PARAMETER_SHIFT = Rule("parameter-shift", None, exact_only=False, second_order="exact",
                       shifts=_parameter_shifts)
FINITE_DIFF = Rule("finite-diff", None, exact_only=False, second_order="none",
                   options={"h": None}, shifts=_finite_diff_shifts)
SPSA = Rule("spsa", None, exact_only=False, second_order="none",
            options={"num_directions": 1, "epsilon": 1e-2, "seed": None}, shifts=_spsa_shifts)

RULES = {r.name: r for r in (BACKPROP, ADJOINT, PARAMETER_SHIFT, FINITE_DIFF, SPSA)}
DIFF_METHODS = ("best",) + tuple(RULES)
_NEEDS_TEXT = {"backprop": "a torch-simulated backend", "vjp": "a backend with its own reverse "
               "mode (the statevector or mixed engine, or a PennyLane device with an adjoint "
               "method)"}


@dataclass(frozen=True)
class Options:
    """Validated options of one rule; ``generator`` is the SPSA direction stream (one per
    qnode, advanced by every backward)."""

    values: dict = field(default_factory=dict)
    generator: Optional[torch.Generator] = None

    def __getitem__(self, key):
        return self.values[key]


def make_options(method: str, kwargs: dict) -> Options:
    """Check ``kwargs`` against the rule's options (an unknown keyword is an error) and fill
    in the defaults. ``best`` takes no options: its rule is chosen per call."""
    if method not in DIFF_METHODS:
        raise QdiffError(f"unknown diff_method '{method}'; choose from {list(DIFF_METHODS)}")
    accepted = {} if method == "best" else RULES[method].options
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        valid = sorted(accepted) or "none"
        raise QdiffError(f"diff_method='{method}' does not take the option(s) {unknown}; "
                         f"its options: {valid}")
    values = dict(accepted, **kwargs)
    _check_values(method, values)
    gen = spsa_generator(values["seed"]) if method == "spsa" else None
    return Options(values, gen)


def _check_values(method: str, values: dict) -> None:
    for key in ("h", "epsilon"):
        if key == "h" and values.get(key, 0) is None:
            continue  # finite-diff's default: the step follows the computation's precision
        if key in values and not (isinstance(values[key], (int, float))
                                  and not isinstance(values[key], bool) and values[key] > 0
                                  and math.isfinite(values[key])):
            raise QdiffError(f"diff_method='{method}': {key} must be a positive finite number; "
                             f"got {values[key]!r}")
    if "seed" in values:
        from qdiff.backends.base import check_seed
        check_seed(values["seed"], f"diff_method='{method}': seed")
    k = values.get("num_directions", 1)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise QdiffError(f"diff_method='{method}': num_directions must be a positive integer; "
                         f"got {k!r}")


def spsa_generator(seed=None) -> torch.Generator:
    """CPU generator of SPSA directions (seeded: a reproducible sequence of directions; else
    torch's global generator, which ``torch.manual_seed`` sets)."""
    if seed is None:
        return global_generator("cpu")
    return torch.Generator().manual_seed(int(seed))


def needs_backprop(circuit, recorded) -> bool:
    """Calls only backprop can differentiate: a trainable state preparation, a trainable gate
    matrix, trainable observable coefficients or matrices, or outputs other than
    expval/var/probs (e.g. ``state()``)."""
    if recorded is not None and recorded.initial_state is not None and \
            recorded.initial_state.requires_grad:
        return True
    if trainable_matrix_op(circuit) is not None:
        return True
    for m in circuit.measurements:
        if m.kind not in ("expval", "var", "probs"):
            return True
        if m.obs is not None and (m.obs.coeffs.requires_grad or m.obs.has_trainable_matrix):
            return True
    return False


def _has_shift_rule(gate, slot: int) -> bool:
    """Whether parameter ``slot`` of ``gate`` has a shift rule (its own, or its generator's)."""
    for entries in (gate.shift_rules, gate.generators):
        if entries is not None and slot < len(entries) and entries[slot] is not None:
            return True
    return False


def has_shiftless_trainables(circuit, recorded=None) -> bool:
    """Whether a trainable theta column feeds a parameter without a shift rule (a noise
    channel's, or a gate's without a generator for it)."""
    trainable = getattr(recorded, "trainable", None)
    for op in circuit.operations:
        if op.gate.generators is not None and op.gate.shift_rules is None and \
                all(g is not None for g in op.gate.generators):
            continue
        if any(isinstance(p, ParamRef) and (trainable is None or trainable[p.index])
               and not _has_shift_rule(op.gate, s) for s, p in enumerate(op.params)):
            return True
    return False


_DEVICE = "device"  # shots: the backend's own setting (qdiff.backends.base.DEVICE_SHOTS)


def call_shots(backend, shots):
    """The shots of a call: the backend's own (``"device"``), else the call's."""
    return getattr(backend, "shots", None) if shots == _DEVICE else shots


def best(backend, circuit, recorded=None, shots=_DEVICE) -> Rule:
    """The rule ``diff_method="best"`` stands for on this backend and call.

    On a torch-simulated backend without shots: backprop when the call needs it; the engine's
    reverse mode when it is the fast gradient (``fast_vjp``) or the register is larger than
    ``backprop_max_wires``, and it suits the circuit (``backend.vjp_suits``: its memory);
    backprop otherwise. Everywhere else: parameter-shift, or finite differences when a
    trainable parameter has no shift rule (a channel's probability).
    """
    caps = backend.capabilities
    if call_shots(backend, shots) or not caps.backprop:
        return FINITE_DIFF if has_shiftless_trainables(circuit, recorded) else PARAMETER_SHIFT
    if needs_backprop(circuit, recorded) or not caps.vjp:
        return BACKPROP
    if (caps.fast_vjp or circuit.num_wires > caps.backprop_max_wires) and \
            backend.vjp_suits(circuit):
        return ADJOINT
    return BACKPROP


# finite-difference step with shots when no h is given (as best takes it): a step of 1e-6
# would divide the shot noise by 1e-6; the bias is O(h**2)
SHOT_FD_STEP = 0.1


def resolve(method: str, backend, circuit, recorded=None, shots=_DEVICE) -> Rule:
    """The :class:`Rule` for ``method`` on ``backend``, checked against its capabilities and
    the call's ``shots`` (``"device"``: the backend's own)."""
    if method == "best":
        return best(backend, circuit, recorded, shots)
    rule = RULES.get(method)
    if rule is None:
        raise QdiffError(f"unknown diff_method '{method}'; choose from {list(DIFF_METHODS)}")
    caps = backend.capabilities
    if rule.needs is not None and not getattr(caps, rule.needs):
        why = (" (it samples noise by trajectories; the mixed engine's reverse mode is "
               "exact)" if caps.stochastic else "")
        raise QdiffError(f"diff_method='{method}' needs {_NEEDS_TEXT[rule.needs]}; "
                         f"'{backend.name}' is not one{why} (use 'parameter-shift')")
    if rule.exact_only and call_shots(backend, shots):
        raise QdiffError(f"diff_method='{method}' is exact only and cannot be used with "
                         f"shots={call_shots(backend, shots)}; use 'parameter-shift' or 'spsa'")
    return rule


def higher_order(method: str, rule: Rule) -> Optional[Rule]:
    """The rule a second derivative (``create_graph=True``) switches to, or ``None``: a ``best``
    adjoint hands it to the exact parameter-shift rules."""
    if method == "best" and rule is ADJOINT:
        return PARAMETER_SHIFT
    return None
