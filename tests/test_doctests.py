"""Every docstring example in the package runs and gives what it shows.

The modules are imported under their installed names (``qdiff.circuits.gates``, not the
checkout path), so the examples see the same classes as users do."""
from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import qdiff

# modules whose import needs an optional toolkit at module level (none today); skipped if absent
OPTIONAL: set = set()


def package_modules() -> list:
    names = ["qdiff"]
    for info in pkgutil.walk_packages(qdiff.__path__, "qdiff."):
        names.append(info.name)
    for sub in ("qdiff.circuits", "qdiff.backends", "qdiff.hybrid"):
        pkg = importlib.import_module(sub)
        names.extend(i.name for i in pkgutil.walk_packages(pkg.__path__, sub + "."))
    return sorted(set(names))


MODULES = package_modules()


def test_every_package_is_walked():
    for name in ("qdiff.circuits.gates", "qdiff.backends.statevector.engine", "qdiff.hybrid.layer",
                 "qdiff.compiler.api", "qdiff.rules"):
        assert name in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    try:
        module = importlib.import_module(name)
    except ImportError:
        if name in OPTIONAL:
            pytest.skip(f"{name} needs an optional dependency")
        raise
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = [t for t in finder.find(module, name) if t.examples]
    for t in tests:
        runner.run(t, out=lambda s: None)
    res = runner.summarize(verbose=False)
    if res.failed:
        failures = []
        for t in tests:
            r = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
            buf = []
            r.run(t, out=buf.append)
            if r.failures:
                failures.append("".join(buf))
        pytest.fail(f"{res.failed} docstring example(s) failed in {name}:\n" + "\n".join(failures))
