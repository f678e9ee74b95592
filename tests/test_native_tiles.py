"""Large states: runs of gates applied in cache tiles (the low bits and up to four other bits of
the state in the adjoint sweep (five in complex64), up to six (complex128) or seven (complex64)
in a forward run, gathered into a buffer), forward and adjoint, one and two threads, both
precisions, against the torch kernels. Random circuits mix gates on high, middle and low wires,
controlled and wide (4-wire dense, 5-wire diagonal) gates, so runs break at every kind of
boundary."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff.backends.statevector import native
from qdiff.backends.statevector.adjoint import adjoint_vjp
from qdiff.backends.statevector.simulate import simulate
from qdiff.circuits import Circuit, Operation, ParamRef
from qdiff.circuits.gates import GATES, multirz_gate
from conftest import torch_threads

pytestmark = pytest.mark.skipif(native.library() is None,
                                reason="no C compiler: the native kernels are not built")

POOL = sorted({id(g): g for g in GATES.values()}.values(), key=lambda g: g.name)
POOL = [g for g in POOL if g.num_wires <= 4 and g.name != "qubitunitary"] + [multirz_gate(5)]
CODED = [g for g in POOL if g.num_params == 0 or native.code_of(g)]
ATOL = {torch.complex128: 1e-10, torch.complex64: 3e-5}


def _circuit(seed, n, depth, pool):
    rng = np.random.default_rng(seed)
    ops, p = [], 0
    for _ in range(depth):
        g = pool[rng.integers(len(pool))]
        wires = tuple(int(w) for w in rng.choice(n, g.num_wires, replace=False))
        ops.append(Operation(g, wires, tuple(ParamRef(p + i) for i in range(g.num_params))))
        p += g.num_params
    return Circuit(n, tuple(ops), num_params=p)


@pytest.mark.parametrize("n,batch", [(16, 1), (17, 2), (18, 1)])
@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("pool", ["all", "coded"])
def test_tiled_forward_matches_torch(n, batch, cdtype, threads, pool, monkeypatch):
    monkeypatch.setenv("QDIFF_NATIVE_TILES", "2")  # tiles at every size from 2^16 on
    c = _circuit(n + batch + threads, n, 60, POOL if pool == "all" else CODED)
    theta = torch.tensor(np.random.default_rng(n).uniform(-3, 3, (batch, c.num_params)))
    with torch.no_grad(), torch_threads(threads):
        ours = simulate(c, theta, cdtype=cdtype)
        with native.disabled():
            ref = simulate(c, theta, cdtype=cdtype)
    assert torch.allclose(ours, ref, atol=ATOL[cdtype])


@pytest.mark.parametrize("n,batch", [(16, 1), (17, 1), (16, 2)])
@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("threads", [1, 2])
def test_tiled_adjoint_matches_torch(n, batch, cdtype, threads, monkeypatch):
    monkeypatch.setenv("QDIFF_NATIVE_TILES", "2")
    cases = {"general": (qd.expval(qd.Z(0) @ qd.X(n - 1) + 0.5 * qd.Y(n // 2)),),
             "zwords": tuple(qd.expval(qd.Z(i)) for i in (0, 3, n - 1))}
    tol = 1e-9 if cdtype == torch.complex128 else 2e-3
    biggest = 0.0
    # random circuits until one has gradients away from zero (some draws leave the measured
    # wires outside every rotation's reach); each one drawn is compared
    for seed in range(3 * n + batch, 3 * n + batch + 400, 100):
        c = _circuit(seed, n, 40, CODED)
        assert native.coded_plan(c.operations, n) is not None
        theta = torch.tensor(np.random.default_rng(n + 5).uniform(-3, 3, (batch, c.num_params)))
        trainable = [bool(i % 3) for i in range(c.num_params)]
        for name, ms in cases.items():
            cm = c.with_measurements(ms)
            cot = torch.tensor(np.random.default_rng(n).normal(size=(batch, len(ms))))
            with torch.no_grad(), torch_threads(threads):
                state = simulate(cm, theta, cdtype=cdtype)
                ours = adjoint_vjp(cm, theta, state.clone(), cot, trainable)
                with native.disabled():
                    ref = adjoint_vjp(cm, theta, state.clone(), cot, trainable)
            torch.testing.assert_close(ours, ref, atol=tol, rtol=tol, msg=name)
            biggest = max(biggest, float(ours.abs().max()))
        if biggest > 1e-3:
            break
    assert biggest > 1e-3


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
def test_tiled_sweep_restores_the_input_state(cdtype):
    n = 16
    c = _circuit(77, n, 50, CODED).with_measurements((qd.expval(qd.X(2)),))
    theta = torch.rand(1, c.num_params, dtype=torch.float64)
    with torch.no_grad(), torch_threads(2):
        state = simulate(c, theta, cdtype=cdtype)
        _, psi = adjoint_vjp(c, theta, state.clone(), torch.ones(1, 1, dtype=torch.float64),
                             [True] * c.num_params, return_state=True)
    zero = torch.zeros_like(psi)
    zero[:, 0] = 1
    assert torch.allclose(psi, zero, atol=ATOL[cdtype] * 10)


def _layers(n, layers):
    """Rot on every wire, then a ring of CNOTs at range 1 + l % (n - 1), per layer (coded)."""
    from qdiff.circuits import get_gate
    ops, p = [], 0
    for layer in range(layers):
        for w in range(n):
            ops.append(Operation(get_gate("rot"), (w,), (ParamRef(p), ParamRef(p + 1),
                                                           ParamRef(p + 2))))
            p += 3
        r = 1 + layer % (n - 1)
        for w in range(n):
            ops.append(Operation(get_gate("cnot"), (w, (w + r) % n), ()))
    return Circuit(n, tuple(ops), num_params=p)


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
def test_tiled_sweep_gradients_do_not_depend_on_the_thread_count(cdtype):
    # tiles are taken in chunks fixed by the state size and each angle's overlap is summed per
    # chunk, then over the chunks in order: from the same state, 1, 2 and 3 threads give the
    # same bits
    n = 17
    c = _layers(n, 3).with_measurements(tuple(qd.expval(qd.Z(i)) for i in range(n)))
    assert native.coded_plan(c.operations, n) is not None
    theta = torch.tensor(np.random.default_rng(3).uniform(-3, 3, (1, c.num_params)))
    cot = torch.tensor(np.random.default_rng(4).normal(size=(1, n)))
    with torch.no_grad():
        state = simulate(c, theta, cdtype=cdtype)
    grads = []
    for t in (1, 2, 3):
        with torch.no_grad(), torch_threads(t):
            grads.append(adjoint_vjp(c, theta, state.clone(), cot, [True] * c.num_params))
    assert float(grads[0].abs().max()) > 1e-3
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[0], grads[2])
    with torch.no_grad(), native.disabled():
        ref = adjoint_vjp(c, theta, state.clone(), cot, [True] * c.num_params)
    tol = 1e-9 if cdtype == torch.complex128 else 2e-3
    torch.testing.assert_close(grads[0], ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("mode", ["slots", "tiles off"])
def test_untiled_sweep_gradients_do_not_depend_on_the_thread_count(cdtype, mode, monkeypatch):
    # one state of 2^16 amplitudes swept gate by gate (gates with data given, or the coded
    # sweep with the tiles off), its kernels split over the threads: every overlap is summed in
    # fixed parts added in order, so 1 and 2 threads give the same bits
    from qdiff.circuits import get_gate
    n = 16
    if mode == "tiles off":
        monkeypatch.setenv("QDIFF_NATIVE_TILES", "0")
    u = get_gate("u2" if mode == "slots" else "rot")
    ops, p = [], 0
    for w in (0, 3, 8, 13, 14, 15):
        ops.append(Operation(u, (w,), tuple(ParamRef(p + i) for i in range(u.num_params))))
        p += u.num_params
    ops += [Operation(get_gate("crx"), (14, 2), (ParamRef(p),)),
            Operation(get_gate("rxx"), (15, 1), (ParamRef(p + 1),))]
    c = Circuit(n, tuple(ops), num_params=p + 2).with_measurements(
        (qd.expval(qd.X(0) @ qd.Y(13) + 0.5 * qd.Y(15) @ qd.X(2)), qd.probs(wires=[14])))
    assert (native.coded_plan(c.operations, n) is None) == (mode == "slots")
    theta = torch.tensor(np.random.default_rng(7).uniform(-3, 3, (1, c.num_params)))
    cot = torch.tensor([[0.8, -0.3, 1.1]])
    with torch.no_grad():
        state = simulate(c, theta, cdtype=cdtype)
    grads = []
    for t in (1, 2):
        with torch.no_grad(), torch_threads(t):
            grads.append(adjoint_vjp(c, theta, state.clone(), cot, [True] * c.num_params))
    assert float(grads[0].abs().max()) > 1e-3
    assert torch.equal(grads[0], grads[1])
    with torch.no_grad(), native.disabled():
        ref = adjoint_vjp(c, theta, state.clone(), cot, [True] * c.num_params)
    tol = 1e-9 if cdtype == torch.complex128 else 2e-3
    torch.testing.assert_close(grads[0], ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("threads", [1, 2])
def test_tiled_sweep_of_a_deep_circuit_matches_the_untiled_sweep(threads, monkeypatch):
    # more than a thousand gates: the sweep's runs are split over several parallel regions
    n = 16
    c = _layers(n, 36).with_measurements((qd.expval(qd.Z(0) @ qd.X(n - 1)),))
    assert len(c.operations) > 1100
    theta = torch.tensor(np.random.default_rng(5).uniform(-3, 3, (1, c.num_params)))
    cot = torch.ones(1, 1, dtype=torch.float64)
    out = {}
    for mode in ("1", "0"):
        monkeypatch.setenv("QDIFF_NATIVE_TILES", mode)
        with torch.no_grad(), torch_threads(threads):
            state = simulate(c, theta, cdtype=torch.complex128)
            out[mode] = adjoint_vjp(c, theta, state, cot, [True] * c.num_params)
    assert float(out["1"].abs().max()) > 1e-3
    torch.testing.assert_close(out["1"], out["0"], atol=1e-9, rtol=1e-9)
