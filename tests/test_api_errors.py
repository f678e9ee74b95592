"""API misuse that used to raise TypeError/RuntimeError/QiskitError, or nothing, and gave
wrong results: each is now a QdiffError naming the fault."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff.circuits.errors import QdiffError


def run(n, body, **dev_kw):
    return qd.qnode(qd.device("statevector", wires=n, **dev_kw))(body)()


@pytest.mark.parametrize("make", [lambda: qd.probs(wires=[0, 0]),
                                  lambda: qd.sample(wires=[1, 1]),
                                  lambda: qd.counts(wires=(0, 1, 0))])
def test_repeated_measurement_wires(make):
    """``qd.probs(wires=[0, 0])`` was a torch TypeError from reshape."""
    def body():
        qd.H(0)
        return make()
    with pytest.raises(QdiffError, match=r"(probs|sample|counts): repeated wire in \["):
        run(2, body, shots=10)


@pytest.mark.parametrize("make", [lambda: qd.probs(wires=[[0, 1]]),
                                  lambda: qd.sample(wires=[0, [1]]),
                                  lambda: qd.density_matrix(wires=[{0}])])
def test_measurement_wires_that_are_not_labels(make):
    def body():
        qd.H(0)
        return make()
    with pytest.raises(QdiffError, match=r"(probs|sample|density_matrix): wire .* is not a "
                                         r"wire label"):
        run(2, body, shots=10)


@pytest.mark.parametrize("bad", ["ab", [["a", "b"], ["c", "d"]], object()])
def test_hermitian_of_something_that_is_not_a_matrix_of_numbers(bad):
    with pytest.raises(QdiffError, match="Hermitian: the matrix must be a square array of "
                                         "numbers"):
        qd.Hermitian(bad, wires=[0])


def test_hermitian_on_repeated_wires():
    """Accepted before, and expectations returned a meaningless number."""
    with pytest.raises(QdiffError, match=r"Hermitian: repeated wire in \[0, 0\]"):
        qd.Hermitian(np.diag([1.0, 2.0, 3.0, 4.0]), wires=[0, 0])


def test_compile_quantum_circuit_with_nan_angle():
    """Was QiskitError 'OneQubitEulerDecomposer: input matrix is not unitary.'"""
    from qiskit import QuantumCircuit
    qc = QuantumCircuit(1)
    qc.rz(float("nan"), 0)
    with pytest.raises(QdiffError, match=r"instruction 0 \('rz' on qubits \[0\]\): angle nan is NaN"):
        qd.compile(qc)


@pytest.mark.parametrize("kw,pattern", [({"wires": 1, "shots": True}, "shots must be a positive"),
                                        ({"wires": True}, "wires must be an int")])
def test_bool_shots_and_wires(kw, pattern):
    """``shots=True`` meant 1 shot and ``wires=True`` one wire."""
    with pytest.raises(QdiffError, match=pattern):
        qd.device("statevector", **kw)


@pytest.mark.parametrize("angle", ["0.3", b"0.3", True, np.bool_(True), torch.tensor(True),
                                   np.array([True, False])])
def test_string_and_bool_angles(angle):
    """The string "0.3" was silently converted to 0.3 rad."""
    def body():
        qd.RX(angle, wires=0)
        return qd.expval(qd.Z(0))
    with pytest.raises(QdiffError, match=r"'RX': angle must be a real number or tensor, got"):
        run(1, body)


@pytest.mark.parametrize("name,make", [
    ("AngleEmbedding", lambda: qd.AngleEmbedding(["0.3", "0.4"], wires=[0, 1])),
    ("BasicEntanglerLayers", lambda: qd.BasicEntanglerLayers([["0.3", "0.4"]], wires=[0, 1])),
    ("StronglyEntanglingLayers",
     lambda: qd.StronglyEntanglingLayers(np.full((1, 2, 3), "0.3"), wires=[0, 1])),
    ("StatePrep", lambda: qd.StatePrep(["1", "0", "0", "0"], wires=[0, 1])),
    ("AmplitudeEmbedding", lambda: qd.AmplitudeEmbedding(np.array([b"1", b"0"]), wires=0)),
    ("IQPEmbedding", lambda: qd.IQPEmbedding(["0.3", "0.4"], wires=[0, 1])),
])
def test_templates_refuse_strings_as_numbers(name, make):
    """Template features and weights given as strings ("0.3") are refused, never parsed."""
    def body():
        make()
        return qd.expval(qd.Z(0))
    with pytest.raises(QdiffError, match=rf"{name}: expected numbers or a tensor; got"):
        run(2, body)


@pytest.mark.parametrize("angle", [np.complex128(0.3 + 0.1j), np.array(0.3 + 0.1j),
                                   np.array([0.3 + 0.1j, 0.2]), np.clongdouble(0.3 + 1j)])
def test_complex_numpy_angles_are_refused(angle):
    """A complex numpy angle is refused as a complex Python number or tensor is, not cut to its
    real part."""
    def body():
        qd.RX(angle, wires=0)
        return qd.expval(qd.Z(0))
    with pytest.raises(QdiffError, match=r"'RX': angle must be a real number or tensor, got "
                                         r".*complex"):
        run(1, body)


def test_none_angle_is_refused_by_type():
    """None is not an angle: named by its type, not read as NaN."""
    def body():
        qd.RX(None, wires=0)
        return qd.expval(qd.Z(0))
    with pytest.raises(QdiffError, match=r"'RX': angle must be a real number or tensor, got "
                                         r"NoneType"):
        run(1, body)


def test_sparse_tensor_angles_are_their_values():
    """A sparse tensor of angles is its dense values, and its gradient reaches it."""
    dev = qd.device("statevector", wires=1)

    @qd.qnode(dev, diff_method="adjoint")
    def f(x):
        qd.RX(x, wires=0)
        return qd.expval(qd.Z(0))
    dense = torch.tensor([0.3, 0.0, 0.5], dtype=torch.float64)
    x = dense.to_sparse().requires_grad_()
    out = f(x)
    assert torch.allclose(out, torch.cos(dense), atol=1e-12)
    out.sum().backward()
    assert torch.allclose(x.grad.to_dense(), -torch.sin(dense), atol=1e-12)


@pytest.mark.parametrize("make", [
    lambda: qd.Hamiltonian([float("nan"), 1.0], [qd.Z(0), qd.X(0)]),
    lambda: qd.Hamiltonian(torch.tensor([1.0, float("inf")]), [qd.Z(0), qd.X(0)]),
    lambda: float("nan") * qd.Z(0),
    lambda: qd.Z(0) + float("inf") * qd.X(0),
])
def test_non_finite_hamiltonian_coefficients(make):
    """Gave NaN results."""
    with pytest.raises(QdiffError, match=r"observable coefficient (nan|inf) is NaN or infinite"):
        make()


def test_finite_observables_still_build_and_differentiate():
    c = torch.tensor([0.5, -0.25], requires_grad=True)

    def body():
        qd.RX(0.3, wires=0)
        return qd.expval(qd.Hamiltonian(c, [qd.Z(0), qd.X(0)]))
    out = run(1, body)
    out.backward()
    assert torch.allclose(c.grad, torch.tensor([np.cos(0.3), 0.0], dtype=c.dtype), atol=1e-12)


def test_a_qnode_names_a_foreign_device_and_the_way_to_use_it():
    import pennylane as qml
    from qiskit import QuantumCircuit

    def f():
        return qd.expval(qd.Z(0))
    qc = QuantumCircuit(1)
    qc.h(0)
    for dev, hint in ((qml.device("default.qubit", wires=1), "qd.device\\(\"pennylane\""),
                      (42, "qd.device\\(\"statevector\""), ("statevector", "got str")):
        for fn in (f, qc):
            with pytest.raises(QdiffError, match="qdiff device.*" + hint):
                qd.qnode(dev)(fn)


@pytest.mark.parametrize("p", [True, np.bool_(True), torch.tensor(True)])
def test_bool_channel_parameters_are_refused(p):
    def body():
        qd.DepolarizingChannel(p, wires=0)
        return qd.expval(qd.Z(0))
    with pytest.raises(QdiffError, match="DepolarizingChannel.*parameter p must be a real"):
        qd.qnode(qd.device("mixed", wires=1))(body)()
