"""PennyLane objects inside a qdiff qnode are recorded (converted) or refused, never dropped;
qnode keywords are validated; ``shots=`` is honoured; device names point to the fix.

Oracles: the same circuit written with qdiff's own gates, PennyLane's default.qubit, closed
forms, and binomial statistics for shots.
"""
import math

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff import QdiffError
from qdiff.circuits.gates import GATES
from qdiff.circuits.pennylane_io import _ADJOINT_OF, _TO_PL

qml = pytest.importorskip("pennylane")

N = 4


def _prep(x):
    for w in range(N):
        qd.RY(x[w], wires=w)
        qd.RZ(x[N + w], wires=w)


def _pl_gate(name):
    if name in _ADJOINT_OF:
        return lambda *a, wires: qml.adjoint(getattr(qml, _ADJOINT_OF[name])(wires=wires))
    if name == "paulirot":
        return lambda a, wires: qml.PauliRot(a, "XYZ", wires=wires)
    return getattr(qml, _TO_PL[name])


@pytest.mark.parametrize("name", sorted(_TO_PL) + sorted(_ADJOINT_OF) + ["paulirot"])
def test_every_shared_gate_same_state_either_way(name):
    """Each gate qdiff and PennyLane share: the qdiff gate and the PennyLane gate inside a qdiff
    qnode give the same final state, equal to default.qubit's."""
    if name == "multirz":
        gate, k = qd.MultiRZ, 3
    elif name == "paulirot":
        gate, k = (lambda a, wires: qd.PauliRot(a, "XYZ", wires=wires)), 3
        gate.num_params = 1
    else:
        gate = GATES[name]
        k = gate.num_wires
    wires = [2, 0, 3, 1][:k]
    gen = torch.Generator().manual_seed(hash(name) % 1000)
    x = torch.rand(2 * N, generator=gen, dtype=torch.float64) * 3
    angles = [torch.rand((), generator=gen, dtype=torch.float64) * 4 - 2
              for _ in range(gate.num_params)]
    dev = qd.device("statevector", wires=N)
    pl_cls = _pl_gate(name)

    @qd.qnode(dev)
    def with_qdiff(x, *a):
        _prep(x)
        gate(*a, wires=wires)
        return qd.state()

    @qd.qnode(dev)
    def with_pennylane(x, *a):
        _prep(x)
        pl_cls(*a, wires=wires)
        return qd.state()

    @qml.qnode(qml.device("default.qubit", wires=N), interface="torch")
    def reference(x, *a):
        for w in range(N):
            qml.RY(x[w], wires=w)
            qml.RZ(x[N + w], wires=w)
        pl_cls(*a, wires=wires)
        return qml.state()

    a = with_qdiff(x, *angles)
    b = with_pennylane(x, *angles)
    ref = reference(x, *angles)
    assert torch.allclose(a, b, atol=1e-12)
    assert torch.allclose(b, ref.to(b.dtype), atol=1e-10)


def test_pennylane_gate_is_not_dropped():
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev)
    def f(x):
        qd.RX(x, 0)
        qml.CNOT([0, 1])
        return qd.expval(qd.Z(1))

    x = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    y = f(x)
    assert torch.allclose(y, torch.cos(x))
    y.backward()
    assert torch.allclose(x.grad, -torch.sin(x.detach()))


@pytest.mark.parametrize("diff_method", ["backprop", "adjoint", "parameter-shift"])
def test_pennylane_parameters_are_differentiable(diff_method):
    """Gradients through PennyLane gates' torch parameters, batched, against default.qubit."""
    dev = qd.device("statevector", wires=3)
    w = torch.rand(2, 3, 3, dtype=torch.float64, requires_grad=True)
    x = torch.rand(5, 3, dtype=torch.float64)

    @qd.qnode(dev, diff_method=diff_method)
    def f(x, w):
        qml.AngleEmbedding(x, wires=range(3))
        qml.StronglyEntanglingLayers(w, wires=range(3))
        qml.CRX(w[0, 0, 0] * 2, wires=[0, 2])
        return [qml.expval(qml.Z(i)) for i in range(3)]

    @qml.qnode(qml.device("default.qubit", wires=3), interface="torch")
    def ref(x, w):
        qml.AngleEmbedding(x, wires=range(3))
        qml.StronglyEntanglingLayers(w, wires=range(3))
        qml.CRX(w[0, 0, 0] * 2, wires=[0, 2])
        return [qml.expval(qml.Z(i)) for i in range(3)]

    out = f(x, w)
    (g,) = torch.autograd.grad(out.sum(), w)
    expect = torch.stack(ref(x, w), dim=-1)
    (g_ref,) = torch.autograd.grad(expect.sum(), w)
    assert out.shape == (5, 3)
    assert torch.allclose(out, expect, atol=1e-10)
    assert torch.allclose(g, g_ref, atol=1e-9)


def test_pennylane_measurements_and_observables():
    dev = qd.device("statevector", wires=2)
    x = torch.tensor([0.3, 1.1], dtype=torch.float64)

    @qd.qnode(dev)
    def f(x):
        qml.RX(x, 0)
        qml.CNOT([0, 1])
        qml.RY(0.4, 1)
        return (qml.expval(qml.Z(0) @ qml.Z(1)), qd.expval(qml.X(1) + 0.5 * qml.Z(0)),
                qml.var(qml.Z(1)), qml.probs(wires=[1]))

    @qml.qnode(qml.device("default.qubit", wires=2), interface="torch")
    def ref(x):
        qml.RX(x, 0)
        qml.CNOT([0, 1])
        qml.RY(0.4, 1)
        return (qml.expval(qml.Z(0) @ qml.Z(1)), qml.expval(qml.X(1) + 0.5 * qml.Z(0)),
                qml.var(qml.Z(1)), qml.probs(wires=[1]))

    for a, b in zip(f(x), ref(x)):
        assert torch.allclose(a, b.to(a.dtype), atol=1e-12)


def test_pennylane_observable_in_expval_is_converted():
    dev = qd.device("statevector", wires=2)
    h = qml.Hamiltonian([0.5, -0.2], [qml.Z(0) @ qml.Z(1), qml.X(1)])

    @qd.qnode(dev)
    def f(x):
        qd.RY(x, 0)
        qd.CNOT([0, 1])
        return qd.expval(h)

    x = torch.tensor(0.9, dtype=torch.float64)
    assert torch.allclose(f(x), torch.tensor(0.5, dtype=torch.float64))  # <ZZ> = 1, <X1> = 0


def test_unconvertible_pennylane_objects_are_refused_by_name():
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev)
    def entropy(x):
        qd.RX(x, 0)
        return qml.vn_entropy(wires=[0])

    with pytest.raises(QdiffError, match=r"PennyLane measurement vnentropy.*not supported"):
        entropy(torch.tensor(0.1))

    @qd.qnode(dev)
    def bad_obs():
        return qd.expval(qml.Hermitian(np.array([[1, 2j], [1, 0]]), wires=0))

    with pytest.raises(QdiffError, match="from_pennylane_observable"):
        bad_obs()


@pytest.mark.parametrize("static", [False, True])
def test_pennylane_transforms_given_a_qdiff_qnode_are_refused_not_left_undone(static):
    """A PennyLane transform applied to a qdiff qnode records it as a quantum function and sees
    none of its gates: ``qml.add_noise`` would leave the noiseless value (0.955 where
    default.mixed gives 0.978), ``qml.adjoint`` return an empty list. The qnode refuses to
    run inside PennyLane's recording, by name; outside, and inside qdiff's own, it runs."""
    dev = qd.device("mixed", wires=2)

    @qd.qnode(dev, static=static)
    def f(x):
        qd.RX(x, 0)
        qd.CNOT([0, 1])
        return qd.expval(qd.Z(1))
    x = torch.tensor(0.3, dtype=torch.float64)
    model = qml.NoiseModel({qml.noise.op_eq(qml.CNOT):
                            qml.noise.partial_wires(qml.AmplitudeDamping, 0.5)})
    for transformed in (qml.add_noise(f, model), qml.adjoint(f), qml.ctrl(f, control=1),
                        qml.transforms.cancel_inverses(f), qml.map_wires(f, {0: 1, 1: 0})):
        with pytest.raises(QdiffError, match="called while PennyLane records a quantum "
                                             "function"):
            transformed(x)
    assert float(f(x)) == pytest.approx(math.cos(0.3), abs=1e-12)


def test_foreign_object_in_recording_is_refused():
    with qd.record() as rec:
        qd.RX(0.1, 0)
    rec.append(object())
    with pytest.raises(QdiffError, match="cannot record"):
        qd.Circuit.from_recording(rec.raw, wires=[0])


# -- keywords -----------------------------------------------------------------------------------


def _f():
    return qd.expval(qd.Z(0))


@pytest.mark.parametrize("kw, match", [
    (dict(interface="autograd"), r"interface='autograd'.*'torch' or 'auto'"),
    (dict(interface="jax"), r"interface='jax'"),
    (dict(max_diff=2), r"unknown keyword\(s\) \['max_diff'\].*'shots'"),
    (dict(cache=False, grad_on_execution=True), r"\['cache', 'grad_on_execution'\]"),
    (dict(shots=0), r"shots must be a positive integer"),
    (dict(shots=2.5), r"shots must be a positive integer"),
])
def test_qnode_refuses_unknown_or_untrue_keywords(kw, match):
    with pytest.raises(QdiffError, match=match):
        qd.qnode(qd.device("statevector", wires=1), **kw)(_f)


@pytest.mark.parametrize("interface", ["torch", "auto"])
def test_qnode_accepts_torch_interface(interface):
    q = qd.qnode(qd.device("statevector", wires=1), interface=interface)(_f)
    assert float(q()) == 1.0


def _binomial_ok(est, p_plus, shots, sigmas=5.0):
    """An estimate of <Z> = 2p - 1 from ``shots`` samples within ``sigmas`` standard errors."""
    sd = 2 * math.sqrt(p_plus * (1 - p_plus) / shots)
    return abs(float(est) - (2 * p_plus - 1)) <= sigmas * sd + 1e-12


def test_qnode_shots_are_honoured_and_per_call_overrides():
    dev = qd.device("statevector", wires=1, seed=11)

    @qd.qnode(dev, shots=20)
    def f(x):
        qd.RX(x, 0)
        return qd.expval(qd.Z(0))

    x = torch.tensor(1.2, dtype=torch.float64)
    p = math.cos(0.6) ** 2
    exact = math.cos(1.2)
    vals = torch.stack([f(x) for _ in range(40)])
    # 20 shots: every estimate is a multiple of 2/20 = 0.1, and they vary
    assert torch.allclose(vals * 10, torch.round(vals * 10), atol=1e-9)
    assert vals.unique().numel() > 1
    assert _binomial_ok(vals.mean(), p, 20 * 40)
    assert float(f(x, shots=None)) == pytest.approx(exact, abs=1e-12)
    big = f(x, shots=200000)
    assert _binomial_ok(big, p, 200000) and float(big) != pytest.approx(exact, abs=1e-12)
    v7 = f(x, shots=7).item() * 7  # (n+ - n-) of 7 shots: an odd integer
    assert v7 == pytest.approx(round(v7), abs=1e-9) and round(v7) % 2 == 1


def test_qnode_shots_sample_and_gradient():
    dev = qd.device("statevector", wires=2, seed=3)

    @qd.qnode(dev, shots=50)
    def s(x):
        qd.RX(x, 0)
        return qd.sample(wires=[0, 1])

    assert s(torch.tensor(0.4)).shape == (50, 2)

    @qd.qnode(dev, shots=40000)
    def f(x):
        qd.RX(x, 0)
        return qd.expval(qd.Z(0))

    x = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    f(x).backward()  # best -> parameter-shift with shots
    sd = math.sqrt(2) * 0.5 * 2 / math.sqrt(40000)
    assert abs(float(x.grad) + math.sin(0.8)) < 6 * sd

    @qd.qnode(dev, shots=10, diff_method="adjoint")
    def g(x):
        qd.RX(x, 0)
        return qd.expval(qd.Z(0))

    with pytest.raises(QdiffError, match=r"adjoint.*shots=10"):
        g(x)
    # exact per call on a shots qnode: adjoint is fine
    g(x, shots=None).backward()


def test_qnode_exact_on_a_shots_device():
    dev = qd.device("statevector", wires=1, shots=5, seed=1)

    @qd.qnode(dev, shots=None)
    def f(x):
        qd.RX(x, 0)
        return qd.expval(qd.Z(0))

    assert float(f(torch.tensor(0.3, dtype=torch.float64))) == pytest.approx(math.cos(0.3))


def test_function_with_its_own_shots_argument_keeps_it():
    dev = qd.device("statevector", wires=1)

    @qd.qnode(dev)
    def f(x, shots):
        qd.RX(x * shots, 0)
        return qd.expval(qd.Z(0))

    assert float(f(torch.tensor(0.1, dtype=torch.float64), shots=3)) == pytest.approx(
        math.cos(0.3))


# -- device names -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["lightning.qubit", "default.qubit", "default.mixed"])
def test_pennylane_device_names_point_to_the_pennylane_backend(name):
    with pytest.raises(QdiffError, match=rf'qd\.device\("pennylane", name="{name}"'):
        qd.device(name, wires=2)


def test_default_qubit_is_not_remapped():
    with pytest.raises(QdiffError, match=r'qd\.device\("statevector"'):
        qd.device("default.qubit", wires=2)


@pytest.mark.parametrize("name", ["statevector", "aer"])
def test_device_refuses_unknown_keywords_by_name(name):
    with pytest.raises(QdiffError, match=r"unknown keyword\(s\) \['shotz'\].*'shots'"):
        qd.device(name, wires=2, shotz=10)


def _pl_and_qdiff(fn, wires, *args, diff_method="best"):
    """Values and gradients of ``fn`` as a qdiff qnode and as a default.qubit qnode."""
    out = []
    for make in (lambda: qd.qnode(qd.device("statevector", wires=wires),
                                  diff_method=diff_method)(fn),
                 lambda: qml.qnode(qml.device("default.qubit", wires=wires),
                                   interface="torch", diff_method="backprop")(fn)):
        a = [t.detach().clone().requires_grad_(True) for t in args]
        y = make()(*a)
        y = torch.stack(list(y)) if isinstance(y, (list, tuple)) else y
        g = torch.autograd.grad(y.real.sum(), a, allow_unused=True)
        out.append((y.detach(), g))
    return out


def _close_grads(gq, gp):
    assert all(x is not None for x in gq), "a trainable argument lost its gradient"
    for x, y in zip(gq, gp):
        assert torch.allclose(x, y, atol=1e-10)


@pytest.mark.parametrize("form", ["Hamiltonian", "dot", "arithmetic"])
def test_pennylane_observable_trainable_coefficients_keep_gradients(form):
    """Trainable coefficients of qml.Hamiltonian / qml.dot / c * op + s_prod: values and
    gradients equal default.qubit's."""
    def fn(x, c):
        qml.RX(x, 0)
        qml.RY(2 * x, 1)
        ops = [qml.Z(0), qml.X(1) @ qml.Z(0)]
        if form == "Hamiltonian":
            h = qml.Hamiltonian(c, ops)
        elif form == "dot":
            h = qml.dot(c, ops)
        else:
            h = c[0] * ops[0] + qml.s_prod(c[1], ops[1])
        return qml.expval(h)
    args = (torch.tensor(0.7, dtype=torch.float64), torch.tensor([0.3, -1.2], dtype=torch.float64))
    (yq, gq), (yp, gp) = _pl_and_qdiff(fn, 2, *args)
    assert torch.allclose(yq, yp, atol=1e-12)
    _close_grads(gq, gp)


def test_pennylane_hermitian_with_trainable_matrix():
    """qml.Hermitian of a tensor that requires grad: backprop (and best) give default.qubit's
    gradient; a rule that cannot differentiate the matrix refuses it by name."""
    def fn(x, a):
        qml.RX(x, 0)
        qml.RY(x, 1)
        return qml.expval(qml.Hermitian(a + a.T, wires=[1]))
    args = (torch.tensor(0.7, dtype=torch.float64),
            torch.tensor([[0.2, 0.5], [-0.1, 0.9]], dtype=torch.float64))
    for dm in ("best", "backprop"):
        (yq, gq), (yp, gp) = _pl_and_qdiff(fn, 2, *args, diff_method=dm)
        assert torch.allclose(yq, yp, atol=1e-12)
        _close_grads(gq, gp)
    with pytest.raises(QdiffError, match="trainable matrix.*backprop"):
        _pl_and_qdiff(fn, 2, *args, diff_method="adjoint")


@pytest.mark.parametrize("case", ["global_phase", "global_phase_no_wires", "grover",
                                  "single_excitation_plus"])
def test_pennylane_global_phase_is_kept_in_the_state(case):
    """qml.GlobalPhase (written, or from a decomposition: GroverOperator,
    SingleExcitationPlus) multiplies the state as on default.qubit; values and gradients."""
    def fn(x):
        qml.Hadamard(0)
        qml.RY(x, 1)
        if case == "global_phase":
            qml.GlobalPhase(x, wires=1)
        elif case == "global_phase_no_wires":
            qml.GlobalPhase(2 * x)
        elif case == "grover":
            qml.GroverOperator(wires=[0, 1])
        else:
            qml.SingleExcitationPlus(x, wires=[0, 1])
        return qml.state()
    x = torch.tensor(0.7, dtype=torch.float64)
    (yq, gq), (yp, gp) = _pl_and_qdiff(fn, 2, x, diff_method="backprop")
    assert torch.allclose(yq, yp, atol=1e-12)
    _close_grads(gq, gp)


@pytest.mark.parametrize("wires", [[1], [0, 1]])
def test_pennylane_stateprep_gradient_is_that_of_the_amplitudes(wires):
    """qml.StatePrep of a trainable (normalised) vector: gradients with respect to its
    amplitudes equal default.qubit's (PennyLane takes the vector as given)."""
    def fn(v):
        qml.StatePrep(v, wires=wires)
        return [qml.expval(qml.Z(0)), qml.expval(qml.Z(1)), qml.expval(qml.X(1))]
    v = torch.tensor([0.6, 0.8] if len(wires) == 1 else [0.5, -0.1, 0.7, 0.5],
                     dtype=torch.float64)
    v = v / v.norm()
    (yq, gq), (yp, gp) = _pl_and_qdiff(fn, 2, v, diff_method="backprop")
    assert torch.allclose(yq, yp, atol=1e-12)
    _close_grads(gq, gp)


def test_pennylane_stateprep_after_gates_is_decomposed():
    """qml.StatePrep / AmplitudeEmbedding after other gates run as on default.qubit (its
    decomposition); values and gradients."""
    def fn(x, v):
        qml.RX(x, 0)
        qml.CNOT([0, 1])
        qml.StatePrep(v, wires=[1, 2], normalize=True)
        qml.AmplitudeEmbedding(v[:2], wires=[0], normalize=True)
        return qml.state()
    args = (torch.tensor(0.7, dtype=torch.float64),
            torch.tensor([0.6, 0.1, -0.3, 0.5], dtype=torch.float64))
    (yq, gq), (yp, gp) = _pl_and_qdiff(fn, 3, *args, diff_method="backprop")
    assert torch.allclose(yq, yp, atol=1e-12)
    _close_grads(gq, gp)


def test_pennylane_qubit_unitary_with_trainable_matrix():
    """qml.QubitUnitary of a matrix that requires grad: values and gradients equal
    default.qubit's, on one wire (PennyLane's Rot form, every method) and on more wires (the
    gate qd.QubitUnitary makes, differentiated by backprop; another method is refused by
    name)."""
    def fn(x, a):
        qml.RX(x, 0)
        qml.QubitUnitary(torch.matrix_exp(1j * (a + a.T)), wires=[0])
        return [qml.expval(qml.Z(0)), qml.expval(qml.Y(0))]
    args = (torch.tensor(0.7, dtype=torch.float64),
            torch.tensor([[0.2, 0.5], [-0.1, 0.9]], dtype=torch.float64))
    (yq, gq), (yp, gp) = _pl_and_qdiff(fn, 1, *args, diff_method="backprop")
    assert torch.allclose(yq, yp, atol=1e-12)
    _close_grads(gq, gp)

    def wide(x, a):
        qml.Hadamard(0)
        qml.RY(x, 1)
        qml.QubitUnitary(torch.matrix_exp(1j * (a + a.T)), wires=[2, 0, 1])
        return [qml.expval(qml.Z(0) @ qml.X(2)), qml.expval(qml.Y(1))]
    args = (torch.tensor(0.3, dtype=torch.float64),
            torch.rand(8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2)))
    (yq, gq), (yp, gp) = _pl_and_qdiff(wide, 3, *args, diff_method="backprop")
    assert torch.allclose(yq, yp, atol=1e-12)
    _close_grads(gq, gp)

    @qd.qnode(qd.device("statevector", wires=2), diff_method="adjoint")
    def two(a):
        qml.QubitUnitary(torch.matrix_exp(1j * (a + a.T)), wires=[0, 1])
        return qml.expval(qml.Z(0))
    with pytest.raises(QdiffError, match=r"QubitUnitary.*requires grad.*backprop"):
        two(torch.rand(4, 4, dtype=torch.float64, requires_grad=True))


def test_pennylane_qubit_unitary_with_a_trainable_matrix_that_is_not_unitary_is_refused():
    """The differentiable one-wire form of a trainable qml.QubitUnitary holds for a unitary
    only: any other matrix is refused by name, whatever the diff method."""
    m = torch.tensor([[1.0, 0.5], [0.2, 0.9]], dtype=torch.complex128)
    for method in ("backprop", "adjoint", "parameter-shift"):
        @qd.qnode(qd.device("statevector", wires=1), diff_method=method)
        def f(p):
            qml.QubitUnitary(m * p, wires=[0])
            return qd.expval(qd.Z(0))
        with pytest.raises(QdiffError, match=r"QubitUnitary on wires \[0\]: matrix is not unitary"):
            f(torch.tensor(0.37, dtype=torch.float64, requires_grad=True))


@pytest.mark.parametrize("make", [
    lambda p: qml.exp(qml.X(0) @ qml.Y(1), 1j * p),
    lambda p: qml.evolve(0.7 * qml.Z(0) @ qml.X(1), p),
    lambda p: qml.exp(2.0 * (qml.Y(1) @ qml.X(0)), -0.5j * p),
], ids=["exp", "evolve", "scaled-exp"])
@pytest.mark.parametrize("diff_method", ["backprop", "adjoint", "parameter-shift"])
@pytest.mark.parametrize("shape", [(), (3,)])
def test_pennylane_exp_of_a_pauli_word_with_torch_parameters(make, diff_method, shape):
    """qml.exp / qml.evolve of a (scaled) Pauli word with a torch parameter, broadcast or not:
    values and gradients equal default.qubit's."""
    def fn(p):
        qml.RY(0.4, 0)
        qml.RX(0.3, 1)
        make(p)
        return qml.expval(qml.Z(0) + 0.5 * qml.X(1) + 0.3 * qml.Y(0))
    x = torch.linspace(0.2, 0.9, 3, dtype=torch.float64).reshape(shape or (3,))
    x = x if shape else x[1]
    (yq, gq), (yp, gp) = _pl_and_qdiff(fn, 2, x, diff_method=diff_method)
    assert torch.allclose(yq, yp, atol=1e-12)
    _close_grads(gq, gp)


@pytest.mark.parametrize("diff_method", ["backprop", "adjoint", "parameter-shift"])
def test_pennylane_evolve_of_a_pauli_word_with_a_trainable_coefficient(diff_method):
    def fn(c):
        qml.RY(0.2, 0)
        qml.RY(0.5, 1)
        qml.evolve(c[0] * qml.X(0) @ qml.Y(1), 0.5)
        qml.exp(c[1] * (qml.Z(0) @ qml.X(1)), -0.7j)
        return qml.expval(qml.X(0) @ qml.Y(1) + qml.Z(1))
    (yq, gq), (yp, gp) = _pl_and_qdiff(fn, 2, torch.tensor([0.3, -0.5], dtype=torch.float64),
                                       diff_method=diff_method)
    assert torch.allclose(yq, yp, atol=1e-12)
    _close_grads(gq, gp)


def test_pennylane_sparse_state_prep():
    """qml.StatePrep of a scipy sparse vector gives default.qubit's state."""
    sp = pytest.importorskip("scipy.sparse")
    v = np.zeros(8)
    v[1], v[6] = 0.6, 0.8

    def fn():
        qml.StatePrep(sp.csr_matrix(v), wires=[2, 0, 1])
        qml.RY(0.4, 1)
        return qml.state()
    ref = qml.qnode(qml.device("default.qubit", wires=3))(fn)()
    ours = qd.qnode(qd.device("statevector", wires=3))(fn)()
    assert np.allclose(ours.numpy(), np.asarray(ref), atol=1e-12)


def test_pennylane_decomposition_failures_are_refused_by_name():
    """An operator PennyLane cannot decompose for these parameters (a broadcast non-unitary
    exp) is a QdiffError naming it, not PennyLane's internal error."""
    @qd.qnode(qd.device("statevector", wires=1))
    def f(p):
        qml.exp(qml.X(0), p)
        return qd.state()
    with pytest.raises(QdiffError, match=r"PennyLane could not decompose Exp"):
        f(torch.tensor([0.2, 0.5], dtype=torch.float64))


@pytest.mark.parametrize("diff_method", ["backprop", "adjoint", "parameter-shift"])
def test_pennylane_qsvt_of_a_constant_block_encoding(diff_method):
    """qml.QSVT of a constant qml.BlockEncode (an operator known by its matrix only): values
    and gradients of the trainable phases equal default.qubit's."""
    a = np.array([[0.2, 0.1], [0.1, -0.3]])

    def fn(p):
        qml.RY(0.3, 0)
        qml.RX(0.4, 1)
        qml.QSVT(qml.BlockEncode(a, wires=[0, 1]),
                 [qml.PCPhase(p[i], dim=2, wires=[0, 1]) for i in range(3)])
        return qml.expval(qml.Z(0) + 0.3 * qml.X(1))
    (yq, gq), (yp, gp) = _pl_and_qdiff(fn, 2, torch.tensor([0.1, -0.7, 1.2], dtype=torch.float64),
                                       diff_method=diff_method)
    assert torch.allclose(yq, yp, atol=1e-12)
    _close_grads(gq, gp)


def test_pennylane_qutrit_operations_are_refused_by_name():
    @qd.qnode(qd.device("statevector", wires=2))
    def f():
        qml.QutritBasisStatePreparation([1, 2], wires=range(2))
        return qd.state()
    with pytest.raises(QdiffError, match=r"TShift on wires \[0\]: a 3x3 matrix is not a qubit "
                                         r"operator"):
        f()


def _qubit_gate_names():
    """PennyLane's qubit operator classes (``qml.ops.qubit``)."""
    from pennylane.operation import Operator
    return sorted(n for n in dir(qml.ops.qubit) if n[0].isupper()
                  and isinstance(getattr(qml.ops.qubit, n), type)
                  and issubclass(getattr(qml.ops.qubit, n), Operator))


def test_every_pennylane_qubit_gate_is_a_qdiff_gate_or_a_documented_refusal():
    """``qd.NAME`` for each of PennyLane's qubit operators: a qdiff gate (or gate family), or
    a refusal raising QdiffError that names the operator and a replacement, listed in the
    README's "Coming from PennyLane" section."""
    import os
    from qdiff.circuits.gates import Gate, _Family
    from qdiff.circuits.refusals import Refused
    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()
    section = readme.split("## Coming from PennyLane", 1)[1].split("\n## ", 1)[0]
    names = _qubit_gate_names()
    assert {"IsingXY", "PSWAP", "Barrier", "SpecialUnitary", "GlobalPhase"} <= set(names)
    refused = []
    for name in names:
        obj = getattr(qd, name)
        if isinstance(obj, Refused):
            with pytest.raises(QdiffError, match=f"^{name}: .*use instead: "):
                obj(0.1, wires=[0, 1])
            assert f"`{name}`" in section, name
            refused.append(name)
        elif name not in ("BasisState", "StatePrep", "Hermitian"):  # templates, observable
            assert isinstance(obj, (Gate, _Family)), (name, obj)
    assert {"Barrier", "Snapshot", "WireCut", "Projector", "SpecialUnitary",
            "BlockEncode"} <= set(refused)


def _value_and_grad(qnode, x):
    x = x.detach().clone().requires_grad_(True)
    y = qnode(x)
    (g,) = torch.autograd.grad(y.real.sum() + y.imag.sum(), [x])
    return y.detach(), g


@pytest.mark.parametrize("case", ["global_phase", "ctrl_global_phase", "pcphase",
                                  "diagonal", "sqisw", "adjoint_carry"])
def test_qdiff_forms_of_pennylane_gates_give_default_qubits_state(case):
    """The gates written with qdiff's names give default.qubit's state (global phase
    included) and its gradients."""
    d = np.exp(1j * np.array([0.1, -0.4, 0.7, 1.2]))

    def body(mod, x):
        mod.Hadamard(0)
        mod.RY(x, 1)
        mod.CNOT([1, 2])
        mod.RX(0.4, 3)
        if case == "global_phase":
            mod.GlobalPhase(x, wires=[2, 1])
        elif case == "ctrl_global_phase":
            mod.ctrl(mod.GlobalPhase(2 * x, wires=2), control=0)
        elif case == "pcphase":
            mod.PCPhase(x, 3, wires=[1, 2])
        elif case == "diagonal":
            mod.DiagonalQubitUnitary(d, wires=[0, 2])
        elif case == "sqisw":
            mod.SQISW(wires=[0, 1])
        else:
            mod.adjoint(mod.QubitCarry(wires=[3, 0, 1, 2]))
            mod.adjoint(mod.SISWAP(wires=[1, 2]))
        return mod.state()

    x = torch.tensor(0.7, dtype=torch.float64)
    yq, gq = _value_and_grad(qd.qnode(qd.device("statevector", wires=4),
                                      diff_method="backprop")(lambda x: body(qd, x)), x)
    yp, gp = _value_and_grad(qml.qnode(qml.device("default.qubit", wires=4), interface="torch",
                                       diff_method="backprop")(lambda x: body(qml, x)), x)
    assert torch.allclose(yq, yp, atol=1e-12)
    assert torch.allclose(gq, gp, atol=1e-10)


def test_qdiff_global_phase_needs_wires():
    with pytest.raises(QdiffError, match="GlobalPhase: give the wires"):
        qd.GlobalPhase(0.3)
    with pytest.raises(QdiffError, match="PCPhase: dim"):
        qd.PCPhase(0.3, 5, wires=[0, 1])
    with pytest.raises(QdiffError, match="DiagonalQubitUnitary: the diagonal is not unitary"):
        qd.DiagonalQubitUnitary([1.0, 0.5], wires=0)


def _sel_block(weights, wires):
    qml.StronglyEntanglingLayers(weights, wires=wires)


_S, _D = [[0, 2], [1, 3]], [[0, 1, 2, 3]]
_SW, _DW = [[0, 1, 2], [1, 2, 3]], [[[0, 1], [2, 3]]]
_HF = np.array([1, 1, 0, 0])


def _h3():
    return 0.3 * qml.X(0) @ qml.X(1) + 0.5 * qml.Z(1) + 0.2 * qml.Y(0) @ qml.Y(2)


#: (name, wires, parameter shape or None, body(p)); the first ones run by default
_TEMPLATES = [
    ("StronglyEntanglingLayers", 3, (2, 3, 3),
     lambda p: qml.StronglyEntanglingLayers(p, wires=range(3), ranges=[2, 1], imprimitive=qml.CZ)),
    ("IQPEmbedding", 3, (3,), lambda p: qml.IQPEmbedding(p, wires=[2, 0, 1], n_repeats=2)),
    ("UCCSD", 4, (3,), lambda p: qml.UCCSD(p, wires=range(4), s_wires=_SW, d_wires=_DW,
                                            init_state=_HF)),
    ("ApproxTimeEvolution", 3, (1,), lambda p: qml.ApproxTimeEvolution(_h3(), p[0], 2)),
    ("QSVT", 2, (3,), lambda p: qml.QSVT(qml.BlockEncode(np.array([[0.2, 0.1], [0.1, -0.3]]),
                                                         wires=[0, 1]),
                                         [qml.PCPhase(p[i], dim=2, wires=[0, 1])
                                          for i in range(3)])),
    ("Select", 3, (2,), lambda p: qml.Select([qml.RX(p[0], 2), qml.RY(p[1], 2), qml.Z(2),
                                               qml.Hadamard(2)], control=[0, 1])),
    ("QROM", 5, None, lambda p: qml.QROM(["01", "11", "10", "00"], control_wires=[0, 1],
                                          target_wires=[2, 3], work_wires=[4], clean=False)),
    ("Adder", 3, None, lambda p: qml.Adder(3, x_wires=[0, 1, 2])),
    # the broad sweep (-m slow)
    ("RandomLayers", 4, (2, 3), lambda p: qml.RandomLayers(p, wires=range(4), seed=42)),
    ("SimplifiedTwoDesign", 3, (2, 2, 2), lambda p: qml.SimplifiedTwoDesign(
        initial_layer_weights=torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64), weights=p,
        wires=range(3))),
    ("GateFabric", 4, (1, 1, 2), lambda p: qml.GateFabric(p, wires=range(4), init_state=_HF,
                                                          include_pi=True)),
    ("kUpCCGSD", 4, (1, 6), lambda p: qml.kUpCCGSD(p, wires=range(4), k=1, init_state=_HF)),
    ("ParticleConservingU1", 4, (1, 3, 2),
     lambda p: qml.ParticleConservingU1(p, wires=range(4), init_state=_HF)),
    ("ParticleConservingU2", 4, (1, 7),
     lambda p: qml.ParticleConservingU2(p, wires=range(4), init_state=_HF)),
    ("AllSinglesDoubles", 4, (3,), lambda p: qml.AllSinglesDoubles(p, range(4), _HF, _S, _D)),
    ("QuantumPhaseEstimation", 4, (1,), lambda p: qml.QuantumPhaseEstimation(
        qml.RX(p[0], wires=0), estimation_wires=[1, 2, 3])),
    ("ArbitraryStatePreparation", 3, (14,),
     lambda p: qml.ArbitraryStatePreparation(p, wires=range(3))),
    ("MottonenStatePreparation", 3, (8,), lambda p: qml.MottonenStatePreparation(
        p / torch.linalg.norm(p), wires=range(3))),
    ("BasisEmbedding", 3, None, lambda p: qml.BasisEmbedding(5, wires=range(3))),
    ("TrotterProduct", 3, (1,), lambda p: qml.TrotterProduct(_h3(), p[0], n=2, order=2)),
    ("CommutingEvolution", 3, (1,), lambda p: qml.CommutingEvolution(
        0.3 * qml.Z(0) @ qml.Z(1) + 0.5 * qml.Z(1), p[0], frequencies=(0.6, 1.0, 1.6))),
    ("Permute", 4, None, lambda p: qml.Permute([2, 0, 3, 1], wires=range(4))),
    ("FlipSign", 3, None, lambda p: qml.FlipSign([1, 0, 1], wires=range(3))),
    ("GroverOperator", 4, None, lambda p: qml.GroverOperator(wires=range(3), work_wires=[3])),
    ("AQFT", 4, None, lambda p: qml.AQFT(order=1, wires=range(4))),
    ("PrepSelPrep", 3, None, lambda p: qml.PrepSelPrep(0.4 * qml.X(2) + 0.3 * qml.Z(2),
                                                       control=[0])),
    ("Reflection", 3, (1,), lambda p: qml.Reflection(qml.Hadamard(1), alpha=p[0])),
    ("AmplitudeAmplification", 3, None, lambda p: qml.AmplitudeAmplification(
        qml.Hadamard(0) @ qml.Hadamard(1), qml.FlipSign([1, 1], wires=[0, 1]), iters=2)),
    ("Qubitization", 3, None, lambda p: qml.Qubitization(
        0.4 * qml.X(2) + 0.3 * qml.Z(2) + 0.1 * qml.Y(2), control=[0, 1])),
    ("MPS", 4, (3, 1, 2, 3), lambda p: qml.MPS(range(4), 2, _sel_block, 3, template_weights=p)),
    ("TTN", 4, (3, 1, 2, 3), lambda p: qml.TTN(range(4), 2, _sel_block, 3, template_weights=p)),
    ("Multiplier", 5, None, lambda p: qml.Multiplier(3, x_wires=[0, 1], work_wires=[2, 3, 4])),
    ("PhaseAdder", 3, None, lambda p: qml.PhaseAdder(3, x_wires=[0, 1, 2])),
    ("OutAdder", 4, None, lambda p: qml.OutAdder(x_wires=[0], y_wires=[1],
                                                 output_wires=[2, 3])),
    ("ModExp", 7, None, lambda p: qml.ModExp(x_wires=[0], output_wires=[1, 2], base=2, mod=3,
                                             work_wires=[3, 4, 5, 6])),
    ("QuantumMonteCarlo", 4, None, lambda p: qml.QuantumMonteCarlo(
        np.array([0.25, 0.75]), lambda i: np.sin(i) ** 2, target_wires=[0, 1],
        estimation_wires=[2, 3])),
    ("ControlledSequence", 4, (1,), lambda p: qml.ControlledSequence(qml.RX(p[0], wires=0),
                                                                     control=[1, 2, 3])),
    ("Superposition", 4, None, lambda p: qml.Superposition(
        np.sqrt(np.array([0.5, 0.3, 0.2])), bases=[[1, 0, 0], [0, 1, 0], [0, 0, 1]],
        wires=[0, 1, 2], work_wire=[3])),
    ("FABLE", 3, None, lambda p: qml.FABLE(np.array([[0.1, 0.2], [0.3, 0.4]]), wires=range(3))),
    ("QAOAEmbedding", 3, (2, 6), lambda p: qml.QAOAEmbedding(
        features=torch.tensor([0.3, 0.1, 0.2], dtype=torch.float64), weights=p, wires=range(3))),
    ("BasisRotation", 2, None, lambda p: qml.BasisRotation(
        wires=range(2), unitary_matrix=np.array([[0.6, 0.8], [-0.8, 0.6]]))),
    ("GQSP", 2, (3, 3), lambda p: qml.GQSP(qml.RX(0.3, wires=1), p, control=0)),
    ("evolve", 3, (1,), lambda p: qml.evolve(0.7 * qml.Z(0) @ qml.X(2), p[0])),
    ("adjoint-template", 3, (1, 3, 3),
     lambda p: qml.adjoint(qml.StronglyEntanglingLayers)(p, wires=range(3))),
    ("ctrl-template", 3, (1, 2, 3), lambda p: qml.ctrl(qml.StronglyEntanglingLayers, control=2,
                                                       control_values=0)(p, wires=range(2))),
]
_DEFAULT_TEMPLATES = 8


@pytest.mark.parametrize("name,n,shape,body", [
    pytest.param(*c, id=c[0], marks=() if i < _DEFAULT_TEMPLATES else pytest.mark.slow)
    for i, c in enumerate(_TEMPLATES)])
def test_pennylane_templates_in_a_qdiff_qnode_and_on_the_device_match_default_qubit(
        name, n, shape, body):
    """PennyLane templates inside a qdiff qnode (backprop and adjoint) and on the
    qdiff.statevector PennyLane device: the state, and an expectation's value and gradient,
    equal default.qubit's (after a generic layer, so no template acts on |0...0> only)."""
    pre = np.random.default_rng(7).uniform(-1.5, 1.5, n)
    p0 = None if shape is None else \
        torch.tensor(np.random.default_rng(8).uniform(-1.5, 1.5, shape), dtype=torch.float64)
    obs = (lambda m: sum((0.3 + 0.1 * i) * m.Z(i) for i in range(n)) +
           0.4 * m.X(0) @ m.Y(n - 1))

    def pl_fn(state):
        def fn(p):
            for i in range(n):
                qml.RY(float(pre[i]), wires=i)
            body(p)
            return qml.state() if state else qml.expval(obs(qml))
        return fn

    def qd_fn(state):
        def fn(p):
            for i in range(n):
                qd.RY(float(pre[i]), wires=i)
            body(p)
            return qd.state() if state else qd.expval(obs(qd))
        return fn
    ref = {s: qml.QNode(pl_fn(s), qml.device("default.qubit", wires=n), interface="torch",
                        diff_method="backprop") for s in (True, False)}
    ours = [(qd.qnode(qd.device("statevector", wires=n), diff_method=m)(qd_fn(s)), s)
            for m in ("backprop", "adjoint") for s in (True, False)]
    ours += [(qml.QNode(pl_fn(s), qml.device("qdiff.statevector", wires=n), interface="torch",
                        diff_method="best"), s) for s in (True, False)]
    for f, state in ours:
        if state:
            a, b = f(p0), ref[True](p0)
            a, b = (t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
                    for t in (a, b))
            assert np.allclose(a, b, atol=1e-10), name
        elif p0 is not None:
            x, y = p0.clone().requires_grad_(), p0.clone().requires_grad_()
            a, b = f(x), ref[False](y)
            a.backward()
            b.backward()
            assert abs(float(a) - float(b)) < 1e-10, name
            assert torch.allclose(x.grad, y.grad, atol=1e-10), name


def test_complex_numpy_state_preparations_keep_their_imaginary_parts():
    """A PennyLane state preparation given a complex numpy vector (StatePrep,
    AmplitudeEmbedding, MottonenStatePreparation) keeps its complex amplitudes; a gate angle
    with an imaginary part is refused, not cut to its real part."""
    qml = pytest.importorskip("pennylane")
    dev = qd.device("statevector", wires=2)
    vec = np.array([1, 1j, 0, 0]) / np.sqrt(2)
    for make in (qml.StatePrep, qml.AmplitudeEmbedding, qml.MottonenStatePreparation):
        out = qd.qnode(dev)(lambda: (make(vec, wires=[0, 1]), qd.expval(qd.Y(1)))[-1])()
        assert float(out) == pytest.approx(1.0, abs=1e-12), make.__name__
    with pytest.raises(qd.QdiffError, match="has an imaginary part"):
        qd.qnode(dev)(lambda: (qml.RX(np.array(0.3 + 0.2j), wires=0),
                               qd.expval(qd.Z(0)))[-1])()
