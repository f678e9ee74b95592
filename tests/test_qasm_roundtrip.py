"""OpenQASM round trip: ``dumps(loads(s))`` reparses to an equivalent circuit for every benchmark
file (gate by gate, measurements, and statevectors), and for random OpenQASM 3 programs with
``input float`` parameters and angle expressions (names kept, same expectation values at random
bindings, checked against Qiskit's own binding); the import runs in qnodes and ``qd.compile``."""
from __future__ import annotations

import dataclasses
import glob
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import qdiff as qd
from conftest import close_up_to_phase
from qdiff import QdiffError
from qdiff.circuits.measurements import Measurement
from qdiff.circuits import qasm

BENCH = sorted(glob.glob("/work/shared/benchmarks/qasm/*.qasm")) or sorted(
    glob.glob(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "benchmarks", "qasm",
                           "*.qasm")))


def same_up_to_phase(a: torch.Tensor, b: torch.Tensor) -> bool:
    k = int(torch.argmax(a.abs()))
    if abs(b[k]) < 1e-12:
        return False
    phase = a[k] / b[k]
    return abs(abs(phase) - 1) < 1e-9 and torch.allclose(a, phase * b, atol=1e-9)


@pytest.mark.skipif(not BENCH, reason="benchmark QASM files not found")
@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("path", BENCH, ids=os.path.basename)
def test_every_benchmark_file_round_trips(path, version):
    imp = qasm.load(path)
    again = qasm.loads(qasm.dumps(imp, version=version), f"roundtrip-{os.path.basename(path)}")
    assert again.measurements == imp.measurements and again.num_clbits == imp.num_clbits
    a, b = imp.circuit.operations, again.circuit.operations
    assert len(a) == len(b)
    for x, y in zip(a, b):  # gate by gate: same wires, same matrix up to a global phase
        assert x.wires == y.wires
        assert same_up_to_phase(x.matrix().reshape(-1), y.matrix().reshape(-1)), (x, y)
    if imp.circuit.num_wires <= 12:
        assert close_up_to_phase(final_state(again.circuit), final_state(imp.circuit), atol=1e-9)


def final_state(circuit) -> np.ndarray:
    """The state of a constant circuit, through the public qnode path."""
    c = circuit.with_measurements((Measurement("state"),))
    f = qd.qnode(qd.device("statevector", wires=c.num_wires))(c)
    return f(torch.zeros(0, dtype=torch.float64)).numpy()


NAMES = ["alpha", "beta", "gamma"]


@st.composite
def expressions(draw, depth=2):
    """OpenQASM 3 angle expressions the Qiskit importer reads: + - * / unary minus, pi."""
    if depth == 0 or draw(st.booleans()):
        return draw(st.sampled_from(NAMES + ["pi", "0.5", "1.25", "2"]))
    op = draw(st.sampled_from(["+", "-", "*", "/", "neg"]))
    x = draw(expressions(depth - 1))
    if op == "neg":
        return f"-({x})"
    if op == "/":
        return f"({x}) / {draw(st.sampled_from(NAMES + ['2', '0.5']))}"
    return f"({x}) {op} ({draw(expressions(depth - 1))})"


@st.composite
def programs(draw):
    n = draw(st.integers(1, 3))
    lines = ["OPENQASM 3.0;", 'include "stdgates.inc";']
    lines += [f"input float[64] {p};" for p in NAMES]
    lines.append(f"qubit[{n}] q;")
    for _ in range(draw(st.integers(1, 7))):
        g = draw(st.sampled_from(["rx", "ry", "rz", "p", "h", "cx", "crx", "cp", "u3"]))
        two = g in ("cx", "crx", "cp")
        if two and n < 2:
            g, two = "ry", False
        wires = draw(st.permutations(range(n)))[:2 if two else 1]
        nargs = {"h": 0, "cx": 0, "u3": 3}.get(g, 1)
        args = ", ".join(draw(expressions()) for _ in range(nargs))
        qs = ", ".join(f"q[{w}]" for w in wires)
        lines.append(f"{g}({args}) {qs};" if nargs else f"{g} {qs};")
    return "\n".join(lines) + "\n"


def expvals(imp, values: np.ndarray) -> torch.Tensor:
    n = imp.circuit.num_wires
    obs = ["Z" * n, "X" + "I" * (n - 1)]
    f = qd.qnode(qd.device("statevector", wires=n), observables=obs)(imp)
    return f({name: torch.tensor(values[:, i]) for i, name in enumerate(NAMES)
              if name in [p.name for p in imp.parameters]})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2 ** 31 - 1))
def test_openqasm3_inputs_round_trip(src, seed):
    import qiskit.qasm3 as q3
    from qiskit.quantum_info import SparsePauliOp, Statevector
    imp = qasm.loads(src)
    again = qasm.loads(qasm.dumps(imp, version=3))
    assert [p.name for p in again.parameters] == [p.name for p in imp.parameters]
    if not imp.parameters:
        return
    values = np.random.default_rng(seed).uniform(0.4, 2.0, (3, len(NAMES)))
    ours = expvals(imp, values)
    assert torch.allclose(expvals(again, values), ours, atol=1e-10)
    qc = q3.loads(src)  # Qiskit's own binding as the oracle
    n = qc.num_qubits
    for row, out in zip(values, ours):
        bind = {p: row[NAMES.index(p.name)] for p in qc.parameters}
        sv = Statevector(qc.assign_parameters(bind))
        ref = [sv.expectation_value(SparsePauliOp(o)).real for o in ["Z" * n, "X" + "I" * (n - 1)]]
        np.testing.assert_allclose(out.numpy(), ref, atol=1e-10)


PARAM_SRC = """OPENQASM 3.0;
include "stdgates.inc";
input float[64] a;
input float[64] b;
qubit[2] q;
bit[2] c;
h q[0];
rx(a * b) q[0];
rx(a) q[0];
cx q[0], q[1];
cx q[0], q[1];
ry(-a + 2 * b) q[1];
rz(a / b) q[1];
crx(b) q[1], q[0];
c = measure q;
"""


def test_import_runs_in_qnodes_compile_and_dumps():
    imp = qasm.loads(PARAM_SRC)
    assert imp.measurements == [(0, 0), (1, 1)] and imp.num_expressions == 3
    dev = qd.device("statevector", wires=2)
    v = torch.tensor([[0.3, 1.2], [0.9, -0.4]], dtype=torch.float64)
    probs = qd.qnode(dev)(imp)(v)  # final measurements: their probabilities
    assert probs.shape == (2, 4) and torch.allclose(probs.sum(-1), torch.ones(2, dtype=torch.float64))
    obs = [qd.Z(0), qd.X(1) @ qd.Z(0)]  # (of the state: the final measurements left out)

    def state_of(i):
        return dataclasses.replace(i, measurements=[], num_clbits=0)
    ref = qd.qnode(dev, observables=obs)(state_of(imp))(v)
    with pytest.raises(QdiffError, match=r"applies X to qubit\(s\) \[1\] after their final"):
        qd.qnode(dev, observables=obs)(imp)
    out, report = qd.compile(imp, level=2)
    assert report.verified and report.cx_after < report.cx_before
    compiled = dataclasses.replace(imp, circuit=out)  # the compiled circuit, same columns
    assert torch.allclose(qd.qnode(dev, observables=obs)(state_of(compiled))(v), ref,
                          atol=1e-10)
    text = qasm.dumps(compiled, version=3)
    assert "input float[64] a;" in text and "measure" in text
    back = qasm.loads(text)
    assert torch.allclose(qd.qnode(dev, observables=obs)(state_of(back))(v), ref, atol=1e-10)


def test_dumps_errors_are_qdiff_errors():
    imp = qasm.loads(PARAM_SRC)
    with pytest.raises(QdiffError, match="OpenQASM 2 has no free parameters.*version=3"):
        qasm.dumps(imp, version=2)
    with pytest.raises(QdiffError, match="expected a Circuit or a QiskitImport; got str"):
        qasm.dumps("h q[0];")
    with pytest.raises(QdiffError, match="unsupported OpenQASM version 4"):
        qasm.dumps(imp, version=4)
    bound = qasm.dumps(imp.circuit, version=2, theta=torch.zeros(imp.circuit.num_params))
    assert "OPENQASM 2.0" in bound


def test_dumps_theta_binds_the_imports_parameters():
    src = """OPENQASM 3.0;
include "stdgates.inc";
input float[64] alpha;
input float[64] beta;
qubit[2] q;
rx(alpha * beta) q[0];
ry(2 * beta + 0.25) q[1];
rz(alpha / beta) q[1];
"""
    imp = qasm.loads(src)
    assert [p.name for p in imp.parameters] == ["alpha", "beta"] and imp.num_expressions == 2
    with pytest.raises(QdiffError, match="no free parameters and the circuit has 2;"):
        qasm.dumps(imp, version=2)
    vals = torch.tensor([0.5, 2.0], dtype=torch.float64)
    text = qasm.dumps(imp, version=2, theta=vals)
    assert "rx(1.0) q[0];" in text and "ry(4.25) q[1];" in text
    dev = qd.device("statevector", wires=2)
    obs = ["ZZ", "XY", "IZ"]
    ref = qd.qnode(dev, observables=obs)(imp)(vals)
    assert torch.allclose(qd.qnode(dev, observables=obs)(qasm.loads(text))(torch.zeros(0)), ref,
                          atol=1e-12)
    assert qasm.dumps(imp, version=2, theta=[[0.5, 2.0]]) == text
    with pytest.raises(QdiffError, match=r"theta has 4 values for the circuit's 2 parameter\(s\) "
                                         r"\(alpha, beta\)"):
        qasm.dumps(imp, version=2, theta=imp.theta(vals.reshape(1, 2)))


def test_round_trip_keeps_classical_registers():
    from qiskit import qasm2, qasm3
    from qiskit.primitives import StatevectorSampler
    from qdiff.primitives import Sampler
    src3 = """OPENQASM 3.0;
include "stdgates.inc";
qubit[3] q;
bit[2] c;
bit[1] d;
x q[2];
h q[1];
c[1] = measure q[0];
d[0] = measure q[2];
c[0] = measure q[1];
"""
    src2 = """OPENQASM 2.0;
include "qelib1.inc";
qreg q[3];
creg c[2];
creg d[1];
x q[2];
h q[1];
measure q[0] -> c[1];
measure q[2] -> d[0];
measure q[1] -> c[0];
"""
    for src, version, loader in ((src3, 3, qasm3.loads), (src2, 2, qasm2.loads)):
        text = qasm.dumps(qasm.loads(src), version=version)
        ref = StatevectorSampler(seed=1).run([loader(src)], shots=50).result()[0].data
        qc = loader(text)
        ours = Sampler(seed=2).run([qc], shots=50).result()[0].data
        again = StatevectorSampler(seed=1).run([qc], shots=50).result()[0].data
        assert sorted(ours.keys()) == sorted(again.keys()) == ["c", "d"]
        for k in ("c", "d"):
            assert again[k].num_bits == ref[k].num_bits
            assert set(again[k].get_counts()) == set(ref[k].get_counts())
            assert set(ours[k].get_counts()) == set(ref[k].get_counts())
        assert ref["d"].get_counts() == {"1": 50}


def test_to_qiskit_of_an_import_gives_the_circuit_back():
    """``to_qiskit(from_qiskit(qc))`` is ``qc``: the same operator for any parameter values,
    the same parameter names, the same global phase (an expression of the parameters too), the
    final measurements into the same classical registers; a ``theta`` binds values of the
    import's parameters."""
    from qiskit import ClassicalRegister, QuantumCircuit
    from qiskit.circuit import Parameter
    from qiskit.circuit.library import real_amplitudes, zz_feature_map
    from qiskit.quantum_info import Operator
    from qdiff.circuits.qiskit_io import from_qiskit, to_qiskit
    qc = zz_feature_map(2).compose(real_amplitudes(2, reps=1))  # non-affine angle expressions
    t = Parameter("t")
    qc.rz(2 * t + 0.5, 1)
    qc.global_phase = 0.3 - 1.5 * t  # an expression of the parameters: kept exactly
    back = to_qiskit(from_qiskit(qc))
    assert sorted(p.name for p in back.parameters) == sorted(p.name for p in qc.parameters)
    rng = np.random.default_rng(0)
    for _ in range(3):
        vals = dict(zip(qc.parameters, rng.uniform(-2, 2, qc.num_parameters)))
        by_name = {p: vals[next(q for q in qc.parameters if q.name == p.name)]
                   for p in back.parameters}
        ref = Operator(qc.assign_parameters(vals)).data
        assert np.allclose(Operator(back.assign_parameters(by_name)).data, ref, atol=1e-12)
        bound = to_qiskit(from_qiskit(qc), theta=[vals[p] for p in qc.parameters])
        assert bound.num_parameters == 0
        assert np.allclose(Operator(bound).data, ref, atol=1e-12)
    m = QuantumCircuit(2)
    m.add_register(ClassicalRegister(2, "out"))
    m.h(0)
    m.cx(0, 1)
    m.measure(1, 0)
    back = to_qiskit(from_qiskit(m))
    assert [r.name for r in back.cregs] == ["out"] and back.count_ops()["measure"] == 1
    with pytest.raises(QdiffError, match="theta has 1 values for the circuit's 7 parameter"):
        to_qiskit(from_qiskit(qc), theta=[0.1])
    with pytest.raises(QdiffError, match="measure=True for a circuit with final measurements"):
        to_qiskit(from_qiskit(m), measure=True)
    with pytest.raises(QdiffError, match="to_qiskit: expected a Circuit or a QiskitImport; "
                                         "got str"):
        to_qiskit("h q[0];")


def test_openqasm3_text_carries_the_global_phase():
    """OpenQASM 3 text of an import writes its global phase as ``gphase``: the expression of
    the parameters (unbound) or its value (bound); loading the text gives the same operator."""
    from qiskit import QuantumCircuit
    from qiskit.circuit import Parameter
    from qiskit.quantum_info import Operator
    from qdiff.circuits import qasm
    from qdiff.circuits.qiskit_io import from_qiskit, to_qiskit
    a, b = Parameter("a"), Parameter("b")
    qc = QuantumCircuit(2)
    qc.rx(a, 0)
    qc.ry(2 * b, 1)
    qc.cx(0, 1)
    qc.global_phase = 0.3 + a * b - 0.5 * b * b  # not affine in the parameters
    imp = from_qiskit(qc)
    vals = [0.7, -1.3]
    ref = Operator(qc.assign_parameters(dict(zip(qc.parameters, vals)))).data
    bound = qasm.dumps(imp, version=3, theta=vals)
    assert "gphase(" in bound
    assert np.allclose(Operator(to_qiskit(qasm.loads(bound))).data, ref, atol=1e-12)
    free = qasm.loads(qasm.dumps(imp, version=3))
    back = to_qiskit(free)
    by_name = {p: vals[[q.name for q in qc.parameters].index(p.name)] for p in back.parameters}
    assert np.allclose(Operator(back.assign_parameters(by_name)).data, ref, atol=1e-12)
    plain = QuantumCircuit(1)
    plain.x(0)
    plain.global_phase = 0.25
    assert "gphase(0.25);" in qasm.dumps(from_qiskit(plain), version=3)
    assert "gphase" not in qasm.dumps(imp, version=2, theta=vals)


@pytest.mark.parametrize("statement", ["pow(-0.5) @ h q[0];", "pow(0.25) @ cx q[0], q[1];",
                                       "pow(0.3) @ ccx q[0], q[1], q[2];"])
def test_openqasm3_text_of_matrix_gates_keeps_their_phase(statement):
    """A fractional power is imported as a matrix gate; its OpenQASM 3 text (a ``gate unitary``
    definition) reloads to the same operator, global phase included, in qdiff and in Qiskit."""
    from qiskit import qasm3
    from qiskit.quantum_info import Operator
    from qdiff.circuits.qiskit_io import to_qiskit
    src = f'OPENQASM 3.0;\ninclude "stdgates.inc";\nqubit[3] q;\nh q;\n{statement}\n'
    want = Operator(qasm3.loads(src)).data
    text = qasm.dumps(qasm.loads(src), version=3)
    assert np.allclose(Operator(to_qiskit(qasm.loads(text))).data, want, atol=1e-10)
    assert np.allclose(Operator(qasm3.loads(text)).data, want, atol=1e-10)


@pytest.mark.parametrize("gates", [["sxdg"], ["ecr"], ["ryy"], ["xx_plus_yy"],
                                   ["sxdg", "ecr", "ryy", "iswap", "rzz"]])
def test_openqasm3_text_of_gates_outside_stdgates_keeps_their_phase(gates):
    """Gates outside ``stdgates.inc`` are written as ``gate`` definitions whose bodies lack the
    definition's global phase (``sxdg`` as ``s; h; s``, ``ryy`` through ``sxdg``); the text
    reloads to the same operator, global phase included, in qdiff and in Qiskit, with and
    without a free parameter."""
    from qiskit import QuantumCircuit, qasm3
    from qiskit.circuit import Parameter
    from qiskit.circuit.library import get_standard_gate_name_mapping
    from qiskit.quantum_info import Operator
    from qdiff.circuits.qiskit_io import from_qiskit, to_qiskit
    a = Parameter("a")
    for angle in (0.37, a):
        qc = QuantumCircuit(2)
        qc.h(0)
        for name in gates:
            g = get_standard_gate_name_mapping()[name]
            g = g.base_class(*[angle * (k + 1) for k in range(len(g.params))])
            qc.append(g, range(g.num_qubits))
        bound = qc.assign_parameters({a: 0.37}) if qc.parameters else qc
        want = Operator(bound).data
        text = qasm.dumps(from_qiskit(qc), version=3)
        back = qasm3.loads(text)
        mine = to_qiskit(qasm.loads(text), [0.37] if back.parameters else None)
        back = back.assign_parameters([0.37]) if back.parameters else back
        assert np.allclose(Operator(back).data, want, atol=1e-10), text
        assert np.allclose(Operator(mine).data, want, atol=1e-10), text
