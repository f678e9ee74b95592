"""Qiskit parameter expressions evaluated in torch: random expressions (products, sums of several
parameters, sin/cos/exp/log/arctan/pow, quotients) against Qiskit's own binding (statevectors)
and their gradients against central finite differences for every exact diff method; the affine
fast path; grouped evaluation; errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import qdiff as qd
from qdiff import QdiffError
from qdiff.circuits.operation import ParamRef
from qdiff.circuits.qiskit_io import from_qiskit


def params():
    from qiskit.circuit import Parameter
    return [Parameter(n) for n in "abc"]


def expression(draw, ps, depth):
    """A random real-valued Qiskit expression, finite for parameter values in [0.3, 1.5]."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        leaf = draw(st.integers(0, len(ps)))
        return ps[leaf] if leaf < len(ps) else draw(st.floats(-2, 2).filter(lambda v: abs(v) > .1))
    kind = draw(st.sampled_from(["add", "sub", "mul", "div", "sin", "cos", "exp", "log",
                                 "atan", "pow"]))
    x = expression(draw, ps, depth - 1)
    if kind in ("add", "sub", "mul", "div"):
        y = expression(draw, ps, depth - 1)
        if kind == "div":
            return x / (y.cos() ** 2 + 0.5) if not isinstance(y, float) else x / y
        return x + y if kind == "add" else x - y if kind == "sub" else x * y
    if isinstance(x, float):
        x = x * ps[0]
    if kind == "exp":
        return x.sin().exp()
    if kind == "log":
        return (x.sin() * x.sin() + 1).log()
    if kind == "atan":
        return x.arctan()
    if kind == "pow":  # a bounded base keeps the angle's derivatives moderate
        return (x.sin() * x.sin() + 0.5) ** draw(st.sampled_from([2, 3, -1, 0.5]))
    return x.sin() if kind == "sin" else x.cos()


@st.composite
def circuits(draw):
    from qiskit import QuantumCircuit
    ps = params()
    angles = []
    while len(angles) < 4:
        e = expression(draw, ps, 3)
        if not isinstance(e, float) and e.parameters:
            angles.append(e)
    qc = QuantumCircuit(2)
    qc.h(1)
    qc.rx(angles[0], 0)
    qc.ry(angles[1], 1)
    qc.cx(0, 1)
    qc.crz(angles[2], 1, 0)
    qc.u(angles[3], angles[0], 0.3, 0)
    qc.rzz(angles[1], 0, 1)
    return qc


def qiskit_expvals(qc, values: np.ndarray) -> np.ndarray:
    from qiskit.quantum_info import SparsePauliOp, Statevector
    obs = [SparsePauliOp("ZZ"), SparsePauliOp.from_list([("XY", 0.5), ("ZI", -1.0)])]
    out = []
    for row in values:
        sv = Statevector(qc.assign_parameters(dict(zip(qc.parameters, row))))
        out.append([sv.expectation_value(o).real for o in obs])
    return np.array(out)


OBS = ["ZZ", 0.5 * qd.X(1) @ qd.Y(0) - qd.Z(1)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(circuits(), st.integers(0, 2 ** 31 - 1))
def test_random_expressions_match_qiskit_and_finite_differences(qc, seed):
    rng = np.random.default_rng(seed)
    values = rng.uniform(0.3, 1.5, (2, qc.num_parameters))
    ref = qiskit_expvals(qc, values)
    dev = qd.device("statevector", wires=2)
    v = torch.tensor(values, requires_grad=True)
    fd = fd_err = None
    for method in ("backprop", "adjoint", "parameter-shift"):
        f = qd.qnode(dev, diff_method=method, observables=OBS)(qc)
        out = f(v)
        np.testing.assert_allclose(out.detach().numpy(), ref, atol=1e-10)
        (g,) = torch.autograd.grad((out * torch.tensor([1.0, -0.7])).sum(), v)
        if fd is None:  # the O(h^2) truncation error is estimated from a second step size
            fd = central_difference(f, values)
            fd_err = 2 * np.abs(central_difference(f, values, 2e-5) - fd)
        np.testing.assert_allclose(g.numpy(), fd, atol=1e-6 * max(1.0, np.abs(fd).max()) +
                                   fd_err.max())


def central_difference(f, values, h=1e-5):
    out = np.zeros_like(values)
    with torch.no_grad():
        for i in np.ndindex(values.shape):
            up, dn = values.copy(), values.copy()
            up[i] += h
            dn[i] -= h
            w = torch.tensor([1.0, -0.7], dtype=torch.float64)
            fu = (f(torch.tensor(up)) * w).sum()
            fdn = (f(torch.tensor(dn)) * w).sum()
            out[i] = float(fu - fdn) / (2 * h)
    return out


def test_affine_angles_keep_the_paramref_fast_path():
    from qiskit import QuantumCircuit
    a, b, _ = params()
    qc = QuantumCircuit(1)
    qc.rx(2 * a + 1, 0)
    qc.ry(-b / 4 + 0.5, 0)
    qc.rz(a * 0 + 0.25, 0)
    imp = from_qiskit(qc)
    assert imp.num_expressions == 0 and imp.circuit.num_params == 2
    p0, p1, p2 = (op.params[0] for op in imp.circuit.operations)
    assert p0 == ParamRef(0, 2.0, 1.0) and p1 == ParamRef(1, -0.25, 0.5) and p2 == 0.25


def test_expressions_are_deduplicated_and_grouped_by_shape():
    from qiskit.circuit.library import zz_feature_map
    fm = zz_feature_map(4, reps=2)
    imp = from_qiskit(fm)
    # 6 pair products, repeated in the second rep: one column each, one evaluation group
    assert imp.num_expressions == 6
    assert len(imp.expressions._groups) == 1
    assert imp.circuit.num_params == 4 + 6
    x = torch.rand(3, 4, dtype=torch.float64)
    th = imp.theta(x)
    i, j = 1, 3
    col = imp.expressions.expressions.index(next(
        e for e in imp.expressions.expressions if {p.name for p in e.parameters} == {"x[1]", "x[3]"}))
    assert torch.allclose(th[:, 4 + col], 2 * (x[:, i] - np.pi) * (x[:, j] - np.pi), atol=1e-14)


def test_sum_of_several_parameters_and_chain_rule():
    from qiskit import QuantumCircuit
    a, b, c = params()
    qc = QuantumCircuit(1)
    qc.ry(a + b - 2 * c, 0)
    f = qd.qnode(qd.device("statevector", wires=1), diff_method="parameter-shift",
                 observables="Z")(qc)
    v = torch.tensor([0.2, 0.5, 0.1], dtype=torch.float64, requires_grad=True)
    out = f(v)
    s = float(v[0] + v[1] - 2 * v[2])
    assert abs(float(out) - np.cos(s)) < 1e-12
    (g,) = torch.autograd.grad(out, v)
    assert torch.allclose(g, -np.sin(s) * torch.tensor([1.0, 1.0, -2.0], dtype=torch.float64),
                          atol=1e-12)


def test_expression_errors_name_the_angle():
    from qiskit import QuantumCircuit
    a, b, _ = params()
    qc = QuantumCircuit(1)
    qc.rx(a * 1j, 0)
    with pytest.raises(QdiffError, match=r"instruction 0 \('rx' on qubits \[0\]\).*complex"):
        from_qiskit(qc)
    qc = QuantumCircuit(1)
    qc.rx(a.log() * b, 0)
    f = qd.qnode(qd.device("statevector", wires=1))(qc)
    with pytest.raises(QdiffError, match=r"angle (b\*log\(a\)|log\(a\)\*b) is NaN or infinite"):
        f(torch.tensor([-1.0, 2.0]))
    with pytest.raises(QdiffError, match=r"parameter values have shape \(2, 3\)"):
        from_qiskit(qc).theta(torch.zeros(2, 3))


def test_qiskit_ml_gradient_on_products_uses_the_same_chain_rule():
    """Qiskit's ParamShiftEstimatorGradient (its own chain rule through expression
    coefficients) against qdiff's, on zz_feature_map + real_amplitudes with every parameter
    differentiated."""
    from qiskit.circuit.library import real_amplitudes, zz_feature_map
    from qiskit.primitives import StatevectorEstimator
    from qiskit.quantum_info import SparsePauliOp
    from qiskit_machine_learning.gradients import ParamShiftEstimatorGradient
    qc = zz_feature_map(3, reps=2).compose(real_amplitudes(3, reps=1))
    obs = SparsePauliOp.from_list([("ZIZ", 1.0), ("XXI", 0.4)])
    rng = np.random.default_rng(3)
    vals = rng.uniform(-1, 2, qc.num_parameters)
    grad = ParamShiftEstimatorGradient(StatevectorEstimator())
    ref = grad.run([qc], [obs], [vals]).result().gradients[0]
    for method in ("adjoint", "parameter-shift"):
        f = qd.qnode(qd.device("statevector", wires=3), diff_method=method, observables=obs)(qc)
        v = torch.tensor(vals, requires_grad=True)
        (g,) = torch.autograd.grad(f(v), v)
        np.testing.assert_allclose(g.numpy(), ref, atol=1e-10)


class _WrongSymbolic:
    """A Qiskit expression whose symbolic export is replaced (as Qiskit's own export sometimes
    returns a cancelling symbol in place of the surviving one: ``(b / b) * a`` as ``b``)."""

    def __init__(self, expr, symbolic):
        self._expr, self._symbolic = expr, symbolic

    def sympify(self):
        return self._symbolic

    def __getattr__(self, name):
        return getattr(self._expr, name)

    def __str__(self):
        return str(self._expr)


def test_symbolic_form_is_checked_against_qiskits_numeric_value():
    import sympy
    from qdiff.circuits import qiskit_expr
    from qiskit.circuit import ParameterVector
    a, b, _ = params()
    expr = (b / b) * a  # Qiskit prints "a"; its numeric binding is a
    good = qiskit_expr._analyse(expr, "angle")
    assert good[0] == "affine" and good[1] == a and (good[2], good[3]) == (1.0, 0.0)
    wrong = _WrongSymbolic(expr, sympy.Symbol("b"))
    out = qiskit_expr._analyse(wrong, "angle")  # the printed form is read instead
    assert out[0] == "affine" and out[1] == a and (out[2], out[3]) == (1.0, 0.0)
    x = ParameterVector("x", 2)
    prod = x[0] * x[1].sin() + 2 * x[1]
    out = qiskit_expr._analyse(_WrongSymbolic(prod, sympy.Symbol("x[0]")), "angle")
    assert out[0] == "expr" and out[2] == [x[0], x[1]]
    fn = qiskit_expr.compiled(out[1], 2, "angle")
    v = [torch.tensor(0.4, dtype=torch.float64), torch.tensor(1.3, dtype=torch.float64)]
    assert float(fn(v)) == pytest.approx(0.4 * np.sin(1.3) + 2.6, abs=1e-12)


def test_symbolic_form_that_cannot_be_confirmed_is_an_error():
    import sympy
    from qdiff.circuits import qiskit_expr
    a, b, _ = params()

    class Unprintable(_WrongSymbolic):
        def __str__(self):
            return "a +* b"
    bad = Unprintable(a * b, sympy.Symbol("a") + sympy.Symbol("b"))
    with pytest.raises(QdiffError, match=r"instruction 3: angle .*disagrees with its numeric"):
        qiskit_expr._analyse(bad, "instruction 3")


def test_constant_base_with_a_parameter_exponent():
    """``2 ** a`` (Qiskit's ``__rpow__``): Qiskit's symbolic export fails on it; the value and
    the gradient still match Qiskit's binding and finite differences."""
    from qiskit import QuantumCircuit
    a, b, _ = params()
    angles = [2 ** a, np.e ** a, 0.5 ** (2 * a), 3 ** (a * b) + b, (a + b) ** 2 * 1.5 ** b]
    qc = QuantumCircuit(2)
    qc.h(1)
    for k, angle in enumerate(angles):
        getattr(qc, ["rx", "ry", "rz"][k % 3])(angle, k % 2)
        qc.cx(0, 1)
    imp = from_qiskit(qc)
    assert imp.num_expressions == len(angles)
    values = np.array([[0.7, 0.4], [1.1, -0.3]])
    ref = qiskit_expvals(qc, values)
    for method in ("backprop", "adjoint", "parameter-shift"):
        f = qd.qnode(qd.device("statevector", wires=2), diff_method=method, observables=OBS)(qc)
        v = torch.tensor(values, requires_grad=True)
        out = f(v)
        np.testing.assert_allclose(out.detach().numpy(), ref, atol=1e-10)
        (g,) = torch.autograd.grad((out * torch.tensor([1.0, -0.7])).sum(), v)
        np.testing.assert_allclose(g.numpy(), central_difference(f, values), atol=1e-7)
