"""Target gate sets and the final translation pass into one of them.

A basis is a comma-separated list of gate names: one two-qubit gate (cx, cz or ecr) and a
one-qubit set from which every 2x2 unitary can be written (u | u3 | rz,sx[,x] | p,sx | rz,ry |
rz,rx | u1,u2,u3 | h with rz or Clifford+T phases).

>>> parse_basis("rz,sx,x,cx").euler
'ZSXX'
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qdiff.circuits import caches
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.operation import ParamRef
from qdiff.compiler.fuse import canonical_1q, fuse_1q
from qdiff.compiler.ops import is_constant, matrix, op
from qdiff.compiler.synth import from_qiskit_ops

_TWO_Q = ("cx", "cz", "ecr")
_EULER = [({"u"}, "U3"), ({"u3"}, "U3"), ({"rz", "sx", "x"}, "ZSXX"), ({"rz", "sx"}, "ZSX"),
          ({"p", "sx"}, "PSX"), ({"rz", "ry"}, "ZYZ"), ({"rz", "rx"}, "ZXZ"),
          ({"u1", "u2", "u3"}, "U321"), ({"h", "rz"}, "HRZ"), ({"h", "t"}, "CLIFFORD_T")]
SNAP_TOL = 1e-9


@dataclass(frozen=True)
class Basis:
    names: frozenset
    two_q: str
    euler: str

    def __str__(self):
        return ",".join(sorted(self.names))


def parse_basis(text) -> Basis:
    names = frozenset(s.strip().lower() for s in (text.split(",") if isinstance(text, str)
                                                  else text) if s.strip())
    two = [g for g in _TWO_Q if g in names]
    if not two:
        raise QdiffError(f"basis '{','.join(sorted(names))}': needs a two-qubit gate "
                         f"(one of {', '.join(_TWO_Q)})")
    for need, euler in _EULER:
        if need <= names:
            return Basis(names, two[0], euler)
    raise QdiffError(f"basis '{','.join(sorted(names))}': cannot write every one-qubit gate "
                     "with it (use u, or rz,sx,x, or rz,ry, or h,rz, or h,s,t,...)")


def translate(circuit, basis: Basis, fuse: bool = True):
    """Pass: rewrite a lowered circuit (one-qubit gates + CX) into ``basis``."""
    ops = []
    for o in circuit.operations:
        ops.extend(_two_q(o, basis) if o.name == "cx" and basis.two_q != "cx" else [o])
    c = circuit.with_operations(ops)
    if fuse:
        c = fuse_1q(c)
    out = []
    for o in c.operations:
        if len(o.wires) == 1:
            out.extend(_one_q(o, basis))
        else:
            out.append(o)
    return circuit.with_operations(out)


def _two_q(o, basis: Basis) -> list:
    c, t = o.wires
    if basis.two_q == "cz":
        return [op("h", (t,)), op("cz", (c, t)), op("h", (t,))]
    return [op(name, tuple(o.wires[i] for i in ws), ps) for name, ws, ps in _ecr_template()]


@caches.cached(maxsize=1)
def _ecr_template():
    from qiskit.circuit.library import ECRGate
    from qiskit.synthesis import TwoQubitBasisDecomposer
    cx = np.eye(4, dtype=complex)[[0, 1, 3, 2]]
    ops = from_qiskit_ops(TwoQubitBasisDecomposer(ECRGate())(cx), (0, 1))
    return tuple((x.name, x.wires, x.params) for x in ops)


def _one_q(o, basis: Basis) -> list:
    w = o.wires
    if not is_constant(o):  # lowering leaves only rz(ParamRef) here
        return [op(_param_rz_name(basis), w, (0.0, 0.0, o.params[0]) if _param_rz_name(basis)
                   == "u3" else o.params)]
    if o.name in basis.names and o.name != "u3":
        return [o]
    u = matrix(o)
    if basis.euler in ("HRZ", "CLIFFORD_T"):
        return h_phase(u, w[0], basis)
    return euler_ops(u, w[0], basis.euler)


def _param_rz_name(basis: Basis) -> str:
    for name in ("rz", "p", "u1"):
        if name in basis.names:
            return name
    if basis.euler == "U3":
        return "u3"
    raise QdiffError(f"basis '{basis}': cannot express a parametric rotation (add rz or p)")


def euler_ops(u: np.ndarray, wire: int, euler: str) -> list:
    from qiskit.synthesis import OneQubitEulerDecomposer
    return from_qiskit_ops(_decomposer(euler)(u), (wire,))


@caches.cached(maxsize=16)
def _decomposer(euler: str):
    from qiskit.synthesis import OneQubitEulerDecomposer
    return OneQubitEulerDecomposer(euler, use_dag=False)


def h_phase(u: np.ndarray, wire: int, basis: Basis) -> list:
    """``rz(a) h rz(b) h rz(c)`` (ZXZ with rx = h rz h); phases exact in Clifford+T if asked."""
    seq = []
    for g in canonical_1q(u, wire):
        if g.name == "rz":
            seq.append(("z", g.params[0]))
        elif g.name == "rx":
            seq += [("h", None), ("z", g.params[0]), ("h", None)]
        else:
            th, ph, lam = g.params  # u3 = rz(ph) ry(th) rz(lam); ry(t) = rz(pi/2) rx(t) rz(-pi/2)
            seq += [("z", lam - math.pi / 2), ("h", None), ("z", th), ("h", None),
                    ("z", ph + math.pi / 2)]
    out = []
    for kind, a in seq:
        out.extend([op("h", (wire,))] if kind == "h" else _phase(a, wire, basis))
    return out


_PHASES = {0: [], 1: ["t"], 2: ["s"], 3: ["s", "t"], 4: ["z"], 5: ["z", "t"], 6: ["sdg"],
           7: ["tdg"]}


def _phase(a: float, wire: int, basis: Basis) -> list:
    k = round(a / (math.pi / 4))
    if abs(a - k * math.pi / 4) < SNAP_TOL:
        names = _PHASES[k % 8]
        if all(n in basis.names for n in names):
            return [op(n, (wire,)) for n in names]
    if "rz" in basis.names:
        return [op("rz", (wire,), (a,))]
    raise QdiffError(f"basis '{basis}': rotation by {a:.6g} rad is not a multiple of pi/4 and "
                     "the basis has no rz")


__all__ = ["Basis", "parse_basis", "translate", "euler_ops", "ParamRef"]
