"""PennyLane tape transforms shared by qdiff's PennyLane devices (``qdiff.statevector`` and
``qdiff.mixed``), made on first use (PennyLane is imported then, not with qdiff)."""
from __future__ import annotations

import functools


def _broadcast_unitary(op) -> bool:
    return type(op).__name__ == "QubitUnitary" and op.batch_size is not None


@functools.lru_cache(maxsize=None)
def decompose_broadcast():
    """The transform ``decompose_broadcast(tape, stopping_condition, decomposer,
    split_rows=None, **kwargs)``: PennyLane's ``decompose`` into the operations
    ``stopping_condition`` accepts, where a broadcast ``QubitUnitary`` (a user's, or the matrix
    of a broadcast operation without a decomposition) splits the tape into one tape per row
    (``broadcast_expand``; the engines take one matrix per gate): each row's matrix is then an
    ordinary ``QubitUnitary``. ``split_rows(rows)`` splits what ``broadcast_expand`` leaves
    broadcast (channels). ``skip_initial_state_prep="constant"``: a leading state preparation
    is kept whole unless some amplitude requires grad (the engines start from its state; only
    a trainable one is decomposed into gates whose angles carry its derivative)."""
    import pennylane as qml
    from pennylane.devices.preprocess import decompose
    from pennylane.operation import StatePrepBase

    @qml.transform
    def transform(tape, stopping_condition, decomposer, split_rows=None, **kwargs):
        if kwargs.get("skip_initial_state_prep") == "constant":
            ops = tape.operations
            kwargs["skip_initial_state_prep"] = bool(ops) and isinstance(ops[0], StatePrepBase) \
                and not any(qml.math.requires_grad(d) for d in ops[0].data)

        def held(op):
            return stopping_condition(op) or _broadcast_unitary(op)
        (tape,), _ = decompose(tape, stopping_condition=held, decomposer=decomposer, **kwargs)
        if not any(_broadcast_unitary(op) for op in tape.operations):
            return (tape,), lambda results: results[0]
        rows, fn = qml.transforms.broadcast_expand(tape)
        if split_rows is not None:
            rows = split_rows(rows)
        out = [decompose(r, stopping_condition=stopping_condition, decomposer=decomposer,
                         **kwargs)[0][0] for r in rows]
        return tuple(out), fn
    return transform


def map_measurement_wires(mp, wire_map):
    """A PennyLane measurement ``mp`` on the wires ``wire_map`` gives (``ShadowExpvalMP``'s own
    ``map_wires`` leaves its observables' wires)."""
    import pennylane as qml
    from pennylane.measurements import ShadowExpvalMP
    if isinstance(mp, ShadowExpvalMP):
        obs = [qml.map_wires(h, wire_map) for h in mp.H] if isinstance(mp.H, (list, tuple)) \
            else qml.map_wires(mp.H, wire_map)
        return ShadowExpvalMP(obs, seed=mp.seed, k=mp.k)
    return mp.map_wires(wire_map)


def sampled_measurements(mps) -> list:
    """``mps`` for PennyLane's shot sampler, each ``expval`` of a one-term
    ``LinearCombination`` (``qml.Hamiltonian([0.5], [qml.Z(0)])``) written as the expval of
    ``c * op`` (``SProd``, the same observable): the sampler puts such a Pauli word in one group
    with the commuting measurements after it, measures that group as a Hamiltonian and returns
    its first result only (PennyLane 0.45), which pairs the later results with the wrong
    measurements."""
    import pennylane as qml
    from pennylane.measurements import ExpectationMP
    out = []
    for mp in mps:
        obs = mp.obs
        if type(mp) is ExpectationMP and mp.mv is None and \
                isinstance(obs, qml.ops.LinearCombination) and len(obs.terms()[0]) == 1:
            (c,), (op,) = obs.terms()
            mp = ExpectationMP(obs=qml.s_prod(c, op))
        out.append(mp)
    return out


@functools.lru_cache(maxsize=None)
def defer_within():
    """The transform ``defer_within(tape, device_wires, name, allow_postselect)``: PennyLane's
    ``defer_measurements``, refusing by name (a ``DeviceError``) a circuit on the device's
    wires whose deferral needs wires the device lacks (deferring adds wires; the message
    points to the methods that measure instead); a circuit already off the device's wires is
    left to PennyLane's wire validation. A condition nested in another (a ``qml.cond`` inside
    a conditioned function) becomes ONE condition on both measurement values first:
    PennyLane 0.45's deferral keeps only the outer one, which applies the operation where the
    inner condition is false. With ``allow_postselect=False`` a postselected measurement is
    refused by name, pointing to the methods that measure."""
    import pennylane as qml
    from pennylane.exceptions import DeviceError
    from pennylane.measurements import MidMeasureMP
    from pennylane.ops import Conditional
    from pennylane.transforms import defer_measurements

    def flat(op):
        if not isinstance(op, Conditional) or not isinstance(op.base, Conditional):
            return op
        mv, base = op.meas_val, op.base
        while isinstance(base, Conditional):
            mv, base = mv & base.meas_val, base.base
        return Conditional(mv, base)

    @qml.transform
    def transform(tape, device_wires, name, allow_postselect=True):
        if any(isinstance(op, Conditional) and isinstance(op.base, Conditional)
               for op in tape.operations):
            tape = tape.copy(operations=[flat(op) for op in tape.operations])
        if not allow_postselect and any(isinstance(op, MidMeasureMP) and
                                        op.postselect is not None for op in tape.operations):
            raise DeviceError(
                f"{name}: postselection is not taken with deferred mid-circuit measurements "
                "(mcm_method='deferred') on this device; measure them instead: "
                "mcm_method='tree-traversal' (exact) or 'one-shot' (with shots)")
        tapes, fn = defer_measurements(tape, allow_postselect=allow_postselect)
        if device_wires is None:
            return tapes, fn
        k = sum(isinstance(op, MidMeasureMP) for op in tape.operations)
        if not k or not set(tape.wires) <= set(device_wires):
            return tapes, fn
        extra = [w for w in tapes[0].wires if w not in device_wires]
        if extra:
            raise DeviceError(
                f"{name}: the circuit's {k} mid-circuit measurement{'s are' if k > 1 else ' is'} "
                f"deferred (mcm_method='deferred'), which adds wires: the deferred circuit "
                f"needs {len(device_wires) + len(extra)} wires and the device has "
                f"{len(device_wires)}; create the device with more wires, or measure them "
                f"(mcm_method='one-shot' with shots, 'tree-traversal' without)")
        return tapes, fn
    return transform


@functools.lru_cache(maxsize=None)
def snapshots_taken():
    """The transform ``snapshots_taken(tape, device)``: the tape without its ``Snapshot``
    operations; while ``qml.snapshots`` debugs the device (its ``_debugger`` active), each
    snapshot's measurement (the state by default) is first taken on the circuit up to it, by
    ``device._snapshot_result(sub_tape, tape)`` (torch results where the tape has torch
    parameters), and stored under its tag as default.qubit stores it
    (exact for state measurements, else with the snapshot's shots). A tape with mid-circuit
    measurements still in it (measured shot by shot) keeps its snapshots while ``qml.snapshots``
    debugs: the device takes them in each shot and stores them by :func:`snapshot_store`."""
    import pennylane as qml
    from pennylane.measurements import StateMP

    @qml.transform
    def transform(tape, device):
        ops = tape.operations
        if not any(isinstance(op, qml.Snapshot) for op in ops):
            return (tape,), lambda results: results[0]
        debugger = getattr(device, "_debugger", None)
        if debugger is not None and debugger.active and \
                any(isinstance(op, qml.ops.MidMeasure) for op in ops):
            # measured mid-circuit measurements (mcm_method="one-shot"): the device takes
            # each snapshot in each shot (snapshot_store)
            return (tape,), lambda results: results[0]
        if debugger is not None and debugger.active:
            for i, op in enumerate(ops):
                if not isinstance(op, qml.Snapshot):
                    continue
                m = op.hyperparameters["measurement"]
                shots = op.hyperparameters["shots"]
                shots = tape.shots if shots == "workflow" else shots
                prefix = [o for o in ops[:i] if not isinstance(o, qml.Snapshot)]
                sub = qml.tape.QuantumScript(prefix, [m],
                                             shots=None if isinstance(m, StateMP) else shots)
                _store_snapshot(debugger, op.tag, device._snapshot_result(sub, tape))
        kept = [op for op in ops if not isinstance(op, qml.Snapshot)]
        return (tape.copy(operations=kept),), lambda results: results[0]
    return transform


def snapshot_store(debugger):
    """``store(tag, value)`` of per-shot snapshot values while ``qml.snapshots`` debugs
    (``None`` otherwise), as default.qubit stores a one-shot circuit's (a list per tag of the
    values of every shot)."""
    if debugger is None or not debugger.active:
        return None
    return lambda tag, value: _store_snapshot(debugger, tag, value)


def _store_snapshot(debugger, tag, value) -> None:
    """default.qubit's bookkeeping: an untagged snapshot under its index, a repeated tag
    collecting its values in a list."""
    snaps = debugger.snapshots
    if tag is None:
        snaps[len(snaps)] = value
    elif tag not in snaps:
        snaps[tag] = value
    elif isinstance(snaps[tag], list):
        snaps[tag].append(value)
    else:
        snaps[tag] = [snaps[tag], value]
