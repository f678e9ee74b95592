"""Bad input to the differentiation core: each a clear QdiffError; the adjoint sweep restores
the input state."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff.backends.statevector.adjoint import adjoint_vjp
from qdiff.backends.base import Capabilities
from qdiff.backends.statevector import StatevectorBackend
from qdiff.circuits.gates import Gate
from qdiff.bridge import unshare


class NoBackpropBackend(StatevectorBackend):
    """A backend that, like hardware, exposes neither autograd nor states."""

    name = "opaque"
    capabilities = Capabilities(backprop=False, vjp=False, shots=True, exact=True)


def _f(x):
    qd.RX(x, wires=0)
    return qd.expval(qd.Z(0))


def test_backprop_on_a_non_torch_backend():
    q = qd.QNode(_f, NoBackpropBackend(wires=1), diff_method="backprop")
    with pytest.raises(qd.QdiffError, match="backprop"):
        q(torch.tensor(0.1, requires_grad=True))


def test_adjoint_on_a_backend_without_states():
    q = qd.QNode(_f, NoBackpropBackend(wires=1), diff_method="adjoint")
    with pytest.raises(qd.QdiffError, match="adjoint"):
        q(torch.tensor(0.1, requires_grad=True))


def test_best_on_a_non_torch_backend_is_parameter_shift():
    q = qd.QNode(_f, NoBackpropBackend(wires=1))
    x = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(q(x), x)
    assert torch.allclose(g, -torch.sin(x.detach()))


@pytest.mark.parametrize("method", ["adjoint", "backprop"])
def test_shots_with_exact_only_methods(method):
    q = qd.QNode(_f, qd.device("statevector", wires=1, shots=100), diff_method=method)
    with pytest.raises(qd.QdiffError, match="shots"):
        q(torch.tensor(0.1, requires_grad=True))


def test_unknown_diff_method():
    with pytest.raises(qd.QdiffError, match="unknown diff_method"):
        qd.QNode(_f, qd.device("statevector", wires=1), diff_method="magic")


@pytest.mark.parametrize("method,key", [("finite-diff", "h"), ("spsa", "epsilon")])
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_step_options_must_be_finite(method, key, value):
    """An infinite step would turn every gradient into NaN: refused when the qnode is made."""
    with pytest.raises(qd.QdiffError, match=f"{key} must be a positive finite number"):
        qd.QNode(_f, qd.device("statevector", wires=1), diff_method=method, **{key: value})


_HALF_PI_RULE = ((0.5, 1.5707963267948966), (-0.5, -1.5707963267948966))


@pytest.mark.parametrize("fields,match", [
    (dict(shift_rules=(_HALF_PI_RULE,)), "shift_rules has 1 entry for 3 parameter"),
    (dict(generators=(np.diag([0.5, -0.5]),)), "generators has 1 entry for 3 parameter"),
    (dict(shift_rules=_HALF_PI_RULE + ((1.0, 2.0),)), "shift rule of parameter 0 must be"),
    (dict(shift_rules=(_HALF_PI_RULE, ((1.0, float("nan")),), _HALF_PI_RULE)),
     "shift rule of parameter 1 must be")])
def test_malformed_gate_records_are_refused(fields, match):
    """generators / shift_rules with the wrong number of entries or malformed pairs: refused
    by name when registered, and when an unregistered record is differentiated."""
    from qdiff.circuits.gates import GATES, register_gate
    gate = Gate("my_rot", 1, 3, GATES["rot"].matrix_fn, pl_name="MyRot", **fields)
    with pytest.raises(qd.QdiffError, match=match):
        register_gate(gate)
    assert "my_rot" not in GATES
    q = qd.QNode(lambda x: (gate(x[0], x[1], x[2], wires=0), qd.expval(qd.Z(0)))[-1],
                 qd.device("statevector", wires=1), diff_method="parameter-shift")
    with pytest.raises(qd.QdiffError, match=match):
        q(torch.tensor([0.3, 0.5, 0.7], dtype=torch.float64, requires_grad=True))


def test_a_shift_rule_per_parameter_may_be_none():
    """A None entry of shift_rules falls back to the generator; with neither, that parameter
    is refused by parameter-shift by name."""
    from qdiff.circuits.gates import GATES
    rot = GATES["rot"]
    gate = Gate("my_rot2", 1, 3, rot.matrix_fn, generators=rot.generators, pl_name="MyRot2",
                shift_rules=(_HALF_PI_RULE, None, _HALF_PI_RULE))
    f = lambda g: (lambda x: (g(x[0], x[1], x[2], wires=0), qd.expval(qd.Z(0) + qd.X(0)))[-1])
    dev = qd.device("statevector", wires=1)
    x = torch.tensor([0.3, 0.5, 0.7], dtype=torch.float64, requires_grad=True)
    (ps,) = torch.autograd.grad(qd.QNode(f(gate), dev, diff_method="parameter-shift")(x), x)
    (bp,) = torch.autograd.grad(qd.QNode(f(rot), dev, diff_method="backprop")(x), x)
    assert torch.allclose(ps, bp, atol=1e-12)
    bare = Gate("my_rot3", 1, 3, rot.matrix_fn, pl_name="MyRot3",
                shift_rules=(_HALF_PI_RULE, None, _HALF_PI_RULE))
    with pytest.raises(qd.QdiffError, match="'MyRot3' has no generator or shift rule for "
                                            "parameter 1"):
        qd.QNode(f(bare), dev, diff_method="parameter-shift")(x)


def test_best_with_shots_takes_finite_differences_for_a_parameter_without_a_rule():
    """A gate with a generator for one parameter only: on a device with shots, best takes
    finite differences (as for a channel's parameter) instead of refusing."""
    from qdiff.circuits.gates import GATES
    rot = GATES["rot"]
    gate = Gate("my_rot4", 1, 3, rot.matrix_fn, pl_name="MyRot4",
                generators=(rot.generators[0], None, rot.generators[2]))
    f = lambda g: (lambda x: (g(x[0], x[1], x[2], wires=0), qd.expval(qd.Z(0) + qd.X(0)))[-1])
    x = torch.tensor([0.3, 0.5, 0.7], dtype=torch.float64, requires_grad=True)
    dev = qd.device("statevector", wires=1, shots=200000, seed=2)
    (g,) = torch.autograd.grad(qd.QNode(f(gate), dev)(x), x)
    (bp,) = torch.autograd.grad(qd.QNode(f(rot), qd.device("statevector", wires=1),
                                         diff_method="backprop")(x), x)
    assert torch.allclose(g, bp, atol=0.1)


def test_gate_without_generator_in_a_parameter_shift_circuit():
    noshift = Gate("noshift_rx", 1, 1, qd.RX.matrix_fn, pl_name="NoShiftRX",
                   inverse_fn=lambda p: (noshift, (-p[0],)))

    def f(x):
        noshift(x, wires=0)
        return qd.expval(qd.Z(0))
    q = qd.QNode(f, qd.device("statevector", wires=1), diff_method="parameter-shift")
    with pytest.raises(qd.QdiffError, match="NoShiftRX.*no generator"):
        q(torch.tensor(0.2, requires_grad=True))
    # the same gate is fine when its parameter is not trainable, and under adjoint
    assert q(torch.tensor(0.2)).shape == ()
    qa = qd.QNode(f, qd.device("statevector", wires=1), diff_method="adjoint")
    x = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(qa(x), x)
    assert torch.allclose(g, -torch.sin(x.detach()))


@pytest.mark.parametrize("method", ["adjoint", "parameter-shift"])
def test_non_differentiable_outputs(method):
    def f(x):
        qd.RX(x, wires=0)
        return qd.state()
    q = qd.QNode(f, qd.device("statevector", wires=1), diff_method=method)
    with pytest.raises(qd.QdiffError, match="state"):
        q(torch.tensor(0.2, requires_grad=True))


def test_amplitude_embedding_gradient_needs_backprop():
    def f(v):
        qd.AmplitudeEmbedding(v, wires=[0, 1], normalize=True)
        return qd.expval(qd.Z(0))
    v = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64, requires_grad=True)
    q = qd.QNode(f, qd.device("statevector", wires=2), diff_method="parameter-shift")
    with pytest.raises(qd.QdiffError, match="backprop"):
        q(v)
    qb = qd.QNode(f, qd.device("statevector", wires=2), diff_method="backprop")
    (g,) = torch.autograd.grad(qb(v), v)
    assert g.shape == v.shape


def test_adjoint_reverse_sweep_restores_the_input_state():
    dev = qd.device("statevector", wires=4)

    def f(x, w):
        qd.AngleEmbedding(x, wires=range(4))
        qd.StronglyEntanglingLayers(w, wires=range(4))
        qd.DoubleExcitation(x[..., 0], wires=[0, 1, 2, 3])
        qd.MultiRZ(x[..., 1], wires=[0, 2, 3])
        return [qd.expval(qd.Z(0)), qd.probs([1, 3])]
    x = torch.rand(3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.rand(2, 4, 3, dtype=torch.float64, requires_grad=True)
    rec, _ = qd.QNode(f, dev).construct(x, w)
    circ, theta, trainable, _ = unshare(rec.circuit, rec.theta.detach(), rec.trainable)
    state = dev.final_state(circ, theta)
    g = torch.rand(3, 1 + 4, dtype=torch.float64)
    _, restored = adjoint_vjp(circ, theta, state, g, trainable, return_state=True)
    zero = torch.zeros_like(restored)
    zero[:, 0] = 1
    assert torch.allclose(restored, zero, atol=1e-12)
