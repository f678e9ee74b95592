"""Noisy gradient: a 6-layer hardware-efficient ansatz (RY, RZ on every wire, a CNOT chain)
with a depolarizing channel and amplitude damping after every gate on each of its wires;
gradient of <Z_0> (summed over the batch) with respect to every angle.

qdiff: the mixed-state engine, backprop. Peers, timed in the same run (medians of
interleaved repetitions): PennyLane default.mixed (torch backprop, parameter broadcasting for
the batch) and Qiskit Aer density-matrix simulation with parameter-shift (all 2P shifted
bindings of every batch member in one EstimatorV2 call, exact expectation values). A peer
whose first run exceeds --peer-limit seconds, or whose run is predicted to exceed it (16x per
two more qubits from the previous size, or 64x its batch-1 time for batch 64 on Aer, which
runs the bindings one after another), is not run (reported as skipped).
Memory: bytes of one density matrix (16 * 4**n) and the peak resident memory of a fresh
process that runs one qdiff gradient (minus the same process before it).

    python bench/bench_noise.py [--sizes 4,6,8,10] [--batches 1,64] [--reps 3]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings

warnings.filterwarnings("ignore")
LAYERS, P_DEP, GAMMA = 6, 0.01, 0.02


def qdiff_grad(n, batch, method="best"):
    import torch
    import qdiff as qd
    dev = qd.device("mixed", wires=n)

    def noise(w):
        qd.DepolarizingChannel(P_DEP, wires=w)
        qd.AmplitudeDamping(GAMMA, wires=w)

    @qd.qnode(dev, diff_method=method)
    def f(x):
        for layer in range(LAYERS):
            for w in range(n):
                qd.RY(x[..., layer, w, 0], wires=w)
                noise(w)
                qd.RZ(x[..., layer, w, 1], wires=w)
                noise(w)
            for w in range(n - 1):
                qd.CNOT(wires=[w, w + 1])
                noise(w)
                noise(w + 1)
        return qd.expval(qd.Z(0))
    x = torch.rand(batch, LAYERS, n, 2, dtype=torch.float64, requires_grad=True)
    return lambda: torch.autograd.grad(f(x).sum(), x)[0]


def pennylane_grad(n, batch):
    import pennylane as qml
    import torch
    dev = qml.device("default.mixed", wires=n)

    def noise(w):
        qml.DepolarizingChannel(P_DEP, wires=w)
        qml.AmplitudeDamping(GAMMA, wires=w)

    @qml.qnode(dev, interface="torch", diff_method="backprop")
    def f(x):
        for layer in range(LAYERS):
            for w in range(n):
                qml.RY(x[..., layer, w, 0], wires=w)
                noise(w)
                qml.RZ(x[..., layer, w, 1], wires=w)
                noise(w)
            for w in range(n - 1):
                qml.CNOT(wires=[w, w + 1])
                noise(w)
                noise(w + 1)
        return qml.expval(qml.PauliZ(0))
    shape = (LAYERS, n, 2) if batch == 1 else (batch, LAYERS, n, 2)
    x = torch.rand(*shape, dtype=torch.float64, requires_grad=True)
    return lambda: torch.autograd.grad(f(x).sum(), x)[0]


def aer_grad(n, batch):
    import numpy as np
    from qiskit import QuantumCircuit
    from qiskit.circuit import ParameterVector
    from qiskit.quantum_info import SparsePauliOp
    from qiskit_aer.noise import NoiseModel, amplitude_damping_error, depolarizing_error
    from qiskit_aer.primitives import EstimatorV2
    e1 = depolarizing_error(P_DEP, 1).compose(amplitude_damping_error(GAMMA))
    nm = NoiseModel()
    nm.add_all_qubit_quantum_error(e1, ["ry", "rz"])
    nm.add_all_qubit_quantum_error(e1.tensor(e1), ["cx"])
    p = LAYERS * n * 2
    th = ParameterVector("t", p)
    qc = QuantumCircuit(n)
    k = 0
    for _ in range(LAYERS):
        for w in range(n):
            qc.ry(th[k], w)
            qc.rz(th[k + 1], w)
            k += 2
        for w in range(n - 1):
            qc.cx(w, w + 1)
    obs = SparsePauliOp("I" * (n - 1) + "Z")
    est = EstimatorV2(options={"backend_options": {"method": "density_matrix",
                                                   "noise_model": nm}})
    x = np.random.default_rng(0).uniform(0, 1, (batch, p))
    shifts = np.concatenate([np.eye(p), -np.eye(p)]) * (math.pi / 2)

    def run():
        vals = (x[:, None, :] + shifts[None]).reshape(-1, p)
        ev = est.run([(qc, obs, vals)]).result()[0].data.evs.reshape(batch, 2, p)
        return 0.5 * (ev[:, 0] - ev[:, 1])
    return run


def timed(fn, reps):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


_HWM = ("[l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]")


def peak_memory(n, batch) -> float:
    """Peak resident bytes a fresh process adds for one qdiff gradient: its VmHWM (the
    high-water mark of this process image; ru_maxrss would carry the parent's over exec)
    minus that of the same process after a 2-qubit gradient."""
    here = os.path.dirname(os.path.abspath(__file__))
    run = ("import sys; sys.path.insert(0, %r); import bench_noise as b; "
           "g = b.qdiff_grad(%d, %d); g(); print(" + _HWM + ")")
    out = [int(subprocess.run([sys.executable, "-c", run % (here, nn, bb)], capture_output=True,
                              text=True, check=True).stdout.split()[-1])
           for nn, bb in ((n, batch), (2, 1))]
    return 1024.0 * (out[0] - out[1])


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4,6,8,10")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--peer-limit", type=float, default=60.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    rows = []
    skip = {"pennylane": set(), "aer": set()}
    last = {}  # (peer, batch) -> (n, seconds) of its previous size; (peer, 1, n) -> seconds
    print(f"threads=1; machine shared and noisy; {LAYERS} layers, dep p={P_DEP}, amp gamma={GAMMA}")
    print(f"{'n':>3} {'B':>4} {'qdiff s':>9} {'default.mixed s':>16} {'aer PS s':>10} "
          f"{'x dm':>7} {'x aer':>7} {'state MiB':>10} {'peak MiB':>9}")
    for batch in [int(b) for b in args.batches.split(",")]:
        for n in [int(s) for s in args.sizes.split(",")]:
            fns = {"qdiff": qdiff_grad(n, batch)}
            try:
                fns["qdiff"]()
            except MemoryError as exc:  # QdiffMemoryError: refused before allocating
                print(f"{n:>3} {batch:>4} qdiff refused: {exc}", flush=True)
                rows.append({"n": n, "batch": batch, "refused": str(exc)})
                continue
            for peer, make in (("pennylane", pennylane_grad), ("aer", aer_grad)):
                guess = None
                if (peer, batch) in last:
                    pn, pt = last[(peer, batch)]
                    guess = pt * 4.0 ** (n - pn) * n / pn
                if peer == "aer" and batch > 1 and (peer, 1, n) in last:
                    guess = last[(peer, 1, n)] * batch
                if guess is not None and guess > args.peer_limit:
                    skip[peer].add(batch)
                if batch not in skip[peer]:
                    fns[peer] = make(n, batch)
            times = {k: [] for k in fns}
            for k, fn in list(fns.items()):  # warm-up; a slow peer stops here
                t0 = time.perf_counter()
                fn()
                first = time.perf_counter() - t0
                if k != "qdiff" and first > args.peer_limit:
                    times[k] = [first]
                    del fns[k]
                    skip[k].add(batch)
            for _ in range(args.reps):  # interleaved
                for k, fn in fns.items():
                    times[k] += timed(fn, 1)
            med = {k: statistics.median(v) for k, v in times.items()}
            for k, v in med.items():
                last[(k, batch)] = (n, v)
                if batch == 1:
                    last[(k, 1, n)] = v
            row = {"n": n, "batch": batch, **{k + "_s": v for k, v in med.items()},
                   "state_bytes": 16.0 * 4 ** n, "peak_bytes": peak_memory(n, batch)}
            rows.append(row)
            q = med["qdiff"]

            def fmt(k):
                return f"{med[k]:.4g}" if k in med else "skipped"

            def ratio(k):
                return f"{med[k] / q:.1f}" if k in med else "-"
            print(f"{n:>3} {batch:>4} {q:>9.4g} {fmt('pennylane'):>16} {fmt('aer'):>10} "
                  f"{ratio('pennylane'):>7} {ratio('aer'):>7} {row['state_bytes'] / 2**20:>10.3g} "
                  f"{row['peak_bytes'] / 2**20:>9.4g}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
