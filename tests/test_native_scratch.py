"""Scratch the native kernels keep between calls (tile buffers, the adjoint sweep's copies of
psi and lam): calls of other sizes, precisions and thread counts in between, and calls from two
Python threads at once, give the very bits a call on fresh buffers gives, and the gradients
match the torch kernels'. ``qdiff.clear_caches()`` frees what is kept. The one-pass
half-register marginals that Z words are read off, and the adjoint sweep's lam formed from the
two halves' diagonals: against torch, any thread count."""
from __future__ import annotations

import threading

import pytest
import torch

import qdiff as qd
from qdiff.backends.statevector import native, native_lib
from conftest import torch_threads

pytestmark = pytest.mark.skipif(native.library() is None,
                                reason="no C compiler: the native kernels are not built")


def _grad_fn(n, cdtype, obs="z"):
    dev = qd.device("statevector", wires=n, dtype=cdtype)

    @qd.qnode(dev, diff_method="adjoint")
    def f(w):
        qd.StronglyEntanglingLayers(w, wires=range(n))
        if obs == "z":  # a sum of Z words: lam = diag * psi, formed in the kept scratch
            return [qd.expval(qd.Z(i)) for i in range(n)]
        return [qd.expval(qd.X(0) @ qd.Y(n - 1)), qd.expval(qd.Z(1))]

    def grad(w):
        w = w.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(f(w).sum(), w)
        return g
    return grad


def _weights(n, seed, layers=2):
    return torch.rand(layers, n, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


CASES = [(16, torch.complex128, 1, "z"), (17, torch.complex64, 2, "z"),
         (16, torch.complex64, 1, "xy"), (18, torch.complex128, 2, "z"),
         (16, torch.complex128, 2, "xy"), (17, torch.complex64, 1, "z")]


def test_kept_scratch_gives_the_bits_of_fresh_scratch():
    fresh = {}
    for n, cdtype, t, obs in CASES:
        qd.clear_caches()
        assert native_lib.scratch_held() == 0
        with torch_threads(t):
            fresh[(n, cdtype, t, obs)] = _grad_fn(n, cdtype, obs)(_weights(n, n))
    qd.clear_caches()
    # the same calls in another order and twice over, each on what the previous ones kept
    for case in CASES[::-1] + CASES:
        n, cdtype, t, obs = case
        with torch_threads(t):
            g = _grad_fn(n, cdtype, obs)(_weights(n, n))
        assert torch.equal(g, fresh[case]), case
        assert 0 < native_lib.scratch_held() <= 64 << 20
    qd.clear_caches()
    assert native_lib.scratch_held() == 0


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
def test_kept_scratch_gradients_match_torch(cdtype):
    n = 16
    w = _weights(n, 3, layers=1)
    with torch_threads(2):
        ours = [_grad_fn(n, cdtype, obs)(w) for obs in ("z", "xy", "z")]
    with native.disabled():
        ref = [_grad_fn(n, cdtype, obs)(w) for obs in ("z", "xy")]
    atol = 1e-10 if cdtype == torch.complex128 else 2e-4
    for a, b in zip(ours, ref + ref[:1]):
        torch.testing.assert_close(a, b, atol=atol, rtol=0)


def test_calls_from_two_python_threads_at_once():
    """Two sweeps running at once never share a kept block: each gets the bits it gets
    alone."""
    cases = [(16, torch.complex128), (17, torch.complex64)]
    fns = {c: _grad_fn(c[0], c[1]) for c in cases}
    with torch_threads(1):
        alone = {c: fns[c](_weights(c[0], 7)) for c in cases}
        errors = []

        def work(c):
            try:
                for _ in range(4):
                    if not torch.equal(fns[c](_weights(c[0], 7)), alone[c]):
                        errors.append(c)
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)
        threads = [threading.Thread(target=work, args=(c,)) for c in cases]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert not errors
    assert native_lib.scratch_held() <= 64 << 20


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("n,batch", [(12, 1), (13, 3), (15, 1), (16, 2), (17, 1)])
def test_half_marginals_match_torch_and_any_thread_count(n, batch, cdtype):
    """One native pass gives the two half-register marginals of ``|psi|^2`` (sums in double
    precision), the same bits with one and two threads, whether the bindings or one binding's
    rows are split."""
    from qdiff.backends.statevector import zwords
    g = torch.Generator().manual_seed(n + batch)
    s = torch.randn(batch, 2 ** n, dtype=cdtype, generator=g)
    out = []
    for t in (1, 2):
        with torch_threads(t):
            out.append(native.half_marginals(s, n, n - n // 2))
    for a, b in zip(*out):
        assert torch.equal(a, b)
    p = (s.to(torch.complex128).abs() ** 2)
    ref = zwords.marginals(p, n)
    tol = 1e-12 if cdtype == torch.complex128 else 1e-6
    for a, r in zip(out[0], ref):
        assert a.dtype == s.real.dtype and a.shape == r.shape
        torch.testing.assert_close(a.double(), r, rtol=tol, atol=0)
    # the expvals read off them match the torch path's
    dev = qd.device("statevector", wires=n, dtype=cdtype)

    @qd.qnode(dev)
    def f(w):
        qd.StronglyEntanglingLayers(w, wires=range(n))
        return [qd.expval(qd.Z(i)) for i in range(n)] + [qd.expval(qd.Z(0) @ qd.Z(1))]
    w = _weights(n, 1, layers=1)
    ours = f(w)
    with native.disabled():
        ref = f(w)
    torch.testing.assert_close(ours, ref, atol=1e-10 if cdtype == torch.complex128 else 1e-5,
                               rtol=0)


def test_half_marginals_fall_back_under_autograd():
    s = torch.randn(1, 2 ** 12, dtype=torch.complex128, requires_grad=True)
    assert native.half_marginals(s, 12, 6) is None


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("n", [12, 13, 16, 17])
def test_sweep_from_diagonal_halves_gives_the_bits_of_the_whole_diagonal(n, cdtype):
    """Z words within either half of a large register: the sweep forms lam from the two
    halves' diagonals (no 2^n diagonal), the same bits as from their broadcast sum, at one and
    two threads (and the same bits at either); the gradients match the torch path's."""
    from qdiff.backends.statevector import zwords
    from qdiff.backends.statevector.adjoint import adjoint_vjp
    from qdiff.backends.statevector.simulate import simulate
    from qdiff.circuits import Circuit, Operation, ParamRef, get_gate
    ops, p = [], 0
    for layer in range(2):
        for w in range(n):
            ops.append(Operation(get_gate("rot"), (w,), tuple(ParamRef(p + i) for i in range(3))))
            p += 3
        for w in range(n):
            ops.append(Operation(get_gate("cnot"), (w, (w + 1 + layer) % n), ()))
    ms = tuple(qd.expval(qd.Z(i)) for i in range(n)) + (qd.expval(qd.Z(0) @ qd.Z(2)),
                                                        qd.expval(qd.Z(n - 1) @ qd.Z(n - 2)))
    c = Circuit(n, tuple(ops), num_params=p).with_measurements(ms)
    g = torch.Generator().manual_seed(n)
    theta = torch.rand(1, p, dtype=torch.float64, generator=g) * 6 - 3
    cot = torch.randn(1, len(ms), dtype=torch.float64, generator=g)
    with torch.no_grad():
        state = simulate(c, theta, cdtype=cdtype)
    parts, done = zwords.z_word_diagonal_parts(state, c, cot, n)
    assert isinstance(parts, tuple) and len(done) == len(ms)
    full, _ = zwords.z_word_diagonal(state, c, cot, n)
    plan = native.coded_plan(c.operations, n)
    train = [True] * p
    for t in (1, 2):
        with torch_threads(t):
            a = native.plan_adjoint(plan, state, None, theta, train, lam_diagonal=parts)
            b = native.plan_adjoint(plan, state, None, theta, train, lam_diagonal=full)
        assert torch.equal(a, b), t
        if t == 1:
            one = a
        else:  # tiled: overlaps summed per chunk of tiles, in order; below: one thread
            assert torch.equal(a, one)
    with torch.no_grad(), native.disabled():
        ref = adjoint_vjp(c, theta, state.clone(), cot, train)
    tol = 1e-10 if cdtype == torch.complex128 else 1e-4
    torch.testing.assert_close(one.double(), ref.double(), atol=tol, rtol=0)
    with pytest.raises(ValueError, match="halves"):
        native.plan_adjoint(plan, state, None, theta, train, lam_diagonal=(parts[0][:, :-1],
                                                                           parts[1]))


@pytest.mark.parametrize("bits,low", [(-1, True), (13, True), (3, False)])
def test_invalid_diagonal_halves_are_refused_before_the_sweep(bits, low):
    """``ldiag_bits`` outside ``[0, n]``, or halves without the low part: an argument error
    (a ``QdiffError``) and the state untouched."""
    import ctypes
    from qdiff.backends.statevector import native_abi
    from qdiff.circuits import Circuit, Operation, ParamRef, get_gate
    from qdiff.circuits.errors import QdiffError
    n = 12
    ops = tuple(Operation(get_gate("rx"), (w,), (ParamRef(w),)) for w in range(n))
    plan = native.coded_plan(ops, n)
    recs, _ = plan.adjoint_records([True] * n)
    theta = torch.rand(1, n, dtype=torch.float64)
    psi = torch.randn(1, 2 ** n, dtype=torch.complex128)
    before = psi.clone()
    hi = torch.rand(1, 2 ** (n - 6), dtype=torch.float64)
    lo = torch.rand(1, 2 ** 6, dtype=torch.float64)
    grad = torch.zeros(1, n, dtype=torch.float64)
    args = native_abi.AdjointArgs(
        dtype=native_abi.C128, n=n, batch=1, psi=native_abi.ptr(psi), lam=None,
        prog=native_abi.program_arg(recs, plan.data_for(psi.dtype)),
        angles=native_abi.angles_arg(theta), gtheta=native_abi.ptr(grad), nthreads=1,
        bad_record=-1, ldiag=native_abi.ptr(hi), ldiag_lo=native_abi.ptr(lo) if low else None,
        ldiag_bits=bits)
    rc = native.library().qd_adjoint_coded(ctypes.byref(args))
    assert rc != 0
    with pytest.raises(QdiffError):
        native_abi.check(native.library(), rc, args, "adjoint sweep")
    assert torch.equal(psi, before) and not grad.any()


def test_kept_blocks_survive_calls_racing_for_the_table():
    """Many short calls from four Python threads at once (each takes and hands back kept
    blocks; the table's lock is only tried, so some find it taken): every block a call held
    is handed back, none is left marked in use, and the results are those of one thread."""
    dev = qd.device("statevector", wires=4)

    @qd.qnode(dev, static=True)
    def f(x, w):
        qd.AngleEmbedding(x, wires=range(4))
        qd.StronglyEntanglingLayers(w, wires=range(4))
        return [qd.expval(qd.Z(i)) for i in range(4)]
    gen = torch.Generator().manual_seed(5)
    x = torch.rand(32, 4, dtype=torch.float64, generator=gen)
    w = torch.rand(2, 4, 3, dtype=torch.float64, generator=gen)

    def step():
        wr = w.clone().requires_grad_(True)
        out = f(x, wr)
        (g,) = torch.autograd.grad(out.sum(), wr)
        return out.detach(), g
    with torch_threads(1):
        want = step()
        errors = []

        def work():
            try:
                for _ in range(400):
                    got = step()
                    if not (torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])):
                        errors.append("differs")
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)
        threads = [threading.Thread(target=work) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert not errors
    qd.clear_caches()
    assert native_lib.scratch_held() == 0
