"""Every one- and two-qubit gate (and the doubly controlled ones) at every placement of its
wires, both precisions, against the torch kernels: the block loops of every width (targets on
bits 0-7 and above), the 8-amplitude lane kernels of the lowest bits with controls below and
above them, masked flips, batch tiles of small states."""
from __future__ import annotations

import itertools

import pytest
import torch

from qdiff.backends.statevector import native
from qdiff.backends.statevector.simulate import simulate
from qdiff.circuits import Circuit, Operation, ParamRef
from qdiff.circuits.gates import BUILTIN_GATES as G

pytestmark = pytest.mark.skipif(native.library() is None,
                                reason="no C compiler: the native kernels are not built")

NAMES = ["x", "y", "z", "h", "s", "t", "sx", "rx", "ry", "rz", "p", "rot", "u3", "cx", "cy",
         "cz", "ch", "swap", "iswap", "crx", "cry", "crz", "cp", "crot", "rxx", "rzz",
         "single_excitation", "ccx", "ccz", "cswap"]


def _mixer(n):
    ops = [Operation(G["h"], (w,)) for w in range(n)]
    ops += [Operation(G["ry"], (w,), (0.3 + 0.4 * w,)) for w in range(n)]
    return ops + [Operation(G["cx"], (w, (w + 1) % n)) for w in range(n)]


@pytest.mark.parametrize("n,batch", [(3, 5), (5, 1), (9, 2)])
@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("name", NAMES)
def test_gate_at_every_placement(name, n, batch, cdtype):
    gate = G[name]
    placements = list(itertools.permutations(range(n), gate.num_wires))
    if n == 9:  # the extremes and a middle wire for every slot
        keep = {0, 1, 2, 4, 6, 7, 8}
        placements = [p for p in placements if set(p) <= keep][:60]
    ops, p = _mixer(n), 0
    for wires in placements:
        ops.append(Operation(gate, wires, tuple(ParamRef(p + i) for i in range(gate.num_params))))
        p += gate.num_params
    c = Circuit(n, tuple(ops), num_params=p)
    g = torch.Generator().manual_seed(len(name) * n)
    theta = (torch.rand(batch, p, dtype=torch.float64, generator=g) - 0.5) * 6
    with torch.no_grad():
        ours = simulate(c, theta, cdtype=cdtype)
        with native.disabled():
            ref = simulate(c, theta, cdtype=cdtype)
    atol = 1e-11 if cdtype == torch.complex128 else 3e-5
    assert torch.allclose(ours, ref, atol=atol)


@pytest.mark.parametrize("cdtype,n", [(torch.complex128, 20), (torch.complex64, 21)])
def test_one_qubit_gates_on_middle_bits_of_a_16_mib_state(cdtype, n, monkeypatch):
    """On states of 16 MiB and more every one-qubit block loop prefetches along runs of 512
    bytes to 32 KiB (targets on bits 4-10 in complex128, 5-11 in complex64; the two-product
    loops of RX and RY skip the prefetches on states of 2-16 MiB): a general, a real and an
    RX matrix on each such bit and its neighbours after an entangling mixer, one pass each
    (no fusion, no tiles), against the torch kernels."""
    monkeypatch.setenv("QDIFF_NATIVE_TILES", "0")
    lo, hi = (4, 10) if cdtype == torch.complex128 else (5, 11)
    ops, p = _mixer(n), 0
    for b in range(lo - 1, hi + 2):
        for name in ("rot", "ry", "rx"):
            gate = G[name]
            ops.append(Operation(gate, (n - 1 - b,),
                                 tuple(ParamRef(p + i) for i in range(gate.num_params))))
            p += gate.num_params
    c = Circuit(n, tuple(ops), num_params=p)
    g = torch.Generator().manual_seed(n)
    theta = (torch.rand(1, p, dtype=torch.float64, generator=g) - 0.5) * 6
    with torch.no_grad():
        ours = simulate(c, theta, cdtype=cdtype)
        with native.disabled():
            ref = simulate(c, theta, cdtype=cdtype)
    atol = 1e-12 if cdtype == torch.complex128 else 2e-6
    assert torch.allclose(ours, ref, atol=atol)
