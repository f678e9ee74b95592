"""CUDA against the CPU: every engine and door that takes torch tensors, run on a GPU.

Each test computes the same thing on the CPU (the reference, itself tested against PennyLane,
Qiskit and closed forms elsewhere) and on the device under test, and checks values, gradients,
dtypes and that every output lives on the input's device. The CUDA cases are marked ``cuda``
and skipped without a GPU (``python -m pytest -m cuda tests/test_cuda.py`` on a GPU machine);
the CPU cases run the same harness in the default run (the CPU against itself through another
differentiation method or engine path), so the harness stays honest here too.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff.circuits.gates import GATES
from conftest import TORCH_DEVICES
from test_gradients import _circuit, _num_params, _observables, _random_ops
from test_simulator import GATE_NAMES, random_spec, run_qdiff

HAS_CUDA = torch.cuda.is_available()
DEVICES = TORCH_DEVICES
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _on(x, device):
    """Moves tensors (nested in lists/tuples) to ``device``."""
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(_on(v, device) for v in x)
    return x


def _close(ours, ref, atol, device):
    """``ours`` (on ``device``) equals ``ref`` (CPU), leaf by leaf."""
    if isinstance(ref, (list, tuple)):
        assert isinstance(ours, (list, tuple)) and len(ours) == len(ref)
        for a, b in zip(ours, ref):
            _close(a, b, atol, device)
        return
    assert isinstance(ours, torch.Tensor), type(ours)
    assert ours.device.type == device, (ours.device, device)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    a = ours.detach().cpu()
    b = ref.detach().cpu()
    if a.is_complex() or b.is_complex():
        a, b = a.to(torch.complex128), b.to(torch.complex128)
    else:
        a, b = a.double(), b.double()
    assert torch.allclose(a, b, atol=atol), (a - b).abs().max()


def _parametric_gates():
    from qdiff.circuits.gates import controlled_gate, multirz_gate, paulirot_gate
    gates = [g for g in GATES.values() if g.num_params > 0]
    gates += [multirz_gate(3), paulirot_gate("XYZ"), paulirot_gate("ZIZ")]
    gates += [controlled_gate(g, k) for g in gates[:] if g.num_wires <= 2 for k in (1, 2)]
    return gates


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_every_gate_matrix_is_made_on_the_angles_device(dtype):
    """Without a GPU: every parametric gate's matrix (and diagonal) evaluated on angles on
    torch's ``meta`` device lands there; a constant kept on the CPU raises ("Tensor on device
    cpu is not on the expected device meta"), as it would for CUDA angles."""
    for gate in _parametric_gates():
        angles = [torch.full((2,), 0.3, dtype=dtype, device="meta")
                  for _ in range(gate.num_params)]
        for fn in (gate.matrix_fn, gate.diag_fn):
            if fn is not None:
                out = fn(*angles)
                assert out.device.type == "meta", gate.name


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
def test_adjoint_overlaps_by_reductions_match_the_matrix_products(cdtype):
    """The adjoint's overlap matrices as GPUs take them (one reduction per entry) equal the
    CPU's matrix products, on every wire placement, for full and diagonal overlaps."""
    from qdiff.backends.statevector.adjoint import overlap_matrix, overlap_pairs
    gen = torch.Generator().manual_seed(0)
    for n in (1, 2, 3, 5):
        for wires in ([0], [n - 1], [n // 2], [0, n - 1], [n - 1, 0], [1, 2, 0]):
            if max(wires) >= n or len(set(wires)) < len(wires):
                continue
            psi = torch.randn(3, 2 ** n, dtype=cdtype, generator=gen)
            lam = torch.randn(3, 2 ** n, dtype=cdtype, generator=gen)
            for diagonal in (False, True):
                a = overlap_matrix(psi, lam, wires, n, diagonal)
                b = overlap_pairs(psi, lam, wires, n, diagonal)
                assert a.shape == b.shape
                assert torch.allclose(a, b, atol=1e-4 if cdtype == torch.complex64 else 1e-12)


# seeds of 4- and 5-qubit circuits (seed % 3 != 0) whose gates cover every registered gate
RANDOM_SEEDS = range(1, 42, 3)


def test_random_circuit_seeds_cover_every_gate():
    """The device's random circuits draw every registered gate (four-wire ones included) in
    some seed, batched and not."""
    for batch in (None, 3):
        seen = {op[0] for seed in RANDOM_SEEDS for op in random_spec(seed, batch)[1]}
        assert seen >= set(GATE_NAMES), sorted(set(GATE_NAMES) - seen)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("batch", [None, 3])
@pytest.mark.parametrize("seed", RANDOM_SEEDS)
def test_random_circuits_every_gate_and_measurement(device, cdtype, batch, seed):
    """Random circuits over every registered gate and exact measurement type (values and
    backprop gradients) on ``device`` against the CPU in complex128."""
    spec = random_spec(seed, batch)
    if not any(op[2] for op in spec[1]):
        pytest.skip("no angles drawn")  # (a circuit without any would run on the CPU)
    ref, ref_params = run_qdiff(spec, requires_grad=True)
    rdtype = torch.float64 if cdtype == torch.complex128 else torch.float32
    out, params = run_qdiff(spec, cdtype, requires_grad=True, device=device, rdtype=rdtype)
    tol = 1e-9 if cdtype == torch.complex128 else 5e-4
    _close(out, ref, tol, device)
    # gradients of a real scalar of every output
    def scalar(res):
        total = 0
        for r in res:
            total = total + (r.abs() ** 2 if r.is_complex() else r).sum()
        return total
    flat, ref_flat = [p for ps in params for p in ps], [p for ps in ref_params for p in ps]
    g = torch.autograd.grad(scalar(out), flat, allow_unused=True)
    rg = torch.autograd.grad(scalar(ref), ref_flat, allow_unused=True)
    for a, b in zip(g, rg):
        if b is None:
            continue
        assert a is not None and a.device.type == device
        assert torch.allclose(a.double().cpu(), b, atol=tol * 20), (a.double().cpu() - b).abs().max()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["adjoint", "parameter-shift", "finite-diff", "best"])
@pytest.mark.parametrize("seed", range(6))
def test_every_diff_method_on_random_circuits(device, method, seed):
    """Gradients by each method on ``device`` against backprop on the CPU."""
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(3, 5))
    ops = _random_ops(rng, n, int(rng.integers(5, 12)))
    p = _num_params(ops)
    if p == 0:
        pytest.skip("no parameters drawn")
    x = torch.tensor(rng.uniform(-math.pi, math.pi, (2, p)))
    body = _circuit(qd, ops, scale=1.1)

    def f(x):
        body(x)
        return _observables(qd, n)

    xr = x.clone().requires_grad_(True)
    ref = qd.QNode(f, qd.device("statevector", wires=n), diff_method="backprop")(xr)
    ref_g = torch.autograd.grad(sum(r.sum() for r in ref), xr)[0]
    xd = x.to(device).requires_grad_(True)
    out = qd.QNode(f, qd.device("statevector", wires=n), diff_method=method)(xd)
    _close(out, ref, 1e-9, device)
    g = torch.autograd.grad(sum(o.sum() for o in out), xd)[0]
    tol = 1e-5 if method == "finite-diff" else 1e-8
    _close(g, ref_g, tol, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
def test_explicit_device_option_moves_cpu_inputs(device, cdtype):
    """``qd.device(..., device=d)`` runs CPU inputs on ``d`` and gives outputs there."""
    rdtype = torch.float64 if cdtype == torch.complex128 else torch.float32

    def f(x):
        qd.RX(x[..., 0], wires=0)
        qd.CRY(x[..., 1], wires=[0, 1])
        qd.IsingXX(x[..., 2], wires=[1, 2])
        return qd.expval(qd.Z(1) @ qd.X(2)), qd.probs(wires=[0, 2])

    x = torch.tensor([[0.3, 1.2, -0.7], [2.0, -0.4, 0.9]], dtype=rdtype, requires_grad=True)
    xr = x.detach().double().requires_grad_(True)
    ref = qd.QNode(f, qd.device("statevector", wires=3), diff_method="backprop")(xr)
    (rg,) = torch.autograd.grad(ref[0].sum() + ref[1][:, 1].sum(), xr)
    tol = 1e-9 if cdtype == torch.complex128 else 1e-5
    for kind, method, static in [("statevector", "backprop", False),
                                 ("statevector", "adjoint", False),
                                 ("statevector", "parameter-shift", False),
                                 ("statevector", "best", True), ("mixed", "best", False),
                                 ("mixed", "best", True)]:
        q = qd.qnode(qd.device(kind, wires=3, dtype=cdtype, device=device),
                     diff_method=method, static=static)(f)
        out = q(x)
        _close(out, ref, tol, device)
        (g,) = torch.autograd.grad(out[0].sum() + out[1][:, 1].sum(), x)
        assert g.device.type == "cpu" and g.dtype == rdtype, (kind, method, static)
        assert torch.allclose(g.double(), rg, atol=tol * 10), (kind, method, static)


@pytest.mark.parametrize("device", DEVICES)
def test_shots_on_device(device):
    """Sampled expval/probs/sample/counts on ``device``: seeded runs repeat, statistics agree
    with the exact values, samples are the input's device's tensors."""
    def gates(x):
        qd.RY(x, wires=0)
        qd.CNOT(wires=[0, 1])
        qd.RX(0.4 * x, wires=2)

    def f(x):
        gates(x)
        return (qd.expval(qd.Z(0) @ qd.Z(2)), qd.probs(wires=[0, 1]), qd.sample(wires=[0, 2]),
                qd.counts(wires=[0, 1]))

    def f_exact(x):
        gates(x)
        return qd.expval(qd.Z(0) @ qd.Z(2)), qd.probs(wires=[0, 1])

    x = torch.tensor(1.1, dtype=torch.float64, device=device)
    dev = qd.device("statevector", wires=3, shots=20000, seed=11)
    q = qd.QNode(f, dev)
    e, pr, s, c = q(x)
    e2, pr2, s2, c2 = qd.QNode(f, qd.device("statevector", wires=3, shots=20000, seed=11))(x)
    assert torch.equal(s.cpu(), s2.cpu()) and c == c2
    assert e.device.type == device and pr.device.type == device and s.device.type == device
    assert s.shape == (20000, 2)
    exact = qd.QNode(f_exact, qd.device("statevector", wires=3))(x.cpu())
    assert abs(float(e) - float(exact[0])) < 5 * 1 / math.sqrt(20000)
    assert torch.allclose(pr.cpu(), exact[1], atol=0.02)
    assert sum(c.values()) == 20000 and set(c) <= {"00", "11"}
    # shot gradients (parameter-shift) on the device
    xg = x.clone().requires_grad_(True)
    def one(x):
        qd.RY(x, wires=0)
        return qd.expval(qd.Z(0))

    val = qd.QNode(one, qd.device("statevector", wires=1, shots=20000, seed=3))
    out = val(xg)
    (g,) = torch.autograd.grad(out, xg)
    assert g.device.type == device and abs(float(g) + math.sin(1.1)) < 0.05


@pytest.mark.parametrize("device", DEVICES)
def test_midcircuit_measurement_on_device(device):
    def f(x):
        qd.RY(x, wires=0)
        m = qd.measure(0, reset=True)
        qd.cond(m, qd.RX)(0.7 * x, wires=1)
        qd.Hadamard(wires=0)
        return qd.expval(qd.Z(1)), qd.probs(op=m), qd.expval(qd.X(0))

    x = torch.tensor(0.9, dtype=torch.float64)
    ref = qd.QNode(f, qd.device("statevector", wires=2), diff_method="backprop")(
        x.clone().requires_grad_(True))
    for method in ("backprop", "adjoint", "parameter-shift"):
        xd = x.to(device).requires_grad_(True)
        out = qd.QNode(f, qd.device("statevector", wires=2), diff_method=method)(xd)
        _close(out, ref, 1e-9, device)
        g = torch.autograd.grad(out[0], xd)[0]
        assert g.device.type == device
        p1 = math.sin(0.45) ** 2
        assert abs(float(g) - (-0.7 * p1 * math.sin(0.63)
                               - 2 * math.sin(0.45) * math.cos(0.45) * 0.5
                               * (1 - math.cos(0.63)))) < 1e-9


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", ["first", "hybrid"])
@pytest.mark.parametrize("static", [False, True])
def test_training_steps_match_cpu(device, shape, static):
    """Three Adam steps of a hybrid model on ``device`` follow the CPU's losses and weights."""
    n = 4

    def build():
        torch.manual_seed(7)
        dev = qd.device("statevector", wires=n)

        @qd.qnode(dev, static=static)
        def circuit(inputs, w):
            qd.AngleEmbedding(inputs, wires=range(n))
            qd.StronglyEntanglingLayers(w, wires=range(n))
            return [qd.expval(qd.Z(i)) for i in range(n)]

        layer = qd.QuantumLayer(circuit, {"w": qd.StronglyEntanglingLayers.shape(2, n)})
        if shape == "first":
            return torch.nn.Sequential(layer, torch.nn.Linear(n, 2, dtype=torch.float64))
        return torch.nn.Sequential(torch.nn.Linear(6, n, dtype=torch.float64), torch.nn.Tanh(),
                                   layer, torch.nn.Linear(n, 2, dtype=torch.float64))

    gen = torch.Generator().manual_seed(1)
    x = torch.rand(16, n if shape == "first" else 6, dtype=torch.float64, generator=gen)
    y = torch.randint(0, 2, (16,), generator=gen)

    def train(model, dev):
        model = model.to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=0.05)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x.to(dev)), y.to(dev))
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return torch.stack(losses), [p.detach() for p in model.parameters()]

    ref_losses, ref_params = train(build(), "cpu")
    losses, params = train(build(), device)
    _close(losses, ref_losses, 1e-9, device)
    _close(params, ref_params, 1e-8, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
def test_static_qnode_replays_on_device(device, cdtype):
    rdtype = torch.float64 if cdtype == torch.complex128 else torch.float32
    dev = qd.device("statevector", wires=3, dtype=cdtype)

    def f(x, w):
        qd.AngleEmbedding(x, wires=range(3), rotation="Y")
        qd.StronglyEntanglingLayers(w, wires=range(3))
        return qd.expval(qd.Z(0) @ qd.Z(2)), qd.probs(wires=[1])

    static = qd.qnode(dev, static=True)(f)
    plain = qd.QNode(f, qd.device("statevector", wires=3), diff_method="backprop")
    gen = torch.Generator().manual_seed(5)
    for batch in (8, 1, 8):
        x = torch.rand(batch, 3, dtype=rdtype, generator=gen)
        w = torch.rand(2, 3, 3, dtype=rdtype, generator=gen)
        xr, wr = x.double().requires_grad_(True), w.double().requires_grad_(True)
        ref = plain(xr, wr)
        rg = torch.autograd.grad(ref[0].sum() + ref[1][:, 0].sum(), (xr, wr))
        xd, wd = x.to(device).requires_grad_(True), w.to(device).requires_grad_(True)
        out = static(xd, wd)
        tol = 1e-9 if cdtype == torch.complex128 else 2e-5
        _close(out, ref, tol, device)
        g = torch.autograd.grad(out[0].sum() + out[1][:, 0].sum(), (xd, wd))
        _close(g, rg, tol * 10, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["best", "backprop", "parameter-shift"])
def test_mixed_device_channels_and_noise_model(device, method):
    """The density-matrix engine on ``device``: channels with trainable parameters, a noise
    model, readout errors, purity."""
    model = qd.noise.NoiseModel().add("cx", qd.DepolarizingChannel, 0.02).add_readout(1, 0.03, 0.05)

    def f(x, p):
        qd.RX(x, wires=0)
        qd.CNOT(wires=[0, 1])
        qd.AmplitudeDamping(p, wires=0)
        qd.ThermalRelaxationError(0.01, 50.0, 40.0, 0.1, wires=1)
        qd.RY(0.5 * x, wires=1)
        return qd.expval(qd.Z(0) @ qd.Z(1)), qd.probs(wires=[1]), qd.expval(qd.X(1))

    x, p = torch.tensor(0.7, dtype=torch.float64), torch.tensor(0.15, dtype=torch.float64)
    xr, pr = x.clone().requires_grad_(True), p.clone().requires_grad_(True)
    ref = qd.QNode(f, qd.device("mixed", wires=2, noise=model), diff_method="backprop")(xr, pr)
    rg = torch.autograd.grad(ref[0] + ref[2], (xr, pr))
    # a channel parameter has no shift rule (its refusal is tested in test_mixed.py)
    xd = x.to(device).requires_grad_(True)
    pd = p.to(device).requires_grad_(method != "parameter-shift")
    out = qd.QNode(f, qd.device("mixed", wires=2, noise=model), diff_method=method)(xd, pd)
    _close(out, ref, 1e-9, device)
    if method == "parameter-shift":
        (g,) = torch.autograd.grad(out[0] + out[2], xd)
        _close(g, rg[0], 1e-8, device)
        return
    g = torch.autograd.grad(out[0] + out[2], (xd, pd))
    _close(g, rg, 1e-8, device)


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_device_shots_and_density_matrix(device):
    def f(x):
        qd.RY(x, wires=0)
        qd.CNOT(wires=[0, 1])
        qd.BitFlip(0.1, wires=1)
        return qd.expval(qd.Z(1)), qd.counts(wires=[0, 1])

    x = torch.tensor(0.8, dtype=torch.float64, device=device)
    e, c = qd.QNode(f, qd.device("mixed", wires=2, shots=4000, seed=2))(x)
    e2, c2 = qd.QNode(f, qd.device("mixed", wires=2, shots=4000, seed=2))(x)
    assert c == c2 and float(e) == float(e2) and e.device.type == device
    exact = 0.8 * math.cos(0.8)
    assert abs(float(e) - exact) < 5 / math.sqrt(4000)
    rho = qd.QNode(lambda x: (qd.RY(x, wires=0), qd.density_matrix([0]))[1],
                   qd.device("mixed", wires=1))(x)
    assert rho.device.type == device
    assert torch.allclose(rho.cpu(), torch.tensor(
        [[math.cos(0.4) ** 2, math.cos(0.4) * math.sin(0.4)],
         [math.cos(0.4) * math.sin(0.4), math.sin(0.4) ** 2]], dtype=torch.complex128), atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_trajectories_on_device(device):
    """Noise by Monte-Carlo trajectories on the statevector engine follows the device."""
    model = qd.noise.NoiseModel().add("rx", qd.DepolarizingChannel, 0.1)

    def f(x):
        qd.RX(x, wires=0)
        return qd.expval(qd.Z(0))

    x = torch.tensor(0.6, dtype=torch.float64, device=device)
    exact = qd.QNode(f, qd.device("mixed", wires=1, noise=model))(x.cpu())
    dev = qd.device("statevector", wires=1, noise=model, trajectories=4000, seed=1)
    out = qd.QNode(f, dev)(x)
    assert out.device.type == device
    assert abs(float(out) - float(exact)) < 0.05


@pytest.mark.parametrize("device", DEVICES)
def test_pauli_sum_hamiltonian_vqe_step_on_device(device):
    """A molecular Hamiltonian's energy and gradient on ``device`` (adjoint and backprop)."""
    h, n = qd.qchem.molecular_hamiltonian(["H", "H"], [0.0, 0.0, -0.6614, 0.0, 0.0, 0.6614])
    hf = qd.hf_state(2, n)

    def f(t):
        qd.BasisState(hf, wires=range(n))
        qd.DoubleExcitation(t, wires=[0, 1, 2, 3])
        return qd.expval(h)

    t = torch.tensor(0.2, dtype=torch.float64)
    tr = t.clone().requires_grad_(True)
    ref = qd.QNode(f, qd.device("statevector", wires=n), diff_method="backprop")(tr)
    (rg,) = torch.autograd.grad(ref, tr)
    for method in ("adjoint", "backprop", "parameter-shift"):
        td = t.to(device).requires_grad_(True)
        out = qd.QNode(f, qd.device("statevector", wires=n), diff_method=method)(td)
        _close(out, ref, 1e-10, device)
        (g,) = torch.autograd.grad(out, td)
        _close(g, rg, 1e-9, device)


@pytest.mark.parametrize("device", DEVICES)
def test_qng_optimizer_on_device(device):
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev)
    def f(w):
        qd.RY(w[0], wires=0)
        qd.RY(w[1], wires=1)
        qd.CNOT(wires=[0, 1])
        qd.RX(w[2], wires=1)
        return qd.expval(qd.Z(0) @ qd.Z(1) + 0.3 * qd.X(1))

    def run(dev_):
        w = torch.tensor([0.3, -0.4, 1.1], dtype=torch.float64, device=dev_, requires_grad=True)
        opt = qd.QNGOptimizer([w], f, lr=0.1)
        vals = []
        for _ in range(3):
            opt.zero_grad()
            loss = f(w)
            loss.backward()
            opt.step()
            vals.append(loss.detach())
        return torch.stack(vals), w.detach()

    ref = run("cpu")
    out = run(device)
    _close(list(out), list(ref), 1e-9, device)


@pytest.mark.parametrize("device", DEVICES)
def test_pennylane_plugin_with_device_tensors(device):
    """PennyLane's torch interface on qml.device("qdiff.statevector") with tensors on
    ``device``: values and gradients equal default.qubit's, on the CPU; a second call with
    other angles (the device reuses the first call's conversion of the tape) too."""
    qml = pytest.importorskip("pennylane")

    def body(x, w):
        qml.AngleEmbedding(x, wires=range(3))
        qml.StronglyEntanglingLayers(w, wires=range(3))
        return qml.expval(qml.Z(0) @ qml.Z(1)), qml.probs(wires=[2])

    gen = torch.Generator().manual_seed(9)
    angles = [(torch.rand(3, dtype=torch.float64, generator=gen),
               torch.rand(2, 3, 3, dtype=torch.float64, generator=gen)) for _ in range(2)]
    refs = []
    for x, w in angles:
        xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        ref = qml.QNode(body, qml.device("default.qubit", wires=3), interface="torch")(xr, wr)
        refs.append((ref, torch.autograd.grad(ref[0] + ref[1][0], (xr, wr))))
    # (diff_method="backprop" on this device goes through qml.execute: see the README)
    for method in ("adjoint", "best", "parameter-shift"):
        q = qml.QNode(body, qml.device("qdiff.statevector", wires=3), interface="torch",
                      diff_method=method)
        for (x, w), (ref, rg) in zip(angles, refs):
            xd, wd = x.to(device).requires_grad_(True), w.to(device).requires_grad_(True)
            out = q(xd, wd)
            _close(list(out), list(ref), 1e-9, device)
            g = torch.autograd.grad(out[0] + out[1][0], (xd, wd))
            _close(list(g), list(rg), 1e-8, device)


def _mcm_body(x):
    import pennylane as qml

    qml.RY(x[0], wires=0)
    qml.CNOT(wires=[0, 1])
    m0 = qml.measure(1)
    qml.cond(m0, qml.RX)(x[1], wires=2)
    qml.RY(0.5 * x[0], wires=1)
    m1 = qml.measure(2, reset=True)
    qml.cond(m0 & ~m1, qml.RZ)(0.3, wires=0)
    qml.Hadamard(wires=0)
    return (qml.expval(qml.Z(0)), qml.probs(wires=[1]), qml.expval(m0),
            qml.probs(op=[m0, m1]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
def test_pennylane_measured_midcircuit_measurements_with_device_tensors(device, name):
    """Mid-circuit measurements measured, not deferred, on both PennyLane devices with angles
    on ``device``: the tree traversal equals default.qubit's deferred circuit on the CPU
    (values and the gradient of the unconditioned angle), one-shot sampling agrees within its
    statistics; outputs and gradients stay on ``device``."""
    qml = pytest.importorskip("pennylane")
    xr = torch.tensor([0.8, 1.1], dtype=torch.float64, requires_grad=True)
    ref = qml.QNode(_mcm_body, qml.device("default.qubit"), interface="torch",
                    mcm_method="deferred")(xr)
    (rg,) = torch.autograd.grad(ref[0] + ref[1][0], xr)
    xd = xr.detach().to(device).requires_grad_(True)
    out = qml.QNode(_mcm_body, qml.device(name, wires=3), interface="torch",
                    mcm_method="tree-traversal", diff_method="parameter-shift")(xd)
    _close(list(out), list(ref), 1e-10, device)
    (g,) = torch.autograd.grad(out[0] + out[1][0], xd)
    # (the conditioned angle has no shift rule in PennyLane: finite differences)
    _close(g, rg, 1e-6, device)
    # (PennyLane's torch boundary moves sampled results to the device of the trainable
    # parameters; with none trainable they stay on the CPU, on default.qubit too)
    shots = qml.QNode(_mcm_body, qml.device(name, wires=3, seed=4), interface="torch",
                      mcm_method="one-shot", shots=4000)(xd)
    _close([s.detach() for s in shots], [r.detach() for r in ref], 5 / math.sqrt(4000),
           device)


@pytest.mark.parametrize("device", DEVICES)
def test_memory_guard_on_device(device):
    with pytest.raises(qd.QdiffMemoryError, match="40 qubits"):
        qd.QNode(lambda x: (qd.RX(x, wires=0), qd.expval(qd.Z(0)))[1],
                 qd.device("statevector", wires=40))(torch.tensor(0.1, device=device))


def _example(script, *args, timeout=600):
    return subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_examples_run_on_cuda():
    """The examples' ``--device cuda`` runs (VQE to chemical accuracy, the classifier)."""
    r = _example("vqe_h2.py", "--device", "cuda")
    assert r.returncode == 0, r.stderr[-2000:]
    r = _example("hybrid_classifier.py", "--device", "cuda", "--epochs", "3")
    assert r.returncode == 0, r.stderr[-2000:]
