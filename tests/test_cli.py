"""The ``qdiff compile`` command through ``main([...])``: outputs, reports, exit codes."""
import io
import json
import os

import pytest

from qdiff.cli import main
from qdiff.circuits import qasm

GOOD = """OPENQASM 2.0;
include "qelib1.inc";
qreg q[3];
creg c[3];
h q[0];
cx q[0],q[1];
cx q[0],q[1];
ccx q[0],q[1],q[2];
t q[2];
tdg q[2];
measure q -> c;
"""


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def one_line_error(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("qdiff: error: ") and "Traceback" not in err[0]
    return err[0]


def test_compile_file_to_file_keeps_measurements(tmp_path, capsys):
    src = write(tmp_path, "in.qasm", GOOD)
    out = str(tmp_path / "out.qasm")
    assert main(["compile", src, "-o", out, "-O", "2"]) == 0
    imp_in, imp_out = qasm.load(src), qasm.load(out)
    assert imp_out.measurements == imp_in.measurements and imp_out.num_clbits == 3
    from qdiff.compiler import equivalence
    assert equivalence(imp_in.circuit, imp_out.circuit, "unitary").ok
    table = capsys.readouterr().out
    assert "CX in" in table and "yes (unitary)" in table


def test_stdout_and_stdin(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(GOOD))
    assert main(["compile", "-", "--basis", "rz,sx,x,cx"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("OPENQASM 2.0;") and "sx" in captured.out
    assert "<stdin>" in captured.err  # the report goes to stderr when QASM goes to stdout


def test_qasm3_in_qasm3_out(tmp_path, capsys):
    src = write(tmp_path, "in3.qasm", 'OPENQASM 3.0;\ninclude "stdgates.inc";\nqubit[2] q;\n'
                                      'h q[0];\ncx q[0], q[1];\ncx q[0], q[1];\n')
    out = str(tmp_path / "out3.qasm")
    assert main(["compile", src, "-o", out]) == 0
    text = open(out).read()
    assert text.startswith("OPENQASM 3.0;") and "cx" not in text


def test_directory_json_report_and_out_dir(tmp_path, capsys):
    d = tmp_path / "circs"
    d.mkdir()
    write(d, "a.qasm", GOOD)
    write(d, "b.qasm", GOOD.replace("ccx q[0],q[1],q[2];", "swap q[0],q[2];"))
    outd = tmp_path / "outs"
    outd.mkdir()
    assert main(["compile", str(d), "--out-dir", str(outd), "--report", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert [os.path.basename(r["name"]) for r in rep] == ["a.qasm", "b.qasm"]
    assert all(r["verified"] and r["cx_after"] <= r["cx_before"] for r in rep)
    assert sorted(os.listdir(outd)) == ["a.qasm", "b.qasm"]


def test_summary_table_has_total_row(tmp_path, capsys):
    d = tmp_path / "circs"
    d.mkdir()
    write(d, "a.qasm", GOOD)
    write(d, "b.qasm", GOOD)
    assert main(["compile", str(d)]) == 0
    assert "TOTAL" in capsys.readouterr().out


@pytest.mark.parametrize("text,needle", [
    ("OPENQASM 2.0;\ninclude \"qelib1.inc\";\nqreg q[2];\nh q[0]\ncx q[0],q[1];\n", ":5:"),
    ("OPENQASM 2.0;\ninclude \"qelib1.inc\";\nqreg q[2];\nfoo q[0];\n", ":4:"),
    ("OPENQASM 2.0;\ninclude \"qelib1.inc\";\nqreg q[2];\ncreg c[2];\nmeasure q[0] -> c[0];\n"
     "if (c==1) x q[1];\n", ":6:"),
    ("OPENQASM 2.0;\ninclude \"qelib1.inc\";\nqreg q[1];\ncreg c[1];\nh q[0];\nreset q[0];\n",
     ":6:"),
])
def test_bad_qasm_exit_2_one_line_with_line_number(tmp_path, capsys, text, needle):
    src = write(tmp_path, "bad.qasm", text)
    assert main(["compile", src]) == 2
    line = one_line_error(capsys)
    assert "bad.qasm" + needle in line


def test_unknown_gate_message_names_gate(tmp_path, capsys):
    src = write(tmp_path, "bad.qasm", "OPENQASM 2.0;\ninclude \"qelib1.inc\";\nqreg q[2];\n"
                                      "frobnicate q[0];\n")
    assert main(["compile", src]) == 2
    assert "frobnicate" in one_line_error(capsys)


def test_missing_and_unreadable_files(tmp_path, capsys):
    assert main(["compile", str(tmp_path / "nope.qasm")]) == 2
    assert "nope.qasm: cannot read" in one_line_error(capsys)
    binary = tmp_path / "bin.qasm"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    assert main(["compile", str(binary)]) == 2
    assert "bin.qasm" in one_line_error(capsys)


def test_unwritable_output(tmp_path, capsys):
    src = write(tmp_path, "in.qasm", GOOD)
    assert main(["compile", src, "-o", str(tmp_path / "no_such_dir" / "out.qasm")]) == 2
    assert "cannot write" in one_line_error(capsys)


def test_bad_options_exit_2(tmp_path, capsys):
    src = write(tmp_path, "in.qasm", GOOD)
    assert main(["compile", src, "--basis", "rz,sx"]) == 2
    assert "two-qubit" in one_line_error(capsys)
    assert main(["compile", src, src, "-o", str(tmp_path / "x.qasm")]) == 2
    assert "--out-dir" in one_line_error(capsys)
    assert main(["compile", src, "-O", "7"]) == 2
    one_line_error(capsys)
    assert main([]) == 2
    one_line_error(capsys)


def test_verification_failure_exit_1_writes_nothing(tmp_path, capsys, monkeypatch):
    from qdiff.compiler import api
    from qdiff.compiler.verify import Verdict
    monkeypatch.setattr(api, "equivalence", lambda *a, **k: Verdict(False, "unitary", 0.5))
    src = write(tmp_path, "in.qasm", GOOD)
    out = tmp_path / "out.qasm"
    out.write_text("previous content")
    assert main(["compile", src, "-o", str(out)]) == 1
    assert out.read_text() == "previous content"
    assert "not equivalent" in capsys.readouterr().err


def test_ctrl_c_during_write_leaves_no_partial_file(tmp_path, capsys, monkeypatch):
    src = write(tmp_path, "in.qasm", GOOD)
    out = tmp_path / "out.qasm"
    out.write_text("previous content")

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(os, "replace", interrupted)
    assert main(["compile", src, "-o", str(out)]) == 130
    assert out.read_text() == "previous content"
    assert sorted(os.listdir(tmp_path)) == ["in.qasm", "out.qasm"]  # no temp file left


def test_console_script_declared():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest's own TOML reader
        import tomli as tomllib
    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as fh:
        meta = tomllib.load(fh)
    assert meta["project"]["scripts"]["qdiff"] == "qdiff._console:main"


def test_level3_and_target_through_main(tmp_path, capsys):
    src = write(tmp_path, "fredkin.qasm", "OPENQASM 2.0;\ninclude \"qelib1.inc\";\nqreg q[3];\n"
                                          "cswap q[0],q[1],q[2];\n")
    out = str(tmp_path / "o.qasm")
    assert main(["compile", src, "-O", "3", "-o", out, "--report", "json",
                 "--time-limit", "10"]) == 0
    rep = json.loads(capsys.readouterr().out)[0]
    assert rep["verified"] and rep["cx_after"] <= 7 < rep["cx_before"]
    assert main(["compile", src, "--target", "fake_torino", "-o", out]) == 0
    text = open(out).read()
    assert "cz " in text and "cx " not in text
    assert main(["compile", src, "--target", "nowhere"]) == 2
    assert "unknown target device" in one_line_error(capsys)


def test_console_script_runs(tmp_path):
    import shutil
    import subprocess
    exe = shutil.which("qdiff") or os.path.join(os.path.dirname(os.sys.executable), "qdiff")
    if not os.path.exists(exe):
        pytest.skip("console script not installed")
    src = write(tmp_path, "in.qasm", GOOD)
    res = subprocess.run([exe, "compile", src, "-o", str(tmp_path / "o.qasm")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and os.path.exists(tmp_path / "o.qasm")
    res = subprocess.run([exe, "compile", str(tmp_path / "missing.qasm")], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().count("\n") == 0


def test_qasm2_in_qasm3_out_keeps_measurements(tmp_path, capsys):
    src = write(tmp_path, "in.qasm", GOOD)
    out = str(tmp_path / "o3.qasm")
    assert main(["compile", src, "-o", out, "--qasm-version", "3"]) == 0
    text = open(out).read()
    assert text.startswith("OPENQASM 3.0;")
    imp = qasm.load(out)
    assert imp.measurements == qasm.load(src).measurements


PARAMETRIC3 = """OPENQASM 3.0;
include "stdgates.inc";
input float[64] alpha;
input float[64] beta;
qubit[2] q;
rz(alpha) q[0];
cx q[0],q[1];
rx(2*beta+1) q[1];
rz(alpha*beta) q[1];
"""


@pytest.mark.parametrize("level", [0, 2])
def test_parametric_qasm3_keeps_input_names_and_expressions(tmp_path, level):
    from qiskit import qasm3
    from qiskit.quantum_info import Operator
    src = write(tmp_path, "in.qasm", PARAMETRIC3)
    out = str(tmp_path / "out.qasm")
    assert main(["compile", src, "-o", out, "-O", str(level)]) == 0
    a, b = qasm3.loads(PARAMETRIC3), qasm3.loads(open(out).read())
    assert sorted(p.name for p in b.parameters) == ["alpha", "beta"]
    for vals in ({"alpha": 0.3, "beta": 0.5}, {"alpha": -1.1, "beta": 2.0}):
        bind = lambda qc: qc.assign_parameters({p: vals[p.name] for p in qc.parameters})  # noqa
        assert Operator(bind(a)).equiv(Operator(bind(b)))


def test_parametric_circuit_to_qasm2_is_refused_before_compiling(tmp_path, capsys):
    src = write(tmp_path, "in.qasm", PARAMETRIC3)
    out = tmp_path / "out.qasm"
    assert main(["compile", src, "-o", str(out), "--qasm-version", "2"]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and "--qasm-version 2" in err[0] and "alpha, beta" in err[0]
    assert not out.exists() and "CX in" not in cap.out


U_GATES = """OPENQASM 2.0;
include "qelib1.inc";
qreg q[2];
u3(0.1,0.2,0.3) q[0];
u2(0.1,0.2) q[1];
u1(0.4) q[1];
cx q[0],q[1];
h q[1];
"""


@pytest.mark.parametrize("basis", ["u1,u2,u3,cx", "u3,cx"])
@pytest.mark.parametrize("level", ["0", "2"])
@pytest.mark.parametrize("version", ["2", "3"])
def test_u1_u2_u3_basis_names_are_written(tmp_path, basis, level, version):
    """The output uses the basis's own names: a strict OpenQASM 2 parser (qelib1.inc, no
    `u`) reads it."""
    from qiskit import qasm2, qasm3
    from qiskit.quantum_info import Operator
    src = write(tmp_path, "in.qasm", U_GATES)
    out = str(tmp_path / "out.qasm")
    assert main(["compile", src, "-o", out, "-O", level, "--basis", basis,
                 "--qasm-version", version]) == 0
    text = open(out).read()
    qc = qasm2.loads(text) if version == "2" else qasm3.loads(text)
    assert set(qc.count_ops()) <= set(basis.split(","))
    assert Operator(qc).equiv(Operator(qasm2.loads(U_GATES)))


@pytest.mark.parametrize("version", ["2", "3"])
def test_outputs_end_with_a_newline(tmp_path, capsys, version):
    src = write(tmp_path, "in.qasm", GOOD)
    out = tmp_path / "out.qasm"
    assert main(["compile", src, "-o", str(out), "--qasm-version", version]) == 0
    assert out.read_text().endswith(";\n")
    capsys.readouterr()
    assert main(["compile", src, "-o", "-", "--qasm-version", version]) == 0
    assert capsys.readouterr().out.endswith(";\n")
    qasm.dump(qasm.load(src), tmp_path / "d.qasm", int(version))
    assert (tmp_path / "d.qasm").read_text().endswith(";\n")
