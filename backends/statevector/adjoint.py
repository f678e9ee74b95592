"""The adjoint method: a vector-Jacobian product by one reverse sweep of uncomputation.

Given the final states ``psi = U_N ... U_1 |0>`` ``(B, 2**n)`` and the effective observable
``A_b`` folded from the cotangent (``lam = A_b psi``), the sweep walks the gates backwards:

    psi <- U_i^dag psi                       (uncompute: psi is now psi_{i-1})
    grad_ij = 2 Re <lam| dU_i/dphi_j |psi>   (one gate-sized application per trainable angle)
    lam <- U_i^dag lam

Memory: three states (psi, lam and one scratch) whatever the depth; the sweep restores the
input state, which the tests check.
"""
from __future__ import annotations

import torch

from qdiff.backends.statevector import kernels, measure, native, zwords
from qdiff.backends.statevector.gate_data import (GateData, apply_data, circuit_angles, circuit_data,
                                      derivative_data)
from qdiff.backends.statevector.apply import real_dtype_of
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.operation import ParamRef, is_concrete


def effective_state(state, circuit, cotangent, n):
    """``lam_b = sum_k g[b, k] O_k psi_b`` for the flattened outputs of ``circuit``."""
    lam, done = zwords.lam_from_z_words(state, circuit, cotangent, n)
    if lam is None:
        lam = torch.zeros_like(state)
    col = 0
    for i, m in enumerate(circuit.measurements):
        if i in done:
            col += 1
        elif m.kind == "expval":
            g = cotangent[:, col].to(state.dtype)
            lam = lam + g[:, None] * measure.apply_observable(state, m.obs, n)
            col += 1
        elif m.kind == "var":
            g = cotangent[:, col].to(state.dtype)
            phi = measure.apply_observable(state, m.obs, n)
            mean = (state.conj() * phi).sum(-1).real.to(state.dtype)
            phi2 = measure.apply_observable(phi, m.obs, n)
            lam = lam + g[:, None] * (phi2 - 2 * mean[:, None] * phi)
            col += 1
        elif m.kind == "probs":
            wires = list(range(n)) if m.wires is None else list(m.wires)
            k = len(wires)
            g = cotangent[:, col:col + 2 ** k].to(state.dtype)
            # sum_x g_x P_x psi: the cotangent acts as a diagonal on the measured wires
            lam = lam + kernels.apply_diagonal(state, g, wires, n)
            col += 2 ** k
        else:
            raise QdiffError(f"{m.kind}() outputs are not differentiable with diff_method='adjoint'")
    return lam


def overlap_matrix(psi, lam, wires, n, diagonal: bool, controls=()):
    """``M[b, k, i] = sum_rest psi[b, .., k, ..] conj(lam[b, .., i, ..])`` over the gate wires,
    ``(B, d, d)`` (``(B, d)``, the diagonal only, when ``diagonal``); one pass over both states.
    With ``controls``, the sum runs over the slice where every control wire is 1 only."""
    b = psi.shape[0]
    if controls:
        ps, wmap = kernels.control_slice(psi, controls, n)
        ls, _ = kernels.control_slice(lam, controls, n)
        m = n - len(controls)
        return overlap_matrix(ps.reshape(b, 2 ** m), ls.reshape(b, 2 ** m),
                              [wmap[w] for w in wires], m, diagonal)
    k = len(wires)
    if psi.device.type != "cpu":
        return overlap_pairs(psi, lam, wires, n, diagonal)
    if k == 1 and not diagonal and wires[0] < n - 1:
        # one batched (2 x R) @ (R x 2) product per prefix: no permuted copies (measured faster
        # than einsum unless the wire is the last one)
        w = wires[0]
        pv = psi.view(b, 2 ** w, 2, -1)
        lv = lam.view(b, 2 ** w, 2, -1)
        return torch.matmul(pv, lv.conj().transpose(-1, -2)).sum(1)
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    src = list(letters[1:n + 1])
    lam_idx = list(src)
    new = letters[n + 1:n + 1 + k]
    for j, w in enumerate(wires):
        lam_idx[w] = new[j] if not diagonal else src[w]
    out = "a" + "".join(src[w] for w in wires) + ("" if diagonal else new)
    expr = f"a{''.join(src)},a{''.join(lam_idx)}->{out}"
    m = torch.einsum(expr, psi.view(b, *([2] * n)), lam.conj().view(b, *([2] * n)))
    d = 2 ** k
    return m.reshape(-1, d) if diagonal else m.reshape(-1, d, d)


def overlap_pairs(psi, lam, wires, n, diagonal: bool):
    """:func:`overlap_matrix` as one product and sum per entry over strided views of the two
    states. On a GPU a matrix product of two rows by 2**n columns (the form above) runs on a
    few thread blocks at a small fraction of the memory bandwidth; these reductions stream."""
    b = psi.shape[0]
    k = len(wires)
    d = 2 ** k
    pv = psi.view(b, *([2] * n))
    lv = lam.conj().view(b, *([2] * n))

    def part(v, index):
        sel = [slice(None)] * (n + 1)
        for j, w in enumerate(wires):
            sel[1 + w] = (index >> (k - 1 - j)) & 1
        return v[tuple(sel)]

    if diagonal:
        cols = [(part(pv, i) * part(lv, i)).reshape(b, -1).sum(-1) for i in range(d)]
        return torch.stack(cols, -1)
    rows = [torch.stack([(part(pv, r) * part(lv, c)).reshape(b, -1).sum(-1) for c in range(d)],
                        -1) for r in range(d)]
    return torch.stack(rows, -2)


def gradient_from_overlap(dd, m):
    """``2 Re <lam| dU |psi>`` per binding from the overlap matrix and dU's data (for a
    ``"dctrl"`` derivative, ``m`` is the overlap on the control slice, over the target wires)."""
    v = dd.value
    if dd.kind == "diag":
        mm = m if m.shape[-1] == v.shape[-1] else torch.diagonal(m, dim1=-2, dim2=-1)
        g = 2 * (v.reshape(-1, v.shape[-1]) * mm).sum(-1).real
    else:
        g = 2 * (v.reshape(-1, *v.shape[-2:]) * m.transpose(-1, -2)).sum((-1, -2)).real
    return g


def adjoint_vjp(circuit, theta, state, cotangent, trainable, return_state: bool = False,
                shared=None, trace=None, use_native: bool = None):
    """``d(sum_bk g[b,k] f_k(theta_b)) / d theta`` ``(B, P)`` by one reverse sweep.

    ``circuit`` must use each theta column once with scale 1 (see ``bridge.unshare``). Gate
    matrices and their exact derivatives are computed up front, grouped by gate type
    (:mod:`qdiff.backends.statevector.gate_data`). States are updated in place, except inside torch.func
    transforms. With ``return_state`` also returns the uncomputed (input) state. ``shared``
    (per column, optional) marks columns broadcast over the batch by construction: only the
    sum of their gradient over the rows is then meaningful (see ``native.plan_adjoint``).
    ``trace`` (:class:`~qdiff.backends.statevector.simulate.Trace`): the gate data and native
    program of the forward run that produced ``state``, reused instead of recomputed.
    ``use_native``: the engine's kernel choice for this job (``None``: decided from the state).
    """
    n = circuit.num_wires
    ops = circuit.operations
    rdtype = real_dtype_of(state.dtype)
    inplace = is_concrete(state) and is_concrete(cotangent)
    if use_native is None:
        use_native = native.runs(state.dtype, state.device, theta, False)
    use_native = use_native and inplace and native.usable(state)
    if use_native:
        plan = native.coded_plan(ops, n)
        if plan is not None:  # every parameterised gate has a native formula: one call
            if not return_state:
                diag, done = zwords.z_word_diagonal_parts(state, circuit, cotangent, n)
                if diag is not None and len(done) == len(circuit.measurements):
                    # lam = diag * psi is formed in cache by the kernels; psi is not copied
                    return native.plan_adjoint(plan, state, None, theta, trainable,
                                               shared=shared, lam_diagonal=diag)
            lam = effective_state(state, circuit, cotangent, n).contiguous()
            psi = state.clone()
            grad = native.plan_adjoint(plan, psi, lam, theta, trainable, restore=return_state,
                                       shared=shared)
            return (grad, psi) if return_state else grad
    angles = circuit_angles(ops, theta, rdtype)
    data = trace.data if trace is not None and trace.data is not None else \
        circuit_data(ops, angles, state.dtype)
    slots = [(i, s) for i, op in enumerate(ops) for s, p in enumerate(op.params)
             if isinstance(p, ParamRef) and trainable[p.index]]
    ddata = derivative_data(ops, angles, slots, state.dtype, data)
    b = state.shape[0]
    if use_native:
        try:
            return _native_vjp(ops, data, ddata, state, circuit, cotangent, theta, n,
                               return_state, None if trace is None else trace.program)
        except native.Unsupported:
            pass
    # psi and lam are uncomputed together as one (2B, N) batch: one kernel call per gate. The
    # gradient then needs <lam_i| dU |psi_{i-1}> = <lam_{i-1}| U^dag dU |psi_{i-1}>.
    both = torch.cat([state, effective_state(state, circuit, cotangent, n)])
    cols = [None] * theta.shape[1]
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        both = apply_data(both, op, _doubled(data[i], b), n, inplace, dagger=True)
        op_slots = [(s, p) for s, p in enumerate(op.params) if (i, s) in ddata]
        if op_slots:
            kinds = {ddata[(i, s)].kind for s, _ in op_slots}
            # a controlled gate's derivatives are all "dctrl": the overlap on its control slice
            k = op.gate.controls if kinds == {"dctrl"} else 0
            m = overlap_matrix(both[:b], both[b:], op.wires[k:], n, diagonal=kinds == {"diag"},
                               controls=op.wires[:k])
            for s, p in op_slots:
                cols[p.index] = gradient_from_overlap(_dagger_times(data[i], ddata[(i, s)]), m)
    psi = both[:b]
    zero = torch.zeros(b, dtype=rdtype, device=psi.device)
    grad = torch.stack([zero if c is None else c for c in cols], dim=-1) if cols else \
        torch.zeros(b, 0, dtype=rdtype, device=psi.device)
    return (grad, psi) if return_state else grad


def _native_vjp(ops, data, ddata, state, circuit, cotangent, theta, n, return_state, program):
    """The same sweep in one native call (:mod:`qdiff.backends.statevector.native`)."""
    keys = sorted(ddata)
    slot_data = [(i, ddata[(i, s)]) for i, s in keys]
    lam = effective_state(state, circuit, cotangent, n).contiguous()
    psi = state.clone()
    g = native.adjoint_sweep(ops, data, slot_data, psi, lam, n, program)
    grad = torch.zeros(state.shape[0], theta.shape[1], dtype=real_dtype_of(state.dtype))
    if keys:
        cols = torch.tensor([ops[i].params[s].index for i, s in keys])
        grad[:, cols] = g.to(grad.dtype)
    return (grad, psi) if return_state else grad


def _doubled(d: GateData, b: int) -> GateData:
    """Gate data for the stacked (psi, lam) batch of ``2b`` rows."""
    if d.value is None or d.value.shape[0] != b or b == 1:
        return d
    return GateData(d.kind, torch.cat([d.value, d.value]))


def _dagger_times(u: GateData, du: GateData) -> GateData:
    """``U^dag dU`` (same kind as ``du``)."""
    if du.kind == "diag":
        return GateData("diag", u.value.conj() * du.value)
    v = u.value
    if du.kind == "mat" and u.kind == "diag":  # an autodiff fallback for a diagonal gate
        v = torch.diag_embed(v)
    return GateData(du.kind, v.conj().transpose(-1, -2) @ du.value)
