"""The start state written by the native kernels (``from_zero``): the state's memory is never
read, so a fresh uninitialised allocation gives the same states as a zeroed one, with or without
a leading product of one-qubit gates, for one state (split over the threads) and for batches,
in complex128 and complex64; against the torch kernels."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from qdiff.backends.statevector import native, simulate as simulate_mod
from qdiff.backends.statevector.simulate import simulate, zero_state
from qdiff.circuits import Circuit, Operation, ParamRef
from qdiff.circuits.gates import BUILTIN_GATES

pytestmark = pytest.mark.skipif(native.library() is None,
                                reason="no C compiler: the native kernels are not built")

G = BUILTIN_GATES
TOL = {torch.complex128: 1e-12, torch.complex64: 2e-6}


def _circuit(n, prefix: bool):
    """A product prefix (rot on every wire, then a CNOT ladder) when ``prefix``; otherwise the
    circuit opens with a two-wire coded gate, so the kernels must write |0...0> themselves."""
    ops, p = [], 0
    if prefix:
        for w in range(n):
            ops.append(Operation(G["rot"], (w,), (ParamRef(p), ParamRef(p + 1), ParamRef(p + 2))))
            p += 3
        ops += [Operation(G["cx"], (w, w + 1)) for w in range(n - 1)]
    else:
        ops.append(Operation(G["crx"], (0, n - 1), (ParamRef(p),)))
        ops.append(Operation(G["rxx"], (1, n - 2), (ParamRef(p + 1),)))
        p += 2
    for w in range(n):
        ops.append(Operation(G["ry"], (w,), (ParamRef(p),)))
        p += 1
    ops += [Operation(G["cz"], (w, (w + 2) % n)) for w in range(n)]
    return Circuit(n, tuple(ops), num_params=p)


def _garbage(batch, n, cdtype):
    return torch.full((batch, 2 ** n), float("nan"), dtype=cdtype)


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("prefix", [True, False])
@pytest.mark.parametrize("n, batch", [(5, 1), (5, 6), (16, 1), (13, 3)])
@pytest.mark.parametrize("threads", [1, 2])
def test_run_plan_from_zero_never_reads_the_state(cdtype, prefix, n, batch, threads):
    c = _circuit(n, prefix)
    plan = native.coded_plan(c.operations, n)
    assert plan is not None
    theta = torch.tensor(np.random.default_rng(n + batch).uniform(-3, 3, (batch, c.num_params)))
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        got = native.run_plan(_garbage(batch, n, cdtype), plan, theta, from_zero=True)
        zeroed = native.run_plan(zero_state(n, batch, cdtype, "cpu"), plan, theta, from_zero=True)
    finally:
        torch.set_num_threads(old)
    assert torch.isfinite(torch.view_as_real(got)).all()
    assert torch.equal(got, zeroed)  # the same arithmetic on the same (written) start state
    with torch.no_grad(), native.disabled():
        ref = simulate(c, theta, cdtype=cdtype)
    torch.testing.assert_close(got, ref, atol=TOL[cdtype] * (1 + n), rtol=0)


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
def test_dagger_from_zero_starts_at_zero(cdtype):
    """``from_zero`` with the inverse program: |0...0> is written first, then U^dag applied
    (one state, split over the threads from 2^16 amplitudes on)."""
    n = 16
    c = _circuit(n, False)
    plan = native.coded_plan(c.operations, n)
    theta = torch.tensor(np.random.default_rng(3).uniform(-3, 3, (1, c.num_params)))
    got = native.run_plan(_garbage(1, n, cdtype), plan, theta, dagger=True, from_zero=True)
    ref = native.run_plan(zero_state(n, 1, cdtype, "cpu"), plan, theta, dagger=True)
    assert torch.equal(got, ref)


@pytest.mark.parametrize("prefix", [True, False])
def test_simulate_from_zero_matches_torch(prefix):
    n = 13
    c = _circuit(n, prefix)
    theta = torch.tensor(np.random.default_rng(5).uniform(-3, 3, (2, c.num_params)))
    with torch.no_grad():
        got = simulate(c, theta)
        with native.disabled():
            ref = simulate(c, theta)
    torch.testing.assert_close(got, ref, atol=1e-11, rtol=0)


def test_a_fallback_to_torch_sets_the_start_state(monkeypatch):
    """Where the native kernels decline after the start state was allocated without being
    written, the torch kernels run from |0...0>, not from the allocation's content."""
    n = 6
    c = _circuit(n, True)
    theta = torch.tensor(np.random.default_rng(7).uniform(-3, 3, (3, c.num_params)))
    empty, made = torch.empty, []

    def poisoned(*args, **kwargs):  # the allocation simulate makes for the kernels to fill
        made.append(args)
        return empty(*args, **kwargs).fill_(float("nan"))

    def decline(*args, **kwargs):
        raise native.Unsupported("declined in this test")
    monkeypatch.setattr(simulate_mod.torch, "empty", poisoned)
    monkeypatch.setattr(simulate_mod.native, "evolve", decline)
    with torch.no_grad():
        got = simulate(c, theta)
    monkeypatch.undo()
    assert (3, 2 ** n) in made
    with torch.no_grad(), native.disabled():
        ref = simulate(c, theta)
    torch.testing.assert_close(got, ref, atol=1e-12, rtol=0)
