"""Run a recorded circuit on a backend with the chosen differentiation method.

``diff_method="best"`` picks, in order: ``backprop`` on a backend that supports it (the torch
statevector simulator) when the circuit is small enough that storing every intermediate state
is cheap (n <= 16 qubits), ``adjoint`` on such a backend for larger circuits, and
``parameter-shift`` everywhere else (shot-based simulators, hardware).
"""
from __future__ import annotations

import torch

from qdiff.circuits.errors import QdiffError

BACKPROP_MAX_WIRES = 16


def resolve_method(method: str, backend, circuit) -> str:
    caps = backend.capabilities
    shots = getattr(backend, "shots", None)
    if method == "best":
        if caps.backprop and not shots:
            return "backprop" if circuit.num_wires <= BACKPROP_MAX_WIRES else "adjoint"
        return "parameter-shift"
    if method == "backprop" and not caps.backprop:
        raise QdiffError(f"diff_method='backprop' needs a torch-simulated backend; "
                         f"'{backend.name}' is not one (use 'parameter-shift')")
    if method == "backprop" and shots:
        raise QdiffError("diff_method='backprop' is exact only: the device has shots; use "
                         "'parameter-shift' or 'spsa'")
    if method == "adjoint" and not (caps.adjoint or caps.device_vjp):
        raise QdiffError(f"diff_method='adjoint' needs a statevector backend; '{backend.name}' "
                         "does not expose states (use 'parameter-shift')")
    if method == "adjoint" and shots:
        raise QdiffError("diff_method='adjoint' is exact only and cannot be used with shots; "
                         "use 'parameter-shift' or 'spsa'")
    return method


def execute(recorded, backend, diff_method: str = "best", **gradient_kwargs) -> list:
    """One tensor per measurement of ``recorded.circuit``, each with leading dim ``B``."""
    circuit = recorded.circuit
    if circuit.num_wires != backend.num_wires:
        raise QdiffError(f"circuit has {circuit.num_wires} wires but the device has "
                         f"{backend.num_wires}")
    method = resolve_method(diff_method, backend, circuit)
    theta = recorded.theta
    prep = recorded.initial_state
    needs_grad = torch.is_grad_enabled() and (theta.requires_grad or (
        prep is not None and prep.requires_grad))
    if method == "backprop" or not needs_grad:
        return backend.execute(circuit, theta, recorded.initial_state)
    from qdiff.bridge import execute_with_rule
    return execute_with_rule(recorded, backend, method, **gradient_kwargs)
