"""Exact synthesis helpers: Qiskit's KAK (two qubits) and Shannon decomposition (more).

Matrices are big-endian in the order of ``wires`` (qdiff's convention); Qiskit reads them
little-endian, so Qiskit qubit ``i`` is ``wires[k - 1 - i]``.

Qiskit's two-qubit decomposer snaps a unitary within a fidelity of 1e-9 of a special point
of the Weyl chamber (the identity, CX, ...) to that point, so its output can be off by ~1e-5
in distance. :func:`exact_synthesis` checks every result against the matrix (phase-aligned
distance ``<= EXACT_DELTA``) and otherwise writes the unspecialised Weyl decomposition
``K1 exp(i(a XX + b YY + c ZZ)) K2`` with 2 or 3 CX.
"""
from __future__ import annotations

import math
import os
import sys
import tempfile
import threading
import warnings

import numpy as np

from qdiff.circuits import caches
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.gates import get_gate
from qdiff.compiler.ops import op

_GUARD = threading.RLock()  # (a guarded call may make guarded calls: only the outer redirects)
_capture: list = []  # the process's capture file for stderr (created on first use)
_depth = threading.local()


def guarded(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, a call into Qiskit's native synthesis, with its failures made
    a :class:`QdiffError`: a ``QiskitError``, or a panic of its Rust code (pyo3's
    ``PanicException``, a ``BaseException``: e.g. the Weyl decomposition's "failed to
    diagonalize M2" on some nearly block-diagonal inputs). Rust's panic hook writes the panic
    to the process's stderr before Python sees it: while ``fn`` runs, file descriptor 2 goes to
    a capture file, which is written back to stderr afterwards unless the call panicked."""
    from qiskit.exceptions import QiskitError
    with _GUARD:
        saved, outer = None, not getattr(_depth, "n", 0)
        try:
            if outer:
                sys.stderr.flush()
                if not _capture:
                    _capture.append(tempfile.TemporaryFile())
                cap = _capture[0].fileno()
                os.lseek(cap, 0, os.SEEK_SET)
                os.ftruncate(cap, 0)
                saved = os.dup(2)
        except (OSError, ValueError, AttributeError):  # no stderr to guard: call as it is
            saved = None
        if saved is not None:
            os.dup2(cap, 2)
        if outer:
            _depth.panicked = False  # set by a guarded call inside that panics
        _depth.n = getattr(_depth, "n", 0) + 1
        try:
            return fn(*args, **kwargs)
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException as exc:
            if type(exc).__name__ == "PanicException":
                _depth.panicked = True
            elif not isinstance(exc, QiskitError):
                raise
            text = " ".join(str(exc).split())
            raise QdiffError(f"Qiskit's synthesis failed: {text[:200]}") from None
        finally:
            _depth.n -= 1
            if saved is not None:
                try:
                    sys.stderr.flush()
                except (OSError, ValueError, AttributeError):
                    pass
                os.dup2(saved, 2)
                os.close(saved)
                if not _depth.panicked:
                    size = os.lseek(cap, 0, os.SEEK_END)
                    if size:
                        os.lseek(cap, 0, os.SEEK_SET)
                        data = os.read(cap, size)
                        try:
                            os.write(2, data)
                        except OSError:
                            pass


@caches.cached(maxsize=1)
def _kak():
    from qiskit.circuit.library import CXGate
    from qiskit.synthesis import TwoQubitBasisDecomposer
    return TwoQubitBasisDecomposer(CXGate())


def kak_cx_count(u: np.ndarray) -> int:
    return int(guarded(_kak().num_basis_gates, u))


def kak(u: np.ndarray, wires) -> list:
    """Optimal (<= 3 CX) circuit for a 4x4 unitary ``u`` on ``wires``."""
    return from_qiskit_ops(guarded(_kak(), u), wires)


def exact_synthesis(u: np.ndarray, wires) -> list:
    """CX + one-qubit ops reproducing the ``2**k`` unitary ``u`` on ``wires`` to rounding
    (phase-aligned distance at most ``EXACT_DELTA``, checked); a QdiffError otherwise."""
    from qdiff.compiler.blocks import block_unitary
    from qdiff.compiler.budget import EXACT_DELTA, phase_distance
    k = len(wires)
    if k == 1:
        from qdiff.compiler.fuse import canonical_1q
        tries = [lambda: canonical_1q(u, wires[0])]
    elif k == 2:
        tries = [lambda: kak(u, wires), lambda: weyl_exact(u, wires)]
    else:
        tries = [lambda: shannon(u, wires), lambda: shannon(u, wires, exact_2q=True)]
    best, failed = math.inf, None
    for make in tries:
        try:
            ops = make()
        except QdiffError as exc:  # Qiskit's synthesis failed on this input: the next way
            failed = exc
            continue
        dist = phase_distance(block_unitary(ops, wires), u)
        if dist <= EXACT_DELTA:
            return ops
        best = min(best, dist)
    if best == math.inf:
        raise QdiffError(f"{k}-qubit unitary: no exact decomposition found ({failed})")
    raise QdiffError(f"{k}-qubit unitary: no exact decomposition found (best distance "
                     f"{best:.2g} > {EXACT_DELTA:g})")


def weyl_exact(u: np.ndarray, wires) -> list:
    """``u`` (4x4) as its unspecialised Weyl decomposition: 3 CX, or 2 when the smallest
    coordinate is zero to rounding."""
    from qiskit.synthesis import TwoQubitWeylDecomposition
    w = guarded(TwoQubitWeylDecomposition, np.asarray(u, dtype=complex), fidelity=None)
    a, b, c = w.a, w.b, w.c
    p, q = wires  # kron(K1l, K1r): K1l acts on wires[0] (big-endian)
    seq = [(p, w.K2l), (q, w.K2r)]
    if abs(c) <= 1e-15:
        # exp(i(a XX + b YY)) = RX(-pi/2)^2 CX (RX(-2a) x RZ(-2b)) CX RX(pi/2)^2
        seq += [(p, _rx(math.pi / 2)), (q, _rx(math.pi / 2)), ("cx", p, q),
                (p, _rx(-2 * a)), (q, _rz(-2 * b)), ("cx", p, q),
                (p, _rx(-math.pi / 2)), (q, _rx(-math.pi / 2))]
    else:
        seq += [(p, _rz(-math.pi / 2)), ("cx", p, q), (q, _rz(-2 * c - math.pi / 2)),
                (p, _ry(math.pi / 2 + 2 * a)), ("cx", q, p), (p, _ry(-2 * b - math.pi / 2)),
                ("cx", p, q), (q, _rz(math.pi / 2))]
    seq += [(p, w.K1l), (q, w.K1r)]
    return _merge_1q(seq)


def _rx(t):
    return np.array([[math.cos(t / 2), -1j * math.sin(t / 2)],
                     [-1j * math.sin(t / 2), math.cos(t / 2)]])


def _ry(t):
    return np.array([[math.cos(t / 2), -math.sin(t / 2)], [math.sin(t / 2), math.cos(t / 2)]])


def _rz(t):
    return np.diag([np.exp(-0.5j * t), np.exp(0.5j * t)])


def _merge_1q(seq) -> list:
    """``[(wire, 2x2) | ("cx", c, t)]`` in time order -> ops, one-qubit runs fused."""
    from qdiff.compiler.fuse import canonical_1q
    pending: dict = {}
    out = []
    for item in seq:
        if item[0] == "cx":
            for w in item[1:]:
                if w in pending:
                    out.extend(canonical_1q(pending.pop(w), w))
            out.append(op("cx", item[1:]))
        else:
            w, m = item
            pending[w] = m @ pending[w] if w in pending else np.asarray(m, dtype=complex)
    for w, m in pending.items():
        out.extend(canonical_1q(m, w))
    return out


def shannon(u: np.ndarray, wires, exact_2q: bool = False) -> list:
    """Quantum Shannon decomposition of a ``2**k`` unitary (k >= 3), then basis cx/u3 by
    Qiskit's basis translation (not ``transpile``, whose first call loads every plugin)."""
    from qiskit.synthesis import qs_decomposition
    from qdiff.compiler.qiskit_translation import qiskit_basis_translation
    if not exact_2q:
        return from_qiskit_ops(qiskit_basis_translation(guarded(qs_decomposition, u)), wires)
    from qiskit import QuantumCircuit

    def two_q(m):  # the two-qubit leaves written exactly (Qiskit's little-endian matrices)
        qc = QuantumCircuit(2)
        for o in weyl_exact(m, (1, 0)):
            qc.append(_to_qiskit_gate(o), [x for x in o.wires])
        return qc
    with warnings.catch_warnings():  # a callable decomposer_2q is deprecated in Qiskit 2.x
        warnings.simplefilter("ignore")
        qc = guarded(qs_decomposition, u, decomposer_2q=two_q)
    return from_qiskit_ops(qiskit_basis_translation(qc), wires)


def _to_qiskit_gate(o):
    from qiskit.circuit.library import CXGate, RXGate, RZGate, U3Gate
    return {"cx": CXGate, "rx": RXGate, "rz": RZGate, "u3": U3Gate}[o.name](*o.params)


def from_qiskit_ops(qc, wires) -> list:
    """Qiskit instructions as qdiff ops on ``wires`` (gates looked up in the registry)."""
    k = len(wires)
    out = []
    for inst in qc.data:
        try:
            name = get_gate(inst.operation.name).name
        except QdiffError:
            raise QdiffError(f"synthesis produced unexpected gate '{inst.operation.name}'") \
                from None
        ws = tuple(wires[k - 1 - qc.find_bit(q).index] for q in inst.qubits)
        out.append(op(name, ws, tuple(float(p) for p in inst.operation.params)))
    return out
