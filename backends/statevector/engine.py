"""The embedded default backend: a pure-torch statevector simulator (CPU or CUDA).

>>> import torch, qdiff as qd
>>> dev = qd.device("statevector", wires=2, dtype=torch.complex64)
>>> dev.cdtype
torch.complex64
"""
from __future__ import annotations

from typing import Optional

import torch

from qdiff.backends.base import Backend, Capabilities, register_backend
from qdiff.backends.statevector import native
from qdiff.backends.statevector.measure import measure_all
from qdiff.backends.statevector.simulate import simulate
from qdiff.circuits.errors import QdiffError

_DTYPES = {torch.complex128: torch.complex128, torch.complex64: torch.complex64,
           torch.float64: torch.complex128, torch.float32: torch.complex64,
           "complex128": torch.complex128, "complex64": torch.complex64}


@register_backend("statevector", "default", "default.qubit", "torch")
class StatevectorBackend(Backend):
    """Batched torch statevector simulation; exact, or sampled with a seeded generator.

    Args:
        wires: number of wires or their labels.
        shots: None for exact results, or the number of samples per measurement.
        device: torch device (``"cpu"``, ``"cuda"``, ...).
        dtype: ``torch.complex128`` (default) or ``torch.complex64``.
        seed: seed of the sampling generator (same seed, same samples).
    """

    name = "statevector"
    capabilities = Capabilities(backprop=True, adjoint=True, shots=True, exact=True)

    def __init__(self, wires, shots: Optional[int] = None, device=None, dtype=torch.complex128,
                 seed: Optional[int] = None, fuse: bool = True):
        super().__init__(wires, shots, seed)
        if dtype not in _DTYPES:
            raise QdiffError(f"dtype must be complex128 or complex64; got {dtype}")
        self.cdtype = _DTYPES[dtype]
        try:
            self.torch_device = torch.device(device) if device is not None else None
        except RuntimeError as exc:
            raise QdiffError(f"invalid torch device {device!r}: {exc}") from None
        if self.torch_device is not None and self.torch_device.type == "cuda" and \
                not torch.cuda.is_available():
            raise QdiffError(f"device={device!r}: no CUDA device is available here (use 'cpu')")
        self.fuse = fuse
        self._generator = None

    def native_kernels(self, theta_device=None) -> bool:
        """Whether exact no-grad runs go through the native CPU kernels (CPU, complex128, the
        library built): then the adjoint method is the fast gradient (see ``diff_method='best'``)."""
        dev = self.torch_device or torch.device(theta_device or "cpu")
        return dev.type == "cpu" and self.cdtype == torch.complex128 and \
            native.library() is not None

    def generator(self, device) -> torch.Generator:
        if self._generator is None or self._generator.device != torch.device(device):
            g = torch.Generator(device=device)
            if self.seed is not None:
                g.manual_seed(int(self.seed))
            else:
                g.seed()
            self._generator = g
        return self._generator

    def target_device(self, theta: torch.Tensor) -> torch.device:
        return self.torch_device if self.torch_device is not None else theta.device

    def final_state(self, circuit, theta, initial_state=None) -> torch.Tensor:
        dev = self.target_device(theta)
        return simulate(circuit, theta.to(dev), initial_state, self.cdtype, dev, self.fuse)

    def execute(self, circuit, theta, initial_state=None, shots="device") -> list:
        shots = self.shots if shots == "device" else shots
        state = self.final_state(circuit, theta, initial_state)
        return measure_all(state, circuit, shots, self.generator(state.device) if shots else None)
