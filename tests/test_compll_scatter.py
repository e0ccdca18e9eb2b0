"""Float scatter-add has a defined order: the values at one index are added in ascending j,
each add rounded, so the reference, the C kernels and the emulated CUDA kernels agree bit for
bit even when many values land on one index (a count sketch's buckets)."""

from __future__ import annotations

import pytest
import torch

from hipress.compll import Algorithm, SourceFile, load_source
from hipress.compll.backends.cuda.backend import CudaBackend
from hipress.compll.backends.cuda.emu import CxxToolchain, EmulatedRuntime

SKETCH = """algorithm sketch "a signed count sketch of the gradient";
param buckets: i64 in [1, 100000] = 97;
payload { s: f32[buckets]; }
fn bucket(i: i64) -> i32 { return i32(i64((u32(i) * 0x9E3779B1) >> 8) % buckets); }
encode(g) {
    let idx = map(n, i => bucket(i));
    let val = map(n, i => ((u32(i) * 0x85EBCA6B) >> 31) == 0 ? g[i] : -g[i]);
    return concat(scatter(buckets, idx, val));
}
decode(p) { return map(n, i => p.s[bucket(i)]); }
"""


def _alg(backend: str, buckets: int) -> Algorithm:
    return load_source(SourceFile("sketch.cll", SKETCH), backend=backend, buckets=buckets)


def _input(n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    # magnitudes over many binades: the order of the adds changes the rounded sums
    return torch.randn(n, generator=g) * 2.0 ** torch.randint(-20, 20, (n,), generator=g)


def test_values_at_one_index_are_added_in_order() -> None:
    text = """algorithm t; payload { s: f32[1]; }
encode(g) { return concat(scatter(1, map(n, i => i32(0)), g)); }
decode(p) { return map(n, i => p.s[0]); }"""
    ref = load_source(SourceFile("t.cll", text), backend="reference")
    g = torch.tensor([1e8, 1.0, -1e8, 0.5])
    # ((1e8 + 1) - 1e8) + 0.5 in f32: the 1 is lost in the first add
    assert ref.decode(ref.encode(g, ref.init_state(4)), 4)[0].item() == 0.5


@pytest.mark.parametrize("buckets", [1, 97, 4096])
def test_sketch_on_c_equals_the_reference(buckets: int) -> None:
    ref, cpu = _alg("reference", buckets), _alg("cpu", buckets)
    # (one bucket: every value in one sequential chain, the reference's slowest case)
    for n in (1, 9, 20011 if buckets == 1 else 1000003):
        g = _input(n)
        p1, p2 = ref.encode(g, ref.init_state(n)), cpu.encode(g, cpu.init_state(n))
        assert torch.equal(p1, p2), (buckets, n)


@pytest.mark.skipif(CxxToolchain.detect() is None, reason="no C++ compiler")
def test_sketch_on_emulated_cuda_equals_the_reference() -> None:
    ref = _alg("reference", 97)
    emu = Algorithm(ref.program, CudaBackend(ref.program, EmulatedRuntime(blocks=3, shuffle=True)))  # type: ignore[arg-type]
    for n in (1, 9, 20011):
        g = _input(n)
        p1, p2 = ref.encode(g, ref.init_state(n)), emu.encode(g, emu.init_state(n))
        assert torch.equal(p1, p2.cpu()), n
