"""Side-by-side compiler benchmark: input vs Qiskit O3 vs pytket FullPeepholeOptimise vs qdiff
(exact) vs qdiff ``--approx EPS``.

    python bench/bench_compile.py [--dir ../shared/benchmarks/qasm] [--level 3]
                                  [--approx 1e-6] [--no-pytket] [--markdown out.md]

For every circuit (final measurements and barriers stripped, as the benchmark's README says)
it reports two-qubit gate count, depth and wall time of each tool, and each output's measured
process infidelity against the input (qdiff's checker: full unitary up to 12 qubits, random
states above). All tools run in the same process, one circuit after another.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DIR = os.path.join(HERE, "..", "..", "shared", "benchmarks", "qasm")


def load(path):
    import qiskit.qasm2 as q2
    qc = q2.load(path, custom_instructions=q2.LEGACY_CUSTOM_INSTRUCTIONS)
    qc.remove_final_measurements()
    return _strip_barriers(qc)


def _strip_barriers(qc):
    out = qc.copy_empty_like()
    for inst in qc.data:
        if inst.operation.name != "barrier":
            out.append(inst)
    return out


def two_q(qc) -> int:
    return sum(1 for inst in qc.data if inst.operation.num_qubits == 2)


def run_qiskit(qc):
    from qiskit import transpile
    t = time.perf_counter()
    out = transpile(qc, basis_gates=["cx", "u"], optimization_level=3, seed_transpiler=0)
    return out, time.perf_counter() - t


def run_pytket(qc):
    """FullPeepholeOptimise (default options); implicit wire swaps made explicit for checking."""
    import qiskit.qasm2 as q2
    from qiskit import transpile
    from pytket.passes import AutoRebase, FullPeepholeOptimise
    from pytket.circuit import OpType
    from pytket.qasm import circuit_from_qasm_str, circuit_to_qasm_str
    from qiskit import QuantumCircuit
    flat = QuantumCircuit(qc.num_qubits)  # one register: pytket would sort several by name
    flat.compose(qc, qubits=range(qc.num_qubits), inplace=True)
    src = q2.dumps(transpile(flat, basis_gates=["cx", "u3"], optimization_level=0))
    circ = circuit_from_qasm_str(src)
    t = time.perf_counter()
    FullPeepholeOptimise().apply(circ)
    dt = time.perf_counter() - t
    cx, dep = circ.n_gates_of_type(OpType.CX), circ.depth()
    circ.replace_implicit_wire_swaps()
    AutoRebase({OpType.CX, OpType.U3}).apply(circ)
    return circuit_to_qasm_str(circ), cx, dep, dt


def check(qc_in, qc_out) -> float:
    """Measured process infidelity of ``qc_out`` against ``qc_in``."""
    from qdiff.circuits.qiskit_io import from_qiskit
    from qdiff.compiler import equivalence
    return equivalence(from_qiskit(qc_in).circuit, from_qiskit(qc_out).circuit, "final").infidelity


def bench_one(path, level, approx, use_pytket):
    import qdiff as qd
    import qiskit.qasm2 as q2
    from qiskit import transpile
    from qdiff.circuits.qiskit_io import from_qiskit
    qc = load(path)
    base = transpile(qc, basis_gates=["cx", "u"], optimization_level=0)
    row = {"name": os.path.basename(path)[:-5], "qubits": qc.num_qubits,
           "in_cx": two_q(base), "in_depth": base.depth()}
    q3, tq = run_qiskit(qc)
    row.update(qk_cx=two_q(q3), qk_depth=q3.depth(), qk_s=tq, qk_inf=check(qc, q3))
    if use_pytket:
        src, cx, dep, tt = run_pytket(qc)
        out = q2.loads(src, custom_instructions=q2.LEGACY_CUSTOM_INSTRUCTIONS)
        row.update(tk_cx=cx, tk_depth=dep, tk_s=tt, tk_inf=check(qc, out))
    _, rep = qd.compile(from_qiskit(qc), level=level, basis="cx,u")
    row.update(qd_cx=rep.cx_after, qd_depth=rep.depth_after, qd_s=rep.seconds,
               qd_ok=bool(rep.verified), qd_inf=rep.infidelity, qd_method=rep.method,
               qd_strategy=rep.strategy, qd_cut=rep.time_cut)
    if approx:
        _, rep = qd.compile(from_qiskit(qc), level=level, basis="cx,u", approx=approx)
        row.update(ax_cx=rep.cx_after, ax_depth=rep.depth_after, ax_s=rep.seconds,
                   ax_ok=bool(rep.verified), ax_inf=rep.infidelity)
    return row


def _inf(x) -> str:
    return f"{x:.0e}" if x > 1e-14 else "<1e-14"


def markdown(rows, use_pytket, approx) -> str:
    head = ["circuit", "n", "input CX", "depth", "Qiskit O3 CX", "depth", "s", "1-F"]
    if use_pytket:
        head += ["pytket FPO CX", "depth", "s", "1-F"]
    head += ["qdiff CX", "depth", "s", "1-F", "strategy"]
    if approx:
        head += [f"qdiff approx {approx:g} CX", "depth", "s", "1-F"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["name"], r["qubits"], r["in_cx"], r["in_depth"], r["qk_cx"], r["qk_depth"],
                 f"{r['qk_s']:.2f}", _inf(r["qk_inf"])]
        if use_pytket:
            cells += [r["tk_cx"], r["tk_depth"], f"{r['tk_s']:.2f}", _inf(r["tk_inf"])]
        best_other = min(r["qk_cx"], r.get("tk_cx", r["qk_cx"]))
        mark = "**" if r["qd_cx"] < best_other else ""
        ok = "" if r["qd_ok"] else " NOT VERIFIED"
        cells += [f"{mark}{r['qd_cx']}{mark}", r["qd_depth"], f"{r['qd_s']:.1f}",
                  _inf(r["qd_inf"]) + ok, r["qd_strategy"]]
        if approx:
            cells += [r["ax_cx"], r["ax_depth"], f"{r['ax_s']:.1f}", _inf(r["ax_inf"])]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    tot = lambda k: sum(r[k] for r in rows)  # noqa: E731
    cells = ["**total**", "", tot("in_cx"), tot("in_depth"), tot("qk_cx"), tot("qk_depth"),
             f"{tot('qk_s'):.1f}", ""]
    if use_pytket:
        cells += [tot("tk_cx"), tot("tk_depth"), f"{tot('tk_s'):.1f}", ""]
    cells += [f"**{tot('qd_cx')}**", tot("qd_depth"), f"{tot('qd_s'):.1f}",
              f"{sum(r['qd_ok'] for r in rows)}/{len(rows)} verified", ""]
    if approx:
        cells += [tot("ax_cx"), tot("ax_depth"), f"{tot('ax_s'):.1f}", ""]
    lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=DEFAULT_DIR)
    ap.add_argument("--level", type=int, default=3)
    ap.add_argument("--approx", type=float, default=1e-6, help="also run qdiff --approx EPS "
                    "(0: skip)")
    ap.add_argument("--no-pytket", action="store_true")
    ap.add_argument("--markdown", default=None, help="also write the table to this file")
    ap.add_argument("--only", nargs="*", default=None, help="circuit names (without .qasm)")
    args = ap.parse_args(argv)
    use_pytket = not args.no_pytket
    if use_pytket:
        try:
            import pytket  # noqa: F401
        except ImportError:
            print("pytket is not installed: its column is left out", file=sys.stderr)
            use_pytket = False
    files = sorted(glob.glob(os.path.join(args.dir, "*.qasm")))
    if args.only:
        files = [f for f in files if os.path.basename(f)[:-5] in args.only]
    rows = []
    for f in files:
        r = bench_one(f, args.level, args.approx, use_pytket)
        rows.append(r)
        tk = f" tk={r['tk_cx']:5d} ({r['tk_s']:.1f}s)" if use_pytket else ""
        print(f"{r['name']:34s} in={r['in_cx']:5d} qk={r['qk_cx']:5d}{tk} "
              f"qd={r['qd_cx']:5d} ({r['qd_s']:.1f}s, 1-F={r['qd_inf']:.1e}, {r['qd_strategy']})"
              + (f" approx={r['ax_cx']} ({r['ax_s']:.1f}s, 1-F={r['ax_inf']:.1e})"
                 if args.approx else ""), flush=True)
    table = markdown(rows, use_pytket, args.approx)
    print(table)
    if args.markdown:
        from qdiff.circuits.fileio import write_atomic
        write_atomic(args.markdown, table + "\n")
    worse = [r["name"] for r in rows if r["qd_cx"] > r["qk_cx"]]
    print(f"\nqdiff CX > Qiskit O3 on: {worse or 'none'}; unverified: "
          f"{[r['name'] for r in rows if not r['qd_ok']] or 'none'}; slowest qdiff circuit "
          f"{max(r['qd_s'] for r in rows):.1f} s; time-limit cuts: "
          f"{[r['name'] for r in rows if r['qd_cut']] or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
