"""Printing the IR (``hipress show --ir``): a readable listing of a program and its ops."""

from __future__ import annotations

from hipress.compll.ir.nodes import (
    Block,
    Filter,
    Lambda,
    Let,
    Map,
    Op,
    Program,
    Reduce,
    Scan,
    Scatter,
    SegReduce,
    Sort,
    StoreState,
    TopK,
    show_expr,
)
from hipress.compll.ir.types import ArrayType, DType


def _show_lambda(f: Lambda) -> str:
    ps = ", ".join(p.name for p in f.params)
    if not f.lets:
        return f"{ps} => {show_expr(f.result)}"
    body = "; ".join(f"let {n} = {show_expr(v)}" for n, v in f.lets)
    return f"{ps} => {{ {body}; {show_expr(f.result)} }}"


def _show_type(t: ArrayType | DType) -> str:
    return t.describe() if isinstance(t, ArrayType) else str(t)


def show_op(op: Op) -> str:
    if isinstance(op, Let):
        return f"{op.name}: {op.value.dtype} = {show_expr(op.value)}"
    if isinstance(op, Map):
        return f"{op.name}: {op.type.describe()} = map({_show_lambda(op.fn)})"
    if isinstance(op, Reduce):
        extra = ""
        if op.combine is not None and op.init is not None:
            extra = f", combine=({_show_lambda(op.combine)}), init={show_expr(op.init)}"
        return (
            f"{op.name}: {op.dtype} = reduce_{op.op}({show_expr(op.length)}, "
            f"{_show_lambda(op.fn)}{extra})"
        )
    if isinstance(op, SegReduce) and op.matmul is not None:
        mm = op.matmul
        dims = ", ".join(show_expr(x) for x in (mm.m, mm.k, mm.r))
        size = f"{show_expr(mm.m)} * {show_expr(mm.r)}"
        return f"{op.name}: {op.dtype}[{size}] = matmul{'_at' * mm.at}({mm.a}, {mm.b}, {dims})"
    if isinstance(op, SegReduce):
        return (
            f"{op.name}: {op.dtype}[ceil({show_expr(op.length)}/{show_expr(op.seg)})] = "
            f"segreduce_{op.op}({show_expr(op.seg)}, {_show_lambda(op.fn)})"
        )
    if isinstance(op, Filter):
        return (
            f"({op.idx}: i32[{show_expr(op.bound)}], {op.count}: i64) = filter("
            f"{show_expr(op.length)}, {_show_lambda(op.pred)})"
        )
    if isinstance(op, TopK):
        return (
            f"({op.idx}: i32[{show_expr(op.k)}], {op.count}: i64) = topk("
            f"{show_expr(op.length)}, key={_show_lambda(op.key)})"
        )
    if isinstance(op, Sort):
        return f"{op.name}: {op.dtype}[{show_expr(op.length)}] = sort({_show_lambda(op.key)})"
    if isinstance(op, Scan):
        return (
            f"{op.name}: {op.dtype}[{show_expr(op.length)}] = scan_{op.op}({_show_lambda(op.fn)})"
        )
    if isinstance(op, Scatter):
        base = op.base if op.base is not None else f"zeros({show_expr(op.length)})"
        return (
            f"{op.name}: {op.dtype}[{show_expr(op.length)}] = scatter_{op.mode}({base}, {op.idx}, "
            f"{op.vals}, count={show_expr(op.count)})"
        )
    if isinstance(op, Block):
        inner = "; ".join(show_op(x) for x in op.ops)
        return f"block({op.size}, {show_expr(op.length)}) {{ {inner} }}"
    if isinstance(op, StoreState):
        v = op.value if isinstance(op.value, str) else show_expr(op.value)
        return f"state.{op.state} <- {v}"
    raise TypeError(op)


def show_program(p: Program) -> str:
    """A readable listing of the whole program."""
    lines = [f"algorithm {p.name}  // {p.digest()[:16]}"]
    for k, v in p.params:
        lines.append(f"param {k} = {v!r}")
    for s in p.state:
        lines.append(f"state {s.name}: {_show_type(s.type)}")
    lines.append("payload {")
    lines += [f"  {f.name}: {_show_type(f.type)}" for f in p.payload]
    lines.append("}")
    lines.append(f"encode({p.encode.grad}: f32[n]) {{")
    lines += [f"  {show_op(op)}" for op in p.encode.ops]
    outs = ", ".join(v if isinstance(v, str) else show_expr(v) for v in p.encode.fields)
    lines.append(f"  return concat({outs})")
    lines.append("}")
    lines.append(f"decode({p.decode.payload}) {{")
    lines += [f"  {show_op(op)}" for op in p.decode.ops]
    lines.append(f"  return {p.decode.result}")
    lines.append("}")
    return "\n".join(lines)
