"""Superoperators of a circuit's operations, and their fusion into blocks of one or two wires.

A density matrix ``rho`` ``(B, 2**n, 2**n)`` is handled as a vector on ``2n`` wires: row wire
``w`` is wire ``w``, column wire ``w`` is wire ``n + w``. An operation on wires ``W`` acts by a
superoperator ``S`` on the row and column wires of ``W``, ordered ``(rows of W, columns of W)``:
``U rho U^+`` by ``U (x) conj(U)``, a channel by ``sum_k K_k (x) conj(K_k)``.

Consecutive operations are fused (the plan depends only on the circuit's structure): one-qubit
operations on a wire wait until an operation of two wires touches it and are multiplied into
that operation's 16x16 superoperator; operations on the same pair of wires share one block. An
operation on three or more wires is applied on its own, as ``U`` on the rows and ``conj(U)`` on
the columns.

>>> import torch, qdiff as qd
>>> c = qd.Circuit(2, (qd.Operation(qd.get_gate("h"), (0,)), qd.Operation(qd.get_gate("cx"), (0, 1))))
>>> [b.wires for b in fusion_plan(c)]
[(0, 1)]
"""
from __future__ import annotations

import string
from dataclasses import dataclass

import torch

from qdiff.backends.statevector.gate_data import circuit_angles
from qdiff.circuits.channels import is_channel
from qdiff.circuits.circuit import memo

_LETTERS = string.ascii_letters


@dataclass(frozen=True)
class Block:
    """Operations (indices, in application order) fused on ``wires`` (one or two); ``big``: a
    single operation on three or more wires, applied as ``U`` and ``conj(U)``."""

    wires: tuple
    ops: tuple
    big: bool = False


def fusion_plan(circuit) -> list:
    """The blocks of ``circuit`` in application order (memoized per circuit)."""
    return memo(circuit, "mixed.fusion", lambda: _plan(circuit.operations))


def _plan(ops) -> list:
    blocks: list = []
    pending: dict = {}     # wire -> one-qubit op indices not yet applied
    open_pair: dict = {}   # wire -> index in blocks of a two-wire block still open to merging

    def close(w):
        open_pair.pop(w, None)

    def flush(w):
        if pending.get(w):
            blocks.append(Block((w,), tuple(pending.pop(w))))
        close(w)

    for i, op in enumerate(ops):
        ws = tuple(op.wires)
        if len(ws) == 1:
            pending.setdefault(ws[0], []).append(i)
            continue
        if len(ws) == 2:
            a, b = ws
            j = open_pair.get(a)
            before = pending.pop(a, []) + pending.pop(b, [])
            if j is not None and open_pair.get(b) == j:
                blk = blocks[j]
                blocks[j] = Block(blk.wires, blk.ops + tuple(before) + (i,))
                continue
            close(a)
            close(b)
            blocks.append(Block((a, b), tuple(before) + (i,)))
            open_pair[a] = open_pair[b] = len(blocks) - 1
            continue
        for w in ws:
            flush(w)
        for w in list(open_pair):
            if w in ws:
                close(w)
        blocks.append(Block(ws, (i,), big=True))
    for w in sorted(pending):
        flush(w)
    # a block merged into an earlier open pair keeps that position: what it absorbed commutes
    # with the blocks in between (those touch neither of its wires)
    return blocks


# ------------------------------------------------------------------------------------------
# superoperators of operations


def _unitary_superop(u: torch.Tensor) -> torch.Tensor:
    """``U (x) conj(U)`` of ``(..., d, d)``: ``(..., d*d, d*d)``."""
    d = u.shape[-1]
    s = torch.einsum("...ab,...cd->...acbd", u, u.conj())
    return s.reshape(*u.shape[:-2], d * d, d * d)


def op_matrices(ops, theta: torch.Tensor, rdtype, cdtype) -> list:
    """Per operation: ``("super", (B', D, D))`` for channels and gates on at most two wires,
    ``("unitary", (B', d, d))`` for gates on more. Each gate's or channel's function is
    evaluated once for all its uses."""
    angles = circuit_angles(ops, theta, rdtype)
    out = [None] * len(ops)
    groups: dict = {}
    for i, op in enumerate(ops):
        groups.setdefault(op.gate, []).append(i)
    for rec, idx in groups.items():
        chan = is_channel(rec)
        if rec.num_params:
            cols = [[angles[i][s] for i in idx] for s in range(rec.num_params)]
            width = max(a.shape[0] for col in cols for a in col)
            stacked = [torch.stack([a.expand(width) for a in col]) for col in cols]
            vals = (rec.superop_fn if chan else rec.matrix_fn)(*stacked)
        else:
            v = rec.superop_fn() if chan else rec.matrix_fn()
            vals = v.unsqueeze(0).unsqueeze(0).expand(len(idx), 1, *v.shape)
        vals = vals.to(device=theta.device, dtype=cdtype)
        big = not chan and rec.num_wires > 2
        if not chan and not big:
            vals = _unitary_superop(vals)
        for j, i in enumerate(idx):
            out[i] = ("unitary" if big else "super", vals[j])
    return out


def embed(s: torch.Tensor, op_wires: tuple, block_wires: tuple) -> torch.Tensor:
    """A superoperator ``(B', D, D)`` on ``op_wires`` as one on ``block_wires`` (a superset of
    at most two wires), identity on the others; both ordered (rows, columns)."""
    if tuple(op_wires) == tuple(block_wires):
        return s
    k, m = len(block_wires), len(op_wires)
    bp = s.shape[0]
    t = s.reshape(bp, *([2] * (4 * m)))
    # letters of the block's output rows, output cols, input rows, input cols
    ro, co, ri, ci = ([_LETTERS[g * k + p] for p in range(k)] for g in range(4))
    pos = [block_wires.index(w) for w in op_wires]
    src = "z" + "".join(ro[p] for p in pos) + "".join(co[p] for p in pos) + \
        "".join(ri[p] for p in pos) + "".join(ci[p] for p in pos)
    free = [p for p in range(k) if p not in pos]
    eye = torch.eye(2, dtype=s.dtype, device=s.device)
    operands, specs = [t], [src]
    for p in free:
        operands += [eye, eye]
        specs += [ro[p] + ri[p], co[p] + ci[p]]
    res = "z" + "".join(ro) + "".join(co) + "".join(ri) + "".join(ci)
    out = torch.einsum(",".join(specs) + "->" + res, *operands)
    d = 4 ** k
    return out.reshape(bp, d, d)


def block_superop(block: Block, mats: list, ops) -> torch.Tensor:
    """The product of the block's embedded superoperators (last applied leftmost)."""
    total = None
    for i in block.ops:
        s = embed(mats[i][1], tuple(ops[i].wires), block.wires)
        total = s if total is None else torch.matmul(s, total)
    return total
