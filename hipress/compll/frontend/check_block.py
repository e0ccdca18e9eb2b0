"""Elaboration of ``block(B) { ... }``: a section of maps and per-block segment reductions that
run block by block (see :mod:`hipress.compll.ir.blocks` for the rule its reads follow).

The body is elaborated like any statements (in the enclosing scope: what it binds is visible
after it); then every op it emitted is checked (maps, ``segreduce`` with segments of exactly B, host ``let``s that read no section array,
which run before the section), its reads of the section's own arrays are masked, and the
section becomes one :class:`~hipress.compll.ir.nodes.Block` op."""

from __future__ import annotations

import re
from collections.abc import Callable

from hipress.compll.frontend import ast
from hipress.compll.frontend.check_expr import scalar
from hipress.compll.frontend.scope import Ctx, Elab, Scope
from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.blocks import defines, mask_lambda
from hipress.compll.ir.source import Span
from hipress.compll.ir.walk import lambda_exprs, op_exprs, walk

MAX_BLOCK = 1 << 16  # elements of one block (the C target keeps a few blocks per thread)

StmtFn = Callable[[Elab, ast.Stmt, Scope, Ctx], None]


class Section:
    """The section being elaborated: its block size, its first op's length and the
    arrays it defined so far (name -> per-block)."""

    def __init__(self, size: int, span: Span) -> None:
        self.size = size
        self.span = span
        self.length: ir.Expr | None = None
        self.local: dict[str, bool] = {}


def section(cx: Elab, s: ast.BlockSection, scope: Scope, ctx: Ctx, stmt: StmtFn) -> None:
    """``block(B) { body }`` in host code (not under ``if``, not inside another section)."""
    if not ctx.host or ctx.no_parallel:
        raise cx.err("`block(...)` runs in encode or decode, not inside a lambda or fn", s.span)
    if ctx.block is not None:
        raise cx.err(
            f"`block(...)` sections do not nest (this one is inside the block({ctx.block.size}) "
            f"at line {ctx.block.span.line})",
            s.span,
        )
    if ctx.in_branch:
        raise cx.err("`block(...)` cannot run under `if`", s.span)
    sec = Section(_size(cx, s.size, scope, ctx), s.span)
    outer = ctx.ops
    hoisted: list[ir.Op] = []
    inner: list[ir.Op] = []
    ctx.ops, ctx.block = [], sec
    try:
        for st in s.body.stmts:
            if isinstance(st, ast.Return):
                raise cx.err("`return` cannot stand in a `block(...)` section", st.span)
            start = len(ctx.ops)
            stmt(cx, st, scope, ctx)  # no scope of its own: its names live on after it
            for op in ctx.ops[start:]:
                _admit(cx, op, sec, st.span, hoisted, inner)
    finally:
        ctx.ops, ctx.block = outer, None
    if sec.length is None:
        raise cx.err("this `block(...)` section computes no map", s.span)
    outer += hoisted
    outer.append(ir.Block(sec.size, sec.length, tuple(inner)))


def _size(cx: Elab, e: ast.Expr, scope: Scope, ctx: Ctx) -> int:
    v = scalar(cx, e, scope, ctx)
    if not v.dtype.is_int or not isinstance(v.expr, ir.Const):
        what = f"an integer, got {v.dtype}" if not v.dtype.is_int else "not a constant"
        raise cx.err(
            "a block size must be an integer constant (literals, parameters and consts "
            f"computed from them; not n): this one is {what}",
            e.span,
        )
    b = int(v.expr.value)
    if not 1 <= b <= MAX_BLOCK:
        raise cx.err(f"a block size must lie in [1, {MAX_BLOCK}], got {b}", e.span)
    return b


def _admit(
    cx: Elab, op: ir.Op, sec: Section, span: Span, hoisted: list[ir.Op], inner: list[ir.Op]
) -> None:
    """Check one op the section's body emitted; mask its reads and keep it (host lets run
    before the section)."""
    if isinstance(op, ir.Let):
        for x in walk(op.value):
            if isinstance(x, ir.Load) and x.array in sec.local:
                raise cx.err(_host_read(x.array), span)
        hoisted.append(op)
        return
    if isinstance(op, ir.StoreState):  # pragma: no cover - refused where it is assigned
        raise cx.err("state cannot be assigned inside `block(...)`", span)
    if isinstance(op, ir.Map | ir.SegReduce):
        for e in op_exprs(op):
            for x in walk(e):
                if isinstance(x, ir.Load) and x.array in sec.local:
                    raise cx.err(_host_read(x.array), span)
        _shape(cx, op, sec, span)
        fn = mask_lambda(op.fn, sec.local, sec.size)
        _outside(cx, op.fn, sec, span)
        if isinstance(op, ir.Map):
            inner.append(ir.Map(op.name, op.type, fn))
        else:
            inner.append(ir.SegReduce(op.name, op.op, op.length, op.seg, fn, op.dtype))
        nm = defines(op)
        assert nm is not None
        sec.local[nm] = isinstance(op, ir.SegReduce)
        return
    raise cx.err(  # pragma: no cover - parallel() refuses the other operators first
        "only `map` and `segreduce` run inside `block(...)`", span
    )


def _shape(cx: Elab, op: ir.Map | ir.SegReduce, sec: Section, span: Span) -> None:
    if sec.length is None:
        sec.length = op.type.length if isinstance(op, ir.Map) else op.length
    if isinstance(op, ir.SegReduce) and (
        op.matmul is not None or op.seg != ir.Const(sec.size, op.seg.dtype)
    ):
        raise cx.err(
            f"a segment reduction inside `block({sec.size})` reduces whole blocks: write "
            f"`segreduce(op, {sec.size}, ...)`",
            span,
        )


def _outside(cx: Elab, fn: ir.Lambda, sec: Section, span: Span) -> None:
    """Refuse a read ``a[i + c]`` of a section array that is outside element ``i``'s block
    for every ``i`` (it would always read 0)."""
    p = fn.params[0].name
    for e in lambda_exprs(fn):
        for x in walk(e):
            if not (isinstance(x, ir.Load) and x.array in sec.local and not sec.local[x.array]):
                continue
            ix = x.index
            if not (isinstance(ix, ir.Binary) and ix.op in (ops.ADD.name, ops.SUB.name)):
                continue
            if not (isinstance(ix.a, ir.Ref) and ix.a.name == p and isinstance(ix.b, ir.Const)):
                continue
            if abs(int(ix.b.value)) >= sec.size:
                shown = re.sub(r"\.\d+\b", "", f"{x.array}[{ir.show_expr(ix)}]")
                raise cx.err(
                    f"`{shown}` reads another block than its element's "
                    f"(blocks of {sec.size}): inside `block(...)` such a read is always 0",
                    span,
                )


def _host_read(name: str) -> str:
    return (
        f"`{name}` is computed inside this `block(...)`: read it per element, in a map or "
        "segreduce of the section (or after the section)"
    )
