"""The C boundary of the native kernels: the record layout is checked against the library, and
every index of every record is validated in C: corrupt records give a QdiffError naming the
record, never a stray read or write (the state is left untouched)."""
from __future__ import annotations

import ctypes
import subprocess
import sys

import numpy as np
import pytest
import torch

from qdiff.backends.statevector import native, native_abi, native_lib
from qdiff.circuits import Operation, ParamRef
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.gates import BUILTIN_GATES as G

pytestmark = pytest.mark.skipif(native.library() is None,
                                reason="no C compiler: the native kernels are not built")

N = 3


def _plan():
    ops = (Operation(G["h"], (0,)), Operation(G["rx"], (1,), (ParamRef(0),)),
           Operation(G["cx"], (0, 2)), Operation(G["iswap"], (1, 2)),
           Operation(G["rot"], (2,), (ParamRef(1), 0.3, ParamRef(0, scale=2.0))),
           Operation(G["s"], (1,)), Operation(G["crz"], (2, 0), (ParamRef(1),)))
    plan = native.CodedPlan(ops, N)
    return plan.recs.copy(), plan.data_for(torch.complex128)


def _state(batch=2):
    g = torch.Generator().manual_seed(0)
    s = torch.randn(batch, 2 ** N, dtype=torch.complex128, generator=g)
    return s / s.norm(dim=1, keepdim=True)


THETA = torch.tensor([[0.3, -1.2], [0.7, 0.4]], dtype=torch.float64)

# (record index, field, value) -> a corrupt program
CORRUPT = [
    (0, "kind", 7), (0, "kind", -1), (1, "k", 0), (1, "k", 7), (2, "k", 4),
    (0, "bits", (3, 0, 0, 0, 0, 0)), (0, "bits", (-1, 0, 0, 0, 0, 0)),
    (3, "bits", (1, 1, 0, 0, 0, 0)), (2, "cmask", 1 << N), (2, "cmask", -4),
    (2, "cmask", 1 << 0), (0, "offset", 10 ** 6), (0, "offset", -2), (3, "offset", 10),
    (0, "stride", 10 ** 6), (0, "stride", -1), (1, "code", 99), (1, "code", 3),
    (1, "nangles", 2), (1, "col", (2, -1, -1)), (1, "col", (-2, -1, -1)),
    (1, "train", 2), (4, "train", 2), (5, "code", 1), (5, "nangles", 1),
]


@pytest.mark.parametrize("index,field,value", CORRUPT)
def test_corrupt_record_is_an_error_and_the_state_is_untouched(index, field, value):
    recs, data = _plan()
    recs[field][index] = value
    state = _state()
    before = state.clone()
    with pytest.raises(QdiffError, match=f"record {index}"):
        native_abi.call_run(native.library(), state, recs, data, THETA)
    assert torch.equal(state, before)


def test_valid_program_runs_and_matches_torch():
    recs, data = _plan()
    state = _state()
    ref = state.clone()
    native_abi.call_run(native.library(), state, recs, data, THETA)
    native_abi.call_run(native.library(), state, recs, data, THETA, dagger=True)
    assert torch.allclose(state, ref, atol=1e-12)


def _adjoint_args(recs, data, psi, lam_state, **kw):
    th = kw.pop("theta", THETA)
    grad = torch.zeros(psi.shape[0], th.shape[1], dtype=torch.float64)
    args = native_abi.AdjointArgs(
        dtype=native_abi.C128, n=N, batch=psi.shape[0], psi=native_abi.ptr(psi),
        lam=native_abi.ptr(lam_state), prog=native_abi.program_arg(recs, data),
        angles=native_abi.angles_arg(th), gtheta=native_abi.ptr(grad), nthreads=1,
        bad_record=-1)
    for k, v in kw.items():
        setattr(args, k, v)
    return args, grad


@pytest.mark.parametrize("field,value", [("lo", 8), ("lo", -1), ("n", 41), ("dtype", 5),
                                         ("nthreads", 0), ("batch", -1), ("lam", None)])
def test_invalid_sweep_arguments_are_errors(field, value):
    recs, data = _plan()
    recs["train"][1] = 1
    psi, lam = _state(), _state()
    args, _ = _adjoint_args(recs, data, psi, lam, **{field: value})
    rc = native.library().qd_adjoint_coded(ctypes.byref(args))
    assert rc != 0
    with pytest.raises(QdiffError):
        native_abi.check(native.library(), rc, args, "adjoint sweep")


def test_slot_records_are_validated():
    recs, data = _plan()
    plain = recs[[0, 2, 3, 5]].copy()  # the data-given (uncoded) records
    psi, lam = _state(), _state()
    slots = plain[[0]].copy()
    for op_index, rc_want in ((4, "record 4"), (-1, "record 4")):
        slot_op = np.array([op_index], dtype=np.int64)
        args, _ = _adjoint_args(plain, data, psi, lam, theta=torch.zeros(1, 0,
                                dtype=torch.float64))
        args.angles = native_abi.angles_arg(None)
        args.slots = native_abi.program_arg(slots, data)
        args.slot_op = native_abi.ptr(slot_op)
        grads = torch.zeros(2, 1, dtype=torch.float64)
        args.grads = native_abi.ptr(grads)
        rc = native.library().qd_adjoint_slots(ctypes.byref(args))
        with pytest.raises(QdiffError, match=rc_want):
            native_abi.check(native.library(), rc, args, "adjoint sweep")


def test_the_python_mirror_matches_the_library_layout():
    assert native_abi.check_abi(native.library()) == ""
    assert native_abi.RECORD.itemsize == 144


def test_a_mismatched_mirror_is_refused(monkeypatch):
    """A record dtype that disagrees with the header (e.g. a stale library) is caught at load."""
    wrong = np.dtype([(n, native_abi.RECORD.fields[n][0]) for n in native_abi.RECORD.names
                      if n != "reserved"], align=True)
    monkeypatch.setattr(native_abi, "RECORD", wrong)
    assert "record layout mismatch" in native_abi.check_abi(native.library())


FUZZ = r"""
import sys, torch, numpy as np
from qdiff.backends.statevector import native, native_abi
from qdiff.circuits.errors import QdiffError
sys.path.insert(0, sys.argv[1])
from test_native_abi import _plan, _state, THETA
rng = np.random.default_rng(int(sys.argv[2]))
recs0, data = _plan()
ok = err = 0
for trial in range(400):
    recs = recs0.copy()
    for _ in range(rng.integers(1, 4)):
        i = rng.integers(len(recs))
        f = native_abi.RECORD.names[rng.integers(len(native_abi.RECORD.names))]
        v = recs[f][i]
        big = [0, 1, -1, 2, 3, 5, 6, 7, 63, 64, -(2 ** 40), 2 ** 40, 2 ** 62]
        x = big[rng.integers(len(big))]
        if np.ndim(v) and v.dtype.kind == "i" and abs(x) >= 2 ** 31 and v.dtype.itemsize == 4:
            continue
        if np.ndim(v):
            v = v.copy(); v[rng.integers(len(v))] = x
        else:
            v = x
        try:
            recs[f][i] = v
        except OverflowError:
            pass
    state = _state(int(rng.integers(1, 4)))
    try:
        native_abi.call_run(native.library(), state, recs, data, THETA[:1])
        ok += 1
    except QdiffError:
        err += 1
print(ok, err)
"""


def test_fuzzed_records_never_crash(tmp_path):
    """Random corruptions of every field: an error or a run, in a child process so that a
    crash would show as a failed exit, not take the test run down."""
    import os
    here = os.path.dirname(__file__)
    res = subprocess.run([sys.executable, "-c", FUZZ, here, "7"], capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    ok, err = map(int, res.stdout.split())
    assert ok + err == 400 and err >= 100
