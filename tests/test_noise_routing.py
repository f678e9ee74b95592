"""Circuits not native to a noisy IBM device are routed and translated (the compiler's
``--target`` path) before they run: oracles are Aer's density-matrix simulation of the routed
circuit with the same noise model (Qiskit's own transpilation of the circuit, and the routed
circuit qdiff runs), and the noiseless values of the unrouted circuit."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import qdiff as qd

pytest.importorskip("qiskit_aer")
pytest.importorskip("qiskit_ibm_runtime")

N = 5


@pytest.fixture(scope="module")
def manila():
    return qd.noise.from_backend("fake_manila")


@pytest.fixture(scope="module")
def quiet(manila):
    """fake_manila's basis and coupling with no errors at all."""
    return qd.noise.NoiseModel(name="fake_manila", native=manila.native, num_qubits=5)


def body(x, y):
    qd.Hadamard(wires=0)
    qd.RY(x, wires=1)
    qd.CZ(wires=[0, 1])
    qd.CNOT(wires=[0, 3])          # uncoupled on the line 0-1-2-3-4
    qd.RY(2 * y + 0.3, wires=4)
    qd.CNOT(wires=[4, 1])          # uncoupled
    qd.RX(y, wires=2)
    return qd.expval(qd.Z(0) @ qd.Z(3)), qd.expval(qd.X(1) @ qd.Y(4)), qd.expval(qd.Z(2)), \
        qd.density_matrix(list(range(N)))


def _logical_qiskit():
    from qiskit import QuantumCircuit
    from qiskit.circuit import ParameterVector
    t = ParameterVector("theta", 3)
    qc = QuantumCircuit(N)
    qc.h(0)
    qc.ry(t[0], 1)
    qc.cz(0, 1)
    qc.cx(0, 3)
    qc.ry(t[1], 4)
    qc.cx(4, 1)
    qc.rx(t[2], 2)
    return qc, t


def _aer_rho(qc):
    from qiskit_aer import AerSimulator
    from qiskit_aer.noise import NoiseModel as AerNoise
    from qiskit_ibm_runtime.fake_provider import FakeManilaV2
    qc = qc.copy()
    qc.save_density_matrix()
    sim = AerSimulator(method="density_matrix", noise_model=AerNoise.from_backend(FakeManilaV2()))
    rho = np.asarray(sim.run(qc).result().data()["density_matrix"])
    n = qc.num_qubits
    t = rho.reshape([2] * (2 * n))   # Qiskit: qubit 0 least significant -> reverse
    return t.transpose(list(range(n))[::-1] + list(range(n, 2 * n))[::-1])


def _logical(rho_t, final):
    """The physical density tensor (axes 0..n-1, then their columns) seen in the order of the
    logical wires (wire i lives on physical qubit final[i])."""
    n = len(final)
    return rho_t.transpose(list(final) + [n + q for q in final]).reshape(2 ** n, 2 ** n)


def _expect(rho, paulis):
    mats = {"I": np.eye(2), "X": np.array([[0, 1], [1, 0]]), "Y": np.array([[0, -1j], [1j, 0]]),
            "Z": np.diag([1.0, -1.0])}
    op = np.array([[1.0]])
    for p in paulis:
        op = np.kron(op, mats[p])
    return float(np.trace(rho @ op).real)


def _check(outs, rho):
    zz, xy, z2, dm = (o.detach().numpy() for o in outs)
    np.testing.assert_allclose(dm, rho, atol=1e-8, rtol=0)
    assert abs(float(zz) - _expect(rho, "ZIIZI")) < 1e-8
    assert abs(float(xy) - _expect(rho, "IXIIY")) < 1e-8
    assert abs(float(z2) - _expect(rho, "IIZII")) < 1e-8


def test_a_non_native_circuit_equals_aer_on_qiskits_transpilation(manila):
    from qiskit.transpiler import generate_preset_pass_manager
    from qiskit_ibm_runtime.fake_provider import FakeManilaV2
    x, y = 0.4, -0.7
    f = qd.qnode(qd.device("mixed", wires=N, noise=manila))(body)
    outs = f(torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64))
    qc, t = _logical_qiskit()
    pm = generate_preset_pass_manager(optimization_level=1, backend=FakeManilaV2(),
                                      seed_transpiler=0)
    tq = pm.run(qc)
    final = tq.layout.final_index_layout()
    bound = tq.assign_parameters({t[0]: x, t[1]: 2 * y + 0.3, t[2]: y})
    rec = f.construct(torch.tensor(x, dtype=torch.float64),
                      torch.tensor(y, dtype=torch.float64))[0]
    routed = qd.noise.prepare(rec.circuit, manila)
    if tuple(final) != routed.final or len(routed.circuit.operations) != tq.size():
        pytest.skip("Qiskit's transpile chose another routing here (checked below against "
                    "the routed circuit itself)")
    _check(outs, _logical(_aer_rho(bound), final))
    # the noise really acts on the routed gates
    assert abs(float(outs[0]) - 1.0) > 1e-3


@pytest.mark.parametrize("x, y", [(0.4, -0.7), (2.1, 1.3)])
def test_a_non_native_circuit_equals_aer_on_the_routed_circuit(manila, x, y):
    from qdiff.circuits.qiskit_io import to_qiskit
    f = qd.qnode(qd.device("mixed", wires=N, noise=manila))(body)
    args = (torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64))
    outs = f(*args)
    rec = f.construct(*args)[0]
    assert not qd.noise.native(rec.circuit, manila)
    r = qd.noise.prepare(rec.circuit, manila)
    assert qd.noise.native(r.circuit, manila)
    assert sorted(r.final) == list(range(N))
    qc = to_qiskit(r.circuit, theta=r.theta(rec.theta).detach())
    _check(outs, _logical(_aer_rho(qc), r.final))


def test_a_u1_u2_u3_device_runs_routed_circuits_with_its_errors():
    """fake_burlington's basis is u1, u2, u3, cx: the routed circuit's u1 gates come back from
    Qiskit as p (PhaseShift), which the device runs as its u1."""
    from qiskit import QuantumCircuit
    from qiskit.circuit.library import U1Gate, U2Gate, U3Gate
    from qiskit_aer import AerSimulator
    from qiskit_aer.noise import NoiseModel as AerNoise
    from qiskit_ibm_runtime.fake_provider import FakeBurlingtonV2
    from qdiff.circuits.qiskit_io import to_qiskit
    model = qd.noise.from_backend("fake_burlington")

    def f(x, y):
        qd.Hadamard(wires=0)
        qd.RY(x, wires=1)
        qd.CZ(wires=[0, 1])
        qd.CNOT(wires=[0, 2])          # uncoupled on burlington
        qd.CRZ(y, wires=[2, 1])
        qd.S(wires=0)
        return qd.density_matrix([0, 1, 2])
    q = qd.qnode(qd.device("mixed", wires=3, noise=model))(f)
    args = (torch.tensor(0.7, dtype=torch.float64), torch.tensor(-0.4, dtype=torch.float64))
    rho = q(*args).numpy()
    rec = q.construct(*args)[0]
    r = qd.noise.prepare(rec.circuit, model)
    names = [op.name for op in r.circuit.operations]
    assert "p" in names and "u3" in names and "u2" in names
    exported = to_qiskit(r.circuit, theta=r.theta(rec.theta).detach())
    qc = QuantumCircuit(3)   # the device's spelling of each gate (the errors attach by name)
    spell = {"p": lambda a: U1Gate(a[0]), "u2": lambda a: U2Gate(*a[1:]),
             "u3": lambda a: U3Gate(*a)}
    for name, ins in zip(names, exported.data):
        op = spell[name](ins.operation.params) if name in spell else ins.operation
        qc.append(op, ins.qubits)
    qc.save_density_matrix()
    sim = AerSimulator(method="density_matrix",
                       noise_model=AerNoise.from_backend(FakeBurlingtonV2()))
    aer = np.asarray(sim.run(qc).result().data()["density_matrix"]).reshape([2] * 6)
    aer = aer.transpose([2, 1, 0, 5, 4, 3])
    np.testing.assert_allclose(rho, _logical(aer, r.final), atol=1e-10, rtol=0)


def test_a_device_with_qiskits_u_gate_runs_routed_circuits_with_its_errors():
    """Qiskit's U comes back as U3: a device whose basis is u, cx runs it as its u."""
    from qiskit.providers.fake_provider import GenericBackendV2
    from qiskit_aer import AerSimulator
    from qiskit_aer.noise import NoiseModel as AerNoise
    from qdiff.circuits.qiskit_io import to_qiskit
    be = GenericBackendV2(3, basis_gates=["cx", "u"], coupling_map=[[0, 1], [1, 2]], seed=2)

    def f(x):
        qd.Hadamard(wires=0)
        qd.CNOT(wires=[0, 2])          # uncoupled
        qd.RY(x, wires=1)
        return qd.density_matrix([0, 1, 2])
    q = qd.qnode(qd.device("mixed", wires=3, noise=be))(f)
    x = torch.tensor(0.3, dtype=torch.float64)
    rho = q(x).numpy()
    rec = q.construct(x)[0]
    r = qd.noise.prepare(rec.circuit, q.device.noise)
    qc = to_qiskit(r.circuit, theta=r.theta(rec.theta).detach())
    assert "u" in qc.count_ops()
    qc.save_density_matrix()
    sim = AerSimulator(method="density_matrix", noise_model=AerNoise.from_backend(be))
    aer = np.asarray(sim.run(qc).result().data()["density_matrix"]).reshape([2] * 6)
    aer = aer.transpose([2, 1, 0, 5, 4, 3])
    np.testing.assert_allclose(rho, _logical(aer, r.final), atol=1e-10, rtol=0)


def test_routing_never_changes_the_noiseless_answer(quiet):
    ideal = qd.qnode(qd.device("statevector", wires=N))(body)
    routed = qd.qnode(qd.device("mixed", wires=N, noise=quiet))(body)
    traj = qd.qnode(qd.device("statevector", wires=N, noise=quiet, trajectories=2))(body)
    x = torch.tensor([0.4, -1.2, 2.5], dtype=torch.float64)   # a batch of bindings
    y = torch.tensor([-0.7, 0.9, 0.1], dtype=torch.float64)
    want = ideal(x, y)
    for got in (routed(x, y), traj(x, y)):
        for a, b in zip(got[:3], want[:3]):
            assert torch.allclose(a, b, atol=1e-10, rtol=0)
    rho = routed(x, y)[3]
    psi = qd.qnode(qd.device("statevector", wires=N))(lambda x, y: (body(x, y), qd.state())[1])(
        x, y)
    assert torch.allclose(rho, psi.unsqueeze(-1) * psi.conj().unsqueeze(-2), atol=1e-10,
                          rtol=0)
    assert not qd.noise.native(routed.construct(x, y)[0].circuit, quiet)


def test_gradients_flow_through_the_routed_circuit(manila, quiet):
    def loss(dev, x, y):
        zz, xy, z2, _ = qd.qnode(dev, diff_method="backprop")(body)(x, y)
        return zz + 0.5 * xy - z2

    x = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
    y = torch.tensor(-0.7, dtype=torch.float64, requires_grad=True)
    g_quiet = torch.autograd.grad(loss(qd.device("mixed", wires=N, noise=quiet), x, y), (x, y))
    g_ideal = torch.autograd.grad(loss(qd.device("statevector", wires=N), x, y), (x, y))
    for a, b in zip(g_quiet, g_ideal):
        assert abs(float(a - b)) < 1e-10
    dev = qd.device("mixed", wires=N, noise=manila)
    g = torch.autograd.grad(loss(dev, x, y), (x, y))
    h = 1e-5
    for i, gi in enumerate(g):
        e = [0.0, 0.0]
        e[i] = h
        with torch.no_grad():
            fd = (loss(dev, x + e[0], y + e[1]) - loss(dev, x - e[0], y - e[1])) / (2 * h)
        assert abs(float(gi) - float(fd)) < 1e-8
    assert max(abs(float(a - b)) for a, b in zip(g, g_ideal)) > 1e-4  # the noise acts


def test_a_native_circuit_runs_as_written(manila):
    dev = qd.device("mixed", wires=3, noise=manila)

    @qd.qnode(dev)
    def f(t):
        qd.SX(wires=0)
        qd.RZ(t, wires=0)
        qd.CNOT(wires=[0, 1])
        qd.CNOT(wires=[2, 1])
        return qd.expval(qd.Z(1))
    t = torch.tensor(0.3, dtype=torch.float64)
    c = f.construct(t)[0].circuit
    r = qd.noise.prepare(c, manila)
    assert r.circuit is c and r.final == (0, 1, 2)


def test_a_given_layout_places_the_wires(quiet, manila):
    ideal = qd.qnode(qd.device("statevector", wires=N))(body)
    dev = qd.device("mixed", wires=N, noise=quiet, layout=[4, 3, 2, 1, 0])
    f = qd.qnode(dev)(body)
    x, y = torch.tensor(0.4, dtype=torch.float64), torch.tensor(-0.7, dtype=torch.float64)
    for a, b in zip(f(x, y)[:3], ideal(x, y)[:3]):
        assert abs(float(a - b)) < 1e-10
    r = qd.noise.prepare(f.construct(x, y)[0].circuit, quiet, layout=[4, 3, 2, 1, 0])
    assert r.initial == (4, 3, 2, 1, 0)
    with pytest.raises(qd.QdiffError, match="layout"):
        qd.device("mixed", wires=3, noise=manila, layout=[0, 1, 4])
    with pytest.raises(qd.QdiffError, match="layout.*noise model"):
        qd.device("mixed", wires=3, layout=[0, 1, 2])


def test_what_routing_cannot_fix_is_refused(manila):
    with pytest.raises(qd.QdiffError, match="describes 5 qubits"):
        qd.device("mixed", wires=6, noise=manila)

    @qd.qnode(qd.device("mixed", wires=3, noise=manila))
    def f():
        qd.Hadamard(wires=0)
        qd.BitFlip(0.1, wires=0)
        return qd.expval(qd.Z(0))
    with pytest.raises(qd.QdiffError, match="BitFlip"):
        f()
    # an engine handed a non-native circuit directly still refuses it, naming the gate
    dev = qd.device("mixed", wires=3, noise=manila)

    @qd.qnode(dev)
    def g():
        qd.Hadamard(wires=0)
        return qd.expval(qd.Z(0))
    rec = g.construct()[0]
    with pytest.raises(qd.QdiffError, match="Hadamard.*not a basis gate of fake_manila"):
        dev.run(rec.circuit, rec.theta)



def body3(t):
    qd.Hadamard(wires=0)
    qd.RY(2 * t[0], wires=1)
    qd.CNOT(wires=[0, 2])          # uncoupled on the line 0-1-2
    qd.RX(t[1], wires=2)
    return qd.expval(qd.Z(0) @ qd.Z(2)), qd.expval(qd.X(1))


def body3_dm(t):
    body3(t)
    return qd.density_matrix([0, 1, 2])


@pytest.mark.parametrize("static", [False, True])
def test_a_smaller_device_routes_on_its_own_qubits_only(manila, static):
    from qdiff.circuits.qiskit_io import to_qiskit
    dev = qd.device("mixed", wires=3, noise=manila)
    t = torch.tensor([0.3, 0.5], dtype=torch.float64, requires_grad=True)
    rec = qd.qnode(dev)(body3_dm).construct(t)[0]
    r = qd.noise.prepare(rec.circuit, manila)
    assert all(w < 3 for op in r.circuit.operations for w in op.wires)
    rho = _logical(_aer_rho(to_qiskit(r.circuit, theta=r.theta(rec.theta).detach())), r.final)
    np.testing.assert_allclose(qd.qnode(dev)(body3_dm)(t).detach().numpy(), rho, atol=1e-8,
                               rtol=0)
    f = qd.qnode(dev, static=static)(body3)
    zz, x1 = f(t)
    assert abs(float(zz.detach()) - _expect(rho, "ZIZ")) < 1e-8
    assert abs(float(x1.detach()) - _expect(rho, "IXI")) < 1e-8
    g = torch.autograd.grad(zz + x1, t)[0]
    h = 1e-5
    for i in range(2):
        e = torch.zeros(2, dtype=torch.float64)
        e[i] = h
        with torch.no_grad():
            fd = (sum(f(t + e)) - sum(f(t - e))) / (2 * h)
        assert abs(float(g[i]) - float(fd)) < 1e-8


def test_the_transpiler_runs_once_per_circuit_structure(manila):
    from qdiff.noise import _route_ops
    f = qd.qnode(qd.device("mixed", wires=N, noise=manila))(body)
    x, y = torch.tensor(0.1, dtype=torch.float64), torch.tensor(0.2, dtype=torch.float64)
    f(x, y)
    misses = _route_ops.cache_info().misses
    for k in range(3):
        f(x + k, y - k)
    assert _route_ops.cache_info().misses == misses


def test_trajectories_route_like_the_mixed_engine(manila):
    t = torch.tensor([0.3, 0.5], dtype=torch.float64)
    exact = qd.qnode(qd.device("mixed", wires=3, noise=manila))(body3)(t)
    k = 4000
    dev = qd.device("statevector", wires=3, noise=manila, trajectories=k, seed=11)

    def one(t):
        body3(t)
        return qd.expval(qd.Z(0) @ qd.Z(2))
    # every trajectory estimate of <ZZ> is bounded by 1: a standard error of at most 1/sqrt(K)
    est = qd.qnode(dev)(one)(t)
    assert abs(float(est) - float(exact[0])) < 5 / k ** 0.5
    assert abs(float(exact[0]) - 1.0) > 1e-3


# -- every entry point that runs circuits on a device with a device noise model routes them --


def prefix3():
    qd.Hadamard(wires=0)
    qd.RY(0.7, wires=2)
    qd.CNOT(wires=[0, 2])          # uncoupled on the line 0-1-2


def layered3(w):
    prefix3()
    qd.RY(w[0], wires=2)           # one layer: both depend on the CNOT, not on each other
    qd.RX(w[1], wires=0)
    return qd.expval(qd.Z(0))


def _routed_rho(manila, record):
    """Aer's noisy density matrix (logical wire order) of the routed circuit of ``record``."""
    from qdiff.circuits.qiskit_io import to_qiskit
    rec = record()
    r = qd.noise.prepare(rec.circuit, manila)
    qc = to_qiskit(r.circuit, theta=r.theta(rec.theta).detach())
    return _logical(_aer_rho(qc), r.final)


@pytest.mark.parametrize("approx", ["block-diag", "diag"])
def test_metric_tensor_measures_the_routed_layers_under_noise(manila, approx):
    dev = qd.device("mixed", wires=3, noise=manila)
    w = torch.tensor([0.3, -0.4], dtype=torch.float64, requires_grad=True)
    g = qd.metric_tensor(qd.qnode(dev)(layered3), approx=approx)(w)
    pre = qd.qnode(dev)(lambda: (prefix3(), qd.density_matrix([0, 1, 2]))[1])
    rho = _routed_rho(manila, lambda: pre.construct()[0])
    y2, x0, x0y2 = _expect(rho, "IIY"), _expect(rho, "XII"), _expect(rho, "XIY")
    want = np.array([[1 - y2 ** 2, x0y2 - x0 * y2], [x0y2 - x0 * y2, 1 - x0 ** 2]]) / 4
    if approx == "diag":
        want = np.diag(np.diag(want))
    np.testing.assert_allclose(g.numpy(), want, atol=1e-8, rtol=0)
    ideal = qd.metric_tensor(qd.qnode(qd.device("statevector", wires=3))(layered3),
                             approx=approx)(w)
    assert float((g - ideal).abs().max()) > 1e-3   # the noise acts


def deep3(w):
    qd.Hadamard(wires=0)
    qd.RY(w[0], wires=1)
    qd.CNOT(wires=[0, 2])
    qd.RX(w[1], wires=2)
    qd.CRY(w[2], wires=[2, 0])
    qd.RZ(w[3], wires=1)
    qd.CNOT(wires=[1, 2])
    qd.RY(w[4], wires=0)
    return qd.expval(qd.Z(0) @ qd.Z(1))


def test_metric_tensor_of_routed_layers_is_the_noiseless_metric_without_errors(quiet):
    w = torch.tensor([0.3, -0.4, 0.8, 1.1, -0.2], dtype=torch.float64, requires_grad=True)
    want = qd.metric_tensor(qd.qnode(qd.device("statevector", wires=3))(deep3))(w)
    for dev in (qd.device("mixed", wires=3, noise=quiet),
                qd.device("statevector", wires=3, noise=quiet, trajectories=2)):
        got = qd.metric_tensor(qd.qnode(dev)(deep3))(w)
        assert torch.allclose(got, want, atol=1e-10, rtol=0)
    assert float((torch.diag(want) - 0.25).abs().max()) > 0.1   # states the layers depend on


def test_metric_tensor_on_trajectories_estimates_the_mixed_one(manila):
    w = torch.tensor([0.3, -0.4], dtype=torch.float64, requires_grad=True)
    exact = qd.metric_tensor(qd.qnode(qd.device("mixed", wires=3, noise=manila))(layered3))(w)
    k = 4000
    dev = qd.device("statevector", wires=3, noise=manila, trajectories=k, seed=5)
    est = qd.metric_tensor(qd.qnode(dev)(layered3))(w)
    assert float((est - exact).abs().max()) < 5 / k ** 0.5


def test_full_metric_tensor_refuses_mixed_states(manila):
    w = torch.tensor([0.3, -0.4], dtype=torch.float64, requires_grad=True)
    for dev in (qd.device("mixed", wires=3, noise=manila), qd.device("mixed", wires=3),
                qd.device("statevector", wires=3, noise=manila, trajectories=4)):
        with pytest.raises(qd.QdiffError, match="pure state.*block-diag"):
            qd.metric_tensor(qd.qnode(dev)(layered3), approx=None)(w)


def test_qng_steps_with_the_routed_metric(manila):
    dev = qd.device("mixed", wires=3, noise=manila)
    f = qd.qnode(dev)(layered3)
    w = torch.tensor([0.3, -0.4], dtype=torch.float64, requires_grad=True)
    want = qd.metric_tensor(f)(w)
    opt = qd.QNGOptimizer([w], f, lr=0.1)
    opt.zero_grad()
    f(w).backward()
    opt.step()
    assert torch.allclose(opt.last_metric, want, atol=1e-12, rtol=0)


def test_qnspsa_fidelities_run_the_routed_overlap_circuit(manila, quiet):
    from qdiff.optimize import _overlap_circuit, fidelities
    from qdiff.circuits.qiskit_io import to_qiskit

    def f(w):
        qd.Hadamard(wires=0)
        qd.RY(w[0], wires=1)
        qd.CNOT(wires=[0, 2])
        qd.RX(w[1], wires=2)
        return qd.expval(qd.Z(0))
    base = torch.tensor([0.3, -0.4], dtype=torch.float64)
    shifts = torch.tensor([[0.0, 0.0], [0.2, -0.1], [-0.3, 0.5]], dtype=torch.float64)
    ideal = fidelities(qd.qnode(qd.device("statevector", wires=3))(f), (base,), [0], base,
                       shifts)
    got = fidelities(qd.qnode(qd.device("mixed", wires=3, noise=quiet))(f), (base,), [0], base,
                     shifts)
    assert torch.allclose(got, ideal, atol=1e-10, rtol=0)
    noisy = fidelities(qd.qnode(qd.device("mixed", wires=3, noise=manila))(f), (base,), [0],
                       base, shifts)
    rec = qd.qnode(qd.device("mixed", wires=3))(f).construct(base)[0]
    over = _overlap_circuit(rec.circuit)
    for k, s in enumerate(shifts):
        theta = torch.cat([rec.theta, rec.theta + s[[0, 1]].reshape(1, -1)], dim=1)
        r = qd.noise.prepare(over, manila)
        rho = _aer_rho(to_qiskit(r.circuit, theta=r.theta(theta)))   # physical qubit order
        probs = torch.tensor(np.diag(rho.reshape(8, 8)).real).reshape(1, 8)
        read = manila.readout_probs(probs, [0, 1, 2])   # P(0...0) as read out on the device
        assert abs(float(noisy[k]) - float(read[0, 0])) < 1e-8
    assert float(noisy[0]) < 1 - 1e-3     # noise lowers the overlap of a state with itself


@pytest.mark.parametrize("kind", ["device", "custom", "trajectories"])
def test_mid_circuit_measurements_on_a_noisy_device_are_refused(manila, kind):
    if kind == "device":
        dev = qd.device("mixed", wires=3, noise=manila)
    elif kind == "custom":
        dev = qd.device("mixed", wires=3, noise=qd.noise.NoiseModel().add(
            "cx", qd.DepolarizingChannel, 0.01))
    else:
        dev = qd.device("statevector", wires=3, noise=manila, trajectories=4)

    @qd.qnode(dev)
    def f():
        qd.Hadamard(wires=0)
        m = qd.measure(0)
        qd.cond(m, qd.PauliX)(wires=1)
        return qd.expval(qd.Z(1))
    with pytest.raises(qd.QdiffError, match="mid-circuit measurements on a noisy device"):
        f()

    def trained(t):
        qd.RY(t[0], wires=0)
        m = qd.measure(0)
        qd.cond(m, qd.RX)(t[1], wires=1)
        qd.CNOT(wires=[1, 2])
        return qd.expval(qd.Z(2))
    t = torch.tensor([0.3, 0.5], dtype=torch.float64, requires_grad=True)
    # every entry point that runs the circuit refuses alike: a replay, the metric tensor,
    # and the counts and drawing of the circuit that would run
    assert "m0" in qd.draw(qd.qnode(dev)(trained))(t)   # the circuit as written
    for run in (lambda: qd.qnode(dev, static=True)(trained)(t),
                lambda: qd.specs(qd.qnode(dev)(trained))(t),
                lambda: qd.draw(qd.qnode(dev)(trained), level="device")(t),
                lambda: qd.metric_tensor(qd.qnode(dev)(trained), approx="block-diag")(t),
                lambda: qd.metric_tensor(qd.qnode(dev)(trained), approx="diag")(t)):
        with pytest.raises(qd.QdiffError, match="mid-circuit measurements on a noisy device"):
            run()


def test_specs_count_the_routed_circuit(manila):
    dev = qd.device("mixed", wires=3, noise=manila)
    w = torch.tensor([0.3, -0.4], dtype=torch.float64, requires_grad=True)
    f = qd.qnode(dev)(layered3)
    s = qd.specs(f)(w)
    r = qd.noise.prepare(f.construct(w)[0].circuit, manila)
    counts: dict = {}
    for op in r.circuit.operations:
        counts[op.gate.pl_name or op.name] = counts.get(op.gate.pl_name or op.name, 0) + 1
    assert s["gate_types"] == counts and "Hadamard" not in counts
    assert s["num_operations"] == len(r.circuit.operations)
    assert s["routed_for"] == "fake_manila"

    @qd.qnode(dev)
    def g(t):
        qd.SX(wires=0)
        qd.RZ(t, wires=0)
        qd.CNOT(wires=[0, 1])
        return qd.expval(qd.Z(1))
    s = qd.specs(g)(torch.tensor(0.3, dtype=torch.float64))
    assert s["routed_for"] is None and s["gate_types"] == {"SX": 1, "RZ": 1, "CNOT": 1}
    assert qd.specs(qd.qnode(qd.device("statevector", wires=3))(layered3))(w)["routed_for"] is None


def test_a_qiskit_circuit_on_a_noisy_device_is_routed(manila):
    from qiskit import QuantumCircuit
    from qiskit.circuit import Parameter
    from qdiff.circuit_qnode import CircuitQNode
    a = Parameter("a")
    qc = QuantumCircuit(3)
    qc.h(0)
    qc.ry(a, 1)
    qc.cx(0, 2)
    dev = qd.device("mixed", wires=3, noise=manila)
    qn = CircuitQNode(qc, dev, observables=[qd.Z(0) @ qd.Z(2), qd.X(1)])

    def f(t):
        qd.Hadamard(wires=0)
        qd.RY(t, wires=1)
        qd.CNOT(wires=[0, 2])
        return qd.expval(qd.Z(0) @ qd.Z(2)), qd.expval(qd.X(1))
    t = torch.tensor(0.7, dtype=torch.float64)
    want = qd.qnode(dev)(f)(t)
    got = qn(t.reshape(1)).reshape(-1)
    assert torch.allclose(got, want, atol=1e-12, rtol=0)
    assert abs(float(want[0]) - 1.0) > 1e-3


def test_aer_with_a_device_noise_model_runs_the_translated_gates():
    """Aer's noise model of a device has errors only on the device's basis gates and coupled
    pairs: a Hadamard must run as the rz/sx/rz it is on the device (noisy sx), and a CNOT on an
    uncoupled pair is refused rather than run noiselessly."""
    from qiskit_ibm_runtime.fake_provider import FakeManilaV2
    aer = qd.device("aer", wires=2, method="density_matrix", noise_model=FakeManilaV2())
    mixed = qd.device("mixed", wires=2, noise="fake_manila")

    def logical(t):
        qd.Hadamard(wires=0)
        qd.CNOT(wires=[0, 1])
        qd.RZ(t, wires=1)
        return qd.expval(qd.X(0) @ qd.X(1)), qd.expval(qd.Z(0))

    def native(t):   # H = RZ(pi/2) SX RZ(pi/2) up to phase
        qd.RZ(np.pi / 2, wires=0)
        qd.SX(wires=0)
        qd.RZ(np.pi / 2, wires=0)
        qd.CNOT(wires=[0, 1])
        qd.RZ(t, wires=1)
        return qd.expval(qd.X(0) @ qd.X(1)), qd.expval(qd.Z(0))
    t = torch.tensor(0.4, dtype=torch.float64)
    got = qd.qnode(aer)(logical)(t)
    want = qd.qnode(mixed)(native)(t)
    assert torch.allclose(got, want, atol=1e-8, rtol=0)
    noiseless = qd.qnode(qd.device("statevector", wires=2))(logical)(t)
    assert float((got - noiseless).abs().max()) > 1e-3
    wide = qd.device("aer", wires=3, method="density_matrix", noise_model=FakeManilaV2())

    @qd.qnode(wide)
    def uncoupled():
        qd.Hadamard(wires=0)
        qd.CNOT(wires=[0, 2])
        return qd.expval(qd.Z(2))
    with pytest.raises(qd.QdiffError, match=r"'cx' on qubits \[0, 2\].*noiselessly"):
        uncoupled()


def test_state_of_a_routed_circuit_is_refused_and_density_matrix_follows_the_wires(manila):
    """The routed circuit's state is of the physical qubits (its wires moved): state() is refused
    with the reason, on the mixed device and with trajectories; density_matrix of the logical
    wires is the one checked against Aer above."""
    for dev in (qd.device("mixed", wires=3, noise=manila),
                qd.device("statevector", wires=3, noise=manila, trajectories=2)):
        @qd.qnode(dev)
        def f():
            qd.Hadamard(wires=0)
            qd.CNOT(wires=[0, 2])
            return qd.state()
        with pytest.raises(qd.QdiffError, match="state\\(\\)"):
            f()


def test_draw_shows_the_routed_circuit_at_the_device_level(manila):
    f = qd.qnode(qd.device("mixed", wires=3, noise=manila))(layered3)
    w = torch.tensor([0.3, -0.4], dtype=torch.float64)
    top, device = qd.draw(f)(w), qd.draw(f, level="device")(w)
    assert "Hadamard" in top and "Hadamard" not in device and "SX" in device
    routed = qd.noise.prepare(f.construct(w)[0].circuit, manila).circuit
    assert device.count("SX") == sum(op.name == "sx" for op in routed.operations)
    plain = qd.qnode(qd.device("statevector", wires=3))(layered3)
    assert qd.draw(plain, level="device")(w) == qd.draw(plain)(w)
    with pytest.raises(qd.QdiffError, match="level"):
        qd.draw(f, level="gradient")


@pytest.mark.parametrize("source", ["generic", "named"])
def test_any_qiskit_backend_routes_on_itself(source):
    """A model made from any Qiskit backend (GenericBackendV2, not a named fake device), or
    from a fake device under a name of the user's, routes non-native circuits on that backend:
    the values equal Aer's density matrix of the routed circuit with the backend's noise."""
    from qiskit.providers.fake_provider import GenericBackendV2
    from qiskit_aer import AerSimulator
    from qiskit_aer.noise import NoiseModel as AerNoise
    from qiskit_ibm_runtime.fake_provider import FakeManilaV2
    from qdiff.circuits.qiskit_io import to_qiskit
    if source == "generic":
        backend = GenericBackendV2(num_qubits=N, coupling_map=[[i, i + 1] for i in range(N - 1)],
                                   seed=11)
        model = qd.noise.from_backend(backend)
    else:
        backend = FakeManilaV2()
        model = qd.noise.from_backend("fake_manila", name="my_device")
    f = qd.qnode(qd.device("mixed", wires=N, noise=model))(body)
    args = (torch.tensor(0.4, dtype=torch.float64), torch.tensor(-0.7, dtype=torch.float64))
    outs = f(*args)
    rec = f.construct(*args)[0]
    assert not qd.noise.native(rec.circuit, model)
    r = qd.noise.prepare(rec.circuit, model)
    qc = to_qiskit(r.circuit, theta=r.theta(rec.theta).detach())
    qc.save_density_matrix()
    sim = AerSimulator(method="density_matrix", noise_model=AerNoise.from_backend(backend))
    rho = np.asarray(sim.run(qc).result().data()["density_matrix"]).reshape([2] * (2 * N))
    rho = rho.transpose(list(range(N))[::-1] + list(range(N, 2 * N))[::-1])
    _check(outs, _logical(rho, r.final))
    assert abs(float(outs[0]) - 1.0) > 1e-3  # the backend's noise acts
