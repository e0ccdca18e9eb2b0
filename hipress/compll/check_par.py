"""Elaboration of the data-parallel operators: map, reduce, filter, topk, sort, scan, scatter,
gather (a mixin of the body checker)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hipress.compll import ast, ir
from hipress.compll.types import BOOL, I32, I64, U8, ArrayType, DType

if TYPE_CHECKING:
    from hipress.compll.check_body import Scope, Value, _Ctx

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
    "gather": "gather(array, idx)",
}


def fold_deep(e: ir.Expr) -> ir.Expr:
    from hipress.compll.check_body import fold_deep as _fd

    return _fd(e)


def _same_length(a: ir.Expr, b: ir.Expr) -> bool:
    from hipress.compll.check_body import same_length

    return same_length(a, b)


class ParallelChecker:
    """Parallel operators; each emits one host op and returns its value(s)."""

    def _parallel(
        self,
        e: ast.Call,
        scope: Scope,
        ctx: _Ctx,
        hint: str,
        expect: ArrayType | None,
        names: tuple[str, ...] | None,
    ) -> Value:
        from hipress.compll.check_body import Array, Scalar, Tuple_

        f = e.func
        if not ctx.host or ctx.no_parallel:
            raise self.err(
                f"`{f}` is a parallel operator; it cannot be used inside a lambda or fn",
                e.func_span,
            )
        if ctx.in_branch:
            raise self.err(
                "parallel operators cannot run under `if`; compute both sides and choose with "
                "`c ? a : b`",
                e.span,
            )
        a = e.args
        if f == "map":
            if len(a) != 2:
                raise self._usage(e)
            length = self._size(a[0], scope, ctx)
            fn = self._lambda(a[1], (I64,), scope, ctx, "map")
            rv = Scalar(fn.result)
            bits = None
            if expect is not None:
                if not _same_length(expect.length, length):
                    raise self.err(
                        f"map length {ir.show_expr(length)} does not match the declared "
                        f"{expect.describe()}",
                        a[0].span,
                    )
                if expect.bits is not None:
                    if not rv.dtype.is_int:
                        raise self.err(
                            f"a packed array needs integer values, got {rv.dtype}", a[1].span
                        )
                    bits = expect.bits
                    mask = ir.Const((1 << bits) - 1, U8)
                    val = ir.Cast(rv.expr, U8) if rv.dtype != U8 else rv.expr
                    fn = self._with_result(fn, fold_deep(ir.Binary("band", val, mask, U8)))
                else:
                    fn = self._with_result(fn, self._coerce(rv, expect.dtype, a[1].span).expr)
            dt = fn.result.dtype
            name = self.fresh(hint)
            t = ArrayType(dt, length, bits)
            ctx.ops.append(ir.Map(name, t, fn))
            return Array(name, t)
        if f == "reduce":
            return self._reduce(e, scope, ctx, hint)
        if f == "segreduce":
            return self._segreduce(e, scope, ctx, hint)
        if f in ("filter", "topk"):
            if len(a) not in (2, 3):
                raise self._usage(e)
            bound = self._size(a[0], scope, ctx)
            length, fn = self._source(e, a[1:], scope, ctx)
            dt = fn.result.dtype
            if f == "filter" and dt != BOOL:
                raise self.err(f"filter needs a bool condition, got {dt}", a[-1].span)
            if f == "topk":
                self._numeric(dt, a[-1], "topk keys")
            idx_name = self.fresh(names[0] if names else "idx")
            cnt_name = self.fresh(names[1] if names and len(names) > 1 else "count")
            if f == "filter":
                ctx.ops.append(ir.Filter(idx_name, cnt_name, length, bound, fn))
            else:
                ctx.ops.append(ir.TopK(idx_name, cnt_name, length, bound, fn))
            return Tuple_((Array(idx_name, ArrayType(I32, bound)), Scalar(ir.Ref(cnt_name, I64))))
        if f == "sort":
            length, fn = self._source(e, a, scope, ctx)
            dt = fn.result.dtype
            self._numeric(dt, a[-1], "sort keys")
            name = self.fresh(hint)
            ctx.ops.append(ir.Sort(name, length, fn, dt))
            return Array(name, ArrayType(dt, length))
        if f == "scan":
            op = self._op_name(e, ("sum", "min", "max"))
            length, fn = self._source(e, a[1:], scope, ctx)
            dt = fn.result.dtype
            self._numeric(dt, a[-1], "scan")
            if op == "sum" and dt.is_int:
                fn = self._with_result(fn, ir.Cast(fn.result, I64) if dt != I64 else fn.result)
                dt = I64
            name = self.fresh(hint)
            ctx.ops.append(ir.Scan(name, op, length, fn, dt))
            return Array(name, ArrayType(dt, length))
        if f == "scatter":
            return self._scatter(e, scope, ctx, hint)
        if f == "gather":
            if len(a) != 2:
                raise self._usage(e)
            src = self._array(a[0], scope, ctx, "gather")
            idx = self._array(a[1], scope, ctx, "gather")
            if not idx.type.dtype.is_int:
                raise self.err("gather indices must be integers", a[1].span)
            j = ir.Ref(self.fresh("j"), I64)
            ix = ir.Cast(ir.Load(idx.name, j, idx.type.dtype), I64)
            fn = ir.Lambda((j,), (), ir.Load(src.name, ix, src.type.dtype))
            name = self.fresh(hint)
            t = ArrayType(src.type.dtype, idx.type.length)
            ctx.ops.append(ir.Map(name, t, fn))
            return Array(name, t)
        raise self._usage(e)  # pragma: no cover

    def _usage(self, e: ast.Call):
        return self.err(f"usage: {_SIGS[e.func]}", e.span)

    def _numeric(self, dt: DType, at: ast.Expr, what: str) -> None:
        if not (dt.is_int or dt.is_float) or dt.storage_only:
            raise self.err(f"{what} must be numbers (f32, f64 or integers), got {dt}", at.span)

    def _op_name(self, e: ast.Call, allowed: tuple[str, ...]) -> str:
        if not e.args or not isinstance(e.args[0], ast.Name) or e.args[0].id not in allowed:
            span = e.args[0].span if e.args else e.span
            raise self.err(f"`{e.func}` needs an operator first, one of {', '.join(allowed)}", span)
        return e.args[0].id

    def _source(
        self, e: ast.Call, args: tuple[ast.Expr, ...], scope: Scope, ctx: _Ctx
    ) -> tuple[ir.Expr, ir.Lambda]:
        """``array`` or ``len, i => value`` -> (length, per-element lambda)."""
        if len(args) == 1:
            arr = self._array(args[0], scope, ctx, e.func)
            i = ir.Ref(self.fresh("i"), I64)
            return arr.type.length, ir.Lambda((i,), (), ir.Load(arr.name, i, arr.type.dtype))
        if len(args) == 2:
            length = self._size(args[0], scope, ctx)
            return length, self._lambda(args[1], (I64,), scope, ctx, e.func)
        raise self._usage(e)

    def _reduce(self, e: ast.Call, scope: Scope, ctx: _Ctx, hint: str) -> Value:
        from hipress.compll.check_body import REDUCE_OPS, Scalar

        a = e.args
        if not a:
            raise self._usage(e)
        combine = init = None
        if isinstance(a[0], ast.Lambda):
            if len(a) < 3:
                raise self._usage(e)
            length, fn = self._source(e, a[2:], scope, ctx)
            dt = fn.result.dtype
            if dt != BOOL:
                self._numeric(dt, a[-1], "reduce")
            init = self._coerce(self._scalar(a[1], scope, ctx), dt, a[1].span).expr
            combine = self._lambda(a[0], (dt, dt), scope, ctx, "reduce")
            cr = Scalar(combine.result)
            combine = self._with_result(combine, self._coerce(cr, dt, a[0].span).expr)
            op = "custom"
        else:
            op = self._op_name(e, REDUCE_OPS)
            length, fn = self._source(e, a[1:], scope, ctx)
            fn, dt = self._reduce_type(e, op, fn)
        name = self.fresh(hint)
        ctx.ops.append(ir.Reduce(name, op, length, fn, dt, combine, init))
        return Scalar(ir.Ref(name, dt))

    def _reduce_type(self, e: ast.Call, op: str, fn: ir.Lambda) -> tuple[ir.Lambda, DType]:
        dt = fn.result.dtype
        if op in ("any", "all", "count"):
            if dt != BOOL:
                raise self.err(f"{e.func}({op}, ...) needs bool values, got {dt}", e.span)
            return fn, (BOOL if op != "count" else I64)
        self._numeric(dt, e.args[-1], f"{e.func}({op}, ...) values")
        if op == "sum" and dt.is_int:
            fn = self._with_result(fn, ir.Cast(fn.result, I64) if dt != I64 else fn.result)
            dt = I64
        return fn, dt

    def _segreduce(self, e: ast.Call, scope: Scope, ctx: _Ctx, hint: str) -> Value:
        from hipress.compll.check_body import REDUCE_OPS, Array

        if len(e.args) not in (3, 4):
            raise self._usage(e)
        op = self._op_name(e, REDUCE_OPS)
        seg = self._size(e.args[1], scope, ctx)
        if isinstance(seg, ir.Const) and int(seg.value) < 1:
            raise self.err("segment length must be >= 1", e.args[1].span)
        length, fn = self._source(e, e.args[2:], scope, ctx)
        fn, dt = self._reduce_type(e, op, fn)
        name = self.fresh(hint)
        ctx.ops.append(ir.SegReduce(name, op, length, seg, fn, dt))
        # ceil(length / seg) with seg >= 1
        one = ir.Const(1, I64)
        segs = ir.Binary(
            "div",
            ir.Binary("sub", ir.Binary("add", length, seg, I64), one, I64),
            ir.Binary("max", seg, one, I64),
            I64,
        )
        return Array(name, ArrayType(dt, fold_deep(segs)))

    def _scatter(self, e: ast.Call, scope: Scope, ctx: _Ctx, hint: str) -> Value:
        from hipress.compll.check_body import Array

        a = e.args
        if len(a) not in (3, 4):
            raise self._usage(e)
        base_v = self._value(a[0], scope, ctx)
        idx = self._array(a[1], scope, ctx, "scatter")
        vals = self._array(a[2], scope, ctx, "scatter")
        if not idx.type.dtype.is_int:
            raise self.err("scatter indices must be integers", a[1].span)
        if not _same_length(idx.type.length, vals.type.length):
            raise self.err(
                f"scatter indices ({idx.type.describe()}) and values ({vals.type.describe()}) "
                "differ in length",
                e.span,
            )
        dt = vals.type.dtype
        self._numeric(dt, a[2], "scatter values")
        if isinstance(base_v, Array):
            if base_v.type.dtype != dt or base_v.type.bits is not None:
                raise self.err(
                    f"scatter base is {base_v.type.describe()} but the values are {dt}", a[0].span
                )
            base, length = base_v.name, base_v.type.length
        else:
            base, length = None, self._size(a[0], scope, ctx)
        if len(a) == 4:
            c = self._scalar(a[3], scope, ctx)
            if not c.dtype.is_int:
                raise self.err(f"scatter count must be an integer, got {c.dtype}", a[3].span)
            count = (
                self._coerce(c, I64, a[3].span).expr
                if c.lit
                else (c.expr if c.dtype == I64 else ir.Cast(c.expr, I64))
            )
        else:
            count = idx.type.length
        name = self.fresh(hint)
        ctx.ops.append(ir.Scatter(name, length, base, idx.name, vals.name, count, dt))
        return Array(name, ArrayType(dt, length))
