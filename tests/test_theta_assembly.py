"""theta assembly from recorded angles: the one-gather path for template weights must give the
same theta, in the same column order, with the same gradients as stacking angle by angle."""
import torch

import qdiff as qd
import qdiff.circuits.circuit as circuit_mod


def _body(x, w, extra):
    qd.AngleEmbedding(x, wires=range(3))
    qd.RZ(extra, wires=0)
    qd.StronglyEntanglingLayers(w, wires=range(3))
    qd.RX(w[0, 1, 2] * 2.0, wires=1)  # not a view: stacked on its own
    qd.RY(x[..., 0], wires=2)          # a second use of an input column
    return [qd.expval(qd.Z(i)) for i in range(3)]


def _record(x, w, extra):
    from qdiff.qnode import QNode
    q = QNode(_body, qd.device("statevector", wires=3))
    rec, _ = q.construct(x, w, extra)
    return rec


def _inputs():
    g = torch.Generator().manual_seed(3)
    data = torch.rand(5, 7, dtype=torch.float64, generator=g)
    x = data[:, 1:4].clone().requires_grad_(True)
    w = torch.rand(2, 3, 3, dtype=torch.float64, generator=g, requires_grad=True)
    extra = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    return x, w, extra


def test_gathered_theta_equals_stacked(monkeypatch):
    x, w, extra = _inputs()
    fast = _record(x, w, extra)
    monkeypatch.setattr(circuit_mod, "_view_of", lambda c, bases: None)
    slow = _record(x, w, extra)
    sig = lambda r: [(o.name, o.wires, repr(o.params)) for o in r.circuit.operations]  # noqa
    assert sig(fast) == sig(slow)
    assert torch.equal(fast.theta, slow.theta)
    assert fast.trainable == slow.trainable
    gv = torch.rand_like(fast.theta)
    g_fast = torch.autograd.grad((fast.theta * gv).sum(), [x, w, extra])
    g_slow = torch.autograd.grad((slow.theta * gv).sum(), [x, w, extra])
    for a, b in zip(g_fast, g_slow):
        assert torch.allclose(a, b, atol=1e-14)


def test_template_weights_are_gathered_in_one_op():
    x, w, extra = _inputs()
    rec = _record(x, w, extra)
    # the SEL weights and the embedding inputs each enter through one IndexSelect node
    names = set()
    stack = [rec.theta.grad_fn]
    while stack:
        node = stack.pop()
        if node is None:
            continue
        names.add(type(node).__name__)
        stack.extend(f for f, _ in node.next_functions)
    assert "IndexSelectBackward0" in names
    assert sum(1 for _ in _nodes(rec.theta.grad_fn)) < 40


def _nodes(root):
    seen, stack = set(), [root]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        yield node
        stack.extend(f for f, _ in node.next_functions)


def test_view_of_an_intermediate_view_keeps_its_gradient():
    """torch.autograd.functional passes inputs as view_as views: gathering from the storage base
    would skip them and give silent zeros (caught by the Hessian test too)."""
    w = torch.tensor([0.3, 0.4], dtype=torch.float64, requires_grad=True)
    q = qd.QNode(lambda w: (qd.RX(w[0], wires=0), qd.RY(w[1], wires=0),
                            qd.expval(qd.Z(0)))[-1], qd.device("statevector", wires=1))
    jac = torch.autograd.functional.jacobian(q, w)
    a, b = w.detach()
    assert torch.allclose(jac, torch.stack([-torch.sin(a) * torch.cos(b),
                                            -torch.cos(a) * torch.sin(b)]), atol=1e-12)


def test_assembly_under_no_grad_with_trainable_weights():
    """Inference on a model whose weights require grad (the views carry no graph there)."""
    x, w, extra = _inputs()
    with torch.no_grad():
        rec = _record(x, w, extra)
    ref = _record(x, w, extra).theta.detach()
    assert torch.equal(rec.theta, ref)
