"""Payload layout and byte (un)packing."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hipress.compll import load_source
from hipress.compll.ir.payload import layout, pack, pack_bits, unpack, unpack_bits
from hipress.compll.ir.source import SourceFile

SRC = """algorithm t;
payload { a: f32; b: i64; c: u8; h: f16[n]; q: uint<2>[n]; k: i32[(n + 1) / 2]; z: bf16; }
encode(g) {
    let h = map(n, i => f16(g[i]));
    let q: uint<2>[n] = map(n, i => i);
    let k = map((n + 1) / 2, j => i32(-j));
    return concat(1.5, -3, 250, h, q, k, bf16(0.1));
}
decode(p) { return map(n, i => f32(p.h[i]) + f32(p.q[i]) + f32(p.k[i / 2]) + f32(p.b)); }
"""


def _alg():
    return load_source(SourceFile("t.cll", SRC), backend="reference")


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 300))
def test_layout_aligned_and_exact(n: int) -> None:
    fields, total = layout(_alg().program, n)
    assert total % 8 == 0
    for f in fields:
        assert f.offset % 8 == 0
    end = 0
    for f in fields:
        assert f.offset >= end
        end = f.offset + f.nbytes
    assert total - end < 8
    sizes = {f.name: f.nbytes for f in fields}
    assert sizes == {
        "a": 4,
        "b": 8,
        "c": 1,
        "h": 2 * n,
        "q": (2 * n + 7) // 8,
        "k": 4 * ((n + 1) // 2),
        "z": 2,
    }


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-1000, 1000, width=32), max_size=50))
def test_pack_unpack_roundtrip(xs: list[float]) -> None:
    a = _alg()
    g = torch.tensor(xs, dtype=torch.float32)
    n = g.numel()
    p = a.encode(g, a.init_state(n))
    a_, b, c, h, q, k, z = unpack(a.program, n, p)
    assert float(a_) == 1.5 and int(b) == -3 and int(c) == 250
    assert torch.equal(h, g.to(torch.float16))
    assert torch.equal(q, torch.arange(n) % 4)
    assert torch.equal(k, -torch.arange((n + 1) // 2))
    assert float(z) == float(torch.tensor(0.1).to(torch.bfloat16))
    again = torch.empty_like(p)
    pack(a.program, n, [a_, b, c, h, q, k, z], again)
    assert torch.equal(again, p)


def test_little_endian_bytes() -> None:
    a = _alg()
    p = a.encode(torch.zeros(1), a.init_state(1))
    assert p[8:16].tolist() == list((-3).to_bytes(8, "little", signed=True))
    assert p[0:4].tolist() == list(torch.tensor([1.5]).view(torch.uint8).tolist())


@given(st.sampled_from([1, 2, 4, 8]), st.lists(st.integers(0, 255), max_size=40))
def test_bit_packing_roundtrip(bits: int, vals: list[int]) -> None:
    v = torch.tensor([x % (1 << bits) for x in vals], dtype=torch.int64)
    packed = pack_bits(v, bits)
    assert packed.shape[0] == (len(vals) * bits + 7) // 8
    assert torch.equal(unpack_bits(packed, bits, len(vals)), v)
