"""The circuit IR: an immutable sequence of operations whose angles index columns of ``theta``.

``theta`` is a ``(B, P)`` tensor: ``B`` bindings of ``P`` parameters. Recording a ``qnode`` call
turns the user's tensor expressions into ``(Circuit, theta)``; torch itself carries gradients
from ``theta`` back to the user's inputs and weights.

>>> import torch, qdiff as qd
>>> with qd.record() as rec:
...     _ = qd.RX(torch.tensor([0.1, 0.2]), wires=0), qd.CNOT([0, 1]), qd.expval(qd.Z(1))
>>> rec_c = Circuit.from_recording(rec.items, wires=[0, 1])
>>> rec_c.circuit.num_params, tuple(rec_c.theta.shape)
(1, (2, 1))
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
import torch.autograd.forward_ad as _forward_ad

from qdiff.circuits import caches, memory
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.measurements import Measurement
from qdiff.circuits.operation import OpBlock, Operation, ParamRef, is_concrete


@dataclass(frozen=True, eq=False)
class StatePrep:
    """Amplitudes ``(..., 2**k)`` loaded on ``wires`` (the rest in |0>); only at the start."""

    vector: torch.Tensor
    wires: tuple


@dataclass(frozen=True, eq=False)
class Circuit:
    """Operations on ``num_wires`` qubits (indices 0..n-1) with ``num_params`` theta columns.

    ``barriers``: ``((position, wires), ...)``, a barrier on ``wires`` before operation
    ``position`` (``len(operations)``: after the last), as imported from Qiskit or OpenQASM.
    Simulation reads nothing of them; the compiler optimizes between them, not across, and the
    exporters write them. A circuit with new operations (:meth:`with_operations`) has none."""

    num_wires: int
    operations: tuple = ()
    measurements: tuple = ()
    num_params: int = 0
    wire_labels: Optional[tuple] = None
    barriers: tuple = ()

    def __post_init__(self):
        for pos, wires in self.barriers:
            if not (isinstance(pos, int) and 0 <= pos <= len(self.operations)) or not all(
                    isinstance(w, int) and 0 <= w < self.num_wires for w in wires):
                raise QdiffError(f"a barrier on wires {list(wires)} at position {pos!r}: out of "
                                 f"range for a {self.num_wires}-qubit circuit of "
                                 f"{len(self.operations)} operations")
        for op in self.operations:
            for w in op.wires:
                if not (isinstance(w, int) and 0 <= w < self.num_wires):
                    raise QdiffError(f"gate '{op.gate.pl_name or op.name}' on wire {w!r}: out of "
                                     f"range for a {self.num_wires}-qubit circuit")
            for i, p in enumerate(op.params):
                if type(p) is float:
                    if not math.isfinite(p) and not (
                            p == math.inf and i in getattr(op.gate, "unbounded", ())):
                        _not_finite(op, p)
                elif isinstance(p, ParamRef):
                    if not 0 <= p.index < self.num_params:
                        raise QdiffError(f"gate '{op.name}' refers to parameter {p.index} but "
                                         f"the circuit has {self.num_params}")
                    if not (math.isfinite(p.scale) and math.isfinite(p.offset)):
                        _not_finite(op, p)

    @property
    def labels(self) -> tuple:
        return self.wire_labels if self.wire_labels is not None else tuple(range(self.num_wires))

    def with_operations(self, ops: Sequence[Operation]) -> "Circuit":
        return Circuit(self.num_wires, tuple(ops), self.measurements, self.num_params,
                       self.wire_labels)

    def with_measurements(self, ms: Sequence[Measurement]) -> "Circuit":
        return Circuit(self.num_wires, self.operations, tuple(ms), self.num_params,
                       self.wire_labels, self.barriers)

    def count_ops(self) -> dict:
        out: dict = {}
        for op in self.operations:
            out[op.name] = out.get(op.name, 0) + 1
        return out

    def __len__(self):
        return len(self.operations)

    def __repr__(self):
        return (f"Circuit(wires={self.num_wires}, ops={len(self.operations)}, "
                f"params={self.num_params}, measurements={list(self.measurements)})")

    @staticmethod
    def from_recording(items, wires, measurements=None, check_batch=None) -> "Recorded":
        """Turn recorded operations/measurements into a Circuit and its ``theta``.

        ``check_batch(B, P)`` (optional, e.g. a backend's) is called before ``theta``
        ``(B, P)`` is assembled, so an oversized batch is refused before it is materialised."""
        return _from_recording(items, wires, measurements, check_batch)


def _not_finite(op, value):
    raise QdiffError(f"gate '{op.gate.pl_name or op.name}' on wires {list(op.wires)}: angle "
                     f"{value!r} is NaN or infinite")


_GENERATION = object()  # memo key of the cache generation the entries belong to


def memo(circuit: Circuit, key, build):
    """``build()`` computed once per circuit object (circuits are immutable): plans that
    depend only on the structure, reused by every call that records the same circuit (built
    under :func:`qdiff.circuits.caches.constants`)."""
    d = circuit.__dict__.get("_memo")
    if d is None or d.get(_GENERATION) != caches.generation():
        d = {_GENERATION: caches.generation()}  # cleared by qdiff.clear_caches()
        object.__setattr__(circuit, "_memo", d)
    try:
        return d[key]
    except KeyError:
        with caches.constants():
            val = d[key] = build()
        return val


def trainable_matrix_op(circuit) -> Optional[str]:
    """The name of the first operation whose matrix is itself a tensor requiring grad (a
    ``QubitUnitary`` of a trainable matrix, also controlled), or ``None``; only backprop
    differentiates such a matrix (it has no angles, generator or shift rule)."""
    if not torch.is_grad_enabled():
        return None
    for op, gate in unitary_ops(circuit):
        if gate.matrix_fn().requires_grad:
            return op.gate.pl_name or op.gate.name
    return None


def has_variable_matrix(op) -> bool:
    """Whether ``op`` is a ``QubitUnitary`` (also controlled) whose matrix is a tensor that
    requires grad, whatever the grad mode, or one made inside a ``torch.func`` transform (one
    value per vmapped binding, or carrying the transform's derivative): its matrix is then no
    constant of the circuit."""
    gate = _unitary_gate(op.gate)
    if gate is None:
        return False
    m = gate.matrix_fn()
    return m.requires_grad or not is_concrete(m)


def unitary_ops(circuit) -> tuple:
    """``(operation, its QubitUnitary gate)`` for every operation that is a QubitUnitary (also
    controlled): the only gates whose matrix can be a tensor requiring grad (kept on the
    circuit)."""
    return memo(circuit, "unitary_ops", lambda: _unitary_ops(circuit))


def _unitary_gate(gate):
    """The ``QubitUnitary`` gate ``gate`` is (or controls), else ``None``."""
    while gate.controls and gate.target is not None and gate.num_params == 0:
        gate = gate.target
    return gate if gate.num_params == 0 and gate.name == "unitary" else None


def _unitary_ops(circuit) -> tuple:
    out = []
    for op in circuit.operations:
        gate = _unitary_gate(op.gate)
        if gate is not None:
            out.append((op, gate))
    return tuple(out)


@dataclass
class Recorded:
    """A recorded call: the circuit, ``theta`` ``(B, P)``, the batch shape, trainable columns."""

    circuit: Circuit
    theta: torch.Tensor
    batch_shape: tuple
    trainable: tuple
    initial_state: Optional[torch.Tensor] = None
    extra: dict = field(default_factory=dict)
    #: per theta column, True where the column is ONE value broadcast over the batch by
    #: construction (a weight shared by every input): only its gradient's sum over the
    #: bindings matters (``None``: unknown, every row counts)
    shared: Optional[tuple] = None


_STRUCT_CACHE: "OrderedDict" = caches.register("circuit.structures", OrderedDict())
_STRUCT_CACHE_SIZE = 32


def _param_sig(p):
    if isinstance(p, torch.Tensor):
        return (p.shape, p.dtype, p.requires_grad, p.device)
    return p if isinstance(p, ParamRef) else ("c", float(p))


def _measurement_sig(m: Measurement):
    obs = m.obs
    head = (m.kind, m.wires, m.all_outcomes, m.integer)
    if obs is None:
        return head
    key = getattr(obs, "_key", None)
    if key is not None:
        return head + (key,)
    if obs.coeffs.requires_grad:
        return None
    return head + ("id", id(obs))


def _plain(circuit: Circuit) -> bool:
    """Whether every tensor the circuit holds (observable coefficients and matrices, tensor
    angles) is a plain one, not made inside a torch.func transform: only such a circuit may be
    reused by later calls."""
    for m in circuit.measurements:
        obs = m.obs
        if obs is None:
            continue
        c = obs.__dict__.get("coeffs")
        if c is not None and not is_concrete(c):
            return False
        if any(f.matrix is not None and not is_concrete(f.matrix) for t in obs.terms for f in t):
            return False
    return all(is_concrete(p) for op in circuit.operations for p in op.params
               if isinstance(p, torch.Tensor))


def _signature(items, meas, labels):
    """A hashable description of everything but the angle values, plus the angle sources in
    column order; ``(None, None)`` when the call cannot be cached (state preparation, trainable
    observable coefficients, unhashable labels)."""
    parts, cols = [labels], []
    for it in items:
        if isinstance(it, OpBlock):
            src = it.source
            parts.append((it.structure, src.shape, src.dtype, src.requires_grad, src.device))
            cols.append(it)
        elif isinstance(it, Operation):
            ps = it.params
            if ps:
                parts.append((it.gate, it.wires, tuple(_param_sig(p) for p in ps)))
                cols.extend(p for p in ps if isinstance(p, torch.Tensor))
            else:
                parts.append((it.gate, it.wires))
        else:
            return None, None
    for m in meas:
        ms = _measurement_sig(m)
        if ms is None:
            return None, None
        parts.append(ms)
    sig = tuple(parts)
    try:
        hash(sig)
    except TypeError:
        return None, None
    return sig, cols


def _from_recording(items, wires, measurements=None, check_batch=None) -> Recorded:
    """``items``: recorded operations, blocks, state preparation and (unless ``measurements``
    is given) measurements. A call whose structure (gates, wires, angle shapes, dtypes,
    trainability, measurements) matches a recent one reuses its Circuit: only the angles are
    gathered anew, and downstream caches keyed on the circuit object stay valid."""
    if measurements is None:
        meas_in = [i for i in items if isinstance(i, Measurement)]
        items = [i for i in items if not isinstance(i, Measurement)]
    else:
        meas_in = list(measurements)
    labels = tuple(wires)
    sig, cols = _signature(items, meas_in, labels)
    entry = _STRUCT_CACHE.get(sig) if sig is not None else None
    if entry is None:
        rec = _build_recorded(items, meas_in, labels, check_batch)
        if sig is not None and rec.initial_state is None and _plain(rec.circuit):
            _STRUCT_CACHE[sig] = (rec.circuit, rec.batch_shape, rec.trainable, rec.theta.dtype,
                                  rec.theta.device, meas_in, rec.shared)
            caches.trim(_STRUCT_CACHE, _STRUCT_CACHE_SIZE)
        return rec
    try:
        _STRUCT_CACHE.move_to_end(sig)
    except KeyError:  # evicted meanwhile by another thread: the entry is still valid
        pass
    circuit, batch_shape, trainable, dtype, device, _, shared = entry
    theta, _ = _checked_theta(cols, batch_shape, dtype, device, circuit.operations,
                              check_batch, circuit.num_params)
    return Recorded(circuit, theta, batch_shape, trainable, None, shared=shared)


def _checked_theta(cols, batch_shape, dtype, device, ops, check_batch=None,
                   num_params: int = 0) -> tuple:
    """``(theta (B, P), B)`` from the angle sources, checked finite (errors name the gate);
    ``check_batch(B, P)`` runs first, and theta's own size is checked against the memory
    budget before it is assembled."""
    bsz = 1
    for s in batch_shape:
        bsz *= s
    if check_batch is not None:
        check_batch(bsz, num_params)
    memory.require(8.0 * bsz * num_params, f"the parameters of a batch of {bsz} bindings", device)
    if cols:
        theta = _assemble_theta(cols, batch_shape, bsz, dtype, device)
    else:
        theta = torch.zeros(bsz, 0, dtype=dtype, device=device)
    check_finite_angles(theta, ops)
    return theta, bsz


def _build_recorded(items, meas_in, labels, check_batch=None) -> Recorded:
    wmap = {w: i for i, w in enumerate(labels)}
    n = len(labels)
    ops, cols, meas, prep = [], [], [], None
    ncol = 0

    def idx(ws, what):
        try:
            return tuple(wmap[w] for w in ws)
        except KeyError as e:
            from qdiff.circuits.midcircuit import is_mid_wire
            if what == "gate 'CNOT'" and any(is_mid_wire(w) for w in ws):
                what = "qd.measure"  # the deferred measurement's CNOT onto its outcome wire
            user = [w for w in labels if not is_mid_wire(w)]
            raise QdiffError(f"{what} on wire {e.args[0]!r}: the device has wires "
                             f"{user if len(user) <= 16 else f'0..{len(user) - 1}'}") from None

    for it in items:
        if isinstance(it, OpBlock):
            for op in it.structure.ops:
                ops.append(Operation(op.gate, idx(op.wires, f"gate '{op.gate.pl_name or op.name}'"),
                                     tuple(ParamRef(ncol + p.index) if isinstance(p, ParamRef)
                                           else p for p in op.params)))
            ncol += it.structure.num_angles
            cols.append(it)
        elif isinstance(it, Operation):
            params = []
            for p in it.params:
                if isinstance(p, torch.Tensor):
                    params.append(ParamRef(ncol))
                    cols.append(p)
                    ncol += 1
                else:
                    params.append(p)
            ops.append(Operation(it.gate, idx(it.wires, f"gate '{it.gate.pl_name or it.name}'"),
                                 tuple(params)))
        elif isinstance(it, StatePrep):
            if ops or prep is not None:
                raise QdiffError("state preparation (AmplitudeEmbedding/StatePrep) must come "
                                 "first in the circuit")
            prep = it
        elif not isinstance(it, Measurement):
            raise QdiffError(f"cannot record {it!r} ({type(it).__module__}.{type(it).__name__}) "
                             "in a circuit: use qdiff gates, templates and measurements")
    meas = [m.map_wires(wmap) for m in meas_in]
    batch_shape: tuple = ()
    dtype = torch.float64
    device = None
    if cols:
        shapes = {c.lead if isinstance(c, OpBlock) else c.shape for c in cols}
        try:
            batch_shape = tuple(torch.broadcast_shapes(*shapes))
        except RuntimeError:
            raise QdiffError(f"gate parameters have batch shapes that do not broadcast: "
                             f"{sorted(tuple(s) for s in shapes)}") from None
        tensors = [c.source if isinstance(c, OpBlock) else c for c in cols]
        dtype = tensors[0].dtype
        for c in tensors[1:]:
            dtype = torch.promote_types(dtype, c.dtype)
        device = tensors[0].device
    initial = None
    if prep is not None:
        initial = _initial_state(prep, idx(prep.wires, "state preparation"), n)
        pb = tuple(initial.shape[:-1])
        try:
            batch_shape = tuple(torch.broadcast_shapes(batch_shape, pb))
        except RuntimeError:
            raise QdiffError(f"state preparation batch shape {pb} does not broadcast with the "
                             f"gate parameters' {batch_shape}") from None
        device = device or initial.device
        bsz = math.prod(batch_shape)
        if check_batch is not None:
            check_batch(bsz, ncol)
        memory.require(float(bsz) * 2 ** n * initial.element_size(),
                       f"the initial states of a batch of {bsz} bindings", device)
        initial = initial.expand(*batch_shape, 2 ** n).reshape(-1, 2 ** n)
    circuit = Circuit(n, tuple(ops), tuple(meas), ncol, labels)
    if cols:
        dtype = _output_dtype(dtype, circuit, initial)
    theta, bsz = _checked_theta(cols, batch_shape, dtype, device, ops, check_batch, ncol)
    trainable = []
    for c in cols:
        if isinstance(c, OpBlock):
            trainable.extend([bool(c.source.requires_grad)] * c.structure.num_angles)
        else:
            trainable.append(bool(c.requires_grad))
    return Recorded(circuit, theta, batch_shape, tuple(trainable), initial,
                    shared=_shared_columns(cols, bsz))


def _output_dtype(dtype: torch.dtype, circuit: Circuit, initial) -> torch.dtype:
    """The angles' real ``dtype`` promoted with the (real) dtype of every tensor that requires
    grad among the state preparation, the observables' coefficients and matrices and the
    ``QubitUnitary`` matrices: outputs take theta's dtype, and one narrower than such an input
    would round its values and its gradient (torch promotes ``float32 * float64`` to float64
    the same way). Plain tensors there do not widen it: float32 angles measured with a
    Hamiltonian of float64 constants give float32."""
    leaves = [initial]
    for m in circuit.measurements:
        if m.obs is not None:
            leaves.append(m.obs.coeffs)
            leaves.extend(f.matrix for t in m.obs.terms for f in t if f.kind == "M")
    leaves.extend(gate.matrix_fn() for _, gate in unitary_ops(circuit))
    for t in leaves:
        if isinstance(t, torch.Tensor) and t.requires_grad and (
                t.is_complex() or t.dtype.is_floating_point):
            dtype = torch.promote_types(dtype, t.real.dtype if t.is_complex() else t.dtype)
    return dtype


def _shared_columns(cols, bsz: int):
    """Per theta column: a single value expanded over the ``bsz`` bindings (weights without
    batch dims, scalars). ``None`` for an unbatched call."""
    if bsz <= 1 or not cols:
        return None
    out = []
    for c in cols:
        if isinstance(c, OpBlock):
            lead = 1
            for d in c.lead:
                lead *= d
            out.extend([lead == 1] * c.structure.num_angles)
        else:
            out.append(c.numel() == 1)
    return tuple(out)


class _Bases:
    """Per-call facts about the storage bases of the recorded angles (checked once per base)."""

    def __init__(self):
        self.info: dict = {}

    def get(self, b: torch.Tensor) -> tuple:
        """``(usable, shape, strides, storage offset, gradient node)`` of base ``b``."""
        key = id(b)
        if key not in self.info:
            ok = b.is_contiguous()
            node = b.grad_fn
            if node is None and b.requires_grad and not torch.is_inference_mode_enabled():
                with torch.enable_grad():  # b's gradient accumulator, reached through a view
                    node = b.view_as(b).grad_fn.next_functions[0][0]
            self.info[key] = (ok, tuple(b.shape), b.stride(), b.storage_offset(), node, b)
        return self.info[key]


def _view_of(c: torch.Tensor, bases: _Bases):
    """``(base, d, offset)`` when ``c`` is ``base[..., i, j, ...]`` (integer indices on trailing
    dims of a contiguous base, leading dims kept), else ``None``."""
    b = c._base
    if b is None or b.dtype != c.dtype or not is_concrete(c) or _forward_ad._current_level >= 0:
        return None  # (under forward AD the base may be a dual tensor's primal, without tangent)
    ok, shape, stride, boff, node, _ = bases.get(b)
    d = c.ndim
    if not ok or d > len(shape) or c.shape != shape[:d] or c.stride() != stride[:d]:
        return None
    off = c.storage_offset() - boff
    inner = 1
    for s in shape[d:]:
        inner *= s
    if not 0 <= off < inner or (c.requires_grad and not _selects_from(c, node)):
        return None
    return b, d, off


def _selects_from(c: torch.Tensor, base_node) -> bool:
    """Whether ``c``'s autograd graph is a chain of integer selects straight from its storage
    base (whose gradient node is ``base_node``): then gathering from the base is the same
    function. An intermediate view, e.g. the ``view_as`` input of ``torch.autograd.functional``,
    must keep its node."""
    node = c.grad_fn
    while node is not None and type(node).__name__ == "SelectBackward0":
        node = node.next_functions[0][0] if node.next_functions else None
    return node is not None and node is base_node


def _assemble_theta(cols, batch_shape, bsz: int, dtype, device) -> torch.Tensor:
    """``theta`` ``(B, P)`` from the recorded angle sources in column order: tensors (one
    column each) and :class:`OpBlock` s (one gather for all their angles). Angles that index one
    weight tensor (a template's ``w[..., l, i, k]``) are gathered from it in ONE op, so the
    backward is one scatter instead of a select/expand chain per angle (hundreds of autograd
    nodes per layer)."""
    groups: dict = {}
    singles = []
    bases = _Bases()
    blocks, order = [], []
    pos = 0
    starts = []
    for c in cols:
        starts.append(pos)
        pos += c.structure.num_angles if isinstance(c, OpBlock) else 1
    for j, c in enumerate(cols):
        if isinstance(c, OpBlock):
            m = c.structure.num_angles
            a = c.angles().to(dtype=dtype, device=device)
            blocks.append(a.expand(*batch_shape, m).reshape(bsz, m))
            order.extend(range(starts[j], starts[j] + m))
            continue
        v = _view_of(c, bases)
        if v is None:
            singles.append(j)
        else:
            groups.setdefault((id(v[0]), v[1]), (v[0], v[1], []))[2].append((j, v[2]))
    for base, d, members in groups.values():
        if len(members) < 2:
            singles.extend(j for j, _ in members)
            continue
        idx = torch.tensor([o for _, o in members], device=base.device)
        # (a reshape to -1 fails on 0 elements; a base without dims past d gets one)
        flat = base.flatten(d) if d < base.ndim else base.unsqueeze(d)
        blk = flat.index_select(d, idx)
        blocks.append(blk.to(dtype=dtype, device=device).expand(*batch_shape, len(members))
                      .reshape(bsz, len(members)))
        order.extend(starts[j] for j, _ in members)
    if singles:
        blocks.append(torch.stack([cols[j].to(dtype=dtype, device=device).expand(batch_shape)
                                   for j in singles], dim=-1).reshape(bsz, len(singles)))
        order.extend(starts[j] for j in singles)
    theta = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=1)
    if order != sorted(order):
        theta = theta.index_select(1, torch.argsort(torch.tensor(order, device=theta.device)))
    return theta


def _unbounded_columns(theta: torch.Tensor, ops) -> torch.Tensor:
    """``(P,)``: columns that are finite or ``+inf`` where every use is a channel parameter
    that may be infinite (a T1 or T2 without decay)."""
    allowed, other = set(), set()
    for op in ops:
        unb = getattr(op.gate, "unbounded", ())
        for s, p in enumerate(op.params):
            if isinstance(p, ParamRef):
                (allowed if s in unb and p.scale > 0 else other).add(p.index)
    cols = torch.zeros(theta.shape[1], dtype=torch.bool, device=theta.device)
    for k in allowed - other:
        cols[k] = bool(((theta[:, k] == math.inf) | torch.isfinite(theta[:, k])).all())
    return cols


def check_finite_angles(theta: torch.Tensor, ops) -> None:
    """Refuse NaN/inf angles in ``theta`` ``(B, P)`` read by ``ops`` (one check): the message
    names the first offending gate."""
    if theta.numel() == 0 or not is_concrete(theta):
        return
    if theta.device.type == "meta":
        raise QdiffError("gate angles on torch's 'meta' device hold no values to simulate; "
                         "give them on 'cpu' or 'cuda'")
    ok = torch.isfinite(theta.detach()).all(dim=0)
    if bool(ok.all()):
        return
    ok = ok | _unbounded_columns(theta, ops)
    if bool(ok.all()):
        return
    bad = int((~ok).nonzero()[0, 0])
    for op in ops:
        for p in op.params:
            if isinstance(p, ParamRef) and p.index == bad:
                raise QdiffError(f"gate '{op.gate.pl_name or op.name}' on wires {list(op.wires)}: "
                                 "angle is NaN or infinite")
    raise QdiffError("a gate angle is NaN or infinite")


def _initial_state(prep: StatePrep, wires: tuple, n: int) -> torch.Tensor:
    """Embed ``prep.vector`` on ``wires`` into an n-qubit state ``(..., 2**n)``."""
    v = prep.vector
    k = len(wires)
    batch = v.shape[:-1]
    if k == n and list(wires) == list(range(n)):
        return v
    memory.require(float(math.prod(batch)) * 2.0 ** n * v.element_size(),
                   f"the initial state of {n} qubits (a state prepared on {k} of them)",
                   v.device)
    full = torch.zeros(*batch, *([2] * n), dtype=v.dtype, device=v.device)
    vv = v.reshape(*batch, *([2] * k))
    idx = [slice(None)] * len(batch) + [0] * n
    for w in wires:
        idx[len(batch) + w] = slice(None)
    # place vv's axes (in wires order) onto the sorted wire positions
    order = sorted(range(k), key=lambda i: wires[i])
    vv = vv.permute(*range(len(batch)), *[len(batch) + i for i in order])
    full[tuple(idx)] = vv
    return full.reshape(*batch, 2 ** n)
