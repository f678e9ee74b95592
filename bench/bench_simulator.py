"""Torch statevector simulator vs PennyLane lightning.qubit / default.qubit and Qiskit Aer.

One thread everywhere (torch.set_num_threads(1); OMP_NUM_THREADS=1 for lightning and Aer), all
peers timed in the same run, medians of ``--reps`` runs. Per gate: "qdiff kernel" is one gate
applied in place (the native kernel when it is built, else the torch one) on wires 0, n/2,
n-2; "in circuit" (qdiff) and the peers are the difference of a circuit of ``--gates`` gates
and an empty one, divided by the gate count (qdiff fuses and chunks a run of equal gates there:
from 2^21 amplitudes on, 20 equal diagonals are one pass, so that column is what qdiff makes of
the run, not a gate's cost; the ratio columns compare the peers with the kernel column). Full circuit: StronglyEntanglingLayers(L=6) forward with expval(Z) on every
wire, qdiff with its native kernels and with the torch kernels only. The floor is
2*16*2**n bytes / the bandwidth of a large torch copy.

    python bench/bench_simulator.py            # n = 10, 14, 18, 20
    python bench/bench_simulator.py --full     # n = 10 .. 24
"""
from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"  # before lightning/aer load their OpenMP runtimes

import os
import statistics
import sys
import time

import numpy as np
import torch

torch.set_num_threads(1)

import qdiff as qd  # noqa: E402
from qdiff.backends.statevector.apply import apply_gate  # noqa: E402
from qdiff.circuits.gates import GATES  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import ArgumentParser, check_peers  # noqa: E402

KINDS = {"1q": ("u3", 3), "cnot": ("cx", 0), "diag": ("rz", 1)}


def median_time(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def bandwidth(reps: int) -> float:
    """Bytes/s of a 256 MiB torch copy (read + write counted)."""
    a = torch.empty(2 ** 25, dtype=torch.float64).fill_(1.0)
    b = torch.empty_like(a)
    t = median_time(lambda: b.copy_(a), reps)
    return 2 * a.numel() * 8 / t


def qdiff_gate(kind: str, n: int, reps: int) -> float:
    """One gate applied in place by qdiff's kernel (native when built, else torch), mean over
    wires 0, n/2, n-2 (median of ``reps`` each)."""
    from qdiff.backends.statevector import native
    name, p = KINDS[kind]
    gate = GATES[name]
    state = torch.zeros(1, 2 ** n, dtype=torch.complex128)
    state[0, 0] = 1
    angles = [torch.tensor([0.3 + 0.1 * i], dtype=torch.float64) for i in range(p)]
    times = []
    for w in sorted({0, n // 2, n - 2}):
        wires = (w,) if gate.num_wires == 1 else (w, w + 1)
        if native.usable(state):
            from qdiff.circuits import Operation, ParamRef
            from qdiff.backends.statevector.gate_data import circuit_angles, circuit_data
            op = Operation(gate, wires, tuple(ParamRef(i) for i in range(p)))
            theta = torch.stack(angles, dim=1) if angles else torch.zeros(1, 0)
            d, = circuit_data([op], circuit_angles([op], theta, torch.float64), state.dtype)
            prog = native.Program(1, n)
            prog.add_data(op, d.kind, d.value, n)
            fn = lambda: native.run(state, prog)  # noqa: E731
        else:
            fn = lambda: apply_gate(state, gate, wires, angles, n, inplace=True)  # noqa: E731
        times.append(median_time(fn, reps))
    return statistics.mean(times)


def _gate_circuit(mod, kind: str, n: int, k: int) -> None:
    for i in range(k):
        w = (i * 7) % (n - 1)
        if kind == "1q":
            mod.U3(0.3, 0.4, 0.5, wires=w)
        elif kind == "cnot":
            mod.CNOT(wires=[w, w + 1])
        else:
            mod.RZ(0.3, wires=w)


def qdiff_gate_circuit(kind: str, n: int, reps: int, count: int) -> float:
    """Per gate by difference of a ``count``-gate circuit and an empty one (as for the peers)."""
    dev = qd.device("statevector", wires=n)

    def make(k):
        @qd.qnode(dev)
        def f():
            _gate_circuit(qd, kind, n, k)
            return qd.expval(qd.Z(0))
        return f
    full, empty = make(count), make(0)
    with torch.no_grad():
        return max(median_time(full, reps) - median_time(empty, reps), 0.0) / count


def pl_gate(device: str, kind: str, n: int, reps: int, count: int) -> float:
    import pennylane as qml
    dev = qml.device(device, wires=n)

    def make(k):
        @qml.qnode(dev)
        def f():
            _gate_circuit(qml, kind, n, k)
            return qml.expval(qml.PauliZ(0))
        return f
    full, empty = make(count), make(0)
    return max(median_time(full, reps) - median_time(empty, reps), 0.0) / count


def aer_gate(kind: str, n: int, reps: int, count: int) -> float:
    from qiskit import QuantumCircuit
    from qiskit_aer import AerSimulator
    sim = AerSimulator(method="statevector", max_parallel_threads=1, fusion_enable=False)

    def make(k):
        qc = QuantumCircuit(n)
        for i in range(k):
            w = (i * 7) % (n - 1)
            if kind == "1q":
                qc.u(0.3, 0.4, 0.5, w)
            elif kind == "cnot":
                qc.cx(w, w + 1)
            else:
                qc.rz(0.3, w)
        qc.save_statevector()
        return qc
    full, empty = make(count), make(0)
    run = lambda qc: sim.run(qc).result()  # noqa: E731
    return max(median_time(lambda: run(full), reps) - median_time(lambda: run(empty), reps),
               0.0) / count


def sel_weights(n: int, layers: int) -> np.ndarray:
    return np.random.default_rng(0).uniform(0, 2 * np.pi, size=(layers, n, 3))


def qdiff_sel(n: int, layers: int, reps: int, torch_kernels: bool = False) -> float:
    from qdiff.backends.statevector import native
    dev = qd.device("statevector", wires=n)
    w = torch.tensor(sel_weights(n, layers))

    @qd.qnode(dev)
    def f(w):
        qd.StronglyEntanglingLayers(w, wires=range(n))
        return [qd.expval(qd.Z(i)) for i in range(n)]
    with torch.no_grad():
        if torch_kernels:
            with native.disabled():
                return median_time(lambda: f(w), reps)
        return median_time(lambda: f(w), reps)


def pl_sel(device: str, n: int, layers: int, reps: int) -> float:
    import pennylane as qml
    dev = qml.device(device, wires=n)
    w = sel_weights(n, layers)

    @qml.qnode(dev)
    def f(w):
        qml.StronglyEntanglingLayers(w, wires=range(n))
        return [qml.expval(qml.PauliZ(i)) for i in range(n)]
    return median_time(lambda: f(w), reps)


def aer_sel(n: int, layers: int, reps: int) -> float:
    from qiskit.quantum_info import SparsePauliOp
    from qiskit_aer import AerSimulator
    from qdiff.circuits.qiskit_io import to_qiskit
    from qdiff.qnode import record_circuit
    w = torch.tensor(sel_weights(n, layers))
    rec = record_circuit(lambda w: (qd.StronglyEntanglingLayers(w, wires=range(n)), qd.state())[1],
                         range(n), w)
    qc = to_qiskit(rec.circuit, rec.theta[0])
    for i in range(n):
        qc.save_expectation_value(SparsePauliOp("Z"), [i], label=f"z{i}")
    sim = AerSimulator(method="statevector", max_parallel_threads=1)
    return median_time(lambda: sim.run(qc).result(), reps)


def main(argv=None) -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="n = 10..24 (default 10, 14, 18, 20)")
    ap.add_argument("--sizes", type=int, nargs="*", help="explicit qubit counts")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--gates", type=int, default=20, help="gates per peer timing circuit")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--default-qubit-max", type=int, default=20,
                    help="largest n for default.qubit (it is slow)")
    args = ap.parse_args(argv)
    sizes = args.sizes or (list(range(10, 25, 2)) if args.full else [10, 14, 18, 20])
    gone = check_peers({"lightning.qubit": "pennylane_lightning", "default.qubit": "pennylane",
                        "aer": "qiskit_aer"})
    have_dq = "default.qubit" not in gone
    bw = bandwidth(args.reps)
    print(f"bandwidth {bw / 1e9:.1f} GB/s (256 MiB torch copy), 1 thread, torch {torch.__version__}")
    print("\n## per gate (ms); ratio = time / floor")
    print("| n | gate | floor | qdiff kernel | qdiff in circuit | lightning | default.qubit | aer | "
          "kernel/floor | lightning/floor | aer/floor | default.qubit/qdiff | "
          "lightning/qdiff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        floor = 2 * 16 * 2 ** n / bw
        for kind in KINDS:
            reps = max(3, args.reps if n <= 20 else 3)
            q = qdiff_gate(kind, n, reps)
            qc = qdiff_gate_circuit(kind, n, reps, args.gates)
            lq = pl_gate("lightning.qubit", kind, n, reps, args.gates) \
                if "lightning.qubit" not in gone else float("nan")
            dq = pl_gate("default.qubit", kind, n, 3, args.gates) \
                if have_dq and n <= args.default_qubit_max else float("nan")
            aer = aer_gate(kind, n, reps, args.gates) if "aer" not in gone else float("nan")
            print(f"| {n} | {kind} | {floor * 1e3:.3f} | {q * 1e3:.3f} | {qc * 1e3:.3f} | "
                  f"{lq * 1e3:.3f} | {dq * 1e3:.3f} | {aer * 1e3:.3f} | {q / floor:.2f} | "
                  f"{lq / floor:.2f} | {aer / floor:.2f} | {dq / q:.2f} | "
                  f"{lq / q:.2f} |", flush=True)
    print(f"\n## StronglyEntanglingLayers(L={args.layers}) forward + expval(Z) on all wires (s)")
    print("| n | qdiff | qdiff torch kernels | lightning | default.qubit | aer | "
          "qdiff/lightning | qdiff/default.qubit | qdiff/aer |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        reps = 3 if n <= 20 else 1
        q = qdiff_sel(n, args.layers, reps)
        q4 = qdiff_sel(n, args.layers, reps, torch_kernels=True)
        lq = pl_sel("lightning.qubit", n, args.layers, reps) \
            if "lightning.qubit" not in gone else float("nan")
        dq = pl_sel("default.qubit", n, args.layers, 1) \
            if have_dq and n <= args.default_qubit_max else float("nan")
        aer = aer_sel(n, args.layers, reps) if "aer" not in gone else float("nan")
        print(f"| {n} | {q:.4f} | {q4:.4f} | {lq:.4f} | {dq:.4f} | {aer:.4f} | {q / lq:.2f} | "
              f"{q / dq:.2f} | {q / aer:.2f} |", flush=True)


if __name__ == "__main__":
    main()
