"""complex64 native kernels against the torch complex64 kernels and the complex128 results, to
single precision: forward programs (data given and coded), the adjoint sweeps (slots, coded,
the Z-word diagonal), measurements; sizes that exercise every block width (bits 0-7 and above),
the chunked path (n >= 15), batch tiles and their edges, one and two threads."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff.backends.statevector import native
from qdiff.backends.statevector.adjoint import adjoint_vjp
from qdiff.backends.statevector.measure import measure_all
from qdiff.backends.statevector.simulate import simulate
from qdiff.circuits import Circuit, Operation, ParamRef
from qdiff.circuits.gates import GATES, multirz_gate

pytestmark = pytest.mark.skipif(native.library() is None,
                                reason="no C compiler: the native kernels are not built")

POOL = sorted({id(g): g for g in GATES.values()}.values(), key=lambda g: g.name)
POOL = [g for g in POOL if g.num_wires <= 4 and g.name != "qubitunitary"] + [multirz_gate(3)]
CODED = [g for g in POOL if g.num_params == 0 or native.code_of(g)]


def _circuit(seed, n, depth, pool=POOL, low=False):
    rng = np.random.default_rng(seed)
    ops, p = [], 0
    for _ in range(depth):
        g = pool[rng.integers(len(pool))]
        if g.num_wires > n:
            continue
        span = min(n, 4) if low and n > 4 else n  # low: gates on the last (lowest-bit) wires
        wires = tuple(int(n - 1 - w) for w in rng.choice(span, g.num_wires, replace=False)) \
            if g.num_wires <= span else tuple(int(w) for w in rng.choice(n, g.num_wires,
                                                                         replace=False))
        ops.append(Operation(g, wires, tuple(ParamRef(p + i) for i in range(g.num_params))))
        p += g.num_params
    return Circuit(n, tuple(ops), num_params=p)


def _forward(c, theta, cdtype, torch_kernels=False):
    with torch.no_grad():
        if torch_kernels:
            with native.disabled():
                return simulate(c, theta, cdtype=cdtype)
        return simulate(c, theta, cdtype=cdtype)


@pytest.mark.parametrize("n,batch", [(1, 1), (2, 5), (3, 37), (5, 3), (8, 1), (9, 2),
                                     (10, 3), (13, 1), (15, 1), (16, 2)])
@pytest.mark.parametrize("pool", ["all", "coded"])
def test_forward_c64_matches_torch_and_c128(n, batch, pool):
    c = _circuit(n * 7 + batch, n, 50 if n < 12 else 30, POOL if pool == "all" else CODED,
                 low=n % 2 == 0)
    if pool == "coded":
        assert native.coded_plan(c.operations, n) is not None
    theta = torch.tensor(np.random.default_rng(n).uniform(-3, 3, (batch, c.num_params)))
    ours = _forward(c, theta, torch.complex64)
    assert ours.dtype == torch.complex64
    ref64 = _forward(c, theta, torch.complex64, torch_kernels=True)
    ref128 = _forward(c, theta, torch.complex128)
    assert torch.allclose(ours, ref64, atol=2e-5)
    assert torch.allclose(ours.to(torch.complex128), ref128, atol=2e-5)


@pytest.mark.parametrize("n,batch", [(2, 1), (4, 37), (6, 3), (9, 1), (14, 1), (15, 2)])
@pytest.mark.parametrize("pool", ["all", "coded"])
def test_adjoint_c64_matches_torch_and_c128(n, batch, pool):
    c = _circuit(100 + n + batch, n, 40 if n < 12 else 20, POOL if pool == "all" else CODED)
    obs = qd.Z(0) @ qd.X(n - 1) + 0.5 * qd.Y(n // 2)
    c = c.with_measurements((qd.expval(obs), qd.probs(wires=[0, n - 1])))
    theta = torch.tensor(np.random.default_rng(n).uniform(-3, 3, (batch, c.num_params)))
    cot = torch.tensor(np.random.default_rng(n + 1).normal(size=(batch, 5)))
    trainable = [True] * c.num_params
    grads = {}
    for cdtype in (torch.complex64, torch.complex128):
        state = _forward(c, theta, cdtype)
        grads[cdtype] = adjoint_vjp(c, theta, state.clone(), cot, trainable)
        if cdtype == torch.complex64:
            with native.disabled():
                ref = adjoint_vjp(c, theta, state.clone(), cot, trainable)
            assert grads[cdtype].dtype == torch.float32
            torch.testing.assert_close(grads[cdtype], ref, atol=3e-4, rtol=1e-4)
    torch.testing.assert_close(grads[torch.complex64].double(), grads[torch.complex128],
                               atol=3e-4, rtol=1e-4)


@pytest.mark.parametrize("n,batch", [(3, 64), (5, 33), (11, 2), (15, 1)])
def test_layer_gradients_c64_match_c128(n, batch):
    """The coded sweep with the Z-word diagonal (lam formed in cache) and batch-shared weights."""
    res = {}
    for cdtype in (torch.complex64, torch.complex128):
        dev = qd.device("statevector", wires=n, dtype=cdtype)

        @qd.qnode(dev, diff_method="adjoint")
        def f(x, w):
            qd.AngleEmbedding(x, wires=range(n))
            qd.StronglyEntanglingLayers(w, wires=range(n))
            return [qd.expval(qd.Z(i)) for i in range(n)]
        g = torch.Generator().manual_seed(n)
        x = torch.rand(batch, n, dtype=torch.float64, generator=g, requires_grad=True)
        w = torch.rand(2, n, 3, dtype=torch.float64, generator=g, requires_grad=True)
        out = f(x, w)
        res[cdtype] = (out.detach().double(),) + tuple(
            t.double() for t in torch.autograd.grad(out.sum(), (x, w)))
    for a, b in zip(res[torch.complex64], res[torch.complex128]):
        torch.testing.assert_close(a, b, atol=5e-4, rtol=1e-4)


@pytest.mark.parametrize("n", [12, 15])
def test_c64_two_threads_match_one(n):
    c = _circuit(5, n, 40)
    theta = torch.rand(1, c.num_params, dtype=torch.float64)
    cm = c.with_measurements((qd.expval(qd.Z(0) @ qd.X(n - 1)),))
    cot = torch.ones(1, 1, dtype=torch.float64)
    old = torch.get_num_threads()
    out = []
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            s = _forward(c, theta, torch.complex64)
            out.append((s, adjoint_vjp(cm, theta, s.clone(), cot, [True] * c.num_params)))
    finally:
        torch.set_num_threads(old)
    assert torch.allclose(out[0][0], out[1][0], atol=1e-5)
    assert torch.allclose(out[0][1], out[1][1], atol=1e-3)


def test_c64_measurements_match_c128():
    n = 13
    c = _circuit(9, n, 40, CODED)
    ms = (qd.probs(wires=[0, 3]), qd.expval(qd.Z(1) @ qd.Z(5)), qd.expval(qd.X(2) + qd.Y(7)),
          qd.var(qd.Z(4)))
    c = c.with_measurements(ms)
    theta = torch.rand(2, c.num_params, dtype=torch.float64)
    outs = {}
    for cdtype in (torch.complex64, torch.complex128):
        s = _forward(c, theta, cdtype)
        outs[cdtype] = measure_all(s, c, None, None)
    for a, b in zip(outs[torch.complex64], outs[torch.complex128]):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, atol=5e-5, rtol=1e-4)
