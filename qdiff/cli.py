"""The ``qdiff`` command line: ``qdiff compile INPUT... [-o OUT | --out-dir DIR] [-O N] ...``.

Exit codes: 0 success, 1 a verification failed (that file is not written), 2 bad input (one
line naming the file, line and fault; no traceback), 130 interrupted (Ctrl-C or SIGTERM, at any
time, start-up included), 3 an internal error (a bug: one line asking for a report;
``QDIFF_DEBUG=1`` prints the traceback). A batch compiles every file, reports the failures per
file at the end and exits with the worst code. Outputs are written atomically and never
through a symlink (:mod:`qdiff.circuits.fileio`): an existing file is never left truncated, a
read-only one is replaced only with ``--force``, and an interruption leaves no partial file.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading

from qdiff.circuits.errors import QdiffError, scrub

EXIT_OK, EXIT_VERIFY, EXIT_INPUT, EXIT_INTERNAL, EXIT_INTERRUPT = 0, 1, 2, 3, 130
REPORT_HINT = "please report it with the input and command line (QDIFF_DEBUG=1 shows details)"


class Terminated(KeyboardInterrupt):
    """Raised by the SIGTERM handler: unwinds like Ctrl-C (temp files removed, exit 130)."""


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
    c.add_argument("--basis", default=None, help="target gates, e.g. cx,u | rz,sx,x,cx | "
                   "cz,rz,sx,x (default cx,u; not with --target, which uses the device's)")
    c.add_argument("--target", metavar="DEVICE", help="IBM device, any name qd.device('ibm', "
                   "backend=...) accepts (fake_* offline, e.g. fake_manila; real names with an "
                   "account): layout/routing by Qiskit, then qdiff in its basis")
    c.add_argument("--approx", type=float, default=None, metavar="EPS",
                   help="allow a process infidelity of at most EPS per circuit (resynthesis and "
                   "gate dropping; verified and reported); default: exact (1e-12)")
    c.add_argument("--work", type=_work, default=None, metavar="UNITS",
                   help="level-3 search budget in work units (default 25 per input CX, 100-2500): the same input, "
                   "level, basis and seed give the same output on any machine")
    c.add_argument("--ignore-barriers", action="store_true",
                   help="optimize across the input's barriers and leave them out of the output "
                   "(default: kept, no gate moved across one, as Qiskit's transpiler does)")
    c.add_argument("--verify", choices=["final", "auto", "unitary", "statevector", "none"],
                   default="final", help="final (default): full unitary up to 12 qubits, "
                   "random states above")
    c.add_argument("--report", choices=["table", "json"], default="table")
    c.add_argument("--seed", type=_seed, default=0, help="random seed (a non-negative integer)")
    c.add_argument("--force", action="store_true",
                   help="replace existing outputs even if they are read-only")
    c.add_argument("--time-limit", type=_seconds, default=None, metavar="SECONDS",
                   help="outer bound per circuit on the level-3 search (default none); the report "
                   "says when it cut the search")
    c.add_argument("--qasm-version", type=int, choices=[2, 3], default=None,
                   help="OpenQASM version of the output (default: that of the input)")
    sub.add_parser("doctor", help="report whether the native CPU kernels run, and why not")
    return p


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2 ** 63:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer in [0, 2**63)")
    return value


def _positive(units: str):
    """An argparse type: a positive finite number (of ``units``)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number of {units}")
        return value
    return parse


_seconds = _positive("seconds")
_work = _positive("work units")


def main(argv=None) -> int:
    """Entry point of the ``qdiff`` console script; returns the exit code (never raises,
    whatever the input: see the module doc for the codes)."""
    previous = _install_sigterm()
    try:
        return _main(argv)
    except KeyboardInterrupt as exc:
        what = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
        _err(f"{what}; no partial output was written")
        return EXIT_INTERRUPT
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main(argv) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command == "doctor":
            return _doctor()
        if args.command != "compile":
            raise QdiffError("a command is required: qdiff compile INPUT... (see qdiff --help)")
        return _compile(args)
    except QdiffError as exc:
        _err(str(exc))
        return EXIT_INPUT
    except SystemExit as exc:  # --help / --version
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001  (the last resort: a bug, never exit 1)
        _internal(exc)
        return EXIT_INTERNAL


def _doctor() -> int:
    """``qdiff doctor``: the native kernels' status (builds them if needed); exit 0 either
    way (the torch kernels compute the same results)."""
    _import_held("torch")
    import torch
    from qdiff.backends.statevector.native_lib import cache_dir, native_status
    print(native_status())
    print(f"kernel cache: {cache_dir()}")
    print(f"threads: {torch.get_num_threads()} (torch.set_num_threads / OMP_NUM_THREADS)")
    return EXIT_OK


def _install_sigterm():
    """SIGTERM raises :class:`Terminated` (main thread only; returns the previous handler)."""
    if threading.current_thread() is not threading.main_thread() or \
            not hasattr(signal, "SIGTERM"):
        return None

    def on_term(signum, frame):
        raise Terminated()
    return signal.signal(signal.SIGTERM, on_term)


def _internal(exc: BaseException, path: str | None = None) -> None:
    where = f"{path}: " if path else ""
    _err(f"{where}{type(exc).__name__}: {exc}; {REPORT_HINT}", "internal error")
    if os.environ.get("QDIFF_DEBUG"):
        import traceback
        traceback.print_exception(exc, file=sys.stderr)


def _err(msg: str, kind: str = "error") -> None:
    text = " ".join(str(msg).split())
    token = os.environ.get("QISKIT_IBM_TOKEN")
    if token and token.strip():  # never printed, whatever message quotes it
        text = text.replace(token.strip(), "***")
    text = scrub(text)  # a saved account's token, once an IBM service has been made
    print(f"qdiff: {kind}: {text}", file=sys.stderr)


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


def _import_held(*modules: str) -> None:
    """Import ``modules`` with SIGINT/SIGTERM held until they are loaded: a KeyboardInterrupt
    raised while an extension module initialises (torch's calls back into Python) can abort
    the process (std::terminate) instead of unwinding. A signal that arrived meanwhile is
    delivered once the imports are done, and then interrupts as anywhere else."""
    import importlib

    from qdiff.circuits import fileio
    with fileio.signals_held():
        for name in modules:
            importlib.import_module(name)


def _quiet_runtime_log() -> None:
    """qiskit-ibm-runtime logs to stderr through its own handler (``Loading account with the
    given token...`` for ``--target`` with a real device); the command line's stderr holds only
    its own lines, so that logger is silenced unless ``QISKIT_IBM_RUNTIME_LOG_LEVEL`` asks for
    it."""
    if not os.environ.get("QISKIT_IBM_RUNTIME_LOG_LEVEL"):
        import logging
        logging.getLogger("qiskit_ibm_runtime").setLevel(logging.CRITICAL + 1)


def _compile(args) -> int:
    _quiet_runtime_log()
    _import_held("qiskit", "torch", "qdiff.compiler.api")  # parse_basis's module needs torch
    from qdiff.compiler.basis import parse_basis
    for option, value in (("-o", args.output), ("--out-dir", args.out_dir)):
        if value is not None and not value.strip():
            raise QdiffError(f"{option}: empty path (- writes to stdout)" if option == "-o"
                             else f"{option}: empty path")
    files = expand_inputs(args.inputs)
    if args.output and len(files) > 1:
        raise QdiffError("-o names one output file but there are several inputs; use --out-dir")
    if args.basis is not None:
        parse_basis(args.basis)  # a bad --basis is an input error before any work
        if args.target is not None:
            raise QdiffError(f"--basis {args.basis} with --target {args.target}: the target's "
                             "own basis is used; give one of them")
    if args.approx is not None and not 0 < args.approx < 1:
        raise QdiffError(f"--approx {args.approx:g}: expected a process infidelity in (0, 1)")
    if args.out_dir:
        _make_out_dir(args.out_dir)
    to_stdout = args.output == "-" or (not args.output and not args.out_dir and len(files) == 1)
    outputs = _output_paths(files, args, to_stdout)
    info = sys.stderr if to_stdout else sys.stdout
    reports, failures = [], []
    for path in _progress(files):
        code, msg = _compile_one(args, path, outputs[path], to_stdout, reports)
        if code != EXIT_OK:
            failures.append((path, code, msg))
    if reports:
        try:
            _print_reports(reports, args.report, info)
        except QdiffError as exc:  # the failures below are still reported
            failures.append(("", EXIT_INPUT, str(exc)))
    for path, code, msg in failures:
        if code == EXIT_INTERNAL:
            _err(f"{msg}; {REPORT_HINT}", "internal error")
        else:
            label = "<stdin>" if path == "-" else path
            named = not path or msg.startswith((label, "<stdout>", "<stderr>"))
            _err(msg if named else f"{label}: {msg}")
    return max([code for _, code, _ in failures], default=EXIT_OK)


def _output_paths(files, args, to_stdout) -> dict:
    """``{input: output path or None}``; two inputs with one output is a bad-input error
    raised before anything is compiled or written, and so is a read-only existing output
    without ``--force``."""
    from qdiff.circuits import fileio
    if to_stdout or not (args.output or args.out_dir):
        return {f: None for f in files}  # several inputs and no output option: reports only
    if args.output:
        out = {files[0]: args.output}
    else:
        out, seen = {}, {}
        for f in files:
            target = os.path.join(args.out_dir, "stdin.qasm" if f == "-" else os.path.basename(f))
            key = os.path.normcase(os.path.abspath(target))
            if key in seen:
                raise QdiffError(f"{seen[key]} and {f} would both be written to {target}; "
                                 "rename one or compile them separately")
            seen[key] = f
            out[f] = target
    for target in out.values():
        try:
            fileio.check_target(target, args.force)
        except fileio.ReadOnlyOutputError as exc:
            raise QdiffError(f"{str(exc).split(';')[0]}; --force replaces it") from None
    return out


def _compile_one(args, path, output, to_stdout, reports) -> tuple:
    """Compile, verify and write one input; ``(exit code, message)``."""
    from qdiff.compiler.api import compile as qcompile
    try:
        imp, version = _read(path)
        if (args.qasm_version or version) == 2 and imp.columns():
            names = ", ".join(str(c) for c in imp.parameters) or "angle expressions"
            raise QdiffError(f"{path}: --qasm-version 2: the circuit has input parameters "
                             f"({names}) and OpenQASM 2 has none; use --qasm-version 3")
        out, rep = qcompile(imp, level=args.level, basis=args.basis,
                            verify=args.verify,
                            seed=args.seed, time_limit=args.time_limit, target=args.target,
                            name="<stdin>" if path == "-" else path, approx=args.approx,
                            work=args.work, progress=_stage_printer(path),
                            keep_barriers=not args.ignore_barriers)
        _clear_stage()
        if rep.verified is False:
            reports.append(rep)
            return EXIT_VERIFY, (f"{path}: output not equivalent to the input "
                                 f"(1-F = {rep.infidelity:.3g}); nothing written")
        _write(_with_parameters(out, imp), rep, args, output, version, to_stdout)
        reports.append(rep)  # (a run whose output could not be written has no report)
        return EXIT_OK, ""
    except QdiffError as exc:
        return EXIT_INPUT, str(exc)
    except (KeyboardInterrupt, GeneratorExit, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001  (a bug on this file: the others still run)
        if os.environ.get("QDIFF_DEBUG"):
            import traceback
            traceback.print_exception(exc, file=sys.stderr)
        return EXIT_INTERNAL, f"{path}: {type(exc).__name__}: {exc}"


def _print_reports(reports, kind, info) -> None:
    from qdiff.compiler.report import table
    if kind == "json":
        _write_stream(info, json.dumps([r.to_dict() for r in reports], indent=1) + "\n")
    else:
        _write_stream(info, table(reports) + "\n")


def _write_stream(stream, text: str) -> None:
    """Write and flush ``text`` to standard output or error; a closed, full or broken stream
    is bad input (exit 2, one line), and the stream is then pointed at the null device so that
    the interpreter's final flush adds no second message."""
    name = "<stderr>" if stream is sys.stderr else "<stdout>"
    try:
        if stream is None:
            raise OSError(0, "the stream is closed")
        stream.write(text)
        stream.flush()
    except OSError as exc:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, stream.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):
            pass
        raise QdiffError(f"{name}: cannot write ({exc.strerror or exc})") from None


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
    """A progress bar over a batch on a terminal; the plain list when stderr is piped or
    redirected (stderr then holds only the failures' lines)."""
    if len(files) < 2 or not sys.stderr.isatty():
        return files
    from tqdm import tqdm
    return tqdm(files, desc="compiling", unit="file", file=sys.stderr, leave=False)


def _read(path):
    from qdiff.circuits import fileio, qasm, qasm_bounds
    if path == "-":
        stdin = getattr(sys.stdin, "buffer", sys.stdin)  # bytes: decoded as a file is
        text = fileio.read_text(stdin, qasm_bounds.MAX_BYTES, "<stdin>")
        return qasm.loads(text, "<stdin>"), qasm.qasm_version(text)
    text = qasm.read_text(path)
    return qasm.loads(text, path), qasm.qasm_version(text)


def _with_parameters(out, imp):
    """The compiled circuit with the input's parameters and angle expressions for its theta
    columns (compilation keeps the columns), so the output declares the input's names."""
    if not imp.columns():
        return out
    import dataclasses
    return dataclasses.replace(imp, circuit=out, measurements=[], num_clbits=0,
                               global_phase=0.0)


def _write(out, rep, args, output, version, to_stdout) -> None:
    from qdiff.circuits import fileio, qasm
    text = qasm.dumps(out, args.qasm_version or version, measurements=rep.measurements,
                      num_clbits=rep.num_clbits, basis=rep.basis.split(","),
                      registers=rep.registers)
    if to_stdout:
        _write_stream(sys.stdout, text)
    elif output is not None:
        fileio.write_atomic(output, text, force=args.force)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
