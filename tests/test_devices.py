"""The same qnodes on every torch device: values and gradients agree with the CPU.

CUDA cases are marked ``cuda`` and skipped when no GPU is present (run them with
``python -m pytest -m cuda`` on a GPU machine).
"""
import pytest
import torch

import qdiff as qd
from conftest import TORCH_DEVICES

DEVICES = TORCH_DEVICES


def _body(x, w):
    qd.AngleEmbedding(x, wires=range(4))
    qd.StronglyEntanglingLayers(w, wires=range(4))
    qd.DoubleExcitation(w[0, 0, 0], wires=[0, 1, 2, 3])
    return [qd.expval(qd.Z(0) @ qd.X(3) + 0.3 * qd.Y(1)), qd.var(qd.Z(2)), qd.expval(qd.Z(1))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["backprop", "adjoint", "parameter-shift"])
@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
def test_values_and_gradients_match_cpu(device, method, cdtype):
    gen = torch.Generator().manual_seed(3)
    rdtype = torch.float64 if cdtype == torch.complex128 else torch.float32
    x = torch.rand(5, 4, dtype=rdtype, generator=gen)
    w = torch.rand(2, 4, 3, dtype=rdtype, generator=gen)
    ref_q = qd.QNode(_body, qd.device("statevector", wires=4), diff_method="backprop")
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    ref = ref_q(xr, wr)
    ref_g = torch.autograd.grad(ref.sum(), (xr, wr))

    q = qd.QNode(_body, qd.device("statevector", wires=4, dtype=cdtype), diff_method=method)
    xd, wd = x.to(device).requires_grad_(), w.to(device).requires_grad_()
    out = q(xd, wd)
    assert out.device.type == device and out.dtype == rdtype
    grads = torch.autograd.grad(out.sum(), (xd, wd))
    tol = 1e-9 if cdtype == torch.complex128 else 2e-4
    assert torch.allclose(out.double().cpu(), ref.detach(), atol=tol)
    for g, r in zip(grads, ref_g):
        assert g.device.type == device
        assert torch.allclose(g.double().cpu(), r, atol=tol * 10)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_device_without_a_gpu_is_a_clear_error():
    with pytest.raises(qd.QdiffError, match="no CUDA device"):
        qd.device("statevector", wires=2, device="cuda")
    with pytest.raises(qd.QdiffError, match="invalid torch device"):
        qd.device("statevector", wires=2, device="gpu0")
