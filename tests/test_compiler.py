"""Compiler passes and levels 0-2: every result is checked against an independent oracle
(Qiskit's Operator for unitaries, torch autograd for gradients)."""
import math

import numpy as np
import pytest
import torch

from qdiff.circuits import Circuit
from qdiff.circuits.gates import GATES
from qdiff.circuits.operation import Operation, ParamRef
from qdiff.circuits.qiskit_io import to_qiskit
from qdiff.compiler import (cancel_inverses, chain, commutative_cancellation, compile,
                            consolidate_2q, equivalence, fuse_1q, guarded, lower,
                            merge_rotations, parse_basis, remove_identities, translate)
from qdiff.compiler.ops import cx_count, op
from qdiff.circuits.errors import QdiffError


def qiskit_equiv(a: Circuit, b: Circuit) -> bool:
    from qiskit.quantum_info import Operator
    return Operator(to_qiskit(a)).equiv(Operator(to_qiskit(b)))


def names(c):
    return [o.name for o in c.operations]


def test_cancel_inverses_adjacent_only():
    c = Circuit(2, (op("h", (0,)), op("cx", (0, 1)), op("cx", (0, 1)), op("h", (0,)),
                    op("s", (1,)), op("x", (0,)), op("sdg", (1,))))
    out = cancel_inverses(c)
    assert names(out) == ["x"] or sorted(names(out)) == ["x"]
    assert qiskit_equiv(c, out)


def test_merge_rotations_keeps_paramref_affine():
    c = Circuit(1, (op("rz", (0,), (ParamRef(0, 2.0, 0.1),)), op("rz", (0,), (ParamRef(0, 1.0),)),
                    op("t", (0,))), num_params=1)
    out = merge_rotations(c)
    assert len(out.operations) == 1
    p = out.operations[0].params[0]
    assert isinstance(p, ParamRef) and p.index == 0 and p.scale == 3.0
    assert math.isclose(p.offset, 0.1 + math.pi / 4)


def test_remove_identities():
    c = Circuit(2, (op("rz", (0,), (2 * math.pi,)), op("id", (1,)), op("rx", (1,), (0.0,)),
                    op("u3", (0,), (0.0, 0.3, -0.3)), op("cx", (0, 1))))
    assert names(remove_identities(c)) == ["cx"]


def test_commutation_through_cx():
    c = Circuit(2, (op("t", (0,)), op("x", (1,)), op("cx", (0, 1)), op("tdg", (0,)),
                    op("x", (1,)), op("cx", (0, 1)), op("cx", (0, 1))))
    out = commutative_cancellation(c)
    assert names(out) == ["cx"]
    assert qiskit_equiv(c, out)


def test_no_commutation_through_h():
    c = Circuit(1, (op("t", (0,)), op("h", (0,)), op("tdg", (0,))))
    assert len(commutative_cancellation(c).operations) == 3


def test_fuse_1q_canonical_forms():
    c = Circuit(2, (op("h", (0,)), op("s", (0,)), op("sdg", (0,)), op("h", (0,)),
                    op("h", (1,)), op("t", (1,))))
    out = fuse_1q(c)
    assert names(out) == ["u3"]
    assert qiskit_equiv(c, out)


def test_consolidate_2q_reaches_kak_count():
    rng = np.random.default_rng(0)
    ops = []
    for _ in range(6):
        ops += [op("u3", (0,), tuple(rng.uniform(-3, 3, 3))), op("cx", (0, 1)),
                op("u3", (1,), tuple(rng.uniform(-3, 3, 3))), op("cx", (1, 0))]
    c = Circuit(2, tuple(ops))
    out = consolidate_2q(c)
    assert cx_count(out.operations) <= 3
    assert qiskit_equiv(c, out)


@pytest.mark.parametrize("name", sorted(n for n, g in GATES.items() if n != "unitary"))
def test_lower_every_registered_gate(name):
    g = GATES[name]
    rng = np.random.default_rng(1)
    params = tuple(float(x) for x in rng.uniform(-2, 2, g.num_params))
    c = Circuit(g.num_wires, (Operation(g, tuple(range(g.num_wires)), params),))
    low = lower(c)
    assert all(len(o.wires) == 1 or o.name == "cx" for o in low.operations)
    assert equivalence(c, low, "unitary").ok


@pytest.mark.parametrize("name", ["rx", "ry", "rz", "crz", "cry", "rzz", "rxx", "cp",
                                  "single_excitation", "u3", "isingxy", "pswap",
                                  "cphaseshift00", "single_excitation_minus",
                                  "double_excitation_plus", "orbital_rotation",
                                  "fermionic_swap", "globalphase"])
def test_lower_parametric_gates_keeps_paramrefs(name):
    g = GATES[name]
    params = tuple(ParamRef(i, 0.5 + i, 0.2) for i in range(g.num_params))
    c = Circuit(g.num_wires, (Operation(g, tuple(range(g.num_wires)), params),),
                num_params=g.num_params)
    low = lower(c)
    assert all(o.name in ("cx", "rz") or not any(isinstance(p, ParamRef) for p in o.params)
               for o in low.operations)
    assert equivalence(c, low, "unitary").ok


@pytest.mark.parametrize("basis", ["cx,u", "rz,sx,x,cx", "cz,rz,sx,x", "ecr,rz,sx,x",
                                   "cx,rz,ry", "cx,h,rz,x", "cx,p,sx"])
def test_translate_into_basis(basis):
    rng = np.random.default_rng(2)
    ops = [op("h", (0,)), op("ccx", (0, 1, 2)), op("u3", (1,), tuple(rng.uniform(-3, 3, 3))),
           op("crz", (2, 0), (0.7,)), op("t", (2,)), op("swap", (0, 2))]
    c = Circuit(3, tuple(ops))
    out, rep = compile(c, level=2, basis=basis)
    b = parse_basis(basis)
    assert {o.name if o.name != "u3" else "u" for o in out.operations} <= set(b.names) | {"u"}
    if "u" not in b.names:
        assert "u3" not in names(out)
    assert rep.verified and qiskit_equiv(c, out)


def test_clifford_t_basis_snaps_phases():
    c = Circuit(2, (op("h", (0,)), op("t", (0,)), op("cx", (0, 1)), op("s", (1,)),
                    op("h", (1,))))
    out, rep = compile(c, level=2, basis="cx,h,s,sdg,t,tdg,z,x")
    assert set(names(out)) <= {"cx", "h", "s", "sdg", "t", "tdg", "z", "x"}
    assert rep.verified and qiskit_equiv(c, out)


CLIFFORD_T = "h,s,sdg,t,tdg,cx"


@pytest.mark.parametrize("phi", range(-4, 5))
@pytest.mark.parametrize("lam", range(-4, 5, 2))
def test_clifford_t_u3_with_theta_pi(phi, lam):
    """u3(pi, phi, lam) depends on phi - lam only: with phi, lam multiples of pi/4 it is an
    exact Clifford+T gate (u3(pi, pi/4, 0) = X S T up to phase)."""
    c = Circuit(1, (op("u3", (0,), (math.pi, phi * math.pi / 4, lam * math.pi / 4)),))
    for level in (0, 2):
        out, rep = compile(c, level=level, basis=CLIFFORD_T)
        assert set(names(out)) <= {"h", "s", "sdg", "t", "tdg"}
        assert rep.verified and qiskit_equiv(c, out)


@pytest.mark.parametrize("seed", range(12))
def test_random_clifford_t_products_compile_in_clifford_t(seed):
    """Products of Clifford+T gates, written as named gates and as u3 with angles in
    multiples of pi/4, compile exactly into Clifford+T at levels 0-2."""
    rng = np.random.default_rng(seed)
    ops = []
    for _ in range(14):
        w = int(rng.integers(2))
        r = rng.random()
        if r < 0.15:
            ops.append(op("cx", (w, 1 - w)))
        elif r < 0.55:
            ops.append(op("u3", (w,), tuple(float(k) * math.pi / 4
                                             for k in rng.integers(-8, 9, size=3))))
        else:
            ops.append(op(str(rng.choice(["h", "s", "sdg", "t", "tdg", "x", "y", "z", "sx"])),
                          (w,)))
    c = Circuit(2, tuple(ops))
    for level in (0, 1, 2):
        out, rep = compile(c, level=level, basis=CLIFFORD_T)
        assert set(names(out)) <= {"cx", "h", "s", "sdg", "t", "tdg"}
        assert rep.verified and qiskit_equiv(c, out)


@pytest.mark.parametrize("level", [0, 2])
def test_clifford_t_refuses_a_gate_1e10_from_a_clifford(level):
    """u3(pi/2 + 1e-10, 0, pi) is 1e-10 rad from h, above rounding: no exact Clifford+T word
    writes it, and the error shows the angle to the digits that differ from pi/2."""
    c = Circuit(1, (op("u3", (0,), (math.pi / 2 + 1e-10, 0.0, math.pi)),))
    with pytest.raises(QdiffError, match=r"rotation by 1\.5707963268\d* rad is not a multiple "
                                         r"of pi/4"):
        compile(c, level=level, basis=CLIFFORD_T)


def test_bad_basis_message():
    with pytest.raises(QdiffError, match="two-qubit"):
        parse_basis("u,rz")
    with pytest.raises(QdiffError, match="one-qubit"):
        parse_basis("cx,rz")


def test_a_basis_naming_an_unknown_gate_is_refused_by_name():
    """A misspelt gate is not silently left out of the basis; gates the output does not use
    (Qiskit's or qdiff's) and a device list's instructions are accepted, as in Qiskit."""
    with pytest.raises(QdiffError, match="unknown gate 'sxx'"):
        parse_basis("cx,rz,sxx")
    with pytest.raises(QdiffError, match="unknown gate 'foo'"):
        compile('OPENQASM 2.0; include "qelib1.inc"; qreg q[2]; cx q[0],q[1];', basis="cx,u,foo")
    b = parse_basis("cx,rz,sx,x,rzx,swap,id,measure,delay,reset")
    assert (b.two_q, b.euler) == ("cx", "ZSXX")
    # another name of a gate (PennyLane's CNOT, Hadamard) is that gate; u stays Qiskit's u
    b = parse_basis("CNOT,Hadamard,rz")
    assert (b.two_q, b.euler, "u3" in parse_basis("cnot,u").names) == ("cx", "HRZ", False)


@pytest.mark.parametrize("level", [0, 1, 2])
def test_levels_equivalent_and_not_worse(level):
    from qiskit.circuit.random import random_circuit
    from qdiff.circuits.qiskit_io import from_qiskit
    qc = random_circuit(4, 12, max_operands=3, seed=7)
    c = from_qiskit(qc).circuit
    out, rep = compile(c, level=level)
    assert rep.verified
    assert rep.cx_after <= rep.cx_before
    from qiskit.quantum_info import Operator
    assert Operator(qc).equiv(Operator(to_qiskit(out)))


def test_level2_beats_level0_on_redundant_circuit():
    ops = []
    for _ in range(5):
        ops += [op("cx", (0, 1)), op("rz", (1,), (0.3,)), op("cx", (0, 1))]
    c = Circuit(2, tuple(ops))
    out, rep = compile(c, level=2)
    assert rep.cx_before == 10 and rep.cx_after == 2


def test_verification_detects_difference_both_methods():
    a = Circuit(3, (op("cx", (0, 1)), op("t", (2,))))
    b = Circuit(3, (op("cx", (1, 0)), op("t", (2,))))
    for method in ("unitary", "statevector"):
        assert not equivalence(a, b, method).ok
        assert equivalence(a, a, method).ok
    # a global phase is not a difference
    assert equivalence(Circuit(1, (op("rz", (0,), (0.4,)),)),
                       Circuit(1, (op("p", (0,), (0.4,)),)), "unitary").ok


def test_guarded_pass_falls_back_on_wrong_result():
    def broken(c):
        return c.with_operations(c.operations[:-1])
    broken.__name__ = "broken"
    c = Circuit(2, (op("h", (0,)), op("cx", (0, 1))))
    log = []
    assert guarded(broken, "auto", log)(c) is c
    assert "not verified" in log[0]


def test_chain_composes_in_order():
    c = Circuit(1, (op("h", (0,)), op("rz", (0,), (0.0,)), op("h", (0,))))
    p = chain(remove_identities, cancel_inverses)
    assert p(c).operations == ()


def _expval_z(circuit: Circuit, theta: torch.Tensor, wire: int) -> torch.Tensor:
    from qdiff.backends.statevector.simulate import simulate
    state = simulate(circuit, theta)
    probs = state.abs() ** 2
    n = circuit.num_wires
    signs = torch.tensor([1.0 - 2.0 * ((i >> (n - 1 - wire)) & 1) for i in range(2 ** n)],
                         dtype=torch.float64)
    return (probs * signs).sum(-1)


def test_parametric_circuit_keeps_gradients():
    p = [ParamRef(0), ParamRef(1), ParamRef(2, 0.5, 0.1)]
    ops = (op("h", (0,)), op("rx", (0,), (p[0],)), op("cx", (0, 1)), op("rz", (1,), (p[1],)),
           op("rz", (1,), (p[2],)), op("cx", (0, 1)), op("ry", (2,), (p[0],)),
           op("crz", (2, 1), (p[1],)), op("rzz", (0, 2), (p[2],)), op("cx", (0, 1)),
           op("cx", (0, 1)))
    c = Circuit(3, ops, num_params=3)
    out, rep = compile(c, level=2)
    assert rep.verified and rep.cx_after < rep.cx_before
    assert out.num_params == 3
    assert all(isinstance(q, (float, ParamRef)) for o in out.operations for q in o.params)
    theta = torch.tensor([[0.3, -0.8, 1.1]], dtype=torch.float64, requires_grad=True)
    for wire in range(3):
        f0 = _expval_z(c, theta, wire)
        g0, = torch.autograd.grad(f0.sum(), theta)
        f1 = _expval_z(out, theta, wire)
        g1, = torch.autograd.grad(f1.sum(), theta)
        assert torch.allclose(f0, f1, atol=1e-10)
        assert torch.allclose(g0, g1, atol=1e-10)


def test_compile_accepts_qasm_text_and_qiskit():
    from qiskit import QuantumCircuit
    qc = QuantumCircuit(2)
    qc.h(0)
    qc.cx(0, 1)
    qc.cx(0, 1)
    out, rep = compile(qc, level=1)
    assert rep.cx_after == 0
    src = 'OPENQASM 2.0; include "qelib1.inc"; qreg q[2]; creg c[2]; h q[0]; measure q -> c;'
    out, rep = compile(src)
    assert rep.measurements == [(0, 0), (1, 1)] and rep.num_clbits == 2


def test_compile_rejects_bad_arguments():
    c = Circuit(1, ())
    with pytest.raises(QdiffError, match="level"):
        compile(c, level=5)
    with pytest.raises(QdiffError, match="verify"):
        compile(c, verify="maybe")


def test_qd_compile_is_exported():
    import qdiff as qd
    assert qd.compile is compile


def test_u1_u2_u3_basis_uses_all_three():
    c = Circuit(1, (op("p", (0,), (0.4,)), op("h", (0,)), op("rz", (0,), (0.3,))))
    out, rep = compile(c, level=0, basis="u1,u2,u3,cx")
    assert names(out) == ["u1", "u2", "u1"]
    assert rep.verified and qiskit_equiv(c, out)


@pytest.mark.parametrize("folder", ["run;1", "OPENQASM_tests"])
def test_compile_a_path_whose_name_looks_like_qasm(tmp_path, folder):
    src = 'OPENQASM 2.0;\ninclude "qelib1.inc";\nqreg q[2];\nh q[0];\ncx q[0],q[1];\n'
    p = tmp_path / folder / "in.qasm"
    p.parent.mkdir()
    p.write_text(src)
    out, rep = compile(str(p), level=1)
    assert rep.verified and rep.cx_after == 1 and rep.num_qubits == 2


def test_compile_refuses_mid_circuit_measurements_by_name():
    import qdiff as qd
    from qdiff.qnode import record_circuit

    def f(x):
        qd.RY(x, 0)
        m = qd.measure(0)
        qd.cond(m, qd.RX)(0.7, wires=1)
        return qd.probs(wires=[0, 1])

    rec = record_circuit(f, 2, torch.tensor(0.9, dtype=torch.float64))
    with pytest.raises(qd.QdiffError, match="compile: the circuit measures mid-circuit"):
        qd.compile(rec.circuit)



@pytest.mark.parametrize("level", [0, 2])
def test_compile_keeps_the_measurements_of_a_recorded_circuit(level):
    import qdiff as qd
    from qdiff.qnode import record_circuit

    def f(x):
        qd.RX(x, wires=0)
        qd.CNOT(wires=[0, 1])
        qd.CNOT(wires=[0, 1])
        qd.RY(0.3, wires=1)
        return qd.expval(qd.Z(0) @ qd.Z(1)), qd.probs(wires=[1])

    rec = record_circuit(f, 2, torch.tensor(0.9, dtype=torch.float64))
    out, rep = compile(rec.circuit, level=level)
    assert rep.verified and out.measurements == rec.circuit.measurements

BARRIER_QASM = """OPENQASM 2.0;
include "qelib1.inc";
qreg q[3];
creg c[3];
h q[0];
cx q[0], q[1];
barrier q[0], q[1];
cx q[0], q[1];
h q[0];
rz(0.3) q[2];
barrier q;
rz(0.4) q[2];
measure q -> c;
"""


def _instructions(text):
    """``[(name, qubit indices)]`` of an OpenQASM 2 text, as Qiskit reads it."""
    import qiskit.qasm2
    qc = qiskit.qasm2.loads(text, custom_instructions=qiskit.qasm2.LEGACY_CUSTOM_INSTRUCTIONS)
    return [(i.operation.name, [qc.find_bit(q).index for q in i.qubits]) for i in qc.data]


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_barriers_are_kept_and_nothing_moves_across_them(level):
    """As Qiskit's transpiler: a barrier is written where it stood and no gate is cancelled,
    merged or commuted across it (the CX pair and the two rz around barriers stay apart)."""
    from qdiff.circuits import qasm
    from qdiff.circuits.qiskit_io import to_qiskit as export
    from qiskit.quantum_info import Operator
    imp = qasm.loads(BARRIER_QASM)
    assert imp.circuit.barriers == ((2, (0, 1)), (5, (0, 1, 2)))
    out, rep = compile(imp, level=level)
    assert rep.verified and rep.barriers == 2 and rep.cx_after == 2
    text = qasm.dumps(out)
    seq = _instructions(text)
    bars = [i for i, (name, _) in enumerate(seq) if name == "barrier"]
    assert [seq[i][1] for i in bars] == [[0, 1], [0, 1, 2]]
    before = [s for s in seq[:bars[0]] if s[0] == "cx"]
    between = [s for s in seq[bars[0]:bars[1]] if s[0] == "cx"]
    assert len(before) == 1 and len(between) == 1
    # the rz after the full barrier is still after it: one rotation on q[2] each side
    assert any(2 in w for n, w in seq[bars[1] + 1:]) and any(2 in w for n, w in seq[:bars[1]])
    assert Operator(export(out)).equiv(Operator(export(imp.circuit)))
    # optimizing across them: the CX pair cancels, the rotations merge
    free, rep2 = compile(imp, level=level, keep_barriers=False)
    assert rep2.verified and rep2.barriers == 0 and free.barriers == ()
    if level >= 1:
        assert rep2.cx_after == 0
    assert "barrier" not in qasm.dumps(free)


def test_barriers_survive_routing_to_a_device():
    from qdiff.circuits import qasm
    out, rep = compile(qasm.loads(BARRIER_QASM), level=2, target="fake_manila")
    assert rep.verified and rep.barriers == 2 and out.num_wires == 5
    seq = _instructions(qasm.dumps(out))
    assert [n for n, _ in seq].count("barrier") == 2 and rep.cx_after >= 2


def test_barriers_on_idle_qubits_survive_routing():
    """Qiskit's transpiler keeps a barrier on the device qubits of every wire it names, idle
    ones included (and a circuit of barriers only keeps them all)."""
    from qiskit import QuantumCircuit
    from qdiff.compiler.target import route
    from qdiff.circuits.qiskit_io import from_qiskit
    qc = QuantumCircuit(4, 3)
    qc.h(0)
    qc.cx(0, 1)
    qc.barrier(0, 1, 3)  # wire 3 has no gate and no measurement
    qc.cx(0, 2)
    qc.barrier()
    qc.measure(range(3), range(3))
    routed = route(from_qiskit(qc), "fake_manila").imported.circuit
    out, rep = compile(qc, level=2, target="fake_manila")
    assert rep.verified and rep.barriers == 2
    assert [set(w) for _, w in out.barriers] == [set(w) for _, w in routed.barriers]
    assert [len(w) for _, w in out.barriers] == [3, 4]
    only = QuantumCircuit(2)
    only.barrier()
    only.barrier(1)
    out, rep = compile(only, target="fake_manila")
    assert [len(w) for _, w in out.barriers] == [2, 1] and rep.barriers == 2
    # a wide circuit using two qubits is still optimized and verified on those two
    wide = QuantumCircuit(30)
    wide.h(0)
    wide.cx(0, 1)
    wide.barrier()
    wide.cx(0, 1)
    out, rep = compile(wide, target="fake_sherbrooke")
    assert rep.verified and rep.num_qubits == 2 and rep.cx_after == 2
    assert [len(w) for _, w in out.barriers] == [30]


@pytest.mark.parametrize("level", [0, 2])
def test_target_keeps_the_input_parameter_columns(level):
    """Qiskit's routing drops the parameters no gate uses (one read only by the global phase,
    one used only inside angle expressions): the output's angles still refer to the input's
    own theta columns, so the output bound at any values equals the bound input compiled."""
    from qiskit import QuantumCircuit
    from qiskit.circuit import Parameter
    from qiskit.quantum_info import Operator
    from qdiff.circuits.qiskit_io import from_qiskit
    a, b, c = Parameter("a"), Parameter("b"), Parameter("c")
    qc = QuantumCircuit(2)
    qc.global_phase = a
    qc.rx(b, 0)
    qc.cx(0, 1)
    qc.rz(b * c, 1)
    qc.ry(c, 0)
    imp = from_qiskit(qc, dynamic=False)
    out, rep = compile(qc, level=level, target="fake_manila")
    assert rep.verified and out.num_params == imp.circuit.num_params == 4
    assert rep.method == "unitary at 2 random parameter bindings"  # a sample, and says so
    for values in ([0.3, 1.1, -0.7], [-2.0, 0.4, 2.5]):
        theta = imp.theta(torch.tensor([values], dtype=torch.float64))[0]
        ref, _ = compile(qc.assign_parameters(dict(zip((a, b, c), values))), level=0,
                         target="fake_manila")
        assert Operator(to_qiskit(out, theta=theta)).equiv(Operator(to_qiskit(ref)))


@pytest.mark.parametrize("level", [0, 1, 2])
def test_target_output_uses_the_device_gate_directions_at_every_level(level):
    """Every two-qubit gate of the output is one the device has, in its direction (ECR is not
    symmetric), the rebased input of level 0 included."""
    from qdiff.compiler.target import device_backend
    src = ('OPENQASM 2.0; include "qelib1.inc"; qreg q[3]; h q[0]; cx q[0],q[1]; '
           'cx q[1],q[2]; cx q[2],q[0]; cx q[1],q[0];')
    pairs = set(device_backend("fake_sherbrooke").target["ecr"].keys())
    out, rep = compile(src, level=level, target="fake_sherbrooke")
    assert rep.verified and rep.two_q == "ecr" and rep.cx_after > 0
    two = [o for o in out.operations if len(o.wires) == 2]
    assert {o.name for o in two} == {"ecr"}
    assert all(o.wires in pairs for o in two), [o.wires for o in two if o.wires not in pairs]


def test_a_device_coupling_pairs_by_different_two_qubit_gates_is_refused():
    """fake_cairo has CX on some pairs and ECR on the others: one two-qubit gate cannot be
    written on all of them, and the refusal names the gates."""
    src = 'OPENQASM 2.0; include "qelib1.inc"; qreg q[2]; h q[0]; cx q[0],q[1];'
    with pytest.raises(QdiffError, match=r"fake_cairo.*cx on \d+ pairs; ecr"):
        compile(src, level=1, target="fake_cairo")


def test_a_barrier_on_no_qubit_is_not_written():
    from qdiff.circuits.qiskit_io import to_qiskit as export
    c = Circuit(2, (op("h", (0,)),), barriers=((1, ()), (1, (1,))))
    assert [len(i.qubits) for i in export(c).data if i.operation.name == "barrier"] == [1]

def test_qiskit_circuits_keep_their_barriers_through_compile():
    from qiskit import QuantumCircuit
    from qdiff.circuits.qiskit_io import to_qiskit as export
    qc = QuantumCircuit(2)
    qc.x(0)
    qc.barrier()
    qc.x(0)
    qc.cx(0, 1)
    qc.barrier(1)
    qc.cx(0, 1)
    out, rep = compile(qc)
    back = export(out)
    assert [i.operation.name for i in back.data].count("barrier") == 2
    assert rep.cx_after == 2 and rep.verified
    assert sum(1 for i in back.data if i.operation.name == "barrier") == 2


def test_a_barrier_out_of_range_is_refused():
    with pytest.raises(QdiffError, match="barrier on wires \\[0, 3\\]"):
        Circuit(2, (op("h", (0,)),), barriers=((1, (0, 3)),))
    with pytest.raises(QdiffError, match="position 2"):
        Circuit(2, (op("h", (0,)),), barriers=((2, (0,)),))
    c = Circuit(2, (op("h", (0,)),), barriers=((1, (0, 1)),))
    assert c.with_operations(c.operations).barriers == ()  # new operations: no old barriers
    with pytest.raises(QdiffError, match="keep_barriers 'no': expected True or False"):
        compile(c, keep_barriers="no")
