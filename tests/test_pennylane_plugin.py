"""The PennyLane device ``qml.device("qdiff.statevector")`` against ``default.qubit``: values of
random circuits (every measurement kind), adjoint and backprop gradients, parameter
broadcasting, shot statistics, one engine call per batch, and bad input. PennyLane's own device
suite runs on the device in CI (.ci/run)."""
from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest
import torch

qml = pytest.importorskip("pennylane")
from pennylane import numpy as pnp  # noqa: E402
from pennylane.exceptions import DeviceError  # noqa: E402

from qdiff.backends.statevector import StatevectorBackend  # noqa: E402

N = 4
ONE = ["RX", "RY", "RZ", "PhaseShift", "Hadamard", "S", "T", "SX", "PauliX", "PauliY"]
TWO = ["CNOT", "CZ", "CRX", "CRY", "IsingXX", "IsingXY", "IsingZZ", "SWAP", "ISWAP", "CRot",
       "SingleExcitation", "PSWAP", "ECR", "CPhaseShift01", "SingleExcitationPlus",
       "FermionicSWAP", "SISWAP"]


def random_ops(rng, n=N, depth=14, params=None, extras=True):
    """A random circuit; ``params`` (a tensor) supplies the angles when given."""
    ops, k = [], 0
    for _ in range(depth):
        if rng.random() < 0.5:
            name = ONE[rng.integers(len(ONE))]
            wires = [int(rng.integers(n))]
        else:
            name = TWO[rng.integers(len(TWO))]
            wires = [int(w) for w in rng.choice(n, 2, replace=False)]
        cls = getattr(qml, name)
        np_ = cls.num_params
        if np_:
            ang = [params[(k + i) % len(params)] for i in range(np_)] if params is not None \
                else list(rng.uniform(-np.pi, np.pi, np_))
            k += np_
            ops.append(cls(*ang, wires=wires))
        else:
            ops.append(cls(wires=wires))
    if extras:
        ops.append(qml.PauliRot(0.37, "XYZ", wires=[0, 1, 2]))
        ops.append(qml.GlobalPhase(0.21))
        ops.append(qml.QFT(wires=[1, 2, 3]))
    return ops


def both(qfunc, n=N, **kw):
    return (qml.QNode(qfunc, qml.device("qdiff.statevector", wires=n), **kw),
            qml.QNode(qfunc, qml.device("default.qubit", wires=n), **kw))


def close(a, b, atol=1e-10):
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            close(x, y, atol)
        return
    a = a.detach().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, atol=atol, rtol=0)


def test_the_entry_point_is_registered():
    names = [e.name for e in importlib.metadata.entry_points(group="pennylane.plugins")]
    assert "qdiff.statevector" in names
    dev = qml.device("qdiff.statevector", wires=2)
    assert dev.name == "qdiff.statevector"


@pytest.mark.parametrize("seed", range(6))
def test_random_circuits_every_measurement_equals_default_qubit(seed):
    rng = np.random.default_rng(seed)
    ops = random_ops(rng)
    H = 0.3 * qml.X(0) @ qml.Y(2) - 0.7 * qml.Z(1) + 0.2 * qml.Hermitian(
        np.array([[1.0, 0.5j], [-0.5j, 2.0]]), wires=3)

    def circuit():
        for op in ops:
            qml.apply(op)
        return (qml.expval(qml.Z(0)), qml.expval(H), qml.var(qml.X(1) @ qml.Z(3)),
                qml.probs(wires=[2, 0]), qml.state(), qml.density_matrix(wires=[1, 3]),
                qml.expval(qml.Projector([1, 0], wires=[0, 2])))

    a, b = both(circuit)
    close(a(), b())


@pytest.mark.parametrize("seed", range(3))
def test_adjoint_gradients_equal_default_qubit_backprop(seed):
    rng = np.random.default_rng(100 + seed)
    x = pnp.array(rng.uniform(-np.pi, np.pi, 9), requires_grad=True)

    def circuit(x):
        for op in random_ops(np.random.default_rng(seed), params=x):
            qml.apply(op)
        return qml.expval(qml.Z(0) @ qml.X(2)), qml.var(qml.Y(1)), qml.probs(wires=[3])

    a, b = both(circuit, diff_method="adjoint")
    ref = qml.QNode(circuit, qml.device("default.qubit", wires=N), diff_method="backprop")
    ja = qml.jacobian(lambda x: qml.math.hstack(a(x)))(x)
    jr = qml.jacobian(lambda x: qml.math.hstack(ref(x)))(x)
    close(ja, jr)


def sel_circuit(n):
    def circuit(x, w):
        qml.AngleEmbedding(x, wires=range(n))
        qml.StronglyEntanglingLayers(w, wires=range(n))
        return [qml.expval(qml.Z(i)) for i in range(n)]
    return circuit


@pytest.mark.parametrize("device_vjp", [False, True])
def test_torch_adjoint_with_broadcasting_equals_default_qubit(device_vjp):
    torch.manual_seed(0)
    x = torch.rand(7, N, dtype=torch.float64, requires_grad=True)
    w = torch.rand(2, N, 3, dtype=torch.float64, requires_grad=True)
    a = qml.QNode(sel_circuit(N), qml.device("qdiff.statevector", wires=N), interface="torch",
                  diff_method="adjoint", device_vjp=device_vjp)
    r = qml.QNode(sel_circuit(N), qml.device("default.qubit", wires=N), interface="torch",
                  diff_method="backprop")
    oa, orf = torch.stack(a(x, w)), torch.stack(r(x, w))
    assert oa.shape == (N, 7)
    close(oa, orf)
    ga = torch.autograd.grad((oa ** 2).sum(), (x, w))
    gr = torch.autograd.grad((orf ** 2).sum(), (x, w))
    close(ga, gr)


def test_torch_backprop_through_the_engine_equals_default_qubit():
    torch.manual_seed(1)
    x = torch.rand(5, 3, dtype=torch.float64, requires_grad=True)
    w = torch.rand(2, 3, 3, dtype=torch.float64, requires_grad=True)
    dev = qml.device("qdiff.statevector", wires=3)
    config = qml.devices.ExecutionConfig(gradient_method="backprop", interface="torch")
    assert dev.supports_derivatives(config)
    with qml.queuing.AnnotatedQueue() as q:
        sel_circuit(3)(x, w)
        qml.probs(wires=[0, 2])
    tape = qml.tape.QuantumScript.from_queue(q)
    [res] = qml.execute([tape], dev, diff_method="backprop", interface="torch")
    [ref] = qml.execute([tape], qml.device("default.qubit", wires=3), diff_method="backprop",
                        interface="torch")
    close(res, ref)
    loss = lambda r: sum((t ** 2).sum() for t in r)  # noqa: E731
    close(torch.autograd.grad(loss(res), (x, w)), torch.autograd.grad(loss(ref), (x, w)))


def test_broadcast_tapes_run_as_one_engine_job(monkeypatch):
    calls = []
    orig = StatevectorBackend.execute

    def spy(self, jobs):
        calls.append([tuple(j.theta.shape) for j in jobs])
        return orig(self, jobs)

    monkeypatch.setattr(StatevectorBackend, "execute", spy)
    x = pnp.array(np.random.default_rng(0).uniform(size=(32, N)), requires_grad=False)
    w = pnp.array(np.random.default_rng(1).uniform(size=(2, N, 3)), requires_grad=True)
    f = qml.QNode(sel_circuit(N), qml.device("qdiff.statevector", wires=N))
    f(x, pnp.array(w, requires_grad=False))
    assert calls == [[(32, N + 2 * N * 3)]]  # one call, one job, 32 rows
    calls.clear()
    g = qml.QNode(sel_circuit(N), qml.device("qdiff.statevector", wires=N),
                  diff_method="adjoint")
    sweeps = []
    vjp = StatevectorBackend.vjp
    monkeypatch.setattr(StatevectorBackend, "vjp", lambda self, jobs, cots, res: (
        sweeps.append([tuple(c.shape) for c in cots]), vjp(self, jobs, cots, res))[1])
    qml.jacobian(lambda w: qml.math.stack(g(x, w)))(w)
    # broadcast_expand gives 32 tapes: merged into one job; one forward over the 32 rows, one
    # reverse sweep over them repeated once per output
    assert calls == [[(32, N + 2 * N * 3)]]
    assert sweeps == [[(32 * N, N)]]


def test_shot_statistics_agree_with_exact_values():
    ops = random_ops(np.random.default_rng(7), n=3, depth=8, extras=False)

    def circuit():
        for op in ops:
            qml.apply(op)
        return qml.expval(qml.Z(0) @ qml.X(1)), qml.var(qml.Y(2)), qml.probs(wires=[0, 1])

    exact = qml.QNode(circuit, qml.device("default.qubit", wires=3))()
    shots = 40000
    got = qml.QNode(circuit, qml.device("qdiff.statevector", wires=3, shots=shots, seed=11))()
    sd = 1 / np.sqrt(shots)
    assert abs(got[0] - exact[0]) < 6 * sd * 1.0
    assert abs(got[1] - exact[1]) < 6 * sd * 1.0
    assert np.all(np.abs(got[2] - exact[2]) < 6 * sd)



@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
def test_shots_keep_every_result_after_a_one_term_hamiltonian(name):
    """expval of ``qml.Hamiltonian([0.5], [Z(0)])`` (a one-term LinearCombination) first among
    commuting measurements: with shots every measurement still has its own result (PennyLane
    0.45's sampler returns the first result of such a group only), a shot vector too."""
    def circuit(x):
        qml.RX(x, wires=0)
        qml.RX(2 * x, wires=2)
        return (qml.expval(qml.Hamiltonian([0.5], [qml.Z(0)])), qml.expval(qml.Z(1)),
                qml.expval(qml.Z(2)), qml.var(qml.X(0)))
    exact = qml.QNode(circuit, qml.device("default.qubit", wires=3))(0.3)
    got = qml.QNode(circuit, qml.device(name, wires=3, shots=20000, seed=3))(0.3)
    assert len(got) == 4 and np.allclose(got, exact, atol=0.05)
    vec = qml.QNode(circuit, qml.device(name, wires=3, shots=[20000, 20000], seed=3))(0.3)
    assert len(vec) == 2 and all(len(r) == 4 and np.allclose(r, exact, atol=0.05) for r in vec)

def test_samples_counts_shot_vectors_and_seeds():
    def circuit():
        qml.Hadamard(0)
        qml.CNOT([0, 1])
        return qml.sample(wires=[0, 1]), qml.counts(wires=[0, 1]), qml.sample(qml.Z(1))

    dev = qml.device("qdiff.statevector", wires=2, shots=500, seed=3)
    s, c, z = qml.QNode(circuit, dev)()
    assert s.shape == (500, 2) and np.all(s[:, 0] == s[:, 1])
    assert set(c) <= {"00", "11"} and sum(c.values()) == 500
    assert set(np.unique(z)) <= {-1, 1}
    again = qml.QNode(circuit, qml.device("qdiff.statevector", wires=2, shots=500, seed=3))()
    np.testing.assert_array_equal(s, again[0])
    vec = qml.QNode(lambda: (qml.Hadamard(0), qml.expval(qml.Z(0)))[1:][0],
                    qml.device("qdiff.statevector", wires=1, shots=[10, 20, 30]))()
    assert len(vec) == 3


@pytest.mark.parametrize("name,ref", [("qdiff.statevector", "default.qubit"),
                                      ("qdiff.mixed", "default.mixed")])
def test_global_seed_samples_and_stream_as_default_devices(name, ref):
    """With ``seed="global"`` (the default) the device draws its seed from numpy's global
    generator as PennyLane's devices draw it: after ``np.random.seed(s)`` it samples what
    ``default.qubit``/``default.mixed`` sample and leaves the global stream where they leave it
    (an SPSA or shot-adaptive optimization seeded globally follows the same trajectory)."""
    def circuit():
        qml.Hadamard(0)
        qml.RY(0.7, 1)
        return qml.sample(wires=[0, 1])

    out = {}
    for d in (name, ref):
        np.random.seed(5)
        dev = qml.device(d, wires=2, shots=50)
        out[d] = (qml.QNode(circuit, dev)(), np.random.rand())
    np.testing.assert_array_equal(out[name][0], out[ref][0])
    assert out[name][1] == out[ref][1]


@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
@pytest.mark.parametrize("shots", [None, 200])
def test_used_device_pickles_and_deep_copies_as_default_qubit_does(name, shots):
    """``copy.deepcopy`` and ``pickle`` of a device that has run circuits (as
    ``default.qubit``'s): each copy runs on its own, a seeded one going on with the stream
    where the device stands."""
    import copy
    import pickle

    def circuit(x):
        qml.RX(x, wires=0)
        qml.CNOT(wires=[0, 1])
        return qml.expval(qml.Z(1)), qml.expval(qml.X(0) @ qml.X(1))

    dev = qml.device(name, wires=2, shots=shots, seed=3)
    x = torch.tensor(1.1, dtype=torch.float64)
    qml.QNode(circuit, dev, interface="torch")(x)
    copies = [copy.deepcopy(dev), pickle.loads(pickle.dumps(dev))]
    want = torch.stack(qml.QNode(circuit, dev, interface="torch")(x))
    for d in copies:
        got = torch.stack(qml.QNode(circuit, d, interface="torch")(x))
        assert torch.equal(got, want)


@pytest.mark.parametrize("shots", [300, [100, (200, 2)]])
@pytest.mark.parametrize("x", [0.9, np.array([0.4, 2.0])])
def test_measurements_sharing_a_basis_read_one_set_of_samples_as_default_qubit(shots, x):
    """qdiff.statevector samples with PennyLane's own sampler, so its groups are
    default.qubit's: the measurements without an observable (probs, sample, counts of wires)
    read one set of samples; qubit-wise commuting Pauli words (Z0, Z0 @ Z1, their var and
    sample) another; X0's group a third (default.qubit colours the qubit-wise commuting graph:
    a Pauli word that commutes with both groups may join either); each broadcast row and each
    partition its own."""
    def circuit(x):
        qml.RX(x, wires=0)
        qml.RY(0.7, wires=1)
        qml.CNOT(wires=[0, 1])
        return (qml.probs(wires=[0, 1]), qml.sample(wires=[0, 1]), qml.expval(qml.Z(0)),
                qml.expval(qml.Z(0) @ qml.Z(1)), qml.var(qml.Z(0)), qml.sample(qml.Z(0)),
                qml.sample(qml.Z(0) @ qml.Z(1)), qml.expval(qml.X(0)), qml.sample(qml.X(0)))
    dev = qml.device("qdiff.statevector", wires=2, seed=5)
    out = qml.set_shots(qml.QNode(circuit, dev), shots=shots)(x)
    for p, bits, z0, zz, v0, s0, szz, x0, sx in (out if isinstance(shots, list) else [out]):
        idx = bits[..., 0] * 2 + bits[..., 1]
        freq = np.stack([(idx == k).mean(-1) for k in range(4)], -1)
        np.testing.assert_allclose(p, freq, atol=1e-12, rtol=0)
        np.testing.assert_allclose(z0, s0.mean(-1), atol=1e-12, rtol=0)
        np.testing.assert_allclose(zz, szz.mean(-1), atol=1e-12, rtol=0)
        np.testing.assert_allclose(v0, 1 - s0.mean(-1) ** 2, atol=1e-12, rtol=0)
        np.testing.assert_allclose(x0, sx.mean(-1), atol=1e-12, rtol=0)


def test_wire_labels_and_dynamic_wires():
    def circuit():
        qml.RX(0.4, "a")
        qml.CNOT(["a", -2])
        qml.RY(0.3, -1)
        return qml.expval(qml.Z(-2)), qml.expval(qml.Z(-1)), qml.probs(wires=["a"])

    a = qml.QNode(circuit, qml.device("qdiff.statevector", wires=["a", -1, -2]))()
    b = qml.QNode(circuit, qml.device("default.qubit", wires=["a", -1, -2]))()
    close(a, b)
    c = qml.QNode(circuit, qml.device("qdiff.statevector"))()
    close(c, b)


def test_bad_input_names_the_operation_wire_or_option():
    dev = qml.device("qdiff.statevector", wires=2)

    class Opaque(qml.operation.Operation):
        num_wires = 1
        num_params = 0

    with pytest.raises(DeviceError, match="Opaque"):
        qml.QNode(lambda: (Opaque(wires=0), qml.expval(qml.Z(0)))[1], dev)()
    with pytest.raises(Exception, match="wire.*5|5.*wire|Cannot run circuit"):
        qml.QNode(lambda: (qml.RX(0.1, 5), qml.expval(qml.Z(0)))[1], dev)()
    with pytest.raises(DeviceError, match="c_dtype"):
        qml.device("qdiff.statevector", wires=2, c_dtype=np.float32)
    with pytest.raises(DeviceError, match="mcm_method='single-branch-statistics' is not "
                                          "supported"):
        dev.setup_execution_config(qml.devices.ExecutionConfig(
            mcm_config=qml.devices.MCMConfig(mcm_method="single-branch-statistics")))
    for name in ("qdiff.statevector", "qdiff.mixed"):
        with pytest.raises(DeviceError, match="mcm_method='single-branch-statistics' is not "
                                              "supported"):
            qml.device(name, wires=2).setup_execution_config(qml.devices.ExecutionConfig(
                mcm_config=qml.devices.MCMConfig(mcm_method="single-branch-statistics")))
    with pytest.raises(DeviceError, match="bogus"):
        dev.setup_execution_config(qml.devices.ExecutionConfig(device_options={"bogus": 1}))
    shots_dev = qml.device("qdiff.statevector", wires=2, shots=100)
    with pytest.raises(Exception, match="adjoint"):
        qml.grad(qml.QNode(lambda x: (qml.RX(x, 0), qml.expval(qml.Z(0)))[1], shots_dev,
                           diff_method="adjoint"))(pnp.array(0.3, requires_grad=True))
    with pytest.raises(TypeError):
        qml.device("qdiff.statevector", wires=2, not_an_option=1)


@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
def test_complex_gate_angles_are_refused_or_taken_when_real(name):
    """A tape angle of a complex dtype (numpy, torch, PennyLane numpy; a controlled gate's and
    a channel's too) is refused when its imaginary part is not zero and is never cut to its
    real part; one whose imaginary part is zero gives default.qubit's value. A string angle
    is refused, not parsed."""
    dev = qml.device(name, wires=2)
    for angle in (np.complex128(0.3 + 0.1j), np.array([0.3 + 0.1j]), pnp.array(0.3 + 0.1j),
                  torch.tensor(0.3 + 0.1j, dtype=torch.complex128)):
        for body in (lambda: qml.RX(angle, wires=0), lambda: qml.CRY(angle, wires=[1, 0]),
                     lambda: qml.GlobalPhase(angle, wires=0)):
            with pytest.raises(DeviceError, match="imaginary part"):
                qml.QNode(lambda: (body(), qml.expval(qml.Z(0)))[1], dev)()
    if name == "qdiff.mixed":
        with pytest.raises(DeviceError, match="imaginary part"):
            qml.QNode(lambda: (qml.DepolarizingChannel(np.complex128(0.1 + 0.1j), wires=0),
                               qml.expval(qml.Z(0)))[1], dev)()
    with pytest.raises(DeviceError, match="gate 'RX': a gate angle '0.3' is not a number"):
        qml.QNode(lambda: (qml.RX("0.3", wires=0), qml.expval(qml.Z(0)))[1], dev)()
    for angle in (np.complex128(0.3), torch.tensor(0.3 + 0j, dtype=torch.complex128)):
        out = qml.QNode(lambda: (qml.RX(angle, wires=0), qml.expval(qml.Z(0)))[1], dev)()
        assert float(out) == pytest.approx(np.cos(0.3), abs=1e-12)


def test_mid_circuit_measurement_is_deferred_exactly():
    def circuit(x):
        qml.RX(x, 0)
        m = qml.measure(0)
        qml.cond(m, qml.RY)(0.7, 1)
        return qml.expval(qml.Z(1)), qml.probs(op=m)

    a = qml.QNode(circuit, qml.device("qdiff.statevector", wires=3))(0.9)
    b = qml.QNode(circuit, qml.device("default.qubit", wires=3))(0.9)
    close(a, b)


@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
def test_too_few_wires_for_deferred_measurements_is_refused_by_name(name):
    """Deferring takes one free wire per mid-circuit measurement: a device without them
    refuses the circuit naming the measurements and the wires (not wires the user never
    wrote); with the wires it runs."""
    def circuit(x):
        qml.RX(x, 0)
        m = qml.measure(0)
        qml.cond(m, qml.RY)(0.7, 1)
        m2 = qml.measure(1)
        return qml.expval(qml.Z(1)), qml.probs(op=m2)

    with pytest.raises(qml.exceptions.DeviceError,
                       match=r"2 mid-circuit measurements.*deferred.*3 wires.*has 2"):
        qml.QNode(circuit, qml.device(name, wires=2))(0.9)
    with pytest.raises(qml.exceptions.DeviceError, match="mid-circuit"):
        qml.QNode(circuit, qml.device(name, wires=2, shots=10))(0.9)
    a = qml.QNode(circuit, qml.device(name, wires=4))(0.9)
    b = qml.QNode(circuit, qml.device("default.qubit", wires=4))(0.9)
    close(a, b)
    # a wire the device lacks in the circuit itself: PennyLane's own refusal of that wire
    with pytest.raises(qml.exceptions.WireError, match="7"):
        qml.QNode(lambda: (qml.measure(0), qml.X(7), qml.expval(qml.Z(0)))[2],
                  qml.device(name, wires=4))()


def test_complex64_amplitudes():
    def circuit():
        qml.Hadamard(0)
        qml.RY(0.3, 1)
        qml.CNOT([0, 1])
        return qml.expval(qml.Z(1)), qml.state()

    a = qml.QNode(circuit, qml.device("qdiff.statevector", wires=2, c_dtype=np.complex64))()
    b = qml.QNode(circuit, qml.device("default.qubit", wires=2))()
    assert a[1].dtype == np.complex64
    close(a, b, atol=1e-6)


@pytest.mark.parametrize("method", ["adjoint-vjp", "adjoint", "backprop"])
def test_torchlayer_training_step_equals_default_qubit(method):
    n = 3
    diff_method, kw = method.split("-")[0], ({"device_vjp": True} if "vjp" in method else {})

    def circuit_with_inputs(inputs, w):  # TorchLayer's signature: the input argument first
        return sel_circuit(n)(inputs, w)

    torch.manual_seed(3)
    x, y = torch.rand(16, n), torch.rand(16, 1)
    grads = []
    for name, diff, kw in (("qdiff.statevector", diff_method, kw),
                           ("default.qubit", "backprop", {})):
        dev = qml.device(name, wires=n)
        q = qml.QNode(circuit_with_inputs, dev, interface="torch", diff_method=diff, **kw)
        torch.manual_seed(0)
        m = torch.nn.Sequential(qml.qnn.TorchLayer(q, {"w": (2, n, 3)}), torch.nn.Linear(n, 1))
        loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward()
        grads.append((loss.detach(), m[0].w.grad.clone(), m[1].weight.grad.clone()))
    close(grads[0], grads[1], atol=1e-6)  # float32 inputs and Linear


def test_backprop_is_offered_for_torch_autograd_and_numpy():
    dev = qml.device("qdiff.statevector", wires=1)
    cfg = qml.devices.ExecutionConfig
    for interface in ("torch", "autograd", "numpy"):
        assert dev.supports_derivatives(cfg(gradient_method="backprop", interface=interface))
    assert not dev.supports_derivatives(cfg(gradient_method="backprop", interface="jax"))
    # PennyLane checks a QNode's diff_method with an interface-less (numpy) configuration
    q = qml.QNode(lambda x: (qml.RX(x, 0), qml.expval(qml.Z(0)))[1], dev, interface="torch",
                  diff_method="backprop")
    x = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(q(x), x)
    assert abs(float(g) + np.sin(0.3)) < 1e-12
    with pytest.raises(qml.exceptions.QuantumFunctionError, match="backprop"):
        qml.QNode(q.func, qml.device("qdiff.statevector", wires=1, shots=10),
                  diff_method="backprop")(0.3)


def test_backprop_with_a_noise_model_added_to_the_qnode_equals_default_qubit():
    """``qml.add_noise`` resolves the QNode's diff method before any circuit exists (interface
    "auto", no tape): backprop is offered there, and the noisy QNode's values and gradients
    equal default.qubit's under torch and autograd."""
    from pennylane import numpy as pnp
    model = qml.NoiseModel({qml.noise.op_eq(qml.RX): qml.noise.partial_wires(qml.RY, 0.05)})
    out = []
    for name in ("qdiff.statevector", "default.qubit"):
        @qml.qnode(qml.device(name, wires=2), diff_method="backprop")
        def f(x):
            qml.RX(x, 0)
            qml.CNOT([0, 1])
            return qml.expval(qml.Z(1))
        noisy = qml.add_noise(f, model)
        x = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
        y = noisy(x)
        (g,) = torch.autograd.grad(y, x)
        xa = pnp.array(0.4, requires_grad=True)
        out.append([float(y.detach()), float(g), float(noisy(xa)), float(qml.grad(noisy)(xa))])
    np.testing.assert_allclose(out[0], out[1], atol=1e-12, rtol=0)
    assert abs(out[0][0] - np.cos(0.4) * np.cos(0.05)) < 1e-12


@pytest.mark.parametrize("diff_method", ["backprop", "best"])
def test_torch_backprop_without_gradients_returns_torch_tensors(diff_method):
    """Torch parameters that need no gradient (``torch.no_grad()``, a constant input) give
    torch results under backprop, as on default.qubit: a TorchLayer evaluates in no_grad."""
    def body(x):
        qml.RX(x, 0)
        qml.CNOT([0, 1])
        return qml.expval(qml.Z(1)), qml.probs(wires=[0]), qml.state()

    got, want = (qml.QNode(body, qml.device(name, wires=2), diff_method=diff_method)
                 for name in ("qdiff.statevector", "default.qubit"))
    for x in (torch.tensor(0.3, dtype=torch.float64), torch.tensor([0.3, 0.5])):
        with torch.no_grad():
            g, w = got(x), want(x)
        assert [type(r) for r in g] == [type(r) for r in w] == [torch.Tensor] * 3
        for a, b in zip(g, w):
            assert a.dtype == b.dtype and a.shape == b.shape
            # (float32 input: default.* evaluates its rotations in float32)
            np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-7, rtol=0)

    @qml.qnode(qml.device("qdiff.statevector", wires=2), diff_method=diff_method)
    def layer(inputs, w):
        qml.AngleEmbedding(inputs, wires=range(2))
        qml.BasicEntanglerLayers(w, wires=range(2))
        return [qml.expval(qml.Z(i)) for i in range(2)]
    model = torch.nn.Sequential(qml.qnn.TorchLayer(layer, {"w": (2, 2)}), torch.nn.Linear(2, 1))
    x = torch.rand(4, 2)
    with torch.no_grad():
        y = model(x)
    assert torch.allclose(y, model(x).detach())

    # a tape without parameters in a torch backprop call (the snapshot before the first gate)
    def snap(x):
        qml.Snapshot()
        qml.RX(x, 0)
        return qml.probs(wires=[0]), qml.state()

    x = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    got, want = (qml.snapshots(qml.QNode(snap, qml.device(name, wires=1),
                                         diff_method="backprop"))(x)
                 for name in ("qdiff.statevector", "default.qubit"))
    assert got.keys() == want.keys()
    for k in want:
        for a, b in zip(got[k] if k == "execution_results" else [got[k]],
                        want[k] if k == "execution_results" else [want[k]]):
            assert type(a) is type(b) is torch.Tensor, k
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), atol=1e-12,
                                       rtol=0)


def _autograd_cases():
    def mixed_outputs(x, y):
        qml.RX(x[0], 0)
        qml.RY(x[1], 1)
        qml.CNOT([0, 1])
        qml.CRot(y, x[0] * y, 0.3, wires=[1, 0])
        qml.IsingXY(x[1] - y, wires=[0, 1])
        return (qml.expval(qml.PauliZ(0) @ qml.PauliX(1)), qml.probs(wires=[1]),
                qml.var(qml.PauliY(0)))

    def state(x, y):
        qml.RX(x[0], 0)
        qml.Hadamard(1)
        qml.CRY(y, wires=[1, 0])
        qml.RZ(x[1], 1)
        return qml.state()

    def broadcast(x, y):
        qml.RX(x, 0)  # x of shape (3,): three rows
        qml.CNOT([0, 1])
        qml.RY(y, 1)
        return qml.expval(qml.PauliZ(1)), qml.expval(qml.PauliX(0) @ qml.PauliZ(1))
    return {"mixed_outputs": (mixed_outputs, (2,)), "state": (state, (2,)),
            "broadcast": (broadcast, (3,))}


def _real_view(v):
    v = qml.math.hstack([qml.math.ravel(qml.math.real(r)) for r in v]) \
        if isinstance(v, tuple) else v
    return qml.math.hstack([qml.math.real(v), qml.math.imag(v)]) \
        if np.iscomplexobj(qml.math.unwrap(v)) else v


@pytest.mark.parametrize("case", sorted(_autograd_cases()))
def test_autograd_backprop_equals_default_qubit_to_second_order(case):
    """The autograd interface's backprop: values, Jacobians and Hessians of a scalar equal
    default.qubit's backprop; the Hessian also central differences of the Jacobian."""
    from pennylane import numpy as pnp
    fn, xshape = _autograd_cases()[case]
    rng = np.random.default_rng(len(case))
    x = pnp.array(rng.uniform(-2, 2, xshape), requires_grad=True)
    y = pnp.array(0.61, requires_grad=True)
    results = []
    for name in ("qdiff.statevector", "default.qubit"):
        q = qml.QNode(fn, qml.device(name, wires=2), diff_method="backprop")
        f = lambda x, y: _real_view(q(x, y))
        s = lambda v: qml.math.sum(qml.math.sin(f(v[:-1], v[-1]) * qml.math.arange(
            1, 1 + len(f(v[:-1], v[-1])))))
        v = pnp.array(np.append(x, y), requires_grad=True)
        results.append((f(x, y), qml.jacobian(f, argnums=[0, 1])(x, y),
                        qml.jacobian(qml.grad(s))(v), s, v))
    (val, jac, hess, s, v), (rval, rjac, rhess, _, _) = results
    assert np.allclose(val, rval, atol=1e-10)
    for a, b in zip(jac, rjac):
        assert np.allclose(a, b, atol=1e-10)
    assert np.allclose(hess, rhess, atol=1e-9)
    h, g = 1e-5, qml.grad(s)
    fd = np.stack([(g(v + h * e) - g(v - h * e)) / (2 * h) for e in np.eye(len(v))], axis=1)
    assert np.allclose(hess, fd, atol=1e-6)


def test_autograd_backprop_of_a_complex_trainable_state_equals_default_qubit():
    from pennylane import numpy as pnp

    def f(v):
        qml.StatePrep(v / pnp.linalg.norm(v), wires=[0, 1])
        qml.RX(0.4, 0)
        return qml.probs(wires=[0])
    v = pnp.array([0.5, 0.3j, 0.2, 0.7 + 0.1j], requires_grad=True)
    grads = [qml.grad(lambda v: qml.QNode(f, qml.device(name, wires=2),
                                          diff_method="backprop")(v)[0])(v)
             for name in ("qdiff.statevector", "default.qubit")]
    assert np.allclose(grads[0], grads[1], atol=1e-12)


@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
def test_autograd_backprop_keeps_the_control_values_of_a_controlled_unitary(name):
    """A ControlledQubitUnitary with a control on |0> next to a trainable angle: autograd's
    backprop gradient equals default.qubit's (the control values survive rebinding the
    tape's parameters)."""
    from pennylane import numpy as pnp
    u = qml.matrix(qml.Rot(0.1, 0.2, 0.3, wires=0) @ qml.Hadamard(0))

    def f(x):
        qml.RX(x, 0)
        qml.RY(0.4, 1)
        qml.ControlledQubitUnitary(u, wires=[0, 2, 1], control_values=[1, 0])
        qml.MultiControlledX(wires=[1, 0, 2], control_values=[0, 1])
        return qml.expval(qml.PauliX(1)), qml.expval(qml.PauliZ(2))
    x = pnp.array(0.7, requires_grad=True)
    jacs = [qml.jacobian(lambda x: qml.math.stack(qml.QNode(
        f, qml.device(dev, wires=3), diff_method="backprop")(x)))(x)
        for dev in (name, "default.qubit")]
    assert np.allclose(jacs[0], jacs[1], atol=1e-12)
    assert np.abs(jacs[1]).min() > 0.05


@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
def test_products_of_non_commuting_factors_equal_default_qubit(name):
    """``qml.prod`` of factors sharing a wire: a non-Hermitian product has the complex
    expectation default.qubit gives, a Hermitian one its real value and gradient."""
    a = np.array([[1, 0.5j, 0, 0], [-0.5j, 2, 0, 0.3], [0, 0, -1, 0], [0, 0.3, 0, 0.4]])
    products = [lambda: qml.prod(qml.X(0), qml.Z(0) @ qml.Y(1), qml.Hermitian(a, [1, 2])),
                lambda: qml.prod(qml.Y(1), qml.Hermitian(a, [1, 2]), qml.Y(1))]
    for make in products:
        def f(x):
            qml.RX(x, 0)
            qml.RY(0.7, 1)
            qml.CNOT([0, 1])
            qml.RY(0.3, 2)
            return qml.expval(make())
        got, want = (qml.QNode(f, qml.device(dev, wires=3), interface="torch")
                     (torch.tensor(0.4)) for dev in (name, "default.qubit"))
        assert torch.allclose(got.to(want.dtype), want, atol=1e-10)
        assert abs(want) > 0.1
    grads = []
    for dev in (name, "default.qubit"):
        x = torch.tensor(0.4, requires_grad=True)
        qml.QNode(f, qml.device(dev, wires=3), interface="torch")(x).real.backward()
        grads.append(x.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-10)


def test_observables_whose_printed_data_agree_give_their_own_values():
    # PennyLane's op.hash prints the data: numpy abbreviates large arrays, scipy prints 50
    # entries, torch 4 decimals; each observable still gives its own expectation value
    rng = np.random.default_rng(0)
    a = np.diag(rng.uniform(-1, 1, 64))
    b = a.copy()
    b[20, 20] += 5.0
    b[40, 40] -= 3.0
    h1 = qml.Hamiltonian([1.0, 0.5, 0.3], [qml.Z(0) @ qml.Z(1), qml.X(2), qml.Y(3) @ qml.Y(4)])
    h2 = qml.Hamiltonian([1.0, 0.5, 0.7], [qml.Z(0) @ qml.Z(1), qml.X(2), qml.Y(3) @ qml.Y(4)])
    t1 = torch.tensor([[0.5, 0.2], [0.2, -0.3]], dtype=torch.float64)
    t2 = t1 + torch.tensor([[1e-5, 0.0], [0.0, 0.0]], dtype=torch.float64)
    pairs = [(qml.Hermitian(a, wires=range(6)), qml.Hermitian(b, wires=range(6))),
             (qml.SparseHamiltonian(h1.sparse_matrix(wire_order=range(6)), wires=range(6)),
              qml.SparseHamiltonian(h2.sparse_matrix(wire_order=range(6)), wires=range(6))),
             (qml.Hermitian(t1, wires=0), qml.Hermitian(t2, wires=0))]
    ops = [qml.RY(0.3 * (w + 1), w) for w in range(6)] + [qml.CNOT([3, 4])]
    dev, ref = qml.device("qdiff.statevector", wires=6), qml.device("default.qubit", wires=6)
    for pair in pairs:
        assert pair[0].hash == pair[1].hash  # what the cache must not rely on
        for obs in pair:  # torch data reach the device as they are (backprop, execute)
            got = dev.execute(qml.tape.QuantumScript(ops, [qml.expval(obs)]))
            plain = qml.Hermitian(obs.data[0].numpy(), obs.wires) if \
                isinstance(obs.data[0], torch.Tensor) else obs
            close(got, ref.execute(qml.tape.QuantumScript(ops, [qml.expval(plain)])))


def test_probs_without_wires_on_a_device_without_wires_is_over_the_circuit_wires():
    def circuit(x):
        qml.RX(x, "a")
        qml.CNOT(["a", 2])
        qml.RY(0.4, 1)
        return qml.probs(), qml.expval(qml.Z(2))

    x = pnp.array(0.8, requires_grad=True)
    for kw in ({}, {"diff_method": "adjoint"}):
        a = qml.QNode(circuit, qml.device("qdiff.statevector"), **kw)
        b = qml.QNode(circuit, qml.device("default.qubit"))
        close(a(x), b(x))
        close(qml.jacobian(lambda v: a(v)[0])(x), qml.jacobian(lambda v: b(v)[0])(x))


def _controlled_circuit(x, y, u):
    for w in range(4):
        qml.Hadamard(w)
    qml.ctrl(qml.RY(x, 2), control=[0, 1], control_values=[0, 1])
    qml.ctrl(qml.Rot(y, 0.3, x, 3), control=[0, 2])
    qml.ctrl(qml.PhaseShift(y, 3), control=[0, 1, 2])
    qml.MultiControlledX(wires=[0, 1, 2, 3], control_values=[1, 0, 1])
    qml.ControlledQubitUnitary(qml.matrix(qml.Rot(0.3, 0.5, -0.2, 0)), wires=[1, 3, 0])
    qml.ctrl(qml.adjoint(qml.S(1)), control=[0, 2, 3])
    qml.ctrl(qml.PauliRot(x, "XY", [1, 2]), control=[0, 3], control_values=[0, 0])
    qml.QubitUnitary(u, wires=[0, 2])
    return qml.expval(qml.X(2) @ qml.Y(0) + 0.3 * qml.Z(3)), qml.probs(wires=[1, 3])


def _broadcast_unitaries(b):
    return np.stack([qml.matrix(qml.IsingXY(t, [0, 1]) @ qml.RZ(2 * t, 0), wire_order=[0, 1])
                     for t in b])


def test_broadcast_multi_controlled_gates_and_unitaries_equal_default_qubit():
    b = np.array([0.1, 0.5, 0.9])
    ub = _broadcast_unitaries(b)
    for x, y, u in [(0.4, -0.7, ub[1]), (b, 0.3, ub[0]), (b, b[::-1].copy(), ub),
                    (0.4, -0.7, ub)]:
        a, r = both(lambda: _controlled_circuit(x, y, u), diff_method=None)
        close(a(), r())
    for method, kw in (("adjoint", {"device_vjp": True}), ("adjoint", {}), ("best", {})):
        grads = []
        for name, diff, opts in (("qdiff.statevector", method, kw),
                                 ("default.qubit", "backprop", {})):
            q = qml.QNode(_controlled_circuit, qml.device(name, wires=4), interface="torch",
                          diff_method=diff, **opts)
            xt = torch.tensor(b, requires_grad=True)
            yt = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
            e, p = q(xt, yt, ub)
            (e.sum() + (p ** 2).sum()).backward()
            grads.append((e, p, xt.grad, yt.grad))
        close(grads[0], grads[1])


def _postselected_body(x):
    qml.RY(x, 0)
    qml.CNOT([0, 1])
    qml.RX(0.4, 1)
    m = qml.measure(1, postselect=0)
    qml.cond(m, qml.RY)(0.3, 2)  # never fires on the postselected branch
    qml.RY(0.5, 1)
    qml.measure(0, postselect=1)
    qml.RX(0.2, 0)
    return m


def _postselected(x):
    m = _postselected_body(x)
    return (qml.expval(qml.Z(0) @ qml.X(1)), qml.probs(wires=[0, 1]), qml.var(qml.Y(1)),
            qml.probs(op=m))


def _postselected_z(x):
    _postselected_body(x)
    return qml.expval(qml.Z(0) @ qml.X(1))


def test_best_takes_backprop_where_the_adjoint_refuses_the_operations():
    """Postselection and a trainable state preparation pass the adjoint's measurement checks
    but not its operations: ``best`` runs backprop there, under torch and autograd."""
    def prep(x):
        qml.StatePrep(qml.math.stack([qml.math.cos(x), 0 * x, 0 * x, qml.math.sin(x)]),
                      wires=[0, 1])
        qml.RY(0.3, 0)
        return qml.expval(qml.Z(0) @ qml.X(1))
    for fn, n in ((_postselected_z, 5), (prep, 2)):
        a, r = both(fn, n=n)
        xt = [torch.tensor(0.7, dtype=torch.float64, requires_grad=True) for _ in "ab"]
        close(torch.autograd.grad(a(xt[0]), xt[0]), torch.autograd.grad(r(xt[1]), xt[1]))
        close(qml.grad(a)(pnp.array(0.7)), qml.grad(r)(pnp.array(0.7)))


def test_postselection_gives_the_statistics_of_the_postselected_state():
    a, r = both(_postselected, n=5, mcm_method="deferred")
    for x in (0.7, np.array([0.3, 1.1, 2.0])):
        close(a(x), r(x))

    def never(x):
        qml.RY(x, 0)
        qml.measure(1, postselect=1)
        return qml.expval(qml.Z(0)), qml.probs(wires=[0])
    a, r = both(never, n=2)
    got = a(0.7)
    assert np.isnan(got[0]) and np.isnan(got[1]).all()  # as default.qubit: probability 0
    close(qml.grad(qml.QNode(_postselected_z, qml.device("qdiff.statevector", wires=5),
                             diff_method="parameter-shift"))(pnp.array(0.7)),
          qml.grad(qml.QNode(_postselected_z, qml.device("default.qubit", wires=5),
                             diff_method="backprop"))(pnp.array(0.7)))
    with pytest.raises(qml.exceptions.QuantumFunctionError, match="adjoint"):
        qml.QNode(_postselected, qml.device("qdiff.statevector", wires=5),
                  diff_method="adjoint")(pnp.array(0.7))
    x = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    tape = qml.tape.QuantumScript([qml.RY(x, 0), qml.CNOT([0, 1]), qml.RX(0.4, 1),
                                   qml.Projector([0], 1), qml.RY(0.5, 1)],
                                  [qml.expval(qml.Z(0) @ qml.X(1))])
    outs = []
    for name in ("qdiff.statevector", "default.qubit"):
        (v,) = qml.execute([tape], qml.device(name, wires=2), diff_method="backprop",
                           interface="torch")
        outs.append((v, torch.autograd.grad(v, x)[0]))
    close(outs[0], outs[1])


def test_postselection_with_shots_keeps_the_postselected_shots():
    def body(x):
        qml.RY(x, 0)
        qml.CNOT([0, 1])
        qml.RY(0.9, 1)
        qml.measure(1, postselect=1)

    def sampled(x):
        body(x)
        return qml.expval(qml.Z(0)), qml.sample(wires=[0, 1])

    def z0(x):
        body(x)
        return qml.expval(qml.Z(0))

    def kept(x):
        qml.RY(x, 0)
        qml.CNOT([0, 1])
        qml.RY(0.9, 1)
        return qml.probs(wires=[1])

    dev = qml.device("qdiff.statevector", wires=3, seed=5)
    ref = qml.device("default.qubit", wires=3)
    z, s = qml.set_shots(qml.QNode(sampled, dev), shots=4000)(1.3)
    assert (s[:, 1] == 1).all()
    # the kept shots: binomial(4000, p) (sd < 32); |Z| <= 1: sd of the mean <= 1/sqrt(N)
    assert abs(len(s) - 4000 * qml.QNode(kept, ref)(1.3)[1]) < 160
    assert abs(z - qml.QNode(z0, ref)(1.3)) < 5 / np.sqrt(len(s))
    x = np.array([1.3, 0.4])
    zs = qml.set_shots(qml.QNode(z0, dev), shots=4000)(x)  # one binomial per row
    n = 4000 * qml.QNode(kept, ref)(x)[:, 1]
    assert zs.shape == (2,) and (np.abs(zs - qml.QNode(z0, ref)(x)) < 5 / np.sqrt(n)).all()
    res = qml.set_shots(qml.QNode(sampled, dev), shots=[100, 300])(1.3)
    assert len(res) == 2 and all((r[1][:, 1] == 1).all() for r in res)


def test_postselection_that_keeps_no_shot_gives_nan_results():
    """A postselection whose kept shot count is 0 (probability 0, or a binomial draw of none)
    gives NaN results of each measurement's shape, as default.qubit's mid-circuit measurements
    do when every shot is discarded; a shot vector's other bins are sampled as usual."""
    def f(x):
        qml.RX(x, 0)
        qml.measure(0, postselect=1)
        return (qml.expval(qml.Z(0)), qml.var(qml.Z(0)), qml.counts(wires=[0]),
                qml.sample(wires=[0]), qml.probs(wires=[0, 1]))
    dev = qml.device("qdiff.statevector", wires=3, seed=2)
    res = qml.set_shots(qml.QNode(f, dev), shots=10)(0.0)
    assert all(np.isnan(r).all() for r in res) and np.shape(res[4]) == (4,)
    # probability sin(0.05)^2 ~ 0.0025: the 2-shot bins keep none, the large one keeps some
    res = qml.set_shots(qml.QNode(f, dev), shots=[2, 2, 20000])(0.1)
    assert all(np.isnan(r).all() for bin_ in res[:2] for r in bin_)
    assert res[2][0] == -1.0 and res[2][1] == 0.0 and (res[2][3] == 1).all()
    np.testing.assert_allclose(res[2][4], [0, 0, 1, 0])


def test_float32_unitary_stored_in_double_precision_is_accepted():
    """A unitary computed in single precision (torch's default float32) and cast to complex128
    is unitary to single-precision rounding only: accepted on both devices, as default.qubit
    does; a matrix that is not unitary is still refused."""
    t = torch.tensor(0.7, requires_grad=True)
    c, s_ = torch.cos(t / 2), torch.sin(t / 2)
    u = torch.stack([torch.stack([c, -s_]), torch.stack([s_, c])]).to(torch.complex128)

    def f(m):
        qml.Hadamard(0)
        qml.QubitUnitary(m, wires=0)
        return qml.expval(qml.X(0))
    for name in ("qdiff.statevector", "qdiff.mixed"):
        got = qml.QNode(f, qml.device(name, wires=1))(u)
        want = qml.QNode(f, qml.device("default.qubit", wires=1))(u)
        assert abs(float(got) - float(want)) < 1e-6
        with pytest.raises(DeviceError, match="matrix is not unitary"):
            qml.QNode(f, qml.device(name, wires=1))(u.detach() * 1.001)


def test_adjoint_of_a_torch_unitary_and_a_conjugate_view_run_as_on_default_qubit():
    """PennyLane's adjoint of a QubitUnitary of a torch matrix (a conjugate view of it) and a
    matrix given as ``U.mH`` run on both devices, and inside a qdiff qnode, as on
    default.qubit."""
    import qdiff as qd
    z = torch.randn(4, 4, dtype=torch.complex128, generator=torch.Generator().manual_seed(3))
    u = torch.linalg.qr(z)[0]
    h = torch.tensor([[1.0, 0.5, 0, 0], [0.5, -1.0, 0.2j, 0], [0, -0.2j, 0.3, 0],
                      [0, 0, 0, 0.7]], dtype=torch.complex128)

    def f():
        qml.Hadamard(0)
        qml.adjoint(qml.QubitUnitary(u, wires=[0, 1]))
        qml.QubitUnitary(u.mH, wires=[1, 0])
        qml.ctrl(qml.adjoint(qml.QubitUnitary(u, wires=[1, 2])), control=0)
        return qml.expval(qml.Hermitian(h, wires=[2, 0]))
    want = float(qml.QNode(f, qml.device("default.qubit", wires=3))())
    for name in ("qdiff.statevector", "qdiff.mixed"):
        assert abs(float(qml.QNode(f, qml.device(name, wires=3))()) - want) < 1e-10
    assert abs(float(qd.qnode(qd.device("statevector", wires=3))(f)()) - want) < 1e-10


def test_expval_of_an_operator_without_diagonalizing_gates_is_refused_in_validation():
    def f():
        qml.RX(0.3, 0)
        return qml.expval(qml.RX(0.4, 0))
    with pytest.raises(DeviceError, match=r"expval\(RX.*not accepted for analytic simulation"):
        qml.QNode(f, qml.device("qdiff.statevector", wires=1))()


@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
def test_scalar_results_are_numpy_scalars_and_the_tracker_sums_them(name):
    """Scalar results are NumPy scalars, as default.qubit's and default.mixed's (``qml.Tracker``
    sums results into its totals only then)."""
    def c(x):
        qml.RX(x, 0)
        return qml.expval(qml.Z(0)), qml.var(qml.Z(0)), qml.purity([0]), qml.probs(wires=[0])
    dev = qml.device(name, wires=1)
    out = qml.QNode(c, dev)(0.3)
    assert [type(r) for r in out] == [np.float64] * 3 + [np.ndarray]
    node = qml.QNode(lambda x: (qml.RX(x, 0), qml.expval(qml.Z(0)))[-1], dev,
                     diff_method="parameter-shift")
    with qml.Tracker(dev) as tracker:
        qml.grad(node)(pnp.array(0.3, requires_grad=True))
    assert abs(tracker.totals["results"] - np.cos(0.3)) < 1e-12


def _hessian_body(x):
    qml.RX(x, 0)
    qml.RY(x, 0)
    return qml.expval(qml.Z(0))


@pytest.mark.parametrize("interface", ["torch", "autograd"])
def test_best_second_derivatives_equal_default_qubit(interface):
    vals = []
    for name in ("qdiff.statevector", "default.qubit"):
        q = qml.QNode(_hessian_body, qml.device(name, wires=1), diff_method="best",
                      max_diff=2, interface=interface)
        if interface == "torch":
            x = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
            vals.append(float(torch.autograd.functional.hessian(q, x)))
        else:
            vals.append(float(qml.jacobian(qml.jacobian(q))(pnp.array(0.3, requires_grad=True))))
    assert abs(vals[0] - (-2 * np.cos(0.6))) < 1e-8  # <Z> = cos(x)^2 = (1 + cos 2x) / 2
    assert abs(vals[0] - vals[1]) < 1e-8


def test_best_second_derivatives_without_max_diff_equal_default_qubit():
    """Nested qml.jacobian / qml.grad with PennyLane's default max_diff=1: a Hessian and a
    mixed partial through 'best' equal default.qubit's (the reverse sweep's VJP cannot be
    differentiated again, so the nested call backpropagates)."""
    def body(a, b):
        qml.RX(a, 0)
        qml.RY(b, 0)
        qml.CRX(a * b, [0, 1])
        return qml.expval(qml.Z(0) @ qml.Z(1))

    got = []
    for name in ("qdiff.statevector", "default.qubit"):
        q = qml.QNode(body, qml.device(name, wires=2))
        a, b = pnp.array(0.3, requires_grad=True), pnp.array(0.8, requires_grad=True)
        hess = qml.jacobian(qml.jacobian(lambda v: q(v[0], v[1])))(pnp.array([0.3, 0.8]))
        mixed = qml.grad(lambda y: qml.grad(lambda x: q(x, y))(a))(b)
        got.append((hess, mixed))
    assert np.allclose(got[0][0], got[1][0], atol=1e-10)
    assert abs(got[0][1] - got[1][1]) < 1e-10 and abs(got[1][1]) > 0.1


def test_device_vjp_refuses_torch_create_graph():
    """torch differentiating the device VJP again (a Hessian with max_diff=1): refused by
    name, not a Hessian missing the circuit's second derivatives."""
    q = qml.QNode(_hessian_body, qml.device("qdiff.statevector", wires=1), diff_method="best",
                  interface="torch")
    x = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    with pytest.raises(qml.exceptions.DeviceError, match="create_graph=True.*max_diff=2"):
        torch.autograd.functional.hessian(q, x)
    (g,) = torch.autograd.grad(q(x), x)  # a plain backward still takes the reverse sweep
    assert abs(float(g) + np.sin(0.6)) < 1e-12


def test_adjoint_refuses_second_derivatives():
    dev = qml.device("qdiff.statevector", wires=1)
    with pytest.raises(qml.exceptions.QuantumFunctionError, match="adjoint"):
        q = qml.QNode(_hessian_body, dev, diff_method="adjoint", max_diff=2, interface="torch")
        q(torch.tensor(0.3, dtype=torch.float64, requires_grad=True))


def test_best_differentiates_state_measurements_and_observable_parameters_under_torch():
    def body(x, c):
        qml.RY(x, 0)
        qml.CNOT([0, 1])
        qml.RX(0.4 * x, 1)
        return (qml.purity(wires=[0]), qml.vn_entropy(wires=[1]),
                qml.expval(qml.Hamiltonian(c, [qml.Z(0), qml.X(1)])))

    grads = []
    for name in ("qdiff.statevector", "default.qubit"):
        q = qml.QNode(body, qml.device(name, wires=2), diff_method="best", interface="torch")
        x = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
        c = torch.tensor([0.5, 2.0], dtype=torch.float64, requires_grad=True)
        pur, ent, e = q(x, c)
        (pur + 2 * ent + 3 * e).backward()
        grads.append((x.grad, c.grad))
    close(grads[0], grads[1])
    # d/dc0 of 3 <c0 Z0 + c1 X1> is 3 <Z0> = 3 cos(x)
    assert abs(float(grads[0][1][0]) - 3 * np.cos(0.7)) < 1e-10


@pytest.mark.parametrize("interface", ["torch", "autograd"])
@pytest.mark.parametrize("diff_method", ["backprop", "best"])
def test_device_vjp_is_accepted_where_the_derivative_is_backprop(diff_method, interface):
    """``device_vjp=True`` with backprop (asked for, or what ``"best"`` takes for a purity):
    PennyLane asks the device for no VJP there; values and gradients equal default.qubit's."""
    def body(x):
        qml.RY(x, 0)
        qml.CNOT([0, 1])
        return qml.purity(wires=[0]), qml.expval(qml.X(0) @ qml.Z(1))

    grads = []
    for name in ("qdiff.statevector", "default.qubit"):
        q = qml.QNode(body, qml.device(name, wires=2), diff_method=diff_method,
                      device_vjp=True, interface=interface)
        if interface == "torch":
            x = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
            pur, e = q(x)
            (pur + 2 * e).backward()
            grads.append(float(x.grad))
        else:
            grads.append(float(qml.grad(lambda x: q(x)[0] + 2 * q(x)[1])(
                pnp.array(0.7, requires_grad=True))))
    # purity of RY(x)|0> entangled: (1 + cos(x)**2) / 2; <X0 Z1> = 0
    assert abs(grads[0] + np.cos(0.7) * np.sin(0.7)) < 1e-10
    assert abs(grads[0] - grads[1]) < 1e-12


def test_adjoint_refuses_trainable_observable_parameters():
    dev = qml.device("qdiff.statevector", wires=1)
    q = qml.QNode(lambda x, c: (qml.RX(x, 0), qml.expval(qml.Hamiltonian(c, [qml.Z(0)])))[1],
                  dev, diff_method="adjoint", interface="torch")
    with pytest.raises((DeviceError, qml.exceptions.QuantumFunctionError), match="adjoint"):
        q(torch.tensor(0.3, dtype=torch.float64, requires_grad=True),
          torch.tensor([0.5], dtype=torch.float64, requires_grad=True))
    # with constant coefficients the adjoint method runs
    c = torch.tensor([0.5], dtype=torch.float64)
    x = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    q(x, c).backward()
    assert abs(float(x.grad) + 0.5 * np.sin(0.3)) < 1e-10


def test_classical_shadows_equal_default_qubit_and_closed_forms():
    def body():
        qml.Hadamard(0)
        qml.CNOT([0, 1])
        qml.RY(0.3, 1)
        return qml.classical_shadow(wires=[1, 0], seed=11)

    a, r = (qml.QNode(body, qml.device(name, wires=2, shots=50, seed=3))
            for name in ("qdiff.statevector", "default.qubit"))
    x, y = a(), r()
    assert x.shape == (2, 50, 2) and x.dtype == y.dtype
    np.testing.assert_array_equal(x, y)
    # wire labels: <X_a X_b> = cos(0.3), <Z_b> = 0 after H, CNOT, RY(0.3) on b
    dev = qml.device("qdiff.statevector", wires=["a", ("b", 1)], shots=4000, seed=1)

    @qml.qnode(dev)
    def labelled():
        qml.Hadamard("a")
        qml.CNOT(["a", ("b", 1)])
        qml.RY(0.3, wires=[("b", 1)])
        return qml.shadow_expval([qml.X("a") @ qml.X([("b", 1)]), qml.Z([("b", 1)])], seed=2)

    np.testing.assert_allclose(labelled(), [np.cos(0.3), 0.0], atol=0.25)  # > 5 standard deviations
    # a broadcast tape: one estimate per row
    dev = qml.device("qdiff.statevector", wires=1, shots=4000, seed=1)

    @qml.qnode(dev)
    def rows(t):
        qml.RX(t, 0)
        return qml.shadow_expval(qml.Z(0))

    v = rows(np.array([0.1, 3.0]))
    assert np.shape(v) == (2,)
    np.testing.assert_allclose(v, np.cos([0.1, 3.0]), atol=0.15)


def test_adjoint_differentiates_circuits_with_snapshots():
    def body(x):
        qml.RY(x, 0)
        qml.Snapshot("s")
        qml.CNOT([0, 1])
        return qml.expval(qml.Z(1))

    q = qml.QNode(body, qml.device("qdiff.statevector", wires=2), diff_method="adjoint",
                  interface="torch")
    x = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    y = q(x)
    y.backward()
    assert abs(float(y) - np.cos(0.3)) < 1e-12 and abs(float(x.grad) + np.sin(0.3)) < 1e-12


@pytest.mark.parametrize("method", ["best", "adjoint", "backprop", "parameter-shift"])
@pytest.mark.parametrize("interface", ["numpy", "autograd", "torch"])
def test_snapshots_equal_default_qubit(method, interface):
    """``qml.snapshots`` runs natively (the device offers the debugger hook): every snapshot,
    a state snapshot after an expval one and a repeated tag included, with trainable
    parameters under every method (split into tapes, "best" resolved on the first tape took
    the adjoint method, which refused the state tape)."""
    def body(x):
        qml.RX(x, 0)
        qml.Snapshot("z", measurement=qml.expval(qml.Z(0)))
        qml.Snapshot("state")
        qml.CNOT([0, 1])
        qml.Snapshot("p", measurement=qml.probs([0, 1]))
        qml.Snapshot("z", measurement=qml.expval(qml.X(1)))
        return qml.expval(qml.Z(1))
    x = {"numpy": 0.3, "autograd": qml.numpy.array(0.3, requires_grad=True),
         "torch": torch.tensor(0.3, dtype=torch.float64, requires_grad=True)}[interface]
    got = qml.snapshots(qml.QNode(body, qml.device("qdiff.statevector", wires=2),
                                  diff_method=method))(x)
    want = qml.snapshots(qml.QNode(body, qml.device("default.qubit", wires=2),
                                   diff_method="backprop" if method == "adjoint" else method))(x)
    assert got.keys() == want.keys()
    for k in want:
        g, w = (v if isinstance(v, list) else [v] for v in (got[k], want[k]))
        for a, b in zip(g, w):
            np.testing.assert_allclose(qml.math.unwrap(qml.math.detach(a)),
                                       qml.math.unwrap(qml.math.detach(b)), atol=1e-12, rtol=0)


def test_pennylane_qubit_gates_run_natively_and_match_default_qubit():
    """The gates PennyLane has and qdiff records run as themselves on the device (not
    decomposed), with default.qubit's values and adjoint gradients."""
    def fn(x):
        qml.Hadamard(0); qml.RY(x, 1); qml.RX(0.3, 2); qml.RX(0.2, 3)
        qml.FermionicSWAP(x, wires=[1, 2]); qml.OrbitalRotation(x, wires=[0, 1, 2, 3])
        qml.PCPhase(x, 3, wires=[0, 1]); qml.QubitCarry(wires=[0, 1, 2, 3])
        qml.SISWAP(wires=[1, 0]); qml.DoubleExcitationMinus(x, wires=[0, 1, 2, 3])
        qml.CPhaseShift10(x, wires=[2, 3]); qml.QubitSum(wires=[3, 1, 2])
        qml.DiagonalQubitUnitary(np.exp(1j * np.array([0.1, 0.4])), wires=2)
        return qml.expval(qml.Z(0) @ qml.X(1) + qml.Y(2))
    ours = qml.QNode(fn, qml.device("qdiff.statevector", wires=N), diff_method="adjoint")
    ref = qml.QNode(fn, qml.device("default.qubit", wires=N), diff_method="backprop")
    x = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
    (tape,), _ = ours.device.preprocess_transforms()((qml.workflow.construct_tape(ours)(x),))
    names = [op.name for op in tape.operations]
    assert {"FermionicSWAP", "OrbitalRotation", "PCPhase", "QubitCarry", "SISWAP",
            "DoubleExcitationMinus", "CPhaseShift10", "QubitSum",
            "DiagonalQubitUnitary"} <= set(names)
    y, yr = ours(x), ref(x)
    assert torch.allclose(y, yr, atol=1e-12)
    (g,), (gr,) = torch.autograd.grad(y, x), torch.autograd.grad(yr, x)
    assert torch.allclose(g, gr, atol=1e-10)


@pytest.mark.parametrize("diff_method", ["best", "backprop", "adjoint"])
def test_exp_of_a_pauli_word_with_torch_parameters_matches_default_qubit(diff_method):
    """qml.exp / qml.evolve of a Pauli word with a torch parameter (PennyLane's own
    decomposition of it fails under torch): values and gradients equal default.qubit's."""
    def qfunc(p):
        qml.RY(0.4, 0)
        qml.RX(0.3, 1)
        qml.exp(qml.X(0) @ qml.Y(1), 1j * p)
        qml.evolve(0.7 * qml.Z(0) @ qml.X(1), 2 * p)
        return qml.expval(qml.Z(0) + 0.5 * qml.X(1) + 0.3 * qml.Y(0))
    ours, ref = both(qfunc, n=2, interface="torch", diff_method=diff_method)
    ref = qml.QNode(qfunc, qml.device("default.qubit", wires=2), interface="torch",
                    diff_method="backprop")
    for x in (torch.tensor(0.37), torch.tensor([0.2, 0.55, 0.9])):
        a = x.double().requires_grad_()
        b = x.double().requires_grad_()
        ya, yb = ours(a), ref(b)
        ya.sum().backward()
        yb.sum().backward()
        close(ya, yb, 1e-12)
        close(a.grad, b.grad, 1e-12)


def _exp_broadcast(p, pauli_only=False):
    qml.RY(0.4, 0)
    qml.RX(0.3, 1)
    qml.exp(qml.X(0) @ qml.Y(1), -0.5j * p)
    if not pauli_only:  # not a Pauli word: its matrix
        qml.exp(qml.X(0) @ qml.Y(1) + 0.5 * qml.Z(0), -0.5j * p)
    return qml.expval(qml.Z(0) + 0.3 * qml.Y(1)), qml.probs(wires=[1])


@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
def test_exp_with_a_broadcast_numpy_coefficient_matches_default_qubit(name):
    """qml.exp with a broadcast numpy or autograd coefficient (PennyLane's own decomposition
    of it cannot read one): values, Jacobians and shapes equal default.qubit's; a broadcast
    coefficient with a real part (not unitary) is refused by name."""
    ours = qml.QNode(_exp_broadcast, qml.device(name, wires=2), diff_method="backprop")
    ref = qml.QNode(_exp_broadcast, qml.device("default.qubit", wires=2),
                    diff_method="backprop")
    x = np.array([0.5, -0.7, 1.1])
    for a, b in zip(ours(x), ref(x)):
        assert np.shape(a) == np.shape(b)
        close(a, b, 1e-12)
    def flat(dev):
        q = qml.QNode(lambda p: _exp_broadcast(p, pauli_only=True), qml.device(dev, wires=2),
                      diff_method="backprop")
        return lambda p: qml.math.hstack([q(p)[0][:, None], q(p)[1]])
    xp = pnp.array(x, requires_grad=True)
    close(qml.jacobian(flat(name))(xp), qml.jacobian(flat("default.qubit"))(xp), 1e-12)
    bad = qml.QNode(lambda p: (qml.exp(qml.X(0), p), qml.expval(qml.Z(0)))[1],
                    qml.device(name, wires=1))
    with pytest.raises(DeviceError, match=r"Exp on wires \[0\]: matrix is not unitary"):
        bad(x)


@pytest.mark.parametrize("diff_method", ["best", "backprop"])
@pytest.mark.parametrize("make", [
    lambda p: qml.QubitUnitary(torch.tensor([[1.0, 0.5], [0.2, 0.9]], dtype=torch.complex128) * p,
                               wires=1),
    lambda p: qml.exp(qml.X(1), p),
], ids=["QubitUnitary", "exp-real"])
def test_a_trainable_matrix_that_is_not_unitary_is_refused_by_name(make, diff_method):
    """A trainable QubitUnitary (or matrix-only operator) is decomposed as a unitary, so one
    that is not unitary is refused, naming it, rather than run as a different gate."""
    def qfunc(p):
        qml.RY(0.4, 0)
        make(p)
        return qml.expval(qml.Z(0) + 0.5 * qml.X(1))
    f = qml.QNode(qfunc, qml.device("qdiff.statevector", wires=2), interface="torch",
                  diff_method=diff_method)
    with pytest.raises(DeviceError, match=r"on wires \[1\]: matrix is not unitary"):
        f(torch.tensor(0.37, dtype=torch.float64, requires_grad=True))


def _hermitian(k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(2 ** k, 2 ** k, dtype=torch.complex128, generator=g)
    return (a + a.conj().T) / 2


def _expm_i(h, t):
    """``exp(i t h)``; a broadcast ``t`` ``(B,)`` gives ``(B, d, d)``."""
    return torch.linalg.matrix_exp(1j * (t[..., None, None] if t.ndim else t) * h)


_ROWS = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)

# trainable matrices of one parameter t on the device wires ["a", 1, 2]
_TRAINABLE_MATRICES = {
    "QubitUnitary-1": lambda t: qml.QubitUnitary(_expm_i(_hermitian(1, 1), t), wires=1),
    "QubitUnitary-2": lambda t: qml.QubitUnitary(_expm_i(_hermitian(2, 2), t), wires=[2, "a"]),
    "QubitUnitary-3": lambda t: qml.QubitUnitary(_expm_i(_hermitian(3, 3), t),
                                                 wires=[1, "a", 2]),
    "ctrl": lambda t: qml.ctrl(qml.QubitUnitary(_expm_i(_hermitian(1, 4), t), wires=2),
                               control=["a"]),
    "ctrl-2-value0": lambda t: qml.ctrl(qml.QubitUnitary(_expm_i(_hermitian(2, 5), t),
                                                         wires=[2, 1]),
                                        control=["a"], control_values=[0]),
    "ControlledQubitUnitary": lambda t: qml.ControlledQubitUnitary(
        _expm_i(_hermitian(1, 6), t), wires=["a", 1, 2], control_values=[1, 0]),
    "adjoint": lambda t: qml.adjoint(qml.QubitUnitary(_expm_i(_hermitian(2, 7), t),
                                                      wires=[1, "a"])),
    "evolve-sum": lambda t: qml.evolve(qml.X("a") @ qml.X(2) + 0.8 * qml.Z(2), t),
    "exp-sum": lambda t: qml.exp(qml.X(1) @ qml.Y(2) + 0.3 * qml.Z(1), 1j * t),
    "broadcast": lambda t: qml.QubitUnitary(_expm_i(_hermitian(2, 8), t * _ROWS),
                                            wires=[2, "a"]),
    "broadcast-ctrl": lambda t: qml.ctrl(qml.QubitUnitary(_expm_i(_hermitian(1, 9), t * _ROWS),
                                                          wires=2), control=["a"]),
    "broadcast-evolve": lambda t: qml.evolve(qml.X("a") @ qml.X(2) + 0.8 * qml.Z(2),
                                             t * _ROWS[:2]),
}


def _matrix_circuit(name, make, diff_method, interface="torch"):
    def qfunc(t):
        qml.Hadamard("a")
        qml.RY(0.3, 1)
        qml.RX(0.7, 2)
        make(t)
        return qml.expval(qml.Z("a") @ qml.X(1) + 0.5 * qml.Y(2)), qml.probs(wires=[2])
    return qml.QNode(qfunc, qml.device(name, wires=["a", 1, 2]), interface=interface,
                     diff_method=diff_method)


def _value_and_grad(f, x=0.4):
    """Both measurements flattened and the gradient of a fixed combination of them."""
    t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    e, p = f(t)
    loss = e.sum() + (p * torch.tensor([0.3, -0.7], dtype=torch.float64)).sum()
    (g,) = torch.autograd.grad(loss, t)
    return torch.cat([e.reshape(-1), p.reshape(-1)]).detach(), g


@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
@pytest.mark.parametrize("diff_method", ["backprop", "best"])
@pytest.mark.parametrize("case", list(_TRAINABLE_MATRICES))
def test_a_trainable_matrix_is_differentiated_as_on_default_qubit(name, diff_method, case):
    """A QubitUnitary whose torch matrix requires grad (on 1-3 string/non-adjacent wires,
    controlled, adjoint, broadcast, or what qml.evolve/qml.exp of a non-Pauli-word sum
    becomes) runs as one engine gate holding that matrix: values and torch backprop gradients
    equal default.qubit's."""
    make = _TRAINABLE_MATRICES[case]
    got_v, got_g = _value_and_grad(_matrix_circuit(name, make, diff_method))
    want_v, want_g = _value_and_grad(_matrix_circuit("default.qubit", make, diff_method))
    close(got_v, want_v, 1e-10)
    close(got_g, want_g, 1e-10)


@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_trainable_matrix_under_autograd_backprop_matches_default_qubit(name, k):
    """Under the autograd interface the matrix's boxes reach the engine as one torch tensor
    (the autograd primitive): value, gradient and Hessian equal default.qubit's."""
    h = pnp.array(_hermitian(k, 10 + k).numpy(), requires_grad=False)
    lam, vecs = np.linalg.eigh(np.asarray(h))

    def qfunc(t):
        qml.Hadamard("a")
        qml.RY(0.3, 1)
        qml.QubitUnitary((vecs * pnp.exp(1j * t * lam)) @ vecs.conj().T,
                         wires=["a", 2, 1][:k])
        return qml.expval(qml.Z("a") @ qml.X(1) + 0.5 * qml.Y(2))

    t = pnp.array(0.4, requires_grad=True)
    f = qml.QNode(qfunc, qml.device(name, wires=["a", 1, 2]), diff_method="backprop")
    ref = qml.QNode(qfunc, qml.device("default.qubit", wires=["a", 1, 2]),
                    diff_method="backprop")
    close(f(t), ref(t), 1e-10)
    close(qml.grad(f)(t), qml.grad(ref)(t), 1e-10)
    close(qml.jacobian(qml.grad(f))(t), qml.jacobian(qml.grad(ref))(t), 1e-9)


@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
@pytest.mark.parametrize("kind", ["evolve", "exp", "broadcast"])
def test_evolve_of_a_sum_under_autograd_matches_torch(name, kind):
    """qml.evolve/qml.exp of a sum of non-commuting terms with an autograd time that requires
    grad is exp(-i t H) (PennyLane's own autograd matrix of it is not, and default.qubit's
    backprop returns its values): value, gradient and Hessian equal default.qubit's torch
    backprop of the same circuit, broadcast times row by row."""
    h = qml.Hamiltonian([0.5, -0.3, 0.8], [qml.Z(0) @ qml.Z(1), qml.X(0), qml.Y(1) @ qml.X(2)])

    def qfunc(t):
        qml.Hadamard(0)
        qml.RX(0.4, 1)
        if kind == "exp":
            qml.exp(h, -1j * t)
        else:
            qml.evolve(h, t)
        return qml.expval(qml.Y(0) @ qml.Z(2) + qml.Z(1))

    x = [0.37, 0.9] if kind == "broadcast" else 0.37
    ref = qml.QNode(qfunc, qml.device("default.qubit", wires=3), interface="torch")
    tt = torch.tensor(x, dtype=torch.float64)
    want_v = ref(tt).detach().numpy()
    want_g = torch.autograd.functional.jacobian(ref, tt).numpy()
    f = qml.QNode(qfunc, qml.device(name, wires=3))
    t = pnp.array(x, requires_grad=True)
    close(f(t), want_v, 1e-10)
    close(qml.jacobian(f)(t), want_g, 1e-10)
    if kind != "broadcast":
        close(qml.jacobian(qml.grad(f))(t),
              torch.autograd.functional.hessian(ref, tt).numpy(), 1e-9)


@pytest.mark.parametrize("diff_method", ["adjoint", "parameter-shift", "finite-diff"])
@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
def test_a_trainable_one_wire_matrix_by_other_methods_matches_default_qubit(name, diff_method):
    """A one-wire trainable matrix decomposes into differentiable Rot angles for the adjoint
    method and PennyLane's gradient transforms, as on default.qubit: default.qubit's exact
    values and gradient (qdiff.mixed offers no adjoint method)."""
    if name == "qdiff.mixed" and diff_method == "adjoint":
        pytest.skip("qdiff.mixed has no adjoint method")
    make = _TRAINABLE_MATRICES["QubitUnitary-1"]
    got_v, got_g = _value_and_grad(_matrix_circuit(name, make, diff_method))
    # (default.qubit's adjoint method does not differentiate probs: its exact gradient)
    want_v, want_g = _value_and_grad(_matrix_circuit("default.qubit", make, "backprop"))
    close(got_v, want_v, 1e-10)
    close(got_g, want_g, 1e-6 if diff_method == "finite-diff" else 1e-9)


@pytest.mark.parametrize("interface", ["torch", "autograd"])
@pytest.mark.parametrize("diff_method", ["adjoint", "parameter-shift", "finite-diff"])
@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
@pytest.mark.parametrize("case", ["QubitUnitary-2", "QubitUnitary-3", "ctrl"])
def test_a_wider_trainable_matrix_is_refused_by_name_where_backprop_is_not_used(
        name, diff_method, interface, case):
    """The adjoint method and PennyLane's gradient transforms would differentiate PennyLane's
    decomposition of a trainable matrix on two or more wires, which does not carry its
    gradient (default.qubit raises torch's RuntimeError, or autograd's TypeError, from inside
    it): a DeviceError naming the operation and pointing to backprop."""
    if name == "qdiff.mixed" and diff_method == "adjoint":
        pytest.skip("qdiff.mixed has no adjoint method")
    make = _TRAINABLE_MATRICES[case]
    if interface == "autograd":
        m = qml.matrix(make(torch.tensor(0.4, dtype=torch.float64)))
        wires = make(torch.tensor(0.4, dtype=torch.float64)).wires
        make = lambda t: qml.QubitUnitary(pnp.array(m.detach().numpy(), requires_grad=True) * t,  # noqa: E731
                                          wires=wires)
    f = _matrix_circuit(name, make, diff_method, interface)
    t = torch.tensor(0.4, dtype=torch.float64, requires_grad=True) if interface == "torch" \
        else pnp.array(1.0, requires_grad=True)
    what = "gradient transform" if diff_method != "adjoint" else "adjoint method"
    with pytest.raises(DeviceError, match=rf"on wires \[.*\]: a trainable \d+x\d+ matrix is "
                                          rf"differentiated by diff_method='backprop'.*{what}"):
        if interface == "torch":
            e, _ = f(t)
            e.backward()
        else:
            qml.grad(lambda x: f(x)[0])(t)


@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
def test_a_constant_controlled_matrix_that_is_not_unitary_is_refused_naming_its_wires(name):
    """A non-unitary constant ControlledQubitUnitary (e.g. the controlled generators of
    ``qml.metric_tensor(approx=None)``) is refused naming the matrix's wires."""
    f = qml.QNode(lambda: (qml.Hadamard(0),
                           qml.ControlledQubitUnitary(np.diag([1.0, 2.0]), wires=[0, 1]),
                           qml.expval(qml.Z(1)))[-1], qml.device(name, wires=2))
    with pytest.raises(DeviceError, match=r"QubitUnitary on wires \[1\]: matrix is not unitary"):
        f()


def test_a_qutrit_operation_is_refused_by_name():
    f = qml.QNode(lambda: (qml.TRX(0.3, wires=0), qml.expval(qml.Z(0)))[1],
                  qml.device("qdiff.statevector", wires=1))
    with pytest.raises(DeviceError, match=r"TRX on wires \[0\]: a 3-dimensional matrix is not a "
                                          r"qubit operator"):
        f()


@pytest.mark.parametrize("diff_method", ["best", "adjoint"])
def test_broadcast_iqp_embedding_and_multirz_keep_default_qubits_shape(diff_method):
    """A broadcast MultiRZ (IQPEmbedding's pair terms) under the adjoint method: PennyLane's
    expanded tapes still report a batch size, yet each is one binding; values (shape
    included) and gradients equal default.qubit's."""
    def qfunc(x):
        for i in range(3):
            qml.RY(0.2 + 0.3 * i, wires=i)
        qml.IQPEmbedding(x, wires=range(3))
        qml.MultiRZ(x[..., 0], wires=[0, 2])
        return qml.expval(0.3 * qml.Z(0) + 0.4 * qml.X(0) @ qml.Y(2))
    ours = qml.QNode(qfunc, qml.device("qdiff.statevector", wires=3), interface="torch",
                     diff_method=diff_method)
    ref = qml.QNode(qfunc, qml.device("default.qubit", wires=3), interface="torch",
                    diff_method="backprop")
    x = torch.tensor([[0.3, -0.5, 0.9], [1.1, 0.2, -0.4]], dtype=torch.float64)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ours(a), ref(b)
    assert ya.shape == yb.shape == (2,)
    ya.sum().backward()
    yb.sum().backward()
    close(ya, yb, 1e-12)
    close(a.grad, b.grad, 1e-12)


@pytest.mark.parametrize("diff_method", ["best", "backprop", "adjoint", None])
def test_sparse_state_prep_matches_default_qubit(diff_method):
    sp = pytest.importorskip("scipy.sparse")
    v = np.zeros(8)
    v[1], v[6] = 0.6, 0.8

    def qfunc():
        qml.StatePrep(sp.csr_matrix(v), wires=[2, 0, 1])
        qml.RY(0.4, 1)
        return qml.probs(wires=range(3))
    ours, ref = both(qfunc, n=3, diff_method=diff_method)
    close(ours(), ref(), 1e-12)


def _prepared(v, w):
    qml.AmplitudeEmbedding(v, wires=range(3), normalize=True)
    qml.RY(w[0], 0)
    qml.CNOT([0, 2])
    qml.RX(w[1], 2)
    return qml.expval(qml.Z(0) @ qml.X(2)), qml.probs(wires=[1, 2])


@pytest.mark.parametrize("method", ["adjoint", "best"])
def test_a_constant_state_preparation_is_the_adjoint_sweeps_initial_state(method):
    """Amplitudes that do not require grad are the engine's initial state (a batch of them
    included), not decomposed into gates; amplitudes that require grad are (their gradient
    then flows through the decomposition's angles)."""
    from pennylane.devices import ExecutionConfig
    rng = np.random.default_rng(4)
    v = torch.tensor(rng.normal(size=(5, 8)), dtype=torch.float64)
    w = torch.tensor([0.4, -1.1], dtype=torch.float64, requires_grad=True)
    w2 = w.detach().clone().requires_grad_(True)
    a = qml.QNode(_prepared, qml.device("qdiff.statevector", wires=3), diff_method=method)
    r = qml.QNode(_prepared, qml.device("default.qubit", wires=3), diff_method="backprop")
    close(a(v, w), r(v, w2))
    close(torch.autograd.grad(torch.cat([x.reshape(-1) for x in a(v, w)]).sum(), w),
          torch.autograd.grad(torch.cat([x.reshape(-1) for x in r(v, w2)]).sum(), w2))
    dev = qml.device("qdiff.statevector", wires=3)
    program = dev.preprocess_transforms(dev.setup_execution_config(
        ExecutionConfig(gradient_method="adjoint", interface="torch")))
    for amps, kept in ((v[0], True), (v[0].clone().requires_grad_(True), False)):
        tape = qml.tape.make_qscript(_prepared)(amps, w)
        (out,), _ = program((tape,))
        assert isinstance(out.operations[0], qml.operation.StatePrepBase) is kept
    u = v[0].clone().requires_grad_(True)
    u2 = v[0].clone().requires_grad_(True)
    adj = qml.QNode(_prepared, qml.device("qdiff.statevector", wires=3), diff_method="adjoint")
    close(torch.autograd.grad(adj(u, w)[0], u), torch.autograd.grad(r(u2, w)[0], u2))


def test_resolving_best_for_a_broadcast_tape_does_not_split_it(monkeypatch):
    """``diff_method="best"`` asks whether the adjoint method takes a tape: a broadcast tape is
    answered whole (splitting it into one tape per row checks nothing more), and runs as one
    broadcast job; values and gradients are default.qubit's."""
    split = []
    expand = qml.transforms.broadcast_expand
    real = expand._tape_transform
    monkeypatch.setattr(expand, "_tape_transform",
                        lambda tape, *a, **k: split.append(tape.batch_size) or real(tape, *a, **k))

    def f(x, w):
        qml.AngleEmbedding(x, wires=range(3))
        qml.BasicEntanglerLayers(w, wires=range(3))
        return [qml.expval(qml.Z(i)) for i in range(3)]
    x = torch.tensor(np.random.default_rng(2).normal(size=(40, 3)), dtype=torch.float64)
    w = torch.tensor([[0.3, -0.7, 1.2]], dtype=torch.float64, requires_grad=True)
    w2 = w.detach().clone().requires_grad_(True)
    a, r = both(f, n=3)
    ya, yr = torch.stack(a(x, w)), torch.stack(r(x, w2))
    close(ya, yr)
    assert split == []
    close(torch.autograd.grad(ya.sum(), w), torch.autograd.grad(yr.sum(), w2))


def test_hamiltonians_of_one_structure_and_other_coefficients_are_not_confused():
    """The device caches converted observables by content: Hamiltonians with the same terms
    and coefficients that differ (in one place, by one ulp, as numpy or Python numbers) give
    their own expectation values, equal to default.qubit's."""
    ops = [qml.Z(0) @ qml.Z(1), qml.X(0), qml.Y(1) @ qml.X(2), qml.Z(2)]
    base = [0.3, -1.2, 0.7, 2.5]
    variants = [base, [0.3, -1.2, 0.7, 2.6], [0.3, -1.2, np.nextafter(0.7, 1.0), 2.5],
                [np.float64(c) for c in base], [np.float32(c) for c in base], [1, -1, 2, 0]]

    def body(h):
        qml.RX(0.4, wires=0)
        qml.RY(-0.9, wires=1)
        qml.CNOT(wires=[1, 2])
        qml.RX(1.3, wires=2)
        return qml.expval(h)
    dq = qml.QNode(body, qml.device("default.qubit", wires=3))
    qd_ = qml.QNode(body, qml.device("qdiff.statevector", wires=3))
    for coeffs in variants:
        h = qml.Hamiltonian(coeffs, ops)
        assert abs(float(qd_(h)) - float(dq(h))) < 1e-12, coeffs


# -- tapes of one operation signature share one conversion ----------------------------------


def _same(a, b):
    """``a`` and ``b`` equal bit for bit (nested tuples, lists, dicts of arrays)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert isinstance(b, (tuple, list)) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype
        assert np.array_equal(a, b, equal_nan=True), (a, b)


def _converted_alone(dev):
    """``dev`` with every tape converted on its own (no signature)."""
    dev._scan = lambda tapes: [None] * len(tapes)
    return dev


def _signature_variants():
    """A tape, then tapes that each differ from it in one thing the conversion reads, then the
    first tape with other angles (the same signature)."""
    def ops(a=(0.3, 0.7, 0.5, 0.4, 1.1), **change):
        spec = dict(first=qml.RX(a[0], 0), cnot=qml.CNOT([0, 1]),
                    rot=qml.PauliRot(a[1], "XY", wires=[1, 2]),
                    ctrl=qml.ctrl(qml.RY(a[2], 2), control=[0, 1], control_values=[1, 0]),
                    pc=qml.PCPhase(a[3], dim=2, wires=[0, 1]), adj=qml.adjoint(qml.S(2)),
                    last=qml.RZ(a[4], 1))
        spec.update(change)
        return list(spec.values())

    a = np.random.default_rng(2).normal(size=(8, 8)) + 1j * np.random.default_rng(3).normal(
        size=(8, 8))
    every = qml.expval(qml.Hermitian(a + a.conj().T, wires=[0, 1, 2]))  # sees every gate

    def tape(o=None, m=None, shots=None, trainable=None, prep=None):
        o = ops() if o is None else o
        t = qml.tape.QuantumScript(([prep] if prep is not None else []) + o,
                                   m or [every], shots=shots)
        if trainable is not None:
            t.trainable_params = trainable
        return t

    h = [qml.Z(0) @ qml.Z(1), qml.X(2)]
    return {
        "base": tape(),
        "gate name": tape(ops(first=qml.RY(0.3, 0))),
        "gate wire": tape(ops(first=qml.RX(0.3, 1))),
        "two-qubit gate wires": tape(ops(cnot=qml.CNOT([1, 0]))),
        "Pauli word": tape(ops(rot=qml.PauliRot(0.7, "YX", wires=[1, 2]))),
        "Pauli word wires": tape(ops(rot=qml.PauliRot(0.7, "XY", wires=[2, 1]))),
        "control values": tape(ops(ctrl=qml.ctrl(qml.RY(0.5, 2), control=[0, 1],
                                                 control_values=[0, 1]))),
        "control wires": tape(ops(ctrl=qml.ctrl(qml.RY(0.5, 2), control=[1, 0],
                                                control_values=[1, 0]))),
        "controlled gate": tape(ops(ctrl=qml.ctrl(qml.RZ(0.5, 2), control=[0, 1],
                                                  control_values=[1, 0]))),
        "PCPhase dimension": tape(ops(pc=qml.PCPhase(0.4, dim=1, wires=[0, 1]))),
        "adjoint base": tape(ops(adj=qml.adjoint(qml.T(2)))),
        "one gate more": tape(ops() + [qml.Hadamard(0)]),
        "basis state": tape(prep=qml.BasisState(np.array([1, 0, 1]), wires=[0, 1, 2])),
        "other basis state": tape(prep=qml.BasisState(np.array([0, 1, 1]), wires=[0, 1, 2])),
        "observable": tape(m=[qml.expval(qml.Z(0) @ qml.X(1))]),
        "observable wires": tape(m=[qml.expval(qml.Z(0) @ qml.Z(2))]),
        "Hamiltonian": tape(m=[qml.expval(qml.Hamiltonian([0.5, -0.25], h))]),
        "Hamiltonian coefficient": tape(m=[qml.expval(qml.Hamiltonian([0.5, -0.125], h))]),
        "variance": tape(m=[qml.var(qml.Z(0) @ qml.Z(1))]),
        "probabilities": tape(m=[qml.probs(wires=[0, 1])]),
        "probability wires": tape(m=[qml.probs(wires=[1, 0])]),
        "state": tape(m=[qml.state()]),
        "two measurements": tape(m=[qml.expval(qml.Z(0) @ qml.Z(1)), qml.probs(wires=[2])]),
        "shots": tape(shots=100),
        "other shots": tape(shots=200),
        "shot vector": tape(shots=[100, 100]),
        "samples": tape(m=[qml.sample(wires=[0, 2])], shots=20),
        "counts": tape(m=[qml.counts(wires=[0, 2])], shots=20),
        "trainable": tape(trainable=[0]),
        "other trainable": tape(trainable=[1]),
        "other angles": tape(ops((-1.3, 2.9, 0.05, -0.6, 3.0))),
    }


def test_tapes_differing_in_anything_but_angles_never_share_a_conversion():
    """Every tape of the batch has a signature; only the tape with other angles shares the
    first tape's, and each result equals the one of the tape converted on its own, bit for
    bit (the samples too: the same seeded stream), and default.qubit's (exact runs)."""
    variants = _signature_variants()
    names, tapes = list(variants), list(variants.values())
    dev = qml.device("qdiff.statevector", wires=3, seed=5)
    keys = [s[0] for s in dev._scan(tapes)]
    assert keys[names.index("other angles")] == keys[0]
    assert len(set(keys)) == len(keys) - 1
    got = [dev.execute(tapes) for _ in range(2)]  # the second: every tape from its template
    assert len(dev._templates) == len(keys) - 1
    alone = _converted_alone(qml.device("qdiff.statevector", wires=3, seed=5))
    _same(got, [alone.execute(tapes) for _ in range(2)])
    grads = [variants[k] for k in ("trainable", "other angles", "other trainable", "base")]
    fresh = qml.device("qdiff.statevector", wires=3)
    _same(fresh.compute_vjp(grads, [1.0] * 4), alone.compute_vjp(grads, [1.0] * 4))
    ref = qml.device("default.qubit", wires=3)
    for name, tape, r in zip(names, tapes, got[1]):
        if not tape.shots:
            close(r, ref.execute(tape))
    one = qml.device("qdiff.statevector", wires=3, seed=5)
    for t in tapes:  # one tape per call: the templates of earlier calls
        one.execute(t)
    _same(got[0][:1] + got[0][-1:], [one.execute(tapes[0]), one.execute(tapes[-1])])


def test_device_without_wires_keys_tapes_by_their_wire_order():
    """On a device without wires a tape's wires are its register, in order of appearance: the
    same gates met in another wire order are another signature."""
    a = qml.tape.QuantumScript([qml.RX(0.3, 0), qml.RY(0.4, 1), qml.CNOT([0, 1])],
                               [qml.probs(wires=[0, 1])])
    b = qml.tape.QuantumScript([qml.RY(0.4, 1), qml.RX(0.3, 0), qml.CNOT([0, 1])],
                               [qml.probs(wires=[0, 1])])
    dev = qml.device("qdiff.statevector")
    ka, kb = (s[0] for s in dev._scan([a, b]))
    assert ka != kb
    for _ in range(2):
        got = dev.execute([a, b, a])
        close(got[0], got[1])
        _same(got, _converted_alone(qml.device("qdiff.statevector")).execute([a, b, a]))


def _sel_cost(n):
    def cost(x, w):
        qml.AngleEmbedding(x, wires=range(n))
        qml.StronglyEntanglingLayers(w, wires=range(n))
        return qml.expval(qml.Z(0) @ qml.Z(1) + 0.5 * qml.X(2)), qml.probs(wires=[1])
    return cost


@pytest.mark.parametrize("method,kw", [("parameter-shift", {}), ("finite-diff", {}),
                                       ("spsa", {"num_directions": 3, "sampler_rng": 7})])
def test_gradient_transform_tapes_equal_converting_each_tape_alone(method, kw):
    """Parameter-shift, finite-difference and SPSA tapes (many tapes of one signature) give
    Jacobians equal bit for bit to converting each tape on its own, over two calls (the
    second from templates only), with one broadcast input too; parameter-shift equals
    default.qubit's."""
    n = 3
    rng = np.random.default_rng(3)
    w = pnp.array(rng.uniform(0, 2 * np.pi, (2, n, 3)), requires_grad=True)
    for x in (pnp.array(rng.uniform(0, 2, n), requires_grad=False),
              pnp.array(rng.uniform(0, 2, (4, n)), requires_grad=False)):
        def jac(dev):
            f = qml.QNode(_sel_cost(n), dev, diff_method=method, gradient_kwargs=kw)
            flat = lambda w: pnp.concatenate([pnp.reshape(r, (-1,)) for r in f(x, w)])  # noqa: E731
            return [qml.jacobian(flat)(w) for _ in range(2)]
        got = jac(qml.device("qdiff.statevector", wires=n))
        _same(got, jac(_converted_alone(qml.device("qdiff.statevector", wires=n))))
        if method == "parameter-shift":
            close(got[0], jac(qml.device("default.qubit", wires=n))[0])


def test_parameter_shift_tapes_run_as_one_engine_job(monkeypatch):
    """The 2P + 1 tapes of a parameter-shift gradient: one engine call, one job of 2P + 1
    rows."""
    calls = []
    orig = StatevectorBackend.execute
    monkeypatch.setattr(StatevectorBackend, "execute", lambda self, jobs: (
        calls.append([tuple(j.theta.shape) for j in jobs]), orig(self, jobs))[1])
    n = 3
    f = qml.QNode(_sel_cost(n), qml.device("qdiff.statevector", wires=n),
                  diff_method="parameter-shift")
    x = pnp.array([0.1, 0.2, 0.3], requires_grad=False)
    w = pnp.array(np.full((2, n, 3), 0.4), requires_grad=True)
    for _ in range(2):
        calls.clear()
        qml.jacobian(lambda w: qml.math.hstack(f(x, w)))(w)
        p = w.size + n  # the embedding's angles are columns too
        assert calls == [[(1, p)], [(2 * w.size, p)]]


def test_a_tape_of_a_known_signature_with_a_bad_angle_is_refused_by_name():
    """A NaN angle, a torch angle or a complex one in a tape whose signature has a template:
    converted on its own, with its own error or result kind."""
    dev = qml.device("qdiff.statevector", wires=2)

    def tape(a):
        return qml.tape.QuantumScript([qml.RX(0.2, 0), qml.CRY(a, [0, 1])],
                                      [qml.expval(qml.Z(1))])
    dev.execute([tape(0.5), tape(0.6)])
    assert len(dev._templates) == 1
    with pytest.raises(DeviceError, match="CRY.*NaN"):
        dev.execute([tape(0.5), tape(float("nan"))])
    out = dev.execute([tape(0.5), tape(torch.tensor(0.6, dtype=torch.float64))])
    assert isinstance(out[1], torch.Tensor) and not isinstance(out[0], torch.Tensor)
    _same(out[0], np.asarray(dev.execute(tape(0.5))))
    assert abs(float(out[1]) - float(dev.execute(tape(0.6)))) == 0
    with pytest.raises(DeviceError, match="imaginary"):
        dev.execute([tape(0.5), tape(np.complex128(0.6 + 0.1j))])


@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
def test_metric_tensor_of_generators_as_gates_is_refused_pointing_to_the_adjoint_metric(name):
    """PennyLane's full metric tensor applies a controlled rotation's Hermitian generator as a
    gate, which the devices refuse naming it and the way to the full metric tensor here:
    ``qml.adjoint_metric_tensor``, equal to the Fubini-Study metric in closed form."""
    dev = qml.device(name, wires=3)  # a free wire for the metric tensor's auxiliary wire

    @qml.qnode(dev)
    def c(x):
        qml.RX(x[0], 0)
        qml.CRY(x[1], [0, 1])
        qml.RZ(x[2], 1)
        return qml.expval(qml.Z(1))
    x = pnp.array([0.3, 0.5, 0.7], requires_grad=True)
    with pytest.raises(Exception, match="Hermitian.*adjoint_metric_tensor"):
        qml.metric_tensor(c, approx=None)(x)
    g = np.asarray(qml.adjoint_metric_tensor(c)(x))
    # variances of the generators: X/2 on |0>; |1><1| (x) Y/2 with P(1) = sin^2(0.15), <Y> = 0;
    # Z/2 on wire 1 after CRY: (1 - <Z>^2) / 4, <Z> = 1 - 2 sin^2(0.15) sin^2(0.25)
    p1 = np.sin(0.15) ** 2
    z = 1 - 2 * p1 * np.sin(0.25) ** 2
    assert np.allclose(g, np.diag([0.25, p1 / 4, (1 - z ** 2) / 4]), atol=1e-10)


def test_adjoint_jacobian_of_many_parameters_scales_linearly():
    """The Jacobian of P trainable parameters maps theta columns to tape parameters without a
    dense (P, P) matrix: 4000 rotations take well under the 128 MB such a matrix would."""
    import tracemalloc
    p = 4000
    angles = np.linspace(-1.0, 1.0, p) / p
    tape = qml.tape.QuantumScript([qml.RY(a, wires=0) for a in angles],
                                  [qml.expval(qml.PauliZ(0))])
    tape.trainable_params = list(range(p))
    dev = qml.device("qdiff.statevector", wires=1)
    dev.execute_and_compute_derivatives((tape,))  # the tape's structure, recorded once
    tracemalloc.start()
    try:
        (val,), (jac,) = dev.execute_and_compute_derivatives((tape,))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    total = angles.sum()
    assert np.isclose(val, np.cos(total))
    assert np.allclose(np.asarray(jac, dtype=float), -np.sin(total))
    assert peak < 16e6, f"peak {peak / 1e6:.0f} MB"
