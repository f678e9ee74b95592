"""The structure of the package, checked on the imports (ast) of every module: the core reaches
engines only through the Backend protocol, the compiler only through the IR, no module reaches
into another's private names, and no layer has import cycles. Plus the cache registry."""
from __future__ import annotations

import os

import pytest
import torch

from test_layering import ALL, ROOT, imports

PROTOCOL = "qdiff.backends.base"
FRONT = {os.path.join("qdiff", "__init__.py"), os.path.join("qdiff", "cli.py")}


def module_name(path: str) -> str:
    parts = path[:-3].split(os.sep)
    top = {"circuits": ["qdiff", "circuits"], "backends": ["qdiff", "backends"],
           "hybrid": ["qdiff", "hybrid"], "qdiff": ["qdiff"]}[parts[0]]
    name = ".".join(top + parts[1:])
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


MODULES = {module_name(p): p for p in ALL}


def resolve(name: str):
    """The package module an imported name refers to (``a.b.func`` -> ``a.b``), or None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def core_modules():
    return [p for p in ALL if p.split(os.sep)[0] == "qdiff" and p not in FRONT]


@pytest.mark.parametrize("path", core_modules())
def test_core_reaches_engines_only_through_the_protocol(path):
    for name, _ in imports(path):
        if name.startswith("qdiff.backends"):
            assert name == PROTOCOL or name.startswith(PROTOCOL + "."), \
                f"{path} imports {name}: the core may import only {PROTOCOL} from qdiff.backends"


@pytest.mark.parametrize("path", [p for p in ALL if p.startswith(os.path.join("qdiff", "compiler"))])
def test_compiler_imports_only_the_ir(path):
    for name, _ in imports(path):
        if name == "qdiff" or name.startswith("qdiff."):
            assert name.startswith(("qdiff.circuits", "qdiff.compiler")), \
                f"{path} imports {name}: the compiler builds on qdiff.circuits only"


@pytest.mark.parametrize("path", ALL)
def test_no_private_names_from_other_modules(path):
    me = module_name(path)
    for name, _ in imports(path):
        mod = resolve(name)
        if mod is None or mod == me:
            continue
        leaf = name[len(mod) + 1:] if name != mod else ""
        assert not leaf.startswith("_"), f"{path} imports the private name {name}"


def graph(layer: str) -> dict:
    edges: dict = {}
    for path in ALL:
        if path.split(os.sep)[0] != layer or path in FRONT:
            continue
        me = module_name(path)
        deps = {resolve(n) for n, _ in imports(path)}
        edges[me] = {d for d in deps if d and d != me and MODULES[d].split(os.sep)[0] == layer
                     and not me.startswith(d + ".") and MODULES[d] not in FRONT}
    return edges


def cycles(edges: dict) -> list:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in list(edges):
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("layer", ["circuits", "backends", "qdiff", "hybrid"])
def test_no_import_cycles_inside_a_layer(layer):
    assert cycles(graph(layer)) == []


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_clear_caches_empties_every_cache_and_results_stay_the_same():
    import qdiff as qd
    from qdiff.circuits import caches
    from qdiff.backends.statevector import native, zwords

    dev = qd.device("statevector", wires=4)

    @qd.qnode(dev)
    def f(x, w):
        qd.AngleEmbedding(x, wires=range(4))
        qd.StronglyEntanglingLayers(w, wires=range(4))
        return [qd.expval(qd.Z(i)) for i in range(4)] + [
            qd.expval(0.5 * qd.X(0) @ qd.Y(1) + 0.2 * qd.Z(2) - qd.X(3) + 0.1 * qd.Y(0)
                      + 0.3 * qd.X(1) @ qd.X(2) + 0.7 * qd.Z(0) @ qd.Z(3))]

    def run():
        x = torch.linspace(0.1, 0.9, 12, dtype=torch.float64).reshape(3, 4).requires_grad_()
        w = torch.linspace(-1, 1, 24, dtype=torch.float64).reshape(2, 4, 3).requires_grad_()
        out = f(x, w)
        gx, gw = torch.autograd.grad(out.sum(), (x, w))
        return out.detach(), gx, gw

    first = run()
    assert len(caches.names()) >= 10
    assert native.PLANS or native.library() is None  # populated by the run
    qd.clear_caches()
    assert not native.PLANS and not zwords._SIGN_CACHE
    again = run()
    for a, b in zip(first, again):
        assert torch.allclose(a, b, atol=1e-12, rtol=0)


def test_clear_caches_while_other_threads_run_qnodes():
    """qdiff.clear_caches() called again and again in one thread while four others run a
    qnode reading Pauli words, Z words and a Pauli sum (values and adjoint gradients): every
    call succeeds with the values of a serial run."""
    import sys
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import qdiff as qd

    dev = qd.device("statevector", wires=4)
    terms = [qd.X(0), qd.Y(1) @ qd.Z(2), qd.Z(3), qd.X(1) @ qd.X(2), qd.Z(0) @ qd.Z(3),
             qd.Y(0) @ qd.X(3)]

    @qd.qnode(dev, diff_method="adjoint")
    def f(x, w):
        qd.AngleEmbedding(x, wires=range(4))
        qd.StronglyEntanglingLayers(w, wires=range(4))
        return [qd.expval(qd.Z(0) @ qd.X(1)), qd.expval(qd.Y(2) @ qd.Z(3)),
                qd.expval(qd.Z(0) @ qd.Z(2)), qd.expval(qd.Z(1)),
                qd.expval(sum(0.1 * (k + 1) * p for k, p in enumerate(terms)))]

    def run(k):
        x = torch.linspace(0.1, 0.9, 4 * (1 + k % 3), dtype=torch.float64).reshape(-1, 4)
        w = torch.linspace(-1, 1, 24, dtype=torch.float64).reshape(2, 4, 3) + 0.01 * k
        w.requires_grad_()
        out = f(x, w)
        (g,) = torch.autograd.grad(out.sum(), w)
        return out.detach(), g

    serial = [run(k) for k in range(12)]
    stop = threading.Event()

    def clear():
        while not stop.is_set():
            qd.clear_caches()
            stop.wait(0.0005)

    clearer = threading.Thread(target=clear)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so that a window between two steps shows
    clearer.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            for _ in range(30):
                got = [fut.result(timeout=120) for fut in [pool.submit(run, k) for k in range(12)]]
                for a, b in zip(got, serial):
                    for u, v in zip(a, b):
                        assert torch.allclose(u, v, atol=1e-12, rtol=0)
    finally:
        stop.set()
        clearer.join(timeout=60)
        sys.setswitchinterval(interval)
