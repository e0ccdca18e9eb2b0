"""The rows of a gradient holding a non-zero bit (hipress.codec.rowsparse.nonzero_rows), found by
the CompLL kernel rowscan.cll on the CPU and by torch elsewhere: the same rows as reading every
element's bits, for -0.0 and NaN, every shape (empty, one row, widths not a power of two) and
layout; the kernel's C and emulated-CUDA code give the reference interpreter's bytes."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hipress.codec.rowsparse import (
    SCAN_BLOCKS,
    build_row_kernels,
    nonzero_rows,
    row_flags,
    scan_block,
    scan_kernel,
)
from hipress.compll import Algorithm, load_file

SCAN = Path(str(resources.files("hipress.codec").joinpath("rowscan.cll")))
INTS = {8: torch.int64, 4: torch.int32, 2: torch.int16}


def expected(g: torch.Tensor) -> torch.Tensor:
    """Rows with a bit that is not zero, element by element in Python's own terms."""
    bits = g.contiguous().view(INTS[g.element_size()]).tolist()
    return torch.tensor([r for r, row in enumerate(bits) if any(row)], dtype=torch.int64)


def sparse(rows: int, width: int, seed: int, density: float = 0.1) -> torch.Tensor:
    """A ``rows x width`` float32 matrix: a few rows random, one with only a -0.0, one NaN."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.zeros(rows, width)
    if g.numel() == 0:
        return g
    touched = torch.rand(rows, generator=gen) < density
    g[touched] = torch.randn(int(touched.sum()), width, generator=gen)
    g[rows // 2, width - 1] = -0.0
    g[rows - 1, width // 2] = float("nan")
    return g


SHAPES = [(0, 4), (4, 0), (1, 1), (1, 9), (9, 1), (3, 3), (2, 2), (16, 64), (33, 96), (7, 33),
          (5, 128), (40, 12)]  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES)
def test_rows_equal_bits(shape: tuple[int, int]) -> None:
    g = sparse(*shape, seed=sum(shape))
    want = expected(g)
    wide = torch.ones(shape[0], 2 * shape[1])  # the columns between g's are not zero
    wide[:, ::2] = g
    views = {
        "contiguous": g,
        "transposed": g.t().contiguous().t(),
        "strided": wide[:, ::2],
        "offset": torch.zeros(g.numel() + 1)[1:].view(shape).copy_(g),
        "f64": g.double(),
        "bf16": g.bfloat16(),
        "f16": g.half(),
    }
    for name, v in views.items():
        got = nonzero_rows(v)
        assert got.dtype == torch.int64, name
        assert torch.equal(got, want), (name, got, want)
        assert torch.equal(row_flags(v).nonzero().flatten(), want), name


def test_minus_zero_and_nan_alone_count() -> None:
    g = torch.zeros(6, 8)
    g[1, 3], g[4, 7] = -0.0, float("nan")
    g[2, 0] = torch.tensor(0x7F800001, dtype=torch.int32).view(torch.float32)  # a signalling NaN
    assert nonzero_rows(g).tolist() == [1, 2, 4]
    assert nonzero_rows(g.t().contiguous().t()).tolist() == [1, 2, 4]  # the torch path too
    assert nonzero_rows(torch.zeros(6, 8)).numel() == 0


def test_not_2d_refused() -> None:
    with pytest.raises(ValueError, match="2-D"):
        nonzero_rows(torch.zeros(8))


def test_block_divides_the_row() -> None:
    for width in range(1, 300):
        seg = scan_block(width)
        assert seg in SCAN_BLOCKS and width % seg == 0
    assert scan_block(512) == 512 and scan_block(96) == 32 and scan_block(9) == 1
    assert scan_block(3 * 2048) == 1024


def test_build_row_kernels_builds_the_cpu_widths() -> None:
    scan_kernel.cache_clear()
    cpu, meta = torch.device("cpu"), torch.device("meta")
    build_row_kernels(
        [("emb", (10, 96)), ("bias", (96,)), ("gpu", (4, 8)), ("unknown", None)],
        {"emb": cpu, "gpu": meta},
    )
    info = scan_kernel.cache_info()
    assert (info.currsize, info.misses) == (1, 1)  # seg 32 only
    nonzero_rows(sparse(4, 96, seed=1))
    assert scan_kernel.cache_info().hits == 1  # the step found it built


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    rows=st.integers(1, 40),
    width=st.sampled_from([1, 2, 3, 8, 12, 64, 100, 130]),
    seed=st.integers(0, 2**31),
    density=st.sampled_from([0.0, 0.05, 0.5, 1.0]),
)
def test_rows_property(rows: int, width: int, seed: int, density: float) -> None:
    g = sparse(rows, width, seed, density)
    assert torch.equal(nonzero_rows(g), expected(g))


def _payloads(alg: Algorithm, g: torch.Tensor) -> bytes:
    out = alg.encode(g, alg.init_state(g.numel()))
    return bytes(out.tolist())


@pytest.mark.parametrize("seg", [1, 8, 64])
def test_kernel_c_equals_reference(seg: int) -> None:
    ref = load_file(SCAN, backend="reference", seg=seg)
    c = scan_kernel(seg)
    assert c is not None
    for n in (1, seg, 9 * seg, 64 * 33 + seg):
        g = sparse(n // seg, seg, seed=n, density=0.2).view(-1)
        assert _payloads(c, g) == _payloads(ref, g), n


def test_kernel_emulated_cuda_equals_reference() -> None:
    from hipress.compll.backends.cuda.backend import CudaBackend
    from hipress.compll.backends.cuda.emu import CxxToolchain, EmulatedRuntime

    if CxxToolchain.detect() is None:
        pytest.skip("no C++ compiler")
    runtime = EmulatedRuntime(blocks=3, shuffle=True, seed=11)
    for seg in (1, 64):
        ref = load_file(SCAN, backend="reference", seg=seg)
        emu = Algorithm(ref.program, CudaBackend(ref.program, runtime))  # type: ignore[arg-type]
        for n in (seg, 5 * seg + 1, 64 * 17):
            g = sparse(n, 1, seed=n, density=0.3).view(-1)
            assert _payloads(emu, g) == _payloads(ref, g), (seg, n)


@pytest.mark.cuda
def test_cuda_rows_equal_bits() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    for shape in SHAPES:
        g = sparse(*shape, seed=3)
        assert torch.equal(nonzero_rows(g.cuda()).cpu(), expected(g)), shape
