"""Record-once qnodes (``static=True`` / ``qd.jit``): outputs and gradients equal the plain
qnode's on random circuits (batched inputs that require grad, weights, scaled and constant
angles), re-tracing on a new signature, and refusal of what a replay could get wrong."""
from __future__ import annotations

import math
import random
import warnings

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff.backends.base import Job, Prepared
from qdiff.backends.statevector.prepared import NativePrepared

ONE = ["rx", "ry", "rz", "phaseshift"]
TWO = ["crx", "cry", "crz", "isingxx", "isingzz"]
FIXED1 = ["h", "s", "t", "x", "sx"]
FIXED2 = ["cx", "cz", "swap"]


def _gate(name):
    return qd.get_gate(name)


def random_body(n, n_in, n_w, seed, measure="z"):
    """A random circuit whose angles are inputs x[..., i], weights w[j] (plain, scaled and
    shifted) and constants."""
    rng = random.Random(seed)
    plan = []
    for _ in range(rng.randint(6, 14)):
        kind = rng.random()
        if kind < 0.4:
            plan.append(("1", rng.choice(ONE), (rng.randrange(n),), rng.randrange(4)))
        elif kind < 0.6:
            a, b = rng.sample(range(n), 2)
            plan.append(("2", rng.choice(TWO), (a, b), rng.randrange(4)))
        elif kind < 0.8:
            plan.append(("f", rng.choice(FIXED1), (rng.randrange(n),), 0))
        elif kind < 0.9:
            a, b = rng.sample(range(n), 2)
            plan.append(("f", rng.choice(FIXED2), (a, b), 0))
        else:
            plan.append(("rot", "rot", (rng.randrange(n),), 0))
    picks = [(rng.randrange(n_in), rng.randrange(n_w), rng.uniform(-2, 2)) for _ in plan]

    def body(x, w):
        for (kind, name, wires, src), (i, j, s) in zip(plan, picks):
            g = _gate(name)
            if kind == "f":
                _emit(g, wires, ())
                continue
            if kind == "rot":
                _emit(g, wires, (x[..., i], w[j], 0.25))
                continue
            angle = (x[..., i], w[j], s * w[j] + 0.5, 0.7)[src]
            _emit(g, wires, (angle,))
        if measure == "z":
            return [qd.expval(qd.Z(k)) for k in range(n)]
        if measure == "mixed":
            return [qd.expval(qd.Z(0) @ qd.Z(1)), qd.var(qd.X(n - 1)),
                    qd.expval(0.5 * qd.Z(0) + 0.25 * qd.Y(1))]
        if measure == "probs":
            return qd.probs(wires=[0, 1])
        return qd.expval(qd.Z(0))
    return body


def _emit(gate, wires, params):
    from qdiff.circuits import recording
    recording.record_operation(gate, wires, params)


def _inputs(b, n_in, n_w, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (b, n_in) if b else (n_in,)
    x = (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1).requires_grad_()
    w = (torch.rand(n_w, generator=g, dtype=torch.float64) * 2 - 1).requires_grad_()
    return x, w


def _grads(f, x, w):
    out = f(x, w)
    out = out if isinstance(out, torch.Tensor) else torch.cat([o.reshape(-1) for o in out])
    g = torch.linspace(0.3, 1.7, out.numel(), dtype=out.dtype).reshape(out.shape)
    gx, gw = torch.autograd.grad(out, [x, w], g)
    return out.detach(), gx, gw


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("method", ["best", "adjoint", "backprop", "parameter-shift"])
@pytest.mark.parametrize("batch", [0, 1, 5])
def test_static_equals_plain_on_random_circuits(seed, method, batch):
    n, n_in, n_w = 3, 3, 4
    dev = qd.device("statevector", wires=n)
    body = random_body(n, n_in, n_w, seed)
    plain = qd.qnode(dev, diff_method=method)(body)
    static = qd.qnode(dev, diff_method=method, static=True)(body)
    for rep in range(2):  # the second call replays the trace
        x, w = _inputs(batch, n_in, n_w, 100 * seed + rep)
        o1, gx1, gw1 = _grads(plain, x, w)
        o2, gx2, gw2 = _grads(static, x, w)
        torch.testing.assert_close(o2, o1, atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(gx2, gx1, atol=1e-9, rtol=1e-9)
        torch.testing.assert_close(gw2, gw1, atol=1e-9, rtol=1e-9)
    assert static.num_traces == 1


@pytest.mark.parametrize("measure", ["mixed", "probs", "single"])
def test_static_other_measurements(measure):
    n = 3
    dev = qd.device("statevector", wires=n)
    body = random_body(n, 3, 4, 7, measure)
    plain, static = qd.qnode(dev)(body), qd.jit(qd.qnode(dev)(body))
    x, w = _inputs(4, 3, 4, 1)
    for _ in range(2):
        o1, gx1, gw1 = _grads(plain, x, w)
        o2, gx2, gw2 = _grads(static, x, w)
        torch.testing.assert_close(o2, o1)
        torch.testing.assert_close(gx2, gx1)
        torch.testing.assert_close(gw2, gw1)
    out1, out2 = plain(x, w), static(x, w)
    assert type(out1) is type(out2)
    if not isinstance(out1, torch.Tensor):
        assert [o.shape for o in out1] == [o.shape for o in out2]


def test_gradients_match_finite_differences():
    n = 3
    dev = qd.device("statevector", wires=n)
    f = qd.qnode(dev, static=True)(random_body(n, 3, 4, 3))
    x, w = _inputs(2, 3, 4, 5)
    f(x, w)  # trace
    xd, wd = x.detach(), w.detach()
    assert torch.autograd.gradcheck(lambda a, b: torch.stack(f(a, b), -1) if isinstance(
        f(a, b), list) else f(a, b), (xd.clone().requires_grad_(), wd.clone().requires_grad_()))


def _hybrid(static, n=4, seed=0):
    dev = qd.device("statevector", wires=n)

    @qd.qnode(dev, static=static)
    def circuit(inputs, weights):
        qd.AngleEmbedding(inputs, wires=range(n))
        qd.StronglyEntanglingLayers(weights, wires=range(n))
        return [qd.expval(qd.Z(i)) for i in range(n)]
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, n, dtype=torch.float64),
                               qd.QuantumLayer(circuit, {"weights": (3, n, 3)}),
                               torch.nn.Linear(n, 2, dtype=torch.float64))


def test_hybrid_model_trains_identically():
    """The usual hybrid shape (classical layers on both sides, so the embedding angles
    require grad): several Adam steps, static and plain, stay equal."""
    a, b = _hybrid(False), _hybrid(True)
    x = torch.rand(32, 16, dtype=torch.float64)
    y = torch.randint(0, 2, (32,))
    opts = [torch.optim.Adam(m.parameters(), lr=0.05) for m in (a, b)]
    for _ in range(4):
        for m, opt in zip((a, b), opts):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
        for pa, pb in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(pb, pa, atol=1e-9, rtol=1e-9)  # Adam divides by sqrt(v)


def test_native_fast_path_is_used_and_matches_the_generic_job():
    if not qd.native_status().available:
        pytest.skip("native kernels not built")
    b = _hybrid(True)
    x = torch.rand(8, 16, dtype=torch.float64)
    b(x).sum().backward()
    static = b[1].qnode
    (trace,) = static._traces.values()
    prep = trace.prepared
    assert isinstance(prep, NativePrepared)
    generic = Prepared(prep.backend, prep.job)
    theta = torch.rand(prep.batch, prep.job.theta.shape[1], dtype=torch.float64) * 6
    r1, r2 = prep.execute(theta, keep=True), generic.execute(theta, keep=True)
    torch.testing.assert_close(r1.outputs, r2.outputs)
    g = torch.randn(prep.batch, r1.outputs.shape[1], dtype=torch.float64)
    v1, v2 = prep.vjp(theta, g, r1.residual), generic.vjp(theta, g, r2.residual)
    if prep.shared is not None:  # shared columns: only the column sums are defined
        sh = torch.tensor(prep.shared)
        torch.testing.assert_close(v1[:, sh].sum(0), v2[:, sh].sum(0))
        v1, v2 = v1[:, ~sh], v2[:, ~sh]
    torch.testing.assert_close(v1, v2)


def test_second_derivatives_follow_the_plain_qnode():
    dev = qd.device("statevector", wires=2)

    def body(x, w):
        qd.RX(x[..., 0], wires=0); qd.RY(w[0], wires=1); qd.CNOT(wires=[0, 1])
        qd.RZ(2 * w[1], wires=1)
        return qd.expval(qd.Z(1) @ qd.X(0))
    for method in ("best", "parameter-shift"):
        plain, static = qd.qnode(dev, diff_method=method)(body), \
            qd.qnode(dev, diff_method=method, static=True)(body)
        x = torch.tensor([0.3], dtype=torch.float64, requires_grad=True)
        w = torch.tensor([0.5, -0.2], dtype=torch.float64, requires_grad=True)
        hs = []
        for f in (plain, static):
            f(x, w)
            (gw,) = torch.autograd.grad(f(x, w), w, create_graph=True)
            hs.append(torch.stack([torch.autograd.grad(gw[i], w, retain_graph=True)[0]
                                   for i in range(2)]))
        torch.testing.assert_close(hs[1], hs[0])
        # inputs that need no gradient, weights that do
        xc = x.detach()
        gs = [torch.autograd.grad(f(xc, w), w, create_graph=True)[0] for f in (plain, static)]
        hs = [torch.autograd.grad(g[1], w)[0] for g in gs]
        torch.testing.assert_close(hs[1], hs[0])
    static = qd.qnode(dev, diff_method="adjoint", static=True)(body)
    (gw,) = torch.autograd.grad(static(x, w), w, create_graph=True)
    with pytest.raises(qd.QdiffError, match="second derivatives"):
        torch.autograd.grad(gw[0], w)


def test_no_grad_and_inputs_without_grad():
    f = _hybrid(True)[1]
    x = torch.rand(5, 4, dtype=torch.float64)
    g = _hybrid(False)[1]
    g.load_state_dict(f.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(f(x), g(x))
    torch.testing.assert_close(f(x), g(x))


@pytest.mark.parametrize("method", ["best", "adjoint", "parameter-shift", "backprop"])
def test_first_call_under_no_grad_then_training(method):
    """A signature first recorded under ``torch.no_grad()`` (an initial loss, a validation
    pass) still differentiates every trainable angle when called later with grad on."""
    dev = qd.device("statevector", wires=2)

    def circuit(inputs, w):
        qd.AngleEmbedding(inputs, wires=range(2))
        qd.BasicEntanglerLayers(w, wires=range(2))
        return [qd.expval(qd.Z(i)) for i in range(2)]
    torch.manual_seed(1)
    static = qd.QuantumLayer(qd.qnode(dev, static=True, diff_method=method)(circuit),
                             {"w": (2, 2)})
    plain = qd.QuantumLayer(qd.qnode(dev, diff_method=method)(circuit), {"w": (2, 2)})
    plain.load_state_dict(static.state_dict())
    x = torch.rand(8, 2, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(static(x), plain(x))
    for layer in (static, plain):
        layer(x).pow(2).mean().backward()
    assert static.w.grad.abs().sum() > 0
    torch.testing.assert_close(static.w.grad, plain.w.grad)
    # inputs that require grad, first seen under no_grad
    xs = x.clone().requires_grad_()
    with torch.no_grad():
        static(xs)
    (gs,) = torch.autograd.grad(static(xs).sum(), xs)
    xp = x.clone().requires_grad_()
    (gp,) = torch.autograd.grad(plain(xp).sum(), xp)
    torch.testing.assert_close(gs, gp)


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("method", ["best", "adjoint", "parameter-shift", "backprop"])
def test_first_call_inside_torch_utils_checkpoint(method, reentrant):
    """A signature first recorded inside ``torch.utils.checkpoint`` (whose recomputation in
    the backward replays it) gives the plain qnode's gradients."""
    from torch.utils.checkpoint import checkpoint
    dev = qd.device("statevector", wires=2)

    def circuit(inputs, w):
        qd.AngleEmbedding(inputs, wires=range(2))
        qd.BasicEntanglerLayers(w, wires=range(2))
        return [qd.expval(qd.Z(i)) for i in range(2)]
    torch.manual_seed(1)
    static = qd.QuantumLayer(qd.qnode(dev, static=True, diff_method=method)(circuit),
                             {"w": (2, 2)}, dtype=torch.float64)
    plain = qd.QuantumLayer(qd.qnode(dev, diff_method=method)(circuit), {"w": (2, 2)},
                            dtype=torch.float64)
    plain.load_state_dict(static.state_dict())
    x = torch.rand(5, 2, dtype=torch.float64)
    xs, xp = x.clone().requires_grad_(), x.clone().requires_grad_()
    checkpoint(static, xs, use_reentrant=reentrant).pow(2).sum().backward()
    plain(xp).pow(2).sum().backward()
    torch.testing.assert_close(static.w.grad, plain.w.grad)
    torch.testing.assert_close(xs.grad, xp.grad)


@pytest.mark.parametrize("method", ["best", "backprop", "adjoint", "parameter-shift"])
def test_torch_func_transforms_run_the_plain_qnode(method):
    """torch.func.grad / vmap / jacrev of a static qnode give the plain qnode's values
    (closed forms: <Z> = cos(a) cos(b) after RX(a) RY(b)) and record no trace."""
    from torch.func import grad, jacrev, vmap
    dev = qd.device("statevector", wires=1)

    def body(x, w):
        qd.RX(x, wires=0); qd.RY(w, wires=0)
        return qd.expval(qd.Z(0))
    f = qd.qnode(dev, diff_method=method, static=True)(body)
    x = torch.tensor(0.3, dtype=torch.float64)
    w = torch.tensor(-0.7, dtype=torch.float64)
    f(x, w)  # a trace of this signature exists: the transforms must not replay it
    assert f.num_traces == 1
    g = grad(f, argnums=(0, 1))(x, w)
    torch.testing.assert_close(torch.stack(g), torch.stack([-torch.sin(x) * torch.cos(w),
                                                            -torch.cos(x) * torch.sin(w)]))
    xs = torch.tensor([0.1, 0.5, -1.2], dtype=torch.float64)
    torch.testing.assert_close(vmap(f, in_dims=(0, None))(xs, w), torch.cos(xs) * torch.cos(w))
    torch.testing.assert_close(vmap(grad(f), in_dims=(0, None))(xs, w),
                               -torch.sin(xs) * torch.cos(w))
    torch.testing.assert_close(jacrev(f)(xs, w), torch.diag(-torch.sin(xs) * torch.cos(w)))
    assert f.num_traces == 1
    torch.testing.assert_close(f(x, w), torch.cos(x) * torch.cos(w))


@pytest.mark.parametrize("method", ["best", "backprop", "adjoint", "parameter-shift"])
def test_an_empty_batch_replays_empty_outputs(method):
    """A signature with an empty batch: empty outputs of the plain qnode's shapes on every
    call (keyword arguments included), an empty input gradient and a zero weight gradient."""
    dev = qd.device("statevector", wires=2)

    def body(x, w, scale=1.0):
        qd.AngleEmbedding(scale * x, wires=range(2))
        qd.StronglyEntanglingLayers(w, wires=range(2))
        return qd.expval(qd.Z(0)), qd.probs(wires=[1])
    plain = qd.qnode(dev, diff_method=method)(body)
    static = qd.qnode(dev, diff_method=method, static=True)(body)
    w = torch.rand(1, 2, 3, dtype=torch.float64, requires_grad=True)
    for call in range(2):
        x = torch.rand(0, 2, dtype=torch.float64, requires_grad=True)
        outs = static(x, w=w, scale=2.0)
        ref = plain(x, w=w, scale=2.0)
        assert [o.shape for o in outs] == [o.shape for o in ref] == [(0,), (0, 2)]
        gx, gw = torch.autograd.grad(outs[0].sum() + outs[1].sum(), (x, w))
        assert gx.shape == (0, 2) and torch.equal(gw, torch.zeros_like(w))
    assert static.num_traces == 1
    x = torch.rand(3, 2, dtype=torch.float64)  # a non-empty batch still replays exactly
    torch.testing.assert_close(torch.cat(static(x, w)[1:]), torch.cat(plain(x, w)[1:]))


def test_retrace_on_new_signature():
    dev = qd.device("statevector", wires=2)
    calls = []

    @qd.qnode(dev, static=True)
    def f(x, w, layers):
        calls.append(1)
        for _ in range(layers):
            qd.RX(x[..., 0], wires=0); qd.CRY(w, wires=[0, 1])
        return qd.expval(qd.Z(1))
    plain = qd.QNode(f.func, dev)
    w = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
    x = torch.rand(3, 1, dtype=torch.float64)
    f(x, w, 1)
    n0 = len(calls)
    f(x * 2, w, 1)
    assert len(calls) == n0 and f.num_traces == 1  # replayed, the function did not run
    for args in ((torch.rand(5, 1, dtype=torch.float64), w, 1),  # batch size
                 (x, w, 2),  # a non-tensor argument
                 (x.clone().requires_grad_(), w, 1),  # requires_grad
                 (x.float(), w, 1)):  # dtype
        before = f.num_traces
        torch.testing.assert_close(f(*args), plain(*args))
        assert f.num_traces == before + 1
    f.retrace()
    assert f.num_traces == 0


def test_retrace_picks_up_outside_state():
    dev = qd.device("statevector", wires=1)
    cfg = {"gate": qd.RX}

    @qd.qnode(dev, static=True)
    def f(x):
        cfg["gate"](x, wires=0)
        return qd.expval(qd.Z(0))
    x = torch.tensor(0.7, dtype=torch.float64)
    torch.testing.assert_close(f(x), torch.cos(x))
    cfg["gate"] = qd.RZ
    f.retrace()
    torch.testing.assert_close(f(x), torch.tensor(1.0, dtype=torch.float64))


def test_value_dependent_control_flow_is_refused():
    dev = qd.device("statevector", wires=1)

    @qd.qnode(dev, static=True)
    def branch(x):
        if x > 0:
            qd.RX(x, wires=0)
        return qd.expval(qd.Z(0))

    @qd.qnode(dev, static=True)
    def as_float(x):
        qd.RX(float(x), wires=0)
        return qd.expval(qd.Z(0))

    @qd.qnode(dev, static=True)
    def as_int(x):
        for _ in range(int(x.sum())):
            qd.RX(0.1, wires=0)
        return qd.expval(qd.Z(0))
    for f in (branch, as_float, as_int):
        with pytest.raises(qd.QdiffError, match="reads an argument's value"):
            f(torch.tensor(0.5, dtype=torch.float64))
    # the plain qnode runs them
    assert qd.QNode(branch.func, dev)(torch.tensor(0.5, dtype=torch.float64)) < 1


def test_non_affine_angles_are_refused():
    dev = qd.device("statevector", wires=1)
    for angle in (lambda x: torch.sin(x[0]), lambda x: x[0] * x[1], lambda x: x[0] + x[1],
                  lambda x: x[0] ** 2):
        f = qd.qnode(dev, static=True)(lambda x, a=angle: (qd.RX(a(x), wires=0),
                                                             qd.expval(qd.Z(0)))[1])
        with pytest.raises(qd.QdiffError, match="not an argument element"):
            f(torch.tensor([0.2, 0.3], dtype=torch.float64))
    # affine ones replay
    g = qd.qnode(dev, static=True)(lambda x: (qd.RX(math.pi * x[1] - 0.5, wires=0),
                                              qd.expval(qd.Z(0)))[1])
    x = torch.tensor([0.2, 0.3], dtype=torch.float64)
    torch.testing.assert_close(g(x), torch.cos(math.pi * x[1] - 0.5))
    torch.testing.assert_close(g(x + 1), torch.cos(math.pi * (x[1] + 1) - 0.5))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name,angle,first", [
    ("relu", torch.relu, 0.5), ("abs", torch.abs, 0.5), ("square", lambda x: x ** 2, 0.0),
    ("sin", torch.sin, 0.0), ("clamp", lambda x: torch.clamp(x, -3.0, 3.0), 0.5),
    ("remainder", lambda x: torch.remainder(x, 2 * math.pi), 0.5),
    ("floor", torch.floor, 1.0), ("cube", lambda x: x ** 3, 1.0)])
@pytest.mark.parametrize("shape", [(), (3,)])
def test_angles_affine_only_at_the_first_values_are_refused(name, angle, first, shape, dtype):
    """Functions that agree with a line on zeros, ones and positive integers (and at the first
    call's values) are still refused: the probes include negative, large and fractional
    values."""
    dev = qd.device("statevector", wires=1)
    f = qd.qnode(dev, static=True)(lambda x: (qd.RX(angle(x), wires=0), qd.expval(qd.Z(0)))[1])
    with pytest.raises(qd.QdiffError, match="not an argument element"):
        f(torch.full(shape, first, dtype=dtype, requires_grad=True))


def test_scaled_float32_arguments_beside_float64_ones_replay():
    """Affine angles of float32 arguments in a float64 circuit carry float32 rounding in the
    probes: they are accepted and replay exactly as the plain qnode runs them."""
    dev = qd.device("statevector", wires=2)

    def body(x, w):
        qd.RX(math.pi * w[0] - 0.3, wires=0)
        qd.RY(x[..., 1] * 1.7, wires=1)
        qd.CNOT(wires=[0, 1])
        qd.RZ(-2.9 * w[1], wires=1)
        return [qd.expval(qd.Z(0)), qd.expval(qd.Z(1))]
    f, g = qd.qnode(dev, static=True)(body), qd.qnode(dev)(body)
    x = torch.rand(5, 2, dtype=torch.float64)
    w = torch.rand(2, dtype=torch.float32, requires_grad=True)
    for scale in (1.0, -3.0):
        got, want = f(x * scale, w * scale), g(x * scale, w * scale)
        torch.testing.assert_close(torch.stack(list(got), -1).to(torch.float64),
                                   torch.stack(list(want), -1).to(torch.float64))
    assert f.num_traces == 1


def test_other_refusals():
    dev = qd.device("statevector", wires=1)
    f = qd.qnode(dev, static=True)(lambda x: (qd.RX(x, wires=0), qd.sample(qd.Z(0)))[1])
    with pytest.raises(qd.QdiffError, match="sample"):
        f(torch.tensor(0.2, dtype=torch.float64))
    g = qd.qnode(dev, static=True)(lambda x: (qd.RX(0.1, wires=0), qd.expval(qd.Z(0)))[1])
    with pytest.raises(qd.QdiffError, match="complex128 and requires grad"):
        g(torch.ones(2, dtype=torch.complex128, requires_grad=True))
    with pytest.raises(qd.QdiffError, match="hashable"):
        g(bytearray(b"x"))
    with pytest.raises(qd.QdiffError, match="qd.jit takes a qnode"):
        qd.jit(lambda x: x)
    from qiskit import QuantumCircuit
    from qiskit.circuit import Parameter
    qc = QuantumCircuit(1)
    qc.rx(Parameter("a"), 0)
    with pytest.raises(qd.QdiffError, match="records nothing per call"):
        qd.jit(qd.qnode(dev)(qc))
    with pytest.raises(qd.QdiffError, match="static must be"):
        qd.qnode(dev, static="yes")
    nan = qd.qnode(dev, static=True)(lambda x: (qd.RX(x, wires=0), qd.expval(qd.Z(0)))[1])
    nan(torch.tensor(0.1, dtype=torch.float64))
    with pytest.raises(qd.QdiffError, match="NaN"):
        nan(torch.tensor(float("nan"), dtype=torch.float64))


def _embedding_body(n, kind):
    def body(inputs, weights):
        if kind == "h+rz":  # two gates per wire: the kernels write the product state
            for i in range(n):
                qd.Hadamard(wires=i)
                qd.RZ(inputs[..., i], wires=i)
        else:
            qd.AngleEmbedding(inputs, wires=range(n), rotation=kind)
        qd.StronglyEntanglingLayers(weights, wires=range(n))
        return [qd.expval(qd.Z(i)) for i in range(n)] + [qd.expval(qd.Z(0) @ qd.Z(n - 1))]
    return body


@pytest.mark.parametrize("kind", ["X", "Y", "Z", "h+rz"])
@pytest.mark.parametrize("inputs_grad", [True, False])
def test_embedding_then_shared_unitary_path(kind, inputs_grad):
    """Batches much larger than 2**n take the embedding-then-shared-unitary path (V once,
    matmuls over the batch, one sweep over V for the weights, a product-state gradient per
    binding): outputs and gradients equal the plain qnode's."""
    if not qd.native_status().available:
        pytest.skip("native kernels not built")
    n = 3
    dev = qd.device("statevector", wires=n)
    body = _embedding_body(n, kind)
    plain, static = qd.qnode(dev)(body), qd.qnode(dev, static=True)(body)
    g = torch.Generator().manual_seed(3)
    w = (torch.rand(2, n, 3, generator=g, dtype=torch.float64) * 6).requires_grad_()
    for rep in range(2):
        x = (torch.rand(70, n, generator=g, dtype=torch.float64) * 6).requires_grad_(inputs_grad)
        args = [x, w] if inputs_grad else [w]
        o1, o2 = plain(x, w), static(x, w)
        torch.testing.assert_close(o2, o1)
        ct = torch.randn(o1.shape, generator=g, dtype=torch.float64)
        for a, b in zip(torch.autograd.grad(o1, args, ct), torch.autograd.grad(o2, args, ct)):
            torch.testing.assert_close(b, a)
    (trace,) = static._traces.values()
    prep = trace.prepared
    assert isinstance(prep, NativePrepared) and prep.dense is not None
    # the replay itself runs the lane kernels (trace.bound); the prepared job's own dense path
    # stays available to Backend.prepare callers: against the generic job
    generic = Prepared(prep.backend, prep.job)
    theta = trace.theta([x, w]).detach()
    r1, r2 = prep.execute(theta, keep=True), generic.execute(theta, keep=True)
    torch.testing.assert_close(r1.outputs, r2.outputs)
    ct = torch.randn(r1.outputs.shape, generator=g, dtype=torch.float64)
    v1, v2 = prep.vjp(theta, ct, r1.residual), generic.vjp(theta, ct, r2.residual)
    sh = torch.tensor(prep.shared)
    torch.testing.assert_close(v1[:, sh].sum(0), v2[:, sh].sum(0))
    torch.testing.assert_close(v1[:, ~sh], v2[:, ~sh])


def test_constant_angles_and_no_tensor_arguments():
    dev = qd.device("statevector", wires=2)

    def body(a, x=None):
        qd.RY(a, wires=0)  # a Python float: part of the signature
        if x is not None:
            qd.RX(x, wires=1)
            qd.RZ(torch.tensor(0.3, dtype=torch.float64), wires=1)  # a tensor constant
        return [qd.expval(qd.Z(0)), qd.expval(qd.Y(1))]
    plain, static = qd.qnode(dev)(body), qd.qnode(dev, static=True)(body)
    torch.testing.assert_close(static(0.4), plain(0.4))
    torch.testing.assert_close(static(0.7), plain(0.7))
    assert static.num_traces == 2
    x = torch.tensor([0.1, 0.5], dtype=torch.float64, requires_grad=True)
    for k in (1.0, 2.0):
        torch.testing.assert_close(static(0.4, x * k), plain(0.4, x * k))
        (g1,) = torch.autograd.grad(plain(0.4, x * k).sum(), x)
        (g2,) = torch.autograd.grad(static(0.4, x * k).sum(), x)
        torch.testing.assert_close(g2, g1)


def test_static_qnode_honours_qnode_and_per_call_shots():
    dev = qd.device("statevector", wires=1, seed=5)

    @qd.qnode(dev, shots=50, static=True)
    def f(x):
        qd.RX(x, wires=0)
        return qd.expval(qd.Z(0))

    x = torch.tensor(0.7, dtype=torch.float64)
    sampled = float(f(x))
    assert sampled != pytest.approx(math.cos(0.7), abs=1e-9)  # 50 shots: a multiple of 1/25
    assert round(sampled * 25) == pytest.approx(sampled * 25, abs=1e-9)
    assert float(f(x, shots=None)) == pytest.approx(math.cos(0.7), abs=1e-12)


@pytest.mark.parametrize("name,angle", [
    ("clamp", lambda x: torch.clamp(x[0], max=5.0)),
    ("where", lambda x: torch.where(x[0] > 50, torch.zeros(()), x[0])),
    ("maximum", lambda x: torch.maximum(x[0], torch.tensor(-100.0))),
    ("masked", lambda x: x[0].masked_fill(x[0] > 20, 0.0)),
    ("clamp_", lambda x: x.clone().clamp_(max=9.0)[0]),
    ("divisor", lambda x: 1.0 / (x[0] + 100.0))])
def test_angles_from_non_affine_ops_are_refused_whatever_the_probe_values(name, angle):
    """An angle that a piecewise op computes agrees with a line on every probe value when its
    breakpoints lie outside them; it is refused by the op, not by the values."""
    dev = qd.device("statevector", wires=1)
    body = lambda x: (qd.RX(angle(x), wires=0), qd.expval(qd.Z(0)))[1]  # noqa: E731
    f = qd.qnode(dev, static=True)(body)
    x = torch.tensor([0.3], dtype=torch.float64)
    with pytest.raises(qd.QdiffError, match="not an argument element"):
        f(x)
    qd.qnode(dev)(body)(x)  # the plain qnode runs it


def test_argument_values_written_into_other_tensors_stay_guarded():
    """Copying an argument's values into a tensor made inside the function carries the guard:
    branching on that tensor is a value read."""
    dev = qd.device("statevector", wires=1)

    def by_setitem(x):
        a = torch.zeros(2, dtype=torch.float64)
        a[0] = x[0]
        if a[0] > 10:
            qd.PauliX(0)
        qd.RX(x[1], wires=0)
        return qd.expval(qd.Z(0))

    def by_copy(x):
        a = torch.zeros(2, dtype=torch.float64)
        a.copy_(x)
        if a[0] > 10:
            qd.PauliX(0)
        qd.RX(x[1], wires=0)
        return qd.expval(qd.Z(0))
    def by_contains(x):
        if 20.0 in x:
            qd.PauliX(0)
        qd.RX(x[1], wires=0)
        return qd.expval(qd.Z(0))

    def by_apply(x):
        seen = []
        x.clone().apply_(lambda v: seen.append(v) or v)
        if any(v > 10 for v in seen):
            qd.PauliX(0)
        qd.RX(x[1], wires=0)
        return qd.expval(qd.Z(0))
    for body in (by_setitem, by_copy, by_contains, by_apply):
        f = qd.qnode(dev, static=True)(body)
        with pytest.raises(qd.QdiffError, match="reads an argument's value"):
            f(torch.tensor([0.3, 0.2], dtype=torch.float64))
        # the plain qnode flips the state for large values: a replay could not
        plain = qd.qnode(dev)(body)
        assert float(plain(torch.tensor([20.0, 0.2], dtype=torch.float64))) < 0


def test_affine_ops_through_new_tensors_replay():
    dev = qd.device("statevector", wires=2)

    def body(x, w):
        a = w.new_zeros(3)
        a[:2] = w[:2]
        b = w.clone()
        b.mul_(2).add_(1)
        m = torch.tensor([[0.0, 2.0], [1.0, 0.0]], dtype=torch.float64)
        qd.RX(a[1] * 0.5 - 0.2, wires=0)
        qd.RX(x[..., 1], wires=1)
        qd.RY(b[2], wires=1)
        qd.RZ((m @ w[:2])[0] / 4, wires=0)
        keep = torch.tensor([True, False, True])
        qd.RY(torch.deg2rad(torch.where(keep, w, 0.5)[2] * 30), wires=0)
        qd.RX(w.masked_fill(~keep, 0.0)[1], wires=1)
        qd.CNOT(wires=[0, 1])
        return [qd.expval(qd.Z(0)), qd.expval(qd.X(1) @ qd.Y(0))]
    plain, static = qd.qnode(dev)(body), qd.qnode(dev, static=True)(body)
    w = torch.tensor([0.3, -0.4, 0.8], dtype=torch.float64, requires_grad=True)
    for k in (1.0, -2.5):
        x = torch.tensor([[0.1, 0.2], [0.7, -1.1]], dtype=torch.float64) * k
        o1, o2 = plain(x, w * k), static(x, w * k)
        torch.testing.assert_close(o2, o1)
        g1 = torch.autograd.grad((o1 * torch.tensor([1.0, -0.7])).sum(), w)
        g2 = torch.autograd.grad((o2 * torch.tensor([1.0, -0.7])).sum(), w)
        torch.testing.assert_close(g2, g1)
    assert static.num_traces == 1


def test_in_place_change_of_an_argument_is_refused_and_leaves_it_unchanged():
    dev = qd.device("statevector", wires=1)

    def body(x):
        x.mul_(2)
        qd.RX(x[0], wires=0)
        return qd.expval(qd.Z(0))

    def view(x):
        x[0].add_(1)
        qd.RX(x[0], wires=0)
        return qd.expval(qd.Z(0))
    for b in (body, view):
        f = qd.qnode(dev, static=True)(b)
        x = torch.tensor([0.3], dtype=torch.float64)
        with pytest.raises(qd.QdiffError, match="modifies an argument in place"):
            f(x)
        assert float(x[0]) == 0.3
    buffer = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))

    def into_parameter(x):
        with torch.no_grad():
            buffer.copy_(x)
        qd.RX(x[0], wires=0)
        return qd.expval(qd.Z(0))
    with pytest.raises(qd.QdiffError, match="writes an argument's values into a Parameter"):
        qd.qnode(dev, static=True)(into_parameter)(torch.tensor([0.3], dtype=torch.float64))
    assert type(buffer) is torch.nn.Parameter


def test_tensors_inside_list_tuple_and_dict_arguments_are_arguments():
    """Float tensors inside lists, tuples (named too) and dicts are bound on every call like
    top-level ones (an in-place update of a held tensor is seen, gradients reach them); the
    other items are part of the signature."""
    from collections import namedtuple
    Pair = namedtuple("Pair", "a b")
    dev = qd.device("statevector", wires=2)

    def body(xs, scales, cfg, pair):
        qd.RX(xs[0][..., 0] * scales[0], wires=0)
        qd.RY(xs[1][1] + scales[1], wires=1)
        qd.CNOT(wires=[0, 1])
        qd.RZ(cfg["w"][0], wires=cfg["wire"])
        qd.RX(pair.a, wires=1)
        qd.RY(2 * pair.b[0], wires=0)
        return [qd.expval(qd.Y(0)), qd.expval(qd.Z(1) @ qd.X(0))]
    plain, static = qd.qnode(dev)(body), qd.qnode(dev, static=True)(body)
    x = torch.tensor([[0.2], [0.9]], dtype=torch.float64)
    y = torch.tensor([0.1, -0.6], dtype=torch.float64)
    w = torch.tensor([0.4], dtype=torch.float64, requires_grad=True)
    pa = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    pb = torch.tensor([0.3], dtype=torch.float64)
    xs = (x, y)
    for step in range(3):
        for scales, wire in (([1.0, 0.5], 0), ([2.0, -0.5], 1)):
            args = (xs, scales, {"w": w, "wire": wire}, Pair(pa, pb))
            o1, o2 = plain(*args), static(*args)
            torch.testing.assert_close(o2, o1)
            g1 = torch.autograd.grad(o1.sum(), [w, pa])
            g2 = torch.autograd.grad(o2.sum(), [w, pa])
            torch.testing.assert_close(g2, g1)
        with torch.no_grad():  # in-place updates of the held tensors
            y.add_(0.3)
            w.mul_(-1.5)
            pa.sub_(0.2)
    assert static.num_traces == 2


def test_angles_from_a_tensor_outside_the_arguments():
    """A tensor constant without arguments replays; one that requires grad (a closure, an
    attribute) is refused: a replay would keep its value and give it no gradient."""
    dev = qd.device("statevector", wires=1)
    f = qd.qnode(dev, static=True)(
        lambda: (qd.RX(torch.tensor(0.3, dtype=torch.float64), wires=0), qd.expval(qd.Z(0)))[1])
    torch.testing.assert_close(f(), torch.cos(torch.tensor(0.3, dtype=torch.float64)))
    w = torch.tensor([0.5], dtype=torch.float64, requires_grad=True)
    g = qd.qnode(dev, static=True)(
        lambda x: (qd.RX(x[0] + w[0], wires=0), qd.expval(qd.Z(0)))[1])
    with pytest.raises(qd.QdiffError, match="RX.*requires grad and is not an argument"):
        g(torch.tensor([0.3], dtype=torch.float64, requires_grad=True))


def test_pennylane_templates_inside_a_static_qnode_match_default_qubit():
    """PennyLane templates that run ``qml.math`` on the (guarded) arguments record and replay
    as in the plain qnode; values and gradients equal default.qubit's."""
    qml = pytest.importorskip("pennylane")
    n = 3

    def body(x, w):
        qml.AngleEmbedding(x, wires=range(n), rotation="Y")
        qml.StronglyEntanglingLayers(w, wires=range(n))
        return [qml.expval(qml.PauliZ(i)) for i in range(n)]
    static = qd.qnode(qd.device("statevector", wires=n), static=True)(body)
    ref = qml.QNode(body, qml.device("default.qubit", wires=n), interface="torch")
    g = torch.Generator().manual_seed(2)
    w = torch.rand(2, n, 3, generator=g, dtype=torch.float64, requires_grad=True)
    for _ in range(2):
        x = torch.rand(4, n, generator=g, dtype=torch.float64)  # a batch: qml.math.transpose
        got, want = static(x, w), torch.stack(list(ref(x, w)), -1)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(torch.autograd.grad(got.sum(), w)[0],
                                   torch.autograd.grad(want.sum(), w)[0])
    assert static.num_traces == 1


def test_other_tensors_and_numpy_arrays_are_keyed_by_value():
    """Integer and complex tensors and NumPy arrays are part of the signature by value (a
    unitary, basis-state bits, NumPy angles): a new value records again."""
    np = pytest.importorskip("numpy")
    dev = qd.device("statevector", wires=2)

    def body(x, bits, u, a):
        for i in range(2):
            if bits[i]:
                qd.PauliX(wires=i)
        qd.RX(x[0], wires=0)
        qd.QubitUnitary(u, wires=1)
        qd.RY(a[0], wires=1)
        return [qd.expval(qd.Z(0)), qd.expval(qd.Z(1))]
    plain, static = qd.qnode(dev)(body), qd.qnode(dev, static=True)(body)
    x = torch.tensor([0.4], dtype=torch.float64, requires_grad=True)
    h = torch.tensor([[1, 1], [1, -1]], dtype=torch.complex128) / 2 ** 0.5
    s = torch.tensor([[1, 0], [0, 1j]], dtype=torch.complex128)
    for bits, u, a in ((torch.tensor([0, 1]), h, np.array([0.3])),
                       (torch.tensor([1, 1]), h, np.array([0.3])),
                       (torch.tensor([1, 1]), s, np.array([0.3])),
                       (torch.tensor([1, 1]), s, np.array([1.1]))):
        o1, o2 = plain(x, bits, u, a), static(x, bits, u, a)
        torch.testing.assert_close(o2, o1)
        torch.testing.assert_close(torch.autograd.grad(o2[0], x), torch.autograd.grad(o1[0], x))
    assert static.num_traces == 4


@pytest.mark.parametrize("device_dtype,arg_dtype", [(torch.complex128, torch.float32),
                                                    (torch.complex64, torch.float64)])
@pytest.mark.parametrize("method", ["backprop", "best"])
def test_output_dtype_follows_the_plain_qnode(device_dtype, arg_dtype, method):
    """Outputs have the angles' dtype on every rule (float32 arguments on a complex128 device,
    float64 ones on a complex64 device), as the plain qnode's."""
    dev = qd.device("statevector", wires=2, dtype=device_dtype)

    def body(x, w):
        qd.RX(x[..., 0], wires=0)
        qd.RY(3 * w[0], wires=1)
        qd.CNOT(wires=[0, 1])
        return [qd.expval(qd.Z(0)), qd.probs(wires=[1])]
    plain = qd.qnode(dev, diff_method=method)(body)
    static = qd.qnode(dev, diff_method=method, static=True)(body)
    x = torch.tensor([[0.3], [1.1]], dtype=arg_dtype)
    w = torch.tensor([0.2], dtype=arg_dtype, requires_grad=True)
    want, got = plain(x, w), static(x, w)
    tol = dict(atol=2e-6, rtol=2e-6)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype == arg_dtype
        torch.testing.assert_close(a, b, **tol)
    ga = torch.autograd.grad(got[0].sum() + got[1][:, 1].sum(), w)[0]
    gb = torch.autograd.grad(want[0].sum() + want[1][:, 1].sum(), w)[0]
    assert ga.dtype == gb.dtype
    torch.testing.assert_close(ga, gb, **tol)


def test_max_traces_drops_the_least_recently_used_signature():
    dev = qd.device("statevector", wires=1)
    f = qd.jit(qd.qnode(dev)(lambda x: (qd.RX(x[..., 0], wires=0), qd.expval(qd.Z(0)))[1]),
               max_traces=2)
    a, b, c = (torch.rand(k, 1, dtype=torch.float64) for k in (1, 2, 3))
    for x in (a, b, a, c):
        f(x)
    kept = {k[0][2][0][0] for k in f._traces}
    assert kept == {a.shape, c.shape}


def test_sparse_argument_runs_the_plain_qnode():
    """A sparse tensor argument has no storage to trace: the call runs as the plain qnode's
    (values and gradients), with and without a per-call shots keyword."""
    dev = qd.device("statevector", wires=1)

    def body(x, m):
        qd.RX(x * float(m.to_dense()[0, 0]), wires=0)
        return qd.expval(qd.Z(0))

    static, plain = qd.qnode(dev, static=True)(body), qd.qnode(dev)(body)
    m = (2 * torch.eye(2, dtype=torch.float64)).to_sparse()
    x = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    out = static(x, m)
    (g,) = torch.autograd.grad(out, x)
    assert torch.allclose(out, plain(x, m)) and abs(float(out) - math.cos(0.6)) < 1e-12
    assert abs(float(g) + 2 * math.sin(0.6)) < 1e-12
    assert static.num_traces == 0
    assert static(x, m, shots=None).shape == ()


def test_trace_evicted_by_another_thread_between_lookup_and_reorder_still_replays():
    """Threads share a static qnode's traces: a trace that another thread evicts right after
    this call found it is still replayed (the least-recently-used reordering skips it)."""
    from collections import OrderedDict
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev)
    def c(x, k):
        qd.RX(x[0], k % 2)
        qd.RY(x[1], 1)
        return qd.expval(qd.Z(0) @ qd.Z(1))
    f = qd.jit(c, max_traces=3)
    x = torch.tensor([0.3, 0.4], dtype=torch.float64)
    for k in range(3):  # three signatures
        f(x, k)

    class EvictedOnLookup(OrderedDict):  # another thread's eviction, just after the lookup
        def get(self, key, default=None):
            hit = super().get(key, default)
            self.pop(key, None)
            return hit
    f._traces = EvictedOnLookup(f._traces)
    torch.testing.assert_close(f(x, 0), c(x, 0), rtol=0, atol=1e-14)


def test_a_qnode_called_inside_a_static_qnode_is_refused_by_name():
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev)
    def inner(x):
        qd.RX(x, wires=0)
        return qd.expval(qd.Z(0))

    def body(x):
        qd.RY(inner(x), wires=1)
        return qd.expval(qd.Z(1))

    x = torch.tensor(0.3, dtype=torch.float64)
    with pytest.raises(qd.QdiffError, match="a qnode is called inside the function it records"):
        qd.qnode(dev, static=True)(body)(x)
    with pytest.raises(qd.QdiffError, match="a static qnode is called inside"):
        inner_static = qd.qnode(dev, static=True)(inner.func)
        qd.qnode(dev, static=True)(lambda x: (qd.RY(inner_static(x), wires=1),
                                              qd.expval(qd.Z(1)))[1])(x)
    # a plain outer qnode runs the inner one as classical processing
    plain = qd.qnode(dev)(body)(x)
    assert torch.allclose(plain, torch.cos(torch.cos(x)), atol=1e-12)


@pytest.mark.parametrize("method", ["best", "backprop", "adjoint"])
def test_mid_circuit_measurements_with_channels_on_the_mixed_device(method):
    """The deferred wires widen the device for a replay as for a plain call: values and
    gradients equal the plain qnode's on the mixed engine (channels beside the
    measurements); a noisy device refuses the measurements as a plain call does, and the
    statevector device refuses a channel by name."""
    def body(x):
        qd.RX(x[0], wires=0)
        qd.CNOT(wires=[0, 1])
        qd.DepolarizingChannel(0.2, wires=0)
        m0 = qd.measure(0, reset=True)
        m1 = qd.measure(1)
        qd.cond(~m0 & m1, qd.RY)(x[1], wires=0)
        qd.AmplitudeDamping(0.3, wires=1)
        return qd.expval(qd.Z(0) @ qd.Z(1)), qd.probs(op=[m0, m1])

    dev = qd.device("mixed", wires=2)
    plain, static = qd.qnode(dev, diff_method=method)(body), \
        qd.qnode(dev, diff_method=method, static=True)(body)
    for v in ([0.8, 0.4], [1.9, -0.7]):
        x = torch.tensor(v, dtype=torch.float64, requires_grad=True)
        got, want = static(x), plain(x)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-12, rtol=0)
        gg = torch.autograd.grad(got[0] + got[1][2], x)[0]
        gw = torch.autograd.grad(want[0] + want[1][2], x)[0]
        torch.testing.assert_close(gg, gw, atol=1e-12, rtol=0)

    def measured(x):
        qd.RX(x, wires=0)
        qd.CNOT(wires=[0, 1])
        m = qd.measure(0, reset=True)
        qd.cond(m, qd.RY)(x, wires=1)
        return qd.expval(qd.Z(1))
    noisy = qd.device("mixed", wires=2,
                      noise=qd.noise.NoiseModel().add("cx", qd.DepolarizingChannel, 0.3))
    x = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    with pytest.raises(qd.QdiffError, match="mid-circuit measurements on a noisy device"):
        qd.qnode(noisy, static=True)(measured)(x)

    def channel(x):
        qd.RX(x, wires=0)
        qd.DepolarizingChannel(0.2, wires=0)
        return qd.expval(qd.Z(0))
    with pytest.raises(qd.QdiffError, match="DepolarizingChannel.*trajectories"):
        qd.qnode(qd.device("statevector", wires=1), static=True)(channel)(x)


@pytest.mark.parametrize("method", ["best", "backprop", "parameter-shift"])
@pytest.mark.parametrize("batch", [3, 64])
def test_an_argument_no_angle_reads_gets_no_gradient(method, batch):
    """A weight the circuit never reads has no gradient (None), as with the plain qnode, so
    AdamW's weight decay skips it and a static layer trains exactly as the plain one."""
    dev = qd.device("statevector", wires=2)

    def body(inputs, a, unused):
        qd.RX(inputs[..., 0], wires=0)
        qd.RY(a, wires=1)
        return qd.expval(qd.Z(0) @ qd.Z(1))
    layers = []
    for static in (False, True):
        torch.manual_seed(0)
        q = qd.QNode(body, dev, diff_method=method)
        layers.append(qd.QuantumLayer(qd.jit(q) if static else q, {"a": 1, "unused": (2,)},
                                      dtype=torch.float64))
    x = torch.rand(batch, 2, dtype=torch.float64, requires_grad=True)
    for layer in layers:
        opt = torch.optim.AdamW(layer.parameters(), lr=0.1, weight_decay=0.5)
        for _ in range(3):
            opt.zero_grad()
            layer(x).pow(2).sum().backward()
            opt.step()
        assert layer.unused.grad is None
        gx, = torch.autograd.grad(layer(x).sum(), x, create_graph=True)
        assert torch.autograd.grad(gx.sum(), layer.unused, allow_unused=True)[0] is None
    plain, static = layers
    assert torch.equal(plain.unused, static.unused)
    assert torch.allclose(plain.a, static.a, atol=1e-12)


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("batch", [None, 2])
def test_a_nan_or_infinite_angle_in_a_replay_names_the_gate(requires_grad, batch):
    """A replay refuses a NaN or infinite angle naming the gate and wires, as a plain call does,
    whichever engine path runs it."""
    dev = qd.device("statevector", wires=2)

    def body(x):
        qd.RX(x[..., 0], wires=0)
        qd.RY(2 * x[..., 1], wires=1)
        return qd.expval(qd.Z(0))

    def bad(value):
        x = torch.tensor([0.1, value], dtype=torch.float64)
        x = x if batch is None else x.expand(batch, 2).clone()
        return x.requires_grad_(requires_grad)

    for static in (False, True):
        f = qd.qnode(dev, static=static)(body)
        f(bad(0.2))
        for value in (float("nan"), float("inf")):
            with pytest.raises(qd.QdiffError, match=r"gate .RY. on wires \[1\]: angle is NaN"):
                f(bad(value))


@pytest.mark.parametrize("total,i,j", [(8, 2, 4), (16, 6, 10), (24, 13, 15)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_sum_of_two_elements_is_refused_at_zero_first_values(total, i, j, dtype):
    """``x[i] + x[j]`` agrees with ``2 * x[(i + j) / 2]`` on every probe that is affine in the
    element's index or in a permutation of it, where those codes form an arithmetic
    progression; at the first call's zeros (an initialisation) the real binding agrees too.
    It is refused, not replayed as one element."""
    dev = qd.device("statevector", wires=1)

    def body(x):
        qd.RX(x[i] + x[j], wires=0)
        return qd.expval(qd.Z(0))
    f = qd.qnode(dev, static=True)(body)
    with pytest.raises(qd.QdiffError, match="not an argument element"):
        f(torch.zeros(total, dtype=dtype))
    x = torch.linspace(-1, 2, total, dtype=dtype)
    assert torch.allclose(qd.qnode(dev)(body)(x), torch.cos(x[i] + x[j]))


def _read_by(how):
    def body(x):
        t = how(x)
        if t[0] > 100:
            qd.PauliX(0)
        qd.RY(x[1], wires=0)
        return qd.expval(qd.X(0))
    return body


@pytest.mark.parametrize("name,how", [
    ("tensor", lambda x: torch.tensor(x)),
    ("asarray", lambda x: torch.asarray(x, copy=True)),
    ("as_tensor", lambda x: torch.as_tensor(x, dtype=torch.float32)),
    ("full", lambda x: torch.full((1,), x[0]))])
def test_values_read_by_copy_constructors_and_scalar_arguments_are_guarded(name, how):
    """``torch.tensor(x)`` and ``torch.full(size, x[0])`` read an argument's values in C++
    without dispatching to the guarded class; a threshold no probe value reaches would
    otherwise freeze the first call's branch. The copies stay guarded and a number taken from
    a tensor is a read."""
    dev = qd.device("statevector", wires=1)
    f = qd.qnode(dev, static=True)(_read_by(how))
    with pytest.raises(qd.QdiffError, match="reads an argument's value"):
        f(torch.tensor([0.5, 0.3], dtype=torch.float64))
    # the plain qnode flips the state for large values: a replay could not
    plain = qd.qnode(dev)(_read_by(how))
    assert float(plain(torch.tensor([200.0, 0.3], dtype=torch.float64))) < 0


def test_a_traced_argument_prints_its_shape_and_a_copy_of_it_replays():
    dev = qd.device("statevector", wires=1)
    seen = []

    def body(x):
        seen.append(str(x))
        qd.RX(torch.tensor(x)[1] * 2, wires=0)
        return qd.expval(qd.Z(0))
    f = qd.qnode(dev, static=True)(body)
    x = torch.tensor([0.5, 0.3], dtype=torch.float64)
    assert torch.allclose(f(x), torch.cos(2 * x[1]))
    assert "shape=(2,)" in seen[0] and "0.3" not in seen[0]
    with pytest.raises(qd.QdiffError, match="reads an argument's value"):
        qd.qnode(dev, static=True)(lambda x: (qd.RX(x[0], wires=0), f"{x[0]:.3f}",
                                              qd.expval(qd.Z(0)))[2])(x)
    assert torch.allclose(f(x + 1), torch.cos(2 * (x[1] + 1)))


@pytest.mark.parametrize("cast", [lambda x: table_at(x.to(torch.long)),
                                  lambda x: x.type(torch.int32).to(x.dtype),
                                  lambda x: x.to(torch.bool).to(x.dtype)])
def test_an_integer_cast_of_an_argument_is_not_an_affine_angle(cast):
    """A cast to an integer or bool dtype rounds: the angle is refused by the op, whatever
    the probe values give."""
    dev = qd.device("statevector", wires=1)
    f = qd.qnode(dev, static=True)(lambda x: (qd.RX(cast(x)[0], wires=0),
                                              qd.expval(qd.Z(0)))[1])
    with pytest.raises(qd.QdiffError, match="torch op that is not affine"):
        f(torch.tensor([2.0], dtype=torch.float64))


def table_at(i):
    return torch.linspace(0.0, 3.0, 40, dtype=torch.float64)[i]


def test_a_function_that_fails_on_other_values_is_refused():
    dev = qd.device("statevector", wires=1)

    def body(x):
        torch.linalg.cholesky(torch.diag(x))  # fails at zeros
        qd.RX(x[0], wires=0)
        return qd.expval(qd.Z(0))
    f = qd.qnode(dev, static=True)(body)
    with pytest.raises(qd.QdiffError, match="fails when its tensor arguments hold other"):
        f(torch.tensor([0.5, 0.3], dtype=torch.float64))


@pytest.mark.parametrize("method", ["backprop", "best", "parameter-shift", "adjoint"])
@pytest.mark.parametrize("batch", [(), (3,)])
@pytest.mark.parametrize("cut", ["detach", "data", "tensor"])
def test_angles_read_through_detach_get_no_gradient(method, batch, cut):
    """An angle read through ``.detach()``, ``.data`` or ``torch.tensor`` carries no gradient
    in the plain qnode; the replay does not give it one (backprop differentiates the gather
    itself)."""
    dev = qd.device("statevector", wires=2)
    strip = {"detach": lambda t: t.detach(), "data": lambda t: t.data,
             "tensor": lambda t: torch.tensor(t)}[cut]

    def body(x, w, u):
        qd.RX(strip(x)[..., 0], wires=0)
        qd.RY(x[..., 1] * 2, wires=1)
        qd.RY(w[0], wires=0)
        qd.RZ(strip(u)[0], wires=0)
        qd.CNOT(wires=[0, 1])
        return qd.expval(qd.Y(0) @ qd.Z(1))
    grads = []
    for static in (False, True):
        f = qd.qnode(dev, diff_method=method, static=static)(body)
        for k in range(2):  # the trace, then a replay
            x = (torch.tensor([0.4, 0.9], dtype=torch.float64) + k).expand(*batch, 2)
            x = x.clone().requires_grad_(True)
            w = torch.tensor([0.3], dtype=torch.float64, requires_grad=True)
            u = torch.tensor([0.7], dtype=torch.float64, requires_grad=True)
            out = f(x, w, u)
            g = torch.autograd.grad(out.sum(), [x, w, u], allow_unused=True)
        grads.append((out.detach(), *g))
    (o1, gx1, gw1, gu1), (o2, gx2, gw2, gu2) = grads
    torch.testing.assert_close(o2, o1)
    torch.testing.assert_close(gx2, gx1)
    torch.testing.assert_close(gw2, gw1)
    assert gx1[..., 0].abs().max() == 0 and gu1 is None and gu2 is None


@pytest.mark.parametrize("batch", [1, 8, 64])
def test_a_normalised_float32_embedding_replays(batch):
    """``(x - 128) / 255`` of float32 inputs (the torch default dtype) loses most digits of
    the slope to cancellation in the probes; it is an affine angle, accepted and replayed as
    the plain qnode runs it (to float32 precision)."""
    dev = qd.device("statevector", wires=4)

    def body(x):
        qd.AngleEmbedding((x - 128.0) / 255.0, wires=range(4))
        qd.RY(0.013 * x[..., 0] - 0.7, wires=0)
        qd.CNOT(wires=[0, 1])
        return [qd.expval(qd.Z(i)) for i in range(4)]
    f, g = qd.qnode(dev, static=True)(body), qd.qnode(dev)(body)
    gen = torch.Generator().manual_seed(batch)
    for _ in range(2):
        x = torch.rand(batch, 4, generator=gen) * 255
        torch.testing.assert_close(torch.stack(list(f(x)), -1), torch.stack(list(g(x)), -1),
                                   atol=2e-5, rtol=0)
    assert f.num_traces == 1


@pytest.mark.parametrize("method", ["best", "backprop", "adjoint", "parameter-shift"])
@pytest.mark.parametrize("batch", [(), (3,), (200,)])
def test_first_call_under_inference_mode_then_training(method, batch):
    """A signature first called under ``torch.inference_mode`` (where ``enable_grad`` records
    no graph) replays with gradients later, as one first called under ``no_grad``."""
    dev = qd.device("statevector", wires=2)

    def body(x, w):
        qd.RX(x[..., 0], wires=0)
        qd.RY(w[0], wires=1)
        qd.CNOT(wires=[0, 1])
        return qd.expval(qd.Z(1))
    f, g = (qd.qnode(dev, diff_method=method, static=s)(body) for s in (True, False))
    w = torch.tensor([0.3], dtype=torch.float64, requires_grad=True)
    with torch.inference_mode():
        x = torch.full(batch + (2,), 0.5, dtype=torch.float64)
        torch.testing.assert_close(f(x, w), g(x, w))
        torch.testing.assert_close(f(x + 1, w), g(x + 1, w))
    x = torch.full(batch + (2,), 0.7, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(f(x, w).sum(), w)[0],
                               torch.autograd.grad(g(x, w).sum(), w)[0])


@pytest.mark.parametrize("method", ["best", "adjoint", "parameter-shift"])
@pytest.mark.parametrize("batch", [(), (3,), (200,)])
def test_an_inference_mode_input_trains_weights_as_with_the_plain_qnode(method, batch):
    """Data made under ``torch.inference_mode`` (a preprocessed batch) fed with weights that
    require grad: the replay differentiates the weights as the plain qnode does."""
    dev = qd.device("statevector", wires=2)

    def body(x, w):
        qd.RX(x[..., 0], wires=0)
        qd.RY(w[0], wires=1)
        qd.CRX(w[1], wires=[0, 1])
        return qd.expval(qd.Z(1))
    f, g = (qd.qnode(dev, diff_method=method, static=s)(body) for s in (True, False))
    w = torch.tensor([0.3, 0.8], dtype=torch.float64, requires_grad=True)
    with torch.inference_mode():
        x = torch.rand(batch + (2,), dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for _ in range(2):  # recorded, then replayed
        torch.testing.assert_close(torch.autograd.grad(f(x, w).sum(), w)[0],
                                   torch.autograd.grad(g(x, w).sum(), w)[0])


def test_a_deep_copy_of_an_argument_stays_guarded_and_replays():
    """``copy.deepcopy(x)`` inside the function is a new tensor holding the values: a branch on
    it is a read, and an angle from it replays as the plain qnode runs it (a new leaf: no
    gradient reaches ``x``)."""
    import copy
    dev = qd.device("statevector", wires=1)

    def branch(x):
        if copy.deepcopy(x)[0] > 100:
            qd.PauliX(0)
        return qd.expval(qd.Z(0))

    def body(x, w):
        qd.RX(copy.deepcopy(x)[0], wires=0)
        qd.RY(w[0], wires=0)
        return qd.expval(qd.Z(0))
    with pytest.raises(qd.QdiffError, match="reads an argument's value"):
        qd.qnode(dev, static=True)(branch)(torch.tensor([0.3], dtype=torch.float64))
    f, g = (qd.qnode(dev, static=s)(body) for s in (True, False))
    for v in (0.3, 0.9):
        got = []
        for q in (f, g):
            x = torch.tensor([v], dtype=torch.float64, requires_grad=True)
            w = torch.tensor([0.2], dtype=torch.float64, requires_grad=True)
            out = q(x, w)
            got.append((out, *torch.autograd.grad(out, [x, w], allow_unused=True)))
        (o1, gx1, gw1), (o2, gx2, gw2) = got
        torch.testing.assert_close(o1, o2)
        torch.testing.assert_close(gw1, gw2)
        assert gx1 is None and gx2 is None


def _pair(f, wires=2):
    dev = qd.device("statevector", wires=wires)
    return qd.qnode(dev, static=True)(f), qd.QNode(f, dev)


def test_outside_tensor_changed_in_place_records_again():
    ang = torch.tensor([0.4, 0.1], dtype=torch.float64)
    coeffs = torch.tensor([0.5, -0.2], dtype=torch.float64)
    u = torch.eye(2, dtype=torch.complex128)

    def f(x):
        qd.RX(x[0] + ang[1], wires=0)
        qd.RY(2 * ang[0], wires=1)
        qd.RZ(float(ang[1]), wires=1)
        qd.QubitUnitary(u, wires=1)
        return qd.expval(qd.Hamiltonian(coeffs, [qd.Z(0), qd.X(1)]))
    static, plain = _pair(f)
    x = torch.tensor([0.3], dtype=torch.float64)
    torch.testing.assert_close(static(x), plain(x))
    changes = [lambda: ang.mul_(3.0),  # in place
               lambda: ang.data.add_(0.5),  # through .data (no version bump)
               lambda: u.copy_(torch.tensor([[1, 1], [1, -1]], dtype=torch.complex128) /
                               math.sqrt(2)),
               lambda: setattr(coeffs, "data", torch.tensor([1.0, 2.0], dtype=torch.float64))]
    for change in changes:
        before = static(x).detach()
        change()
        torch.testing.assert_close(static(x), plain(x))
        assert not torch.allclose(static(x), before)
    assert static.num_traces == 1


def test_outside_tensor_made_trainable_later_is_refused():
    ang = torch.tensor(0.4, dtype=torch.float64)

    def f(x):
        qd.RX(x[0], wires=0)
        qd.RY(ang, wires=0)
        return qd.expval(qd.Z(0))
    static, _ = _pair(f)
    x = torch.tensor([0.3], dtype=torch.float64)
    static(x)
    ang.requires_grad_()
    with pytest.raises(qd.QdiffError, match="requires grad and is not an argument"):
        static(x)


_LAYERS = 1
_CFG = {"flag": False, "obs": None}


def test_globals_and_closure_variables_changed_record_again():
    wires = [0, 1]
    angle = 0.3
    arr = np.array([0.2, 0.7])

    def f(x):
        for _ in range(_LAYERS):
            qd.RX(x[0], wires=wires[0])
            qd.CNOT(wires=wires)
        if _CFG["flag"]:
            qd.RY(x[0], wires=1)
        qd.RZ(angle, wires=wires[1])
        qd.RX(arr[1], wires=wires[1])
        return qd.expval(_CFG["obs"] or qd.Z(1))
    static, plain = _pair(f)
    x = torch.tensor([0.3], dtype=torch.float64)

    def set_angle():
        nonlocal angle
        angle = 1.1

    def set_layers():
        global _LAYERS
        _LAYERS = 2
    try:
        for change in (lambda: None, set_layers, lambda: _CFG.update(flag=True),
                       lambda: wires.reverse(), set_angle, lambda: arr.__setitem__(1, 1.9),
                       lambda: _CFG.update(obs=qd.X(0))):
            change()
            torch.testing.assert_close(static(x), plain(x))
    finally:
        _CFG.update(flag=False, obs=None)
        set_layers.__globals__["_LAYERS"] = 1
    assert static.num_traces == 1


def test_function_writing_a_global_does_not_record_again():
    log = []
    dev = qd.device("statevector", wires=1)

    @qd.qnode(dev, static=True)
    def f(x):
        log.append(1)
        qd.RX(x[..., 0], wires=0)
        return qd.expval(qd.Z(0))
    a = torch.rand(4, 1, dtype=torch.float64)
    b = torch.rand(3, 1, dtype=torch.float64)
    f(a), f(b)
    runs = len(log)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(10):  # alternating signatures replay, the function does not run
            torch.testing.assert_close(f(a), torch.cos(a[:, 0]))
            torch.testing.assert_close(f(b), torch.cos(b[:, 0]))
    assert len(log) == runs and f.num_traces == 2


def test_recording_again_many_times_warns_once():
    ang = torch.tensor(0.4, dtype=torch.float64)

    def f(x):
        qd.RX(x[0] + ang, wires=0)
        return qd.expval(qd.Z(0))
    static, plain = _pair(f, wires=1)
    x = torch.tensor([0.3], dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(12):
            ang.add_(0.1)
            torch.testing.assert_close(static(x), plain(x))
    msgs = [str(w.message) for w in caught if "recorded its circuit again" in str(w.message)]
    assert len(msgs) == 1 and "pass that value as an argument" in msgs[0]
