"""qdiff.primitives: Estimator/Sampler against Qiskit's StatevectorEstimator/StatevectorSampler
on random PUBs (random parametrized circuits, observables and broadcast shapes), shot
statistics, the bit layout of registers, errors, and Qiskit ML's EstimatorQNN + TorchConnector
training on qdiff's Estimator."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from qdiff import QdiffError, QdiffMemoryError
from qdiff.primitives import Estimator, Sampler

GATES1 = ["rx", "ry", "rz", "p"]
GATES2 = ["crx", "cp", "rzz", "rxx"]


def random_circuit(rng, n: int, num_params: int, depth: int = 6):
    """A random parametrized circuit; angles are parameters, affine maps, or products/sines."""
    from qiskit import QuantumCircuit
    from qiskit.circuit import ParameterVector
    pv = ParameterVector("p", num_params)
    qc = QuantumCircuit(n)

    def angle():
        if not num_params:
            return rng.uniform(-3, 3)
        a, b = pv[rng.integers(num_params)], pv[rng.integers(num_params)]
        return [a, 2 * a - 0.3, a * b, (a + b).sin()][rng.integers(0, 4)]
    for q in range(n):
        qc.h(q)
    for _ in range(depth):
        if n > 1 and rng.random() < 0.4:
            q0, q1 = rng.choice(n, 2, replace=False)
            g = GATES2[rng.integers(len(GATES2))] if rng.random() < 0.6 else "cx"
            getattr(qc, g)(*([angle()] if g != "cx" else []), int(q0), int(q1))
        else:
            getattr(qc, GATES1[rng.integers(len(GATES1))])(angle(), int(rng.integers(n)))
    used = qc.num_parameters
    return qc, used


def random_observable(rng, n: int):
    from qiskit.quantum_info import SparsePauliOp
    k = int(rng.integers(1, 4))
    labels = ["".join(rng.choice(list("IXYZ"), n)) for _ in range(k)]
    return SparsePauliOp(labels, rng.uniform(-1, 1, k))


@st.composite
def pubs(draw):
    seed = draw(st.integers(0, 2 ** 31 - 1))
    rng = np.random.default_rng(seed)
    n = draw(st.integers(1, 4))
    qc, used = random_circuit(rng, n, draw(st.integers(0, 3)))
    pshape = draw(st.sampled_from([(), (3,), (2, 1), (1, 4), (2, 3)]))
    oshape = draw(st.sampled_from([(), (1,), (3,), (2, 1), (1, 3)]))
    obs = np.empty(oshape, dtype=object)
    for i in np.ndindex(oshape):
        obs[i] = random_observable(rng, n)
    values = rng.uniform(-np.pi, np.pi, pshape + (used,))
    if used == 0:
        return (qc, obs.tolist() if oshape else obs[()])
    try:
        np.broadcast_shapes(pshape, oshape)
    except ValueError:
        oshape = ()
        obs = obs.reshape(-1)[:1].reshape(())
    return (qc, obs.tolist() if oshape else obs[()], values)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(pubs(), min_size=1, max_size=3))
def test_estimator_matches_statevector_estimator(pub_list):
    from qiskit.primitives import StatevectorEstimator
    ours = Estimator().run(pub_list).result()
    ref = StatevectorEstimator().run(pub_list).result()
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        assert a.data.evs.shape == b.data.evs.shape
        np.testing.assert_allclose(a.data.evs, b.data.evs, atol=1e-10)
        assert (a.data.stds == 0).all()
        assert a.metadata["target_precision"] == 0.0


def test_pubs_of_one_circuit_run_as_one_simulation(monkeypatch):
    """EstimatorQNN's gradient sends one PUB per shifted binding: one qnode call for all."""
    from qiskit.primitives import StatevectorEstimator
    from qdiff.circuit_qnode import CircuitQNode
    rng = np.random.default_rng(0)
    qc, used = random_circuit(rng, 3, 3)
    obs = random_observable(rng, 3)
    pub_list = [(qc, obs, rng.uniform(-1, 1, used)) for _ in range(12)]
    pub_list.append((qc, [obs, "ZZZ"], rng.uniform(-1, 1, (4, 1, used))))
    calls = []
    real = CircuitQNode.__call__
    monkeypatch.setattr(CircuitQNode, "__call__", lambda self, *a, **k: calls.append(1) or
                        real(self, *a, **k))
    ours = Estimator().run(pub_list).result()
    assert len(calls) == 1
    ref = StatevectorEstimator().run(pub_list).result()
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(a.data.evs, b.data.evs, atol=1e-10)


@pytest.mark.parametrize("rows", [5, 9])
def test_rows_beyond_the_memory_budget_run_in_chunks(monkeypatch, rows):
    """A run whose stacked bindings do not fit the memory budget at once (a gradient of a data
    batch) runs in row chunks that do, with Qiskit's values and the same seeded samples; a
    chunk of one row (the last of 5, 7 or 11 rows in pairs) keeps its shape."""
    from qiskit import QuantumCircuit
    from qiskit.circuit import Parameter
    from qiskit.primitives import StatevectorEstimator
    a = Parameter("a")
    qc = QuantumCircuit(10)
    qc.h(range(10))
    qc.ry(a, 0)
    qc.cx(0, 9)
    qm = qc.measure_all(inplace=False)
    values = np.linspace(0, 3, rows)[:, None]
    pubs = [(qc, ["XIIIIIIIIZ", "IIIIIIIIIZ"], values[:, None]),
            (qc, "XIIIIIIIII", [[0.3], [0.1]])]
    small_sample = Sampler(seed=3).run([(qm, values)], shots=50).result()[0].data.meas
    # 300 kB: two rows of a 10-qubit simulation fit, five do not
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "300K")
    got = Estimator().run(pubs).result()
    ref = StatevectorEstimator().run(pubs).result()
    for g, r in zip(got, ref):
        assert g.data.evs.shape == r.data.evs.shape
        np.testing.assert_allclose(g.data.evs, r.data.evs, atol=1e-10)
    sample = Sampler(seed=3).run([(qm, values)], shots=50).result()[0].data.meas
    assert sample.shape == (rows,)
    np.testing.assert_array_equal(sample.array, small_sample.array)


def test_circuits_alike_but_for_the_columns_of_an_expression_keep_their_own_values():
    """``a*c`` reads columns (0, 2) of {a, b, c} and (0, 1) of {a, c, d}: two circuits with the
    same gates on the same columns and the same expression text are different circuits."""
    from qiskit import QuantumCircuit
    from qiskit.circuit import Parameter
    from qiskit.primitives import StatevectorEstimator
    a, b, c, d = (Parameter(n) for n in "abcd")
    first, second = QuantumCircuit(1), QuantumCircuit(1)
    for qc, (p, q, r) in ((first, (a, b, c)), (second, (a, c, d))):
        qc.rx(p, 0); qc.ry(q, 0); qc.rz(r, 0); qc.rx(a * c, 0)
    v = [0.3, 0.7, 1.1]
    est = Estimator()
    for qc in (first, second):
        got = est.run([(qc, ["Z", "X", "Y"], v)]).result()[0].data.evs
        ref = StatevectorEstimator().run([(qc, ["Z", "X", "Y"], v)]).result()[0].data.evs
        np.testing.assert_allclose(got, ref, atol=1e-12)
    sampler = Sampler(seed=3)
    for qc in (first, second):
        p1 = (1 - StatevectorEstimator().run([(qc, "Z", v)]).result()[0].data.evs) / 2
        qc.measure_all()
        got = sampler.run([(qc, v)], shots=100000).result()[0].data.meas.get_counts()
        assert abs(got.get("1", 0) - 100000 * p1) < 500  # 5 sigma; the other column's: 1200


def test_projector_observables_and_unparametrized_circuits():
    from qiskit import QuantumCircuit
    from qiskit.primitives import StatevectorEstimator
    from qiskit.quantum_info import SparseObservable
    qc = QuantumCircuit(2)
    qc.h(0)
    qc.ry(0.4, 1)
    obs = [SparseObservable("0+"), SparseObservable.from_list([("r1", 0.5), ("XZ", -1.0)]), "II"]
    a = Estimator().run([(qc, obs)]).result()[0].data.evs
    # Qiskit's StatevectorEstimator reads Pauli strings only: the projectors expanded for it
    from qiskit.quantum_info import SparsePauliOp
    paulis = [SparsePauliOp.from_sparse_list(SparseObservable(o).as_paulis().to_sparse_list(), 2)
              for o in obs]
    b = StatevectorEstimator().run([(qc, paulis)]).result()[0].data.evs
    np.testing.assert_allclose(a, b, atol=1e-12)


def test_operations_without_a_definition_run_through_their_matrix():
    from qiskit import QuantumCircuit
    from qiskit.circuit.library import PermutationGate
    from qiskit.primitives import StatevectorEstimator
    from qiskit.quantum_info import random_clifford
    obs = ["ZZZ", "IXY", "ZIX", "XYZ"]
    for op, wires in ((random_clifford(2, seed=1), [2, 0]), (PermutationGate([2, 0, 1]), [1, 2, 0])):
        qc = QuantumCircuit(3)
        qc.h(0); qc.ry(0.3, 1); qc.rx(0.7, 2); qc.cx(0, 2)
        qc.append(op, wires)
        ref = StatevectorEstimator().run([(qc, obs)]).result()[0].data.evs
        got = Estimator().run([(qc, obs)]).result()[0].data.evs
        np.testing.assert_allclose(got, ref, atol=1e-12)
    from qdiff.circuits.qiskit_io import MAX_MATRIX_QUBITS
    k = MAX_MATRIX_QUBITS + 1
    qc = QuantumCircuit(k)
    qc.append(PermutationGate(list(range(k))[::-1]), range(k))
    with pytest.raises(QdiffError, match=rf"'permutation' has no gate definition.*{k} qubits"):
        Estimator().run([(qc, "Z" * k)]).result()


def test_precision_samples_shots_with_standard_errors():
    from qiskit.primitives import StatevectorEstimator
    from qiskit.quantum_info import SparsePauliOp
    rng = np.random.default_rng(5)
    qc, used = random_circuit(rng, 2, 2)
    obs = SparsePauliOp.from_list([("XZ", 0.8), ("YI", -0.5), ("II", 0.25)])
    vals = rng.uniform(-1, 1, (200, used))
    exact = StatevectorEstimator().run([(qc, obs, vals)]).result()[0].data.evs
    res = Estimator(default_precision=0.05, seed=7).run([(qc, obs, vals)]).result()[0]
    # shots ceil(|c_i| S / p^2) per sampled word, S = 0.8 + 0.5 (the identity is exact)
    assert res.metadata["target_precision"] == 0.05 and res.metadata["shots"] == 416 + 260
    z = (res.data.evs - exact) / res.data.stds
    assert abs(z.mean()) < 0.35 and 0.7 < z.std() < 1.3  # standard normal errors
    # sqrt(sum c^2 (1 - m^2) / N_i) <= sqrt(sum c^2 / N_i) <= the precision
    expected = np.sqrt(0.64 / 416 + 0.25 / 260)
    assert (res.data.stds <= expected + 1e-12).all() and expected <= 0.05
    again = Estimator(default_precision=0.05, seed=7).run([(qc, obs, vals)]).result()[0]
    np.testing.assert_array_equal(again.data.evs, res.data.evs)  # seeded



@pytest.mark.parametrize("coeffs", [[50.0], [3.0, -1.5, 0.2], [1.0, 1.0, 1.0, 1.0]])
def test_precision_is_the_standard_error_of_the_whole_estimate(coeffs):
    """A precision is a bound on the standard error of each returned value, whatever the
    observable's coefficients (as StatevectorEstimator's and Aer's precision): the spread of
    repeated estimates stays within it, and stds says what it is."""
    from qiskit import QuantumCircuit
    from qiskit.primitives import StatevectorEstimator
    from qiskit.quantum_info import SparsePauliOp
    qc = QuantumCircuit(2)
    qc.ry(0.7, 0)
    qc.rx(-1.1, 1)
    qc.cx(0, 1)
    words = ["ZI", "XX", "IY", "ZZ"][:len(coeffs)]
    obs = SparsePauliOp(words, coeffs)
    exact = StatevectorEstimator().run([(qc, obs)]).result()[0].data.evs
    est = Estimator(seed=np.random.default_rng(3))  # a sequence: each run new shots
    runs = [est.run([(qc, obs)], precision=0.02).result()[0] for _ in range(600)]
    vals = np.array([r.data.evs for r in runs])
    assert vals.std() <= 0.02 * 1.15 and abs(vals.mean() - exact) < 4 * 0.02 / np.sqrt(600)
    stds = np.array([r.data.stds for r in runs])
    assert (stds <= 0.02 + 1e-12).all() and abs(stds.mean() / vals.std() - 1) < 0.15


def test_word_shared_by_observables_takes_the_most_shots_asked():
    from qiskit import QuantumCircuit
    from qiskit.quantum_info import SparsePauliOp
    qc = QuantumCircuit(2)
    qc.h(0)
    qc.cx(0, 1)
    small, big = SparsePauliOp(["ZZ"], [1.0]), SparsePauliOp(["ZZ", "XI"], [4.0, 1.0])
    res = Estimator(seed=1).run([(qc, [small, big])], precision=0.1).result()[0]
    # ZZ: max(ceil(1 * 1 / 0.01), ceil(4 * 5 / 0.01)) = 2000 shots, XI: ceil(1 * 5 / 0.01) = 500
    assert res.metadata["shots"] == 2500
    assert res.data.stds[0] == 0.0 and res.data.evs[0] == 1.0  # <ZZ> = 1: every shot reads +1
    assert 0 < res.data.stds[1] <= 0.1
    with pytest.raises(QdiffError, match="precision must be"):
        Estimator().run([(qc, "ZZ")], precision=True)


@pytest.mark.parametrize("seed", [3, "generator"])
def test_seeded_jobs_submitted_together_match_jobs_run_one_at_a_time(seed):
    """Qiskit runs each PrimitiveJob on a thread of its own: jobs submitted before any result
    is read run at once, and a seeded primitive still gives each job the results it gives when
    the jobs run one after another (its random stream is drawn when the job is submitted; a
    Generator seed's sequence in submission order)."""
    def make_seed():
        return np.random.default_rng(3) if seed == "generator" else seed
    from qiskit.quantum_info import SparsePauliOp
    rng = np.random.default_rng(11)
    qc, used = random_circuit(rng, 4, 4)
    obs = SparsePauliOp.from_list([("ZZXI", 0.7), ("IYIZ", -0.4)])
    vals = [rng.uniform(-1, 1, used) for _ in range(8)]
    qm = qc.copy()
    qm.measure_all()

    def estimates(together):
        est = Estimator(default_precision=0.05, seed=make_seed())
        if together:
            jobs = [est.run([(qc, obs, v)]) for v in vals]
            return [float(j.result()[0].data.evs) for j in jobs]
        return [float(est.run([(qc, obs, v)]).result()[0].data.evs) for v in vals]

    def counts(together):
        smp = Sampler(seed=make_seed())
        if together:
            jobs = [smp.run([(qm, v)], shots=64) for v in vals]
            return [j.result()[0].data.meas.get_counts() for j in jobs]
        return [smp.run([(qm, v)], shots=64).result()[0].data.meas.get_counts() for v in vals]

    one_by_one = estimates(False), counts(False)
    assert len(set(one_by_one[0])) > 1  # the jobs draw different shots
    for _ in range(3):
        assert (estimates(True), counts(True)) == one_by_one


def test_integer_seed_repeats_every_run_and_generator_seed_goes_on():
    """As Qiskit's StatevectorSampler / StatevectorEstimator: an integer seed (or a
    SeedSequence) gives every run the same samples and estimates; a np.random.Generator seed
    goes on with its sequence, run after run."""
    from qiskit import QuantumCircuit
    qc = QuantumCircuit(2)
    qc.h(0)
    qc.ry(0.7, 1)
    qm = qc.copy()
    qm.measure_all()

    def samples(smp):
        return [smp.run([qm], shots=200).result()[0].data.meas.get_counts() for _ in range(3)]

    def estimates(est):
        return [float(est.run([(qc, "XZ")]).result()[0].data.evs) for _ in range(3)]
    for repeat in (5, np.random.SeedSequence(5)):
        first, *again = samples(Sampler(seed=repeat))
        assert all(a == first for a in again)
        first, *again = estimates(Estimator(default_precision=0.05, seed=repeat))
        assert all(a == first for a in again)
    runs = samples(Sampler(seed=np.random.default_rng(5)))
    assert runs[0] != runs[1] or runs[1] != runs[2]
    runs = estimates(Estimator(default_precision=0.05, seed=np.random.default_rng(5)))
    assert len(set(runs)) > 1
    # the first job of an integer seed is that of a Generator seeded alike
    assert samples(Sampler(seed=5))[0] == samples(Sampler(seed=np.random.default_rng(5)))[0]


@pytest.mark.parametrize("seed", [3, "generator"])
def test_used_primitives_pickle_and_deep_copy_as_qiskits_do(seed):
    """``pickle`` and ``copy.deepcopy`` of a seeded primitive that has run jobs (as Qiskit's
    and Aer's primitives): the copy keeps its options and goes on with the seed's sequence
    where the original stands (an integer seed: the same stream for every job)."""
    import copy
    import pickle
    from qiskit.quantum_info import SparsePauliOp
    rng = np.random.default_rng(5)
    qc, used = random_circuit(rng, 3, 4)
    obs = SparsePauliOp.from_list([("ZZX", 0.7), ("IYZ", -0.4)])
    vals = rng.uniform(-1, 1, (3, used))
    qm = qc.copy()
    qm.measure_all()
    def make_seed():
        return np.random.default_rng(3) if seed == "generator" else seed
    est = Estimator(default_precision=0.05, seed=make_seed())
    smp = Sampler(default_shots=40, seed=make_seed())
    est.run([(qc, obs, vals)]).result()
    smp.run([(qm, vals)]).result()
    for copier in (copy.deepcopy, lambda p: pickle.loads(pickle.dumps(p))):
        e, s = copier(est), copier(smp)
        assert (e.default_precision, s.default_shots) == (0.05, 40)
        if seed == 3:
            assert (e.seed, s.seed) == (3, 3)
        np.testing.assert_array_equal(e.run([(qc, obs, vals)]).result()[0].data.evs,
                                      est.run([(qc, obs, vals)]).result()[0].data.evs)
        assert s.run([(qm, vals)]).result()[0].data.meas.get_counts() == \
            smp.run([(qm, vals)]).result()[0].data.meas.get_counts()


def test_estimator_errors():
    from qiskit import QuantumCircuit
    qc = QuantumCircuit(1, 1)
    qc.h(0)
    qc.measure(0, 0)
    with pytest.raises(QdiffError, match="Estimator: the circuit has measurements"):
        Estimator().run([(qc, "Z")]).result()
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(QdiffError, match="default_precision must be 0 .exact. or a finite"):
            Estimator(default_precision=bad)
    free = QuantumCircuit(1)
    for bad in (float("inf"), 1e-200, -0.1, "0.1"):  # inf: 0 shots; 1e-200: 1/p**2 overflows
        with pytest.raises(QdiffError, match="precision must be 0 .exact. or a finite"):
            Estimator().run([(free, "Z")], precision=bad)
    # 10**14 shots per term: their binomial count, drawn at the exact mean
    res = Estimator(seed=3).run([(free, "X")], precision=1e-7).result()[0]
    assert res.metadata["shots"] == 100000000000001 and abs(float(res.data.evs)) < 1e-6
    assert float(res.data.stds) == pytest.approx(1e-7, rel=1e-6)
    # Qiskit's own PUB checks, as QdiffErrors (ValueErrors) naming the PUB
    with pytest.raises(QdiffError, match=r"PUB 1: The number of qubits of the circuit \(1\)"):
        Estimator().run([(free, "Z"), (free, "ZZ")])
    with pytest.raises(QdiffError, match="run.. takes an iterable of PUBs"):
        Estimator().run(free)


def test_complex_parameter_values_are_refused_not_cut_to_their_real_parts():
    from qiskit import QuantumCircuit
    from qiskit.circuit import Parameter
    t = Parameter("t")
    qc = QuantumCircuit(1)
    qc.rx(t, 0)
    for values in (np.array([0.3 + 0.1j]), [0.3 + 0.1j], {t: np.array([0.3, 0.2 + 1e-3j])}):
        with pytest.raises(QdiffError, match="PUB 0: parameter values must be real"):
            Estimator().run([(qc, "Z", values)])
        measured = qc.copy()
        measured.measure_all()
        with pytest.raises(QdiffError, match="PUB 0: parameter values must be real"):
            Sampler().run([(measured, values)])
    # an exact real value of a complex dtype is kept (as Qiskit's primitives take it)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
        ev = Estimator().run([(qc, "Z", np.array([0.3 + 0j]))]).result()[0].data.evs
    assert float(ev) == pytest.approx(np.cos(0.3), abs=1e-12)


def test_sampler_bit_layout_matches_statevector_sampler():
    """Deterministic outcomes: several registers, clbits out of qubit order, an unmeasured
    clbit, one qubit into two clbits."""
    from qiskit import ClassicalRegister, QuantumCircuit, QuantumRegister
    from qiskit.circuit import Parameter
    from qiskit.primitives import StatevectorSampler
    a = Parameter("a")
    q = QuantumRegister(4)
    c1, c2 = ClassicalRegister(3, "alpha"), ClassicalRegister(10, "beta")
    qc = QuantumCircuit(q, c1, c2)
    qc.rx(a, 0)
    qc.x(2)
    qc.cx(0, 3)
    qc.measure(0, c1[2])
    qc.measure(2, c1[0])
    qc.measure(3, c2[9])
    qc.measure(2, c2[4])
    vals = np.array([[[0.0]], [[np.pi]]])  # shape (2, 1): |0..> and |1..> on qubit 0
    ours = Sampler(seed=1).run([(qc, vals)], shots=5).result()[0]
    ref = StatevectorSampler(seed=1).run([(qc, vals)], shots=5).result()[0]
    for reg in ("alpha", "beta"):
        x, y = getattr(ours.data, reg), getattr(ref.data, reg)
        assert x.shape == y.shape == (2, 1) and x.num_bits == y.num_bits
        np.testing.assert_array_equal(x.array, y.array)
    assert ours.data.alpha.get_counts((1, 0)) == {"101": 5}


@pytest.mark.parametrize("seed", range(4))
def test_sampler_distribution_matches_exact_probabilities(seed):
    from qiskit.quantum_info import Statevector
    rng = np.random.default_rng(seed)
    qc, used = random_circuit(rng, 3, 2)
    vals = rng.uniform(-np.pi, np.pi, (3, used))
    meas = qc.copy()
    meas.measure_all()
    shots = 20000
    res = Sampler(seed=seed).run([(meas, vals)], shots=shots).result()[0]
    assert res.data.meas.shape == (3,) and res.metadata["shots"] == shots
    for i in range(3):
        exact = Statevector(qc.assign_parameters(vals[i])).probabilities_dict()
        counts = res.data.meas.get_counts(i)
        for key in set(exact) | set(counts):
            p = exact.get(key, 0.0)
            got = counts.get(key, 0) / shots
            assert abs(got - p) < 5 * np.sqrt(p * (1 - p) / shots) + 1e-3, (key, got, p)


def test_sampler_without_measurements_and_shots_validation():
    from qiskit import ClassicalRegister, QuantumCircuit
    qc = QuantumCircuit(2)
    qc.add_register(ClassicalRegister(2, "c"))
    qc.h(0)
    res = Sampler().run([qc], shots=3).result()[0]
    assert res.data.c.get_counts() == {"00": 3}
    for bad in (0, True, 2.5):  # a bool is no shot count (Qiskit's PUB refuses shots=True)
        with pytest.raises(QdiffError, match="default_shots must be a positive integer"):
            Sampler(default_shots=bad)
    with pytest.warns(UserWarning, match="PUB 1 has no classical registers"):
        res = Sampler().run([qc, QuantumCircuit(1)]).result()  # warned as by Qiskit's
    assert not list(res[1].data.keys())
    with pytest.raises(QdiffError, match="PUB 0: shots must be positive"):
        Sampler().run([qc], shots=0)
    qc.measure([0, 1], [0, 1])
    with pytest.raises(QdiffMemoryError, match="sampling 1000000000000 shots"):
        Sampler().run([qc], shots=10 ** 12).result()  # checked before torch allocates 8 TB


def test_register_names_the_result_databin_cannot_hold_are_refused_by_name():
    """A register is a field of the result's DataBin: names the DataBin keeps for itself
    (``shape``, ``keys``, ``__class__``) are a QdiffError at run(); other names work as in
    Qiskit's StatevectorSampler."""
    from qiskit import ClassicalRegister, QuantumCircuit, QuantumRegister
    from qiskit.primitives import StatevectorSampler
    for name in ("shape", "keys", "values", "__class__"):
        qc = QuantumCircuit(QuantumRegister(2), ClassicalRegister(2, name))
        qc.x(0)
        qc.measure([0, 1], [0, 1])
        with pytest.raises(QdiffError, match=rf"PUB 0: classical register name\(s\) "
                                             rf"\['{name}'\] cannot be fields"):
            Sampler().run([qc], shots=4)
    for name in ("_fields", "with space", "1abc"):
        qc = QuantumCircuit(QuantumRegister(2), ClassicalRegister(2, name))
        qc.x(0)
        qc.measure([0, 1], [0, 1])
        got = Sampler().run([qc], shots=4).result()[0].data
        ref = StatevectorSampler().run([qc], shots=4).result()[0].data
        assert list(got) == list(ref) == [name]
        assert got[name].get_counts() == ref[name].get_counts() == {"01": 4}


def test_reset_of_a_fresh_qubit_runs_as_in_transpiled_initialize():
    """A transpiled ``initialize`` starts with top-level resets of fresh qubits (the identity,
    no extra wire): both primitives run it as Qiskit's do; a reset after operations on its
    qubit is a deferred measurement (one extra wire) that returns the qubit to |0>."""
    from qdiff.circuits.qiskit_io import from_qiskit
    from qiskit import QuantumCircuit, transpile
    from qiskit.primitives import StatevectorEstimator
    qc = QuantumCircuit(2)
    qc.initialize(np.array([0.6, 0, 0, 0.8j]), [0, 1])
    tq = transpile(qc, basis_gates=["cx", "u", "reset"], optimization_level=3)
    assert tq.data[0].operation.name == "reset"
    pub = (tq, ["ZZ", "YX", "ZI"])
    np.testing.assert_allclose(Estimator().run([pub]).result()[0].data.evs,
                               StatevectorEstimator().run([pub]).result()[0].data.evs, atol=1e-12)
    tq.measure_all()
    counts = Sampler(seed=1).run([tq], shots=2000).result()[0].data.meas.get_counts()
    assert set(counts) == {"00", "11"} and abs(counts["11"] / 2000 - 0.64) < 0.05
    assert from_qiskit(tq).circuit.num_wires == 2
    late = QuantumCircuit(1)
    late.h(0)
    late.reset(0)
    assert from_qiskit(late).circuit.num_wires == 2
    np.testing.assert_allclose(Estimator().run([(late, ["Z", "X"])]).result()[0].data.evs,
                               [1.0, 0.0], atol=1e-12)


def test_qubits_no_gate_touches_are_not_simulated():
    """A circuit laid out on a large device (40 qubits, gates on 3 of them) runs as its 3-qubit
    equivalent on both primitives: Z on an untouched qubit is 1 (standard error 0), X/Y 0, and
    a measured untouched qubit reads 0."""
    from qiskit import ClassicalRegister, QuantumCircuit
    from qiskit.circuit import ParameterVector
    from qiskit.primitives import StatevectorEstimator
    t = ParameterVector("t", 3)
    wide, narrow = QuantumCircuit(40), QuantumCircuit(3)
    for qc, (a, b, c) in ((wide, (31, 7, 22)), (narrow, (2, 0, 1))):
        qc.ry(t[0], a)
        qc.cx(a, b)
        qc.rx(t[1], c)
        qc.crz(t[2], b, c)
        qc.h(a)
    where = {31: 2, 7: 0, 22: 1}

    def label(word, n):  # {qubit: letter} -> a Qiskit label on n qubits
        return "".join(word.get(q, "I") for q in reversed(range(n)))
    words = [{31: "Z", 7: "X"}, {22: "Y", 0: "Z"}, {5: "Z", 39: "Z"}, {5: "X"}, {}, {7: "Z"}]
    values = np.random.default_rng(3).uniform(0, 3, (4, 1, 3))
    got = Estimator().run([(wide, [label(w, 40) for w in words], values)]).result()[0].data.evs
    ref = StatevectorEstimator().run([(narrow, [label({where[q]: ch for q, ch in w.items()
                                                       if q in where}, 3) for w in words],
                                       values)]).result()[0].data.evs
    ref[:, 3] = 0.0  # X on an untouched qubit
    np.testing.assert_allclose(got, ref, atol=1e-12)
    res = Estimator(seed=1).run([(wide, [label(w, 40) for w in words], values)],
                                precision=0.05).result()[0].data
    assert (res.stds[:, 2] == 0).all() and (res.evs[:, 2] == 1).all()
    assert (res.stds[:, [0, 1, 3, 5]] > 0).all()
    wide.add_register(ClassicalRegister(2, "c"))
    wide.measure([31, 5], [0, 1])  # after its H, qubit 31 is uniform whatever the angles
    counts = Sampler(seed=1).run([(wide, values[0])], shots=4000).result()[0].data.c.get_counts()
    assert set(counts) == {"00", "01"} and abs(counts["01"] / 4000 - 0.5) < 0.05, counts


def test_empty_parameter_values_give_empty_results():
    """Parameter values of shape (0, P) (and (0, 3, P)): empty results of Qiskit's shapes and
    dtypes, next to a non-empty PUB of the same circuit in one run; a circuit qnode gives an
    empty batch of outputs."""
    import qdiff as qd
    from qiskit import QuantumCircuit
    from qiskit.circuit import Parameter
    from qiskit.primitives import StatevectorEstimator, StatevectorSampler
    qc = QuantumCircuit(2)
    qc.ry(Parameter("a"), 0)
    qc.cx(0, 1)
    qm = qc.copy()
    qm.measure_all()
    for values in (np.zeros((0, 1)), np.zeros((0, 3, 1))):
        pubs = [(qc, ["ZZ"], values), (qc, "XI", values), (qc, "ZZ", [0.4])]
        got = Estimator().run(pubs).result()
        ref = StatevectorEstimator().run(pubs).result()
        for g, r in zip(got, ref):
            assert g.data.evs.shape == r.data.evs.shape == g.data.stds.shape == g.data.shape
            np.testing.assert_allclose(g.data.evs, r.data.evs, atol=1e-12)
        got = Sampler(seed=1).run([(qm, values)], shots=7).result()[0].data.meas
        ref = StatevectorSampler(seed=1).run([(qm, values)], shots=7).result()[0].data.meas
        assert (got.shape, got.num_shots, got.num_bits, got.array.shape, got.array.dtype) == \
            (ref.shape, ref.num_shots, ref.num_bits, ref.array.shape, ref.array.dtype)
    f = qd.qnode(qd.device("statevector", wires=2))(qc)
    assert f(torch.zeros(0, 1, dtype=torch.float64)).shape == (0, 1)


def test_unknown_keywords_and_bad_seeds_are_refused_by_name():
    """Aer's ``options=``, a misspelt ``shot=``, a seed numpy cannot take: QdiffErrors naming
    the keyword or the seed, not TypeErrors."""
    from qiskit import QuantumCircuit
    qc = QuantumCircuit(1, 1)
    qc.h(0)
    qc.measure(0, 0)
    free = QuantumCircuit(1)
    with pytest.raises(QdiffError, match=r"Sampler: unknown keyword\(s\) \['options'\]"):
        Sampler(options={"default_shots": 5})
    with pytest.raises(QdiffError, match=r"Estimator: unknown keyword\(s\) \['options'\]"):
        Estimator(options={"default_precision": 0.1})
    with pytest.raises(QdiffError, match=r"Sampler.run: unknown keyword\(s\) \['shot'\]; "
                                         r"valid keywords: \['shots'\]"):
        Sampler().run([qc], shot=10)
    with pytest.raises(QdiffError, match=r"Estimator.run: unknown keyword\(s\) \['shots'\]"):
        Estimator().run([(free, "Z")], shots=10)
    for bad in ("x", -1, 1.5, True):
        for make in (Sampler, Estimator):
            with pytest.raises(QdiffError, match=f"{make.__name__}: seed must be None, a "
                                                 "non-negative integer"):
                make(seed=bad)
    assert Sampler(seed=np.random.default_rng(1)).run([qc], shots=4).result()[0].data.c.num_shots \
        == 4


@pytest.mark.parametrize("construct", ["while_loop", "box", "store", "break_loop"])
def test_dynamic_circuit_constructs_still_refused_are_named(construct):
    """Control flow and classical instructions deferred measurement cannot run (a while loop
    is unbounded; classical variables, box, break): each a QdiffError naming the construct and
    what it is, on both primitives and a circuit qnode (never run without it)."""
    import qdiff as qd
    from qiskit import ClassicalRegister, QuantumCircuit, QuantumRegister
    cr = ClassicalRegister(2, "c")
    qc = QuantumCircuit(QuantumRegister(2), cr)
    qc.h(0)
    qc.measure(0, 0)
    if construct == "while_loop":
        with qc.while_loop((cr[0], 0)):
            qc.x(1)
    elif construct == "box":
        with qc.box():
            qc.x(1)
    elif construct == "break_loop":
        with qc.for_loop(range(2)):
            qc.x(1)
            qc.break_loop()
    else:
        qc.store(qc.add_var("v", False), True)
    what = {"while_loop": r"control flow \(while_loop\) is not supported: the number of its "
                          r"iterations depends on measurement outcomes \(unbounded\)",
            "box": r"control flow \(box\) is not supported",
            "break_loop": r"control flow \(break_loop\) is not supported",
            "store": r"classical variables \(store\) are not supported"}[construct]
    with pytest.raises(QdiffError, match=f"'{construct}' on qubits .*{what}"):
        qd.qnode(qd.device("statevector", wires=2))(qc)
    measured = qc.copy()
    measured.measure(1, 1)
    # the primitives refuse a circuit with variables before reading its instructions
    what = "classical variables" if construct == "store" else what
    for call in (lambda: Estimator().run([(qc, "ZZ")]).result(),
                 lambda: Sampler().run([measured]).result()):
        with pytest.raises(QdiffError, match=what):
            call()


def test_estimator_qnn_trains_on_qdiff_estimator():
    from qiskit.circuit.library import real_amplitudes, zz_feature_map
    from qiskit.primitives import StatevectorEstimator
    from qiskit_machine_learning.connectors import TorchConnector
    from qiskit_machine_learning.neural_networks import EstimatorQNN
    fm, ansatz = zz_feature_map(2), real_amplitudes(2, reps=1)
    qc = fm.compose(ansatz)

    def qnn(estimator):
        return EstimatorQNN(circuit=qc, input_params=fm.parameters,
                            weight_params=ansatz.parameters, estimator=estimator,
                            input_gradients=True, default_precision=0.0)
    rng = np.random.default_rng(2)
    x, w = rng.uniform(0, 1, (6, 2)), rng.uniform(0, 6, ansatz.num_parameters)
    ours, ref = qnn(Estimator()), qnn(StatevectorEstimator())
    np.testing.assert_allclose(ours.forward(x, w), ref.forward(x, w), atol=1e-12)
    for a, b in zip(ours.backward(x, w), ref.backward(x, w)):
        np.testing.assert_allclose(a, b, atol=1e-10)
    torch.manual_seed(0)
    model = TorchConnector(ours, initial_weights=w)
    xt = torch.tensor(x, dtype=torch.float32)
    y = torch.tensor(np.sign(x[:, :1] - 0.5), dtype=torch.float32)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    losses = []
    for _ in range(8):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xt), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0]
