"""``compile``: the compiler's Python entry point (``qd.compile``).

>>> import qdiff as qd
>>> src = 'OPENQASM 2.0; include "qelib1.inc"; qreg q[2]; cx q[0],q[1]; cx q[0],q[1]; h q[1];'
>>> out, report = qd.compile(src, level=2)
>>> report.cx_before, report.cx_after, report.verified
(2, 0, True)
"""
from __future__ import annotations

import functools
import math
import os
import time

from qdiff.circuits.circuit import Circuit
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.midcircuit import is_mid_wire
from qdiff.compiler.approx import drop_small_gates
from qdiff.compiler.basis import parse_basis, translate
from qdiff.compiler.budget import Budget, Work
from qdiff.compiler.level3 import Search, score
from qdiff.compiler.lower import lower
from qdiff.compiler.ops import cx_count, depth, single_thread, t_count
from qdiff.compiler.pipeline import chain, guarded, level1, level2
from qdiff.compiler.report import CompileReport
from qdiff.compiler.verify import BINDINGS, equivalence

LEVELS = (0, 1, 2, 3)
# level-3 search budget in Levenberg-Marquardt iterations x starts: 25 per two-qubit gate of
# the input, between 100 and 2500 (a function of the input only, so results are reproducible)
WORK_PER_CX, MIN_WORK, MAX_WORK = 25, 100, 2500
VERIFY = ("auto", "final", "unitary", "statevector", "none")


def compile(circuit_or_qasm, level: int = 2, basis=None, verify: str = "final", seed: int = 0,
            time_limit: float | None = None, target: str | None = None, name: str = "<circuit>",
            approx: float | None = None, work: float | None = None, progress=None,
            keep_barriers: bool = True):
    """Optimize a circuit; returns ``(Circuit, CompileReport)``.

    ``circuit_or_qasm``: a qdiff ``Circuit``, a Qiskit ``QuantumCircuit``, OpenQASM 2/3 text or
    a path. ``level`` 0-3 (3 adds re-synthesis searches), ``basis`` a comma-separated gate list
    (``"cx,u"``, the default, ``"rz,sx,x,cx"``, ``"cz,rz,sx,x"``, ``"h,s,sdg,t,tdg,cx"``, ...),
    ``target`` an IBM device name (``qd.device("ibm", backend=...)``'s names) whose layout,
    routing and basis are used (so ``basis`` and ``target`` together are an error).

    The output is exact (process infidelity at most 1e-12, measured and reported) unless
    ``approx`` = EPS in (0, 1) is given: then resynthesis and gate dropping may spend a process
    infidelity of at most EPS, and the check enforces it; the exact search runs too and its
    result is kept when the budgeted one is not better (fewer CX; at as many, less depth; then
    fewer gates), so ``approx`` never gives more CX than the exact run, nor more depth or gates
    at as many CX (at twice the time). The level-3 search is bounded by
    ``work`` (default 25 per input CX, 100 to 2500 units of Levenberg-Marquardt iterations x
    starts), so a result does
    not depend on the machine's load; ``time_limit`` (seconds) is an outer bound only, and
    ``report.time_cut`` says when it stopped the search. Gate count, depth and two-qubit
    count of the output are each at most those of the input rebased into ``basis``
    (otherwise the rebased input is returned). ``progress(stage, best_cx)`` is called as
    level 3 advances. Parametric angles (theta columns) stay affine ParamRefs. The input's
    barriers are kept and no gate moves across one (the parts between them are optimized one
    by one) unless ``keep_barriers=False``, which optimizes across them and leaves them out.
    """
    with single_thread():  # small tensors: torch's thread pool costs more than it gains
        return _compile(circuit_or_qasm, level, basis, verify, seed, time_limit, target, name,
                        approx, work, progress, keep_barriers)


def _compile(circuit_or_qasm, level, basis, verify, seed, time_limit, target, name, approx,
             work, progress, keep_barriers):
    t0 = time.perf_counter()
    _check_args(level, verify, approx, work)
    if not isinstance(keep_barriers, bool):
        raise QdiffError(f"keep_barriers {keep_barriers!r}: expected True or False")
    if basis is not None:
        b = parse_basis(basis)
        if target is not None:
            raise QdiffError(f"compile: basis '{b}' with target '{target}': the target's own "
                             "basis is used; give one of them")
    imp = _as_import(circuit_or_qasm)
    if any(is_mid_wire(w) for w in imp.circuit.labels or ()):
        raise QdiffError("compile: the circuit measures mid-circuit (its outcome wires are not "
                         "qubits to optimize, and classically controlled operations are not "
                         "compiled); compile the part without them")
    report = CompileReport(name=name, level=level, measurements=list(imp.measurements),
                           num_clbits=imp.num_clbits, registers=list(imp.registers),
                           approx=approx)
    routed = None
    if target is not None:
        from qdiff.compiler.target import route
        routed = route(imp, target, seed, one_two_qubit_gate=True, input_columns=True)
        source, b, report.measurements = routed.circuit, routed.basis, routed.measurements
        report.target, report.num_clbits = routed.name, routed.num_clbits
    else:
        source, b = imp.circuit, parse_basis("cx,u" if basis is None else basis)
    report.basis, report.num_qubits, report.two_q = str(b), source.num_wires, b.two_q
    if not keep_barriers:
        report.log.append(f"{len(source.barriers)} barrier(s) ignored: optimized across")
        source = Circuit(source.num_wires, source.operations, source.measurements,
                         source.num_params, source.wire_labels)
    report.barriers = len(source.barriers)
    deadline = None if time_limit is None else t0 + time_limit
    budget = Budget(approx or 0.0)
    # barriers: no gate moves across one, each part between them is optimized on its own
    parts = [(low, _rebased(low, b, routed)) for low in map(lower, _segments(source))]
    cxs = [max(cx_count(base.operations), 1) for _, base in parts]
    if work is None:
        work = min(MAX_WORK, max(MIN_WORK, WORK_PER_CX * sum(cxs)))
    outs, names = [], []
    for (lowered, base), cx in zip(parts, cxs):  # the work shared as the CX are
        share = work if len(parts) == 1 else work * cx / sum(cxs)
        out, name = _optimize(lowered, base, level, b, verify, seed, deadline, share, budget,
                              approx, report, progress, routed)
        outs.append(out)
        names.append(name)
    base, out = _joined([base for _, base in parts], source), _joined(outs, source)
    _count(report, base, "before")
    report.strategy = ", ".join(dict.fromkeys(n for n in names if n))
    if len(outs) > 1 and not all(x <= y for x, y in zip(score(out), score(base))):
        # each part is within its rebased input's counts; their depths may stack differently
        report.log.append("the parts' outputs together are deeper than the rebased input: "
                          "rebased input kept")
        out, report.strategy = base, "input"
        budget = Budget(approx or 0.0)
    _count(report, out, "after")
    report.approx_bound = budget.spent_bound if approx else None
    if verify != "none":
        v = equivalence(source, out, verify, seed=seed + 1, tol=budget.tol)
        if not v.ok and out is not base:  # never expected: every pass was checked
            report.log.append(f"final check failed (1-F={v.infidelity:.2e}); rebased input kept")
            out = base
            _count(report, out, "after")
            v = equivalence(source, out, verify, seed=seed + 1, tol=budget.tol)
        report.verified, report.method, report.infidelity = v.ok, v.method, v.infidelity
        if max(source.num_params, out.num_params):  # a sample of the parameters, not a proof
            report.method = f"{v.method} at {BINDINGS} random parameter bindings"
    if routed is not None:
        out = routed.expand(out)
    report.seconds = time.perf_counter() - t0
    return out, report


def _optimize(lowered, base, level, b, verify, seed, deadline, work, budget, approx, report,
              progress, routed) -> tuple:
    """``(output, strategy)`` of one lowered circuit without barriers (``base``: it rebased);
    approximations spend from the shared ``budget`` (nothing when the exact result is kept)."""
    if level < 1:
        return base, ""

    def search(bud):
        s = Search(verify, seed, Work(work, deadline),
                   bud, report.log, progress, b.euler == "CLIFFORD_T",
                   functools.partial(_admissible, basis=b, limit=score(base), routed=routed))
        out, name = _no_worse(_candidates(lowered, level, s, b, routed), base)
        report.time_cut = report.time_cut or s.work.cut
        report.work = (report.work or 0.0) + s.work.used
        return out, name

    if approx:  # the exact search's result is a candidate too: --approx is never worse
        exact, exact_name = search(Budget(0.0))
    spent = budget.spent
    out, name = search(budget)
    if approx and score(exact) <= score(out):
        report.log.append(f"exact search {cx_count(exact.operations)} CX <= approximate "
                          f"{cx_count(out.operations)} CX: exact result kept")
        out, name = exact, exact_name + " (exact)"
        budget.spent = spent
    return out, name


def _segments(c: Circuit) -> list:
    """The parts of ``c`` between its barriers (one part when it has none inside)."""
    cuts = sorted({pos for pos, _ in c.barriers if 0 < pos < len(c.operations)})
    edges = [0, *cuts, len(c.operations)]
    return [Circuit(c.num_wires, c.operations[a:z], (), c.num_params, c.wire_labels)
            for a, z in zip(edges, edges[1:])]


def _joined(parts: list, source: Circuit) -> Circuit:
    """The parts' operations in order, with ``source``'s barriers between them and its
    measurements."""
    cuts = sorted({pos for pos, _ in source.barriers if 0 < pos < len(source.operations)})
    at = {0: 0, len(source.operations): sum(len(p.operations) for p in parts)}
    total = 0
    for cut, part in zip(cuts, parts):
        total += len(part.operations)
        at[cut] = total
    ops = tuple(o for p in parts for o in p.operations)
    return Circuit(parts[0].num_wires, ops, source.measurements, parts[0].num_params,
                   parts[0].wire_labels, tuple((at[pos], wires) for pos, wires in source.barriers))


def _check_args(level, verify, approx, work=None) -> None:
    if level not in LEVELS:
        raise QdiffError(f"optimization level {level!r}: expected 0, 1, 2 or 3")
    if verify not in VERIFY:
        raise QdiffError(f"verify {verify!r}: expected one of {', '.join(VERIFY)}")
    if approx is not None and not (isinstance(approx, (int, float)) and 0 < approx < 1):
        raise QdiffError(f"approx {approx!r}: expected a process-infidelity budget in (0, 1)")
    if work is not None and not (isinstance(work, (int, float)) and not isinstance(work, bool)
                                 and math.isfinite(work) and work > 0):
        raise QdiffError(f"work {work!r}: expected a positive, finite number of work units")


def _count(report, c, when: str) -> None:
    setattr(report, f"cx_{when}", cx_count(c.operations))
    setattr(report, f"depth_{when}", depth(c.operations, c.num_wires))
    setattr(report, f"gates_{when}", len(c.operations))
    setattr(report, f"t_{when}", t_count(c.operations))


def _candidates(lowered: Circuit, level: int, s, b, routed) -> list:
    """``[(name, circuit in the basis)]`` from the levels up to ``level``, best last."""
    log, tol = s.log, s.budget.tol
    l1 = guarded(level1, s.verify, log, tol)(lowered)
    raw = [("level1", l1)]
    if level >= 2:
        l2 = guarded(level2, s.verify, log, tol)(lowered)
        raw.append(("level2", l2))
    if level >= 3:
        from qdiff.compiler.level3 import optimize3
        opt3, name3 = optimize3(lowered, raw[-1][1], s, routed and routed.allowed)
        raw.append((name3, opt3))
    if not s.budget.exact:  # spend what is left on the gates nearest the identity
        name, c = raw[-1]
        dropped = guarded(chain(lambda x: drop_small_gates(x, s.budget), level1 if s.discrete
                                else level2), s.verify, log, tol)(c)
        raw.append((name + "+drop", dropped))
    out = []
    for name, c in raw:
        try:
            t = _in_basis(c, b, routed)
        except QdiffError as exc:  # e.g. an angle a discrete basis cannot write exactly
            log.append(f"{name}: not expressible in the basis ({exc})")
            continue
        out.append((name, t))
    return out


def _rebased(lowered, b, routed):
    """``lowered`` rewritten gate by gate into the basis (the rebased input every level is
    compared with, and level 0's output); on a target, its two-qubit gates turned to the
    device's directions."""
    t = translate(lowered, b, fuse=False)
    if routed is not None:
        from qdiff.compiler.target import fix_directions
        t = translate(fix_directions(t, routed, b), b, fuse=False)
    return t


def _in_basis(c, b, routed):
    t = translate(c, b, fuse=True)
    if routed is not None:
        from qdiff.compiler.target import fix_directions
        t = translate(fix_directions(t, routed, b), b, fuse=True)
    return t


def _admissible(c, basis, limit, routed) -> bool:
    """Whether ``c``, written in the basis, is within the rebased input's counts."""
    try:
        return all(x <= y for x, y in zip(score(_in_basis(c, basis, routed)), limit))
    except QdiffError:
        return False


def _no_worse(cands, base):
    """The candidate with the fewest (2q, depth, gates, T) whose counts are each at most the
    rebased input's; the rebased input when none is."""
    limit = score(base)
    ok = [(n, c) for n, c in cands if all(x <= y for x, y in zip(score(c), limit))]
    if not ok:
        return base, "input"
    name, c = min(reversed(ok), key=lambda t: score(t[1]))
    return c, name


def _as_import(x):
    from qdiff.circuits.qiskit_io import QiskitImport, from_qiskit, is_quantum_circuit
    from qdiff.circuits import qasm
    if isinstance(x, QiskitImport):
        return x
    if isinstance(x, Circuit):
        return QiskitImport(x)
    if isinstance(x, os.PathLike):
        return qasm.load(x)
    if isinstance(x, str):
        if os.path.isfile(x):  # an existing file is a path, whatever its name contains
            return qasm.load(x)
        if "OPENQASM" in x or ";" in x:
            return qasm.loads(x)
        if os.path.exists(x):
            return qasm.load(x)
        raise QdiffError(f"compile: '{x[:60]}' is neither OpenQASM text nor an existing file")
    if is_quantum_circuit(x):
        return from_qiskit(x, dynamic=False)  # the compiler takes unitary circuits
    raise QdiffError(f"compile: expected a Circuit, a QuantumCircuit, OpenQASM text or a path; "
                     f"got {type(x).__name__}")
