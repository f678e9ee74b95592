"""Qiskit ``ParameterExpression`` angles evaluated in torch, so gradients flow by the chain rule.

An angle that is affine in one parameter stays a ``ParamRef(i, scale, offset)`` on that
parameter's ``theta`` column (the fast path every backend and gradient rule reads directly).
Any other angle -- products, sums of several parameters, ``sin``/``cos``/``tan``/``arcsin``/
``arccos``/``arctan``/``exp``/``log``/``abs``/``sign``/``conjugate``, powers, quotients, as
Qiskit allows them -- becomes one extra ``theta`` column computed from the parameter columns by
ordinary torch operations. Backends see plain columns; torch carries ``d/dcolumn`` back into the
parameters, so every differentiation method stays exact.

Expressions of the same shape (``(x[0] - pi) * (x[1] - pi) * 2`` and ``(x[1] - pi) * (x[2] -
pi) * 2``, as in ``zz_feature_map``) are evaluated together: one set of torch operations on
``(B, G)`` gathered columns per shape, not one per expression.

>>> import torch
>>> from qiskit.circuit import Parameter
>>> a, b = Parameter("a"), Parameter("b")
>>> table = ExpressionTable({a: 0, b: 1})
>>> table.add(a * b + a.sin()), table.add(b * a.sin() + b)
(0, 1)
>>> table.evaluate(torch.tensor([[2.0, 3.0]], dtype=torch.float64))
tensor([[6.9093, 5.7279]], dtype=torch.float64)
"""
from __future__ import annotations

import math
from collections import OrderedDict

import torch

from qdiff.circuits import caches
from qdiff.circuits.errors import QdiffError

# sympy function name -> torch function of one argument (real angles: conjugate/re are identity)
_FUNCS = {"sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "asin": torch.asin,
          "acos": torch.acos, "atan": torch.atan, "exp": torch.exp, "log": torch.log,
          "Abs": torch.abs, "sign": torch.sign, "sinh": torch.sinh, "cosh": torch.cosh,
          "tanh": torch.tanh, "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh,
          "conjugate": lambda x: x, "re": lambda x: x}

# expression key -> analysis (sympify is slow); canonical sympy shape -> torch function
_ANALYSES: "OrderedDict" = caches.register("qiskit_expr.analyses", OrderedDict())
_COMPILED: dict = caches.register("qiskit_expr.compiled", {})
_CACHE_SIZE = 4096


def expression_key(expr) -> tuple:
    """A content key of a ``ParameterExpression``: its text and its parameters' identities."""
    return (str(expr), tuple(sorted((p.name, str(p.uuid)) for p in expr.parameters)))


def analyse(expr, where: str):
    """``("const", value)``, ``("affine", parameter, scale, offset)`` or ``("expr", canonical,
    [parameters in slot order])`` for a ``ParameterExpression``; cached by content."""
    key = expression_key(expr)
    hit = _ANALYSES.get(key)
    if hit is not None:
        return hit
    out = _analyse(expr, where)
    _ANALYSES[key] = out
    caches.trim(_ANALYSES, _CACHE_SIZE)
    return out


def _analyse(expr, where: str):
    params = list(expr.parameters)
    if not params:
        return ("const", _real_constant(complex(expr), expr, where))
    import sympy
    by_name = {p.name: p for p in params}
    try:
        sym = sympy.sympify(expr.sympify())
    except Exception as exc:  # Qiskit cannot export the form (a constant base: ``2 ** a``)
        sym, failure = None, f"{type(exc).__name__}: {exc}"
    if sym is None or not _agrees(sym, expr, by_name):
        # Qiskit's symbolic export can fail (``2 ** a``) or drop or swap a symbol that cancels
        # (``(b / b) * a`` came back as ``b``); its printed form is read instead, and checked
        # the same way
        text = _from_text(expr, by_name)
        if text is not None and _agrees(text, expr, by_name):
            sym = text
        elif sym is None:
            raise QdiffError(f"{where}: angle {expr} cannot be evaluated ({failure})") from None
        else:
            raise QdiffError(f"{where}: angle {expr}: Qiskit's symbolic form of this expression "
                             "disagrees with its numeric value; write the angle without "
                             "cancelling parameters") from None
    symbols = sorted(sym.free_symbols, key=lambda s: s.name)
    if not symbols:  # the parameters cancel (0 * a)
        return ("const", _real_constant(complex(sym), expr, where))
    if len(symbols) == 1 and _is_affine(sym, symbols[0]):
        s = symbols[0]
        offset = _real_constant(complex(sym.subs(s, 0)), expr, where)
        scale = _real_constant(complex(sym.subs(s, 1)), expr, where) - offset
        return ("affine", by_name[s.name], scale, offset)
    slots = [sympy.Symbol(f"_s{i}", real=True) for i in range(len(symbols))]
    canonical = sym.xreplace(dict(zip(symbols, slots)))
    compiled(canonical, len(slots), f"{where}: angle {expr}")  # unsupported forms fail here
    return ("expr", canonical, [by_name[s.name] for s in symbols])


# parameter values at which a symbolic form is checked against Qiskit's numeric binding
_PROBES = ((0.7316, 1.2931, 0.4127, 1.6183, 0.9547, 1.4419, 0.5861, 1.1173),
           (1.3469, 0.5237, 1.7711, 0.8389, 1.2267, 0.6653, 1.5531, 0.9109))


def _agrees(sym, expr, by_name: dict) -> bool:
    """Whether ``sym`` and Qiskit's ``expr`` have the same value at probe points (points
    where Qiskit's own value is not a finite real are skipped; none left: nothing to check)."""
    import sympy
    names = sorted(by_name)
    if any(s.name not in by_name for s in sym.free_symbols):
        return False
    for probe in _PROBES:
        vals = {n: probe[i % len(probe)] * (1 + i // len(probe)) for i, n in enumerate(names)}
        try:
            want = complex(expr.bind({by_name[n]: v for n, v in vals.items()}))
        except Exception:  # a pole or a domain error of Qiskit's evaluation: not a probe
            continue
        if not (math.isfinite(want.real) and math.isfinite(want.imag)):
            continue
        try:
            got = complex(sym.xreplace({s: sympy.Float(vals[s.name]) for s in sym.free_symbols}))
        except Exception:
            return False
        if abs(got - want) > 1e-9 * max(1.0, abs(want)):
            return False
    return True


def _from_text(expr, by_name: dict):
    """``expr``'s printed form read by sympy (parameter names replaced by placeholders, so
    names such as ``x[0]`` parse), or ``None`` when it does not parse."""
    import re
    import sympy
    text = str(expr)
    local = {}
    for i, name in enumerate(sorted(by_name, key=len, reverse=True)):
        token = f"_qdp{i}"
        text = re.sub(r"(?<![\w\[\]])" + re.escape(name) + r"(?![\w\[\]])", token, text)
        local[token] = sympy.Symbol(name)
    try:
        sym = sympy.sympify(text, locals=local)
    except Exception:
        return None
    return sym if isinstance(sym, sympy.Expr) else None


def _is_affine(sym, s) -> bool:
    import sympy
    try:
        return sympy.diff(sym, s, 2) == 0 and not sympy.diff(sym, s).free_symbols
    except Exception:  # a form sympy cannot differentiate is not affine
        return False


def _real_constant(value: complex, expr, where: str) -> float:
    if abs(value.imag) > 1e-12 * max(1.0, abs(value.real)):
        raise QdiffError(f"{where}: angle {expr} is complex ({value}); gate angles are real")
    if not math.isfinite(value.real):
        raise QdiffError(f"{where}: angle {expr} is NaN or infinite")
    return float(value.real)


def compiled(canonical, num_slots: int, what: str):
    """A torch function ``f([t_0, ..., t_{k-1}]) -> tensor`` for a canonical sympy expression
    over the symbols ``_s0.._s{k-1}``; tensors of any common shape (elementwise)."""
    fn = _COMPILED.get(canonical)
    if fn is None:
        slot = {f"_s{i}": i for i in range(num_slots)}
        fn = _COMPILED[canonical] = _compile(canonical, slot, what)
        caches.trim(_COMPILED, _CACHE_SIZE)
    return fn


def _compile(node, slot: dict, what: str):
    """Closure tree evaluating ``node`` on a list of tensors (constants folded to floats)."""
    if node.is_Symbol:
        i = slot[node.name]
        return lambda a: a[i]
    if not node.free_symbols:
        c = _real_constant(complex(node), node, what)
        return lambda a: c
    if node.is_Add or node.is_Mul:
        parts = [_compile(x, slot, what) for x in node.args]
        add = node.is_Add

        def fold(a):
            out = parts[0](a)
            for f in parts[1:]:
                out = out + f(a) if add else out * f(a)
            return out
        return fold
    if node.is_Pow:
        return _compile_pow(node, slot, what)
    f = _FUNCS.get(type(node).__name__)
    if f is not None and len(node.args) == 1:
        inner = _compile(node.args[0], slot, what)
        return lambda a: f(inner(a))
    raise QdiffError(f"{what}: '{type(node).__name__}' is not supported in gate angles")


def _compile_pow(node, slot: dict, what: str):
    base, ex = node.args
    fb = _compile(base, slot, what)
    if ex.free_symbols:
        fe = _compile(ex, slot, what)
        return lambda a: torch.pow(fb(a), fe(a))
    e = _real_constant(complex(ex), ex, what)
    if e == 0.5:
        return lambda a: torch.sqrt(fb(a))
    if e == int(e):
        k = int(e)
        return lambda a: fb(a) ** k
    return lambda a: fb(a) ** e


class ExpressionTable:
    """The non-affine angles of a circuit: column ``k`` is ``expressions[k]`` of the parameter
    columns. ``add`` deduplicates (same expression, same column); ``evaluate`` maps parameter
    values ``(B, Np)`` to expression values ``(B, Ne)`` (same dtype/device; differentiable).

    Args:
        columns: ``{qiskit Parameter: its theta column}``.
    """

    def __init__(self, columns: dict):
        self.columns = dict(columns)
        self.expressions: list = []     # the Qiskit expression of each column
        self.dependencies: list = []    # parameter columns each expression reads
        self._index: dict = {}          # (canonical, args) -> column
        self._groups: "OrderedDict" = OrderedDict()  # canonical -> [arg column lists, positions]
        self._plan = None

    def __len__(self) -> int:
        return len(self.expressions)

    def add(self, expr, where: str = "angle") -> int:
        """The column of ``expr`` (a non-affine ``ParameterExpression``), added if new."""
        kind, canonical, params = analyse(expr, where)
        if kind != "expr":
            raise QdiffError(f"{where}: angle {expr} is affine in one parameter; use a ParamRef")
        try:
            args = tuple(self.columns[p] for p in params)
        except KeyError as e:
            raise QdiffError(f"{where}: angle {expr} uses parameter {e.args[0]} that is not a "
                             "parameter of the circuit") from None
        key = (canonical, args)
        if key not in self._index:
            self._index[key] = len(self.expressions)
            self.expressions.append(expr)
            self.dependencies.append(args)
            group = self._groups.setdefault(canonical, [[], []])
            group[0].append(args)
            group[1].append(self._index[key])
            self._plan = None
        return self._index[key]

    def _build_plan(self, device) -> tuple:
        groups, order = [], []
        for canonical, (arglists, positions) in self._groups.items():
            k = len(arglists[0])
            idx = torch.tensor(arglists, dtype=torch.long, device=device).T.reshape(-1)  # (k*G,)
            groups.append((compiled(canonical, k, str(canonical)), k, len(arglists), idx))
            order.extend(positions)
        inv = None
        if order != list(range(len(order))):
            inv = torch.argsort(torch.tensor(order, device=device))
        return device, groups, inv

    def evaluate(self, values: torch.Tensor) -> torch.Tensor:
        """``(B, Np)`` parameter values -> ``(B, Ne)`` expression values."""
        if self._plan is None or self._plan[0] != values.device:
            self._plan = self._build_plan(values.device)
        _, groups, inv = self._plan
        b = values.shape[0]
        outs = []
        for fn, k, g, idx in groups:
            args = values.index_select(1, idx).reshape(b, k, g).unbind(1)
            out = fn(list(args))
            if not isinstance(out, torch.Tensor) or out.shape != (b, g):
                out = torch.as_tensor(out, dtype=values.dtype, device=values.device).expand(b, g)
            outs.append(out)
        res = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        return res if inv is None else res.index_select(1, inv)
