"""Optimization levels, pass composition and verified fallback.

A pass is a pure function ``Circuit -> Circuit``; ``chain(p1, p2, ...)`` composes them and
``guarded(p)`` checks the result against the input (unitary or random states) and falls back to
the input when the check fails.

>>> from qdiff.compiler.cancel import cancel_inverses
>>> from qdiff.compiler.merge import merge_rotations
>>> p = chain(cancel_inverses, merge_rotations)
>>> p.__name__
'cancel_inverses+merge_rotations'
"""
from __future__ import annotations

import time

from qdiff.compiler.cancel import cancel_inverses
from qdiff.compiler.commute import commutative_cancellation
from qdiff.compiler.consolidate import consolidate_2q
from qdiff.compiler.fuse import fuse_1q
from qdiff.compiler.identity import remove_identities
from qdiff.compiler.merge import merge_rotations
from qdiff.compiler.ops import cx_count
from qdiff.compiler.verify import TOL, equivalence


def chain(*passes):
    """Compose passes left to right into one pass."""
    def composed(circuit):
        for p in passes:
            circuit = p(circuit)
        return circuit
    composed.__name__ = "+".join(getattr(p, "__name__", "pass") for p in passes)
    return composed


def guarded(p, verify: str = "auto", log: list | None = None, tol: float = TOL):
    """``p`` whose result is verified equivalent to its input (process infidelity at most
    ``tol``: 1e-12, or an approximation budget); on failure the input is kept."""
    def safe(circuit):
        t0 = time.perf_counter()
        out = p(circuit)
        if verify != "none" and out is not circuit:
            v = equivalence(circuit, out, "auto" if verify == "final" else verify, tol=tol)
            if not v.ok:
                if log is not None:
                    log.append(f"{p.__name__}: not verified (1-F={v.infidelity:.2e}); kept input")
                return circuit
        if log is not None:
            log.append(f"{p.__name__}: {cx_count(circuit.operations)} -> "
                       f"{cx_count(out.operations)} CX ({time.perf_counter() - t0:.2f} s)")
        return out
    safe.__name__ = p.__name__
    return safe


def fixpoint(p, max_rounds: int = 4):
    """Repeat ``p`` while the CX count (then the gate count) keeps falling."""
    def repeated(circuit):
        for _ in range(max_rounds):
            new = p(circuit)
            old_key = (cx_count(circuit.operations), len(circuit.operations))
            if (cx_count(new.operations), len(new.operations)) >= old_key:
                return new if cx_count(new.operations) <= old_key[0] else circuit
            circuit = new
        return circuit
    repeated.__name__ = f"fixpoint({p.__name__})"
    return repeated


level1 = chain(remove_identities, cancel_inverses, merge_rotations, commutative_cancellation)
level1.__name__ = "level1"
level2 = fixpoint(chain(level1, fuse_1q, commutative_cancellation, consolidate_2q, fuse_1q,
                        commutative_cancellation))
level2.__name__ = "level2"
