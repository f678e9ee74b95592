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

from dataclasses import dataclass
from typing import Optional

import torch

from qdiff.backends.base import (Backend, Capabilities, Result, flat_outputs, register_backend,
                                 torch_placement)
from qdiff.backends.mixed import reverse
from qdiff.circuits.decompositions import lowered
from qdiff.backends.mixed.measure import NotADistribution, measure_all
from qdiff.backends.mixed.simulate import check_memory, evolve, state_bytes
from qdiff.circuits import memory
from qdiff.circuits.channels import is_channel
from qdiff.circuits.errors import QdiffError, QdiffMemoryError
from qdiff.circuits.noise import NoiseModel, resolve_noise
from qdiff.circuits.operation import ParamRef


@dataclass
class Residual:
    """What the reverse mode's ``vjp`` takes from a forward ``execute``: the memory plan and,
    when the whole batch fits it at once, the blocks, their superoperators and the recorded
    forward (:class:`~qdiff.backends.mixed.reverse.Tape`); otherwise ``vjp`` reruns the
    forward chunk by chunk."""

    plan: reverse.Plan
    blocks: Optional[reverse.Blocks] = None
    sups: Optional[list] = None
    tape: Optional[reverse.Tape] = None


def channel_out_of_range(circuit, theta: torch.Tensor) -> str:
    """What is wrong with the first channel of ``circuit`` whose parameters in ``theta``
    ``(B, P)`` are outside their range (the check's message), or a note that none is."""
    for op in circuit.operations:
        if not is_channel(op.gate) or not op.params:
            continue
        vals = [theta[:, p.index].detach() * p.scale + p.offset if isinstance(p, ParamRef)
                else p for p in op.params]
        try:
            op.gate.check(vals)
        except QdiffError as exc:
            return f"{exc} (on wires {list(op.wires)})"
    return "no channel parameter is outside its range"


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
    capabilities = Capabilities(backprop=True, vjp=True, shots=True, exact=True,
                                fast_vjp=True, backprop_max_wires=14)

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
        """Refuse a batch that cannot run at all: its parameters, and the density matrices of
        one binding (three). The whole batch is checked where it is simulated: backprop and
        plain forward runs hold it at once, the reverse mode runs it in chunks that fit."""
        memory.require(8.0 * batch * num_params, f"the parameters of a batch of {batch} "
                       "bindings", self.torch_device)
        check_memory(self.num_wires, 1, self.cdtype, self.torch_device, 3.0)

    def noisy(self, circuit):
        """``circuit`` with the noise model's channels inserted (itself without a model), as
        the engine runs it (wide Pauli rotations lowered after the noise model saw them)."""
        return lowered(circuit if self.noise is None else self.noise.apply(circuit), "mixed")

    def density_matrices(self, circuit, theta: torch.Tensor, initial_state=None):
        """Final density matrices ``(B, 2**n, 2**n)`` of the noisy circuit, from ``|0...0>``,
        from state vectors ``initial_state`` ``(B or 1, 2**n)``, or from density matrices
        ``initial_state`` ``(B or 1, 2**n, 2**n)``."""
        dev = self.torch_device if self.torch_device is not None else theta.device
        init = None
        if initial_state is not None and initial_state.dim() == 3:
            init = initial_state.to(device=dev, dtype=self.cdtype)
        elif initial_state is not None:
            psi = initial_state.to(device=dev, dtype=self.cdtype)
            init = psi.unsqueeze(-1) * psi.conj().unsqueeze(-2)
        return evolve(self.noisy(circuit), theta, init, self.cdtype, dev)

    def _device_of(self, theta):
        return self.torch_device if self.torch_device is not None else theta.device

    def _initial(self, job, dev, rows=None):
        """The job's start state as ``(B', 4**n)`` vectors (rows ``s:e`` of the batch)."""
        b = job.theta.shape[0] if rows is None else rows[1] - rows[0]
        init = job.initial_state
        if init is not None and rows is not None and init.shape[0] != 1:
            init = init[rows[0]:rows[1]]
        return reverse.initial_vectors(self.num_wires, b, self.cdtype, dev, init)

    def reverse_plan(self, circuit, batch: int) -> reverse.Plan:
        """The reverse mode's memory plan (chunk of bindings, checkpoint interval) for the
        noisy ``circuit`` run for ``batch`` bindings."""
        stored = sum(1 for blk, _ in reverse.fusion_plan(circuit)
                     if any(reverse.is_channel(circuit.operations[i].gate) for i in blk.ops))
        return reverse.plan(self.num_wires, batch, stored, self.cdtype, self.torch_device,
                            extra=reverse.block_bytes(circuit, self.cdtype))

    def vjp_suits(self, circuit) -> bool:
        """Whether the reverse mode suits one binding of ``circuit`` (noise included): its plan
        fits the memory budget and, beyond ``memory.ALWAYS_FITS``, holds no more than the
        density matrices backprop keeps (three per block). A trainable gate on k >= 3 wires
        holds ``16**k`` entries there (its environment on rows and columns): one on 7 of 7
        wires, 20 GiB and half a minute, where backprop takes a few MiB and milliseconds."""
        noisy = self.noisy(circuit)
        extra = reverse.block_bytes(noisy, self.cdtype)
        if extra <= memory.ALWAYS_FITS:
            return True
        try:
            need = self.reverse_plan(noisy, 1).need
        except QdiffMemoryError:
            return False
        one = state_bytes(self.num_wires, self.cdtype)
        return need <= (3.0 + 3.0 * len(reverse.fusion_plan(noisy))) * one

    def execute(self, jobs) -> list:
        out = []
        for job in jobs:
            shots = self.job_shots(job)
            if job.keep:
                if shots:
                    raise QdiffError("the mixed device's reverse mode is exact only: a job with "
                                     "shots keeps no residual")
                out.append(self._execute_keeping(job))
                continue
            rho = self.density_matrices(job.circuit, job.theta, job.initial_state)
            try:
                outs = measure_all(rho, job.circuit, shots,
                                   self.generator(rho.device) if shots else None, self.noise)
            except NotADistribution as exc:
                bad = channel_out_of_range(self.noisy(job.circuit), job.theta)
                raise QdiffError(f"{exc}: {bad} (finite differences, which 'best' takes with "
                                 "shots, move channel parameters by their step h: keep them h "
                                 "inside their range, or differentiate without shots)") from None
            out.append(Result(flat_outputs(outs) if job.flat else outs))
        return out

    def _execute_keeping(self, job) -> Result:
        """The forward of the reverse mode: recorded for the whole batch when its plan allows,
        else run chunk by chunk (the backward then records each chunk again)."""
        circuit = self.noisy(job.circuit)
        theta = job.theta.detach()
        dev = self._device_of(theta)
        theta = theta.to(dev)
        b, n = theta.shape[0], self.num_wires
        plan = self.reverse_plan(circuit, b)
        trainable = job.trainable or (True,) * theta.shape[1]
        if plan.chunk >= b:
            blocks = reverse.build_blocks(circuit, theta, self.cdtype, dev, trainable)
            sups = reverse.block_superops(blocks)
            tape = reverse.forward(blocks, sups, self._initial(job, dev), n, plan.interval)
            rho = tape.rho.reshape(b, 2 ** n, 2 ** n)
            outs = measure_all(rho, job.circuit, None, None, self.noise)
            res = Residual(plan, blocks, sups, tape)
        else:
            parts = []
            for rows in reverse.chunk_rows(b, plan.chunk):
                init = self._initial(job, dev, rows).reshape(-1, 2 ** n, 2 ** n)
                rho = evolve(circuit, theta[rows[0]:rows[1]], init, self.cdtype, dev)
                parts.append(measure_all(rho, job.circuit, None, None, self.noise))
                del rho
            outs = [torch.cat(col) for col in zip(*parts)]
            res = Residual(plan)
        return Result(flat_outputs(outs) if job.flat else outs, res)

    def vjp(self, jobs, cotangents, residuals) -> list:
        """``(B, P)`` gradients by the reverse mode (:mod:`qdiff.backends.mixed.reverse`): one
        backward sweep of the cotangent-weighted observable through the adjoint maps, over the
        forward its ``execute`` recorded, or chunk by chunk (forward recorded, then swept) when
        the batch does not fit at once."""
        out = []
        for job, g, res in zip(jobs, cotangents, residuals):
            circuit = self.noisy(job.circuit)
            theta = job.theta.detach()
            dev = self._device_of(theta)
            theta = theta.to(dev)
            g = g.to(dev)
            b, n = theta.shape[0], self.num_wires
            trainable = job.trainable or (True,) * theta.shape[1]
            train = reverse.trainable_ops(circuit, trainable)
            rdtype = torch.float32 if self.cdtype == torch.complex64 else torch.float64
            if res is None:
                res = Residual(self.reverse_plan(circuit, b))
            if res.tape is not None:
                lam = reverse.observable(res.tape.rho, job.circuit, g, n, self.noise)
                envs = reverse.sweep(res.blocks, res.sups, res.tape, lam, n, res.plan.interval,
                                     train)
                out.append(reverse.gradients(circuit, theta, envs, trainable, rdtype))
                continue
            parts = []
            for s, e in reverse.chunk_rows(b, res.plan.chunk):
                th = theta[s:e]
                blocks = reverse.build_blocks(circuit, th, self.cdtype, dev, trainable)
                sups = reverse.block_superops(blocks)
                tape = reverse.forward(blocks, sups, self._initial(job, dev, (s, e)), n,
                                       res.plan.interval)
                lam = reverse.observable(tape.rho, job.circuit, g[s:e], n, self.noise)
                envs = reverse.sweep(blocks, sups, tape, lam, n, res.plan.interval, train)
                del tape, lam
                parts.append(reverse.gradients(circuit, th, envs, trainable, rdtype))
            out.append(torch.cat(parts) if parts else
                       torch.zeros(0, theta.shape[1], dtype=rdtype, device=dev))
        return out

    def __repr__(self):
        shots = f", shots={self.shots}" if self.shots else ""
        noise = f", noise={self.noise.name!r}" if self.noise is not None else ""
        return f"<MixedBackend wires={self.num_wires}{noise}{shots}>"
