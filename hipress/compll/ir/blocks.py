"""Block-local sections (:class:`~hipress.compll.ir.nodes.Block`): the masked reads that define
them, the program without them (for targets that run a section as ordinary passes) and the
arrays a section hands to the code after it.

Inside a section of block size B, element ``i`` of a map (or of a segment reduction's source)
reads an array the section defined at index ``j`` as ``a[j]`` only when ``j`` lies in ``i``'s
aligned block (``j >= 0`` and ``j / B == i / B``), and a per-block array (a segment reduction
of the section) only at ``j == i / B``; anywhere else it reads 0. The checker writes that rule
into the IR as a select on the index (``j`` or -1, which reads 0), so every target that runs
the ops as they stand computes the definition; the C target recognises :func:`unmask` and runs
each block in cache instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.types import BOOL, I64, DType
from hipress.compll.ir.walk import op_exprs, op_lambdas, walk

Rewrite = Callable[[ir.Expr], ir.Expr | None]


def rewrite(e: ir.Expr, f: Rewrite) -> ir.Expr:
    """``e`` with every sub-expression ``x`` for which ``f(x)`` is not None replaced by it
    (children first)."""
    if isinstance(e, ir.Unary):
        e = ir.Unary(e.op, rewrite(e.x, f), e.dtype)
    elif isinstance(e, ir.Cast):
        e = ir.Cast(rewrite(e.x, f), e.dtype)
    elif isinstance(e, ir.Binary):
        e = ir.Binary(e.op, rewrite(e.a, f), rewrite(e.b, f), e.dtype)
    elif isinstance(e, ir.Select):
        e = ir.Select(rewrite(e.cond, f), rewrite(e.a, f), rewrite(e.b, f), e.dtype)
    elif isinstance(e, ir.Load):
        e = ir.Load(e.array, rewrite(e.index, f), e.dtype)
    elif isinstance(e, ir.Rand):
        e = ir.Rand(e.kind, rewrite(e.counter, f), e.stream, e.dtype)
    got = f(e)
    return e if got is None else got


def _b(op: str, a: ir.Expr, b: ir.Expr, dt: DType) -> ir.Binary:
    return ir.Binary(op, a, b, dt)


def mask(index: ir.Expr, elem: ir.Ref, size: int, per_block: bool) -> ir.Expr:
    """The masked index of a read from element ``elem``: ``index`` where the rule allows the
    read, else -1 (which reads 0)."""
    dt = index.dtype
    j = index if dt == I64 else ir.Cast(index, I64)
    blk = _b(ops.DIV.name, elem, ir.Const(size, I64), I64)
    if per_block:
        ok: ir.Expr = _b(ops.EQ.name, j, blk, BOOL)
    else:
        ok = _b(
            ops.AND.name,
            _b(ops.GE.name, j, ir.Const(0, I64), BOOL),
            _b(ops.EQ.name, _b(ops.DIV.name, j, ir.Const(size, I64), I64), blk, BOOL),
            BOOL,
        )
    return ir.Select(ok, j, ir.Const(-1, I64), I64)


def unmask(index: ir.Expr) -> ir.Expr:
    """The index a :func:`mask` was made from (``index`` itself if it is not one)."""
    if isinstance(index, ir.Select) and index.b == ir.Const(-1, I64):
        return index.a.x if isinstance(index.a, ir.Cast) else index.a
    return index


def mask_lambda(fn: ir.Lambda, local: dict[str, bool], size: int) -> ir.Lambda:
    """``fn`` (run per element, its parameter the element's index) with every read of a
    section array in ``local`` (name -> whether it is per-block) masked."""
    elem = fn.params[0]

    def f(x: ir.Expr) -> ir.Expr | None:
        if isinstance(x, ir.Load) and x.array in local:
            per = local[x.array]
            if x.index == (_b(ops.DIV.name, elem, ir.Const(size, I64), I64) if per else elem):
                return None  # the element's own block: always allowed
            return ir.Load(x.array, mask(x.index, elem, size, local[x.array]), x.dtype)
        return None

    lets = tuple((n, rewrite(v, f)) for n, v in fn.lets)
    return ir.Lambda(fn.params, lets, rewrite(fn.result, f))


def defines(op: ir.Op) -> str | None:
    """The array a section's op defines."""
    return op.name if isinstance(op, ir.Map | ir.SegReduce) else None


def flatten(ops_: Iterable[ir.Op]) -> tuple[ir.Op, ...]:
    """``ops_`` with every section replaced by its ops (the same values)."""
    out: list[ir.Op] = []
    for op in ops_:
        out += list(op.ops) if isinstance(op, ir.Block) else [op]
    return tuple(out)


def flatten_program(prog: ir.Program) -> ir.Program:
    """``prog`` without sections (the same object when it has none)."""
    if not any(isinstance(op, ir.Block) for op in (*prog.encode.ops, *prog.decode.ops)):
        return prog
    enc = ir.Encode(prog.encode.grad, flatten(prog.encode.ops), prog.encode.fields)
    dec = ir.Decode(prog.decode.payload, flatten(prog.decode.ops), prog.decode.result)
    return ir.Program(prog.name, prog.doc, prog.params, prog.state, prog.payload, enc, dec)


def reads(op: ir.Op) -> set[str]:
    """The arrays and scalars ``op`` reads (scatter operands and stored arrays included)."""
    out: set[str] = set()
    exprs = [e for fn in op_lambdas(op) for e in (*(v for _, v in fn.lets), fn.result)]
    for e in (*exprs, *op_exprs(op)):
        for x in walk(e):
            if isinstance(x, ir.Load):
                out.add(x.array)
            elif isinstance(x, ir.Ref):
                out.add(x.name)
    if isinstance(op, ir.Scatter):
        out |= {op.idx, op.vals} | ({op.base} if op.base is not None else set())
    if isinstance(op, ir.StoreState) and isinstance(op.value, str):
        out.add(op.value)
    return out


def outs(block: ir.Block, later: Iterable[ir.Op], sinks: Iterable[str]) -> tuple[str, ...]:
    """The arrays ``block`` defines that the ``later`` ops or ``sinks`` (payload fields, new
    state, a decode result) read: what it must store."""
    used = set(sinks)
    for op in later:
        used |= reads(op)
    return tuple(nm for op in block.ops if (nm := defines(op)) is not None and nm in used)
