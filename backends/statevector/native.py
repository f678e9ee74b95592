"""Native CPU kernels: a whole circuit (or a whole adjoint sweep) in one call.

The torch kernels pay torch's per-op dispatch (tens of microseconds) for every gate, and torch's
complex elementwise kernels run far below memory bandwidth on CPU. On CPU, for complex128
states outside autograd (inference, the forward pass of the adjoint and parameter-shift
methods, the adjoint sweep itself), qdiff therefore encodes the circuit as a program of gate
records and runs it in ``qdsim.c``: one pass per gate at memory speed, runs of gates on the low
wires of a large state applied chunk by chunk in cache, small states walked gate after gate
while they sit in L1.

The C file ships with the package and is compiled on first use with the system C compiler
(``$CC`` or ``cc``, ``-O3 -march=native``, OpenMP when available) into
``$QDIFF_CACHE_DIR`` (default ``~/.cache/qdiff``), keyed by a hash of the source, the compiler
and the CPU. Without a compiler, or with ``QDIFF_NATIVE=0``, every path falls back to the torch
kernels, which compute the same results (tests compare the two). Autograd (backprop), CUDA,
complex64 and gates on more than 6 wires always use torch.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import torch

from qdiff.backends.statevector.gate_data import circuit_angles, circuit_data, fused_schedule
from qdiff.circuits import caches
from qdiff.circuits.operation import ParamRef

log = logging.getLogger(__name__)

REC = 17
MAXK = 6
DENSE, DIAG, FLIP, SWAP = 0, 1, 2, 3
_SOURCE = Path(__file__).with_name("qdsim.c")
_lib = None
_tried = False


def _cache_dir() -> Path:
    root = os.environ.get("QDIFF_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "qdiff")
    return Path(root) / "native"


def _cpu_tag() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((ln for ln in fh if ln.startswith("flags")), "")
    except OSError:
        flags = ""
    return platform.machine() + platform.processor() + flags


_FLAGS = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros",
          "-fassociative-math", "-shared", "-fPIC", "-std=c99"]
# tried in order: OpenMP and the host's vector units, then without OpenMP, then portable code
_VARIANTS = (["-march=native", "-fopenmp"], ["-march=native"], [])


def _compile(src: Path, out: Path, cc: str) -> bool:
    for extra in _VARIANTS:
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            tmp_out = Path(tmp) / out.name
            res = subprocess.run([cc, *_FLAGS, *extra, str(src), "-o", str(tmp_out)],
                                 capture_output=True, text=True, timeout=120)
            if res.returncode == 0:
                os.replace(tmp_out, out)  # atomic: a concurrent build never sees half a file
                return True
            log.debug("native build with %s failed: %s", extra, res.stderr[-2000:])
    return False


def library():
    """The loaded kernel library, or ``None`` (disabled, no compiler, build failed)."""
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    if os.environ.get("QDIFF_NATIVE", "1").lower() in ("0", "false", "no", "off"):
        return None
    try:
        cc = os.environ.get("CC", "cc")
        version = subprocess.run([cc, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
        key = hashlib.sha256(_SOURCE.read_bytes() + version.encode() + _cpu_tag().encode()
                             + repr((_FLAGS, _VARIANTS)).encode())
        out = _cache_dir() / f"qdsim-{key.hexdigest()[:16]}.so"
        out.parent.mkdir(parents=True, exist_ok=True)
        if not out.exists() and not _compile(_SOURCE, out, cc):
            return None
        lib = ctypes.CDLL(str(out))
        i64, p = ctypes.c_int64, ctypes.c_void_p
        lib.qd_run.argtypes = [p, i64, ctypes.c_int, i64, p, p, p, i64, i64, ctypes.c_int,
                               ctypes.c_int, ctypes.c_int]
        lib.qd_abs2.argtypes = [p, p, i64]
        lib.qd_adjoint.argtypes = [p, p, i64, ctypes.c_int, i64, p, p, i64, p, p, p, p, i64, p,
                                   i64, p, i64, p, ctypes.c_int]
        if lib.qd_abi_version() != 3:
            return None
        _lib = lib
    except (OSError, subprocess.SubprocessError, StopIteration) as exc:
        log.debug("native kernels unavailable: %s", exc)
    return _lib


@contextlib.contextmanager
def disabled():
    """Within the block every path uses the torch kernels (tests and benchmarks compare)."""
    global _lib, _tried
    saved = (_lib, _tried)
    _lib, _tried = None, True
    try:
        yield
    finally:
        _lib, _tried = saved


def runs(cdtype, device, theta: torch.Tensor, grad: bool) -> bool:
    """THE choice between native and torch kernels for one run, made by the engine once per
    job and kept for its adjoint sweep: native for complex128 states on the CPU outside
    autograd and torch.func transforms, when the library is built."""
    return (not grad and torch.device(device).type == "cpu" and cdtype == torch.complex128
            and _plain(theta) and library() is not None)


def usable(state: torch.Tensor) -> bool:
    """Whether ``state`` ``(B, 2**n)`` itself can be handed to the native kernels."""
    return (state.device.type == "cpu" and state.dtype == torch.complex128
            and not state.requires_grad and _plain(state) and state.is_contiguous()
            and library() is not None)


def _plain(t: torch.Tensor) -> bool:
    from torch._C._functorch import is_functorch_wrapped_tensor
    return not is_functorch_wrapped_tensor(t)


# ------------------------------------------------------------------------------------------
# encoding


class Unsupported(Exception):
    """The circuit has a gate the native kernels do not take (the caller falls back)."""


class Program:
    """Gate records ``(m, REC)`` and one complex128 data buffer."""

    def __init__(self, batch: int, n: int):
        self.batch, self.n = batch, n
        self.recs: list = []
        self.chunks: list = []
        self.size = 0

    def add(self, kind: int, bits, cmask: int, value: torch.Tensor, per_item: int) -> None:
        """``value``: ``(B', per_item)`` or ``(per_item,)`` complex data; ``B'`` is 1 or B."""
        k = len(bits)
        if k > MAXK or k == 0:
            raise Unsupported(f"{k}-wire gate")
        flat = value.reshape(-1)
        if flat.dtype != torch.complex128:
            flat = flat.to(torch.complex128)
        if flat.is_conj():
            flat = flat.resolve_conj()
        count = flat.numel() // per_item
        if count not in (1, self.batch):
            raise Unsupported(f"data for {count} bindings, batch {self.batch}")
        rec = [kind, k, *bits, *([0] * (MAXK - k)), cmask, self.size,
               per_item if count > 1 else 0, 0, 0, -1, -1, -1, 0]
        self.recs.append(rec)
        self.chunks.append(flat)
        self.size += flat.numel()

    def add_gate(self, gate, bits, cmask: int = 0) -> None:
        """A parameterless gate: fast paths for X-type flips, SWAP and diagonals."""
        if gate.controls and gate.target is not None:
            c = gate.controls
            mask = cmask
            for b in bits[:c]:
                mask |= 1 << b
            return self.add_gate(gate.target, bits[c:], mask)
        if gate.name == "x":
            return self.add(FLIP, bits, cmask, _ZERO, 1)
        if gate.name == "swap":
            return self.add(SWAP, bits, cmask, _ZERO, 1)
        if gate.diag_fn is not None:
            d = _const_diag(gate)
            return self.add(DIAG, bits, cmask, d, d.numel())
        u = _const_matrix(gate)
        return self.add(DENSE, bits, cmask, u, u.numel())

    def add_data(self, op, kind: str, value, n: int) -> None:
        """An op with gate data of ``kind`` (see :mod:`qdiff.backends.statevector.gate_data`)."""
        bits = [n - 1 - w for w in op.wires]
        if kind == "const":
            return self.add_gate(op.gate, bits)
        if kind == "diag":
            return self.add(DIAG, bits, 0, value, value.shape[-1])
        d = value.shape[-1]
        if kind in ("ctrl", "dctrl"):
            return self.add(DENSE, bits[1:], 1 << bits[0], value, d * d)
        return self.add(DENSE, bits, 0, value, d * d)

    def add_matrix(self, wire: int, u: torch.Tensor) -> None:
        self.add(DENSE, [self.n - 1 - wire], 0, u, 4)

    def copy(self) -> "Program":
        other = Program(self.batch, self.n)
        other.recs, other.chunks, other.size = list(self.recs), list(self.chunks), self.size
        return other

    def buffers(self):
        recs = torch.tensor(self.recs, dtype=torch.int64).reshape(-1, REC)
        data = torch.cat(self.chunks) if self.chunks else _ZERO
        return recs, data.contiguous()


_ZERO = torch.zeros(1, dtype=torch.complex128)


@caches.cached(maxsize=None)
def _const_matrix(gate) -> torch.Tensor:
    return gate.matrix_fn().to(torch.complex128).reshape(-1).contiguous()


@caches.cached(maxsize=None)
def _const_diag(gate) -> torch.Tensor:
    return gate.diag_fn().to(torch.complex128).reshape(-1).contiguous()


_parallel_pid = None


def _threads() -> int:
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


def _ptr(t: torch.Tensor):
    return ctypes.c_void_p(t.data_ptr())


def run(state: torch.Tensor, prog: Program, dagger: bool = False) -> torch.Tensor:
    """Apply the program (or its inverse) to ``state`` ``(B, 2**n)`` in place."""
    recs, data = prog.buffers()
    rc = library().qd_run(_ptr(state), state.shape[0], prog.n, recs.shape[0], _ptr(recs),
                          _ptr(data), None, 0, 0, int(dagger), 0, _threads())
    if rc != 0:
        raise MemoryError("native kernels could not allocate their gate table")
    return state


# ------------------------------------------------------------------------------------------
# entry points used by the simulator, the measurements and the adjoint method


def abs2(state: torch.Tensor) -> torch.Tensor:
    """``|state|^2`` (real): one native pass when possible (torch's complex ``real**2 +
    imag**2`` takes three passes and two temporaries), differentiable torch otherwise."""
    if state.numel() >= 1 << 12 and usable(state):
        out = torch.empty(state.shape, dtype=torch.float64)
        library().qd_abs2(_ptr(state), _ptr(out), state.numel())
        return out
    return state.real ** 2 + state.imag ** 2


def evolve(state, operations, theta, n, rdtype, fuse: bool = True, from_zero: bool = False,
           trace=None):
    """Native twin of :func:`qdiff.backends.statevector.simulate.evolve` (in place); raises
    :class:`Unsupported` before touching ``state`` if a gate cannot be encoded. ``fuse``
    allows multiplying runs of one-qubit gates on a wire into one 2x2 (large states only).

    Circuits whose parameterised gates all have native formulas (:func:`coded_plan`) run
    from ``theta`` directly: no gate data is computed in torch at all. ``trace``
    (:class:`~qdiff.backends.statevector.simulate.Trace`) receives the gate data and program an
    adjoint sweep of this run can reuse."""
    if not (fuse and n >= 16):  # large states: fusing one-qubit runs saves whole passes
        plan = coded_plan(operations, n)
        if plan is not None:
            return run_plan(state, plan, theta, from_zero=from_zero)
    data = circuit_data(operations, circuit_angles(operations, theta, rdtype), state.dtype)
    prog = Program(state.shape[0], n)
    # fusing runs of one-qubit gates costs a small torch matmul per gate: worth it only when
    # a pass over the states costs more than that
    fuse = fuse and state.numel() >= 1 << 16
    for kind, a, b in fused_schedule(operations, data, state, fuse, fuse_flips=False):
        if kind == "1q":
            prog.add_matrix(a, b)
        else:
            prog.add_data(a, b.kind, b.value, n)
    if trace is not None:
        # the adjoint sweep needs these very gates: one record per op, in order (fused runs
        # reorder gates, so a fused program is not reusable)
        trace.data, trace.program = data, (None if fuse else prog)
    return run(state, prog)


def adjoint_sweep(ops, data, slot_data, psi, lam, n, program=None):
    """One reverse sweep over ``ops`` with forward ``data``; ``slot_data`` is a list of
    ``(op index, GateData of dU/dphi)`` sorted by op index. Uncomputes ``psi`` and ``lam`` in
    place and returns the ``(B, len(slot_data))`` gradients ``2 Re <lam_i| dU_i |psi_{i-1}>``.
    ``program``: the forward pass's encoding of the same ``data`` (reused when given)."""
    b = psi.shape[0]
    if program is not None and program.batch == b:
        prog = program.copy()
    else:
        prog = Program(b, n)
        for op, d in zip(ops, data):
            prog.add_data(op, d.kind, d.value, n)
    nops = len(prog.recs)
    for i, dd in slot_data:
        prog.add_data(ops[i], dd.kind, dd.value, n)
    recs, buf = prog.buffers()
    slot_op = torch.tensor([i for i, _ in slot_data], dtype=torch.int64)
    grads = torch.empty(b, len(slot_data), dtype=torch.float64)
    slot_recs = recs[nops:].contiguous()
    gate_recs = recs[:nops].contiguous()
    rc = library().qd_adjoint(_ptr(psi), _ptr(lam), b, n, nops, _ptr(gate_recs), _ptr(buf),
                              len(slot_data), _ptr(slot_recs), _ptr(slot_op), _ptr(grads),
                              None, 0, None, 0, None, 0, None, _threads())
    if rc != 0:
        raise MemoryError("native kernels could not allocate their gate table")
    return grads


# ------------------------------------------------------------------------------------------
# coded programs: the kernels evaluate the parameterised gates from theta


C_RX, C_RY, C_RZ, C_PHASE, C_ROT, C_RXX, C_RYY, C_RZZ, C_SEXC, C_MRZ, C_DEXC = range(1, 12)


@caches.cached(maxsize=None)
def _code_table() -> dict:
    """Built-in gate object -> ``(code, kind)`` (the kernels' formulas, ``gate_eval`` in
    qdsim.c; the tests compare each with the gate's torch matrix and derivative)."""
    from qdiff.circuits.gates import BUILTIN_GATES as G
    return {G["rx"]: (C_RX, DENSE), G["ry"]: (C_RY, DENSE), G["rz"]: (C_RZ, DIAG),
            G["p"]: (C_PHASE, DIAG), G["u1"]: (C_PHASE, DIAG), G["rot"]: (C_ROT, DENSE),
            G["rxx"]: (C_RXX, DENSE), G["ryy"]: (C_RYY, DENSE), G["rzz"]: (C_RZZ, DIAG),
            G["single_excitation"]: (C_SEXC, DENSE), G["double_excitation"]: (C_DEXC, DENSE)}


def _code_of(gate):
    """``(code, kind, number of control wires)`` or ``None``."""
    table = _code_table()
    hit = table.get(gate)
    if hit is not None:
        return hit + (0,)
    if gate.controls == 1 and gate.target in table and gate.target.num_params == gate.num_params:
        return table[gate.target] + (1,)
    if getattr(gate, "hyper", None) and gate.name == "multirz" and gate.num_params == 1 and \
            gate.pl_name == "MultiRZ" and gate.num_wires <= MAXK:
        return C_MRZ, DIAG, 0
    return None


class CodedPlan:
    """A circuit encoded once: constant gates with their data, parameterised gates as codes
    with their theta columns. Runs need only ``theta``."""

    def __init__(self, ops, n: int):
        self.ops, self.n = ops, n
        prog = Program(1, n)
        self.columns = []  # per op: the theta column of each angle (-1: constant)
        for op in ops:
            bits = [n - 1 - w for w in op.wires]
            if not op.params:
                prog.add_gate(op.gate, bits)
                self.columns.append(())
                continue
            code = _code_of(op.gate)
            if code is None or len(op.params) > 3:
                raise Unsupported(f"no native formula for '{op.name}'")
            code, kind, nctrl = code
            cmask = 0
            for b in bits[:nctrl]:
                cmask |= 1 << b
            vals, cols = [], []
            for p in op.params:
                if isinstance(p, ParamRef):
                    vals.append(complex(p.scale, p.offset))
                    cols.append(p.index)
                elif isinstance(p, torch.Tensor):
                    raise Unsupported("tensor angle in a circuit")
                else:
                    vals.append(complex(0.0, float(p)))
                    cols.append(-1)
            prog.add(kind, bits[nctrl:], cmask, torch.tensor(vals, dtype=torch.complex128),
                     len(vals))
            rec = prog.recs[-1]
            rec[11], rec[12] = code, len(vals)
            rec[13:13 + len(cols)] = cols
            self.columns.append(tuple(cols))
        self.recs, self.data = prog.buffers()
        self._adjoint: dict = {}
        self._shared: dict = {}

    def shared_flags(self, shared):
        """The int64 flag array of ``shared`` (cached), or ``None`` when no column is shared."""
        if shared is None:
            return None
        key = tuple(bool(x) for x in shared)
        hit = self._shared.get(key)
        if hit is None:
            hit = torch.tensor(key, dtype=torch.int64) if any(key) else False
            if len(self._shared) > 16:
                self._shared.clear()
            self._shared[key] = hit
        return None if hit is False else hit

    def adjoint_records(self, trainable) -> tuple:
        """Records with each gate's trainable-angle mask, and the first gate that has one."""
        key = tuple(trainable)
        hit = self._adjoint.get(key)
        if hit is None:
            recs = self.recs.clone()
            lo = len(self.columns)
            for i, cols in enumerate(self.columns):
                mask = sum(1 << j for j, c in enumerate(cols) if c >= 0 and key[c])
                recs[i, 16] = mask
                if mask and lo == len(self.columns):
                    lo = i
            hit = self._adjoint[key] = (recs, lo)
            if len(self._adjoint) > 16:
                self._adjoint.pop(next(iter(self._adjoint)))
        return hit


_PLANS: dict = caches.register("native.coded_plans", {})


def coded_plan(ops, n: int):
    """The :class:`CodedPlan` of ``ops`` (a circuit's operations tuple; cached per object), or
    ``None`` when a gate has no native formula."""
    if library() is None:
        return None
    hit = _PLANS.get(id(ops))
    if hit is not None and hit[0] is ops and hit[1] == n:
        return hit[2]
    try:
        plan = CodedPlan(ops, n)
    except Unsupported:
        plan = None
    if len(_PLANS) >= 64:
        _PLANS.clear()
    _PLANS[id(ops)] = (ops, n, plan)
    return plan


def _theta_arg(theta: torch.Tensor, batch: int) -> tuple:
    th = theta.detach()
    if th.dtype != torch.float64:
        th = th.to(torch.float64)
    th = th.contiguous()
    if th.shape[0] not in (1, batch):
        raise Unsupported(f"theta has {th.shape[0]} rows for {batch} states")
    return th, (0 if th.shape[0] == 1 else th.shape[1])


def run_plan(state: torch.Tensor, plan: CodedPlan, theta: torch.Tensor,
             dagger: bool = False, from_zero: bool = False) -> torch.Tensor:
    """Apply the coded circuit (or its inverse) to ``state`` in place. ``from_zero``: the state
    is |0...0> (a leading product of one-qubit gates is then written in one pass)."""
    th, tstride = _theta_arg(theta, state.shape[0])
    rc = library().qd_run(_ptr(state), state.shape[0], plan.n, plan.recs.shape[0],
                          _ptr(plan.recs), _ptr(plan.data), _ptr(th), tstride, th.shape[1],
                          int(dagger), int(from_zero), _threads())
    if rc != 0:
        raise MemoryError("native kernels could not allocate their gate table")
    return state


def plan_adjoint(plan: CodedPlan, psi, lam, theta, trainable, restore: bool = False,
                 shared=None, lam_diagonal=None):
    """The adjoint sweep of a coded circuit: ``(B, P)`` gradients with respect to theta's
    columns (zero for columns not ``trainable``), ``2 Re <lam_i| dU_i/dtheta |psi_{i-1}>``
    summed over every use of a column, in one native call. ``psi`` and ``lam`` are overwritten;
    with ``restore`` the sweep runs down to the first gate, leaving ``psi`` the input state.

    ``lam_diagonal`` (``(B, 2**n)`` float64, instead of ``lam``): ``lam = lam_diagonal * psi``
    is formed in cache, tile by tile, and ``psi`` is left untouched (no copies of the states).

    ``shared`` (optional, per column): True where the column is one value broadcast over the
    batch by construction (a weight), so that only its gradient's sum over the rows matters;
    the kernels may then return partial sums in some rows and zeros in others."""
    b = psi.shape[0]
    th, tstride = _theta_arg(theta, b)
    recs, lo = plan.adjoint_records(trainable)
    p = theta.shape[1]
    grad = torch.zeros(b, p, dtype=torch.float64)
    sh = plan.shared_flags(shared)
    if lam_diagonal is not None:
        if restore:
            raise ValueError("restore needs psi itself to be uncomputed: pass lam")
        lam_diagonal = lam_diagonal.to(torch.float64).contiguous()
    rc = library().qd_adjoint(_ptr(psi), None if lam is None else _ptr(lam), b, plan.n,
                              recs.shape[0], _ptr(recs), _ptr(plan.data), 0, None, None, None,
                              _ptr(th), tstride, _ptr(grad), p, None if sh is None else _ptr(sh),
                              0 if restore else lo,
                              None if lam_diagonal is None else _ptr(lam_diagonal), _threads())
    if rc != 0:
        raise MemoryError("native kernels could not allocate their gate table")
    return grad
