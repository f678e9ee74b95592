"""The native CPU kernels (qdsim.c) against the torch kernels they replace.

Random circuits over every registered gate (and MultiRZ/PauliRot families), batched and not,
small states (gate-by-gate in L1) and states large enough for the chunked path, one and two
threads; the adjoint sweep against the torch sweep; fallbacks (disabled, unsupported gates).
"""
from __future__ import annotations

import contextlib

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff.backends.statevector import native
from qdiff.backends.statevector.simulate import simulate
from qdiff.circuits import Circuit, Operation, ParamRef
from qdiff.circuits.gates import GATES, multirz_gate, paulirot_gate
from qdiff.backends.statevector.adjoint import adjoint_vjp

pytestmark = pytest.mark.skipif(native.library() is None,
                                reason="no C compiler: the native kernels are not built")

POOL = sorted({id(g): g for g in GATES.values()}.values(), key=lambda g: g.name)
POOL = [g for g in POOL if g.num_wires <= 4 and g.name != "qubitunitary"] + [
    multirz_gate(3), paulirot_gate("XYZ"), multirz_gate(5)]


def _circuit(seed, n, depth, refs=True):
    rng = np.random.default_rng(seed)
    ops, p = [], 0
    for _ in range(depth):
        g = POOL[rng.integers(len(POOL))]
        if g.num_wires > n:
            continue
        wires = tuple(int(w) for w in rng.choice(n, g.num_wires, replace=False))
        if refs:
            params = tuple(ParamRef(p + i, scale=1.0) for i in range(g.num_params))
            p += g.num_params
        else:
            params = tuple(float(a) for a in rng.uniform(-3, 3, g.num_params))
        ops.append(Operation(g, wires, params))
    return Circuit(n, tuple(ops), num_params=p)


def _torch_state(c, theta, **kw):
    with native.disabled():
        return simulate(c, theta, **kw)


@pytest.mark.parametrize("n,batch", [(1, 1), (3, 4), (6, 1), (6, 3), (15, 1), (16, 2)])
@pytest.mark.parametrize("seed", range(3))
def test_forward_matches_torch(n, batch, seed):
    c = _circuit(seed, n, 60 if n < 10 else 45)
    theta = torch.tensor(np.random.default_rng(seed).uniform(-3, 3, (batch, c.num_params)))
    ref = _torch_state(c, theta)
    with torch.no_grad():
        ours = simulate(c, theta)
    assert torch.allclose(ours, ref, atol=1e-11)


def test_two_threads_match_one():
    c = _circuit(5, 15, 40)
    theta = torch.rand(1, c.num_params, dtype=torch.float64)
    c3 = _circuit(6, 6, 40)
    theta3 = torch.rand(5, c3.num_params, dtype=torch.float64)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = simulate(c, theta), simulate(c3, theta3)
        torch.set_num_threads(2)
        two = simulate(c, theta), simulate(c3, theta3)
    finally:
        torch.set_num_threads(old)
    for a, b in zip(one, two):
        assert torch.allclose(a, b, atol=1e-12)


@pytest.mark.parametrize("n", [4, 15])
def test_program_inverse_restores_state(n):
    c = _circuit(11, n, 50, refs=False)
    psi = torch.randn(2, 2 ** n, dtype=torch.complex128)
    psi = psi / psi.norm(dim=1, keepdim=True)
    from qdiff.backends.statevector.gate_data import circuit_angles, circuit_data
    theta = torch.zeros(2, 0, dtype=torch.float64)
    data = circuit_data(c.operations, circuit_angles(c.operations, theta, torch.float64),
                        torch.complex128)
    prog = native.Program(2, n)
    for op, d in zip(c.operations, data):
        prog.add_data(op, d.kind, d.value, n)
    state = psi.clone()
    native.run(state, prog)
    assert not torch.allclose(state, psi, atol=1e-3)
    native.run(state, prog, dagger=True)
    assert torch.allclose(state, psi, atol=1e-11)


@pytest.mark.parametrize("n,batch", [(3, 1), (5, 3), (15, 1)])
@pytest.mark.parametrize("seed", range(3))
def test_adjoint_sweep_matches_torch(n, batch, seed):
    c = _circuit(100 + seed, n, 40 if n < 10 else 25)
    from qdiff.circuits.measurements import Measurement
    obs = qd.Z(0) @ qd.X(n - 1) + 0.5 * qd.Y(n // 2)
    c = Circuit(n, c.operations, num_params=c.num_params,
                measurements=(qd.expval(obs), qd.probs(wires=[0, n - 1])))
    assert all(isinstance(m, Measurement) for m in c.measurements)
    theta = torch.tensor(np.random.default_rng(seed).uniform(-3, 3, (batch, c.num_params)))
    state = _torch_state(c, theta)
    cot = torch.tensor(np.random.default_rng(seed + 1).normal(size=(batch, 5)))
    trainable = [True] * c.num_params
    ours, psi = adjoint_vjp(c, theta, state.clone(), cot, trainable, return_state=True)
    with native.disabled():
        ref = adjoint_vjp(c, theta, state.clone(), cot, trainable)
    assert torch.allclose(ours, ref, atol=1e-10)
    assert torch.allclose(psi, _torch_state(Circuit(n, (), num_params=0),
                                            theta[:, :0]).expand_as(psi), atol=1e-10)


def test_adjoint_layer_gradients_match_backprop():
    n = 6
    dev = qd.device("statevector", wires=n)

    def make(method):
        @qd.qnode(dev, diff_method=method)
        def f(x, w):
            qd.AngleEmbedding(x, wires=range(n))
            qd.StronglyEntanglingLayers(w, wires=range(n))
            qd.CRot(w[0, 0, 0], w[0, 1, 1], w[1, 2, 2], wires=[1, 4])
            return [qd.expval(qd.Z(i)) for i in range(n)] + [qd.var(qd.X(2))]
        return f
    x = torch.rand(7, n, dtype=torch.float64)
    w = torch.rand(2, n, 3, dtype=torch.float64, requires_grad=True)
    grads = {}
    for method in ("adjoint", "backprop"):
        out = make(method)(x, w)
        loss = out.pow(2).sum() if isinstance(out, torch.Tensor) else sum(
            o.pow(2).sum() for o in out)
        grads[method], = torch.autograd.grad(loss, w)
    assert torch.allclose(grads["adjoint"], grads["backprop"], atol=1e-10)


def test_unsupported_gate_falls_back():
    n = 8
    ops = (Operation(GATES["h"], (0,), ()), Operation(multirz_gate(7), tuple(range(7)),
                                                       (ParamRef(0),)))
    c = Circuit(n, ops, num_params=1)
    theta = torch.tensor([[0.4]], dtype=torch.float64)
    with pytest.raises(native.Unsupported):
        native.evolve(simulate(Circuit(n, (), num_params=1), theta).clone(), ops, theta, n,
                      torch.float64)
    assert torch.allclose(simulate(c, theta), _torch_state(c, theta), atol=1e-12)


def test_disabled_by_environment(tmp_path):
    code = ("import qdiff.backends.statevector.native as n; import sys; "
            "sys.exit(0 if n.library() is None else 1)")
    env = dict(os.environ, QDIFF_NATIVE="0")
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


@pytest.mark.skipif(shutil.which("cc") is None, reason="no cc")
def test_fresh_build_into_cache(tmp_path):
    """A fresh cache dir gets a build (atomically, via a temporary file) that loads: the
    library, its hash and the build lock, no leftover temporary files."""
    code = ("import qdiff.backends.statevector.native as n, sys; "
            "sys.exit(0 if n.library() is not None else 1)")
    env = dict(os.environ, QDIFF_CACHE_DIR=str(tmp_path))
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=300).returncode == 0
    built = list((tmp_path / "native").glob("qdsim-*.so"))
    assert len(built) == 1
    name = built[0].name
    assert sorted(p.name for p in (tmp_path / "native").iterdir()) == sorted(
        [name, name + ".lock", name + ".sha256"])


def test_z_expvals_on_large_register_match_direct_sums():
    """The two-halves marginal path for Z words (hi half, lo half, spanning both)."""
    n = 13
    dev = qd.device("statevector", wires=n)
    words = [(0,), (12,), (0, 12), (3, 5), (7, 9, 11), (6,)]

    @qd.qnode(dev)
    def f(w):
        qd.StronglyEntanglingLayers(w, wires=range(n))
        return [qd.expval(qd.Hamiltonian([1.0], [_zword(ws)])) for ws in words] + [qd.state()]
    w = torch.rand(2, 2, n, 3, dtype=torch.float64)
    out = f(w)
    psi = out[-1]
    p = psi.abs() ** 2
    x = torch.arange(2 ** n)
    for j, ws in enumerate(words):
        par = torch.zeros_like(x)
        for q in ws:
            par ^= (x >> (n - 1 - q)) & 1
        assert torch.allclose(out[j], (p * (1 - 2 * par)).sum(-1), atol=1e-12)


def _zword(ws):
    op = qd.Z(ws[0])
    for q in ws[1:]:
        op = op @ qd.Z(q)
    return op


def _recorded(n, prep_grad=False, coeff_grad=False):
    from qdiff.qnode import QNode
    dev = qd.device("statevector", wires=n)
    coeff = torch.tensor([0.5], dtype=torch.float64, requires_grad=coeff_grad)

    def f(w, v):
        if prep_grad:
            qd.AmplitudeEmbedding(v, wires=range(2), normalize=True)
        qd.StronglyEntanglingLayers(w, wires=range(n))
        return qd.expval(qd.Hamiltonian(coeff, [qd.Z(0)]))
    w = torch.rand(1, n, 3, dtype=torch.float64, requires_grad=True)
    v = torch.rand(4, dtype=torch.float64, requires_grad=prep_grad)
    return dev, QNode(f, dev).construct(w, v)[0]


def test_best_prefers_native_adjoint():
    from qdiff.rules import resolve

    def resolve_method(*a):
        return resolve(*a).name
    for n, expected in ((1, "adjoint"), (4, "adjoint"), (6, "adjoint"), (12, "adjoint")):
        dev, rec = _recorded(n)
        assert resolve_method("best", dev, rec.circuit, rec) == expected
    # calls only backprop differentiates stay on backprop
    dev, rec = _recorded(10, prep_grad=True)
    assert resolve_method("best", dev, rec.circuit, rec) == "backprop"
    dev, rec = _recorded(10, coeff_grad=True)
    assert resolve_method("best", dev, rec.circuit, rec) == "backprop"
    # without the native kernels the torch adjoint is not faster than backprop up to 16 wires
    dev, rec = _recorded(12)
    with native.disabled():
        assert resolve_method("best", dev, rec.circuit, rec) == "backprop"
    c64 = qd.device("statevector", wires=12, dtype=torch.complex64)
    assert resolve_method("best", c64, rec.circuit, rec) == "adjoint"  # native c64 sweep
    with native.disabled():
        assert resolve_method("best", c64, rec.circuit, rec) == "backprop"


def _child_run(conn):
    c = _circuit(6, 6, 40)
    theta = torch.rand(5, c.num_params, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    conn.send(simulate(c, theta).abs().sum().item())
    conn.close()


def test_forked_child_after_parallel_run_does_not_hang():
    import multiprocessing as mp
    c = _circuit(6, 6, 40)
    theta = torch.rand(5, c.num_params, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        expected = simulate(c, theta).abs().sum().item()  # OpenMP threads started here
        ctx = mp.get_context("fork")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_child_run, args=(child,))
        proc.start()
        assert parent.poll(120), "forked child hung"
        got = parent.recv()
        proc.join(30)
    finally:
        torch.set_num_threads(old)
    assert abs(got - expected) < 1e-9


def _child_gate_matrices(conn):
    from qdiff.circuits.gates import GATES
    t = torch.linspace(0, 1, 256, dtype=torch.float64)
    m = GATES["orbital_rotation"].matrix_fn(t)  # 256 x 16 x 16 x 16 products: a parallel op
    dev = (m @ m.conj().transpose(-1, -2) - torch.eye(16, dtype=m.dtype)).abs().max()
    conn.send((torch.get_num_threads(), float(dev)))
    conn.close()


def test_forked_child_runs_torch_on_one_thread():
    """A child forked after the kernels ran on two threads runs torch's own large operations
    (here a batch of 4-wire gate matrices) on one thread instead of hanging."""
    import multiprocessing as mp
    c = _circuit(6, 6, 40)
    theta = torch.rand(5, c.num_params, dtype=torch.float64)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        simulate(c, theta)
        x = torch.rand(512, 512)
        (x @ x).sum()  # torch's own thread pool started too
        ctx = mp.get_context("fork")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_child_gate_matrices, args=(child,))
        proc.start()
        assert parent.poll(120), "forked child hung"
        threads, unitarity = parent.recv()
        proc.join(30)
    finally:
        torch.set_num_threads(old)
    assert threads == 1 and unitarity < 1e-12


def test_adjoint_residual_carries_the_forward_gate_data():
    """What the adjoint backward reuses from its forward (gate data, the encoded program)
    travels in the residual the forward returned, not in module state: a vjp over that residual
    equals one over a fresh forward, for native and torch kernels."""
    from qdiff.backends.base import Job
    base = _circuit(3, 4, 20)
    p = base.num_params
    u3 = Operation(GATES["u3"], (0,), (ParamRef(p), ParamRef(p + 1), ParamRef(p + 2)))
    c = Circuit(4, (u3,) + base.operations, (qd.expval(qd.Z(0)), qd.probs([1, 2])), p + 3)
    theta = torch.rand(2, c.num_params, dtype=torch.float64)
    g = torch.rand(2, 5, dtype=torch.float64)
    dev = qd.device("statevector", wires=4)
    for ctx in (contextlib.nullcontext(), native.disabled()):
        with ctx, torch.no_grad():
            [res] = dev.execute([Job(c, theta, flat=True, keep=True)])
            assert res.residual.trace.data is not None  # POOL has gates with no native code
            kept = dev.vjp([Job(c, theta)], [g], [res.residual])[0]
            fresh = dev.vjp([Job(c, theta)], [g], [None])[0]
        assert torch.allclose(kept, fresh, atol=1e-12)
        ref = torch.autograd.functional.vjp(
            lambda t: dev.run(c, t)[0].unsqueeze(-1).mul(g[:, :1]).sum()
            + (dev.run(c, t)[1] * g[:, 1:]).sum(), theta)[1]
        assert torch.allclose(kept, ref, atol=1e-10)


from hypothesis import given, settings, strategies as st  # noqa: E402


@st.composite
def _programs(draw):
    n = draw(st.integers(1, 9))
    batch = draw(st.sampled_from([1, 2, 5]))
    gates = [g for g in POOL if g.num_wires <= n]
    ops, p = [], 0
    for _ in range(draw(st.integers(1, 25))):
        g = draw(st.sampled_from(gates))
        wires = tuple(draw(st.permutations(range(n)))[:g.num_wires])
        params = tuple(ParamRef(p + i) for i in range(g.num_params))
        p += g.num_params
        ops.append(Operation(g, wires, params))
    seed = draw(st.integers(0, 2 ** 31 - 1))
    return Circuit(n, tuple(ops), num_params=p), batch, seed


@settings(max_examples=80, deadline=None)
@given(_programs())
def test_property_native_forward_and_adjoint_match_torch(prog):
    c, batch, seed = prog
    g = torch.Generator().manual_seed(seed)
    theta = (torch.rand(batch, c.num_params, dtype=torch.float64, generator=g) - 0.5) * 8
    ref = _torch_state(c, theta)
    with torch.no_grad():
        assert torch.allclose(simulate(c, theta), ref, atol=1e-11)
    if c.num_params == 0:
        return
    c = Circuit(c.num_wires, c.operations, num_params=c.num_params,
                measurements=(qd.expval(qd.Z(0) + 0.3 * qd.X(c.num_wires - 1)),))
    cot = torch.randn(batch, 1, dtype=torch.float64, generator=g)
    trainable = [True] * c.num_params
    ours = adjoint_vjp(c, theta, ref.clone(), cot, trainable)
    with native.disabled():
        want = adjoint_vjp(c, theta, ref.clone(), cot, trainable)
    assert torch.allclose(ours, want, atol=1e-10)


def test_angles_shared_by_the_batch_are_evaluated_once():
    from qdiff.backends.statevector.gate_data import circuit_angles
    ops = (Operation(GATES["rx"], (0,), (ParamRef(0),)), Operation(GATES["rot"], (1,), (
        ParamRef(1), ParamRef(2), 0.3)))
    theta = torch.tensor([[0.1, 0.5, 0.7], [0.2, 0.5, 0.7], [0.3, 0.5, 0.7]], dtype=torch.float64)
    with torch.no_grad():
        a = circuit_angles(ops, theta, torch.float64)
    assert [t.shape[0] for t in a[0] + a[1]] == [3, 1, 1, 1]
    t = theta.clone().requires_grad_(True)
    a = circuit_angles(ops, t, torch.float64)  # autograd: every column keeps its B rows
    assert [x.shape[0] for x in a[0] + a[1]] == [3, 3, 3, 3]


@pytest.mark.parametrize("method", ["adjoint", "backprop", "parameter-shift"])
def test_equal_input_rows_keep_their_own_gradients(method):
    """Rows that are equal by coincidence are evaluated once in the no-grad paths; each row
    must still get its own gradient (checked against one-row-at-a-time calls)."""
    n = 3
    dev = qd.device("statevector", wires=n)

    @qd.qnode(dev, diff_method=method)
    def f(x, w):
        qd.AngleEmbedding(x, wires=range(n))
        qd.StronglyEntanglingLayers(w, wires=range(n))
        return qd.expval(qd.Z(0) @ qd.Z(2))
    row = torch.tensor([0.3, -0.8, 1.1], dtype=torch.float64)
    x = row.repeat(4, 1).requires_grad_(True)
    w = torch.rand(2, n, 3, dtype=torch.float64, requires_grad=True)
    scale = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    gx, gw = torch.autograd.grad((f(x, w) * scale).sum(), [x, w])
    one = row.clone().requires_grad_(True)
    g1x, g1w = torch.autograd.grad(f(one, w), [one, w])
    assert torch.allclose(gx, scale[:, None] * g1x, atol=1e-10)
    assert torch.allclose(gw, scale.sum() * g1w, atol=1e-10)


def test_effective_state_z_words_in_one_matmul_match_term_by_term():
    from qdiff.backends.statevector.adjoint import effective_state
    from qdiff.backends.statevector import measure
    n = 4
    ms = (qd.expval(qd.Z(0)), qd.probs(wires=[1]), qd.expval(qd.Hamiltonian([0.7], [qd.Z(1) @ qd.Z(3)])),
          qd.var(qd.X(2)), qd.expval(qd.Z(2)))
    c = Circuit(n, (), num_params=0, measurements=ms)
    g = torch.Generator().manual_seed(4)
    psi = torch.randn(3, 2 ** n, dtype=torch.complex128, generator=g)
    cot = torch.randn(3, 6, dtype=torch.float64, generator=g)
    lam = effective_state(psi, c, cot, n)
    ref = cot[:, 0, None] * measure.apply_observable(psi, ms[0].obs, n)
    ref = ref + cot[:, 3, None] * measure.apply_observable(psi, ms[2].obs, n)
    ref = ref + cot[:, 5, None] * measure.apply_observable(psi, ms[4].obs, n)
    from qdiff.backends.statevector import kernels
    ref = ref + kernels.apply_diagonal(psi, cot[:, 1:3].to(psi.dtype), [1], n)
    phi = measure.apply_observable(psi, ms[3].obs, n)
    mean = (psi.conj() * phi).sum(-1).real
    ref = ref + cot[:, 4, None] * (measure.apply_observable(phi, ms[3].obs, n) - 2 * mean[:, None] * phi)
    assert torch.allclose(lam, ref, atol=1e-12)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no cc")
def test_build_falls_back_when_the_compiler_lacks_openmp(tmp_path):
    """A compiler that rejects -fopenmp (e.g. Apple clang) still gets a serial build."""
    wrapper = tmp_path / "cc-no-openmp"
    wrapper.write_text('#!/bin/sh\nfor a in "$@"; do [ "$a" = "-fopenmp" ] && exit 1; done\n'
                       f'exec {shutil.which("cc")} "$@"\n')
    wrapper.chmod(0o755)
    code = ("import qdiff.backends.statevector.native as n, sys; "
            "sys.exit(0 if n.library() is not None else 1)")
    env = dict(os.environ, QDIFF_CACHE_DIR=str(tmp_path / "cache"), CC=str(wrapper))
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=300).returncode == 0
    assert len(list((tmp_path / "cache" / "native").glob("qdsim-*.so"))) == 1


def test_effective_state_z_words_by_halves_on_large_registers(monkeypatch):
    """Above the sign-matrix budget the Z-word diagonal is D_hi + D_lo broadcast; words that
    span both halves take the general path."""
    from qdiff.backends.statevector.adjoint import effective_state
    from qdiff.backends.statevector import measure, zwords
    monkeypatch.setattr(zwords, "SIGN_BUDGET", 16)
    n = 5
    ms = (qd.expval(qd.Z(0)), qd.expval(qd.Z(4)), qd.expval(qd.Z(1) @ qd.Z(3)),
          qd.expval(qd.Hamiltonian([-0.4], [qd.Z(3) @ qd.Z(4)])), qd.expval(qd.Z(0) @ qd.Z(1)))
    c = Circuit(n, (), num_params=0, measurements=ms)
    g = torch.Generator().manual_seed(5)
    psi = torch.randn(2, 2 ** n, dtype=torch.complex128, generator=g)
    cot = torch.randn(2, len(ms), dtype=torch.float64, generator=g)
    ref = sum(cot[:, k, None] * measure.apply_observable(psi, m.obs, n) for k, m in enumerate(ms))
    assert torch.allclose(effective_state(psi, c, cot, n), ref, atol=1e-12)


def test_adjoint_sweep_two_threads_match_one_on_a_large_state():
    c = _circuit(21, 15, 25)
    c = Circuit(15, c.operations, num_params=c.num_params,
                measurements=(qd.expval(qd.Z(0) @ qd.X(14)),))
    theta = torch.rand(1, c.num_params, dtype=torch.float64)
    state = _torch_state(c, theta)
    cot = torch.ones(1, 1, dtype=torch.float64)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = adjoint_vjp(c, theta, state.clone(), cot, [True] * c.num_params)
        torch.set_num_threads(2)
        two = adjoint_vjp(c, theta, state.clone(), cot, [True] * c.num_params)
    finally:
        torch.set_num_threads(old)
    assert torch.allclose(one, two, atol=1e-11)


def test_best_adjoint_gives_exact_hessians_by_shift_rules():
    """diff_method="best" runs the native adjoint; create_graph switches its backward to the
    parameter-shift rules, so second derivatives are exact (as with backprop), not an error."""
    dev = qd.device("statevector", wires=3)

    def body(x, w):
        qd.AngleEmbedding(x, wires=range(3))
        qd.StronglyEntanglingLayers(w, wires=range(3))
        qd.CRY(w[0, 0, 1], wires=[2, 0])
        return [qd.expval(qd.Z(i)) for i in range(3)]
    x = torch.rand(4, 3, dtype=torch.float64)
    w0 = torch.rand(1, 3, 3, dtype=torch.float64)
    best, back = qd.QNode(body, dev), qd.QNode(body, dev, diff_method="backprop")
    h_best = torch.autograd.functional.hessian(lambda w: best(x, w).sum(), w0)
    h_back = torch.autograd.functional.hessian(lambda w: back(x, w).sum(), w0)
    torch.testing.assert_close(h_best, h_back, atol=1e-10, rtol=0)
    assert h_back.abs().max() > 1e-3


@pytest.mark.parametrize("static", [False, True])
def test_rot_of_huge_angles_keeps_the_smaller_angle(static):
    """Rot(phi, theta, omega)'s phases are products of the half angles' phases in the native
    kernels (plain and record-once), as in the torch matrices: with |phi| = 1e17 the sum
    phi + omega would drop omega = 1 entirely."""
    n = 8
    dev = qd.device("statevector", wires=n)

    def body(w):
        for i in range(n):
            qd.Hadamard(i)
        for i in range(n):
            qd.Rot(w[0], w[1], w[2], wires=i)
        for i in range(n - 1):
            qd.CNOT([i, i + 1])
        return qd.expval(qd.X(0)), qd.expval(qd.Y(3))
    f = qd.qnode(dev, static=static)(body)
    w = torch.tensor([1e17, 0.4, 1.0], dtype=torch.float64)
    with native.disabled():
        want = [float(v) for v in qd.qnode(dev)(body)(w)]
    for _ in range(2):  # the static qnode's second call replays
        np.testing.assert_allclose([float(v) for v in f(w)], want, atol=1e-12)
