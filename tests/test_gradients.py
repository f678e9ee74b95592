"""Every diff method against every other, central finite differences and PennyLane.

200+ random circuits over every differentiable gate, several observables, batched; plus
gradcheck in float64, parameter-shift rules against autograd for every gate, Hessians against
PennyLane's param_shift_hessian, custom gates, and shot-based gradients within statistical bounds.
"""
from __future__ import annotations

import math

import numpy as np
import pennylane as qml
import pytest
import torch

import qdiff as qd
from qdiff.circuits.gates import (GATES, Gate, multirz_gate, paulirot_gate, register_gate,
                                  unregister_gate)
from qdiff.shift_rules import frequencies, rule_from_frequencies, shift_rule
from qdiff.testing import check_directional, check_vjp, compare_methods

DIFF_GATES = [g for g in GATES.values() if g.num_params > 0 and g.generators is not None]
FIXED_GATES = [GATES[k] for k in ("h", "cx", "s", "swap", "ccx", "iswap", "ecr", "cz", "sx")]
METHODS = ["backprop", "adjoint", "parameter-shift", "finite-diff"]


def _random_ops(rng, n, depth):
    pool = DIFF_GATES + FIXED_GATES + [multirz_gate(3), paulirot_gate("XY")]
    ops = []
    for _ in range(depth):
        g = pool[rng.integers(len(pool))]
        if g.num_wires > n:
            continue
        wires = [int(w) for w in rng.choice(n, g.num_wires, replace=False)]
        ops.append((g, wires))
    return ops


def _observables(mod, n):
    return [mod.expval(mod.PauliZ(0) @ mod.PauliX(n - 1)),
            mod.expval(mod.PauliY(1)),
            mod.expval(mod.Hermitian(np.array([[1.0, 0.5j], [-0.5j, -0.3]]), wires=n - 2))]


def _circuit(mod, ops, scale=1.0):
    def body(x):
        k = 0
        for g, wires in ops:
            if g.name == "paulirot":
                mod.PauliRot(scale * x[..., k], g.hyper[0], wires=wires)
            elif g.name == "multirz":
                mod.MultiRZ(scale * x[..., k], wires=wires)
            elif g.name == "isingxy" and mod is qml:
                # PennyLane's IsingXY matrix fails on broadcast torch angles that require grad
                # (it calls numpy); the same gate: IsingXY(t) = IsingXX(-t/2) IsingYY(-t/2)
                mod.IsingXX(-scale * x[..., k] / 2, wires=wires)
                mod.IsingYY(-scale * x[..., k] / 2, wires=wires)
            else:
                gate = getattr(mod, g.pl_name)
                gate(*[scale * x[..., k + i] for i in range(g.num_params)], wires=wires)
            k += g.num_params
    return body


def _num_params(ops):
    return sum(g.num_params for g, _ in ops)


@pytest.mark.parametrize("seed", range(200))
def test_methods_agree_on_random_circuit(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 5))
    ops = _random_ops(rng, n, int(rng.integers(4, 12)))
    p = _num_params(ops)
    if p == 0:
        pytest.skip("no parameters drawn")
    batch = int(rng.integers(1, 4))
    x = torch.tensor(rng.uniform(-math.pi, math.pi, (batch, p)), requires_grad=True)
    dev = qd.device("statevector", wires=n)
    body = _circuit(qd, ops, scale=1.3)

    def f(x):
        body(x)
        return _observables(qd, n)

    grads = compare_methods(qd.QNode(f, dev), [x], methods=METHODS, atol=1e-7)
    assert grads["backprop"][0].shape == x.shape
    # PennyLane reference (default.qubit, backprop: its parameter-shift refuses broadcast tapes)
    pbody = _circuit(qml, ops, scale=1.3)

    @qml.qnode(qml.device("default.qubit", wires=n), diff_method="backprop")
    def pf(x):
        pbody(x)
        return _observables(qml, n)

    xp = x.detach().clone().requires_grad_(True)
    out = pf(xp)
    total = sum(o.sum() for o in out)
    total.backward()
    assert torch.allclose(xp.grad, grads["backprop"][0], atol=1e-8)


@pytest.mark.parametrize("gate", DIFF_GATES + [multirz_gate(2), paulirot_gate("YZX")],
                         ids=lambda g: g.name)
def test_shift_rule_matches_autograd(gate):
    """f(phi) = <psi|U(phi)^dag O U(phi)|psi>: derived rule vs autograd, every parameter."""
    gen = torch.Generator().manual_seed(7)
    d = 2 ** gate.num_wires
    psi = torch.randn(d, dtype=torch.complex128, generator=gen)
    psi = psi / psi.norm()
    a = torch.randn(d, d, dtype=torch.complex128, generator=gen)
    obs = a + a.conj().T
    base = torch.rand(gate.num_params, dtype=torch.float64, generator=gen) * 2

    def f(angles):
        u = gate.matrix_fn(*angles.unbind())
        phi = u @ psi
        return (phi.conj() @ obs @ phi).real

    x = base.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(f(x), x)
    for slot in range(gate.num_params):
        est = 0.0
        for c, s in shift_rule(gate, slot):
            shifted = base.clone()
            shifted[slot] += s
            est += c * f(shifted)
        assert abs(float(est) - float(g[slot])) < 1e-10, (gate.name, slot)


def test_rules_have_documented_shapes():
    assert len(shift_rule(GATES["rx"])) == 2
    assert len(shift_rule(GATES["crx"])) == 4
    assert len(shift_rule(GATES["single_excitation"])) == 4
    assert len(shift_rule(GATES["double_excitation"])) == 4
    assert len(shift_rule(multirz_gate(4))) == 2
    # a non-equidistant spectrum still gives an exact rule for the trig polynomial
    freqs = frequencies([0.0, 1.0, 3.5])
    rule = rule_from_frequencies(freqs)
    coeffs = np.random.default_rng(0).normal(size=(2, len(freqs)))

    def f(x):
        return sum(a * np.cos(w * x) + b * np.sin(w * x) for a, b, w in zip(*coeffs, freqs))
    exact = sum(b * w for b, w in zip(coeffs[1], freqs))
    assert abs(sum(c * f(s) for c, s in rule) - exact) < 1e-10


def test_gradcheck_float64():
    dev = qd.device("statevector", wires=3)
    for method in METHODS[:3]:
        @qd.qnode(dev, diff_method=method)
        def f(x, w):
            qd.AngleEmbedding(x, wires=range(3))
            qd.StronglyEntanglingLayers(w, wires=range(3))
            return [qd.expval(qd.Z(i)) for i in range(3)] + [qd.var(qd.X(0) @ qd.Y(2))]

        x = torch.rand(2, 3, dtype=torch.float64, requires_grad=True)
        w = torch.rand(1, 3, 3, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(f, (x, w), atol=1e-7)


def test_probs_and_var_gradients_all_methods():
    dev = qd.device("statevector", wires=3)

    def f(x):
        qd.RY(x[..., 0], wires=0)
        qd.CRX(x[..., 1], wires=[0, 2])
        qd.IsingYY(x[..., 2], wires=[1, 2])
        return [qd.var(qd.Z(0) @ qd.X(2) + 0.5 * qd.Y(1)), qd.probs([2, 0])]

    x = torch.tensor([[0.3, -1.2, 0.8], [2.0, 0.1, -0.4]], dtype=torch.float64, requires_grad=True)
    compare_methods(qd.QNode(f, dev), [x], methods=METHODS, atol=1e-7)


def test_shared_parameters_and_affine_references():
    """A compiled/imported circuit may reuse a theta column with a scale and an offset."""
    from qdiff.circuits.circuit import Circuit, Recorded
    from qdiff.circuits.measurements import Measurement
    from qdiff.circuits.observables import Observable
    from qdiff.circuits.operation import Operation, ParamRef
    from qdiff.bridge import execute
    ops = (Operation(GATES["rx"], (0,), (ParamRef(0, 2.0, 0.1),)),
           Operation(GATES["cry"], (0, 1), (ParamRef(0, -1.0, 0.0),)),
           Operation(GATES["rz"], (1,), (ParamRef(1),)),
           Operation(GATES["rx"], (1,), (ParamRef(0, 0.5, -0.3),)))
    obs = Observable.pauli("Y", 1) @ Observable.pauli("Z", 0)
    circ = Circuit(2, ops, (Measurement("expval", obs),), 2)
    dev = qd.device("statevector", wires=2)
    grads = {}
    for m in METHODS:
        theta = torch.tensor([[0.7, -0.4]], dtype=torch.float64, requires_grad=True)
        out = execute(Recorded(circ, theta, (1,), (True, True)), dev, m)[0]
        (grads[m],) = torch.autograd.grad(out.sum(), theta)
    for m in METHODS[1:]:
        assert torch.allclose(grads[m], grads["backprop"], atol=1e-8), m


def test_trainable_hamiltonian_coefficients():
    dev = qd.device("statevector", wires=2)
    coeffs = torch.tensor([0.4, -1.1, 0.25], dtype=torch.float64, requires_grad=True)
    grads = {}
    for m in METHODS[:3]:
        @qd.qnode(dev, diff_method=m)
        def f(x, c):
            qd.RX(x, wires=0); qd.CNOT([0, 1]); qd.RY(0.3, wires=1)
            return qd.expval(qd.Hamiltonian(c, [qd.Z(0), qd.X(1), qd.Z(0) @ qd.Z(1)]))
        x = torch.tensor(0.9, dtype=torch.float64, requires_grad=True)
        grads[m] = torch.autograd.grad(f(x, coeffs), (x, coeffs))
    for m in METHODS[1:3]:
        for a, b in zip(grads[m], grads["backprop"]):
            assert torch.allclose(a, b, atol=1e-10)


def test_hessian_matches_pennylane_param_shift_hessian():
    def body(mod, w):
        mod.RX(w[0], wires=0)
        mod.CRY(w[1], wires=[0, 1])
        mod.IsingXX(w[2], wires=[1, 2])
        mod.Rot(w[0], w[3], w[2], wires=2)
        mod.SingleExcitation(w[1], wires=[0, 2])
        return mod.expval(mod.PauliZ(0) @ mod.PauliZ(2) + 0.3 * mod.PauliX(1))

    w = torch.tensor([0.3, 0.5, 0.7, -0.2], dtype=torch.float64, requires_grad=True)
    dev = qd.device("statevector", wires=3)
    f = qd.QNode(lambda w: body(qd, w), dev, diff_method="parameter-shift")
    h = torch.autograd.functional.hessian(f, w)
    fb = qd.QNode(lambda w: body(qd, w), dev, diff_method="backprop")
    assert torch.allclose(h, torch.autograd.functional.hessian(fb, w), atol=1e-10)

    pdev = qml.device("default.qubit", wires=3)
    pf = qml.QNode(lambda w: body(qml, w), pdev, diff_method="parameter-shift", max_diff=2)
    wp = qml.numpy.array(w.detach().numpy(), requires_grad=True)
    hp = qml.gradients.param_shift_hessian(pf)(wp)
    assert np.allclose(h.numpy(), np.asarray(hp), atol=1e-8)


@pytest.mark.parametrize("method", ["parameter-shift", "best"])
def test_torch_func_hessian_and_jacfwd_match_pennylane_backprop(method):
    """Forward mode (jacfwd, torch.func.hessian = jacfwd(jacrev)) of the exact rules: the
    Function's jvp evaluates the shift rules, so Hessians are exact."""
    def body(mod, w):
        mod.RX(w[0], wires=0)
        mod.CRY(w[1], wires=[0, 1])
        mod.IsingXX(w[2], wires=[1, 2])
        mod.Rot(w[0], w[3], w[2], wires=2)
        return mod.expval(mod.PauliZ(0) @ mod.PauliZ(2) + 0.3 * mod.PauliX(1))

    w = torch.tensor([0.3, 0.5, 0.7, -0.2], dtype=torch.float64)
    f = qd.QNode(lambda w: body(qd, w), qd.device("statevector", wires=3), diff_method=method)
    h = torch.func.hessian(f)(w)
    assert torch.allclose(h, torch.func.jacrev(torch.func.jacrev(f))(w), atol=1e-12)
    assert torch.allclose(h, torch.func.jacfwd(torch.func.grad(f))(w), atol=1e-12)
    assert torch.allclose(h, torch.func.jacfwd(torch.func.jacfwd(f))(w), atol=1e-12)
    pf = qml.QNode(lambda w: body(qml, w), qml.device("default.qubit", wires=3),
                   interface="torch", diff_method="backprop")
    hp = torch.autograd.functional.hessian(pf, w)
    assert torch.allclose(h, hp.to(h.dtype), atol=1e-10)
    # per-binding Hessians under vmap, and the output of several measurements
    W = torch.stack([w, w + 0.25])
    hv = torch.func.vmap(torch.func.hessian(f))(W)
    assert torch.allclose(hv[1], torch.autograd.functional.hessian(pf, W[1]).to(h.dtype),
                          atol=1e-10)


@pytest.mark.parametrize("method", ["parameter-shift", "best"])
def test_forward_mode_through_the_function_for_var_and_probs(method):
    def body(mod, w):
        mod.RX(w[0], wires=0); mod.CRY(w[1], wires=[0, 1]); mod.RY(w[2], wires=1)
        return mod.var(mod.PauliY(1)), mod.probs(wires=[0, 1])

    def flat(f):
        return lambda w: torch.cat([t.reshape(-1) for t in f(w)])

    dev = qd.device("statevector", wires=2)
    f = flat(qd.QNode(lambda w: body(qd, w), dev, diff_method=method))
    fb = flat(qd.QNode(lambda w: body(qd, w), dev, diff_method="backprop"))
    w = torch.tensor([0.3, -0.6, 1.1], dtype=torch.float64)
    c = torch.linspace(0.5, 1.5, 5, dtype=torch.float64)
    # the jvp runs where theta also requires grad (forward over reverse)
    assert torch.allclose(torch.func.jacfwd(torch.func.jacrev(f))(w),
                          torch.func.jacrev(torch.func.jacrev(fb))(w), atol=1e-10)
    assert torch.allclose(torch.func.hessian(lambda w: f(w) @ c)(w),
                          torch.func.hessian(lambda w: fb(w) @ c)(w), atol=1e-10)
    # plain forward-mode AD on a tensor that requires grad goes through the Function's jvp
    import torch.autograd.forward_ad as fwAD
    t = torch.tensor([0.2, -1.0, 0.7], dtype=torch.float64)
    wr = w.clone().requires_grad_()
    with fwAD.dual_level():
        out = f(fwAD.make_dual(wr, t))
        jvp = fwAD.unpack_dual(out).tangent
    assert torch.allclose(jvp, torch.func.jacrev(fb)(w) @ t, atol=1e-10)


@pytest.mark.parametrize("obs", ["sum", "product", "hermitian"])
@pytest.mark.parametrize("method", ["parameter-shift", "best"])
def test_torch_func_hessian_of_var_of_observable_built_in_the_call(method, obs):
    """var() of an observable made inside the qnode (a sum, a product, a Hermitian matrix):
    its coefficients are constants, also when made under torch.func transforms, and the
    forward-over-reverse Hessian is exact."""
    def make(o):
        if o == "sum":
            return qd.Z(0) @ qd.Y(2) + 0.5 * qd.X(1)
        if o == "product":
            return qd.Z(0) @ qd.Y(2)
        return qd.Hermitian(torch.tensor([[1.0, 2.0], [2.0, -1.0]], dtype=torch.float64), 1)

    def body(w):
        qd.RX(w[0], wires=0); qd.RY(w[1], wires=1); qd.CNOT(wires=[0, 1])
        qd.CRX(w[2], wires=[1, 2]); qd.RY(w[0] * w[2], wires=2)
        return qd.var(make(obs))

    dev = qd.device("statevector", wires=3)
    f = qd.QNode(body, dev, diff_method=method)
    fb = qd.QNode(body, dev, diff_method="backprop")
    w = torch.tensor([0.3, -0.6, 1.1], dtype=torch.float64)
    ref = torch.func.hessian(fb)(w)
    assert torch.allclose(torch.func.hessian(f)(w), ref, atol=1e-10)
    assert torch.allclose(torch.autograd.functional.hessian(f, w), ref, atol=1e-10)


@pytest.mark.parametrize("method", ["parameter-shift", "finite-diff"])
def test_var_of_observable_with_overlapping_dense_terms(method):
    """var() of a sum whose terms overlap a dense factor only in part (Hermitian on [0, 1]
    plus Z(0), plus Hermitian on [1, 2]): the shifted evaluations measure its square."""
    a = torch.tensor([[1.0, 0.5, 0, 0.2], [0.5, -1.0, 0.3, 0], [0, 0.3, 0.5, 0.1],
                      [0.2, 0, 0.1, 0.0]], dtype=torch.float64)

    def f(x):
        qd.RX(x[0], wires=0); qd.CRY(x[1], wires=[0, 1]); qd.IsingXY(x[0], wires=[1, 2])
        return qd.var(qd.Hermitian(a, wires=[0, 1]) + 0.3 * qd.Z(0)
                      + qd.Hermitian(a, wires=[1, 2]))

    dev = qd.device("statevector", wires=3)
    x = torch.tensor([0.7, -0.4], dtype=torch.float64)
    ref = torch.autograd.functional.jacobian(qd.QNode(f, dev, diff_method="backprop"), x)
    got = torch.autograd.functional.jacobian(qd.QNode(f, dev, diff_method=method), x)
    assert torch.allclose(got, ref, atol=1e-10 if method == "parameter-shift" else 1e-7)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("method", ["backprop", "best", "adjoint", "parameter-shift"])
def test_forward_mode_ad_dual_tensors_carry_tangents(method, static):
    """torch.autograd.forward_ad dual tensors that do not require grad (as
    torch.autograd.functional.jacobian(strategy="forward-mode") makes): indexed angles, the
    native kernels and static replays carry their tangents, never a silent zero."""
    import torch.autograd.forward_ad as fwAD

    def body(mod, x, w):
        mod.RX(x[0], wires=0); mod.RY(x[1], wires=1); mod.CNOT(wires=[0, 1])
        mod.CRX(w[0], wires=[1, 0]); mod.RZ(w[1], wires=1); mod.RY(w[0], wires=1)
        return [mod.expval(mod.Z(0)), mod.expval(mod.Z(0) @ mod.X(1))]

    dev = qd.device("statevector", wires=2)
    f = qd.qnode(dev, diff_method=method, static=static)(lambda x, w: body(qd, x, w))
    fb = qd.qnode(dev, diff_method="backprop")(lambda x, w: body(qd, x, w))
    x = torch.tensor([0.3, -0.7], dtype=torch.float64)
    w = torch.tensor([1.1, 0.4], dtype=torch.float64)
    tx = torch.tensor([1.0, 0.5], dtype=torch.float64)
    tw = torch.tensor([-0.3, 2.0], dtype=torch.float64)
    jx, jw = torch.func.jacrev(fb, argnums=(0, 1))(x, w)
    f(x, w)  # a static qnode has its trace already
    with fwAD.dual_level():
        out = f(fwAD.make_dual(x, tx), fwAD.make_dual(w, tw))
        tangent = fwAD.unpack_dual(out).tangent
    assert tangent is not None
    assert torch.allclose(tangent, jx @ tx + jw @ tw, atol=1e-10)
    jac = torch.autograd.functional.jacobian(lambda a: f(a, w), x, strategy="forward-mode",
                                             vectorize=True)
    assert torch.allclose(jac, jx, atol=1e-10)
    # a tangent on what only the simulation itself could carry is refused by name
    g = qd.qnode(dev, diff_method=method)(lambda s: (qd.StatePrep(s, wires=[0, 1]),
                                                     qd.RX(0.3, wires=0),
                                                     qd.expval(qd.Z(0)))[-1])
    s = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64) / 3 ** 0.5
    with fwAD.dual_level(), pytest.raises(qd.QdiffError, match="state preparation"):
        g(fwAD.make_dual(s, torch.ones(4, dtype=torch.float64)))


@pytest.mark.parametrize("method,shots", [("spsa", None), ("parameter-shift", 4000),
                                          ("spsa", 4000), ("best", 4000)])
def test_vectorized_forward_mode_jacobian_with_random_draws(method, shots):
    """torch.autograd.functional.jacobian(vectorize=True, strategy="forward-mode") runs the
    function in torch's legacy vmap mode, which refuses random draws: SPSA's directions and a
    device's shots are drawn outside it (one draw, as without the Jacobian), and the estimate
    is within its statistical error of the exact Jacobian; a seed repeats it."""
    def make():
        dev = qd.device("statevector", wires=2, shots=shots, seed=11)
        kw = {"num_directions": 4000, "seed": 5} if method == "spsa" else {}

        @qd.qnode(dev, diff_method=method, **kw)
        def f(x):
            qd.RX(x[0], wires=0); qd.RY(x[1], wires=1); qd.CNOT(wires=[0, 1])
            return qd.expval(qd.Z(0) @ qd.Z(1))
        return f
    x = torch.tensor([0.3, 0.8], dtype=torch.float64)
    exact = torch.tensor([0.0, -math.sin(0.8)], dtype=torch.float64)  # <Z0 Z1> = cos(x[1])
    jac = [torch.autograd.functional.jacobian(make(), x, vectorize=True,
                                              strategy="forward-mode") for _ in range(2)]
    assert torch.equal(jac[0], jac[1])
    assert torch.allclose(jac[0], exact, atol=0.08, rtol=0)


@pytest.mark.parametrize("method", ["adjoint", "finite-diff", "spsa"])
def test_torch_func_hessian_of_first_order_rules_raises(method):
    f = qd.QNode(lambda w: (qd.RX(w[0], wires=0), qd.RY(w[1], wires=0),
                            qd.expval(qd.Z(0) + 0.5 * qd.X(0)))[-1],
                 qd.device("statevector", wires=1), diff_method=method)
    w = torch.tensor([0.3, 0.4], dtype=torch.float64)
    with pytest.raises(qd.QdiffError, match="second derivatives are not available"):
        torch.func.hessian(f)(w)


def _built_in_the_call(kind, s, w):
    """A circuit whose state, observable or gate matrix is computed from ``s`` in the call."""
    if kind == "state":
        qd.StatePrep(s, wires=0)
    if kind == "matrix":
        c, d = torch.cos(s[0]), torch.sin(s[0])
        qd.QubitUnitary(torch.stack([torch.stack([c, -d]), torch.stack([d, c])]).to(
            torch.complex128), wires=0)
    qd.RX(w[0], wires=0)
    if kind == "hermitian":
        return qd.expval(qd.Hermitian(torch.stack([torch.stack([s[0], s[1]]),
                                                   torch.stack([s[1], -s[0]])]), 0))
    if kind == "coefficients":
        return qd.expval(s[0] * qd.Z(0) + s[1] * qd.Y(0))
    return qd.expval(qd.Z(0))


@pytest.mark.parametrize("engine,kind", [("statevector", "state"), ("statevector", "matrix"),
                                         ("statevector", "hermitian"),
                                         ("statevector", "coefficients"), ("mixed", "state"),
                                         ("mixed", "hermitian"), ("mixed", "coefficients")])
@pytest.mark.parametrize("method", ["parameter-shift", "best"])
def test_nested_torch_func_transforms_differentiate_what_the_call_builds(engine, method, kind):
    """The mixed derivative d/ds (df/dw) through a state, gate matrix or observable computed
    from ``s`` inside the call, the angles differentiated by an exact rule: the outer level's
    derivative of those is carried (the rule alone would see constants: a zero)."""
    dev = qd.device(engine, wires=1)
    f = qd.QNode(lambda s, w: _built_in_the_call(kind, s, w), dev, diff_method=method)
    fb = qd.QNode(lambda s, w: _built_in_the_call(kind, s, w), dev, diff_method="backprop")
    s = torch.tensor([0.6, 0.8], dtype=torch.float64)
    w = torch.tensor([0.3], dtype=torch.float64)
    ref = torch.func.jacrev(torch.func.jacrev(fb, 1), 0)(s, w)
    assert ref.abs().max() > 0.1
    jf, jr = torch.func.jacfwd, torch.func.jacrev
    for outer, inner in [(jf, jr), (jr, jr), (jr, jf), (jf, jf)]:
        assert torch.allclose(outer(inner(f, 1), 0)(s, w), ref, atol=1e-10)
    # the Hessian in the angles with a constant state made in the call
    assert torch.allclose(torch.func.hessian(f, 1)(s, w), torch.func.hessian(fb, 1)(s, w),
                          atol=1e-10)


def test_nested_torch_func_transforms_with_shots_refuse_what_the_call_builds():
    """With shots the rules cannot carry an outer reverse-mode level's derivative through a
    state built in the call: refused, never taken as a constant (a silent zero); the angles'
    own Hessian runs."""
    dev = qd.device("statevector", wires=1, shots=2000, seed=3)
    f = qd.QNode(lambda s, w: _built_in_the_call("state", s, w), dev,
                 diff_method="parameter-shift")
    s = torch.tensor([0.6, 0.8], dtype=torch.float64)
    w = torch.tensor([0.3], dtype=torch.float64)
    with pytest.raises(qd.QdiffError, match="state preparation is computed inside them.*"
                                            "with shots"):
        torch.func.jacrev(torch.func.jacrev(f, 1), 0)(s, w)
    assert torch.func.hessian(f, 1)(s, w).shape == (1, 1)


@pytest.mark.parametrize("method", ["adjoint", "finite-diff"])
def test_nested_torch_func_transforms_of_first_order_rules_raise(method):
    f = qd.QNode(lambda s, w: _built_in_the_call("state", s, w), qd.device("statevector", wires=1),
                 diff_method=method)
    s = torch.tensor([0.6, 0.8], dtype=torch.float64)
    w = torch.tensor([0.3], dtype=torch.float64)
    for outer in (torch.func.jacfwd, torch.func.jacrev):
        with pytest.raises(qd.QdiffError, match="second derivatives are not available"):
            outer(torch.func.jacrev(f, 1), 0)(s, w)


@pytest.mark.parametrize("method", ["backprop", "adjoint", "parameter-shift"])
def test_torch_func_with_basis_state_bits_made_in_the_call(method):
    """BasisState bits made as a tensor inside the call are read under torch.func.jacrev /
    jacfwd / hessian; bits batched by vmap are a QdiffError naming BasisState."""
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev, diff_method=method)
    def f(w):
        qd.BasisState(torch.tensor([1, 0]), wires=[0, 1])
        qd.RY(w[0], wires=0); qd.CNOT(wires=[0, 1])
        return qd.expval(qd.Z(1))

    w = torch.tensor([0.4], dtype=torch.float64)
    ref = torch.tensor([[math.sin(0.4)]], dtype=torch.float64)  # <Z1> = -cos(w)
    assert torch.allclose(torch.func.jacrev(f)(w), ref[0], atol=1e-10)
    assert torch.allclose(torch.func.jacfwd(f)(w), ref[0], atol=1e-10)
    if method != "adjoint":
        assert torch.allclose(torch.func.hessian(f)(w), torch.cos(w)[None], atol=1e-10)

    @qd.qnode(dev, diff_method=method)
    def g(bits):
        qd.BasisState(bits, wires=[0, 1])
        return qd.expval(qd.Z(0))

    with pytest.raises(qd.QdiffError, match="BasisState"):
        torch.func.vmap(g)(torch.tensor([[1, 0], [0, 1]]))


@pytest.mark.parametrize("in_dtype,dev_dtype", [(torch.float32, torch.complex128),
                                                (torch.float64, torch.complex64),
                                                (torch.float32, torch.complex64)])
def test_finite_diff_step_follows_the_precision(in_dtype, dev_dtype):
    """The default step suits the precision computed in, and differences are taken before
    outputs are cast down to the input dtype."""
    def body(x):
        qd.RX(x[0], 0); qd.RY(0.4 * x[0], 0); qd.CNOT([0, 1]); qd.RY(x[1], 1)
        return qd.expval(qd.Z(0)), qd.expval(qd.Z(0) @ qd.Z(1))

    x64 = torch.tensor([0.3, -1.2], dtype=torch.float64)
    ref = torch.func.jacrev(lambda x: torch.stack(list(
        qd.qnode(qd.device("statevector", wires=2), diff_method="backprop")(body)(x))))(x64)
    f = qd.qnode(qd.device("statevector", wires=2, dtype=dev_dtype), diff_method="finite-diff")(body)
    x = x64.to(in_dtype).requires_grad_()
    rows = [torch.autograd.grad(out, x, retain_graph=True)[0] for out in f(x)]
    jac = torch.stack(rows)
    assert jac.dtype == in_dtype
    tol = 1e-4 if dev_dtype == torch.complex64 else 1e-6
    assert torch.allclose(jac.double(), ref, atol=tol), (jac, ref)
    # an explicit step is honoured: h = 0.1 gives that central difference
    g = qd.qnode(qd.device("statevector", wires=1, dtype=dev_dtype), diff_method="finite-diff",
                 h=0.1)(lambda t: (qd.RX(t, 0), qd.expval(qd.Z(0)))[-1])
    t = torch.tensor(0.7, dtype=in_dtype, requires_grad=True)
    (d,) = torch.autograd.grad(g(t), t)
    central = (math.cos(0.8) - math.cos(0.6)) / 0.2
    assert abs(float(d) - central) < (1e-5 if dev_dtype == torch.complex64 else 1e-6)
    assert abs(central + math.sin(0.7)) > 1e-4  # differs from the exact derivative


def test_finite_diff_default_step_with_shots():
    """With shots the default step is 0.1 (as "best" takes): the central difference's shot
    noise is sigma / (sqrt(2) h), not sigma / 1e-6; exact calls keep the precision's step."""
    dev = qd.device("statevector", wires=1, shots=4000, seed=3)
    f = qd.qnode(dev, diff_method="finite-diff")(lambda t: (qd.RX(t, 0), qd.expval(qd.Z(0)))[-1])
    t = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    (d,) = torch.autograd.grad(f(t), t)
    central = (math.cos(0.8) - math.cos(0.6)) / 0.2
    sigma = math.sqrt((1 - math.cos(0.7) ** 2) / 4000) / (math.sqrt(2) * 0.1)
    assert abs(float(d) - central) < 5 * sigma
    (e,) = torch.autograd.grad(f(t, shots=None), t)
    assert abs(float(e) + math.sin(0.7)) < 1e-8


def test_custom_gate_with_generator_and_with_rule():
    """A user-registered gate: rules derived from its generator, or its own shift rule."""
    zz_x = np.kron(np.diag([1.0, -1.0]), np.array([[0, 1], [1, 0]])) / 2

    def mat(t):
        c, s = torch.cos(t / 2).to(torch.complex128), torch.sin(t / 2).to(torch.complex128)
        eye = torch.eye(4, dtype=torch.complex128)
        g = torch.tensor(zz_x * 2, dtype=torch.complex128)
        return c[..., None, None] * eye - 1j * s[..., None, None] * g

    g1 = register_gate(Gate("my_zx", 2, 1, mat, generators=(zz_x,),
                            inverse_fn=lambda p: (GATES["my_zx"], (-p[0],)), pl_name="MyZX"),
                       replace=True)
    g2 = register_gate(Gate("my_zx_rule", 2, 1, mat, shift_rules=(((0.5, math.pi / 2),
                                                                    (-0.5, -math.pi / 2)),),
                            inverse_fn=lambda p: (GATES["my_zx_rule"], (-p[0],))), replace=True)
    dev = qd.device("statevector", wires=2)
    try:
        for gate in (g1, g2):
            def f(x, gate=gate):
                qd.Hadamard(0); gate(x, wires=[0, 1]); qd.RY(x * 0.5, wires=1)
                return qd.expval(qd.X(0) @ qd.Z(1))
            compare_methods(qd.QNode(f, dev), [torch.tensor(0.77, dtype=torch.float64,
                                                           requires_grad=True)], atol=1e-8)
    finally:  # the registry is global: leave it as other tests expect
        unregister_gate("my_zx")
        unregister_gate("my_zx_rule")


@pytest.mark.parametrize("method", ["parameter-shift", "adjoint", "best"])
def test_custom_gate_generator_off_by_a_factor_is_refused(method):
    """A generator that does not match the gate's matrix (RX's matrix with G = X instead of
    X/2) would make every generator-derived gradient wrong: refused by name, both when the
    gate is registered and when an unregistered record is differentiated."""
    x_op = np.array([[0, 1], [1, 0]], dtype=complex)
    with pytest.raises(qd.QdiffError, match="generator of parameter 0 does not match"):
        register_gate(Gate("bad_rx", 1, 1, qd.RX.matrix_fn, generators=(x_op,)))
    assert "bad_rx" not in GATES
    bad = Gate("bad_rx2", 1, 1, qd.RX.matrix_fn, generators=(x_op,), pl_name="BadRX")
    q = qd.QNode(lambda t: (bad(t, wires=0), qd.expval(qd.Z(0)))[-1],
                 qd.device("statevector", wires=1), diff_method=method)
    t = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    from qdiff.backends.statevector import native
    if method == "best" and native.library() is None:
        # best is backprop without the native kernels: the matrix's own derivative, exact
        (g,) = torch.autograd.grad(q(t), t)
        assert abs(float(g) + math.sin(0.3)) < 1e-12
    else:
        with pytest.raises(qd.QdiffError, match="'BadRX': the generator of parameter 0"):
            torch.autograd.grad(q(t), t)
    with pytest.raises(qd.QdiffError, match="must be a Hermitian 2x2 matrix"):
        register_gate(Gate("bad_rx3", 1, 1, qd.RX.matrix_fn, generators=(np.eye(4),)))


@pytest.mark.parametrize("device", ["statevector", "mixed"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_custom_gate_with_a_constant_factor_beside_the_rotation(side, device):
    """A user gate ``H RZ(phi)`` (``U = A exp(-i phi G)``, A = H) or ``RZ(phi) H`` with
    generator Z/2: every method gives the derivative of its matrix."""
    h = torch.tensor([[1, 1], [1, -1]], dtype=torch.complex128) / math.sqrt(2)
    rz = GATES["rz"].matrix_fn
    fn = (lambda t: h @ rz(t)) if side == "left" else (lambda t: rz(t) @ h)
    gate = Gate(f"hrz_{side}", 1, 1, fn, generators=(np.diag([0.5, -0.5]),), pl_name="HRZ")
    dev = qd.device(device, wires=1)

    def f(x):
        qd.RY(0.4, wires=0); gate(x, wires=0); qd.RX(0.3, wires=0)
        return qd.expval(qd.Z(0) + 0.3 * qd.X(0))

    compare_methods(qd.QNode(f, dev), [torch.tensor(0.3, dtype=torch.float64,
                                                     requires_grad=True)],
                    methods=["backprop", "adjoint", "best", "parameter-shift"], atol=1e-10)


def test_testing_helpers_detect_a_wrong_gradient():
    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.sin(x)

        @staticmethod
        def backward(ctx, g):
            return g * 0.5

    x = torch.tensor([0.1, 0.2], dtype=torch.float64)
    with pytest.raises(qd.QdiffError):
        check_vjp(Wrong.apply, x)
    with pytest.raises(qd.QdiffError):
        check_directional(Wrong.apply, x)
    assert check_vjp(torch.sin, x) and check_directional(torch.sin, x)


def test_shot_gradients_within_statistical_bounds():
    shots = 20000
    dev = qd.device("statevector", wires=2, shots=shots, seed=11)
    exact_dev = qd.device("statevector", wires=2)

    def f(x):
        qd.RX(x[0], wires=0); qd.CRY(x[1], wires=[0, 1])
        return qd.expval(qd.Z(0) @ qd.X(1) + 0.5 * qd.Z(1))

    x = torch.tensor([0.8, 1.1], dtype=torch.float64, requires_grad=True)
    (exact,) = torch.autograd.grad(qd.QNode(f, exact_dev, diff_method="backprop")(x), x)
    (ps,) = torch.autograd.grad(qd.QNode(f, dev, diff_method="parameter-shift")(x), x)
    # each shifted term: variance <= (sum |c|)^2 per shot; 4-term rule coefficients < 0.5
    sigma = 1.5 * 2 * 0.5 / math.sqrt(shots) * 2
    assert torch.all((ps - exact).abs() < 5 * sigma)
    spsa_grads = []
    q = qd.QNode(f, exact_dev, diff_method="spsa", seed=3, num_directions=50, epsilon=1e-3)
    for _ in range(8):
        (g,) = torch.autograd.grad(q(x), x)
        spsa_grads.append(g)
    assert torch.allclose(torch.stack(spsa_grads).mean(0), exact, atol=0.15)


@pytest.mark.parametrize("method", ["parameter-shift", "best"])
def test_torch_func_forward_mode_and_vmap_with_shots(method):
    """With shots, torch.func.jacfwd / jvp take the shift rules through the Function (a
    sampled estimate carries no tangent: never a silent zero), and vmap over a shot device
    runs (each vmapped binding sampled)."""
    def f(x):
        qd.RX(x[0], wires=0); qd.CRY(x[1], wires=[0, 1])
        return qd.expval(qd.Z(0) @ qd.X(1) + 0.5 * qd.Z(1))

    shots = 20000
    x = torch.tensor([0.8, 1.1], dtype=torch.float64)
    exact = torch.func.jacrev(qd.QNode(f, qd.device("statevector", wires=2),
                                       diff_method="backprop"))(x)
    q = qd.QNode(f, qd.device("statevector", wires=2, shots=shots, seed=5), diff_method=method)
    sigma = 1.5 * 2 * 0.5 / math.sqrt(shots) * 2  # as in the test above
    for jac in (torch.func.jacfwd(q)(x), torch.func.jacfwd(q, randomness="different")(x),
                torch.func.jvp(q, (x,), (torch.tensor([1.0, 0.0], dtype=torch.float64),))[1]):
        assert torch.all((jac - exact[:jac.numel()]).abs() < 5 * sigma), (jac, exact)
    out = torch.func.vmap(q)(torch.stack([x, x + 0.5]))
    plain = qd.QNode(f, qd.device("statevector", wires=2))
    want = torch.stack([plain(x), plain(x + 0.5)])
    assert torch.allclose(out, want, atol=5 * 1.5 / math.sqrt(shots)), (out, want)


@pytest.mark.parametrize("where", ["shots", "pennylane"])
@pytest.mark.parametrize("method", ["parameter-shift", "best"])
def test_forward_mode_over_coefficients_with_shots_or_outside_torch(where, method):
    """With shots or on a device outside torch the rules take an observable as a constant:
    a forward-mode tangent on its coefficients (jacfwd, jvp), or an outer reverse level
    differentiating them past an inner jacfwd, is a QdiffError, never a silent zero;
    jacrev over the coefficients is exact (they multiply the terms' expectations)."""
    if where == "shots":
        dev = qd.device("statevector", wires=2, shots=1000, seed=2)
    else:
        pytest.importorskip("pennylane")
        dev = qd.device("pennylane", name="default.qubit", wires=2)

    @qd.qnode(dev, diff_method=method)
    def f(w, c):
        qd.RX(w[0], 0); qd.RY(w[1], 1); qd.CNOT([0, 1])
        return qd.expval(qd.Hamiltonian(c, [qd.Z(0), qd.X(1)]))

    w = torch.tensor([0.4, 0.9], dtype=torch.float64)
    c = torch.tensor([0.7, -0.3], dtype=torch.float64)
    with pytest.raises(qd.QdiffError, match="tangent on the observable"):
        torch.func.jacfwd(f, argnums=1)(w, c)
    with pytest.raises(qd.QdiffError, match="tangent on the observable"):
        torch.func.jvp(f, (w, c), (torch.ones(2, dtype=torch.float64),) * 2)
    with pytest.raises(qd.QdiffError, match="outer level differentiates"):
        torch.func.jacrev(torch.func.jacfwd(f, argnums=0), argnums=1)(w, c)
    terms = torch.func.jacrev(f, argnums=1)(w, c)  # <Z0> = cos(0.4), <X1> = sin(0.9)
    tol = 0.15 if where == "shots" else 1e-10
    assert abs(float(terms[0]) - math.cos(0.4)) < tol
    assert abs(float(terms[1]) - math.sin(0.9)) < tol
    # an outer jacfwd over the coefficients past an inner jacrev over the angles: the
    # coefficients multiply the terms in torch, so its tangent is carried
    mixed = torch.func.jacfwd(torch.func.jacrev(f, argnums=0), argnums=1)(w, c)
    want = torch.tensor([[-math.sin(0.4), 0.0], [0.0, math.cos(0.9)]], dtype=torch.float64)
    assert torch.allclose(mixed, want, atol=tol), mixed


def test_parameter_shift_with_probs_before_var_and_expval():
    """Output columns after a multi-column probs keep their place in the shifted layout."""
    dev = qd.device("statevector", wires=2)
    x = torch.tensor([0.7, -1.2], dtype=torch.float64, requires_grad=True)

    def body(x):
        qd.RY(x[0], wires=0)
        qd.RX(x[1], wires=1)
        qd.CNOT(wires=[0, 1])
        return qd.probs(wires=[0, 1]), qd.var(qd.Y(1)), qd.expval(qd.X(0))

    grads = []
    for method in ("parameter-shift", "backprop"):
        out = qd.qnode(dev, diff_method=method)(body)(x)
        flat = torch.cat([t.reshape(-1) for t in out])
        w = torch.linspace(-1, 1, flat.numel(), dtype=torch.float64)
        grads.append(torch.autograd.grad(flat @ w, x)[0])
    assert torch.allclose(grads[0], grads[1], atol=1e-12)


def _ry_matrix(a):
    c, s = torch.cos(a / 2), torch.sin(a / 2)
    return torch.stack([torch.stack([c, -s]), torch.stack([s, c])]).to(torch.complex128)


@pytest.mark.parametrize("wrap", ["plain", "adjoint", "ctrl"])
@pytest.mark.parametrize("method", ["best", "backprop"])
def test_trainable_qubit_unitary_matrix_gradient(wrap, method):
    """A QubitUnitary of a matrix that requires grad (also inverted or controlled) is
    differentiated through its matrix, as PennyLane's backprop does: closed form
    d/da cos(b +- a)."""
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev, diff_method=method)
    def f(a, b):
        qd.X(0)
        u = qd.QubitUnitary(_ry_matrix(a), wires=1) if wrap != "ctrl" else None
        if wrap == "adjoint":
            qd.adjoint(u)
        elif wrap == "ctrl":
            qd.ctrl(qd.QubitUnitary(_ry_matrix(a), wires=1), control=0)
        qd.RY(b, wires=1)
        return qd.expval(qd.Z(1))
    a = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    f(a, b).backward()
    sign = -1.0 if wrap == "adjoint" else 1.0
    assert a.grad is not None
    assert math.isclose(a.grad.item(), -sign * math.sin(0.2 + sign * 0.7), abs_tol=1e-12)
    assert math.isclose(b.grad.item(), -math.sin(0.2 + sign * 0.7), abs_tol=1e-12)


@pytest.mark.parametrize("method", ["best", "backprop", "adjoint"])
def test_trainable_qubit_unitary_matrix_alone(method):
    """The matrix the only trainable input (every angle a constant): best and backprop still
    differentiate it (the engine's torch path, not the kernels), adjoint refuses it."""
    dev = qd.device("statevector", wires=1)

    @qd.qnode(dev, diff_method=method)
    def f(a):
        qd.QubitUnitary(_ry_matrix(a), wires=0)
        qd.RY(0.2, wires=0)
        return qd.expval(qd.Z(0))
    a = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    if method == "adjoint":
        with pytest.raises(qd.QdiffError, match="QubitUnitary.*backprop"):
            f(a)
        return
    (g,) = torch.autograd.grad(f(a), a)
    assert math.isclose(g.item(), -math.sin(0.9), abs_tol=1e-12)


@pytest.mark.parametrize("method", ["adjoint", "parameter-shift", "finite-diff"])
def test_trainable_qubit_unitary_matrix_refused_by_angle_rules(method):
    """Rules that differentiate gate angles cannot see a trainable matrix: refused by name
    instead of returning no gradient for it; under no_grad the call runs."""
    dev = qd.device("statevector", wires=1)

    @qd.qnode(dev, diff_method=method)
    def f(a, b):
        qd.QubitUnitary(_ry_matrix(a), wires=0)
        qd.RY(b, wires=0)
        return qd.expval(qd.Z(0))
    a = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    with pytest.raises(qd.QdiffError, match="QubitUnitary.*backprop"):
        f(a, b)
    with torch.no_grad():
        assert math.isclose(f(a, b).item(), math.cos(0.9), abs_tol=1e-12)


def test_forward_mode_through_a_gate_without_generator_and_its_memory_check(monkeypatch):
    """A gate known only by its matrix under torch.autograd.forward_ad with the reverse-mode
    engine: its matrix derivative is taken inside the caller's dual level (torch nests no
    forward-mode levels) and equals central differences; the Jacobian's one-sweep-per-output
    buffers are checked against memory first."""
    import torch.autograd.forward_ad as fwAD
    gate = Gate("rx_matrix_only", 1, 1, qd.RX.matrix_fn, pl_name="RXMatrixOnly")
    dev = qd.device("statevector", wires=6)

    @qd.qnode(dev, diff_method="adjoint")
    def f(x):
        for w in range(1, 6):
            qd.H(w)
        qd.RY(0.4, wires=0)
        gate(x, wires=0)
        qd.CNOT(wires=[0, 1])
        return qd.probs()
    x, h = 0.3, 1e-6
    with fwAD.dual_level():
        y = f(fwAD.make_dual(torch.tensor(x, dtype=torch.float64),
                             torch.tensor(1.0, dtype=torch.float64)))
        tangent = fwAD.unpack_dual(y).tangent
    up, down = (f(torch.tensor(v, dtype=torch.float64)) for v in (x + h, x - h))
    assert torch.allclose(tangent, (up - down) / (2 * h), atol=1e-8, rtol=0)
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "20000")  # the run fits, 64 x 64 cotangents not
    with pytest.raises(qd.QdiffMemoryError, match="forward-mode Jacobian of 64 outputs"):
        with fwAD.dual_level():
            f(fwAD.make_dual(torch.tensor(x, dtype=torch.float64),
                             torch.tensor(1.0, dtype=torch.float64)))


def test_torch_func_hessians_through_a_gate_without_generator():
    """A gate known only by its (not single-generator) matrix under torch.func's nested
    transforms: ``best`` gives the backprop Hessian by jacfwd(jacrev), jacrev(jacrev) and
    jacfwd(grad); ``adjoint`` refuses by name; first-order jacfwd of ``adjoint`` is exact."""
    def mat(t):  # RX(t) RZ(t**2): no U = A exp(-i t G) B form
        c, s = torch.cos(t / 2), torch.sin(t / 2)
        rx = torch.stack([torch.stack([c + 0j, -1j * s], -1),
                          torch.stack([-1j * s, c + 0j], -1)], -2)
        ph = torch.exp(-0.5j * t * t)
        zero = torch.zeros_like(ph)
        rz = torch.stack([torch.stack([ph, zero], -1), torch.stack([zero, ph.conj()], -1)], -2)
        return rx @ rz
    gate = Gate("rx_rz_sq", 1, 1, mat, pl_name="RXRZSquared")
    dev = qd.device("statevector", wires=2)

    def make(method):
        @qd.qnode(dev, diff_method=method)
        def f(x):
            gate(x[0], wires=0)
            qd.RY(x[1], wires=1)
            qd.CNOT(wires=[0, 1])
            qd.RY(0.3, wires=0)
            qd.CRX(x[1], wires=[1, 0])
            return qd.expval(qd.Y(0))  # a single Pauli word: no coefficient tensor
        return f
    x = torch.tensor([0.7, -0.4], dtype=torch.float64)
    ref = torch.autograd.functional.hessian(make("backprop"), x)
    assert ref.abs().max() > 0.1
    best = make("best")
    for hess in (torch.func.hessian, lambda g: torch.func.jacrev(torch.func.jacrev(g)),
                 lambda g: torch.func.jacfwd(torch.func.grad(g))):
        assert torch.allclose(hess(best)(x), ref, atol=1e-10, rtol=0)
    adjoint = make("adjoint")
    assert torch.allclose(torch.func.jacfwd(adjoint)(x),
                          torch.autograd.functional.jacobian(make("backprop"), x), atol=1e-12)
    with pytest.raises(qd.QdiffError, match="second derivatives are not available with "
                                            "diff_method='adjoint'"):
        torch.func.hessian(adjoint)(x)
