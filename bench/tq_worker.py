"""TorchQuantum side of ``bench/bench_training.py --torchquantum PYTHON``.

Runs under another Python environment (TorchQuantum needs its own torch and Qiskit), driven
over stdin/stdout one JSON line per request, so that its training step is timed in the same
run as qdiff's and PennyLane's, interleaved step by step:

* ``{"cmd": "setup", "shape", "n", "b", "threads"}``: the model of ``bench_training.py``'s
  shape (``first`` or ``hybrid``) with TorchQuantum's quantum layer (AngleEmbedding = RX per
  wire, StronglyEntanglingLayers(3) = Rot per wire and a CNOT ring of range ``l % (n-1) + 1``
  per layer, expval Z on every wire, on ``tq.QuantumDevice``: complex64, TorchQuantum's only
  state precision; float32 classical layers), the benchmark's data (the same seed), Adam;
* ``{"cmd": "step"}``: one training step; answers ``{"cpu": seconds}`` (process CPU time);
* ``{"cmd": "layer", "x": [[...]], "w": [...]}``: the quantum layer's outputs for inputs ``x``
  (B, n) and weights ``w`` (3, n, 3), to check it computes the same function as qdiff's.
"""
from __future__ import annotations

import math
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore")


def layer_class():
    import torch
    import torchquantum as tq
    import torchquantum.functional as tqf

    class SELayer(tq.QuantumModule):
        def __init__(self, n):
            super().__init__()
            self.n = n
            self.weights = torch.nn.Parameter(torch.rand(3, n, 3) * 2 * math.pi)
            self.measure = tq.MeasureAll(tq.PauliZ)

        def forward(self, x):
            n = self.n
            qdev = tq.QuantumDevice(n_wires=n, bsz=x.shape[0], device=x.device)
            for i in range(n):
                tqf.rx(qdev, wires=i, params=x[:, i])
            for layer in range(3):
                for i in range(n):
                    tqf.rot(qdev, wires=i, params=self.weights[layer, i].unsqueeze(0))
                if n > 1:
                    r = layer % (n - 1) + 1
                    for i in range(n):
                        tqf.cnot(qdev, wires=[i, (i + r) % n])
            return self.measure(qdev)

    return SELayer


def build(shape, n, b):
    """The quantum layer and the step of the benchmark's model (its data, in float32)."""
    import torch
    from bench_training import data, step_fn
    layer = layer_class()(n)
    if shape == "first":
        model = torch.nn.Sequential(layer, torch.nn.Linear(n, 1))
    else:
        model = torch.nn.Sequential(torch.nn.Linear(16, n), layer, torch.nn.Linear(n, 2))
    x, y = data(shape, n, b)
    return layer, step_fn(shape, model, x.float(), y.float() if shape == "first" else y)


def main():
    from peer_worker import serve
    state = {}

    def setup(req):  # imports here: a missing package is answered as this request's error
        import torch
        torch.set_num_threads(int(req.get("threads", 1)))
        state["layer"], state["step"] = build(req["shape"], int(req["n"]), int(req["b"]))
        return {"ok": True, "torch": torch.__version__}

    def step(req):
        t0 = time.process_time()
        state["step"]()
        return {"cpu": time.process_time() - t0}

    def layer(req):
        import torch
        lay = state["layer"]
        with torch.no_grad():
            lay.weights.copy_(torch.tensor(req["w"], dtype=torch.float32))
            out = lay(torch.tensor(req["x"], dtype=torch.float32))
        return {"out": out.double().tolist()}

    serve({"setup": setup, "step": step, "layer": layer})


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
