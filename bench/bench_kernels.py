"""Classical kernels against PennyLane and scipy, timed side by side in one run.

1. Pauli-sum expectation <psi|H|psi> of the 12-qubit LiH/STO-3G Hamiltonian (631 terms) for a
   batch of 1 and 64 random states: qdiff ``PauliSumOperator.expval`` vs PennyLane
   ``default.qubit`` ``qml.expval(H)`` (StatePrep, broadcast over the batch) vs a scipy sparse
   CSR matrix-vector product (matrix built once, outside the timing).
2. Ground state of a periodic transverse-field Ising chain (16-20 spins): qdiff ``lanczos``
   vs ``scipy.sparse.linalg.eigsh(which="SA")`` on the same operator (CSR from qdiff; build time
   reported separately).

With ``--device cuda`` qdiff runs on the GPU (same code, CUDA tensors) and CuPy's
``cupyx.scipy.sparse`` (CSR product, ``eigsh``) is timed beside it on the same GPU, the CSR
matrix copied there outside the timing; scipy stays on the CPU (up to ``--cpu-peer-max`` qubits
for the eigensolver: its CSR build grows as n 2^n).

Run (single-threaded on both sides, for a fair comparison on a shared machine):
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 \
        python bench/bench_kernels.py [--sizes 16 18 20] [--repeats 5]
On a GPU:
    python bench/bench_kernels.py --device cuda --sizes 18 20 22 --cpu-peer-max 20 \
        --solve-repeats 3
"""
from __future__ import annotations

import os
import statistics
import sys
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import ArgumentParser  # noqa: E402

warnings.filterwarnings("ignore")


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        try:
            import cupy
            cupy.cuda.Device().synchronize()
        except ImportError:
            pass


def median_time(fn, repeats, device="cpu"):
    fn()
    _sync(device)
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        _sync(device)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def time_solve(fn, repeats, device="cpu"):
    """(result, seconds): one timed call, or with ``repeats`` > 1 the median of that many after
    an untimed warm-up call (CUDA's first calls load kernels and libraries)."""
    if repeats > 1:
        out = []
        t = median_time(lambda: out.append(fn()), repeats, device)
        return out[-1], t
    _sync(device)
    t = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - t


def _cupyx(device):
    """CuPy's sparse module when qdiff runs on CUDA and CuPy is installed, else None."""
    if torch.device(device).type != "cuda":
        return None
    try:
        import cupy
        import cupyx.scipy.sparse as csp
        import cupyx.scipy.sparse.linalg as csla
    except ImportError:
        print("  (CuPy not installed: no GPU peer)")
        return None
    return cupy, csp, csla


def bench_expval(repeats, device="cpu"):
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
    gpu = _cupyx(device)
    if gpu:
        cupy, csp, _ = gpu
        S_g = csp.csr_matrix(S)

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
        psi_d = psi.to(device)
        ours = op.expval(psi_d).cpu()
        ref_sp = np.einsum("bi,bi->b", arr.conj(), (S @ arr.T).T).real
        ref_pl = np.atleast_1d(np.asarray(circ(arr if batch > 1 else arr[0])))
        err = max(float(np.abs(ours.numpy() - ref_sp).max()), float(np.abs(ours.numpy() - ref_pl).max()))
        t_q = median_time(lambda: op.expval(psi_d), repeats, device)
        t_s = median_time(lambda: np.einsum("bi,bi->b", arr.conj(), (S @ arr.T).T).real, repeats)
        t_p = median_time(lambda: circ(arr if batch > 1 else arr[0]), max(3, repeats // 2))
        gpu_part = ""
        if gpu:
            arr_g = cupy.asarray(arr)

            def cupy_expval():
                return cupy.einsum("bi,bi->b", arr_g.conj(), (S_g @ arr_g.T).T).real

            err = max(err, float(np.abs(ours.numpy() - cupy.asnumpy(cupy_expval())).max()))
            t_g = median_time(cupy_expval, repeats, device)
            gpu_part = f" | cupyx CSR (GPU) {t_g * 1e3:8.3f} ms ({t_g / t_q:5.2f}x)"
        rows.append((batch, t_q, t_p, t_s, err))
        print(f"  batch {batch:3d}: qdiff ({device}) {t_q * 1e3:8.3f} ms | PennyLane default.qubit "
              f"{t_p * 1e3:9.2f} ms ({t_p / t_q:6.1f}x) | scipy CSR {t_s * 1e3:8.2f} ms "
              f"({t_s / t_q:5.2f}x){gpu_part} | max |diff| {err:.1e}")
    return rows


def tfim(n, h=0.7):
    from qdiff.operators import PauliSumOperator
    words = [{i: "Z", (i + 1) % n: "Z"} for i in range(n)] + [{i: "X"} for i in range(n)]
    return PauliSumOperator(words, [-1.0] * n + [-h] * n, n)


def bench_ground_state(sizes, device="cpu", cpu_peer_max=None, repeats=1):
    import scipy.sparse.linalg as sla
    from qdiff.solvers import lanczos
    gpu = _cupyx(device)
    rows = []
    for n in sizes:
        op = tfim(n).to(device)
        _sync(device)
        t = time.perf_counter()
        op.diagonals()
        _sync(device)
        build_q = time.perf_counter() - t
        v0 = np.random.default_rng(0).normal(size=2 ** n)
        v0_d = torch.from_numpy(v0).to(device)
        (e_q, _, info), t_q = time_solve(lambda: lanczos(op, 1, v0=v0_d, tol=1e-9), repeats, device)
        e_q = float(e_q[0])
        line = (f"  TFIM n={n}: qdiff lanczos ({device}) {t_q:7.3f} s ({info.matvecs} matvecs, "
                f"diag build {build_q:.2f} s)")
        t_s = diff = build_s = None
        if gpu or cpu_peer_max is None or n <= cpu_peer_max:
            t = time.perf_counter()
            S = op.to("cpu").to_scipy(tol=1e-14)
            build_s = time.perf_counter() - t
            line += f" | CSR build {build_s:.2f} s, nnz {S.nnz}"
        if cpu_peer_max is None or n <= cpu_peer_max:
            e_s, t_s = time_solve(lambda: sla.eigsh(S, k=1, which="SA", v0=v0.copy(), tol=1e-12,
                                                    return_eigenvectors=False)[0], repeats)
            diff = abs(e_q - e_s)
            line += f" | scipy eigsh {t_s:7.3f} s (scipy/qdiff {t_s / t_q:6.2f}) |dE| {diff:.1e}"
        if gpu:
            cupy, csp, csla = gpu
            S_g = csp.csr_matrix(S)
            v0_g = cupy.asarray(v0)
            del S
            e_g, t_g = time_solve(lambda: float(csla.eigsh(
                S_g, k=1, which="SA", v0=v0_g.copy(), tol=1e-12, return_eigenvectors=False)[0]),
                repeats, device)
            line += (f" | cupyx eigsh (GPU) {t_g:7.3f} s (cupyx/qdiff {t_g / t_q:6.2f}) "
                     f"|dE| {abs(e_q - e_g):.1e}")
            del S_g
            cupy.get_default_memory_pool().free_all_blocks()
        rows.append((n, t_q, t_s, diff, info.matvecs, build_q, build_s))
        print(line)
    return rows


def main():
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[16, 18, 20])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", default="cpu", help="torch device of qdiff's side (cpu, cuda)")
    ap.add_argument("--cpu-peer-max", type=int, default=None,
                    help="largest n for scipy's eigsh (default: every size)")
    ap.add_argument("--solve-repeats", type=int, default=1,
                    help="ground-state solves timed per size (> 1: median after a warm-up solve)")
    args = ap.parse_args()
    try:
        kind = torch.device(args.device).type
    except RuntimeError:
        ap.error(f"--device {args.device}: not a torch device (cpu, cuda, cuda:N)")
    if kind == "cuda" and not torch.cuda.is_available():
        sys.exit(f"bench_kernels.py: --device {args.device}: no CUDA device here")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, qdiff on {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") else ""))
    print("[1] Pauli-sum expectation")
    bench_expval(args.repeats, args.device)
    print("[2] ground state of a periodic TFIM chain (h=0.7)")
    bench_ground_state(args.sizes, args.device, args.cpu_peer_max, args.solve_repeats)


if __name__ == "__main__":
    main()
