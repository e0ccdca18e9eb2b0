"""The operation table (hipress.compll.ir.ops): each entry agrees with the semantics, the
printer, the grammar and the checker."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hipress.compll.frontend.check import check_source
from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops, semantics
from hipress.compll.ir.source import CllTypeError, SourceFile
from hipress.compll.ir.types import BOOL, F32, F64, I32, I64, U32, DType, torch_compute_dtype

GRAMMAR = Path(ops.__file__).resolve().parent.parent / "frontend" / "cll.lark"


def _operand(o: ops.OpDef) -> DType:
    """A type operation ``o`` accepts as its (first) operand."""
    if o.operands == ops.BITS:  # the other kind of value of the result's width
        return {"u32": F32, "i32": F32, "i64": F64, "f32": U32, "f64": I64}[o.result]
    return F32 if o.floats else I32 if o.ints else BOOL


def _sample(dt: DType) -> torch.Tensor:
    return semantics.const(True if dt.is_bool else 3, dt).reshape(1)


@pytest.mark.parametrize("name", list(ops.UNARY))
def test_unary_semantics_give_the_table_result_type(name: str) -> None:
    o = ops.UNARY[name]
    dt = _operand(o)
    assert o.accepts(dt) or o.operands == ops.BITS
    out = semantics.unary(name, _sample(dt), dt)
    assert out.dtype == torch_compute_dtype(o.result_type(dt))


@pytest.mark.parametrize("name", list(ops.BINARY))
def test_binary_semantics_give_the_table_result_type(name: str) -> None:
    o = ops.BINARY[name]
    dt = _operand(o)
    other = I64 if o.operands == ops.FLOAT_EXP else dt
    out = semantics.binary(name, _sample(dt), _sample(other), dt)
    assert out.dtype == torch_compute_dtype(o.result_type(dt))


def test_unknown_names_are_refused() -> None:
    x = _sample(F32)
    with pytest.raises(ValueError, match="unknown unary op"):
        semantics.unary("nope", x, F32)
    with pytest.raises(ValueError, match="unknown binary op"):
        semantics.binary("nope", x, x, F32)


def test_names_and_symbols_are_unique_and_the_grammar_has_every_symbol() -> None:
    grammar = GRAMMAR.read_text()
    for table in (ops.UNARY, ops.BINARY, ops.REDUCE):
        assert all(name == o.name for name, o in table.items())
    for symbols, table in ((ops.UNARY_SYMBOLS, ops.UNARY), (ops.BINARY_SYMBOLS, ops.BINARY)):
        assert len(symbols) == sum(1 for o in table.values() if o.symbol)
        for sym in symbols:
            assert f'"{sym}"' in grammar, sym
    assert all(o.arity == 1 for o in ops.UNARY.values())
    assert all(o.arity == 2 for o in ops.BINARY.values())


def test_typing_rules() -> None:
    assert not ops.ADD.accepts(BOOL) and ops.ADD.accepts(I32) and ops.ADD.accepts(F64)
    assert ops.EQ.accepts(BOOL) and not ops.LT.accepts(BOOL)
    assert ops.BAND.accepts(BOOL) and not ops.BAND.accepts(F32)
    assert ops.SQRT.accepts(F32) and not ops.SQRT.accepts(I32)
    assert ops.REDUCE_SUM.result_type(I32) == I64 and ops.REDUCE_SUM.result_type(F32) == F32
    assert ops.REDUCE_COUNT.result_type(BOOL) == I64
    assert ops.ISNAN.result_type(F64) == BOOL and ops.EXPONENT.result_type(F64) == I32
    assert ops.REDUCE_OPS == ("sum", "min", "max", "absmax", "any", "all", "count")
    assert ops.SCAN_OPS == ("sum", "min", "max")
    for o in ops.REDUCE.values():
        assert (o.combiner in ops.BINARY) if o.named else o.combiner is None


def test_show_expr_writes_symbols_and_calls() -> None:
    a, b = ir.Ref("a", F32), ir.Ref("b", F32)
    for o in ops.BINARY.values():
        shown = ir.show_expr(ir.Binary(o.name, a, b, o.result_type(F32)))
        assert shown == (f"(a {o.symbol} b)" if o.symbol else f"{o.name}(a, b)")
    for o in ops.UNARY.values():
        shown = ir.show_expr(ir.Unary(o.name, a, o.result_type(F32)))
        assert shown == (f"{o.symbol}a" if o.symbol else f"{o.name}(a)")


def _check(call: str, result: DType) -> ir.Program:
    text = (
        f"algorithm t;\npayload {{ x: {result}; }}\nencode(g) {{ return concat({call}); }}\n"
        "decode(p) { return map(n, i => 0.0); }"
    )
    return check_source(SourceFile("t.cll", text))


_ARGS = {"as_f32": "(7)", "as_f64": "(7)", "ldexp": "(1.5, 3)", "min": "(1.5, 2.5)",
         "max": "(1.5, 2.5)", "hash": "(1, 2)"}  # fmt: skip


@pytest.mark.parametrize(
    "name", [o.name for t in (ops.UNARY, ops.BINARY) for o in t.values() if o.builtin]
)
def test_every_builtin_operation_checks_and_folds(name: str) -> None:
    o = ops.UNARY.get(name) or ops.BINARY[name]
    arg_type = F32 if o.operands != ops.BITS else _operand(o)
    result = o.result_type(arg_type)
    prog = _check(f"{name}{_ARGS.get(name, '(1.5)')}", result)
    (field,) = prog.encode.fields
    assert isinstance(field, ir.Const) and field.dtype == result  # constants fold


@pytest.mark.parametrize("sym", list(ops.BINARY_SYMBOLS))
def test_every_operator_checks_and_keeps_its_rule(sym: str) -> None:
    o = ops.BINARY_SYMBOLS[sym]
    dt = I32 if o.ints else BOOL
    lit = "true" if dt == BOOL else "i32(6)"
    result = o.result_type(dt)
    prog = _check(f"{lit} {sym} {lit}", result)
    assert isinstance(prog.encode.fields[0], ir.Const)
    if not o.accepts(F32):
        with pytest.raises(CllTypeError) as err:
            _check(f"1.5 {sym} 2.5", result)
        assert f"`{sym}` needs" in str(err.value)
