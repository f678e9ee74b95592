"""Bad input: every user error is a QdiffError whose message names the thing at fault."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff.circuits import Circuit, Operation, get_gate
from qdiff.circuits import qasm
from qdiff.circuits.errors import QdiffError, QdiffMemoryError, QdiffParseError
from qdiff.circuits.gates import GATES


def run(n, body, **dev_kw):
    dev = qd.device("statevector", wires=n, **dev_kw)
    return qd.qnode(dev)(body)()


# -- gates -----------------------------------------------------------------------------------

def test_unknown_gate_name():
    with pytest.raises(QdiffError, match=r"unknown gate 'frobnicate'"):
        get_gate("frobnicate")


def test_unknown_gate_in_qasm_names_file_and_line(tmp_path):
    path = tmp_path / "bad_gate.qasm"
    path.write_text('OPENQASM 2.0;\ninclude "qelib1.inc";\nqreg q[2];\nh q[0];\nfrobnicate q[1];\n')
    with pytest.raises(QdiffParseError, match=rf"{path}:5:.*frobnicate"):
        qasm.load(path)


def test_wire_out_of_range_in_qnode():
    def body():
        qd.RX(0.1, wires=5)
        return qd.expval(qd.Z(0))
    with pytest.raises(QdiffError, match=r"gate 'RX' on wire 5"):
        run(2, body)


def test_wire_out_of_range_in_measurement():
    def body():
        qd.H(0)
        return qd.expval(qd.Z(3))
    with pytest.raises(QdiffError, match=r"wire 3"):
        run(2, body)


def test_wire_out_of_range_in_circuit():
    with pytest.raises(QdiffError, match=r"gate 'CNOT' on wire 2: out of range for a 2-qubit"):
        Circuit(2, (Operation(GATES["cx"], (0, 2)),))


def test_repeated_wire():
    with pytest.raises(QdiffError, match=r"'CNOT': repeated wire in \[1, 1\]"):
        qd.CNOT(wires=[1, 1])


def test_wrong_number_of_wires():
    with pytest.raises(QdiffError, match=r"gate 'CNOT' acts on 2 wire\(s\); got wires \[0\]"):
        qd.CNOT(wires=[0])


@pytest.mark.parametrize("call,pattern", [
    (lambda: qd.RX(wires=0), r"'RX' takes 1 parameter\(s\); got 0"),
    (lambda: qd.Rot(0.1, 0.2, wires=0), r"'Rot' takes 3 parameter\(s\); got 2"),
    (lambda: qd.Hadamard(0.3, wires=0), r"'Hadamard' takes 0 parameter\(s\); got 1"),
    (lambda: qd.RX(0.1, 0.2, 0), r"'RX' takes 1 parameter\(s\) and wires; got 3"),
    (lambda: qd.RX(0.1, wires=0, foo=1), r"'RX': unexpected keyword"),
    (lambda: qd.RX(1j, wires=0), r"'RX'"),
    (lambda: qd.RX(torch.tensor([0.1j]), wires=0), r"'RX': angles must be real"),
    (lambda: qd.RX("abc", wires=0), r"'RX': angle must be a real number"),
    (lambda: qd.MultiRZ(0.1, 0.2, wires=[0, 1]), r"MultiRZ takes 1 parameter"),
    (lambda: qd.PauliRot(0.1, "XQ", wires=[0, 1]), r"invalid Pauli word 'XQ'"),
    (lambda: qd.PauliRot(0.1, "XYZ", wires=[0, 1]), r"word 'XYZ' has 3 letters but 2 wire"),
    (lambda: qd.QubitUnitary(torch.eye(3), wires=[0]), r"QubitUnitary: matrix must be square with a power-of-two"),
    (lambda: qd.QubitUnitary(torch.ones(2, 2), wires=[0]), r"QubitUnitary: matrix is not unitary"),
    (lambda: qd.QubitUnitary(torch.eye(4), wires=[0]), r"acts on 2 wire\(s\); got 1"),
])
def test_wrong_parameters_for_gates(call, pattern):
    with pytest.raises(QdiffError, match=pattern):
        call()


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_angles(value):
    with pytest.raises(QdiffError, match=r"'RY'.*(NaN or infinite)"):
        qd.RY(value, wires=0)


@pytest.mark.parametrize("value", [torch.tensor([0.1, math.nan]), torch.tensor(math.inf)])
def test_nan_and_inf_tensor_angles_in_a_qnode(value):
    """Tensor angles are checked once, on the stacked theta; the message names the gate."""
    def body():
        qd.RX(0.2, wires=1)
        qd.RY(value, wires=0)
        return qd.expval(qd.Z(0))
    with pytest.raises(QdiffError, match=r"gate 'RY' on wires \[0\]: angle is NaN or infinite"):
        run(2, body)


def test_batch_shapes_that_do_not_broadcast():
    def body():
        qd.RX(torch.rand(3), wires=0)
        qd.RY(torch.rand(4), wires=1)
        return qd.expval(qd.Z(0))
    with pytest.raises(QdiffError, match=r"do not broadcast: \[\(3,\), \(4,\)\]"):
        run(2, body)


# -- templates -------------------------------------------------------------------------------

@pytest.mark.parametrize("call,pattern", [
    (lambda: qd.StronglyEntanglingLayers(torch.rand(2, 3, 2), wires=range(3)),
     r"StronglyEntanglingLayers: weights must have shape \(\.\.\., 2, 3, 3\); got \(2, 3, 2\)"),
    (lambda: qd.StronglyEntanglingLayers(torch.rand(3, 3), wires=range(3)),
     r"StronglyEntanglingLayers: weights must have shape"),
    (lambda: qd.StronglyEntanglingLayers(torch.rand(2, 3, 3), wires=range(3), ranges=[1]),
     r"1 ranges for 2 layers"),
    (lambda: qd.BasicEntanglerLayers(torch.rand(2, 4), wires=range(3)),
     r"BasicEntanglerLayers: weights must have shape \(\.\.\., 2, 3\); got \(2, 4\)"),
    (lambda: qd.AngleEmbedding(torch.rand(5), wires=range(3)),
     r"AngleEmbedding: features of shape \(5,\)"),
    (lambda: qd.AngleEmbedding(torch.rand(3), wires=range(3), rotation="W"),
     r"rotation must be 'X', 'Y' or 'Z'"),
    (lambda: qd.AmplitudeEmbedding(torch.rand(5), wires=range(2)),
     r"AmplitudeEmbedding: 5 features for 2 wires"),
    (lambda: qd.AmplitudeEmbedding(torch.ones(4), wires=range(2)), r"must be normalized"),
    (lambda: qd.AmplitudeEmbedding(torch.zeros(4), wires=range(2), normalize=True),
     r"cannot normalize a zero"),
    (lambda: qd.BasisState([1, 2], wires=range(2)), r"BasisState: state must be 2 bits"),
    (lambda: qd.HardwareEfficientAnsatz(torch.rand(2, 3, 3), wires=range(3)),
     r"HardwareEfficientAnsatz: weights must have shape \(\.\.\., 2, 3, 2\)"),
    (lambda: qd.AllSinglesDoubles(torch.rand(2), wires=range(4), hf_state=[1, 1, 0, 0],
                                  singles=[[0, 2]], doubles=[]),
     r"AllSinglesDoubles: weights must have shape \(\.\.\., 1\); got \(2,\)"),
    (lambda: qd.QAOALayers(torch.rand(2, 3), wires=range(2), cost_h=qd.Z(0)),
     r"QAOALayers: params must have shape \(\.\.\., depth, 2\)"),
    (lambda: qd.hf_state(5, 4), r"hf_state: need 0 < electrons <= orbitals"),
])
def test_wrong_shapes_for_templates(call, pattern):
    with pytest.raises(QdiffError, match=pattern):
        call()


# -- observables -----------------------------------------------------------------------------

def test_non_hermitian_matrix_observable():
    with pytest.raises(QdiffError, match=r"Hermitian: the matrix on wires \[0\] is not Hermitian"):
        qd.Hermitian(torch.tensor([[0.0, 1.0], [0.0, 0.0]]), wires=0)


def test_hermitian_wrong_size():
    with pytest.raises(QdiffError, match=r"must be 4x4; got shape \(2, 2\)"):
        qd.Hermitian(torch.eye(2), wires=[0, 1])


@pytest.mark.parametrize("make", [lambda: qd.X(0) @ qd.Y(0),
                                  lambda: 1j * qd.Z(0) + qd.X(1),
                                  lambda: qd.Hamiltonian([0.5j], [qd.Z(0)])])
def test_complex_coefficient_pauli_sum_is_not_hermitian(make):
    with pytest.raises(QdiffError, match=r"is not Hermitian \(complex coefficients\)"):
        qd.expval(make())



def test_qiskit_observable_is_hermitian_once_like_terms_are_merged():
    from qiskit.quantum_info import SparsePauliOp
    from qdiff.circuits.qiskit_io import observable_from_qiskit
    obs = observable_from_qiskit(SparsePauliOp(["ZX", "ZX", "YI"], [1 + 1j, 1 - 1j, 0.5]), 2)
    ref = 2.0 * qd.X(0) @ qd.Z(1) + 0.5 * qd.Y(1)
    assert torch.equal(obs.matrix(wire_order=[0, 1]), ref.matrix(wire_order=[0, 1]))
    assert not obs.coeffs.is_complex()
    with pytest.raises(QdiffError, match=r"not Hermitian \(coefficient 1j of X\(0\) @ Z\(1\)\)"):
        observable_from_qiskit(SparsePauliOp(["ZX", "YI"], [1j, 0.5]), 2)

def test_gate_that_is_not_an_observable():
    with pytest.raises(QdiffError, match=r"gate 'RX' cannot be used as an observable"):
        qd.expval(qd.RX(0.1, wires=0))


def test_hamiltonian_coefficient_count():
    with pytest.raises(QdiffError, match=r"2 coefficient\(s\) for 1 observable"):
        qd.Hamiltonian([1.0, 2.0], [qd.Z(0)])


# -- QASM ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,line", [
    ('OPENQASM 2.0;\ninclude "qelib1.inc";\nqreg q[2];\ncx q[0] q[1];\n', 4),
    ('OPENQASM 2.0;\ninclude "qelib1.inc";\nqreg q[2];\nh q[0];\nrx(0.3 q[1];\n', 5),
    ('OPENQASM 2.0;\ninclude "qelib1.inc";\nqreg q[1];\nh q[3];\n', 4),
    # OpenQASM 3 syntax error: the parser stops at the next statement's first token
    ('OPENQASM 3.0;\ninclude "stdgates.inc";\nqubit[2] q;\nh q[0]\ncx q[0], q[1];\n', 5),
    ('OPENQASM 3.0;\ninclude "stdgates.inc";\nqubit[2] q;\nh q[0];\nfoo q[1];\n', 5),
])
def test_malformed_qasm_names_file_and_line(tmp_path, text, line):
    path = tmp_path / "broken.qasm"
    path.write_text(text)
    with pytest.raises(QdiffParseError, match=rf"broken\.qasm:{line}\b"):
        qasm.load(path)


def test_qasm3_semantic_error_names_the_file(tmp_path):
    """Qiskit's OpenQASM 3 importer reports some semantic errors without a position: the
    message still names the file and the problem (no line: a known gap)."""
    path = tmp_path / "arity.qasm"
    path.write_text('OPENQASM 3.0;\ninclude "stdgates.inc";\nqubit[2] q;\ncx q[0], ;\n')
    with pytest.raises(QdiffParseError, match=r"arity\.qasm.*(arguments|expect)"):
        qasm.load(path)


def test_missing_qasm_file(tmp_path):
    with pytest.raises(QdiffError, match=r"nope\.qasm: cannot read"):
        qasm.load(tmp_path / "nope.qasm")


def test_binary_qasm_file(tmp_path):
    path = tmp_path / "bin.qasm"
    path.write_bytes(b"\xff\xfe\x00\x81garbage")
    with pytest.raises(QdiffError, match=r"bin\.qasm"):
        qasm.load(path)


# -- memory guard, devices, measurements -------------------------------------------------

def test_too_many_qubits_refused_before_allocation():
    def body():
        qd.H(0)
        return qd.expval(qd.Z(0))
    with pytest.raises(QdiffMemoryError, match=r"simulating 40 qubits with batch 1 needs about "
                                               r"[\d.]+e?\+?\d* GiB .* available"):
        run(40, body)


def test_memory_guard_counts_the_batch():
    from qdiff.backends.statevector.simulate import check_memory
    check_memory(10, 1, torch.complex128, "cpu")
    with pytest.raises(QdiffMemoryError, match=r"30 qubits with batch 100000"):
        check_memory(30, 100000, torch.complex128, "cpu")
    assert issubclass(QdiffMemoryError, MemoryError)


def test_sample_needs_shots_and_state_refuses_shots():
    def sample_body():
        qd.H(0)
        return qd.sample(wires=[0])
    with pytest.raises(QdiffError, match=r"sample\(\) needs a device with shots"):
        run(1, sample_body)

    def state_body():
        qd.H(0)
        return qd.state()
    with pytest.raises(QdiffError, match=r"state\(\) is not available with shots"):
        run(1, state_body, shots=10)


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(wires=2, _name="nonexistent"), r"unknown device 'nonexistent'"),
    (dict(wires=0), r"at least one wire"),
    (dict(wires=[0, 0]), r"duplicates"),
    (dict(wires=10 ** 9), r"wires=1000000000: a device has at most 100000 wires"),
    (dict(wires=range(10 ** 9)), r"1000000000 wire labels: a device has at most"),
    (dict(wires=10 ** 9, _name="mixed"), r"at most 100000 wires"),
    (dict(wires=2, shots=0), r"shots must be a positive integer"),
    (dict(wires=2, dtype=torch.float16), r"dtype must be complex128 or complex64"),
    (dict(), r"device 'statevector' needs wires="),
    (dict(_name="default.qubit"), r"unknown device 'default.qubit'.*qd.device\(\"pennylane\", "
                                  r"name=\"default.qubit\""),
    (dict(_name="lightning.qubit"), r"unknown device 'lightning.qubit'.*name=\"lightning"),
    (dict(wires=[[0], [1]]), r"device wire label \[0\] is not hashable \(list\)"),
    (dict(wires=torch.tensor([[0], [1]])), r"device wire label \[0\] is not hashable"),
    (dict(wires=[torch.tensor([0, 1])]), r"device wire label tensor\(\[0, 1\]\): a tensor "
                                         r"label must be a 0-d integer tensor"),
    (dict(wires=torch.tensor(2.0)), r"wires must be an int or a sequence of labels"),
    (dict(wires=torch.tensor(0)), r"at least one wire"),
    (dict(wires=1, shots=5, seed="a"), r"seed must be a non-negative integer .* got 'a'"),
    (dict(wires=1, seed=1.5), r"seed must be a non-negative integer .* got 1\.5"),
    (dict(wires=1, seed=-1), r"seed must be a non-negative integer .* got -1"),
    (dict(wires=1, seed=True), r"seed must be a non-negative integer .* got True"),
    (dict(wires=1, seed=2 ** 64), r"seed must be a non-negative integer \(at most 2\*\*64 - 1\)"),
    (dict(wires=1, seed=-1, _name="mixed"), r"seed must be a non-negative integer"),
])
def test_bad_device_arguments(kwargs, pattern):
    name = kwargs.pop("_name", "statevector")
    with pytest.raises(QdiffError, match=pattern):
        qd.device(name, **kwargs)


def test_integer_tensors_and_arrays_as_device_wires():
    """A 0-d integer tensor or array is a number of wires, as an int; a 1-d integer tensor
    and 0-d integer tensors in a sequence are int labels; a NumPy integer seed is a seed."""
    assert qd.device("statevector", wires=torch.tensor(3)).wires == (0, 1, 2)
    assert qd.device("statevector", wires=np.array(2)).wires == (0, 1)
    assert qd.device("statevector", wires=torch.tensor([4, 7])).wires == (4, 7)
    dev = qd.device("statevector", wires=[torch.tensor(1), "a"], shots=4, seed=np.int64(3))
    assert dev.wires == (1, "a") and dev.seed == 3

    @qd.qnode(dev)
    def f():
        qd.X(1)
        return qd.expval(qd.Z(1))
    assert float(f()) == -1.0


@pytest.mark.parametrize("seed,pattern", [("a", r"got 'a'"), (1.5, r"got 1\.5"), (-1, r"got -1")])
def test_spsa_seed_is_checked_when_the_qnode_is_made(seed, pattern):
    with pytest.raises(QdiffError, match=r"diff_method='spsa': seed must be a non-negative "
                                         r"integer .* " + pattern):
        qd.qnode(qd.device("statevector", wires=1), diff_method="spsa", seed=seed)(
            lambda: qd.expval(qd.Z(0)))


@pytest.mark.parametrize("kind", ["mps", "xpu"])
def test_an_unavailable_torch_device_is_refused_at_device_creation(kind):
    try:
        torch.empty(0, device=kind)
        pytest.skip(f"a {kind} device is available here")
    except (RuntimeError, AssertionError):
        pass
    for name in ("statevector", "mixed"):
        with pytest.raises(QdiffError, match=rf"device='{kind}': no {kind} device is available"):
            qd.device(name, wires=1, device=kind)


def test_a_string_is_one_device_wire_label():
    dev = qd.device("statevector", wires="anc")
    assert dev.wires == ("anc",)

    @qd.qnode(dev)
    def f():
        qd.RX(0.3, wires="anc")
        return qd.expval(qd.Z("anc"))
    torch.testing.assert_close(f(), torch.cos(torch.tensor(0.3, dtype=torch.float64)))


def test_qnode_must_return_measurements():
    def body():
        qd.H(0)
        return 3
    with pytest.raises(QdiffError, match=r"must return a measurement .* got int"):
        run(1, body)


def test_unknown_diff_method():
    with pytest.raises(QdiffError, match=r"unknown diff_method 'magic'"):
        qd.qnode(qd.device("statevector", wires=1), diff_method="magic")(lambda: qd.state())
