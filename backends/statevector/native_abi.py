"""The C boundary of the native kernels, mirrored: ``qd_record`` and the argument blocks of
``qdsim.h`` as a numpy structured dtype and ctypes structures, checked against the loaded
library (:func:`check_abi`: ABI version, the record's size and every field's offset and size,
the argument blocks' sizes), and the error codes the kernels return, raised as
:class:`~qdiff.circuits.errors.QdiffError`.

>>> RECORD.itemsize, RECORD.fields["cmask"][1]
(144, 32)
>>> record(DIAG, [3, 0], cmask=4)[:4]
(1, 2, (3, 0, 0, 0, 0, 0), 4)
"""
from __future__ import annotations

import ctypes
import os

import numpy as np
import torch

from qdiff.circuits.errors import QdiffError, QdiffMemoryError

ABI_VERSION = 7
MAXK = 6   # target bits of one record (qdsim.h QD_MAXK)
MAXA = 3   # angles of one coded gate (QD_MAXA)
C128, C64 = 0, 1          # QD_C128, QD_C64
DENSE, DIAG, FLIP, SWAP = 0, 1, 2, 3  # record kinds
ENOMEM = 1                # QD_ENOMEM
ENONFINITE = 13           # QD_ENONFINITE
BATCH_MAXN = 16           # QD_BATCH_MAXN
DTYPES = {torch.complex128: C128, torch.complex64: C64}
#: the state types of qd_pauli_apply (QD_F64, QD_F32: real states of a real matrix)
PAULI_DTYPES = {**DTYPES, torch.float64: 2, torch.float32: 3}

#: qd_record (qdsim.h) as a numpy structured dtype; checked against the library at load.
RECORD = np.dtype([
    ("kind", "<i4"), ("k", "<i4"), ("bits", "<i4", (MAXK,)), ("cmask", "<i8"),
    ("offset", "<i8"), ("stride", "<i8"), ("code", "<i4"), ("nangles", "<i4"),
    ("col", "<i8", (MAXA,)), ("train", "<i4"), ("reserved", "<i4"),
    ("scale", "<f8", (MAXA,)), ("shift", "<f8", (MAXA,))], align=True)

_i32, _i64, _p = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p


class ProgramArg(ctypes.Structure):
    _fields_ = [("recs", _p), ("nops", _i64), ("data", _p), ("data_len", _i64)]


class AnglesArg(ctypes.Structure):
    _fields_ = [("theta", _p), ("rows", _i64), ("P", _i64)]


class RunArgs(ctypes.Structure):
    _fields_ = [("dtype", _i32), ("n", _i32), ("batch", _i64), ("states", _p),
                ("prog", ProgramArg), ("angles", AnglesArg), ("dagger", _i32),
                ("from_zero", _i32), ("nthreads", _i32), ("tiles", _i32),
                ("bad_record", _i64)]


class AdjointArgs(ctypes.Structure):
    _fields_ = [("dtype", _i32), ("n", _i32), ("batch", _i64), ("psi", _p), ("lam", _p),
                ("prog", ProgramArg), ("angles", AnglesArg), ("gtheta", _p),
                ("shared_cols", _p), ("lo", _i64), ("ldiag", _p), ("slots", ProgramArg),
                ("slot_op", _p), ("grads", _p), ("nthreads", _i32), ("tiles", _i32),
                ("bad_record", _i64), ("ldiag_lo", _p), ("ldiag_bits", _i64)]


class BatchArgs(ctypes.Structure):
    _fields_ = [("dtype", _i32), ("n", _i32), ("batch", _i64), ("prog", ProgramArg),
                ("P", _i64), ("idx", _p), ("scale", _p), ("offset", _p), ("src", _p),
                ("src_len", _p), ("nsrc", _i32), ("nthreads", _i32), ("K", _i64),
                ("words", _p), ("coeffs", _p), ("out", _p), ("psi", _p), ("lanes", _i64),
                ("cot", _p), ("gout", _p), ("theta", _p), ("theta_ready", _i32),
                ("reserved", _i32), ("cshared", _p), ("bad_record", _i64)]


def _pad(values, size: int, fill=0) -> tuple:
    return tuple(values) + (fill,) * (size - len(values))


def record(kind: int, bits, cmask: int = 0, offset: int = 0, stride: int = 0, code: int = 0,
           cols=(), scales=(), shifts=(), train: int = 0) -> tuple:
    """One ``qd_record`` as a tuple in :data:`RECORD`'s field order."""
    return (kind, len(bits), _pad(bits, MAXK), cmask, offset, stride, code, len(cols),
            _pad(cols, MAXA), train, 0, _pad(scales, MAXA, 0.0), _pad(shifts, MAXA, 0.0))



_parallel_pid = None


def tiles() -> int:
    """``QDIFF_NATIVE_TILES``: 1 (default) runs of gates on large states share memory passes in
    cache tiles where that pays off (and, below, gates on two bits fuse into blocks and runs of
    low-bit gates share chunked passes), 0 never (every gate its own pass), 2 always
    (comparisons and tests)."""
    mode = os.environ.get("QDIFF_NATIVE_TILES", "1").strip().lower()
    try:
        return _TILE_MODES[mode]
    except KeyError:
        raise QdiffError(f"QDIFF_NATIVE_TILES={mode!r}: expected 0 (off), 1 (the default) or "
                         "2 (always)") from None


_TILE_MODES = {"0": 0, "off": 0, "1": 1, "on": 1, "": 1, "2": 2, "always": 2}


def threads() -> int:
    """``torch.get_num_threads()``, but 1 in a process forked after this one ran OpenMP
    threads (GNU OpenMP's thread pool does not survive a fork: the child would hang)."""
    global _parallel_pid
    n = torch.get_num_threads()
    if n <= 1:
        return 1
    pid = os.getpid()
    if _parallel_pid is None:
        _parallel_pid = pid
    return n if pid == _parallel_pid else 1


def _single_threaded_child():
    """In a process forked from one whose kernels ran on several threads: torch's own parallel
    operations (a large gate-matrix batch, a matrix product) would wait on GNU OpenMP's thread
    pool, which does not survive the fork, and hang; the child runs torch on one thread, as
    torch's DataLoader workers do (``torch.set_num_threads`` there raises it again)."""
    if _parallel_pid is not None and torch.get_num_threads() > 1:
        torch.set_num_threads(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_single_threaded_child)


def ptr(t):
    if t is None:
        return None
    if isinstance(t, np.ndarray):
        return t.ctypes.data if t.size else None
    return t.data_ptr() if t.numel() else None


def program_arg(recs: np.ndarray, data: torch.Tensor) -> ProgramArg:
    return ProgramArg(ptr(recs), len(recs), ptr(data), data.numel())


def angles_arg(theta) -> AnglesArg:
    if theta is None:
        return AnglesArg(None, 0, 0)
    return AnglesArg(ptr(theta), theta.shape[0], theta.shape[1])


def check(lib, rc: int, args, what: str) -> None:
    """Raise the kernels' error code ``rc`` as a :class:`QdiffError`."""
    if rc == 0:
        return
    msg = lib.qd_strerror(rc).decode()
    if rc == ENOMEM:
        raise QdiffMemoryError(f"native kernels: {msg} ({what})")
    where = f" at record {args.bad_record}" if args.bad_record >= 0 else ""
    raise QdiffError(f"native kernels rejected the {what}{where}: {msg}")


def call_run(lib, state, recs, data, theta=None, dagger=False, from_zero=False):
    """``qd_run``: apply records ``recs`` (a :data:`RECORD` array) with ``data`` (and float64
    angles ``theta`` ``(1 or B, P)``) to ``state`` ``(B, 2**n)`` in place."""
    args = RunArgs(dtype=DTYPES[state.dtype], n=state.shape[1].bit_length() - 1,
                   batch=state.shape[0], states=ptr(state), prog=program_arg(recs, data),
                   angles=angles_arg(theta), dagger=int(dagger), from_zero=int(from_zero),
                   nthreads=threads(), tiles=tiles(), bad_record=-1)
    check(lib, lib.qd_run(ctypes.byref(args)), args, "program")
    return state


def check_abi(lib) -> str:
    """Declare the entry points and check the ABI version, the record layout and the
    argument blocks' sizes against this module; returns the problem ("" when none)."""
    lib.qd_abi_version.restype = ctypes.c_int
    if lib.qd_abi_version() != ABI_VERSION:
        return f"kernel ABI {lib.qd_abi_version()} != {ABI_VERSION}"
    buf = ctypes.create_string_buffer(1024)
    lib.qd_record_layout.argtypes = [ctypes.c_char_p, ctypes.c_int]
    if lib.qd_record_layout(buf, len(buf)) != 0:
        return "record layout description too long"
    size, *fields = buf.value.decode().split(";")
    theirs = {f.split(":")[0]: tuple(int(x) for x in f.split(":")[1:]) for f in fields}
    ours = {name: (RECORD.fields[name][1], RECORD.fields[name][0].itemsize)
            for name in RECORD.names}
    if int(size) != RECORD.itemsize or theirs != ours:
        return f"record layout mismatch: C {size} {theirs} vs Python {RECORD.itemsize} {ours}"
    lib.qd_args_sizes.argtypes = [ctypes.POINTER(_i64)]
    sizes = (_i64 * 4)()
    lib.qd_args_sizes(sizes)
    want = [ctypes.sizeof(t) for t in (ProgramArg, AnglesArg, RunArgs, AdjointArgs)]
    if list(sizes) != want:
        return f"argument block sizes mismatch: C {list(sizes)} vs Python {want}"
    lib.qd_batch_args_size.restype = _i64
    if lib.qd_batch_args_size() != ctypes.sizeof(BatchArgs):
        return (f"batch argument block size mismatch: C {lib.qd_batch_args_size()} vs Python "
                f"{ctypes.sizeof(BatchArgs)}")
    for name, args in (("qd_run", [ctypes.POINTER(RunArgs)]),
                       ("qd_batch_run", [ctypes.POINTER(BatchArgs)]),
                       ("qd_batch_adjoint", [ctypes.POINTER(BatchArgs)]),
                       ("qd_adjoint_coded", [ctypes.POINTER(AdjointArgs)]),
                       ("qd_adjoint_slots", [ctypes.POINTER(AdjointArgs)]),
                       ("qd_abs2", [_i32, _p, _p, _i64]),
                       ("qd_zmarginals", [_i32, _p, _i64, _i32, _i32, _p, _p, _i32]),
                       ("qd_pauli_apply", [_i32, _p, _i64, _i32, _i64, _p, _p, _i64, _p, _p,
                                           _i32, _p, _i32, _i32]),
                       ("qd_gate_code", [ctypes.c_char_p]),
                       ("qd_code_info", [ctypes.c_int, ctypes.POINTER(_i32),
                                         ctypes.POINTER(_i32), ctypes.POINTER(_i32)])):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    lib.qd_strerror.argtypes, lib.qd_strerror.restype = [ctypes.c_int], ctypes.c_char_p
    for name in ("qd_scratch_release", "qd_scratch_held"):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [], _i64
    return ""
