"""The native flip-group kernel of Pauli sums (``qd_pauli_apply``) against the torch loop it
replaces: every state type, real and complex diagonals, constant (X-only) groups, partner runs
of 1, 2 and 4+ amplitudes, states below, at and above one block, batches, chunked diagonals,
thread counts, autograd through the Hermitian product, and the engine's measurements."""
from __future__ import annotations

import random
import subprocess
import sys

import pytest
import torch

import qdiff as qd
from qdiff.backends.statevector import native
from qdiff.circuits import paulis
from qdiff.circuits.paulis import PauliGroups, apply
from qdiff.operators import PauliSumOperator

pytestmark = pytest.mark.skipif(native.library() is None,
                                reason="no C compiler: the native kernels are not built")

STATE_TYPES = (torch.complex128, torch.complex64, torch.float64, torch.float32)


def _words(n, count, seed, letters="XYZI"):
    rng = random.Random(seed)
    words = []
    for t in range(count):
        pool = letters if t % 3 else "XI"  # every third word of X alone: constant groups
        w = {q: rng.choice(pool) for q in range(n)}
        words.append({q: p for q, p in w.items() if p != "I"})
    return words


def _tol(dtype):
    return 1e-12 if dtype in (torch.complex128, torch.float64) else 2e-4


@pytest.mark.parametrize("n", [1, 2, 5, 10, 11, 13])
@pytest.mark.parametrize("complex_coeffs", [False, True])
def test_kernel_matches_the_torch_loop(n, complex_coeffs):
    words = _words(n, 40, seed=n)
    g = torch.Generator().manual_seed(n)
    c = torch.randn(len(words), generator=g, dtype=torch.float64)
    if complex_coeffs:  # a non-Hermitian sum: complex diagonals
        c = c + 1j * torch.randn(len(words), generator=g, dtype=torch.float64)
    op = PauliSumOperator(words, c, n)
    groups = op.groups
    runs = {(m & 1023) & -(m & 1023) for m in groups.masks if m & 1023}
    if n >= 10:
        assert {1, 2} <= runs and any(r >= 4 for r in runs)  # every partner-run form
    if n >= 5:
        assert bool(groups.constant.any()) and not bool(groups.constant.all())
    for dtype in STATE_TYPES:
        psi = torch.randn(3, 2 ** n, generator=g, dtype=dtype)
        ours = op.apply(psi)
        chunked = apply(groups, op.coeffs, psi, kernel=native.pauli_kernel)  # diagonals by chunk
        with native.disabled():
            ref = op.apply(psi)
        assert ours.dtype == ref.dtype and ours.shape == ref.shape
        assert torch.allclose(ours, ref, atol=_tol(dtype), rtol=0), (dtype,
                                                                      (ours - ref).abs().max())
        assert torch.allclose(chunked, ref.to(chunked.dtype), atol=_tol(dtype), rtol=0)


@pytest.mark.parametrize("n", [0, 1, 2])
def test_kernel_on_blocks_of_one_to_four_amplitudes(n):
    words = [{}] if n == 0 else [{}, {0: "X"}, {n - 1: "Z"}, {0: "Y", n - 1: "X"}]
    groups = PauliGroups(words, n)
    c = torch.arange(1.0, len(words) + 1, dtype=torch.float64)
    x = torch.randn(3, 2 ** n, dtype=torch.complex128)
    out = native.pauli_kernel(x, groups, 0, groups.num_groups,
                              groups.diagonals(c, torch.float64))
    with native.disabled():
        ref = apply(groups, c, x)
    assert torch.allclose(out, ref, atol=1e-14, rtol=0)


def test_kernel_chunks_accumulate_and_threads_agree_bit_for_bit():
    n = 14
    words = _words(n, 60, seed=3)
    c = torch.randn(len(words), dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    groups = PauliGroups(words, n)
    d = groups.diagonals(c, torch.float64)
    x = torch.randn(2, 2 ** n, dtype=torch.complex128)
    whole = native.pauli_kernel(x, groups, 0, groups.num_groups, d)
    half = groups.num_groups // 2
    parts = native.pauli_kernel(x, groups, 0, half, d[:half])
    parts = native.pauli_kernel(x, groups, half, groups.num_groups, d[half:], parts)
    assert torch.equal(whole, parts)  # the same sums in the same order
    old = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append(native.pauli_kernel(x, groups, 0, groups.num_groups, d))
    finally:
        torch.set_num_threads(old)
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_the_engine_registers_its_kernel_on_import():
    code = ("import qdiff.operators, qdiff.circuits.paulis as p, torch; "
            "print(p.kernel_for(torch.ones(1, 4, dtype=torch.complex128)) is not None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr[-2000:]


def test_kernel_refuses_what_it_cannot_take():
    groups = PauliGroups([{0: "X"}, {1: "Y"}], 2)
    d = groups.diagonals(torch.tensor([1.0, 2.0], dtype=torch.float64), torch.float64)
    assert d.is_complex()
    with pytest.raises(qd.QdiffError, match="complex Pauli-sum diagonal on real states"):
        native.pauli_kernel(torch.ones(1, 4, dtype=torch.float64), groups, 0, 2, d)
    assert not native.pauli_kernel.takes(torch.ones(1, 4, dtype=torch.int64))
    assert not native.pauli_kernel.takes(torch.ones(4, dtype=torch.complex128))  # not (B, 2**n)
    assert not native.pauli_kernel.takes(torch.ones(1, 4, dtype=torch.complex128, device="meta"))
    with native.disabled():
        assert not native.pauli_kernel.takes(torch.ones(1, 4, dtype=torch.complex128))


def test_views_empty_batches_and_autograd():
    n = 9
    g = torch.Generator().manual_seed(2)
    op = PauliSumOperator(_words(n, 30, seed=5), torch.randn(30, dtype=torch.float64, generator=g),
                          n)
    base = torch.randn(2 ** n, 4, dtype=torch.complex128)
    view = base.transpose(0, 1)  # not contiguous
    with native.disabled():
        ref = op.apply(view.contiguous())
    assert torch.allclose(op.apply(view), ref, atol=1e-12)
    assert op.apply(torch.zeros(0, 2 ** n, dtype=torch.complex128)).shape == (0, 2 ** n)
    # autograd: the Hermitian product's backward is the product again (the kernel both ways)
    psi = torch.randn(2, 2 ** n, dtype=torch.complex128, requires_grad=True)
    (op.apply(psi).abs() ** 2).sum().backward()
    g_native = psi.grad.clone()
    psi.grad = None
    with native.disabled():
        (op.apply(psi).abs() ** 2).sum().backward()
    assert torch.allclose(g_native, psi.grad, atol=1e-11)
    # a real state of a real matrix stays real (X and Z words)
    real_op = PauliSumOperator(_words(n, 30, seed=6, letters="XZI"), torch.randn(30).double(), n)
    real = torch.randn(2 ** n, dtype=torch.float64)
    with native.disabled():
        ref = real_op.apply(real)
    assert real_op.real_matrix and real_op.apply(real).dtype == torch.float64
    assert torch.allclose(real_op.apply(real), ref, atol=1e-12)


class _Counting:
    def __init__(self, kernel):
        self.kernel, self.calls = kernel, 0

    def takes(self, x):
        return self.kernel.takes(x)

    def __call__(self, *args):
        self.calls += 1
        return self.kernel(*args)


def test_lazy_conjugate_and_negative_views():
    """conj()/neg views carry a bit, not new values: the kernel reads their values."""
    n = 7
    g = torch.Generator().manual_seed(8)
    op = PauliSumOperator(_words(n, 25, seed=9), torch.randn(25, dtype=torch.float64,
                                                                 generator=g), n)
    psi = torch.randn(2, 2 ** n, dtype=torch.complex128, generator=g)
    for view in (psi.conj(), -psi.conj(), torch.view_as_real(psi).neg()[..., 0]):
        with native.disabled():
            ref = op.apply(view.clone())
        assert torch.allclose(op.apply(view), ref, atol=1e-12)
        assert torch.allclose(op.expval(view), (view.conj() * ref).real.sum(-1), atol=1e-12)
    # autograd hands the backward a conjugate view here
    w = torch.randn(2 ** n, dtype=torch.complex128, generator=g)
    grads = []
    for ctx in (native.disabled, None):
        x = psi.clone().requires_grad_(True)
        if ctx is None:
            (op.apply(x).conj() * w).real.sum().backward()
        else:
            with ctx():
                (op.apply(x).conj() * w).real.sum().backward()
        grads.append(x.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-12)


def test_torch_func_transforms_of_a_pauli_sum():
    n = 4
    g = torch.Generator().manual_seed(3)
    op = PauliSumOperator(_words(n, 8, seed=4), torch.randn(8, dtype=torch.float64,
                                                             generator=g), n)
    psi = torch.randn(2 ** n, dtype=torch.complex128, generator=g)
    ours = torch.func.grad(lambda p: op.expval(p))(psi)
    x = psi.clone().requires_grad_(True)
    op.expval(x).backward()
    assert torch.allclose(ours, x.grad, atol=1e-12)
    batch = torch.randn(3, 2 ** n, dtype=torch.complex128, generator=g)
    assert torch.allclose(torch.func.vmap(op.apply)(batch), op.apply(batch), atol=1e-12)


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
def test_engine_expval_and_adjoint_of_a_pauli_sum(cdtype, monkeypatch):
    """A qnode's Hamiltonian expval and adjoint gradient go through the kernel."""
    counting = _Counting(native.pauli_kernel)
    monkeypatch.setattr(paulis, "_KERNELS", [counting])
    n = 6
    rng = random.Random(7)
    words = [w for w in _words(n, 25, seed=11) if w]
    coeffs = [rng.uniform(-1, 1) for _ in words]
    ops = []
    for w in words:
        factors = [getattr(qd, p)(q) for q, p in w.items()]
        term = factors[0]
        for f in factors[1:]:
            term = term @ f
        ops.append(term)
    H = qd.Hamiltonian(coeffs, ops)
    weights = torch.randn(2, n, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))

    def body(w):
        qd.StronglyEntanglingLayers(w, wires=range(n))
        return qd.expval(H)

    def run(method):
        w = weights.clone().requires_grad_(True)
        f = qd.qnode(qd.device("statevector", wires=n, dtype=cdtype), diff_method=method)(body)
        v = f(w)
        v.backward()
        return v.detach(), w.grad

    v, g = run("adjoint")
    assert counting.calls >= 2  # the expval and the adjoint's H psi
    with native.disabled():
        v_ref, g_ref = run("adjoint")
    tol = 1e-10 if cdtype == torch.complex128 else 2e-4
    assert abs(float(v) - float(v_ref)) < tol
    assert torch.allclose(g, g_ref, atol=tol)


def test_kernel_call_holds_the_masks_it_passes(monkeypatch):
    """The flip masks handed to the kernel stay alive for the whole call (the kernel runs with
    the GIL released; another thread may replace the groups' cached mask tensor meanwhile)."""
    import weakref
    n = 4
    op = PauliSumOperator(_words(n, 12, seed=3), torch.linspace(0.1, 1.2, 12,
                                                              dtype=torch.float64), n)
    groups = op.groups
    freed = []

    class Fresh:  # every access a new tensor, referenced by nothing but the caller's slice
        def __getitem__(self, key):
            t = torch.tensor(groups.masks, dtype=torch.int64)[key]
            weakref.finalize(t, freed.append, True)
            return t

    class Groups:
        def __getattr__(self, name):
            return Fresh() if name == "mask_tensor" else getattr(groups, name)

    lib = native.library()

    class Lib:
        def __getattr__(self, name):
            return getattr(lib, name)

        def qd_pauli_apply(self, *args):
            assert not freed, "the masks were freed before the kernel ran"
            return lib.qd_pauli_apply(*args)

    psi = torch.randn(2, 2 ** n, dtype=torch.complex128)
    d = groups.diagonals(op.coeffs, torch.float64)
    with native.disabled():
        ref = op.apply(psi)
    monkeypatch.setattr(native, "library", lambda: Lib())
    out = native.pauli_kernel(psi, Groups(), 0, groups.num_groups, d)
    assert torch.allclose(out, ref, atol=1e-12)
