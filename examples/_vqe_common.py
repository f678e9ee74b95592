"""Shared driver of the VQE examples: command line, problems, ansatzes, optimizers, loop, report.

Every script parses the same options::

    --backend statevector|aer|ibm:fake_manila   --device cpu|cuda   --steps N   --plot out.png
    --shots N   --optimizer adam|qng   --ansatz givens|hea|hva   --lr X   --layers L

``--diff-method best`` (default) resolves as qdiff does: on the exact statevector backend with
its native CPU kernels, backprop up to 5 qubits and adjoint above (LiH and BeH2: adjoint
1.3-1.5x faster than backprop per step, see bench/RESULTS.md); parameter-shift on shot-based
or Qiskit backends (all shifted circuits of a step in one job). The loop stops when the
energy is within the target of the exact energy (chemical accuracy, 1.6 mHa, for molecules;
1e-3 relative for spin chains) or after ``--steps`` steps; with shots it always runs all steps
(a noisy estimate may come within the target by chance, or fall below the exact energy: the
target counts the error's size) and the error is also reported for the
final parameters evaluated exactly. The reported wall time is the optimization loop only
(forward, backward, optimizer step, progress line), not the Hamiltonian or the exact solve.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

import qdiff as qd
from qdiff import qchem
from qdiff.circuits import memory
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.fileio import save_figure

from _cli import (Parser, check_plot, finite_float, nonnegative_int,  # noqa: F401 (scripts)
                  positive_float, positive_int, run, seed_int, thread_count)

CHEMICAL_ACCURACY = 1.6e-3  # Ha
QNG_LR = 0.25  # reached chemical accuracy in 2-3 steps on H2, LiH, BeH2; 0.5 diverged on BeH2


@dataclass
class Problem:
    """A Hamiltonian with its exact ground energy and how to judge a VQE on it."""

    name: str
    hamiltonian: qd.Observable
    n_qubits: int
    exact: float
    target: float  # absolute error at which the run counts as converged
    electrons: Optional[int] = None  # fermionic problems (Jordan-Wigner, PennyLane ordering)
    hf_energy: Optional[float] = None
    ansatz_builder: Optional[Callable] = None  # spin chains: (args) -> (circuit fn, w0)
    notes: list = field(default_factory=list)

    @property
    def hf_state(self):
        return qd.hf_state(self.electrons, self.n_qubits)


@dataclass
class Result:
    energies: list
    exact: float
    steps: int  # optimizer steps taken (gradient evaluations)
    wall: float  # seconds, optimization loop only
    reached: Optional[int]  # step at which the target was first met (None: never)
    time_to_target: Optional[float]
    final_energy: float
    final_exact_energy: float  # final parameters evaluated on the exact statevector
    params: torch.Tensor
    backend: str
    noisy: bool = False  # shot-based estimates (--shots, or an IBM device's default shots)

    @property
    def error(self) -> float:
        return self.final_energy - self.exact


# ------------------------------------------------------------------------------------------
# command line


def parser(description: str, steps: int, lr: float, ansatz: str = "givens") -> Parser:
    p = Parser(description=description)
    p.add_argument("--backend", default="statevector",
                   help="statevector (default), aer, or ibm:<fake or real device name>")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="torch device of the statevector backend")
    p.add_argument("--steps", type=nonnegative_int, default=steps, help="maximum optimizer steps")
    p.add_argument("--plot", default=None, help="save a plot of energy against step here")
    p.add_argument("--shots", type=positive_int, default=None,
                   help="shots per expectation (statevector, aer, ibm; default: exact, or the "
                        "IBM device's default)")
    p.add_argument("--optimizer", default="adam", choices=["adam", "qng"])
    p.add_argument("--ansatz", default=ansatz, choices=["givens", "hea", "hva"],
                   help="givens: HF + all single/double Givens excitations; hea: hardware-"
                        "efficient RY/RZ + CNOT ladder; hva: Hamiltonian-variational (spin chains)")
    p.add_argument("--layers", type=positive_int, default=None,
                   help="layers of the hea/hva ansatz")
    p.add_argument("--diff-method", default="best",
                   choices=["best", "adjoint", "backprop", "parameter-shift"])
    p.add_argument("--lr", type=positive_float, default=None,
                   help=f"learning rate (default {lr} for adam, {QNG_LR} for qng)")
    p.set_defaults(adam_lr=lr)
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--threads", type=thread_count, default=1,
                   help="torch threads (default 1: these states are small; 0 = torch's default)")
    p.add_argument("--every", type=positive_int, default=1,
                   help="print a progress line every N steps")
    p.add_argument("--run-all", action="store_true",
                   help="run all --steps steps instead of stopping at the target")
    return p


def setup(args, ansatzes=("givens", "hea")) -> None:
    """Checks of option combinations (a :class:`QdiffError` naming the options) and the run's
    torch settings. ``ansatzes``: the ``--ansatz`` values the script's problems take."""
    if args.ansatz not in ansatzes:
        raise QdiffError(f"--ansatz {args.ansatz}: this script's problems take "
                         f"{' or '.join(ansatzes)}")
    if args.layers is not None and args.ansatz == "givens":
        raise QdiffError("--layers applies to --ansatz hea or hva; the givens ansatz has one "
                         "parameter per excitation")
    spec = args.backend
    if spec not in ("statevector", "aer") and not (spec.startswith("ibm:") and spec[4:]):
        raise QdiffError(f"--backend {spec!r}: use statevector, aer or ibm:<device name>")
    if args.device == "cuda" and spec != "statevector":
        raise QdiffError(f"--device cuda applies to --backend statevector; {spec} runs on its "
                         "own simulator or device")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise QdiffError("--device cuda: torch.cuda.is_available() is False on this machine")
    check_plot(args.plot)
    if args.lr is None:
        args.lr = QNG_LR if args.optimizer == "qng" else args.adam_lr
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)


# ------------------------------------------------------------------------------------------
# problems


def sector_mask(n: int, electrons: int) -> torch.Tensor:
    """``(2**n,)`` bool: ``electrons`` particles with total Sz = 0 (even wires spin up, odd
    wires spin down, as PennyLane's qchem orders spin orbitals; wire 0 = most significant bit)."""
    idx = torch.arange(1 << n)
    up = torch.zeros_like(idx)
    down = torch.zeros_like(idx)
    for w in range(n):
        bit = (idx >> (n - 1 - w)) & 1
        if w % 2 == 0:
            up += bit
        else:
            down += bit
    return (up + down == electrons) & (up == down)


def exact_energy(H: qd.Observable, n: int, mask: Optional[torch.Tensor] = None) -> float:
    """Lowest eigenvalue by qdiff's Lanczos (``qd.ground_state``), optionally in a sector."""
    op = qd.PauliSumOperator.from_observable(H, n_qubits=n)
    e, _, info = qd.ground_state(op, mask=mask)
    if not info.converged:
        raise QdiffError(f"Lanczos did not converge (residual {info.residual:.2e})")
    return float(e)


def molecular_problem(name: str, **overrides) -> Problem:
    """A preset of :func:`qdiff.qchem.molecule` with exact (sector) and HF energies."""
    mol = qchem.molecule(name, **overrides)
    if mol.mapping != "jordan_wigner":
        raise QdiffError(f"mapping={mol.mapping!r}: the examples' sector energies and Givens "
                         "excitations are those of Jordan-Wigner qubits (occupation numbers); "
                         "use mapping='jordan_wigner'")
    n, ne = mol.n_qubits, mol.electrons
    H = mol.hamiltonian
    e_sector = exact_energy(H, n, sector_mask(n, ne))
    e_all = exact_energy(H, n)
    op = qd.PauliSumOperator.from_observable(H, n_qubits=n)
    hf = torch.zeros(1 << n, dtype=torch.float64)
    hf[mol.hf_index] = 1.0
    e_hf = float(op.expval(hf))
    notes = []
    if e_all < e_sector - 1e-8:
        notes.append(f"the unrestricted ground energy {e_all:.6f} Ha lies outside the "
                     f"{ne}-electron Sz=0 sector; the sector energy is the reference")
    else:
        notes.append(f"Lanczos ground state of the qubit Hamiltonian is in the {ne}-electron "
                     f"Sz=0 sector (unrestricted {e_all:.8f} = sector {e_sector:.8f} Ha)")
    return Problem(name, H, n, e_sector, CHEMICAL_ACCURACY, electrons=ne, hf_energy=e_hf,
                   notes=notes)


# ------------------------------------------------------------------------------------------
# backends and ansatzes


def make_device(args, n: int):
    """``(backend, diff_method, label)`` from ``--backend``/``--device``/``--shots``."""
    spec = args.backend
    if spec == "statevector":
        dev = qd.device("statevector", wires=n, shots=args.shots, device=args.device,
                        seed=args.seed if args.shots else None)
        method = "best"
        label = "statevector" + (f" ({args.shots} shots)" if args.shots else f" ({args.device})")
    elif spec == "aer":
        dev = qd.device("aer", wires=n, shots=args.shots, seed=args.seed)
        method = "parameter-shift"
        label = "aer" + (f" ({args.shots} shots)" if args.shots else " (exact)")
    elif spec.startswith("ibm:"):
        name = spec.split(":", 1)[1]
        kw = dict(shots=args.shots) if args.shots else {}
        dev = qd.device("ibm", backend=name, wires=n, seed=args.seed, **kw)
        method = "parameter-shift"
        label = f"ibm {name} ({dev.shots} shots)"
    else:
        raise QdiffError(f"--backend {spec!r}: use statevector, aer or ibm:<device name>")
    return dev, method, label


def givens_ansatz(problem: Problem):
    """HF state + every spin-conserving single and double excitation as Givens rotations."""
    n = problem.n_qubits
    singles, doubles = qd.excitations(problem.electrons, n)
    hf = problem.hf_state

    def circuit(w):
        qd.AllSinglesDoubles(w, wires=range(n), hf_state=hf, singles=singles, doubles=doubles)

    return circuit, torch.zeros(len(singles) + len(doubles), dtype=torch.float64)


def hea_ansatz(problem: Problem, layers: int, seed: int):
    """Reference state (HF for molecules) + ``layers`` of RY/RZ on every wire and a CNOT ladder;
    weights start small and random (zero weights would leave only the CNOT ladder)."""
    n = problem.n_qubits
    hf = problem.hf_state if problem.electrons is not None else None

    def circuit(w):
        if hf is not None:
            qd.BasisState(hf, wires=range(n))
        qd.HardwareEfficientAnsatz(w, wires=range(n))

    shape = qd.HardwareEfficientAnsatz.shape(layers, n)
    memory.require(1000.0 * math.prod(shape), f"the weights {tuple(shape)} of {layers} layers "
                                              "and their recorded gates")
    g = torch.Generator().manual_seed(seed)
    return circuit, 0.05 * torch.randn(*shape, generator=g,
                                       dtype=torch.float64)


def make_ansatz(problem: Problem, args):
    if problem.ansatz_builder is not None and args.ansatz in ("hva", "givens"):
        return problem.ansatz_builder(args)
    if args.ansatz == "hea":
        return hea_ansatz(problem, args.layers or 2, args.seed)
    if problem.electrons is None or args.ansatz != "givens":
        raise QdiffError(f"--ansatz {args.ansatz} does not apply to {problem.name}")
    return givens_ansatz(problem)


# ------------------------------------------------------------------------------------------
# optimizers


def make_optimizer(args, w, qnode):
    if args.optimizer == "qng":  # block-diagonal Fubini-Study metric, lam = 1e-3
        return qd.QNGOptimizer([w], qnode, lr=args.lr, lam=1e-3, metric="block-diag")
    return torch.optim.Adam([w], lr=args.lr)


# ------------------------------------------------------------------------------------------
# the loop


def vqe(problem: Problem, args, log=print, w0: Optional[torch.Tensor] = None) -> Result:
    """Run the VQE described by ``args`` on ``problem``; returns a :class:`Result`.
    ``w0`` overrides the ansatz's initial parameters (a warm start)."""
    dev, method, label = make_device(args, problem.n_qubits)
    if args.diff_method != "best":
        method = args.diff_method
    ansatz, w_init = make_ansatz(problem, args)
    w0 = w_init if w0 is None else w0.detach().to(w_init.dtype).reshape(w_init.shape)
    H = problem.hamiltonian

    def energy(w):
        ansatz(w)
        return qd.expval(H)

    qnode = qd.qnode(dev, diff_method=method)(energy)
    if method == "best":
        from qdiff.rules import resolve
        method = resolve("best", dev, qnode.construct(w0)[0].circuit).name
    w = w0.clone().requires_grad_(True)
    opt = make_optimizer(args, w, qnode)
    noisy = bool(getattr(dev, "shots", None))  # an IBM device has shots without --shots
    early = not (args.run_all or noisy)
    energies, reached, t_reached = [], None, None
    start = time.perf_counter()
    for step in range(args.steps + 1):
        opt.zero_grad()
        e = qnode(w)
        ev = float(e.detach())
        energies.append(ev)
        err = ev - problem.exact
        elapsed = time.perf_counter() - start
        if reached is None and abs(err) <= problem.target:  # a noisy estimate can be below
            reached, t_reached = step, elapsed
        if step % args.every == 0 or step == args.steps or (early and reached is not None):
            log(f"step {step:4d}  E = {ev:.8f}  error = {fmt_error(problem, err)}  "
                f"t = {elapsed:.2f} s")
        if step == args.steps or (early and reached is not None):
            break
        e.backward()
        opt.step()
    wall = time.perf_counter() - start
    exact_run = args.backend == "statevector" and not noisy
    final_exact = energies[-1] if exact_run else exact_value(problem, ansatz, w)
    return Result(energies, problem.exact, step, wall, reached, t_reached, energies[-1],
                  final_exact, w.detach().clone(), f"{label}, {method}", noisy)


def exact_value(problem: Problem, ansatz, w) -> float:
    dev = qd.device("statevector", wires=problem.n_qubits)

    @qd.qnode(dev, diff_method="adjoint")
    def energy(w):
        ansatz(w)
        return qd.expval(problem.hamiltonian)

    with torch.no_grad():
        return float(energy(w.detach()))


# ------------------------------------------------------------------------------------------
# report


def fmt_error(problem: Problem, err: float) -> str:
    if problem.electrons is not None:
        return f"{1000 * err:9.4f} mHa"
    return f"{err / abs(problem.exact):.3e} rel"


def describe(problem: Problem, log=print) -> None:
    log(f"{problem.name}: {problem.n_qubits} qubits, {len(problem.hamiltonian.terms)} Pauli terms")
    log(f"  exact ground energy (qdiff Lanczos): {problem.exact:.8f}")
    if problem.hf_energy is not None:
        log(f"  Hartree-Fock energy: {problem.hf_energy:.8f}  "
            f"(HF error {1000 * (problem.hf_energy - problem.exact):.2f} mHa)")
    for n in problem.notes:
        log("  " + n)


def report(problem: Problem, res: Result, args, log=print) -> None:
    unit = "mHa" if problem.electrons is not None else "rel"
    err = res.error * 1000 if unit == "mHa" else res.error / abs(res.exact)
    err_x = (res.final_exact_energy - res.exact)
    err_x = err_x * 1000 if unit == "mHa" else err_x / abs(res.exact)
    target = "chemical accuracy" if unit == "mHa" else "1e-3 relative"
    hit = (f"step {res.reached} after {res.time_to_target:.2f} s" if res.reached is not None
           else "not reached")
    rows = [("problem", problem.name), ("backend", res.backend),
            ("ansatz / optimizer", f"{args.ansatz} / {args.optimizer} (lr {args.lr})"),
            ("parameters", str(res.params.numel())),
            ("energy", f"{res.final_energy:.8f}"), ("exact energy", f"{res.exact:.8f}"),
            (f"error ({unit})", f"{err:.4g}" if unit == "mHa" else f"{err:.3e}")]
    if abs(res.final_exact_energy - res.final_energy) > 1e-12:
        rows.append((f"error of final params, exact ({unit})",
                     f"{err_x:.4g}" if unit == "mHa" else f"{err_x:.3e}"))
    first = " (first noisy estimate)" if res.noisy else " (first reached)" if res.steps != \
        res.reached else ""
    rows += [("steps", str(res.steps)), ("wall time, loop (s)", f"{res.wall:.3f}"),
             (target + first, hit)]
    width = max(len(k) for k, _ in rows)
    log("-" * (width + 40))
    for k, v in rows:
        log(f"{k:<{width}}  {v}")
    log("-" * (width + 40))


def plot(problem: Problem, res: Result, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    steps = list(range(len(res.energies)))
    a.plot(steps, res.energies, "o-", ms=3, label="VQE")
    a.axhline(res.exact, color="k", ls="--", label="exact")
    if problem.hf_energy is not None:
        a.axhline(problem.hf_energy, color="gray", ls=":", label="Hartree-Fock")
    a.set_xlabel("step")
    a.set_ylabel("energy (Ha)" if problem.electrons is not None else "energy")
    a.set_title(problem.name)
    a.legend()
    errs = [max(e - res.exact, 1e-12) for e in res.energies]
    b.semilogy(steps, errs, "o-", ms=3)
    b.axhline(problem.target, color="r", ls="--",
              label="chemical accuracy" if problem.electrons is not None else "1e-3 relative")
    b.set_xlabel("step")
    b.set_ylabel("E - E_exact")
    b.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=120)  # atomic: an interrupted run leaves no partial plot
    plt.close(fig)


def main(problem: Problem, args, log=print) -> Result:
    describe(problem, log)
    res = vqe(problem, args, log)
    report(problem, res, args, log)
    if args.plot:
        plot(problem, res, args.plot)
        log(f"plot saved to {args.plot}")
    return res
