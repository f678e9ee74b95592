"""Record-once qnodes: ``qd.qnode(dev, static=True)`` and ``qd.jit(qnode)``.

A static qnode records its circuit ONCE per *call signature* (the shapes, dtypes, devices and
``requires_grad`` of its tensor arguments, and the values of its other arguments) and then
replays only the angle binding: every later call with the same signature gathers the angles
straight from the argument tensors into ``theta`` in one indexing op and runs the traced plan
through the torch bridge, without running the Python function again.

The trace checks that a replay is exact:

* the function runs once on *guarded* tensors: reading a value into Python (``bool(x > 0)``,
  ``float(x)``, ``x.item()``, ``x.tolist()``, NumPy conversion, data-dependent shapes) raises
  a :class:`~qdiff.circuits.errors.QdiffError`, since Python control flow on values would make
  the structure depend on them; values written into other tensors keep the guard, an argument
  modified in place is refused, and an angle computed by an op that is not affine in the
  arguments (``clamp``, ``where``, comparisons, ...) is refused whatever its values;
* it runs on six probe bindings (zeros, ones, an index encoding, a permuted one, a negative
  and large one and a fractional one): the circuit structure must be the same for all of them,
  and every gate angle must be one argument element times a constant plus a constant
  (``x[i]``, ``w[l, i, k]``, ``pi * x[i]``) or a constant. Anything else (``torch.sin(x)``,
  ``torch.relu(x)`` or ``x ** 2`` as an angle) is refused at trace time; compute it outside
  the qnode or use a plain qnode.

A new signature (another batch size, a new ``requires_grad``, another non-tensor argument)
traces again (up to ``max_traces`` kept). What the function reads from outside its arguments
is checked on each call and a change traces again: its globals and closure variables
(rebound, or plain values and containers of them changed in place) and the tensors it passed
to torch ops (changed in place, through ``.data``, or in ``requires_grad``). Attributes of
other objects are part of the trace: after changing them call :meth:`StaticQNode.retrace`; an
angle from an outside tensor that requires grad is refused. Float
tensors inside list, tuple and dict arguments are tensor arguments. Inside ``torch.func`` transforms (``grad``, ``vmap``,
``jacrev``) a call runs the plain qnode instead: nothing is recorded or replayed there.

>>> import torch, qdiff as qd
>>> dev = qd.device("statevector", wires=2)
>>> @qd.qnode(dev, static=True)
... def f(x, w):
...     qd.RX(x[..., 0], wires=0); qd.RY(2 * w[0], wires=1); qd.CNOT(wires=[0, 1])
...     return [qd.expval(qd.Z(0)), qd.expval(qd.Z(1))]
>>> x = torch.zeros(3, 1, dtype=torch.float64)
>>> w = torch.zeros(1, dtype=torch.float64, requires_grad=True)
>>> f(x, w).shape, f.num_traces
(torch.Size([3, 2]), 1)
>>> f(x + 1, w).shape, f.num_traces
(torch.Size([3, 2]), 1)
"""
from __future__ import annotations

import functools
from collections import OrderedDict
import contextlib
from contextlib import contextmanager
import sys
import threading
import warnings

import torch
import torch.autograd.forward_ad as _forward_ad
from torch.overrides import TorchFunctionMode

from qdiff.backends.base import Gather, Prepared, flat_outputs
from qdiff.bridge import (DIFFERENTIABLE_KINDS, Plan, QuantumFunction, autocast_cpu_enabled,
                          autocast_cuda_enabled, effective_shots,
                          engine_vjp, exact_precision, expand_coefficients,
                          refuse_batched_cotangent, refuse_float16_overflow,
                          refuse_graph_capture, unshare, validate_rules)
from qdiff.circuits import recording
from qdiff.circuits.circuit import check_finite_angles
from qdiff.circuits.errors import QdiffError, checked_call
from qdiff.circuits.measurements import Measurement
from qdiff.circuits.operation import ParamRef
from qdiff.rules import BACKPROP, higher_order, make_options, resolve

_GUARD = threading.local()
_READS = frozenset({"__bool__", "item", "tolist", "__float__", "__int__", "__index__",
                    "__complex__", "numpy", "__array__", "nonzero", "argwhere", "masked_select",
                    "unique", "unique_consecutive", "bincount", "equal", "allclose",
                    "__dlpack__", "untyped_storage", "storage", "_typed_storage",
                    "__contains__", "is_nonzero", "apply_", "map_", "map2_"})
# torch functions whose tensor results are affine in the guarded (argument-derived) tensors:
# indexing, shape and dtype changes, sums and differences, and products/quotients by values
# that do not come from the arguments (checked in _affine_call)
_AFFINE = frozenset({
    "__getitem__", "__setitem__", "select", "narrow", "index_select", "gather", "take",
    "take_along_dim", "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten",
    "ravel", "squeeze", "unsqueeze", "expand", "expand_as", "broadcast_to", "broadcast_tensors",
    "permute", "transpose", "t", "mT", "T", "movedim", "moveaxis", "swapaxes", "swapdims",
    "contiguous", "clone", "detach", "detach_", "to", "type", "type_as", "double", "float",
    "cpu", "cuda", "unbind", "split", "chunk", "tensor_split", "split_with_sizes", "stack",
    "cat", "concat", "concatenate", "hstack", "vstack", "dstack", "column_stack", "row_stack",
    "flip", "fliplr", "flipud", "roll", "rot90", "repeat", "tile", "repeat_interleave",
    "atleast_1d", "atleast_2d", "atleast_3d", "diagonal", "diag", "diag_embed", "tril",
    "triu", "unfold", "requires_grad_", "retain_grad", "copy_", "zero_", "fill_",
    "add", "__add__", "__radd__", "__iadd__", "add_", "sub", "subtract", "__sub__", "__rsub__",
    "__isub__", "sub_", "rsub", "neg", "negative", "__neg__", "positive", "__pos__", "neg_",
    "sum", "mean", "cumsum", "diff", "trace", "deg2rad", "rad2deg",
    # selections by conditions and fills that are not argument-derived (a condition computed
    # from the arguments is itself a NonAffineTensor and marks the result)
    "where", "masked_fill", "index_fill", "pad",
    # constants shaped like an argument
    "new_zeros", "new_ones", "new_full", "new_empty", "zeros_like", "ones_like", "full_like",
    "empty_like",
    # products and quotients: affine while at most one factor (and never the divisor) is
    # argument-derived
    "mul", "multiply", "__mul__", "__rmul__", "__imul__", "mul_", "matmul", "__matmul__",
    "__rmatmul__", "mm", "mv", "bmm", "dot", "vdot", "inner", "outer", "ger", "kron",
    "tensordot", "einsum", "div", "divide", "true_divide", "__truediv__", "__itruediv__",
    "div_", "true_divide_",
    # attribute reads (shape, dtype, .T, .data, ...)
    "__get__"})
# ops whose results hold no argument values (constants shaped like one)
_CONSTANT = frozenset({"new_zeros", "new_ones", "new_full", "new_empty", "zeros_like",
                       "ones_like", "full_like", "empty_like"})
# torch functions that copy their data argument without dispatching to its class
# (torch.tensor(x)): their result holds the argument's values
_COPIES = frozenset({"tensor", "as_tensor", "asarray"})
_DIVIDE = frozenset({"div", "divide", "true_divide", "__truediv__", "__itruediv__", "div_",
                     "true_divide_"})
_PRODUCT = frozenset({"mul", "multiply", "__mul__", "__rmul__", "__imul__", "mul_", "matmul",
                      "__matmul__", "__rmatmul__", "mm", "mv", "bmm", "dot", "vdot", "inner",
                      "outer", "ger", "kron", "tensordot", "einsum"})


def _guarded_in(args, kwargs) -> list:
    out = []
    for v in (*args, *kwargs.values()):
        if isinstance(v, GuardedTensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(u for u in v if isinstance(u, GuardedTensor))
    return out


def _affine_call(name, args, kwargs, guarded) -> bool:
    """Whether ``name(*args, **kwargs)`` keeps the results affine in the guarded tensors."""
    if name not in _AFFINE:
        return False
    if name in _PRODUCT:
        return len(guarded) <= 1
    if name in _DIVIDE:
        if kwargs.get("rounding_mode") is not None:
            return False
        other = args[1] if len(args) > 1 else kwargs.get("other")
        return not isinstance(other, GuardedTensor)
    return True


def _inplace(name, kwargs) -> bool:
    return name == "__setitem__" or "out" in kwargs or (
        name.endswith("_") and not name.endswith("__") and name not in (
            "requires_grad_", "retain_grad_"))


_STRIDED = torch.strided


def _storage(t):
    """The address of ``t``'s storage, or ``None`` for a tensor without one (sparse, ...),
    whose in-place changes are then not traced to an argument."""
    with torch._C.DisableTorchFunctionSubclass():
        try:
            return t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            return None


def _refuse_read(name):
    raise QdiffError(
        f"static qnode: the function reads an argument's value in Python ('{name}'), so the "
        "circuit structure may depend on it; a static qnode replays one structure per "
        "signature. Keep value-dependent logic in torch ops, pass the value as a non-tensor "
        "argument, or use static=False")


class GuardedTensor(torch.Tensor):
    """A tensor whose values may not flow into Python while a static qnode is traced. Results
    of torch ops on it are guarded too; those of ops that are not affine in it (``clamp``,
    ``where``, ``sin``, comparisons, products of two of them) are :class:`NonAffineTensor`,
    which may not become a gate angle. Writing a guarded value into another tensor makes
    that tensor guarded; writing into an argument is refused (a replay does not run the
    function, so it cannot repeat the write)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not getattr(_GUARD, "on", False):
            return super().__torch_function__(func, types, args, kwargs)
        _GUARD.dispatched = True
        name = getattr(func, "__name__", "")
        if name in _READS:
            _refuse_read(name)
        if name in ("__repr__", "__format__"):
            return _placeholder(name, args, kwargs)
        if name == "__deepcopy__":  # a new tensor holding the values (torch's default makes
            # it through new_empty, which is plain here); no gradient reaches the argument
            return args[0].detach().clone()
        guarded = _guarded_in(args, kwargs)
        affine = _affine_call(name, args, kwargs, guarded)
        target = None
        if _inplace(name, kwargs):
            target = kwargs.get("out", args[0] if args else None)
            if isinstance(target, torch.Tensor) and _GUARD.storages and \
                    _storage(target) in _GUARD.storages:
                raise QdiffError(
                    f"static qnode: the function modifies an argument in place ('{name}'); "
                    "a replay does not run the function and cannot repeat that. Work on a "
                    "copy (x = x.clone()) or use static=False")
        ret = super().__torch_function__(func, types, args, kwargs)
        if affine and name not in _CONSTANT and isinstance(ret, torch.Tensor) and not (
                ret.dtype.is_floating_point or ret.dtype.is_complex):
            affine = False  # a cast to an integer or bool dtype rounds
        mark = NonAffineTensor if not affine or any(
            isinstance(g, NonAffineTensor) for g in guarded) else GuardedTensor
        if isinstance(target, torch.Tensor) and not isinstance(target, mark):
            if type(target) is not torch.Tensor and not isinstance(target, GuardedTensor):
                raise QdiffError(
                    f"static qnode: the function writes an argument's values into a "
                    f"{type(target).__name__} ('{name}'); a replay does not run the function "
                    "and cannot repeat that. Write into a tensor made inside the function, "
                    "or use static=False")
            target.__class__ = mark  # holds argument-derived values from now on
        if mark is NonAffineTensor:
            ret = _mark(ret)
        return ret


class NonAffineTensor(GuardedTensor):
    """A guarded tensor computed by an op that is not affine in the arguments."""


def _placeholder(name, args, kwargs) -> str:
    """``repr``/``format`` of a guarded tensor: its shape and dtype, not its values (as a
    traced array prints under ``jax.jit``); a format spec (``f"{x:.3f}"``) reads the value."""
    t = args[0]
    spec = args[1] if len(args) > 1 else kwargs.get("format_spec", "")
    if name == "__format__" and spec:
        _refuse_read("__format__")
    return f"<traced tensor shape={tuple(t.shape)} dtype={t.dtype}>"


def _holds_guarded(v, depth: int = 0) -> bool:
    if isinstance(v, GuardedTensor):
        return True
    if depth < 4 and isinstance(v, (list, tuple)):
        return any(_holds_guarded(u, depth + 1) for u in v)
    return False


class _ValueReads(TorchFunctionMode):
    """Active while a static qnode traces its function. A torch call that takes a guarded
    tensor only where it expects a number (``torch.full((2,), x[0])``, ``torch.arange(x[0])``)
    reads its value in C++ without dispatching to :class:`GuardedTensor`: refused as a read.
    The copy constructors (``torch.tensor(x)``, ``torch.as_tensor``, ``torch.asarray``) keep
    the guard on their result."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        reads = getattr(_GUARD, "reads", None)
        if reads is not None:
            _note_reads(args, reads)
            if kwargs:
                _note_reads(tuple(kwargs.values()), reads)
        if not (_holds_guarded(args) or _holds_guarded(tuple(kwargs.values()))):
            ret = func(*args, **kwargs)
            if reads is not None:
                _note_made(ret, reads)
            return ret
        _GUARD.dispatched = False
        ret = func(*args, **kwargs)
        if _GUARD.dispatched:
            return ret
        name = getattr(func, "__name__", "")
        if name in _COPIES and isinstance(ret, torch.Tensor):
            if isinstance(ret, GuardedTensor):
                return ret
            real = ret.dtype.is_floating_point or ret.dtype.is_complex
            with torch._C.DisableTorchFunctionSubclass():
                return ret.as_subclass(GuardedTensor if real else NonAffineTensor)
        _refuse_read(name)


def _note_reads(args, reads, depth: int = 0) -> None:
    """Add the plain tensors among ``args`` to ``reads`` (id -> tensor): candidates for the
    tensors the function reads from outside its arguments."""
    for v in args:
        if isinstance(v, torch.Tensor):
            if not isinstance(v, GuardedTensor) and id(v) not in reads:
                reads[id(v)] = v
        elif depth < 2 and isinstance(v, (list, tuple)):
            _note_reads(v, reads, depth + 1)


def _note_made(ret, reads) -> None:
    """Mark tensors a torch call made while recording: they are not read from outside (a
    ``None`` entry keeps the id; ``reads`` holds the tensor in ``made`` so that it stays
    unique while recording)."""
    if isinstance(ret, torch.Tensor):
        if id(ret) not in reads:
            reads[id(ret)] = None
            reads.setdefault("made", []).append(ret)
    elif isinstance(ret, (list, tuple)):
        for r in ret:
            if isinstance(r, torch.Tensor) and id(r) not in reads:
                reads[id(r)] = None
                reads.setdefault("made", []).append(r)


def _mark(ret):
    if isinstance(ret, torch.Tensor):
        if not isinstance(ret, NonAffineTensor):
            with torch._C.DisableTorchFunctionSubclass():
                ret = ret.as_subclass(NonAffineTensor)
        return ret
    if isinstance(ret, (list, tuple)) and any(isinstance(r, torch.Tensor) for r in ret):
        return type(ret)(_mark(r) for r in ret) if type(ret) in (list, tuple) else ret
    return ret


def _register_autoray() -> None:
    """Let autoray (PennyLane's ``qml.math``) dispatch guarded tensors to torch: it names a
    backend by the class's module otherwise."""
    ar = sys.modules.get("autoray")
    if ar is not None and not getattr(_register_autoray, "done", False):
        for cls in (GuardedTensor, NonAffineTensor):
            ar.register_backend(cls, "torch")
        _register_autoray.done = True


def tracing() -> bool:
    """True while a static qnode records its function (in this thread)."""
    return getattr(_GUARD, "on", False)


def refuse_nested(what: str = "a qnode") -> None:
    """A qnode called from the function a static qnode is recording: refused by name (its
    result would be a value computed in Python, which no replay could repeat)."""
    if tracing():
        raise QdiffError(f"static qnode: {what} is called inside the function it records; a "
                         "replay binds angles only and cannot rerun it. Call it outside and "
                         "pass its result in, or use static=False for the outer qnode")


@contextmanager
def _guarded(storages=frozenset(), reads=None):
    _GUARD.on, _GUARD.storages, _GUARD.reads = True, storages, reads
    try:
        with _ValueReads():
            yield
    finally:
        _GUARD.on, _GUARD.storages, _GUARD.reads = False, frozenset(), None


# ------------------------------------------------------------------------------------------
# signatures


def _where(i: int, npos: int, names) -> str:
    return str(i) if i < npos else repr(names[i - npos])


def _arg_sig(value, i: int, npos: int, names):
    """The signature entry of an argument other than a float tensor (those are keyed by
    :func:`call_signature` itself): its type and value; for other tensors and NumPy arrays
    their dtype, shape and bytes."""
    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            raise QdiffError(f"static qnode: tensor argument {_where(i, npos, names)} has dtype "
                             f"{value.dtype} and requires grad; a static qnode binds float32 "
                             "and float64 tensors on every call and keys the trace on the "
                             "values of other tensors (use static=False)")
        flat = value.detach().reshape(-1).cpu().contiguous()
        return ("t", value.dtype, value.shape, value.device,
                flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    if type(value).__module__ == "numpy" and type(value).__name__ == "ndarray" and \
            value.dtype.kind in "biufc":
        return ("np", value.dtype.str, value.shape, value.tobytes())
    try:
        hash(value)
    except TypeError:
        raise QdiffError(f"static qnode: argument {_where(i, npos, names)} of type "
                         f"{type(value).__name__} is neither a tensor nor hashable; the trace is "
                         "keyed on it") from None
    return ("v", type(value), value)


_Tensor = torch.Tensor
_F64, _F32 = torch.float64, torch.float32


def _container(v) -> bool:
    t = type(v)
    return t is list or t is tuple or t is dict or (isinstance(v, tuple) and
                                                    hasattr(t, "_fields"))


def _nested_sig(v, i: int, npos: int, names, tensors: list):
    """The signature entry of a list, tuple (named too) or dict argument: its type and length
    or keys, then its items' entries; float tensors inside are tensor arguments (appended to
    ``tensors`` in order), like top-level ones."""
    if isinstance(v, _Tensor):
        dt = v.dtype
        if dt is _F64 or dt is _F32:
            tensors.append(v)
            return (v.shape, dt, "cpu" if v.is_cpu else v.device, v.requires_grad)
        return _arg_sig(v, i, npos, names)
    if not _container(v):
        return _arg_sig(v, i, npos, names)
    if type(v) is dict:
        return ("c", dict, tuple(v), tuple(_nested_sig(u, i, npos, names, tensors)
                                          for u in v.values()))
    return ("c", type(v), len(v), tuple(_nested_sig(u, i, npos, names, tensors) for u in v))


def call_signature(args, kwargs) -> tuple:
    """``(key, tensors)``: the hashable signature of a call and its tensor arguments in a fixed
    order (positional, then keywords by name; inside a list, tuple or dict argument in its
    order). A tensor's entry is its shape, dtype, device (``"cpu"`` for every CPU tensor) and
    ``requires_grad``; any other value's is its type and value."""
    names = tuple(sorted(kwargs)) if len(kwargs) > 1 else tuple(kwargs)
    vals = [*args, *[kwargs[k] for k in names]] if names else args
    sigs, tensors = [], []
    for v in vals:
        if isinstance(v, _Tensor):
            dt = v.dtype
            if dt is _F64 or dt is _F32:
                sigs.append((v.shape, dt, "cpu" if v.is_cpu else v.device, v.requires_grad))
                tensors.append(v)
                continue
        i = len(sigs)
        if _container(v):
            sigs.append(_nested_sig(v, i, len(args), names, tensors))
        else:
            sigs.append(_arg_sig(v, i, len(args), names))
    return (len(args), names, tuple(sigs)), tensors


def _obs_sig(obs):
    if obs is None:
        return None
    terms = tuple(tuple((f.wires, f.kind, None if f.matrix is None else
                         tuple(f.matrix.detach().reshape(-1).tolist())) for f in t)
                  for t in obs.terms)
    return terms, tuple(obs.coeffs.detach().reshape(-1).tolist()), obs.coeffs.requires_grad


def structure_signature(circuit) -> tuple:
    """Everything about ``circuit`` except the values in ``theta``: gates, wires, angle
    references (column, scale, offset) and constants, measurements with their observables."""
    ops = tuple((op.gate.name, op.wires, tuple(
        (p.index, p.scale, p.offset) if isinstance(p, ParamRef) else ("c", float(p))
        for p in op.params)) for op in circuit.operations)
    meas = tuple((m.kind, m.wires, _obs_sig(m.obs)) for m in circuit.measurements)
    return circuit.num_wires, circuit.num_params, circuit.labels, ops, meas


# ------------------------------------------------------------------------------------------
# the trace


class Trace:
    """One signature's record: the bridge plan and the affine gather ``theta = a * src[idx] +
    c`` from the flattened tensor arguments ``src`` (constants appended)."""

    def __init__(self, plan, rule, idx, scale, offset, consts, dtype, batch_shape, result,
                 widths):
        self.plan, self.rule, self.prepared, self.bound = plan, rule, None, None
        self.idx, self.scale, self.offset, self.consts = idx, scale, offset, consts
        self.flat_idx = idx.reshape(-1)
        self.dtype, self.batch_shape, self.result, self.widths = dtype, batch_shape, result, widths
        # the flat (B, K) outputs are the result as they are: a list/tuple of scalar
        # measurements over one batch dimension (no reshape, no view node in the graph)
        self.flat_out = len(batch_shape) == 1 and not isinstance(result, Measurement) and \
            widths is not None and all(w is None for w in widths)
        self.arg_dtypes = ()  # the tensor arguments' dtypes (set by the trace)
        self.any_requires_grad = True  # whether any tensor argument requires grad (ditto)
        self.arg_used = None  # per tensor argument: whether an angle reads it (see `used`)
        # per theta column: True where the recorded angle reads an argument but carries no
        # gradient (read through .detach(), .data or torch.tensor); None when there is none
        self.frozen = None
        # the tensors read from outside the arguments, with what a replay checks of them
        self.outside = ()
        self.python = None  # the globals and closure variables it reads (_python_guards)

    def used(self, tensors) -> tuple:
        """Per tensor argument, whether any angle reads one of its entries: an argument no
        angle reads gets no gradient (None), as in the plain qnode's graph, so optimizers
        skip it (weight decay, momentum) as they skip an unused parameter."""
        if self.arg_used is None:
            read = torch.zeros(sum(t.numel() for t in tensors) + 1, dtype=torch.bool)
            idx = self.idx.cpu()
            if self.frozen is not None:  # an angle without gradient does not count as a read
                idx = idx[:, ~self.frozen.cpu()]
            read[idx.reshape(-1).clamp(max=read.numel() - 1)] = True
            flags, pos = [], 0
            for t in tensors:
                flags.append(bool(read[pos:pos + t.numel()].any()))
                pos += t.numel()
            self.arg_used = tuple(flags)
        return self.arg_used

    def scatter(self, grad_theta: torch.Tensor, tensors, needs) -> list:
        """The gradients of the tensor arguments from ``grad_theta`` ``(B, P)`` (the
        transpose of :meth:`theta`: one scatter-add)."""
        # (on the arguments' device: a device placed elsewhere runs them there)
        g = grad_theta.to(self.flat_idx.device)
        g = g if self.scale is None else g * self.scale
        total = sum(t.numel() for t in tensors) + (0 if self.consts is None else
                                                    self.consts.numel())
        src = torch.zeros(total, dtype=g.dtype, device=g.device)
        src.index_add_(0, self.flat_idx, g.reshape(-1))
        out, pos = [], 0
        for t, need, used in zip(tensors, needs, self.used(tensors)):
            m = t.numel()
            out.append(src[pos:pos + m].view(t.shape).to(t.dtype) if need and used else None)
            pos += m
        return out

    def theta(self, tensors) -> torch.Tensor:
        parts = [t.reshape(-1) if used else t.detach().reshape(-1)  # (no graph edge to it)
                 for t, used in zip(tensors, self.used(tensors))]
        if self.consts is not None:
            parts.append(self.consts)
        if not parts:  # no tensor arguments and no angles
            return torch.zeros(self.idx.shape, dtype=self.dtype, device=self.idx.device)
        src = parts[0] if len(parts) == 1 else torch.cat(parts)
        if src.dtype != self.dtype:
            src = src.to(self.dtype)
        theta = src[self.idx]
        if self.scale is not None:
            theta = theta * self.scale + self.offset
        if self.frozen is not None and theta.requires_grad:
            theta = torch.where(self.frozen, theta.detach(), theta)
        return theta

    def replay(self, tensors):
        # the signature holds every tensor's requires_grad: the trace knows whether any does
        grad = self.any_requires_grad and torch.is_grad_enabled()
        if self.bound is not None and (not grad or self.rule.keep):
            if grad:
                flat = _apply_bound(self, tensors)
                return flat if self.flat_out else self.shape(flat)
            flat = self.run_bound(tensors, keep=False)[0]
            return self.shape(flat if flat.dtype == self.dtype else flat.to(self.dtype))
        if grad and self.rule.keep:
            return self.shape(ReplayFunction.apply(self, *tensors))
        if not grad or self.rule is not BACKPROP:
            with torch.no_grad():
                theta = self.checked_theta(tensors)
        else:
            theta = self.checked_theta(tensors)
        plan = self.plan
        if not grad:
            flat = self.prepared.execute(theta).outputs
            flat = flat.to(self.dtype) if flat.dtype.is_floating_point else flat
        elif self.rule is BACKPROP:
            flat = flat_outputs(plan.backend.run(plan.circuit, theta))
            if flat.dtype != self.dtype and flat.dtype.is_floating_point:
                flat = flat.to(self.dtype)  # the angles' dtype, as the plain qnode returns
        else:
            flat = QuantumFunction.apply(self.theta(tensors), plan)[0]
        return self.shape(flat)

    def checked_theta(self, tensors) -> torch.Tensor:
        theta = self.theta(tensors)
        if theta.numel() and not bool(torch.isfinite(theta).all()):
            self.refuse_angles(theta)
        return theta

    def run_bound(self, tensors, keep: bool):
        """The engine's bound runner on ``tensors``; its refusal of a NaN or infinite angle
        names the gate, as a plain call's does (checked only when the kernels refuse)."""
        try:
            return self.bound.run(tensors, keep=keep)
        except QdiffError:
            with torch.no_grad():
                theta = self.theta(tensors)
            if theta.numel() and not bool(torch.isfinite(theta).all()):
                self.refuse_angles(theta)
            raise

    def refuse_angles(self, theta: torch.Tensor) -> None:
        """Raise the error naming the first gate whose angle in ``theta`` is NaN or infinite."""
        check_finite_angles(theta.detach(), self.plan.circuit.operations)
        raise QdiffError("static qnode: a gate angle is NaN or infinite")

    def shape(self, flat: torch.Tensor):
        if self.flat_out:
            return flat
        bshape = self.batch_shape
        if isinstance(self.result, Measurement):
            if self.result.is_scalar:
                return flat[:, 0].reshape(bshape)
            return flat.reshape(bshape + (flat.shape[-1],))
        if all(w is None for w in self.widths):
            return flat.reshape(bshape + (flat.shape[-1],))
        outs, col = [], 0
        for w in self.widths:
            if w is None:
                outs.append(flat[:, col].reshape(bshape))
                col += 1
            else:
                outs.append(flat[:, col:col + w].reshape(bshape + (w,)))
                col += w
        return type(self.result)(outs)


def differentiable_grads(trace, tensors, g_out, needs) -> tuple:
    """The tensors' gradients as a differentiable function of them (backward under
    ``create_graph``): the engine's differentiable vjp at the recorded angles, pulled back
    through the angle gather by autograd."""
    theta = trace.theta(tensors)
    grad = engine_vjp(theta, g_out, trace.plan, None)
    needs = [need and used for need, used in zip(needs, trace.used(tensors))]
    wrt = [t for t, need in zip(tensors, needs) if need]
    got = iter(torch.autograd.grad(theta, wrt, grad, create_graph=True, allow_unused=True))
    return tuple(next(got) if need else None for need in needs)


class ReplayFunction(torch.autograd.Function):
    """``tensors -> flat outputs (B, K)`` of a trace whose rule is the engine's reverse mode:
    the angle gather, the prepared run and (backward) ONE prepared vjp and ONE scatter-add
    into the arguments. Under ``create_graph`` the backward goes through the bridge's
    :func:`~qdiff.bridge.engine_vjp` on a differentiable theta instead (higher-order rules)."""

    @staticmethod
    def forward(ctx, trace, *tensors):
        theta = trace.checked_theta(tensors)
        res = trace.prepared.execute(theta, keep=True)
        ctx.trace, ctx.theta, ctx.residual = trace, theta, res.residual
        ctx.save_for_backward(*tensors)
        out = res.outputs
        return out if out.dtype == trace.dtype else out.to(trace.dtype)

    @staticmethod
    @exact_precision
    def backward(ctx, g_out):
        trace = ctx.trace
        refuse_batched_cotangent(g_out, trace.rule)
        tensors = ctx.saved_tensors
        needs = ctx.needs_input_grad[1:]
        if torch.is_grad_enabled():  # create_graph: a differentiable gradient
            return (None,) + differentiable_grads(trace, tensors, g_out, needs)
        grad = trace.prepared.vjp(ctx.theta, g_out, ctx.residual)
        ctx.residual = None
        return (None,) + tuple(trace.scatter(grad.to(trace.dtype), tensors, needs))


class BoundFunction(torch.autograd.Function):
    """``tensors -> flat outputs (B, K)`` through the engine's :class:`~qdiff.backends.base.Bound`
    runner: the engine reads the angles from the tensors and (backward) returns their gradients
    in one call each way. Under ``create_graph`` the backward is :class:`ReplayFunction`'s."""

    @staticmethod
    def forward(ctx, trace, *tensors):
        out, res = trace.run_bound(tensors, keep=True)
        # in a list, taken by one pop: threads may run this backward of one graph at once
        # (retain_graph), and the sweep consumes the residual in place
        ctx.trace, ctx.residual, ctx.used = trace, [res], trace.used(tensors)
        ctx.save_for_backward(*tensors)
        return out if out.dtype is trace.dtype else out.to(trace.dtype)

    @staticmethod
    @exact_precision
    def backward(ctx, g_out):
        trace = ctx.trace
        refuse_batched_cotangent(g_out, trace.rule)
        needs = ctx.needs_input_grad
        if torch.is_grad_enabled():  # create_graph: a differentiable gradient
            return (None,) + differentiable_grads(trace, ctx.saved_tensors, g_out, needs[1:])
        try:
            res = ctx.residual.pop()  # consumed by the sweep (a second call reruns)
        except IndexError:
            res = None
        # with the run's residual the engine reads neither the tensors nor their values (the
        # angles are the run's): the saved tensors are unpacked only for a rerun
        grads = trace.bound.grad(ctx.saved_tensors if res is None else None, res, g_out)
        out = [None]
        for g, dt, need, used in zip(grads, trace.arg_dtypes, needs[1:], ctx.used):
            out.append(None if g is None or not (need and used) else g if g.dtype is dt else
                       g.to(dt))
        return tuple(out)


_FunctionBase_apply = super(torch.autograd.Function, BoundFunction).apply
_transforms_active = torch._C._are_functorch_transforms_active
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead


def _apply_bound(trace, tensors):
    """``BoundFunction.apply(trace, *tensors)`` straight through torch's C entry point with the
    arguments' dead functorch wrappers unwrapped, as ``Function.apply`` does (it adds only the
    ``setup_context`` binding, which :class:`BoundFunction` does not use). Replays run outside
    functorch transforms only (:meth:`StaticQNode.__call__` hands those calls to the plain
    qnode)."""
    unwrap = _unwrap_if_dead
    return _FunctionBase_apply(trace, *[unwrap(t) for t in tensors])


def _probe_codes(total: int) -> list:
    """The probe bindings' values for the ``k``-th element of the arguments' concatenation:
    zeros, ones, ``k + 1``, ``perm[k] + 1`` (the two that identify the element), then a
    negative, large one (``-e^2 (k + 1)``) and a fractional one (``(perm[k] + 1)(1 + u[k]) /
    pi + 1/4``, ``u`` uniform in [0, 1)) that only an affine angle also matches (``relu``,
    ``abs``, ``x ** 2``, ``sin`` or a clamp agree with a line on non-negative integers but
    not there). Every probe before the fractional one is affine in ``k`` or in ``perm[k]``:
    a sum of elements whose codes form an arithmetic progression there (``x[2] + x[4]``
    against ``2 * x[3]``) matches all of them, and only the random factor ``1 + u`` (of the
    codes' size, above any tolerance) tells it from one element."""
    gen = torch.Generator().manual_seed(1234)
    perm = torch.randperm(total, generator=gen)
    u = torch.rand(total, generator=gen, dtype=torch.float64)
    k1 = torch.arange(1, total + 1, dtype=torch.float64)
    p1 = (perm + 1).to(torch.float64)
    return [torch.zeros(total, dtype=torch.float64), torch.ones(total, dtype=torch.float64),
            k1, p1, -7.38905609893065 * k1, p1 * (1 + u) * 0.3183098861837907 + 0.25]


def _probes(tensors, total: int):
    """The probe bindings of the arguments (:func:`_probe_codes`) and their codes as the
    arguments hold them (rounded to each one's dtype)."""
    out, held = [], []
    for e in _probe_codes(total):
        one, pos = [], 0
        for t in tensors:
            m = t.numel()
            one.append(e[pos:pos + m].reshape(t.shape).to(dtype=t.dtype, device=t.device)
                       .requires_grad_(t.requires_grad))
            pos += m
        out.append(one)
        held.append(torch.cat([p.detach().reshape(-1).cpu().to(torch.float64) for p in one])
                    if one else e)
    return out, held


def _fill(v, it):
    """``v`` with its tensor arguments (and :data:`_HOLE` slots) replaced from ``it``, in the
    order of :func:`call_signature`."""
    if v is _HOLE or (isinstance(v, torch.Tensor) and (v.dtype is _F64 or v.dtype is _F32)):
        return next(it)
    if not _container(v):
        return v
    if type(v) is dict:
        return {k: _fill(u, it) for k, u in v.items()}
    items = [_fill(u, it) for u in v]
    return items if type(v) is list else tuple(items) if type(v) is tuple else type(v)(*items)


def _substitute(args, kwargs, tensors):
    it = iter(tensors)
    a = [_fill(v, it) for v in args]
    k = {n: _fill(kwargs[n], it) for n in sorted(kwargs)}
    return a, k


def _holes(v):
    """``v`` with its tensors replaced by :data:`_HOLE`."""
    return _fill(v, iter(lambda: _HOLE, None))


def _gather_map(thetas, codes, total: int, tol: float):
    """Per theta element ``(idx, a, c)`` with ``theta = a * src[idx] + c`` from the probe
    thetas (:func:`_probe_codes`: zeros and ones give ``c`` and ``a``, the index encoding gives
    ``idx``, every other probe must agree), checked on the real binding. Constants get indices
    past the arguments (``consts``). Raises when an angle is not of that form."""
    # on the CPU, as the codes (made once per trace; the trace moves it to the arguments' device)
    t0, t1, t2 = (t.detach().to("cpu", torch.float64) for t in thetas[:3])
    c = t0
    a = t1 - t0
    moving = a != 0
    k = torch.where(moving, (t2 - c) / torch.where(moving, a, torch.ones_like(a)) - 1,
                    torch.zeros_like(a))
    kr = k.round()

    def err(t):
        return tol * (1 + t.abs())
    # the error k inherits from the angles' rounding: with float32 arguments an angle such as
    # (x - 128) / 255 loses most digits of t1 - t0 to cancellation. Up to a quarter is taken
    # for rounding error; the other probes tell a misread element
    slack = (err(t2) + err(t0) + (kr.abs() + 1) * (err(t1) + err(t0))) / \
        torch.where(moving, a.abs(), torch.ones_like(a))
    sharp = (k - kr).abs() <= 1e-6 * (1 + kr.abs())
    ok = sharp | ((k - kr).abs() <= slack.clamp(max=0.25))
    kr = kr.clamp(0, max(total - 1, 0)).long()
    refit = moving & ~sharp
    if total and bool(refit.any()):  # the scale of those refitted on the index probe, whose
        # code kr + 1 is the larger
        a = torch.where(refit, (t2 - c) / (kr + 1), a)
        ok &= (t1 - (a + c)).abs() <= err(t1)
    for t, code in zip(thetas[3:], codes[3:]):
        t = t.detach().to("cpu", torch.float64)
        expect = torch.where(moving, a * code[kr] + c, c) if total else c
        ok &= (t - expect).abs() <= tol * (1 + t.abs())
    ok &= moving | ((t2 - c).abs() <= tol * (1 + c.abs()))
    ok &= torch.isfinite(t0) & torch.isfinite(t1)
    return kr, a, c, moving, ok


def trace_call(qnode, args, kwargs, key, tensors, shots="device") -> Trace:
    """Record ``qnode`` for this call signature and ``shots`` (``"device"``: the device's
    own; see the module docstring)."""
    shots = effective_shots(qnode.device, shots)
    func = qnode.func

    def guarded_func(*a, **k):
        with _guarded(storages, reads):
            result = func(*a, **k)
        _refuse_non_affine(recording.active())
        return result

    guarded = object.__new__(type(qnode))  # the same qnode recording guarded_func
    guarded.__dict__.update(qnode.__dict__)
    guarded.func = guarded_func
    _register_autoray()
    g = [t.detach().as_subclass(GuardedTensor).requires_grad_(t.requires_grad) for t in tensors]
    reads: dict = {}  # the plain tensors the guarded run reads (see _note_reads)
    python_before = _python_guards(func)
    storages = frozenset(_storage(t) for t in tensors if t.numel()) - {None}
    ga, gk = _substitute(args, kwargs, g)
    ref, result = guarded.construct(*ga, **gk)
    if isinstance(ref.theta, NonAffineTensor):  # an angle the recorder derived further
        raise QdiffError("static qnode: a gate angle is not an argument element times a "
                         "constant plus a constant (use static=False)")
    sig = structure_signature(ref.circuit)
    ref = _routed(ref, qnode.device)
    circuit = ref.circuit
    for m in circuit.measurements:
        if m.kind not in DIFFERENTIABLE_KINDS:
            raise QdiffError(f"static qnode: {m.kind}() is not supported; return expval, var "
                             "or probs (or use static=False)")
        if m.obs is not None and m.obs.coeffs.requires_grad:
            raise QdiffError("static qnode: observables with trainable coefficients are not "
                             "supported (use static=False)")
    if ref.initial_state is not None:
        raise QdiffError("static qnode: state preparation (AmplitudeEmbedding/StatePrep) is "
                         "not supported (use static=False)")
    if ref.theta.shape[0] == 0:  # an empty batch: no angles to gather, nothing to run
        return EmptyTrace(qnode, args, kwargs, shots)
    total = sum(t.numel() for t in tensors)
    probes, codes = _probes(tensors, total)
    thetas = []
    probes[0] = [t.detach() for t in probes[0]]  # no argument requires grad in this one
    for p in probes + [[t.detach().requires_grad_(t.requires_grad) for t in tensors]]:
        pa, pk = _substitute(args, kwargs, p)
        rec = _probe_record(qnode, pa, pk, len(thetas) < len(probes))
        if structure_signature(rec.circuit) != sig:
            raise QdiffError("static qnode: the circuit structure (gates, wires, constant "
                             "angles or observables) depends on the argument values; a static "
                             "qnode cannot replay it (use static=False)")
        rec = _routed(rec, qnode.device)
        circ_p, th, train, shared = unshare(rec.circuit, rec.theta, rec.trainable, rec.shared)
        if not thetas and any(train):  # a tensor from outside the arguments requires grad
            _refuse_outside_grad(circ_p, train.index(True))
        thetas.append(th)
    circ_u, _, train_u, shared_u = unshare(circuit, ref.theta.as_subclass(torch.Tensor),
                                           ref.trainable, ref.shared)
    dtype = thetas[-1].dtype
    # an angle computed from a float32 argument carries float32 rounding
    tol = 1e-9 if dtype == torch.float64 and all(t.dtype == torch.float64 for t in tensors) \
        else 1e-5
    idx, a, c, moving, ok = _gather_map(thetas[:-1], codes, total, tol)
    if not bool(ok.all()):
        _refuse_angle(circ_u, ok)
    b, p = idx.shape
    consts = None
    if not bool(moving.all()):
        consts = c[~moving].to(dtype)
        idx = idx.clone()
        idx[~moving] = total + torch.arange(consts.numel())
        a = torch.where(moving, a, torch.ones_like(a))
        c = torch.where(moving, c, torch.zeros_like(c))
    scale = offset = None
    if not bool((a == 1).all() and (c == 0).all()):
        scale, offset = a.to(dtype), c.to(dtype)
    dev = tensors[0].device if tensors else None
    if dev is not None:
        idx = idx.to(dev)
        consts = consts.to(dev) if consts is not None else None
        scale = scale.to(dev) if scale is not None else None
        offset = offset.to(dev) if offset is not None else None
    trace = Trace(None, None, idx, scale, offset, consts, dtype, tuple(ref.batch_shape), result,
                  _widths(result, circuit))
    frozen = moving.any(dim=0) & ~torch.tensor(train_u, dtype=torch.bool).reshape(-1)
    if bool(frozen.any()) and any(t.requires_grad for t in tensors):
        trace.frozen = frozen.to(idx.device)
    trace.arg_dtypes = tuple(t.dtype for t in tensors)
    trace.any_requires_grad = any(t.requires_grad for t in tensors)
    check = trace.theta(tensors).detach().to(torch.float64)
    if not torch.allclose(check, thetas[-1].detach().to(torch.float64), rtol=tol, atol=tol):
        raise QdiffError("static qnode: the angles recorded from the arguments could not be "
                         "reproduced by a gather (use static=False)")
    circ_e, post = expand_coefficients(circ_u)
    rec_like = _Rec(circ_u, thetas[-1], train_u)
    device = qnode.backend_for(circ_u)  # widened by deferred measurements' wires
    rule = resolve(qnode.diff_method, device, circ_u, rec_like, shots)
    options = qnode.options if qnode.diff_method != "best" else \
        make_options(rule.name, {})
    trace.plan = Plan(circ_e, device, rule, train_u, None, options, shared_u,
                      higher_order(qnode.diff_method, rule), shots)
    trace.rule = rule
    validate_rules(trace.plan)
    job = trace.plan.job(thetas[-1].detach(), keep=rule.keep)
    prepare = getattr(device, "prepare", None)
    trace.prepared = prepare(job) if prepare is not None else Prepared(device, job)
    if trace.idx.device.type == "cpu" and not job.theta.requires_grad:
        trace.bound = trace.prepared.bind(Gather(
            trace.idx, None if scale is None else scale.expand(b, p).contiguous(),
            None if offset is None else offset.expand(b, p).contiguous(), consts,
            tuple(t.numel() for t in tensors), tuple(t.requires_grad for t in tensors)))
    check_batch = getattr(device, "check_batch", None)
    if check_batch is not None:
        check_batch(b, p)
    trace.outside = _outside_guards(reads)
    trace.python = _python_guards(func, python_before)
    return trace


_SNAPSHOT_MAX = 256  # elements of an outside CPU tensor whose values a replay compares


def _outside_guards(reads) -> tuple:
    """Per tensor the recorded function read from outside its arguments (a closure's, a
    global's, an attribute's): ``(tensor, version, data_ptr, values, requires_grad)``,
    ``values`` a copy of a small CPU tensor's (a write through ``.data`` bumps no version), else
    ``None``."""
    guards = []
    for key, t in reads.items():
        if key == "made" or t is None:
            continue
        with torch._C.DisableTorchFunctionSubclass():
            snap = t.detach().clone() if t.device.type == "cpu" and \
                t.layout is _STRIDED and t.numel() <= _SNAPSHOT_MAX else None
            guards.append((t, t._version, t.data_ptr() if t.layout is _STRIDED else 0, snap,
                           t.requires_grad))
    return tuple(guards)


_PLAIN = frozenset({int, float, complex, bool, str, bytes, type(None), range})
_MISSING = object()


def _code_names(code, names: set, depth: int = 0) -> set:
    """The global names ``code`` and the functions and comprehensions inside it read."""
    names.update(code.co_names)
    if depth < 4:
        for c in code.co_consts:
            if hasattr(c, "co_names"):
                _code_names(c, names, depth + 1)
    return names


def _snapshot(v):
    """``(kept, by_value)``: a plain value is compared by value, a list, tuple or dict by its
    items (plain ones by value, others by identity), a small NumPy array by its values (a
    copy); anything else by identity."""
    t = type(v)
    if t in _PLAIN:
        return v, True
    if t in (list, tuple) and len(v) <= _SNAPSHOT_MAX:
        return (v, tuple(v)), True
    if t is dict and len(v) <= _SNAPSHOT_MAX:
        return (v, tuple(v.items())), True
    if t.__module__ == "numpy" and t.__name__ == "ndarray" and v.size <= _SNAPSHOT_MAX and \
            v.dtype.kind in "biufc":
        return (v, v.copy()), True
    return v, False


def _python_guards(func, before=None) -> tuple:
    """``(globals, names, cells)`` for ``func``: the values of the globals and closure
    variables it reads (its own code's and its nested functions'), as :func:`_snapshot` keeps
    them, for :func:`python_changed`. A container the function itself changed since
    ``before`` (these guards taken before it ran: a list it appends to) is its output, not
    what it records from: kept by identity only."""
    code = getattr(func, "__code__", None)
    if code is None:
        return None
    glob = getattr(func, "__globals__", {})
    names = tuple(n for n in sorted(_code_names(code, set())) if n in glob)
    cells = tuple((c, *_snapshot(c.cell_contents)) for c in (func.__closure__ or ())
                  if _cell_set(c))
    names = tuple((n, *_snapshot(glob[n])) for n in names)
    if before is not None:
        # (one kept by identity before though comparable by value was written before)
        written = {n for n, kept, by_value in before[1] if n in glob and (
            not _unchanged(glob[n], kept, by_value) if by_value else _snapshot(glob[n])[1])}
        written_cells = {id(c) for c, kept, by_value in before[2] if _cell_set(c) and (
            not _unchanged(c.cell_contents, kept, by_value) if by_value else
            _snapshot(c.cell_contents)[1])}
        names = tuple((n, glob[n], False) if n in written else (n, v, b)
                      for n, v, b in names)
        cells = tuple((c, c.cell_contents, False) if id(c) in written_cells else (c, v, b)
                      for c, v, b in cells)
    return glob, names, cells


def _cell_set(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # not yet assigned
        return False
    return True


def _unchanged(now, kept, by_value) -> bool:
    if not by_value:
        return now is kept
    if type(kept) is not tuple:  # a plain value
        return type(now) is type(kept) and now == kept
    obj, copy = kept
    if now is not obj:
        return False
    if type(copy) is tuple:  # a list's, tuple's or dict's items
        items = tuple(obj.items()) if type(obj) is dict else obj
        return len(items) == len(copy) and all(_item_unchanged(u, k)
                                               for u, k in zip(items, copy))
    return obj.shape == copy.shape and obj.dtype == copy.dtype and bool((obj == copy).all())


def _item_unchanged(now, kept) -> bool:
    if now is kept:
        return True
    if type(now) is tuple and type(kept) is tuple:  # a dict's (key, value)
        return len(now) == len(kept) and all(_item_unchanged(u, k) for u, k in zip(now, kept))
    return type(now) in _PLAIN and type(now) is type(kept) and now == kept


def python_changed(guards) -> bool:
    """Whether a global or closure variable the recorded function reads was rebound, or a
    plain value or container of them it reads changed, since the recording."""
    glob, names, cells = guards
    for name, kept, by_value in names:
        now = glob.get(name, _MISSING)
        if now is not kept and not _unchanged(now, kept, by_value):
            return True
    for cell, kept, by_value in cells:
        try:
            now = cell.cell_contents
        except ValueError:
            return True
        if now is not kept and not _unchanged(now, kept, by_value):
            return True
    return False


def _stale(trace) -> bool:
    """Whether what ``trace`` read from outside its arguments changed since it was taken."""
    return (trace.python is not None and python_changed(trace.python)) or \
        bool(trace.outside and outside_changed(trace.outside))


def _refresh(trace, func) -> None:
    """Take ``trace``'s outside values afresh (after another signature's recording ran the
    function)."""
    if trace.python is not None:
        trace.python = _python_guards(func, trace.python)
    if trace.outside:
        trace.outside = _outside_guards({id(g[0]): g[0] for g in trace.outside})


def outside_changed(guards) -> bool:
    """Whether a tensor the trace read from outside its arguments changed since (in place,
    through ``.data``, given new data, or its ``requires_grad``)."""
    for t, version, ptr, snap, grad in guards:
        if t._version != version or t.requires_grad is not grad or (
                t.layout is _STRIDED and t.data_ptr() != ptr):
            return True
        if snap is not None and not (t.shape == snap.shape and t.dtype == snap.dtype and
                                     torch.equal(t.detach(), snap)):
            return True
    return False


def _probe_record(qnode, args, kwargs, probe: bool):
    """The record of one binding; a probe binding the function fails on is a refusal (the
    function depends on the values in a way a replay cannot follow)."""
    if not probe:
        return qnode.construct(*args, **kwargs)[0]
    try:
        return qnode.construct(*args, **kwargs)[0]
    except Exception as e:
        raise QdiffError(
            "static qnode: the function fails when its tensor arguments hold other values "
            f"than this call's ({type(e).__name__}: {e}), so what it records depends on them; "
            "a static qnode replays one structure per signature (use static=False)") from e


_RERECORD_WARN = 8  # recordings again after which a static qnode warns once


_HOLE = object()  # where an EmptyTrace puts each call's tensor arguments


class EmptyTrace:
    """The trace of a signature whose batch is empty: its replay is the plain qnode's call,
    which returns the empty outputs without running the engine
    (:func:`~qdiff.bridge.empty_outputs`)."""

    outside, python = (), None  # its replay runs the function

    def __init__(self, qnode, args, kwargs, shots):
        self.qnode, self.shots = qnode, shots
        self.args = tuple(_holes(v) for v in args)
        self.kwargs = {k: _holes(v) for k, v in kwargs.items()}

    def replay(self, tensors):
        args, kwargs = _substitute(self.args, self.kwargs, tensors)
        if not self.qnode._func_takes_shots:
            kwargs["shots"] = self.shots
        return self.qnode(*args, **kwargs)


def _routed(rec, device):
    """``rec`` routed for the device's noise model when it is not native to it (see
    :mod:`qdiff.noise`)."""
    if getattr(getattr(device, "noise", None), "native", None) is None:
        return rec
    from dataclasses import replace
    from qdiff.noise import route_recorded
    return route_recorded(replace(rec, theta=rec.theta.as_subclass(torch.Tensor)), device)


class _Rec:
    """What the rule table reads from a recorded call."""

    def __init__(self, circuit, theta, trainable):
        self.circuit, self.theta, self.trainable = circuit, theta, trainable
        self.initial_state = None
        self.batch_shape = ()


def _widths(result, circuit):
    """Per measurement of a list/tuple result: ``None`` for a scalar, else its output width."""
    if isinstance(result, Measurement):
        return None
    n = circuit.num_wires
    return [None if m.is_scalar else 2 ** (n if m.wires is None else len(m.wires))
            for m in circuit.measurements]


def _refuse_non_affine(rec) -> None:
    """Refuse a recorded gate whose angle an op that is not affine in the arguments computed
    (``clamp``, ``where``, ``sin``, ...): no set of probe values can prove such an angle is
    affine everywhere."""
    for item in getattr(rec, "items", ()):
        params = getattr(item, "params", None)
        if params is None:
            params = getattr(item, "data", ())
        if not isinstance(params, (list, tuple)):
            continue
        if any(isinstance(p, NonAffineTensor) for p in params):
            gate = getattr(item, "gate", None)
            name = getattr(gate, "pl_name", None) or getattr(gate, "name", None) or \
                getattr(item, "name", type(item).__name__)
            wires = list(getattr(item, "wires", ()))
            raise QdiffError(
                f"static qnode: the angle of gate '{name}' on wires {wires} is not an argument "
                "element times a constant plus a constant: a torch op that is not affine in "
                "the arguments computes it (clamp, where, sin, abs, a comparison, a product of "
                "two arguments, ...); compute it before the call and pass it in, or use "
                "static=False")


def _refuse_outside_grad(circuit, col: int):
    for op in circuit.operations:
        if any(isinstance(par, ParamRef) and par.index == col for par in op.params):
            where = f"of gate '{op.gate.pl_name or op.name}' on wires {list(op.wires)}"
            break
    else:
        where = f"{col}"
    raise QdiffError(
        f"static qnode: the angle {where} depends on a tensor that requires grad and is not "
        "an argument (a global, a closure or an attribute): a replay would keep its first "
        "value and give it no gradient. Pass it as an argument, or use static=False")


def _refuse_angle(circuit, ok):
    bad = int((~ok.all(dim=0)).nonzero()[0, 0])
    for op in circuit.operations:
        for par in op.params:
            if isinstance(par, ParamRef) and par.index == bad:
                raise QdiffError(
                    f"static qnode: the angle of gate '{op.gate.pl_name or op.name}' on wires "
                    f"{list(op.wires)} is not an argument element times a constant plus a "
                    "constant (e.g. it is computed by torch.sin); compute it before the call "
                    "and pass it in, or use static=False")
    raise QdiffError("static qnode: a gate angle is not an affine function of one argument "
                     "element (use static=False)")


# ------------------------------------------------------------------------------------------
# the qnode


class StaticQNode:
    """A :class:`~qdiff.qnode.QNode` that records once per call signature and replays the
    angle binding (see the module docstring for when that is valid).

    Args:
        qnode: the qnode to wrap.
        max_traces: how many signatures are kept (least recently used dropped).
    """

    def __init__(self, qnode, max_traces: int = 16):
        if isinstance(qnode, StaticQNode):
            qnode = qnode.qnode
        if not (callable(getattr(qnode, "construct", None)) and callable(getattr(qnode, "func", None))
                and hasattr(qnode, "options") and hasattr(qnode, "device")):
            if type(qnode).__name__ == "CircuitQNode":
                raise QdiffError("qd.jit takes a qnode of a Python function; a qnode of a "
                                 "QuantumCircuit or Circuit records nothing per call (its "
                                 "structure is fixed when it is made): call it directly")
            raise QdiffError(f"qd.jit takes a qnode made by qd.qnode; got "
                             f"{type(qnode).__name__}")
        if isinstance(max_traces, bool) or not isinstance(max_traces, int) or max_traces < 1:
            raise QdiffError(f"max_traces must be a positive int; got {max_traces!r}")
        self.qnode = qnode
        self.func = qnode.func
        self.device = qnode.device
        self.diff_method = qnode.diff_method
        self.max_traces = max_traces
        self._traces: OrderedDict = OrderedDict()
        self._rerecords = 0  # recordings again after an outside tensor changed
        functools.update_wrapper(self, qnode.func)
        if not getattr(StaticQNode, "_calls_eager", False):
            # under torch.compile the call stays eager (a graph break), as a plain qnode's:
            # dynamo would otherwise trace the recording of a new signature into its graph
            from qdiff.bridge import eager_under_compile
            StaticQNode.__call__ = eager_under_compile(StaticQNode.__call__)
            StaticQNode._calls_eager = True

    @property
    def num_traces(self) -> int:
        """How many call signatures have been traced and are kept."""
        return len(self._traces)

    def retrace(self) -> None:
        """Drop every trace: the next call records again (after changing state the function
        reads from outside its arguments)."""
        self._traces.clear()

    def construct(self, *args, **kwargs):
        return self.qnode.construct(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        refuse_graph_capture("qnode", self.qnode.func)
        refuse_nested("a static qnode")
        recording.refuse_pennylane_recording("a static qnode")
        if _transforms_active() or _forward_ad._current_level >= 0:
            # torch.func.grad / vmap / jacrev, or torch.autograd.forward_ad's dual tensors
            # (which a replay's gather would drop): the plain qnode's path
            return self.qnode(*args, **kwargs)
        shots = self.qnode.shots
        own_shots = "shots" in kwargs and not self.qnode._func_takes_shots
        if own_shots:
            shots = kwargs.pop("shots")  # this call's shots, as for a plain qnode
        if isinstance(shots, (list, tuple)):  # a shot vector: the plain qnode's call per part
            return self.qnode(*args, **kwargs, **({"shots": shots} if own_shots else {}))
        key, tensors = call_signature(args, kwargs)
        if any(t.layout is not _STRIDED for t in tensors):
            # a sparse (non-strided) argument has no storage to guard or gather angles from
            return self.qnode(*args, **kwargs, **({"shots": shots} if own_shots else {}))
        key = (key, shots)
        trace = self._traces.get(key)
        if trace is not None and _stale(trace):
            # a global, closure variable or tensor the function read from outside its
            # arguments changed: record again
            self._traces.pop(key, None)
            trace = None
            self._rerecords += 1
            if self._rerecords == _RERECORD_WARN:
                warnings.warn(
                    f"static qnode '{getattr(self.func, '__name__', '?')}' recorded its "
                    f"circuit again {_RERECORD_WARN} times because a global, closure variable "
                    "or tensor it reads from outside its arguments changed; pass that value "
                    "as an argument to replay without recording", stacklevel=2)
        if trace is None:
            # what the function writes while recording (a list it appends to, ...) is not a
            # change for the other traces: those stale before it are dropped, the rest take
            # their outside values afresh after it
            others = list(self._traces.items())
            for k, t in others:
                if _stale(t):
                    self._traces.pop(k, None)
            # recorded with grad mode on: which angles are trainable follows the arguments'
            # requires_grad (part of the key), whatever the grad mode of this first call
            # (its own saved tensors kept from outer saved-tensor hooks: the record's graphs
            # are not the output's, so a checkpoint's recomputation, which replays, matches).
            # Under torch.inference_mode, enable_grad alone records nothing: the record runs
            # outside it, on ordinary copies of the call's inference tensors
            if torch.is_inference_mode_enabled():
                trace = self._trace_outside_inference_mode(args, kwargs, key, tensors, shots)
            else:
                with torch.enable_grad(), _own_saved_tensors():
                    trace = trace_call(self.qnode, args, kwargs, key, tensors, shots)
            for k, t in others:
                if k in self._traces:
                    _refresh(t, self.qnode.func)
            self._traces[key] = trace
            if len(self._traces) > self.max_traces:
                try:
                    self._traces.popitem(last=False)
                except KeyError:  # emptied meanwhile by another thread
                    pass
        elif len(self._traces) > 1:
            try:
                self._traces.move_to_end(key)  # least recently used first
            except KeyError:  # evicted meanwhile by another thread: the trace is still valid
                pass
        if torch.is_grad_enabled() and any(t.is_inference() for t in tensors) and \
                any(t.requires_grad for t in tensors):
            # an input made under torch.inference_mode next to one that requires grad: autograd
            # cannot save an inference tensor, so the replay reads an ordinary copy of its
            # values (as the plain qnode's recording does)
            tensors = [t.clone() if t.is_inference() else t for t in tensors]
        # the engine computes in its own precision
        if autocast_cpu_enabled() or autocast_cuda_enabled():
            out = exact_precision(trace.replay)(tensors)
        else:
            out = trace.replay(tensors)
        if getattr(trace, "dtype", None) is torch.float16:
            refuse_float16_overflow(out, f"qnode '{getattr(self.qnode.func, '__name__', '?')}'")
        return out

    def _trace_outside_inference_mode(self, args, kwargs, key, tensors, shots):
        with torch.inference_mode(False), torch.enable_grad(), _own_saved_tensors():
            copies = [t.clone() if t.is_inference() else t for t in tensors]
            args, kwargs = _substitute(args, kwargs, copies)
            return trace_call(self.qnode, args, kwargs, key, copies, shots)

    def __deepcopy__(self, memo):
        """A deep copy shares the qnode, as it shares a function: ``copy.deepcopy(model)``
        works whatever scope the qnode was defined in."""
        return self

    def __reduce__(self):
        """Pickle by reference, like a qnode (define it at module level)."""
        from qdiff.bridge import module_reference
        return (_load, module_reference(self, "static qnode"))

    def __repr__(self):
        return f"<StaticQNode {getattr(self.func, '__name__', '?')} on {self.device!r}, " \
               f"diff_method={self.diff_method!r}, traces={self.num_traces}>"


def _own_saved_tensors():
    """Saved-tensor hooks that keep tensors as they are, shadowing any outer ones
    (``torch.utils.checkpoint``'s) while a signature is recorded (none where a context has
    disabled saved-tensor hooks: no outer ones run there either)."""
    if not torch._C._autograd._saved_tensors_hooks_is_enabled():
        return contextlib.nullcontext()
    return torch.autograd.graph.saved_tensors_hooks(_same, _same)


def _same(t):
    return t


def _load(module: str, qualname: str):
    import importlib
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


@checked_call
def jit(qnode, max_traces: int = 16) -> StaticQNode:
    """Record ``qnode`` once per call signature and replay the angle binding afterwards.

    >>> import torch, qdiff as qd
    >>> dev = qd.device("statevector", wires=1)
    >>> @qd.qnode(dev)
    ... def f(x):
    ...     qd.RX(x, wires=0); return qd.expval(qd.Z(0))
    >>> g = qd.jit(f)
    >>> bool(torch.isclose(g(torch.tensor(0.3, dtype=torch.float64)),
    ...                    torch.cos(torch.tensor(0.3, dtype=torch.float64))))
    True
    """
    return StaticQNode(qnode, max_traces)
