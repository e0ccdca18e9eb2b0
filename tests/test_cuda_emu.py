"""The generated CUDA kernels, run on the CPU by the emulation runtime, compute what the reference
interpreter computes: payload bytes, state, decodes, decode-accumulate and decode_sum, for every
shipped algorithm and parameter variant and every op, with the host code a GPU runs
(CudaBackend). The emulator itself is checked to catch what it is for: a barrier reached by some
threads, and a missing barrier (a wrong result with threads and blocks in a shuffled order)."""

from __future__ import annotations

import dataclasses
import os
import re
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_native import (
    INF,
    NAN,
    PROGRAMS,
    VARIANTS,
    ZERO_MINUS,
    bit_edge_inputs,
    docs_example,
    gradients,
    run_both,
    same_values,
)
from torch.utils._python_dispatch import TorchDispatchMode

from hipress.compll import Algorithm, algorithms, load, load_source
from hipress.compll.backends.cuda.abi import CudaSource, Field
from hipress.compll.backends.cuda.backend import CudaBackend, CudaBackendError
from hipress.compll.backends.cuda.emu import CxxToolchain, EmulatedRuntime, EmulationError
from hipress.compll.backends.cuda.runtime import select_topk, stable_sort
from hipress.compll.ir.calls import CallError
from hipress.compll.ir.source import SourceFile

pytestmark = pytest.mark.skipif(CxxToolchain.detect() is None, reason="no C++ compiler")

# HIPRESS_EMU_SANITIZE=address and/or alignment: the kernels under AddressSanitizer / UBSan's
# alignment check (the runtime preloaded; docs/how-to/write-an-algorithm.md)
SANITIZE = tuple(s for s in os.environ.get("HIPRESS_EMU_SANITIZE", "").split(",") if s)
SHUFFLED = EmulatedRuntime(blocks=3, shuffle=True, seed=11, sanitize=SANITIZE)
FTZ = EmulatedRuntime(blocks=3, shuffle=True, seed=11, sanitize=SANITIZE, ftz=True)
_ALGS: dict[tuple, Algorithm] = {}


def emulated(name: str, params: dict | None = None, runtime: EmulatedRuntime = SHUFFLED,
             **kw: object) -> Algorithm:  # fmt: skip
    """The CUDA kernels of a shipped algorithm on the emulation runtime (built once)."""
    key = (name, tuple(sorted((params or {}).items())), id(runtime), tuple(sorted(kw.items())))
    if key not in _ALGS:
        prog = load(name, backend="reference", **(params or {})).program
        _ALGS[key] = Algorithm(prog, CudaBackend(prog, runtime, **kw))  # type: ignore[arg-type]
    return _ALGS[key]


def _pair(name: str, params: dict) -> tuple[Algorithm, Algorithm]:
    return load(name, backend="reference", **params), emulated(name, params)


# ---------------------------------------------------------------- every algorithm, every variant


@pytest.mark.parametrize(("name", "params"), VARIANTS, ids=[f"{n}-{p}" for n, p in VARIANTS])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=gradients())
def test_cuda_kernel_equals_reference(name: str, params: dict, x: torch.Tensor) -> None:
    ref, emu = _pair(name, params)
    run_both(ref, emu, x, steps=2)


# the algorithms whose error-feedback state keeps a denormal gradient element that a flush
# to zero loses (on tests/test_cuda.py's inputs)
FTZ_VISIBLE = ("dgc", "efsignsgd", "graddrop", "onebit", "randomk", "tbq", "topk")


@pytest.mark.parametrize("name", algorithms())
def test_a_flush_to_zero_kernel_fails_the_comparison_with_the_reference(name: str) -> None:
    """Kernels compiled with flush-to-zero (what CuPy's RawModule compiles) differ from the
    reference on tests/test_cuda.py's inputs, so that GPU test catches them; without it the
    same kernels equal the reference."""
    n = 1000
    x = torch.randint(-64, 64, (n,), generator=torch.Generator().manual_seed(n)).float() / 8
    x[::97] = -0.0
    x[5::101] = 2.0**-140
    ref = load(name, backend="reference")
    run_both(ref, emulated(name, runtime=SHUFFLED), x, steps=2)
    ftz = emulated(name, runtime=FTZ)
    if name not in FTZ_VISIBLE:
        return
    with pytest.raises(AssertionError):
        run_both(ref, ftz, x, steps=2)


def test_flush_to_zero_mode_flushes_inputs_and_results() -> None:
    src = _source(
        "  float* f = (float*)a->out;\n"
        "  if (blockIdx.x == 0 && threadIdx.x == 0) {\n"
        "    f[0] = f[0] * f[3]; f[1] = f[1] * 0.5f; f[2] = f[2] * f[3];\n"
        "  }\n"
    )
    for rt, want in ((EmulatedRuntime(blocks=1), [2.0**-140, 2.0**-126 / 2, -(2.0**-130)]),
                     (FTZ, [0.0, 0.0, -0.0])):  # fmt: skip
        out = torch.tensor([2.0**-140, 2.0**-126, -(2.0**-130), 1.0])
        _launch_on(rt, src, out)
        assert out[:3].tolist() == want
        assert out[2].signbit()
    # the CPU's mode is restored after each launch
    assert torch.tensor(2.0**-140).mul(1.0).item() == 2.0**-140


@pytest.mark.parametrize("name", algorithms())
@pytest.mark.parametrize("n", [70_001, 2**19 + 11])
def test_grid_stride_loops_run_more_than_once(name: str, n: int) -> None:
    """Many elements on 3 blocks: every grid-stride loop, tile and pack boundary; with NaN,
    Inf, -0 and denormals; integers and exact halves so every sum is exact."""
    ref, emu = _pair(name, {})
    g = torch.Generator().manual_seed(5)
    x = torch.randint(-64, 64, (n,), generator=g).float() / 8
    x[::9973] = 0.0
    x[3::7919] = -0.0
    x[5::6007] = 2.0**-140
    run_both(ref, emu, x, steps=2)
    x[1000] = NAN
    x[2001] = -INF
    run_both(ref, emu, x, steps=1)


@pytest.mark.parametrize("name", ["onebit", "terngrad", "topk", "dgc", "int8"])
def test_the_grid_a_gpu_launches(name: str) -> None:
    """The grid an H100 would launch (1056 blocks of 256 threads), with loops longer than it."""
    gpu_like = _runtime(blocks=None)
    ref = load(name, backend="reference")
    emu = emulated(name, runtime=gpu_like)
    x = torch.randint(-64, 64, (600_001,), generator=torch.Generator().manual_seed(2)).float() / 8
    run_both(ref, emu, x, steps=1)


_RUNTIMES: dict[tuple, EmulatedRuntime] = {}


def _runtime(**kw: object) -> EmulatedRuntime:
    key = tuple(sorted(kw.items()))
    if key not in _RUNTIMES:
        _RUNTIMES[key] = EmulatedRuntime(sanitize=SANITIZE, **kw)  # type: ignore[arg-type]
    return _RUNTIMES[key]


@pytest.mark.parametrize("prog", sorted(PROGRAMS))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=gradients(max_n=200))
def test_every_op_equals_reference(prog: str, x: torch.Tensor) -> None:
    ref, emu = _program_pair(prog)
    run_both(ref, emu, x, steps=3)


@pytest.mark.parametrize("prog", sorted(PROGRAMS))
def test_every_op_on_many_blocks(prog: str) -> None:
    ref, emu = _program_pair(prog)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-200, 200, (2048 * 8 + 3,), generator=g).float() / 64
    x[::101] = NAN
    x[5::211] = -INF
    x[7::307] = -0.0
    run_both(ref, emu, x, steps=1)


def _program_pair(prog: str) -> tuple[Algorithm, Algorithm]:
    key = ("program", prog)
    if key not in _ALGS:
        ref = load_source(SourceFile(f"{prog}.cll", PROGRAMS[prog]), backend="reference")
        _ALGS[key] = Algorithm(ref.program, CudaBackend(ref.program, SHUFFLED))
    ref = load_source(SourceFile(f"{prog}.cll", PROGRAMS[prog]), backend="reference")
    return ref, _ALGS[key]


@pytest.mark.parametrize("n", [1, 9, 1000])
@pytest.mark.parametrize("prog", ["bits", "natural", "docs natural"])
def test_bit_builtins_on_edge_values(prog: str, n: int) -> None:
    """Bit casts, exponent and ldexp on zeros, subnormals, Inf, NaN, the largest finite value,
    powers of two and random bits, as CUDA code (its __float_as_uint and double arithmetic)."""
    if prog == "docs natural":
        text = docs_example("algorithm natural")
        ref = load_source(SourceFile("natural.cll", text), backend="reference")
        emu = Algorithm(ref.program, CudaBackend(ref.program, SHUFFLED))
    else:
        ref, emu = _program_pair(prog)
    run_both(ref, emu, bit_edge_inputs(n), steps=2)


def test_zero_minus_a_value_that_cannot_be_negative_zero() -> None:
    """g++ folds 0 - x to -x where x cannot be -0 (see tests/test_native.py)."""
    ref = load_source(SourceFile("zm.cll", ZERO_MINUS), backend="reference")
    emu = Algorithm(ref.program, CudaBackend(ref.program, SHUFFLED))
    x = torch.tensor([0.0, -0.0, 1.0, -2.5, 0.25, NAN, 300.0, -INF, 7.0])
    run_both(ref, emu, x, steps=1)


# ---------------------------------------------------------------- inputs a caller may give


def test_strided_float32_gradient_is_read_element_by_element() -> None:
    ref, emu = _pair("onebit", {})
    base = torch.randint(-64, 64, (2 * 5000,), generator=torch.Generator().manual_seed(3))
    x = (base.float() / 8)[::2]
    assert not x.is_contiguous() and x.dtype == torch.float32
    run_both(ref, emu, x, steps=2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_gradients_and_outputs(dtype: torch.dtype) -> None:
    ref, emu = _pair("terngrad", {})
    x = (torch.randint(-64, 64, (3001,), generator=torch.Generator().manual_seed(4)) / 8).to(dtype)
    run_both(ref, emu, x, steps=2)
    p = ref.encode(x, ref.init_state(3001))
    for acc in (False, True):
        o1 = torch.linspace(-1, 1, 3001, dtype=dtype)
        o2 = o1.clone()
        ref.decode(p, 3001, o1, accumulate=acc)
        emu.decode(p, 3001, o2, accumulate=acc)
        assert same_values(o1, o2)


@pytest.mark.parametrize("name", ["onebit", "topk", "terngrad"])
def test_decode_sum_of_more_payloads_than_one_launch_takes(name: str) -> None:
    ref, emu = _pair(name, {})
    n = 4099
    g = torch.Generator().manual_seed(6)
    sent = []
    st = ref.init_state(n, seed=1)
    for _ in range(35):
        sent.append(ref.encode(torch.randint(-64, 64, (n,), generator=g).float() / 8, st))
    for div in (1, 35, 3.0):
        assert same_values(ref.decode_sum(sent, n, divide_by=div),
                           emu.decode_sum(sent, n, divide_by=div))  # fmt: skip


def _repeating_payload(k: int, n: int) -> torch.Tensor:
    """A topk payload (k pairs) whose indices repeat (each of 0..4 k/5 times) and do not
    ascend, with values whose sum depends on the order they are added in."""
    alg = load("topk", backend="reference", ratio=k / n)
    p = torch.zeros(alg.payload_nbytes(n), dtype=torch.uint8)
    idx = torch.tensor([(7 * j) % 5 for j in range(k)], dtype=torch.int32)
    val = torch.tensor([(1e8, 1.0, -1e8, 0.75)[j % 4] + j for j in range(k)], dtype=torch.float32)
    p[: 4 * k].copy_(idx.view(torch.uint8))
    off = (4 * k + 7) // 8 * 8
    p[off : off + 4 * k].copy_(val.view(torch.uint8))
    return p


@pytest.mark.parametrize("sparse", [True, False])
def test_sparse_decodes_of_payloads_that_repeat_an_index(sparse: bool) -> None:
    """No shipped encoder repeats an index; a payload that does is still decoded exactly (by
    one thread, in payload order)."""
    n, k = 100, 20
    ref = load("topk", backend="reference", ratio=k / n)
    emu = emulated("topk", {"ratio": k / n}, sparse=sparse)
    p = _repeating_payload(k, n)
    good = ref.encode(torch.randn(n), ref.init_state(n))
    assert same_values(ref.decode(p, n), emu.decode(p, n))
    for payloads in ([good, p], [p, p, good], [p]):
        o1 = torch.linspace(-3, 3, n)
        o1[::7] = -0.0
        o2 = o1.clone()
        ref.decode(payloads[0], n, o1, accumulate=True)
        emu.decode(payloads[0], n, o2, accumulate=True)
        assert same_values(o1, o2)
        assert same_values(ref.decode_sum(payloads, n, divide_by=3),
                           emu.decode_sum(payloads, n, divide_by=3))  # fmt: skip


def test_the_encode_reports_nonfinite_on_the_device() -> None:
    for name in algorithms():
        emu = emulated(name)
        reported = emu.backend.src.entries["hp_encode"].nonfinite  # type: ignore[attr-defined]
        for bad in (False, True):
            x = torch.ones(1000)
            if bad:
                x[500] = NAN
            _, flag = emu.encode_checked(x, emu.init_state(1000))
            if not reported:
                assert flag is None, name
                continue
            assert isinstance(flag, torch.Tensor) and flag.dtype == torch.bool, name
            assert bool(flag) is bad, name
    # as on the C target: every algorithm but the two whose first pass is a segment reduction
    unreported = [a for a in algorithms()
                  if not emulated(a).backend.src.entries["hp_encode"].nonfinite]  # type: ignore[attr-defined]  # fmt: skip
    assert unreported == ["int8", "qsgd"]


# ---------------------------------------------------------------- validation (every backend)


@pytest.mark.parametrize("backend", ["reference", "cpu", "emulated"])
def test_a_state_of_the_wrong_size_is_refused_before_any_kernel_runs(backend: str) -> None:
    alg = emulated("topk") if backend == "emulated" else load("topk", backend=backend)
    st = alg.init_state(10)
    st.tensors["comp"] = torch.zeros(5)
    with pytest.raises(CallError, match=r"state `comp` must be a contiguous torch.float32 tensor "
                       r"of shape \(10,\) for n=10, got \(5,\)"):  # fmt: skip
        alg.encode(torch.ones(10), st)
    st = alg.init_state(10)
    st.tensors["comp"] = torch.zeros(20)[::2]
    with pytest.raises(CallError, match="strided"):
        alg.encode(torch.ones(10), st)
    st = alg.init_state(10)
    del st.tensors["pmin"]
    with pytest.raises(CallError, match="has no `pmin`"):
        alg.encode(torch.ones(10), st)


@pytest.mark.parametrize("backend", ["reference", "cpu", "emulated"])
def test_misaligned_payloads_and_buffers_are_refused(backend: str) -> None:
    alg = emulated("onebit") if backend == "emulated" else load("onebit", backend=backend)
    n = 100
    nb = alg.payload_nbytes(n)
    buf = torch.zeros(nb + 8, dtype=torch.uint8)
    with pytest.raises(CallError, match="must start at a multiple of 8 bytes"):
        alg.encode(torch.ones(n), alg.init_state(n), out=buf[1 : nb + 1])
    p = alg.encode(torch.ones(n), alg.init_state(n), out=buf[8:])
    buf2 = torch.zeros(nb + 1, dtype=torch.uint8)
    buf2[1:].copy_(p)
    with pytest.raises(CallError, match="must start at a multiple of 8 bytes"):
        alg.decode(buf2[1:], n)
    with pytest.raises(CallError, match="on meta, the data on cpu"):
        alg.decode_sum([p, p.to("meta")], n)


def test_tensors_on_another_device_are_a_clear_error() -> None:
    emu = emulated("onebit")
    st = emu.init_state(8, device="meta")
    with pytest.raises(CudaBackendError, match="runs on cpu tensors; the gradient is on meta"):
        emu.encode(torch.zeros(8, device="meta"), st)


# ---------------------------------------------------------------- buffers, threads, host work


def test_buffers_are_bounded_and_per_stream() -> None:
    prog = load("topk", backend="reference").program
    backend = CudaBackend(prog, SHUFFLED, max_buffers=3)
    alg = Algorithm(prog, backend)
    for n in range(100, 120):
        alg.encode(torch.ones(n), alg.init_state(n))
        assert len(backend.buffers) <= 3
    # calls from two threads (two "streams") at once give the reference's results
    ref = load("topk", backend="reference")
    xs = [torch.randint(-64, 64, (5000,), generator=torch.Generator().manual_seed(s)).float() / 8
          for s in range(4)]  # fmt: skip
    got: dict[int, list[torch.Tensor]] = {}

    def work(k: int) -> None:
        st = alg.init_state(5000, seed=k)
        got[k] = [alg.encode(x, st) for x in xs]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(2):
        st = ref.init_state(5000, seed=k)
        assert all(torch.equal(ref.encode(x, st), p) for x, p in zip(xs, got[k], strict=True))


class _HostReads(TorchDispatchMode):
    """Records the ops that read a tensor's value back to the host (a device synchronisation
    on a GPU) or size their output by the data."""

    SYNCING = ("_local_scalar_dense", "nonzero.default", "is_nonzero", "equal", "item")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = str(func.overloadpacket.__name__) + "." + func._overloadname
        if any(s in name for s in self.SYNCING):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["dgc", "topk", "randomk", "terngrad", "onebit"])
def test_no_host_synchronisation_in_encode_and_decode(name: str) -> None:
    emu = emulated(name)
    n = 20_000
    x = torch.randn(n)
    st = emu.init_state(n)
    p = emu.encode(x, st)  # (the first call fills the caches)
    out = torch.empty(n)
    emu.decode(p, n, out)
    emu.decode_sum([p, p], n, out=out, divide_by=2)
    with _HostReads() as mode:
        p = emu.encode(x, st)
        emu.decode(p, n, out)
        emu.decode(p, n, out, accumulate=True)
        emu.decode_sum([p, p], n, out=out, divide_by=2)
    assert mode.seen == []


# ---------------------------------------------------------------- the emulator itself


def _source(body: str) -> CudaSource:
    text = (
        "#include <stdint.h>\n#define HP_NT 256\n"
        "typedef struct { uint32_t* out; uint32_t* count; } args_t;\n"
        f'extern "C" __global__ void k(const args_t A) {{\n  const args_t* const a = &A;\n{body}\n}}\n'
    )
    return CudaSource(text, {}, {"args_t": (Field("out", "uint32_t*"), Field("count", "uint32_t*"))},
                      False, False, {"k": "args_t"})  # fmt: skip


def _launch(rt: EmulatedRuntime, body: str, grid: int = 2) -> torch.Tensor:
    out = torch.zeros(grid * 256, dtype=torch.int32)
    count = torch.zeros(1, dtype=torch.int32)
    args = out.data_ptr().to_bytes(8, "little") + count.data_ptr().to_bytes(8, "little")
    rt.launch(rt.load(_source(body)), "k", grid, 256, args, (), torch.device("cpu"))
    return out


def _launch_on(rt: EmulatedRuntime, src: CudaSource, out: torch.Tensor) -> None:
    """One block of ``src``'s kernel with ``out`` as its ``out`` pointer."""
    count = torch.zeros(1, dtype=torch.int32)
    args = out.data_ptr().to_bytes(8, "little") + count.data_ptr().to_bytes(8, "little")
    rt.launch(rt.load(src), "k", 1, 256, args, (), torch.device("cpu"))


def test_a_barrier_reached_by_some_threads_is_reported() -> None:
    with pytest.raises(EmulationError, match=r"line \d+ was reached by 5 of 256 threads"):
        _launch(SHUFFLED, "  if (threadIdx.x < 5) __syncthreads();")
    with pytest.raises(EmulationError, match="wait at different __syncthreads"):
        _launch(SHUFFLED, "  if (threadIdx.x % 2) {\n    __syncthreads();\n  } else {\n"
                          "    __syncthreads();\n  }")  # fmt: skip
    _launch(SHUFFLED, "  for (int r = 0; r < 3; r++) __syncthreads();")  # uniform: fine


def test_threads_and_blocks_run_forward_or_shuffled() -> None:
    body = ("  const unsigned int t = atomicAdd(a->count, 1u);\n"
            "  a->out[t] = blockIdx.x * 256 + threadIdx.x;\n  __syncthreads();")  # fmt: skip
    forward = _launch(_runtime(blocks=2), body)
    assert torch.equal(forward, torch.arange(512, dtype=torch.int32))
    a = _launch(_runtime(blocks=2, shuffle=True, seed=1), body)
    b = _launch(_runtime(blocks=2, shuffle=True, seed=2), body)
    for order in (a, b):
        assert not torch.equal(order, forward)
        assert torch.equal(order.sort().values, forward)
    assert not torch.equal(a, b)


def _without_barrier(src: CudaSource, title: str, nth: int) -> CudaSource:
    """``src`` with the ``nth`` ``__syncthreads();`` of the first kernel whose title has
    ``title`` removed."""
    text = src.source
    start = text.index('extern "C"', text.index(title))
    end = text.index('extern "C"', start + 1) if 'extern "C"' in text[start + 1 :] else len(text)
    body = text[start:end]
    spots = [m.start() for m in re.finditer(r"__syncthreads\(\);", body)]
    cut = start + spots[nth]
    return dataclasses.replace(src, source=text[:cut] + "/* removed */" + text[cut + 16 :])


@pytest.mark.parametrize(
    ("name", "title", "nth"),
    [
        ("onebit", "level 1: c, npos", 0),  # the pack tile's first barrier
        ("onebit", "level 1: c, npos", 2),  # a reduction's: after the partials are stored
        ("dgc", "filter: ordered writes", 1),  # the filter's scan
    ],
)
def test_a_removed_barrier_gives_a_wrong_result_when_shuffled(name: str, title: str,
                                                             nth: int) -> None:  # fmt: skip
    prog = load(name, backend="reference").program
    good = CudaBackend(prog, SHUFFLED).src
    bad_src = _without_barrier(good, title, nth)
    assert bad_src.source.count("__syncthreads();") == good.source.count("__syncthreads();") - 1
    ref = load(name, backend="reference")
    x = torch.randint(-64, 64, (40_000,), generator=torch.Generator().manual_seed(7)).float() / 8
    with pytest.raises((AssertionError, EmulationError)):
        bad = Algorithm(prog, CudaBackend(prog, _runtime(blocks=3, shuffle=True, seed=3),
                                          src=bad_src))  # fmt: skip
        run_both(ref, bad, x, steps=2)


@pytest.mark.parametrize("kbits", [32, 64])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_topk_and_sort_host_steps_equal_a_stable_sort(kbits: int, data: st.DataObject) -> None:
    """The k smallest unsigned keys, ties to the lower index (what the reference's stable
    sort takes), ascending; and a stable sort: with many ties and keys above 2^(kbits-1)."""
    length = data.draw(st.integers(0, 300))
    top = (1 << kbits) - 1
    half = 1 << (kbits - 1)
    pool = data.draw(st.lists(st.one_of(st.integers(0, half - 1), st.integers(half, top)),
                              min_size=1, max_size=4))  # fmt: skip
    keys = data.draw(st.lists(st.sampled_from(pool), min_size=length, max_size=length))
    k = data.draw(st.integers(0, length + 3))
    dt = torch.int32 if kbits == 32 else torch.int64
    signed = [x - (1 << kbits) if x >= 1 << (kbits - 1) else x for x in keys]
    raw = torch.tensor(signed, dtype=dt).view(torch.uint8)
    want = sorted(range(length), key=lambda j: (keys[j], j))
    out = torch.full((k,), -7, dtype=torch.int32)
    select_topk(raw, kbits, length, k, out)
    take = min(k, length)
    assert out[:take].tolist() == sorted(want[:take]) and out[take:].tolist() == [0] * (k - take)
    vals = torch.arange(length, dtype=torch.float32) * 0.5
    got = torch.empty(length)
    stable_sort(raw, kbits, vals, got)
    assert got.tolist() == [j * 0.5 for j in want]


@pytest.mark.parametrize("name", ["mixed_select", "segreduce_length", "invariant_sqrt"])
def test_red_team_programs_on_the_emulator(name: str) -> None:
    from test_native import _RED

    decl, body = _RED[name]
    text = (f'algorithm t_{name} "t";\n{decl}\npayload {{ v: f32[n]; }}\nencode(g) {{ {body} '
            "return concat(v); }\ndecode(p) { return map(n, i => p.v[i]); }\n")  # fmt: skip
    ref = load_source(SourceFile("t.cll", text), backend="reference")
    emu = Algorithm(ref.program, CudaBackend(ref.program, SHUFFLED))
    for n in (0, 1, 9, 1000, 20_003):
        x = torch.randint(-64, 64, (n,), generator=torch.Generator().manual_seed(n)).float() / 8
        run_both(ref, emu, x, steps=2)


def test_int8_near_the_float32_maximum_on_the_emulator() -> None:
    ref, emu = _pair("int8", {})
    run_both(ref, emu, torch.tensor([3.4028234663852886e38, -3.3e38, 1.0, 2.0**127] * 64))
