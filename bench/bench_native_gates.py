"""One gate at a time: qdiff's native kernels against qulacs, qsim, lightning.qubit and Aer,
RX, Rot (the general one-qubit gate) and CNOT on the low, middle and high bits, complex128 and
complex64, against the memory-bandwidth floor; ``--kinds`` picks other gates (RZ, H, CZ, SWAP,
IsingXX, IsingZZ, SingleExcitation).

Bits count from the least significant bit of the basis index: low = bits (1, 0), middle =
(n/2, n/2 - 1), high = (n-1, n-2) for two-bit gates (CNOT: control, target) and the second
of them for one-qubit gates; ``--placements`` adds apart = (n/2, 1) and gap = (n/2, 3), two-bit
placements with one bit among or just above the lowest three. The floor is 2 * (bytes of
the state) / copy bandwidth measured in the same run. CPU time, 1 thread, median of
``--reps`` calls; ``--runs`` interleaved rounds give the median and range (in a round, each
row's simulators run back to back).

``--mode per-gate`` (default): the cost of ONE memory pass of one gate, measured over K copies
so that the gates, not the peers' fixed cost per call (cirq translation, qnode, Aer's result
object: 0.1-5 ms, jittering by as much), dominate the time. Per gate = (t_K - t_empty) / K.
K = ``--gates``, or by default about 2^24 amplitudes of work per circuit (256 copies at
n = 16, 16 at n = 20, 8 at n = 22).

- qdiff runs ONE native program of K copies gate by gate (``QDIFF_NATIVE_TILES=0``: no cache
  tiles, no two-wire fusion, no chunked runs, so every copy is its own memory pass over the
  state, exactly like qulacs and Aer below); t_empty is the empty program. The cost of a call
  (Python, argument checks) is therefore spread over the K gates as it is for qulacs and Aer;
  the setup of a one-gate program beyond an empty one (records decoded and checked, the coded
  matrix evaluated) is printed separately, measured at n = 4;
- lightning.qubit: its state-vector kernels called directly, one binding call per gate
  (``StateVectorC128/C64.RX/Rot/CNOT``: no qnode or tape, which add Python work per op);
  t_empty is K calls of its Identity kernel;
- qulacs: one ``QuantumCircuit`` of K gates (it applies them one by one: no fusion unless a
  circuit optimiser is called), Rot as one U3 gate, IsingXX/ZZ as its Pauli-rotation gate,
  SingleExcitation as its dense two-qubit gate;
- Aer: one circuit of K gates with ``fusion_enable=False``, Rot as one U gate,
  SingleExcitation as its dense two-qubit ``unitary``;
- qsim: fuses gates on the same qubits whatever ``max_fused_gate_size`` (measured: 16 copies
  cost about 1/16 of one), so its figure is its ONE-gate circuit with
  ``max_fused_gate_size=1`` minus the empty circuit (3x ``--reps`` calls), marked ``(1)``:
  at n <= 20 its fixed cost per call still blurs that figure.

``--mode fused``: one circuit of K copies per simulator with every simulator's own
optimisations on (qsim and Aer fuse the copies into one matrix, qdiff runs them as one program
and shares memory passes in cache tiles or chunks; lightning through its qnode): what each
makes of a run of equal gates, not the cost of a gate.

    OMP_NUM_THREADS=1 python bench/bench_native_gates.py [--sizes 16 20 22] [--runs 3]
        [--mode per-gate|fused] [--gates K] [--kinds rx rot cx] [--placements low mid high]
"""
from __future__ import annotations

import datetime
import os
import statistics
import sys
import warnings

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from benchutil import ArgumentParser  # noqa: E402
from native_peers import KERNEL_MAKERS, MAKERS, PEERS, copy_bandwidth, cpu_time, pick_peers  # noqa: E402

warnings.filterwarnings("ignore")
DTYPES = {"c128": torch.complex128, "c64": torch.complex64}
GATES = {"rx": (0.37,), "rot": (0.3, 1.1, -0.7), "cx": (), "rz": (0.37,), "h": (), "cz": (),
         "swap": (), "isingxx": (0.37,), "isingzz": (0.37,), "single_excitation": (0.37,)}
TWO_BIT = ("cx", "cz", "swap", "isingxx", "isingzz", "single_excitation")


PLACES = ("low", "mid", "high", "apart", "gap")


def placements(n, names=("low", "mid", "high")):
    """Bits of each named placement: low (1, 0), mid (n/2, n/2 - 1), high (n-1, n-2), apart
    (n/2, 1: one bit among the lowest three, one in the middle), gap (n/2, 3)."""
    every = {"low": (1, 0), "mid": (n // 2, n // 2 - 1), "high": (n - 1, n - 2),
             "apart": (n // 2, 1), "gap": (n // 2, 3)}
    return {k: every[k] for k in names}


def ops_for(gate, bits, count):
    if gate in TWO_BIT:
        return [(gate, bits, GATES[gate])] * count
    return [(gate, (bits[1],), GATES[gate])] * count


def copies_for(n, gates):
    return gates if gates else max(8, 1 << max(0, 24 - n))


def gate_by_gate(run):
    """``run`` with qdiff's cache tiles, fusion and chunked runs off: one pass per gate."""
    def wrapped():
        old = os.environ.get("QDIFF_NATIVE_TILES")
        os.environ["QDIFF_NATIVE_TILES"] = "0"
        try:
            run()
        finally:
            if old is None:
                del os.environ["QDIFF_NATIVE_TILES"]
            else:
                os.environ["QDIFF_NATIVE_TILES"] = old
    return wrapped


def timed_pair(name, n, gate, bits, cdtype, count, reps, mode):
    """(t_K, t_empty, copies) of one simulator for ``count`` copies of the gate."""
    ops = ops_for(gate, bits, count)
    if mode == "fused":
        return (cpu_time(MAKERS[name](n, ops, cdtype), reps),
                cpu_time(MAKERS[name](n, [], cdtype), reps), count)
    if name == "qdiff":
        return (cpu_time(gate_by_gate(MAKERS[name](n, ops, cdtype)), reps),
                cpu_time(gate_by_gate(MAKERS[name](n, [], cdtype)), reps), count)
    if name in KERNEL_MAKERS:
        return (cpu_time(KERNEL_MAKERS[name](n, ops, cdtype), reps),
                cpu_time(KERNEL_MAKERS[name](n, [("id", (0,), ())] * count, cdtype), reps),
                count)
    if name == "qsim":  # fuses copies whatever its settings: one gate
        one = ops_for(gate, bits, 1)
        return (cpu_time(MAKERS[name](n, one, cdtype, fuse=False), 3 * reps),
                cpu_time(MAKERS[name](n, [], cdtype, fuse=False), 3 * reps), 1)
    if name == "aer":
        return (cpu_time(MAKERS[name](n, ops, cdtype, fuse=False), reps),
                cpu_time(MAKERS[name](n, [], cdtype, fuse=False), reps), count)
    return (cpu_time(MAKERS[name](n, ops, cdtype), reps),
            cpu_time(MAKERS[name](n, [], cdtype), reps), count)


def one_round(n, sims, count, reps, out, mode, kinds, places):
    """Every row once: a row's simulators back to back (the machine's state then moves its
    ratios least)."""
    for dt, cdtype in DTYPES.items():
        for gate in kinds:
            for where, bits in placements(n, places).items():
                for name in sims[dt]:
                    t, empty, k = timed_pair(name, n, gate, bits, cdtype, count, reps, mode)
                    out.setdefault((n, dt, gate, where, name), []).append(
                        max(t - empty, 0.0) / k)


def main():
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 20, 22])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gates", type=int, default=0,
                    help="copies per circuit (default: about 2^24 amplitudes of work)")
    ap.add_argument("--mode", choices=("per-gate", "fused"), default="per-gate",
                    help="per-gate: one pass per gate for everyone (default); fused: a run of "
                         "copies with each simulator's own optimisations")
    ap.add_argument("--kinds", nargs="+", default=["rx", "rot", "cx"], choices=list(GATES),
                    help="gates to time (default: rx rot cx)")
    ap.add_argument("--placements", nargs="+", default=["low", "mid", "high"], choices=PLACES,
                    help="bit placements (default: low mid high; apart and gap for two-bit "
                         "gates: (n/2, 1) and (n/2, 3))")
    ap.add_argument("--sims", nargs="+", default=None, choices=("qdiff",) + PEERS,
                    help="simulators to time (default: qdiff and every available peer)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sims = pick_peers(args.sims or PEERS, DTYPES)
    bw = copy_bandwidth()
    copies = {n: copies_for(n, args.gates) for n in args.sizes}
    setup = {}  # qdiff's cost of a one-gate program beyond an empty one where the gate is ~free
    if args.mode == "per-gate":
        for dt, cdtype in DTYPES.items():
            ops = ops_for("rot", (1, 0), 256)
            t = cpu_time(MAKERS["qdiff"](4, ops, cdtype, separate=True), args.reps)
            empty = cpu_time(MAKERS["qdiff"](4, [], cdtype, calls=256), args.reps)
            setup[dt] = max(t - empty, 0.0) / 256
    print(f"{datetime.date.today()}  torch {torch.__version__}, 1 thread; copy bandwidth "
          f"{bw / 1e9:.1f} GB/s; simulators: {sims}; copies per circuit {copies}; "
          + ("per gate: qdiff one program of K gates, one pass each (QDIFF_NATIVE_TILES=0), "
             "lightning's kernels called directly, qulacs/Aer circuits of K gates without "
             "fusion, qsim (1) one gate"
             if args.mode == "per-gate" else "fused: one circuit of K copies, fusion on"))
    if setup:
        print("qdiff per-call setup of a one-gate program beyond an empty one (n = 4, Rot; not "
              "in the per-gate figures, as qulacs's and Aer's per-circuit costs are not): " + ", ".join(f"{dt} {v * 1e6:.2f} us" for dt, v in setup.items()))
    out = {}
    for r in range(args.runs):
        for n in args.sizes:
            one_round(n, sims, copies[n], args.reps, out, args.mode, args.kinds,
                      args.placements)
        print(f"round {r + 1}/{args.runs} done", file=sys.stderr, flush=True)
    for dt in DTYPES:
        peers = [s for s in sims[dt] if s != "qdiff"]
        heads = [p + (" (1)" if p == "qsim" and args.mode == "per-gate" else "") for p in peers]
        print(f"\n{dt}: microseconds per gate, median [range]; ratios qdiff/floor and "
              "qdiff/fastest peer (< 1: qdiff faster; per round)")
        print("| n | gate | bits | floor | qdiff | " + "".join(h + " | " for h in heads)
              + "qdiff/floor | qdiff/fastest peer |")
        print("|---" * (6 + len(peers) + 1) + "|")
        for n in args.sizes:
            floor = 2 * (2 ** n) * (16 if dt == "c128" else 8) / bw
            for gate in args.kinds:
                for where in placements(n, args.placements):
                    q = out[(n, dt, gate, where, "qdiff")]
                    ts = {p: out[(n, dt, gate, where, p)] for p in peers}
                    cell = lambda v: (f"{statistics.median(v) * 1e6:.3g} "  # noqa: E731
                                      f"[{min(v) * 1e6:.3g}-{max(v) * 1e6:.3g}]")
                    if ts:
                        best = [min(vals) for vals in zip(*ts.values())]
                        rb = [a / b if b > 0 else float("inf") for a, b in zip(q, best)]
                        vs = f"{statistics.median(rb):.2f} [{min(rb):.2f}-{max(rb):.2f}]"
                    else:
                        vs = "no peer"
                    print(f"| {n} | {gate} | {where} | {floor * 1e6:.3g} | {cell(q)} | "
                          + "".join(cell(ts[p]) + " | " for p in peers)
                          + f"{statistics.median(q) / floor:.2f} | {vs} |")


if __name__ == "__main__":
    main()
