"""Types and array lengths: type annotations, length expressions (integer expressions of ``n``
and the parameters) and when two lengths agree."""

from __future__ import annotations

from hipress.compll.frontend import ast
from hipress.compll.frontend.check_expr import scalar
from hipress.compll.frontend.scope import Ctx, Elab, Scope
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.fold import fold
from hipress.compll.ir.interp import eval_size
from hipress.compll.ir.source import Span
from hipress.compll.ir.types import I64, PACKED_BITS, SCALAR_TYPES, U8, ArrayType, DType
from hipress.compll.ir.walk import walk


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
    return x


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


_PROBES = (
    *range(0, 70),
    100,
    127,
    128,
    129,
    255,
    256,
    1000,
    1023,
    1024,
    4097,
    65535,
    1 << 20,
    (1 << 20) + 3,
    12345678,
    (1 << 31) - 1,
)


def same_length(a: ir.Expr, b: ir.Expr) -> bool:
    """Whether two length expressions agree (structurally, or at every probe size n)."""
    if a == b:
        return True
    try:
        return all(eval_size(a, n) == eval_size(b, n) for n in _PROBES)
    except (RuntimeError, ValueError, OverflowError):  # pragma: no cover - defensive
        return False


def same_type(a: ArrayType, b: ArrayType) -> bool:
    """Whether two array types agree (element type, packing and length)."""
    return a.dtype == b.dtype and a.bits == b.bits and same_length(a.length, b.length)
