"""Parameters and constants: ``param`` declarations (type, default, allowed values), the values a
caller gives them, ``const`` declarations and constant expressions."""

from __future__ import annotations

import math
from typing import Any

import torch

from hipress.compll.frontend import ast
from hipress.compll.frontend.check_expr import scalar
from hipress.compll.frontend.check_types import static, type_of
from hipress.compll.frontend.coerce import coerce
from hipress.compll.frontend.scope import BUILTINS, Binding, Ctx, Elab, Scalar, Scope
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.semantics import int_range
from hipress.compll.ir.source import CllParamError, Span
from hipress.compll.ir.types import F32, PARAM_TYPES, SCALAR_TYPES, DType


def declare(cx: Elab, scope: Scope, name: str, span: Span) -> None:
    """Raise if ``name`` may not be declared at the top of the program."""
    if name in scope.names:
        raise cx.err(f"`{name}` is already defined", span)
    if name in BUILTINS or name in SCALAR_TYPES:
        raise cx.err(f"`{name}` is a builtin name and cannot be redefined", span)


def params(cx: Elab, decls: tuple[ast.Decl, ...], top: Scope) -> list[tuple[str, Any]]:
    """Each ``param``'s (name, value): the caller's value (checked) or the default; each bound
    in ``top`` as a constant. Raises :class:`CllParamError` for a value the program refuses."""
    declared = [d for d in decls if isinstance(d, ast.ParamDecl)]
    names = {d.name for d in declared}
    unknown = sorted(set(cx.values) - names)
    if unknown:
        have = ", ".join(sorted(names)) or "none"
        raise CllParamError(
            f"unknown parameter `{unknown[0]}` (this algorithm's parameters: {have})",
            cx.src,
            None,
        )
    out = []
    for d in declared:
        declare(cx, top, d.name, d.span)
        t = type_of(cx, d.type, top)
        if not isinstance(t, DType) or t.name not in PARAM_TYPES:
            raise cx.err(f"parameter type must be one of {', '.join(PARAM_TYPES)}", d.type.span)
        default = const_value(cx, d.default, top, t)
        allowed = constraint(cx, d, top, t)
        if not is_allowed(default, allowed):
            raise cx.err(
                f"default {default!r} of `{d.name}` is outside its allowed values "
                f"{describe_allowed(allowed)}",
                d.default.span,
            )
        if d.name in cx.values:
            value = check_param_value(cx, d, t, cx.values[d.name], allowed)
        else:
            value = default
        out.append((d.name, value))
        top.names[d.name] = Binding(Scalar(ir.Const(value, t)), "param")
    return out


def constraint(cx: Elab, d: ast.ParamDecl, top: Scope, t: DType) -> Any:
    """The allowed values of ``d``: None, ``("range", lo, hi)`` or ``("set", values)``."""
    c = d.constraint
    if c is None:
        return None
    if isinstance(c, ast.RangeConstraint):
        lo = const_value(cx, c.lo, top, t)
        hi = const_value(cx, c.hi, top, t)
        if lo > hi:
            raise cx.err(f"empty range [{lo}, {hi}]", c.span)
        return ("range", lo, hi)
    return ("set", tuple(const_value(cx, v, top, t) for v in c.values))


def is_allowed(v: Any, allowed: Any) -> bool:
    """Whether ``v`` is in ``allowed`` (a :func:`constraint`; None allows everything)."""
    if allowed is None:
        return True
    if allowed[0] == "range":
        return allowed[1] <= v <= allowed[2]
    return v in allowed[1]


def describe_allowed(allowed: Any) -> str:
    """A :func:`constraint` as the diagnostics write it."""
    if allowed is None:
        return "(any)"
    if allowed[0] == "range":
        return f"[{allowed[1]}, {allowed[2]}]"
    return "{" + ", ".join(repr(v) for v in allowed[1]) + "}"


def check_param_value(cx: Elab, d: ast.ParamDecl, t: DType, v: Any, allowed: Any) -> Any:
    """A caller's value ``v`` for parameter ``d`` of type ``t``, normalised (ints as int, f32
    rounded); raises :class:`CllParamError` naming the parameter and its allowed values."""
    # every rejection names the parameter and, when it has one, its allowed values
    rng = "" if allowed is None else f" (allowed values {describe_allowed(allowed)})"

    def bad(msg: str) -> CllParamError:
        return CllParamError(f"parameter `{d.name}` {msg}{rng}", cx.src, d.span)

    if t.is_bool:
        if not isinstance(v, bool):
            raise bad(f"must be a bool, got {v!r}")
    elif t.is_int:
        whole = isinstance(v, int) or (isinstance(v, float) and math.isfinite(v) and v == int(v))
        if isinstance(v, bool) or not whole:
            raise bad(f"must be an integer ({t}), got {v!r}")
        v = int(v)
        lo, hi = int_range(t)
        if not lo <= v <= hi:
            raise bad(f"= {v} does not fit {t}")
    else:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise bad(f"must be a number, got {v!r}")
        try:
            v = float(v)
        except OverflowError:
            raise bad(f"is a {len(str(abs(v)))}-digit integer, beyond the float range") from None
        if v != v:
            raise bad("must not be NaN")
        if t == F32:
            v = float(torch.tensor(v, dtype=torch.float32).item())
    if not is_allowed(v, allowed):
        raise CllParamError(
            f"parameter `{d.name}` = {v!r} is outside its allowed values "
            f"{describe_allowed(allowed)}",
            cx.src,
            d.span,
        )
    return v


def const_value(cx: Elab, e: ast.Expr, scope: Scope, t: DType | None) -> Any:
    """The Python value of constant expression ``e`` (converted to ``t`` when given)."""
    ctx = Ctx(host=True, in_encode=False, ops=[])
    v = scalar(cx, e, scope, ctx)
    if t is not None:
        v = coerce(cx, v, t, e.span)
    if not isinstance(v.expr, ir.Const) or ctx.ops:
        raise cx.err("expected a constant expression", e.span)
    if t == F32:  # bounds, defaults and values are all compared as f32
        return float(torch.tensor(float(v.expr.value), dtype=torch.float32).item())
    return v.expr.value


def const(cx: Elab, d: ast.ConstDecl, top: Scope) -> Scalar:
    """The value of a ``const`` declaration (computable from ``n`` and the parameters)."""
    ctx = Ctx(host=True, in_encode=False, ops=[])
    v = scalar(cx, d.value, top, ctx)
    if d.type is not None:
        t = type_of(cx, d.type, top)
        if not isinstance(t, DType):
            raise cx.err("a const must be a scalar", d.type.span)
        v = coerce(cx, v, t, d.value.span)
    elif v.lit:
        v = Scalar(v.expr)
    static(cx, v.expr, d.value.span, "a const")
    return Scalar(v.expr)
