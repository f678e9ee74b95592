"""The torch bridge: one ``torch.autograd.Function`` that carries any backend into autograd,
and :func:`execute`, the entry a qnode call takes (rule from :mod:`qdiff.rules`; backprop runs
the backend under torch autograd, every other rule goes through the Function).

Forward runs all ``B`` bindings in one backend call. Backward makes ONE more backend call:

* ``adjoint``: a reverse sweep over the saved final states (:mod:`qdiff.backends.statevector.adjoint`);
* ``parameter-shift`` / ``finite-diff`` / ``spsa``: every shifted binding of every trainable
  parameter, for the whole batch, stacked into one ``theta`` of ``S * B`` rows.

The shifted evaluations go through this same Function, so the parameter-shift backward is
itself differentiable: ``create_graph=True`` gives exact second derivatives (shift-of-shift).
Methods whose second derivative would not be exact raise a ``QdiffError`` instead of returning
a silent zero.

>>> import torch, qdiff as qd
>>> dev = qd.device("statevector", wires=1)
>>> @qd.qnode(dev, diff_method="parameter-shift")
... def f(x):
...     qd.RX(x, wires=0); return qd.expval(qd.Z(0))
>>> x = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
>>> (g,) = torch.autograd.grad(f(x), x, create_graph=True)
>>> (h,) = torch.autograd.grad(g, x)
>>> round(float(g + torch.sin(x)), 12), round(float(h + torch.cos(x)), 12)
(0.0, 0.0)
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import torch
import torch.autograd.forward_ad as _forward_ad

from qdiff.backends.base import DEVICE_SHOTS, Backend, Job, check_shots
from qdiff.circuits.circuit import Circuit, memo, unitary_ops
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.measurements import Measurement
from qdiff.circuits import caches, memory
from qdiff.circuits.observables import Factor, Hermitian, Observable
from qdiff.circuits.operation import ParamRef, is_concrete
from qdiff.rules import (BACKPROP, FINITE_DIFF, PARAMETER_SHIFT, SHOT_FD_STEP, Options, Rule,
                         call_shots, default_step, has_shiftless_trainables, higher_order,
                         make_options, needs_backprop, resolve, trainable_matrix_op)
from qdiff.shift_rules import shift_rule

DIFFERENTIABLE_KINDS = ("expval", "var", "probs")


@dataclass(frozen=True, eq=False)
class Plan:
    """Everything the Function needs besides ``theta`` (not a tensor: passed through).

    ``rule``: the differentiation rule; ``higher``: the rule a second derivative switches to
    (``None``: the rule's own ``second_order`` applies); ``shared``: per column, one value
    broadcast over the batch by construction (see :class:`~qdiff.backends.base.Job`).
    """

    circuit: Circuit
    backend: Any
    rule: Rule
    trainable: tuple
    initial_state: Optional[torch.Tensor] = None
    options: Options = field(default_factory=Options)
    shared: Optional[tuple] = None
    higher: Optional[Rule] = None
    shots: Any = DEVICE_SHOTS

    def job(self, theta: torch.Tensor, keep: bool = False) -> Job:
        return Job(self.circuit, theta, self.initial_state, shots=self.shots, flat=True,
                   keep=keep, trainable=self.trainable, shared=self.shared)


def output_width(m: Measurement, n: int) -> int:
    if m.kind in ("expval", "var"):
        return 1
    if m.kind == "probs":
        return 2 ** (n if m.wires is None else len(m.wires))
    raise QdiffError(f"{m.kind}() outputs are not differentiable; return expval, var or probs")


# ------------------------------------------------------------------------------------------
# preparation: one theta column per angle use, expanded Hamiltonian coefficients


def unshare(circuit: Circuit, theta: torch.Tensor, trainable, shared=None) -> tuple:
    """Give every ``ParamRef`` use its own column with scale 1 (chain rule done by torch).
    Returns the circuit, theta, trainable flags and (when given) shared flags per new column."""
    new, idx, scale, offset = memo(circuit, "unshare", lambda: _unshare_plan(circuit))
    if idx is None:
        return circuit, theta, tuple(trainable), shared
    src = torch.tensor(idx, dtype=torch.long, device=theta.device)
    theta_u = theta[:, src]
    if scale is not None:
        theta_u = theta_u * torch.tensor(scale, dtype=theta.dtype, device=theta.device) + \
            torch.tensor(offset, dtype=theta.dtype, device=theta.device)
    return new, theta_u, tuple(trainable[i] for i in idx), \
        None if shared is None else tuple(shared[i] for i in idx)


def _unshare_plan(circuit: Circuit) -> tuple:
    """``(circuit, column of each use or None when already one use per column, scales,
    offsets)``; scales/offsets are ``None`` when all uses are plain."""
    uses = [(i, j, p) for i, op in enumerate(circuit.operations) for j, p in enumerate(op.params)
            if isinstance(p, ParamRef)]
    idx = [p.index for _, _, p in uses]
    plain = all(p.scale == 1.0 and p.offset == 0.0 for _, _, p in uses)
    if idx == list(range(len(idx))) and plain and len(idx) == circuit.num_params:
        return circuit, None, None, None
    ops = [list(op.params) for op in circuit.operations]
    for new, (i, j, _) in enumerate(uses):
        ops[i][j] = ParamRef(new)
    new_ops = tuple(op.with_params(ps) for op, ps in zip(circuit.operations, ops))
    new = Circuit(circuit.num_wires, new_ops, circuit.measurements, len(uses), circuit.wire_labels)
    if plain:
        return new, idx, None, None
    return new, idx, [p.scale for _, _, p in uses], [p.offset for _, _, p in uses]


def expand_coefficients(circuit: Circuit) -> tuple:
    """Split expvals of observables with trainable coefficients into one output per term.

    Returns the new circuit and, per original measurement, ``(start, width, coeffs or None)``.
    """
    if not any(m.obs is not None and _variable(m.obs.coeffs) for m in circuit.measurements):
        return memo(circuit, "expand", lambda: _expand_coefficients(circuit))
    return _expand_coefficients(circuit)


def _variable(coeffs: torch.Tensor) -> bool:
    """Whether observable coefficients may carry a derivative: they require grad, or an outer
    torch.func level wraps them (an outer jacfwd's tangent shows no sign at the inner level):
    either way they multiply the terms' outputs in torch, outside the Function."""
    return coeffs.requires_grad or _is_wrapped(coeffs)


def _expand_coefficients(circuit: Circuit) -> tuple:
    ms, post, col = [], [], 0
    n = circuit.num_wires
    for m in circuit.measurements:
        if m.kind == "expval" and _variable(m.obs.coeffs) and len(m.obs.terms) > 0:
            for t in m.obs.terms:
                ms.append(Measurement("expval", Observable([1.0], [t], simplify=False)))
            post.append((col, len(m.obs.terms), m.obs.real_coeffs()))
            col += len(m.obs.terms)
        else:
            if m.kind not in DIFFERENTIABLE_KINDS:
                output_width(m, n)  # raises with a clear message
            if m.obs is not None and m.obs.coeffs.requires_grad:
                raise QdiffError(f"{m.kind}() of an observable with trainable coefficients is only "
                                 "differentiable with diff_method='backprop'")
            ms.append(m)
            post.append((col, output_width(m, n), None))
            col += output_width(m, n)
    if all(c is None for _, _, c in post):
        return circuit.with_measurements(ms) if ms != list(circuit.measurements) else circuit, post
    return circuit.with_measurements(ms), post


# ------------------------------------------------------------------------------------------
# the Function


def _run(plan: Plan, theta: torch.Tensor):
    """Flattened real outputs ``(B, K)`` and the engine's residual (rules that keep one)."""
    res = plan.backend.execute([plan.job(theta, keep=plan.rule.keep)])[0]
    flat = res.outputs
    return flat.to(theta.dtype if theta.dtype.is_floating_point else flat.dtype), res.residual


def refuse_float16_overflow(out, who: str) -> None:
    """Outputs take float16 when the angles are float16 (computed in the device's precision,
    then cast): a value beyond float16's range (65504) would become inf, which no later
    layer or loss can tell from a diverged model. Raises a ``QdiffError`` naming ``who``
    instead; ``out`` is a tensor or a list/tuple of them (other entries, such as counts
    dicts, are skipped; so are tensors inside torch.func transforms, whose values Python
    cannot read)."""
    items = out if isinstance(out, (list, tuple)) else [out]
    for t in items:
        if isinstance(t, torch.Tensor) and t.dtype is torch.float16 and is_concrete(t) and \
                not bool(torch.isfinite(t).all()):
            raise QdiffError(f"{who}: an output exceeds the range of float16 (largest "
                             f"{torch.finfo(torch.float16).max:g}), the dtype of its float16 "
                             "inputs; give float32 inputs (x.float()) or scale the observable")


def deferred_backend(device, circuit, cache: dict):
    """``device``, or for a circuit with mid-circuit measurements (extra wires after the
    device's) a copy of it with those wires, kept in ``cache`` per width, drawing its shots
    from the device's random stream."""
    extra = circuit.num_wires - device.num_wires
    if extra <= 0:
        return device
    if not device.capabilities.backprop:
        raise QdiffError(f"mid-circuit measurements are simulated by deferred measurement "
                         f"(one extra wire each) on qdiff's torch engine; device "
                         f"'{device.name}' has a fixed register: use "
                         f"qd.device(\"statevector\", ...)")
    noise = getattr(device, "noise", None)
    if noise is not None:
        raise QdiffError(f"mid-circuit measurements on a noisy device (noise model "
                         f"'{noise.name}') are not simulated: deferred measurement adds "
                         "wires and gates that the noise model would treat as device "
                         "qubits and gates; measure at the end of the circuit")
    if extra not in cache:
        import copy
        dev = copy.copy(device)
        dev.wires = tuple(device.wires) + tuple(circuit.labels[device.num_wires:])
        if callable(getattr(device, "generator", None)):
            # shots drawn from the device's own stream: a copy making its generator anew
            # from the seed would repeat the draws of every other qnode on the device
            dev.generator = device.generator
        cache[extra] = dev
    return cache[extra]


def check_device(device, who: str = "qnode") -> None:
    """A qdiff device (a Backend, or an object speaking its protocol); a PennyLane or Qiskit
    device, or anything else, is a QdiffError naming the way to use it."""
    if isinstance(device, Backend):
        return
    mod = type(device).__module__ or ""
    foreign = mod.startswith(("pennylane", "qiskit"))
    if not foreign and all(hasattr(device, a) for a in ("execute", "capabilities", "num_wires")):
        return  # an object speaking the Backend protocol (e.g. a wrapper around a device)
    if mod.startswith("pennylane"):
        name = getattr(device, "name", "default.qubit")
        hint = (f"wrap it as qd.device(\"pennylane\", name=\"{name}\", wires=...), or keep "
                f"qml.qnode and use qml.device(\"qdiff.statevector\", wires=...)")
    elif mod.startswith(("qiskit", "qiskit_aer", "qiskit_ibm_runtime")):
        hint = "use qd.device(\"aer\", ...) or qd.device(\"ibm\", backend=..., ...)"
    else:
        hint = "use qd.device(\"statevector\", wires=n) or another qd.device(...)"
    raise QdiffError(f"{who}: device must be a qdiff device (qd.device(...)); got "
                     f"{type(device).__name__} from {mod or 'builtins'}: {hint}")


EAGER_REASON = ("a qdiff qnode call records its circuit in Python at each call and stays eager "
                "under torch.compile (a graph break): torch.compile(fullgraph=True) cannot "
                "include it; compile without fullgraph")


def eager_under_compile(fn):
    """``fn`` wrapped in ``torch.compiler.disable``, with the reason torch shows where a graph
    break is an error (``fullgraph=True``) where this torch takes one."""
    try:
        return torch.compiler.disable(fn, reason=EAGER_REASON)
    except TypeError:  # a torch without disable(reason=...)
        return torch.compiler.disable(fn)


def module_reference(obj, kind: str) -> tuple:
    """``(module, name)`` under which ``obj`` can be imported back: its ``__qualname__`` in its
    ``__module__``, else a module-level name bound to it (``fast = qd.jit(circuit)``)."""
    import sys
    mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    module = sys.modules.get(mod)
    found = module
    for part in qual.split("."):
        found = getattr(found, part, None)
    if found is obj:
        return mod, qual
    for name, value in list(vars(module).items()) if module is not None else ():
        if value is obj:
            return mod, name
    raise QdiffError(f"cannot pickle {kind} '{qual}': it is not reachable as {mod}.{qual} nor "
                     f"under another name in module {mod} (define it at module level)")


def refuse_batched_cotangent(g_out, rule) -> None:
    """A rule's backward takes one cotangent: torch.autograd's batched cotangents (a legacy
    batched tensor, without storage) are refused by name."""
    if torch._C._functorch.is_legacy_batchedtensor(g_out):
        raise QdiffError(f"diff_method='{rule.name}' does not run under torch.autograd's "
                         "batched cotangents (torch.autograd.functional.jacobian/hessian "
                         "with vectorize=True, grad(is_grads_batched=True)); use "
                         "torch.func.jacrev/jacfwd/hessian or vectorize=False")


_transforms_active = torch._C._are_functorch_transforms_active


def autocast_probe(device_type: str):
    """A function of no arguments telling whether ``torch.autocast`` is on for
    ``device_type`` ("cpu" or "cuda"): ``torch.is_autocast_enabled(device_type)``, or on a
    torch before 2.4 (whose ``is_autocast_enabled()`` takes no argument and answers for CUDA)
    ``torch.is_autocast_cpu_enabled`` / ``torch.is_autocast_enabled``."""
    try:
        torch.is_autocast_enabled(device_type)
    except TypeError:
        return torch.is_autocast_cpu_enabled if device_type == "cpu" else \
            torch.is_autocast_enabled
    return functools.partial(torch.is_autocast_enabled, device_type)


autocast_cpu_enabled = autocast_probe("cpu")
autocast_cuda_enabled = autocast_probe("cuda")


def exact_precision(fn):
    """``fn`` run with torch's autocast off: under ``torch.autocast`` the engine still computes
    in the device's precision (autocast would run its float32 products in bfloat16/float16)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        cpu, cuda = autocast_cpu_enabled(), autocast_cuda_enabled()
        if not (cpu or cuda):
            return fn(*args, **kwargs)
        with contextlib.ExitStack() as stack:
            if cpu:
                stack.enter_context(torch.autocast("cpu", enabled=False))
            if cuda:
                stack.enter_context(torch.autocast("cuda", enabled=False))
            return fn(*args, **kwargs)
    return wrapper


class FirstOrderOnly(torch.autograd.Function):
    """Identity on a computed gradient whose own derivative is not available: differentiating
    through it raises a clear error instead of returning a silent zero."""

    generate_vmap_rule = True

    @staticmethod
    def forward(grad, theta, g_out, method):
        return grad.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.method = inputs[3]

    @staticmethod
    def backward(ctx, _):
        raise QdiffError(f"second derivatives are not available with diff_method='{ctx.method}' "
                         "(nor torch.autograd.functional.jvp/hvp, which differentiate the "
                         "gradient: use torch.func.jvp); use 'parameter-shift' or 'backprop' "
                         "for Hessians")

    @staticmethod
    def jvp(ctx, *_):
        raise QdiffError(f"second derivatives are not available with diff_method='{ctx.method}' "
                         "(forward mode over its derivative); use 'parameter-shift' or "
                         "'backprop' for Hessians")


class QuantumFunction(torch.autograd.Function):
    """``theta (B, P) -> outputs (B, K)``; backward by the plan's rule in one backend call.

    The second output is the engine's residual (an opaque object, or ``None``): it is kept on
    the autograd context and handed back to the backend's ``vjp``. Forward mode (``jvp``, so
    ``torch.func.jacfwd`` and ``torch.func.hessian``) contracts the rule's Jacobian with the
    tangent: shift rules evaluate the same shifted bindings as the backward (exact, and itself
    differentiable for parameter-shift); the engine's reverse mode gives the Jacobian from one
    VJP per output column.
    """

    @staticmethod
    def forward(theta, plan):
        return _run(plan, theta.detach())

    @staticmethod
    def setup_context(ctx, inputs, output):
        theta, plan = inputs
        ctx.plan = plan
        ctx.residual = output[1]
        ctx.out_dtype, ctx.out_device = output[0].dtype, output[0].device
        ctx.save_for_backward(theta)
        ctx.save_for_forward(theta)

    @staticmethod
    @exact_precision
    def backward(ctx, g_out, _g_residual):
        (theta,) = ctx.saved_tensors
        plan = ctx.plan
        refuse_batched_cotangent(g_out, plan.rule)
        if plan.rule.keep:
            grad = engine_vjp(theta, g_out, plan, ctx.residual)
        else:
            grad = shift_vjp(theta, g_out, plan)
        # (a device placed elsewhere, qd.device(..., device="cuda"), runs CPU angles there)
        return grad.to(device=theta.device, dtype=theta.dtype), None

    @staticmethod
    @exact_precision
    def jvp(ctx, theta_t, _plan_t):
        (theta,) = ctx.saved_tensors
        plan = ctx.plan
        if plan.rule.keep:
            out_t = engine_jvp(theta, theta_t, plan)
        else:
            out_t = shift_jvp(theta, theta_t, plan)
        return out_t.to(device=ctx.out_device, dtype=ctx.out_dtype), None

    @staticmethod
    def vmap(info, in_dims, theta, plan):
        """Fold a vmapped dimension into the binding batch: the backend is batched already."""
        d = in_dims[0]
        if d is None:
            return QuantumFunction.apply(theta, plan), (None, None)
        t = theta.movedim(d, 0)
        v, b = t.shape[0], t.shape[1]
        flat, residual = QuantumFunction.apply(t.reshape(v * b, -1), _batched_plan(plan, v))
        return (flat.reshape(v, b, -1), residual), (0, None)


def engine_vjp(theta, g_out, plan: Plan, residual):
    """The backend's own reverse mode; under ``create_graph`` the plan's higher-order rule
    (exact shift rules) instead, or a gradient whose further derivative raises."""
    if torch.is_grad_enabled() and plan.higher is not None and _has_shift_rules(plan):
        return shift_vjp(theta, g_out, replace(plan, rule=plan.higher, shared=None, higher=None))
    if torch.is_grad_enabled() and plan.higher is not None and theta.requires_grad and \
            plan.backend.capabilities.backprop and is_concrete(theta):
        # a trainable parameter without a shift rule (a channel's): the exact derivative by
        # backprop through the engine's own simulation, itself differentiable
        flat = plan.backend.execute([plan.job(theta)])[0].outputs
        (grad,) = torch.autograd.grad(flat, theta, g_out.to(flat.dtype), create_graph=True,
                                      allow_unused=True)
        return torch.zeros_like(theta) if grad is None else grad
    if not (is_concrete(theta) and is_concrete(g_out)):
        if not plan.backend.capabilities.backprop and _has_shift_rules(plan):
            # a device outside torch (a PennyLane device's adjoint) reads plain values: under
            # torch.func transforms the exact shift rules run through this Function instead,
            # with the second-order behaviour of the device's own reverse mode
            sub = replace(plan, rule=PARAMETER_SHIFT, shared=None, higher=None)
            if not torch.is_grad_enabled():
                return shift_vjp(theta, g_out, sub)
            return _first_order_only(lambda: shift_vjp(theta, g_out, sub), theta, g_out,
                                     plan.rule.name)
        # inside torch.func transforms the residual belongs to the folded batch of the vmap
        # rule, not to the batched view seen here: the engine runs its own forward instead
        residual = None
    with torch.no_grad():
        grad = plan.backend.vjp([plan.job(theta.detach())], [g_out.detach()], [residual])[0]
    if torch.is_grad_enabled():  # create_graph: a further derivative must fail loudly
        grad = FirstOrderOnly.apply(grad, theta, g_out, plan.rule.name)
    return grad


def _first_order_only(compute, theta, other, method: str):
    """``compute()`` run without a graph, as a value whose further derivative raises
    (:class:`FirstOrderOnly`)."""
    with torch.no_grad():
        out = compute()
    return FirstOrderOnly.apply(out, theta, other, method)


def _num_outputs(plan: Plan) -> int:
    return sum(output_width(m, plan.circuit.num_wires) for m in plan.circuit.measurements)


def engine_jvp(theta, theta_t, plan: Plan):
    """``(B, K)`` Jacobian-vector product for the engine's rule (exact either way): by the
    exact shift rules where every trainable gate has one (evaluated through this Function,
    which keeps torch.func's levels consistent), else from the backend's reverse mode, one VJP
    per output column in one call. A further derivative follows the backward's behaviour: the
    plan's higher-order rule when it has one, else it raises."""
    if _has_shift_rules(plan):
        sub = replace(plan, rule=plan.higher or PARAMETER_SHIFT, shared=None, higher=None)
        if plan.higher is not None or not torch.is_grad_enabled():
            return shift_jvp(theta, theta_t, sub)
        return _first_order_only(lambda: shift_jvp(theta, theta_t, sub), theta, theta_t,
                                 plan.rule.name)
    b, p = theta.shape
    k = _num_outputs(plan)
    memory.require(theta.element_size() * (k * b * (p + k) + k * k),
                   f"the forward-mode Jacobian of {k} outputs x {b} bindings by one reverse "
                   "sweep per output (repeated bindings and unit cotangents)", theta.device,
                   hint="fewer outputs (probs of fewer wires) or reverse mode")
    with torch.no_grad():
        rows = theta.detach().repeat(k, 1)  # (K * B, P): binding b for output column j
        eye = torch.eye(k, dtype=rows.dtype, device=rows.device)
        cot = eye.repeat_interleave(b, dim=0)  # row j * B + b: unit cotangent on column j
        grad = plan.backend.vjp([_batched_plan(plan, k).job(rows)], [cot], [None])[0]
        jac = grad.reshape(k, b, p).to(device=theta_t.device, dtype=theta_t.dtype)
    out_t = _contract_tangent(jac.permute(2, 1, 0), theta_t)
    if torch.is_grad_enabled():  # a further derivative must fail loudly
        out_t = FirstOrderOnly.apply(out_t, theta, theta_t, plan.rule.name)
    return out_t


def _batched_plan(plan: Plan, v: int) -> Plan:
    """The plan for ``v`` vmapped copies of the batch (a shared column now varies over them)."""
    if plan.initial_state is None:
        return replace(plan, shared=None)
    return replace(plan, initial_state=_active(plan.initial_state).repeat(v, 1), shared=None)


def _active(t: torch.Tensor) -> torch.Tensor:
    """``t`` without the ``torch.func`` grad/jvp wrappers of levels above the active one: a
    rule's ``jvp`` runs below the level that recorded the call's state (``hessian`` =
    ``jacfwd(jacrev)``), where those wrappers cannot be used (and carry nothing: a state
    that requires grad at its level is refused for the rules)."""
    f = torch._C._functorch
    level = f.maybe_current_level()
    while f.is_functorch_wrapped_tensor(t) and not f.is_batchedtensor(t) and (
            level is None or f.maybe_get_level(t) > level):
        t = f.get_unwrapped(t)
    return t


# ------------------------------------------------------------------------------------------
# shift-based VJPs (parameter-shift, finite differences, SPSA)


def _has_shift_rules(plan: Plan) -> bool:
    try:
        validate_rules(replace(plan, rule=PARAMETER_SHIFT))
    except QdiffError:
        return False
    return True


def validate_rules(plan: Plan) -> None:
    """Fail in the forward pass (not mid-backward) when a trainable gate has no shift rule."""
    if plan.rule is not PARAMETER_SHIFT:
        return
    for op in plan.circuit.operations:
        for s, par in enumerate(op.params):
            if isinstance(par, ParamRef) and plan.trainable[par.index]:
                shift_rule(op.gate, s)


def _constant(t):
    """``t`` without the torch.func wrappers of the call that made it (``torch.func.grad`` /
    ``jvp`` levels; a vmapped value is kept): a variance's observable is a constant of the
    call (trainable coefficients are refused), but one made inside a transform is wrapped at
    that transform's level, which has ended when an outer ``jacfwd`` runs the rule."""
    f = torch._C._functorch
    while isinstance(t, torch.Tensor) and f.is_functorch_wrapped_tensor(t) and \
            not f.is_batchedtensor(t):
        t = f.get_unwrapped(t)
    return t


def _squared(obs: Observable) -> Observable:
    """``O @ O`` of a variance's observable, built from plain constants: term by term, or as
    one dense matrix on its wires when two factors overlap in part (a Hermitian on [0, 1]
    and a Z on 0), which have no factor-wise product."""
    terms = [tuple(f if f.matrix is None else Factor(f.wires, f.kind, _constant(f.matrix))
                   for f in t) for t in obs.terms]
    plain = Observable(_constant(obs.coeffs), terms, simplify=False, check=False)
    wire_sets = {frozenset(f.wires) for t in terms for f in t}
    with caches.constants():
        if all(a == b or not a & b for a in wire_sets for b in wire_sets):
            return plain @ plain
        wires = list(plain.wires)
        m = plain.matrix(wires)
        m = m @ m
        return Hermitian((m + m.conj().T) / 2, wires)  # Hermitian to rounding as well


def _shift_measurements(circuit: Circuit) -> tuple:
    """Measurements evaluated at shifted points: var(O) -> expval(O^2), expval(O). The
    layout gives each original measurement's first output column among the shifted ones."""
    ms, layout, col = [], [], 0
    for m in circuit.measurements:
        if m.kind == "var":
            layout.append(("var", col))
            ms.append(Measurement("expval", _squared(m.obs)))
            ms.append(Measurement("expval", m.obs))
            col += 2
        else:
            w = output_width(m, circuit.num_wires)
            layout.append(("lin", col, w))
            ms.append(m)
            col += w
    return circuit.with_measurements(ms), layout


def shift_vjp(theta: torch.Tensor, g_out: torch.Tensor, plan: Plan) -> torch.Tensor:
    """``(B, P)`` VJP from ONE backend call over all shifted bindings of the batch (the
    shifts and weights are the rule's, :mod:`qdiff.rules`)."""
    if torch.is_grad_enabled() and plan.rule.second_order != "exact":
        return _first_order_only(lambda: shift_vjp(theta, g_out, plan), theta, g_out,
                                 plan.rule.name)
    jac_out = shift_jacobian(theta, plan)
    if jac_out is None:
        return torch.zeros_like(theta)
    return torch.einsum("pbk,bk->bp", jac_out, g_out.to(jac_out.dtype))


def shift_jvp(theta: torch.Tensor, theta_t: torch.Tensor, plan: Plan) -> torch.Tensor:
    """``(B, K)`` Jacobian-vector product from the same shifted bindings as :func:`shift_vjp`
    (differentiable again for exact rules)."""
    if torch.is_grad_enabled() and plan.rule.second_order != "exact":
        return _first_order_only(lambda: shift_jvp(theta, theta_t, plan), theta, theta_t,
                                 plan.rule.name)
    jac_out = shift_jacobian(theta, plan)
    if jac_out is None:
        return theta_t.new_zeros(theta.shape[0], _num_outputs(plan))
    return _contract_tangent(jac_out, theta_t.to(device=jac_out.device, dtype=jac_out.dtype))


def _contract_tangent(jac: torch.Tensor, theta_t: torch.Tensor) -> torch.Tensor:
    """``(B, K)`` product of the Jacobian ``(P, B, K)`` with the tangent ``(B, P)``, in ops
    that torch.autograd's batched tangents also run (``jacobian(..., strategy="forward-mode",
    vectorize=True)``; einsum has no batching rule there)."""
    return (jac.permute(1, 2, 0) * theta_t.unsqueeze(1)).sum(-1)


def compute_precision(backend) -> torch.dtype:
    """The real dtype a backend computes in: float32 for a complex64 torch simulator, else
    float64."""
    return torch.float32 if getattr(backend, "cdtype", None) == torch.complex64 else \
        torch.float64


def shift_jacobian(theta: torch.Tensor, plan: Plan) -> Optional[torch.Tensor]:
    """``(P, B, K)`` Jacobian of the plan's outputs by its shift rule, from ONE backend call
    over all shifted bindings; ``None`` when nothing is trainable.

    The shifted bindings are formed, and the results combined, in the backend's precision
    when it exceeds theta's (float32 inputs on a complex128 device are differenced in
    float64; the gradient is cast back at the end); finite differences without a given step
    take :func:`qdiff.rules.default_step` of the precision the backend computes in."""
    real = compute_precision(plan.backend)
    if theta.dtype.is_floating_point and torch.finfo(theta.dtype).eps > torch.finfo(real).eps:
        theta = theta.to(real)
    options = plan.options
    if plan.rule is FINITE_DIFF and options["h"] is None:
        sampled = call_shots(plan.backend, plan.shots) or plan.backend.capabilities.stochastic
        step = SHOT_FD_STEP if sampled else default_step(real)
        options = replace(options, values=dict(options.values, h=step))
    b, p = theta.shape
    shifts, weights = plan.rule.shifts(plan.circuit, plan.trainable, theta, options)
    shift_circ, layout = _shift_measurements(plan.circuit)
    has_var = any(kind == "var" for kind, *_ in layout)
    if has_var:  # the unshifted point supplies <O> for the variance chain rule
        shifts = torch.cat([shifts, torch.zeros(1, p, dtype=shifts.dtype, device=shifts.device)])
        weights = torch.cat([weights, torch.zeros(1, p, dtype=weights.dtype, device=weights.device)])
    s = shifts.shape[0]
    if s == 0:
        return None
    thetas = (theta.unsqueeze(0) + shifts.unsqueeze(1)).reshape(s * b, p)
    sub = replace(plan, circuit=shift_circ, initial_state=None if plan.initial_state is None
                  else _active(plan.initial_state).repeat(s, 1))
    res = QuantumFunction.apply(thetas, sub)[0].reshape(s, b, -1)
    # d(outputs)/d theta_j for the shifted-measurement columns: (P, B, K')
    jac = torch.einsum("sp,sbk->pbk", weights.to(device=res.device, dtype=res.dtype), res)
    cols = []
    for entry in layout:
        if entry[0] == "var":
            a = entry[1]
            mean = res[-1, :, a + 1]
            cols.append(jac[:, :, a] - 2 * mean.unsqueeze(0) * jac[:, :, a + 1])
        else:
            _, start, w = entry
            cols.extend(jac[:, :, start + i] for i in range(w))
    return torch.stack(cols, dim=-1)  # (P, B, K)


# ------------------------------------------------------------------------------------------
# entry points: a recorded call, with the rule from the table


def execute_with_rule(recorded, backend, rule: Rule, options: Optional[Options] = None,
                      higher: Optional[Rule] = None, stacked: bool = False,
                      shots=DEVICE_SHOTS):
    """Run ``recorded`` through the Function; one tensor per measurement, leading dim B (with
    ``stacked``, the ``(B, K)`` outputs as one tensor when every measurement is a plain scalar:
    no per-column slicing and restacking in the autograd graph)."""
    circuit = recorded.circuit
    if recorded.initial_state is not None and recorded.initial_state.requires_grad:
        raise QdiffError(f"state preparation inputs are only differentiable with "
                         f"diff_method='backprop' (got '{rule.name}')")
    for m in circuit.measurements:
        if m.obs is not None and m.obs.has_trainable_matrix and torch.is_grad_enabled():
            raise QdiffError(f"{m.kind}() of an observable with a trainable matrix (Hermitian) is "
                             f"only differentiable with diff_method='backprop' (got '{rule.name}')")
    if rule is not BACKPROP:
        name = trainable_matrix_op(circuit)
        if name is not None:
            raise QdiffError(f"{name}: a gate matrix that requires grad is only differentiable "
                             f"with diff_method='backprop' (got '{rule.name}')")
    circ_u, theta_u, train_u, shared_u = unshare(circuit, recorded.theta, recorded.trainable,
                                                  recorded.shared)
    circ_e, post = expand_coefficients(circ_u)
    if options is None:
        options = make_options(rule.name, {})
    plan = Plan(circ_e, backend, rule, train_u, recorded.initial_state, options, shared_u, higher,
                shots)
    validate_rules(plan)
    flat, _ = QuantumFunction.apply(theta_u, plan)
    if stacked and all(c is None and m.is_scalar for m, (_, _, c) in
                       zip(circuit.measurements, post)):
        return flat
    outs = []
    for m, (start, width, coeffs) in zip(circuit.measurements, post):
        block = flat[:, start:start + width]
        if coeffs is not None:
            outs.append(block @ coeffs.to(device=block.device, dtype=block.dtype))
        elif m.kind in ("expval", "var"):
            outs.append(block[:, 0])
        else:
            outs.append(block)
    return outs


def effective_shots(backend, shots=DEVICE_SHOTS):
    """The shots a call runs with: the backend's own (``"device"``), or ``None`` (exact) / a
    positive int, checked against what the backend can do."""
    if shots == DEVICE_SHOTS:
        return getattr(backend, "shots", None)
    shots = check_shots(shots)
    caps = backend.capabilities
    if shots is None and not caps.exact:
        raise QdiffError(f"shots=None: backend '{backend.name}' has no exact mode; give a "
                         "number of shots")
    if not caps.call_shots and shots != getattr(backend, "shots", None):
        raise QdiffError(f"shots={shots}: backend '{backend.name}' takes its shots from the "
                         f"device ({getattr(backend, 'shots', None)}); create the device with "
                         f"shots={shots} instead")
    if shots is not None and not caps.shots:
        why = (" (it samples noise by trajectories, whose count is its sampling: set "
               "trajectories=, or use the mixed engine for shots)" if caps.stochastic else "")
        raise QdiffError(f"shots={shots}: backend '{backend.name}' does not sample shots{why}")
    return shots


def refuse_graph_capture(kind: str, fn) -> None:
    """A qnode call records its circuit in Python each time: ``torch.jit.trace`` and
    ``torch.export`` would freeze one recording into a graph, so they are refused by name
    (``torch.compile`` keeps the call eager instead). ``kind`` and ``fn`` (the qnode's
    function, or None) name the call in the error."""
    if torch.jit.is_tracing():
        capture = "torch.jit.trace"
    elif getattr(torch.compiler, "is_exporting", bool)():  # torch >= 2.6 tells export apart
        capture = "torch.export"
    else:
        return
    what = kind if fn is None else f"{kind} '{getattr(fn, '__name__', '?')}'"
    raise QdiffError(f"{what}: {capture} cannot capture a qnode call (its circuit is recorded "
                     "in Python at each call); run the model eagerly or with torch.compile, "
                     "which keeps the qnode call eager")


@exact_precision
def execute(recorded, backend, diff_method: str = "best", stacked: bool = False,
            options: Options = None, shots=DEVICE_SHOTS):
    """One tensor per measurement of ``recorded.circuit``, each with leading dim ``B``; with
    ``stacked``, the gradient rules may return the ``(B, K)`` outputs of all-scalar
    measurements as one tensor instead (the caller checks). ``options``: the rule's validated
    options (:func:`qdiff.rules.make_options`; defaults when omitted). ``shots``: ``"device"``
    (the backend's setting), ``None`` (exact) or a number of shots for this call."""
    if getattr(getattr(backend, "noise", None), "native", None) is not None:
        from qdiff.noise import route_recorded
        recorded = route_recorded(recorded, backend)  # the gates the device would run
    circuit = recorded.circuit
    if circuit.num_wires != backend.num_wires:
        raise QdiffError(f"circuit has {circuit.num_wires} wires but the device has "
                         f"{backend.num_wires}")
    shots = effective_shots(backend, shots)
    rule = resolve(diff_method, backend, circuit, recorded, shots)
    theta = recorded.theta
    if theta.shape[0] == 0:  # an empty batch: nothing reaches the backend
        return empty_outputs(recorded, backend, shots)
    prep = recorded.initial_state
    needs_grad = torch.is_grad_enabled() and (theta.requires_grad or (
        prep is not None and prep.requires_grad) or
        trainable_matrix_op(circuit) is not None) and not all(
        m.kind in ("sample", "counts") for m in circuit.measurements)  # samples carry no gradient
    if (_forward_ad._current_level >= 0 or (
            (shots or not backend.capabilities.backprop) and not is_concrete(theta))) and not all(
            m.kind in ("sample", "counts") for m in circuit.measurements):
        tangents = _tangent_rule(recorded, backend, rule, shots)
        if tangents is not None:
            recorded, rule = tangents
            needs_grad = True
    if rule is not BACKPROP and needs_grad and _transforms_active():
        nested = _dual_leaves(recorded, _is_wrapped)
        if nested:  # an outer torch.func level may differentiate these constants of the rule
            out = _run_nested(recorded, backend, rule, diff_method, shots, nested[0])
            if out is not None:
                return out
        vmapped = _dual_leaves(recorded, _is_vmapped)
        if vmapped:  # one per vmapped binding: the Function's plan holds one constant
            return _run_vmapped(recorded, backend, rule, diff_method, shots, vmapped[0])
        if higher_order(diff_method, rule) is not None and _is_wrapped(theta) and \
                has_shiftless_trainables(circuit, recorded):
            # nested levels (torch.func.hessian) over a best adjoint whose gates lack the
            # shift rules its second derivative takes: the torch simulation carries them all
            return backend.run(circuit, theta, prep, shots=shots)
    if shots and torch.is_grad_enabled():
        _refuse_sampled_trainable_matrix(circuit)
    if rule is BACKPROP or not needs_grad:
        outs = backend.run(circuit, theta, prep, shots=shots)
        return _connected(outs, theta) if rule is BACKPROP and needs_grad else outs
    if options is None or diff_method == "best":
        options = make_options(rule.name, {})
    if any(m.kind in ("sample", "counts") for m in circuit.measurements):
        return _with_samples(recorded, backend, rule, options, higher_order(diff_method, rule),
                             shots)
    return execute_with_rule(recorded, backend, rule, options, higher_order(diff_method, rule),
                             stacked=stacked, shots=shots)


def _connected(outs, theta: torch.Tensor):
    """Backprop outputs that no angle reaches (every parameter of an imported circuit only in
    its global phase) joined to ``theta`` with a zero derivative, as the other rules give: a
    ``backward()`` then yields zero gradients instead of torch's "does not require grad"."""
    if not theta.requires_grad:
        return outs

    def join(t):
        if t.requires_grad or not (t.is_floating_point() or t.is_complex()):
            return t
        return t + (theta.sum() * 0).to(t.real.dtype if t.is_complex() else t.dtype)

    return join(outs) if isinstance(outs, torch.Tensor) else [join(t) for t in outs]


def _refuse_sampled_trainable_matrix(circuit) -> None:
    """With shots, an expval/var of a Hermitian whose matrix requires grad has no derivative
    to give: the samples, drawn in its eigenbasis, estimate its value (differentiating their
    eigenvalues would drop the state's coherences in that basis)."""
    for m in circuit.measurements:
        if m.kind in ("expval", "var") and m.obs.has_trainable_matrix:
            raise QdiffError(f"{m.kind}() with shots of an observable with a trainable matrix "
                             f"(Hermitian) is not differentiable: the samples estimate its value "
                             f"only; run exact (shots=None), or detach the matrix")


def _with_samples(recorded, backend, rule: Rule, options, higher, shots) -> list:
    """Samples or counts returned next to differentiated outputs (as PennyLane allows): every
    value comes from one run of the whole circuit, the values a call without gradients gives;
    the differentiated outputs carry the rule's derivatives, from the rule's own run of those
    outputs (whose values are not returned). Samples and counts carry no gradient."""
    circuit = recorded.circuit
    prep = recorded.initial_state
    with torch.no_grad():
        full = backend.run(circuit, recorded.theta.detach(),
                           None if prep is None else prep.detach(), shots=shots)
    keep = [i for i, m in enumerate(circuit.measurements) if m.kind not in ("sample", "counts")]
    sub = replace(recorded, circuit=circuit.with_measurements(
        tuple(circuit.measurements[i] for i in keep)))
    ruled = execute_with_rule(sub, backend, rule, options, higher, shots=shots)
    out = list(full)
    for i, g in zip(keep, ruled):
        out[i] = full[i].to(device=g.device, dtype=g.dtype) + (g - g.detach())
    return out


def _run_nested(recorded, backend, rule: Rule, diff_method: str, shots, leaf: str):
    """A call under nested ``torch.func`` levels whose ``leaf`` (a state, an observable or a
    gate matrix) is computed inside them, so an outer level may differentiate it: the rules
    take it as a constant, the torch simulation carries every level's derivative exactly.
    With shots or on a device outside torch nothing carries it: refused where a reverse-mode
    level differentiates it (forward-mode levels show no sign of a tangent from outside them:
    such a leaf runs as a constant there, as documented)."""
    if shots or not backend.capabilities.backprop:
        if not _reverse_level_differentiates(recorded):
            return None
        where = "with shots" if shots else f"on {type(backend).__name__}"
        raise QdiffError(f"nested torch.func transforms over a call whose {leaf} is computed "
                         f"inside them: an outer level differentiates it, which the "
                         f"'{rule.name}' rules {where} take as a constant; build it outside "
                         "the transformed function, or run exact (shots=None) on a torch "
                         "device")
    if rule.second_order != "exact" and higher_order(diff_method, rule) is None:
        raise QdiffError(f"second derivatives are not available with diff_method='{rule.name}' "
                         f"(nested torch.func transforms over a call whose {leaf} is computed "
                         "inside them); use 'parameter-shift' or 'backprop' for Hessians")
    return backend.run(recorded.circuit, recorded.theta, recorded.initial_state, shots=shots)


def _run_vmapped(recorded, backend, rule: Rule, diff_method: str, shots, leaf: str):
    """A differentiated call under ``torch.func.vmap`` whose ``leaf`` (a state, an observable
    or a gate matrix) differs from one vmapped binding to the next: the Function's vmap rule
    folds vmapped angles into its batch, but its plan holds that leaf as one constant. The
    torch simulation carries every level exactly (second derivatives still raise for the
    first-order rules); with shots or on a device outside torch it is refused by name."""
    if shots or not backend.capabilities.backprop:
        where = "with shots" if shots else f"on {type(backend).__name__}"
        raise QdiffError(f"torch.func.vmap over the {leaf} of a call differentiated by the "
                         f"'{rule.name}' rules {where}: they take it as one constant, not one "
                         "per vmapped binding; build it outside vmap (or loop over its "
                         "values), or run exact (shots=None) on a torch device")
    if _is_wrapped(recorded.theta) and rule.second_order != "exact" and \
            higher_order(diff_method, rule) is None:
        raise QdiffError(f"second derivatives are not available with diff_method='{rule.name}' "
                         f"(nested torch.func transforms under vmap over the {leaf}); use "
                         "'parameter-shift' or 'backprop' for Hessians")
    return backend.run(recorded.circuit, recorded.theta, recorded.initial_state, shots=shots)


def _reverse_level_differentiates(recorded) -> bool:
    """Whether a ``torch.func`` reverse-mode (grad) level records a derivative of a state,
    observable or gate matrix of the call: its unwrapped value requires grad there, or its
    wrapper at a grad level outside the innermost one does (``jacrev(jacfwd(f, 0), 1)``,
    whose inner jvp level lifts the outer level's input)."""
    from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters
    f = torch._C._functorch
    grad_levels = {i.level() for i in retrieve_all_functorch_interpreters()
                   if i.key().name == "Grad"}
    current = f.maybe_current_level()

    def differentiated(t) -> bool:
        while isinstance(t, torch.Tensor) and f.is_functorch_wrapped_tensor(t):
            u = f.get_unwrapped(t)
            level = f.maybe_get_level(t)
            if level in grad_levels and (u.requires_grad or (
                    current is not None and level < current and t.requires_grad)):
                return True
            t = u
        return False
    return bool(_dual_leaves(recorded, differentiated))


def _tangent_rule(recorded, backend, rule: Rule, shots=None) -> Optional[tuple]:
    """``(recorded, rule)`` for a call whose angles may carry forward-mode tangents the
    backend's own run would drop: dual tensors of ``torch.autograd.forward_ad`` (the native
    kernels and non-torch backends read plain values), or ``torch.func`` wrapped tensors on a
    backend that is not simulated in torch or that samples ``shots`` (a sampled estimate
    carries no tangent, and vmap refuses the sampling). Such a call goes through the
    Function, whose ``jvp`` and ``vmap`` rules carry them, with every column trainable (which
    ones carry a tangent is not visible); a ``backprop`` call takes the exact parameter-shift
    rules there.
    ``None``: nothing to carry (no dual tensor)."""
    theta = recorded.theta
    where = _dual_leaves(recorded)
    if where and (shots or not backend.capabilities.backprop):
        place = "with shots" if shots else f"on backend '{backend.name}'"
        raise QdiffError(f"forward mode (torch.func.jvp/jacfwd, torch.autograd.forward_ad): a "
                         f"tangent on the {where[0]} is not carried {place}, whose rules take "
                         "it as a constant; differentiate it in reverse mode "
                         "(torch.func.jacrev/grad, backward()), or run exact (shots=None) on "
                         "a torch device")
    if not is_concrete(theta):
        if backend.capabilities.backprop and not shots:  # torch.func runs through the torch
            return None                                  # simulation
    else:
        if where:
            raise QdiffError(f"torch.autograd.forward_ad: a tangent on the {where[0]} is not "
                             "carried through the circuit (only gate angles carry tangents); "
                             "use torch.func.jvp / torch.func.jacfwd, or reverse mode")
        if _forward_ad.unpack_dual(theta).tangent is None:
            return None
    if rule is BACKPROP:
        if needs_backprop(recorded.circuit, recorded) or not _has_shift_rules(
                Plan(recorded.circuit, backend, PARAMETER_SHIFT, (True,) * theta.shape[1])):
            raise QdiffError("torch.autograd.forward_ad: forward-mode tangents of this "
                             "diff_method='backprop' call are not carried (it needs "
                             "backprop, or a gate has no shift rule); use torch.func.jvp / "
                             "torch.func.jacfwd, or reverse mode")
        rule = PARAMETER_SHIFT
    return replace(recorded, trainable=(True,) * theta.shape[1]), rule


def _is_dual(t) -> bool:
    return isinstance(t, torch.Tensor) and _forward_ad.unpack_dual(t).tangent is not None


def _is_wrapped(t) -> bool:
    """Whether ``t`` is wrapped by an outer ``torch.func`` grad or jvp level besides the
    innermost one (vmap levels carry no derivative): such a level may differentiate it. A
    single grad or jvp wrapper counts when its level is below the innermost active one
    (``jacrev(jacfwd(f, 0), 1)``: the second argument is the outer level's input), not when
    it is that level's own (a constant made inside the innermost transform)."""
    if not isinstance(t, torch.Tensor):
        return False
    f, levels = torch._C._functorch, 0
    current = f.maybe_current_level()
    while f.is_functorch_wrapped_tensor(t):
        if not f.is_batchedtensor(t):
            levels += 1
            if levels > 1 or (current is not None and f.maybe_get_level(t) < current):
                return True
        t = f.get_unwrapped(t)
    return False


def _is_vmapped(t) -> bool:
    """Whether ``t`` is batched by a ``torch.func.vmap`` level (one value per vmapped
    binding) under any of its functorch wrappers."""
    if not isinstance(t, torch.Tensor):
        return False
    f = torch._C._functorch
    while f.is_functorch_wrapped_tensor(t):
        if f.is_batchedtensor(t):
            return True
        t = f.get_unwrapped(t)
    return False


def _dual_leaves(recorded, dual=_is_dual) -> list:
    """Names of the tensors besides the angles that carry a ``torch.autograd.forward_ad``
    tangent (state preparation, observable coefficients or matrices, gate matrices); with
    ``dual=_is_wrapped``, those that are ``torch.func`` wrapped tensors."""
    circuit = recorded.circuit
    out = ["state preparation"] if dual(recorded.initial_state) else []
    for m in circuit.measurements:
        if m.obs is not None and (dual(m.obs.coeffs) or any(
                dual(f.matrix) for t in m.obs.terms for f in t)):
            out.append(f"observable of {m.kind}()")
    for op in circuit.operations:
        if any(dual(p) for p in op.params):
            out.append(f"gate '{op.gate.pl_name or op.gate.name}'")
    for op, gate in unitary_ops(circuit):
        if dual(gate.matrix_fn()):
            out.append(f"matrix of gate '{op.gate.pl_name or op.gate.name}'")
    return out


def empty_outputs(recorded, backend, shots) -> list:
    """The outputs of a recorded call with no bindings (``theta`` ``(0, P)``), without running
    ``backend``: one tensor per measurement with leading dim 0, of the shape and dtype a
    non-empty batch gets. They hang off ``theta`` (and a trainable state preparation or
    observable coefficients) in the autograd graph, so a backward gives empty or zero
    gradients as torch does for an empty batch. ``shots`` is the call's (see
    :func:`effective_shots`)."""
    circuit = recorded.circuit
    theta = recorded.theta
    n = circuit.num_wires
    real = theta.dtype if theta.dtype.is_floating_point else torch.float64
    cdtype = getattr(backend, "cdtype", torch.complex128)
    anchor = theta.sum(-1)
    leaves = [recorded.initial_state] + [m.obs.coeffs for m in circuit.measurements
                                         if m.obs is not None]
    for t in leaves:
        if t is not None and t.requires_grad:
            anchor = anchor + t.real.sum().to(anchor.dtype)
    out = []
    for m in circuit.measurements:
        k = n if m.wires is None else len(m.wires)
        if m.kind in ("sample", "counts"):
            if not shots:
                raise QdiffError(f"{m.kind}() needs a device with shots (qd.device(..., shots=N))")
            out.append(torch.empty((0, shots), dtype=real, device=theta.device)
                       if m.obs is not None else
                       torch.empty((0, shots, k), dtype=torch.int64, device=theta.device))
            continue
        if shots and m.kind == "state":
            raise QdiffError("state() is not available with shots")
        if shots and m.kind in ("density_matrix", "purity"):
            raise QdiffError(f"{m.kind}() is exact only; it is not available with shots")
        if m.kind in ("expval", "var", "purity"):
            out.append(anchor.to(real))
        elif m.kind == "probs":
            out.append(anchor.to(real)[:, None].expand(0, 2 ** k))
        elif m.kind == "state":
            out.append(anchor.to(cdtype)[:, None].expand(0, 2 ** n))
        elif m.kind == "density_matrix":
            out.append(anchor.to(cdtype)[:, None, None].expand(0, 2 ** k, 2 ** k))
        else:  # pragma: no cover - Measurement kinds are fixed
            raise QdiffError(f"unknown measurement '{m.kind}'")
    return out
