"""Side-by-side compiler benchmark: input vs Qiskit O3 vs pytket FullPeepholeOptimise vs qdiff
(exact) vs qdiff ``--approx EPS``, per circuit and in total.

    python bench/bench_compile.py [--dir ../shared/benchmarks/qasm] [--level 3]
                                  [--approx 1e-6] [--no-pytket] [--json results.json]
                                  [--timeout 1200] [--only NAME ...] [--markdown out.md]
    python bench/bench_compile.py --json results.json --table     # table from saved results

For every circuit (final measurements and barriers stripped, as the benchmark's README says)
it reports two-qubit gate count, depth and time of each tool (CPU seconds in the table, as the
machine is shared; wall seconds are saved too), and each output's measured
process infidelity against the input (qdiff's checker: full unitary up to 12 qubits, random
states above). Each circuit runs in its own interpreter under a wall-clock limit
(``--cpu-limit`` CPU seconds and ``--timeout`` wall seconds for all its tools together; a
tool that did not finish is reported as such); with ``--json`` every finished circuit is saved at once and circuits already in the file
are skipped, so an interrupted run resumes where it stopped (an interrupted circuit leaves a
``NAME.running`` marker beside the file; delete it to run that circuit again). Circuits run
smallest first; a second shard with ``--reverse`` on the same file runs largest first.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DIR = os.path.join(HERE, "..", "..", "shared", "benchmarks", "qasm")
sys.path.insert(0, HERE)
from benchutil import ArgumentParser, circuit_files  # noqa: E402

TOOLS = ("in", "qk", "tk", "qd", "ax")  # input, Qiskit O3, pytket FPO, qdiff exact, qdiff approx


def load(path):
    import qiskit.qasm2 as q2
    qc = q2.load(path, custom_instructions=q2.LEGACY_CUSTOM_INSTRUCTIONS)
    qc.remove_final_measurements()
    return _strip_barriers(qc)


def _strip_barriers(qc):
    out = qc.copy_empty_like()
    for inst in qc.data:
        if inst.operation.name != "barrier":
            out.append(inst)
    return out


def two_q(qc) -> int:
    return sum(1 for inst in qc.data if inst.operation.num_qubits == 2)


def run_qiskit(qc):
    from qiskit import transpile
    t, c = time.perf_counter(), time.process_time()
    out = transpile(qc, basis_gates=["cx", "u"], optimization_level=3, seed_transpiler=0)
    return out, time.perf_counter() - t, time.process_time() - c


def run_pytket(qc):
    """FullPeepholeOptimise (default options); implicit wire swaps made explicit for checking."""
    import qiskit.qasm2 as q2
    from qiskit import transpile
    from pytket.passes import AutoRebase, FullPeepholeOptimise
    from pytket.circuit import OpType
    from pytket.qasm import circuit_from_qasm_str, circuit_to_qasm_str
    from qiskit import QuantumCircuit
    flat = QuantumCircuit(qc.num_qubits)  # one register: pytket would sort several by name
    flat.compose(qc, qubits=range(qc.num_qubits), inplace=True)
    src = q2.dumps(transpile(flat, basis_gates=["cx", "u3"], optimization_level=0))
    circ = circuit_from_qasm_str(src)
    t, c = time.perf_counter(), time.process_time()
    FullPeepholeOptimise().apply(circ)
    dt, dc = time.perf_counter() - t, time.process_time() - c
    cx, dep = circ.n_gates_of_type(OpType.CX), circ.depth()
    circ.replace_implicit_wire_swaps()
    AutoRebase({OpType.CX, OpType.U3}).apply(circ)
    return circuit_to_qasm_str(circ), cx, dep, dt, dc


def check(qc_in, qc_out) -> float:
    """Measured process infidelity of ``qc_out`` against ``qc_in``."""
    from qdiff.circuits.qiskit_io import from_qiskit
    from qdiff.compiler import equivalence
    return equivalence(from_qiskit(qc_in).circuit, from_qiskit(qc_out).circuit, "final").infidelity


def worker(path, level, approx, use_pytket, emit):
    """Run every tool on one circuit; ``emit(tool, fields)`` after each (partial results survive
    a time-out)."""
    import qdiff as qd
    import qiskit.qasm2 as q2
    from qiskit import transpile
    from qdiff.circuits.qiskit_io import from_qiskit
    qc = load(path)
    base = transpile(qc, basis_gates=["cx", "u"], optimization_level=0)
    emit("in", {"qubits": qc.num_qubits, "cx": two_q(base), "depth": base.depth()})
    q3, tq, cq = run_qiskit(qc)
    emit("qk", {"cx": two_q(q3), "depth": q3.depth(), "s": tq, "cpu": cq, "inf": check(qc, q3)})
    if use_pytket:
        src, cx, dep, tt, ct = run_pytket(qc)
        out = q2.loads(src, custom_instructions=q2.LEGACY_CUSTOM_INSTRUCTIONS)
        emit("tk", {"cx": cx, "depth": dep, "s": tt, "cpu": ct, "inf": check(qc, out)})
    modes = [("qd", None)] + ([("ax", approx)] if approx else [])
    for tool, eps in modes:
        c = time.process_time()
        _, rep = qd.compile(from_qiskit(qc), level=level, basis="cx,u", approx=eps)
        emit(tool, {"cx": rep.cx_after, "depth": rep.depth_after, "s": rep.seconds,
                    "cpu": time.process_time() - c,
                    "ok": bool(rep.verified), "inf": rep.infidelity, "method": rep.method,
                    "strategy": rep.strategy, "cut": rep.time_cut, "work": rep.work,
                    "bound": rep.approx_bound})


def _worker_main(args) -> int:
    def emit(tool, fields):
        print(json.dumps({"tool": tool, **fields}), flush=True)
    worker(args.worker, args.level, args.approx, not args.no_pytket, emit)
    return 0


def _cpu_limit(seconds):
    """A ``preexec_fn`` limiting the child's CPU time (a limit the machine's load cannot
    shorten, unlike the wall-clock ``--timeout``)."""
    if not seconds:
        return None

    def limit():
        import resource
        s = int(seconds)
        resource.setrlimit(resource.RLIMIT_CPU, (s, s + 5))
    return limit


def run_circuit(path, args, use_pytket) -> dict:
    """One circuit in a fresh interpreter under ``args.timeout`` seconds; returns its row."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", path, "--level",
           str(args.level), "--approx", str(args.approx)] + (["--no-pytket"] if not use_pytket
                                                             else [])
    row = {"name": os.path.basename(path)[:-5]}
    t = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True,
                                preexec_fn=_cpu_limit(args.cpu_limit))
        try:
            _, err = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            row["timeout"] = args.timeout
        if proc.returncode == -signal.SIGXCPU:
            row["timeout"] = f"{args.cpu_limit} CPU s"
        out.seek(0)
        for line in out:
            if line.startswith("{"):
                d = json.loads(line)
                row[d.pop("tool")] = d
    row["wall_s"] = time.perf_counter() - t
    if proc.returncode and "timeout" not in row:
        row["error"] = (err or "").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
    return row


def _inf(x) -> str:
    if x is None:
        return "-"
    return f"{x:.0e}" if x > 1e-14 else "<1e-14"


def _g(r, tool, key, fmt=str):
    d = r.get(tool)
    return fmt(d[key]) if d and d.get(key) is not None else ("timeout" if "timeout" in r else "-")


def markdown(rows, approx) -> str:
    head = ["circuit", "n", "input CX", "depth", "Qiskit O3 CX", "depth", "CPU s", "1-F",
            "pytket FPO CX", "depth", "CPU s", "1-F", "qdiff CX", "depth", "CPU s", "1-F",
            "strategy", f"qdiff approx {approx:g} CX", "depth", "CPU s", "1-F"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    s1, s2 = (lambda x: f"{x:.2f}"), (lambda x: f"{x:.1f}")
    for r in rows:
        qd = r.get("qd")
        others = [r[t]["cx"] for t in ("qk", "tk") if r.get(t)]
        mark = "**" if qd and others and qd["cx"] < min(others) else ""
        ok = "" if not qd or qd["ok"] else " NOT VERIFIED"
        cells = [r["name"], _g(r, "in", "qubits"), _g(r, "in", "cx"), _g(r, "in", "depth"),
                 _g(r, "qk", "cx"), _g(r, "qk", "depth"), _g(r, "qk", "cpu", s1),
                 _g(r, "qk", "inf", _inf), _g(r, "tk", "cx"), _g(r, "tk", "depth"),
                 _g(r, "tk", "cpu", s1), _g(r, "tk", "inf", _inf),
                 f"{mark}{_g(r, 'qd', 'cx')}{mark}", _g(r, "qd", "depth"), _g(r, "qd", "cpu", s2),
                 _g(r, "qd", "inf", _inf) + ok, _g(r, "qd", "strategy"),
                 _g(r, "ax", "cx"), _g(r, "ax", "depth"), _g(r, "ax", "cpu", s2),
                 _g(r, "ax", "inf", _inf)]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    t = totals(rows)
    i, k, q, x, a = t["in"], t["qk"], t["tk"], t["qd"], t["ax"]
    cells = ["**total**", f"{t['complete']}/{len(rows)} complete", i["cx"], i["depth"],
             k["cx"], k["depth"], f"{k['cpu']:.1f}", "", q["cx"], q["depth"], f"{q['cpu']:.1f}", "",
             f"**{x['cx']}**", x["depth"], f"{x['cpu']:.1f}", "", "", a["cx"], a["depth"],
             f"{a['cpu']:.1f}", ""]
    lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def totals(rows) -> dict:
    """Sums over the circuits every tool finished (so the columns are comparable)."""
    full = _complete(rows)
    out = {"complete": len(full)}
    for tool in TOOLS:
        out[tool] = {k: sum((r.get(tool) or {}).get(k, 0) or 0 for r in full)
                     for k in ("cx", "depth", "s", "cpu")}
    return out


def _complete(rows) -> list:
    """Rows where every tool that ran anywhere finished."""
    used = {"in", "qd"} | {t for t in TOOLS if any(r.get(t) for r in rows)}
    return [r for r in rows if all(r.get(t) for t in used)]


def summary(rows) -> str:
    full = _complete(rows)
    t = totals(rows)
    qd = [r for r in rows if r.get("qd")]
    slow = max(qd, key=lambda r: r["qd"]["cpu"]) if qd else None
    lines = [f"circuits: {len(rows)}, every tool finished on {len(full)}; not finished: "
             f"{[r['name'] for r in rows if r not in full] or 'none'}",
             f"total CX on those: input {t['in']['cx']}, Qiskit O3 {t['qk']['cx']}, pytket "
             f"{t['tk']['cx']}, qdiff exact {t['qd']['cx']}, qdiff approx {t['ax']['cx']}",
             f"qdiff exact CX > Qiskit O3 on: "
             f"{[r['name'] for r in full if r['qd']['cx'] > r['qk']['cx']] or 'none'}; > pytket "
             f"on: {[r['name'] for r in full if r.get('tk') and r['qd']['cx'] > r['tk']['cx']] or 'none'}",
             f"unverified: {[r['name'] for r in qd if not r['qd']['ok']] or 'none'}; worst "
             f"exact 1-F: {max((r['qd']['inf'] for r in qd), default=0):.1e}; time-limit cuts: "
             f"{[r['name'] for r in qd if r['qd']['cut']] or 'none'}"]
    if slow:
        lines.append(f"slowest qdiff exact circuit: {slow['name']} {slow['qd']['cpu']:.1f} CPU s "
                     f"({slow['qd']['s']:.1f} s wall); over 60 CPU s: "
                     f"{[r['name'] for r in qd if r['qd']['cpu'] > 60] or 'none'}; over 60 s "
                     f"wall: {[r['name'] for r in qd if r['qd']['s'] > 60] or 'none'}")
    saved = [f"{r['name']} {r['qd']['cx']}->{r['ax']['cx']} (1-F {r['ax']['inf']:.0e})"
             for r in full if r.get("ax") and r["ax"]["cx"] < r["qd"]["cx"]]
    lines.append(f"approx saves CX on: {saved or 'none'}")
    return "\n".join(lines)


def _load_json(path) -> dict:
    if path and os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {"meta": {}, "rows": []}


def _save_json(path, data) -> None:
    from qdiff.circuits.fileio import write_atomic
    write_atomic(path, json.dumps(data, indent=1) + "\n")


def _claim_path(path, name) -> str:
    return f"{path}.{name}.running"


def _claim(path, name) -> bool:
    """Mark ``name`` as running for shards sharing the JSON file; False if already marked."""
    try:
        os.close(os.open(_claim_path(path, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def main(argv=None) -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=DEFAULT_DIR)
    ap.add_argument("--level", type=int, default=3)
    ap.add_argument("--approx", type=float, default=1e-6, help="also run qdiff --approx EPS "
                    "(0: skip)")
    ap.add_argument("--no-pytket", action="store_true")
    ap.add_argument("--json", default=None, help="save rows here as they finish; skip the "
                    "circuits already saved (resume)")
    ap.add_argument("--timeout", type=float, default=7200.0,
                    help="wall-clock seconds per circuit, all tools together")
    ap.add_argument("--cpu-limit", type=float, default=900.0,
                    help="CPU seconds per circuit, all tools together (0: none)")
    ap.add_argument("--reverse", action="store_true", help="largest circuits first (a second "
                    "shard on the same --json meets the first in the middle)")
    ap.add_argument("--redo", action="store_true", help="re-run circuits already in --json")
    ap.add_argument("--table", action="store_true", help="only print the table of --json")
    ap.add_argument("--markdown", default=None, help="also write the table to this file")
    ap.add_argument("--only", nargs="*", default=None, help="circuit names (without .qasm)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return _worker_main(args)
    use_pytket = not args.no_pytket
    if use_pytket:
        try:
            import pytket  # noqa: F401
        except ImportError:
            print("pytket is not installed: its column is left out", file=sys.stderr)
            use_pytket = False
    data = _load_json(args.json)
    every = sorted(circuit_files(ap, args.dir), key=os.path.getsize)
    files = sorted(circuit_files(ap, args.dir, args.only), key=os.path.getsize)
    if not args.table:
        saved = {k: data["meta"][k] for k in ("level", "approx") if k in data["meta"]}
        asked = {"level": args.level, "approx": args.approx}
        if data["rows"] and any(saved[k] != asked[k] for k in saved):
            ap.error(f"--json {args.json} holds results for {saved}, not {asked}: give "
                     "another file")
        data["meta"].update(level=args.level, approx=args.approx, timeout=args.timeout,
                            cpu_limit=args.cpu_limit,
                            python=platform.python_version(), cores=os.cpu_count())
        for f in (reversed(files) if args.reverse else files):
            name = os.path.basename(f)[:-5]
            if args.json:  # another shard may have saved rows meanwhile
                data["rows"] = _load_json(args.json)["rows"]
            if not args.redo and any(r["name"] == name for r in data["rows"]):
                continue
            if args.json and not _claim(args.json, name):
                continue  # another shard is running it
            load0 = os.getloadavg()[0]
            r = run_circuit(f, args, use_pytket)
            r["load"] = round((load0 + os.getloadavg()[0]) / 2, 1)
            r["date"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
            if args.json:
                data["rows"] = _load_json(args.json)["rows"]
            data["rows"] = [x for x in data["rows"] if x["name"] != name] + [r]
            if args.json:
                _save_json(args.json, data)
                os.unlink(_claim_path(args.json, name))
            qd, ax = r.get("qd") or {}, r.get("ax") or {}
            print(f"{name:34s} in={_g(r, 'in', 'cx'):>5} qk={_g(r, 'qk', 'cx'):>5} "
                  f"tk={_g(r, 'tk', 'cx'):>5} qd={_g(r, 'qd', 'cx'):>5} "
                  f"({qd.get('cpu', 0):.1f} CPU s, {qd.get('s', 0):.1f} s, 1-F={_inf(qd.get('inf'))})"
                  f" ax={_g(r, 'ax', 'cx')} ({ax.get('cpu', 0):.1f} CPU s) load={r['load']}"
                  + (f" TIMEOUT {r['timeout']}" if "timeout" in r else "")
                  + (f" ERROR {r['error']}" if "error" in r else ""), flush=True)
    order = {os.path.basename(f)[:-5]: i for i, f in enumerate(every)}
    rows = sorted(data["rows"], key=lambda r: order.get(r["name"], 1e9))
    if args.only:
        rows = [r for r in rows if r["name"] in args.only]
    table = markdown(rows, args.approx or data["meta"].get("approx", 0))
    print(table)
    print(summary(rows))
    if args.markdown:
        from qdiff.circuits.fileio import write_atomic
        write_atomic(args.markdown, table + "\n\n" + summary(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
