"""Thread scaling of the native kernels: SEL(L=6) forward (the coded program) and the adjoint
gradient of sum_i <Z_i> (forward + backward through torch; through a plain qnode, and through one
with ``static=True``, which records the circuit once and replays only the angles, as a training
loop would), complex128 and complex64, with 1 and T threads (``--threads``, 2 by default;
``torch.set_num_threads``, which the kernels follow), wall time.

Each round measures every configuration with 1 and then T threads back to back (median of
``--reps``); the speed-up is the same-round ratio, reported as the median and range over
``--runs`` rounds. Beside it, measures that another process's load does not distort as much:
the CPU efficiency at T threads (process CPU time / (wall time x T): 1.0 when every thread
computes all the time, lower when one waits at a barrier or for a core) and the work ratio
(CPU time with T threads / with 1: above 1.0 is work the split adds, spinning included);
T x work ratio^-1 x efficiency is the speed-up T free cores would give. On a machine shared
with other work, T threads only help when T cores are free: the load average at the start and
end is printed. Two cores of one die hand a cache line to each other in about 100 ns, two
cores of different dies in 3-4x that, and a state split over threads pays that for every line
one thread writes and another reads next (a pass on the top bit moves a quarter of the state
each way between the threads' shares): the round trip between the first two CPUs
(``bench/handoff.py``) is measured before and after each size's block of every round, and the
speed-ups are also given apart for the blocks where both were near (one die) and where both
were far. The kernels share torch's GNU OpenMP runtime, whose threads spin at barriers: on a
busy machine run with a short spin (``GOMP_SPINCOUNT=10000``, read when torch starts), as the
command below does.

    GOMP_SPINCOUNT=10000 python bench/bench_native_threads.py [--sizes 18 20 22] [--runs 3]
        [--threads 2]
"""
from __future__ import annotations

import datetime
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from benchutil import ArgumentParser  # noqa: E402
from native_peers import make_qdiff, sel_ops  # noqa: E402
from bench_native_sel import grad_qdiff  # noqa: E402
from handoff import round_trip_ns  # noqa: E402

warnings.filterwarnings("ignore")
DTYPES = {"c128": torch.complex128, "c64": torch.complex64}
NEAR_NS = 200  # a round trip at or below: the two cores share a last-level cache
WHAT = ("forward", "adjoint", "static adjoint")


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
        grad_static = grad_qdiff(n, 6, cdtype, static=True)
        for what, fn in (("forward", fwd), ("adjoint", grad), ("static adjoint", grad_static)):
            ts = []
            for t in (1, threads):
                torch.set_num_threads(t)
                ts.append(times(fn, reps))
            out.setdefault((n, dt, what), []).append(ts)
    torch.set_num_threads(1)


def main():
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[18, 20, 22])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="threads compared with one")
    args = ap.parse_args()
    if not 2 <= args.threads <= (os.cpu_count() or 1):
        ap.error(f"--threads {args.threads} is not between 2 and the {os.cpu_count()} cores")
    t = args.threads
    print(f"{datetime.date.today()}  torch {torch.__version__}; GOMP_SPINCOUNT="
          f"{os.environ.get('GOMP_SPINCOUNT', 'unset')}; load average at start "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    out = {}
    place = {}  # (n, round) -> core-to-core round trips before and after (ns)
    for r in range(args.runs):
        for n in args.sizes:
            before = round_trip_ns()
            one_round(n, args.reps, t, out)
            place[(n, r)] = (before, round_trip_ns())
        print(f"round {r + 1}/{args.runs} done", file=sys.stderr, flush=True)
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    trips = [x for v in place.values() for x in v if x is not None]
    if trips:
        cpus = sorted(os.sched_getaffinity(0))[:2]
        print(f"core-to-core round trip (bench/handoff.py, CPUs {cpus}) around each size's "
              f"block: {min(trips):.0f}-{max(trips):.0f} ns")
    print()
    print(f"| n | dtype | run | 1 thread (ms) | {t} threads (ms) | speed-up, median [range] | "
          f"CPU efficiency at {t} | work ratio {t}/1 |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.sizes:
        for dt in DTYPES:
            for what in WHAT:
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
    by_place = {}
    for (n, r), trip in place.items():
        if None not in trip:
            label = "near" if max(trip) <= NEAR_NS else "far" if min(trip) > NEAR_NS else None
            if label:
                by_place.setdefault(label, []).append((n, r))
    if not by_place:
        return
    print(f"\nSpeed-up at {t} threads by where the first two cores were (round trip before and "
          f"after the block: near <= {NEAR_NS} ns both times, far > {NEAR_NS} ns both times; "
          f"blocks where it changed left out): median [range] (blocks)")
    labels = [x for x in ("near", "far") if x in by_place]
    print("| n | dtype | run | " + " | ".join(labels) + " |")
    print("|---|---|---|" + "---|" * len(labels))
    for n in args.sizes:
        for dt in DTYPES:
            for what in WHAT:
                rows = out[(n, dt, what)]
                cells = []
                for label in labels:
                    sp = [rows[r][0][0] / rows[r][1][0] for m, r in by_place[label] if m == n]
                    cells.append(f"{statistics.median(sp):.2f} [{min(sp):.2f}-{max(sp):.2f}] "
                                 f"({len(sp)})" if sp else "-")
                print(f"| {n} | {dt} | {what} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
