"""Run a recorded circuit on a backend with the chosen differentiation rule.

The rule comes from the table in :mod:`qdiff.rules` (``diff_method="best"`` is a lookup over
the backend's capabilities). Backprop runs the backend under torch autograd; every other rule
goes through the torch bridge (:mod:`qdiff.bridge`), whose backward makes one backend call.

>>> import torch, qdiff as qd
>>> from qdiff.execute import execute
>>> dev = qd.device("statevector", wires=1)
>>> @qd.qnode(dev)
... def f(x):
...     qd.RX(x, wires=0); return qd.expval(qd.Z(0))
>>> rec, _ = f.construct(torch.tensor(0.0))
>>> execute(rec, dev)[0]
tensor([1.], dtype=torch.float64)
"""
from __future__ import annotations

import torch

from qdiff.circuits.errors import QdiffError
from qdiff.rules import BACKPROP, Options, higher_order, make_options, resolve


def execute(recorded, backend, diff_method: str = "best", stacked: bool = False,
            options: Options = None):
    """One tensor per measurement of ``recorded.circuit``, each with leading dim ``B``; with
    ``stacked``, the gradient rules may return the ``(B, K)`` outputs of all-scalar
    measurements as one tensor instead (the caller checks). ``options``: the rule's validated
    options (:func:`qdiff.rules.make_options`; defaults when omitted)."""
    circuit = recorded.circuit
    if circuit.num_wires != backend.num_wires:
        raise QdiffError(f"circuit has {circuit.num_wires} wires but the device has "
                         f"{backend.num_wires}")
    rule = resolve(diff_method, backend, circuit, recorded)
    theta = recorded.theta
    prep = recorded.initial_state
    needs_grad = torch.is_grad_enabled() and (theta.requires_grad or (
        prep is not None and prep.requires_grad))
    if rule is BACKPROP or not needs_grad:
        return backend.run(circuit, theta, prep)
    from qdiff.bridge import execute_with_rule
    if options is None or diff_method == "best":
        options = make_options(rule.name, {})
    return execute_with_rule(recorded, backend, rule, options, higher_order(diff_method, rule),
                             stacked=stacked)
