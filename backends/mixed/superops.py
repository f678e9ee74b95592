"""Superoperators of a circuit's operations, and their fusion into blocks of one or two wires.

A density matrix ``rho`` ``(B, 2**n, 2**n)`` is handled as a vector on ``2n`` wires: row wire
``w`` is wire ``w``, column wire ``w`` is wire ``n + w``. An operation on wires ``W`` acts by a
superoperator ``S`` on the row and column wires of ``W``, ordered ``(rows of W, columns of W)``:
``U rho U^+`` by ``U (x) conj(U)``, a channel by ``sum_k K_k (x) conj(K_k)``.

Consecutive operations are fused (the plan depends only on the circuit's structure): one-qubit
operations on a wire wait until an operation of two wires touches it and are multiplied into
that operation's 16x16 superoperator; operations on the same pair of wires share one block. An
operation on three or more wires is applied on its own: a gate as ``U`` on the rows and
``conj(U)`` on the columns, a channel by its superoperator on both.

>>> import torch, qdiff as qd
>>> c = qd.Circuit(2, (qd.Operation(qd.get_gate("h"), (0,)), qd.Operation(qd.get_gate("cx"), (0, 1))))
>>> [b.wires for b, _ in fusion_plan(c)]
[(0, 1)]
"""
from __future__ import annotations

import string
from dataclasses import dataclass

import torch

from qdiff.backends.statevector.gate_data import circuit_angles
from qdiff.circuits import caches
from qdiff.circuits.channels import is_channel
from qdiff.circuits.circuit import has_variable_matrix, memo

_LETTERS = string.ascii_letters


@dataclass(frozen=True)
class Block:
    """Operations (indices, in application order) fused on ``wires`` (one or two); ``big``: a
    single operation on three or more wires, applied as ``U`` and ``conj(U)``."""

    wires: tuple
    ops: tuple
    big: bool = False


def fusion_plan(circuit) -> list:
    """``[(block, steps)]`` of ``circuit`` in application order (memoized per circuit)."""
    return memo(circuit, "mixed.fusion", lambda: [
        (b, None if b.big else block_steps(b, circuit.operations))
        for b in _plan(circuit.operations)])


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


def unitary_superop(u: torch.Tensor) -> torch.Tensor:
    """``U (x) conj(U)`` of ``(..., d, d)``: ``(..., d*d, d*d)``."""
    d = u.shape[-1]
    s = torch.einsum("...ab,...cd->...acbd", u, u.conj())
    return s.reshape(*u.shape[:-2], d * d, d * d)


def op_matrices(ops, theta: torch.Tensor, rdtype, cdtype, skip=None) -> list:
    """Per operation (``None`` where ``skip(op)``): ``("super", (B', D, D))`` for channels and gates on at most two wires,
    ``("unitary", (B', d, d))`` for gates on more. Each gate's or channel's function is
    evaluated once for all its uses."""
    angles = circuit_angles(ops, theta, rdtype) if ops else []
    out = [None] * len(ops)
    groups: dict = {}
    for i, op in enumerate(ops):
        if skip is None or not skip(op):
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
            vals = unitary_superop(vals)
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


def is_constant(op) -> bool:
    """No theta column, no tensor among the parameters and no matrix that requires grad or
    varies under a torch.func transform: the superoperator is a constant."""
    return all(type(p) is float or type(p) is int for p in op.params) and \
        not has_variable_matrix(op)


def _fold(idx, ops) -> tuple:
    """A run of one-wire ops as entries ``("v", i)`` (variable) and ``("c", (i, ...))`` (a
    run of constant ops, multiplied once and cached)."""
    out, run = [], []
    for i in idx:
        if is_constant(ops[i]):
            run.append(i)
            continue
        if run:
            out.append(("c", tuple(run)))
            run = []
        out.append(("v", i))
    if run:
        out.append(("c", tuple(run)))
    return tuple(out)


def block_steps(block: Block, ops) -> tuple:
    """The block as steps: ``("chain", entries)`` for a one-wire block; ``("kron", entries
    on the first wire, entries on the second)`` and ``("two", op)`` for a pair: one-qubit
    runs are multiplied as 4x4s and embedded once per two-qubit operation. Runs of constant
    steps are folded into ``("const", steps)`` (computed once per circuit)."""
    if len(block.wires) == 1:
        return (("chain", _fold(block.ops, ops)),)
    a, b = block.wires
    steps, ca, cb = [], [], []
    for i in block.ops:
        ws = tuple(ops[i].wires)
        if len(ws) == 1:
            (ca if ws[0] == a else cb).append(i)
            continue
        if ca or cb:
            steps.append(("kron", _fold(ca, ops), _fold(cb, ops)))
            ca, cb = [], []
        steps.append(("two", i))
    if ca or cb:
        steps.append(("kron", _fold(ca, ops), _fold(cb, ops)))
    out, run = [], []
    for st in steps:
        const = (st[0] == "two" and is_constant(ops[st[1]])) or \
            (st[0] == "kron" and all(e[0] == "c" for e in st[1] + st[2]))
        if const:
            run.append(st)
            continue
        if run:
            out.append(("const", tuple(run)))
            run = []
        out.append(st)
    if run:
        out.append(("const", tuple(run)))
    return tuple(out)


class Evaluator:
    """Evaluates block steps from the per-call matrices ``mats`` (variable ops only) and a
    cache of constant factors (kept per circuit, dtype and torch device)."""

    def __init__(self, ops, mats, cache: dict, cdtype, device):
        self.ops, self.mats, self.cache = ops, mats, cache
        self.cdtype, self.device = cdtype, device
        self._const_mats = None
        self.pre: dict = {}     # chain entries -> value, computed in batches by prefetch
        self.krons: dict = {}   # (block index, step index) -> value

    def _signature(self, entries) -> tuple:
        sig = []
        for kind, val in entries:
            if kind == "v":
                sig.append(("v", self.ops[val].gate))
            else:
                sig.append(("c", tuple((self.ops[j].gate, self.ops[j].params) for j in val)))
        return tuple(sig)

    def prefetch(self, plan) -> None:
        """Evaluate every one-wire chain and every kron step of ``plan`` in a few batched
        products: chains of the same shape (gate types and constant values, position by
        position) are stacked, so the autograd graph has a few nodes per circuit rather than
        several per block."""
        chains, krons = {}, []
        for bi, (blk, steps) in enumerate(plan):
            if blk.big:
                continue
            for si, st in enumerate(steps):
                if st[0] == "chain":
                    chains[st[1]] = None
                elif st[0] == "kron":
                    chains[st[1]] = chains[st[2]] = None
                    krons.append((bi, si, st))
        chains.pop((), None)
        width = max([self.mats[i][1].shape[0] for e in chains for k, i in e if k == "v"] or [1])
        groups: dict = {}
        for ent in chains:
            groups.setdefault(self._signature(ent), []).append(ent)
        for members in groups.values():
            total = None
            for pos, (kind, val) in enumerate(members[0]):
                if kind == "c":
                    f = self.const(("c", val))
                else:
                    f = torch.stack([self.op(m[pos][1]).expand(width, 4, 4) for m in members])
                total = f if total is None else torch.matmul(f, total)
            if total.dim() == 3:  # constants only
                for m in members:
                    self.pre[m] = total
            else:
                for m, t in zip(members, total.unbind(0)):
                    self.pre[m] = t
        if not krons:
            return
        eye = torch.eye(4, dtype=self.cdtype, device=self.device).expand(width, 4, 4)

        def val(entries):
            return eye if not entries else self.pre[entries].expand(width, 4, 4)
        xa = torch.stack([val(st[1]) for _, _, st in krons]).reshape(-1, width, 2, 2, 2, 2)
        xb = torch.stack([val(st[2]) for _, _, st in krons]).reshape(-1, width, 2, 2, 2, 2)
        k = torch.einsum("kzabcd,kzefgh->kzaebfcgdh", xa, xb).reshape(-1, width, 16, 16)
        for (bi, si, _), t in zip(krons, k.unbind(0)):
            self.krons[(bi, si)] = t

    def const_mats(self):
        if self._const_mats is None:
            with caches.constants():
                theta = torch.zeros(1, 0, dtype=torch.float64, device=self.device)
                idx = [i for i, op in enumerate(self.ops) if is_constant(op)]
                rd = torch.float32 if self.cdtype == torch.complex64 else torch.float64
                vals = op_matrices([self.ops[i] for i in idx], theta, rd, self.cdtype)
                self._const_mats = dict(zip(idx, vals))
        return self._const_mats

    def op(self, i):
        m = self.mats[i] if self.mats[i] is not None else self.const_mats()[i]
        return m[1]

    def chain(self, entries):
        if entries in self.pre:
            return self.pre[entries]
        total = None
        for kind, val in entries:
            s = self.const(("c", val)) if kind == "c" else self.op(val)
            total = s if total is None else torch.matmul(s, total)
        return total

    def const(self, key):
        got = self.cache.get(key)
        if got is None:
            with caches.constants():  # kept on the circuit: plain tensors, no history
                if key[0] == "c":
                    got = None
                    for i in key[1]:
                        s = self.op(i)
                        got = s if got is None else torch.matmul(s, got)
                else:
                    got = self.steps(key[1], key[2], None)
            self.cache[key] = got
        return got

    def steps(self, steps, block, index=None):
        total = None
        for si, st in enumerate(steps):
            if st[0] == "chain":
                s = self.chain(st[1])
            elif st[0] == "kron" and (index, si) in self.krons:
                s = self.krons[(index, si)]
            elif st[0] == "kron":
                s = kron_pair(self.chain(st[1]), self.chain(st[2]), self.cdtype, self.device)
            elif st[0] == "two":
                s = embed(self.op(st[1]), tuple(self.ops[st[1]].wires), block.wires)
            else:
                s = self.const(("s", st[1], block))
            total = s if total is None else torch.matmul(s, total)
        return total


def kron_pair(x, y, cdtype, device):
    """``(rows a, rows b, cols a, cols b)`` superoperator of one-wire superoperators ``x`` on
    the first wire and ``y`` on the second (``None``: identity)."""
    eye = torch.eye(4, dtype=cdtype, device=device).unsqueeze(0)
    x = eye if x is None else x
    y = eye if y is None else y
    bx, by = x.shape[0], y.shape[0]
    k = torch.einsum("...abcd,...efgh->...aebfcgdh", x.reshape(bx, 2, 2, 2, 2),
                     y.reshape(by, 2, 2, 2, 2))
    return k.reshape(max(bx, by), 16, 16)
