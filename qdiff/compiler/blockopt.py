"""Pass (level 3): re-synthesize three-qubit blocks with fewer CX by gradient fitting.

Each block of at most three qubits is written exactly as a CX template (its own CX sequence,
U3 gates in between, angles read off the block). Then, CX by CX, the pass deletes one CX and
re-fits the angles (Levenberg-Marquardt on autograd-free analytic Jacobians, warm-started from
the current angles plus random starts); a deletion stays only if the fit reaches 1e-10 in
fidelity, so the block's unitary is kept exactly. Blocks with the most CX go first, results are
cached by unitary (arithmetic circuits repeat the same blocks), and the pass stops at its
deadline.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from qdiff.compiler.blocks import partition
from qdiff.compiler.fuse import u3_angles
from qdiff.compiler.ops import matrix, single_thread
from qdiff.compiler.resynth import fit_from

MIN_CX = 3


def template_angles(ops, wires):
    """``(pairs, x)``: the block as a CX template with its exact U3 angles."""
    loc = {w: i for i, w in enumerate(wires)}
    k = len(wires)
    slots = [np.eye(2, dtype=complex) for _ in range(k)]
    cur = list(range(k))
    pairs = []
    for o in ops:
        if len(o.wires) == 1:
            q = loc[o.wires[0]]
            slots[cur[q]] = matrix(o) @ slots[cur[q]]
        else:
            a, b = loc[o.wires[0]], loc[o.wires[1]]
            pairs.append((a, b))
            slots += [np.eye(2, dtype=complex), np.eye(2, dtype=complex)]
            cur[a], cur[b] = len(slots) - 2, len(slots) - 1
    x = np.array([a for m in slots for a in u3_angles(m)], dtype=float)
    return pairs, torch.as_tensor(x)


def _starts(x: torch.Tensor, i: int, k: int, rng: torch.Generator, n_random: int = 2):
    """Starts for the template without CX ``i``: the current angles, jittered, random."""
    keep = torch.cat([x[:k * 3 + 6 * i], x[k * 3 + 6 * (i + 1):]])
    rows = [keep, keep + 0.05 * torch.randn(keep.shape, generator=rng, dtype=torch.float64)]
    rows += [(torch.rand(keep.shape, generator=rng, dtype=torch.float64) * 2 - 1) * np.pi
             for _ in range(n_random)]
    return torch.stack(rows)


def shrink_block(u: np.ndarray, ops, wires, deadline: float, seed: int = 0):
    """Ops for ``u`` with fewer CX than ``ops`` (None when no deletion holds)."""
    pairs, x = template_angles(ops, wires)
    k = len(wires)
    rng = torch.Generator().manual_seed(seed)
    best = None
    improved = True
    while improved and len(pairs) > 0 and time.perf_counter() < deadline:
        improved = False
        order = list(range(len(pairs)))[::-1]
        for i in order:
            if time.perf_counter() > deadline:
                break
            cand = pairs[:i] + pairs[i + 1:]
            new, xn, _ = fit_from(u, cand, wires, _starts(x, i, k, rng))
            if new is not None:
                best, pairs, x, improved = new, cand, xn, True
                break
    return best


def _key(u: np.ndarray) -> bytes:
    i = int(np.argmax(np.abs(u[:, 0]) > 0.1))
    ph = u[i, 0] / abs(u[i, 0])
    return np.round(u / ph, 9).tobytes()


def block_resynthesis(circuit, deadline: float, seed: int = 0, log=None, k: int = 3):
    """Circuit -> Circuit with three-qubit blocks re-fitted with fewer CX until ``deadline``."""
    with single_thread():
        return _block_resynthesis(circuit, deadline, seed, log, k)


def _block_resynthesis(circuit, deadline, seed, log, k):
    blocks = partition(circuit.operations, k)
    todo = sorted((i for i, b in enumerate(blocks) if len(b.wires) == k and b.cx >= MIN_CX),
                  key=lambda i: -blocks[i].cx)
    cache: dict = {}
    saved = tried = 0
    for i in todo:
        if time.perf_counter() > deadline:
            break
        b = blocks[i]
        u = b.unitary()
        key = _key(u)
        if key not in cache:
            tried += 1
            new = shrink_block(u, b.ops, b.wires, deadline, seed)
            cache[key] = None if new is None else (new, b.wires)
        hit = cache[key]
        if hit is not None:
            new, w0 = hit
            remap = dict(zip(w0, b.wires))
            ops = [o.__class__(o.gate, tuple(remap[w] for w in o.wires), o.params) for o in new]
            saved += b.cx - sum(1 for o in ops if len(o.wires) == 2)
            b.ops = ops
    if log is not None:
        log.append(f"block_resynthesis: {len(todo)} blocks, {tried} fitted, {saved} CX saved")
    return circuit.with_operations([o for b in blocks for o in b.ops])
