"""Lanczos against scipy eigsh; implicit gradients against finite differences; CG/MINRES."""
import random
import warnings

import numpy as np
import pytest
import scipy.sparse.linalg as sla
import math

import torch

import qdiff as qd
from conftest import TORCH_DEVICES
from qdiff.operators import PauliSumOperator
from qdiff.solvers import cg, ground_state, lanczos, minres
from qdiff.qchem import particle_number_mask

DEVICES = TORCH_DEVICES


def random_op(n, terms, seed, letters="XYZ"):
    rng = random.Random(seed)
    words = [{w: rng.choice(letters) for w in rng.sample(range(n), rng.randint(1, 3))}
             for _ in range(terms)]
    g = torch.Generator().manual_seed(seed)
    return PauliSumOperator(words, torch.randn(terms, generator=g, dtype=torch.float64), n)


def tfim(n, h=0.7, periodic=False):
    words, c = [], []
    for i in range(n if periodic else n - 1):
        words.append({i: "Z", (i + 1) % n: "Z"})
        c.append(-1.0)
    for i in range(n):
        words.append({i: "X"})
        c.append(-h)
    return PauliSumOperator(words, torch.tensor(c, dtype=torch.float64), n)


def scipy_lowest(op, k):
    return np.sort(sla.eigsh(op.to_scipy(), k=k, which="SA", tol=1e-14)[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,terms,k,seed,letters", [(6, 30, 1, 0, "XYZ"), (8, 40, 3, 1, "XYZ"),
                                                    (9, 50, 2, 2, "XZ"), (4, 10, 4, 3, "XYZ")])
def test_lanczos_matches_eigsh(n, terms, k, seed, letters, device):
    op = random_op(n, terms, seed, letters)
    ref = scipy_lowest(op, k)
    e, X, info = lanczos(op.to(device), k)
    assert info.converged
    assert np.allclose(e.cpu().numpy(), ref, atol=1e-9)
    # eigenvectors: residual and orthonormality
    for i in range(k):
        r = op.to(device).apply(X[i]) - e[i] * X[i]
        assert float(r.norm()) < 1e-7
    G = X.conj() @ X.T
    assert torch.allclose(G, torch.eye(k, dtype=G.dtype, device=G.device), atol=1e-10)


def test_lanczos_spin_chain_12_qubits_and_restart_small_basis():
    op = tfim(12, periodic=True)
    ref = scipy_lowest(op, 2)
    e, _, info = lanczos(op, 2, max_basis=12)
    assert info.converged and info.iterations > 0  # restarted at least once
    assert np.allclose(e.numpy(), ref, atol=1e-9)


def test_lanczos_overflow_is_a_qdiff_error():
    """Coefficients near the float64 limit overflow the recurrence: a QdiffError saying so,
    not a LinAlgError from eigh or a NaN energy (the TFIM example with --field 1e308)."""
    terms = [qd.PauliZ(i) @ qd.PauliZ(i + 1) for i in range(3)] + [qd.PauliX(i) for i in range(4)]
    H = sum((c * t for c, t in zip([-1.0] * 3 + [-1e308] * 4, terms)), 0 * qd.PauliZ(0))
    op = PauliSumOperator.from_observable(H, 4)
    with pytest.raises(qd.QdiffError, match="overflowed"):
        ground_state(op)


def test_lanczos_in_particle_number_sector():
    mol = qd.qchem.molecule("H2")
    op = PauliSumOperator.from_observable(mol.hamiltonian, mol.n_qubits)
    mask = particle_number_mask(4, 2)
    M = op.to_dense().numpy()
    idx = np.nonzero(mask.numpy())[0]
    ref = np.linalg.eigvalsh(M[np.ix_(idx, idx)])[0]
    e, X, info = lanczos(op, 1, mask=mask)
    assert abs(float(e[0]) - ref) < 1e-9
    assert float(X[0][~mask].abs().max()) == 0.0


def test_lanczos_dense_tensor_and_callable():
    A = torch.randn(40, 40, dtype=torch.float64)
    A = A + A.T
    ref = torch.linalg.eigvalsh(A)[:2]
    e, _, _ = lanczos(A, 2)
    assert torch.allclose(e, ref, atol=1e-9)
    e2, _, _ = lanczos(lambda v: A @ v, 2, n=40, dtype=torch.float64)
    assert torch.allclose(e2, ref, atol=1e-9)
    with pytest.raises(qd.QdiffError, match="dimension"):
        lanczos(lambda v: A @ v, 1)


def test_lanczos_reports_non_convergence():
    op = tfim(10)
    with pytest.warns(UserWarning, match="did not converge"):
        _, _, info = lanczos(op, 1, maxiter=5, max_basis=5)
    assert not info.converged and info.matvecs <= 10 and info.maxiter == 5


def heisenberg_ring(n):
    obs = None
    for i in range(n):
        j = (i + 1) % n
        t = qd.X(i) @ qd.X(j) + qd.Y(i) @ qd.Y(j) + qd.Z(i) @ qd.Z(j)
        obs = t if obs is None else obs + t
    return PauliSumOperator.from_observable(obs, n)


def degenerate_operators():
    pauli3 = PauliSumOperator.from_observable(
        0.5 * qd.Z(0) @ qd.Z(1) - 0.3 * qd.X(1) @ qd.Y(2) + 0.2 * qd.Y(0) + 1.1 * qd.I(0), 3)
    zz = PauliSumOperator.from_observable(qd.Z(0) @ qd.Z(1) + qd.Z(1) @ qd.Z(2)
                                          + 0.5 * qd.Z(3) @ qd.Z(4), 5)
    d = torch.tensor([3., 1, 1, 1, 2, 2, 0, 0, 5, 1, 0, 2, 7, 7, 7, 1], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    Q, _ = torch.linalg.qr(torch.randn(40, 40, generator=g, dtype=torch.complex128))
    ev = torch.tensor([0.] * 5 + [1.] * 5 + list(range(2, 32)), dtype=torch.float64)
    return {"pauli3": pauli3, "heisenberg6": heisenberg_ring(6), "zz5": zz,
            "diag": torch.diag(d), "diag_sparse": torch.diag(d).to_sparse(),
            # no breakdown here: the copies lie outside the start vector's Krylov space
            "complex_mult5": (Q * ev.to(Q.dtype)) @ Q.conj().T}


@pytest.mark.parametrize("name", ["pauli3", "heisenberg6", "zz5", "diag", "diag_sparse",
                                  "complex_mult5"])
@pytest.mark.parametrize("which", ["SA", "LA"])
def test_lanczos_degenerate_spectra_vs_eigvalsh(name, which):
    A = degenerate_operators()[name]
    M = A.to_dense()
    N = M.shape[0]
    ref = torch.linalg.eigvalsh(M)
    for k in sorted({1, 2, 3, 5, N // 2, N - 1, N}):
        for seed in ((0, 7) if k == 3 else (1,)):
            e, X, info = qd.eigsh(A, k, which=which, seed=seed)
            assert e.shape == (k,) and X.shape == (k, N) and info.converged
            exp = ref[:k] if which == "SA" else ref[N - k:]
            assert torch.allclose(e, exp, atol=1e-9), (k, seed, e, exp)
            Xc = X.to(torch.complex128)
            r = torch.linalg.vector_norm(Xc @ M.T.to(Xc.dtype) - e[:, None] * Xc, dim=1)
            assert float(r.max()) < 1e-8 and info.residual <= 1e-8
            G = X.conj() @ X.T
            assert torch.allclose(G, torch.eye(k, dtype=G.dtype), atol=1e-10)


@pytest.mark.parametrize("low", [[-1.0, -0.99, -0.99, -0.98], [-1.0, -0.999, -0.999, -0.998]])
def test_lanczos_finds_the_copy_of_a_degenerate_level_in_a_tight_cluster(low):
    """A degenerate pair just above the ground state of a spectrum 100x wider than the
    cluster: the copy converges slowly from a fresh direction, and k = 3, 4 must hold it (the
    cycles after locking converge the pair above the locked ones before accepting)."""
    g = torch.Generator().manual_seed(0)
    N = 512
    Q, _ = torch.linalg.qr(torch.randn(N, N, generator=g, dtype=torch.float64))
    lam = torch.cat([torch.tensor(low, dtype=torch.float64),
                     torch.linspace(-0.97, 100.0, N - len(low), dtype=torch.float64)])
    A = (Q * lam) @ Q.T
    A = 0.5 * (A + A.T)
    for k in (2, 3, 4):
        e, X, info = lanczos(A, k, tol=1e-10)
        assert info.converged
        assert torch.allclose(e, lam[:k], atol=1e-9), (k, e, lam[:k])


def test_lanczos_smallest_bases_still_converge():
    """A basis of k + 1 vectors leaves no room for the pair above the k: the check for
    missing copies is skipped there, and the k pairs converge as before."""
    for k, m in ((2, 3), (2, 4)):
        e, _, info = lanczos(tfim(10), k, max_basis=m, tol=1e-9, maxiter=4000)
        ref = torch.linalg.eigvalsh(tfim(10).to_dense())[:k]
        assert info.converged, (k, m, info)
        assert torch.allclose(e, ref, atol=1e-8)


@pytest.mark.parametrize("n", [4, 6])
def test_lanczos_single_precision_few_levels(n):
    """A ring of ZZ terms in float32 (five levels): its Krylov space is invariant after a few
    steps, and the rounding noise left (1e-7 of A v, not 1e-16) is no new direction."""
    words = [{i: "Z", (i + 1) % n: "Z"} for i in range(n)]
    H = PauliSumOperator(words, -torch.ones(n, dtype=torch.float32), n)
    e, _, info = lanczos(H, 1, tol=1e-5)
    assert info.converged and abs(float(e[0]) + n) < 1e-4
    e0, _, _ = qd.ground_state(H, tol=1e-5)
    assert abs(float(e0) + n) < 1e-4


def test_lanczos_callable_returning_its_input():
    """An operator callable may return the very vector it was given (the identity): the
    Krylov basis must not be changed through it."""
    e, X, info = lanczos(lambda v: v, 2, n=8)
    assert info.converged and torch.allclose(e, torch.ones(2, dtype=e.dtype))
    assert torch.allclose(X @ X.T, torch.eye(2, dtype=X.dtype), atol=1e-12)


def test_lanczos_degenerate_in_mask_and_with_start_vector():
    # diagonal operator with a 3-fold lowest level inside the sector and a lower state outside
    d = torch.tensor([-5., 0, 0, 1, 0, 2, 2, 3], dtype=torch.float64)
    mask = torch.tensor([0, 1, 1, 1, 1, 1, 1, 1], dtype=torch.bool)
    e, X, info = lanczos(torch.diag(d), 4, mask=mask)
    assert info.converged and e.tolist() == pytest.approx([0, 0, 0, 1], abs=1e-12)
    assert float(X[:, 0].abs().max()) == 0.0
    # a start vector inside one symmetry sector still yields the lowest of the whole operator
    v0 = torch.zeros(8, dtype=torch.float64)
    v0[1:] = 1.0
    e, _, info = lanczos(torch.diag(d), 2, v0=v0)
    assert info.converged and e.tolist() == pytest.approx([-5, 0], abs=1e-12)


def test_lanczos_k_and_which_checked():
    op = tfim(3)
    with pytest.raises(qd.QdiffError, match="k must be"):
        lanczos(op, 9)
    with pytest.raises(qd.QdiffError, match="k must be"):
        lanczos(op, 0)
    with pytest.raises(qd.QdiffError, match="number of states in mask"):
        lanczos(op, 4, mask=particle_number_mask(3, 1))
    with pytest.raises(qd.QdiffError, match="which"):
        qd.eigsh(op, 1, which="SM")
    e, _, info = qd.eigsh(op, 8)
    assert info.converged and torch.allclose(e, torch.linalg.eigvalsh(op.to_dense()), atol=1e-12)


@pytest.mark.parametrize("letters", ["XZ", "XYZ"])
def test_ground_state_implicit_gradient_vs_finite_differences(letters):
    op = random_op(7, 25, 5, letters)
    obs = PauliSumOperator([{0: "Z", 3: "Z"}, {2: "X"}], [0.7, -0.4], 7)

    def loss(c):
        e, psi, _ = ground_state(op.with_coeffs(c), tol=1e-12)
        return e + obs.expval(psi)

    c = op.coeffs.clone().requires_grad_()
    e, psi, info = ground_state(op.with_coeffs(c), tol=1e-12)
    (e + obs.expval(psi)).backward()
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):  # directional finite differences along random directions
        d = torch.randn(c.shape, generator=gen, dtype=torch.float64)
        h = 1e-5
        fd = (float(loss(op.coeffs + h * d)) - float(loss(op.coeffs - h * d))) / (2 * h)
        assert abs(float(c.grad @ d) - fd) < 1e-7 * max(1.0, abs(fd))
    assert info.backward is not None and info.backward.converged
    # energy alone: Hellmann-Feynman gives the term expectations
    c2 = op.coeffs.clone().requires_grad_()
    e2, psi2, _ = ground_state(op.with_coeffs(c2))
    e2.backward()
    assert torch.allclose(c2.grad, op.term_expvals(psi2.detach()), atol=1e-12)


def test_ground_state_gradcheck():
    op = random_op(5, 12, 8, "XZ")
    c = op.coeffs.clone().requires_grad_()
    obs = PauliSumOperator([{1: "Z"}], [1.0], 5)

    def f(c):
        e, psi, _ = ground_state(op.with_coeffs(c), tol=1e-13)
        return torch.stack([e, obs.expval(psi)])
    assert torch.autograd.gradcheck(f, (c,), atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("solver", [cg, minres])
def test_linear_solvers_match_direct_and_gradcheck(solver, device):
    g = torch.Generator().manual_seed(0)
    A = torch.randn(8, 8, generator=g, dtype=torch.float64)
    A = (A @ A.T + 8 * torch.eye(8, dtype=torch.float64)).to(device).requires_grad_()
    b = torch.randn(2, 8, generator=g, dtype=torch.float64).to(device).requires_grad_()
    x, info = solver(A, b, tol=1e-12)
    assert info.converged and info.iterations <= info.maxiter
    assert torch.allclose(x, torch.linalg.solve(A, b.T).T, atol=1e-10)
    assert torch.autograd.gradcheck(lambda A, b: solver(A, b, tol=1e-13)[0], (A, b))
    x.sum().backward()
    assert info.backward is not None and info.backward.converged


def test_minres_indefinite_and_complex_hermitian():
    g = torch.Generator().manual_seed(1)
    M = torch.randn(30, 30, generator=g, dtype=torch.complex128)
    M = M + M.conj().T  # Hermitian, indefinite
    b = torch.randn(30, generator=g, dtype=torch.complex128)
    x, info = minres(M, b, tol=1e-12)
    assert info.converged
    assert torch.allclose(x, torch.linalg.solve(M, b), atol=1e-9)
    x2, _ = minres(M, b, shift=0.5, tol=1e-12)
    assert torch.allclose(x2, torch.linalg.solve(M - 0.5 * torch.eye(30), b), atol=1e-9)


def test_solve_with_pauli_operator_coefficient_gradient():
    op = random_op(4, 6, 4)
    n_id = PauliSumOperator([{}], [1.0], 4)
    shift = float(op.coeffs.abs().sum()) + 1.0  # makes H + shift*I positive definite
    words = op.words + n_id.words
    c = torch.cat([op.coeffs, torch.tensor([shift], dtype=torch.float64)]).requires_grad_()
    b = torch.randn(16, dtype=torch.complex128)

    def f(c):
        x, _ = cg(PauliSumOperator(words, c, 4), b, tol=1e-13)
        return (x.conj() * x).real.sum()
    assert torch.autograd.gradcheck(f, (c,))
    A = PauliSumOperator(words, c.detach(), 4).to_dense()
    x, _ = cg(PauliSumOperator(words, c.detach(), 4), b, tol=1e-13)
    assert torch.allclose(x, torch.linalg.solve(A, b), atol=1e-10)


def test_cg_iteration_cap_reported():
    A = torch.diag(torch.linspace(1, 1000, 200, dtype=torch.float64))
    b = torch.ones(200, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        _, info = cg(A, b, tol=1e-12, maxiter=3)
    assert not info.converged and info.iterations == 3 and info.residual > 1e-12
    assert any("cg stopped after 3" in str(x.message) for x in w)
    with pytest.raises(qd.QdiffError, match="length 5"):
        cg(A, torch.ones(5, dtype=torch.float64))


def test_ground_state_energy_gradient_with_two_y_terms_vs_finite_differences():
    # a real Hamiltonian whose terms carry two Y factors (as every Jordan-Wigner molecule does)
    op = PauliSumOperator.from_strings(["ZII", "IZI", "IIZ", "XXI", "IYY", "ZXZ", "YIY"],
                                       [1.0, -0.5, 0.3, 0.7, 0.2, -0.4, 0.25])
    assert op.real_matrix
    c = op.coeffs.clone().requires_grad_()
    e, psi, _ = ground_state(op.with_coeffs(c), tol=1e-13)
    e.backward()
    h = 1e-6
    for t in range(op.num_terms):
        d = torch.zeros_like(op.coeffs)
        d[t] = h
        fd = (float(ground_state(op.with_coeffs(op.coeffs + d), tol=1e-13)[0])
              - float(ground_state(op.with_coeffs(op.coeffs - d), tol=1e-13)[0])) / (2 * h)
        assert abs(float(c.grad[t]) - fd) < 1e-6, op.words[t]
    obs = PauliSumOperator.from_strings(["XYY", "ZZI"], [0.6, -0.3])
    f = lambda c: obs.expval(ground_state(op.with_coeffs(c), tol=1e-13)[1])  # noqa: E731
    assert torch.autograd.gradcheck(f, (op.coeffs.clone().requires_grad_(),), atol=1e-6)


def test_large_eigenproblems_refused_before_allocating():
    big = PauliSumOperator.from_strings(["Z" * 40, "X" * 40], [1.0, 0.5])
    with pytest.raises(qd.QdiffMemoryError, match="Krylov basis"):
        qd.eigsh(big, 1)
    with pytest.raises(qd.QdiffMemoryError):
        ground_state(big)
    with pytest.raises(qd.QdiffMemoryError, match="Krylov basis"):
        lanczos(lambda v: v, 1, n=2 ** 40)
    with pytest.raises(qd.QdiffMemoryError, match="basis states"):
        particle_number_mask(50, 2)
    with pytest.raises(qd.QdiffError, match="n_qubits"):
        particle_number_mask(-1, 2)


def test_lanczos_follows_operator_precision_and_refuses_mismatched_inputs():
    g = torch.Generator().manual_seed(4)
    A = torch.randn(12, 12, generator=g, dtype=torch.complex128)
    A = A + A.conj().T
    ref = torch.linalg.eigvalsh(A)
    for dt, atol in ((torch.complex64, 1e-4), (torch.complex128, 1e-10)):
        e, x, info = qd.eigsh(A.to(dt), 2)
        assert x.dtype == dt and info.converged
        assert torch.allclose(e.double(), ref[:2], atol=atol)
    S = (A.real + A.real.T).float()
    e, x, info = qd.eigsh(S, 3, which="LA")
    assert x.dtype == torch.float32 and info.converged
    assert torch.allclose(e.double(), torch.linalg.eigvalsh(S.double())[-3:], atol=1e-4)
    op = random_op(5, 14, 2)
    e32, _, info = qd.eigsh(op.with_coeffs(op.coeffs.float()), 2)
    assert info.converged and torch.allclose(e32.double(), scipy_torch(op, 2), atol=1e-4)
    # a real start vector for a complex operator: the iteration runs in complex
    e, x, _ = qd.eigsh(A, 1, v0=torch.ones(12, dtype=torch.float64))
    assert x.is_complex() and abs(float(e[0] - ref[0])) < 1e-10
    with pytest.raises(qd.QdiffError, match="imaginary"):
        qd.eigsh(A, 1, dtype=torch.float64)
    with pytest.raises(qd.QdiffError, match="v0 must have shape"):
        qd.eigsh(A, 1, v0=torch.ones(5))
    with pytest.raises(qd.QdiffError, match="NaN"):
        qd.eigsh(A, 1, v0=torch.full((12,), float("nan")))


def scipy_torch(op, k):
    return torch.tensor(scipy_lowest(op, k))


def test_linear_solvers_promote_mixed_dtypes_and_check_x0():
    g = torch.Generator().manual_seed(6)
    M = torch.randn(6, 6, generator=g, dtype=torch.complex128)
    A = M @ M.conj().T + 6 * torch.eye(6)
    br = torch.randn(6, generator=g, dtype=torch.float64)
    for solver in (cg, minres):
        x, info = solver(A, br)
        assert info.converged and torch.allclose(x, torch.linalg.solve(A, br.to(A.dtype)))
        S = (A.real + A.real.T).float()
        bc = br.to(torch.complex128) * (1 + 1j)
        x, _ = solver(S, bc)  # real float32 matrix, complex128 right-hand side
        assert x.dtype == torch.complex128
        assert torch.allclose(x, torch.linalg.solve(S.double().to(bc.dtype), bc), atol=1e-12)
        x, _ = solver(A, br.numpy())
        assert torch.allclose(x, torch.linalg.solve(A, br.to(A.dtype)))
        with pytest.raises(qd.QdiffError, match="x0 must have the shape"):
            solver(A, br, x0=torch.ones(3))
    x, _ = cg(A, br, x0=torch.ones(6))  # a real start for a complex system
    assert torch.allclose(x, torch.linalg.solve(A, br.to(A.dtype)))
    with pytest.raises(qd.QdiffError, match="length 5"):
        minres(A, torch.ones(5), shift=0.5)
    # gradient of a real right-hand side through a complex system, against a direct solve
    b1 = br.clone().requires_grad_()
    b2 = br.clone().requires_grad_()
    w = torch.randn(6, generator=g, dtype=torch.complex128)
    (w.conj() * cg(A, b1)[0]).real.sum().backward()
    (w.conj() * torch.linalg.solve(A, b2.to(A.dtype))).real.sum().backward()
    assert b1.grad.dtype == torch.float64 and torch.allclose(b1.grad, b2.grad, atol=1e-12)


@pytest.mark.parametrize("call", [
    lambda A, b: qd.lanczos(A, tol=-1e-3), lambda A, b: qd.eigsh(A, tol=float("nan")),
    lambda A, b: qd.lanczos(A, maxiter=0), lambda A, b: qd.cg(A, b, maxiter=0),
    lambda A, b: qd.minres(A, b, tol=True), lambda A, b: qd.cg(A, b, maxiter=2.5)])
def test_stopping_criteria_are_checked(call):
    """A negative or NaN tol would report convergence that never happened, maxiter=0 would run
    the default cap: both are refused."""
    A = torch.diag(torch.arange(1.0, 6.0, dtype=torch.float64))
    with pytest.raises(qd.QdiffError, match="tol|maxiter"):
        call(A, torch.ones(5, dtype=torch.float64))


def test_minres_converged_means_the_true_residual_meets_tol():
    """At a tol near rounding the recurrence's residual estimate meets tol before the true
    residual does: MINRES restarts from its iterate and reports converged only when the true
    residual is at most tol (else a warning)."""
    torch.manual_seed(0)
    n = 60
    q, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64))
    A = q @ torch.diag(torch.linspace(-1, 1, n, dtype=torch.float64) + 0.013) @ q.T
    b = torch.randn(3, n, dtype=torch.float64)
    for tol in (1e-8, 3e-15):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            x, info = minres(A, b, tol=tol)
        true = float((torch.linalg.vector_norm(b - x @ A.T, dim=-1)
                      / torch.linalg.vector_norm(b, dim=-1)).max())
        assert info.residual == pytest.approx(true, rel=1e-6)
        assert info.converged == (true <= tol)
    assert minres(A, b, tol=1e-8)[1].converged


@pytest.mark.parametrize("layout", ["dense", "coo", "csr"])
def test_matrices_that_are_not_hermitian_or_finite_are_refused(layout):
    """eigsh/cg/minres on a matrix tensor: one that is not Hermitian (an eigenvalue of it, a
    CG iterate would be returned without a word) or has NaN entries is refused by name."""
    a = torch.tensor([[1, 1j], [1j, 2]], dtype=torch.complex128)
    nan = torch.tensor([[1.0, float("nan")], [float("nan"), 2.0]], dtype=torch.float64)

    def as_layout(m):
        return {"dense": m, "coo": m.to_sparse_coo(), "csr": m.to_sparse_csr()}[layout]
    b = torch.ones(2, dtype=torch.complex128)
    for call in (lambda m: qd.eigsh(m), lambda m: qd.cg(m, b.to(m.dtype)),
                 lambda m: qd.minres(m, b.to(m.dtype))):
        with pytest.raises(qd.QdiffError, match="not Hermitian"):
            call(as_layout(a))
        with pytest.raises(qd.QdiffError, match="NaN or infinite"):
            call(as_layout(nan))
    herm = torch.tensor([[2, 1j], [-1j, 3]], dtype=torch.complex128)
    vals, _, _ = qd.eigsh(as_layout(herm))
    assert abs(float(vals[0]) - (2.5 - math.sqrt(1.25))) < 1e-9


def test_ground_state_gradient_of_a_degenerate_ground_space_is_refused():
    """H = Z0 on two qubits: the ground space is 2-fold degenerate, the ground state (and any
    gradient of it) undefined: refused by name instead of gradients of 1e15; the energy's
    gradient is still given."""
    c = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64, requires_grad=True)
    H = qd.PauliSumOperator.from_strings(["ZI", "IZ", "IX"], c)
    e, psi, _ = qd.ground_state(H)
    (ge,) = torch.autograd.grad(e, c, retain_graph=True)
    assert abs(float(ge[0]) + 1) < 1e-9  # dE/dc_ZI = <ZI> = -1 on the ground space
    ix = qd.PauliSumOperator.from_strings(["IX"], torch.tensor([1.0], dtype=torch.float64))
    with pytest.raises(qd.QdiffError, match="ground space is degenerate"):
        torch.autograd.grad(ix.expval(psi), c)


def test_solver_calls_that_do_not_fit_are_qdiff_errors_naming_what_is_wrong():
    eye = torch.eye(2, dtype=torch.float64)
    b = torch.ones(2, dtype=torch.float64)
    with pytest.raises(qd.QdiffError, match=r"lanczos: .*'foo' \(its arguments: A, k, v0"):
        qd.eigsh(eye, k=1, foo=1)
    with pytest.raises(qd.QdiffError, match=r"cg: .*'atol'"):
        qd.cg(eye, b, atol=1e-3)
    with pytest.raises(qd.QdiffError, match=r"minres: .*'rtol'"):
        qd.minres(eye, b, rtol=1e-3)
    with pytest.raises(qd.QdiffError, match=r"returned \(3,\) for a vector of shape \(4,\)"):
        qd.eigsh(lambda v: v[..., :3], k=1, n=4)
    a = PauliSumOperator.from_strings(["XZ", "YY"], torch.tensor([0.5, -0.2], dtype=torch.float64))
    with pytest.raises(qd.QdiffError, match="applies to a state tensor"):
        a @ a
    obs = 0.5 * qd.Z("q") @ qd.X("r") + qd.Y("r")
    with pytest.raises(qd.QdiffError, match="wire label 'q' is not an integer"):
        qd.eigsh(obs, k=1)


def test_ground_state_arguments_are_checked_and_array_masks_taken():
    # XX and ZI keep the parity sector {|00>, |11>} of the mask below
    op = PauliSumOperator.from_strings(["ZZ", "XX", "ZI"],
                                       torch.tensor([1.0, 0.4, 0.3], dtype=torch.float64))
    with pytest.raises(qd.QdiffError, match="n_qubits=3: the operator acts on 2 qubits"):
        ground_state(op, n_qubits=3)
    for kw, msg in ((dict(max_basis=0), "max_basis must be an integer >= 2"),
                    (dict(seed="x"), "seed must be an integer")):
        with pytest.raises(qd.QdiffError, match=msg):
            ground_state(op, **kw)
    mask = np.array([True, False, False, True])
    e_t = ground_state(op, mask=torch.as_tensor(mask))[0]
    for m in (mask, mask.tolist()):
        assert abs(float(ground_state(op, mask=m)[0]) - float(e_t)) < 1e-10


def test_a_mask_the_operator_does_not_preserve_is_refused():
    """The pairs found in such a mask are those of the projected operator, not eigenpairs."""
    op = PauliSumOperator.from_strings(["ZZ", "XI"],
                                       torch.tensor([1.0, 0.4], dtype=torch.float64))
    mask = torch.tensor([True, False, False, True])
    for call in (lambda: lanczos(op, 1, mask=mask), lambda: ground_state(op, mask=mask),
                 lambda: lanczos(op.to_dense(), 2, mask=mask)):
        with pytest.raises(qd.QdiffError, match="does not preserve mask"):
            call()
    # a sector it keeps (XX flips both bits) is taken
    kept = PauliSumOperator.from_strings(["ZZ", "XX"],
                                         torch.tensor([1.0, 0.4], dtype=torch.float64))
    assert abs(float(lanczos(kept, 1, mask=mask)[0][0]) - 0.6) < 1e-10  # ZZ = 1 there


def test_solvers_take_pennylane_observables_and_integer_matrices():
    qml = pytest.importorskip("pennylane")
    H = qml.PauliZ(0) @ qml.PauliZ(1) + 0.5 * qml.PauliX(1)
    ref = np.linalg.eigvalsh(qml.matrix(H, wire_order=[0, 1]))
    e, _, _ = lanczos(H, 2)
    assert np.allclose(e.numpy(), ref[:2], atol=1e-10)
    assert abs(float(ground_state(H)[0]) - ref[0]) < 1e-10
    adjacency = torch.tensor([[False, True, True], [True, False, True], [True, True, False]])
    assert np.allclose(lanczos(adjacency, 3)[0].numpy(), [-1, -1, 2], atol=1e-10)
    x, _ = cg(adjacency.to(torch.int64) + 2 * torch.eye(3, dtype=torch.int64),
              torch.ones(3, dtype=torch.float64))
    assert torch.allclose(x, torch.full((3,), 0.25, dtype=torch.float64))


@pytest.mark.parametrize("call, msg", [
    (lambda A, b: lanczos(A.half(), 1), "float16 is not supported"),
    (lambda A, b: lanczos(A, 1, dtype=torch.bfloat16), "bfloat16 is not supported"),
    (lambda A, b: cg(A.half(), b.half()), "float16 is not supported"),
    (lambda A, b: minres(A.bfloat16(), b.bfloat16()), "bfloat16 is not supported"),
    (lambda A, b: lanczos(A, 1, dtype="float64"), "dtype must be a torch dtype"),
    (lambda A, b: lanczos(A, 1, device="nowhere"), "device must be a torch device"),
    (lambda A, b: lanczos(A, 1, n=5), "n=5, but the operator is 3x3"),
    (lambda A, b: lanczos(lambda v: v, 1, n=4.0), "n must be an integer >= 1"),
    (lambda A, b: lanczos(torch.zeros(0, 0), 1), "the operator is 0x0"),
    (lambda A, b: minres(A, b, shift=1j), "shift must be a finite real number"),
    (lambda A, b: minres(A, b, shift=float("nan")), "shift must be a finite real number"),
    (lambda A, b: minres(A, b, shift="1"), "shift must be a finite real number"),
    (lambda A, b: minres(A, b, shift=torch.tensor(0.5, requires_grad=True)),
     "shift requires grad"),
    (lambda A, b: cg(A, b, M=2.0), "M \\(the preconditioner\\) must be a callable"),
    (lambda A, b: cg(A, b, M=lambda r: r[:2]), "the preconditioner M returned \\(2,\\)"),
    (lambda A, b: cg(A, b, params=3), "params must be a list of the tensors"),
    (lambda A, b: minres(A, b, params=[A, 3]), "params must be a list of the tensors"),
])
def test_solver_arguments_that_would_mislead_are_refused(call, msg):
    """Half precision would report a tolerance met in float16 arithmetic; a shift that
    requires grad would get no gradient; the rest would end in a raw torch error."""
    A = torch.tensor([[4.0, 1.0, 0.0], [1.0, 3.0, 0.0], [0.0, 0.0, 2.0]], dtype=torch.float64)
    b = torch.ones(3, dtype=torch.float64)
    with pytest.raises(qd.QdiffError, match=msg):
        call(A, b)
    x, _ = minres(A, b, shift=torch.tensor(0.5))  # a plain 0-d tensor is a number
    assert torch.allclose(x, torch.linalg.solve(A - 0.5 * torch.eye(3, dtype=A.dtype), b))


def test_ground_state_state_gradient_in_single_precision():
    """The backward solve stops at what float32 can reach (asked for 1e-10 it drifted away
    and gave gradients off by ~100); one that stops short says so."""
    strings = ["ZZI", "XIX", "IYY", "ZIZ", "XYZ", "IIX", "YZY"]
    c0 = torch.randn(7, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    obs = PauliSumOperator.from_strings(["ZXI", "IIZ"], [0.7, -0.3])

    def grad(dtype, **kw):
        c = c0.to(dtype).detach().requires_grad_()
        e, psi, info = ground_state(PauliSumOperator.from_strings(strings, c), **kw)
        (e + obs.expval(psi)).backward()
        return c.grad.double(), info

    ref, _ = grad(torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g, info = grad(torch.float32)
    assert info.backward.converged and torch.allclose(g, ref, atol=1e-4)
    with pytest.warns(UserWarning, match="backward solve for the state's gradient stopped"):
        grad(torch.float64, maxiter=2)


def test_solvers_under_torch_func():
    """torch.func.grad takes the same implicit backward as autograd; vmap and forward mode
    are refused by name (the iterations branch on the vectors' values)."""
    from torch.func import grad, jacfwd, vmap
    op = PauliSumOperator.from_strings(["ZZ", "XI", "IX", "YY"],
                                       torch.tensor([1.0, 0.4, 0.3, 0.2], dtype=torch.float64))
    obs = PauliSumOperator.from_strings(["ZI", "XX"], [0.7, 0.5])

    def loss(c):
        e, psi, _ = ground_state(op.with_coeffs(c))
        return e + obs.expval(psi)

    c = op.coeffs.clone().requires_grad_()
    loss(c).backward()
    assert torch.allclose(grad(loss)(op.coeffs), c.grad, atol=1e-12)
    A = torch.tensor([[4.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    b = torch.tensor([1.0, 2.0], dtype=torch.float64)
    x = torch.linalg.solve(A, b)
    w = torch.linalg.solve(A, torch.ones(2, dtype=torch.float64))
    for solver in (cg, minres):
        assert torch.allclose(grad(lambda b: solver(A, b)[0].sum())(b), w, atol=1e-12)
        assert torch.allclose(grad(lambda A: solver(A, b)[0].sum())(A), -torch.outer(w, x),
                              atol=1e-12)
    for call in (lambda: vmap(loss)(op.coeffs.expand(2, -1)),
                 lambda: jacfwd(loss)(op.coeffs),
                 lambda: vmap(lambda b: cg(A, b)[0])(b.expand(3, -1)),
                 lambda: jacfwd(lambda b: minres(A, b)[0])(b),
                 lambda: vmap(lambda A: lanczos(A, 1)[0])(A.expand(2, -1, -1))):
        with pytest.raises(qd.QdiffError, match="no batching or forward-mode rule"):
            call()


def test_lanczos_refuses_an_operator_that_requires_grad():
    """Its pairs come back detached: a loss built on them would get no gradient from them."""
    A = torch.tensor([[2.0, 1.0], [1.0, 2.0]], dtype=torch.float64, requires_grad=True)
    op = PauliSumOperator.from_strings(["ZZ", "XI"], torch.tensor([1.0, 0.5], requires_grad=True))
    from torch.func import grad
    for call in (lambda: lanczos(A, 1), lambda: qd.eigsh(op, 2),
                 lambda: grad(lambda M: lanczos(M, 1)[0].sum())(A.detach())):
        with pytest.raises(qd.QdiffError, match="requires grad, but its eigenpairs are not"):
            call()
    with torch.no_grad():
        assert abs(float(lanczos(A, 1)[0][0]) - 1.0) < 1e-12
    assert abs(float(lanczos(A.detach(), 1)[0][0]) - 1.0) < 1e-12
