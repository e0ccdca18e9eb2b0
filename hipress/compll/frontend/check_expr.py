"""Elaboration of expressions: names, indexing, fields, operators, ``?:`` and calls.

:func:`value` elaborates any expression (arrays and tuples included), :func:`scalar` one that
must be a scalar. Operators are typed by their rule in :mod:`hipress.compll.ir.ops`. Parallel
operators and user functions are elaborated through ``cx.parallel`` / ``cx.inline`` (see
:mod:`hipress.compll.frontend.scope`).
"""

from __future__ import annotations

from collections.abc import Callable

from hipress.compll.frontend import ast
from hipress.compll.frontend.check_bits import bits_call
from hipress.compll.frontend.check_call import clamp, conversion, math1, minmax, random_call
from hipress.compll.frontend.coerce import coerce, float_literal, no_storage, unify
from hipress.compll.frontend.lengths import same_length
from hipress.compll.frontend.scope import (
    BIT_BUILTINS,
    MATH1,
    MINMAX,
    PARALLEL,
    RANDOM,
    Array,
    Ctx,
    Elab,
    Scalar,
    Scope,
    Tuple_,
    Value,
    suggest,
)
from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.fold import fold
from hipress.compll.ir.source import Span
from hipress.compll.ir.types import BOOL, I64, SCALAR_TYPES, ArrayType

# what an operand rule asks for, as the diagnostics say it (unary: one operand; binary: both)
_UNARY_NEEDS = {ops.NUMBER: "a number", ops.BOOLS: "a bool", ops.INT: "an integer"}
_BINARY_NEEDS = {
    ops.BOOLS: "bools",
    ops.INT_OR_BOOL: "integers or bools",
    ops.NUMBER: "numbers",
    ops.SHIFT: "integers",
}


def value(
    cx: Elab,
    e: ast.Expr,
    scope: Scope,
    ctx: Ctx,
    name_hint: str = "t",
    expect: ArrayType | None = None,
    names: tuple[str, ...] | None = None,
) -> Value:
    """Any value: a scalar, an array (``expect`` is its declared type, when known, and
    ``name_hint`` the base of its SSA name) or a tuple (``names``: the names it is unpacked
    into)."""
    if isinstance(e, ast.Call) and e.func in PARALLEL:
        return cx.parallel(cx, e, scope, ctx, name_hint, expect, names)
    if isinstance(e, ast.Call) and e.func == "extract":
        b = scope.lookup(e.args[0].id) if e.args and isinstance(e.args[0], ast.Name) else None
        if len(e.args) != 1 or b is None or b.kind != "payload":
            raise cx.err("extract takes the payload argument of decode", e.span)
        return b.value
    if isinstance(e, ast.Call) and e.func == "concat":
        raise cx.err("concat is only allowed as `return concat(...)` in encode", e.span)
    if isinstance(e, ast.Call) and e.func in cx.fns:
        return cx.inline(cx, e, scope, ctx, name_hint)
    if isinstance(e, ast.Cond) and (
        _names_array(cx, e.then, scope) or _names_array(cx, e.other, scope)
    ):
        return _choice(cx, e, scope, ctx)
    if isinstance(e, ast.Name):
        b = scope.lookup(e.id)
        if b is not None and isinstance(b.value, Array | Tuple_) and b.kind != "payload":
            return b.value
    if isinstance(e, ast.Field):
        v = field(cx, e, scope, ctx)
        if v is not None:
            return v
    return scalar(cx, e, scope, ctx)


def array(cx: Elab, e: ast.Expr, scope: Scope, ctx: Ctx, what: str) -> Array:
    """An expression that must be an array (``what`` names the construct for errors)."""
    if isinstance(e, ast.Lambda):
        raise cx.err(f"{what} expects an array here, not a lambda", e.span)
    v = value(cx, e, scope, ctx)
    if not isinstance(v, Array):
        raise cx.err(f"{what} expects an array here, got a scalar", e.span)
    return v


def _names_array(cx: Elab, e: ast.Expr, scope: Scope) -> bool:
    """Whether ``e`` names an array (a let, var, state or fn parameter, a payload field) or is
    a ``?:`` with such a side."""
    if isinstance(e, ast.Cond):
        return _names_array(cx, e.then, scope) or _names_array(cx, e.other, scope)
    if isinstance(e, ast.Name):
        b = scope.lookup(e.id)
        return b is not None and isinstance(b.value, Array)
    if isinstance(e, ast.Field) and isinstance(e.base, ast.Name):
        b = scope.lookup(e.base.id)
        return (
            b is not None
            and b.kind == "payload"
            and isinstance(cx.payload_fields.get(e.name), Array)
        )
    return False


def _choice(cx: Elab, e: ast.Cond, scope: Scope, ctx: Ctx) -> Array:
    """``c ? a : b`` between two arrays of one type: ``c`` is a constant of the specialised
    program (parameters, consts, literals), so the choice is made here and what follows reads
    the chosen array itself."""
    c = scalar(cx, e.cond, scope, ctx)
    if c.dtype != BOOL:
        raise cx.err(f"condition must be bool, got {c.dtype}", e.cond.span)
    if not isinstance(c.expr, ir.Const):
        raise cx.err(
            "a `?:` between arrays chooses once, when the program is compiled: its condition "
            "must follow from the parameters alone (parameters, literals, consts not computed "
            "from `n`); to choose per element, write `map(n, i => c ? a[i] : b[i])`",
            e.cond.span,
        )
    sides: list[Array] = []
    for side in (e.then, e.other):
        if isinstance(side, ast.Number | ast.Bool | ast.Unary | ast.Binary):
            raise cx.err("this side of `?:` is a scalar and the other an array", side.span)
        if not _names_array(cx, side, scope):
            raise cx.err(
                "both sides of a `?:` between arrays must be arrays, each an array's name or "
                "a payload field (bind a computed array with `let` first)",
                side.span,
            )
        v = value(cx, side, scope, ctx)
        assert isinstance(v, Array)
        sides.append(v)
    a, b = (x.type for x in sides)
    if a.dtype != b.dtype or a.bits != b.bits:
        raise cx.err(
            f"the sides of `?:` are arrays of different element types: {a.describe()} and "
            f"{b.describe()}",
            e.span,
        )
    if not same_length(a.length, b.length):
        raise cx.err(
            f"the sides of `?:` are arrays of different lengths: {a.describe()} and {b.describe()}",
            e.span,
        )
    return sides[0] if c.expr.value else sides[1]


def field(cx: Elab, e: ast.Field, scope: Scope, ctx: Ctx) -> Value | None:
    """``payload.f`` or ``array.size``."""
    if isinstance(e.base, ast.Name):
        b = scope.lookup(e.base.id)
        if b is not None and b.kind == "payload":
            fields = cx.payload_fields
            if e.name not in fields:
                have = ", ".join(fields)
                raise cx.err(f"payload has no field `{e.name}` (fields: {have})", e.span)
            return fields[e.name]
    if e.name == "size":
        base = value(cx, e.base, scope, ctx)
        if isinstance(base, Array):
            return Scalar(base.type.length)
        raise cx.err("`.size` applies to arrays only", e.span)
    raise cx.err(f"unknown field `{e.name}` (arrays have `.size`)", e.span)


def scalar(cx: Elab, e: ast.Expr, scope: Scope, ctx: Ctx) -> Scalar:
    """An expression that must be a scalar, as IR (folded where its operands are constant)."""
    if isinstance(e, ast.Number):
        if e.is_float:  # beyond f32's range: an f64 literal, which an f32 context refuses
            return Scalar(float_literal(float(e.value)), True)
        return Scalar(ir.Const(int(e.value), I64), True)
    if isinstance(e, ast.Bool):
        return Scalar(ir.Const(e.value, BOOL))
    if isinstance(e, ast.Name):
        return _name(cx, e, scope)
    if isinstance(e, ast.Index):
        return _index(cx, e, scope, ctx)
    if isinstance(e, ast.Field):
        v = field(cx, e, scope, ctx)
        if isinstance(v, Array):
            raise cx.err(f"`{e.name}` is an array; index it", e.span)
        assert v is not None
        return v
    if isinstance(e, ast.Unary):
        return unary(cx, e.op, scalar(cx, e.operand, scope, ctx), e.span)
    if isinstance(e, ast.Binary):
        left = scalar(cx, e.left, scope, ctx)
        right = scalar(cx, e.right, scope, ctx)
        return binary(cx, e.op, left, right, e.span)
    if isinstance(e, ast.Cond):
        c = scalar(cx, e.cond, scope, ctx)
        if c.dtype != BOOL:
            raise cx.err(f"condition must be bool, got {c.dtype}", e.cond.span)
        a, b = unify(
            cx, scalar(cx, e.then, scope, ctx), scalar(cx, e.other, scope, ctx), e.span, "?:"
        )
        return Scalar(fold(ir.Select(c.expr, a.expr, b.expr, a.dtype)), a.lit and b.lit)
    if isinstance(e, ast.Call):
        return call(cx, e, scope, ctx)
    if isinstance(e, ast.Lambda):
        raise cx.err(
            "a lambda is only allowed as an argument of map, reduce, filter, topk, sort or scan",
            e.span,
        )
    raise cx.err("unsupported expression", getattr(e, "span", None))  # pragma: no cover


def _name(cx: Elab, e: ast.Name, scope: Scope) -> Scalar:
    b = scope.lookup(e.id)
    hidden = b is None or b.kind == "builtin"  # a state named `inf` hides the constant
    if hidden and e.id in cx.hidden_state:
        raise cx.err(
            f"state `{e.id}` is only available in encode (decode must be a pure function of "
            "the payload)",
            e.span,
        )
    if b is None:
        later = cx.declared.get(e.id)
        if later is not None and (later.line, later.col) > (e.span.line, e.span.col):
            raise cx.err(
                f"`{e.id}` is used before its declaration (line {later.line}); declarations "
                "are read in order: move it above this use",
                e.span,
            )
        raise cx.err(f"unknown name `{e.id}`{suggest(cx, e.id, scope)}", e.span)
    if isinstance(b.value, Array):
        raise cx.err(
            f"`{e.id}` is an array ({b.value.type.describe()}); index it like "
            f"`{e.id}[i]` or reduce it",
            e.span,
        )
    if isinstance(b.value, Tuple_):
        raise cx.err(f"`{e.id}` is the payload; read its fields like `{e.id}.x`", e.span)
    return b.value


def _index(cx: Elab, e: ast.Index, scope: Scope, ctx: Ctx) -> Scalar:
    arr = array(cx, e.base, scope, ctx, "indexing")
    idx = scalar(cx, e.index, scope, ctx)
    if not idx.dtype.is_int:
        raise cx.err(f"an index must be an integer, got {idx.dtype}", e.index.span)
    ix = idx.expr if idx.dtype == I64 else fold(ir.Cast(idx.expr, I64))
    if isinstance(ix, ir.Const) and ix.dtype != I64:
        ix = ir.Const(int(ix.value), I64)
    return Scalar(ir.Load(arr.name, ix, arr.type.dtype))


def unary(cx: Elab, sym: str, x: Scalar, span: Span) -> Scalar:
    """The prefix operator ``sym`` (``-``, ``!``, ``~``) applied to ``x``."""
    op = ops.UNARY_SYMBOLS[sym]
    no_storage(cx, x, span)
    if not op.accepts(x.dtype):
        raise cx.err(f"`{sym}` needs {_UNARY_NEEDS[op.operands]}, got {x.dtype}", span)
    return Scalar(fold(ir.Unary(op.name, x.expr, op.result_type(x.dtype))), x.lit)


def binary(cx: Elab, sym: str, left: Scalar, right: Scalar, span: Span) -> Scalar:
    """The infix operator ``sym`` (``+``, ``<<``, ``==``...) applied to ``left`` and ``right``;
    a literal operand adapts to the other."""
    op = ops.BINARY_SYMBOLS[sym]
    no_storage(cx, left, span)
    no_storage(cx, right, span)
    if op.operands == ops.SHIFT:
        return _shift(cx, op, sym, left, right, span)
    left, right = unify(cx, left, right, span, sym)
    dt = left.dtype
    if not op.accepts(dt):
        if op.operands == ops.ORDERED:
            raise cx.err(f"`{sym}` cannot compare bools", span)
        raise cx.err(f"`{sym}` needs {_BINARY_NEEDS[op.operands]}, got {dt}", span)
    lit = left.lit and right.lit and op.result == ops.SAME
    return Scalar(fold(ir.Binary(op.name, left.expr, right.expr, op.result_type(dt))), lit)


def _shift(cx: Elab, op: ops.OpDef, sym: str, left: Scalar, right: Scalar, span: Span) -> Scalar:
    """``<<`` / ``>>``: the result has the left operand's type, the count is converted to it."""
    if not (op.accepts(left.dtype) and op.accepts(right.dtype)):
        need = _BINARY_NEEDS[op.operands]
        raise cx.err(f"`{sym}` needs {need}, got {left.dtype} and {right.dtype}", span)
    if left.lit and not right.lit:
        left = coerce(cx, left, right.dtype, span)
    r = right.expr if right.dtype == left.dtype else fold(ir.Cast(right.expr, left.dtype))
    lit = left.lit and right.lit
    return Scalar(fold(ir.Binary(op.name, left.expr, r, op.result_type(left.dtype))), lit)


# scalar builtins: name -> elaboration from the call and an argument elaborator
_BUILTIN_CALLS: dict[str, Callable[[Elab, ast.Call, Callable[[ast.Expr], Scalar]], Scalar]] = {
    **dict.fromkeys(SCALAR_TYPES, conversion),
    **dict.fromkeys(MATH1, math1),
    **dict.fromkeys(BIT_BUILTINS, bits_call),
    **dict.fromkeys(MINMAX, minmax),
    "clamp": clamp,
}


def call(cx: Elab, e: ast.Call, scope: Scope, ctx: Ctx) -> Scalar:
    """A call in scalar position: a builtin, a host ``reduce``, or a user function (inlined)."""
    f = e.func

    def arg(a: ast.Expr) -> Scalar:
        return scalar(cx, a, scope, ctx)

    if f in _BUILTIN_CALLS:
        return _BUILTIN_CALLS[f](cx, e, arg)
    if f in RANDOM:
        return random_call(cx, e, arg, ctx)
    if f in PARALLEL:
        if f == "reduce" and ctx.host and not ctx.no_parallel:
            v = cx.parallel(cx, e, scope, ctx, "r", None, None)
            assert isinstance(v, Scalar)
            return v
        if not ctx.host or ctx.no_parallel:
            raise cx.err(
                f"`{f}` is a parallel operator; it cannot be used inside a lambda or fn",
                e.func_span,
            )
        raise cx.err(f"`{f}` returns an array; bind it with `let`", e.span)
    if f in ("concat", "extract"):
        raise cx.err(f"`{f}` is not allowed here", e.span)
    if f in cx.fns:
        v = cx.inline(cx, e, scope, ctx, f)
        if not isinstance(v, Scalar):
            raise cx.err(f"`{f}` returns an array; bind it with `let`", e.span)
        return v
    raise cx.err(f"unknown function `{f}`{suggest(cx, f, scope, call=True)}", e.func_span)
