"""The per-call work of a plain qnode on the adjoint path: what is kept per circuit structure
(Z-word layouts, channel checks, unit Pauli coefficients) against a fresh evaluation on the
torch kernels, with the structure, the observables and their coefficients changed between
calls of the same qnode."""
from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff.backends.statevector import native, zwords
from qdiff.circuits.observables import Observable

pytestmark = pytest.mark.skipif(native.library() is None,
                                reason="no C compiler: the native kernels are not built")


def _layers(w, n, layers):
    for layer in range(layers):
        for i in range(n):
            qd.RY(w[layer, i, 0], wires=i)
            qd.RZ(w[layer, i, 1], wires=i)
        for i in range(n):
            qd.CNOT(wires=[i, (i + layer + 1) % n])


def _measurements(kind, n):
    """Measurement lists: Z words within one half of the register, across both halves, in
    shuffled order, with coefficients, and mixed with other kinds."""
    rng = np.random.default_rng(n)
    order = [int(i) for i in rng.permutation(n)]
    a = n // 2
    if kind == "every":
        return [qd.expval(qd.Z(i)) for i in range(n)]
    if kind == "shuffled":
        return [qd.expval(qd.Z(i)) for i in order]
    if kind == "coeffs":
        return [qd.expval(qd.Hamiltonian([0.5 + i], [qd.Z(i)])) for i in order[:5]] + \
            [qd.expval(qd.Z(1) @ qd.Z(a - 1)), qd.expval(qd.Z(a) @ qd.Z(n - 1))]
    if kind == "across":  # words spanning both halves
        return [qd.expval(qd.Z(0) @ qd.Z(n - 1)), qd.expval(qd.Z(2)), qd.expval(qd.Z(n - 2)),
                qd.expval(qd.Hamiltonian([-0.7], [qd.Z(1) @ qd.Z(a)]))]
    if kind == "mixed":
        return [qd.expval(qd.Z(0)), qd.var(qd.Z(n - 1)), qd.expval(qd.Z(a)),
                qd.expval(qd.X(1)), qd.expval(qd.Z(2) @ qd.Z(3))]
    raise AssertionError(kind)


def _qnode(dev, kind, layers=2, diff_method="adjoint"):
    n = len(dev.wires)

    @qd.qnode(dev, diff_method=diff_method)
    def f(w):
        _layers(w, n, layers)
        return _measurements(kind, n)
    return f


def _reference(n, kind, w, layers=2, cdtype=torch.complex128):
    """Value and gradient on the torch kernels by backpropagation (nothing cached shared)."""
    qd.clear_caches()
    with native.disabled():
        f = _qnode(qd.device("statevector", wires=n, dtype=cdtype), kind, layers, "backprop")
        w = w.detach().clone().requires_grad_(True)
        out = f(w)
        (g,) = torch.autograd.grad((out * _cot(out)).sum(), w)
    return out.detach(), g


def _cot(out):
    return torch.linspace(-1.0, 1.5, out.shape[-1], dtype=out.dtype)


@pytest.mark.parametrize("n", [12, 13])
@pytest.mark.parametrize("kind", ["every", "shuffled", "coeffs", "across", "mixed"])
def test_z_words_by_halves_match_the_torch_kernels(n, kind):
    """From HALVES_MIN_WIRES wires on, Z words are read off (and folded into the adjoint's
    diagonal from) the half-register marginals: values and adjoint gradients as on torch."""
    assert n >= zwords.HALVES_MIN_WIRES
    g = torch.Generator().manual_seed(n)
    w = torch.rand(2, n, 2, dtype=torch.float64, generator=g) * 3
    ref, ref_g = _reference(n, kind, w)
    f = _qnode(qd.device("statevector", wires=n), kind)
    for _ in range(2):  # the second call reuses the recorded circuit and its layouts
        wr = w.clone().requires_grad_(True)
        out = f(wr)
        (gr,) = torch.autograd.grad((out * _cot(out)).sum(), wr)
        torch.testing.assert_close(out, ref, atol=1e-11, rtol=0)
        torch.testing.assert_close(gr, ref_g, atol=1e-10, rtol=0)
        with torch.no_grad():
            torch.testing.assert_close(f(w), ref, atol=1e-11, rtol=0)


@pytest.mark.parametrize("kind", ["every", "coeffs", "across"])
def test_z_words_by_halves_complex64(kind):
    n = 12
    g = torch.Generator().manual_seed(3)
    w = torch.rand(2, n, 2, dtype=torch.float64, generator=g) * 3
    ref, ref_g = _reference(n, kind, w)
    f = _qnode(qd.device("statevector", wires=n, dtype=torch.complex64), kind)
    wr = w.clone().requires_grad_(True)
    out = f(wr)
    (gr,) = torch.autograd.grad((out * _cot(out)).sum(), wr)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=0)
    torch.testing.assert_close(gr.double(), ref_g, atol=1e-4, rtol=0)


def test_stacked_and_joint_z_expvals_agree_with_the_sign_matrix():
    """The half-register readout against one full sign matrix, on a random state."""
    from qdiff.circuits import Circuit
    n = 13
    ms = tuple(m for m in _measurements("coeffs", n))
    c = Circuit(n, (), ms)
    g = torch.Generator().manual_seed(9)
    psi = torch.randn(3, 2 ** n, dtype=torch.complex128, generator=g)
    p = psi.abs() ** 2
    words = tuple(tuple(sorted(f.wires[0] for f in m.obs.terms[0])) for m in ms)
    coeffs = torch.tensor([float(m.obs.coeffs[0]) for m in ms], dtype=torch.float64)
    full = (p @ zwords.sign_matrix(words, n, torch.float64, "cpu")) * coeffs
    torch.testing.assert_close(zwords.stacked_expvals(psi, c), full, atol=1e-9, rtol=1e-12)
    joint = zwords.joint_z_expvals(psi, c)
    assert sorted(joint) == list(range(len(ms)))
    torch.testing.assert_close(torch.stack([joint[i] for i in range(len(ms))], -1), full,
                               atol=1e-9, rtol=1e-12)
    cot = torch.randn(3, len(ms), dtype=torch.float64, generator=g)
    diag, done = zwords.z_word_diagonal(psi, c, cot, n)
    assert done == set(range(len(ms)))
    ref = (cot * coeffs) @ zwords.sign_matrix(words, n, torch.float64, "cpu").T
    torch.testing.assert_close(diag, ref, atol=1e-12, rtol=0)


def test_structure_and_observables_changed_between_calls_are_never_stale():
    """One qnode whose structure, measurements and coefficients follow Python arguments,
    called in interleaved order: every call matches a fresh evaluation."""
    n = 12
    dev = qd.device("statevector", wires=n)

    @qd.qnode(dev, diff_method="adjoint")
    def f(w, layers, kind, scale):
        _layers(w, n, layers)
        ms = _measurements(kind, n)
        if scale != 1.0:
            ms[0] = qd.expval(qd.Hamiltonian([scale], [ms[0].obs]))
        return ms

    g = torch.Generator().manual_seed(1)
    w = torch.rand(3, n, 2, dtype=torch.float64, generator=g) * 3
    cases = [(2, "every", 1.0), (3, "every", 1.0), (2, "shuffled", 1.0), (2, "every", -2.5),
             (2, "across", 1.0), (3, "mixed", 1.0), (2, "every", 1.0), (2, "every", 0.5),
             (3, "every", 1.0), (2, "coeffs", 1.0), (2, "shuffled", 1.0)]
    for layers, kind, scale in cases:
        @qd.qnode(qd.device("statevector", wires=n), diff_method="backprop")
        def ref_f(w):
            _layers(w, n, layers)
            ms = _measurements(kind, n)
            if scale != 1.0:
                ms[0] = qd.expval(qd.Hamiltonian([scale], [ms[0].obs]))
            return ms
        with native.disabled():
            wr = w.clone().requires_grad_(True)
            ref = ref_f(wr)
            (ref_g,) = torch.autograd.grad((ref * _cot(ref)).sum(), wr)
        wq = w.clone().requires_grad_(True)
        out = f(wq, layers, kind, scale)
        (gq,) = torch.autograd.grad((out * _cot(out)).sum(), wq)
        torch.testing.assert_close(out, ref.detach(), atol=1e-11, rtol=0)
        torch.testing.assert_close(gq, ref_g, atol=1e-10, rtol=0)


def test_pauli_observable_coefficient_is_made_on_first_use():
    o = Observable.pauli("Z", 3)
    assert "coeffs" not in o.__dict__
    c = o.coeffs
    assert c.dtype == torch.float64 and c.tolist() == [1.0] and o.coeffs is c
    with torch.no_grad():
        o.coeffs.mul_(2.0)
    assert o.coeffs.tolist() == [2.0] and (3 * o).coeffs.tolist() == [6.0]
    for other in (copy.deepcopy(Observable.pauli("X", 0)),
                  pickle.loads(pickle.dumps(Observable.pauli("X", 0)))):
        assert other.coeffs.tolist() == [1.0] and repr(other) == "1 * X(0)"
    with pytest.raises(AttributeError):
        Observable.pauli("Y", 0).no_such_attribute  # noqa: B018


def test_channel_check_per_circuit_still_refuses_channels():
    dev = qd.device("statevector", wires=1)

    @qd.qnode(dev)
    def f(x, noisy):
        qd.RX(x, wires=0)
        if noisy:
            qd.DepolarizingChannel(0.1, wires=0)
        return qd.expval(qd.Z(0))

    x = torch.tensor(0.3, dtype=torch.float64)
    for noisy in (False, True, False, True):
        if noisy:
            with pytest.raises(qd.QdiffError, match="channel"):
                f(x, noisy)
        else:
            torch.testing.assert_close(f(x, noisy), torch.cos(x), atol=1e-12, rtol=0)


def test_half_register_diagonal_with_other_outputs_and_changed_coefficients():
    """The two half-register diagonals of the adjoint's lam when Z words sit between other
    outputs (their cotangent columns are not the first ones; the columns are kept per
    circuit) and a coefficient is changed in place between calls: each call matches the full
    sign matrix of that call's coefficients."""
    from qdiff.circuits import Circuit
    n = 13
    a = n // 2
    ms = (qd.probs(wires=[0, 1]), qd.expval(2.0 * qd.Z(n - 1)), qd.expval(qd.Z(0) @ qd.Z(3)),
          qd.expval(qd.X(4)), qd.expval(qd.Z(a)), qd.expval(-0.5 * qd.Z(1)))
    c = Circuit(n, (), ms)
    zcols = [(4, 1), (5, 2), (7, 4), (8, 5)]  # (cotangent column, measurement index)
    g = torch.Generator().manual_seed(4)
    psi = torch.randn(2, 2 ** n, dtype=torch.complex128, generator=g)
    cot = torch.randn(2, 9, dtype=torch.float64, generator=g)
    for scale in (1.0, 3.0):
        if scale != 1.0:
            with torch.no_grad():
                ms[1].obs.coeffs.mul_(scale)  # changed in place: read again on this call
        parts, done = zwords.z_word_diagonal_parts(psi, c, cot, n)
        assert isinstance(parts, tuple) and done == {i for _, i in zcols}
        words = tuple(tuple(sorted(f.wires[0] for f in ms[i].obs.terms[0])) for _, i in zcols)
        coeffs = torch.tensor([float(ms[i].obs.coeffs.real[0]) for _, i in zcols],
                              dtype=torch.float64)
        ref = (cot[:, [col for col, _ in zcols]] * coeffs) @ \
            zwords.sign_matrix(words, n, torch.float64, "cpu").T
        full = (parts[0][:, :, None] + parts[1][:, None, :]).reshape(2, -1)
        torch.testing.assert_close(full, ref, atol=1e-12, rtol=0)
    assert float(ms[1].obs.coeffs.real[0]) == 6.0
