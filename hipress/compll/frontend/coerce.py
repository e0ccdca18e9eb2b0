"""Conversions between scalar types during checking: literals that adapt to the other operand,
implicit conversions that lose nothing, and the errors that ask for an explicit one."""

from __future__ import annotations

from hipress.compll.frontend.scope import Ctx, Elab, Scalar
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.semantics import int_range
from hipress.compll.ir.source import Span
from hipress.compll.ir.types import F32, F64, DType

# the largest finite f32, and the magnitude from which a value rounds to infinity in f32
F32_MAX = 3.4028234663852886e38
_F32_INF_FROM = 2.0**128 - 2.0**103


def float_literal(value: float) -> ir.Const:
    """A float literal as a constant: f32 (it adapts to its context), or f64 where its value
    is beyond f32's range, so that only an f64 context accepts it."""
    return ir.Const(value, F32 if fits(value, F32) else F64)


def fits(value: float, t: DType) -> bool:
    """Whether float ``value`` converts to float type ``t`` without becoming infinite (an
    infinity or NaN fits every float type)."""
    finite = value == value and abs(value) != float("inf")
    return not (finite and t.bits == 32 and abs(value) >= _F32_INF_FROM)


def representable(c: ir.Const, dst: DType, lit: bool) -> bool:
    """Whether constant ``c`` converts to ``dst`` implicitly (``lit``: it is an untyped literal,
    which may also narrow a float)."""
    src = c.dtype
    if src == dst:
        return True
    if dst.is_bool or src.is_bool or dst.storage_only:
        return False
    if src.is_int and dst.is_int:
        lo, hi = int_range(dst)
        return lo <= int(c.value) <= hi
    if src.is_int and dst.is_float:
        return True
    if src.is_float and dst.is_float:
        return (lit and fits(float(c.value), dst)) or dst.bits >= src.bits
    return False


def convert(c: ir.Const, dst: DType) -> ir.Const:
    """``c`` as a constant of ``dst`` (after :func:`representable` said yes)."""
    if dst.is_float:
        return ir.Const(float(c.value), dst)
    return ir.Const(int(c.value), dst)


def retype_literal(e: ir.Expr, t: DType) -> ir.Expr | None:
    """Give an expression built only from literals (e.g. ``c ? 1 : 0``) the type ``t``."""
    if isinstance(e, ir.Const):
        return convert(e, t) if representable(e, t, True) else None
    if isinstance(e, ir.Select):
        a, b = retype_literal(e.a, t), retype_literal(e.b, t)
        if a is None or b is None:
            return None
        return ir.Select(e.cond, a, b, t)
    return None


def coerce(cx: Elab, v: Scalar, t: DType, span: Span) -> Scalar:
    """``v`` as a (non-literal) value of type ``t``; raises at ``span`` when that needs an
    explicit conversion or a constant does not fit."""
    if v.dtype == t:
        return Scalar(v.expr)
    if isinstance(v.expr, ir.Const) and representable(v.expr, t, v.lit):
        return Scalar(convert(v.expr, t))
    if v.lit:
        retyped = retype_literal(v.expr, t)
        if retyped is not None:
            return Scalar(retyped)
    if isinstance(v.expr, ir.Const) and v.dtype.is_int and t.is_int:
        lo, hi = int_range(t)
        raise cx.err(f"{v.expr.value} is out of range for {t} ({lo} to {hi})", span)
    out_of_range(cx, v, t, span)
    raise cx.err(f"expected {t}, got {v.dtype}; convert explicitly, e.g. {t}(...)", span)


def out_of_range(cx: Elab, v: Scalar, t: DType, span: Span) -> None:
    """Raise at ``span`` if ``v`` is a float literal that ``t`` cannot hold."""
    c = v.expr
    if not (v.lit and isinstance(c, ir.Const) and c.dtype.is_float and t.is_float):
        return
    if not fits(float(c.value), t):
        raise cx.err(
            f"{c.value!r} is out of range for {t} (largest finite {F32_MAX!r}); "
            "an f64 value needs an f64 context, e.g. f64(x) * ...",
            span,
        )


def concrete(v: Scalar) -> Scalar:
    """``v`` with its own type fixed (no longer an adapting literal)."""
    return Scalar(v.expr) if v.lit else v


def unify(cx: Elab, lhs: Scalar, rhs: Scalar, span: Span, what: str) -> tuple[Scalar, Scalar]:
    """The two operands of ``what`` given one type (a constant side adapts); raises at ``span``
    when neither side can."""
    if lhs.dtype == rhs.dtype:
        return lhs, rhs
    lc, rc = isinstance(lhs.expr, ir.Const), isinstance(rhs.expr, ir.Const)
    if lhs.lit and rhs.lit:  # int literal meets float literal (or a ?: of literals)
        a, b = retype_literal(lhs.expr, F32), retype_literal(rhs.expr, F32)
        if a is not None and b is not None:
            return Scalar(a, True), Scalar(b, True)
    if lc and (lhs.lit or not rc) and representable(lhs.expr, rhs.dtype, lhs.lit):
        return Scalar(convert(lhs.expr, rhs.dtype)), rhs
    if rc and representable(rhs.expr, lhs.dtype, rhs.lit):
        return lhs, Scalar(convert(rhs.expr, lhs.dtype))
    if lc and representable(lhs.expr, rhs.dtype, lhs.lit):
        return Scalar(convert(lhs.expr, rhs.dtype)), rhs
    out_of_range(cx, lhs, rhs.dtype, span)
    out_of_range(cx, rhs, lhs.dtype, span)
    raise cx.err(
        f"mismatched types {lhs.dtype} and {rhs.dtype} in `{what}`; convert one explicitly, "
        f"e.g. {lhs.dtype}(...) or {rhs.dtype}(...)",
        span,
    )


def no_storage(cx: Elab, x: Scalar, span: Span) -> None:
    """Raise unless ``x`` can be computed with (f16/bf16 are storage-only)."""
    if x.dtype.storage_only:
        raise cx.err(f"{x.dtype} is a storage type; convert it first, e.g. f32(x)", span)


def emit_scalar(cx: Elab, name: str, v: Scalar, ctx: Ctx) -> Scalar:
    """``v`` bound to a fresh SSA name based on ``name`` in ``ctx`` (a host ``Let`` or a lambda
    let) and returned as a reference; constants and references are returned as they are."""
    v = concrete(v)
    if isinstance(v.expr, ir.Const | ir.Ref):
        return v
    ssa = cx.fresh(name)
    if ctx.host:
        ctx.ops.append(ir.Let(ssa, v.expr))
    else:
        ctx.ops.append((ssa, v.expr))
    return Scalar(ir.Ref(ssa, v.dtype))
