"""Pass: commutation-aware cancellation and merging.

A gate moves back through gates it commutes with (Z-type gates through CX controls and other
diagonal gates, X-type gates through CX targets, CXs sharing a control or a target) to meet its
inverse or a same-axis rotation.

>>> from qdiff.circuits import Circuit
>>> from qdiff.compiler.ops import op
>>> c = Circuit(2, (op("t", (0,)), op("cx", (0, 1)), op("tdg", (0,))))
>>> [o.name for o in commutative_cancellation(c).operations]
['cx']
"""
from qdiff.compiler import peephole
from qdiff.compiler.ops import commute


def commutative_cancellation(circuit):
    """Circuit -> Circuit; repeats until nothing changes (at most 6 sweeps)."""
    for _ in range(6):
        new = peephole.run(circuit, peephole.inverse_or_merge, commute)
        if len(new.operations) == len(circuit.operations):
            return new
        circuit = new
    return circuit
