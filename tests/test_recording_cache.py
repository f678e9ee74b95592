"""Templates recorded as one block, and the qnode's reuse of a recorded circuit while the
structure of the calls stays the same: results, gradients and expanded operations must be
those of the per-gate recording."""
import math

import pytest
import torch

import qdiff as qd
import qdiff.circuits.circuit as circuit_mod
from qdiff.circuits.operation import OpBlock
from qdiff.qnode import QNode


def _clear():
    circuit_mod._STRUCT_CACHE.clear()


def test_template_operations_expand_the_block():
    w = torch.rand(2, 3, 3, dtype=torch.float64)
    x = torch.rand(4, 3, dtype=torch.float64)
    with qd.record() as rec:
        qd.AngleEmbedding(x, wires=[0, 1, 2], rotation="Y")
        t = qd.StronglyEntanglingLayers(w, wires=[0, 1, 2])
    assert any(isinstance(i, OpBlock) for i in rec.raw)
    ops = rec.operations
    assert [o.name for o in ops[:3]] == ["ry"] * 3
    assert torch.equal(ops[1].params[0], x[:, 1])
    rots = [o for o in t.operations if o.name == "rot"]
    assert len(rots) == 6 and len(t.operations) == 12
    assert all(torch.equal(p, w[1, 2, k]) for k, p in enumerate(rots[5].params))
    cx = [o.wires for o in t.operations if o.name == "cx"]
    assert cx[:3] == [(0, 1), (1, 2), (2, 0)] and cx[3:] == [(0, 2), (1, 0), (2, 1)]


def _reference(func, wires, *args):
    """The same call through the per-gate recording (blocks expanded, no structure cache)."""
    q = QNode(func, qd.device("statevector", wires=wires))
    with qd.record() as rec:
        result = func(*args)
    items = [i for i in rec.items if not isinstance(i, qd.circuits.measurements.Measurement)]
    from qdiff.qnode import _flatten_measurements
    meas = _flatten_measurements(result)
    recd = circuit_mod._build_recorded(items, meas, tuple(q.device.wires))
    from qdiff.bridge import execute
    from qdiff.qnode import _assemble
    return _assemble(execute(recd, q.device, "backprop"), recd, result)


def test_repeated_calls_reuse_the_circuit_and_match_the_reference():
    _clear()
    dev = qd.device("statevector", wires=3)

    def body(x, w):
        qd.AngleEmbedding(x, wires=range(3))
        qd.StronglyEntanglingLayers(w, wires=range(3))
        return [qd.expval(qd.Z(i)) for i in range(3)]

    q = QNode(body, dev)
    g = torch.Generator().manual_seed(1)
    circuits = []
    for _ in range(3):
        x = torch.rand(5, 3, dtype=torch.float64, generator=g)
        w = torch.rand(2, 3, 3, dtype=torch.float64, generator=g)
        rec, _ = q.construct(x, w)
        circuits.append(rec.circuit)
        torch.testing.assert_close(q(x, w), _reference(body, 3, x, w), atol=1e-12, rtol=0)
    assert circuits[0] is circuits[1] is circuits[2]


def test_structure_changes_are_not_served_from_the_cache():
    _clear()
    dev = qd.device("statevector", wires=2)

    def body(x, c, wire):
        if float(x.detach().reshape(-1)[0]) > 0:  # Python control flow on values
            qd.RX(x, wires=wire)
        else:
            qd.RY(x, wires=wire)
        qd.RZ(c, wires=0)  # a plain-number angle is part of the structure
        qd.CNOT(wires=[0, 1])
        return qd.expval(qd.X(1) @ qd.Y(0)) if wire == 1 else qd.expval(qd.Z(1))

    q = QNode(body, dev)
    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    cases = [(t(0.3), 0.2, 0), (t(-0.3), 0.2, 0), (t(0.3), 0.5, 0), (t(0.3), 0.2, 1),
             (t([0.3, 0.4]), 0.2, 0), (torch.tensor(0.3, dtype=torch.float32), 0.2, 0)]
    seen = []
    for x, c, wire in cases:
        rec, _ = q.construct(x, c, wire)
        seen.append(rec.circuit)
        torch.testing.assert_close(q(x, c, wire).double(), _reference(body, 2, x, c, wire).double(),
                                   atol=1e-6, rtol=0)
    assert len({id(c) for c in seen}) == len(cases)
    # requires_grad is part of the structure (trainable columns)
    x = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    rec, _ = q.construct(x, 0.2, 0)
    assert rec.trainable == (True,)
    (gx,) = torch.autograd.grad(q(x, 0.2, 0), x)
    expected = -math.sin(0.3)  # <Z1> after RX(x) on 0, CNOT = cos(x)
    assert abs(float(gx) - expected) < 1e-10


@pytest.mark.parametrize("method", ["backprop", "adjoint", "parameter-shift"])
def test_block_gradients_match_per_gate_recording(method):
    _clear()
    dev = qd.device("statevector", wires=3)

    def body(x, w):
        qd.AngleEmbedding(x, wires=range(3), rotation="Y")
        qd.StronglyEntanglingLayers(w, wires=range(3), ranges=[2, 1])
        return [qd.expval(qd.Z(i)) for i in range(3)]

    q = QNode(body, dev, diff_method=method)
    g = torch.Generator().manual_seed(5)
    x = torch.rand(4, 3, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.rand(2, 3, 3, dtype=torch.float64, generator=g, requires_grad=True)
    cot = torch.rand(4, 3, dtype=torch.float64, generator=g)
    for _ in range(2):  # the second call is served from the cache
        gx, gw = torch.autograd.grad((q(x, w) * cot).sum(), (x, w))
    rx, rw = torch.autograd.grad((_reference(body, 3, x, w) * cot).sum(), (x, w))
    torch.testing.assert_close(gx, rx, atol=1e-10, rtol=0)
    torch.testing.assert_close(gw, rw, atol=1e-10, rtol=0)


def test_same_observable_object_with_new_coefficients_is_a_new_structure():
    _clear()
    dev = qd.device("statevector", wires=1)

    def body(x, h):
        qd.RX(x, wires=0)
        return qd.expval(h)

    q = QNode(body, dev)
    x = torch.tensor(0.4, dtype=torch.float64)
    h1 = qd.Hamiltonian([0.5, 2.0], [qd.Z(0), qd.X(0)])
    h2 = qd.Hamiltonian([1.5, 0.0], [qd.Z(0), qd.X(0)])
    torch.testing.assert_close(q(x, h1), 0.5 * torch.cos(x), atol=1e-12, rtol=0)
    torch.testing.assert_close(q(x, h2), 1.5 * torch.cos(x), atol=1e-12, rtol=0)


@pytest.mark.parametrize("observable,other,factor,expected", [
    # a two-term Hamiltonian (general path)
    (lambda: qd.Z(0) * 0.5 + qd.Z(1) * 0.25, lambda: qd.Z(0) @ qd.Z(1), 2.0,
     [-1.0 * math.sin(0.3), -0.5 * math.sin(0.9)]),
    # a one-term Z observable (the stacked Z-word path)
    (lambda: qd.Z(1) * 0.5, lambda: qd.Z(0), 3.0, [0.0, -1.5 * math.sin(0.9)]),
])
def test_observable_changed_in_place_is_read_anew(observable, other, factor, expected):
    """A reused circuit keeps the user's observable; its coefficients are read on every call."""
    _clear()
    dev = qd.device("statevector", wires=2)
    h = observable()

    @qd.qnode(dev, diff_method="adjoint")
    def f(w):
        qd.RX(w[0], wires=0)
        qd.RY(w[1], wires=1)
        return [qd.expval(h), qd.expval(other())]

    w = torch.tensor([0.3, 0.9], dtype=torch.float64, requires_grad=True)
    out1 = f(w)
    with torch.no_grad():
        h.coeffs.mul_(factor)
    out2 = f(w)
    torch.testing.assert_close(out2[0], factor * out1[0], atol=1e-12, rtol=0)
    (g,) = torch.autograd.grad(out2[0], w)
    torch.testing.assert_close(g, torch.tensor(expected, dtype=torch.float64), atol=1e-12, rtol=0)


def test_angles_selected_twice_from_a_view_of_a_flat_tensor():
    # x is a view of a 1-D tensor: x[..., 0] selects from a base with no dims past it
    dev = qd.device("statevector", wires=1)

    def f(x):
        qd.RX(x[..., 0], wires=0)
        qd.RX(x[..., 0], wires=0)
        return qd.expval(qd.Z(0))
    flat = torch.rand(5, dtype=torch.float64, requires_grad=True)
    x = flat.view(5, 1)
    out = QNode(f, dev)(x)
    torch.testing.assert_close(out, torch.cos(2 * x[:, 0]))
    out.sum().backward()
    torch.testing.assert_close(flat.grad, -2 * torch.sin(2 * flat.detach()))
    static = qd.qnode(dev, static=True)(f)
    torch.testing.assert_close(static(torch.rand(5, 1, dtype=torch.float64) * 0 + x.detach()),
                               torch.cos(2 * x.detach()[:, 0]))
