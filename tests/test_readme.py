"""Every ```python block of README.md (and of docs/*.md) runs as a user pastes it.

Each block runs in a namespace of its own, in a temporary working folder holding the
``in.qasm`` the compiler examples name; a block that the README writes as the continuation of
an earlier one (it uses that block's imports or names) runs in a copy of that block's
namespace (``CONTINUES``). Statements that need an IBM Quantum account (a real device name)
run only where no account is configured, and must then raise the README's missing-account
``QdiffError``; a block that needs a GPU is skipped without one. Outputs the README states
are checked: a ``# -> (a, b)`` comment on an expression is its shape, and the prose around a
block (``CHECKS``) is checked on the names the block leaves."""
from __future__ import annotations

import ast
import contextlib
import glob
import os
import re
import signal
import textwrap

import pytest
import torch

ROOT = os.path.join(os.path.dirname(__file__), "..")
FILES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


def code_blocks(path: str, lang: str = "python") -> list:
    """``(file, line, code)`` of every fenced block of ``lang`` (list-item indentation removed)."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        if m.group(2) == lang:
            out.append((os.path.basename(path), i + 2, textwrap.dedent("\n".join(lines[i + 1:j]))))
        i = j + 1
    return out


BLOCKS = [b for f in FILES for b in code_blocks(f)]

# block index -> the earlier block whose names it uses (the tour's ``import torch, qdiff as
# qd`` and ``dev``; the Qiskit layer's ``fm``/``ansatz`` in the primitives example)
CONTINUES = {1: 0, 2: 0, 3: 0, 8: 7}
SLOW: set = set()           # blocks over a few seconds: run with -m slow
TIMEOUT_S = 120             # per block (and its checks)

QASM = """OPENQASM 2.0;
include "qelib1.inc";
qreg q[3];
creg c[3];
h q[0];
cx q[0],q[1];
cx q[0],q[1];
t q[2];
ccx q[0],q[1],q[2];
s q[1];
measure q -> c;
"""

REAL_IBM = re.compile(r"""backend\s*=\s*["']ibm_\w+""")


def ibm_account_configured() -> bool:
    return bool(os.environ.get("QISKIT_IBM_TOKEN")) or os.path.exists(
        os.path.join(os.path.expanduser("~"), ".qiskit", "qiskit-ibm.json"))


@contextlib.contextmanager
def time_limit(seconds: int, what: str):
    def on_alarm(signum, frame):
        raise TimeoutError(f"{what} ran over {seconds} s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def expected_shape(code: str, stmt: ast.stmt):
    """The ``(a, b)`` of a ``# -> (a, b)`` comment on the statement's last line, or None."""
    line = code.split("\n")[stmt.end_lineno - 1]
    m = re.search(r"#\s*->\s*(\([\d,\s]*\))", line)
    return tuple(ast.literal_eval(m.group(1))) if m else None


def run_block(k: int, ns: dict) -> dict:
    name, line, code = BLOCKS[k]
    where = f"{name}:{line} (python block {k})"
    tree = ast.parse(code, filename=where)
    for stmt in tree.body:
        src = ast.get_source_segment(code, stmt)
        unit = compile(ast.Module([stmt], []), f"{where}, line {line + stmt.lineno - 1}", "exec")
        if REAL_IBM.search(src):
            if ibm_account_configured():
                continue  # would reach IBM Quantum over the network
            from qdiff.circuits.errors import QdiffError
            with pytest.raises(QdiffError, match="no IBM Quantum account"):
                exec(unit, ns)
            continue
        shape = expected_shape(code, stmt)
        if shape is not None and isinstance(stmt, ast.Expr):
            value = eval(compile(ast.Expression(stmt.value), where, "eval"), ns)
            assert tuple(value.shape) == shape, f"{where}: {src} gave {tuple(value.shape)}"
        else:
            exec(unit, ns)
    return ns


# -- what the README says around the blocks ------------------------------------------------

def check_tour(ns):
    x = torch.rand(5, 8, dtype=torch.float64)
    assert ns["model"](x).shape == (5, 4)
    assert "RX" in ns["qd"].draw(ns["circuit"])(torch.rand(4), torch.rand(1, 4, 3))


def check_static(ns):
    qd, plain = ns["qd"], BLOCK_NAMESPACES[0]["circuit"]
    x, w = torch.rand(6, 4, dtype=torch.float64), torch.rand(3, 4, 3, dtype=torch.float64)
    torch.testing.assert_close(ns["circuit"](x, w), plain(x, w))
    assert ns["circuit"].num_traces == 1
    assert ns["layer"](x).shape == (6, 4)
    assert isinstance(ns["circuit"], type(qd.jit(plain)))


def check_ground_state(ns):
    # the 10-qubit LiH of qd.qchem.molecule, in its 2-electron sector, lies below Hartree-Fock
    assert ns["mol"].n_qubits == 10 and ns["info"].converged
    assert float(ns["e0"]) < -7.8


def check_backends(ns):
    available = ns["qd"].backends.available()
    assert {"devices", "ibm", "pennylane"} <= set(available)
    assert len(available["ibm"]) == 68 and all(n.startswith("fake_") for n in available["ibm"])
    assert "lightning.qubit" in available["pennylane"]


def check_plugin(ns):
    import pennylane as qml
    x, w = torch.rand(4, dtype=torch.float64), torch.rand(2, 4, 3, dtype=torch.float64)
    ref = qml.qnode(qml.device("default.qubit", wires=4))(ns["f"].func)
    torch.testing.assert_close(torch.stack(ns["f"](x, w)), torch.stack(ref(x, w)))


def check_mixed_plugin(ns):
    import pennylane as qml
    x = torch.tensor(0.3, dtype=torch.float64)
    p = torch.tensor(0.1, dtype=torch.float64)
    ref = qml.qnode(qml.device("default.mixed", wires=3), interface="torch")(ns["f"].func)
    torch.testing.assert_close(torch.stack(ns["f"](x, p)), torch.stack(ref(x, p)))


def check_mixed_gradients(ns):
    f, x, p = ns["f"], ns["x"], ns["p"]
    h = 1e-6
    for t, grad in ((x, x.grad), (p, p.grad)):
        with torch.no_grad():
            t += h
            up = f(x, p)[0]
            t -= 2 * h
            down = f(x, p)[0]
            t += h
        assert abs(float(grad) - float(up - down) / (2 * h)) < 1e-7


def check_qiskit_layer(ns):
    # "The loss falls from 1.47 to about 0.09 in 50 steps here, 28 of the 32 XOR-like labels
    # right (88%, output > 0.5)"
    model, x, y = ns["model"], ns["x"], ns["y"]
    with torch.no_grad():
        out = model(x)
    start = {"__name__": "__readme__"}  # the block up to its training loop: the first loss
    for stmt in ast.parse(BLOCKS[7][2]).body:
        if not isinstance(stmt, ast.For):
            exec(compile(ast.Module([stmt], []), "README block 7", "exec"), start)
    with torch.no_grad():
        first = torch.nn.functional.mse_loss(start["model"](start["x"]), start["y"]).item()
    assert abs(first - 1.47) < 0.005
    assert abs(torch.nn.functional.mse_loss(out, y).item() - 0.09) < 0.01
    assert int(((out > 0.5).double() == y).sum()) == 28


def check_primitives(ns):
    assert ns["evs"].shape == (5, 2)
    counts = ns["counts"]
    assert sum(counts.values()) == 1000 and set(counts) <= {"00", "01", "10", "11"}


def check_compile(ns):
    from qdiff.circuits import Circuit
    report, out = ns["report"], ns["out"]
    assert isinstance(out, Circuit) and report.verified
    assert 0 <= report.approx_bound <= 1e-4 and report.infidelity <= 1e-4
    assert "CX" in report.summary() and "1-F" in report.summary()


CHECKS = {0: check_tour, 1: check_static, 2: check_ground_state, 3: check_backends,
          4: check_plugin, 5: check_mixed_plugin, 6: check_mixed_gradients,
          7: check_qiskit_layer, 8: check_primitives, 9: check_compile}

BLOCK_NAMESPACES: dict = {}


def namespace_after(k: int, tmp_path) -> dict:
    """The names block ``k`` leaves (run once per test session, after its parents)."""
    if k not in BLOCK_NAMESPACES:
        parent = CONTINUES.get(k)
        ns = dict(namespace_after(parent, tmp_path)) if parent is not None else {
            "__name__": "__readme__"}
        BLOCK_NAMESPACES[k] = run_block(k, ns)
    return BLOCK_NAMESPACES[k]


def test_the_blocks_are_the_ones_this_file_knows():
    """CONTINUES and CHECKS name blocks by index: a block added, removed or moved in the
    README shows here first."""
    assert len(BLOCKS) == 10, [(f, line) for f, line, _ in BLOCKS]
    assert "qd.AngleEmbedding" in BLOCKS[0][2] and "static=True" in BLOCKS[1][2]
    assert "fm.compose(ansatz)" in BLOCKS[8][2] and "zz_feature_map" in BLOCKS[7][2]
    for k, parent in CONTINUES.items():
        assert parent < k


def needs_gpu(code: str) -> bool:
    return bool(re.search(r"""["']cuda["']|\.cuda\(\)""", code))


@pytest.fixture
def in_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.qasm").write_text(QASM)
    return tmp_path


@pytest.mark.parametrize("k", [pytest.param(k, marks=[pytest.mark.slow] if k in SLOW else [],
                                            id=f"{b[0]}:{b[1]}")
                               for k, b in enumerate(BLOCKS)])
def test_block_runs_as_written(k, in_folder):
    code = BLOCKS[k][2]
    if needs_gpu(code) and not torch.cuda.is_available():
        pytest.skip("the block runs on a CUDA GPU; none here")
    chain = []
    j = k
    while j is not None:
        chain.append(j)
        j = CONTINUES.get(j)
    with time_limit(TIMEOUT_S, f"README python block {k}"):
        for j in reversed(chain):
            if j not in BLOCK_NAMESPACES:
                namespace_after(j, in_folder)
        ns = dict(BLOCK_NAMESPACES[k])
        if k in CHECKS:
            CHECKS[k](ns)


# -- the README's qdiff command lines ------------------------------------------------------

def command_lines() -> list:
    """``qdiff ...`` lines of the README's ```bash blocks (comments cut)."""
    out = []
    for f in FILES:
        for name, line, code in code_blocks(f, "bash"):
            for i, text in enumerate(code.split("\n")):
                cmd = text.split("#")[0].strip()
                if cmd.startswith("qdiff "):
                    out.append((f"{name}:{line + i}", cmd))
    return out


COMMANDS = command_lines()


def test_the_command_lines_are_the_ones_this_file_knows():
    assert len(COMMANDS) == 6, COMMANDS


@pytest.mark.parametrize("where,cmd", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_command_line_runs_as_written(where, cmd, in_folder, capsys):
    """Each line exits 0 and writes what its comment says, run on an OpenQASM 2 ``in.qasm``
    (Clifford+T, so that the ``--basis h,s,sdg,t,tdg,cx`` line applies) and a folder
    ``circuits/`` of an OpenQASM 2 and an OpenQASM 3 file."""
    import shlex

    from qdiff.cli import main
    (in_folder / "circuits").mkdir()
    (in_folder / "circuits" / "a.qasm").write_text(QASM)
    (in_folder / "circuits" / "b.qasm").write_text(
        'OPENQASM 3.0;\ninclude "stdgates.inc";\nqubit[2] q;\nh q[0];\ncx q[0], q[1];\n'
        'cx q[0], q[1];\nrz(0.5) q[1];\n')
    argv = shlex.split(cmd)[1:]
    with time_limit(TIMEOUT_S, cmd):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's --version and --help
            code = exc.code
    out, err = capsys.readouterr()
    assert code == 0, (cmd, err)
    assert "Traceback" not in err
    if argv == ["--version"]:
        assert out.startswith("qdiff ")
        return
    if "-o" in argv and argv[argv.index("-o") + 1] == "-":
        assert out.startswith("OPENQASM 2.0;")            # to stdout, version kept
        assert "t " in out and "rz" not in out and "u(" not in out
        assert "verified" in err and "yes" in err         # the report on stderr
        return
    if "--out-dir" in argv:
        import json
        assert sorted(os.listdir(in_folder / "opt")) == ["a.qasm", "b.qasm"]
        assert (in_folder / "opt" / "b.qasm").read_text().startswith("OPENQASM 3.0;")
        assert all(r["verified"] for r in json.loads(out))
        return
    target = argv[argv.index("-o") + 1]
    assert (in_folder / target).read_text().startswith("OPENQASM 2.0;")  # QASM version kept
    assert "yes" in out
