"""qdiff as a PennyLane device: ``qml.device("qdiff.statevector")`` inside PennyLane's own
pipeline, against ``lightning.qubit`` (adjoint) and ``default.qubit`` (backprop).

1. Training step of a PennyLane ``qml.qnn.TorchLayer`` model: AngleEmbedding +
   StronglyEntanglingLayers(3) with expval Z on every wire, then ``nn.Linear(n, 2)``, MSE loss,
   Adam; forward + backward + optimizer step on a batch of B inputs (the inputs are broadcast
   by TorchLayer: one broadcast tape per step).
2. Gradient of sum_i <Z_i> after SEL(L=3) w.r.t. the SEL weights (one input), n = 12..20.
3. ``--shift``: parameter-shift gradients on every device (PennyLane's transform makes two
   tapes per trainable angle, all of one structure): SEL(L=6) on 6 qubits (108 angles) with
   expval Z0 Z1, and one RY layer + CNOT chain on 12 qubits (12 angles) with the expval of a
   random 500-term Pauli Hamiltonian (timed with a full garbage collection before each call
   and none during it, as ``timeit`` does).

Every configuration is timed interleaved with its peers in the same run (rounds of one call
each, after a warm-up); the script prints medians and the ratios qdiff / peer (< 1: qdiff
faster) and checks that the gradients agree. ``--empty`` also times an empty circuit (one RZ,
one expval) per device: PennyLane's own fixed cost per call.

    OMP_NUM_THREADS=1 python bench/bench_pennylane_plugin.py [--layer-sizes 4,8]
        [--batches 32,256] [--sel-sizes 12,14,16,18,20] [--rounds 5] [--device-vjp]
        [--empty] [--shift] [--one-shot 1000,10000]

4. ``--one-shot``: dynamic circuits with mid-circuit measurements and conditioned operations
   under ``mcm_method="one-shot"`` at the given shot counts, and ``exact`` under
   ``mcm_method="tree-traversal"`` without shots (:func:`one_shot_call`).
"""
from __future__ import annotations

import datetime
import gc
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import ArgumentParser, check_peers  # noqa: E402

warnings.filterwarnings("ignore")

PEERS = (("qdiff", "qdiff.statevector", "adjoint"), ("lightning", "lightning.qubit", "adjoint"),
         ("default", "default.qubit", "backprop"))


def layer_step(name, diff, n, batch, device_vjp, seed=0):
    import pennylane as qml
    import torch
    dev = qml.device(name, wires=n)
    kw = {"device_vjp": device_vjp} if diff == "adjoint" else {}

    @qml.qnode(dev, interface="torch", diff_method=diff, **kw)
    def circuit(inputs, weights):
        qml.AngleEmbedding(inputs, wires=range(n))
        qml.StronglyEntanglingLayers(weights, wires=range(n))
        return [qml.expval(qml.Z(i)) for i in range(n)]

    torch.manual_seed(seed)
    model = torch.nn.Sequential(qml.qnn.TorchLayer(circuit, {"weights": (3, n, 3)}),
                                torch.nn.Linear(n, 2))
    g = torch.Generator().manual_seed(1)
    x = torch.rand(batch, n, generator=g) * 3.0
    y = torch.rand(batch, 2, generator=g)
    opt = torch.optim.Adam(model.parameters(), lr=0.0)  # lr 0: every step sees the same weights

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return model[0].weights.grad.detach().double().clone()
    return step


def sel_grad(name, diff, n, device_vjp, seed=0):
    import pennylane as qml
    import torch
    dev = qml.device(name, wires=n)
    kw = {"device_vjp": device_vjp} if diff == "adjoint" else {}

    @qml.qnode(dev, interface="torch", diff_method=diff, **kw)
    def circuit(weights):
        qml.StronglyEntanglingLayers(weights, wires=range(n))
        return [qml.expval(qml.Z(i)) for i in range(n)]

    g = torch.Generator().manual_seed(seed)
    w = (torch.rand(3, n, 3, generator=g, dtype=torch.float64) * 6.2832).requires_grad_()

    def step():
        out = circuit(w)
        (gw,) = torch.autograd.grad(sum(out), (w,))
        return gw.detach().clone()
    return step


def shift_grad(name, workload, seed=0):
    """qml.grad of a parameter-shift qnode (autograd interface) as a torch tensor."""
    import numpy as np
    import pennylane as qml
    import torch
    rng = np.random.default_rng(seed)
    if workload == "sel":
        n = 6
        dev = qml.device(name, wires=n)

        @qml.qnode(dev, diff_method="parameter-shift")
        def circuit(w):
            qml.StronglyEntanglingLayers(w, wires=range(n))
            return qml.expval(qml.Z(0) @ qml.Z(1))
        w = qml.numpy.array(rng.uniform(0, 6.28, (6, n, 3)), requires_grad=True)
    else:
        n, words = 12, set()
        while len(words) < 500:
            word = "".join(rng.choice(list("IXYZ"), n))
            if set(word) != {"I"}:
                words.add(word)
        words = sorted(words)
        H = qml.Hamiltonian([float(c) for c in rng.normal(size=len(words))],
                            [qml.pauli.string_to_pauli_word(wd) for wd in words])
        dev = qml.device(name, wires=n)

        @qml.qnode(dev, diff_method="parameter-shift")
        def circuit(w):
            for i in range(n):
                qml.RY(w[i], wires=i)
            for i in range(n - 1):
                qml.CNOT(wires=[i, i + 1])
            return qml.expval(H)
        w = qml.numpy.array(rng.uniform(0, 6.28, n), requires_grad=True)
    return lambda: torch.as_tensor(np.asarray(qml.grad(circuit)(w)))


def empty_call(name):
    import pennylane as qml
    dev = qml.device(name, wires=1)

    @qml.qnode(dev)
    def circuit(x):
        qml.RZ(x, 0)
        return qml.expval(qml.Z(0))
    return lambda: (circuit(0.1), None)[1]


def one_shot_call(name, workload, shots, seed=0):
    """A dynamic circuit under ``mcm_method="one-shot"``: ``"cond"``, 3 wires, 3 mid-circuit
    measurements (one with reset) and 2 conditioned operations, expval/probs/sample of an
    outcome; ``"rounds"``, 4 wires, 8 rounds of entangling, measuring an ancilla with reset
    and a conditioned correction, expval and the outcomes' sum. ``shots=None``: exact, by
    ``mcm_method="tree-traversal"`` (the sample of an outcome becomes its expval)."""
    import pennylane as qml
    n = 3 if workload == "cond" else 4
    dev = qml.device(name, wires=n, seed=seed)
    exact = shots is None

    def cond(x, y):
        qml.RX(x, 0)
        qml.Hadamard(2)
        m0 = qml.measure(0)
        qml.cond(m0, qml.RY)(y, wires=1)
        qml.CNOT([2, 0])
        m1 = qml.measure(0, reset=True)
        m2 = qml.measure(1)
        qml.cond(m1 & m2, qml.CRX)(y, wires=[2, 0])
        return (qml.expval(qml.Z(1)), qml.probs(wires=[0, 2]),
                qml.expval(m0) if exact else qml.sample(m0))

    def rounds(x, y):
        for w in range(3):
            qml.RY(x * (w + 1), w)
        ms = []
        for k in range(8):
            qml.CNOT([k % 3, 3])
            qml.RY(y, 3)
            ms.append(qml.measure(3, reset=True))
            qml.cond(ms[-1], qml.RZ)(x, wires=k % 3)
        # (exact: with one wire measurement, default.qubit's tree-traversal fails in
        # PennyLane 0.45.1 inserting the outcome statistics, so the probs of wire 0 too)
        return (qml.expval(qml.Z(0) @ qml.Z(1)), qml.expval(sum(ms))) + \
            ((qml.probs(wires=[0]),) if exact else ())

    circuit = qml.QNode(cond if workload == "cond" else rounds, dev,
                        mcm_method="tree-traversal" if exact else "one-shot")
    if not exact:
        circuit = qml.set_shots(circuit, shots)
    return lambda: (circuit(0.8, 0.4), None)[1]


def interleave(steps: dict, rounds: int, gc_off: bool = False) -> dict:
    """Median seconds per call of each step, timed round-robin after one warm-up each; also
    checks that the returned gradients agree. ``gc_off``: a full collection before each timed
    call and none during it (as ``timeit`` does): a full collection of the PennyLane + torch
    heap costs about 0.25 s and otherwise lands in whichever call crosses its threshold."""
    results = {k: s() for k, s in steps.items()}
    ref = next(iter(results.values()))
    for k, r in results.items():
        if r is not None and ref is not None:
            err = float((r - ref).abs().max())
            assert err < 1e-4, f"{k}: gradient differs from {next(iter(results))} by {err}"
    times = {k: [] for k in steps}
    for _ in range(rounds):
        for k, s in steps.items():
            if gc_off:
                gc.collect()
                gc.disable()
            try:
                t0 = time.perf_counter()
                s()
                times[k].append(time.perf_counter() - t0)
            finally:
                if gc_off:
                    gc.enable()
    return {k: statistics.median(v) for k, v in times.items()}


def fmt(t):
    return f"{t * 1e3:.3g}"


def main():
    ap = ArgumentParser()
    ap.add_argument("--layer-sizes", default="4,8")
    ap.add_argument("--batches", default="32,256")
    ap.add_argument("--sel-sizes", default="12,14,16,18,20")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--default-max", type=int, default=16,
                    help="largest n for default.qubit backprop in the SEL table")
    ap.add_argument("--device-vjp", action="store_true",
                    help="adjoint with device_vjp=True (PennyLane's default is False)")
    ap.add_argument("--empty", action="store_true")
    ap.add_argument("--shift", action="store_true",
                    help="also time the parameter-shift gradients (every device)")
    ap.add_argument("--one-shot", default="",
                    help="shot counts for mid-circuit measurements with mcm_method='one-shot' "
                         "(e.g. 1000,10000; 'exact': mcm_method='tree-traversal' without "
                         "shots); default.qubit simulates each shot on its own")
    args = ap.parse_args()
    gone = check_peers({"lightning": "pennylane_lightning"})
    active = tuple(p for p in PEERS if p[0] not in gone)

    def interleaved(steps, rounds, gc_off=False):  # a peer left out reads nan
        return {**interleave(steps, rounds, gc_off), **{k: float("nan") for k in gone}}
    import pennylane as qml
    import torch
    torch.set_num_threads(1)
    print(f"{datetime.date.today()}  pennylane {qml.__version__}, torch {torch.__version__}, "
          f"1 torch thread, device_vjp={args.device_vjp}, {args.rounds} interleaved rounds, "
          "median ms per call")
    if args.empty:
        t = interleaved({k: empty_call(name) for k, name, _ in active}, max(args.rounds, 20))
        print("empty circuit (one RZ, one expval), ms: " +
              ", ".join(f"{k} {fmt(v)}" for k, v in t.items()))
    if args.shift:
        print("\nParameter-shift gradients (every device diff_method='parameter-shift'; a full "
              "garbage collection before each timed call, none during it), ms")
        print("| circuit | qdiff | lightning | default | qdiff/lightning | qdiff/default |")
        print("|---|---|---|---|---|---|")
        for wl, label in (("sel", "SEL(L=6), 6 qubits, 108 angles, expval Z0 Z1"),
                          ("ham", "RY + CNOT chain, 12 qubits, 12 angles, 500-term H")):
            t = interleaved({k: shift_grad(name, wl) for k, name, _ in active}, args.rounds,
                           gc_off=True)
            print(f"| {label} | {fmt(t['qdiff'])} | {fmt(t['lightning'])} | "
                  f"{fmt(t['default'])} | {t['qdiff'] / t['lightning']:.2f} | "
                  f"{t['qdiff'] / t['default']:.2f} |", flush=True)
    if args.one_shot:
        print("\nMid-circuit measurements, mcm_method='one-shot' (seconds per call)")
        print("| circuit | shots | qdiff | lightning | default | qdiff/lightning | "
              "qdiff/default |")
        print("|---|---|---|---|---|---|---|")
        for wl, label in (("cond", "3 wires, 3 measurements, 2 conditioned ops"),
                          ("rounds", "4 wires, 8 measurements with reset, 8 conditioned ops")):
            for shots in (None if s == "exact" else int(s)
                          for s in args.one_shot.split(",") if s):
                t = interleaved({k: one_shot_call(name, wl, shots) for k, name, _ in active},
                               args.rounds)
                print(f"| {label} | {shots or 'exact (tree-traversal)'} | {t['qdiff']:.3g} | "
                      f"{t['lightning']:.3g} | {t['default']:.3g} | "
                      f"{t['qdiff'] / t['lightning']:.3f} | "
                      f"{t['qdiff'] / t['default']:.3f} |", flush=True)
    sizes = [int(s) for s in args.layer_sizes.split(",") if s]
    batches = [int(b) for b in args.batches.split(",") if b]
    if sizes:
        print("\nTorchLayer training step (forward + backward + Adam), ms")
        print("| n | B | qdiff adjoint | lightning adjoint | default backprop | "
              "qdiff/lightning | qdiff/default |")
        print("|---|---|---|---|---|---|---|")
        for n in sizes:
            for b in batches:
                steps = {k: layer_step(name, diff, n, b, args.device_vjp)
                         for k, name, diff in active}
                t = interleaved(steps, args.rounds)
                print(f"| {n} | {b} | {fmt(t['qdiff'])} | {fmt(t['lightning'])} | "
                      f"{fmt(t['default'])} | {t['qdiff'] / t['lightning']:.2f} | "
                      f"{t['qdiff'] / t['default']:.2f} |", flush=True)
    sel = [int(s) for s in args.sel_sizes.split(",") if s]
    if sel:
        print("\nSEL(L=3) gradient of sum_i <Z_i> (forward + backward), ms")
        print("| n | qdiff adjoint | lightning adjoint | default backprop | qdiff/lightning | "
              "qdiff/default |")
        print("|---|---|---|---|---|---|")
        for n in sel:
            steps = {k: sel_grad(name, diff, n, args.device_vjp) for k, name, diff in active
                     if k != "default" or n <= args.default_max}
            t = interleaved(steps, args.rounds)
            d = t.get("default")
            print(f"| {n} | {fmt(t['qdiff'])} | {fmt(t['lightning'])} | "
                  f"{fmt(d) if d else '-'} | {t['qdiff'] / t['lightning']:.2f} | "
                  f"{t['qdiff'] / d if d else float('nan'):.2f} |", flush=True)


if __name__ == "__main__":
    main()
