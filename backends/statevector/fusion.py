"""Gate fusion for the in-place (no-grad) path: consecutive gates within <= k qubits become one
``2**k x 2**k`` block applied by one matmul into a preallocated buffer.

Planning (:func:`plan_blocks`) keeps a set of *open* blocks on disjoint wires; a gate joins the
blocks it touches when their union has at most ``k`` wires, otherwise the largest touching blocks
are emitted until it fits. Gates on disjoint wires commute, so the emitted order preserves the
order of every pair of gates that share a wire.

Application (:class:`Layout`) tracks a permutation of the state's axes instead of restoring the
wire order after every block: a block whose wires are not already the leading axes is first moved
there by one permuted copy into the spare buffer, then ``U @ S`` (``S`` viewed ``(B, 2**k, M)``)
writes back into the other buffer. The wire order is restored once at the end.
"""
from __future__ import annotations

import torch

from qdiff.backends.statevector.apply import apply_gate, op_angles



def _span(ws) -> set:
    return set(range(min(ws), max(ws) + 1))


def plan_blocks(operations, k: int) -> list:
    """``[(wires tuple, [op, ...]), ...]`` in a valid application order.

    Each block's wires are a window of consecutive wires (at most ``k``), so that its matrix
    applies to a contiguous view of the state without a permuted copy.
    """
    out: list = []
    open_blocks: dict[int, list] = {}   # id -> [wires set, ops]
    owner: dict = {}                     # wire -> block id
    next_id = 0

    def emit(bid):
        wires, ops = open_blocks.pop(bid)
        for w in wires:
            del owner[w]
        out.append((tuple(sorted(wires)), ops))

    for op in operations:
        ws = _span(op.wires)
        touching = sorted({owner[w] for w in ws if w in owner},
                          key=lambda b: -len(open_blocks[b][0]))
        if len(ws) > k:
            for b in touching:
                emit(b)
            out.append((tuple(sorted(ws)), [op]))
            continue
        while True:
            union = _span(set(ws).union(*[open_blocks[b][0] for b in touching]))
            extra = {owner[w] for w in union if w in owner} - set(touching)
            if extra:   # the window grew over other open blocks: they join too
                touching = sorted(set(touching) | extra, key=lambda b: -len(open_blocks[b][0]))
                continue
            if len(union) <= k:
                break
            emit(touching.pop(0))
        ops = []
        for b in sorted(touching):          # older blocks first keeps each wire's order
            ops.extend(open_blocks[b][1])
            wires, _ = open_blocks.pop(b)
            for w in wires:
                del owner[w]
        ops.append(op)
        open_blocks[next_id] = [union, ops]
        for w in union:
            owner[w] = next_id
        next_id += 1
    for b in sorted(open_blocks):
        emit(b)
    return out


def block_matrix(ops, wires, theta, rdtype, cdtype, device) -> torch.Tensor:
    """Product of ``ops`` embedded on ``wires`` (sorted): ``(B', 2**k, 2**k)``.

    The matrix is evolved as a ``2k``-qubit "state" whose first ``k`` qubits are its row index,
    so every gate reuses the simulator's own kernels.
    """
    k = len(wires)
    local = {w: i for i, w in enumerate(wires)}
    m = torch.eye(2 ** k, dtype=cdtype, device=device).reshape(1, 4 ** k)
    for op in ops:
        angles = op_angles(op, theta, rdtype)
        b = max([a.numel() for a in angles], default=1)
        if b > m.shape[0]:
            m = m.expand(b, -1).contiguous()
        m = apply_gate(m, op.gate, tuple(local[w] for w in op.wires), angles, 2 * k)
    return m.reshape(-1, 2 ** k, 2 ** k)


class Layout:
    """A state batch ``(B, 2**n)`` whose axes are stored in the order ``self.order`` (logical
    wires, most significant first), with a spare buffer for out-of-place block products."""

    def __init__(self, state: torch.Tensor, n: int):
        self.state = state
        self.spare = torch.empty_like(state)
        self.n = n
        self.order = list(range(n))

    def physical(self, wires) -> tuple:
        """Current axis positions of logical ``wires``."""
        return tuple(self.order.index(w) for w in wires)

    def _move_to_front(self, wires) -> None:
        """Permute so that ``wires`` (in that order) are the leading axes: one copy."""
        if self.order[:len(wires)] == list(wires):
            return
        pos = self.physical(wires)
        rest = [p for p in range(self.n) if p not in pos]
        b = self.state.shape[0]
        src = self.state.view(b, *([2] * self.n)).permute(0, *[1 + p for p in (*pos, *rest)])
        self.spare.view(b, *([2] * self.n)).copy_(src)
        self.state, self.spare = self.spare, self.state
        self.order = list(wires) + [self.order[p] for p in rest]

    def apply_block(self, u: torch.Tensor, wires) -> None:
        """Apply ``u`` ``(B', 2**k, 2**k)`` on logical ``wires`` (the order of ``u``'s index)."""
        k, b = len(wires), self.state.shape[0]
        pos = self.physical(wires)
        if list(pos) == list(range(pos[0], pos[0] + k)) and 2 ** (self.n - pos[0] - k) >= 256:
            # already contiguous with long rows: batched U @ S over the leading axes
            lead = 2 ** pos[0]
            s = self.state.view(b, lead, 2 ** k, -1)
            out = self.spare.view(b, lead, 2 ** k, -1)
            torch.matmul(u.unsqueeze(1), s, out=out)
        else:
            self._move_to_front(wires)
            s = self.state.view(b, 2 ** k, -1)
            out = self.spare.view(b, 2 ** k, -1)
            torch.matmul(u, s, out=out)
        self.state, self.spare = self.spare, self.state

    def finish(self, out: torch.Tensor) -> torch.Tensor:
        """The state in the canonical wire order (in ``out`` or in the spare buffer; returned)."""
        b = self.state.shape[0]
        if self.order == list(range(self.n)):
            if self.state.data_ptr() != out.data_ptr():
                out.copy_(self.state)
            return out
        perm = [self.order.index(w) for w in range(self.n)]
        src = self.state.view(b, *([2] * self.n)).permute(0, *[1 + p for p in perm])
        self.spare.view(b, *([2] * self.n)).copy_(src)
        return self.spare


def evolve_fused(state, operations, theta, n, rdtype, k: int):
    """In-place evolution with k-qubit block fusion; returns the final state (same storage as
    ``state`` where possible)."""
    lay = Layout(state, n)
    cdtype, device = state.dtype, state.device
    for wires, ops in plan_blocks(operations, k):
        # a gate whose wires span more than k (CNOT(0, 15)) runs alone: a block over its span
        # would hold 4**span entries per binding
        if len(ops) == 1 and (_cheap_alone(ops[0]) or len(wires) > k):
            op = ops[0]
            lay.state = apply_gate(lay.state, op.gate, lay.physical(op.wires),
                                   op_angles(op, theta, rdtype), n, inplace=True)
            continue
        u = block_matrix(ops, wires, theta, rdtype, cdtype, device)
        lay.apply_block(u, wires)
    return lay.finish(state)


def _cheap_alone(op) -> bool:
    """Gates whose own kernel beats a block product: diagonal, permutation, controlled, 1-qubit,
    or too wide to fuse."""
    g = op.gate
    return (g.diag_fn is not None or g.perm is not None or g.controls > 0 or g.num_wires == 1
            or g.num_wires > 3)


__all__ = ["plan_blocks", "block_matrix", "Layout", "evolve_fused"]
