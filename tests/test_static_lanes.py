"""The lane-layout kernels of a record-once qnode (``qdsim_batch.h``: the batch cut into chunks of
lanes, angles read from the argument tensors, product prefix written directly and its gradients
in closed form, outputs and gradient scatter in the kernels): outputs and gradients against the
plain qnode (the engine's ordinary native and torch paths) and finite differences, on the
hybrid model, on random circuits with every kind of gate record (coded one-, two- and four-qubit
gates, controlled coded gates, diagonals, flips with controls, swaps, constant matrices), per
binding gates after shared ones, every chunk width and edge sizes (n = 1, 2; B = 1; batches
that leave padding lanes), the dense form of large batches with real and complex embedding
factors, complex64, and refusal of non-finite angles."""
from __future__ import annotations

import random

import pytest
import torch

import qdiff as qd
from qdiff.backends.statevector import prepared as prep_mod
from qdiff.backends.statevector.prepared import LaneBound

pytestmark = pytest.mark.skipif(not qd.native_status().available,
                                reason="native kernels not built")


def _hybrid_circuit(n, static, dtype=torch.complex128):
    dev = qd.device("statevector", wires=n, dtype=dtype)

    @qd.qnode(dev, static=static)
    def circuit(inputs, weights):
        qd.AngleEmbedding(inputs, wires=range(n))
        qd.StronglyEntanglingLayers(weights, wires=range(n))
        return [qd.expval(qd.Z(i)) for i in range(n)]
    return circuit


def _flat(out):
    return out if isinstance(out, torch.Tensor) else torch.stack(list(out), -1)


def _bound(static):
    (trace,) = static._traces.values()
    return trace.bound


def _compare(plain, static, args, atol=1e-10):
    outs = []
    for f in (plain, static):
        for _ in range(2):  # the second call of the static qnode replays
            a = [t.detach().clone().requires_grad_(t.requires_grad) for t in args]
            out = _flat(f(*a))
        cot = torch.linspace(-1.3, 0.9, out.numel(), dtype=out.dtype).reshape(out.shape)
        wrt = [t for t in a if t.requires_grad]
        got = torch.autograd.grad(out, wrt, cot, allow_unused=True)
        outs.append((out.detach(), [torch.zeros_like(t) if g is None else g
                                    for g, t in zip(got, wrt)]))
    (o1, g1), (o2, g2) = outs
    torch.testing.assert_close(o2, o1, atol=atol, rtol=atol)
    for x, y in zip(g2, g1):
        torch.testing.assert_close(x, y, atol=10 * atol, rtol=10 * atol)


@pytest.mark.parametrize("n", [1, 2, 4, 8])
@pytest.mark.parametrize("batch", [0, 1, 7, 9, 70])
@pytest.mark.parametrize("input_grad", [True, False])
def test_hybrid_layer_matches_plain_qnode(n, batch, input_grad):
    g = torch.Generator().manual_seed(n * 100 + batch)
    shape = (batch, n) if batch else (n,)
    x = (torch.rand(shape, generator=g, dtype=torch.float64) * 6 - 3).requires_grad_(input_grad)
    w = (torch.rand(3, n, 3, generator=g, dtype=torch.float64) * 6).requires_grad_()
    plain, static = _hybrid_circuit(n, False), _hybrid_circuit(n, True)
    _compare(plain, static, [x, w])
    assert isinstance(_bound(static), LaneBound)


@pytest.mark.parametrize("lanes", [8, 16, 64])
def test_every_chunk_width(monkeypatch, lanes):
    monkeypatch.setattr(prep_mod, "lanes_for", lambda n, b: lanes)
    n, b = 3, 37
    g = torch.Generator().manual_seed(lanes)
    x = torch.rand(b, n, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.rand(3, n, 3, generator=g, dtype=torch.float64, requires_grad=True)
    static = _hybrid_circuit(n, True)
    _compare(_hybrid_circuit(n, False), static, [x, w])
    assert _bound(static).lanes == lanes


ONE = ["rx", "ry", "rz", "phaseshift"]
TWO = ["crx", "cry", "crz", "isingxx", "isingyy", "isingzz", "cphase"]
FIXED = [("h", 1), ("s", 1), ("t", 1), ("x", 1), ("sx", 1), ("cnot", 2), ("cz", 2),
         ("swap", 2), ("toffoli", 3), ("cswap", 3)]


def _emit(name, wires, params=()):
    from qdiff.circuits import recording
    recording.record_operation(qd.get_gate(name), tuple(wires), tuple(params))


def _angle(x, w, src):
    """An op's angle: an input column, a weight (scaled and shifted) or a constant."""
    which, i, a, c = src
    if which == "c":
        return c
    v = x[..., i] if which == "x" else w[i]
    return v if (a, c) == (1.0, 0.0) else a * v + c


def _ops_body(ops, n):
    """The qnode body of ``ops`` ((name, wires, angle source or None)), Z on every wire and a
    scaled ZZ word."""
    def body(x, w):
        for name, wires, src in ops:
            if src is None:
                _emit(name, wires)
            elif name == "multirz":
                qd.MultiRZ(_angle(x, w, src), wires=list(wires))
            elif name == "rot":
                _emit(name, wires, (_angle(x, w, src), w[(src[1] + 1) % 6], 0.25))
            else:
                _emit(name, wires, (_angle(x, w, src),))
        out = [qd.expval(qd.Z(k)) for k in range(n)]
        if n >= 2:
            out.append(qd.expval(0.5 * (qd.Z(0) @ qd.Z(n - 1))))
        return out
    return body


def _random_body(n, seed, prefix=True):
    """A product prefix (per-binding, shared and constant angles, a flip), then random gates of
    every record kind whose angles are inputs (per binding), weights (shared), scaled/shifted
    weights and constants, and Z words with coefficients as outputs."""
    rng = random.Random(seed)
    ops = []
    if prefix:
        for q in range(n):
            ops.append(("ry", (q,), ("x", q % 3, 1.0, 0.0)))
            ops.append((rng.choice(["rz", "rx", "rot"]), (q,), ("w", rng.randrange(6), 1.0, 0.0)))
        ops.append(("x", (0,), None))
    for _ in range(rng.randint(10, 18)):
        kind = rng.random()
        src = rng.choice([("x", rng.randrange(3), 1.0, 0.0), ("w", rng.randrange(6), 1.0, 0.0),
                          ("w", rng.randrange(6), -1.7, 0.3), ("c", 0, 0.0, 0.45)])
        if kind < 0.35:
            ops.append((rng.choice(ONE + ["rot"]), (rng.randrange(n),), src))
        elif kind < 0.6 and n >= 2:
            ops.append((rng.choice(TWO), tuple(rng.sample(range(n), 2)), src))
        elif kind < 0.65 and n >= 4:
            ops.append(("doubleexcitation", tuple(rng.sample(range(n), 4)), src))
        elif kind < 0.7 and n >= 3:
            ops.append(("multirz", tuple(rng.sample(range(n), 3)), src))
        else:
            name, k = rng.choice([f for f in FIXED if f[1] <= n])
            ops.append((name, tuple(rng.sample(range(n), k)), None))
    return _ops_body(ops, n)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_random_circuits_with_every_record_kind(seed, n):
    dev = qd.device("statevector", wires=n)
    body = _random_body(n, seed, prefix=seed % 4 != 3)
    plain, static = qd.qnode(dev)(body), qd.qnode(dev, static=True)(body)
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(11, 3, generator=g, dtype=torch.float64) * 6 - 3).requires_grad_()
    w = (torch.rand(6, generator=g, dtype=torch.float64) * 6 - 3).requires_grad_()
    _compare(plain, static, [x, w])
    assert isinstance(_bound(static), LaneBound)


def test_finite_differences():
    n = 3
    dev = qd.device("statevector", wires=n)
    f = qd.qnode(dev, static=True)(_random_body(n, 5))
    g = torch.Generator().manual_seed(2)
    x = torch.rand(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.rand(6, generator=g, dtype=torch.float64, requires_grad=True)
    _flat(f(x, w))
    assert isinstance(_bound(f), LaneBound)
    assert torch.autograd.gradcheck(lambda a, b: _flat(f(a, b)), (x, w))


def test_complex64_states():
    n, b = 4, 19
    g = torch.Generator().manual_seed(4)
    x = torch.rand(b, n, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.rand(3, n, 3, generator=g, dtype=torch.float64, requires_grad=True)
    static = _hybrid_circuit(n, True, torch.complex64)
    _compare(_hybrid_circuit(n, False), static, [x, w], atol=2e-5)
    assert _bound(static).prep.cdtype == torch.complex64


def test_repeated_backward_and_no_grad():
    n = 3
    static, plain = _hybrid_circuit(n, True), _hybrid_circuit(n, False)
    x = torch.rand(5, n, dtype=torch.float64, requires_grad=True)
    w = torch.rand(3, n, 3, dtype=torch.float64, requires_grad=True)
    out = _flat(static(x, w))
    first = torch.autograd.grad(out.sum(), [x, w], retain_graph=True)
    second = torch.autograd.grad(out.sum(), [x, w])  # the residual was consumed: rerun
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b)
    with torch.no_grad():
        torch.testing.assert_close(_flat(static(x, w)), _flat(plain(x, w)))



def test_backward_of_one_graph_in_two_threads_at_once():
    """torch runs one node's backward in two threads at once when both differentiate a
    shared graph (retain_graph): one takes the run's residual, the other reruns; neither
    shares the other's slot (a stress check: the switch interval is made tiny)."""
    import sys
    import threading
    n = 3
    static = _hybrid_circuit(n, True)
    x = torch.rand(6, n, dtype=torch.float64)
    w = torch.rand(3, n, 3, dtype=torch.float64, requires_grad=True)
    (want,) = torch.autograd.grad(_flat(static(x, w)).sum(), w)
    saved = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(20):
            y = _flat(static(x, w)).sum()
            got = [None, None]

            def back(i):
                got[i] = torch.autograd.grad(y, w, retain_graph=True)[0]
            threads = [threading.Thread(target=back, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for g in got:
                torch.testing.assert_close(g, want)
            spare = _bound(static)._spare
            assert len({id(s) for s in spare}) == len(spare)
    finally:
        sys.setswitchinterval(saved)

def test_second_derivatives_take_the_differentiable_path():
    n = 2
    static, plain = _hybrid_circuit(n, True), _hybrid_circuit(n, False)
    x = torch.rand(3, n, dtype=torch.float64, requires_grad=True)
    w = torch.rand(3, n, 3, dtype=torch.float64, requires_grad=True)
    hs = []
    for f in (plain, static):
        f(x, w)
        (gw,) = torch.autograd.grad(_flat(f(x, w)).sum(), [w], create_graph=True)
        hs.append(torch.autograd.grad(gw.sum(), [x])[0])
    torch.testing.assert_close(hs[1], hs[0])


def test_non_finite_angle_is_refused():
    n = 2
    static = _hybrid_circuit(n, True)
    x = torch.rand(3, n, dtype=torch.float64, requires_grad=True)
    w = torch.rand(3, n, 3, dtype=torch.float64, requires_grad=True)
    static(x, w)
    bad = x.detach().clone()
    bad[1, 0] = float("nan")
    with pytest.raises(qd.QdiffError, match="NaN or infinite"):
        static(bad.requires_grad_(), w)


@pytest.mark.parametrize("lanes", [8, 16])
def test_kernels_check_the_gather_indices_they_read(monkeypatch, lanes):
    """The kernels refuse a gather index outside the sources: in any row of a per-binding
    column, and in the first row of a chunk for a batch-shared column (the rows of such a
    column that the kernels read); an intact index runs again afterwards."""
    monkeypatch.setattr(prep_mod, "lanes_for", lambda n, b: lanes)
    n, b = 2, 21
    static = _hybrid_circuit(n, True)
    x = torch.rand(b, n, dtype=torch.float64, requires_grad=True)
    w = torch.rand(3, n, 3, dtype=torch.float64, requires_grad=True)
    out = static(x, w)
    bound = _bound(static)
    args = [x.detach(), w.detach()]
    shared = bound.cshared.bool()
    per_col = int((~shared).nonzero()[0, 0])
    sh_col = int(shared.nonzero()[0, 0])
    total = x.numel() + w.numel()
    for row, col in [(b - 1, per_col), (3, per_col), (0, sh_col), (lanes, sh_col)]:
        keep = int(bound.idx[row, col])
        for bad in (total, -1):
            residual = bound.run(args, keep=True)[1]  # a good run, then its gradient
            bound.idx[row, col] = bad
            with pytest.raises(qd.QdiffError, match="native kernels rejected"):
                bound.grad(None, residual, torch.ones(b, n, dtype=torch.float64))
            with pytest.raises(qd.QdiffError, match="native kernels rejected"):
                bound.run(args, keep=False)
            bound.idx[row, col] = keep
    torch.testing.assert_close(static(x, w), out)


def test_chunks_split_over_threads():
    n, b = 3, 50
    g = torch.Generator().manual_seed(9)
    x = torch.rand(b, n, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.rand(3, n, 3, generator=g, dtype=torch.float64, requires_grad=True)
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _compare(_hybrid_circuit(n, False), _hybrid_circuit(n, True), [x, w])
    finally:
        torch.set_num_threads(saved)


def test_float32_arguments():
    n = 3
    g = torch.Generator().manual_seed(3)
    x = torch.rand(13, n, generator=g, dtype=torch.float32, requires_grad=True)
    w = torch.rand(3, n, 3, generator=g, dtype=torch.float32, requires_grad=True)
    static = _hybrid_circuit(n, True)
    _compare(_hybrid_circuit(n, False), static, [x, w], atol=1e-5)
    out = _flat(static(x, w))
    assert out.dtype == torch.float32 and isinstance(_bound(static), LaneBound)
    assert all(t.dtype == torch.float32 for t in torch.autograd.grad(out.sum(), [x, w]))


def _reference(n, x, w):
    """Outputs and input/weight gradients (cotangent: ones) of the plain qnode."""
    plain = _hybrid_circuit(n, False)
    a, b = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    out = _flat(plain(a, b))
    ga, gb = torch.autograd.grad(out.sum(), [a, b])
    return out.detach(), ga, gb


def test_calls_in_a_row_keep_earlier_outputs_and_gradients():
    """The residual buffer is reused once a gradient has consumed it and the kernel writes the
    gradients into new tensors: outputs and gradients handed out earlier stay intact while
    later calls (forward only, forward and backward, no grad) run with other inputs."""
    n, b = 4, 21
    static = _hybrid_circuit(n, True)
    g = torch.Generator().manual_seed(11)
    xs = [torch.rand(b, n, generator=g, dtype=torch.float64) * 4 - 2 for _ in range(4)]
    w = torch.rand(3, n, 3, generator=g, dtype=torch.float64)
    refs = [_reference(n, x, w) for x in xs]
    kept = []
    for x in xs[:2]:  # two forwards in flight before any backward: two residual buffers
        a, c = x.clone().requires_grad_(), w.clone().requires_grad_()
        kept.append((a, c, _flat(static(a, c))))
    bound = _bound(static)
    assert bound._spare == []
    grads = []
    for a, c, out in kept:
        grads.append(torch.autograd.grad(out.sum(), [a, c]))
    assert len(bound._spare) == 2  # both consumed: both buffers free again
    for x in xs[2:]:  # later calls reuse them
        a, c = x.clone().requires_grad_(), w.clone().requires_grad_()
        later = _flat(static(a, c))
        torch.autograd.grad(later.sum(), [a, c])
        with torch.no_grad():
            _flat(static(a, c))
    for (a, c, out), (ga, gc), (ro, rga, rgc) in zip(kept, grads, refs):
        torch.testing.assert_close(out.detach(), ro, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(ga, rga, atol=1e-11, rtol=1e-11)
        torch.testing.assert_close(gc, rgc, atol=1e-11, rtol=1e-11)
    # accumulation into .grad over steps: the kernel's gradients are written, never added
    a, c = xs[3].clone().requires_grad_(), w.clone().requires_grad_()
    for _ in range(3):
        _flat(static(a, c)).sum().backward()
    torch.testing.assert_close(a.grad, 3 * refs[3][1], atol=1e-11, rtol=1e-11)
    torch.testing.assert_close(c.grad, 3 * refs[3][2], atol=1e-11, rtol=1e-11)


def test_gradient_of_unused_argument_is_zero_not_garbage():
    """A wanted gradient that no angle feeds is written as zeros by the kernel (the gradient
    buffers are not initialised in Python)."""
    n = 2
    dev = qd.device("statevector", wires=n)

    @qd.qnode(dev, static=True)
    def f(x, w, unused):
        qd.RX(x[..., 0], wires=0)
        qd.RY(w[0], wires=1)
        qd.CNOT(wires=[0, 1])
        return [qd.expval(qd.Z(0)), qd.expval(qd.Z(1))]
    x = torch.rand(9, 1, dtype=torch.float64, requires_grad=True)
    w = torch.rand(1, dtype=torch.float64, requires_grad=True)
    for _ in range(3):  # with fresh and reused buffers
        u = torch.full((5,), float("nan"), dtype=torch.float64).requires_grad_()
        out = _flat(f(x, w, u))
        gu = torch.autograd.grad(out.sum(), [u], allow_unused=True)[0]
        assert gu is None or torch.equal(gu, torch.zeros(5, dtype=torch.float64))


@pytest.mark.parametrize("steps", [[(8, torch.float64), (8, torch.float32), (40, torch.float64),
                                    (8, torch.float64), (1, torch.float32)]])
def test_batch_size_and_dtype_changes_between_calls(steps):
    """Each signature has its own trace, bound job and buffers: alternating batch sizes and
    dtypes keeps every call exact."""
    n = 3
    static = _hybrid_circuit(n, True)
    g = torch.Generator().manual_seed(5)
    w64 = torch.rand(3, n, 3, generator=g, dtype=torch.float64)
    for b, dt in steps:
        x = torch.rand(b, n, generator=g, dtype=torch.float64) * 2
        ro, rgx, rgw = _reference(n, x, w64)
        a, c = x.to(dt).requires_grad_(), w64.to(dt).requires_grad_()
        out = _flat(static(a, c))
        ga, gc = torch.autograd.grad(out.sum(), [a, c])
        assert out.dtype == dt and ga.dtype == dt and gc.dtype == dt
        tol = 1e-12 if dt == torch.float64 else 2e-5
        torch.testing.assert_close(out.double(), ro, atol=tol, rtol=tol)
        torch.testing.assert_close(ga.double(), rgx, atol=10 * tol, rtol=10 * tol)
        torch.testing.assert_close(gc.double(), rgw, atol=10 * tol, rtol=10 * tol)
    assert static.num_traces == 4


@pytest.mark.parametrize("lanes", [8, 16, 32])
@pytest.mark.parametrize("batch", [5, 19, 40])
def test_gates_mixing_shared_and_per_binding_angles(monkeypatch, lanes, batch):
    """A batch-shared angle column is held in the first row only (the kernels read it from
    there): gates whose angles mix per-binding (scaled and shifted) and shared columns, in the
    product prefix and after shared gates, with padding lanes, match the plain qnode."""
    monkeypatch.setattr(prep_mod, "lanes_for", lambda n, b: lanes)
    n = 3
    dev = qd.device("statevector", wires=n)

    def body(x, w):
        qd.Rot(x[..., 0], w[0], 0.5 * x[..., 1] - 0.2, wires=0)  # prefix, mixed
        qd.RY(-1.3 * w[1] + 0.4, wires=1)                       # prefix, shared
        qd.RX(x[..., 2], wires=2)                               # prefix, per binding
        qd.CNOT(wires=[0, 1])
        qd.Rot(w[2], w[3], w[4], wires=1)                       # shared after the prefix
        qd.Rot(w[5], 2.0 * x[..., 0], w[0], wires=2)            # mixed after shared gates
        qd.CRY(w[1], wires=[2, 0])
        qd.CRZ(x[..., 1] * 0.7 + 0.1, wires=[1, 2])
        qd.IsingXX(w[3], wires=[0, 2])
        return [qd.expval(qd.Z(0)), qd.expval(qd.Z(1) @ qd.Z(2)), qd.expval(qd.Z(2))]

    plain, static = qd.qnode(dev)(body), qd.qnode(dev, static=True)(body)
    g = torch.Generator().manual_seed(batch * 10 + lanes)
    x = (torch.rand(batch, 3, generator=g, dtype=torch.float64) * 8 - 4).requires_grad_()
    w = (torch.rand(6, generator=g, dtype=torch.float64) * 20 - 10).requires_grad_()
    _compare(plain, static, [x, w])
    assert _bound(static).lanes == lanes


def test_shared_rot_gradients_against_finite_differences():
    """Rot gates with batch-shared angles (their matrices and the three derivatives from one
    set of half-angle sines and cosines) at large angles: central differences of the outputs."""
    n, b = 2, 9
    dev = qd.device("statevector", wires=n)

    @qd.qnode(dev, static=True)
    def f(x, w):
        qd.AngleEmbedding(x, wires=range(n))
        qd.Rot(w[0], w[1], w[2], wires=0)
        qd.CNOT(wires=[0, 1])
        qd.Rot(w[3], w[4], w[5], wires=1)
        qd.Rot(w[2], w[0], w[4], wires=0)
        return [qd.expval(qd.Z(0)), qd.expval(qd.Z(1))]
    g = torch.Generator().manual_seed(3)
    x = torch.rand(b, n, generator=g, dtype=torch.float64) * 4 - 2
    w = (torch.tensor([37.1, -12.6, 0.3, 101.7, -5.5, 2.9], dtype=torch.float64)
         ).requires_grad_()
    cot = torch.linspace(-1.0, 1.5, b * n, dtype=torch.float64).reshape(b, n)
    (gw,) = torch.autograd.grad((_flat(f(x, w)) * cot).sum(), [w])
    h = 1e-6
    for j in range(6):
        e = torch.zeros(6, dtype=torch.float64)
        e[j] = h
        with torch.no_grad():
            fd = ((_flat(f(x, w + e)) - _flat(f(x, w - e))) * cot).sum() / (2 * h)
        assert abs(float(gw[j]) - float(fd)) < 1e-7 * (1 + abs(float(fd)))


def _shared_body(n, seed):
    """A product prefix of per-binding and shared angles, then random gates of every record
    kind whose angles are all batch-shared (weights, scaled weights, constants): the dense form
    of the adjoint sweep (one sweep over the register's basis, rho = sum_b psi_b lam_b^dag)."""
    rng = random.Random(seed)
    ops = []
    for q in range(n):
        ops.append(("rx", (q,), ("x", q % 3, 0.8, -0.1)))
        ops.append((rng.choice(["rz", "ry", "rot"]), (q,), ("w", rng.randrange(6), 1.0, 0.0)))
    for _ in range(rng.randint(10, 16)):
        kind = rng.random()
        src = rng.choice([("w", rng.randrange(6), 1.0, 0.0), ("w", rng.randrange(6), -1.7, 0.3),
                          ("c", 0, 0.0, 0.45)])
        if kind < 0.4:
            ops.append((rng.choice(ONE + ["rot"]), (rng.randrange(n),), src))
        elif kind < 0.65 and n >= 2:
            ops.append((rng.choice(TWO), tuple(rng.sample(range(n), 2)), src))
        elif kind < 0.7 and n >= 3:
            ops.append(("multirz", tuple(rng.sample(range(n), 3)), src))
        else:
            name, k = rng.choice([f for f in FIXED if f[1] <= n])
            ops.append((name, tuple(rng.sample(range(n), k)), None))
    return _ops_body(ops, n)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("input_grad", [True, False])
def test_shared_gates_after_the_prefix_in_a_large_batch(seed, n, input_grad):
    """Batches of at least four times the register's size with only batch-shared angles after
    the product prefix take the dense sweep: outputs and gradients (inputs and weights) match
    the plain qnode, with padding lanes."""
    dev = qd.device("statevector", wires=n)
    body = _shared_body(n, seed)
    plain, static = qd.qnode(dev)(body), qd.qnode(dev, static=True)(body)
    g = torch.Generator().manual_seed(seed + 10 * n)
    b = 4 * 2 ** n + 3
    x = (torch.rand(b, 3, generator=g, dtype=torch.float64) * 6 - 3).requires_grad_(input_grad)
    w = (torch.rand(6, generator=g, dtype=torch.float64) * 6 - 3).requires_grad_()
    _compare(plain, static, [x, w])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("lanes", [8, 16, 64])
@pytest.mark.parametrize("input_grad", [True, False])
def test_dense_sweep_over_chunks_and_threads(monkeypatch, threads, lanes, input_grad):
    """The dense sweep's rho summed over many chunks (and per thread), then the prefix
    gradients per chunk, on the hybrid model (SEL weights after an angle embedding: the first
    layer's rotations, batch-shared, join the sweep; without input gradients no per-binding
    prefix gradient is taken)."""
    monkeypatch.setattr(prep_mod, "lanes_for", lambda n, b: lanes)
    n, b = 3, 203
    g = torch.Generator().manual_seed(lanes + threads)
    x = torch.rand(b, n, generator=g, dtype=torch.float64, requires_grad=input_grad)
    w = torch.rand(3, n, 3, generator=g, dtype=torch.float64, requires_grad=True)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _compare(_hybrid_circuit(n, False), _hybrid_circuit(n, True), [x, w])
    finally:
        torch.set_num_threads(saved)


def test_dense_sweep_complex64():
    n, b = 3, 70
    g = torch.Generator().manual_seed(6)
    x = torch.rand(b, n, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.rand(3, n, 3, generator=g, dtype=torch.float64, requires_grad=True)
    static = _hybrid_circuit(n, True, torch.complex64)
    _compare(_hybrid_circuit(n, False), static, [x, w], atol=2e-5)


EMBEDDINGS = {  # per wire q: the prefix ops before the shared body
    "rx": lambda q: [("rx", (q,), ("x", q, 1.0, 0.0))],
    "ry_scaled": lambda q: [("ry", (q,), ("x", q, -1.7, 0.3))],
    "flip_then_ry": lambda q: [("x", (q,), None), ("ry", (q,), ("x", q, 1.0, 0.0))],
    "rx_chain": lambda q: [("rx", (q,), ("x", q, 1.0, 0.0)), ("rx", (q,), ("x", q - 1, 0.5, 0.2))],
    "skip_first_wire": lambda q: [("rx", (q,), ("x", q, 1.0, 0.0))] if q else [],
    "rx_then_rz": lambda q: [("rx", (q,), ("x", q, 1.0, 0.0)), ("rz", (q,), ("x", q, 1.0, 0.0))],
    "h_then_rz": lambda q: [("h", (q,), None), ("rz", (q,), ("x", q, 1.0, 0.0))],
}


def _embedded_body(n, kind):
    """An embedding prefix of per-binding angles (EMBEDDINGS[kind]), then shared layers: two
    rotations of weights per wire and a ring of CNOTs, twice."""
    ops = [op for q in range(n) for op in EMBEDDINGS[kind](q)]
    for layer in range(2):
        for q in range(n):
            ops.append(("rot", (q,), ("w", (q + layer) % 6, 1.0, 0.0)))
            ops.append(("ry", (q,), ("w", (q + 3 * layer + 1) % 6, -0.6, 0.1)))
        ops += [("cnot", (q, (q + 1) % n), None) for q in range(n)]
    return _ops_body(ops, n)


@pytest.mark.parametrize("kind", sorted(EMBEDDINGS))
@pytest.mark.parametrize("n", [2, 3, 4, 5])
@pytest.mark.parametrize("input_grad", [True, False])
def test_dense_form_on_embeddings(monkeypatch, kind, n, input_grad):
    """The dense form with real factors (embeddings whose per-binding states are real up to a
    fixed phase on each basis state: RX, RY, flips, chains of them; forward psi = (V D) e~ and
    gradient E = D sum e~ lam^dag) and with complex ones (RZ after RX or H: the general
    products), over several chunks with padding lanes: outputs and gradients match the plain
    qnode. With H then RZ and zero angles in the first chunks, those chunks' states are real
    while the later ones' are not: without input gradients one call mixes the two forms."""
    monkeypatch.setattr(prep_mod, "lanes_for", lambda n, b: 8 * max(1, 2 ** n // 8))
    dev = qd.device("statevector", wires=n)
    body = _embedded_body(n, kind)
    plain, static = qd.qnode(dev)(body), qd.qnode(dev, static=True)(body)
    g = torch.Generator().manual_seed(n * 10 + len(kind))
    b = 4 * 2 ** n + 5
    x = torch.rand(b, n, generator=g, dtype=torch.float64) * 6 - 3
    x[: b // 2] = 0  # the first chunks' angles zero
    x.requires_grad_(input_grad)
    w = (torch.rand(6, generator=g, dtype=torch.float64) * 6 - 3).requires_grad_()
    _compare(plain, static, [x, w])


@pytest.mark.parametrize("kind", ["rx", "flip_then_ry", "rx_chain"])
def test_dense_form_real_factors_against_finite_differences(kind):
    """Input and weight gradients of the real-factor dense form against central differences
    (not the plain qnode): complex128, n = 3, batch 40."""
    n, b = 3, 40
    dev = qd.device("statevector", wires=n)
    f = qd.qnode(dev, static=True)(_embedded_body(n, kind))
    g = torch.Generator().manual_seed(3)
    x = (torch.rand(b, n, generator=g, dtype=torch.float64) * 4 - 2).requires_grad_()
    w = (torch.rand(6, generator=g, dtype=torch.float64) * 4 - 2).requires_grad_()
    out = _flat(f(x, w))
    cot = torch.linspace(-1.0, 1.2, out.numel(), dtype=torch.float64).reshape(out.shape)
    gx, gw = torch.autograd.grad(out, (x, w), cot)
    h = 1e-6
    for t, gt in ((x, gx), (w, gw)):
        for j in random.Random(kind).sample(range(t.numel()), min(8, t.numel())):
            e = torch.zeros(t.numel(), dtype=torch.float64)
            e[j] = h
            e = e.reshape(t.shape)
            args = (x + e, w) if t is x else (x, w + e)
            args_m = (x - e, w) if t is x else (x, w - e)
            with torch.no_grad():
                fd = ((_flat(f(*args)) - _flat(f(*args_m))) * cot).sum() / (2 * h)
            assert abs(float(gt.reshape(-1)[j]) - float(fd)) < 1e-7 * (1 + abs(float(fd)))


@pytest.mark.parametrize("kind", ["rx", "rx_chain", "h_then_rz"])
def test_dense_form_complex64_and_threads(kind):
    from conftest import torch_threads
    n, b = 4, 150
    dev64 = qd.device("statevector", wires=n, dtype=torch.complex64)
    body = _embedded_body(n, kind)
    g = torch.Generator().manual_seed(8)
    x = torch.rand(b, n, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.rand(6, generator=g, dtype=torch.float64, requires_grad=True)
    with torch_threads(2):
        _compare(qd.qnode(qd.device("statevector", wires=n))(body),
                 qd.qnode(dev64, static=True)(body), [x, w], atol=2e-5)


def test_kept_scratch_gives_the_bits_of_fresh_scratch():
    """The lane kernels' scratch (per-thread chunks and lane matrices, the gradient rows, the
    dense sweep's rho) lies in blocks kept between calls: calls of other registers, batches,
    precisions and thread counts in between (each leaving its blocks behind) give the very
    bits of the same call on fresh blocks; ``qd.clear_caches()`` frees them."""
    from qdiff.backends.statevector import native_lib
    from conftest import torch_threads

    cases = [(4, 256, torch.complex128, 1), (3, 70, torch.complex64, 2),
             (2, 5, torch.complex128, 2), (5, 200, torch.complex128, 2),
             (4, 33, torch.complex64, 1)]

    def run(n, b, cdtype, t):
        g = torch.Generator().manual_seed(n * 1000 + b)
        x = torch.rand(b, n, generator=g, dtype=torch.float64, requires_grad=True)
        w = torch.rand(3, n, 3, generator=g, dtype=torch.float64, requires_grad=True)
        with torch_threads(t):
            f = _hybrid_circuit(n, True, cdtype)
            out = _flat(f(x, w))
            cot = torch.linspace(-1.1, 0.7, out.numel(), dtype=out.dtype).reshape(out.shape)
            gx, gw = torch.autograd.grad(out, (x, w), cot)
        return out.detach(), gx, gw

    fresh = {}
    for case in cases:
        qd.clear_caches()
        fresh[case] = run(*case)
        assert native_lib.scratch_held() > 0  # the call's blocks were kept
    qd.clear_caches()
    assert native_lib.scratch_held() == 0
    for case in cases[::-1] + cases:
        got = run(*case)
        for a, b in zip(got, fresh[case]):
            assert torch.equal(a, b), case
    qd.clear_caches()
    assert native_lib.scratch_held() == 0
