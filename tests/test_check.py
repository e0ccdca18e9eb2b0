"""Checker/elaborator: typing rules, folding, control flow merging, fn inlining, parameters."""

from __future__ import annotations

import math

import pytest
import torch

from hipress.compll import CllParamError, CllTypeError, load_source
from hipress.compll.frontend.check import check_source, param_variants
from hipress.compll.frontend.parse import parse
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.source import SourceFile
from hipress.compll.ir.types import F32, F64, I32, I64, U8, U32


def prog(body: str, payload: str = "q: f32[n];", decode: str = "return p.q;", head: str = ""):
    text = f"algorithm t;\n{head}\npayload {{ {payload} }}\nencode(g) {{ {body} }}\ndecode(p) {{ {decode} }}"
    return check_source(SourceFile("t.cll", text))


def run(body: str, g: torch.Tensor, **kw) -> torch.Tensor:
    text = (
        f"algorithm t;\n{kw.get('head', '')}\npayload {{ q: f32[n]; }}\n"
        f"encode(g) {{ {body} }}\ndecode(p) {{ return p.q; }}"
    )
    a = load_source(SourceFile("t.cll", text), backend="reference")
    st = a.init_state(g.numel())
    return a.decode(a.encode(g, st), g.numel())


def test_params_fold_to_constants() -> None:
    p = prog(
        "let k = f32((1 << bits) - 1); return concat(map(n, i => g[i] * k));",
        head="param bits: u32 in {1, 2, 4, 8} = 4;",
    )
    m = p.encode.ops[0]
    assert isinstance(m, ir.Map)
    assert m.fn.result == ir.Binary(
        "mul", ir.Load("g", m.fn.params[0], F32), ir.Const(15.0, F32), F32
    )


def test_literals_adapt_and_default() -> None:
    p = prog(
        "let a = 1; let b = 2.5; let c = n * 2; return concat(map(n, i => g[i] * b + f32(c)));"
    )
    m = next(o for o in p.encode.ops if isinstance(o, ir.Map))
    assert m.fn.result.a.b == ir.Const(2.5, F32)
    # c = n * 2 is a host let of type i64
    lets = [o for o in p.encode.ops if isinstance(o, ir.Let)]
    assert lets[0].value.dtype == I64


def test_constant_params_coerce_when_they_fit() -> None:
    p = prog(
        "let x: u8 = bits; return concat(map(n, i => g[i] * f32(x)));",
        head="param bits: u32 in [1, 8] = 3;",
    )
    assert p.encode.ops[0].fn.result.b == ir.Const(3.0, F32)


def test_if_else_merges_with_select() -> None:
    g = torch.tensor([1.0, -2.0, 3.0, -4.0])
    body = """
        let q = map(n, i => {
            var y = g[i];
            if (y < 0.0) { y = -y * 10.0; } else if (y > 2.0) { y = 0.0; }
            return y;
        });
        return concat(q);"""
    assert torch.equal(run(body, g), torch.tensor([1.0, 20.0, 0.0, 40.0]))


def test_host_var_and_if() -> None:
    g = torch.tensor([1.0, 2.0, 3.0])
    body = """
        var s = reduce(sum, g);
        if (s > 5.0) { s = s * 2.0; }
        return concat(map(n, i => s));"""
    assert torch.equal(run(body, g), torch.full((3,), 12.0))


def test_fn_inlining_and_scoping() -> None:
    g = torch.tensor([1.0, -2.0])
    head = "fn twice(x: f32) -> f32 { let y = x + x; return y; }"
    body = "let y = 7.0; return concat(map(n, i => twice(g[i]) + y));"
    assert torch.equal(run(body, g, head=head), torch.tensor([9.0, 3.0]))


def test_fn_cannot_see_caller_locals() -> None:
    with pytest.raises(CllTypeError, match="unknown name `secret`"):
        prog(
            "let secret = 1.0; return concat(map(n, i => f(g[i])));",
            head="fn f(x: f32) -> f32 { return x + secret; }",
        )


def test_lambda_cannot_assign_host_var() -> None:
    with pytest.raises(CllTypeError, match="cannot assign to `s`"):
        prog("var s = 0.0; let q = map(n, i => { s = 1.0; return g[i]; }); return concat(q);")


def test_packed_store_masks_values() -> None:
    p = prog(
        "let q: uint<2>[n] = map(n, i => 7); return concat(q);",
        payload="q: uint<2>[n];",
        decode="return map(n, i => f32(p.q[i]));",
    )
    m = p.encode.ops[0]
    assert m.type.bits == 2
    assert m.fn.result == ir.Const(3, U8)  # 7 & 3, folded


def test_state_assignment_and_types() -> None:
    text = """algorithm t; state r: f32[n]; state k: i64;
    payload { q: f32[n]; }
    encode(g) { r = map(n, i => g[i] + r[i]); k = k + 1; return concat(r); }
    decode(p) { return p.q; }"""
    p = check_source(SourceFile("t.cll", text))
    stores = [o for o in p.encode.ops if isinstance(o, ir.StoreState)]
    assert [s.state for s in stores] == ["r", "k"]
    a = load_source(SourceFile("t.cll", text), backend="reference")
    st = a.init_state(3)
    a.encode(torch.ones(3), st)
    a.encode(torch.ones(3), st)
    assert torch.equal(st.tensors["r"], torch.full((3,), 2.0))
    assert int(st.tensors["k"]) == 2
    assert st.step == 2


def test_state_type_mismatch() -> None:
    with pytest.raises(CllTypeError, match="expected f32, got i64"):
        check_source(
            SourceFile(
                "t.cll",
                """algorithm t; state r: f32[n]; payload { a: f32; }
        encode(g) { r = map(n, i => i); return concat(1.0); } decode(p) { return map(n, i => p.a); }""",
            )
        )


SRC = """algorithm t;
param ratio: f64 in [0.0, 1.0] = 0.5;
param bits: u32 in {1, 2, 4, 8} = 2;
param flag: bool = true;
const k = max(1, i64(ceil(f64(n) * ratio)));
payload { q: uint<bits>[n]; v: f32[k]; }
encode(g) { let q: uint<bits>[n] = map(n, i => 0); let v = map(k, j => g[j]); return concat(q, v); }
decode(p) { return map(n, i => f32(p.q[i])); }"""


def test_param_values_validated() -> None:
    src = SourceFile("t.cll", SRC)
    cases = [
        ({"ratio": 1.5}, "`ratio` = 1.5 is outside its allowed values [0.0, 1.0]"),
        ({"bits": 3}, "`bits` = 3 is outside its allowed values {1, 2, 4, 8}"),
        ({"bits": 2.5}, "`bits` must be an integer (u32), got 2.5 (allowed values {1, 2, 4, 8})"),
        ({"flag": 1}, "`flag` must be a bool, got 1"),
        ({"ratio": "x"}, "`ratio` must be a number, got 'x' (allowed values [0.0, 1.0])"),
        ({"ratio": float("nan")}, "`ratio` must not be NaN (allowed values [0.0, 1.0])"),
        ({"ratio": float("inf")}, "`ratio` = inf is outside its allowed values [0.0, 1.0]"),
        ({"bits": True}, "`bits` must be an integer (u32), got True (allowed values {1, 2, 4, 8})"),
        ({"nope": 1}, "unknown parameter `nope` (this algorithm's parameters: bits, flag, ratio)"),
        ({"bits": float("inf")}, "`bits` must be an integer (u32), got inf"),
        ({"bits": float("nan")}, "`bits` must be an integer (u32), got nan"),
        ({"ratio": 10**400}, "`ratio` is a 401-digit integer, beyond the float range"),
    ]
    for params, msg in cases:
        with pytest.raises(CllParamError) as info:
            check_source(src, params)
        assert msg in str(info.value)
        assert str(info.value).startswith("t.cll")


def test_param_variants_cover_sets_and_ranges() -> None:
    src = SourceFile("t.cll", SRC)
    variants = param_variants(parse(src))
    assert {"bits": 8} in variants and {"ratio": 0.0} in variants and {"ratio": 1.0} in variants
    for v in variants:
        check_source(src, v)


def test_const_sizes_evaluate() -> None:
    a = load_source(SourceFile("t.cll", SRC), backend="reference", ratio=0.1, bits=4)
    # q: ceil(n*4/8) bytes at offset 0, v: k floats at the next multiple of 8
    n = 1000
    k = 100
    assert a.payload_nbytes(n) == ((n * 4 // 8 + 7) // 8 * 8) + ((k * 4 + 7) // 8 * 8)


def test_random_is_u32_and_typed() -> None:
    p = prog("let q = map(n, i => f32(urand(i) >> 8) + uniform(i, 3)); return concat(q);")
    e = p.encode.ops[0].fn.result
    assert e.a.x.a.dtype == U32
    assert e.b == ir.Rand("uniform", p.encode.ops[0].fn.params[0], 3, F32)


def test_digest_changes_with_params_only_when_program_changes() -> None:
    src = SourceFile("t.cll", SRC)
    d1 = check_source(src).digest()
    assert check_source(src, {"bits": 2}).digest() == d1
    assert check_source(src, {"bits": 4}).digest() != d1
    commented = SourceFile("t.cll", "// a comment\n" + SRC)
    assert check_source(commented).digest() == d1


def _result(body: str, payload: str = "q: f32[n];") -> ir.Expr:
    p = prog(body, payload, decode="return map(n, i => 0.0);")
    m = next(o for o in p.encode.ops if isinstance(o, ir.Map))
    return m.fn.result


def test_bit_casts_read_the_bits_of_a_same_width_value() -> None:
    r = _result("return concat(map(n, i => as_u32(g[i])));", "q: u32[n];")
    assert r == ir.Unary("as_u32", r.x, U32) and r.x.dtype == F32
    r = _result("return concat(map(n, i => as_f64(i64(i))));", "q: f64[n];")
    assert isinstance(r, ir.Unary) and r.op == "as_f64" and r.dtype == F64
    # between integers of one width the bits are kept by the conversion; same type: nothing
    r = _result("return concat(map(n, i => as_u32(i32(i))));", "q: u32[n];")
    assert isinstance(r, ir.Cast) and r.dtype == U32
    r = _result("return concat(map(n, i => as_f32(g[i])));")
    assert isinstance(r, ir.Load)
    # literals take the type whose bits are read: as_f32 an integer (u32 before i32),
    # as_u32 / as_i64 a float; everything constant folds
    r = _result("return concat(map(n, i => g[i] + as_f32(0x3F800000) + as_f32(-2147483648)));")
    assert r.a.b == ir.Const(1.0, F32) and r.b == ir.Const(-0.0, F32)
    r = _result("return concat(map(n, i => u32(i) + as_u32(1)));", "q: u32[n];")
    assert r.b == ir.Const(0x3F800000, U32)
    r = _result("return concat(map(n, i => i64(i) + as_i64(1)));", "q: i64[n];")
    assert r.b == ir.Const(0x3FF0000000000000, I64)


def test_exponent_and_ldexp_types() -> None:
    r = _result("return concat(map(n, i => exponent(f64(g[i]))));", "q: i32[n];")
    assert r == ir.Unary("exponent", r.x, I32)
    # any integer exponent, taken as i64 (no wrap-around); the float's type is the result's
    r = _result("return concat(map(n, i => ldexp(f64(g[i]), u32(i))));", "q: f64[n];")
    assert r.op == "ldexp" and r.dtype == F64 and r.b.dtype == I64
    r = _result("return concat(map(n, i => ldexp(g[i], 1 << 40)));")
    assert r.b == ir.Const(1 << 40, I64) and r.dtype == F32
    # constant arguments fold; a literal result adapts like a literal
    r = _result("return concat(map(n, i => f64(g[i]) * ldexp(1, 3) + f64(exponent(0.75))));",
                "q: f64[n];")  # fmt: skip
    assert r.a.b == ir.Const(8.0, F64) and r.b == ir.Const(-1.0, F64)


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("as_u32(f64(g[i]))", "`as_u32` reinterprets the bits of a 32-bit value (f32, i32 or "
         "u32), got f64; convert it first, e.g. f32(...) or u32(...)"),
        ("as_f64(g[i])", "`as_f64` reinterprets the bits of a 64-bit value (f64 or i64), got f32"),
        ("as_f32(i > 3)", "got bool"),
        ("as_f32(f16(g[i]))", "f16 is a storage type; convert it first"),
        ("as_f32(4294967296)", "`as_f32(4294967296)`: 4294967296 does not fit in 32 bits"),
        ("as_u32(g[i], 1)", "`as_u32` takes 1 argument(s), got 2"),
        ("exponent(i)", "`exponent` needs a float (f32 or f64), got i64"),
        ("ldexp(g[i], 2.0)", "the exponent of `ldexp(x, e)` must be an integer, got f32"),
        ("ldexp(i, 2)", "`ldexp` needs a float (f32 or f64), got i64"),
        ("ldexp(g[i])", "`ldexp` takes 2 argument(s), got 1"),
    ],
)  # fmt: skip
def test_bit_builtin_diagnostics(expr: str, message: str) -> None:
    with pytest.raises(CllTypeError) as info:
        prog(f"return concat(map(n, i => f32({expr})));")
    assert message in str(info.value)


def test_inf_and_nan_adapt_and_a_program_may_reuse_the_names() -> None:
    r = _result("return concat(map(n, i => min(f64(g[i]), inf) + nan));", "q: f64[n];")
    assert r.a.b == ir.Const(math.inf, F64) and r.b.dtype == F64 and math.isnan(r.b.value)
    with pytest.raises(CllTypeError, match="expected i32, got f32"):
        prog("let k: i32 = inf; return concat(map(n, i => g[i]));")
    # a const, param, let, fn or lambda parameter of the same name hides the constant
    g = torch.tensor([1.0, 2.0])
    assert run("return concat(map(n, i => g[i] + inf));", g, head="const inf = 3.0;").tolist() == [
        4.0,
        5.0,
    ]
    head = "param nan: f32 = 1.0;"
    assert run("return concat(map(n, i => g[i] * nan));", g, head=head).tolist() == [1.0, 2.0]
    assert run("let inf = 0.5; return concat(map(n, i => g[i] * inf));", g).tolist() == [0.5, 1.0]
    head = "fn f(nan: f32) -> f32 { return nan * 2.0; }"
    assert run("return concat(map(n, i => f(g[i])));", g, head=head).tolist() == [2.0, 4.0]
    assert run("return concat(map(n, inf => f32(inf)));", g).tolist() == [0.0, 1.0]
    # a state of that name is still encode-only (decode does not see the constant instead)
    with pytest.raises(CllTypeError, match="state `inf` is only available in encode"):
        prog(
            "inf = 1.0; return concat(map(n, i => g[i]));",
            decode="return map(n, i => inf);",
            head="state inf: f32;",
        )


def test_a_function_never_called_is_checked_all_the_same() -> None:
    ok = "fn unused(x: f32) -> f32 { return x * 2.0 + uniform(0); }"
    prog("return concat(map(n, i => g[i]));", head=ok)  # accepted: it is well typed
    bad = "fn unused(x: f32) -> f32 { return x + true; }"
    with pytest.raises(CllTypeError, match="mismatched types f32 and bool"):
        prog("return concat(map(n, i => g[i]));", head=bad)
    # one reached only through another uncalled function is checked too
    chain = "fn a(x: f32) -> f32 { return b(x); } fn b(x: f32) -> i32 { return x; }"
    with pytest.raises(CllTypeError):
        prog("return concat(map(n, i => g[i]));", head=chain)


def test_param_combinations_cover_every_pair_of_values() -> None:
    from hipress.compll.frontend.check import param_combinations

    src = SourceFile("t.cll", SRC)
    combos = param_combinations(parse(src))
    # ratio's two ends and its default, bits in {1, 2, 4, 8}, flag both ways: 3 x 4 x 2
    assert len(combos) == 24 == len({tuple(sorted(c.items())) for c in combos})
    assert {"bits": 8, "ratio": 0.0, "flag": False} in combos
    assert {"bits": 1, "ratio": 1.0, "flag": True} in combos
    for c in combos:
        check_source(src, c)
    # a value refused only in combination is found: b=true with small=true
    text = """algorithm t;
param small: bool = false;
param b: bool = false;
const k = small && b ? 0 - 1 : n;
payload { v: f32[k]; }
encode(g) { return concat(map(k, i => g[i])); }
decode(p) { return map(n, i => p.v[i]); }"""
    one = SourceFile("t.cll", text)
    for c in param_variants(parse(one)):
        check_source(one, c)
    with pytest.raises(CllTypeError, match="negative"):
        for c in param_combinations(parse(one)):
            check_source(one, c)
