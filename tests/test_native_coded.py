"""Gates the native kernels evaluate from theta themselves (coded gates), batch tiles for small
states, batch-shared weight columns and the product-state prefix, against the torch kernels."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff.backends.statevector.adjoint import adjoint_vjp
from qdiff.backends.statevector import native
from qdiff.backends.statevector.simulate import simulate
from qdiff.circuits import Circuit, Operation, ParamRef
from qdiff.circuits.gates import BUILTIN_GATES, Gate, controlled_gate, multirz_gate

pytestmark = pytest.mark.skipif(native.library() is None,
                                reason="no C compiler: the native kernels are not built")

# every built-in gate the kernels evaluate themselves, from the gate records
CODED = sorted(name for name, g in BUILTIN_GATES.items() if g.num_params and native.code_of(g))


def _mixer(n):
    """Constant gates that make a generic state (so every matrix entry matters)."""
    g = BUILTIN_GATES
    ops = [Operation(g["h"], (w,)) for w in range(n)]
    ops += [Operation(g["t"], (0,)), Operation(g["cx"], (0, n - 1)), Operation(g["sx"], (1,)),
            Operation(g["cz"], (1, 2)), Operation(g["s"], (n - 1,))]
    return ops


def _gate_circuit(gate, n, rng):
    """The gate three times on random wires: angles from theta (with scales and offsets, one
    column used twice) and one constant angle set."""
    ops, p = _mixer(n), 0
    for use in range(3):
        wires = tuple(int(w) for w in rng.choice(n, gate.num_wires, replace=False))
        if use == 2:
            params = tuple(float(a) for a in rng.uniform(-3, 3, gate.num_params))
        else:
            params = tuple(ParamRef(p + i, scale=(1.0 if use == 0 else -0.7), offset=0.3 * use)
                           for i in range(gate.num_params))
            p += gate.num_params
        ops.append(Operation(gate, wires, params))
        ops += _mixer(n)[n:]
    ops.append(Operation(gate, tuple(range(gate.num_wires)), tuple(ParamRef(i) for i in range(gate.num_params))))
    return Circuit(n, tuple(ops), num_params=p)


def _gates():
    # controlled gates through their coded target, several controls in the record's mask
    ctrl = [controlled_gate(BUILTIN_GATES[name], k)
            for name, k in (("rx", 2), ("rot", 3), ("rzz", 2), ("crx", 2))]
    return [BUILTIN_GATES[name] for name in CODED] + [multirz_gate(k) for k in (1, 2, 3, 5)] + \
        ctrl


def test_coded_gates_come_from_the_gate_records():
    """The kernels' formulas are named by the Gate records (controlled gates through their
    target); every record's formula exists in the library."""
    assert {"rx", "ry", "rz", "p", "u1", "rot", "rxx", "ryy", "rzz", "single_excitation",
            "double_excitation", "crx", "cry", "crz", "cp", "crot"} <= set(CODED)
    for g in BUILTIN_GATES.values():
        if g.native_code:
            assert native.code_of(g) is not None, g.name
    assert native.code_of(multirz_gate(4)) is not None
    assert native.code_of(multirz_gate(7)) is None  # wider than the kernels' records


@pytest.mark.parametrize("gate", _gates(),
                         ids=lambda g: f"{g.pl_name if g.controls > 1 else g.name}{g.num_wires}")
@pytest.mark.parametrize("batch", [1, 5, 37])
def test_coded_gate_forward_and_gradient_match_torch(gate, batch):
    n = 5
    rng = np.random.default_rng(abs(hash((gate.name, gate.num_wires, batch))) % 2 ** 32)
    c = _gate_circuit(gate, n, rng)
    assert native.coded_plan(c.operations, n) is not None, "the gate must be coded"
    theta = torch.tensor(rng.uniform(-3, 3, (batch, c.num_params)))
    with torch.no_grad():
        state = simulate(c, theta)
        with native.disabled():
            ref = simulate(c, theta)
    torch.testing.assert_close(state, ref, atol=1e-12, rtol=0)
    # gradient of sum_b <psi_b| H |psi_b> for a Z-word and a general observable
    meas = (qd.expval(qd.Z(0) @ qd.Z(3)), qd.expval(qd.X(1) @ qd.Y(2)), qd.expval(qd.Z(4)))
    cm = c.with_measurements(meas)
    cot = torch.tensor(rng.normal(size=(batch, 3)))
    trainable = (True,) * c.num_params
    with torch.no_grad():
        st = simulate(cm, theta)
        g_native, psi0 = adjoint_vjp(cm, theta, st.clone(), cot, trainable, return_state=True)
    t = theta.clone().requires_grad_(True)
    with native.disabled():
        from qdiff.backends.statevector.measure import measure_all
        outs = measure_all(simulate(cm, t), cm, None, None)
    (g_ref,) = torch.autograd.grad(sum((o * cot[:, k]).sum() for k, o in enumerate(outs)), t)
    torch.testing.assert_close(g_native, g_ref, atol=1e-10, rtol=0)
    # restore=True: the sweep uncomputes to the input state |0...0>
    zero = torch.zeros_like(psi0)
    zero[:, 0] = 1
    torch.testing.assert_close(psi0, zero, atol=1e-12, rtol=0)


def test_replaced_registry_gate_is_not_coded():
    """Only the built-in gate objects carry native formulas: a look-alike falls back."""
    rx = BUILTIN_GATES["rx"]
    fake = Gate(name="my_rx", num_wires=1, num_params=1, matrix_fn=lambda t: rx.matrix_fn(2 * t),
                generators=(np.array([[0, 1], [1, 0]], dtype=complex),))
    c = Circuit(2, (Operation(BUILTIN_GATES["h"], (0,)), Operation(fake, (1,), (ParamRef(0),))),
                num_params=1)
    assert native.coded_plan(c.operations, 2) is None
    theta = torch.tensor([[0.4], [1.1]], dtype=torch.float64)
    with torch.no_grad():
        out = simulate(c, theta)
    torch.testing.assert_close(out[:, 0].abs() ** 2, torch.full((2,), 0.5) * torch.cos(theta[:, 0]) ** 2,
                               atol=1e-12, rtol=0)


@pytest.mark.parametrize("n,batch", [(2, 1), (3, 37), (4, 300), (8, 9), (11, 3)])
def test_shared_weight_columns_give_the_same_weight_gradients(n, batch):
    """Weights without batch dims are one value per column: the tile-summed gradients (partial
    sums in some rows) must give the same weight and input gradients as backprop."""
    dev = qd.device("statevector", wires=n)

    def body(x, w):
        qd.AngleEmbedding(x, wires=range(n), rotation="Y")
        qd.RZ(x[..., 0] * 0.5, wires=0)  # a per-binding angle after the prefix
        qd.StronglyEntanglingLayers(w, wires=range(n))
        qd.CRX(w[0, 0, 0], wires=[0, n - 1]) if n > 1 else None
        return [qd.expval(qd.Z(i)) for i in range(n)]

    g = torch.Generator().manual_seed(n * 1000 + batch)
    x = torch.rand(batch, n, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.rand(2, n, 3, dtype=torch.float64, generator=g, requires_grad=True)
    cot = torch.rand(batch, n, dtype=torch.float64, generator=g)
    res = {}
    for method in ("adjoint", "backprop"):
        q = qd.QNode(body, dev, diff_method=method)
        out = q(x, w)
        res[method] = (out.detach(),) + torch.autograd.grad((out * cot).sum(), (x, w))
    for a, b in zip(res["adjoint"], res["backprop"]):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    rec, _ = qd.QNode(body, dev).construct(x, w)
    if batch > 1:
        assert rec.shared is not None and any(rec.shared) and not all(rec.shared)
    else:
        assert rec.shared is None


def test_product_prefix_with_flips_and_diagonals():
    g = BUILTIN_GATES
    n = 4
    ops = [Operation(g["x"], (2,)), Operation(g["ry"], (0,), (ParamRef(0),)),
           Operation(g["rz"], (0,), (ParamRef(1),)), Operation(g["h"], (3,)),
           Operation(g["p"], (3,), (0.7,)), Operation(g["rot"], (1,), (ParamRef(2), 0.3, ParamRef(0))),
           Operation(g["cx"], (0, 1)), Operation(g["rx"], (2,), (ParamRef(1),))]
    c = Circuit(n, tuple(ops), num_params=3)
    theta = torch.tensor(np.random.default_rng(1).uniform(-3, 3, (6, 3)))
    with torch.no_grad():
        state = simulate(c, theta)
        with native.disabled():
            ref = simulate(c, theta)
    torch.testing.assert_close(state, ref, atol=1e-12, rtol=0)
    # from a given initial state the prefix is not assumed
    init = torch.randn(6, 2 ** n, dtype=torch.complex128)
    init = init / init.norm(dim=1, keepdim=True)
    with torch.no_grad():
        state = simulate(c, theta, init)
        with native.disabled():
            ref = simulate(c, theta, init)
    torch.testing.assert_close(state, ref, atol=1e-12, rtol=0)


def test_coded_sweep_two_threads_match_one():
    dev = qd.device("statevector", wires=5)

    @qd.qnode(dev, diff_method="adjoint")
    def f(x, w):
        qd.AngleEmbedding(x, wires=range(5))
        qd.StronglyEntanglingLayers(w, wires=range(5))
        return [qd.expval(qd.Z(i)) for i in range(5)]
    x = torch.rand(70, 5, dtype=torch.float64)
    w = torch.rand(2, 5, 3, dtype=torch.float64, requires_grad=True)
    grads = []
    old = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            (gw,) = torch.autograd.grad(f(x, w).sum(), w)
            grads.append(gw)
    finally:
        torch.set_num_threads(old)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-12, rtol=0)


def test_adjoint_records_evicted_by_another_thread_meanwhile():
    """Threads share a circuit's plan: when two evict the oldest adjoint records at once, the
    second finds them gone (emulated: the entry disappears just before it is removed) and
    keeps the cache bounded without an error."""
    ops = tuple(Operation(qd.get_gate("rx"), (w % 2,), (ParamRef(w),)) for w in range(5))
    plan = native.coded_plan(ops, 2)
    if plan is None:
        pytest.skip("native kernels not built")

    class Raced(dict):
        def pop(self, key, *default):
            dict.pop(self, key, None)  # "another thread" evicted it first
            return dict.pop(self, key, *default)

    plan._adjoint = Raced()
    for i in range(40):
        train = tuple(bool(i >> j & 1) for j in range(5))
        recs, lo = plan.adjoint_records(train)
        assert recs["train"].tolist() == [int(t) for t in train]
        assert lo == (train.index(True) if any(train) else 5)
    assert len(plan._adjoint) <= 16
