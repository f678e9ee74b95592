"""Backprop under PennyLane's autograd interface for the PennyLane devices (their engines are
torch code).

PennyLane's ``diff_method="backprop"`` hands the device tapes whose parameters are autograd
boxes and differentiates whatever the device returns. A torch engine cannot take the boxes, so
:func:`execute_autograd` gathers every boxed parameter into one real vector, runs the tapes
with torch tensors in their place inside ONE autograd primitive, and hands autograd the
results; the primitive's vector-Jacobian product is torch autograd through the engine, and is
itself such a primitive (its own VJP the double backward), so ``qml.grad``, ``qml.jacobian``
and Hessians are exact to every order.

Autograd's cotangent ``g`` of a complex output ``y`` pairs as ``Re(g * dy)``; torch's as
``Re(conj(v) * dy)``: torch is handed ``v = conj(g)``. Complex parameters (a trainable state
vector or matrix) travel as their real and imaginary parts.
"""
from __future__ import annotations

import numpy as np
import torch

_F64 = torch.float64


def _vector_primitive(fn, n_in: int):
    """An autograd primitive of ``x`` (a real vector of ``n_in`` entries) computing ``fn`` (a
    differentiable torch function of a real 1-D tensor returning a 1-D tensor), with the VJP
    another such primitive of ``[x, g]``."""
    from autograd.extend import defvjp, primitive
    import autograd.numpy as anp

    @primitive
    def f(x):
        with torch.no_grad():
            return fn(torch.as_tensor(np.asarray(x, dtype=np.float64))).numpy()

    def vjp(ans, x):
        cplx = np.iscomplexobj(ans)
        m = int(np.size(ans))

        def back(v: torch.Tensor) -> torch.Tensor:
            with torch.enable_grad():  # the primitive's forward runs under no_grad
                if not v.requires_grad:
                    v = v.detach().requires_grad_(True)
                xs = v[:n_in]
                g = v[n_in:n_in + m]
                if cplx:  # torch's cotangent of a complex output: conj of autograd's
                    g = torch.complex(g, -v[n_in + m:])
                out = fn(xs)
                if not out.requires_grad:  # no output depends on the parameters
                    return torch.zeros(n_in, dtype=_F64)
                (gx,) = torch.autograd.grad(out, xs, g, create_graph=True, allow_unused=True)
            return torch.zeros(n_in, dtype=_F64) if gx is None else gx

        back_prim = _vector_primitive(back, n_in + (2 * m if cplx else m))
        if cplx:
            return lambda g: back_prim(anp.concatenate(
                [x, anp.real(anp.ravel(g)), anp.imag(anp.ravel(g))]))
        return lambda g: back_prim(anp.concatenate([x, anp.ravel(anp.real(g))]))

    defvjp(f, vjp)
    return f


def backprop_interface(config, circuit):
    """The interface a backprop call runs under: the config's, with ``"auto"`` resolved from
    the circuit's parameters (torch, autograd or numpy; anything else stays ``"auto"``)."""
    from pennylane.math import Interface, get_interface
    interface = config.interface
    if interface == Interface.AUTO and circuit is not None:
        name = get_interface(*circuit.get_parameters(trainable_only=False))
        if name in ("torch", "autograd", "numpy"):
            interface = Interface(name)
    return interface


def has_boxes(circuits) -> bool:
    """Whether any tape parameter is an autograd box (the call is being differentiated)."""
    from autograd.tracer import Box
    return any(isinstance(p, Box) for t in circuits
               for p in t.get_parameters(trainable_only=False))


def nested_boxes(circuit) -> bool:
    """Whether the tape's parameters carry boxes of more than one autograd trace (a box
    holding another box, or boxes of two traces side by side): a derivative is being
    differentiated again (``qml.jacobian(qml.jacobian(f))``, a mixed partial), whatever
    ``max_diff`` says."""
    from autograd.tracer import Box
    if circuit is None:
        return False
    traces = set()
    for p in circuit.get_parameters(trainable_only=False):
        while isinstance(p, Box):
            traces.add(p._trace)
            p = p._value
    return len(traces) > 1


def execute_autograd(circuits, run):
    """``run(tapes)`` (the device's execution of tapes with torch parameters, returning torch
    results that carry their autograd graph) differentiated by autograd: the results as
    autograd values of the tapes' boxed parameters."""
    from autograd.tracer import Box, getval
    import autograd.numpy as anp

    slots, parts = [], []  # (tape, parameter index, shape, complex) per boxed parameter
    for ti, tape in enumerate(circuits):
        for pi, p in enumerate(tape.get_parameters(trainable_only=False)):
            if not isinstance(p, Box):
                continue
            cplx = np.iscomplexobj(getval(p))
            slots.append((ti, pi, np.shape(getval(p)), cplx))
            flat = anp.ravel(p)
            parts += [anp.real(flat), anp.imag(flat)] if cplx else [flat]
    x = anp.concatenate(parts)
    layout: list = []  # the results' structure, filled by the first evaluation

    def bound(v: torch.Tensor):
        per_tape: dict = {}
        off = 0
        for ti, pi, shape, cplx in slots:
            size = int(np.prod(shape))
            t = v[off:off + size]
            off += size
            if cplx:
                t = torch.complex(t, v[off:off + size])
                off += size
            per_tape.setdefault(ti, {})[pi] = t.reshape(shape)
        tapes = []
        for ti, tape in enumerate(circuits):
            new = per_tape.get(ti)
            if new is None:
                tapes.append(_unboxed(tape))
                continue
            tape = _rebound(tape, new)
            tape.trainable_params = sorted(new)  # the boxed parameters, whatever was marked
            tapes.append(tape)
        return tapes

    def fn(v: torch.Tensor) -> torch.Tensor:
        results = run(bound(v))
        leaves, struct = _flatten(results)
        if not layout:
            layout.append(struct)
        cplx = any(t.is_complex() for t in leaves)
        dt = torch.complex128 if cplx else _F64
        return torch.cat([t.reshape(-1).to(dt) for t in leaves]) if leaves else \
            torch.zeros(0, dtype=dt)

    y = _vector_primitive(fn, int(np.size(getval(x))))(x)
    return _unflatten(y, layout[0])


def _unboxed(tape):
    from autograd.tracer import Box, getval
    params = tape.get_parameters(trainable_only=False)
    return _rebound(tape, {i: getval(p) for i, p in enumerate(params) if isinstance(p, Box)})


def _rebound(tape, values: dict):
    """``tape`` with its parameters at the indices of ``values`` (index -> value, indices into
    ``tape.get_parameters(trainable_only=False)``) replaced; every other operation is kept as
    it is. A controlled operation is rebuilt around its rebound base with its control wires,
    control values and work wires (PennyLane's ``bind_new_parameters`` of a
    ``ControlledQubitUnitary`` drops its control values)."""
    if not values:
        return tape
    ops, start = [], 0
    for op in tape.operations:
        n = len(op.data)
        mine = {i - start: v for i, v in values.items() if start <= i < start + n}
        start += n
        ops.append(_rebound_op(op, [mine.get(k, d) for k, d in enumerate(op.data)])
                   if mine else op)
    rest = {i: v for i, v in values.items() if i >= start}  # observables' parameters
    tape = tape.copy(operations=ops)
    if rest:
        tape = tape.bind_new_parameters(list(rest.values()), list(rest))
    return tape


def _rebound_op(op, params):
    import pennylane as qml
    from pennylane.ops.op_math import Controlled
    if isinstance(op, Controlled):
        base = _rebound_op(op.base, params)
        with qml.QueuingManager.stop_recording():
            return qml.ctrl(base, control=op.control_wires, control_values=op.control_values,
                            work_wires=op.work_wires, work_wire_type=op.work_wire_type)
    return qml.ops.functions.bind_new_parameters(op, params)


def _flatten(results):
    """Torch leaves of a device's nested results and their structure: a list whose entries are
    ``("leaf", shape, complex)``, ``("tuple", [children])`` or ``("const", value)`` (a result
    that is not a tensor, e.g. a NumPy array of a measurement with no trainable input)."""
    leaves = []

    def walk(r):
        if isinstance(r, (tuple, list)):
            return ("tuple", [walk(c) for c in r])
        t = r if isinstance(r, torch.Tensor) else torch.as_tensor(np.asarray(r))
        if not (t.is_floating_point() or t.is_complex()):
            return ("const", r)
        leaves.append(t)
        return ("leaf", tuple(t.shape), t.is_complex())

    return leaves, walk(results)


def _unflatten(y, struct):
    import autograd.numpy as anp
    off = [0]
    y_cplx = np.iscomplexobj(y._value if hasattr(y, "_value") else y)

    def build(s):
        kind = s[0]
        if kind == "tuple":
            return tuple(build(c) for c in s[1])
        if kind == "const":
            return s[1]
        shape, cplx = s[1], s[2]
        size = int(np.prod(shape))
        seg = y[off[0]:off[0] + size]
        off[0] += size
        if y_cplx and not cplx:
            seg = anp.real(seg)
        return anp.reshape(seg, shape)

    return build(struct)


def torch_backprop(config) -> bool:
    """Whether a call is backprop under the torch interface (its results are torch tensors,
    a tape without parameters' too, as on PennyLane's default devices)."""
    from pennylane.math import Interface
    return config is not None and config.interface == Interface.TORCH and \
        config.gradient_method == "backprop"


def torch_tape(tape) -> bool:
    """Whether a tape has torch parameters (its results are torch tensors, with or without
    gradients, as on PennyLane's default devices)."""
    return any(isinstance(p, torch.Tensor) for p in tape.get_parameters(trainable_only=False))


def to_user(t: torch.Tensor, keep: bool = False):
    """Numpy for results outside torch (a scalar as a NumPy scalar, as default.qubit returns
    it), the tensor itself inside autograd (backprop) or for a tape with torch parameters
    (``keep``)."""
    if t.requires_grad or keep:
        return t
    a = t.detach().cpu().numpy()
    return a[()] if a.ndim == 0 else a
