"""Text drawings: one line per wire, gate labels with angles, controls, measurements."""
import pytest
import torch

import qdiff as qd


def test_draw_layout_labels_and_measurements():
    dev = qd.device("statevector", wires=3)

    @qd.qnode(dev)
    def f(x):
        qd.RX(x, wires=0)
        qd.CNOT(wires=[0, 2])
        qd.Hadamard(1)
        qd.CRZ(0.25, wires=[1, 2])
        return [qd.expval(qd.Z(0)), qd.probs([1])]

    text = qd.draw(f)(torch.tensor(0.5))
    lines = text.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("0: ") and "RX(0.50)" in lines[0] and "╭●" in lines[0]
    assert lines[1].startswith("1: ") and "│" in lines[1] and "Hadamard" in lines[1]
    assert "╰X" in lines[2] and "RZ(0.25)" in lines[2]
    assert lines[0].endswith("<Z>") and lines[1].endswith("probs")
    # every wire line has the same width up to the measurement column
    assert len({line.index("┤") for line in lines}) == 1


def test_draw_batched_parameters_show_symbols_and_decimals():
    dev = qd.device("statevector", wires=1)

    @qd.qnode(dev)
    def f(x):
        qd.RY(x, wires=0)
        return qd.expval(qd.X(0))

    assert "RY(θ0)" in qd.draw(f)(torch.rand(4))
    assert "RY(0.123)" in qd.draw(f, decimals=3)(torch.tensor(0.1234))


def test_draw_decimals_none_hides_angles_and_bad_decimals_are_refused():
    """PennyLane's ``qml.draw(qnode, decimals=None)`` draws gates without their angles."""
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev)
    def f(x):
        qd.RY(x, wires=0)
        qd.CRZ(0.25, wires=[0, 1])
        return qd.expval(qd.X(0))

    text = qd.draw(f, decimals=None)(torch.tensor(0.1234))
    assert "RY──" in text and "RZ──" in text and "(" not in text
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(qd.QdiffError, match="decimals"):
            qd.draw(f, decimals=bad)(torch.tensor(0.1))


def test_draw_names_the_statistic_of_each_observable():
    """An expectation value draws as <Z>, a variance as Var[Z], samples as Sample[Z] and
    counts as Counts[Z] (PennyLane's labels), so that they are told apart."""
    dev = qd.device("statevector", wires=4, shots=10)

    @qd.qnode(dev)
    def f():
        qd.Hadamard(0)
        return [qd.expval(qd.Z(0)), qd.var(qd.X(1)), qd.sample(qd.Y(2)), qd.counts(qd.Z(3))]

    lines = qd.draw(f)().splitlines()
    assert [line.split("┤")[1].strip() for line in lines] == \
        ["<Z>", "Var[X]", "Sample[Y]", "Counts[Z]"]


def test_draw_takes_a_calls_shots_and_record_once_qnodes_and_refuses_other_objects():
    """A call's ``shots=`` keyword (as the qnode takes it) does not change the drawing;
    record-once qnodes draw as their qnode; a plain function is refused by name."""
    dev = qd.device("statevector", wires=1)

    def body(x):
        qd.RX(x, wires=0)
        return qd.expval(qd.Z(0))
    f = qd.qnode(dev)(body)
    x = torch.tensor(0.5)
    assert qd.draw(f)(x, shots=10) == qd.draw(f)(x) == "0: ──RX(0.50)──┤  <Z>"
    assert qd.draw(qd.qnode(dev, static=True)(body))(x) == qd.draw(f)(x)
    with pytest.raises(qd.QdiffError, match="draw: expected a qdiff qnode"):
        qd.draw(body)


def test_draw_controlled_gates_show_controls_and_target():
    """``qd.ctrl`` of any gate draws as PennyLane draws it: a dot on each control wire and
    the target gate's label on its wires."""
    dev = qd.device("statevector", wires=3)

    @qd.qnode(dev)
    def f(x):
        qd.ctrl(qd.RX, control=[0, 1])(x, wires=2)
        qd.ctrl(qd.IsingXX, control=0)(0.2, wires=[1, 2])
        return qd.expval(qd.Z(2))

    lines = qd.draw(f)(torch.tensor(0.3)).splitlines()
    assert lines[0].startswith("0: ──╭●──") and "╭●" in lines[0].split("──╭●──", 1)[1]
    assert "├●" in lines[1] and "├IsingXX(0.20)" in lines[1]
    assert "╰RX(0.30)" in lines[2] and "╰IsingXX(0.20)" in lines[2]
    assert "C2(" not in "".join(lines) and "C(" not in "".join(lines)


def test_nested_controls_are_drawn_on_every_control_wire():
    dev = qd.device("statevector", wires=4)

    @qd.qnode(dev)
    def f(x):
        qd.ctrl(qd.ctrl(qd.RZ, control=0), control=[1, 2])(x, wires=3)
        qd.ctrl(qd.CNOT, control=[3])(wires=[0, 1])
        return qd.probs()

    assert qd.draw(f)(0.2).splitlines() == ["0: ──╭●─────────╭●──┤ ╭probs",
                                            "1: ──├●─────────├X──┤ ├probs",
                                            "2: ──├●─────────│───┤ ├probs",
                                            "3: ──╰RZ(0.20)──╰●──┤ ╰probs"]


def test_draw_tells_one_measurement_on_several_wires_from_several_measurements():
    """A product of Paulis is one bracketed measurement (``<Z@Z>``, PennyLane's label), apart
    from one measurement per wire; sums, coefficients and Hermitian matrices draw as 𝓗
    (never as the letter H of a Hadamard); each measurement takes its own column where
    wires overlap."""
    dev = qd.device("statevector", wires=4)

    def drawn(*ms):
        return qd.draw(qd.qnode(dev)(lambda: list(ms) if len(ms) > 1 else ms[0]))().splitlines()
    assert drawn(qd.expval(qd.Z(0) @ qd.Z(1))) == \
        ["0: ──┤ ╭<Z@Z>", "1: ──┤ ╰<Z@Z>", "2: ──┤", "3: ──┤"]
    assert drawn(qd.expval(qd.Z(0)), qd.expval(qd.Z(1))) == \
        ["0: ──┤  <Z>", "1: ──┤  <Z>", "2: ──┤", "3: ──┤"]
    assert drawn(qd.var(qd.X(0) @ qd.Y(2)), qd.probs(wires=[1]), qd.expval(qd.Z(0))) == \
        ["0: ──┤ ╭Var[X@Y]  <Z>", "1: ──┤ │          probs", "2: ──┤ ╰Var[X@Y]", "3: ──┤"]
    assert drawn(qd.expval(qd.Hermitian(torch.eye(2), wires=3)), qd.expval(0.5 * qd.Z(0)),
                 qd.expval(qd.Z(1) + qd.X(2))) == \
        ["0: ──┤  <𝓗>", "1: ──┤ ╭<𝓗>", "2: ──┤ ╰<𝓗>", "3: ──┤  <𝓗>"]


def test_draw_channels_by_name_beside_mid_circuit_measurements():
    """Channels draw as their PennyLane name with their parameters (a constant Kraus channel
    without), in a circuit with a mid-circuit measurement and a conditioned gate too."""
    import numpy as np
    dev = qd.device("mixed", wires=2)
    kraus = [np.sqrt(0.9) * np.eye(2), np.sqrt(0.1) * np.array([[0.0, 1.0], [1.0, 0.0]])]

    @qd.qnode(dev)
    def f(x, p):
        qd.RX(x, wires=0)
        qd.DepolarizingChannel(p, wires=0)
        m = qd.measure(0, reset=True)
        qd.cond(m, qd.RY)(0.7, wires=1)
        qd.PauliError("XY", 0.2, wires=[0, 1])
        qd.QubitChannel(kraus, wires=1)
        return qd.expval(qd.Z(1))

    lines = qd.draw(f)(torch.tensor(0.5), torch.tensor(0.1)).splitlines()
    assert len(lines) == 3
    assert "DepolarizingChannel(0.10)" in lines[0] and "╭PauliError(0.20)" in lines[0]
    assert "╰PauliError(0.20)" in lines[1] and "QubitChannel──" in lines[1]
    assert "RY(0.70)" in lines[1] and lines[2].startswith("m0: ")
