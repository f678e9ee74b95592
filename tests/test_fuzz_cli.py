"""Fuzzing ``qdiff compile`` in-process with mutated benchmark circuits (hypothesis).

Each case takes one file of the public benchmark set (``../shared/benchmarks/qasm``), applies
a few random mutations (cut, truncate, duplicate or swap lines, insert tokens or bytes, swap a
number for an extreme one) and runs ``main(["compile", ...])`` with a time bound. Whatever the
input, the contract must hold: exit code 0 or 2 (never 1, 3, or an exception), at most one
line on stderr and no traceback, and on failure the existing output untouched with no temp file
left. The default run checks ``DEFAULT_CASES`` cases (derandomized, so CI is reproducible);
``pytest -m slow`` runs ``SLOW_CASES`` random ones.
"""
from __future__ import annotations

import os
import signal
import threading

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from qdiff.cli import main  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.normpath(os.path.join(ROOT, "..", "shared", "benchmarks", "qasm"))
MAX_SOURCE_BYTES = 3200  # the smaller half of the set: cases stay well under a second each
CASE_SECONDS = 60  # per-case bound (generous: the machine may be loaded)
DEFAULT_CASES = 40
SLOW_CASES = 400


def _sources() -> list:
    if not os.path.isdir(BENCH):
        return []
    names = sorted(f for f in os.listdir(BENCH) if f.endswith(".qasm"))
    out = []
    for f in names:
        with open(os.path.join(BENCH, f), encoding="utf-8") as fh:
            text = fh.read()
        if len(text) <= MAX_SOURCE_BYTES:
            out.append((f, text))
    return out


SOURCES = _sources()
pytestmark = pytest.mark.skipif(not SOURCES, reason=f"benchmark set not found at {BENCH}")

TOKENS = ["qreg q[24];", "qreg r[100000];", "creg c[2];", "gate g a { h a; g a; }", "h q;",
          "cx q[0],q[0];", "u3(0,0) q[0];", "rz(1e999) q[0];", "rz(pi/0) q[0];",
          "rz(exp(1000)) q[0];", "measure q[0] -> c[0];", "reset q[0];", "barrier q;",
          "if(c==1) x q[0];", "OPENQASM 3.0;", 'include "stdgates.inc";', "qubit[2] p;",
          "h q[0:9];", "{", "}", ";", "(", ")", "[", "]", ",", "//", "/*", "\x00", "\ufffd",
          "\n", "opaque o a;", "gate", "q[99]", "-", "->", "pi"]
NUMBERS = ["0", "1", "-1", "24", "40", "100000", "99999999999999999999", "1e999", "-1e999",
           "3.7", "0/0", "1e-320", "2**64"]


@st.composite
def mutated(draw):
    name, text = draw(st.sampled_from(SOURCES))
    lines = text.split("\n")
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["cut", "truncate", "duplicate", "swap", "token", "text",
                                     "number"]))
        i = draw(st.integers(0, max(len(lines) - 1, 0)))
        j = draw(st.integers(0, max(len(lines) - 1, 0)))
        if kind == "cut" and lines:
            del lines[i:i + draw(st.integers(1, 5))]
        elif kind == "truncate" and lines:
            lines = lines[:i] + [lines[i][:draw(st.integers(0, len(lines[i])))]]
        elif kind == "duplicate" and lines:
            lines.insert(j, lines[i])
        elif kind == "swap" and lines:
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "token":
            lines.insert(i, draw(st.sampled_from(TOKENS)))
        elif kind == "text":
            lines.insert(i, draw(st.text(max_size=12)))
        elif kind == "number" and lines:
            digits = [k for k, c in enumerate(lines[i]) if c.isdigit()]
            if digits:
                k = draw(st.sampled_from(digits))
                lines[i] = lines[i][:k] + draw(st.sampled_from(NUMBERS)) + lines[i][k + 1:]
    return name, "\n".join(lines)


class _CaseTimeout(KeyboardInterrupt):
    """Raised in the main thread when a case runs past ``CASE_SECONDS`` (main() -> 130)."""


def _run_bounded(argv) -> tuple:
    """``(exit code, timed out?)`` of ``main(argv)`` with a wall-clock bound."""
    timed_out = []
    use_alarm = threading.current_thread() is threading.main_thread()

    def on_alarm(signum, frame):
        timed_out.append(True)
        raise _CaseTimeout()
    if use_alarm:
        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
    try:
        code = main(argv)
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    return code, bool(timed_out)


def check_case(case, level, tmp_path_factory, capsys):
    name, text = case
    folder = tmp_path_factory.mktemp("fuzz")
    src = folder / name
    src.write_bytes(text.encode("utf-8", "surrogatepass"))
    out = folder / "out.qasm"
    out.write_text("previous output")
    capsys.readouterr()
    code, timed_out = _run_bounded(["compile", str(src), "-o", str(out), "-O", str(level)])
    captured = capsys.readouterr()
    assert not timed_out, f"case ran past {CASE_SECONDS} s:\n{text}"
    err = captured.err.strip().splitlines()
    assert code in (0, 2), f"exit {code}: {err}\n--- input ---\n{text}"
    assert len(err) <= 1 and "Traceback" not in captured.err, f"{err}\n--- input ---\n{text}"
    assert sorted(os.listdir(folder)) == sorted([name, "out.qasm"])  # no temp file left
    if code == 0:
        assert out.read_text().startswith("OPENQASM")
    else:
        assert out.read_text() == "previous output"
        assert err and err[0].startswith("qdiff: error: ")


SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)


@settings(max_examples=DEFAULT_CASES, derandomize=True, database=None, **SETTINGS)
@given(case=mutated(), level=st.integers(0, 2))
def test_fuzz_compile_contract(case, level, tmp_path_factory, capsys, monkeypatch):
    # a small memory budget: a mutation to 24+ qubits is refused (exit 2) instead of
    # verified for minutes, which is the memory guard's contract as well
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "128M")
    check_case(case, level, tmp_path_factory, capsys)


@pytest.mark.slow
@settings(max_examples=SLOW_CASES, **SETTINGS)
@given(case=mutated(), level=st.integers(0, 2))
def test_fuzz_compile_contract_long(case, level, tmp_path_factory, capsys, monkeypatch):
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "128M")
    check_case(case, level, tmp_path_factory, capsys)
