"""``scatter_set`` stores each value at its index in ascending j, so where indices repeat the
last j wins: the reference, the C kernels and the emulated CUDA kernels (parallel where no
index repeats, else in order on one thread) agree bit for bit. Misuse diagnostics are goldens
(tests/golden/errors/scatterset_*.cll)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hipress.compll import Algorithm, SourceFile, load_source
from hipress.compll.backends.cuda.backend import CudaBackend
from hipress.compll.backends.cuda.emu import CxxToolchain, EmulatedRuntime

# the indices come from the gradient (whole numbers, some out of range), the values differ
# by j: a zeros base, the gradient as base with a count, integers, and an index per element
PROG = """algorithm t; param m: i64 in [1, 64] = 5;
payload { s: f32[m]; b: f32[n]; c: i32[m]; d: f32[n]; }
encode(g) {
    let idx = map(n, i => i32(g[i]));
    let val = map(n, i => g[i] * 0.5 + f32(i));
    let cnt = reduce(count, n, i => g[i] > 0.0);
    return concat(scatter_set(m, idx, val), scatter_set(g, idx, val, cnt),
                  scatter_set(m, idx, map(n, i => i32(i) - 3)),
                  scatter_set(n, map(n, i => i32((i + 2) % n)), val));
}
decode(p) { return map(n, i => p.b[i]); }
"""


@pytest.fixture(scope="module")
def algs() -> tuple[Algorithm, ...]:
    ref = load_source(SourceFile("t.cll", PROG), backend="reference")
    cpu = load_source(SourceFile("t.cll", PROG), backend="cpu")
    if CxxToolchain.detect() is None:
        return ref, cpu
    emu = Algorithm(ref.program, CudaBackend(ref.program, EmulatedRuntime(blocks=3, shuffle=True)))  # type: ignore[arg-type]
    return ref, cpu, emu


def _expected(g: list[float], m: int = 5) -> list[float]:
    """The zeros-based ``s`` field, written out: the last j at each index wins."""
    s = [0.0] * m
    for j, x in enumerate(g):
        if 0 <= int(x) < m:
            s[int(x)] = float(torch.tensor(x, dtype=torch.float32) * 0.5 + j)
    return s


def test_last_value_at_an_index_wins(algs: tuple[Algorithm, ...]) -> None:
    g = torch.tensor([1.0, 3.0, 1.0, -1.0, 7.0, 3.0, 1.0, 0.0, 2.0])
    for alg in algs:
        p = alg.encode(g, alg.init_state(9)).cpu()
        assert p[:20].view(torch.float32).tolist() == _expected(g.tolist())


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.integers(-2, 8), min_size=1, max_size=40), st.booleans())
def test_backends_equal_the_reference(
    algs: tuple[Algorithm, ...], raw: list[int], up: bool
) -> None:
    vals = sorted(set(raw)) if up else raw  # ascending, no repeats: CUDA's parallel path
    g = torch.tensor(vals, dtype=torch.float32)
    ref, *others = algs
    want = ref.encode(g, ref.init_state(g.numel()))
    assert want[:20].view(torch.float32).tolist() == _expected(vals)
    for alg in others:
        assert torch.equal(alg.encode(g, alg.init_state(g.numel())).cpu(), want)


@pytest.mark.parametrize("n", [1, 9])
def test_small_sizes(algs: tuple[Algorithm, ...], n: int) -> None:
    g = torch.arange(n, dtype=torch.float32) % 3
    ref, *others = algs
    want = ref.encode(g, ref.init_state(n))
    for alg in others:
        assert torch.equal(alg.encode(g, alg.init_state(n)).cpu(), want)
