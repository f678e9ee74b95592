"""The examples' command-line contract: a bad option or value is one line on stderr and exit
code 2 (argparse's code), never a traceback; ``--help`` exits 0.

``Parser`` is an ``argparse.ArgumentParser`` whose errors are one line; the ``type=`` helpers
check ranges while parsing; :func:`check_plot` refuses an unusable ``--plot`` path before any
work is done; :func:`run` calls a script's ``main`` and turns a :class:`qdiff.QdiffError`
(bad input met later: an unknown device, a gradient method the backend cannot do) into the same
one line and exit 2, and Ctrl-C into one line and exit 130.
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys

from qdiff.circuits.errors import QdiffError
from qdiff.circuits.fileio import check_target

EXIT_USAGE = 2
EXIT_INTERRUPT = 130


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line (argparse prints the usage too), exit code 2
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(str(message).split())}\n")


def _number(kind, lo, strict, what):
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} expected; got {text!r}") from None
        if isinstance(v, float) and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{what} expected; got {text!r}")
        if v < lo or (strict and v == lo):
            raise argparse.ArgumentTypeError(f"{what} expected; got {text!r}")
        return v
    parse.__name__ = what  # argparse names the type in some messages
    return parse


positive_int = _number(int, 0, True, "an integer >= 1")
nonnegative_int = _number(int, 0, False, "an integer >= 0")
positive_float = _number(float, 0.0, True, "a finite number > 0")
nonnegative_float = _number(float, 0.0, False, "a finite number >= 0")


def finite_float(text):
    return _number(float, -math.inf, False, "a finite number")(text)


def thread_count(text):
    """``--threads``: 0 (torch's default) up to the machine's CPU count; more threads than
    CPUs only contend, and far more exhaust the process limit inside the BLAS library."""
    v = nonnegative_int(text)
    cpus = os.cpu_count() or 1
    if v > cpus:
        raise argparse.ArgumentTypeError(f"an integer from 0 to the CPU count ({cpus}) "
                                         f"expected; got {text!r}")
    return v


def seed_int(text):
    v = nonnegative_int(text)
    if v >= 2 ** 63:
        raise argparse.ArgumentTypeError(f"a seed below 2**63 expected; got {text!r}")
    return v


def check_plot(path, option: str = "--plot") -> None:
    """Refuse a plot path that cannot be written (checked before the run, not after it): an
    empty path, a format matplotlib cannot write, a missing folder, a directory, a read-only
    file. A symlink is replaced by the new file, as every qdiff output is."""
    if path is None:
        return
    if not str(path).strip():
        raise QdiffError(f"{option}: empty path")
    ext = os.path.splitext(path)[1][1:].lower() or "png"
    from matplotlib.figure import Figure
    formats = sorted(Figure().canvas.get_supported_filetypes())
    if ext not in formats:
        raise QdiffError(f"{option} {path}: matplotlib cannot write '.{ext}' files; use one of "
                         f"{formats}")
    if ext == "pgf":  # written through a TeX engine, which must be installed
        import shutil

        import matplotlib
        tex = matplotlib.rcParams.get("pgf.texsystem", "xelatex")
        if shutil.which(tex) is None:
            raise QdiffError(f"{option} {path}: matplotlib writes '.pgf' through {tex}, which "
                             "is not installed; use another format (.png, .pdf, .svg)")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise QdiffError(f"{option} {path}: cannot write (no folder {folder})")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise QdiffError(f"{option} {path}: cannot write (folder {folder} is not writable)")
    check_target(path)


def run(main) -> None:
    """``sys.exit(main())`` for a script's ``__main__`` (an int that ``main`` returns is the
    exit code, anything else exits 0): a :class:`QdiffError` is one line on stderr and exit
    code 2; Ctrl-C is one line and exit code 130 (plots are written atomically, so none is
    left half-written). SIGINT goes back to Python's handler first (``_startup`` held it
    while the script's imports ran)."""
    prog = os.path.basename(sys.argv[0]) or "example"
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = main()
    except QdiffError as exc:
        print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C cannot cut the line
        print(f"{prog}: error: interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPT)
    sys.exit(code if isinstance(code, int) and not isinstance(code, bool) else 0)
