"""The CUDA target's ``block(...)`` section kernel: each thread block keeps a tile of whole
blocks in shared memory. Run emulated (threads and blocks in a shuffled order, so a missing
barrier gives wrong bytes) it gives the reference's bytes for any block size and length, NaN
included; a section too big for shared memory runs as passes; the kernels compile with NVRTC;
on a GPU (marked ``cuda``) the same comparison runs on the device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cuda_marks import needs_nvrtc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hipress.compll import Algorithm, SourceFile, load_source
from hipress.compll.backends.cuda import block
from hipress.compll.backends.cuda.emu import CxxToolchain, emulated_backend
from hipress.compll.backends.cuda.render import cuda_source

EXAMPLE = Path(__file__).parent.parent / "examples" / "hadamard_1bit.cll"

# neighbour, xor and block-start reads of the section's own arrays (0 outside the block), a
# float sum and an absmax per block, a per-block read that may fall in the next block (0) and
# a packed 1-bit output
PROGRAM = """algorithm t;
param b: i32 in [2, 8192] = 4;
const nb = (n + b - 1) / b;
payload { v: f32[n]; s: f32[nb]; m: f32[nb]; q: uint<1>[n]; }
encode(g) {
    block(b) {
        let a = map(n, i => g[i] * 3.0);
        let c = map(n, i => a[i + 1] - a[i - 1] + a[i ^ 1] + a[(i / b) * b]);
        let s = segreduce(sum, b, c);
        let m = segreduce(absmax, b, n, i => c[i]);
        let v = map(n, i => c[i] - s[i / b] / f32(b) + s[i / b + (i & 1)]);
        let q: uint<1>[n] = map(n, i => v[i] < 0.0 ? 1 : 0);
    }
    return concat(v, s, m, q);
}
decode(p) { return map(n, i => p.v[i]); }
"""

needs_cxx = pytest.mark.skipif(CxxToolchain.detect() is None, reason="no C++ compiler")


def _ref(b: int) -> Algorithm:
    return load_source(SourceFile("t.cll", PROGRAM), backend="reference", b=b)


def _lengths(b: int) -> list[int]:
    return sorted({0, 1, 9, b - 1, b + 1, 3 * b + 5})


def _grad(n: int) -> torch.Tensor:
    g = torch.randn(n, generator=torch.Generator().manual_seed(n))
    if n > 5:
        g[5] = float("nan")  # its block's sum and absmax are NaN, the others are not
    return g


def _same(ref: Algorithm, other: Algorithm, b: int, device: str = "cpu") -> None:
    for n in _lengths(b):
        g = _grad(n)
        p1 = ref.encode(g, ref.init_state(n))
        p2 = other.encode(g.to(device), other.init_state(n, device=device))
        assert torch.equal(p1, p2.cpu()), (b, n)


def test_a_section_that_fits_is_one_kernel_in_shared_memory() -> None:
    for b in (2, 3, 255, 4096):
        bufs, which = block.buffers(_ref(b).program.encode.ops[0])
        # a, c (c's buffer cannot be a's: c reads a), the two per-block sums and v; q is
        # read by nothing in the section, so it has no shared array
        assert which[-1] is None and len({w for w in which if w is not None}) == len(bufs)
        assert "in shared memory" in cuda_source(_ref(b).program).source, b
    assert block.shared_bytes(_ref(4096).program.encode.ops[0]) <= block.SHARED_LIMIT
    big = _ref(8192).program.encode.ops[0]
    assert block.too_big(big) and "in shared memory" not in cuda_source(_ref(8192).program).source


@needs_cxx
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(b=st.sampled_from([2, 3, 7, 32, 255, 256, 257, 1000, 4096]))
def test_emulated_section_kernel_equals_the_reference(b: int) -> None:
    ref = _ref(b)
    _same(ref, Algorithm(ref.program, emulated_backend(ref.program, blocks=3, shuffle=True)), b)


@needs_cxx
def test_a_section_too_big_for_shared_memory_runs_as_passes() -> None:
    ref = _ref(8192)
    emu = Algorithm(ref.program, emulated_backend(ref.program, blocks=2, shuffle=True))
    g = _grad(8195)
    assert torch.equal(ref.encode(g, ref.init_state(8195)), emu.encode(g, emu.init_state(8195)))


@needs_cxx
@pytest.mark.parametrize("log_block", [2, 9])
def test_emulated_hadamard_example_equals_the_reference(log_block: int) -> None:
    src = SourceFile.read(EXAMPLE)
    ref = load_source(src, backend="reference", log_block=log_block)
    assert "in shared memory" in cuda_source(ref.program).source
    emu = Algorithm(ref.program, emulated_backend(ref.program, blocks=3, shuffle=True))
    for n in (9, (1 << log_block) + 7):
        g = _grad(n)
        p1, p2 = ref.encode(g, ref.init_state(n)), emu.encode(g, emu.init_state(n))
        assert torch.equal(p1, p2), n
        d1, d2 = ref.decode(p1, n), emu.decode(p1, n)
        assert torch.equal(d1.view(torch.int32), d2.view(torch.int32)), n  # NaN bits too


@needs_nvrtc
def test_section_kernels_compile_with_nvrtc() -> None:
    from hipress.compll.backends.cuda.backend import compile_check

    assert compile_check(_ref(3).program, ("sm_80",))["sm_80"] > 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
@pytest.mark.parametrize("b", [2, 3, 256, 257, 4096])
def test_gpu_section_kernel_equals_the_reference(b: int) -> None:
    ref = _ref(b)
    gpu = load_source(SourceFile("t.cll", PROGRAM), backend="cuda", b=b)
    _same(ref, gpu, b, device="cuda")
