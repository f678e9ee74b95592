"""Greedy Pauli-network re-synthesis with two-qubit entanglers (qdiff/compiler/gadgets.py).

Oracles: Qiskit's ``Operator`` of the circuit before and after (independent of qdiff's
checker), closed-form CX counts of Pauli exponentials, hypothesis circuits."""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from qdiff.circuits import Circuit
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.operation import ParamRef
from qdiff.compiler import compile, equivalence, level2, lower
from qdiff.compiler.gadgets import VARIANTS, greedy_pauli, windowed
from qdiff.compiler.ops import cx_count, op

from test_compiler_props import circuits


def _operator(c: Circuit):
    from qiskit.quantum_info import Operator
    from qdiff.circuits.qiskit_io import to_qiskit
    return Operator(to_qiskit(c)).data


def process_infidelity(a: np.ndarray, b: np.ndarray) -> float:
    d = a.shape[0]
    return 1.0 - abs(np.trace(a.conj().T @ b)) ** 2 / d ** 2


def pauli_exp(word: str, wires, angle: float, ladder=None) -> list:
    """exp(-i angle/2 P) for the Pauli word on ``wires``: basis change, CX ladder, rz."""
    pre, post = [], []
    for w, q in zip(word, wires):
        if w == "X":
            pre.append(op("h", (q,)))
            post.append(op("h", (q,)))
        elif w == "Y":
            pre += [op("sdg", (q,)), op("h", (q,))]
            post = [op("h", (q,)), op("s", (q,))] + post
    pairs = ladder or list(zip(wires[:-1], wires[1:]))
    cx = [op("cx", p) for p in pairs]
    target = pairs[-1][1]
    return pre + cx + [op("rz", (target,), (angle,))] + cx[::-1] + post


def _check(c: Circuit, out: Circuit) -> None:
    assert process_infidelity(_operator(c), _operator(out)) < 1e-12
    assert equivalence(c, out, "unitary").ok


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(circuits(n_max=4), st.sampled_from(VARIANTS))
def test_random_circuits_stay_equivalent(c, variant):
    low = lower(c)
    _check(low, greedy_pauli(low, *variant))


def _trotter(n: int, steps: int, dt: float) -> Circuit:
    ops = []
    for _ in range(steps):
        for q in range(n - 1):
            for w in ("XX", "YY", "ZZ"):
                ops += pauli_exp(w, (q, q + 1), 0.37 * dt)
        for q in range(n):
            ops.append(op("rx", (q,), (0.21 * dt,)))
    return Circuit(n, tuple(ops))


def _qaoa(n: int, layers: int) -> Circuit:
    ops = [op("h", (q,)) for q in range(n)]
    edges = [(q, (q + 1) % n) for q in range(n)] + [(0, n // 2)]
    for layer in range(layers):
        for a, b in edges:
            ops += [op("cx", (a, b)), op("rz", (b,), (0.4 + 0.1 * layer,)), op("cx", (a, b))]
        ops += [op("rx", (q,), (0.7 - 0.05 * layer,)) for q in range(n)]
    return Circuit(n, tuple(ops))


def _uccsd_like(n: int) -> Circuit:
    ops = [op("x", (0,)), op("x", (1,))]
    words = ["XXXY", "XXYX", "XYXX", "YXXX", "YYYX", "YYXY", "YXYY", "XYYY"]
    for k, w in enumerate(words):
        ops += pauli_exp(w, (0, 1, 2, 3), 0.013 * (-1) ** k)
    for a, b in ((0, 2), (1, 3), (0, 3)):
        ops += pauli_exp("XY", (a, b), 0.05) + pauli_exp("YX", (a, b), -0.05)
    return Circuit(n, tuple(ops))


def _toffoli_chain(n: int) -> Circuit:
    ops = [op("h", (0,))]
    for q in range(n - 2):
        ops.append(op("ccx", (q, q + 1, q + 2)))
    ops.append(op("ccx", (0, 2, n - 1)))
    return Circuit(n, tuple(ops))


def _qft(n: int) -> Circuit:
    ops = []
    for j in range(n):
        ops.append(op("h", (j,)))
        for k in range(j + 1, n):
            ops.append(op("cp", (k, j), (math.pi / 2 ** (k - j),)))
    return Circuit(n, tuple(ops))


def _repetition_code(n: int) -> Circuit:
    d = n - 2  # data qubits, then two ancillas measuring neighbouring parities
    ops = [op("h", (0,))] + [op("cx", (0, q)) for q in range(1, d)]
    ops += [op("cx", (0, d)), op("cx", (1, d)), op("cx", (1, d + 1)), op("cx", (2, d + 1)),
            op("rz", (0,), (0.3,))]
    return Circuit(n, tuple(ops))


FAMILIES = {"trotter": _trotter(4, 2, 0.5), "qaoa": _qaoa(5, 2), "uccsd": _uccsd_like(4),
            "toffoli": _toffoli_chain(5), "qft": _qft(4), "code": _repetition_code(5)}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_families_stay_equivalent(family):
    c = lower(FAMILIES[family])
    for variant in VARIANTS[:2] + VARIANTS[4:6]:  # forward and on the inverse circuit
        _check(c, greedy_pauli(c, *variant))


def test_merges_pauli_exponentials_to_the_closed_form_count():
    # exp(-i a/2 ZZZ) then exp(-i b/2 ZZZ) written with different CX ladders: one rotation
    # by a + b, which a weight-3 Pauli exponential realizes with 4 CX; the peephole levels
    # cannot see through the two ladders
    ops = pauli_exp("ZZZ", (0, 1, 2), 0.3, [(0, 1), (1, 2)])
    ops += [op("h", (1,)), op("h", (1,))]
    ops += pauli_exp("ZZZ", (0, 1, 2), 0.5, [(2, 0), (0, 1)])
    c = Circuit(3, tuple(ops))
    l2 = level2(lower(c))
    out = greedy_pauli(lower(c))
    _check(c, out)
    assert cx_count(out.operations) == 4 < cx_count(l2.operations)


def test_commuting_gadgets_share_their_ladders():
    # exp(-i XXXX) and exp(-i YYYY) commute; the closed-form pair costs 2 x 6 = 12 CX as
    # written; diagonalized together (their common eigenbasis is a GHZ-type basis) they need
    # fewer
    ops = pauli_exp("XXXX", (0, 1, 2, 3), 0.4) + pauli_exp("YYYY", (0, 1, 2, 3), -0.9)
    c = Circuit(4, tuple(ops))
    out = greedy_pauli(lower(c))
    _check(c, out)
    assert cx_count(out.operations) < 12


def test_level3_picks_gadgets_and_lowers_cx_on_chemistry():
    c = _uccsd_like(4)
    out, rep = compile(c, level=3)
    _, rep2 = compile(c, level=2)
    assert rep.verified and rep.infidelity <= 1e-12
    assert rep.cx_after < rep2.cx_after
    assert process_infidelity(_operator(lower(c)), _operator(out)) < 1e-12


def test_symbolic_angles_keep_their_parameter():
    c = Circuit(2, (op("cx", (0, 1)), op("rz", (1,), (ParamRef(0),)), op("cx", (0, 1)),
                    op("h", (0,)), op("cx", (1, 0)), op("rz", (0,), (0.4,)), op("cx", (1, 0))),
                num_params=1)
    out = greedy_pauli(c, 0, 0.3)
    assert any(isinstance(p, ParamRef) for o in out.operations for p in o.params)
    assert equivalence(c, out, "unitary").ok
    with pytest.raises(QdiffError, match="rz.*constant"):
        greedy_pauli(c, 0, 0.3, True)  # the inverse circuit needs constant gates


def test_windows_lower_cx_on_a_toffoli_network_and_stay_exact():
    ops = []
    for t in range(3, 6):  # Toffolis sharing controls, as in GF(2) multipliers
        ops += [op("ccx", (0, 1, t)), op("ccx", (0, 2, t)), op("ccx", (1, 2, t))]
    c = lower(Circuit(6, tuple(ops)))
    l2 = level2(c)
    out = level2(windowed(l2, 24, clean=level2))
    _check(c, out)
    assert cx_count(out.operations) < cx_count(l2.operations)


def test_same_input_same_output():
    c = lower(_qaoa(5, 2))
    a, b = greedy_pauli(c, 1, 0.3), greedy_pauli(c, 1, 0.3)
    def key(c):
        return [(o.name, o.wires, tuple(float(p) for p in o.params)) for o in c.operations]
    assert key(a) == key(b)
