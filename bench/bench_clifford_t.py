"""Clifford+T compilation of the Nam circuits: T count, CX, gates and depth per level.

    python bench/bench_clifford_t.py [--dir ../shared/benchmarks/qasm]
                                     [--basis h,s,sdg,t,tdg,cx,x,z] [--levels 1 2 3]

Every ``nam_*`` circuit is compiled into the Clifford+T basis at each level; the input columns
are the circuit rebased into the basis (level 0). Each output's process infidelity against the
input is measured (full unitary up to 12 qubits, random states above).
"""
from __future__ import annotations

import argparse
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DIR = os.path.join(HERE, "..", "..", "shared", "benchmarks", "qasm")


def main(argv=None) -> int:
    import qdiff as qd
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=DEFAULT_DIR)
    ap.add_argument("--basis", default="h,s,sdg,t,tdg,cx,x,z")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    args = ap.parse_args(argv)
    head = ["circuit", "n", "input T", "CX", "gates", "depth"]
    for lv in args.levels:
        head += [f"-O{lv} T", "CX", "gates", "depth", "s", "1-F"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    totals = [0] * (len(head) - 2)
    for path in sorted(glob.glob(os.path.join(args.dir, "nam_*.qasm"))):
        cells = []
        rep0 = None
        for lv in args.levels:
            _, rep = qd.compile(path, level=lv, basis=args.basis)
            rep0 = rep
            cells += [rep.t_after, rep.cx_after, rep.gates_after, rep.depth_after,
                      f"{rep.seconds:.1f}", f"{rep.infidelity:.0e}" + ("" if rep.verified
                                                                   else " NOT VERIFIED")]
        first = [rep0.t_before, rep0.cx_before, rep0.gates_before, rep0.depth_before]
        row = [os.path.basename(path)[:-5], rep0.num_qubits] + first + cells
        print("| " + " | ".join(str(c) for c in row) + " |", flush=True)
        vals = first + [v for i, v in enumerate(cells) if not isinstance(v, str)]
        totals = [a + b for a, b in zip(totals, vals + [0] * (len(totals) - len(vals)))]
    tot = ["**total**", ""] + totals[:4]
    k = 4
    for _ in args.levels:
        tot += totals[k:k + 4] + ["", ""]
        k += 4
    print("| " + " | ".join(str(c) for c in tot) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
