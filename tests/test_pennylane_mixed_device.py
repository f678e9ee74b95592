"""``qml.device("qdiff.mixed")`` against PennyLane's ``default.mixed`` (values, density matrices,
entropies and backprop gradients on random noisy circuits), finite differences, Aer's
density-matrix simulation of the routed circuit (device noise), and bad input."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import qdiff as qd

qml = pytest.importorskip("pennylane")

from test_mixed import random_measurements, random_ops, run_ops  # noqa: E402
from test_mixed import measurements as pl_measurements  # noqa: E402


def _same(got, want, atol, msg=""):
    if isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want), msg
        for g, w in zip(got, want):
            _same(g, w, atol, msg)
        return
    g = got.detach().numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    np.testing.assert_allclose(g, np.asarray(want), atol=atol, rtol=0, err_msg=msg)


def _circuit(seed, batch=None):
    r = np.random.default_rng(seed)
    n = int(r.integers(1, 5))
    ops = random_ops(r, n, int(r.integers(3, 16)))
    meas = random_measurements(r, n)
    params = [list(o[3]) for o in ops]
    if batch:
        i = next((i for i, o in enumerate(ops) if o[0] == "gate" and o[3]), None)
        if i is not None:
            params[i][0] = r.uniform(-np.pi, np.pi, batch)
    return n, ops, meas, params


def _both(n, fn, **kw):
    return [qml.QNode(fn, qml.device(name, wires=n), **kw)
            for name in ("qdiff.mixed", "default.mixed")]


@pytest.mark.parametrize("seed", range(40))
def test_random_noisy_circuits_equal_default_mixed(seed):
    n, ops, meas, params = _circuit(seed, batch=2 if seed % 2 else None)

    def circuit():
        run_ops(qml, ops, params)
        return pl_measurements(qml, meas, n)
    got, want = (q() for q in _both(n, circuit))
    _same(got, want, 1e-10, f"seed {seed}")


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(40, 140))
def test_random_noisy_circuits_equal_default_mixed_bulk(seed):
    test_random_noisy_circuits_equal_default_mixed(seed)


def test_entropies_and_mutual_information_equal_default_mixed():
    def circuit(x):
        qml.RY(x, wires=0)
        qml.CNOT(wires=[0, 1])
        qml.AmplitudeDamping(0.2, wires=1)
        qml.DepolarizingChannel(0.1, wires=2)
        qml.CRX(0.7, wires=[1, 2])
        return (qml.vn_entropy(wires=[0]), qml.vn_entropy(wires=[1, 2], log_base=2),
                qml.mutual_info(wires0=[0], wires1=[1]), qml.purity(wires=[0, 2]),
                qml.density_matrix(wires=[2, 0]))
    for x in (0.4, np.array([0.1, 1.3, 2.9])):
        got, want = (q(x) for q in _both(3, circuit))
        _same(got, want, 1e-10)


def _trainable_circuit(n, ops):
    def circuit(*ps):
        it = iter(ps)
        full = [[next(it) for _ in o[3]] for o in ops]
        run_ops(qml, ops, full)
        return qml.expval(qml.Hamiltonian([0.7, -0.4], [qml.PauliZ(0), qml.PauliX(n - 1)])), \
            qml.probs(wires=[0])
    return circuit


@pytest.mark.parametrize("seed", range(12))
def test_backprop_gradients_equal_default_mixed_and_finite_differences(seed):
    """Gate angles and channel parameters (every kind) trainable, torch interface."""
    r = np.random.default_rng(100 + seed)
    n = int(r.integers(1, 4))
    ops = random_ops(r, n, int(r.integers(3, 12)))
    values = [v for o in ops for v in o[3]]
    if not values:
        pytest.skip("no parameters drawn")
    circuit = _trainable_circuit(n, ops)
    mine, ref = (qml.QNode(circuit, qml.device(name, wires=n), interface="torch",
                           diff_method="backprop") for name in ("qdiff.mixed", "default.mixed"))

    def flat(q, *ps):
        e, p = q(*ps)
        return torch.cat([torch.as_tensor(e).reshape(1), torch.as_tensor(p).reshape(-1)])
    xs = tuple(torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in values)
    jac = torch.autograd.functional.jacobian(lambda *ps: flat(mine, *ps), xs)
    want = torch.autograd.functional.jacobian(lambda *ps: flat(ref, *ps), xs)
    h = 1e-5   # central differences: truncation and rounding errors near 1e-10
    for i, g in enumerate(jac):
        ps_lo = [t.detach() - (h if j == i else 0.0) for j, t in enumerate(xs)]
        ps_hi = [t.detach() + (h if j == i else 0.0) for j, t in enumerate(xs)]
        fd = (flat(mine, *ps_hi) - flat(mine, *ps_lo)) / (2 * h)
        assert torch.allclose(g, fd, atol=1e-8, rtol=0), f"seed {seed}, parameter {i}"
        # default.mixed's own backprop is off by up to ~6e-8 after Rot/U3 (against the same
        # differences) and NaN after some gates (below): compared where finite, to 1e-7
        ok = torch.isfinite(want[i])
        assert torch.allclose(g[ok], want[i][ok], atol=1e-7, rtol=0), f"seed {seed}"


def test_backprop_is_finite_where_default_mixed_gives_nan():
    """default.mixed's backprop returns NaN for d<Z>/dx after a SWAP of |00> and RY(x)
    (PennyLane 0.45); the engine's exact gradient is -sin(x)."""
    def circuit(x):
        qml.SWAP(wires=[1, 0])
        qml.RY(x, wires=0)
        return qml.expval(qml.PauliZ(0))
    x = torch.tensor(1.75, dtype=torch.float64, requires_grad=True)
    mine, ref = _both(2, circuit, interface="torch")
    with qml.Tracker(mine.device) as tracker:
        (g,) = torch.autograd.grad(mine(x), x)
    assert tracker.totals["executions"] == 1     # backprop: one run, no shifted circuits
    assert abs(float(g) + np.sin(1.75)) < 1e-12
    (r,) = torch.autograd.grad(ref(x), x)
    assert bool(torch.isnan(r)) or abs(float(r) + np.sin(1.75)) < 1e-12



def test_backprop_through_measurements_pennylane_reads_is_finite_next_to_idle_wires():
    """Probs of an observable, and expval/var of observables with trainable coefficients (both
    measured from the density matrix of the wires they read), on a register with an idle
    wire: backprop gradients equal default.mixed's and finite differences, not NaN."""
    c0 = torch.tensor(0.7, dtype=torch.float64)
    x0 = torch.tensor(0.4, dtype=torch.float64)
    cases = [lambda c: qml.probs(op=qml.Y(1)), lambda c: qml.expval(c * qml.Y(1)),
             lambda c: qml.expval(c * qml.Z(0)),
             lambda c: qml.var(c * qml.Y(1) + c * qml.Z(0)),
             lambda c: qml.var(qml.s_prod(c, qml.X(0) @ qml.Z(2)))]
    for meas in cases:
        def circuit(x, c):
            qml.RX(x, wires=0)
            qml.RY(x, wires=1)
            return meas(c)
        got = []
        for qn in _both(3, circuit, diff_method="backprop", interface="torch"):
            x, c = x0.clone().requires_grad_(), c0.clone().requires_grad_()
            gx, gc = torch.autograd.grad(qn(x, c).sum(), (x, c), allow_unused=True)
            got.append((gx, gc))
        (gx, gc), (rx, rc) = got
        h = 1e-6
        fd = (qml.QNode(circuit, qml.device("default.mixed", wires=3))(x0 + h, c0).sum() -
              qml.QNode(circuit, qml.device("default.mixed", wires=3))(x0 - h, c0).sum()) / (2 * h)
        assert torch.isfinite(gx) and abs(float(gx) - float(fd)) < 1e-7
        assert torch.isnan(rx) or abs(float(gx) - float(rx)) < 1e-10
        assert (gc is None) == (rc is None) and (gc is None or abs(float(gc - rc)) < 1e-10)

def test_autograd_best_is_one_backprop_run_and_parameter_shift_agrees():
    def circuit(x, y):
        qml.RX(x, wires=0)
        qml.PhaseDamping(0.3, wires=0)
        qml.CRY(y, wires=[0, 1])
        qml.BitFlip(0.1, wires=1)
        return qml.expval(qml.PauliZ(1) @ qml.PauliY(0))
    x = qml.numpy.array(0.4, requires_grad=True)
    y = qml.numpy.array(-1.1, requires_grad=True)
    want = qml.grad(_both(2, circuit, diff_method="best")[1])(x, y)
    for method, runs in (("best", 1), ("parameter-shift", 7)):  # CRY: four terms
        mine = _both(2, circuit, diff_method=method)[0]
        with qml.Tracker(mine.device) as tracker:
            got = qml.grad(mine)(x, y)
        assert tracker.totals["executions"] == runs  # backprop: one run; else shifted ones
        _same(got, want, 1e-8)


def test_shots_sample_the_noisy_distribution():
    def body():
        qml.Hadamard(wires=0)
        qml.CNOT(wires=[0, 1])
        qml.AmplitudeDamping(0.4, wires=0)

    def sampled():
        body()
        return qml.probs(wires=[0, 1]), qml.expval(qml.PauliZ(0)), qml.counts(wires=[1])

    def exact():
        body()
        return qml.probs(wires=[0, 1]), qml.expval(qml.PauliZ(0))
    dev = qml.device("qdiff.mixed", wires=2, seed=7)
    probs, z, counts = qml.set_shots(qml.QNode(sampled, dev), shots=20000)()
    want = qml.QNode(exact, qml.device("default.mixed", wires=2))()
    # standard errors below 0.0036 (probabilities) and 0.0071 (<Z>): five of them
    assert np.abs(probs - want[0]).max() < 0.02 and abs(z - want[1]) < 0.036
    assert sum(counts.values()) == 20000 and set(counts) <= {"0", "1"}
    res = qml.set_shots(qml.QNode(sampled, dev), shots=[100, (10, 2)])()
    assert len(res) == 3 and all(len(r) == 3 for r in res)
    assert sum(res[0][2].values()) == 100 and sum(res[2][2].values()) == 10


def test_readout_errors_keep_one_set_of_samples_per_basis():
    """With readout errors, the computational-basis measurements (probs, sample and counts of
    wires) read one set of samples through them, the measurements of observables PennyLane's
    groups of the state itself (expval and sample of Z0 from one set)."""
    m = qd.noise.NoiseModel().add_readout(0, 0.2, 0.1).add_readout(1, 0.05, 0.3)
    dev = qml.device("qdiff.mixed", wires=2, noise=m, seed=2)

    def sampled():
        qml.Hadamard(wires=0)
        qml.CNOT(wires=[0, 1])
        return (qml.probs(wires=[0, 1]), qml.expval(qml.Z(0)), qml.sample(wires=[0, 1]),
                qml.sample(qml.Z(0)), qml.counts(wires=[0, 1]))
    for shots in (400, [100, (300, 2)]):
        out = qml.set_shots(qml.QNode(sampled, dev), shots=shots)()
        for p, z0, bits, s0, counts in (out if isinstance(shots, list) else [out]):
            idx = bits[:, 0] * 2 + bits[:, 1]
            np.testing.assert_allclose(p, [(idx == k).mean() for k in range(4)], atol=1e-12)
            assert counts == {f"{k >> 1}{k & 1}": int((idx == k).sum())
                              for k in range(4) if (idx == k).any()}
            np.testing.assert_allclose(z0, s0.mean(), atol=1e-12, rtol=0)


def test_mid_circuit_measurements_are_deferred_like_default_mixed():
    def circuit(x):
        qml.RY(x, wires=0)
        qml.DepolarizingChannel(0.2, wires=0)
        m = qml.measure(0)
        qml.cond(m, qml.PauliX)(wires=1)
        return qml.expval(qml.PauliZ(1)), qml.probs(op=m)
    devs = [qml.device(name, wires=3) for name in ("qdiff.mixed", "default.mixed")]
    got, want = (qml.QNode(circuit, d)(0.9) for d in devs)
    _same(got, want, 1e-10)


def test_mid_circuit_statistics_have_finite_gradients_equal_to_default_qubit():
    """Statistics of measurement values (expval, var of arithmetic on them, probs) are read
    from the engine's probabilities of the measurement wires: backprop gradients equal
    default.qubit's where outcomes have probability 0 (PennyLane's route from the density
    matrix, default.mixed's too, gives NaN there), with torch, broadcast, and autograd."""
    def circuit(x):
        qml.RX(x, wires=0)
        qml.CNOT(wires=[0, 1])
        qml.AmplitudeDamping(0.0, wires=2)
        m0 = qml.measure(0, reset=True)
        m1 = qml.measure(1)
        qml.cond(m0 & m1, qml.RY)(x, wires=0)
        return (qml.expval(m0), qml.var(m0 + 2 * m1), qml.expval(m0 * 3 - m1),
                qml.probs(op=[m0, m1]), qml.var(m1), qml.expval(qml.PauliZ(0)))

    def pure(x):  # the same circuit without the (identity) channel, for default.qubit
        qml.RX(x, wires=0)
        qml.CNOT(wires=[0, 1])
        m0 = qml.measure(0, reset=True)
        m1 = qml.measure(1)
        qml.cond(m0 & m1, qml.RY)(x, wires=0)
        return (qml.expval(m0), qml.var(m0 + 2 * m1), qml.expval(m0 * 3 - m1),
                qml.probs(op=[m0, m1]), qml.var(m1), qml.expval(qml.PauliZ(0)))

    def flat(f, x):
        return torch.cat([t.reshape(x.shape + (-1,)) for t in f(x)], -1)
    for x in (torch.tensor(0.7, dtype=torch.float64),
              torch.tensor([0.7, 1.3, 0.0], dtype=torch.float64)):
        f = qml.QNode(circuit, qml.device("qdiff.mixed", wires=5), interface="torch",
                      diff_method="backprop")
        g = qml.QNode(pure, qml.device("default.qubit", wires=5), interface="torch",
                      diff_method="backprop")
        _same(flat(f, x), flat(g, x).detach(), 1e-12)
        jf = torch.autograd.functional.jacobian(lambda v: flat(f, v), x)
        jg = torch.autograd.functional.jacobian(lambda v: flat(g, v), x)
        assert torch.isfinite(jf).all()
        _same(jf, jg, 1e-12)
    def spread(x):
        qml.RX(x, wires=0)
        return qml.var(qml.measure(0) + 2 * qml.measure(1))
    f, g = (qml.QNode(spread, qml.device(name, wires=4), interface="autograd")
            for name in ("qdiff.mixed", "default.qubit"))
    x = qml.numpy.array(0.7, requires_grad=True)
    np.testing.assert_allclose(qml.grad(f)(x), qml.grad(g)(x), atol=1e-12, rtol=0)


# -- device noise models ---------------------------------------------------------------------


def _logical_body(x, y):
    qml.Hadamard(wires=0)
    qml.RY(x, wires=1)
    qml.CNOT(wires=[0, 2])          # uncoupled on fake_manila's line 0-1-2
    qml.RX(y, wires=2)
    qml.CRZ(0.3, wires=[2, 1])


def _logical_circuit(x, y):
    _logical_body(x, y)
    return (qml.expval(qml.PauliZ(0) @ qml.PauliZ(2)), qml.density_matrix(wires=[0, 1, 2]),
            qml.probs(wires=[2, 0]))


def _qd_circuit(x, y):
    qd.Hadamard(wires=0)
    qd.RY(x, wires=1)
    qd.CNOT(wires=[0, 2])
    qd.RX(y, wires=2)
    qd.CRZ(0.3, wires=[2, 1])
    return (qd.expval(qd.Z(0) @ qd.Z(2)), qd.density_matrix([0, 1, 2]), qd.probs([2, 0]))


def test_a_device_noise_model_routes_and_equals_aer_on_the_routed_circuit():
    pytest.importorskip("qiskit_aer")
    pytest.importorskip("qiskit_ibm_runtime")
    from test_noise_routing import _aer_rho, _logical
    from qdiff.circuits.qiskit_io import to_qiskit
    manila = qd.noise.from_backend("fake_manila")
    dev = qml.device("qdiff.mixed", wires=3, noise=manila)
    x = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
    y = torch.tensor(-0.7, dtype=torch.float64, requires_grad=True)
    zz, rho, probs = qml.QNode(_logical_circuit, dev, interface="torch")(x, y)
    f = qd.qnode(qd.device("mixed", wires=3, noise=manila))(_qd_circuit)
    rec = f.construct(x, y)[0]
    r = qd.noise.prepare(rec.circuit, manila)
    assert not qd.noise.native(rec.circuit, manila)
    want = _logical(_aer_rho(to_qiskit(r.circuit, theta=r.theta(rec.theta).detach())), r.final)
    np.testing.assert_allclose(rho.detach().numpy(), want, atol=1e-8, rtol=0)
    zz_want = np.trace(want @ np.kron(np.kron(np.diag([1, -1]), np.eye(2)), np.diag([1, -1])))
    assert abs(float(zz) - zz_want.real) < 1e-8
    # probs go through the device's readout errors: qdiff's own engine applies them to its
    # probabilities, the PennyLane device as a classical channel on the density matrix
    _, _, probs_qd = f(x, y)
    assert torch.allclose(probs, probs_qd, atol=1e-12, rtol=0)
    ideal = torch.tensor(np.diag(want).real).reshape(2, 2, 2).permute(2, 0, 1).sum(-1).reshape(-1)
    assert float((probs - ideal).abs().max()) > 1e-3          # readout errors act on probs
    # with shots, every measurement is sampled from the density matrix, with the readout
    # errors as a classical channel on it: the estimates follow the read-out probabilities
    def sampled(x, y):
        _logical_body(x, y)
        return qml.probs(wires=[2, 0]), qml.counts(wires=[0])
    shots = 40000
    est, counts = qml.set_shots(qml.QNode(sampled, qml.device("qdiff.mixed", wires=3,
                                                                noise=manila, seed=3)),
                                shots=shots)(x.detach(), y.detach())
    se = np.sqrt(probs_qd.detach().numpy() * (1 - probs_qd.detach().numpy()) / shots)
    assert np.all(np.abs(np.asarray(est) - probs_qd.detach().numpy()) < 5 * se + 1e-12)
    p0 = float(probs_qd[0] + probs_qd[2])   # wire 0 reads 0: outcomes 00 and 10 of (2, 0)
    assert abs(counts.get("0", 0) / shots - p0) < 5 * np.sqrt(p0 * (1 - p0) / shots)
    assert float((probs_qd - ideal).abs().max()) > 6 * se.max()   # the readout is visible
    # a measurement the engine does not compute (vn_entropy) is read off the density matrix
    def mixed_tape(x, y):
        _logical_body(x, y)
        return qml.probs(wires=[2, 0]), qml.vn_entropy(wires=[1])
    probs_rho, ent = qml.QNode(mixed_tape, dev, interface="torch")(x, y)
    assert torch.allclose(torch.as_tensor(probs_rho), probs_qd, atol=1e-12, rtol=0)
    red = want.reshape(2, 2, 2, 2, 2, 2).trace(axis1=0, axis2=3).trace(axis1=1, axis2=3)
    ev = np.linalg.eigvalsh(red)
    assert abs(float(ent) + sum(v * np.log(v) for v in ev if v > 1e-15)) < 1e-8
    (gx,) = torch.autograd.grad(zz, x)
    h = 1e-6
    with torch.no_grad():
        fd = (qml.QNode(_logical_circuit, dev)(x + h, y)[0] -
              qml.QNode(_logical_circuit, dev)(x - h, y)[0]) / (2 * h)
    assert abs(float(gx) - float(fd)) < 1e-8


def test_noise_by_device_name_and_what_is_refused():
    pytest.importorskip("qiskit_ibm_runtime")
    dev = qml.device("qdiff.mixed", wires=2, noise="fake_manila")
    assert dev.noise.name == "fake_manila"

    @qml.qnode(dev)
    def mcm():
        qml.Hadamard(wires=0)
        m = qml.measure(0)
        qml.cond(m, qml.PauliX)(wires=1)
        return qml.expval(qml.PauliZ(1))
    with pytest.raises(qml.exceptions.DeviceError, match="mid-circuit measurements"):
        mcm()
    with pytest.raises(qml.exceptions.DeviceError, match="describes 5 qubits"):
        qml.device("qdiff.mixed", wires=6, noise="fake_manila")

    @qml.qnode(dev)
    def own_channel():
        qml.Hadamard(wires=0)
        qml.BitFlip(0.1, wires=0)
        qml.CNOT(wires=[0, 1])
        return qml.expval(qml.PauliZ(1))
    with pytest.raises(qml.exceptions.DeviceError, match="BitFlip"):
        own_channel()


def test_bad_input_names_what_is_wrong():
    with pytest.raises(qml.exceptions.DeviceError, match="c_dtype"):
        qml.device("qdiff.mixed", wires=1, c_dtype=np.float64)

    @qml.qnode(qml.device("qdiff.mixed", wires=1))
    def f(p):
        qml.DepolarizingChannel(p, wires=0)
        return qml.expval(qml.PauliZ(0))
    with pytest.raises((qml.exceptions.DeviceError, ValueError), match="DepolarizingChannel|p"):
        f(1.5)
    with pytest.raises((qml.exceptions.DeviceError, ValueError), match="[Tt]race"):
        qml.QNode(lambda: (qml.QubitChannel([np.eye(2), np.eye(2)], wires=0),
                           qml.expval(qml.PauliZ(0)))[1], qml.device("qdiff.mixed", wires=1))()


def test_explicit_backprop_under_torch_and_autograd():
    dev = qml.device("qdiff.mixed", wires=1)
    x = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    tape = qml.tape.QuantumScript([qml.RX(x, wires=0), qml.AmplitudeDamping(0.2, wires=0)],
                                  [qml.expval(qml.PauliZ(0))])
    [res] = qml.execute([tape], dev, diff_method="backprop", interface="torch")
    (g,) = torch.autograd.grad(res, x)
    # <Z> = 1 - (1 - gamma) (1 - cos x)
    assert abs(float(g) + 0.8 * np.sin(0.3)) < 1e-12
    cfg = qml.devices.ExecutionConfig
    for interface in ("torch", "autograd", "numpy"):
        assert dev.supports_derivatives(cfg(gradient_method="backprop", interface=interface))
    assert not dev.supports_derivatives(cfg(gradient_method="backprop", interface="jax"))


def test_backprop_with_a_noise_model_added_to_the_qnode():
    """``qml.add_noise`` resolves the QNode's diff method before any circuit exists (interface
    "auto", no tape): backprop is offered there; <Z> = 1 - (1 - gamma)(1 - cos x) and its
    derivative under torch and autograd."""
    from pennylane import numpy as pnp
    model = qml.NoiseModel({qml.noise.op_eq(qml.RX):
                            qml.noise.partial_wires(qml.AmplitudeDamping, 0.2)})

    @qml.qnode(qml.device("qdiff.mixed", wires=1), diff_method="backprop")
    def f(x):
        qml.RX(x, 0)
        return qml.expval(qml.Z(0))
    noisy = qml.add_noise(f, model)
    x = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    y = noisy(x)
    (g,) = torch.autograd.grad(y, x)
    assert abs(float(y) - (1 - 0.8 * (1 - np.cos(0.3)))) < 1e-12
    assert abs(float(g) + 0.8 * np.sin(0.3)) < 1e-12
    assert abs(float(qml.grad(noisy)(pnp.array(0.3, requires_grad=True))) +
               0.8 * np.sin(0.3)) < 1e-12


@pytest.mark.parametrize("diff_method", ["backprop", "best"])
def test_torch_backprop_without_gradients_returns_torch_tensors(diff_method):
    """Torch parameters that need no gradient (``torch.no_grad()``, a constant input) give
    torch results, as on default.mixed (every measurement kind: engine-computed and read off
    the density matrix by PennyLane)."""
    def body(x):
        qml.RX(x, 0)
        qml.AmplitudeDamping(0.2, 0)
        qml.CNOT([0, 1])
        return (qml.expval(qml.Z(1)), qml.probs(wires=[0]), qml.density_matrix([0]),
                qml.vn_entropy(wires=[0]))

    got, want = (qml.QNode(body, qml.device(name, wires=2), diff_method=diff_method)
                 for name in ("qdiff.mixed", "default.mixed"))
    for x in (torch.tensor(0.3, dtype=torch.float64), torch.tensor([0.3, 0.5])):
        with torch.no_grad():
            g, w = got(x), want(x)
        assert [type(r) for r in g] == [type(r) for r in w] == [torch.Tensor] * 4
        for a, b in zip(g, w):
            assert a.dtype == b.dtype and a.shape == b.shape
            # (float32 input: default.* evaluates its rotations in float32)
            np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-7, rtol=0)

    # a tape without parameters in a torch call (the snapshot before the first gate)
    def snap(x):
        qml.Snapshot()
        qml.RX(x, 0)
        qml.AmplitudeDamping(0.2, 0)
        qml.Snapshot("z", measurement=qml.expval(qml.Z(0)))
        return qml.probs(wires=[0])

    x = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    got, want = (qml.snapshots(qml.QNode(snap, qml.device(name, wires=1),
                                         diff_method=diff_method))(x)
                 for name in ("qdiff.mixed", "default.mixed"))
    assert got.keys() == want.keys()
    for k in want:
        assert type(got[k]) is type(want[k]) is torch.Tensor, k
        np.testing.assert_allclose(got[k].detach().numpy(), want[k].detach().numpy(),
                                   atol=1e-12, rtol=0)


def test_autograd_backprop_equals_default_mixed_to_second_order():
    """Gate angles and channel parameters under the autograd interface: values, Jacobians
    (expval and purity) and the Hessian equal default.mixed's backprop."""
    from pennylane import numpy as pnp

    def circuit(v):
        x, p = v[0], v[1]
        qml.RX(x, 0)
        qml.AmplitudeDamping(p, wires=0)
        qml.CNOT([0, 1])
        qml.DepolarizingChannel(p * x, wires=1)
        qml.CRY(x - p, wires=[1, 0])
        return qml.expval(qml.PauliZ(1)), qml.purity(wires=[0])
    v = pnp.array([0.7, 0.2], requires_grad=True)
    out = []
    for name in ("qdiff.mixed", "default.mixed"):
        for method in ("backprop", "best"):
            q = qml.QNode(circuit, qml.device(name, wires=2), diff_method=method)
            f = lambda v: qml.math.hstack(q(v))
            out.append((f(v), qml.jacobian(f)(v),
                        qml.jacobian(qml.grad(lambda v: q(v)[0] + q(v)[1] ** 2))(v)))
    for got in out[:2]:
        for a, b in zip(got, out[2]):
            assert np.allclose(a, b, atol=1e-9)


def test_a_density_matrix_as_initial_state_equals_default_mixed():
    r = np.random.default_rng(4)
    a = r.normal(size=(4, 4)) + 1j * r.normal(size=(4, 4))
    rho = a @ a.conj().T
    rho /= np.trace(rho)

    def circuit(x):
        qml.QubitDensityMatrix(rho, wires=[2, 0])
        qml.RX(x, wires=1)
        qml.CNOT(wires=[0, 1])
        qml.AmplitudeDamping(0.3, wires=2)
        return (qml.expval(qml.PauliZ(1) @ qml.PauliX(2)), qml.density_matrix(wires=[0, 2]),
                qml.purity(wires=[0, 1]), qml.var(qml.PauliY(0)), qml.probs(wires=[2]))
    for x in (0.7, np.array([0.1, -2.0])):
        got, want = (q(x) for q in _both(3, circuit))
        _same(got, want, 1e-10)
    trainable = torch.tensor(rho, requires_grad=True)

    @qml.qnode(qml.device("qdiff.mixed", wires=2), interface="torch")
    def g(m):
        qml.QubitDensityMatrix(m, wires=[0, 1])
        return qml.expval(qml.PauliZ(0))
    with pytest.raises(qml.exceptions.DeviceError, match="QubitDensityMatrix.*not trainable"):
        g(trainable)


def test_a_density_matrix_after_the_first_operation_equals_default_mixed():
    """QubitDensityMatrix later in the circuit replaces its wires' state (the rest traced
    out), as on default.mixed: values, density matrices and a backprop gradient."""
    sigma = np.array([[0.3, 0.2 - 0.1j], [0.2 + 0.1j, 0.7]])

    def circuit(x):
        qml.RY(x, wires=0)
        qml.CNOT(wires=[0, 1])
        qml.Hadamard(wires=2)
        qml.QubitDensityMatrix(sigma, wires=[1])
        qml.CRY(x, wires=[1, 2])
        qml.QubitDensityMatrix(np.diag([0.1, 0.2, 0.3, 0.4]).astype(complex), wires=[2, 0])
        qml.CNOT(wires=[0, 1])
        return (qml.expval(qml.PauliZ(0) @ qml.PauliX(2)), qml.density_matrix(wires=[2, 0, 1]),
                qml.purity(wires=[0, 1]), qml.probs(wires=[1]))
    got, want = (q(0.7) for q in _both(3, circuit))
    _same(got, want, 1e-10)

    def single(x):
        qml.RY(x, wires=0)
        qml.QubitDensityMatrix(sigma, wires=[1])
        qml.CRX(x, wires=[0, 1])
        return qml.expval(qml.PauliZ(1))
    from pennylane import numpy as pnp
    x = pnp.array(0.7, requires_grad=True)
    grads = [qml.grad(qml.QNode(single, qml.device(name, wires=2), diff_method="backprop"))(x)
             for name in ("qdiff.mixed", "default.mixed")]
    assert abs(grads[0] - grads[1]) < 1e-10

    @qml.qnode(qml.device("qdiff.mixed", wires=2), interface="torch")
    def g(m):
        qml.RX(0.3, wires=0)
        qml.QubitDensityMatrix(m, wires=[1])
        return qml.expval(qml.PauliZ(1))
    with pytest.raises(qml.exceptions.DeviceError, match="QubitDensityMatrix.*not trainable"):
        g(torch.tensor(sigma, requires_grad=True))


def test_a_broadcast_channel_parameter_gives_one_row_per_value():
    # PennyLane's channels report no batch_size; each value of p is one row, as each value of
    # a broadcast gate angle is (default.mixed refuses this input: compared value by value)
    ps = np.array([0.1, 0.25, 0.4])

    def body(p):
        qml.RY(0.37, wires=0)
        qml.CNOT(wires=[0, 1])
        qml.DepolarizingChannel(p, wires=1)
        qml.AmplitudeDamping(0.2, wires=0)

    def circuit(p):
        body(p)
        return (qml.expval(qml.PauliZ(1)), qml.probs(wires=[0]), qml.vn_entropy(wires=[0]),
                qml.density_matrix(wires=[1]))

    def z1(p):
        body(p)
        return qml.expval(qml.PauliZ(1))

    def prepared(p):
        qml.QubitDensityMatrix(np.diag([0.7, 0.3]).astype(complex), wires=[0])
        qml.CNOT(wires=[0, 1])
        qml.DepolarizingChannel(p, wires=1)
        return qml.expval(qml.PauliZ(1))

    for fn in (circuit, prepared):
        got = qml.QNode(fn, qml.device("qdiff.mixed", wires=2))(ps)
        rows = [qml.QNode(fn, qml.device("default.mixed", wires=2))(p) for p in ps]
        want = tuple(np.stack(w) for w in zip(*rows)) if isinstance(rows[0], tuple) \
            else np.stack(rows)
        _same(got, want, 1e-10)
    dev = qml.device("qdiff.mixed", wires=2, seed=3)
    z = qml.set_shots(qml.QNode(z1, dev), shots=20000)(ps)
    assert z.shape == (3,) and np.abs(z - np.cos(0.37) * (1 - 4 * ps / 3)).max() < 0.03
    p = torch.tensor(ps, requires_grad=True)
    y = qml.QNode(z1, qml.device("qdiff.mixed", wires=2), interface="torch")(p)
    y.sum().backward()  # d<Z1>/dp = -4/3 cos(x)
    np.testing.assert_allclose(p.grad.numpy(), -4 / 3 * np.cos(0.37) * np.ones(3), atol=1e-10)


@pytest.mark.parametrize("angle", [0.4, np.array([0.2, 0.9, 1.7])], ids=["one", "rows"])
def test_a_broadcast_channel_parameter_with_measured_mid_circuit_measurements(angle):
    # the tree traversal and one-shot take one row at a time: each value of the channel
    # parameter is its own row there too (default.mixed, deferred, compared value by value)
    ps = np.array([0.1, 0.3, 0.5])

    def circuit(p, x):
        qml.RX(x, wires=0)
        qml.CNOT(wires=[0, 1])
        qml.BitFlip(p, wires=0)
        m = qml.measure(0)
        qml.cond(m, qml.RY)(0.5, wires=1)
        qml.AmplitudeDamping(p, wires=1)
        return qml.expval(qml.PauliZ(1)), qml.probs(wires=[1]), qml.expval(m)

    xs = np.broadcast_to(angle, ps.shape)
    rows = [qml.QNode(circuit, qml.device("default.mixed", wires=3))(p, x)
            for p, x in zip(ps, xs)]
    want = tuple(np.stack(w) for w in zip(*rows))
    dev = qml.device("qdiff.mixed", wires=2)
    _same(qml.QNode(circuit, dev, mcm_method="tree-traversal")(ps, angle), want, 1e-10)
    dev = qml.device("qdiff.mixed", wires=2, seed=4)
    got = qml.set_shots(qml.QNode(circuit, dev, mcm_method="one-shot"), shots=20000)(ps, angle)
    assert [np.shape(g) for g in got] == [(3,), (3, 2), (3,)]
    _same(got, want, 0.03)
    got = qml.set_shots(qml.QNode(circuit, dev, mcm_method="tree-traversal"),
                        shots=[4000, (2000, 2)])(ps, angle)
    assert len(got) == 3
    for g in got:
        _same(g, want, 0.06)
    if np.ndim(angle):  # rows of the angle and of the channel that differ in number
        with pytest.raises(qml.exceptions.DeviceError, match="BitFlip on wires \\[0\\]"):
            qml.QNode(circuit, dev, mcm_method="tree-traversal")(ps[:2], angle)


def test_broadcast_multi_controlled_gates_and_unitaries_equal_default_mixed_row_by_row():
    # default.mixed refuses these broadcast inputs: compared value by value
    b = np.array([0.1, 0.5, 0.9])
    ub = np.stack([qml.matrix(qml.IsingXY(t, [0, 1]) @ qml.RZ(2 * t, 0), wire_order=[0, 1])
                   for t in b])
    ps = np.array([0.05, 0.2, 0.3])

    def circuit(x, u, p):
        for w in range(3):
            qml.Hadamard(w)
        qml.ctrl(qml.RY(x, 2), control=[0, 1], control_values=[1, 0])
        qml.ctrl(qml.PhaseShift(x, 2), control=[0, 1])
        qml.QubitUnitary(u, wires=[0, 2])
        qml.DepolarizingChannel(p, wires=1)
        return qml.expval(qml.PauliX(2) @ qml.PauliX(0)), qml.probs(wires=[1, 2])

    dev, ref = qml.device("qdiff.mixed", wires=3), qml.device("default.mixed", wires=3)
    for args in [(b, ub[0], 0.1), (0.3, ub, 0.1), (b, ub, ps)]:
        got = qml.QNode(circuit, dev)(*args)
        rows = [qml.QNode(circuit, ref)(*(a[i] if np.ndim(a) > np.ndim(ub[0]) or
                                          (np.ndim(a) == 1 and a.shape == (3,)) else a
                                          for a in args)) for i in range(3)]
        _same(got, tuple(np.stack(w) for w in zip(*rows)), 1e-10)
    with pytest.raises(qml.exceptions.DeviceError, match="DepolarizingChannel.*sizes \\[2\\]"):
        qml.QNode(circuit, dev)(0.3, ub, ps[:2])


def test_classical_shadows_on_wire_labels_and_broadcast_rows():
    # closed forms after RX(x) and AmplitudeDamping(g): <Z> = 1 - (1 - g)(1 - cos x),
    # <Y> = -sqrt(1 - g) sin x; 4000 shots: the estimates are within 0.15 (> 5 std devs)
    dev = qml.device("qdiff.mixed", wires=["a", ("b", 1)], shots=[4000, 4000], seed=3)

    @qml.qnode(dev)
    def f(x):
        qml.RX(x, "a")
        qml.AmplitudeDamping(0.3, "a")
        qml.RY(0.2, wires=[("b", 1)])
        return (qml.shadow_expval([qml.Z("a"), qml.Y("a")], seed=5),
                qml.classical_shadow(wires=[("b", 1), "a"], seed=6))

    x = np.array([0.3, 2.0])
    want = np.stack([1 - 0.7 * (1 - np.cos(x)), -np.sqrt(0.7) * np.sin(x)], axis=1)
    for est, shadow in f(x):
        np.testing.assert_allclose(est, want, atol=0.15)
        assert shadow.shape == (2, 2, 4000, 2) and shadow.dtype == np.int8
    # one row: the same bits and recipes as default.mixed from the same seed
    got, ref = (qml.QNode(lambda: (qml.RX(0.3, 0), qml.BitFlip(0.2, 0),
                                   qml.classical_shadow(wires=[0], seed=7))[-1],
                          qml.device(name, wires=1, shots=30, seed=4))()
                for name in ("qdiff.mixed", "default.mixed"))
    np.testing.assert_array_equal(got, ref)


def test_snapshots_run_natively_with_the_density_matrix_as_the_state():
    """``qml.snapshots`` on qdiff.mixed: each snapshot's measurement on the circuit up to it
    (the state as a density matrix), a repeated tag collecting a list, as default.qubit's
    bookkeeping; trainable torch parameters under "best"."""
    def body(x):
        qml.RX(x, 0)
        qml.Snapshot("z", measurement=qml.expval(qml.Z(0)))
        qml.CNOT([0, 1])
        qml.Snapshot("rho")
        qml.Snapshot("z", measurement=qml.expval(qml.X(1)))
        return qml.expval(qml.Z(1))
    x = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    got = qml.snapshots(qml.QNode(body, qml.device("qdiff.mixed", wires=2)))(x)
    want = qml.snapshots(qml.QNode(body, qml.device("default.qubit", wires=2)))(x)
    assert got.keys() == want.keys()
    psi = want["rho"].detach().numpy()
    np.testing.assert_allclose(got["rho"].detach().numpy(), np.outer(psi, psi.conj()),
                               atol=1e-12)
    for a, b in zip(got["z"], want["z"]):
        assert float(a) == pytest.approx(float(b), abs=1e-12)
    assert float(got["execution_results"]) == pytest.approx(float(want["execution_results"]))


@pytest.mark.parametrize("make, methods", [
    (lambda p: qml.exp(qml.X(0) @ qml.Y(1), p), ("parameter-shift", "backprop")),
    (lambda p: qml.QubitUnitary(qml.math.stack([[1.0, 0.5], [0.2, 0.9]]) * p, wires=1),
     ("backprop",)),
], ids=["exp-real", "QubitUnitary"])
def test_a_trainable_matrix_that_is_not_unitary_is_refused_by_name(make, methods):
    """A trainable matrix operator runs as a unitary (as on qdiff.statevector): one that is
    not unitary (``qml.exp`` with a real coefficient) is refused, naming it, rather than run
    as a different gate. (PennyLane's parameter-shift rule decomposes a trainable
    ``QubitUnitary`` itself before the device sees it, as on default.mixed.)"""
    from pennylane import numpy as pnp

    def qfunc(p):
        qml.RY(0.4, 0)
        make(p)
        return qml.expval(qml.Z(0))
    for diff_method in methods:
        f = qml.QNode(qfunc, qml.device("qdiff.mixed", wires=2), diff_method=diff_method)
        with pytest.raises(qml.exceptions.DeviceError, match=r"on wires \[.*\]: matrix is not "
                                                             r"unitary"):
            qml.grad(f)(pnp.array(0.37, requires_grad=True))


def _trainable_unitary(k: int, seed: int, t):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(2 ** k, 2 ** k, dtype=torch.complex128, generator=g)
    return torch.linalg.matrix_exp(1j * t * (a + a.conj().T) / 2)


@pytest.mark.parametrize("diff_method", ["backprop", "best"])
@pytest.mark.parametrize("wires", [["b"], [2, "b"], [0, "b", 2]], ids=["1", "2", "3"])
def test_a_trainable_matrix_between_channels_is_differentiated_as_on_default_mixed(
        wires, diff_method):
    """A QubitUnitary whose torch matrix requires grad, between noise channels, on 1-3
    string/non-adjacent wires: one engine gate holding the matrix; expval, probs, purity
    equal default.mixed's, and their torch backprop gradients equal central finite
    differences and default.mixed's where it is finite (its own backprop gives NaN after the
    one-wire case's gates)."""
    def qfunc(t, p):
        qml.Hadamard(0)
        qml.RY(0.3, "b")
        qml.DepolarizingChannel(p, wires=0)
        qml.QubitUnitary(_trainable_unitary(len(wires), len(wires), t), wires=wires)
        qml.AmplitudeDamping(0.2, wires="b")
        qml.ctrl(qml.QubitUnitary(_trainable_unitary(1, 7, 2 * t), wires=2), control=0)
        return (qml.expval(qml.Z(0) @ qml.X("b") + 0.5 * qml.Y(2)), qml.probs(wires=[2, 0]),
                qml.purity(wires=[0, "b"]))

    def run(name, x=0.4, y=0.1):
        f = qml.QNode(qfunc, qml.device(name, wires=[0, "b", 2]), interface="torch",
                      diff_method=diff_method)
        t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        p = torch.tensor(y, dtype=torch.float64, requires_grad=True)
        e, pr, pu = f(t, p)
        loss = e + (pr * torch.tensor([0.3, -0.7, 0.2, 0.5], dtype=torch.float64)).sum() + pu
        return torch.cat([e.reshape(1), pr, pu.reshape(1)]).detach(), \
            torch.stack(torch.autograd.grad(loss, (t, p))), float(loss)
    got, want = run("qdiff.mixed"), run("default.mixed")
    torch.testing.assert_close(got[0], want[0], atol=1e-10, rtol=0)
    h = 1e-6
    fd = torch.tensor([(run("qdiff.mixed", 0.4 + h)[2] - run("qdiff.mixed", 0.4 - h)[2]) / (2 * h),
                       (run("qdiff.mixed", 0.4, 0.1 + h)[2] -
                        run("qdiff.mixed", 0.4, 0.1 - h)[2]) / (2 * h)], dtype=torch.float64)
    torch.testing.assert_close(got[1], fd, atol=1e-7, rtol=0)
    finite = torch.isfinite(want[1])
    assert finite.any() or len(wires) == 1
    torch.testing.assert_close(got[1][finite], want[1][finite], atol=1e-9, rtol=0)


def test_a_trainable_matrix_routed_for_a_noise_model_is_refused_by_name():
    """With a device noise model the circuit is translated from the matrix's values: a
    trainable matrix there is refused by name (never a result without its gradient); a
    constant one runs."""
    def qfunc(t):
        qml.Hadamard(0)
        qml.QubitUnitary(_trainable_unitary(2, 3, t), wires=[0, 1])
        return qml.expval(qml.Z(0) @ qml.X(1))
    f = qml.QNode(qfunc, qml.device("qdiff.mixed", wires=5, noise="fake_manila"),
                  interface="torch", diff_method="backprop")
    t = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(qml.exceptions.DeviceError,
                       match=r"QubitUnitary on wires \[0, 1\]: a trainable matrix in a circuit "
                             r"routed .*'fake_manila' is not differentiable"):
        f(t)
    with torch.no_grad():
        assert -1.0 <= float(f(t)) <= 1.0


@pytest.mark.parametrize("make", [
    lambda h, t: qml.TrotterProduct(h, t, n=2, order=2),
    lambda h, t: qml.evolve(qml.X(0) @ qml.Y(1), t),
    lambda h, t: qml.exp(qml.Z(1) @ qml.X(2), -0.5j * t),
])
def test_evolution_of_pauli_words_with_a_torch_time(make):
    """qml.exp/qml.evolve of a Pauli word with a torch coefficient (TrotterProduct's pieces)
    runs as its PauliRot, as on qdiff.statevector (PennyLane's own decomposition of it needs
    real_if_close, which torch lacks): the value equals the float run, the torch backprop
    gradient central finite differences."""
    h = qml.Hamiltonian([0.5, -0.3, 0.8], [qml.Z(0) @ qml.Z(1), qml.X(0), qml.Y(1) @ qml.X(2)])

    def circuit(t):
        qml.Hadamard(0)
        qml.RX(0.4, 1)
        qml.DepolarizingChannel(0.1, wires=2)
        make(h, t)
        return qml.expval(qml.Y(0) @ qml.Z(2) + qml.Z(1))

    f = qml.QNode(circuit, qml.device("qdiff.mixed", wires=3), interface="torch")
    t = torch.tensor(0.37, dtype=torch.float64, requires_grad=True)
    value = f(t)
    (grad,) = torch.autograd.grad(value, t)
    _same(value, f(0.37), 1e-12)
    eps = 1e-6
    _same(grad, (f(0.37 + eps) - f(0.37 - eps)) / (2 * eps), 1e-8)


def test_postselection_with_deferred_measurements_points_to_the_measuring_methods():
    """Deferred measurement cannot postselect on qdiff.mixed (as on default.mixed, which has no
    Projector gate): refused by name with the methods that do, which give default.qubit's
    deferred values."""
    import pennylane as qml
    from pennylane.exceptions import DeviceError

    def body(x):
        qml.RY(x, wires=0)
        qml.measure(0, postselect=1)
        qml.CNOT(wires=[0, 1])
        return qml.expval(qml.Z(1)), qml.probs(wires=[0])

    with pytest.raises(DeviceError, match="tree-traversal"):
        qml.QNode(body, qml.device("qdiff.mixed", wires=3), mcm_method="deferred")(0.7)
    ref = qml.QNode(body, qml.device("default.qubit"), mcm_method="deferred")(0.7)
    out = qml.QNode(body, qml.device("qdiff.mixed", wires=3), mcm_method="tree-traversal")(0.7)
    assert np.allclose(np.concatenate([np.ravel(r) for r in out]),
                       np.concatenate([np.ravel(r) for r in ref]), atol=1e-10)
