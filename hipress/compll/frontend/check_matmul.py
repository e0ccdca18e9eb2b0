"""Elaboration of ``matmul(a, b, m, k, r)`` and ``matmul_at(a, b, m, k, r)``: a matrix product
of two f32 arrays, defined as a segment sum (so it has ``segreduce(sum, ...)``'s semantics on
every backend) and carrying its shape (:class:`~hipress.compll.ir.nodes.MatMul`) for backends
with a matrix-product kernel."""

from __future__ import annotations

from hipress.compll.frontend import ast
from hipress.compll.frontend.check_expr import array
from hipress.compll.frontend.check_types import size
from hipress.compll.frontend.scope import Array, Ctx, Elab, Scope
from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.fold import fold_deep
from hipress.compll.ir.types import BOOL, F32, I64, ArrayType

SIGS = {
    "matmul": "matmul(a, b, m, k, r): C (m x r) = A (m x k) B (k x r), f32 arrays, row-major",
    "matmul_at": "matmul_at(a, b, m, k, r): C (m x r) = A^T B, A stored k x m, B k x r, "
    "f32 arrays, row-major",
}


def _b(op: ops.OpDef, x: ir.Expr, y: ir.Expr) -> ir.Expr:
    return ir.Binary(op.name, x, y, BOOL if op is ops.LT else I64)


def matmul(cx: Elab, e: ast.Call, scope: Scope, ctx: Ctx, hint: str) -> Array:
    """``matmul``/``matmul_at``: element ``i * r + c`` of the result is the f32 sum (in f64, as
    ``reduce(sum, ...)``) over ``j < k`` of ``A[i, j] * B[j, c]``, each product rounded to
    f32; an element outside an array reads 0, as any index."""
    f, a = e.func, e.args
    if len(a) != 5:
        raise cx.err(f"usage: {SIGS[f]}", e.span)
    arrs = [array(cx, x, scope, ctx, f) for x in a[:2]]
    for x, arr in zip(a[:2], arrs, strict=True):
        if arr.type.dtype != F32 or arr.type.bits is not None:
            raise cx.err(f"{f} multiplies f32 arrays, got {arr.type.describe()}", x.span)
    m, k, r = (size(cx, x, scope, ctx) for x in a[2:])
    one = ir.Const(1, I64)
    kk = fold_deep(ir.Binary(ops.MAX.name, k, one, I64))  # the segment: k products, at least 1
    rr = fold_deep(ir.Binary(ops.MAX.name, r, one, I64))
    t = ir.Ref(cx.fresh("t"), I64)
    s, j, i, c = (ir.Ref(cx.fresh(x), I64) for x in ("s", "j", "i", "c"))
    lets = (
        (s.name, _b(ops.DIV, t, kk)),
        (j.name, _b(ops.SUB, t, _b(ops.MUL, s, kk))),
        (i.name, _b(ops.DIV, s, rr)),
        (c.name, _b(ops.SUB, s, _b(ops.MUL, i, rr))),
    )
    at = f == "matmul_at"
    ia = _b(ops.ADD, _b(ops.MUL, j, m), i) if at else _b(ops.ADD, _b(ops.MUL, i, k), j)
    ib = _b(ops.ADD, _b(ops.MUL, j, r), c)
    la, lb = ir.Load(arrs[0].name, ia, F32), ir.Load(arrs[1].name, ib, F32)
    prod = ir.Binary(ops.MUL.name, la, lb, F32)
    res = ir.Select(_b(ops.LT, j, k), prod, ir.Const(0.0, F32), F32)  # k = 0: zeros
    fn = ir.Lambda((t,), lets, res)
    out_len = fold_deep(ir.Binary(ops.MUL.name, m, r, I64))
    length = fold_deep(ir.Binary(ops.MUL.name, out_len, kk, I64))
    name = cx.fresh(hint)
    shape = ir.MatMul(arrs[0].name, arrs[1].name, m, k, r, at)
    ctx.ops.append(ir.SegReduce(name, ops.REDUCE_SUM.name, length, kk, fn, F32, shape))
    return Array(name, ArrayType(F32, out_len))
