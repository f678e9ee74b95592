"""Eigen- and linear solvers in torch with implicit gradients.

* :func:`eigsh` / :func:`lanczos`: the lowest eigenpairs of a Hermitian operator (a
  :class:`~qdiff.operators.PauliSumOperator`, a dense or sparse tensor, or a matvec callable) by
  thick-restart Lanczos with full reorthogonalization; memory ``(max_basis + 1)`` vectors.
* :func:`ground_state`: the lowest eigenpair of a Pauli-sum Hamiltonian, differentiable with
  respect to its coefficients without unrolling the iterations: ``dE0/dc_t = <psi0|P_t|psi0>``
  (Hellmann-Feynman) and, for the state, ``dpsi0 = -(H - E0)^+ dH psi0`` (first-order
  perturbation theory) whose vector-Jacobian product costs one projected linear solve.
* :func:`cg` and :func:`minres`: Krylov linear solvers whose backward solves the adjoint system
  ``A^H lambda = grad_x`` (implicit differentiation) instead of differentiating through the
  iterations; convergence is reported in a :class:`SolverInfo`.

Everything follows the device and dtype of the input tensors.

>>> import torch, qdiff as qd
>>> H = qd.PauliSumOperator.from_strings(["ZI", "IZ", "XX"], [1.0, 0.5, 0.3])
>>> e, psi, info = qd.ground_state(H)
>>> round(float(e), 6), info.converged
(-1.529706, True)
"""
from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from qdiff.circuits import memory
from qdiff.circuits.errors import QdiffError, checked_call
from qdiff.operators import PauliSumOperator, as_operator


@dataclass
class SolverInfo:
    """What an iterative solver did: ``converged``, ``iterations``, ``residual`` (final residual
    norm; relative for linear solves), the ``tol`` and ``maxiter`` it ran under, ``matvecs``;
    ``backward`` holds the info of the adjoint solve once backward has run."""

    method: str
    converged: bool
    iterations: int
    residual: float
    tol: float
    maxiter: int
    matvecs: int = 0
    backward: Optional["SolverInfo"] = None


def _matvec_of(A, check: bool = True) -> tuple[Callable, Optional[int]]:
    """A batched matvec ``(..., N) -> (..., N)`` and ``N`` (None when unknown); ``check=False``
    for an operator already checked (its dtype converted, its shifted form)."""
    if isinstance(A, PauliSumOperator):
        A.check_hermitian("eigsh/lanczos/ground_state/cg/minres", "; these solvers need a "
                          "Hermitian operator")
        return A.apply, A.dim
    if isinstance(A, _Shifted):
        return A, _matvec_of(A.A, check=False)[1]
    if isinstance(A, torch.Tensor):
        if A.dim() != 2 or A.shape[0] != A.shape[1]:
            raise QdiffError(f"operator matrix must be square (N, N); got shape {tuple(A.shape)}")
        if not (A.is_complex() or A.dtype.is_floating_point):  # integers, bools: float64
            A = A.to(torch.float64)
        if check:
            _check_hermitian_matrix(A)
        if A.layout != torch.strided:
            return (lambda v: (A @ v.reshape(-1, A.shape[0]).transpose(0, 1)).transpose(0, 1)
                    .reshape(v.shape)), A.shape[0]
        return (lambda v: v @ A.transpose(0, 1)), A.shape[0]
    if callable(A):
        return _checked_callable(A, "the operator callable"), None
    try:
        op = as_operator(A)
    except QdiffError:
        if hasattr(A, "terms"):  # an Observable that does not convert: its own reason
            raise
        raise QdiffError(f"expected an operator (PauliSumOperator, Observable, tensor or "
                         f"callable); got {type(A).__name__}") from None
    return _matvec_of(op)


def _checked_callable(f: Callable, what: str) -> Callable:
    """``f`` whose every result is checked to be a tensor of its argument's shape."""
    def checked(v):
        out = f(v)
        if not isinstance(out, torch.Tensor) or out.shape != v.shape:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise QdiffError(f"{what} returned {got} for a vector of shape {tuple(v.shape)}; it "
                             "must return a tensor of the same shape")
        return out
    return checked


def _check_hermitian_matrix(A: torch.Tensor) -> None:
    """Refuse a dense or sparse matrix with non-finite entries, or one that is not Hermitian
    (``|A - A^dag| <= 1e-6 max|A|``, ``1e-3`` in single precision: a gross error, not the
    rounding of a matrix built Hermitian, nor a finite-difference probe of one): the solvers
    would return a wrong answer without a word (an eigenvalue of a non-Hermitian matrix, a CG
    iterate)."""
    what = "eigsh/lanczos/ground_state/cg/minres: the operator matrix"
    A = A.detach()
    if A.layout == torch.strided:
        memory.require(3.0 * A.numel() * A.element_size(), f"{what}'s Hermiticity check",
                       A.device)
        vals, diff = A, (A - A.conj().transpose(0, 1))
    else:
        c = (A if A.layout == torch.sparse_coo else A.to_sparse_coo()).coalesce()
        vals = c.values()
        diff = (c - c.conj().transpose(0, 1)).coalesce().values()
    if vals.numel() == 0:
        return
    if not bool(torch.isfinite(vals).all()):
        raise QdiffError(f"{what} has NaN or infinite entries")
    scale = float(vals.abs().max())
    single = A.dtype in (torch.float32, torch.complex64, torch.float16, torch.bfloat16)
    off = float(diff.abs().max()) if diff.numel() else 0.0
    if off > (1e-3 if single else 1e-6) * scale:
        raise QdiffError(f"{what} is not Hermitian (max |A - A^dag| = {off:.3g}, max |A| = "
                         f"{scale:.3g}); these solvers need a Hermitian operator")


def _as_mask(mask) -> torch.Tensor:
    """A sector mask (a tensor, array or list) as a bool tensor."""
    if not isinstance(mask, torch.Tensor):
        try:
            mask = torch.as_tensor(np.asarray(mask))
        except (TypeError, ValueError, RuntimeError):
            raise QdiffError(f"lanczos: mask must be a (N,) bool tensor or array; got "
                             f"{type(mask).__name__}") from None
    return mask.to(torch.bool)


def _operator_dtype(A) -> Optional[torch.dtype]:
    """The dtype an operator's matrix has: a tensor's own; for a Pauli sum real or complex
    (by its terms and coefficients) at its coefficients' precision; None for a callable."""
    if isinstance(A, torch.Tensor):
        return A.dtype if (A.is_complex() or A.dtype.is_floating_point) else torch.float64
    if isinstance(A, PauliSumOperator):
        single = A.coeffs.dtype in (torch.float32, torch.complex64)
        if A.real_matrix:
            return torch.float32 if single else torch.float64
        return torch.complex64 if single else torch.complex128
    return None


def _as_vector(x, what: str) -> torch.Tensor:
    """A tensor from ``x`` (tensor, array or list); integers become float64."""
    if not isinstance(x, torch.Tensor):
        try:
            x = torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError) as e:
            raise QdiffError(f"{what} must be a tensor or an array of numbers; got "
                             f"{type(x).__name__}") from e
    if not (x.is_complex() or x.dtype.is_floating_point):
        x = x.to(torch.float64)
    if x.numel() and not bool(torch.isfinite(x.detach()).all()):
        raise QdiffError(f"{what} has NaN or infinite entries")
    return x


_LOW_PRECISION = (torch.float16, torch.bfloat16, torch.complex32)


def _check_precision(method: str, dtype: torch.dtype) -> None:
    """The solvers run in single or double precision (as torch.linalg); a tolerance met in
    float16 arithmetic says little about the matrix's own residual."""
    if dtype in _LOW_PRECISION:
        raise QdiffError(f"{method}: {dtype} is not supported (as in torch.linalg); convert the "
                         "operator and vectors to float32 or float64")


def _check_stop(method: str, tol, maxiter) -> None:
    """``tol`` a finite number >= 0, ``maxiter`` None or an integer >= 1."""
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not math.isfinite(tol) \
            or tol < 0:
        raise QdiffError(f"{method}: tol must be a finite number >= 0; got {tol!r}")
    if maxiter is not None and (isinstance(maxiter, bool) or not isinstance(maxiter, numbers.Integral)
                                or maxiter < 1):
        raise QdiffError(f"{method}: maxiter must be an integer >= 1; got {maxiter!r}")


def _inner(a, b):
    """``<a|b>`` along the last axis (conjugating ``a``)."""
    return (a.conj() * b).sum(-1) if a.is_complex() else (a * b).sum(-1)


# ------------------------------------------------------------------------------------------
# Lanczos


@checked_call
def lanczos(A, k: int = 1, *, v0: Optional[torch.Tensor] = None, n: Optional[int] = None,
            tol: float = 1e-10, max_basis: Optional[int] = None, maxiter: int = 10000,
            mask: Optional[torch.Tensor] = None, dtype=None, device=None, seed: int = 1234,
            which: str = "SA"):
    """Lowest (or highest) ``k`` eigenpairs of a Hermitian operator by thick-restart Lanczos.

    Args:
        A: :class:`PauliSumOperator`, Pauli-sum observable, ``(N, N)`` tensor (dense or sparse)
            or a callable ``(N,) -> (N,)``.
        k: number of eigenpairs, ``1 <= k <= N`` (the number of basis states in ``mask``).
        v0: start vector ``(N,)`` (default: seeded random; inside ``mask`` if given).
        tol: a Ritz pair counts as converged when ``||A x - theta x|| <= tol * max(1, |theta|)``.
        max_basis: Krylov basis size before a restart (default ``max(2k + 1, 20)``, as ARPACK's
            ``ncv``).
        maxiter: cap on matrix-vector products.
        mask: ``(N,)`` bool; the search is restricted to these basis states (a symmetry sector
            the operator preserves, e.g. a particle number): leakage is projected out each step.
        dtype: default float64 for a real matrix, else complex128.
        seed: seeds the default start vector and the fresh vectors drawn when the Krylov
            space becomes invariant.
        which: ``"SA"`` (smallest algebraic, the default) or ``"LA"`` (largest algebraic), as
            in scipy's ``eigsh``.

    When the Krylov space becomes invariant (Lanczos breakdown) before the basis is full, the
    iteration goes on from a random vector orthogonal to the basis, so eigenvalues outside that
    space, such as further copies of a degenerate eigenvalue, are found.

    Returns:
        ``(eigenvalues (k,), eigenvectors (k, N), SolverInfo)``, eigenvalues in ascending order.
    """
    _refuse_vmap("lanczos/eigsh")
    if which not in ("SA", "LA"):
        raise QdiffError(f"lanczos: which must be 'SA' (smallest) or 'LA' (largest); "
                         f"got {which!r}")
    _check_stop("lanczos", tol, maxiter)
    maxiter = 10000 if maxiter is None else maxiter
    if not isinstance(A, (PauliSumOperator, torch.Tensor)) and not callable(A):
        try:
            A = as_operator(A)
        except QdiffError:
            pass  # _matvec_of names what it is
    tracked = A.coeffs if isinstance(A, PauliSumOperator) else A
    if torch.is_grad_enabled() and isinstance(tracked, torch.Tensor) and tracked.requires_grad:
        raise QdiffError("lanczos/eigsh: the operator requires grad, but its eigenpairs are "
                         "not differentiated (they would come back detached); use "
                         "qd.ground_state for gradients of the lowest pair, or pass the "
                         "operator detached (A.detach(), H.with_coeffs(H.coeffs.detach()))")
    mv, dim = _matvec_of(A)
    if v0 is not None:
        v0 = _as_vector(v0, "lanczos: v0")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise QdiffError(f"lanczos: n must be an integer >= 1; got {n!r}")
        if dim is not None and n != dim:
            raise QdiffError(f"lanczos: n={n}, but the operator is {dim}x{dim} (n sizes a "
                             "callable operator; leave it out)")
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise QdiffError(f"lanczos: dtype must be a torch dtype (such as torch.float64); got "
                         f"{dtype!r}")
    if dim == 0:
        raise QdiffError("lanczos: the operator is 0x0; it has no eigenpairs")
    dim = dim or n or (v0.shape[-1] if v0 is not None else None)
    if dim is None:
        raise QdiffError("lanczos: give n (the dimension) or v0 with a callable operator")
    if v0 is not None and tuple(v0.shape) != (dim,):
        raise QdiffError(f"lanczos: v0 must have shape ({dim},); got {tuple(v0.shape)}")
    own = _operator_dtype(A)
    if dtype is None:
        dtype = own or (torch.complex128 if v0 is None else v0.dtype)
        if v0 is not None:
            dtype = torch.promote_types(dtype, v0.dtype)
    if not (dtype.is_complex or dtype.is_floating_point):
        raise QdiffError(f"lanczos: dtype must be a floating or complex torch dtype; got {dtype}")
    _check_precision("lanczos", dtype)
    if own is not None and own.is_complex and not dtype.is_complex:
        raise QdiffError(f"lanczos: the operator is complex; dtype {dtype} would drop its "
                         "imaginary part (use a complex dtype)")
    if isinstance(A, torch.Tensor) and A.dtype != dtype:
        mv, _ = _matvec_of(A.detach().to(dtype), check=False)
    if device is None:
        device = v0.device if v0 is not None else (
            A.coeffs.device if isinstance(A, PauliSumOperator) else
            A.device if isinstance(A, torch.Tensor) else torch.device("cpu"))
    else:
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError, ValueError):
            raise QdiffError(f"lanczos: device must be a torch device (such as 'cpu' or "
                             f"'cuda'); got {device!r}") from None
    maskf = None if mask is None else _as_mask(mask).to(device=device)
    if maskf is not None and maskf.shape != (dim,):
        raise QdiffError(f"lanczos: mask must have shape ({dim},); got {tuple(maskf.shape)}")
    space = dim if maskf is None else int(maskf.sum())
    if space == 0:
        raise QdiffError("lanczos: the mask selects no basis state")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= space:
        where = "the operator dimension" if maskf is None else "the number of states in mask"
        raise QdiffError(f"lanczos: k must be an integer with 1 <= k <= {space} ({where}); "
                         f"got {k!r}")
    if max_basis is not None and (not isinstance(max_basis, (int, np.integer)) or
                                  isinstance(max_basis, bool) or max_basis < 2):
        raise QdiffError(f"lanczos: max_basis must be an integer >= 2 (or None for the "
                         f"default); got {max_basis!r}")
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise QdiffError(f"lanczos: seed must be an integer; got {seed!r}")
    m = max_basis or max(2 * k + 1, 20)
    m = min(m, space)
    if k > m - 1 and space > k:
        raise QdiffError(f"lanczos: k={k} needs max_basis > k (got {m})")
    # the Krylov basis (m + 1 vectors) and a few work vectors
    item = torch.empty(0, dtype=dtype).element_size()
    memory.require((m + 6.0) * dim * item,
                   f"lanczos: a Krylov basis of {m + 1} vectors of length {dim}", device)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    if v0 is None:
        v0 = torch.randn(dim, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
    v = v0.detach().reshape(dim).to(device=device, dtype=dtype).clone()
    project = (lambda x: x.masked_fill_(~maskf, 0)) if maskf is not None else (lambda x: x)
    project(v)
    nv = torch.linalg.vector_norm(v)
    if float(nv) == 0:
        raise QdiffError("lanczos: the start vector is zero (inside the mask)")
    op = mv if which == "SA" else (lambda x: -mv(x))

    def fresh():
        return torch.randn(dim, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)

    with torch.no_grad():
        theta, X, info = _thick_restart(op, project, v / nv, k, m, tol, maxiter, space, fresh)
        if maskf is not None:
            _check_sector(mv, X, theta, maskf, tol)
    if which == "LA":
        theta, X = -theta.flip(0), X.flip(0)
    return theta, X, info


def _check_sector(mv, X, theta, maskf, tol) -> None:
    """Refuse a mask the operator does not preserve: the pairs found are then those of the
    operator projected on the masked states, not eigenpairs of the operator."""
    eps = torch.finfo(X.real.dtype).eps
    for x, t in zip(X, theta.tolist()):
        ax = mv(x)
        leak = float(torch.linalg.vector_norm(ax.masked_fill(maskf, 0)))
        if leak > max(tol * max(1.0, abs(t)), 1e3 * eps * float(torch.linalg.vector_norm(ax))):
            raise QdiffError(f"lanczos: the operator does not preserve mask: it maps the "
                             f"eigenvector of {t:.6g} out of the masked basis states (norm "
                             f"{leak:.3g}); mask must select a symmetry sector of the operator "
                             "(such as a particle number it conserves)")


def _orthonormal_fresh(fresh, project, V):
    """A random unit vector orthogonal to the rows of ``V`` (two Gram-Schmidt passes), or None
    when none is left numerically."""
    w = project(fresh())
    nw0 = float(torch.linalg.vector_norm(w))
    for _ in range(2):
        h = V.conj() @ w if w.is_complex() else V @ w
        w = w - h @ V
    project(w)
    nw = float(torch.linalg.vector_norm(w))
    if nw0 == 0 or nw <= 1e-8 * nw0:
        return None
    return w / nw


def _thick_restart(mv, project, v, k, m, tol, maxiter, space, fresh):
    """Thick-restart Lanczos on ``mv`` restricted by ``project`` to a space of dimension
    ``space``; ``fresh()`` draws random vectors.

    Single-vector Krylov spaces hold one vector per distinct eigenvalue, so copies of a
    degenerate eigenvalue are reached only from new directions: on breakdown (an invariant
    Krylov space) the basis is continued from a random vector orthogonal to it, and once the
    wanted Ritz pairs have converged they are locked and one more cycle runs from a random
    vector orthogonal to them; the result is accepted when that cycle finds no lower Ritz value.
    """
    dim = v.shape[0]
    V = torch.zeros(m + 1, dim, dtype=v.dtype, device=v.device)
    T = torch.zeros(m + 1, m + 1, dtype=v.dtype, device=v.device)
    V[0] = v
    p, matvecs, restarts, locked = 0, 0, 0, None
    while True:
        j_end, beta, exhausted = m, 0.0, False
        for j in range(p, m):
            w = project(mv(V[j]))
            matvecs += 1
            Vj = V[:j + 1]
            # full reorthogonalization (T is the Rayleigh quotient V^H A V): one Gram-Schmidt
            # pass, and a second (DGKS) only where the first cancelled most of w (norm below
            # 1/sqrt(2) of it), as ARPACK does; each pass reads the basis twice
            norm0 = float(torch.linalg.vector_norm(w))
            h = torch.mv(Vj.conj(), w) if w.is_complex() else torch.mv(Vj, w)
            w = torch.addmv(w, Vj.transpose(0, 1), h, alpha=-1)  # a new w: mv may return its input
            beta = float(torch.linalg.vector_norm(w))
            if not beta > 0.7071 * norm0:
                h2 = torch.mv(Vj.conj(), w) if w.is_complex() else torch.mv(Vj, w)
                w = w.addmv_(Vj.transpose(0, 1), h2, alpha=-1)
                h = h + h2
                beta = float(torch.linalg.vector_norm(w))
            T[:j + 1, j] = h
            T[j, :j + 1] = h.conj()
            nxt = None
            # below a few roundings of A v the rest is noise, not a direction: an invariant
            # Krylov space (in single precision that noise is 1e-7 of it, not 1e-16)
            limit = 10 * torch.finfo(w.real.dtype).eps * max(1.0, norm0, float(h.abs().max()))
            if j + 1 < space and beta > limit:
                nxt = w / beta
            elif j + 1 < space:  # invariant Krylov space: go on from a fresh direction
                beta = 0.0
                nxt = _orthonormal_fresh(fresh, project, V[:j + 1])
            if nxt is None:  # the basis spans the whole (masked) space: Ritz pairs are exact
                j_end, beta, exhausted = j + 1, 0.0, True
                break
            V[j + 1] = nxt
            T[j + 1, j] = T[j, j + 1] = beta
        size = j_end
        Tm = T[:size, :size]
        overflow = QdiffError(f"lanczos: the Krylov recurrence overflowed {Tm.dtype}; the "
                              "operator's coefficients are too large for this precision: "
                              "rescale the operator")
        if not bool(torch.isfinite(Tm).all()):
            raise overflow
        try:
            theta, Y = torch.linalg.eigh(0.5 * (Tm + Tm.conj().transpose(0, 1)))
        except torch.linalg.LinAlgError:
            raise overflow from None
        res = (beta * Y[size - 1, :]).abs()
        kk = min(k, size)
        # for k >= 2, once pairs are locked, the cycles from the fresh direction must also
        # converge the lowest pair above them (where the basis can hold it beside them): a
        # missing copy of a degenerate eigenvalue among the k is reached from there slowly, and
        # would pass unseen while its Ritz value still sat above the k-th (for k = 1 a copy
        # leaves the value unchanged, and a lower level shows as a lower Ritz value)
        kv = kk + 1 if locked is not None and k > 1 and m >= kk + 2 and size > kk + 1 else kk
        scale = torch.clamp(theta[:kv].abs(), min=1.0)
        # rounding limits residuals to ~eps ||A|| (single precision: ~1e-7 ||A||)
        floor = 100 * torch.finfo(theta.dtype).eps * float(theta.abs().max())
        ok = bool((res[:kk] <= torch.clamp(tol * scale[:kk], min=floor)).all())
        if kv > kk:  # that pair's value is off by about its residual squared over the gap
            ok = ok and bool(res[kk] <= max(float(scale[kk]) * max(tol, tol ** 0.5), floor))
        scale = scale[:kk]
        if ok and locked is None and not exhausted:
            # lock the converged pairs and search their complement from a random vector
            nxt = _orthonormal_fresh(fresh, project, (Y[:, :kk].transpose(0, 1).to(V.dtype)
                                                      @ V[:size]))
            if nxt is not None:
                locked = theta[:kk].clone()
                restarts += 1
                V[:kk] = Y[:, :kk].transpose(0, 1).to(V.dtype) @ V[:size]
                V[kk] = nxt
                T.zero_()
                T[:kk, :kk] = torch.diag(theta[:kk]).to(T.dtype)
                p = kk
                continue
        elif ok and locked is not None and not exhausted:
            moved = (theta[:kk] - locked).abs() > torch.clamp(tol * scale, min=floor)
            if bool(moved.any()):  # lower eigenvalues turned up: converge and verify again
                ok, locked = False, None
        if ok or exhausted or matvecs >= maxiter:
            X = Y[:, :kk].transpose(0, 1).to(V.dtype) @ V[:size]
            resid = torch.stack([torch.linalg.vector_norm(project(mv(X[i])) - theta[i] * X[i])
                                 for i in range(kk)])
            matvecs += kk
            # the residual reported is the true one; rounding limits it to ~eps ||A||
            floor = 100 * torch.finfo(resid.dtype).eps * float(theta.abs().max())
            good = resid <= torch.clamp(tol * scale, min=floor)
            info = SolverInfo("lanczos", bool(good.all()) and (ok or exhausted), restarts,
                              float(resid.max()), tol, maxiter, matvecs)
            if not info.converged and bool(good.all()) and locked is not None:
                warnings.warn(f"lanczos: the {kk} pairs converged (residual {info.residual:.2e}"
                              f" <= tol {tol:.1e}) but the check for further copies of a "
                              f"degenerate eigenvalue among them did not finish in {matvecs} "
                              "matvecs (maxiter)", stacklevel=3)
            elif not info.converged:
                warnings.warn(f"lanczos did not converge in {matvecs} matvecs (residual "
                              f"{info.residual:.2e} > tol {tol:.1e})", stacklevel=3)
            return theta[:kk], X, info
        restarts += 1
        p = min(size - 1, kv + max(kv, (size - kv) // 2))
        Yp = Y[:, :p].to(V.dtype)
        newV = Yp.transpose(0, 1) @ V[:size]
        V[:p] = newV
        V[p] = V[size]
        T.zero_()
        T[:p, :p] = torch.diag(theta[:p]).to(T.dtype)
        coup = beta * Y[size - 1, :p]
        T[p, :p] = coup.to(T.dtype)
        T[:p, p] = coup.conj().to(T.dtype)


def eigsh(A, k: int = 1, **kwargs):
    """``(eigenvalues (k,), eigenvectors (k, N), SolverInfo)``: alias of :func:`lanczos` with
    scipy's name (``which="SA"``, the lowest ``k``, or ``"LA"``, the highest)."""
    return lanczos(A, k, **kwargs)


# ------------------------------------------------------------------------------------------
# differentiable ground state


class _Box:
    """Attributes passed through an autograd.Function as they are (torch.func copies the
    lists and dicts among its inputs, so what forward stores there would be lost)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def _no_batching_error(who: str) -> QdiffError:
    return QdiffError(f"{who} has no batching or forward-mode rule (torch.func.vmap, jvp, "
                      "jacfwd): loop over the batch, or differentiate in reverse mode "
                      "(backward, torch.func.grad/jacrev)")


def _no_batching(who: str):
    """An autograd.Function ``vmap``/``jvp`` rule that refuses by name."""
    def refuse(*args, **kwargs):
        raise _no_batching_error(who)
    return staticmethod(refuse)


def _refuse_vmap(who: str) -> None:
    """The iterations branch on the vectors' values, which torch.func.vmap cannot batch."""
    try:
        from torch._C._functorch import TransformType
        from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters
    except ImportError:  # a torch without these: vmap reports for itself
        return
    if any(i.key() == TransformType.Vmap for i in retrieve_all_functorch_interpreters()):
        raise _no_batching_error(who)


class _GroundState(torch.autograd.Function):
    """``coeffs -> (E0, psi0)``; the backward is implicit (no unrolled iterations)."""

    @staticmethod
    def forward(coeffs, op, box):
        e, x, info = lanczos(op.with_coeffs(coeffs.detach()), 1, **box.opts)
        box.info = info
        return e[0], x[0]

    @staticmethod
    def setup_context(ctx, inputs, output):
        coeffs, op, box = inputs
        ctx.op, ctx.opts, ctx.info = op, box.opts, box.info
        ctx.save_for_backward(coeffs, *output)

    vmap = jvp = _no_batching("ground_state")

    @staticmethod
    def backward(ctx, g_e, g_psi):
        coeffs, e0, psi = ctx.saved_tensors
        op = ctx.op.with_coeffs(coeffs.detach())
        grad = None
        if g_e is not None:
            grad = g_e * op.term_expvals(psi)
        if g_psi is not None and bool(g_psi.abs().max() > 0):
            x, binfo = _perturbation_solve(op, e0, psi, g_psi, ctx.opts)
            ctx.info.backward = binfo
            part = op.bilinear_terms(x, psi)
            grad = part if grad is None else grad + part
        return (None if grad is None else grad.to(coeffs.dtype)), None, None


def _perturbation_solve(op, e0, psi, g, opts):
    """``x = -(H - E0)^+ (1 - |psi><psi|) g`` by CG on the orthogonal complement of ``psi``."""
    mask = opts.get("mask")
    mask = None if mask is None else _as_mask(mask).to(psi.device)

    def proj(v):
        v = v - psi * _inner(psi, v)
        return v if mask is None else v.masked_fill(~mask, 0)

    def shifted(v):
        return proj(op.apply(v) - e0 * v)

    rhs = -proj(g.to(psi.dtype))
    # a residual below a few hundred roundings is out of reach (in single precision 1e-5):
    # CG asked for more drifts away from the solution
    tol = max(opts.get("tol", 1e-10), 1e-12, 100 * torch.finfo(psi.real.dtype).eps)
    x, info = _cg_solve(shifted, rhs, None, tol, opts.get("maxiter", 10000), None)
    if not info.converged:
        warnings.warn(f"ground_state: the backward solve for the state's gradient stopped "
                      f"after {info.iterations} iterations with relative residual "
                      f"{info.residual:.2e} > tol {tol:.1e}; the gradient is not accurate "
                      "(info.backward)", stacklevel=2)
    x = proj(x)
    # |x| <= |rhs| / gap: a ratio below 1e-8 of the Hamiltonian's scale is a ground space
    # that is degenerate (to rounding), where the state, and so its gradient, is not defined
    rn, xn = float(torch.linalg.vector_norm(rhs)), float(torch.linalg.vector_norm(x))
    scale = max(float(op.coeffs.detach().abs().sum()), 1e-300)
    if rn > 0 and xn > 0 and rn / xn < 1e-8 * scale:
        raise QdiffError(f"ground_state: the ground space is degenerate (gap <= {rn / xn:.2g}, "
                         f"Hamiltonian scale {scale:.3g}): the ground state is not unique and "
                         "its gradient is not defined; differentiate the energy, or break the "
                         "degeneracy (a symmetry sector's mask, a small field)")
    return x, info


@checked_call
def ground_state(H, *, n_qubits: Optional[int] = None, tol: float = 1e-10,
                 max_basis: Optional[int] = None, maxiter: int = 10000,
                 mask: Optional[torch.Tensor] = None, v0: Optional[torch.Tensor] = None,
                 seed: int = 1234):
    """Lowest eigenpair ``(E0, psi0 (2**n,), SolverInfo)`` of a Pauli-sum Hamiltonian.

    Differentiable w.r.t. the Hamiltonian's coefficients when they require grad: the energy by
    Hellmann-Feynman, the state by the perturbation formula (one projected CG solve in the
    backward; its info lands in ``info.backward``). Losses of ``psi0`` must not depend on its
    arbitrary global phase/sign (expectations, fidelities, ...). ``mask`` restricts the search
    to a symmetry sector (e.g. :func:`qdiff.qchem.particle_number_mask`).
    """
    op = as_operator(H, n_qubits)
    opts = dict(tol=tol, max_basis=max_basis, maxiter=maxiter, mask=mask, v0=v0, seed=seed)
    box = _Box(opts=opts, info=None)
    e, psi = _GroundState.apply(op.coeffs, op, box)
    return e, psi, box.info


# ------------------------------------------------------------------------------------------
# linear solvers


def _cg_solve(mv, b, x0, tol, maxiter, M):
    """Batched preconditioned CG on ``(..., N)``; returns ``(x, SolverInfo)``."""
    x = torch.zeros_like(b) if x0 is None else x0.clone()
    r = b - mv(x) if x0 is not None else b.clone()
    z = M(r) if M is not None else r
    p = z.clone()
    rz = _inner(r, z).real
    bnorm = torch.linalg.vector_norm(b, dim=-1).clamp_min(1e-300)
    it, rel = 0, torch.linalg.vector_norm(r, dim=-1) / bnorm
    while it < maxiter and bool((rel > tol).any()):
        ap = mv(p)
        pap = _inner(p, ap).real
        alpha = torch.where(pap.abs() > 0, rz / torch.where(pap == 0, 1.0, pap), 0.0)
        active = (rel > tol).to(alpha.dtype)
        alpha = alpha * active
        x = x + alpha.unsqueeze(-1) * p
        r = r - alpha.unsqueeze(-1) * ap
        z = M(r) if M is not None else r
        rz_new = _inner(r, z).real
        beta = torch.where(rz.abs() > 0, rz_new / torch.where(rz == 0, 1.0, rz), 0.0)
        p = z + beta.unsqueeze(-1) * p
        rz = rz_new
        it += 1
        rel = torch.linalg.vector_norm(r, dim=-1) / bnorm
    res = float(rel.max()) if rel.numel() else 0.0
    return x, SolverInfo("cg", res <= tol, it, res, tol, maxiter, it + (x0 is not None))


def _minres_solve(mv, b, x0, tol, maxiter, shift=0.0):
    """Batched MINRES (Paige-Saunders) for Hermitian, possibly indefinite ``A - shift I``,
    restarted from its iterate (at most twice, within ``maxiter``) when the true residual
    misses ``tol`` where the recurrence's estimate met it (rounding)."""
    x, its, matvecs = x0, 0, 0
    for _ in range(3):
        x, it, true_res = _minres_run(mv, b, x, tol, maxiter - its, shift)
        its += it
        matvecs += it + 1
        if it == 0 or its >= maxiter or not bool((true_res > tol).any()):
            break
    res = float(true_res.max()) if true_res.numel() else 0.0
    return x, SolverInfo("minres", res <= tol, its, res, tol, maxiter, matvecs)


def _minres_run(mv, b, x0, tol, maxiter, shift):
    """One MINRES run: ``(x, iterations, true relative residuals)``."""
    rdt = b.real.dtype
    x = torch.zeros_like(b) if x0 is None else x0.clone()
    r1 = b - (mv(x) - shift * x) if x0 is not None else b.clone()
    y = r1.clone()
    beta1 = torch.linalg.vector_norm(r1, dim=-1)
    bnorm = torch.linalg.vector_norm(b, dim=-1).clamp_min(1e-300)
    zeros = torch.zeros_like(beta1)
    oldb, beta, dbar, epsln, phibar = zeros, beta1.clone(), zeros, zeros, beta1.clone()
    cs, sn = -torch.ones_like(beta1), zeros
    w = torch.zeros_like(b)
    w2 = torch.zeros_like(b)
    r2 = r1.clone()
    it, rel = 0, phibar / bnorm
    tiny = torch.finfo(rdt).tiny
    while it < maxiter and bool((rel > tol).any()):
        active = (rel > tol) & (beta > tiny)
        safe_beta = torch.where(beta > tiny, beta, 1.0)
        v = y / safe_beta.unsqueeze(-1)
        y = mv(v) - shift * v
        if it >= 1:
            y = y - (beta / torch.where(oldb > tiny, oldb, 1.0)).unsqueeze(-1) * r1
        alfa = _inner(v, y).real.to(rdt)
        y = y - (alfa / safe_beta).unsqueeze(-1) * r2
        r1, r2 = r2, y
        oldb, beta = beta, torch.linalg.vector_norm(y, dim=-1)
        oldeps = epsln
        delta = cs * dbar + sn * alfa
        gbar = sn * dbar - cs * alfa
        epsln = sn * beta
        dbar = -cs * beta
        gamma = torch.sqrt(gbar ** 2 + beta ** 2).clamp_min(tiny)
        cs, sn = gbar / gamma, beta / gamma
        phi = cs * phibar
        phibar = torch.where(active, sn * phibar, phibar)
        w1, w2 = w2, w
        w = (v - oldeps.unsqueeze(-1) * w1 - delta.unsqueeze(-1) * w2) / gamma.unsqueeze(-1)
        x = x + torch.where(active, phi, 0.0).unsqueeze(-1) * w
        it += 1
        rel = phibar / bnorm
    true_res = torch.linalg.vector_norm(b - (mv(x) - shift * x), dim=-1) / bnorm
    return x, it, true_res


class _ImplicitSolve(torch.autograd.Function):
    """``(b, *params) -> x`` with ``A(params) x = b``; backward solves ``A^H lam = grad_x``."""

    @staticmethod
    def forward(b, spec, *params):
        x, info = spec.solve(b.detach())
        spec.info = info
        return x

    @staticmethod
    def setup_context(ctx, inputs, output):
        b, spec, *params = inputs
        ctx.spec = spec
        ctx.save_for_backward(output, *params)

    @staticmethod
    def backward(ctx, g):
        x, *params = ctx.saved_tensors
        spec = ctx.spec
        lam, binfo = spec.solve(g.detach())  # A is Hermitian: the adjoint system is A lam = g
        spec.info.backward = binfo
        grads = [None] * len(params)
        need = [i for i, p in enumerate(params) if ctx.needs_input_grad[2 + i]]
        if need:
            with torch.enable_grad():
                ax = spec.matvec(x.detach())
                got = torch.autograd.grad(ax, [params[i] for i in need], grad_outputs=-lam,
                                          allow_unused=True)
            for i, gr in zip(need, got):
                grads[i] = gr
        return (lam if ctx.needs_input_grad[0] else None, None, *grads)

    vmap = jvp = _no_batching("cg/minres")


def _solve(method, A, b, x0, tol, maxiter, params, **kw):
    _refuse_vmap(method)
    _check_stop(method, tol, maxiter)
    mv, dim = _matvec_of(A)
    b = _as_vector(b, f"{method}: b")
    if b.dim() == 0:
        raise QdiffError(f"{method}: b must have shape (..., N); got a scalar")
    if dim is not None and b.shape[-1] != dim:
        raise QdiffError(f"{method}: right-hand side has length {b.shape[-1]} but the operator "
                         f"is {dim}x{dim}")
    own = _operator_dtype(A.A if isinstance(A, _Shifted) else A)
    dt = b.dtype if own is None else torch.promote_types(own, b.dtype)
    _check_precision(method, dt)
    b = b.to(dt)  # a real right-hand side of a complex system is solved in complex
    if isinstance(A, torch.Tensor) and A.dtype != dt:
        mv = _matvec_of(A.to(dt), check=False)[0]  # differentiable: gradients reach A in its own dtype
    elif isinstance(A, _Shifted) and isinstance(A.A, torch.Tensor) and A.A.dtype != dt:
        mv = _Shifted(_matvec_of(A.A.to(dt), check=False)[0], A.shift, A.A)
    if x0 is not None:
        x0 = _as_vector(x0, f"{method}: x0").detach().to(device=b.device, dtype=dt)
        if x0.shape != b.shape:
            raise QdiffError(f"{method}: x0 must have the shape of b {tuple(b.shape)}; got "
                             f"{tuple(x0.shape)}")
    maxiter = 10 * b.shape[-1] if maxiter is None else maxiter
    if params is None:
        params = [A.coeffs] if isinstance(A, PauliSumOperator) else \
            [A] if isinstance(A, torch.Tensor) else []
    elif isinstance(params, torch.Tensor) or not isinstance(params, (list, tuple)) or \
            not all(isinstance(p, torch.Tensor) for p in params):
        raise QdiffError(f"{method}: params must be a list of the tensors the operator "
                         f"depends on; got {params!r:.80}")
    M = kw.get("M")
    if M is not None and not callable(M):
        raise QdiffError(f"{method}: M (the preconditioner) must be a callable (..., N) -> "
                         f"(..., N); got {type(M).__name__}")
    if M is not None:
        kw["M"] = _checked_callable(M, "the preconditioner M")
    if method == "cg":
        def solve(rhs):
            with torch.no_grad():
                return _cg_solve(mv, rhs, x0, tol, maxiter, kw.get("M"))
    else:
        def solve(rhs):
            with torch.no_grad():
                return _minres_solve(mv, rhs, x0, tol, maxiter, kw.get("shift", 0.0))
    spec = _Box(solve=solve, matvec=mv, info=None)
    x = _ImplicitSolve.apply(b, spec, *params)
    info = spec.info
    if not info.converged:
        warnings.warn(f"{method} stopped after {info.iterations} iterations with relative "
                      f"residual {info.residual:.2e} > tol {tol:.1e}", stacklevel=3)
    return x, info


@checked_call
def cg(A, b: torch.Tensor, *, x0: Optional[torch.Tensor] = None, tol: float = 1e-10,
       maxiter: Optional[int] = None, M: Optional[Callable] = None, params=None):
    """Solve ``A x = b`` for Hermitian positive-definite ``A`` by conjugate gradients.

    Args:
        A: :class:`PauliSumOperator`, ``(N, N)`` tensor (dense or sparse) or a batched matvec
            callable ``(..., N) -> (..., N)``.
        b: ``(..., N)``; leading dims are independent systems solved together.
        tol: stop when ``||r|| <= tol ||b||`` for every system; maxiter: iteration cap
            (default ``10 N``). M: optional preconditioner callable (approximates ``A^-1``).
        params: tensors the callable ``A`` depends on, for gradients (a PauliSumOperator's
            coefficients and a tensor ``A`` are found automatically).

    Returns ``(x, SolverInfo)``. Gradients w.r.t. ``b`` and ``params`` come from one adjoint
    solve (``info.backward`` after backward), not from the iterations.
    """
    return _solve("cg", A, b, x0, tol, maxiter, params, M=M)


@checked_call
def minres(A, b: torch.Tensor, *, x0: Optional[torch.Tensor] = None, shift: float = 0.0,
           tol: float = 1e-10, maxiter: Optional[int] = None, params=None):
    """Solve ``(A - shift I) x = b`` for Hermitian (possibly indefinite) ``A`` by MINRES.

    Same arguments and implicit backward as :func:`cg`; ``info.residual`` is the true relative
    residual at exit.
    """
    if isinstance(shift, torch.Tensor) and shift.requires_grad:
        raise QdiffError("minres: shift requires grad, but the solve is not differentiated "
                         "with respect to it; pass shift.detach(), or a callable A(v) - s v "
                         "with params=[s]")
    if isinstance(shift, torch.Tensor) and shift.numel() == 1:
        shift = shift.item()
    if isinstance(shift, bool) or not isinstance(shift, numbers.Real) or \
            not math.isfinite(shift):
        raise QdiffError(f"minres: shift must be a finite real number (A - shift I must stay "
                         f"Hermitian); got {shift!r:.60}")
    if shift != 0.0:
        base, _ = _matvec_of(A)
        return _solve("minres", _Shifted(base, shift, A), b, x0, tol, maxiter,
                      params if params is not None else _default_params(A))
    return _solve("minres", A, b, x0, tol, maxiter, params)


def _default_params(A):
    return [A.coeffs] if isinstance(A, PauliSumOperator) else [A] if isinstance(A, torch.Tensor) \
        else []


class _Shifted:
    def __init__(self, mv, shift, A):
        self.mv, self.shift, self.A = mv, shift, A

    def __call__(self, v):
        return self.mv(v) - self.shift * v
