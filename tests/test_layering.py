"""Layering: circuits <- backends <- qdiff core <- hybrid, checked on the imports (ast) of every
module; Qiskit and PennyLane only inside functions in circuits/ and backends/."""
from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = {"circuits": "qdiff.circuits", "backends": "qdiff.backends", "hybrid": "qdiff.hybrid",
          "qdiff": "qdiff"}
FRONT = {os.path.join("qdiff", "__init__.py"), os.path.join("qdiff", "cli.py")}
HEAVY = ("qiskit", "qiskit_aer", "qiskit_ibm_runtime", "pennylane")


def modules():
    for top in LAYERS:
        for dirpath, dirnames, files in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in files:
                if f.endswith(".py"):
                    yield os.path.relpath(os.path.join(dirpath, f), ROOT)


def imports(path):
    """``[(module name, at module level?)]`` of a file (relative imports resolved to a marker)."""
    tree = ast.parse(open(os.path.join(ROOT, path), encoding="utf-8").read(), path)
    out = []

    def visit(node, top_level):
        for child in ast.iter_child_nodes(node):
            nested = top_level and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                          ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((a.name, top_level) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                name = "." * child.level + (child.module or "")
                out.extend((name + "." + a.name if child.module else name + a.name, top_level)
                           for a in child.names)
                out.append((name, top_level))
            visit(child, nested)
    visit(tree, True)
    return out


def layer_of(name: str):
    if name.startswith("qdiff.hybrid"):
        return "hybrid"
    if name.startswith("qdiff.backends"):
        return "backends"
    if name.startswith("qdiff.circuits"):
        return "circuits"
    if name == "qdiff" or name.startswith("qdiff."):
        return "core"
    return None


ALL = sorted(modules())
ALLOWED = {"circuits": {"circuits"}, "backends": {"circuits", "backends"},
           "qdiff": {"circuits", "backends", "core"}, "hybrid": {"circuits", "backends", "core",
                                                                 "hybrid"}}


@pytest.mark.parametrize("path", ALL)
def test_dependency_direction(path):
    top = path.split(os.sep)[0]
    for name, _ in imports(path):
        assert not name.startswith("."), f"{path}: relative import '{name}' (use absolute imports)"
        assert not name.split(".")[0] in ("circuits", "backends", "hybrid"), \
            f"{path}: bare import '{name}' (use qdiff.{name})"
        layer = layer_of(name)
        if layer is None:
            continue
        if path in FRONT:
            continue
        assert layer in ALLOWED[top], f"{path} (layer {top}) imports {name} (layer {layer})"


#: PennyLane's device plugin subclasses PennyLane's Device, so it imports PennyLane at module
#: level; PennyLane loads it through its entry point, and no other module imports it eagerly
PLUGIN = os.path.join("backends", "pennylane_plugin") + os.sep


@pytest.mark.parametrize("path", [p for p in ALL if p.split(os.sep)[0] in ("circuits", "backends")
                                  and not p.startswith(PLUGIN)])
def test_qiskit_and_pennylane_are_imported_lazily(path):
    for name, top_level in imports(path):
        if name.split(".")[0] in HEAVY:
            assert not top_level, f"{path}: module-level import of {name} (import it inside the function)"
        if name.startswith("qdiff.backends.pennylane_plugin"):
            assert not top_level, f"{path}: module-level import of the PennyLane plugin {name}"


def test_the_pennylane_plugin_is_not_imported_by_qdiff():
    import subprocess
    import sys
    code = ("import sys, qdiff, qdiff.backends; "
            "print('qdiff.backends.pennylane_plugin' in sys.modules, 'pennylane' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr


def test_the_checker_sees_real_imports():
    """Guard against a vacuous layering test: known imports are found where they are."""
    sim = dict(imports(os.path.join("backends", "statevector", "simulate.py")))
    assert sim.get("qdiff.backends.statevector.kernels") is True or \
        sim.get("qdiff.backends.statevector") is True
    io = imports(os.path.join("circuits", "qiskit_io.py"))
    assert any(n.startswith("qiskit") and not top for n, top in io)
    assert len(ALL) > 20


@pytest.mark.parametrize("path", [p for p in ALL if p.startswith(os.path.join("qdiff", "compiler"))])
def test_compiler_imports_only_circuits_and_itself(path):
    for name, _ in imports(path):
        if name == "qdiff" or name.startswith("qdiff."):
            assert name.startswith(("qdiff.circuits", "qdiff.compiler")), \
                f"{path} imports {name} (the compiler may import only qdiff.circuits)"
