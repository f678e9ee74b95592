"""``compile``: the compiler's Python entry point (``qd.compile``).

>>> import qdiff as qd
>>> src = 'OPENQASM 2.0; include "qelib1.inc"; qreg q[2]; cx q[0],q[1]; cx q[0],q[1]; h q[1];'
>>> out, report = qd.compile(src, level=2)
>>> report.cx_before, report.cx_after, report.verified
(2, 0, True)
"""
from __future__ import annotations

import os
import time

from qdiff.circuits.circuit import Circuit
from qdiff.circuits.errors import QdiffError
from qdiff.compiler.basis import parse_basis, translate
from qdiff.compiler.lower import lower
from qdiff.compiler.ops import cx_count, depth
from qdiff.compiler.pipeline import guarded, level1, level2
from qdiff.compiler.report import CompileReport
from qdiff.compiler.verify import equivalence

LEVELS = (0, 1, 2, 3)
DEFAULT_TIME_LIMIT = 60.0  # seconds per circuit at level 3
VERIFY = ("auto", "unitary", "statevector", "none")


def compile(circuit_or_qasm, level: int = 2, basis="cx,u", verify: str = "auto", seed: int = 0,
            time_limit: float | None = None, target: str | None = None, name: str = "<circuit>"):
    """Optimize a circuit; returns ``(Circuit, CompileReport)``.

    ``circuit_or_qasm``: a qdiff ``Circuit``, a Qiskit ``QuantumCircuit``, OpenQASM 2/3 text or
    a path. ``level`` 0-3 (3 adds gradient-based re-synthesis), ``basis`` a comma-separated gate
    list (``"cx,u"``, ``"rz,sx,x,cx"``, ``"cz,rz,sx,x"``, ...), ``target`` an IBM (fake) device
    name whose layout, routing and basis are used, ``time_limit`` seconds per circuit for
    level 3 (default 60; its search stops at 80% of it, verification takes the rest).
    Parametric angles (theta columns) stay affine ParamRefs, so gradients are unchanged.
    """
    t0 = time.perf_counter()
    if level not in LEVELS:
        raise QdiffError(f"optimization level {level!r}: expected 0, 1, 2 or 3")
    if verify not in VERIFY:
        raise QdiffError(f"verify {verify!r}: expected one of {', '.join(VERIFY)}")
    imp = _as_import(circuit_or_qasm)
    report = CompileReport(name=name, level=level, measurements=list(imp.measurements),
                           num_clbits=imp.num_clbits)
    routed = None
    if target is not None:
        from qdiff.compiler.target import route
        routed = route(imp, target, seed)
        source, b, report.measurements = routed.circuit, routed.basis, routed.measurements
        report.target, report.num_clbits = routed.name, routed.num_clbits
    else:
        source, b = imp.circuit, parse_basis(basis)
    report.basis, report.num_qubits = str(b), source.num_wires
    lowered = lower(source)
    base = translate(lowered, b, fuse=False)
    report.cx_before, report.depth_before = cx_count(base.operations), depth(base.operations,
                                                                                base.num_wires)
    report.gates_before = len(base.operations)
    out = base
    if level >= 1:
        # the search stops at 80% of the budget: the rest is for clean-up and verification
        deadline = t0 + 0.8 * (time_limit if time_limit is not None else DEFAULT_TIME_LIMIT)
        opt = _optimize(lowered, level, verify, seed, deadline, report, b,
                        routed.allowed if routed is not None else None)
        out = translate(opt, b, fuse=True)
        if routed is not None:
            from qdiff.compiler.target import fix_directions
            out = translate(fix_directions(out, routed, b), b, fuse=True)
        if cx_count(out.operations) > report.cx_before:
            out = base
    report.cx_after, report.depth_after = cx_count(out.operations), depth(out.operations,
                                                                          out.num_wires)
    report.gates_after = len(out.operations)
    if verify != "none":
        v = equivalence(source, out, verify, seed=seed + 1)
        report.verified, report.method, report.infidelity = v.ok, v.method, v.infidelity
    if routed is not None:
        out = routed.expand(out)
    report.seconds = time.perf_counter() - t0
    return out, report


def _optimize(lowered: Circuit, level: int, verify: str, seed: int, deadline: float,
              report: CompileReport, b, coupling=None):
    log = report.log
    opt = guarded(level1 if level == 1 else level2, verify, log)(lowered)
    report.strategy = f"level{min(level, 2)}"
    if level >= 3:
        from qdiff.compiler.level3 import optimize3
        opt = optimize3(lowered, opt, verify, seed, deadline, report, b, coupling)
    return opt


def _as_import(x):
    from qdiff.circuits.qiskit_io import QiskitImport, from_qiskit
    from qdiff.circuits import qasm
    if isinstance(x, QiskitImport):
        return x
    if isinstance(x, Circuit):
        return QiskitImport(x)
    if isinstance(x, os.PathLike):
        return qasm.load(x)
    if isinstance(x, str):
        if "OPENQASM" in x or ";" in x:
            return qasm.loads(x)
        if os.path.exists(x):
            return qasm.load(x)
        raise QdiffError(f"compile: '{x[:60]}' is neither OpenQASM text nor an existing file")
    if type(x).__name__ == "QuantumCircuit":
        return from_qiskit(x)
    raise QdiffError(f"compile: expected a Circuit, a QuantumCircuit, OpenQASM text or a path; "
                     f"got {type(x).__name__}")
