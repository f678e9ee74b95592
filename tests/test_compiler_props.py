"""Property tests: random circuits compile to equivalent circuits with no more CX."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from qdiff.circuits import Circuit
from qdiff.circuits.gates import GATES
from qdiff.circuits.operation import Operation, ParamRef
from qdiff.compiler import compile, equivalence

ONE_Q = ["h", "x", "y", "z", "s", "sdg", "t", "tdg", "sx", "rx", "ry", "rz", "u3"]
TWO_Q = ["cx", "cz", "swap", "crz", "rzz", "cp", "cy"]
THREE_Q = ["ccx", "cswap"]
ANGLES = st.sampled_from([0.0, np.pi / 4, np.pi / 2, np.pi, -np.pi / 4, 0.3, -1.1, 2.5])


@st.composite
def circuits(draw, n_max=4, params=False):
    n = draw(st.integers(2, n_max))
    ops = []
    for _ in range(draw(st.integers(0, 25))):
        kind = draw(st.sampled_from(ONE_Q * 2 + TWO_Q * 3 + (THREE_Q if n >= 3 else [])))
        g = GATES[kind]
        wires = tuple(draw(st.permutations(range(n)))[:g.num_wires])
        ps = []
        for _ in range(g.num_params):
            if params and draw(st.booleans()):
                ps.append(ParamRef(draw(st.integers(0, 1)), draw(st.sampled_from([1.0, -0.5, 2.0])),
                                   draw(ANGLES)))
            else:
                ps.append(draw(ANGLES))
        ops.append(Operation(g, wires, tuple(ps)))
    return Circuit(n, tuple(ops), num_params=2 if params else 0)


BASES = ["cx,u", "h,rz,cx", "rz,sx,x,cx", "cz,rz,sx,x", "ecr,rz,sx,x"]
CLIFFORD_T = ["h,s,sdg,t,tdg,cx", "h,s,sdg,t,tdg,cx,x,z"]
CT_GATES = ["h", "x", "z", "s", "sdg", "t", "tdg"]


def _not_worse(rep):
    return (rep.gates_after <= rep.gates_before and rep.depth_after <= rep.depth_before
            and rep.cx_after <= rep.cx_before)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(circuits(), st.sampled_from([1, 2]), st.sampled_from(BASES))
def test_random_circuits_equivalent_and_never_worse(c, level, basis):
    out, rep = compile(c, level=level, basis=basis)
    assert rep.verified and rep.infidelity <= 1e-12
    assert _not_worse(rep)
    assert set(o.name for o in out.operations) <= set(basis.split(",")) | {"u3"}
    assert equivalence(c, out, "unitary", seed=99).ok  # independent seed


@st.composite
def clifford_t_circuits(draw):
    n = draw(st.integers(2, 4))
    ops = []
    for _ in range(draw(st.integers(0, 25))):
        if draw(st.integers(0, 2)) == 0:
            a, b = draw(st.permutations(range(n)))[:2]
            ops.append(Operation(GATES["cx"], (a, b)))
        else:
            ops.append(Operation(GATES[draw(st.sampled_from(CT_GATES))], (draw(st.integers(0, n - 1)),)))
    return Circuit(n, tuple(ops))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clifford_t_circuits(), st.sampled_from([0, 1, 2]), st.sampled_from(CLIFFORD_T))
def test_clifford_t_bases_every_level(c, level, basis):
    out, rep = compile(c, level=level, basis=basis)
    assert rep.verified and _not_worse(rep)
    assert set(o.name for o in out.operations) <= set(basis.split(","))
    assert rep.t_after <= rep.t_before
    assert equivalence(c, out, "unitary", seed=5).ok


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(circuits(n_max=3, params=True))
def test_random_parametric_circuits_equivalent(c):
    out, rep = compile(c, level=2)
    assert rep.verified and _not_worse(rep)
    assert out.num_params == c.num_params
    assert equivalence(c, out, "unitary", seed=7).ok


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(circuits(n_max=4), st.sampled_from(BASES + CLIFFORD_T[:1]))
def test_random_circuits_level3(c, basis):
    if basis.startswith("h,s"):
        c = c.with_operations([o for o in c.operations if o.name in CT_GATES + ["cx"]])
    out, rep = compile(c, level=3, basis=basis, work=200)
    assert rep.verified and _not_worse(rep)
    assert equivalence(c, out, "unitary", seed=3).ok


def test_clifford_t_never_gains_t_gates_from_two_qubit_resynthesis():
    # level 2 re-synthesised this block to 1 CX but 3 T gates (from 1): T counts as a cost too
    names = [("s", (1,)), ("z", (0,)), ("sdg", (1,)), ("sdg", (0,)), ("cx", (0, 1)),
             ("cx", (1, 0)), ("h", (0,)), ("cx", (1, 0)), ("x", (1,)), ("cx", (0, 1)),
             ("h", (0,)), ("cx", (1, 0)), ("z", (1,)), ("t", (1,)), ("s", (0,)), ("cx", (1, 0))]
    c = Circuit(2, tuple(Operation(GATES[g], w) for g, w in names))
    for level in (1, 2, 3):
        out, rep = compile(c, level=level, basis="h,s,sdg,t,tdg,cx")
        assert rep.verified and _not_worse(rep) and rep.t_after <= rep.t_before == 1
