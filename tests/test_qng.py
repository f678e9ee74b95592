"""Quantum natural gradient: converges in fewer steps than Adam and plain gradient descent."""
import pytest
import torch

import qdiff as qd
from qdiff.operators import PauliSumOperator
from qdiff.solvers import ground_state

pytestmark = pytest.mark.filterwarnings("ignore")
N, L = 4, 2
H = sum(-1.0 * qd.Z(i) @ qd.Z(i + 1) for i in range(N - 1)) + sum(-1.0 * qd.X(i) for i in range(N))


def make_cost(dev=None):
    dev = dev or qd.device("statevector", wires=N)

    @qd.qnode(dev)
    def cost(w):
        for layer in range(L):
            for i in range(N):
                qd.RY(w[layer, i], wires=i)
            for i in range(N - 1):
                qd.CZ(wires=[i, i + 1])
        for i in range(N):
            qd.RY(w[L, i], wires=i)
        return qd.expval(H)
    return cost


def init(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (0.2 * torch.randn(L + 1, N, generator=g, dtype=torch.float64)).requires_grad_()


def ansatz_minimum(cost):
    w = init()
    opt = torch.optim.LBFGS([w], lr=1, max_iter=500, tolerance_grad=1e-12,
                            tolerance_change=1e-15, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = cost(w)
        loss.backward()
        return loss
    opt.step(closure)
    return float(cost(w))


def steps_to(cost, opt, w, target, cap):
    for k in range(cap):
        opt.zero_grad()
        loss = cost(w)
        if float(loss) <= target:
            return k
        loss.backward()
        opt.step()
    return cap


def test_qng_beats_adam_and_gd_on_tfim_vqe():
    cost = make_cost()
    e_star = ansatz_minimum(cost)
    e0 = float(ground_state(PauliSumOperator.from_observable(H, N))[0])
    assert e_star >= e0 - 1e-9  # the ansatz cannot go below the exact ground energy
    target, cap = e_star + 1e-3, 150
    counts = {}
    for name, make in [("qng", lambda w: qd.QNGOptimizer([w], cost, lr=0.1)),
                       ("qng-full", lambda w: qd.QNGOptimizer([w], cost, lr=0.1, metric="full")),
                       ("adam", lambda w: torch.optim.Adam([w], lr=0.1)),
                       ("gd", lambda w: torch.optim.SGD([w], lr=0.1))]:
        w = init()
        counts[name] = steps_to(cost, make(w), w, target, cap)
    print("steps to E* + 1e-3:", counts)
    assert counts["qng"] < cap and counts["qng-full"] < cap
    assert counts["qng"] < counts["adam"] and counts["qng"] < counts["gd"]
    assert counts["qng-full"] < counts["adam"] and counts["qng-full"] < counts["gd"]


def test_qn_spsa_and_shot_metric_lower_the_energy():
    cost = make_cost()
    w = init(1)
    e_start = float(cost(w))
    opt = qd.QNGOptimizer([w], cost, lr=0.05, metric="spsa", lam=0.05, seed=0)
    for _ in range(40):
        opt.zero_grad()
        cost(w).backward()
        opt.step()
    assert float(cost(w)) < e_start - 0.5
    assert opt.last_metric.shape == (12, 12)
    # shot backend: a block-diag QNG step measured with samples lowers the exact energy
    shot_cost = make_cost(qd.device("statevector", wires=N, shots=4000, seed=1))
    exact_cost = make_cost()
    w2 = init(2)
    opt = qd.QNGOptimizer([w2], shot_cost, lr=0.05, metric="block-diag", lam=0.05)
    exact_cost(w2).backward()
    before = float(exact_cost(w2))
    opt.step()
    assert float(exact_cost(w2)) < before


def test_fidelities_compute_uncompute_on_shots_match_statevector():
    from qdiff.optimize import fidelities
    w = init(3)
    shifts = 0.3 * torch.randn(4, w.numel(), generator=torch.Generator().manual_seed(0),
                               dtype=torch.float64)
    base = w.detach().reshape(-1)
    exact = fidelities(make_cost(), (w,), [0], base, shifts)
    shots = fidelities(make_cost(qd.device("statevector", wires=N, shots=20000, seed=2)), (w,),
                       [0], base, shifts)
    assert bool((exact <= 1 + 1e-12).all()) and bool((exact < 1).any())
    se = torch.sqrt(exact * (1 - exact) / 20000).clamp_min(1e-3)
    assert bool(((shots - exact).abs() < 5 * se).all())


def test_qng_closure_args_and_errors():
    cost = make_cost()
    w = init()
    opt = qd.QNGOptimizer([w], cost, lr=0.1, metric="diag")

    def closure():
        opt.zero_grad()
        loss = cost(w)
        loss.backward()
        return loss
    l0 = opt.step(closure)
    assert float(cost(w)) < float(l0)
    with pytest.raises(qd.QdiffError, match="metric must be"):
        qd.QNGOptimizer([w], cost, metric="natural")
    other = torch.zeros(3, requires_grad=True)
    opt = qd.QNGOptimizer([other], cost, args=lambda: (w,))
    cost(w).backward()
    with pytest.raises(qd.QdiffError, match="not a trainable argument"):
        opt.step()


def test_qng_options_checked_and_each_group_keeps_its_lam():
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev)
    def cost(a, b):
        qd.RX(a[0], wires=0)
        qd.RY(b[0], wires=1)
        qd.CNOT(wires=[0, 1])
        qd.RY(a[1], wires=0)
        qd.RX(b[1], wires=1)
        return qd.expval(qd.Z(0) @ qd.X(1))

    a0 = torch.tensor([0.3, -0.4], dtype=torch.float64)
    b0 = torch.tensor([0.7, 0.2], dtype=torch.float64)
    a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    opt = qd.QNGOptimizer([{"params": [a], "lam": 0.5}, {"params": [b], "lam": 0.01}], cost,
                          lr=0.1, metric="full")
    opt.zero_grad()
    cost(a, b).backward()
    grad = torch.cat([a.grad, b.grad])
    opt.step()
    g = qd.metric_tensor(cost, approx=None, hybrid=False)(a0.clone().requires_grad_(),
                                                         b0.clone().requires_grad_())
    # theta columns follow recording order: a[0], b[0], a[1], b[1]
    perm = [0, 2, 1, 3]
    g = g[perm][:, perm]
    delta = torch.linalg.solve(g + torch.diag(torch.tensor([0.5, 0.5, 0.01, 0.01],
                                                           dtype=g.dtype)), grad)
    assert torch.allclose(torch.cat([a, b]).detach(), torch.cat([a0, b0]) - 0.1 * delta,
                          atol=1e-12)
    for kw, what in ((dict(lr="a"), "lr"), (dict(lr=float("nan")), "lr"),
                     (dict(lam=-1.0), "lam"),
                     (dict(metric="spsa", spsa_epsilon=0.0), "spsa_epsilon"),
                     (dict(metric="spsa", spsa_resamplings=0), "spsa_resamplings")):
        with pytest.raises(qd.QdiffError, match=what):
            qd.QNGOptimizer([a], cost, **kw)
    with pytest.raises(qd.QdiffError, match="lam"):
        qd.QNGOptimizer([{"params": [a], "lam": -0.1}], cost)


def test_qn_spsa_state_dict_resumes_the_same_run():
    import copy
    cost = make_cost()

    def run(opt, w, n):
        for _ in range(n):
            opt.zero_grad()
            cost(w).backward()
            opt.step()
    w = init(4)
    opt = qd.QNGOptimizer([w], cost, lr=0.05, metric="spsa", lam=0.05, seed=7)
    run(opt, w, 3)
    saved, w2 = copy.deepcopy(opt.state_dict()), w.detach().clone().requires_grad_()
    run(opt, w, 3)
    opt2 = qd.QNGOptimizer([w2], cost, lr=0.05, metric="spsa", lam=0.05, seed=99)
    opt2.load_state_dict(saved)
    run(opt2, w2, 3)
    assert torch.equal(w.detach(), w2.detach())
    # a state dict of another metric kind is refused rather than silently mixed in
    other = qd.QNGOptimizer([init()], cost, metric="block-diag")
    with pytest.raises(qd.QdiffError, match="spsa"):
        other.load_state_dict(saved)


def test_qng_rates_checked_at_each_step():
    cost = make_cost()
    w = init()
    opt = qd.QNGOptimizer([w], cost, lr=0.1)
    cost(w).backward()
    for key, bad in (("lam", -1.0), ("lr", float("nan"))):
        good = opt.param_groups[0][key]
        opt.param_groups[0][key] = bad
        before = w.detach().clone()
        with pytest.raises(qd.QdiffError, match=key):
            opt.step()
        assert torch.equal(w.detach(), before)
        opt.param_groups[0][key] = good


def test_qng_unknown_keyword_refused():
    cost = make_cost()
    with pytest.raises(qd.QdiffError, match="stepsize"):
        qd.QNGOptimizer([init()], cost, stepsize=0.1)


def test_qng_step_equals_pennylane_qng_step():
    """Single trainable argument: the same update as PennyLane's QNGOptimizer (which applies
    pinv(g + lam I) per argument), block-diag and full metric."""
    import numpy as np
    import pennylane as qml
    from pennylane import numpy as pnp

    def body(lib, w):
        for i in range(3):
            lib.RY(w[0, i], wires=i)
        lib.CNOT(wires=[0, 1])
        lib.IsingYY(w[1, 0], wires=[1, 2])
        lib.RX(w[1, 1], wires=0)
        lib.RZ(2 * w[0, 0], wires=1)
        lib.IsingXX(w[1, 2], wires=[0, 2])

    @qd.qnode(qd.device("statevector", wires=3))
    def f(w):
        body(qd, w)
        return qd.expval(qd.Z(0) @ qd.Z(1) + 0.5 * qd.X(2))

    @qml.qnode(qml.device("default.qubit", wires=3))
    def pf(w):
        body(qml, w)
        return qml.expval(qml.PauliZ(0) @ qml.PauliZ(1) + 0.5 * qml.PauliX(2))
    w0 = np.random.default_rng(3).normal(size=(2, 3))
    for metric, lam in (("block-diag", 0.0), ("block-diag", 0.01), ("full", 0.01)):
        kw = {} if metric != "full" else {"metric_tensor_fn": qml.adjoint_metric_tensor(pf)}
        popt = qml.QNGOptimizer(stepsize=0.1, approx="block-diag", lam=lam)
        pw = popt.step(pf, pnp.array(w0, requires_grad=True), **kw)
        w = torch.tensor(w0, requires_grad=True)
        opt = qd.QNGOptimizer([w], f, lr=0.1, lam=lam, metric=metric)
        f(w).backward()
        opt.step()
        assert np.abs(w.detach().numpy() - np.asarray(pw)).max() < 1e-10


def test_qng_params_and_qnode_checked_at_construction():
    cost = make_cost()
    for params, what in (([], "empty"), ([0.3], "Tensors")):
        with pytest.raises(qd.QdiffError, match=what):
            qd.QNGOptimizer(params, cost)
    with pytest.raises(qd.QdiffError, match="qdiff qnode"):
        qd.QNGOptimizer([init()], lambda w: w.sum())


def test_qng_metric_of_a_tensor_passed_as_two_arguments():
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev)
    def twice(a, b):
        qd.RY(a[0], wires=0)
        qd.CNOT(wires=[0, 1])
        qd.RX(b[0], wires=1)
        qd.RY(a[1] + b[1], wires=0)
        return qd.expval(qd.Z(0) @ qd.Z(1))

    @qd.qnode(dev)
    def once(w):  # the same circuit with the tensor passed once
        qd.RY(w[0], wires=0)
        qd.CNOT(wires=[0, 1])
        qd.RX(w[0], wires=1)
        qd.RY(2 * w[1], wires=0)
        return qd.expval(qd.Z(0) @ qd.Z(1))
    w = torch.tensor([0.4, -0.3], dtype=torch.float64, requires_grad=True)
    ref = qd.metric_tensor(once, approx=None)(w)
    opt = qd.QNGOptimizer([w], twice, metric="full", args=lambda: (w, w))
    assert torch.allclose(opt.compute_metric(), ref, atol=1e-12)


def test_qng_metric_of_weights_the_qnode_closes_over_or_gets_by_keyword():
    """torch style: the optimized tensors need not be the qnode's positional arguments; the
    metric is pulled back through whatever graph leads to the gate angles."""
    dev = qd.device("statevector", wires=2)
    w = torch.tensor([0.4, -0.3], dtype=torch.float64, requires_grad=True)
    lin = torch.nn.Linear(2, 2, dtype=torch.float64)

    @qd.qnode(dev)
    def ref(a):
        qd.RY(a[0], wires=0)
        qd.CNOT(wires=[0, 1])
        qd.RX(a[1], wires=1)
        qd.RY(a[0] * a[1], wires=0)
        return qd.expval(qd.Z(0) @ qd.Z(1))

    @qd.qnode(dev)
    def closed():
        return ref.func(w)

    def keyword(x, *, a):
        return ref.func(a)
    expect = qd.metric_tensor(ref, approx=None)(w)
    opt = qd.QNGOptimizer([w], closed, metric="full", args=lambda: ())
    assert torch.allclose(opt.compute_metric(), expect, atol=1e-12)
    opt = qd.QNGOptimizer([w], qd.qnode(dev)(lambda x: keyword(x, a=w)), metric="block-diag",
                          args=lambda: (0.0,))
    assert torch.allclose(opt.compute_metric(), qd.metric_tensor(ref)(w), atol=1e-12)
    # classical weights before the circuit: J^T g J with J through the linear layer
    x = torch.tensor([0.2, 0.7], dtype=torch.float64)
    hyb = qd.qnode(dev)(lambda: ref.func(lin(x)))
    opt = qd.QNGOptimizer(lin.parameters(), hyb, metric="full", args=lambda: ())
    a = lin(x).detach().requires_grad_()
    g = qd.metric_tensor(ref, approx=None)(a)
    J = torch.autograd.functional.jacobian(
        lambda W, b: torch.nn.functional.linear(x, W, b), (lin.weight.detach(), lin.bias.detach()))
    J = torch.cat([j.reshape(2, -1) for j in J], dim=1)
    assert torch.allclose(opt.compute_metric(), J.T @ g @ J, atol=1e-12)


def test_qn_spsa_without_a_seed_follows_torchs_global_generator():
    """seed=None: torch.manual_seed makes the run reproducible, another seed changes it (as a
    torch optimizer's randomness does); the other metrics draw nothing from it."""
    def run(s, metric="spsa"):
        torch.manual_seed(s)
        w = init()
        cost = make_cost(qd.device("statevector", wires=N))
        opt = qd.QNGOptimizer([w], cost, lr=0.05, metric=metric, lam=0.05)
        for _ in range(2):
            opt.zero_grad()
            cost(w).backward()
            opt.step()
        return w.detach().clone(), torch.rand(1)
    a, b, c = run(3), run(3), run(4)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])
    _, after = run(5, "block-diag")
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(1))


@pytest.mark.parametrize("metric", ["block-diag", "diag", "full", "spsa"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_qng_steps_low_precision_parameters_in_their_dtype(metric, dtype):
    """float16/bfloat16/float32 parameters: the metric is solved in float32 at least and the
    step is the float64 run's step rounded to the parameter's dtype."""
    cost = make_cost()
    w0 = init(3)

    def run(dt):
        w = w0.detach().clone().to(dt).requires_grad_()
        opt = qd.QNGOptimizer([w], cost, lr=0.05, lam=0.1, metric=metric, seed=7)
        opt.zero_grad()
        cost(w).backward()
        opt.step()
        return w, opt
    ref, _ = run(torch.float64)
    w, opt = run(dtype)
    assert w.dtype == dtype and opt.last_metric.dtype == dtype
    assert opt.compute_metric().dtype == dtype
    tol = {torch.float16: 1e-3, torch.bfloat16: 5e-3, torch.float32: 1e-7}[dtype]
    assert torch.allclose(w.double(), ref.detach(), atol=tol, rtol=0)
