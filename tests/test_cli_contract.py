"""The CLI's exit-code contract for every input: 0 ok, 1 verification failed, 2 bad input,
3 internal error, 130 interrupted; one stderr line, never a traceback; batches compile every
file; outputs are safe (atomic, symlink-safe, read-only kept unless --force)."""
from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import time

import pytest

from qdiff.cli import main

H2 = 'OPENQASM 2.0;\ninclude "qelib1.inc";\n'
H3 = 'OPENQASM 3.0;\ninclude "stdgates.inc";\n'
GOOD = H2 + "qreg q[2];\nh q[0];\ncx q[0],q[1];\ncx q[0],q[1];\n"


def write(folder, name, text):
    p = folder / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return str(p)


def err_lines(capsys) -> list:
    err = capsys.readouterr().err.strip().splitlines()
    assert all("Traceback" not in line for line in err)
    return err


def nested_bomb() -> str:
    lines = [H2 + "gate g0 a { x a; x a; }"]
    lines += [f"gate g{i} a {{ g{i - 1} a; g{i - 1} a; }}" for i in range(1, 26)]
    return "\n".join(lines + ["qreg q[1];", "g25 q[0];", ""])


def chain(depth=2000) -> str:
    lines = [H2 + "gate c0 a { x a; }"] + [f"gate c{i} a {{ c{i - 1} a; }}"
                                             for i in range(1, depth)]
    return "\n".join(lines + ["qreg q[1];", f"c{depth - 1} q[0];", ""])


BAD_INPUTS = {
    "rz_1e999": (H2 + "qreg q[1];\nrz(1e999) q[0];\n", "bad.qasm:4: instruction 0 ('rz'"),
    "exp_1000": (H2 + "qreg q[1];\nrz(exp(1000)) q[0];\n", "bad.qasm:4: instruction 0 ('rz'"),
    "qreg_100000": (H2 + "qreg q[100000];\nh q[0];\n", "bad.qasm:3: register 'q' of size 100000"),
    "qreg_rust_panic": (H2 + "qreg q[99999999999999999999];\nh q[0];\n", "bad.qasm:3: register"),
    "chained_2000": (chain(), "definitions nested more than 100 deep"),
    "nested_bomb": (nested_bomb(), "bad.qasm:30: the program expands to more than"),
    "empty": ("", "bad.qasm: empty input"),
    "qasm3_zero_div": (H3 + "qubit[1] q;\nrz(0/0) q[0];\n", "bad.qasm:4: division by zero"),
    "qasm3_syntax": (H3 + "qubit[2] q;\nh q[0;\n", "bad.qasm:4: syntax error at ';'"),
    "qasm3_slice": (H3 + "qubit[2] q;\nh q[0:5];\n", "bad.qasm:4: q[0:5]: index 5 is out"),
    "binary": ("\x00\x01", "bad.qasm: not a text file"),
    # a call that does not fit its gate's parameters, at the top or inside a definition
    "call_no_params": (H2 + "qreg q[2];\nrx q[0];\n",
                       "bad.qasm:4: gate 'rx' called without its parameter theta"),
    "qasm3_call_no_params": (H3 + "qubit[2] q;\nrx q[0];\n",
                             "bad.qasm:4: gate 'rx' called without its parameter theta"),
    "qasm3_extra_param": (H3 + "qubit[2] q;\nh(0.5) q[0];\n",
                          "bad.qasm:4: a gate called with more parameters than it takes"),
    "body_uses_more_params": (H2 + "gate g(a) x { rx(a) x; }\nqreg q[2];\ng q[0];\n",
                              "bad.qasm:5: gate 'g' called with 0 parameters: its definition "
                              "uses more parameters"),
    "body_call_no_params": (H2 + "gate g x { u1 x; }\nqreg q[1];\ng q[0];\n",
                            "bad.qasm:5: gate 'g' called with 0 parameters: in its definition, "
                            "gate 'u1' called without its parameter theta"),
    "version_4": ("OPENQASM 4.0;\nqubit[1] q;\n", "bad.qasm: unsupported OpenQASM version 4"),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_exit_2_one_line(tmp_path, capsys, name):
    text, needle = BAD_INPUTS[name]
    src = write(tmp_path, "bad.qasm", text)
    out = tmp_path / "out.qasm"
    out.write_text("previous")
    assert main(["compile", src, "-o", str(out)]) == 2
    err = err_lines(capsys)
    assert len(err) == 1 and err[0].startswith("qdiff: error: ") and needle in err[0], err
    assert out.read_text() == "previous"
    assert sorted(os.listdir(tmp_path)) == ["bad.qasm", "out.qasm"]


@pytest.mark.parametrize("path,needle", [("/dev/null", "empty input"),
                                         ("/dev/zero", "larger than the input limit")])
def test_device_files_as_input(capsys, path, needle):
    if not stat.S_ISCHR(os.stat(path).st_mode):
        pytest.skip(f"{path} is not a device on this machine")
    assert main(["compile", path]) == 2
    err = err_lines(capsys)
    assert len(err) == 1 and f"{path}: {needle}" in err[0]


@pytest.mark.parametrize("option", [["--seed", "-5"], ["--seed", "x"],
                                    ["--time-limit", "nan"], ["--time-limit", "-1"]])
def test_bad_option_values_exit_2(tmp_path, capsys, option):
    """``--seed -5`` was numpy's ValueError traceback and exit 1."""
    src = write(tmp_path, "in.qasm", GOOD)
    assert main(["compile", src, *option]) == 2
    err = err_lines(capsys)
    assert len(err) == 1 and f"argument {option[0]}" in err[0]


def test_help_is_exit_0(capsys):
    assert main(["--help"]) == 0
    assert "compile" in capsys.readouterr().out


@pytest.mark.parametrize("exc", [ValueError("boom"), RecursionError("deep"),
                                 type("PanicException", (BaseException,), {})("rust")])
def test_unexpected_exception_is_internal_error_exit_3(tmp_path, capsys, monkeypatch, exc):
    from qdiff.compiler import api

    def broken(*a, **k):
        raise exc
    monkeypatch.setattr(api, "compile", broken)
    src = write(tmp_path, "in.qasm", GOOD)
    assert main(["compile", src, "-o", str(tmp_path / "o.qasm")]) == 3
    err = err_lines(capsys)
    assert len(err) == 1 and err[0].startswith("qdiff: internal error: ")
    assert type(exc).__name__ in err[0] and "report" in err[0]
    assert not (tmp_path / "o.qasm").exists()


def test_same_output_name_is_refused_before_anything_is_written(tmp_path, capsys):
    """``d1/x.qasm d2/x.qasm --out-dir out``: the second silently overwrote the first."""
    a = write(tmp_path, "d1/x.qasm", GOOD)
    b = write(tmp_path, "d2/x.qasm", GOOD.replace("h q[0];", "x q[0];"))
    outd = tmp_path / "out"
    outd.mkdir()
    assert main(["compile", a, b, "--out-dir", str(outd)]) == 2
    err = err_lines(capsys)
    assert len(err) == 1 and "d1/x.qasm and" in err[0] and "d2/x.qasm" in err[0]
    assert os.listdir(outd) == []


def test_batch_compiles_every_file_and_reports_failures_at_the_end(tmp_path, capsys):
    """A bad file in the middle stopped the batch: the files after it were never compiled."""
    d = tmp_path / "circs"
    write(d, "a.qasm", GOOD)
    write(d, "b.qasm", H2 + "qreg q[2];\nfrobnicate q[0];\n")
    write(d, "c.qasm", GOOD)
    write(d, "d.qasm", "")
    outd = tmp_path / "out"
    outd.mkdir()
    assert main(["compile", str(d), "--out-dir", str(outd)]) == 2
    captured = capsys.readouterr()
    assert sorted(os.listdir(outd)) == ["a.qasm", "c.qasm"]
    err = [line for line in captured.err.splitlines() if line.startswith("qdiff:")]  # no progress
    assert [line.split(": ")[2].split(":")[0] for line in err] == [str(d / "b.qasm"),
                                                                   str(d / "d.qasm")]
    assert "frobnicate" in err[0] and "empty input" in err[1]
    assert "a.qasm" in captured.out and "c.qasm" in captured.out


def test_batch_exit_code_is_the_worst(tmp_path, capsys, monkeypatch):
    from qdiff.compiler import api
    from qdiff.compiler.verify import Verdict
    real = api.equivalence
    monkeypatch.setattr(api, "equivalence", lambda a, b, *r, **k: Verdict(False, "unitary", 0.5)
                        if a.num_wires == 3 else real(a, b, *r, **k))
    d = tmp_path / "circs"
    write(d, "a.qasm", GOOD)
    write(d, "b.qasm", GOOD.replace("qreg q[2];", "qreg q[3];"))
    outd = tmp_path / "out"
    outd.mkdir()
    assert main(["compile", str(d), "--out-dir", str(outd)]) == 1
    write(d, "c.qasm", "")
    assert main(["compile", str(d), "--out-dir", str(outd)]) == 2
    assert sorted(os.listdir(outd)) == ["a.qasm"]
    err = err_lines(capsys)
    assert sum("not equivalent" in line for line in err) == 2


def test_read_only_output_needs_force(tmp_path, capsys):
    """An existing 0444 output was replaced without complaint (and became 0644)."""
    src = write(tmp_path, "in.qasm", GOOD)
    out = tmp_path / "out.qasm"
    out.write_text("previous")
    os.chmod(out, 0o444)
    assert main(["compile", src, "-o", str(out)]) == 2
    err = err_lines(capsys)
    assert len(err) == 1 and "read-only" in err[0] and "--force" in err[0]
    assert out.read_text() == "previous"
    assert main(["compile", src, "-o", str(out), "--force"]) == 0
    assert "OPENQASM" in out.read_text() and stat.S_IMODE(out.stat().st_mode) == 0o444


def test_output_mode_is_kept(tmp_path, capsys):
    src = write(tmp_path, "in.qasm", GOOD)
    out = tmp_path / "out.qasm"
    out.write_text("previous")
    os.chmod(out, 0o600)
    assert main(["compile", src, "-o", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


def test_symlink_attack_on_the_temp_file(tmp_path, capsys):
    """``ln -s victim.txt .out.qasm.tmp<PID>``: the victim received the compiled QASM."""
    src = write(tmp_path, "in.qasm", GOOD)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, tmp_path / f".out.qasm.tmp{os.getpid()}")
    assert main(["compile", src, "-o", str(tmp_path / "out.qasm")]) == 0
    assert victim.read_text() == "precious"
    assert not (tmp_path / "out.qasm").is_symlink()


def _console_script():
    exe = shutil.which("qdiff") or os.path.join(os.path.dirname(sys.executable), "qdiff")
    if not os.path.exists(exe):
        pytest.skip("console script not installed")
    return exe


def _front_is_lazy() -> bool:
    """Whether ``import qdiff.cli`` stays light: main() can only catch what happens after
    the console script has imported it."""
    code = "import sys, qdiff.cli; sys.exit('torch' in sys.modules)"
    return subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def _wait_until_loaded(proc, library: str, timeout: float = 120.0) -> bool:
    """Poll the process's memory map until ``library`` is mapped (it is being imported)."""
    maps = f"/proc/{proc.pid}/maps"
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        try:
            with open(maps, encoding="utf-8", errors="replace") as fh:
                if library in fh.read():
                    return True
        except OSError:
            return False
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("when", ["torch", "qiskit", 0.5])
def test_ctrl_c_during_start_up_is_130_and_one_line(tmp_path, when):
    """Ctrl-C in the first seconds (heavy imports) printed a KeyboardInterrupt traceback and
    exited with -2. The signal is sent while torch's or Qiskit's native libraries are being
    loaded, or after a fixed half second."""
    if not _front_is_lazy():
        pytest.skip("the package front imports torch eagerly: Ctrl-C can land before main()")
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("needs /proc to see what the process is importing")
    src = write(tmp_path, "in.qasm", GOOD)
    proc = subprocess.Popen([_console_script(), "compile", src, "-o", str(tmp_path / "o.qasm")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if isinstance(when, str):
        assert _wait_until_loaded(proc, when), proc.communicate()[1]
    else:
        time.sleep(when)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("finished before the signal arrived")
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["qdiff: error: interrupted; no partial output was "
                                        "written"]
    assert sorted(os.listdir(tmp_path)) == ["in.qasm"]


def test_ctrl_c_during_a_held_import_lands_after_it(tmp_path, monkeypatch):
    """The start-up imports run with SIGINT held: a Ctrl-C raised in the middle of a module's
    initialisation lets the module finish loading and interrupts right after it (as
    KeyboardInterrupt, which main turns into exit 130), never inside the module."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not handled by Python in this process")
    from qdiff import cli
    name = "qdiff_test_interrupted_import"
    (tmp_path / f"{name}.py").write_text(
        "import signal\nsignal.raise_signal(signal.SIGINT)\nx = sum(range(1000))\nLOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(KeyboardInterrupt):
        cli._import_held(name)
    assert sys.modules[name].LOADED is True
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    # without the hold the same import stops at the signal, half loaded
    monkeypatch.delitem(sys.modules, name)
    with pytest.raises(KeyboardInterrupt):
        __import__(name)
    assert name not in sys.modules


_HOOK = '''import os, signal, sys
class _Hook:
    def find_spec(self, name, path=None, target=None):
        if name == "qdiff.cli" and os.environ.get("QDIFF_TEST_SIGINT_AT_IMPORT"):
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, _Hook())
'''


def test_ctrl_c_while_the_console_script_imports_the_cli(tmp_path):
    """The console script's entry (``[project.scripts]``) catches a Ctrl-C that arrives while
    qdiff.cli is being imported (a sitecustomize hook sends SIGINT at that moment)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_HOOK)
    src = write(tmp_path, "in.qasm", GOOD)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, QDIFF_TEST_SIGINT_AT_IMPORT="1",
               PYTHONPATH=os.pathsep.join([str(hook), root]))
    module, func = _script_entry().split(":")
    code = f"import sys\nfrom {module} import {func}\nsys.exit({func}())"
    proc = subprocess.run([sys.executable, "-c", code, "compile", src, "-o",
                           str(tmp_path / "o.qasm")], capture_output=True, text=True, env=env,
                          cwd=root, timeout=120)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip().splitlines() == ["qdiff: error: interrupted; no partial output "
                                                "was written"]
    assert not (tmp_path / "o.qasm").exists()


def _script_entry() -> str:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest's own TOML reader
        import tomli as tomllib
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as fh:
        return tomllib.load(fh)["project"]["scripts"]["qdiff"]


@pytest.mark.parametrize("option", ["-o", "--out-dir"])
@pytest.mark.parametrize("value", ["", " "])
def test_empty_output_path_is_bad_input(tmp_path, capsys, option, value):
    """An empty ``-o`` or ``--out-dir`` is refused, not read as 'no option' (stdout)."""
    src = write(tmp_path, "in.qasm", GOOD)
    assert main(["compile", src, option, value]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and f"{option}: empty path" in err[0], err
    assert captured.out == "" and sorted(os.listdir(tmp_path)) == ["in.qasm"]


class _FullStream:
    def write(self, text):
        raise OSError(28, "No space left on device")

    def flush(self):
        pass


@pytest.mark.parametrize("stream", ["full", "closed"])
@pytest.mark.parametrize("args", [["-o", "-"], ["--report", "json"]])
def test_unwritable_stdout_is_bad_input_not_an_internal_error(tmp_path, capsys, monkeypatch,
                                                              stream, args):
    """``qdiff compile in.qasm -o - > /dev/full`` (or with stdout closed): one line naming
    stdout, exit 2."""
    src = write(tmp_path, "in.qasm", GOOD)
    other = write(tmp_path, "b.qasm", GOOD)
    inputs = [src] if args[0] == "-o" else [src, other]  # several inputs: the report on stdout
    monkeypatch.setattr(sys, "stdout", _FullStream() if stream == "full" else None)
    assert main(["compile", *inputs, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("qdiff: error: <stdout>: cannot write"), err
    assert not any("internal error" in line or "Traceback" in line for line in err)
    if args[0] == "-o":  # the output not written: no report saying the run went well
        assert len(err) == 1, err


def test_classical_registers_are_kept_in_the_output(tmp_path, capsys):
    """The output measures into the input's classical registers (names, sizes, bits), in
    both OpenQASM versions and with a target's routing."""
    src = write(tmp_path, "in.qasm", H2 + "qreg a[1];\nqreg b[2];\ncreg m[1];\ncreg yy[2];\n"
                "h a[0];\ncx a[0],b[1];\nx b[0];\nmeasure a[0] -> yy[1];\n"
                "measure b[0] -> m[0];\nmeasure b[1] -> yy[0];\n")
    for extra in ([], ["--target", "fake_manila"], ["--qasm-version", "3"]):
        out = tmp_path / "out.qasm"
        assert main(["compile", src, "-o", str(out), *extra]) == 0
        text = out.read_text()
        if "--qasm-version" in extra:
            assert "bit[1] m;" in text and "bit[2] yy;" in text
        else:
            assert "creg m[1];" in text and "creg yy[2];" in text and "creg c" not in text
        assert text.count("-> yy[") + text.count("yy[0] = measure") + \
            text.count("yy[1] = measure") == 2


def test_a_loose_bit_does_not_rename_the_registers(tmp_path, capsys):
    """An OpenQASM 3 ``bit d;`` (a clbit in no register) goes to a register of its own: the
    register ``c`` keeps its two bits and their values (Qiskit's sampler), and every clbit
    keeps its index."""
    from qiskit import qasm2, qasm3
    from qiskit.primitives import StatevectorSampler
    src = write(tmp_path, "in.qasm", 'OPENQASM 3.0;\ninclude "stdgates.inc";\nqubit[3] q;\n'
                "bit d;\nbit[2] c;\nx q[0];\nx q[2];\nd = measure q[0];\n"
                "c[0] = measure q[1];\nc[1] = measure q[2];\n")

    def measured(qc):  # {clbit index: qubit index}
        return {qc.find_bit(i.clbits[0]).index: qc.find_bit(i.qubits[0]).index
                for i in qc.data if i.operation.name == "measure"}

    qc = qasm3.loads(open(src).read())
    assert StatevectorSampler(seed=1).run([qc], shots=10).result()[0].data.c.get_counts() \
        == {"10": 10}
    legacy = qasm2.LEGACY_CUSTOM_INSTRUCTIONS  # for the u gate of the default basis
    for version, loader in ((3, qasm3.loads),
                            (2, lambda t: qasm2.loads(t, custom_instructions=legacy))):
        out = tmp_path / f"out{version}.qasm"
        assert main(["compile", src, "-o", str(out), "--qasm-version", str(version)]) == 0
        oc = loader(out.read_text())
        res = StatevectorSampler(seed=1).run([oc], shots=10).result()[0]
        assert res.data.c.get_counts() == {"10": 10} and res.data.c.num_bits == 2
        assert measured(oc) == measured(qc) and oc.num_clbits == 3


def test_huge_finite_angles_compile_exactly(tmp_path, capsys):
    """Finite angles up to 1e308 are valid input: phases of a Rot / U3 sum as products (an
    angle sum would drop the smaller angle or overflow), and the output is the same unitary
    (checked here against an independent product of the gates' matrices)."""
    import numpy as np
    src = write(tmp_path, "in.qasm", H2 + "qreg q[1];\nu3(1,-1e308,3) q[0];\nrz(1e308) q[0];\n"
                "rz(3) q[0];\nrx(1e17) q[0];\nrx(1) q[0];\nu3(1e17,1,1e17) q[0];\n")
    out = tmp_path / "out.qasm"
    assert main(["compile", src, "-o", str(out)]) == 0

    def e(a):
        return np.exp(1j * a)

    def u3(t, p, la):
        c, s_ = np.cos(t / 2), np.sin(t / 2)
        return np.array([[c, -e(la) * s_], [e(p) * s_, e(p) * e(la) * c]])

    def rz(t):
        return np.diag([e(-t / 2), e(t / 2)])

    def rx(t):
        return u3(t, -np.pi / 2, np.pi / 2)
    want = u3(1e17, 1, 1e17) @ rx(1) @ rx(1e17) @ rz(3) @ rz(1e308) @ u3(1, -1e308, 3)
    from qdiff.circuits import qasm
    got = qasm.loads(out.read_text()).circuit
    from qdiff.circuits.unitary import unitary
    u = unitary(got).numpy()
    assert abs(abs(np.vdot(u.ravel(), want.ravel())) / 2 - 1) < 1e-12


@pytest.mark.parametrize("data,ok", [(b'\xef\xbb\xbf' + GOOD.encode(), True),
                                     (GOOD.encode().replace(b"h q[0]", b"h q[0]; // \xff"),
                                      False)])
def test_stdin_is_decoded_as_a_file_is(capsys, monkeypatch, data, ok):
    """Standard input is read as bytes: a byte order mark is skipped, and bytes that are not
    UTF-8 are 'not a text file', whatever the locale's stdin decoding."""
    import io
    stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="surrogateescape")
    monkeypatch.setattr(sys, "stdin", stdin)
    code = main(["compile", "-", "-o", "-"])
    captured = capsys.readouterr()
    if ok:
        assert code == 0 and captured.out.startswith("OPENQASM 2.0;")
    else:
        err = captured.err.strip().splitlines()
        assert code == 2 and err == ["qdiff: error: <stdin>: not a text file (not UTF-8)"], err
