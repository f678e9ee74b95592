"""qd.device("pennylane", name=...): exact results equal the torch simulator's (1e-10), shots,
one qml.execute per call, and the device's own adjoint VJP against backprop."""
from __future__ import annotations

import math

import pytest
import torch

import qdiff as qd
from qdiff.backends.base import Job
from qdiff import QdiffError

DEVICES = ["default.qubit", "lightning.qubit"]


def _circuit(x, w):
    qd.RX(x, wires=0)
    qd.RY(w[0], wires=1)
    qd.CNOT([0, 1])
    qd.CRZ(w[1], wires=[1, 2])
    qd.Rot(w[0], x, w[1], wires=2)
    qd.PauliRot(w[1], "XZ", wires=[0, 2])
    qd.SingleExcitation(x, wires=[1, 2])
    qd.MultiRZ(w[0], wires=[0, 1, 2])
    qd.S(0)
    qd.Sdg(1)
    qd.ISWAP([0, 2])
    qd.ECR([2, 0])


def _measured(x, w):
    _circuit(x, w)
    return [qd.expval(qd.Z(0) @ qd.X(1) - 0.3 * qd.Y(2)), qd.var(qd.X(2)),
            qd.expval(qd.Hermitian(torch.tensor([[0.5, 1.0], [1.0, -2.0]]), wires=0))]


X = torch.tensor([0.3, -1.1, 2.4], dtype=torch.float64)
W = torch.tensor([0.7, -0.2], dtype=torch.float64)


@pytest.mark.parametrize("name", DEVICES)
def test_exact_matches_statevector(name):
    dev = qd.device("pennylane", name=name, wires=3)
    got = qd.qnode(dev)(_measured)(X, W)
    ref = qd.qnode(qd.device("statevector", wires=3))(_measured)(X, W)
    assert torch.allclose(got, ref, atol=1e-10, rtol=0)
    assert dev.executions == 1

    def pr(x, w):
        _circuit(x, w)
        return qd.probs(wires=[2, 0])
    got = qd.qnode(dev)(pr)(X, W)
    assert torch.allclose(got, qd.qnode(qd.device("statevector", wires=3))(pr)(X, W),
                          atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", DEVICES)
def test_device_adjoint_vjp_matches_backprop(name):
    from qdiff.qnode import QNode
    dev = qd.device("pennylane", name=name, wires=3)
    assert dev.capabilities.vjp

    def f(x, w):
        _circuit(x, w)
        return [qd.expval(qd.Z(0) @ qd.X(1) - 0.3 * qd.Y(2)), qd.expval(qd.Y(1))]
    x, w = X.clone().requires_grad_(), W.clone().requires_grad_()
    rec, _ = QNode(f, dev).construct(x, w)
    cot = torch.tensor([[1.0, -0.5], [0.3, 2.0], [-1.0, 0.1]], dtype=torch.float64)
    [g] = dev.vjp([Job(rec.circuit, rec.theta.detach())], [cot], [None])
    th = rec.theta.detach().clone().requires_grad_()
    sv = qd.device("statevector", wires=3)
    outs = sv.run(rec.circuit, th)
    flat = torch.stack(outs, dim=-1)
    (ref,) = torch.autograd.grad(flat, th, cot)
    assert g.shape == ref.shape and torch.allclose(g, ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", DEVICES)
def test_device_adjoint_is_float64_exact_for_mixed_observables(name):
    """lightning.qubit returns Python floats, which PennyLane's torch interface makes float32:
    the cotangent must not reach the device's VJP rounded to float32 (an error of ~1e-8 on a
    loss of Hermitian and Pauli-sum expectations)."""
    h1 = torch.tensor([[1.0, 0.5 - 0.2j], [0.5 + 0.2j, -0.3]], dtype=torch.complex128)

    def f(x, w):
        qd.RX(x, wires=0)
        qd.CRY(w[0], wires=[0, 1])
        qd.RY(w[1], wires=2)
        qd.CNOT([1, 2])
        return [qd.expval(qd.Hermitian(h1, wires=1)), qd.expval(qd.Z(0)),
                qd.expval(0.3 * qd.X(2) @ qd.Y(0) - 1.2 * qd.Z(1))]
    x, w = X.clone().requires_grad_(), W.clone().requires_grad_()
    got = qd.qnode(qd.device("pennylane", name=name, wires=3), diff_method="adjoint")(f)(x, w)
    ref = qd.qnode(qd.device("statevector", wires=3), diff_method="backprop")(f)(x, w)
    gx, gw = torch.autograd.grad((got ** 2).sum(), [x, w])
    rx, rw = torch.autograd.grad((ref ** 2).sum(), [x, w])
    assert torch.allclose(gx, rx, atol=1e-12, rtol=0) and torch.allclose(gw, rw, atol=1e-12, rtol=0)


def test_vjp_refuses_non_expval():
    from qdiff.qnode import QNode
    dev = qd.device("pennylane", name="lightning.qubit", wires=1)
    rec, _ = QNode(lambda x: (qd.RX(x, wires=0), qd.probs(wires=[0]))[1], dev).construct(
        torch.tensor(0.2, dtype=torch.float64))
    with pytest.raises(QdiffError, match="probs\\(\\) is not differentiable with the adjoint"):
        dev.vjp([Job(rec.circuit, rec.theta)], [torch.ones(1, 2, dtype=torch.float64)], [None])


def test_parameter_shift_through_the_bridge():
    dev = qd.device("pennylane", name="lightning.qubit", wires=3)

    def f(x, w):
        _circuit(x, w)
        return qd.expval(qd.Z(0) @ qd.X(1) - 0.3 * qd.Y(2))
    x, w = X.clone().requires_grad_(), W.clone().requires_grad_()
    gx, gw = torch.autograd.grad(qd.qnode(dev)(f)(x, w).sum(), [x, w])
    rx, rw = torch.autograd.grad(qd.qnode(qd.device("statevector", wires=3),
                                          diff_method="backprop")(f)(x, w).sum(), [x, w])
    assert torch.allclose(gx, rx, atol=1e-9) and torch.allclose(gw, rw, atol=1e-9)
    assert dev.executions == 2


def test_shots_samples_and_counts():
    dev = qd.device("pennylane", name="default.qubit", wires=2, shots=500, seed=7)

    def f(x):
        qd.RX(x, wires=0)
        qd.CNOT([0, 1])
        return [qd.sample(wires=[0, 1]), qd.sample(qd.Z(0) @ qd.Z(1))]
    bits, zz = qd.qnode(dev)(f)(torch.tensor([0.5, 2.0], dtype=torch.float64))
    assert bits.shape == (2, 500, 2) and bits.dtype == torch.int64 and zz.shape == (2, 500)
    assert torch.equal(bits[..., 0], bits[..., 1]) and torch.equal(zz, torch.ones_like(zz))
    c = qd.qnode(dev)(lambda: (qd.PauliX(1), qd.counts(wires=[0, 1]))[1])()
    assert c == {"01": 500}
    e = qd.qnode(dev)(lambda x: (qd.RY(x, wires=0), qd.expval(qd.Z(0)))[1])(
        torch.tensor(1.0, dtype=torch.float64))
    assert abs(float(e) - float(torch.cos(torch.tensor(1.0)))) < 5 * (1 / 500) ** 0.5



def test_shots_keep_every_output_next_to_a_scaled_pauli_word():
    """A one-term observable with a coefficient (``0.5 * Z0``, ``Z0 - Z0``) measured first
    among commuting measurements: every measurement keeps its own value, with shots as exact."""
    def f(x):
        qd.RX(x, wires=0)
        qd.RX(2 * x, wires=2)
        return [qd.expval(0.5 * qd.Z(0)), qd.expval(qd.Z(1)), qd.expval(qd.Z(2)),
                qd.var(qd.X(0)), qd.expval(qd.Z(0) - qd.Z(0)), qd.expval(qd.Z(1))]
    x = torch.tensor(0.3, dtype=torch.float64)
    exact = qd.qnode(qd.device("statevector", wires=3))(f)(x)
    for shots in (None, 4000):
        dev = qd.device("pennylane", name="default.qubit", wires=3, shots=shots, seed=3)
        out = qd.qnode(dev)(f)(x)
        assert out.shape == exact.shape == (6,)
        assert torch.allclose(out, exact, atol=1e-10 if shots is None else 0.1)

def test_channels_run_on_default_mixed_as_on_the_mixed_engine():
    """Every channel (PauliError and QubitChannel included) goes to PennyLane as its channel
    of the same name: default.mixed equals qdiff's mixed engine to 1e-10."""
    import numpy as np
    v = np.linalg.qr(np.random.default_rng(1).normal(size=(8, 4))
                     + 1j * np.random.default_rng(2).normal(size=(8, 4)))[0]

    def body(x, p):
        qd.RX(x, wires=0)
        qd.RY(0.4, wires=1)
        qd.CNOT([0, 1])
        qd.PauliError("XY", 0.2, wires=[1, 0])
        qd.QubitChannel([v[:4], v[4:]], wires=[0, 1])
        qd.GeneralizedAmplitudeDamping(0.3, 0.2, wires=0)
        qd.ThermalRelaxationError(0.1, 10.0, 12.0, 2.0, wires=1)
        qd.AmplitudeDamping(0.2, wires=1)
        qd.PhaseDamping(0.3, wires=0)
        qd.BitFlip(0.1, wires=1)
        qd.PhaseFlip(0.2, wires=0)
        qd.DepolarizingChannel(p, wires=0)
        qd.ResetError(0.1, 0.2, wires=1)
        return qd.expval(qd.Z(0) @ qd.X(1)), qd.probs([1, 0])
    x = torch.tensor([0.5, 1.3], dtype=torch.float64)
    want = qd.qnode(qd.device("mixed", wires=2))(body)(x, 0.1)
    got = qd.qnode(qd.device("pennylane", name="default.mixed", wires=2))(body)(x, 0.1)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-10, rtol=0)


@pytest.mark.parametrize("x", [torch.tensor(0.4, dtype=torch.float64),
                               torch.tensor([0.4, 1.2], dtype=torch.float64)])
def test_state_is_a_state_vector_or_refused(x):
    def body(x):
        qd.RX(x, wires="a")
        qd.CNOT(["a", "b"])
        return [qd.state(), qd.expval(qd.Z("a"))]
    want = qd.qnode(qd.device("statevector", wires=["a", "b"]))(body)(x)
    got = qd.qnode(qd.device("pennylane", name="default.qubit", wires=["a", "b"]))(body)(x)
    torch.testing.assert_close(got[0], want[0], atol=1e-10, rtol=0)
    # default.mixed holds a density matrix: state() is refused, as on the mixed engine
    with pytest.raises(QdiffError, match="state\\(\\) returns a state vector.*density_matrix"):
        qd.qnode(qd.device("pennylane", name="default.mixed", wires=["a", "b"]))(body)(x)


def test_errors_and_repr():
    with pytest.raises(QdiffError, match="unknown PennyLane device 'nope.qubit'"):
        qd.device("pennylane", name="nope.qubit", wires=1)
    with pytest.raises(QdiffError, match="sample\\(\\) needs a device with shots"):
        qd.qnode(qd.device("pennylane", wires=1))(lambda: qd.sample(wires=[0]))()
    assert repr(qd.device("pennylane", name="lightning.qubit", wires=2, shots=5)) == \
        "<PennyLaneBackend lightning.qubit wires=2, shots=5>"
    assert not qd.device("pennylane", name="default.mixed", wires=1).capabilities.vjp
    assert "lightning.qubit" in qd.backends.available("pennylane")


def test_qnode_adjoint_uses_the_device_adjoint():
    dev = qd.device("pennylane", name="lightning.qubit", wires=3)

    def f(x, w):
        _circuit(x, w)
        return [qd.expval(qd.Z(0) @ qd.X(1) - 0.3 * qd.Y(2)), qd.expval(qd.X(0))]
    x, w = X.clone().requires_grad_(), W.clone().requires_grad_()
    mix = torch.tensor([1.0, -2.0], dtype=torch.float64)
    gx, gw = torch.autograd.grad((qd.qnode(dev, diff_method="adjoint")(f)(x, w) * mix).sum(),
                                 [x, w])
    rx, rw = torch.autograd.grad((qd.qnode(qd.device("statevector", wires=3),
                                           diff_method="backprop")(f)(x, w) * mix).sum(), [x, w])
    assert torch.allclose(gx, rx, atol=1e-12) and torch.allclose(gw, rw, atol=1e-12)
    assert dev.executions == 2  # forward + one adjoint VJP call


def test_seed_reaches_the_device_or_is_refused():
    """A seed is the device's seed (same seed, same samples, as with qml.device(..., seed=));
    a device that takes none refuses it instead of sampling unseeded."""
    import pennylane as qml

    def f():
        qd.Hadamard(0)
        return qd.sample(wires=[0])

    got = qd.qnode(qd.device("pennylane", name="default.qubit", wires=1, shots=64, seed=7))(f)()
    ref = qml.QNode(lambda: (qml.Hadamard(0), qml.sample(wires=[0]))[1],
                    qml.device("default.qubit", wires=1, seed=7), shots=64)()
    assert got.reshape(-1).tolist() == [int(v) for v in ref.reshape(-1)]
    with pytest.raises(QdiffError, match="null.qubit.*seed"):
        qd.device("pennylane", name="null.qubit", wires=1, seed=7)
    qd.device("pennylane", name="null.qubit", wires=1)


def test_shot_buffers_are_checked_before_the_device_samples(monkeypatch):
    from qdiff import QdiffMemoryError
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "1M")

    def f():
        qd.Hadamard(0)
        return qd.expval(qd.Z(0))

    with pytest.raises(QdiffMemoryError, match="100000 shots x 1 bindings on 2 wires"):
        qd.qnode(qd.device("pennylane", name="default.qubit", wires=2, shots=100_000))(f)()


@pytest.mark.parametrize("method", ["best", "parameter-shift", "adjoint"])
def test_torch_func_transforms_on_a_pennylane_device(method):
    """vmap, jvp, jacfwd and jacrev of a qnode on a device outside torch run through the
    bridge's vmap/jvp rules (the device reads plain values), as on the torch simulator."""
    dev = qd.device("pennylane", name="default.qubit", wires=3)

    def f(x, w):
        _circuit(x, w)
        return [qd.expval(qd.Z(0) @ qd.X(1) - 0.3 * qd.Y(2)), qd.expval(qd.Y(1))]
    g = qd.qnode(dev, diff_method=method)(f)
    ref = qd.qnode(qd.device("statevector", wires=3), diff_method="backprop")(f)
    xs = X[:2]
    assert torch.allclose(torch.func.vmap(g, in_dims=(0, None))(xs, W), ref(xs, W), atol=1e-10)
    jx, jw = torch.func.jacrev(ref, argnums=(0, 1))(X[0], W)
    tw = torch.tensor([0.4, -1.3], dtype=torch.float64)
    _, tangent = torch.func.jvp(g, (X[0], W), (torch.ones((), dtype=torch.float64), tw))
    assert torch.allclose(tangent, jx + jw @ tw, atol=1e-9)
    assert torch.allclose(torch.func.jacfwd(g, argnums=1)(X[0], W), jw, atol=1e-9)
    assert torch.allclose(torch.func.jacrev(g, argnums=1)(X[0], W), jw, atol=1e-9)
    hess = torch.func.jacrev(torch.func.jacrev(lambda w: g(X[0], w)[0]))
    if method == "adjoint":  # first order only, as the device's own reverse mode
        with pytest.raises(QdiffError, match="second derivatives are not available"):
            hess(W)
    else:
        assert torch.allclose(hess(W), torch.func.hessian(lambda w: ref(X[0], w)[0])(W),
                              atol=1e-9)


@pytest.mark.parametrize("method", ["best", "parameter-shift"])
def test_torch_func_hessian_with_a_state_prepared_in_the_call(method):
    """torch.func.hessian (jacfwd over jacrev) of a qnode whose StatePrep vector is made in
    the call: the rule's jvp runs below the level that recorded the state, and the Hessian
    is exact."""
    def f(w):
        qd.StatePrep(torch.tensor([0.6, 0.8], dtype=torch.float64), wires=0)
        qd.RX(w[0], wires=0)
        return qd.expval(qd.Z(0))
    g = qd.qnode(qd.device("pennylane", name="default.qubit", wires=1), diff_method=method)(f)
    ref = qd.qnode(qd.device("statevector", wires=1), diff_method="backprop")(f)
    w = torch.tensor([0.3], dtype=torch.float64)
    assert torch.allclose(torch.func.hessian(g)(w), torch.func.hessian(ref)(w), atol=1e-10)


@pytest.mark.parametrize("method", ["best", "finite-diff"])
def test_channel_parameters_of_a_batch_on_default_mixed(method):
    """A channel whose probability is a tensor argument, in the batch of shifted bindings a
    gradient sends: PennyLane's channels take one value per parameter, so such a tape runs one
    binding at a time; values and gradients match the closed form."""
    dev = qd.device("pennylane", name="default.mixed", wires=1)

    @qd.qnode(dev, diff_method=method)
    def f(x, p):
        qd.RX(x, 0)
        qd.DepolarizingChannel(p, wires=0)
        return qd.expval(qd.Z(0))
    x = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    p = torch.tensor(0.1, dtype=torch.float64, requires_grad=True)
    v = f(x, p)
    gx, gp = torch.autograd.grad(v, (x, p))
    shrink = 1 - 4 * 0.1 / 3  # depolarizing: <Z> -> (1 - 4p/3) <Z>
    assert abs(float(v) - shrink * math.cos(0.8)) < 1e-9
    assert abs(float(gx) + shrink * math.sin(0.8)) < 1e-6
    assert abs(float(gp) + 4 / 3 * math.cos(0.8)) < 1e-6
