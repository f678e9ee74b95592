"""qdiff <-> PennyLane: every gate gives the same state as qdiff's simulator, round trips keep
results, PennyLane templates import, observables convert both ways (matrices compared)."""
from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
import torch

import qdiff as qd
from conftest import close_up_to_phase
from qdiff import QdiffError
from qdiff.circuits.circuit import Circuit
from qdiff.circuits.gates import GATES, multirz_gate, paulirot_gate, unitary_gate
from qdiff.circuits.measurements import Measurement
from qdiff.circuits.operation import Operation, ParamRef
from qdiff.circuits.pennylane_io import (from_pennylane, from_pennylane_observable, to_pennylane,
                                         to_pennylane_observable)

PL_DEV = qml.device("default.qubit", wires=4)


def _gate_cases():
    gates = [g for name, g in sorted(GATES.items()) if name != "unitary"]
    gates += [multirz_gate(3), paulirot_gate("XYZ"), unitary_gate(np.linalg.qr(
        np.random.default_rng(1).normal(size=(4, 4)) + 1j)[0])]
    return gates


@pytest.mark.parametrize("gate", _gate_cases(), ids=lambda g: f"{g.name}{g.hyper[:1] if g.name != 'unitary' else ''}")
def test_every_gate_gives_the_same_state(gate):
    """Prepare a generic state, apply the gate with batched angles, compare final states."""
    n = 4
    prep = [Operation(GATES["ry"], (w,), (0.3 + 0.4 * w,)) for w in range(n)] + [
        Operation(GATES["cx"], (0, 1)), Operation(GATES["rx"], (2,), (0.9,))]
    wires = tuple(range(gate.num_wires))[::-1]  # reversed wires catch ordering mistakes
    op = Operation(gate, wires, tuple(ParamRef(j) for j in range(gate.num_params)))
    c = Circuit(n, tuple(prep) + (op,), (Measurement("state"),), gate.num_params)
    theta = torch.tensor([[0.37 + 0.5 * j + 0.9 * b for j in range(gate.num_params)]
                          for b in range(2)], dtype=torch.float64)
    ref = qd.device("statevector", wires=n).run(c, theta)[0]
    got = qml.execute([to_pennylane(c, theta)], PL_DEV)[0]
    got = np.broadcast_to(np.asarray(got).reshape(-1, 2 ** n), ref.shape)  # constant gates: unbatched
    for a, b in zip(got, ref.numpy()):
        assert close_up_to_phase(a, b, atol=1e-10)


def _mixed(x, w):
    qd.Hadamard(0)
    qd.RX(x, wires=0)
    qd.CRY(w[0], wires=[0, "b"])
    qd.Rot(w[1], x, 0.3, wires=2)
    qd.DoubleExcitation(w[0], wires=[0, "b", 2, 3])
    qd.PauliRot(x * 0.5, "YX", wires=["b", 3])
    return [qd.expval(qd.Z(0) @ qd.X("b") + 0.2 * qd.Y(3)), qd.var(qd.X(2)), qd.probs(wires=[3, 0])]


def test_round_trip_keeps_results_and_wire_labels():
    from qdiff.qnode import record_circuit
    x = torch.tensor([0.2, -0.7], dtype=torch.float64)
    w = torch.tensor([0.5, 1.3], dtype=torch.float64)
    rec = record_circuit(_mixed, [0, "b", 2, 3], x, w)
    tape = to_pennylane(rec.circuit, rec.theta)
    assert list(tape.wires) == [0, "b", 2, 3] and tape.batch_size == 2
    pl_res = qml.execute([tape], qml.device("default.qubit", wires=[0, "b", 2, 3]))[0]
    back = from_pennylane(tape)
    assert back.circuit.num_params == sum(len(op.data) for op in tape.operations)
    sv = qd.device("statevector", wires=[0, "b", 2, 3])
    ours = sv.run(rec.circuit, rec.theta)
    again = sv.run(back.circuit, back.theta)
    for a, b, p in zip(ours, again, pl_res):
        assert torch.allclose(a, b, atol=1e-10) and np.allclose(a.numpy(), np.asarray(p), atol=1e-10)


def test_pennylane_templates_import():
    """A tape made with PennyLane's own templates (BasisState, StatePrep, embeddings, layers)."""
    rng = np.random.default_rng(4)
    weights = rng.normal(size=(2, 3, 3))
    amp = rng.normal(size=8)
    amp /= np.linalg.norm(amp)
    for prep in (qml.StatePrep(amp, wires=[0, 1, 2]), qml.BasisState(np.array([1, 0, 1]), [0, 1, 2])):
        ops = [prep, qml.AngleEmbedding(np.array([[0.1, 0.2, 0.3], [0.5, -0.4, 1.1]]),
                                       wires=[0, 1, 2]),
               qml.StronglyEntanglingLayers(weights, wires=[0, 1, 2]), qml.adjoint(qml.T(1))]
        meas = [qml.expval(qml.Z(0) @ qml.Z(2)), qml.probs(wires=[1])]
        tape = qml.tape.QuantumScript(ops, meas)
        ref = qml.execute([tape], qml.device("default.qubit", wires=3))[0]
        rec = from_pennylane(tape)
        assert rec.batch_shape == (2,)
        got = qd.device("statevector", wires=3).run(rec.circuit, rec.theta, rec.initial_state)
        for a, b in zip(got, ref):
            assert np.allclose(a.numpy(), np.asarray(b), atol=1e-10)


def _check_same_matrix(pl_op, ours, wires):
    assert np.allclose(qml.matrix(pl_op, wire_order=wires), ours.matrix(wires).numpy(), atol=1e-12)


def test_observables_both_ways():
    herm = np.array([[1.0, 0.5 - 0.2j], [0.5 + 0.2j, -1.0]])
    cases = [
        qml.Hamiltonian([0.5, -0.2, 0.1], [qml.Z(0) @ qml.Z(1), qml.X(1), qml.Identity(0)]),
        qml.sum(qml.X(0), qml.s_prod(0.3, qml.prod(qml.Y(0), qml.Z(1)))),
        qml.prod(qml.Hermitian(herm, wires=1), qml.X(0)),
        qml.s_prod(-2.0, qml.Hermitian(herm, wires=0)),
        qml.Hadamard(1),
        qml.Z(1),
    ]
    for op in cases:
        ours = from_pennylane_observable(op)
        _check_same_matrix(op, ours, [0, 1])
        back = to_pennylane_observable(ours)
        assert np.allclose(qml.matrix(back, wire_order=[0, 1]), qml.matrix(op, wire_order=[0, 1]),
                           atol=1e-12)



def test_to_pennylane_observable_keeps_complex_coefficients_and_takes_gates():
    """A product of Paulis on one wire carries a phase (X Y = i Z): it is exported with it,
    not as its real part; a gate used as an observable converts too."""
    for ours in (qd.X(0) @ qd.Y(0), 0.5 * qd.X(0) @ qd.Y(0) + qd.Z(1), -1j * (qd.X(0) @ qd.Y(0))):
        back = to_pennylane_observable(ours)
        assert np.allclose(qml.matrix(back, wire_order=[0, 1]),
                           ours.matrix(wire_order=[0, 1]).numpy(), atol=1e-14)
    back = to_pennylane_observable(qd.Hadamard(1))
    assert np.allclose(qml.matrix(back, wire_order=[1]), qml.matrix(qml.Hadamard(1)), atol=1e-14)


def test_a_matrix_observable_is_checked_against_memory_before_its_dense_matrix(monkeypatch):
    import scipy.sparse as sp
    sparse = qml.SparseHamiltonian(sp.diags(np.arange(2.0 ** 9)).tocsr(), wires=range(9))
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "1M")
    with pytest.raises(qd.QdiffMemoryError, match="9-qubit matrix of PennyLane's Sparse"):
        from_pennylane_observable(sparse)
    monkeypatch.delenv("QDIFF_MEMORY_LIMIT")
    small = from_pennylane_observable(qml.SparseHamiltonian(sp.diags(np.arange(4.0)).tocsr(),
                                                            wires=[1, 0]))
    assert np.allclose(small.matrix(wire_order=[1, 0]).numpy(), np.diag(np.arange(4.0)))

def test_qchem_h2_hamiltonian_converts():
    coords = np.array([0.0, 0.0, -0.3675, 0.0, 0.0, 0.3675])
    H, n = qml.qchem.molecular_hamiltonian(["H", "H"], coords, unit="angstrom")
    ours = from_pennylane_observable(H)
    assert n == 4
    _check_same_matrix(H, ours, list(range(4)))
    e0 = float(torch.linalg.eigvalsh(ours.matrix(list(range(4))))[0])
    assert abs(e0 - (-1.1373)) < 1e-3  # FCI energy of H2 at 0.735 A in STO-3G (Hartree)


def test_errors():
    c = Circuit(1, (Operation(GATES["rx"], (0,), (ParamRef(0),)),), (), 1)
    with pytest.raises(QdiffError, match="pass theta"):
        to_pennylane(c)
    with pytest.raises(QdiffError, match=r"theta must have shape \(B, 1\)"):
        to_pennylane(c, torch.zeros(2, 3))
    with pytest.raises(QdiffError, match="probs\\(op=...\\) is not supported"):
        from_pennylane(qml.tape.QuantumScript([], [qml.probs(op=qml.X(0))]))
    with pytest.raises(QdiffError, match="is not supported"):
        from_pennylane(qml.tape.QuantumScript([qml.RX(0.1, 0)], [qml.vn_entropy(wires=[0])]))
    with pytest.raises(QdiffError, match="not real"):
        from_pennylane_observable(qml.s_prod(1j, qml.Z(0)))
