"""qdiff as Qiskit primitives: :class:`Estimator` (``BaseEstimatorV2``) and :class:`Sampler`
(``BaseSamplerV2``) on qdiff's statevector simulator.

A PUB's parameter-value array, of any broadcast shape, runs as ONE batched simulation; the
Estimator also stacks every PUB of a ``run`` that shares a circuit into that one simulation (a
parameter-shift gradient sends hundreds of one-binding PUBs), in row chunks when the rows do not
fit the memory budget at once. Circuits run through the ordinary
qnode path (:class:`~qdiff.circuit_qnode.CircuitQNode`), so every Qiskit parameter expression
is supported. Qubits no gate touches stay in |0> and are not simulated (a circuit transpiled
for a large device runs as the qubits it uses).

- ``Estimator``: exact expectation values (``stds`` 0) at precision 0; with a precision ``p > 0``
  each value's standard error is at most ``p``: every Pauli term is estimated from shots in
  its eigenbasis (``ceil(|c_i| S / p**2)`` for a term with coefficient ``c_i`` of an
  observable whose coefficients sum to ``S`` in absolute value; their count of +1 outcomes is
  drawn from its binomial distribution at the exact mean) and ``stds`` holds each estimate's
  standard error.
- ``Sampler``: ``shots`` samples of the classical bits at the end per binding, one
  ``BitArray`` per classical register (Qiskit's bit layout).

Dynamic circuits (mid-circuit measurements, resets, ``if_test`` / ``switch``, ``for_loop``) run
by deferred measurement (:mod:`qdiff.circuits.qiskit_dynamic`): one extra wire per measurement
that is not final, sampled with the qubits; the Estimator's values are those of the circuit's
qubits' mixed state.

>>> import numpy as np
>>> from qiskit import QuantumCircuit
>>> from qiskit.circuit import Parameter
>>> qc = QuantumCircuit(2); _ = qc.ry(Parameter("a"), 0); _ = qc.cx(0, 1)
>>> res = Estimator().run([(qc, ["ZZ", "ZI"], np.array([[0.0], [np.pi / 2]]))]).result()
>>> res[0].data.evs.round(12).tolist()
[1.0, 0.0]
>>> qc.measure_all()
>>> counts = Sampler(seed=1).run([(qc, [np.pi])], shots=100).result()[0].data.meas.get_counts()
>>> counts
{'11': 100}
"""
from __future__ import annotations

import dataclasses
import math
import threading
import warnings
from collections import OrderedDict

import numpy as np
import torch
from qiskit.primitives import BaseEstimatorV2, BaseSamplerV2, PrimitiveJob
from qiskit.primitives.containers import (BitArray, DataBin, PrimitiveResult, PubResult,
                                          SamplerPubResult)
from qiskit.primitives.containers.estimator_pub import EstimatorPub
from qiskit.primitives.containers.sampler_pub import SamplerPub

from qdiff.circuits import memory
from qdiff.circuits.measurements import sample_indices
from qdiff.circuit_qnode import CircuitQNode
from qdiff.circuits.circuit import Circuit
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.observables import Factor, Observable
from qdiff.circuits.qiskit_io import from_qiskit

_QNODE_CACHE_SIZE = 64


class _Runner:
    """Shared machinery: circuit imports (per run), qnodes (cached by structure), devices.

    An integer seed (or a sequence of them, a ``SeedSequence``) gives every job the same
    random stream, as Qiskit's ``StatevectorSampler`` / ``StatevectorEstimator`` (and its
    backend and Aer primitives with a simulator seed) do: a run repeats its samples. A
    ``np.random.Generator`` (or ``BitGenerator``) seed, and no seed, go on with their sequence,
    one stream per job. Qiskit's ``PrimitiveJob`` runs each job on a thread of its own, so
    several jobs submitted before their results are read run at once: a job's random stream is
    drawn when it is submitted (:meth:`job_rng`), in submission order, and the caches are
    shared under a lock."""

    def __init__(self, seed, who: str):
        if isinstance(seed, bool):
            seed = "a bool"  # numpy would take True as 1
        try:
            self._rng = np.random.default_rng(seed)
        except (TypeError, ValueError):
            raise QdiffError(f"{who}: seed must be None, a non-negative integer or a "
                             f"np.random.Generator; got {seed!r}") from None
        stateful = seed is None or isinstance(seed, (np.random.Generator,
                                                     np.random.BitGenerator))
        self._repeat_seed = None if stateful else seed
        self._qnodes: "OrderedDict" = OrderedDict()
        self._devices: dict = {}
        self._lock = threading.Lock()

    def __getstate__(self):
        """A copy or an unpickled primitive goes on with the seed's sequence where this one
        stands (an integer seed: the same stream for every job); its devices and qnodes are built
        anew on use (a lock does not pickle)."""
        return {"_rng": self._rng, "_repeat_seed": self._repeat_seed}

    def __setstate__(self, state):
        self._rng = state["_rng"]
        self._repeat_seed = state.get("_repeat_seed")
        self._qnodes = OrderedDict()
        self._devices = {}
        self._lock = threading.Lock()

    def job_rng(self) -> np.random.Generator:
        """The random stream of the job being submitted: for an integer seed the same one for
        every job (the first of the seed's sequence), else the next of the seed's sequence."""
        if self._repeat_seed is not None:
            return np.random.default_rng(
                int(np.random.default_rng(self._repeat_seed).integers(2 ** 62)))
        with self._lock:
            return np.random.default_rng(int(self._rng.integers(2 ** 62)))

    def _device(self, n: int, shots=None):
        key = (n, shots)
        with self._lock:
            if key not in self._devices:
                import qdiff  # the device registry sits above the engines, at the package front
                seed = None if shots is None else int(self._rng.integers(2 ** 62))
                self._devices[key] = qdiff.device("statevector", wires=n, shots=shots, seed=seed)
            return self._devices[key]

    def _qnode(self, imp, observables: list, obs_keys: tuple, shots=None) -> CircuitQNode:
        """A qnode for ``imp`` measuring ``observables`` (reused while the structure stays)."""
        key = (_structure_key(imp), obs_keys, shots)
        with self._lock:
            qn = self._qnodes.get(key)
            if qn is not None:
                self._qnodes.move_to_end(key)
                return qn
        qn = CircuitQNode(imp, self._device(imp.num_qubits, shots),
                          observables=observables or None)
        with self._lock:
            qn = self._qnodes.setdefault(key, qn)
            self._qnodes.move_to_end(key)
            if len(self._qnodes) > _QNODE_CACHE_SIZE:
                self._qnodes.popitem(last=False)
        return qn


def _generator(rng: np.random.Generator) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(int(rng.integers(2 ** 62)))
    return g


def _refuse_unknown(kwargs: dict, who: str, valid: tuple) -> None:
    """An unknown keyword (``options=`` of Aer's primitives, a misspelt ``shot=``) is a
    QdiffError naming it, not a TypeError."""
    if kwargs:
        raise QdiffError(f"{who}: unknown keyword(s) {sorted(kwargs)}; valid keywords: "
                         f"{list(valid)}")


def _structure_key(imp) -> tuple:
    c = imp.circuit
    ops = tuple((op.gate, op.wires, op.params) for op in c.operations)
    # an expression's text names parameters; the columns it reads depend on the circuit's
    # other parameters (``a*c`` reads columns (0, 2) of {a, b, c} but (0, 1) of {a, c, d})
    table = imp.expressions
    exprs = () if table is None else tuple(zip(map(str, table.expressions),
                                               table.dependencies))
    return (c.num_wires, imp.num_qubits, c.num_params, ops, exprs, tuple(imp.measurements))


def _import(qc, cache: dict, what: str):
    """``from_qiskit(qc)`` once per circuit object within a run."""
    imp = cache.get(id(qc))
    if imp is None:
        if qc.num_vars:
            raise QdiffError(f"{what}: classical variables are not supported")
        imp = cache[id(qc)] = (from_qiskit(qc), qc)
    return imp[0]


def _values(pub, qc) -> np.ndarray:
    """``(prod(shape), Np)`` float64 parameter values in ``qc.parameters`` order."""
    arr = np.asarray(pub.parameter_values.as_array(qc.parameters), dtype=np.float64)
    shape = pub.parameter_values.shape
    return arr.reshape(int(np.prod(shape, dtype=np.int64)), qc.num_parameters)


def _pauli_terms(sparse) -> list:
    """``[(Pauli word ((qubit, letter), ...), real coefficient)]`` of a SparseObservable."""
    out = []
    for letters, qubits, c in sparse.as_paulis().simplify().to_sparse_list():
        c = complex(c)
        if abs(c.imag) > 1e-12:
            raise QdiffError(f"Estimator: observable {sparse} is not Hermitian")
        out.append((tuple(sorted((int(q), ch) for ch, q in zip(letters, qubits))), c.real))
    return out


def _word_observable(word: tuple) -> Observable:
    return Observable([1.0], [tuple(Factor((q,), ch) for q, ch in word)])


def _check_real_values(pub, at: int, i: int) -> None:
    """Refuse parameter values (``pub[at]`` of a tuple PUB: an array or a dict of arrays) with
    an imaginary part: Qiskit's coercion would cut them to their real parts."""
    if not isinstance(pub, tuple) or len(pub) <= at or pub[at] is None:
        return
    values = pub[at]
    for v in (values.values() if isinstance(values, dict) else (values,)):
        try:
            a = np.asarray(v)
        except (TypeError, ValueError):
            continue  # Qiskit's coercion names it
        if a.dtype.kind == "c" and bool(np.any(a.imag != 0)):
            raise QdiffError(f"PUB {i}: parameter values must be real; got complex values "
                             f"{np.asarray(v).reshape(-1)[:4].tolist()}")


def _coerce(kind, pubs, default) -> list:
    """Qiskit's PUB coercion and validation, its errors as ``QdiffError`` s naming the PUB."""
    if isinstance(pubs, (str, bytes)) or not hasattr(pubs, "__iter__"):
        who = "Estimator" if kind is EstimatorPub else "Sampler"
        raise QdiffError(f"An invalid {who} pub-like was given: run() takes an iterable of "
                         f"PUBs; got {type(pubs).__name__} (wrap a single PUB in a list: "
                         "run([(circuit, ...)]))")
    out = []
    for i, pub in enumerate(pubs):
        _check_real_values(pub, 2 if kind is EstimatorPub else 1, i)
        try:
            out.append(kind.coerce(pub, default))
        except (ValueError, TypeError, IndexError) as exc:
            if isinstance(exc, QdiffError):
                raise
            raise QdiffError(f"PUB {i}: {exc}") from None
    return out


class Estimator(BaseEstimatorV2):
    """``BaseEstimatorV2`` on qdiff's statevector simulator.

    Args:
        default_precision: precision of PUBs that give none (0: exact).
        seed: seed of the shot sampling at precision > 0: an integer seed gives every
            run the same estimates; a ``np.random.Generator`` goes on with its sequence.
    """

    def __init__(self, *, default_precision: float = 0.0, seed=None, **unknown):
        _refuse_unknown(unknown, "Estimator", ("default_precision", "seed"))
        _check_precision(default_precision, "default_precision")
        self._default_precision = float(default_precision)
        self._seed = seed
        self._runner = _Runner(seed, "Estimator")

    @property
    def default_precision(self) -> float:
        return self._default_precision

    @property
    def seed(self):
        return self._seed

    def run(self, pubs, *, precision=None, **unknown) -> PrimitiveJob:
        _refuse_unknown(unknown, "Estimator.run", ("precision",))
        if precision is None:
            precision = self._default_precision
        _check_precision(precision, "precision")
        coerced = _coerce(EstimatorPub, pubs, precision)
        for p in coerced:
            _check_precision(p.precision, "precision")
        job = PrimitiveJob(self._run, coerced, self._runner.job_rng())
        job._submit()
        return job

    def _run(self, pubs: list, rng: np.random.Generator) -> PrimitiveResult:
        groups: "OrderedDict" = OrderedDict()
        for i, pub in enumerate(pubs):
            groups.setdefault((id(pub.circuit), pub.precision), []).append(i)
        results = [None] * len(pubs)
        imports: dict = {}
        for (_, precision), members in groups.items():
            for i, (evs, stds, shots) in zip(members, self._run_group(
                    [pubs[i] for i in members], precision, imports, rng)):
                pub = pubs[i]
                results[i] = PubResult(
                    DataBin(evs=evs, stds=stds, shape=evs.shape),
                    metadata={"target_precision": precision, "circuit_metadata":
                              pub.circuit.metadata, **({"shots": shots}
                                                       if precision > 0 else {})})
        return PrimitiveResult(results, metadata={"version": 2})

    def _run_group(self, pubs: list, precision: float, imports: dict, rng) -> list:
        """One simulation for every PUB of one circuit: ``[(evs, stds)]`` per PUB."""
        qc = pubs[0].circuit
        imp = _import(qc, imports, "Estimator")
        nq = imp.num_qubits
        if any(q < nq for q, _ in imp.measurements):  # deferred ones are on extra wires
            raise QdiffError("Estimator: the circuit has measurements that are final (no "
                             "operation or condition follows them); estimate observables of "
                             "a circuit without them (circuit.remove_final_measurements())")
        words: "OrderedDict" = OrderedDict()   # Pauli word -> output column
        rows, plans, start = [], [], 0
        for pub in pubs:
            vals = _values(pub, qc)
            rows.append(vals)
            obs = pub.observables.sparse_observables_array()
            terms = [[(words.setdefault(w, len(words)), c) for w, c in _pauli_terms(o)]
                     for o in obs.reshape(-1)]
            plans.append((start, pub.parameter_values.shape, obs.shape, terms))
            start += len(vals)
        values = np.concatenate(rows) if rows else np.zeros((0, qc.num_parameters))
        busy = _busy_wires(imp)
        # a Z on a qubit no gate touches (still in |0>) is 1, sampled or not: left out
        words = [tuple((q, ch) for q, ch in w if q in busy or ch != "Z") for w in words]
        shots = _word_shots(words, [t for plan in plans for t in plan[3]], precision) \
            if precision > 0 else None
        means = self._term_means(imp, busy, values, words, shots, rng)
        return [_combine(means, plan, shots) for plan in plans]

    def _term_means(self, imp, busy: set, values: np.ndarray, words: list, shots,
                    rng) -> np.ndarray:
        """``(R, W)`` expectation values of every Pauli word (idle Z factors already left out;
        the empty word is the identity): exact, or from ``shots[w]`` shots of word ``w``."""
        imp, pos = _compact(imp, busy | {q for w in words for q, _ in w})
        words = [tuple((pos[q], ch) for q, ch in w) for w in words]
        live = [w for w in words if w]  # the identity word is 1 exactly
        out = np.ones((values.shape[0], len(words)))
        if live:
            qn = self._runner._qnode(imp, [_word_observable(w) for w in live], tuple(live))
            vals = _run_rows(qn, values, imp.circuit.num_wires).reshape(len(values), len(live))
            cols = [i for i, w in enumerate(words) if w]
            if shots is not None:
                # a Pauli word's shots in its eigenbasis read +1 with probability (1 + <P>) / 2,
                # independently: their count of +1 is binomial, drawn from the exact mean
                p = ((1.0 + vals) / 2).clamp(0.0, 1.0)
                n = torch.as_tensor(shots[cols], dtype=torch.float64).expand_as(p)
                ups = torch.binomial(n.contiguous(), p, generator=_generator(rng))
                vals = 2.0 * ups / n - 1.0
            out[:, cols] = vals.numpy()
        return out


ROW_STATES = 8.0  # states of one binding row the engine may hold at once (it checks for 4)


def _run_rows(qn, values: np.ndarray, num_wires: int) -> torch.Tensor:
    """``qn`` on the rows of ``values`` ``(R, P)`` (no gradient): one batched simulation when
    the rows fit the memory budget, else row chunks that each fit it. A run stacks every PUB
    of a circuit (a parameter-shift gradient of a data batch: thousands of rows), and Qiskit's
    primitives take any number of bindings."""
    x = torch.as_tensor(values, dtype=torch.float64)
    per_row = ROW_STATES * 16.0 * 2.0 ** num_wires
    step = max(1, int(memory.budget() // per_row))
    with torch.no_grad():
        if step >= len(x):
            return qn(x)
        return torch.cat([qn(x[i:i + step]) for i in range(0, len(x), step)])


def _busy_wires(imp) -> set:
    """The qubits some operation acts on (the others stay in |0>)."""
    return {w for op in imp.circuit.operations for w in op.wires}


def _compact(imp, keep: set) -> tuple:
    """``(import on the qubits keep only, renumbered in order; {old qubit: new})``: a circuit
    transpiled for a large device simulates the qubits it uses, as Aer's primitives do."""
    c = imp.circuit
    if len(keep) == c.num_wires:
        return imp, {w: w for w in range(c.num_wires)}
    pos = {w: i for i, w in enumerate(sorted(keep))}
    ops = tuple(dataclasses.replace(op, wires=tuple(pos[w] for w in op.wires))
                for op in c.operations)
    circ = Circuit(len(pos), ops, (), c.num_params)
    meas = [(pos[q], b) for q, b in imp.measurements if q in pos]
    return dataclasses.replace(imp, circuit=circ, measurements=meas), pos


MAX_WORD_SHOTS = 2.0 ** 53  # shots of one Pauli word (counts stay exact float64 integers)


def _word_shots(words: list, observables: list, precision: float) -> np.ndarray:
    """Shots of each Pauli word so that every observable's estimate has a standard error of at
    most ``precision``: an observable ``sum_i c_i P_i`` over the sampled words (not the
    identity) gives word ``i`` ``ceil(|c_i| S / p**2)`` shots, ``S = sum_i |c_i|`` (the
    allocation of the fewest shots in all for that bound: the variance ``sum_i c_i**2
    (1 - <P_i>**2) / N_i`` is at most ``p**2``), and a word shared by observables takes the
    most any of them asks (at most ``MAX_WORD_SHOTS``). A single term with coefficient 1
    takes ``ceil(1 / p**2)``; a word read with coefficient 0 only, one."""
    need = np.array([1.0 if w else 0.0 for w in words])
    for terms in observables:
        live = [(col, abs(c)) for col, c in terms if words[col] and c != 0]
        total = math.fsum(c for _, c in live)
        for col, c in live:
            need[col] = max(need[col], math.ceil(min(c * total / precision ** 2,
                                                     MAX_WORD_SHOTS)))
    return need


def _pub_shots(plan: tuple, shots: np.ndarray) -> int:
    """Shots behind each of a PUB's estimates: those of every sampled word it reads."""
    cols = {col for terms in plan[3] for col, _ in terms if shots[col] > 0}
    return int(sum(shots[col] for col in cols))


def _check_precision(precision, what: str) -> None:
    """0 (exact) or a finite positive precision (not a bool) whose ``1/p**2`` is finite."""
    ok = isinstance(precision, (int, float, np.integer, np.floating)) and \
        not isinstance(precision, (bool, np.bool_)) and \
        0 <= precision < math.inf and (precision == 0 or 0 < precision ** 2 < math.inf and
                                       1.0 / precision ** 2 < math.inf)
    if not ok:
        raise QdiffError(f"{what} must be 0 (exact) or a finite positive number whose "
                         f"ceil(1/{what}**2) shots are finite; got {precision!r}")


def _combine(means: np.ndarray, plan: tuple, shots) -> tuple:
    """``(evs, stds, shots)`` of one PUB from the term means of its rows (``shots``: per word,
    0 for an exact one; None: exact)."""
    start, pshape, oshape, terms = plan
    total = _pub_shots(plan, shots) if shots is not None else None
    if not pshape and not oshape:  # one binding, one observable (a gradient's shifted PUB)
        ev = sum(c * means[start, col] for col, c in terms[0])
        var = sum(c * c * max(1.0 - means[start, col] ** 2, 0.0) / shots[col]
                  for col, c in terms[0] if shots is not None and shots[col] > 0)
        return np.array(ev, dtype=np.float64), np.array(math.sqrt(var)), total
    shape = np.broadcast_shapes(pshape, oshape)
    prow = np.broadcast_to(np.arange(int(np.prod(pshape, dtype=np.int64))).reshape(pshape), shape)
    oidx = np.broadcast_to(np.arange(len(terms)).reshape(oshape), shape)
    evs = np.zeros(shape)
    var = np.zeros(shape)
    for k, obs_terms in enumerate(terms):
        mask = oidx == k
        r = start + prow[mask]
        for col, c in obs_terms:
            m = means[r, col]
            evs[mask] += c * m
            if shots is not None and shots[col] > 0:
                var[mask] += c * c * np.clip(1.0 - m * m, 0.0, None) / shots[col]
    return evs, np.sqrt(var), total


class Sampler(BaseSamplerV2):
    """``BaseSamplerV2`` on qdiff's statevector simulator: the exact distribution of the final
    measurements per binding, sampled ``shots`` times.

    Args:
        default_shots: shots of PUBs that give none.
        seed: seed of the sampling: an integer seed gives every run the same samples;
            a ``np.random.Generator`` goes on with its sequence.
    """

    def __init__(self, *, default_shots: int = 1024, seed=None, **unknown):
        _refuse_unknown(unknown, "Sampler", ("default_shots", "seed"))
        if isinstance(default_shots, bool) or not (isinstance(default_shots, (int, np.integer))
                                                   and default_shots >= 1):
            raise QdiffError(f"default_shots must be a positive integer; got {default_shots!r}")
        self._default_shots = int(default_shots)
        self._seed = seed
        self._runner = _Runner(seed, "Sampler")

    @property
    def default_shots(self) -> int:
        return self._default_shots

    @property
    def seed(self):
        return self._seed

    def run(self, pubs, *, shots=None, **unknown) -> PrimitiveJob:
        _refuse_unknown(unknown, "Sampler.run", ("shots",))
        if shots is None:
            shots = self._default_shots
        coerced = _coerce(SamplerPub, pubs, shots)
        for i, p in enumerate(coerced):
            _check_register_names(p.circuit, i)
            if not p.circuit.cregs:
                warnings.warn(f"Sampler: the circuit of PUB {i} has no classical registers, so "
                              "its result is empty; measure into one (circuit.measure_all())",
                              stacklevel=2)
        job = PrimitiveJob(self._run, coerced, self._runner.job_rng())
        job._submit()
        return job

    def _run(self, pubs: list, rng: np.random.Generator) -> PrimitiveResult:
        imports: dict = {}
        return PrimitiveResult([self._run_pub(p, imports, rng) for p in pubs],
                               metadata={"version": 2})

    def _run_pub(self, pub, imports: dict, rng) -> SamplerPubResult:
        qc = pub.circuit
        imp = _import(qc, imports, "Sampler")
        values = _values(pub, qc)
        owner = {}  # clbit -> qubit of its last final measurement
        for q, c in imp.measurements:
            owner[c] = q
        wires = sorted(set(owner.values()))
        bits = self._sample(imp, values, wires, pub.shots, rng)  # (R, shots, len(wires))
        pos = {q: i for i, q in enumerate(wires)}
        data = {}
        for creg in qc.cregs:
            clbits = [qc.find_bit(b).index for b in creg]
            reg = np.zeros(bits.shape[:2] + (len(clbits),), dtype=np.uint8)
            for j, c in enumerate(clbits):
                if c in owner:
                    reg[..., j] = bits[..., pos[owner[c]]]
            nbytes = -(-len(clbits) // 8)
            data[creg.name] = BitArray(_pack(reg).reshape(pub.shape + (pub.shots, nbytes)),
                                       len(clbits))
        return SamplerPubResult(DataBin(**data, shape=pub.shape),
                                metadata={"shots": pub.shots,
                                          "circuit_metadata": qc.metadata})

    def _sample(self, imp, values: np.ndarray, wires: list, shots: int, rng) -> np.ndarray:
        """``(R, shots, k)`` uint8 bits of ``wires`` (in that order) per binding row."""
        r, k = values.shape[0], len(wires)
        # a shot's bytes: its index (8), one shifted bit at a time (16), its bits (k), and a
        # register's bits and their padded copy (2 (clbits + 8)) as it is packed
        words = 3 + (k + 2 * (imp.num_clbits + 8) + 7) // 8
        busy = _busy_wires(imp)
        live = [j for j, w in enumerate(wires) if w in busy]  # a qubit no gate touches reads 0
        if not live:
            memory.require(8.0 * r * shots * words, f"sampling {shots} shots of {r} binding(s)")
            return np.zeros((r, shots, k), dtype=np.uint8)
        imp, pos = _compact(imp, busy)
        measured = tuple(pos[wires[j]] for j in live)
        from qdiff.circuits.measurements import Measurement
        circ = imp.circuit.with_measurements((Measurement("probs", None, measured),))
        src = type(imp)(circ, imp.parameters, [], 0, imp.global_phase, imp.expressions)
        qn = self._runner._qnode(src, [], ("probs", measured))
        p = _run_rows(qn, values, circ.num_wires).reshape(r, 2 ** len(live))
        idx = sample_indices(p, shots, _generator(rng), words=words).numpy()
        bits = np.zeros(idx.shape + (k,), dtype=np.uint8)
        for i, j in enumerate(live):
            bits[..., j] = (idx >> (len(live) - 1 - i)) & 1
        return bits


def _check_register_names(qc, i: int) -> None:
    """A classical register's name is a field of the result's ``DataBin``: a name the DataBin
    keeps for itself (``shape``, ``keys``, ``values``, ...) is refused, naming the register."""
    reserved = getattr(DataBin, "_RESTRICTED_NAMES", frozenset())
    bad = [r.name for r in qc.cregs if r.name in reserved or hasattr(DataBin, r.name)]
    if bad:
        raise QdiffError(f"Sampler: PUB {i}: classical register name(s) {bad} cannot be fields "
                         "of the result's DataBin (its own attributes); rename the register(s)")


def _pack(reg: np.ndarray) -> np.ndarray:
    """Bits ``(..., nbits)`` (bit j = clbit j of the register) -> Qiskit's packed big-endian
    bytes ``(..., ceil(nbits / 8))``."""
    nbits = reg.shape[-1]
    big = reg[..., ::-1]
    pad = -nbits % 8
    if pad:
        big = np.concatenate([np.zeros(reg.shape[:-1] + (pad,), dtype=np.uint8), big], axis=-1)
    return np.packbits(big, axis=-1)
