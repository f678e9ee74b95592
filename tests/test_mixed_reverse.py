"""The mixed device's reverse mode (``diff_method="adjoint"``, what ``"best"`` picks): gradients
of gate angles and channel parameters against torch backprop through the simulation, central
finite differences and PennyLane's default.mixed; checkpoints and batch chunks at their edges;
the memory plan against the memory guard and against what a run really allocates."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff.backends.base import Job
from qdiff.backends.mixed import reverse
from qdiff.backends.mixed.engine import Residual
from qdiff.rules import ADJOINT, BACKPROP, best

HERM = np.array([[1.0, 0.5 - 0.25j, 0.0, 0.1], [0.5 + 0.25j, -0.3, 0.2j, 0.0],
                 [0.0, -0.2j, 0.7, 0.4], [0.1, 0.0, 0.4, -1.0]])


def _body(x, p):
    """Every channel with trainable parameters, one- two- and three-wire gates (a trainable
    three-wire MultiRZ, a CRX on a pair in the other order), a parameter used twice and one
    scaled: ``x`` ``(..., 6)`` gate angles, ``p`` ``(..., 11)`` channel parameters."""
    qd.Hadamard(0)
    qd.RY(x[..., 0], wires=1)
    qd.BitFlip(p[..., 0], wires=0)
    qd.CNOT(wires=[0, 1])
    qd.PhaseFlip(p[..., 1], wires=1)
    qd.RX(0.7 * x[..., 1] + 0.1, wires=2)
    qd.DepolarizingChannel(p[..., 2], wires=2)
    qd.CRX(x[..., 2], wires=[1, 0])
    qd.AmplitudeDamping(p[..., 3], wires=0)
    qd.IsingXX(x[..., 3], wires=[1, 2])
    qd.GeneralizedAmplitudeDamping(p[..., 4], p[..., 5], wires=1)
    qd.Toffoli(wires=[0, 1, 2])
    qd.MultiRZ(x[..., 4], wires=[0, 1, 2])
    qd.PhaseDamping(p[..., 6], wires=2)
    qd.Rot(x[..., 5], x[..., 0], 0.3, wires=2)
    qd.ResetError(p[..., 7], p[..., 8], wires=0)
    qd.ThermalRelaxationError(p[..., 9], 90.0, 60.0, 12.0, wires=1)
    qd.PauliError("XZ", p[..., 10], wires=[0, 2])
    qd.CZ(wires=[2, 0])
    qd.RZ(x[..., 3], wires=0)


def _qnode(dev, method):
    h = 0.7 * qd.Z(0) @ qd.X(1) + 0.3 * qd.Y(2) - 0.2 * qd.X(0) @ qd.Y(1) @ qd.Z(2)

    @qd.qnode(dev, diff_method=method)
    def f(x, p):
        _body(x, p)
        return (qd.expval(h), qd.expval(qd.Hermitian(HERM, wires=[2, 0])), qd.var(qd.X(1)),
                qd.probs(wires=[0, 2]))
    return f


def _flat(outs):
    return torch.cat([o.reshape(o.shape[0] if o.dim() else 1, -1) for o in outs], -1)


def _inputs(batch=2, seed=0):
    r = np.random.default_rng(seed)
    x = torch.tensor(r.uniform(-np.pi, np.pi, (batch, 6)), requires_grad=True)
    p = torch.tensor(r.uniform(0.05, 0.3, 11), requires_grad=True)
    return x, p


def _jacobian(f, x, p):
    return torch.autograd.functional.jacobian(lambda a, b: _flat(f(a, b)), (x, p))


def test_best_picks_the_reverse_mode_and_backprop_stays_available():
    dev = qd.device("mixed", wires=3)
    f = _qnode(dev, "best")
    x, p = _inputs()
    rec = f.construct(x, p)[0]
    assert best(dev, rec.circuit, rec) is ADJOINT
    assert dev.capabilities.vjp and dev.capabilities.fast_vjp

    @qd.qnode(dev)
    def g(x):
        qd.RX(x, wires=0)
        return qd.purity([0])
    rec = g.construct(torch.tensor(0.3, requires_grad=True))[0]
    assert best(dev, rec.circuit, rec) is BACKPROP  # purity: only backprop differentiates it
    calls = []
    orig = dev.vjp
    dev.vjp = lambda *a: calls.append(1) or orig(*a)
    _flat(f(x, p)).sum().backward()
    assert calls


def test_gradients_equal_backprop_and_finite_differences():
    """Gate angles and channel parameters, batched, expval of a Pauli sum and of a Hermitian
    matrix, var and probs: the reverse mode equals backprop to 1e-10 and central finite
    differences to 1e-8."""
    dev = qd.device("mixed", wires=3)
    x, p = _inputs()
    jr = _jacobian(_qnode(dev, "adjoint"), x, p)
    jb = _jacobian(_qnode(dev, "backprop"), x, p)
    for a, b in zip(jr, jb):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    f = _qnode(dev, "adjoint")
    h = 1e-5
    with torch.no_grad():
        for k, base in enumerate((x, p)):
            flat = base.detach().reshape(-1)
            for j in range(flat.numel()):
                e = torch.zeros_like(flat)
                e[j] = h
                args_p = [x.detach(), p.detach()]
                args_m = [x.detach(), p.detach()]
                args_p[k] = (flat + e).reshape(base.shape)
                args_m[k] = (flat - e).reshape(base.shape)
                fd = (_flat(f(*args_p)) - _flat(f(*args_m))) / (2 * h)
                got = jr[k].reshape(fd.shape[0], fd.shape[1], -1)[:, :, j]
                torch.testing.assert_close(got, fd, atol=1e-8, rtol=0)


def test_batched_channel_parameter_and_readout_errors():
    """A channel parameter that varies over the batch, and probs through a noise model's
    readout errors and gate noise: the reverse mode equals backprop."""
    model = qd.noise.NoiseModel().add("cx", qd.DepolarizingChannel, 0.05)
    model.add_readout(0, 0.03, 0.08).add_readout(1, 0.1, 0.02)
    dev = qd.device("mixed", wires=2, noise=model)
    x = torch.tensor([[0.3, 1.1], [-0.7, 2.0], [1.5, -0.4], [0.1, 0.2]], dtype=torch.float64,
                     requires_grad=True)
    g = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64, requires_grad=True)

    def make(method):
        @qd.qnode(dev, diff_method=method)
        def f(x, g):
            qd.RY(x[:, 0], wires=0)
            qd.AmplitudeDamping(g, wires=0)
            qd.CNOT(wires=[0, 1])
            qd.RX(x[:, 1], wires=1)
            return qd.probs(wires=[0, 1]), qd.expval(qd.Z(1))
        return f
    jr = _jacobian(make("adjoint"), x, g)
    jb = _jacobian(make("backprop"), x, g)
    for a, b in zip(jr, jb):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_gradients_equal_default_mixed():
    qml = pytest.importorskip("pennylane")
    pnp = qml.numpy
    r = np.random.default_rng(5)
    xs, ps = r.uniform(-2, 2, 4), r.uniform(0.05, 0.4, 3)

    def circuit(lib, x, p):
        lib.RY(x[0], wires=0)
        lib.DepolarizingChannel(p[0], wires=0)
        lib.CNOT(wires=[0, 1])
        lib.AmplitudeDamping(p[1], wires=1)
        lib.RX(x[1], wires=1)
        lib.IsingZZ(x[2], wires=[0, 1])
        lib.PhaseDamping(p[2], wires=0)
        lib.RZ(x[3], wires=0)
        lib.Hadamard(wires=0)

    @qml.qnode(qml.device("default.mixed", wires=2), interface="autograd", diff_method="backprop")
    def ref(x, p):
        circuit(qml, x, p)
        return qml.expval(qml.PauliZ(0) @ qml.PauliX(1) + 0.5 * qml.PauliY(1))

    @qd.qnode(qd.device("mixed", wires=2), diff_method="adjoint")
    def f(x, p):
        circuit(qd, x, p)
        return qd.expval(qd.Z(0) @ qd.X(1) + 0.5 * qd.Y(1))
    want = qml.grad(ref)(pnp.array(xs, requires_grad=True), pnp.array(ps, requires_grad=True))
    x = torch.tensor(xs, requires_grad=True)
    p = torch.tensor(ps, requires_grad=True)
    got = torch.autograd.grad(f(x, p), (x, p))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), np.asarray(b), atol=1e-8, rtol=0)


# ------------------------------------------------------------------------------------------
# checkpoints and chunks


def _deep_circuit(n=3, layers=3):
    """Unitary and non-unitary blocks alternating, a trailing one-wire block."""
    ops, k = [], 0
    for layer in range(layers):
        for w in range(n):
            ops.append(qd.Operation(qd.get_gate("ry"), (w,), (qd.ParamRef(k),)))
            k += 1
        for w in range(n - 1):
            ops.append(qd.Operation(qd.get_gate("cx"), (w, w + 1)))
            if layer % 2 == 0:
                ops.append(qd.Operation(qd.DepolarizingChannel, (w + 1,), (qd.ParamRef(k),)))
                k += 1
    ops.append(qd.Operation(qd.AmplitudeDamping, (0,), (qd.ParamRef(k),)))
    k += 1
    return qd.Circuit(n, tuple(ops), (qd.expval(qd.Z(0) @ qd.Z(2)), qd.probs([1])),
                      num_params=k)


def _theta(circuit, batch, seed=1):
    r = np.random.default_rng(seed)
    th = r.uniform(-np.pi, np.pi, (batch, circuit.num_params))
    for j, op in enumerate(circuit.operations):
        for par in op.params:
            if isinstance(par, qd.ParamRef) and op.gate.name != "ry":
                th[:, par.index] = r.uniform(0.05, 0.3, batch)
    return torch.tensor(th)


def _reference(dev, circuit, theta, g):
    """Backprop through the simulation: ``sum g * flat outputs`` differentiated by torch."""
    t = theta.clone().requires_grad_()
    out = _flat(dev.run(circuit, t))
    return torch.autograd.grad((out * g).sum(), t)[0]


@pytest.mark.parametrize("chunk,interval", [(1, 1), (2, 1), (5, 1), (2, 2), (3, 3), (1, 50),
                                            (4, 2)])
def test_checkpoints_and_chunks(chunk, interval):
    """Chunks of 1, of a size that does not divide the batch, the whole batch; inputs kept
    at every non-unitary block, every second or third (segments recomputed), only the first."""
    dev = qd.device("mixed", wires=3)
    c = _deep_circuit()
    theta = _theta(c, 5)
    g = torch.tensor(np.random.default_rng(2).normal(size=(5, 3)))
    want = _reference(dev, c, theta, g)
    res = Residual(reverse.Plan(chunk, interval, 0.0, 0.0))
    got = dev.vjp([Job(c, theta, flat=True)], [g], [res])[0]
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    blocks = reverse.build_blocks(c, theta, dev.cdtype, torch.device("cpu"), (True,) * c.num_params)
    assert not all(blocks.unitary) and any(blocks.unitary)


def test_one_block_and_initial_state_rows():
    """A circuit of one block; a start state per binding, chunked."""
    dev = qd.device("mixed", wires=1)
    c = qd.Circuit(1, (qd.Operation(qd.get_gate("rx"), (0,), (qd.ParamRef(0),)),
                       qd.Operation(qd.PhaseDamping, (0,), (qd.ParamRef(1),))),
                   (qd.expval(qd.Y(0)),), num_params=2)
    theta = torch.tensor([[0.3, 0.2], [1.2, 0.5], [-0.4, 0.9]], dtype=torch.float64)
    psi = torch.tensor([[1, 0], [0.6, 0.8j], [0.8, -0.6]], dtype=torch.complex128)
    g = torch.ones(3, 1, dtype=torch.float64)
    t = theta.clone().requires_grad_()
    out = dev.run(c, t, initial_state=psi)[0]
    want = torch.autograd.grad(out.sum(), t)[0]
    for chunk in (1, 2, 3):
        res = Residual(reverse.Plan(chunk, 1, 0.0, 0.0))
        got = dev.vjp([Job(c, theta, initial_state=psi, flat=True)], [g], [res])[0]
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    [kept] = dev.execute([Job(c, theta, initial_state=psi, flat=True, keep=True)])
    torch.testing.assert_close(dev.vjp([Job(c, theta, initial_state=psi, flat=True)], [g],
                                       [kept.residual])[0], want, atol=1e-12, rtol=0)


def test_untrainable_columns_and_complex64():
    dev = qd.device("mixed", wires=3, dtype=torch.complex64)
    c = _deep_circuit(layers=2)
    theta = _theta(c, 2)
    trainable = tuple(j % 2 == 0 for j in range(c.num_params))
    g = torch.ones(2, 3, dtype=torch.float64)
    [res] = dev.execute([Job(c, theta, flat=True, keep=True, trainable=trainable)])
    got = dev.vjp([Job(c, theta, flat=True, trainable=trainable)], [g], [res.residual])[0]
    want = _reference(qd.device("mixed", wires=3), c, theta, g)
    assert got.dtype == torch.float32
    for j in range(c.num_params):
        if trainable[j]:
            torch.testing.assert_close(got[:, j].double(), want[:, j], atol=2e-5, rtol=0)
        else:
            assert (got[:, j] == 0).all()


def test_shots_and_non_differentiable_outputs_are_refused():
    dev = qd.device("mixed", wires=1, shots=100)
    c = qd.Circuit(1, (qd.Operation(qd.get_gate("rx"), (0,), (qd.ParamRef(0),)),),
                   (qd.expval(qd.Z(0)),), num_params=1)
    with pytest.raises(qd.QdiffError, match="exact only"):
        dev.execute([Job(c, torch.zeros(1, 1, dtype=torch.float64), keep=True)])

    @qd.qnode(qd.device("mixed", wires=1), diff_method="adjoint")
    def f(x):
        qd.RX(x, wires=0)
        return qd.purity([0])
    with pytest.raises(qd.QdiffError, match="purity"):
        f(torch.tensor(0.3, dtype=torch.float64, requires_grad=True)).backward()


def test_second_derivative_with_best_uses_parameter_shift():
    dev = qd.device("mixed", wires=1)

    @qd.qnode(dev)
    def f(x):
        qd.RX(x, wires=0)
        qd.DepolarizingChannel(0.1, wires=0)
        return qd.expval(qd.Z(0))
    x = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    (h,) = torch.autograd.grad(g, x)
    scale = 1 - 4 * 0.1 / 3
    assert abs(float(g) + scale * np.sin(0.4)) < 1e-12
    assert abs(float(h) + scale * np.cos(0.4)) < 1e-10


def test_second_derivative_with_best_and_a_trainable_channel_uses_backprop():
    """A channel parameter has no shift rule: create_graph=True with 'best' differentiates by
    backprop through the engine instead. <Z> = 1 - (1 - p)(1 - cos x): the Hessian is
    [[-(1 - p) cos x, sin x], [sin x, 0]], binding by binding."""
    dev = qd.device("mixed", wires=1)

    @qd.qnode(dev)
    def f(x, p):
        qd.RX(x, wires=0)
        qd.AmplitudeDamping(p, wires=0)
        return qd.expval(qd.Z(0))
    x = torch.tensor([0.4, 1.1], dtype=torch.float64, requires_grad=True)
    p = torch.tensor([0.3, 0.05], dtype=torch.float64, requires_grad=True)
    gx, gp = torch.autograd.grad(f(x, p).sum(), (x, p), create_graph=True)
    torch.testing.assert_close(gx, -(1 - p) * torch.sin(x))
    torch.testing.assert_close(gp, 1 - torch.cos(x))
    hxx, hxp = torch.autograd.grad(gx.sum(), (x, p), retain_graph=True)
    hpx, = torch.autograd.grad(gp.sum(), x)
    torch.testing.assert_close(hxx, -(1 - p.detach()) * torch.cos(x.detach()))
    torch.testing.assert_close(hxp, torch.sin(x.detach()))
    torch.testing.assert_close(hpx, torch.sin(x.detach()))


# ------------------------------------------------------------------------------------------
# memory


def _bench_like(n):
    ops = []
    k = 0
    for _ in range(6):
        for w in range(n):
            for name in ("ry", "rz"):
                ops.append(qd.Operation(qd.get_gate(name), (w,), (qd.ParamRef(k),)))
                k += 1
                ops.append(qd.Operation(qd.DepolarizingChannel, (w,), (0.01,)))
                ops.append(qd.Operation(qd.AmplitudeDamping, (w,), (0.02,)))
        for w in range(n - 1):
            ops.append(qd.Operation(qd.get_gate("cx"), (w, w + 1)))
            for v in (w, w + 1):
                ops.append(qd.Operation(qd.DepolarizingChannel, (v,), (0.01,)))
                ops.append(qd.Operation(qd.AmplitudeDamping, (v,), (0.02,)))
    return qd.Circuit(n, tuple(ops), (qd.expval(qd.Z(0)),), num_params=k)


def test_plan_accepts_ten_qubits_batch_64_where_backprop_is_refused(monkeypatch):
    """At n = 10, batch 64 (1 GiB of density matrices per copy of the batch) under an 8 GiB
    budget, the reverse mode runs in chunks that fit (of one binding: a density matrix of 16 MiB
    reaches the chunk's size bound); backprop (two density matrices per fused
    block for the whole batch) is refused before allocating. Nothing is allocated here."""
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "8G")
    dev = qd.device("mixed", wires=10)
    c = _bench_like(10)
    plan = dev.reverse_plan(c, 64)
    one = 16 * 4 ** 10
    stored = sum(1 for u in reverse.build_blocks(c, torch.zeros(1, c.num_params,
                                                                dtype=torch.float64),
                                                 dev.cdtype, torch.device("cpu"),
                                                 (True,) * c.num_params).unitary if not u)
    assert plan.interval == 1 and plan.states == stored + reverse.WORKING
    per = plan.need / plan.chunk
    fits = int(8 * 2 ** 30 // per)
    assert 1 <= fits < 64  # the whole batch does not fit
    assert plan.chunk == min(fits, max(1, reverse.CHUNK_STATE_BYTES // one)) == 1
    assert plan.states * one * plan.chunk < plan.need < 1.01 * plan.states * one * plan.chunk
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "1G")  # one binding with all inputs: 1.1 GiB
    small = dev.reverse_plan(c, 64)
    assert small.interval > 1 and small.need <= 2 ** 30
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "100M")
    with pytest.raises(MemoryError, match="reverse mode on 10 qubits"):
        dev.reverse_plan(c, 64)
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "8G")
    from qdiff.backends.mixed.simulate import evolve
    with pytest.raises(MemoryError, match="batch 64"):
        evolve(c, torch.zeros(64, c.num_params, dtype=torch.float64, requires_grad=True))


_PEAK = """
import sys, torch
sys.path.insert(0, {root!r})
import qdiff as qd
from qdiff.backends.base import Job
sys.path.insert(0, {tests!r})
from test_mixed_reverse import _bench_like
def hwm():
    return int([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]) * 1024
n, b = {n}, {b}
dev = qd.device("mixed", wires=n)
c = _bench_like(n)
theta = torch.rand(b, c.num_params, dtype=torch.float64)
small = _bench_like(2)
d2 = qd.device("mixed", wires=2)
t2 = torch.rand(1, small.num_params, dtype=torch.float64)
[r] = d2.execute([Job(small, t2, flat=True, keep=True)])
d2.vjp([Job(small, t2, flat=True)], [torch.ones(1, 1, dtype=torch.float64)], [r.residual])
h0 = hwm()
plan = dev.reverse_plan(c, b)
[r] = dev.execute([Job(c, theta, flat=True, keep=True)])
dev.vjp([Job(c, theta, flat=True)], [torch.ones(b, 1, dtype=torch.float64)], [r.residual])
print(hwm() - h0, plan.need, plan.chunk, plan.interval)
"""


@pytest.mark.parametrize("n,b,limit", [
    (7, 4, None),
    pytest.param(7, 6, "30M", marks=pytest.mark.slow),
    pytest.param(7, 3, "6M", marks=pytest.mark.slow),
    pytest.param(8, 4, None, marks=pytest.mark.slow),
    pytest.param(8, 6, "120M", marks=pytest.mark.slow),
    pytest.param(8, 3, "20M", marks=pytest.mark.slow)])
def test_memory_plan_matches_what_is_allocated(n, b, limit):
    """The plan's bytes (what the guard checks) against the peak resident memory a fresh process
    adds for one reverse-mode gradient, with glibc's mmap threshold fixed so that freed tensors
    leave the resident set: all inputs kept for the whole batch; chunks of the batch; and
    checkpoints with recomputed segments."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    if limit:
        env["QDIFF_MEMORY_LIMIT"] = limit
    else:
        env.pop("QDIFF_MEMORY_LIMIT", None)
    out = subprocess.run([sys.executable, "-c", _PEAK.format(
        root=root, tests=os.path.join(root, "tests"), n=n, b=b)], capture_output=True, text=True,
        env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    peak, need, chunk, interval = (float(v) for v in out.stdout.split())
    if limit in ("30M", "120M"):
        assert 1 < chunk < b and interval == 1
    if limit in ("6M", "20M"):
        assert chunk == 1 and interval > 1
    assert 0.8 * need <= peak <= 1.15 * need + 4 * 2 ** 20, (peak, need)


def test_torch_func_grad_of_the_reverse_mode():
    """torch.func.grad through the mixed device's adjoint (gates and a trainable channel) is
    the autograd gradient, the closed form."""
    dev = qd.device("mixed", wires=2)

    @qd.qnode(dev, diff_method="adjoint")
    def f(x, p):
        qd.RX(x, wires=0)
        qd.CNOT(wires=[0, 1])
        qd.DepolarizingChannel(p, wires=1)
        return qd.expval(qd.Z(1))
    x = torch.tensor(0.4, dtype=torch.float64)
    p = torch.tensor(0.1, dtype=torch.float64)
    gx, gp = torch.func.grad(f, argnums=(0, 1))(x, p)
    torch.testing.assert_close(gx, torch.tensor(-math.sin(0.4) * (1 - 4 * 0.1 / 3),
                                                dtype=torch.float64))
    torch.testing.assert_close(gp, torch.tensor(-4 / 3 * math.cos(0.4), dtype=torch.float64))


def test_vmap_of_grad_of_the_reverse_mode():
    """torch.func.vmap(torch.func.grad(f)) through the mixed device's adjoint (every channel,
    gates with shared and scaled parameters) gives each sample's autograd gradient."""
    dev = qd.device("mixed", wires=3)
    h = 0.7 * qd.Z(0) @ qd.X(1) + 0.3 * qd.Y(2)

    @qd.qnode(dev, diff_method="adjoint")
    def f(x, p):
        _body(x, p)
        return qd.expval(h)
    x, p = _inputs(batch=3, seed=4)
    gx, gp = torch.func.vmap(torch.func.grad(f, argnums=(0, 1)), in_dims=(0, None))(
        x.detach(), p.detach())
    for i in range(3):
        xi = x[i].detach().clone().requires_grad_()
        pi = p.detach().clone().requires_grad_()
        ax, ap = torch.autograd.grad(f(xi, pi), (xi, pi))
        torch.testing.assert_close(gx[i], ax)
        torch.testing.assert_close(gp[i], ap)


def test_torch_func_vmap_of_grad_through_the_reverse_mode():
    """vmap over bindings of torch.func.grad through the adjoint (a gate angle and a channel
    parameter per binding) is the closed form, binding by binding:
    <Z> = 1 - (1 - p)(1 - cos x)."""
    dev = qd.device("mixed", wires=1)

    @qd.qnode(dev, diff_method="adjoint")
    def f(x, p):
        qd.RX(x, wires=0)
        qd.AmplitudeDamping(p, wires=0)
        return qd.expval(qd.Z(0))
    x = torch.tensor([0.3, 0.4, 1.2], dtype=torch.float64)
    p = torch.tensor([0.3, 0.5, 0.05], dtype=torch.float64)
    gx, gp = torch.func.vmap(torch.func.grad(f, argnums=(0, 1)))(x, p)
    torch.testing.assert_close(gx, -(1 - p) * torch.sin(x))
    torch.testing.assert_close(gp, 1 - torch.cos(x))
