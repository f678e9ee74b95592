"""``--target``: layout and routing by Qiskit's preset pass manager for an IBM device.

Device names are those ``qd.device("ibm", backend=NAME)`` accepts: every fake device
qiskit-ibm-runtime ships (offline), and real device names when an IBM Quantum account is
configured; a real name without an account is an error that names the fake twin.

The routed circuit is compressed to the physical qubits it uses (so it can be verified and
optimized like any small circuit); qdiff then optimizes it in the device basis, respecting the
device's coupling (passes never put a two-qubit gate on a new pair) and gate directions, and
``Routed.expand`` maps the result back onto the device's qubits.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

from qdiff.circuits import caches
from qdiff.circuits.circuit import Circuit
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.operation import Operation, ParamRef
from qdiff.compiler.basis import Basis, parse_basis
from qdiff.compiler.ops import matrix
from qdiff.compiler.synth import from_qiskit_ops, guarded


@dataclass
class Routed:
    name: str
    circuit: Circuit          # on the active qubits 0..m-1
    physical: tuple           # physical qubit of each active wire
    num_physical: int
    basis: Basis
    allowed: frozenset        # (a, b) pairs (active indices) the two-qubit gate may act on
    measurements: list        # [(physical qubit, clbit)]
    num_clbits: int
    imported: object = None   # the routed circuit as imported (theta columns, expressions)
    final: tuple = ()         # physical qubit holding each input wire's state at the end
    initial: tuple = ()       # physical qubit of each input wire at the start
    barriers: tuple = ()      # physical qubits of each barrier of ``circuit``, idle ones too

    def expand(self, c: Circuit) -> Circuit:
        """``c`` (on the active qubits, its barriers those of ``circuit`` in order, moved or
        not) on the device's qubits."""
        ops = tuple(Operation(o.gate, tuple(self.physical[w] for w in o.wires), o.params)
                    for o in c.operations)
        if len(c.barriers) == len(self.barriers):
            fences = tuple((pos, wires) for (pos, _), wires in zip(c.barriers, self.barriers))
        else:
            fences = tuple((pos, tuple(self.physical[w] for w in wires))
                           for pos, wires in c.barriers)
        return Circuit(self.num_physical, ops, c.measurements, c.num_params, None, fences)


@caches.cached(maxsize=1)
def _fake_table() -> dict:
    """Every fake device qiskit-ibm-runtime ships, by name -- the same table
    ``qd.device("ibm", backend=...)`` reads (one device namespace)."""
    import warnings
    from qiskit_ibm_runtime.fake_provider import FakeProviderForBackendV2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # some fakes warn about made-up error values
        return {b.name: b for b in FakeProviderForBackendV2().backends()}


def target_names() -> list:
    """The offline target names (``fake_manila``, ...); real device names need an account."""
    return sorted(_fake_table())


def device_backend(name):
    """The Qiskit backend for ``--target NAME``: a fake device offline, or a real one through
    the configured IBM Quantum account (never a fake silently standing in for a real one)."""
    if not isinstance(name, str):
        return name
    table = _fake_table()
    key = name.lower()
    if key in table:
        return table[key]
    twin = "fake_" + key.removeprefix("ibm_")
    if twin not in table and not key.startswith("ibm_"):
        close = difflib.get_close_matches(key, table, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise QdiffError(f"unknown target device '{name}'{hint} (offline devices: "
                         f"{', '.join(target_names())}; real ones need an IBM Quantum account)")
    return _real_backend(name, twin if twin in table else None)


def _real_backend(name: str, twin):
    import os
    from qiskit_ibm_runtime import QiskitRuntimeService
    from qdiff.circuits.errors import register_secret
    suggest = f"; its offline twin is '{twin}' (--target {twin})" if twin else ""
    kwargs = {k: os.environ[e] for k, e in (("token", "QISKIT_IBM_TOKEN"),
                                           ("instance", "QISKIT_IBM_INSTANCE"),
                                           ("channel", "QISKIT_IBM_CHANNEL")) if os.environ.get(e)}
    try:
        service = QiskitRuntimeService(**kwargs)
    except Exception as exc:  # noqa: BLE001 - its text may quote the request, and so the token
        detail = type(exc).__name__
    else:
        detail = None
        # a saved account's token is as secret as QISKIT_IBM_TOKEN: scrubbed from messages
        register_secret(getattr(getattr(service, "_account", None), "token", None))
    if detail == "AccountNotFoundError" or (detail is not None and "token" not in kwargs):
        raise QdiffError(f"target '{name}' is a real IBM device and no IBM Quantum account is "
                         f"configured (set QISKIT_IBM_TOKEN or save an account){suggest}")
    if detail is not None:
        raise QdiffError(f"target '{name}': IBM Quantum did not accept the account "
                         f"(QISKIT_IBM_TOKEN invalid or expired, wrong instance or channel, or "
                         f"the service is unreachable: {detail}){suggest}")
    try:
        return service.backend(name)
    except Exception as exc:  # noqa: BLE001
        detail = type(exc).__name__  # (its text may quote the request, and so the token)
    raise QdiffError(f"target '{name}': the IBM Quantum account has no such device "
                     f"({detail}){suggest}")


def route(imp, name: str, seed: int = 0, num_qubits=None, initial_layout=None,
          one_two_qubit_gate: bool = False, input_columns: bool = False) -> Routed:
    """Lay out, route and translate ``imp.circuit`` for device ``name`` by Qiskit's preset
    pass manager (level 1). ``num_qubits``: use only the device's qubits ``0..num_qubits-1``
    (their coupling); ``initial_layout``: the physical qubit of each input wire;
    ``one_two_qubit_gate``: refuse a device that couples some pairs by another two-qubit gate
    than the basis's (the compiler writes that one gate on every pair); ``input_columns``: the
    routed angles on the input's theta columns (the compiler's output keeps the input's
    parameters), else on the routed import's own columns (``Routed.imported`` maps them)."""
    import warnings
    from qiskit.transpiler import generate_preset_pass_manager
    from qdiff.circuits.qiskit_io import from_qiskit, to_qiskit
    backend = device_backend(name)
    if imp.circuit.num_wires > backend.num_qubits:
        raise QdiffError(f"target '{name}' has {backend.num_qubits} qubits; the circuit has "
                         f"{imp.circuit.num_wires}")
    basis = parse_basis([n for n in backend.target.operation_names if n in _KNOWN])
    if one_two_qubit_gate:
        _check_two_qubit_gate(backend, basis, name, num_qubits)
    qc = to_qiskit(imp.circuit)
    if imp.measurements:
        from qiskit import ClassicalRegister
        creg = ClassicalRegister(max(imp.num_clbits, 1 + max(c for _, c in imp.measurements)))
        qc.add_register(creg)
        for q, c in imp.measurements:
            qc.measure(q, creg[c])
    extra = {"backend": backend}
    if num_qubits is not None and num_qubits < backend.num_qubits:
        # the device's qubits 0..num_qubits-1 only: their coupling and the device's basis
        # (with the whole backend, the noise-aware layout may move to other qubits)
        extra = {"coupling_map": backend.coupling_map.reduce(list(range(num_qubits))),
                 "basis_gates": [g for g in backend.operation_names if g not in _CONTROL]}
    if initial_layout is not None:
        extra["initial_layout"] = list(initial_layout)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = generate_preset_pass_manager(optimization_level=1, seed_transpiler=seed, **extra)
        out = pm.run(qc)
    r = from_qiskit(out, dynamic=False)
    ops = _input_columns(r, imp, backend.name) if input_columns else r.circuit.operations
    k = imp.circuit.num_wires
    final = tuple(out.layout.final_index_layout()) if out.layout is not None else tuple(range(k))
    initial = tuple(out.layout.initial_index_layout()[:k]) if out.layout is not None else \
        tuple(range(k))
    used = sorted({w for o in r.circuit.operations for w in o.wires} |
                  {q for q, _ in r.measurements})
    loc = {p: i for i, p in enumerate(used)}
    ops = tuple(Operation(o.gate, tuple(loc[w] for w in o.wires), o.params) for o in ops)
    allowed = frozenset((loc[a], loc[b]) for a, b in backend.target[basis.two_q].keys()
                        if a in loc and b in loc)
    # each barrier on its active qubits (none: it still splits the circuit); expand writes it
    # on all of its device qubits, idle ones included, as Qiskit's transpiler does
    barriers = tuple((pos, tuple(loc[w] for w in wires if w in loc))
                     for pos, wires in r.circuit.barriers)
    circuit = Circuit(len(used), ops, (), imp.circuit.num_params if input_columns else
                      r.circuit.num_params, None, barriers)
    return Routed(backend.name, circuit, tuple(used),
                  r.circuit.num_wires, basis, allowed, list(r.measurements), r.num_clbits, r,
                  final, initial, tuple(wires for _, wires in r.circuit.barriers))


def _input_columns(r, imp, name: str) -> list:
    """The routed circuit's operations with their angles on the input's theta columns.

    The routed circuit's own columns are the parameters Qiskit's output still holds, in its
    order (those its gates no longer use are gone), then any angle expression its translation
    made of several parameters; each parameter ``theta[i]`` is the input's column ``i``. An
    angle that is no affine function of one input column has no ``ParamRef``: refused, naming
    the gate and the expression."""
    cols = [p.index for p in r.parameters]
    exprs = r.columns()[len(cols):]

    def angle(p, o):
        if not isinstance(p, ParamRef):
            return p
        if p.index < len(cols):
            return ParamRef(cols[p.index], p.scale, p.offset)
        expr = _named(exprs[p.index - len(cols)], imp)
        raise QdiffError(f"target '{name}': the device's translation writes gate '{o.name}' "
                         f"with the angle {p.scale:g} * ({expr}) + {p.offset:g}, which is not "
                         f"affine in one parameter; bind the parameters or compile without "
                         f"a target")

    return [Operation(o.gate, o.wires, tuple(angle(p, o) for p in o.params))
            for o in r.circuit.operations]


def _named(expr, imp) -> str:
    """``expr`` (of the ``theta[i]`` column symbols) written with the input's own parameters
    and angle expressions where it has them."""
    columns = imp.columns() if hasattr(imp, "columns") else []
    try:
        for p in expr.parameters:
            if p.index < len(columns):
                expr = expr.subs({p: columns[p.index]}) if hasattr(columns[p.index], "name") \
                    else expr.assign(p, columns[p.index])
    except Exception:  # noqa: BLE001 - the message then names the column symbols
        pass
    return str(expr)


def _check_two_qubit_gate(backend, basis: Basis, name: str, num_qubits=None) -> None:
    """Refuse a device whose coupled pairs do not all carry the basis's two-qubit gate (one
    way or the other): the output writes that one gate on every pair."""
    width = backend.num_qubits if num_qubits is None else num_qubits
    native = {frozenset(q) for q in backend.target[basis.two_q].keys() or ()
              if q is not None and len(q) == 2}
    other: dict = {}
    for gate in backend.target.operation_names:
        for q in backend.target[gate].keys() or ():
            if q is not None and len(q) == 2 and max(q) < width and frozenset(q) not in native:
                other.setdefault(gate, set()).add(frozenset(q))
    if other:
        found = ", ".join(f"{g} on {len(p)} pair(s) such as {sorted(next(iter(p)))}"
                          for g, p in sorted(other.items()))
        raise QdiffError(f"target '{name}' couples qubits by more than one two-qubit gate "
                         f"({basis.two_q} on {len(native)} pairs; {found} without "
                         f"{basis.two_q}); the compiler writes one two-qubit gate per device")


_CONTROL = {"if_else", "for_loop", "switch_case", "while_loop", "delay", "reset", "measure"}
_KNOWN = {"cx", "cz", "ecr", "rz", "sx", "x", "u", "u3", "p", "u1", "u2", "rx", "ry", "h"}


def fix_directions(c: Circuit, routed: Routed, basis: Basis) -> Circuit:
    """Re-orient two-qubit gates the device only supports the other way round."""
    out = []
    for o in c.operations:
        if len(o.wires) == 2 and o.wires not in routed.allowed:
            a, b = o.wires
            if (b, a) not in routed.allowed:
                raise QdiffError(f"target {routed.name}: no {basis.two_q} between physical "
                                 f"qubits {routed.physical[a]} and {routed.physical[b]}")
            out.extend(_oriented(o, (a, b), basis))
        else:
            out.append(o)
    return c.with_operations(out)


def _oriented(o, wires, basis: Basis) -> list:
    """``o`` re-synthesized with the basis gate acting on ``(wires[1], wires[0])``."""
    # Qiskit puts its basis gate on (qubit 0, qubit 1), which from_qiskit_ops maps to (b, a)
    return from_qiskit_ops(guarded(_decomposer(basis.two_q), matrix(o)), wires)


@caches.cached(maxsize=4)
def _decomposer(two_q: str):
    from qiskit.circuit.library import CXGate, CZGate, ECRGate
    from qiskit.synthesis import TwoQubitBasisDecomposer
    gate = {"cx": CXGate(), "cz": CZGate(), "ecr": ECRGate()}[two_q]
    return TwoQubitBasisDecomposer(gate, euler_basis="ZSXX")
