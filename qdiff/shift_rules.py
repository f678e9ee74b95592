"""Parameter-shift rules derived from a gate's generator spectrum.

For ``U(phi) = A exp(-i phi G) B`` an expectation ``f(phi)`` is a trigonometric polynomial whose
frequencies are the distinct positive differences ``Omega_1..Omega_R`` of G's eigenvalues. With
``R`` symmetric shift pairs ``+-x_mu``,

    f'(0) = sum_mu c_mu [f(x_mu) - f(-x_mu)],   sum_mu 2 c_mu sin(Omega_l x_mu) = Omega_l  (all l)

which this module solves for ``c``. With equidistant frequencies ``Omega_l = l w`` and
``x_mu = (2 mu - 1) pi / (2 R w)`` this reproduces the known rules:

* Pauli rotations (eigenvalues +-1/2, R = 1): shifts +-pi/2, coefficients +-1/2 (two terms);
* PhaseShift/ControlledPhaseShift (eigenvalues 0, -1): the same two-term rule;
* controlled rotations, SingleExcitation, DoubleExcitation (eigenvalues 0, +-1/2, R = 2):
  shifts +-pi/2 and +-3pi/2 with coefficients +-(sqrt 2 + 1)/(4 sqrt 2) and
  -+(sqrt 2 - 1)/(4 sqrt 2) (four terms);
* MultiRZ / PauliRot: two terms, shifts +-pi/2.

Non-equidistant spectra use ``w = Omega_max / R`` and the same linear solve.

>>> from qdiff.circuits.gates import GATES
>>> shift_rule(GATES["rx"], 0)
((0.5, 1.5707963267948966), (-0.5, -1.5707963267948966))
"""
from __future__ import annotations

import math

import numpy as np

from qdiff.circuits import caches
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.gates import check_record


def frequencies(eigvals, tol: float = 1e-9) -> tuple:
    """Distinct positive differences of ``eigvals``, ascending."""
    ev = np.sort(np.real(np.asarray(eigvals)))
    diffs = np.abs(ev[:, None] - ev[None, :]).reshape(-1)
    out: list = []
    for d in np.sort(diffs):
        if d > tol and (not out or d - out[-1] > tol):
            out.append(float(d))
    return tuple(out)


def rule_from_frequencies(freqs) -> tuple:
    """``((coeff, shift), ...)`` with ``f'(0) = sum coeff * f(shift)`` for a trig polynomial."""
    if not freqs:
        return ()
    r = len(freqs)
    om = np.asarray(freqs)
    w = om[-1] / r
    x = (2 * np.arange(1, r + 1) - 1) * math.pi / (2 * r * w)
    m = 2 * np.sin(np.outer(om, x))
    c = np.linalg.solve(m, om)
    terms = []
    for cm, xm in zip(c, x):
        terms.append((float(cm), float(xm)))
        terms.append((float(-cm), float(-xm)))
    return tuple(terms)


@caches.cached(maxsize=None)
def _rule_cached(gate, slot: int) -> tuple:
    check_record(gate)
    if gate.shift_rules is not None and gate.shift_rules[slot] is not None:
        return tuple((float(c), float(s)) for c, s in gate.shift_rules[slot])
    if gate.generators is None or gate.generators[slot] is None:
        from qdiff.circuits.channels import is_channel
        if is_channel(gate):
            names = getattr(gate, "param_names", ())
            pname = names[slot] if slot < len(names) else slot
            raise QdiffError(f"channel '{gate.name}': parameter {pname} is a probability or "
                             "rate, not a gate angle, and has no parameter-shift rule; "
                             "differentiate it with diff_method='backprop' or 'adjoint' "
                             "(exact) or 'finite-diff' (also with shots)")
        raise QdiffError(f"gate '{gate.pl_name or gate.name}' has no generator or shift rule for "
                         f"parameter {slot}; it cannot be differentiated by parameter-shift "
                         "(decompose it, or use diff_method='backprop' or 'adjoint')")
    return rule_from_frequencies(frequencies(gate.spectrum(slot)))


def shift_rule(gate, slot: int = 0) -> tuple:
    """The parameter-shift rule of parameter ``slot`` of ``gate`` (cached per gate)."""
    return _rule_cached(gate, slot)
