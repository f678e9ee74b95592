"""OpenQASM and Qiskit I/O: benchmark files vs Qiskit statevectors, round trips, parameters,
and fuzzing of the parser front (only QdiffError may escape)."""
from __future__ import annotations

import glob
import math
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import close_up_to_phase
from qdiff.backends.statevector.simulate import simulate
from qdiff.circuits import qasm
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.qiskit_io import from_qiskit, to_qiskit

BENCH = sorted(glob.glob("/work/shared/benchmarks/qasm/*.qasm")) or sorted(
    glob.glob(os.path.join(os.path.dirname(__file__), "..", "shared", "benchmarks", "qasm", "*.qasm")))


def state_of(circuit, theta=None) -> np.ndarray:
    theta = torch.zeros(1, circuit.num_params, dtype=torch.float64) if theta is None else theta
    return simulate(circuit, theta)[0].numpy()


def qiskit_state(qc) -> np.ndarray:
    """Qiskit's statevector in qdiff's order (wire 0 most significant)."""
    from qiskit.quantum_info import Statevector
    qc = qc.remove_final_measurements(inplace=False)
    sv = Statevector(qc).data
    n = qc.num_qubits
    return sv.reshape([2] * n).transpose(list(range(n))[::-1]).reshape(-1)


@pytest.mark.skipif(not BENCH, reason="benchmark QASM files not found")
@pytest.mark.parametrize("path", BENCH, ids=os.path.basename)
def test_benchmark_file_loads_and_matches_qiskit(path):
    import qiskit.qasm2 as q2
    imp = qasm.load(path)
    qc = q2.load(path, custom_instructions=q2.LEGACY_CUSTOM_INSTRUCTIONS)
    assert imp.circuit.num_wires == qc.num_qubits
    if qc.num_qubits <= 10:
        ours = state_of(imp.circuit) * np.exp(1j * imp.global_phase)
        assert np.allclose(ours, qiskit_state(qc), atol=1e-9)


@pytest.mark.skipif(not BENCH, reason="benchmark QASM files not found")
@pytest.mark.parametrize("version", [2, 3])
def test_load_dump_load_is_equivalent(version):
    for path in BENCH:
        imp = qasm.load(path)
        if imp.circuit.num_wires > 8:
            continue
        text = qasm.dumps(imp.circuit, version=version)
        again = qasm.loads(text, f"roundtrip-{os.path.basename(path)}")
        assert close_up_to_phase(state_of(again.circuit), state_of(imp.circuit), atol=1e-9), path


def test_every_gate_survives_a_qasm_round_trip():
    """A circuit of every gate (those without a QASM name go through generator decompositions)."""
    from qdiff.circuits import Circuit, Operation
    from qdiff.circuits.gates import GATES, multirz_gate, paulirot_gate
    rng = np.random.default_rng(0)
    gates = list(GATES.values()) + [multirz_gate(3), paulirot_gate("XZY")]
    ops = []
    for g in gates:
        wires = tuple(int(w) for w in rng.permutation(4)[:g.num_wires])
        ops.append(Operation(g, wires, tuple(float(x) for x in rng.uniform(-3, 3, g.num_params))))
    c = Circuit(4, (Operation(GATES["h"], (0,)), Operation(GATES["ry"], (2,), (0.4,)), *ops))
    for version in (2, 3):
        again = qasm.loads(qasm.dumps(c, version=version))
        assert close_up_to_phase(state_of(again.circuit), state_of(c), atol=1e-9), version


def test_qiskit_parameters_and_affine_expressions():
    from qiskit import QuantumCircuit
    from qiskit.circuit import Parameter
    a, b = Parameter("a"), Parameter("b")
    qc = QuantumCircuit(3)
    qc.h(0)
    qc.rx(2 * a + 1, 0)
    qc.ry(b, 1)
    qc.cx(0, 2)
    qc.rz(-a, 2)
    qc.crx(0.5 * b - 0.25, 1, 2)
    qc.u(a, b, 0.3, 1)
    imp = from_qiskit(qc)
    assert imp.circuit.num_params == 2 and [p.name for p in imp.parameters] == ["a", "b"]
    for va, vb in [(0.3, -1.1), (2.0, 0.7)]:
        bound = qc.assign_parameters({a: va, b: vb})
        theta = torch.tensor([[va, vb]], dtype=torch.float64)
        assert np.allclose(state_of(imp.circuit, theta), qiskit_state(bound), atol=1e-12)
    # back to Qiskit: a ParameterVector, same state after binding
    back = to_qiskit(imp.circuit)
    assert len(back.parameters) == 2
    vals = {p: v for p, v in zip(sorted(back.parameters, key=lambda p: p.name), [0.3, -1.1])}
    assert np.allclose(qiskit_state(back.assign_parameters(vals)),
                       state_of(imp.circuit, torch.tensor([[0.3, -1.1]], dtype=torch.float64)),
                       atol=1e-12)
    bound_back = to_qiskit(imp.circuit, theta=torch.tensor([0.3, -1.1]))
    assert not bound_back.parameters


def test_dump_is_atomic_and_writes_measurements(tmp_path):
    from qdiff.circuits import Circuit, Operation
    from qdiff.circuits.gates import GATES
    c = Circuit(2, (Operation(GATES["h"], (0,)), Operation(GATES["cx"], (0, 1))))
    path = tmp_path / "bell.qasm"
    qasm.dump(c, path, measurements=[(0, 0), (1, 1)])
    imp = qasm.load(path)
    assert imp.measurements == [(0, 0), (1, 1)]
    assert [p for p in os.listdir(tmp_path)] == ["bell.qasm"]


# -- fuzzing the parser front ---------------------------------------------------------------

VALID = ('OPENQASM 2.0;\ninclude "qelib1.inc";\nqreg q[3];\ncreg c[3];\nh q[0];\n'
         'cx q[0],q[1];\nrz(pi/4) q[2];\nu3(0.1,0.2,0.3) q[1];\nccx q[0],q[1],q[2];\n'
         'measure q -> c;\n')
VALID3 = ('OPENQASM 3.0;\ninclude "stdgates.inc";\nqubit[2] q;\nbit[2] c;\nh q[0];\n'
          'cx q[0], q[1];\nrx(0.5) q[1];\nc = measure q;\n')
TOKENS = ["h", "cx", "rz(", ")", "q[0]", "q[7]", ";", ",", "->", "measure", "qreg", "creg", "pi",
          "gate", "{", "}", "OPENQASM 2.0;", "OPENQASM 3.0;", "include", '"qelib1.inc"', "\n",
          "u3(0.1,0.2)", "if(c==1)", "reset", "barrier", "-", "1e309", "qubit[2] q;", "/", "*"]


def load_only_qdiff_errors(text: str) -> None:
    try:
        qasm.loads(text, "fuzz.qasm")
    except QdiffError as exc:
        assert "fuzz.qasm" in str(exc)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_fuzz_random_text(text):
    load_only_qdiff_errors(text)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([VALID, VALID3]), st.lists(
    st.tuples(st.integers(0, 400), st.integers(0, 8), st.sampled_from(TOKENS)), max_size=4))
def test_fuzz_mutated_valid_programs(base, edits):
    text = base
    for pos, cut, token in edits:
        pos = pos % (len(text) + 1)
        text = text[:pos] + token + text[pos + cut:]
    load_only_qdiff_errors(text)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=30))
def test_fuzz_token_soup(tokens):
    load_only_qdiff_errors("OPENQASM 2.0;\n" + " ".join(tokens))


@pytest.mark.parametrize("text, version", [
    ('// Ported from an OPENQASM 3 program\nOPENQASM 2.0;\ninclude "qelib1.inc";\nqreg q[2];\n'
     'h q[0];\ncx q[0],q[1];\n', 2),
    ('/* was OPENQASM 2 before */\nOPENQASM 3.0;\ninclude "stdgates.inc";\nqubit[2] q;\n'
     'h q[0];\ncx q[0], q[1];\n', 3),
    ('// OPENQASM 3\n// no header; qreg below\nqreg q[1];\nU(0,0,0) q[0];\n', 2),
])
def test_version_is_read_from_the_header_not_comments(text, version):
    from qdiff.circuits.qasm import qasm_version
    assert qasm_version(text) == version
    imp = qasm.loads(text)
    assert imp.circuit.num_wires in (1, 2)


def _qasm2_spec_equiv(src, imp):
    """Qiskit's strict OpenQASM 2 reading of ``src`` (no legacy gates) against the import."""
    from qiskit import qasm2
    from qiskit.quantum_info import Operator
    return Operator(qasm2.loads(src)).equiv(Operator(to_qiskit(imp.circuit)))


@pytest.mark.parametrize("src", [
    # no include: the file's own h and cx (h := X, cx reversed), not the library's
    'OPENQASM 2.0;\ngate h a { U(pi,0,pi) a; }\ngate cx a,b { CX b,a; }\nqreg q[2];\n'
    'h q[0];\ncx q[0],q[1];\n',
    # with the include: a user gate named like a legacy extra or an instruction
    'OPENQASM 2.0;\ninclude "qelib1.inc";\ngate delay a { x a; }\nqreg q[1];\ndelay q[0];\n',
    'OPENQASM 2.0;\ninclude "qelib1.inc";\ngate rzz(t) a,b { cx a,b; rz(t) b; }\nqreg q[2];\n'
    'h q[0];\nrzz(0.3) q[0],q[1];\n',
    'OPENQASM 2.0;\ninclude "qelib1.inc";\ngate swap a,b { cx a,b; }\ngate g a,b { swap b,a; }\n'
    'qreg q[2];\nh q[0];\ng q[0],q[1];\n',
])
def test_qasm2_own_gate_definitions_win(src):
    assert _qasm2_spec_equiv(src, qasm.loads(src))


def test_qasm2_gates_need_a_definition_or_the_include():
    with pytest.raises(QdiffError, match=r"in.qasm:3: 'h' is not defined"):
        qasm.loads("OPENQASM 2.0;\nqreg q[1];\nh q[0];\n", "in.qasm")
    with pytest.raises(QdiffError, match="opaque"):
        qasm.loads('OPENQASM 2.0;\ninclude "qelib1.inc";\nopaque delay a;\nqreg q[1];\n'
                   'delay q[0];\n', "in.qasm")
    # the spec's built-ins need no include; qelib1.inc brings the library (and legacy u, p, sx)
    assert len(qasm.loads("OPENQASM 2.0;\nqreg q[2];\nU(0.1,0.2,0.3) q[0];\nCX q[0],q[1];\n")
               .circuit.operations) == 2
    assert len(qasm.loads('OPENQASM 2.0;\ninclude "qelib1.inc";\nqreg q[1];\nu(0.1,0.2,0.3) '
                          'q[0];\np(0.2) q[0];\nsx q[0];\n').circuit.operations) == 3
