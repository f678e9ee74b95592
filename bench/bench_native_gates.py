"""One gate at a time: qdiff's native kernels against qulacs, qsim, lightning.qubit and Aer,
RX, Rot (the general one-qubit gate) and CNOT on the low, middle and high bits, complex128 and
complex64, against the memory-bandwidth floor.

Per-gate time = (time of a circuit of ``--gates`` copies of the gate - time of an empty
circuit) / ``--gates``, for every simulator alike (CPU time, 1 thread, median of ``--reps``;
``--runs`` interleaved rounds give the median and range). Bits count from the least
significant bit of the basis index: low = bits (1, 0), middle = (n/2, n/2 - 1), high = (n-1,
n-2) for CNOT (control, target) and the second of them for one-qubit gates. The floor is
2 * (bytes of the state) / copy bandwidth measured in the same run. qsim fuses runs of gates
into larger matrices before simulating (its figures include that), and its Python front end
translates the circuit on every call, which the empty circuit does not fully remove at small n.

``--one-pass``: the cost of ONE pass of one gate for everyone: circuits of a single gate
(``--gates`` is ignored), qsim with ``max_fused_gate_size=1`` and Aer with
``fusion_enable=False`` (qdiff runs a single gate in place, one pass, whatever its settings).
Without it, ``--gates`` copies measure what each simulator makes of a run of equal gates
(qsim and Aer fuse them, qdiff shares memory passes in cache tiles).

    OMP_NUM_THREADS=1 python bench/bench_native_gates.py [--sizes 16 20 22] [--runs 3] [--one-pass]
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import warnings

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from native_peers import MAKERS, available, copy_bandwidth, cpu_time  # noqa: E402

warnings.filterwarnings("ignore")
DTYPES = {"c128": torch.complex128, "c64": torch.complex64}
GATES = {"rx": (0.37,), "rot": (0.3, 1.1, -0.7), "cx": ()}


def placements(n):
    return {"low": (1, 0), "mid": (n // 2, n // 2 - 1), "high": (n - 1, n - 2)}


def ops_for(gate, bits, count):
    if gate == "cx":
        return [("cx", bits, ())] * count
    return [(gate, (bits[1],), GATES[gate])] * count


def make(name, n, ops, cdtype, fuse):
    if not fuse and name in ("qsim", "aer"):
        return MAKERS[name](n, ops, cdtype, fuse=False)
    return MAKERS[name](n, ops, cdtype)


def one_round(n, sims, count, reps, out, fuse=True):
    for dt, cdtype in DTYPES.items():
        for name in sims[dt]:
            empty = cpu_time(make(name, n, [], cdtype, fuse), reps)
            for gate in GATES:
                for where, bits in placements(n).items():
                    t = cpu_time(make(name, n, ops_for(gate, bits, count), cdtype, fuse), reps)
                    out.setdefault((n, dt, gate, where, name), []).append(
                        max(t - empty, 0.0) / count)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 20, 22])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gates", type=int, default=20)
    ap.add_argument("--one-pass", action="store_true",
                    help="one gate per circuit, peers' fusion off: the cost of one pass")
    args = ap.parse_args()
    count = 1 if args.one_pass else args.gates
    torch.set_num_threads(1)
    sims = {dt: ["qdiff"] + [p for p in ("qulacs", "qsim", "lightning", "aer")
                             if available(p, cd)] for dt, cd in DTYPES.items()}
    bw = copy_bandwidth()
    print(f"{datetime.date.today()}  torch {torch.__version__}, 1 thread; copy bandwidth "
          f"{bw / 1e9:.1f} GB/s; simulators: {sims}; "
          + ("one pass (one gate per circuit, fusion off)" if args.one_pass
             else f"{count} copies per circuit, fusion on"))
    out = {}
    for r in range(args.runs):
        for n in args.sizes:
            one_round(n, sims, count, args.reps, out, fuse=not args.one_pass)
        print(f"round {r + 1}/{args.runs} done", file=sys.stderr, flush=True)
    for dt in DTYPES:
        peers = [s for s in sims[dt] if s != "qdiff"]
        print(f"\n{dt}: microseconds per gate, median [range]; ratios qdiff/floor and "
              "qdiff/fastest peer (< 1: qdiff faster)")
        print("| n | gate | bits | floor | qdiff | " + " | ".join(peers)
              + " | qdiff/floor | qdiff/fastest peer |")
        print("|---" * (6 + len(peers) + 1) + "|")
        for n in args.sizes:
            floor = 2 * (2 ** n) * (16 if dt == "c128" else 8) / bw
            for gate in GATES:
                for where in placements(n):
                    q = out[(n, dt, gate, where, "qdiff")]
                    ts = {p: out[(n, dt, gate, where, p)] for p in peers}
                    best = [min(vals) for vals in zip(*ts.values())] if ts else q
                    cell = lambda v: (f"{statistics.median(v) * 1e6:.3g} "  # noqa: E731
                                      f"[{min(v) * 1e6:.3g}-{max(v) * 1e6:.3g}]")
                    rb = [a / b if b > 0 else float("inf") for a, b in zip(q, best)]
                    print(f"| {n} | {gate} | {where} | {floor * 1e6:.3g} | {cell(q)} | "
                          + " | ".join(cell(ts[p]) for p in peers)
                          + f" | {statistics.median(q) / floor:.2f} | "
                          f"{statistics.median(rb):.2f} [{min(rb):.2f}-{max(rb):.2f}] |")


if __name__ == "__main__":
    main()
