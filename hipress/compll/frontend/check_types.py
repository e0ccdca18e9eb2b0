"""Types and array lengths: type annotations and length expressions (integer expressions of
``n`` and the parameters); when two lengths agree is :mod:`hipress.compll.frontend.lengths`
(re-exported here)."""

from __future__ import annotations

import torch

from hipress.compll.frontend import ast
from hipress.compll.frontend.check_expr import scalar
from hipress.compll.frontend.lengths import same_length, same_type
from hipress.compll.frontend.scope import Ctx, Elab, Scope
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.fold import fold
from hipress.compll.ir.interp import eval_scalar
from hipress.compll.ir.source import Span
from hipress.compll.ir.types import I64, PACKED_BITS, SCALAR_TYPES, U8, ArrayType, DType
from hipress.compll.ir.walk import walk

__all__ = ["MAX_LENGTH", "refs", "same_length", "same_type", "size", "static", "type_of"]


def type_of(cx: Elab, t: ast.TypeAnn, scope: Scope) -> DType | ArrayType:
    """The type an annotation denotes (array lengths elaborated in ``scope``)."""
    if isinstance(t, ast.ScalarTypeAnn):
        if t.name not in SCALAR_TYPES:
            raise cx.err(f"unknown type `{t.name}` (types: {', '.join(SCALAR_TYPES)})", t.span)
        return SCALAR_TYPES[t.name]
    if isinstance(t, ast.ArrayTypeAnn):
        if t.elem not in SCALAR_TYPES:
            raise cx.err(f"unknown element type `{t.elem}`", t.span)
        return ArrayType(SCALAR_TYPES[t.elem], size(cx, t.length, scope))
    bits_v = scalar(cx, t.bits, scope, Ctx(True, False, []))
    if not isinstance(bits_v.expr, ir.Const) or bits_v.expr.value not in PACKED_BITS:
        shown = bits_v.expr.value if isinstance(bits_v.expr, ir.Const) else "not a constant"
        raise cx.err(f"packed width must be a constant 1, 2, 4 or 8 (got {shown})", t.bits.span)
    return ArrayType(U8, size(cx, t.length, scope), int(bits_v.expr.value))


def size(cx: Elab, e: ast.Expr, scope: Scope, ctx: Ctx | None = None) -> ir.Expr:
    """An array length: a non-negative i64 expression of ``n`` and constants."""
    v = scalar(cx, e, scope, ctx or Ctx(True, False, []))
    if not (v.dtype.is_int):
        raise cx.err(f"array length must be an integer, got {v.dtype}", e.span)
    x = fold(ir.Cast(v.expr, I64)) if v.dtype != I64 else v.expr
    static(cx, x, e.span, "an array length")
    if isinstance(x, ir.Const) and int(x.value) < 0:
        raise cx.err(f"array length {x.value} is negative", e.span)
    _in_range(cx, x, e.span)
    return x


MAX_LENGTH = 1 << 48  # elements: more than any machine holds, far from i64's wrap-around
_SIZE_PROBES = (*range(0, 70), *(1 << k for k in range(6, 31)), (1 << 31) - 1)


def _in_range(cx: Elab, x: ir.Expr, span: Span) -> None:
    """Raise unless length ``x`` is in [0, MAX_LENGTH] at every probed element count (zero up,
    powers of two to 2^31 - 1): a negative length would silently be an empty array, and a huge
    one wraps around i64."""
    if isinstance(x, ir.Const):
        return
    for n in _SIZE_PROBES:
        v = int(eval_scalar(x, {ir.N: torch.tensor(n, dtype=torch.int64)}).item())
        if v < 0:
            raise cx.err(
                f"array length `{x}` is negative at n = {n} ({v}); write `max(0, ...)` if "
                "an empty array is meant there",
                span,
            )
        if v > MAX_LENGTH:
            raise cx.err(
                f"array length `{x}` is {v} at n = {n}, above the limit of 2^48 elements "
                "(larger lengths wrap around); bound it, e.g. with `min(...)`",
                span,
            )


def static(cx: Elab, e: ir.Expr, span: Span, what: str) -> None:
    """Raise unless ``e`` reads nothing but ``n`` (``what`` names it in the error)."""
    bad = refs(e) - {ir.N}
    if bad:
        shown = ", ".join(sorted(f"`{r}`" for r in bad))
        raise cx.err(f"{what} must be computable from n and the parameters (it uses {shown})", span)


def refs(e: ir.Expr) -> set[str]:
    """Names ``e`` reads: references, loaded arrays, and ``<random>`` for random numbers."""
    out: set[str] = set()
    for x in walk(e):
        if isinstance(x, ir.Ref):
            out.add(x.name)
        elif isinstance(x, ir.Load):
            out.add(x.array)
        elif isinstance(x, ir.Rand):
            out.add("<random>")
    return out
