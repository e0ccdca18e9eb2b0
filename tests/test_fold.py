"""Constant folding (hipress.compll.ir.fold): folded values are the interpreter's, nothing that
reads memory, state or randomness is folded, and a segmented reduce's length folds once."""

from __future__ import annotations

import math

from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.fold import fold, fold_deep, segment_count
from hipress.compll.ir.interp import eval_size
from hipress.compll.ir.types import BOOL, F32, I32, I64, U8

N = ir.Ref(ir.N, I64)


def test_fold_uses_the_semantics() -> None:
    big = ir.Const(2**31 - 1, I32)
    assert fold(ir.Binary(ops.ADD.name, big, ir.Const(1, I32), I32)) == ir.Const(-(2**31), I32)
    assert fold(ir.Binary(ops.DIV.name, ir.Const(7, I32), ir.Const(0, I32), I32)) == ir.Const(
        0, I32
    )
    assert fold(ir.Cast(ir.Const(300.7, F32), U8)) == ir.Const(255, U8)
    nan = fold(ir.Binary(ops.MIN.name, ir.Const(math.nan, F32), ir.Const(1.0, F32), F32))
    assert isinstance(nan, ir.Const) and math.isnan(nan.value)


def test_fold_leaves_what_it_cannot_evaluate() -> None:
    load = ir.Load("a", ir.Const(0, I64), F32)
    assert fold(load) == load
    rand = ir.Rand("bits", ir.Const(0, I64), 0, I32)
    assert fold(ir.Unary(ops.NEG.name, rand, I32)) == ir.Unary(ops.NEG.name, rand, I32)
    e = ir.Binary(ops.ADD.name, N, ir.Const(1, I64), I64)
    assert fold(e) == e


def test_a_constant_select_picks_its_side_even_over_references() -> None:
    a, b = ir.Ref("a", F32), ir.Ref("b", F32)
    assert fold(ir.Select(ir.Const(True, BOOL), a, b, F32)) == a
    assert fold(ir.Select(ir.Const(False, BOOL), a, b, F32)) == b


def test_fold_deep_folds_bottom_up() -> None:
    one = ir.Const(1, I64)
    inner = ir.Binary(ops.ADD.name, one, one, I64)
    e = ir.Binary(ops.MUL.name, N, inner, I64)
    assert fold(e) == e
    assert fold_deep(e) == ir.Binary(ops.MUL.name, N, ir.Const(2, I64), I64)
    assert fold_deep(ir.Binary(ops.MUL.name, inner, inner, I64)) == ir.Const(4, I64)


def test_segment_count_is_the_ceiling() -> None:
    assert segment_count(ir.Const(10, I64), ir.Const(3, I64)) == ir.Const(4, I64)
    assert segment_count(ir.Const(0, I64), ir.Const(3, I64)) == ir.Const(0, I64)
    e = segment_count(N, ir.Const(4, I64))
    assert not isinstance(e, ir.Const)
    assert [eval_size(e, n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_a_cast_of_a_choice_between_constants_casts_the_constants() -> None:
    cond = ir.Binary(ops.LT.name, ir.Load("a", ir.Ref("i", I64), F32), ir.Const(0.0, F32), BOOL)
    wide = ir.Select(cond, ir.Const(300, I64), ir.Const(-1, I64), I64)
    # each constant converts as the interpreter converts it (saturating, as u8(300.7) above)
    got = fold(ir.Cast(wide, U8))
    want = ir.Select(cond, fold(ir.Cast(ir.Const(300, I64), U8)),
                     fold(ir.Cast(ir.Const(-1, I64), U8)), U8)  # fmt: skip
    assert got == want and all(isinstance(x, ir.Const) for x in (got.a, got.b))
    load = ir.Select(cond, ir.Load("a", ir.Ref("i", I64), F32), ir.Const(1.0, F32), F32)
    assert fold(ir.Cast(load, U8)) == ir.Cast(load, U8)  # only two constants are folded
