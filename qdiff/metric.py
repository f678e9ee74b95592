"""``qd.metric_tensor``: the Fubini-Study metric of a qnode's state, for quantum natural gradient.

``g_ij = Re[<d_i psi|d_j psi> - <d_i psi|psi><psi|d_j psi>]`` with respect to the circuit's
trainable parameters, PennyLane's ``qml.metric_tensor`` convention (no factor 1/4).

* ``approx=None`` (full): forward-mode derivative states ``d_j psi`` propagated gate by gate
  on the torch statevector (one extra state per trainable parameter), exact for any gate whose
  matrix function torch can differentiate; statevector backends only.
* ``approx="block-diag"`` / ``"diag"``: PennyLane's layering - trainable gates in circuit order,
  a new layer whenever a gate depends on a gate of the current layer; per layer the covariance
  ``<G_i G_j> - <G_i><G_j>`` of the gates' generators measured on the state prepared by the
  layer's ancestors. Those are ordinary expectation values, so this runs on any backend,
  shot-based simulators and hardware included (one circuit per layer). Multi-parameter gates
  (Rot, CRot, U3, U2) are split into rotations of their own angles first; other gates keep
  their own generator (PennyLane decomposes some of them, U3, U2 and controlled rotations
  among them, and its block-diagonal metric then differs; entries within a layer here equal
  the exact metric's). On a device with a
  device noise model (``qd.device("mixed", noise="fake_manila")``, trajectories) each layer's
  circuit is routed and translated for the device first, like any circuit run there
  (:mod:`qdiff.noise`): the covariances are those of the noisy states the device prepares.

Mapping to the user's arguments (``hybrid=True``, the default): with ``J = d theta / d arg`` the
classical Jacobian of the recorded angles, the metric of an argument is ``J^T g J``, of shape
``arg.shape + arg.shape``; with several trainable arguments a tuple of these diagonal blocks
(as PennyLane returns). ``hybrid=False`` returns ``g`` over the trainable ``theta`` columns,
``batch_shape + (P, P)``. The result is not differentiable (detached). With every ``approx`` it
is in the dtype of the qnode's own output for the same call (float32 arguments: float32), computed
in the backend's precision (float32 at least) and rounded once.

>>> import torch, qdiff as qd
>>> dev = qd.device("statevector", wires=1)
>>> @qd.qnode(dev)
... def f(w):
...     qd.RX(w[0], wires=0); qd.RY(w[1], wires=0)
...     return qd.expval(qd.Z(0))
>>> qd.metric_tensor(f, approx=None)(torch.tensor([0.0, 0.0], requires_grad=True))
tensor([[0.2500, 0.0000],
        [0.0000, 0.2500]])
"""
from __future__ import annotations

import functools

import torch

from qdiff.circuits import caches, memory
from qdiff.backends.base import Job
from qdiff.bridge import deferred_backend
from qdiff.circuits.channels import Channel
from qdiff.circuits.circuit import Circuit, trainable_matrix_op
from qdiff.circuits.decompositions import decompose, pauli_generator_terms
from qdiff.circuits.errors import QdiffError, QdiffMemoryError
from qdiff.circuits.measurements import Measurement
from qdiff.circuits.observables import Factor, Observable
from qdiff.circuits.operation import Operation, ParamRef
from qdiff.noise import route_circuit

APPROX = ("block-diag", "diag", None)


def record_call(qnode, args, kwargs, who: str = "metric_tensor"):
    """The :class:`Recorded` call of a qdiff qnode (``@qd.qnode``) or a Qiskit-circuit qnode."""
    if hasattr(qnode, "device"):
        if callable(getattr(qnode, "construct", None)):
            return qnode.construct(*args, **kwargs)[0]
        if callable(getattr(qnode, "record", None)):
            return qnode.record(*args, **kwargs)
    raise QdiffError(f"{who}: qnode must be a qdiff qnode (@qd.qnode, also of a Qiskit "
                     f"circuit), whose state defines the metric; got {type(qnode).__name__}")


def metric_tensor(qnode, approx="block-diag", hybrid: bool = True, **kwargs):
    """Return a function of the qnode's arguments giving its metric tensor (see module doc)."""
    if kwargs:
        raise QdiffError(f"metric_tensor: unknown keyword(s) {sorted(kwargs)}; valid: approx, "
                         "hybrid (the metric is taken over every argument that requires grad)")
    if approx not in APPROX:
        raise QdiffError(f"metric_tensor: approx must be one of {list(APPROX)}; got {approx!r}")

    @functools.wraps(qnode)
    def wrapper(*args, **kwargs):
        with torch.enable_grad():  # what requires grad is recorded, also under no_grad()
            recorded = record_call(qnode, args, kwargs)
        g, cols = theta_metric(recorded, qnode.device, approx)
        out = recorded.theta.dtype  # the dtype of the qnode's own output for these arguments
        if not hybrid:
            return g.reshape(*recorded.batch_shape, len(cols), len(cols)).to(out)
        blocks = contract_with_args(g, cols, recorded, qnode, args, kwargs)
        return blocks[0].to(out) if len(blocks) == 1 else tuple(b.to(out) for b in blocks)
    return wrapper


def theta_metric(recorded, backend, approx):
    """``(g (B, P, P), trainable columns)`` over the trainable theta columns, in the precision
    it was computed in (float32 at least, whatever theta's dtype): callers round once, at the
    end."""
    cols = [i for i, t in enumerate(recorded.trainable) if t]
    theta = recorded.theta.detach()
    # mid-circuit measurements: the device widened by their wires (refused on a noisy one)
    backend = deferred_backend(backend, recorded.circuit, {})
    memory.require(8.0 * theta.shape[0] * len(cols) ** 2 * 2,
                   f"the metric tensor over {len(cols)} gate angles", theta.device)
    if not cols:
        return theta.new_zeros(theta.shape[0], 0, 0), cols
    if approx is None:
        return full_metric(recorded.circuit, theta, cols, backend, recorded.initial_state), cols
    return block_metric(recorded.circuit, theta, cols, backend, recorded.initial_state,
                        diag_only=approx == "diag"), cols


def check_angles_only(recorded, who: str, hint: str = "") -> None:
    """Refuse a call whose trainable arguments reach the state by more than the gate angles
    (a state preparation, a QubitUnitary matrix): the metric would miss that part."""
    with torch.enable_grad():
        other = "state preparation" if getattr(recorded.initial_state, "requires_grad", False) \
            else trainable_matrix_op(recorded.circuit)
    if other is not None:
        other = other if other == "state preparation" else f"matrix of gate '{other}'"
        raise QdiffError(f"{who}: the {other} depends on a trainable argument; the metric is "
                         f"taken through the gate angles only, so that dependence would be "
                         f"missing{hint}")


def contract_with_args(g, cols, recorded, qnode, args, kwargs):
    """``J^T g J`` per trainable argument (the diagonal blocks, as PennyLane returns)."""
    if recorded.batch_shape != ():
        raise QdiffError("metric_tensor with hybrid=True needs unbatched arguments (the metric "
                         f"of a batch of shape {recorded.batch_shape}); use hybrid=False")
    train = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    if not train:
        raise QdiffError("metric_tensor: no argument requires grad; mark the trainable ones "
                         "with requires_grad=True")
    check_angles_only(recorded, "metric_tensor", " (make it constant, or use hybrid=False "
                      "for the metric over the gate angles)")
    dim = sum(args[i].numel() for i in train)
    memory.require(8.0 * (len(cols) * dim + sum(args[i].numel() ** 2 for i in train)) * 2,
                   f"the metric tensor over {dim} argument entries", g.device)

    def angles(*targs):
        full = list(args)
        for i, a in zip(train, targs):
            full[i] = a
        rec = record_call(qnode, full, kwargs)
        return rec.theta[0, cols]
    jac = torch.autograd.functional.jacobian(angles, tuple(args[i].detach() for i in train))
    g0 = g[0]
    flat = [j.reshape(len(cols), -1).to(g0.dtype) for j in jac]
    return [(J.T @ g0 @ J).reshape(tuple(args[i].shape) * 2) for i, J in zip(train, flat)]


# ------------------------------------------------------------------------------------------
# full metric by forward-mode derivative states


def derivative_states(circuit, theta, cols, backend, initial_state=None):
    """``psi (B, N)`` and ``dpsi (B, P, N)``: the final states and their derivatives with
    respect to theta columns ``cols``, by forward-mode differentiation through the backend
    (one ``torch.func.jvp`` of one run whose ``P * B`` rows carry one unit tangent each)."""
    b, p = theta.shape[0], len(cols)
    memory.require(4.0 * b * p * theta.shape[1] * theta.element_size()
                   + 2.0 * 16 * b * p * 2 ** circuit.num_wires + 16.0 * b * p * p,
                   f"forward-mode derivatives: {p * b} rows of {theta.shape[1]} parameters, "
                   f"their derivative states on {circuit.num_wires} qubits and the "
                   f"{b}x{p}x{p} metric", theta.device)
    circ = circuit.with_measurements([Measurement("state", None, None)])
    rows = theta.repeat(p, 1)
    tangent = torch.zeros_like(rows)
    for k, c in enumerate(cols):
        tangent[k * b:(k + 1) * b, c] = 1.0
    prep = None if initial_state is None else initial_state.expand(b, -1).repeat(p, 1)

    def states(th):
        return backend.run(circ, th, prep)[0]
    psi, dpsi = torch.func.jvp(states, (rows,), (tangent,))
    return psi[:b], dpsi.reshape(p, b, -1).transpose(0, 1)


def full_metric(circuit, theta, cols, backend, initial_state=None):
    """Exact Fubini-Study metric ``(B, P, P)`` over theta columns ``cols``."""
    if getattr(backend, "noise", None) is not None or getattr(backend, "name", "") == "mixed":
        raise QdiffError(f"metric_tensor(approx=None) is the Fubini-Study metric of a pure "
                         f"state; {backend!r} prepares mixed (noisy) states: use "
                         "approx='block-diag' or 'diag' (generator covariances on the states "
                         "the device prepares)")
    if getattr(backend, "trajectories", None):
        raise QdiffError(f"metric_tensor(approx=None) needs exact states; {backend!r} samples "
                         f"them with trajectories: use approx='block-diag' or 'diag'")
    if not backend.capabilities.backprop or getattr(backend, "shots", None):
        shots = getattr(backend, "shots", None)
        raise QdiffError(f"metric_tensor(approx=None) needs an exact torch-simulated backend; "
                         f"'{getattr(backend, 'name', backend)}'"
                         f"{f' with shots={shots}' if shots else ''} is not one (use "
                         "approx='block-diag', which measures generators)")
    try:
        psi, T = derivative_states(circuit, theta, cols, backend, initial_state)
    except QdiffMemoryError as exc:
        raise QdiffMemoryError(f"metric_tensor(approx=None) propagates one derivative state per "
                               f"gate angle ({len(cols)} of them): {exc}; approx='block-diag' "
                               "needs one state at a time") from None
    with torch.no_grad():
        gram = torch.einsum("bin,bjn->bij", T.conj(), T)
        ov = torch.einsum("bin,bn->bi", T.conj(), psi)
        g = (gram - ov.unsqueeze(-1) * ov.conj().unsqueeze(-2)).real
    return 0.5 * (g + g.transpose(-1, -2))


# ------------------------------------------------------------------------------------------
# block-diagonal metric from generator covariances


def _expand(op):
    """Multi-parameter gates as one-parameter rotations (their Gate record's decomposition),
    where :func:`_splits` says so."""
    return decompose(op) if _splits(op.gate) else [op]


@caches.cached(maxsize=256)
def _splits(gate) -> bool:
    """Whether the metric takes ``gate`` as the pieces of its decomposition. A gate with a
    generator of its own is kept whole, and so is a gate whose decomposition puts one of its
    parameters into several pieces (FermionicSWAP's IsingXY and RZs): the pieces would fall
    into different layers, and the block-diagonal metric would keep each piece's variance but
    drop their covariances, which the gate's own generator holds."""
    if gate.decomposition is None or getattr(gate, "generator", None) is not None:
        return False
    probe = decompose(Operation(gate, tuple(range(gate.num_wires)),
                                tuple(ParamRef(k) for k in range(gate.num_params))))
    slots = [q.index for piece in probe for q in piece.params if isinstance(q, ParamRef)]
    return len(slots) == len(set(slots))


@caches.cached(maxsize=None)
def _generator_terms(gate):
    return pauli_generator_terms(gate)


def generator_observable(op) -> Observable:
    """The generator ``G`` (``U = exp(-i phi G)``) of a one-parameter gate, on its wires."""
    if getattr(op.gate, "generator", None) is None:
        if isinstance(op.gate, Channel):
            raise QdiffError(f"metric_tensor: channel '{op.gate.name}' has a trainable "
                             "parameter; the metric is over unitary gates' angles only (make "
                             "the channel's parameter constant)")
        raise QdiffError(f"metric_tensor: gate '{op.gate.pl_name or op.name}' has no generator; "
                         "use approx=None (full metric on a statevector backend)")
    coeffs, terms = [], []
    for c, word in _generator_terms(op.gate):
        coeffs.append(c)
        terms.append(tuple(Factor((w,), l) for w, l in zip(op.wires, word) if l != "I"))
    return Observable(torch.tensor(coeffs, dtype=torch.float64), terms)


def parametrized_layers(ops, cols):
    """PennyLane's layering: ``[(uses, ancestors)]``, a use = ``(op index, ref)``, ancestors
    the bit mask of the op indices before the layer that it depends on."""
    last: dict = {}
    anc = []
    for i, op in enumerate(ops):
        a = 0
        for w in op.wires:
            if w in last:
                j = last[w]
                a |= anc[j] | (1 << j)
        anc.append(a)
        for w in op.wires:
            last[w] = i
    layers, current, cur_bits = [], [], 0
    for i, op in enumerate(ops):
        refs = [q for q in op.params if isinstance(q, ParamRef) and q.index in cols]
        if not refs:
            continue
        if current and anc[i] & cur_bits:
            layers.append(current)
            current, cur_bits = [], 0
        current.append((i, refs[0]))
        cur_bits |= 1 << i
    if current:
        layers.append(current)
    out = []
    for layer in layers:
        bits = 0
        for i, _ in layer:
            bits |= anc[i]
        out.append((layer, bits))
    return out


def _indices(bits: int) -> list:
    """The set bits of ``bits``, ascending."""
    out = []
    while bits:
        low = bits & -bits
        out.append(low.bit_length() - 1)
        bits ^= low
    return out


def block_metric(circuit, theta, cols, backend, initial_state=None, diag_only=False):
    """Block-diagonal metric ``(B, P, P)`` over theta columns ``cols`` from generator covariances."""
    ops = [e for op in circuit.operations for e in _expand(op)]
    colset = set(cols)
    for op in ops:
        refs = [q for q in op.params if isinstance(q, ParamRef) and q.index in colset]
        if refs and op.gate.num_params != 1:
            raise QdiffError(f"metric_tensor(approx={'diag' if diag_only else 'block-diag'!r}): "
                             f"gate '{op.gate.pl_name or op.name}' "
                             "has several parameters and no known split; use approx=None")
    pos = {c: k for k, c in enumerate(cols)}
    b = theta.shape[0]
    layers = parametrized_layers(ops, colset)
    prefix = sum(bits.bit_count() for _, bits in layers)
    memory.require(8.0 * (prefix + 16 * len(layers))
                   + float(b) * len(cols) ** 2 * theta.element_size(),
                   f"metric_tensor(approx='block-diag'): {len(layers)} layer circuits with "
                   f"{prefix} gates in all and the {b}x{len(cols)}x{len(cols)} metric",
                   theta.device)
    jobs, metas = [], []
    for uses, bits in layers:
        pre = _indices(bits)
        gens = [generator_observable(ops[i]) for i, _ in uses]
        pairs = [(u, v) for u in range(len(uses)) for v in range(u, len(uses))
                 if not diag_only or u == v]
        meas = [Measurement("expval", G) for G in gens] + \
            [Measurement("expval", gens[u] @ gens[v]) for u, v in pairs]
        sub = Circuit(circuit.num_wires, tuple(ops[j] for j in pre), tuple(meas),
                      circuit.num_params, circuit.wire_labels)
        jobs.append(sub)
        metas.append((uses, pairs))
    with torch.no_grad():  # every layer's circuit in one backend call
        results = [r.outputs for r in backend.execute([Job(*route_circuit(sub, theta, backend,
                                                                          initial_state),
                                                           initial_state) for sub in jobs])]
    # covariances are differences of nearby numbers: taken in the results' precision (theta's
    # if higher, float32 at least), not in a float16 theta's
    work = functools.reduce(torch.promote_types, [r.dtype for res in results for r in res],
                            torch.promote_types(theta.dtype, torch.float32))
    g = torch.zeros(b, len(cols), len(cols), dtype=work, device=theta.device)
    for (uses, pairs), res in zip(metas, results):
        k = len(uses)
        mean = torch.stack([r.to(g.device, g.dtype) for r in res[:k]], -1)  # (B, k)
        for (u, v), r in zip(pairs, res[k:]):
            cov = r.to(g.device, g.dtype) - mean[:, u] * mean[:, v]
            (iu, ru), (iv, rv) = uses[u], uses[v]
            a, c = pos[ru.index], pos[rv.index]
            g[:, a, c] += ru.scale * rv.scale * cov
            if (u != v) or (a != c):
                g[:, c, a] += ru.scale * rv.scale * cov
    return g
