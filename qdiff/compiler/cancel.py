"""Pass: cancel a gate against its inverse when nothing acts on their wires in between.

>>> from qdiff.circuits import Circuit
>>> from qdiff.compiler.ops import op
>>> len(cancel_inverses(Circuit(2, (op("cx", (0, 1)), op("h", (0,)), op("h", (0,)),
...                                  op("cx", (0, 1))))).operations)
0
"""
from qdiff.compiler import peephole


def cancel_inverses(circuit):
    """Circuit -> Circuit without adjacent inverse pairs (h h, cx cx, s sdg, rz(a) rz(-a), ...)."""
    return peephole.run(circuit, peephole.inverse_pair, peephole.disjoint)
