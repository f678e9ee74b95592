"""Gradient evaluation on Qiskit Aer: qdiff vs Qiskit Machine Learning (EstimatorQNN +
TorchConnector), both with parameter-shift gradients on Aer's exact estimator.

Model: RY angle embedding of n inputs, then L layers of (RY, RZ on every wire, CNOT chain);
output <sum_i Z_i>. One "gradient evaluation" = forward on a batch of B inputs + backward of
the summed output to the weights AND the inputs (both frameworks compute input gradients).

qdiff:  qd.device("aer", wires=n) (AerSimulator.run, save_expectation_value, exact) with the
        parameter-shift bridge ("best" on Aer): one simulator job forward, one backward.
QML:    EstimatorQNN(estimator=qiskit_aer.primitives.EstimatorV2(), gradient=
        ParamShiftEstimatorGradient(same estimator), input_gradients=True) in a TorchConnector.
Jobs are counted by wrapping each framework's primitive/simulator ``run``.

    python bench/bench_aer_qnn.py [--sizes 4,8] [--layers 2] [--batch 16] [--reps 5]
"""
from __future__ import annotations

import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import ArgumentParser, require  # noqa: E402

warnings.filterwarnings("ignore")


def count_runs(obj):
    """Wrap ``obj.run`` so that calls are counted in ``obj._bench_runs``."""
    orig = obj.run
    obj._bench_runs = 0

    def run(*a, **k):
        obj._bench_runs += 1
        return orig(*a, **k)
    obj.run = run
    return obj


def qdiff_step(n, layers, x, w0):
    import torch
    import qdiff as qd
    dev = qd.device("aer", wires=n)
    sim = count_runs(dev.simulator())

    @qd.qnode(dev)
    def f(inputs, weights):
        for i in range(n):
            qd.RY(inputs[..., i], wires=i)
        for layer in range(layers):
            for i in range(n):
                qd.RY(weights[layer, i, 0], wires=i)
                qd.RZ(weights[layer, i, 1], wires=i)
            for i in range(n - 1):
                qd.CNOT([i, i + 1])
        return qd.expval(sum((qd.Z(i) for i in range(1, n)), qd.Z(0) * 1.0))
    w = torch.tensor(w0, dtype=torch.float64).reshape(layers, n, 2).requires_grad_()
    xx = torch.tensor(x, dtype=torch.float64).requires_grad_()

    def step():
        w.grad = xx.grad = None
        f(xx, w).sum().backward()
        return w.grad.reshape(-1).numpy().copy(), xx.grad.numpy().copy()
    return step, lambda: sim._bench_runs


def qml_step(n, layers, x, w0):
    import torch
    from qiskit import QuantumCircuit
    from qiskit.circuit import ParameterVector
    from qiskit.quantum_info import SparsePauliOp
    from qiskit_aer.primitives import EstimatorV2
    from qiskit_machine_learning.connectors import TorchConnector
    from qiskit_machine_learning.gradients import ParamShiftEstimatorGradient
    from qiskit_machine_learning.neural_networks import EstimatorQNN
    xin = ParameterVector("x", n)
    wp = ParameterVector("w", layers * n * 2)
    qc = QuantumCircuit(n)
    for i in range(n):
        qc.ry(xin[i], i)
    for layer in range(layers):
        for i in range(n):
            qc.ry(wp[(layer * n + i) * 2], i)
            qc.rz(wp[(layer * n + i) * 2 + 1], i)
        for i in range(n - 1):
            qc.cx(i, i + 1)
    obs = SparsePauliOp.from_sparse_list([("Z", [i], 1.0) for i in range(n)], num_qubits=n)
    est = count_runs(EstimatorV2())
    qnn = EstimatorQNN(circuit=qc, estimator=est, observables=obs, input_params=list(xin),
                       weight_params=list(wp), gradient=ParamShiftEstimatorGradient(est),
                       input_gradients=True)
    model = TorchConnector(qnn, initial_weights=torch.tensor(w0, dtype=torch.float64))
    xx = torch.tensor(x, dtype=torch.float64).requires_grad_()

    def step():
        model.zero_grad()
        xx.grad = None
        model(xx).sum().backward()
        return model.weight.grad.numpy().copy(), xx.grad.numpy().copy()
    return step, lambda: est._bench_runs


def timed(step, reps):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        out = step()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main():
    import numpy as np
    ap = ArgumentParser()
    ap.add_argument("--sizes", default="4,8")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    require("bench_aer_qnn.py", "qiskit-aer", "qiskit_aer")
    require("bench_aer_qnn.py", "qiskit-machine-learning", "qiskit_machine_learning")
    rng = np.random.default_rng(0)
    print("| n | layers | batch | qdiff ms | QML ms | QML/qdiff | qdiff jobs/step | QML jobs/step "
          "| max grad diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in [int(s) for s in args.sizes.split(",")]:
        x = rng.uniform(-1, 1, size=(args.batch, n))
        w0 = rng.uniform(0, 2 * np.pi, size=args.layers * n * 2)
        q_step, q_jobs = qdiff_step(n, args.layers, x, w0)
        m_step, m_jobs = qml_step(n, args.layers, x, w0)
        q_step(), m_step()  # warm-up (transpile cache, imports)
        j0q, j0m = q_jobs(), m_jobs()
        tq, (gwq, gxq) = timed(q_step, args.reps)
        tm, (gwm, gxm) = timed(m_step, args.reps)
        jq, jm = (q_jobs() - j0q) / args.reps, (m_jobs() - j0m) / args.reps
        diff = max(np.abs(gwq - gwm).max(), np.abs(gxq - gxm.reshape(gxq.shape)).max())
        print(f"| {n} | {args.layers} | {args.batch} | {1e3 * tq:.1f} | {1e3 * tm:.1f} | "
              f"{tm / tq:.1f} | {jq:.0f} | {jm:.0f} | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
