"""Shared test helpers: seeded generators and comparisons up to a global phase."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

# torch devices of the device-parametrized tests: the CPU always, CUDA marked ``cuda`` and
# skipped without a GPU (``python -m pytest -m cuda`` on a GPU machine)
CUDA = pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device")])
TORCH_DEVICES = ["cpu", CUDA]


@contextlib.contextmanager
def torch_threads(t: int):
    """``torch.set_num_threads(t)`` for the block (the native kernels follow it)."""
    old = torch.get_num_threads()
    torch.set_num_threads(t)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def close_up_to_phase(a, b, atol: float = 1e-10) -> bool:
    """True when ``a == exp(i c) b`` for some real ``c`` (matrices or vectors)."""
    a = np.asarray(a, dtype=complex)
    b = np.asarray(b, dtype=complex)
    k = np.unravel_index(np.argmax(np.abs(b)), b.shape)
    if abs(b[k]) < 1e-12:
        return np.allclose(a, b, atol=atol)
    phase = a[k] / b[k]
    return abs(abs(phase) - 1) < 1e-8 and np.allclose(a, phase * b, atol=atol)


def random_unitary(d: int, gen: torch.Generator) -> torch.Tensor:
    """Haar-ish random ``(d, d)`` complex128 unitary (QR of a Gaussian matrix)."""
    z = torch.randn(d, d, dtype=torch.complex128, generator=gen)
    q, r = torch.linalg.qr(z)
    return q * (torch.diagonal(r) / torch.diagonal(r).abs())


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


@pytest.fixture(autouse=True)
def _fixed_torch_seed():
    torch.manual_seed(0)
    np.random.seed(0)
