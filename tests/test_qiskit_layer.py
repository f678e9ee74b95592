"""Qiskit circuits as torch layers and qnodes: ``QuantumLayer.from_qiskit`` against Qiskit
Machine Learning's EstimatorQNN (values and gradients, float64), every diff method, the weight
order, errors, batching, state_dict, torch.compile, Aer and IBM fake devices, and
``qd.qnode(dev)(circuit)`` for QuantumCircuits, Circuits and OpenQASM imports."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff import QdiffError

METHODS = ["best", "backprop", "adjoint", "parameter-shift", "finite-diff"]
GRAD_TOL = {"finite-diff": 1e-5}


def classifier(n=3, reps=1):
    from qiskit.circuit.library import real_amplitudes, zz_feature_map
    fm, ansatz = zz_feature_map(n), real_amplitudes(n, reps=reps)
    return fm, ansatz, fm.compose(ansatz)


def observables():
    from qiskit.quantum_info import SparsePauliOp
    return [SparsePauliOp("ZZZ"), SparsePauliOp.from_list([("XIZ", 0.3), ("IYY", -0.7)])]


@pytest.fixture(scope="module")
def qml_reference():
    """Qiskit ML's exact forward and backward (float64 numpy) on zz_feature_map + real_amplitudes."""
    from qiskit.primitives import StatevectorEstimator
    from qiskit_machine_learning.neural_networks import EstimatorQNN
    fm, ansatz, qc = classifier()
    qnn = EstimatorQNN(circuit=qc, observables=observables(), input_params=fm.parameters,
                       weight_params=ansatz.parameters, estimator=StatevectorEstimator(),
                       input_gradients=True, default_precision=0.0)
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 2, (4, 3))
    w = rng.uniform(0, 2 * np.pi, ansatz.num_parameters)
    fwd = qnn.forward(x, w)
    gx, gw = qnn.backward(x, w)
    return x, w, fwd, gx, gw


@pytest.mark.parametrize("method", METHODS)
def test_layer_matches_qiskit_ml_values_and_gradients(qml_reference, method):
    x, w, fwd, gx, gw = qml_reference
    fm, ansatz, qc = classifier()
    layer = qd.QuantumLayer.from_qiskit(qc, input_params=fm.parameters,
                                        weight_params=ansatz.parameters,
                                        observables=observables(), diff_method=method,
                                        init_method=torch.tensor(w))
    xt = torch.tensor(x, requires_grad=True)
    out = layer(xt)
    assert out.shape == (4, 2) and out.dtype == torch.float64
    np.testing.assert_allclose(out.detach().numpy(), fwd, atol=1e-12)
    tol = GRAD_TOL.get(method, 1e-10)
    for k in range(2):  # one output at a time: the full Jacobians, not only their sum
        g_x, g_w = torch.autograd.grad(out[:, k].sum(), [xt, layer.weights], retain_graph=True)
        np.testing.assert_allclose(g_x.numpy(), gx[:, k, :], atol=tol)
        np.testing.assert_allclose(g_w.numpy(), gw[:, k, :].sum(0), atol=tol)


def test_weights_follow_weight_params_order_and_default_observable():
    from qiskit.quantum_info import SparsePauliOp, Statevector
    fm, ansatz, qc = classifier()
    order = list(ansatz.parameters)[::-1]
    layer = qd.QuantumLayer.from_qiskit(qc, input_params=list(fm.parameters), weight_params=order)
    (weights,) = list(layer.parameters())
    assert tuple(weights.shape) == (len(order),)
    x = torch.tensor([0.3, -0.2, 1.1], dtype=torch.float64)
    out = layer(x)
    assert out.shape == (1,)  # Z on every qubit, one observable
    vals = dict(zip(fm.parameters, x.tolist())) | dict(zip(order, weights.tolist()))
    ref = Statevector(qc.assign_parameters(vals)).expectation_value(SparsePauliOp("ZZZ")).real
    assert abs(float(out[0]) - ref) < 1e-12


def test_parameter_vectors_and_their_elements_name_parameters():
    from qiskit import QuantumCircuit
    from qiskit.circuit import ParameterVector
    from qiskit.quantum_info import SparsePauliOp, Statevector
    x, w = ParameterVector("x", 2), ParameterVector("w", 2)
    qc = QuantumCircuit(2)
    qc.ry(x[0], 0); qc.ry(x[1], 1); qc.rx(w[0], 0); qc.rx(w[1], 1); qc.cx(0, 1)
    layer = qd.QuantumLayer.from_qiskit(qc, input_params=x, weight_params=w)
    ref_layer = qd.QuantumLayer.from_qiskit(qc, input_params=list(x), weight_params=list(w))
    ref_layer.load_state_dict(layer.state_dict())
    xs = torch.rand(3, 2, dtype=torch.float64)
    out = layer(xs).detach()
    assert out.shape == (3, 1)
    assert torch.allclose(out, ref_layer(xs), atol=0)
    vals = dict(zip(x, xs[0].tolist())) | dict(zip(w, layer.weights.tolist()))
    ref = Statevector(qc.assign_parameters(vals)).expectation_value(SparsePauliOp("ZZ")).real
    assert abs(float(out[0, 0]) - ref) < 1e-12
    # a single element names one parameter; a vector not in the circuit is refused
    from qdiff.circuit_qnode import CircuitQNode
    g = CircuitQNode(qc, qd.device("statevector", wires=2), arguments={"a": x[1], "b": [x[0], w]})
    assert g.arg_sizes == (1, 3)
    xy = torch.tensor([0.3, 0.4, -0.2, 0.9], dtype=torch.float64)  # x[0], x[1], w[0], w[1]
    plain = qd.qnode(qd.device("statevector", wires=2))(qc)  # columns w[0], w[1], x[0], x[1]
    assert torch.allclose(g(xy[1:2], xy[[0, 2, 3]]), plain(xy[[2, 3, 0, 1]]), atol=1e-14)
    with pytest.raises(QdiffError, match=r"v\[0\].*not a parameter"):
        qd.QuantumLayer.from_qiskit(qc, input_params=x, weight_params=ParameterVector("v", 2))


def test_layer_errors_name_the_parameter_or_observable():
    from qiskit.circuit import Parameter
    from qiskit.quantum_info import SparsePauliOp
    fm, ansatz, qc = classifier()
    w = list(ansatz.parameters)
    with pytest.raises(QdiffError, match=r"θ\[5\].*in none of inputs / weights"):
        qd.QuantumLayer.from_qiskit(qc, fm.parameters, w[:-1])
    with pytest.raises(QdiffError, match=r"'θ\[0\]' is listed in both inputs and weights"):
        qd.QuantumLayer.from_qiskit(qc, list(fm.parameters) + [w[0]], w)
    with pytest.raises(QdiffError, match=r"'θ\[1\]' is listed twice in weights"):
        qd.QuantumLayer.from_qiskit(qc, fm.parameters, w + [w[1]])
    with pytest.raises(QdiffError, match=r"Parameter\(zz\).*not a parameter"):
        qd.QuantumLayer.from_qiskit(qc, fm.parameters, w + [Parameter("zz")])
    with pytest.raises(QdiffError, match=r"observables\[1\] acts on 2 qubit\(s\); the circuit has 3"):
        qd.QuantumLayer.from_qiskit(qc, fm.parameters, w,
                                    observables=[SparsePauliOp("ZZZ"), SparsePauliOp("ZZ")])
    with pytest.raises(QdiffError, match=r"observables\[0\] acts on wire 3"):
        qd.QuantumLayer.from_qiskit(qc, fm.parameters, w, observables=[qd.Z(3)])
    for key, value in (("input_gradients", True), ("interpret", lambda i: i % 2),
                       ("estimator", object())):  # Qiskit ML's keywords, said to be theirs
        with pytest.raises(QdiffError, match=rf"from_qiskit: {key}= is EstimatorQNN/Sampler"):
            qd.QuantumLayer.from_qiskit(qc, fm.parameters, w, **{key: value})
    layer = qd.QuantumLayer.from_qiskit(qc, fm.parameters, w)
    with pytest.raises(QdiffError, match=r"argument 'inputs' has shape \(5, 2\); expected \(\.\.\., 3\)"):
        layer(torch.zeros(5, 2))
    with pytest.raises(QdiffError, match=r"parameter 'x\[1\]' has a NaN"):
        layer(torch.tensor([0.0, float("nan"), 0.0]))


def test_batches_state_dict_and_qdiff_observables():
    fm, ansatz, qc = classifier()
    obs = [qd.Z(0), 0.5 * qd.X(1) @ qd.Y(2) - qd.Z(2)]
    a = qd.QuantumLayer.from_qiskit(qc, fm.parameters, ansatz.parameters, observables=obs)
    b = qd.QuantumLayer.from_qiskit(qc, fm.parameters, ansatz.parameters, observables=obs)
    b.load_state_dict(a.state_dict())
    assert list(a.state_dict()) == ["weights"]
    x = torch.rand(2, 5, 3, dtype=torch.float64)
    out = a(x)
    assert out.shape == (2, 5, 2)
    assert torch.allclose(out, b(x), atol=0)
    rows = torch.stack([a(x[i, j]) for i in range(2) for j in range(5)]).reshape(2, 5, 2)
    assert torch.allclose(out, rows, atol=1e-13)
    # float32 models: .float() casts the weights; outputs follow
    assert a.float()(x.float()).dtype == torch.float32


def test_torch_compile_and_training_step():
    fm, ansatz, qc = classifier()
    torch.manual_seed(0)
    model = torch.nn.Sequential(qd.QuantumLayer.from_qiskit(qc, fm.parameters, ansatz.parameters),
                                torch.nn.Linear(1, 1)).double()
    x = torch.rand(8, 3, dtype=torch.float64)
    y = (x.sum(1, keepdim=True) > 1.5).double()
    compiled = torch.compile(model, backend="eager")
    g_eager = torch.autograd.grad(model(x).sub(y).pow(2).sum(), list(model.parameters()))
    g_comp = torch.autograd.grad(compiled(x).sub(y).pow(2).sum(), list(model.parameters()))
    for a, b in zip(g_eager, g_comp):
        assert torch.allclose(a, b, atol=1e-12)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0]


def test_aer_backend_matches_statevector():
    fm, ansatz, qc = classifier()
    w = torch.rand(ansatz.num_parameters, dtype=torch.float64)
    ref = qd.QuantumLayer.from_qiskit(qc, fm.parameters, ansatz.parameters,
                                      observables=observables(), init_method=w)
    aer = qd.QuantumLayer.from_qiskit(qc, fm.parameters, ansatz.parameters,
                                      observables=observables(), init_method=w, device="aer")
    x = torch.rand(3, 3, dtype=torch.float64)
    out_r, out_a = ref(x), aer(x)
    assert torch.allclose(out_r, out_a, atol=1e-10)
    g_r = torch.autograd.grad(out_r.sum(), ref.weights)[0]
    g_a = torch.autograd.grad(out_a.sum(), aer.weights)[0]
    assert torch.allclose(g_r, g_a, atol=1e-9)


def test_ibm_fake_device_trains():
    from qiskit.quantum_info import SparsePauliOp
    fm, ansatz, qc = classifier(n=2)
    dev = qd.device("ibm", backend="fake_manila", wires=2, shots=2000, seed=4, primitive="v2")
    w = torch.rand(ansatz.num_parameters, dtype=torch.float64)
    obs = [SparsePauliOp("ZZ")]
    layer = qd.QuantumLayer.from_qiskit(qc, fm.parameters, ansatz.parameters, observables=obs,
                                        device=dev, init_method=w)
    ideal = qd.QuantumLayer.from_qiskit(qc, fm.parameters, ansatz.parameters, observables=obs,
                                        init_method=w)
    x = torch.tensor([[0.2, 0.9], [1.3, -0.4]], dtype=torch.float64)
    out = layer(x)
    assert (out - ideal(x)).abs().max() < 0.15  # readout/gate noise of fake_manila
    (g,) = torch.autograd.grad(out.sum(), layer.weights)
    (g_ideal,) = torch.autograd.grad(ideal(x).sum(), ideal.weights)
    assert torch.isfinite(g).all() and (g - g_ideal).abs().max() < 0.3


def test_qnode_of_quantum_circuit_circuit_and_import_agree():
    from qdiff.circuits import qasm
    from qdiff.circuits.qiskit_io import from_qiskit
    fm, ansatz, qc = classifier()
    obs = observables()
    dev = qd.device("statevector", wires=3)
    vals = torch.rand(2, 4, qc.num_parameters, dtype=torch.float64)
    f_qc = qd.qnode(dev, observables=obs)(qc)
    out = f_qc(vals)
    assert out.shape == (2, 4, 2)
    imp = from_qiskit(qc)
    assert torch.allclose(qd.qnode(dev, observables=obs)(imp)(vals), out, atol=0)
    # a bare Circuit takes full theta columns: parameters, then the expression columns
    theta = imp.theta(vals.reshape(8, -1)).reshape(2, 4, -1)
    assert torch.allclose(qd.qnode(dev, observables=obs)(imp.circuit)(theta), out, atol=1e-14)
    # bindings by mapping, broadcast leading shapes
    mapping = {p: vals[..., i] for i, p in enumerate(qc.parameters)}
    mapping[qc.parameters[0].name] = mapping.pop(qc.parameters[0])
    assert torch.allclose(f_qc(mapping), out, atol=0)
    # one observable: no trailing dim
    assert qd.qnode(dev, observables=obs[0])(qc)(vals).shape == (2, 4)
    # through OpenQASM 3 (the exporter spells x[0] as the identifier _x_0_)
    text = qasm.dumps(imp, version=3)
    again = qasm.loads(text)
    assert [p.name for p in again.parameters] == [
        "_" + p.name.replace("[", "_").replace("]", "_") for p in qc.parameters]
    assert torch.allclose(qd.qnode(dev, observables=obs)(again)(vals), out, atol=1e-12)


def test_library_circuit_classes_run_as_qnodes_layers_and_compile():
    """Qiskit's library classes (QFT, RealAmplitudes, ...) are QuantumCircuit subclasses: each
    door takes them as the circuits they are."""
    from qiskit.circuit.library import QFT, RealAmplitudes
    from qiskit.quantum_info import SparsePauliOp, Statevector
    ansatz = RealAmplitudes(3, reps=1)
    vals = np.linspace(0.2, 1.4, ansatz.num_parameters)
    obs = SparsePauliOp.from_list([("XZY", 0.4), ("ZZI", -0.8)])
    ref = Statevector(ansatz.assign_parameters(vals)).expectation_value(obs).real
    out = qd.qnode(qd.device("statevector", wires=3), observables=obs)(ansatz)(torch.tensor(vals))
    assert abs(out.item() - ref) < 1e-12
    layer = qd.QuantumLayer.from_qiskit(ansatz, input_params=[], weight_params=ansatz.parameters,
                                        observables=obs, init_method=torch.tensor(vals))
    assert abs(layer(torch.zeros(1, 0, dtype=torch.float64)).item() - ref) < 1e-12
    qft = QFT(3, approximation_degree=1, inverse=True)
    xxx = SparsePauliOp("XXX")
    f = qd.qnode(qd.device("statevector", wires=3), observables=xxx)(qft)
    assert abs(f().item() - Statevector(qft).expectation_value(xxx).real) < 1e-12
    compiled, report = qd.compile(qft, level=1)
    assert compiled.num_wires == 3
    assert report.verified and report.infidelity < 1e-12


def test_qnode_of_a_circuit_without_parameters_is_called_without_bindings():
    from qiskit import QuantumCircuit
    qc = QuantumCircuit(2)
    qc.h(0)
    qc.cx(0, 1)
    f = qd.qnode(qd.device("statevector", wires=2), observables=["XX", "ZI"])(qc)
    assert torch.allclose(f(), torch.tensor([1.0, 0.0], dtype=torch.float64), atol=1e-12)
    assert torch.equal(f(), f(torch.zeros(0, dtype=torch.float64)))
    assert f(torch.zeros(3, 0, dtype=torch.float64)).shape == (3, 2)


@pytest.mark.parametrize("method", METHODS)
def test_parameters_only_in_the_global_phase_have_zero_gradients(method):
    """A global phase is unobservable: every method gives the gradient 0, and backward() runs
    (backprop included, where no gate reads the column)."""
    from qiskit import QuantumCircuit
    from qiskit.circuit import Parameter
    from qiskit.circuit.library import GlobalPhaseGate
    a, b = Parameter("a"), Parameter("b")
    qc = QuantumCircuit(1, global_phase=2 * a)
    qc.append(GlobalPhaseGate(b), [])
    qc.h(0)
    f = qd.qnode(qd.device("statevector", wires=1), observables="X", diff_method=method)(qc)
    x = torch.tensor([0.3, -0.2], dtype=torch.float64, requires_grad=True)
    y = f(x)
    assert abs(y.item() - 1.0) < 1e-12
    y.backward()
    assert torch.allclose(x.grad, torch.zeros(2, dtype=torch.float64), atol=1e-6)


def test_qnode_of_circuit_with_measurements_returns_probabilities():
    from qiskit import QuantumCircuit
    from qiskit.quantum_info import Statevector
    from qiskit.circuit import Parameter
    a = Parameter("a")
    qc = QuantumCircuit(3, 2)
    qc.ry(a, 0)
    qc.cx(0, 2)
    qc.h(1)
    qc.measure(2, 0)
    qc.measure(0, 1)
    p = qd.qnode(qd.device("statevector", wires=3))(qc)(torch.tensor([[0.7]], dtype=torch.float64))
    probs = Statevector(qc.remove_final_measurements(inplace=False).assign_parameters([0.7]))
    ref = probs.probabilities([2, 0])  # index = bit(q2) + 2 bit(q0) = c0 + 2 c1
    assert p.shape == (1, 4)
    assert np.allclose(p[0].numpy(), ref, atol=1e-12)


def test_qnode_of_a_circuit_whose_clbit_is_measured_twice_reads_the_last_measurement():
    """``measure(0, 0); measure(1, 0)``: the one classical bit holds qubit 1, as Qiskit's
    counts say; qubit 0's overwritten outcome is no output."""
    from qiskit import QuantumCircuit
    qc = QuantumCircuit(2, 1)
    qc.ry(0.6, 0)
    qc.x(1)
    qc.measure(0, 0)
    qc.measure(1, 0)
    p = qd.qnode(qd.device("statevector", wires=2))(qc)(torch.zeros(1, 0, dtype=torch.float64))
    assert p.shape == (1, 2)
    assert np.allclose(p[0].numpy(), [0.0, 1.0], atol=1e-12)


def test_qnode_errors():
    from qiskit import QuantumCircuit
    from qiskit.circuit import Parameter
    qc = QuantumCircuit(2)
    qc.rx(Parameter("a"), 0)
    with pytest.raises(QdiffError, match="circuit has 2 qubits but the device has 3"):
        qd.qnode(qd.device("statevector", wires=3))(qc)
    f = qd.qnode(qd.device("statevector", wires=2))(qc)
    with pytest.raises(QdiffError, match=r"binding for 'b': not a parameter"):
        f({"b": 1.0})
    with pytest.raises(QdiffError, match=r"no binding for parameter\(s\) 'a'"):
        f({})
    with pytest.raises(QdiffError, match="expected a callable, a Circuit"):
        qd.qnode(qd.device("statevector", wires=2))(3)
    with pytest.raises(QdiffError, match="unknown diff_method"):
        qd.qnode(qd.device("statevector", wires=2), diff_method="magic")(qc)


def test_qnode_mapping_of_python_numbers_binds_float64():
    """``{a: 0.3}`` binds 0.3 as Qiskit does (float64), not torch's float32 default."""
    from qiskit import QuantumCircuit
    from qiskit.circuit import Parameter
    a = Parameter("a")
    qc = QuantumCircuit(1)
    qc.rx(a, 0)
    f = qd.qnode(qd.device("statevector", wires=1))(qc)
    for value in (0.3, [0.3], np.float64(0.3), np.array(0.3)):
        assert abs(f({a: value}).reshape(-1)[0].item() - np.cos(0.3)) < 1e-14
        assert abs(f({"a": value}).reshape(-1)[0].item() - np.cos(0.3)) < 1e-14


@pytest.mark.parametrize("method", ["best", "backprop", "parameter-shift", "adjoint"])
def test_qnode_of_a_circuit_returns_the_bindings_dtype(method):
    """float32 bindings give float32 outputs with every method, with or without gradients
    (as a function qnode's); float16 bindings run and return float64."""
    from qiskit import QuantumCircuit
    from qiskit.circuit import Parameter
    a = Parameter("a")
    qc = QuantumCircuit(2)
    qc.rx(a, 0)
    qc.cx(0, 1)
    f = qd.qnode(qd.device("statevector", wires=2), diff_method=method,
                 observables=[qd.Z(0), qd.Z(1)])(qc)
    for dtype, out_dtype in ((torch.float32, torch.float32), (torch.float64, torch.float64),
                             (torch.float16, torch.float64)):
        for grad in (False, True):
            x = torch.tensor([0.4], dtype=dtype, requires_grad=grad)
            out = f(x)
            assert out.dtype == out_dtype, (dtype, grad)
            torch.testing.assert_close(out.double(), torch.full((2,), math.cos(0.4),
                                                                 dtype=torch.float64),
                                       atol=1e-3 if dtype is torch.float16 else 1e-6, rtol=0)
            if grad:
                out.sum().backward()
                assert x.grad.dtype == dtype


def test_qnode_mapping_of_parameter_vectors_and_binding_errors():
    from qiskit import QuantumCircuit
    from qiskit.circuit import Parameter, ParameterVector
    from qiskit.quantum_info import SparsePauliOp, Statevector
    x, a = ParameterVector("x", 2), Parameter("a")
    qc = QuantumCircuit(2)
    qc.rx(x[1], 0)
    qc.ry(x[0] * a, 1)
    qc.cx(0, 1)
    obs = SparsePauliOp(["ZI", "XZ"], [1.0, 0.5])
    f = qd.qnode(qd.device("statevector", wires=2), observables=obs)(qc)
    ref = Statevector(qc.assign_parameters({x: [0.4, 1.1], a: 0.7})).expectation_value(obs).real
    assert abs(f({x: [0.4, 1.1], a: 0.7}).item() - ref) < 1e-14
    assert f({x: torch.rand(5, 2), a: 0.7}).shape == (5,)
    with pytest.raises(QdiffError, match=r"binding for x has shape \(3,\)"):
        f({x: [0.4, 1.1, 2.0], a: 0.7})
    with pytest.raises(QdiffError, match=r"binding batch shapes do not broadcast: a \(4,\), "
                                         r"x\[0\] \(3,\), x\[1\] \(3,\)"):
        f({x: torch.rand(3, 2), a: torch.rand(4)})
    with pytest.raises(QdiffError, match="'a' is bound twice"):
        f({x: [0.4, 1.1], a: 0.7, "a": 0.7})
    with pytest.raises(QdiffError, match="different Parameter of the same name"):
        f({x: [0.4, 1.1], Parameter("a"): 0.7})
    with pytest.raises(QdiffError, match="expected a real number or tensor; got str"):
        f({x: [0.4, 1.1], a: "s"})
    with pytest.raises(QdiffError, match="must be real; got complex"):
        f({x: [0.4, 1.1], a: np.array(0.7 + 0.1j)})
    with pytest.raises(QdiffError, match="must be real; got complex"):
        f(np.array([0.4, 1.1, 0.7j]))



def test_whole_model_saves_and_loads_and_spsa_runs():
    import io
    fm, ansatz, qc = classifier()
    layer = qd.QuantumLayer.from_qiskit(qc, fm.parameters, ansatz.parameters,
                                        observables=[qd.Z(0), "XXZ"], diff_method="spsa", seed=3)
    model = torch.nn.Sequential(layer, torch.nn.Linear(2, 1)).double()
    x = torch.rand(4, 3, dtype=torch.float64)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    again = torch.load(buf, weights_only=False)
    assert torch.allclose(again(x), model(x), atol=0)
    (g,) = torch.autograd.grad(layer(x).sum(), layer.weights)
    assert g.shape == (ansatz.num_parameters,) and torch.isfinite(g).all()
    from qdiff.circuits.qiskit_io import from_qiskit
    bare = qd.qnode(qd.device("statevector", wires=3))(from_qiskit(qc).circuit)
    with pytest.raises(QdiffError, match="save the model's state_dict"):
        torch.save(bare, io.BytesIO())


def test_layer_of_a_measured_circuit_gives_sampler_probabilities():
    """With final measurements and no observables the layer's outputs are the probabilities
    of the classical bits' integer, bit 0 least significant, as SamplerQNN's."""
    from qiskit import QuantumCircuit
    from qiskit.circuit import ParameterVector
    from qiskit.quantum_info import Statevector
    x, w = ParameterVector("x", 2), ParameterVector("w", 1)
    qc = QuantumCircuit(3)
    qc.ry(x[0], 0)
    qc.ry(x[1], 1)
    qc.cx(0, 2)
    qc.rx(w[0], 2)
    bare = qc.copy()
    qc.measure_all()
    layer = qd.QuantumLayer.from_qiskit(qc, input_params=x, weight_params=w,
                                        init_method=torch.tensor([0.4], dtype=torch.float64))
    xs = torch.tensor([[0.3, 0.9], [1.7, -0.2]], dtype=torch.float64)
    out = layer(xs)
    assert out.shape == (2, 8)
    for row, xv in zip(out, xs.tolist()):
        p = Statevector(bare.assign_parameters({x[0]: xv[0], x[1]: xv[1], w[0]: 0.4}))
        qiskit_order = p.probabilities()  # index: qubit 0 (clbit 0) least significant
        assert np.allclose(row.detach().numpy(), qiskit_order, atol=1e-12)


def test_torch_save_of_a_layer_on_aer_after_a_run(tmp_path):
    """A model whose Qiskit device has run (its pass manager built) saves and loads."""
    pytest.importorskip("qiskit_aer")
    from qiskit.circuit.library import real_amplitudes
    ansatz = real_amplitudes(2, reps=1)
    ps = list(ansatz.parameters)
    layer = qd.QuantumLayer.from_qiskit(ansatz, input_params=ps[:2], weight_params=ps[2:],
                                        device=qd.device("aer", wires=2),
                                        diff_method="parameter-shift")
    exact = qd.QuantumLayer.from_qiskit(ansatz, input_params=ps[:2], weight_params=ps[2:],
                                        init_method=layer.weights.detach())
    x = torch.rand(3, 2, dtype=torch.float64)
    before = layer(x)
    torch.save(layer, tmp_path / "layer.pt")
    loaded = torch.load(tmp_path / "layer.pt", weights_only=False)
    assert torch.allclose(loaded(x), before, atol=1e-10)
    assert torch.allclose(before, exact(x), atol=1e-10)


def test_measured_circuit_outputs_follow_sampler_qnn_index():
    """Clbits measured from qubits out of order (c0 <- q2, c1 <- q0): the layer's outputs are
    indexed as SamplerQNN's (the classical bits' integer, c0 least significant)."""
    pytest.importorskip("qiskit_machine_learning")
    from qiskit import QuantumCircuit
    from qiskit.circuit import Parameter
    from qiskit.primitives import StatevectorSampler
    from qiskit_machine_learning.neural_networks import SamplerQNN
    a, w = Parameter("a"), Parameter("w")
    qc = QuantumCircuit(3, 2)
    qc.ry(a, 0)
    qc.cx(0, 2)
    qc.rx(w, 1)
    qc.cry(0.8, 1, 2)
    qc.measure(2, 0)
    qc.measure(0, 1)
    layer = qd.QuantumLayer.from_qiskit(qc, input_params=[a], weight_params=[w],
                                        init_method=torch.tensor([3.1], dtype=torch.float64))
    ours = layer(torch.tensor([[0.9]], dtype=torch.float64))[0].detach().numpy()
    qnn = SamplerQNN(circuit=qc, input_params=[a], weight_params=[w],
                     sampler=StatevectorSampler(default_shots=100000, seed=1))
    ref = qnn.forward(np.array([[0.9]]), np.array([3.1]))[0]
    assert ours.shape == (4,) and np.allclose(ref[4:], 0)
    assert np.allclose(ours, ref[:4], atol=0.01)
    assert abs(ours[1] - ours[2]) > 0.05  # the two orders differ here


def test_from_qiskit_init_method_and_device_errors_and_dict():
    """Initial weights as a list keep float64, as a dict name the layer's one weight; a complex
    value, a string or a foreign device object are QdiffErrors (never a dropped imaginary part
    or a raw TypeError/AttributeError)."""
    fm, ansatz, qc = classifier(n=2)
    w = [0.1234567890123, 1 / 3, 2 / 7, 0.5, 0.25, 0.75, 1.5, 2.5][:ansatz.num_parameters]
    layer = qd.QuantumLayer.from_qiskit(qc, fm.parameters, ansatz.parameters, init_method=w)
    assert torch.equal(layer.weights.detach(), torch.tensor(w, dtype=torch.float64))
    layer = qd.QuantumLayer.from_qiskit(qc, fm.parameters, ansatz.parameters,
                                        init_method={"weights": torch.tensor(w)})
    assert layer.weights.shape == (len(w),)
    with pytest.raises(QdiffError, match="initial value of 'weights' is complex"):
        qd.QuantumLayer.from_qiskit(qc, fm.parameters, ansatz.parameters,
                                    init_method=np.ones(len(w), dtype=complex))
    with pytest.raises(QdiffError, match=r"init_method must be a callable or initial weights"):
        qd.QuantumLayer.from_qiskit(qc, fm.parameters, ansatz.parameters, init_method="zeros")
    with pytest.raises(QdiffError, match="device= takes a qdiff device"):
        qd.QuantumLayer.from_qiskit(qc, fm.parameters, ansatz.parameters, device=42)


def _qiskit_expval(qc, values, obs):
    from qiskit.quantum_info import Statevector
    bound = qc.assign_parameters(dict(zip(qc.parameters, values))) if qc.parameters else qc
    return Statevector(bound).expectation_value(obs).real


def test_pauli_evolution_is_the_exact_exponential_as_in_qiskit_statevector():
    """``PauliEvolutionGate`` is ``exp(-i t H)`` (Qiskit's Operator/Statevector); its default
    definition (one Lie-Trotter step) only approximates that for non-commuting terms."""
    from qiskit import QuantumCircuit
    from qiskit.circuit import Parameter
    from qiskit.circuit.library import PauliEvolutionGate
    from qiskit.quantum_info import SparsePauliOp
    from qiskit.synthesis import QDrift, SuzukiTrotter
    t = Parameter("t")
    h = SparsePauliOp(["XXI", "ZIY", "IZZ"], [0.3, -0.5, 0.8])        # non-commuting
    hc = SparsePauliOp(["XXI", "YYI", "ZZZ"], [0.3, -0.5, 0.8])       # commuting
    obs = SparsePauliOp(["ZII", "IXY", "YZX"], [1.0, 0.4, -0.6])
    dev = qd.device("statevector", wires=3)
    for gate in (PauliEvolutionGate(h, 0.9),
                 PauliEvolutionGate(h, 0.9, synthesis=SuzukiTrotter(reps=2)),
                 PauliEvolutionGate([SparsePauliOp("XXI"), SparsePauliOp("ZII")], 0.4)):
        qc = QuantumCircuit(3)
        qc.ry(0.3, 0)
        qc.append(gate, [0, 1, 2])
        got = qd.qnode(dev, observables=obs)(qc)(torch.zeros(0, dtype=torch.float64))
        assert abs(got.item() - _qiskit_expval(qc, [], obs)) < 1e-12
    # commuting terms, a parameter time (QDrift's random sampling replaced by an exact formula)
    for synthesis in (None, QDrift(reps=3)):
        qc = QuantumCircuit(3)
        qc.h(1)
        qc.append(PauliEvolutionGate(hc, 2 * t, **({"synthesis": synthesis} if synthesis
                                                   else {})), [0, 1, 2])
        x = torch.tensor([0.7], dtype=torch.float64, requires_grad=True)
        out = qd.qnode(dev, observables=obs)(qc)(x)
        assert abs(out.item() - _qiskit_expval(qc, [0.7], obs)) < 1e-12
        (g,) = torch.autograd.grad(out, x)
        fd = (_qiskit_expval(qc, [0.7 + 1e-6], obs) - _qiskit_expval(qc, [0.7 - 1e-6], obs)) / 2e-6
        assert abs(g.item() - fd) < 1e-7
    qc = QuantumCircuit(3)
    qc.append(PauliEvolutionGate(h, t), [0, 1, 2])
    with pytest.raises(QdiffError, match=r"PauliEvolutionGate of non-commuting terms with time t"
                                         r".*qc.decompose\(\)"):
        qd.qnode(dev)(qc)
    # the product formula written out runs as written
    dec = qc.decompose()
    got = qd.qnode(dev, observables=obs)(dec)(torch.tensor([0.7], dtype=torch.float64))
    assert abs(got.item() - _qiskit_expval(dec, [0.7], obs)) < 1e-12


def test_hamiltonian_gate_with_a_parameter_time_is_the_exact_exponential():
    """``HamiltonianGate(H, t)`` with a parameter time runs as ``exp(-i t H)`` (Qiskit builds
    its matrix only once ``t`` is bound): values equal Statevector's, gradients finite
    differences, and the unitary (phase included) Qiskit's Operator of the bound circuit."""
    from qiskit import QuantumCircuit
    from qiskit.circuit import Parameter
    from qiskit.circuit.library import HamiltonianGate
    from qiskit.quantum_info import Operator, SparsePauliOp, random_hermitian
    from qdiff.circuits.qiskit_io import from_qiskit, to_qiskit
    a, b = Parameter("a"), Parameter("b")
    obs = SparsePauliOp(["ZXY", "IZI", "YIX"], [0.6, -0.3, 0.8])
    dev = qd.device("statevector", wires=3)
    for k, t in ((1, a), (2, 2 * a + 0.3), (3, a * b), (3, a.sin())):
        qc = QuantumCircuit(3)
        qc.h(0)
        qc.ry(b, 2)
        qc.append(HamiltonianGate(random_hermitian(2 ** k, seed=k).data, t), [2, 0, 1][:k])
        qc.cx(0, 1)
        x0 = [0.7, -0.4]
        x = torch.tensor(x0, dtype=torch.float64, requires_grad=True)
        out = qd.qnode(dev, observables=obs)(qc)(x)
        assert abs(out.item() - _qiskit_expval(qc, x0, obs)) < 1e-12
        grad = torch.autograd.grad(out, x)[0]
        for i in range(2):
            e = np.eye(2)[i] * 1e-6
            fd = (_qiskit_expval(qc, x0 + e, obs) - _qiskit_expval(qc, x0 - e, obs)) / 2e-6
            assert abs(grad[i].item() - fd) < 1e-7
        bound = to_qiskit(from_qiskit(qc), theta=x0)
        want = qc.assign_parameters(dict(zip(qc.parameters, x0)))
        assert np.allclose(Operator(bound).data, Operator(want).data, atol=1e-12)


def test_a_definition_qiskit_cannot_build_for_a_free_parameter_is_a_qdiff_error():
    from qiskit import QuantumCircuit
    from qiskit.circuit import Gate, Parameter

    class Numeric(Gate):  # a gate whose definition needs a number, as Qiskit's often do
        def __init__(self, angle):
            super().__init__("numeric", 1, [angle])

        def _define(self):
            qc = QuantumCircuit(1)
            qc.rx(float(self.params[0]) ** 2, 0)
            self.definition = qc

    qc = QuantumCircuit(1)
    qc.append(Numeric(Parameter("a")), [0])
    with pytest.raises(QdiffError, match=r"instruction 0 \('numeric' on qubits \[0\]\): Qiskit "
                                         r"cannot build the definition .*\['a'\].*bind them"):
        qd.qnode(qd.device("statevector", wires=1))(qc)


def test_initialize_and_resets_of_fresh_qubits_are_exact():
    """``qc.initialize`` (a reset, then a state preparation) at the start of a circuit, as
    Qiskit's Statevector evaluates it; a reset after operations on its qubit is a deferred
    measurement (one extra wire), the mixed state Qiskit's DensityMatrix gives."""
    from qiskit import QuantumCircuit
    from qiskit.quantum_info import SparsePauliOp, random_statevector
    from qdiff.circuits import qasm
    vec = random_statevector(4, seed=5).data
    obs = SparsePauliOp(["ZXI", "IYY", "XZZ"], [1.0, 0.4, -0.6])
    qc = QuantumCircuit(3)
    qc.initialize(vec, [2, 0])
    qc.reset(1)
    qc.h(1)
    qc.cx(1, 2)
    got = qd.qnode(qd.device("statevector", wires=3), observables=obs)(qc)(
        torch.zeros(0, dtype=torch.float64))
    assert abs(got.item() - _qiskit_expval(qc, [], obs)) < 1e-12
    qc.reset(2)
    from qiskit.quantum_info import DensityMatrix
    got = qd.qnode(qd.device("statevector", wires=3), observables=obs)(qc)(
        torch.zeros(0, dtype=torch.float64))
    assert abs(got.item() - DensityMatrix(qc).expectation_value(obs).real) < 1e-12
    imp = qasm.loads('OPENQASM 2.0;\ninclude "qelib1.inc";\nqreg q[2];\nreset q;\nh q[0];\n')
    assert imp.circuit.count_ops() == {"h": 1}


def test_transpiled_circuit_observables_act_on_physical_qubits():
    """A transpiled circuit (initial layout, routing) gives the logical circuit's values for an
    observable laid out with ``apply_layout``; a logical-width observable names the remedy."""
    from qiskit import QuantumCircuit, transpile
    from qiskit.circuit import Parameter
    from qiskit.providers.fake_provider import GenericBackendV2
    from qiskit.quantum_info import SparsePauliOp
    a, b = Parameter("a"), Parameter("b")
    qc = QuantumCircuit(3)
    qc.h(0); qc.ry(a, 1); qc.cx(0, 2); qc.cx(2, 1); qc.rz(b, 2); qc.cx(1, 0)
    backend = GenericBackendV2(5, coupling_map=[[0, 1], [1, 2], [2, 3], [3, 4]], seed=1)
    obs = SparsePauliOp(["ZXI", "YIZ"], [1.0, 0.5])
    v = [0.4, 0.9]
    for level, layout in ((0, [4, 0, 2]), (1, None)):
        t = transpile(qc, backend, optimization_level=level, seed_transpiler=3,
                      initial_layout=layout)
        f = qd.qnode(qd.device("statevector", wires=5), observables=obs.apply_layout(t.layout))
        got = f(t)(torch.tensor(v, dtype=torch.float64))
        assert abs(got.item() - _qiskit_expval(qc, v, obs)) < 1e-12
    with pytest.raises(QdiffError, match=r"acts on 3 qubit\(s\); the circuit has 5: .*transpiled"
                                         r".*apply_layout"):
        qd.qnode(qd.device("statevector", wires=5), observables=obs)(t)


def test_annotated_operations_apply_their_modifiers():
    from qiskit import QuantumCircuit
    from qiskit.circuit import (AnnotatedOperation, ControlModifier, InverseModifier, Parameter,
                                PowerModifier)
    from qiskit.circuit.library import HGate, SXGate, U3Gate, UGate
    from qiskit.quantum_info import SparsePauliOp
    a = Parameter("a")
    qc = QuantumCircuit(3)
    qc.h([0, 1, 2])
    qc.append(AnnotatedOperation(U3Gate(a, 0.2, 0.3), InverseModifier()), [1])
    qc.append(AnnotatedOperation(SXGate(), [InverseModifier(), ControlModifier(2, ctrl_state=2)]),
              [2, 0, 1])
    qc.append(AnnotatedOperation(HGate(), [PowerModifier(0.5), ControlModifier(1)]), [1, 2])
    obs = SparsePauliOp(["ZXI", "YYZ", "XIY"], [1.0, 0.4, -0.6])
    x = torch.tensor([0.7], dtype=torch.float64, requires_grad=True)
    out = qd.qnode(qd.device("statevector", wires=3), observables=obs)(qc)(x)
    assert abs(out.item() - _qiskit_expval(qc, [0.7], obs)) < 1e-12
    (g,) = torch.autograd.grad(out, x)
    fd = (_qiskit_expval(qc, [0.7 + 1e-6], obs) - _qiskit_expval(qc, [0.7 - 1e-6], obs)) / 2e-6
    assert abs(g.item() - fd) < 1e-7
    bad = QuantumCircuit(1)
    bad.append(AnnotatedOperation(UGate(a, 0.1, 0.2), PowerModifier(0.5)), [0])
    with pytest.raises(QdiffError, match=r"'annotated' on qubits \[0\].*annotated u with "
                                         r"modifiers \['PowerModifier'\]"):
        qd.qnode(qd.device("statevector", wires=1))(bad)


def test_observables_after_final_measurements():
    """A final measurement is read, not run: an observable acting on its qubit by Z (which
    commutes with it) has the same value with or without it; one acting by X is refused
    rather than taken of the unmeasured state (+1 here, where the measured qubit gives 0)."""
    from qiskit import QuantumCircuit
    qc = QuantumCircuit(2, 1)
    qc.h(0)
    qc.ry(0.4, 1)
    qc.measure(0, 0)
    dev = qd.device("statevector", wires=2)
    z = qd.qnode(dev, observables=["IZ", "ZI"])(qc)(torch.zeros(0, dtype=torch.float64))
    np.testing.assert_allclose(z.numpy(), [0.0, np.cos(0.4)], atol=1e-12)  # <Z0>, <Z1>
    with pytest.raises(qd.QdiffError, match=r"applies X to qubit\(s\) \[0\] after their final"):
        qd.qnode(dev, observables="IX")(qc)(torch.zeros(0, dtype=torch.float64))


def test_a_delay_on_a_device_with_noise_is_refused():
    """A delay is the identity without noise (run); on a device with noise (qdiff's noise
    engines, an IBM device) its decoherence would be left out: refused, saying so."""
    from qiskit import QuantumCircuit
    qc = QuantumCircuit(1)
    qc.x(0)
    qc.delay(500, 0, unit="us")
    z = qd.qnode(qd.device("statevector", wires=1), observables="Z")(qc)(
        torch.zeros(0, dtype=torch.float64))
    assert abs(float(z) + 1) < 1e-12
    for dev in (qd.device("mixed", wires=1, noise="fake_manila"),
                qd.device("ibm", backend="fake_manila", wires=1, shots=100, seed=1)):
        with pytest.raises(qd.QdiffError, match="1 delay\\(s\\) of nonzero duration"):
            qd.qnode(dev, observables="Z")(qc)
    qc0 = QuantumCircuit(1)
    qc0.x(0)
    qc0.delay(0, 0)
    qd.qnode(qd.device("mixed", wires=1, noise="fake_manila"), observables="Z")(qc0)


def test_noise_instructions_in_a_qiskit_circuit_are_refused_by_name_and_position():
    """A Kraus or SuperOp appended to a circuit, or Aer's QuantumError.to_instruction(), is
    a noise channel, not a gate: refused naming its instruction (its index in the circuit,
    not inside its definition) and where noise runs instead."""
    from qiskit import QuantumCircuit
    from qiskit.quantum_info import Kraus, SuperOp
    pytest.importorskip("qiskit_aer")
    from qiskit_aer.noise import amplitude_damping_error, depolarizing_error
    dev = qd.device("mixed", wires=2)
    for inst, name in ((depolarizing_error(0.1, 1).to_instruction(), "quantum_channel"),
                       (Kraus(amplitude_damping_error(0.3).to_quantumchannel()), "kraus"),
                       (SuperOp(amplitude_damping_error(0.3).to_quantumchannel()), "kraus")):
        qc = QuantumCircuit(2)
        qc.h(0)
        qc.cx(0, 1)
        qc.append(inst, [1])
        with pytest.raises(qd.QdiffError, match=rf"instruction 2 \('{name}' on qubits \[1\]\)"
                                                r".*noise channel.*qd.device\('mixed', noise="):
            qd.qnode(dev, observables="ZZ")(qc)
