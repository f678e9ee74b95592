"""Qiskit Machine Learning training step (EstimatorQNN + TorchConnector) on three estimators:
``qdiff.primitives.Estimator``, Qiskit's ``StatevectorEstimator`` and Aer's ``EstimatorV2``;
and, for reference, the same model as ``qd.QuantumLayer.from_qiskit`` (qdiff's own bridge).

Model: ``zz_feature_map(n)`` composed with ``real_amplitudes(n, reps)``, output <Z...Z>
(EstimatorQNN's default observable), exact expectations (``default_precision=0``). One training
step = forward on a batch of B inputs, backward to the weights (Qiskit ML's default
``ParamShiftEstimatorGradient`` on the same estimator: one PUB per shifted binding), an Adam
step. The three estimators are timed interleaved in the same run; the script prints medians and
the ratios, and checks that all produce the same gradients.

    python bench/bench_estimator_qnn.py [--sizes 4,6] [--reps-ansatz 2] [--batch 16] [--reps 5]
"""
from __future__ import annotations

import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import ArgumentParser, check_peers, require  # noqa: E402

warnings.filterwarnings("ignore")


def qml_model(estimator, n, reps, w0):
    import numpy as np
    from qiskit.circuit.library import real_amplitudes, zz_feature_map
    from qiskit_machine_learning.connectors import TorchConnector
    from qiskit_machine_learning.neural_networks import EstimatorQNN
    fm, ansatz = zz_feature_map(n), real_amplitudes(n, reps=reps)
    qnn = EstimatorQNN(circuit=fm.compose(ansatz), input_params=fm.parameters,
                       weight_params=ansatz.parameters, estimator=estimator,
                       default_precision=0.0)
    return TorchConnector(qnn, initial_weights=np.asarray(w0)), "float32"


def qdiff_layer(n, reps, w0):
    import torch
    import qdiff as qd
    from qiskit.circuit.library import real_amplitudes, zz_feature_map
    fm, ansatz = zz_feature_map(n), real_amplitudes(n, reps=reps)
    return qd.QuantumLayer.from_qiskit(fm.compose(ansatz), fm.parameters, ansatz.parameters,
                                       init_method=torch.tensor(w0)), "float64"


def stepper(model, dtype, x, y):
    import torch
    dt = getattr(torch, dtype)
    xx, yy = torch.tensor(x, dtype=dt), torch.tensor(y, dtype=dt)
    opt = torch.optim.Adam(model.parameters(), lr=0.0)  # lr 0: every step sees the same weights

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xx), yy)
        loss.backward()
        opt.step()
        return next(iter(model.parameters())).grad.detach().double().numpy().copy()
    return step


def bench(n, reps_ansatz, batch, reps, aer=True):
    import numpy as np
    from qiskit.primitives import StatevectorEstimator
    from qdiff.primitives import Estimator
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (batch, n))
    y = np.sign(x[:, :1] - 0.5)
    w0 = rng.uniform(0, 2 * np.pi, n * (reps_ansatz + 1))
    runs = {"qdiff.primitives.Estimator": qml_model(Estimator(), n, reps_ansatz, w0),
            "StatevectorEstimator": qml_model(StatevectorEstimator(), n, reps_ansatz, w0)}
    if aer:
        from qiskit_aer.primitives import EstimatorV2 as AerEstimator
        runs["Aer EstimatorV2"] = qml_model(AerEstimator(), n, reps_ansatz, w0)
    runs["qd.QuantumLayer.from_qiskit"] = qdiff_layer(n, reps_ansatz, w0)
    steps = {k: stepper(m, dt, x, y) for k, (m, dt) in runs.items()}
    grads = {k: s() for k, s in steps.items()}  # warm-up; gradients for the check
    ref = grads["StatevectorEstimator"]
    times = {k: [] for k in steps}
    for _ in range(reps):
        for k, s in steps.items():
            t0 = time.perf_counter()
            s()
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nn={n} qubits, real_amplitudes reps={reps_ansatz} ({len(w0)} weights), "
          f"batch {batch}, {reps} interleaved steps (median)")
    base = med["qdiff.primitives.Estimator"]
    for k, t in med.items():
        diff = float(np.abs(grads[k] - ref).max())
        print(f"  {k:30s} {t * 1e3:9.1f} ms/step   x{t / base:6.2f} vs qdiff Estimator   "
              f"max |grad - StatevectorEstimator| {diff:.1e}")
    aer_ratio = (f"{med['Aer EstimatorV2'] / base:.1f}x" if "Aer EstimatorV2" in med
                 else "unavailable")
    print(f"  ratio StatevectorEstimator / qdiff Estimator: "
          f"{med['StatevectorEstimator'] / base:.1f}x; Aer EstimatorV2 / qdiff Estimator: "
          f"{aer_ratio}")


def main():
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,6")
    ap.add_argument("--reps-ansatz", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    require("bench_estimator_qnn.py", "qiskit-machine-learning", "qiskit_machine_learning")
    aer = not check_peers({"Aer EstimatorV2": "qiskit_aer"})
    for n in (int(s) for s in a.sizes.split(",")):
        bench(n, a.reps_ansatz, a.batch, a.reps, aer)


if __name__ == "__main__":
    main()
