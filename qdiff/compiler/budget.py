"""Approximation budgets: how far a compiled circuit may move from its input, and who spent it.

Every local replacement (a dropped rotation, a re-fitted block, an approximate two-qubit
synthesis) is measured by its *phase-aligned distance*
``delta(U, V) = min_phi ||U - e^{i phi} V||_F / sqrt(d)``. It is a metric, it does not change
when the gates are embedded in a larger circuit (tensoring with the identity keeps it), and the
process infidelity satisfies ``1 - |Tr(U^dag V)|^2 / d^2 <= delta^2``. So a circuit rewritten by
replacements of distances ``delta_i`` has process infidelity at most ``(sum_i delta_i)^2``:
a budget ``eps`` on the process infidelity is a budget ``sqrt(eps)`` on the sum of distances.

Exact compilation (no ``approx``) spends nothing: only replacements at rounding level
(``delta <= EXACT_DELTA``) are made, e.g. a gate is dropped only when it is the identity to
1e-11, far inside the 1e-12 bound on the process infidelity the final check enforces.

>>> import numpy as np
>>> b = Budget(1e-6)
>>> b.spend(4e-4), b.spend(7e-4), round(b.spent_bound, 12)
(True, False, 1.6e-07)
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

EXACT_DELTA = 1e-11  # distance of a replacement that is exact to rounding


def phase_distance(u: np.ndarray, v: np.ndarray) -> float:
    """``min_phi ||u - e^{i phi} v||_F / sqrt(d)`` for ``(d, d)`` matrices (no cancellation:
    the residual is formed directly, so distances down to 1e-16 are resolved)."""
    t = np.vdot(v, u)  # Tr(v^dag u)
    ph = t / abs(t) if abs(t) > 0 else 1.0
    return float(np.linalg.norm(u - ph * v) / math.sqrt(u.shape[0]))


def rotation_distance(angle: float) -> float:
    """``delta`` between ``exp(-i angle P / 2)`` (any Pauli string P) and the identity."""
    return abs(2.0 * math.sin(math.remainder(angle, 4 * math.pi) / 4.0))


@dataclass
class Budget:
    """A process-infidelity budget ``eps`` (0: exact) and the distances spent from it."""

    eps: float = 0.0
    spent: float = 0.0  # sum of the distances of the approximate replacements made

    @property
    def total(self) -> float:
        return math.sqrt(self.eps)

    @property
    def left(self) -> float:
        return max(0.0, self.total - self.spent)

    @property
    def spent_bound(self) -> float:
        """Proven bound on the process infidelity of everything spent: ``(sum delta)^2``."""
        return self.spent ** 2

    @property
    def exact(self) -> bool:
        return self.eps <= 0.0

    def allows(self, delta: float) -> bool:
        return delta <= EXACT_DELTA or delta <= self.left

    def spend(self, delta: float) -> bool:
        """Record a replacement of distance ``delta``; False (nothing recorded) if over."""
        if delta <= EXACT_DELTA:
            return True
        if delta > self.left:
            return False
        self.spent += delta
        return True

    def copy(self) -> "Budget":
        return Budget(self.eps, self.spent)

    @property
    def tol(self) -> float:
        """The tolerance a check of the result uses: 1e-12 when exact, else ``eps``."""
        return max(self.eps, 1e-12)


class Work:
    """A search's work budget, counted in units the search defines (e.g. Levenberg-Marquardt
    iterations times starts), so that a result does not depend on the machine's load.
    ``deadline`` (``time.perf_counter()`` value) is only the user's outer bound
    (``--time-limit``): when it stops the search, ``cut`` says so and the report shows it.

    >>> w = Work(10)
    >>> w.take(7)
    >>> w.exhausted
    False
    >>> w.take(5)
    >>> w.exhausted
    True
    """

    def __init__(self, limit: float, deadline: float | None = None):
        self.limit, self.used, self.deadline, self.cut = limit, 0.0, deadline, False

    def take(self, units: float) -> None:
        self.used += units

    @property
    def exhausted(self) -> bool:
        if self.used >= self.limit:
            return True
        if self.deadline is not None and time.perf_counter() > self.deadline:
            self.cut = True
        return self.cut
