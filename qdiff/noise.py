"""``qd.noise``: noise models for the mixed-state engine and the trajectory method.

* ``NoiseModel()`` with ``.add(gate, channel, *params, wires=None)`` ("after gate G on wires W
  insert channel C") and ``.add_readout(wire, p01, p10)``;
* ``from_backend("fake_manila")`` (any fake IBM device), a Qiskit backend, or a
  ``qiskit_aer.noise.NoiseModel``: Aer's gate errors of the device (thermal relaxation from
  T1/T2 and gate times, composed with depolarizing errors) as channels with Aer's Kraus
  operators, and its readout errors;
* ``native(circuit, model)``: whether a circuit already uses only the device's basis gates on
  coupled qubit pairs (wire ``i`` = device qubit ``i``); such a circuit runs as written.
  Any other circuit is laid out, routed and translated first by the compiler's ``--target``
  path (Qiskit's preset pass manager, level 1, on the device qubits ``0..n-1`` the noisy
  device has), so the noise applies to the gates that would really run; measurements follow
  each wire to the physical qubit that holds it at the end (after the routing SWAPs).
  ``prepare(circuit, model)`` returns that routed circuit (:class:`Routing`).

>>> import qdiff as qd
>>> m = qd.noise.NoiseModel().add("cx", qd.DepolarizingChannel, 0.02)
>>> dev = qd.device("mixed", wires=2, noise=m)
>>> @qd.qnode(dev)
... def bell():
...     qd.Hadamard(0); qd.CNOT([0, 1])
...     return qd.purity([0, 1])
>>> round(float(bell()), 6)
0.923143
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Optional

import torch

from qdiff.circuits import caches
from qdiff.circuits.channels import is_channel
from qdiff.circuits.circuit import Circuit, memo
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.noise import NoiseModel, NoiseRule, from_qiskit

__all__ = ["NoiseModel", "NoiseRule", "Routing", "from_backend", "native", "prepare",
           "route_circuit", "routes"]


def from_backend(source, name=None) -> NoiseModel:
    """A :class:`NoiseModel` from a fake IBM device name (``"fake_manila"``), a Qiskit backend,
    or a ``qiskit_aer.noise.NoiseModel`` (see the module)."""
    return from_qiskit(source, name)


def native(circuit, model: NoiseModel) -> bool:
    """Whether ``circuit`` (a :class:`~qdiff.circuits.Circuit`) runs as written on
    ``model``'s device: basis gates only, two-qubit gates on coupled pairs."""
    try:
        model.check_native(circuit)
    except QdiffError:
        return False
    return True


@dataclass(frozen=True)
class Routing:
    """A circuit routed and translated for a noise model's device.

    ``circuit``: on the same number of wires, wire ``i`` = device qubit ``i``, device basis
    gates on coupled pairs only, measurements on the physical qubits that hold each input
    wire at the end; ``initial`` / ``final``: physical qubit of each input wire at the start /
    at the end; ``theta(theta)``: the routed circuit's ``(B, P')`` angle columns computed (in
    torch, differentiably) from the input circuit's ``(B, P)`` ones.
    """

    circuit: Circuit
    initial: tuple
    final: tuple
    columns: tuple            # input column of each parameter of the routed circuit
    imported: object          # the routed QiskitImport (expression columns)

    def theta(self, theta: torch.Tensor) -> torch.Tensor:
        idx = torch.tensor(self.columns, dtype=torch.long, device=theta.device)
        return self.imported.theta(theta[:, idx])

    def trainable(self, trainable) -> tuple:
        """Trainable flag of each routed column from the input circuit's flags."""
        out = [bool(trainable[c]) for c in self.columns]
        exprs = self.imported.expressions
        if exprs is not None:
            where = {p: i for i, p in enumerate(self.imported.parameters)}
            for e in exprs.expressions:
                out.append(any(out[where[p]] for p in e.parameters))
        return tuple(out)


def prepare(circuit: Circuit, model: NoiseModel, layout=None, seed: int = 0) -> Routing:
    """``circuit`` routed and translated for ``model``'s device (see the module); a circuit
    already native to the device (and no ``layout``) comes back unchanged. ``layout``: the
    device qubit of each wire (a permutation of ``0..n-1``)."""
    if model.native is None:
        raise QdiffError(f"noise model '{model.name}' describes no device (basis gates, "
                         "coupling): there is nothing to route for")
    n = circuit.num_wires
    model.check_wires(n)
    lay = model.check_layout(layout, n)
    return memo(circuit, ("noise.route", model.name, model.native, lay, int(seed)),
                lambda: _prepare(circuit, model, lay, int(seed)))


def _prepare(circuit: Circuit, model: NoiseModel, lay, seed: int) -> Routing:
    n = circuit.num_wires
    ident = tuple(range(n))
    if lay is None and native(circuit, model):
        return Routing(circuit, ident, ident, tuple(range(circuit.num_params)), _Plain())
    for op in circuit.operations:
        if is_channel(op.gate):
            raise QdiffError(f"channel '{op.gate.name}' on wires {list(op.wires)}: a circuit "
                             f"with channels is not routed for {model.name}; write it in the "
                             f"device's basis on coupled pairs, or leave the channels to the "
                             "noise model")
    for m in circuit.measurements:
        if m.kind == "state":
            raise QdiffError(f"state() of a circuit routed for {model.name}: the routed "
                             "circuit's state is of the physical qubits; return density_matrix "
                             "or probs of given wires")
    ops_key = tuple((op.gate, op.wires, op.params) for op in circuit.operations)
    target = model.device if model.device is not None else model.name
    args = (ops_key, n, circuit.num_params, model.name, lay, seed, target)
    try:
        hash(ops_key)
    except TypeError:  # tensor angles: no structural cache
        core = _route_ops.__wrapped__(*args)
    else:
        core = _route_ops(*args)
    phys, columns, imp, initial, final = core
    mapping = dict(zip(range(n), final))
    ms = []
    for m in circuit.measurements:
        if m.wires is None and m.obs is None:
            m = replace(m, wires=ident)
        ms.append(m.map_wires(mapping))
    out = Circuit(n, phys, tuple(ms), imp.circuit.num_params, circuit.wire_labels)
    model.check_native(out)
    return Routing(out, initial, final, columns, imp)


@caches.cached(maxsize=64)
def _route_ops(ops_key, n: int, num_params: int, name: str, lay, seed: int, target) -> tuple:
    """The routed operations of a circuit's operations (by structure: the transpiler runs
    once per structure), its parameter columns, the import, initial and final layouts.
    ``target``: the Qiskit backend, or a device name; ``name`` names it in errors."""
    from qdiff.circuits.operation import Operation
    from qdiff.compiler.target import route
    bare = Circuit(n, tuple(Operation(g, w, p) for g, w, p in ops_key), (), num_params)
    try:
        routed = route(SimpleNamespace(circuit=bare, measurements=[], num_clbits=0),
                       target, seed, num_qubits=n, initial_layout=lay)
    except QdiffError:
        raise
    except Exception as exc:  # noqa: BLE001 - Qiskit's transpiler errors
        raise QdiffError(f"the circuit cannot be routed on {name}'s qubits 0..{n - 1}: "
                         f"{type(exc).__name__}: {exc}") from None
    phys = routed.expand(routed.circuit)
    if any(w >= n for o in phys.operations for w in o.wires):
        raise QdiffError(f"routing for {name} used qubits outside 0..{n - 1}")
    imp = routed.imported
    columns = tuple(_column_of(p) for p in imp.parameters)
    return (phys.operations, columns, imp, tuple(int(q) for q in routed.initial),
            tuple(int(q) for q in routed.final))


def _column_of(p) -> int:
    if getattr(p, "vector", None) is None or p.vector.name != "theta":
        raise QdiffError(f"routing: unexpected parameter {p} in the routed circuit")
    return int(p.index)


class _Plain:
    """The identity column map of a circuit that runs as written."""

    expressions = None
    parameters = ()

    @staticmethod
    def theta(values):
        return values


def routes(backend) -> bool:
    """Whether ``backend`` carries a device noise model (basis gates and coupling), so that
    circuits not native to the device are routed before they run on it."""
    return getattr(getattr(backend, "noise", None), "native", None) is not None


def routing_for(circuit: Circuit, backend, initial_state=None) -> Optional[Routing]:
    """The :class:`Routing` of ``circuit`` on ``backend`` (its noise model's device, its
    ``layout``), or ``None`` when the circuit runs as written (no device noise model, or a
    circuit already native to the device and no layout)."""
    if not routes(backend):
        return None
    model = backend.noise
    layout = getattr(backend, "layout", None)
    if circuit.num_wires != backend.num_wires:
        return None  # the caller reports the mismatch
    if layout is None and native(circuit, model):
        return None
    if initial_state is not None:
        raise QdiffError(f"a state preparation in a circuit that must be routed for "
                         f"{model.name} is not supported; prepare the state with gates")
    return prepare(circuit, model, layout)


def route_circuit(circuit: Circuit, theta: torch.Tensor, backend, initial_state=None) -> tuple:
    """``(circuit, theta)`` as they run on ``backend``: routed and translated for its noise
    model's device (``theta`` mapped to the routed circuit's columns, differentiably), or
    unchanged. Every direct engine call of the core goes through this (or
    :func:`route_recorded`), so device noise always acts on the gates the device would run."""
    r = routing_for(circuit, backend, initial_state)
    return (circuit, theta) if r is None else (r.circuit, r.theta(theta))


def route_recorded(recorded, backend):
    """``recorded`` as it runs on ``backend``: routed for its noise model's device when the
    circuit is not native to it, unchanged otherwise."""
    r = routing_for(recorded.circuit, backend, recorded.initial_state)
    if r is None:
        return recorded
    return replace(recorded, circuit=r.circuit, theta=r.theta(recorded.theta),
                   trainable=r.trainable(recorded.trainable), shared=None)
