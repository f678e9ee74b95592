"""Three PennyLane demos ported to qdiff with only names changed, run side by side with the
originals on PennyLane's default.qubit: losses, energies and metric tensors agree to 1e-8.

* "Turning quantum nodes into Torch Layers": two moons, ``qml.qnn.TorchLayer``
  (AngleEmbedding + BasicEntanglerLayers), Linear layers, softmax, L1 loss, SGD.
* "A brief overview of VQE": H2 from ``qchem.molecular_hamiltonian`` (bohr), Hartree-Fock
  ``BasisState`` + ``DoubleExcitation``, gradient descent.
* "Quantum natural gradient": the block-diagonal and full metric tensors of the demo's circuit,
  then gradient descent and quantum natural gradient descent.

The demos run in float64 (torch's default dtype set for the test) so that agreement to 1e-8 is
meaningful; the torch interface replaces JAX/autograd where the demo uses them (the optimizer
is the same plain gradient-descent rule).
"""
import math

import numpy as np
import pytest
import torch

import qdiff as qd

qml = pytest.importorskip("pennylane")


@pytest.fixture
def float64_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


# -- 1. Turning quantum nodes into Torch Layers -------------------------------------------------


def _moons():
    sklearn = pytest.importorskip("sklearn.datasets")
    X, y = sklearn.make_moons(n_samples=200, noise=0.1, random_state=0)
    y_ = torch.unsqueeze(torch.tensor(y), 1)  # used for one-hot encoded labels
    y_hot = torch.scatter(torch.zeros((200, 2)), 1, y_, 1)
    return X, y_hot


def torch_layers_demo_pennylane(epochs):
    X, y_hot = _moons()
    n_qubits = 2
    dev = qml.device("default.qubit", wires=n_qubits)

    @qml.qnode(dev)
    def qnode(inputs, weights):
        qml.AngleEmbedding(inputs, wires=range(n_qubits))
        qml.BasicEntanglerLayers(weights, wires=range(n_qubits))
        return [qml.expval(qml.PauliZ(wires=i)) for i in range(n_qubits)]

    n_layers = 6
    weight_shapes = {"weights": (n_layers, n_qubits)}
    torch.manual_seed(42)
    qlayer = qml.qnn.TorchLayer(qnode, weight_shapes)
    clayer_1 = torch.nn.Linear(2, 2)
    clayer_2 = torch.nn.Linear(2, 2)
    softmax = torch.nn.Softmax(dim=1)
    layers = [clayer_1, qlayer, clayer_2, softmax]
    model = torch.nn.Sequential(*layers)
    return _train_moons(model, X, y_hot, epochs)


def torch_layers_demo_qdiff(epochs):
    X, y_hot = _moons()
    n_qubits = 2
    dev = qd.device("statevector", wires=n_qubits)

    @qd.qnode(dev)
    def qnode(inputs, weights):
        qd.AngleEmbedding(inputs, wires=range(n_qubits))
        qd.BasicEntanglerLayers(weights, wires=range(n_qubits))
        return [qd.expval(qd.PauliZ(wires=i)) for i in range(n_qubits)]

    n_layers = 6
    weight_shapes = {"weights": (n_layers, n_qubits)}
    torch.manual_seed(42)
    qlayer = qd.qnn.TorchLayer(qnode, weight_shapes)
    clayer_1 = torch.nn.Linear(2, 2)
    clayer_2 = torch.nn.Linear(2, 2)
    softmax = torch.nn.Softmax(dim=1)
    layers = [clayer_1, qlayer, clayer_2, softmax]
    model = torch.nn.Sequential(*layers)
    return _train_moons(model, X, y_hot, epochs)


def _train_moons(model, X, y_hot, epochs):
    """The demo's training loop (shared: it is plain torch); the demo's ``.float()`` becomes
    the default dtype (float64 here)."""
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    loss = torch.nn.L1Loss()
    X = torch.tensor(X, requires_grad=True).to(torch.get_default_dtype())
    y_hot = y_hot.to(torch.get_default_dtype())
    data_loader = torch.utils.data.DataLoader(
        list(zip(X, y_hot)), batch_size=5, shuffle=True, drop_last=True,
        generator=torch.Generator().manual_seed(0))
    losses = []
    for epoch in range(epochs):
        for xs, ys in data_loader:
            opt.zero_grad()
            loss_evaluated = loss(model(xs), ys)
            loss_evaluated.backward()
            opt.step()
            losses.append(float(loss_evaluated.detach()))
    y_pred = model(X)
    predictions = torch.argmax(y_pred, axis=1).detach().numpy()
    correct = [1 if p == p_true else 0 for p, p_true in zip(predictions, y_hot.argmax(1))]
    return initial, losses, sum(correct) / len(correct)


@pytest.mark.slow
def test_torch_layers_demo_matches_pennylane(float64_default):
    init_pl, losses_pl, acc_pl = torch_layers_demo_pennylane(epochs=6)
    init_qd, losses_qd, acc_qd = torch_layers_demo_qdiff(epochs=6)
    assert init_pl.keys() == init_qd.keys()
    for k in init_pl:  # the same seed gives the same initial weights, quantum layer included
        assert torch.equal(init_pl[k], init_qd[k])
    assert len(losses_qd) == 6 * 40
    assert np.allclose(losses_qd, losses_pl, atol=1e-8, rtol=0)
    assert acc_qd == acc_pl and acc_qd > 0.8


def test_torch_layers_demo_first_epoch_matches_pennylane(float64_default):
    _, losses_pl, _ = torch_layers_demo_pennylane(epochs=1)
    _, losses_qd, _ = torch_layers_demo_qdiff(epochs=1)
    assert np.allclose(losses_qd, losses_pl, atol=1e-8, rtol=0)


# -- 2. VQE for H2 --------------------------------------------------------------------------------

SYMBOLS = ["H", "H"]
COORDINATES = np.array([0.0, 0.0, -0.6614, 0.0, 0.0, 0.6614])


def vqe_demo_pennylane(max_iterations):
    H, qubits = qml.qchem.molecular_hamiltonian(SYMBOLS, COORDINATES)
    dev = qml.device("default.qubit", wires=qubits)
    electrons = 2
    hf = qml.qchem.hf_state(electrons, qubits)

    @qml.qnode(dev, interface="torch")
    def circuit(param, wires):
        qml.BasisState(hf, wires=wires)
        qml.DoubleExcitation(param, wires=[0, 1, 2, 3])
        return qml.expval(H)

    def cost_fn(param):
        return circuit(param, wires=range(qubits))
    return _gradient_descent(cost_fn, max_iterations)


def vqe_demo_qdiff(max_iterations):
    H, qubits = qd.qchem.molecular_hamiltonian(SYMBOLS, COORDINATES)
    dev = qd.device("statevector", wires=qubits)
    electrons = 2
    hf = qd.qchem.hf_state(electrons, qubits)

    @qd.qnode(dev, interface="torch")
    def circuit(param, wires):
        qd.BasisState(hf, wires=wires)
        qd.DoubleExcitation(param, wires=[0, 1, 2, 3])
        return qd.expval(H)

    def cost_fn(param):
        return circuit(param, wires=range(qubits))
    return _gradient_descent(cost_fn, max_iterations)


def _gradient_descent(cost_fn, max_iterations):
    theta = torch.tensor(0.0, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([theta], lr=0.4)
    energy, angle = [], []
    for n in range(max_iterations):
        opt.zero_grad()
        e = cost_fn(theta)
        e.backward()
        opt.step()
        energy.append(float(e.detach()))
        angle.append(float(theta.detach()))
    energy.append(float(cost_fn(theta).detach()))
    return energy, angle


def test_vqe_demo_matches_pennylane():
    e_pl, a_pl = vqe_demo_pennylane(max_iterations=40)
    e_qd, a_qd = vqe_demo_qdiff(max_iterations=40)
    assert np.allclose(e_qd, e_pl, atol=1e-8, rtol=0)
    assert np.allclose(a_qd, a_pl, atol=1e-8, rtol=0)
    assert e_qd[0] == pytest.approx(-1.11734903, abs=1e-6)  # Hartree-Fock, bohr geometry
    assert e_qd[-1] == pytest.approx(-1.13618883, abs=1e-6)  # the demo's converged energy


# -- 3. Quantum natural gradient --------------------------------------------------------------------

INIT = [0.432, -0.123, 0.543, 0.233]


def _qng_circuit(lib, np_like, params):
    # |psi_0>: state preparation
    lib.RY(np_like.pi / 4, wires=0)
    lib.RY(np_like.pi / 3, wires=1)
    lib.RY(np_like.pi / 7, wires=2)
    # V0(theta0, theta1): Parametrized layer 0
    lib.RZ(params[0], wires=0)
    lib.RZ(params[1], wires=1)
    # W1: non-parametrized gates
    lib.CNOT(wires=[0, 1])
    lib.CNOT(wires=[1, 2])
    # V_1(theta2, theta3): Parametrized layer 1
    lib.RY(params[2], wires=1)
    lib.RX(params[3], wires=2)
    # W2: non-parametrized gates
    lib.CNOT(wires=[0, 1])
    lib.CNOT(wires=[1, 2])
    return lib.expval(lib.PauliY(0))


def qng_demo_pennylane(steps):
    from pennylane import numpy as pnp
    dev = qml.device("default.qubit")  # no wire count: the full metric takes an extra wire

    @qml.qnode(dev, interface="autograd")
    def circuit(params):
        return _qng_circuit(qml, pnp, params)

    params = pnp.array(INIT, requires_grad=True)
    block = qml.metric_tensor(circuit, approx="block-diag")(params)
    full = qml.metric_tensor(circuit, approx=None)(params)
    gd_cost, qng_cost = [], []
    theta = params
    opt = qml.GradientDescentOptimizer(0.01)
    for _ in range(steps):
        theta = opt.step(circuit, theta)
        gd_cost.append(float(circuit(theta)))
    theta = params
    opt = qml.QNGOptimizer(0.01)
    for _ in range(steps):
        theta = opt.step(circuit, theta)
        qng_cost.append(float(circuit(theta)))
    return np.asarray(block), np.asarray(full), gd_cost, qng_cost


def qng_demo_qdiff(steps):
    dev = qd.device("statevector", wires=3)

    @qd.qnode(dev, interface="torch")
    def circuit(params):
        return _qng_circuit(qd, math, params)

    params = torch.tensor(INIT, dtype=torch.float64, requires_grad=True)
    block = qd.metric_tensor(circuit, approx="block-diag")(params)
    full = qd.metric_tensor(circuit, approx=None)(params)
    gd_cost, qng_cost = [], []
    theta = params.detach().clone().requires_grad_(True)
    opt = torch.optim.SGD([theta], lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        circuit(theta).backward()
        opt.step()
        gd_cost.append(float(circuit(theta).detach()))
    theta = params.detach().clone().requires_grad_(True)
    opt = qd.QNGOptimizer([theta], circuit, lr=0.01, lam=0.0)  # PennyLane's default lam = 0
    for _ in range(steps):
        opt.zero_grad()
        circuit(theta).backward()
        opt.step()
        qng_cost.append(float(circuit(theta).detach()))
    return block.numpy(), full.numpy(), gd_cost, qng_cost


def test_qng_demo_matches_pennylane():
    b_pl, f_pl, gd_pl, qng_pl = qng_demo_pennylane(steps=60)
    b_qd, f_qd, gd_qd, qng_qd = qng_demo_qdiff(steps=60)
    assert np.allclose(b_qd, b_pl, atol=1e-8, rtol=0)
    assert np.allclose(f_qd, f_pl, atol=1e-8, rtol=0)
    assert not np.allclose(b_qd, f_qd, atol=1e-3)  # the two metrics differ here: both checked
    assert np.allclose(gd_qd, gd_pl, atol=1e-8, rtol=0)
    assert np.allclose(qng_qd, qng_pl, atol=1e-8, rtol=0)
    assert qng_qd[-1] < gd_qd[-1]  # the demo's point: QNG descends faster
