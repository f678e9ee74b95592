"""qdiff on a CUDA GPU vs PennyLane default.qubit on the same GPU (torch interface).

Problems (float64/complex128 and float32/complex64):
- SEL(L=6) forward with <Z_i> on every wire, batch 1, no gradient;
- gradient of sum_i <Z_i> w.r.t. the SEL weights: qdiff adjoint and backprop vs default.qubit
  backprop (torch tensors on the GPU: its simulation runs in torch there);
- the hybrid training step of bench_training.py (Linear(16, n) -> AngleEmbedding + SEL(3) ->
  Linear(n, 2), cross-entropy, Adam) at batch 256: qdiff (plain and static=True) vs
  PennyLane's TorchLayer on default.qubit, whole model on the GPU; qdiff's static step on the
  CPU (native kernels) beside.
Same run, interleaved rounds, wall time after torch.cuda.synchronize(), medians; the ratios
are per round. qdiff's CPU figure (native kernels, the given thread count) is printed beside.

    python bench/bench_cuda.py [--sizes 16,20,24] [--rounds 3] [--reps 3] [--threads 16]
"""
from __future__ import annotations

import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import ArgumentParser  # noqa: E402

warnings.filterwarnings("ignore")


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, reps):
    fn()
    _sync()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def qdiff_sel(n, device, cdtype, grad, method="adjoint"):
    import qdiff as qd
    rdtype = torch.float64 if cdtype == torch.complex128 else torch.float32
    dev = qd.device("statevector", wires=n, dtype=cdtype)

    @qd.qnode(dev, diff_method=method)
    def f(w):
        qd.StronglyEntanglingLayers(w, wires=range(n))
        return qd.expval(qd.Hamiltonian([1.0] * n, [qd.Z(i) for i in range(n)]))

    return _call(f, torch.rand(6, n, 3, dtype=rdtype, device=device), grad)


def _call(f, w, grad):
    """``f(w)``'s gradient with respect to ``w``, or ``f(w)`` without autograd."""
    if grad:
        w.requires_grad_(True)
        return lambda: torch.autograd.grad(f(w), w)

    def fwd():
        with torch.no_grad():
            return f(w)
    return fwd


def pl_sel(n, device, cdtype, grad):
    import pennylane as qml
    rdtype = torch.float64 if cdtype == torch.complex128 else torch.float32
    dev = qml.device("default.qubit", wires=n)      # its state's precision follows w's

    @qml.qnode(dev, interface="torch", diff_method="backprop")
    def f(w):
        qml.StronglyEntanglingLayers(w, wires=range(n))
        return qml.expval(qml.sum(*[qml.PauliZ(i) for i in range(n)]))

    return _call(f, torch.rand(6, n, 3, dtype=rdtype, device=device), grad)


def training_step(n, batch, device, impl):
    torch.manual_seed(0)
    if impl == "pl":
        import pennylane as qml
        dev = qml.device("default.qubit", wires=n)

        @qml.qnode(dev, interface="torch", diff_method="backprop")
        def circuit(inputs, w):
            qml.AngleEmbedding(inputs, wires=range(n))
            qml.StronglyEntanglingLayers(w, wires=range(n))
            return [qml.expval(qml.PauliZ(i)) for i in range(n)]
        layer = qml.qnn.TorchLayer(circuit, {"w": (3, n, 3)})
    else:
        import qdiff as qd
        dev = qd.device("statevector", wires=n)

        @qd.qnode(dev, static=(impl == "static"))
        def circuit(inputs, w):
            qd.AngleEmbedding(inputs, wires=range(n))
            qd.StronglyEntanglingLayers(w, wires=range(n))
            return [qd.expval(qd.Z(i)) for i in range(n)]
        layer = qd.QuantumLayer(circuit, {"w": (3, n, 3)})
    model = torch.nn.Sequential(torch.nn.Linear(16, n), layer, torch.nn.Linear(n, 2)).double()
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(batch, 16, dtype=torch.float64, generator=gen).to(device)
    y = torch.randint(0, 2, (batch,), generator=gen).to(device)

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return step


def main(argv=None):
    ap = ArgumentParser()
    ap.add_argument("--sizes", default="16,20,24",
                    help="SEL sizes, comma-separated (empty: the training steps only)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--cpu-max", type=int, default=24, help="largest n timed on the CPU")
    ap.add_argument("--pl-max", type=int, default=24, help="largest n timed for default.qubit")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_cuda.py: no CUDA device")
    torch.set_num_threads(args.threads)
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"CPU threads {torch.get_num_threads()}")
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    rows = []
    for n in sizes:
        for cdtype in (torch.complex128, torch.complex64):
            for grad in (False, True):
                fns = {"qdiff cuda": qdiff_sel(n, "cuda", cdtype, grad)}
                if grad and n <= 20:
                    fns["qdiff cuda backprop"] = qdiff_sel(n, "cuda", cdtype, grad, "backprop")
                if n <= (args.pl_max if not grad else min(args.pl_max, 20)):
                    # (its backprop keeps a state per gate: 288 states of 256 MiB at n = 24)
                    fns["default.qubit cuda"] = pl_sel(n, "cuda", cdtype, grad)
                if n <= args.cpu_max:
                    fns["qdiff cpu"] = qdiff_sel(n, "cpu", cdtype, grad)
                times = {k: [] for k in fns}
                for _ in range(args.rounds):
                    for k, fn in fns.items():
                        times[k].append(timed(fn, args.reps))
                ratio = [q / p for q, p in zip(times["qdiff cuda"],
                                               times.get("default.qubit cuda", [float("nan")]))]
                rows.append((n, str(cdtype).split(".")[-1], "gradient" if grad else "forward",
                             {k: statistics.median(v) * 1e3 for k, v in times.items()},
                             statistics.median(ratio), min(ratio), max(ratio)))
                r = rows[-1]
                print(f"n={r[0]:2d} {r[1]:10s} {r[2]:8s} " + "  ".join(
                    f"{k} {v:9.2f} ms" for k, v in r[3].items())
                    + f"  qdiff/default.qubit {r[4]:.3f} [{r[5]:.3f}-{r[6]:.3f}]", flush=True)
    print("# training step (hybrid shape, batch 256, float64, whole model on the GPU), ms")
    for n in (4, 8):
        fns = {impl: training_step(n, 256, "cuda", impl) for impl in ("plain", "static", "pl")}
        fns["static cpu"] = training_step(n, 256, "cpu", "static")
        times = {k: [] for k in fns}
        failed = {}
        for _ in range(args.rounds):
            for k, fn in fns.items():
                if k in failed:
                    continue
                try:
                    times[k].append(timed(fn, 7))
                except Exception as exc:          # a peer that does not run on the GPU
                    failed[k] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        med = {k: statistics.median(v) * 1e3 for k, v in times.items() if v}
        line = f"n={n} " + "  ".join(f"{k} {v:.2f}" for k, v in med.items())
        if "pl" in med and "static" in med:
            ratios = [p / s for p, s in zip(times["pl"], times["static"])]
            line += (f"  default.qubit/static {statistics.median(ratios):.1f}x "
                     f"[{min(ratios):.1f}-{max(ratios):.1f}]")
        print(line + "".join(f"  ({k} failed: {m})" for k, m in failed.items()), flush=True)


if __name__ == "__main__":
    main()
