"""Gate data for a whole circuit at once: matrices, diagonals and exact derivatives.

Evaluating a gate's matrix function costs tens of small torch ops whatever the batch size; a
circuit with 24 ``Rot`` gates pays that 24 times. :func:`circuit_data` groups the operations
by gate and evaluates each gate's function ONCE on all its angles ``(m, B)``.

Derivatives are exact and need no autograd: for ``U(phi) = A exp(-i phi G) B`` with distinct
eigenvalues ``lambda_k`` of ``G``, ``U(phi + s) = sum_k exp(-i s lambda_k) C_k``, so K evaluations
at shifts ``s_m`` give the ``C_k`` (a K x K Vandermonde solve, fixed per gate) and
``dU/dphi = sum_k (-i lambda_k) C_k = sum_m w_m U(phi + s_m)``.

Kinds of data: ``"const"`` (no parameters: the simulator's fast paths apply), ``"diag"``
(``(B', 2**k)``), ``"ctrl"`` (the target's matrix on the slice where all of the gate's
``gate.controls`` control wires are 1, identity elsewhere: any number of controls, no dense
matrix), ``"mat"`` (``(B', d, d)``); derivative data adds ``"dctrl"`` (the rest maps to zero).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from qdiff.circuits import caches, memory
from qdiff.backends.statevector import kernels
from qdiff.backends.statevector.apply import apply_gate
from qdiff.circuits.gates import generator_on_left
from qdiff.circuits.operation import ParamRef, is_concrete


@dataclass(frozen=True)
class GateData:
    kind: str
    value: Optional[torch.Tensor] = None


# ------------------------------------------------------------------------------------------
# angles


def circuit_angles(ops, theta: torch.Tensor, rdtype) -> list:
    """Per op, a list of ``(B,)`` angle tensors, one gather for all refs.

    Outside autograd, an angle that is the same for every binding (a weight shared by the
    batch, a constant) comes back as ``(1,)``: its gate matrix and derivatives are then computed
    once instead of B times, and the kernels broadcast it. (Under autograd every angle stays
    ``(B,)``: a column that only happens to be equal must still get its own gradient rows.)
    """
    b = theta.shape[0]
    share = b > 1 and is_concrete(theta) and not (torch.is_grad_enabled() and theta.requires_grad)
    refs = [p for op in ops for p in op.params if isinstance(p, ParamRef)]
    gathered = None
    if refs:
        idx = torch.tensor([p.index for p in refs], device=theta.device)
        gathered = theta.to(rdtype).index_select(1, idx)
        scale = [p.scale for p in refs]
        offset = [p.offset for p in refs]
        if any(s != 1.0 for s in scale) or any(o != 0.0 for o in offset):
            gathered = gathered * torch.tensor(scale, dtype=rdtype, device=theta.device) + \
                torch.tensor(offset, dtype=rdtype, device=theta.device)
        gathered = gathered.T
        same = (gathered == gathered[:, :1]).all(1).tolist() if share else None
    consts = [float(p) for op in ops for p in op.params
              if not isinstance(p, (ParamRef, torch.Tensor))]
    # plain-number angles: one tensor for all of them (a torch.full per angle costs more)
    cvals = torch.tensor(consts, dtype=rdtype, device=theta.device)[:, None].expand(
        -1, 1 if share else b) if consts else None
    out, r, c = [], 0, 0
    for op in ops:
        angles = []
        for p in op.params:
            if isinstance(p, ParamRef):
                angles.append(gathered[r, :1] if share and same[r] else gathered[r])
                r += 1
            elif isinstance(p, torch.Tensor):
                angles.append(p.to(device=theta.device, dtype=rdtype).reshape(-1).expand(b))
            else:
                angles.append(cvals[c])
                c += 1
        out.append(angles)
    return out


# ------------------------------------------------------------------------------------------
# evaluation of the gate functions, grouped


def _kind(gate) -> str:
    if gate.num_params == 0:
        return "const"
    if gate.diag_fn is not None:
        return "diag"
    if gate.controls >= 1 and gate.target is not None and gate.target.num_params == gate.num_params:
        return "ctrl"
    return "mat"


def _fn(gate, kind):
    if kind == "diag":
        return gate.diag_fn
    if kind == "ctrl":
        return gate.target.matrix_fn
    return gate.matrix_fn


def _grouped(ops, angles):
    groups: dict = {}
    for i, op in enumerate(ops):
        if op.gate.num_params:
            groups.setdefault(op.gate, []).append(i)
    return groups


def circuit_data(ops, angles, cdtype) -> list:
    """GateData per op, each parameterised gate's function evaluated once per gate type."""
    out = [GateData("const")] * len(ops)
    for gate, idx in _grouped(ops, angles).items():
        kind = _kind(gate)
        stacked = _stacked_angles(angles, idx, gate.num_params)
        if kind == "mat":  # dense (m, B', 2**w, 2**w)
            memory.require(2.0 * stacked[0].numel() * 4.0 ** gate.num_wires * cdtype.itemsize,
                           f"the matrices of {len(idx)} {gate.pl_name or gate.name} gate(s) "
                           f"on {gate.num_wires} wires")
        vals = _fn(gate, kind)(*stacked).to(cdtype)
        for j, i in enumerate(idx):
            out[i] = GateData(kind, vals[j])
    return out


def _stacked_angles(angles, idx, num_params) -> list:
    """Per parameter, the ``(m, B')`` angles of ops ``idx``; shared ``(1,)`` and per-binding
    ``(B,)`` angles in one group are broadcast to ``(B,)``."""
    cols = [[angles[i][s] for i in idx] for s in range(num_params)]
    width = max(a.shape[0] for col in cols for a in col)
    return [torch.stack([a if a.shape[0] == width else a.expand(width) for a in col])
            for col in cols]


@caches.cached(maxsize=None)
def derivative_weights(gate, slot: int, kind: str):
    """``(shifts, complex weights)`` with ``dU/dphi = sum_m w_m U(phi + s_m)`` (exact)."""
    lam = (gate.target if kind == "ctrl" else gate).spectrum(slot)
    k = len(lam)
    spacing = np.min(np.diff(lam)) if k > 1 else 1.0
    shifts = 2 * np.pi * np.arange(k) / (k * spacing)
    vander = np.exp(-1j * np.outer(shifts, lam))
    if np.linalg.cond(vander) > 1e8:  # non-equidistant spectrum: spread the shifts
        shifts = np.linspace(0.0, 2 * np.pi / spacing, k, endpoint=False) * 0.61803398875
        vander = np.exp(-1j * np.outer(shifts, lam))
    weights = (-1j * lam) @ np.linalg.inv(vander)
    return tuple(float(s) for s in shifts), tuple(complex(w) for w in weights)


def _generator_tensor(gate, kind, like):
    g = gate.target.generators[0] if kind == "ctrl" else gate.generators[0]
    g = np.array(g.diagonal()) if kind == "diag" else np.asarray(g)  # a Pauli word: no dense
    return torch.as_tensor(g, dtype=like.dtype, device=like.device)


def derivative_data(ops, angles, slots, cdtype, data=None) -> dict:
    """``{(op index, slot): GateData}`` of ``dU/dphi_slot`` for the requested ``slots``.

    One-parameter gates use ``dU = -i G U`` on the forward ``data`` (exact zeros stay zeros);
    multi-parameter gates use the spectral-shift formula of :func:`derivative_weights`.
    """
    by_key: dict = {}
    for i, s in slots:
        by_key.setdefault((ops[i].gate, s), []).append(i)
    out = {}
    spectral: dict = {}  # (gate, op indices) -> slots, evaluated together below
    for (gate, s), idx in by_key.items():
        kind = _kind(gate)
        dkind = "dctrl" if kind == "ctrl" else kind
        gens = gate.target.generators if kind == "ctrl" else gate.generators
        if data is not None and gate.num_params == 1 and gens is not None and \
                generator_on_left(gate.target if kind == "ctrl" else gate):
            g = _generator_tensor(gate, kind, data[idx[0]].value)
            for i in idx:
                u = data[i].value
                out[(i, s)] = GateData(dkind, -1j * (g * u if kind == "diag" else g @ u))
            continue
        if gens is None:  # (of a controlled gate: its target's matrix on the slice)
            src = gate.target if kind == "ctrl" else gate
            for i in idx:
                out[(i, s)] = GateData("dctrl" if kind == "ctrl" else "mat",
                                       _autodiff_matrix(src, angles[i], s, cdtype))
            continue
        spectral.setdefault((gate, tuple(idx)), []).append(s)
    for (gate, idx), gslots in spectral.items():
        _spectral_derivatives(gate, list(idx), gslots, angles, cdtype, out)
    return out


def _spectral_derivatives(gate, idx, gslots, angles, cdtype, out) -> None:
    """dU/dphi_s for the ``gslots`` of ``gate`` on ops ``idx`` by the spectral-shift formula,
    all slots in ONE evaluation of the gate function (a Rot's three slots: 6 shifted copies)."""
    kind = _kind(gate)
    dkind = "dctrl" if kind == "ctrl" else kind
    plans = [derivative_weights(gate, s, kind) for s in gslots]
    base = _stacked_angles(angles, idx, gate.num_params)
    args = [torch.cat([a + sh if p == s else a for s, (shifts, _) in zip(gslots, plans)
                       for sh in shifts]) for p, a in enumerate(base)]
    vals = _fn(gate, kind)(*args).to(cdtype)
    vals = vals.reshape(-1, len(idx), *vals.shape[1:])
    r = 0
    for s, (shifts, weights) in zip(gslots, plans):
        w = _weight_tensor(weights, cdtype, vals.device)
        du = torch.tensordot(w, vals[r:r + len(shifts)], dims=1)
        r += len(shifts)
        for j, i in enumerate(idx):
            out[(i, s)] = GateData(dkind, du[j])


@caches.cached(maxsize=None)
def _weight_tensor(weights: tuple, cdtype, device) -> torch.Tensor:
    return torch.tensor(weights, dtype=cdtype, device=device)


def _autodiff_matrix(gate, angles, slot, cdtype):
    """Fallback for gates with no generator: forward-mode AD of the matrix function (reverse
    mode, one pullback per real matrix entry, inside a caller's forward-mode level, which
    torch does not nest; by ``torch.func.vjp``, which also runs inside torch.func transforms,
    where ``requires_grad_`` is refused)."""
    import torch.autograd.forward_ad as fwAD
    width = max(a.shape[0] for a in angles)
    if fwAD._current_level >= 0:
        args = [a.detach().expand(width) for a in angles]
        u = gate.matrix_fn(*args)

        def entries(x):
            m = gate.matrix_fn(*args[:slot], x, *args[slot + 1:])
            return torch.view_as_real(m.to(torch.complex128)) if m.is_complex() else m

        with torch.enable_grad():
            parts, pull = torch.func.vjp(entries, args[slot])
        flat = parts.reshape(width, -1)
        cols = []
        for j in range(flat.shape[1]):  # matrix row b depends on angle b only
            unit = torch.zeros_like(flat)
            unit[:, j] = 1
            cols.append(pull(unit.reshape(parts.shape))[0])
        du = torch.stack(cols, 1).reshape(parts.shape)
        return (torch.view_as_complex(du.contiguous()) if u.is_complex() else du).to(cdtype)
    with fwAD.dual_level():
        args = [a.expand(width) for a in angles]
        args[slot] = fwAD.make_dual(args[slot], torch.ones_like(args[slot]))
        du = fwAD.unpack_dual(gate.matrix_fn(*args)).tangent
    return du.to(cdtype)


# ------------------------------------------------------------------------------------------
# application


def one_qubit_matrix(op, data: GateData, state) -> torch.Tensor:
    """``(B', 2, 2)`` matrix of a one-qubit op (for fusing runs of one-qubit gates)."""
    if data.kind == "const":
        u = op.gate.matrix_fn()
    elif data.kind == "diag":
        u = torch.diag_embed(data.value)
    else:
        u = data.value
    return kernels.as_batch_matrix(u.to(state.device), state.dtype)


def fused_schedule(operations, data, state, fuse: bool, fuse_flips: bool = True):
    """Yield ``("1q", wire, u)`` for fused runs of one-qubit gates (``u`` their ``(B', 2, 2)``
    product) and ``("op", op, data)`` for everything else, in an order equivalent to
    ``operations``. A run starts at a general or constant non-diagonal one-qubit gate (not at an
    X when ``fuse_flips`` is false: the native kernels flip without arithmetic) and absorbs
    every later one-qubit gate on its wire until another gate touches the wire."""
    pending: dict = {}

    def flush(wires):
        for w in wires:
            u = pending.pop(w, None)
            if u is not None:
                yield "1q", w, u

    for op, d in zip(operations, data):
        w = op.wires
        if fuse and len(w) == 1 and (w[0] in pending or d.kind == "mat" or (
                d.kind == "const" and op.gate.diag_fn is None
                and (fuse_flips or op.gate.name != "x"))):
            u = one_qubit_matrix(op, d, state)
            prev = pending.get(w[0])
            pending[w[0]] = u if prev is None else u @ prev
            continue
        yield from flush(w)
        yield "op", op, d
    yield from flush(list(pending))


def _dagger(kind: str, v: torch.Tensor) -> torch.Tensor:
    return v.conj() if kind == "diag" else v.conj().transpose(-1, -2)


SMALL = 1 << 15  # amplitudes (B * 2**n) below which one fused torch op beats the slice kernels


@caches.cached(maxsize=4096)
def _perm_index(gate, wires: tuple, n: int, dagger: bool, device: str):
    """Gather index of a permutation gate on ``wires``: ``out[:, i] = in[:, idx[i]]``."""
    idx = torch.arange(2 ** n).reshape([2] * n)
    k = len(wires)
    perm = torch.tensor(gate.perm)
    if dagger:
        perm = torch.argsort(perm)
    t = idx.permute(*wires, *[w for w in range(n) if w not in wires]).reshape(2 ** k, -1)
    t = t[perm]
    rest = [w for w in range(n) if w not in wires]
    order = list(wires) + rest
    back = [order.index(w) for w in range(n)]
    return t.reshape([2] * n).permute(*back).reshape(-1).to(device)


DENSE_SIDE = 8  # a controlled gate's matrix side up to which tiny states apply it densely


def full_matrix(kind: str, v: torch.Tensor, controls: int) -> torch.Tensor:
    """The whole matrix ``(..., 2**controls * d, 2**controls * d)`` of a gate with
    ``controls`` control wires from its target block ``v`` (identity or, for a derivative,
    zero on the other blocks), checked against memory first; other kinds unchanged.
    Functional (vmap-safe)."""
    if kind not in ("ctrl", "dctrl"):
        return v
    d = v.shape[-1]
    side = d << controls
    if side > DENSE_SIDE:
        batch = int(np.prod(v.shape[:-2], dtype=np.int64))
        memory.require(float(batch) * side * side * v.element_size(),
                       f"the dense {side}x{side} matrix of a gate with {controls} controls",
                       v.device)
    rest = side - d
    top = torch.eye(side, dtype=v.dtype, device=v.device)[:rest].expand(*v.shape[:-2], -1, -1)
    if kind == "dctrl":
        top = torch.zeros_like(top)
    left = torch.zeros(*v.shape[:-2], d, rest, dtype=v.dtype, device=v.device)
    return torch.cat([top, torch.cat([left, v], -1)], -2)


def _tiny_path(op, data: GateData) -> bool:
    """Whether tiny states take ``op`` in one torch op: not a controlled gate on more than 3
    wires that would need its dense matrix there (it goes through its control slice)."""
    g = op.gate
    return not g.controls or 2 ** len(op.wires) <= DENSE_SIDE or data.kind == "diag" or (
        data.kind == "const" and (g.perm is not None or g.diag_fn is not None))


def _apply_small(state, op, data, n, dagger):
    """Tiny states: one torch op per gate (Python overhead dominates the arithmetic there)."""
    if data.kind == "const":
        gate = op.gate
        if gate.perm is not None:
            return state.index_select(1, _perm_index(gate, op.wires, n, dagger, str(state.device)))
        if gate.diag_fn is not None:
            d = gate.diag_fn().to(device=state.device, dtype=state.dtype)
            return kernels.apply_diagonal(state, (d.conj() if dagger else d)[None], op.wires, n)
        u = gate.matrix_fn().to(device=state.device, dtype=state.dtype)
        v, kind = (u.conj().T if dagger else u)[None], "mat"
    else:
        v = _dagger(data.kind, data.value) if dagger else data.value
        kind = data.kind
    if kind == "diag":
        return kernels.apply_diagonal(state, v.reshape(-1, v.shape[-1]), op.wires, n)
    u = kernels.as_batch_matrix(full_matrix(kind, v, op.gate.controls), state.dtype)
    if len(op.wires) == 1:
        w = op.wires[0]
        b = state.shape[0]
        return torch.matmul(u.unsqueeze(1), state.view(b, 2 ** w, 2, -1)).reshape(state.shape)
    return kernels.apply_matrix(state, u, op.wires, n)


def apply_data(state, op, data: GateData, n: int, inplace: bool, dagger: bool = False):
    """Apply ``op`` (or its adjoint) with precomputed ``data``; returns the new state (which
    may be a new tensor even when ``inplace``: callers use the return value)."""
    if state.numel() <= SMALL and _tiny_path(op, data):
        return _apply_small(state, op, data, n, dagger)
    if data.kind == "const":
        if dagger:  # (a constant gate's inverse may be a gate at constant angles: SISWAP's)
            gate, angles = op.gate.inverse(())
            rdtype = state.real.dtype if state.is_complex() else state.dtype
            angles = [torch.tensor([float(a)], dtype=rdtype, device=state.device) for a in angles]
            return apply_gate(state, gate, op.wires, angles, n, inplace)
        return apply_gate(state, op.gate, op.wires, [], n, inplace)
    v = _dagger(data.kind, data.value) if dagger else data.value
    if data.kind == "diag":
        return kernels.apply_diagonal(state, v.reshape(-1, v.shape[-1]), op.wires, n, inplace)
    if data.kind in ("ctrl", "dctrl"):
        u = kernels.as_batch_matrix(v, state.dtype)
        k = op.gate.controls
        controls, targets = op.wires[:k], op.wires[k:]

        def target_apply(sub, m, wmap, ip):
            tw = tuple(wmap[w] for w in targets)
            return kernels.apply_one_qubit(sub, u, tw[0], m, ip) if len(tw) == 1 else \
                kernels.apply_matrix(sub, u, tw, m)
        if data.kind == "ctrl" and k == 1 and len(targets) == 1:
            return kernels.apply_controlled_one_qubit(state, controls[0], targets[0], u, n,
                                                      inplace)
        return kernels.apply_controlled(state, controls, target_apply, n, inplace,
                                        zero_rest=data.kind == "dctrl")
    u = kernels.as_batch_matrix(v, state.dtype)
    if len(op.wires) == 1:
        return kernels.apply_one_qubit(state, u, op.wires[0], n, inplace)
    out = kernels.apply_matrix(state, u, op.wires, n)
    return state.copy_(out) if inplace else out

