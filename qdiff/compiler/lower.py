"""Lowering: every gate becomes one-qubit gates and CX (the compiler's working set).

Constant multi-qubit gates (Toffoli, CSWAP, CP, QubitUnitary, ...) and parametric ones (CRZ,
IsingZZ, SingleExcitation, ...) go through Qiskit's standard equivalences one gate at a time;
parametric one-qubit gates become ``rz(ParamRef)`` between constant gates, so later passes see
exactly one kind of parametric gate. Angles stay affine in theta columns.

>>> from qdiff.circuits import Circuit
>>> from qdiff.compiler.ops import op
>>> [o.name for o in lower(Circuit(3, (op("ccx", (0, 1, 2)),))).operations].count("cx")
6
"""
from __future__ import annotations


from qdiff.circuits import caches
from qdiff.circuits.circuit import Circuit
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.operation import Operation, ParamRef
from qdiff.compiler.ops import is_constant, op
from qdiff.compiler.qiskit_translation import qiskit_basis_translation

MAX_CHECKED_WIRES = 6  # constant gates up to this width: the expansion is checked on its matrix


def lower(circuit: Circuit) -> Circuit:
    """Pass: rewrite ``circuit`` over one-qubit gates + CX (parametric 1q gates -> rz)."""
    out: list = []
    for o in circuit.operations:
        out.extend(lower_op(o))
    return circuit.with_operations(out)


def lower_op(o: Operation) -> list:
    k = len(o.wires)
    if k == 1:
        return [o] if is_constant(o) else _lower_param_1q(o)
    if o.name == "cx":
        return [o]
    out = []
    for sub in _via_qiskit(o):
        out.extend(lower_op(sub) if len(sub.wires) == 1 and not is_constant(sub) else [sub])
    return out


def _lower_param_1q(o: Operation) -> list:
    w, p, g = o.wires, o.params, o.gate
    if g.wire_axes == ("z",) and g.additive:  # rz, p, u1: equal up to a global phase
        return [op("rz", w, p)]
    if o.name == "rx":
        return [op("h", w), op("rz", w, p), op("h", w)]
    if o.name == "ry":  # S RX S^dag = RY
        return [op("sdg", w), op("h", w), op("rz", w, p), op("h", w), op("s", w)]
    if g.zyz is not None:  # u3, u2, rot: the record's Euler angles
        lam, th, ph = g.zyz(p)
        seq = [op("rz", w, (lam,)), op("ry", w, (th,)), op("rz", w, (ph,))]
        return [s for part in seq for s in (lower_op(part) if not is_constant(part) else [part])]
    return _via_qiskit(o)


def _via_qiskit(o: Operation) -> list:
    """Expand one gate with Qiskit's equivalence library; ParamRefs are composed affinely."""
    slots = tuple(i for i, p in enumerate(o.params) if isinstance(p, ParamRef))
    if o.name == "unitary":
        template = _expand(o.gate, (), (), ())
    else:
        consts = tuple(None if i in slots else float(p) for i, p in enumerate(o.params))
        template = _expand(o.gate, o.gate.hyper, slots, consts)
    out = []
    for name, local_wires, params in template:
        ps = []
        for a in params:
            if isinstance(a, tuple):  # (slot, scale, offset) of the symbolic argument
                slot, sc, off = a
                ref = o.params[slots[slot]]
                ps.append(ParamRef(ref.index, sc * ref.scale, sc * ref.offset + off))
            else:
                ps.append(a)
        out.append(op(name, tuple(o.wires[i] for i in local_wires), ps))
    return out


@caches.cached(maxsize=4096)
def _expand_cached(gate, hyper, slots, consts):
    return _expand_uncached(gate, slots, consts)


def _expand(gate, hyper, slots, consts):
    if gate.name == "unitary":
        return _expand_uncached(gate, (), ())
    return _expand_cached(gate, hyper if all(_hashable(h) for h in hyper) else (), slots, consts)


def _hashable(x) -> bool:
    try:
        hash(x)
        return True
    except TypeError:
        return False


def _expand_uncached(gate, slots, consts):
    from qdiff.circuits.qiskit_io import FROM_QISKIT, angle_from_qiskit, to_qiskit
    refs = iter(range(len(slots)))
    params = tuple(ParamRef(next(refs)) if c is None else c for c in consts) if consts else ()
    circ = Circuit(gate.num_wires, (Operation(gate, tuple(range(gate.num_wires)), params),),
                   num_params=len(slots))
    qc = to_qiskit(circ)
    try:
        low = qiskit_basis_translation(qc)
    except Exception as exc:  # qiskit raises its own types for gates it cannot translate
        raise QdiffError(f"gate '{gate.name}': cannot decompose ({exc})") from None
    pmap = {p: i for i, p in enumerate(sorted(qc.parameters, key=lambda q: q.index))}
    if not slots and gate.num_wires <= MAX_CHECKED_WIRES:
        return _exact_template(gate, consts, low)
    out = []
    for inst in low.data:
        name = FROM_QISKIT.get(inst.operation.name)
        if name is None:
            raise QdiffError(f"gate '{gate.name}': decomposition produced '{inst.operation.name}'")
        wires = tuple(low.find_bit(q).index for q in inst.qubits)
        ps = []
        for v in inst.operation.params:
            a = angle_from_qiskit(v, dict(pmap), f"decomposition of '{gate.name}'")
            ps.append((a.index, a.scale, a.offset) if isinstance(a, ParamRef) else a)
        out.append((name, wires, tuple(ps)))
    return tuple(out)


def _exact_template(gate, consts, low) -> tuple:
    """The template of a constant gate whose Qiskit expansion ``low`` is checked against the
    gate's matrix (phase-aligned distance ``<= EXACT_DELTA``): Qiskit's unitary synthesis
    snaps two-qubit blocks near the identity or CX (a controlled rotation by 1e-6 rad would
    lose its control), so a failing expansion is replaced by :func:`exact_synthesis`."""
    from qdiff.compiler.blocks import block_unitary
    from qdiff.compiler.budget import EXACT_DELTA, phase_distance
    from qdiff.compiler.ops import const_matrix
    from qdiff.compiler.synth import exact_synthesis, from_qiskit_ops
    k = gate.num_wires
    wires = tuple(range(k))
    want = const_matrix(gate, tuple(consts or ()))
    try:
        ops = from_qiskit_ops(low, wires[::-1])  # Qiskit qubit i is local wire i
    except QdiffError:
        ops = None
    if ops is None or phase_distance(block_unitary(ops, wires), want) > EXACT_DELTA:
        try:
            ops = exact_synthesis(want, wires)
        except QdiffError as exc:
            raise QdiffError(f"gate '{gate.name}': {exc}") from None
    return tuple((o.name, o.wires, tuple(float(p) for p in o.params)) for o in ops)
