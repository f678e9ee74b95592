"""VQE for open spin chains: transverse-field Ising (critical, h = J) and Heisenberg (antiferromagnet).

    H_TFIM = -J sum_i Z_i Z_{i+1} - h sum_i X_i          H_XXX = J sum_i (X X + Y Y + Z Z)_{i,i+1}

Ansatz (``--ansatz hva``, the default): Hamiltonian-variational layers. TFIM: from |+>^n, per
layer an IsingZZ on every bond and an RX on every site (one angle each), started on a
Trotterized adiabatic ramp. Heisenberg: from a product of singlets on (0,1), (2,3), ..., per
layer exp(-i t (XX+YY+ZZ)) on the odd bonds, then on the even bonds (one angle per bond, shared
by its three gates). ``--ansatz hea`` uses the hardware-efficient one instead. The exact energy
is qdiff's Lanczos ground state; the target is 1e-3 relative error.

    python examples/vqe_spin_chain.py [--model tfim|heisenberg|both] [--spins 8] [--layers L]
                                      [--steps N] [--plot out.png] [--backend ...]
"""
from __future__ import annotations

if __name__ == "__main__":  # first: Ctrl-C during the imports below is one line, exit 130
    import _startup  # noqa: F401

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _vqe_common as common  # noqa: E402
import qdiff as qd  # noqa: E402


# coefficient lists through qd.Hamiltonian: one float64 tensor, like terms merged
def tfim_hamiltonian(n: int, J: float = 1.0, h: float = 1.0) -> qd.Observable:
    ops = [qd.Z(i) @ qd.Z(i + 1) for i in range(n - 1)] + [qd.X(i) for i in range(n)]
    return qd.Hamiltonian([-J] * (n - 1) + [-h] * n, ops)


def heisenberg_hamiltonian(n: int, J: float = 1.0) -> qd.Observable:
    ops = [getattr(qd, P)(i) @ getattr(qd, P)(i + 1) for i in range(n - 1) for P in "XYZ"]
    return qd.Hamiltonian([J] * len(ops), ops)


def tfim_hva(n: int, layers: int, J: float, h: float, dt: float = 0.3, seed: int = 0):
    """``(circuit, w0 (layers, 2n-1))``; w0 is a Trotterized ramp from -h sum X to H_TFIM."""
    nb = n - 1

    def circuit(w):
        for i in range(n):
            qd.H(wires=i)
        for layer in range(w.shape[0]):
            for b in range(nb):
                qd.IsingZZ(w[layer, b], wires=[b, b + 1])
            for i in range(n):
                qd.RX(w[layer, nb + i], wires=i)

    g = torch.Generator().manual_seed(seed)
    w0 = 0.01 * torch.randn(layers, nb + n, generator=g, dtype=torch.float64)
    for layer in range(layers):
        s = (layer + 1) / layers
        w0[layer, :nb] += -2 * dt * s * J  # exp(+i dt s J ZZ) = IsingZZ(-2 dt s J)
        w0[layer, nb:] += -2 * dt * h  # exp(+i dt h X) = RX(-2 dt h)
    return circuit, w0


def heisenberg_hva(n: int, layers: int, seed: int = 0):
    """``(circuit, w0 (layers, n-1))`` from a product of singlets (n even)."""
    if n % 2:
        raise qd.QdiffError("the Heisenberg ansatz starts from singlet pairs: use an even "
                            "--spins")

    def circuit(w):
        for i in range(0, n, 2):  # (|01> - |10>)/sqrt(2) on (i, i+1)
            qd.X(wires=i + 1)
            qd.H(wires=i)
            qd.CNOT(wires=[i, i + 1])
            qd.Z(wires=i)
        for layer in range(w.shape[0]):
            for start in (1, 0):
                for b in range(start, n - 1, 2):
                    for gate in (qd.IsingXX, qd.IsingYY, qd.IsingZZ):
                        gate(w[layer, b], wires=[b, b + 1])

    g = torch.Generator().manual_seed(seed)
    return circuit, 0.01 * torch.randn(layers, n - 1, generator=g, dtype=torch.float64)


def chain_problem(model: str, n: int, field: float = 1.0) -> common.Problem:
    if model == "tfim":
        H = tfim_hamiltonian(n, 1.0, field)
        name = f"TFIM n={n} (J=1, h={field:g}, open)"
    else:
        H = heisenberg_hamiltonian(n)
        name = f"Heisenberg XXX n={n} (J=1, open)"
    exact = common.exact_energy(H, n)

    def builder(args):
        layers = args.layers or n // 2
        if model == "tfim":
            return tfim_hva(n, layers, 1.0, field, seed=args.seed)
        return heisenberg_hva(n, layers, seed=args.seed)

    return common.Problem(name, H, n, exact, target=1e-3 * abs(exact), ansatz_builder=builder,
                          notes=["target: 1e-3 relative error"])


def main(argv=None, log=print):
    p = common.parser(__doc__.splitlines()[0], steps=800, lr=0.1, ansatz="hva")
    p.add_argument("--model", default="both", choices=["tfim", "heisenberg", "both"])
    p.add_argument("--spins", type=common.positive_int, default=8)
    p.add_argument("--field", type=common.finite_float, default=1.0,
                   help="transverse field h of the TFIM")
    p.set_defaults(every=20)
    args = p.parse_args(argv)
    if args.spins < 2:
        p.error(f"--spins {args.spins}: a chain needs at least 2 spins")
    if args.spins % 2 and args.model != "tfim" and args.ansatz == "hva":
        p.error(f"--spins {args.spins}: the Heisenberg ansatz starts from singlet pairs; use an "
                "even --spins (or --model tfim, or --ansatz hea)")
    common.setup(args, ansatzes=("hva", "hea"))
    models = ["tfim", "heisenberg"] if args.model == "both" else [args.model]
    plots = {model: args.plot for model in models}
    if args.plot and len(models) > 1:  # one plot per model, each checked before any run
        root, ext = os.path.splitext(args.plot)
        plots = {model: f"{root}_{model}{ext or '.png'}" for model in models}
        for path in plots.values():
            common.check_plot(path)
    results = []
    for model in models:
        args.plot = plots[model]
        results.append(common.main(chain_problem(model, args.spins, args.field), args, log))
    return results


if __name__ == "__main__":
    common.run(main)
