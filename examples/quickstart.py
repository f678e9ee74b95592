"""qdiff in one minute, on the embedded torch statevector simulator (no set-up, no network).

1. A hybrid torch model (Linear -> QuantumLayer -> Linear) learns a small two-moons problem.
2. A VQE finds the ground state of H2 (STO-3G, 0.7414 A; Hamiltonian from PennyLane's qchem,
   offline) to chemical accuracy with the adjoint method.

    python examples/quickstart.py
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _cli import Parser, run  # noqa: E402


def two_moons(n: int, noise: float, gen: torch.Generator):
    t = torch.rand(n, generator=gen) * math.pi
    upper = torch.rand(n, generator=gen) < 0.5
    x = torch.where(upper[:, None], torch.stack([torch.cos(t), torch.sin(t)], 1),
                    torch.stack([1 - torch.cos(t), 0.5 - torch.sin(t)], 1))
    x = x + noise * torch.randn(n, 2, generator=gen)
    return x.double(), upper.double()


def hybrid_classifier(epochs: int = 30) -> float:
    n_wires = 3
    dev = qd.device("statevector", wires=n_wires)

    @qd.qnode(dev, diff_method="adjoint")
    def circuit(inputs, weights):
        qd.AngleEmbedding(inputs, wires=range(n_wires), rotation="Y")
        qd.StronglyEntanglingLayers(weights, wires=range(n_wires))
        return [qd.expval(qd.Z(i)) for i in range(n_wires)]

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(2, n_wires, dtype=torch.float64), torch.nn.Tanh(),
        qd.QuantumLayer(circuit, {"weights": qd.StronglyEntanglingLayers.shape(2, n_wires)},
                        dtype=torch.float64),
        torch.nn.Linear(n_wires, 1, dtype=torch.float64))
    gen = torch.Generator().manual_seed(1)
    x, y = two_moons(200, 0.1, gen)
    xt, yt = two_moons(200, 0.1, gen)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for epoch in range(epochs):
        opt.zero_grad()
        loss = loss_fn(model(x).squeeze(-1), y)
        loss.backward()
        opt.step()
        if epoch % 10 == 0 or epoch == epochs - 1:
            print(f"  epoch {epoch:3d}  loss {loss.item():.4f}")
    with torch.no_grad():
        acc = ((model(xt).squeeze(-1) > 0).double() == yt).double().mean().item()
    return acc


def vqe_h2(steps: int = 60):
    from qdiff import qchem
    mol = qchem.molecule("H2")
    n, H = mol.n_qubits, mol.hamiltonian
    singles, doubles = qd.excitations(mol.electrons, n)
    dev = qd.device("statevector", wires=n)

    @qd.qnode(dev, diff_method="adjoint")
    def energy(w):
        qd.AllSinglesDoubles(w, wires=range(n), hf_state=mol.hf_state, singles=singles,
                             doubles=doubles)
        return qd.expval(H)

    exact = float(qd.ground_state(H, n_qubits=n)[0])
    w = torch.zeros(len(singles) + len(doubles), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([w], lr=0.1)
    t0 = time.perf_counter()
    for step in range(steps + 1):
        opt.zero_grad()
        e = energy(w)
        if abs(e.item() - exact) < 1.6e-3 or step == steps:
            break
        e.backward()
        opt.step()
    elapsed = time.perf_counter() - t0
    return e.item(), exact, step, elapsed


def main(argv=None):
    Parser(description=__doc__.splitlines()[0]).parse_args(argv)  # no options: --help only
    print(f"qdiff {qd.__version__} — hybrid classifier on two moons (3 qubits, adjoint gradients)")
    acc = hybrid_classifier()
    print(f"  test accuracy: {acc:.3f}")
    print("VQE for H2 (STO-3G, 4 qubits, HF + Givens excitations, Adam)")
    e, exact, steps, secs = vqe_h2()
    print(f"  energy {e:.6f} Ha, exact {exact:.6f} Ha, error {1e3 * abs(e - exact):.3f} mHa "
          f"after {steps} steps ({secs:.2f} s)")
    ok = abs(e - exact) <= 1.6e-3 and acc > 0.8
    print("OK: chemical accuracy reached and classifier trained" if ok else "NOT OK")
    return 0 if ok else 1


if __name__ == "__main__":
    run(main)
