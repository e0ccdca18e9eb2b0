"""Elaboration of the scalar builtin calls: conversions ``T(x)``, the math builtins (``abs``,
``floor``, ``isnan``...), ``min``/``max``, ``clamp`` and the random numbers ``urand``,
``uniform``, ``randint``. Each takes the call and ``arg``, which elaborates one argument in the
caller's scope; arguments are elaborated left to right, each checked before the next is read."""

from __future__ import annotations

from hipress.compll.frontend import ast
from hipress.compll.frontend.check_bits import ArgFn
from hipress.compll.frontend.coerce import coerce, concrete, no_storage, unify
from hipress.compll.frontend.scope import Ctx, Elab, Scalar, arity
from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.fold import fold
from hipress.compll.ir.semantics import int_range
from hipress.compll.ir.types import F32, I64, SCALAR_TYPES, U32

_NEEDS = {ops.FLOAT: "a float", ops.NUMBER: "a number"}


def conversion(cx: Elab, e: ast.Call, arg: ArgFn) -> Scalar:
    """``T(x)`` for a scalar type ``T``; an integer literal out of ``T``'s range is an error
    (the conversion would wrap it)."""
    arity(cx, e, 1)
    x = arg(e.args[0])
    t = SCALAR_TYPES[e.func]
    if x.dtype == t:
        return Scalar(x.expr)
    if x.lit and isinstance(x.expr, ir.Const) and t.is_int and x.dtype.is_int:
        lo, hi = int_range(t)
        if not lo <= int(x.expr.value) <= hi:
            wrapped = fold(ir.Cast(ir.Const(int(x.expr.value), x.dtype), t))
            shown = getattr(wrapped, "value", "?")
            raise cx.err(
                f"{e.func}({x.expr.value}): {x.expr.value} is out of range for {t} ({lo} to "
                f"{hi}); the conversion would wrap it to {shown}: write that if it "
                "is meant",
                e.span,
            )
    return Scalar(fold(ir.Cast(concrete(x).expr, t)))


def math1(cx: Elab, e: ast.Call, arg: ArgFn) -> Scalar:
    """A unary math builtin (``e.func`` in :data:`ops.MATH_BUILTINS`), typed by its operand
    rule: floats only (a literal becomes f32) or any number."""
    op = ops.UNARY[e.func]
    arity(cx, e, 1)
    x = arg(e.args[0])
    no_storage(cx, x, e.span)
    if op.operands == ops.FLOAT and x.lit:
        x = coerce(cx, x, F32, e.span)
    if op.operands == ops.FLOAT and not x.dtype.is_float:
        raise cx.err(f"`{op.name}` needs {_NEEDS[op.operands]}, got {x.dtype}", e.span)
    if not (x.dtype.is_float or x.dtype.is_int):
        raise cx.err(f"`{op.name}` needs {_NEEDS[ops.NUMBER]}, got {x.dtype}", e.span)
    out = op.result_type(x.dtype)
    return Scalar(fold(ir.Unary(op.name, x.expr, out)), x.lit and op.result == ops.SAME)


def minmax(cx: Elab, e: ast.Call, arg: ArgFn) -> Scalar:
    """``min(a, b)`` or ``max(a, b)``."""
    op = ops.BINARY[e.func]
    if len(e.args) != 2:
        raise cx.err(
            f"`{op.name}(a, b)` takes 2 scalars; to reduce an array use `reduce({op.name}, arr)`",
            e.span,
        )
    a, b = (arg(x) for x in e.args)
    a, b = unify(cx, a, b, e.span, op.name)
    no_storage(cx, a, e.span)
    return Scalar(fold(ir.Binary(op.name, a.expr, b.expr, a.dtype)), a.lit and b.lit)


def clamp(cx: Elab, e: ast.Call, arg: ArgFn) -> Scalar:
    """``clamp(x, lo, hi)`` = ``min(max(x, lo), hi)``."""
    arity(cx, e, 3)
    x, lo, hi = (arg(a) for a in e.args)
    x, lo = unify(cx, x, lo, e.span, e.func)
    x, hi = unify(cx, x, hi, e.span, e.func)
    lo, hi = unify(cx, lo, hi, e.span, e.func)
    no_storage(cx, x, e.span)
    m = fold(ir.Binary(ops.MAX.name, x.expr, lo.expr, x.dtype))
    return Scalar(fold(ir.Binary(ops.MIN.name, m, hi.expr, x.dtype)), x.lit)


def random_call(cx: Elab, e: ast.Call, arg: ArgFn, ctx: Ctx) -> Scalar:
    """``urand(c[, stream])`` (u32 bits), ``uniform(c[, stream])`` (f32 in [0, 1)) or
    ``randint(c, m[, stream])`` (in [0, m)); encode only."""
    if not ctx.in_encode:
        raise cx.err(
            f"`{e.func}` is only available in encode (decode must be a pure function of "
            "the payload)",
            e.func_span,
        )
    want = 2 if e.func == "randint" else 1
    if len(e.args) not in (want, want + 1):
        raise cx.err(f"`{e.func}` takes {want} argument(s) and an optional stream number", e.span)
    ctr = arg(e.args[0])
    if not ctr.dtype.is_int:
        raise cx.err(f"the random counter must be an integer, got {ctr.dtype}", e.span)
    c = ctr.expr if ctr.dtype == I64 else fold(ir.Cast(ctr.expr, I64))
    stream = 0
    if len(e.args) == want + 1:
        s = arg(e.args[-1])
        if (
            not isinstance(s.expr, ir.Const)
            or not s.dtype.is_int
            or not 0 <= int(s.expr.value) < 65536
        ):
            raise cx.err("the stream number must be a constant in [0, 65535]", e.args[-1].span)
        stream = int(s.expr.value)
    if e.func == "urand":
        return Scalar(ir.Rand("bits", c, stream, U32))
    if e.func == "uniform":
        return Scalar(ir.Rand("uniform", c, stream, F32))
    m = coerce(cx, arg(e.args[1]), I64, e.args[1].span)
    bits = ir.Cast(ir.Rand("bits", c, stream, U32), I64)
    prod = ir.Binary(ops.MUL.name, bits, m.expr, I64)
    return Scalar(ir.Binary(ops.SHR.name, prod, ir.Const(32, I64), I64))
