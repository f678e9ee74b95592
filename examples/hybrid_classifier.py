"""A hybrid torch classifier with a quantum layer, trained on two interleaved moons.

Model: Linear(2, n) -> QuantumLayer(L times: AngleEmbedding(Y) of the n features, then one
StronglyEntanglingLayers layer -- data re-uploading, angles 2 * Linear(x); expval Z on every wire) -> Linear(n, 1); binary cross-entropy, Adam, mini-batches. The data
(two moons with Gaussian noise) is made by the script with a seeded generator; the test set is
drawn independently. Prints the loss and accuracies per epoch and the final test accuracy, and
plots the decision boundary with the test points.

    python examples/hybrid_classifier.py [--epochs 30] [--qubits 4] [--layers 3]
        [--diff-method best|adjoint|backprop|parameter-shift] [--device cpu|cuda]
        [--plot boundary.png]
"""
from __future__ import annotations

if __name__ == "__main__":  # first: Ctrl-C during the imports below is one line, exit 130
    import _startup  # noqa: F401

import math
import os
import sys
import time

import torch

import qdiff as qd
from qdiff.circuits import memory
from qdiff.circuits.fileio import save_figure

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _cli import (Parser, check_plot, nonnegative_float,  # noqa: E402
                  positive_float, positive_int, run, seed_int, thread_count)


def two_moons(n: int, noise: float, gen: torch.Generator):
    """``(x (n, 2) float64, y (n,) float64 in {0, 1})``: two interleaved half circles."""
    memory.require(100.0 * n, f"the data set of {n} samples")  # about a dozen (n,) tensors
    t = torch.rand(n, generator=gen, dtype=torch.float64) * math.pi
    upper = torch.rand(n, generator=gen) < 0.5
    a = torch.stack([torch.cos(t), torch.sin(t)], 1)
    b = torch.stack([1 - torch.cos(t), 0.5 - torch.sin(t)], 1)
    x = torch.where(upper[:, None], a, b) + noise * torch.randn(n, 2, generator=gen,
                                                                dtype=torch.float64)
    return x, upper.to(torch.float64)


def make_model(n_qubits: int, layers: int, diff_method: str, device: str,
               scale: float = 2.0) -> torch.nn.Module:
    """``scale`` multiplies the embedded angles: nn.Linear's default init keeps them within
    about +-1 rad, where the circuit is nearly linear and training stalls on a straight boundary."""
    dev = qd.device("statevector", wires=n_qubits, device=device)

    @qd.qnode(dev, diff_method=diff_method)
    def circuit(inputs, weights):
        for layer in range(layers):  # data re-uploading: embed before every entangling layer
            qd.AngleEmbedding(scale * inputs, wires=range(n_qubits), rotation="Y")
            qd.StronglyEntanglingLayers(weights[layer:layer + 1], wires=range(n_qubits))
        return [qd.expval(qd.Z(i)) for i in range(n_qubits)]

    shapes = {"weights": qd.StronglyEntanglingLayers.shape(layers, n_qubits)}
    return torch.nn.Sequential(
        torch.nn.Linear(2, n_qubits, dtype=torch.float64),
        qd.QuantumLayer(circuit, shapes, dtype=torch.float64),
        torch.nn.Linear(n_qubits, 1, dtype=torch.float64)).to(device)


def accuracy(model, x, y) -> float:
    with torch.no_grad():
        return float(((model(x).squeeze(-1) > 0).to(y.dtype) == y).to(torch.float64).mean())


def train(args, log=print):
    """Returns ``(model, history, test accuracy, (x_test, y_test), seconds)``."""
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    x, y = two_moons(args.train, args.noise, gen)
    xt, yt = two_moons(args.test, args.noise, gen)
    x, y, xt, yt = (v.to(args.device) for v in (x, y, xt, yt))
    model = make_model(args.qubits, args.layers, args.diff_method, args.device,
                       args.input_scale)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    history = []
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        perm = torch.randperm(len(x), generator=gen).to(args.device)
        total = 0.0
        for i in range(0, len(x), args.batch):
            idx = perm[i:i + args.batch]
            opt.zero_grad()
            loss = loss_fn(model(x[idx]).squeeze(-1), y[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        history.append((total / len(x), accuracy(model, x, y), accuracy(model, xt, yt)))
        if epoch % args.every == 0 or epoch == args.epochs:
            log(f"epoch {epoch:3d}  loss {history[-1][0]:.4f}  train acc {history[-1][1]:.3f}  "
                f"test acc {history[-1][2]:.3f}  t = {time.perf_counter() - start:.1f} s")
    return model, history, history[-1][2], (xt, yt), time.perf_counter() - start


def plot(model, xt, yt, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    xt, yt = xt.cpu(), yt.cpu()
    lo, hi = xt.min(0).values - 0.5, xt.max(0).values + 0.5
    gx, gy = torch.meshgrid(torch.linspace(float(lo[0]), float(hi[0]), 80, dtype=torch.float64),
                            torch.linspace(float(lo[1]), float(hi[1]), 80, dtype=torch.float64),
                            indexing="xy")
    grid = torch.stack([gx.reshape(-1), gy.reshape(-1)], 1)
    device = next(model.parameters()).device
    with torch.no_grad():
        p = torch.sigmoid(model(grid.to(device)).squeeze(-1)).cpu().reshape(gx.shape)
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    cs = ax.contourf(gx, gy, p, levels=20, cmap="RdBu_r", alpha=0.6)
    ax.contour(gx, gy, p, levels=[0.5], colors="k")
    ax.scatter(xt[:, 0], xt[:, 1], c=yt, cmap="RdBu_r", edgecolors="k", s=14)
    fig.colorbar(cs, ax=ax, label="P(class 1)")
    ax.set_title(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)  # atomic: an interrupted run leaves no partial plot
    plt.close(fig)


def parser() -> Parser:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=positive_int, default=30)
    p.add_argument("--qubits", type=positive_int, default=4)
    p.add_argument("--layers", type=positive_int, default=3)
    p.add_argument("--train", type=positive_int, default=200)
    p.add_argument("--test", type=positive_int, default=200)
    p.add_argument("--noise", type=nonnegative_float, default=0.1)
    p.add_argument("--batch", type=positive_int, default=32)
    p.add_argument("--lr", type=positive_float, default=0.05)
    p.add_argument("--input-scale", type=positive_float, default=2.0,
                   help="angle = scale * Linear(x)")
    p.add_argument("--diff-method", default="best",
                   choices=["best", "adjoint", "backprop", "parameter-shift"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--threads", type=thread_count, default=1)
    p.add_argument("--every", type=positive_int, default=5)
    p.add_argument("--plot", default=None, help="save the decision boundary plot here")
    return p


def main(argv=None, log=print):
    args = parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise qd.QdiffError("--device cuda: torch.cuda.is_available() is False on this machine")
    check_plot(args.plot)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, history, test_acc, (xt, yt), secs = train(args, log)
    log(f"test accuracy {test_acc:.3f} ({args.test} points) after {args.epochs} epochs, "
        f"training {secs:.1f} s, diff_method={args.diff_method}")
    if args.plot:
        plot(model, xt, yt, args.plot, f"hybrid classifier: test accuracy {test_acc:.3f}")
        log(f"plot saved to {args.plot}")
    return test_acc, history


if __name__ == "__main__":
    run(main)
