"""Elaboration of the data-parallel operators: map, reduce, segreduce, filter, topk, sort, scan,
scatter and gather. Each emits one host op and returns its value(s)."""

from __future__ import annotations

from hipress.compll.frontend import ast
from hipress.compll.frontend.check_expr import array, scalar, value
from hipress.compll.frontend.check_fn import lambda_, with_result
from hipress.compll.frontend.check_matmul import matmul
from hipress.compll.frontend.check_types import same_length, size
from hipress.compll.frontend.coerce import coerce
from hipress.compll.frontend.scope import Array, Ctx, Elab, Scalar, Scope, Tuple_, Value
from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.fold import fold_deep, segment_count
from hipress.compll.ir.source import CllTypeError
from hipress.compll.ir.types import BOOL, I32, I64, U8, ArrayType, DType

_SIGS = {
    "map": "map(len, i => value)",
    "reduce": "reduce(op, array) or reduce(op, len, i => value), op one of sum, min, max, "
    "absmax, any, all, count; or reduce((a, b) => ..., init, array)",
    "segreduce": "segreduce(op, seg, array) or segreduce(op, seg, len, i => value), op one of "
    "sum, min, max, absmax, any, all, count",
    "filter": "filter(bound, array) or filter(bound, len, i => condition)",
    "topk": "topk(k, array) or topk(k, len, i => key)",
    "sort": "sort(array) or sort(len, i => key)",
    "scan": "scan(op, array) or scan(op, len, i => value), op one of sum, min, max",
    "scatter": "scatter(base_or_len, idx, vals) or scatter(base_or_len, idx, vals, count)",
    "scatter_set": "scatter_set(base_or_len, idx, vals) or "
    "scatter_set(base_or_len, idx, vals, count)",
    "gather": "gather(array, idx)",
}


def parallel(
    cx: Elab,
    e: ast.Call,
    scope: Scope,
    ctx: Ctx,
    hint: str,
    expect: ArrayType | None,
    names: tuple[str, ...] | None,
) -> Value:
    """Parallel operator call ``e`` at the top level of encode or decode: its host op appended
    to ``ctx`` and its value returned (``hint``: the base of the result's SSA name; ``expect``:
    a map's declared array type; ``names``: the names a filter/topk result is unpacked into).
    """
    f = e.func
    if not ctx.host or ctx.no_parallel:
        raise cx.err(
            f"`{f}` is a parallel operator; it cannot be used inside a lambda or fn",
            e.func_span,
        )
    if ctx.in_branch:
        raise cx.err(
            "parallel operators cannot run under `if`; compute both sides and choose with "
            "`c ? a : b`",
            e.span,
        )
    if ctx.block is not None and f not in ("map", "segreduce"):
        raise cx.err(
            f"`{f}` cannot run inside `block({ctx.block.size})`: only `map` and "
            f"`segreduce(op, {ctx.block.size}, ...)` are block-local",
            e.func_span,
        )
    if f == "map":
        return _map(cx, e, scope, ctx, hint, expect)
    if f == "reduce":
        return reduce_(cx, e, scope, ctx, hint)
    if f == "segreduce":
        return segreduce(cx, e, scope, ctx, hint)
    if f in ("filter", "topk"):
        return _select(cx, e, scope, ctx, names)
    if f == "sort":
        length, fn = source(cx, e, e.args, scope, ctx)
        dt = fn.result.dtype
        numeric(cx, dt, e.args[-1], "sort keys")
        name = cx.fresh(hint)
        ctx.ops.append(ir.Sort(name, length, fn, dt))
        return Array(name, ArrayType(dt, length))
    if f == "scan":
        return _scan(cx, e, scope, ctx, hint)
    if f in ("scatter", "scatter_set"):
        return scatter(cx, e, scope, ctx, hint)
    if f == "gather":
        return _gather(cx, e, scope, ctx, hint)
    if f in ("matmul", "matmul_at"):
        return matmul(cx, e, scope, ctx, hint)
    raise usage(cx, e)  # pragma: no cover


def _map(
    cx: Elab, e: ast.Call, scope: Scope, ctx: Ctx, hint: str, expect: ArrayType | None
) -> Array:
    """``map(len, i => value)``; with a declared type the values are converted to its element
    type, or masked to its width when it is packed."""
    a = e.args
    if len(a) != 2:
        raise usage(cx, e)
    length = size(cx, a[0], scope, ctx)
    fn = lambda_(cx, a[1], (I64,), scope, ctx, "map")
    rv = Scalar(fn.result)
    bits = None
    if expect is not None:
        if not same_length(expect.length, length):
            raise cx.err(
                f"map length {ir.show_expr(length)} does not match the declared "
                f"{expect.describe()}",
                a[0].span,
            )
        if expect.bits is not None:
            if not rv.dtype.is_int:
                raise cx.err(f"a packed array needs integer values, got {rv.dtype}", a[1].span)
            bits = expect.bits
            mask = ir.Const((1 << bits) - 1, U8)
            val = ir.Cast(rv.expr, U8) if rv.dtype != U8 else rv.expr
            fn = with_result(fn, fold_deep(ir.Binary(ops.BAND.name, val, mask, U8)))
        else:
            fn = with_result(fn, coerce(cx, rv, expect.dtype, a[1].span).expr)
    dt = fn.result.dtype
    name = cx.fresh(hint)
    t = ArrayType(dt, length, bits)
    ctx.ops.append(ir.Map(name, t, fn))
    return Array(name, t)


def _select(cx: Elab, e: ast.Call, scope: Scope, ctx: Ctx, names: tuple[str, ...] | None) -> Tuple_:
    """``filter(bound, ...)`` or ``topk(k, ...)``: (indices, count)."""
    f, a = e.func, e.args
    if len(a) not in (2, 3):
        raise usage(cx, e)
    bound = size(cx, a[0], scope, ctx)
    length, fn = source(cx, e, a[1:], scope, ctx)
    dt = fn.result.dtype
    if f == "filter" and dt != BOOL:
        raise cx.err(f"filter needs a bool condition, got {dt}", a[-1].span)
    if f == "topk":
        numeric(cx, dt, a[-1], "topk keys")
    idx_name = cx.fresh(names[0] if names else "idx")
    cnt_name = cx.fresh(names[1] if names and len(names) > 1 else "count")
    if f == "filter":
        ctx.ops.append(ir.Filter(idx_name, cnt_name, length, bound, fn))
    else:
        ctx.ops.append(ir.TopK(idx_name, cnt_name, length, bound, fn))
    return Tuple_((Array(idx_name, ArrayType(I32, bound)), Scalar(ir.Ref(cnt_name, I64))))


def _scan(cx: Elab, e: ast.Call, scope: Scope, ctx: Ctx, hint: str) -> Array:
    """``scan(op, ...)``: inclusive prefix sums (integers in i64), minima or maxima."""
    op = ops.REDUCE[op_name(cx, e, ops.SCAN_OPS)]
    length, fn = source(cx, e, e.args[1:], scope, ctx)
    dt = fn.result.dtype
    numeric(cx, dt, e.args[-1], "scan")
    out = op.result_type(dt)
    if out != dt:
        fn = with_result(fn, ir.Cast(fn.result, out))
    name = cx.fresh(hint)
    ctx.ops.append(ir.Scan(name, op.name, length, fn, out))
    return Array(name, ArrayType(out, length))


def _gather(cx: Elab, e: ast.Call, scope: Scope, ctx: Ctx, hint: str) -> Array:
    """``gather(array, idx)``: ``array[idx[j]]`` for each j (a map)."""
    a = e.args
    if len(a) != 2:
        raise usage(cx, e)
    src = array(cx, a[0], scope, ctx, "gather")
    idx = array(cx, a[1], scope, ctx, "gather")
    if not idx.type.dtype.is_int:
        raise cx.err("gather indices must be integers", a[1].span)
    j = ir.Ref(cx.fresh("j"), I64)
    ix = ir.Cast(ir.Load(idx.name, j, idx.type.dtype), I64)
    fn = ir.Lambda((j,), (), ir.Load(src.name, ix, src.type.dtype))
    name = cx.fresh(hint)
    t = ArrayType(src.type.dtype, idx.type.length)
    ctx.ops.append(ir.Map(name, t, fn))
    return Array(name, t)


def usage(cx: Elab, e: ast.Call) -> CllTypeError:
    """The error showing the operator's forms."""
    return cx.err(f"usage: {_SIGS[e.func]}", e.span)


def numeric(cx: Elab, dt: DType, at: ast.Expr, what: str) -> None:
    """Raise at ``at`` unless ``dt`` is a computing number type."""
    if not (dt.is_int or dt.is_float) or dt.storage_only:
        raise cx.err(f"{what} must be numbers (f32, f64 or integers), got {dt}", at.span)


def op_name(cx: Elab, e: ast.Call, allowed: tuple[str, ...]) -> str:
    """The operator name ``e`` takes first (one of ``allowed``)."""
    if not e.args or not isinstance(e.args[0], ast.Name) or e.args[0].id not in allowed:
        span = e.args[0].span if e.args else e.span
        raise cx.err(f"`{e.func}` needs an operator first, one of {', '.join(allowed)}", span)
    return e.args[0].id


def source(
    cx: Elab, e: ast.Call, args: tuple[ast.Expr, ...], scope: Scope, ctx: Ctx
) -> tuple[ir.Expr, ir.Lambda]:
    """``array`` or ``len, i => value`` -> (length, per-element lambda)."""
    if len(args) == 1:
        arr = array(cx, args[0], scope, ctx, e.func)
        i = ir.Ref(cx.fresh("i"), I64)
        return arr.type.length, ir.Lambda((i,), (), ir.Load(arr.name, i, arr.type.dtype))
    if len(args) == 2:
        length = size(cx, args[0], scope, ctx)
        return length, lambda_(cx, args[1], (I64,), scope, ctx, e.func)
    raise usage(cx, e)


def reduce_(cx: Elab, e: ast.Call, scope: Scope, ctx: Ctx, hint: str) -> Value:
    """``reduce(op, ...)`` or ``reduce((a, b) => ..., init, ...)``: a host scalar."""
    a = e.args
    if not a:
        raise usage(cx, e)
    combine = init = None
    if isinstance(a[0], ast.Lambda):
        if len(a) < 3:
            raise usage(cx, e)
        length, fn = source(cx, e, a[2:], scope, ctx)
        dt = fn.result.dtype
        if dt != BOOL:
            numeric(cx, dt, a[-1], "reduce")
        init = coerce(cx, scalar(cx, a[1], scope, ctx), dt, a[1].span).expr
        combine = lambda_(cx, a[0], (dt, dt), scope, ctx, "reduce")
        cr = Scalar(combine.result)
        combine = with_result(combine, coerce(cx, cr, dt, a[0].span).expr)
        op = ops.REDUCE_CUSTOM.name
    else:
        op = op_name(cx, e, ops.REDUCE_OPS)
        length, fn = source(cx, e, a[1:], scope, ctx)
        fn, dt = reduce_type(cx, e, op, fn)
    name = cx.fresh(hint)
    ctx.ops.append(ir.Reduce(name, op, length, fn, dt, combine, init))
    return Scalar(ir.Ref(name, dt))


def reduce_type(cx: Elab, e: ast.Call, op: str, fn: ir.Lambda) -> tuple[ir.Lambda, DType]:
    """The per-element lambda (values widened where the operator's result is wider) and the
    result type of reduction ``op`` of ``fn``'s values."""
    o = ops.REDUCE[op]
    dt = fn.result.dtype
    if o.operands == ops.BOOLS:
        if dt != BOOL:
            raise cx.err(f"{e.func}({op}, ...) needs bool values, got {dt}", e.span)
        return fn, o.result_type(dt)
    numeric(cx, dt, e.args[-1], f"{e.func}({op}, ...) values")
    out = o.result_type(dt)
    if out != dt:
        fn = with_result(fn, ir.Cast(fn.result, out))
    return fn, out


def segreduce(cx: Elab, e: ast.Call, scope: Scope, ctx: Ctx, hint: str) -> Value:
    """``segreduce(op, seg, ...)``: one result per segment of ``seg`` elements."""
    if len(e.args) not in (3, 4):
        raise usage(cx, e)
    op = op_name(cx, e, ops.REDUCE_OPS)
    seg = size(cx, e.args[1], scope, ctx)
    if isinstance(seg, ir.Const) and int(seg.value) < 1:
        raise cx.err("segment length must be >= 1", e.args[1].span)
    length, fn = source(cx, e, e.args[2:], scope, ctx)
    fn, dt = reduce_type(cx, e, op, fn)
    name = cx.fresh(hint)
    ctx.ops.append(ir.SegReduce(name, op, length, seg, fn, dt))
    return Array(name, ArrayType(dt, segment_count(length, seg)))


def scatter(cx: Elab, e: ast.Call, scope: Scope, ctx: Ctx, hint: str) -> Value:
    """``scatter(base_or_len, idx, vals[, count])``: ``base`` (or zeros) plus each value added
    at its index; ``scatter_set``: each value stored at its index, the last j winning."""
    a, f = e.args, e.func
    if len(a) not in (3, 4):
        raise usage(cx, e)
    base_v = value(cx, a[0], scope, ctx)
    idx = array(cx, a[1], scope, ctx, f)
    vals = array(cx, a[2], scope, ctx, f)
    if not idx.type.dtype.is_int:
        raise cx.err(f"{f} indices must be integers", a[1].span)
    if not same_length(idx.type.length, vals.type.length):
        raise cx.err(
            f"{f} indices ({idx.type.describe()}) and values ({vals.type.describe()}) "
            "differ in length",
            e.span,
        )
    dt = vals.type.dtype
    numeric(cx, dt, a[2], f"{f} values")
    if isinstance(base_v, Array):
        if base_v.type.dtype != dt or base_v.type.bits is not None:
            raise cx.err(f"{f} base is {base_v.type.describe()} but the values are {dt}", a[0].span)
        base, length = base_v.name, base_v.type.length
    else:
        base, length = None, size(cx, a[0], scope, ctx)
    if len(a) == 4:
        c = scalar(cx, a[3], scope, ctx)
        if not c.dtype.is_int:
            raise cx.err(f"{f} count must be an integer, got {c.dtype}", a[3].span)
        count = (
            coerce(cx, c, I64, a[3].span).expr
            if c.lit
            else (c.expr if c.dtype == I64 else ir.Cast(c.expr, I64))
        )
    else:
        count = idx.type.length
    name = cx.fresh(hint)
    mode = "set" if f == "scatter_set" else "add"
    ctx.ops.append(ir.Scatter(name, length, base, idx.name, vals.name, count, dt, mode))
    return Array(name, ArrayType(dt, length))
