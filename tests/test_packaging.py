"""Packaging: every package directory is declared, and the installed package imports from
outside the checkout."""
from __future__ import annotations

import os
import subprocess
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own TOML reader
    import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = {"qdiff": "qdiff", "circuits": "qdiff.circuits", "backends": "qdiff.backends",
       "hybrid": "qdiff.hybrid"}


def pyproject() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        return tomllib.load(fh)


def package_dirs() -> dict:
    """``{import name: directory relative to the root}`` for every dir with an __init__.py."""
    out = {}
    for top, name in TOP.items():
        base = os.path.join(ROOT, top)
        for dirpath, dirnames, files in os.walk(base):
            dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
            if "__init__.py" in files:
                rel = os.path.relpath(dirpath, base)
                full = name if rel == "." else name + "." + rel.replace(os.sep, ".")
                out[full] = os.path.relpath(dirpath, ROOT).replace(os.sep, "/")
    return out


def test_every_package_is_listed_with_its_directory():
    cfg = pyproject()["tool"]["setuptools"]
    listed = set(cfg["packages"])
    pdir = cfg["package-dir"]
    found = package_dirs()
    assert set(TOP.values()) <= set(found), "top-level packages must exist"
    missing = sorted(set(found) - listed)
    assert not missing, f"packages missing from [tool.setuptools] packages: {missing}"
    stale = sorted(listed - set(found))
    assert not stale, f"listed packages without an __init__.py: {stale}"
    for name, rel in found.items():
        # a package is placed either by its own package-dir entry or by its parent's
        parent = name
        while parent not in pdir:
            assert "." in parent, f"{name} has no package-dir mapping"
            parent = parent.rsplit(".", 1)[0]
        expected = pdir[parent] + name[len(parent):].replace(".", "/")
        assert os.path.normpath(expected) == os.path.normpath(rel), (name, expected, rel)


def test_distribution_metadata():
    proj = pyproject()["project"]
    assert proj["name"] == "qdiff-quantum"
    assert proj["scripts"]["qdiff"] == "qdiff._console:main"
    deps = " ".join(proj["dependencies"])
    for d in ("torch", "numpy", "qiskit", "qiskit-aer", "qiskit-ibm-runtime", "pennylane"):
        assert d in deps
    dev = " ".join(proj["optional-dependencies"]["dev"])
    assert "pytest" in dev and "hypothesis" in dev


def test_installed_package_imports_outside_the_checkout(tmp_path):
    code = ("import qdiff, qdiff.circuits, qdiff.backends, qdiff.hybrid, os, sys;"
            "import torch;"
            "dev = qdiff.device('statevector', wires=2);"
            "f = qdiff.qnode(dev)(lambda: (qdiff.H(0), qdiff.CNOT([0, 1]), qdiff.expval(qdiff.Z(0) @ qdiff.Z(1)))[-1]);"
            "assert abs(float(f()) - 1) < 1e-12;"
            "print(os.path.dirname(qdiff.circuits.__file__))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert os.path.samefile(res.stdout.strip(), os.path.join(ROOT, "circuits")) or \
        "site-packages" in res.stdout


def test_native_source_ships_as_package_data():
    """The C kernels are compiled on the user's machine, so the wheel must carry the source."""
    data = pyproject()["tool"]["setuptools"]["package-data"]["qdiff.backends.statevector"]
    for name in data:
        assert os.path.exists(os.path.join(ROOT, "backends", "statevector", name))
    assert "qdsim.c" in data
