"""The adjoint sweep's fused one-qubit steps (overlap sums and both updates in one pass, vector
kernels: lanes of whole blocks for the lowest target bits, halves of blocks above them, single
precision sums flushed to double for complex64) at every target bit, against the torch sweep:
both precisions, one and two threads (blocks split over threads, and the top bit's halves
split inside a block), in place and in cache tiles."""
from __future__ import annotations

import pytest
import torch

import qdiff as qd
from qdiff.backends.statevector import native
from qdiff.backends.statevector.adjoint import adjoint_vjp
from qdiff.backends.statevector.simulate import simulate
from qdiff.circuits import Circuit, Operation, ParamRef
from qdiff.circuits.gates import BUILTIN_GATES as G

pytestmark = pytest.mark.skipif(native.library() is None,
                                reason="no C compiler: the native kernels are not built")


def _circuit(n):
    """A mixer, then trainable RX, RY, Rot and RZ on every wire (lowest bit first: every target
    bit gets the fused step), a CNOT ring between layers."""
    ops = [Operation(G["h"], (w,)) for w in range(n)]
    ops += [Operation(G["cx"], (w, (w + 1) % n)) for w in range(n)] if n > 1 else []
    p = 0
    for name in ("rx", "ry", "rot", "rz"):
        for w in reversed(range(n)):
            g = G[name]
            ops.append(Operation(g, (w,), tuple(ParamRef(p + i) for i in range(g.num_params))))
            p += g.num_params
        ops += [Operation(G["cx"], (w, (w + 2) % n)) for w in range(n)] if n > 2 else []
    return Circuit(n, tuple(ops), num_params=p)


SIZES = [(1, 1), (3, 2), (4, 1), (5, 3), (9, 1), (12, 1), (13, 2), (16, 1)]


# tiles (QDIFF_NATIVE_TILES=2) start at 16 qubits: forced only where they apply
@pytest.mark.parametrize("n,batch,tiles", [(n, b, "0") for n, b in SIZES] + [(16, 1, "2")])
@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("threads", [1, 2])
def test_fused_steps_match_torch_sweep(n, batch, cdtype, threads, tiles, monkeypatch):
    monkeypatch.setenv("QDIFF_NATIVE_TILES", tiles)
    c = _circuit(n)
    obs = qd.Z(0) @ qd.X(n - 1) + 0.5 * qd.Y(n // 2) if n > 1 else qd.X(0)
    c = c.with_measurements((qd.expval(obs), qd.expval(qd.Z(n - 1))))
    g = torch.Generator().manual_seed(n + batch)
    theta = (torch.rand(batch, c.num_params, dtype=torch.float64, generator=g) - 0.5) * 6
    cot = torch.randn(batch, 2, dtype=torch.float64, generator=g)
    trainable = [i % 5 != 3 for i in range(c.num_params)]
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            state = simulate(c, theta, cdtype=cdtype)
            ours, back = adjoint_vjp(c, theta, state.clone(), cot, trainable, return_state=True)
            plain = adjoint_vjp(c, theta, state.clone(), cot, trainable)
            with native.disabled():
                ref = adjoint_vjp(c, theta, state.clone().to(torch.complex128), cot, trainable)
    finally:
        torch.set_num_threads(old)
    tol = 1e-10 if cdtype == torch.complex128 else 2e-4
    torch.testing.assert_close(ours.double(), ref, atol=tol, rtol=tol)
    torch.testing.assert_close(plain.double(), ref, atol=tol, rtol=tol)
    start = torch.zeros(batch, 2 ** n, dtype=torch.complex128)
    start[:, 0] = 1
    assert torch.allclose(back.to(torch.complex128), start, atol=10 * tol)


@pytest.mark.parametrize("n", [12, 13, 16])
@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
def test_threads_product_prefix_and_z_word_lam_match_torch(n, cdtype):
    """Two threads on one state: the leading product of one-qubit gates written as high-bit
    times low-bit factors, lam = (Z-word diagonal) * psi formed block by block."""
    c = _circuit(n)
    rot = [Operation(G["rx" if w % 2 else "ry"], (w,), (0.1 + 0.3 * w,)) for w in range(n)]
    c = Circuit(n, tuple(rot) + c.operations, num_params=c.num_params)
    c = c.with_measurements(tuple(qd.expval(qd.Z(w)) for w in (0, n // 2, n - 1)))
    g = torch.Generator().manual_seed(n)
    theta = (torch.rand(1, c.num_params, dtype=torch.float64, generator=g) - 0.5) * 6
    cot = torch.randn(1, 3, dtype=torch.float64, generator=g)
    trainable = [True] * c.num_params
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.no_grad():
            state = simulate(c, theta, cdtype=cdtype)
            ours = adjoint_vjp(c, theta, state.clone(), cot, trainable)
    finally:
        torch.set_num_threads(old)
    with torch.no_grad(), native.disabled():
        ref_state = simulate(c, theta, cdtype=torch.complex128)
        ref = adjoint_vjp(c, theta, ref_state.clone(), cot, trainable)
    tol = 1e-10 if cdtype == torch.complex128 else 2e-4
    assert torch.allclose(state.to(torch.complex128), ref_state, atol=tol / 4)
    torch.testing.assert_close(ours.double(), ref, atol=tol, rtol=tol)
