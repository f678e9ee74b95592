"""Level 3: several re-synthesis strategies; the smallest verified result wins.

Candidates (each cleaned up by level 2 and verified against its input):

* ``level2``: the level-2 result;
* ``pauli``: Pauli-rotation re-synthesis (``pauli.py``) of the level-2 result and of the input,
  with seeded tie-breaking variants and two syntheses of the remaining Clifford;
* ``gadgets``: greedy Pauli-network re-synthesis with two-qubit Clifford entanglers scored
  on the next rotations and the remaining Clifford (``gadgets.py``), of the input and of the
  level-2 result, a few deterministic variants each (constant circuits);
* ``qiskit``: Qiskit's ``transpile(optimization_level=3)`` output, then qdiff's level 2 (above
  four qubits);
* ``shannon``: for whole circuits of at most four qubits, the quantum Shannon decomposition of
  the circuit's unitary.

The winner then goes through gradient-based three-qubit block re-synthesis (``blockopt.py``)
within a work budget (Levenberg-Marquardt iterations, not seconds: the same input and seed give
the same output on any machine), rounds of level 2 in between, and Clifford+T angle snapping.
In a discrete basis (Clifford+T) only the strategies that keep angles at multiples of pi/4 run.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from qdiff.compiler.blockopt import block_resynthesis
from qdiff.compiler.blocks import block_unitary
from qdiff.circuits.errors import QdiffError
from qdiff.compiler.budget import EXACT_DELTA, Budget, Work, phase_distance
from qdiff.compiler.lower import lower
from qdiff.compiler.ops import cx_count, depth, is_constant, t_count
from qdiff.compiler.gadgets import VARIANTS as GADGET_VARIANTS, greedy_pauli, windowed
from qdiff.compiler.pauli import pauli_resynthesis
from qdiff.compiler.pipeline import chain, guarded, level1, level2
from qdiff.compiler.snap import snap_angles
from qdiff.compiler.verify import equivalence

# windowed re-synthesis of the winner: (width in CX, offset of the first window)
WINDOWS = ((64, 0), (96, 48))
# CX counts of the sources of the optional strategies, summed (see _strategies)
STRATEGY_WORK = 24000
PAULI_VARIANTS = 10
LAYERED_VARIANTS = 4
BLOCK_ROUNDS = 3
# Qiskit's O3 snaps two-qubit blocks to nearby special gates (Weyl specialization at trace
# fidelity 1 - 1e-9): a 1e-6 rad rotation vanishes at a process infidelity of 2.5e-13, under
# the verifier's exact bound. Its candidate must match its source to rounding: by the
# phase-aligned distance of the unitaries up to EXACT_QUBITS, else by a process infidelity at
# the verifier's rounding floor (QISKIT_TOL).
EXACT_QUBITS = 8
QISKIT_TOL = 1e-14


@dataclass
class Search:
    """What a level-3 search needs besides the circuit."""

    verify: str = "auto"
    seed: int = 0
    work: Work = field(default_factory=lambda: Work(float("inf")))
    budget: Budget = field(default_factory=Budget)
    log: list = field(default_factory=list)
    progress: object = None  # callable(stage: str, best_cx: int) or None
    discrete: bool = False   # Clifford+T: keep angles at multiples of pi/4
    admissible: object = None  # callable(circuit) -> bool: within the rebased input's counts

    def tell(self, stage: str, best_cx: int) -> None:
        if self.progress is not None:
            self.progress(stage, best_cx)


def score(c):
    """``(2q gates, depth, gates, T gates)``: smaller is better, compared in that order; the
    "never worse" checks require each count to be at most the input's (T included, so a
    Clifford+T circuit never gains T gates)."""
    return (cx_count(c.operations), depth(c.operations, c.num_wires), len(c.operations),
            t_count(c.operations))


def qiskit_o3(circuit):
    """Qiskit's best level as a candidate (constant circuits only), lowered back to qdiff."""
    from qiskit import transpile
    from qdiff.circuits.qiskit_io import from_qiskit, to_qiskit
    qc = transpile(to_qiskit(circuit), basis_gates=["cx", "u"], optimization_level=3,
                   seed_transpiler=0, approximation_degree=1.0)
    out = lower(circuit.with_operations(from_qiskit(qc, dynamic=False).circuit.operations))
    if circuit.num_wires <= EXACT_QUBITS:
        wires = tuple(range(circuit.num_wires))
        dist = phase_distance(block_unitary(out.operations, wires),
                              block_unitary(circuit.operations, wires))
        if dist > EXACT_DELTA:
            raise QdiffError(f"Qiskit O3 approximated the circuit (distance {dist:.2g})")
    return out


qiskit_o3.tol = QISKIT_TOL
qiskit_o3.checked_qubits = EXACT_QUBITS  # wider outputs are exact only once verified


def shannon_whole(circuit):
    """The whole circuit's unitary by the quantum Shannon decomposition, exact to rounding
    (checked; a QdiffError when no decomposition is)."""
    from qdiff.compiler.synth import exact_synthesis
    wires = tuple(range(circuit.num_wires))
    return circuit.with_operations(exact_synthesis(block_unitary(circuit.operations, wires),
                                                   wires))


def _strategies(lowered, opt, s: Search, coupling):
    """``[(name, pass, source)]`` in a fixed order (each pauli pass gets its own budget copy).

    The first Pauli syntheses and Qiskit O3 / Shannon always run; the variants after them
    (greedy Pauli-network syntheses first, then seeded Pauli syntheses) run while the CX counts
    of their sources add up to at most ``STRATEGY_WORK``: a function of the input only, so the
    result does not depend on the machine's load, and large circuits stay within their time."""
    if coupling is not None:
        return []
    pauli = functools.partial(pauli_resynthesis)
    core = [("pauli", pauli, opt), ("pauli(input)", pauli, lowered)]
    extra = []
    if not s.discrete and all(is_constant(o) for o in lowered.operations):
        # up to 4 qubits the whole-circuit Shannon decomposition takes Qiskit O3's place (its
        # first call loads Qiskit's transpiler plugins: seconds, for a candidate that small
        # circuits' Pauli/Shannon/block results beat)
        if lowered.num_wires <= 4:
            core.append(("shannon", shannon_whole, lowered))
        else:
            core.append(("qiskit", qiskit_o3, lowered))
        for seed, cw, rev in GADGET_VARIANTS:
            variant = functools.partial(greedy_pauli, seed=seed, cliff_weight=cw, reverse=rev)
            tag = f"seed={seed},clifford={cw}" + (",reverse" if rev else "")
            extra += [(f"gadgets(input,{tag})", variant, lowered),
                      (f"gadgets({tag})", variant, opt)]
    for seed in range(1, 1 + PAULI_VARIANTS):  # random tie-breaking: cheap, often better
        variant = functools.partial(pauli_resynthesis, seed=seed)
        extra += [(f"pauli(input,seed={seed})", variant, lowered),
                  (f"pauli(seed={seed})", variant, opt)]
    for seed in range(LAYERED_VARIANTS):  # the final Clifford by Qiskit's layered synthesis
        variant = functools.partial(pauli_resynthesis, seed=seed, clifford="layers")
        extra += [(f"pauli(input,seed={seed},layers)", variant, lowered),
                  (f"pauli(seed={seed},layers)", variant, opt)]
    out, work = list(core), 0
    for cand in extra:
        work += max(1, cx_count(cand[2].operations))
        if work > STRATEGY_WORK:
            s.log.append(f"strategies: {len(extra) - len(out) + len(core)} variants left out "
                         f"(their sources' CX would pass {STRATEGY_WORK})")
            break
        out.append(cand)
    return out


def optimize3(lowered, opt, s: Search, coupling=None):
    """The best of the candidates, then block re-synthesis; returns ``(circuit, name)``.

    Candidates are built unchecked, then checked best first until one verifies: a check costs
    more than most strategies, and only the winner needs one."""
    clean = level1 if s.discrete else level2
    cands = [("level2", None, opt, s.budget.copy())]
    tols = {}
    best_cx = cx_count(opt.operations)
    for name, p, src in _strategies(lowered, opt, s, coupling):
        if s.work.exhausted:
            break
        if s.verify == "none" and hasattr(p, "tol") and \
                src.num_wires > getattr(p, "checked_qubits", 0):
            # a strategy whose exactness rests on the check is not taken unchecked
            s.log.append(f"{name}: left out (its result is exact only once checked; verify none)")
            continue
        b = s.budget.copy()
        fn = functools.partial(p, budget=b) if getattr(p, "func", None) is pauli_resynthesis else p
        try:
            out = chain(fn, clean)(src)
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException as exc:  # noqa: BLE001 (a Rust panic in Qiskit is one too)
            # a strategy that cannot handle this circuit is skipped
            s.log.append(f"{name}: skipped ({type(exc).__name__}: {exc})")
            continue
        if hasattr(p, "tol"):  # a strategy that may approximate without charging the
            # budget: held to its own tolerance, with or without an approximation budget
            tols[name] = min(b.tol, p.tol)
        cands.append((name, src, out, b))
        best_cx = min(best_cx, cx_count(out.operations))
        s.tell(name, best_cx)
    s.log.append("candidates: " + ", ".join(f"{n}={cx_count(c.operations)}" for n, _, c, _ in cands))
    name, best, budget = _first_verified(cands, s, tols)
    s.budget.spent = budget.spent
    if not s.discrete and coupling is None and all(is_constant(o) for o in best.operations):
        best, name = _window_rounds(best, name, s)
    if not s.discrete:
        best, name = _block_rounds(best, name, s)
    return best, name


def _first_verified(cands, s: Search, tols=None):
    """The best admissible candidate whose check passes (the level-2 result needs none);
    ``tols``: a tighter tolerance by candidate name."""
    order = sorted(cands, key=lambda t: score(t[2]))
    for name, src, out, budget in order:
        if s.admissible is not None and not s.admissible(out):
            continue
        if src is None or s.verify == "none":
            return name, out, budget
        v = equivalence(src, out, "auto", tol=(tols or {}).get(name, budget.tol))
        if v.ok:
            return name, out, budget
        s.log.append(f"{name}: not verified (1-F={v.infidelity:.2e}); dropped")
    return cands[0][0], cands[0][2], cands[0][3]


def _window_rounds(best, name, s: Search):
    """Greedy Pauli-network re-synthesis of CX windows of the winner (``WINDOWS``), checked
    once for all windows; kept when it lowers the score."""
    def windows(c):
        for w, o in WINDOWS:
            c = level2(windowed(c, w, o, clean=level2))
        return c
    new = guarded(windows, s.verify, s.log, s.budget.tol)(best)
    if score(new) < score(best) and (s.admissible is None or s.admissible(new)):
        s.tell("windows", cx_count(new.operations))
        return new, name + "+windows"
    return best, name


def _block_rounds(best, name, s: Search):
    for rnd in range(BLOCK_ROUNDS):
        if s.work.exhausted:
            break

        def blocks(c, _r=rnd):
            return level2(block_resynthesis(c, s.work, s.budget, s.seed + _r, s.log))
        blocks.__name__ = f"blocks{rnd}"
        spent = s.budget.spent
        new = guarded(blocks, s.verify, s.log, s.budget.tol)(best)
        if score(new) >= score(best) or (s.admissible is not None and not s.admissible(new)):
            s.budget.spent = spent
            break
        best = new
        name = name if name.endswith("+blocks") else name + "+blocks"
        s.tell(f"blocks round {rnd + 1}", cx_count(best.operations))
    snapped = guarded(chain(snap_angles, level2), s.verify, s.log, s.budget.tol)(best)
    if score(snapped) <= score(best) and (s.admissible is None or s.admissible(snapped)):
        best = snapped
    return best, name
