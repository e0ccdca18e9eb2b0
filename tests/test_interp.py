"""The reference interpreter: each operation's defined result, checked against values computed
independently (by hand or with numpy/Python)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hipress.compll import load_source
from hipress.compll.source import SourceFile


def enc(body: str, g: torch.Tensor, out: str = "f32[n]", head: str = "") -> torch.Tensor:
    """Run ``body`` (which must `return concat(x)`), return field x as a tensor."""
    text = (
        f"algorithm t;\n{head}\npayload {{ x: {out}; }}\nencode(g) {{ {body} }}\n"
        "decode(p) { return map(n, i => 0.0); }"
    )
    a = load_source(SourceFile("t.cll", text), backend="reference")
    st = a.init_state(g.numel())
    payload = a.encode(g, st)
    from hipress.compll.payload import unpack

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
    from hipress.compll.rng import philox_bits

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
