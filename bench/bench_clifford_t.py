"""Clifford+T compilation of the Nam circuits: T count, CX, gates and depth per level.

    python bench/bench_clifford_t.py [--dir ../shared/benchmarks/qasm]
                                     [--basis h,s,sdg,t,tdg,cx,x,z] [--levels 1 2 3]
                                     [--json results.json] [--timeout 900]
    python bench/bench_clifford_t.py --json results.json --table   # table from saved results

Every ``nam_*`` circuit is compiled into the Clifford+T basis at each level; the input columns
are the circuit rebased into the basis (level 0). Each output's process infidelity against the
input is measured (full unitary up to 12 qubits, random states above). Each circuit runs in its
own interpreter under ``--timeout`` seconds (all levels together); with ``--json`` every
finished circuit is saved at once and circuits already saved are skipped (resume). Times are
CPU seconds (the machine is shared); wall seconds are saved too.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DIR = os.path.join(HERE, "..", "..", "shared", "benchmarks", "qasm")
sys.path.insert(0, HERE)
from benchutil import ArgumentParser, circuit_files  # noqa: E402


WARM_UP = 'OPENQASM 2.0; include "qelib1.inc"; qreg q[3]; h q[0]; cx q[0],q[1]; t q[1]; cx q[1],q[2];'


def worker(path, basis, levels) -> None:
    import qdiff as qd
    qd.compile(WARM_UP, level=3, basis=basis)  # the compiler's one-time imports, not timed
    for lv in levels:
        c = time.process_time()
        _, rep = qd.compile(path, level=lv, basis=basis)
        if lv == levels[0]:
            print(json.dumps({"level": "in", "n": rep.num_qubits, "t": rep.t_before,
                              "cx": rep.cx_before, "gates": rep.gates_before,
                              "depth": rep.depth_before}), flush=True)
        print(json.dumps({"level": lv, "t": rep.t_after, "cx": rep.cx_after,
                          "gates": rep.gates_after, "depth": rep.depth_after, "s": rep.seconds,
                          "cpu": time.process_time() - c, "inf": rep.infidelity,
                          "ok": bool(rep.verified)}), flush=True)


def run_circuit(path, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", path, "--basis", args.basis,
           "--levels"] + [str(lv) for lv in args.levels]
    row = {"name": os.path.basename(path)[:-5]}
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True)
        try:
            _, err = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            row["timeout"] = args.timeout
        out.seek(0)
        for line in out:
            if line.startswith("{"):
                d = json.loads(line)
                row[str(d.pop("level"))] = d
    if proc.returncode and "timeout" not in row:
        row["error"] = (err or "").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
    return row


def table(rows, levels) -> str:
    head = ["circuit", "n", "input T", "CX", "gates", "depth"]
    for lv in levels:
        head += [f"-O{lv} T", "CX", "gates", "depth", "CPU s", "1-F"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = ["in"] + [str(lv) for lv in levels]
    full = [r for r in rows if all(r.get(k) for k in keys)]
    for r in rows:
        i = r.get("in") or {}
        cells = [r["name"], i.get("n", "-")] + [i.get(k, "-") for k in ("t", "cx", "gates",
                                                                        "depth")]
        for lv in levels:
            d = r.get(str(lv))
            if d is None:
                cells += ["timeout" if "timeout" in r else "-"] + [""] * 5
                continue
            cells += [d["t"], d["cx"], d["gates"], d["depth"], f"{d['cpu']:.1f}",
                      f"{d['inf']:.0e}" + ("" if d["ok"] else " NOT VERIFIED")]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    cells = ["**total**", f"{len(full)}/{len(rows)} complete"]
    for k in keys:
        cells += [sum(r[k][f] for r in full) for f in ("t", "cx", "gates", "depth")]
        if k != "in":
            cells += [f"{sum(r[k]['cpu'] for r in full):.1f}", ""]
    lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    worse = [f"{r['name']} -O{lv}" for r in full for lv in levels
             if any(r[str(lv)][f] > r["in"][f] for f in ("cx", "gates", "depth", "t"))]
    lines.append("")
    lines.append(f"outputs with more T, CX, gates or depth than the input: {worse or 'none'}; "
                 f"unverified: {[r['name'] for r in full for lv in levels if not r[str(lv)]['ok']] or 'none'}")
    return "\n".join(lines)


def done(row, levels, saved) -> bool:
    """Whether a saved row answers a run at ``levels``: it holds every one of them, or it was
    stopped (time-out, error) in a run of at least those levels (``saved``: the levels of the
    run that wrote rows without their own record of them)."""
    if "timeout" in row or "error" in row:
        return set(levels) <= set(row.get("levels", saved))
    return all(str(lv) in row for lv in levels)


def main(argv=None) -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=DEFAULT_DIR)
    ap.add_argument("--basis", default="h,s,sdg,t,tdg,cx,x,z")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--json", default=None)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.basis, args.levels)
        return 0
    data = {"meta": {}, "rows": []}
    if args.json and os.path.exists(args.json):
        with open(args.json) as f:
            data = json.load(f)
    files = sorted(circuit_files(ap, args.dir, args.only, "nam_*.qasm"), key=os.path.getsize)
    if not args.table:
        saved = data["meta"].get("levels", [])
        if data["rows"] and data["meta"].get("basis", args.basis) != args.basis:
            ap.error(f"--json {args.json} holds results for basis {data['meta']['basis']}, "
                     f"not {args.basis}: give another file")
        data["meta"].update(basis=args.basis, levels=args.levels, timeout=args.timeout)
        for f in files:
            name = os.path.basename(f)[:-5]
            if any(r["name"] == name and done(r, args.levels, saved) for r in data["rows"]):
                continue
            load0 = os.getloadavg()[0]
            r = run_circuit(f, args)
            r["levels"] = list(args.levels)
            r["load"] = round((load0 + os.getloadavg()[0]) / 2, 1)
            r["date"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
            data["rows"] = [x for x in data["rows"] if x["name"] != name] + [r]
            if args.json:
                from qdiff.circuits.fileio import write_atomic
                write_atomic(args.json, json.dumps(data, indent=1) + "\n")
            print(name, {k: (v.get("t"), v.get("cx")) for k, v in r.items()
                         if isinstance(v, dict)}, r.get("timeout", ""), r.get("error", ""),
                  flush=True)
    order = {os.path.basename(f)[:-5]: i for i, f in enumerate(files)}
    rows = sorted([r for r in data["rows"] if r["name"] in order], key=lambda r: order[r["name"]])
    print(table(rows, data["meta"].get("levels", args.levels)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
