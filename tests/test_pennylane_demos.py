"""Three PennyLane demos run unchanged on ``qml.device("qdiff.statevector")`` and on
``default.qubit``, only the device name differing: "Turning quantum nodes into Torch Layers"
(moons, TorchLayer, SGD; a few steps), the H2 VQE demo (``qml.qchem.molecular_hamiltonian``,
``DoubleExcitation``, gradient descent) and the quantum natural gradient demo
(``qml.metric_tensor``, ``QNGOptimizer``). Losses, energies, metric tensors and parameters
agree to 1e-8 (the TorchLayer demo is float32 throughout: there to float32 resolution)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

qml = pytest.importorskip("pennylane")
pnp = pytest.importorskip("pennylane.numpy")

DEVICES = ("qdiff.statevector", "default.qubit")


def torch_layers_demo(device_name, steps=8):
    """PennyLane demo "Turning quantum nodes into Torch Layers" (qnn_module_torch), verbatim
    except for the device name and the number of optimisation steps."""
    from sklearn.datasets import make_moons

    torch.manual_seed(42)
    np.random.seed(42)

    X, y = make_moons(n_samples=200, noise=0.1)
    y_ = torch.unsqueeze(torch.tensor(y), 1)  # used for one-hot encoded labels
    y_hot = torch.scatter(torch.zeros((200, 2)), 1, y_, 1)

    n_qubits = 2
    dev = qml.device(device_name, wires=n_qubits)

    @qml.qnode(dev)
    def qnode(inputs, weights):
        qml.AngleEmbedding(inputs, wires=range(n_qubits))
        qml.BasicEntanglerLayers(weights, wires=range(n_qubits))
        return [qml.expval(qml.PauliZ(wires=i)) for i in range(n_qubits)]

    n_layers = 6
    weight_shapes = {"weights": (n_layers, n_qubits)}
    qlayer = qml.qnn.TorchLayer(qnode, weight_shapes)
    clayer_1 = torch.nn.Linear(2, 2)
    clayer_2 = torch.nn.Linear(2, 2)
    softmax = torch.nn.Softmax(dim=1)
    layers = [clayer_1, qlayer, clayer_2, softmax]
    model = torch.nn.Sequential(*layers)

    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    loss = torch.nn.L1Loss()

    X = torch.tensor(X, requires_grad=True).float()
    y_hot = y_hot.float()

    batch_size = 5
    data_loader = torch.utils.data.DataLoader(
        list(zip(X, y_hot)), batch_size=batch_size, shuffle=True, drop_last=True
    )
    losses = []
    for k, (xs, ys) in enumerate(data_loader):
        if k == steps:
            break
        opt.zero_grad()
        loss_evaluated = loss(model(xs), ys)
        loss_evaluated.backward()
        opt.step()
        losses.append(loss_evaluated.item())
    y_pred = model(X)
    predictions = torch.argmax(y_pred, axis=1).detach().numpy()
    accuracy = float(np.mean(predictions == y))
    return np.array(losses), accuracy, qlayer.weights.detach().numpy().copy()


def h2_vqe_demo(device_name, max_iterations=6):
    """PennyLane's "A brief overview of VQE" (tutorial_vqe), gradient-descent version:
    the H2 Hamiltonian from ``qml.qchem.molecular_hamiltonian`` (coordinates in bohr), the
    Hartree-Fock state and one ``DoubleExcitation``."""
    symbols = ["H", "H"]
    coordinates = pnp.array([[0.0, 0.0, -0.6614], [0.0, 0.0, 0.6614]])
    H, qubits = qml.qchem.molecular_hamiltonian(symbols, coordinates)
    dev = qml.device(device_name, wires=qubits)
    electrons = 2
    hf = qml.qchem.hf_state(electrons, qubits)

    def circuit(param, wires):
        qml.BasisState(hf, wires=wires)
        qml.DoubleExcitation(param, wires=[0, 1, 2, 3])

    @qml.qnode(dev)
    def cost_fn(param):
        circuit(param, wires=range(qubits))
        return qml.expval(H)

    opt = qml.GradientDescentOptimizer(stepsize=0.4)
    theta = pnp.array(0.0, requires_grad=True)
    energy = [cost_fn(theta)]
    angle = [theta]
    for _ in range(max_iterations):
        theta, prev_energy = opt.step_and_cost(cost_fn, theta)
        energy.append(cost_fn(theta))
        angle.append(theta)
    return np.array(energy, dtype=float), np.array(angle, dtype=float)


def qng_demo(device_name, steps=10):
    """PennyLane's "Quantum natural gradient" demo: the block-diagonal metric tensor of the
    demo circuit, then QNG against vanilla gradient descent."""
    dev = qml.device(device_name, wires=3)

    @qml.qnode(dev, interface="autograd")
    def circuit(params):
        # |psi_0>: state preparation
        qml.RY(np.pi / 4, wires=0)
        qml.RY(np.pi / 3, wires=1)
        qml.RY(np.pi / 7, wires=2)

        # V0(theta0, theta1): Parametrized layer 0
        qml.RZ(params[0], wires=0)
        qml.RZ(params[1], wires=1)

        # W1: non-parametrized gates
        qml.CNOT(wires=[0, 1])
        qml.CNOT(wires=[1, 2])

        # V_1(theta2, theta3): Parametrized layer 1
        qml.RY(params[2], wires=1)
        qml.RX(params[3], wires=2)

        # W2: non-parametrized gates
        qml.CNOT(wires=[0, 1])
        qml.CNOT(wires=[1, 2])

        return qml.expval(qml.PauliY(0))

    params = pnp.array([0.432, -0.123, 0.543, 0.233])
    mt = qml.metric_tensor(circuit, approx="block-diag")(params)
    mt_diag = qml.metric_tensor(circuit, approx="diag")(params)

    init_params = pnp.array([0.432, -0.123, 0.543, 0.233], requires_grad=True)
    gd_cost, qng_cost = [], []
    opt = qml.GradientDescentOptimizer(0.01)
    theta = init_params
    for _ in range(steps):
        theta = opt.step(circuit, theta)
        gd_cost.append(circuit(theta))
    opt = qml.QNGOptimizer(0.01)
    theta = init_params
    for _ in range(steps):
        theta = opt.step(circuit, theta)
        qng_cost.append(circuit(theta))
    return (np.asarray(mt), np.asarray(mt_diag), np.array(gd_cost, dtype=float),
            np.array(qng_cost, dtype=float), np.asarray(theta))


def run_both(demo):
    return [demo(name) for name in DEVICES]


def test_torch_layers_demo_unchanged():
    (l_q, acc_q, w_q), (l_d, acc_d, w_d) = run_both(torch_layers_demo)
    assert len(l_q) == 8
    # float32 model: the devices' float64 expectations differ by ~1e-16, then float32 rounding
    np.testing.assert_allclose(l_q, l_d, atol=1e-6, rtol=0)
    np.testing.assert_allclose(w_q, w_d, atol=1e-6, rtol=0)
    assert acc_q == acc_d


def test_h2_vqe_demo_unchanged():
    (e_q, t_q), (e_d, t_d) = run_both(h2_vqe_demo)
    np.testing.assert_allclose(e_q, e_d, atol=1e-8, rtol=0)
    np.testing.assert_allclose(t_q, t_d, atol=1e-8, rtol=0)
    assert e_q[0] == pytest.approx(-1.1167, abs=1e-3)  # Hartree-Fock energy of H2 (Ha)
    assert e_q[-1] < e_q[0] - 0.015  # descends towards -1.1362 Ha


def test_quantum_natural_gradient_demo_unchanged():
    out_q, out_d = run_both(qng_demo)
    for a, b in zip(out_q, out_d):
        np.testing.assert_allclose(a, b, atol=1e-8, rtol=0)
    mt = out_q[0]
    assert mt.shape == (4, 4) and np.allclose(mt, mt.T)
    assert mt[0, 0] == pytest.approx(0.125, abs=1e-12)  # Var(Z)/4 after RY(pi/4): sin^2/4
    assert out_q[3][-1] < out_q[2][-1]  # QNG descends faster than vanilla gradient descent
