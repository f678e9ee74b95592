"""Start-up: the package front is lazy; ``qdiff --help``/``--version`` import neither torch nor
Qiskit; ``import qdiff`` imports no torch._dynamo, Qiskit or PennyLane; every public name loads."""
from __future__ import annotations

import subprocess
import sys

import pytest

import qdiff as qd
from qdiff.circuits.gates import GATES


def _modules_after(code: str) -> set:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True).stdout.split()
    return set(out)


def test_import_qdiff_is_light():
    mods = _modules_after("import qdiff")
    for heavy in ("torch._dynamo", "qiskit", "pennylane", "torch"):
        assert heavy not in mods, heavy


def test_every_public_name_loads_without_dynamo_qiskit_pennylane():
    mods = _modules_after("import qdiff as qd\nfor n in dir(qd):\n"
                          "    if n not in qd._PENNYLANE_TEMPLATES: getattr(qd, n)")
    assert "torch" in mods  # the names did load
    for heavy in ("torch._dynamo", "qiskit", "pennylane"):
        assert heavy not in mods, heavy


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_cli_help_and_version_import_no_torch_or_qiskit(flag):
    code = (f"import sys\nsys.argv = ['qdiff', '{flag}']\nfrom qdiff.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass")
    mods = _modules_after(code)
    assert "torch" not in mods and "qiskit" not in mods


def test_version_flag(capsys):
    from qdiff.cli import main
    assert main(["--version"]) == 0  # main returns the exit code, it never raises
    assert capsys.readouterr().out.strip() == f"qdiff {qd.__version__}"


def test_gate_names_match_the_registry():
    names = {g.pl_name for g in GATES.values() if g.pl_name and g.pl_name.isidentifier()}
    # a gate with a call of its own (qd.GlobalPhase takes any wires) is served by it
    own_call = {n for n in names if n in qd._EXPORTS}
    assert own_call == {"GlobalPhase"}
    assert names - own_call == set(qd._GATE_NAMES)
    for alias, target in qd._GATE_ALIASES.items():
        assert getattr(qd, alias) is getattr(qd, target)


def test_function_names_beat_submodules_of_the_same_name():
    code = ("import qdiff.qnode, qdiff.draw, qdiff as qd\n"
            "assert callable(qd.qnode) and callable(qd.draw), (qd.qnode, qd.draw)\n"
            "assert qd.qnode.__module__ == 'qdiff.qnode'")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert callable(qd.qnode) and callable(qd.draw)


def test_dir_is_complete_and_names_resolve():
    names = dir(qd)
    for n in ("RX", "CNOT", "H", "compile", "qnode", "device", "QuantumLayer", "Circuit",
              "expval", "qchem", "__version__"):
        assert n in names
    assert qd.RX is GATES["rx"] and qd.compile.__module__ == "qdiff.compiler.api"
    assert qd.backends.available()["devices"]  # submodules resolve too
    with pytest.raises(AttributeError):
        qd.no_such_name


def test_operator_arithmetic_works_first_thing_in_a_fresh_interpreter():
    # the observables module is not imported by the lazy front; arithmetic on gates loads it
    code = ("import qdiff as qd\nh = 0.5 * qd.X(0) @ qd.Z(1) + qd.Y(2)\n"
            "print(type(h).__name__, len(h.terms))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["Observable", "2"]


def test_pennylane_observables_combine_with_qdiff_ones_before_any_qnode():
    # the PennyLane conversion loads on first use, not only once a qnode has imported it
    code = ("import qdiff as qd, pennylane as qml\n"
            "h = qd.Hamiltonian([0.5, 2.0], [qd.Z(0), qml.X(1)]) + qd.Z(0) @ qml.Y(0)\n"
            "print(h)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "(0.5+0j) * Z(0) + (2+0j) * X(1) + (0-1j) * X(0)"
