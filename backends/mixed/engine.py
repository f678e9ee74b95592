"""The mixed-state engine behind the Backend protocol.

>>> import torch, qdiff as qd
>>> dev = qd.device("mixed", wires=1)
>>> @qd.qnode(dev)
... def f(p):
...     qd.Hadamard(0); qd.DepolarizingChannel(p, wires=0)
...     return qd.expval(qd.X(0))
>>> f(torch.tensor(0.3, dtype=torch.float64))
tensor(0.6000, dtype=torch.float64)
"""
from __future__ import annotations

from typing import Optional

import torch

from qdiff.backends.base import (Backend, Capabilities, Result, flat_outputs, register_backend,
                                 torch_placement)
from qdiff.backends.mixed.measure import measure_all
from qdiff.backends.mixed.simulate import check_memory, evolve
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.noise import NoiseModel, resolve_noise



@register_backend("mixed", "density_matrix")
class MixedBackend(Backend):
    """Density matrices ``(B, 2**n, 2**n)`` in torch, batched over bindings; channels and
    gates; exact results or shots.

    Args:
        wires: number of wires or their labels.
        noise: ``None``, a :class:`qdiff.noise.NoiseModel`, or an IBM device name / Qiskit
            backend / ``qiskit_aer.noise.NoiseModel`` (converted by :func:`qdiff.noise.from_backend`).
        shots: None for exact results, or samples per measurement.
        device: torch device; dtype: ``torch.complex128`` (default) or ``torch.complex64``.
        seed: seed of the sampling generator.
        layout: with a device noise model, the device qubit of each wire (a permutation of
            ``0..n-1``); circuits are then routed from that placement. Without it, wire ``i``
            is device qubit ``i``; a circuit not native to the device is routed first.
    """

    name = "mixed"
    capabilities = Capabilities(backprop=True, vjp=False, shots=True, exact=True,
                                backprop_max_wires=14)

    def __init__(self, wires, noise=None, shots: Optional[int] = None, device=None,
                 dtype=torch.complex128, seed: Optional[int] = None, layout=None):
        super().__init__(wires, shots, seed)
        self.cdtype, self.torch_device = torch_placement(dtype, device)
        self.noise = resolve_noise(noise)
        if self.noise is not None:
            self.noise.check_wires(self.num_wires)
        if layout is not None and self.noise is None:
            raise QdiffError(f"layout={layout!r} needs a device noise model (noise=...)")
        self.layout = None if self.noise is None else self.noise.check_layout(layout,
                                                                              self.num_wires)
        check_memory(self.num_wires, 1, self.cdtype, self.torch_device, 3.0)

    def check_batch(self, batch: int, num_params: int) -> None:
        """Refuse a batch whose density matrices cannot fit (three per binding at least)."""
        check_memory(self.num_wires, batch, self.cdtype, self.torch_device, 3.0)

    def noisy(self, circuit):
        """``circuit`` with the noise model's channels inserted (itself without a model)."""
        return circuit if self.noise is None else self.noise.apply(circuit)

    def density_matrices(self, circuit, theta: torch.Tensor, initial_state=None):
        """Final density matrices ``(B, 2**n, 2**n)`` of the noisy circuit."""
        dev = self.torch_device if self.torch_device is not None else theta.device
        init = None
        if initial_state is not None:
            psi = initial_state.to(device=dev, dtype=self.cdtype)
            init = psi.unsqueeze(-1) * psi.conj().unsqueeze(-2)
        return evolve(self.noisy(circuit), theta, init, self.cdtype, dev)

    def execute(self, jobs) -> list:
        out = []
        for job in jobs:
            if job.keep:
                raise QdiffError("the mixed device has no reverse mode of its own; use "
                                 "diff_method='backprop' (or 'best')")
            shots = self.job_shots(job)
            rho = self.density_matrices(job.circuit, job.theta, job.initial_state)
            outs = measure_all(rho, job.circuit, shots,
                               self.generator(rho.device) if shots else None, self.noise)
            out.append(Result(flat_outputs(outs) if job.flat else outs))
        return out

    def __repr__(self):
        shots = f", shots={self.shots}" if self.shots else ""
        noise = f", noise={self.noise.name!r}" if self.noise is not None else ""
        return f"<MixedBackend wires={self.num_wires}{noise}{shots}>"
