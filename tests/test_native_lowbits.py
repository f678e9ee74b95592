"""The kernels of one-qubit gates whose target is on bits 0-2 (the lowest bits of the basis
index): X flips as constant permutations of 8-amplitude groups, dense and diagonal gates on the
two vector halves of a complex128 group. Every target bit 0-2, every set of low controls (bits
0-4) and a high control, n = 1..6 (fewer bits than a group, one group, several) and n = 14
(split over two threads), both precisions, batches with one matrix per binding, inverse
programs; against a closed-form reference (the permutation / the 2x2 product on the pairs)
and against the torch kernels on circuits."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff.backends.statevector import native
from qdiff.backends.statevector.adjoint import adjoint_vjp
from qdiff.backends.statevector.native_abi import DENSE, DIAG, FLIP, SWAP
from qdiff.backends.statevector.simulate import simulate
from qdiff.circuits import Circuit, Operation, ParamRef
from qdiff.circuits.gates import BUILTIN_GATES as G

pytestmark = pytest.mark.skipif(native.library() is None,
                                reason="no C compiler: the native kernels are not built")

TOL = {torch.complex128: 1e-12, torch.complex64: 2e-6}


def _reference(psi, kind, t, cmask, mats):
    """psi (B, 2^n) numpy; mats (B, 2, 2) (diag: (B, 2)); the gate on bit t where every bit of
    cmask is 1."""
    out = psi.copy()
    idx = np.arange(psi.shape[1])
    i0 = idx[((idx >> t) & 1 == 0) & ((idx & cmask) == cmask)]
    i1 = i0 | (1 << t)
    for b in range(psi.shape[0]):
        a0, a1 = psi[b, i0], psi[b, i1]
        if kind == FLIP:
            out[b, i0], out[b, i1] = a1, a0
        elif kind == DIAG:
            out[b, i0], out[b, i1] = mats[b, 0] * a0, mats[b, 1] * a1
        else:
            u = mats[b]
            out[b, i0] = u[0, 0] * a0 + u[0, 1] * a1
            out[b, i1] = u[1, 0] * a0 + u[1, 1] * a1
    return out


def _cmasks(n, t):
    """Every set of controls among bits 0-4 other than t (below n), and each with bit n-1."""
    low = [b for b in range(min(n, 5)) if b != t]
    out = []
    for r in range(len(low) + 1):
        for c in itertools.combinations(low, r):
            m = sum(1 << b for b in c)
            out.append(m)
            if n - 1 > 4 and n - 1 != t:
                out.append(m | 1 << (n - 1))
    return out


def _random(shape, seed, cdtype):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=shape) + 1j * rng.normal(size=shape)
    return z.astype(np.complex128 if cdtype == torch.complex128 else np.complex64)


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 14])
@pytest.mark.parametrize("kind,form", [(FLIP, ""), (DENSE, "general"), (DENSE, "real"),
                                       (DENSE, "rx"), (DIAG, "")])
def test_low_target_every_control_set(kind, form, n, cdtype):
    """form: a general unitary (four products per output), a real one (RY, H) or a real
    diagonal with an imaginary off-diagonal (RX): the two-product kernels."""
    batch = 3
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2 if n == 14 else 1)
        for t in range(min(n, 3)):
            for k, cmask in enumerate(_cmasks(n, t)):
                if kind == DIAG and cmask == 0:
                    continue  # uncontrolled diagonals take the block loops
                seed = 1000 * n + 100 * t + k
                psi = _random((batch, 2 ** n), seed, cdtype)
                if kind == DENSE:  # unitary matrices, one per binding
                    q, _ = np.linalg.qr(_random((batch, 2, 2), seed + 1, torch.complex128))
                    if form != "general":
                        a = np.random.default_rng(seed).uniform(-3, 3, batch)
                        c, s_ = np.cos(a / 2), np.sin(a / 2)
                        q = (np.stack([c, -s_, s_, c], 1) if form == "real" else
                             np.stack([c, -1j * s_, -1j * s_, c], 1)).reshape(batch, 2, 2)
                    mats, value = q, torch.tensor(q.astype(psi.dtype)).reshape(batch, 4)
                elif kind == DIAG:
                    mats = np.exp(1j * np.random.default_rng(seed).uniform(-3, 3, (batch, 2)))
                    value = torch.tensor(mats.astype(psi.dtype))
                else:
                    mats, value = None, None
                prog = native.Program(batch, n, cdtype)
                prog.add(kind, [t], cmask, value, {DENSE: 4, DIAG: 2, FLIP: 0}[kind])
                state = torch.tensor(psi)
                native.run(state, prog)
                ref = _reference(psi.astype(np.complex128), kind, t, cmask, mats)
                assert np.allclose(state.numpy(), ref, atol=TOL[cdtype]), (t, cmask)
                native.run(state, prog, dagger=True)  # the inverse program restores psi
                assert np.allclose(state.numpy(), psi, atol=2 * TOL[cdtype]), (t, cmask)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("n", [4, 5, 8, 12])
@pytest.mark.parametrize("threads", [1, 2])
def test_flip_on_a_high_bit_controlled_by_bit_0_or_1(n, cdtype, threads):
    """X on bit t >= 3 controlled by bit 0 or 1 (alone or with another control): the halves'
    vectors are blended lane by lane (the control's lanes swap)."""
    psi = _random((2, 2 ** n), n, cdtype)
    cases = [(t, (1 << c) | extra) for t in range(3, n) for c in (0, 1) for extra in (0, 1 << 2)]
    _check_flips(psi, n, cdtype, threads, cases)


def _check_flips(psi, n, cdtype, threads, cases):
    """X on bit t with controls cmask, for every (t, cmask) of cases: exactly the swap."""
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        for t, cmask in cases:
            prog = native.Program(2, n, cdtype)
            prog.add(FLIP, [t], cmask, None, 0)
            state = torch.tensor(psi)
            native.run(state, prog)
            ref = _reference(psi.astype(np.complex128), FLIP, t, cmask, None)
            assert np.array_equal(state.numpy(), ref.astype(psi.dtype)), (t, cmask)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("n", [4, 7, 12, 14])
@pytest.mark.parametrize("threads", [1, 2])
def test_flip_with_no_control_or_one_above_the_target(n, cdtype, threads):
    """X on bit t, uncontrolled or controlled by one bit c > t: the halves of the blocks whose
    control is set swap as whole vectors where a half holds at least one (t >= 3 in complex64,
    t >= 2 in complex128; runs of blocks without the control skipped), as a generic swap
    below; every (t, c), split over one or two threads."""
    psi = _random((2, 2 ** n), 7 * n, cdtype)
    cases = [(t, cmask) for t in range(n) for cmask in [0] + [1 << c for c in range(t + 1, n)]]
    _check_flips(psi, n, cdtype, threads, cases)


LOW_GATES = ["x", "cx", "ccx", "cz", "cy", "h", "rx", "ry", "rot", "crx", "cry", "crz", "cp",
             "crot"]


def _diag_reference(psi, bits, cmask, d):
    """psi (B, 2^n); the diagonal d (B, 2^k) on bits (bits[0] the most significant of the
    local index) where every bit of cmask is 1."""
    idx = np.arange(psi.shape[1])
    m = sum(((idx >> b) & 1) << (len(bits) - 1 - j) for j, b in enumerate(bits))
    on = (idx & cmask) == cmask
    return np.where(on, d[:, m], 1) * psi


def _swap_reference(psi, a, b):
    idx = np.arange(psi.shape[1])
    x = ((idx >> a) ^ (idx >> b)) & 1
    return psi[:, idx ^ (x << a) ^ (x << b)]


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("n,threads", [(4, 1), (6, 1), (9, 1), (13, 2)])
def test_diagonals_and_swaps_by_groups_on_every_placement(n, threads, cdtype):
    """Diagonals on one bit with controls (CZ, CP, CRZ, CCZ forms) and on two bits with or
    without a control (IsingZZ, a phase on |11> only), and SWAP, on every placement of their
    bits among low (0-2) and high bits: the group kernels' per-lane constants, their visits of
    only the groups where the gate acts, split over two threads at n = 13; exactly the
    reference (and the inverse program restores the state)."""
    rng = np.random.default_rng(n)
    psi = _random((2, 2 ** n), 3 * n, cdtype)
    cases = []
    for t in range(n):
        others = [c for c in range(n) if c != t]
        masks = [1 << c for c in others] + [(1 << c) | (1 << e) for c in others
                                             for e in others if c < e and (c < 3) != (e < 3)]
        cases += [([t], m) for m in masks]
    for a, b in itertools.permutations(range(n), 2):
        cases.append(([a, b], 0))
        c = next((c for c in (0, n - 1, 3) if c not in (a, b) and c < n), None)
        if c is not None:
            cases.append(([a, b], 1 << c))
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        for i, (bits, cmask) in enumerate(cases):
            k = len(bits)
            d = np.exp(1j * rng.uniform(-3, 3, (2, 2 ** k)))
            if i % 2:  # a phase on the all-ones entry only (CZ, CP): the one-combination path
                d[:, :-1] = 1
            prog = native.Program(2, n, cdtype)
            prog.add(DIAG, bits, cmask, torch.tensor(d.astype(psi.dtype)), 2 ** k)
            state = torch.tensor(psi)
            native.run(state, prog)
            ref = _diag_reference(psi.astype(np.complex128), bits, cmask, d)
            assert np.allclose(state.numpy(), ref, atol=TOL[cdtype]), (bits, cmask)
            native.run(state, prog, dagger=True)
            assert np.allclose(state.numpy(), psi, atol=2 * TOL[cdtype]), (bits, cmask)
        for a, b in itertools.permutations(range(n), 2):
            prog = native.Program(2, n, cdtype)
            prog.add(SWAP, [a, b], 0, None, 0)
            state = torch.tensor(psi)
            native.run(state, prog)
            assert np.array_equal(state.numpy(), _swap_reference(psi, a, b)), (a, b)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("n,batch", [(3, 2), (4, 1), (5, 3), (6, 1), (16, 1)])
def test_low_target_circuits_match_torch(n, batch, cdtype):
    """Every gate above with its target on bits 0-2 and its controls anywhere (a sample at
    n = 16, split over two threads), after a mixer, from a random state; batch rows with their
    own angles."""
    ops, p = [], 0
    for w in range(n):
        ops += [Operation(G["h"], (w,)), Operation(G["ry"], (w,), (0.3 + 0.2 * w,))]
    rng = np.random.default_rng(n)
    for name in LOW_GATES:
        gate = G[name]
        places = [pl for pl in itertools.permutations(range(n), gate.num_wires)
                  if n - 1 - pl[-1] < 3]
        if len(places) > 40:
            places = [places[i] for i in rng.choice(len(places), 40, replace=False)]
        for wires in places:
            ops.append(Operation(gate, wires,
                                 tuple(ParamRef(p + i) for i in range(gate.num_params))))
            p += gate.num_params
    c = Circuit(n, tuple(ops), num_params=p)
    theta = torch.tensor(rng.uniform(-3, 3, (batch, p)))
    ours, ref = _native_and_torch(c, theta, _random_state(n, cdtype), cdtype,
                                  2 if n == 16 else 1)
    atol = 1e-11 if cdtype == torch.complex128 else 5e-5
    assert torch.allclose(ours, ref, atol=atol)


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("threads", [3, 5])
def test_two_bit_passes_split_off_their_runs_match_torch(threads, cdtype, monkeypatch):
    """One state split over 3 or 5 threads: a thread's share of a two-bit gate's pass starts
    inside a contiguous run of vectors (the lower bit 2-5, runs of 2-16 vectors), and the runs
    after it start where they should; gate by gate, every gate on pairs with each lower bit."""
    monkeypatch.setenv("QDIFF_NATIVE_TILES", "0")
    n = 16
    placed = [(G[name], (hi, lo)) for name in ("rxx", "single_excitation", "isingxy")
              for lo in (2, 3, 4, 5) for hi in (lo + 1, 9, 15)]
    c = _gates_then_mixer(n, placed, ("ry", 0.4))
    theta = torch.tensor(np.random.default_rng(5).uniform(-3, 3, (1, c.num_params)))
    ours, ref = _native_and_torch(c, theta, _random_state(n, cdtype), cdtype, threads)
    assert torch.allclose(ours, ref, atol=1e-11 if cdtype == torch.complex128 else 5e-5)


def _gates_then_mixer(n, placed, mixer):
    """The circuit of every (gate, wires) in placed, each followed by the mixer on its first
    wire; every angle its own column."""
    ops, p = [], 0
    for gate, wires in placed:
        ops.append(Operation(gate, wires, tuple(ParamRef(p + i) for i in range(gate.num_params))))
        p += gate.num_params
        ops.append(Operation(G[mixer[0]], (wires[0],), (mixer[1],)))
    return Circuit(n, tuple(ops), num_params=p)


def _native_and_torch(c, theta, psi0, cdtype, threads):
    """(native final states, torch kernels' final states) from psi0 with `threads` threads."""
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        with torch.no_grad():
            ours = simulate(c, theta, initial_state=psi0, cdtype=cdtype)
            with native.disabled():
                ref = simulate(c, theta, initial_state=psi0, cdtype=cdtype)
    finally:
        torch.set_num_threads(old)
    return ours, ref


def _random_state(n, cdtype):
    psi0 = torch.tensor(_random((1, 2 ** n), n, cdtype))
    return psi0 / psi0.norm()


TWO_BIT_GATES = ["swap", "iswap", "ecr", "rxx", "ryy", "rzz", "isingxy", "single_excitation",
                 "pswap", "cphaseshift01", "fermionic_swap"]


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("tiles", ["0", "1"])
@pytest.mark.parametrize("n,threads", [(6, 1), (7, 1), (13, 2)])
def test_two_bit_gates_on_every_pair_match_torch(n, threads, tiles, cdtype, monkeypatch):
    """Every uncontrolled two-bit gate on every ordered pair of bits (a sample at n = 13),
    gate by gate (QDIFF_NATIVE_TILES=0: one pass each through its own kernel) and fused, with
    batch rows of their own angles, from a random state; the adjoint's gradient of an
    expectation too (its sweep applies the inverses)."""
    monkeypatch.setenv("QDIFF_NATIVE_TILES", tiles)
    rng = np.random.default_rng(n)
    pairs = list(itertools.permutations(range(n), 2))
    placed = []
    for name in TWO_BIT_GATES:
        chosen = pairs if n < 8 else [pairs[i] for i in rng.choice(len(pairs), 24, replace=False)]
        placed += [(G[name], wires) for wires in chosen]
    c = _gates_then_mixer(n, placed, ("ry", 0.4))
    p = c.num_params
    theta = torch.tensor(rng.uniform(-3, 3, (2, p)))
    psi0 = _random_state(n, cdtype)
    ours, ref = _native_and_torch(c, theta, psi0, cdtype, threads)
    atol = 1e-11 if cdtype == torch.complex128 else 5e-5
    assert torch.allclose(ours, ref, atol=atol)
    if cdtype == torch.complex64:
        return
    obs = qd.Z(0) @ qd.X(n - 1) + 0.5 * qd.Y(n // 2)
    cm = Circuit(n, c.operations, num_params=p, measurements=(qd.expval(obs),))
    cot = torch.tensor([[0.7], [-1.3]], dtype=torch.float64)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        final = simulate(cm, theta, initial_state=psi0, cdtype=cdtype)
        grads = adjoint_vjp(cm, theta, final.clone(), cot, [True] * p)
        with native.disabled():
            ref_grads = adjoint_vjp(cm, theta, final.clone(), cot, [True] * p)
    finally:
        torch.set_num_threads(old)
    assert torch.allclose(grads, ref_grads, atol=1e-10)


WIDE_GATES = ["double_excitation", "ccx", "cswap", "double_excitation_plus",
              "orbital_rotation"]


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("tiles", ["0", "1"])
@pytest.mark.parametrize("n,threads", [(6, 1), (9, 2), (13, 2)])
def test_gates_on_three_and_four_bits_match_torch(n, threads, tiles, cdtype, monkeypatch):
    """Gates on 3-4 bits (their sparse rows; a DoubleExcitation's 2x2 on two basis states of
    each group) on the lowest bits in order and out of order, low bits with a gap, spread
    bits, the highest bits; gate by gate and fused, batch rows with their own angles."""
    monkeypatch.setenv("QDIFF_NATIVE_TILES", tiles)
    rng = np.random.default_rng(n + 1)
    placed = []
    for name in WIDE_GATES:
        gate = G[name]
        k = gate.num_wires
        places = [tuple(range(k)), tuple(range(k))[::-1], tuple(range(k - 1)) + (n - 1,),
                  tuple(range(n - k, n)), (0, n - 1) + tuple(range(2, k)),
                  tuple(int(w) for w in rng.choice(n, k, replace=False))]
        placed += [(gate, tuple(n - 1 - b for b in bits)) for bits in places]  # bit b: wire n-1-b
    c = _gates_then_mixer(n, placed, ("rx", 0.3))
    theta = torch.tensor(rng.uniform(-3, 3, (2, c.num_params)))
    ours, ref = _native_and_torch(c, theta, _random_state(n, cdtype), cdtype, threads)
    atol = 1e-11 if cdtype == torch.complex128 else 5e-5
    assert torch.allclose(ours, ref, atol=atol)
