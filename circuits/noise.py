"""Noise models: rules "after gate G on wires W insert channel C", plus readout errors.

A :class:`NoiseModel` rewrites a circuit (its channels become ordinary operations, so the
mixed engine and the trajectory method see one circuit) and carries per-wire readout confusion
matrices ``M[measured, prepared]``. :func:`from_qiskit` converts an IBM device (a fake device
name, any Qiskit backend) or a ``qiskit_aer.noise.NoiseModel``: each gate error Aer derives
(thermal relaxation from T1/T2 and the gate time, composed with the depolarizing part of the
reported gate error) becomes a channel on the gate's wires with Aer's own Kraus operators, and
each readout error a confusion matrix. Wire ``i`` is the device's qubit ``i``; a model from a
device also knows its basis gates and coupled pairs (``native``); a circuit that uses other
gates or pairs is routed and translated on the qdiff side before it reaches an engine
(:func:`qdiff.noise.prepare`), and an engine handed one directly refuses it with a message
that names the gate.

>>> import qdiff as qd
>>> from qdiff.circuits.circuit import Circuit
>>> from qdiff.circuits.operation import Operation
>>> m = NoiseModel().add("cx", qd.DepolarizingChannel, 0.01)
>>> c = Circuit(2, (Operation(qd.get_gate("cx"), (0, 1)),))
>>> [op.name for op in m.apply(c).operations]
['cx', 'DepolarizingChannel', 'DepolarizingChannel']
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from qdiff.circuits.channels import PauliError, QubitChannel, is_channel, \
    pauli_error_channel, qubit_channel
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.operation import Operation


#: gates made per width, word or matrix (no one registry record): a rule names the family and
#: matches every instance (a multi-wire channel must then fit each instance's width)
_FAMILIES = {**{n: n for n in ("paulirot", "multirz", "pcphase", "unitary")},
             "PauliRot": "paulirot", "MultiRZ": "multirz", "PCPhase": "pcphase",
             "QubitUnitary": "unitary"}

#: Qiskit instruction names that are the same gate as an IR gate under another spelling
#: (Qiskit's u1 is imported as p, u as u3, cu1 as cp): a device whose basis has one runs the
#: other as it, with its errors (a routed circuit's u1 gates come back as p)
_SAME_AS = {"p": ("u1",), "u1": ("p",), "u3": ("u",), "cp": ("cu1",)}


def _qiskit_names(gate) -> tuple:
    """The Qiskit instruction names ``gate`` (an IR gate record) runs as on a device."""
    qn = gate.qiskit_name or gate.name
    return (qn,) + _SAME_AS.get(gate.name, ())


def _in_basis(gate, basis) -> bool:
    return any(q in basis for q in _qiskit_names(gate))


@dataclass(frozen=True)
class NoiseRule:
    """After gate ``gate`` (IR name, ``"*"``: every gate) on exactly ``wires`` (``None``: any
    wires), insert ``channel`` with ``params``: on each wire of the gate (a one-wire channel)
    or on the gate's wires (a channel of as many wires)."""

    gate: str
    wires: Optional[tuple]
    channel: object
    params: tuple = ()
    fallback: bool = False  # applies only where no other rule of the gate matches (Aer's
    #                         all-qubit errors, which a qubit's own error replaces)

    def matches(self, op) -> bool:
        return (self.gate == "*" or op.gate.name == self.gate) and \
            (self.wires is None or tuple(op.wires) == self.wires)

    def operations(self, op) -> list:
        k = self.channel.num_wires
        if k == 1:
            return [Operation(self.channel, (w,), self.params) for w in op.wires]
        if k == len(op.wires):
            return [Operation(self.channel, tuple(op.wires), self.params)]
        raise QdiffError(f"noise rule: channel '{self.channel.name}' acts on {k} wires but gate "
                         f"'{op.gate.name}' on wires {list(op.wires)} has {len(op.wires)}")


def _wire(w, what: str) -> int:
    """A wire index of a noise model: a non-negative integer (a device qubit)."""
    if isinstance(w, bool) or not isinstance(w, numbers.Integral) or w < 0:
        raise QdiffError(f"{what}: wire {w!r} is not a non-negative integer (noise models "
                         "address wires by index: wire i is the device's qubit i)")
    return int(w)


@dataclass
class NoiseModel:
    """Rules of gate noise and per-wire readout errors.

    ``native``: ``(basis gate names, coupled pairs)`` of a device, or ``None`` (any circuit);
    ``device``: the Qiskit backend a model made from one describes (circuits not native to it
    are routed on it).
    """

    rules: list = field(default_factory=list)
    readout: dict = field(default_factory=dict)
    readout_default: Optional[torch.Tensor] = None  # every wire without its own readout error
    name: str = "custom"
    native: Optional[tuple] = None
    num_qubits: Optional[int] = None
    device: Any = field(default=None, repr=False, compare=False)  # the Qiskit backend described
    basis: Optional[frozenset] = None  # a converted Aer model's basis gates (Qiskit names)

    def add(self, gate, channel, *params, wires=None) -> "NoiseModel":
        """After every ``gate`` (OpenQASM or PennyLane name like ``"cx"`` or ``"CNOT"``, or a
        gate such as ``qd.CNOT``; ``"*"`` for all) on ``wires`` (``None``: anywhere), insert
        ``channel`` with ``params``. Returns the model (calls chain)."""
        name = gate if isinstance(gate, str) else getattr(gate, "name", None)
        if not isinstance(name, str) and callable(gate):  # qd.PauliRot, qd.MultiRZ, ...
            name = getattr(gate, "__name__", None)
        if not isinstance(name, str):
            raise QdiffError(f"noise rule: gate must be a name or a gate; got {gate!r}")
        family = _FAMILIES.get(name)  # a gate made per width or word: any of its instances
        if family is not None:
            name = family
        elif name != "*":  # an OpenQASM or PennyLane name ("cx", "CNOT"): the gate's IR name
            from qdiff.circuits.gates import get_gate
            try:
                name = get_gate(name).name
            except QdiffError:
                raise QdiffError(f"noise rule: unknown gate '{name}'") from None
        if channel is PauliError:   # add("cx", qd.PauliError, "XX", p): the word, then p
            if not params:
                raise QdiffError("noise rule: PauliError takes the Pauli word and p")
            channel, params = pauli_error_channel(params[0]), params[1:]
        elif channel is QubitChannel:  # add("x", qd.QubitChannel, kraus_matrices)
            if len(params) != 1:
                raise QdiffError("noise rule: QubitChannel takes one list of Kraus matrices")
            channel, params = qubit_channel(params[0]), ()
        if not is_channel(channel):
            raise QdiffError(f"noise rule: {channel!r} is not a channel (qd.DepolarizingChannel, "
                             "qd.AmplitudeDamping, ...)")
        if len(params) != channel.num_params:
            raise QdiffError(f"noise rule: channel '{channel.name}' takes {channel.num_params} "
                             f"parameter(s) {list(channel.param_names)}; got {len(params)}")
        for i, p in enumerate(params):
            if not isinstance(p, numbers.Real) or isinstance(p, bool):
                raise QdiffError(f"noise rule: channel '{channel.name}' parameter "
                                 f"{channel.param_names[i]} must be a number; got {p!r}")
        channel.check([float(p) for p in params])
        if name != "*" and family is None:
            from qdiff.circuits.gates import GATES
            if channel.num_wires not in (1, GATES[name].num_wires):
                raise QdiffError(f"noise rule: channel '{channel.name}' acts on "
                                 f"{channel.num_wires} wires but gate '{name}' on "
                                 f"{GATES[name].num_wires}")
        ws = None if wires is None else tuple(_wire(w, f"noise rule for '{name}'") for w in (
            [wires] if isinstance(wires, numbers.Integral) or not hasattr(wires, "__iter__")
            else wires))
        if ws is not None and name != "*":
            from qdiff.circuits.gates import GATES
            k = len(ws) if family is not None else GATES[name].num_wires
            if len(ws) != k or len(set(ws)) != k:
                raise QdiffError(f"noise rule for '{name}': wires {list(ws)} do not name the "
                                 f"{k} distinct wire(s) of a '{name}' gate, so it would never "
                                 "match")
        self.rules.append(NoiseRule(name, ws, channel, tuple(float(p) for p in params)))
        return self

    def add_readout(self, wire: int, p01: float, p10: float) -> "NoiseModel":
        """Readout error of ``wire``: ``p01`` = P(read 1 | prepared 0), ``p10`` = P(read 0 |
        prepared 1)."""
        wire = _wire(wire, "readout error")
        for nm, p in (("p01", p01), ("p10", p10)):
            if not isinstance(p, numbers.Real) or isinstance(p, bool) or not 0 <= p <= 1:
                raise QdiffError(f"readout error of wire {wire}: {nm}={p!r} is not a probability "
                                 "in [0, 1]")
        self.readout[wire] = torch.tensor([[1 - p01, p10], [p01, 1 - p10]],
                                               dtype=torch.float64)
        return self

    def readout_probs(self, p: torch.Tensor, wires) -> torch.Tensor:
        """Outcome probabilities ``p`` ``(B, 2**k)`` of ``wires`` seen through each wire's
        confusion matrix."""
        wires = list(wires)
        if self.readout_default is None and not any(w in self.readout for w in wires):
            return p
        k = len(wires)
        t = p.reshape(p.shape[0], *([2] * k))
        for i, w in enumerate(wires):
            m = self.readout.get(w, self.readout_default)
            if m is not None:
                m = m.to(device=p.device, dtype=p.dtype)
                t = torch.movedim(torch.tensordot(t, m, dims=([1 + i], [1])), -1, 1 + i)
        return t.reshape(p.shape)

    def check_wires(self, n: int) -> None:
        """Refuse a device of ``n`` wires larger than the model's device."""
        if self.num_qubits is not None and n > self.num_qubits:
            raise QdiffError(f"noise model '{self.name}' describes {self.num_qubits} qubits; the "
                             f"device has {n} wires")

    def check_layout(self, layout, n: int):
        """``layout`` (the device qubit of each of ``n`` wires: a permutation of
        ``0..n-1``) as a tuple; ``None`` stays ``None``."""
        if layout is None:
            return None
        if self.native is None:
            raise QdiffError(f"layout={layout!r}: noise model '{self.name}' describes no device "
                             "to lay the wires out on")
        try:
            lay = tuple(int(q) for q in layout)
        except (TypeError, ValueError):
            raise QdiffError(f"layout must be a list of device qubits, one per wire; got "
                             f"{layout!r}") from None
        if len(lay) != n or len(set(lay)) != n or any(not 0 <= q < n for q in lay):
            raise QdiffError(f"layout {layout!r}: give {n} distinct device qubits among "
                             f"0..{n - 1}, one per wire (the device uses {self.name}'s qubits "
                             f"0..{n - 1})")
        return lay

    def check_native(self, circuit) -> None:
        """Refuse gates outside the device's basis and two-qubit gates on uncoupled pairs."""
        if self.native is None:
            return
        basis, pairs = self.native
        for op in circuit.operations:
            if is_channel(op.gate):
                continue
            if not _in_basis(op.gate, basis):
                raise QdiffError(f"gate '{op.gate.pl_name or op.name}' on wires {list(op.wires)} "
                                 f"is not a basis gate of {self.name} ({', '.join(sorted(basis))}"
                                 f"); route and translate the circuit first "
                                 f"(qd.noise.prepare or qd.compile(..., target='{self.name}'))")
            if len(op.wires) == 2 and tuple(op.wires) not in pairs:
                raise QdiffError(f"gate '{op.gate.pl_name or op.name}' on wires "
                                 f"{list(op.wires)}: the qubits are not coupled on {self.name}; "
                                 f"route the circuit first (qd.noise.prepare or "
                                 f"qd.compile(..., target='{self.name}'))")

    def apply(self, circuit):
        """``circuit`` with the channels of every matching rule after each gate (remembered
        per circuit for the model's current rules and device: the key is their content, so a
        changed rule, or another model, never reuses a circuit made for different noise)."""
        from qdiff.circuits.circuit import memo
        key = ("noise", tuple(self.rules), self.native, self.basis)
        return memo(circuit, key, lambda: self._apply(circuit))

    def check_basis(self, circuit) -> None:
        """A model converted from a ``qiskit_aer`` NoiseModel without a device: refuse a gate
        outside its basis gates whose translation into them would pass through noisy basis
        gates (Aer translates circuits into the basis before adding noise; run as it is, the
        gate would be noiseless here: a different answer without a word)."""
        if self.basis is None or self.native is not None:
            return
        from qdiff.circuits.gates import GATES
        noisy = {r.gate for r in self.rules}
        noisy1 = {g for g in noisy if g in GATES and GATES[g].num_wires == 1}
        for op in circuit.operations:
            if is_channel(op.gate) or (op.gate.qiskit_name or op.gate.name) in self.basis:
                continue
            if any(r.matches(op) for r in self.rules):
                continue  # a rule of its own: noise where it is
            if (noisy1 if len(op.wires) == 1 else noisy):
                raise QdiffError(
                    f"gate '{op.gate.pl_name or op.name}' on wires {list(op.wires)} is not "
                    f"one of the noise model's basis gates ({', '.join(sorted(self.basis))}), "
                    "which Aer translates circuits into before adding their noise; translate "
                    f"the circuit first (qd.compile(circuit, basis="
                    f"'{','.join(sorted(self.basis))}')) or give the gate a rule of its own")

    def _apply(self, circuit):
        self.check_native(circuit)
        self.check_basis(circuit)
        ops = []
        for op in circuit.operations:
            ops.append(op)
            if is_channel(op.gate):
                continue
            rules = [r for r in self.rules if r.matches(op)]
            if any(not r.fallback for r in rules if r.gate == op.gate.name):
                rules = [r for r in rules if not r.fallback]
            for rule in rules:
                ops.extend(rule.operations(op))
        return circuit.with_operations(ops)


# ---------------------------------------------------------------------------------------------
# conversion from Qiskit


def _fake(name: str):
    import difflib
    import warnings
    from qiskit_ibm_runtime.fake_provider import FakeProviderForBackendV2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = {b.name: b for b in FakeProviderForBackendV2().backends()}
    key = name.lower()
    if key not in table:
        close = difflib.get_close_matches(key, table, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise QdiffError(f"unknown fake IBM device '{name}'{hint}")
    return table[key]


def _channel_of(error) -> object:
    """A constant channel with Aer's Kraus operators of ``error`` (a QuantumError) on the
    error's qubits in their order: Qiskit's matrices have the first qubit as the least
    significant bit, qdiff's as the most significant, so the bit order is reversed."""
    from qiskit.quantum_info import Kraus
    ks = np.asarray(Kraus(error).data)
    k = int(round(np.log2(ks.shape[-1])))
    t = ks.reshape(ks.shape[0], *([2] * (2 * k)))
    rev = [0] + [k - i for i in range(k)] + [2 * k - i for i in range(k)]
    ks = t.transpose(rev).reshape(ks.shape)
    return qubit_channel(ks, atol=1e-8)


def _measure_matrix(qubits, error) -> torch.Tensor:
    """The confusion matrix ``[outcome, prepared]`` of a quantum error Aer applies before
    measuring one qubit: exact for the outcomes when the error maps populations to
    populations (Pauli, reset, damping errors); any other is refused."""
    from qiskit.quantum_info import Kraus
    where = "all qubits" if qubits is None else f"qubits {list(qubits)}"
    ks = np.asarray(Kraus(error).data)                              # (K, d, d)
    if ks.shape[-1] != 2:
        raise QdiffError(f"noise: the error on 'measure' of {where} acts on several qubits; "
                         "it is not converted")
    mixing = np.einsum("kij,kil->ijl", ks, ks.conj())               # [out, in j, in l]
    if abs(mixing[:, 0, 1]).max() > 1e-10:
        raise QdiffError(f"noise: the error on 'measure' of {where} turns coherences into "
                         "outcome probabilities; only errors that map populations to "
                         "populations (Pauli, reset, damping) are converted")
    return torch.tensor(np.einsum("ijj->ij", mixing).real, dtype=torch.float64)


def _readout_of(ro) -> torch.Tensor:
    if ro.number_of_qubits != 1:
        raise QdiffError("noise: correlated readout errors are not converted")
    p = np.asarray(ro.probabilities, dtype=float)      # [prepared, measured]
    return torch.tensor(p.T, dtype=torch.float64)


def _readouts(model: NoiseModel, aer) -> None:
    """Each qubit's confusion matrix ``[read, prepared]``: its readout error after the quantum
    error Aer applies on 'measure' (each a qubit's own, else the all-qubit one)."""
    ro = {int(q[0]) if len(q) == 1 else q: _readout_of(e)
          for q, e in getattr(aer, "_local_readout_errors", {}).items()}
    me = {int(q[0]) if len(q) == 1 else q: _measure_matrix(q, e)
          for q, e in getattr(aer, "_local_quantum_errors", {}).get("measure", {}).items()}
    dro = getattr(aer, "_default_readout_error", None)
    dro = None if dro is None else _readout_of(dro)
    dme = getattr(aer, "_default_quantum_errors", {}).get("measure")
    dme = None if dme is None else _measure_matrix(None, dme)
    eye = torch.eye(2, dtype=torch.float64)
    for w in set(ro) | set(me):
        model.readout[w] = ro.get(w, eye if dro is None else dro) @ \
            me.get(w, eye if dme is None else dme)
    if dro is not None or dme is not None:
        model.readout_default = (eye if dro is None else dro) @ (eye if dme is None else dme)


def _noisy_gates(names: set, device: bool) -> dict:
    """IR gate names of the gates that carry the errors of each Qiskit instruction name in
    ``names``: the gate of that name, and on a device (whose basis decides what runs) a gate
    of another spelling (an imported ``u1`` is ``p``) unless the model gives errors of its own
    to that spelling."""
    from qdiff.circuits.gates import GATES
    out: dict = {}
    for g in GATES.values():
        primary = g.qiskit_name or g.name
        if primary in names:
            out.setdefault(primary, []).append(g.name)
            continue
        alias = next((a for a in _SAME_AS.get(g.name, ()) if a in names), None) if device \
            else ("u" if g.name == "u3" and "u" in names else None)  # Qiskit's U is U3
        if alias is not None:
            out.setdefault(alias, []).append(g.name)
    return out


def from_qiskit(source, name: Optional[str] = None) -> NoiseModel:
    """A :class:`NoiseModel` from a fake device name (``"fake_manila"``), a Qiskit backend or
    a ``qiskit_aer.noise.NoiseModel``."""
    from qiskit_aer.noise import NoiseModel as AerNoiseModel
    backend = None
    if isinstance(source, str):
        backend = _fake(source)
    elif not isinstance(source, AerNoiseModel):
        if not hasattr(source, "target") and not hasattr(source, "properties"):
            raise QdiffError(f"noise: expected a device name, a Qiskit backend or a "
                             f"qiskit_aer NoiseModel; got {type(source).__name__}")
        backend = source
    aer = AerNoiseModel.from_backend(backend) if backend is not None else source
    label = name or (backend.name if backend is not None else "aer_noise_model")
    model = NoiseModel(name=label)
    errors = getattr(aer, "_local_quantum_errors", {})
    defaults = getattr(aer, "_default_quantum_errors", {})
    gates = _noisy_gates(set(errors) | set(defaults), backend is not None)
    for gname, per_qubits in errors.items():
        for ir in gates.get(gname, ()):  # none: reset, delay, measure (below)
            for qubits, err in per_qubits.items():
                model.rules.append(NoiseRule(ir, tuple(qubits), _channel_of(err), ()))
    for gname, err in defaults.items():
        for ir in gates.get(gname, ()):  # on every qubit where the gate has no error of its own
            model.rules.append(NoiseRule(ir, None, _channel_of(err), (), fallback=True))
    _readouts(model, aer)
    if backend is None:
        model.basis = frozenset(str(b) for b in getattr(aer, "basis_gates", ())
                                if b not in ("delay", "measure", "reset")) or None
    if backend is not None:
        model.device = backend
        model.num_qubits = backend.num_qubits
        basis = set(backend.operation_names) - {"delay", "measure", "reset", "if_else",
                                                 "for_loop", "switch_case", "while_loop"}
        pairs = set()
        for op_name in basis:
            props = backend.target[op_name]
            for qargs in props or {}:
                if qargs is not None and len(qargs) == 2:
                    pairs.add(tuple(qargs))
        model.native = (frozenset(basis), frozenset(pairs))
    return model


def resolve_noise(noise) -> Optional[NoiseModel]:
    """``None``, a :class:`NoiseModel`, or something :func:`from_qiskit` converts."""
    if noise is None or isinstance(noise, NoiseModel):
        return noise
    return from_qiskit(noise)
