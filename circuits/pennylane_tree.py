"""Exact results of circuits with mid-circuit measurements by traversing their outcome tree:
PennyLane's ``mcm_method="tree-traversal"`` without shots.

Every branch of outcomes is simulated with its weight (the probability of its outcomes): at a
measurement each branch splits into its possible outcomes, each collapsed and renormalised
(reset where asked), a postselected measurement keeping its outcome only. An outcome is
possible when its probability, summed from the state's own amplitudes, is at least the model's
``rounding`` (what rounding alone makes nonzero: ``1e4 * eps**2`` for a state vector,
``100 * eps`` for a density matrix, of the states' precision); one below it is not followed. A
conditional operation runs on the branches whose outcomes make its condition true. The branches
of one level run as rows of ONE batched engine call per stretch of gates; where the rows of the
next level would not fit the memory budget, the branches are traversed in halves, one after the
other (depth first; a single branch one outcome after the other), the states still to traverse
counted against the budget, so the memory stays within it. No wires are added, unlike deferred
measurement; the time grows with the number of branches (up to ``2**k`` for ``k``
measurements).

At the leaves the final measurements are exact per branch (PennyLane's own measurement
functions on the batch of branch states) and combined with the weights: ``expval`` and
``probs`` as weighted means, ``var`` from the weighted second moment, and the statistics of
measurement values (``expval``/``var``/``probs`` of ``m``, of arithmetic on several, of a list)
from each branch's outcomes. A postselection renormalises by the kept weight (NaN results
where nothing is kept, as ``default.qubit``).

With shots the tree is sampled instead: the device runs the one-shot grouping of
:mod:`qdiff.circuits.pennylane_one_shot` (shots grouped by outcome history are the sampled
branches of the tree).
"""
from __future__ import annotations

import itertools

import numpy as np

from qdiff.circuits import pennylane_one_shot as one_shot
from qdiff.circuits.pennylane_one_shot import conditioned, segments


def run(tape, model, rng, snapshots=None):
    """A device's results of ``tape`` with its mid-circuit measurements measured: with shots
    a ``dynamic_one_shot`` tape's per-shot results
    (:func:`qdiff.circuits.pennylane_one_shot.execute`, ``snapshots`` storing its snapshot
    values), without, the exact results of its outcome tree (:func:`execute`). The branch
    states may take half the memory budget."""
    from qdiff.circuits import memory
    index = {w: i for i, w in enumerate(model.labels)}.__getitem__
    budget = 0.5 * memory.budget()
    if tape.shots:
        return one_shot.execute(tape, model, index, rng, budget, snapshots)
    return execute(tape, model, index, budget)


def supported(mp) -> bool:
    """Whether the exact traversal computes ``mp``."""
    from pennylane.measurements import ExpectationMP, ProbabilityMP, VarianceMP
    return type(mp) in (ExpectationMP, ProbabilityMP, VarianceMP)


def execute(tape, model, wire_index, budget: float):
    """The exact results of ``tape`` (no shots, mid-circuit measurements in its operations):
    one value per measurement, as ``default.qubit`` gives them. ``model``: the device's
    :class:`~qdiff.circuits.pennylane_one_shot.Model` (with ``measure``); ``budget``: bytes the
    branch states may take, those waiting their turn included."""
    from pennylane.exceptions import DeviceError
    for mp in tape.measurements:
        if not supported(mp):
            raise DeviceError(
                f"mcm_method='tree-traversal' computes expval, var and probs; "
                f"{type(mp).__name__} ({mp!r}) of a circuit with mid-circuit measurements is "
                "not a combination of its branches' results: use mcm_method='deferred'")
    if 3.0 * model.row_bytes > budget:
        raise DeviceError(
            f"tree-traversal: a state of {model.row_bytes / 2 ** 30:.3g} GiB does not fit the "
            f"memory available ({budget / 2 ** 30:.3g} GiB for the branch states)")
    from pennylane.ops import MidMeasure
    parts = segments(tape.operations)
    mcms = [op for op in tape.operations if isinstance(op, MidMeasure)]
    outcome = Outcomes(mcms)
    if any(kind == "snapshot" for kind, _ in parts):
        raise DeviceError("qml.snapshots of a circuit with mid-circuit measurements is taken "
                          "per shot (mcm_method='one-shot') or of the deferred circuit "
                          "(mcm_method='deferred'), not by mcm_method='tree-traversal'")
    parts = [(kind, _condition(item, outcome) if kind == "cond" else
              (item, outcome.index[item]) if kind == "measure" else item)
             for kind, item in parts]
    lead = 1 if parts and parts[0][0] == "gates" else 0
    acc = _Accumulator(tape, model, outcome)
    walk = _Walk(parts, model, wire_index, budget, acc, model.rounding)
    walk.walk(lead, model.evolve(None, parts[0][1] if lead else []),
         [((None,) * len(mcms), 1.0)], 0.0)
    out = acc.results()
    return out[0] if len(out) == 1 else tuple(out)


def _condition(op, outcome):
    """``(operation, holds)``: a conditional ``op``'s operation and ``values -> bool``, whether
    a branch's outcomes make every condition it is nested in true."""
    conditions, base = conditioned(op)
    readers = [outcome.reader(c) for c in conditions]
    return base, lambda values: all(read(values) for read in readers)


class Outcomes:
    """A branch's outcomes as a tuple in the order of the circuit's mid-circuit measurements;
    a measurement value is read through its measurements' positions, found once (PennyLane
    hashes a measurement at every dictionary lookup)."""

    def __init__(self, mcms):
        self.index = {m: i for i, m in enumerate(mcms)}

    def reader(self, mv):
        """``values -> mv``'s value for the outcome tuple ``values``."""
        at = tuple(self.index[m] for m in mv.measurements)
        fn = mv.processing_fn
        return lambda values: fn(*(values[i] for i in at))


class _Walk:
    """The depth-first traversal of ``parts`` (the circuit's segments), adding the leaves to
    ``acc``."""

    def __init__(self, parts, model, wire_index, budget, acc, prune):
        self.parts, self.model, self.wire_index = parts, model, wire_index
        self.budget, self.acc, self.prune = budget, acc, prune

    def walk(self, i, states, branches, held: float) -> None:
        """Traverse ``parts[i:]`` from ``branches`` (``(outcomes, weight)`` per row of
        ``states``, the outcomes a tuple in measurement order); ``held``: bytes of the states
        kept for later traversal (the budget left is what they leave)."""
        model, row = self.model, self.model.row_bytes
        for at in range(i, len(self.parts)):
            kind, item = self.parts[at]
            if kind == "gates":
                states = model.evolve(states, item)
            elif kind == "cond":
                base, holds = item
                rows = [r for r, (values, _) in enumerate(branches) if holds(values)]
                if rows:
                    states = model.assign(states, rows,
                                          model.evolve(model.select(states, rows), [base]))
            else:
                item, j = item
                wire = self.wire_index(item.wires[0])
                probs = model.outcome_probs(states, wire)
                src, outcomes, grown = [], [], []
                for r, (values, weight) in enumerate(branches):
                    for outcome in (0, 1):
                        p = float(probs[r, outcome])
                        if p < self.prune or (item.postselect is not None and
                                              outcome != item.postselect):
                            continue
                        src.append(r)
                        outcomes.append(outcome)
                        grown.append((values[:j] + (outcome,) + values[j + 1:], weight * p))
                if not grown:  # every branch postselected away: leaves of no weight
                    self.acc.add(states, [(values[:j] + (item.postselect,) + values[j + 1:], 0.0)
                                          for values, _ in branches])
                    return
                if held + 3.0 * len(grown) * row > self.budget:
                    box = [states]  # passed on, not kept in this frame
                    del states
                    self._split(at, box, branches, held, wire, outcomes, grown)
                    return
                states = model.collapse(model.select(states, src), wire,
                                        np.asarray(outcomes, dtype=np.int64), item.reset)
                branches = grown
        self.acc.add(states, branches)

    def _split(self, at, box, branches, held, wire, outcomes, grown) -> None:
        """Traverse the measurement ``parts[at]`` and what follows in parts that fit: the
        branches in halves, a single branch one outcome after the other (``box``: a list
        holding the states, emptied here so that no frame keeps them)."""
        from pennylane.exceptions import DeviceError
        model, row = self.model, self.model.row_bytes
        states = box.pop()
        if len(branches) > 1:
            half = len(branches) // 2
            # the second half waits; the first is passed on, not kept here
            pending = [model.select(states, list(range(half, len(branches)))),
                       model.select(states, list(range(half)))]
            del states
            self.walk(at, pending.pop(), branches[:half], held + (len(branches) - half) * row)
            self.walk(at, pending.pop(), branches[half:], held)
            return
        if held + 4.0 * row > self.budget:
            raise DeviceError(
                f"tree-traversal: the states kept for the branches still to traverse "
                f"({held / 2 ** 30:.3g} GiB) and one more do not fit the memory available "
                f"({self.budget / 2 ** 30:.3g} GiB for the branch states)")
        item = self.parts[at][1][0]
        for k, (outcome, leaf) in enumerate(zip(outcomes, grown)):
            # the branch's state waits while its first outcome is traversed
            last = k == len(grown) - 1
            pending = [model.collapse(states, wire, np.asarray([outcome], dtype=np.int64),
                                      item.reset)]
            if last:
                del states
            self.walk(at + 1, pending.pop(), [leaf], held + (0.0 if last else row))


class _Accumulator:
    """The weighted sums of the final measurements over the leaves."""

    def __init__(self, tape, model, outcome: Outcomes):
        from pennylane.measurements import ExpectationMP, VarianceMP
        self.mps = list(tape.measurements)
        self.model, self.outcome = model, outcome
        # per branch: the wire/observable measurements, and an expval beside each var
        self.direct = []
        for mp in self.mps:
            if mp.mv is None:
                self.direct.append(mp)
                if isinstance(mp, VarianceMP):
                    self.direct.append(ExpectationMP(obs=mp.obs))
        self.sums = [None] * len(self.direct)
        self.second = {}  # index of a var in direct -> sum of w * (var + mean**2)
        self.leaves = []  # (outcomes, weight) of every leaf, for the measurement values
        self.total = 0.0

    def add(self, states, branches) -> None:
        from pennylane.measurements import VarianceMP
        w = np.array([weight for _, weight in branches], dtype=np.float64)
        self.total += float(w.sum())
        self.leaves.extend(branches)
        if not self.direct:
            return
        got = self.model.measure(states, self.direct)
        for j, (mp, value) in enumerate(zip(self.direct, got)):
            value = np.asarray(value, dtype=np.float64).reshape(len(branches), -1)
            if isinstance(mp, VarianceMP):
                mean = np.asarray(got[j + 1], dtype=np.float64).reshape(len(branches), -1)
                value = value + mean ** 2
            s = w @ value
            self.sums[j] = s if self.sums[j] is None else self.sums[j] + s

    def results(self) -> list:
        from pennylane.measurements import ExpectationMP, VarianceMP
        total = self.total
        out, j = [], 0
        for mp in self.mps:
            if mp.mv is not None:
                out.append(self._mid_statistic(mp))
                continue
            s = self.sums[j] / total if total > 0 else np.full_like(self.sums[j], np.nan)
            if isinstance(mp, VarianceMP):
                mean = self.sums[j + 1] / total if total > 0 else np.nan
                out.append(np.float64((s - mean ** 2)[0]))
                j += 2
                continue
            out.append(np.float64(s[0]) if isinstance(mp, ExpectationMP) else s)
            j += 1
        return out

    def _mid_statistic(self, mp):
        """``expval``/``var``/``probs`` of measurement values from the leaves' outcomes (the
        value sets and order of PennyLane's own statistics of sampled outcomes)."""
        from pennylane.measurements import ExpectationMP, ProbabilityMP
        w = np.array([weight for _, weight in self.leaves], dtype=np.float64)
        total = w.sum()
        if isinstance(mp, ProbabilityMP):
            mvs = mp.mv if isinstance(mp.mv, (list, tuple)) else [mp.mv]
            read = [self.outcome.reader(m) for m in mvs]
            got = np.array([[float(f(values)) for f in read]
                            for values, _ in self.leaves]).reshape(len(self.leaves), len(mvs))
            grid = list(itertools.product(*[list(m.branches.values()) for m in mvs]))
            counts = np.array([w[np.all(got == np.array(v, dtype=float), axis=1)].sum()
                               for v in grid])
            return counts / counts.sum() if total > 0 else np.full(len(grid), np.nan)
        read = self.outcome.reader(mp.mv)
        f = np.array([float(read(values)) for values, _ in self.leaves])
        if total <= 0:
            return np.float64(np.nan)
        mean = float(w @ f / total)
        if isinstance(mp, ExpectationMP):
            return np.float64(mean)
        return np.float64(w @ (f - mean) ** 2 / total)
