"""Hybrid training step (forward + backward + Adam) with a quantum layer: qdiff vs PennyLane.

Two model shapes, float64, AngleEmbedding + StronglyEntanglingLayers(3) with expval Z on every
wire as the quantum layer:

* ``first``:  QuantumLayer -> Linear(n, 1), MSE (the layer sees the data: its embedding angles
  need no gradient);
* ``hybrid``: Linear(16, n) -> QuantumLayer -> Linear(n, 2), cross-entropy (the usual shape:
  the embedding angles require gradients, per sample).

qdiff runs as a plain qnode (``diff_method="best"``) and as a record-once qnode
(``static=True``); the peer is the same model with PennyLane's ``qml.qnn.TorchLayer`` on
``default.qubit`` (backprop) and, with ``--lightning``, on ``lightning.qubit`` (adjoint,
device_vjp). Each run times ``--steps`` steps of every configuration interleaved (one step of
each in turn, CPU time of this process), and reports per configuration the median step; the
ratios are PennyLane default.qubit's median over qdiff static's. ``--runs`` runs; the summary
gives the median and the range of the run medians.

Every configuration is also run as ``stand-in``: the same model with the quantum layer
replaced by a torch layer of the same weights and shapes that costs two torch ops
(``cos(x + w.sum())``). Its step is the classical part of the model (Linear layers, loss,
autograd, Adam) with a near-free middle layer, so ``dq/stand-in`` bounds the ratio any quantum
layer can reach against PennyLane on that model under this interleaving.

``--torchquantum PYTHON`` adds TorchQuantum's step (the same models on ``tq.QuantumDevice``,
backprop, complex64 and float32: its only state precision) from ``bench/tq_worker.py`` run
by that interpreter (TorchQuantum needs its own torch and Qiskit): interleaved with the
others step by step, its CPU time measured inside the worker. Before timing, its quantum
layer is checked against qdiff's on the same inputs and weights (to 1e-4).
``--catalyst PYTHON`` adds PennyLane Catalyst's step the same way (``bench/catalyst_worker.py``:
the models in JAX, float64, ``qml.qjit`` with ``lightning.qubit``'s adjoint, the batch loop
unrolled); its compile time (the first step) is printed separately.

    python bench/bench_training.py [--shapes first,hybrid] [--sizes 4,8] [--batches 32,256]
        [--steps 7] [--runs 3] [--threads 1] [--lightning] [--torchquantum PYTHON]
        [--catalyst PYTHON]
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import ArgumentParser, check_peers  # noqa: E402

warnings.filterwarnings("ignore")


def quantum_dims(shape, n):
    return (n, 1) if shape == "first" else (16, 2)


def qdiff_model(shape, n, static):
    import torch
    import qdiff as qd
    dev = qd.device("statevector", wires=n)

    @qd.qnode(dev, static=static)
    def circuit(inputs, weights):
        qd.AngleEmbedding(inputs, wires=range(n))
        qd.StronglyEntanglingLayers(weights, wires=range(n))
        return [qd.expval(qd.Z(i)) for i in range(n)]
    layer = qd.QuantumLayer(circuit, {"weights": (3, n, 3)}, dtype=torch.float64)
    return _wrap(shape, n, layer)


def pennylane_model(shape, n, device_name, diff_method, **kw):
    import pennylane as qml
    dev = qml.device(device_name, wires=n)

    @qml.qnode(dev, interface="torch", diff_method=diff_method, **kw)
    def circuit(inputs, weights):
        qml.AngleEmbedding(inputs, wires=range(n))
        qml.StronglyEntanglingLayers(weights, wires=range(n))
        return [qml.expval(qml.PauliZ(i)) for i in range(n)]
    layer = qml.qnn.TorchLayer(circuit, {"weights": (3, n, 3)})
    return _wrap(shape, n, layer).double()


def standin_model(shape, n):
    """The model with its quantum layer replaced by two torch ops on the same weights."""
    import torch

    class StandIn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weights = torch.nn.Parameter(torch.rand(3, n, 3, dtype=torch.float64))

        def forward(self, x):
            return torch.cos(x + self.weights.sum())
    return _wrap(shape, n, StandIn())


def _wrap(shape, n, layer):
    import torch
    f64 = torch.float64
    if shape == "first":
        return torch.nn.Sequential(layer, torch.nn.Linear(n, 1, dtype=f64))
    return torch.nn.Sequential(torch.nn.Linear(16, n, dtype=f64), layer,
                               torch.nn.Linear(n, 2, dtype=f64))


def data(shape, n, b):
    import torch
    torch.manual_seed(0)
    x = torch.rand(b, quantum_dims(shape, n)[0], dtype=torch.float64)
    if shape == "first":
        return x, torch.rand(b, 1, dtype=torch.float64)
    return x, torch.randint(0, 2, (b,))


def step_fn(shape, model, x, y):
    import torch
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = torch.nn.functional.mse_loss if shape == "first" else \
        torch.nn.functional.cross_entropy

    def step():
        opt.zero_grad()
        out = model(x)
        loss = loss_fn(out.reshape(-1, 1) if shape == "first" else out, y)
        loss.backward()
        opt.step()
    return step


class Worker:
    """A peer's step run by another interpreter (``bench/tq_worker.py``,
    ``bench/catalyst_worker.py``), one JSON line per request."""

    def __init__(self, python: str, script: str, threads: int):
        env = dict(os.environ)
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(threads)
        worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), script)
        self.proc = subprocess.Popen([python, worker], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.threads, self.script, self.setups = threads, script, []

    def ask(self, **req):
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):  # it exited (or its pipe was closed)
            raise RuntimeError(f"the {self.script} worker exited") from None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.script} worker exited")
        ans = json.loads(line)
        if "error" in ans:
            raise RuntimeError(ans["error"])
        return ans

    def model(self, shape, n, b, qdiff_layer):
        """Set up the worker's model; check its quantum layer against ``qdiff_layer``; return
        its step (which returns the worker's CPU time), or ``None`` when the peer fails to set
        it up (said on stdout; the benchmark goes on without it)."""
        import torch
        try:
            self.setups.append((shape, n, b, self.ask(cmd="setup", shape=shape, n=n, b=b,
                                                      threads=self.threads)))
        except RuntimeError as exc:
            print(f"# {self.script}: {shape} n={n} B={b} not run: {exc}", flush=True)
            return None
        gen = torch.Generator().manual_seed(7)
        x = torch.rand(4, n, dtype=torch.float64, generator=gen) * 3
        w = torch.rand(3, n, 3, dtype=torch.float64, generator=gen) * 6
        got = torch.tensor(self.ask(cmd="layer", x=x.tolist(), w=w.tolist())["out"],
                           dtype=torch.float64)
        with torch.no_grad():
            want = qdiff_layer.qnode(inputs=x, weights=w)
        want = want if isinstance(want, torch.Tensor) else torch.stack(list(want), dim=-1)
        err = float((got - want).abs().max())
        if err > 1e-4:
            raise RuntimeError(f"{self.script}: the quantum layer differs from qdiff's by "
                               f"{err:.2e}")
        return lambda: self.ask(cmd="step")["cpu"]

    def close(self):
        try:
            self.ask(cmd="quit")
        except (RuntimeError, BrokenPipeError, ValueError):
            pass
        self.proc.wait(timeout=30)


def one_run(steps: dict, reps: int) -> dict:
    """CPU-time median per configuration of ``reps`` interleaved steps (a step that returns a
    number reports its own CPU time: another process's)."""
    times = {k: [] for k in steps}
    for _ in range(reps):
        for k, s in steps.items():
            t0 = time.process_time()
            own = s()
            times[k].append(own if isinstance(own, float) else time.process_time() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def main(argv=None):
    ap = ArgumentParser()
    ap.add_argument("--shapes", default="first,hybrid")
    ap.add_argument("--sizes", default="4,8")
    ap.add_argument("--batches", default="32,256")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lightning", action="store_true",
                    help="also time PennyLane lightning.qubit (adjoint, device_vjp)")
    ap.add_argument("--torchquantum", metavar="PYTHON",
                    help="also time TorchQuantum, run by this interpreter (bench/tq_worker.py)")
    ap.add_argument("--catalyst", metavar="PYTHON",
                    help="also time PennyLane Catalyst (qml.qjit, lightning.qubit adjoint), run "
                         "by this interpreter (bench/catalyst_worker.py)")
    args = ap.parse_args(argv)
    # every BLAS and OpenMP pool in the process: idle pool threads that spin after a call
    # (NumPy's OpenBLAS under PennyLane) would otherwise add CPU time to the next step timed
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(args.threads))
    if args.lightning and check_peers({"lightning.qubit": "pennylane_lightning"}):
        args.lightning = False
    import torch
    torch.set_num_threads(args.threads)
    print(f"# load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; "
          f"{args.runs} runs x {args.steps} interleaved steps, CPU time, "
          f"{args.threads} thread(s)")
    peers = {}
    for key, opt, script in (("tq", "torchquantum", "tq_worker.py"),
                             ("cat", "catalyst", "catalyst_worker.py")):
        python = getattr(args, opt)
        if python:
            try:
                peers[key] = Worker(python, script, args.threads)
            except OSError as exc:
                print(f"# {script}: cannot start {python} ({exc.strerror or exc}): not run",
                      flush=True)
                setattr(args, opt, None)
    head = f"{'shape':>7} {'n':>3} {'B':>5} {'qdiff ms':>10} {'static ms':>10} " \
           f"{'PL dq ms':>10} {'stand-in':>9}" + \
           (f" {'PL lt ms':>10}" if args.lightning else "") + \
           (f" {'TQ ms':>10}" if args.torchquantum else "") + \
           (f" {'Cat ms':>10}" if args.catalyst else "") + \
           f" {'dq/static':>18} {'dq/qdiff':>10} {'dq/stand-in':>12}" + \
           (f" {'TQ/static':>10}" if args.torchquantum else "") + \
           (f" {'Cat/static':>10}" if args.catalyst else "")
    print(head)
    rows = []
    for shape in args.shapes.split(","):
        for n in [int(s) for s in args.sizes.split(",")]:
            for b in [int(s) for s in args.batches.split(",")]:
                x, y = data(shape, n, b)
                static_model = qdiff_model(shape, n, True)
                steps = {"qdiff": step_fn(shape, qdiff_model(shape, n, False), x, y),
                         "static": step_fn(shape, static_model, x, y),
                         "dq": step_fn(shape, pennylane_model(shape, n, "default.qubit",
                                                              "backprop"), x, y),
                         "standin": step_fn(shape, standin_model(shape, n), x, y)}
                if args.lightning:
                    steps["lt"] = step_fn(shape, pennylane_model(
                        shape, n, "lightning.qubit", "adjoint", device_vjp=True), x, y)
                for key, worker in peers.items():
                    step = worker.model(shape, n, b, static_model[0 if shape == "first" else 1])
                    if step is not None:
                        steps[key] = step
                for s in steps.values():  # warm-up: traces, caches, kernels
                    s()
                    s()
                runs = [one_run(steps, args.steps) for _ in range(args.runs)]
                med = {k: statistics.median(r[k] for r in runs) for k in steps}
                ratios = [r["dq"] / r["static"] for r in runs]
                rows.append((shape, n, b, med, ratios))
                lt = f" {med['lt']:>10.2f}" if args.lightning else ""
                pm = "".join(f" {med[k]:>10.2f}" if k in med else f" {'n/a':>10}"
                             for k in peers)
                rng = f"{statistics.median(ratios):.1f}x ({min(ratios):.1f}-{max(ratios):.1f})"
                pr = "".join(f" {med[k] / med['static']:>9.1f}x" if k in med else f" {'n/a':>10}"
                             for k in peers)
                print(f"{shape:>7} {n:>3} {b:>5} {med['qdiff']:>10.2f} {med['static']:>10.2f} "
                      f"{med['dq']:>10.2f} {med['standin']:>9.2f}{lt}{pm} {rng:>18} "
                      f"{med['dq'] / med['qdiff']:>9.1f}x {med['dq'] / med['standin']:>11.1f}x"
                      f"{pr}", flush=True)
    if "tq" in peers and peers["tq"].setups:
        print(f"# TorchQuantum worker: torch {peers['tq'].setups[0][3]['torch']}")
    if "cat" in peers and peers["cat"].setups:
        print(f"# Catalyst {peers['cat'].setups[0][3]['version']}: compile + first step (s): " +
              ", ".join(f"{sh} n={n} B={b}: {a['compile']:.1f}"
                        for sh, n, b, a in peers["cat"].setups))
    for worker in peers.values():
        worker.close()
    print(f"# load average after: {os.getloadavg()[0]:.2f}")
    return rows


if __name__ == "__main__":
    main()
