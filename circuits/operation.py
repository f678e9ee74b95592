"""One gate applied to wires with its angles.

In a recording, ``params`` hold the user's numbers or tensors; in a :class:`~qdiff.circuits.Circuit`
they hold floats (constants) or :class:`ParamRef` (columns of the parameter tensor ``theta``).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional

import torch

from qdiff.circuits.errors import QdiffError


@dataclass(frozen=True)
class ParamRef:
    """Angle ``scale * theta[:, index] + offset`` (affine, so compiled angles stay differentiable)."""

    index: int
    scale: float = 1.0
    offset: float = 0.0

    def __neg__(self):
        return ParamRef(self.index, -self.scale, -self.offset)

    def __add__(self, c):
        if isinstance(c, numbers.Real):
            return ParamRef(self.index, self.scale, self.offset + float(c))
        return NotImplemented

    __radd__ = __add__

    def __mul__(self, c):
        if isinstance(c, numbers.Real):
            return ParamRef(self.index, self.scale * float(c), self.offset * float(c))
        return NotImplemented

    __rmul__ = __mul__


def normalize_wires(wires) -> tuple:
    t = type(wires)
    if t is int:
        return (wires,)
    if (t is tuple or t is list) and all(type(w) is int for w in wires):
        return tuple(wires)
    if isinstance(wires, (int, str)) or (isinstance(wires, torch.Tensor) and wires.ndim == 0):
        wires = [wires]
    try:
        out = tuple(int(w) if isinstance(w, (numbers.Integral, torch.Tensor)) else w for w in wires)
    except TypeError:
        raise QdiffError(f"invalid wires {wires!r}: expected an int, a label or a sequence") from None
    return out


def is_concrete(t: torch.Tensor) -> bool:
    """False inside torch.func transforms (vmap/grad), where a tensor's values cannot steer
    Python control flow."""
    try:
        return not torch._C._functorch.is_functorch_wrapped_tensor(t)
    except AttributeError:  # older torch
        return True


def plain_values(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values as a plain tensor (detached), for validation that reads them in Python.
    Under ``torch.func.vmap`` a tensor holds one slice per vmapped binding and its values
    cannot be read directly: the result holds every slice, the vmapped dims in front
    (``(V, *t.shape)`` for one ``vmap``), so a check over the trailing dims checks them all.
    ``torch.func.grad``/``jvp`` wrappers are removed."""
    f = getattr(torch._C, "_functorch", None)
    if f is None:  # older torch
        return t.detach()
    while f.is_functorch_wrapped_tensor(t):
        if f.is_batchedtensor(t):
            t = f.get_unwrapped(t).movedim(f.maybe_get_bdim(t), 0)
        else:
            t = f.get_unwrapped(t)
    return t.detach()


def check_param(value, gate_name: str):
    """Validate one angle: a real number or a real tensor, all finite."""
    if isinstance(value, ParamRef):
        return value
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            raise QdiffError(f"gate '{gate_name}': angles must be real, got a complex tensor")
        if value.dtype is torch.bool:
            raise QdiffError(f"gate '{gate_name}': angle must be a real number or tensor, "
                             f"got a bool tensor")
        if not value.dtype.is_floating_point:
            value = value.to(torch.get_default_dtype() if torch.get_default_dtype() == torch.float64
                             else torch.float64)
        if value.layout != torch.strided:  # a sparse tensor: its values, differentiably
            value = value.to_dense()
        return value  # finiteness is checked once on the stacked theta (Circuit.from_recording)
    if value is None or isinstance(value, (str, bytes, bool)):  # numpy would turn "0.3" into
        # 0.3 and None into NaN silently
        raise QdiffError(f"gate '{gate_name}': angle must be a real number or tensor, "
                         f"got {type(value).__name__} {value!r}")
    if isinstance(value, numbers.Real):
        if not math.isfinite(float(value)):
            raise QdiffError(f"gate '{gate_name}': angle {value} is NaN or infinite")
        return float(value)
    try:
        import numpy as np
        kind = np.asarray(value).dtype
        if kind == np.bool_ or kind.kind == "c":  # (a complex one is never cut to its real part)
            raise TypeError
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        what = type(value).__name__
        if np.asarray(value).dtype == np.bool_ and what != "bool":
            what += " of bool"
        elif np.iscomplexobj(value) and "complex" not in what:
            what += " of complex"
        raise QdiffError(f"gate '{gate_name}': angle must be a real number or tensor, "
                         f"got {what}") from None
    return check_param(torch.as_tensor(arr), gate_name)


# Arithmetic on operations (``qd.Z(0) @ qd.Z(1)``, ``0.5 * qd.X(0)``) makes observables. The
# conversion lives with the observables, which build on this module: they install it here on
# import (:func:`set_observable_conversion`), so this module does not depend on them.
_TO_OBSERVABLE = None


def set_observable_conversion(fn) -> None:
    """Install ``fn(operation) -> Observable`` (done by :mod:`qdiff.circuits.observables`)."""
    global _TO_OBSERVABLE
    _TO_OBSERVABLE = fn


@dataclass(frozen=True, eq=False)
class Operation:
    """A gate on ``wires`` with ``params`` (numbers, tensors or :class:`ParamRef`)."""

    gate: object
    wires: tuple
    params: tuple = ()

    @classmethod
    def make(cls, gate, wires, params) -> "Operation":
        wires = normalize_wires(wires)
        label = gate.pl_name or gate.name
        if len(wires) != gate.num_wires:
            raise QdiffError(f"gate '{label}' acts on {gate.num_wires} wire(s); got wires {list(wires)}")
        if len(set(wires)) != len(wires):
            raise QdiffError(f"gate '{label}': repeated wire in {list(wires)}")
        free = getattr(gate, "unbounded", ())  # a channel's parameters that may be +inf
        params = tuple(math.inf if i in free and type(p) is float and p == math.inf
                       else check_param(p, label) for i, p in enumerate(params))
        return cls(gate, wires, params)

    @property
    def name(self) -> str:
        return self.gate.name

    def matrix(self) -> torch.Tensor:
        """The gate's matrix for concrete (non-reference) params."""
        return self.gate.matrix(*self.params)

    def with_params(self, params) -> "Operation":
        return Operation(self.gate, self.wires, tuple(params))

    def inverse(self) -> "Operation":
        gate, params = self.gate.inverse(self.params)
        return Operation(gate, self.wires, tuple(params))

    # -- an operation such as qd.Z(0) doubles as an observable -------------------------------
    def as_observable(self):
        if _TO_OBSERVABLE is None:  # pragma: no cover - installed when the package is imported
            raise QdiffError("observables are not available (import qdiff.circuits.observables)")
        return _TO_OBSERVABLE(self)

    def __matmul__(self, other):
        return self.as_observable() @ other

    def __rmatmul__(self, other):
        return other @ self.as_observable()

    def __mul__(self, c):
        return self.as_observable() * c

    __rmul__ = __mul__

    def __truediv__(self, c):
        return self.as_observable() / c

    def __add__(self, other):
        return self.as_observable() + other

    __radd__ = __add__

    def __sub__(self, other):
        return self.as_observable() - other

    def __rsub__(self, other):
        return other - self.as_observable()

    def __neg__(self):
        return -self.as_observable()

    def __repr__(self):
        ps = ", ".join(f"{p:.4g}" if isinstance(p, float) else repr(p) if isinstance(p, ParamRef)
                       else f"tensor{tuple(p.shape)}" for p in self.params)
        label = self.gate.pl_name or self.gate.name
        return f"{label}({ps + ', ' if ps else ''}wires={list(self.wires)})"


@dataclass(frozen=True, eq=False)
class BlockStructure:
    """The gate structure of a template call, cached per signature (template, tail shape,
    wires, options): ``ops`` on wire labels whose angles are ``ParamRef(j)``, angle ``j`` being
    entry ``index[j]`` of the source's flattened trailing ``tail`` dims (``None``: entries
    ``0..m-1`` in order)."""

    ops: tuple
    tail: tuple
    num_angles: int
    index: Optional[torch.Tensor] = None


@dataclass(frozen=True, eq=False)
class OpBlock:
    """A template's operations recorded as ONE item: every angle is an entry of ``source``
    ``(*lead, *structure.tail)``, the leading dims being batch dims. A qnode gathers all of a
    block's angles in one tensor op and reuses its recorded circuit while the structure stays
    the same; :meth:`operations` gives the ordinary operations (tensor angles) on demand."""

    structure: BlockStructure
    source: torch.Tensor

    @property
    def lead(self) -> tuple:
        return tuple(self.source.shape[:self.source.ndim - len(self.structure.tail)])

    def _flat(self) -> torch.Tensor:
        """``source`` with its trailing ``tail`` dims flattened (sized, not ``-1``: an empty
        batch has no elements to infer it from)."""
        size = 1
        for s in self.structure.tail:
            size *= s
        return self.source.reshape(*self.lead, size)

    def angles(self) -> torch.Tensor:
        """``(*lead, m)``: the block's angles in ``ParamRef`` order."""
        flat = self._flat()
        idx = self.structure.index
        if idx is None:
            m = self.structure.num_angles
            return flat if flat.shape[-1] == m else flat[..., :m]
        return flat.index_select(-1, idx.to(flat.device))

    def operations(self) -> list:
        flat = self._flat()
        idx = self.structure.index
        pos = (lambda j: j) if idx is None else (lambda j: int(idx[j]))
        return [Operation(op.gate, op.wires, tuple(flat[..., pos(p.index)] if isinstance(p, ParamRef)
                                                   else p for p in op.params))
                for op in self.structure.ops]
