"""Noisy circuits on state vectors by quantum trajectories (Monte-Carlo wave functions).

Each binding runs as ``K`` trajectories in ONE batched simulation (``B*K`` state vectors).
At a channel with Kraus operators ``K_k = sqrt(w_k) M_k`` (:meth:`Channel.branches`), every
trajectory draws ``k`` with a probability ``q_k`` that does not depend on its state (``q_k ~
Tr(K_k^+ K_k)``; where a branch has zero weight, mixed with 5% of the uniform choice so that it
stays reachable: its derivative may not vanish), continues with ``M_k psi`` and multiplies its
weight by ``w_k / q_k`` (linear in ``w_k``: no square root to differentiate at p = 0). Then
``E[weight psi psi^+] = sum_k K_k rho K_k^+`` exactly: every average over trajectories
(expval, probs, density matrices) is an unbiased estimate of the mixed-state value, and since
the states are linear in each operator and the weights in each ``w_k`` at fixed draws,
autograd through the simulation gives unbiased gradients of gate angles and channel
parameters alike. The draws come from the device's seeded generator.
"""
from __future__ import annotations

import torch

from qdiff.backends.statevector import kernels
from qdiff.backends.statevector.apply import real_dtype_of
from qdiff.backends.statevector.gate_data import circuit_angles
from qdiff.backends.statevector.simulate import check_memory, evolve, zero_state
from qdiff.circuits import caches, memory
from qdiff.circuits.channels import is_channel

UNIFORM_SHARE = 0.05


def _segments(ops) -> list:
    """``[("gates", [ops]) | ("channel", index)]`` in circuit order."""
    out, run = [], []
    for i, op in enumerate(ops):
        if is_channel(op.gate):
            if run:
                out.append(("gates", run))
                run = []
            out.append(("channel", i))
        else:
            run.append(op)
    if run:
        out.append(("gates", run))
    return out


def apply_channel(state, weights, ops, wires, n, generator) -> tuple:
    """One draw per trajectory: ``state`` ``(R, 2**n)``; the channel's Kraus operators
    ``K_k = sqrt(w_k) M_k`` as ``weights`` ``(R or 1, m)`` and ``ops`` ``(R or 1, m, d, d)``.
    Returns ``(M_k psi, w_k / q_k)``: the drawn operator's state and the trajectory's weight
    factor (linear in ``w_k``, so its derivative exists where ``w_k = 0``)."""
    r = state.shape[0]
    d = ops.shape[-1]
    memory.require(2.0 * r * d * d * state.element_size(), f"the drawn Kraus operators of "
                   f"{r} trajectories on {len(wires)} wires (a {d}x{d} matrix per trajectory)",
                   state.device, hint="fewer trajectories or a channel on fewer wires")
    with torch.no_grad():
        norms = (ops.abs() ** 2).sum((-2, -1)).real.to(torch.float64)
        weight = weights.detach().to(torch.float64) * norms                   # (R', m)
        weight = weight / weight.sum(-1, keepdim=True)
        m = weight.shape[-1]
        # rows where a branch has zero weight (p = 0) keep it reachable: its derivative counts
        mixed = (1 - UNIFORM_SHARE) * weight + UNIFORM_SHARE / m
        q = torch.where((weight == 0).any(-1, keepdim=True), mixed, weight)
        q = q.expand(r, m).to(state.device)
        with caches.outside_legacy_vmap():
            idx = torch.multinomial(q.cpu() if generator.device.type == "cpu" else q, 1,
                                    generator=generator).to(state.device)[:, 0]
        q_drawn = q.gather(1, idx[:, None])[:, 0]
    rows = torch.arange(r, device=state.device)
    w = weights.to(state.device).expand(r, m)[rows, idx]
    factor = w.to(state.real.dtype) / q_drawn.to(state.real.dtype)
    chosen = ops.to(state.device).expand(r, *ops.shape[1:])[rows, idx].to(state.dtype)
    if len(wires) == 1:
        return kernels.apply_one_qubit(state, chosen, wires[0], n, False), factor
    return kernels.apply_matrix(state, chosen, tuple(wires), n), factor


def simulate_trajectories(circuit, theta, trajectories: int, cdtype, device, generator,
                          initial_state=None) -> torch.Tensor:
    """Final (unnormalised) trajectory states ``(B*K, 2**n)`` and their weights ``(B*K,)``
    (every average is ``mean(weight * quadratic form of the state)``): rows
    ``b*K .. b*K+K-1`` belong to binding ``b``."""
    n = circuit.num_wires
    b = theta.shape[0]
    rows = b * trajectories
    rdtype = real_dtype_of(cdtype)
    grad = torch.is_grad_enabled() and theta.requires_grad
    check_memory(n, rows, cdtype, device, copies=4.0 + (len(circuit.operations) if grad else 0))
    th = theta.to(device).repeat_interleave(trajectories, 0)
    if initial_state is None:
        state = zero_state(n, rows, cdtype, device)
    else:
        state = initial_state.to(device=device, dtype=cdtype).expand(b, 2 ** n)
        state = state.repeat_interleave(trajectories, 0)
    ops = circuit.operations
    angles = None
    weight = torch.ones(rows, dtype=rdtype, device=device)
    for kind, part in _segments(ops):
        if kind == "gates":
            state = evolve(state, part, th, n, rdtype, inplace=False, fuse=True,
                           use_native=False)
            continue
        op = ops[part]
        if angles is None:
            angles = circuit_angles(ops, th, rdtype)
        ps = angles[part]  # one value for all rows stays one: its operators are made once
        w, mats = op.gate.branches(*ps)
        if not ps:
            w, mats = w.unsqueeze(0), mats.unsqueeze(0)
        state, factor = apply_channel(state, w, mats, op.wires, n, generator)
        weight = weight * factor
    return state, weight
