"""``matmul(a, b, m, k, r)`` and ``matmul_at(a, b, m, k, r)``: an f32 matrix product whose
every element is a float sum (f32 products, summed in f64). The reference runs the definition
(a segment sum), C its kernels (a transposed-B SIMD reduction, a short-sum path over C's
columns, a blocked A^T B with per-thread partials, and the definition where an operand is too
short), emulated CUDA the definition. The values are multiples of 1/64 in [-4, 4], so every
product and partial sum is exact in f64 and any order of summation gives the same bits: the
backends must agree bit for bit, and with torch's f64 product. Misuse diagnostics are goldens
(tests/golden/errors/matmul_*.cll)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hipress.compll import Algorithm, SourceFile, load_source
from hipress.compll.backends.cuda.backend import CudaBackend
from hipress.compll.backends.cuda.emu import CxxToolchain, EmulatedRuntime

# A is the gradient as m x k (k = n / m), B a pattern; `s` is B one element short (the
# definition: the missing element reads 0); `w` has 9 columns (the short-sum path for k <= 64)
PROG = """algorithm t; param m: i64 in [1, 64] = 3; param r: i64 in [1, 64] = 5;
const k = n / m;
payload { c: f32[m * r]; d: f32[k * r]; s: f32[m * r]; w: f32[m * 9]; z: f32[m * r]; }
encode(g) {
    let b = map(k * r, t => f32(t % 7) * 0.25 - 0.5);
    let p = map(m * r, t => f32(t % 5) - 1.5);
    let b9 = map(k * 9, t => f32(t % 3) - 1.0);
    let short = map(max(k * r - 1, 0), t => b[t]);
    return concat(matmul(g, b, m, k, r), matmul_at(g, p, k, m, r), matmul(g, short, m, k, r),
                  matmul(g, b9, m, k, 9), matmul(g, b, m, 0, r));
}
decode(p) { return map(n, i => 0.0); }
"""


def _algs(**params: int) -> tuple[Algorithm, ...]:
    ref = load_source(SourceFile("t.cll", PROG), backend="reference", **params)
    cpu = load_source(SourceFile("t.cll", PROG), backend="cpu", **params)
    if CxxToolchain.detect() is None or params:
        return ref, cpu
    emu = CudaBackend(ref.program, EmulatedRuntime(blocks=3, shuffle=True))  # type: ignore[arg-type]
    return ref, cpu, Algorithm(ref.program, emu)


@pytest.fixture(scope="module")
def algs() -> tuple[Algorithm, ...]:
    return _algs()


def _expected(g: torch.Tensor, m: int, r: int) -> list[float]:
    """Every field, from torch's f64 matrix products (exact for these values)."""
    k = g.numel() // m
    a = g[: m * k].double().view(m, k)
    t = torch.arange(k * r)
    b = ((t % 7).float() * 0.25 - 0.5).double().view(k, r)
    p = ((torch.arange(m * r) % 5).float() - 1.5).double().view(m, r)
    b9 = ((torch.arange(k * 9) % 3).float() - 1.0).double().view(k, 9)
    short = b.clone().view(-1)
    if short.numel():
        short[-1] = 0.0
    parts = [a @ b, a.t() @ p, a @ short.view(k, r), a @ b9, torch.zeros(m, r)]
    return torch.cat([x.float().reshape(-1) for x in parts]).tolist()


def _fields(alg: Algorithm, g: torch.Tensor, m: int, r: int) -> list[float]:
    raw = alg.encode(g, alg.init_state(g.numel())).cpu()
    k = g.numel() // m
    out: list[float] = []
    pos = 0
    for size in (m * r, k * r, m * r, m * 9, m * r):
        out += raw[pos : pos + size * 4].view(torch.float32).tolist()
        pos += (size * 4 + 7) // 8 * 8
    return out


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.integers(-256, 256), min_size=1, max_size=70))
def test_backends_give_the_definition(algs: tuple[Algorithm, ...], raw: list[int]) -> None:
    g = torch.tensor(raw, dtype=torch.float32) / 64
    want = _expected(g, 3, 5)
    for alg in algs:
        assert _fields(alg, g, 3, 5) == want


def test_four_columns_at_a_time_and_many_rows() -> None:
    """r = 8 (two groups of four), k = 100 (the transposed-B path), m = 40 rows."""
    g = (torch.arange(4000, dtype=torch.float32) % 97 - 48) / 64
    for alg in _algs(m=40, r=8):
        assert _fields(alg, g, 40, 8) == _expected(g, 40, 8)
