"""Pass (level 3): re-synthesize three-qubit blocks with fewer CX by gradient fitting.

Each block of at most three qubits is written exactly as a CX template (its own CX sequence,
U3 gates in between, angles read off the block). Then, CX by CX, the pass deletes one CX and
re-fits the angles (``resynth.fit``: Levenberg-Marquardt on the Jacobian torch computes through
the template circuit's unitary, warm-started from the current angles plus random starts); a
deletion stays only if the fit reaches the block's unitary to rounding (phase-aligned distance
1e-11) or, with an approximation budget, within the budget's share. Blocks with the most CX go
first, results are cached by unitary (arithmetic circuits repeat the same blocks), and the pass
stops when its work budget (LM iterations times starts) is spent.

A deletion is tried only when the shorter template can reach the block at all: the CX gates
touching qubit ``q`` are the only ones crossing the cut ``q | rest``, each has operator Schmidt
rank 2 across it and one-qubit gates rank 1, so a template with ``c`` of them has rank at most
``2**c`` there; by Eckart-Young on the realigned matrix, its distance to the block is at least
the norm of the block's Schmidt coefficients beyond ``2**c`` (over ``sqrt(d)``). When that
exceeds what the fit may accept, the deletion is skipped without fitting (no work spent; no
fit that could have been accepted is skipped).
"""
from __future__ import annotations

import numpy as np
import torch

from qdiff.compiler.blocks import partition
from qdiff.compiler.fuse import u3_angles
from qdiff.compiler.ops import matrix, single_thread
from qdiff.compiler.budget import EXACT_DELTA, Budget, Work
from qdiff.compiler.resynth import fit

MIN_CX = 3
BLOCK_SHARE = 8  # an approximate block fit may use at most this fraction of the budget


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


def cut_tails(u: np.ndarray) -> np.ndarray:
    """``(k, 5)``: for each qubit ``q`` of the ``k``-qubit block ``u`` and ``c = 0..4``, the
    smallest phase-aligned distance from ``u`` to any operator of Schmidt rank at most
    ``min(2**c, 4)`` across the cut ``q | rest`` (0 where ``2**c >= 4``)."""
    k = int(round(np.log2(u.shape[0])))
    t = u.reshape([2] * (2 * k))
    out = np.zeros((k, 5))
    for q in range(k):
        rest = [i for i in range(k) if i != q]
        m = t.transpose([q, k + q] + rest + [k + i for i in rest]).reshape(4, -1)
        sv = np.linalg.svd(m, compute_uv=False)
        for c in range(2):  # rank 1 (c = 0) and 2 (c = 1); c >= 2 allows the full rank 4
            out[q, c] = float(np.sqrt(np.sum(sv[2 ** c:] ** 2)) / np.sqrt(u.shape[0]))
    return out


def reachable(pairs, k: int, tails: np.ndarray, accept: float) -> bool:
    """Whether a template with CX ``pairs`` on ``k`` qubits can come within ``accept`` of the
    block whose :func:`cut_tails` are ``tails`` (a necessary condition only)."""
    for q in range(k):
        c = sum(1 for p in pairs if q in p)
        if c < 2 and tails[q, c] > accept:
            return False
    return True


def shrink_block(u: np.ndarray, ops, wires, work: Work, budget: Budget, seed: int = 0):
    """``(ops, delta)`` for ``u`` with fewer CX than ``ops`` (None when no deletion holds);
    ``delta`` is the distance to ``u`` (rounding when exact, within ``budget`` otherwise)."""
    pairs, x = template_angles(ops, wires)
    k = len(wires)
    rng = torch.Generator().manual_seed(seed)
    accept = max(EXACT_DELTA, min(budget.left, budget.total / BLOCK_SHARE))
    tails = cut_tails(u)
    best = None
    improved = True
    while improved and len(pairs) > 0 and not work.exhausted:
        improved = False
        for i in range(len(pairs) - 1, -1, -1):
            if work.exhausted:
                break
            cand = pairs[:i] + pairs[i + 1:]
            if not reachable(cand, k, tails, accept):
                continue
            res = fit(u, cand, wires, starts=_starts(x, i, k, rng), iters=30, accept=accept)
            work.take(res.work)
            if res.ops is not None:
                best, pairs, x, improved = (res.ops, res.delta), cand, res.x, True
                break
    return best


def _key(u: np.ndarray) -> bytes:
    i = int(np.argmax(np.abs(u[:, 0]) > 0.1))
    ph = u[i, 0] / abs(u[i, 0])
    return np.round(u / ph, 9).tobytes()


def block_resynthesis(circuit, work: Work, budget: Budget, seed: int = 0, log=None,
                      k: int = 3):
    """Circuit -> Circuit with three-qubit blocks re-fitted with fewer CX within ``work``."""
    with single_thread():
        return _block_resynthesis(circuit, work, budget, seed, log, k)


def _block_resynthesis(circuit, work, budget, seed, log, k):
    blocks = partition(circuit.operations, k)
    todo = sorted((i for i, b in enumerate(blocks) if len(b.wires) == k and b.cx >= MIN_CX),
                  key=lambda i: (-blocks[i].cx, i))
    cache: dict = {}
    saved = tried = 0
    for i in todo:
        if work.exhausted:
            break
        b = blocks[i]
        u = b.unitary()
        key = _key(u)
        if key not in cache:
            tried += 1
            cache[key] = shrink_block(u, b.ops, b.wires, work, budget, seed)
        hit = cache[key]
        if hit is None:
            continue
        new, delta = hit
        if not budget.spend(delta):  # a cached approximate fit may no longer fit the budget
            continue
        # the cached ops may come from an equal block on other wires
        w0 = _cache_wires(new)
        remap = dict(zip(w0, b.wires)) if w0 != b.wires else None
        ops = new if remap is None else [o.__class__(o.gate, tuple(remap[w] for w in o.wires),
                                                     o.params) for o in new]
        saved += b.cx - sum(1 for o in ops if len(o.wires) == 2)
        b.ops = ops
    if log is not None:
        log.append(f"block_resynthesis: {len(todo)} blocks, {tried} fitted, {saved} CX saved, "
                   f"work {work.used:.0f}/{work.limit:.0f}")
    return circuit.with_operations([o for b in blocks for o in b.ops])


def _cache_wires(ops) -> tuple:
    """The wires a fitted block was emitted on (its first k U3 gates, in order)."""
    seen = []
    for o in ops:
        for w in o.wires:
            if w not in seen:
                seen.append(w)
    return tuple(seen)
