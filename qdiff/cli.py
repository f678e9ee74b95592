"""The ``qdiff`` command line: ``qdiff compile INPUT... [-o OUT | --out-dir DIR] [-O N] ...``.

Exit codes: 0 success, 1 a verification failed (that file is not written), 2 bad input (one
line naming the file, line and fault; no traceback), 130 interrupted. Outputs are written
atomically, so an existing file is never left truncated and Ctrl-C leaves no partial file.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from qdiff.circuits.errors import QdiffError

EXIT_OK, EXIT_VERIFY, EXIT_INPUT, EXIT_INTERRUPT = 0, 1, 2, 130


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit code 2 (argparse's own convention too)
        raise QdiffError(message)


def build_parser() -> argparse.ArgumentParser:
    import qdiff  # the lazy front: its version without importing torch
    p = _Parser(prog="qdiff", description="qdiff: differentiable quantum stack tools")
    p.add_argument("--version", action="version", version=f"qdiff {qdiff.__version__}")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    c = sub.add_parser("compile", help="optimize OpenQASM circuits (fewer CX, verified)")
    c.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="OpenQASM 2/3 files, directories of .qasm files, or - for stdin")
    out = c.add_mutually_exclusive_group()
    out.add_argument("-o", "--output", metavar="OUT", help="output file (- for stdout)")
    out.add_argument("--out-dir", metavar="DIR", help="directory for the outputs (same names)")
    c.add_argument("-O", dest="level", type=int, choices=[0, 1, 2, 3], default=2,
                   help="optimization level (default 2; 3 adds gradient re-synthesis)")
    c.add_argument("--basis", default="cx,u", help="target gates, e.g. cx,u | rz,sx,x,cx | "
                   "cz,rz,sx,x (default cx,u)")
    c.add_argument("--target", metavar="DEVICE", help="IBM device, any name qd.device('ibm', "
                   "backend=...) accepts (fake_* offline, e.g. fake_manila; real names with an "
                   "account): layout/routing by Qiskit, then qdiff in its basis")
    c.add_argument("--approx", type=float, default=None, metavar="EPS",
                   help="allow a process infidelity of at most EPS per circuit (resynthesis and "
                   "gate dropping; verified and reported); default: exact (1e-12)")
    c.add_argument("--work", type=float, default=None, metavar="UNITS",
                   help="level-3 search budget in work units (default 25 per input CX, 100-2500): the same input, "
                   "level, basis and seed give the same output on any machine")
    c.add_argument("--verify", choices=["final", "auto", "unitary", "statevector", "none"],
                   default="final", help="final (default): full unitary up to 12 qubits, "
                   "random states above")
    c.add_argument("--report", choices=["table", "json"], default="table")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="outer bound per circuit on the level-3 search (default none); the report "
                   "says when it cut the search")
    c.add_argument("--qasm-version", type=int, choices=[2, 3], default=None,
                   help="OpenQASM version of the output (default: that of the input)")
    return p


def main(argv=None) -> int:
    """Entry point of the ``qdiff`` console script; returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
        if args.command != "compile":
            raise QdiffError("a command is required: qdiff compile INPUT... (see qdiff --help)")
        return _compile(args)
    except QdiffError as exc:
        _err(str(exc))
        return EXIT_INPUT
    except KeyboardInterrupt:
        _err("interrupted (no partial output was written)")
        return EXIT_INTERRUPT


def _err(msg: str) -> None:
    print(f"qdiff: error: {' '.join(msg.split())}", file=sys.stderr)


def expand_inputs(inputs) -> list:
    files = []
    for item in inputs:
        if item == "-" or not os.path.isdir(item):
            files.append(item)
            continue
        found = sorted(os.path.join(item, f) for f in os.listdir(item)
                       if f.endswith((".qasm", ".qasm3")))
        if not found:
            raise QdiffError(f"{item}: directory has no .qasm files")
        files.extend(found)
    return files


def _compile(args) -> int:
    from qdiff.compiler.api import compile as qcompile
    from qdiff.compiler.basis import parse_basis
    from qdiff.compiler.report import table
    files = expand_inputs(args.inputs)
    if args.output and len(files) > 1:
        raise QdiffError("-o names one output file but there are several inputs; use --out-dir")
    if args.target is None:
        parse_basis(args.basis)  # a bad --basis is an input error before any work
    if args.approx is not None and not 0 < args.approx < 1:
        raise QdiffError(f"--approx {args.approx:g}: expected a process infidelity in (0, 1)")
    if args.out_dir:
        _make_out_dir(args.out_dir)
    to_stdout = args.output == "-" or (not args.output and not args.out_dir and len(files) == 1)
    info = sys.stderr if to_stdout else sys.stdout
    reports, status = [], EXIT_OK
    for path in _progress(files):
        imp, version = _read(path)
        out, rep = qcompile(imp, level=args.level, basis=args.basis, verify=args.verify,
                            seed=args.seed, time_limit=args.time_limit, target=args.target,
                            name="<stdin>" if path == "-" else path, approx=args.approx,
                            work=args.work, progress=_stage_printer(path))
        _clear_stage()
        reports.append(rep)
        if rep.verified is False:
            _err(f"{path}: output not equivalent to the input (1-F = {rep.infidelity:.3g}); "
                 "nothing written")
            status = EXIT_VERIFY
            continue
        _write(out, rep, args, path, version, to_stdout)
    if args.report == "json":
        print(json.dumps([r.to_dict() for r in reports], indent=1), file=info)
    else:
        print(table(reports), file=info)
    return status


def _make_out_dir(path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise QdiffError(f"{path}: --out-dir exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise QdiffError(f"{path}: cannot create the output directory ({exc.strerror})") from None


def _stage_printer(path: str):
    """On a terminal, one status line (file, stage, best two-qubit count so far); None when
    stderr is piped or redirected, so logs stay clean."""
    if not sys.stderr.isatty():
        return None
    label = "<stdin>" if path == "-" else os.path.basename(path)

    def show(stage: str, best: int) -> None:
        sys.stderr.write(f"\r\033[K{label}: {stage}, best {best} two-qubit gates")
        sys.stderr.flush()
    return show


def _clear_stage() -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


def _progress(files):
    if len(files) < 2:
        return files
    from tqdm import tqdm
    return tqdm(files, desc="compiling", unit="file", file=sys.stderr, leave=False)


def _read(path):
    from qdiff.circuits import qasm
    if path == "-":
        text = sys.stdin.read()
        return qasm.loads(text, "<stdin>"), qasm.qasm_version(text)
    text = qasm.read_text(path)
    return qasm.loads(text, path), qasm.qasm_version(text)


def _write(out, rep, args, path, version, to_stdout) -> None:
    from qdiff.circuits import qasm
    text = qasm.dumps(out, args.qasm_version or version, measurements=rep.measurements,
                      num_clbits=rep.num_clbits)
    if to_stdout:
        sys.stdout.write(text)
    elif args.output:
        qasm.write_atomic(args.output, text)
    elif args.out_dir:
        name = "stdin.qasm" if path == "-" else os.path.basename(path)
        qasm.write_atomic(os.path.join(args.out_dir, name), text)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
