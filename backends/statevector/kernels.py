"""Statevector kernels: apply a gate to a batch of states, in torch, on any device.

A state batch is a ``(B, 2**n)`` complex tensor, wire 0 the most significant bit. Every kernel
has two modes: ``inplace=False`` builds a new tensor (autograd records it: backprop), and
``inplace=True`` overwrites the input (no autograd: adjoint, parameter-shift, inference), which
avoids a fresh 2**n allocation per gate.

Fast paths: diagonal gates multiply by phases, controlled gates act on the control-1 slice
only, X/SWAP-like permutations move data without arithmetic, one-qubit gates use an elementwise
2x2 update; other gates use one einsum over the gate's axes.
"""
from __future__ import annotations

import string

import torch

_LETTERS = string.ascii_letters


def as_batch_matrix(u: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``(d, d)`` or ``(B', d, d)`` -> ``(B', d, d)`` of ``dtype``."""
    u = u.to(dtype)
    return u.unsqueeze(0) if u.ndim == 2 else u.reshape(-1, u.shape[-2], u.shape[-1])


def _axes_view(state: torch.Tensor, n: int) -> torch.Tensor:
    return state.view(state.shape[0], *([2] * n))


def _merged_shape(wires, n: int) -> list:
    """Sizes of the state's axes with each run of non-gate wires merged into one axis
    (gate wires keep their own axis of 2): few dims make broadcasting kernels fast."""
    shape, run = [], 1
    for w in range(n):
        if w in wires:
            if run > 1:
                shape.append(run)
                run = 1
            shape.append(2)
        else:
            run *= 2
    if run > 1:
        shape.append(run)
    return shape


def apply_diagonal(state: torch.Tensor, diag: torch.Tensor, wires, n: int, inplace=False):
    """Multiply by a diagonal ``diag`` of shape ``(B', 2**k)`` on ``wires``."""
    k = len(wires)
    bp = diag.shape[0]
    d = diag.reshape(bp, *([2] * k))
    # move the gate axes of d into wire order; singleton axes for the merged runs in between
    order = sorted(range(k), key=lambda i: wires[i])
    d = d.permute(0, *[1 + i for i in order])
    sshape = _merged_shape(set(wires), n)
    dshape = [bp] + [2 if size == 2 and _is_gate_axis(sshape, j, wires, n) else 1
                     for j, size in enumerate(sshape)]
    d = d.reshape(dshape)
    s = state.view(state.shape[0], *sshape)
    if inplace:
        return s.mul_(d).view(state.shape)
    return (s * d).reshape(state.shape)


def _is_gate_axis(sshape, j, wires, n) -> bool:
    """Whether merged axis ``j`` is a gate wire (a run of non-gate wires may also have size 2)."""
    w = 0
    for i, size in enumerate(sshape):
        if i == j:
            return size == 2 and w in wires
        w += size.bit_length() - 1
    return False


def apply_one_qubit(state: torch.Tensor, u: torch.Tensor, wire: int, n: int, inplace=False):
    """2x2 ``u`` ``(B', 2, 2)`` on one wire."""
    b, bp = state.shape[0], u.shape[0]
    s = state.view(b, 2 ** wire, 2, 2 ** (n - wire - 1))
    s0, s1 = s[:, :, 0], s[:, :, 1]
    u00, u01, u10, u11 = (u[:, i, j].view(bp, 1, 1) for i in (0, 1) for j in (0, 1))
    if not inplace:
        return torch.stack([u00 * s0 + u01 * s1, u10 * s0 + u11 * s1], dim=2).reshape(state.shape)
    tmp = s0.clone()
    s0.mul_(u00).addcmul_(s1, u01)
    s1.mul_(u11).addcmul_(tmp, u10)
    return state


def apply_matrix(state: torch.Tensor, u: torch.Tensor, wires, n: int):
    """General ``(B', 2**k, 2**k)`` matrix on ``wires`` by one einsum (new tensor)."""
    k = len(wires)
    b, bp = state.shape[0], u.shape[0]
    s = _axes_view(state, n)
    src = list(_LETTERS[1:n + 1])
    out = list(src)
    new = list(_LETTERS[n + 1:n + 1 + k])
    for i, w in enumerate(wires):
        out[w] = new[i]
    um = u.reshape(bp, *([2] * (2 * k)))
    upre = "a" if bp == b and b > 1 else ""
    if not upre:
        um = um.reshape(*([2] * (2 * k)))
    expr = f"{upre}{''.join(new)}{''.join(src[w] for w in wires)},a{''.join(src)}->a{''.join(out)}"
    return torch.einsum(expr, um, s).reshape(state.shape)


def apply_permutation_swap(state: torch.Tensor, w0: int, w1: int, n: int, inplace=False):
    s = _axes_view(state, n)
    t = s.transpose(1 + w0, 1 + w1)
    if inplace:
        return state.copy_(t.reshape(state.shape))
    return t.reshape(state.shape)


def apply_x(state: torch.Tensor, wire: int, n: int, inplace=False):
    s = state.view(state.shape[0], 2 ** wire, 2, 2 ** (n - wire - 1))
    if not inplace:
        return s.flip(2).reshape(state.shape)
    tmp = s[:, :, 0].clone()
    s[:, :, 0].copy_(s[:, :, 1])
    s[:, :, 1].copy_(tmp)
    return state


def _control_target_halves(state, c: int, t: int, n: int):
    """``(v, ca, s1, tt)``: a 6-axis view (runs of other wires merged), the control axis, the
    control-1 block and its target axis."""
    b = state.shape[0]
    lo, hi = min(c, t), max(c, t)
    v = state.view(b, 2 ** lo, 2, 2 ** (hi - lo - 1), 2, 2 ** (n - hi - 1))
    ca, ta = (2, 4) if c < t else (4, 2)
    return v, ca, v.select(ca, 1), (ta - 1 if ta > ca else ta)


def apply_cnot(state: torch.Tensor, c: int, t: int, n: int, inplace=False):
    """CNOT: swap the target halves of the control-1 block (no reshaped copy of the slice)."""
    v, ca, s1, tt = _control_target_halves(state, c, t, n)
    if not inplace:
        return torch.stack([v.select(ca, 0), s1.flip(tt)], dim=ca).reshape(state.shape)
    x0, x1 = s1.select(tt, 0), s1.select(tt, 1)
    tmp = x0.clone()
    x0.copy_(x1)
    x1.copy_(tmp)
    return state


def apply_controlled_one_qubit(state, c: int, t: int, u: torch.Tensor, n: int, inplace=False):
    """A controlled 2x2 ``u`` ``(B', 2, 2)``: the elementwise update on the control-1 block."""
    v, ca, s1, tt = _control_target_halves(state, c, t, n)
    bp = u.shape[0]
    x0, x1 = s1.select(tt, 0), s1.select(tt, 1)
    u00, u01, u10, u11 = (u[:, i, j].view(bp, 1, 1, 1) for i in (0, 1) for j in (0, 1))
    if not inplace:
        new1 = torch.stack([u00 * x0 + u01 * x1, u10 * x0 + u11 * x1], dim=tt)
        return torch.stack([v.select(ca, 0), new1], dim=ca).reshape(state.shape)
    tmp = x0.clone()
    x0.mul_(u00).addcmul_(x1, u01)
    x1.mul_(u11).addcmul_(tmp, u10)
    return state


def control_slice(state: torch.Tensor, controls, n: int):
    """View of the amplitudes with every control wire = 1, and the wire map of what is left."""
    s = _axes_view(state, n)
    idx = [slice(None)] * (n + 1)
    for c in controls:
        idx[1 + c] = 1
    sub = s[tuple(idx)]
    rest = [w for w in range(n) if w not in controls]
    return sub, {w: i for i, w in enumerate(rest)}


def apply_controlled(state, controls, target_apply, n: int, inplace=False, zero_rest=False):
    """Apply ``target_apply(sub (B, 2**m), m, wire_map, inplace)`` to the slice where every
    control wire is 1 (any number of controls); the rest is kept, or made zero with
    ``zero_rest`` (a derivative ``|1..1><1..1| (x) dV``).

    ``wire_map`` maps an original wire to its index in the slice. The functional mode stacks
    the kept (or zero) half back at each control axis: no dense matrix, autograd and vmap safe.
    """
    b = state.shape[0]
    m = n - len(controls)
    if inplace and not zero_rest:
        sub, wmap = control_slice(state, controls, n)
        flat = sub.reshape(b, 2 ** m)
        res = target_apply(flat, m, wmap, True)
        if res.data_ptr() != sub.data_ptr():
            sub.copy_(res.view(sub.shape))
        return state
    rest = [w for w in range(n) if w not in controls]
    wmap = {w: i for i, w in enumerate(rest)}

    def on_slice(v, axes):  # axes: the control axes of v, highest first (selects keep the rest)
        if not axes:
            return target_apply(v.reshape(b, 2 ** m), m, wmap, False).view(v.shape)
        a = axes[0]
        other = v.select(a, 0)
        return torch.stack([torch.zeros_like(other) if zero_rest else other,
                            on_slice(v.select(a, 1), axes[1:])], dim=a)
    out = on_slice(_axes_view(state, n), sorted((1 + c for c in controls), reverse=True))
    return out.reshape(state.shape)
