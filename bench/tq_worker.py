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

import json
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
    import torch
    layer = layer_class()(n)
    if shape == "first":
        model = torch.nn.Sequential(layer, torch.nn.Linear(n, 1))
    else:
        model = torch.nn.Sequential(torch.nn.Linear(16, n), layer, torch.nn.Linear(n, 2))
    torch.manual_seed(0)  # the data of bench_training.data, in float32
    x = torch.rand(b, n if shape == "first" else 16, dtype=torch.float64).float()
    y = torch.rand(b, 1, dtype=torch.float64).float() if shape == "first" else \
        torch.randint(0, 2, (b,))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = torch.nn.functional.mse_loss if shape == "first" else \
        torch.nn.functional.cross_entropy

    def step():
        opt.zero_grad()
        out = model(x)
        loss = loss_fn(out.reshape(-1, 1) if shape == "first" else out, y)
        loss.backward()
        opt.step()
    return layer, step


def main():
    import torch
    state = {}
    for line in sys.stdin:
        req = json.loads(line)
        cmd = req["cmd"]
        if cmd == "setup":
            threads = int(req.get("threads", 1))
            torch.set_num_threads(threads)
            state["layer"], state["step"] = build(req["shape"], int(req["n"]), int(req["b"]))
            ans = {"ok": True, "torch": torch.__version__}
        elif cmd == "step":
            t0 = time.process_time()
            state["step"]()
            ans = {"cpu": time.process_time() - t0}
        elif cmd == "layer":
            layer = state["layer"]
            with torch.no_grad():
                layer.weights.copy_(torch.tensor(req["w"], dtype=torch.float32))
                out = layer(torch.tensor(req["x"], dtype=torch.float32))
            ans = {"out": out.double().tolist()}
        elif cmd == "quit":
            break
        else:
            ans = {"error": f"unknown command {cmd!r}"}
        sys.stdout.write(json.dumps(ans) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
