"""Classical kernels against PennyLane and scipy, timed side by side in one run.

1. Pauli-sum expectation <psi|H|psi> of the 12-qubit LiH/STO-3G Hamiltonian (631 terms) for a
   batch of 1 and 64 random states: qdiff ``PauliSumOperator.expval`` vs PennyLane
   ``default.qubit`` ``qml.expval(H)`` (StatePrep, broadcast over the batch) vs a scipy sparse
   CSR matrix-vector product (matrix built once, outside the timing).
2. Ground state of a periodic transverse-field Ising chain (16-20 spins): qdiff ``lanczos``
   vs ``scipy.sparse.linalg.eigsh(which="SA")`` on the same operator (CSR from qdiff; build time
   reported separately).

Run (single-threaded on both sides, for a fair comparison on a shared machine):
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 \
        python bench/bench_kernels.py [--sizes 16 18 20] [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np
import torch

warnings.filterwarnings("ignore")


def median_time(fn, repeats):
    fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def bench_expval(repeats):
    import pennylane as qml
    import scipy.sparse.linalg  # noqa: F401
    from qdiff import qchem
    from qdiff.operators import PauliSumOperator
    mol = qchem.molecule("LiH-12")
    n = mol.n_qubits
    op = PauliSumOperator.from_observable(mol.hamiltonian, n)
    t = time.perf_counter()
    op.diagonals()
    build = time.perf_counter() - t
    S = op.to_scipy()
    H_pl = qchem.to_pennylane(mol.hamiltonian)
    dev = qml.device("default.qubit", wires=n)

    @qml.qnode(dev)
    def circ(state):
        qml.StatePrep(state, wires=range(n), normalize=False)
        return qml.expval(H_pl)

    rows = []
    print(f"LiH/STO-3G: {n} qubits, {op.num_terms} terms, {op.num_groups} flip groups; "
          f"qdiff diagonal build {build * 1e3:.1f} ms (once)")
    for batch in (1, 64):
        g = torch.Generator().manual_seed(batch)
        psi = torch.randn(batch, 2 ** n, generator=g, dtype=torch.complex128)
        psi = psi / psi.norm(dim=-1, keepdim=True)
        arr = psi.numpy()
        ours = op.expval(psi)
        ref_sp = np.einsum("bi,bi->b", arr.conj(), (S @ arr.T).T).real
        ref_pl = np.atleast_1d(np.asarray(circ(arr if batch > 1 else arr[0])))
        err = max(float(np.abs(ours.numpy() - ref_sp).max()), float(np.abs(ours.numpy() - ref_pl).max()))
        t_q = median_time(lambda: op.expval(psi), repeats)
        t_s = median_time(lambda: np.einsum("bi,bi->b", arr.conj(), (S @ arr.T).T).real, repeats)
        t_p = median_time(lambda: circ(arr if batch > 1 else arr[0]), max(3, repeats // 2))
        rows.append((batch, t_q, t_p, t_s, err))
        print(f"  batch {batch:3d}: qdiff {t_q * 1e3:8.2f} ms | PennyLane default.qubit "
              f"{t_p * 1e3:9.2f} ms ({t_p / t_q:6.1f}x) | scipy CSR {t_s * 1e3:8.2f} ms "
              f"({t_s / t_q:5.2f}x) | max |diff| {err:.1e}")
    return rows


def tfim(n, h=0.7):
    from qdiff.operators import PauliSumOperator
    words = [{i: "Z", (i + 1) % n: "Z"} for i in range(n)] + [{i: "X"} for i in range(n)]
    return PauliSumOperator(words, [-1.0] * n + [-h] * n, n)


def bench_ground_state(sizes):
    import scipy.sparse.linalg as sla
    from qdiff.solvers import lanczos
    rows = []
    for n in sizes:
        op = tfim(n)
        t = time.perf_counter()
        op.diagonals()
        build_q = time.perf_counter() - t
        t = time.perf_counter()
        S = op.to_scipy(tol=1e-14)
        build_s = time.perf_counter() - t
        v0 = np.random.default_rng(0).normal(size=2 ** n)
        t = time.perf_counter()
        e_s = sla.eigsh(S, k=1, which="SA", v0=v0, tol=1e-12)[0][0]
        t_s = time.perf_counter() - t
        t = time.perf_counter()
        e_q, _, info = lanczos(op, 1, v0=torch.from_numpy(v0), tol=1e-9)
        t_q = time.perf_counter() - t
        diff = abs(float(e_q[0]) - e_s)
        rows.append((n, t_q, t_s, diff, info.matvecs, build_q, build_s))
        print(f"  TFIM n={n}: qdiff lanczos {t_q:7.2f} s ({info.matvecs} matvecs, diag build "
              f"{build_q:.2f} s) | scipy eigsh {t_s:7.2f} s (CSR build {build_s:.2f} s, nnz "
              f"{S.nnz}) | ratio scipy/qdiff {t_s / t_q:5.2f} | |dE| {diff:.1e}")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[16, 18, 20])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print("[1] Pauli-sum expectation")
    bench_expval(args.repeats)
    print("[2] ground state of a periodic TFIM chain (h=0.7)")
    bench_ground_state(args.sizes)


if __name__ == "__main__":
    main()
