"""Decompositions of gates that other toolkits lack, derived from the gate definitions.

A one-parameter gate whose generator is a sum of mutually commuting Pauli words,
``G = sum_k c_k P_k``, is exactly ``prod_k PauliRot(2 c_k phi, P_k)``; a Pauli rotation is a
basis change, a CNOT ladder and one RZ; an identity term is a ``GlobalPhase``. So
SingleExcitation, DoubleExcitation (and their Plus/Minus forms), OrbitalRotation, IsingXY,
CPhaseShift00/01/10, MultiRZ and PauliRot reach any toolkit's standard gates without a
hand-written rule. A gate ``U = A exp(-i phi G)`` with ``A != I`` (PSWAP) or whose generator's
terms do not commute (FermionicSWAP) carries its own decomposition.

>>> from qdiff.circuits.gates import GATES
>>> from qdiff.circuits.operation import Operation
>>> [o.name for o in decompose(Operation(GATES["single_excitation"], (0, 1), (0.3,)))][:3]
['h', 'rx', 'cx']
"""
from __future__ import annotations

import functools
import itertools
import math
from typing import Optional

import numpy as np

from qdiff.circuits import caches
from qdiff.circuits.circuit import memo
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.gates import (DENSE_WORD_WIRES, GATES, PauliGenerator, multirz_gate,
                                  paulirot_gate)
from qdiff.circuits.operation import Operation

_P = {"I": np.eye(2), "X": np.array([[0, 1], [1, 0]]), "Y": np.array([[0, -1j], [1j, 0]]),
      "Z": np.diag([1.0, -1.0])}


def pauli_decompose(m: np.ndarray, tol: float = 1e-12) -> list[tuple[float, str]]:
    """Real coefficients ``[(c, word), ...]`` of a Hermitian matrix in the Pauli basis."""
    k = int(round(math.log2(m.shape[0])))
    out = []
    for letters in itertools.product("IXYZ", repeat=k):
        p = functools.reduce(np.kron, [_P[c] for c in letters])
        c = np.trace(p @ m).real / 2 ** k
        if abs(c) > tol:
            out.append((float(c), "".join(letters)))
    return out


def _scaled(p, c: float):
    """``c * p`` for a float or a ParamRef/tensor angle."""
    return p * c if not isinstance(p, float) else float(p) * c


def paulirot_ops(angle, word: str, wires) -> list[Operation]:
    """``exp(-i angle P / 2)``: basis change, CNOT ladder onto the last active wire, RZ, undo."""
    act = [(w, c) for w, c in zip(wires, word) if c != "I"]
    if not act:  # exp(-i angle / 2) I: kept, a controlled gate sees it
        return [Operation(GATES["globalphase"], tuple(wires[:1]), (_scaled(angle, 0.5),))]
    pre, post = [], []
    for w, c in act:
        if c == "X":
            pre.append(Operation(GATES["h"], (w,)))
            post.append(Operation(GATES["h"], (w,)))
        elif c == "Y":
            pre.append(Operation(GATES["rx"], (w,), (math.pi / 2,)))
            post.append(Operation(GATES["rx"], (w,), (-math.pi / 2,)))
    ladder = [Operation(GATES["cx"], (act[i][0], act[i + 1][0])) for i in range(len(act) - 1)]
    rz = Operation(GATES["rz"], (act[-1][0],), (angle,))
    return pre + ladder + [rz] + ladder[::-1] + post


@caches.cached(maxsize=None)
def _commuting_terms(gate_key):
    gate = gate_key
    g = np.asarray(gate.generators[0])
    probe = 0.7317
    ev, vec = np.linalg.eigh(g)
    want = (vec * np.exp(-1j * probe * ev)) @ vec.conj().T
    got = gate.matrix(probe).detach().cpu().numpy()
    if not np.allclose(got, want, atol=1e-10):  # U = A exp(-i phi G) B with A, B != I
        raise QdiffError(f"gate '{gate.pl_name or gate.name}' is not exp(-i phi G) of its "
                         "generator and has no decomposition")
    terms = pauli_decompose(g)
    mats = [functools.reduce(np.kron, [_P[c] for c in w]) for _, w in terms]
    for a, b in itertools.combinations(mats, 2):
        if not np.allclose(a @ b, b @ a):
            raise QdiffError(f"gate '{gate.name}': generator terms do not commute; no decomposition")
    return terms


def decompose(op: Operation) -> list[Operation]:
    """Express ``op`` in standard one- and two-qubit gates (``rot``/``crot``/``u2`` included)."""
    name, p, w = op.name, op.params, op.wires
    if op.gate.decomposition is not None:
        return [Operation(GATES[g], w if not at else tuple(w[i] for i in at[0]), ps)
                for g, ps, *at in op.gate.decomposition(p)]
    if name == "paulirot":
        return paulirot_ops(p[0], op.gate.hyper[0], w)
    if name == "multirz":
        return paulirot_ops(p[0], "Z" * len(w), w)
    if op.gate.num_params == 1 and op.gate.generators is not None:
        out = []
        for c, word in _commuting_terms(op.gate):
            if set(word) == {"I"}:  # exp(-i c phi) I: kept, a controlled gate sees it
                out.append(Operation(GATES["globalphase"], w[:1], (_scaled(p[0], c),)))
            else:
                out.extend(paulirot_ops(_scaled(p[0], 2 * c), word, w))
        return out
    raise QdiffError(f"no decomposition for gate '{op.gate.pl_name or name}'")


# ------------------------------------------------------------------------------------------
# wide Pauli rotations, as the engines run them

#: a PauliRot on more wires than this runs as a basis change around a MultiRZ (statevector)
#: or as its CNOT ladder (density matrices); a MultiRZ on more than ``DENSE_WORD_WIRES`` wires
#: folds its extra wires' parity onto ``DENSE_WORD_WIRES`` of them with CNOTs
LOWER_PAULIROT_WIRES = 4


def pauli_generator_terms(gate) -> tuple:
    """``((c, word), ...)`` of a one-parameter gate's generator: read off a Pauli word kept
    as such, else the dense matrix's Pauli decomposition."""
    g = gate.generator
    if isinstance(g, PauliGenerator):
        return ((g.coeff, g.word),)
    return tuple(pauli_decompose(np.asarray(g)))


def _fold_multirz(angle, wires) -> list[Operation]:
    """``MultiRZ`` on ``wires`` with at most ``DENSE_WORD_WIRES`` wires per gate: the extra
    wires' bits XORed into the kept ones by CNOTs (the parity, hence the phase, is the same)."""
    keep, extra = wires[:DENSE_WORD_WIRES], wires[DENSE_WORD_WIRES:]
    if not extra:
        return [Operation(multirz_gate(len(wires)), tuple(wires), (angle,))]
    fold = [Operation(GATES["cx"], (e, keep[i % len(keep)])) for i, e in enumerate(extra)]
    return fold + [Operation(multirz_gate(len(keep)), tuple(keep), (angle,))] + fold[::-1]


def _lower_statevector(op) -> Optional[list]:
    name, k = op.gate.name, op.gate.num_wires
    if name == "multirz" and k > DENSE_WORD_WIRES:
        return _fold_multirz(op.params[0], op.wires)
    if name != "paulirot" or k <= LOWER_PAULIROT_WIRES:
        return None
    act = [(w, c) for w, c in zip(op.wires, op.gate.hyper[0]) if c != "I"]
    if not act:  # exp(-i theta / 2) I, a global phase: the one-wire rotation "I" (the same
        # angle: no arithmetic on it here, where tensors are built as constants)
        return [Operation(paulirot_gate("I"), op.wires[:1], op.params)]
    # X = H Z H and Y = SX^dag Z SX: exp(-i t P / 2) = V^dag exp(-i t Z..Z / 2) V
    pre = [Operation(GATES["h" if c == "X" else "sx"], (w,)) for w, c in act if c != "Z"]
    post = [Operation(GATES["h" if c == "X" else "sxdg"], (w,)) for w, c in act if c != "Z"]
    return pre + _fold_multirz(op.params[0], [w for w, _ in act]) + post


def _lower_mixed(op) -> Optional[list]:
    if op.gate.name not in ("paulirot", "multirz") or op.gate.num_wires <= LOWER_PAULIROT_WIRES:
        return None
    word = op.gate.hyper[0] if op.gate.name == "paulirot" else "Z" * op.gate.num_wires
    return paulirot_ops(op.params[0], word, op.wires)


_LOWERINGS = {"statevector": _lower_statevector, "mixed": _lower_mixed}


def lowered_op(op, engine: str = "statevector") -> list:
    """``[op]``, or a wide Pauli rotation as the ``engine`` runs it (see :func:`lowered`)."""
    sub = _LOWERINGS[engine](op) if op.gate.name in ("paulirot", "multirz") else None
    return [op] if sub is None else sub


def lowered(circuit, engine: str):
    """``circuit`` as the ``engine`` (``"statevector"`` or ``"mixed"``) runs it: wide Pauli
    rotations as gates on few wires, the same unitary exactly, every angle the same parameter
    reference (so gradients per parameter are unchanged); ``circuit`` itself when it has none."""
    def build():
        parts = [lowered_op(op, engine) for op in circuit.operations]
        if all(len(p) == 1 and p[0] is op for p, op in zip(parts, circuit.operations)):
            return circuit
        return circuit.with_operations([sub for p in parts for sub in p])
    return memo(circuit, ("lowered", engine), build)
