"""Block-local sections: inside ``block(B) { ... }`` a read of the section's own array outside
the element's aligned block of B reads 0 (the reference interpreter runs the masked ops), and
the C kernel (one pass over the blocks, each in thread-private buffers) and the emulated CUDA
kernels (the ops as they stand) give the reference's bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hipress.compll import Algorithm, SourceFile, load_source
from hipress.compll.backends.cuda.emu import CxxToolchain, emulated_backend
from hipress.compll.ir import nodes as ir

EXAMPLE = Path(__file__).parent.parent / "examples" / "hadamard_1bit.cll"

PROGRAM = """algorithm t;
param lb: i32 in [1, 5] = 2;
const b = 1 << lb;
payload { v: f32[n + 3]; s: f32[(n + 3 + b - 1) / b]; w: i32[n]; }
encode(g) {
    block(b) {
        let a = map(n + 3, i => g[i] * 2.0);
        let c = map(n + 3, i => a[i + 1] - a[i - 1] + a[i ^ 1] + a[i / 2]);
        let s = segreduce(max, b, c);
        let w = map(n, i => i32(c[i] > s[i / b] * 0.5) + i32(s[i / b + 1] != 0.0));
    }
    return concat(c, s, w);
}
decode(p) { return map(n, i => p.v[i]); }
"""


def _alg(backend: str, **params: object) -> Algorithm:
    return load_source(SourceFile("t.cll", PROGRAM), backend=backend, **params)


def _parts(alg: Algorithm, g: torch.Tensor) -> list[torch.Tensor]:
    n = g.numel()
    p = alg.encode(g, alg.init_state(n)).cpu()
    v = p[: 4 * (n + 3)].view(torch.float32)
    nb = (n + 3 + 3) // 4
    s = p[(4 * (n + 3) + 7) // 8 * 8 :][: 4 * nb].view(torch.float32)
    return [v, s]


def test_reads_outside_the_block_are_zero_in_the_reference() -> None:
    g = torch.arange(1.0, 6.0)  # n = 5, blocks of 4 over 8 elements: [0, 4) and [4, 8)
    v, s = _parts(_alg("reference"), g)
    a = torch.cat([g * 2.0, torch.zeros(3)])
    want = torch.zeros(8)
    for i in range(8):
        lo = i // 4 * 4

        def at(j: int, lo: int = lo) -> float:
            return float(a[j]) if lo <= j < lo + 4 else 0.0

        want[i] = at(i + 1) - at(i - 1) + at(i ^ 1) + at(i // 2)
    assert torch.equal(v, want)
    assert torch.equal(s, torch.stack([want[:4].max(), want[4:].max()]))


def test_a_section_is_one_op_and_its_names_live_on() -> None:
    ops = _alg("reference").program.encode.ops
    blocks = [op for op in ops if isinstance(op, ir.Block)]
    assert len(blocks) == 1 and blocks[0].size == 4
    assert [type(x).__name__ for x in blocks[0].ops] == ["Map", "Map", "SegReduce", "Map"]


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(n=st.sampled_from([0, 1, 5, 31, 32, 33, 4099]), lb=st.integers(1, 5),
       seed=st.integers(0, 99))  # fmt: skip
def test_c_kernel_equals_the_reference(n: int, lb: int, seed: int) -> None:
    g = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    if n > 3:
        g[3] = float("nan")
    ref, cpu = _alg("reference", lb=lb), _alg("cpu", lb=lb)
    p1, p2 = ref.encode(g, ref.init_state(n)), cpu.encode(g, cpu.init_state(n))
    assert torch.equal(p1, p2), (n, lb)


@pytest.mark.skipif(CxxToolchain.detect() is None, reason="no C++ compiler")
@pytest.mark.parametrize("lb", [1, 3])
def test_emulated_cuda_equals_the_reference(lb: int) -> None:
    ref = _alg("reference", lb=lb)
    emu = Algorithm(ref.program, emulated_backend(ref.program, blocks=3, shuffle=True))
    for n in (1, 9, 1000):
        g = torch.randn(n, generator=torch.Generator().manual_seed(n))
        p1, p2 = ref.encode(g, ref.init_state(n)), emu.encode(g, emu.init_state(n))
        assert torch.equal(p1, p2.cpu()), (lb, n)


def test_hadamard_example_round_trips_on_every_backend() -> None:
    src = SourceFile.read(EXAMPLE)
    ref = load_source(src, backend="reference", log_block=4)
    cpu = load_source(src, backend="cpu", log_block=4)
    for n in (1, 17, 70001):
        g = torch.randn(n, generator=torch.Generator().manual_seed(n))
        g[n // 2] = 40.0
        p1, p2 = ref.encode(g, ref.init_state(n)), cpu.encode(g, cpu.init_state(n))
        assert torch.equal(p1, p2), n
        d1, d2 = ref.decode(p1, n), cpu.decode(p1, n)
        assert torch.equal(d1, d2), n
        # 1 bit per element with a per-block scale: the sign of the rotated value is kept, so
        # the decode correlates with the gradient
        assert torch.nn.functional.cosine_similarity(d1, g, dim=0) > 0.5 or n == 1
    g = torch.ones(40)
    g[5] = float("nan")
    out = ref.decode(ref.encode(g, ref.init_state(40)), 40)
    assert not torch.isfinite(out[:16]).any() and torch.isfinite(out[16:]).all()


# the C target's fast paths inside a section: a map choosing on bit d of its index runs as
# pairs (i, i + d) on whole blocks, reads at [i / B] read the block's index, and uint<1>
# arrays read at [i] are unpacked a byte at a time per block; each must give the reference's
# bytes, on whole and partial blocks, with NaN inputs
PAIRS = """algorithm t2;
param lb: i32 in [1, 12] = 4;
const b = 1 << lb;
const blocks = (n + b - 1) / b;
payload { s: f32[blocks]; q: uint<1>[n]; h: f32[n]; }
encode(g) {
    block(b) {
        var h = map(n, i => g[i] * 3.0);
        for s in range(lb) {
            let d = 1 << s;
            h = map(n, i => (i & d) == 0 ? h[i] + h[i + d] : h[i - d] - h[i]);
        }
        let l1 = segreduce(sum, b, n, i => abs(h[i]));
        let q: uint<1>[n] = map(n, i => h[i] < 0.0 ? 1 : 0);
    }
    return concat(map(blocks, k => l1[k]), q, h);
}
decode(p) {
    block(b) {
        let x = map(n, i => p.q[i] == 0 ? p.s[i / b] : -p.s[i / b]);
        let y = map(n, i => (i & (b / 2)) != 0 ? x[i - b / 2] * 2.0
                                                : x[i] + x[i + b / 2] + f32(i / b));
    }
    return y;
}
"""


@pytest.mark.parametrize("lb", [1, 4, 12])
def test_pairs_and_packed_reads_equal_the_reference(lb: int) -> None:
    from hipress.compll.backends.c.program import render_c

    src = SourceFile("t2.cll", PAIRS)
    ref = load_source(src, backend="reference", lb=lb)
    cpu = load_source(src, backend="cpu", lb=lb)
    # the pair loop is emitted where the bit is at least SPLIT_MIN (B >= 16 here)
    assert ("hp_j += " in render_c(ref.program)) == (lb >= 4)
    for n in (1, 9, 1000, 8197):
        g = torch.randn(n, generator=torch.Generator().manual_seed(n))
        g[n // 3] = float("nan")
        p1, p2 = ref.encode(g, ref.init_state(n)), cpu.encode(g, cpu.init_state(n))
        assert torch.equal(p1, p2), (lb, n)
        d1, d2 = ref.decode(p1, n), cpu.decode(p1, n)
        assert torch.equal(d1.view(torch.int32), d2.view(torch.int32)), (lb, n)


# butterfly chains: consecutive stages (i & d) == 0 ? h[i] + h[i + d] : h[i - d] - h[i], each
# read by the next alone and stored nowhere, run in SIMD registers on whole blocks of at most
# 16 vectors; a stage that is stored (s1) or read by another op (s2) ends its chain
CHAINS = """algorithm t3;
param lb: i32 in [1, 12] = 5;
const b = 1 << lb;
payload { s1: f32[n]; m: f32[(n + b - 1) / b]; q: uint<1>[n]; }
encode(g) {
    block(b) {
        let a = map(n, i => g[i] * 3.0);
        let s1 = map(n, i => (i & 1) == 0 ? a[i] + a[i + 1] : a[i - 1] - a[i]);
        let s2 = map(n, i => (i & 2) == 0 ? s1[i] + s1[i + 2] : s1[i - 2] - s1[i]);
        let s3 = map(n, i => (i & 16) == 0 ? s2[i] + s2[i + 16] : s2[i - 16] - s2[i]);
        let s4 = map(n, i => (i & 4) == 0 ? s3[i] + s3[i + 4] : s3[i - 4] - s3[i]);
        let s5 = map(n, i => (i & 8) == 0 ? s4[i] + s4[i + 8] : s4[i - 8] - s4[i]);
        let m = segreduce(max, b, n, i => s5[i] + s2[i]);
        let q: uint<1>[n] = map(n, i => s5[i] < 0.0 ? 1 : 0);
    }
    return concat(s1, m, q);
}
decode(p) { return map(n, i => p.s1[i]); }
"""


@pytest.mark.parametrize("path", ["native", "no-avx512", "scalar"])
@pytest.mark.parametrize(("text", "lb"), [(PAIRS, 3), (PAIRS, 5), (PAIRS, 8), (PAIRS, 9),
                                          (CHAINS, 5), (CHAINS, 7)])  # fmt: skip
def test_butterfly_chains_in_registers_equal_the_reference(text: str, lb: int, path: str,
                                                           tmp_path) -> None:  # fmt: skip
    from test_native import _on_path

    from hipress.compll.backends.c.butterfly import chains
    from hipress.compll.backends.c.program import render_c

    ref = load_source(SourceFile("t.cll", text), backend="reference", lb=lb)
    blocks = [op for op in ref.program.encode.ops if isinstance(op, ir.Block)]
    found = chains(blocks[0], [True] * len(blocks[0].ops), {"s1"})
    if text == CHAINS:  # s1 alone (stored), s2 alone (read by m), s3..s5
        assert [(c.first, c.last) for c in found.values()] == [(1, 1), (2, 2), (3, 5)]
    # in registers where a block is a whole number of at most 16 vectors of 8 or 16 floats
    assert ("hp_v0" in render_c(ref.program)) == (3 <= lb <= 8)
    cpu = _on_path(ref, path, tmp_path)
    for n in (1, 9, 1000, 8197):
        g = torch.randn(n, generator=torch.Generator().manual_seed(n))
        g[n // 3] = float("nan")
        g[n // 2] = float("inf") if n > 9 else g[n // 2]
        p1, p2 = ref.encode(g, ref.init_state(n)), cpu.encode(g, cpu.init_state(n))
        assert torch.equal(p1, p2), (lb, n)


# packed payload fields a section fills: on the C target the section packs each block's
# values into the field itself (hipress.compll.backends.c.blockpack), unless later code reads
# the array too (r: then the section stores it a byte per element and a loop packs it); each
# field must hold the reference's bits on whole and partial blocks, for 1, 2 and 4 bits, for a
# field longer than the gradient (blocks past n) and one shorter than the section's longest map
# (blocks with none of its elements)
PACKED = """algorithm t4;
param lb: i32 in [1, 12] = 3;
param k: u32 in {1, 2, 4} = 2;
const b = 1 << lb;
payload { q1: uint<1>[n]; qk: uint<k>[n + 40]; q4: uint<4>[n / 3]; r: uint<2>[n]; t: f32; }
encode(g) {
    block(b) {
        let h = map(n + 40, i => g[i] * 7.0 + f32(i % 5));
        let q1: uint<1>[n] = map(n, i => h[i] < 1.5 ? 1 : 0);
        let qk: uint<k>[n + 40] = map(n + 40, i => u8(clamp(abs(h[i]), 0.0, 200.0)));
        let q4: uint<4>[n / 3] = map(n / 3, i => u8(clamp(h[i] + 8.0, 0.0, 15.0)));
        let r: uint<2>[n] = map(n, i => u8(clamp(h[i], 0.0, 3.0)));
    }
    let t = reduce(sum, n, i => f32(r[i]));
    return concat(q1, qk, q4, r, t);
}
decode(p) { return map(n, i => f32(p.q1[i]) + f32(p.qk[i]) + f32(p.r[i]) + p.t); }
"""


@pytest.mark.parametrize(("lb", "k"), [(1, 1), (3, 2), (4, 4), (8, 1), (11, 2), (12, 4)])
def test_packed_fields_filled_by_a_section_equal_the_reference(lb: int, k: int) -> None:
    from hipress.compll.backends.c.program import render_c

    src = SourceFile("t4.cll", PACKED)
    ref = load_source(src, backend="reference", lb=lb, k=k)
    cpu = load_source(src, backend="cpu", lb=lb, k=k)
    text = render_c(ref.program)
    # blocks of 8 to 2048 elements pack in the section; r, read again after it, never does
    direct = 8 <= 1 << lb <= 2048
    assert ("q1->payload:q1" in text) != direct and ("qk->payload:qk" in text) != direct
    assert "r->payload:r" in text
    for n in (0, 1, 9, 1000, 8197):
        g = torch.randn(n, generator=torch.Generator().manual_seed(n + lb))
        if n > 3:
            g[n // 3] = float("nan")
        for threads in (1, 2):
            torch.set_num_threads(threads)
            p1, p2 = ref.encode(g, ref.init_state(n)), cpu.encode(g, cpu.init_state(n))
            assert torch.equal(p1, p2), (lb, k, n, threads)
