"""Measurements: exact read-outs against dense matrices, and shots against exact values.

Sampled estimates must lie within 5 standard errors (computed from the exact state) of the exact
value; the same seed must give the same samples.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

import qdiff as qd
from conftest import TORCH_DEVICES
from qdiff.backends.statevector import measure
from qdiff.circuits.observables import as_observable

N = 3


def prepare(weights):
    qd.StronglyEntanglingLayers(weights, wires=range(N))


def weights(batch=()):
    return torch.rand(*batch, 2, N, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) * 3


def exact_state(w):
    dev = qd.device("statevector", wires=N)

    @qd.qnode(dev)
    def f(w):
        prepare(w)
        return qd.state()
    return f(w)


OBSERVABLES = {
    "z0": lambda: qd.Z(0),
    "x0y2": lambda: qd.X(0) @ qd.Y(2),
    "ham": lambda: qd.Hamiltonian([0.4, -1.1, 0.7], [qd.Z(0) @ qd.Z(1), qd.X(1), qd.Y(0) @ qd.X(2)]),
    "hermitian": lambda: qd.Hermitian(torch.tensor([[1.0, 0.5 - 0.2j], [0.5 + 0.2j, -0.3]]), wires=1),
    "hadamard": lambda: qd.H(2),
}


def term_std(state, obs) -> float:
    """Standard error of one shot of the term-wise estimator: terms that agree on every wire
    they share are read from one draw (grouped first fit, in order, as qdiff groups them),
    groups drawn independently."""
    groups = []
    for c, term in zip(obs.real_coeffs().tolist(), obs.terms):
        letters = {f.wires[0]: f.kind if f.kind != "M" else id(f) for f in term}
        for g in groups:
            if all(g[0].get(w, k) == k for w, k in letters.items()):
                g[0].update(letters)
                g[1].append((c, term))
                break
        else:
            groups.append((letters, [(c, term)]))
    total = 0.0
    for _, members in groups:
        part = qd.Observable([c for c, _ in members], [t for _, t in members])
        m = part.matrix(wire_order=range(N))
        mean = float((state.conj() @ m @ state).real)
        second = float((state.conj() @ m @ m @ state).real)
        total += max(second - mean ** 2, 0.0)
    return total ** 0.5


@pytest.mark.parametrize("name", list(OBSERVABLES))
def test_exact_expval_and_var_match_dense_matrix(name):
    w = weights()
    psi = exact_state(w)
    dev = qd.device("statevector", wires=N)

    @qd.qnode(dev)
    def f(w):
        prepare(w)
        return [qd.expval(OBSERVABLES[name]()), qd.var(OBSERVABLES[name]())]
    got = f(w)
    m = as_observable(OBSERVABLES[name]()).matrix(wire_order=range(N))
    mean = (psi.conj() @ m @ psi).real
    var = (psi.conj() @ m @ m @ psi).real - mean ** 2
    assert torch.allclose(got, torch.stack([mean, var]), atol=1e-12)


@pytest.mark.parametrize("name", list(OBSERVABLES))
def test_sampled_expval_within_five_standard_errors(name):
    shots = 4000
    w = weights((4,))
    dev = qd.device("statevector", wires=N, shots=shots, seed=11)
    exact_dev = qd.device("statevector", wires=N)

    def body(w):
        prepare(w)
        return qd.expval(OBSERVABLES[name]())
    sampled = qd.qnode(dev)(body)(w)
    exact = qd.qnode(exact_dev)(body)(w)
    assert sampled.shape == exact.shape == (4,)
    obs = as_observable(OBSERVABLES[name]())
    for i in range(4):
        se = term_std(exact_state(w[i]), obs) / shots ** 0.5
        assert abs(float(sampled[i] - exact[i])) <= 5 * se + 1e-12, (i, se)
    assert not torch.equal(sampled, exact), "shots must not return the exact value"


def test_sampled_var_within_tolerance():
    shots = 20000
    w = weights()
    dev = qd.device("statevector", wires=N, shots=shots, seed=3)

    def body(w):
        prepare(w)
        return qd.var(qd.X(1) @ qd.Z(2))
    sampled = qd.qnode(dev)(body)(w)
    exact = qd.qnode(qd.device("statevector", wires=N))(body)(w)
    # var = 1 - m^2 for a Pauli word; its estimator's error is 2|m| * se(m) to first order
    m = (1 - float(exact)) ** 0.5
    se = 2 * m * (float(exact) / shots) ** 0.5 + 1.0 / shots
    assert abs(float(sampled - exact)) <= 5 * se


def test_probs_with_shots_within_five_standard_errors():
    shots = 5000
    w = weights()
    dev = qd.device("statevector", wires=N, shots=shots, seed=7)

    def body(w):
        prepare(w)
        return qd.probs(wires=[2, 0])
    sampled = qd.qnode(dev)(body)(w)
    exact = qd.qnode(qd.device("statevector", wires=N))(body)(w)
    assert sampled.shape == exact.shape == (4,)
    assert abs(float(sampled.sum()) - 1) < 1e-12
    se = (exact * (1 - exact) / shots).sqrt()
    assert bool(((sampled - exact).abs() <= 5 * se + 1e-12).all())
    counts = sampled * shots
    assert torch.allclose(counts, counts.round(), atol=1e-9), "shot frequencies are k/shots"


@pytest.mark.parametrize("static", [False, True])
def test_a_shot_vector_gives_one_result_per_partition(static):
    """As PennyLane's: ``shots=[n, (m, c)]`` is a tuple of 1 + c results, each estimated from
    its own shots (frequencies k/n), with a gradient per partition; bad vectors are refused."""
    from qdiff.circuits.errors import QdiffError
    dev = qd.device("statevector", wires=2, seed=3)

    @qd.qnode(dev, shots=[40, (3000, 2)], diff_method="parameter-shift", static=static)
    def f(x):
        qd.RY(x, wires=0)
        qd.CNOT(wires=[0, 1])
        return qd.expval(qd.Z(1)), qd.probs(wires=[0])
    x = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
    out = f(x)
    assert isinstance(out, tuple) and len(out) == 3
    for (z, p), n in zip(out, (40, 3000, 3000)):
        assert z.shape == () and p.shape == (2,)
        assert torch.allclose(p * n, (p * n).round(), atol=1e-9)
        assert abs(float(z) - math.cos(0.4)) <= 5 * (1 / n) ** 0.5
    (g,) = torch.autograd.grad(out[1][0] + out[2][0], x)
    assert abs(float(g) + 2 * math.sin(0.4)) <= 5 * 2 * (2 / 3000) ** 0.5
    assert len(f(x, shots=[5])) == 1 and f(x, shots=5)[0].shape == ()
    for bad, match in (([], "empty"), ([0], "positive"), ([(10, 0)], "copies"),
                       ([(10,)], "shots, copies"), ([None], "positive"),
                       ([(10, 10 ** 6)], "partitions")):
        with pytest.raises(QdiffError, match=match):
            f(x, shots=bad)


def test_same_seed_same_samples_and_different_seed_differs():
    w = weights((2,))

    def run(seed):
        dev = qd.device("statevector", wires=N, shots=50, seed=seed)

        @qd.qnode(dev)
        def f(w):
            prepare(w)
            return qd.sample(wires=[0, 1, 2])
        return f(w)
    a, b, c = run(5), run(5), run(6)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)



def test_seeded_device_first_calls_from_threads_share_one_stream(monkeypatch):
    """Threads whose first calls on one seeded device meet draw from one generator: no two of
    them start the seed's stream anew (which would give them the same shots)."""
    import threading
    import time
    made = []
    real = torch.Generator

    def slow_generator(*args, **kwargs):  # widens the window between check and store
        time.sleep(0.05)
        made.append(real(*args, **kwargs))
        return made[-1]
    dev = qd.device("statevector", wires=N, shots=50, seed=3)
    monkeypatch.setattr(torch, "Generator", slow_generator)
    gens, barrier = [None] * 4, threading.Barrier(4)

    def first(i):
        barrier.wait()
        gens[i] = dev.generator("cpu")
    threads = [threading.Thread(target=first, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and all(g is made[0] for g in gens)


def test_sample_and_counts_shapes():
    shots = 64
    dev = qd.device("statevector", wires=N, shots=shots, seed=1)

    @qd.qnode(dev)
    def bits(w):
        prepare(w)
        return qd.sample(wires=[2, 0])

    @qd.qnode(dev)
    def eig(w):
        prepare(w)
        return qd.sample(qd.Z(0) @ qd.X(1))

    @qd.qnode(dev)
    def cnt(w):
        prepare(w)
        return qd.counts(wires=[0, 1])

    b = bits(weights((5,)))
    assert b.shape == (5, shots, 2) and set(b.unique().tolist()) <= {0, 1}
    e = eig(weights((2, 3)))
    assert e.shape == (2, 3, shots) and set(e.unique().tolist()) <= {-1.0, 1.0}
    c = cnt(weights())
    assert isinstance(c, dict) and sum(c.values()) == shots
    assert all(len(k) == 2 and set(k) <= {"0", "1"} for k in c)


def test_sampled_bits_follow_wire_order():
    """X on wire 2 only: sample(wires=[2, 0]) must always read (1, 0)."""
    dev = qd.device("statevector", wires=3, shots=20, seed=0)

    @qd.qnode(dev)
    def f():
        qd.X(2)
        return qd.sample(wires=[2, 0])
    assert torch.equal(f(), torch.tensor([[1, 0]] * 20))


def test_probs_marginal_order_matches_dense():
    gen = torch.Generator().manual_seed(2)
    psi = torch.randn(2, 2 ** 4, dtype=torch.complex128, generator=gen)
    psi = psi / psi.norm(dim=-1, keepdim=True)
    p = (psi.abs() ** 2).reshape(2, 2, 2, 2, 2).numpy()
    for wires in ([3, 1], [0], [2, 0, 3], [3, 2, 1, 0]):
        ref = np.einsum(p, [0, 1, 2, 3, 4], [0] + [1 + w for w in wires]).reshape(2, -1)
        assert np.allclose(measure.probs(psi, wires, 4).numpy(), ref, atol=1e-14)


def test_pauli_fast_path_matches_dense_on_many_words():
    gen = torch.Generator().manual_seed(3)
    n = 5
    psi = torch.randn(3, 2 ** n, dtype=torch.complex128, generator=gen)
    psi = psi / psi.norm(dim=-1, keepdim=True)
    rng = np.random.default_rng(0)
    for _ in range(30):
        k = int(rng.integers(1, n + 1))
        wires = [int(w) for w in rng.permutation(n)[:k]]
        obs = None
        for w in wires:
            f = getattr(qd, str(rng.choice(list("XYZ"))))(w)
            obs = f if obs is None else obs @ f
        obs = as_observable(obs)
        m = obs.matrix(wire_order=range(n))
        ref = torch.einsum("bi,ij,bj->b", psi.conj(), m, psi).real
        assert torch.allclose(measure.expval(psi, obs, n), ref, atol=1e-12)


def test_observable_algebra_simplifies_like_terms():
    h = 0.5 * qd.Z(0) @ qd.Z(1) - 0.2 * qd.X(0) + qd.Z(0) @ qd.Z(1)
    assert len(h.terms) == 2
    dense = (1.5 * np.kron(np.diag([1, -1]), np.diag([1, -1]))
             - 0.2 * np.kron(np.array([[0, 1], [1, 0]]), np.eye(2)))
    assert np.allclose(h.matrix(wire_order=[0, 1]).numpy(), dense)
    # X @ Y on the same wire is iZ: the product is kept exact (and is not Hermitian)
    p = qd.X(0) @ qd.Y(0)
    assert np.allclose(p.matrix(wire_order=[0]).numpy(), 1j * np.diag([1, -1]))



def test_eigvals_of_observables_equal_numpy_and_pennylane():
    """Real eigenvalues (ascending) of a Hermitian observable; the complex ones of an operator
    that is not Hermitian (``X(0) @ Y(0)`` is ``1j * Z(0)``), as ``qml.eigvals``, not those of
    one triangle of its matrix."""
    herm = np.array([[1.0, 0.5 - 0.2j], [0.5 + 0.2j, -1.0]])
    for obs in (0.5 * qd.Z(0) @ qd.X(2) + qd.Hermitian(herm, 1) - 2.0, qd.Z(0) @ qd.Z(3)):
        m = obs.matrix().numpy()
        assert obs.eigvals().dtype == torch.float64
        assert np.allclose(obs.eigvals().numpy(), np.linalg.eigvalsh(m), atol=1e-12)
    for obs in (qd.X(0) @ qd.Y(0), 2j * qd.Z(0) + qd.X(1)):
        got = np.sort_complex(obs.eigvals().numpy())
        assert np.allclose(got, np.sort_complex(np.linalg.eigvals(obs.matrix().numpy())))
    assert np.allclose(np.sort_complex((qd.X(0) @ qd.Y(0)).eigvals().numpy()), [-1j, 1j])


def test_numpy_scalars_add_to_observables_as_they_multiply_them():
    for c in (np.array(2.5), np.float64(2.5), 2.5):
        for got, want in ((qd.Z(0) + c, [[3.5, 0], [0, 1.5]]), (c + qd.Z(0), [[3.5, 0], [0, 1.5]]),
                          (qd.Z(0) - c, [[-1.5, 0], [0, -3.5]]),
                          (c - qd.Z(0), [[1.5, 0], [0, 3.5]]),
                          (qd.Z(0) * c, [[2.5, 0], [0, -2.5]])):
            assert isinstance(got, qd.Observable)
            assert np.allclose(got.matrix(wire_order=[0]).numpy(), want)
    assert np.allclose((qd.Z(0) - np.array([2.5])).matrix().numpy(), [[-1.5, 0], [0, -3.5]])


def test_a_sum_built_term_by_term_keys_each_term_a_bounded_number_of_times(monkeypatch):
    """``sum(c * P for ...)`` merges like terms without re-keying the terms already summed:
    work linear in the number of terms (it was quadratic: seconds for a few thousand)."""
    from qdiff.circuits.observables import Factor
    calls = [0]
    key = Factor.key

    def counted(self):
        calls[0] += 1
        return key(self)

    monkeypatch.setattr(Factor, "key", counted)
    k = 600
    words = [qd.Z(i % 7) @ qd.X(7 + i % 11) for i in range(k)]  # 77 distinct words
    calls[0] = 0
    h = sum(0.5 * w for w in words) - qd.Z(0) @ qd.X(7) + qd.Y(3)
    assert calls[0] < 20 * k
    assert len(h.terms) == 78
    ref = {}
    for i in range(k):
        ref[(i % 7, 7 + i % 11)] = ref.get((i % 7, 7 + i % 11), 0.0) + 0.5
    ref[(0, 7)] -= 1.0
    got = {tuple(sorted(f.wires[0] for f in t)): float(c)
           for c, t in zip(h.coeffs, h.terms) if len(t) == 2}
    assert got == pytest.approx(ref)
    assert [repr(f) for f in h.terms[-1]] == ["Y(3)"]


def test_counts_of_observables_bits_and_mid_circuit_values():
    """PennyLane's counts(op=None, wires=None, all_outcomes=False): eigenvalue counts of an
    observable, bit-string counts of wires, every outcome listed on request."""
    dev = qd.device("statevector", wires=3, shots=400, seed=3)

    @qd.qnode(dev)
    def f(x):
        qd.RY(x, wires=0)
        qd.CNOT(wires=[0, 1])
        m = qd.measure(0)
        return (qd.counts(qd.Z(0) @ qd.X(2), all_outcomes=True),
                qd.counts(wires=[0, 1], all_outcomes=True),
                qd.counts(op=qd.Z(1)), qd.counts(m), qd.counts(op=[m]),
                qd.counts(0.5 * qd.Hermitian(torch.diag(torch.tensor(
                    [1.0, 2.0, 3.0, 5.0], dtype=torch.float64)), wires=[0, 2]),
                    all_outcomes=True),
                qd.counts(qd.Z(2)))
    a, b, c, d, e, h, z2 = f(torch.tensor(math.pi, dtype=torch.float64))
    assert set(a) == {-1.0, 1.0} and sum(a.values()) == 400  # Z0 = -1, X2 = +-1
    assert b == {"00": 0, "01": 0, "10": 0, "11": 400}
    assert c == {-1.0: 400} and d == {1.0: 400} and e == {"1": 400}
    assert h == {0.5: 0, 1.0: 0, 1.5: 400, 2.5: 0}  # |1 0> on wires (0, 2): eigenvalue 3 / 2
    assert z2 == {1.0: 400}
    batch = f(torch.tensor([0.0, math.pi], dtype=torch.float64))
    assert [r["11"] for r in batch[1]] == [0, 400] and [r["00"] for r in batch[1]] == [400, 0]
    # reference: PennyLane on the same circuit gives the same keys
    import pennylane as qml
    pdev = qml.device("default.qubit", wires=3)

    @qml.set_shots(50)
    @qml.qnode(pdev)
    def g():
        qml.PauliX(0)
        return qml.counts(qml.PauliZ(0)), qml.counts(wires=[0, 1], all_outcomes=True)
    pa, pb = g()
    dev2 = qd.device("statevector", wires=3, shots=50, seed=0)
    qa, qb = qd.qnode(dev2)(lambda: (qd.X(0), qd.counts(qd.Z(0)),
                                     qd.counts(wires=[0, 1], all_outcomes=True))[1:])()
    assert {float(k): v for k, v in pa.items()} == qa and dict(pb) == qb


def test_counts_tally_the_samples_drawn_with_the_same_seed():
    """Counts of bits and of eigenvalues are the samples of the same seed, tallied (a batch
    row by row); every key a string of the wires' bits or an outcome, every count an int."""
    from collections import Counter
    shots = 3000
    w = weights((2,))

    def run(meas):
        dev = qd.device("statevector", wires=N, shots=shots, seed=11)
        return qd.qnode(dev)(lambda w: (prepare(w), meas())[1])(w)
    for wires in ([2, 0], [1], [0, 1, 2]):
        bits, cnt = run(lambda: qd.sample(wires=wires)), run(lambda: qd.counts(wires=wires))
        for b, c in zip(bits, cnt):
            ref = Counter("".join(map(str, row)) for row in b.tolist())
            assert c == dict(sorted(ref.items())) and list(c) == sorted(c)
            assert all(type(v) is int for v in c.values())
    obs = qd.Z(0) @ qd.X(1)
    vals, cnt = run(lambda: qd.sample(obs)), run(lambda: qd.counts(obs))
    for v, c in zip(vals, cnt):
        assert c == dict(sorted(Counter(v.tolist()).items()))


@pytest.mark.parametrize("scale", [1e-13, 1e-9, 1e3])
def test_counts_of_an_observable_keep_every_eigenvalue_at_any_scale(scale):
    """Counts of ``c * O`` are its samples of the same seed tallied, each distinct eigenvalue
    its own key, for a coefficient far below 1 as well (as PennyLane's counts of
    ``qml.s_prod``)."""
    from collections import Counter

    def run(meas):
        dev = qd.device("statevector", wires=2, shots=2000, seed=5)
        return qd.qnode(dev)(lambda x: (qd.RX(x, 0), qd.RY(x, 1), meas())[-1])(
            torch.tensor(1.0, dtype=torch.float64))
    for obs in (scale * qd.Z(0), scale * qd.Hermitian(np.diag([1.0, 2.0]), 1),
                scale * (qd.Z(0) + qd.X(0))):
        seen = Counter(run(lambda: qd.sample(obs)).tolist())
        cnt = run(lambda: qd.counts(obs, all_outcomes=True))
        assert len(cnt) == len(seen) == 2
        for (key, c), (v, n) in zip(sorted(cnt.items()), sorted(seen.items())):
            assert abs(key - v) <= 1e-9 * scale and c == n


def test_counts_refuses_what_it_cannot_count():
    dev = qd.device("statevector", wires=2, shots=10)
    wide = sum((qd.X(w) for w in range(13)), qd.Z(0))
    for bad, pattern in [(lambda: qd.counts(wide), "at most 12 wires; this one acts on 13"),
                         (lambda: qd.counts(qd.Z(0), wires=[1]), "not both"),
                         (lambda: qd.sample(qd.Z(0), wires=[1]), "not both"),
                         (lambda: qd.counts(wires=[0], all_outcomes=1), "True or False"),
                         (lambda: qd.counts(op=[qd.Z(0)]), "mid-circuit")]:
        with pytest.raises(qd.QdiffError, match=pattern):
            qd.qnode(dev)(lambda b=bad: (qd.H(0), b())[1])()
    big = qd.device("statevector", wires=21, shots=1)
    with pytest.raises(qd.QdiffError, match="2\\*\\*21 outcomes"):
        qd.qnode(big)(lambda: qd.counts(all_outcomes=True))()



def test_products_sharing_a_wire_with_a_matrix_factor_multiply_as_matrices():
    """Hermitian(A, [0, 1]) @ Z(0) is the matrix product on wires 0, 1 (as qml.prod); a
    product that is not Hermitian is refused when measured."""
    rng = np.random.default_rng(0)
    b = rng.normal(size=(4, 4))
    b = b + b.T
    d = np.diag([1.0, 2.0, 3.0, 4.0])
    zero = np.diag([1.0, 0.0])
    z = np.diag([1.0, -1.0])
    x = np.array([[0.0, 1.0], [1.0, 0.0]])
    # B on wires (2, 1) as a matrix on wires (0, 1, 2): swap its two wires, then I on wire 0
    swap = np.eye(4)[[0, 2, 1, 3]]
    b21 = np.kron(np.eye(2), swap @ b @ swap)
    z0 = np.kron(z, np.eye(2))
    for obs, ref in ((qd.Hermitian(d, [0, 1]) @ qd.Z(0), np.kron(d @ z0, np.eye(2))),
                     (qd.Z(1) @ qd.Hermitian(b, [2, 1]), np.kron(np.eye(2), z0) @ b21),
                     (qd.Hermitian(zero, [1]) @ qd.X(0) @ qd.Hermitian(zero, [1]),
                      np.kron(np.kron(x, zero), np.eye(2)))):
        assert np.allclose(obs.matrix(wire_order=[0, 1, 2]).numpy(), ref, atol=1e-14)
    dev = qd.device("statevector", wires=2)
    val = qd.qnode(dev)(lambda: (qd.RY(0.5, 0), qd.expval(qd.Hermitian(d, [0, 1]) @ qd.Z(0)))[1])()
    assert abs(float(val) - (1.0 * math.cos(0.25) ** 2 - 3.0 * math.sin(0.25) ** 2)) < 1e-14
    with pytest.raises(qd.QdiffError, match="not Hermitian"):
        qd.qnode(dev)(lambda: qd.expval(qd.Hermitian(b, [0, 1]) @ qd.X(0)))()

def test_a_one_wire_observable_divides_by_a_scalar():
    dev = qd.device("statevector", wires=2)
    for obs in (qd.Z(0) / 2, qd.Z(0) / torch.tensor(2.0, dtype=torch.float64)):
        val = qd.qnode(dev)(lambda o=obs: (qd.RY(0.5, wires=0), qd.expval(o))[1])()
        torch.testing.assert_close(val, torch.tensor(math.cos(0.5) / 2, dtype=torch.float64))



def _graph_size(t: torch.Tensor) -> int:
    seen, todo = set(), [t.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        todo.extend(nxt for nxt, _ in node.next_functions)
    return len(seen)


def test_hamiltonian_of_many_terms_is_one_operation_on_its_coefficients():
    """qd.Hamiltonian(coeffs, ops) with coefficients that require grad: a graph of a few
    nodes whatever the number of terms (a node per term made the backward quadratic: 25 s
    for 80,000 terms), and unit terms keep the given tensor, so one Hamiltonian serves
    several backward passes."""
    k = 3000
    words = [qd.Z(i % 12) @ qd.X(12 + i // 12) for i in range(k)]
    c = torch.linspace(-1.0, 1.0, k, dtype=torch.float64, requires_grad=True)
    h = qd.Hamiltonian(c, words)
    assert len(h.terms) == k and _graph_size(h.coeffs) < 5
    scaled = qd.Hamiltonian(c, [2.0 * w for w in words[:-1]] + [qd.Y(0) + qd.X(1)])
    assert len(scaled.terms) == k + 1 and _graph_size(scaled.coeffs) < 8
    (g,) = torch.autograd.grad(scaled.coeffs.sum(), c)
    assert torch.equal(g, torch.tensor([2.0] * (k - 1) + [2.0], dtype=torch.float64))
    dev = qd.device("statevector", wires=2)
    small = torch.tensor([0.5, -0.25], dtype=torch.float64, requires_grad=True)
    ham = qd.Hamiltonian(small, [qd.Z(0), qd.X(0) @ qd.Z(1)])
    circuit = qd.qnode(dev)(lambda x: (qd.RY(x, wires=0), qd.expval(ham))[1])
    x = torch.tensor(0.3, dtype=torch.float64)
    for _ in range(2):
        small.grad = None
        circuit(x).backward()
        torch.testing.assert_close(small.grad, torch.tensor([math.cos(0.3), math.sin(0.3)],
                                                            dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hamiltonian_of_unit_terms_follows_an_optimizer_step_on_its_coefficients(dtype):
    """A qd.Hamiltonian of unit terms built once from a trainable coefficient tensor (float32,
    torch's default, as well as float64) sees the optimizer's in-place updates: every step's
    expectation uses the current coefficients, not those at construction."""
    c = torch.tensor([0.3, 0.7], dtype=dtype, requires_grad=True)
    ham = qd.Hamiltonian(c, [qd.Z(0) @ qd.Z(1), qd.X(0)])
    circuit = qd.qnode(qd.device("statevector", wires=2))(
        lambda x: (qd.RY(x, wires=0), qd.expval(ham))[1])
    x = torch.tensor(0.4, dtype=dtype)
    opt = torch.optim.SGD([c], lr=1.0)
    for _ in range(3):
        opt.zero_grad()
        val = circuit(x)
        expected = c.detach().double() @ torch.tensor([math.cos(0.4), math.sin(0.4)],
                                                       dtype=torch.float64)
        assert val.dtype == dtype
        assert abs(val.item() - expected.item()) < 1e-6
        val.backward()
        opt.step()


@pytest.mark.parametrize("diff_method", ["backprop", "adjoint", "parameter-shift"])
def test_hamiltonian_coefficient_list_with_a_trainable_tensor(diff_method):
    """qd.Hamiltonian([c, 0.5], ops) with c a 0-d tensor that requires grad, as PennyLane's
    Hamiltonian takes it: the expectation is differentiable with respect to c; a coefficient
    that is not a number, or a tensor of several, is refused by name."""
    c = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    x = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    h = qd.Hamiltonian([c, 0.5], [qd.Z(0), qd.X(1)])
    assert h.coeffs.dtype == torch.float64 and h.coeffs.requires_grad

    @qd.qnode(qd.device("statevector", wires=2), diff_method=diff_method)
    def f(x):
        qd.RX(x, wires=0)
        return qd.expval(h)

    val = f(x)
    gc, gx = torch.autograd.grad(val, (c, x))
    torch.testing.assert_close(val, torch.tensor(0.7 * math.cos(0.3), dtype=torch.float64))
    torch.testing.assert_close(gc, torch.tensor(math.cos(0.3), dtype=torch.float64))
    torch.testing.assert_close(gx, torch.tensor(-0.7 * math.sin(0.3), dtype=torch.float64))
    assert qd.Hamiltonian([c, 0.5j], [qd.Z(0), qd.X(1)]).coeffs.dtype == torch.complex128
    with pytest.raises(qd.QdiffError, match="must be numbers"):
        qd.Hamiltonian([c, "a"], [qd.Z(0), qd.X(1)])
    with pytest.raises(qd.QdiffError, match="one element"):
        qd.Hamiltonian([c, torch.tensor([1.0, 2.0])], [qd.Z(0), qd.X(1)])


def test_observable_scalars_tensors_powers_and_sums():
    """Tensor scalars add and subtract (gradients kept), a batch of coefficients is refused by
    name, integer powers multiply out, and sum() adds no identity term."""
    h = qd.X(0) + qd.Z(1)
    t = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    shifted = t * h - t + 1.0
    assert [repr(f) for term in shifted.terms for f in term] == ["X(0)", "Z(1)"]
    ref = 2 * h.matrix(wire_order=[0, 1]) - torch.eye(4)
    assert torch.allclose(shifted.matrix(wire_order=[0, 1]), ref.to(torch.complex128))
    (g,) = torch.autograd.grad(shifted.coeffs.sum(), t)
    assert float(g) == 1.0
    with pytest.raises(qd.QdiffError, match="one element"):
        torch.tensor([1.0, 2.0]) * qd.X(0)
    with pytest.raises(qd.QdiffError, match="one element"):
        h - torch.tensor([1.0, 2.0])
    sq = (0.5 * qd.X(0) + qd.Z(1)) ** 2  # 1.25 I + X(0) Z(1)
    dense = (0.5 * qd.X(0) + qd.Z(1)).matrix(wire_order=[0, 1])
    assert torch.allclose(sq.matrix(wire_order=[0, 1]), dense @ dense, atol=1e-15)
    assert len(((qd.Y(0) @ qd.X(1)) ** 0).terms) == 1 and not ((qd.Y(0) @ qd.X(1)) ** 0).wires
    with pytest.raises(TypeError):
        h ** 0.5
    one = sum([qd.Z(0) @ qd.Z(1)])
    assert len(one.terms) == 1 and len((h - 0).terms) == 2
    dev = qd.device("statevector", wires=2, shots=10, seed=1)
    assert qd.qnode(dev)(lambda: qd.counts(sum([qd.Z(0) @ qd.Z(1)])))() == {1.0: 10}


def test_hamiltonian_takes_a_list_and_an_empty_one_is_zero_with_shots():
    with pytest.raises(qd.QdiffError, match="list of observables"):
        qd.Hamiltonian([1.0], qd.Z(0))
    dev = qd.device("statevector", wires=2, shots=20, seed=3)
    for kind in ("expval", "var"):
        val = qd.qnode(dev)(lambda k=kind: getattr(qd, k)(qd.Hamiltonian([], [])))()
        assert float(val) == 0.0

_EMPTY_KINDS = {"expval": lambda: qd.expval(qd.Z(0)), "var": lambda: qd.var(qd.X(1)),
                "probs": lambda: qd.probs(wires=[1]), "probs_all": lambda: qd.probs(),
                "sample": lambda: qd.sample(), "sample_obs": lambda: qd.sample(qd.Z(0)),
                "counts": lambda: qd.counts(), "state": lambda: qd.state(),
                "density_matrix": lambda: qd.density_matrix([0]),
                "purity": lambda: qd.purity([0])}


@pytest.mark.parametrize("shots", [None, 5])
@pytest.mark.parametrize("kind", sorted(_EMPTY_KINDS))
@pytest.mark.parametrize("name", ["statevector", "mixed"])
def test_an_empty_batch_gives_empty_outputs_of_the_batched_shape(name, kind, shots):
    """A batch of no bindings: each output has leading dim 0 and the shape and dtype of a
    batch of two (counts: an empty list); what a batch of two refuses is refused as well."""
    dev = qd.device(name, wires=2, shots=shots, seed=1)
    if name == "mixed" and kind == "state":
        pytest.skip("the mixed device returns density matrices")
    f = qd.qnode(dev)(lambda x, m=_EMPTY_KINDS[kind]: (qd.RX(x, 0), qd.RY(0.3, 1), m())[-1])
    for dt in (torch.float64, torch.float32):
        try:
            two = f(torch.rand(2, dtype=dt))
        except qd.QdiffError as exc:
            with pytest.raises(qd.QdiffError, match=re.escape(str(exc))):
                f(torch.rand(0, dtype=dt))
            return
        empty = f(torch.rand(0, dtype=dt))
        if kind == "counts":
            assert empty == []
            continue
        assert empty.shape == (0,) + two.shape[1:] and empty.dtype == two.dtype
        batched = f(torch.rand(0, 3, dtype=dt))  # (0, 3): empty batch dims broadcast too
        assert batched.shape == (0, 3) + two.shape[1:]


@pytest.mark.parametrize("method", ["best", "backprop", "adjoint", "parameter-shift",
                                    "finite-diff", "spsa"])
def test_an_empty_batch_differentiates_to_empty_and_zero_gradients(method):
    """As torch gives for a layer on an empty batch: the inputs' gradient is empty, the
    weights' (and trainable observable coefficients') zero."""
    dev = qd.device("statevector", wires=2)

    def body(x, w):
        qd.AngleEmbedding(x, wires=range(2))
        qd.StronglyEntanglingLayers(w, wires=range(2))
        return qd.expval(qd.Z(0)), qd.probs(wires=[1])
    f = qd.qnode(dev, diff_method=method)(body)
    x = torch.rand(0, 2, dtype=torch.float64, requires_grad=True)
    w = torch.rand(1, 2, 3, dtype=torch.float64, requires_grad=True)
    ev, pr = f(x, w)
    assert ev.shape == (0,) and pr.shape == (0, 2)
    gx, gw = torch.autograd.grad(ev.sum() + pr.sum(), (x, w))
    assert gx.shape == (0, 2) and torch.equal(gw, torch.zeros_like(w))
    c = torch.tensor([0.5, -1.0], dtype=torch.float64, requires_grad=True)
    g = qd.qnode(dev, diff_method="backprop")(
        lambda x, c: (qd.RX(x, 0), qd.expval(c[0] * qd.Z(0) + c[1] * qd.X(1)))[-1])
    (gc,) = torch.autograd.grad(g(torch.rand(0, dtype=torch.float64), c).sum(), c)
    assert torch.equal(gc, torch.zeros_like(c))


@pytest.mark.parametrize("op", [None, "z"])
def test_counts_all_outcomes_is_part_of_what_a_call_records(op):
    """Two calls of the same circuit, one asking for every outcome and one not, give
    PennyLane's two answers: zero counts are listed only when asked for."""
    def run(all_outcomes):
        dev = qd.device("statevector", wires=2, shots=20, seed=1)

        @qd.qnode(dev)
        def f(x):
            qd.RX(x, wires=0)
            if op is None:
                return qd.counts(wires=[1, 0], all_outcomes=all_outcomes)
            return qd.counts(qd.Z(0), all_outcomes=all_outcomes)
        return f(torch.tensor([0.0, 0.0], dtype=torch.float64))
    zero = {"00": 20} if op is None else {1.0: 20}
    every = {"00": 20, "01": 0, "10": 0, "11": 0} if op is None else {-1.0: 0, 1.0: 20}
    assert run(False) == [zero, zero]
    assert run(True) == [every, every]
    assert run(False) == [zero, zero]


@pytest.mark.parametrize("dtype", [torch.complex128, torch.complex64])
def test_counts_of_a_hermitian_product_list_each_eigenvalue_once(dtype):
    """Eigenvalue keys of a product of Hermitian factors: each eigenvalue of the product
    (numpy's eigvalsh, times the coefficient) is one key, sampled or not, in either
    precision."""
    rng = np.random.default_rng(5)
    for trial in range(6):
        a = rng.normal(size=(2, 2)) + 1j * rng.normal(size=(2, 2))
        a = a + a.conj().T
        b = rng.normal(size=(4, 4))
        b = b + b.T
        c = float(rng.uniform(-2, 2))
        obs = c * qd.Hermitian(a, wires=0) @ qd.Hermitian(b, wires=[1, 2])
        dev = qd.device("statevector", wires=3, shots=2000, seed=trial, dtype=dtype)

        def body(o=obs):
            qd.Hadamard(0)
            qd.RY(0.4, wires=1)
            qd.CNOT(wires=[0, 2])
            return qd.counts(o, all_outcomes=True), qd.counts(o)
        every, seen = qd.qnode(dev)(body)()
        eig = np.sort(c * np.kron(np.linalg.eigvalsh(a), np.linalg.eigvalsh(b)))
        np.testing.assert_allclose(sorted(every), eig, atol=1e-9)
        assert sum(every.values()) == 2000 and sum(seen.values()) == 2000
        assert set(seen) <= set(every)


@pytest.mark.parametrize("name", ["statevector", "mixed"])
def test_sample_and_var_of_a_sum_commuting_wire_by_wire_with_shots(name):
    """As PennyLane's qml.sample(H)/qml.var(H) with shots: terms that agree on each wire are
    measured in one basis; each shot's value is the sum's. The sample mean and variance
    match the exact expectation and variance. Terms that do not share a basis wire by wire
    (Hadamard, Z0 + X0) are read out in the eigenbasis of the sum's dense matrix, as PennyLane
    does; past the dense readout's width they are refused."""
    obs = [lambda: qd.Z(0) + qd.X(1), lambda: 0.5 * qd.Z(0) @ qd.X(1) - 1.5 * qd.X(1) + 0.3,
           lambda: qd.Z(0) + qd.Z(1) @ qd.Z(0), lambda: qd.Z(0) + qd.X(0),
           lambda: qd.X(0) @ qd.Z(1) + qd.Z(0), lambda: qd.Hadamard(0),
           lambda: 0.5 * qd.Hadamard(0) @ qd.Y(1) + qd.Z(1)]

    def prepare(x):
        qd.RX(x, 0)
        qd.RY(0.3, 1)
        qd.CNOT([0, 1])
    x = torch.tensor([0.4, 1.3], dtype=torch.float64)
    exact = qd.qnode(qd.device("statevector", wires=2))(
        lambda x, o: (prepare(x), qd.expval(o()), qd.var(o()))[1:])
    shots = qd.qnode(qd.device(name, wires=2, shots=20000, seed=3))(
        lambda x, o: (prepare(x), qd.sample(o()), qd.var(o()))[1:])
    for o in obs:
        ev, var = exact(x, o).unbind(-1)
        s, v = shots(x, o)
        assert s.shape == (2, 20000) and s.dtype == torch.float64
        se = (var / 20000) ** 0.5
        assert bool(((s.mean(-1) - ev).abs() <= 5 * se + 1e-12).all())
        torch.testing.assert_close(v, var, atol=0.06, rtol=0.0)
        torch.testing.assert_close(s.var(-1, correction=0), v, atol=0.06, rtol=0.0)
    wide = sum((qd.X(w) for w in range(13)), qd.Z(0))
    f = qd.qnode(qd.device(name, wires=13, shots=10))
    for bad in (lambda: qd.sample(wide), lambda: qd.var(wide)):
        with pytest.raises(qd.QdiffError, match="at most 12 wires; this one acts on 13"):
            f(lambda b=bad: (qd.H(0), b())[1])()


@pytest.mark.parametrize("name", ["statevector", "mixed"])
def test_counts_of_a_sum_are_counts_of_its_eigenvalues(name):
    """counts(op) of a sum (Hadamard, Z0 + X0, Z0 + Z1) counts the eigenvalues of its dense
    matrix, as PennyLane's qml.counts(H): every key an eigenvalue, the frequencies those of the
    exact distribution over the eigenvalues."""
    from qdiff.circuits.observables import as_observable
    cases = [(qd.Hadamard(0), "Hadamard"), (qd.Z(0) + qd.X(0), "Z0 + X0"),
             (qd.Z(0) + qd.Z(1), "Z0 + Z1")]

    def prepare():
        qd.RX(0.7, 0)
        qd.RY(-0.4, 1)
        qd.CNOT([0, 1])
    exact = qd.qnode(qd.device("statevector", wires=2))(lambda: (prepare(), qd.state())[1])()
    for obs, label in cases:
        dev = qd.device(name, wires=2, shots=40000, seed=7)
        counts = qd.qnode(dev)(lambda o=obs: (prepare(), qd.counts(o))[1])()
        vals, vecs = np.linalg.eigh(as_observable(obs).matrix([0, 1]).numpy())
        amp = vecs.conj().T @ exact.numpy()
        want: dict = {}
        for v, a in zip(vals, amp):
            key = round(float(v), 9) + 0.0
            want[key] = want.get(key, 0.0) + abs(a) ** 2
        got = {round(k, 9) + 0.0: c / 40000 for k, c in counts.items()}
        assert set(got) <= set(want), (label, got, want)
        for k, p in want.items():
            assert abs(got.get(k, 0.0) - p) < 5 * (p * (1 - p) / 40000) ** 0.5 + 1e-9, (label, k)


@pytest.mark.parametrize("method", ["best", "parameter-shift", "finite-diff", "spsa"])
def test_samples_and_counts_of_trainable_inputs_are_returned_without_gradient(method):
    """As PennyLane: a qnode returning only samples and counts runs with inputs that require
    grad (the outputs carry no gradient); next to a differentiated output, the values are those
    of a call without gradients (one run of the circuit) and the expval carries the diff
    method's derivative."""
    dev = qd.device("statevector", wires=2, shots=50, seed=2)

    @qd.qnode(dev, diff_method=method)
    def f(x):
        qd.RX(x, wires=0)
        qd.CNOT(wires=[0, 1])
        return qd.sample(wires=[0, 1]), qd.counts(wires=[1]), qd.sample(qd.Z(0) @ qd.Z(1))
    x = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    bits, counts, zz = f(x)
    assert bits.shape == (50, 2) and not bits.requires_grad and not zz.requires_grad
    assert torch.equal(bits[:, 0], bits[:, 1]) and torch.equal(zz, torch.ones(50, dtype=zz.dtype))
    assert sum(counts.values()) == 50

    def g(x):
        qd.RX(x, wires=0)
        return qd.expval(qd.Z(0)), qd.sample(wires=[0]), qd.counts(wires=[0])
    shots = 40000
    ev, bits, counts = qd.qnode(qd.device("statevector", wires=1, shots=shots, seed=5),
                                diff_method=method)(g)(x)
    with torch.no_grad():
        ev0, bits0, counts0 = qd.qnode(qd.device("statevector", wires=1, shots=shots, seed=5),
                                       diff_method=method)(g)(x)
    assert ev.requires_grad and not bits.requires_grad
    assert float(ev) == float(ev0) and torch.equal(bits, bits0) and counts == counts0
    ev.backward()
    if method in ("best", "parameter-shift"):  # exact rules: the derivative of cos(x)
        assert abs(float(x.grad) + math.sin(2.0)) < 5 * (1 / shots) ** 0.5 * 2
    assert x.grad is not None and torch.isfinite(x.grad)


def _bell_like(x):
    qd.RX(x, wires=0)
    qd.RY(0.7, wires=1)
    qd.CNOT(wires=[0, 1])
    qd.RX(0.3, wires=2)


@pytest.mark.parametrize("device", TORCH_DEVICES)
@pytest.mark.parametrize("name", ["statevector", "mixed"])
@pytest.mark.parametrize("batch", [(), (3,)])
def test_measurements_sharing_a_basis_read_one_draw_of_each_call(name, batch, device):
    """As PennyLane's default.qubit reads a group of measurements that share a basis from one
    set of samples: Z words, probs, sample and counts of wires read the computational basis's
    one draw (expval(Z0) == 1 - 2 mean(sample(wires=0)), probs == counts / shots, var from the
    same bits); X0 and X0 @ Z2 one draw in the X/Z basis; a sum of such terms the same bits;
    each batch row its own draw; on the angles' device."""
    shots = 300
    dev = qd.device(name, wires=3, shots=shots, seed=4)

    @qd.qnode(dev)
    def f(x):
        _bell_like(x)
        return (qd.expval(qd.Z(0)), qd.sample(wires=[0, 1]), qd.expval(qd.Z(0) @ qd.Z(1)),
                qd.probs(wires=[1, 0]), qd.var(qd.Z(1)), qd.expval(qd.X(0)),
                qd.sample(qd.X(0) @ qd.Z(2)), qd.var(qd.X(0)), qd.sample(qd.Z(1)),
                qd.expval(qd.Z(0) + 0.5 * qd.X(0) @ qd.Z(2)), qd.sample(qd.X(0)),
                qd.counts(wires=[0, 1]))
    x = torch.linspace(0.4, 2.0, 3, dtype=torch.float64) if batch else \
        torch.tensor(0.9, dtype=torch.float64)
    out = f(x.to(device))
    assert all(r.device.type == device for r in out if isinstance(r, torch.Tensor))
    z0, bits, zz, p, v1, x0, xz, vx0, s1, ham, sx0, counts = [
        r.cpu() if isinstance(r, torch.Tensor) else r for r in out]
    b = 1 - 2 * bits.double()
    assert bits.shape == batch + (shots, 2)
    tol = dict(atol=1e-12, rtol=0)
    torch.testing.assert_close(z0, b[..., 0].mean(-1), **tol)
    torch.testing.assert_close(zz, (b[..., 0] * b[..., 1]).mean(-1), **tol)
    idx = bits[..., 1] * 2 + bits[..., 0]
    freq = torch.stack([(idx == k).double().mean(-1) for k in range(4)], -1)
    torch.testing.assert_close(p, freq, **tol)
    for row, c in zip(p.reshape(-1, 4), counts if batch else [counts]):
        want = {f"{k & 1}{k >> 1}": round(float(row[k]) * shots) for k in range(4) if row[k]}
        assert c == want
    torch.testing.assert_close(v1, 1 - b[..., 1].mean(-1) ** 2, **tol)
    torch.testing.assert_close(s1, b[..., 1], **tol)
    torch.testing.assert_close(x0, sx0.mean(-1), **tol)
    torch.testing.assert_close(vx0, 1 - sx0.mean(-1) ** 2, **tol)
    assert torch.equal(xz.abs(), torch.ones_like(xz))
    torch.testing.assert_close(ham, z0 + 0.5 * xz.mean(-1), **tol)
    if batch:  # each row its own draw
        assert len({tuple(r.tolist()) for r in bits[..., 0]}) == 3


@pytest.mark.parametrize("name", ["statevector", "mixed"])
def test_each_partition_of_a_shot_vector_reads_one_draw_per_basis(name):
    """A shot vector's partitions are drawn apart, each one draw per basis group (as
    PennyLane's bins of one set of samples): within each, expval(Z0 @ Z1) and probs come from
    the bits sample(wires) returns."""
    dev = qd.device(name, wires=3, seed=2)

    @qd.qnode(dev, shots=[50, (80, 2)])
    def f(x):
        _bell_like(x)
        return qd.expval(qd.Z(0) @ qd.Z(1)), qd.probs(wires=[0]), qd.sample(wires=[0, 1])
    x = torch.tensor([0.5, 1.7], dtype=torch.float64)
    out = f(x)
    assert [o[2].shape for o in out] == [(2, 50, 2), (2, 80, 2), (2, 80, 2)]
    assert not torch.equal(out[1][2], out[2][2])
    for zz, p0, bits in out:
        b = 1 - 2 * bits.double()
        torch.testing.assert_close(zz, (b[..., 0] * b[..., 1]).mean(-1), atol=1e-12, rtol=0)
        torch.testing.assert_close(p0[..., 1], bits[..., 0].double().mean(-1), atol=1e-12,
                                   rtol=0)


def test_a_hermitian_observable_measured_twice_reads_one_draw():
    """expval, var and sample of one Hermitian (built twice from the same matrix) read its
    eigenbasis once; a Hermitian diagonal in the computational basis shares the Z draw."""
    a = torch.tensor([[1.0, 0.5 - 0.2j], [0.5 + 0.2j, -0.3]], dtype=torch.complex128)
    d = torch.diag(torch.tensor([2.0, -1.0], dtype=torch.complex128))
    dev = qd.device("statevector", wires=3, shots=500, seed=6)

    @qd.qnode(dev)
    def f(x):
        _bell_like(x)
        return (qd.expval(qd.Hermitian(a, 1)), qd.var(qd.Hermitian(a, 1)),
                qd.sample(qd.Hermitian(a, 1)), qd.expval(qd.Hermitian(d, 0)),
                qd.sample(wires=[0]))
    e, v, s, ed, bits = f(torch.tensor(1.2, dtype=torch.float64))
    torch.testing.assert_close(e, s.mean(), atol=1e-12, rtol=0)
    torch.testing.assert_close(v, (s ** 2).mean() - s.mean() ** 2, atol=1e-12, rtol=0)
    torch.testing.assert_close(ed, (2.0 - 3.0 * bits[:, 0].double()).mean(), atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ["statevector", "mixed"])
def test_sample_and_counts_of_no_wires_next_to_other_measurements(name):
    """sample/counts of an empty wire list read nothing: ``(..., shots, 0)`` bits and the
    empty bit string counted once per shot, beside measurements that do draw."""
    dev = qd.device(name, wires=2, shots=6, seed=3)

    @qd.qnode(dev)
    def f(x):
        qd.RX(x, wires=0)
        return qd.sample(wires=[]), qd.counts(wires=[]), qd.probs(wires=[]), qd.sample(wires=[0])
    empty, counts, p, bits = f(torch.tensor([0.3, 2.1], dtype=torch.float64))
    assert empty.shape == (2, 6, 0) and empty.dtype == torch.int64
    assert counts == [{"": 6}, {"": 6}]
    torch.testing.assert_close(p, torch.ones(2, 1, dtype=torch.float64))
    assert bits.shape == (2, 6, 1)


@pytest.mark.parametrize("name", ["statevector", "mixed"])
def test_sampled_var_keeps_the_derivative_of_trainable_coefficients(name):
    """var() of ``c * Z0`` (and of a sum read in one basis) with shots: the coefficients'
    derivative is the one of the sampled values (``2 c var(Z0)`` estimated from the same
    bits); the samples themselves carry none."""
    dev = qd.device(name, wires=2, shots=400, seed=5)

    @qd.qnode(dev, diff_method="parameter-shift")
    def f(c):
        qd.RX(0.8, wires=0)
        qd.RY(0.5, wires=1)
        return (qd.var(c * qd.Z(0)), qd.var(c * qd.Z(0) + 0.5 * qd.Z(0) @ qd.X(1)),
                qd.sample(qd.Z(0)), qd.sample(c * qd.Z(0)))
    c = torch.tensor(1.7, dtype=torch.float64, requires_grad=True)
    v1, v2, z0, cz0 = f(c)
    assert not cz0.requires_grad
    (g1,) = torch.autograd.grad(v1, c)
    torch.testing.assert_close(g1, 2 * 1.7 * z0.double().var(unbiased=False), atol=1e-12, rtol=0)
    (g2,) = torch.autograd.grad(v2, c)
    assert torch.isfinite(g2) and g2 != 0


@pytest.mark.parametrize("method", ["best", "parameter-shift", "finite-diff", "spsa"])
@pytest.mark.parametrize("diagonal", [False, True])
def test_sampled_expval_of_a_trainable_hermitian_is_refused(method, diagonal):
    """With shots, the draw in a Hermitian's eigenbasis estimates its value but not its
    derivative in the matrix (the state's coherences in that basis are not read): refused
    by name, not a biased gradient; without gradients, or exact, it runs."""
    a = torch.tensor([[1.0, 0.5 - 0.2j], [0.5 + 0.2j, -0.3]], dtype=torch.complex128)
    a = (torch.diag(torch.diagonal(a)) if diagonal else a).requires_grad_(True)
    dev = qd.device("statevector", wires=2, shots=200, seed=1)

    @qd.qnode(dev, diff_method=method)
    def f(x, a):
        qd.RX(x, wires=0)
        qd.CNOT(wires=[0, 1])
        qd.RY(0.5, wires=1)
        return qd.expval(qd.Hermitian(a, 1)), qd.var(qd.Z(0))
    x = torch.tensor(0.8, dtype=torch.float64)
    with pytest.raises(qd.QdiffError, match="expval.*shots.*trainable matrix"):
        f(x, a)
    with torch.no_grad():
        assert torch.isfinite(f(x, a)[0])
    e = f(x, a, shots=None)[0]
    (g,) = torch.autograd.grad(e, a)
    assert abs(complex(g[0, 1])) > 0.1  # the exact derivative reads the coherence
