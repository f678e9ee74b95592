"""OpenQASM 2 and 3 input and output through Qiskit's parsers and exporters.

>>> src = 'OPENQASM 2.0; include "qelib1.inc"; qreg q[2]; h q[0]; cx q[0],q[1];'
>>> loads(src).circuit.count_ops()
{'h': 1, 'cx': 1}
"""
from __future__ import annotations

import os
import re

from qdiff.circuits.errors import QdiffError, QdiffParseError
from qdiff.circuits.qiskit_io import QiskitImport, from_qiskit, to_qiskit

_LINE = re.compile(r"(\d+),(\d+)")


def qasm_version(text: str) -> int:
    m = re.search(r"OPENQASM\s+(\d+)", text)
    if not m:
        return 2 if "qreg" in text else 3
    return int(m.group(1))


def parse_qiskit(text: str, filename: str = "<string>"):
    """Parse OpenQASM 2 or 3 into a ``QuantumCircuit``; errors name the file and line."""
    version = qasm_version(text)
    try:
        if version == 2:
            import qiskit.qasm2 as q2
            return q2.loads(text, custom_instructions=q2.LEGACY_CUSTOM_INSTRUCTIONS), 2
        import qiskit.qasm3 as q3
        return q3.loads(text), 3
    except Exception as exc:  # qiskit raises several parser-specific types
        msg = str(exc).strip().strip("'\"")
        m = _LINE.search(msg)
        line = f":{m.group(1)}" if m else ""
        msg = re.sub(r"^<input>:\d+,\d+:\s*|^\d+,\d+:\s*", "", msg)
        if not m:
            token = _offending_token(exc)   # OpenQASM 3 syntax errors carry it in the chain
            if token is not None:
                line = f":{token.line}"
                msg = msg or f"syntax error at '{token.text}'"
        raise QdiffParseError(f"{filename}{line}: {msg or type(exc).__name__}") from None


def _offending_token(exc):
    """The ANTLR token an OpenQASM 3 syntax error stopped at (None if not found)."""
    seen = 0
    while exc is not None and seen < 10:
        for a in (exc, *getattr(exc, "args", ())):
            tok = getattr(a, "offendingToken", None)
            if tok is not None and getattr(tok, "line", None):
                return tok
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def loads(text: str, filename: str = "<string>") -> QiskitImport:
    """OpenQASM text -> :class:`~qdiff.circuits.qiskit_io.QiskitImport`."""
    qc, _ = parse_qiskit(text, filename)
    try:
        return from_qiskit(qc)
    except QdiffError as exc:
        raise QdiffError(f"{filename}{_line_of(text, str(exc))}: {exc}") from None


_CONSTRUCTS = (("classically controlled", r"^\s*(if|while|for|switch)\b"),
               ("reset", r"^\s*reset\b"), ("mid-circuit measurement", r"^\s*measure\b"))


def _line_of(text: str, message: str) -> str:
    """':N' for the first source line with the construct an import error complains about."""
    for key, pattern in _CONSTRUCTS:
        if key in message:
            m = re.search(pattern, text, flags=re.MULTILINE)
            if m:
                return f":{text.count(chr(10), 0, m.start()) + 1}"
    return ""


def read_text(path) -> str:
    """The text of an OpenQASM file; unreadable or binary files are a one-line QdiffError."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise QdiffError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise QdiffParseError(f"{path}: not a text file") from None


def load(path) -> QiskitImport:
    """Read an OpenQASM file (``.qasm``, version detected from its header)."""
    return loads(read_text(path), os.fspath(path))


def dumps(circuit, version: int = 2, theta=None, measurements=None, num_clbits: int = 0) -> str:
    """OpenQASM text of ``circuit``; ``measurements`` ``[(qubit, clbit)]`` are appended."""
    qc = to_qiskit(circuit, theta)
    if measurements:
        from qiskit import ClassicalRegister
        creg = ClassicalRegister(max(num_clbits, 1 + max(c for _, c in measurements)), "c")
        qc.add_register(creg)
        for q, c in measurements:
            qc.measure(q, creg[c])
    if version == 2:
        import qiskit.qasm2 as q2
        return q2.dumps(qc)
    if version == 3:
        import qiskit.qasm3 as q3
        return q3.dumps(qc)
    raise QdiffError(f"unsupported OpenQASM version {version} (2 or 3)")


def dump(circuit, path, version: int = 2, **kwargs) -> None:
    """Write OpenQASM atomically (temp file + rename): a failure never leaves a partial file."""
    text = dumps(circuit, version, **kwargs)
    write_atomic(path, text)


def write_atomic(path, text: str) -> None:
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise QdiffError(f"{path}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
