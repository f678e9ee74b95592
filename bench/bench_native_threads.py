"""Thread scaling of the native kernels: SEL(L=6) forward (the coded program) and the adjoint
gradient of sum_i <Z_i> (forward + backward through torch), complex128 and complex64, with 1 and
T threads (``--threads``, 2 by default; ``torch.set_num_threads``, which the kernels follow),
wall time.

Each round measures every configuration with 1 and then T threads back to back (median of
``--reps``); the speed-up is the same-round ratio, reported as the median and range over
``--runs`` rounds. Beside it, measures that another process's load does not distort as much:
the CPU efficiency at T threads (process CPU time / (wall time x T): 1.0 when every thread
computes all the time, lower when one waits at a barrier or for a core) and the work ratio
(CPU time with T threads / with 1: above 1.0 is work the split adds, spinning included);
T x work ratio^-1 x efficiency is the speed-up T free cores would give. On a machine shared
with other work, T threads only help when T cores are free: the load average at the start and
end is printed. The kernels share torch's GNU
OpenMP runtime, whose threads spin at barriers: on a busy machine run with a short spin
(``GOMP_SPINCOUNT=10000``, read when torch starts), as the command below does.

    GOMP_SPINCOUNT=10000 python bench/bench_native_threads.py [--sizes 18 20 22] [--runs 3]
        [--threads 2]
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from native_peers import make_qdiff, sel_ops  # noqa: E402
from bench_native_sel import grad_qdiff  # noqa: E402

warnings.filterwarnings("ignore")
DTYPES = {"c128": torch.complex128, "c64": torch.complex64}


def times(fn, reps):
    """Medians of (wall, process CPU) time of ``fn()`` over ``reps`` calls after a warm-up."""
    fn()
    walls, cpus = [], []
    for _ in range(reps):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus)


def one_round(n, reps, threads, out):
    for dt, cdtype in DTYPES.items():
        fwd = make_qdiff(n, sel_ops(n, 6), cdtype)
        grad = grad_qdiff(n, 6, cdtype)
        for what, fn in (("forward", fwd), ("adjoint", grad)):
            ts = []
            for t in (1, threads):
                torch.set_num_threads(t)
                ts.append(times(fn, reps))
            out.setdefault((n, dt, what), []).append(ts)
    torch.set_num_threads(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[18, 20, 22])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="threads compared with one")
    args = ap.parse_args()
    if not 2 <= args.threads <= (os.cpu_count() or 1):
        raise SystemExit(f"bench_native_threads.py: --threads {args.threads} is not between 2 "
                         f"and the {os.cpu_count()} cores")
    t = args.threads
    print(f"{datetime.date.today()}  torch {torch.__version__}; GOMP_SPINCOUNT="
          f"{os.environ.get('GOMP_SPINCOUNT', 'unset')}; load average at start "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    out = {}
    for r in range(args.runs):
        for n in args.sizes:
            one_round(n, args.reps, t, out)
        print(f"round {r + 1}/{args.runs} done", file=sys.stderr, flush=True)
    print(f"load average at end {os.getloadavg()[0]:.1f}\n")
    print(f"| n | dtype | run | 1 thread (ms) | {t} threads (ms) | speed-up, median [range] | "
          f"CPU efficiency at {t} | work ratio {t}/1 |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.sizes:
        for dt in DTYPES:
            for what in ("forward", "adjoint"):
                rows = out[(n, dt, what)]
                sp = [a[0] / b[0] for a, b in rows]
                eff = [b[1] / (t * b[0]) for a, b in rows]
                work = [b[1] / a[1] for a, b in rows]
                print(f"| {n} | {dt} | {what} | "
                      f"{statistics.median(r[0][0] for r in rows) * 1e3:.4g} | "
                      f"{statistics.median(r[1][0] for r in rows) * 1e3:.4g} | "
                      f"{statistics.median(sp):.2f} [{min(sp):.2f}-{max(sp):.2f}] | "
                      f"{statistics.median(eff):.2f} [{min(eff):.2f}-{max(eff):.2f}] | "
                      f"{statistics.median(work):.2f} [{min(work):.2f}-{max(work):.2f}] |")


if __name__ == "__main__":
    main()
