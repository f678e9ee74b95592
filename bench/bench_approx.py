"""CX saved by ``--approx EPS`` on the public set: qdiff -O3 exact vs EPS = 1e-6, 1e-4, 1e-2.

    python bench/bench_approx.py [--dir ../shared/benchmarks/qasm] [--eps 1e-6 1e-4 1e-2]
                                 [--only NAME ...]

Per circuit: the exact CX count, then for each budget the CX count, the measured process
infidelity (which the budget bounds) and the proven bound on what the approximations spent.
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DIR = os.path.join(HERE, "..", "..", "shared", "benchmarks", "qasm")
sys.path.insert(0, HERE)
from benchutil import ArgumentParser, circuit_files  # noqa: E402


def main(argv=None) -> int:
    import qdiff as qd
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=DEFAULT_DIR)
    ap.add_argument("--eps", type=float, nargs="+", default=[1e-6, 1e-4, 1e-2])
    ap.add_argument("--level", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None, help="circuit names (without .qasm)")
    args = ap.parse_args(argv)
    files = circuit_files(ap, args.dir, args.only)
    head = ["circuit", "exact CX"]
    for e in args.eps:
        head += [f"{e:g} CX", "1-F", "bound"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    tot = [0] * (1 + len(args.eps))
    for path in files:
        _, ex = qd.compile(path, level=args.level)
        row, cx = [os.path.basename(path)[:-5], ex.cx_after], [ex.cx_after]
        for e in args.eps:
            _, rep = qd.compile(path, level=args.level, approx=e)
            ok = "" if rep.verified else " NOT VERIFIED"
            row += [rep.cx_after, f"{rep.infidelity:.0e}{ok}", f"{rep.approx_bound:.0e}"]
            cx.append(rep.cx_after)
        tot = [a + b for a, b in zip(tot, cx)]
        print("| " + " | ".join(str(c) for c in row) + " |", flush=True)
    cells = ["**total**", tot[0]]
    for i, _ in enumerate(args.eps):
        cells += [f"{tot[i + 1]} ({tot[0] - tot[i + 1]} saved)", "", ""]
    print("| " + " | ".join(str(c) for c in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
