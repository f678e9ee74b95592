"""Pauli rotations and MultiRZ on many wires: kept as their Pauli word (no dense 2**k x 2**k
record), run by the engines as a basis change around a diagonal (statevector) or a CNOT ladder
(density matrices), with every differentiation method and the metric tensor as for any gate.
Oracles: PennyLane's default.qubit and closed forms."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff.circuits import Circuit
from qdiff.circuits.decompositions import lowered
from qdiff.circuits.gates import multirz_gate, paulirot_gate
from qdiff.circuits.operation import Operation

qml = pytest.importorskip("pennylane")

N = 7
_RNG = np.random.default_rng(11)
WORDS = ["".join(_RNG.choice(list("IXYZ"), N)) for _ in range(4)] + ["I" * N, "ZZYXZZZ"]


def _body(mod, t, rot, mrz):
    for i in range(N):
        mod.RY(0.3 * (i + 1), wires=i)
    for k, w in enumerate(WORDS):
        rot(t[k], w, list(range(N))[::-1] if k % 2 else list(range(N)))
    mrz(t[len(WORDS)], [6, 0, 5, 1, 4, 2, 3])


def _qd_body(t):
    _body(qd, t, lambda a, w, ws: qd.PauliRot(a, w, wires=ws),
          lambda a, ws: qd.MultiRZ(a, wires=ws))


def _pl_body(t):
    _body(qml, t, lambda a, w, ws: qml.PauliRot(a, w, wires=ws),
          lambda a, ws: qml.MultiRZ(a, wires=ws))


@pytest.fixture(scope="module")
def reference():
    t = torch.linspace(0.2, 2.9, len(WORDS) + 1, dtype=torch.float64).requires_grad_()

    @qml.qnode(qml.device("default.qubit", wires=N), interface="torch", diff_method="backprop")
    def ref(t):
        _pl_body(t)
        return qml.expval(qml.PauliX(0) @ qml.PauliY(N - 1) + 0.5 * qml.PauliZ(1))
    value = ref(t)
    (grad,) = torch.autograd.grad(value, t)
    return t.detach(), float(value), grad


@pytest.mark.parametrize("device,method,static", [
    (dev, m, s) for dev in ("statevector", "mixed")
    for m in ("backprop", "adjoint", "parameter-shift") for s in (False, True)
    if dev == "statevector" or (m != "parameter-shift" and not s)])
def test_values_and_gradients_match_default_qubit(reference, device, method, static):
    t0, value, grad = reference
    t = t0.clone().requires_grad_()

    @qd.qnode(qd.device(device, wires=N), diff_method=method, static=static)
    def circuit(t):
        _qd_body(t)
        return qd.expval(qd.X(0) @ qd.Y(N - 1) + 0.5 * qd.Z(1))
    out = circuit(t)
    (g,) = torch.autograd.grad(out, t)
    assert float(out) == pytest.approx(value, abs=1e-12)
    assert torch.allclose(g, grad, atol=1e-12)


def test_complex64_and_the_state_with_the_identity_words_phase(reference):
    t0, value, _ = reference

    @qml.qnode(qml.device("default.qubit", wires=N), interface="torch")
    def ref(t):
        _pl_body(t)
        return qml.state()

    @qd.qnode(qd.device("statevector", wires=N))
    def state(t):
        _qd_body(t)
        return qd.state()
    assert torch.allclose(state(t0), ref(t0), atol=1e-13)  # exp(-i t/2) of "IIIIIII" kept

    @qd.qnode(qd.device("statevector", wires=N, dtype=torch.complex64), diff_method="adjoint")
    def c64(t):
        _qd_body(t)
        return qd.expval(qd.X(0) @ qd.Y(N - 1) + 0.5 * qd.Z(1))
    assert float(c64(t0)) == pytest.approx(value, abs=1e-5)


def test_metric_tensor_matches_pennylane(reference):
    t0, _, _ = reference
    t = t0.clone().requires_grad_()

    @qml.qnode(qml.device("default.qubit", wires=N), interface="torch")
    def ref(t):
        _pl_body(t)
        return qml.expval(qml.PauliZ(0))

    @qd.qnode(qd.device("statevector", wires=N))
    def circuit(t):
        _qd_body(t)
        return qd.expval(qd.Z(0))
    got = qd.metric_tensor(circuit)(t)
    want = qml.metric_tensor(ref, approx="block-diag")(t0.clone().requires_grad_())
    assert torch.allclose(got, want, atol=1e-12)


def test_pennylane_device_runs_wide_rotations(reference):
    t0, value, grad = reference
    t = t0.clone().requires_grad_()

    @qml.qnode(qml.device("qdiff.statevector", wires=N), interface="torch",
               diff_method="adjoint")
    def circuit(t):
        _pl_body(t)
        return qml.expval(qml.PauliX(0) @ qml.PauliY(N - 1) + 0.5 * qml.PauliZ(1))
    out = circuit(t)
    (g,) = torch.autograd.grad(out, t)
    assert float(out) == pytest.approx(value, abs=1e-12)
    assert torch.allclose(g, grad, atol=1e-12)


def test_twenty_wire_rotations_closed_forms():
    """exp(-i a P / 2)|0..0> = cos(a/2)|0..0> - i sin(a/2) P|0..0>, P|0..0> = i**10 |1..1>
    for P = (XY)^5 on 20 wires; MultiRZ(a) on |+>^20 gives <X_0> = cos(a)."""
    n = 20
    a = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)

    @qd.qnode(qd.device("statevector", wires=n), diff_method="adjoint")
    def rot(a):
        qd.PauliRot(a, "XY" * 10, wires=range(n))
        return qd.expval(qd.Z(0))
    out = rot(a)
    (g,) = torch.autograd.grad(out, a)
    assert float(out) == pytest.approx(math.cos(0.7), abs=1e-12)
    assert float(g) == pytest.approx(-math.sin(0.7), abs=1e-12)

    @qd.qnode(qd.device("statevector", wires=n))
    def state(a):
        qd.PauliRot(a, "XY" * 10, wires=range(n))
        return qd.state()
    psi = state(a.detach())
    assert complex(psi[0]) == pytest.approx(math.cos(0.35), abs=1e-12)
    assert complex(psi[-1]) == pytest.approx(1j * math.sin(0.35), abs=1e-12)

    @qd.qnode(qd.device("statevector", wires=n), diff_method="adjoint")
    def mrz(a):
        for w in range(n):
            qd.H(w)
        qd.MultiRZ(a, wires=range(n))
        return qd.expval(qd.X(0))
    out = mrz(a)
    (g,) = torch.autograd.grad(out, a)
    assert float(out) == pytest.approx(math.cos(0.7), abs=1e-12)
    assert float(g) == pytest.approx(-math.sin(0.7), abs=1e-12)


def test_narrow_rotations_run_as_recorded():
    c = Circuit(4, (Operation(paulirot_gate("XYZX"), (0, 1, 2, 3), (0.3,)),
                    Operation(multirz_gate(4), (0, 1, 2, 3), (0.3,))))
    assert lowered(c, "statevector") is c and lowered(c, "mixed") is c
    wide = Circuit(7, (Operation(paulirot_gate("XYZXIZY"), tuple(range(7)), (0.3,)),))
    names = [op.name for op in lowered(wide, "statevector").operations]
    assert names == ["h", "sx", "h", "sx", "multirz", "h", "sxdg", "h", "sxdg"]
    assert all(len(op.wires) <= 2 for op in lowered(wide, "mixed").operations)


def _state_of(n, gates):
    @qd.qnode(qd.device("statevector", wires=n))
    def f():
        for i in range(n):
            qd.RY(0.2 * (i + 1), wires=i)
        gates()
        return qd.state()
    recorded, _ = f.construct()
    return f().numpy(), recorded


def _qiskit_state(qc, n):
    from qiskit.quantum_info import Statevector
    return Statevector(qc).data.reshape([2] * n).transpose(list(range(n))[::-1]).reshape(-1)


@pytest.mark.parametrize("gates", [
    lambda: qd.PauliRot(0.9, "IIIII", wires=range(5)),
    lambda: qd.ctrl(qd.PauliRot, control=0)(0.9, "II", wires=[1, 2]),
    lambda: qd.ctrl(qd.PauliRot, control=4)(0.9, "IIII", wires=[3, 2, 1, 0])])
def test_identity_words_keep_their_phase_in_decompositions_and_qiskit(gates):
    pytest.importorskip("qiskit")
    from qdiff.circuits.decompositions import decompose
    from qdiff.circuits.qiskit_io import to_qiskit
    psi, recorded = _state_of(5, gates)
    assert np.allclose(_qiskit_state(to_qiskit(recorded.circuit, recorded.theta), 5), psi,
                       atol=1e-12)
    word = Operation(paulirot_gate("III"), (0, 1, 2), (0.9,))
    assert [(o.name, float(o.params[0])) for o in decompose(word)] == [("globalphase", 0.45)]


@pytest.mark.parametrize("gates", [
    lambda: qd.PauliRot(0.4, "XIYZZIXYZ", wires=[8, 0, 7, 1, 6, 2, 5, 3, 4]),
    lambda: qd.MultiRZ(0.4, wires=range(9)),
    lambda: qd.PauliRot(0.4, "I" * 9, wires=range(9)),
    lambda: qd.ctrl(qd.PauliRot, control=0)(0.3, "XYZZXIIZ", wires=range(1, 9))])
def test_compiler_verifies_and_keeps_wide_rotations_exact(gates):
    pytest.importorskip("qiskit")
    from qdiff.circuits.qiskit_io import to_qiskit
    psi, recorded = _state_of(9, gates)
    out, report = qd.compile(recorded.circuit)  # exact up to a global phase
    overlap = _qiskit_state(to_qiskit(out, recorded.theta), 9) @ psi.conj()
    assert abs(abs(overlap) - 1) < 1e-10
