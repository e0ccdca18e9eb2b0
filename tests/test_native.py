"""The generated C kernels compute what the reference interpreter computes.

For every shipped algorithm (and small programs exercising every op and type the shipped ones do
not), the C kernel's payload bytes equal the reference's, and its decoded values and new state
equal the reference's (NaN compares equal to NaN: NaN payload bits inside decoded values and
state are unspecified). Inputs are drawn from value "regimes" in which a float sum is exact in
f64 whatever the order (see docs/reference/compll-api.md, "Equal on every backend"), so the
comparison can be exact.
"""

from __future__ import annotations

import math
import platform
import re
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hipress.compll import Algorithm, BackendError, algorithms, load, load_source, shipped_path
from hipress.compll.backends.c.native import NativeBackend, NativeError
from hipress.compll.backends.cache import C_FLAGS, KernelCache, Toolchain
from hipress.compll.backends.select import AutoBackend, NativeUnavailableWarning
from hipress.compll.frontend.check import param_variants
from hipress.compll.frontend.parse import parse
from hipress.compll.ir.calls import CallError
from hipress.compll.ir.source import SourceFile

TOOLCHAIN = Toolchain.detect()
pytestmark = pytest.mark.skipif(TOOLCHAIN is None, reason="no C compiler")

NAN, INF = float("nan"), float("inf")
PACK_SIZES = (0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 255, 256, 257)


def _variants() -> list[tuple[str, dict]]:
    out = []
    for name in algorithms():
        out.append((name, {}))
        src = SourceFile.read(shipped_path(name))
        out += [(name, v) for v in param_variants(parse(src))]
    return out


VARIANTS = _variants()


def _pair(name: str, params: dict) -> tuple[Algorithm, Algorithm]:
    return load(name, backend="reference", **params), load(name, backend="cpu", **params)


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, except that any NaN equals any NaN."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.dtype.is_floating_point:
        return torch.equal(a, b)
    a, b = a.reshape(-1), b.reshape(-1)
    both_nan = torch.isnan(a) & torch.isnan(b)
    same = (a == b) & (torch.signbit(a) == torch.signbit(b))
    return bool((same | both_nan).all())


def run_both(ref: Algorithm, cpu: Algorithm, x: torch.Tensor, steps: int = 2) -> None:
    """Encode ``steps`` times with each backend (same seed) and decode with both; compare."""
    n = x.numel()
    s1 = ref.init_state(n, seed=12345, tensor_id=7)
    s2 = cpu.init_state(n, seed=12345, tensor_id=7)
    sent = []
    for step in range(steps):
        p1 = ref.encode(x, s1)
        p2 = cpu.encode(x, s2)
        sent.append(p1)
        if not torch.equal(p1, p2):
            bad = (p1 != p2).nonzero().reshape(-1)[:8].tolist()
            raise AssertionError(f"{ref.name} n={n} step {step}: payload bytes differ at {bad}")
        for k in s1.tensors:
            assert same_values(s1.tensors[k], s2.tensors[k]), f"{ref.name}: state {k} differs"
        for acc in (False, True):
            o1 = torch.linspace(-1, 1, n)
            o2 = o1.clone()
            ref.decode(p1, n, o1, accumulate=acc)
            cpu.decode(p1, n, o2, accumulate=acc)
            assert same_values(o1, o2), f"{ref.name} n={n}: decode(accumulate={acc}) differs"
    # several payloads averaged (the reference's decode_sum is decode, accumulate, divide)
    for payloads, div in ((sent[:1], 1), (sent, len(sent)), ([*sent, sent[0]], 3.0)):
        o1 = ref.decode_sum(payloads, n, divide_by=div)
        o2 = cpu.decode_sum(payloads, n, divide_by=div)
        assert same_values(o1, o2), f"{ref.name} n={n}: decode_sum of {len(payloads)} differs"


# ---------------------------------------------------------------- input strategies
# Regimes in which every f64 sum of the values is exact, so its order cannot matter.


def _nice(k: int, e: int) -> float:
    return k * 2.0**e


REGIMES = {
    "nice": st.builds(_nice, st.integers(-(2**10), 2**10), st.integers(-12, 6)),
    "tiny": st.builds(_nice, st.integers(-(2**10), 2**10), st.integers(-149, -140)),
    "huge": st.builds(_nice, st.integers(-(2**10), 2**10), st.integers(100, 118)),
}
SPECIALS = st.sampled_from([NAN, INF, -INF, 0.0, -0.0])


@st.composite
def gradients(draw: st.DrawFn, max_n: int = 300) -> torch.Tensor:
    n = draw(st.one_of(st.sampled_from(PACK_SIZES), st.integers(0, max_n)))
    regime = draw(st.sampled_from(sorted(REGIMES)))
    pattern = draw(st.sampled_from(["mixed", "plain", "equal", "zero"]))
    vals = REGIMES[regime]
    if pattern == "equal":
        v = draw(st.one_of(vals, SPECIALS))
        data = [v] * n
    elif pattern == "zero":
        data = [draw(st.sampled_from([0.0, -0.0]))] * n
    elif pattern == "plain":
        data = draw(st.lists(vals, min_size=n, max_size=n))
    else:
        data = draw(st.lists(st.one_of(vals, vals, vals, SPECIALS), min_size=n, max_size=n))
    x = torch.tensor(data, dtype=torch.float32)
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.float16, torch.bfloat16]))
    if draw(st.booleans()):  # a non-contiguous view of the same values
        x = torch.stack([x, torch.full_like(x, 7.0)], 1)[:, 0]
    return x.to(dtype) if dtype != torch.float32 else x


# ---------------------------------------------------------------- shipped algorithms


@pytest.mark.parametrize(("name", "params"), VARIANTS, ids=[f"{n}-{p}" for n, p in VARIANTS])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=gradients())
def test_kernel_equals_reference(name: str, params: dict, x: torch.Tensor) -> None:
    ref, cpu = _pair(name, params)
    run_both(ref, cpu, x)


@pytest.mark.parametrize("name", algorithms())
def test_kernel_equals_reference_large(name: str) -> None:
    """Sizes that use every thread, tile and pack boundary (random normal values: sums may
    round differently, so the payload is compared exactly only where no sum is involved)."""
    ref, cpu = _pair(name, {})
    g = torch.Generator().manual_seed(3)
    for n in (2048 * 9 + 5,):
        # integers: every f64 sum is exact, so the comparison is exact
        x = torch.randint(-64, 64, (n,), generator=g).float() / 8
        x[::97] = 0.0
        run_both(ref, cpu, x, steps=2)


def test_float_input_is_converted_like_the_reference() -> None:
    ref, cpu = _pair("terngrad", {})
    x = torch.randn(1000, dtype=torch.float64).to(torch.bfloat16)
    run_both(ref, cpu, x)
    out16 = torch.ones(1000, dtype=torch.float16)
    ref16 = out16.clone()
    p = ref.encode(x, ref.init_state(1000))
    cpu.decode(p, 1000, out16, accumulate=True)
    ref.decode(p, 1000, ref16, accumulate=True)
    assert torch.equal(out16, ref16)


# ---------------------------------------------------------------- every op and type

SCANS = """
algorithm t_scan "scans and sorts";
param m: i64 = 3;
payload { a: f32[n]; b: i64[n]; c: f32[n]; d: i32[n]; e: f32[n]; f: i32[n]; h: f64[n]; k: u8[n]; }
encode(g) {
    let a = scan(sum, g);
    let b = scan(sum, n, i => i32(g[i] * 100.0));
    let c = scan(min, g);
    let d = scan(max, n, i => i32(g[i] * 1000.0));
    let e = sort(g);
    let f = sort(n, i => i32(g[i] * 7.0) % i32(m));
    let h = sort(n, i => f64(g[i]) * 3.0);
    let k = scan(max, n, i => u8(g[i] * 50.0));
    return concat(a, b, c, d, e, f, h, k);
}
decode(p) {
    return map(n, i => p.a[i] + p.c[i] + p.e[i] + f32(p.b[i]) + f32(p.d[i]) + f32(p.f[i])
                       + f32(p.h[i]) + f32(p.k[i]));
}
"""

REDUCTIONS = """
algorithm t_red "reductions";
param seg: i64 = 5;
payload {
    smin: f32; smax: f32; sabs: f32; ssum: f32; dmin: f64; dmax: f64; dsum: f64; dabs: f64;
    imin: i32; imax: i32; iabs: i32; isum: i64; cnt: i64; anyv: bool; allv: bool; umax: u8;
    lmin: i64; labs: i64; cust: f32; custi: i32; custb: bool;
    gmin: f32[(n + seg - 1) / seg]; gmax: f64[(n + seg - 1) / seg];
    gabs: i32[(n + seg - 1) / seg]; gsum: f64[(n + seg - 1) / seg];
    gisum: i64[(n + seg - 1) / seg]; gcnt: i64[(n + seg - 1) / seg];
    gany: bool[(n + seg - 1) / seg]; gall: bool[(n + seg - 1) / seg];
    gmaxu: u16[(n + seg - 1) / seg]; gfabs: f32[(n + seg - 1) / seg];
}
encode(g) {
    let smin = reduce(min, g);
    let smax = reduce(max, g);
    let sabs = reduce(absmax, g);
    let ssum = reduce(sum, g);
    let dmin = reduce(min, n, i => f64(g[i]) * 1.5);
    let dmax = reduce(max, n, i => f64(g[i]) - 0.25);
    let dsum = reduce(sum, n, i => f64(g[i]));
    let dabs = reduce(absmax, n, i => f64(g[i]));
    let imin = reduce(min, n, i => i32(g[i] * 1e9));
    let imax = reduce(max, n, i => i32(g[i] * 1e9));
    let iabs = reduce(absmax, n, i => i32(g[i] * 3e9));
    let isum = reduce(sum, n, i => i32(g[i] * 1e9));
    let cnt = reduce(count, n, i => g[i] > 0.5);
    let anyv = reduce(any, n, i => isnan(g[i]));
    let allv = reduce(all, n, i => g[i] <= 1e30);
    let umax = reduce(max, n, i => u8(g[i] * 100.0));
    let lmin = reduce(min, n, i => i64(g[i] * 1e20));
    let labs = reduce(absmax, n, i => i64(g[i] * 1e20));
    let cust = reduce((a, b) => a * 0.5 + b, 1.0, g);
    let custi = reduce((a, b) => a * 3 - b, i32(7), n, i => i32(g[i] * 10.0));
    let custb = reduce((a, b) => a != b, true, n, i => g[i] > 0.0);
    let gmin = segreduce(min, seg, g);
    let gmax = segreduce(max, seg, n, i => f64(g[i]));
    let gabs = segreduce(absmax, seg, n, i => i32(g[i] * 3e9));
    let gsum = segreduce(sum, seg, n, i => f64(g[i]) * 3.0);  // (a square would need > 53 bits)
    let gisum = segreduce(sum, seg, n, i => i32(g[i] * 1e9));
    let gcnt = segreduce(count, seg, n, i => g[i] < 0.0);
    let gany = segreduce(any, seg, n, i => g[i] > 1.0);
    let gall = segreduce(all, seg, n, i => g[i] > -1.0);
    let gmaxu = segreduce(max, seg, n, i => u16(g[i] * 1000.0));
    let gfabs = segreduce(absmax, seg, g);
    return concat(smin, smax, sabs, ssum, dmin, dmax, dsum, dabs, imin, imax, iabs, isum, cnt,
                  anyv, allv, umax, lmin, labs, cust, custi, custb, gmin, gmax, gabs, gsum, gisum,
                  gcnt, gany, gall, gmaxu, gfabs);
}
decode(p) {
    return map(n, i => p.smin + p.gmin[i / seg] + f32(p.gsum[i / seg]) + f32(p.gabs[i / seg]));
}
"""

CASTS = """
algorithm t_cast "casts and scalar ops";
payload {
    a: u8[n]; b: i8[n]; c: u16[n]; d: i16[n]; e: u32[n]; f: i32[n]; h: i64[n];
    k: f16[n]; l: bf16[n]; m: f16[n]; o: bf16[n]; q: f64[n]; r: bool[n];
    s: f32[n]; t: f64[n]; u: i32[n]; v: u8[n]; w: i64[n]; x: f32[n]; y: i16[n]; z: u32[n];
    hh: f32[n]; bb: f32[n]; ii: i32[n]; uu: u16[n];
}
encode(g) {
    let a = map(n, i => u8(g[i] * 300.0));
    let b = map(n, i => i8(g[i] * 300.0));
    let c = map(n, i => u16(g[i] * 70000.0));
    let d = map(n, i => i16(g[i] * 70000.0));
    let e = map(n, i => u32(g[i] * 5e9));
    let f = map(n, i => i32(g[i] * 3e9));
    let h = map(n, i => i64(g[i] * 1e19));
    let k = map(n, i => f16(g[i] * 70000.0));
    let l = map(n, i => bf16(g[i] * 1e30));
    let m = map(n, i => f16(i32(g[i] * 100000.0)));
    let o = map(n, i => bf16(i64(g[i] * 1e9) * 16777217));
    let q = map(n, i => f64(g[i]) / 3.0);
    let r = map(n, i => g[i] > 0.0 && !isinf(g[i]));
    let s = map(n, i => round(g[i] * 4.0) + floor(g[i]) * ceil(g[i]) - trunc(g[i] * 3.0)
                        + abs(g[i]) + sign(g[i]));
    let t = map(n, i => round(f64(g[i]) * 2.5) + sign(f64(g[i]) - 0.5) + f64(g[i]) % 0.3);
    let u = map(n, i => {
        let p = i32(g[i] * 1000.0);
        let q2 = i32(g[(i + 1) % n] * 10.0);
        return p / q2 + p % q2 + (p << q2) + (p >> q2) + ~p + -p + abs(p) * sign(p)
               + min(p, q2) - max(p, q2);
    });
    let v = map(n, i => {
        let p = u8(g[i] * 255.0);
        let q2 = u8(g[(i + 3) % n] * 9.0);
        return p / q2 + p % q2 + (p << q2) + (p >> q2) + ~p - p * q2 + (p ^ q2) + (p & q2)
               + (p | q2);
    });
    let w = map(n, i => {
        let p = i64(g[i] * 1e18) * 7;
        let q2 = i64(g[(i + 2) % n] * 3.0) - 1;
        return p / q2 + p % q2 + (p << q2) + (p >> q2) + (i64(-9223372036854775807) - 1) / q2;
    });
    let x = map(n, i => min(g[i], g[(i + 1) % n]) - max(g[i], -g[i]) + clamp(g[i], -0.5, 0.5)
                        + clamp(g[i], -1e6, 1e6) % 0.7);
    let y = map(n, i => i16(u8(g[i] * 200.0)) * i16(-300) + i16(i8(g[i] * 100.0)));
    let z = map(n, i => u32(i32(g[i] * 100.0)) * u32(4000000) + u32(f32(f16(g[i])) != 0.0));
    let hh = map(n, i => f32(k[i]) + f32(l[i]) + f32(f16(g[i])) + f32(bf16(g[i])));
    let bb = map(n, i => f32(f64(g[i]) * 1e-300 * 1e300) + f32(r[i]) + f32(i64(g[i] * 1e12)));
    let ii = map(n, i => i32(f16(g[i] * 1000.0)) + i32(bf16(g[i] * 1e10)) + i32(isnan(g[i])));
    let uu = map(n, i => u16(f64(g[i]) * 1e5) + u16(r[i]));
    return concat(a, b, c, d, e, f, h, k, l, m, o, q, r, s, t, u, v, w, x, y, z, hh, bb, ii, uu);
}
decode(p) {
    return map(n, i => f32(p.k[i]) + f32(p.l[i]) + f32(p.a[i]) + p.s[i]);
}
"""

SPARSE = """
algorithm t_sparse "filter, topk, scatter, gather, packed arrays, random, scalar state";
param bound: i64 = 7;
state acc: f32[n];
state tick: i32;
state flag: bool;
payload {
    cnt: i64; idx: i32[min(n, bound)]; tk: i32[min(n, 5)]; tk2: i32[min(n, 4)];
    tk3: i32[min(n, 3)]; vals: f32[min(n, 5)]; sc: f32[n]; sci: i32[n]; q2: uint<2>[n];
    q4: uint<4>[(n + 1) / 2]; q8: uint<8>[n]; q1: uint<1>[n]; rr: u32[n]; ru: f32[n];
    ri: i64[n]; b: bool[n]; oob: f32[n]; t: i32; f: bool; rf: i32[min(n, bound)]; rc: i64;
}
encode(g) {
    let c = map(n, i => g[i] + acc[i]);
    let (idx, cnt) = filter(min(n, bound), n, i => c[i] > 0.3);
    let (tk, tc) = topk(min(n, 5), n, i => abs(c[i]));
    let (tk2, tc2) = topk(min(n, 4), n, i => f64(c[i]) * f64(c[i]));
    let (tk3, tc3) = topk(min(n, 3), n, i => i32(c[i] * 4.0));
    let vals = gather(c, tk);
    let sc = scatter(c, map(n, i => i32(g[i] * 10.0)), map(n, i => g[i] * 2.0), n / 2);
    let sci = scatter(n, map(n, i => i32(g[i] * 5.0)), map(n, i => i32(g[i] * 100.0)));
    let w: uint<2>[n] = map(n, i => i32(c[i] * 4.0));
    let q2: uint<2>[n] = map(n, i => w[n - 1 - i] + u8(1));
    let q4: uint<4>[(n + 1) / 2] = map((n + 1) / 2, j => i32(g[2 * j] * 9.0) + i32(tick));
    let q8: uint<8>[n] = map(n, i => q4[i / 2] * u8(3) + w[i]);
    let q1: uint<1>[n] = map(n, i => u8(q8[i] > u8(20) || flag));
    let rr = map(n, i => urand(i) ^ urand(i * 3 + 1, 7));
    let ru = map(n, i => uniform(i) + uniform(n - i, 2));
    let ri = map(n, i => randint(i, 1000) + randint(i, i64(n) + 5, 3));
    let b = map(n, i => q1[i] == u8(1) && c[i] < 0.0);
    let oob = map(n, i => g[i + 1] + g[i - 1] + c[i + 2] + f32(q2[i + 1]) + f32(q4[i]));
    let (rf, rc) = filter(min(n, bound), n, i => uniform(i, 4) < 0.001 + f32(q2[i]) * 0.0);
    acc = map(n, i => c[i] * 0.5 + f32(tick));
    tick = tick + i32(cnt + tc + tc2 + tc3);
    flag = !flag;
    return concat(cnt, idx, tk, tk2, tk3, vals, sc, sci, q2, q4, q8, q1, rr, ru, ri, b, oob, tick,
                  flag, rf, rc);
}
decode(p) {
    let base = map(n, i => f32(p.q2[i]) * 0.25 + f32(p.q1[i]));
    return scatter(base, p.idx, map(min(n, bound), j => f32(j) + 0.5), p.cnt);
}
"""

ROTATIONS = """
algorithm t_rot "rotated x[(i + h) % n] and segment x[i / d] reads of tile loops";
param dz: i64 = 0;
state tick: i64;
state r: f32[n];
payload {
    a: f32[n]; b: f32[n]; cc: u8[n]; q: uint<2>[n]; mx: f32; cnt: i64; idx: i32[min(n, 9)];
    cnt2: i64; idx2: i32[min(n, 9)]; d: f32[n]; sg: f32[n]; sg2: f32[n]; sg3: f32[n];
    sgi: i32[min(n, 300)]; sgc: i64;
}
encode(g) {
    let off = randint(0, n, 1) + tick % 3;  // in [0, n + 2): may equal n or more
    let big: i64 = 9223372036854775000;      // i + big wraps around
    let c = map(n, i => g[i] * 2.0 + 1.0);
    let q: uint<2>[n] = map(n, i => i32(abs(g[i]) * 3.0));
    let a = map(n, i => c[(i + off) % n] + g[(off + i) % n]);
    let b = map(n, i => f32(q[(i + big) % n]) + c[(i + (n - 3)) % n]);
    let cc = map(n, i => u8(q[(i + off + 1) % n]) + u8(q[(i + 1) % n]));
    let mx = reduce(max, n, i => c[(i + off) % n] * f32(i % 5));
    let (idx, cnt) = filter(min(n, 9), n, j => c[(j + off) % n] > 2.5);
    let (idx2, cnt2) = filter(min(n, 9), n, j => g[(j + (0 - off)) % n] < -0.5);
    let d = map(n, i => g[(i + off) % (n + 1)] + g[(i + off) % 7]);  // not the loop length
    let per = map((n + 6) / 7, s => g[s * 7] - 1.0);
    let h = tick % 5 - 2;  // -2 .. 2: zero and negative divisors
    let sg = map(n, i => per[i / 7] + f32(q[i / 3]));  // (separate sums: one NaN hides all)
    let sg2 = map(n, i => r[i / 2] + per[i / (h + 3)]);
    let sg3 = map(n, i => g[i / h] + per[i / dz]);
    let (sgi, sgc) = filter(min(n, 300), n, j => per[j / 7] > 0.0 && f32(q[j / 5]) < 2.0);
    r = map(n, i => r[i / 2] + g[i]);  // reads the old state while writing it
    tick = tick + 1;
    return concat(a, b, cc, q, mx, cnt, idx, cnt2, idx2, d, sg, sg2, sg3, sgi, sgc);
}
decode(p) {
    return map(n, i => p.a[i] + p.b[i]);
}
"""

BITS = """
algorithm t_bits "bit casts, exponent, ldexp, inf and nan";
payload {
    u: u32[n]; s: i32[n]; e: i32[n]; e64: i32[n]; w: i64[n];
    back: f32[n]; back64: f64[n]; l: f32[n]; l64: f64[n]; l64s: f64[n];
    h: i32; hl: f32; hw: i64;
}
encode(g) {
    let u = map(n, i => as_u32(g[i]));
    let s = map(n, i => as_i32(g[i] * g[(i + 1) % n]));             // NaN from Inf * 0
    let e = map(n, i => exponent(g[i]));
    let e64 = map(n, i => exponent(f64(g[i]) * f64(g[(i + 3) % n]) * 1e-300));  // f64 subnormals
    let w = map(n, i => as_i64(f64(g[i]) / f64(g[(i + 2) % n])));  // NaN from 0/0, Inf/Inf
    let back = map(n, i => as_f32(urand(i) ^ as_u32(g[i])));         // any bits, NaNs included
    let back64 = map(n, i => as_f64(as_i64(f64(g[i])) + i64(urand(i, 1))));
    let l = map(n, i => ldexp(g[i], i32(urand(i, 2) % 700) - 350));
    let l64 = map(n, i => ldexp(f64(g[i]) * 1e-200, i64(urand(i, 3) % 5000) - 2500));
    // 53-bit significands scaled into the subnormals, where rounding twice would show
    let l64s = map(n, i => ldexp(f64(g[i]) * 1.2345678901234567, i64(urand(i, 4) % 120) - 1100));
    let amax = reduce(absmax, g);                                     // host scalars too
    let h = exponent(amax) + exponent(nan) - exponent(-inf);
    let hl = ldexp(amax, h - 200) + as_f32(as_u32(nan) | 1);
    return concat(u, s, e, e64, w, back, back64, l, l64, l64s, h, hl, as_i64(f64(hl) * inf));
}
decode(p) {
    return map(n, i => as_f32(p.u[i] ^ u32(p.s[i])) + ldexp(f32(p.back64[i]), p.e[i] % 64));
}
"""

# natural compression (docs/reference/compll-language.md, "Bits of a float") written both ways:
# with bit casts, and with exponent and ldexp; they agree except for subnormal x
NATURAL = """
algorithm t_natural "natural compression, two ways";
payload { a: f32[n]; b: f32[n]; }

fn natural(x: f32, r: u32) -> f32 {
    let b = as_u32(x);
    let up = (r >> 9) < (b & 0x7FFFFF);             // with probability mantissa / 2^23
    let down = b & 0xFF800000;                      // sign and exponent: a power of two
    return isnan(x) ? x : as_f32(up ? down + 0x800000 : down);   // or the next one up
}

fn natural_exp(x: f32, u: f32) -> f32 {
    let e = exponent(x);                            // 2^e <= |x| < 2^(e+1)
    let up = u < ldexp(abs(x), -e) - 1.0;           // with probability |x| / 2^e - 1
    let m = ldexp(1.0, up ? e + 1 : e);
    return isnan(x) ? x : (x < 0.0 ? -m : m);
}

encode(g) {
    let a = map(n, i => natural(g[i], urand(i)));
    let b = map(n, i => natural_exp(g[i], uniform(i)));
    return concat(a, b);
}
decode(p) { return p.a; }
"""

PROGRAMS = {
    "scans": SCANS, "reductions": REDUCTIONS, "casts": CASTS, "sparse": SPARSE,
    "rotations": ROTATIONS, "bits": BITS, "natural": NATURAL,
}  # fmt: skip


def docs_example(first_line: str) -> str:
    """The ```c block of docs/reference/compll-language.md that starts with ``first_line``."""
    text = (Path(__file__).parent.parent / "docs" / "reference" / "compll-language.md").read_text()
    blocks = re.findall(r"```c\n(.*?)```", text, flags=re.DOTALL)
    return next(b for b in blocks if b.startswith(first_line))


# f32 bit patterns at the edges: zeros, subnormals, the smallest normal, powers of two, the
# largest finite, infinities, NaNs of either sign, quiet and signalling
BIT_EDGES = [
    0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00400000, 0x00000003,
    0x00800000, 0x80800000, 0x3F800000, 0x3FC00000, 0xBF7FFFFF, 0x40000000, 0x4B000001,
    0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001,
    0x7FFFFFFF, 0x7F000000, 0x00800001,
]  # fmt: skip


def bit_edge_inputs(n: int) -> torch.Tensor:
    """``n`` floats: every edge pattern (as many as fit, a different rotation per n), then
    random bit patterns and random values of every magnitude."""
    g = torch.Generator().manual_seed(n)
    rand_bits = torch.randint(-(2**31), 2**31, (n,), generator=g, dtype=torch.int64)
    mags = torch.randn(n, generator=g) * 2.0 ** torch.randint(-150, 128, (n,), generator=g)
    x = torch.where(torch.arange(n) % 2 == 0, rand_bits.to(torch.int32).view(torch.float32), mags)
    edges = torch.tensor(BIT_EDGES, dtype=torch.int64).to(torch.int32).view(torch.float32)
    k = min(n, len(edges))
    x[:k] = edges.roll(n)[:k]
    return x.float()


def _program_pair(text: str) -> tuple[Algorithm, Algorithm]:
    src = SourceFile("test.cll", text)
    return load_source(src, backend="reference"), load_source(src, backend="cpu")


@pytest.mark.parametrize("prog", sorted(PROGRAMS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=gradients(max_n=200))
def test_every_op_equals_reference(prog: str, x: torch.Tensor) -> None:
    ref, cpu = _program_pair(PROGRAMS[prog])
    run_both(ref, cpu, x, steps=3)


@pytest.mark.parametrize("prog", sorted(PROGRAMS))
def test_every_op_equals_reference_threaded(prog: str) -> None:
    """Sizes past the one-thread cutoff, so every stage runs in parallel."""
    ref, cpu = _program_pair(PROGRAMS[prog])
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-200, 200, (2048 * 8 + 3,), generator=g).float() / 64
    x[::101] = NAN
    x[5::211] = -INF
    x[7::307] = -0.0
    run_both(ref, cpu, x, steps=1)


@pytest.mark.parametrize("n", [1, 9, 1000])
@pytest.mark.parametrize("prog", ["bits", "natural"])
def test_bit_builtins_on_edge_values(prog: str, n: int) -> None:
    ref, cpu = _program_pair(PROGRAMS[prog])
    run_both(ref, cpu, bit_edge_inputs(n), steps=2)


def test_natural_compression_in_a_few_operations() -> None:
    """The docs' example equals the test program's; both forms round to a power of two around
    each element (the same one for normal x), and the rounding is unbiased."""
    from hipress.compll.ir.payload import unpack

    ref = _program_pair(NATURAL)[0]
    docs_ref, docs_cpu = _program_pair(docs_example("algorithm natural"))
    x = bit_edge_inputs(1000)
    run_both(docs_ref, docs_cpu, x)
    n = x.numel()
    a, b = unpack(ref.program, n, ref.encode(x, ref.init_state(n, seed=4)))
    docs = docs_ref.decode(docs_ref.encode(x, docs_ref.init_state(n, seed=4)), n)
    assert same_values(docs, a)
    normal = torch.isinf(x) | ((x.abs() >= 2.0**-126) & torch.isfinite(x))
    assert same_values(a[normal], b[normal])
    fin = torch.isfinite(x) & (x != 0)
    for y in (a, b):
        lo = 2.0 ** torch.floor(torch.log2(x.double().abs()))  # 2^e <= |x| < 2^(e+1)
        if y is a:  # the bit form rounds a subnormal to 0 or 2^-126
            lo = torch.where(x.abs() < 2.0**-126, torch.zeros_like(lo), lo)
        hi = torch.where(lo == 0, torch.full_like(lo, 2.0**-126), 2 * lo)
        hi = torch.where(hi >= 2.0**128, torch.full_like(hi, math.inf), hi)
        mag = y.double().abs()
        assert ((mag == lo) | (mag == hi))[fin].all()
        assert (torch.signbit(y) == torch.signbit(x))[fin & (mag != 0)].all()
        assert same_values(y[~fin & (x != 0)], x[~fin & (x != 0)]) and (y[x == 0] == 0).all()
    ones = torch.full((20000,), 1.3)
    for y in unpack(ref.program, 20000, ref.encode(ones, ref.init_state(20000, seed=1))):
        assert set(y.tolist()) == {1.0, 2.0} and abs(y.double().mean().item() - 1.3) < 0.02


# 0 - x is -x, except +0 for x = +0: gcc 12 folds it to -x where x cannot be -0 (an integer
# converted, an abs), so the renderer writes it as a select
ZERO_MINUS = """
algorithm t_zero_minus "0 - x of values that cannot be -0";
payload { a: f32[n]; b: f64[n]; c: f32[n]; d: f32[n]; }
encode(g) {
    var v: f32 = 0.0;
    if (g[0] > 100.0) { v = 1.0; }
    let a = map(n, i => 0.0 - abs(g[i]));
    let b = map(n, i => f64(0.0) - f64(i32(g[i])));
    let c = map(n, i => { var w: f32 = 0.0; w -= f32(i32(g[i])); return w; });
    let d = map(n, i => v - f32(u8(g[i])));
    return concat(a, b, c, d);
}
decode(p) { return map(n, i => p.a[i] + p.c[i] + p.d[i]); }
"""


def test_zero_minus_a_value_that_cannot_be_negative_zero() -> None:
    ref, cpu = _program_pair(ZERO_MINUS)
    x = torch.tensor([0.0, -0.0, 1.0, -2.5, 0.25, math.nan, 300.0, -math.inf, 7.0])
    run_both(ref, cpu, x, steps=1)
    a = cpu.encode(x, cpu.init_state(9))[:36].view(torch.float32)
    assert torch.equal(a[:2].view(torch.int32), torch.zeros(2, dtype=torch.int32))  # +0, not -0


def test_sqrt_is_ieee_within_an_ulp_of_torch() -> None:
    """The kernels' sqrt is correctly rounded; torch's vectorised sqrt is not always (1 ulp)."""
    text = """
    algorithm t "sqrt"; payload { a: f32[n]; b: f64[n]; }
    encode(g) { return concat(map(n, i => sqrt(g[i])), map(n, i => sqrt(f64(g[i])))); }
    decode(p) { return map(n, i => p.a[i]); }
    """
    ref, cpu = _program_pair(text)
    x = torch.rand(5000) * 100
    st_ = cpu.init_state(5000)
    p = cpu.encode(x, st_)
    a = p[: 4 * 5000].view(torch.float32)
    b = p[4 * 5000 :].view(torch.float64)
    assert torch.equal(a, x.double().sqrt().float())  # f32 sqrt via f64 is exact
    import numpy as np

    assert torch.equal(b, torch.from_numpy(np.sqrt(x.double().numpy())))
    r = ref.encode(x, ref.init_state(5000))
    ra = r[: 4 * 5000].view(torch.float32)
    assert ((ra.view(torch.int32) - a.view(torch.int32)).abs() <= 1).all()


# ---------------------------------------------------------------- half precision, both code paths

HALVES = """
algorithm t_half "conversions to and from f16 / bf16";
payload { h: f16[n]; b: bf16[n]; }
encode(g) {
    let h = map(n, i => f16(g[i]));
    let b = map(n, i => bf16(g[i]));
    return concat(h, b);
}
decode(p) { return map(n, i => f32(p.h[i]) + f32(p.b[i])); }
"""


def _half_inputs() -> torch.Tensor:
    """Every f16 value (as f32), every f16 rounding midpoint and its neighbours, bf16 ditto,
    and f32 specials (NaN payloads, subnormals, overflow)."""
    h = torch.arange(0, 65536, dtype=torch.int32).to(torch.int16).view(torch.float16)
    h32 = h.float()
    fin = h32[torch.isfinite(h32)].double()
    mids = ((fin[:-1] + fin[1:]) / 2).float()
    b = torch.arange(0, 65536, dtype=torch.int32) << 16
    b32 = b.view(torch.float32)
    bits = b32.view(torch.int32)
    near = torch.cat([(bits + 0x8000), (bits + 0x7FFF), (bits + 0x8001)]).view(torch.float32)
    special = torch.tensor([0x7F800001, 0xFF812345, 0x7FC00000, 1, 0x807FFFFF, 0x477FF000,
                            0x477FEFFF, 0x38800000, 0x387FFFFF, 0x33000000, 0x33000001],
                           dtype=torch.int64).to(torch.int32).view(torch.float32)  # fmt: skip
    return torch.cat([h32, mids, mids.nextafter(torch.tensor(INF)), b32, near, special])


# the hand-vectorised helpers (Philox, f16 tiles, filter masks) have AVX-512 and AVX2 versions
# and a scalar fallback: each path this CPU can run (the best first, then with the better ones
# switched off) must compute what the reference does. On x86 the scalar path is built as for a
# CPU without AVX2 (x86-64-v2, SSE4.2), where it runs: under -march=native the compiler
# vectorises its plain loops for AVX-512 instead, which takes it several times longer to build.
_NO_AVX2 = ("-march=x86-64-v2",) if platform.machine().lower() in ("x86_64", "amd64") else ()
PATHS = {
    "native": (),
    "no-avx512": ("-DHP_NO_AVX512",),
    "scalar": ("-DHP_NO_AVX512", "-DHP_NO_AVX2", *_NO_AVX2),
}


def _on_path(ref: Algorithm, path: str, tmp_path) -> Algorithm:  # type: ignore[no-untyped-def]
    assert TOOLCHAIN is not None
    tc = Toolchain(TOOLCHAIN.cc, TOOLCHAIN.version, C_FLAGS + PATHS[path])
    return Algorithm(ref.program, NativeBackend(ref.program, KernelCache(tmp_path), tc))


@pytest.mark.parametrize("path", sorted(PATHS))
def test_half_conversions_match_torch(path: str, tmp_path) -> None:
    ref = load_source(SourceFile("half.cll", HALVES), backend="reference")
    run_both(ref, _on_path(ref, path, tmp_path), _half_inputs(), steps=1)


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("name", ["terngrad", "dgc", "randomk"])
def test_random_streams_and_compaction_on_every_path(name: str, path: str, tmp_path) -> None:
    """Philox tiles (16, 8 or 1 block at a time) and filter masks against the reference, at
    sizes around the vector widths and tiles, and for several seeds, tensor ids and steps."""
    ref = load(name, backend="reference")
    cpu = _on_path(ref, path, tmp_path)
    g = torch.Generator().manual_seed(11)
    for n in (1, 5, 31, 33, 127, 129, 2048 * 3 + 67):
        run_both(ref, cpu, torch.randn(n, generator=g), steps=2)
    # tensor ids and steps move the stream: several of both
    x = torch.randn(4099, generator=g)
    for tid in (0, 3, 2**31 + 5):
        s1 = ref.init_state(x.numel(), seed=2**40 + 9, tensor_id=tid)
        s2 = cpu.init_state(x.numel(), seed=2**40 + 9, tensor_id=tid)
        for _ in range(2):
            assert torch.equal(ref.encode(x, s1), cpu.encode(x, s2)), (name, path, tid)


@pytest.mark.parametrize(("name", "n"), [("topk", 2048 * 1024 + 67), ("randomk", 2048 * 256 + 67)])
def test_topk_guess_its_fallback_and_no_guess(name: str, n: int) -> None:
    """From 256 tiles of keys up, the C top-k guesses where its k-th key lies from 16 keys in
    every 512 and collects in one pass: the result is the reference's where the guess holds
    (random data; all keys equal: one key, ties in index order), where its pass proves it wrong
    (topk: the large values only where the sample does not look, then the radix passes run on
    what that pass stored) and where it is not tried (topk's smaller sizes: too many
    candidates)."""
    ref, cpu = _pair(name, {})
    x = torch.randn(n, generator=torch.Generator().manual_seed(5))
    i = torch.arange(n)
    hidden = torch.where((i % 512 < 256) & (i // 2048 % 4 == 0), x * 100, x)
    for g, steps in ((x, 2), (hidden, 1), (torch.ones(n), 1)):
        run_both(ref, cpu, g, steps=steps)


@pytest.mark.parametrize(("ratio", "spread"), [(0.01, 0.0), (0.2, 0.2)])
def test_topk_guess_narrows_a_crowded_bucket(ratio: float, spread: float) -> None:
    """Values crowded into one top-11-bit bucket (all in [1, 1.25)), or the k-th largest on the
    border of two (a fifth in [1.25, 1.5)): the sample's next bits narrow the guess's range
    before the collecting pass. Bit-exact with the reference."""
    n = 2048 * 256 + 67
    ref, cpu = _pair("topk", {"ratio": ratio})
    gen = torch.Generator().manual_seed(21)
    x = 1.0 + 0.25 * torch.rand(n, generator=gen)
    high = torch.rand(n, generator=gen) < spread
    x = torch.where(high, x + 0.25, x) * torch.where(torch.rand(n, generator=gen) < 0.5, -1, 1)
    run_both(ref, cpu, x, steps=2)


def test_topk_of_a_gradient_with_fewer_non_zeros_than_k() -> None:
    """An embedding's gradient: a few rows non-zero, fewer elements than k, so the k-th largest
    |c| is 0 and k - (non-zeros) zeros are taken in index order. The sample sees one key in the
    threshold's bucket and collects in one pass; tiny values the sample missed in that bucket
    (denormals above 0) are still taken first. Bit-exact with the reference over steps of error
    feedback."""
    rows, dim = 4096, 128
    n = rows * dim
    ref, cpu = _pair("topk", {})  # k = 5243: fewer non-zeros each step
    gen = torch.Generator().manual_seed(12)
    sr, sc = ref.init_state(n), cpu.init_state(n)
    for step in range(4):
        g = torch.zeros(rows, dim)
        g[torch.randint(0, rows, (30,), generator=gen)] = torch.randn(30, dim, generator=gen)
        g = g.reshape(-1)
        if step == 2:  # denormals where the sample does not look
            g[torch.arange(0, n, 512) + 3] = 1e-40
        assert torch.equal(ref.encode(g, sr), cpu.encode(g, sc)), step


# ---------------------------------------------------------------- selection and errors


def test_auto_runs_the_c_kernel_on_cpu_tensors() -> None:
    alg = load("onebit")
    assert isinstance(alg.backend, AutoBackend)
    assert isinstance(alg.backend.backend_for(torch.device("cpu")), NativeBackend)
    x = torch.randn(100)
    p = alg.encode(x, alg.init_state(100))
    ref = load("onebit", backend="reference")
    assert torch.equal(p, ref.encode(x, ref.init_state(100)))


def test_no_compiler_auto_falls_back_with_one_warning_at_the_callers_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    alg = load("terngrad", backend="auto")
    x = torch.randn(50)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        payload = alg.encode(x, alg.init_state(50))
        alg.encode(x, alg.init_state(50))
    hits = [w for w in caught if issubclass(w.category, NativeUnavailableWarning)]
    assert len(hits) == 1
    assert "$CC=/nonexistent/cc names no executable" in str(hits[0].message)
    assert hits[0].filename == __file__  # the user's line, not a line inside hipress
    ref = load("terngrad", backend="reference")
    assert torch.equal(payload, ref.encode(x, ref.init_state(50)))


def test_explicit_cpu_without_a_compiler_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(
        BackendError, match=r"backend='cpu' needs a C compiler: \$CC=/nonexistent/cc"
    ):
        load("terngrad", backend="cpu")
    monkeypatch.delenv("CC")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(BackendError, match=r"no compiler on PATH \(tried cc, gcc, clang\)"):
        load("terngrad", backend="cpu")


def test_wrong_device_is_a_clear_error() -> None:
    alg = load("onebit", backend="cpu")
    with pytest.raises(NativeError, match="CPU tensors"):
        alg.encode(torch.zeros(8, device="meta"), alg.init_state(8, device="meta"))
    st_ = alg.init_state(8)
    with pytest.raises(CallError, match="state `comp` is on cpu, the gradient on meta"):
        alg.encode(torch.zeros(8, device="meta"), st_)
    st_.tensors["comp"] = st_.tensors["comp"].double()
    with pytest.raises(CallError, match=r"state `comp` must be a contiguous torch\.float32"):
        alg.encode(torch.zeros(8), st_)


def test_workspace_is_reused() -> None:
    alg = load("topk", backend="cpu")
    be = alg.backend
    assert isinstance(be, NativeBackend)
    x = torch.randn(5000)
    st_ = alg.init_state(5000)
    alg.encode(x, st_)
    ws = be._buffer("ws", 5000, 0)
    alg.encode(x, st_)
    assert be._buffer("ws", 5000, 0).data_ptr() == ws.data_ptr()
    p = alg.encode(x, st_)
    alg.decode(p, 5000)
    alg.decode(p, 5000, out=torch.zeros(5000), accumulate=True)
    alg.decode_sum([p, p], 5000)
    assert be._buffer("ws", 5000, 0).data_ptr() == ws.data_ptr()  # one for encode and decodes
    assert [k for k in be._ws if k[1] == 5000] == [("ws", 5000)]
    assert math.isfinite(float(alg.decode(alg.encode(x, st_), 5000).sum()))


@pytest.mark.parametrize("name", ["topk", "randomk"])
def test_topk_keeps_no_key_array_and_narrows_crowded_prefixes(name: str) -> None:
    """The selection recomputes its keys per pass: the workspace holds candidates, not keys.
    Values crowded into one top-11-bit bucket (more than its candidate buffer holds) take a
    further pass on the next bits; equal values (a prefix as long as the key) are ties taken
    in index order."""
    n, ratio = 50_000, 0.0002  # k = 10: 8232 candidates per thread
    ref, cpu = _pair(name, {"ratio": ratio})
    be = cpu.backend
    assert isinstance(be, NativeBackend)
    m = 1 << 20  # were 9 (topk) and 16 (randomk) bytes per element
    assert be._lib.hp_encode_ws_bytes(m, 2) < 2 * m
    gen = torch.Generator().manual_seed(8)
    crowded = 1.0 + torch.rand(n, generator=gen) * 0.2  # one exponent, distinct mantissas
    ties = torch.where(torch.arange(n) % 7 == 0, 2.0, 1.0)
    for x in (crowded, ties, torch.ones(n), -crowded):
        run_both(ref, cpu, x, steps=2)


# the encodes whose first pass is a plain loop over the gradient report NaN/Inf from it
# (dgc, graddrop and topk: the filter's or top-k's pass that computes their state)
IN_KERNEL_FLAG = {
    "bf16", "blocksign", "dgc", "efsignsgd", "fp16", "graddrop", "onebit", "randomk", "signsgd", "tbq",
    "terngrad", "topk",
}  # fmt: skip


@pytest.mark.parametrize("name", algorithms())
def test_encode_reports_nonfinite_from_its_own_pass(name: str) -> None:
    from hipress.compll.lower.lower import lower

    cpu, ref = load(name, backend="cpu"), load(name, backend="reference")
    prog = ref.program
    loops = [len(st.loops) for st in lower(prog, "encode").steps]
    assert [len(st.loops) for st in lower(prog, "encode", nonfinite=True).steps] == loops
    for n in (1, 9, 16384 + 9):
        for bad, dtype in ((None, torch.float32), (NAN, torch.float32), (INF, torch.float32),
                           (-INF, torch.float16), (NAN, torch.bfloat16)):  # fmt: skip
            x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
            if bad is not None:
                x[n // 2] = bad
            p1, f1 = cpu.encode_checked(x, cpu.init_state(n))
            p2, f2 = ref.encode_checked(x, ref.init_state(n))
            # the same answer on every backend: the flag, or None where the kernels cannot
            want = (bad is not None) if name in IN_KERNEL_FLAG else None
            assert torch.equal(p1, p2) and f2 == want, (name, n, bad)
            assert f1 == want, (name, n, bad, dtype)
            assert cpu.reports_nonfinite is ref.reports_nonfinite is (want is not None)


@pytest.mark.parametrize("name", ["dgc", "graddrop"])
def test_a_filter_keeps_one_bound_per_thread(name: str) -> None:
    """The compaction's scratch is one bound (2k indices) per thread, not one per element; the
    workspace grows when the thread count does, and results do not depend on it."""
    n = 1 << 20
    cpu, ref = load(name, backend="cpu"), load(name, backend="reference")
    be = cpu.backend
    assert isinstance(be, NativeBackend)
    bound = 2 * math.ceil(n * (0.001 if name == "dgc" else 0.01))
    enc = be._lib.hp_encode_ws_bytes

    def filters(nt: int) -> int:  # two, of 4 bytes per index, each within n, 64-byte aligned
        return 2 * (-(-4 * min(n, nt * bound) // 64) * 64)

    rest = enc(n, 1) - filters(1)  # the sample sort, the values taken
    assert all(enc(n, nt) == rest + filters(nt) for nt in (2, 3, 64))
    assert enc(n, 2) < n  # was 8 bytes per element
    x = torch.randn(n, generator=torch.Generator().manual_seed(3))
    before = torch.get_num_threads()
    try:
        for nt in (1, 2, 1):  # a run on more threads after a workspace sized for one
            torch.set_num_threads(nt)
            s1, s2 = ref.init_state(n, seed=4), cpu.init_state(n, seed=4)
            assert torch.equal(ref.encode(x, s1), cpu.encode(x, s2))
    finally:
        torch.set_num_threads(before)


def test_concurrent_calls_from_threads_match_the_reference() -> None:
    """Encode and decode from several threads at once (as CaSync's callbacks do) stay exact."""
    from concurrent.futures import ThreadPoolExecutor

    from hipress.compll import load as _load

    n = 50_000
    for name in ("topk", "dgc", "terngrad"):
        cpu = _load(name, backend="cpu")
        ref = _load(name, backend="reference")
        grads = [torch.randn(n, generator=torch.Generator().manual_seed(s)) for s in range(6)]

        def work(k: int, alg=cpu, grads=grads) -> tuple[torch.Tensor, torch.Tensor]:
            st = alg.init_state(n, seed=k, tensor_id=k)
            p = alg.encode(grads[k], st)
            return p, alg.decode(p, n)

        with ThreadPoolExecutor(6) as pool:
            got = list(pool.map(work, range(6)))
        for k, (p, d) in enumerate(got):
            st = ref.init_state(n, seed=k, tensor_id=k)
            want = ref.encode(grads[k], st)
            assert torch.equal(p, want), (name, k)
            assert torch.equal(d, ref.decode(want, n)), (name, k)


# ---------------------------------------------------------------- segment reductions, fused

SEGFUSE = """
algorithm t_segfuse "a segment reduction run block by block with the loops that read it";
param seg: i64 = 5;
const ns = (n + seg - 1) / seg;
state r: f32[n];
payload { sc: f32[ns]; hi: i32[ns]; a: f32[n]; b: i8[n]; c: f32[n]; }
encode(g) {
    let mx = segreduce(absmax, seg, n, i => g[i] + r[i]);
    let sc = map(ns, s => mx[s] / 127.0);
    let hi = map(ns, s => i32(mx[s] * 8.0) + i32(s));
    let v = map(ns, s => mx[s] * 0.5 + 1.0);  // virtual, read at [i / seg]
    let a = map(n, i => g[i] - mx[i / seg] + v[i / seg] + f32(i % 3));
    let b = map(n, i => i8(clamp(round(g[i] / sc[i / seg]), -127.0, 127.0)));
    let c = map(n, i => a[i] * 2.0 + f32(hi[i / seg]) - f32(b[i]));
    r = map(n, i => r[i] * 0.5 + f32(b[(i + 1) % n]));  // a later level: in place, not fused
    return concat(sc, hi, a, b, c);
}
decode(p) { return map(n, i => p.a[i] + p.c[i] + f32(p.b[i]) * p.sc[i / seg]); }
"""
# segment lengths below, at and above a tile (2048) and its divisors; sizes around both
SEG_LENGTHS = (2, 5, 8, 256, 2047, 2048, 2049, 5000)


def _seg_sizes(seg: int) -> list[int]:
    par = 16384  # the one-thread cutoff
    out = {0, 1, 9, seg - 1, seg, seg + 1, 2047, 2048, 2049, 3 * seg + 2, par + 3 * seg + 1}
    return sorted(s for s in out if s >= 0)


def _seg_input(n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    x = torch.randint(-300, 300, (n,), generator=g).float() / 64
    x[7::1001] = NAN
    x[5::3001] = INF
    x[11::2999] = -0.0
    x[13::1777] = 0.0
    return x


@pytest.mark.parametrize("seg", SEG_LENGTHS)
def test_fused_segment_reduction_equals_reference(seg: int) -> None:
    from hipress.compll.lower.lower import lower

    src = SourceFile("segfuse.cll", SEGFUSE)
    ref = load_source(src, backend="reference", seg=seg)
    cpu = load_source(src, backend="cpu", seg=seg)
    (fu,) = lower(ref.program, "encode").fusions  # the path under test is taken
    assert [it.op.name for lp in fu.seg_loops for it in lp.items] == ["sc", "hi"]
    assert sorted(it.op.name for lp in fu.elem_loops for it in lp.items) == ["a", "b", "c"]
    for n in _seg_sizes(seg):
        run_both(ref, cpu, _seg_input(n), steps=2)


@pytest.mark.parametrize("chunk", (8, 9, 100, 256, 2047, 2048, 2049, 4096, 5000, 1048576))
def test_int8_fused_encode_equals_reference(chunk: int) -> None:
    ref, cpu = _pair("int8", {"chunk": chunk})
    for n in sorted({0, 1, 9, chunk - 1, chunk, chunk + 1, 2049, 3 * chunk + 5, 16384 + 7}):
        x = _seg_input(n)
        if n > 40:  # a chunk of zeros, one of subnormals (tiny scales: the clamp matters)
            x[: min(n, chunk)] = 0.0
            x[-20:] = torch.arange(20).float() * 2.0**-140
        run_both(ref, cpu, x, steps=1)


@pytest.mark.parametrize("read", ["amax[i / 8 + 1]", "amax[(i + 8) / 8]", "amax[i / 4]"])
def test_segment_reads_outside_the_block_stay_exact(read: str) -> None:
    """Reads of other segments than the element's own run unfused (after the whole reduction);
    successive calls with other inputs would see stale or missing values otherwise."""
    text = f"""
    algorithm t "reads outside the segment"; payload {{ q: f32[n]; }}
    encode(g) {{
        let amax = segreduce(absmax, 8, g);
        return concat(map(n, i => g[i] - {read}));
    }}
    decode(p) {{ return map(n, i => p.q[i]); }}
    """
    src = SourceFile("t.cll", text)
    ref, cpu = load_source(src, backend="reference"), load_source(src, backend="cpu")
    for n in (2047, 2049, 16384 + 9):
        for k in range(3):
            x = _seg_input(n) * (k + 1) + k
            assert torch.equal(cpu.encode(x, cpu.init_state(n)), ref.encode(x, ref.init_state(n)))


# ---------------------------------------------------------------- dgc, graddrop: rare paths


def _sparse_cases(n: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(n)
    alt = torch.where(torch.arange(n) % 3 == 0, -1.0, 1.0)  # all pass: the compaction fills up
    cases = {"plain": torch.randn(n, generator=gen), "full": alt}
    for name, base in (("nan", torch.randn(n, generator=gen)), ("nan-full", alt)):
        x = base.clone()
        x[n // 2] = NAN  # found by the compaction, or (full) only by the pass after it
        x[-1] = -INF
        cases[name] = x
    cases["all-nan"] = torch.full((n,), NAN)
    return cases


@pytest.mark.parametrize("name", ["dgc", "graddrop"])
def test_sampled_sparsifiers_rare_paths_equal_reference(name: str) -> None:
    """The compaction filling up, non-finite values found by it or only by the full scan that
    runs when it filled up, and the non-finite compaction (C: passes skipped by their guards)."""
    params = {"s_percent": 0.01} if name == "dgc" else {"drop_ratio": 0.99}
    ref, cpu = _pair(name, params)
    for n in (1, 2, 9, 1000, 16384 + 9):
        for x in _sparse_cases(n).values():
            run_both(ref, cpu, x, steps=2)


GUARDED = """
algorithm t_guard "stages whose every value is false skip their pass";
state on: bool;
payload { q: i32[min(n, 5)]; c: i64; a: bool; k: i64; }
encode(g) {
    let (p, c) = filter(min(n, 5), n, j => on && g[j] > 0.0);
    let a = reduce(any, n, i => on && isnan(g[i]));
    let k = reduce(count, n, i => !on && g[i] < 0.0);  // (another guard, same loop)
    on = !on;
    return concat(map(min(n, 5), t => p[t] + 1), c, a, k);
}
decode(p) { return map(n, i => f32(p.c + p.k)); }
"""


def test_guarded_stages_equal_reference_when_skipped_after_a_run() -> None:
    ref, cpu = _program_pair(GUARDED)
    for n in (0, 1, 7, 16384 + 5):
        x = _seg_input(n)
        run_both(ref, cpu, x, steps=3)  # off, on, off: a skipped filter after a real one


MINMAX_CONST = """
algorithm t_mmc "min / max / clamp with constants (one compare and select in C)";
payload { a: f32[n]; b: f32[n]; c: f32[n]; d: f64[n]; e: f32[n]; f: f32[n]; q: i8[n]; }
encode(g) {
    let a = map(n, i => max(g[i], 0.5));
    let b = map(n, i => min(-0.25, g[i]));
    let c = map(n, i => clamp(g[i], -1.0, 1.0));
    let d = map(n, i => max(2.0, min(f64(g[i]), -1e300)) + min(f64(g[i]), 1e300));
    let e = map(n, i => max(g[i], -0.0));  // zeros: the general helpers (-0 < +0)
    let f = map(n, i => min(0.0, g[i]));
    let q = map(n, i => i8(clamp(g[i] * 100.0, -127.0, 127.0)));
    return concat(a, b, c, d, e, f, q);
}
decode(p) { return map(n, i => p.a[i]); }
"""


def test_min_max_with_constants_equal_reference() -> None:
    ref, cpu = _program_pair(MINMAX_CONST)
    vals = [NAN, INF, -INF, 0.0, -0.0, 0.5, -0.25, 1.0, -1.0, 2.0, 0.49, -3.0, 1.27, 1.28, -1.3]
    x = torch.tensor(vals * 3, dtype=torch.float32)
    run_both(ref, cpu, x, steps=1)


# ---------------------------------------------------------------- sparse decode_sum


def test_the_sparse_decodes_are_recognised_and_nothing_else() -> None:
    from hipress.compll.lower.sparse import sparse_decode

    found = {a for a in algorithms() if sparse_decode(load(a, backend="reference").program)}
    assert found == {"dgc", "graddrop", "randomk", "topk"}
    # the same shape with a flag that is not 0-or-NaN, or another output map, is not sparse
    base = SourceFile.read(shipped_path("randomk")).text
    for old, new in (
        ("p.val[j] * 0.0", "p.val[j] * 2.0"),
        ("map(n, i => s[i] + flag)", "map(n, i => s[i] * 2.0 + flag)"),
    ):
        assert old in base
        variant = SourceFile("variant.cll", base.replace(old, new))
        prog = load_source(variant, backend="reference").program
        assert sparse_decode(prog) is None


def _sparse_payload(alg: Algorithm, n: int, idx: list[int], val: list[float], count=None):  # type: ignore[no-untyped-def]
    from hipress.compll.ir.payload import layout, pack

    prog = alg.program
    fields, total = layout(prog, n)
    k = next(f.length for f, s in zip(fields, prog.payload, strict=True) if s.name == "idx")
    i = torch.zeros(k, dtype=torch.int64)
    v = torch.zeros(k, dtype=torch.float32)
    i[: len(idx)] = torch.tensor(idx, dtype=torch.int64)
    v[: len(val)] = torch.tensor(val, dtype=torch.float32)
    values = {"idx": i, "val": v, "count": torch.tensor(len(idx) if count is None else count)}
    out = torch.empty(total, dtype=torch.uint8)
    pack(prog, n, [values[s.name] for s in prog.payload], out)
    return out


@pytest.mark.parametrize("name", ["topk", "dgc"])
@pytest.mark.parametrize(
    "case",
    ["ascending", "rotated", "repeated index", "out of range", "nan", "inf", "count past bound"],
)
def test_sparse_decode_sum_equals_decode_by_decode(name: str, case: str) -> None:
    """The fused sum (zero once, add every payload's pairs, flags and division at the end)
    against the reference's decode, accumulate, divide: payloads a real encoder would send and
    ones it would not (a repeated index takes the payload-by-payload path; bad indices are
    ignored; a non-finite value makes every element NaN)."""
    n = 1000
    ref, cpu = _pair(name, {"ratio": 0.01} if name == "topk" else {"s_percent": 0.005})
    from hipress.compll.ir.payload import layout

    k = layout(ref.program, n)[0][-1].length  # idx and val: k (topk) or the bound (dgc)
    m = k if name == "topk" else k - 2  # dgc's count may be below its bound
    gen = torch.Generator().manual_seed(5)
    ps = []
    for r in range(3):
        idx = sorted(torch.randperm(n, generator=gen)[:m].tolist())
        val = (torch.randn(m, generator=gen) * 3).tolist()
        count = None
        if case == "rotated":
            idx = idx[3:] + idx[:3]
        elif case == "repeated index" and r == 1:
            idx[4] = idx[2]
            idx = sorted(idx)
            val[2] = 1e-8  # added to val[4] first when grouped, to the sum when not
        elif case == "out of range" and r == 2:
            idx[0], idx[-1] = -5, n + 3
        elif case == "nan" and r == 1:
            val[3] = NAN
        elif case == "inf" and r == 2:
            val[0] = -INF
        elif case == "count past bound" and name == "dgc":
            count = 10**6
        ps.append(_sparse_payload(ref, n, idx, val, count))
    for div in (1, 3.0):
        want = ref.decode_sum(ps, n, divide_by=div)
        got = cpu.decode_sum(ps, n, divide_by=div)
        assert same_values(want, got), (case, div)
    if case in ("nan", "inf"):
        assert bool(torch.isnan(got).all())
    # decode and decode-accumulate of each payload, the latter into signed zeros and NaN too
    base = torch.linspace(-1, 1, n)
    base[::7], base[1::7], base[2::50] = -0.0, 0.0, NAN
    for p in ps:
        assert same_values(ref.decode(p, n), cpu.decode(p, n)), case
        o1, o2 = base.clone(), base.clone()
        ref.decode(p, n, out=o1, accumulate=True)
        cpu.decode(p, n, out=o2, accumulate=True)
        assert same_values(o1, o2) and bool((torch.signbit(o1) == torch.signbit(o2)).all()), case
    # a sparse decode needs no workspace, unless a payload repeats an index (dgc's count past
    # its bound takes the unused zero indices after the last one sent)
    repeats = case == "repeated index" or (case == "count past bound" and name == "dgc")
    assert (("ws", n) in cpu.backend._ws) == repeats, case


# ---------------------------------------------------------------- programs a red team wrote

_RED = {
    # a ?: of int and float literals
    "mixed_select": ("", "let v = map(n, i => g[i] > 0.0 ? 1 : (g[i] < 0.0 ? 0.5 : 0));"),
    # a segment reduction over a length other than n, dividing by a non-constant
    "segreduce_length": (
        "const m = n + 1;",
        "let s = segreduce(sum, 2, m, t => g[t / m]); let v = map(n, i => g[i] + s[i / 2]);",
    ),
    # a loop-invariant square root inside a segment reduction (computed once)
    "invariant_sqrt": (
        "const c = sqrt(f32(n) + 0.5);",
        "let s = segreduce(sum, 4, n, t => g[t] * c); let v = map(n, i => s[i / 4] / c);",
    ),
}


@pytest.mark.parametrize("name", sorted(_RED))
def test_red_team_programs_equal_reference(name: str) -> None:
    decl, body = _RED[name]
    text = (f'algorithm t_{name} "t";\n{decl}\npayload {{ v: f32[n]; }}\nencode(g) {{ {body} '
            "return concat(v); }\ndecode(p) { return map(n, i => p.v[i]); }\n")  # fmt: skip
    ref, cpu = _program_pair(text)
    for n in (0, 1, 9, 1000, 2048 * 8 + 3):
        x = torch.randint(-64, 64, (n,), generator=torch.Generator().manual_seed(n)).float() / 8
        run_both(ref, cpu, x, steps=2)
    if name == "invariant_sqrt":
        src = cpu.backend.source  # type: ignore[attr-defined]
        hoisted = [ln for ln in src.splitlines() if "sqrtf(" in ln and "const float inv" in ln]
        assert hoisted, "the constant's sqrt should be computed once, before the loop"


def test_int8_decodes_values_near_the_float32_maximum_finite() -> None:
    ref, cpu = _pair("int8", {})
    x = torch.tensor([3.4028234663852886e38, -3.3e38, 1.0, 2.0**127] * 64)
    run_both(ref, cpu, x)
    assert torch.isfinite(cpu.decode(cpu.encode(x, cpu.init_state(256)), 256)).all()
