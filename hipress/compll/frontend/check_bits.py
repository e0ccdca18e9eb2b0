"""Elaboration of the builtins that see a float's representation :
the bit casts ``as_u32 as_i32 as_f32 as_i64 as_f64``, ``exponent`` and ``ldexp``.

They are exact on every backend, unlike ``log2``/``exp2``, which the language leaves out: torch,
libm and CUDA's fast math library round those differently (CUDA's ``log2f``/``exp2f`` are not
correctly rounded), and every backend must compute what the reference interpreter computes, bit
for bit. ``exponent`` and ``ldexp`` are the exact parts of ``log2`` and ``exp2``.
"""

from __future__ import annotations

from collections.abc import Callable

from hipress.compll.frontend import ast
from hipress.compll.frontend.coerce import coerce, no_storage
from hipress.compll.frontend.scope import Elab, Scalar, arity
from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.fold import fold
from hipress.compll.ir.source import Span
from hipress.compll.ir.types import F32, F64, I32, I64, U32, DType

# elaborates one argument of the call (in the caller's scope)
ArgFn = Callable[[ast.Expr], Scalar]
_WIDTH = {32: "a 32-bit value (f32, i32 or u32)", 64: "a 64-bit value (f64 or i64)"}


def bits_call(cx: Elab, e: ast.Call, arg: ArgFn) -> Scalar:
    """``as_T(x)``, ``exponent(x)`` or ``ldexp(x, e)`` (``e.func`` is in ``BIT_BUILTINS``),
    its arguments elaborated in order by ``arg``."""
    f = e.func
    if f == ops.LDEXP.name:
        return _ldexp(cx, e, arg)
    if f == ops.HASH.name:
        return _hash(cx, e, arg)
    arity(cx, e, 1)
    if f == ops.EXPONENT.name:
        x = float_arg(cx, e, e.args[0], arg)
        return Scalar(fold(ir.Unary(f, x.expr, ops.EXPONENT.result_type(x.dtype))))
    cast = ops.UNARY[f]
    x = arg(e.args[0])
    no_storage(cx, x, e.span)
    t = cast.result_type(x.dtype)
    if x.lit:
        x = literal_bits(cx, f, x, t, e.args[0].span)
    if x.dtype.is_bool or x.dtype.bits != t.bits:
        convert = {32: "f32(...) or u32(...)", 64: "f64(...) or i64(...)"}[t.bits]
        raise cx.err(
            f"`{f}` reinterprets the bits of {_WIDTH[t.bits]}, got {x.dtype}; convert it "
            f"first, e.g. {convert}",
            e.span,
        )
    if x.dtype == t:
        return Scalar(x.expr)
    if x.dtype.is_int and t.is_int:  # same width: the conversion keeps the bits
        return Scalar(fold(ir.Cast(x.expr, t)))
    return Scalar(fold(ir.Unary(f, x.expr, t)))


def _ldexp(cx: Elab, e: ast.Call, arg: ArgFn) -> Scalar:
    arity(cx, e, 2)
    x = float_arg(cx, e, e.args[0], arg)
    k = arg(e.args[1])
    if k.lit and k.dtype.is_int:
        k = coerce(cx, k, I64, e.args[1].span)
    if not k.dtype.is_int:
        raise cx.err(
            f"the exponent of `ldexp(x, e)` must be an integer, got {k.dtype}; "
            "convert it, e.g. i32(...)",
            e.args[1].span,
        )
    ke = k.expr if k.dtype == I64 else fold(ir.Cast(k.expr, I64))
    out = ops.LDEXP.result_type(x.dtype)
    return Scalar(fold(ir.Binary(ops.LDEXP.name, x.expr, ke, out)), x.lit and k.lit)


def _hash(cx: Elab, e: ast.Call, arg: ArgFn) -> Scalar:
    """``hash(seed, i)``: a u32 of two integers (each taken as i64), alike on every backend."""
    if len(e.args) != 2:
        raise cx.err("usage: hash(seed, i): a u32 hash of two integers", e.span)
    xs = []
    for a in e.args:
        x = arg(a)
        if x.lit and x.dtype.is_int:
            x = coerce(cx, x, I64, a.span)
        if not x.dtype.is_int:
            raise cx.err(
                f"`hash(seed, i)` takes integers, got {x.dtype}; convert it, e.g. i64(...), or "
                "hash its bits with as_u32(...)",
                a.span,
            )
        xs.append(x.expr if x.dtype == I64 else fold(ir.Cast(x.expr, I64)))
    return Scalar(fold(ir.Binary(ops.HASH.name, xs[0], xs[1], U32)))


def float_arg(cx: Elab, e: ast.Call, a: ast.Expr, arg: ArgFn) -> Scalar:
    """Argument ``a`` of ``e``, which must be a float (a literal becomes f32)."""
    x = arg(a)
    no_storage(cx, x, e.span)
    if x.lit:
        x = coerce(cx, x, F32, a.span)
    if not x.dtype.is_float:
        raise cx.err(
            f"`{e.func}` needs a float (f32 or f64), got {x.dtype}; convert it, e.g. f32(...)",
            a.span,
        )
    return x


def literal_bits(cx: Elab, f: str, x: Scalar, t: DType, span: Span) -> Scalar:
    """A literal argument takes the type whose bits ``as_T`` reads: the float of T's width
    for an integer T, else the integer of T's width that holds the value (u32 before i32)."""
    if t.is_int:
        return coerce(cx, x, F32 if t.bits == 32 else F64, span)
    if not x.dtype.is_int:
        return x
    if t.bits == 64:
        return coerce(cx, x, I64, span)
    v = getattr(x.expr, "value", None)
    if isinstance(v, int) and not -(1 << 31) <= v < (1 << 32):
        raise cx.err(
            f"`{f}({v})`: {v} does not fit in 32 bits (u32 or i32); as_f32 reads the "
            "bits of a 32-bit integer",
            span,
        )
    return coerce(cx, x, U32 if isinstance(v, int) and v >= 0 else I32, span)
