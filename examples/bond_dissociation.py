"""H2 bond dissociation curve: VQE against exact and Hartree-Fock over a range of bond lengths.

Each point builds the STO-3G Hamiltonian at bond length R (PennyLane qchem, offline), runs the
Givens VQE (HF + all single/double excitations) warm-started from the previous point's optimal
parameters, and compares with qdiff's exact (Lanczos, 2-electron Sz=0 sector) and the HF energy.
Stretched H2 is where HF fails (static correlation): the double-excitation angle grows from
about -0.2 to about -pi/2, and the warm start carries it along.

    python examples/bond_dissociation.py [--points 10] [--rmin 0.5] [--rmax 2.5]
        [--target-mha 0.1] [--steps 200] [--plot curve.png] [--backend ...]
"""
from __future__ import annotations

if __name__ == "__main__":  # first: Ctrl-C during the imports below is one line, exit 130
    import _startup  # noqa: F401

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _vqe_common as common  # noqa: E402
from qdiff.circuits import memory  # noqa: E402
from qdiff.circuits.fileio import save_figure  # noqa: E402


def curve(args, log=print) -> list:
    """One dict per bond length: R, hf, exact, vqe, error, steps, wall."""
    memory.require(1000.0 * args.points, f"--points {args.points}: the bond lengths and "
                                          "their result rows")
    rows, w = [], None
    log(f"{'R (A)':>6} {'HF (Ha)':>12} {'exact (Ha)':>12} {'VQE (Ha)':>12} {'HF err mHa':>10} "
        f"{'VQE err mHa':>11} {'steps':>5} {'loop s':>7}")
    for r in np.linspace(args.rmin, args.rmax, args.points):
        prob = common.molecular_problem("H2", coordinates=(0.0, 0.0, 0.0, 0.0, 0.0, float(r)))
        prob.target = args.target_mha * 1e-3
        res = common.vqe(prob, args, log=lambda *a: None, w0=w if args.warm else None)
        w = res.params
        row = dict(R=float(r), hf=prob.hf_energy, exact=prob.exact, vqe=res.final_energy,
                   error=res.final_energy - prob.exact, steps=res.steps, wall=res.wall,
                   reached=res.reached is not None)
        rows.append(row)
        log(f"{r:6.3f} {prob.hf_energy:12.6f} {prob.exact:12.6f} {res.final_energy:12.6f} "
            f"{1000 * (prob.hf_energy - prob.exact):10.2f} {1000 * row['error']:11.4f} "
            f"{res.steps:5d} {res.wall:7.3f}")
    return rows


def plot(rows, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    r = [x["R"] for x in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(r, [x["hf"] for x in rows], "s:", color="gray", label="Hartree-Fock")
    a.plot(r, [x["exact"] for x in rows], "k-", label="exact (Lanczos)")
    a.plot(r, [x["vqe"] for x in rows], "o", mfc="none", label="VQE")
    a.set_xlabel("H-H distance (angstrom)")
    a.set_ylabel("energy (Ha)")
    a.set_title("H2 / STO-3G dissociation")
    a.legend()
    b.semilogy(r, [max(1000 * abs(x["error"]), 1e-9) for x in rows], "o-", label="VQE error")
    b.semilogy(r, [1000 * (x["hf"] - x["exact"]) for x in rows], "s:", color="gray",
               label="HF error")
    b.axhline(1.6, color="r", ls="--", label="chemical accuracy")
    b.set_xlabel("H-H distance (angstrom)")
    b.set_ylabel("E - E_exact (mHa)")
    b.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=120)  # atomic: an interrupted run leaves no partial plot
    plt.close(fig)


def main(argv=None, log=print):
    p = common.parser(__doc__.splitlines()[0], steps=200, lr=0.1)
    p.add_argument("--points", type=common.positive_int, default=10)
    p.add_argument("--rmin", type=common.positive_float, default=0.5)
    p.add_argument("--rmax", type=common.positive_float, default=2.5)
    p.add_argument("--target-mha", type=common.positive_float, default=0.1,
                   help="stop each point at this error (exact backend)")
    p.add_argument("--no-warm", dest="warm", action="store_false",
                   help="start every point from the HF state instead")
    args = p.parse_args(argv)
    if args.rmax < args.rmin:
        p.error(f"--rmax {args.rmax} is below --rmin {args.rmin}")
    common.setup(args)
    rows = curve(args, log)
    worst = max((x["error"] for x in rows), key=abs)  # a noisy estimate can be below exact
    log(f"worst VQE error {1000 * worst:.4f} mHa; total steps {sum(x['steps'] for x in rows)}; "
        f"total loop time {sum(x['wall'] for x in rows):.2f} s")
    if args.plot:
        plot(rows, args.plot)
        log(f"plot saved to {args.plot}")
    return rows


if __name__ == "__main__":
    common.run(main)
