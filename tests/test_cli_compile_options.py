"""``qdiff compile`` options of the compiler itself: --approx, --work, --target device names,
--out-dir creation, progress on a terminal only, the two-qubit gate named in the report."""
import json
import sys

import pytest

import qdiff as qd
from qdiff.cli import main
from qdiff.compiler.target import target_names

SRC = """OPENQASM 2.0;
include "qelib1.inc";
qreg q[3];
h q[0];
cx q[0],q[1];
rz(0.0002) q[1];
cx q[0],q[1];
ccx q[0],q[1],q[2];
"""


@pytest.fixture
def src(tmp_path):
    p = tmp_path / "in.qasm"
    p.write_text(SRC)
    return str(p)


def _err_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("qdiff: error: "), err
    return err[0]


def test_out_dir_is_created(tmp_path, src, capsys):
    out = tmp_path / "a" / "b"
    assert main(["compile", src, "--out-dir", str(out)]) == 0
    assert (out / "in.qasm").exists()


def test_out_dir_that_is_a_file_is_bad_input(tmp_path, src, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["compile", src, "--out-dir", str(f)]) == 2
    assert "not a directory" in _err_line(capsys)


def test_approx_is_reported_and_bounded(tmp_path, src, capsys):
    assert main(["compile", src, "-o", str(tmp_path / "o.qasm"), "--approx", "1e-6",
                 "--report", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)[0]
    assert rep["approx"] == 1e-6 and rep["infidelity"] <= 1e-6 and rep["verified"]


@pytest.mark.parametrize("flag", [[], ["--ignore-barriers"]])
def test_barriers_kept_or_ignored(tmp_path, capsys, flag):
    text = ('OPENQASM 3.0;\ninclude "stdgates.inc";\nqubit[2] q;\nbit[2] c;\ncx q[0], q[1];\n'
            'barrier q;\ncx q[0], q[1];\nc = measure q;\n')
    p = tmp_path / "b.qasm"
    p.write_text(text)
    out = tmp_path / "o.qasm"
    assert main(["compile", str(p), "-o", str(out), "--report", "json", *flag]) == 0
    rep = json.loads(capsys.readouterr().out)[0]
    written = out.read_text()
    if flag:
        assert rep["barriers"] == 0 and rep["cx_after"] == 0 and "barrier" not in written
    else:
        assert rep["barriers"] == 1 and rep["cx_after"] == 2
        assert written.index("cx") < written.index("barrier q[0], q[1];") < \
            written.rindex("cx")


@pytest.mark.parametrize("eps", ["0", "1", "-1e-3", "abc"])
def test_bad_approx_exit_2(src, capsys, eps):
    assert main(["compile", src, "--approx", eps]) == 2
    _err_line(capsys)


def test_exact_report_prints_the_measured_infidelity(tmp_path, src, capsys):
    assert main(["compile", src, "-o", str(tmp_path / "o.qasm")]) == 0
    out = capsys.readouterr().out
    assert "1-F" in out and "yes (unitary)" in out


def test_every_fake_device_of_qd_device_is_a_target():
    assert target_names() == qd.backends.available()["ibm"]
    assert "fake_manila" in target_names()


@pytest.mark.parametrize("device,gate", [("fake_manila", "CX"), ("fake_sherbrooke", "ECR")])
def test_target_fake_devices_and_the_two_qubit_column(tmp_path, src, capsys, device, gate):
    assert main(["compile", src, "-O", "1", "--target", device, "-o",
                 str(tmp_path / "o.qasm")]) == 0
    out = capsys.readouterr().out
    assert f"{gate} in" in out and f"{gate} out" in out


def test_real_device_without_account_is_an_error_naming_the_twin(src, capsys, monkeypatch,
                                                                 tmp_path):
    for var in ("QISKIT_IBM_TOKEN", "QISKIT_IBM_INSTANCE", "QISKIT_IBM_CHANNEL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no saved account either
    monkeypatch.setenv("QISKIT_SETTINGS", str(tmp_path / "settings.conf"))
    assert main(["compile", src, "--target", "ibm_brisbane"]) == 2
    line = _err_line(capsys)
    assert "no IBM Quantum account" in line and "fake_brisbane" in line


TOKEN = "qdiff-cli-TOKEN-0123456789abcdef"


class _RejectingService:
    """Stands in for QiskitRuntimeService: logs as the real one does, then rejects the token
    quoting it (as an HTTP error echoing the request might)."""

    def __init__(self, token=None, **kwargs):
        import logging
        logging.getLogger("qiskit_ibm_runtime.qiskit_runtime_service").warning(
            "Loading account with the given token. A saved account will not be used.")
        raise ValueError(f"token {token} refused")


def test_real_device_with_a_rejected_token_is_one_line_without_the_token(
        src, capfd, monkeypatch, tmp_path):
    """A token that is set but refused is reported as refused (not as 'no account'), on one
    stderr line (the runtime's own log line silenced), the token nowhere."""
    import logging
    import qiskit_ibm_runtime
    monkeypatch.setattr(qiskit_ibm_runtime, "QiskitRuntimeService", _RejectingService)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("QISKIT_IBM_TOKEN", TOKEN)
    monkeypatch.delenv("QISKIT_IBM_RUNTIME_LOG_LEVEL", raising=False)
    runtime_log = logging.getLogger("qiskit_ibm_runtime")
    monkeypatch.setattr(runtime_log, "level", runtime_log.level)
    assert main(["compile", src, "--target", "ibm_brisbane", "-o", str(tmp_path / "o.qasm")]) == 2
    captured = capfd.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("qdiff: error: "), err
    assert "did not accept the account" in err[0] and "fake_brisbane" in err[0]
    assert TOKEN not in captured.err + captured.out


def test_saved_account_token_is_not_printed_by_an_unexpected_error(src, capfd, monkeypatch,
                                                                    tmp_path):
    """No token in the environment: the service takes the saved account's. An error the
    backend raises later (an internal error line) quoting that token prints it as ***."""
    import types
    import qiskit_ibm_runtime
    saved = "qdiff-cli-saved-TOKEN-77aa0123"

    class Backend:
        name, num_qubits = "ibm_x", 5

        @property
        def target(self):
            raise RuntimeError(f"GET /backends/ibm_x failed (Authorization: Bearer {saved})")

    class SavedAccountService:
        def __init__(self, **kwargs):
            self._account = types.SimpleNamespace(token=saved)

        def backend(self, name):
            return Backend()

    monkeypatch.setattr(qiskit_ibm_runtime, "QiskitRuntimeService", SavedAccountService)
    monkeypatch.delenv("QISKIT_IBM_TOKEN", raising=False)
    out = tmp_path / "o.qasm"
    assert main(["compile", src, "--target", "ibm_x", "-o", str(out)]) == 3
    captured = capfd.readouterr()
    assert "Bearer ***" in captured.err and not out.exists()
    assert saved not in captured.err + captured.out


def test_unknown_device_lists_close_names(src, capsys):
    assert main(["compile", src, "--target", "fake_manilla"]) == 2
    assert "fake_manila" in _err_line(capsys)


class _Tty:
    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s

    def flush(self):
        pass

    def isatty(self):
        return True


def test_progress_on_a_terminal_and_quiet_when_piped(tmp_path, src, capsys, monkeypatch):
    assert main(["compile", src, "-O", "3", "--work", "50", "-o", str(tmp_path / "o.qasm")]) == 0
    assert capsys.readouterr().err == ""  # piped: nothing on stderr
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(["compile", src, "-O", "3", "--work", "50", "-o", str(tmp_path / "o.qasm")]) == 0
    assert "best" in tty.text and "pauli" in tty.text and "two-qubit gates" in tty.text


@pytest.mark.parametrize("work", ["-5", "0", "nan", "inf", "abc"])
def test_bad_work_exit_2(tmp_path, src, capsys, work):
    out = tmp_path / "o.qasm"
    assert main(["compile", src, "-O", "3", "--work", work, "-o", str(out)]) == 2
    assert "--work" in _err_line(capsys) and not out.exists()


@pytest.mark.parametrize("work", [-5, 0, float("nan"), float("inf"), "50", True])
def test_api_bad_work_is_an_error(work):
    with pytest.raises(qd.QdiffError, match="work"):
        qd.compile(SRC, level=3, work=work)


@pytest.mark.parametrize("basis", ["no,such,gates", "h,s,sdg,t,tdg,cx", "cx,u"])
def test_basis_with_target_is_refused(tmp_path, src, capsys, basis):
    """A bad basis is named whatever else is given; a valid one with --target is refused
    (the device's basis would silently replace it)."""
    out = tmp_path / "o.qasm"
    assert main(["compile", src, "--target", "fake_manila", "--basis", basis,
                 "-o", str(out)]) == 2
    line = _err_line(capsys)
    assert ("basis 'gates,no,such'" in line) if basis == "no,such,gates" else \
        ("--target" in line and "--basis" in line)
    assert not out.exists()
    with pytest.raises(qd.QdiffError, match="basis"):
        qd.compile(SRC, basis=basis, target="fake_manila")


def test_batch_is_quiet_when_stderr_is_not_a_terminal(tmp_path, capsys, monkeypatch):
    d = tmp_path / "in"
    d.mkdir()
    for i in range(3):
        (d / f"c{i}.qasm").write_text(SRC)
    assert main(["compile", str(d), "--out-dir", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().err == ""
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(["compile", str(d), "--out-dir", str(tmp_path / "out2"), "-O", "0"]) == 0
    assert "compiling" in tty.text  # the batch's progress bar, on a terminal only


def test_a_tiny_angle_at_level_3_writes_nothing_on_stderr(tmp_path, capsys):
    """A success prints its report and nothing on stderr (a 1e-300 rotation takes the
    Clifford matching's traces down to subnormal numbers)."""
    p = tmp_path / "tiny.qasm"
    p.write_text('OPENQASM 2.0;\ninclude "qelib1.inc";\nqreg q[1];\nrz(1e-300) q[0];\n')
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert main(["compile", str(p), "-O", "3", "-o", str(tmp_path / "o.qasm")]) == 0
    assert capsys.readouterr().err == ""
