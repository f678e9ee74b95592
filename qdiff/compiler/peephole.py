"""The engine behind the level-1 passes: combine each gate with an earlier partner.

For each new gate the engine walks back over earlier gates on its wires while they commute with
it (``commutes``); at the first partner for which ``combine(partner, new)`` returns a result it
replaces the partner by that result (``[]`` removes both) and drops the new gate. Moving the new
gate back is valid because it commutes with every gate it passed.
"""
from __future__ import annotations

from qdiff.circuits.operation import Operation, ParamRef
from qdiff.compiler.ops import add_angles, is_constant, matrix, op, is_identity_up_to_phase

LOOKBACK = 64


def run(circuit, combine, commutes, lookback: int = LOOKBACK):
    out: list = []
    by_wire: dict = {}
    for new in circuit.operations:
        merged = False
        cands = sorted({j for w in new.wires for j in by_wire.get(w, [])[-lookback:]},
                       reverse=True) if lookback else []
        for j in cands:
            prev = out[j]
            if prev is None:
                continue
            res = combine(prev, new)
            if res is not None:
                out[j] = res[0] if res and not _trivial(res[0]) else None
                merged = True
                break
            if not commutes(prev, new):
                break
        if not merged:
            out.append(new)
            for w in new.wires:
                by_wire.setdefault(w, []).append(len(out) - 1)
    return circuit.with_operations([o for o in out if o is not None and not _trivial(o)])


def _trivial(o: Operation) -> bool:
    if len(o.wires) > 2:
        return False
    if is_constant(o):
        return o.name == "id" or (bool(o.params) and is_identity_up_to_phase(matrix(o)))
    return all(not isinstance(p, ParamRef) or p.scale == 0.0 for p in o.params) and \
        is_identity_up_to_phase(matrix(Operation(o.gate, o.wires, tuple(
            p.offset if isinstance(p, ParamRef) else p for p in o.params))))


def same_params(a, b, tol: float = 1e-12) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, ParamRef) or isinstance(y, ParamRef):
            if x != y:
                return False
        elif abs(float(x) - float(y)) > tol:
            return False
    return True


def same_wires(a: Operation, b: Operation) -> bool:
    if a.wires == b.wires:
        return True
    return a.gate is b.gate and a.gate.symmetric and sorted(a.wires) == sorted(b.wires)


def inverse_pair(prev: Operation, new: Operation):
    """``[]`` when ``new`` undoes ``prev``."""
    if not same_wires(prev, new) or new.gate.inverse_fn is None:
        return None
    inv = new.inverse()
    if inv.gate is prev.gate and same_params(inv.params, prev.params):
        return []
    return None


def rotation_merge(prev: Operation, new: Operation):
    """Two rotations about the same axis on the same wires -> one (angles stay affine)."""
    if prev.gate is new.gate and prev.gate.additive and prev.wires == new.wires:
        s = add_angles(prev.params[0], new.params[0])
        return None if s is None else [Operation(prev.gate, prev.wires, (s,))]
    if len(prev.wires) == 1 and prev.wires == new.wires:
        for axis, gate in (("z", "rz"), ("x", "rx")):
            a, b = _axis_angle(prev, axis), _axis_angle(new, axis)
            if a is not None and b is not None:
                s = add_angles(a, b)
                return None if s is None else [op(gate, prev.wires, (s,))]
    return None


def _axis_angle(o: Operation, axis: str):
    """The angle of a one-qubit rotation about ``axis`` (constant Clifford+T gates by their
    record's ``axis_angle``, rz/p/u1/rx by their parameter), or None."""
    g = o.gate
    if g.wire_axes != (axis,):
        return None
    if g.axis_angle is not None:
        return g.axis_angle
    return o.params[0] if g.additive and g.num_params == 1 else None


def inverse_or_merge(prev, new):
    r = inverse_pair(prev, new)
    return r if r is not None else rotation_merge(prev, new)


def disjoint(a, b) -> bool:
    return not set(a.wires) & set(b.wires)


__all__ = ["run", "inverse_pair", "rotation_merge", "inverse_or_merge", "disjoint"]
