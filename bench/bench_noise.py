"""Noisy gradient: a 6-layer hardware-efficient ansatz (RY, RZ on every wire, a CNOT chain)
with a depolarizing channel and amplitude damping after every gate on each of its wires;
gradient of <Z_0> (summed over the batch) with respect to every angle.

qdiff: the mixed-state engine with ``diff_method="best"`` (its reverse mode: a backward sweep
of the observable through the adjoint maps; checked to be what "best" picks) and, as a second
column, torch backprop through the simulation. Peers, timed in the same run (medians of
interleaved repetitions): PennyLane default.mixed (torch backprop, parameter broadcasting for
the batch) and Qiskit Aer density-matrix simulation with parameter-shift (all 2P shifted
bindings of every batch member in one EstimatorV2 call, exact expectation values). A peer
predicted to exceed --peer-limit seconds (16x per two more qubits from its previous size, or
64x its batch-1 time for batch 64 on Aer, which runs the bindings one after another) is not
run; one predicted to take more than a quarter of it runs once, in a child process stopped
at --peer-limit (reported as a lower bound when stopped).
Memory: bytes of one density matrix (16 * 4**n), the reverse mode's plan (density matrices
per binding it holds at the peak, chunk of bindings, and the bytes its memory guard checks),
and the peak resident memory a fresh process adds for one reverse-mode gradient (VmHWM minus
the same process after a 2-qubit gradient) with glibc's mmap threshold fixed at 64 KiB, so that
freed tensors go back to the system and the peak is that of live allocations (glibc's default
dynamic threshold keeps freed 16 MiB blocks in its heap, which inflates VmHWM by tens of
percent). The peak is not measured for a configuration whose gradient took over --peak-limit
seconds.

    python bench/bench_noise.py [--sizes 4,6,8,10] [--batches 1,64] [--reps 3]
"""
from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import ArgumentParser, check_peers  # noqa: E402

warnings.filterwarnings("ignore")
PEER_MODULES = {"pennylane": "pennylane", "aer": "qiskit_aer"}
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
    """Peak resident bytes a fresh process adds for one reverse-mode gradient: its VmHWM (the
    high-water mark of this process image; ru_maxrss would carry the parent's over exec) minus
    that of the same process after a 2-qubit gradient, glibc's mmap threshold fixed."""
    here = os.path.dirname(os.path.abspath(__file__))
    run = ("import sys; sys.path.insert(0, %r); import bench_noise as b; "
           "g = b.qdiff_grad(2, 1); g(); h0 = int(" + _HWM + "); "
           "g = b.qdiff_grad(%d, %d); g(); print(int(" + _HWM + ") - h0)")
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run([sys.executable, "-c", run % (here, n, batch)], capture_output=True,
                         text=True, check=True, env=env).stdout.split()[-1]
    return 1024.0 * int(out)


def reverse_plan(n, batch):
    """The memory plan of the reverse mode for the benchmark circuit (and that "best" picks
    it)."""
    import torch
    import qdiff as qd
    from qdiff.rules import ADJOINT, best
    dev = qd.device("mixed", wires=n)

    @qd.qnode(dev)
    def f(x):
        for layer in range(LAYERS):
            for w in range(n):
                qd.RY(x[..., layer, w, 0], wires=w)
                qd.DepolarizingChannel(P_DEP, wires=w)
                qd.AmplitudeDamping(GAMMA, wires=w)
                qd.RZ(x[..., layer, w, 1], wires=w)
                qd.DepolarizingChannel(P_DEP, wires=w)
                qd.AmplitudeDamping(GAMMA, wires=w)
            for w in range(n - 1):
                qd.CNOT(wires=[w, w + 1])
                for v in (w, w + 1):
                    qd.DepolarizingChannel(P_DEP, wires=v)
                    qd.AmplitudeDamping(GAMMA, wires=v)
        return qd.expval(qd.Z(0))
    x = torch.zeros(batch, LAYERS, n, 2, dtype=torch.float64, requires_grad=True)
    rec = f.construct(x)[0]
    picked = best(dev, rec.circuit, rec)
    assert picked is ADJOINT, picked
    return dev.reverse_plan(dev.noisy(rec.circuit), batch)


def _child(peer, n, batch, conn):
    fn = {"pennylane": pennylane_grad, "aer": aer_grad}[peer](n, batch)
    conn.send(None)  # set up: the parent's clock starts now
    t0 = time.perf_counter()
    fn()
    conn.send(time.perf_counter() - t0)


def bounded_run(peer, n, batch, limit):
    """One run of a peer in a child process stopped after ``limit`` s: ``(seconds, done)``."""
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    a, b = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(peer, n, batch, b))
    proc.start()
    a.recv()
    t0 = time.perf_counter()
    if a.poll(limit):
        t = a.recv()
        proc.join()
        return t, True
    proc.kill()
    proc.join()
    return time.perf_counter() - t0, False


def main(argv=None):
    ap = ArgumentParser()
    ap.add_argument("--sizes", default="4,6,8,10")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--peer-limit", type=float, default=60.0)
    ap.add_argument("--peak-limit", type=float, default=120.0)
    ap.add_argument("--peers", default="pennylane,aer", help="peers to run ('none': none)")
    ap.add_argument("--bounded", action="store_true",
                    help="run every peer once in a child process stopped at --peer-limit")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    peers = [] if args.peers == "none" else [p for p in args.peers.split(",") if p]
    unknown = [p for p in peers if p not in PEER_MODULES]
    if unknown:
        ap.error(f"--peers: unknown {', '.join(unknown)} (choose from "
                 f"{', '.join(PEER_MODULES)}, or none)")
    gone = check_peers({p: PEER_MODULES[p] for p in peers})
    peers = [p for p in peers if p not in gone]
    import torch
    torch.set_num_threads(1)
    rows = []
    skip = {"pennylane": set(), "aer": set()}
    last = {}  # (peer, batch) -> (n, seconds) of its previous size; (peer, 1, n) -> seconds
    print(f"threads=1; machine shared and noisy (load average {os.getloadavg()[0]:.1f} at the "
          f"start); {LAYERS} layers, dep p={P_DEP}, amp gamma={GAMMA}")
    print(f"{'n':>3} {'B':>4} {'reverse s':>10} {'backprop s':>11} {'default.mixed s':>16} "
          f"{'aer PS s':>10} {'x dm':>7} {'x aer':>7} {'x bp':>6} {'state MiB':>10} "
          f"{'plan':>14} {'guard MiB':>10} {'peak MiB':>9} {'load':>5}")
    for batch in [int(b) for b in args.batches.split(",")]:
        for n in [int(s) for s in args.sizes.split(",")]:
            plan = reverse_plan(n, batch)
            fns = {"qdiff": qdiff_grad(n, batch)}
            t0 = time.perf_counter()
            fns["qdiff"]()
            first_q = time.perf_counter() - t0
            bp = qdiff_grad(n, batch, "backprop")
            try:
                bp()
                fns["backprop"] = bp
            except MemoryError as exc:  # QdiffMemoryError: refused before allocating
                refused = str(exc)
                print(f"    backprop refused: {refused}", flush=True)
            times = {k: [] for k in fns}
            if first_q >= 60:  # one run is the measurement (no separate warm-up)
                times["qdiff"] = [first_q]
                del fns["qdiff"]
            bounds = {}
            for peer, make in (("pennylane", pennylane_grad), ("aer", aer_grad)):
                if peer not in peers:
                    continue
                guess = None
                if (peer, batch) in last:
                    pn, pt = last[(peer, batch)]
                    guess = pt * 4.0 ** (n - pn) * n / pn
                if peer == "aer" and batch > 1 and (peer, 1, n) in last:
                    guess = last[(peer, 1, n)] * batch
                if batch in skip[peer] or (guess is not None and guess > args.peer_limit):
                    skip[peer].add(batch)
                    continue
                if args.bounded or (guess is not None and guess > args.peer_limit / 4):
                    t, done = bounded_run(peer, n, batch, args.peer_limit)
                    if done:
                        times[peer] = [t]
                    else:
                        bounds[peer] = t
                    skip[peer].add(batch)
                    continue
                fn = make(n, batch)
                t0 = time.perf_counter()
                fn()
                first = time.perf_counter() - t0
                times[peer] = [first]
                if first > args.peer_limit:
                    skip[peer].add(batch)
                else:
                    fns[peer] = fn
            reps = args.reps if first_q < 60 else 1
            for _ in range(reps if fns else 0):  # interleaved
                for k, fn in fns.items():
                    times[k] += timed(fn, 1)
            med = {k: statistics.median(v) for k, v in times.items() if v}
            for k, v in med.items():
                last[(k, batch)] = (n, v)
                if batch == 1:
                    last[(k, 1, n)] = v
            q = med["qdiff"]
            peak = peak_memory(n, batch) if q < args.peak_limit else None
            load = os.getloadavg()[0]
            row = {"n": n, "batch": batch, **{k + "_s": v for k, v in med.items()},
                   **{k + "_more_than_s": v for k, v in bounds.items()},
                   "state_bytes": 16.0 * 4 ** n, "plan_states": plan.states,
                   "plan_chunk": plan.chunk, "plan_interval": plan.interval,
                   "guard_bytes": plan.need, "peak_bytes": peak, "load": load}
            rows.append(row)

            def fmt(k):
                if k in med:
                    return f"{med[k]:.4g}"
                if k in gone:
                    return "unavailable"
                if k not in peers:
                    return "not run"
                return f">{bounds[k]:.0f}" if k in bounds else "skipped"

            def ratio(k):
                if k in med:
                    return f"{med[k] / q:.1f}"
                return f">{bounds[k] / q:.0f}" if k in bounds else "-"
            plan_s = f"{plan.states:g}x{plan.chunk}" + (f"/ck{plan.interval}"
                                                       if plan.interval > 1 else "")
            peak_s = f"{peak / 2**20:.4g}" if peak is not None else "-"
            bp_s = f"{med['backprop']:.4g}" if "backprop" in med else "refused"
            print(f"{n:>3} {batch:>4} {q:>10.4g} {bp_s:>11} {fmt('pennylane'):>16} "
                  f"{fmt('aer'):>10} {ratio('pennylane'):>7} {ratio('aer'):>7} "
                  f"{ratio('backprop'):>6} {row['state_bytes'] / 2**20:>10.3g} {plan_s:>14} "
                  f"{plan.need / 2**20:>10.4g} {peak_s:>9} {load:>5.1f}", flush=True)
            if args.json:
                from qdiff.circuits.fileio import write_atomic
                write_atomic(args.json, json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
