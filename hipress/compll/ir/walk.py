"""IR traversal shared by the planner passes and the renderers: an expression's children, all
of its sub-expressions, a lambda's expressions, and an op's lambdas and host expressions."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from hipress.compll.ir import nodes as ir


def children(e: ir.Expr) -> tuple[ir.Expr, ...]:
    if isinstance(e, ir.Unary | ir.Cast):
        return (e.x,)
    if isinstance(e, ir.Binary):
        return (e.a, e.b)
    if isinstance(e, ir.Select):
        return (e.cond, e.a, e.b)
    if isinstance(e, ir.Load):
        return (e.index,)
    if isinstance(e, ir.Rand):
        return (e.counter,)
    return ()


def walk(e: ir.Expr) -> Iterator[ir.Expr]:
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        stack.extend(children(x))


def lambda_exprs(fn: ir.Lambda) -> Iterator[ir.Expr]:
    for _, v in fn.lets:
        yield v
    yield fn.result


def op_lambdas(op: ir.Op) -> tuple[ir.Lambda, ...]:
    if isinstance(op, ir.Block):
        return tuple(fn for x in op.ops for fn in op_lambdas(x))
    if isinstance(op, ir.Map | ir.Reduce | ir.SegReduce | ir.Scan):
        extra = (op.combine,) if isinstance(op, ir.Reduce) and op.combine is not None else ()
        return (op.fn, *extra)
    if isinstance(op, ir.Filter):
        return (op.pred,)
    if isinstance(op, ir.TopK | ir.Sort):
        return (op.key,)
    return ()


def op_exprs(op: ir.Op) -> tuple[ir.Expr, ...]:
    """Host expressions of an op (lengths, counts, let values, reduce init)."""
    if isinstance(op, ir.Block):
        return (op.length, *(e for x in op.ops for e in op_exprs(x)))
    if isinstance(op, ir.Let):
        return (op.value,)
    if isinstance(op, ir.Map):
        return (op.type.length,)
    if isinstance(op, ir.Reduce):
        return (op.length,) + ((op.init,) if op.init is not None else ())
    if isinstance(op, ir.SegReduce):
        return (op.length, op.seg)
    if isinstance(op, ir.Filter):
        return (op.length, op.bound)
    if isinstance(op, ir.TopK):
        return (op.length, op.k)
    if isinstance(op, ir.Sort | ir.Scan):
        return (op.length,)
    if isinstance(op, ir.Scatter):
        return (op.length, op.count)
    if isinstance(op, ir.StoreState) and not isinstance(op.value, str):
        return (op.value,)
    return ()


def matmul_operands(ops: Sequence[ir.Op]) -> set[str]:
    """The arrays some ``matmul`` of ``ops`` multiplies (stored, so its kernel reads memory)."""
    return {
        x for op in ops if isinstance(op, ir.SegReduce) and op.matmul is not None
        for x in (op.matmul.a, op.matmul.b)
    }  # fmt: skip
