"""One conformance suite over every backend: the same circuits give the same expectations and
the same parameter-shift gradients as the torch statevector simulator (the reference, run with
backprop).

Tolerances:
* exact backends (Aer statevector/density matrix, PennyLane default.qubit/lightning.qubit):
  1e-10 for values, 1e-9 for gradients;
* shot backends: 5 standard errors, bounded from the exact reference values
  (``sum_t |c_t| sqrt(1 - <P_t>^2) / sqrt(shots)`` for a Pauli sum, propagated through the
  shift rule for gradients);
* noisy fake IBM device (fake_manila, TREX readout mitigation, 4000 shots): within
  ``NOISY_ATOL`` = 0.15 of the ideal value, ``NOISY_GRAD_ATOL`` = 0.3 for gradients.
"""
from __future__ import annotations

import math

import pytest
import torch

import qdiff as qd
from qdiff.circuits.observables import as_observable

SHOTS = 20000
NOISY_SHOTS = 4000
NOISY_ATOL = 0.15
NOISY_GRAD_ATOL = 0.3

BACKENDS = {
    "aer": dict(kind="exact", make=lambda n: qd.device("aer", wires=n)),
    "aer-density": dict(kind="exact", make=lambda n: qd.device("aer", wires=n,
                                                              method="density_matrix")),
    "pl-default": dict(kind="exact", make=lambda n: qd.device("pennylane", name="default.qubit",
                                                             wires=n)),
    "pl-lightning": dict(kind="exact", make=lambda n: qd.device(
        "pennylane", name="lightning.qubit", wires=n)),
    "aer-shots": dict(kind="shots", make=lambda n: qd.device("aer", wires=n, shots=SHOTS,
                                                            seed=17)),
    "pl-shots": dict(kind="shots", make=lambda n: qd.device(
        "pennylane", name="default.qubit", wires=n, shots=SHOTS, seed=17)),
    "sv-shots": dict(kind="shots", make=lambda n: qd.device("statevector", wires=n,
                                                           shots=SHOTS, seed=17)),
    "ibm-fake_manila": dict(kind="noisy", make=lambda n: qd.device(
        "ibm", backend="fake_manila", wires=n, shots=NOISY_SHOTS, seed=17)),
}

OBS = [lambda: qd.Z(0) @ qd.Z(1) + 0.5 * qd.X(2), lambda: qd.Y(1), lambda: qd.X(0) @ qd.Y(2)]


def hardware_efficient(x, w):
    qd.RY(x, wires=0)
    qd.RY(w[0], wires=1)
    qd.RX(w[1], wires=2)
    qd.CNOT([0, 1])
    qd.CNOT([1, 2])
    qd.RZ(w[2], wires=0)
    qd.RY(w[0], wires=2)  # w[0] used twice


def chemistry_like(x, w):
    qd.PauliX(0)
    qd.Hadamard(2)
    qd.SingleExcitation(w[0], wires=[0, 1])
    qd.CRX(w[1], wires=[1, 2])
    qd.IsingZZ(x, wires=[0, 2])
    qd.PauliRot(w[2], "XY", wires=[2, 0])


CIRCUITS = {"hea": hardware_efficient, "chem": chemistry_like}
X = torch.tensor([0.3, -1.2], dtype=torch.float64)
W = torch.tensor([0.8, -0.4, 1.3], dtype=torch.float64)


def _expvals(body):
    def f(x, w):
        body(x, w)
        return [qd.expval(o()) for o in OBS]
    return f


def _reference(body):
    sv = qd.device("statevector", wires=3)
    return qd.qnode(sv, diff_method="backprop")(_expvals(body))


def _pauli_sigma(body, x, w) -> torch.Tensor:
    """Per-output bound on one shot's standard deviation (sum_t |c_t| sqrt(1 - <P_t>^2))."""
    sv = qd.device("statevector", wires=3)
    out = []
    for o in OBS:
        obs = as_observable(o())
        terms = []
        for c, t in zip(obs.real_coeffs().tolist(), obs.terms):
            words = [f for f in t]

            def one(xx, ww, words=words):
                body(xx, ww)
                p = qd.Observable([1.0], [tuple(words)]) if words else None
                return qd.expval(p) if p is not None else qd.expval(qd.Identity(0))
            mean = qd.qnode(sv)(one)(x, w)
            terms.append(abs(c) * (1 - mean ** 2).clamp_min(0).sqrt())
        out.append(torch.stack(terms).sum(0))
    return torch.stack(out, dim=-1)


@pytest.fixture(params=list(BACKENDS))
def backend(request):
    return request.param


@pytest.mark.parametrize("circ", list(CIRCUITS))
def test_expectations_agree(backend, circ):
    spec, body = BACKENDS[backend], CIRCUITS[circ]
    dev = spec["make"](3)
    got = qd.qnode(dev)(_expvals(body))(X, W)
    ref = _reference(body)(X, W)
    assert got.shape == ref.shape == (2, len(OBS))
    if spec["kind"] == "exact":
        assert torch.allclose(got, ref, atol=1e-10, rtol=0)
    elif spec["kind"] == "shots":
        tol = 5 * _pauli_sigma(body, X, W) / math.sqrt(SHOTS) + 1e-9
        assert ((got - ref).abs() <= tol).all(), (got - ref) / tol
    else:
        assert (got - ref).abs().max() < NOISY_ATOL
    if hasattr(dev, "jobs_submitted"):
        assert dev.jobs_submitted == 1


def _shift_uses(circ: str) -> torch.Tensor:
    """How many gate angles each of x, w[0], w[1], w[2] feeds (for the shot-noise bound)."""
    return torch.tensor([1, 2, 1, 1] if circ == "hea" else [1, 1, 1, 1], dtype=torch.float64)


@pytest.mark.parametrize("circ", list(CIRCUITS))
def test_parameter_shift_gradients_agree(backend, circ):
    spec, body = BACKENDS[backend], CIRCUITS[circ]
    dev = spec["make"](3)
    weights = torch.tensor([1.0, -0.7, 0.4], dtype=torch.float64)  # mixes the outputs

    def loss(qn):
        x, w = X.clone().requires_grad_(), W.clone().requires_grad_()
        val = (qn(x, w) * weights).sum()
        gx, gw = torch.autograd.grad(val, [x, w])
        return torch.cat([gx, gw])
    got = loss(qd.qnode(dev, diff_method="parameter-shift")(_expvals(body)))
    ref = loss(_reference(body))
    if spec["kind"] == "exact":
        assert torch.allclose(got, ref, atol=1e-9, rtol=0)
    elif spec["kind"] == "shots":
        # A gradient entry sums shift-rule terms over the bindings and angle uses of its
        # parameter: independent estimates, each with sd <= sum_k |weights_k| sum_t |c_kt|
        # / sqrt(shots), and sqrt(sum r_i^2) <= 0.71 for the two- and four-term rules used.
        sd_one = sum(abs(float(c)) * float(as_observable(o()).real_coeffs().abs().sum())
                     for c, o in zip(weights, OBS)) / math.sqrt(SHOTS)
        count = torch.cat([torch.ones(X.numel()), X.numel() * _shift_uses(circ)[1:]])
        tol = 5 * 0.71 * count.sqrt() * sd_one + 1e-9
        assert ((got - ref).abs() <= tol).all(), (got - ref) / tol
    else:
        assert (got - ref).abs().max() < NOISY_GRAD_ATOL
    if hasattr(dev, "jobs_submitted"):
        assert dev.jobs_submitted == 2  # forward + one job for every shift of the batch


@pytest.mark.parametrize("name", ["aer", "pl-default", "pl-lightning", "aer-shots", "pl-shots"])
def test_probs_and_var_agree(name):
    spec = BACKENDS[name]

    def f(x, w):
        hardware_efficient(x, w)
        return [qd.probs(wires=[2, 0]), qd.var(qd.Z(0) @ qd.Z(1) + 0.5 * qd.X(2))]
    p, v = qd.qnode(spec["make"](3))(f)(X, W)
    pr, vr = qd.qnode(qd.device("statevector", wires=3))(f)(X, W)
    if spec["kind"] == "exact":
        assert torch.allclose(p, pr, atol=1e-10, rtol=0) and torch.allclose(v, vr, atol=1e-10)
    else:
        assert ((p - pr).abs() <= 5 * (pr * (1 - pr) / SHOTS).sqrt() + 1e-9).all()
        # var of a sum with sum|c| = 1.5: sd of the estimate <= (1.5^2 + 2 * 1.5 * |<O>|)/sqrt(N)
        mean = qd.qnode(qd.device("statevector", wires=3))(_expvals(hardware_efficient))(X, W)[:, 0]
        assert ((v - vr).abs() <= 5 * (2.25 + 3 * mean.abs()) / math.sqrt(SHOTS)).all()
