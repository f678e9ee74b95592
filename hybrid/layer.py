"""``QuantumLayer``: a qnode as a ``torch.nn.Module`` with trainable weights.

The qnode takes the layer input as its argument named ``inputs`` (as PennyLane's
``TorchLayer``; a qnode without one takes it as its first argument) and its weights by the
names in ``weight_shapes``; any other argument needs a default. Inputs ``(B, F)``
or ``(F,)`` run as ONE batched circuit execution. Weights take ``torch.get_default_dtype()``
unless ``dtype`` is given or ``init_method`` gives a floating tensor (as PennyLane's
``TorchLayer``); the output takes the input's floating
dtype, so a float32 ``nn.Linear`` can follow.

>>> import torch, qdiff as qd
>>> dev = qd.device("statevector", wires=2)
>>> @qd.qnode(dev)
... def circuit(inputs, weights):
...     qd.AngleEmbedding(inputs, wires=range(2))
...     qd.BasicEntanglerLayers(weights, wires=range(2))
...     return [qd.expval(qd.Z(i)) for i in range(2)]
>>> layer = qd.QuantumLayer(circuit, {"weights": (3, 2)})
>>> layer(torch.rand(5, 2)).shape
torch.Size([5, 2])
"""
from __future__ import annotations

import inspect
import math
from typing import Callable, Optional, Union

import numpy as np
import torch
from torch import nn

from qdiff.bridge import refuse_float16_overflow
from qdiff.circuits.errors import QdiffError, checked_call


def _default_init(t: torch.Tensor) -> torch.Tensor:
    return nn.init.uniform_(t, 0.0, 2 * math.pi)


class QuantumLayer(nn.Module):
    """A torch module around ``qnode(inputs, **weights)``.

    Args:
        qnode: a :class:`qdiff.QNode` whose argument ``inputs`` (else its first) receives
            the layer input.
        weight_shapes: ``{name: shape}`` of the qnode's weight arguments; an int ``n`` is
            ``(n,)`` and ``1`` a scalar ``()``, as in PennyLane's ``TorchLayer``.
        init_method: a callable ``tensor -> tensor`` (in-place init), a dict of them per
            weight, or a dict of ready tensors; default uniform on [0, 2 pi).
        dtype: dtype of the weights (default ``torch.get_default_dtype()`` at construction,
            or that of a floating tensor ``init_method`` gives or returns, as in PennyLane's
            ``TorchLayer``; ``.float()`` / ``.double()`` change it).

    The circuit runs in the wider of the input and weight dtypes (angles in float64 when
    either is; float16 and bfloat16 inputs and weights reach the qnode in float32); the output
    is cast to the input's floating dtype (the weights' dtype for integer inputs, and for lists
    and arrays). Measurements of different shapes (``probs``
    with ``expval``) are flattened per input row and concatenated in order: ``(..., K)``, as
    ``TorchLayer``'s.
    """

    @checked_call
    def __init__(self, qnode, weight_shapes: dict, init_method: Optional[Union[Callable, dict]] = None,
                 dtype: Optional[torch.dtype] = None):
        super().__init__()
        keep = dtype is None  # a floating tensor from init_method keeps its dtype (as TorchLayer)
        if dtype is None:
            dtype = torch.get_default_dtype()
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise QdiffError(f"QuantumLayer: dtype must be a floating torch dtype; got {dtype!r}")
        if not isinstance(weight_shapes, dict):
            raise QdiffError("QuantumLayer: weight_shapes must be a dict {weight name: shape}; "
                             f"got {type(weight_shapes).__name__}")
        if not callable(qnode):
            raise QdiffError(f"QuantumLayer: qnode must be a qnode (qd.qnode); got "
                             f"{type(qnode).__name__}")
        self.qnode = qnode
        signature = inspect.signature(getattr(qnode, "func", qnode)).parameters
        var_kw = any(p.kind is p.VAR_KEYWORD for p in signature.values())
        params = [k for k, p in signature.items()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if not params:
            raise QdiffError("QuantumLayer: the qnode needs an input argument (e.g. 'inputs')")
        # PennyLane's TorchLayer feeds the argument named 'inputs', wherever it stands
        self.input_arg = "inputs" if "inputs" in params and "inputs" not in weight_shapes \
            else params[0]
        # weights reach the qnode by name: its arguments, or its **kwargs (as in PennyLane)
        missing = [] if var_kw else [k for k in weight_shapes if k not in params]
        if missing:
            raise QdiffError(f"QuantumLayer: weight(s) {missing} are not arguments of the qnode "
                             f"(its arguments: {params})")
        if self.input_arg in weight_shapes:
            raise QdiffError(f"QuantumLayer: the qnode argument '{self.input_arg}' receives the "
                             "layer input and cannot be a weight")
        unfed = [k for k, p in signature.items() if k != self.input_arg and k not in weight_shapes
                 and p.default is inspect.Parameter.empty
                 and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if unfed:
            raise QdiffError(f"QuantumLayer: qnode argument(s) {unfed} are neither the input "
                             f"'{self.input_arg}' nor in weight_shapes; give each a shape in "
                             "weight_shapes or a default value")
        self.weight_shapes = {k: _weight_shape(k, v) for k, v in weight_shapes.items()}
        _check_init_method(init_method, self.weight_shapes)
        taken = [k for k in self.weight_shapes if hasattr(type(self), k) or k in self.__dict__]
        if taken:
            raise QdiffError(f"QuantumLayer: weight name(s) {taken} are attributes of the torch "
                             "module (nn.Module / QuantumLayer); rename the qnode argument(s)")
        for name, shape in self.weight_shapes.items():
            self.register_parameter(name, nn.Parameter(self._init(name, shape, init_method, dtype,
                                                                   keep)))

    @staticmethod
    def _init(name, shape, init_method, dtype, keep=False) -> torch.Tensor:
        init = init_method.get(name) if isinstance(init_method, dict) else init_method
        if init is not None and not callable(init) and not isinstance(init, torch.Tensor):
            keep = False  # (a list or an array takes the layer's dtype)
            try:  # (its dtype once it is checked real: a complex one is never cut)
                init = torch.as_tensor(init if hasattr(init, "dtype") else np.asarray(init))
            except (TypeError, ValueError, RuntimeError):
                raise QdiffError(f"QuantumLayer: init_method for '{name}' must be a callable or "
                                 f"an initial value; got {type(init).__name__}") from None
        if isinstance(init, torch.Tensor) and init.is_complex():
            raise QdiffError(f"QuantumLayer: initial value of '{name}' is complex "
                             f"({init.dtype}); weights are real")
        if isinstance(init, torch.Tensor):
            if tuple(init.shape) != tuple(shape):
                raise QdiffError(f"QuantumLayer: initial value of '{name}' has shape "
                                 f"{tuple(init.shape)}, expected {tuple(shape)}")
            return init.detach().clone().to(_weight_dtype(init, dtype, keep))
        t = torch.full(shape, float("nan"), dtype=dtype)  # entries an init leaves unset show
        try:
            out = (init or _default_init)(t)
        except (ValueError, RuntimeError) as exc:  # (torch.nn.init's refusals of a shape)
            raise QdiffError(f"QuantumLayer: init_method for '{name}' cannot initialise a weight "
                             f"of shape {tuple(shape)}: {exc}") from exc
        if out is None:  # an in-place init that returns nothing
            out = t
        if not isinstance(out, torch.Tensor):
            raise QdiffError(f"QuantumLayer: init_method for '{name}' returned "
                             f"{type(out).__name__}; it must fill the tensor it is given (and "
                             "return it or None) or return a tensor")
        if out.is_complex():
            raise QdiffError(f"QuantumLayer: init_method for '{name}' returned a complex tensor "
                             f"({out.dtype}); weights are real")
        if tuple(out.shape) != tuple(shape):
            raise QdiffError(f"QuantumLayer: init_method for '{name}' returned shape "
                             f"{tuple(out.shape)}, expected {tuple(shape)}")
        if out.is_floating_point() and bool(torch.isnan(out).any()):
            raise QdiffError(f"QuantumLayer: init_method for '{name}' left entries unset (NaN); "
                             "it must fill the tensor it is given or return a tensor")
        return out.detach().to(_weight_dtype(out, dtype, keep))

    @classmethod
    def from_qiskit(cls, qc, input_params=None, weight_params=None, observables=None,
                    device=None, diff_method: str = "best", init_method=None,
                    dtype: Optional[torch.dtype] = None, **gradient_kwargs) -> "QuantumLayer":
        """A Qiskit ``QuantumCircuit`` (or an OpenQASM import) as a layer, like Qiskit ML's
        ``TorchConnector(EstimatorQNN(...))``.

        Args:
            qc: the circuit (feature map composed with ansatz).
            input_params: the parameters fed by the layer input, in input-feature order
                (``Parameter`` s, ``ParameterVector`` s or names); ``inputs`` is ``(B, F)``.
            weight_params: the trainable parameters: ONE weight tensor ``weights`` ``(W,)``
                whose entries follow ``weight_params`` in the order given. Every circuit
                parameter must be an input or a weight (exactly once).
            observables: ``SparsePauliOp`` s / Pauli labels / qdiff observables, one output
                each; default ``Z`` on every qubit as one observable (output ``(B, 1)``), or
                for a circuit with final measurements their probabilities ``(B, 2**m)``,
                classical bit 0 most significant (SamplerQNN's index bit-reversed).
            device: a backend or a device name (default the statevector simulator).
            diff_method: any qnode method; ``init_method``: a callable, a ``(W,)`` tensor or
                ``{"weights": ...}``.
            dtype: the weights' dtype (default float64; Qiskit ML's ``TorchConnector`` holds
                float32 weights and returns float32 outputs).

        Angles may be any Qiskit parameter expression; they are evaluated in torch.
        """
        from qdiff.hybrid.qiskit_layer import layer_from_qiskit
        return layer_from_qiskit(cls, qc, input_params, weight_params, observables, device,
                                 diff_method, init_method, dtype, **gradient_kwargs)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """``(..., F) -> (..., K)``: ``K`` outputs per input row, the qnode's measurements
        concatenated along the last dim in order (a ``probs`` of ``k`` wires gives ``2**k``)."""
        params = self._parameters
        weights = {self.input_arg: inputs}
        ref = None
        for name in self.weight_shapes:
            w = params.get(name)
            w = w if w is not None else getattr(self, name)
            ref = w if ref is None else ref
            # float16/bfloat16 weights (.half()) reach the qnode in float32, exactly
            weights[name] = w.float() if w.dtype in _HALF else w
        if not isinstance(inputs, torch.Tensor):  # a list or an array: a tensor of the weights'
            inputs = weights[self.input_arg] = _as_input(inputs, ref)  # dtype, its batch kept
        want = inputs.dtype if inputs.dtype.is_floating_point else \
            ref.dtype if ref is not None else None
        if inputs.dtype in _HALF:  # (a float16/bfloat16 layer before it, torch.autocast)
            inputs = weights[self.input_arg] = inputs.float()
        batch = None
        if inputs.ndim > 2:  # (..., F) runs as (B, F), as TorchLayer's (a circuit reading
            batch = tuple(inputs.shape[:-1])  # inputs[:, i] sees one row per sample)
            inputs = weights[self.input_arg] = inputs.reshape(math.prod(batch), inputs.shape[-1])
        out = self.qnode(**weights)
        if not isinstance(out, torch.Tensor):
            out = _concat_outputs(out, inputs)
        if batch is not None and out.ndim and out.shape[0] == inputs.shape[0]:
            out = out.reshape(batch + tuple(out.shape[1:]))
        if want is not None and out.dtype.is_floating_point and out.dtype != want:
            out = out.to(want)
            if want is torch.float16:
                refuse_float16_overflow(out, f"QuantumLayer "
                                             f"'{getattr(self.qnode, '__name__', '?')}'")
        return out

    def __prepare_scriptable__(self):
        """``torch.jit.script`` calls this on every submodule first: a qnode call records its
        circuit in Python at each call, which TorchScript cannot compile."""
        raise QdiffError(f"QuantumLayer '{getattr(self.qnode, '__name__', '?')}': "
                         "torch.jit.script cannot compile a qnode call (its circuit is recorded "
                         "in Python at each call); run the model eagerly or with torch.compile, "
                         "which keeps the qnode call eager")

    @property
    def qnode_weights(self) -> dict:
        """``{name: nn.Parameter}`` of the weights (PennyLane's ``TorchLayer.qnode_weights``)."""
        return {name: getattr(self, name) for name in self.weight_shapes}

    def extra_repr(self) -> str:
        return f"qnode={getattr(self.qnode, '__name__', '?')}, weights={self.weight_shapes}"


_HALF = (torch.float16, torch.bfloat16)


def _weight_dtype(value: torch.Tensor, dtype: torch.dtype, keep: bool) -> torch.dtype:
    """A weight's dtype: ``dtype``, or where the layer was given none, that of a floating tensor
    ``init_method`` gave or returned (PennyLane's ``TorchLayer`` keeps a float64 initial value)."""
    return value.dtype if keep and value.is_floating_point() else dtype


def _as_input(inputs, ref) -> torch.Tensor:
    """A layer input given as a list or an array, as a tensor in the weights' dtype."""
    try:
        t = torch.as_tensor(inputs)
    except (TypeError, ValueError, RuntimeError):
        raise QdiffError(f"QuantumLayer: inputs must be a tensor or an array of numbers; got "
                         f"{type(inputs).__name__}") from None
    if ref is not None and not t.is_complex():
        t = t.to(device=ref.device, dtype=ref.dtype)
    return t


def _weight_shape(name: str, size) -> tuple:
    """A weight's shape from ``weight_shapes``: a sequence of sizes; an int ``n`` is ``(n,)``,
    and ``1`` is a scalar ``()``, as in PennyLane's ``TorchLayer``."""
    import operator
    from collections.abc import Iterable
    seq = isinstance(size, Iterable) and not isinstance(size, (str, bytes))
    try:
        items = tuple(size) if seq else (size,)
        if any(isinstance(d, bool) for d in items):
            raise TypeError
        dims = tuple(operator.index(d) for d in items)
    except TypeError:
        raise QdiffError(f"QuantumLayer: weight_shapes['{name}'] must be an int or a tuple of "
                         f"ints; got {size!r}") from None
    if any(d < 0 for d in dims):
        raise QdiffError(f"QuantumLayer: weight_shapes['{name}'] = {size!r} has a negative size")
    return () if not seq and dims == (1,) else dims


def _check_init_method(init_method, shapes: dict) -> None:
    """A dict ``init_method`` names weights only (a callable or a value applies to each)."""
    if not isinstance(init_method, dict):
        return
    unknown = [k for k in init_method if k not in shapes]
    if unknown:
        raise QdiffError(f"QuantumLayer: init_method names {unknown}, which are not weights "
                         f"(weights: {list(shapes)})")


def _concat_outputs(outs, inputs) -> torch.Tensor:
    """The qnode's outputs of several shapes (e.g. ``probs`` and ``expval``) as one tensor
    ``batch + (K,)``, each flattened per input row, in order (PennyLane's ``TorchLayer``); the
    batch is ``inputs.shape[:-1]``."""
    if not isinstance(outs, (list, tuple)):
        raise QdiffError(f"QuantumLayer: the qnode returned a {type(outs).__name__}, not a "
                         "tensor or a list of tensors; give the layer a qdiff qnode (qd.qnode)")
    outs = list(outs)
    bad = [type(o).__name__ for o in outs if not isinstance(o, torch.Tensor)]
    if bad:
        raise QdiffError(f"QuantumLayer: a qnode output is a {bad[0]}, not a tensor; a "
                         "layer's measurements are expval, var, probs or state")
    bshape = tuple(inputs.shape[:-1]) if isinstance(inputs, torch.Tensor) and inputs.ndim else ()
    for o in outs:
        if tuple(o.shape[:len(bshape)]) != bshape or o.ndim < len(bshape):
            raise QdiffError(f"QuantumLayer: a qnode output of shape {tuple(o.shape)} does not "
                             f"lead with the batch shape {bshape} of inputs "
                             f"{tuple(inputs.shape)}")
    return torch.cat([o.reshape(bshape + (math.prod(o.shape[len(bshape):]),)) for o in outs],
                     dim=-1)  # (an explicit size: a reshape to -1 fails on 0 rows)
