"""``hash(seed, i)`` is a u32 that every worker and every backend computes alike: the
reference, the C kernels and the emulated CUDA kernels agree bit for bit, and all equal the
definition written out here in plain Python. Misuse diagnostics are goldens
(tests/golden/errors/hash_*.cll)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hipress.compll import Algorithm, SourceFile, load_source
from hipress.compll.backends.cuda.backend import CudaBackend
from hipress.compll.backends.cuda.emu import CxxToolchain, EmulatedRuntime

M32 = 0xFFFFFFFF

# seeds and counters from the gradient (whole numbers, negative and past 2**32 included),
# in a lambda and on the host, from i64, i32 and u8 operands
PROG = """algorithm t; param seed: i64 in [-1000, 1000] = -7;
payload { h: u32[n]; s: u32[n]; k: u32; }
encode(g) {
    let h = map(n, i => hash(i64(g[i]), i64(g[i]) * 4294967296 + i));
    let s = map(n, i => hash(seed, i32(i) - 3) ^ hash(u8(i), 0));
    return concat(h, s, hash(seed, n));
}
decode(p) { return map(n, i => f32(p.h[i])); }
"""


def fmix32(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def hash_py(seed: int, i: int) -> int:
    """The language's definition: lo/hi are the 32-bit halves of the i64 value."""
    s, c = seed & (2**64 - 1), i & (2**64 - 1)
    h = fmix32((s & M32) ^ 0x9E3779B9)
    h = fmix32(h ^ (s >> 32))
    h = fmix32(h ^ (c & M32))
    return fmix32(h ^ (c >> 32))


@pytest.fixture(scope="module")
def algs() -> tuple[Algorithm, ...]:
    ref = load_source(SourceFile("t.cll", PROG), backend="reference")
    cpu = load_source(SourceFile("t.cll", PROG), backend="cpu")
    if CxxToolchain.detect() is None:
        return ref, cpu
    emu = Algorithm(ref.program, CudaBackend(ref.program, EmulatedRuntime(blocks=3, shuffle=True)))  # type: ignore[arg-type]
    return ref, cpu, emu


def _fields(p: torch.Tensor, n: int) -> tuple[list[int], list[int]]:
    """The ``h`` and ``s`` fields of a payload (each array starts at a multiple of 8 bytes)."""
    u = p.view(torch.int32).to(torch.int64) & M32
    return u[:n].tolist(), u[(n + 1) // 2 * 2 :][:n].tolist()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.integers(-(2**20), 2**20), min_size=1, max_size=40))
def test_backends_equal_the_definition(algs: tuple[Algorithm, ...], raw: list[int]) -> None:
    n, g = len(raw), torch.tensor(raw, dtype=torch.float32)
    ref, *others = algs
    want = ref.encode(g, ref.init_state(n))
    h, s = _fields(want, n)
    assert h == [hash_py(x, x * 2**32 + i) for i, x in enumerate(raw)]
    assert s == [hash_py(-7, i - 3) ^ hash_py(i, 0) for i in range(n)]
    for alg in others:
        assert torch.equal(alg.encode(g, alg.init_state(n)).cpu(), want)


@pytest.mark.parametrize("n", [1, 9])
def test_small_sizes(algs: tuple[Algorithm, ...], n: int) -> None:
    g = torch.arange(n, dtype=torch.float32) - 4
    ref, *others = algs
    want = ref.encode(g, ref.init_state(n))
    for alg in others:
        assert torch.equal(alg.encode(g, alg.init_state(n)).cpu(), want)


def test_distinct_counters_give_distinct_hashes() -> None:
    # each step is a bijection of 32 bits: for one seed, counters below 2**32 never collide
    hs = {hash_py(12345, i) for i in range(4096)}
    assert len(hs) == 4096


# hash(seed, i) of the loop's own index: in a tile loop and a section's blocks the C kernels
# take the low word as i0 + t in 32 bits and the high word once per tile
INDEX = """algorithm t; param seed: i64 in [-1000, 1000] = 5;
payload { h: u32[n]; b: u32[n]; }
encode(g) {
    let h = map(n, i => hash(seed, i) ^ u32(g[i] * 0.0));
    block(256) { let b = map(n, i => hash(seed + 1, i) + u32(g[i] * 0.0)); }
    return concat(h, b);
}
decode(p) { return map(n, i => f32(p.h[i])); }
"""


@pytest.mark.parametrize("n", [1, 2049, 70001])
def test_hash_of_the_loop_index_equals_the_definition(n: int) -> None:
    cpu = load_source(SourceFile("t.cll", INDEX), backend="cpu")
    p = cpu.encode(torch.zeros(n), cpu.init_state(n))
    words = p.view(torch.int32).tolist()
    off = (4 * n + 7) // 8 * 2  # the second array starts at a multiple of 8 bytes
    assert [w & M32 for w in words[:n]] == [hash_py(5, i) for i in range(n)]
    assert [w & M32 for w in words[off : off + n]] == [hash_py(6, i) for i in range(n)]
