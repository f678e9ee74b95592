"""Gradient of sum_i <Z_i> for StronglyEntanglingLayers: qdiff adjoint/backprop vs lightning.qubit.

Peers: lightning.qubit adjoint with device_vjp=True (its fastest configuration) and with the
default device_vjp=False. All timed in the same run (medians), ratios printed.

    python bench/bench_gradients.py [--sizes 4,8,12,16,18,20] [--layers 2,6] [--reps 3]
"""
from __future__ import annotations

import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import ArgumentParser, check_peers  # noqa: E402

warnings.filterwarnings("ignore")


def median_time(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def qdiff_grad(n, layers, method):
    import torch
    import qdiff as qd
    dev = qd.device("statevector", wires=n)

    @qd.qnode(dev, diff_method=method)
    def f(w):
        qd.StronglyEntanglingLayers(w, wires=range(n))
        return qd.expval(qd.Hamiltonian([1.0] * n, [qd.Z(i) for i in range(n)]))
    w = torch.rand(layers, n, 3, dtype=torch.float64, requires_grad=True)
    return lambda: torch.autograd.grad(f(w), w)


def lightning_grad(n, layers, device_vjp):
    import pennylane as qml
    import torch
    dev = qml.device("lightning.qubit", wires=n)

    @qml.qnode(dev, interface="torch", diff_method="adjoint", device_vjp=device_vjp)
    def f(w):
        qml.StronglyEntanglingLayers(w, wires=range(n))
        return qml.expval(qml.sum(*[qml.PauliZ(i) for i in range(n)]))
    w = torch.rand(layers, n, 3, dtype=torch.float64, requires_grad=True)
    return lambda: torch.autograd.grad(f(w), w)


def main(argv=None):
    ap = ArgumentParser()
    ap.add_argument("--sizes", default="4,8,12,16,18,20")
    ap.add_argument("--layers", default="2,6")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--backprop-max", type=int, default=18)
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch
    torch.set_num_threads(args.threads)
    lightning = not check_peers({"lightning.qubit": "pennylane_lightning"})
    print(f"{'n':>3} {'L':>2} {'qdiff adjoint':>14} {'qdiff backprop':>15} {'lightning vjp':>14} "
          f"{'lightning':>10} {'lightning_vjp/qdiff_adj':>24}")
    for n in [int(s) for s in args.sizes.split(",")]:
        for layers in [int(s) for s in args.layers.split(",")]:
            fns = {"adj": qdiff_grad(n, layers, "adjoint"),
                   "bp": qdiff_grad(n, layers, "backprop") if n <= args.backprop_max else None,
                   "lvjp": lightning_grad(n, layers, True) if lightning else None,
                   "l": lightning_grad(n, layers, False) if lightning else None}
            t = {k: (median_time(f, args.reps) if f else float("nan")) for k, f in fns.items()}
            print(f"{n:>3} {layers:>2} {t['adj']:>14.4f} {t['bp']:>15.4f} {t['lvjp']:>14.4f} "
                  f"{t['l']:>10.4f} {t['lvjp'] / t['adj']:>23.2f}x", flush=True)


if __name__ == "__main__":
    main()
