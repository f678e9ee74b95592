"""Mid-circuit measurements measured, not deferred, on qdiff's PennyLane devices: shot by shot
(``mcm_method="one-shot"``), against default.qubit's per-shot result formats exactly and
against exact values (deferred measurement on a wide default.qubit / default.mixed)
statistically; and by traversing the outcome tree (``mcm_method="tree-traversal"``), exactly
equal to deferred measurement; and the refusals."""
import numpy as np
import pytest

qml = pytest.importorskip("pennylane")
from pennylane.exceptions import DeviceError  # noqa: E402

ONE_SHOT = qml.devices.ExecutionConfig(mcm_config=qml.devices.MCMConfig(mcm_method="one-shot"))


def _struct(x):
    if isinstance(x, dict):
        return ("dict", tuple(sorted((type(k).__name__, type(v).__name__)
                                     for k, v in x.items())))
    if isinstance(x, (tuple, list)):
        return tuple(_struct(y) for y in x)
    return (type(x).__name__, str(getattr(x, "dtype", None)), getattr(x, "shape", None))


def _raw(name, tape, wires=3):
    dev = qml.device(name, wires=wires, seed=3)
    config = dev.setup_execution_config(ONE_SHOT)
    tapes, _ = dev.preprocess_transforms(config)((tape,))
    return dev.execute(tapes, config)[0]


def _conditioned(x, y):
    qml.RX(x, 0)
    qml.Hadamard(2)
    m0 = qml.measure(0)
    qml.cond(m0, qml.RY)(y, wires=1)
    qml.CNOT([2, 0])
    m1 = qml.measure(0, reset=True)
    m2 = qml.measure(1)
    qml.cond(m1 & m2, qml.QFT)(wires=[0, 1, 2])  # decomposed, each piece conditioned
    qml.cond(~m1, qml.X, qml.Hadamard)(2)  # an else branch
    return m0, m1, m2


@pytest.mark.parametrize("fast", [True, False])
def test_per_shot_results_have_default_qubit_formats(fast):
    def circuit():
        _conditioned(0.8, 0.4)
        out = [qml.expval(qml.Z(1)), qml.probs(wires=[0, 2]), qml.sample(wires=[2, 0]),
               qml.sample(qml.X(2)), qml.counts(wires=[0, 1]), qml.var(qml.Y(0))]
        if not fast:  # a sum's expval is sampled term by term: PennyLane's per-shot path
            out.append(qml.expval(qml.X(2) + 0.5 * qml.Z(0)))
        return out

    tape = qml.tape.make_qscript(circuit, shots=40)()
    ref = _raw("default.qubit", tape)
    got = _raw("qdiff.statevector", tape)
    assert len(got) == len(ref) == 40
    assert {_struct(r) for r in got} == {_struct(r) for r in ref}
    one = qml.tape.make_qscript(lambda: (_conditioned(0.8, 0.4), qml.sample(wires=[1]))[1],
                                shots=5)()
    assert {_struct(r) for r in _raw("qdiff.statevector", one)} == \
        {_struct(r) for r in _raw("default.qubit", one)}


def _exact(fn, *args, wires=12):
    return qml.QNode(fn, qml.device("default.qubit", wires=wires), mcm_method="deferred")(*args)


def test_statistics_match_exact_values():
    def circuit(x, y):
        m0, m1, m2 = _conditioned(x, y)
        return (qml.expval(qml.Z(1)), qml.probs(wires=[0, 2]), qml.expval(m0),
                qml.probs(op=[m1, m2]), qml.var(qml.X(2)), qml.expval(qml.Y(2) @ qml.Z(1)),
                qml.expval(qml.X(2) + 0.5 * qml.Z(0)))

    shots = 6000
    f = qml.set_shots(qml.QNode(circuit, qml.device("qdiff.statevector", wires=3, seed=5),
                                mcm_method="one-shot"), shots)
    got = f(0.8, 0.4)
    ref = _exact(circuit, 0.8, 0.4)
    for g, r in zip(got, ref):  # 5 standard deviations of a mean of +-1 values or less
        assert np.allclose(g, r, atol=5 * 1.2 / np.sqrt(shots)), (g, r)


def test_each_shot_keeps_its_outcomes_with_its_final_samples():
    def circuit():
        qml.RY(1.1, 0)
        qml.RY(0.7, 1)
        m0 = qml.measure(0)
        m1 = qml.measure(1, reset=True)
        qml.cond(m0, qml.X)(2)
        return qml.sample(wires=[0, 1, 2]), qml.sample(m0), qml.sample(m1), qml.sample(m0 + m1)

    f = qml.set_shots(qml.QNode(circuit, qml.device("qdiff.statevector", wires=3, seed=1),
                                mcm_method="one-shot"), 2000)
    bits, m0, m1, total = f()
    assert np.array_equal(bits[:, 0], m0) and np.array_equal(bits[:, 2], m0)
    assert not bits[:, 1].any()  # reset
    assert np.array_equal(total, m0 + m1)
    # the shots are not sorted by outcome: both outcomes appear in the first tenth
    assert 0 < m0[:200].sum() < 200 and 0 < m1[:200].sum() < 200


@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
def test_condition_nested_in_a_conditioned_function_needs_both_outcomes(name):
    def circuit():
        qml.Hadamard(0)
        qml.Hadamard(1)
        m0 = qml.measure(0)
        m1 = qml.measure(1)

        def inner():
            qml.X(2)
            qml.cond(m1, qml.CNOT)(wires=[2, 0])  # runs where m0 and m1 are 1

        qml.cond(m0, inner)()
        return qml.sample(wires=[0, 2]), qml.sample(m0), qml.sample(m1)

    f = qml.set_shots(qml.QNode(circuit, qml.device(name, wires=3, seed=4),
                                mcm_method="one-shot"), 400)
    bits, m0, m1 = f()
    assert np.array_equal(bits[:, 1], m0)
    assert np.array_equal(bits[:, 0], m0 * (1 - m1))
    assert 0 < (m0 * m1).sum() < 400 and 0 < (m0 * (1 - m1)).sum() < 400


@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
def test_snapshots_are_taken_in_each_shot_as_on_default_qubit(name):
    def circuit():
        qml.RX(0.8, 0)
        qml.Snapshot("start")
        m0 = qml.measure(0)
        qml.Snapshot("z", measurement=qml.expval(qml.Z(0)))
        qml.cond(m0, qml.X)(1)
        qml.Snapshot("probs", measurement=qml.probs(wires=[0, 1]), shots=None)
        return qml.sample(m0)

    def snaps(dev, shots):
        return qml.snapshots(qml.set_shots(qml.QNode(circuit, dev, mcm_method="one-shot"),
                                           shots))()

    for shots in (1, 30):
        got = snaps(qml.device(name, wires=2, seed=5), shots)
        ref = snaps(qml.device("default.qubit", wires=2, seed=5), shots)
        assert got.keys() == ref.keys()
        for key in ("z", "probs"):
            assert _struct(got[key]) == _struct(ref[key]), key
    m0 = got["execution_results"]
    # each shot's snapshots are of its own state: after the measurement, Z is (-1)**m0
    assert np.array_equal(np.asarray(got["z"]), 1 - 2 * m0)
    assert np.array_equal(np.asarray(got["probs"])[:, 3], m0)
    assert len(got["start"]) == 30 and np.allclose(got["start"][0], got["start"][-1])


def test_more_measurements_than_wires_and_postselection():
    def circuit(x):
        qml.RY(x, 0)
        ms = []
        for k in range(6):
            qml.CNOT([0, 1])
            qml.RX(0.3 * k + x, 1)
            ms.append(qml.measure(1, reset=True))
            qml.cond(ms[-1], qml.RZ)(0.5, 0)
        qml.measure(0, postselect=1)
        return qml.expval(qml.X(0)), qml.expval(sum(ms)), qml.probs(op=ms[:2])

    with pytest.raises(DeviceError, match="one-shot"):  # deferring needs 9 wires
        qml.QNode(circuit, qml.device("qdiff.statevector", wires=2))(0.7)
    shots = 6000
    f = qml.set_shots(qml.QNode(circuit, qml.device("qdiff.statevector", wires=2, seed=2),
                                mcm_method="one-shot"), shots)
    got = f(0.7)
    ref = _exact(circuit, 0.7)
    kept = shots * 0.32  # about a third of the shots keep the postselected outcome
    assert np.allclose(got[0], ref[0], atol=5 / np.sqrt(kept))
    assert np.allclose(got[1], ref[1], atol=5 * 2.5 / np.sqrt(kept))
    assert np.allclose(got[2], ref[2], atol=5 * 0.5 / np.sqrt(kept))


def test_parameter_shift_gradient_shot_vector_and_broadcast():
    from pennylane import numpy as pnp

    def circuit(x):
        qml.RX(x, 0)
        m = qml.measure(0, reset=True)
        qml.cond(m, qml.X)(1)
        qml.RY(x, 1)
        return qml.expval(qml.Z(1))

    # exact: <Z1> = (cos^2(x/2) - sin^2(x/2)) cos(x) = cos^2(x). (A parameter inside qml.cond
    # has no shift rule: PennyLane takes finite differences of it, noisy with shots, on
    # default.qubit too.)
    def exact(x):
        return np.cos(x) ** 2

    dev = qml.device("qdiff.statevector", wires=2, seed=4)
    f = qml.set_shots(qml.QNode(circuit, dev, mcm_method="one-shot",
                                diff_method="parameter-shift"), 20000)
    x = pnp.array(0.9, requires_grad=True)
    assert abs(qml.grad(f)(x) + np.sin(1.8)) < 0.05
    vec = qml.set_shots(qml.QNode(circuit, dev, mcm_method="one-shot"), [3000, 5000])(0.9)
    assert isinstance(vec, tuple) and len(vec) == 2
    assert all(abs(v - exact(0.9)) < 0.07 for v in vec)
    xs = np.array([0.2, 1.5, 2.8])
    rows = qml.set_shots(qml.QNode(circuit, dev, mcm_method="one-shot"), 4000)(xs)
    assert np.allclose(rows, exact(xs), atol=0.07)


def test_labels_complex64_seed_and_chunks(monkeypatch):
    def circuit():
        qml.Hadamard("a")
        m = qml.measure("a")
        qml.cond(m, qml.PauliX)("b")
        qml.RY(0.4, "b")
        return qml.sample(wires=["b"]), qml.sample(m), qml.expval(qml.Z("b"))

    outs = []
    for c_dtype in (np.complex128, np.complex64):
        dev = qml.device("qdiff.statevector", wires=["b", "a"], seed=9, c_dtype=c_dtype)
        f = qml.set_shots(qml.QNode(circuit, dev, mcm_method="one-shot"), 3000)
        outs.append(f())
    again = qml.set_shots(qml.QNode(circuit, qml.device("qdiff.statevector", wires=["b", "a"],
                                                        seed=9), mcm_method="one-shot"), 3000)()
    assert np.array_equal(outs[0][0], again[0]) and np.array_equal(outs[0][1], again[1])
    for bits, m, ez in outs:
        # b is |m> rotated by RY(0.4): P(b != m) = sin^2(0.2)
        flips = np.mean(bits[:, 0] != m)
        assert abs(flips - np.sin(0.2) ** 2) < 0.03
        assert abs(ez - 0.0) < 0.1
    # shots in groups that fit the memory budget give the same statistics
    from qdiff.circuits import pennylane_one_shot as one_shot
    from qdiff.circuits import memory
    runs = []
    real = one_shot._run_group
    monkeypatch.setattr(one_shot, "_run_group", lambda *a: (runs.append(a[2]), real(*a))[1])
    row = 4 * 16  # two wires, complex128
    monkeypatch.setattr(memory, "budget", lambda device=None: 2 * 150 * 3 * row)
    dev = qml.device("qdiff.statevector", wires=["b", "a"], seed=9)
    bits, m, _ = qml.set_shots(qml.QNode(circuit, dev, mcm_method="one-shot"), 1000)()
    assert runs == [150] * 6 + [100]
    assert abs(np.mean(bits[:, 0] != m) - np.sin(0.2) ** 2) < 0.04
    monkeypatch.setattr(memory, "budget", lambda device=None: 100)
    with pytest.raises(DeviceError, match="does not fit the memory"):
        qml.set_shots(qml.QNode(circuit, dev, mcm_method="one-shot"), 10)()


def test_refusals_name_the_method_or_the_memory():
    dev = qml.device("qdiff.statevector", wires=2)
    with pytest.raises(DeviceError, match="fill-shots"):
        qml.set_shots(qml.QNode(lambda: (qml.measure(0, postselect=1),
                                         qml.expval(qml.Z(0)))[1], dev,
                                mcm_method="one-shot", postselect_mode="fill-shots"), 10)()
    with pytest.raises(Exception, match="one-shot.*analytic mode"):  # as default.qubit
        qml.QNode(lambda: (qml.measure(0), qml.expval(qml.Z(0)))[1], dev,
                  mcm_method="one-shot")()


def _noisy(x, y):
    qml.RX(x, 0)
    qml.Hadamard(2)
    qml.DepolarizingChannel(0.1, 2)
    m0 = qml.measure(0)
    qml.cond(m0, qml.RY)(y, wires=1)
    qml.AmplitudeDamping(0.3, 1)
    qml.CNOT([2, 0])
    m1 = qml.measure(0, reset=True)
    m2 = qml.measure(1)
    qml.cond(m1 & m2, qml.QFT)(wires=[0, 1, 2])
    qml.cond(~m1, qml.X, qml.Hadamard)(2)
    return m0, m1, m2


def test_mixed_device_with_channels_matches_exact_values_and_formats():
    def circuit(x, y):
        m0, m1, m2 = _noisy(x, y)
        return (qml.expval(qml.Z(1)), qml.probs(wires=[0, 2]), qml.expval(m0),
                qml.probs(op=[m1, m2]), qml.sample(qml.X(2)))

    shots = 6000
    f = qml.set_shots(qml.QNode(circuit, qml.device("qdiff.mixed", wires=3, seed=5),
                                mcm_method="one-shot"), shots)
    got = f(0.8, 0.4)
    def reference(x, y):
        m0, m1, m2 = _noisy(x, y)
        return (qml.expval(qml.Z(1)), qml.probs(wires=[0, 2]), qml.expval(m0),
                qml.probs(op=[m1, m2]), qml.expval(qml.X(2)))

    exact = qml.QNode(reference, qml.device("default.mixed", wires=6),
                      mcm_method="deferred")(0.8, 0.4)
    for g, r in zip(got[:4] + (np.mean(got[4]),), exact):
        assert np.allclose(g, r, atol=5 * 1.2 / np.sqrt(shots)), (g, r)
    # default.mixed has no one-shot method: the formats are default.qubit's (no channels)
    tape = qml.tape.make_qscript(
        lambda: (_conditioned(0.8, 0.4), qml.expval(qml.Z(1)), qml.probs(wires=[0, 2]),
                 qml.sample(wires=[2, 0]), qml.counts(wires=[0, 1]), qml.var(qml.Y(0)),
                 qml.expval(qml.X(2) + qml.Z(0)))[1:], shots=30)()
    assert {_struct(r) for r in _raw("qdiff.mixed", tape)} == \
        {_struct(r) for r in _raw("default.qubit", tape)}


def test_mixed_device_conditioned_channel_and_density_start():
    def circuit(x):
        qml.QubitDensityMatrix(np.diag([0.25, 0.75]), wires=2)
        qml.RX(x, 0)
        m = qml.measure(0, reset=True)
        qml.cond(m, qml.BitFlip)(0.4, wires=1)
        m2 = qml.measure(2)
        qml.cond(m2, qml.X)(0)
        return qml.probs(wires=[0, 1]), qml.expval(m)

    shots = 8000
    f = qml.set_shots(qml.QNode(circuit, qml.device("qdiff.mixed", wires=3, seed=6),
                                mcm_method="one-shot"), shots)
    probs, em = f(1.2)
    p1 = np.sin(0.6) ** 2
    # wire 0: |1> when wire 2 (|1> with probability 3/4) is measured 1; wire 1 flipped with
    # probability 0.4 when m = 1
    ref = np.kron([0.25, 0.75], [1 - 0.4 * p1, 0.4 * p1])
    assert np.allclose(probs, ref, atol=0.025) and abs(em - p1) < 0.025


def test_mixed_device_refuses_one_shot_with_a_device_noise_model():
    pytest.importorskip("qiskit_ibm_runtime")
    dev = qml.device("qdiff.mixed", wires=2, noise="fake_manila")
    f = qml.set_shots(qml.QNode(lambda: (qml.measure(0), qml.expval(qml.Z(0)))[1], dev,
                                mcm_method="one-shot"), 10)
    with pytest.raises(DeviceError, match="fake_manila.*whole circuits"):
        f()


@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
def test_tree_traversal_equals_deferred_measurement(name):
    def circuit(x, y):
        if name == "qdiff.mixed":
            m0, m1, m2 = _noisy(x, y)
        else:
            m0, m1, m2 = _conditioned(x, y)
        return (qml.expval(qml.Z(1)), qml.probs(wires=[0, 2]), qml.expval(m0),
                qml.probs(op=[m1, m2]), qml.var(qml.X(2) + qml.Z(0)), qml.probs(op=m2),
                qml.var(m0 + 2 * m1), qml.expval(m0 * m2 - m1),
                qml.expval(qml.Hamiltonian([0.5], [qml.Y(2)])))

    ref_dev = "default.mixed" if name == "qdiff.mixed" else "default.qubit"
    got = qml.QNode(circuit, qml.device(name, wires=3), mcm_method="tree-traversal")(0.8, 0.4)
    ref = _exact(circuit, 0.8, 0.4) if name == "qdiff.statevector" else \
        qml.QNode(circuit, qml.device(ref_dev, wires=6), mcm_method="deferred")(0.8, 0.4)
    for g, r in zip(got, ref):
        assert np.allclose(g, r, atol=1e-10), (g, r)
    device = qml.QNode(circuit, qml.device(name, wires=3), mcm_method="device")(0.8, 0.4)
    assert np.allclose(device[0], ref[0], atol=1e-10)


def test_tree_traversal_many_measurements_postselection_gradients_broadcast():
    from pennylane import numpy as pnp

    def circuit(x):
        qml.RY(x, 0)
        ms = []
        for k in range(6):
            qml.CNOT([0, 1])
            qml.RX(0.3 * k + x, 1)
            ms.append(qml.measure(1, reset=True))
            qml.cond(ms[-1], qml.RZ)(0.5, 0)
        qml.measure(0, postselect=1)
        return qml.expval(qml.X(0)), qml.expval(sum(ms)), qml.probs(op=ms[:2])

    f = qml.QNode(circuit, qml.device("qdiff.statevector", wires=2), mcm_method="tree-traversal")
    x = pnp.array(0.7, requires_grad=True)
    for g, r in zip(f(x), _exact(circuit, x)):
        assert np.allclose(g, r, atol=1e-10)

    def graded(x):
        qml.RY(x, 0)
        qml.CNOT([0, 1])
        qml.RX(0.4 * x, 1)
        m = qml.measure(1, reset=True)
        qml.cond(m, qml.RX)(0.3, 0)
        qml.RY(x, 1)
        return qml.expval(qml.Z(0) @ qml.Z(1)), qml.probs(wires=[0]), qml.expval(m)

    f = qml.QNode(graded, qml.device("qdiff.statevector", wires=2), mcm_method="tree-traversal")
    ref = qml.QNode(graded, qml.device("default.qubit", wires=3), mcm_method="deferred")
    jac = qml.jacobian(lambda x: qml.math.hstack(f(x)))(x)  # "best": parameter-shift
    assert np.allclose(jac, qml.jacobian(lambda x: qml.math.hstack(ref(x)))(x), atol=1e-8)
    for method in ("backprop", "adjoint"):  # the branch weights are not differentiated
        with pytest.raises(qml.exceptions.QuantumFunctionError, match=method):
            qml.QNode(graded, qml.device("qdiff.statevector", wires=2),
                      mcm_method="tree-traversal", diff_method=method)(x)
    xs = np.array([0.1, 0.7, 2.0])
    for g, r in zip(f(xs), ref(xs)):
        assert np.allclose(g, r, atol=1e-10)
    shots = qml.set_shots(qml.QNode(graded, qml.device("qdiff.statevector", wires=2, seed=8),
                                    mcm_method="tree-traversal"), 8000)(0.7)
    for g, r in zip(shots, ref(0.7)):  # sampled: the one-shot grouping
        assert np.allclose(g, r, atol=0.05)


def test_tree_traversal_in_halves_and_refusals(monkeypatch):
    from qdiff.circuits import memory, pennylane_tree

    def circuit():
        for w in range(3):
            qml.Hadamard(w)
        ms = [qml.measure(w) for w in range(3)]
        qml.cond(ms[0] & ms[2], qml.RX)(0.7, 1)
        return qml.expval(qml.Z(1)), qml.probs(op=ms)

    exact = qml.QNode(circuit, qml.device("qdiff.statevector", wires=3),
                      mcm_method="tree-traversal")()
    levels = []
    real = pennylane_tree._Walk.walk
    monkeypatch.setattr(pennylane_tree._Walk, "walk",
                        lambda self, i, states, *a: (levels.append(len(a[0])),
                                                     real(self, i, states, *a))[1])
    row = 8 * 16
    monkeypatch.setattr(memory, "budget", lambda device=None: 2 * 3 * 2 * row)  # two states
    halves = qml.QNode(circuit, qml.device("qdiff.statevector", wires=3),
                       mcm_method="tree-traversal")()
    assert max(levels) <= 2 and len(levels) > 3  # depth first, in halves
    for g, r in zip(halves, exact):
        assert np.allclose(g, r, atol=1e-12)
    # uniform outcomes; wire 1 collapsed to |m1>, then RX on half the branches: <Z1> = 0
    assert np.allclose(exact[1], np.full(8, 1 / 8)) and abs(exact[0]) < 1e-12
    monkeypatch.setattr(memory, "budget", lambda device=None: 100)
    with pytest.raises(DeviceError, match="does not fit the memory"):
        qml.QNode(circuit, qml.device("qdiff.statevector", wires=3),
                  mcm_method="tree-traversal")()
    monkeypatch.undo()
    with pytest.raises(DeviceError, match="tree-traversal.*StateMP"):
        qml.QNode(lambda: (qml.measure(0), qml.state())[1],
                  qml.device("qdiff.statevector", wires=2), mcm_method="tree-traversal")()


def _nested(x):
    """A qml.cond inside a conditioned function (two nested conditions)."""
    qml.RY(x, 0)
    qml.RY(0.6, 1)
    m0 = qml.measure(0)
    m1 = qml.measure(1)

    def inner():
        qml.RX(0.9, 2)
        qml.cond(m1, qml.CNOT)(wires=[2, 0])

    qml.cond(m0, inner)()
    return qml.probs(wires=[0, 2]), qml.expval(m0 * m1)


def _flat(x):
    """:func:`_nested` with the conditions spelt out."""
    qml.RY(x, 0)
    qml.RY(0.6, 1)
    m0 = qml.measure(0)
    m1 = qml.measure(1)
    qml.cond(m0, qml.RX)(0.9, wires=2)
    qml.cond(m0 & m1, qml.CNOT)(wires=[2, 0])
    return qml.probs(wires=[0, 2]), qml.expval(m0 * m1)


@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
def test_tree_traversal_nested_conditions_and_snapshots(name):
    got = qml.QNode(_nested, qml.device(name, wires=3), mcm_method="tree-traversal")(1.1)
    ref = _exact(_flat, 1.1)
    for g, r in zip(got, ref):
        assert np.allclose(g, r, atol=1e-10)

    def snapped():
        qml.Hadamard(0)
        qml.measure(0)
        qml.Snapshot("s")
        return qml.expval(qml.Z(0))

    with pytest.raises(DeviceError, match="snapshots.*tree-traversal"):
        qml.snapshots(qml.QNode(snapped, qml.device(name, wires=1),
                                mcm_method="tree-traversal"))()


@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
def test_deferred_nested_conditions_need_both_outcomes(name):
    """PennyLane's deferral keeps only the outer of two nested conditions (default.qubit
    applies the CNOT where m1 = 0 too); the devices join them into one condition first."""
    ref = qml.QNode(_flat, qml.device("default.qubit", wires=5))(1.1)
    for wires in (5, None):
        got = qml.QNode(_nested, qml.device(name, wires=wires))(1.1)
        assert np.allclose(got[0], ref[0], atol=1e-10) and np.isclose(got[1], ref[1])


@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
def test_tree_traversal_unlikely_outcomes_and_postselection_of_nothing(name):
    """An outcome of tiny probability is followed (no bias beyond rounding); a postselected
    outcome of probability 5e-14 is kept and renormalised, as deferred measurement does; one
    of probability 0 leaves nothing: NaN results in their shapes, as default.qubit."""
    p, k = 9e-14, 20

    def flips():
        for _ in range(k):
            qml.RX(2 * np.arcsin(np.sqrt(p)), 0)
            m = qml.measure(0, reset=True)
            qml.cond(m, qml.X)(1)
        return qml.expval(qml.Z(1))

    got = qml.QNode(flips, qml.device(name, wires=2), mcm_method="tree-traversal")()
    assert abs(got - (1 - 2 * p) ** k) < 1e-14

    def rare(q):
        qml.RX(2 * np.arcsin(np.sqrt(q)), 1)
        qml.RX(0.4, 0)
        qml.CNOT([1, 2])
        m = qml.measure(1, postselect=1)
        return qml.expval(qml.Z(2)), qml.probs(wires=[0]), qml.var(qml.X(0)), qml.expval(m)

    got = qml.QNode(rare, qml.device(name, wires=3), mcm_method="tree-traversal")(5e-14)
    assert np.allclose(got[0], -1.0) and np.allclose(got[1], [np.cos(0.2) ** 2,
                                                             np.sin(0.2) ** 2])
    assert np.isclose(got[3], 1.0)
    got = qml.QNode(rare, qml.device(name, wires=3), mcm_method="tree-traversal")(0.0)
    assert np.shape(got[1]) == (2,) and all(np.all(np.isnan(g)) for g in got)


_MEMORY_SCRIPT = r"""
import weakref
import numpy as np
import pennylane as qml
from pennylane.exceptions import DeviceError
from qdiff.backends.pennylane_plugin import device as plugin
from qdiff.circuits import memory


def circuit():
    for w in range(3):
        qml.Hadamard(w)
    for i in range(12):
        qml.RY(0.3 + 0.1 * i, i % 3)
        m = qml.measure(i % 3)
        qml.cond(m, qml.RX)(0.4, (i + 1) % 3)
    return qml.expval(qml.Z(2)), qml.probs(wires=[0, 1])


exact = qml.QNode(circuit, qml.device("qdiff.statevector", wires=3),
                  mcm_method="tree-traversal")()
live, peak = weakref.WeakSet(), [0]


def tracked(method):
    real = getattr(plugin._PureStates, method)

    def run(self, *args):
        out = real(self, *args)
        live.add(out)
        peak[0] = max(peak[0], sum(s.untyped_storage().nbytes() for s in
                                   {t.untyped_storage().data_ptr(): t for t in live}.values()))
        return out
    return run


for method in ("evolve", "collapse", "select", "assign"):
    setattr(plugin._PureStates, method, tracked(method))
row = 8 * 16
budget = 24 * row
memory.budget = lambda device=None: 2 * budget
got = qml.QNode(circuit, qml.device("qdiff.statevector", wires=3),
                mcm_method="tree-traversal")()
close = all(np.allclose(g, r, atol=1e-12) for g, r in zip(got, exact))
memory.budget = lambda device=None: 2 * 8 * row
try:
    qml.QNode(circuit, qml.device("qdiff.statevector", wires=3),
              mcm_method="tree-traversal")()
    refused = ""
except DeviceError as exc:
    refused = str(exc)
print(close, peak[0], budget, repr(refused))
"""


def test_tree_traversal_memory_counts_the_states_kept_for_later():
    """Depth first, the states waiting for their turn count against the budget: the live
    branch states stay within the traversal's share of the memory budget (half of it),
    however many measurements. Measured in a fresh interpreter: after a torch.compile in the
    same process (torch's frame evaluation hook), states live longer than Python's
    reference counts say."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    close, peak, budget, refused = out.stdout.strip().splitlines()[-1].split(" ", 3)
    assert close == "True"
    assert 0 < int(peak) <= int(budget)
    assert "kept for the branches still to traverse" in refused


