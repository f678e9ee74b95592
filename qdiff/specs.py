"""``qd.specs(qnode)(*args)``: what one call of a qnode records and what its gradient costs.

>>> import torch, qdiff as qd
>>> dev = qd.device("statevector", wires=2)
>>> @qd.qnode(dev, diff_method="parameter-shift")
... def f(x):
...     qd.RX(x, 0); qd.CNOT([0, 1]); qd.CRY(x, [0, 1])
...     return qd.expval(qd.Z(1))
>>> s = qd.specs(f)(torch.tensor(0.3, requires_grad=True))
>>> s["gate_types"], s["depth"], s["num_trainable_params"], s["gradient_method"]
({'RX': 1, 'CNOT': 1, 'CRY': 1}, 3, 2, 'parameter-shift')
>>> s["backend_calls_per_gradient"], s["circuits_per_gradient"]
(1, 6)
"""
from __future__ import annotations

import torch

from qdiff.circuits.errors import QdiffError
from qdiff.circuits.midcircuit import is_mid_wire


def _depth(circuit) -> int:
    level = [0] * circuit.num_wires
    depth = 0
    for op in circuit.operations:
        d = 1 + max((level[w] for w in op.wires), default=0)
        for w in op.wires:
            level[w] = d
        depth = max(depth, d)
    return depth


def _used_wires(circuit) -> set:
    """The wires the operations and the measurements name (observables' wires, ``probs``'
    wires; ``state()`` and ``probs()`` name none), as PennyLane's specs count them."""
    used = {w for op in circuit.operations for w in op.wires}
    for m in circuit.measurements:
        if m.obs is not None:
            used.update(w for term in m.obs.terms for f in term for w in f.wires)
        elif m.wires is not None:
            used.update(m.wires)
    return used


def _gradient_cost(qnode, recorded, rule, shots) -> tuple:
    """``(backend calls, circuit executions)`` of one backward pass of this call."""
    from qdiff.bridge import DIFFERENTIABLE_KINDS, expand_coefficients, unshare
    from qdiff.rules import BACKPROP, make_options
    b = recorded.theta.shape[0]
    if not any(recorded.trainable):
        return 0, 0
    if rule is BACKPROP:
        return 0, 0  # torch differentiates the forward simulation itself
    if rule.shifts is None:
        return 1, b  # the backend's own reverse mode: one vjp call over the batch
    circ, theta, train, _ = unshare(recorded.circuit, recorded.theta, recorded.trainable)
    # samples and counts beside a differentiated output carry no gradient: the shifted
    # circuits are those of the differentiable measurements
    diff = [m for m in circ.measurements if m.kind in DIFFERENTIABLE_KINDS]
    if not diff:
        return 0, 0
    circ, _ = expand_coefficients(circ.with_measurements(diff))
    opts = qnode.options if qnode.diff_method != "best" else make_options(rule.name, {})
    shifts, _ = rule.shifts(circ, train, theta.detach(), opts)
    s = shifts.shape[0]
    if s and any(m.kind == "var" for m in circ.measurements):
        s += 1  # the unshifted point, for the variance's chain rule
    return (1 if s else 0), s * b


def as_qnode(qnode, who: str):
    """The :class:`~qdiff.qnode.QNode` behind ``qnode`` (a record-once qnode's own), or a
    QdiffError naming ``who`` for anything else."""
    from qdiff.qnode import QNode
    from qdiff.static import StaticQNode
    if isinstance(qnode, StaticQNode):
        qnode = qnode.qnode
    if not isinstance(qnode, QNode):
        raise QdiffError(f"{who}: expected a qdiff qnode, got {type(qnode).__name__}")
    return qnode


def split_shots(qnode, kwargs: dict):
    """``(shots, kwargs)`` of one call: a ``shots=`` keyword is the call's shots (as for
    the qnode itself) unless the function takes a ``shots`` argument."""
    if "shots" in kwargs and not qnode._func_takes_shots:
        kwargs = dict(kwargs)
        return kwargs.pop("shots"), kwargs
    return qnode.shots, kwargs


def _label(op, mid: set):
    """The name ``op`` counts under: its gate's; ``MidMeasureMP`` for a mid-circuit
    measurement (its outcome copied onto a measurement wire) and ``Conditional(<gate>)`` for
    a gate that measurements control (a reset after a measurement counts so too, as
    ``Conditional(PauliX)``); ``None`` for the flips of a condition on outcome 0, which are
    not the user's gates."""
    on_mid = [w in mid for w in op.wires]
    if not any(on_mid):
        return op.gate.pl_name or op.name
    if op.name == "cx" and not on_mid[0] and on_mid[1]:
        return "MidMeasureMP"
    if all(on_mid):
        return None
    _, gate = op.gate.unwrap_controls(limit=sum(on_mid))
    return f"Conditional({gate.pl_name or gate.name})"


def specs(qnode):
    """A function of the qnode's arguments returning a dict: ``gate_types`` (PennyLane names
    and counts), ``num_operations``, ``depth``, ``num_wires`` (device) and ``num_used_wires``
    (those the operations and measurements name, as PennyLane counts them), ``num_params``
    (angle uses, i.e. theta columns) and ``num_trainable_params``, ``batch_size``,
    ``measurements``, ``diff_method`` (as given) and ``gradient_method`` (the rule a call
    with gradients uses), ``shots``, and what one backward pass costs:
    ``backend_calls_per_gradient`` (backend calls) and ``circuits_per_gradient`` (circuit
    executions in them, bindings included; 0 for backprop, which differentiates the forward).

    On a device with a device noise model the circuit that runs is the routed one
    (:mod:`qdiff.noise`): every count above is of that circuit, and ``routed_for`` names the
    device it was routed for (``None``: the circuit runs as written)."""
    qnode = as_qnode(qnode, "specs")

    def run(*args, **kwargs):
        from qdiff.bridge import deferred_backend, effective_shots
        from qdiff.rules import resolve
        shots, kwargs = split_shots(qnode, kwargs)
        recorded, _ = qnode.construct(*args, **kwargs)
        # the device a call runs on: widened by deferred measurements (refused when noisy)
        device = deferred_backend(qnode.device, recorded.circuit, {})
        from qdiff.noise import route_recorded
        routed = route_recorded(recorded, device)
        routed_for = None if routed is recorded else device.noise.name
        recorded = routed
        circuit = recorded.circuit
        shots = effective_shots(device, shots)
        rule = resolve(qnode.diff_method, device, circuit, recorded, shots)
        mid = {i for i, w in enumerate(circuit.labels or ()) if is_mid_wire(w)}
        types: dict = {}
        for op in circuit.operations:
            label = _label(op, mid)
            if label is not None:
                types[label] = types.get(label, 0) + 1
        calls, circuits = _gradient_cost(qnode, recorded, rule, shots)
        return {
            "gate_types": types,
            "num_operations": sum(types.values()),
            "depth": _depth(circuit),
            "num_wires": circuit.num_wires - len(mid),
            "num_used_wires": len(_used_wires(circuit) - mid),
            "num_params": circuit.num_params,
            "num_trainable_params": int(sum(recorded.trainable)),
            "batch_size": int(recorded.theta.shape[0]) if recorded.batch_shape else None,
            "measurements": [repr(m) for m in circuit.measurements],
            "diff_method": qnode.diff_method,
            "gradient_method": rule.name,
            "shots": shots,
            "backend_calls_per_gradient": calls,
            "circuits_per_gradient": circuits,
            "routed_for": routed_for,
        }
    return run
