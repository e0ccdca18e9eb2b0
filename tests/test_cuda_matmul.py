"""The CUDA target's tiled ``matmul``/``matmul_at``: shared-memory tiles of A and B, each
element of C the f64 sum of its f32 products in k order. Emulated (threads and blocks
shuffled, so a missing barrier gives wrong bytes) it gives the reference's bytes for shapes
that fill no tile exactly, several tiles along every dimension, NaN in A and an operand one
element short (its missing element reads 0); the kernels compile with NVRTC; on a GPU
(marked ``cuda``) the same comparison runs on the device."""

from __future__ import annotations

import pytest
import torch
from cuda_marks import needs_nvrtc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hipress.compll import Algorithm, SourceFile, load_source
from hipress.compll.backends.cuda.emu import CxxToolchain, emulated_backend
from hipress.compll.backends.cuda.matmul import tile_columns
from hipress.compll.backends.cuda.render import cuda_source
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.types import I64

# A is the gradient as m x k (k = n / m, so k varies with n at run time); B and P are stored
# maps; `short` is B one element short
PROG = """algorithm t; param m: i64 in [1, 600] = 3; param r: i64 in [1, 40] = 5;
const k = n / m;
payload { c: f32[m * r]; d: f32[k * r]; s: f32[m * r]; }
encode(g) {
    let b = map(k * r, t => f32(t % 7) * 0.3 - 0.5);
    let p = map(m * r, t => f32(t % 5) * 0.7 - 1.5);
    let short = map(max(k * r - 1, 0), t => b[t]);
    return concat(matmul(g, b, m, k, r), matmul_at(g, p, k, m, r), matmul(g, short, m, k, r));
}
decode(p) { return map(n, i => 0.0); }
"""

needs_cxx = pytest.mark.skipif(CxxToolchain.detect() is None, reason="no C++ compiler")


def _ref(m: int, r: int) -> Algorithm:
    return load_source(SourceFile("t.cll", PROG), backend="reference", m=m, r=r)


def _grad(n: int, seed: int) -> torch.Tensor:
    g = torch.randn(n, generator=torch.Generator().manual_seed(seed))  # sums that round
    if n > 7:
        g[7] = float("nan")  # row 7 / k of C and column 7 % k... of A^T P are NaN
    return g


def _same(ref: Algorithm, other: Algorithm, m: int, ks: list[int], device: str = "cpu") -> None:
    for k in ks:
        g = _grad(m * k + (k % 3), k)  # n need not be a multiple of m
        p1 = ref.encode(g, ref.init_state(g.numel()))
        p2 = other.encode(g.to(device), other.init_state(g.numel(), device=device)).cpu()
        if device == "cpu":
            assert torch.equal(p1, p2), (m, k)  # the bytes, NaNs included
        else:  # a GPU's NaN has its own payload bits
            f1, f2 = p1.view(torch.float32), p2.view(torch.float32)
            assert torch.equal(f1.isnan(), f2.isnan()), (m, k)
            assert torch.equal(f1.nan_to_num(0.0), f2.nan_to_num(0.0)), (m, k)


def test_every_matmul_is_the_tiled_kernel() -> None:
    src = cuda_source(_ref(3, 5).program).source
    assert src.count("(tiled)") == 3 and "segreduce sum" not in src
    assert [tile_columns(ir.Const(v, I64)) for v in (1, 2, 3, 5, 16, 40)] == [1, 2, 4, 8, 16, 16]


@needs_cxx
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(shape=st.sampled_from([(1, 1), (3, 5), (9, 3), (17, 20), (300, 1), (40, 16)]))
def test_emulated_tiled_matmul_equals_the_reference(shape: tuple[int, int]) -> None:
    m, r = shape
    ref = _ref(m, r)
    emu = Algorithm(ref.program, emulated_backend(ref.program, blocks=3, shuffle=True))
    _same(ref, emu, m, [0, 1, 9, 16, 17, 40])


@needs_nvrtc
def test_tiled_matmul_compiles_with_nvrtc() -> None:
    from hipress.compll.backends.cuda.backend import compile_check

    assert compile_check(_ref(17, 20).program, ("sm_90",))["sm_90"] > 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
@pytest.mark.parametrize("shape", [(1, 1), (9, 3), (17, 20), (300, 1), (4096, 4)])
def test_gpu_tiled_matmul_equals_the_reference(shape: tuple[int, int]) -> None:
    m, r = shape
    gpu = load_source(SourceFile("t.cll", PROG), backend="cuda", m=m, r=r)
    _same(_ref(m, r), gpu, m, [0, 1, 9, 16, 17, 40, 1000])
