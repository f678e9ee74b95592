"""Peak memory of one run at 20 qubits: a forward pass, or one gradient by adjoint (a few states
whatever the depth) or backprop, of StronglyEntanglingLayers with expval Z(0) or of a 40-term
Pauli sum of X, Y and Z words (``--observable pauli40``).

Each measurement runs in a fresh subprocess (with glibc's mmap threshold fixed at 1 MiB, so freed
large buffers leave the resident set) and reads the peak resident set size (``ru_maxrss``)
before and after the run; the figure reported is the increase, in units of one 2**n
complex128 state.

    python bench/bench_adjoint_memory.py [--n 20] [--layers 1,3,6]
        [--methods forward,adjoint,backprop] [--observable z|pauli40]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import ArgumentParser  # noqa: E402

CHILD = r"""
import json, resource, sys, torch
import qdiff as qd
n_run, layers, method, observable = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
torch.set_num_threads(1)


def observable_on(n):
    if observable != "pauli40":
        return qd.Z(0)
    g = torch.Generator().manual_seed(0)  # 40 words of 1-3 X/Y/Z factors on spread wires
    terms = []
    for t in range(40):
        wires = torch.randperm(n, generator=g)[: 1 + t % 3].tolist()
        letters = [("X", "Y", "Z")[int(i)] for i in torch.randint(0, 3, (len(wires),), generator=g)]
        word = None
        for w_, l in zip(wires, letters):
            f_ = {"X": qd.X, "Y": qd.Y, "Z": qd.Z}[l](w_)
            word = f_ if word is None else word @ f_
        terms.append(word)
    return qd.Hamiltonian(torch.linspace(-1, 1, 40, dtype=torch.float64), terms)


def run(n):
    H = observable_on(n)

    @qd.qnode(qd.device("statevector", wires=n),
              diff_method="best" if method == "forward" else method)
    def f(w):
        qd.StronglyEntanglingLayers(w, wires=range(n))
        return qd.expval(H)

    w = torch.rand(layers, n, 3, dtype=torch.float64, requires_grad=method != "forward")
    if method == "forward":
        with torch.no_grad():
            f(w)
    else:
        torch.autograd.grad(f(w), w)


# one-time library set-up (kernel cache, BLAS, thread pools) is not the run's memory; the
# warm-up's own states (at most 2**-6 of the run's) stay below the run's peak
run(min(10, n_run - 6))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
run(n_run)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"base_kb": base, "peak_kb": peak}))
"""


def measure(n, layers, method, observable="z"):
    # glibc would otherwise keep freed 16 MiB buffers in its heap (RSS stays high after free);
    # a fixed mmap threshold returns every large buffer to the OS, so RSS tracks live memory.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="1048576")
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(layers), method, observable],
                         capture_output=True, text=True, env=env)
    if out.returncode:
        last = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        raise RuntimeError(last)
    d = json.loads(out.stdout.strip().splitlines()[-1])
    state_kb = (2 ** n) * 16 / 1024
    return (d["peak_kb"] - d["base_kb"]) / state_kb


def main(argv=None):
    ap = ArgumentParser()
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--layers", default="1,3,6")
    ap.add_argument("--methods", default="adjoint,backprop")
    ap.add_argument("--observable", choices=["z", "pauli40"], default="z")
    args = ap.parse_args(argv)
    if args.n < 8:
        ap.error(f"--n {args.n}: at least 8 (a smaller state is below what ru_maxrss resolves)")
    print(f"n={args.n}, observable {args.observable}: peak memory increase during one run, in "
          f"statevectors of {(2 ** args.n) * 16 / 2**20:.3g} MiB")
    print(f"{'method':>10} {'layers':>6} {'gates':>6} {'states':>8}")
    for method in args.methods.split(","):
        for layers in [int(s) for s in args.layers.split(",")]:
            try:
                states = f"{measure(args.n, layers, method, args.observable):>8.1f}"
            except RuntimeError as exc:
                states = f"   failed: {exc}"
            print(f"{method:>10} {layers:>6} {2 * layers * args.n:>6} {states}", flush=True)


if __name__ == "__main__":
    main()
