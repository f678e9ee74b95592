"""Mid-circuit measurement (``qd.measure``, ``qd.cond``, statistics of outcomes) by deferred
measurement: values and gradients against PennyLane's default.qubit (``qml.measure``,
``qml.cond``), sampling against exact probabilities, OpenQASM 3 export run on Aer's dynamic
circuits, and the refusals.
"""
import math

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff import QdiffError
from qdiff.qnode import record_circuit

qml = pytest.importorskip("pennylane")

DT = torch.float64


def _body(lib, x):
    lib.RY(x[0], wires=0)
    lib.RX(x[1], wires=1)
    lib.CNOT(wires=[0, 1])
    m0 = lib.measure(0)
    lib.cond(m0, lib.RY)(x[2], wires=2)
    lib.Hadamard(wires=0)
    m1 = lib.measure(1, reset=True)
    lib.cond(~m0 & m1, lib.CRX)(x[3], wires=[0, 2])
    lib.cond(m1, lib.PauliX, lib.Hadamard)(wires=1)
    m2 = lib.measure(2)
    lib.cond(m2, lib.IsingXX)(x[0] * x[1], wires=[0, 1])
    return (lib.expval(lib.Z(0) @ lib.X(1)), lib.expval(m0), lib.expval(m2),
            lib.probs(op=[m0, m1]), lib.var(lib.Y(1)), lib.probs(wires=[2, 0]))


def _outputs(res):
    return torch.cat([torch.as_tensor(r, dtype=DT).reshape(-1) for r in res])


@pytest.mark.parametrize("diff_method", ["backprop", "adjoint", "parameter-shift"])
def test_values_and_gradients_match_pennylane(diff_method):
    x = torch.tensor([0.7, -1.2, 0.4, 2.1], dtype=DT, requires_grad=True)
    ours = qd.qnode(qd.device("statevector", wires=3), diff_method=diff_method)(
        lambda x: _body(qd, x))
    ref = qml.qnode(qml.device("default.qubit"), interface="torch")(lambda x: _body(qml, x))
    a, b = _outputs(ours(x)), _outputs(ref(x))
    assert torch.allclose(a, b, atol=1e-12)
    w = torch.linspace(-1, 1, a.numel(), dtype=DT)
    (ga,) = torch.autograd.grad(a @ w, x)
    (gb,) = torch.autograd.grad(b @ w, x)
    assert torch.allclose(ga, gb, atol=1e-10)


def test_batched_inputs_and_closed_form():
    """RY(x) then measure and copy: <Z1> = cos x, P(m = 1) = sin^2(x/2), for a batch."""
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev)
    def f(x):
        qd.RY(x, wires=0)
        m = qd.measure(0, reset=True)
        qd.cond(m, qd.X(wires=1))
        return qd.expval(qd.Z(1)), qd.expval(m), qd.expval(qd.Z(0))

    x = torch.linspace(0.1, 3.0, 5, dtype=DT, requires_grad=True)
    out = f(x)
    assert out.shape == (5, 3)
    assert torch.allclose(out[:, 0], torch.cos(x), atol=1e-12)
    assert torch.allclose(out[:, 1], torch.sin(x / 2) ** 2, atol=1e-12)
    assert torch.allclose(out[:, 2], torch.ones_like(x), atol=1e-12)  # reset to |0>
    (g,) = torch.autograd.grad(out[:, 1].sum(), x)
    assert torch.allclose(g, torch.sin(x) / 2, atol=1e-12)


def test_samples_of_an_outcome_follow_its_probability():
    dev = qd.device("statevector", wires=2, shots=4000, seed=5)

    @qd.qnode(dev)
    def f(x):
        qd.RY(x, wires=0)
        m = qd.measure(0)
        return qd.sample(m), qd.sample([m]), qd.probs(op=m)

    s, s2, p = f(torch.tensor(1.1, dtype=DT))
    assert s.shape == (4000,) and set(s.unique().tolist()) <= {0, 1}
    assert s2.shape == (4000, 1)
    q = math.sin(0.55) ** 2
    assert abs(float(s.double().mean()) - q) < 5 * math.sqrt(q * (1 - q) / 4000)
    assert p.shape == (2,) and abs(float(p[1]) - q) < 5 * math.sqrt(q * (1 - q) / 4000)


def test_samples_of_outcomes_are_integers_as_pennylanes():
    """PennyLane's ``qml.sample(m)`` gives int64 outcomes: so do qdiff's, of ``m``, ``~m``
    and ``m0 & m1``, batched or not, as its samples of wires are."""
    import pennylane as qml
    dev = qd.device("statevector", wires=2, shots=50, seed=5)

    @qd.qnode(dev)
    def f(x):
        qd.RY(x, wires=0)
        m = qd.measure(0)
        qd.RY(x, wires=1)
        m1 = qd.measure(1)
        return qd.sample(m), qd.sample(~m), qd.sample(m & m1), qd.sample([m, m1])

    @qml.set_shots(50)
    @qml.qnode(qml.device("default.qubit"))
    def g(x):
        qml.RY(x, wires=0)
        return qml.sample(qml.measure(0))
    ref = g(torch.tensor(1.1, dtype=DT))
    for x in (torch.tensor(1.1, dtype=DT), torch.tensor([0.0, math.pi], dtype=DT)):
        s, sn, sa, sl = f(x)
        assert s.dtype == sn.dtype == sa.dtype == sl.dtype == ref.dtype == torch.int64
        assert s.shape == x.shape + (50,) and sl.shape == x.shape + (50, 2)
    s, sn, sa, _ = f(torch.tensor([0.0, math.pi], dtype=DT))
    assert s.tolist() == [[0] * 50, [1] * 50] and sn.tolist() == [[1] * 50, [0] * 50]
    assert sa.tolist() == [[0] * 50, [1] * 50]


def test_qasm3_export_runs_as_a_dynamic_circuit_on_aer():
    pytest.importorskip("qiskit_aer")
    from qiskit import ClassicalRegister
    from qiskit_aer import AerSimulator
    from qdiff.circuits.qasm import dumps
    from qdiff.circuits.qiskit_io import to_qiskit
    x = torch.tensor([0.7, -1.2, 0.4, 2.1], dtype=DT)

    def f(x):
        _body(qd, x)
        return qd.probs(wires=[0, 1, 2])

    rec = record_circuit(f, 3, x)
    text = dumps(rec.circuit, version=3)
    assert "m[0] = measure q[0];" in text and "if (!m[0] && m[1])" in text
    assert "qubit[3] q;" in text and "bit[3] m;" in text
    exact = qd.qnode(qd.device("statevector", wires=3))(f)(x)
    qc = to_qiskit(rec.circuit, rec.theta)
    out = ClassicalRegister(3, "out")
    qc.add_register(out)
    qc.measure([0, 1, 2], out)
    shots = 20000
    counts = AerSimulator(seed_simulator=3).run(qc, shots=shots).result().get_counts()
    freq = torch.zeros(8, dtype=DT)
    for key, c in counts.items():
        bits = key.split()[0]  # the 'out' register comes first, little-endian
        freq[int(bits[::-1], 2)] += c / shots
    sd = torch.sqrt(exact * (1 - exact) / shots)
    assert bool(((freq - exact).abs() <= 5 * sd + 1e-3).all())


def test_record_circuit_of_a_qnode_records_its_function():
    """The README's export ``dumps(record_circuit(f, n, *args).circuit, version=3)`` takes the
    qnode as well as its quantum function (plain and static qnodes)."""
    from qdiff.circuits.qasm import dumps
    x = torch.tensor([0.7, -1.2, 0.4, 2.1], dtype=DT)

    def f(x):
        _body(qd, x)
        return qd.probs(wires=[0, 1, 2])

    expected = dumps(record_circuit(f, 3, x).circuit, version=3)
    node = qd.qnode(qd.device("statevector", wires=3))(f)
    for q in (node, qd.jit(node)):
        rec = record_circuit(q, 3, x)
        assert dumps(rec.circuit, version=3) == expected
        torch.testing.assert_close(rec.theta, record_circuit(f, 3, x).theta)


def test_refusals_name_the_fix():
    dev = qd.device("statevector", wires=2)
    with pytest.raises(QdiffError, match="only available while a qnode records"):
        qd.measure(0)

    def run(body):
        return qd.qnode(dev)(body)()

    with pytest.raises(QdiffError, match="density_matrix"):
        run(lambda: (qd.measure(0), qd.state())[1])
    with pytest.raises(QdiffError, match="no Python truth value"):
        run(lambda: qd.X(1) if qd.measure(0) else None)
    with pytest.raises(QdiffError, match="'\\+' is not supported"):
        run(lambda: qd.measure(0) + qd.measure(1))
    with pytest.raises(QdiffError, match="cond: the condition must be"):
        run(lambda: qd.cond(True, qd.X)(wires=1))
    with pytest.raises(QdiffError, match="postselect"):
        run(lambda: qd.measure(0, postselect=1))
    with pytest.raises(QdiffError, match="one wire at a time"):
        run(lambda: qd.measure([0, 1]))
    with pytest.raises(QdiffError, match="adjoint: a mid-circuit measurement"):
        run(lambda: qd.adjoint(lambda: qd.measure(0))())
    with pytest.raises(QdiffError, match="false_fn needs a condition on one"):
        run(lambda: (lambda m, n: qd.cond(m & n, qd.X, qd.Z)(wires=0))(qd.measure(0),
                                                                      qd.measure(1)))
    pl_dev = qd.device("pennylane", name="default.qubit", wires=2)

    @qd.qnode(pl_dev)
    def g():
        m = qd.measure(0)
        return qd.expval(m)
    with pytest.raises(QdiffError, match=r'fixed register: use qd.device\("statevector"'):
        g()


def test_shots_and_seed_stream_continue_across_calls():
    dev = qd.device("statevector", wires=1, shots=50, seed=2)

    @qd.qnode(dev)
    def f():
        qd.Hadamard(0)
        return qd.sample(qd.measure(0))

    a, b = f(), f()
    assert not torch.equal(a, b)  # one sampling stream, not restarted per call
    assert np.isin(a.numpy(), [0.0, 1.0]).all()


def test_qnodes_with_measurements_draw_from_their_devices_one_stream():
    """Every qnode on a seeded device draws on from the device's stream, those with
    mid-circuit measurements (run on a copy of the device with their extra wires) too: two
    such qnodes, or one and then a plain one, do not repeat each other's shots; the same
    seed on a fresh device repeats the whole sequence."""
    def draws():
        dev = qd.device("statevector", wires=1, shots=64, seed=5)

        def mcm():
            qd.Hadamard(0)
            return qd.sample(qd.measure(0))

        def plain():
            qd.Hadamard(0)
            return qd.sample(wires=[0])
        return [qd.qnode(dev)(mcm)(), qd.qnode(dev)(mcm)(),
                qd.qnode(dev)(plain)().reshape(-1).to(torch.int64)]
    first, again = draws(), draws()
    a, b, c = first
    assert not torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(b, c)
    assert all(torch.equal(u, v) for u, v in zip(first, again))


@pytest.mark.parametrize("diff_method", ["backprop", "parameter-shift"])
def test_pennylane_mid_circuit_measurements_inside_a_qdiff_qnode(diff_method):
    """qml.measure / qml.cond / statistics of PennyLane measurement values, written inside a
    qdiff qnode, are converted to the deferred form: same values and gradients."""
    x = torch.tensor([0.7, -1.2, 0.4, 2.1], dtype=DT, requires_grad=True)
    ours = qd.qnode(qd.device("statevector", wires=3), diff_method=diff_method)(
        lambda x: _body(qml, x))
    ref = qml.qnode(qml.device("default.qubit"), interface="torch")(lambda x: _body(qml, x))
    a, b = _outputs(ours(x)), _outputs(ref(x))
    assert torch.allclose(a, b, atol=1e-12)
    (ga,) = torch.autograd.grad(a.sum(), x)
    (gb,) = torch.autograd.grad(b.sum(), x)
    assert torch.allclose(ga, gb, atol=1e-10)


def test_pennylane_measurement_value_arithmetic_as_statistic():
    def body(lib):
        lib.RY(0.9, wires=0)
        lib.RX(1.7, wires=1)
        m0, m1 = lib.measure(0), lib.measure(1)
        lib.cond(m0 + m1 == 1, lib.RY)(0.5, wires=2)
        return qml.expval(m0 + 2 * m1), qml.var(m0 * m1), qml.expval(qml.Z(2))

    ours = qd.qnode(qd.device("statevector", wires=3))(lambda: body(qml))()
    ref = qml.qnode(qml.device("default.qubit"), interface="torch")(lambda: body(qml))()
    assert torch.allclose(_outputs(ours), _outputs(ref), atol=1e-12)


def test_pennylane_condition_nested_in_a_conditioned_function_needs_both():
    """A qml.cond inside a function qml.cond conditions: both conditions hold (PennyLane's
    own deferral keeps only the outer one), as qd.cond nests."""
    def body(lib, m):
        lib.RY(1.1, wires=0)
        lib.RY(0.6, wires=1)
        m0, m1 = lib.measure(0), lib.measure(1)

        def inner():
            lib.RX(0.9, wires=2)
            lib.cond(m1, lib.CNOT)(wires=[2, 0])

        lib.cond(m0, inner)()
        return m.probs(wires=[0, 2])

    dev = qd.device("statevector", wires=3)
    got = qd.qnode(dev)(lambda: body(qml, qd))()
    native = qd.qnode(dev)(lambda: body(qd, qd))()
    flat = qml.qnode(qml.device("default.qubit"))(lambda: (
        qml.RY(1.1, 0), qml.RY(0.6, 1), m0 := qml.measure(0), m1 := qml.measure(1),
        qml.cond(m0, qml.RX)(0.9, wires=2), qml.cond(m0 & m1, qml.CNOT)(wires=[2, 0]),
        qml.probs(wires=[0, 2]))[-1])()
    assert torch.allclose(got, native, atol=1e-12)
    assert np.allclose(got.numpy(), flat, atol=1e-12)


def test_pennylane_combined_conditions_record_the_same_structure_every_call():
    """A condition or statistic of several PennyLane measurement values (m0 | m1,
    m0 & ~m1 & m2, m0 * 0.5 + m1) records one structure on every call (PennyLane orders the
    measurements of a combined value by random ids), so a static qnode replays it."""
    def body(lib, x):
        for w in range(3):
            lib.RY(x[w], wires=w)
        m0, m1, m2 = lib.measure(0, reset=True), lib.measure(1), lib.measure(2)
        lib.cond(m0 | m1, lib.RY)(x[3], wires=2)
        lib.cond(m0 & ~m1 & m2, lib.RX)(x[4], wires=0)
        return lib.expval(lib.Z(2) @ lib.Z(0)), lib.expval(m0 * 0.5 + m1 - 2 * m2)

    x = torch.tensor([0.7, -1.2, 0.4, 2.1, 0.3], dtype=DT)
    structures = set()
    for _ in range(12):
        rec = record_circuit(lambda x: body(qml, x), 3, x)
        structures.add((tuple((op.gate.name, op.wires) for op in rec.circuit.operations),
                        tuple(repr(m) for m in rec.circuit.measurements)))
    assert len(structures) == 1
    ref = qml.qnode(qml.device("default.qubit"), interface="torch")(lambda x: body(qml, x))
    static = qd.qnode(qd.device("statevector", wires=3), static=True)(lambda x: body(qml, x))
    for k in range(3):
        y = (x * (1 + k / 3)).requires_grad_()
        a, b = static(y), torch.stack(ref(y))
        assert torch.allclose(a, b, atol=1e-12)
        assert torch.allclose(torch.autograd.grad(a.sum(), y)[0],
                              torch.autograd.grad(b.sum(), y)[0], atol=1e-10)


def test_pennylane_postselect_is_refused():
    @qd.qnode(qd.device("statevector", wires=2))
    def f():
        qml.measure(0, postselect=1)
        return qd.expval(qd.Z(1))
    with pytest.raises(QdiffError, match="postselect is not supported"):
        f()


def test_measure_on_a_wire_the_device_lacks_names_the_measurement():
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev)
    def f(x):
        qd.RX(x, wires=0)
        qd.measure(5)
        return qd.expval(qd.Z(0))
    with pytest.raises(qd.QdiffError, match=r"qd.measure on wire 5: the device has wires \[0, 1\]$"):
        f(torch.tensor(0.3))


def test_outcomes_of_a_measurement_and_the_final_bits_read_one_draw():
    """The values of a mid-circuit measurement and the wires measured at the end read one
    draw of the computational basis: expval(m) is the mean of sample(m), probs(op=m) its
    frequencies, and m (measured on wire 0, not reset) agrees with wire 0's final bit."""
    dev = qd.device("statevector", wires=2, shots=400, seed=3)

    @qd.qnode(dev)
    def f(x):
        qd.RY(x, wires=0)
        m = qd.measure(0)
        qd.CNOT(wires=[0, 1])
        return qd.expval(m), qd.sample(m), qd.probs(op=m), qd.sample(wires=[0, 1])

    for x in (torch.tensor(1.1, dtype=DT), torch.tensor([0.4, 2.0], dtype=DT)):
        e, s, p, bits = f(x)
        torch.testing.assert_close(e, s.double().mean(-1), atol=1e-12, rtol=0)
        torch.testing.assert_close(p[..., 1], s.double().mean(-1), atol=1e-12, rtol=0)
        assert torch.equal(s, bits[..., 0]) and torch.equal(s, bits[..., 1])


def test_a_channel_conditioned_on_an_outcome_is_refused_by_name():
    dev = qd.device("mixed", wires=2)

    def run(cond):
        @qd.qnode(dev)
        def f():
            qd.RY(1.1, wires=0)
            cond(qd.measure(0))
            return qd.expval(qd.Z(1))
        return f()

    for cond in (lambda m: qd.cond(m, qd.DepolarizingChannel)(0.3, wires=1),
                 lambda m: qd.cond(m, qd.DepolarizingChannel(0.3, wires=1))):
        with pytest.raises(QdiffError, match=r"cond: channel DepolarizingChannel on wires \[1\]"):
            run(cond)

    @qd.qnode(dev)
    def written_with_pennylane():  # qml.measure / qml.cond inside a qdiff qnode
        qml.RY(1.1, wires=0)
        qml.cond(qml.measure(0), qml.BitFlip)(0.1, wires=1)
        return qd.expval(qd.Z(1))
    with pytest.raises(QdiffError, match=r"cond: channel BitFlip on wires \[1\] cannot be "
                                         r"conditioned"):
        written_with_pennylane()


def test_pennylane_operations_in_qd_cond_are_refused_by_name():
    """qd.cond conditions qdiff's gates; PennyLane's operations are named in the refusal, which
    points to qml.cond (converted inside a qdiff qnode)."""
    @qd.qnode(qd.device("statevector", wires=2))
    def f(x):
        qd.RY(x, wires=0)
        m = qd.measure(0)
        qd.cond(~m, qml.RX)(2 * x, wires=1)
        return qd.expval(qd.Z(1))

    with pytest.raises(qd.QdiffError, match="RX.*cannot be conditioned.*qml.cond"):
        f(torch.tensor(1.1, dtype=DT))


def test_qdiff_gates_inside_a_function_pennylane_records_are_refused():
    """qml.cond / qml.adjoint / qml.ctrl of a function record only PennyLane's operations: a
    qdiff gate made inside would act unconditioned, uninverted or uncontrolled (cos 1.3 for
    <Z1> where the conditioned circuit gives 0.914), so it is refused by name."""
    dev = qd.device("statevector", wires=2)
    x = torch.tensor([0.7, 1.3], dtype=DT)

    def rx(t):
        qd.RX(t, wires=1)

    wraps = (lambda x: qml.cond(qml.measure(0), rx)(x[1]),
             lambda x: qml.cond(qml.measure(0), qd.RX)(x[1], wires=1),
             lambda x: qml.adjoint(rx)(x[1]),
             lambda x: qml.adjoint(qd.RY)(x[1], wires=1),
             lambda x: qml.ctrl(rx, control=0)(x[1]))
    for wrap in wraps:
        @qd.qnode(dev)
        def f(x):
            qml.RY(x[0], wires=0)
            wrap(x)
            return qd.expval(qd.Z(1))
        with pytest.raises(QdiffError, match=r"qdiff r[xy] on wires \[1\] was made inside a "
                                             r"function PennyLane records.*qd.cond"):
            f(x)

    @qd.qnode(dev)
    def g(x):  # PennyLane's gates there, or qdiff's own conditioning: both run
        qml.RY(x[0], wires=0)
        qml.cond(qml.measure(0), lambda t: qml.RX(t, wires=1))(x[1])
        qd.cond(qd.measure(0), rx)(x[1])
        return qd.expval(qd.Z(1))
    p1 = (1 - math.cos(0.7)) / 2
    assert float(g(x)) == pytest.approx(1 - p1 + p1 * math.cos(2.6), abs=1e-12)


@pytest.mark.parametrize("static", [False, True])
def test_qd_cond_nested_in_conditioned_functions_joins_the_conditions(static):
    """A qd.cond inside a function qd.cond conditions holds when both do, whatever the
    values asked (~m, else branches, three levels; a contradicting one never fires):
    values and gradients as the flat conditions on default.qubit."""
    def nested(x):
        for w in range(3):
            qd.RY(x[w], wires=w)
        m0, m1, m2 = qd.measure(0), qd.measure(1), qd.measure(2)

        def lvl3(a):
            qd.RX(a, wires=0)
            qd.cond(m0, qd.RY(a, wires=0))  # under ~m0: never

        def lvl2(a):
            qd.RZ(a, wires=2)
            qd.cond(~m2, lvl3)(a * 2)
            qd.cond(m2, qd.PauliX(wires=1))

        def lvl1(a):
            qd.RX(a, wires=2)
            qd.cond(~m1, lvl2, lambda b: qd.RY(b, wires=1))(a)

        qd.cond(~m0, lvl1, lambda a: qd.RX(a, wires=0))(x[3])
        return qd.probs(wires=[0, 1, 2])

    def flat(x):
        for w in range(3):
            qml.RY(x[w], wires=w)
        m0, m1, m2 = qml.measure(0), qml.measure(1), qml.measure(2)
        qml.cond(~m0, qml.RX)(x[3], wires=2)
        qml.cond(~m0 & ~m1, qml.RZ)(x[3], wires=2)
        qml.cond(~m0 & ~m1 & ~m2, qml.RX)(x[3] * 2, wires=0)
        qml.cond(~m0 & ~m1 & m2, qml.PauliX)(wires=1)
        qml.cond(~m0 & m1, qml.RY)(x[3], wires=1)
        qml.cond(m0, qml.RX)(x[3], wires=0)
        return qml.probs(wires=[0, 1, 2])

    x = torch.tensor([0.7, 1.3, 0.9, -0.4], dtype=DT, requires_grad=True)
    ours = qd.qnode(qd.device("statevector", wires=3), static=static)(nested)(x)
    ref = qml.qnode(qml.device("default.qubit"), interface="torch")(flat)(x)
    assert torch.allclose(ours, ref, atol=1e-12)
    weights = torch.arange(8, dtype=DT)
    assert torch.allclose(torch.autograd.grad((ours * weights).sum(), x)[0],
                          torch.autograd.grad((ref * weights).sum(), x)[0], atol=1e-10)


def test_a_pennylane_measurement_value_in_a_qdiff_statistic_is_refused_by_name():
    dev = qd.device("statevector", wires=1, shots=10)
    for stat in (qd.expval, qd.var, qd.sample, qd.counts):
        @qd.qnode(dev)
        def f():
            qml.RY(0.4, wires=0)
            return stat(qml.measure(0))
        with pytest.raises(QdiffError, match=r"PennyLane measurement value .* qml.expval\(m\)"):
            f()


def test_counts_of_an_outcome_have_int_keys_as_its_samples():
    """PennyLane's ``qml.counts(m)`` (deferred) keys the 0/1 outcomes as integers, as its and
    qdiff's samples of ``m`` are: so do qdiff's counts, all_outcomes and batches included."""
    dev = qd.device("statevector", wires=1, shots=20, seed=4)

    @qd.qnode(dev)
    def f(x):
        qd.RY(x, wires=0)
        m = qd.measure(0)
        return qd.counts(m), qd.counts(~m, all_outcomes=True), qd.counts(op=m)

    c, cn, co = f(torch.tensor(0.0, dtype=DT))
    assert c == co == {0: 20} and cn == {0: 0, 1: 20}
    assert all(type(k) is int for d in (c, cn, co) for k in d)
    cb = f(torch.tensor([0.0, math.pi], dtype=DT))[0]
    assert cb == [{0: 20}, {1: 20}] and all(type(k) is int for d in cb for k in d)


def test_pennylane_samples_and_counts_of_values_inside_a_qdiff_qnode():
    """qml.sample / qml.counts of PennyLane measurement values in a qdiff qnode: int64 samples
    and int keys of the values (arithmetic included), as default.qubit gives them."""
    @qd.qnode(qd.device("statevector", wires=2, shots=30, seed=1))
    def f():
        qml.PauliX(0)
        m0, m1 = qml.measure(0), qml.measure(1)
        return (qml.sample(m0), qml.counts(m0), qml.counts(m0 + 2 * m1, all_outcomes=True),
                qml.sample(0.5 * m0))

    s, c, ca, half = f()
    assert s.dtype == torch.int64 and s.tolist() == [1] * 30
    assert c == {1: 30} and all(type(k) is int for k in c)
    assert ca == {0: 0, 1: 30, 2: 0, 3: 0} and all(type(k) is int for k in ca)
    assert half.dtype == DT and half.tolist() == [0.5] * 30


@pytest.mark.parametrize("lib", ["qd", "qml"])
def test_a_qnode_with_measurements_called_inside_another_qnode_numbers_its_own_outcomes(lib):
    """A qnode called in another qnode's function records a circuit of its own: its
    outcome wires count from its own first measurement, and the outer circuit's from the
    outer's, whichever side measures first."""
    L = qd if lib == "qd" else qml
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev)
    def inner(x):
        L.RX(x, wires=0)
        m = L.measure(0)
        L.cond(m, L.PauliX)(wires=1)
        return qd.expval(qd.Z(1))

    @qd.qnode(dev)
    def outer(x):
        L.measure(1)
        y = inner(x)
        qd.RY(y, wires=0)
        m = L.measure(0)
        return qd.expval(qd.Z(0)), L.expval(m)

    x = torch.tensor(0.3, dtype=DT)
    c = math.cos(math.cos(0.3))
    assert torch.allclose(inner(x), torch.tensor(math.cos(0.3), dtype=DT), atol=1e-12)
    assert torch.allclose(outer(x), torch.tensor([c, (1 - c) / 2], dtype=DT), atol=1e-12)


def test_a_register_too_wide_for_memory_says_the_measurements_added_its_wires(monkeypatch):
    """Thirty measurements on three wires simulate 33 qubits: the memory refusal says how many
    of them the measurements add."""
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "1G")

    @qd.qnode(qd.device("statevector", wires=3))
    def f(x):
        for i in range(30):
            qd.RX(x, wires=i % 3)
            qd.measure(i % 3)
        return qd.expval(qd.Z(0))
    with pytest.raises(qd.QdiffMemoryError, match=r"33 qubits.*30 of the 33 wires are the "
                       r"circuit's mid-circuit measurements"):
        f(torch.tensor(0.3))
