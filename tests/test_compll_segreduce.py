"""Segment reductions on the C target: short constant segments (one SIMD lane per segment)
give the reference's bytes for every operator, at sizes with and without a partial last
segment, on one thread and on several."""

from __future__ import annotations

import pytest
import torch

from hipress.compll import SourceFile, load_source
from hipress.compll.backends.c.stages import SHORT_SEGMENT

_OPS = {  # operator -> the element lambda and the result type
    "sum": ("f64(g[i])", "f64"),
    "min": ("g[i]", "f32"),
    "max": ("g[i]", "f32"),
    "absmax": ("g[i]", "f32"),
    "count": ("g[i] > 0.0", "i64"),
    "any": ("g[i] < 0.0", "bool"),
    "all": ("isfinite(g[i])", "bool"),
}


def _source(op: str, seg: int) -> SourceFile:
    fn, t = _OPS[op]
    text = f"""algorithm seg "segments of {seg}";
payload {{ s: {t}[(n + {seg - 1}) / {seg}]; }}
encode(g) {{ return concat(segreduce({op}, {seg}, n, i => {fn})); }}
decode(p) {{ return map(n, i => 0.0); }}"""
    return SourceFile("seg.cll", text)


def _input(n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    x = torch.randint(-300, 300, (n,), generator=g).float() / 8
    x[3::17] = float("nan")
    x[5::23] = -float("inf")
    x[7::29] = -0.0
    x[11::31] = 1e-40  # subnormal
    return x


@pytest.mark.parametrize("op", sorted(_OPS))
@pytest.mark.parametrize("seg", [1, 3, 4, SHORT_SEGMENT, SHORT_SEGMENT + 1])
def test_short_segments_equal_the_reference(op: str, seg: int) -> None:
    src = _source(op, seg)
    ref = load_source(src, backend="reference")
    cpu = load_source(src, backend="cpu")
    for n in (0, 1, 9, 2048 * 8 + 3, 1000003):
        x = _input(n)
        p1, p2 = ref.encode(x, ref.init_state(n)), cpu.encode(x, cpu.init_state(n))
        assert torch.equal(p1, p2), (op, seg, n)


def test_short_segments_render_one_lane_per_segment() -> None:
    from hipress.compll.backends.targets import render

    short = render(load_source(_source("max", 4), backend="reference").program, "c")
    long = render(load_source(_source("max", SHORT_SEGMENT + 1), backend="reference").program, "c")
    assert "one SIMD lane per segment" in short
    assert "one SIMD lane per segment" not in long
