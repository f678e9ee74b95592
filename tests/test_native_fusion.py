"""Two-bit gate fusion of the native forward (states up to the last-level cache): one-qubit
gates, their singly controlled forms and two-qubit gates merged into 2x2 / 4x4 blocks and
applied in one pass (paired 2x2 products where a block is a one-qubit gate times a permutation,
all 16 entries otherwise), at every vector width (blocks whose lower bit is 0..4 and up), in
both precisions, forward and inverse programs, batched states, one and two threads; against the
torch kernels (and, for inverses, the circuit's unitary built by the torch kernels)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from qdiff.backends.statevector import native
from qdiff.backends.statevector.gate_data import circuit_angles, circuit_data
from qdiff.backends.statevector.native_coded import coded_plan, run_plan
from qdiff.backends.statevector.simulate import simulate
from qdiff.circuits import Circuit, Operation, ParamRef
from qdiff.circuits.gates import GATES, get_gate
from conftest import torch_threads

pytestmark = pytest.mark.skipif(native.library() is None,
                                reason="no C compiler: the native kernels are not built")

ATOL = {torch.complex128: 1e-10, torch.complex64: 3e-5}
# gates on one or two wires (the ones that fuse) and wider ones (which flush blocks)
FUSING = ["rx", "ry", "rz", "rot", "h", "x", "y", "z", "s", "t", "sx", "p", "u3", "cx", "cy",
          "cz", "ch", "crx", "cry", "crz", "crot", "cp", "swap", "iswap", "ecr", "rxx", "ryy",
          "rzz", "single_excitation"]
WIDE = ["ccx", "ccz", "cswap", "double_excitation"]


def _circuit(seed, n, depth, names, low_bias=False):
    """Random gates; with ``low_bias`` half of the wires drawn from the last four (the lowest
    bits of the basis index), so that blocks on bits 0-3 (every vector width) occur often."""
    rng = np.random.default_rng(seed)
    ops, p = [], 0
    for _ in range(depth):
        g = get_gate(names[rng.integers(len(names))])
        if low_bias and rng.random() < 0.5 and g.num_wires <= 2:
            pool = sorted(set(range(n - 4, n)) | {int(rng.integers(n))})
            wires = tuple(int(w) for w in rng.choice(pool, g.num_wires, replace=False))
        else:
            wires = tuple(int(w) for w in rng.choice(n, g.num_wires, replace=False))
        ops.append(Operation(g, wires, tuple(ParamRef(p + i) for i in range(g.num_params))))
        p += g.num_params
    return Circuit(n, tuple(ops), num_params=p)


def _sel(n, layers):
    """StronglyEntanglingLayers-like: Rot on every wire, then a CNOT ring of range l + 1."""
    ops, p = [], 0
    for layer in range(layers):
        for w in range(n):
            ops.append(Operation(GATES["rot"], (w,), (ParamRef(p), ParamRef(p + 1),
                                                       ParamRef(p + 2))))
            p += 3
        r = layer % (n - 1) + 1
        for w in range(n):
            ops.append(Operation(GATES["cx"], (w, (w + r) % n), ()))
    return Circuit(n, tuple(ops), num_params=p)


def _compare(c, theta, cdtype, threads=1):
    with torch.no_grad(), torch_threads(threads):
        ours = simulate(c, theta, cdtype=cdtype)
        with native.disabled():
            ref = simulate(c, theta, cdtype=cdtype)
    err = float((ours - ref).abs().max())
    assert err < ATOL[cdtype], err


@pytest.mark.parametrize("n", [6, 9, 13, 16])
@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("names", ["fusing", "all"])
def test_fused_forward_matches_torch(n, cdtype, names):
    pool = FUSING if names == "fusing" else FUSING + WIDE
    for seed in range(3):
        c = _circuit(seed + 7 * n, n, 90, pool, low_bias=seed > 0)
        theta = torch.tensor(np.random.default_rng(seed).uniform(-3, 3, (1, c.num_params)))
        _compare(c, theta, cdtype)


@pytest.mark.parametrize("n,batch", [(11, 2), (16, 2), (17, 1)])
@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("threads", [1, 2])
def test_fused_forward_batched_and_threaded(n, batch, cdtype, threads):
    c = _circuit(n + batch + threads, n, 70, FUSING + WIDE, low_bias=True)
    theta = torch.tensor(np.random.default_rng(n).uniform(-3, 3, (batch, c.num_params)))
    _compare(c, theta, cdtype, threads)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
def test_fused_chunks_of_a_large_state_match_torch(cdtype, threads):
    """2^19 amplitudes: blocks on the low bits share chunked passes of 2^15 (complex128) or
    2^16 (complex64) amplitudes, and low-bit ops move past high-bit ops on other bits to join
    them (a rotation on bit 0 waits for the layer's low blocks; one sharing a bit with the op
    after it stays)."""
    n = 19
    c = _sel(n, 4)
    theta = torch.tensor(np.random.default_rng(n).uniform(-3, 3, (1, c.num_params)))
    _compare(c, theta, cdtype, threads)
    c = _circuit(threads + 3, n, 80, FUSING + WIDE, low_bias=True)
    theta = torch.tensor(np.random.default_rng(threads).uniform(-3, 3, (1, c.num_params)))
    _compare(c, theta, cdtype, threads)


@pytest.mark.parametrize("n", [7, 12, 16])
@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
def test_fused_ring_layers_match_torch(n, cdtype):
    """Every ring range: blocks pair a CNOT with the rotations on either wire or both (paired
    and dense 4x4), across the wrap-around (control below target and above)."""
    c = _sel(n, n - 1)
    theta = torch.tensor(np.random.default_rng(n).uniform(-3, 3, (1, c.num_params)))
    _compare(c, theta, cdtype)


def _unitary(c, theta, n):
    """The circuit's unitary (columns: images of the basis states) from the torch kernels."""
    basis = torch.eye(2 ** n, dtype=torch.complex128)
    with torch.no_grad(), native.disabled():
        cols = simulate(c, theta.expand(2 ** n, -1), initial_state=basis)
    return cols.T


@pytest.mark.parametrize("n", [6, 8, 10])
@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
def test_fused_inverse_program_matches_unitary(n, cdtype):
    """The inverse of a data-given program and of a coded program: U^dag psi against the
    unitary from the torch kernels; then the forward restores psi."""
    c = _circuit(5 * n, n, 60, FUSING + WIDE, low_bias=True)
    theta = torch.tensor(np.random.default_rng(n).uniform(-3, 3, (1, c.num_params)))
    u = _unitary(c, theta, n)
    psi = torch.randn(1, 2 ** n, dtype=torch.complex128)
    psi = psi / psi.norm()
    want = (u.conj().T @ psi[0]).unsqueeze(0)
    # data-given program
    data = circuit_data(c.operations, circuit_angles(c.operations, theta, torch.float64), cdtype)
    prog = native.Program(1, n, cdtype)
    for op, d in zip(c.operations, data):
        prog.add_data(op, d.kind, d.value, n)
    state = psi.to(cdtype).clone()
    native.run(state, prog, dagger=True)
    assert float((state.to(torch.complex128) - want).abs().max()) < ATOL[cdtype]
    native.run(state, prog)
    assert float((state.to(torch.complex128) - psi).abs().max()) < ATOL[cdtype]
    # coded program (only the gates the kernels evaluate from theta)
    names = [g for g in FUSING if get_gate(g).num_params == 0 or native.code_of(get_gate(g))]
    assert len(names) > 15
    coded = _circuit(5 * n + 1, n, 60, names, low_bias=True)
    plan = coded_plan(coded.operations, n)
    assert plan is not None
    th = torch.tensor(np.random.default_rng(n + 1).uniform(-3, 3, (1, coded.num_params)))
    u = _unitary(coded, th, n)
    state = psi.to(cdtype).clone()
    run_plan(state, plan, th, dagger=True)
    want = (u.conj().T @ psi[0]).unsqueeze(0)
    assert float((state.to(torch.complex128) - want).abs().max()) < ATOL[cdtype]


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
def test_fusion_off_matches_fusion_on(cdtype, monkeypatch):
    """QDIFF_NATIVE_TILES=0 (gate by gate) and the default (fused) agree to rounding."""
    n = 12
    c = _sel(n, 4)
    theta = torch.tensor(np.random.default_rng(3).uniform(-3, 3, (1, c.num_params)))
    with torch.no_grad():
        on = simulate(c, theta, cdtype=cdtype)
        monkeypatch.setenv("QDIFF_NATIVE_TILES", "0")
        off = simulate(c, theta, cdtype=cdtype)
    assert float((on - off).abs().max()) < ATOL[cdtype]
    assert float((on.abs() ** 2).sum()) == pytest.approx(1.0, abs=1e-4)


def _chains(seed, n, layers, names=("cx", "cy", "cz", "ch", "crx", "cry", "crz", "cp", "crot"),
            oneq=("rot", "rx", "ry", "h", "u3")):
    """Layers of one-qubit gates on every wire, then controlled gates along a random chain of
    the wires (each link's control the previous link's target, as in entangling ladders and
    rings): a link whose control carries no pending gate of its own joins its target's block
    with the control as a selector bit, so that a chain takes one pass per two links."""
    rng = np.random.default_rng(seed)
    ops, p = [], 0
    for _ in range(layers):
        for w in range(n):
            g = get_gate(oneq[rng.integers(len(oneq))])
            ops.append(Operation(g, (w,), tuple(ParamRef(p + i) for i in range(g.num_params))))
            p += g.num_params
        chain = [int(w) for w in rng.permutation(n)]
        for a, b in zip(chain, chain[1:] + chain[:1]):
            g = get_gate(names[rng.integers(len(names))])
            ops.append(Operation(g, (a, b), tuple(ParamRef(p + i) for i in range(g.num_params))))
            p += g.num_params
    return Circuit(n, tuple(ops), num_params=p)


@pytest.mark.parametrize("n", [8, 12, 17])
@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("threads", [1, 2])
def test_controlled_chains_with_selector_bits_match_torch(n, cdtype, threads):
    """Chains of controlled gates in every wire order (selectors above and below the block's
    bits, in and out of the chunks of a large state), rings of every range, one and two
    threads; against the torch kernels."""
    for seed in range(2):
        c = _chains(seed + n, n, 3)
        theta = torch.tensor(np.random.default_rng(seed).uniform(-3, 3, (1, c.num_params)))
        _compare(c, theta, cdtype, threads)
    c = _sel(n, n - 1 if n < 17 else 4)
    theta = torch.tensor(np.random.default_rng(n).uniform(-3, 3, (1, c.num_params)))
    _compare(c, theta, cdtype, threads)


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
def test_controlled_chains_inverse_program_matches_unitary(cdtype):
    """The inverse of a coded chain program (selector blocks of the inverse gates, in reverse
    order): U^dag psi against the unitary from the torch kernels."""
    n = 9
    names = tuple(g for g in ("cx", "cy", "cz", "ch", "crx", "cry", "crz", "cp", "crot")
                  if get_gate(g).num_params == 0 or native.code_of(get_gate(g)))
    assert len(names) >= 5
    c = _chains(11, n, 3, names=names, oneq=("rot", "rx", "ry", "h"))
    plan = coded_plan(c.operations, n)
    assert plan is not None
    th = torch.tensor(np.random.default_rng(5).uniform(-3, 3, (1, c.num_params)))
    u = _unitary(c, th, n)
    psi = torch.randn(1, 2 ** n, dtype=torch.complex128)
    psi = psi / psi.norm()
    state = psi.to(cdtype).clone()
    run_plan(state, plan, th, dagger=True)
    want = (u.conj().T @ psi[0]).unsqueeze(0)
    assert float((state.to(torch.complex128) - want).abs().max()) < ATOL[cdtype]
    run_plan(state, plan, th)
    assert float((state.to(torch.complex128) - psi).abs().max()) < ATOL[cdtype]


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("threads", [1, 2])
def test_selector_blocks_in_tile_runs_match_torch(cdtype, threads, monkeypatch):
    """Tile runs (forced from 2^16 amplitudes on): selector blocks relocated into tiles, the
    selector among the tile's high bits or its low ones."""
    monkeypatch.setenv("QDIFF_NATIVE_TILES", "2")
    n = 17
    c = _chains(3 + threads, n, 3)
    theta = torch.tensor(np.random.default_rng(threads).uniform(-3, 3, (1, c.num_params)))
    _compare(c, theta, cdtype, threads)


def _ladder(seed, n, down=True):
    """One-qubit gates on every wire, then CNOTs: a ladder whose controls lie above their
    targets (written with the product start), a random tail in any direction after it."""
    rng = np.random.default_rng(seed)
    ops, p = [], 0
    for w in rng.permutation(n):
        g = get_gate(["rot", "rx", "ry", "h", "x", "s"][rng.integers(6)])
        ops.append(Operation(g, (int(w),), tuple(ParamRef(p + i) for i in range(g.num_params))))
        p += g.num_params
    # wire w is bit n - 1 - w: a control above its target is a lower wire number
    pairs = [(int(a), int(b)) for a in range(n) for b in range(n) if a < b]
    for _ in range(2 * n):
        a, b = pairs[rng.integers(len(pairs))]
        ops.append(Operation(GATES["cx"], (a, b) if down else (b, a), ()))
    for _ in range(n):
        a, b = (int(w) for w in rng.choice(n, 2, replace=False))
        ops.append(Operation(GATES["cx"], (a, b), ()))
        g = get_gate(["rot", "ry"][rng.integers(2)])
        ops.append(Operation(g, (b,), tuple(ParamRef(p + i) for i in range(g.num_params))))
        p += g.num_params
    return Circuit(n, tuple(ops), num_params=p)


@pytest.mark.parametrize("n,batch", [(5, 1), (12, 1), (13, 3), (16, 1), (17, 2), (19, 1)])
@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("threads", [1, 2])
def test_product_start_with_cnot_ladders_matches_torch(n, batch, cdtype, threads):
    """From |0...0>: the leading one-qubit gates and the CNOTs after them whose control lies
    above the target are written as one permuted product state (serially, split over runs of
    the low bits, per binding of a batch); ladders the other way round stop the prefix."""
    for seed, down in ((n, True), (n + 1, False), (n + 2, True)):
        c = _ladder(seed, n, down)
        theta = torch.tensor(np.random.default_rng(seed).uniform(-3, 3, (batch, c.num_params)))
        _compare(c, theta, cdtype, threads)
