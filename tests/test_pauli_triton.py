"""The Triton flip-group kernel of Pauli sums on CUDA states against the torch loop it replaces:
every state type, real and complex diagonals, constant (X-only) groups, states below, at and
above one block, batches, chunks added to an output, the operators and solvers on a GPU.

The CUDA cases are marked ``cuda`` (a GPU machine: ``python -m pytest -m cuda``). Where Triton
is installed, the same checks also run on CPU tensors through Triton's interpreter
(``TRITON_INTERPRET=1``, in a subprocess: the variable decides how kernels compile)."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

import qdiff as qd
from qdiff.backends.statevector import native, pauli_triton
from qdiff.circuits import paulis
from qdiff.circuits.paulis import PauliGroups, apply
from qdiff.operators import PauliSumOperator
from test_pauli_native import _tol, _words

HAS_CUDA = torch.cuda.is_available()
HAS_TRITON = pauli_triton._kernel() is not None if HAS_CUDA else (
    __import__("importlib").util.find_spec("triton") is not None)
STATE_TYPES = (torch.complex128, torch.complex64, torch.float64, torch.float32)
HERE = os.path.dirname(os.path.abspath(__file__))


def _reference(x, groups, lo, hi, d):
    """``sum_g d[g - lo, i] x[b, i ^ m_g]`` by indexing, on the CPU in complex128/float64."""
    x = x.cpu().to(torch.complex128 if x.is_complex() else torch.float64)
    d = d.cpu().to(torch.complex128 if d.is_complex() else torch.float64)
    idx = torch.arange(x.shape[-1])
    out = torch.zeros_like(x if not d.is_complex() else x.to(torch.complex128))
    for k in range(hi - lo):
        out = out + d[k] * x[:, idx ^ groups.masks[lo + k]]
    return out


def check_kernel(device: str, sizes=(0, 1, 2, 5, 10, 11)) -> None:
    """The kernel called directly on ``device``'s tensors against :func:`_reference`."""
    kernel = pauli_triton.pauli_kernel
    for n in sizes:
        words = [{}] if n == 0 else _words(n, 30, seed=n)
        g = torch.Generator().manual_seed(n)
        groups = PauliGroups(words, n)
        if n >= 5:
            assert bool(groups.constant.any()) and not bool(groups.constant.all())
        for complex_coeffs in (False, True):
            c = torch.randn(len(words), generator=g, dtype=torch.float64)
            if complex_coeffs:
                c = c + 1j * torch.randn(len(words), generator=g, dtype=torch.float64)
            for dtype in STATE_TYPES:
                rdtype = torch.float32 if dtype in (torch.float32, torch.complex64) else \
                    torch.float64
                d = groups.diagonals(c, rdtype)
                if d.is_complex() and not dtype.is_complex:
                    continue
                x = torch.randn(3, 2 ** n, generator=g, dtype=dtype).to(device)
                dd = d.to(device)
                whole = kernel(x, groups, 0, groups.num_groups, dd)
                ref = _reference(x, groups, 0, groups.num_groups, d)
                tol = _tol(dtype) * (1 + float(ref.abs().max()))
                assert whole.device == x.device and whole.dtype == x.dtype
                assert (whole.cpu() - ref).abs().max() <= tol, (n, dtype, complex_coeffs)
                half = max(1, groups.num_groups // 2)
                parts = kernel(x, groups, 0, half, dd[:half])
                parts = kernel(x, groups, half, groups.num_groups, dd[half:], parts)
                assert (parts.cpu() - ref).abs().max() <= tol
                # a non-contiguous view and a conjugate view read as their values
                view = x.t().contiguous().t()
                assert (kernel(view, groups, 0, groups.num_groups, dd).cpu() - ref).abs().max() \
                    <= tol
                if dtype.is_complex:
                    conj = kernel(x.conj(), groups, 0, groups.num_groups, dd)
                    cref = _reference(x.conj().resolve_conj(), groups, 0, groups.num_groups, d)
                    assert (conj.cpu() - cref).abs().max() <= tol
        empty = torch.zeros(0, 2 ** n, dtype=torch.complex128, device=device)
        assert kernel(empty, groups, 0, groups.num_groups,
                      groups.diagonals(c.real, torch.float64).to(device)).shape == (0, 2 ** n)


@pytest.mark.skipif(HAS_CUDA or not HAS_TRITON, reason="Triton's interpreter: Triton installed, "
                    "no GPU (the CUDA cases run the kernel itself)")
def test_kernel_in_tritons_interpreter():
    code = ("import sys; sys.path.insert(0, %r); import test_pauli_triton as t; "
            "t.check_kernel('cpu', sizes=(0, 1, 2, 5, 9)); print('ok')" % HERE)
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, env=env)
    assert out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_cpu_states_and_disabled_kernels_are_not_taken():
    kernel = pauli_triton.pauli_kernel
    assert not kernel.takes(torch.ones(1, 4, dtype=torch.complex128))
    assert not kernel.takes(torch.ones(1, 4, dtype=torch.complex128, device="meta"))
    assert kernel in paulis._KERNELS  # the engine registers it beside the native one
    with native.disabled():
        assert not kernel.takes(torch.ones(1, 4, dtype=torch.complex128))


class _FailingLaunch:
    """A Triton kernel whose launch fails as one does without a host C compiler."""

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            raise RuntimeError("Failed to find C compiler. Please specify via CC")
        return launch


def test_a_kernel_that_cannot_launch_falls_back_to_the_torch_loop(monkeypatch):
    kernel = pauli_triton.pauli_kernel
    monkeypatch.setattr(pauli_triton, "_kernel", lambda: _FailingLaunch())
    monkeypatch.setattr(pauli_triton.TritonPauliKernel, "failed", None)
    n = 6
    groups = PauliGroups(_words(n, 20, seed=2), n)
    c = torch.randn(20, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    d = groups.diagonals(c, torch.float64)
    x = torch.randn(2, 2 ** n, dtype=torch.complex128, generator=torch.Generator().manual_seed(6))
    ref = _reference(x, groups, 0, groups.num_groups, d)
    with pytest.warns(RuntimeWarning, match="C compiler.*torch loop runs instead"):
        out = kernel(x, groups, 0, groups.num_groups, d)
    assert torch.allclose(out, ref, atol=1e-12, rtol=0)
    assert kernel.failed and "C compiler" in kernel.failed
    assert not kernel.takes(torch.ones(1, 4, dtype=torch.complex128))
    half = groups.num_groups // 2  # adding to an output, as chunks do (no second warning)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parts = kernel(x, groups, 0, half, d[:half])
    parts = kernel(x, groups, half, groups.num_groups, d[half:], parts)
    assert torch.allclose(parts, ref, atol=1e-12, rtol=0)



def test_device_rows_emptied_by_another_thread_meanwhile():
    """The groups' masks and rows on a device are shared by threads, and one may empty them at
    any point (emulated: they empty themselves whenever asked for a key or written): each
    call reads its entry once and gets the masks and rows of its own groups."""
    n = 4
    groups = PauliGroups(_words(n, 12, seed=3), n)

    class Emptied(dict):
        def __contains__(self, key):
            found = dict.__contains__(self, key)
            self.clear()
            return found

        def __setitem__(self, key, value):
            dict.__setitem__(self, key, value)
            self.clear()

    groups.__dict__["_device_rows"] = Emptied()
    g = groups.num_groups
    for lo, hi in ((0, g), (1, g), (0, g)):
        masks, rows = pauli_triton._group_rows(groups, lo, hi, torch.device("cpu"))
        assert masks.tolist() == groups.masks[lo:hi]
        assert rows.tolist() == groups.kernel_rows(lo, hi).tolist()

@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_kernel_on_cuda():
    assert HAS_TRITON, "CUDA builds of torch ship Triton"
    check_kernel("cuda", sizes=(0, 1, 2, 5, 10, 11, 13))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_operators_engine_and_solver_on_cuda_use_the_kernel():
    n = 10
    g = torch.Generator().manual_seed(4)
    op = PauliSumOperator(_words(n, 40, seed=7), torch.randn(40, dtype=torch.float64,
                                                             generator=g), n)
    psi = torch.randn(4, 2 ** n, dtype=torch.complex128, generator=g)
    x = psi.cuda()
    assert paulis.kernel_for(x) is pauli_triton.pauli_kernel
    with native.disabled():  # the native kernels off (QDIFF_NATIVE=0): the torch loop
        assert not pauli_triton.pauli_kernel.takes(x)
    calls = []
    orig = pauli_triton.TritonPauliKernel.__call__

    def counting(self, *args):
        calls.append(1)
        return orig(self, *args)

    pauli_triton.TritonPauliKernel.__call__ = counting
    try:
        ours = op.apply(x)
        e = op.expval(x)
    finally:
        pauli_triton.TritonPauliKernel.__call__ = orig
    assert calls
    ref = op.apply(psi)
    assert torch.allclose(ours.cpu(), ref, atol=1e-11, rtol=0)
    assert torch.allclose(e.cpu(), op.expval(psi), atol=1e-10, rtol=0)
    # autograd: the Hermitian product's backward is the product again
    xg = x.clone().requires_grad_(True)
    (op.apply(xg).abs() ** 2).sum().backward()
    pg = psi.clone().requires_grad_(True)
    (op.apply(pg).abs() ** 2).sum().backward()
    assert torch.allclose(xg.grad.cpu(), pg.grad, atol=1e-10, rtol=0)
    # the engine's Hamiltonian expectation (and its gradient) and the eigensolver
    h, nq = qd.qchem.molecular_hamiltonian(["H", "H"], [0.0, 0.0, -0.6614, 0.0, 0.0, 0.6614])
    hf = qd.hf_state(2, nq)

    def f(t):
        qd.BasisState(hf, wires=range(nq))
        qd.DoubleExcitation(t, wires=[0, 1, 2, 3])
        return qd.expval(h)

    t = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    ref = qd.QNode(f, qd.device("statevector", wires=nq), diff_method="adjoint")(t)
    (rg,) = torch.autograd.grad(ref, t)
    tc = t.detach().cuda().requires_grad_(True)
    out = qd.QNode(f, qd.device("statevector", wires=nq), diff_method="adjoint")(tc)
    (gc,) = torch.autograd.grad(out, tc)
    assert abs(float(out) - float(ref)) < 1e-10 and abs(float(gc) - float(rg)) < 1e-9
    e, vecs, info = qd.lanczos(op.to("cuda"), 2)
    e_cpu, _, _ = qd.lanczos(op, 2)
    assert vecs.is_cuda and torch.allclose(e.cpu(), e_cpu, atol=1e-8, rtol=0)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_diagonal_rows_past_two_to_the_31_entries():
    """65 groups of a 25-qubit state: the last group's row starts at entry 2**31."""
    n, count = 25, 65
    if torch.cuda.get_device_properties(0).total_memory < 24 << 30:
        pytest.skip("needs a GPU with 24 GiB")
    words = [{q: "X" for q in range(7) if (g + 1) >> q & 1} for g in range(count)]
    groups = PauliGroups(words, n)
    assert groups.num_groups == count and bool(groups.constant.all())
    d = torch.zeros(count, 2 ** n, dtype=torch.float32, device="cuda")
    d[:, 0] = torch.arange(1, count + 1, dtype=torch.float32, device="cuda")
    x = torch.randn(1, 2 ** n, dtype=torch.complex64, device="cuda")
    out = pauli_triton.pauli_kernel(x, groups, 0, count, d)
    idx = torch.arange(2 ** n, device="cuda")
    ref = torch.zeros_like(x)
    for g in range(count):
        ref += (g + 1) * x[:, idx ^ groups.masks[g]]
    assert torch.allclose(out, ref, atol=1e-3, rtol=1e-5)
