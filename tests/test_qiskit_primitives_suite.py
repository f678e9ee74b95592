"""Qiskit's unit tests of its reference V2 primitives, run against ``qdiff.primitives``.

Ported from the Qiskit repository (https://github.com/Qiskit/qiskit), files
``test/python/primitives/test_statevector_estimator.py``, ``test_statevector_sampler.py``,
``test_backend_estimator_v2.py`` and ``test_backend_sampler_v2.py``, to the installed Qiskit's
2.x API (``real_amplitudes``, ``if_test``) and checked against its ``StatevectorEstimator`` /
``StatevectorSampler`` (every test passes there but the backend-only ones named below):

    This code is part of Qiskit.
    (C) Copyright IBM 2022, 2024.
    This code is licensed under the Apache License, Version 2.0. You may obtain a copy of this
    license at http://www.apache.org/licenses/LICENSE-2.0.
    Any modifications or derivative works of this code must retain this copyright notice, and
    modified files need to carry a notice indicating that they have been altered from the
    originals.

Altered from the originals: unittest classes and subtests became pytest functions and
parameters; ``StatevectorEstimator`` / ``StatevectorSampler`` became qdiff's ``Estimator`` /
``Sampler``; the backend tests run without a backend or transpilation (qdiff's primitives are a
simulator), with their shot-based tolerances (``test_precision_and_stds``: the standard errors
of ``BackendEstimatorV2``, below the precision; ``test_circuit_with_aliased_cregs``: control
flow, which ``StatevectorSampler`` refuses). Sampled counts are compared with Qiskit's relative
tolerance of 10% or 4.5 binomial standard deviations, whichever is larger: the targets are
samples Qiskit's own generator drew at seed 123 (a bin of 470 counts, 499 exactly, is 2.2
standard deviations from 10%), and qdiff's samples come from its own generator.

What qdiff legitimately does differently is marked ``xfail(strict=True)`` with the reason, or
left out (listed here):

- the expectation value Qiskit's own random generator gives at ``seed=1`` and precision 1
  (``test_precision_seed``): qdiff estimates from shots of each Pauli term, with its own
  generator (xfail);
- the Estimator's exact metadata dict at a precision > 0 (``test_metadata``): qdiff adds the
  shots it used, as ``BackendEstimatorV2`` does (xfail; the keys Qiskit sets are checked too);
- the Sampler's refusal of control flow (``test_run_errors``, "with control flow"): qdiff
  runs ``for_loop`` / ``if_test`` / ``switch`` circuits; and of a circuit without classical
  registers (older Qiskit versions refuse it; the installed one warns: ``test_no_cregs``)
  (left out);
- ``test0_precision_and_stds`` (observables whose coefficients are all 0): the installed
  Qiskit's own PUB coercion refuses them ("Empty observable was detected"), for its reference
  primitives as for qdiff's (left out);
- ``BackendEstimatorV2``'s refusal of precision 0 (qdiff's precision 0 is exact, as
  ``StatevectorEstimator``'s), abelian grouping, backend job-size limits, BackendV1 and
  pass-manager variants (left out: backend specifics).
"""
from __future__ import annotations

import numpy as np
import pytest

from qiskit import ClassicalRegister, QuantumCircuit, QuantumRegister
from qiskit.circuit import Parameter
from qiskit.circuit.library import UnitaryGate, real_amplitudes
from qiskit.primitives import PrimitiveResult, PubResult
from qiskit.primitives.containers import BitArray
from qiskit.primitives.containers.bindings_array import BindingsArray
from qiskit.primitives.containers.data_bin import DataBin
from qiskit.primitives.containers.estimator_pub import EstimatorPub
from qiskit.primitives.containers.observables_array import ObservablesArray
from qiskit.primitives.containers.sampler_pub import SamplerPub
from qiskit.providers import JobStatus
from qiskit.quantum_info import SparsePauliOp

from qdiff.primitives import Estimator, Sampler

# ---------------------------------------------------------------------------------------------
# Estimator: test_statevector_estimator.py
# ---------------------------------------------------------------------------------------------


def _ansatz(reps):
    qc = QuantumCircuit(2)
    qc.append(real_amplitudes(num_qubits=2, reps=reps), [0, 1])
    return qc


OBSERVABLE = SparsePauliOp.from_list([
    ("II", -1.052373245772859), ("IZ", 0.39793742484318045), ("ZI", -0.39793742484318045),
    ("ZZ", -0.01128010425623538), ("XX", 0.18093119978423156)])
HAMILTONIAN = (
    SparsePauliOp.from_list([("II", 1), ("IZ", 2), ("XI", 3)]),
    SparsePauliOp.from_list([("IZ", 1)]),
    SparsePauliOp.from_list([("ZI", 1), ("ZZ", 1)]),
)
THETA = ([0, 1, 1, 2, 3, 5], [0, 1, 1, 2, 3, 5, 8, 13], [1, 2, 3, 4, 5, 6])


@pytest.fixture
def psi():
    return _ansatz(2), _ansatz(3)


# exact (StatevectorEstimator) and shot-based (BackendEstimatorV2: precision 5e-3, rtol 0.3)
ESTIMATORS = [
    pytest.param(lambda: Estimator(), 1e-7, id="exact"),
    pytest.param(lambda: Estimator(default_precision=5e-3, seed=12), 3e-1, id="shots"),
]


@pytest.mark.parametrize("make, rtol", ESTIMATORS)
def test_estimator_run(psi, make, rtol):
    psi1, psi2 = psi
    h1, h2, h3 = HAMILTONIAN
    theta1, theta2, theta3 = THETA
    estimator = make()
    result = estimator.run([(psi1, h1, [theta1])]).result()
    np.testing.assert_allclose(result[0].data.evs, [1.5555572817900956], rtol=rtol)
    result2 = estimator.run([(psi2, h1, theta2)]).result()
    np.testing.assert_allclose(result2[0].data.evs, [2.97797666], rtol=rtol)
    result3 = estimator.run([(psi1, [h2, h3], theta1)]).result()
    np.testing.assert_allclose(result3[0].data.evs, [-0.551653, 0.07535239], rtol=rtol)
    result4 = estimator.run([(psi1, [h1, h3], [theta1, theta3]), (psi2, h2, theta2)]).result()
    np.testing.assert_allclose(result4[0].data.evs, [1.55555728, -1.08766318], rtol=rtol)
    np.testing.assert_allclose(result4[1].data.evs, [0.17849238], rtol=rtol)


@pytest.mark.parametrize("make, rtol", ESTIMATORS)
def test_estimator_with_pub(psi, make, rtol):
    psi1, psi2 = psi
    h1, h2, h3 = HAMILTONIAN
    theta1, theta2, theta3 = THETA
    pub1 = EstimatorPub(psi1, ObservablesArray.coerce([h1, h3]),
                        BindingsArray.coerce({tuple(psi1.parameters): [theta1, theta3]}))
    pub2 = EstimatorPub(psi2, ObservablesArray.coerce(h2),
                        BindingsArray.coerce({tuple(psi2.parameters): theta2}))
    result4 = make().run([pub1, pub2]).result()
    np.testing.assert_allclose(result4[0].data.evs, [1.55555728, -1.08766318], rtol=rtol)
    np.testing.assert_allclose(result4[1].data.evs, [0.17849238], rtol=rtol)


@pytest.mark.parametrize("make, rtol", ESTIMATORS)
def test_estimator_run_no_params(make, rtol):
    circuit = _ansatz(2).assign_parameters([0, 1, 1, 2, 3, 5])
    result = make().run([(circuit, OBSERVABLE)]).result()
    np.testing.assert_allclose(result[0].data.evs, [-1.284366511861733], rtol=rtol)


@pytest.mark.parametrize("make, rtol", ESTIMATORS)
def test_run_single_circuit_observable(psi, make, rtol):
    est = make()
    precision = est.default_precision
    qc = QuantumCircuit(1)
    qc.x(0)
    for val in [None, [], [[]], np.array([]), np.array([[]]), [np.array([])]]:
        result = est.run([(qc, SparsePauliOp("Z"), val)]).result()
        np.testing.assert_allclose(result[0].data.evs, [-1], rtol=rtol)
        assert result[0].metadata["target_precision"] == precision

    qc = QuantumCircuit(1)
    qc.ry(Parameter("x"), 0)
    for val in [[np.pi], np.array([np.pi])]:
        result = est.run([(qc, SparsePauliOp("Z"), val)]).result()
        np.testing.assert_allclose(result[0].data.evs, [-1], rtol=rtol)
        assert result[0].metadata["target_precision"] == precision

    theta = THETA[0]
    for val in [theta, [theta], np.array(theta), np.array([theta]), [np.array(theta)]]:
        result = est.run([(psi[0], HAMILTONIAN[0], val)]).result()
        np.testing.assert_allclose(result[0].data.evs, [1.5555572817900956], rtol=rtol)
        assert result[0].metadata["target_precision"] == precision


@pytest.mark.parametrize("make, rtol", ESTIMATORS)
def test_run_1qubit(make, rtol):
    qc = QuantumCircuit(1)
    qc2 = QuantumCircuit(1)
    qc2.x(0)
    op = SparsePauliOp.from_list([("I", 1)])
    op2 = SparsePauliOp.from_list([("Z", 1)])
    est = make()
    for circ, obs, target in ((qc, op, 1), (qc, op2, 1), (qc2, op, 1), (qc2, op2, -1)):
        result = est.run([(circ, obs)]).result()
        np.testing.assert_allclose(result[0].data.evs, [target], rtol=rtol)


@pytest.mark.parametrize("make, rtol", ESTIMATORS)
def test_run_2qubits(make, rtol):
    """The qubit order of Pauli labels (Qiskit's little endian)."""
    qc = QuantumCircuit(2)
    qc2 = QuantumCircuit(2)
    qc2.x(0)
    op = SparsePauliOp.from_list([("II", 1)])
    op2 = SparsePauliOp.from_list([("ZI", 1)])
    op3 = SparsePauliOp.from_list([("IZ", 1)])
    est = make()
    for circ, obs, target in ((qc, op, 1), (qc2, op, 1), (qc, op2, 1), (qc2, op2, 1),
                              (qc, op3, 1), (qc2, op3, -1)):
        result = est.run([(circ, obs)]).result()
        np.testing.assert_allclose(result[0].data.evs, [target], rtol=rtol)


def test_estimator_run_errors():
    qc = QuantumCircuit(1)
    qc2 = QuantumCircuit(2)
    op = SparsePauliOp.from_list([("I", 1)])
    op2 = SparsePauliOp.from_list([("II", 1)])
    est = Estimator()
    with pytest.raises(ValueError):
        est.run([(qc, op2)]).result()
    with pytest.raises(ValueError):
        est.run([(qc, op, [[1e4]])]).result()
    with pytest.raises(ValueError):
        est.run([(qc2, op2, [[1, 2]])]).result()
    with pytest.raises(ValueError):
        est.run([(qc, [op, op2], [[1]])]).result()
    with pytest.raises(ValueError):
        est.run([(qc, op)], precision=-1).result()
    with pytest.raises(ValueError):
        est.run([(qc, op, None, -1)]).result()
    with pytest.raises(ValueError):
        est.run([(qc, 1j * op)], precision=0.1).result()
    with pytest.raises(ValueError, match="An invalid Estimator pub-like was given"):
        est.run((qc, op)).result()


@pytest.mark.parametrize("make, rtol", ESTIMATORS)
def test_estimator_run_numpy_params(make, rtol):
    qc = _ansatz(2)
    op = SparsePauliOp.from_list([("IZ", 1), ("XI", 2), ("ZY", -1)])
    k = 5
    params_array = np.random.default_rng(12).random((k, qc.num_parameters))
    target = Estimator().run([(qc, op, params_array.tolist())]).result()
    estimator = make()
    for values in (params_array, list(params_array)):
        result = estimator.run([(qc, op, values)]).result()
        assert result[0].data.evs.shape == (k,)
        np.testing.assert_allclose(result[0].data.evs, target[0].data.evs, rtol=rtol)


@pytest.mark.xfail(strict=True, reason="the value drawn by Qiskit's own random generator at "
                   "seed=1 (Gaussian noise of width 1); qdiff estimates from shots of each "
                   "Pauli term with its own generator")
def test_precision_seed_value_of_qiskits_generator(psi):
    estimator = Estimator(default_precision=1.0, seed=1)
    result = estimator.run([(psi[0], HAMILTONIAN[0], [THETA[0]])]).result()
    np.testing.assert_allclose(result[0].data.evs, [1.901141473854881])


def test_precision_seed(psi):
    """A seeded estimator gives the same estimates on every run; precision 0 is exact."""
    estimator = Estimator(default_precision=1.0, seed=1)
    psi1, h1, theta1 = psi[0], HAMILTONIAN[0], THETA[0]
    first = estimator.run([(psi1, h1, [theta1])]).result()[0].data.evs
    assert abs(first[0] - 1.5555572817900956) > 1e-6  # an estimate, not the exact value
    result = estimator.run([(psi1, h1, [theta1]), (psi1, h1, [theta1])]).result()
    np.testing.assert_allclose(result[0].data.evs, first)
    result = estimator.run([(psi1, h1, [theta1])], precision=0).result()
    np.testing.assert_allclose(result[0].data.evs, [1.5555572817900956])


def test_estimator_iter_pub():
    circuit = _ansatz(2).assign_parameters([0, 1, 1, 2, 3, 5])
    observable = OBSERVABLE.apply_layout(circuit.layout)
    result = Estimator().run(iter([(circuit, observable), (circuit, observable)])).result()
    np.testing.assert_allclose(result[0].data.evs, [-1.284366511861733])
    np.testing.assert_allclose(result[1].data.evs, [-1.284366511861733])


def _estimator_metadata_run():
    qc = QuantumCircuit(2)
    qc2 = QuantumCircuit(2)
    qc2.metadata = {"a": 1}
    result = Estimator().run([(qc, "ZZ"), (qc2, "ZZ")], precision=0.1).result()
    return qc, qc2, result


@pytest.mark.xfail(strict=True, reason="qdiff's metadata of a shot-based estimate also holds "
                   "the shots it used (as BackendEstimatorV2's does)")
def test_estimator_metadata_exact_dict():
    qc, qc2, result = _estimator_metadata_run()
    assert result[0].metadata == {"target_precision": 0.1, "circuit_metadata": qc.metadata}
    assert result[1].metadata == {"target_precision": 0.1, "circuit_metadata": qc2.metadata}


def test_estimator_metadata():
    qc, qc2, result = _estimator_metadata_run()
    assert len(result) == 2
    assert result.metadata == {"version": 2}
    for res, circ in zip(result, (qc, qc2)):
        assert res.metadata["target_precision"] == 0.1
        assert res.metadata["circuit_metadata"] == circ.metadata


def test_estimator_reset():
    """A reset of one qubit of a Bell pair leaves the other maximally mixed: <Z> averages 0
    (qdiff gives the mixed state's value, 0; Qiskit's reference samples the reset), and a
    seeded estimator gives the same values on every run."""
    qc = QuantumCircuit(2)
    qc.h(0)
    qc.cx(0, 1)
    qc.reset(0)
    op = SparsePauliOp("ZI")
    n = 1000
    estimator = Estimator(seed=12)
    for precision in (None, 0.01):
        result = estimator.run([(qc, [op] * n)], precision=precision).result()
        np.testing.assert_allclose(result[0].data.evs.mean(), 0, atol=1e-1)
        result2 = estimator.run([(qc, [op] * n)], precision=precision).result()
        np.testing.assert_allclose(result[0].data.evs, result2[0].data.evs)


# ---------------------------------------------------------------------------------------------
# Estimator, shot-based: test_backend_estimator_v2.py (precision 5e-3, rtol 0.3)
# ---------------------------------------------------------------------------------------------

PRECISION = 5e-3


def test_precision(psi):
    estimator = Estimator(default_precision=PRECISION, seed=12)
    psi1, h1, theta1 = psi[0], HAMILTONIAN[0], THETA[0]
    result = estimator.run([(psi1, h1, [theta1])]).result()
    np.testing.assert_allclose(result[0].data.evs, [1.901141473854881], rtol=0.3)
    result = estimator.run([(psi1, h1, [theta1]), (psi1, h1, [theta1])]).result()
    np.testing.assert_allclose(result[0].data.evs, [1.901141473854881], rtol=0.3)
    np.testing.assert_allclose(result[1].data.evs, [1.901141473854881], rtol=0.3)
    result = estimator.run([(psi1, h1, [theta1])], precision=PRECISION * 0.5).result()
    np.testing.assert_allclose(result[0].data.evs, [1.5555572817900956], rtol=0.3)


def test_diff_precision(psi):
    estimator = Estimator(default_precision=PRECISION, seed=12)
    psi1, h1, theta1 = psi[0], HAMILTONIAN[0], THETA[0]
    result = estimator.run([(psi1, h1, [theta1]),
                            (psi1, h1, [theta1], PRECISION * 0.8)]).result()
    np.testing.assert_allclose(result[0].data.evs, [1.901141473854881], rtol=0.3)
    np.testing.assert_allclose(result[1].data.evs, [1.901141473854881], rtol=0.3)
    assert result[0].metadata["target_precision"] == PRECISION
    assert result[1].metadata["target_precision"] == PRECISION * 0.8


HAMILTONIANS_STDS = {
    "IZX": SparsePauliOp.from_list([("II", 1), ("IZ", 2), ("XI", 3)]),
    "ZZ": SparsePauliOp.from_list([("ZZ", 1)]),
    "ZZ_twice": SparsePauliOp.from_list([("ZZ", 1), ("ZZ", 1)]),
}
HAMILTONIANS_STDS["list"] = list(HAMILTONIANS_STDS.values())


@pytest.mark.parametrize("name", list(HAMILTONIANS_STDS))
def test_precision_and_stds(psi, name):
    """The standard errors are within the precision asked for (against the precision itself:
    the original compares with ``[precision] * len(hamiltonian)``, a list of a length other
    than the results' for a SparsePauliOp of several terms)."""
    hamiltonian = HAMILTONIANS_STDS[name]
    estimator = Estimator(default_precision=PRECISION, seed=12)
    result = estimator.run([(psi[0], hamiltonian, [THETA[0]])], precision=PRECISION).result()
    np.testing.assert_array_less(result[0].data.stds, PRECISION)
    result = estimator.run([(psi[0], hamiltonian, [THETA[0]]), (psi[0], hamiltonian, [THETA[0]])],
                           precision=PRECISION).result()
    np.testing.assert_array_less(result[0].data.stds, PRECISION)
    np.testing.assert_array_less(result[1].data.stds, PRECISION)


# ---------------------------------------------------------------------------------------------
# Sampler: test_statevector_sampler.py (and test_backend_sampler_v2.py where it adds cases)
# ---------------------------------------------------------------------------------------------

SHOTS = 10000
SEED = 123


def _pqc(reps):
    qc = real_amplitudes(num_qubits=2, reps=reps)
    qc.measure_all()
    return qc


def _cases():
    hadamard = QuantumCircuit(1, 1, name="Hadamard")
    hadamard.h(0)
    hadamard.measure(0, 0)
    bell = QuantumCircuit(2, name="Bell")
    bell.h(0)
    bell.cx(0, 1)
    bell.measure_all()
    pqc, pqc2 = _pqc(2), _pqc(3)
    return [
        (hadamard, None, {0: 5000, 1: 5000}),
        (bell, None, {0: 5000, 3: 5000}),
        (pqc, [0] * 6, {0: 10000}),
        (pqc, [1] * 6, {0: 168, 1: 3389, 2: 470, 3: 5973}),
        (pqc, [0, 1, 1, 2, 3, 5], {0: 1339, 1: 3534, 2: 912, 3: 4215}),
        (pqc, [1, 2, 3, 4, 5, 6], {0: 634, 1: 291, 2: 6039, 3: 3036}),
        (pqc2, [0, 1, 2, 3, 4, 5, 6, 7], {0: 1898, 1: 6864, 2: 928, 3: 311}),
    ]


@pytest.fixture
def cases():
    return _cases()


def assert_counts_close(bitarray: BitArray, target, rtol=1e-1, sigmas=4.5):
    """Qiskit's ``_assert_allclose``: the integer counts at every index of ``bitarray`` are
    close to ``target`` (an object array of {int: count} dicts, or a BitArray): within ``rtol``
    or ``sigmas`` binomial standard deviations of the target's count (0: ``rtol`` only)."""
    assert bitarray.shape == target.shape
    for idx in np.ndindex(bitarray.shape):
        counts = bitarray.get_int_counts(idx)
        want = target.get_int_counts(idx) if isinstance(target, BitArray) else target[idx]
        top = max(max(counts), max(want))
        got = np.array([counts.get(i, 0) for i in range(top + 1)])
        exp = np.array([want.get(i, 0) for i in range(top + 1)], dtype=float)
        p = exp / exp.sum()
        tol = np.maximum(rtol * exp, sigmas * np.sqrt(exp.sum() * p * (1 - p)))
        assert np.all(np.abs(got - exp) <= tol), f"index {idx}: counts {got}, target {exp}"


def _check_result_types(result, n=1):
    assert isinstance(result, PrimitiveResult)
    assert isinstance(result.metadata, dict)
    assert len(result) == n
    assert isinstance(result[0], PubResult)
    assert isinstance(result[0].data, DataBin)
    assert isinstance(result[0].data.meas, BitArray)


@pytest.mark.parametrize("params, wrap", [
    (None, lambda t: np.array(t)),             # single
    ((), lambda t: np.array(t)),               # single with param
    ([()], lambda t: np.array([t])),           # single array
    ([(), (), ()], lambda t: np.array([t, t, t])),  # multiple
], ids=["single", "single_with_param", "single_array", "multiple"])
def test_sampler_run(cases, params, wrap):
    bell, _, target = cases[1]
    sampler = Sampler(seed=SEED)
    result = sampler.run([bell if params is None else (bell, params)], shots=SHOTS).result()
    _check_result_types(result)
    assert_counts_close(result[0].data.meas, wrap(target))


def test_sampler_run_multiple_times(cases):
    """A seeded sampler gives the same samples on every run of the same input."""
    bell = cases[1][0]
    sampler = Sampler(seed=SEED)
    meas1 = sampler.run([bell], shots=SHOTS).result()[0].data.meas
    meas2 = sampler.run([bell], shots=SHOTS).result()[0].data.meas
    assert_counts_close(meas1, meas2, rtol=0, sigmas=0)


def test_sample_run_multiple_circuits(cases):
    bell, _, target = cases[1]
    result = Sampler(seed=SEED).run([bell, bell, bell], shots=SHOTS).result()
    assert len(result) == 3
    for i in range(3):
        assert_counts_close(result[i].data.meas, np.array(target))


def test_sampler_run_with_parameterized_circuits(cases):
    (pqc1, param1, target1), (pqc2, param2, target2), (pqc3, param3, target3) = cases[4:7]
    result = Sampler(seed=SEED).run([(pqc1, param1), (pqc2, param2), (pqc3, param3)],
                                    shots=SHOTS).result()
    assert len(result) == 3
    for res, target in zip(result, (target1, target2, target3)):
        assert_counts_close(res.data.meas, np.array(target))


def test_sampler_run_1qubit():
    qc = QuantumCircuit(1)
    qc.measure_all()
    qc2 = QuantumCircuit(1)
    qc2.x(0)
    qc2.measure_all()
    result = Sampler(seed=SEED).run([qc, qc2], shots=SHOTS).result()
    assert len(result) == 2
    for i in range(2):
        assert_counts_close(result[i].data.meas, np.array({i: SHOTS}))


def test_sampler_run_2qubit():
    circuits = []
    for flips in ([], [0], [1], [0, 1]):
        qc = QuantumCircuit(2)
        if flips:
            qc.x(flips)
        qc.measure_all()
        circuits.append(qc)
    result = Sampler(seed=SEED).run(circuits, shots=SHOTS).result()
    assert len(result) == 4
    for i in range(4):
        assert_counts_close(result[i].data.meas, np.array({i: SHOTS}))


def test_run_single_circuit_no_parameter(cases):
    circuit, _, target = cases[1]
    for param, want in [
        (None, np.array(target)), ((), np.array(target)), ([], np.array(target)),
        (np.array([]), np.array(target)), (((),), np.array([target])),
        (([],), np.array([target])), ([[]], np.array([target])), ([()], np.array([target])),
        (np.array([[]]), np.array([target])),
    ]:
        result = Sampler(seed=SEED).run([(circuit, param)], shots=SHOTS).result()
        assert len(result) == 1
        assert_counts_close(result[0].data.meas, want)


def test_run_single_circuit_one_parameter():
    circuit = QuantumCircuit(1, 1, name="X gate")
    circuit.ry(Parameter("x"), 0)
    circuit.measure(0, 0)
    one = {1: SHOTS}
    for param, want in [
        ([np.pi], np.array(one)), ((np.pi,), np.array(one)), (np.array([np.pi]), np.array(one)),
        ([[np.pi]], np.array([one])), (((np.pi,),), np.array([one])),
        (np.array([[np.pi]]), np.array([one])),
    ]:
        result = Sampler(seed=SEED).run([(circuit, param)], shots=SHOTS).result()
        assert len(result) == 1
        assert_counts_close(result[0].data.c, want)


def test_run_single_circuit_more_than_one_parameter(cases):
    circuit, param, target = cases[3]
    for values, want in [
        (param, np.array(target)), (tuple(param), np.array(target)),
        (np.array(param), np.array(target)), ((param,), np.array([target])),
        ([param], np.array([target])), (np.array([param]), np.array([target])),
    ]:
        result = Sampler(seed=SEED).run([(circuit, values)], shots=SHOTS).result()
        assert len(result) == 1
        assert_counts_close(result[0].data.meas, want)


def test_run_reverse_meas_order():
    x, y = Parameter("x"), Parameter("y")
    qc = QuantumCircuit(3, 3)
    qc.rx(x, 0)
    qc.rx(y, 1)
    qc.x(2)
    qc.measure(0, 2)
    qc.measure(1, 1)
    qc.measure(2, 0)
    result = Sampler(seed=SEED).run([(qc, [0, 0]), (qc, [np.pi / 2, 0])], shots=SHOTS).result()
    assert len(result) == 2
    assert_counts_close(result[0].data.c, np.array({1: SHOTS}))
    assert_counts_close(result[1].data.c, np.array({1: SHOTS / 2, 5: SHOTS / 2}))


def test_sampler_run_errors():
    qc1 = QuantumCircuit(1)
    qc1.measure_all()
    qc2 = real_amplitudes(num_qubits=1, reps=1)
    qc2.measure_all()
    sampler = Sampler()
    # parameter values for a circuit without parameters; missing, some or too many values
    for pub in [(qc1, [1e2]), qc2, (qc2, []), (qc2, None), (qc2, [1e2]), (qc2, [1e2] * 100)]:
        with pytest.raises(ValueError):
            sampler.run([pub]).result()
    # negative or zero shots: run argument, pub-like, pub
    for shots in (-1, 0):
        with pytest.raises(ValueError):
            sampler.run([qc1], shots=shots).result()
        with pytest.raises(ValueError):
            sampler.run([(qc1, None, shots)]).result()
        with pytest.raises(ValueError):
            sampler.run([SamplerPub(qc1, shots=shots)]).result()
    with pytest.raises(ValueError, match="An invalid Sampler pub-like was given"):
        sampler.run(qc1).result()
    with pytest.raises(ValueError, match="Note that if you want to run a single pub,"):
        sampler.run((qc2, [0, 1])).result()


def test_run_empty_parameter():
    n = 5
    qc = QuantumCircuit(n, n - 1)
    qc.measure(range(n - 1), range(n - 1))
    sampler = Sampler(seed=SEED)
    result = sampler.run([qc], shots=SHOTS).result()
    assert len(result) == 1
    assert_counts_close(result[0].data.c, np.array({0: SHOTS}))
    result = sampler.run([qc, qc], shots=SHOTS).result()
    assert len(result) == 2
    for i in range(2):
        assert_counts_close(result[i].data.c, np.array({0: SHOTS}))


def test_sampler_run_numpy_params():
    qc = _pqc(2)
    k = 5
    params_array = np.linspace(0, 1, k * qc.num_parameters).reshape((k, qc.num_parameters))
    params_list = params_array.tolist()
    target = Sampler(seed=SEED).run([(qc, params_list)], shots=SHOTS).result()
    result = Sampler(seed=SEED).run([(qc, params_array)], shots=SHOTS).result()
    assert len(result) == 1
    assert_counts_close(result[0].data.meas, target[0].data.meas)
    result = Sampler(seed=SEED).run([(qc, params) for params in params_list],
                                    shots=SHOTS).result()
    assert len(result) == k
    for i in range(k):
        assert_counts_close(result[i].data.meas,
                            np.array(target[0].data.meas.get_int_counts(i)))


def _check_shots(res, shots):
    assert res.data.meas.num_shots == shots
    assert sum(res.data.meas.get_counts().values()) == shots
    assert res.metadata["shots"] == shots


def test_run_with_shots_option(cases):
    bell = cases[1][0]
    shots = 100
    result = Sampler(seed=SEED).run([bell], shots=shots).result()
    assert len(result) == 1
    _check_shots(result[0], shots)

    sampler = Sampler(seed=SEED)
    result = sampler.run([bell]).result()
    _check_shots(result[0], sampler.default_shots)

    sampler = Sampler(default_shots=100, seed=SEED)
    assert sampler.default_shots == 100
    _check_shots(sampler.run([bell]).result()[0], 100)

    _check_shots(Sampler(seed=SEED).run([(bell, None, shots)]).result()[0], shots)
    _check_shots(Sampler(seed=SEED).run([SamplerPub(bell, shots=shots)]).result()[0], shots)

    result = Sampler(seed=SEED).run([SamplerPub(bell, shots=100), SamplerPub(bell, shots=200)],
                                    shots=SHOTS).result()
    assert len(result) == 2
    _check_shots(result[0], 100)
    _check_shots(result[1], 200)


def test_run_shots_result_size():
    n = 10
    qc = QuantumCircuit(n)
    qc.h(range(n))
    qc.measure_all()
    result = Sampler(seed=SEED).run([qc], shots=SHOTS).result()
    assert len(result) == 1
    assert result[0].data.meas.num_shots <= SHOTS
    assert sum(result[0].data.meas.get_counts().values()) == SHOTS


def test_primitive_job_status_done(cases):
    job = Sampler(seed=SEED).run([cases[1][0]], shots=SHOTS)
    job.result()
    assert job.status() == JobStatus.DONE


def test_seed():
    assert Sampler().seed is None
    assert Sampler(seed=SEED).seed == SEED
    assert isinstance(Sampler(seed=np.random.default_rng(SEED)).seed, np.random.Generator)


@pytest.mark.parametrize("matrix, outcome", [(np.eye(2), 0), ([[0, 1], [1, 0]], 1)],
                         ids=["identity", "X"])
def test_circuit_with_unitary(matrix, outcome):
    circuit = QuantumCircuit(1)
    circuit.append(UnitaryGate(matrix), [0])
    circuit.measure_all()
    result = Sampler(seed=SEED).run([circuit], shots=SHOTS).result()
    assert len(result) == 1
    assert_counts_close(result[0].data.meas, np.array({outcome: SHOTS}))


def _three_cregs(b_size=2):
    a, b, c = ClassicalRegister(1, "a"), ClassicalRegister(b_size, "b"), ClassicalRegister(3, "c")
    qc = QuantumCircuit(QuantumRegister(3), a, b, c)
    qc.h(range(3))
    return qc


def _multiple_creg_cases():
    qc1 = _three_cregs()
    qc1.measure([0, 1, 2, 2], [0, 2, 4, 5])
    qc2 = _three_cregs(b_size=5)
    qc2.measure([0, 1, 2, 2], [0, 2, 4, 5])
    qc3 = _three_cregs()
    qc3.measure(1, 5)
    qc4 = _three_cregs()
    qc4.measure([0, 1, 2], [5, 5, 5])
    qc5 = _three_cregs()
    return [
        (qc1, {"a": {0: 5000, 1: 5000}, "b": {0: 5000, 2: 5000}, "c": {0: 5000, 6: 5000}}),
        (qc2, {"a": {0: 5000, 1: 5000}, "b": {0: 2500, 2: 2500, 24: 2500, 26: 2500},
               "c": {0: 10000}}),
        (qc3, {"a": {0: 10000}, "b": {0: 10000}, "c": {0: 5000, 4: 5000}}),
        (qc4, {"a": {0: 10000}, "b": {0: 10000}, "c": {0: 5000, 4: 5000}}),
        (qc5, {"a": {0: 10000}, "b": {0: 10000}, "c": {0: 10000}}),
    ]


@pytest.mark.parametrize("case", range(5), ids=["use_all_cregs", "use_only_a_and_b",
                                                "use_only_c", "use_only_c_multiple_qubits",
                                                "no_measure"])
def test_circuit_with_multiple_cregs(case):
    qc, target = _multiple_creg_cases()[case]
    result = Sampler(seed=SEED).run([qc], shots=SHOTS).result()
    assert len(result) == 1
    data = result[0].data
    assert len(data) == 3
    for creg in qc.cregs:
        assert hasattr(data, creg.name)
        assert_counts_close(getattr(data, creg.name), np.array(target[creg.name]))


def test_circuit_with_aliased_cregs():
    q = QuantumRegister(3, "q")
    c1 = ClassicalRegister(1, "c1")
    c2 = ClassicalRegister(1, "c2")
    qc = QuantumCircuit(q, c1, c2)
    qc.ry(np.pi / 4, 2)
    qc.cx(2, 1)
    qc.cx(0, 1)
    qc.h(0)
    qc.measure(0, c1)
    qc.measure(1, c2)
    with qc.if_test((c1, 1)):
        qc.z(2)
    with qc.if_test((c2, 1)):
        qc.x(2)
    qc2 = QuantumCircuit(5, 5)
    qc2.compose(qc, [0, 2, 3], [2, 4], inplace=True)
    cregs = [creg.name for creg in qc2.cregs]
    target = {
        cregs[0]: {0: 4255, 4: 4297, 16: 720, 20: 726},
        cregs[1]: {0: 5000, 1: 5000},
        cregs[2]: {0: 8500, 1: 1500},
    }
    result = Sampler(seed=SEED).run([qc2], shots=SHOTS).result()
    assert len(result) == 1
    data = result[0].data
    assert len(data) == 3
    for name, want in target.items():
        assert hasattr(data, name)
        assert_counts_close(getattr(data, name), np.array(want))


def test_no_cregs():
    qc = QuantumCircuit(2)
    with pytest.warns(UserWarning):
        result = Sampler(seed=SEED).run([qc]).result()
    assert len(result) == 1
    assert len(result[0].data) == 0


def test_empty_creg():
    qc = QuantumCircuit(QuantumRegister(1, "q"), ClassicalRegister(0, "c1"),
                        ClassicalRegister(1, "c2"))
    qc.h(0)
    qc.measure(0, 0)
    result = Sampler(seed=SEED).run([qc], shots=SHOTS).result()
    assert result[0].data.c1.array.shape == (SHOTS, 0)


def test_diff_shots(cases):
    bell, _, target = cases[1]
    shots2 = SHOTS + 2
    target2 = {k: v + 1 for k, v in target.items()}
    result = Sampler(seed=SEED).run([(bell, None, SHOTS), (bell, None, shots2)]).result()
    assert len(result) == 2
    assert result[0].data.meas.num_shots == SHOTS
    assert_counts_close(result[0].data.meas, np.array(target))
    assert result[1].data.meas.num_shots == shots2
    assert_counts_close(result[1].data.meas, np.array(target2))


def test_sampler_iter_pub():
    qc = QuantumCircuit(1)
    qc.measure_all()
    qc2 = QuantumCircuit(1)
    qc2.x(0)
    qc2.measure_all()
    result = Sampler(seed=SEED).run(iter([qc, qc2]), shots=SHOTS).result()
    assert isinstance(result, PrimitiveResult)
    assert len(result) == 2
    assert isinstance(result[0], PubResult) and isinstance(result[1], PubResult)
    assert_counts_close(result[0].data.meas, np.array({0: SHOTS}))
    assert_counts_close(result[1].data.meas, np.array({1: SHOTS}))


def test_sampler_metadata():
    qc = QuantumCircuit(2)
    qc.measure_all()
    qc2 = qc.copy()
    qc2.metadata = {"a": 1}
    result = Sampler().run([(qc, None, 10), (qc2, None, 20)]).result()
    assert len(result) == 2
    assert result.metadata == {"version": 2}
    assert result[0].metadata == {"shots": 10, "circuit_metadata": qc.metadata}
    assert result[1].metadata == {"shots": 20, "circuit_metadata": qc2.metadata}
