"""Conversion between qdiff circuits/observables and PennyLane tapes/operators (PennyLane is
imported lazily).

* :func:`to_pennylane` ``(circuit, theta) -> qml.tape.QuantumScript`` with the measurements; a
  ``(B, P)`` theta becomes broadcast gate parameters of shape ``(B,)``.
* :func:`from_pennylane` ``(tape) -> Recorded`` (circuit, theta, batch shape), every numeric
  gate parameter becoming a theta column.
* :func:`to_pennylane_observable` / :func:`from_pennylane_observable`: observables both ways,
  including ``qml.Hamiltonian``/``LinearCombination``, ``Sum``, ``Prod``, ``SProd``, ``Hermitian``.

Both sides use the same conventions (wire 0 = most significant bit, same gate definitions), so
gates map one to one by name; gates PennyLane lacks are decomposed or become ``QubitUnitary``.

>>> import torch, qdiff as qd
>>> H = to_pennylane_observable(0.5 * qd.Z(0) @ qd.Z(1) - 0.2 * qd.X(1))
>>> from_pennylane_observable(H)
0.5 * Z(0) @ Z(1) + -0.2 * X(1)
"""
from __future__ import annotations

import numpy as np
import torch

from qdiff.circuits.channels import CHANNELS, is_channel, pauli_error_channel, qubit_channel
from qdiff.circuits.circuit import Circuit, Recorded, StatePrep
from qdiff.circuits import memory
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.gates import (GATES, Gate, check_unitary, controlled_gate,
                                  diagonal_unitary_gate, multirz_gate, paulirot_gate,
                                  pcphase_gate, unitary_gate)
from qdiff.circuits.measurements import Measurement
from qdiff.circuits.observables import (Hermitian, Observable, as_observable,
                                        observable_from_op, one_term, set_pennylane_conversion)
from qdiff.circuits.operation import Operation, ParamRef

# qdiff gate name -> PennyLane class name (parameters in the same order and convention)
_TO_PL = {
    "id": "Identity", "x": "PauliX", "y": "PauliY", "z": "PauliZ", "h": "Hadamard", "s": "S",
    "t": "T", "sx": "SX", "rx": "RX", "ry": "RY", "rz": "RZ", "p": "PhaseShift", "u1": "U1",
    "rot": "Rot", "u3": "U3", "u2": "U2", "cx": "CNOT", "cy": "CY", "cz": "CZ", "ch": "CH",
    "swap": "SWAP", "iswap": "ISWAP", "ecr": "ECR", "ccx": "Toffoli", "cswap": "CSWAP",
    "ccz": "CCZ", "crx": "CRX", "cry": "CRY", "crz": "CRZ", "cp": "ControlledPhaseShift",
    "crot": "CRot", "rxx": "IsingXX", "ryy": "IsingYY", "rzz": "IsingZZ",
    "single_excitation": "SingleExcitation", "double_excitation": "DoubleExcitation",
    "multirz": "MultiRZ", "isingxy": "IsingXY", "pswap": "PSWAP",
    "cphaseshift00": "CPhaseShift00", "cphaseshift01": "CPhaseShift01",
    "cphaseshift10": "CPhaseShift10", "single_excitation_plus": "SingleExcitationPlus",
    "single_excitation_minus": "SingleExcitationMinus",
    "double_excitation_plus": "DoubleExcitationPlus",
    "double_excitation_minus": "DoubleExcitationMinus", "orbital_rotation": "OrbitalRotation",
    "fermionic_swap": "FermionicSWAP", "siswap": "SISWAP", "qubit_carry": "QubitCarry",
    "qubit_sum": "QubitSum", "globalphase": "GlobalPhase",
}
_ADJOINT_OF = {"sdg": "S", "tdg": "T", "sxdg": "SX", "iswapdg": "ISWAP"}
_ADJOINT_FROM_PL = {v: k for k, v in _ADJOINT_OF.items()}
_FROM_PL = {v: k for k, v in _TO_PL.items()}
_FROM_PL.update({"CZ": "cz", "CPhase": "cp", "MultiRZ": "multirz", "SQISW": "siswap"})
_PAULI_CLASS = {"X": "PauliX", "Y": "PauliY", "Z": "PauliZ"}


# -- observables -------------------------------------------------------------------------------


def to_pennylane_observable(obs: Observable, wire_map=None):
    """A PennyLane operator for ``obs`` (``wire_map``: qdiff wire -> PennyLane wire); complex
    coefficients (a non-Hermitian product such as ``qd.X(0) @ qd.Y(0)``) stay complex."""
    import pennylane as qml
    obs = as_observable(obs)
    wm = (lambda w: w) if wire_map is None else (lambda w: wire_map[w])
    coeffs = obs.coeffs.detach().cpu().numpy()
    coeffs = coeffs.astype(complex) if np.iscomplexobj(coeffs) and coeffs.size and \
        np.abs(coeffs.imag).max() > 1e-10 else coeffs.real.astype(float)
    ops = []
    for term in obs.terms:
        factors = []
        for f in term:
            if f.kind == "M":
                factors.append(qml.Hermitian(f.matrix.detach().cpu().numpy(),
                                             wires=[wm(w) for w in f.wires]))
            else:
                factors.append(getattr(qml, _PAULI_CLASS[f.kind])(wm(f.wires[0])))
        if not factors:
            any_wire = wm(obs.wires[0]) if obs.wires else 0
            factors = [qml.Identity(any_wire)]
        ops.append(factors[0] if len(factors) == 1 else qml.prod(*factors))
    if len(ops) == 1:
        # one term as PennyLane writes ``c * op`` (an SProd): default.qubit with shots puts a
        # one-term LinearCombination that is a Pauli word in a group with the commuting
        # measurements after it and returns that group's first result only
        return ops[0] if coeffs[0] == 1.0 else qml.s_prod(coeffs[0].item(), ops[0])
    return qml.Hamiltonian(coeffs.tolist(), ops)


def _real(c):
    """A real coefficient: a float, or a real torch tensor where PennyLane gave a tensor (a
    trainable coefficient stays in the graph)."""
    if isinstance(c, torch.Tensor):
        if c.numel() != 1:
            raise QdiffError(f"observable coefficient of shape {tuple(c.shape)} is not a scalar")
        v = complex(c.detach().reshape(()))
        if abs(v.imag) > 1e-10:
            raise QdiffError(f"observable coefficient {v} is not real (not Hermitian)")
        c = c.reshape(())
        c = c.real if c.is_complex() else c
        return c if c.dtype.is_floating_point else c.to(torch.float64)
    c = complex(c)
    if abs(c.imag) > 1e-10:
        raise QdiffError(f"observable coefficient {c} is not real (not Hermitian)")
    return c.real


def _coeff_vector(coeffs: list):
    """Coefficients as one tensor when any is a tensor (gradients kept), else a list."""
    if not any(isinstance(c, torch.Tensor) for c in coeffs):
        return coeffs
    return torch.stack([c.to(torch.float64) if isinstance(c, torch.Tensor)
                        else torch.tensor(c, dtype=torch.float64) for c in coeffs])


def from_pennylane_observable(op) -> Observable:
    """A qdiff observable for a PennyLane operator (wires keep PennyLane's labels)."""
    if type(op).__name__ == "MeasurementValue":
        raise QdiffError(f"PennyLane measurement value {op!r} (qml.measure) given to a qdiff "
                         "measurement: write qml.expval(m) / qml.var / qml.sample / "
                         "qml.counts / qml.probs(op=m), or measure with qd.measure")
    rep = getattr(op, "pauli_rep", None)
    if rep is not None:
        coeffs, terms = [], []
        for word, c in rep.items():
            coeffs.append(_real(c))
            terms.append(_word_term(dict(word)))
        return Observable(_coeff_vector(coeffs), terms) if terms else Observable([0.0], [()])
    name = type(op).__name__
    if name == "Hermitian":
        a = op.data[0]
        return Hermitian(a if isinstance(a, torch.Tensor) else np.asarray(a), list(op.wires))
    if name == "SProd":
        return from_pennylane_observable(op.base) * _real(op.scalar)
    if name in ("Sum", "LinearCombination", "Hamiltonian"):
        coeffs, ops = op.terms()
        total = None
        for c, o in zip(coeffs, ops):
            part = from_pennylane_observable(o) * _real(c)
            total = part if total is None else total + part
        return total
    if name == "Prod":
        out = None
        for o in op.operands:
            part = from_pennylane_observable(o)
            out = part if out is None else out @ part
        return _hermitian_product(out, op)
    if name == "Hadamard":
        return observable_from_op(Operation(GATES["h"], tuple(op.wires)))
    if op.has_matrix and not getattr(op, "batch_size", None):
        k = len(op.wires)  # the dense matrix, its Hermitian check and the observable's copy
        memory.require(4 * 16.0 * 4.0 ** k, f"the dense {k}-qubit matrix of PennyLane's {name} "
                       f"({2.0 ** k:.0f}x{2.0 ** k:.0f} complex128)",
                       hint="write the observable as a Pauli sum (qml.Hamiltonian)")
        m = np.asarray(op.matrix())
        if np.allclose(m, m.conj().T, atol=1e-10):  # Projector, Exp, ...: a Hermitian matrix
            return Hermitian(m, list(op.wires))
    raise QdiffError(f"cannot convert PennyLane operator {op!r} to an observable")


set_pennylane_conversion(from_pennylane_observable)


def _hermitian_product(obs: Observable, op) -> Observable:
    """``obs``, the product of the factors of PennyLane's ``Prod`` ``op``, checked Hermitian.
    Factors sharing a wire need not commute: their product can carry complex coefficients or
    non-Hermitian matrix factors whose sum is still Hermitian (then the dense matrix on its
    wires), or be no observable at all (a ``QdiffError``: its expectation is complex)."""
    try:
        obs.check_hermitian()
        return obs
    except QdiffError:
        pass
    m = obs.matrix()
    md = m.detach()
    if not torch.allclose(md, md.conj().transpose(0, 1), atol=1e-10):
        raise QdiffError(f"PennyLane operator {op!r} is not Hermitian (its factors do not "
                         f"commute), so it is not an observable")
    return Hermitian(m, list(obs.wires))


def _word_term(word: dict) -> tuple:
    """``{wire: letter}`` -> one observable term (``()`` is the identity)."""
    obs = Observable([1.0], [()])
    for w, letter in word.items():
        obs = obs @ Observable.pauli(letter, w)
    return obs.terms[0]


# -- circuits ----------------------------------------------------------------------------------


def _angle(p, theta, interface: str, single: bool):
    if not isinstance(p, ParamRef):
        return float(p)
    col = theta[:, p.index] * p.scale + p.offset
    if interface == "numpy":
        col = col.detach().cpu().numpy()
    return col[0] if single else col


def _pl_ops(op: Operation, angles: list, wires: list) -> list:
    import pennylane as qml
    name = op.name
    if is_channel(op.gate):  # PennyLane's channel of the same name and parameters
        if op.gate.pl_name == "PauliError":
            return [qml.PauliError(name[len("PauliError["):-1], *angles, wires=wires)]
        if name == "QubitChannel":
            return [qml.QubitChannel(list(op.gate.kraus().detach().cpu().numpy()), wires=wires)]
        return [getattr(qml, op.gate.pl_name)(*angles, wires=wires)]
    if name in _ADJOINT_OF:
        return [qml.adjoint(getattr(qml, _ADJOINT_OF[name])(wires=wires))]
    if name == "paulirot":
        return [qml.PauliRot(angles[0], op.gate.hyper[0], wires=wires)]
    if name == "unitary" and op.gate.pl_name == "DiagonalQubitUnitary":
        return [qml.DiagonalQubitUnitary(op.gate.diag_fn().detach().cpu().numpy(), wires=wires)]
    if name == "unitary":
        return [qml.QubitUnitary(op.gate.hyper[0].detach().cpu().numpy(), wires=wires)]
    if name == "pcphase":
        return [qml.PCPhase(angles[0], dim=op.gate.hyper[0], wires=wires)]
    if name == "ctrl":
        base, k = op.gate.hyper
        inner = _pl_ops(Operation(base, op.wires[k:], op.params), angles, wires[k:])
        if inner is None or len(inner) != 1:
            return None
        return [qml.ctrl(inner[0], control=wires[:k])]
    if name in _TO_PL:
        return [getattr(qml, _TO_PL[name])(*angles, wires=wires)]
    return None  # caller decomposes


def _emit(op: Operation, theta, interface, single, wire_of) -> list:
    from qdiff.circuits.decompositions import decompose
    angles = [_angle(p, theta, interface, single) for p in op.params]
    out = _pl_ops(op, angles, [wire_of(w) for w in op.wires])
    if out is not None:
        return out
    try:
        subs = decompose(op)
    except QdiffError:
        subs = None
    if subs:
        return [o for s in subs for o in _emit(s, theta, interface, single, wire_of)]
    import pennylane as qml  # no decomposition: the gate's (batched) matrix
    m = op.gate.matrix(*[torch.as_tensor(a) for a in angles])
    return [qml.QubitUnitary(m if interface == "torch" else m.detach().cpu().numpy(),
                             wires=[wire_of(w) for w in op.wires])]


def _pl_measurement(m: Measurement, wire_of, counts_as_samples: bool):
    import pennylane as qml
    wires = None if m.wires is None else [wire_of(w) for w in m.wires]
    obs = None if m.obs is None else to_pennylane_observable(m.obs, _MapCall(wire_of))
    if m.kind == "expval":
        return qml.expval(obs)
    if m.kind == "var":
        return qml.var(obs)
    if m.kind == "probs":
        return qml.probs(wires=wires)
    if m.kind == "state":
        return qml.state()
    if m.kind == "density_matrix":
        return qml.density_matrix(wires=wires)
    if m.kind == "sample" or (m.kind == "counts" and counts_as_samples):
        return qml.sample(obs) if obs is not None else qml.sample(wires=wires)
    if m.kind == "counts":
        return qml.counts(obs, all_outcomes=m.all_outcomes) if obs is not None else \
            qml.counts(wires=wires, all_outcomes=m.all_outcomes)
    raise QdiffError(f"measurement '{m.kind}' has no PennyLane equivalent")  # pragma: no cover


class _MapCall(dict):
    def __init__(self, fn):
        super().__init__()
        self._fn = fn

    def __getitem__(self, k):
        return self._fn(k)


def to_pennylane(circuit: Circuit, theta=None, shots=None, initial_state=None,
                 interface: str = "numpy", use_labels: bool = True, counts_as_samples=False):
    """A ``qml.tape.QuantumScript`` for ``circuit`` bound to ``theta`` ``(B, P)`` or ``(P,)``.

    ``B > 1`` gives broadcast parameters ``(B,)``; ``interface="torch"`` keeps torch tensors
    (differentiable through PennyLane's torch interface). ``initial_state`` ``(B or 1, 2**n)``
    becomes a leading ``StatePrep``. Wires are the circuit's labels (``use_labels``) or 0..n-1.
    """
    import pennylane as qml
    if interface not in ("numpy", "torch"):
        raise QdiffError(f"interface must be 'numpy' or 'torch'; got {interface!r}")
    if theta is None:
        if circuit.num_params:
            raise QdiffError(f"to_pennylane: the circuit has {circuit.num_params} parameters; "
                             "pass theta")
        theta = torch.zeros(1, 0, dtype=torch.float64)
    theta = torch.as_tensor(theta) if not isinstance(theta, torch.Tensor) else theta
    theta = theta.reshape(1, -1) if theta.ndim == 1 else theta
    if theta.ndim != 2 or theta.shape[1] != circuit.num_params:
        raise QdiffError(f"to_pennylane: theta must have shape (B, {circuit.num_params}); got "
                         f"{tuple(theta.shape)}")
    labels = circuit.labels if use_labels else tuple(range(circuit.num_wires))
    wire_of = labels.__getitem__
    single = theta.shape[0] == 1
    ops = []
    if initial_state is not None:
        st = initial_state if interface == "torch" else initial_state.detach().cpu().numpy()
        ops.append(qml.StatePrep(st[0] if st.shape[0] == 1 else st, wires=list(labels)))
    for op in circuit.operations:
        ops.extend(_emit(op, theta, interface, single, wire_of))
    meas = [_pl_measurement(m, wire_of, counts_as_samples) for m in circuit.measurements]
    return qml.tape.QuantumScript(ops, meas, shots=shots)


# -- from PennyLane ----------------------------------------------------------------------------


def _constant_tensor(data) -> torch.Tensor:
    """PennyLane operator data (a NumPy array or a torch tensor, a conjugate view such as
    PennyLane's adjoint of a torch matrix included) as a detached tensor."""
    if isinstance(data, torch.Tensor):
        return data.detach().resolve_conj().resolve_neg()
    return torch.as_tensor(np.asarray(data))


def _param_tensor(p, gate: str = "") -> torch.Tensor:
    """A real angle (array) as a tensor: one of a complex dtype is taken when its imaginary
    part is zero and refused otherwise (never cut to its real part)."""
    if not isinstance(p, torch.Tensor):
        a = np.asarray(p)
        if a.dtype.kind in "USV":  # numpy would parse "0.3" as 0.3
            where = f"gate '{gate}': " if gate else ""
            raise QdiffError(f"{where}a gate angle {p!r:.80} is not a number")
        p = a.astype(complex if np.iscomplexobj(a) else float)
    t = p if isinstance(p, torch.Tensor) else torch.as_tensor(p)
    if t.is_complex():
        if bool((t.detach().imag != 0).any()):
            where = f"gate '{gate}': " if gate else ""
            raise QdiffError(f"{where}a gate angle {p!r:.80} has an imaginary part "
                             "(angles are real)")
        t = t.real
    return t if t.dtype.is_floating_point else t.to(torch.float64)


def _global_phase(op, any_wire) -> list:
    """``GlobalPhase(phi)`` = exp(-i phi) I: qdiff's gate on the first of its wires (on
    ``any_wire`` of the circuit when it names none)."""
    w = tuple(op.wires)[:1] or ((any_wire,) if any_wire is not None else ())
    if not w:
        raise QdiffError(f"{op!r} names no wire and the circuit has none")
    return [Operation(GATES["globalphase"], w, (_param_tensor(op.data[0]),))]


def _qdiff_ops(op, any_wire=None) -> list:
    """Recorded-style operations (tensor angles, PennyLane wire labels) for one PennyLane op
    (``any_wire``: a wire of the circuit, for a ``GlobalPhase`` that names none)."""
    name = type(op).__name__
    wires = tuple(op.wires)
    if name == "GlobalPhase":
        return _global_phase(op, any_wire)
    if name.startswith("Adjoint") and type(op.base).__name__ in _ADJOINT_FROM_PL:
        return [Operation(GATES[_ADJOINT_FROM_PL[type(op.base).__name__]], wires, ())]
    if name == "PauliRot":
        return [Operation(paulirot_gate(op.hyperparameters["pauli_word"]), wires,
                          (_param_tensor(op.data[0]),))]
    if name == "MultiRZ":
        return [Operation(multirz_gate(len(wires)), wires, (_param_tensor(op.data[0]),))]
    if name == "PCPhase":
        return [Operation(_pcphase(op), wires, (_param_tensor(op.data[0]),))]
    if name == "DiagonalQubitUnitary" and _constant_diagonal(op):
        return [Operation(diagonal_unitary_gate(_constant_tensor(op.data[0])),
                          wires, ())]
    if name == "QubitUnitary":
        u = op.data[0]
        trainable = isinstance(u, torch.Tensor) and u.requires_grad
        if getattr(u, "ndim", 2) == 2 and not trainable:
            return [Operation(unitary_gate(_constant_tensor(u),
                                           who=f"QubitUnitary on wires {list(wires)}"),
                              wires, ())]
        if trainable and getattr(u, "ndim", 2) == 2 and len(wires) != 1:
            # the gate qd.QubitUnitary makes of it: its matrix keeps the autograd graph, which
            # backprop differentiates (one wire: PennyLane's Rot form, every method)
            return [Operation(unitary_gate(u, who=f"QubitUnitary on wires {list(wires)}"),
                              wires, ())]
        if trainable:  # the Rot form holds for a unitary only
            check_unitary(u, who=f"QubitUnitary on wires {list(wires)}")
    if name in _FROM_PL:
        gate = GATES[_FROM_PL[name]]
        return [Operation(gate, wires, tuple(_param_tensor(p) for p in op.data))]
    if name == "Controlled":
        ctrl = tuple(op.control_wires)
        flips = [Operation(GATES["x"], (w,), ()) for w, v in zip(ctrl, op.control_values)
                 if not v]
        inner = [Operation(controlled_gate(o.gate, len(ctrl)), ctrl + o.wires, o.params)
                 for o in _qdiff_ops(op.base, any_wire)]
        return flips + inner + flips
    if name in ("Barrier", "Snapshot"):
        return []
    if name in ("Exp", "Evolution"):
        rot = _exp_pauli_rot(op)
        if rot is not None:
            return rot
    if _has_decomposition(op):
        return [o for sub in _decomposition(op) for o in _qdiff_ops(sub, any_wire)]
    if op.has_matrix and _constant(op):  # BlockEncode, ...: its (checked) unitary matrix
        return [Operation(unitary_gate(_constant_matrix(op)), wires, ())]
    raise QdiffError(f"from_pennylane: operation {op!r} has no qdiff equivalent and no "
                     "decomposition")


def _constant(op) -> bool:
    """Whether ``op``'s parameters are neither trainable nor broadcast."""
    return getattr(op, "batch_size", None) is None and not any(
        isinstance(d, torch.Tensor) and d.requires_grad for d in op.data)


def _constant_matrix(op) -> torch.Tensor:
    m = _constant_tensor(op.matrix())
    if m.shape[-1] != 2 ** len(op.wires):
        raise QdiffError(f"{op.name} on wires {list(op.wires)}: a {m.shape[-1]}x{m.shape[-1]} "
                         "matrix is not a qubit operator")
    return m


def _has_decomposition(op) -> bool:
    """``op.has_decomposition``, PennyLane's own failures (e.g. on broadcast parameters) raised
    as a :class:`QdiffError` naming ``op``."""
    try:
        return bool(op.has_decomposition)
    except Exception as e:  # noqa: BLE001 - PennyLane raises many kinds here
        raise QdiffError(f"PennyLane could not decompose {op!r} ({type(e).__name__}: {e})") \
            from None


def _decomposition(op) -> list:
    """PennyLane's decomposition of ``op``; a failure of PennyLane's own (an operator it cannot
    decompose for these parameters or this interface) is a :class:`QdiffError` naming ``op``."""
    try:
        return op.decomposition()
    except QdiffError:
        raise
    except Exception as e:  # noqa: BLE001 - PennyLane raises many kinds here
        raise QdiffError(f"PennyLane could not decompose {op!r} ({type(e).__name__}: {e})") \
            from None


def _scaled_word(op):
    """``(2j * coeff * c, {wire: letter})`` of ``qml.exp`` of ``coeff`` times a scaled Pauli
    word ``c P`` (scalar products unrolled), or ``None`` when the base is not one word."""
    base, coeff = op.base, op.coeff
    while type(base).__name__ == "SProd":
        coeff, base = coeff * base.scalar, base.base
    rep = getattr(base, "pauli_rep", None)
    if rep is None or len(rep) != 1:
        return None
    (word, c), = rep.items()
    return 2j * coeff * c, dict(word)


def exp_pauli_rotation(op):
    """``(theta, pauli_word, wires)`` of ``qml.exp``/``qml.evolve`` of a scaled Pauli word
    with a torch coefficient (of the exponent or of the word): ``exp(coeff * c P) =
    PauliRot(theta = 2j * coeff * c)``, ``theta`` a real tensor kept in the graph
    (PennyLane's own decomposition of it needs ``real_if_close``, which torch lacks);
    ``None`` for anything else (PennyLane's decomposition, or its refusal, applies)."""
    scaled = _scaled_word(op)
    if scaled is None:
        return None
    theta, word = scaled
    if not isinstance(theta, torch.Tensor) or not word or \
            (theta.is_complex() and bool((theta.detach().imag.abs() > 1e-10).any())):
        return None
    theta = theta.real if theta.is_complex() else theta
    wires = tuple(word)
    return theta.to(torch.float64), "".join(word[w] for w in wires), wires


def broadcast_exp_rotation(op):
    """``(theta, pauli_word, wires)`` of ``qml.exp``/``qml.evolve`` of a scaled Pauli word with
    a broadcast numpy or autograd coefficient (PennyLane's own decomposition cannot read one):
    ``theta = 2j * coeff * c`` of shape ``(B,)``, real, in the coefficient's interface;
    ``None`` for anything else (a non-Pauli base, a scalar or torch coefficient, a coefficient
    with a real part: not unitary)."""
    import pennylane as qml
    if isinstance(op.coeff, torch.Tensor) or qml.math.ndim(op.coeff) == 0:
        return None
    scaled = _scaled_word(op)
    if scaled is None:
        return None
    theta, word = scaled
    imag = np.asarray(qml.math.unwrap(qml.math.imag(theta)))
    if not word or bool((np.abs(imag) > 1e-10).any()):
        return None
    wires = tuple(word)
    return qml.math.real(theta), "".join(word[w] for w in wires), wires


def autograd_exp_matrix(op):
    """The matrix ``exp(coeff * B)`` of ``qml.exp``/``qml.evolve`` whose coefficient is an
    autograd value that requires grad (scalar or broadcast ``(B,)``) and whose base ``B`` is a
    constant Hermitian operator: ``V diag(exp(coeff * l)) V^dag`` from ``B = V diag(l) V^dag``,
    autograd-differentiable in ``coeff``, shape ``(2**k, 2**k)`` or ``(B, 2**k, 2**k)``;
    ``None`` for anything else. PennyLane's own autograd matrix of such an operator combines
    the base's eigenvalues with its diagonalizing gates, which is not ``exp(coeff * B)`` when
    ``B`` is a sum of terms that do not commute."""
    import pennylane as qml
    coeff = op.coeff
    if qml.math.get_interface(coeff) != "autograd" or not qml.math.requires_grad(coeff) or \
            any(qml.math.requires_grad(d) for d in op.base.data) or \
            (_scaled_word(op) is not None and qml.math.ndim(coeff) == 0):
        return None  # (one Pauli word: PennyLane decomposes it into its PauliRot)
    base = np.asarray(qml.math.unwrap(qml.matrix(op.base, wire_order=op.wires)))
    if not np.allclose(base, base.conj().T, atol=1e-10):
        return None
    vals, vecs = np.linalg.eigh(base)
    c = qml.math.reshape(coeff, (-1, 1)) if qml.math.ndim(coeff) else coeff
    phases = qml.math.exp(c * vals)  # (k,) or (B, k)
    return qml.math.einsum("ij,...j,kj->...ik", vecs, phases, vecs.conj())


def _exp_pauli_rot(op):
    """:func:`exp_pauli_rotation` as one qdiff ``PauliRot`` operation (or ``None``)."""
    rot = exp_pauli_rotation(op)
    if rot is None:
        return None
    theta, letters, wires = rot
    return [Operation(paulirot_gate(letters), wires, (theta,))]


def _qdiff_measurement(mp, mids=None) -> Measurement:
    kind = {"ExpectationMP": "expval", "VarianceMP": "var", "ProbabilityMP": "probs",
            "SampleMP": "sample", "CountsMP": "counts", "StateMP": "state",
            "DensityMatrixMP": "density_matrix"}.get(type(mp).__name__)
    if kind is None:
        raise QdiffError(f"from_pennylane: measurement {mp!r} is not supported")
    every = kind == "counts" and bool(getattr(mp, "all_outcomes", False))
    mv = getattr(mp, "mv", None)
    if mv is not None:
        if mids is None:
            raise QdiffError(f"from_pennylane: {mp!r} measures a mid-circuit outcome; record "
                             "the circuit in a qdiff qnode")
        if kind == "probs" or isinstance(mv, (list, tuple)):
            if kind not in ("probs", "sample", "counts"):
                raise QdiffError(f"{kind} of a list of measurement values is not supported")
            ws = mids.plain_wires(mv if isinstance(mv, (list, tuple)) else [mv])
            return Measurement(kind, None, ws, every)
        # samples and counts of a value are its values, int where they all are (PennyLane's)
        integer = kind in ("sample", "counts") and all(
            float(v).is_integer() for v in mv.branches.values())
        return Measurement(kind, mids.observable(mv), None, every, integer)
    obs = None if mp.obs is None else from_pennylane_observable(mp.obs)
    if kind == "probs" and obs is not None:
        raise QdiffError("from_pennylane: probs(op=...) is not supported; rotate the basis "
                         "with gates and use probs(wires)")
    wires = tuple(mp.wires) if obs is None and len(mp.wires) else None
    if kind in ("expval", "var") and obs is None:
        raise QdiffError(f"from_pennylane: {kind} needs an observable")
    if kind == "counts" and obs is not None:
        obs = one_term(obs, "counts(op)", shared=False)
    return Measurement(kind, obs, wires, every)


def _unit(vec: torch.Tensor) -> torch.Tensor:
    """``vec`` divided by its (constant) norm: PennyLane's state preparations take the vector
    as given (normalised to its tolerance), so gradients are those of the amplitudes
    themselves, not of the projection onto the unit sphere."""
    return vec / vec.detach().abs().pow(2).sum(-1, keepdim=True).sqrt()


_STATE_PREPS = ("StatePrep", "AmplitudeEmbedding", "MottonenStatePreparation")


def op_items(op, who: str, first: bool, any_wire=None) -> list:
    """Recorded-style items (operations, a leading :class:`StatePrep`) for one PennyLane
    operation; ``who`` names the caller in errors."""
    name = type(op).__name__
    if name in _STATE_PREPS:
        if not first:  # after other gates: PennyLane's decomposition (Mottonen), as it runs there
            if not _has_decomposition(op):
                raise QdiffError(f"{who}: state preparation {name} must come first")
            return [o for sub in _decomposition(op) for o in _qdiff_ops(sub, any_wire)]
        data = op.data[0]
        if hasattr(data, "toarray"):  # a scipy sparse state (StatePrep's sparse form)
            data = np.asarray(data.toarray()).reshape(-1)
        vec = data if torch.is_tensor(data) else torch.as_tensor(np.asarray(data))
        vec = vec.to(torch.complex128)  # (complex amplitudes kept)
        prep_wires = tuple(op.wires)
        if vec.shape[-1] != 2 ** len(prep_wires):
            raise QdiffError(f"{who}: {name} vector of length {vec.shape[-1]} "
                             f"on {len(prep_wires)} wires (pad/normalize it in PennyLane)")
        return [StatePrep(_unit(vec), prep_wires)]
    if name == "BasisState":
        bits = np.asarray(op.data[0]).astype(int).reshape(-1)
        return [Operation(GATES["x"], (w,), ()) for w, b in zip(op.wires, bits) if b]
    if name in ("MidMeasureMP", "MidMeasure", "Conditional"):
        raise QdiffError(f"{who}: PennyLane's mid-circuit {name} ({op!r}) is not converted; "
                         "use qd.measure(wire) and qd.cond(m, op) in a qdiff qnode")
    if name in TAPE_CHANNELS:  # qml.BitFlip(p, wires): qdiff's channel of the same name
        if not tape_channel_supported(op):
            raise QdiffError(f"{who}: QubitChannel on wires {list(op.wires)}: Kraus matrices "
                             "that require grad or carry a batch dimension are not converted "
                             "(a QubitChannel is a constant channel); detach them, or write "
                             "the noise with parametrized channels")
        return [_channel_operation(op, tuple(op.wires))]
    return _qdiff_ops(op, any_wire)


def convert_recording(raw: list, result, mid_start: int = 0, wires=()):
    """Replace the PennyLane objects a qnode recorded (PennyLane operations and measurement
    processes queued while the qnode ran) by qdiff items, in call order; ``result`` (the
    function's return value) has its PennyLane measurements replaced by the same qdiff ones.
    PennyLane's mid-circuit measurements (``qml.measure``, ``qml.cond``, statistics of their
    values) take the deferred form of :mod:`qdiff.circuits.midcircuit`, their extra wires
    numbered from ``mid_start``. Returns ``(items, result, number of mid-circuit measurements
    in all)``. ``wires`` are the device's (a ``GlobalPhase`` naming no wire acts on the first).
    Anything PennyLane that has no qdiff form raises :class:`QdiffError` naming it."""
    from qdiff.circuits.recording import is_pennylane
    converted: dict = {}
    any_wire = tuple(wires)[0] if len(tuple(wires)) else None
    mids = _MidWires(mid_start, any_wire)

    def measurement(mp):
        if id(mp) not in converted:
            try:
                converted[id(mp)] = _qdiff_measurement(mp, mids)
            except QdiffError as e:
                raise QdiffError(f"qnode: PennyLane measurement {mp!r}: {e}") from None
        return converted[id(mp)]

    items = []
    for it in raw:
        name = type(it).__name__
        if not is_pennylane(it):
            items.append(it)
        elif name in ("MidMeasure", "MidMeasureMP"):
            items.extend(mids.measure(it))
        elif name == "Conditional":
            items.extend(mids.conditional(it))
        elif _is_measurement(it):
            items.append(measurement(it))
        elif hasattr(it, "wires") and hasattr(it, "data"):
            first = not any(not isinstance(i, Measurement) for i in items)
            try:
                items.extend(op_items(it, "qnode", first, any_wire))
            except QdiffError as e:
                msg = str(e)
                raise QdiffError(msg if msg.startswith("qnode") else
                                 f"qnode: PennyLane operation {it!r}: {msg}") from None
        else:
            raise QdiffError(f"qnode: PennyLane object {it!r} ({type(it).__name__}) has no "
                             "qdiff form; use qdiff's gates and measurements")
    if _is_measurement(result):
        result = measurement(result)
    elif isinstance(result, (list, tuple)):
        out = [measurement(m) if _is_measurement(m) else m for m in result]
        result = tuple(out) if isinstance(result, tuple) else out
    return items, result, mids.count


class _MidWires:
    """PennyLane mid-circuit measurements met so far, each with its extra wire."""

    def __init__(self, start: int, any_wire=None):
        self.any_wire = any_wire
        self.count = start
        self.wire_of: dict = {}

    def measure(self, mp) -> list:
        from qdiff.circuits.midcircuit import MidWire, measurement_ops
        if mp.postselect is not None:
            raise QdiffError(f"qnode: {mp!r}: postselect is not supported (deferred measurement "
                             "keeps every outcome)")
        aux = MidWire(self.count)
        self.count += 1
        self.wire_of[id(mp)] = aux
        return measurement_ops(mp.wires[0], aux, bool(mp.reset))

    def wires(self, mv) -> tuple:
        try:
            return tuple(self.wire_of[id(m)] for m in mv.measurements)
        except KeyError:
            raise QdiffError(f"qnode: the mid-circuit measurement value {mv!r} comes from a "
                             "measurement made outside this circuit") from None

    def branches(self, mv) -> tuple:
        """``(wires, [(bits, value), ...])`` of ``mv``, its measurements in the order they were
        made and its branches in the order of their bits (PennyLane orders a combined value's
        measurements by random ids, which would make the recorded structure differ from call
        to call)."""
        wires = self.wires(mv)
        order = sorted(range(len(wires)), key=lambda i: wires[i].index)
        return (tuple(wires[i] for i in order),
                sorted((tuple(int(bits[i]) for i in order), value)
                       for bits, value in mv.branches.items()))

    def conditional(self, op) -> list:
        from qdiff.circuits.midcircuit import controlled_by
        mv, inner = op.meas_val, op.base
        while type(inner).__name__ == "Conditional":  # a qml.cond inside a conditioned
            mv, inner = mv & inner.meas_val, inner.base  # function: both conditions hold
        wires, branches = self.branches(mv)
        if type(inner).__name__ in TAPE_CHANNELS:  # as qd.cond refuses one
            raise QdiffError(f"qnode: cond: channel {type(inner).__name__} on wires "
                             f"{list(inner.wires)} cannot be conditioned on a mid-circuit "
                             "measurement (gates and templates only)")
        base = _qdiff_ops(inner, self.any_wire)
        out = []
        for bits, value in branches:  # exclusive branches: at most one fires
            if value:
                out.extend(o for b in base for o in controlled_by(b, wires, bits))
        return out

    def observable(self, mv):
        """The diagonal observable whose eigenvalue on each branch is the value there."""
        wires, branches = self.branches(mv)
        diag = np.zeros(2 ** len(wires))
        for bits, value in branches:
            diag[int("".join(str(b) for b in bits), 2) if bits else 0] = float(value)
        return Hermitian(np.diag(diag), list(wires))

    def plain_wires(self, mvs) -> tuple:
        out = []
        for mv in mvs:
            if len(mv.measurements) != 1 or {k: int(v) for k, v in mv.branches.items()} != \
                    {(0,): 0, (1,): 1}:
                raise QdiffError(f"probs/counts of {mv!r}: only plain measurement values "
                                 "(qml.measure's own) are supported")
            out.extend(self.wires(mv))
        return tuple(out)


def _is_measurement(obj) -> bool:
    from qdiff.circuits.recording import is_pennylane
    return is_pennylane(obj) and any(c.__name__ == "MeasurementProcess"
                                     for c in type(obj).__mro__)


def from_pennylane(tape, wires=None) -> Recorded:
    """A :class:`Recorded` (circuit, theta ``(B, P)``, batch shape) for a PennyLane tape.

    Every numeric gate parameter becomes a theta column (tensors requiring grad stay trainable);
    ``wires`` fixes the wire order (default: the tape's). A leading ``StatePrep``/
    ``AmplitudeEmbedding`` becomes the initial state; ``BasisState`` becomes X gates.
    """
    labels = tuple(tape.wires) if wires is None else tuple(wires)
    items = []
    for k, op in enumerate(tape.operations):
        items.extend(op_items(op, "from_pennylane", first=k == 0,
                               any_wire=labels[0] if labels else None))
    items.extend(_qdiff_measurement(mp) for mp in tape.measurements)
    try:
        return Circuit.from_recording(items, labels)
    except QdiffError as e:
        raise QdiffError(f"from_pennylane: {e}") from None


# -- whole tapes, for a device ------------------------------------------------------------------

#: PennyLane operation names a tape may hold when :func:`from_pennylane_tape` converts it (one
#: qdiff gate each, or a fixed gate sequence for ``GlobalPhase``); anything else is decomposed
#: by the device's preprocessing first
TAPE_NATIVE = frozenset(_FROM_PL) | {"PauliRot", "QubitUnitary", "GlobalPhase", "Snapshot",
                                     "Barrier", "StatePrep", "BasisState"}
TAPE_ADJOINT_BASES = frozenset(_ADJOINT_FROM_PL)


def simple_tape_gates() -> frozenset:
    """PennyLane operation names :func:`from_pennylane_tape` converts from the name, the wires
    (and the device's wires, for a ``GlobalPhase`` on none) and the angles alone: no
    hyperparameter or matrix enters their conversion."""
    return frozenset(_FROM_PL)


#: PennyLane's noise channels :func:`from_pennylane_tape` converts with ``channels=True``
TAPE_CHANNELS = frozenset(CHANNELS) | {"PauliError", "QubitChannel"}


def tape_channel_supported(op) -> bool:
    """Whether ``op`` is a PennyLane channel :func:`from_pennylane_tape` converts: every qdiff
    channel by PennyLane's name, ``PauliError``, and a ``QubitChannel`` whose Kraus matrices
    are neither trainable nor broadcast (a constant channel)."""
    name = type(op).__name__
    if name not in TAPE_CHANNELS:
        return False
    if name == "QubitChannel":
        import pennylane as qml
        return not any(qml.math.requires_grad(k) or qml.math.ndim(k) != 2 for k in op.data)
    return True


def _channel_operation(op, wires) -> Operation:
    """The qdiff operation of a PennyLane channel (parameters as tensors, in PennyLane's
    order)."""
    name = type(op).__name__
    if name == "QubitChannel":
        return Operation(qubit_channel([np.asarray(k) for k in op.data]), wires, ())
    ch = pauli_error_channel(op.hyperparameters["operators"]) if name == "PauliError" \
        else CHANNELS[name]
    params = tuple(_param_tensor(p, op.name) for p in op.data)
    ch.check(params)
    return Operation(ch, wires, params)


def trainable_unitary_decomposition(op) -> list:
    """PennyLane's decomposition of a ``QubitUnitary`` ``op`` whose matrix is trainable (qdiff's
    circuits take angles, not matrices); a ``QdiffError`` naming it where that decomposition
    cannot follow the matrix's gradient (on two or more wires under torch)."""
    try:
        return op.decomposition()
    except QdiffError:
        raise
    except Exception as e:  # noqa: BLE001 - e.g. torch refusing numpy() of a grad tensor
        d = 2 ** len(op.wires)
        raise QdiffError(
            f"{op.name} on wires {list(op.wires)}: PennyLane's decomposition of a trainable "
            f"{d}x{d} matrix is not differentiable here ({type(e).__name__}); differentiate "
            f"the angles that build it (qml.RX, qml.PauliRot, ...) or a one-wire "
            f"matrix") from None


def tape_trainable_matrix(op) -> bool:
    """Whether ``op`` is an unbatched ``QubitUnitary`` whose matrix requires grad, or a
    controlled one (``qml.ctrl``, ``ControlledQubitUnitary``): :func:`from_pennylane_tape`
    converts it into ONE qdiff gate holding that matrix (a torch tensor keeps its autograd
    graph, which backprop differentiates; the matrix has no angles for other methods)."""
    import pennylane as qml
    base = _controlled_base(op)
    return type(base).__name__ == "QubitUnitary" and base.batch_size is None and \
        qml.math.requires_grad(base.data[0])


def _controlled_base(op):
    """The operation a ``qml.ctrl``/``ControlledQubitUnitary`` controls, else ``op``."""
    return op.base if type(op).__name__ not in TAPE_NATIVE and _is_controlled(op) else op


def trainable_matrix_ops(tape) -> list:
    """The operations of ``tape`` that are a ``QubitUnitary`` (also controlled, also
    broadcast) whose matrix requires grad."""
    import pennylane as qml
    out = []
    for op in tape.operations:
        base = _controlled_base(op)
        if type(base).__name__ == "QubitUnitary" and qml.math.requires_grad(base.data[0]):
            out.append(op)
    return out


def transform_matrix_refusal(tape, method):
    """Why PennyLane's gradient transform ``method`` (parameter-shift, finite differences,
    ...) cannot differentiate ``tape``: the first trainable matrix on two or more wires (also
    controlled), which it would differentiate through PennyLane's decomposition of the
    matrix, which does not carry the matrix's gradient; ``None`` when there is none (a
    one-wire matrix decomposes into differentiable ``Rot`` angles)."""
    for op in trainable_matrix_ops(tape):
        if len(op.wires) > 1:
            d = 2 ** len(op.wires)
            label = getattr(method, "__name__", None) or str(method)
            return (f"{op.name} on wires {list(op.wires)}: a trainable {d}x{d} matrix is "
                    f"differentiated by diff_method='backprop' (or 'best') only; the gradient "
                    f"transform {label} would differentiate PennyLane's decomposition of it, "
                    f"which does not carry its gradient")
    return None


def tape_op_supported(op) -> bool:
    """Whether :func:`from_pennylane_tape` converts ``op`` directly: a gate qdiff has (with
    PennyLane's parameters and convention), ``Adjoint`` of S/T/SX/ISWAP, ``PauliRot``,
    ``GlobalPhase``, an unbatched ``QubitUnitary`` whose matrix is not trainable, and a
    controlled one of these gates (``qml.ctrl``, ``MultiControlledX``,
    ``ControlledQubitUnitary``: one qdiff controlled gate, broadcast parameters included)."""
    name = type(op).__name__
    if name in ("StatePrep", "BasisState"):
        return False  # only as the first operation (the device keeps that one)
    if name in TAPE_NATIVE and name != "QubitUnitary":
        return True
    if name not in TAPE_NATIVE and _is_controlled(op):
        return _single_gate_supported(op.base)
    return _single_gate_supported(op)


def _is_controlled(op) -> bool:
    from pennylane.ops.op_math import Controlled
    return isinstance(op, Controlled)


def _single_gate_supported(op) -> bool:
    """Whether ``op`` converts to ONE qdiff gate whose parameters are ``op.data`` in order."""
    name = type(op).__name__
    if name == "QubitUnitary":
        import pennylane as qml
        return op.batch_size is None and not qml.math.requires_grad(op.data[0])
    if name == "DiagonalQubitUnitary":
        return _constant_diagonal(op)
    if name == "GlobalPhase":  # converted on its own (it may name no wire), not controlled
        return False
    if name in _FROM_PL or name in ("PauliRot", "PCPhase"):
        return True
    return name.startswith("Adjoint") and type(getattr(op, "base", None)).__name__ in \
        TAPE_ADJOINT_BASES


def _single_gate(op):
    """The qdiff gate of an ``op`` that passes :func:`_single_gate_supported`."""
    name = type(op).__name__
    if name == "QubitUnitary":  # a torch matrix keeps its autograd graph
        m = op.data[0]
        return unitary_gate(m if isinstance(m, torch.Tensor) else torch.as_tensor(np.asarray(m)),
                            who=f"QubitUnitary on wires {list(op.wires)}")
    if name == "DiagonalQubitUnitary":
        return diagonal_unitary_gate(_constant_tensor(op.data[0]))
    if name == "PCPhase":
        return _pcphase(op)
    if name.startswith("Adjoint"):
        return GATES[_ADJOINT_FROM_PL[type(op.base).__name__]]
    if name == "PauliRot":
        return paulirot_gate(op.hyperparameters["pauli_word"])
    if name == "MultiRZ":
        return multirz_gate(len(op.wires))
    return GATES[_FROM_PL[name]]


_PROJECTORS: dict = {}


def tape_projector(op) -> bool:
    """Whether ``op`` is a constant ``qml.Projector`` onto a basis state used as an operation
    (the postselection of a deferred mid-circuit measurement)."""
    if type(op).__name__ != "BasisStateProjector":
        return False
    import pennylane as qml
    d = op.data[0]
    return qml.math.ndim(d) == 1 and not qml.math.requires_grad(d)


def projector_gate(bits) -> Gate:
    """The (non-unitary) diagonal projector onto the basis state ``bits`` of its wires: one
    gate object per ``bits``."""
    bits = tuple(int(b) for b in bits)
    gate = _PROJECTORS.get(bits)
    if gate is None:
        d = torch.zeros(2 ** len(bits), dtype=torch.complex128)
        d[int("".join(map(str, bits)), 2) if bits else 0] = 1.0
        gate = _PROJECTORS[bits] = Gate(
            "projector", len(bits), 0, lambda *_: torch.diag(d), diag_fn=lambda *_: d,
            pl_name="Projector", hyper=(bits,))
    return gate


def _pcphase(op) -> Gate:
    return pcphase_gate(int(op.hyperparameters["dimension"][0]), len(op.wires))


def _constant_diagonal(op) -> bool:
    """A ``DiagonalQubitUnitary`` whose diagonal is neither trainable nor broadcast."""
    import pennylane as qml
    d = op.data[0]
    return qml.math.ndim(d) == 1 and not qml.math.requires_grad(d)


def _single_gate_params(op) -> tuple:
    """The angles of :func:`_single_gate` (a ``QubitUnitary``'s matrix is part of its gate)."""
    if type(op).__name__ in ("QubitUnitary", "DiagonalQubitUnitary"):
        return ()
    return tuple(_param_tensor(p, op.name) for p in op.data)


def from_pennylane_tape(tape, labels, measurements=None, check_batch=None, channels=False,
                        postselect=False):
    """Convert a PennyLane tape whose operations all pass :func:`tape_op_supported` or
    :func:`tape_trainable_matrix` (or, with
    ``channels``, :func:`tape_channel_supported`; with ``postselect``, :func:`tape_projector`:
    the unnormalised projection) into ``(recorded, sources)``.

    ``recorded`` is a :class:`Recorded` on the wires ``labels`` (in that order) whose circuit
    carries ``measurements`` (qdiff measurements; default none). A leading state preparation
    (any ``StatePrepBase``: ``StatePrep``, ``AmplitudeEmbedding``, ``BasisEmbedding``, ...)
    becomes the initial state. ``sources[c] = (k, factor)``
    says theta column ``c`` is ``factor`` times the tape's parameter ``k`` (index into
    ``tape.get_parameters(trainable_only=False)``), so gradients by column map back to the
    tape's parameters. Tensors requiring grad stay in the graph (backprop through torch).
    """
    from pennylane.operation import StatePrepBase
    items, sources = [], []
    k = 0
    for pos, op in enumerate(tape.operations):
        name = type(op).__name__
        wires = tuple(op.wires)
        nd = len(op.data)
        if pos == 0 and isinstance(op, StatePrepBase):
            if name == "BasisState" and op.batch_size is None:
                bits = np.asarray(op.data[0]).astype(int).reshape(-1)
                items.extend(Operation(GATES["x"], (w,), ()) for w, b in zip(wires, bits) if b)
            else:  # StatePrep, AmplitudeEmbedding, BasisEmbedding, CosineWindow, ...
                vec = op.state_vector(wire_order=wires)
                if hasattr(vec, "toarray"):  # a scipy sparse state
                    vec = vec.toarray()
                vec = vec if isinstance(vec, torch.Tensor) else torch.as_tensor(np.asarray(vec))
                vec = vec.reshape(*vec.shape[:vec.ndim - len(wires)], 2 ** len(wires))
                vec = vec.to(torch.complex128)
                items.append(StatePrep(_unit(vec),
                                       wires))
            k += nd
            continue
        if channels and tape_channel_supported(op):
            items.append(_channel_operation(op, wires))
            if name != "QubitChannel":
                sources.extend((k + i, 1.0) for i in range(nd))
            k += nd
            continue
        if postselect and tape_projector(op):
            bits = np.asarray(op.data[0]).astype(int)
            items.append(Operation(projector_gate(bits), wires, ()))
            k += nd
            continue
        if not tape_op_supported(op) and not tape_trainable_matrix(op):
            raise QdiffError(f"operation {op.name} on wires {list(wires)} is not supported "
                             "directly; decompose it first")
        if name == "GlobalPhase":  # exp(-i phi) I on any one wire
            w = (wires or tuple(labels))[:1]
            items.append(Operation(GATES["globalphase"], w, (_param_tensor(op.data[0], name),)))
            sources.append((k, 1.0))
        elif name in ("Snapshot", "Barrier"):
            pass
        elif name not in TAPE_NATIVE and _is_controlled(op):
            ctrl = tuple(op.control_wires)
            flips = [Operation(GATES["x"], (w,), ()) for w, v in zip(ctrl, op.control_values)
                     if not v]
            gate = controlled_gate(_single_gate(op.base), len(ctrl))
            params = _single_gate_params(op.base)
            items.extend(flips)
            items.append(Operation(gate, ctrl + tuple(op.base.wires), params))
            items.extend(flips)
            sources.extend((k + i, 1.0) for i in range(len(params)))
        else:
            params = _single_gate_params(op)
            items.append(Operation(_single_gate(op), wires, params))
            sources.extend((k + i, 1.0) for i in range(len(params)))
        k += nd
    rec = Circuit.from_recording(items, labels, list(measurements or ()), check_batch)
    return rec, sources
