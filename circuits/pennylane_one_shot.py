"""Mid-circuit measurements measured, not deferred: PennyLane's ``mcm_method="one-shot"``.

PennyLane's ``dynamic_one_shot`` transform hands the device one tape whose shots are ``S``
single shots; each shot measures every mid-circuit measurement (collapsing the state, resetting
the wire where asked) and acts on the outcomes, and the device returns per shot the final
measurements and the outcomes. ``default.qubit`` simulates the ``S`` shots one after another.

Here the shots are simulated together, grouped by their history: shots that drew the same
outcomes so far are in the same state, so the simulation holds one state per distinct history
(a *branch*), at most ``min(S, 2**k)`` states after ``k`` measurements, and every branch runs
as one row of ONE batched engine call per run of gates. At a measurement each branch's shots
draw their outcomes from its probability of 1 (the device's generator); a branch whose shots
drew both outcomes splits in two. A conditional operation runs on the branches whose outcomes
make its condition true. At the end each branch's shots are sampled together by PennyLane's
own sampler (``measure_with_samples``): the raw samples of wires or of an observable measured
in one basis, read shot by shot; any other measurement one single-shot bin per shot. The
per-shot results are ``default.qubit``'s, in shot order, each shot's outcomes beside its own
final samples.

The state model (pure states or density matrices, run by the device's engine) comes from the
device as a :class:`Model`; this module holds no engine.
"""
from __future__ import annotations

import abc
import functools

import numpy as np


class Model(abc.ABC):
    """What the driver needs from a device's engine. ``states`` is a torch batch of states,
    one row per branch. A subclass gives :meth:`evolve`, :meth:`weights` and :meth:`collapse`,
    and sets ``labels`` (the device's wire labels in engine order), ``n`` (wires),
    ``wire_map`` (wire label -> engine wire, None when the labels are ``0..n-1``), ``rng``
    (the device's generator), ``row_shape`` (one state as PennyLane's functions read it),
    ``pennylane`` (the module of those functions: ``"qubit"`` for state vectors,
    ``"qubit_mixed"`` for density matrices) and ``rounding``."""

    row_bytes: float  # bytes of one state
    labels: tuple
    n: int
    wire_map = None
    rng = None
    row_shape: tuple = ()
    pennylane = "qubit"
    rounding: float = 0.0  # a probability rounding alone can give an impossible outcome

    @abc.abstractmethod
    def evolve(self, states, ops):
        """``states`` after the PennyLane operations ``ops``; ``states=None``: from the device's
        start state, one row."""

    @abc.abstractmethod
    def weights(self, states):
        """Per row, the probability of each basis state (a real ``(B, 2**n)`` tensor)."""

    def outcome_probs(self, states, wire: int) -> np.ndarray:
        """Per row, the probabilities of measuring 0 and of measuring 1 on engine wire
        ``wire`` (``(B, 2)`` float64), each summed from its own basis states (``1 - p1`` would
        round a small probability of 0 away)."""
        import torch
        w = self.weights(states).to(torch.float64)
        p = w.reshape(w.shape[0], 2 ** wire, 2, -1).sum((1, 3))
        return (p / w.sum(1, keepdim=True)).cpu().numpy()

    def prob_one(self, states, wire: int) -> np.ndarray:
        """Per row, the probability of measuring 1 on engine wire ``wire``."""
        return self.outcome_probs(states, wire)[:, 1]

    @abc.abstractmethod
    def collapse(self, states, wire: int, outcomes: np.ndarray, reset: bool):
        """Per row, the normalised state after measuring ``outcomes[row]`` on ``wire`` (then
        on |0> where ``reset``)."""

    def select(self, states, rows):
        """The rows ``rows`` (a list of indices) of ``states``."""
        import torch
        return states[torch.as_tensor(rows, device=states.device)]

    def assign(self, states, rows, values):
        """``states`` with the rows ``rows`` replaced by ``values`` (a new tensor)."""
        import torch
        return states.index_copy(0, torch.as_tensor(rows, device=states.device), values)

    def _mapped(self, mps) -> list:
        from qdiff.circuits.pennylane_transforms import map_measurement_wires
        if self.wire_map is None:
            return list(mps)
        return [map_measurement_wires(m, self.wire_map) for m in mps]

    def _functions(self, name: str):
        import importlib
        return importlib.import_module(f"pennylane.devices.{self.pennylane}.{name}")

    def sample(self, states, row: int, mps, shots):
        """PennyLane's results of the measurements ``mps`` sampled from row ``row`` with the
        ``Shots`` ``shots``."""
        from qdiff.circuits import memory
        from qdiff.circuits.pennylane_transforms import sampled_measurements
        total = shots.total_shots
        memory.require(float(total) * (16.0 + 8 * self.n),
                       f"sampling {total} shots on {self.n} wires")
        state = states[row].detach().cpu().numpy().reshape(self.row_shape)
        return self._functions("sampling").measure_with_samples(
            self._mapped(sampled_measurements(mps)), state, shots, rng=self.rng)

    def measure(self, states, mps):
        """PennyLane's exact results of ``mps`` for every row (a leading batch axis)."""
        import pennylane as qml
        rows = states.detach().cpu().numpy().reshape((states.shape[0],) + self.row_shape)
        got = self._functions("simulate").measure_final_state(
            qml.tape.QuantumScript([], self._mapped(mps)), rows, True)
        return (got,) if len(mps) == 1 else got

    def measure_one(self, states, row: int, mp):
        """PennyLane's exact result of the measurement ``mp`` of row ``row`` (a snapshot's)."""
        (mp,) = self._mapped([mp])
        state = states[row].detach().cpu().numpy().reshape(self.row_shape)
        return self._functions("measure").measure(mp, state)


METHODS = ("deferred", "one-shot", "tree-traversal")


def mcm_config(mcm, name: str):
    """The device's ``MCMConfig`` for the one asked: ``"deferred"`` (also when none is
    named), ``"one-shot"`` or ``"tree-traversal"`` (also for ``"device"``, as on
    ``default.qubit``); another method, or ``postselect_mode="fill-shots"``, is refused by
    name (a ``DeviceError``)."""
    from dataclasses import replace
    from pennylane.exceptions import DeviceError
    method = getattr(mcm.mcm_method, "value", mcm.mcm_method)  # PennyLane's enum
    method = "tree-traversal" if method == "device" else method
    if method not in (None,) + METHODS:
        raise DeviceError(f"mcm_method={method!r} is not supported with {name}; use "
                          "mcm_method='deferred', 'one-shot' or 'tree-traversal'")
    if mcm.postselect_mode == "fill-shots":
        raise DeviceError(f"postselect_mode='fill-shots' is not supported with {name}")
    return replace(mcm, mcm_method=method or "deferred")


def traversed(config) -> bool:
    """Whether ``config`` asks for the outcome tree (``"tree-traversal"``/``"device"``), whose
    branch weights only PennyLane's gradient transforms differentiate."""
    method = getattr(config.mcm_config.mcm_method, "value", config.mcm_config.mcm_method)
    return method in ("tree-traversal", "device")


def stopping_condition(device_stops):
    """The decomposition's stopping condition with measured mid-circuit measurements: the
    device's operations, mid-circuit measurements, and a conditional operation (also one
    nested in conditions, as a ``qml.cond`` inside a conditioned function makes) whose
    operation the device runs (another is decomposed: PennyLane conditions each piece)."""
    from pennylane.ops import MidMeasure

    def stops(op) -> bool:
        if isinstance(op, MidMeasure):
            return True
        return device_stops(conditioned(op)[1])
    return stops


def conditioned(op) -> tuple:
    """``(conditions, operation)``: the measurement values every one of which ``op``'s
    operation needs true (none for an operation that is not conditional; one per ``qml.cond``
    it is nested in), and that operation."""
    from pennylane.ops import Conditional
    conditions = []
    while isinstance(op, Conditional):
        conditions.append(op.meas_val)
        op = op.base
    return conditions, op


def has_mid_measure(tape) -> bool:
    from pennylane.ops import MidMeasure
    return any(isinstance(op, MidMeasure) for op in tape.operations)


def segments(ops) -> list:
    """``[("gates", [ops]) | ("measure", op) | ("cond", op) | ("snapshot", op)]`` in circuit
    order."""
    from pennylane.ops import Conditional, MidMeasure, Snapshot
    out, run = [], []
    for op in ops:
        kind = "measure" if isinstance(op, MidMeasure) else \
            "cond" if isinstance(op, Conditional) else \
            "snapshot" if isinstance(op, Snapshot) else None
        if kind is None:
            run.append(op)
            continue
        if run:
            out.append(("gates", run))
            run = []
        out.append((kind, op))
    if run:
        out.append(("gates", run))
    return out


def execute(tape, model: Model, wire_index, rng, budget: float, snapshots=None) -> tuple:
    """Per shot of ``tape`` (a ``dynamic_one_shot`` tape: ``S`` single shots, its last ``k``
    measurements the samples of its ``k`` mid-circuit measurements), ``default.qubit``'s result
    of one shot. ``wire_index(label)``: the engine wire of a wire label; ``budget``: bytes the
    branch states may take (the shots are run in groups that fit it). The tape's ``Snapshot``
    operations are taken in each shot, as ``default.qubit`` takes them, and passed to
    ``snapshots(tag, value)`` shot by shot in circuit order (``qml.snapshots``' bookkeeping;
    ``None``: not taken)."""
    from pennylane.ops import MidMeasure
    from pennylane.exceptions import DeviceError
    ops = tape.operations
    mcms = [op for op in ops if isinstance(op, MidMeasure)]
    final = list(tape.measurements[:len(tape.measurements) - len(mcms)])
    total = tape.shots.total_shots
    group = int(budget // (3.0 * model.row_bytes))
    if group < 1:
        raise DeviceError(
            f"one-shot execution: a state of {model.row_bytes / 2 ** 30:.3g} GiB does not fit "
            f"the memory available ({budget / 2 ** 30:.3g} GiB for the branch states)")
    parts = segments(ops)
    lead = 0  # the gates before the first measurement run once, for every shot
    start = None
    if parts and parts[0][0] == "gates":
        start = model.evolve(None, parts[0][1])
        lead = 1
    elif parts:
        start = model.evolve(None, [])
    out: list = [None] * total
    single = len(tape.measurements) == 1
    # the snapshots by position (equal snapshots are distinct operations)
    parts = parts[lead:]
    taken = [i for i, (kind, _) in enumerate(parts) if kind == "snapshot"] \
        if snapshots else []
    for first in range(0, total, group):
        shots = min(group, total - first)
        snaps = {i: [None] * shots for i in taken}
        _run_group(parts, start, shots, first, model, wire_index, rng, final, mcms,
                   single, out, snaps)
        for j in range(shots):
            for i in taken:
                snapshots(parts[i][1].tag, snaps[i][j])
    return tuple(out)


def _snapshot(model, states, branches, op, first, values) -> None:
    """Each shot's value of the snapshot ``op`` (into ``values``, by shot index from
    ``first``): its measurement of the shot's state, exact for a state or where its shots are
    None, else sampled with its shots (one per shot of the circuit by default)."""
    from pennylane.measurements import Shots, StateMP
    mp, shots = op.hyperparameters["measurement"], op.hyperparameters["shots"]
    shots = 1 if shots == "workflow" else shots
    for i, (_, idx) in enumerate(branches):
        if isinstance(mp, StateMP) or not shots:
            got = [model.measure_one(states, i, mp)] * len(idx)
        else:
            got = [model.sample(states, i, [mp], Shots(shots))[0] for _ in idx]
        for s, value in zip(idx, got):
            values[s - first] = value


def _run_group(parts, start, shots, first, model, wire_index, rng, final, mcms, single,
               out, snaps) -> None:
    """The shots ``first, ..., first + shots - 1`` through ``parts`` from ``start``: their
    results into ``out``, the values of the snapshots at the positions ``snaps`` holds into
    ``snaps``."""
    from pennylane.measurements import Shots
    states = start
    # branch i: (outcomes so far {mcm: 0/1}, the shot indices in it)
    branches = [({}, np.arange(first, first + shots))]
    for at, (kind, item) in enumerate(parts):
        if kind == "gates":
            states = model.evolve(states, item)
        elif kind == "snapshot":
            if at in snaps:
                _snapshot(model, states, branches, item, first, snaps[at])
        elif kind == "cond":
            conditions, base = conditioned(item)
            rows = [i for i, (values, _) in enumerate(branches)
                    if all(c.concretize(values) for c in conditions)]
            if rows:
                states = model.assign(states, rows,
                                      model.evolve(model.select(states, rows), [base]))
        else:
            wire = wire_index(item.wires[0])
            p1 = model.prob_one(states, wire)
            src, outcomes, grown = [], [], []
            for i, (values, idx) in enumerate(branches):
                ones = rng.random(len(idx)) < p1[i]
                for outcome, members in ((0, idx[~ones]), (1, idx[ones])):
                    if len(members):
                        src.append(i)
                        outcomes.append(outcome)
                        grown.append(({**values, item: outcome}, members))
            states = model.collapse(model.select(states, src), wire,
                                    np.asarray(outcomes, dtype=np.int64), item.reset)
            branches = grown
    raw = _raw_samples(final)
    for i, (values, idx) in enumerate(branches):
        tail = tuple(int(values[m]) for m in mcms)
        if not final:
            per_shot = [()] * len(idx)
        elif raw is not None:  # drawn at once, then read shot by shot
            got = model.sample(states, i, raw, Shots(len(idx)))
            per_shot = _split_shots(final, got, len(idx))
        else:
            got = model.sample(states, i, final, Shots([(1, len(idx))]))
            per_shot = got if len(idx) > 1 else (got,)
        for s, res in zip(idx, per_shot):
            res = tuple(res) + tail
            out[s] = res[0] if single else res



def _raw_samples(final):
    """The raw samples behind the single-shot results of ``final``: ``sample(wires)`` for a
    measurement of wires (``probs``, ``counts``, ``sample``), ``sample(obs)`` for one of an
    observable PennyLane samples in one basis (``expval``, ``sample``), grouped by PennyLane as
    the measurements themselves; None when some measurement is of another kind (those are
    sampled one single-shot bin at a time)."""
    from pennylane.measurements import CountsMP, ExpectationMP, ProbabilityMP, SampleMP
    from pennylane.ops import LinearCombination, Sum
    out = []
    for mp in final:
        kind = type(mp)
        if mp.mv is not None:
            return None
        if mp.obs is None:
            if kind not in (SampleMP, ProbabilityMP, CountsMP) or not len(mp.wires):
                return None
            out.append(SampleMP(wires=mp.wires))
        elif kind in (ExpectationMP, SampleMP) and not isinstance(mp.obs,
                                                                  (Sum, LinearCombination)):
            out.append(SampleMP(obs=mp.obs))
        else:
            return None
    return out


def _split_shots(final, got, shots: int) -> list:
    """Per shot, the results of ``final`` read off their raw samples ``got`` (in the formats
    of PennyLane's single-shot results)."""
    from pennylane.measurements import CountsMP, ExpectationMP, ProbabilityMP
    columns = []
    for mp, samples in zip(final, got):
        kind = type(mp)
        if mp.obs is not None:
            values = np.asarray(samples).reshape(shots)
            columns.append([np.float64(v) for v in values] if kind is ExpectationMP else
                           [values[j:j + 1] for j in range(shots)])
            continue
        k = len(mp.wires)
        bits = np.asarray(samples).reshape(shots, k)
        if kind is ProbabilityMP:
            index = bits @ (1 << np.arange(k - 1, -1, -1))
            onehot = np.zeros((shots, 2 ** k))
            onehot[np.arange(shots), index] = 1.0
            columns.append(list(onehot))
        elif kind is CountsMP:
            keys = ["".join(map(str, row)) for row in bits.tolist()]
            if mp.all_outcomes:
                names = [format(i, f"0{k}b") for i in range(2 ** k)]
                columns.append([{name: np.int64(name == key) for name in names}
                                for key in keys])
            else:
                columns.append([{np.str_(key): np.int64(1)} for key in keys])
        else:
            columns.append([bits[j:j + 1] for j in range(shots)])
    return list(zip(*columns))


def measured_transforms(program, method: str, postselect_mode) -> None:
    """Add to ``program`` what runs after the device's own validation when mid-circuit
    measurements are measured: ``"one-shot"``, PennyLane's ``dynamic_one_shot``;
    ``"tree-traversal"``, one tape per broadcast row, and with shots the tree sampled as one
    shot grouping (``dynamic_one_shot`` of each sampled tape; exact tapes are traversed by the
    device)."""
    from pennylane.transforms import dynamic_one_shot
    if method == "one-shot":
        program.add_transform(dynamic_one_shot, postselect_mode=postselect_mode)
    elif method == "tree-traversal":
        program.add_transform(_sampled_tree(), postselect_mode=postselect_mode)


@functools.lru_cache(maxsize=None)
def _sampled_tree():
    import pennylane as qml
    from pennylane.transforms import dynamic_one_shot

    @qml.transform
    def transform(tape, postselect_mode=None):
        if not has_mid_measure(tape):
            return (tape,), lambda results: results[0]
        rows, join = qml.transforms.broadcast_expand(tape) if tape.batch_size is not None \
            else ((tape,), lambda results: results[0])
        if not tape.shots:
            return rows, join
        made = [dynamic_one_shot(r, postselect_mode=postselect_mode) for r in rows]
        tapes = [t for ts, _ in made for t in ts]
        sizes = [len(ts) for ts, _ in made]

        def fn(results):
            out, at = [], 0
            for (_, post), k in zip(made, sizes):
                out.append(post(results[at:at + k]))
                at += k
            return join(out)
        return tapes, fn
    return transform
