"""Qiskit dynamic circuits (mid-circuit measurement, reset, if_test / if_else, switch, for_loop)
run by deferred measurement: Sampler counts, Estimator values and circuit-qnode gradients
against an independent oracle that branches over every measurement outcome with Qiskit's
``Statevector`` and projectors, and against Aer's SamplerV2 / EstimatorV2."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff import QdiffError, QdiffMemoryError
from qdiff.primitives import Estimator, Sampler


# -- the oracle: one branch per measurement outcome ------------------------------------------
def branches(qc, values=None) -> list:
    """``[(probability, Statevector, clbits)]`` of ``qc`` (parameters bound to ``values``):
    every measurement splits a branch by its projectors, a reset is a measurement followed by
    X on outcome 1, control flow follows each branch's classical bits."""
    from qiskit.quantum_info import Statevector
    if values is not None:
        qc = qc.assign_parameters(list(values))
    start = [(1.0, Statevector.from_label("0" * qc.num_qubits), [0] * qc.num_clbits)]
    return _run(qc, list(range(qc.num_qubits)), dict(zip(qc.clbits, range(qc.num_clbits))),
                start)


def _run(circ, qmap, cidx, brs):
    from qiskit.quantum_info import Operator
    for inst in circ.data:
        op, name = inst.operation, inst.operation.name
        qs = [qmap[circ.find_bit(q).index] for q in inst.qubits]
        if name == "barrier":
            continue
        if name in ("measure", "reset"):
            out = []
            for p, sv, bits in brs:
                probs = sv.probabilities([qs[0]])
                for k in (0, 1):
                    if probs[k] < 1e-15:
                        continue
                    proj = np.diag([1.0 - k, float(k)]) / np.sqrt(probs[k])
                    new = sv.evolve(Operator(proj), [qs[0]])
                    b = list(bits)
                    if name == "measure":
                        b[cidx[inst.clbits[0]]] = k
                    elif k:
                        new = new.evolve(Operator(np.array([[0, 1], [1, 0]])), [qs[0]])
                    out.append((p * probs[k], new, b))
            brs = out
            continue
        if name in ("if_else", "switch_case", "for_loop"):
            out = []
            for br in brs:
                mine = [br]
                for body in _bodies(op, cidx, br[2]):
                    sub = dict(cidx)
                    sub.update({b: cidx[o] for b, o in zip(body.clbits, inst.clbits)})
                    mine = _run(body, qs, sub, mine)
                out.extend(mine)
            brs = out
            continue
        brs = [(p, sv.evolve(op, qs), bits) for p, sv, bits in brs]
    return brs


def _bodies(op, cidx, bits) -> list:
    """The bodies one branch runs in order (a for loop's iterations, bound)."""
    if op.name == "if_else":
        if _value(op.condition, cidx, bits):
            return [op.blocks[0]]
        return [op.blocks[1]] if len(op.blocks) > 1 else []
    if op.name == "switch_case":
        target = int(_value(op.target, cidx, bits))
        default = []
        for vals, body in op.cases_specifier():
            if any(str(v) == "<default case>" for v in vals):
                default = [body]
            elif target in [int(v) for v in vals]:
                return [body]
        return default
    indexset, param, body = op.params
    return [body.assign_parameters({param: v}) if param in set(body.parameters) else body
            for v in indexset]


def _value(node, cidx, bits):
    """A classical condition's value on one branch's bits (Python integers)."""
    from qiskit.circuit import Clbit, ClassicalRegister
    from qiskit.circuit.classical import expr
    if isinstance(node, tuple):
        return int(_value(node[0], cidx, bits)) == int(node[1])
    if isinstance(node, Clbit):
        return bits[cidx[node]]
    if isinstance(node, ClassicalRegister):
        return sum(bits[cidx[b]] << j for j, b in enumerate(node))
    if isinstance(node, expr.Var):
        return _value(node.var, cidx, bits)
    if isinstance(node, expr.Value):
        return node.value
    is_bool = type(node.type).__name__ == "Bool"
    mask = 1 if is_bool else (1 << node.type.width) - 1
    if isinstance(node, expr.Cast):
        v = _value(node.operand, cidx, bits)
        return bool(v) if is_bool else int(v) & mask
    if isinstance(node, expr.Index):
        return (int(_value(node.target, cidx, bits)) >> int(_value(node.index, cidx, bits))) & 1
    if isinstance(node, expr.Unary):
        v = _value(node.operand, cidx, bits)
        if node.op == expr.Unary.Op.LOGIC_NOT or is_bool:
            return not v
        return ~int(v) & mask
    a, b = _value(node.left, cidx, bits), _value(node.right, cidx, bits)
    o = expr.Binary.Op
    fn = {o.BIT_AND: lambda: int(a) & int(b), o.BIT_OR: lambda: int(a) | int(b),
          o.BIT_XOR: lambda: int(a) ^ int(b), o.LOGIC_AND: lambda: bool(a) and bool(b),
          o.LOGIC_OR: lambda: bool(a) or bool(b), o.EQUAL: lambda: int(a) == int(b),
          o.NOT_EQUAL: lambda: int(a) != int(b), o.LESS: lambda: int(a) < int(b),
          o.LESS_EQUAL: lambda: int(a) <= int(b), o.GREATER: lambda: int(a) > int(b),
          o.GREATER_EQUAL: lambda: int(a) >= int(b)}[node.op]
    v = fn()
    return bool(v) if is_bool else v & mask


def exact_counts(qc, values=None) -> dict:
    """``{register name: {bit string: probability}}`` of the clbits at the end."""
    out = {}
    brs = branches(qc, values)
    for reg in qc.cregs:
        dist: dict = {}
        for p, _, bits in brs:
            key = "".join(str(bits[qc.find_bit(b).index]) for b in reversed(reg))
            dist[key] = dist.get(key, 0.0) + p
        out[reg.name] = dist
    return out


def exact_expval(qc, obs, values=None) -> float:
    return float(sum(p * sv.expectation_value(obs).real for p, sv, _ in branches(qc, values)))


def check_counts(counts: dict, probs: dict, shots: int) -> None:
    """Chi-square (outcomes of expected count >= 5) and no impossible outcome."""
    from scipy.stats import chi2
    assert set(counts) <= {k for k, p in probs.items() if p > 1e-12}, (counts, probs)
    keys = [k for k, p in probs.items() if p * shots >= 5]
    if len(keys) < 2:
        return
    obs = np.array([counts.get(k, 0) for k in keys], dtype=float)
    exp = np.array([probs[k] * shots for k in keys])
    stat = float(((obs - exp) ** 2 / exp).sum())
    assert stat < chi2.ppf(1 - 1e-4, len(keys) - 1), (counts, probs)


def sample_all(qc, values, shots: int, seed: int = 7) -> dict:
    res = Sampler(seed=seed).run([(qc, values)] if values is not None else [qc],
                                 shots=shots).result()[0].data
    return {name: getattr(res, name).get_counts() for name in (r.name for r in qc.cregs)}


# -- circuits ---------------------------------------------------------------------------------
def teleportation(theta, phi):
    from qiskit import ClassicalRegister, QuantumCircuit, QuantumRegister
    q = QuantumRegister(3, "q")
    m0, m1, out = ClassicalRegister(1, "m0"), ClassicalRegister(1, "m1"), ClassicalRegister(1, "out")
    qc = QuantumCircuit(q, m0, m1, out)
    qc.ry(theta, 0)
    qc.rz(phi, 0)
    qc.h(1)
    qc.cx(1, 2)
    qc.cx(0, 1)
    qc.h(0)
    qc.measure(0, m0[0])
    qc.measure(1, m1[0])
    with qc.if_test((m1, 1)):
        qc.x(2)
    with qc.if_test((m0[0], 1)):
        qc.z(2)
    return qc


def test_teleportation_gives_the_teleported_state():
    """Teleport RZ(phi) RY(theta)|0>: qubit 2 ends in it whatever the outcomes (Estimator,
    exact), the outcomes are uniform, and qubit 2's measurement follows cos^2(theta/2)."""
    from qiskit.circuit import Parameter
    from qiskit.quantum_info import SparsePauliOp, Statevector
    t, p = Parameter("t0"), Parameter("t1")  # qc.parameters are sorted by name
    qc = teleportation(t, p)
    vals = np.array([[0.3, 0.2], [1.1, -0.7], [2.5, 1.9]])
    words = ["ZII", "XII", "YII", "IIZ", "IZI"]
    evs = Estimator().run([(qc, words, vals[:, None, :])]).result()[0].data.evs
    for row, (a, b) in zip(evs, vals):
        sv = Statevector.from_label("0")
        from qiskit import QuantumCircuit
        one = QuantumCircuit(1)
        one.ry(a, 0)
        one.rz(b, 0)
        sv = sv.evolve(one)
        want = [sv.expectation_value(SparsePauliOp(w)).real for w in "ZXY"] + [0.0, 0.0]
        np.testing.assert_allclose(row, want, atol=1e-12)
        np.testing.assert_allclose(row, [exact_expval(qc, SparsePauliOp(w), [a, b])
                                         for w in words], atol=1e-12)
    qc.measure(2, 2)
    got = sample_all(qc, [1.1, -0.7], 20000)
    probs = exact_counts(qc, [1.1, -0.7])
    assert abs(probs["out"]["0"] - np.cos(0.55) ** 2) < 1e-12
    for name in ("m0", "m1", "out"):
        check_counts(got[name], probs[name], 20000)


def test_sampler_and_estimator_match_aer_on_a_parametrized_mid_circuit_measurement():
    """A parametrized circuit with a measurement whose qubit is used again and whose bit
    drives a correction: Sampler counts vs Aer's SamplerV2 (total variation) and the oracle
    (chi-square); Estimator vs the oracle (exact) and Aer's EstimatorV2 (12000 shots, 5
    standard errors)."""
    pytest.importorskip("qiskit_aer")
    from qiskit import ClassicalRegister, QuantumCircuit, QuantumRegister
    from qiskit.circuit import Parameter
    from qiskit.quantum_info import SparsePauliOp
    from qiskit_aer.primitives import EstimatorV2 as AerEstimator, SamplerV2 as AerSampler
    a, b, c = Parameter("a"), Parameter("b"), Parameter("c")
    cr, fin = ClassicalRegister(2, "mid"), ClassicalRegister(2, "fin")
    qc = QuantumCircuit(QuantumRegister(2), cr, fin)
    qc.ry(a, 0)
    qc.cx(0, 1)
    qc.measure(0, cr[0])
    qc.rx(b, 0)
    qc.crz(c, 0, 1)
    qc.measure(1, cr[1])
    with qc.if_test((cr[0], 1)) as else_:
        qc.ry(b * c, 1)
    with else_:
        qc.h(1)
    est = qc.copy()
    obs = [SparsePauliOp(w) for w in ("ZI", "IZ", "XI", "XZ", "YY")]
    vals = np.array([[0.4, 1.3, -0.8], [2.2, 0.5, 1.7]])
    evs = Estimator().run([(est, obs, vals[:, None, :])]).result()[0].data.evs
    want = np.array([[exact_expval(est, o, v) for o in obs] for v in vals])
    np.testing.assert_allclose(evs, want, atol=1e-12)
    # Aer estimates a dynamic circuit from its run_options' shots (not from the precision)
    aer = AerEstimator(options={"run_options": {"shots": 12000, "seed_simulator": 3}})
    ref = aer.run([(est, obs, vals[:, None, :])]).result()[0].data.evs
    np.testing.assert_allclose(evs, ref, atol=0.05)
    qc.measure([0, 1], [2, 3])
    shots = 20000
    for v in vals:
        got = sample_all(qc, v, shots)
        ref = AerSampler(seed=5).run([(qc, v)], shots=shots).result()[0].data
        probs = exact_counts(qc, v)
        for name in ("mid", "fin"):
            check_counts(got[name], probs[name], shots)
            theirs = getattr(ref, name).get_counts()
            keys = set(got[name]) | set(theirs)
            tvd = 0.5 * sum(abs(got[name].get(k, 0) - theirs.get(k, 0)) for k in keys) / shots
            assert tvd < 0.03, (name, got[name], theirs)


@pytest.mark.parametrize("diff_method", ["best", "backprop", "adjoint", "parameter-shift",
                                         "finite-diff"])
def test_qnode_gradients_through_gates_before_and_after_a_measurement(diff_method):
    """qd.qnode on a dynamic circuit: values equal the oracle's, gradients (parameters before
    and after the measurement, and in the conditioned body) equal central finite differences
    of the oracle."""
    from qiskit import ClassicalRegister, QuantumCircuit, QuantumRegister
    from qiskit.circuit import Parameter
    from qiskit.quantum_info import SparsePauliOp
    a, b, c = Parameter("a"), Parameter("b"), Parameter("c")
    cr = ClassicalRegister(1, "c")
    qc = QuantumCircuit(QuantumRegister(2), cr)
    qc.ry(a, 0)
    qc.cx(0, 1)
    qc.measure(0, 0)
    qc.rx(b, 0)
    with qc.if_test((cr, 1)):
        qc.ry(c, 1)
    qc.reset(0)
    qc.ry(b, 0)
    obs = [SparsePauliOp("ZI"), SparsePauliOp("XZ"), SparsePauliOp("IZ")]
    f = qd.qnode(qd.device("statevector", wires=2), diff_method=diff_method,
                 observables=obs)(qc)
    x = torch.tensor([0.7, -0.4, 1.2], dtype=torch.float64, requires_grad=True)
    y = f(x)
    want = [exact_expval(qc, o, x.detach().numpy()) for o in obs]
    np.testing.assert_allclose(y.detach().numpy(), want, atol=1e-10)
    w = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    (g,) = torch.autograd.grad((y * w).sum(), x)
    h = 1e-6
    fd = []
    for i in range(3):
        e = np.zeros(3)
        e[i] = h
        up = sum(wk * exact_expval(qc, o, x.detach().numpy() + e) for wk, o in zip(w.tolist(), obs))
        dn = sum(wk * exact_expval(qc, o, x.detach().numpy() - e) for wk, o in zip(w.tolist(), obs))
        fd.append((up - dn) / (2 * h))
    tol = 1e-5 if diff_method == "finite-diff" else 1e-7
    np.testing.assert_allclose(g.numpy(), fd, atol=tol)


def test_register_value_and_expression_conditions():
    """Conditions on a register == value, ``expr`` conditions (==, !=, ~, &, |, ^, !, &&, ||,
    <, >=, an index, a cast), nested if_else and a bit measured again inside a body: every
    register's distribution equals the oracle's."""
    from qiskit import ClassicalRegister, QuantumCircuit, QuantumRegister
    from qiskit.circuit.classical import expr, types
    cr, out = ClassicalRegister(3, "c"), ClassicalRegister(3, "o")
    conds = [lambda: (cr, 5), lambda: expr.equal(cr, 3), lambda: expr.not_equal(cr, 6),
             lambda: expr.logic_not(cr[1]), lambda: expr.bit_and(cr[0], expr.bit_not(cr[2])),
             lambda: expr.bit_or(cr[0], cr[1]), lambda: expr.bit_xor(cr[1], cr[2]),
             lambda: expr.logic_and(cr[0], expr.less(cr, 5)),
             lambda: expr.logic_or(expr.greater_equal(cr, 6), cr[1]),
             lambda: expr.equal(expr.bit_and(cr, 6), 2), lambda: expr.index(cr, 2),
             lambda: expr.cast(expr.bit_and(cr, 3), types.Bool())]
    for k, cond in enumerate(conds):
        qc = QuantumCircuit(QuantumRegister(3), cr, out)
        qc.ry(0.9, 0)
        qc.ry(1.7, 1)
        qc.h(2)
        qc.cx(2, 1)
        qc.measure([0, 1, 2], [0, 1, 2])
        with qc.if_test(cond()) as else_:
            qc.x(0)
            qc.ry(0.4, 2)
            with qc.if_test(expr.logic_not(cr[0])):
                qc.h(1)
        with else_:
            qc.rx(0.8, 1)
            qc.measure(1, cr[2])  # the bit holds a new value in this branch only
        qc.measure([0, 1, 2], [3, 4, 5])
        got = sample_all(qc, None, 8000, seed=k)
        probs = exact_counts(qc)
        for name in ("c", "o"):
            check_counts(got[name], probs[name], 8000)
        # the exact distribution: probs of the clbits through the circuit qnode
        f = qd.qnode(qd.device("statevector", wires=3))(qc)
        p = f(torch.zeros(0, dtype=torch.float64)).numpy()
        want = np.zeros(64)
        for pr, _, bits in branches(qc):
            want[sum(bit << j for j, bit in enumerate(bits))] += pr
        np.testing.assert_allclose(p, want, atol=1e-12, err_msg=str(k))


def test_switch_with_default_and_for_loop():
    """``switch`` on a register (several values per case, a default case) and on a bit, and a
    ``for_loop`` whose body uses its loop parameter and measures: exact distributions (circuit
    qnode) and sampled counts equal the oracle's."""
    from qiskit import ClassicalRegister, QuantumCircuit, QuantumRegister
    from qiskit.circuit import Parameter
    cr, out = ClassicalRegister(2, "c"), ClassicalRegister(2, "o")
    th = Parameter("th")
    qc = QuantumCircuit(QuantumRegister(2), cr, out)
    qc.ry(th, 0)
    qc.ry(2.1, 1)
    qc.measure([0, 1], [0, 1])
    with qc.switch(cr) as case:
        with case(0, 3):
            qc.x(0)
        with case(1):
            qc.ry(0.7, 1)
        with case(case.DEFAULT):
            qc.h(0)
            qc.h(1)
    with qc.switch(cr[1]) as case:
        with case(True):
            qc.rx(0.3, 0)
    with qc.for_loop(range(3)) as i:
        qc.ry(0.4 * i + th, 1)
        qc.measure(1, cr[1])
        qc.cx(1, 0)
    qc.measure([0, 1], [2, 3])
    v = [0.8]
    got = sample_all(qc, v, 10000, seed=2)
    probs = exact_counts(qc, v)
    for name in ("c", "o"):
        check_counts(got[name], probs[name], 10000)
    f = qd.qnode(qd.device("statevector", wires=2))(qc)
    p = f(torch.tensor(v, dtype=torch.float64)).numpy()
    want = np.zeros(16)
    for pr, _, bits in branches(qc, v):
        want[sum(bit << j for j, bit in enumerate(bits))] += pr
    np.testing.assert_allclose(p, want, atol=1e-12)


def test_for_loop_binds_its_parameter_in_nested_blocks_per_iteration():
    """A loop parameter read by a gate object inside a nested block (a ``PauliEvolutionGate``
    under an ``if_test`` in the loop body) takes each iteration's value, and the caller's
    circuit keeps the parameter (the import binds copies)."""
    from qiskit import QuantumCircuit
    from qiskit.circuit.library import PauliEvolutionGate
    from qiskit.quantum_info import SparsePauliOp, Statevector
    qc = QuantumCircuit(3, 1)
    qc.x(2)
    qc.measure(2, 0)
    with qc.for_loop(range(1, 4)) as i:
        with qc.if_test((qc.clbits[0], 1)):
            qc.append(PauliEvolutionGate(SparsePauliOp(["XY"]), time=0.3 * i), [0, 1])
    ref = QuantumCircuit(2)
    for k in range(1, 4):
        ref.append(PauliEvolutionGate(SparsePauliOp(["XY"]), time=0.3 * k), [0, 1])
    want = [Statevector(ref).expectation_value(SparsePauliOp(w)).real for w in ("ZI", "IZ")]
    for _ in range(2):
        evs = Estimator().run([(qc, ["IZI", "IIZ"])]).result()[0].data.evs
        np.testing.assert_allclose(evs, want, atol=1e-12)
    inner = qc.data[2].operation.blocks[0].data[0].operation.blocks[0].data[0].operation
    assert inner.params[0].parameters == {i}


def test_condition_on_a_bit_the_instruction_does_not_list():
    """A hand-built ``IfElseOp`` whose condition reads an outer bit that is not among the
    instruction's classical bits (its body has a bit of its own): the measurement of that
    bit still comes before the condition (it is not taken as a final measurement)."""
    from qiskit import QuantumCircuit
    from qiskit.circuit import IfElseOp
    body = QuantumCircuit(1, 1)
    body.x(0)
    body.measure(0, 0)
    qc = QuantumCircuit(2, 2)
    qc.h(1)
    qc.measure(1, 1)
    qc.append(IfElseOp((qc.clbits[1], 1), body), [0], [qc.clbits[0]])
    p = qd.qnode(qd.device("statevector", wires=2))(qc)(torch.zeros(0, dtype=torch.float64))
    np.testing.assert_allclose(p.numpy(), [0.5, 0.0, 0.0, 0.5], atol=1e-12)
    check_counts(sample_all(qc, None, 4000)["c"], {"00": 0.5, "11": 0.5}, 4000)


def test_clbit_rules_last_write_and_never_written():
    """A bit measured twice holds the last outcome, a bit never written reads 0, and a final
    measurement stays a read of its qubit (no extra wire)."""
    from qiskit import QuantumCircuit
    from qdiff.circuits.qiskit_io import from_qiskit
    qc = QuantumCircuit(2, 3)
    qc.x(0)
    qc.measure(0, 0)  # deferred: its qubit is used again
    qc.x(0)
    qc.h(1)
    qc.measure(0, 0)  # final: 0
    qc.measure(1, 1)  # final
    imp = from_qiskit(qc)
    assert imp.circuit.num_wires == 3 and imp.measurements == [(2, 0), (0, 0), (1, 1)]
    counts = Sampler(seed=1).run([qc], shots=4000).result()[0].data.c.get_counts()
    assert set(counts) == {"000", "010"} and abs(counts["010"] / 4000 - 0.5) < 0.05
    plain = QuantumCircuit(2, 2)
    plain.h(0)
    plain.measure([0, 1], [0, 1])
    assert from_qiskit(plain).circuit.num_wires == 2
    assert from_qiskit(plain).circuit.wire_labels is None


def test_estimator_refuses_final_measurements_and_memory_names_extra_wires(monkeypatch):
    """Final measurements stay refused by the Estimator (deferred ones are fine); a dynamic
    circuit whose deferred state does not fit names its extra wires."""
    from qiskit import QuantumCircuit
    qc = QuantumCircuit(1, 1)
    qc.h(0)
    qc.measure(0, 0)
    with pytest.raises(QdiffError, match="Estimator: the circuit has measurements that are "
                                         "final"):
        Estimator().run([(qc, "Z")]).result()
    big = QuantumCircuit(2, 1)
    big.h(0)
    for _ in range(40):
        big.measure(0, 0)
        big.h(0)
    with pytest.raises(QdiffMemoryError, match=r"deferred measurement of a dynamic circuit "
                                               r"\(1 qubit\(s\) in use and 40 extra wire\(s\)"):
        qd.qnode(qd.device("statevector", wires=2))(big)


def test_openqasm_paths_take_static_circuits_only():
    """The OpenQASM import and qd.compile keep refusing dynamic constructs by name; dumping a
    dynamic import is a QdiffError naming the way out, not a Qiskit CircuitError."""
    from qiskit import QuantumCircuit
    from qdiff.circuits import qasm
    from qdiff.circuits.qiskit_io import from_qiskit
    qc = QuantumCircuit(1, 1)
    qc.h(0)
    qc.measure(0, 0)
    qc.x(0)
    with pytest.raises(QdiffError, match="dumps: the import is a dynamic circuit"):
        qasm.dumps(from_qiskit(qc), version=3)
    with pytest.raises(QdiffError, match=r"f\.qasm.*mid-circuit measurement"):
        qasm.loads('OPENQASM 3.0;\ninclude "stdgates.inc";\nqubit[1] q; bit[1] c;\nh q[0];\n'
                   'c[0] = measure q[0];\nx q[0];\n', "f.qasm")
    with pytest.raises(QdiffError, match="mid-circuit measurement"):
        qd.compile(qc)


def test_conditions_on_classical_variables_are_refused():
    from qiskit import ClassicalRegister, QuantumCircuit, QuantumRegister
    from qiskit.circuit.classical import expr, types
    qc = QuantumCircuit(QuantumRegister(1), ClassicalRegister(1))
    v = expr.Var.new("flag", types.Bool())
    qc.add_input(v)
    with qc.if_test(v):
        qc.x(0)
    with pytest.raises(QdiffError, match=r"classical variables \(expr.Var 'flag'\)"):
        qd.qnode(qd.device("statevector", wires=1))(qc)


def _random_condition(rng, cr):
    from qiskit.circuit.classical import expr
    bit = lambda: cr[int(rng.integers(len(cr)))]  # noqa: E731
    return [lambda: (bit(), int(rng.integers(2))), lambda: (cr, int(rng.integers(4))),
            lambda: expr.logic_or(bit(), expr.logic_not(bit())),
            lambda: expr.bit_xor(bit(), bit()), lambda: expr.less(cr, int(rng.integers(1, 4))),
            lambda: expr.logic_and(bit(), bit()), lambda: expr.not_equal(cr, int(rng.integers(4))),
            lambda: expr.bit_and(expr.bit_not(bit()), bit())][int(rng.integers(8))]()


def _random_body(rng, qc, cr, n, depth):
    for _ in range(rng.integers(2, 6)):
        r, q = rng.random(), int(rng.integers(n))
        if r < 0.35:
            g = ["rx", "ry", "rz", "h"][int(rng.integers(4))]
            getattr(qc, g)(*([] if g == "h" else [float(rng.uniform(-3, 3))]), q)
        elif r < 0.45 and n > 1:
            a, b = rng.choice(n, 2, replace=False)
            qc.cx(int(a), int(b))
        elif r < 0.6:
            qc.measure(q, cr[int(rng.integers(len(cr)))])
        elif r < 0.68:
            qc.reset(q)
        elif r < 0.85 and depth < 2:
            with qc.if_test(_random_condition(rng, cr)) as else_:
                _random_body(rng, qc, cr, n, depth + 1)
            if rng.random() < 0.5:
                with else_:
                    _random_body(rng, qc, cr, n, depth + 1)
        elif r < 0.93 and depth < 2:
            vals = [int(v) for v in rng.permutation(4)]
            with qc.switch(cr) as case:
                with case(*vals[:2]):
                    _random_body(rng, qc, cr, n, depth + 1)
                with case(vals[2]):
                    _random_body(rng, qc, cr, n, depth + 1)
                if rng.random() < 0.5:
                    with case(case.DEFAULT):
                        _random_body(rng, qc, cr, n, depth + 1)
        elif depth < 2:
            with qc.for_loop(range(2)):
                _random_body(rng, qc, cr, n, depth + 1)


@pytest.mark.parametrize("seed", range(40))
def test_random_dynamic_circuits_match_the_branching_oracle(seed):
    """Random circuits of gates, measurements, resets, nested if_else (expression
    conditions, else branches that measure), switch and for_loop: the classical bits'
    distribution and Pauli expectation values equal the oracle's."""
    from qiskit import ClassicalRegister, QuantumCircuit, QuantumRegister
    from qiskit.quantum_info import SparsePauliOp
    from qdiff.circuits.qiskit_io import from_qiskit
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 4))
    cr = ClassicalRegister(2, "c")
    qc = QuantumCircuit(QuantumRegister(n), cr)
    for q in range(n):
        qc.ry(float(rng.uniform(0, 3)), q)
    _random_body(rng, qc, cr, n, 0)
    qc.measure(0, 1)
    imp = from_qiskit(qc)
    if imp.circuit.num_wires > 14:
        pytest.skip("too many deferred measurements for a fast test")
    written = sorted({c for _, c in imp.measurements})
    dev = qd.device("statevector", wires=n)
    p = qd.qnode(dev)(qc)(torch.zeros(0, dtype=torch.float64)).numpy()
    want = np.zeros(2 ** len(written))
    brs = branches(qc)
    for pr, _, bits in brs:
        want[sum(bits[c] << j for j, c in enumerate(written))] += pr
    np.testing.assert_allclose(p, want, atol=1e-10)
    qc.data.pop()  # observables of the state without the final measurement
    words = ["Z" * n, "ZI" * (n // 2) + "Z" * (n % 2)]
    if all(q >= n for q, _ in from_qiskit(qc).measurements):  # (final ones are read, not
        words += ["X" * n, "Y" + "I" * (n - 1)]                # collapsed, by observables)
    e = qd.qnode(dev, observables=words)(qc)(torch.zeros(0, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(e, [exact_expval(qc, SparsePauliOp(w)) for w in words],
                               atol=1e-10)


def test_imports_of_dynamic_circuits_in_to_qiskit_and_quantum_layer():
    """An import of a dynamic circuit: ``to_qiskit`` names the way out (its classical bits are
    extra wires) instead of a Qiskit CircuitError, and ``QuantumLayer.from_qiskit`` of it sizes
    its device by the circuit's qubits and gives the QuantumCircuit's outputs."""
    from qiskit import QuantumCircuit
    from qiskit.circuit import Parameter
    from qdiff.circuits.qiskit_io import from_qiskit, to_qiskit
    a = Parameter("a")
    qc = QuantumCircuit(2, 2)
    qc.h(0)
    qc.measure(0, 0)
    qc.x(0)
    with qc.if_test((qc.clbits[0], 1)):
        qc.ry(a, 1)
    qc.measure(1, 1)
    imp = from_qiskit(qc)
    with pytest.raises(QdiffError, match="to_qiskit: the import is a dynamic circuit"):
        to_qiskit(imp)
    w = torch.tensor([0.7], dtype=torch.float64)
    layer = qd.QuantumLayer.from_qiskit(imp, weight_params=[a], init_method=w)
    want = qd.QuantumLayer.from_qiskit(qc, weight_params=[a], init_method=w)
    x = torch.zeros(2, 0, dtype=torch.float64)
    torch.testing.assert_close(layer(x), want(x))
    np.testing.assert_allclose(want(x)[0].detach().numpy(),
                               [0.5, 0.5 * np.cos(0.35) ** 2, 0.0, 0.5 * np.sin(0.35) ** 2],
                               atol=1e-12)


def test_qnode_on_a_wide_device_names_the_extra_wires_when_they_do_not_fit(monkeypatch):
    """qd.qnode simulates every wire of its device plus one extra wire per deferred
    measurement: a circuit that fits as a static one on the device but not with its extra
    wires is a QdiffMemoryError naming them when the qnode is made; the primitives, which
    simulate the qubits the circuit uses, still run it."""
    from qiskit import QuantumCircuit
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "96M")
    qc = QuantumCircuit(20, 2)
    qc.h(0)
    qc.measure(0, 0)
    qc.h(0)
    qc.measure(0, 1)
    qc.x(0)
    static = QuantumCircuit(20)
    static.h(0)
    dev = qd.device("statevector", wires=20)
    qd.qnode(dev)(static)(torch.zeros(0, dtype=torch.float64))  # 20 qubits fit
    with pytest.raises(QdiffMemoryError, match=r"20 wire\(s\) of the device and 2 extra "
                                               r"wire\(s\)"):
        qd.qnode(dev)(qc)
    counts = Sampler(seed=1).run([qc], shots=100).result()[0].data.c.get_counts()
    assert set(counts) <= {"00", "01", "10", "11"}
