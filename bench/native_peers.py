"""One gate list, run by qdiff's native kernels and by the fastest CPU statevector simulators
(qulacs, qsim through qsimcirq, PennyLane lightning.qubit, Qiskit Aer), for the native-kernel
benchmarks (``bench_native_gates.py``, ``bench_native_sel.py``, ``bench_native_threads.py``).

A circuit is a list of ``(name, bits, angles)`` with name in ``rx``, ``rot`` (RZ RY RZ, the
general one-qubit gate), ``cx``, and for the per-gate table of further gates ``rz``, ``h``,
``cz``, ``swap``, ``isingxx``, ``isingzz``, ``single_excitation`` (two-bit gates on
``bits = (first, second)``); ``bits`` count from the least significant bit of the basis
index (qdiff wire ``n - 1 - bit``), so every simulator acts on the same amplitudes whatever its
own qubit order. Each ``make_*`` returns ``run()`` that evolves a fresh |0...0> state through
the circuit and returns nothing; peers that cannot skip returning the state return it
(``empty`` circuits time that overhead so that per-gate figures can subtract it).

The peers are bench-only dependencies (``pip install -e ".[bench]"``); a missing one is
reported as unavailable, never faked.
"""
from __future__ import annotations

import math
import os
import statistics
import time

import numpy as np
import torch

PEERS = ("qulacs", "qsim", "lightning", "aer")


def cpu_time(fn, reps: int) -> float:
    """Median CPU time of ``fn()`` over ``reps`` calls (after one warm-up): on a shared machine
    CPU time is steadier than wall time for single-threaded runs."""
    fn()
    ts = []
    for _ in range(reps):
        t = time.process_time()
        fn()
        ts.append(time.process_time() - t)
    return statistics.median(ts)


def wall_time(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def copy_bandwidth() -> float:
    """Bytes per second of a 256 MiB copy (the floor of a gate: read and write the state)."""
    a = torch.ones(1 << 25, dtype=torch.float64)
    b = torch.empty_like(a)
    t = wall_time(lambda: b.copy_(a), 5)
    return 2 * a.numel() * 8 / t


def sel_ops(n: int, layers: int, seed: int = 0) -> list:
    """StronglyEntanglingLayers: Rot on every wire, then a CNOT ring with range r = l % (n-1) + 1."""
    rng = np.random.default_rng(seed)
    ops = []
    for layer in range(layers):
        for w in range(n):
            ops.append(("rot", (n - 1 - w,), tuple(rng.uniform(0, 2 * math.pi, 3))))
        r = layer % (n - 1) + 1
        for w in range(n):
            ops.append(("cx", (n - 1 - w, n - 1 - (w + r) % n), ()))
    return ops


# ------------------------------------------------------------------------------------------
# qdiff


def qdiff_circuit(n: int, ops):
    """A qdiff Circuit of ``ops`` with every angle a theta column; returns (circuit, theta)."""
    from qdiff.circuits import Circuit, Operation, ParamRef, get_gate
    out, vals = [], []
    for name, bits, angles in ops:
        wires = tuple(n - 1 - b for b in bits)
        refs = tuple(ParamRef(len(vals) + i) for i in range(len(angles)))
        vals.extend(angles)
        out.append(Operation(get_gate(name), wires, refs))
    theta = torch.tensor([vals], dtype=torch.float64).reshape(1, len(vals))
    return Circuit(n, tuple(out), num_params=len(vals)), theta


def make_qdiff(n: int, ops, cdtype=torch.complex128, separate: bool = False, calls: int = 1,
               from_zero: bool = False):
    """The native kernels on the coded program (no measurement). ``separate``: every gate of
    ``ops`` is its own one-gate program, run by its own call (one memory pass per gate: no
    tile runs or in-cache chunks shared across gates); otherwise ``ops`` is one program, run
    ``calls`` times (an empty ``ops`` with ``calls`` = K times the calls' own overhead).
    ``from_zero``: the program starts from |0...0> as the engine runs a circuit without an
    initial state: the kernels write the start state themselves (a leading product of
    one-qubit gates in one pass) and never read the buffer, so it is not reset between calls;
    otherwise the state is reset to |0...0> and every gate is applied to it as it is."""
    from qdiff.backends.statevector import native
    from qdiff.backends.statevector.simulate import zero_state
    parts = [[op] for op in ops] if separate else [ops] * calls
    plans = []
    for part in parts:
        c, theta = qdiff_circuit(n, part)
        plan = native.coded_plan(c.operations, n)
        if plan is None:
            raise RuntimeError("the native kernels are not built")
        plans.append((plan, theta))
    state = zero_state(n, 1, cdtype, "cpu")

    def run():
        if not from_zero:
            state.zero_()
            state[0, 0] = 1
        for plan, theta in plans:
            native.run_plan(state, plan, theta, from_zero=from_zero)
    return run


# ------------------------------------------------------------------------------------------
# peers


def make_qulacs(n: int, ops, cdtype=torch.complex128):
    import qulacs
    if cdtype != torch.complex128:
        raise RuntimeError("qulacs (CPU) is double precision only")
    circ = qulacs.QuantumCircuit(n)
    for name, bits, a in ops:
        if name == "rx":
            circ.add_RX_gate(bits[0], a[0])
        elif name == "rot":  # RZ(omega) RY(theta) RZ(phi) as one U3 up to a phase
            circ.add_U3_gate(bits[0], a[1], a[0], a[2])
        elif name == "cx":
            circ.add_CNOT_gate(bits[0], bits[1])
        elif name == "rz":
            circ.add_RZ_gate(bits[0], a[0])
        elif name == "h":
            circ.add_H_gate(bits[0])
        elif name == "cz":
            circ.add_CZ_gate(bits[0], bits[1])
        elif name == "swap":
            circ.add_SWAP_gate(bits[0], bits[1])
        elif name in ("isingxx", "isingzz"):  # its Pauli-rotation gate
            pauli = 1 if name == "isingxx" else 3
            circ.add_multi_Pauli_rotation_gate(list(bits), [pauli, pauli], a[0])
        elif name == "single_excitation":  # its dense two-qubit gate
            c, s_ = math.cos(a[0] / 2), math.sin(a[0] / 2)
            m = np.array([[1, 0, 0, 0], [0, c, -s_, 0], [0, s_, c, 0], [0, 0, 0, 1]])
            circ.add_dense_matrix_gate(list(bits), m)
        else:
            raise ValueError(f"qulacs: no mapping for {name!r}")
    state = qulacs.QuantumState(n)

    def run():
        state.set_zero_state()
        circ.update_quantum_state(state)
    return run


def make_qsim(n: int, ops, cdtype=torch.complex64, fuse: bool = True):
    import cirq
    import qsimcirq
    if cdtype != torch.complex64:
        raise RuntimeError("qsim is single precision only")
    q = cirq.LineQubit.range(n)
    wire = lambda b: q[n - 1 - b]  # noqa: E731
    moments = []
    for name, bits, a in ops:
        w = [wire(b) for b in bits]
        if name == "rx":
            moments.append(cirq.rx(a[0]).on(w[0]))
        elif name == "rot":
            moments += [cirq.rz(a[0]).on(w[0]), cirq.ry(a[1]).on(w[0]), cirq.rz(a[2]).on(w[0])]
        elif name == "cx":
            moments.append(cirq.CNOT(*w))
        elif name == "rz":
            moments.append(cirq.rz(a[0]).on(w[0]))
        elif name == "h":
            moments.append(cirq.H(w[0]))
        elif name == "cz":
            moments.append(cirq.CZ(*w))
        elif name == "swap":
            moments.append(cirq.SWAP(*w))
        elif name == "isingxx":
            moments.append(cirq.XXPowGate(exponent=a[0] / math.pi).on(*w))
        elif name == "isingzz":
            moments.append(cirq.ZZPowGate(exponent=a[0] / math.pi).on(*w))
        elif name == "single_excitation":
            moments.append(cirq.givens(a[0] / 2).on(*w))
        else:
            raise ValueError(f"qsim: no mapping for {name!r}")
    circuit = cirq.Circuit(moments)
    opts = dict(cpu_threads=torch.get_num_threads())
    if not fuse:  # gates stay one matrix each (one-qubit gates on one qubit may still merge)
        opts["max_fused_gate_size"] = 1
    sim = qsimcirq.QSimSimulator(qsimcirq.QSimOptions(**opts))
    return lambda: sim.simulate(circuit, qubit_order=q)


# PennyLane's names (lightning.qubit's kernels carry the same)
PL_NAMES = {"rx": "RX", "rot": "Rot", "cx": "CNOT", "id": "Identity", "rz": "RZ", "h": "Hadamard",
            "cz": "CZ", "swap": "SWAP", "isingxx": "IsingXX", "isingzz": "IsingZZ",
            "single_excitation": "SingleExcitation"}


def make_lightning(n: int, ops, cdtype=torch.complex128):
    import pennylane as qml
    c_dtype = np.complex128 if cdtype == torch.complex128 else np.complex64
    dev = qml.device("lightning.qubit", wires=n, c_dtype=c_dtype)

    @qml.qnode(dev)
    def circuit():
        for name, bits, a in ops:
            getattr(qml, PL_NAMES[name])(*a, wires=[n - 1 - b for b in bits])
        return qml.state()
    return circuit


def make_lightning_kernels(n: int, ops, cdtype=torch.complex128):
    """lightning.qubit's state-vector kernels called directly (``StateVectorC128/C64``, one
    binding call per gate: no qnode, no tape): the per-gate cost without PennyLane's per-op
    Python work. ``("id", bits, ())`` calls its Identity kernel (a call that touches no
    amplitude: the per-call overhead, for baselines)."""
    from pennylane_lightning import lightning_qubit_ops as ops_mod
    sv = (ops_mod.StateVectorC128 if cdtype == torch.complex128 else ops_mod.StateVectorC64)(n)
    calls = []
    for name, bits, a in ops:
        wires = [n - 1 - b for b in bits]
        kernel = getattr(sv, PL_NAMES[name])
        calls.append((kernel, wires, list(a)))

    def run():
        sv.resetStateVector()
        for kernel, wires, a in calls:
            kernel(wires, False, a)
    return run


def make_aer(n: int, ops, cdtype=torch.complex128, fuse: bool = True):
    from qiskit import QuantumCircuit
    from qiskit_aer import AerSimulator
    qc = QuantumCircuit(n)
    for name, bits, a in ops:
        if name == "rot":  # RZ(omega) RY(theta) RZ(phi) as one U gate up to a phase
            qc.u(a[1], a[0], a[2], bits[0])
        elif name == "single_excitation":  # its dense two-qubit gate
            c, s_ = math.cos(a[0] / 2), math.sin(a[0] / 2)
            qc.unitary(np.array([[1, 0, 0, 0], [0, c, -s_, 0], [0, s_, c, 0], [0, 0, 0, 1]]),
                       list(bits))
        else:
            getattr(qc, {"isingxx": "rxx", "isingzz": "rzz"}.get(name, name))(*a, *bits)
    qc.save_statevector()
    sim = AerSimulator(method="statevector", max_parallel_threads=torch.get_num_threads(),
                       precision="double" if cdtype == torch.complex128 else "single",
                       fusion_enable=fuse)
    return lambda: sim.run(qc, shots=1).result()


MAKERS = {"qdiff": make_qdiff, "qulacs": make_qulacs, "qsim": make_qsim,
          "lightning": make_lightning, "aer": make_aer}
# lightning's kernels without its qnode (bench_native_gates.py's per-gate mode)
KERNEL_MAKERS = {"lightning": make_lightning_kernels}


def why_unavailable(name: str, cdtype) -> str | None:
    """Why ``name`` does not run ``cdtype`` here (not installed, or that precision not
    supported); None when it does."""
    try:
        MAKERS[name](2, [("rx", (0,), (0.1,))], cdtype)()
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means "not available here"
        text = (str(exc).strip().splitlines() or [""])[0]
        return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def available(name: str, cdtype) -> bool:
    """Whether ``name`` runs ``cdtype`` here (installed, and that precision supported)."""
    return why_unavailable(name, cdtype) is None


def pick_peers(wanted, dtypes: dict) -> dict:
    """{dtype label: ["qdiff"] + the peers of ``wanted`` that run that dtype here}; prints one
    line per peer left out, with the reason."""
    sims = {dt: ["qdiff"] for dt in dtypes}
    for p in PEERS:
        if p not in wanted:
            continue
        for dt, cdtype in dtypes.items():
            reason = why_unavailable(p, cdtype)
            if reason is None:
                sims[dt].append(p)
            else:
                print(f"peer {p} unavailable for {dt} ({reason}): left out", flush=True)
    return sims


def threads_env() -> str:
    return os.environ.get("OMP_NUM_THREADS", "unset")
