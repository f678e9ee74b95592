"""Bounded OpenQASM input and one-line parse errors (qdiff.circuits.qasm_bounds, qasm)."""
from __future__ import annotations

import re

import pytest

from qdiff.circuits import qasm, qasm_bounds
from qdiff.circuits.errors import QdiffError, QdiffParseError

H2 = 'OPENQASM 2.0;\ninclude "qelib1.inc";\n'
H3 = 'OPENQASM 3.0;\ninclude "stdgates.inc";\n'


def nested(levels: int) -> str:
    """``gate g<levels>`` expands to 2**(levels+1) gates: a few hundred bytes of text."""
    lines = [H2 + "gate g0 a { x a; x a; }"]
    lines += [f"gate g{i} a {{ g{i - 1} a; g{i - 1} a; }}" for i in range(1, levels + 1)]
    return "\n".join(lines + ["qreg q[1];", f"g{levels} q[0];", ""])


def chained(depth: int) -> str:
    lines = [H2 + "gate c0 a { x a; }"]
    lines += [f"gate c{i} a {{ c{i - 1} a; }}" for i in range(1, depth)]
    return "\n".join(lines + ["qreg q[1];", f"c{depth - 1} q[0];", ""])


def test_expansion_is_counted_without_expanding():
    assert qasm_bounds.program_size(nested(3)) == 16
    text = H2 + "qreg q[5];\ngate g a, b { cx a, b; h a; }\ng q[0], q[1];\nh q;\n" \
        "pow(3) @ x q[0];\n"
    assert qasm_bounds.program_size(text) == 2 + 5 + 3


def test_doubly_nested_gate_definitions_refused_up_front():
    """772 bytes expanding to 2**26 gates took 127 s and 7.9 GB before a MemoryError."""
    text = nested(25)
    assert len(text) < 800
    with pytest.raises(QdiffParseError, match=rf"bomb.qasm:30: the program expands to more "
                                              rf"than {qasm_bounds.MAX_GATES} gates"):
        qasm.loads(text, "bomb.qasm")


def test_chained_gate_definitions_refused_by_nesting_limit():
    """2000 chained definitions raised RecursionError (a traceback, exit 1)."""
    with pytest.raises(QdiffParseError, match=rf"chain.qasm:{qasm_bounds.MAX_NESTING + 3}: gate "
                                              rf"'c{qasm_bounds.MAX_NESTING}': definitions nested"):
        qasm.loads(chained(2000), "chain.qasm")
    assert qasm.loads(chained(50)).circuit.count_ops() == {"x": 1}


@pytest.mark.parametrize("size", ["100000", "99999999999999999999"])
def test_register_size_limit(size):
    """``qreg q[99999999999999999999]`` made Qiskit's Rust parser panic (a BaseException)."""
    with pytest.raises(QdiffParseError, match=rf"big.qasm:3: register 'q' of size {size} brings "
                                              rf"the program above the limit of 10000 qubits"):
        qasm.loads(H2 + f"qreg q[{size}];\nh q[0];\n", "big.qasm")


def test_rust_panic_in_the_parser_is_a_parse_error(monkeypatch):
    """A panic that gets past the text checks is still one QdiffParseError."""
    panic = type("PanicException", (BaseException,), {})

    def boom(text):
        raise panic("called `Result::unwrap()` on an `Err` value")
    monkeypatch.setattr(qasm, "_parse2", boom)
    with pytest.raises(QdiffParseError, match="p.qasm: the OpenQASM parser failed"):
        qasm.loads(H2 + "qreg q[1];\n", "p.qasm")


def test_file_size_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(qasm_bounds, "MAX_BYTES", 100)
    path = tmp_path / "long.qasm"
    path.write_text(H2 + "qreg q[1];\n" + "h q[0];\n" * 20)
    with pytest.raises(QdiffError, match=r"long.qasm: larger than the input limit of 100 bytes"):
        qasm.load(path)


@pytest.mark.parametrize("text", ["", "   \n", "// only a comment\n"])
def test_empty_input_is_named(text):
    """Used to be "'NoneType' object has no attribute 'line'"."""
    with pytest.raises(QdiffParseError, match=r"^e.qasm: empty input \(no OpenQASM program\)$"):
        qasm.loads(text, "e.qasm")


def test_qasm3_division_by_zero_names_the_line():
    with pytest.raises(QdiffParseError, match=r"^z.qasm:4: division by zero in an expression$"):
        qasm.loads(H3 + "qubit[1] q;\nrz(0/0) q[0];\n", "z.qasm")


def test_qasm3_index_error_names_the_line():
    with pytest.raises(QdiffParseError, match=r"^i.qasm:4: "):
        qasm.loads(H3 + "qubit[2] q;\nh q[5];\n", "i.qasm")


def test_qasm3_syntax_error_is_one_line_of_ours(capfd):
    """ANTLR's console listener printed 'line 4:5 no viable alternative ...' before ours."""
    with pytest.raises(QdiffParseError, match=r"^s.qasm:4: syntax error at ';'$"):
        qasm.loads(H3 + "qubit[2] q;\nh q[0;\n", "s.qasm")
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""


@pytest.mark.parametrize("body,bad", [("h q[0:5];", "q[0:5]: index 5"),
                                      ("h q[-3:1];", "q[-3:1]: index -3"),
                                      ("h q[0:1:7];", "q[0:1:7]: index 7")])
def test_qasm3_range_beyond_register_is_refused_not_clipped(body, bad):
    with pytest.raises(QdiffParseError, match=rf"r.qasm:4: {re.escape(bad)} is out of range for "
                                              r"register 'q' of size 2"):
        qasm.loads(H3 + "qubit[2] q;\n" + body + "\n", "r.qasm")
    ok = qasm.loads(H3 + "qubit[2] q;\nh q[0:1];\n").circuit
    assert ok.count_ops() == {"h": 2}


@pytest.mark.parametrize("expr", ["1e999", "exp(1000)", "-1e400"])
def test_non_finite_angle_is_named_with_its_line(expr):
    with pytest.raises(QdiffError, match=r"^f.qasm:5: instruction \d+ \('rz' on qubits \[0\]\): angle -?inf is "
                                         r"NaN or infinite$"):
        qasm.loads(H2 + f"qreg q[1];\nh q[0];\nrz({expr}) q[0];\n", "f.qasm")


def test_benchmark_sized_inputs_are_within_the_limits():
    text = H2 + "qreg q[16];\n" + "cx q[0],q[1];\nrz(0.1) q[2];\n" * 5000
    assert qasm_bounds.program_size(text) == 10000
    qasm_bounds.check_source(text)


def test_modifiers_are_charged_their_expansion():
    """ctrl(k) @ g expands to about 11 k**2 gates under Qiskit's multi-controlled synthesis,
    a non-integer power to a synthesized unitary."""
    text = H3 + "qubit[3] q;\nctrl @ x q[0], q[1];\nctrl(2) @ h q[0], q[1], q[2];\n" \
        "negctrl(2) @ x q[0], q[1], q[2];\npow(0.5) @ cx q[0], q[1];\npow(2) @ inv @ x q[0];\n"
    c = qasm_bounds.CTRL_COST
    assert qasm_bounds.program_size(text) == c + 4 * c + 4 * c + 16 + 2
    from qdiff.circuits import Circuit  # noqa: F401  (the charge bounds the real expansion)
    from qdiff.compiler.lower import lower
    for k in (1, 3, 6):
        src = H3 + f"qubit[{k + 1}] q;\nctrl({k}) @ x " + \
            ", ".join(f"q[{i}]" for i in range(k + 1)) + ";\n"
        assert len(lower(qasm.loads(src).circuit).operations) <= qasm_bounds.program_size(src)


def test_many_controls_are_refused_up_front():
    """8 KB: ctrl(999) @ x on 1000 qubits would expand to ~10^7 gates (minutes, GBs)."""
    n = 1000
    text = H3 + f"qubit[{n}] q;\nctrl({n - 1}) @ x " + \
        ", ".join(f"q[{i}]" for i in range(n)) + ";\n"
    with pytest.raises(QdiffParseError, match=rf"mcx.qasm:4: the program expands to more than "
                                              rf"{qasm_bounds.MAX_GATES} gates"):
        qasm.loads(text, "mcx.qasm")


@pytest.mark.parametrize("expr", ["-" * 20000 + "1", "(" * 20000 + "1" + ")" * 20000,
                                  "~" * 20000 + "1", "1+" * 20000 + "1",
                                  "-(" * 40 + "1" + ")" * 40])
def test_qasm3_deep_or_long_expressions_refused_up_front(expr):
    """The OpenQASM 3 parser recurses per nesting level and operator: 300 KB of ``-`` took a
    minute before a recursion error; such text is refused at once, naming the line."""
    import time
    t0 = time.perf_counter()
    with pytest.raises(QdiffParseError, match=r"^e.qasm:4: .*(nested more than|more than "
                                              r"\d+ operators)"):
        qasm.loads(H3 + f"qubit[1] q;\nrz({expr}) q[0];\n", "e.qasm")
    assert time.perf_counter() - t0 < 1.0


def test_qasm3_expressions_within_the_limits_load():
    depth, ops = qasm_bounds.MAX_EXPR_DEPTH, qasm_bounds.MAX_EXPR_OPS
    imp = qasm.loads(H3 + "qubit[1] q;\nrz(" + "(" * (depth - 1) + "0.5" + ")" * (depth - 1)
                     + ") q[0];\nrx(" + "+".join(["0.001"] * ops) + ") q[0];\n")
    assert [o.name for o in imp.circuit.operations] == ["rz", "rx"]
    assert abs(float(imp.circuit.operations[1].params[0]) - 0.001 * ops) < 1e-12


@pytest.mark.parametrize("header", [H2 + "qreg q[2];\n", H3 + "qubit[2] q;\n"])
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_byte_order_mark_and_crlf_load_as_the_plain_text(tmp_path, header, newline):
    """A UTF-8 byte order mark (as Windows editors write) is no part of the program; CRLF
    line ends read as LF."""
    text = header + "h q[0];\ncx q[0], q[1];\nrz(0.25) q[1];\n"
    plain = qasm.loads(text)
    path = tmp_path / "bom.qasm"
    path.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", newline).encode())
    imp = qasm.load(str(path))
    def ops(c):
        return [(o.name, o.wires, tuple(float(p) for p in o.params)) for o in c.operations]
    assert ops(imp.circuit) == ops(plain.circuit) == [("h", (0,), ()), ("cx", (0, 1), ()),
                                                      ("rz", (1,), (0.25,))]


def test_qasm3_lexer_error_names_the_line():
    with pytest.raises(QdiffParseError, match=r"^lex.qasm:4: token recognition error at: '\$"):
        qasm.loads(H3 + "qubit[1] q;\nh q[0] $;\n", "lex.qasm")


def test_circuit_wider_than_the_target_device_is_named(tmp_path, capsys):
    """Qiskit's layout pass raised TranspilerError 'Number of qubits greater than device.'
    (a traceback from qd.compile; exit 3 from the CLI)."""
    import qdiff as qd
    from qdiff.cli import main
    from qdiff.circuits import Circuit
    from qdiff.compiler.ops import op
    with pytest.raises(QdiffError, match=r"^target 'fake_manila' has 5 qubits; the circuit "
                                         r"has 6$"):
        qd.compile(Circuit(6, (op("h", (0,)), op("cx", (0, 5)))), verify="none",
                   target="fake_manila")
    src = tmp_path / "w6.qasm"
    src.write_text(H2 + "qreg q[6];\nh q[0];\ncx q[0],q[5];\n")
    assert main(["compile", str(src), "--target", "fake_manila", "-o",
                 str(tmp_path / "o.qasm")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fake_manila' has 5 qubits" in err[0]


def test_drawing_is_linear_in_the_number_of_gates():
    """Each gate re-joined every wire's text drawn so far: 10**5 gates took minutes."""
    import time
    from qdiff.circuits import Circuit
    from qdiff.compiler.ops import op
    from qdiff.draw import draw_circuit
    c = Circuit(3, tuple(op("h", (i % 3,)) if i % 5 else op("cx", (0, 2))
                         for i in range(50_000)))
    t0 = time.perf_counter()
    text = draw_circuit(c)
    assert time.perf_counter() - t0 < 5.0
    rows = text.splitlines()
    assert len(rows) == 3 and len({len(r) for r in rows}) == 1
    assert rows[1].count("│") == 10_000 and rows[0].count("╭") == 10_000
