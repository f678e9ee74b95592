"""Noise models: rules, readout, conversion of IBM device noise (Aer density-matrix
simulation with the same noise model as the oracle), native-circuit checks, and the
trajectory method converging to the mixed engine."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import qdiff as qd

PI = math.pi


def native_layer(x, n):
    """A hardware-efficient layer in IBM's basis (rz, sx, x, cx) on a line of qubits:
    RY(t) = RZ(pi) SX RZ(t + pi) SX up to a global phase."""
    for w in range(n):
        qd.SX(wires=w)
        qd.RZ(x[w] + PI, wires=w)
        qd.SX(wires=w)
        qd.RZ(x[n + w], wires=w)
    for w in range(n - 1):
        qd.CNOT(wires=[w, w + 1])
    qd.PauliX(wires=0)


def to_qiskit(x, n, layers):
    from qiskit import QuantumCircuit
    qc = QuantumCircuit(n)
    for layer in range(layers):
        xs = x[layer]
        for w in range(n):
            qc.sx(w)
            qc.rz(float(xs[w]) + PI, w)
            qc.sx(w)
            qc.rz(float(xs[n + w]), w)
        for w in range(n - 1):
            qc.cx(w, w + 1)
        qc.x(0)
    return qc


@pytest.fixture(scope="module")
def manila():
    pytest.importorskip("qiskit_aer")
    pytest.importorskip("qiskit_ibm_runtime")
    return qd.noise.from_backend("fake_manila")


@pytest.mark.parametrize("n", [2, 3])
def test_fake_manila_density_matrix_equals_aer(manila, n):
    from qiskit_aer import AerSimulator
    from qiskit_aer.noise import NoiseModel as AerNoise
    from qiskit_ibm_runtime.fake_provider import FakeManilaV2
    layers = 2
    x = np.random.default_rng(n).uniform(-PI, PI, (layers, 2 * n))
    dev = qd.device("mixed", wires=n, noise=manila)

    @qd.qnode(dev)
    def f(t):
        for layer in range(layers):
            native_layer(t[layer], n)
        return qd.density_matrix(list(range(n))), qd.expval(qd.Z(0) @ qd.Z(n - 1)), \
            qd.expval(qd.X(1))
    rho, zz, x1 = f(torch.tensor(x))
    qc = to_qiskit(x, n, layers)
    qc.save_density_matrix()
    sim = AerSimulator(method="density_matrix", noise_model=AerNoise.from_backend(FakeManilaV2()))
    want = np.asarray(sim.run(qc).result().data()["density_matrix"])
    # Qiskit orders qubit 0 as the least significant bit: reverse the wires
    t = want.reshape([2] * (2 * n))
    want = t.transpose(list(range(n))[::-1] + list(range(n, 2 * n))[::-1]).reshape(2 ** n, 2 ** n)
    np.testing.assert_allclose(rho.numpy(), want, atol=1e-8, rtol=0)
    from qiskit.quantum_info import DensityMatrix, SparsePauliOp
    dm = DensityMatrix(sim.run(qc).result().data()["density_matrix"])
    lbl = ["I"] * n
    lbl[0] = lbl[n - 1] = "Z"
    assert abs(float(zz) - dm.expectation_value(SparsePauliOp("".join(lbl[::-1]))).real) < 1e-8
    lbl = ["I"] * n
    lbl[1] = "X"
    assert abs(float(x1) - dm.expectation_value(SparsePauliOp("".join(lbl[::-1]))).real) < 1e-8
    # the noise really acts: purity well below one
    assert float(torch.einsum("ij,ji->", rho, rho).real) < 0.99


def test_aer_noise_model_object_converts_the_same(manila):
    from qiskit_aer.noise import NoiseModel as AerNoise
    from qiskit_ibm_runtime.fake_provider import FakeManilaV2
    m2 = qd.noise.from_backend(AerNoise.from_backend(FakeManilaV2()))
    assert len(m2.rules) == len(manila.rules)
    assert set(m2.readout) == set(manila.readout)
    dev_a = qd.device("mixed", wires=2, noise=manila)
    dev_b = qd.device("mixed", wires=2, noise=m2)

    def body():
        qd.SX(wires=0)
        qd.CNOT(wires=[0, 1])
        return qd.expval(qd.Z(0) @ qd.Z(1))
    assert abs(float(qd.qnode(dev_a)(body)()) - float(qd.qnode(dev_b)(body)())) < 1e-14


def test_device_name_shortcut_and_readout_error(manila):
    dev = qd.device("mixed", wires=1, noise="fake_manila")

    @qd.qnode(dev)
    def f():
        qd.PauliX(wires=0)
        return qd.probs(wires=[0]), qd.expval(qd.Z(0))
    p, z = f()
    m = manila.readout[0]
    # the X gate's own error is tiny; readout turns |1> into M @ (0, 1)
    assert abs(float(p[0]) - float(m[0, 1])) < 2e-3
    assert abs(float(z) + 1) < 2e-3  # expval is of the state, before readout


def test_non_native_circuits_are_routed_and_the_engine_refuses_them_unrouted(manila):
    dev = qd.device("mixed", wires=3, noise=manila)

    @qd.qnode(dev)
    def f():
        qd.Hadamard(0)
        return qd.expval(qd.X(0))
    assert float(f()) > 0.9  # routed and translated: H runs as rz/sx on the device
    rec = f.construct()[0]
    with pytest.raises(qd.QdiffError, match="Hadamard.*not a basis gate of fake_manila"):
        dev.run(rec.circuit, rec.theta)

    @qd.qnode(dev)
    def g():
        qd.CNOT(wires=[0, 2])
        return qd.expval(qd.Z(0))
    rec = g.construct()[0]
    with pytest.raises(qd.QdiffError, match="not coupled on fake_manila"):
        dev.run(rec.circuit, rec.theta)
    assert not qd.noise.native(rec.circuit, manila)
    assert float(g()) > 0.9


def test_device_with_more_wires_than_the_noise_model_is_refused(manila):
    with pytest.raises(qd.QdiffError, match="describes 5 qubits"):
        qd.device("mixed", wires=6, noise=manila)


def test_rules_insert_channels_after_matching_gates_only():
    m = qd.noise.NoiseModel().add("cx", qd.BitFlip, 0.1, wires=[0, 1]).add(
        "rx", qd.PhaseFlip, 0.2)
    c = qd.Circuit(2, tuple(qd.Operation(qd.get_gate(g), w, p) for g, w, p in (
        ("cx", (0, 1), ()), ("cx", (1, 0), ()), ("rx", (1,), (0.3,)))))
    names = [(op.name, op.wires) for op in m.apply(c).operations]
    assert names == [("cx", (0, 1)), ("BitFlip", (0,)), ("BitFlip", (1,)), ("cx", (1, 0)),
                     ("rx", (1,)), ("PhaseFlip", (1,))]


def test_rules_take_pennylane_gate_names():
    """``add("CNOT", ...)`` and ``add("RX", ...)`` (PennyLane's names, as a PennyLane user
    writes them) are the rules of ``add("cx", ...)`` and ``add("rx", ...)``."""
    m = qd.noise.NoiseModel().add("CNOT", qd.BitFlip, 0.1, wires=[0, 1]).add(
        "RX", qd.PhaseFlip, 0.2).add("Toffoli", qd.PauliError, "XYZ", 0.1)
    assert [r.gate for r in m.rules] == ["cx", "rx", "ccx"]
    c = qd.Circuit(3, tuple(qd.Operation(qd.get_gate(g), w, p) for g, w, p in (
        ("cx", (0, 1), ()), ("rx", (1,), (0.3,)), ("ry", (1,), (0.3,)))))
    names = [(op.name, op.wires) for op in m.apply(c).operations]
    assert names == [("cx", (0, 1)), ("BitFlip", (0,)), ("BitFlip", (1,)), ("rx", (1,)),
                     ("PhaseFlip", (1,)), ("ry", (1,))]
    with pytest.raises(qd.QdiffError, match="unknown gate 'NotAGate'"):
        qd.noise.NoiseModel().add("NotAGate", qd.BitFlip, 0.1)


def test_a_circuit_run_under_several_models_gets_each_models_noise():
    """One circuit object under models that come and go (a sweep of noise strengths, where a
    freed model's id is reused) and under a model whose rule is replaced: each run has the
    noise of the model it runs with. Bell state after CNOT with depolarizing p on both
    wires: <ZZ> = (1 - 4p/3)**2."""
    import gc
    from qdiff.backends.mixed.engine import MixedBackend
    from qdiff.backends.mixed.measure import expval
    from qdiff.circuits.observables import as_observable
    c = qd.Circuit(2, (qd.Operation(qd.get_gate("h"), (0,)),
                       qd.Operation(qd.get_gate("cx"), (0, 1))))
    theta = torch.zeros(1, 0, dtype=torch.float64)
    obs = as_observable(qd.Z(0) @ qd.Z(1))
    for p in [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]:
        be = MixedBackend(2, noise=qd.noise.NoiseModel().add("cx", qd.DepolarizingChannel, p))
        got = float(expval(be.density_matrices(c, theta), obs, 2)[0])
        assert abs(got - (1 - 4 * p / 3) ** 2) < 1e-12, p
        del be
        gc.collect()
    m = qd.noise.NoiseModel().add("cx", qd.DepolarizingChannel, 0.3)
    be = MixedBackend(2, noise=m)
    assert abs(float(expval(be.density_matrices(c, theta), obs, 2)[0]) - 0.36) < 1e-12
    m.rules[0] = qd.noise.NoiseRule("cx", None, qd.DepolarizingChannel, (0.0,))
    assert abs(float(expval(be.density_matrices(c, theta), obs, 2)[0]) - 1.0) < 1e-12


def test_rules_take_pauli_errors_and_kraus_channels():
    """add(gate, qd.PauliError, word, p) and add(gate, qd.QubitChannel, kraus) insert the same
    channels as writing them after the gates."""
    kraus = [math.sqrt(0.7) * np.eye(2), math.sqrt(0.3) * np.array([[0, 1], [1, 0]])]
    m = qd.noise.NoiseModel().add("cx", qd.PauliError, "XZ", 0.25).add("h", qd.QubitChannel,
                                                                       kraus)

    def body(explicit):
        qd.Hadamard(0)
        if explicit:
            qd.QubitChannel(kraus, wires=0)
        qd.CNOT([0, 1])
        if explicit:
            qd.PauliError("XZ", 0.25, wires=[0, 1])
        return qd.density_matrix([0, 1])
    got = qd.qnode(qd.device("mixed", wires=2, noise=m))(body)(False)
    want = qd.qnode(qd.device("mixed", wires=2))(body)(True)
    torch.testing.assert_close(got, want, atol=1e-14, rtol=0)
    assert float(got[0, 0].real) < 0.5  # the noise acted


@pytest.mark.parametrize("call, words", [
    (lambda: qd.noise.NoiseModel().add("nope", qd.BitFlip, 0.1), ["unknown gate", "nope"]),
    (lambda: qd.noise.NoiseModel().add("cx", qd.BitFlip, 1.1), ["BitFlip", "p=1.1"]),
    (lambda: qd.noise.NoiseModel().add("cx", qd.BitFlip), ["BitFlip", "1 parameter"]),
    (lambda: qd.noise.NoiseModel().add("cx", qd.RX, 0.1), ["not a channel"]),
    (lambda: qd.noise.NoiseModel().add_readout(0, 0.1, -0.2), ["readout", "p10"]),
    (lambda: qd.noise.NoiseModel().add_readout("a", 0.1, 0.2), ["readout", "wire 'a'"]),
    (lambda: qd.noise.NoiseModel().add_readout(-1, 0.1, 0.2), ["readout", "wire -1"]),
    (lambda: qd.noise.NoiseModel().add("cx", qd.BitFlip, 0.1, wires=[0, "b"]),
     ["noise rule", "cx", "wire 'b'"]),
    (lambda: qd.noise.NoiseModel().add("rx", qd.BitFlip, 0.1, wires=-2), ["rx", "wire -2"]),
    (lambda: qd.noise.NoiseModel().add("cx", qd.BitFlip, 0.1, wires=[0]),
     ["noise rule", "cx", "2 distinct wire"]),
    (lambda: qd.noise.NoiseModel().add("cx", qd.BitFlip, 0.1, wires=[1, 1]),
     ["noise rule", "cx", "2 distinct wire"]),
    (lambda: qd.noise.NoiseModel().add("h", qd.PauliError, "XX", 0.1),
     ["noise rule", "PauliError[XX]", "2 wires", "'h' on 1"]),
    (lambda: qd.noise.NoiseModel().add("cx", qd.PauliError, 0.1), ["PauliError", "0.1"]),
    (lambda: qd.noise.NoiseModel().add("h", qd.QubitChannel), ["QubitChannel", "Kraus"]),
    (lambda: qd.noise.from_backend("fake_nowhere"), ["unknown fake IBM device"]),
    (lambda: qd.noise.from_backend(42), ["expected a device name"]),
    (lambda: qd.device("statevector", wires=1, noise=qd.noise.NoiseModel()), ["trajectories"]),
    (lambda: qd.device("statevector", wires=1, trajectories=0), ["trajectories", "0"]),
])
def test_bad_noise_input(call, words):
    with pytest.raises(qd.QdiffError) as e:
        call()
    for w in words:
        assert w in str(e.value)


# ------------------------------------------------------------------------------------------
# trajectories


def _noisy_model():
    return (qd.noise.NoiseModel().add("cx", qd.DepolarizingChannel, 0.08)
            .add("ry", qd.AmplitudeDamping, 0.15)
            .add("rz", qd.ThermalRelaxationError, 0.1, 50.0, 40.0, 5.0)
            .add("ry", qd.GeneralizedAmplitudeDamping, 0.1, 0.3))


def _body(x, p):
    for w in range(3):
        qd.RY(x[w], wires=w)
        qd.RZ(x[3 + w], wires=w)
    qd.CNOT(wires=[0, 1])
    qd.PhaseDamping(p, wires=1)
    qd.CNOT(wires=[1, 2])
    return qd.expval(qd.Z(0) @ qd.Z(2) + 0.5 * qd.X(1)), qd.probs(wires=[0])


def test_trajectories_converge_to_the_mixed_engine_within_statistical_bounds():
    k = 4000
    x = torch.tensor([0.3, 1.1, -0.7, 0.2, 0.9, 1.3], dtype=torch.float64, requires_grad=True)
    p = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    e_m, p_m = qd.qnode(qd.device("mixed", wires=3, noise=_noisy_model()))(_body)(x, p)
    gm = torch.autograd.grad(e_m, (x, p))
    traj = qd.device("statevector", wires=3, noise=_noisy_model(), trajectories=k, seed=11)
    # independent repetitions give the spread of the estimator (values and gradients)
    vals, grads = [], []
    for _ in range(6):
        e_t, p_t = qd.qnode(traj)(_body)(x, p)
        g = torch.autograd.grad(e_t, (x, p))
        vals.append(torch.cat([e_t.reshape(1), p_t.reshape(-1)]).detach())
        grads.append(torch.cat([g[0], g[1].reshape(1)]))
    vals, grads = torch.stack(vals), torch.stack(grads)
    want_v = torch.cat([e_m.reshape(1), p_m.reshape(-1)]).detach()
    want_g = torch.cat([gm[0], gm[1].reshape(1)])
    for est, want in ((vals, want_v), (grads, want_g)):
        mean, sem = est.mean(0), est.std(0) / math.sqrt(est.shape[0])
        # 5 standard errors, plus a floor for components whose spread is ~0
        assert ((mean - want).abs() <= 5 * sem + 2e-3).all(), (mean, want, sem)


def test_trajectory_gradients_at_zero_probability_estimate_the_mixed_engine():
    """At p = 0 (and pe = 0) a Kraus operator is sqrt(p) M, whose derivative is infinite: the
    trajectories differentiate the branch weight p instead. Every channel parameter's gradient
    is finite and within 5 standard errors (6 independent runs) of the mixed engine's."""
    def body(p, g, gad_p, r0, pe):
        qd.RY(0.9, wires=0)
        qd.RX(0.4, wires=1)
        qd.DepolarizingChannel(p, wires=0)
        qd.AmplitudeDamping(g, wires=1)
        qd.CNOT(wires=[0, 1])
        qd.GeneralizedAmplitudeDamping(0.3, gad_p, wires=0)
        qd.ResetError(r0, 0.1, wires=1)
        qd.ThermalRelaxationError(pe, 10.0, 15.0, 2.0, wires=0)
        qd.PauliError("XY", p, wires=[1, 0])
        return qd.expval(qd.X(0) + qd.Z(0) + qd.Z(0) @ qd.Y(1))
    zeros = [torch.tensor(0.0, dtype=torch.float64, requires_grad=True) for _ in range(5)]
    want = torch.stack(torch.autograd.grad(qd.qnode(qd.device("mixed", wires=2))(body)(*zeros),
                                           zeros))
    dev = qd.device("statevector", wires=2, trajectories=1500, seed=3)
    f = qd.qnode(dev, diff_method="backprop")(body)
    runs = torch.stack([torch.stack(torch.autograd.grad(f(*zeros), zeros)) for _ in range(6)])
    assert torch.isfinite(runs).all()
    mean, sem = runs.mean(0), runs.std(0) / math.sqrt(runs.shape[0])
    assert ((mean - want).abs() <= 5 * sem + 2e-3).all(), (mean, want, sem)


def test_trajectories_of_a_pauli_channel_on_a_basis_state_are_exact():
    dev = qd.device("statevector", wires=1, trajectories=64, seed=0)

    @qd.qnode(dev)
    def f():
        qd.PauliX(wires=0)
        qd.PhaseFlip(0.3, wires=0)  # Z on |1> only changes a global sign
        return qd.expval(qd.Z(0))
    assert abs(float(f()) + 1) < 1e-12


def test_trajectories_refuse_shots_and_unsupported_measurements():
    with pytest.raises(qd.QdiffError, match="shots"):
        qd.device("statevector", wires=1, trajectories=4, shots=10)
    dev = qd.device("statevector", wires=1, trajectories=4)

    @qd.qnode(dev)
    def f():
        qd.BitFlip(0.1, wires=0)
        return qd.state()
    with pytest.raises(qd.QdiffError, match="trajectories"):
        f()


def test_a_static_qnode_on_a_trajectory_device_samples_trajectories():
    # the record-once fast path must not run a noisy device's circuit noiselessly
    model = qd.noise.NoiseModel().add("rx", qd.BitFlip, 0.25)
    dev = qd.device("statevector", wires=1, trajectories=2000, seed=3, noise=model)

    @qd.qnode(dev, static=True)
    def f(t):
        qd.RX(t, wires=0)
        return qd.expval(qd.Z(0))

    @qd.qnode(qd.device("mixed", wires=1, noise=model))
    def g(t):
        qd.RX(t, wires=0)
        return qd.expval(qd.Z(0))

    t = torch.tensor(0.4, dtype=torch.float64)
    noiseless = math.cos(0.4)
    exact = float(g(t))
    assert abs(exact - noiseless) > 0.05  # the model does act on this circuit
    assert abs(float(f(t)) - exact) < 0.08


def test_aer_errors_on_measure_and_on_u_are_converted():
    """A quantum error Aer applies on 'measure' (before the readout error) acts on the
    outcomes of that qubit, and an error on Qiskit's 'u' follows qdiff's U3 (the same gate).
    Oracles: Aer's density-matrix counts (5 standard errors) and the closed form
    P(q0 reads 1) = 0.3 * 0.8 + 0.7 * 0.1 for an X error (0.3) then readout [[.9, .1], [.2, .8]];
    Aer's density matrix after the U3 with its error."""
    from qiskit import QuantumCircuit
    from qiskit_aer import AerSimulator
    from qiskit_aer.noise import NoiseModel as AerNoise
    from qiskit_aer.noise import ReadoutError, amplitude_damping_error, depolarizing_error, \
        pauli_error
    aer = AerNoise()
    aer.add_quantum_error(pauli_error([("X", 0.3), ("I", 0.7)]), "measure", [0])
    aer.add_readout_error(ReadoutError([[0.9, 0.1], [0.2, 0.8]]), [0])
    aer.add_quantum_error(amplitude_damping_error(0.4), "measure", [1])
    aer.add_quantum_error(depolarizing_error(0.2, 1), "u", [1])
    model = qd.noise.from_backend(aer)
    dev = qd.device("mixed", wires=2, noise=model)

    @qd.qnode(dev)
    def f():
        qd.U3(0.7, 0.3, -0.4, wires=1)
        return qd.probs([0, 1]), qd.density_matrix([1])
    p, rho1 = f()
    qc = QuantumCircuit(2)
    qc.u(0.7, 0.3, -0.4, 1)
    qc.save_density_matrix([1])
    qc.measure_all()
    res = AerSimulator(method="density_matrix", noise_model=aer).run(
        qc, shots=200000, seed_simulator=1).result()
    torch.testing.assert_close(rho1, torch.as_tensor(np.asarray(res.data()["density_matrix"])),
                               atol=1e-10, rtol=0)
    got = np.zeros(4)
    for key, v in res.get_counts().items():
        got[int(key[::-1], 2)] += v / 200000
    assert np.abs(p.numpy() - got).max() < 5 * math.sqrt(0.25 / 200000)
    assert abs(float(p[2] + p[3]) - (0.3 * 0.8 + 0.7 * 0.1)) < 1e-12


def test_aer_all_qubit_errors_are_converted_with_aer_precedence():
    """Aer's all-qubit errors (add_all_qubit_quantum_error / _readout_error, the usual way to
    build a model) act on every qubit where the gate has no error of its own; a qubit's own
    error replaces them. Oracles: Aer's density matrix (1e-10) and its counts (5 standard
    errors), with an all-qubit 'measure' error and readout error and a qubit's own readout."""
    from qiskit import QuantumCircuit
    from qiskit_aer import AerSimulator
    from qiskit_aer.noise import NoiseModel as AerNoise
    from qiskit_aer.noise import ReadoutError, amplitude_damping_error, depolarizing_error, \
        pauli_error
    aer = AerNoise()
    aer.add_all_qubit_quantum_error(depolarizing_error(0.1, 1), ["h", "rx"])
    aer.add_quantum_error(amplitude_damping_error(0.5), "h", [1])
    aer.add_all_qubit_quantum_error(depolarizing_error(0.2, 2), ["cx"])
    aer.add_all_qubit_readout_error(ReadoutError([[0.9, 0.1], [0.2, 0.8]]))
    aer.add_readout_error(ReadoutError([[0.95, 0.05], [0.3, 0.7]]), [2])
    aer.add_all_qubit_quantum_error(pauli_error([("X", 0.1), ("I", 0.9)]), "measure")

    @qd.qnode(qd.device("mixed", wires=3, noise=aer))
    def f():
        qd.Hadamard(0)
        qd.Hadamard(1)
        qd.CNOT([0, 2])
        qd.RX(0.4, wires=1)
        return qd.density_matrix([0, 1, 2]), qd.probs([0, 1, 2])
    rho, p = f()
    qc = QuantumCircuit(3)
    qc.h(0)
    qc.h(1)
    qc.cx(0, 2)
    qc.rx(0.4, 1)
    qc.save_density_matrix()
    qc.measure_all()
    res = AerSimulator(method="density_matrix", noise_model=aer).run(
        qc, shots=200000, seed_simulator=2).result()
    want = np.asarray(res.data()["density_matrix"]).reshape([2] * 6)
    want = want.transpose(2, 1, 0, 5, 4, 3).reshape(8, 8)       # Qiskit's qubit 0 is last
    np.testing.assert_allclose(rho.numpy(), want, atol=1e-10)
    got = np.zeros(8)
    for key, v in res.get_counts().items():
        got[int(key[::-1], 2)] += v / 200000
    assert np.abs(p.numpy() - got).max() < 5 * math.sqrt(0.25 / 200000)


def test_parameter_shift_names_a_channel_parameter_and_the_methods_that_take_it():
    dev = qd.device("mixed", wires=1)

    @qd.qnode(dev, diff_method="parameter-shift")
    def f(p):
        qd.RX(0.3, wires=0)
        qd.AmplitudeDamping(p, wires=0)
        return qd.expval(qd.Z(0))
    p = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    with pytest.raises(qd.QdiffError, match="channel 'AmplitudeDamping': parameter gamma.*"
                                         "no parameter-shift rule.*finite-diff"):
        f(p).backward()


@pytest.mark.parametrize("gate", ["PauliRot", "paulirot", qd.PauliRot])
def test_noise_rules_name_gate_families_made_per_word(gate):
    """A rule may name PauliRot / MultiRZ / PCPhase / QubitUnitary (made per word, width or
    matrix): it matches every instance, wide ones included (run lowered after the channels
    are inserted); equal to default.mixed with the channels written out."""
    qml = pytest.importorskip("pennylane")
    a = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    model = qd.noise.NoiseModel().add(gate, qd.DepolarizingChannel, 0.05)

    @qd.qnode(qd.device("mixed", wires=6, noise=model), diff_method="adjoint")
    def ours(a):
        qd.RY(0.4, wires=2)
        qd.PauliRot(a, "XYZXYZ", wires=range(6))
        qd.MultiRZ(0.3, wires=[0, 1])
        return qd.expval(qd.Z(0) @ qd.X(2))

    @qml.qnode(qml.device("default.mixed", wires=6), interface="torch")
    def ref(a):
        qml.RY(0.4, wires=2)
        qml.PauliRot(a, "XYZXYZ", wires=range(6))
        for w in range(6):
            qml.DepolarizingChannel(0.05, wires=w)
        qml.MultiRZ(0.3, wires=[0, 1])
        return qml.expval(qml.Z(0) @ qml.X(2))
    assert float(ours(a)) == pytest.approx(float(ref(a)), abs=1e-10)
    with pytest.raises(qd.QdiffError, match="do not name the 2 distinct wire"):
        qd.noise.NoiseModel().add("MultiRZ", qd.DepolarizingChannel, 0.05, wires=[0, 0])


def test_thermal_relaxation_long_after_t1_on_trajectories():
    """ThermalRelaxationError with tq/t1 from ~37 on (exp(-tq/t1) rounds 1 - r to 0) and
    beyond 745 (it underflows): the trajectories' branches stay finite, and agree with the
    mixed engine within their sampling error."""
    for args in [(1.0, 1.0, 1.0, 40.0), (1.0, 1.0, 2.0, 800.0), (0.3, 1.0, 0.5, 800.0)]:
        def body():
            qd.Hadamard(0)
            qd.RY(0.3, 0)
            qd.ThermalRelaxationError(*args, wires=0)
            return qd.expval(qd.Z(0))
        exact = float(qd.qnode(qd.device("mixed", wires=1))(body)())
        traj = qd.device("statevector", wires=1, trajectories=4000, seed=5)
        assert abs(float(qd.qnode(traj)(body)()) - exact) < 0.05, args


def test_finite_differences_on_trajectories_take_the_sampled_step():
    """Each shifted binding draws its own trajectories: the step is the sampled one (h = 0.1,
    as with shots), not 1e-6, which divided the sampling noise by 2e-6 (gradients off by
    10^2-10^3)."""
    nm = qd.noise.NoiseModel().add("rx", qd.DepolarizingChannel, 0.1)
    dev = qd.device("statevector", wires=1, noise=nm, trajectories=4000, seed=0)

    @qd.qnode(dev, diff_method="finite-diff")
    def f(x):
        qd.RX(x, 0)
        return qd.expval(qd.Z(0))
    x = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(f(x), x)
    exact = -(1 - 4 * 0.1 / 3) * math.sin(0.7)  # depolarizing shrinks <Z> by 1 - 4p/3
    assert abs(float(g) - exact) < 0.15
    with pytest.raises(qd.QdiffError, match="trajectories"):
        qd.qnode(dev, diff_method="adjoint")(lambda x: (qd.RX(x, 0), qd.expval(qd.Z(0)))[1])(x)


def test_readout_error_on_a_sampled_hermitian_observable_acts_on_its_largest_eigenvalue():
    """Sampling Hadamard(0) under a readout error reads its eigenbasis as a device would after
    Hadamard's RY(-pi/4): the largest eigenvalue as 0, where P(read 1 | 0) acts."""
    nm = qd.noise.NoiseModel().add_readout(0, 0.3, 0.0)
    dev = qd.device("mixed", wires=1, noise=nm, shots=40000, seed=2)

    @qd.qnode(dev)
    def f():
        qd.Hadamard(0)
        return qd.sample(qd.Hadamard(0))
    p0 = math.cos(math.pi / 8) ** 2  # P(+1) of Hadamard on |+>
    want = (0.7 * p0) - (1 - 0.7 * p0)
    assert abs(float(f().double().mean()) - want) < 4 / math.sqrt(40000)


def test_aer_noise_model_without_a_device_refuses_gates_outside_its_basis():
    """An Aer NoiseModel's noise lands on its basis gates, which Aer translates circuits into:
    a gate outside the basis whose translation would pass through noisy basis gates is refused
    (run as it is, it would be noiseless); in the basis the values are Aer's; a one-qubit gate
    outside the basis when only two-qubit gates are noisy runs (its translation is noiseless)."""
    from qiskit_aer.noise import NoiseModel as AerNoise, depolarizing_error
    nm = AerNoise(basis_gates=["cx", "rz", "sx", "x"])
    nm.add_all_qubit_quantum_error(depolarizing_error(0.1, 2), ["cx"])
    nm.add_all_qubit_quantum_error(depolarizing_error(0.05, 1), ["sx", "x"])
    model = qd.noise.from_backend(nm)

    def outside():
        qd.Hadamard(0)
        qd.CRY(0.8, wires=[0, 1])
        return qd.expval(qd.Z(1))
    with pytest.raises(qd.QdiffError, match="not one of the noise model's basis gates"):
        qd.qnode(qd.device("mixed", wires=2, noise=model))(outside)()

    def inside():
        qd.SX(0)
        qd.RZ(0.4, 0)
        qd.CNOT([0, 1])
        qd.X(1)
        return qd.expval(qd.Z(0) @ qd.Z(1)), qd.expval(qd.Y(0))
    ours = qd.qnode(qd.device("mixed", wires=2, noise=model))(inside)()
    aer = qd.qnode(qd.device("aer", wires=2, noise_model=nm, method="density_matrix"))(inside)()
    assert all(abs(float(a) - float(b)) < 1e-9 for a, b in zip(ours, aer))
    cx_only = AerNoise(basis_gates=["cx", "rz", "sx", "x"])
    cx_only.add_all_qubit_quantum_error(depolarizing_error(0.1, 2), ["cx"])

    def h_then_cx():
        qd.Hadamard(0)
        qd.CNOT([0, 1])
        return qd.expval(qd.Z(0) @ qd.Z(1))
    dev = qd.device("mixed", wires=2, noise=qd.noise.from_backend(cx_only))
    # the Bell state's <ZZ> = 1 through Aer's depolarizing_error(0.1, 2) (rho -> 0.9 rho + 0.1 I/4)
    assert abs(float(qd.qnode(dev)(h_then_cx)()) - 0.9) < 1e-9


_LOAD_NOISY_DEVICE = """
import pickle, sys, torch
import qdiff as qd
torch.set_default_dtype(torch.float64)
device, expected = pickle.loads(sys.stdin.buffer.read())

@qd.qnode(device)
def circuit(w):
    qd.X(0); qd.RX(w, wires=1); qd.CNOT(wires=[0, 1])
    return qd.probs(wires=[0, 1])

print(float((circuit(torch.tensor(0.4)) - expected).abs().max()))
"""


def test_noisy_mixed_device_pickles_into_a_fresh_process():
    """Registered channels pickle by name, a PauliError by its word, a QubitChannel by its
    Kraus matrices: a device with such a noise model loads in another process and gives
    the same probabilities."""
    import pickle
    import subprocess
    import sys
    kraus = [torch.eye(2, dtype=torch.float64) * 0.6 ** 0.5,
             torch.tensor([[0, 1], [1, 0]], dtype=torch.float64) * 0.4 ** 0.5]
    nm = (qd.noise.NoiseModel().add("cx", qd.PauliError, "XZ", 0.1)
          .add("x", qd.QubitChannel, kraus).add("rx", qd.AmplitudeDamping, 0.2)
          .add_readout(0, 0.02, 0.03))
    device = qd.device("mixed", wires=2, noise=nm)

    @qd.qnode(device)
    def circuit(w):
        qd.X(0); qd.RX(w, wires=1); qd.CNOT(wires=[0, 1])
        return qd.probs(wires=[0, 1])

    expected = circuit(torch.tensor(0.4, dtype=torch.float64))
    plain = qd.device("mixed", wires=2)
    assert float((qd.qnode(plain)(circuit.func)(torch.tensor(0.4, dtype=torch.float64))
                  - expected).abs().max()) > 1e-3  # the noise matters
    rules = pickle.loads(pickle.dumps(nm)).rules
    assert rules[2].channel is qd.AmplitudeDamping
    assert [r.channel.name for r in rules] == ["PauliError[XZ]", "QubitChannel", "AmplitudeDamping"]
    out = subprocess.run([sys.executable, "-c", _LOAD_NOISY_DEVICE],
                         input=pickle.dumps((device, expected)), capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert float(out.stdout.decode().split()[-1]) < 1e-12
