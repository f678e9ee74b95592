"""Pass (``approx`` only): drop the one-qubit gates closest to the identity within a budget.

Constant one-qubit gates are ranked by their phase-aligned distance to the identity (a
rotation by ``a`` is at ``2|sin(a/4)|``) and dropped smallest first while the budget
(:class:`~qdiff.compiler.budget.Budget`) allows; without a budget nothing but rounding-level
identities is dropped.

>>> from qdiff.circuits import Circuit
>>> from qdiff.compiler.budget import Budget
>>> from qdiff.compiler.ops import op
>>> c = Circuit(1, (op("rz", (0,), (2e-4,)), op("h", (0,)), op("rz", (0,), (0.3,))))
>>> [o.name for o in drop_small_gates(c, Budget(1e-6)).operations]
['h', 'rz']
"""
from __future__ import annotations

import numpy as np

from qdiff.compiler.budget import Budget, phase_distance
from qdiff.compiler.ops import is_constant, matrix

_I2 = np.eye(2, dtype=complex)


def drop_small_gates(circuit, budget: Budget):
    """Circuit -> Circuit without the cheapest near-identity gates ``budget`` can pay for."""
    ranked = sorted((phase_distance(matrix(o), _I2), i) for i, o in enumerate(circuit.operations)
                    if len(o.wires) == 1 and is_constant(o))
    drop = set()
    for delta, i in ranked:
        if not budget.spend(delta):
            break
        drop.add(i)
    if not drop:
        return circuit
    return circuit.with_operations([o for i, o in enumerate(circuit.operations) if i not in drop])
