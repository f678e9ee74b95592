"""Exactness, approximation budgets, work budgets and the differentiable template unitary.

Oracles: full unitaries (numpy), closed forms for rotation distances, torch autograd Jacobians."""
import math

import numpy as np
import pytest
import torch

from qdiff.circuits import Circuit
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.gates import GATES
from qdiff.circuits.operation import Operation, ParamRef
from qdiff.circuits.unitary import unitary, unitary_jacobian
from qdiff.compiler import compile, equivalence
from qdiff.compiler.blocks import block_unitary
from qdiff.compiler.budget import Budget, Work, phase_distance, rotation_distance
from qdiff.compiler.ops import op


def _gadget(a, b, c, angle):
    """exp(-i angle Z_a Z_b Z_c / 2) with a CX ladder (4 CX), as in chemistry circuits."""
    return [op("cx", (a, b)), op("cx", (b, c)), op("rz", (c,), (angle,)), op("cx", (b, c)),
            op("cx", (a, b))]


def _uccsd_like(small=2.5e-5):
    ops = [op("h", (0,)), op("h", (2,))]
    for i, s in enumerate([small, -small, 4 * small, -4 * small, small]):
        ops += _gadget(0, 1, 2, s) + [op("h", (i % 3,)), op("s", ((i + 1) % 3,))]
        ops += _gadget(1, 2, 3, -s) + [op("h", (3,))]
    return Circuit(4, tuple(ops))


def _true_infidelity(a, b):
    ua, ub = block_unitary(a.operations, tuple(range(a.num_wires))), \
        block_unitary(b.operations, tuple(range(b.num_wires)))
    t = abs(np.trace(ua.conj().T @ ub)) / ua.shape[0]
    return (1 - t) * (1 + t)


@pytest.mark.parametrize("level", [1, 2, 3])
def test_small_rotations_survive_every_level(level):
    c = _uccsd_like()
    out, rep = compile(c, level=level, work=200)
    assert rep.verified and rep.method == "unitary" and rep.infidelity <= 1e-12
    assert _true_infidelity(c, out) <= 1e-12  # independent of the compiler's own check
    dropped = _true_infidelity(c, Circuit(4, tuple(o for o in c.operations if o.name != "rz")))
    assert dropped > 1e-10  # dropping the rotations would have been caught


def test_verifier_sees_a_1e5_rotation_with_both_methods():
    a = Circuit(3, (op("h", (0,)), op("cx", (0, 1)), op("rz", (1,), (1e-5,)), op("cx", (0, 1))))
    b = Circuit(3, (op("h", (0,)),))
    for method in ("unitary", "statevector"):
        v = equivalence(a, b, method)
        assert not v.ok
        assert v.infidelity == pytest.approx(math.sin(0.5e-5) ** 2, rel=0.8 if
                                             method == "statevector" else 1e-6)


def test_statevector_reading_is_unbiased_for_the_process_infidelity():
    # E[1 - |<psi|W|psi>|^2] = d/(d+1) (1 - |Tr W|^2/d^2): the mean of many readings matches
    rng = np.random.default_rng(0)
    a = Circuit(4, (op("rz", (2,), (0.02,)), op("cx", (2, 3))))
    b = Circuit(4, (op("cx", (2, 3)),))
    exact = equivalence(a, b, "unitary").infidelity
    reads = [equivalence(a, b, "statevector", seed=int(s), num_states=1).infidelity
             for s in rng.integers(0, 10 ** 6, 200)]
    assert np.mean(reads) == pytest.approx(exact, rel=0.25)


def test_approx_spends_its_budget_and_reports_it():
    c = _uccsd_like(small=2e-4)
    exact, rep0 = compile(c, level=2)
    out, rep = compile(c, level=2, approx=1e-6)
    assert rep.cx_after < rep0.cx_after
    assert rep.verified and rep.infidelity <= 1e-6
    assert _true_infidelity(c, out) <= rep.approx_bound + 1e-12 <= 1e-6 + 1e-12
    assert rep.approx == 1e-6 and "approx" in rep.summary()


def test_approx_bound_covers_what_uncharged_candidates_change():
    # above 4 qubits Qiskit's O3 is a level-3 candidate; it snaps controlled rotations of
    # 3e-5 rad to the identity (1-F ~ 2e-9 here) without charging the budget, so under
    # approx it must still match its source to rounding, or the bound would not hold
    n = 9
    ops = [op("h", (i,)) for i in range(n)]
    for _ in range(2):
        ops += [op("crz", (i, i + 1), (3e-5,)) for i in range(n - 1)]
        ops += [op("t", (i,)) for i in range(n)]
    c = Circuit(n, tuple(ops))
    out, rep = compile(c, level=3, approx=1e-8)
    assert rep.verified and not rep.strategy.startswith("qiskit")
    assert _true_infidelity(c, out) <= rep.approx_bound + 1e-12 <= 1e-8 + 1e-12
    # without the check, the exact search does not take that candidate on trust either
    out, rep = compile(c, level=3, verify="none")
    assert rep.verified is None and _true_infidelity(c, out) <= 1e-12


@pytest.mark.parametrize("bad", [0, 1, -1e-3, 2.0, "x"])
def test_approx_must_be_a_budget(bad):
    with pytest.raises(QdiffError, match="approx"):
        compile(Circuit(1, ()), approx=bad)


def test_budget_bounds_the_process_infidelity():
    # (sum of distances)^2 bounds the process infidelity of the product of replacements
    rng = np.random.default_rng(1)
    angles = rng.uniform(-1e-3, 1e-3, 6)
    b = Budget(1.0)
    for a in angles:
        assert b.spend(rotation_distance(a))
    c = Circuit(2, tuple(op("rz" if i % 2 else "rx", (i % 2,), (float(a),)) for i, a in
                         enumerate(angles)))
    assert _true_infidelity(c, Circuit(2, ())) <= b.spent_bound
    u = block_unitary([op("rz", (0,), (0.3,))], (0,))
    assert phase_distance(u, np.eye(2)) == pytest.approx(rotation_distance(0.3), rel=1e-12)


def test_same_input_same_output_and_time_limit_is_reported():
    c = _uccsd_like(small=0.3)
    a, ra = compile(c, level=3, work=300)
    b, rb = compile(c, level=3, work=300)
    assert [(o.name, o.wires, o.params) for o in a.operations] == \
        [(o.name, o.wires, o.params) for o in b.operations]
    assert not ra.time_cut and ra.work <= 300 + 200  # the last fit may overrun a little
    _, rc = compile(c, level=3, time_limit=1e-6)
    assert rc.time_cut and rc.verified and "time limit" in rc.summary()


def test_work_budget_counts_units():
    w = Work(5)
    assert not w.exhausted
    w.take(5)
    assert w.exhausted and not w.cut


def _random_template(rng, n=3, m=5):
    ops = []
    for q in range(n):
        ops.append(Operation(GATES["u3"], (q,), (ParamRef(3 * q), ParamRef(3 * q + 1, -2.0, 0.5),
                                                 0.7)))
    for i in range(m):
        a, b = rng.choice(n, 2, replace=False)
        ops += [Operation(GATES["cx"], (int(a), int(b))),
                Operation(GATES["rz"], (int(b),), (ParamRef(int(rng.integers(0, 9)), 1.5),)),
                Operation(GATES["crx"], (int(b), int(a)), (ParamRef(2),))]
    return Circuit(n, tuple(ops), num_params=9)


def test_unitary_matches_the_numpy_product_and_jacobian_matches_autograd():
    rng = np.random.default_rng(4)
    c = _random_template(rng)
    x = torch.as_tensor(rng.uniform(-3, 3, (2, 9)))
    u, jac = unitary_jacobian(c, x)
    assert torch.allclose(u, unitary(c, x), atol=1e-14)
    bound = [Operation(o.gate, o.wires, tuple(p.scale * float(x[1, p.index]) + p.offset
                                             if isinstance(p, ParamRef) else p for p in o.params))
             for o in c.operations]
    assert np.allclose(u[1].numpy(), block_unitary(bound, (0, 1, 2)), atol=1e-13)
    ref = torch.autograd.functional.jacobian(lambda z: torch.view_as_real(unitary(c, z)), x[1])
    assert torch.allclose(torch.view_as_real(jac[1].permute(2, 0, 1)).permute(1, 2, 3, 0), ref,
                          atol=1e-12)


def test_unitary_rejects_bad_theta():
    c = _random_template(np.random.default_rng(0))
    with pytest.raises(QdiffError, match="theta"):
        unitary(c, torch.zeros(3))
    with pytest.raises(QdiffError, match="parameter"):
        unitary(c)


def test_approx_keeps_the_exact_result_when_the_budgeted_search_does_worse(monkeypatch):
    # the budgeted search may build other candidates than the exact one; whatever it finds,
    # the exact search's result is a candidate too
    from qdiff.compiler import api
    real = api._candidates

    def worse_when_budgeted(lowered, level, s, b, routed):
        out = real(lowered, level, s, b, routed)
        return out if s.budget.exact else out[:1]  # the budgeted search: level 1 only
    monkeypatch.setattr(api, "_candidates", worse_when_budgeted)
    c = _uccsd_like(small=0.3)
    _, rep0 = compile(c, level=3, work=200)
    out, rep = compile(c, level=3, work=200, approx=1e-6)
    assert rep.cx_after == rep0.cx_after and rep.strategy.endswith("(exact)")
    assert rep.approx_bound == 0.0 and _true_infidelity(c, out) <= 1e-12


def _small_angle_circuits():
    from hypothesis import strategies as st

    @st.composite
    def draw_circuit(draw):
        n = draw(st.integers(2, 4))
        ops = []
        for _ in range(draw(st.integers(1, 14))):
            a, b = draw(st.permutations(range(n)))[:2]
            kind = draw(st.sampled_from(["cx", "cx", "rz", "rx", "h", "gadget"]))
            angle = draw(st.sampled_from([1e-4, -3e-4, 2e-3, 0.7, -1.3]))
            if kind == "cx":
                ops.append(op("cx", (a, b)))
            elif kind == "gadget":
                ops += [op("cx", (a, b)), op("rz", (b,), (angle,)), op("cx", (a, b))]
            elif kind == "h":
                ops.append(op("h", (a,)))
            else:
                ops.append(op(kind, (a,), (angle,)))
        return Circuit(n, tuple(ops))
    return draw_circuit()


def test_approx_is_never_worse_than_exact():
    from hypothesis import HealthCheck, given, settings
    from qdiff.compiler.level3 import score

    @settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_small_angle_circuits())
    def check(c):
        ex, _ = compile(c, level=3, work=100)
        ap, rep = compile(c, level=3, work=100, approx=1e-5)
        assert score(ap) <= score(ex)
        assert _true_infidelity(c, ap) <= rep.approx_bound + 1e-12 <= 1e-5 + 1e-12
    check()


def _qiskit_equiv(qc_in, out):
    from qiskit.quantum_info import Operator
    from qdiff.circuits.qiskit_io import to_qiskit
    return Operator(qc_in).equiv(Operator(to_qiskit(out)))


@pytest.mark.parametrize("angle", [1e-6, 1e-5, 3e-8])
@pytest.mark.parametrize("level", [0, 2])
def test_small_two_qubit_unitary_gates_are_lowered_exactly(angle, level):
    """A UnitaryGate near the identity keeps its control: Qiskit's decomposer snaps it to a
    one-qubit gate (distance ~angle/4, process infidelity below 1e-12)."""
    from qiskit import QuantumCircuit
    from qiskit.circuit.library import CRXGate, UnitaryGate
    from qiskit.quantum_info import Operator
    qc = QuantumCircuit(2)
    qc.append(UnitaryGate(Operator(CRXGate(angle)).data), [0, 1])
    out, rep = compile(qc, level=level)
    assert rep.verified
    assert _qiskit_equiv(qc, out)
    u = block_unitary(out.operations, (0, 1))
    want = Operator(qc.reverse_bits()).data  # big-endian, as block_unitary
    assert phase_distance(u, want) <= 1e-11


def test_exact_synthesis_near_special_points():
    """Two-qubit unitaries within 1e-9 fidelity of the identity, CX and SWAP, and a 3-qubit
    controlled one, are reproduced to rounding."""
    from qiskit import QuantumCircuit
    from qiskit.circuit.library import CRXGate, CXGate, RXXGate, SwapGate
    from qiskit.quantum_info import Operator, random_unitary
    from qdiff.compiler.synth import exact_synthesis
    mats = [Operator(CRXGate(1e-6)).data, Operator(RXXGate(2e-7)).data,
            Operator(CXGate()).data @ Operator(RXXGate(1e-7)).data,
            Operator(SwapGate()).data @ Operator(CRXGate(3e-6)).data,
            random_unitary(4, seed=3).data]
    qc = QuantumCircuit(3)
    qc.append(CRXGate(1e-6).control(1), [0, 1, 2])
    mats.append(Operator(qc).data)
    for m in mats:
        k = int(np.log2(m.shape[0]))
        ops = exact_synthesis(m, tuple(range(k)))
        assert phase_distance(block_unitary(ops, tuple(range(k))), m) <= 1e-11


def test_qasm3_inverse_of_a_small_controlled_rotation_is_exact():
    from qiskit import qasm3
    src = ('OPENQASM 3.0;\ninclude "stdgates.inc";\nqubit[2] q;\n'
           'pow(-1) @ crx(1e-6) q[0], q[1];\n')
    out, rep = compile(src, level=0)
    assert rep.verified and rep.cx_after >= 2
    assert _qiskit_equiv(qasm3.loads(src), out)


@pytest.mark.parametrize("basis", ["cx,u", "rz,sx,x,cx", "cz,rz,sx,x", "h,rz,cx", "rz,ry,cx"])
def test_rotations_of_1e9_rad_are_written_in_every_basis(basis):
    """A 1e-9 rad rotation is 5e-10 from the identity (above the 1e-11 of rounding): the
    translation into a basis keeps it."""
    from qiskit import QuantumCircuit
    from qiskit.quantum_info import Operator
    qc = QuantumCircuit(2)
    qc.rx(1e-9, 0)
    qc.cp(1e-9, 0, 1)
    qc.h(1)
    qc.rz(1e-9, 1)
    qc.h(1)
    want = Operator(qc.reverse_bits()).data  # big-endian, as block_unitary
    for level in (0, 1, 2):
        out, rep = compile(qc, level=level, basis=basis)
        assert rep.verified
        assert phase_distance(block_unitary(out.operations, (0, 1)), want) <= 1e-11


def test_many_tiny_rotations_rebase_and_verify():
    """10000 rotations by 9e-10 rad (9e-6 rad in all, a process infidelity of 2e-11 if they
    were dropped) are a valid input: the rebased circuit keeps them and verifies."""
    many = Circuit(1, tuple(op("rx", (0,), (9e-10,)) for _ in range(10000)))
    out, rep = compile(many, level=0, basis="rz,sx,x,cx")
    assert rep.verified and rep.gates_after > 0


def test_the_verdict_allows_the_rounding_of_long_circuits_and_no_more():
    """10000 Hadamards are the identity: their measured infidelity is rounding (~1.6e-16 per
    gate, above 1e-12 here) and passes; a 1e-5 rad rotation (2.5e-11) in 100 gates fails."""
    from qdiff.compiler.ops import op
    long = Circuit(1, tuple(op("h", (0,)) for _ in range(10000)))
    v = equivalence(long, Circuit(1, ()))
    assert v.ok and 1e-12 < v.infidelity < 1e-11
    off = Circuit(1, tuple(op("h", (0,)) for _ in range(100)) + (op("rz", (0,), (1e-5,)),))
    v = equivalence(off, Circuit(1, ()))
    assert not v.ok and abs(v.infidelity - 2.5e-11) < 1e-12


def test_a_rust_panic_in_qiskit_is_a_qdiff_error_and_prints_nothing(capfd):
    """Qiskit's Rust code reports some failures by panicking (printed on the process's
    stderr by Rust's hook, then raised as pyo3's PanicException, a BaseException): a guarded
    call turns it into a QdiffError and keeps the hook's lines off stderr; what a call that
    does not fail writes to stderr still gets there."""
    import os

    import qiskit.qasm2 as q2
    from qdiff.compiler.synth import guarded
    with pytest.raises(QdiffError, match="Qiskit's synthesis failed"):
        guarded(q2.loads, "OPENQASM 2.0;\nqreg q[99999999999999999999];\n")  # a real panic
    assert capfd.readouterr().err == ""
    with pytest.raises(QdiffError, match="Qiskit's synthesis failed"):  # nested guarded calls
        guarded(lambda: guarded(q2.loads, "OPENQASM 2.0;\nqreg q[99999999999999999999];\n"))
    assert capfd.readouterr().err == ""

    def talks():
        os.write(2, b"a warning\n")
        return 7
    assert guarded(talks) == 7
    assert capfd.readouterr().err == "a warning\n"


def test_exact_synthesis_goes_on_when_qiskit_fails_on_one_way(monkeypatch):
    """A decomposition way that fails in Qiskit (here: the Shannon decomposition's default
    two-qubit step panicking, as the Weyl decomposition does on rare inputs) is skipped for the
    next one; the result is still exact."""
    from qdiff.compiler import synth
    from qdiff.compiler.blocks import block_unitary
    from qdiff.compiler.budget import EXACT_DELTA, phase_distance

    class PanicException(BaseException):
        pass
    real = synth.shannon

    def panics():
        raise PanicException("TwoQubitWeylDecomposition: failed to diagonalize M2")

    def shannon(u, wires, exact_2q=False):
        return real(u, wires, exact_2q=True) if exact_2q else synth.guarded(panics)
    monkeypatch.setattr(synth, "shannon", shannon)
    rng = np.random.default_rng(3)
    from scipy.stats import unitary_group
    u = unitary_group.rvs(8, random_state=rng)
    ops = synth.exact_synthesis(u, (0, 1, 2))
    assert phase_distance(block_unitary(ops, (0, 1, 2)), u) <= EXACT_DELTA
