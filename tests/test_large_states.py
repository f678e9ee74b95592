"""Circuits on states above the small-state threshold, where the slice kernels (in place and
functional) run instead of the one-op small-state path: values against PennyLane lightning,
gradients of every exact method against each other."""
import numpy as np
import pennylane as qml
import pytest
import torch

import qdiff as qd
from qdiff.backends.statevector.gate_data import SMALL
from qdiff.circuits.gates import GATES

N = 16
assert 2 ** N > SMALL  # the point of this file
POOL = [g for g in GATES.values() if g.num_wires <= 4 and not g.pl_name.startswith("Adjoint")
        and g.pl_name not in ("Sdg", "Tdg", "SXdg")]


def _ops(seed, depth=40):
    rng = np.random.default_rng(seed)
    ops = []
    for _ in range(depth):
        g = POOL[rng.integers(len(POOL))]
        wires = [int(w) for w in rng.choice(N, g.num_wires, replace=False)]
        ops.append((g, wires, rng.uniform(-3, 3, g.num_params)))
    return ops


def _run(mod, ops, x):
    mod.RY(x[0], wires=0)
    mod.CRX(x[1], wires=[N - 1, 3])
    for g, wires, p in ops:
        getattr(mod, g.pl_name)(*p, wires=wires)
    mod.Rot(x[0], x[1], x[2], wires=N // 2)
    mod.CNOT(wires=[N // 2, 1])
    return [mod.expval(mod.PauliZ(1)), mod.expval(mod.PauliX(3) @ mod.PauliY(N - 1)),
            mod.expval(mod.PauliZ(N // 2) @ mod.PauliZ(0))]


@pytest.mark.parametrize("seed", range(3))
def test_large_state_values_match_lightning(seed):
    ops = _ops(seed)
    x = torch.tensor([0.3, -1.1, 0.7], dtype=torch.float64)
    ours = qd.QNode(lambda x: _run(qd, ops, x), qd.device("statevector", wires=N))
    pl = qml.QNode(lambda x: _run(qml, ops, x), qml.device("lightning.qubit", wires=N))
    ref = torch.tensor(np.array(pl(x.numpy())))
    with torch.no_grad():
        assert torch.allclose(ours(x), ref, atol=1e-10)  # in-place kernels
    xr = x.clone().requires_grad_(True)
    assert torch.allclose(ours(xr).detach(), ref, atol=1e-10)  # functional (autograd) kernels


@pytest.mark.parametrize("seed", range(2))
def test_large_state_gradients_agree(seed):
    ops = _ops(10 + seed, depth=25)
    grads = {}
    for method in ("backprop", "adjoint", "parameter-shift"):
        q = qd.QNode(lambda x: _run(qd, ops, x), qd.device("statevector", wires=N),
                     diff_method=method)
        x = torch.tensor([0.3, -1.1, 0.7], dtype=torch.float64, requires_grad=True)
        (grads[method],) = torch.autograd.grad(q(x).sum(), x)
    assert torch.allclose(grads["adjoint"], grads["backprop"], atol=1e-9)
    assert torch.allclose(grads["parameter-shift"], grads["backprop"], atol=1e-9)
