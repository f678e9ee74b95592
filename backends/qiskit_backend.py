"""The execute() flow the Qiskit-based backends share (Aer, IBM Runtime).

One ``execute(circuit, theta)`` call with ``B`` bindings becomes ONE primitive job: one PUB per
circuit variant (a variant is the circuit with one initial state; without ``initial_state``
there is one) carrying all its bindings as a ``(Bv, P)`` parameter-value array. Estimator PUBs
broadcast the ``K`` observables as ``(1, K)`` against ``(Bv, 1, P)`` bindings; Sampler PUBs add
one circuit per qubit-wise-commuting measurement basis.
"""
from __future__ import annotations

import abc

import hashlib
import threading
from dataclasses import dataclass

import numpy as np
import torch

from qdiff.backends import qiskit_common as qc_common
from qdiff.backends.base import Backend, Capabilities, Result, flat_outputs
from qdiff.backends.runtime_jobs import JobRunner
from qdiff.circuits import caches
from qdiff.circuits.channels import is_channel
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.memory import require


@dataclass
class Variant:
    """The circuit with one initial state (``prep`` None: |0...0>), run for theta ``rows``."""

    key: tuple
    rows: np.ndarray
    prep: object = None

    def build(self, circuit):
        from qdiff.circuits.qiskit_io import to_qiskit
        body = to_qiskit(circuit)
        if self.prep is None:
            return body
        from qiskit import QuantumCircuit
        from qiskit.circuit.library import StatePreparation
        qc = QuantumCircuit(circuit.num_wires)
        qc.append(StatePreparation(self.prep), range(circuit.num_wires))
        return qc.compose(body)


def _little_endian(vec: np.ndarray, n: int) -> np.ndarray:
    """A statevector with wire 0 most significant -> Qiskit's order (qubit 0 least significant)."""
    return np.ascontiguousarray(vec.reshape([2] * n).transpose(list(range(n))[::-1]).reshape(-1))


def split_variants(circuit, batch: int, initial_state) -> list:
    """Group the ``batch`` rows by initial state (identical states share one variant)."""
    key = qc_common.structure_key(circuit)
    all_rows = np.arange(batch)
    if initial_state is None:
        return [Variant(key, all_rows)]
    dim = 2 ** circuit.num_wires
    st = initial_state.detach().to("cpu", torch.complex128).numpy().reshape(-1, dim)
    if st.shape[0] not in (1, batch):
        raise QdiffError(f"initial_state has {st.shape[0]} rows for {batch} parameter bindings")
    st = np.broadcast_to(st, (batch, st.shape[1]))
    groups: dict = {}
    for b in range(batch):
        groups.setdefault(st[b].tobytes(), []).append(b)
    out = []
    for digest_src, rows in groups.items():
        vec = _little_endian(st[rows[0]], circuit.num_wires)
        vec = vec / np.linalg.norm(vec)
        digest = hashlib.sha1(digest_src).hexdigest()
        out.append(Variant(key + ("prep", digest), np.asarray(rows), vec))
    return out


def assemble(parts: list, circuit, batch: int, like: torch.Tensor) -> list:
    """``[(rows, {i: (Bv, ...) array})]`` -> one ``(B, ...)`` tensor per measurement."""
    out = []
    for i, m in enumerate(circuit.measurements):
        first = parts[0][1][i]
        full = np.zeros((batch,) + first.shape[1:], dtype=first.dtype)
        for rows, res in parts:
            full[rows] = res[i]
        t = torch.as_tensor(full, device=like.device)
        out.append(t.to(torch.float64) if t.is_floating_point() else t)
    return out


_PASS_MANAGER_LOCK = threading.Lock()  # publishes a backend's pass manager once


class SerialPassManager:
    """A transpiler pass manager that runs one circuit at a time. Qiskit's ``PassManager.run``
    keeps the run's property set on the pass manager and on its passes, and its Rust passes
    hold borrowed state while they run: two threads running one pass manager at once fail
    ("Already borrowed") or could read each other's layout. Threads sharing a device therefore
    transpile one after the other, once per circuit structure (``transpile_cache``)."""

    def __init__(self, pm):
        self.pm = pm
        self.lock = threading.Lock()

    def run(self, qc):
        with self.lock:
            return self.pm.run(qc)


class QiskitBackend(Backend):
    """Base of the Aer and IBM backends: transpile cache, job runner, shared execute flow.

    Subclasses provide ``_transpile(qc)``, ``_sampler()`` and, if they use an Estimator,
    ``_estimator()`` and ``_layout_ops``.
    """

    name = "qiskit"
    capabilities = Capabilities(backprop=False, vjp=False, shots=True, exact=False,
                                call_shots=False)

    def __init__(self, wires, shots, seed, runner: JobRunner):
        super().__init__(wires, shots, seed)
        self.runner = runner
        self.transpile_cache = qc_common.TranspileCache(self._transpile)
        self._pm = None

    def pass_manager(self, make) -> SerialPassManager:
        """The device's one pass manager, ``make()`` on first use. Two threads that both find
        none build one each (cheap, no resources held) and the first published is kept, so
        every thread runs through the same lock."""
        held = self._pm
        if held is None:
            built = SerialPassManager(make())
            with _PASS_MANAGER_LOCK:
                if self._pm is None:
                    self._pm = built
                held = self._pm
        return held

    def run_seed(self):
        """The simulator seed of one run: ``None`` without ``seed=``; else the next draw of the
        device's seeded generator, so successive runs sample differently and a device made
        with the same seed repeats the same sequence (as the embedded engine's shots do)."""
        if self.seed is None:
            return None
        with caches.outside_legacy_vmap():
            return int(torch.randint(0, 2 ** 31 - 1, (1,), generator=self.generator("cpu")))

    def __getstate__(self):
        """Pickled (``torch.save`` of a model, ``copy.deepcopy``) without the built pass
        manager and simulator, which hold unpicklable callables and are rebuilt on use."""
        state = dict(self.__dict__)
        for k in ("_pm", "_simulator"):
            if k in state:
                state[k] = None
        return state

    @property
    def jobs_submitted(self) -> int:
        """Primitive jobs (or simulator runs) submitted so far."""
        return self.runner.jobs_submitted

    def execute(self, jobs) -> list:
        """One primitive job (or simulator run) per job (see the Backend protocol)."""
        out = []
        for job in jobs:
            if self.job_shots(job) != self.shots:
                raise QdiffError(f"backend '{self.name}': shots are set on the device "
                                 f"({self.shots}); a job cannot ask for {job.shots}")
            outs = self._execute(job.circuit, job.theta, job.initial_state)
            out.append(Result(flat_outputs(outs) if job.flat else outs))
        return out

    # -- subclass hooks --------------------------------------------------------------------
    @abc.abstractmethod
    def _execute(self, circuit, theta, initial_state=None) -> list:
        """One tensor per measurement of ``circuit`` for the bindings ``theta``."""

    @abc.abstractmethod
    def _transpile(self, qc):
        """The circuit in this target's ISA (each target knows its own)."""

    @abc.abstractmethod
    def _sampler(self):
        """This target's sampler primitive."""

    # -- shared flow -----------------------------------------------------------------------
    def check_circuit(self, circuit, theta: torch.Tensor) -> torch.Tensor:
        if circuit.num_wires != self.num_wires:
            raise QdiffError(f"circuit has {circuit.num_wires} wires but the device has "
                             f"{self.num_wires}")
        if theta.ndim == 1:
            theta = theta.reshape(1, -1)
        if theta.ndim != 2 or theta.shape[1] != circuit.num_params:
            raise QdiffError(f"theta must have shape (B, {circuit.num_params}); got "
                             f"{tuple(theta.shape)}")
        for op in circuit.operations:
            if is_channel(op.gate):
                raise QdiffError(f"channel '{op.gate.pl_name}' on wires {list(op.wires)}: "
                                 f"backend '{self.name}' runs gates only, not noise channels; "
                                 "run circuits with channels on qd.device('mixed') (Aer takes "
                                 "a device's noise as qd.device('aer', noise_model=...))")
        return theta

    def _isa(self, circuit, variant: Variant, basis=None):
        key = variant.key if basis is None else variant.key + ("basis", basis)
        if basis is None:
            return self.transpile_cache.get(key, lambda: variant.build(circuit))
        return self.transpile_cache.get(
            key, lambda: qc_common.append_basis_measurement(variant.build(circuit), basis))

    def run_sampling(self, circuit, theta, variants: list, plan) -> list:
        """One Sampler job for every (variant, basis): ``[(rows, {i: array}), ...]``."""
        n, batch = circuit.num_wires, theta.shape[0]
        # the bits of every basis are held at once: a bool and an int64 copy per bit
        require(9.0 * len(plan.bases) * batch * self.shots * n,
                f"{self.name}: the bits of {self.shots} shots x {batch} bindings x "
                f"{len(plan.bases)} measurement bases on {n} qubits",
                hint="use fewer shots or a smaller batch")
        pubs = []
        for v in variants:
            for basis in plan.bases:
                isa, cols = self._isa(circuit, v, basis)
                pubs.append((isa, qc_common.binding_values(theta[v.rows], cols), self.shots))
        result = self.runner.run(lambda: self._sampler().run(pubs))
        parts, j = [], 0
        for v in variants:
            bits = []
            for _ in plan.bases:
                data = result[j].data
                b = qc_common.bits_of(getattr(data, "meas"))
                # a circuit without parameters comes back unbatched: one row for all bindings
                bits.append(np.broadcast_to(b.reshape(-1, *b.shape[-2:]),
                                            (len(v.rows),) + b.shape[-2:]))
                j += 1
            parts.append((v.rows, plan.outputs(bits)))
        return parts

    def run_estimator(self, circuit, theta, variants: list, ops: list) -> list:
        """One Estimator job, one PUB per variant: ``[(rows, {i: (Bv,)}), ...]``."""
        flat = [op for _, g in ops for op in g]
        # an observable whose coefficients are all zero (0 * Z, Z - Z) is 0: the estimators
        # refuse it ("Empty observable"), so it is not sent
        live = [k for k, op in enumerate(flat) if np.any(op.coeffs != 0)]
        pubs = []
        for v in variants:
            isa, cols = self._isa(circuit, v)
            laid = [flat[k].apply_layout(isa.layout, num_qubits=isa.num_qubits) for k in live]
            vals = qc_common.binding_values(theta[v.rows], cols)
            pubs.append((isa, [laid], vals[:, None, :]))
        result = self.runner.run(lambda: self._estimator().run(pubs)) if live else None
        parts = []
        for j, v in enumerate(variants):
            evs = np.zeros((len(v.rows), len(flat)))
            if live:
                got = np.asarray(result[j].data.evs, dtype=float).reshape(-1, len(live))
                evs[:, live] = np.broadcast_to(got, (len(v.rows), len(live)))
            parts.append((v.rows, qc_common.ops_outputs(ops, evs)))
        return parts

    def _estimator(self):
        raise QdiffError(f"backend '{self.name}' runs expectations through its sampler; it has "
                         "no estimator")
