"""Level 3: several re-synthesis strategies; the smallest verified result wins.

Candidates (each cleaned up by level 2 and verified against its input):

* ``level2``: the level-2 result;
* ``pauli``: Pauli-rotation re-synthesis (``pauli.py``) of the level-2 result and of the input;
* ``qiskit``: Qiskit's ``transpile(optimization_level=3)`` output, then qdiff's level 2;
* ``shannon``: for whole circuits of at most four qubits, the quantum Shannon decomposition of
  the circuit's unitary.

The winner then goes through gradient-based three-qubit block re-synthesis (``blockopt.py``)
until the deadline, rounds of level 2 in between, and Clifford+T angle snapping.
"""
from __future__ import annotations

import functools
import time

from qdiff.compiler.blockopt import block_resynthesis
from qdiff.compiler.blocks import block_unitary
from qdiff.compiler.lower import lower
from qdiff.compiler.ops import cx_count, depth, is_constant
from qdiff.compiler.pauli import pauli_resynthesis
from qdiff.compiler.pipeline import chain, guarded, level2
from qdiff.compiler.snap import snap_angles


PAULI_VARIANTS = 2


def _score(c):
    return (cx_count(c.operations), depth(c.operations, c.num_wires), len(c.operations))


def qiskit_o3(circuit):
    """Qiskit's best level as a candidate (constant circuits only), lowered back to qdiff."""
    from qiskit import transpile
    from qdiff.circuits.qiskit_io import from_qiskit, to_qiskit
    qc = transpile(to_qiskit(circuit), basis_gates=["cx", "u"], optimization_level=3,
                   seed_transpiler=0)
    return lower(circuit.with_operations(from_qiskit(qc).circuit.operations))


def shannon_whole(circuit):
    from qdiff.compiler.synth import shannon
    wires = tuple(range(circuit.num_wires))
    return circuit.with_operations(shannon(block_unitary(circuit.operations, wires), wires))


def optimize3(lowered, opt, verify, seed, deadline, report, basis, coupling=None):
    log = report.log
    constant = all(is_constant(o) for o in lowered.operations)
    cands = [("level2", opt)]

    def add(name, p, src):
        if time.perf_counter() > deadline:
            return
        strategy = chain(p, level2)
        strategy.__name__ = name
        try:
            cands.append((name, guarded(strategy, verify, log)(src)))
        except Exception as exc:  # a strategy that cannot handle this circuit is skipped
            log.append(f"{name}: skipped ({type(exc).__name__}: {exc})")

    if coupling is None:
        add("pauli", pauli_resynthesis, opt)
        add("pauli(input)", pauli_resynthesis, lowered)
        for s in range(1, 1 + PAULI_VARIANTS):  # random tie-breaking: cheap, often better
            add(f"pauli(input,seed={s})", functools.partial(pauli_resynthesis, seed=s), lowered)
            add(f"pauli(seed={s})", functools.partial(pauli_resynthesis, seed=s), opt)
        if constant:
            add("qiskit", qiskit_o3, lowered)
            if lowered.num_wires <= 4:
                add("shannon", shannon_whole, lowered)
    name, best = min(cands, key=lambda t: _score(t[1]))
    log.append(f"candidates: " + ", ".join(f"{n}={cx_count(c.operations)}" for n, c in cands))
    for rnd in range(3):
        if time.perf_counter() > deadline:
            break
        def blocks(c, _r=rnd):
            return level2(block_resynthesis(c, deadline, seed + _r, log))
        blocks.__name__ = f"blocks{rnd}"
        new = guarded(blocks, verify, log)(best)
        if _score(new) >= _score(best):
            break
        best = new
        name = name.split("+")[0] + "+blocks"
    snapped = guarded(chain(snap_angles, level2), verify, log)(best)
    if _score(snapped) <= _score(best):
        best = snapped
    report.strategy = name
    return best
