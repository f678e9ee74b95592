"""PennyLane's qubit templates under qdiff's names: ``qd.GroverOperator`` is
``qml.GroverOperator``, recorded into qdiff qnodes (plain and static) and decomposed into
qdiff's gates, equal to default.qubit in values and gradients for every method."""
from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import qdiff as qd

qml = pytest.importorskip("pennylane")

N = 4
# not forwarded: continuous-variable and qutrit templates, and PennyLane's template machinery
NOT_QUBIT = {"CVNeuralNetLayers", "DisplacementEmbedding", "SqueezingEmbedding",
             "Interferometer", "QutritBasisStatePreparation", "AbstractArray", "Subroutine",
             "SubroutineOp", "TrotterizedQfunc"}


def test_every_qubit_template_of_pennylane_has_a_qdiff_name():
    import pennylane.templates as templates
    from pennylane.operation import Operator
    names = {n for n in dir(templates) if not n.startswith("_") and inspect.isclass(
        getattr(templates, n)) and issubclass(getattr(templates, n), Operator)}
    forwarded = set(qd._PENNYLANE_TEMPLATES)
    assert forwarded <= names
    own = {n for n in names if n in qd._EXPORTS}  # qdiff's own templates
    assert names - own - NOT_QUBIT == forwarded
    assert qd.GroverOperator is qml.GroverOperator and "GroverOperator" in dir(qd)
    assert qd.kUpCCGSD is qml.kUpCCGSD and "kUpCCGSD" in dir(qd)


def _cases(m):
    h = qml.dot([0.5, -0.3, 0.2], [qml.Z(0) @ qml.Z(1), qml.X(2), qml.Y(1) @ qml.Y(3)])
    commuting = qml.dot([0.4, 0.7], [qml.Z(0) @ qml.Z(1), qml.Z(2)])
    return {
        "GroverOperator": lambda x, w: (m.Hadamard(0), m.RY(x[0], 1),
                                        m.GroverOperator(wires=range(N))),
        "BasisEmbedding": lambda x, w: (m.BasisEmbedding([1, 0, 1, 1], wires=range(N)),
                                        m.RX(x[0], 0), m.CNOT([0, 2])),
        "QAOAEmbedding": lambda x, w: m.QAOAEmbedding(x, w.reshape(1, 2 * N), wires=range(N)),
        "RandomLayers": lambda x, w: m.RandomLayers(w, wires=range(N), seed=3),
        "SimplifiedTwoDesign": lambda x, w: m.SimplifiedTwoDesign(
            x, torch.cat([w.reshape(-1), x])[:12].reshape(2, N - 1, 2), wires=range(N)),
        "ApproxTimeEvolution": lambda x, w: (m.RY(x[1], 0), m.ApproxTimeEvolution(h, x[0], 2)),
        "QuantumPhaseEstimation": lambda x, w: m.QuantumPhaseEstimation(
            qml.RX(x[0], wires=3), estimation_wires=[0, 1, 2]),
        "UCCSD": lambda x, w: m.UCCSD(x[:3], wires=range(N), s_wires=[[0, 1, 2], [1, 2, 3]],
                                      d_wires=[[[0, 1], [2, 3]]],
                                      init_state=np.array([1, 1, 0, 0])),
        "kUpCCGSD": lambda x, w: m.kUpCCGSD(torch.cat([x, x[:2]]).reshape(1, 6),
                                            wires=range(N), k=1, delta_sz=0,
                                            init_state=np.array([1, 1, 0, 0])),
        "CommutingEvolution": lambda x, w: ([m.Hadamard(i) for i in range(N)],
                                            m.CommutingEvolution(commuting, x[0])),
        "MottonenStatePreparation": lambda x, w: (m.MottonenStatePreparation(
            np.array([0.5, 0.5j, -0.5, 0.5] * 4) / 2, wires=range(N)), m.RY(x[0], 1)),
    }


# refused by static qnodes, run by plain ones: a decomposition that turns the angle into a
# matrix (a controlled power of RX: tested below), a state preparation (documented)
STATIC_REFUSED = {"QuantumPhaseEstimation", "MottonenStatePreparation"}


@pytest.mark.parametrize("name", sorted(_cases(qml)))
def test_templates_match_default_qubit(name):
    x = torch.tensor([0.3, 0.7, -0.4, 1.1], dtype=torch.float64, requires_grad=True)
    w = torch.tensor([[0.2, -0.5, 0.9, 0.1], [1.3, 0.4, -0.8, 0.6]], dtype=torch.float64,
                     requires_grad=True)
    ref_body, body = _cases(qml)[name], _cases(qd)[name]

    @qml.qnode(qml.device("default.qubit", wires=N), interface="torch")
    def ref(x, w):
        ref_body(x, w)
        return qml.expval(qml.Z(0) @ qml.X(1) + qml.Z(2))
    want = ref(x, w)
    want_grads = torch.autograd.grad(want, (x, w), allow_unused=True)
    for method in ("backprop", "adjoint", "parameter-shift"):
        for static in (False, True):
            if static and name in STATIC_REFUSED:
                continue
            @qd.qnode(qd.device("statevector", wires=N), diff_method=method, static=static)
            def circuit(x, w):
                body(x, w)
                return qd.expval(qd.Z(0) @ qd.X(1) + qd.Z(2))
            out = circuit(x, w)
            grads = torch.autograd.grad(out, (x, w), allow_unused=True)
            assert out.item() == pytest.approx(want.item(), abs=1e-12), (method, static)
            for g, r in zip(grads, want_grads):
                g = torch.zeros((), dtype=torch.float64) if g is None else g
                r = torch.zeros((), dtype=torch.float64) if r is None else r
                assert torch.allclose(g, r, atol=1e-12), (method, static)


def test_a_static_qnode_refuses_a_template_whose_structure_follows_the_angles():
    x = torch.tensor([0.3, 0.7, -0.4, 1.1], dtype=torch.float64, requires_grad=True)
    body = _cases(qd)["QuantumPhaseEstimation"]
    circuit = qd.qnode(qd.device("statevector", wires=N), static=True)(
        lambda x: (body(x, None), qd.expval(qd.Z(0)))[-1])
    with pytest.raises(qd.QdiffError, match="static qnode: the circuit structure"):
        circuit(x)
        circuit(x + 0.1)


def test_a_template_first_used_inside_a_qnode_is_recorded():
    """``qd.QAOAEmbedding`` first used inside a qnode imports PennyLane there, during the
    recording: the template is recorded (default.qubit's value), and one first used later in
    a recording that began with PennyLane loaded is recorded once."""
    import subprocess
    import sys
    code = (
        "import sys, qdiff as qd\n"
        "assert 'pennylane' not in sys.modules\n"
        "dev = qd.device('statevector', wires=2)\n"
        "def f():\n"
        "    qd.RX(0.3, wires=0)\n"
        "    qd.QAOAEmbedding([0.3, 0.4], weights=[[0.1, 0.2, 0.3]], wires=[0, 1])\n"
        "    return qd.expval(qd.Z(0))\n"
        "def g():\n"
        "    qd.RY(0.3, wires=0)\n"
        "    qd.Permute([1, 0], wires=[0, 1])\n"
        "    return qd.expval(qd.Z(0))\n"
        "print(float(qd.qnode(dev)(f)()), float(qd.qnode(dev)(g)()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    qml = pytest.importorskip("pennylane")
    dq = qml.device("default.qubit", wires=2)
    want_f = qml.QNode(lambda: (qml.RX(0.3, wires=0), qml.QAOAEmbedding(
        [0.3, 0.4], weights=[[0.1, 0.2, 0.3]], wires=[0, 1]), qml.expval(qml.Z(0)))[-1], dq)()
    want_g = qml.QNode(lambda: (qml.RY(0.3, wires=0), qml.Permute([1, 0], wires=[0, 1]),
                                qml.expval(qml.Z(0)))[-1], dq)()  # 1 (cos 0.3 dropped or twice)
    assert float(out[0]) == pytest.approx(float(want_f), abs=1e-12)
    assert float(out[1]) == pytest.approx(float(want_g), abs=1e-12)


def _transformed_cases(m):
    h = qml.dot([0.5, -0.3], [qml.Z(0) @ qml.Z(1), qml.X(2)])
    return {
        "adjoint GroverOperator": lambda x: m.adjoint(m.GroverOperator)(wires=[0, 1, 2]),
        "ctrl GroverOperator": lambda x: m.ctrl(m.GroverOperator, control=3)(wires=[0, 1, 2]),
        "adjoint ArbitraryUnitary": lambda x: m.adjoint(m.ArbitraryUnitary)(
            torch.cat([x, x, x, x[:3]]), wires=[1, 2]),
        "ctrl RandomLayers": lambda x: m.ctrl(m.RandomLayers, control=0, control_values=0)(
            x[:3].reshape(1, 3), wires=[1, 2], seed=3),
        "ctrl BasisEmbedding": lambda x: m.ctrl(m.BasisEmbedding, control=0)([1, 0, 1],
                                                                            wires=[1, 2, 3]),
        # an operator passed as an argument is the template's input, not a gate of its own
        "ctrl QuantumPhaseEstimation": lambda x: m.ctrl(m.QuantumPhaseEstimation, control=0)(
            qml.RX(x[0], wires=3), estimation_wires=[1, 2]),
        "adjoint TrotterProduct": lambda x: m.adjoint(m.TrotterProduct)(h, x[1], n=2, order=2),
        "adjoint of an operator": lambda x: m.adjoint(qml.Rot(x[0], x[1], x[2], wires=1)),
        "ctrl of an operator": lambda x: m.ctrl(qml.IsingXY(x[3], wires=[1, 2]), control=[0, 3],
                                                control_values=[0, 1]),
    }


@pytest.mark.parametrize("name", sorted(_transformed_cases(qml)))
def test_adjoint_and_ctrl_of_pennylane_templates_and_operators_match_default_qubit(name):
    """``qd.adjoint``/``qd.ctrl`` of PennyLane's templates and operators (``qd.GroverOperator``
    is ``qml.GroverOperator``): the decomposition into qdiff's gates, inverted or controlled,
    values and gradients equal to ``qml.adjoint``/``qml.ctrl`` on default.qubit."""
    x = torch.tensor([0.3, 0.7, -0.4, 1.1], dtype=torch.float64, requires_grad=True)
    ref_body, body = _transformed_cases(qml)[name], _transformed_cases(qd)[name]

    def prefix(m, x):
        for i in range(N):
            m.RY(0.4 * i + 0.2 + x[i] / 3, wires=i)

    @qml.qnode(qml.device("default.qubit", wires=N), interface="torch")
    def ref(x):
        prefix(qml, x)
        ref_body(x)
        return qml.expval(qml.Z(0) @ qml.X(1) + qml.Y(3))
    want = ref(x)
    want_grad, = torch.autograd.grad(want, x)
    for method in ("backprop", "adjoint", "parameter-shift"):
        @qd.qnode(qd.device("statevector", wires=N), diff_method=method)
        def circuit(x):
            prefix(qd, x)
            body(x)
            return qd.expval(qd.Z(0) @ qd.X(1) + qd.Y(3))
        out = circuit(x)
        grad, = torch.autograd.grad(out, x)
        assert out.item() == pytest.approx(want.item(), abs=1e-12), method
        assert torch.allclose(grad, want_grad, atol=1e-12), method


def test_adjoint_and_ctrl_take_pennylanes_keywords_and_refuse_channels():
    dev = qd.device("statevector", wires=3)

    def run(body, device=dev):
        return qd.qnode(device)(lambda: (body(), qd.expval(qd.Z(0)))[-1])()
    x = run(lambda: (qd.RX(0.3, wires=1), qd.X(2), qd.ctrl(qd.CNOT, control=2, work_wires=[],
                                                           work_wire_type="zeroed")(wires=[1, 0]),
                     qd.adjoint(qd.S, lazy=False)(wires=0)))
    assert float(x) == pytest.approx(np.cos(0.3), abs=1e-12)
    with pytest.raises(qd.QdiffError, match="ctrl: work_wires \\[2\\] overlap"):
        run(lambda: qd.ctrl(qd.CNOT, control=2, work_wires=[2])(wires=[1, 0]))
    with pytest.raises(qd.QdiffError, match="adjoint: lazy must be True or False"):
        run(lambda: qd.adjoint(qd.S, lazy="no")(wires=0))
    mixed = qd.device("mixed", wires=2)
    for make in (lambda: qd.adjoint(qd.BitFlip(0.1, wires=0)),
                 lambda: qd.ctrl(lambda: qd.BitFlip(0.1, wires=0), control=1)(),
                 lambda: qd.adjoint(lambda: qml.BitFlip(0.1, wires=0))()):
        with pytest.raises(qd.QdiffError, match="channel BitFlip.*cannot be inverted or "
                                                "controlled"):
            run(make, mixed)
