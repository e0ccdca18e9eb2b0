"""Constant folding of IR expressions, with the reference interpreter's semantics.

Used by the checker as it builds expressions (the IR it emits is folded) and by lowering where it
rebuilds an expression the checker built (a segmented reduce's result length), so that both hold
the same tree.
"""

from __future__ import annotations

import torch

from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.interp import eval_scalar
from hipress.compll.ir.types import I64, DType


def fold(e: ir.Expr) -> ir.Expr:
    """``e`` evaluated to a :class:`~ir.Const` when its operands are constants (a select with a
    constant condition becomes the chosen side); ``e`` itself otherwise. Only the top node is
    folded: see :func:`fold_deep` for a whole tree."""
    if isinstance(e, ir.Select) and isinstance(e.cond, ir.Const):
        return e.a if e.cond.value else e.b
    if isinstance(e, ir.Cast) and isinstance(e.x, ir.Select):
        s = e.x
        if isinstance(s.a, ir.Const) and isinstance(s.b, ir.Const):
            # a choice between two constants converts as its constants: u8(c ? 1 : 0) is
            # c ? u8(1) : u8(0), computed in the narrow type
            a, b = fold(ir.Cast(s.a, e.dtype)), fold(ir.Cast(s.b, e.dtype))
            return ir.Select(s.cond, a, b, e.dtype)
    kids = _operands(e)
    if not kids or not all(isinstance(k, ir.Const) for k in kids):
        return e
    t = eval_scalar(e, {})
    return ir.Const(_py(t, e.dtype), e.dtype)


def fold_deep(e: ir.Expr) -> ir.Expr:
    """``e`` folded bottom-up through its unary, binary, cast and select nodes."""
    if isinstance(e, ir.Unary):
        return fold(ir.Unary(e.op, fold_deep(e.x), e.dtype))
    if isinstance(e, ir.Cast):
        return fold(ir.Cast(fold_deep(e.x), e.dtype))
    if isinstance(e, ir.Binary):
        return fold(ir.Binary(e.op, fold_deep(e.a), fold_deep(e.b), e.dtype))
    if isinstance(e, ir.Select):
        return fold(ir.Select(fold_deep(e.cond), fold_deep(e.a), fold_deep(e.b), e.dtype))
    return e


def segment_count(length: ir.Expr, seg: ir.Expr) -> ir.Expr:
    """``ceil(length / seg)`` for a segment length ``seg >= 1`` (both i64), folded: the result
    length of a :class:`~ir.SegReduce`."""
    one = ir.Const(1, I64)
    return fold_deep(
        ir.Binary(
            ops.DIV.name,
            ir.Binary(ops.SUB.name, ir.Binary(ops.ADD.name, length, seg, I64), one, I64),
            ir.Binary(ops.MAX.name, seg, one, I64),
            I64,
        )
    )


def _operands(e: ir.Expr) -> tuple[ir.Expr, ...]:
    """The operands a fold evaluates (not a load's index or a random counter: those nodes read
    memory or state and are never folded)."""
    if isinstance(e, ir.Unary | ir.Cast):
        return (e.x,)
    if isinstance(e, ir.Binary):
        return (e.a, e.b)
    if isinstance(e, ir.Select):
        return (e.cond, e.a, e.b)
    return ()


def _py(t: torch.Tensor, dt: DType) -> int | float | bool:
    if dt.is_bool:
        return bool(t.item())
    if dt.is_int:
        return int(t.item())
    return float(t.to(torch.float64).item())
