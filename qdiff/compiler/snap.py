"""Pass: snap angles within ``tol`` of a multiple of pi/4 to that multiple exactly.

Rounding noise from synthesis leaves angles such as ``0.7853981633974481``; made exact, they
become Clifford+T phases that cancel and merge with their neighbours (and print as ``pi/4``).

>>> import math
>>> from qdiff.circuits import Circuit
>>> from qdiff.compiler.ops import op
>>> snap_angles(Circuit(1, (op("rz", (0,), (math.pi / 4 + 3e-13,)),))).operations[0].params
(0.7853981633974483,)
"""
from __future__ import annotations

import math

from qdiff.circuits.operation import Operation, ParamRef

TOL = 1e-11  # synthesis rounding is ~1e-15; a snap moves the gate by at most TOL / 2
_Q = math.pi / 4


def snap(a: float, tol: float = TOL) -> float:
    k = round(a / _Q)
    return k * _Q if abs(a - k * _Q) < tol else a


def snap_angles(circuit, tol: float = TOL):
    """Circuit -> Circuit with near-Clifford+T angles made exact (ParamRef offsets too)."""
    out = []
    for o in circuit.operations:
        ps = tuple(ParamRef(p.index, p.scale, snap(p.offset, tol)) if isinstance(p, ParamRef)
                   else snap(float(p), tol) for p in o.params)
        out.append(Operation(o.gate, o.wires, ps) if ps != o.params else o)
    return circuit.with_operations(out)
