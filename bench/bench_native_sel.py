"""StronglyEntanglingLayers(L=6): qdiff's native kernels against qulacs, qsim, lightning.qubit
and Aer, complex128 and complex64, forward to the final state and the adjoint gradient.

Table 1 (forward): time to evolve |0...0> through SEL(L=6) (6n Rot + 6n CNOT) and have the
final state; qdiff = the native coded program (``native.run_plan``, no copy of the state; the
peers return theirs, which the table also shows as "empty circuit" overhead) run from |0...0>
as the engine runs a circuit without an initial state (the first layer's rotations, a product
state, written in one pass); "every gate" = the same program applied gate by gate to the
state as it is (no product start); ratios are qdiff / peer in the same run (< 1: qdiff
faster).
Table 2 (gradient): forward + backward of sum_i <Z_i> with respect to the SEL weights through
torch autograd: qdiff ``diff_method="adjoint"`` vs lightning.qubit ``diff_method="adjoint"``
(both through PennyLane/qdiff's torch interface; lightning with ``device_vjp=True``, so that it
computes one vector-Jacobian product, not the full Jacobian).

Each configuration is measured in ``--runs`` interleaved rounds (median CPU time of ``--reps``
calls each; 1 thread everywhere); the tables give the median and the range over the rounds.

    OMP_NUM_THREADS=1 python bench/bench_native_sel.py [--sizes 16 20 22] [--runs 3]
"""
from __future__ import annotations

import datetime
import statistics
import sys
import warnings

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from benchutil import ArgumentParser  # noqa: E402
from native_peers import MAKERS, PEERS, cpu_time, pick_peers, sel_ops  # noqa: E402

warnings.filterwarnings("ignore")
DTYPES = {"c128": torch.complex128, "c64": torch.complex64}


def fmt(vals, scale=1e3):
    med = statistics.median(vals) * scale
    return f"{med:.3g} [{min(vals) * scale:.3g}-{max(vals) * scale:.3g}]"


def forward_round(n, layers, sims, reps, out):
    ops = sel_ops(n, layers)
    for dt, cdtype in DTYPES.items():
        for name in sims[dt] + ["qdiff every gate"]:
            if name == "qdiff every gate":
                run = MAKERS["qdiff"](n, ops, cdtype)
            elif name == "qdiff":
                run = MAKERS["qdiff"](n, ops, cdtype, from_zero=True)
            else:
                run = MAKERS[name](n, ops, cdtype)
            empty = MAKERS[name](n, [], cdtype) if name in MAKERS and name != "qdiff" else (lambda: None)
            out.setdefault((n, dt, name), []).append(cpu_time(run, reps))
            out.setdefault((n, dt, name + " empty"), []).append(cpu_time(empty, reps))


def grad_qdiff(n, layers, cdtype, static=False):
    import qdiff as qd
    dev = qd.device("statevector", wires=n, dtype=cdtype)

    @qd.qnode(dev, diff_method="adjoint", static=static)
    def f(w):
        qd.StronglyEntanglingLayers(w, wires=range(n))
        return [qd.expval(qd.Z(i)) for i in range(n)]
    w = torch.rand(layers, n, 3, dtype=torch.float64, requires_grad=True)
    return lambda: torch.autograd.grad(f(w).sum(), w)


def grad_lightning(n, layers, cdtype):
    import numpy as np
    import pennylane as qml
    dev = qml.device("lightning.qubit", wires=n,
                     c_dtype=np.complex128 if cdtype == torch.complex128 else np.complex64)

    @qml.qnode(dev, interface="torch", diff_method="adjoint", device_vjp=True)
    def f(w):
        qml.StronglyEntanglingLayers(w, wires=range(n))
        return [qml.expval(qml.PauliZ(i)) for i in range(n)]
    w = torch.rand(layers, n, 3, dtype=torch.float64, requires_grad=True)
    return lambda: torch.autograd.grad(torch.stack(f(w)).sum(), w)


def grad_round(n, layers, reps, out, sims):
    for dt, cdtype in DTYPES.items():
        for name, make in (("qdiff", grad_qdiff), ("lightning", grad_lightning)):
            if name in sims[dt]:
                out.setdefault((n, dt, name), []).append(cpu_time(make(n, layers, cdtype), reps))


def tables(sizes, sims, fwd, grad, layers=6):
    """The forward tables (when ``fwd`` holds timings) and the gradient table (when ``grad``
    does)."""
    if fwd:
        forward_tables(sizes, sims, fwd, layers)
    if grad:
        gradient_table(sizes, grad)


def forward_tables(sizes, sims, fwd, layers=6):
    print(f"\nForward, SEL(L={layers}) to the final state: CPU ms, median [range] over rounds")
    for dt in DTYPES:
        peers = [s for s in sims[dt] if s != "qdiff"]
        last = "lightning" if "lightning" in peers else (peers or [None])[0]
        print(f"\n{dt}\n| n | qdiff | qdiff every gate | " + "".join(p + " | " for p in peers)
              + "".join(f"qdiff/{p} | " for p in peers)
              + (f"every gate/{last} |" if last else "every gate/qdiff |"))
        print("|---" * (4 + 2 * len(peers)) + "|")
        for n in sizes:
            q, qa = fwd[(n, dt, "qdiff")], fwd[(n, dt, "qdiff every gate")]
            cells = [fmt(fwd[(n, dt, p)]) for p in peers]
            ratios = [fmt([a / b for a, b in zip(q, fwd[(n, dt, p)])], 1) for p in peers]
            every = fmt([a / b for a, b in zip(qa, fwd[(n, dt, last or "qdiff")])], 1)
            print(f"| {n} | {fmt(q)} | {fmt(qa)} | " + "".join(c + " | " for c in cells)
                  + "".join(r + " | " for r in ratios) + f"{every} |")
        print("peers' fixed overhead (empty circuit, ms): " + ", ".join(
            f"n={n} {p} {statistics.median(fwd[(n, dt, p + ' empty')]) * 1e3:.3g}"
            for n in sizes for p in peers) or "no peer")


def gradient_table(sizes, grad):
    print("\nGradient of sum_i <Z_i> (forward + adjoint backward), CPU ms, median [range]")
    print("\n| n | dtype | qdiff | lightning | qdiff/lightning | qdiff c64/c128 |")
    print("|---|---|---|---|---|---|")
    for n in sizes:
        for dt in DTYPES:
            q, lt = grad[(n, dt, "qdiff")], grad.get((n, dt, "lightning"))
            half = fmt([a / b for a, b in zip(grad[(n, "c64", "qdiff")],
                                               grad[(n, "c128", "qdiff")])], 1)
            vs = (fmt(lt), fmt([a / b for a, b in zip(q, lt)], 1)) if lt else ("unavailable",
                                                                              "-")
            print(f"| {n} | {dt} | {fmt(q)} | {vs[0]} | {vs[1]} | "
                  f"{half if dt == 'c64' else ''} |")


def main():
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 20, 22])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--no-grad", action="store_true")
    ap.add_argument("--no-forward", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sims = pick_peers(PEERS, DTYPES)
    print(f"{datetime.date.today()}  torch {torch.__version__}, 1 thread; simulators: {sims}")
    fwd, grad = {}, {}
    for r in range(args.runs):
        for n in args.sizes:
            if not args.no_forward:
                forward_round(n, args.layers, sims, args.reps, fwd)
            if not args.no_grad:
                grad_round(n, args.layers, max(1, args.reps - 1), grad, sims)
        print(f"round {r + 1}/{args.runs} done", file=sys.stderr, flush=True)
    tables(args.sizes, sims, fwd, grad, args.layers)


if __name__ == "__main__":
    main()
