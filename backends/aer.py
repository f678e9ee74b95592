"""``qd.device("aer", ...)``: Qiskit Aer, exact or with shots, optionally noisy.

* ``shots=None`` (exact): one ``AerSimulator.run`` with ``save_expectation_value`` for every
  Pauli string of the measured observables (``save_probabilities``/``save_statevector`` for
  probs/state) and all ``B`` bindings as ``parameter_binds``. With a noise model the
  expectations are the exact noisy ones of the density matrix (``method="automatic"`` or
  ``"density_matrix"``; trajectory methods are refused).
* ``shots=N``: one Aer ``SamplerV2`` job; expectations are estimated from the bits measured in
  each qubit-wise-commuting basis (real shot noise, not a Gaussian surrogate).

>>> import torch, qdiff as qd
>>> dev = qd.device("aer", wires=1)
>>> @qd.qnode(dev)
... def f(x):
...     qd.RX(x, wires=0)
...     return qd.expval(qd.Z(0))
>>> round(float(f(torch.tensor(0.5))), 6) == round(float(torch.cos(torch.tensor(0.5))), 6)
True
"""
from __future__ import annotations

import functools
import itertools
from typing import Optional

import numpy as np
import torch

from qdiff.backends import qiskit_common as qc_common
from qdiff.backends.base import Capabilities, register_backend
from qdiff.backends.qiskit_backend import QiskitBackend, assemble, split_variants
from qdiff.backends.runtime_jobs import JobRunner
from qdiff.circuits.channels import pauli_word_matrix
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.memory import require

AER_BASIS = ("id", "x", "y", "z", "h", "s", "sdg", "t", "tdg", "sx", "sxdg", "rx", "ry", "rz", "p",
             "u", "cx", "cy", "cz", "swap", "rxx", "ryy", "rzz", "ecr", "ccx")
METHODS = ("automatic", "statevector", "density_matrix", "matrix_product_state", "stabilizer",
           "extended_stabilizer", "tensor_network")
# AerSimulator options that qd.device("aer", ...) sets from its own keywords
_OWN_OPTIONS = {"method": "method=", "device": "device=", "noise_model": "noise_model=",
                "shots": "shots=", "seed_simulator": "seed="}


@register_backend("aer", "qiskit.aer", "aer_simulator")
class AerBackend(QiskitBackend):
    """Qiskit Aer simulator backend.

    Args:
        wires: number of wires or their labels.
        shots: None (exact expectations) or the number of shots per measurement basis.
        method: Aer simulation method (``"automatic"``, ``"statevector"``, ``"density_matrix"``,
            ``"matrix_product_state"``, ...).
        noise_model: a ``qiskit_aer.noise.NoiseModel``, or a Qiskit backend (e.g. an IBM fake
            backend) whose noise model is used.
        seed: seeds the simulator: each run draws its seed from a generator seeded by it
            (successive runs differ; the same seed repeats the sequence).
        optimization_level: transpiler level for Aer's basis (0-3).
        device: ``"CPU"`` or ``"GPU"`` (needs qiskit-aer-gpu).
        backend_options: further ``AerSimulator`` options.
    """

    name = "aer"
    capabilities = Capabilities(backprop=False, vjp=False, shots=True, exact=True,
                                call_shots=False)

    def __init__(self, wires, shots: Optional[int] = None, method: str = "automatic",
                 noise_model=None, seed: Optional[int] = None, optimization_level: int = 1,
                 device: str = "CPU", backend_options: Optional[dict] = None, **job_options):
        if method in ("unitary", "superop"):
            raise QdiffError(f"Aer method '{method}' computes the circuit's {method} and cannot "
                             f"measure; choose from {list(METHODS)}")
        if method not in METHODS:
            raise QdiffError(f"unknown Aer method '{method}'; choose from {list(METHODS)}")
        if method == "extended_stabilizer" and not shots:
            raise QdiffError("Aer method 'extended_stabilizer' has no exact expectation values "
                             "(no save_expval); set shots=N")
        if isinstance(optimization_level, bool) or optimization_level not in (0, 1, 2, 3):
            raise QdiffError(f"optimization_level must be 0..3; got {optimization_level!r}")
        import inspect
        runner_kw = tuple(n for n in inspect.signature(JobRunner).parameters if n != "label")
        unknown = sorted(set(job_options) - set(runner_kw))
        if unknown:
            raise QdiffError(f"device 'aer': unknown keyword(s) {unknown}; valid keywords: "
                             f"['wires', 'shots', 'method', 'noise_model', 'seed', "
                             f"'optimization_level', 'device', 'backend_options', "
                             f"{', '.join(repr(k) for k in runner_kw)}]")
        super().__init__(wires, shots, seed, JobRunner("aer", **job_options))
        self.method = method
        self.optimization_level = optimization_level
        self.noise_model = _noise_model(noise_model)
        sim_method = _exact_noisy_method(method) if self.noise_model is not None and \
            not self.shots else method
        self.backend_options = dict(_user_options(backend_options), method=sim_method,
                                    device=_check_device(device, method))
        if self.noise_model is not None:
            self.backend_options["noise_model"] = self.noise_model
        _check_memory(self.num_wires, sim_method)
        self._simulator = None
        self.simulator()  # unknown backend_options are refused now, not at the first run

    def __repr__(self):
        shots = f", shots={self.shots}" if self.shots else ""
        noise = ", noisy" if self.noise_model is not None else ""
        return f"<AerBackend wires={self.num_wires}{shots}, method={self.method!r}{noise}>"

    # -- hooks -----------------------------------------------------------------------------
    def simulator(self):
        if self._simulator is None:
            from qiskit_aer import AerSimulator
            try:
                self._simulator = AerSimulator(**self.backend_options)
            except Exception as exc:  # noqa: BLE001 - Aer's AerError for a bad option
                raise QdiffError(f"aer: backend_options not accepted by AerSimulator: "
                                 f"{type(exc).__name__}: {exc}") from None
        return self._simulator

    def _transpile(self, qc):
        def make():
            from qiskit.transpiler import generate_preset_pass_manager
            # Aer's native controlled rotations (crx/cry/crz/cp/cu) give wrong results when
            # their angle is bound through parameter_binds (qiskit-aer 0.18.2; tested in
            # tests/test_backend_aer.py): compile them away into a basis without them.
            # With a noise model: its basis gates, the gates its errors are attached to.
            basis = list(AER_BASIS) if self.noise_model is None else \
                [g for g in self.noise_model.basis_gates if g not in _CONTROL_FLOW]
            if self.method in ("stabilizer", "extended_stabilizer"):
                # the gates this method runs: a 1-qubit Clifford block must not merge into 'u'
                native = set(self.simulator().configuration().basis_gates)
                basis = [g for g in basis if g in native]
            return generate_preset_pass_manager(optimization_level=self.optimization_level,
                                                basis_gates=basis)
        pm = self.pass_manager(make)
        try:
            isa = pm.run(qc)
        except Exception as exc:  # noqa: BLE001 - a gate the method's basis cannot express
            raise QdiffError(f"aer: the circuit cannot be compiled for method="
                             f"{self.method!r}: {type(exc).__name__}: {exc}") from None
        if self.noise_model is not None:
            check_noise_coverage(isa, self.noise_model)
        return isa

    def _sampler(self):
        from qiskit_aer.primitives import SamplerV2
        # the seed goes in as SamplerV2's own: qiskit-aer 0.17 passes a run_options
        # seed_simulator to AerSimulator.run next to its own seed_simulator=None (a TypeError)
        return SamplerV2(default_shots=self.shots, seed=self.run_seed(),
                         options={"backend_options": self.backend_options})

    # -- execution -------------------------------------------------------------------------
    def _execute(self, circuit, theta, initial_state=None) -> list:
        theta = self.check_circuit(circuit, theta)
        batch = theta.shape[0]
        variants = split_variants(circuit, batch, initial_state)
        if any(m.kind == "density_matrix" for m in circuit.measurements):
            raise QdiffError("density_matrix() is not available on backend 'aer' (use the "
                             "statevector device)")
        if self.method == "stabilizer":
            _refuse_non_clifford(circuit, theta)
        if self.shots:
            qc_common.check_measurements(circuit, self.name)
            plan = qc_common.SamplingPlan(circuit, qc_common.measured_operators(circuit))
            parts = self.run_sampling(circuit, theta, variants, plan)
        else:
            parts = self._run_exact(circuit, theta, variants)
        return assemble(parts, circuit, batch, theta)

    def _run_exact(self, circuit, theta, variants) -> list:
        """One AerSimulator run: save instructions for every output, all bindings at once."""
        _check_saved_memory(circuit, theta.shape[0])
        ops = qc_common.measured_operators(circuit)
        labels = sorted({lbl for _, g in ops for op in g for lbl in op.paulis.to_labels()})
        circuits, binds, sizes, physs = [], [], [], []
        for v in variants:
            isa, cols = self._isa(circuit, v)
            circuits.append(self._with_saves(circuit, isa, labels))
            physs.append(final_qubits(isa, circuit.num_wires))
            vals = qc_common.binding_values(theta[v.rows], cols)
            if vals.shape[1]:
                binds.append({p: vals[:, j] for j, p in enumerate(isa.parameters)})
            sizes.append(len(v.rows) if vals.shape[1] else 1)
        seed = self.run_seed()
        run_kw = {} if seed is None else {"seed_simulator": seed}
        if any(binds):
            run_kw["parameter_binds"] = binds  # every variant has the same parameters
        result = self.runner.run(lambda: self.simulator().run(circuits, **run_kw))
        _check_success(result, self.backend_options["method"])
        parts, k = [], 0
        for v, size, phys in zip(variants, sizes, physs):
            datas = [result.data(k + j) for j in range(size)]
            k += size
            datas = datas * len(v.rows) if size == 1 else datas
            parts.append((v.rows, self._exact_outputs(circuit, ops, datas, phys)))
        return parts

    def _readout(self):
        """The noise model's readout errors as qdiff's model (per device qubit), for the exact
        probabilities (Aer applies them to sampled counts only); None without any."""
        if self.noise_model is None or not _has_readout(self.noise_model):
            return None
        if getattr(self, "_readout_model", None) is None:
            from qdiff.circuits.noise import from_qiskit
            self._readout_model = from_qiskit(self.noise_model)
        return self._readout_model

    def _with_saves(self, circuit, isa, labels):
        from qiskit.quantum_info import Pauli
        qc = isa.copy()
        n = circuit.num_wires
        # the qubit holding each wire at the end (levels 2-3 elide SWAPs into a permutation)
        phys = final_qubits(isa, n)
        for lbl in labels:
            qc.save_expectation_value(Pauli(lbl), qubits=phys, label="ev_" + lbl)
        for i, m in enumerate(circuit.measurements):
            wires = list(range(n)) if m.wires is None else list(m.wires)
            if m.kind == "probs":  # reversed: the first wire becomes the most significant bit
                qc.save_probabilities(qubits=[phys[w] for w in wires[::-1]],
                                      label=f"probs_{i}")
            elif m.kind == "state":
                if self.noise_model is not None:
                    raise QdiffError("state() is not available on a noisy device (the state is "
                                     "mixed); use qd.device('mixed', ...) and density_matrix()")
                if self.method not in ("automatic", "statevector"):
                    raise QdiffError(f"state() needs method='statevector' (device has "
                                     f"method={self.method!r})")
                qc.save_statevector(label=f"state_{i}")
            elif m.kind in ("sample", "counts"):
                raise QdiffError(f"{m.kind}() needs a device with shots "
                                 "(qd.device('aer', wires=..., shots=N))")
        return qc

    def _exact_outputs(self, circuit, ops, datas, phys) -> dict:
        n = circuit.num_wires
        flat = [op for _, g in ops for op in g]
        evs = np.zeros((len(datas), len(flat)))
        for b, d in enumerate(datas):
            for j, op in enumerate(flat):
                evs[b, j] = sum(float(np.real(c)) * float(np.real(d["ev_" + lbl]))
                                for lbl, c in zip(op.paulis.to_labels(), op.coeffs))
        res = qc_common.ops_outputs(ops, evs)
        for i, m in enumerate(circuit.measurements):
            if m.kind == "probs":
                res[i] = np.stack([np.asarray(d[f"probs_{i}"], dtype=float) for d in datas])
                readout = self._readout()
                if readout is not None:  # Aer saves the state's probabilities: its readout
                    wires = list(range(n)) if m.wires is None else list(m.wires)  # errors too
                    res[i] = readout.readout_probs(torch.as_tensor(res[i]),
                                                   [phys[w] for w in wires]).numpy()
            elif m.kind == "state":
                res[i] = np.stack([_big_endian(np.asarray(d[f"state_{i}"]), n, phys)
                                   for d in datas])
        return res


def _has_readout(noise_model) -> bool:
    return bool(getattr(noise_model, "_local_readout_errors", None)) or \
        getattr(noise_model, "_default_readout_error", None) is not None


def _check_saved_memory(circuit, batch: int) -> None:
    """Refuse before the run: saved states (16*2^n bytes) and probabilities (8*2^k) of every
    binding, held twice (Aer's result and the stacked output)."""
    n, need = circuit.num_wires, 0.0
    for m in circuit.measurements:
        if m.kind == "state":
            need += 2.0 * batch * 16.0 * 2.0 ** n
        elif m.kind == "probs":
            need += 2.0 * batch * 8.0 * 2.0 ** (n if m.wires is None else len(m.wires))
    require(need, f"aer: the saved states/probabilities of {batch} bindings on {n} qubits",
            hint="use a smaller batch")


CLIFFORD_TOL = 1e-8  # |U P U^dag - c Q| per entry: float32 pi/2 (off by 4e-8) is no Clifford


def _refuse_non_clifford(circuit, theta) -> None:
    """Under ``method="stabilizer"``, the first gate with angles whose matrix at some binding is
    not a Clifford gate (it maps the Paulis on its wires to Paulis), named with its angles,
    instead of Aer's "invalid parameters" for the whole circuit."""
    from qdiff.backends.statevector.gate_data import circuit_angles
    ops = [op for op in circuit.operations if op.params and op.gate.num_wires <= 3]
    if not ops or theta.shape[0] == 0:
        return
    angles = circuit_angles(ops, theta.detach().to(torch.float64), torch.float64)
    for op, vals in zip(ops, angles):
        us = op.gate.matrix_fn(*vals).to(torch.complex128)  # (B', d, d)
        k = op.gate.num_wires
        paulis = _pauli_words(k)  # (4**k, d, d)
        worst = torch.zeros(us.shape[0], dtype=torch.float64)
        for w in range(k):
            for c in (1, 3):  # X and Z on wire w: a Clifford maps each to one Pauli word
                img = us @ paulis[c * 4 ** (k - 1 - w)] @ us.mH
                coef = torch.einsum("pij,bji->bp", paulis, img) / us.shape[-1]
                top = coef.abs().argmax(dim=1)
                fit = coef.gather(1, top[:, None])[:, :, None] * paulis[top]
                worst = torch.maximum(worst, (img - fit).abs().amax(dim=(1, 2)))
        if bool((worst > CLIFFORD_TOL).any()):
            b = int((worst > CLIFFORD_TOL).nonzero()[0, 0])
            shown = ", ".join(repr(float(v[min(b, v.shape[0] - 1)])) for v in vals)
            raise QdiffError(
                f"aer method 'stabilizer': gate '{op.gate.pl_name or op.name}' on wires "
                f"{list(op.wires)} with angle(s) {shown} is not a Clifford gate (the method "
                f"runs Clifford gates only: a rotation by a multiple of pi/2, a controlled one "
                f"by a multiple of pi)" + (
                    "; within 1e-5 of one: single-precision angles? pass float64 tensors"
                    if float(worst[b]) < 1e-5 else ""))


@functools.lru_cache(maxsize=None)
def _pauli_words(k: int) -> torch.Tensor:
    """The ``4**k`` Pauli words on ``k`` wires (I, X, Y, Z per wire, the first wire most
    significant), ``(4**k, 2**k, 2**k)`` complex128 (the words are Hermitian: the coefficient
    of word P in M is tr(P M) / 2**k)."""
    return torch.as_tensor(np.stack([pauli_word_matrix("".join(w))
                                     for w in itertools.product("IXYZ", repeat=k)]))


def _check_success(result, method: str) -> None:
    """A run whose experiments failed (a non-Clifford gate under ``method="stabilizer"``, ...)
    is a QdiffError with Aer's reason, not a QiskitError at the first ``result.data()``."""
    if getattr(result, "success", True):
        return
    reasons = sorted({str(getattr(r, "status", "")) for r in getattr(result, "results", [])
                      if not getattr(r, "success", True)} - {""})
    raise QdiffError(f"aer: the simulation failed (method={method!r}): "
                     f"{'; '.join(reasons) or getattr(result, 'status', 'unknown error')}")


_CONTROL_FLOW = ("if_else", "for_loop", "switch_case", "while_loop", "box")


def check_noise_coverage(isa, noise_model) -> None:
    """Refuse a gate that the noise model gives errors on some qubits but not on the qubits it
    acts on here (a device's model: a two-qubit gate on an uncoupled pair, a gate on a qubit
    the device lacks): Aer would run it noiselessly while the same gate elsewhere is noisy."""
    local = getattr(noise_model, "_local_quantum_errors", {})
    default = getattr(noise_model, "_default_quantum_errors", {})
    for inst in isa.data:
        name = inst.operation.name
        if name not in local or name in default:
            continue
        qubits = tuple(isa.find_bit(q).index for q in inst.qubits)
        if qubits not in local[name]:
            raise QdiffError(
                f"gate '{name}' on qubits {list(qubits)}: the noise model has '{name}' errors "
                f"only on {sorted(local[name])}, so Aer would run this one noiselessly (the "
                "qubits are not coupled on the device the model describes); route the circuit "
                "for the device first (qd.compile(..., target=...)), or run it on "
                "qd.device('mixed', noise=...) or qd.device('ibm', backend=...), which route")


def final_qubits(isa, n: int) -> list:
    """The qubit of ``isa`` holding each of the ``n`` wires at the end of the circuit: the
    identity unless the transpiler left a permutation (``ElidePermutations`` at levels 2-3
    removes SWAPs and relabels the qubits after them)."""
    layout = getattr(isa, "layout", None)
    if layout is None:
        return list(range(n))
    return [int(q) for q in layout.final_index_layout(filter_ancillas=True)][:n]


def _big_endian(vec: np.ndarray, n: int, phys=None) -> np.ndarray:
    """A saved state (Qiskit order) -> wire 0 most significant; wire i is on qubit ``phys[i]``."""
    phys = list(range(n)) if phys is None else phys
    return vec.reshape([2] * n).transpose([n - 1 - phys[i] for i in range(n)]).reshape(-1)


def _noise_model(noise_model):
    if noise_model is None:
        return None
    from qiskit_aer.noise import NoiseModel
    if isinstance(noise_model, NoiseModel):
        return noise_model
    if hasattr(noise_model, "target") or hasattr(noise_model, "properties"):
        return NoiseModel.from_backend(noise_model)
    raise QdiffError("noise_model must be a qiskit_aer.noise.NoiseModel or a Qiskit backend; "
                     f"got {type(noise_model).__name__}")


def _user_options(backend_options) -> dict:
    """``backend_options`` as a dict; options that have a keyword of their own are refused
    (that keyword's value would override them)."""
    if backend_options is None:
        return {}
    if not isinstance(backend_options, dict):
        raise QdiffError(f"backend_options must be a dict of AerSimulator options; got "
                         f"{type(backend_options).__name__}")
    for key, keyword in _OWN_OPTIONS.items():
        if key in backend_options:
            raise QdiffError(f"backend_options={{'{key}': ...}}: pass it as "
                             f"qd.device('aer', ..., {keyword}...) instead")
    return dict(backend_options)


def _check_device(device, method: str) -> str:
    """``device`` (``"CPU"``, ``"GPU"``; any case) if this qiskit-aer build has it and
    ``method``; a QdiffError naming what is available otherwise."""
    from qiskit_aer import AerSimulator
    sim = AerSimulator()
    devices = sim.available_devices()
    name = device.upper() if isinstance(device, str) else device
    if name not in devices:
        raise QdiffError(f"aer: device={device!r} is not available in this qiskit-aer build; "
                         f"available: {list(devices)}")
    if method not in sim.available_methods():
        raise QdiffError(f"aer: method={method!r} is not available in this qiskit-aer build "
                         f"(tensor_network needs qiskit-aer-gpu); available: "
                         f"{list(sim.available_methods())}")
    return name


def _exact_noisy_method(method: str) -> str:
    """The Aer method for exact (``shots=None``) expectations under a noise model: only a
    density matrix gives them; the other methods average sampled noise trajectories (random,
    not exact), so they are refused, and ``"automatic"`` means ``"density_matrix"``."""
    if method in ("automatic", "density_matrix"):
        return "density_matrix"
    raise QdiffError(f"aer: method={method!r} with a noise model and shots=None would average "
                     "randomly sampled noise trajectories, not give exact expectations; use "
                     "method='density_matrix' (exact), or set shots=N")


def _check_memory(n: int, method: str):
    """Refuse before allocating: a statevector needs 16*2^n bytes, a density matrix 16*4^n,
    against the memory available now (:mod:`qdiff.circuits.memory`)."""
    if method in ("matrix_product_state", "stabilizer", "extended_stabilizer", "tensor_network"):
        return
    dense = method in ("density_matrix", "unitary", "superop")
    require(16.0 * (4.0 ** n if dense else 2.0 ** n),
            f"aer: {n} qubits with method={method!r}",
            hint="method='matrix_product_state' needs far less for weakly entangled circuits")
