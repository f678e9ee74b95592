"""Peak memory of one gradient at 20 qubits: adjoint (a few states whatever the depth) vs backprop.

Each measurement runs in a fresh subprocess (with glibc's mmap threshold fixed at 1 MiB, so freed
large buffers leave the resident set) and reads the peak resident set size (``ru_maxrss``)
before and after the gradient; the figure reported is the increase, in units of one 2**n
complex128 state.

    python bench/bench_adjoint_memory.py [--n 20] [--layers 1,3,6] [--methods adjoint,backprop]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, resource, sys, torch
import qdiff as qd
n, layers, method = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(1)
dev = qd.device("statevector", wires=n)
@qd.qnode(dev, diff_method=method)
def f(w):
    qd.StronglyEntanglingLayers(w, wires=range(n))
    return qd.expval(qd.Z(0))
w = torch.rand(layers, n, 3, dtype=torch.float64, requires_grad=True)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
g = torch.autograd.grad(f(w), w)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"base_kb": base, "peak_kb": peak}))
"""


def measure(n, layers, method):
    # glibc would otherwise keep freed 16 MiB buffers in its heap (RSS stays high after free);
    # a fixed mmap threshold returns every large buffer to the OS, so RSS tracks live memory.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="1048576")
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(layers), method],
                         capture_output=True, text=True, check=True, env=env)
    d = json.loads(out.stdout.strip().splitlines()[-1])
    state_kb = (2 ** n) * 16 / 1024
    return (d["peak_kb"] - d["base_kb"]) / state_kb


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--layers", default="1,3,6")
    ap.add_argument("--methods", default="adjoint,backprop")
    args = ap.parse_args(argv)
    print(f"n={args.n}: peak memory increase during one gradient, in statevectors of "
          f"{(2 ** args.n) * 16 / 2**20:.0f} MiB")
    print(f"{'method':>10} {'layers':>6} {'gates':>6} {'states':>8}")
    for method in args.methods.split(","):
        for layers in [int(s) for s in args.layers.split(",")]:
            states = measure(args.n, layers, method)
            print(f"{method:>10} {layers:>6} {2 * layers * args.n:>6} {states:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
