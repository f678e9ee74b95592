"""qd.device("aer"): exact mode against the torch statevector simulator (1e-10), shots within
5 standard errors, noise against closed forms, one simulator run per execute, transpile cache."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import qdiff as qd
from conftest import close_up_to_phase
from qdiff import QdiffError, QdiffMemoryError
from qdiff.circuits.circuit import Circuit
from qdiff.circuits.gates import GATES
from qdiff.circuits.measurements import Measurement
from qdiff.circuits.observables import Observable
from qdiff.circuits.operation import Operation, ParamRef


def _mixed(x, w):
    qd.Hadamard(0)
    qd.RX(x, wires=0)
    qd.RY(w[0], wires=1)
    qd.CNOT([0, 1])
    qd.CRZ(w[1], wires=[1, 2])
    qd.Rot(w[0], x, w[1], wires=2)
    qd.IsingXX(w[2], wires=[0, 2])
    qd.SingleExcitation(x, wires=[1, 2])
    qd.PauliRot(w[1], "XYZ", wires=[0, 1, 2])
    qd.CRY(x, wires=[2, 0])
    qd.ControlledPhaseShift(w[2], wires=[0, 1])
    qd.S(1)
    qd.T(2)
    qd.SX(0)
    qd.ISWAP([1, 2])
    qd.U3(x, w[0], w[1], wires=1)


def _measured(x, w):
    _mixed(x, w)
    return [qd.expval(qd.Z(0) @ qd.X(1) - 0.3 * qd.Y(2) + 0.2),
            qd.var(0.5 * qd.X(0) + qd.Z(2)),
            qd.expval(qd.Hermitian(torch.tensor([[1.0, 2.0 - 1j], [2.0 + 1j, -0.5]]), wires=1))]


X = torch.tensor([0.1, 0.7, -1.3, 2.2], dtype=torch.float64)
W = torch.tensor([0.4, -0.9, 1.7], dtype=torch.float64)


def test_exact_matches_statevector_to_1e10():
    dev = qd.device("aer", wires=3)
    got = qd.qnode(dev)(_measured)(X, W)
    ref = qd.qnode(qd.device("statevector", wires=3))(_measured)(X, W)
    assert torch.allclose(got, ref, atol=1e-10, rtol=0)
    assert dev.jobs_submitted == 1  # four bindings, three measurements: one simulator run


@pytest.mark.parametrize("gate", ["crx", "cry", "crz", "cp", "crot"])
def test_controlled_rotations_with_bound_parameters(gate):
    """Aer 0.18 miscomputes parametrized controlled rotations bound through parameter_binds;
    qdiff compiles them away, so the result must equal the statevector's."""
    g = GATES[gate]

    def f(t):
        qd.Hadamard(0)
        qd.RY(0.7, wires=1)
        g(*([t] * g.num_params), wires=[0, 1])
        return [qd.expval(qd.Y(1)), qd.expval(qd.X(0) @ qd.X(1))]
    t = torch.tensor([0.3, 1.1, -2.0], dtype=torch.float64)
    got = qd.qnode(qd.device("aer", wires=2))(f)(t)
    ref = qd.qnode(qd.device("statevector", wires=2))(f)(t)
    assert torch.allclose(got, ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", ["rx", "ry", "rz", "p", "rot"])
def test_controlled_gates_with_constant_and_affine_angles(name):
    """One and two controls, constant angles and ParamRef(i, scale, offset) angles."""
    from qdiff.circuits.gates import controlled_gate
    from qdiff.circuits.observables import Factor
    g = GATES[name]
    x = torch.tensor([[0.4, -1.1]], dtype=torch.float64)
    zs = tuple(Measurement("expval", Observable([1.0], [(Factor((w,), "Z"),)])) for w in range(3))
    for wires in ((2, 1), (0, 2, 1)):
        for params in ((0.9, -0.4, 1.3), (ParamRef(0, 2.0, 0.1), ParamRef(1, -0.5, 0.3), 0.7)):
            ops = (Operation(GATES["h"], (0,)), Operation(GATES["h"], (2,)),
                   Operation(GATES["rx"], (1,), (0.3,)),
                   Operation(controlled_gate(g, len(wires) - 1), wires, params[:g.num_params]))
            c = Circuit(3, ops, zs, 2)
            ref = qd.qnode(qd.device("statevector", wires=3))(c)(x)
            got = qd.qnode(qd.device("aer", wires=3))(c)(x)
            assert torch.allclose(got, ref, atol=1e-10, rtol=0), (wires, params)


def test_probs_and_state_exact():
    def f(x, w):
        _mixed(x, w)
        return qd.probs(wires=[2, 0])

    def s(x, w):
        _mixed(x, w)
        return qd.state()
    dev = qd.device("aer", wires=3, method="statevector")
    sv = qd.device("statevector", wires=3)
    assert torch.allclose(qd.qnode(dev)(f)(X, W), qd.qnode(sv)(f)(X, W), atol=1e-10, rtol=0)
    got, ref = qd.qnode(dev)(s)(X, W), qd.qnode(sv)(s)(X, W)
    assert all(close_up_to_phase(a, b) for a, b in zip(got, ref))  # transpiling drops phases


def _swapped(x):
    qd.RX(x[0], wires=0)
    qd.RY(x[1], wires=1)
    qd.Hadamard(2)
    qd.RZ(x[2], wires=3)
    qd.SWAP([0, 2])
    qd.CNOT([2, 3])
    qd.SWAP([1, 3])
    qd.RY(x[3], wires=0)
    qd.SWAP([0, 1])
    return [qd.expval(qd.X(0) @ qd.Y(3) + 0.3 * qd.Z(1)), qd.expval(qd.Y(2)),
            qd.var(qd.X(1) @ qd.Z(2)), qd.probs(wires=[3, 0]), qd.state()]


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_exact_outputs_follow_swaps_at_every_optimization_level(level):
    """Levels 2-3 elide SWAPs into a final qubit permutation: expectations, probabilities and
    the state are read from the qubit holding each wire at the end."""
    x = torch.rand(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 3
    ref = qd.qnode(qd.device("statevector", wires=4))(_swapped)(x)
    got = qd.qnode(qd.device("aer", wires=4, optimization_level=level))(_swapped)(x)
    for g, r in zip(got[:4], ref[:4]):
        assert torch.allclose(g, r, atol=1e-10)
    assert all(close_up_to_phase(a, b) for a, b in zip(got[4], ref[4]))


def test_affine_and_shared_parameters():
    """ParamRef scale/offset (as produced by compiled circuits) and a column used twice."""
    ops = (Operation(GATES["rx"], (0,), (ParamRef(0, 2.0, 0.5),)),
           Operation(GATES["ry"], (1,), (ParamRef(0, -1.0, 0.0),)),
           Operation(GATES["cx"], (0, 1)),
           Operation(GATES["rz"], (1,), (ParamRef(1, 0.5, -0.25),)))
    meas = (Measurement("expval", Observable.pauli("Z", 0) @ Observable.pauli("X", 1)),
            Measurement("expval", Observable.pauli("Y", 1)))
    c = Circuit(2, ops, meas, 2)
    theta = torch.tensor([[0.3, 1.0], [-0.8, 2.5]], dtype=torch.float64)
    got = qd.device("aer", wires=2).run(c, theta)
    ref = qd.device("statevector", wires=2).run(c, theta)
    for a, b in zip(got, ref):
        assert torch.allclose(a, b, atol=1e-10, rtol=0)


def test_initial_states_per_row_in_one_run():
    def f(v, w):
        qd.AmplitudeEmbedding(v, wires=[0, 1], normalize=True)
        qd.RY(w, wires=0)
        qd.CNOT([0, 1])
        return qd.expval(qd.Z(1) + 0.5 * qd.X(0))
    gen = torch.Generator().manual_seed(3)
    v = torch.rand(3, 4, generator=gen, dtype=torch.float64) + 0.1
    w = torch.tensor([0.2, -0.4, 1.0], dtype=torch.float64)
    dev = qd.device("aer", wires=2)
    got = qd.qnode(dev)(f)(v, w)
    ref = qd.qnode(qd.device("statevector", wires=2))(f)(v, w)
    assert torch.allclose(got, ref, atol=1e-10, rtol=0)
    assert dev.jobs_submitted == 1


def test_transpile_cache_reused_across_parameter_values():
    dev = qd.device("aer", wires=3)
    f = qd.qnode(dev)(_measured)
    f(X, W)
    f(X + 0.3, W * 2)
    assert dev.transpile_cache.misses == 1 and dev.transpile_cache.hits == 1


def test_shots_within_five_standard_errors():
    shots = 4000
    dev = qd.device("aer", wires=3, shots=shots, seed=11)

    def f(x, w):
        _mixed(x, w)
        return [qd.expval(qd.Z(0)), qd.expval(qd.X(1) @ qd.Y(2))]

    def v(x, w):
        _mixed(x, w)
        return [qd.var(qd.Z(0)), qd.var(qd.X(1) @ qd.Y(2))]
    got = qd.qnode(dev)(f)(X, W)
    sv = qd.device("statevector", wires=3)
    ref = qd.qnode(sv)(f)(X, W)
    se = (qd.qnode(sv)(v)(X, W) / shots).sqrt()
    assert ((got - ref).abs() <= 5 * se + 1e-12).all()
    assert dev.jobs_submitted == 1  # both bases in one Sampler job


def test_shots_probs_samples_counts_and_seed():
    def f(x):
        qd.RX(x, wires=0)
        qd.CNOT([0, 1])
        return [qd.probs(wires=[0, 1]), qd.sample(wires=[1, 0]), qd.sample(qd.Z(0) @ qd.Z(1))]
    x = torch.tensor([0.4, 2.0], dtype=torch.float64)
    p, bits, zz = qd.qnode(qd.device("aer", wires=2, shots=3000, seed=5))(f)(x)
    assert bits.shape == (2, 3000, 2) and zz.shape == (2, 3000)
    assert torch.equal(zz, torch.ones_like(zz))  # ZZ = +1 on a Bell-type state
    assert torch.equal(bits[..., 0], bits[..., 1])
    p_ref = torch.stack([torch.cos(x / 2) ** 2, torch.zeros(2), torch.zeros(2),
                         torch.sin(x / 2) ** 2], dim=-1)
    assert ((p - p_ref).abs() <= 5 * (p_ref * (1 - p_ref) / 3000).sqrt() + 1e-9).all()
    dev = qd.device("aer", wires=2, shots=3000, seed=5)
    again = qd.qnode(dev)(f)(x)
    assert torch.equal(again[1], bits)  # the same seed repeats the sequence
    assert not torch.equal(qd.qnode(dev)(f)(x)[1], bits)  # a later call samples afresh

    def g():
        qd.PauliX(0)
        return qd.counts(wires=[0, 1])
    assert qd.qnode(qd.device("aer", wires=2, shots=50))(g)() == {"10": 50}


def test_depolarizing_noise_matches_closed_form():
    """rho -> (1-p) rho + p I/2 after the RX: <Z> = (1-p) cos(theta), exactly (density matrix)."""
    from qiskit_aer.noise import NoiseModel, depolarizing_error
    p = 0.2
    nm = NoiseModel()
    nm.add_all_qubit_quantum_error(depolarizing_error(p, 1), ["rx"])
    dev = qd.device("aer", wires=1, method="density_matrix", noise_model=nm)
    t = torch.tensor([0.0, 0.9, 2.5], dtype=torch.float64)
    got = qd.qnode(dev)(lambda t: (qd.RX(t, wires=0), qd.expval(qd.Z(0)))[1])(t)
    assert torch.allclose(got, (1 - p) * torch.cos(t), atol=1e-10, rtol=0)


def test_parameter_shift_gradients_match_backprop():
    def f(x, w):
        _mixed(x, w)
        return qd.expval(qd.Z(0) @ qd.X(1) - 0.3 * qd.Y(2))
    x, w = X.clone().requires_grad_(), W.clone().requires_grad_()
    dev = qd.device("aer", wires=3)
    gx, gw = torch.autograd.grad(qd.qnode(dev)(f)(x, w).sum(), [x, w])
    rx, rw = torch.autograd.grad(qd.qnode(qd.device("statevector", wires=3),
                                          diff_method="backprop")(f)(x, w).sum(), [x, w])
    assert torch.allclose(gx, rx, atol=1e-9) and torch.allclose(gw, rw, atol=1e-9)
    assert dev.jobs_submitted == 2  # forward + every shift of the backward pass


def test_errors():
    with pytest.raises(QdiffError, match="unknown Aer method 'fast'"):
        qd.device("aer", wires=2, method="fast")
    with pytest.raises(QdiffMemoryError, match="40 qubits"):
        qd.device("aer", wires=40)
    with pytest.raises(QdiffError, match="noise_model must be"):
        qd.device("aer", wires=1, noise_model="lots")
    with pytest.raises(QdiffError, match="optimization_level must be 0..3; got True"):
        qd.device("aer", wires=1, optimization_level=True)
    with pytest.raises(QdiffError, match="sample\\(\\) needs a device with shots"):
        qd.qnode(qd.device("aer", wires=1))(lambda: qd.sample(wires=[0]))()
    with pytest.raises(QdiffError, match="state\\(\\) is not available"):
        qd.qnode(qd.device("aer", wires=1, shots=10))(lambda: qd.state())()
    with pytest.raises(QdiffError, match="sample\\(op\\).*commute"):
        qd.qnode(qd.device("aer", wires=1, shots=10))(lambda: qd.sample(qd.X(0) + qd.Z(0)))()


@pytest.mark.parametrize("make", [lambda: qd.device("aer", wires=2),
                                  lambda: qd.device("aer", wires=2, shots=100),
                                  lambda: qd.device("ibm", backend="fake_manila", wires=2)])
def test_channels_are_refused_naming_the_channel(make):
    @qd.qnode(make())
    def f(p):
        qd.Hadamard(0)
        qd.DepolarizingChannel(p, wires=1)
        return qd.expval(qd.Z(1))
    with pytest.raises(QdiffError, match=r"channel 'DepolarizingChannel' on wires \[1\].*mixed"):
        f(0.1)


def test_qdiff_import_does_not_import_qiskit():
    import subprocess
    import sys
    code = ("import sys, qdiff as qd; qd.device('statevector', wires=1); "
            "print(any(m.split('.')[0] in ('qiskit', 'qiskit_aer', 'pennylane') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_repr():
    assert repr(qd.device("aer", wires=2, shots=10)) == \
        "<AerBackend wires=2, shots=10, method='automatic'>"
    assert math.isfinite(float(qd.qnode(qd.device("aer", wires=1))(
        lambda: (qd.Hadamard(0), qd.expval(qd.X(0)))[1])()))
    assert np.isclose(float(qd.qnode(qd.device("aer", wires=1))(
        lambda: (qd.Hadamard(0), qd.expval(qd.X(0)))[1])()), 1.0)


def _noisy_model(p=0.2):
    from qiskit_aer.noise import NoiseModel, depolarizing_error
    nm = NoiseModel()
    nm.add_all_qubit_quantum_error(depolarizing_error(p, 1), ["rx", "ry"])
    nm.add_all_qubit_quantum_error(depolarizing_error(p, 2), ["cx"])
    return nm


def test_exact_noisy_expectations_are_exact_or_refused():
    """shots=None with a noise model: the density matrix's exact values (quantum_info oracle),
    the same on every call; a trajectory method (random averages) is refused."""
    from qiskit import QuantumCircuit
    from qiskit.quantum_info import DensityMatrix, SparsePauliOp
    from qiskit_aer.noise import depolarizing_error
    p, x = 0.2, 0.4
    qc = QuantumCircuit(2)
    qc.rx(x, 0)
    qc.cx(0, 1)
    qc.ry(x, 1)
    rho = DensityMatrix.from_label("00")
    errors = (depolarizing_error(p, 1), depolarizing_error(p, 2), depolarizing_error(p, 1))
    for inst, err in zip(qc.data, errors):
        qargs = [qc.find_bit(q).index for q in inst.qubits]
        rho = rho.evolve(inst.operation, qargs).evolve(err, qargs)
    want = [float(np.real(rho.expectation_value(SparsePauliOp(lbl)))) for lbl in ("IZ", "ZI")]

    def f(t):
        qd.RX(t, wires=0)
        qd.CNOT(wires=[0, 1])
        qd.RY(t, wires=1)
        return qd.expval(qd.Z(0)), qd.expval(qd.Z(1))

    t = torch.tensor(x, dtype=torch.float64)
    for method in ("automatic", "density_matrix"):
        node = qd.qnode(qd.device("aer", wires=2, noise_model=_noisy_model(p), method=method))(f)
        for _ in range(2):
            assert np.allclose(node(t).numpy(), want, atol=1e-10, rtol=0)
    for method in ("statevector", "matrix_product_state"):
        with pytest.raises(QdiffError, match=f"method='{method}' with a noise model and "
                                             "shots=None"):
            qd.device("aer", wires=2, noise_model=_noisy_model(p), method=method)
    dev = qd.device("aer", wires=2, noise_model=_noisy_model(p), method="statevector", shots=100)
    assert dev.backend_options["method"] == "statevector"


def test_options_are_honoured_or_refused_when_the_device_is_made():
    """An AerSimulator option qdiff sets from its own keyword cannot be overridden silently
    through backend_options; devices, methods and options this Aer build lacks are refused
    at once; the options that pass reach the simulator."""
    from qiskit_aer import AerSimulator
    for key in ("method", "device", "noise_model", "shots", "seed_simulator"):
        with pytest.raises(QdiffError, match=f"backend_options={{'{key}': ...}}: pass it as"):
            qd.device("aer", wires=1, backend_options={key: None})
    with pytest.raises(QdiffError, match="backend_options not accepted.*Invalid option foo"):
        qd.device("aer", wires=1, backend_options={"foo": 1})
    with pytest.raises(QdiffError, match="backend_options must be a dict"):
        qd.device("aer", wires=1, backend_options=[("precision", "single")])
    missing = [d for d in ("GPU", "xyz") if d not in AerSimulator().available_devices()]
    for dev in missing:
        with pytest.raises(QdiffError, match=f"device='{dev}' is not available"):
            qd.device("aer", wires=1, device=dev)
    assert qd.device("aer", wires=1, device="cpu").backend_options["device"] == "CPU"
    for method in ("unitary", "superop"):
        with pytest.raises(QdiffError, match=f"method '{method}' .* cannot measure"):
            qd.device("aer", wires=1, method=method)
    dev = qd.device("aer", wires=1, method="density_matrix",
                    backend_options={"precision": "single"})
    assert dev.simulator().options.method == "density_matrix"
    assert dev.simulator().options.precision == "single"


@pytest.mark.parametrize("method", ["stabilizer", "extended_stabilizer"])
def test_clifford_methods_run_clifford_circuits_and_refuse_the_rest(method):
    """Clifford circuits run under the Clifford methods (the 1-qubit gates are not merged into
    a 'u' they cannot run); a non-Clifford rotation is a QdiffError naming the method, from
    the exact and the sampled run alike."""
    shots = None if method == "stabilizer" else 200

    def f(t):
        qd.RX(t, wires=0)
        return qd.expval(qd.Z(0))

    with pytest.raises(QdiffError, match=method):
        qd.qnode(qd.device("aer", wires=1, method=method, shots=10))(f)(torch.tensor(0.3))
    if shots is None:
        with pytest.raises(QdiffError, match=method):
            qd.qnode(qd.device("aer", wires=1, method=method))(f)(torch.tensor(0.3))
    else:
        with pytest.raises(QdiffError, match="'extended_stabilizer' has no exact"):
            qd.device("aer", wires=1, method=method)

    def clifford():
        qd.Hadamard(0)
        qd.S(0)
        qd.CNOT(wires=[0, 1])
        return qd.expval(qd.Y(0) @ qd.X(1)), qd.expval(qd.Z(1))

    got = qd.qnode(qd.device("aer", wires=2, method=method, shots=shots, seed=3))(clifford)()
    want = qd.qnode(qd.device("statevector", wires=2))(clifford)()
    assert torch.allclose(got[0], want[0], atol=1e-12) and abs(float(got[1])) < 0.3


def test_result_buffers_are_checked_before_the_run(monkeypatch):
    """Shot bits (every basis, every binding) and saved states are stated against the memory
    budget before Aer runs; the same call fits without the cap."""
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "1M")

    def f():
        qd.Hadamard(0)
        return qd.expval(qd.Z(0) @ qd.X(1))

    with pytest.raises(QdiffMemoryError, match="the bits of 100000 shots x 1 bindings"):
        qd.qnode(qd.device("aer", wires=2, shots=100_000))(f)()

    def g(x):
        qd.RX(x, wires=0)
        return qd.state()

    x = torch.linspace(0, 1, 4000, dtype=torch.float64)
    with pytest.raises(QdiffMemoryError, match="saved states/probabilities of 4000 bindings"):
        qd.qnode(qd.device("aer", wires=4))(g)(x)
    monkeypatch.delenv("QDIFF_MEMORY_LIMIT")
    assert qd.qnode(qd.device("aer", wires=4))(g)(x[:3]).shape == (3, 16)


def test_exact_probabilities_go_through_the_noise_models_readout_errors():
    """Aer saves the state's probabilities (no readout errors, which it applies to counts):
    the exact probs of a noisy Aer device go through the model's readout errors, as with
    shots and on the mixed engine; expval stays the state's."""
    from qiskit_aer.noise import NoiseModel, ReadoutError
    nm = NoiseModel()
    nm.add_readout_error(ReadoutError([[0.7, 0.3], [0.0, 1.0]]), [0])

    def body():
        qd.Identity(0)
        return qd.probs(wires=[0]), qd.expval(qd.Z(0))
    p, z = qd.qnode(qd.device("aer", wires=1, noise_model=nm, method="density_matrix"))(body)()
    assert np.allclose(np.asarray(p), [0.7, 0.3]) and abs(float(z) - 1.0) < 1e-12
    pm, zm = qd.qnode(qd.device("mixed", wires=1, noise=qd.noise.from_backend(nm)))(body)()
    assert np.allclose(np.asarray(pm), np.asarray(p)) and abs(float(zm) - float(z)) < 1e-12


def test_shots_other_than_the_devices_are_refused_when_asked():
    """Aer (as every Qiskit or PennyLane device backend) takes its shots from the device: a
    qnode or a call asking for others is refused where it asks, naming the way to get them."""
    def f(x):
        qd.RY(x, wires=0)
        return qd.expval(qd.Z(0))
    exact, sampled = qd.device("aer", wires=1), qd.device("aer", wires=1, shots=100, seed=1)
    with pytest.raises(qd.QdiffError, match=r"shots=50: backend 'aer' takes its shots from the "
                                            r"device \(None\); create the device with shots=50"):
        qd.qnode(exact, shots=50)(f)
    with pytest.raises(qd.QdiffError, match=r"shots=None: .* \(100\)"):
        qd.qnode(sampled)(f)(torch.tensor(0.3), shots=None)
    x = torch.tensor(0.3, dtype=torch.float64)
    assert abs(float(qd.qnode(exact, shots=None)(f)(x)) - np.cos(0.3)) < 1e-12


def test_backend_run_of_a_qiskit_circuit_points_to_the_qnode():
    from qiskit import QuantumCircuit
    qc = QuantumCircuit(1)
    qc.h(0)
    dev = qd.device("aer", wires=1)
    with pytest.raises(qd.QdiffError, match=r"aer.run: expected a qdiff Circuit; got "
                                            r"QuantumCircuit .*qd.qnode\(dev\)\(qc\)"):
        dev.run(qc)


def test_stabilizer_method_names_a_non_clifford_gate_and_its_angle():
    """Under method="stabilizer" a gate whose angle makes it no Clifford gate is refused naming
    the gate, its wires and the angle (float32 pi/2 is one, with a hint); Clifford angles run."""
    import math
    dev = qd.device("aer", wires=2, method="stabilizer", shots=200, seed=3)

    @qd.qnode(dev)
    def f(x):
        qd.H(1)
        qd.RX(x, wires=0)
        qd.CRZ(2 * x, wires=[0, 1])
        return qd.expval(qd.Z(1))
    with pytest.raises(QdiffError, match=r"gate 'RX' on wires \[0\] with angle\(s\) "
                                         r"1.57079637.*not a Clifford gate.*float64"):
        f(torch.tensor(math.pi / 2, dtype=torch.float32))
    with pytest.raises(QdiffError, match=r"gate 'RX' on wires \[0\] with angle\(s\) 0.3"):
        f(torch.tensor(0.3, dtype=torch.float64))
    out = f(torch.tensor([math.pi, math.pi / 2], dtype=torch.float64))
    assert out.shape == (2,) and torch.all(out.abs() <= 1)


def test_seeded_shots_run_on_a_sampler_that_refuses_a_run_options_seed(monkeypatch):
    """qiskit-aer 0.17's SamplerV2 passes a ``run_options`` seed_simulator to
    ``AerSimulator.run`` next to its own (a TypeError): the device's seed is the sampler's
    own ``seed``, and the same seed repeats the same bits."""
    import qiskit_aer.primitives as aer_primitives
    base = aer_primitives.SamplerV2

    class Sampler017(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if "seed_simulator" in self.options.run_options:
                raise TypeError("AerBackend.run() got multiple values for keyword argument "
                                "'seed_simulator'")
    monkeypatch.setattr(aer_primitives, "SamplerV2", Sampler017)

    def f():
        qd.Hadamard(0)
        return qd.sample(wires=[0])
    first = qd.qnode(qd.device("aer", wires=1, shots=64, seed=3))(f)()
    again = qd.qnode(qd.device("aer", wires=1, shots=64, seed=3))(f)()
    assert first.shape == (64, 1) and torch.equal(first, again)
    assert 0 < int(first.sum()) < 64


def _two_structures(dev):
    @qd.qnode(dev)
    def f(x):
        qd.RY(x, wires=0)
        qd.CNOT([0, 1])
        return qd.expval(qd.Z(1))

    @qd.qnode(dev)
    def g(x):
        qd.RX(x, wires=1)
        qd.SWAP([0, 1])
        return qd.expval(qd.Z(0))
    return f, g


def test_threads_sharing_a_device_transpile_one_at_a_time(monkeypatch):
    """Qiskit's PassManager.run keeps its run's state on the pass manager (two runs at once
    fail with "Already borrowed" or could mix layouts): a thread whose circuit needs
    transpiling while another thread transpiles waits for it, and both get their values."""
    import threading

    import qiskit.transpiler as transpiler
    make = transpiler.generate_preset_pass_manager
    dev = qd.device("aer", wires=2, optimization_level=2)
    f, g = _two_structures(dev)
    x = torch.tensor(0.4, dtype=torch.float64)
    other, seen = [], {}

    class Watched:
        def __init__(self, pm):
            self.pm = pm

        def run(self, qc):
            if not other:  # the first run: another thread's circuit arrives meanwhile
                other.append(threading.Thread(target=lambda: seen.setdefault("g", g(x))))
                other[0].start()
                other[0].join(timeout=1.0)
                seen["overlapped"] = not other[0].is_alive()
            return self.pm.run(qc)
    monkeypatch.setattr(transpiler, "generate_preset_pass_manager",
                        lambda *a, **k: Watched(make(*a, **k)))
    value = f(x)
    other[0].join()
    assert seen["overlapped"] is False
    assert torch.allclose(value, torch.cos(x), atol=1e-10)
    assert torch.allclose(seen["g"], torch.cos(x), atol=1e-10)


def test_a_pass_manager_built_twice_at_once_is_kept_once(monkeypatch):
    """Two threads that both find no pass manager build one each: the first published serves
    every later circuit, so all of them run through one lock."""
    import threading

    import qiskit.transpiler as transpiler
    make = transpiler.generate_preset_pass_manager
    dev = qd.device("aer", wires=2)
    f, g = _two_structures(dev)
    x = torch.tensor(0.4, dtype=torch.float64)
    built, seen = [], {}

    def building(*a, **k):
        pm = make(*a, **k)
        built.append(pm)
        if len(built) == 1:  # another thread builds and publishes its own meanwhile
            t = threading.Thread(target=lambda: seen.setdefault("g", g(x)))
            t.start()
            t.join()
        return pm
    monkeypatch.setattr(transpiler, "generate_preset_pass_manager", building)
    assert torch.allclose(f(x), torch.cos(x), atol=1e-10)
    assert torch.allclose(seen["g"], torch.cos(x), atol=1e-10)
    assert len(built) == 2
    kept = dev.pass_manager(lambda: pytest.fail("a third pass manager was built"))
    assert kept.pm is built[1]
    g(torch.tensor(0.1, dtype=torch.float64))  # cached; a new structure uses the kept one
    assert len(built) == 2
