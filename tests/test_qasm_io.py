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
import qdiff as qd
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


def test_gate_named_unitary_in_openqasm3_text_loads_by_its_definition():
    """Qiskit's OpenQASM 3 exporter (and qdiff's) writes a UnitaryGate as ``gate unitary``."""
    import scipy.stats
    from qiskit import QuantumCircuit, qasm3
    qc = QuantumCircuit(2)
    qc.h(0)
    qc.unitary(scipy.stats.unitary_group.rvs(4, random_state=5), [1, 0])
    want = qiskit_state(qc)
    for text in (qasm3.dumps(qc), qasm.dumps(from_qiskit(qc), version=3)):
        assert "gate unitary" in text
        imp = qasm.loads(text)
        assert close_up_to_phase(state_of(imp.circuit), want, atol=1e-9)
    # a UnitaryGate itself is read through its matrix
    assert from_qiskit(qc).circuit.count_ops() == {"h": 1, "unitary": 1}
    assert np.allclose(state_of(from_qiskit(qc).circuit), want, atol=1e-12)


def test_user_gates_named_like_standard_gates_keep_their_definition():
    from qiskit import QuantumCircuit, qasm3
    src = """OPENQASM 3.0;
include "stdgates.inc";
gate iswap a, b { h a; cx a, b; }
gate rzz(t) a, b { rx(t) a; cz a, b; }
qubit[2] q;
ry(0.3) q[1];
iswap q[0], q[1];
rzz(0.7) q[1], q[0];
"""
    imp = qasm.loads(src)
    assert "iswap" not in imp.circuit.count_ops() and "rzz" not in imp.circuit.count_ops()
    assert np.allclose(state_of(imp.circuit), qiskit_state(qasm3.loads(src)), atol=1e-12)
    # a Qiskit gate called "cz" that is not Qiskit's CZGate
    sub = QuantumCircuit(2)
    sub.h(0)
    sub.cx(0, 1)
    g = sub.to_gate()
    g.name = "cz"
    qc = QuantumCircuit(2)
    qc.ry(0.4, 0)
    qc.append(g, [0, 1])
    assert "cz" not in from_qiskit(qc).circuit.count_ops()
    assert np.allclose(state_of(from_qiskit(qc).circuit), qiskit_state(qc), atol=1e-12)
    # definitions Qiskit's exporters write for standard gates are those gates again
    from qiskit.circuit import Parameter
    a = Parameter("a")
    qc = QuantumCircuit(2)
    qc.iswap(0, 1); qc.rzz(2 * a, 0, 1); qc.ecr(1, 0); qc.ryy(a, 0, 1); qc.sxdg(1)
    want = {"iswap": 1, "rzz": 1, "ecr": 1, "ryy": 1, "sxdg": 1}
    for version, theta in ((3, None), (2, [0.3])):
        again = qasm.loads(qasm.dumps(from_qiskit(qc), version=version, theta=theta))
        assert again.circuit.count_ops() == want, version


@pytest.mark.parametrize("name", ["rx", "ry", "rz", "p", "rot", "u3", "swap", "globalphase",
                                  "isingxy", "pswap", "cphaseshift01",
                                  "single_excitation_plus", "fermionic_swap", "siswap"])
def test_controlled_gates_export_with_their_angles(name):
    """``qd.ctrl`` of a gate, one or two controls, constant or affine angles: Qiskit's
    statevector of ``to_qiskit`` and the OpenQASM 3 round trip with free parameters."""
    from qdiff.circuits import Circuit, Operation
    from qdiff.circuits.gates import GATES, controlled_gate
    from qdiff.circuits.operation import ParamRef
    g = GATES[name]
    theta = torch.tensor([[0.4, -1.1]], dtype=torch.float64)
    for k in (1, 2):
        if name == "u3" and k == 2:
            continue  # Qiskit's OpenQASM 3 importer refuses the text its exporter writes
        wires = (3, 0, 2, 1)[-(k + g.num_wires):]
        for params in ((0.9, -0.4, 1.3), (ParamRef(0, 2.0, 0.1), ParamRef(1, -0.5, 0.3), 0.7)):
            ops = tuple(Operation(GATES["h"], (w,)) for w in range(4)) + (
                Operation(GATES["rx"], (1,), (0.3,)),
                Operation(controlled_gate(g, k), wires, params[:g.num_params]))
            c = Circuit(4, ops, (), 2)
            want = state_of(c, theta)
            assert np.allclose(qiskit_state(to_qiskit(c, theta)), want, atol=1e-12)
            back = qasm.loads(qasm.dumps(c, version=3))
            got = state_of(back.circuit, theta[:, :back.circuit.num_params])
            assert close_up_to_phase(got, want, atol=1e-12), (k, params)


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
    # complex values are refused, never written as their real parts
    for theta in (np.array([0.3 + 0.1j, -1.1]), torch.tensor([0.3, -1.1 + 1j]), [0.3j, 1.0]):
        with pytest.raises(QdiffError, match="to_qiskit: theta must be real; got complex"):
            to_qiskit(imp.circuit, theta=theta)
        with pytest.raises(QdiffError, match="dumps: theta must be real; got complex"):
            qasm.dumps(imp, version=2, theta=theta)


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


def test_xx_plus_yy_imports_as_isingxy_or_single_excitation():
    """Qiskit's XXPlusYYGate(theta, beta) is IsingXY(-theta) for beta = 0 and
    SingleExcitation(+-theta) for beta = -+pi/2 (parameters kept); another beta goes through
    its definition. IsingXY exports as XXPlusYY and reads back as IsingXY."""
    from qiskit import QuantumCircuit
    from qiskit.circuit import Parameter
    from qiskit.circuit.library import XXPlusYYGate
    t = Parameter("t")
    qc = QuantumCircuit(3)
    qc.h(0); qc.ry(0.3, 1); qc.rx(0.8, 2)
    qc.append(XXPlusYYGate(t, 0.0), [0, 2])
    qc.append(XXPlusYYGate(2 * t, -math.pi / 2), [2, 1])
    qc.append(XXPlusYYGate(t, math.pi / 2), [1, 0])
    qc.append(XXPlusYYGate(0.7, 0.4), [0, 1])
    imp = from_qiskit(qc)
    names = [o.name for o in imp.circuit.operations]
    assert names.count("isingxy") == 1 and names.count("single_excitation") == 2
    theta = torch.tensor([[0.61]], dtype=torch.float64)
    want = qiskit_state(qc.assign_parameters({t: 0.61}))
    assert np.allclose(state_of(imp.circuit, theta), want, atol=1e-12)
    from qdiff.circuits import Circuit, Operation
    from qdiff.circuits.gates import GATES
    c = Circuit(2, (Operation(GATES["h"], (0,)), Operation(GATES["isingxy"], (0, 1), (0.9,))))
    assert [i.operation.name for i in to_qiskit(c).data] == ["h", "xx_plus_yy"]
    for version in (2, 3):
        back = qasm.loads(qasm.dumps(c, version=version)).circuit
        assert [o.name for o in back.operations] == ["h", "isingxy"], version
        assert np.allclose(state_of(back), state_of(c), atol=1e-12)


def test_decomposition_of_a_gate_that_is_not_its_generators_exponential_is_refused():
    """A one-parameter gate U = A exp(-i phi G) with A != I and no decomposition of its own
    is not exported as exp(-i phi G) (that would drop A): the export says so."""
    from qdiff.circuits import Circuit, Operation
    from qdiff.circuits.gates import GATES, Gate
    pswap = GATES["pswap"]
    bare = Gate("bare_pswap", 2, 1, pswap.matrix_fn, generators=pswap.generators,
                inverse_fn=pswap.inverse_fn)
    c = Circuit(2, (Operation(bare, (0, 1), (0.4,)),))
    with pytest.raises(QdiffError, match="not exp\\(-i phi G\\)"):
        to_qiskit(c)
    # PSWAP itself carries its decomposition: exact
    c = Circuit(2, (Operation(GATES["h"], (0,)), Operation(pswap, (0, 1), (0.4,))))
    assert np.allclose(qiskit_state(to_qiskit(c)), state_of(c), atol=1e-12)


def _write(path, text):
    path.write_text(text)
    return str(path)


def test_qasm2_include_is_found_beside_the_program(tmp_path, monkeypatch):
    """``include "defs.inc"`` is looked up in the working directory, then the program's folder
    (``qiskit.qasm2.load``'s order), whatever the working directory; the included gates are
    the file's own (a ``U`` in an included body too)."""
    from qiskit import qasm2
    from qiskit.quantum_info import Operator
    prog = tmp_path / "prog"
    prog.mkdir()
    _write(prog / "defs.inc", "// two-qubit gates\ngate g a,b { CX b,a; CX a,b; }\n"
           "gate r(t) a { U(t,0,0) a; }\n")
    src = _write(prog / "main.qasm", 'OPENQASM 2.0;\ninclude "qelib1.inc";\ninclude "defs.inc";\n'
                 "qreg q[2];\nh q[0];\ng q[0],q[1];\nr(0.3) q[1];\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    imp = qasm.load(src)
    want = qasm2.loads(open(src).read().replace('include "defs.inc";\n',
                                                 "gate g a,b { CX b,a; CX a,b; }\n"
                                                 "gate r(t) a { U(t,0,0) a; }\n"))
    assert Operator(want).equiv(Operator(to_qiskit(imp.circuit)))
    with pytest.raises(QdiffError, match=r'main.qasm:3: include "defs.inc": no such file'):
        qasm.loads(open(src).read(), str(elsewhere / "main.qasm"))


def test_qasm2_include_errors_and_limits_name_the_include_line(tmp_path, monkeypatch):
    """The included text is under the program's limits (a doubling chain of definitions in an
    include is refused without being expanded); a missing file and an include cycle are
    parse errors naming the include's line."""
    import time
    monkeypatch.chdir(tmp_path)
    chain = "gate g0 a,b { CX a,b; }\n" + "".join(
        f"gate g{i} a,b {{ g{i - 1} a,b; g{i - 1} a,b; }}\n" for i in range(1, 22))
    _write(tmp_path / "bomb.inc", chain)
    t0 = time.perf_counter()
    with pytest.raises(QdiffError, match=r"p.qasm:4: the program expands to more than"):
        qasm.loads('OPENQASM 2.0;\ninclude "bomb.inc";\nqreg q[2];\ng21 q[0],q[1];\n', "p.qasm")
    assert time.perf_counter() - t0 < 2.0
    _write(tmp_path / "a.inc", 'include "b.inc";\n')
    _write(tmp_path / "b.inc", 'include "a.inc";\n')
    with pytest.raises(QdiffError, match=r'p.qasm:2: include "a.inc": an include cycle'):
        qasm.loads('OPENQASM 2.0;\ninclude "a.inc";\nqreg q[1];\n', "p.qasm")
    with pytest.raises(QdiffError, match=r'p.qasm:3: include "none.inc": no such file'):
        qasm.loads('OPENQASM 2.0;\nqreg q[1];\ninclude "none.inc";\n', "p.qasm")
    with pytest.raises(QdiffError, match=r'p.qasm:2: include "/dev/zero": .*limit'):
        qasm.loads('OPENQASM 2.0;\ninclude "/dev/zero";\nqreg q[1];\n', "p.qasm")



def test_qasm2_include_count_is_bounded(tmp_path, monkeypatch):
    """Each include reads a file: more than ``MAX_INCLUDES`` include statements in all (an
    empty file included a million times fits the byte limit) is a parse error naming the
    first include past the limit, found at once."""
    import time
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "empty.inc", "// nothing\n")
    n = qasm.MAX_INCLUDES
    ok = 'OPENQASM 2.0;\ninclude "qelib1.inc";\n' + 'include "empty.inc";\n' * n
    assert qasm.loads(ok + "qreg q[1];\nx q[0];\n", "p.qasm").circuit.num_wires == 1
    t0 = time.perf_counter()
    with pytest.raises(QdiffError, match=rf'p.qasm:{n + 3}: include "empty.inc": more than '
                       rf"{n} includes in all"):
        qasm.loads(ok + 'include "empty.inc";\n' * 100_000 + "qreg q[1];\n", "p.qasm")
    assert time.perf_counter() - t0 < 5.0

MOD3_HEAD = ('OPENQASM 3.0;\ninclude "stdgates.inc";\n'
             "gate g(a) x, y { rz(a) x; cx x, y; ry(-a/2) y; }\n"
             "gate k(t) a, b { inv @ g(t) b, a; pow(2) @ rx(t) a; }\nqubit[3] q;\nqubit r;\n")
MOD3_STATEMENTS = [
    "h q[0];", "inv @ g(0.5) q[0], r;", "ctrl @ inv @ g(0.3) r, q[0], q[1];",
    "pow(3) @ g(0.2) q[1], q[2];", "pow(0.5) @ x q[0];", "negctrl(2) @ y q[0], q[1], r;",
    "k(0.4) q[2], q[0];", "ctrl @ k(0.1) r, q[1], q[2];", "gphase(-0.7);",
    "ctrl @ gphase(0.3) q[0];", "inv @ ctrl @ rz(0.3) q[0], q[1];", "cp(0.2) q[0], r;",
    "cu(0.1, 0.2, 0.3, 0.4) q[2], q[0];", "pow(-2) @ t r;", "ccx q[0], q[1], r;",
    "U(0.1, -0.2, 3) q[2];", "rz(π/3) q[0];", "rx(tau/3) q[1];", "pow(1.5) @ s q[1];",
    "inv @ pow(2) @ ctrl @ sx q[1], q[2];", "ctrl(2) @ swap q[0], q[1], q[2], r;",
    "negctrl @ ctrl @ rx(-0.4) r, q[2], q[0];", "phase(0.3) q[1];"]


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(MOD3_STATEMENTS), min_size=1, max_size=6))
def test_openqasm3_modifiers_and_custom_gates_load_as_qiskit_reads_them(statements):
    """Gate modifiers (inv, pow, ctrl, negctrl, nested), parametric custom gates calling
    modified gates, gphase: the import's unitary is Qiskit's, up to global phase."""
    from qiskit import qasm3
    from qiskit.quantum_info import Operator
    from qdiff.circuits.unitary import unitary
    text = MOD3_HEAD + "\n".join(statements) + "\n"
    imp = qasm.loads(text)
    want = Operator(qasm3.loads(text).reverse_bits()).data
    got = unitary(imp.circuit, torch.zeros(imp.circuit.num_params, dtype=torch.float64)).numpy()
    assert close_up_to_phase(got, want, atol=1e-10), text


def test_unsupported_statements_name_their_line_wherever_they_stand():
    head = 'OPENQASM 2.0;\ninclude "qelib1.inc";\nqreg q[2];\n'
    cases = ((head + "opaque bar a;\n// bar q[0];\nh q[0];\nbar q[1];\n", r"f\.qasm:7: .*'bar'"),
             (head + "h q[0]; reset q[0];\n", r"f\.qasm:4: .*reset"),
             (head + "h q[0];\ngate g a { h a; }\n  g q[0]; reset q[0];\n", r"f\.qasm:6: .*reset"))
    for text, match in cases:
        with pytest.raises(QdiffError, match=match):
            qasm.loads(text, "f.qasm")


def test_refused_openqasm3_statements_name_their_line():
    head = 'OPENQASM 3.0;\ninclude "stdgates.inc";\nqubit[2] q;\nbit c;\n'
    cases = ((head + "h q[0];\nfor uint i in [0:1] { h q[0]; }\n", r"^f\.qasm:6: .*for_loop"),
             (head + "h q[0];\nbox { x q[0]; }\n", r"^f\.qasm:6: .*box"),
             (head + "h q[0];\nc = measure q[0];\ncx q[0], q[1];\n", r"^f\.qasm:6: .*measured"))
    for text, match in cases:
        with pytest.raises(QdiffError, match=match):
            qasm.loads(text, "f.qasm")


def test_a_reset_line_is_named_only_when_it_is_the_one_reset():
    head = 'OPENQASM 2.0;\ninclude "qelib1.inc";\nqreg q[2];\n'
    text = head + "reset q;\nh q[0];\nreset q[0];\n"  # the first reset (fresh qubits) runs
    with pytest.raises(QdiffError, match=r"^f\.qasm: .*reset"):
        qasm.loads(text, "f.qasm")


def test_an_infinite_global_phase_is_refused():
    src = 'OPENQASM 3.0;\ninclude "stdgates.inc";\nqubit[1] q;\ngphase(1e400);\nh q[0];\n'
    with pytest.raises(qd.QdiffError, match="global phase"):
        qasm.loads(src)


def test_the_global_phases_of_expanded_definitions_are_kept():
    """Gates that run through their Qiskit definition (GlobalPhaseGate, RVGate, DiagonalGate,
    UCGate, StatePreparation, Isometry, a custom gate) keep the definition's global phase: the
    import exports to the very unitary of the circuit (Qiskit's Operator, phase included). A
    phase inside a classically conditioned body is not a global phase and is left out."""
    from qiskit import QuantumCircuit
    from qiskit.circuit import Parameter
    from qiskit.circuit import library as lib
    from qiskit.quantum_info import Operator, random_unitary
    a = Parameter("a")
    custom = QuantumCircuit(1, global_phase=0.25 + a)
    custom.rx(a, 0)
    qc = QuantumCircuit(3, global_phase=0.1)
    qc.append(lib.GlobalPhaseGate(0.4), [])
    qc.append(lib.RVGate(0.1, 0.2, 0.3), [0])
    qc.append(lib.DiagonalGate([1, 1j, -1, np.exp(0.3j)]), [1, 2])
    qc.append(lib.UCGate([np.eye(2), lib.XGate().to_matrix()]), [2, 0])
    qc.append(lib.StatePreparation([0.5, 0.5, 0.5j, -0.5]), [0, 1])
    qc.append(lib.Isometry(random_unitary(4, seed=1).data[:, :2], 0, 0), [1, 2])
    qc.append(custom.to_gate(), [2])
    imp = from_qiskit(qc)
    got = Operator(to_qiskit(imp, theta=[0.7])).data
    want = Operator(qc.assign_parameters([0.7])).data
    assert np.allclose(got, want, atol=1e-12)
    dyn = QuantumCircuit(1, 1)
    dyn.h(0)
    dyn.measure(0, 0)
    with dyn.if_test((dyn.clbits[0], 1)):
        dyn.append(lib.GlobalPhaseGate(0.4), [])
        dyn.x(0)
    assert from_qiskit(dyn).global_phase == 0.0


def test_openqasm3_export_keeps_the_phase_the_circuit_gathers():
    """A GlobalPhase gate of a plain Circuit becomes the export's gphase (Qiskit's exporter
    writes none), so the text reloads with the same unitary, phase included."""
    from qdiff.circuits import Circuit, Operation
    from qdiff.circuits.gates import get_gate
    circ = Circuit(1, (Operation(get_gate("hadamard"), (0,), ()),
                       Operation(get_gate("globalphase"), (0,), (0.3,))), num_params=0)
    text = qasm.dumps(circ, version=3)
    assert "gphase(" in text
    back = qasm.loads(text)
    assert math.isclose(back.global_phase % (2 * math.pi), (-0.3) % (2 * math.pi), abs_tol=1e-12)


@pytest.mark.parametrize("version", [2, 3])
def test_barriers_round_trip_and_leave_simulation_alone(version):
    import qdiff as qd
    header = ('OPENQASM 2.0;\ninclude "qelib1.inc";\nqreg q[3];\n' if version == 2 else
              'OPENQASM 3.0;\ninclude "stdgates.inc";\nqubit[3] q;\n')
    text = header + "barrier q;\nh q[0];\nbarrier q[0], q[2];\nry(0.4) q[2];\ncx q[0], q[1];\n" \
        "barrier q[1];\n"
    imp = qasm.loads(text)
    assert imp.circuit.barriers == ((0, (0, 1, 2)), (1, (0, 2)), (3, (1,)))
    again = qasm.loads(qasm.dumps(imp, version=version))
    assert again.circuit.barriers == imp.circuit.barriers
    assert [o.name for o in again.circuit.operations] == ["h", "ry", "cx"]
    plain = qasm.loads(header + "h q[0];\nry(0.4) q[2];\ncx q[0], q[1];\n")
    obs = [qd.Z(0) @ qd.Z(1), qd.X(2)]
    dev = qd.device("statevector", wires=3)
    run = [qd.qnode(dev, observables=obs)(i)(torch.zeros(0)) for i in (imp, plain)]
    assert torch.allclose(run[0], run[1], atol=0)


@pytest.mark.parametrize("definition, call", [
    ("gate sxdg a { s a; h a; s a; }", "sxdg q[0];"),
    ("gate iswap a, b { s a; s b; h a; cx a, b; cx b, a; h b; gphase(0.4); }", "iswap q[0], q[1];"),
    ("gate rzz(t) a, b { cx a, b; rz(t) b; cx a, b; gphase(1.0); }",
     "rzz(0.7) q[1], q[0];"),
])
def test_user_definition_of_a_standard_gate_keeps_its_phase(definition, call):
    """A user definition that is a standard gate times a constant phase runs as that gate with
    the phase in the import's global phase: the same operator as Qiskit's, phase included."""
    from qiskit import qasm3
    from qiskit.quantum_info import Operator
    src = f'OPENQASM 3.0;\ninclude "stdgates.inc";\n{definition}\nqubit[2] q;\nh q[1];\n{call}\n'
    imp = qasm.loads(src)
    assert len(imp.circuit.operations) == 2
    assert np.allclose(Operator(to_qiskit(imp)).data, Operator(qasm3.loads(src)).data,
                       atol=1e-10)


def test_user_definition_with_a_parameter_dependent_phase_keeps_it():
    from qiskit import qasm3
    from qiskit.quantum_info import Operator
    src = ('OPENQASM 3.0;\ninclude "stdgates.inc";\n'
           'gate rzz(t) a, b { cx a, b; rz(t) b; cx a, b; gphase(t); }\n'
           'qubit[3] q;\nh q;\nrzz(0.9) q[0], q[1];\nctrl @ rzz(0.4) q[2], q[1], q[0];\n')
    imp = qasm.loads(src)
    assert np.allclose(Operator(to_qiskit(imp)).data, Operator(qasm3.loads(src)).data,
                       atol=1e-10)
