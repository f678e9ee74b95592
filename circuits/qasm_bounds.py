"""Limits on OpenQASM input, checked on the text before any parser or expansion runs.

A few hundred bytes of nested gate definitions can expand to billions of gates, a register
declaration can ask for 10^20 qubits, and a chain of definitions can exhaust Python's
recursion: :func:`check_source` refuses such inputs up front, in time linear in the text,
with a one-line :class:`~qdiff.circuits.errors.QdiffParseError` naming the file, the line and
the limit.

* ``MAX_BYTES``: size of a file or stream (read with this cap);
* ``MAX_QUBITS``: qubits (and, separately, classical bits) declared by registers;
* ``MAX_GATES``: gates of the program with every gate definition expanded (counted per
  definition from its body, so a definition is never expanded to be counted) and every
  modifier's expansion charged: ``pow(k)`` ``|k|`` times, ``ctrl(k)``/``negctrl(k)``
  ``CTRL_COST * k**2`` times (multi-controlled synthesis is quadratic in ``k``), a non-integer
  power ``4**n`` times on ``n`` qubits (a synthesized unitary);
* ``MAX_NESTING``: depth of gate definitions calling gate definitions.

OpenQASM 3 index ranges (``q[0:5]``) beyond a declared register are refused too (the importer
would clip them silently), and so is OpenQASM 3 text nested more than ``MAX_EXPR_DEPTH`` deep
(brackets, blocks and runs of unary operators) or a statement with more than ``MAX_EXPR_OPS``
operators (:func:`check_nesting`): the OpenQASM 3 parser recurses once per level and operator,
and a few hundred kilobytes of ``-``, ``(`` or ``1+1+...`` kept it busy for minutes before
failing.

>>> text = 'OPENQASM 2.0; include "qelib1.inc"; qreg q[2]; gate g a { h a; h a; } g q;'
>>> program_size(text)
4
"""
from __future__ import annotations

import re

from qdiff.circuits.errors import QdiffParseError

MAX_BYTES = 64 * 2 ** 20
MAX_QUBITS = 10_000
MAX_GATES = 1_000_000
MAX_NESTING = 100
MAX_EXPR_DEPTH = 32
MAX_EXPR_OPS = 200
CTRL_COST = 16  # gates per controlled gate and control**2 (Qiskit's synthesis: about 11)

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_REG2 = re.compile(r"\b(qreg|creg)\s+([A-Za-z_]\w*)\s*\[\s*(\d+)\s*\]")
_REG3 = re.compile(r"\b(qubit|bit)\s*\[\s*(\d+)\s*\]\s*([A-Za-z_]\w*)")
_REG3_ONE = re.compile(r"\b(qubit|bit)\s+([A-Za-z_]\w*)\s*[;=]")
_GATE_DEF = re.compile(r"\bgate\s+([A-Za-z_]\w*)[^{;]*\{")
_MODIFIER = re.compile(r"^\s*(inv|ctrl|negctrl|pow)\s*(?:\(\s*([^)]*?)\s*\))?\s*@")
_CALL = re.compile(r"^\s*([A-Za-z_]\w*)\s*(\((?:[^()]|\([^()]*\))*\))?\s*(.*)$", re.DOTALL)
_BRACE = re.compile(r"[{}]")
_RANGE = re.compile(r"\b([A-Za-z_]\w*)\s*\[\s*(-?\d+)\s*:\s*(-?\d+)\s*(?::\s*(-?\d+)\s*)?\]")
_NOT_GATES = frozenset(
    "OPENQASM include qreg creg qubit bit measure barrier reset if else for while def gate "
    "opaque input output const let return break continue end box delay defcal defcalgrammar "
    "cal extern int uint float angle bool complex duration stretch array pragma "
    "gphase".split())


class _Lines:
    """Offset -> 1-based line number (counted only when an error needs it)."""

    def __init__(self, text: str):
        self.text = text

    def __call__(self, offset: int) -> int:
        return self.text.count("\n", 0, offset) + 1


def strip_comments(text: str) -> str:
    """Comments replaced by spaces (newlines kept, so offsets and line numbers do not move)."""
    return _COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def check_source(text: str, filename: str = "<string>") -> None:
    """Raise :class:`QdiffParseError` if ``text`` exceeds a limit (see the module doc)."""
    code = strip_comments(text)
    line = _Lines(code)
    regs = _registers(code, filename, line)
    _check_ranges(code, regs, filename, line)
    _count(code, regs, filename, line)


_NEST = re.compile(r"[(\[{]|[)\]}]|[-+~!](?:\s*[-+~!])+")


def check_nesting(text: str, filename: str = "<string>") -> None:
    """Refuse OpenQASM 3 text with a statement of more than ``MAX_EXPR_OPS`` operators, or
    whose brackets and blocks, plus a run of unary operators at the innermost point
    (``--(-x)``), nest more than ``MAX_EXPR_DEPTH`` deep (linear time)."""
    code = strip_comments(text)
    for m in re.finditer(r"[^;{}]+", code):
        if sum(map(m.group(0).count, "+-*/%^&|<>=!~")) > MAX_EXPR_OPS:
            lead = len(m.group(0)) - len(m.group(0).lstrip())
            raise QdiffParseError(f"{filename}:{_Lines(code)(m.start() + lead)}: a statement "
                                  f"with more than {MAX_EXPR_OPS} operators (the limit)")
    depth = 0
    for m in _NEST.finditer(code):
        tok = m.group(0)
        if tok in "([{":
            depth += 1
            reached = depth
        elif tok in ")]}":
            depth = max(depth - 1, 0)
            continue
        else:
            reached = depth + sum(not c.isspace() for c in tok)
        if reached > MAX_EXPR_DEPTH:
            raise QdiffParseError(f"{filename}:{_Lines(code)(m.start())}: brackets, blocks or "
                                  f"unary operators nested more than {MAX_EXPR_DEPTH} deep "
                                  "(the limit)")


def program_size(text: str) -> int:
    """Gates of the program with every gate definition expanded (no limit applied)."""
    code = strip_comments(text)
    line = _Lines(code)
    return _count(code, _registers(code, "<string>", line), "<string>", line, limit=None)


def _registers(code: str, filename: str, line) -> dict:
    """``{name: size}`` of the declared registers; refuses totals above ``MAX_QUBITS``."""
    regs: dict = {}
    totals = {"qubit": 0, "bit": 0}
    found = [(m.start(), "qubit" if m.group(1) == "qreg" else "bit", m.group(2), m.group(3))
             for m in _REG2.finditer(code)]
    found += [(m.start(), m.group(1), m.group(3), m.group(2)) for m in _REG3.finditer(code)]
    found += [(m.start(), m.group(1), m.group(2), "1") for m in _REG3_ONE.finditer(code)]
    for start, kind, name, digits in sorted(found):
        size = int(digits) if len(digits) <= 18 else MAX_QUBITS + 1
        totals[kind] += size
        if totals[kind] > MAX_QUBITS:
            what = "qubits" if kind == "qubit" else "classical bits"
            raise QdiffParseError(f"{filename}:{line(start)}: register '{name}' of size {digits} "
                                  f"brings the program above the limit of {MAX_QUBITS} {what}")
        regs[name] = size
    return regs


def _check_ranges(code: str, regs: dict, filename: str, line) -> None:
    """OpenQASM 3 ranges ``r[a:b]`` / ``r[a:s:b]`` (inclusive) must lie inside register ``r``."""
    for m in _RANGE.finditer(code):
        name = m.group(1)
        if name not in regs:
            continue
        size = regs[name]
        ends = (int(m.group(2)), int(m.group(4) if m.group(4) is not None else m.group(3)))
        for i in ends:
            if not -size <= i < size:
                raise QdiffParseError(f"{filename}:{line(m.start())}: {m.group(0)}: index {i} "
                                      f"is out of range for register '{name}' of size {size}")


def _definitions(code: str):
    """``(name, start, body, end)`` of every gate definition, in order."""
    out = []
    pos = 0
    while True:
        m = _GATE_DEF.search(code, pos)
        if m is None:
            return out
        depth, i = 1, m.end()
        while depth:
            b = _BRACE.search(code, i)
            if b is None:
                i = len(code) + 1
                break
            depth += 1 if b.group(0) == "{" else -1
            i = b.end()
        out.append((m.group(1), m.start(), code[m.end():i - 1], i))
        pos = i


def _statement_cost(stmt: str, sizes: dict, regs: dict):
    """``(gates, callee)`` of one statement: a gate call's expanded size times its
    broadcast over whole registers and its modifiers' expansion (``pow(k)``: ``|k|``; a
    non-integer power: ``4**qubits``, the size of a synthesized unitary; ``k`` controls:
    ``CTRL_COST * k**2``); ``(0, None)`` otherwise."""
    factor, controls, unitary = 1, 0, False
    while True:
        m = _MODIFIER.match(stmt)
        if m is None:
            break
        kind, arg = m.group(1), m.group(2)
        if kind == "pow":
            try:
                value = float(arg or 1)
                if value.is_integer():
                    factor *= max(1, abs(int(value)))
                else:
                    unitary = True
            except (ValueError, OverflowError):
                unitary = True  # a symbolic or malformed power: at worst a unitary
        elif kind in ("ctrl", "negctrl"):
            try:
                controls += max(1, int(arg or 1))
            except (ValueError, OverflowError):
                controls += 1  # not an integer literal: the importer refuses it
        stmt = stmt[m.end():]
    m = _CALL.match(stmt)
    if m is None or m.group(1) in _NOT_GATES:
        return 0, None
    rest = m.group(3)
    if "=" in rest or "->" in rest:
        return 0, None
    width = 1
    args = rest.split(",")
    for arg in args:
        arg = arg.strip()
        if arg in regs:
            width = max(width, regs[arg])
    if controls:
        factor *= CTRL_COST * min(controls, MAX_QUBITS) ** 2
    if unitary:
        factor *= 4 ** min(len(args), 20)
    return sizes.get(m.group(1), 1) * width * factor, m.group(1)


def _count(code: str, regs: dict, filename: str, line, limit=MAX_GATES) -> int:
    sizes: dict = {}
    depth: dict = {}
    spans = []
    for name, start, body, end in _definitions(code):
        total, deepest = 0, 0
        for stmt in body.split(";"):
            cost, callee = _statement_cost(stmt, sizes, {})
            total += cost
            deepest = max(deepest, depth.get(callee, 0))
        sizes[name], depth[name] = total, deepest + 1
        if depth[name] > MAX_NESTING:
            raise QdiffParseError(f"{filename}:{line(start)}: gate '{name}': definitions nested "
                                  f"more than {MAX_NESTING} deep (the limit)")
        spans.append((start, end))
    total = 0
    for start, stmt in _main_statements(code, spans):
        total += _statement_cost(stmt, sizes, regs)[0]
        if limit is not None and total > limit:
            raise QdiffParseError(f"{filename}:{line(start)}: the program expands to more than "
                                  f"{limit} gates (the limit) with its gate definitions and "
                                  "modifiers expanded")
    return total


def _main_statements(code: str, spans: list):
    """``(offset, text)`` of the statements outside gate definitions."""
    pos = 0
    for start, end in spans + [(len(code), len(code))]:
        for m in re.finditer(r"[^;{}]+", code[pos:start]):
            lead = len(m.group(0)) - len(m.group(0).lstrip())
            yield pos + m.start() + lead, m.group(0)
        pos = end
