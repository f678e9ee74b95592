"""PauliSumOperator against dense matrices (Observable.matrix), scipy and PennyLane."""
import random

import numpy as np
import pytest
import torch

import qdiff as qd
from conftest import TORCH_DEVICES
from qdiff.operators import PauliSumOperator, walsh_hadamard

DEVICES = TORCH_DEVICES


def random_op(n, terms, seed, complex_y=True):
    rng = random.Random(seed)
    letters = "XYZ" if complex_y else "XZ"
    words = [{w: rng.choice(letters) for w in rng.sample(range(n), rng.randint(0, min(n, 4)))}
             for _ in range(terms)]
    g = torch.Generator().manual_seed(seed)
    return PauliSumOperator(words, torch.randn(terms, generator=g, dtype=torch.float64), n)


def dense_ref(op):
    return op.to_observable().matrix(wire_order=list(range(op.n_qubits)))


def random_states(b, n, seed, dtype=torch.complex128):
    g = torch.Generator().manual_seed(seed)
    psi = torch.randn(b, 2 ** n, generator=g, dtype=torch.float64) + \
        1j * torch.randn(b, 2 ** n, generator=g, dtype=torch.float64)
    return (psi / psi.norm(dim=-1, keepdim=True)).to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,terms,seed", [(1, 3, 0), (3, 12, 1), (5, 30, 2), (6, 40, 3)])
def test_apply_expval_terms_match_dense(n, terms, seed, device):
    op = random_op(n, terms, seed).to(device)
    M = dense_ref(random_op(n, terms, seed)).to(device)
    psi = random_states(4, n, seed).to(device)
    assert torch.allclose(op.apply(psi), psi @ M.T, atol=1e-12)
    assert torch.allclose(op.apply(psi[0]), M @ psi[0], atol=1e-12)
    ref = torch.einsum("bi,ij,bj->b", psi.conj(), M, psi).real
    assert torch.allclose(op.expval(psi), ref, atol=1e-12)
    Pt = [dense_ref(PauliSumOperator([w], [1.0], n)).to(device) for w in op.words]
    tv = torch.stack([torch.einsum("bi,ij,bj->b", psi.conj(), P, psi).real for P in Pt], -1)
    assert torch.allclose(op.term_expvals(psi), tv, atol=1e-12)
    phi = random_states(4, n, seed + 100).to(device)
    bl = torch.stack([torch.einsum("bi,ij,bj->b", phi.conj(), P, psi).real for P in Pt], -1)
    assert torch.allclose(op.bilinear_terms(phi, psi), bl, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_matrices_dense_csr_scipy(device):
    op = random_op(5, 25, 7).to(device)
    M = dense_ref(random_op(5, 25, 7)).to(device)
    assert torch.allclose(op.to_dense(), M, atol=1e-13)
    assert torch.allclose(op.to_sparse_csr().to_dense(), M, atol=1e-13)
    assert np.allclose(op.to_scipy().toarray(), M.cpu().numpy(), atol=1e-13)


def test_real_matrix_keeps_real_states():
    op = random_op(5, 20, 3, complex_y=False)
    assert op.real_matrix
    x = torch.randn(3, 32, dtype=torch.float64)
    y = op.apply(x)
    assert not y.is_complex()
    assert torch.allclose(y.to(torch.complex128), x.to(torch.complex128) @ dense_ref(op).T,
                          atol=1e-12)


def test_term_values_of_real_states_keep_the_sign_of_two_y_factors():
    # YY = -(i^2) flips: on real states with only real phases the sign must still be applied
    op = PauliSumOperator.from_strings(["XX", "YY", "ZZ", "ZX"], [1.0, 1.0, 1.0, 0.5])
    assert op.real_matrix
    psi = torch.tensor([0.0, 1.0, 1.0, 0.0], dtype=torch.float64) / 2 ** 0.5
    assert torch.allclose(op.term_expvals(psi), torch.tensor([1.0, 1.0, -1.0, 0.0],
                                                             dtype=torch.float64), atol=1e-14)
    x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for a in (x, x.float()):
        got = op.bilinear_terms(a, y.to(a.dtype))
        ref = op.bilinear_terms(a.to(torch.complex128), y.to(torch.complex128))
        assert got.dtype == a.dtype and torch.allclose(got.double(), ref, atol=1e-5)
        refd = torch.stack([torch.einsum("bi,ij,bj->b", a.double().to(torch.complex128),
                                         dense_ref(PauliSumOperator([w], [1.0], 2)),
                                         y.to(torch.complex128)).real for w in op.words], -1)
        assert torch.allclose(got.double(), refd, atol=1e-5)


def test_complex64_follows_state_dtype():
    op = random_op(4, 10, 5)
    psi = random_states(2, 4, 1, torch.complex64)
    out = op.apply(psi)
    assert out.dtype == torch.complex64
    assert torch.allclose(out.to(torch.complex128), psi.to(torch.complex128) @ dense_ref(op).T,
                          atol=1e-5)


@pytest.mark.parametrize("letters", ["XZ", "XYZ"])
def test_float32_coefficients_on_double_states_sum_in_double(letters):
    """As torch promotes a float32 factor in a float64 product: the diagonals of float32
    coefficients applied to complex128/float64 states are summed in float64."""
    rng = random.Random(7)
    n, terms = 8, 60
    words = [{q: rng.choice(letters) for q in rng.sample(range(n), 4)} for _ in range(terms)]
    c = torch.randn(terms, generator=torch.Generator().manual_seed(3)).float()
    op32, op64 = PauliSumOperator(words, c, n), PauliSumOperator(words, c.double(), n)
    for dtype in ((torch.complex128, torch.float64) if letters == "XZ" else (torch.complex128,)):
        psi = torch.randn(2, 2 ** n, dtype=dtype, generator=torch.Generator().manual_seed(4))
        out = op32.apply(psi)
        assert out.dtype == dtype
        assert torch.allclose(out, op64.apply(psi), atol=1e-12, rtol=0)
        assert torch.allclose(op32.expval(psi), op64.expval(psi), atol=1e-11, rtol=0)


def test_walsh_hadamard_matches_definition():
    x = torch.randn(3, 2 ** 7, dtype=torch.float64)
    y = torch.arange(2 ** 7)
    signs = torch.tensor([[(-1) ** bin(a & b).count("1") for b in range(2 ** 7)]
                          for a in range(2 ** 7)], dtype=torch.float64)
    assert torch.allclose(walsh_hadamard(x), x @ signs.T, atol=1e-12)
    assert y.numel() == 128


def test_gradcheck_state_and_coeffs():
    base = random_op(3, 10, 11)
    c = base.coeffs.clone().requires_grad_()
    psi = random_states(2, 3, 4).requires_grad_()
    assert torch.autograd.gradcheck(lambda c, p: base.with_coeffs(c).expval(p), (c, psi))
    assert torch.autograd.gradcheck(lambda c, p: base.with_coeffs(c).apply(p), (c, psi))
    assert torch.autograd.gradcheck(lambda c: base.with_coeffs(c).to_dense(), (c,))
    x = torch.randn(2, 8, dtype=torch.float64, requires_grad=True)
    real = random_op(3, 8, 2, complex_y=False)
    assert torch.autograd.gradcheck(lambda c, x: real.with_coeffs(c).expval(x),
                                    (real.coeffs.clone().requires_grad_(), x))


def test_expval_coeff_gradient_is_term_values():
    op = random_op(4, 15, 9)
    c = op.coeffs.clone().requires_grad_()
    psi = random_states(1, 4, 2)
    op.with_coeffs(c).expval(psi).sum().backward()
    assert torch.allclose(c.grad, op.term_expvals(psi)[0], atol=1e-12)


def test_from_observable_and_errors():
    H = 0.5 * qd.Z(0) @ qd.Z(2) - 0.25 * qd.Y(1) + 0.1 * qd.X(0) @ qd.Y(2)
    op = PauliSumOperator.from_observable(H)
    assert op.n_qubits == 3 and op.num_terms == 3
    assert torch.allclose(op.to_dense(), H.matrix(wire_order=[0, 1, 2]), atol=1e-14)
    with pytest.raises(qd.QdiffError, match="length 8"):
        op.apply(torch.zeros(4, dtype=torch.complex128))
    with pytest.raises(qd.QdiffError, match="Hermitian-matrix"):
        PauliSumOperator.from_observable(qd.Hermitian(np.eye(2), wires=0))
    with pytest.raises(qd.QdiffError, match="outside"):
        PauliSumOperator([{5: "X"}], [1.0], 3)
    with pytest.raises(qd.QdiffError, match="2 coefficient"):
        PauliSumOperator([{0: "X"}], [1.0, 2.0], 1)


def test_real_matrix_dtype_refused_for_imaginary_entries():
    op = PauliSumOperator.from_strings(["YZ", "XX"], [1.0, 0.5])
    with pytest.raises(qd.QdiffError, match="imaginary"):
        op.to_dense(torch.float64)
    with pytest.raises(qd.QdiffError, match="imaginary"):
        op.to_sparse_csr(torch.float32)
    with pytest.raises(qd.QdiffError, match="dtype"):
        op.to_dense(torch.int64)
    real = PauliSumOperator.from_strings(["YY", "XZ"], [1.0, 0.5])  # a real matrix
    ref = real.to_dense()
    assert torch.equal(real.to_dense(torch.float64), ref.real)
    assert torch.equal(real.to_sparse_csr(torch.float64).to_dense(), ref.real)
    # complex coefficients with zero imaginary part give a real matrix too
    cz = PauliSumOperator.from_strings(["ZZ"], torch.tensor([2.0 + 0j]))
    assert torch.equal(cz.to_dense(torch.float64), torch.diag(torch.tensor([2.0, -2, -2, 2],
                                                                           dtype=torch.float64)))


def test_large_matrices_and_diagonals_refused_before_allocating():
    big = PauliSumOperator.from_strings(["Z" * 40, "X" * 40], [1.0, 0.5])
    with pytest.raises(qd.QdiffError, match="40 qubits"):
        big.to_dense()
    for make in (big.to_sparse_csr, big.to_scipy, big.diagonals):
        with pytest.raises(qd.QdiffMemoryError, match="40-qubit"):
            make()
    obs = sum((qd.Z(i) for i in range(40)), start=0.0 * qd.Z(0))
    for make in (obs.matrix, obs.eigvals):
        with pytest.raises(qd.QdiffMemoryError, match="40-qubit"):
            make()
    with pytest.raises(qd.QdiffError, match="n_qubits"):
        PauliSumOperator.from_strings(["Z" * 100], [1.0])
    with pytest.raises(qd.QdiffError, match="n_qubits"):
        PauliSumOperator([{}], [1.0], -1)
    with pytest.raises(qd.QdiffError, match="repeats"):
        (qd.Z(0) @ qd.X(1)).matrix(wire_order=[0, 0, 1])


def test_from_observable_with_label_wires_needs_wire_order():
    H = 0.5 * qd.Z("a") @ qd.X("b") + 0.3 * qd.Y("c")
    with pytest.raises(qd.QdiffError, match="wire_order"):
        PauliSumOperator.from_observable(H)
    op = PauliSumOperator.from_observable(H, wire_order=["c", "a", "b"])
    assert torch.allclose(op.to_dense(), H.matrix(wire_order=["c", "a", "b"]), atol=1e-14)


def test_coefficients_must_be_finite_numbers():
    """Strings, None and objects as coefficients, and NaN in a PauliSumOperator, are refused."""
    for bad in (["a"], [None], ["1.5"], [object()]):
        with pytest.raises(qd.QdiffError, match="coefficient"):
            qd.Hamiltonian(bad, [qd.Z(0)])
    with pytest.raises(qd.QdiffError, match="NaN"):
        PauliSumOperator.from_strings(["ZZ"], [float("nan")])
    assert float(qd.Hamiltonian([np.float32(2.0)], [qd.Z(0)]).coeffs[0]) == 2.0


def test_expval_and_solvers_refuse_a_non_hermitian_sum():
    """Complex coefficients that do not cancel make H non-Hermitian: <psi|H|psi> is complex,
    so expval (which returns a real number) and the Hermitian solvers refuse it."""
    op = PauliSumOperator([{0: "X"}, {1: "Y"}, {0: "Z", 1: "Z"}],
                          torch.tensor([1 + 1j, 0.5, 0.3]), 2)
    assert not op.hermitian
    psi = random_states(1, 2, 4)
    with pytest.raises(qd.QdiffError, match="not Hermitian"):
        op.expval(psi)
    for solve in (lambda: qd.eigsh(op, k=1), lambda: qd.ground_state(op),
                  lambda: qd.cg(op, torch.ones(4, dtype=torch.complex128))):
        with pytest.raises(qd.QdiffError, match="not Hermitian"):
            solve()
    # the imaginary parts of one word's terms cancel: Hermitian, and expval is <psi|H|psi>
    herm = PauliSumOperator([{0: "X"}, {1: "Z"}, {0: "X"}],
                            torch.tensor([1 + 1j, 0.5 + 0j, 1 - 1j]), 2)
    assert herm.hermitian and herm.with_coeffs(torch.tensor([1.0, 2.0, 3.0])).hermitian
    ref = (psi.conj() * (psi @ dense_ref(herm).T)).sum(-1)
    assert torch.allclose(herm.expval(psi), ref.real, atol=1e-14)
    # complex64 coefficients: the solver runs in single precision
    assert abs(float(qd.eigsh(herm, k=1)[0][0]) + 2.5) < 1e-6
    assert abs(float(qd.eigsh(herm.to(dtype=torch.complex128), k=1)[0][0]) + 2.5) < 1e-12


def test_bad_words_coefficients_and_dtypes_are_qdiff_errors():
    with pytest.raises(qd.QdiffError, match="coefficients must be numbers"):
        PauliSumOperator([{0: "X"}], ["a"], 1)
    with pytest.raises(qd.QdiffError, match="from_strings"):
        PauliSumOperator(["XZ"], [1.0], 2)
    op = PauliSumOperator([{0: "X"}, {1: "Z"}], [1.0, 0.5], 2)
    with pytest.raises(qd.QdiffError, match="NaN"):
        op.with_coeffs(torch.tensor([float("nan"), 1.0]))
    assert torch.equal(op.with_coeffs([2.0, 1.0]).to_dense(), 2 * op.to_dense())
    with pytest.raises(qd.QdiffError, match="dtype"):
        op.to(dtype=torch.int64)
    # numpy integer wires are wires
    np_op = PauliSumOperator([{np.int64(0): "X"}, {np.int32(1): "Z"}], [1.0, 0.5], 2)
    assert torch.equal(np_op.to_dense(), op.to_dense())


def test_from_observable_takes_gates_as_observables():
    assert torch.equal(PauliSumOperator.from_observable(qd.Z(1)).to_dense(),
                       (qd.Z(1) + 0.0 * qd.Z(0)).matrix(wire_order=[0, 1]))
    with pytest.raises(qd.QdiffError, match="outside 0..1"):
        PauliSumOperator.from_observable(qd.X(3), n_qubits=2)


def test_sums_differences_and_scalar_multiples_of_operators():
    H = PauliSumOperator.from_strings(["XZ", "YY"], [1.0, 0.5])
    K = PauliSumOperator.from_strings(["ZI", "XZ"], [0.3, -1.0])
    dh, dk, eye = H.to_dense(), K.to_dense(), torch.eye(4, dtype=torch.complex128)
    for got, ref in ((H + K, dh + dk), (H - K, dh - dk), (2 * H - 1, 2 * dh - eye),
                     (1 - H / 4, eye - dh / 4), (-H, -dh), (H + 0.5j, dh + 0.5j * eye)):
        assert torch.allclose(got.to_dense(), ref, atol=1e-15)
    t = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    psi = random_states(1, 2, 5)
    (H + t * K).expval(psi).sum().backward()
    assert torch.allclose(t.grad, K.expval(psi)[0], atol=1e-14)
    with pytest.raises(qd.QdiffError, match="2 and 1 qubits"):
        H + PauliSumOperator.from_strings(["X"], [1.0])
    with pytest.raises(qd.QdiffError, match="one element"):
        H * torch.tensor([1.0, 2.0])
    with pytest.raises(TypeError):
        H * H


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.complex64, torch.float64])
def test_scalar_arithmetic_keeps_the_coefficient_dtype_as_torch_does(dtype):
    """A Python number or 0-d tensor does not promote the coefficients (torch's rule for
    ``float32_tensor * 2.0``), so a float32 operator shifted by a number is still solved in
    float32; a complex number makes a real operator complex of the same precision."""
    H = PauliSumOperator.from_strings(["XZ", "YY"], torch.tensor([1.0, 0.5], dtype=dtype))
    t = torch.tensor(0.7, dtype=torch.float64)
    for op in (H + 3.0, 3 - H, H - 1, 2 * H, H * 2, H / 4, H * t, H + t, -H, H + H):
        assert op.coeffs.dtype == dtype
    assert (H + 0.5j).coeffs.dtype == torch.promote_types(dtype, torch.complex64)
    assert (H * torch.tensor([2.0], dtype=torch.float64)).coeffs.dtype == \
        torch.promote_types(dtype, torch.float64)  # a dimensioned tensor promotes, as in torch
    assert torch.allclose((3 - H / 4).to_dense(), 3 * torch.eye(4, dtype=torch.complex128)
                          - H.to_dense() / 4, atol=1e-3 if dtype == torch.float16 else 1e-6)
    if dtype in (torch.float32, torch.complex64):
        b = torch.ones(4, dtype=torch.float32)
        x, _ = qd.cg(H + 3.0, b)
        assert x.dtype == dtype and qd.ground_state(H - 1)[0].dtype == torch.float32


def test_an_operator_without_terms_is_the_zero_operator():
    op = PauliSumOperator([], torch.zeros(0, dtype=torch.float64), 2)
    psi = random_states(3, 2, 6)
    assert torch.equal(op.apply(psi), torch.zeros_like(psi))
    assert torch.equal(op.expval(psi), torch.zeros(3, dtype=torch.float64))
    assert op.term_expvals(psi).shape == (3, 0)
    zero = torch.zeros(4, 4, dtype=torch.complex128)
    assert torch.equal(op.to_dense(), zero) and torch.equal(op.to_sparse_csr().to_dense(), zero)
    assert op.to_scipy().nnz == 0
    assert float(qd.eigsh(op, k=1)[0][0]) == 0.0


def test_coefficients_batched_by_vmap():
    """torch.func.vmap over the coefficients (the states plain): every method gives the
    loop's values; the native kernel, which reads raw memory, is left to plain tensors."""
    from torch.func import jacrev, vmap
    op = random_op(3, 8, 7)
    g = torch.Generator().manual_seed(1)
    cs = torch.randn(4, op.num_terms, dtype=torch.float64, generator=g)
    psi = random_states(2, 3, 8)
    ops = [op.with_coeffs(c) for c in cs]
    for f in (lambda o: o.apply(psi), lambda o: o.expval(psi), lambda o: o.term_expvals(psi),
              lambda o: o.to_dense()):
        got = vmap(lambda c: f(op.with_coeffs(c)))(cs)
        assert torch.allclose(got, torch.stack([f(o) for o in ops]), atol=1e-12)
    real = PauliSumOperator.from_strings(["XX", "ZI", "IZ"], torch.ones(3, dtype=torch.float64))
    x = torch.randn(4, dtype=torch.float64)
    got = vmap(lambda c: real.with_coeffs(c).apply(x))(cs[:, :3])
    assert torch.allclose(got, torch.stack([real.with_coeffs(c).apply(x) for c in cs[:, :3]]))
    # the states requiring grad beside batched coefficients
    p1 = psi[0].clone().requires_grad_()
    vmap(lambda c: op.with_coeffs(c).expval(p1))(cs).sum().backward()
    p2 = psi[0].clone().requires_grad_()
    sum(o.expval(p2) for o in ops).backward()
    assert torch.allclose(p1.grad, p2.grad, atol=1e-12)
    jac = vmap(jacrev(lambda c: op.with_coeffs(c).expval(psi)))(cs)
    assert torch.allclose(jac, op.term_expvals(psi).expand(4, -1, -1), atol=1e-12)


def test_first_use_inside_a_torch_func_transform():
    """qdiff's lazy front loads modules (and their constant tensors) on first use, which may
    be inside torch.func.grad."""
    import subprocess
    import sys
    code = ("import torch, qdiff as qd\n"
            "from torch.func import grad\n"
            "f = lambda x: (x * x).sum() if qd.RX.name == 'rx' else None\n"
            "print(grad(f)(torch.tensor([1.0, 2.0])).tolist())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["[2.0,", "4.0]"]


def test_from_strings_takes_a_list_of_strings():
    with pytest.raises(qd.QdiffError, match="takes a list of Pauli strings"):
        PauliSumOperator.from_strings("XZ", [1.0, 2.0])


def test_double_precision_matrices_of_a_single_precision_operator():
    """``to_dense(complex128)`` and ``to_sparse_csr(complex128)`` sum float32 coefficients in
    double precision, as ``apply`` does on complex128 states: the three agree to rounding."""
    op = random_op(4, 20, 9).to(dtype=torch.float32)
    dense = op.to_dense(torch.complex128)
    psi = random_states(3, 4, 10)
    assert torch.allclose(psi @ dense.T, op.apply(psi), atol=1e-14, rtol=0)
    assert torch.allclose(op.to_sparse_csr(torch.complex128).to_dense(), dense, atol=1e-15, rtol=0)
    for bad in (torch.bool, "complex128"):
        with pytest.raises(qd.QdiffError, match="dtype must be a floating or complex"):
            op.to_sparse_csr(bad)
        with pytest.raises(qd.QdiffError, match="dtype must be a floating or complex"):
            op.to_dense(bad)


def test_cached_diagonals_follow_the_coefficients_tensor_object():
    """The diagonals are cached per coefficients tensor: a new tensor at the address of the
    one before (same version count, other values) gets its own diagonals."""
    buf = bytearray(24)
    view = np.frombuffer(buf, dtype=np.float64)
    view[:] = (1.0, 2.0, 3.0)
    op = PauliSumOperator.from_strings(["ZI", "IZ", "XX"], torch.frombuffer(buf, dtype=torch.float64))
    psi = torch.tensor([[1.0, 0, 0, 0]], dtype=torch.complex128)
    assert op.expval(psi).item() == pytest.approx(3.0)
    view[:] = (5.0, 2.0, 3.0)
    op.coeffs = torch.frombuffer(buf, dtype=torch.float64)  # same address, version 0
    assert op.expval(psi).item() == pytest.approx(7.0)
    op.coeffs.mul_(2)  # in place: the version count moves
    assert op.expval(psi).item() == pytest.approx(14.0)


def test_operator_of_inference_tensors_under_inference_mode():
    psi = torch.tensor([[1.0, 0, 0, 0]], dtype=torch.complex128)
    with torch.inference_mode():
        op = PauliSumOperator.from_strings(["ZI", "IZ", "XX"], torch.tensor([1.0, 2.0, 3.0]))
        assert op.expval(psi).item() == pytest.approx(3.0)
        op.coeffs.mul_(2)
        assert op.expval(psi).item() == pytest.approx(6.0)
    assert op.expval(psi).item() == pytest.approx(6.0)


def test_diagonal_cache_emptied_by_another_thread_between_lookups():
    """Another thread may empty the operator's diagonal cache at any point: a lookup reads
    its entry once (emulated: the cache empties itself whenever it is asked for a key)."""
    op = random_op(3, 8, 4)
    psi = random_states(2, 3, 5)
    want = psi @ dense_ref(op).T

    class Emptied(dict):
        def __contains__(self, key):
            found = dict.__contains__(self, key)
            self.clear()
            return found

        def get(self, key, default=None):
            found = dict.get(self, key, default)
            self.clear()
            return found

    op._diag_cache = Emptied()
    for _ in range(3):
        assert torch.allclose(op.apply(psi), want, atol=1e-12, rtol=0)


def test_term_layout_built_twice_at_once_is_one_object(monkeypatch):
    """Two threads reading a new operator's term expectations at once: the second may run
    while the first builds the term layout (emulated deterministically by a read from inside
    the first build); both see a whole layout, and the one stored first."""
    op = random_op(3, 8, 6)
    psi = random_states(2, 3, 7)
    real_arange, inner = torch.arange, []

    def arange(*args, **kwargs):
        if not inner:
            inner.append(None)
            inner[0] = op.term_expvals(psi)
        return real_arange(*args, **kwargs)

    monkeypatch.setattr(torch, "arange", arange)
    outer = op.term_expvals(psi)
    monkeypatch.undo()
    assert inner and torch.allclose(outer, inner[0], atol=1e-12, rtol=0)
    assert torch.allclose(outer, op.with_coeffs(op.coeffs).term_expvals(psi), atol=1e-12, rtol=0)
