"""Run a :class:`~qdiff.circuits.Circuit` on a batch of states.

``simulate(circuit, theta)`` evolves ``B`` bindings at once; the Python loop is over gates, never
over the batch. Runs of one-qubit gates on a wire are fused into one 2x2 before they are applied.

>>> import torch, qdiff as qd
>>> from qdiff.circuits import Circuit, Operation, ParamRef, get_gate
>>> c = Circuit(1, (Operation(get_gate("rx"), (0,), (ParamRef(0),)),), num_params=1)
>>> simulate(c, torch.tensor([[0.0], [3.14159265]])).abs().round()
tensor([[1., 0.],
        [0., 1.]], dtype=torch.float64)
"""
from __future__ import annotations

import torch

from qdiff.backends.statevector import kernels, native
from qdiff.backends.statevector.fusion import evolve_fused
from qdiff.backends.statevector.gate_data import (SMALL, apply_data, circuit_angles, circuit_data,
                                                  fused_schedule)
from qdiff.backends.statevector.apply import real_dtype_of
from qdiff.circuits import memory
from qdiff.circuits.circuit import trainable_matrix_op, unitary_ops
from qdiff.circuits.operation import is_concrete


def zero_state(n: int, batch: int, cdtype, device) -> torch.Tensor:
    s = torch.zeros(batch, 2 ** n, dtype=cdtype, device=device)
    s[:, 0] = 1
    return s


def _set_zero(state: torch.Tensor) -> None:
    """|0...0> written over ``state`` ``(B, 2**n)`` in place."""
    state.zero_()
    state[:, 0] = 1


def available_memory(device: torch.device) -> int:
    """Bytes free for a new allocation on ``device`` (:func:`qdiff.circuits.memory.available`)."""
    return memory.available(device)


def check_memory(n: int, batch: int, cdtype, device, copies: float = 4.0) -> None:
    """Refuse (before allocating) a simulation whose ``copies`` states would not fit the
    memory budget (:func:`qdiff.circuits.memory.require`)."""
    item = cdtype.itemsize
    need = float(batch) * (2.0 ** n) * item * copies
    memory.require(need, f"simulating {n} qubits with batch {batch} ({copies:g} state(s) of "
                         f"{memory.gib(2.0 ** n * item * batch)})", device)


def _tensor_params(circuit) -> list:
    """Tensor angles stored in the circuit itself (rare: circuits built by hand)."""
    from qdiff.circuits.circuit import memo
    return memo(circuit, "tensor_params", lambda: [
        p for op in circuit.operations for p in op.params if isinstance(p, torch.Tensor)])


class Trace:
    """What a forward pass computed that its adjoint sweep reuses (kept in the engine's
    residual): the torch gate ``data`` per op, and the encoded native ``program`` of exactly
    those ops (``None`` when the forward fused or reordered gates, or ran a coded program)."""

    def __init__(self):
        self.data = None
        self.program = None


def simulate(circuit, theta: torch.Tensor, initial_state=None, cdtype=torch.complex128,
             device=None, fuse: bool = True, trace: Trace = None,
             use_native: bool = None) -> torch.Tensor:
    """Final states ``(B, 2**n)`` for parameter bindings ``theta`` ``(B, P)``.

    Differentiable by torch autograd when ``theta`` (or ``initial_state``) requires grad and
    grad mode is on; otherwise the state is updated in place. ``trace``: filled with what an
    adjoint sweep of this run can reuse. ``use_native``: the engine's kernel choice
    (:func:`~qdiff.backends.statevector.native.runs`; decided here when ``None``).
    """
    n = circuit.num_wires
    device = theta.device if device is None else torch.device(device)
    batch = theta.shape[0]
    rdtype = real_dtype_of(cdtype)
    grad = torch.is_grad_enabled() and (theta.requires_grad or (
        isinstance(initial_state, torch.Tensor) and initial_state.requires_grad) or any(
        p.requires_grad for p in _tensor_params(circuit)) or
        trainable_matrix_op(circuit) is not None)
    check_memory(n, batch, cdtype, device, copies=4.0 + (len(circuit.operations) if grad else 0))
    # torch.func transforms need out-of-place ops (a vmapped gate matrix included)
    inplace = not grad and is_concrete(theta) and all(
        is_concrete(gate.matrix_fn()) for _, gate in unitary_ops(circuit))
    if use_native is None:
        use_native = native.runs(cdtype, device, theta, grad)
    if initial_state is None:
        if inplace and use_native and isinstance(fuse, bool) and \
                native.coded_plan(circuit.operations, n) is not None:
            # the coded program writes the whole start state itself (from_zero), in parallel:
            # no serial zero pass, fresh pages first touched by every thread
            state = torch.empty(batch, 2 ** n, dtype=cdtype, device=device)
        else:
            state = zero_state(n, batch, cdtype, device)
    else:
        state = initial_state.to(device=device, dtype=cdtype).expand(batch, 2 ** n)
        state = state if grad else state.clone()
    return evolve(state, circuit.operations, theta, n, rdtype, inplace, fuse,
                  from_zero=initial_state is None, trace=trace,
                  use_native=use_native and inplace)


def evolve(state, operations, theta, n, rdtype, inplace, fuse=True, from_zero=False,
           trace: Trace = None, use_native: bool = None):
    """Apply ``operations`` to ``state`` ``(B, 2**n)``; returns the final state.

    ``fuse=True`` multiplies runs of one-qubit gates on a wire into one 2x2 before applying it;
    ``fuse=k`` (an int >= 2, no-grad path only) also fuses gates within windows of ``k``
    consecutive wires into ``2**k x 2**k`` blocks (:mod:`qdiff.backends.statevector.fusion`), whose result may
    live in a spare buffer: use the returned tensor. ``from_zero`` says that ``state`` stands
    for |0...0>: the native kernels do not read it (it may be uninitialised) and write the
    start state themselves (a leading product of one-qubit gates directly); a fallback from
    the native kernels to torch's first sets it to |0...0>.
    ``use_native``: run the native kernels (``None``: if they apply to ``state`` and ``theta``);
    a gate they cannot take falls back to torch before anything is applied.
    """
    if inplace and not isinstance(fuse, bool) and int(fuse) >= 2:
        return evolve_fused(state, operations, theta, n, rdtype, int(fuse))
    if use_native is None:
        use_native = inplace and native.usable(state) and is_concrete(theta)
    if inplace and isinstance(fuse, bool):
        if use_native and native.usable(state):
            try:
                return native.evolve(state, operations, theta, n, rdtype, fuse, from_zero,
                                     trace)
            except native.Unsupported:
                if from_zero:  # not written by the kernels: |0...0> for the torch kernels
                    _set_zero(state)
    angles = circuit_angles(operations, theta, rdtype)
    data = circuit_data(operations, angles, state.dtype)
    if trace is not None:
        trace.data = data
    for kind, a, b in fused_schedule(operations, data, state, fuse):
        if kind == "1q":
            state = apply_one_qubit(state, b, a, n, inplace)
        else:
            state = apply_data(state, a, b, n, inplace)
    return state


def apply_one_qubit(state, u, wire, n, inplace):
    """A 2x2 ``(B', 2, 2)`` on one wire: one matmul for tiny states, the slice kernel otherwise."""
    if state.numel() <= SMALL:
        b = state.shape[0]
        return torch.matmul(u.unsqueeze(1), state.view(b, 2 ** wire, 2, -1)).reshape(state.shape)
    return kernels.apply_one_qubit(state, u, wire, n, inplace)
