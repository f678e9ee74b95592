"""The mixed engine's reverse mode: a vector-Jacobian product by one backward sweep of the
observable through the adjoint (Heisenberg-picture) maps.

The circuit is a product of fused blocks (:mod:`qdiff.backends.mixed.superops`),
``rho_k = S_k rho_{k-1}``. For flat outputs ``f(rho_L)`` (expval, var, probs, readout errors
included) and a cotangent ``g``, ``F = sum g f`` is locally linear in ``rho_L``:
``dF = Re <lam_L, d rho_L>`` with ``lam_L`` the gradient of ``F`` at ``rho_L`` (the
cotangent-weighted observable, found by torch on the measurement only). The sweep walks the
blocks backwards:

    rho_{k-1}: un-applied exactly for a unitary block (S^+ rho), else stored or recomputed
    M_k[i, j] = sum_rest conj(lam_k[i, rest]) rho_{k-1}[j, rest]    (block-sized, (B, D, D))
    lam_{k-1} = S_k^+ lam_k

and ``dF/dS_k = M_k``: the gradient of each parameter inside a block follows from ``M_k`` by
products of the block's small factors (16x16 and 4x4 superoperators: the environment of each
operation's superoperator, for blocks of one structure at once), and finally from the
operation's own superoperator as a function of its parameters: a gate's by its exact matrix
derivative (``-iGU``, or the spectral-shift formula of its generators), a channel's by torch
autograd on its small superoperator function (so every channel parameter is differentiable).

States of non-unitary blocks are kept as checkpoints: every input when memory allows, else
one every ``interval`` blocks with the segment in between recomputed; the batch is split into
chunks whose working set fits the memory budget (:func:`plan`, counted in density matrices of
one binding: see :data:`WORKING`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from qdiff.backends.base import flat_outputs
from qdiff.backends.mixed.measure import measure_all
from qdiff.backends.mixed.simulate import apply_on, is_superop, state_bytes, zero_density
from qdiff.backends.mixed.superops import (Evaluator, kron_pair, embed,
                                           fusion_plan, is_constant, op_matrices)
from qdiff.backends.statevector.gate_data import circuit_angles, derivative_weights
from qdiff.circuits import caches, memory
from qdiff.circuits.channels import is_channel
from qdiff.circuits.circuit import memo
from qdiff.circuits.errors import QdiffError, QdiffMemoryError
from qdiff.circuits.gates import generator_on_left
from qdiff.circuits.operation import ParamRef

#: Density matrices (per binding) the sweep holds besides its checkpoints: the state, the
#: observable, and the transient copies of one block product or overlap (einsum's permuted
#: operands and its output).
WORKING = 5.0
KINDS = ("expval", "var", "probs")


# ------------------------------------------------------------------------------------------
# the memory plan


#: Block-sized matrices (per binding and block) the reverse mode holds: the block's
#: superoperator, its factors, the overlap ``M_k`` and the stacked environments.
BLOCK_COPIES = 5.0
# bindings of one chunk hold at most this many bytes of one density matrix each, memory
# permitting: the sweep's batched products slow down per binding on large states (measured at
# n = 10: two bindings in one chunk cost 1.9x the time of two chunks of one; at n <= 9 a chunk
# of several costs the same or less)
CHUNK_STATE_BYTES = 16 * 2**20


@dataclass(frozen=True)
class Plan:
    """How a batch is run in reverse: ``chunk`` bindings at a time; inputs of non-unitary
    blocks kept every ``interval`` of them (1: all kept, no recomputation); ``states``: density
    matrices per binding held at the peak; ``need``: the bytes of one chunk (those states and
    the blocks' own matrices)."""

    chunk: int
    interval: int
    states: float
    need: float


def states_needed(stored: int, interval: int) -> float:
    """Density matrices per binding: checkpoints, the recomputed segment, the working set."""
    if stored == 0:
        return WORKING
    if interval <= 1:
        return stored + WORKING
    return math.ceil(stored / interval) + (interval - 1) + WORKING


def block_bytes(circuit, cdtype) -> float:
    """Bytes per binding of the block-sized matrices the reverse mode holds
    (:data:`BLOCK_COPIES` per block: its ``D x D`` superoperator, ``D = 4**wires``)."""
    return BLOCK_COPIES * cdtype.itemsize * sum(
        16.0 ** len(blk.wires) for blk, _ in fusion_plan(circuit))


def plan(n: int, batch: int, stored: int, cdtype, device, budget: Optional[float] = None,
         extra: float = 0.0) -> Plan:
    """The reverse mode's plan for ``batch`` bindings of ``n`` wires with ``stored`` non-unitary
    blocks and ``extra`` bytes per binding besides the density matrices (:func:`block_bytes`),
    within ``budget`` bytes (default: the memory budget of ``device``): every block input kept,
    the largest chunk of bindings that fits, of at most :data:`CHUNK_STATE_BYTES` of one
    density matrix each (the whole batch when it does); when not even one
    binding fits so, checkpoints every ~sqrt(stored) blocks. Raises
    :class:`~qdiff.circuits.errors.QdiffMemoryError` when one binding does not fit either way."""
    one = state_bytes(n, cdtype)
    full = states_needed(stored, 1)
    most = min(batch, max(1, int(CHUNK_STATE_BYTES // one)))
    if budget is None:
        if (full * one + extra) * most < memory.ALWAYS_FITS and memory.env_limit() is None:
            return Plan(most, 1, full, (full * one + extra) * most)
        budget = memory.budget(device)
    fits = int(budget // (full * one + extra))
    if fits >= 1:
        c = min(most, fits)
        return Plan(c, 1, full, (full * one + extra) * c)
    interval = math.isqrt(max(stored - 1, 0)) + 1  # ceil(sqrt(stored))
    per = states_needed(stored, interval)
    fits = int(budget // (per * one + extra))
    if fits >= 1:
        c = min(most, fits)
        return Plan(c, interval, per, (per * one + extra) * c)
    raise QdiffMemoryError(
        f"the reverse mode on {n} qubits as density matrices needs about "
        f"{memory.gib(per * one + extra)} for one binding ({per:g} density matrices of "
        f"{memory.gib(one)}: checkpoints of {stored} non-unitary blocks every {interval}, the "
        f"recomputed segment and the working set; and the blocks' own matrices) but the memory "
        f"budget is {memory.gib(budget)}"
        + ("; the blocks' superoperators (16**wires entries each) are most of it: "
           "diff_method='backprop' holds none" if extra > per * one else ""))


# ------------------------------------------------------------------------------------------
# blocks: their factors and superoperators


@dataclass
class Blocks:
    """A circuit's fused blocks for one set of bindings: the evaluator of their factors, each
    block's superoperator (``(B', D, D)``, or a big block's ``(B', d, d)`` unitary), which are
    unitary, which hold trainable operations."""

    plan: list
    ev: Evaluator
    mats: list
    unitary: list
    trainable: list
    values: list = field(default_factory=list)

    def step_values(self, bi: int) -> list:
        blk, steps = self.plan[bi]
        ev = self.ev
        out = []
        for si, st in enumerate(steps):
            if st[0] == "chain":
                out.append(ev.chain(st[1]))
            elif st[0] == "kron":
                out.append(ev.krons[(bi, si)] if (bi, si) in ev.krons else
                           kron_pair(ev.chain(st[1]), ev.chain(st[2]), ev.cdtype, ev.device))
            elif st[0] == "two":
                out.append(embed(ev.op(st[1]), tuple(ev.ops[st[1]].wires), blk.wires))
            else:
                out.append(_as_perm(ev, ("s", st[1], blk)))
        return out


@dataclass(frozen=True, eq=False)
class Perm:
    """A constant permutation superoperator (a CNOT, SWAP, ... block step): ``T[i, j] = 1``
    iff ``j = idx[i]``; products with it are gathers. ``dense``: the matrix itself."""

    idx: torch.Tensor
    inv: torch.Tensor
    dense: torch.Tensor


def _as_perm(ev, key):
    """The constant step ``key`` as a :class:`Perm` when it is a permutation (decided once
    per circuit), else its matrix."""
    val = ev.const(key)
    got = ev.cache.get(("perm", key))
    if got is None:
        got = False
        m = val.reshape(val.shape[-2:]) if val.shape[0] == 1 else None
        if m is not None and bool(((m == 0) | (m == 1)).all()) and \
                bool((m.real.sum(0) == 1).all()) and bool((m.real.sum(1) == 1).all()):
            with caches.constants():  # kept on the circuit
                idx = m.real.argmax(1)
                got = Perm(idx, torch.argsort(idx), val)
        ev.cache[("perm", key)] = got
    return val if got is False else got


def _dense(x):
    return x.dense if isinstance(x, Perm) else x


def _mm(a, b):
    """``a @ b`` (either may be a :class:`Perm`)."""
    if isinstance(a, Perm):
        return _dense(b)[..., a.idx, :]
    if isinstance(b, Perm):
        return a[..., :, b.inv]
    return torch.matmul(a, b)


def _tmm(a, e):
    """``a^T @ e``."""
    if isinstance(a, Perm):
        return e[..., a.inv, :]
    return torch.matmul(_t(a), e)


def _mmt(e, r):
    """``e @ r^T``."""
    if isinstance(r, Perm):
        return e[..., :, r.idx]
    return torch.matmul(e, _t(r))


def trainable_ops(circuit, trainable) -> set:
    return {i for i, op in enumerate(circuit.operations)
            if any(isinstance(p, ParamRef) and trainable[p.index] for p in op.params)}


def build_blocks(circuit, theta: torch.Tensor, cdtype, device, trainable) -> Blocks:
    ops = circuit.operations
    rdtype = torch.float32 if cdtype == torch.complex64 else torch.float64
    fplan = fusion_plan(circuit)
    mats = op_matrices(ops, theta, rdtype, cdtype, skip=is_constant)
    cache = memo(circuit, ("mixed.constants", cdtype, str(device)), dict)
    ev = Evaluator(ops, mats, cache, cdtype, device)
    ev.prefetch(fplan)
    train = trainable_ops(circuit, trainable)
    unitary = [not any(is_channel(ops[i].gate) for i in blk.ops) for blk, _ in fplan]
    has = [any(i in train for i in blk.ops) for blk, _ in fplan]
    return Blocks(fplan, ev, mats, unitary, has)


def block_superops(blocks: Blocks) -> list:
    """Each block's superoperator (a big block's unitary); the factors of each block are kept
    in ``blocks.values`` for the environments."""
    out = []
    blocks.values = []
    for bi, (blk, steps) in enumerate(blocks.plan):
        if blk.big:
            out.append(blocks.ev.op(blk.ops[0]))
            blocks.values.append(None)
            continue
        vals = blocks.step_values(bi)
        blocks.values.append(vals)
        total = None
        for s in vals:
            total = s if total is None else _mm(s, total)
        out.append(_dense(total))
    return out


def _apply_block(vec, blk, s, n, dagger=False):
    m = 2 * n
    cols = tuple(n + w for w in blk.wires)
    if blk.big and not is_superop(s, blk.wires):
        u = s.conj().transpose(-1, -2) if dagger else s
        vec = apply_on(vec, u, blk.wires, m)
        return apply_on(vec, u.conj(), cols, m)
    if dagger:
        s = s.conj().transpose(-1, -2)
    return apply_on(vec, s, blk.wires + cols, m)


def overlap_on(lam: torch.Tensor, vec: torch.Tensor, wires, m: int) -> torch.Tensor:
    """``M[b, i, j] = sum_rest conj(lam[b, i, rest]) vec[b, j, rest]`` over ``wires`` (in
    order) of two ``(B, 2**m)`` vectors: ``(B, 2**k, 2**k)`` (both brought to ``(B, 2**k,
    rest)`` by one permuted copy each, then one product with the conjugate transpose)."""
    b, k = vec.shape[0], len(wires)
    order = [0] + [1 + w for w in wires] + [1 + w for w in range(m) if w not in set(wires)]
    p = vec.view(b, *([2] * m)).permute(*order).reshape(b, 2 ** k, -1)
    q = lam.view(b, *([2] * m)).permute(*order).reshape(b, 2 ** k, -1)
    return torch.matmul(p, q.mH).transpose(-1, -2)


# ------------------------------------------------------------------------------------------
# environments: dF/dS of each operation from dF/dS of its block


def _t(x):
    return x.transpose(-1, -2)


def _stack(vals: list, b: int):
    """``(G*b, D, D)`` from ``G`` tensors ``(b or 1, D, D)``; one :class:`Perm` when all
    are the same permutation."""
    if isinstance(vals[0], Perm) and all(isinstance(v, Perm) and torch.equal(v.idx, vals[0].idx)
                                         for v in vals):
        return vals[0]
    vals = [_dense(v).expand(b, *_dense(v).shape[-2:]) for v in vals]
    return torch.stack(vals).reshape(-1, *vals[0].shape[-2:])


def _split(env: torch.Tensor, keys: list, out: dict) -> None:
    parts = env.reshape(len(keys), -1, *env.shape[-2:]).unbind(0)
    for key, part in zip(keys, parts):
        out.setdefault(key, []).append(part)


def _prefix(vals: list) -> list:
    """``right[j]``: the product of ``vals[:j]`` (application order; ``None`` for none)."""
    right = [None]
    for v in vals[:-1]:
        right.append(v if right[-1] is None else _mm(v, right[-1]))
    return right


def _entry_value(ev, entry):
    kind, val = entry
    return ev.const(("c", val)) if kind == "c" else ev.op(val)


def _chain_envs(ev, chains: list, env, b: int, train: set, out: dict) -> None:
    """Distribute ``env`` ``(G*b, 4, 4)`` (``dF/dP`` of the ``G`` chain products ``P``, chains of
    one signature) over the chains' entries."""
    vals = [_stack([_entry_value(ev, ch[j]) for ch in chains], b) for j in range(len(chains[0]))]
    right = _prefix(vals)
    e = env
    for j in range(len(vals) - 1, -1, -1):
        kind, val = chains[0][j]
        if kind == "v" and val in train:
            _split(e if right[j] is None else torch.matmul(e, _t(right[j])),
                   [ch[j][1] for ch in chains], out)
        if j:
            e = torch.matmul(_t(vals[j]), e)


def _wants(entries, train) -> bool:
    return any(k == "v" and v in train for k, v in entries)


def _kron_envs(ev, sts: list, env, b: int, train: set, out: dict) -> None:
    """Environments of the two chains of kron steps: partial traces of ``env`` against the
    other chain's product."""
    # rows (a e b f), cols (c g d h) -> (a b c d) x (e f g h): wire-first and wire-second parts
    r = env.reshape(-1, 2, 2, 2, 2, 2, 2, 2, 2).permute(0, 1, 3, 5, 7, 2, 4, 6, 8)
    r = r.reshape(-1, 16, 16)
    first, second = [st[1] for st in sts], [st[2] for st in sts]
    eye = torch.eye(4, dtype=env.dtype, device=env.device).reshape(1, 16, 1)
    if _wants(first[0], train):
        y = eye if not second[0] else _stack([ev.chain(c) for c in second], b).reshape(-1, 16, 1)
        ea = torch.matmul(r, y)
        _chain_envs(ev, first, ea.reshape(-1, 4, 4), b, train, out)
    if _wants(second[0], train):
        x = eye if not first[0] else _stack([ev.chain(c) for c in first], b).reshape(-1, 16, 1)
        eb = torch.matmul(_t(r), x)
        _chain_envs(ev, second, eb.reshape(-1, 4, 4), b, train, out)


def _signature(blocks: Blocks, bi: int, train: set):
    """Blocks of one signature have their environments computed together (stacked)."""
    blk, steps = blocks.plan[bi]
    if blk.big:
        return ("big", bi)

    def ent(entries):
        return tuple((k, k == "v" and v in train) for k, v in entries)
    sig = []
    for st in steps:
        if st[0] == "chain":
            sig.append(("chain", ent(st[1])))
        elif st[0] == "kron":
            sig.append(("kron", ent(st[1]), ent(st[2])))
        elif st[0] == "two":
            ops = blocks.ev.ops
            sig.append(("two", st[1] in train, tuple(ops[st[1]].wires) == tuple(blk.wires)))
        else:
            sig.append(("const",))
    return tuple(sig)


def _step_wanted(sig) -> bool:
    return (sig[0] == "two" and sig[1]) or \
        (sig[0] in ("chain", "kron") and any(f for part in sig[1:] for _, f in part))


def block_envs(blocks: Blocks, ms: dict, train: set) -> dict:
    """``{op: [environment]}``: ``dF/dS_op`` (in the operation's own ordering, ``(B, D, D)``)
    of every trainable operation, from ``ms[k]`` = ``dF/dS_k`` of the blocks holding them;
    blocks of one structure are handled together as one stack."""
    out: dict = {}
    groups: dict = {}
    for k in ms:
        groups.setdefault(_signature(blocks, k, train), []).append(k)
    ev, ops = blocks.ev, blocks.ev.ops
    for sig, ks in groups.items():
        b = ms[ks[0]].shape[0]
        if sig[0] == "big":
            out.setdefault(blocks.plan[ks[0]][0].ops[0], []).append(ms[ks[0]])
            continue
        m = torch.stack([ms[k] for k in ks]).reshape(-1, *ms[ks[0]].shape[-2:])
        steps = [blocks.plan[k][1] for k in ks]
        vals: dict = {}

        def val(t):
            if t not in vals:
                vals[t] = _stack([blocks.values[k][t] for k in ks], b)
            return vals[t]
        rights = {0: None}

        def right(t):  # the product of the steps before t
            if t not in rights:
                r = right(t - 1)
                rights[t] = val(t - 1) if r is None else _mm(val(t - 1), r)
            return rights[t]
        last = max((t for t in range(len(sig)) if _step_wanted(sig[t])), default=-1)
        first = min((t for t in range(len(sig)) if _step_wanted(sig[t])), default=len(sig))
        e = m
        for t in range(len(sig) - 1, last, -1):
            e = _tmm(val(t), e)
        for t in range(last, -1, -1):
            if t < first:
                break
            if _step_wanted(sig[t]):
                kind = sig[t][0]
                env = e if right(t) is None else _mmt(e, right(t))
                sts = [st[t] for st in steps]
                if kind == "chain":
                    _chain_envs(ev, [st[1] for st in sts], env, b, train, out)
                elif kind == "kron":
                    _kron_envs(ev, sts, env, b, train, out)
                else:
                    if not sig[t][2]:  # the block's pair in the other order
                        env = env.reshape(-1, *([2] * 8)).permute(0, 2, 1, 4, 3, 6, 5, 8, 7)
                        env = env.reshape(-1, 16, 16)
                    _split(env, [st[1] for st in sts], out)
            if t > first:
                e = _tmm(val(t), e)
    return out


def _gate_slot_grads(rec, cols: list, env: torch.Tensor, slots: list) -> dict:
    """``{slot: (count, B)}``: ``Re sum dS/dphi * env`` for a gate ``S = U (x) conj(U)``, with
    ``dU/dphi`` exact by the spectral-shift formula of the gate's generators (forward-mode AD
    of its matrix function for a gate without them)."""
    u = rec.matrix_fn(*cols).to(env.dtype)
    d = u.shape[-1]
    e = env.reshape(*env.shape[:-2], d, d, d, d)  # [row out, col out, row in, col in]
    w = torch.einsum("...acbd,...cd->...ab", e, u.conj())  # pairs with dU (x) conj(U)
    v = torch.einsum("...acbd,...ab->...cd", e, u)         # pairs with U (x) conj(dU)
    out = {}
    for s in slots:
        if rec.generators is not None and rec.num_params == 1 and \
                generator_on_left(rec):  # U = exp(-i phi G) V
            g = torch.as_tensor(np.asarray(rec.generators[0]), dtype=u.dtype, device=u.device)
            du = -1j * torch.matmul(g, u)
        elif rec.generators is not None:
            shifts, weights = derivative_weights(rec, s, "mat")
            du = None
            for sh, wt in zip(shifts, weights):
                args = [c + sh if p == s else c for p, c in enumerate(cols)]
                term = wt * rec.matrix_fn(*args).to(env.dtype)
                du = term if du is None else du + term
        else:
            import torch.autograd.forward_ad as fwad
            with fwad.dual_level():
                args = list(cols)
                args[s] = fwad.make_dual(cols[s], torch.ones_like(cols[s]))
                du = fwad.unpack_dual(rec.matrix_fn(*args)).tangent.to(env.dtype)
        out[s] = ((du * w).sum((-1, -2)) + (du.conj() * v).sum((-1, -2))).real
    return out


def gradients(circuit, theta: torch.Tensor, envs: dict, trainable, rdtype) -> torch.Tensor:
    """``(B, P)``: ``Re sum dS_op/dparam * env_op`` for every trainable parameter (grouped by
    gate or channel): gates by their exact matrix derivatives, channels by torch autograd on
    their own superoperator function (small: ``(count, B, 4, 4)``)."""
    b, p = theta.shape
    if not envs:
        return torch.zeros(b, p, dtype=rdtype, device=theta.device)
    # out of place, column by column: under torch.func.vmap the terms are batched tensors
    columns: dict = {}
    ops = circuit.operations
    idx = sorted(envs)
    groups: dict = {}
    for i in idx:
        groups.setdefault(ops[i].gate, []).append(i)
    angles = circuit_angles([ops[i] for i in idx], theta.detach(), rdtype)
    ang = dict(zip(idx, angles))
    for rec, members in groups.items():
        cols = [torch.stack([ang[i][s].expand(b) for i in members]) for s in range(rec.num_params)]
        env = torch.stack([e[0] if len(e) == 1 else sum(e) for e in (envs[i] for i in members)])
        slots = [s for s in range(rec.num_params)
                 if any(isinstance(ops[i].params[s], ParamRef) and
                        trainable[ops[i].params[s].index] for i in members)]
        if is_channel(rec):
            gs = _pullback(lambda *cs: (rec.superop_fn(*cs).to(env.dtype) * env).real.sum(),
                           [c.detach() for c in cols], None)
            got = {s: gs[s] for s in slots if gs[s] is not None}
        else:
            got = _gate_slot_grads(rec, cols, env, slots)
        for s, g in got.items():
            for j, i in enumerate(members):
                par = ops[i].params[s]
                if isinstance(par, ParamRef) and trainable[par.index]:
                    term = par.scale * g[j].to(rdtype)
                    k = par.index
                    columns[k] = term if k not in columns else columns[k] + term
    zero = torch.zeros(b, dtype=rdtype, device=theta.device)
    return torch.stack([columns.get(k, zero).expand(b) for k in range(p)], dim=1)


# ------------------------------------------------------------------------------------------
# forward with checkpoints, and the sweep


@dataclass
class Tape:
    """One chunk's forward: the final state and the kept inputs of non-unitary blocks
    (``stored[k]`` is ``rho_{k-1}`` of block ``k`` as a ``(B, 4**n)`` vector)."""

    rho: torch.Tensor
    stored: dict = field(default_factory=dict)


def _kept(blocks: Blocks, interval: int) -> list:
    """Blocks whose input the forward keeps: non-unitary ones, every ``interval``-th."""
    nu = [k for k, u in enumerate(blocks.unitary) if not u]
    return nu[::interval] if interval > 1 else nu


def forward(blocks: Blocks, sups: list, vec: torch.Tensor, n: int, interval: int,
            start: int = 0, stop: Optional[int] = None, keep=None) -> Tape:
    """Run blocks ``start..stop-1`` from ``vec``, keeping the inputs of the blocks in ``keep``
    (default: those of :func:`_kept`)."""
    stop = len(sups) if stop is None else stop
    keep = set(_kept(blocks, interval)) if keep is None else keep
    tape = Tape(vec)
    for k in range(start, stop):
        if k in keep:
            tape.stored[k] = vec
        vec = _apply_block(vec, blocks.plan[k][0], sups[k], n)
    tape.rho = vec
    return tape


def observable(rho_vec, circuit, cotangent, n, readout) -> torch.Tensor:
    """``lam_L``: the gradient of ``sum g * flat outputs`` at ``rho_L``, ``(B, 4**n)``."""
    bad = [m.kind for m in circuit.measurements if m.kind not in KINDS]
    if bad:
        raise QdiffError(f"{bad[0]}() outputs are not differentiable with the mixed device's "
                         f"reverse mode; use diff_method='backprop'")
    b = rho_vec.shape[0]
    d = 2 ** n
    def outputs(r):
        return flat_outputs(measure_all(r, circuit, None, None, readout))
    (lam,) = _pullback(outputs, [rho_vec.detach().reshape(b, d, d)], cotangent)
    return lam.reshape(b, d * d)


def _pullback(fn, inputs: list, cotangent) -> tuple:
    """The gradients of ``<cotangent, fn(*inputs)>`` (``cotangent`` None: ``fn`` is a scalar)
    with respect to ``inputs`` (``None`` where unused): by autograd, or by ``torch.func.vjp``
    inside torch.func transforms (where ``requires_grad_`` is refused)."""
    with torch.enable_grad():
        if torch._C._are_functorch_transforms_active():
            out, pull = torch.func.vjp(fn, *inputs)
            g = torch.ones_like(out) if cotangent is None else \
                cotangent.to(device=out.device, dtype=out.dtype)
            return pull(g)
        leaves = [x.requires_grad_() for x in inputs]
        out = fn(*leaves)
        g = None if cotangent is None else cotangent.to(device=out.device, dtype=out.dtype)
        return torch.autograd.grad(out, leaves, g, allow_unused=True)


def sweep(blocks: Blocks, sups: list, tape: Tape, lam: torch.Tensor, n: int, interval: int,
          train: set) -> dict:
    """The backward sweep; returns ``{op: [environments]}`` of the trainable operations."""
    plan_ = blocks.plan
    first = next((k for k, h in enumerate(blocks.trainable) if h), None)
    ms: dict = {}
    if first is None:
        return ms
    kept = _kept(blocks, interval)
    nu = [k for k, u in enumerate(blocks.unitary) if not u]
    segment: dict = {}
    rho = tape.rho
    for k in range(len(sups) - 1, first - 1, -1):
        blk = plan_[k][0]
        if blocks.unitary[k]:
            rho = _apply_block(rho, blk, sups[k], n, dagger=True)
        elif k in tape.stored:
            rho = tape.stored[k]
            segment.pop(k, None)
        else:
            if k not in segment:  # recompute the segment from its checkpoint
                segment.clear()
                j = nu.index(k)
                c = kept[j // interval]
                keep = set(nu[nu.index(c) + 1:j])
                part = forward(blocks, sups, tape.stored[c], n, interval, c, k, keep=keep)
                segment.update(part.stored)
                segment[k] = part.rho
                del part
            rho = segment.pop(k)
        if blocks.trainable[k]:
            ms[k] = overlap_on(lam, rho, blk.wires + tuple(n + w for w in blk.wires), 2 * n)
        if k > first:
            lam = _apply_block(lam, blk, sups[k], n, dagger=True)
    del lam, rho, segment
    return block_envs(blocks, ms, train)


def initial_vectors(n, batch, cdtype, device, initial_state=None) -> torch.Tensor:
    if initial_state is None:
        return zero_density(n, batch, cdtype, device).reshape(batch, 4 ** n)
    psi = initial_state.to(device=device, dtype=cdtype)
    rho = psi.unsqueeze(-1) * psi.conj().unsqueeze(-2)
    return rho.expand(batch, 2 ** n, 2 ** n).reshape(batch, 4 ** n)


def chunk_rows(batch: int, chunk: int) -> list:
    return [(s, min(batch, s + chunk)) for s in range(0, batch, chunk)]
