"""OpenQASM 2 and 3 input and output through Qiskit's parsers and exporters.

>>> src = 'OPENQASM 2.0; include "qelib1.inc"; qreg q[2]; h q[0]; cx q[0],q[1];'
>>> loads(src).circuit.count_ops()
{'h': 1, 'cx': 1}
"""
from __future__ import annotations

import os
import re

from qdiff.circuits import fileio, qasm_bounds
from qdiff.circuits.circuit import Circuit
from qdiff.circuits.errors import QdiffError, QdiffParseError
from qdiff.circuits.fileio import write_atomic  # noqa: F401  (qasm.write_atomic, as before)
from qdiff.circuits.qiskit_io import (QiskitImport, classical_bits, from_qiskit, import_phase,
                                      import_theta, to_qiskit)

_LINE = re.compile(r"(\d+),(\d+)")
_ANTLR_LINE = re.compile(r"L(\d+):C(\d+):")  # the OpenQASM 3 lexer's position


def qasm_version(text: str) -> int:
    """The version of the program's ``OPENQASM n`` header (comments skipped, so a comment
    mentioning another version does not count); without a header, 2 if it declares a
    ``qreg``, else 3."""
    code = qasm_bounds.strip_comments(text)
    m = re.match(r"\s*OPENQASM\s+(\d+)", code) or re.search(r"\bOPENQASM\s+(\d+)", code)
    if not m:
        return 2 if re.search(r"\bqreg\b", code) else 3
    return int(m.group(1))


def parse_qiskit(text: str, filename: str = "<string>"):
    """Parse OpenQASM 2 or 3 into a ``QuantumCircuit``; errors name the file and line.

    The input limits of :mod:`qdiff.circuits.qasm_bounds` are checked first; any failure of
    Qiskit's parsers (a Rust panic included) is one :class:`QdiffParseError`."""
    text = text.removeprefix("\ufeff")  # a UTF-8 byte order mark is no part of the program
    if not qasm_bounds.strip_comments(text).strip():
        raise QdiffParseError(f"{filename}: empty input (no OpenQASM program)")
    version = qasm_version(text)
    if version == 2:
        text = _expand_includes(text, filename)
    else:
        qasm_bounds.check_nesting(text, filename)
    qasm_bounds.check_source(text, filename)
    try:
        qc = _parse2(text) if version == 2 else _parse3(text)
        _build_definitions(qc)
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # qiskit raises parser-specific types; Rust panics too
        if _interrupted(exc):  # Ctrl-C while Qiskit's extension loads arrives wrapped
            raise KeyboardInterrupt from exc
        raise _parse_error(exc, filename, text) from None
    if qc.num_qubits > qasm_bounds.MAX_QUBITS:
        raise QdiffParseError(f"{filename}: {qc.num_qubits} qubits; the limit is "
                              f"{qasm_bounds.MAX_QUBITS}")
    return qc, version


def _build_definitions(qc) -> None:
    """Build the definitions of the file's own gates now (Qiskit's OpenQASM 2 importer builds
    each on first use), so that a call that does not fit its definition (too few parameters
    for the body) is a parse error of the file rather than a failure of a later step."""
    stack, seen = [qc], set()
    while stack:
        for inst in stack.pop().data:
            op = inst.operation
            if (type(op).__module__ or "").startswith("qiskit.qasm2") and id(op) not in seen:
                seen.add(id(op))
                try:
                    d = op.definition
                except Exception as exc:  # noqa: BLE001 (the importer's own types)
                    raise _CallError(op.name, len(op.params), exc) from exc
                if d is not None:
                    stack.append(d)


class _CallError(Exception):
    """A call of the file's gate ``name`` with ``k`` parameters whose definition failed."""

    def __init__(self, name: str, k: int, cause: BaseException):
        super().__init__(name, k, cause)
        self.name, self.k, self.cause = name, k, cause


_MISSING = re.compile(r"(\w+)\.__init__\(\) missing \d+ required positional arguments?: (.+)")
_TOO_MANY = re.compile(r"(\w+)\.__init__\(\) takes .* positional arguments? but \d+ w")


def _gate_name(cls: str) -> str:
    """The OpenQASM name of Qiskit's library gate class ``cls`` (``RXGate`` -> ``rx``)."""
    import inspect

    import qiskit.circuit.library as lib
    try:
        c = getattr(lib, cls)
        k = sum(1 for p in list(inspect.signature(c).parameters.values())
                if p.default is inspect.Parameter.empty and p.kind == p.POSITIONAL_OR_KEYWORD)
        return c(*[0.0] * k).name
    except Exception:  # noqa: BLE001 (not a library gate: its class name)
        return cls


def _parameter_message(msg: str):
    """A readable message for a gate called with the wrong number of parameters (Qiskit's
    constructors raise TypeError about their arguments), and the gate's name; None if
    ``msg`` is not one."""
    m = _MISSING.search(msg)
    if m:
        name = _gate_name(m.group(1))
        args = m.group(2).replace("'", "").replace(" and ", ", ")
        s = "s" if "," in args else ""
        return f"gate '{name}' called without its parameter{s} {args}", name
    m = _TOO_MANY.search(msg)
    if m or "label expects a string" in msg:
        name = _gate_name(m.group(1)) if m else None
        return (f"gate '{name}' called with more parameters than it takes" if name else
                "a gate called with more parameters than it takes"), name
    return None


_INCLUDE = re.compile(r'\binclude\s*"([^"]*)"\s*;')
MAX_INCLUDE_DEPTH = 16
MAX_INCLUDES = 1000  # include statements in all (each reads a file)


def _include_dirs(filename: str) -> list:
    """Where an OpenQASM 2 ``include`` is looked up: the working directory, then the
    including program's folder (the order of ``qiskit.qasm2.load``)."""
    dirs = ["."]
    if not filename.startswith("<"):
        dirs.append(os.path.dirname(os.path.abspath(filename)))
    return dirs


def _expand_includes(text: str, filename: str) -> str:
    """``text`` with every OpenQASM 2 ``include`` other than ``qelib1.inc`` replaced by the
    included program (recursively, comments removed, written on the include's line so that
    line numbers of ``text`` do not move). The included text is then under the same input
    limits as the program; a missing file, a cycle, nesting deeper than
    ``MAX_INCLUDE_DEPTH``, more than ``MAX_INCLUDES`` include statements or more than
    ``qasm_bounds.MAX_BYTES`` in all are parse errors naming the include's line."""
    budget = [qasm_bounds.MAX_BYTES - len(text), MAX_INCLUDES]
    return _expand(text, filename, _include_dirs(filename), (), budget, None)


def _expand(text, filename, dirs, chain, budget, where):
    code = qasm_bounds.strip_comments(text)
    out, pos = [], 0
    line, counted = 1, 0  # the line number at code[counted], advanced incrementally
    for m in _INCLUDE.finditer(code):
        name = m.group(1)
        if name == "qelib1.inc":
            continue
        if where is None:
            line += code.count("\n", counted, m.start())
            counted = m.start()
        at = where or f"{filename}:{line}"
        budget[1] -= 1
        if budget[1] < 0:
            raise QdiffParseError(f'{at}: include "{name}": more than {MAX_INCLUDES} includes '
                                  "in all (the limit)")
        path = next((p for p in (os.path.join(d, name) for d in dirs)
                     if os.path.exists(p) and not os.path.isdir(p)),
                    None)
        if path is None:
            raise QdiffParseError(f'{at}: include "{name}": no such file (looked in '
                                  f'{", ".join(dirs)})')
        key = os.path.realpath(path)
        if key in chain:
            raise QdiffParseError(f'{at}: include "{name}": an include cycle (the file '
                                  "includes itself)")
        if len(chain) >= MAX_INCLUDE_DEPTH:
            raise QdiffParseError(f'{at}: include "{name}": includes nested more than '
                                  f"{MAX_INCLUDE_DEPTH} deep (the limit)")
        try:
            body = fileio.read_text(path, max(budget[0], 0), path)
        except QdiffError as exc:
            raise QdiffParseError(f'{at}: include "{name}": {exc}') from None
        budget[0] -= len(body)
        body = _expand(body, filename, dirs, chain + (key,), budget, at)
        flat = qasm_bounds.strip_comments(body).replace("\r", " ").replace("\n", " ")
        out += [text[pos:m.start()], flat]
        pos = m.end()
    return "".join(out) + text[pos:] if out else text


def _interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` was caused by a KeyboardInterrupt (its cause/context chain)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


_INCLUDE_QELIB1 = re.compile(r'(?:^|[;}])\s*include\s+"qelib1\.inc"\s*;')
_GATE_NAME = re.compile(r"(?:^|[;}])\s*(?:gate|opaque)\s+([A-Za-z_]\w*)")


def _parse2(text: str):
    """OpenQASM 2 with Qiskit's library gates for ``qelib1.inc`` (and its legacy extras such
    as ``u``, ``p``, ``sx``, ``rzz``) only when the file includes it; a gate the file defines
    itself is always its own definition (``gate delay ...``, or ``h`` without the include)."""
    import qiskit.qasm2 as q2
    code = qasm_bounds.strip_comments(text)
    own = set(_GATE_NAME.findall(code))
    if not _INCLUDE_QELIB1.search(code):
        qc = q2.loads(text)  # the spec's U and CX only: an undefined gate is an error
    else:
        custom = [c for c in q2.LEGACY_CUSTOM_INSTRUCTIONS if c.name not in own]
        qc = q2.loads(text, custom_instructions=custom)
    clash = own & _reserved_names()
    return _inline(qc, clash) if clash else qc


def _reserved_names() -> set:
    """Instruction names the Qiskit importer reads by name alone (skipped or special
    instructions); a library gate's name is not one: the importer takes a file's gate of that
    name for the library gate only when its definition has the library gate's matrix."""
    from qdiff.circuits import qiskit_io
    return set(getattr(qiskit_io, "_SKIP", ())) | {
        "barrier", "delay", "measure", "reset", "unitary", "ctrl"}


def _inline(qc, names: set):
    """``qc`` with the file's own gates replaced by their definitions (recursively), so a
    gate of the file called like a library gate or instruction (``names``) is never read as
    that gate by name; an opaque one of those names is an error."""
    from qiskit.circuit import Gate
    out = qc.copy_empty_like()
    for inst in qc.data:
        op = inst.operation
        own = type(op) is Gate or (type(op).__module__ or "").startswith("qiskit.qasm2")
        # (an opaque declaration is a plain Gate; a definition is the parser's own class)
        if own and op.definition is not None:
            out.compose(_inline(op.definition, names), qubits=list(inst.qubits),
                        clbits=list(inst.clbits), inplace=True)
        elif own and op.name in names:
            raise QdiffError(f"gate '{op.name}' is declared opaque (no definition)")
        else:
            out.append(inst)
    return out


def _parse3(text: str):
    """Qiskit's OpenQASM 3 importer on an AST parsed without ANTLR's console listener, which
    would print a second, unprefixed line on stderr for every syntax error."""
    try:
        from openqasm3.parser import (BailErrorStrategy, CommonTokenStream, InputStream,
                                      QASMNodeVisitor, _RaiseOnErrorListener, qasm3Lexer,
                                      qasm3Parser)
        from qiskit_qasm3_import import convert
    except ImportError:  # another openqasm3 layout: Qiskit's own entry (ANTLR may print)
        import qiskit.qasm3 as q3
        return q3.loads(text)
    lexer = qasm3Lexer(InputStream(text))
    lexer.removeErrorListeners()
    lexer.addErrorListener(_RaiseOnErrorListener())
    parser = qasm3Parser(CommonTokenStream(lexer))
    parser.removeErrorListeners()
    parser._errHandler = BailErrorStrategy()
    return convert(QASMNodeVisitor().visitProgram(parser.program()))


def _parse_error(exc: BaseException, filename: str, text: str = "") -> QdiffParseError:
    """One line: ``file:line: message`` (the line from the message, the ANTLR token or the
    AST node being converted when the importer failed)."""
    if isinstance(exc, _CallError):
        inner = " ".join(str(exc.cause).split()).strip("'\"")
        fix = _parameter_message(inner)
        why = ("its definition uses more parameters" if "index out of range" in inner else
               f"in its definition, {fix[0]}" if fix else inner)
        calls = _calls(text, exc.name, r"[(A-Za-z_$]")
        line = f":{calls[0]}" if len(calls) == 1 else ""
        return QdiffParseError(f"{filename}{line}: gate '{exc.name}' called with {exc.k} "
                               f"parameter{'s' * (exc.k != 1)}: {why}")
    fix = _parameter_message(str(exc)) if isinstance(exc, TypeError) else None
    if fix:
        line = _node_line(exc)
        if not line and fix[1]:  # a call without parentheses, when parameters were missing
            calls = _calls(text, fix[1], r"[A-Za-z_$]" if "without" in fix[0] else r"\(")
            line = calls[0] if calls else None
        return QdiffParseError(f"{filename}{f':{line}' if line else ''}: {fix[0]}")
    if isinstance(exc, ZeroDivisionError):
        msg = "division by zero in an expression"
    elif isinstance(exc, RecursionError):
        msg = "nested too deeply for the OpenQASM 3 parser (a very long expression?)"
    elif type(exc).__name__ == "PanicException":
        msg = "the OpenQASM parser failed on this input (a number too large?)"
    else:
        msg = " ".join(str(exc).split()).strip("'\"")
        msg = "" if msg == "None" else msg  # ANTLR's bail-out exception has no message
    m = _ANTLR_LINE.match(msg) or _LINE.search(msg)
    line = f":{m.group(1)}" if m else ""
    msg = re.sub(r"^<input>:\d+,\d+:\s*|^\d+,\d+:\s*|^L\d+:C\d+:\s*", "", msg)
    if not m:
        token = _offending_token(exc)   # OpenQASM 3 syntax errors carry it in the chain
        if token is not None:
            line = f":{token.line}"
            msg = msg or f"syntax error at '{token.text}'"
        else:
            node_line = _node_line(exc)
            line = f":{node_line}" if node_line else ""
    return QdiffParseError(f"{filename}{line}: {msg or type(exc).__name__}")


def _calls(text: str, name: str, then: str) -> list:
    """Lines of the statements applying gate ``name`` followed by ``then`` (a pattern)."""
    code = qasm_bounds.strip_comments(text)
    return [_line_at(code, m.end() - 1) for m in
            re.finditer(_STATEMENT + re.escape(name) + r"\b\s*" + then, code,
                        flags=re.MULTILINE)]


def _node_line(exc: BaseException):
    """Line of the innermost OpenQASM 3 AST node on the failing call stack (None if none)."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        for value in list(tb.tb_frame.f_locals.values()):
            span = getattr(value, "span", None)
            line = getattr(span, "start_line", None)
            if isinstance(line, int) and line > 0:
                found = line
        tb = tb.tb_next
    return found


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
    """OpenQASM text -> :class:`~qdiff.circuits.qiskit_io.QiskitImport`: ``.circuit`` is the
    ``Circuit``; the import itself is accepted by ``qd.qnode(dev)(imp)``, ``qd.compile`` and
    :func:`dumps` (which keeps its parameter names, angle expressions and measurements)."""
    qc, _ = parse_qiskit(text, filename)
    try:  # dumps and compile write final measurements only: no deferred measurement here
        return from_qiskit(qc, dynamic=False)
    except QdiffError as exc:
        raise QdiffError(f"{filename}{_line_of(text, str(exc))}: {exc}") from None


_STATEMENT = r"(?:^|[;{}])\s*"  # where a statement starts
# (message key, statement pattern, whether every such statement is refused: then the first
# one is the line; otherwise a line is named only when it is the one such statement)
_CONSTRUCTS = (("classically controlled", _STATEMENT + r"(if|while|for|switch)\b", True),
               ("control flow (for_loop)", _STATEMENT + r"for\b", True),
               ("control flow (box)", _STATEMENT + r"box\b", True),
               ("reset", _STATEMENT + r"reset\b", False),
               ("mid-circuit measurement",
                _STATEMENT + r"(?:[\w\[\]:\s]*=\s*)?measure\b", False))  # OpenQASM 3: c = measure q


def _line_of(text: str, message: str) -> str:
    """':N' for the source line of the construct an import error complains about: the first
    application of an unknown gate or classical control; the only reset or measurement
    statement, if one (a reset of a fresh qubit is accepted, so the first need not be the
    one refused); for a non-finite angle, the only line calling that gate with arguments."""
    m = re.search(r"(?:gate '|\(')(\w+)' on (?:wires|qubits) .*NaN or infinite", message)
    if m:
        calls = [c.start() for c in re.finditer(rf"^\s*{m.group(1).lower()}\s*\(", text,
                                                 flags=re.MULTILINE)]
        return f":{text.count(chr(10), 0, calls[0]) + 1}" if len(calls) == 1 else ""
    code = qasm_bounds.strip_comments(text)
    m = re.search(r"unknown gate '(\w+)'", message)
    if m:  # the first statement applying it (an opaque declaration is not one)
        call = re.search(_STATEMENT + rf"{re.escape(m.group(1))}\s*[(a-zA-Z_$]", code,
                         flags=re.MULTILINE)
        return f":{_line_at(code, call.end() - 1)}" if call else ""
    for key, pattern, always in _CONSTRUCTS:
        if key in message:
            found = list(re.finditer(pattern, code, flags=re.MULTILINE))
            if found and (always or len(found) == 1):
                return f":{_line_at(code, found[0].end() - 1)}"
    return ""


def _line_at(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def read_text(path) -> str:
    """The text of an OpenQASM file, read with a cap of ``qasm_bounds.MAX_BYTES``; unreadable,
    oversized or binary files are a one-line QdiffError."""
    return fileio.read_text(path, qasm_bounds.MAX_BYTES)


def load(path) -> QiskitImport:
    """Read an OpenQASM file (``.qasm``, version detected from its header)."""
    return loads(read_text(path), os.fspath(path))


def dumps(circuit, version: int = 2, theta=None, measurements=None, num_clbits: int = 0,
          basis=None, registers=None) -> str:
    """OpenQASM text of ``circuit`` (a ``Circuit`` or a ``QiskitImport`` from :func:`loads`,
    whose parameters, expressions and measurements are written unless given here);
    ``measurements`` ``[(qubit, clbit)]`` are appended, into the classical ``registers``
    ``[(name, [clbit, ...])]`` when given and holding every clbit once (one register ``c``
    otherwise). Free parameters need ``version=3``
    (``input float[64]``) or a ``theta`` binding. ``basis`` (gate names, e.g. a compiler
    basis ``u1,u2,u3,cx``) names the one-qubit gates written: ``u3``/``u2`` for ``u`` and
    ``u1`` for ``p`` when the basis has those names and not ``u``/``p``. OpenQASM 2 has no
    global phase: version 2 is the circuit up to its phase, version 3 writes ``gphase``. The
    text ends with a newline."""
    columns, phase = None, 0.0
    free = None if not isinstance(circuit, Circuit) else circuit.num_params
    if isinstance(circuit, QiskitImport):
        imp = circuit
        circuit, phase = imp.circuit, import_phase(imp)
        free = len(imp.parameters)
        if theta is None and all(p is not None for p in imp.parameters):
            columns = imp.columns()
        if theta is not None:
            theta, values = import_theta(imp, theta, "dumps")
            phase = import_phase(imp, values)
        if measurements is None:
            if imp.num_qubits != circuit.num_wires:
                raise QdiffError("dumps: the import is a dynamic circuit run by deferred "
                                 "measurement (its classical bits are extra wires); export "
                                 "the QuantumCircuit itself (qiskit.qasm3.dumps)")
            measurements, num_clbits = imp.measurements, max(num_clbits, imp.num_clbits)
            registers = imp.registers if registers is None else registers
    elif not isinstance(circuit, Circuit):
        raise QdiffError(f"dumps: expected a Circuit or a QiskitImport; got "
                         f"{type(circuit).__name__}")
    if version == 2 and theta is None and free:
        raise QdiffError(f"dumps: OpenQASM 2 has no free parameters and the circuit has "
                         f"{free}; use version=3 or bind them with theta=")
    qc = to_qiskit(circuit, theta, columns=columns, global_phase=phase)
    if basis is not None:
        _basis_names(qc, {str(b).strip().lower() for b in basis})
    if measurements:
        bits = classical_bits(qc, registers, num_clbits, measurements)
        for q, c in measurements:
            qc.measure(q, bits[c])
    if version not in (2, 3):
        raise QdiffError(f"unsupported OpenQASM version {version} (2 or 3)")
    import qiskit.qasm2 as q2
    import qiskit.qasm3 as q3
    try:
        text = (q2 if version == 2 else q3).dumps(qc)
    except Exception as exc:  # the exporters raise their own types
        raise QdiffError(f"cannot write OpenQASM {version}: {exc}") from None
    if version == 3:  # the phase given and the one the circuit's gates gathered
        text = _with_gphase(text, qc.global_phase + _definition_phase(qc))
    return text if text.endswith("\n") else text + "\n"  # a text file ends with a newline


# gates Qiskit's OpenQASM 3 exporter writes as calls of stdgates.inc (or U), without a definition
_STDGATES = frozenset("p x y z h s sdg t tdg sx rx ry rz cx cy cz cp crx cry crz ch swap ccx cswap "
                      "cu id u1 u2 u3 u".split())


def _definition_phase(qc, standard=None):
    """The global phase Qiskit's OpenQASM 3 exporter leaves out of ``qc``: it writes every gate
    outside ``stdgates.inc`` as a ``gate ... { ... }`` body without its definition's global
    phase (``sxdg`` as ``s; h; s``, ``ecr``, ``gate unitary``), at every level of nesting. A
    float, or an expression of the circuit's parameters."""
    if standard is None:
        from qiskit.circuit.library import get_standard_gate_name_mapping
        standard = get_standard_gate_name_mapping()
    total = 0.0
    for inst in qc.data:
        op = inst.operation
        std = standard.get(op.name) if op.name in _STDGATES else None
        if std is not None and getattr(op, "base_class", type(op)) is std.base_class and \
                getattr(op, "ctrl_state", None) == getattr(std, "ctrl_state", None):
            continue
        definition = getattr(op, "definition", None)
        if definition is not None:
            total = total + definition.global_phase + _definition_phase(definition, standard)
    return total if getattr(total, "parameters", None) else float(total)


def _with_gphase(text: str, phase) -> str:
    """``text`` with a ``gphase(...)`` statement of a nonzero global ``phase`` (a float or an
    expression of the circuit's parameters) after the qubit declaration: Qiskit's OpenQASM 3
    exporter does not write the phase. The expression is written as the exporter writes a gate
    angle (the same identifiers for the parameters)."""
    if not getattr(phase, "parameters", None):
        if float(phase) == 0.0:
            return text
        expr = repr(float(phase))
    else:
        import qiskit.qasm3 as q3
        from qiskit import QuantumCircuit
        probe = QuantumCircuit(1)
        probe.rz(phase, 0)
        expr = re.search(r"^rz\((.*)\) q\[0\];$", q3.dumps(probe), re.M).group(1)
    lines = text.split("\n")
    at = max(i for i, line in enumerate(lines) if line.startswith("qubit[")) + 1
    return "\n".join(lines[:at] + [f"gphase({expr});"] + lines[at:])


def _basis_names(qc, names: set) -> None:
    """Rewrite ``u``/``p`` instructions of ``qc`` in place as ``u3``/``u2``/``u1`` when
    ``names`` has those and not ``u``/``p`` (the same matrices: U2 = U3(pi/2, ...))."""
    import math

    from qiskit.circuit.library import U1Gate, U2Gate, U3Gate
    for i, inst in enumerate(qc.data):
        g, ps = inst.operation, inst.operation.params
        new = None
        if g.name == "u" and "u" not in names:
            if "u2" in names and _is_value(ps[0], math.pi / 2):
                new = U2Gate(ps[1], ps[2])
            elif "u3" in names:
                new = U3Gate(*ps)
        elif g.name == "p" and "p" not in names and "u1" in names:
            new = U1Gate(ps[0])
        if new is not None:
            qc.data[i] = inst.replace(operation=new)


def _is_value(p, value: float) -> bool:
    try:
        return float(p) == value
    except TypeError:  # a free parameter
        return False


def dump(circuit, path, version: int = 2, *, force: bool = False, **kwargs) -> None:
    """Write OpenQASM with :func:`qdiff.circuits.fileio.write_atomic` (temp file + rename, the
    existing file's mode kept, a read-only one replaced only with ``force``)."""
    write_atomic(path, dumps(circuit, version, **kwargs), force=force)
