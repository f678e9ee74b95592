"""What the Qiskit-based backends (Aer, IBM Runtime) share: circuit structure keys, the
transpile cache, observables as ``SparsePauliOp``, binding arrays for V2 primitive PUBs, and
expectation values estimated from measured bits.

Qiskit is imported inside the functions that need it, so importing this module is cheap.

A qdiff circuit becomes ONE parametrized Qiskit circuit (theta columns ->
``ParameterVector('theta', P)``), transpiled once per *structure* (gates, wires, ParamRef
scales/offsets and constant angles; not the values of theta). Every execute() then sends all
``B`` bindings as one parameter-value array, so a parameter-shift backward pass is one job.

>>> import qdiff as qd
>>> obs = qd.Z(0) @ qd.X(2) + 0.5 * qd.Y(1)
>>> to_sparse_pauli(obs, 3)  # doctest: +NORMALIZE_WHITESPACE
SparsePauliOp(['XIZ', 'IYI'],
              coeffs=[1. +0.j, 0.5+0.j])
"""
from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict

import numpy as np
import torch

from qdiff.circuits.decompositions import pauli_decompose
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.operation import ParamRef

# -- structure keys and the transpile cache ---------------------------------------------------


def structure_key(circuit) -> tuple:
    """A hashable key of everything that changes the transpiled circuit (not theta's values)."""
    ops = []
    for op in circuit.operations:
        hyper = op.gate.hyper
        if op.name == "unitary":  # the matrix itself: key it by its bytes
            m = np.ascontiguousarray(np.asarray(op.gate.hyper[0].detach().cpu()))
            hyper = (hashlib.sha1(m.tobytes()).hexdigest(),)
        params = tuple((p.index, p.scale, p.offset) if isinstance(p, ParamRef) else float(p)
                       for p in op.params)
        ops.append((op.name, hyper, op.wires, params))
    return circuit.num_wires, circuit.num_params, tuple(ops)


class TranspileCache:
    """LRU cache ``key -> (isa circuit, theta columns of its parameters)``.

    ``build()`` makes the logical ``QuantumCircuit``; ``transpile(qc)`` maps it to the target's
    ISA. ``hits``/``misses`` let tests check a training loop does not re-transpile.
    """

    def __init__(self, transpile, maxsize: int = 256):
        self._transpile = transpile
        self._store: OrderedDict = OrderedDict()
        self.maxsize = maxsize
        self.hits = 0
        self.misses = 0

    def get(self, key, build):
        entry = self._store.get(key)
        if entry is not None:
            self.hits += 1
            try:
                self._store.move_to_end(key)
            except KeyError:  # evicted meanwhile by another thread: the entry is still valid
                pass
            return entry
        self.misses += 1
        isa = self._transpile(build())
        entry = (isa, parameter_columns(isa))
        self._store[key] = entry
        if len(self._store) > self.maxsize:
            try:
                self._store.popitem(last=False)
            except KeyError:  # emptied meanwhile by another thread
                pass
        return entry

    def __len__(self):
        return len(self._store)


def parameter_columns(qc) -> np.ndarray:
    """Theta column of each parameter of ``qc`` in ``qc.parameters`` order."""
    cols = []
    for p in qc.parameters:
        idx = getattr(p, "index", None)
        if idx is None or getattr(getattr(p, "vector", None), "name", None) != "theta":
            raise QdiffError(f"transpiled circuit has an unexpected parameter '{p}'")
        cols.append(int(idx))
    return np.asarray(cols, dtype=np.int64)


def binding_values(theta: torch.Tensor, columns: np.ndarray) -> np.ndarray:
    """``(B, P')`` float64 values for a circuit whose parameters are theta ``columns``."""
    t = theta.detach().to("cpu", torch.float64).numpy()
    return np.ascontiguousarray(t[:, columns])


# -- observables --------------------------------------------------------------------------------


def _factor_paulis(f) -> list[tuple[float, dict]]:
    """A factor as ``[(coeff, {wire: letter}), ...]``; Hermitian matrices are Pauli-expanded."""
    if f.kind != "M":
        return [(1.0, {f.wires[0]: f.kind})]
    m = np.asarray(f.matrix.detach().cpu(), dtype=complex)
    return [(c, {w: ch for w, ch in zip(f.wires, word) if ch != "I"})
            for c, word in pauli_decompose(m)]


def pauli_terms(obs) -> list[tuple[float, dict]]:
    """``[(real coeff, {wire: letter}), ...]`` of an observable (wires are circuit indices)."""
    coeffs = obs.real_coeffs().detach().cpu().tolist()
    out = []
    for c, term in zip(coeffs, obs.terms):
        for combo in itertools.product(*[_factor_paulis(f) for f in term]):
            coeff, word = float(c), {}
            for fc, fw in combo:
                coeff *= fc
                word.update(fw)
            out.append((coeff, word))
    return out


def to_sparse_pauli(obs, num_qubits: int):
    """``SparsePauliOp`` on ``num_qubits`` (qdiff wire i = Qiskit qubit i, little-endian labels)."""
    from qiskit.quantum_info import SparsePauliOp
    items = [("".join(w.values()), list(w.keys()), c) for c, w in pauli_terms(obs)]
    if not items:
        return SparsePauliOp.from_sparse_list([("", [], 0.0)], num_qubits=num_qubits)
    return SparsePauliOp.from_sparse_list(items, num_qubits=num_qubits).simplify(atol=0)


def square(op):
    """``op @ op`` simplified (for variances)."""
    return op.compose(op).simplify()


def measured_operators(circuit) -> list:
    """``[(measurement index, [SparsePauliOp, ...]), ...]`` the estimator must evaluate:
    ``[O]`` for expval, ``[O, O^2]`` for var (logical qubits, before any layout)."""
    n = circuit.num_wires
    out = []
    for i, m in enumerate(circuit.measurements):
        if m.kind == "expval":
            out.append((i, [to_sparse_pauli(m.obs, n)]))
        elif m.kind == "var":
            op = to_sparse_pauli(m.obs, n)
            out.append((i, [op, square(op)]))
    return out


def ops_outputs(ops: list, evs: np.ndarray) -> dict:
    """``{measurement index: (Bv,) values}`` from expectations ``(Bv, K)`` of the flattened
    ``ops`` lists (var = <O^2> - <O>^2, clipped at 0)."""
    res, k = {}, 0
    for i, group in ops:
        vals = np.asarray(evs[:, k:k + len(group)], dtype=float)
        k += len(group)
        res[i] = vals[:, 0] if len(group) == 1 else np.maximum(vals[:, 1] - vals[:, 0] ** 2, 0.0)
    return res


# -- expectation values and samples from measured bits ---------------------------------------


def qwc_bases(ops: list, num_qubits: int) -> tuple[list[str], dict]:
    """Group all Pauli strings of ``ops`` qubit-wise: ``(bases, {label: basis index})``.

    A basis is a string with one letter per qubit (index = qubit; ``Z`` where unmeasured)."""
    from qiskit.quantum_info import PauliList, SparsePauliOp
    labels = sorted({lbl for op in ops for lbl in op.paulis.to_labels()})
    labels = [lbl for lbl in labels if set(lbl) != {"I"}]
    if not labels:
        return [], {}
    groups = SparsePauliOp(PauliList(labels)).group_commuting(qubit_wise=True)
    bases, where = [], {}
    for g in groups:
        basis = ["Z"] * num_qubits
        for lbl in g.paulis.to_labels():
            where[lbl] = len(bases)
            for q, ch in enumerate(reversed(lbl)):
                if ch != "I":
                    basis[q] = ch
        bases.append("".join(basis))
    return bases, where


def append_basis_measurement(qc, basis: str):
    """Rotate each qubit into ``basis`` (X: H; Y: S^dag H) and measure qubit q into clbit q."""
    from qiskit import ClassicalRegister
    n = qc.num_qubits
    qc = qc.copy()
    creg = ClassicalRegister(n, "meas")
    qc.add_register(creg)
    for q, ch in enumerate(basis):
        if ch == "X":
            qc.h(q)
        elif ch == "Y":
            qc.sdg(q)
            qc.h(q)
    qc.measure(range(n), creg)
    return qc


def pauli_means(bits: np.ndarray, labels: list[str]) -> dict:
    """``{label: (B,) mean of the ±1 eigenvalue}`` from bits ``(B, shots, n)`` (clbit = qubit)."""
    out = {}
    for lbl in labels:
        qs = [q for q, ch in enumerate(reversed(lbl)) if ch != "I"]
        if not qs:
            out[lbl] = np.ones(bits.shape[0])
            continue
        parity = bits[..., qs].sum(-1) & 1
        out[lbl] = 1.0 - 2.0 * parity.mean(-1)
    return out


def estimate_from_bits(ops: list, bases: list, where: dict, bits_by_basis: list) -> np.ndarray:
    """``(B, K)`` expectations of the K ``ops`` from each basis' bits ``(B, shots, n)``."""
    cols = []
    for op in ops:
        total = 0.0
        for lbl, c in zip(op.paulis.to_labels(), op.coeffs):
            if set(lbl) == {"I"}:
                total = total + float(np.real(c))
                continue
            total = total + float(np.real(c)) * pauli_means(bits_by_basis[where[lbl]], [lbl])[lbl]
        b = bits_by_basis[0].shape[0] if bits_by_basis else 1
        cols.append(np.broadcast_to(np.asarray(total, dtype=float), (b,)))
    return np.stack(cols, axis=-1) if cols else np.zeros((0, 0))


def sample_basis(obs, num_qubits: int) -> str:
    """The measurement basis of ``sample(obs)``: its terms must be qubit-wise commuting Paulis."""
    letters: dict = {}
    for f in (f for t in obs.terms for f in t):
        if f.kind == "M":
            raise QdiffError("sample(op) on a Qiskit backend needs a Pauli observable; got a "
                             f"Hermitian matrix on wires {list(f.wires)}")
        if letters.setdefault(f.wires[0], f.kind) != f.kind:
            raise QdiffError(f"sample(op): the terms of {obs!r} do not commute qubit-wise")
    basis = [letters.get(q, "Z") for q in range(num_qubits)]
    return "".join(basis)


def samples_from_bits(obs, bits: np.ndarray) -> np.ndarray:
    """``(B, shots)`` eigenvalue samples of a qubit-wise commuting Pauli sum."""
    total = np.zeros(bits.shape[:2])
    for c, word in pauli_terms(obs):
        qs = list(word)
        parity = bits[..., qs].sum(-1) & 1 if qs else np.zeros(bits.shape[:2], dtype=np.int64)
        total = total + c * (1.0 - 2.0 * parity)
    return total


def probs_from_bits(bits: np.ndarray, wires) -> np.ndarray:
    """``(B, 2**k)`` frequencies of ``wires`` (first wire = most significant bit)."""
    k = len(wires)
    idx = np.zeros(bits.shape[:2], dtype=np.int64)
    for w in wires:
        idx = (idx << 1) | bits[..., w]
    out = np.zeros((bits.shape[0], 2 ** k))
    for b in range(bits.shape[0]):
        out[b] = np.bincount(idx[b], minlength=2 ** k) / bits.shape[1]
    return out


def bits_of(bitarray) -> np.ndarray:
    """A SamplerV2 ``BitArray`` ``(B,)`` as int64 bits ``(B, shots, n)``, bit q = clbit q."""
    return bitarray.to_bool_array(order="little").astype(np.int64)


class SamplingPlan:
    """Which measurement bases one execute() needs when every output comes from bits.

    ``ops`` (from :func:`measured_operators`, empty when an Estimator handles them) are grouped
    qubit-wise; ``probs``/``sample``/``counts`` add the computational basis or the basis of the
    sampled observable.
    """

    def __init__(self, circuit, ops: list):
        n = circuit.num_wires
        self.circuit, self.ops = circuit, ops
        self.flat = [op for _, g in ops for op in g]
        self.bases, self.where = qwc_bases(self.flat, n)
        self.extra: dict = {}
        for i, m in enumerate(circuit.measurements):
            if m.kind in ("probs", "sample", "counts"):
                basis = "Z" * n if m.obs is None else sample_basis(m.obs, n)
                if basis not in self.bases:
                    self.bases.append(basis)
                self.extra[i] = self.bases.index(basis)

    def outputs(self, bits_by_basis: list) -> dict:
        """``{measurement index: (Bv, ...) array}`` from each basis' bits ``(Bv, shots, n)``."""
        circuit, n, res = self.circuit, self.circuit.num_wires, {}
        if self.ops:
            res.update(ops_outputs(self.ops, estimate_from_bits(self.flat, self.bases,
                                                                self.where, bits_by_basis)))
        for i, bi in self.extra.items():
            m, bits = circuit.measurements[i], bits_by_basis[bi]
            wires = list(range(n)) if m.wires is None else list(m.wires)
            if m.kind == "probs":
                res[i] = probs_from_bits(bits, wires)
            elif m.obs is not None:
                res[i] = samples_from_bits(m.obs, bits)
            else:
                res[i] = bits[..., wires]
        return res


def check_measurements(circuit, backend_name: str, allow_state: bool = False):
    for m in circuit.measurements:
        if m.kind == "density_matrix":
            raise QdiffError(f"density_matrix() is not available on backend '{backend_name}' "
                             "(use the statevector device)")
        if m.kind == "state" and not allow_state:
            raise QdiffError(f"state() is not available on backend '{backend_name}' (use the "
                             "statevector device, or qd.device('aer', method='statevector') "
                             "without shots)")
