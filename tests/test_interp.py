"""The reference interpreter: each operation's defined result, checked against values computed
independently (by hand or with numpy/Python)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from hipress.compll import load_source
from hipress.compll.ir.payload import CANONICAL_NAN
from hipress.compll.ir.semantics import CANONICAL_NAN_BITS
from hipress.compll.ir.source import SourceFile


def enc(body: str, g: torch.Tensor, out: str = "f32[n]", head: str = "") -> torch.Tensor:
    """Run ``body`` (which must `return concat(x)`), return field x as a tensor."""
    text = (
        f"algorithm t;\n{head}\npayload {{ x: {out}; }}\nencode(g) {{ {body} }}\n"
        "decode(p) { return map(n, i => 0.0); }"
    )
    a = load_source(SourceFile("t.cll", text), backend="reference")
    st = a.init_state(g.numel())
    payload = a.encode(g, st)
    from hipress.compll.ir.payload import unpack

    return unpack(a.program, g.numel(), payload)[0]


def scalar(expr: str, typ: str, g: torch.Tensor | None = None) -> float | int:
    g = torch.zeros(1) if g is None else g
    return enc(f"let v: {typ} = {expr}; return concat(v);", g, typ).item()


def test_integer_wraparound_and_division() -> None:
    assert scalar("u8(200) + u8(100)", "u8") == 44
    assert scalar("i32(2147483647) + i32(1)", "i32") == -2147483648
    assert scalar("i32(7) / i32(0)", "i32") == 0
    assert scalar("i32(7) % i32(0)", "i32") == 0
    assert scalar("i32(-7) / i32(2)", "i32") == -3  # truncation
    assert scalar("i32(-7) % i32(2)", "i32") == -1  # sign of the dividend
    assert scalar("(i64(-9223372036854775807) - 1) / i64(-1)", "i64") == -(1 << 63)
    assert scalar("u32(1) << u32(33)", "u32") == 2  # shift count mod 32
    assert scalar("~u8(0)", "u8") == 255
    assert scalar("-u32(1)", "u32") == (1 << 32) - 1


def test_float_to_int_saturates() -> None:
    g = torch.tensor([float("nan"), float("inf"), -float("inf"), 3.9, -3.9, 1e10, -1e10, 255.5])
    got = enc("let x = map(n, i => i32(g[i])); return concat(x);", g, "i32[n]")
    assert got.tolist() == [0, 2**31 - 1, -(2**31), 3, -3, 2**31 - 1, -(2**31), 255]
    got = enc("let x = map(n, i => u8(g[i])); return concat(x);", g, "u8[n]")
    assert got.tolist() == [0, 255, 0, 3, 0, 255, 0, 255]


def test_min_max_nan_and_signed_zero() -> None:
    g = torch.tensor([float("nan"), 1.0, -0.0, 0.0])
    body = "let x = map(n, i => min(g[i], g[(i + 1) % n])); return concat(x);"
    got = enc(body, g)
    assert math.isnan(got[0]) and got[1] == -0.0 and math.copysign(1, got[2]) == -1.0
    assert math.isnan(got[3])  # min(0.0, nan)
    body = "let x = map(n, i => max(g[(i + 2) % n], g[(i + 3) % n])); return concat(x);"
    got = enc(body, g)  # max(-0, +0), max(+0, nan), max(nan, 1), max(1, -0)
    assert math.copysign(1, got[0]) == 1.0 and math.isnan(got[1]) and math.isnan(got[2])
    assert got[3] == 1.0


def test_sign_round_clamp() -> None:
    g = torch.tensor([-2.5, -0.0, 0.5, 1.5, 2.5, float("nan")])
    got = enc("return concat(map(n, i => sign(g[i])));", g)
    assert got[:5].tolist() == [-1.0, 0.0, 1.0, 1.0, 1.0] and math.isnan(got[5])
    assert math.copysign(1, got[1]) == 1.0
    got = enc("return concat(map(n, i => round(g[i])));", g)
    assert got[:5].tolist() == [-2.0, -0.0, 0.0, 2.0, 2.0]
    got = enc("return concat(map(n, i => clamp(g[i], -1.0, 1.0)));", g)
    assert got[:5].tolist() == [-1.0, -0.0, 0.5, 1.0, 1.0]


def test_reductions() -> None:
    g = torch.tensor([3.0, -7.0, 2.0, 0.5])
    assert scalar("reduce(sum, g)", "f32", g) == -1.5
    assert scalar("reduce(max, g)", "f32", g) == 3.0
    assert scalar("reduce(min, g)", "f32", g) == -7.0
    assert scalar("reduce(absmax, g)", "f32", g) == 7.0
    assert scalar("reduce(count, n, i => g[i] > 0.0)", "i64", g) == 3
    assert scalar("reduce(any, n, i => g[i] > 2.5)", "bool", g) is True
    assert scalar("reduce(all, n, i => g[i] > -10.0)", "bool", g) is True
    assert scalar("reduce((a, b) => a * b, 1.0, g)", "f32", g) == -21.0
    assert math.isnan(scalar("reduce(max, g)", "f32", torch.tensor([1.0, float("nan")])))


def test_empty_reductions_are_identities() -> None:
    e = torch.zeros(0)
    assert scalar("reduce(sum, n, i => 1.0)", "f32", e) == 0.0
    assert scalar("reduce(min, n, i => 1.0)", "f32", e) == math.inf
    assert scalar("reduce(max, n, i => i32(i))", "i32", e) == -(2**31)
    assert scalar("reduce(count, n, i => true)", "i64", e) == 0
    assert scalar("reduce((a, b) => a + b, 5.0, n, i => 1.0)", "f32", e) == 5.0


def test_float_sums_accumulate_in_f64() -> None:
    g = torch.cat([torch.tensor([16777216.0]), torch.ones(1000)])
    # plain f32 accumulation in order would stay at 2**24
    assert scalar("reduce(sum, g)", "f32", g) == 16777216.0 + 1000.0


def test_filter_topk_sort_scan() -> None:
    g = torch.tensor([0.5, -3.0, 3.0, float("nan"), 0.0, -0.0, 2.0, 3.0])
    got = enc(
        "let (idx, c) = filter(4, g.size, i => abs(g[i]) > 1.0); return concat(idx);", g, "i32[4]"
    )
    assert got.tolist() == [1, 2, 6, 7]
    got = enc("let (idx, c) = filter(8, n, i => g[i] > 2.5); return concat(idx);", g, "i32[8]")
    assert got.tolist() == [2, 7, 0, 0, 0, 0, 0, 0]
    got = enc("let (idx, c) = filter(8, n, i => g[i] > 2.5); return concat(c);", g, "i64")
    assert got.item() == 2
    # topk: NaN largest, then the two 3.0 (abs ties: index 1, 2, 7 -> lowest indices first)
    got = enc("let (idx, c) = topk(3, n, i => abs(g[i])); return concat(idx);", g, "i32[3]")
    assert got.tolist() == [1, 2, 3]
    got = enc("let (idx, c) = topk(10, g); return concat(c);", g, "i64")
    assert got.item() == 8
    got = enc("return concat(sort(g));", g)
    assert got[:7].tolist() == [-3.0, -0.0, 0.0, 0.5, 2.0, 3.0, 3.0] and math.isnan(got[7])
    assert math.copysign(1, got[1]) == -1.0 and math.copysign(1, got[2]) == 1.0
    h = torch.tensor([1.0, 2.0, -5.0, 4.0])
    assert enc("return concat(scan(sum, g));", h).tolist() == [1.0, 3.0, -2.0, 2.0]
    assert enc("return concat(scan(max, g));", h).tolist() == [1.0, 2.0, 2.0, 4.0]
    assert enc("return concat(scan(min, g));", h).tolist() == [1.0, 1.0, -5.0, -5.0]


def test_scatter_adds_and_ignores_out_of_range() -> None:
    g = torch.tensor([1.0, 2.0, 3.0, 4.0])
    body = """
        let idx = map(4, j => i32(j == 0 ? 2 : (j == 1 ? 2 : (j == 2 ? 9 : -1))));
        let v = map(4, j => g[j]);
        return concat(scatter(n, idx, v));"""
    assert enc(body, g).tolist() == [0.0, 0.0, 3.0, 0.0]
    body = """
        let idx = map(4, j => i32(3 - j));
        let v = map(4, j => g[j]);
        return concat(scatter(g, idx, v, 2));"""
    assert enc(body, g).tolist() == [1.0, 2.0, 5.0, 5.0]  # out[3] += 1, out[2] += 2


def test_segreduce_partial_segment() -> None:
    g = torch.arange(10, dtype=torch.float32) - 4.0
    got = enc("return concat(segreduce(absmax, 4, g));", g, "f32[(n + 3) / 4]")
    assert got.tolist() == [4.0, 3.0, 5.0]
    got = enc("return concat(segreduce(sum, 4, g));", g, "f32[(n + 3) / 4]")
    assert got.tolist() == [-10.0, 6.0, 9.0]


def test_random_matches_the_rng_module_and_is_uniform() -> None:
    from hipress.compll.ir.rng import philox_bits

    g = torch.zeros(100_000)
    u = enc("return concat(map(n, i => uniform(i)));", g)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.005
    bits = enc("return concat(map(n, i => urand(i, 7)));", torch.zeros(16), "u32[n]")
    want = philox_bits(torch.arange(16), 7, 0, 0, 0)
    assert torch.equal(bits, want)
    r = enc("return concat(map(n, i => randint(i, 10)));", g, "i64[n]")
    counts = np.bincount(r.numpy(), minlength=10)
    assert counts.min() > 9500 and counts.max() < 10500


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000])
def test_packed_roundtrip(n: int) -> None:
    g = torch.arange(n, dtype=torch.float32)
    text = """algorithm t; payload { q: uint<4>[n]; }
    encode(g) { let q: uint<4>[n] = map(n, i => i % 16); return concat(q); }
    decode(p) { return map(n, i => f32(p.q[i])); }"""
    a = load_source(SourceFile("t.cll", text), backend="reference")
    p = a.encode(g, a.init_state(n))
    assert p.shape[0] == a.payload_nbytes(n) == (n * 4 + 7) // 8 + (-((n * 4 + 7) // 8)) % 8
    assert torch.equal(a.decode(p, n), torch.remainder(g, 16))
    if n >= 2:  # LSB first: element 0 in the low nibble
        assert int(p[0]) == 0 | (1 << 4)


def test_gather_math_builtins_and_bit_operators() -> None:
    g = torch.tensor([4.0, -2.25, 0.5, 9.0, -0.0])
    body = "let idx = map(3, j => i32(4 - 2 * j)); return concat(gather(g, idx));"
    assert enc(body, g, "f32[3]").tolist() == [-0.0, 0.5, 4.0]
    assert math.copysign(1, enc(body, g, "f32[3]")[0]) == -1.0
    for fn, want in (
        ("abs", [4.0, 2.25, 0.5, 9.0, 0.0]),
        ("floor", [4.0, -3.0, 0.0, 9.0, -0.0]),
        ("ceil", [4.0, -2.0, 1.0, 9.0, -0.0]),
    ):
        assert enc(f"return concat(map(n, i => {fn}(g[i])));", g).tolist() == want, fn
    got = enc("return concat(map(n, i => sqrt(g[i])));", g)
    want = torch.tensor([2.0, math.sqrt(0.5), 3.0], dtype=torch.float32)  # correctly rounded
    assert torch.equal(got[[0, 2, 3]], want) and math.isnan(got[1])
    assert scalar("f32(g.size)", "f32", g) == 5.0
    assert scalar("(u32(12) & u32(10)) | (u32(1) << u32(8))", "u32") == 8 | 256
    assert scalar("(u32(12) ^ u32(10)) + (u32(255) >> u32(4))", "u32") == 6 + 15
    assert scalar("i32(-16) >> i32(2)", "i32") == -4  # arithmetic shift for signed


def test_extract_unpacks_the_payload_in_decode() -> None:
    text = """algorithm t;
payload { s: f32; k: i32; q: uint<4>[n]; }
encode(g) {
    let q: uint<4>[n] = map(n, i => u8(i % 16));
    return concat(2.5, i32(-3), q);
}
decode(p) {
    let (s, k, q) = extract(p);
    return map(n, i => f32(q[i]) * s + f32(k));
}"""
    a = load_source(SourceFile("t.cll", text), backend="reference")
    n = 37
    y = a.decode(a.encode(torch.zeros(n), a.init_state(n)), n)
    assert y.tolist() == [(i % 16) * 2.5 - 3.0 for i in range(n)]


# ---------------------------------------------------------------- bit casts, exponent, ldexp

# adversarial f32 bit patterns: zeros, subnormals, normals, the largest finite, infinities and
# NaNs of either sign, quiet and signalling
F32_EDGES = [
    0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00400000, 0x00000003,
    0x00800000, 0x80800000, 0x3F800000, 0x3FC00000, 0xBF7FFFFF, 0x4B000001, 0x7F7FFFFF,
    0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF,
]  # fmt: skip


def _f32_from_bits(bits: list[int]) -> torch.Tensor:
    signed = [b - (1 << 32) if b >= 1 << 31 else b for b in bits]
    return torch.tensor(signed, dtype=torch.int32).view(torch.float32)


def _bits_f32(v: float) -> int:
    return 0x7FC00000 if math.isnan(v) else int.from_bytes(np.float32(v).tobytes(), "little")


def _edge_f32s(count: int = 400) -> torch.Tensor:
    rng = np.random.default_rng(0)
    return _f32_from_bits(F32_EDGES + [int(b) for b in rng.integers(0, 1 << 32, count)])


def _f64s_as_chunks(bits: list[int]) -> torch.Tensor:
    """Each 64-bit pattern as three f32 integers (20 + 22 + 22 bits, exact), for _F64."""
    out = [float((b >> s) & 0x3FFFFF) for b in bits for s in (44, 22, 0)]
    return torch.tensor(out, dtype=torch.float32)


# the f64 of chunks 3j, 3j+1, 3j+2 (any bit pattern: no f32 NaN on the way)
_F64 = "as_f64((i64(g[3 * j]) << 44) | (i64(g[3 * j + 1]) << 22) | i64(g[3 * j + 2]))"
F64_EDGES = [
    0, 1 << 63, 1, (1 << 63) | 1, (1 << 52) - 1, 1 << 51, 1 << 52, 0x3FF0000000000000,
    0x7FEFFFFFFFFFFFFF, 0xFFEFFFFFFFFFFFFF, 0x7FF0000000000000, 0xFFF0000000000000,
    0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0x7FFFFFFFFFFFFFFF,
]  # fmt: skip


def _edge_f64_bits(count: int = 200) -> list[int]:
    rng = np.random.default_rng(1)
    return F64_EDGES + [int(b) for b in rng.integers(0, 1 << 63, count)]


def _f64_of_bits(b: int) -> float:
    return float(np.frombuffer(b.to_bytes(8, "little"), dtype=np.float64)[0])


def test_bit_casts_give_the_ieee_bits_and_nan_as_the_positive_quiet_nan() -> None:
    g = _edge_f32s()
    want = [_bits_f32(v) for v in g.tolist()]
    assert enc("return concat(map(n, i => as_u32(g[i])));", g, "u32[n]").tolist() == want
    signed = [w - (1 << 32) if w >= 1 << 31 else w for w in want]
    assert enc("return concat(map(n, i => as_i32(g[i])));", g, "i32[n]").tolist() == signed
    # a NaN made by arithmetic (0/0 is 0xFFC00000 on x86, 0x7FFFFFFF on a GPU) too
    z = torch.zeros(3)
    body = "return concat(map(n, i => as_u32(g[i] / g[i])));"
    assert enc(body, z, "u32[n]").tolist() == [0x7FC00000] * 3
    # and back: as_f32 keeps every bit of a non-NaN (payload fields canonicalise NaN)
    body = "return concat(map(n, i => as_f32(as_u32(g[i]))));"
    got = enc(body, g)
    assert [_bits_f32(v) for v in got.tolist()] == want
    assert scalar("as_f32(0x7F800000)", "f32") == math.inf
    assert scalar("as_f32(-1)", "f32") != scalar("as_f32(-1)", "f32")  # 0xFFFFFFFF: a NaN
    assert scalar("as_f32(1)", "f32") == 2.0**-149
    assert scalar("as_u32(-0.0)", "u32") == 1 << 31
    # the NaN of the bit casts is the one payloads store
    assert {k: CANONICAL_NAN[k] for k in ("f32", "f64")} == CANONICAL_NAN_BITS
    # f64: any 64-bit pattern through as_f64, back with as_i64
    bits = _edge_f64_bits()
    body = f"return concat(map(n / 3, j => as_i64({_F64})));"
    got64 = enc(body, _f64s_as_chunks(bits), "i64[n / 3]").tolist()
    nan64 = 0x7FF8000000000000
    want64 = [nan64 if math.isnan(_f64_of_bits(b)) else b for b in bits]
    assert got64 == [w - (1 << 64) if w >= 1 << 63 else w for w in want64]


def _exponent_oracle(v: float, emin: int, emax: int) -> int:
    if math.isnan(v) or math.isinf(v):
        return emax + 1
    if v == 0:
        return emin - 1
    return math.frexp(v)[1] - 1  # frexp: |v| = m * 2^e with m in [0.5, 1)


def test_exponent_is_floor_log2_with_defined_zeros_and_non_finites() -> None:
    g = _edge_f32s()
    want = [_exponent_oracle(v, -150 + 1, 127) for v in g.tolist()]
    assert enc("return concat(map(n, i => exponent(g[i])));", g, "i32[n]").tolist() == want
    bits = _edge_f64_bits()
    want = [_exponent_oracle(_f64_of_bits(b), -1075 + 1, 1023) for b in bits]
    body = f"return concat(map(n / 3, j => exponent({_F64})));"
    assert enc(body, _f64s_as_chunks(bits), "i32[n / 3]").tolist() == want
    # 2^exponent(x) is the largest power of two <= |x|, also for 0 and Inf
    got = enc("return concat(map(n, i => ldexp(1.0, exponent(g[i]))));", g)
    for x, p in zip(g.tolist(), got.tolist(), strict=True):
        if not math.isnan(x):
            assert p == (
                abs(x) if x == 0 or math.isinf(x) else 2.0 ** math.floor(math.log2(abs(x)))
            )


def _round_f32(v: Fraction) -> float:
    """The exact rational ``v`` rounded to f32 (nearest, ties to even; overflow to Inf)."""
    if v == 0:
        return 0.0
    s, a = (-1.0 if v < 0 else 1.0), abs(v)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    e += 1 if Fraction(2) ** (e + 1) <= a else 0
    e -= 1 if Fraction(2) ** e > a else 0
    q = Fraction(2) ** (max(e, -126) - 23)  # the spacing of f32 values near a
    m, r = divmod(a / q, 1)
    m += 1 if r > Fraction(1, 2) or (r == Fraction(1, 2) and m % 2) else 0
    out = m * q
    return s * math.inf if out >= 2**128 else s * float(out)


def test_ldexp_rounds_once_through_subnormals_and_overflow() -> None:
    rng = np.random.default_rng(2)
    xs = _edge_f32s(300)
    es = np.concatenate([rng.integers(-350, 350, 150), rng.integers(-30, 30, 120),
                         rng.integers(-2**40, 2**40, len(xs) - 270)])  # fmt: skip
    g = torch.cat([xs, torch.tensor(es, dtype=torch.float32)])
    got = enc("return concat(map(n / 2, j => ldexp(g[j], i64(g[j + n / 2]))));", g, "f32[n / 2]")
    for x, e, y in zip(xs.tolist(), g[len(xs) :].tolist(), got.tolist(), strict=True):
        if math.isnan(x) or math.isinf(x) or x == 0:
            want = x
        else:
            want = _round_f32(Fraction(x) * Fraction(2) ** max(-400, min(400, int(e))))
        assert (math.isnan(y) and math.isnan(want)) or (
            y == want and math.copysign(1, y) == math.copysign(1, want)
        ), (x, e, y, want)
    # f64 against libm's ldexp (exact by the C standard)
    bits = _edge_f64_bits(300)
    es64 = [int(e) for e in rng.integers(-2200, 2200, len(bits))]
    # x in [2^-53, 1) scaled into the subnormals: where rounding twice would show
    for k in range(1, 53):
        bits.append(((1023 - k) << 52) | int(rng.integers(1, 1 << 52)))
        es64.append(int(rng.integers(-1075 + k, -1022)))
    chunks = _f64s_as_chunks(bits).reshape(-1, 3)
    g = torch.cat([chunks, torch.tensor(es64, dtype=torch.float32)[:, None]], 1).reshape(-1)
    f64_of_4 = _F64.replace("3 * j", "4 * j")
    body = f"return concat(map(n / 4, j => ldexp({f64_of_4}, i64(g[4 * j + 3]))));"
    got = enc(body, g, "f64[n / 4]")
    for b, e, y in zip(bits, es64, got.tolist(), strict=True):
        x = _f64_of_bits(b)
        try:
            want = math.ldexp(x, e)
        except OverflowError:
            want = math.copysign(math.inf, x)
        assert (math.isnan(y) and math.isnan(want)) or (
            y == want and math.copysign(1, y) == math.copysign(1, want)
        ), (x, e, y, want)
    # folded at check time exactly as computed at run time
    assert scalar("ldexp(1.0, -149)", "f32") == 2.0**-149
    assert scalar("ldexp(1.5, -150)", "f32") == 2.0**-149  # 0.75 of the smallest: rounds up
    assert scalar("ldexp(1.0, -150)", "f32") == 0.0  # a tie: to even
    assert scalar("ldexp(f64(3.0), 1023)", "f64") == math.inf


def test_inf_and_nan_are_constants_that_adapt() -> None:
    assert scalar("inf", "f32") == math.inf and scalar("-inf", "f64") == -math.inf
    assert math.isnan(scalar("nan", "f32")) and math.isnan(scalar("nan + f64(1.0)", "f64"))
    assert scalar("as_i64(f64(nan))", "i64") == 0x7FF8000000000000


def test_a_constant_map_of_zero_or_one_elements_packs() -> None:
    """At n = 0 and 1 a map of a constant (a 0-d value for every element) packs into its
    payload field (it kept stride 0, which the byte view refused)."""
    for n in (0, 1):
        for typ, value, want in (("f32", "0.0", 0.0), ("f64", "f64(1.5)", 1.5),
                                 ("f16", "f16(0.5)", 0.5), ("i32", "i32(3)", 3)):  # fmt: skip
            got = enc(f"return concat(map(n, i => {value}));", torch.zeros(n), f"{typ}[n]")
            assert got.tolist() == [want] * n
