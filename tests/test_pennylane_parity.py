"""PennyLane's names in qdiff: ``adjoint``, ``ctrl``, ``QFT``, ``IQPEmbedding``,
``density_matrix``, ``specs``, ``qnn.TorchLayer`` and the layer's dtypes.

Oracles: PennyLane's default.qubit on the same circuit, finite differences, and a count of the
backend calls a backward pass really makes.
"""
import inspect
import math

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff import QdiffError

qml = pytest.importorskip("pennylane")

DT = torch.float64


def _pl_state(body, n, *args):
    @qml.qnode(qml.device("default.qubit", wires=n), interface="torch")
    def circ(*a):
        body(*a)
        return qml.state()
    return circ(*args)


def _qd_state(body, n, *args, diff_method="best"):
    @qd.qnode(qd.device("statevector", wires=n), diff_method=diff_method)
    def circ(*a):
        body(*a)
        return qd.state()
    return circ(*args)


def _prep(lib, x, n):
    for w in range(n):
        lib.RY(x[w], wires=w)
        lib.RZ(x[n + w] * 0.7, wires=w)


# -- adjoint ------------------------------------------------------------------------------------


def test_adjoint_of_operations_functions_and_templates():
    x = torch.rand(6, dtype=DT) * 3
    w = torch.rand(2, 3, 3, dtype=DT) * 3

    def body(lib):
        def f(x, w):
            _prep(lib, x, 3)
            lib.adjoint(lib.RX(x[0] * 2, wires=1))
            lib.adjoint(lib.S(wires=2))
            lib.adjoint(lib.StronglyEntanglingLayers)(w, wires=range(3))
            lib.adjoint(lambda: (lib.CRY(x[1], wires=[0, 2]), lib.IsingXX(x[2], wires=[1, 2])))()
        return f

    a = _qd_state(body(qd), 3, x, w)
    b = _pl_state(body(qml), 3, x, w)
    assert torch.allclose(a, b.to(a.dtype), atol=1e-12)


def test_adjoint_undoes_the_function_and_is_differentiable():
    w = torch.rand(2, 3, 3, dtype=DT, requires_grad=True)
    dev = qd.device("statevector", wires=3)

    @qd.qnode(dev, diff_method="parameter-shift")
    def f(w):
        qd.StronglyEntanglingLayers(w, wires=range(3))
        qd.adjoint(qd.StronglyEntanglingLayers)(w * 0.5, wires=range(3))
        return qd.expval(qd.Z(0) @ qd.X(2))

    @qml.qnode(qml.device("default.qubit", wires=3), interface="torch")
    def g(w):
        qml.StronglyEntanglingLayers(w, wires=range(3))
        qml.adjoint(qml.StronglyEntanglingLayers)(w * 0.5, wires=range(3))
        return qml.expval(qml.Z(0) @ qml.X(2))

    (ga,) = torch.autograd.grad(f(w), w)
    (gb,) = torch.autograd.grad(g(w), w)
    assert torch.allclose(ga, gb, atol=1e-10)
    assert torch.allclose(_qd_state(lambda: (qd.StronglyEntanglingLayers(w, wires=range(3)),
                                             qd.adjoint(qd.StronglyEntanglingLayers)(
                                                 w, wires=range(3))), 3)[0].abs(),
                          torch.tensor(1.0, dtype=DT))


def test_adjoint_refuses_what_it_cannot_invert():
    with pytest.raises(QdiffError, match="adjoint: expected an operation"):
        qd.adjoint(3)
    with qd.record():
        with pytest.raises(QdiffError, match="measurements cannot be inverted"):
            qd.adjoint(lambda: qd.expval(qd.Z(0)))()
        with pytest.raises(QdiffError, match="state preparation"):
            qd.adjoint(qd.AmplitudeEmbedding)(np.array([0.6, 0.8]), wires=0)


# -- ctrl ---------------------------------------------------------------------------------------

ONE_PARAM = ["RX", "RY", "RZ", "PhaseShift", "IsingXX", "IsingZZ", "SingleExcitation", "CRY"]


@pytest.mark.parametrize("name", ONE_PARAM)
@pytest.mark.parametrize("control, values", [([0], None), ([0, 3], [1, 0]), ([3, 0, 1], None)])
def test_ctrl_matches_pennylane_and_its_gradient(name, control, values):
    k = getattr(qml, name).num_wires
    targets = [w for w in (2, 4, 1, 3, 0) if w not in control][:k]
    x = torch.rand(10, dtype=DT) * 3
    a = torch.tensor(0.83, dtype=DT, requires_grad=True)

    def body(lib):
        def f(x, a):
            _prep(lib, x, 5)
            lib.ctrl(getattr(lib, name)(a, wires=targets), control=control, control_values=values)
        return f

    out = {}
    for method in ("backprop", "parameter-shift", "adjoint"):
        @qd.qnode(qd.device("statevector", wires=5), diff_method=method)
        def e(x, a):
            body(qd)(x, a)
            return qd.expval(qd.X(targets[0]) @ qd.Y(control[0]) + 0.4 * qd.Z(targets[-1]))
        v = e(x, a)
        out[method] = (v, torch.autograd.grad(v, a)[0])

    @qml.qnode(qml.device("default.qubit", wires=5), interface="torch")
    def ref(x, a):
        body(qml)(x, a)
        return qml.expval(qml.X(targets[0]) @ qml.Y(control[0]) + 0.4 * qml.Z(targets[-1]))
    r = ref(x, a)
    (gr,) = torch.autograd.grad(r, a)
    for v, g in out.values():
        assert torch.allclose(v, r, atol=1e-12)
        assert torch.allclose(g, gr, atol=1e-10)


def test_ctrl_of_a_function_and_multi_parameter_gates():
    x = torch.rand(8, dtype=DT) * 3

    def body(lib):
        def f(x):
            _prep(lib, x, 4)
            lib.ctrl(lambda: (lib.Rot(x[0], x[1], x[2], wires=1), lib.CNOT(wires=[1, 2]),
                              lib.Hadamard(wires=3)), control=0, control_values=0)()
            lib.ctrl(lib.Toffoli, control=[3])(wires=[0, 1, 2])
        return f

    a = _qd_state(body(qd), 4, x)
    b = _pl_state(body(qml), 4, x)
    assert torch.allclose(a, b.to(a.dtype), atol=1e-12)


def test_ctrl_gradient_of_multi_parameter_gate_by_finite_differences():
    dev = qd.device("statevector", wires=3)

    @qd.qnode(dev, diff_method="parameter-shift")
    def f(p):
        qd.Hadamard(0)
        qd.RY(0.4, wires=1)
        qd.ctrl(qd.Rot(p[0], p[1], p[2], wires=2), control=[0, 1])
        return qd.expval(qd.X(2) + qd.Y(2) @ qd.Z(0))

    from qdiff.testing import check_vjp
    check_vjp(f, torch.tensor([0.3, -1.1, 0.7], dtype=DT))


def test_multi_controlled_x_and_controlled_qubit_unitary_match_pennylane():
    """PennyLane's MultiControlledX and ControlledQubitUnitary (control wires first, control
    values, string and non-contiguous labels): the same probabilities and gradient as
    default.qubit; bad wires, values and keywords name the operator."""
    U = np.asarray(qml.matrix(qml.prod(qml.Rot(0.3, 0.5, -0.2, wires=0), qml.RX(0.4, wires=1))))
    labels = ["a", 3, "q", 7, 0]

    def body(lib, x):
        for i, w in enumerate(labels):
            lib.RY(0.3 + 0.4 * i, wires=w); lib.RX(x * (i + 1), wires=w)
        lib.MultiControlledX(wires=["a", 3, "q"], control_values=[0, 1])
        lib.MultiControlledX(wires=[7, 0], work_wires=["a"])
        lib.ControlledQubitUnitary(torch.tensor(U), wires=[0, "a", 3, "q"], control_values=[1, 0])
        lib.ControlledQubitUnitary(torch.tensor(U), wires=[7, 0, "a"])
        return lib.probs(wires=labels)

    x = torch.tensor(0.37, dtype=DT, requires_grad=True)
    ours = qd.qnode(qd.device("statevector", wires=labels))(lambda x: body(qd, x))(x)
    theirs = qml.QNode(lambda x: body(qml, x), qml.device("default.qubit", wires=labels),
                       interface="torch")(x)
    assert torch.allclose(ours, theirs.to(DT), atol=1e-12)
    c = torch.arange(32, dtype=DT)
    g1, = torch.autograd.grad((ours * c).sum(), x)
    g2, = torch.autograd.grad((theirs * c).sum(), x)
    assert abs(float(g1 - g2)) < 1e-10
    for bad, match in [(lambda: qd.MultiControlledX(wires=[0]), "MultiControlledX: wires"),
                       (lambda: qd.MultiControlledX(wires=[0, 1], work_wires=[1]), "work_wires"),
                       (lambda: qd.MultiControlledX(wires=[0, 1, 2], control_values=[1]),
                        "MultiControlledX: control_values"),
                       (lambda: qd.MultiControlledX(wires=[0, 1], bogus=1), "bogus"),
                       (lambda: qd.ControlledQubitUnitary(torch.eye(2), wires=[0]), "base"),
                       (lambda: qd.ControlledQubitUnitary(torch.eye(3), wires=[0, 1]), "base")]:
        with pytest.raises(QdiffError, match=match):
            bad()


def test_ctrl_refuses_bad_controls():
    with qd.record():
        with pytest.raises(QdiffError, match=r"overlap the wires \[0\]"):
            qd.ctrl(qd.RX(0.1, wires=0), control=0)
        with pytest.raises(QdiffError, match="control_values"):
            qd.ctrl(qd.RX(0.1, wires=0), control=[1, 2], control_values=[1])
        with pytest.raises(QdiffError, match="repeated control wire"):
            qd.ctrl(qd.RX(0.1, wires=0), control=[1, 1])


# -- templates ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_qft_matches_pennylane(n):
    x = torch.rand(2 * n, dtype=DT) * 3
    wires = list(range(n))[::-1]

    def body(lib):
        def f(x):
            _prep(lib, x, n)
            lib.QFT(wires=wires)
        return f
    a, b = _qd_state(body(qd), n, x), _pl_state(body(qml), n, x)
    assert torch.allclose(a, b.to(a.dtype), atol=1e-12)


@pytest.mark.parametrize("repeats, pattern", [(1, None), (2, None), (2, [[2, 0], [1, 2]])])
def test_iqp_embedding_matches_pennylane_batched_with_gradient(repeats, pattern):
    x = torch.rand(4, 3, dtype=DT, requires_grad=True)

    @qd.qnode(qd.device("statevector", wires=3))
    def f(x):
        qd.IQPEmbedding(x, wires=[0, 1, 2], n_repeats=repeats, pattern=pattern)
        return [qd.expval(qd.X(i)) for i in range(3)]

    @qml.qnode(qml.device("default.qubit", wires=3), interface="torch")
    def g(x):
        qml.IQPEmbedding(x, wires=[0, 1, 2], n_repeats=repeats, pattern=pattern)
        return [qml.expval(qml.X(i)) for i in range(3)]

    a, b = f(x), torch.stack(g(x), dim=-1)
    assert torch.allclose(a, b, atol=1e-12)
    (ga,) = torch.autograd.grad(a.sum(), x)
    (gb,) = torch.autograd.grad(b.sum(), x)
    assert torch.allclose(ga, gb, atol=1e-10)


def test_template_errors_name_the_argument():
    with qd.record():
        with pytest.raises(QdiffError, match="IQPEmbedding: features"):
            qd.IQPEmbedding(torch.rand(2), wires=[0, 1, 2])
        with pytest.raises(QdiffError, match="n_repeats"):
            qd.IQPEmbedding(torch.rand(2), wires=[0, 1], n_repeats=0)
        with pytest.raises(QdiffError, match=r"pattern entry \[0, 0\]"):
            qd.IQPEmbedding(torch.rand(2), wires=[0, 1], pattern=[[0, 0]])
        with pytest.raises(QdiffError, match="QFT: repeated wire"):
            qd.QFT(wires=[0, 0])


# -- density_matrix -----------------------------------------------------------------------------


@pytest.mark.parametrize("wires", [[0], [2, 0], [1, 2, 3], [3, 2, 1, 0]])
def test_density_matrix_matches_pennylane(wires):
    x = torch.rand(3, 8, dtype=DT, requires_grad=True)

    @qd.qnode(qd.device("statevector", wires=4))
    def f(x):
        _prep(qd, x.T, 4)
        qd.CNOT([0, 2])
        qd.CRX(x[..., 0], wires=[1, 3])
        return qd.density_matrix(wires)

    @qml.qnode(qml.device("default.qubit", wires=4), interface="torch")
    def g(x):
        _prep(qml, x.T, 4)
        qml.CNOT([0, 2])
        qml.CRX(x[..., 0], wires=[1, 3])
        return qml.density_matrix(wires)

    a, b = f(x), g(x)
    assert a.shape == (3, 2 ** len(wires), 2 ** len(wires))
    assert torch.allclose(a, b.to(a.dtype), atol=1e-12)
    (ga,) = torch.autograd.grad(a.real.sum() + a.imag.abs().sum(), x)
    (gb,) = torch.autograd.grad(b.real.sum() + b.imag.abs().sum(), x)
    assert torch.allclose(ga, gb, atol=1e-10)


def test_density_matrix_refusals():
    with pytest.raises(QdiffError, match="density_matrix: give the wires"):
        qd.density_matrix(None)

    @qd.qnode(qd.device("statevector", wires=2, shots=10))
    def f():
        return qd.density_matrix([0])
    with pytest.raises(QdiffError, match="density_matrix.*shots"):
        f()


# -- specs --------------------------------------------------------------------------------------


class _Counting:
    """Wraps a backend and counts execute calls and bindings run."""

    def __init__(self, dev):
        self.dev, self.calls, self.rows = dev, 0, 0

    def __getattr__(self, name):
        return getattr(self.dev, name)

    def execute(self, jobs):
        self.calls += 1
        self.rows += sum(j.theta.shape[0] for j in jobs)
        return self.dev.execute(jobs)

    def vjp(self, jobs, cot, res):
        self.calls += 1
        self.rows += sum(j.theta.shape[0] for j in jobs)
        return self.dev.vjp(jobs, cot, res)


@pytest.mark.parametrize("method", ["parameter-shift", "adjoint", "finite-diff", "backprop"])
def test_specs_counts_and_the_real_gradient_cost(method):
    dev = _Counting(qd.device("statevector", wires=3))

    @qd.qnode(dev, diff_method=method)
    def f(x, w):
        qd.AngleEmbedding(x, wires=range(3))
        qd.CRY(w[0], wires=[0, 1])
        qd.Rot(w[0], w[1], w[2], wires=2)
        qd.CNOT([1, 2])
        return [qd.expval(qd.Z(0)), qd.var(qd.X(2))] if method != "adjoint" else \
            qd.expval(qd.Z(2))

    x = torch.rand(5, 3, dtype=DT)
    w = torch.rand(3, dtype=DT, requires_grad=True)
    s = qd.specs(f)(x, w)
    assert s["gate_types"] == {"RX": 3, "CRY": 1, "Rot": 1, "CNOT": 1}
    assert s["depth"] == 3 and s["num_wires"] == 3 and s["num_used_wires"] == 3
    assert s["num_params"] == 7 and s["num_trainable_params"] == 4 and s["batch_size"] == 5
    assert s["diff_method"] == method and s["gradient_method"] == method
    out = f(x, w)
    dev.calls = dev.rows = 0
    out.sum().backward()
    assert (dev.calls, dev.rows) == (s["backend_calls_per_gradient"], s["circuits_per_gradient"])
    expected_rows = {"parameter-shift": (4 + 2 * 3 + 1) * 5, "adjoint": 5,
                     "finite-diff": (2 * 4 + 1) * 5, "backprop": 0}[method]
    assert s["circuits_per_gradient"] == expected_rows


def test_specs_refuses_other_objects():
    with pytest.raises(QdiffError, match="specs: expected a qdiff qnode"):
        qd.specs(lambda: None)


@pytest.mark.parametrize("meas", ["expval2", "probs3", "expval0", "state", "probs"])
def test_specs_count_the_wires_measurements_name_as_pennylane(meas):
    """PennyLane's specs count the wires of the operations and those the measurements name
    (``num_allocs``); ``state()`` and ``probs()`` name none."""
    import pennylane as qml

    def ms(ns):
        return {"expval2": lambda: ns.expval(ns.Z(2)), "probs3": lambda: ns.probs(wires=[3]),
                "expval0": lambda: ns.expval(ns.Z(0)), "state": lambda: ns.state(),
                "probs": lambda: ns.probs()}[meas]
    f = qd.qnode(qd.device("statevector", wires=4))(lambda: (qd.RX(0.3, wires=0), ms(qd)())[1])
    g = qml.qnode(qml.device("default.qubit", wires=4))(
        lambda: (qml.RX(0.3, wires=0), ms(qml)())[1])
    assert qd.specs(f)()["num_used_wires"] == qml.specs(g)().resources.num_allocs


def test_specs_of_a_record_once_qnode_is_that_of_its_qnode():
    """``qd.qnode(dev, static=True)`` and ``qd.jit(qnode)`` are qnodes: specs describes
    them as it describes the plain qnode of the same function."""
    dev = qd.device("statevector", wires=2)

    def body(x):
        qd.RX(x, wires=0)
        qd.CNOT(wires=[0, 1])
        return qd.expval(qd.Z(1))
    x = torch.tensor(0.3, dtype=DT, requires_grad=True)
    plain = qd.specs(qd.qnode(dev)(body))(x)
    assert qd.specs(qd.qnode(dev, static=True)(body))(x) == plain
    assert qd.specs(qd.jit(qd.qnode(dev)(body)))(x) == plain
    assert plain["gate_types"] == {"RX": 1, "CNOT": 1} and plain["num_trainable_params"] == 1


# -- qnn.TorchLayer and dtypes ------------------------------------------------------------------


def _circuit():
    @qd.qnode(qd.device("statevector", wires=2))
    def circuit(inputs, weights):
        qd.AngleEmbedding(inputs, wires=range(2))
        qd.BasicEntanglerLayers(weights, wires=range(2))
        return [qd.expval(qd.Z(i)) for i in range(2)]
    return circuit


def test_torch_layer_has_pennylanes_signature():
    ours = list(inspect.signature(qd.qnn.TorchLayer.__init__).parameters)
    theirs = list(inspect.signature(qml.qnn.TorchLayer.__init__).parameters)
    assert ours == theirs
    assert issubclass(qd.qnn.TorchLayer, qd.QuantumLayer)


def test_torch_layer_refuses_an_unknown_or_missing_argument_by_name():
    with pytest.raises(QdiffError, match=r"TorchLayer: .*'dtype' \(its arguments: qnode, "
                                         r"weight_shapes, init_method\)"):
        qd.qnn.TorchLayer(_circuit(), {"weights": (3, 2)}, dtype=torch.float64)
    with pytest.raises(QdiffError, match=r"TorchLayer: .*'weight_shapes'"):
        qd.qnn.TorchLayer(_circuit())


def test_layer_follows_default_dtype_and_input_dtype():
    layer = qd.qnn.TorchLayer(_circuit(), {"weights": (3, 2)})
    assert layer.weights.dtype == torch.float32
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), layer, torch.nn.Linear(2, 1))
    out = model(torch.rand(4, 2))  # float32 throughout: no dtype error
    assert out.dtype == torch.float32
    assert layer(torch.rand(4, 2, dtype=DT)).dtype == DT
    assert qd.QuantumLayer(_circuit(), {"weights": (3, 2)}, dtype=DT).weights.dtype == DT
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert qd.qnn.TorchLayer(_circuit(), {"weights": (3, 2)}).weights.dtype == DT
    finally:
        torch.set_default_dtype(old)
    with pytest.raises(QdiffError, match="dtype must be a floating"):
        qd.QuantumLayer(_circuit(), {"weights": (3, 2)}, dtype=torch.int64)


def test_layer_keeps_the_dtype_of_a_tensor_init_method_gives():
    """A float64 tensor given (or returned) by init_method stays float64, as in PennyLane's
    TorchLayer: same weights and outputs as qml.qnn.TorchLayer under a float32 default."""
    w0 = torch.rand(3, 2, dtype=DT)

    def body(inputs, weights):
        qml.AngleEmbedding(inputs, wires=range(2))
        qml.BasicEntanglerLayers(weights, wires=range(2))
        return [qml.expval(qml.PauliZ(i)) for i in range(2)]
    pl = qml.qnn.TorchLayer(qml.qnode(qml.device("default.qubit", wires=2))(body),
                            {"weights": (3, 2)}, init_method={"weights": w0.clone()})
    ours = qd.qnn.TorchLayer(_circuit(), {"weights": (3, 2)}, init_method={"weights": w0})
    assert pl.weights.dtype == ours.weights.dtype == DT
    assert torch.equal(ours.weights.detach(), w0)
    x = torch.rand(4, 2, dtype=DT)
    assert torch.allclose(ours(x), pl(x), atol=1e-14, rtol=0)
    returned = qd.qnn.TorchLayer(_circuit(), {"weights": (3, 2)},
                                 init_method=lambda t: w0.clone())
    assert returned.weights.dtype == DT
    # in-place inits, lists, and an explicit dtype keep the layer's dtype
    assert qd.qnn.TorchLayer(_circuit(), {"weights": (3, 2)},
                             init_method=torch.nn.init.normal_).weights.dtype == torch.float32
    assert qd.qnn.TorchLayer(_circuit(), {"weights": (3, 2)},
                             init_method={"weights": w0.tolist()}).weights.dtype == torch.float32
    assert qd.QuantumLayer(_circuit(), {"weights": (3, 2)}, init_method={"weights": w0},
                           dtype=torch.float32).weights.dtype == torch.float32


def test_float32_layer_matches_float64_to_float32_precision():
    torch.manual_seed(0)
    l32 = qd.qnn.TorchLayer(_circuit(), {"weights": (3, 2)})
    l64 = qd.QuantumLayer(_circuit(), {"weights": (3, 2)}, init_method={"weights": l32.weights},
                          dtype=DT)
    x = torch.rand(6, 2)
    assert torch.allclose(l32(x).double(), l64(x.double()), atol=1e-6)
    assert math.isfinite(float(l32(x).detach().sum()))


def _layer_pair(body_qd, body_pl, weight_shapes, n=2):
    """The same circuit as qdiff's and PennyLane's TorchLayer, with PennyLane's weights."""
    pl = qml.qnn.TorchLayer(qml.qnode(qml.device("default.qubit", wires=n),
                                      interface="torch")(body_pl), weight_shapes).double()
    ours = qd.qnn.TorchLayer(qd.qnode(qd.device("statevector", wires=n))(body_qd),
                             weight_shapes).double()
    ours.load_state_dict(pl.state_dict())
    return ours, pl


def test_layer_of_mixed_measurements_matches_torch_layer():
    """probs and expval (several shapes) are concatenated per input row, as TorchLayer does."""
    def body(m):
        def f(inputs, weights):
            m.AngleEmbedding(inputs, wires=range(2))
            m.BasicEntanglerLayers(weights, wires=range(2))
            return [m.probs(wires=[0]), m.expval(m.PauliZ(1)), m.probs(wires=[0, 1])]
        return f
    ours, pl = _layer_pair(body(qd), body(qml), {"weights": (2, 2)})
    torch.manual_seed(3)
    for shape in [(2,), (5, 2), (1, 2)]:
        x = torch.rand(*shape, dtype=DT, requires_grad=True)
        xp = x.detach().clone().requires_grad_()
        a, b = ours(x), pl(xp)
        assert a.shape == b.shape == shape[:-1] + (7,)
        assert torch.allclose(a, b, atol=1e-12)
        ga = torch.autograd.grad(a.sum(), [x, ours.weights])
        gb = torch.autograd.grad(b.sum(), [xp, pl.weights])
        assert all(torch.allclose(u, v, atol=1e-10) for u, v in zip(ga, gb))


def test_layer_argument_conventions_match_torch_layer():
    """'inputs' is fed by name wherever it stands; an int shape 1 is a scalar weight."""
    def body(m):
        def f(w, inputs, v):
            m.AngleEmbedding(inputs, wires=range(2))
            m.BasicEntanglerLayers(w, wires=range(2))
            m.RY(v, wires=0)
            return m.expval(m.PauliZ(0))
        return f
    ours, pl = _layer_pair(body(qd), body(qml), {"w": (1, 2), "v": 1})
    assert ours.v.shape == pl.v.shape == ()
    assert ours.input_arg == pl.input_arg == "inputs"
    assert {k: v.shape for k, v in ours.qnode_weights.items()} == \
        {k: v.shape for k, v in pl.qnode_weights.items()}
    assert ours.qnode_weights["w"] is ours.w
    for shape in [(2,), (4, 2)]:
        x = torch.rand(*shape, dtype=DT)
        a, b = ours(x), pl(x)
        assert a.shape == b.shape == shape[:-1]
        assert torch.allclose(a, b, atol=1e-12)


def test_specs_of_a_call_with_samples_beside_a_differentiated_expval():
    """specs takes every call the qnode takes: a sample next to an expval whose input
    requires grad counts only the expval's shifted circuits."""
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev)
    def f(x):
        qd.RX(x, 0)
        qd.CNOT([0, 1])
        return qd.expval(qd.Z(0)), qd.sample(qd.Z(1))

    x = torch.tensor(0.2, requires_grad=True)
    info = qd.specs(f)(x, shots=10)
    assert info["circuits_per_gradient"] == 2 and info["backend_calls_per_gradient"] == 1


def test_specs_counts_mid_circuit_measurements_as_the_user_wrote_them():
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev)
    def f(x):
        qd.H(0)
        m = qd.measure(0)
        qd.cond(~m, qd.RX)(x, wires=1)
        return qd.expval(qd.Z(1))

    s = qd.specs(f)(torch.tensor(0.3))
    assert s["gate_types"] == {"Hadamard": 1, "MidMeasureMP": 1, "Conditional(RX)": 1}
    assert s["num_operations"] == 3 and s["num_wires"] == 2 and s["num_used_wires"] == 2
