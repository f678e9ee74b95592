"""Hybrid training step (forward + backward + Adam) with a quantum layer: qdiff vs PennyLane.

Model: AngleEmbedding + StronglyEntanglingLayers(3), expval Z on every wire, then Linear(n, 1).
Peers: PennyLane TorchLayer on default.qubit (backprop, broadcasting) and on lightning.qubit
(adjoint, device_vjp=True). Each configuration is timed in the same run, interleaved, and the
median of several steps is reported with the ratio to qdiff.

    python bench/bench_training.py [--sizes 4,8] [--batches 32,256] [--steps 7] [--threads 1]
        [--qdiff-methods backprop,adjoint]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

warnings.filterwarnings("ignore")


def qdiff_model(n, method):
    import torch
    import qdiff as qd
    dev = qd.device("statevector", wires=n)

    @qd.qnode(dev, diff_method=method)
    def circuit(inputs, weights):
        qd.AngleEmbedding(inputs, wires=range(n))
        qd.StronglyEntanglingLayers(weights, wires=range(n))
        return [qd.expval(qd.Z(i)) for i in range(n)]
    layer = qd.QuantumLayer(circuit, {"weights": (3, n, 3)}, dtype=torch.float64)
    return torch.nn.Sequential(layer, torch.nn.Linear(n, 1, dtype=torch.float64))


def pennylane_model(n, device_name, diff_method, **kw):
    import pennylane as qml
    import torch
    dev = qml.device(device_name, wires=n)

    @qml.qnode(dev, interface="torch", diff_method=diff_method, **kw)
    def circuit(inputs, weights):
        qml.AngleEmbedding(inputs, wires=range(n))
        qml.StronglyEntanglingLayers(weights, wires=range(n))
        return [qml.expval(qml.PauliZ(i)) for i in range(n)]
    layer = qml.qnn.TorchLayer(circuit, {"weights": (3, n, 3)})
    return torch.nn.Sequential(layer, torch.nn.Linear(n, 1, dtype=torch.float64)).double()


def step_timer(model, x, y):
    import torch
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).reshape(-1, 1), y)
        loss.backward()
        opt.step()
    return step


def median_time(step, reps):
    step()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4,8")
    ap.add_argument("--batches", default="32,256")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--qdiff-methods", default="backprop,adjoint",
                    help="comma-separated qdiff diff methods, each timed in the same run")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch
    torch.set_num_threads(args.threads)
    methods = args.qdiff_methods.split(",")
    rows = []
    head = "".join(f"{'qdiff ' + m + ' ms':>22}" for m in methods)
    print(f"{'n':>3} {'B':>5}{head} {'PL default.qubit ms':>20} {'PL lightning ms':>16} "
          f"{'best qdiff vs best PL':>22}")
    for n in [int(s) for s in args.sizes.split(",")]:
        for b in [int(s) for s in args.batches.split(",")]:
            torch.manual_seed(0)
            x = torch.rand(b, n, dtype=torch.float64)
            y = torch.rand(b, 1, dtype=torch.float64)
            steps = {m: step_timer(qdiff_model(n, m), x, y) for m in methods}
            steps["default"] = step_timer(pennylane_model(n, "default.qubit", "backprop"), x, y)
            steps["lightning"] = step_timer(pennylane_model(n, "lightning.qubit", "adjoint",
                                                            device_vjp=True), x, y)
            times = {k: [] for k in steps}
            for _ in range(3):  # interleave so that load drift hits every configuration
                for k, s in steps.items():
                    times[k].append(median_time(s, args.steps))
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            best_pl = min(med["default"], med["lightning"])
            best_q = min(med[m] for m in methods)
            ratio = best_pl / best_q
            rows.append((n, b, med, ratio))
            cols = "".join(f"{med[m]:>22.2f}" for m in methods)
            print(f"{n:>3} {b:>5}{cols} {med['default']:>20.2f} {med['lightning']:>16.2f} "
                  f"{ratio:>21.1f}x", flush=True)
    return rows


if __name__ == "__main__":
    main()
